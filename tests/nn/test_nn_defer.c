/* test_nn_defer.c - deferred linear weight gradients (dt_model_defer_linear_grads, the nn piece
 * of data parallel on shared memory) against summing every rank's whole gradients. Three
 * "ranks" in one process share one copy of the parameters (dt_model_share_params, as workers on
 * one host do); each runs forward and backward on its own samples (4, 3 and, on alternate
 * steps, 0 of them: a rank with an empty shard), and one sharded optimizer updates irregular
 * ranges (one float long, starting and ending mid-row, across a bias, over a whole layer) from
 * either dt_optim_step_range_sum over the ranks' gradients or dt_optim_step_range_deferred over
 * their exports. Both must end with the same parameters bit for bit, for SGD with momentum and
 * AdamW, with the deferred models' linear weight gradients poisoned with NaN before each backward
 * (so they are proven unread), on one and two compute threads (the long ranges are split across
 * them). Also: the stretches dt_model_deferred_grad reports, an empty
 * export's zero gradient, the errors (misaligned export, rows outside [1, max batch], a
 * backward larger than the export, the deferred update's), and ranks above the product's K
 * block. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dtrain/nn.h"

/* 256 inputs -> 64 -> 4: fc2 (W 4x64 at 0, b at 256) then fc1 (W 64x256 at 260, b at 16644) */
#define SPEC "in=1x16x16,linear:64,relu,linear:4"
#define NR 3
#define ROWS 4
#define STEPS 6

static float input_at(int step, int rank, size_t i) {
  uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(step * 40503u + (uint32_t)rank * 977u + 17u);
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  h ^= h >> 15;
  return (float)(h & 0xffff) / 65535.0f;
}

static int batch_of(int step, int rank) { return rank == 0 ? 4 : rank == 1 ? 3 : (step & 1) ? 0 : 2; }

typedef struct {
  dt_model *m[NR];
  float *ex[NR];
  dt_optim *o;
} side;

static const dt_param_range pieces[] = {{0, 1}, {1, 100}, {100, 255}, {255, 261}, {261, 300},
                                        {300, 8000}, {8000, 8001}, {8001, 16644}, {16644, 16708}};
#define NPIECES (sizeof pieces / sizeof pieces[0])

static void side_make(side *s, dt_optim_config cfg, int defer) {
  for (int q = 0; q < NR; q++) {
    assert_int_equal(dt_model_create(SPEC, ROWS, 5, &s->m[q]), DT_OK);
    if (q > 0)
      assert_int_equal(dt_model_share_params(s->m[q], dt_model_params(s->m[0])), DT_OK);
    s->ex[q] = NULL;
    if (defer) {
      s->ex[q] = aligned_alloc(64, (dt_model_export_size(s->m[q], ROWS) * sizeof(float) + 63) / 64 * 64);
      assert_non_null(s->ex[q]);
      assert_int_equal(dt_model_defer_linear_grads(s->m[q], s->ex[q], ROWS), DT_OK);
    }
  }
  assert_int_equal(dt_optim_create_ranges(&cfg, s->m[0], pieces, NPIECES, &s->o), DT_OK);
}

static void side_free(side *s) {
  dt_optim_destroy(s->o);
  for (int q = NR; q-- > 0;) {
    dt_model_destroy(s->m[q]);
    free(s->ex[q]);
  }
}

static void side_step(side *s, int step) {
  size_t in = dt_model_input_size(s->m[0]), n = dt_model_param_count(s->m[0]);
  float x[ROWS * 256];
  int32_t y[ROWS];
  for (int q = 0; q < NR; q++) {
    int b = batch_of(step, q);
    if (s->ex[q]) /* every weight gradient of the deferred models must stay unread */
      for (size_t i = 0; i < n; i++)
        dt_model_grads(s->m[q])[i] = NAN;
    if (b == 0) {
      dt_model_zero_grad(s->m[q]);
      dt_model_export_clear(s->m[q]);
      continue;
    }
    for (int r = 0; r < b; r++) {
      for (size_t i = 0; i < in; i++)
        x[(size_t)r * in + i] = input_at(step, q, (size_t)r * in + i);
      y[r] = (step + q + r) % 4;
    }
    dt_model_discard_grad(s->m[q]);
    assert_int_equal(dt_model_forward(s->m[q], x, b, 1, NULL), DT_OK);
    assert_int_equal(dt_model_backward(s->m[q], y, (float)b / 9.0f, NULL, NULL, NULL), DT_OK);
  }
  assert_int_equal(dt_optim_begin_step(s->o, 0.05f), DT_OK);
  for (size_t i = 0; i < NPIECES; i++) {
    const float *g[NR];
    for (int q = 0; q < NR; q++)
      g[q] = dt_model_grads(s->m[q]) + pieces[i].lo;
    dt_status rc = s->ex[0] ? dt_optim_step_range_deferred(s->o, i, g, (const float *const *)s->ex, NR, 0.5f)
                            : dt_optim_step_range_sum(s->o, i, g, NR, 0.5f);
    assert_int_equal(rc, DT_OK);
  }
}

