/* test_bind.c - DTRAIN_BIND (src/comm/bind.c): each local rank gets its own equal, consecutive
 * share of the CPUs it was allowed, or with more ranks than CPUs the one CPU local rank mod CPUs;
 * nothing changes with one rank, or with DTRAIN_BIND unset / none; any other value is
 * DT_ERR_INVALID naming it; dt_comm_config.bind, when set, wins over DTRAIN_BIND. Then real tcp
 * jobs with DTRAIN_BIND=auto: 2 ranks, each rank's mask is the expected share (disjoint from the
 * other's when there are 2 CPUs or more); 3 ranks on 2 CPUs (or 2 on 1), ranks 0 and 2 share a
 * CPU and rank 1 has the other; in both, the communicator's own threads (heartbeat, store
 * server) carry the rank's mask, and an allreduce still gives the right sum.
 * Each case runs in its own child process, so masks never leak between cases. */
#include <dirent.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm.h"
#include "common/check.h"
#include "common/mp.h"

static cpu_set_t start_mask; /* what the test process was allowed at start */

/* The expected share of local rank lr of ls in `have` (the policy stated in bind.c). */
static void share_of(const cpu_set_t *have, int lr, int ls, cpu_set_t *out) {
  int ncpu = CPU_COUNT(have), per = ls > ncpu ? 1 : ncpu / ls, lo = ls > ncpu ? lr % ncpu : lr * per, k = 0;
  CPU_ZERO(out);
  for (int i = 0; i < CPU_SETSIZE; i++)
    if (CPU_ISSET(i, have)) {
      if (k >= lo && k < lo + per)
        CPU_SET(i, out);
      k++;
    }
}

/* The ids of this process's threads, at most cap; returns how many. */
static int thread_ids(pid_t *ids, int cap) {
  DIR *d = opendir("/proc/self/task");
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL && n < cap)
    if (e->d_name[0] != '.')
      ids[n++] = (pid_t)atoi(e->d_name);
  if (d)
    closedir(d);
  return n;
}

/* Every thread of this process that is not in before[0..nbefore) (the threads that existed
 * before dt_comm_create, such as a sanitizer's own: what is new is the communicator's, the
 * heartbeat thread and, on rank 0, the store server) has the mask `mine`; returns how many it
 * checked, -1 on a mismatch (printed). */
static int own_threads_follow(const cpu_set_t *mine, const pid_t *before, int nbefore) {
  pid_t now[64];
  int n = 0, k = thread_ids(now, 64);
  for (int i = 0; i < k && n >= 0; i++) {
    bool old = false;
    for (int j = 0; j < nbefore; j++)
      old = old || now[i] == before[j];
    if (old)
      continue;
    cpu_set_t m;
    if (sched_getaffinity(now[i], sizeof m, &m) != 0 || !CPU_EQUAL(&m, mine)) {
      fprintf(stderr, "thread %d is not bound with its rank\n", (int)now[i]);
      n = -1;
    } else {
      n++;
    }
  }
  return n;
}

