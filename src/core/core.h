/* core/core.h - internal helpers of the core layer: logging, deadlines, env knobs, allocation.
 * Every other layer may include this; it includes nothing above core. */
#ifndef DT_CORE_INTERNAL_H
#define DT_CORE_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dtrain/core.h"

/* Sets the detail message from errno: "<what>: <strerror(errno)>". Returns st. */
dt_status dt__errno(dt_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prepends context to the current detail message: "<ctx>: <old detail>". Returns st. */
dt_status dt__error_prefix(dt_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Logging to stderr, one line per call, prefixed "[dtrain rR] LEVEL". Level from DTRAIN_LOG
 * (error|warn|info|debug; default warn). Thread-safe (one write(2) per line). */
typedef enum { DT_LOG_ERROR = 0, DT_LOG_WARN, DT_LOG_INFO, DT_LOG_DEBUG } dt_log_level;
void dt__log(dt_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool dt__log_enabled(dt_log_level lvl);
/* The rank shown in log prefixes (-1: none). */
void dt__log_set_rank(int rank);
#define DT_LOG_ERROR(...) dt__log(DT_LOG_ERROR, __VA_ARGS__)
#define DT_LOG_WARN(...) dt__log(DT_LOG_WARN, __VA_ARGS__)
#define DT_LOG_INFO(...) dt__log(DT_LOG_INFO, __VA_ARGS__)
#define DT_LOG_DEBUG(...) \
  do { if (dt__log_enabled(DT_LOG_DEBUG)) dt__log(DT_LOG_DEBUG, __VA_ARGS__); } while (0)

/* Deadlines are absolute dt_now_ns() values; DT_NO_DEADLINE never expires. */
#define DT_NO_DEADLINE INT64_MAX
int64_t dt__deadline_after_ms(int64_t ms);
/* Milliseconds left (0 if passed), clamped to INT32_MAX for poll(2). */
int dt__ms_left(int64_t deadline);
bool dt__expired(int64_t deadline);
void dt__sleep_ns(int64_t ns);

/* Environment knobs. Return def when unset; a malformed value is a DT_ERR_INVALID naming it. */
const char *dt__env_str(const char *name);              /* NULL if unset or empty */
dt_status dt__env_int(const char *name, int64_t def, int64_t *out);
/* dt__env_int, and a value outside lo..hi is DT_ERR_INVALID "NAME=V is out of range lo..hi". */
dt_status dt__env_int_range(const char *name, int64_t def, int64_t lo, int64_t hi, int64_t *out);
/* Sizes accept suffixes K, M, G (powers of 1024): "4M". */
dt_status dt__parse_size(const char *s, uint64_t *out);
dt_status dt__env_size(const char *name, uint64_t def, uint64_t *out);

/* Every allocation of the library goes through these (never malloc & co. directly). 64-byte
 * aligned allocation; dt__free(NULL) is a no-op; dt__free also frees what libc's malloc family
 * returned, and what these return may be passed to free(). Return NULL and set DT_ERR_NOMEM
 * detail ("cannot allocate N bytes") on failure; dt__realloc then leaves p as it was. */
void *dt__alloc(size_t n);
void *dt__calloc(size_t n);
void *dt__realloc(void *p, size_t n); /* not aligned beyond malloc's */
char *dt__strdup(const char *s);
void dt__free(void *p);
/* For tests only: the allocation after the next n ones fails, once; n < 0 disarms. Returns the
 * count before the call: still >= 0 when an armed failure did not happen, -1 once it has. */
long dt__alloc_fail_after(long n);

/* Fills buf with n bytes from the kernel's CSPRNG (getrandom). */
dt_status dt__random_bytes(void *buf, size_t n);

/* Little-endian encoding of the fixed-width fields in dtrain's wire and file formats. */
/* One pause of a spin-wait loop (lets the sibling hyperthread run, saves power). */
static inline void dt__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static inline void dt__put16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static inline void dt__put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}
static inline void dt__put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t dt__get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t dt__get32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t dt__get64(const uint8_t *p) {
  return (uint64_t)dt__get32(p) | (uint64_t)dt__get32(p + 4) << 32;
}

/* splitmix64's output function (Steele, Lea, Flood 2014): a bijection of 64-bit words whose
 * outputs for the counters c, c + DT__GOLDEN64, c + 2 * DT__GOLDEN64, ... pass BigCrush. Used as a
 * counter-based generator where a stream must be a pure function of its keys (dropout masks:
 * nn/layers.c) and to seed dt_rng. Two multiplies: cheap enough for every activation. */
#define DT__GOLDEN64 0x9E3779B97F4A7C15ULL
static inline uint64_t dt__mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/* Reads a whole regular file into a new dt__alloc'd buffer (*buf, *n; free with dt__free).
 * A missing file is DT_ERR_NOT_FOUND, one larger than max_bytes DT_ERR_INVALID; every message
 * names the path. */
dt_status dt__read_file(const char *path, uint64_t max_bytes, void **buf, size_t *n);
/* Why an open of path for writing without waiting (O_NONBLOCK) failed with err: ENXIO is a FIFO
 * that nobody reads or a socket; otherwise strerror(err). */
const char *dt__open_failure(const char *path, int err);
/* The host's transparent huge pages (/sys/kernel/mm/transparent_hugepage/enabled): 1 when an
 * advised range may get them ("always" or "madvise"), 0 when "never", -1 when it cannot tell. */
int dt__thp_enabled(void);
/* Creates the missing parent directories of path (mkdir -p of its dirname). */
dt_status dt__mkdir_parents(const char *path);

/* JSON output (json.c). dt__json_num writes v with fmt, one double conversion such as "%.9g",
 * or null when v is NaN or infinite; dt__json_str writes s quoted, with '"', '\\' and control
 * characters escaped (NULL as ""). */
void dt__json_num(FILE *f, const char *fmt, double v);
void dt__json_str(FILE *f, const char *s);
/* sep, then "key": and v as dt__json_num writes it (sep: "{" for an object's first field, ","). */
void dt__json_field(FILE *f, const char *sep, const char *key, const char *fmt, double v);

#define DT_MIN(a, b) ((a) < (b) ? (a) : (b))
#define DT_MAX(a, b) ((a) > (b) ? (a) : (b))
#define DT_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
