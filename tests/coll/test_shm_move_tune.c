/* test_shm_move_tune.c - the timed choice of the shm broadcast's and allgather's path (the single
 * copy or the staging buffers, per size class from 16 KiB; shm.c, SHM_TUNE_KINDS), on 2 real
 * processes with the transport's own defaults (DTRAIN_SHM_CMA unset, which would fix the path):
 *   - 480 calls mixing broadcasts of 7 sizes (5 timed classes, and one below them) from either
 *     root and allgathers of 4 block sizes, in place and not, of u8, f32, f64 and i32, with rank 1
 *     late into one call in four: every byte of every result is right, through the timing runs
 *     of the slower path (a class's 8th call, then from its 16th), the switches back, and
 *     whatever the times chose;
 *   - where single copies are on, rank 0's debug log says that each timed class took the
 *     staging buffers from some call (so both paths ran in every class); where they are off
 *     (process_vm_readv too slow here, or not allowed) there is one path and only the results
 *     are checked;
 *   - one rank broadcasting another size than the other at call 41, after classes that may sit
 *     on different paths: both ranks fail in that call with DT_ERR_MISMATCH naming the two calls
 *     (or the job's abort carrying it), within seconds, neither returning DT_OK.
 *   - with more ranks than CPUs (both ranks pinned to one CPU): broadcasts, allgathers and
 *     allreduces of 1 MiB and 4 MiB, right; unless rank 0's log says the single copies are off
 *     here (too slow, or not allowed), it times the single copy against the staging buffers at
 *     4 MiB for all three and never at 1 MiB (SHM_OVER_CMA in shm.c).
 * Which path a class settles on depends on the host's timings and is not checked: the benchmarks
 * measure that (bench/results/move-tune-2026-12-06-zen5.txt).
 *
 * Usage: test_shm_move_tune */
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/check.h"
#include "common/mp.h"
#include "coll/sweep.h"

typedef struct {
  bool gather; /* allgather (count per block), else broadcast */
  dt_dtype t;
  size_t count;
  int cls; /* timed class: powers of two from 16 KiB; -1 not timed */
} mcase;

static const mcase cases[] = {
    {false, DT_U8, 16384, 0},    /* 16 KiB */
    {true, DT_F32, 4096, 0},     /* 16 KiB blocks */
    {false, DT_F32, 5000, 0},    /* 20,000 B */
    {false, DT_F32, 12289, 1},   /* 49,156 B */
    {true, DT_U8, 40001, 1},     /* 40,001 B blocks */
    {false, DT_U8, 100000, 2},   /* 100,000 B */
    {true, DT_F32, 30000, 2},    /* 120,000 B blocks */
    {false, DT_F64, 40000, 4},   /* 320,000 B */
    {true, DT_I32, 65536, 4},    /* 256 KiB blocks */
    {false, DT_F32, 262144, 6},  /* 1 MiB */
    {false, DT_F32, 4000, -1},   /* 16,000 B: below the single copies, the staging buffers always */
    {true, DT_F32, 4001, -1},    /* 16,004 B blocks: below the single copies, the flat slots */
};
#define NCASES (sizeof cases / sizeof cases[0])
#define CALLS 480
#define MAXB (1u << 20)

/* Byte j of rank r's data in call i. */
static uint8_t pat(int i, int r, size_t j) {
  return (uint8_t)(sw_hash((uint64_t)i << 32 ^ (uint64_t)r << 28 ^ (j >> 3)) >> (8 * (j & 7)));
}

static char *read_all(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f)
    return NULL;
  size_t cap = 1 << 16, n = 0;
  char *s = malloc(cap);
  for (size_t k; s && (k = fread(s + n, 1, cap - n - 1, f)) > 0;) {
    n += k;
    if (n + 1 == cap)
      s = realloc(s, cap *= 2);
  }
  fclose(f);
  if (s)
    s[n] = '\0';
  return s;
}

