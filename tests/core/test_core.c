/* test_core.c - status text, error detail, env parsing, CRC32C against known vectors, RNG. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/core.h"

static void test_status(void **s) {
  (void)s;
  assert_string_equal(dt_strerror(DT_OK), "ok");
  assert_string_equal(dt_strerror(DT_ERR_TIMEOUT), "deadline exceeded");
  assert_string_equal(dt_strerror((dt_status)999), "unknown status");
  assert_int_equal(dt_set_error(DT_ERR_INVALID, "rank %d: count %d", 3, 7), DT_ERR_INVALID);
  assert_string_equal(dt_last_error(), "rank 3: count 7");
  dt__error_prefix(DT_ERR_INVALID, "allreduce");
  assert_string_equal(dt_last_error(), "allreduce: rank 3: count 7");
  dt_clear_error();
  assert_string_equal(dt_last_error(), "");
}

static void test_sizes(void **s) {
  (void)s;
  uint64_t v;
  assert_int_equal(dt__parse_size("8", &v), DT_OK);
  assert_int_equal(v, 8);
  assert_int_equal(dt__parse_size("256M", &v), DT_OK);
  assert_int_equal(v, 256ull << 20);
  assert_int_equal(dt__parse_size("4KiB", &v), DT_OK);
  assert_int_equal(v, 4096);
  assert_int_equal(dt__parse_size("4X", &v), DT_ERR_INVALID);
  assert_int_equal(dt__parse_size("-1", &v), DT_ERR_INVALID);
  assert_int_equal(dt__parse_size("", &v), DT_ERR_INVALID);
  setenv("DT_TEST_INT", "12x", 1);
  int64_t i;
  assert_int_equal(dt__env_int("DT_TEST_INT", 5, &i), DT_ERR_INVALID);
  assert_non_null(strstr(dt_last_error(), "DT_TEST_INT=12x"));
  unsetenv("DT_TEST_INT");
  assert_int_equal(dt__env_int("DT_TEST_INT", 5, &i), DT_OK);
  assert_int_equal(i, 5);
}

static void test_crc32c(void **s) {
  (void)s;
  /* Check value of CRC-32C for "123456789" (RFC 3720 appendix / the catalogue of CRCs). */
  assert_int_equal(dt_crc32c(0, "123456789", 9), 0xE3069283u);
  /* 32 bytes of zeros: RFC 3720 B.4 */
  unsigned char z[32] = {0};
  assert_int_equal(dt_crc32c(0, z, 32), 0x8A9136AAu);
  /* Incremental equals one-shot. */
  const char *msg = "the quick brown fox jumps over the lazy dog";
  uint32_t a = dt_crc32c(0, msg, strlen(msg));
  uint32_t b = dt_crc32c(dt_crc32c(0, msg, 10), msg + 10, strlen(msg) - 10);
  assert_int_equal(a, b);
}

static void test_rng(void **s) {
  (void)s;
  dt_rng a, b;
  dt_rng_seed(&a, 42);
  dt_rng_seed(&b, 42);
  for (int i = 0; i < 100; i++)
    assert_int_equal(dt_rng_next(&a), dt_rng_next(&b));
  double sum = 0, sq = 0;
  for (int i = 0; i < 100000; i++) {
    double x = dt_rng_normal(&a);
    sum += x;
    sq += x * x;
  }
  assert_true(sum / 100000 < 0.02 && sum / 100000 > -0.02);
  assert_true(sq / 100000 > 0.97 && sq / 100000 < 1.03);
  for (int i = 0; i < 1000; i++)
    assert_true(dt_rng_below(&a, 7) < 7);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_status), cmocka_unit_test(test_sizes),
      cmocka_unit_test(test_crc32c), cmocka_unit_test(test_rng),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
