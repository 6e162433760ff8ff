/* test_comm_oom.c - a rank that runs out of memory inside a communicator operation: every
 * allocation of rank 1's call fails in turn (dt__alloc_fail_after), in a fresh 2-rank job each
 * time, for dt_comm_split, dt_comm_window, the first allreduce of each shared-memory path (single
 * copy, staged, flat) and over tcp, a nonblocking allreduce, an allgather (ring and Bruck's) and
 * a barrier. For
 * k = 0, 1, 2, ... the allocation after the first k of rank 1's call fails, until the call runs
 * without reaching it. On every k:
 *   - rank 1's call returns DT_ERR_NOMEM with a message that says what it could not allocate
 *     (DT_ERR_ABORTED with those words when the allocation was a background thread's), or
 *     succeeds (an allocation it can do without), and then so does a barrier after it;
 *   - rank 0, in the same call and then a barrier, either succeeds throughout (rank 1 failed
 *     after its part was done) or fails within seconds (the communicators' timeout is 30 s) with
 *     a message naming rank 1 and its lack of memory: never a wait to the deadline, never a hang;
 *   - both destroy their communicators and exit (mp.h's bound catches a hang).
 * Before the fix that came with this test, a split or window whose first allocation failed
 * returned without telling the others, who waited until that rank destroyed its communicator and
 * then read "left without joining this call" (no cause), and some messages of the split said
 * neither "memory" nor "allocate". Usage: test_comm_oom [op ...] (default: all). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/mp.h"
#include "coll/sweep.h"
#include "core/core.h"

#define MAX_K 400
#define BIG (1u << 20) /* floats: 4 MiB, single copies on shm */

typedef struct oom_op {
  const char *name;
  const char *transport;
  const char *env; /* NAME=VALUE for both ranks, or NULL */
} oom_op;

static const oom_op ops[] = {
    {"split", "shm", NULL},
    {"window", "shm", NULL},
    {"allreduce-cma", "shm", "DTRAIN_SHM_CMA=65536"},
    {"allreduce-staged", "shm", "DTRAIN_SHM_CMA=off"},
    {"allreduce-flat", "shm", NULL},
    {"allreduce-tcp", "tcp", NULL},
    {"iallreduce", "shm", NULL},
    {"allgather-tcp", "tcp", NULL},
    {"allgather-bruck", "tcp", "DTRAIN_ALGO=allgather=bruck"},
    {"barrier", "tcp", NULL},
};

typedef struct job {
  const oom_op *op;
  long k;
} job;

/* Exit codes of a rank. */
enum { R_DONE = 0, R_FAILED_AS_EXPECTED = 10, R_FIRED_OK = 11, R_BAD = 1 };

static bool says_memory(const char *m) { return strstr(m, "allocate") || strstr(m, "memory"); }

/* The operation under test on c; the buffers are the caller's. */
static dt_status run_op(const oom_op *op, dt_comm *c, float *a, float *b) {
  const char *n = op->name;
  if (!strcmp(n, "split")) {
    dt_comm *g = NULL;
    dt_status st = dt_comm_split(c, 0, -dt_comm_rank(c), &g);
    if (st == DT_OK) {
      st = dt_comm_allreduce(g, DT_IN_PLACE, a, 1000, DT_F32, DT_SUM);
      dt_comm_destroy(g);
    }
    return st;
  }
  if (!strcmp(n, "window")) {
    void *w = NULL;
    dt_status st = dt_comm_window(c, 1u << 20, &w);
    if (st == DT_OK)
      st = dt_comm_allreduce(c, DT_IN_PLACE, w, (1u << 20) / sizeof(float), DT_F32, DT_SUM);
    return st;
  }
  if (!strncmp(n, "allreduce-", 10)) {
    size_t count = !strcmp(n, "allreduce-flat") ? 100 : BIG;
    return dt_comm_allreduce(c, a, b, count, DT_F32, DT_SUM);
  }
  if (!strcmp(n, "iallreduce")) {
    dt_request *r = NULL;
    dt_status st = dt_comm_iallreduce(c, a, b, BIG / 4, DT_F32, DT_SUM, &r);
    return st == DT_OK ? dt_request_wait(r) : st;
  }
  if (!strncmp(n, "allgather-", 10))
    return dt_comm_allgather(c, a, b, !strcmp(n, "allgather-bruck") ? 1000 : BIG / 2, DT_F32);
  return dt_comm_barrier(c);
}