static void compare(dt_optim_config cfg, int threads) {
  dt_nn_set_threads(threads);
  side a, b;
  side_make(&a, cfg, 0);
  side_make(&b, cfg, 1);
  size_t n = dt_model_param_count(a.m[0]);
  assert_int_equal(n, 16708);
  for (int step = 0; step < STEPS; step++) {
    side_step(&a, step);
    side_step(&b, step);
    assert_memory_equal(dt_model_params(a.m[0]), dt_model_params(b.m[0]), n * sizeof(float));
  }
  for (size_t k = 0; k < dt_optim_state_count(a.o); k++)
    assert_memory_equal(dt_optim_state(a.o, k, NULL), dt_optim_state(b.o, k, NULL),
                        dt_optim_state_size(a.o) * sizeof(float));
  side_free(&a);
  side_free(&b);
}

static void test_defer_sgd(void **st) {
  (void)st;
  dt_optim_config c = dt_optim_defaults(DT_OPTIM_SGD);
  c.momentum = 0.9f;
  c.weight_decay = 0.01f;
  compare(c, 1);
  compare(c, 2);
}

static void test_defer_adamw(void **st) {
  (void)st;
  compare(dt_optim_defaults(DT_OPTIM_ADAMW), 1);
  compare(dt_optim_defaults(DT_OPTIM_ADAMW), 2);
}

static void test_defer_stretches(void **st) {
  (void)st;
  dt_nn_set_threads(1);
  dt_model *m;
  assert_int_equal(dt_model_create(SPEC, ROWS, 5, &m), DT_OK);
  float *ex = aligned_alloc(64, (dt_model_export_size(m, ROWS) * sizeof(float) + 63) / 64 * 64);
  assert_non_null(ex);
  float *g;
  /* not deferred: the whole model is one plain stretch */
  assert_int_equal(dt_model_deferred_grad(m, (const float *const *)&ex, 1, 0, 16708, &g), 16708);
  assert_null(g);
  assert_int_equal(dt_model_defer_linear_grads(m, ex, ROWS), DT_OK);
  /* an empty export (nothing since dt_model_defer_linear_grads): zeros; fc2's weight, the rows
   * that cover [10, 200) */
  assert_int_equal(dt_model_deferred_grad(m, (const float *const *)&ex, 1, 10, 200, &g), 190);
  assert_non_null(g);
  for (int i = 0; i < 190; i++)
    assert_true(g[i] == 0.0f);
  /* fc2's bias up to fc1's weight, then fc1's weight (in tiles of whole rows) */
  assert_int_equal(dt_model_deferred_grad(m, (const float *const *)&ex, 1, 256, 16708, &g), 4);
  assert_null(g);
  assert_int_equal(dt_model_deferred_grad(m, (const float *const *)&ex, 1, 300, 16708, &g), 16644 - 300);
  assert_non_null(g);
  assert_int_equal(dt_model_deferred_grad(m, (const float *const *)&ex, 1, 16644, 16708, &g), 64);
  assert_null(g);
  assert_int_equal(dt_model_deferred_grad(m, (const float *const *)&ex, 1, 5, 5, &g), 0);
  /* the deferred update's own errors */
  {
    dt_param_range all = {0, 16708};
    dt_optim_config c = dt_optim_defaults(DT_OPTIM_SGD);
    dt_optim *o;
    assert_int_equal(dt_optim_create_ranges(&c, m, &all, 1, &o), DT_OK);
    const float *gs[1] = {dt_model_grads(m)}, *es[1] = {ex}, *none[1] = {NULL};
    assert_int_equal(dt_optim_step_range_deferred(o, 0, gs, es, 1, 1.0f), DT_ERR_STATE); /* no begin */
    assert_int_equal(dt_optim_begin_step(o, 0.1f), DT_OK);
    assert_int_equal(dt_optim_step_range_deferred(o, 1, gs, es, 1, 1.0f), DT_ERR_INVALID);
    assert_non_null(strstr(dt_last_error(), "range 1 of 1"));
    assert_int_equal(dt_optim_step_range_deferred(o, 0, gs, none, 1, 1.0f), DT_ERR_INVALID);
    assert_non_null(strstr(dt_last_error(), "export 0 of the sum is NULL"));
    assert_int_equal(dt_optim_step_range_deferred(o, 0, gs, NULL, 1, 1.0f), DT_ERR_INVALID);
    assert_int_equal(dt_optim_step_range_deferred(o, 0, gs, es, 0, 1.0f), DT_ERR_INVALID);
    assert_int_equal(dt_optim_step_range_deferred(o, 0, NULL, es, 1, 1.0f), DT_ERR_INVALID);
    dt_optim_destroy(o);
  }
  /* errors: nothing changes */
  assert_int_equal(dt_model_defer_linear_grads(m, ex + 1, ROWS), DT_ERR_INVALID);
  assert_int_equal(dt_model_defer_linear_grads(m, ex, 0), DT_ERR_INVALID);
  assert_int_equal(dt_model_defer_linear_grads(m, ex, ROWS + 1), DT_ERR_INVALID);
  assert_int_equal(dt_model_defer_linear_grads(m, ex, 2), DT_OK);
  float x[3 * 256] = {0};
  int32_t y[3] = {0, 1, 2};
  assert_int_equal(dt_model_forward(m, x, 3, 1, NULL), DT_OK);
  assert_int_equal(dt_model_backward(m, y, 1.0f, NULL, NULL, NULL), DT_ERR_INVALID);
  assert_non_null(strstr(dt_last_error(), "above the export's 2 rows"));
  /* off again: backward writes the weight gradients */
  assert_int_equal(dt_model_defer_linear_grads(m, NULL, 0), DT_OK);
  assert_int_equal(dt_model_forward(m, x, 3, 1, NULL), DT_OK);
  assert_int_equal(dt_model_backward(m, y, 1.0f, NULL, NULL, NULL), DT_OK);
  assert_int_equal(dt_model_deferred_grad(m, (const float *const *)&ex, 1, 0, 16708, &g), 16708);
  assert_null(g);
  dt_model_destroy(m);
  free(ex);
}

