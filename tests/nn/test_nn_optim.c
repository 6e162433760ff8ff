/* test_nn_optim.c - optimizer updates against values computed by hand (in double, outside this
 * code), learning-rate schedules at their boundaries, the schedule parser, and clipping. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dtrain/nn.h"
#include "nn/nn.h"

/* "in=1,linear:1" has exactly two parameters: fc1.bias at 1, fc1.weight at 0. Both start at
 * p0 and see the same gradient sequence, so each must follow the hand-computed trajectory. */
static void run(dt_optim_config cfg, float lr, const float *gs, int steps, const double *expect) {
  dt_model *m;
  assert_int_equal(dt_model_create("in=1,linear:1", 1, 1, &m), DT_OK);
  assert_int_equal(dt_model_param_count(m), 2);
  dt_optim *o;
  assert_int_equal(dt_optim_create(&cfg, m, &o), DT_OK);
  float *p = dt_model_params(m), *g = dt_model_grads(m);
  p[0] = p[1] = 1.0f;
  for (int s = 0; s < steps; s++) {
    g[0] = g[1] = gs[s];
    assert_int_equal(dt_optim_step(o, lr), DT_OK);
    assert_float_equal(p[0], expect[s], 1e-6);
    assert_float_equal(p[1], expect[s], 1e-6);
  }
  assert_int_equal(dt_optim_step_count(o), steps);
  dt_optim_destroy(o);
  dt_model_destroy(m);
}

static void test_sgd(void **s) {
  const float gs[3] = {0.5f, 0.5f, -1.0f};
  dt_optim_config c = dt_optim_defaults(DT_OPTIM_SGD);
  /* plain: p -= 0.1 * g */
  const double plain[3] = {0.95, 0.90, 1.00};
  run(c, 0.1f, gs, 3, plain);
  /* momentum 0.9, weight decay 0.1: d = g + 0.1 p; b = 0.9 b + d; p -= 0.1 b
   *   1: d = 0.6,    b = 0.6,    p = 0.94
   *   2: d = 0.594,  b = 1.134,  p = 0.8266
   *   3: d = -0.91734, b = 0.10326, p = 0.816274 */
  c.momentum = 0.9f;
  c.weight_decay = 0.1f;
  const double mom[3] = {0.94, 0.8266, 0.816274};
  run(c, 0.1f, gs, 3, mom);
  /* Nesterov: p -= 0.1 (d + 0.9 b)
   *   1: d = 0.6, b = 0.6, p = 1 - 0.1 * 1.14 = 0.886
   *   2: d = 0.5886, b = 1.1286, p = 0.886 - 0.1 * 1.60434 = 0.7255660
   *   3: d = -0.9274434, b = 0.0883... : computed below in double */
  c.nesterov = 1;
  double p = 0.7255660, b = 1.1286;
  double d = -1.0 + 0.1 * p;
  b = 0.9 * b + d;
  p -= 0.1 * (d + 0.9 * b);
  const double nest[3] = {0.886, 0.7255660, p};
  run(c, 0.1f, gs, 3, nest);
}

static void test_adamw(void **s) {
  const float gs[2] = {0.5f, -0.25f};
  dt_optim_config c = dt_optim_defaults(DT_OPTIM_ADAMW);
  assert_float_equal(c.beta1, 0.9, 1e-9);
  assert_float_equal(c.beta2, 0.999, 1e-9);
  c.weight_decay = 0.01f;
  /* lr 0.1: p *= 1 - lr*wd; m = .9m + .1g; v = .999v + .001g^2;
   *   1: p = 0.999, m = 0.05, v = 0.00025, mhat = 0.5, vhat = 0.25 -> p = 0.999 - 0.1 = 0.899
   *   2: p = 0.898101, m = 0.02, v = 0.00031225, mhat = 0.02/0.19, vhat = 0.00031225/0.001999
   *      -> p = 0.898101 - 0.1 * 0.1052632 / 0.3952236 = 0.8714673 */
  const double exp[2] = {0.899, 0.8714673};
  run(c, 0.1f, gs, 2, exp);
}

