/* dtrain/core.h - status codes, error detail, clocks and the seeded RNG shared by every layer.
 * Every fallible dtrain call returns a dt_status; on failure dt_last_error() holds a message for
 * the calling thread that says what failed, where, and with which values. */
#ifndef DTRAIN_CORE_H
#define DTRAIN_CORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* X-macro list: name, text. Add new codes at the end (numbers are part of the ABI). */
#define DT_STATUS_MAP(XX)                                                   \
  XX(OK, "ok")                                                              \
  XX(ERR_INVALID, "invalid argument")                                       \
  XX(ERR_NOMEM, "out of memory")                                            \
  XX(ERR_IO, "input/output error")                                          \
  XX(ERR_TIMEOUT, "deadline exceeded")                                      \
  XX(ERR_PEER, "peer failed")                                               \
  XX(ERR_MISMATCH, "mismatched calls across ranks")                         \
  XX(ERR_AUTH, "authentication failed")                                     \
  XX(ERR_PROTOCOL, "protocol error")                                        \
  XX(ERR_ABORTED, "aborted by another rank")                                \
  XX(ERR_CORRUPT, "corrupt data")                                           \
  XX(ERR_NOT_FOUND, "not found")                                            \
  XX(ERR_UNSUPPORTED, "unsupported")                                        \
  XX(ERR_SYSTEM, "system call failed")                                      \
  XX(ERR_STATE, "invalid state")

typedef enum dt_status {
#define DT_STATUS_ENUM(name, text) DT_##name,
  DT_STATUS_MAP(DT_STATUS_ENUM)
#undef DT_STATUS_ENUM
  DT_STATUS_COUNT
} dt_status;

/* Short fixed text for a status ("deadline exceeded"). Never NULL. */
const char *dt_strerror(dt_status st);
/* Detail of the last failure on this thread ("rank 2: allreduce #17 ..."); "" if none.
 * Valid until the next dtrain call on this thread. */
const char *dt_last_error(void);
/* Sets this thread's detail message and returns st (for library users who wrap dtrain). */
dt_status dt_set_error(dt_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dt_clear_error(void);

/* Propagate a failure, keeping the detail the callee set. */
#define DT_CHECK(call)                  \
  do {                                  \
    dt_status dt_check_rc_ = (call);    \
    if (dt_check_rc_ != DT_OK)          \
      return dt_check_rc_;              \
  } while (0)
#define DT_CHECK_GOTO(call, rc, label)  \
  do {                                  \
    (rc) = (call);                      \
    if ((rc) != DT_OK)                  \
      goto label;                       \
  } while (0)

/* Monotonic clock in nanoseconds. */
int64_t dt_now_ns(void);
/* Wall-clock seconds since the epoch, for logs and metrics. */
double dt_wall_s(void);

/* CRC32C (Castagnoli), hardware-accelerated where the CPU has SSE4.2. Start with crc = 0. */
uint32_t dt_crc32c(uint32_t crc, const void *buf, size_t n);

/* Seeded RNG (xoshiro256**). The state is plain data so checkpoints can save it. */
typedef struct dt_rng {
  uint64_t s[4];
} dt_rng;
void dt_rng_seed(dt_rng *r, uint64_t seed);
uint64_t dt_rng_next(dt_rng *r);
/* Uniform in [0, 1). */
double dt_rng_uniform(dt_rng *r);
/* Standard normal (Box-Muller). */
double dt_rng_normal(dt_rng *r);
/* Uniform integer in [0, n), n > 0, without modulo bias. */
uint64_t dt_rng_below(dt_rng *r, uint64_t n);

/* Library version string, e.g. "0.1.0". */
const char *dt_version(void);

#ifdef __cplusplus
}
#endif
#endif
