/* test_nn_grad.c - finite-difference gradient checks of every layer and of the loss, plus
 * float64 reference forwards for the layers whose forward is easy to get subtly wrong (conv with
 * stride and padding, pooling, layernorm, gelu).
 *
 * Method: parameters are randomized (biases and layernorm affine included), the analytic
 * gradient of the mean softmax cross-entropy is compared with the central difference
 * (L(p+e) - L(p-e)) / 2e for every parameter and input coordinate of small models. The loss is
 * accumulated in double from float32 logits, so its rounding error is ~1e-7 * |L| and the
 * difference quotient carries ~1e-7 * |L| / e ~ 1e-4 of noise at e = 1e-3, while the truncation
 * error is O(e^2) ~ 1e-6 for these smooth, O(1)-scaled functions. We accept
 * |analytic - numeric| <= 3e-4 + 2e-2 * |numeric|: 3x over that noise, and far below the gradients
 * themselves (typically 1e-2..1), so a wrong term (missing factor, transposed index, dropped
 * bias) fails. The negative control at the end proves the checker rejects a 5% error. Inputs
 * are drawn away from kinks: with e = 1e-3 a relu or max-pool decision flips only if a value is
 * within 1e-3 of its threshold, which does happen in the deeper stacks. So each coordinate is
 * tried with steps 1e-3, then 3e-4 (a kink within 1e-3 is rarely also within 3e-4), then 3e-3
 * (less rounding noise) and passes if ANY agrees: a wrong analytic gradient disagrees at every
 * step size (the negative control checks exactly that), while a kink or rounding noise spoils
 * only some. Dropout uses a fixed mask by restoring the
 * model's RNG before every forward. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "nn/nn.h"

/* step sizes tried in turn until one agrees (see the header comment) */
static const double steps[] = {1e-3, 3e-4, 3e-3};
#define ATOL 3e-4
#define RTOL 2e-2

typedef struct {
  size_t next;   /* expected next offset */
  int calls;
  size_t total;
} hook_state;

static void hook(void *ctx, size_t off, size_t count) {
  hook_state *h = ctx;
  assert_int_equal(off, h->next); /* prefix ranges, front to back, no gaps */
  h->next = off + count;
  h->calls++;
  h->total += count;
}

static double loss_at(dt_model *m, const float *x, const int32_t *y, int B, const dt_rng *rng0) {
  *dt_model_rng(m) = *rng0;
  const float *logits;
  assert_int_equal(dt_model_forward(m, x, B, 1, &logits), DT_OK);
  return dt__nn_softmax_xent(logits, y, B, (int)dt_model_output_size(m), 0.0f, NULL, NULL) / B;
}

/* Returns the worst ratio |a-n| / (ATOL + RTOL*|n|) over the checked coordinates (<= 1 passes).
 * grad_scale multiplies the analytic gradient (1 normally; the negative control uses 1.05). */