static void update_lanes_once(int cap) {
  dt_model *m;
  assert_int_equal(dt_model_create("in=37,linear:45", 1, 1, &m), DT_OK);
  const size_t n = dt_model_param_count(m);
  assert_int_equal(n, 37 * 45 + 45);
  float *p0 = malloc(n * sizeof(float)), *rp = malloc(n * sizeof(float)), *r0 = calloc(n, sizeof(float)),
        *r1 = calloc(n, sizeof(float)), *gs = malloc(3 * n * sizeof(float));
  assert_non_null(p0);
  assert_non_null(gs);
  dt_rng r;
  dt_rng_seed(&r, 11);
  for (size_t i = 0; i < n; i++)
    p0[i] = (float)dt_rng_normal(&r);
  for (size_t i = 0; i < 3 * n; i++)
    gs[i] = (float)(dt_rng_normal(&r) * 0.1);
  for (int kind = 0; kind < 4; kind++) {
    dt_optim_config c = dt_optim_defaults(kind == 3 ? DT_OPTIM_ADAMW : DT_OPTIM_SGD);
    c.weight_decay = kind == 0 ? 0.01f : kind == 3 ? 0.02f : 0.1f;
    c.momentum = kind == 1 || kind == 2 ? 0.9f : 0.0f;
    c.nesterov = kind == 2;
    dt_optim *o;
    assert_int_equal(dt_optim_create(&c, m, &o), DT_OK);
    float *p = dt_model_params(m), *g = dt_model_grads(m);
    memcpy(p, p0, n * sizeof(float));
    memcpy(rp, p0, n * sizeof(float));
    memset(r0, 0, n * sizeof(float));
    memset(r1, 0, n * sizeof(float));
    const float lr = 0.05f;
    for (int step = 1; step <= 3; step++) {
      const float *gg = gs + (size_t)(step - 1) * n;
      memcpy(g, gg, n * sizeof(float));
      assert_int_equal(dt_optim_step(o, lr), DT_OK);
      for (size_t i = 0; i < n; i++) {
        volatile float t1, t2, t3;
        if (kind == 3) {
          const float b1 = c.beta1, b2 = c.beta2, decay = 1.0f - lr * c.weight_decay;
          const float bc1 = (float)(1.0 - pow(b1, step)), bc2 = (float)sqrt(1.0 - pow(b2, step));
          const float st = lr / bc1;
          t1 = b1 * r0[i];
          t2 = (1.0f - b1) * gg[i];
          float m1 = t1 + t2;
          t1 = b2 * r1[i];
          t2 = (1.0f - b2) * gg[i];
          t3 = t2 * gg[i];
          float v1 = t1 + t3;
          r0[i] = m1;
          r1[i] = v1;
          t1 = rp[i] * decay;
          t2 = st * m1;
          rp[i] = t1 - t2 / (sqrtf(v1) / bc2 + c.eps);
        } else {
          t1 = c.weight_decay * rp[i];
          float d = gg[i] + t1;
          if (c.momentum == 0.0f) {
            t2 = lr * d;
            rp[i] -= t2;
            continue;
          }
          t2 = c.momentum * r0[i];
          float b = t2 + d;
          r0[i] = b;
          t3 = c.momentum * b;
          float u = c.nesterov ? d + t3 : b;
          t1 = lr * u;
          rp[i] -= t1;
        }
      }
      for (size_t i = 0; i < n; i++)
        if (memcmp(&p[i], &rp[i], sizeof(float)))
          fail_msg("optimizer kind %d, update copy up to %s, step %d: parameter %zu is %.9g, the rule one "
                   "float at a time gives %.9g", kind, cap == 2 ? "AVX-512" : cap ? "AVX2" : "base x86-64", step,
                   i, (double)p[i], (double)rp[i]);
    }
    dt_optim_destroy(o);
  }
  free(p0);
  free(rp);
  free(r0);
  free(r1);
  free(gs);
  dt_model_destroy(m);
}

