/* test_coll_tune.c - the timed choice between rd and the shm fast path for the 2-rank allreduce
 * of 32 KiB < bytes <= 128 KiB (collectives.c, tune_*), on real processes:
 *   - 400 calls of the four classes (two sizes, each of 16-bit and of wider elements), mixed
 *     with calls just outside them (32 KiB, 128 KiB + 4 B), of f32, bf16, f16 and i32, sum, avg,
 *     min and prod, in place and not, some nonblocking, and rank 1 now and then late into a
 *     call: every result is right (the half types bit for bit), through the trials (calls 17-28
 *     and 64-75 of a class, then from every 256th), the 16-byte exchange that ends each trial,
 *     and whatever each trial chose;
 *   - afterwards both ranks hold the same state per class: the same number of calls (those the
 *     test made of that class, none of the calls outside), and the same agreed algorithm, rd or
 *     the fast path;
 *   - with DTRAIN_ALGO set, nothing is timed (no class counts a call);
 *   - one rank calling a different count at a trial's last call (the exchange follows it on the
 *     other rank): both ranks fail in that call with DT_ERR_MISMATCH naming the two calls (or
 *     the job's abort carrying it), within seconds, none returning DT_OK;
 *   - a rank that has finished a trial's last call and sends its timings while the other is
 *     still in that call is not a mismatch: in one run rank 0 is late into every call, so rank
 *     1 is first to each exchange; in the other rank 1 is late into one call in four.
 * Which algorithm a trial picks depends on the host's timings and is not checked: the
 * benchmarks measure that (bench/results/tune-2026-12-03-zen3.txt).
 *
 * Usage: test_coll_tune */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/check.h"
#include "common/mp.h"
#include "coll/sweep.h"
#include "comm/coll/coll.h"
#include "comm/comm.h"

typedef struct {
  dt_dtype t;
  dt_op op;
  size_t count;
} tcase;

/* class 0: (32, 64] KiB; class 1: (64, 128] KiB; classes 2 and 3: the same of 16-bit elements;
 * -1: not timed */
static const tcase cases[] = {
    {DT_F32, DT_SUM, 12288},       /* 48 KiB: class 0 */
    {DT_BF16, DT_SUM, 40000},      /* 80,000 B: class 3 */
    {DT_F32, DT_MIN, 16000},       /* 64,000 B: class 0 */
    {DT_F16, DT_AVG, 20000},       /* 40,000 B: class 2 */
    {DT_I32, DT_PROD, 30000},      /* 120,000 B: class 1 */
    {DT_F32, DT_SUM, 32768 + 1},   /* 128 KiB + 4 B: not timed */
    {DT_F32, DT_SUM, 8192},        /* 32 KiB: not timed */
    {DT_F32, DT_SUM, 16384 + 3},   /* 64 KiB + 12 B: class 1 */
    {DT_F16, DT_SUM, 65536},       /* 128 KiB: class 3 */
    {DT_BF16, DT_PROD, 16384 + 5}, /* 32 KiB + 10 B: class 2 */
};
#define NCASES (sizeof cases / sizeof cases[0])
#define CALLS 400
#define MAXB (32768 * 4 + 64)

static int tclass(const tcase *k) {
  size_t b = k->count * dt_dtype_size(k->t);
  return b <= (32u << 10) || b > (128u << 10) ? -1 : (b <= (64u << 10) ? 0 : 1) + (dt_dtype_size(k->t) == 2 ? 2 : 0);
}

static uint64_t hash(uint64_t x) { return sw_hash(x ^ 0x7475u); }

/* The calls of a run: case i % NCASES; rank `late` sleeping up to 300 us before every call
 * (rank 0) or one in four (rank 1); every fifth call nonblocking, every third in place. */
