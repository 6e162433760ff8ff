/* test_nn_optim_ranges.c - the sharded optimizer (dt_optim_create_ranges, ZeRO-1's nn piece)
 * against the full one: several "ranks" each own some ranges of the same model, update them
 * from gradients given either in place or from a separate buffer, and together must end with
 * exactly (bit for bit) the parameters and state of one dt_optim_create optimizer, for SGD with
 * momentum (plain and Nesterov, with weight decay) and AdamW, on one and on two compute
 * threads (the second range is long enough to be split across them); one rank passes each
 * gradient as a scaled sum of three arrays (dt_optim_step_range_sum). Also: bad ranges, the
 * step protocol, state sizes and offsets, dt_model_grad_segments against the ranges the hook
 * really reports, and clipping split into dt_grad_sumsq (or dt_grad_sumsq_of_sum) +
 * dt_clip_factor. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dtrain/nn.h"

/* 256 inputs -> 64 -> 4: fc2 (4x64 + 4 = 260 floats) then fc1 (256x64 + 64 = 16448) */
#define SPEC "in=1x16x16,linear:64,relu,linear:4"
#define STEPS 7

static float hash_at(int step, size_t i) {
  uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(step * 40503u + 17u);
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  h ^= h >> 15;
  return ((float)(h & 0xffff) / 65535.0f - 0.5f) * 0.2f;
}

/* A step's gradient is the sum of three parts, scaled, as dt_optim_step_range_sum computes it. */
#define SUM_SCALE 0.75f
static float part_at(int step, size_t i, int k) { return hash_at(step * 3 + k, i); }
static float grad_at(int step, size_t i) {
  float g = part_at(step, i, 0);
  g += part_at(step, i, 1);
  g += part_at(step, i, 2);
  return g * SUM_SCALE;
}

/* The shards of NRANKS ranks: every rank owns a few ranges (some one float long, some long),
 * and together they cover [0, n) once. */
#define NRANKS 3
static size_t shard_ranges(size_t n, int rank, dt_param_range *out) {
  /* cut points: irregular on purpose; rank k owns pieces k, k+3, k+6, ... */
  size_t cuts[] = {0, 1, 17, 130, 259, 260, 261, 5000, 12000, 12001, n};
  size_t k = 0;
  for (size_t p = (size_t)rank; p + 1 < sizeof cuts / sizeof cuts[0]; p += NRANKS)
    out[k++] = (dt_param_range){cuts[p], cuts[p + 1]};
  return k;
}

