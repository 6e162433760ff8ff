/* test_comm_leave.c - a rank that stops for its own reasons must not leave the others waiting
 * until the deadline (the communicators here have a 60 s timeout; every check asks for seconds):
 *   - dt_comm_abort: the other rank, inside a large allreduce, fails (DT_ERR_ABORTED, or
 *     DT_ERR_PEER if it saw the rank leave first) with a message naming the aborting rank and its
 *     reason (shm and tcp);
 *   - dt_comm_destroy without a word while the process lives on (what a rank does after a local
 *     failure, e.g. a full disk): the other rank, waiting in an allreduce, fails naming it; when
 *     the rank that left hosts the store (rank 0), its destroy returns once the other has left. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/check.h"
#include "common/mp.h"
#include "coll/sweep.h"

#define BIG (4u << 20)

/* Joins with a 60 s timeout, allocates the BIG buffer and runs one allreduce on it; NULL (with
 * the reason on stderr) if any of it fails. */
static dt_comm *start(int rank, float **a) {
  dt_comm *c = sw_join(rank);
  *a = c ? calloc(BIG, sizeof **a) : NULL;
  if (c)
    dt_comm_set_timeout(c, 60000);
  if (!c || !*a || dt_comm_allreduce(c, DT_IN_PLACE, *a, BIG, DT_F32, DT_SUM) != DT_OK) {
    fprintf(stderr, "rank %d: setting up: %s\n", rank, c && *a ? dt_last_error() : "create or calloc failed");
    return NULL;
  }
  return c;
}

static int abort_body(int rank, int size, void *arg) {
  (void)size;
  (void)arg;
  float *a;
  dt_comm *c = start(rank, &a);
  CHECK(c, "setting up failed");
  double t0 = check_now_s();
  if (rank == 1) {
    usleep(200000);
    dt_status st = dt_comm_abort(c, "checkpoint write: No space left on device");
    CHECK(st == DT_ERR_ABORTED, "dt_comm_abort returned %s", dt_strerror(st));
    CHECK(strstr(dt_last_error(), "rank 1: checkpoint write: No space left on device"), "its message: %s",
          dt_last_error());
  } else {
    dt_status st = dt_comm_allreduce(c, DT_IN_PLACE, a, BIG, DT_F32, DT_SUM);
    /* ABORTED, or PEER when it saw rank 1 leave first: the verdict leads the message either way */
    CHECK(st == DT_ERR_ABORTED || st == DT_ERR_PEER, "allreduce against an aborted rank returned %s: %s",
          dt_strerror(st), dt_last_error());
    CHECK(strstr(dt_last_error(), "rank 1: checkpoint write: No space left on device"),
          "the reason is not passed on: %s", dt_last_error());
    CHECK(check_now_s() - t0 < 10, "took %.1f s", check_now_s() - t0);
  }
  CHECK(dt_comm_abort(NULL, "x") == DT_ERR_INVALID, "dt_comm_abort(NULL) accepted");
  dt_comm_destroy(c);
  free(a);
  return 0;
}

/* arg: the rank that leaves. */
static int leave_body(int rank, int size, void *arg) {
  (void)size;
  int leaver = *(const int *)arg;
  float *a;
  dt_comm *c = start(rank, &a);
  CHECK(c, "setting up failed");
  double t0 = check_now_s();
  if (rank == leaver) {
    usleep(200000);
    dt_comm_destroy(c);
    CHECK(check_now_s() - t0 < 10, "destroy took %.1f s", check_now_s() - t0);
    usleep(1000000); /* alive, but gone from the job */
  } else {
    dt_status st = dt_comm_allreduce(c, DT_IN_PLACE, a, BIG, DT_F32, DT_SUM);
    CHECK(st == DT_ERR_PEER || st == DT_ERR_ABORTED, "allreduce against a rank that left returned %s: %s",
          dt_strerror(st), dt_last_error());
    char who[16];
    snprintf(who, sizeof who, "rank %d", leaver);
    CHECK(strstr(dt_last_error(), who), "the error does not name %s: %s", who, dt_last_error());
    CHECK(check_now_s() - t0 < 10, "noticed only after %.1f s", check_now_s() - t0);
    dt_comm_destroy(c);
  }
  free(a);
  return 0;
}

int main(void) {
  int bad = 0, ran = 0;
  const char *tps[] = {"shm", "tcp"};
  for (int t = 0; t < 2; t++) {
    setenv("DTRAIN_TRANSPORT", tps[t], 1);
    ran++;
    if (mp_run(2, abort_body, NULL, 90)) {
      fprintf(stderr, "FAIL: dt_comm_abort on %s\n", tps[t]);
      bad++;
    }
    for (int leaver = 0; leaver < 2; leaver++) {
      ran++;
      if (mp_run(2, leave_body, &leaver, 90)) {
        fprintf(stderr, "FAIL: rank %d leaving on %s\n", leaver, tps[t]);
        bad++;
      }
    }
  }
  printf("%d passed, %d failed\n", ran - bad, bad);
  return bad ? 1 : 0;
}