static int mixed_body(int rank, int size, void *arg) {
  const int late = *(const int *)arg;
  (void)size;
  dt_comm *c = sw_join(rank);
  CHECK(c, "create: %s", dt_last_error());
  char *in = malloc(MAXB), *out = malloc(MAXB);
  CHECK(in && out, "out of memory");
  uint64_t made[DT__TUNE_CLASSES] = {0};
  for (int i = 0; i < CALLS; i++) {
    const tcase *k = &cases[(size_t)i % NCASES];
    const uint64_t salt = 1000u + (uint64_t)i;
    const bool inplace = i % 3 == 0;
    sw_fill(inplace ? out : in, k->count, 0, salt, rank, k->t, k->op);
    uint64_t h = hash((uint64_t)i);
    if (rank == late && (late == 0 || h % 4 == 0))
      usleep((useconds_t)(h % 300));
    dt_status st;
    if (i % 5 == 4) {
      dt_request *req = NULL;
      st = dt_comm_iallreduce(c, inplace ? DT_IN_PLACE : in, out, k->count, k->t, k->op, &req);
      if (st == DT_OK)
        st = dt_request_wait(req);
    } else {
      st = dt_comm_allreduce(c, inplace ? DT_IN_PLACE : in, out, k->count, k->t, k->op);
    }
    CHECK(st == DT_OK, "call %d (%zu x %d, op %d): %s", i, k->count, (int)k->t, (int)k->op, dt_last_error());
    for (size_t j = 0; j < k->count; j++) {
      bool ok = k->t == DT_F16 || k->t == DT_BF16 ? sw_check_half2(out, j, salt, j, k->t, k->op)
                                                   : sw_check_reduced(out, j, salt, 2, j, k->t, k->op);
      CHECK(ok, "call %d (%zu x dtype %d, op %d): element %zu is %g", i, k->count, (int)k->t, (int)k->op, j,
            sw_get(out, j, k->t));
    }
    if (tclass(k) >= 0)
      made[tclass(k)]++;
  }
  /* both ranks' state per class, side by side */
  int64_t mine[2 * DT__TUNE_CLASSES], all[2 * 2 * DT__TUNE_CLASSES];
  for (int u = 0; u < DT__TUNE_CLASSES; u++) {
    mine[2 * u] = (int64_t)c->tune[u].calls;
    mine[2 * u + 1] = c->tune[u].algo;
  }
  CHECK(dt_comm_allgather(c, mine, all, 2 * DT__TUNE_CLASSES, DT_I64) == DT_OK, "allgather: %s", dt_last_error());
  for (int u = 0; u < DT__TUNE_CLASSES; u++) {
    CHECK(mine[2 * u] == (int64_t)made[u], "class %d counted %lld calls, the test made %llu", u,
          (long long)mine[2 * u], (unsigned long long)made[u]);
    CHECK(mine[2 * u + 1] == DT_ALGO_RD || mine[2 * u + 1] == DT_ALGO_SHM,
          "class %d holds algorithm %lld after %llu calls (rd or the fast path expected)", u,
          (long long)mine[2 * u + 1], (unsigned long long)made[u]);
    CHECK(all[2 * u] == all[2 * DT__TUNE_CLASSES + 2 * u] && all[2 * u + 1] == all[2 * DT__TUNE_CLASSES + 2 * u + 1],
          "class %d: rank 0 counted %lld calls and chose %lld, rank 1 %lld and %lld", u, (long long)all[2 * u],
          (long long)all[2 * u + 1], (long long)all[2 * DT__TUNE_CLASSES + 2 * u],
          (long long)all[2 * DT__TUNE_CLASSES + 2 * u + 1]);
  }
  dt_comm_destroy(c);
  free(in);
  free(out);
  return 0;
}