static void compare_sharded(dt_optim_config cfg, int threads) {
  dt_nn_set_threads(threads);
  dt_model *full, *sh;
  assert_int_equal(dt_model_create(SPEC, 4, 7, &full), DT_OK);
  assert_int_equal(dt_model_create(SPEC, 4, 7, &sh), DT_OK);
  assert_int_equal(dt_model_threads(full), threads);
  size_t n = dt_model_param_count(full);
  assert_int_equal(n, 260 + 16448);
  assert_memory_equal(dt_model_params(full), dt_model_params(sh), n * sizeof(float));
  dt_optim *of, *os[NRANKS];
  assert_int_equal(dt_optim_create(&cfg, full, &of), DT_OK);
  assert_int_equal(dt_optim_state_size(of), n);
  assert_int_equal(dt_optim_range_count(of), 1);
  dt_param_range rr[NRANKS][8];
  size_t nr[NRANKS], total = 0;
  for (int r = 0; r < NRANKS; r++) {
    nr[r] = shard_ranges(n, r, rr[r]);
    assert_int_equal(dt_optim_create_ranges(&cfg, sh, rr[r], nr[r], &os[r]), DT_OK);
    size_t own = 0;
    for (size_t i = 0; i < nr[r]; i++) {
      assert_int_equal(dt_optim_state_offset(os[r], i), own);
      own += rr[r][i].hi - rr[r][i].lo;
    }
    assert_int_equal(dt_optim_state_size(os[r]), own);
    assert_int_equal(dt_optim_state_offset(os[r], nr[r]), own);
    total += own;
  }
  assert_int_equal(total, n); /* state saved: each rank holds only its share */
  float *packed = malloc(n * sizeof(float)), *parts = malloc(3 * n * sizeof(float));
  for (int s = 0; s < STEPS; s++) {
    float lr = 0.05f + 0.01f * (float)s;
    float *gf = dt_model_grads(full), *gs = dt_model_grads(sh);
    for (size_t i = 0; i < n; i++)
      gf[i] = gs[i] = grad_at(s, i);
    assert_int_equal(dt_optim_step(of, lr), DT_OK);
    for (int r = 0; r < NRANKS; r++) {
      assert_int_equal(dt_optim_begin_step(os[r], lr), DT_OK);
      /* odd ranks pass their gradients from a separate buffer, updating ranges last-first;
       * rank 1 on odd steps as the sum of the three parts (its 7000-float range in chunks,
       * split across the threads) */
      for (size_t k = 0; k < nr[r]; k++) {
        size_t i = (r & 1) ? nr[r] - 1 - k : k;
        if (r == 1 && (s & 1)) {
          const float *srcs[3];
          for (int q = 0; q < 3; q++) {
            srcs[q] = parts + (size_t)q * n;
            for (size_t j = rr[r][i].lo; j < rr[r][i].hi; j++)
              parts[(size_t)q * n + j - rr[r][i].lo] = part_at(s, j, q);
          }
          memset(gs + rr[r][i].lo, 0xff, (rr[r][i].hi - rr[r][i].lo) * sizeof(float)); /* NaN */
          assert_int_equal(dt_optim_step_range_sum(os[r], i, srcs, 3, SUM_SCALE), DT_OK);
          continue;
        }
        const float *g = NULL;
        if (r & 1) {
          for (size_t j = rr[r][i].lo; j < rr[r][i].hi; j++)
            packed[j - rr[r][i].lo] = grad_at(s, j);
          memset(gs + rr[r][i].lo, 0xff, (rr[r][i].hi - rr[r][i].lo) * sizeof(float)); /* NaN */
          g = packed;
        }
        assert_int_equal(dt_optim_step_range(os[r], i, g), DT_OK);
      }
    }
  }
  assert_memory_equal(dt_model_params(full), dt_model_params(sh), n * sizeof(float));
  for (int r = 0; r < NRANKS; r++) {
    assert_int_equal(dt_optim_step_count(os[r]), STEPS);
    assert_int_equal(dt_optim_state_count(os[r]), dt_optim_state_count(of));
    for (size_t st = 0; st < dt_optim_state_count(of); st++) {
      const char *nf, *ns;
      float *sf = dt_optim_state(of, st, &nf), *ss = dt_optim_state(os[r], st, &ns);
      assert_string_equal(nf, ns);
      for (size_t i = 0; i < nr[r]; i++)
        assert_memory_equal(sf + rr[r][i].lo, ss + dt_optim_state_offset(os[r], i),
                            (rr[r][i].hi - rr[r][i].lo) * sizeof(float));
    }
    dt_optim_destroy(os[r]);
  }
  free(packed);
  free(parts);
  dt_optim_destroy(of);
  dt_model_destroy(full);
  dt_model_destroy(sh);
  dt_nn_set_threads(1);
}

static void test_sharded_sgd(void **s) {
  dt_optim_config c = dt_optim_defaults(DT_OPTIM_SGD);
  c.momentum = 0.9f;
  c.weight_decay = 0.01f;
  compare_sharded(c, 1);
  compare_sharded(c, 2);
  c.nesterov = 1;
  compare_sharded(c, 2);
  compare_sharded(dt_optim_defaults(DT_OPTIM_SGD), 1); /* no state at all */
}