static double gradcheck(const char *spec, int B, uint64_t seed, double xscale, float grad_scale) {
  dt_model *m;
  if (dt_model_create(spec, B, seed, &m) != DT_OK)
    fail_msg("%s: %s", spec, dt_last_error());
  m->want_dinput = true;
  dt_rng r;
  dt_rng_seed(&r, seed * 31 + 7);
  size_t np = dt_model_param_count(m), nin = dt_model_input_size(m) * (size_t)B;
  float *p = dt_model_params(m);
  for (size_t i = 0; i < np; i++)
    p[i] = (float)(0.5 * dt_rng_normal(&r));
  float *x = malloc(nin * sizeof(float));
  int32_t *y = malloc((size_t)B * sizeof(int32_t));
  for (size_t i = 0; i < nin; i++)
    x[i] = (float)(xscale * dt_rng_normal(&r));
  for (int i = 0; i < B; i++)
    y[i] = (int32_t)dt_rng_below(&r, dt_model_output_size(m));
  dt_rng rng0 = *dt_model_rng(m);

  /* analytic */
  dt_model_zero_grad(m);
  *dt_model_rng(m) = rng0;
  assert_int_equal(dt_model_forward(m, x, B, 1, NULL), DT_OK);
  hook_state h = {0};
  float loss;
  assert_int_equal(dt_model_backward(m, y, 1.0f, hook, &h, &loss), DT_OK);
  assert_int_equal(h.total, np);
  double l0 = loss_at(m, x, y, B, &rng0);
  assert_true(fabs(l0 - loss) < 1e-5 * (1 + fabs(l0)));
  float *g = malloc((np ? np : 1) * sizeof(float)), *gx = malloc(nin * sizeof(float));
  memcpy(g, dt_model_grads(m), np * sizeof(float));
  /* the model keeps the input gradient channels-last; x is (C, H, W) per sample */
  {
    size_t C = (size_t)m->in.c, HW = (size_t)m->in.h * (size_t)m->in.w;
    for (size_t n = 0; n < (size_t)B; n++)
      for (size_t c = 0; c < C; c++)
        for (size_t q = 0; q < HW; q++)
          gx[(n * C + c) * HW + q] = m->dinput[(n * HW + q) * C + c];
  }

  double worst = 0.0;
  /* every parameter (models here are small), then every input coordinate */
  for (size_t i = 0; i < np + nin; i++) {
    float *v = i < np ? &p[i] : &x[i - np];
    float a = (i < np ? g[i] : gx[i - np]) * grad_scale;
    float keep = *v;
    double ratio = INFINITY, num = 0;
    for (size_t e = 0; e < sizeof steps / sizeof steps[0] && ratio > 1.0; e++) {
      *v = keep + (float)steps[e];
      double lp = loss_at(m, x, y, B, &rng0);
      *v = keep - (float)steps[e];
      double lm = loss_at(m, x, y, B, &rng0);
      *v = keep;
      /* the actual step is the float difference, not 2*e exactly */
      double h2 = (double)(keep + (float)steps[e]) - (double)(keep - (float)steps[e]);
      double n = (lp - lm) / h2;
      double r1 = fabs(a - n) / (ATOL + RTOL * fabs(n));
      if (r1 < ratio) {
        ratio = r1;
        num = n;
      }
    }
    if (ratio > worst)
      worst = ratio;
    if (ratio > 1.0 && grad_scale == 1.0f)
      print_message("%s: %s %zu analytic %.6g numeric %.6g\n", spec, i < np ? "param" : "input",
                    i < np ? i : i - np, a, num);
  }
  free(g);
  free(gx);
  free(x);
  free(y);
  dt_model_destroy(m);
  return worst;
}

static void check(const char *spec, int B, uint64_t seed, double xscale) {
  double w = gradcheck(spec, B, seed, xscale, 1.0f);
  if (w > 1.0)
    fail_msg("%s: gradient check failed (worst ratio %.3f)", spec, w);
}

static void test_loss(void **s) { check("in=7", 3, 1, 2.0); }
static void test_linear(void **s) { check("in=6,linear:4", 3, 2, 1.0); }
static void test_linear_relu(void **s) { check("in=6,linear:5,relu,linear:3", 3, 3, 1.0); }
static void test_relu_first(void **s) { check("in=8,relu,linear:4", 2, 4, 1.0); }
static void test_gelu(void **s) { check("in=8,gelu,linear:4", 2, 5, 1.5); }
static void test_layernorm(void **s) { check("in=5,linear:6,layernorm,linear:3", 3, 6, 1.0); }
static void test_dropout(void **s) { check("in=9,dropout:0.4,linear:4", 3, 7, 1.0); }
static void test_flatten(void **s) { check("in=2x3x3,flatten,linear:4", 2, 8, 1.0); }
static void test_conv_stride_pad(void **s) {
  check("in=2x7x7,conv3x3:3:s2:p1,flatten,linear:4", 2, 9, 1.0);
  check("in=3x6x5,conv5x5:2:p2,flatten", 2, 10, 0.5);
  check("in=2x5x5,conv1x1:3,relu,flatten,linear:3", 2, 11, 1.0);
  check("in=1x9x9,conv4x4:2:s3,flatten,linear:3", 2, 12, 1.0);
}
static void test_maxpool(void **s) {
  check("in=2x6x6,maxpool2,flatten,linear:3", 2, 13, 1.0);
  check("in=3x7x7,maxpool3:s2,flatten,linear:3", 2, 14, 1.0); /* overlapping windows */
  check("in=35x4x4,maxpool2,flatten,linear:3", 2, 17, 1.0); /* 4-channel vectors and a tail */
  check("in=8x7x5,maxpool2,flatten,linear:3", 2, 18, 1.0);  /* tiled backward, uncovered edges */
  check("in=16x5x4,maxpool2,flatten,linear:3", 2, 19, 1.0); /* 16-channel AVX-512 forward */
  check("in=4x6x6,relu,maxpool2,flatten,linear:3", 2, 20, 1.0); /* the relu mask in the pool */
}
static void test_avgpool(void **s) {
  check("in=2x6x6,avgpool2,flatten,linear:3", 2, 15, 1.0);
  check("in=2x5x5,avgpool3:s1,flatten,linear:3", 2, 16, 1.0);
}
static void test_stack(void **s) {
  check("in=1x8x8,conv3x3:4:p1,relu,maxpool2,conv3x3:5:s2:p1,gelu,flatten,layernorm,"
        "dropout:0.25,linear:3",
        3, 17, 1.0);
}

