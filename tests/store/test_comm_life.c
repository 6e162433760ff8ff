/* test_comm_life.c - a communicator's life in a job, in real processes over the real store:
 * create -> destroy -> create back to back, many times, on shm and tcp (the ranks leave and
 * come back at different moments, so one reaches the previous store while its host still
 * serves the others); a second process with a running rank's number is refused without
 * disturbing the job; an absurd world size is refused at once, and a job missing most of its
 * ranks says how many it did not name. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "dtrain/comm.h"
#include "store_util.h"

#define RECREATE_RANKS 3
#define RECREATE_ITERS 25

static int recreate_rank(int port, int rank, void *arg) {
  mp_set_env(rank, RECREATE_RANKS, port, (const char *)arg);
  for (int it = 0; it < RECREATE_ITERS; it++) {
    dt_comm *c;
    if (dt_comm_create(NULL, &c) != DT_OK) {
      fprintf(stderr, "rank %d: iteration %d: create: %s\n", rank, it, dt_last_error());
      return 10;
    }
    float x = (float)(rank + 1 + it);
    if (dt_comm_allreduce(c, DT_IN_PLACE, &x, 1, DT_F32, DT_SUM) != DT_OK) {
      fprintf(stderr, "rank %d: iteration %d: allreduce: %s\n", rank, it, dt_last_error());
      return 11;
    }
    if (x != (float)(6 + 3 * it)) { /* (1 + 2 + 3) + 3 * it */
      fprintf(stderr, "rank %d: iteration %d: allreduce gave %g\n", rank, it, x);
      return 12;
    }
    dt_comm_destroy(c);
  }
  return 0;
}

static void recreate(const char *transport) {
  setenv("DTRAIN_TRANSPORT", transport, 1);
  setenv("DTRAIN_TIMEOUT_MS", "15000", 1);
  int port = mp_free_port();
  char job[64];
  snprintf(job, sizeof job, "life-%s-%d", transport, (int)getpid());
  pid_t ranks[RECREATE_RANKS];
  for (int r = 0; r < RECREATE_RANKS; r++)
    ranks[r] = spawn_child(recreate_rank, port, r, job, 100);
  for (int r = 0; r < RECREATE_RANKS; r++)
    assert_int_equal(reap_child(ranks[r], 90), 0);
}

static void test_recreate_shm(void **unused) { recreate("shm"); }
static void test_recreate_tcp(void **unused) { recreate("tcp"); }

/* ---- a duplicate of a running rank ---- */

static char g_dir[64]; /* marker files: "formed" (rank 1 joined), "intruder-done" */

static bool wait_file(const char *name, int ms) {
  char p[128];
  snprintf(p, sizeof p, "%s/%s", g_dir, name);
  struct stat sb;
  for (int i = 0; i < ms / 10; i++, usleep(10000))
    if (stat(p, &sb) == 0)
      return true;
  return false;
}

static void touch(const char *name) {
  char p[128];
  snprintf(p, sizeof p, "%s/%s", g_dir, name);
  FILE *f = fopen(p, "w");
  if (f)
    fclose(f);
}

static int dup_rank(int port, int rank, void *arg) {
  mp_set_env(rank, 2, port, (const char *)arg);
  dt_comm *c;
  if (dt_comm_create(NULL, &c) != DT_OK) {
    fprintf(stderr, "rank %d: create: %s\n", rank, dt_last_error());
    return 10;
  }
  if (rank == 1)
    touch("formed");
  if (!wait_file("intruder-done", 30000))
    return 11;
  for (int it = 0; it < 50; it++) {
    float x = (float)(rank + it);
    if (dt_comm_allreduce(c, DT_IN_PLACE, &x, 1, DT_F32, DT_SUM) != DT_OK) {
      fprintf(stderr, "rank %d: allreduce %d after the intruder: %s\n", rank, it, dt_last_error());
      return 12;
    }
    if (x != (float)(1 + 2 * it))
      return 13;
  }
  dt_comm_destroy(c);
  return 0;
}

/* Rank 1 again, as a leftover or re-launched worker would be: same port, secret and rank. */
static int intruder(int port, int rank, void *arg) {
  mp_set_env(1, 2, port, (const char *)arg);
  dt_comm *c = NULL;
  dt_status st = dt_comm_create(NULL, &c);
  int rc = 0;
  if (st != DT_ERR_STATE || c || !strstr(dt_last_error(), "rank 1 is already in this job")) {
    fprintf(stderr, "intruder: status %d (%s): %s\n", st, dt_strerror(st), dt_last_error());
    rc = 20;
  }
  dt_comm_destroy(c);
  touch("intruder-done");
  return rc;
}

