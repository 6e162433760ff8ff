/* test_nn_alloc.c - a training step allocates nothing: forward, backward (with a hook),
 * zero_grad, clipping, optimizer steps and evaluation, and a step with deferred linear weight
 * gradients (on 1 and 2 threads), are run while every malloc-family call
 * made by this thread is counted, and the model's buffer pointers must not move.
 *
 * Counting works by defining malloc & co. in this executable, which the dynamic linker prefers
 * over glibc's for every caller, and forwarding to glibc's __libc_* entry points. Sanitizer
 * builds replace malloc themselves, so there only the pointer-stability half runs. Only the
 * test thread is counted, and only calls not made from inside libopenblas: its threaded sgemm
 * driver allocates a job array per call (Debian's 0.3.21, seen with 2 threads), which is
 * OpenBLAS's business, not dtrain's. */
#include <dlfcn.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dtrain/nn.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define COUNTING 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define COUNTING 0
#endif
#endif
#ifndef COUNTING
#define COUNTING 1
#endif

static _Thread_local int counting;
static _Thread_local long allocs;

#if COUNTING
/* 1 if this allocation counts: test thread, counting on, caller outside OpenBLAS */
#define COUNT_CALLER() count_caller(__builtin_return_address(0))
static int count_caller(void *ret) {
  if (!counting)
    return 0;
  Dl_info info;
  if (dladdr(ret, &info) && info.dli_fname && strstr(info.dli_fname, "openblas"))
    return 0;
  return 1;
}

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

void *malloc(size_t n) {
  allocs += COUNT_CALLER();
  return __libc_malloc(n);
}
void *calloc(size_t a, size_t b) {
  allocs += COUNT_CALLER();
  return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n) {
  allocs += COUNT_CALLER();
  return __libc_realloc(p, n);
}
void *memalign(size_t al, size_t n) {
  allocs += COUNT_CALLER();
  return __libc_memalign(al, n);
}
void *aligned_alloc(size_t al, size_t n) {
  allocs += COUNT_CALLER();
  return __libc_memalign(al, n);
}
int posix_memalign(void **out, size_t al, size_t n) {
  allocs += COUNT_CALLER();
  void *p = __libc_memalign(al, n);
  if (!p)
    return ENOMEM;
  *out = p;
  return 0;
}
#endif

static int hook_calls;
static void hook(void *ctx, size_t off, size_t count) { hook_calls++; }

/* A batch of b samples for m (the caller frees it) and its labels in y. */
static float *batch_of(const dt_model *m, int b, int32_t *y) {
  size_t in = dt_model_input_size(m);
  float *x = malloc(in * (size_t)b * sizeof(float));
  assert_non_null(x);
  for (size_t i = 0; i < in * (size_t)b; i++)
    x[i] = (float)(i % 13) / 13.0f;
  for (int i = 0; i < b; i++)
    y[i] = i % (int)dt_model_output_size(m);
  return x;
}

static void step_without_alloc(const char *spec, int threads) {
  dt_nn_set_threads(threads);
  const int B = 16;
  dt_model *m;
  assert_int_equal(dt_model_create(spec, B, 1, &m), DT_OK);
  dt_optim *o[2];
  dt_optim_config c = dt_optim_defaults(DT_OPTIM_SGD);
  c.momentum = 0.9f;
  assert_int_equal(dt_optim_create(&c, m, &o[0]), DT_OK);
  c = dt_optim_defaults(DT_OPTIM_ADAMW);
  assert_int_equal(dt_optim_create(&c, m, &o[1]), DT_OK);
  int32_t y[16];
  float *x = batch_of(m, B, y);
  float *params = dt_model_params(m), *grads = dt_model_grads(m);
  const float *logits0 = NULL, *logits;
  /* one warm-up step: OpenBLAS sets up its buffers on first use */
  assert_int_equal(dt_model_forward(m, x, B, 1, &logits0), DT_OK);
  assert_int_equal(dt_model_backward(m, y, 1.0f, hook, NULL, NULL), DT_OK);

  allocs = 0;
  counting = 1;
  for (int step = 0; step < 3; step++) {
    dt_model_zero_grad(m);
    assert_int_equal(dt_model_forward(m, x, B - step, 1, &logits), DT_OK);
    assert_ptr_equal(logits, logits0);
    float loss;
    assert_int_equal(dt_model_backward(m, y, 1.0f, hook, NULL, &loss), DT_OK);
    dt_model_clip_grad_norm(m, 1.0f);
    assert_int_equal(dt_optim_step(o[step & 1], 0.01f), DT_OK);
    double ls = 0;
    int64_t correct = 0;
    assert_int_equal(dt_model_eval_batch(m, x, y, B, &ls, &correct), DT_OK);
  }
  counting = 0;
  if (COUNTING && allocs != 0)
    fail_msg("%s: %ld allocations during 3 training steps", spec, allocs);
  assert_ptr_equal(params, dt_model_params(m));
  assert_ptr_equal(grads, dt_model_grads(m));
  assert_true(hook_calls > 0);
  free(x);
  dt_optim_destroy(o[0]);
  dt_optim_destroy(o[1]);
  dt_model_destroy(m);
}