/* DTRAIN_ALGO set (by main, before the job): the calls run, none is timed. */
static int forced_body(int rank, int size, void *arg) {
  (void)size;
  (void)arg;
  dt_comm *c = sw_join(rank);
  CHECK(c, "create: %s", dt_last_error());
  float *in = malloc(12288 * sizeof *in), *out = malloc(12288 * sizeof *out);
  CHECK(in && out, "out of memory");
  for (int i = 0; i < 40; i++) {
    sw_fill(in, 12288, 0, (uint64_t)i, rank, DT_F32, DT_SUM);
    CHECK(dt_comm_allreduce(c, in, out, 12288, DT_F32, DT_SUM) == DT_OK, "call %d: %s", i, dt_last_error());
    for (size_t j = 0; j < 12288; j++)
      CHECK(sw_check_reduced(out, j, (uint64_t)i, 2, j, DT_F32, DT_SUM), "call %d: element %zu is %g", i, j,
            (double)out[j]);
  }
  for (int u = 0; u < DT__TUNE_CLASSES; u++)
    CHECK(c->tune[u].calls == 0 && c->tune[u].algo == 0, "DTRAIN_ALGO=%s, yet class %d counted %llu calls",
          getenv("DTRAIN_ALGO"), u, (unsigned long long)c->tune[u].calls);
  dt_comm_destroy(c);
  free(in);
  free(out);
  return 0;
}

/* 48 KiB calls; rank 1 calls one more element in the call that ends the first trial (the 28th:
 * TUNE_FIRST = 16 untimed calls, then 2 x (DT__TUNE_TIMED + 1); counted from 0 here). */
#define BAD_CALL (16 + 2 * (DT__TUNE_TIMED + 1) - 1)
static int mismatch_body(int rank, int size, void *arg) {
  (void)size;
  (void)arg;
  dt_comm *c = sw_join(rank);
  CHECK(c, "create: %s", dt_last_error());
  dt_comm_set_timeout(c, 20000);
  float *in = calloc(12289, sizeof *in), *out = calloc(12289, sizeof *out);
  CHECK(in && out, "out of memory");
  for (int i = 0; i < BAD_CALL + 10; i++) {
    size_t n = i == BAD_CALL && rank == 1 ? 12289 : 12288;
    double t0 = check_now_s();
    dt_status st = dt_comm_allreduce(c, in, out, n, DT_F32, DT_SUM);
    if (i < BAD_CALL) {
      CHECK(st == DT_OK, "call %d: %s", i, dt_last_error());
      continue;
    }
    CHECK(i == BAD_CALL, "call %d returned %s after the mismatched call %d passed", i, dt_strerror(st), BAD_CALL);
    CHECK(st == DT_ERR_MISMATCH || st == DT_ERR_ABORTED, "the mismatched call returned %s: %s", dt_strerror(st),
          dt_last_error());
    CHECK(strstr(dt_last_error(), "12288") && strstr(dt_last_error(), "12289"),
          "the error does not name both calls: %s", dt_last_error());
    CHECK(check_now_s() - t0 < 10, "the mismatch took %.1f s to report", check_now_s() - t0);
    break;
  }
  dt_comm_destroy(c);
  free(in);
  free(out);
  return 0;
}

int main(void) {
  setenv("DTRAIN_TRANSPORT", "shm", 1);
  unsetenv("DTRAIN_ALGO");
  int bad = 0;
  for (int late = 0; late < 2; late++)
    if (mp_run(2, mixed_body, &late, 120)) {
      fprintf(stderr, "FAIL: mixed calls through the timed choice (rank %d late)\n", late);
      bad++;
    }
  if (mp_run(2, mismatch_body, NULL, 60)) {
    fprintf(stderr, "FAIL: a mismatched count at the end of a trial\n");
    bad++;
  }
  const char *forced[] = {"rd", "shm"};
  for (int f = 0; f < 2; f++) {
    setenv("DTRAIN_ALGO", forced[f], 1);
    if (mp_run(2, forced_body, NULL, 60)) {
      fprintf(stderr, "FAIL: DTRAIN_ALGO=%s\n", forced[f]);
      bad++;
    }
  }
  unsetenv("DTRAIN_ALGO");
  if (bad)
    return 1;
  printf("timed choice: mixed calls, agreement, mismatch and DTRAIN_ALGO ok\n");
  return 0;
}
