/* test_health.c - the failure detector with real processes: each child runs the heartbeat
 * thread (dt__health_*) against a store served by the parent. A child killed with SIGKILL, one
 * stopped with SIGSTOP, one leaving with a goodbye, one raising an abort, and the store host
 * itself dying or hanging (named as the rank hosting it only when one does): every survivor must learn the verdict (naming the rank) through its
 * abort eventfd within a bounded time, and a clean goodbye must produce no verdict at all.
 * Fault timeout 1000 ms throughout. */
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "comm/comm.h"
#include "store_util.h"

#define FAULT_MS 1000
#define WORLD 4

typedef struct scenario {
  int victim;         /* rank the parent will hurt */
  int action;         /* what the victim does */
  const char *expect; /* what survivors must see */
  dt_status expect_st;
} scenario;

enum { VICTIM_IDLE, VICTIM_GOODBYE, VICTIM_RAISE };

/* A child rank: start the heartbeat, say ready, then wait for a verdict (survivors) or act. */
static int child_rank(int port, int rank, void *arg) {
  scenario *sc = arg;
  dt__health *h;
  if (dt__health_start("127.0.0.1", port, (const uint8_t *)SECRET, SECRET_LEN, rank, 0, FAULT_MS, &h)) {
    fprintf(stderr, "rank %d: %s\n", rank, dt_last_error());
    return 10;
  }
  dt__store *c;
  if (connect_store(port, rank, &c))
    return 11;
  char key[32];
  snprintf(key, sizeof key, "ready/%d", rank);
  if (dt__store_set(c, key, "1", 1, dt__deadline_after_ms(5000)))
    return 12;
  if (rank == sc->victim) {
    if (sc->action == VICTIM_GOODBYE) {
      dt__health_release(h);
      dt__store_close(c);
      return 0;
    }
    if (sc->action == VICTIM_RAISE) {
      char buf[8];
      size_t n;
      dt__store_wait(c, "go", buf, sizeof buf, &n, dt__deadline_after_ms(10000));
      dt__health_raise(h, "rank 1: allreduce #3 with 7 x f32 sum: checksum mismatch");
      if (!dt__health_aborted(h))
        return 13;
      dt__health_release(h);
      dt__store_close(c);
      return 0;
    }
    pause(); /* killed or stopped by the parent */
    return 14;
  }
  /* Survivor: block on the abort fd, as a transport would. */
  struct pollfd p = {.fd = dt__health_abort_fd(h), .events = POLLIN};
  int r = poll(&p, 1, sc->expect ? 10000 : 3 * FAULT_MS);
  char verdict[1024];
  dt__health_verdict(h, verdict, sizeof verdict);
  int rc = 0;
  if (sc->expect) {
    if (r != 1 || !dt__health_aborted(h) || !strstr(verdict, sc->expect)) {
      fprintf(stderr, "rank %d: expected verdict '%s', got '%s' (poll %d)\n", rank, sc->expect, verdict, r);
      rc = 20;
    }
  } else if (r != 0 || dt__health_aborted(h) || verdict[0]) {
    fprintf(stderr, "rank %d: expected no verdict, got '%s'\n", rank, verdict);
    rc = 21;
  }
  /* Report when we learned it; the parent compares with when it hurt the victim. */
  char t[32];
  snprintf(t, sizeof t, "%lld", (long long)dt_now_ns());
  snprintf(key, sizeof key, "seen/%d", rank);
  dt__store_set(c, key, t, strlen(t), dt__deadline_after_ms(5000));
  dt__store_close(c);
  dt__health_release(h);
  return rc;
}

/* Runs WORLD-1 child ranks (1..WORLD-1) against a store in this process; rank 0 is the parent,
 * which watches through a plain store connection. `hurt` is applied to the victim once all are
 * ready. Returns the worst detection delay in ms. */