static int mixed_body(int rank, int size, void *arg) {
  (void)size;
  const char *log = arg;
  if (rank == 0) { /* its debug log into a file, read back at the end */
    setenv("DTRAIN_LOG", "debug", 1);
    CHECK(freopen(log, "w", stderr), "cannot write %s", log);
  }
  dt_comm *c = sw_join(rank);
  CHECK(c, "create: %s", dt_last_error());
  uint8_t *in = malloc(MAXB), *out = malloc(2 * MAXB);
  CHECK(in && out, "out of memory");
  for (int i = 0; i < CALLS; i++) {
    const mcase *k = &cases[(size_t)i % NCASES];
    const size_t bytes = k->count * dt_dtype_size(k->t);
    const uint64_t h = sw_hash((uint64_t)i ^ 0x6d76u);
    const int root = (int)(h >> 8 & 1);
    const bool inplace = k->gather && i % 3 == 0;
    if (rank == 1 && h % 4 == 0)
      usleep((useconds_t)(h >> 16 & 255));
    dt_status st;
    if (k->gather) {
      uint8_t *mine = inplace ? out + (size_t)rank * bytes : in;
      for (size_t j = 0; j < bytes; j++)
        mine[j] = pat(i, rank, j);
      st = dt_comm_allgather(c, inplace ? DT_IN_PLACE : in, out, k->count, k->t);
    } else {
      for (size_t j = 0; j < bytes; j++)
        out[j] = rank == root ? pat(i, root, j) : (uint8_t)~pat(i, root, j);
      st = dt_comm_broadcast(c, out, k->count, k->t, root);
    }
    CHECK(st == DT_OK, "call %d (%s of %zu bytes): %s", i, k->gather ? "allgather" : "broadcast", bytes,
          dt_last_error());
    for (int r = 0; r < (k->gather ? 2 : 1); r++)
      for (size_t j = 0; j < bytes; j++) {
        const int from = k->gather ? r : root;
        CHECK(out[(size_t)r * bytes + j] == pat(i, from, j), "call %d (%s of %zu bytes, %s %d): byte %zu is %u, not %u",
              i, k->gather ? "allgather" : "broadcast", bytes, k->gather ? "block" : "root", from, j,
              out[(size_t)r * bytes + j], pat(i, from, j));
      }
  }
  dt_comm_destroy(c);
  free(in);
  free(out);
  if (rank != 0)
    return 0;
  fflush(stderr);
  char *s = read_all(log);
  CHECK(s, "cannot read %s", log);
  /* where single copies are off there is one path: nothing to time; on one CPU the two ranks are
   * more than the CPUs, and the single copies start at 4 MiB (over_body) */
  cpu_set_t have;
  if (!strstr(s, "process_vm_readv moves") || strstr(s, "copy through staging buffers") ||
      (sched_getaffinity(0, sizeof have, &have) == 0 && CPU_COUNT(&have) < 2)) {
    printf("single copies are off on this host, or start at 4 MiB on one CPU; only the results were checked\n");
    free(s);
    return 0;
  }
  for (size_t i = 0; i < NCASES; i++) {
    const mcase *k = &cases[i];
    if (k->cls < 0)
      continue;
    char want[160];
    snprintf(want, sizeof want, "%s of %u KiB and up to twice that take the staging buffers from call",
             k->gather ? "allgathers" : "broadcasts", 16u << k->cls);
    CHECK(strstr(s, want), "no '%s' in rank 0's debug log:\n%s", want, s);
  }
  free(s);
  return 0;
}

/* Both ranks on one CPU, so the job has more ranks than CPUs: 12 calls of each collective at 1
 * MiB and at 4 MiB, alternated, every result checked; then rank 0's log. */