static void test_negative_control(void **s) {
  /* the same check must reject a gradient that is 5% off */
  double w = gradcheck("in=6,linear:5,relu,linear:3", 3, 3, 1.0, 1.05f);
  assert_true(w > 1.0);
}

/* ---- float64 reference forwards ---- */

static dt_model *ref_model(const char *spec, int B, uint64_t seed, float **x) {
  dt_model *m;
  if (dt_model_create(spec, B, seed, &m) != DT_OK)
    fail_msg("%s: %s", spec, dt_last_error());
  dt_rng r;
  dt_rng_seed(&r, seed);
  float *p = dt_model_params(m);
  for (size_t i = 0; i < dt_model_param_count(m); i++)
    p[i] = (float)dt_rng_normal(&r);
  size_t n = dt_model_input_size(m) * (size_t)B;
  *x = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++)
    (*x)[i] = (float)dt_rng_normal(&r);
  return m;
}

/* Direct convolution in double from the definition: input (C, H, W), output channels-last,
 * weight (OC, K, K, IC), bias, and relu where the spec fuses it. Shapes that take each path of
 * the forward kernels: stride 2 with few channels; output rows wider than a 14-pixel tile and
 * more than one 32-channel panel with a partial last one (OC = 35: with AVX2, 16-channel halves
 * and 6-row pieces with masked columns); the cnn preset's two layers, relu fused. */
static void test_conv_reference(void **s) {
  static const struct { int C, H, W, k, OC, S, P, relu; } cases[] = {
      {2, 7, 6, 3, 4, 2, 1, 0}, {3, 5, 20, 3, 35, 1, 1, 0}, {3, 5, 20, 3, 35, 1, 1, 1},
      {1, 28, 28, 5, 32, 1, 2, 1}, {32, 14, 14, 5, 64, 1, 2, 1}, {5, 4, 9, 3, 21, 1, 0, 0},
  };
  const int B = 3;
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const int C = cases[ci].C, H = cases[ci].H, W = cases[ci].W, K = cases[ci].k;
    const int OC = cases[ci].OC, S = cases[ci].S, P = cases[ci].P;
    char spec[96];
    snprintf(spec, sizeof spec, "in=%dx%dx%d,conv%dx%d:%d:s%d:p%d%s,flatten", C, H, W, K, K, OC, S, P,
             cases[ci].relu ? ",relu" : "");
    float *x;
    dt_model *m = ref_model(spec, B, 21 + ci, &x);
    const dt_tensor *tw = dt_model_find_tensor(m, "conv1.weight");
    const dt_tensor *tb = dt_model_find_tensor(m, "conv1.bias");
    assert_non_null(tw);
    assert_int_equal(tw->shape[0], OC);
    assert_int_equal(tw->shape[1], K);
    assert_int_equal(tw->shape[3], C);
    const float *w = dt_model_params(m) + tw->offset, *b = dt_model_params(m) + tb->offset;
    const float *y;
    assert_int_equal(dt_model_forward(m, x, B, 0, &y), DT_OK);
    int OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1;
    assert_int_equal(dt_model_output_size(m), (size_t)OH * OW * OC);
    double worst = 0; /* |error| / (1e-5 x the sum of the absolute terms), <= 1 passes */
    for (int n = 0; n < B; n++)
      for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++)
          for (int oc = 0; oc < OC; oc++) {
            double acc = b[oc], mag = fabs(b[oc]);
            for (int kh = 0; kh < K; kh++)
              for (int kw = 0; kw < K; kw++)
                for (int c = 0; c < C; c++) {
                  int ih = oh * S - P + kh, iw = ow * S - P + kw;
                  if (ih < 0 || ih >= H || iw < 0 || iw >= W)
                    continue;
                  double t = (double)w[((oc * K + kh) * K + kw) * C + c] * x[(((size_t)n * C + c) * H + ih) * W + iw];
                  acc += t;
                  mag += fabs(t);
                }
            if (cases[ci].relu && acc < 0)
              acc = 0;
            double got = y[(((size_t)n * OH + oh) * OW + ow) * OC + oc];
            worst = fmax(worst, fabs(got - acc) / (1e-5 * mag + 1e-7));
          }
    if (worst > 1.0)
      fail_msg("%s: forward off the float64 reference (worst ratio %.3g)", spec, worst);
    free(x);
    dt_model_destroy(m);
  }
}

