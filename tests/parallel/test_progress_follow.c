/* test_progress_follow.c - the communicator's progress thread runs each nonblocking call on
 * the CPU the call was submitted from (src/comm/progress.c, "Placement"), and stays where the
 * scheduler puts it with DTRAIN_PROGRESS_FOLLOW=0.
 *
 * One single-rank communicator (no launcher variables): its first iallreduce starts the
 * progress thread with the process's whole CPU mask; then the main thread pins itself to CPU A,
 * submits, and exactly one other thread of the process must be pinned to A alone (threads
 * started before keep the whole mask); then from CPU B, one thread on B and none left on A.
 * The sums are checked too. With one usable CPU, A = B and only the first part means anything. */
#include <dirent.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "dtrain/comm.h"

static int failures;
#define CHECK(cond, ...)                                                              \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);        \
      fprintf(stderr, __VA_ARGS__);                                                   \
      fputc('\n', stderr);                                                            \
      failures++;                                                                     \
    }                                                                                 \
  } while (0)

/* Threads of this process other than the caller whose CPU list is exactly the one CPU `cpu`. */
static int threads_pinned_to(int cpu) {
  char want[32], path[300], line[512];
  snprintf(want, sizeof want, "%d", cpu);
  long self = syscall(SYS_gettid);
  DIR *d = opendir("/proc/self/task");
  if (!d)
    return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.' || atol(e->d_name) == self)
      continue;
    snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f)
      continue; /* the thread ended */
    while (fgets(line, sizeof line, f))
      if (!strncmp(line, "Cpus_allowed_list:", 18)) {
        char *v = line + 18;
        v += strspn(v, " \t");
        v[strcspn(v, "\n")] = '\0';
        n += !strcmp(v, want);
      }
    fclose(f);
  }
  closedir(d);
  return n;
}

static void pin_self(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  if (sched_setaffinity(0, sizeof one, &one) != 0) {
    perror("sched_setaffinity");
    exit(1);
  }
}

/* One iallreduce of 1000 floats from the calling thread, waited for; checks the (1-rank) sum. */
static void call(dt_comm *c, float v) {
  float x[1000];
  for (int i = 0; i < 1000; i++)
    x[i] = v + (float)i;
  dt_request *r = NULL;
  dt_status st = dt_comm_iallreduce(c, DT_IN_PLACE, x, 1000, DT_F32, DT_SUM, &r);
  CHECK(st == DT_OK, "iallreduce: %s", dt_last_error());
  if (st != DT_OK)
    return;
  CHECK(dt_request_wait(r) == DT_OK, "wait: %s", dt_last_error());
  CHECK(x[0] == v && x[999] == v + 999.0f, "sum of one rank changed the data: %g %g", x[0], x[999]);
}

int main(void) {
  cpu_set_t all;
  if (sched_getaffinity(0, sizeof all, &all) != 0) {
    perror("sched_getaffinity");
    return 1;
  }
  int a = -1, b = -1;
  for (int i = 0; i < CPU_SETSIZE; i++)
    if (CPU_ISSET(i, &all)) {
      if (a < 0)
        a = i;
      b = i;
    }
  fprintf(stderr, "%d CPU(s); A = %d, B = %d\n", CPU_COUNT(&all), a, b);

  dt_comm *c = NULL;
  if (dt_comm_create(NULL, &c) != DT_OK) {
    fprintf(stderr, "dt_comm_create: %s\n", dt_last_error());
    return 1;
  }
  call(c, 1.0f); /* starts the progress thread (whole mask) */
  pin_self(a);
  call(c, 2.0f);
  int on_a = threads_pinned_to(a);
  CHECK(on_a == 1, "after a call from CPU %d: %d other thread(s) pinned there, want 1 (the progress thread)", a, on_a);
  if (b != a) {
    pin_self(b);
    call(c, 3.0f);
    int on_b = threads_pinned_to(b);
    on_a = threads_pinned_to(a);
    CHECK(on_b == 1 && on_a == 0, "after a call from CPU %d: %d thread(s) on it, %d still on CPU %d", b, on_b, on_a, a);
  }
  dt_comm_destroy(c);

  /* DTRAIN_PROGRESS_FOLLOW=0: a new communicator's progress thread starts with the main
   * thread's mask (now {b}); from CPU a it must stay on b. */
  if (b != a) {
    setenv("DTRAIN_PROGRESS_FOLLOW", "0", 1);
    pin_self(b);
    if (dt_comm_create(NULL, &c) != DT_OK) {
      fprintf(stderr, "dt_comm_create: %s\n", dt_last_error());
      return 1;
    }
    call(c, 4.0f);
    pin_self(a);
    call(c, 5.0f);
    int on_a2 = threads_pinned_to(a);
    CHECK(on_a2 == 0, "DTRAIN_PROGRESS_FOLLOW=0: %d thread(s) followed the caller to CPU %d", on_a2, a);
    dt_comm_destroy(c);
  }
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("ok\n");
  return 0;
}
