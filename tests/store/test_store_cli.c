/* test_store_cli.c - `dtrain store` as a separate process: bad usage exits 2; a 3-rank job with
 * DTRAIN_HOST_STORE=0 rendezvous through it, runs an allreduce, leaves, and the store exits 0
 * on its own (--until-done); when a rank is SIGKILLed the store exits 1 naming it. */
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/wait.h>
#include <string.h>
#include <stdio.h>

#include <cmocka.h>

#include "comm/comm.h"
#include "dtrain/comm.h"
#include "store_util.h"

/* Starts `dtrain store ARGS...`; returns its pid, its stdout and stderr as fds. */
static pid_t start_store(const char *const *args, int *out_fd, int *err_fd) {
  const char *bin = getenv("DTRAIN_BIN");
  assert_non_null(bin);
  int o[2], e[2];
  assert_int_equal(pipe(o), 0);
  assert_int_equal(pipe(e), 0);
  fflush(NULL);
  pid_t p = fork();
  if (p == 0) {
    dup2(o[1], 1);
    dup2(e[1], 2);
    close(o[0]);
    close(e[0]);
    char *argv[16] = {(char *)bin, "store"};
    int n = 2;
    for (; args[n - 2] && n < 15; n++)
      argv[n] = (char *)args[n - 2];
    argv[n] = NULL;
    alarm(60);
    execv(bin, argv);
    _exit(127);
  }
  track_child(p, 1);
  close(o[1]);
  close(e[1]);
  *out_fd = o[0];
  *err_fd = e[0];
  return p;
}

/* Reads from fd until EOF or timeout into buf (NUL-terminated). */
static void read_all_text(int fd, char *buf, size_t cap, int timeout_ms) {
  size_t n = 0;
  int64_t dl = dt__deadline_after_ms(timeout_ms);
  while (n + 1 < cap) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, dt__ms_left(dl)) <= 0)
      break;
    ssize_t r = read(fd, buf + n, cap - 1 - n);
    if (r <= 0)
      break;
    n += (size_t)r;
  }
  buf[n] = '\0';
}

/* The port from the first stdout line "listening on ADDR:PORT". */
static int read_port(int fd) {
  char line[128];
  size_t n = 0;
  int64_t dl = dt__deadline_after_ms(10000);
  while (n + 1 < sizeof line) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&p, 1, dt__ms_left(dl)), 1);
    assert_int_equal(read(fd, line + n, 1), 1);
    if (line[n++] == '\n')
      break;
  }
  line[n] = '\0';
  const char *colon = strrchr(line, ':');
  assert_non_null(strstr(line, "listening on "));
  assert_non_null(colon);
  return atoi(colon + 1);
}

static void test_usage(void **unused) {
  const char *cases[][5] = {{NULL}, {"--world", "0", NULL}, {"--world", "2", "--port"}, {"--bogus", NULL},
                            {"--world", "2", "--bind", "999.1.1.1", NULL}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int o, e;
    pid_t p = start_store(cases[i], &o, &e);
    char err[2048];
    read_all_text(e, err, sizeof err, 10000);
    assert_int_equal(reap_child(p, 10), 2);
    assert_non_null(strstr(err, "HINT"));
    close(o);
    close(e);
  }
}

static int job_rank(int port, int rank, void *arg) {
  mp_set_env(rank, 3, port, "cli-store-job");
  setenv("DTRAIN_HOST_STORE", "0", 1);
  dt_comm *c;
  if (dt_comm_create(NULL, &c) != DT_OK) {
    fprintf(stderr, "rank %d: %s\n", rank, dt_last_error());
    return 10;
  }
  int64_t v = rank + 1;
  int rc = dt_comm_allreduce(c, DT_IN_PLACE, &v, 1, DT_I64, DT_SUM) != DT_OK || v != 6 ? 11 : 0;
  dt_comm_destroy(c);
  return rc;
}

/* A job of 2 ranks, each of which reports how its create ended. */
static int small_job_rank(int port, int rank, void *arg) {
  mp_set_env(rank, 2, port, "cli-store-small");
  setenv("DTRAIN_HOST_STORE", "0", 1);
  dt_comm *c;
  if (dt_comm_create(NULL, &c) != DT_OK)
    return strstr(dt_last_error(), "came with world size 2, but this job has 3") ? 20 : 21;
  dt_comm_destroy(c);
  return 0;
}

/* Ranks that heartbeat without saying their world size (older clients), then leave cleanly. */
static int quiet_rank(int port, int rank, void *arg) {
  dt__health *h;
  if (dt__health_start("127.0.0.1", port, (const uint8_t *)SECRET, SECRET_LEN, rank, 0, 1000, &h))
    return 10;
  dt__health_release(h);
  return 0;
}