/* Convolution gradients (weight, bias, input) against float64 sums from the definition, on the
 * shapes that take each path of conv.c (where the CPU has AVX-512) and of the im2col code: the
 * cnn preset's two layers, a weight gradient by channel tiles with a masked last tap panel
 * (k*C = 33), more than one 32-channel panel and uneven channel tiles (OC = 35), stride 2 (input
 * gradient through col2im), 1x1 windows, and output rows wider than one 14-pixel tile. The loss is
 * softmax cross-entropy over the flattened output, so dy is known exactly in double. Bound per
 * value: 1e-4 times the sum of the absolute terms (float rounding of a few thousand terms stays
 * far below; a wrong tap, channel or border is of the order of the sum itself). */
static void test_conv_grad_reference(void **s) {
  static const struct { int C, H, W, k, OC, S, P; } cases[] = {
      {1, 28, 28, 5, 32, 1, 2}, {32, 14, 14, 5, 64, 1, 2}, {11, 3, 4, 3, 3, 1, 1},
      {12, 3, 4, 3, 35, 1, 1},  {16, 5, 5, 3, 4, 2, 1},    {2, 3, 3, 1, 3, 1, 0},
      {1, 3, 30, 3, 2, 1, 1},   {3, 6, 5, 5, 2, 1, 2},    {2, 7, 7, 3, 3, 2, 1},
  };
  const int B = 2;
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const int C = cases[ci].C, H = cases[ci].H, W = cases[ci].W, K = cases[ci].k;
    const int OC = cases[ci].OC, S = cases[ci].S, P = cases[ci].P;
    char spec[96];
    snprintf(spec, sizeof spec, "in=%dx%dx%d,conv%dx%d:%d:s%d:p%d,flatten", C, H, W, K, K, OC, S, P);
    float *x;
    dt_model *m = ref_model(spec, B, 40 + ci, &x);
    m->want_dinput = true;
    const int OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1, NO = OH * OW * OC;
    assert_int_equal(dt_model_output_size(m), (size_t)NO);
    int32_t lab[2] = {(int32_t)(ci % (size_t)NO), (int32_t)((7 * ci + 3) % (size_t)NO)};
    const float *logits;
    dt_model_zero_grad(m);
    assert_int_equal(dt_model_forward(m, x, B, 1, &logits), DT_OK);
    double *g = malloc((size_t)B * NO * sizeof(double));
    for (int n = 0; n < B; n++) { /* d(mean loss)/d(logit) */
      double mx = -INFINITY, sum = 0;
      for (int j = 0; j < NO; j++)
        mx = fmax(mx, logits[(size_t)n * NO + j]);
      for (int j = 0; j < NO; j++)
        sum += exp(logits[(size_t)n * NO + j] - mx);
      for (int j = 0; j < NO; j++)
        g[(size_t)n * NO + j] = (exp(logits[(size_t)n * NO + j] - mx) / sum - (j == lab[n])) / B;
    }
    float loss;
    assert_int_equal(dt_model_backward(m, lab, 1.0f, NULL, NULL, &loss), DT_OK);
    const dt_tensor *tw = dt_model_find_tensor(m, "conv1.weight");
    const dt_tensor *tb = dt_model_find_tensor(m, "conv1.bias");
    const float *dw = dt_model_grads(m) + tw->offset, *db = dt_model_grads(m) + tb->offset;
    const float *w = dt_model_params(m) + tw->offset;
    const size_t nx = (size_t)B * C * H * W, nw = (size_t)OC * K * K * C;
    double *rw = calloc(nw, sizeof(double)), *aw = calloc(nw, sizeof(double));
    double *rx = calloc(nx, sizeof(double)), *ax = calloc(nx, sizeof(double));
    double *rb = calloc((size_t)OC, sizeof(double)), *ab = calloc((size_t)OC, sizeof(double));
    for (int n = 0; n < B; n++)
      for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++)
          for (int oc = 0; oc < OC; oc++) {
            double gy = g[(size_t)n * NO + ((size_t)oh * OW + ow) * OC + oc];
            rb[oc] += gy;
            ab[oc] += fabs(gy);
            for (int kh = 0; kh < K; kh++)
              for (int kw = 0; kw < K; kw++) {
                int ih = oh * S - P + kh, iw = ow * S - P + kw;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W)
                  continue;
                for (int c = 0; c < C; c++) {
                  size_t wi = (((size_t)oc * K + kh) * K + kw) * C + c;
                  size_t xi = (((size_t)n * H + ih) * W + iw) * C + c; /* channels-last */
                  double xv = x[(((size_t)n * C + c) * H + ih) * W + iw];
                  rw[wi] += gy * xv;
                  aw[wi] += fabs(gy * xv);
                  rx[xi] += gy * w[wi];
                  ax[xi] += fabs(gy * w[wi]);
                }
              }
          }
    double worst = 0; /* |error| / bound, <= 1 passes */
    for (size_t i = 0; i < nw; i++)
      worst = fmax(worst, fabs(dw[i] - rw[i]) / (1e-4 * aw[i] + 1e-7));
    for (int i = 0; i < OC; i++)
      worst = fmax(worst, fabs(db[i] - rb[i]) / (1e-4 * ab[i] + 1e-7));
    for (size_t i = 0; i < nx; i++)
      worst = fmax(worst, fabs(m->dinput[i] - rx[i]) / (1e-4 * ax[i] + 1e-7));
    if (worst > 1.0)
      fail_msg("%s: gradient off the float64 reference (worst ratio %.3g)", spec, worst);
    free(rw), free(aw), free(rx), free(ax), free(rb), free(ab), free(g), free(x);
    dt_model_destroy(m);
  }
}