static int64_t run_scenario(scenario *sc, int hurt_signal) {
  int port = mp_free_port();
  pid_t pids[WORLD] = {0};
  for (int r = 1; r < WORLD; r++)
    pids[r] = spawn_child(child_rank, port, r, sc, 60);
  dt__store_server *s;
  assert_int_equal(dt__store_server_start("127.0.0.1", port, (const uint8_t *)SECRET, SECRET_LEN, WORLD, FAULT_MS, &s, NULL),
                   DT_OK);
  /* Rank 0 heartbeats like everyone else (threads only after the forks above). */
  dt__health *h0;
  assert_int_equal(dt__health_start("127.0.0.1", port, (const uint8_t *)SECRET, SECRET_LEN, 0, 0, FAULT_MS, &h0), DT_OK);
  dt__store *c;
  assert_int_equal(connect_store(port, 0, &c), DT_OK);
  char buf[64];
  size_t n;
  for (int r = 1; r < WORLD; r++) {
    char key[32];
    snprintf(key, sizeof key, "ready/%d", r);
    assert_int_equal(dt__store_wait(c, key, buf, sizeof buf, &n, dt__deadline_after_ms(20000)), DT_OK);
  }
  int64_t t_hurt = dt_now_ns();
  if (hurt_signal)
    kill(pids[sc->victim], hurt_signal);
  if (sc->action == VICTIM_RAISE)
    assert_int_equal(dt__store_set(c, "go", "1", 1, dt__deadline_after_ms(5000)), DT_OK);
  int64_t worst = 0;
  for (int r = 1; r < WORLD; r++) {
    if (r == sc->victim)
      continue;
    char key[32];
    snprintf(key, sizeof key, "seen/%d", r);
    assert_int_equal(dt__store_wait_flags(c, key, buf, sizeof buf - 1, &n, DT_STORE_WAIT_IGNORE_VERDICT,
                                          dt__deadline_after_ms(20000)),
                     DT_OK);
    buf[n] = '\0';
    int64_t d = (strtoll(buf, NULL, 10) - t_hurt) / 1000000;
    worst = DT_MAX(worst, d);
    assert_int_equal(reap_child(pids[r], 20), 0);
  }
  /* The store answers the same verdict (or none) to a wait for a key nobody sets. (Not a
   * heartbeat on this second connection: the store refuses a second heartbeat of a live rank.) */
  dt_status st = dt__store_wait(c, "never-set", buf, sizeof buf, &n, dt__deadline_after_ms(300));
  if (sc->expect) {
    assert_int_equal(st, sc->expect_st);
    assert_non_null(strstr(dt_last_error(), sc->expect));
  } else {
    assert_int_equal(st, DT_ERR_TIMEOUT);
    assert_false(dt__health_aborted(h0));
  }
  if (sc->expect) {
    /* Rank 0's own heartbeat thread learns it at its next beat. */
    struct pollfd p = {.fd = dt__health_abort_fd(h0), .events = POLLIN};
    assert_int_equal(poll(&p, 1, 5000), 1);
    char v[1024];
    dt__health_verdict(h0, v, sizeof v);
    assert_non_null(strstr(v, sc->expect));
  }
  /* That heartbeat made this connection rank 0's: leave cleanly so closing it is no failure. */
  assert_int_equal(dt__store_goodbye(c, dt__deadline_after_ms(5000)), DT_OK);
  dt__health_release(h0);
  if (!sc->expect)
    assert_int_equal(dt__store_server_drain(s, dt__deadline_after_ms(5000)), 0);
  if (hurt_signal == SIGSTOP)
    kill(pids[sc->victim], SIGKILL);
  int vcode = reap_child(pids[sc->victim], 20);
  if (!hurt_signal)
    assert_int_equal(vcode, 0);
  dt__store_close(c);
  dt__store_server_stop(s);
  if (sc->expect)
    fprintf(stderr, "victim rank %d: every survivor saw '%s' within %lld ms\n", sc->victim, sc->expect, (long long)worst);
  else
    fprintf(stderr, "victim rank %d: no verdict after %lld ms of watching\n", sc->victim, (long long)worst);
  return worst;
}