/* Every element of a longer range (1710 parameters: vectors of 4, 8 or 16 and a tail) gets
 * exactly the bits of the update rule applied one float at a time, each product rounded before it
 * is added (volatile: no fused multiply-add in the reference either), in every copy of the update
 * loops this CPU can run (AVX-512, AVX2, base x86-64). A copy that fused them, or mixed up lanes
 * or the tail, differs in some element. */
static void test_update_lanes(void **s) {
  const int cap0 = dt__nn_optim_isa_cap(2);
  for (int cap = 2; cap >= 0; cap--) {
    dt__nn_optim_isa_cap(cap);
    update_lanes_once(cap);
  }
  dt__nn_optim_isa_cap(cap0);
}

static void test_optim_invalid(void **s) {
  dt_model *m;
  assert_int_equal(dt_model_create("in=1,linear:1", 1, 1, &m), DT_OK);
  dt_optim *o = (dt_optim *)1;
  dt_optim_config c = dt_optim_defaults(DT_OPTIM_SGD);
  c.momentum = 1.5f;
  assert_int_equal(dt_optim_create(&c, m, &o), DT_ERR_INVALID);
  assert_null(o);
  assert_non_null(strstr(dt_last_error(), "momentum"));
  c.momentum = 0.0f;
  c.nesterov = 1;
  assert_int_equal(dt_optim_create(&c, m, &o), DT_ERR_INVALID);
  c = dt_optim_defaults(DT_OPTIM_ADAMW);
  c.beta2 = 1.0f;
  assert_int_equal(dt_optim_create(&c, m, &o), DT_ERR_INVALID);
  c = dt_optim_defaults(DT_OPTIM_ADAMW);
  assert_int_equal(dt_optim_create(&c, m, &o), DT_OK);
  assert_int_equal(dt_optim_state_count(o), 2);
  const char *name;
  assert_non_null(dt_optim_state(o, 1, &name));
  assert_string_equal(name, "adam_v");
  assert_null(dt_optim_state(o, 2, &name));
  assert_int_equal(dt_optim_step(o, NAN), DT_ERR_INVALID);
  assert_int_equal(dt_optim_step_count(o), 0);
  dt_optim_destroy(o);
  dt_optim_destroy(NULL);
  dt_model_destroy(m);
}

static void test_schedules(void **s) {
  dt_lr_schedule c = {.kind = DT_SCHED_CONSTANT, .base_lr = 0.5f, .warmup_steps = 10};
  assert_float_equal(dt_lr_at(&c, 0), 0.05, 1e-7);
  assert_float_equal(dt_lr_at(&c, 4), 0.25, 1e-7);
  assert_float_equal(dt_lr_at(&c, 9), 0.5, 1e-7); /* warm-up end reaches base */
  assert_float_equal(dt_lr_at(&c, 10), 0.5, 1e-7);
  assert_float_equal(dt_lr_at(&c, 1000000), 0.5, 1e-7);

  dt_lr_schedule st = {.kind = DT_SCHED_STEP, .base_lr = 1.0f, .step_size = 30, .gamma = 0.1f};
  assert_float_equal(dt_lr_at(&st, 0), 1.0, 1e-7);
  assert_float_equal(dt_lr_at(&st, 29), 1.0, 1e-7);
  assert_float_equal(dt_lr_at(&st, 30), 0.1, 1e-7);
  assert_float_equal(dt_lr_at(&st, 59), 0.1, 1e-7);
  assert_float_equal(dt_lr_at(&st, 60), 0.01, 1e-8);

  dt_lr_schedule co = {.kind = DT_SCHED_COSINE, .base_lr = 1.0f, .warmup_steps = 10,
                       .total_steps = 110, .min_lr = 0.0f};
  assert_float_equal(dt_lr_at(&co, 0), 0.1, 1e-7);
  assert_float_equal(dt_lr_at(&co, 9), 1.0, 1e-7);
  assert_float_equal(dt_lr_at(&co, 10), 1.0, 1e-7);
  assert_float_equal(dt_lr_at(&co, 35), 0.5 * (1 + cos(M_PI / 4)), 1e-6);
  assert_float_equal(dt_lr_at(&co, 60), 0.5, 1e-6);
  assert_float_equal(dt_lr_at(&co, 109), 0.5 * (1 + cos(M_PI * 99 / 100)), 1e-6);
  assert_float_equal(dt_lr_at(&co, 110), 0.0, 1e-7);
  assert_float_equal(dt_lr_at(&co, 500), 0.0, 1e-7);
  co.min_lr = 0.1f;
  assert_float_equal(dt_lr_at(&co, 60), 0.55, 1e-6);
  assert_float_equal(dt_lr_at(&co, 110), 0.1, 1e-7);
}

