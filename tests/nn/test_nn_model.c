/* test_nn_model.c - the spec language (presets, good specs, every kind of bad spec), the
 * parameter layout and tensor table, seeded initialization, the backward hook order, gradient
 * accumulation, evaluation, and small learning problems that must actually be learned. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dtrain/nn.h"
#include "nn/nn.h" /* dropout masks */

/* A failed huge allocation must come back as NULL (DT_ERR_NOMEM), not kill the sanitizer run. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }
const char *__tsan_default_options(void);
const char *__tsan_default_options(void) { return "allocator_may_return_null=1"; }

static dt_model *make(const char *spec, int B, uint64_t seed) {
  dt_model *m = NULL;
  if (dt_model_create(spec, B, seed, &m) != DT_OK)
    fail_msg("%s: %s", spec, dt_last_error());
  return m;
}

static void test_presets(void **s) {
  dt_model *m = make("mlp", 4, 1);
  /* 784*1024+1024 + 1024*1024+1024 + 1024*10+10 */
  assert_int_equal(dt_model_param_count(m), 1863690);
  assert_int_equal(dt_model_input_size(m), 784);
  assert_int_equal(dt_model_output_size(m), 10);
  assert_string_equal(dt_model_spec(m),
                      "in=1x28x28,flatten,linear:1024,relu,linear:1024,relu,linear:10");
  dt_model_destroy(m);
  m = make("cnn", 4, 1);
  /* conv1 32*25+32, conv2 64*25*32+64, fc1 3136*512+512, fc2 512*10+10 */
  assert_int_equal(dt_model_param_count(m), 832 + 51264 + 1606144 + 5130);
  assert_int_equal(dt_model_output_size(m), 10);
  const dt_tensor *t = dt_model_find_tensor(m, "conv2.weight");
  assert_non_null(t);
  assert_int_equal(t->ndim, 4);
  assert_int_equal(t->shape[0], 64);
  assert_int_equal(t->shape[1], 5);
  assert_int_equal(t->shape[2], 5);
  assert_int_equal(t->shape[3], 32);
  t = dt_model_find_tensor(m, "fc1.weight");
  assert_int_equal(t->shape[0], 512);
  assert_int_equal(t->shape[1], 3136);
  /* the canonical spec rebuilds the same architecture */
  dt_model *m2 = make(dt_model_spec(m), 4, 1);
  assert_string_equal(dt_model_spec(m2), dt_model_spec(m));
  assert_int_equal(dt_model_param_count(m2), dt_model_param_count(m));
  assert_memory_equal(dt_model_params(m), dt_model_params(m2),
                      dt_model_param_count(m) * sizeof(float));
  dt_model_destroy(m2);
  dt_model_destroy(m);
  assert_non_null(strstr(dt_model_spec_help(), "conv"));
  dt_model_destroy(NULL);
}

static void test_good_specs(void **s) {
  struct {
    const char *spec;
    size_t params, in, out;
  } cases[] = {
      {"linear:10", 784 * 10 + 10, 784, 10},
      {"in=20, linear:8 ,gelu,dropout:0.5,layernorm,linear:3", 20 * 8 + 8 + 16 + 8 * 3 + 3, 20, 3},
      {"in=3x32x32,conv3x3:8:s2:p1,relu,avgpool2,fc:5", 8 * 27 + 8 + 8 * 8 * 8 * 5 + 5, 3072, 5},
      {"conv5:4,maxpool3:s1,flatten", 4 * 25 + 4, 784, 4 * 22 * 22},
      {"in=6", 0, 6, 6},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    dt_model *m = make(cases[i].spec, 2, 1);
    if (dt_model_param_count(m) != cases[i].params || dt_model_input_size(m) != cases[i].in ||
        dt_model_output_size(m) != cases[i].out)
      fail_msg("%s: params %zu in %zu out %zu", cases[i].spec, dt_model_param_count(m),
               dt_model_input_size(m), dt_model_output_size(m));
    size_t counted = 0; /* the same without building it */
    if (dt_model_spec_param_count(cases[i].spec, &counted) != DT_OK || counted != cases[i].params)
      fail_msg("%s: dt_model_spec_param_count %zu, want %zu", cases[i].spec, counted, cases[i].params);
    dt_model_destroy(m);
  }
}

/* The canonical spec keeps a dropout probability to the float's last digit: a model saved with
 * it loads again (0.9999999 printed with %g read "dropout:1", which is refused), and 0.5 stays
 * "0.5". */
static void test_spec_round_trip(void **s) {
  const char *specs[] = {"in=4,dropout:0.9999999,linear:2", "in=4,dropout:0.5,linear:2", "in=4,dropout:0.1,linear:2"};
  const char *want[] = {"dropout:0.999999881", "dropout:0.5,", "dropout:0.1,"};
  for (int i = 0; i < 3; i++) {
    dt_model *m = make(specs[i], 2, 1);
    char canon[512];
    snprintf(canon, sizeof canon, "%s", dt_model_spec(m));
    if (!strstr(canon, want[i]))
      fail_msg("%s: canonical spec %s", specs[i], canon);
    dt_model *again = NULL;
    if (dt_model_create(canon, 2, 1, &again) != DT_OK || strcmp(dt_model_spec(again), canon))
      fail_msg("%s: canonical spec %s does not read back: %s", specs[i], canon, dt_last_error());
    dt_model_destroy(again);
    dt_model_destroy(m);
  }
}