static void test_sigkill(void **unused) {
  scenario sc = {.victim = 3, .action = VICTIM_IDLE, .expect = "rank 3 failed: connection lost", .expect_st = DT_ERR_PEER};
  int64_t d = run_scenario(&sc, SIGKILL);
  /* The connection closes at once; the bound is loose for a loaded 2-core machine. */
  assert_true(d < 2000);
}

static void test_sigstop(void **unused) {
  scenario sc = {.victim = 2, .action = VICTIM_IDLE, .expect = "rank 2 failed: no heartbeat for 1000 ms",
                 .expect_st = DT_ERR_PEER};
  int64_t d = run_scenario(&sc, SIGSTOP);
  assert_true(d >= FAULT_MS - 250); /* not before the fault timeout (minus one heartbeat interval) */
  assert_true(d < FAULT_MS + 2000);
}

static void test_goodbye(void **unused) {
  scenario sc = {.victim = 1, .action = VICTIM_GOODBYE, .expect = NULL};
  run_scenario(&sc, 0);
}

static void test_abort(void **unused) {
  scenario sc = {.victim = 1, .action = VICTIM_RAISE, .expect = "rank 1: allreduce #3 with 7 x f32 sum: checksum mismatch",
                 .expect_st = DT_ERR_ABORTED};
  int64_t d = run_scenario(&sc, 0);
  assert_true(d < 2000);
}

/* ---- the store host itself fails ---- */

static int child_store_host(int port, int idx, void *arg) {
  dt__store_server *s;
  if (dt__store_server_start("127.0.0.1", port, (const uint8_t *)SECRET, SECRET_LEN, 2, FAULT_MS, &s, NULL))
    return 10;
  pause();
  return 0;
}

/* set_rank: what comm.c would tell the detector about who hosts the store (-3: nothing). The
 * verdict must contain expect and must not contain forbid (a rank blamed for a store it does
 * not host). */
static void store_host_fails(int sig, int set_rank, const char *expect, const char *forbid) {
  int port = mp_free_port();
  pid_t host = spawn_child(child_store_host, port, 0, NULL, 60);
  dt__health *h;
  assert_int_equal(dt__health_start("127.0.0.1", port, (const uint8_t *)SECRET, SECRET_LEN, 1, 0, FAULT_MS, &h), DT_OK);
  assert_false(dt__health_aborted(h));
  if (set_rank > -3)
    dt__health_set_store_rank(h, set_rank);
  int64_t t0 = dt_now_ns();
  kill(host, sig);
  struct pollfd p = {.fd = dt__health_abort_fd(h), .events = POLLIN};
  assert_int_equal(poll(&p, 1, 10000), 1);
  int64_t d = (dt_now_ns() - t0) / 1000000;
  char v[1024];
  dt__health_verdict(h, v, sizeof v);
  fprintf(stderr, "store host %s: '%s' after %lld ms\n", sig == SIGKILL ? "killed" : "stopped", v, (long long)d);
  assert_non_null(strstr(v, expect));
  if (forbid && strstr(v, forbid))
    fail_msg("verdict '%s' contains '%s'", v, forbid);
  assert_true(d < FAULT_MS + 2000);
  /* Release must not hang on a dead or frozen store. */
  int64_t t1 = dt_now_ns();
  dt__health_release(h);
  assert_true(dt_now_ns() - t1 < 3000 * 1000000LL);
  if (sig == SIGSTOP)
    kill(host, SIGKILL);
  reap_child(host, 10);
}

/* The store runs in its own process here, as with `dtrain store`: comm.c says so (outside), and
 * the verdict names the store's address, not rank 0. */