/* The same two on the AVX2 kernels (which a CPU without AVX-512F runs anyway). */
static void test_conv_reference_avx2(void **s) {
  bool was = dt__nn_conv_force_avx2(true);
  test_conv_reference(s);
  dt__nn_conv_force_avx2(was);
}

static void test_conv_grad_reference_avx2(void **s) {
  bool was = dt__nn_conv_force_avx2(true);
  test_conv_grad_reference(s);
  dt__nn_conv_force_avx2(was);
}

static void test_pool_reference(void **s) {
  const int B = 2, H = 7, W = 7, K = 3, S = 2;
  /* 20 channels: max-pool's 4-channel vector blocks; 3: the scalar tail only; 32: the AVX-512
   * path's 16-channel blocks (where the CPU has it) */
  for (int avg = 0; avg < 6; avg++) {
    const int C = avg < 2 ? 3 : avg < 4 ? 20 : 32;
    char spec[64];
    snprintf(spec, sizeof spec, "in=%dx7x7,%s3:s2,flatten", C, avg % 2 ? "avgpool" : "maxpool");
    float *x;
    dt_model *m = ref_model(spec, B, 22, &x);
    const float *y;
    assert_int_equal(dt_model_forward(m, x, B, 0, &y), DT_OK);
    int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    for (int n = 0; n < B; n++)
      for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++)
          for (int c = 0; c < C; c++) {
            double acc = avg % 2 ? 0.0 : -INFINITY;
            for (int kh = 0; kh < K; kh++)
              for (int kw = 0; kw < K; kw++) {
                double v = x[(((size_t)n * C + c) * H + oh * S + kh) * W + ow * S + kw];
                acc = avg % 2 ? acc + v / (K * K) : fmax(acc, v);
              }
            assert_float_equal(y[(((size_t)n * OH + oh) * OW + ow) * C + c], acc, 1e-5);
          }
    free(x);
    dt_model_destroy(m);
  }
}