static void test_sharded_adamw(void **s) {
  dt_optim_config c = dt_optim_defaults(DT_OPTIM_ADAMW);
  compare_sharded(c, 1);
  compare_sharded(c, 2);
}

static void test_ranges_invalid(void **s) {
  dt_model *m;
  assert_int_equal(dt_model_create("in=3,linear:2", 1, 1, &m), DT_OK); /* 8 parameters */
  dt_optim_config c = dt_optim_defaults(DT_OPTIM_ADAMW);
  dt_optim *o = (dt_optim *)1;
  dt_param_range overlap[2] = {{0, 4}, {3, 6}}, empty[1] = {{2, 2}}, past[1] = {{4, 9}},
                 back[2] = {{4, 6}, {0, 2}};
  assert_int_equal(dt_optim_create_ranges(&c, m, overlap, 2, &o), DT_ERR_INVALID);
  assert_null(o);
  assert_non_null(strstr(dt_last_error(), "range 1 [3, 6)"));
  assert_int_equal(dt_optim_create_ranges(&c, m, empty, 1, &o), DT_ERR_INVALID);
  assert_int_equal(dt_optim_create_ranges(&c, m, past, 1, &o), DT_ERR_INVALID);
  assert_non_null(strstr(dt_last_error(), "8 parameters"));
  assert_int_equal(dt_optim_create_ranges(&c, m, back, 2, &o), DT_ERR_INVALID);
  /* a rank that owns nothing: valid, steps count, nothing changes */
  assert_int_equal(dt_optim_create_ranges(&c, m, NULL, 0, &o), DT_OK);
  assert_int_equal(dt_optim_state_size(o), 0);
  assert_int_equal(dt_optim_range_count(o), 0);
  assert_int_equal(dt_optim_step(o, 0.1f), DT_OK);
  assert_int_equal(dt_optim_step_count(o), 1);
  dt_optim_destroy(o);
  /* the step protocol */
  dt_param_range two[2] = {{0, 3}, {5, 8}};
  assert_int_equal(dt_optim_create_ranges(&c, m, two, 2, &o), DT_OK);
  assert_int_equal(dt_optim_range(o, 1).lo, 5);
  assert_int_equal(dt_optim_range(o, 2).hi, 0);
  assert_int_equal(dt_optim_step_range(o, 0, NULL), DT_ERR_STATE);
  assert_int_equal(dt_optim_begin_step(o, -1.0f), DT_ERR_INVALID);
  assert_int_equal(dt_optim_step_count(o), 0);
  assert_int_equal(dt_optim_begin_step(o, 0.1f), DT_OK);
  assert_int_equal(dt_optim_step_range(o, 2, NULL), DT_ERR_INVALID);
  const float *none[2] = {NULL, NULL};
  assert_int_equal(dt_optim_step_range_sum(o, 0, none, 2, 1.0f), DT_ERR_INVALID);
  assert_int_equal(dt_optim_step_range_sum(o, 0, none, 0, 1.0f), DT_ERR_INVALID);
  assert_int_equal(dt_optim_step_range_sum(o, 0, NULL, 1, 1.0f), DT_ERR_INVALID);
  /* parameters outside the ranges are never touched */
  float *p = dt_model_params(m), *g = dt_model_grads(m);
  float before[8];
  for (int i = 0; i < 8; i++)
    g[i] = 1.0f;
  memcpy(before, p, sizeof before);
  assert_int_equal(dt_optim_step_range(o, 1, NULL), DT_OK);
  assert_int_equal(dt_optim_step_range(o, 0, NULL), DT_OK);
  for (int i = 0; i < 8; i++) {
    if (i >= 3 && i < 5)
      assert_true(p[i] == before[i]);
    else
      assert_true(p[i] != before[i]);
  }
  dt_optim_destroy(o);
  dt_model_destroy(m);
}