static void test_bad_specs(void **s) {
  struct {
    const char *spec, *token, *why;
  } cases[] = {
      {"linear:10,softmax", "\"softmax\"", "unknown layer"},
      {"linear:0", "\"linear:0\"", "output size"},
      {"linear:ten", "\"linear:ten\"", "output size"},
      {"conv5x5:0", "\"conv5x5:0\"", "output channels"},
      {"conv5x3:8,flatten", "\"conv5x3:8\"", "square"},
      {"conv5x5:8:p5,flatten", "\"conv5x5:8:p5\"", "padding"},
      {"conv5x5:8:q2,flatten", "\"conv5x5:8:q2\"", "unknown option"},
      {"conv5x5:8:s0,flatten", "\"conv5x5:8:s0\"", "stride"},
      {"in=1x4x4,conv5x5:8,flatten", "\"conv5x5:8\"", "does not fit"},
      {"flatten,conv3x3:8", "\"conv3x3:8\"", "image input"},
      {"in=8,maxpool2", "\"maxpool2\"", "image input"},
      {"in=2x3x3,maxpool4,flatten", "\"maxpool4\"", "does not fit"},
      {"conv3x3:4", "\"(end)\"", "add flatten"},
      {"in=1x28x28", "\"(end)\"", "add flatten"},
      {"linear:10,,linear:5", "token 2", "empty token"},
      {"linear:10,in=5", "\"in=5\"", "first token"},
      {"in=0x28x28,linear:10", "\"in=0x28x28\"", "input sizes"},
      {"in=28x28,linear:10", "\"in=28x28\"", "in=CxHxW"},
      {"linear:10,dropout:1", "\"dropout:1\"", "probability"},
      {"linear:10,dropout:0.99999999", "\"dropout:0.99999999\"", "rounds to 1"},
      {"linear:10,dropout", "\"dropout\"", "dropout:P"},
      {"conv3x3:4,layernorm,flatten", "\"layernorm\"", "flat input"},
      {"in=1,layernorm", "\"layernorm\"", "at least 2"},
      {"linear:99999999", "\"linear:99999999\"", "output size"},
      {"in=100000,linear:100000", "\"linear:100000\"", "too large"},
      {"in=1x1024x1024,conv1x1:4096,linear:10", "\"conv1x1:4096\"", "output of 4096x1024x1024 is too large"},
      {"", "", "empty"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    dt_model *m = (dt_model *)1;
    dt_status st = dt_model_create(cases[i].spec, 2, 1, &m);
    const char *msg = dt_last_error();
    if (st != DT_ERR_INVALID || m != NULL || !strstr(msg, cases[i].token) ||
        !strstr(msg, cases[i].why))
      fail_msg("spec \"%s\": status %d, message \"%s\" (want %s and %s)", cases[i].spec, st, msg,
               cases[i].token, cases[i].why);
  }
  dt_model *m = (dt_model *)1;
  /* activations for 2^24 samples of 10^6 features (64 TiB) cannot be allocated */
  assert_int_equal(dt_model_create("in=1000000,linear:10", 1 << 24, 1, &m), DT_ERR_NOMEM);
  assert_null(m);
  assert_non_null(strstr(dt_last_error(), "max batch 16777216"));
  m = (dt_model *)1;
  assert_int_equal(dt_model_create(NULL, 2, 1, &m), DT_ERR_INVALID);
  assert_int_equal(dt_model_create("mlp", 0, 1, &m), DT_ERR_INVALID);
  assert_null(m);
}

static void test_layout(void **s) {
  dt_model *m = make("cnn", 2, 1);
  /* tensors tile the buffer in increasing offsets, last layer first, weight before bias */
  const char *order[] = {"fc2.weight", "fc2.bias",   "fc1.weight",   "fc1.bias",
                         "conv2.weight", "conv2.bias", "conv1.weight", "conv1.bias"};
  assert_int_equal(dt_model_tensor_count(m), 8);
  size_t off = 0;
  for (size_t i = 0; i < 8; i++) {
    const dt_tensor *t = dt_model_tensor(m, i);
    assert_string_equal(t->name, order[i]);
    assert_int_equal(t->offset, off);
    size_t c = 1;
    for (int d = 0; d < t->ndim; d++)
      c *= (size_t)t->shape[d];
    assert_int_equal(c, t->count);
    off += t->count;
  }
  assert_int_equal(off, dt_model_param_count(m));
  assert_null(dt_model_tensor(m, 8));
  assert_null(dt_model_find_tensor(m, "fc3.weight"));
  dt_model_destroy(m);
}

static void test_init(void **s) {
  dt_model *a = make("mlp", 1, 42), *b = make("mlp", 1, 42), *c = make("mlp", 1, 43);
  size_t n = dt_model_param_count(a);
  assert_memory_equal(dt_model_params(a), dt_model_params(b), n * sizeof(float));
  assert_memory_not_equal(dt_model_params(a), dt_model_params(c), n * sizeof(float));
  /* Kaiming-normal for fc1 (followed by relu): std sqrt(2/784); Xavier-uniform for fc3 */
  const dt_tensor *w1 = dt_model_find_tensor(a, "fc1.weight");
  const float *p = dt_model_params(a) + w1->offset;
  double sq = 0, mean = 0;
  for (size_t i = 0; i < w1->count; i++) {
    sq += (double)p[i] * p[i];
    mean += p[i];
  }
  assert_float_equal(sqrt(sq / w1->count), sqrt(2.0 / 784), 0.01 * sqrt(2.0 / 784));
  assert_true(fabs(mean / w1->count) < 1e-3);
  const dt_tensor *w3 = dt_model_find_tensor(a, "fc3.weight");
  double lim = sqrt(6.0 / (1024 + 10)), mx = 0;
  p = dt_model_params(a) + w3->offset;
  for (size_t i = 0; i < w3->count; i++)
    mx = fmax(mx, fabs(p[i]));
  assert_true(mx <= lim && mx > 0.9 * lim);
  const dt_tensor *b1 = dt_model_find_tensor(a, "fc1.bias");
  for (size_t i = 0; i < b1->count; i++)
    assert_true(dt_model_params(a)[b1->offset + i] == 0.0f);
  dt_model_destroy(a);
  dt_model_destroy(b);
  dt_model_destroy(c);
  dt_model *ln = make("in=4,linear:6,layernorm,linear:2", 1, 1);
  const dt_tensor *g = dt_model_find_tensor(ln, "ln1.weight");
  assert_float_equal(dt_model_params(ln)[g->offset + 5], 1.0, 0);
  dt_model_destroy(ln);
}

static void rand_batch(dt_rng *r, float *x, int32_t *y, size_t in, int B, int classes) {
  for (size_t i = 0; i < in * (size_t)B; i++)
    x[i] = (float)dt_rng_uniform(r);
  for (int i = 0; i < B; i++)
    y[i] = (int32_t)dt_rng_below(r, (uint64_t)classes);
}

typedef struct {
  int calls;
  size_t ranges[16][2];
} hook_log;

static void log_hook(void *ctx, size_t off, size_t count) {
  hook_log *h = ctx;
  h->ranges[h->calls][0] = off;
  h->ranges[h->calls][1] = count;
  h->calls++;
}

static void test_hook_and_state(void **s) {
  dt_model *m = make("cnn", 4, 1);
  float x[4 * 784];
  int32_t y[4];
  dt_rng r;
  dt_rng_seed(&r, 5);
  rand_batch(&r, x, y, 784, 4, 10);
  hook_log h = {0};
  float loss;
  /* backward before any forward, or after an eval forward, is a state error */
  assert_int_equal(dt_model_backward(m, y, 1.0f, NULL, NULL, &loss), DT_ERR_STATE);
  assert_int_equal(dt_model_forward(m, x, 4, 0, NULL), DT_OK);
  assert_int_equal(dt_model_backward(m, y, 1.0f, NULL, NULL, &loss), DT_ERR_STATE);
  assert_int_equal(dt_model_forward(m, x, 5, 1, NULL), DT_ERR_INVALID);
  assert_int_equal(dt_model_forward(m, NULL, 4, 1, NULL), DT_ERR_INVALID);
  assert_int_equal(dt_model_eval_batch(m, x, NULL, 4, NULL, NULL), DT_ERR_INVALID);
  assert_int_equal(dt_model_forward(m, x, 4, 1, NULL), DT_OK);
  int32_t bad[4] = {0, 1, 10, 2};
  assert_int_equal(dt_model_backward(m, bad, 1.0f, NULL, NULL, &loss), DT_ERR_INVALID);
  assert_non_null(strstr(dt_last_error(), "label 10 of sample 2"));
  assert_int_equal(dt_model_backward(m, y, 1.0f, log_hook, &h, &loss), DT_OK);
  /* one call per parameterized layer, fc2 first, each a range right after the previous */
  assert_int_equal(h.calls, 4);
  const size_t counts[4] = {5130, 1606144, 51264, 832};
  size_t off = 0;
  for (int i = 0; i < 4; i++) {
    assert_int_equal(h.ranges[i][0], off);
    assert_int_equal(h.ranges[i][1], counts[i]);
    off += counts[i];
  }
  /* random labels of 10 classes at init: loss near log(10) */
  assert_true(loss > 1.5f && loss < 4.0f);
  dt_model_destroy(m);
}

/* Two half-batches with loss_scale 1/2 accumulate to the full batch's gradient. */
static void test_accumulation(void **s) {
  const int B = 8;
  dt_model *m = make("in=1x8x8,conv3x3:4:p1,relu,maxpool2,flatten,linear:16,relu,linear:5", B, 3);
  float x[8 * 64];
  int32_t y[8];
  dt_rng r;
  dt_rng_seed(&r, 9);
  rand_batch(&r, x, y, 64, B, 5);
  size_t n = dt_model_param_count(m);
  float *full = malloc(n * sizeof(float));
  dt_model_zero_grad(m);
  float l_full, l1, l2;
  assert_int_equal(dt_model_forward(m, x, B, 1, NULL), DT_OK);
  assert_int_equal(dt_model_backward(m, y, 1.0f, NULL, NULL, &l_full), DT_OK);
  memcpy(full, dt_model_grads(m), n * sizeof(float));
  dt_model_zero_grad(m);
  for (size_t i = 0; i < n; i++)
    assert_true(dt_model_grads(m)[i] == 0.0f);
  assert_int_equal(dt_model_forward(m, x, B / 2, 1, NULL), DT_OK);
  assert_int_equal(dt_model_backward(m, y, 0.5f, NULL, NULL, &l1), DT_OK);
  assert_int_equal(dt_model_forward(m, x + B / 2 * 64, B / 2, 1, NULL), DT_OK);
  assert_int_equal(dt_model_backward(m, y + B / 2, 0.5f, NULL, NULL, &l2), DT_OK);
  assert_float_equal((l1 + l2) / 2, l_full, 1e-5);
  double maxd = 0, maxg = 0;
  for (size_t i = 0; i < n; i++) {
    maxd = fmax(maxd, fabs(dt_model_grads(m)[i] - full[i]));
    maxg = fmax(maxg, fabs(full[i]));
  }
  assert_true(maxg > 1e-3);
  assert_true(maxd < 1e-5 * (1 + maxg));
  free(full);
  dt_model_destroy(m);
}

/* Points in 2D from 3 Gaussian blobs; an MLP with SGD momentum must fit them. */
static void test_learn_mlp(void **s) {
  const int B = 64, classes = 3;
  for (int opt = 0; opt < 2; opt++) {
    dt_model *m = make("in=2,linear:32,relu,linear:32,gelu,linear:3", B, 11);
    dt_optim_config c = dt_optim_defaults(opt ? DT_OPTIM_ADAMW : DT_OPTIM_SGD);
    c.momentum = opt ? 0.0f : 0.9f;
    dt_optim *o;
    assert_int_equal(dt_optim_create(&c, m, &o), DT_OK);
    dt_rng r;
    dt_rng_seed(&r, 1);
    const float cx[3] = {-2, 2, 0}, cy[3] = {-1, -1, 2};
    float x[64 * 2];
    int32_t y[64];
    float first = 0, loss = 0;
    for (int step = 0; step < 300; step++) {
      for (int i = 0; i < B; i++) {
        y[i] = (int32_t)dt_rng_below(&r, classes);
        x[2 * i] = cx[y[i]] + 0.5f * (float)dt_rng_normal(&r);
        x[2 * i + 1] = cy[y[i]] + 0.5f * (float)dt_rng_normal(&r);
      }
      dt_model_zero_grad(m);
      assert_int_equal(dt_model_forward(m, x, B, 1, NULL), DT_OK);
      assert_int_equal(dt_model_backward(m, y, 1.0f, NULL, NULL, &loss), DT_OK);
      if (step == 0)
        first = loss;
      assert_int_equal(dt_optim_step(o, opt ? 0.01f : 0.05f), DT_OK);
    }
    double lsum = 0, lsum2 = 0;
    int64_t correct = 0, correct2 = 0;
    assert_int_equal(dt_model_eval_batch(m, x, y, B, &lsum, &correct), DT_OK);
    /* the same 64 samples evaluated by a model whose max batch is 10: pieces of 10 */
    dt_model *small = make("in=2,linear:32,relu,linear:32,gelu,linear:3", 10, 11);
    memcpy(dt_model_params(small), dt_model_params(m), dt_model_param_count(m) * sizeof(float));
    assert_int_equal(dt_model_eval_batch(small, x, y, B, &lsum2, &correct2), DT_OK);
    assert_int_equal(correct2, correct);
    assert_float_equal(lsum2, lsum, 1e-4);
    dt_model_destroy(small);
    if (!(lsum / B < 0.1 && correct >= 62 && first > 0.5))
      fail_msg("optimizer %d: first loss %.3f, final eval loss %.4f, %lld/64 correct", opt,
               (double)first, lsum / B, (long long)correct);
    dt_optim_destroy(o);
    dt_model_destroy(m);
  }
}

/* 8x8 images with one horizontal or vertical bar: a small CNN must tell them apart. */
static void test_learn_cnn(void **s) {
  const int B = 32;
  dt_model *m = make("in=1x8x8,conv3x3:4:p1,relu,maxpool2,conv3x3:8,relu,flatten,linear:2", B, 2);
  dt_optim_config c = dt_optim_defaults(DT_OPTIM_SGD);
  c.momentum = 0.9f;
  c.nesterov = 1;
  dt_optim *o;
  assert_int_equal(dt_optim_create(&c, m, &o), DT_OK);
  dt_rng r;
  dt_rng_seed(&r, 3);
  float x[32 * 64];
  int32_t y[32];
  float loss = 0;
  for (int step = 0; step < 200; step++) {
    for (int i = 0; i < B; i++) {
      y[i] = (int32_t)dt_rng_below(&r, 2);
      int pos = (int)dt_rng_below(&r, 8);
      for (int j = 0; j < 64; j++)
        x[i * 64 + j] = 0.1f * (float)dt_rng_uniform(&r);
      for (int k = 0; k < 8; k++)
        x[i * 64 + (y[i] ? k * 8 + pos : pos * 8 + k)] = 1.0f;
    }
    dt_model_zero_grad(m);
    assert_int_equal(dt_model_forward(m, x, B, 1, NULL), DT_OK);
    assert_int_equal(dt_model_backward(m, y, 1.0f, NULL, NULL, &loss), DT_OK);
    assert_int_equal(dt_optim_step(o, 0.02f), DT_OK);
  }
  double lsum = 0;
  int64_t correct = 0;
  assert_int_equal(dt_model_eval_batch(m, x, y, B, &lsum, &correct), DT_OK);
  if (!(lsum / B < 0.05 && correct == B))
    fail_msg("final eval loss %.4f, %lld/32 correct", lsum / B, (long long)correct);
  dt_optim_destroy(o);
  dt_model_destroy(m);
}

/* Same seed, same data => bit-identical parameters after several steps (with dropout). */
static void test_determinism(void **s) {
  float out[2][64];
  for (int run = 0; run < 2; run++) {
    dt_model *m = make("in=16,linear:32,relu,dropout:0.3,linear:4", 8, 77);
    dt_optim_config c = dt_optim_defaults(DT_OPTIM_ADAMW);
    dt_optim *o;
    assert_int_equal(dt_optim_create(&c, m, &o), DT_OK);
    dt_rng r;
    dt_rng_seed(&r, 4);
    float x[8 * 16];
    int32_t y[8];
    for (int step = 0; step < 20; step++) {
      rand_batch(&r, x, y, 16, 8, 4);
      dt_model_zero_grad(m);
      assert_int_equal(dt_model_forward(m, x, 8, 1, NULL), DT_OK);
      assert_int_equal(dt_model_backward(m, y, 1.0f, NULL, NULL, NULL), DT_OK);
      assert_int_equal(dt_optim_step(o, 0.01f), DT_OK);
    }
    memcpy(out[run], dt_model_params(m), sizeof out[run]);
    dt_optim_destroy(o);
    dt_model_destroy(m);
  }
  assert_memory_equal(out[0], out[1], sizeof out[0]);
}

/* Every layer kind (conv stem in sub-slices, layernorm, dropout, linear split across threads),
 * and batches of 7, and smaller than the thread counts the tests use (1-3). */
static const char *const specs[] = {
    "in=1x10x10,conv3x3:6:p1,relu,maxpool2,conv3x3:5:s2:p1,gelu,avgpool2,flatten,layernorm,"
    "dropout:0.3,linear:12,relu,linear:4",
    "in=30,linear:40,relu,dropout:0.5,linear:20,relu,linear:7",
};
static const int batches[] = {7, 1, 2};

/* Gradients, loss and logits with 2 and 3 threads equal the single-thread ones up to float
 * summation order, for every layer kind (dropout masks do not depend on the split), also when
 * the batch is smaller than the thread count and when convolutions run in many im2col chunks;
 * the hook still reports contiguous prefixes. */
static void test_threads_match(void **s) {
  for (size_t si = 0; si < 2; si++)
    for (size_t bi = 0; bi < 3; bi++) {
      int B = batches[bi];
      float *ref = NULL, ref_loss = 0;
      size_t n = 0;
      for (int T = 1; T <= 3; T++) {
        dt_nn_set_threads(T);
        /* with 3 threads also cut conv work into one-sample im2col chunks */
        if (T == 3)
          setenv("DTRAIN_CONV_CHUNK", "64", 1);
        dt_model *m = make(specs[si], 8, 5);
        unsetenv("DTRAIN_CONV_CHUNK");
        assert_int_equal(dt_model_threads(m), T);
        n = dt_model_param_count(m);
        size_t in = dt_model_input_size(m);
        float x[8 * 100];
        int32_t y[8];
        dt_rng r;
        dt_rng_seed(&r, 12);
        rand_batch(&r, x, y, in, B, (int)dt_model_output_size(m));
        hook_log h = {0};
        float loss;
        for (int rep = 0; rep < 2; rep++) { /* two accumulated passes */
          assert_int_equal(dt_model_forward(m, x, B, 1, NULL), DT_OK);
          assert_int_equal(dt_model_backward(m, y, 0.5f, rep ? NULL : log_hook, &h, &loss), DT_OK);
        }
        size_t off = 0;
        for (int c = 0; c < h.calls; c++) {
          assert_int_equal(h.ranges[c][0], off);
          off += h.ranges[c][1];
        }
        assert_int_equal(off, n);
        if (T == 1) {
          ref = malloc(n * sizeof(float));
          memcpy(ref, dt_model_grads(m), n * sizeof(float));
          ref_loss = loss;
        } else {
          assert_float_equal(loss, ref_loss, 1e-5);
          double maxd = 0, maxg = 0;
          for (size_t i = 0; i < n; i++) {
            maxd = fmax(maxd, fabs(dt_model_grads(m)[i] - ref[i]));
            maxg = fmax(maxg, fabs(ref[i]));
          }
          if (!(maxg > 1e-4 && maxd <= 1e-5 * (1 + maxg)))
            fail_msg("%s B=%d T=%d: grad diff %g (max grad %g)", specs[si], B, T, maxd, maxg);
          /* Linear layers only: dW by rows and dx by columns from every sample, each element one
           * product that dtrain's own kernels sum in the same order whatever the thread's block
           * (OpenBLAS may not), so the same bits. */
          if (si == 1 && strcmp(dt__nn_gemm_name(), "openblas") && memcmp(dt_model_grads(m), ref, n * sizeof(float)))
            fail_msg("%s B=%d T=%d: gradients differ from one thread's in their bits", specs[si], B, T);
          double ls = 0;
          int64_t corr = 0;
          assert_int_equal(dt_model_eval_batch(m, x, y, B, &ls, &corr), DT_OK);
          assert_true(ls > 0);
        }
        dt_model_destroy(m);
      }
      free(ref);
    }
  dt_nn_set_threads(1);
}

/* dt_model_discard_grad: over gradients holding NaN, the next backward writes them and the one
 * after adds, giving what zero_grad then the same two backwards gives (equal floats), for every
 * layer kind (conv stem in sub-slices, layernorm, linear split across threads), 1-3 threads,
 * batches smaller than the thread count; zero_grad after a discard zeros again. */
static void test_discard_grad(void **s) {
  for (size_t si = 0; si < 2; si++)
    for (size_t bi = 0; bi < 3; bi++)
      for (int T = 1; T <= 3; T++) {
        int B = batches[bi];
        dt_nn_set_threads(T);
        dt_model *m = make(specs[si], 8, 5);
        size_t n = dt_model_param_count(m), in = dt_model_input_size(m);
        float x[8 * 100], *g = dt_model_grads(m), *ref = malloc(n * sizeof(float));
        int32_t y[8];
        dt_rng r;
        dt_rng_seed(&r, 12);
        rand_batch(&r, x, y, in, B, (int)dt_model_output_size(m));
        for (int pass = 0; pass < 2; pass++) {
          if (pass == 0) {
            dt_model_zero_grad(m);
          } else {
            for (size_t i = 0; i < n; i++)
              g[i] = NAN;
            dt_model_discard_grad(m);
          }
          for (int rep = 0; rep < 2; rep++) { /* two accumulated backwards */
            dt_rng_seed(dt_model_rng(m), 77 + (uint64_t)rep);
            assert_int_equal(dt_model_forward(m, x + (size_t)rep * in, B - rep * (B > 1), 1, NULL), DT_OK);
            assert_int_equal(dt_model_backward(m, y + rep, 0.5f, NULL, NULL, NULL), DT_OK);
          }
          if (pass == 0)
            memcpy(ref, g, n * sizeof(float));
        }
        size_t bad = 0, first = n;
        for (size_t i = 0; i < n; i++)
          if (!(g[i] == ref[i]) && bad++ == 0)
            first = i;
        if (bad)
          fail_msg("%s B=%d T=%d: %zu of %zu gradients differ after discard, first #%zu: %g vs %g", specs[si], B, T,
                   bad, n, first, g[first], ref[first]);
        dt_model_discard_grad(m);
        dt_model_zero_grad(m);
        for (size_t i = 0; i < n; i++)
          assert_true(g[i] == 0.0f);
        free(ref);
        dt_model_destroy(m);
      }
  dt_nn_set_threads(1);
}

/* The dropout masks of dt_model_set_dropout_key(key, first): a batch of 12 forwarded at once
 * (samples numbered 100..111) and in pieces {5,7}, {1,4,7}, {3,3,3,3}, each piece keyed by the
 * same key and its first sample's number, on 1-3 threads, draws every sample's mask in both
 * dropout layers identically; an eval forward in between neither applies nor consumes the key;
 * another key, another sample or another layer gets another mask, and about 1-p is kept. */
static void test_dropout_key_split(void **s) {
  (void)s;
  enum { B = 12, IN = 40, F1 = 24, F2 = 16 };
  const char *spec = "in=40,linear:24,relu,dropout:0.3,linear:16,dropout:0.5,linear:3";
  const int li[2] = {2, 4}, fs[2] = {F1, F2};
  static const int splits[4][5] = {{12}, {5, 7}, {1, 4, 7}, {3, 3, 3, 3}};
  const uint64_t key = 0x1234567887654321ULL, first = 100;
  float x[B * IN];
  int32_t y[B];
  dt_rng r;
  dt_rng_seed(&r, 21);
  rand_batch(&r, x, y, IN, B, 3);
  uint8_t ref[2][B * F1];
  for (int T = 1; T <= 3; T++) {
    dt_nn_set_threads(T);
    dt_model *m = make(spec, B, 3);
    assert_int_equal(m->layers[li[0]].kind, NN_DROPOUT);
    assert_int_equal(m->layers[li[1]].kind, NN_DROPOUT);
    for (int sp = 0; sp < 4; sp++) {
      int at = 0;
      for (int k = 0; k < 5 && splits[sp][k]; k++) {
        int n = splits[sp][k];
        dt_model_set_dropout_key(m, key, first + (uint64_t)at);
        if (k == 1) { /* eval in between: no dropout, the key stays for the next training forward */
          double ls = 0;
          int64_t c = 0;
          assert_int_equal(dt_model_eval_batch(m, x, y, B, &ls, &c), DT_OK);
        }
        assert_int_equal(dt_model_forward(m, x + (size_t)at * IN, n, 1, NULL), DT_OK);
        for (int l = 0; l < 2; l++) {
          const uint8_t *mask = m->layers[li[l]].mask;
          size_t rowb = (size_t)fs[l];
          if (T == 1 && sp == 0) {
            memcpy(ref[l], mask, B * rowb);
            continue;
          }
          if (memcmp(mask, ref[l] + (size_t)at * rowb, (size_t)n * rowb))
            fail_msg("threads %d, split %d, piece %d (samples %d..%d): layer %d's masks differ from "
                     "the whole batch's", T, sp, k, at, at + n - 1, li[l]);
        }
        at += n;
      }
      assert_int_equal(at, B);
    }
    dt_model_destroy(m);
  }
  dt_nn_set_threads(1);
  /* keep fraction, and no two samples (nor the two layers) share a mask */
  const double p[2] = {0.3, 0.5};
  for (int l = 0; l < 2; l++) {
    int kept = 0;
    for (int i = 0; i < B * fs[l]; i++)
      kept += ref[l][i];
    double f = (double)kept / (B * fs[l]);
    if (fabs(f - (1 - p[l])) > 0.12)
      fail_msg("layer %d keeps %.3f of its values, p = %.1f", li[l], f, p[l]);
    for (int a = 0; a < B; a++)
      for (int b = a + 1; b < B; b++)
        assert_true(memcmp(ref[l] + (size_t)a * fs[l], ref[l] + (size_t)b * fs[l], (size_t)fs[l]));
  }
  assert_true(memcmp(ref[0], ref[1], F2));
  /* another key, and the same key with other sample numbers, give other masks */
  dt_model *m = make(spec, B, 3);
  for (int v = 0; v < 2; v++) {
    dt_model_set_dropout_key(m, v ? key : key + 1, v ? first + 1 : first);
    assert_int_equal(dt_model_forward(m, x, B, 1, NULL), DT_OK);
    assert_true(memcmp(m->layers[li[0]].mask, ref[0], (size_t)B * F1));
  }
  dt_model_destroy(m);
}

/* dt_model_use_memory: a model whose arenas moved into the caller's memory (half way through,
 * with 1 and 2 threads) trains bit for bit as one that kept its own, into that memory; moving
 * back keeps the contents; misaligned or overlapping buffers change nothing. */
static void test_use_memory(void **s) {
  (void)s;
  const char *spec = "in=1x8x8,conv3x3:4:p1,relu,flatten,linear:16,relu,linear:5";
  for (int th = 1; th <= 2; th++) {
    dt_nn_set_threads(th);
    float out[2][64];
    for (int moved = 0; moved < 2; moved++) {
      dt_model *m = make(spec, 6, 9);
      size_t np = dt_model_param_count(m);
      float *mem = aligned_alloc(64, (2 * np * sizeof(float) + 127) / 64 * 64 + 64);
      assert_non_null(mem);
      float *P = mem, *G = mem + (np + 15) / 16 * 16;
      dt_optim_config c = dt_optim_defaults(DT_OPTIM_SGD);
      c.momentum = 0.9f;
      dt_optim *o;
      assert_int_equal(dt_optim_create(&c, m, &o), DT_OK);
      dt_rng r;
      dt_rng_seed(&r, 5);
      float x[6 * 64];
      int32_t y[6];
      for (int step = 0; step < 12; step++) {
        if (moved && step == 5) {
          float *p0 = dt_model_params(m), *g0 = dt_model_grads(m);
          assert_int_equal(dt_model_use_memory(m, (float *)((char *)P + 4), NULL), DT_ERR_INVALID);
          assert_int_equal(dt_model_use_memory(m, P, P + 16), DT_ERR_INVALID);
          assert_ptr_equal(dt_model_params(m), p0);
          assert_ptr_equal(dt_model_grads(m), g0);
          memcpy(out[1], p0, sizeof out[1]);
          assert_int_equal(dt_model_use_memory(m, P, G), DT_OK);
          assert_ptr_equal(dt_model_params(m), P);
          assert_ptr_equal(dt_model_grads(m), G);
          assert_memory_equal(P, out[1], sizeof out[1]);
        }
        rand_batch(&r, x, y, 64, 6, 5);
        dt_model_discard_grad(m);
        assert_int_equal(dt_model_forward(m, x, 6, 1, NULL), DT_OK);
        assert_int_equal(dt_model_backward(m, y, 1.0f, NULL, NULL, NULL), DT_OK);
        assert_int_equal(dt_optim_step(o, 0.05f), DT_OK);
      }
      memcpy(out[moved], dt_model_params(m), sizeof out[moved]);
      if (moved) {
        assert_int_equal(dt_model_use_memory(m, NULL, NULL), DT_OK);
        assert_true(dt_model_params(m) != P && dt_model_grads(m) != G);
        assert_memory_equal(dt_model_params(m), out[1], sizeof out[1]);
        assert_memory_equal(dt_model_grads(m), G, np * sizeof(float));
      }
      dt_optim_destroy(o);
      dt_model_destroy(m);
      free(mem);
    }
    assert_memory_equal(out[0], out[1], sizeof out[0]);
  }
  dt_nn_set_threads(1);
}

/* dt_model_share_params takes the buffer as it is: a second model of the same spec (another
 * seed) on the first one's parameters computes the first one's outputs, its updates are the
 * first one's, and moving back copies them into memory of its own. */
static void test_share_params(void **s) {
  (void)s;
  const char *spec = "in=1x8x8,flatten,linear:16,relu,linear:5";
  dt_model *a = make(spec, 4, 1), *b = make(spec, 4, 2);
  size_t np = dt_model_param_count(a);
  float *pa = dt_model_params(a), *keep = malloc(np * sizeof(float));
  assert_non_null(keep);
  memcpy(keep, pa, np * sizeof(float));
  assert_memory_not_equal(dt_model_params(b), pa, np * sizeof(float));
  assert_int_equal(dt_model_share_params(b, NULL), DT_ERR_INVALID);
  assert_int_equal(dt_model_share_params(b, (float *)((char *)pa + 4)), DT_ERR_INVALID);
  assert_int_equal(dt_model_share_params(b, dt_model_grads(b)), DT_ERR_INVALID);
  assert_int_equal(dt_model_share_params(b, pa), DT_OK);
  assert_ptr_equal(dt_model_params(b), pa);
  assert_memory_equal(pa, keep, np * sizeof(float)); /* not written */
  dt_rng r;
  dt_rng_seed(&r, 3);
  float x[4 * 64], oa[4 * 5];
  int32_t y[4];
  rand_batch(&r, x, y, 64, 4, 5);
  const float *la, *lb;
  assert_int_equal(dt_model_forward(a, x, 4, 0, &la), DT_OK);
  memcpy(oa, la, sizeof oa);
  assert_int_equal(dt_model_forward(b, x, 4, 0, &lb), DT_OK);
  assert_memory_equal(oa, lb, sizeof oa);
  dt_optim_config c = dt_optim_defaults(DT_OPTIM_SGD);
  dt_optim *o;
  assert_int_equal(dt_optim_create(&c, b, &o), DT_OK);
  dt_model_discard_grad(b);
  assert_int_equal(dt_model_forward(b, x, 4, 1, NULL), DT_OK);
  assert_int_equal(dt_model_backward(b, y, 1.0f, NULL, NULL, NULL), DT_OK);
  assert_int_equal(dt_optim_step(o, 0.1f), DT_OK);
  assert_memory_not_equal(pa, keep, np * sizeof(float)); /* b's step moved a's parameters */
  assert_int_equal(dt_model_use_memory(b, NULL, NULL), DT_OK);
  assert_true(dt_model_params(b) != pa);
  assert_memory_equal(dt_model_params(b), pa, np * sizeof(float));
  dt_optim_destroy(o);
  dt_model_destroy(b);
  dt_model_destroy(a);
  free(keep);
}

int main(void) {
  dt_nn_set_threads(1);
  assert_int_equal(dt_nn_threads(), 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_presets),        cmocka_unit_test(test_good_specs),
      cmocka_unit_test(test_spec_round_trip),
      cmocka_unit_test(test_bad_specs),      cmocka_unit_test(test_layout),
      cmocka_unit_test(test_init),           cmocka_unit_test(test_hook_and_state),
      cmocka_unit_test(test_accumulation),   cmocka_unit_test(test_learn_mlp),
      cmocka_unit_test(test_learn_cnn),      cmocka_unit_test(test_determinism),
      cmocka_unit_test(test_threads_match),  cmocka_unit_test(test_discard_grad),
      cmocka_unit_test(test_use_memory),     cmocka_unit_test(test_share_params),
      cmocka_unit_test(test_dropout_key_split),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