static void test_layernorm_gelu_reference(void **s) {
  const int B = 3, F = 11;
  float *x;
  dt_model *m = ref_model("in=11,layernorm,gelu", B, 23, &x);
  const float *g = dt_model_params(m) + dt_model_find_tensor(m, "ln1.weight")->offset;
  const float *be = dt_model_params(m) + dt_model_find_tensor(m, "ln1.bias")->offset;
  const float *y;
  assert_int_equal(dt_model_forward(m, x, B, 0, &y), DT_OK);
  for (int n = 0; n < B; n++) {
    double mean = 0, var = 0;
    for (int i = 0; i < F; i++)
      mean += x[n * F + i] / (double)F;
    for (int i = 0; i < F; i++)
      var += (x[n * F + i] - mean) * (x[n * F + i] - mean) / F;
    for (int i = 0; i < F; i++) {
      double h = (x[n * F + i] - mean) / sqrt(var + 1e-5) * g[i] + be[i];
      double ref = 0.5 * h * (1.0 + erf(h / sqrt(2.0)));
      assert_float_equal(y[n * F + i], ref, 1e-5 * (1 + fabs(ref)));
    }
  }
  free(x);
  dt_model_destroy(m);
}

static void test_loss_reference(void **s) {
  const float z[6] = {1.0f, 2.0f, 3.0f, -1.0f, 0.0f, 1.0f};
  const int32_t y[2] = {2, 0};
  float d[6];
  int64_t correct = 0;
  double l = dt__nn_softmax_xent(z, y, 2, 3, 0.5f, d, &correct) / 2;
  double l0 = log(exp(1) + exp(2) + exp(3)) - 3, l1 = log(exp(-1) + exp(0) + exp(1)) + 1;
  assert_float_equal(l, (l0 + l1) / 2, 1e-6);
  assert_int_equal(correct, 1);
  double p = exp(-1) / (exp(-1) + exp(0) + exp(1));
  assert_float_equal(d[3], (p - 1) / 2, 1e-6);
  /* a row with a NaN logit anywhere has no most likely class: never counted correct (a NaN
   * first logit used to leave class 0 as the answer) */
  const float zn[9] = {NAN, 1.0f, 0.0f, 0.0f, NAN, 5.0f, 3.0f, 1.0f, 0.0f};
  const int32_t yn[3] = {0, 2, 0};
  correct = 0;
  l = dt__nn_softmax_xent(zn, yn, 3, 3, 0.0f, NULL, &correct);
  assert_int_equal(correct, 1);
  assert_true(isnan(l));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_loss),
      cmocka_unit_test(test_linear),
      cmocka_unit_test(test_linear_relu),
      cmocka_unit_test(test_relu_first),
      cmocka_unit_test(test_gelu),
      cmocka_unit_test(test_layernorm),
      cmocka_unit_test(test_dropout),
      cmocka_unit_test(test_flatten),
      cmocka_unit_test(test_conv_stride_pad),
      cmocka_unit_test(test_maxpool),
      cmocka_unit_test(test_avgpool),
      cmocka_unit_test(test_stack),
      cmocka_unit_test(test_negative_control),
      cmocka_unit_test(test_conv_reference),
      cmocka_unit_test(test_conv_grad_reference),
      cmocka_unit_test(test_conv_reference_avx2),
      cmocka_unit_test(test_conv_grad_reference_avx2),
      cmocka_unit_test(test_pool_reference),
      cmocka_unit_test(test_layernorm_gelu_reference),
      cmocka_unit_test(test_loss_reference),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
