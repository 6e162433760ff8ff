/* test_nn_random.c - random layer stacks against a float64 reference of the whole model.
 *
 * test_nn_grad checks each layer on shapes picked by hand to reach each path of the kernels;
 * this one draws the shapes: an input of 1-16 channels and 1-16 rows and columns (or 1-40 flat),
 * then up to four image layers (convolutions of kernel 1-5 with any stride and padding and 1-40
 * output channels, max and average pooling with strides other than the window, relu and gelu),
 * then flat layers (linear, relu, gelu, layernorm), batches of 1-7 samples split over 1-3 compute
 * threads. For each, the model's logits, loss, every parameter's gradient and the input gradient
 * are compared with the same model computed in double from the definitions (weights
 * (OC, K, K, IC) and (out, in), activations channels-last, mean softmax cross-entropy). Then the
 * parameters and inputs change and the model runs again on a smaller batch, its gradients
 * discarded (written, not added) and scaled by 1/2, and once more adding to them: stale packed
 * weights, a batch split that does not fit, or a written gradient that was added would show.
 *
 * Bound per tensor: |model - reference| <= 1e-4 x the largest |reference| value of that tensor
 * + 1e-6. Float rounding of these sums stays near 1e-6 of it; a wrong tap, channel, stride,
 * border or scale moves values by a good part of a term, 1e-2 of the largest and more. A
 * relu input or a max-pool runner-up within 1e-5 (relative) of the decision could fall the other
 * way in float: such a case is skipped and counted (the test fails if more than a third are).
 *
 *   test_nn_random [--cases N] [--seed S] [--avx2] [-v]
 * DTRAIN_GEMM picks dtrain's own kernels or OpenBLAS (im2col) as everywhere; --avx2 forces
 * the AVX2 product and convolution tiles on a CPU with AVX-512F; -v prints every case's spec.
 * A failure prints the spec, batch, threads and which tensor is off. */
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/nn.h"

enum { CONV, MAXP, AVGP, RELU, GELU, FLAT, LIN, LN };
typedef struct {
  int kind, n, k, s, p; /* conv: n out channels, k, stride s, pad p; pools: k, s; linear: n */
  int c, h, w;          /* output shape (flat: c features) */
  int index;            /* conv1, fc2, ln1: the model's tensor names */
} layer;

#define MAXL 12
typedef struct {
  int c, h, w; /* input shape */
  bool flat;
  layer L[MAXL];
  int nl;
  char spec[512];
} net;