/* `dtrain store --world 3 --until-done` and a job of 2: the ranks are refused at once and the
 * store exits naming both sizes; with ranks that do not say their size, it warns once they are
 * done and nobody else came for a fault timeout, and exits, instead of waiting forever. */
static void test_store_world_larger_than_job(void **unused) {
  setenv("DTRAIN_JOB_SECRET", SECRET, 1);
  const char *args[] = {"--world", "3", "--bind", "127.0.0.1", "--until-done", "--fault-timeout", "1000", NULL};
  for (int quiet = 0; quiet <= 1; quiet++) {
    int o, e;
    pid_t sp = start_store(args, &o, &e);
    int port = read_port(o);
    assert_true(port > 0);
    pid_t r[2];
    for (int i = 0; i < 2; i++)
      r[i] = spawn_child(quiet ? quiet_rank : small_job_rank, port, i, NULL, 30);
    for (int i = 0; i < 2; i++)
      assert_int_equal(reap_child(r[i], 30), quiet ? 0 : 20);
    char err[4096];
    read_all_text(e, err, sizeof err, 10000);
    assert_int_equal(reap_child(sp, 10), 1);
    if (quiet)
      assert_non_null(strstr(err, "2 of 3 rank(s) joined and left, and 1 never came within 1000 ms"));
    else
      assert_non_null(strstr(err, "came with world size 2, but this job has 3 ranks: every host needs the same -n"));
    close(o);
    close(e);
  }
}

static void test_job_through_store_process(void **unused) {
  setenv("DTRAIN_JOB_SECRET", SECRET, 1);
  const char *args[] = {"--world", "3", "--port", "0", "--bind", "127.0.0.1", "--until-done", NULL};
  int o, e;
  pid_t sp = start_store(args, &o, &e);
  int port = read_port(o);
  assert_true(port > 0);
  pid_t r[3];
  for (int i = 0; i < 3; i++)
    r[i] = spawn_child(job_rank, port, i, NULL, 60);
  for (int i = 0; i < 3; i++)
    assert_int_equal(reap_child(r[i], 60), 0);
  char err[4096];
  read_all_text(e, err, sizeof err, 20000);
  assert_int_equal(reap_child(sp, 20), 0);
  assert_null(strstr(err, "failed"));
  close(o);
  close(e);
}

static int hb_rank(int port, int rank, void *arg) {
  dt__health *h;
  if (dt__health_start("127.0.0.1", port, (const uint8_t *)SECRET, SECRET_LEN, rank, 0, 1000, &h))
    return 10;
  if (rank == 1)
    pause(); /* killed */
  struct pollfd p = {.fd = dt__health_abort_fd(h), .events = POLLIN};
  int rc = poll(&p, 1, 20000) == 1 ? 0 : 12;
  dt__health_release(h);
  return rc;
}

static void test_store_process_reports_failure(void **unused) {
  setenv("DTRAIN_JOB_SECRET", SECRET, 1);
  const char *args[] = {"--world", "2", "--bind", "127.0.0.1", "--until-done", "--fault-timeout", "1000", NULL};
  int o, e;
  pid_t sp = start_store(args, &o, &e);
  int port = read_port(o);
  pid_t r0 = spawn_child(hb_rank, port, 0, NULL, 60), r1 = spawn_child(hb_rank, port, 1, NULL, 60);
  usleep(500 * 1000); /* both heartbeating */
  kill(r1, SIGKILL);
  assert_int_equal(reap_child(r1, 10), 128 + SIGKILL);
  assert_int_equal(reap_child(r0, 30), 0);
  char err[4096];
  read_all_text(e, err, sizeof err, 20000);
  assert_int_equal(reap_child(sp, 20), 1);
  assert_non_null(strstr(err, "job failed: rank 1 failed: connection lost"));
  close(o);
  close(e);
}

/* A rank of a job whose store is `dtrain store`: after joining it says so (a file), then runs
 * allreduces until one fails, and checks that the failure names the store by its address and
 * does not blame rank 0, which never hosted it. */
static int lost_store_rank(int port, int rank, void *arg) {
  mp_set_env(rank, 2, port, "cli-store-lost");
  setenv("DTRAIN_HOST_STORE", "0", 1);
  setenv("DTRAIN_FAULT_TIMEOUT_MS", "1000", 1);
  dt_comm *c;
  if (dt_comm_create(NULL, &c) != DT_OK) {
    fprintf(stderr, "rank %d: %s\n", rank, dt_last_error());
    return 10;
  }
  char path[300];
  snprintf(path, sizeof path, "%s/ready-%d", (const char *)arg, rank);
  FILE *f = fopen(path, "w");
  if (f)
    fclose(f);
  dt_status st = DT_OK;
  for (int i = 0; i < 400 && st == DT_OK; i++) {
    int64_t v = 1;
    st = dt_comm_allreduce(c, DT_IN_PLACE, &v, 1, DT_I64, DT_SUM);
    usleep(50 * 1000);
  }
  char err[1024];
  snprintf(err, sizeof err, "%s", dt_last_error());
  dt_comm_destroy(c);
  if (st == DT_OK || !strstr(err, "the store at 127.0.0.1:") || !strstr(err, "not a rank of the job") ||
      strstr(err, "rank 0 (store host")) {
    fprintf(stderr, "rank %d: status %d, error '%s'\n", rank, st, err);
    return 13;
  }
  return 0;
}

