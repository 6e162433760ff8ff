/* test_shm_tune.c - the shm allreduce's choice between the single copy and the staging buffers
 * (src/comm/shm/tune.c), driven with made-up times per call, as shm.c drives it: the path a call
 * takes was chosen when the call before it started, and the call's time is recorded after it.
 * Every model charges the single copy's first call after the staging buffers SWITCH times its
 * time, as seen on the Zen 5 guest (bench/results/shm-tune-2026-12-05-zen5.txt); the staging
 * buffers' first call after the single copy costs what the others do.
 *   - staging twice as slow: it runs only in its timing runs, DT__SHM_TUNE_PROBE calls after the
 *     8th, 16th, 32nd, 64th, 128th, 256th and 512th call, never more in a row;
 *   - a slow start (both paths slow for the first 40 calls, the single copy then the faster):
 *     the class may take the staging buffers early but is back on the single copy by call 100
 *     and stays there (the old choice, which timed a run's first call, stayed on the staging
 *     buffers for good here: checked by hand with the first call timed);
 *   - staging the faster: the class takes it at its first timing and keeps it;
 *   - the host changes (the single copy 3x slower from call 300): the class moves to the
 *     staging buffers within a few calls, and back at the single copy's first timing (call 512)
 *     after it recovers at call 450;
 *   - a call now and then 200x slower (the process descheduled) does not move the class;
 *   - staging five times as slow (DT__SHM_TUNE_FAR): timed after calls 8, 32 and 256 (not 16, 64,
 *     128), then after 1536, 3072, 4608; and when it turns the faster after call 300, the class
 *     takes it at the next of those timings (1536).
 *
 * Usage: test_shm_tune */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "comm/shm/tune.h"

#define SWITCH 3.5
#define CALLS 1000
#define LONG 5000 /* the far-slower models: to past the third timing after the 512th call */

typedef double (*cost_fn)(int path, int call);

typedef struct {
  int path[LONG + 1]; /* the path of call 1..calls */
} trace;

static void drive_n(cost_fn cost, trace *tr, int calls) {
  dt__shm_tune u = {0};
  int cur = 0, prev = -1;
  for (int call = 1; call <= calls; call++) {
    int want = dt__shm_tune_next(&u, cur);
    double v = cost(cur, call) * (cur == 0 && prev == 1 ? SWITCH : 1.0);
    dt__shm_tune_record(&u, cur, v);
    tr->path[call] = cur;
    prev = cur;
    cur = want;
  }
}
static void drive(cost_fn cost, trace *tr) { drive_n(cost, tr, CALLS); }

static int count(const trace *tr, int path, int from, int to) {
  int k = 0;
  for (int c = from; c <= to; c++)
    k += tr->path[c] == path;
  return k;
}

static int longest_run(const trace *tr, int path, int from, int to) {
  int best = 0, run = 0;
  for (int c = from; c <= to; c++) {
    run = tr->path[c] == path ? run + 1 : 0;
    best = run > best ? run : best;
  }
  return best;
}

static double staging_slow(int path, int call) {
  (void)call;
  return path ? 200.0 : 100.0;
}
static double slow_start(int path, int call) {
  if (call < 40)
    return path ? 150.0 : 160.0;
  return path ? 120.0 : 70.0;
}
static double staging_fast(int path, int call) {
  (void)call;
  return path ? 50.0 : 100.0;
}
static double host_change(int path, int call) {
  if (path)
    return 120.0;
  return call >= 300 && call < 450 ? 210.0 : 70.0;
}
static double outliers(int path, int call) {
  double v = path ? 120.0 : 70.0;
  return call % 37 == 0 ? v * 200 : v;
}

static double staging_far(int path, int call) {
  (void)call;
  return path ? 500.0 : 100.0;
}
static double far_then_fast(int path, int call) {
  if (path)
    return call > 300 ? 50.0 : 500.0;
  return 100.0;
}

static trace tr;

static void test_fresh(void **state) {
  (void)state;
  dt__shm_tune fresh = {0};
  assert_int_equal(dt__shm_tune_next(&fresh, 0), 0);
  assert_true(dt__shm_tune_least(&fresh, 0) == 0.0 && dt__shm_tune_least(&fresh, 1) == 0.0);
}

