/* fault_worker.c - the smallest real training loop for fault-tolerance tests: a state vector
 * x[X_LEN] (doubles) that every step adds the allreduce-sum of (step+1)/W from each of the W
 * ranks to, so after N steps every element is N(N+1)/2 whatever the world size, the failures
 * and the restarts, provided every step is applied exactly once: resuming from a checkpoint is
 * then checked by the final value. It calls dt_fault_step() at the top of each step like a
 * real trainer, checkpoints with dt_ckpt_save (rank 0) and resumes with dt_ckpt_open_latest.
 *
 *   fault_worker --steps N [--step-ms M] [--ckpt-dir D --ckpt-every K]
 *
 * stdout, rank 0:  "done steps N x X resumed S world W generation G"
 * stderr on error: "rank R: step S failed at t=MONO_NS: <dt_last_error()>"  (exit 1)
 * Every rank also prints "rank R: ready at t=MONO_NS" once the communicator is up. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "dtrain/ckpt.h"
#include "dtrain/comm.h"
#include "dtrain/fault.h"

#define X_LEN 1024

static int fail_at(int rank, int64_t step, const char *what) {
  fprintf(stderr, "rank %d: step %lld failed at t=%lld: %s: %s\n", rank, (long long)step, (long long)dt_now_ns(),
          what, dt_last_error());
  return 1;
}

int main(int argc, char **argv) {
  int64_t steps = 10, step_ms = 0, every = 0;
  const char *dir = NULL;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--steps"))
      steps = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "--step-ms"))
      step_ms = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "--ckpt-dir"))
      dir = argv[i + 1];
    else if (!strcmp(argv[i], "--ckpt-every"))
      every = atoll(argv[i + 1]);
    else {
      fprintf(stderr, "fault_worker: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  dt_comm *c = NULL;
  if (dt_comm_create(NULL, &c) != DT_OK) {
    fprintf(stderr, "fault_worker: joining the job failed at t=%lld: %s\n", (long long)dt_now_ns(), dt_last_error());
    return 1;
  }
  int rank = dt_comm_rank(c), world = dt_comm_size(c);
  fprintf(stderr, "rank %d: ready at t=%lld\n", rank, (long long)dt_now_ns());
  static double x[X_LEN], g[X_LEN];
  int64_t start = 0;
  if (dir) {
    dt_ckpt *ck = NULL;
    dt_status st = dt_ckpt_open_latest(dir, &ck);
    if (st == DT_OK) {
      const dt_ckpt_section *sec = dt_ckpt_find(ck, "x");
      if (!sec || sec->nbytes != sizeof x) {
        dt_ckpt_destroy(ck);
        return fail_at(rank, 0, "checkpoint without section x");
      }
      memcpy(x, sec->data, sizeof x);
      start = (int64_t)dt_ckpt_step(ck);
      if (dt_ckpt_skipped(ck)[0])
        fprintf(stderr, "rank %d: skipped corrupt checkpoints: %s\n", rank, dt_ckpt_skipped(ck));
      dt_ckpt_destroy(ck);
    } else if (st != DT_ERR_NOT_FOUND) {
      return fail_at(rank, 0, "resume");
    }
  }
  for (int64_t s = start; s < steps; s++) {
    if (dt_fault_step(s) != DT_OK)
      return fail_at(rank, s, "fault injection");
    for (int i = 0; i < X_LEN; i++)
      g[i] = (double)(s + 1) / world;
    if (dt_comm_allreduce(c, DT_IN_PLACE, g, X_LEN, DT_F64, DT_SUM) != DT_OK) {
      int rc = fail_at(rank, s, "allreduce");
      dt_comm_destroy(c);
      return rc;
    }
    if (fabs(g[0] - (double)(s + 1)) > 1e-9 * (double)(s + 1)) {
      fprintf(stderr, "rank %d: step %lld: allreduce gave %.17g, expected %lld\n", rank, (long long)s, g[0],
              (long long)(s + 1));
      return 1;
    }
    for (int i = 0; i < X_LEN; i++)
      x[i] += g[i];
    if (dir && every > 0 && rank == 0 && (s + 1) % every == 0) {
      dt_ckpt_section sec = {.name = "x", .data = x, .nbytes = sizeof x};
      if (dt_ckpt_save(dir, (uint64_t)(s + 1), &sec, 1, NULL, 0, 3, NULL, 0) != DT_OK)
        return fail_at(rank, s, "checkpoint");
    }
    if (step_ms > 0)
      dt__sleep_ns(step_ms * 1000000LL);
  }
  const char *gen = getenv("DTRAIN_RESTART_COUNT");
  if (rank == 0)
    printf("done steps %lld x %.17g resumed %lld world %d generation %s\n", (long long)steps, x[0], (long long)start,
           world, gen ? gen : "0");
  fflush(stdout);
  dt_comm_destroy(c);
  return 0;
}