static void test_store_process_lost(void **unused) {
  setenv("DTRAIN_JOB_SECRET", SECRET, 1);
  char dir[] = "/tmp/dtrain-store-lost-XXXXXX";
  assert_non_null(mkdtemp(dir));
  const char *args[] = {"--world", "2", "--port", "0", "--bind", "127.0.0.1", "--fault-timeout", "1000", NULL};
  int o, e;
  pid_t sp = start_store(args, &o, &e);
  int port = read_port(o);
  assert_true(port > 0);
  pid_t r[2];
  for (int i = 0; i < 2; i++)
    r[i] = spawn_child(lost_store_rank, port, i, dir, 60);
  char p0[300], p1[300];
  snprintf(p0, sizeof p0, "%s/ready-0", dir);
  snprintf(p1, sizeof p1, "%s/ready-1", dir);
  for (int t = 0; t < 2000 && (access(p0, F_OK) || access(p1, F_OK)); t++)
    usleep(10 * 1000);
  assert_int_equal(access(p0, F_OK) | access(p1, F_OK), 0);
  kill(sp, SIGKILL);
  reap_child(sp, 10);
  for (int i = 0; i < 2; i++)
    assert_int_equal(reap_child(r[i], 40), 0);
  unlink(p0);
  unlink(p1);
  rmdir(dir);
  close(o);
  close(e);
}

/* Runs `sh -c cmd` (cmd may use $BIN), stderr into err; returns the exit code. */
static int sh_run(const char *cmd, char *err, size_t cap) {
  char full[1024], path[] = "/tmp/dtrain-store-cli-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  snprintf(full, sizeof full, "BIN='%s'; { %s; } 2>%s", getenv("DTRAIN_BIN"), cmd, path);
  int st = system(full);
  FILE *f = fopen(path, "r");
  size_t n = f ? fread(err, 1, cap - 1, f) : 0;
  err[n] = '\0';
  if (f)
    fclose(f);
  unlink(path);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Its "listening on" line cannot be written (scripts read the port there): it ends at once with
 * exit 1 instead of serving a port nobody learns. A secret file that is a FIFO nobody writes is
 * refused at once (it blocked without a word). `timeout 20` would make either hang exit 124. */
static void test_store_unwritable_and_fifo(void **unused) {
  char err[4096];
  int rc = sh_run("DTRAIN_JOB_SECRET=abcdefabcdefabcdef timeout 20 \"$BIN\" store --world 2 > /dev/full", err,
                  sizeof err);
  if (rc != 1 || !strstr(err, "writing standard output: No space left on device"))
    fail_msg("stdout on /dev/full: exit %d: %s", rc, err);
  rc = sh_run("d=$(mktemp -d) && mkfifo \"$d/f\" && chmod 600 \"$d/f\" && unset DTRAIN_JOB_SECRET && DTRAIN_JOB_SECRET_FILE=\"$d/f\" "
              "timeout 20 \"$BIN\" store --world 2; r=$?; rm -rf \"$d\"; exit $r", err, sizeof err);
  if (rc != 1 || !strstr(err, "is empty"))
    fail_msg("secret FIFO without a writer: exit %d: %s", rc, err);
  /* ...and one whose writer (the shell, fd 3) stays silent: refused after 10 s, not waited on */
  rc = sh_run("d=$(mktemp -d) && mkfifo \"$d/f\" && chmod 600 \"$d/f\" && exec 3<>\"$d/f\" && unset DTRAIN_JOB_SECRET "
              "&& DTRAIN_JOB_SECRET_FILE=\"$d/f\" timeout 30 \"$BIN\" store --world 2; r=$?; rm -rf \"$d\"; exit $r",
              err, sizeof err);
  if (rc != 1 || !strstr(err, "nothing to read after 10 s"))
    fail_msg("secret FIFO with a silent writer: exit %d: %s", rc, err);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_usage, kill_leftovers),
      cmocka_unit_test_teardown(test_job_through_store_process, kill_leftovers),
      cmocka_unit_test_teardown(test_store_process_reports_failure, kill_leftovers),
      cmocka_unit_test_teardown(test_store_process_lost, kill_leftovers),
      cmocka_unit_test_teardown(test_store_world_larger_than_job, kill_leftovers),
      cmocka_unit_test_teardown(test_store_unwritable_and_fifo, kill_leftovers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
