/* test_shm_late_exit.c - a rank that finishes a shared-memory collective and exits is not a
 * failure for a rank still waiting in that collective, which just has not looked since.
 *
 * A rank returns from its last collective and exits as soon as what the others need from it is
 * published (there is no goodbye handshake between ranks). A waiter that read the counter before
 * the publication and is descheduled (load) until after the exit used to run the ~50 ms
 * liveness check of its wait first, find the process gone and report "exited or was killed
 * during barrier" although the barrier was complete. That failed the collective sweep once in a
 * parallel ctest run. Here the descheduling is made certain with SIGSTOP, for each way shm waits:
 *   rank 1 enters the call and waits (> 50 ms, so the liveness check is due) for rank 2;
 *   rank 2 stops rank 1, enters the call, finishes it and exits;
 *   rank 0 finishes the call, waits until rank 2 is gone, then resumes rank 1,
 * and rank 1 must return DT_OK with the right result. Collectives that rank 2 can finish while
 * rank 1 is stopped, one per way of waiting: the shm barrier (counters), the flat allreduce
 * (slots), and a broadcast from rank 2 by the tree (sendrecv over the pairwise rings) and by the
 * flat slots (rank 2's data in its slot, the others' empty ones). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/check.h"
#include "common/mp.h"
#include "coll/sweep.h"

static const char *algos[] = {"barrier=shm", "flat", "broadcast=tree", "broadcast=flat"};
static int which;

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) && errno == EINTR) {
  }
}

/* A process is gone once it no longer exists or is a zombie. */
static int gone(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH)
    return 1;
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f)
    return 1;
  size_t k = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[k] = '\0';
  const char *p = strrchr(buf, ')');
  return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

static int body(int rank, int size, void *arg) {
  (void)arg;
  setenv("DTRAIN_TRANSPORT", "shm", 1);
  dt_comm *c = NULL;
  CHECK(dt_comm_create(NULL, &c) == DT_OK, "create: %s", dt_last_error());
  int64_t mine = getpid(), pids[3];
  CHECK(dt_comm_allgather(c, &mine, pids, 1, DT_I64) == DT_OK, "pid allgather: %s", dt_last_error());
  setenv("DTRAIN_ALGO", algos[which], 1);
  dt__coll_algo_load(c); /* a communicator reads it when it is made */
  size_t count = 1000;
  float *in = dt__alloc(count * sizeof *in), *out = dt__alloc(count * sizeof *out);
  CHECK(in && out, "out of memory");
  sw_fill(in, count, 0, 7, rank, DT_F32, DT_SUM);
  if (rank == 2) {
    sleep_ms(200); /* rank 1 has waited long enough for its liveness check to be due */
    CHECK(kill((pid_t)pids[1], SIGSTOP) == 0, "stopping rank 1: %s", strerror(errno));
    sleep_ms(20);
  }
  int bcast = which >= 2;
  if (bcast && rank == 2)
    memcpy(out, in, count * sizeof *out);
  dt_status st = which == 0   ? dt_comm_barrier(c)
                 : which == 1 ? dt_comm_allreduce(c, in, out, count, DT_F32, DT_SUM)
                              : dt_comm_broadcast(c, out, count, DT_F32, 2);
  if (rank == 0) {
    /* resume rank 1 only once rank 2 has exited (bounded: 20 s), whatever our own result */
    for (int i = 0; i < 2000 && !gone((pid_t)pids[2]); i++)
      sleep_ms(10);
    kill((pid_t)pids[1], SIGCONT);
  }
  CHECK(st == DT_OK, "%s: %s", algos[which], dt_last_error());
  if (which == 1)
    for (size_t i = 0; i < count; i++)
      CHECK(sw_check_reduced(out, i, 7, size, i, DT_F32, DT_SUM), "%s: element %zu = %.9g is wrong", algos[which],
            i, out[i]);
  if (bcast) {
    sw_fill(in, count, 0, 7, 2, DT_F32, DT_SUM);
    CHECK(!memcmp(in, out, count * sizeof *out), "broadcast: data differs from rank 2's");
  }
  dt__free(in);
  dt__free(out);
  dt_comm_destroy(c);
  return 0;
}

int main(void) {
  int bad = 0;
  for (which = 0; which < (int)(sizeof algos / sizeof algos[0]); which++) {
    int codes[3] = {0};
    int f = mp_run_codes(3, body, NULL, 120, codes);
    printf("%s: %s (exit codes %d %d %d)\n", algos[which], f ? "FAIL" : "ok", codes[0], codes[1], codes[2]);
    bad += f != 0;
  }
  return bad ? 1 : 0;
}
