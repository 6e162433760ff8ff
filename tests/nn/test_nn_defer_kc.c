/* test_nn_defer_kc.c - deferred linear weight gradients against summing the ranks' whole
 * gradients when a rank's batch is above the sgemm's K block (dt__nn_sgemm_kblock, 256 samples):
 * with two ranks of 300 samples each, dt_model_deferred_grad must give fl(g0 + g1) bit for bit
 * (rank 1's whole product rounded first, then added), as dt_optim_step_range_sum does, not
 * rank 1's product accumulated onto rank 0's one K block at a time (found by a QA pass:
 * `DTRAIN_DEFER=0|1 dtrain run -n 2 -- dtrain train --batch 514 --max-steps 1` differed). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dtrain/nn.h"

/* 256 inputs -> 64 -> 4: fc2 (W 4x64 at 0, b at 256) then fc1 (W 64x256 at 260, b at 16644) */
#define SPEC "in=1x16x16,linear:64,relu,linear:4"
#define B 300 /* above the sgemm's 256-sample K block */
#define NP 16708

static float input_at(int rank, size_t i) {
  uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(rank * 977u + 17u);
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  h ^= h >> 15;
  return (float)(h & 0xffff) / 65535.0f;
}

static void run(dt_model *m, int rank) {
  static float x[B * 256];
  int32_t y[B];
  for (size_t i = 0; i < (size_t)B * 256; i++)
    x[i] = input_at(rank, i);
  for (int r = 0; r < B; r++)
    y[r] = (r + rank) % 4;
  dt_model_discard_grad(m);
  assert_int_equal(dt_model_forward(m, x, B, 1, NULL), DT_OK);
  assert_int_equal(dt_model_backward(m, y, 0.5f, NULL, NULL, NULL), DT_OK);
}

static void test_defer_above_kc(void **st) {
  (void)st;
  dt_nn_set_threads(1);
  dt_model *m[2];
  float *ex[2], *g[2];
  for (int q = 0; q < 2; q++) {
    assert_int_equal(dt_model_create(SPEC, B, 5, &m[q]), DT_OK);
    if (q > 0)
      assert_int_equal(dt_model_share_params(m[q], dt_model_params(m[0])), DT_OK);
    assert_int_equal(dt_model_param_count(m[q]), NP);
    run(m[q], q); /* not deferred: whole gradients */
    g[q] = malloc(NP * sizeof(float));
    assert_non_null(g[q]);
    memcpy(g[q], dt_model_grads(m[q]), NP * sizeof(float));
    ex[q] = aligned_alloc(64, (dt_model_export_size(m[q], B) * sizeof(float) + 63) / 64 * 64);
    assert_non_null(ex[q]);
    assert_int_equal(dt_model_defer_linear_grads(m[q], ex[q], B), DT_OK);
    run(m[q], q); /* deferred: the export */
  }
  size_t mism = 0;
  static const size_t ranges[2][2] = {{0, 256}, {260, 16644}};
  for (int r = 0; r < 2; r++)
    for (size_t a = ranges[r][0]; a < ranges[r][1];) {
      float *d;
      size_t k = dt_model_deferred_grad(m[0], (const float *const *)ex, 2, a, ranges[r][1], &d);
      assert_non_null(d);
      assert_true(k > 0);
      for (size_t i = 0; i < k; i++) {
        float want = g[0][a + i] + g[1][a + i]; /* what dt_optim_step_range_sum adds */
        if (memcmp(&want, &d[i], sizeof want))
          mism++;
      }
      a += k;
    }
  if (mism)
    print_error("%zu of %d weight gradient floats differ from the sum of the ranks' gradients\n", mism,
                256 + 16384);
  assert_int_equal(mism, 0);
  for (int q = 1; q >= 0; q--) {
    dt_model_destroy(m[q]);
    free(ex[q]);
    free(g[q]);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_defer_above_kc)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