static void test_schedule_parse(void **s) {
  dt_lr_schedule x;
  assert_int_equal(dt_lr_schedule_parse("constant", 0.1f, 100, &x), DT_OK);
  assert_int_equal(x.kind, DT_SCHED_CONSTANT);
  assert_int_equal(dt_lr_schedule_parse("step:30:0.5", 0.1f, 100, &x), DT_OK);
  assert_int_equal(x.kind, DT_SCHED_STEP);
  assert_int_equal(x.step_size, 30);
  assert_float_equal(x.gamma, 0.5, 1e-7);
  assert_int_equal(dt_lr_schedule_parse("step:7", 0.1f, 100, &x), DT_OK);
  assert_float_equal(x.gamma, 0.1, 1e-7);
  assert_int_equal(dt_lr_schedule_parse("cosine:20:0.001", 0.1f, 100, &x), DT_OK);
  assert_int_equal(x.kind, DT_SCHED_COSINE);
  assert_int_equal(x.warmup_steps, 20);
  assert_int_equal(x.total_steps, 100);
  assert_float_equal(x.min_lr, 0.001, 1e-9);
  assert_int_equal(dt_lr_schedule_parse("warmup=5,step:10", 0.1f, 100, &x), DT_OK);
  assert_int_equal(x.warmup_steps, 5);
  assert_int_equal(x.step_size, 10);
  const char *bad[] = {"", "linear", "step", "step:0", "step:3:2", "cosine:x", "cosine:1:5",
                       "warmup=-1,constant", "constant,cosine"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    if (dt_lr_schedule_parse(bad[i], 0.1f, 100, &x) != DT_ERR_INVALID)
      fail_msg("accepted \"%s\"", bad[i]);
    assert_non_null(strstr(dt_last_error(), "lr schedule"));
  }
}

static void test_clip(void **s) {
  float g[2] = {3.0f, 4.0f};
  assert_float_equal(dt_clip_grad_norm(g, 2, 10.0f), 5.0, 1e-6);
  assert_float_equal(g[0], 3.0, 0);
  assert_float_equal(dt_clip_grad_norm(g, 2, 1.0f), 5.0, 1e-6);
  assert_float_equal(g[0], 0.6, 1e-6);
  assert_float_equal(g[1], 0.8, 1e-6);
  assert_float_equal(dt_clip_grad_norm(g, 2, 0.0f), 1.0, 1e-6); /* 0: only measure */
  assert_float_equal(g[1], 0.8, 1e-6);
  float z[3] = {0, 0, 0};
  assert_float_equal(dt_clip_grad_norm(z, 3, 1.0f), 0.0, 0);
  /* through the model: its whole gradient buffer is one vector */
  dt_model *m;
  assert_int_equal(dt_model_create("in=3,linear:2", 1, 1, &m), DT_OK);
  float *gr = dt_model_grads(m);
  for (size_t i = 0; i < dt_model_param_count(m); i++)
    gr[i] = 2.0f; /* 8 values: norm sqrt(32) */
  assert_float_equal(dt_model_clip_grad_norm(m, 2.0f), sqrt(32.0), 1e-5);
  assert_float_equal(dt_clip_grad_norm(gr, dt_model_param_count(m), 0), 2.0, 1e-5);
  dt_model_destroy(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sgd),       cmocka_unit_test(test_adamw),   cmocka_unit_test(test_update_lanes),
      cmocka_unit_test(test_optim_invalid), cmocka_unit_test(test_schedules),
      cmocka_unit_test(test_schedule_parse), cmocka_unit_test(test_clip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