static void test_duplicate_rank(void **unused) {
  setenv("DTRAIN_TRANSPORT", "shm", 1);
  setenv("DTRAIN_TIMEOUT_MS", "20000", 1);
  snprintf(g_dir, sizeof g_dir, "/tmp/dt-life-XXXXXX");
  assert_non_null(mkdtemp(g_dir));
  int port = mp_free_port();
  char job[64];
  snprintf(job, sizeof job, "life-dup-%d", (int)getpid());
  pid_t ranks[2];
  for (int r = 0; r < 2; r++)
    ranks[r] = spawn_child(dup_rank, port, r, job, 100);
  assert_true(wait_file("formed", 30000));
  pid_t bad = spawn_child(intruder, port, 1, job, 60);
  assert_int_equal(reap_child(bad, 40), 0);
  for (int r = 0; r < 2; r++)
    assert_int_equal(reap_child(ranks[r], 60), 0);
  char p[128];
  snprintf(p, sizeof p, "%s/formed", g_dir);
  unlink(p);
  snprintf(p, sizeof p, "%s/intruder-done", g_dir);
  unlink(p);
  rmdir(g_dir);
}

/* ---- world size ---- */

static void test_world_size(void **unused) {
  unsetenv("DTRAIN_TRANSPORT");
  int port = mp_free_port();
  mp_set_env(0, 10000000, port, "life-huge");
  setenv("DTRAIN_TIMEOUT_MS", "1500", 1);
  dt_comm *c = NULL;
  int64_t t0 = dt_now_ns();
  assert_int_equal(dt_comm_create(NULL, &c), DT_ERR_INVALID);
  assert_true(dt_now_ns() - t0 < 1000000000LL);
  assert_non_null(strstr(dt_last_error(), "DTRAIN_WORLD_SIZE=10000000 is out of range 1..1048576"));

  /* A rank that never comes: rank 0 says whom it waits for while it waits (every second with
   * this short timeout), not only at the deadline. */
  mp_set_env(0, 2, port, "life-late");
  setenv("DTRAIN_TIMEOUT_MS", "2500", 1);
  char logp[64];
  snprintf(logp, sizeof logp, "/tmp/dtrain-life-log-%d", (int)getpid());
  fflush(stderr);
  int saved = dup(2), lf = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  assert_true(saved >= 0 && lf >= 0);
  dup2(lf, 2);
  dt_status late = dt_comm_create(NULL, &c);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(lf);
  assert_int_equal(late, DT_ERR_TIMEOUT);
  FILE *lg = fopen(logp, "r");
  assert_non_null(lg);
  char said[4096];
  size_t got = fread(said, 1, sizeof said - 1, lg);
  said[got] = '\0';
  fclose(lg);
  unlink(logp);
  if (!strstr(said, "rank 0: waiting for rank 1 to join (world of 2"))
    fail_msg("no word while waiting: %s", said);
  setenv("DTRAIN_TIMEOUT_MS", "1500", 1);

  /* The store's port already listened on (two hosts both told to host the store, say): the
   * error suggests why, not just "Address already in use". */
  {
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in la = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t ll = sizeof la;
    assert_int_equal(bind(lfd, (struct sockaddr *)&la, sizeof la), 0);
    assert_int_equal(listen(lfd, 4), 0);
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&la, &ll), 0);
    mp_set_env(0, 2, ntohs(la.sin_port), "life-busy");
    assert_int_not_equal(dt_comm_create(NULL, &c), DT_OK);
    char where[64];
    snprintf(where, sizeof where, "127.0.0.1:%d: Address already in use", ntohs(la.sin_port));
    /* the hint, the address whole, and the prefix once (the message was once formatted over itself) */
    if (!strstr(dt_last_error(), "same --node-rank") || !strstr(dt_last_error(), where) ||
        strstr(dt_last_error(), "store server: store server"))
      fail_msg("port in use: %s", dt_last_error());
    close(lfd);
  }

  /* 99 missing ranks: the message names some and counts the rest. */
  mp_set_env(0, 100, port, "life-missing");
  assert_int_equal(dt_comm_create(NULL, &c), DT_ERR_TIMEOUT);
  const char *m = dt_last_error();
  const char *more = strstr(m, " more");
  assert_non_null(strstr(m, "never joined: rank 1, rank 2"));
  assert_non_null(more);
  int named = 0;
  for (const char *q = m; (q = strstr(q, "rank ")) && q < more; q++)
    named++;
  const char *and = more;
  while (and > m && and[-1] != 'd')
    and--;
  /* "... rank K and M more": K names (the first "rank 0 waited" excluded) plus M is 99. */
  assert_int_equal(named - 1 + atoi(and + 1), 99);
}

int main(void) {
  setenv("DTRAIN_JOB_SECRET", SECRET, 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_recreate_shm, kill_leftovers),
      cmocka_unit_test_teardown(test_recreate_tcp, kill_leftovers),
      cmocka_unit_test_teardown(test_duplicate_rank, kill_leftovers),
      cmocka_unit_test(test_world_size),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