#define OVER_BIG (4u << 20)
static int over_body(int rank, int size, void *arg) {
  (void)size;
  const char *log = arg;
  cpu_set_t have, one;
  CHECK(sched_getaffinity(0, sizeof have, &have) == 0, "sched_getaffinity failed");
  CPU_ZERO(&one);
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
    if (CPU_ISSET(cpu, &have)) {
      CPU_SET(cpu, &one);
      break;
    }
  CHECK(sched_setaffinity(0, sizeof one, &one) == 0, "sched_setaffinity failed");
  if (rank == 0) {
    setenv("DTRAIN_LOG", "debug", 1);
    CHECK(freopen(log, "w", stderr), "cannot write %s", log);
  }
  dt_comm *c = sw_join(rank);
  CHECK(c, "create: %s", dt_last_error());
  float *in = malloc(OVER_BIG), *out = malloc(2 * OVER_BIG);
  CHECK(in && out, "out of memory");
  static const char *const names[] = {"broadcast", "allgather", "allreduce"};
  for (int i = 0; i < 72; i++) {
    const int kind = i % 3;
    const size_t count = (i / 3 % 2 ? OVER_BIG : OVER_BIG / 4) / sizeof(float);
    for (size_t j = 0; j < count; j++)
      in[j] = (float)((j + (size_t)i + (size_t)rank * 7) % 1024);
    dt_status st;
    if (kind == 0) {
      memcpy(out, in, count * sizeof(float));
      st = dt_comm_broadcast(c, out, count, DT_F32, 0);
    } else if (kind == 1) {
      st = dt_comm_allgather(c, in, out, count, DT_F32);
    } else {
      st = dt_comm_allreduce(c, in, out, count, DT_F32, DT_SUM);
    }
    CHECK(st == DT_OK, "call %d (%s of %zu floats): %s", i, names[kind], count, dt_last_error());
    for (size_t j = 0; j < count * (kind == 1 ? 2 : 1); j++) {
      const size_t e = j % count, b = j / count;
      const float r0 = (float)((e + (size_t)i) % 1024), r1 = (float)((e + (size_t)i + 7) % 1024);
      const float want = kind == 0 ? r0 : kind == 1 ? (b ? r1 : r0) : r0 + r1;
      CHECK(out[j] == want, "call %d (%s of %zu floats): element %zu is %g, not %g", i, names[kind], count, j,
            (double)out[j], (double)want);
    }
  }
  dt_comm_destroy(c);
  free(in);
  free(out);
  if (rank != 0)
    return 0;
  fflush(stderr);
  char *s = read_all(log);
  CHECK(s, "cannot read %s", log);
  if (strstr(s, "copy through staging buffers")) { /* rank 0 says why: too slow here, or not allowed */
    printf("single copies are off on this host; only the results with more ranks than CPUs were checked\n");
    free(s);
    return 0;
  }
  static const char *const kinds[] = {"broadcasts", "allgathers", "allreduces"};
  for (int k = 0; k < 3; k++) {
    char want[160];
    snprintf(want, sizeof want, "%s of %u KiB and up to twice that take the staging buffers from call", kinds[k],
             OVER_BIG >> 10);
    CHECK(strstr(s, want), "no '%s' in rank 0's debug log:\n%s", want, s);
    snprintf(want, sizeof want, "%s of %u KiB and up to twice that", kinds[k], OVER_BIG >> 12);
    CHECK(!strstr(s, want), "'%s' in rank 0's debug log: timed below 4 MiB with more ranks than CPUs:\n%s", want,
          s);
  }
  free(s);
  return 0;
}

/* 20 broadcasts of 64 KiB and 20 of 16 KiB alternating, then call 41: rank 1 broadcasts 16 KiB
 * where rank 0 broadcasts 64 KiB. */
static int mismatch_body(int rank, int size, void *arg) {
  (void)size;
  (void)arg;
  dt_comm *c = sw_join(rank);
  CHECK(c, "create: %s", dt_last_error());
  static float buf[16384];
  for (int i = 0; i < 40; i++)
    CHECK(dt_comm_broadcast(c, buf, i % 2 ? 4096 : 16384, DT_F32, 0) == DT_OK, "broadcast %d: %s", i,
          dt_last_error());
  double t0 = check_now_s();
  dt_status st = dt_comm_broadcast(c, buf, rank == 1 ? 4096 : 16384, DT_F32, 0);
  double took = check_now_s() - t0;
  CHECK(st == DT_ERR_MISMATCH || st == DT_ERR_ABORTED, "mismatched broadcast returned %s", dt_strerror(st));
  CHECK(strstr(dt_last_error(), "broadcast #41 with 4096 x f32 from root 0") &&
            strstr(dt_last_error(), "broadcast #41 with 16384 x f32 from root 0"),
        "the error does not name both calls: %s", dt_last_error());
  CHECK(took < 10, "the mismatch took %.1f s to notice", took);
  dt_comm_destroy(c);
  return 0;
}

int main(void) {
  setenv("DTRAIN_TRANSPORT", "shm", 1);
  unsetenv("DTRAIN_SHM_CMA");
  unsetenv("DTRAIN_ALGO");
  int bad = 0;
  char log[64];
  snprintf(log, sizeof log, "/tmp/dtrain-move-tune-%d.log", (int)getpid());
  if (mp_run(2, mixed_body, log, 240)) {
    fprintf(stderr, "FAIL: mixed broadcasts and allgathers (rank 0's log: %s)\n", log);
    bad++;
  } else {
    unlink(log);
  }
  if (mp_run(2, mismatch_body, NULL, 60)) {
    fprintf(stderr, "FAIL: mismatched timed broadcasts\n");
    bad++;
  }
  snprintf(log, sizeof log, "/tmp/dtrain-move-tune-over-%d.log", (int)getpid());
  if (mp_run(2, over_body, log, 120)) {
    fprintf(stderr, "FAIL: more ranks than CPUs (rank 0's log: %s)\n", log);
    bad++;
  } else {
    unlink(log);
  }
  printf("%d passed, %d failed\n", 3 - bad, bad);
  return bad ? 1 : 0;
}