static void test_store_outside_killed(void **unused) {
  store_host_fails(SIGKILL, DT_HEALTH_STORE_OUTSIDE,
                   "the store at 127.0.0.1:", "rank 0");
}
static void test_store_outside_stopped(void **unused) {
  store_host_fails(SIGSTOP, DT_HEALTH_STORE_OUTSIDE, "(its own process, not a rank of the job) unreachable: no answer for 1000 ms",
                   "rank 0");
}
/* Before comm.c knows (the store lost while joining): the address only. */
static void test_store_unknown_killed(void **unused) {
  store_host_fails(SIGKILL, -3, "the store at 127.0.0.1:", "rank");
}
/* A rank hosts it (rank 2 here, as with DTRAIN_HOST_STORE=1 on rank 2): that rank is named, in
 * the form launchers blame a rank by. */
static void test_store_host_rank_killed(void **unused) {
  store_host_fails(SIGKILL, 2, "rank 2 (store host 127.0.0.1:", "rank 0");
}

/* A wait for a key that a failed rank would have set returns the verdict instead of hanging. */
static int child_dies(int port, int rank, void *arg) {
  dt__health *h;
  if (dt__health_start("127.0.0.1", port, (const uint8_t *)SECRET, SECRET_LEN, rank, 0, FAULT_MS, &h))
    return 10;
  _exit(0); /* no goodbye: a crash */
}

static void test_wait_gets_verdict(void **unused) {
  int port = mp_free_port();
  pid_t pid = spawn_child(child_dies, port, 1, NULL, 30);
  dt__store_server *s;
  assert_int_equal(dt__store_server_start("127.0.0.1", port, (const uint8_t *)SECRET, SECRET_LEN, 2, FAULT_MS, &s, NULL),
                   DT_OK);
  dt__store *c;
  assert_int_equal(connect_store(port, 0, &c), DT_OK);
  char buf[8];
  size_t n;
  assert_int_equal(dt__store_wait(c, "addr/1", buf, sizeof buf, &n, dt__deadline_after_ms(15000)), DT_ERR_PEER);
  assert_non_null(strstr(dt_last_error(), "rank 1 failed"));
  reap_child(pid, 10);
  /* Every rank that ever heartbeated is gone: drain returns at once. */
  assert_int_equal(dt__store_server_drain(s, dt__deadline_after_ms(1000)), 0);
  dt__store_close(c);
  dt__store_server_stop(s);
}

/* The store's host stops right after a verdict (its launcher stops the hosting rank on seeing
 * it), before the other ranks' next heartbeat: they must still learn that verdict, not blame the
 * store host. The verdict is pushed on each heartbeat connection and read after the store left. */
static void test_verdict_outlives_store(void **unused) {
  int port;
  dt__store_server *s;
  assert_int_equal(dt__store_server_start("127.0.0.1", 0, (const uint8_t *)SECRET, SECRET_LEN, 3, FAULT_MS, &s, &port),
                   DT_OK);
  dt__health *h; /* rank 1, a heartbeat thread as in every worker */
  assert_int_equal(dt__health_start("127.0.0.1", port, (const uint8_t *)SECRET, SECRET_LEN, 1, 0, FAULT_MS, &h), DT_OK);
  dt__health_set_store_rank(h, 0);
  dt__store *c0, *c2; /* rank 0 (the store's host) and rank 2, heartbeating by hand */
  int64_t dl = dt__deadline_after_ms(5000);
  assert_int_equal(connect_store(port, 0, &c0), DT_OK);
  assert_int_equal(connect_store(port, 2, &c2), DT_OK);
  assert_int_equal(dt__store_heartbeat(c0, dl), DT_OK);
  assert_int_equal(dt__store_heartbeat(c2, dl), DT_OK);
  dt__store_close(c2); /* rank 2 dies */
  char v[512];
  while (dt__store_server_status(s, NULL, NULL, v, sizeof v) == DT_OK && !dt__expired(dl))
    dt__sleep_ns(1000000);
  assert_non_null(strstr(v, "rank 2 failed"));
  dt__sleep_ns(5000000); /* the push is on its way; no heartbeat of rank 1 came in between (200 ms apart) */
  dt__store_server_stop(s);
  assert_int_equal(dt__store_heartbeat(c0, dt__deadline_after_ms(2000)), DT_ERR_PEER);
  assert_non_null(strstr(dt_last_error(), "rank 2 failed"));
  while (!dt__health_aborted(h) && !dt__expired(dl))
    dt__sleep_ns(5000000);
  dt__health_verdict(h, v, sizeof v);
  assert_non_null(strstr(v, "rank 2 failed"));
  assert_null(strstr(v, "store host"));
  dt__store_close(c0);
  dt__health_release(h);
}