static int in_child(int (*fn)(void *), void *arg) {
  fflush(NULL);
  pid_t p = fork();
  if (p == 0)
    _exit(fn(arg));
  int st = 0;
  waitpid(p, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 100;
}

/* env: DTRAIN_BIND; mode: dt_comm_config.bind, which wins over it when set */
typedef struct unit { const char *env; int lr, ls, one_cpu; const char *mode; } unit;

static int unit_body(void *arg) {
  const unit *u = arg;
  int rank = u->lr;
  cpu_set_t have, got, want;
  if (u->one_cpu) { /* a launcher that gave us one CPU: two ranks cannot be split further */
    int first = 0;
    while (!CPU_ISSET(first, &start_mask))
      first++;
    CPU_ZERO(&have);
    CPU_SET(first, &have);
    CHECK(sched_setaffinity(0, sizeof have, &have) == 0, "restricting to one CPU");
  }
  CHECK(sched_getaffinity(0, sizeof have, &have) == 0, "sched_getaffinity");
  if (u->env)
    setenv("DTRAIN_BIND", u->env, 1);
  else
    unsetenv("DTRAIN_BIND");
  dt_status st = dt__comm_bind(u->mode, u->lr, u->ls, NULL, 0);
  CHECK(sched_getaffinity(0, sizeof got, &got) == 0, "sched_getaffinity after");
  const char *v = u->mode ? u->mode : u->env, *name = u->mode ? "dt_comm_config.bind=" : "DTRAIN_BIND=";
  if (v && strcmp(v, "auto") && strcmp(v, "none")) {
    char want_msg[64];
    snprintf(want_msg, sizeof want_msg, "%s%s", name, v);
    CHECK(st == DT_ERR_INVALID && strstr(dt_last_error(), want_msg), "%s: got %s '%s'", want_msg, dt_strerror(st),
          dt_last_error());
    CHECK(CPU_EQUAL(&got, &have), "a refused DTRAIN_BIND changed the mask");
    return 0;
  }
  CHECK(st == DT_OK, "%s%s: %s", name, v ? v : "(unset)", dt_last_error());
  int ncpu = CPU_COUNT(&have);
  if (!v || !strcmp(v, "none") || u->ls <= 1) {
    CHECK(CPU_EQUAL(&got, &have), "%s%s, local rank %d of %d, %d CPUs: mask changed", name, v ? v : "(unset)", u->lr,
          u->ls, ncpu);
    return 0;
  }
  share_of(&have, u->lr, u->ls, &want);
  CHECK(CPU_EQUAL(&got, &want), "local rank %d of %d: bound to %d CPUs, expected the %d-CPU share of %d", u->lr, u->ls,
        CPU_COUNT(&got), CPU_COUNT(&want), ncpu);
  return 0;
}

static int job_body(int rank, int size, void *arg) {
  (void)arg;
  setenv("DTRAIN_TRANSPORT", "tcp", 1);
  setenv("DTRAIN_BIND", "auto", 1);
  pid_t before[64];
  int nbefore = thread_ids(before, 64);
  dt_comm *c = NULL;
  CHECK(dt_comm_create(NULL, &c) == DT_OK, "create: %s", dt_last_error());
  cpu_set_t have, got, want;
  CHECK(sched_getaffinity(0, sizeof got, &got) == 0, "sched_getaffinity");
  have = *(const cpu_set_t *)arg; /* what the job's processes were started with */
  int ncpu = CPU_COUNT(&have);
  share_of(&have, rank, size, &want);
  CHECK(CPU_EQUAL(&got, &want), "rank %d of %d on %d CPUs: bound to %d CPU(s), not its share", rank, size, ncpu,
        CPU_COUNT(&got));
  int nown = own_threads_follow(&got, before, nbefore);
  CHECK(nown >= (rank == 0 ? 2 : 1), "rank %d: %d of the communicator's threads carry its mask", rank, nown);
  /* the ranks' masks (first 64 CPUs) side by side: disjoint when each got a share, and with
   * more ranks than CPUs rank r shares a CPU with rank r + ncpu only */
  int64_t bits = 0, all[8] = {0};
  for (int i = 0; i < 64; i++)
    if (CPU_ISSET(i, &got))
      bits |= (int64_t)(1ull << i);
  CHECK(size <= 8 && dt_comm_allgather(c, &bits, all, 1, DT_I64) == DT_OK, "allgather: %s", dt_last_error());
  for (int a = 0; a < size; a++)
    for (int b = a + 1; b < size; b++)
      CHECK(all[a] && ((all[a] & all[b]) != 0) == (size > ncpu && a % ncpu == b % ncpu),
            "ranks %d and %d of %d on %d CPUs: masks %#llx and %#llx", a, b, size, ncpu, (unsigned long long)all[a],
            (unsigned long long)all[b]);
  float x[3] = {1.0f + (float)rank, 2, 3}, y[3];
  float want0 = (float)(size * (size + 1) / 2);
  CHECK(dt_comm_allreduce(c, x, y, 3, DT_F32, DT_SUM) == DT_OK && y[0] == want0 && y[2] == 3.0f * (float)size,
        "allreduce: %s", dt_last_error());
  dt_comm_destroy(c);
  return 0;
}

/* Ranks a launcher bound before they joined (mpirun binds each of two ranks to a core of its
 * own): arg 0, rank r on the r-th allowed CPU (mod their number); 1, every rank on the first. The
 * communicator counts the CPUs of all the ranks on the host together (host_cpus, which the shm
 * and tcp transports compare the ranks against to decide whether to stop spinning at once), not
 * this process's one: two ranks on two CPUs of their own are not oversubscribed. */
static int prebound_body(int rank, int size, void *arg) {
  const int shared = *(const int *)arg;
  unsetenv("DTRAIN_BIND");
  cpu_set_t one;
  int ncpu = CPU_COUNT(&start_mask), k = shared ? 0 : rank % ncpu;
  CPU_ZERO(&one);
  for (int i = 0, seen = 0; i < CPU_SETSIZE; i++)
    if (CPU_ISSET(i, &start_mask) && seen++ == k)
      CPU_SET(i, &one);
  CHECK(sched_setaffinity(0, sizeof one, &one) == 0, "binding rank %d", rank);
  dt_comm *c = NULL;
  CHECK(dt_comm_create(NULL, &c) == DT_OK, "create: %s", dt_last_error());
  int want = shared ? 1 : (size < ncpu ? size : ncpu);
  CHECK(c->host_cpus == want, "rank %d of %d, bound %s before joining: host_cpus %d, expected %d", rank, size,
        shared ? "to one shared CPU" : "to a CPU of its own", c->host_cpus, want);
  CHECK(dt__comm_cpus() == 1, "rank %d: the communicator changed the launcher's binding", rank);
  float x = 1.0f + (float)rank, y = 0;
  CHECK(dt_comm_allreduce(c, &x, &y, 1, DT_F32, DT_SUM) == DT_OK && y == (float)(size * (size + 1) / 2),
        "allreduce: %s", dt_last_error());
  dt_comm_destroy(c);
  return 0;
}

/* dt__comm_cpus_hex and dt__comm_cpus_or: the host record's CPU list and its union. */
static int cpus_list_body(void *arg) {
  (void)arg;
  const int rank = 0; /* CHECK names it */
  cpu_set_t m;
  CPU_ZERO(&m);
  CPU_SET(0, &m);
  CPU_SET(1, &m);
  CHECK(sched_setaffinity(0, sizeof m, &m) == 0 || CPU_COUNT(&start_mask) < 2, "binding to CPUs 0 and 1");
  char hex[DT__CPUS_HEX + 1];
  dt__comm_cpus_hex(hex, sizeof hex);
  if (CPU_ISSET(0, &start_mask) && CPU_ISSET(1, &start_mask))
    CHECK(!strcmp(hex, "3"), "CPUs 0 and 1 written as '%s', expected '3'", hex);
  uint8_t acc[DT__CPUS_HEX] = {0};
  CHECK(dt__comm_cpus_or(acc, "3") && dt__comm_cpus_or(acc, "02") && dt__comm_cpus_or(acc, "0001"),
        "well-formed lists refused");
  CHECK(acc[0] == 3 && acc[1] == 2 && acc[2] == 0 && acc[3] == 1, "union %x %x %x %x, expected 3 2 0 1", acc[0],
        acc[1], acc[2], acc[3]);
  char big[DT__CPUS_HEX + 2];
  memset(big, 'f', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  CHECK(!dt__comm_cpus_or(acc, "") && !dt__comm_cpus_or(acc, "3g") && !dt__comm_cpus_or(acc, "F") &&
            !dt__comm_cpus_or(acc, big),
        "an empty, malformed or too long list was taken");
  CHECK(acc[0] == 3 && acc[1] == 2 && acc[4] == 0, "a refused list changed the union");
  return 0;
}

int main(void) {
  if (sched_getaffinity(0, sizeof start_mask, &start_mask) != 0) {
    perror("sched_getaffinity");
    return 1;
  }
  int ncpu = CPU_COUNT(&start_mask);
  printf("# %d CPU(s) allowed\n", ncpu);
  unit cases[] = {
      {NULL, 0, 2, 0, NULL},    {"none", 1, 2, 0, NULL},        {"auto", 0, 1, 0, NULL},
      {"auto", 0, 2, 0, NULL},  {"auto", 1, 2, 0, NULL},        {"auto", 0, ncpu + 1, 0, NULL},
      {"auto", 1, 2, 1, NULL},  {"core", 0, 2, 0, NULL},
      /* the communicator's config wins over the environment, both ways, and a bad one names it */
      {"none", 1, 2, 0, "auto"}, {"core", 0, 2, 0, "none"}, {NULL, 0, 2, 0, "always"},
  };
  int bad = 0, ran = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ran++;
    if (in_child(unit_body, &cases[i])) {
      fprintf(stderr, "FAIL: DTRAIN_BIND=%s config bind=%s local rank %d of %d%s\n",
              cases[i].env ? cases[i].env : "(unset)", cases[i].mode ? cases[i].mode : "(unset)", cases[i].lr,
              cases[i].ls, cases[i].one_cpu ? " on one CPU" : "");
      bad++;
    }
  }
  ran++;
  if (mp_run(2, job_body, &start_mask, 60)) {
    fprintf(stderr, "FAIL: 2-rank tcp job with DTRAIN_BIND=auto\n");
    bad++;
  }
  /* oversubscribed: the job's processes start on the first one or two allowed CPUs */
  cpu_set_t few;
  CPU_ZERO(&few);
  for (int i = 0, k = 0; i < CPU_SETSIZE && k < 2; i++)
    if (CPU_ISSET(i, &start_mask)) {
      CPU_SET(i, &few);
      k++;
    }
  int nover = CPU_COUNT(&few) + 1;
  ran++;
  if (sched_setaffinity(0, sizeof few, &few) != 0 || mp_run(nover, job_body, &few, 60) ||
      sched_setaffinity(0, sizeof start_mask, &start_mask) != 0) {
    fprintf(stderr, "FAIL: %d-rank tcp job on %d CPU(s) with DTRAIN_BIND=auto\n", nover, CPU_COUNT(&few));
    bad++;
  }
  ran++;
  if (in_child(cpus_list_body, NULL)) {
    fprintf(stderr, "FAIL: the host record's CPU lists\n");
    bad++;
  }
  for (int shared = 0; shared < 2; shared++) {
    ran++;
    if (mp_run(2, prebound_body, &shared, 60)) {
      fprintf(stderr, "FAIL: 2-rank job bound %s before joining\n", shared ? "to one CPU" : "a CPU per rank");
      bad++;
    }
  }
  printf("%d passed, %d failed\n", ran - bad, bad);
  return bad ? 1 : 0;
}