/* ---- above the product's K block ----
 * With two ranks of 300 samples each (above dt__nn_sgemm_kblock's 256), dt_model_deferred_grad
 * must still give fl(g0 + g1) bit for bit: rank 1's whole product rounded first, then added, as
 * dt_optim_step_range_sum does, not its product added onto rank 0's one K block at a time (found
 * by a QA pass: `DTRAIN_DEFER=0|1 dtrain run -n 2 -- dtrain train --batch 514` differed). */
#define KB 300

static void run_kb(dt_model *m, int rank) {
  static float x[KB * 256];
  int32_t y[KB];
  for (size_t i = 0; i < (size_t)KB * 256; i++)
    x[i] = input_at(0, rank, i);
  for (int r = 0; r < KB; r++)
    y[r] = (r + rank) % 4;
  dt_model_discard_grad(m);
  assert_int_equal(dt_model_forward(m, x, KB, 1, NULL), DT_OK);
  assert_int_equal(dt_model_backward(m, y, 0.5f, NULL, NULL, NULL), DT_OK);
}

static void test_defer_above_kc(void **st) {
  (void)st;
  dt_nn_set_threads(1);
  dt_model *m[2];
  float *ex[2], *g[2];
  for (int q = 0; q < 2; q++) {
    assert_int_equal(dt_model_create(SPEC, KB, 5, &m[q]), DT_OK);
    if (q > 0)
      assert_int_equal(dt_model_share_params(m[q], dt_model_params(m[0])), DT_OK);
    assert_int_equal(dt_model_param_count(m[q]), 16708);
    run_kb(m[q], q); /* not deferred: whole gradients */
    g[q] = malloc(16708 * sizeof(float));
    assert_non_null(g[q]);
    memcpy(g[q], dt_model_grads(m[q]), 16708 * sizeof(float));
    ex[q] = aligned_alloc(64, (dt_model_export_size(m[q], KB) * sizeof(float) + 63) / 64 * 64);
    assert_non_null(ex[q]);
    assert_int_equal(dt_model_defer_linear_grads(m[q], ex[q], KB), DT_OK);
    run_kb(m[q], q); /* deferred: the export */
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
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defer_sgd),
      cmocka_unit_test(test_defer_adamw),
      cmocka_unit_test(test_defer_stretches),
      cmocka_unit_test(test_defer_above_kc),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