/* dt_model_grad_segments lists exactly what the hook reports during a real backward. */
typedef struct {
  size_t ends[16];
  size_t n, next;
  int gap;
} hook_log;

static void log_hook(void *ctx, size_t off, size_t count) {
  hook_log *h = ctx;
  if (off != h->next)
    h->gap = 1;
  h->next = off + count;
  if (h->n < 16)
    h->ends[h->n++] = off + count;
}

static void test_grad_segments(void **s) {
  const char *specs[] = {SPEC, "in=1x8x8,conv3x3:4:p1,relu,maxpool2,flatten,layernorm,linear:16,gelu,linear:4"};
  for (size_t k = 0; k < 2; k++) {
    dt_model *m;
    assert_int_equal(dt_model_create(specs[k], 2, 3, &m), DT_OK);
    size_t ends[16];
    size_t n = dt_model_grad_segments(m, ends, 16);
    assert_int_equal(dt_model_grad_segments(m, NULL, 0), n);
    size_t in = dt_model_input_size(m);
    float *x = calloc(2 * in, sizeof(float));
    for (size_t i = 0; i < 2 * in; i++)
      x[i] = (float)(i % 7) * 0.1f;
    int32_t y[2] = {1, 3};
    assert_int_equal(dt_model_forward(m, x, 2, 1, NULL), DT_OK);
    hook_log h = {0};
    assert_int_equal(dt_model_backward(m, y, 1.0f, log_hook, &h, NULL), DT_OK);
    assert_int_equal(h.gap, 0);
    assert_int_equal(h.n, n);
    assert_memory_equal(h.ends, ends, n * sizeof(size_t));
    assert_int_equal(ends[n - 1], dt_model_param_count(m));
    free(x);
    dt_model_destroy(m);
  }
}

static void test_clip_pieces(void **s) {
  float a[5] = {3.0f, 0.0f, 4.0f, 1.0f, 2.0f}, b[5];
  memcpy(b, a, sizeof a);
  /* split as two ranks would: squares summed per part, one factor for the whole */
  double sq = dt_grad_sumsq(a, 2) + dt_grad_sumsq(a + 2, 3);
  assert_float_equal(sq, 30.0, 0);
  float f = dt_clip_factor(sq, 2.0f);
  assert_float_equal(f, 2.0 / (sqrt(30.0) + 1e-6), 1e-7);
  for (int i = 0; i < 5; i++)
    a[i] *= f;
  assert_float_equal(dt_clip_grad_norm(b, 5, 2.0f), sqrt(30.0), 1e-6);
  assert_memory_equal(a, b, sizeof a);
  assert_true(dt_clip_factor(sq, 10.0f) == 1.0f);
  assert_true(dt_clip_factor(sq, 0.0f) == 1.0f);
  assert_true(dt_clip_factor(0.0, 1.0f) == 1.0f);
  /* the squares of a sum of arrays never written out (2.5 chunks): those of the written sum */
  enum { N = 1300 };
  static float p0[N], p1[N], p2[N], sum[N];
  for (size_t i = 0; i < N; i++) {
    p0[i] = part_at(1, i, 0);
    p1[i] = part_at(1, i, 1);
    p2[i] = part_at(1, i, 2);
    sum[i] = p0[i];
    sum[i] += p1[i];
    sum[i] += p2[i];
  }
  const float *parts[3] = {p0, p1, p2};
  assert_true(dt_grad_sumsq_of_sum(parts, 3, N) == dt_grad_sumsq(sum, N));
  assert_true(dt_grad_sumsq_of_sum(parts, 1, N) == dt_grad_sumsq(p0, N));
  assert_true(dt_grad_sumsq_of_sum(parts, 3, 0) == 0.0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sharded_sgd),   cmocka_unit_test(test_sharded_adamw),
      cmocka_unit_test(test_ranges_invalid), cmocka_unit_test(test_grad_segments),
      cmocka_unit_test(test_clip_pieces),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