static uint64_t g_rng;
static uint64_t rnd(void) { /* splitmix64 */
  uint64_t z = (g_rng += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
static int below(int n) { return (int)(rnd() % (uint64_t)n); }
static int between(int lo, int hi) { return lo + below(hi - lo + 1); }
static double normal(void) { /* Box-Muller */
  double u = ((double)(rnd() >> 11) + 0.5) / 9007199254740992.0, v = (double)(rnd() >> 11) / 9007199254740992.0;
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static void add(net *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(net *t, const char *fmt, ...) {
  size_t l = strlen(t->spec);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->spec + l, sizeof t->spec - l, fmt, ap);
  va_end(ap);
}

/* A random valid stack whose model stays small (a few ms to check in double). */
static void draw(net *t) {
  memset(t, 0, sizeof *t);
  static const int chans[] = {1, 2, 3, 4, 7, 8, 15, 16, 17, 20, 31, 32, 35, 40};
  int nconv = 0, nfc = 0, nln = 0;
  int c, h = 1, w = 1;
  t->flat = below(5) == 0;
  if (t->flat) {
    c = between(1, 40);
    add(t, "in=%d", c);
  } else {
    c = chans[below(8)]; /* up to 16 input channels */
    h = between(1, 16);
    w = between(1, 16);
    add(t, "in=%dx%dx%d", c, h, w);
  }
  t->c = c, t->h = h, t->w = w;
  int nimg = t->flat ? 0 : below(5);
  for (int i = 0; i < nimg && t->nl < MAXL - 4; i++) {
    layer l = {0};
    int r = below(8);
    if (r < 4) { /* convolution */
      l.kind = CONV;
      l.k = between(1, 5);
      l.p = below(l.k);
      l.s = below(3) == 0 ? between(2, 3) : 1;
      l.n = chans[below((int)(sizeof chans / sizeof chans[0]))];
      if (h + 2 * l.p < l.k || w + 2 * l.p < l.k)
        continue;
      int oh = (h + 2 * l.p - l.k) / l.s + 1, ow = (w + 2 * l.p - l.k) / l.s + 1;
      if ((size_t)oh * ow * l.n > 6000 || (size_t)l.k * l.k * c * l.n > 20000)
        continue;
      l.index = ++nconv;
      add(t, ",conv%dx%d:%d", l.k, l.k, l.n);
      if (l.s != 1)
        add(t, ":s%d", l.s);
      if (l.p)
        add(t, ":p%d", l.p);
      c = l.n, h = oh, w = ow;
    } else if (r < 6) { /* pooling */
      l.kind = below(2) ? MAXP : AVGP;
      l.k = between(1, 3);
      l.s = below(2) ? l.k : between(1, 3);
      if (h < l.k || w < l.k)
        continue;
      add(t, ",%s%d", l.kind == MAXP ? "maxpool" : "avgpool", l.k);
      if (l.s != l.k)
        add(t, ":s%d", l.s);
      h = (h - l.k) / l.s + 1, w = (w - l.k) / l.s + 1;
    } else {
      l.kind = r == 6 ? RELU : GELU;
      add(t, ",%s", r == 6 ? "relu" : "gelu");
    }
    l.c = c, l.h = h, l.w = w;
    t->L[t->nl++] = l;
  }
  if (!t->flat) {
    t->L[t->nl++] = (layer){.kind = FLAT, .c = c * h * w, .h = 1, .w = 1};
    add(t, ",flatten");
    c = c * h * w, h = w = 1;
  }
  int nflat = between(c > 4096 ? 1 : 0, 3);
  for (int i = 0; i < nflat && t->nl < MAXL; i++) {
    layer l = {0};
    int r = below(6);
    if (r < 3 || c > 4096) {
      l.kind = LIN;
      l.n = between(1, 24);
      l.index = ++nfc;
      add(t, ",linear:%d", l.n);
      c = l.n;
    } else if (r == 3) {
      l.kind = RELU;
      add(t, ",relu");
    } else if (r == 4) {
      l.kind = GELU;
      add(t, ",gelu");
    } else {
      if (c < 8) /* over fewer features its gradient is mostly cancellation */
        continue;
      l.kind = LN;
      l.index = ++nln;
      add(t, ",layernorm");
    }
    l.c = c, l.h = 1, l.w = 1;
    t->L[t->nl++] = l;
  }
}

/* ---- the reference, in double ---- */

typedef struct {
  double *a[MAXL + 1]; /* a[0] the input, a[i + 1] layer i's output; channels-last */
  double *d[MAXL + 1]; /* gradients of the same */
  int *arg[MAXL];      /* max pooling: the input index of each output's maximum */
  double *g;           /* parameter gradients, laid out as the model's */
  int near;            /* a relu input or max-pool runner-up close to its decision */
} ref;

static size_t sz(const layer *l) { return (size_t)l->c * l->h * l->w; }
/* values per sample of the logits: the last layer's, or the input's in a model of none */
static size_t out_size(const net *t) { return t->nl ? sz(&t->L[t->nl - 1]) : (size_t)t->c * t->h * t->w; }

static const float *param(dt_model *m, const char *fam, int index, const char *part, size_t *off) {
  char name[48];
  snprintf(name, sizeof name, "%s%d.%s", fam, index, part);
  const dt_tensor *T = dt_model_find_tensor(m, name);
  if (!T) {
    fprintf(stderr, "no tensor %s\n", name);
    exit(1);
  }
  *off = T->offset;
  return dt_model_params(m) + T->offset;
}

static double phi_cdf(double x) { return 0.5 * (1.0 + erf(x / sqrt(2.0))); }

/* Forward of B samples x ((C, H, W) each) and backward of the mean cross-entropy against y. */
static double reference(const net *t, dt_model *m, const float *x, const int32_t *y, int B, ref *R) {
  const size_t np = dt_model_param_count(m);
  layer in = {.c = t->c, .h = t->h, .w = t->w};
  R->near = 0;
  R->a[0] = calloc((size_t)B * sz(&in), sizeof(double));
  for (int n = 0; n < B; n++)
    for (int c = 0; c < t->c; c++)
      for (int q = 0; q < t->h * t->w; q++)
        R->a[0][((size_t)n * t->h * t->w + q) * t->c + c] = x[((size_t)n * t->c + c) * t->h * t->w + q];
  for (int i = 0; i < t->nl; i++) {
    const layer *l = &t->L[i], *p = i ? &t->L[i - 1] : &in;
    const double *X = R->a[i];
    size_t ni = sz(p), no = sz(l);
    double *Y = R->a[i + 1] = calloc((size_t)B * no, sizeof(double));
    R->arg[i] = NULL;
    double scale = 0;
    for (size_t j = 0; j < (size_t)B * ni; j++)
      scale = fmax(scale, fabs(X[j]));
    switch (l->kind) {
    case CONV: {
      size_t wo, bo;
      const float *W = param(m, "conv", l->index, "weight", &wo), *bias = param(m, "conv", l->index, "bias", &bo);
      for (int n = 0; n < B; n++)
        for (int oh = 0; oh < l->h; oh++)
          for (int ow = 0; ow < l->w; ow++)
            for (int oc = 0; oc < l->c; oc++) {
              double acc = bias[oc];
              for (int kh = 0; kh < l->k; kh++)
                for (int kw = 0; kw < l->k; kw++) {
                  int ih = oh * l->s - l->p + kh, iw = ow * l->s - l->p + kw;
                  if (ih < 0 || ih >= p->h || iw < 0 || iw >= p->w)
                    continue;
                  for (int c = 0; c < p->c; c++)
                    acc += (double)W[((oc * l->k + kh) * l->k + kw) * p->c + c] *
                           X[(((size_t)n * p->h + ih) * p->w + iw) * p->c + c];
                }
              Y[(((size_t)n * l->h + oh) * l->w + ow) * l->c + oc] = acc;
            }
      break;
    }
    case MAXP:
    case AVGP:
      if (l->kind == MAXP)
        R->arg[i] = calloc((size_t)B * no, sizeof(int));
      for (int n = 0; n < B; n++)
        for (int oh = 0; oh < l->h; oh++)
          for (int ow = 0; ow < l->w; ow++)
            for (int c = 0; c < l->c; c++) {
              double best = -INFINITY, second = -INFINITY, sum = 0;
              int at = 0;
              for (int kh = 0; kh < l->k; kh++)
                for (int kw = 0; kw < l->k; kw++) {
                  int idx = (int)((((size_t)n * p->h + oh * l->s + kh) * p->w + ow * l->s + kw) * p->c + c);
                  double v = X[idx];
                  sum += v;
                  if (v > best) {
                    second = best, best = v, at = idx;
                  } else if (v > second) {
                    second = v;
                  }
                }
              size_t o = (((size_t)n * l->h + oh) * l->w + ow) * l->c + c;
              if (l->kind == MAXP) {
                Y[o] = best;
                R->arg[i][o] = at;
                /* a tie at exactly 0 follows a relu: no gradient reaches either side */
                if (best - second <= 1e-5 * scale && best != 0.0)
                  R->near++;
              } else {
                Y[o] = sum / (l->k * l->k);
              }
            }
      break;
    case RELU:
      for (size_t j = 0; j < (size_t)B * ni; j++) {
        Y[j] = X[j] > 0 ? X[j] : 0;
        if (fabs(X[j]) <= 1e-5 * scale && X[j] != 0.0)
          R->near++;
      }
      break;
    case GELU:
      for (size_t j = 0; j < (size_t)B * ni; j++)
        Y[j] = X[j] * phi_cdf(X[j]);
      break;
    case FLAT:
      memcpy(Y, X, (size_t)B * ni * sizeof(double));
      break;
    case LIN: {
      size_t wo, bo;
      const float *W = param(m, "fc", l->index, "weight", &wo), *bias = param(m, "fc", l->index, "bias", &bo);
      for (int n = 0; n < B; n++)
        for (int o = 0; o < l->c; o++) {
          double acc = bias[o];
          for (size_t k = 0; k < ni; k++)
            acc += (double)W[(size_t)o * ni + k] * X[(size_t)n * ni + k];
          Y[(size_t)n * no + o] = acc;
        }
      break;
    }
    case LN: {
      size_t go, bo;
      const float *G = param(m, "ln", l->index, "weight", &go), *bias = param(m, "ln", l->index, "bias", &bo);
      for (int n = 0; n < B; n++) {
        const double *v = X + (size_t)n * ni;
        double mean = 0, var = 0;
        for (size_t k = 0; k < ni; k++)
          mean += v[k] / (double)ni;
        for (size_t k = 0; k < ni; k++)
          var += (v[k] - mean) * (v[k] - mean) / (double)ni;
        for (size_t k = 0; k < ni; k++)
          Y[(size_t)n * no + k] = (v[k] - mean) / sqrt(var + 1e-5) * G[k] + bias[k];
      }
      break;
    }
    }
  }
  /* loss and d(loss)/d(logits) */
  const size_t K = out_size(t);
  const double *z = R->a[t->nl];
  double loss = 0;
  for (int i = 0; i <= t->nl; i++)
    R->d[i] = calloc((size_t)B * (i ? sz(&t->L[i - 1]) : sz(&in)), sizeof(double));
  for (int n = 0; n < B; n++) {
    double mx = -INFINITY, s = 0;
    for (size_t j = 0; j < K; j++)
      mx = fmax(mx, z[n * K + j]);
    for (size_t j = 0; j < K; j++)
      s += exp(z[n * K + j] - mx);
    loss += (log(s) + mx - z[n * K + (size_t)y[n]]) / B;
    for (size_t j = 0; j < K; j++)
      R->d[t->nl][n * K + j] = (exp(z[n * K + j] - mx) / s - (j == (size_t)y[n])) / B;
  }
  R->g = calloc(np ? np : 1, sizeof(double));
  for (int i = t->nl - 1; i >= 0; i--) {
    const layer *l = &t->L[i], *p = i ? &t->L[i - 1] : &in;
    const double *X = R->a[i], *Y = R->a[i + 1], *dY = R->d[i + 1];
    double *dX = R->d[i];
    size_t ni = sz(p), no = sz(l);
    switch (l->kind) {
    case CONV: {
      size_t wo, bo;
      const float *W = param(m, "conv", l->index, "weight", &wo);
      param(m, "conv", l->index, "bias", &bo);
      for (int n = 0; n < B; n++)
        for (int oh = 0; oh < l->h; oh++)
          for (int ow = 0; ow < l->w; ow++)
            for (int oc = 0; oc < l->c; oc++) {
              double gy = dY[(((size_t)n * l->h + oh) * l->w + ow) * l->c + oc];
              R->g[bo + (size_t)oc] += gy;
              for (int kh = 0; kh < l->k; kh++)
                for (int kw = 0; kw < l->k; kw++) {
                  int ih = oh * l->s - l->p + kh, iw = ow * l->s - l->p + kw;
                  if (ih < 0 || ih >= p->h || iw < 0 || iw >= p->w)
                    continue;
                  for (int c = 0; c < p->c; c++) {
                    size_t wi = (((size_t)oc * l->k + kh) * l->k + kw) * p->c + c;
                    size_t xi = (((size_t)n * p->h + ih) * p->w + iw) * p->c + c;
                    R->g[wo + wi] += gy * X[xi];
                    dX[xi] += gy * W[wi];
                  }
                }
            }
      break;
    }
    case MAXP:
      for (size_t o = 0; o < (size_t)B * no; o++)
        dX[R->arg[i][o]] += dY[o];
      break;
    case AVGP:
      for (int n = 0; n < B; n++)
        for (int oh = 0; oh < l->h; oh++)
          for (int ow = 0; ow < l->w; ow++)
            for (int c = 0; c < l->c; c++)
              for (int kh = 0; kh < l->k; kh++)
                for (int kw = 0; kw < l->k; kw++)
                  dX[(((size_t)n * p->h + oh * l->s + kh) * p->w + ow * l->s + kw) * p->c + c] +=
                      dY[(((size_t)n * l->h + oh) * l->w + ow) * l->c + c] / (l->k * l->k);
      break;
    case RELU:
      for (size_t j = 0; j < (size_t)B * ni; j++)
        dX[j] = Y[j] > 0 ? dY[j] : 0;
      break;
    case GELU:
      for (size_t j = 0; j < (size_t)B * ni; j++)
        dX[j] = dY[j] * (phi_cdf(X[j]) + X[j] * exp(-0.5 * X[j] * X[j]) / sqrt(2 * M_PI));
      break;
    case FLAT:
      memcpy(dX, dY, (size_t)B * ni * sizeof(double));
      break;
    case LIN: {
      size_t wo, bo;
      const float *W = param(m, "fc", l->index, "weight", &wo);
      param(m, "fc", l->index, "bias", &bo);
      for (int n = 0; n < B; n++)
        for (int o = 0; o < l->c; o++) {
          double gy = dY[(size_t)n * no + o];
          R->g[bo + (size_t)o] += gy;
          for (size_t k = 0; k < ni; k++) {
            R->g[wo + (size_t)o * ni + k] += gy * X[(size_t)n * ni + k];
            dX[(size_t)n * ni + k] += gy * W[(size_t)o * ni + k];
          }
        }
      break;
    }
    case LN: {
      size_t go, bo;
      const float *G = param(m, "ln", l->index, "weight", &go);
      param(m, "ln", l->index, "bias", &bo);
      for (int n = 0; n < B; n++) {
        const double *v = X + (size_t)n * ni, *dy = dY + (size_t)n * ni;
        double mean = 0, var = 0, m1 = 0, m2 = 0;
        for (size_t k = 0; k < ni; k++)
          mean += v[k] / (double)ni;
        for (size_t k = 0; k < ni; k++)
          var += (v[k] - mean) * (v[k] - mean) / (double)ni;
        double rs = 1 / sqrt(var + 1e-5);
        for (size_t k = 0; k < ni; k++) {
          double xh = (v[k] - mean) * rs, dxh = dy[k] * G[k];
          R->g[go + k] += dy[k] * xh;
          R->g[bo + k] += dy[k];
          m1 += dxh / (double)ni;
          m2 += dxh * xh / (double)ni;
        }
        for (size_t k = 0; k < ni; k++)
          dX[(size_t)n * ni + k] = rs * (dy[k] * G[k] - m1 - (v[k] - mean) * rs * m2);
      }
      break;
    }
    }
  }
  return loss;
}

static void ref_free(const net *t, ref *R) {
  for (int i = 0; i <= t->nl; i++) {
    free(R->a[i]);
    free(R->d[i]);
    if (i < t->nl)
      free(R->arg[i]);
  }
  free(R->g);
}

/* worst |got - want| / (1e-4 max|want| + 1e-6) over n values; <= 1 passes */
static double off(const float *got, const double *want, size_t n, double scale) {
  double mx = 0, worst = 0;
  for (size_t i = 0; i < n; i++)
    mx = fmax(mx, fabs(scale * want[i]));
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - scale * want[i]) / (1e-4 * mx + 1e-6);
    if (!(e <= worst)) { /* NaN too */
      worst = isnan(e) ? INFINITY : e;
      if (getenv("NNR_DEBUG"))
        fprintf(stderr, "  [%zu of %zu] got %.9g want %.9g (max %.3g)\n", i, n, got[i], scale * want[i], mx);
    }
  }
  return worst;
}

typedef enum { PASS, SKIP, FAIL } verdict;

/* Compares the model's last forward (logits) and its gradients with R; gw are the model's
 * gradients expected to be prev * gscale_prev + R * gscale (prev may be NULL). */
static verdict compare(const net *t, dt_model *m, const float *logits, float loss, double rloss, ref *R, int B,
                       const double *prev, double gs_prev, double gs, const char *pass) {
  size_t K = out_size(t);
  double worst = 0;
  const char *what = "";
  char buf[96];
  double e = off(logits, R->a[t->nl], (size_t)B * K, 1.0);
  if (e > worst)
    worst = e, what = "logits";
  if (!(fabs(loss - rloss) <= 1e-4 * (1 + fabs(rloss))))
    worst = INFINITY, what = "loss";
  /* per tensor */
  for (size_t i = 0; i < dt_model_tensor_count(m); i++) {
    const dt_tensor *T = dt_model_tensor(m, i);
    size_t cnt = 1;
    for (int d = 0; d < T->ndim; d++)
      cnt *= (size_t)T->shape[d];
    double *want = malloc(cnt * sizeof(double));
    for (size_t j = 0; j < cnt; j++)
      want[j] = (prev ? prev[T->offset + j] * gs_prev : 0) + R->g[T->offset + j] * gs;
    e = off(dt_model_grads(m) + T->offset, want, cnt, 1.0);
    free(want);
    if (e > worst) {
      worst = e;
      snprintf(buf, sizeof buf, "gradient of %s", T->name);
      what = buf;
    }
  }
  if (B > 0) {
    e = off(m->dinput, R->d[0], (size_t)B * t->c * t->h * t->w, gs);
    if (e > worst)
      worst = e, what = "input gradient";
  }
  if (worst <= 1.0)
    return PASS;
  if (R->near)
    return SKIP;
  fprintf(stderr, "FAIL %s: %s (batch %d, %d threads, %s): %s off by %.3g x the bound\n", pass, t->spec, B,
          dt_model_threads(m), dt__nn_gemm_name(), what, worst);
  return FAIL;
}

static void randomize(float *p, size_t n, double s) {
  for (size_t i = 0; i < n; i++)
    p[i] = (float)(s * normal());
}

/* Weights of 1/sqrt(fan-in) (so activations and logits stay of order 1 however deep the stack:
 * a saturated softmax's p - 1 would carry float's cancellation into every gradient), biases of
 * 0.3, layernorm gains near 1. */
static void init_params(dt_model *m) {
  for (size_t i = 0; i < dt_model_tensor_count(m); i++) {
    const dt_tensor *T = dt_model_tensor(m, i);
    float *p = dt_model_params(m) + T->offset;
    size_t cnt = 1, fan = 1;
    for (int d = 0; d < T->ndim; d++)
      cnt *= (size_t)T->shape[d];
    for (int d = 1; d < T->ndim; d++)
      fan *= (size_t)T->shape[d];
    bool gain = !strncmp(T->name, "ln", 2) && strstr(T->name, ".weight");
    randomize(p, cnt, T->ndim > 1 ? 1.0 / sqrt((double)fan) : 0.3);
    for (size_t j = 0; gain && j < cnt; j++)
      p[j] += 1.0f;
  }
}

/* One case: three passes as the header says. */
static verdict run_case(const net *t) {
  int B = between(1, 7), threads = between(1, 3);
  dt_nn_set_threads(threads);
  dt_model *m;
  if (dt_model_create(t->spec, B, 7, &m) != DT_OK) {
    fprintf(stderr, "FAIL: %s refused: %s\n", t->spec, dt_last_error());
    return FAIL;
  }
  m->want_dinput = true;
  size_t np = dt_model_param_count(m), nin = (size_t)t->c * t->h * t->w, K = dt_model_output_size(m);
  float *x = malloc((size_t)B * nin * sizeof(float));
  int32_t *y = malloc((size_t)B * sizeof(int32_t));
  verdict v = PASS;
  double *g1 = NULL;
  for (int pass = 0; pass < 3 && v == PASS; pass++) {
    int b = pass == 0 ? B : between(1, B);
    init_params(m);
    randomize(x, (size_t)b * nin, 1.0);
    for (int n = 0; n < b; n++)
      y[n] = (int32_t)below((int)K);
    if (pass == 0)
      dt_model_zero_grad(m);
    else if (pass == 1)
      dt_model_discard_grad(m);
    const float *logits;
    float loss = NAN;
    if (dt_model_forward(m, x, b, 1, &logits) != DT_OK ||
        dt_model_backward(m, y, pass == 1 ? 0.5f : 1.0f, NULL, NULL, &loss) != DT_OK) {
      fprintf(stderr, "FAIL: %s: %s\n", t->spec, dt_last_error());
      v = FAIL;
      break;
    }
    ref R;
    double rl = reference(t, m, x, y, b, &R);
    static const char *names[] = {"first pass", "second pass (written, x 1/2)", "third pass (added)"};
    v = compare(t, m, logits, loss, rl, &R, b, pass == 2 ? g1 : NULL, 1.0, pass == 1 ? 0.5 : 1.0, names[pass]);
    if (pass == 1) { /* what the third pass adds to */
      g1 = malloc((np ? np : 1) * sizeof(double));
      for (size_t i = 0; i < np; i++)
        g1[i] = dt_model_grads(m)[i];
    }
    ref_free(t, &R);
  }
  free(g1);
  free(x);
  free(y);
  dt_model_destroy(m);
  return v;
}

int main(int argc, char **argv) {
  int cases = 150;
  uint64_t seed = 1;
  bool verbose = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--cases") && i + 1 < argc)
      cases = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
      seed = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "-v"))
      verbose = true;
    else if (!strcmp(argv[i], "--avx2")) {
      if (!dt__nn_gemm_force_avx2()) {
        fprintf(stderr, "test_nn_random: this CPU has no AVX2 with FMA, or DTRAIN_GEMM=blas: nothing to force\n");
        return 77;
      }
      dt__nn_conv_force_avx2(true); /* returns the previous setting */
    } else {
      fprintf(stderr, "usage: test_nn_random [--cases N] [--seed S] [--avx2] [-v]\n");
      return 2;
    }
  }
  if (dt__nn_gemm_check() != DT_OK) {
    fprintf(stderr, "%s\n", dt_last_error());
    return 1;
  }
  int skipped = 0, failed = 0;
  for (int i = 0; i < cases; i++) {
    g_rng = seed * 1000003u + (uint64_t)i;
    net t;
    draw(&t);
    verdict v = run_case(&t);
    if (verbose)
      printf("%s %s\n", v == PASS ? "pass" : v == SKIP ? "skip" : "FAIL", t.spec);
    skipped += v == SKIP;
    failed += v == FAIL;
  }
  printf("test_nn_random: %d cases (seed %llu, %s): %d failed, %d skipped (a decision within rounding)\n", cases,
         (unsigned long long)seed, dt__nn_gemm_name(), failed, skipped);
  if (skipped * 3 > cases) {
    fprintf(stderr, "too many cases skipped\n");
    return 1;
  }
  return failed ? 1 : 0;
}
