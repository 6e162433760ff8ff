/* test_ckpt_crash.c - a writer killed with SIGKILL in the middle of writing a large checkpoint
 * leaves the previous one loadable, and its temp file is cleaned by the next reader.
 * A child writes checkpoint 1 (small), then checkpoint 2 (64 MiB); the parent kills it once the
 * temp file of checkpoint 2 has grown past a threshold, at several thresholds. Waits are bounded
 * (polling at most 20 s per round). If writing were in place, the kill would leave a torn
 * ckpt-000000002.dtc and the load below would fail its checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "dtrain/ckpt.h"

static char tmpdir[256];

enum { BIG = 64 << 20 };

static void child(const char *dir, int ready_fd) {
  static uint32_t small[1024];
  float *big = malloc(BIG);
  if (!big)
    _exit(3);
  for (size_t i = 0; i < BIG / sizeof(float); i++)
    big[i] = (float)i;
  dt_ckpt_section s1 = {"params", small, sizeof small, 0};
  dt_kv m1 = {"step", "1"};
  if (dt_ckpt_save(dir, 1, &s1, 1, &m1, 1, 3, NULL, 0) != DT_OK)
    _exit(4);
  char c = 'r';
  if (write(ready_fd, &c, 1) != 1)
    _exit(5);
  dt_ckpt_section s2 = {"params", big, BIG, 0};
  dt_kv m2 = {"step", "2"};
  for (;;) /* keep rewriting checkpoint 2 until killed */
    if (dt_ckpt_save(dir, 2, &s2, 1, &m2, 1, 3, NULL, 0) != DT_OK)
      _exit(6);
}

/* Size of the child's temp file for checkpoint 2, or -1 if absent. */
static long long temp_size(const char *dir, pid_t pid) {
  char p[600];
  snprintf(p, sizeof p, "%s/.ckpt-000000002.dtc.tmp.%ld", dir, (long)pid);
  struct stat st;
  return stat(p, &st) == 0 ? (long long)st.st_size : -1;
}

static void test_kill_mid_write(void **st) {
  const long long thresholds[] = {1 << 20, 16 << 20, 48 << 20};
  int mid_write_kills = 0;
  for (size_t t = 0; t < sizeof thresholds / sizeof thresholds[0]; t++) {
    char dir[400];
    snprintf(dir, sizeof dir, "%s/run%zu", tmpdir, t);
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      close(pfd[0]);
      child(dir, pfd[1]);
    }
    close(pfd[1]);
    char c;
    assert_int_equal(read(pfd[0], &c, 1), 1); /* checkpoint 1 is durable */
    close(pfd[0]);
    long long sz = -1;
    for (int i = 0; i < 20000; i++) { /* <= 20 s */
      sz = temp_size(dir, pid);
      if (sz >= thresholds[t])
        break;
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    long long left = temp_size(dir, pid);
    if (left >= 0 && left < BIG)
      mid_write_kills++; /* killed with a partial temp file on disk */
    dt_ckpt *ck;
    assert_int_equal(dt_ckpt_open_latest(dir, &ck), DT_OK);
    /* Step 2 only if a full write of it had completed before the kill; then it must be whole. */
    uint64_t step = dt_ckpt_step(ck);
    assert_true(step == 1 || step == 2);
    const dt_ckpt_section *s = dt_ckpt_find(ck, "params");
    assert_non_null(s);
    assert_int_equal(s->nbytes, step == 1 ? 4096 : BIG);
    assert_string_equal(dt_ckpt_skipped(ck), "");
    dt_ckpt_destroy(ck);
    assert_int_equal(temp_size(dir, pid), -1); /* the dead writer's temp file was removed */
    print_message("threshold %lld: killed with temp file at %lld bytes, resumed step %llu\n",
                  thresholds[t], left, (unsigned long long)step);
  }
  assert_true(mid_write_kills >= 1);
}

static int setup(void **st) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/dt_test_crash_XXXXXX");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **st) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_kill_mid_write)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