/* Hosts started with different -n or --nnodes: the store refuses the rank of the other shape
 * and ends the job at once with a verdict naming both sizes, for the ranks already waiting. */
static void test_world_mismatch_aborts(void **unused) {
  for (int wrong_rank = 1; wrong_rank <= 2; wrong_rank++) {
    int port;
    dt__store_server *s;
    assert_int_equal(dt__store_server_start("127.0.0.1", 0, (const uint8_t *)SECRET, SECRET_LEN, 2, 10000, &s, &port),
                     DT_OK);
    dt__health *h;
    assert_int_equal(dt__health_start("127.0.0.1", port, (const uint8_t *)SECRET, SECRET_LEN, 0, 2, 10000, &h), DT_OK);
    dt__store *c0, *bad;
    assert_int_equal(connect_store(port, 0, &c0), DT_OK);
    assert_int_equal(connect_store(port, wrong_rank, &bad), DT_OK);
    dt__store_set_world(bad, wrong_rank + 2); /* rank 1 of 3 (--nnodes), or rank 2 of 4 (-n) */
    int64_t t0 = dt_now_ns();
    assert_int_equal(dt__store_heartbeat(bad, dt__deadline_after_ms(5000)), DT_ERR_INVALID);
    char expect[64];
    snprintf(expect, sizeof expect, "rank %d came with world size %d, but this job has 2", wrong_rank, wrong_rank + 2);
    assert_non_null(strstr(dt_last_error(), expect));
    assert_non_null(strstr(dt_last_error(), "-n and --nnodes"));
    char buf[8], v[512];
    size_t n;
    assert_int_equal(dt__store_wait(c0, "addr/1", buf, sizeof buf, &n, dt__deadline_after_ms(5000)), DT_ERR_ABORTED);
    assert_non_null(strstr(dt_last_error(), expect));
    while (!dt__health_aborted(h) && dt_now_ns() - t0 < 3000000000LL)
      dt__sleep_ns(5000000);
    dt__health_verdict(h, v, sizeof v);
    assert_non_null(strstr(v, expect));
    assert_true(dt_now_ns() - t0 < 3000000000LL);
    dt__store_close(bad);
    dt__store_close(c0);
    dt__health_release(h);
    dt__store_server_stop(s);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_sigkill, kill_leftovers),           cmocka_unit_test_teardown(test_sigstop, kill_leftovers),
      cmocka_unit_test_teardown(test_goodbye, kill_leftovers),           cmocka_unit_test_teardown(test_abort, kill_leftovers),
      cmocka_unit_test_teardown(test_store_outside_killed, kill_leftovers),
      cmocka_unit_test_teardown(test_store_outside_stopped, kill_leftovers),
      cmocka_unit_test_teardown(test_store_unknown_killed, kill_leftovers),
      cmocka_unit_test_teardown(test_store_host_rank_killed, kill_leftovers),
      cmocka_unit_test_teardown(test_wait_gets_verdict, kill_leftovers),
      cmocka_unit_test_teardown(test_verdict_outlives_store, kill_leftovers),
      cmocka_unit_test_teardown(test_world_mismatch_aborts, kill_leftovers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