/* The same with the linear weight gradients deferred (dt_model_defer_linear_grads): backward
 * fills the export and the update computes them (dt_optim_step_range_deferred), a tile at a
 * time on each thread, without allocating. */
static void deferred_step_without_alloc(const char *spec, int threads) {
  dt_nn_set_threads(threads);
  const int B = 16;
  dt_model *m;
  assert_int_equal(dt_model_create(spec, B, 1, &m), DT_OK);
  float *ex = aligned_alloc(64, (dt_model_export_size(m, B) * sizeof(float) + 63) / 64 * 64);
  assert_non_null(ex);
  assert_int_equal(dt_model_defer_linear_grads(m, ex, B), DT_OK);
  size_t n = dt_model_param_count(m);
  dt_param_range all = {0, n};
  dt_optim_config c = dt_optim_defaults(DT_OPTIM_SGD);
  c.momentum = 0.9f;
  dt_optim *o;
  assert_int_equal(dt_optim_create_ranges(&c, m, &all, 1, &o), DT_OK);
  int32_t y[16];
  float *x = batch_of(m, B, y);
  const float *g[1] = {dt_model_grads(m)}, *e[1] = {ex};
  allocs = 0;
  counting = 1;
  for (int step = 0; step < 3; step++) {
    dt_model_discard_grad(m);
    assert_int_equal(dt_model_forward(m, x, B - step, 1, NULL), DT_OK);
    assert_int_equal(dt_model_backward(m, y, 1.0f, NULL, NULL, NULL), DT_OK);
    assert_int_equal(dt_optim_begin_step(o, 0.01f), DT_OK);
    assert_int_equal(dt_optim_step_range_deferred(o, 0, g, e, 1, 1.0f), DT_OK);
  }
  counting = 0;
  if (COUNTING && allocs != 0)
    fail_msg("%s deferred: %ld allocations during 3 training steps", spec, allocs);
  free(x);
  dt_optim_destroy(o);
  dt_model_destroy(m);
  free(ex);
}

static void test_counter_works(void **s) {
  if (!COUNTING)
    skip();
  /* the counter must see an allocation, or the test below could not fail */
  allocs = 0;
  counting = 1;
  void *(*volatile mal)(size_t) = malloc;
  void *p = mal(100);
  counting = 0;
  free(p);
  assert_int_equal(allocs, 1);
}

static void test_mlp(void **s) { step_without_alloc("mlp", 1); }
static void test_cnn(void **s) { step_without_alloc("cnn", 1); }
static void test_mlp2(void **s) { step_without_alloc("mlp", 2); }
static void test_mlp_deferred(void **s) {
  deferred_step_without_alloc("mlp", 1);
  deferred_step_without_alloc("mlp", 2);
}
static void test_all_layers(void **s) {
  step_without_alloc("in=1x12x12,conv3x3:4:s2:p1,gelu,avgpool2,conv3x3:6:p1,relu,maxpool3:s1,"
                     "flatten,layernorm,dropout:0.5,linear:7",
                     1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_counter_works),
      cmocka_unit_test(test_mlp),
      cmocka_unit_test(test_cnn),
      cmocka_unit_test(test_mlp2),
      cmocka_unit_test(test_all_layers),
      cmocka_unit_test(test_mlp_deferred),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