static void test_staging_slow(void **state) {
  (void)state;
  drive(staging_slow, &tr);
  /* timing runs after calls 8, 16, 32, 64, 128, 256, 512 */
  assert_int_equal(count(&tr, 1, 1, CALLS), 7 * DT__SHM_TUNE_PROBE);
  assert_int_equal(longest_run(&tr, 1, 1, CALLS), DT__SHM_TUNE_PROBE);
  assert_int_equal(count(&tr, 1, 1, DT__SHM_TUNE_FIRST), 0);
  assert_int_equal(tr.path[CALLS], 0);
}

static void test_slow_start(void **state) {
  (void)state;
  drive(slow_start, &tr);
  assert_in_range(count(&tr, 1, 100, CALLS), 0, 3 * DT__SHM_TUNE_PROBE); /* the runs after 128, 256, 512 */
  assert_in_range(longest_run(&tr, 1, 100, CALLS), 0, DT__SHM_TUNE_PROBE);
}

static void test_staging_fast(void **state) {
  (void)state;
  drive(staging_fast, &tr);
  assert_in_range(count(&tr, 0, 20, CALLS), 0, 7 * (DT__SHM_TUNE_PROBE + 1));
  assert_in_range(longest_run(&tr, 0, 20, CALLS), 0, DT__SHM_TUNE_PROBE + 1);
  assert_int_equal(tr.path[CALLS], 1);
}

static void test_host_change(void **state) {
  (void)state;
  drive(host_change, &tr);
  assert_in_range(longest_run(&tr, 1, 100, 299), 0, DT__SHM_TUNE_PROBE);
  assert_in_range(count(&tr, 1, 306, 511), 511 - 306 + 1 - DT__SHM_TUNE_PROBE - 1, 511 - 306 + 1);
  /* back at the single copy's next timing, after call 512 */
  assert_int_equal(count(&tr, 0, 520, CALLS), CALLS - 520 + 1);
}

static void test_outliers(void **state) {
  (void)state;
  drive(outliers, &tr);
  assert_in_range(count(&tr, 0, 1, CALLS), CALLS - 10 * (DT__SHM_TUNE_PROBE + 1), CALLS);
}

/* The staging buffers' timing runs: the calls of path 1 that follow one of path 0. */
static int runs(const trace *tr, int from, int to) {
  int k = 0;
  for (int c = from; c <= to; c++)
    k += tr->path[c] == 1 && tr->path[c - 1] == 0;
  return k;
}

static void test_staging_far(void **state) {
  (void)state;
  drive_n(staging_far, &tr, LONG);
  /* runs after calls 8, 32 and 256 (16, 64, 128 skipped), then after 1536, 3072 and 4608 */
  assert_int_equal(count(&tr, 1, 1, LONG), 6 * DT__SHM_TUNE_PROBE);
  assert_int_equal(longest_run(&tr, 1, 1, LONG), DT__SHM_TUNE_PROBE);
  const int at[] = {10, 34, 258, 1538, 3074, 4610}; /* a run starts two calls after its point */
  for (int i = 0; i < 6; i++)
    for (int c = at[i]; c < at[i] + DT__SHM_TUNE_PROBE; c++)
      assert_int_equal(tr.path[c], 1);
  assert_int_equal(runs(&tr, 2, LONG), 6);
  assert_int_equal(tr.path[LONG], 0);
}

static void test_far_then_fast(void **state) {
  (void)state;
  drive_n(far_then_fast, &tr, LONG);
  /* on the single copy until the timing after call 1536 (the one after call 256 found staging far
   * slower, the second in a row, and skips two points, 512 and 1024), which finds it the faster;
   * there from then on but for the single copy's timing runs */
  assert_int_equal(count(&tr, 1, 262, 1537), 0);
  assert_in_range(count(&tr, 1, 1540, LONG), LONG - 1540 + 1 - 8 * (DT__SHM_TUNE_PROBE + 1), LONG - 1540 + 1);
  assert_int_equal(tr.path[LONG], 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fresh),        cmocka_unit_test(test_staging_slow), cmocka_unit_test(test_slow_start),
      cmocka_unit_test(test_staging_fast), cmocka_unit_test(test_host_change),  cmocka_unit_test(test_outliers),
      cmocka_unit_test(test_staging_far),  cmocka_unit_test(test_far_then_fast),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