static int body(int rank, int size, void *arg) {
  (void)size;
  const job *j = arg;
  float *a = calloc(BIG, sizeof *a), *b = calloc(BIG, sizeof *b);
  dt_comm *c = a && b ? sw_join(rank) : NULL;
  if (!c)
    return R_BAD;
  /* both ranks set up (and every lazily made part of the communicator exists) before arming */
  if (dt_comm_barrier(c) != DT_OK) {
    fprintf(stderr, "rank %d: barrier before the call: %s\n", rank, dt_last_error());
    return R_BAD;
  }
  double t0 = check_now_s();
  if (rank == 1) {
    dt_clear_error();
    dt__alloc_fail_after(j->k);
  }
  dt_status st = run_op(j->op, c, a, b);
  bool fired = rank == 1 && dt__alloc_fail_after(-1) < 0;
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", dt_last_error());
  if (st == DT_OK) {
    st = dt_comm_barrier(c);
    snprintf(msg, sizeof msg, "%s", dt_last_error());
  }
  double took = check_now_s() - t0;
  int code = R_BAD;
  if (rank == 1) {
    if (st == DT_OK)
      code = fired ? R_FIRED_OK : R_DONE;
    else if (fired && (st == DT_ERR_NOMEM || st == DT_ERR_ABORTED) && says_memory(msg))
      /* ABORTED: the allocation that failed was a background thread's (the failure detector's),
       * which failed the job with the same words */
      code = R_FAILED_AS_EXPECTED;
    else
      fprintf(stderr, "%s k=%ld rank 1: %s (allocation %s): %s\n", j->op->name, j->k, dt_strerror(st),
              fired ? "failed" : "not reached", msg);
  } else {
    if (st == DT_OK)
      code = R_DONE;
    else if (strstr(msg, "rank 1") && says_memory(msg) && took < 10.0)
      code = R_FAILED_AS_EXPECTED;
    else
      fprintf(stderr, "%s k=%ld rank 0: %s after %.1f s: %s\n", j->op->name, j->k, dt_strerror(st), took, msg);
  }
  dt_comm_destroy(c);
  free(a);
  free(b);
  return code;
}

/* Sweeps k for one operation; the number of failed checks. */
static int sweep(const oom_op *op) {
  setenv("DTRAIN_TRANSPORT", op->transport, 1);
  char name[64] = "";
  if (op->env) {
    const char *eq = strchr(op->env, '=');
    snprintf(name, sizeof name, "%.*s", (int)(eq - op->env), op->env);
    setenv(name, eq + 1, 1);
  }
  int bad = 0, failed_calls = 0;
  long k = 0;
  for (; k < MAX_K; k++) {
    job j = {op, k};
    int codes[2] = {0, 0};
    mp_run_codes(2, body, &j, 60, codes);
    if (codes[0] == R_DONE && codes[1] == R_DONE)
      break; /* rank 1's call did not reach allocation k: every one was tried */
    bool ok = (codes[1] == R_FIRED_OK && codes[0] == R_DONE) ||
              (codes[1] == R_FAILED_AS_EXPECTED && (codes[0] == R_FAILED_AS_EXPECTED || codes[0] == R_DONE));
    if (codes[1] == R_FAILED_AS_EXPECTED)
      failed_calls++;
    if (!ok) {
      fprintf(stderr, "FAIL %s: allocation %ld of rank 1 failing: exit codes %d and %d\n", op->name, k, codes[0],
              codes[1]);
      if (++bad >= 3)
        break;
    }
  }
  if (k == MAX_K) {
    fprintf(stderr, "FAIL %s: still allocating after %d allocations\n", op->name, MAX_K);
    bad++;
  }
  printf("%s over %s: %ld allocations of rank 1 failed in turn, %d of them failed the call, %d bad\n", op->name,
         op->transport, k, failed_calls, bad);
  fflush(stdout);
  if (op->env)
    unsetenv(name);
  return bad;
}

int main(int argc, char **argv) {
  int bad = 0, ran = 0;
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    bool want = argc < 2;
    for (int a = 1; a < argc; a++)
      want = want || !strcmp(argv[a], ops[i].name);
    if (want) {
      bad += sweep(&ops[i]);
      ran++;
    }
  }
  if (!ran)
    fprintf(stderr, "test_comm_oom: no such operation\n");
  return bad || !ran ? 1 : 0;
}
