/* conv.c - convolution without im2col, on CPUs where dtrain runs its own AVX-512 product.
 * B = batch, C = input channels, OC = output channels, K = k*k*C (one window), P = pad.
 *
 * Forward is an implicit GEMM: a sample's input is copied once into a zero-bordered buffer, and
 * the micro-kernel reads each output pixel's window straight from it. Within one kernel row kh,
 * the window of output pixel (oh, ow) is k*C contiguous floats (channels-last), and neighbouring
 * pixels' windows are S*C floats apart, so a run of up to 14 pixels of one output row is a
 * 14 x K operand with row stride S*C, read k runs at a time. The 14 x 32 tile of outputs stays
 * in registers over the whole window and gets bias (and the fused relu) before its only store.
 * This replaces writing and re-reading a K-times larger im2col matrix and a separate bias pass.
 *
 * The input gradient of a stride-1 layer is the same kind of convolution: dy padded by k-1-P,
 * the window flipped in space, input and output channels swapped (stride > 1 keeps layers.c's
 * GEMM + col2im). The weight gradient is a register-blocked reduction over one sample's pixels,
 * added to dW once per sample (as the im2col path added once per chunk, so rounding stays of
 * the same size), with the bias gradient while that sample's dy is in cache. Two tilings: where
 * a kernel row's run k*C is at least 32 floats, 14 output channels x 32 consecutive taps (dy
 * broadcast, input vectors loaded), written straight into dW's rows; for short runs (the first
 * layer of an image model: k*C = 5, where an im2col GEMM has N = 25 and ran at a sixth of the
 * kernel's peak) 10 taps x 32 channels, the tile transposed into dW afterwards.
 *
 * Measured (cnn preset, 128 samples, 1 thread, median of 15, interleaved runs on a busy
 * machine): conv1 forward 4.6 -> 1.0 ms, conv2 forward 15.7 -> 12.2 ms, conv1 weight gradient
 * 6.2 -> 3.5 ms, conv2 backward 35.5 -> 30.5 ms.
 *
 * Without AVX-512F, on CPUs with AVX2 and FMA, the forward and the stride-1 input gradient run
 * the same way with 6 x 16 tiles of 256-bit vectors (fwd_tile2); the weight gradient stays with
 * im2col and OpenBLAS there. On an AMD EPYC (Zen 3) guest, cnn preset, 128 samples, 1 thread,
 * 5 alternated rounds of bench/nn_step against DTRAIN_GEMM=blas (im2col + OpenBLAS): step
 * 142-149 -> 127-131 ms, forward 49-54 -> 43-45 ms (bench/results/conv-avx2-2026-11-27-epyc.txt).
 * Callers check dt__nn_conv_fwd_direct() (forward, input gradient) or dt__nn_conv_direct(). */
/* O3: GCC 12 at O2 leaves the kernels' per-row code as loops. Each kernel runs one flat loop
 * over offset tables (koff, pixoff) rather than nested loops, which are simpler for it too. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#include <immintrin.h>
#include <string.h>

#include "nn/nn.h"

#define AVX512 __attribute__((target("avx512f")))
#define FMR 14 /* output pixels per forward tile: 28 accumulators, as gemm.c's MR */
#define NR 32  /* output channels per tile: two vectors */
#define WMR 10 /* taps per weight-gradient tile: 20 accumulators and 10 row pointers, which
                * with the pixel index, dy and the loop bound still fit the 15 usable GPRs */

static size_t up16(size_t n) { return (n + 15) & ~(size_t)15; }

bool dt__nn_conv_direct(void) { return strcmp(dt__nn_gemm_name(), "avx512") == 0; }

static bool g_force_avx2; /* tests: the AVX2 tiles on a CPU with AVX-512F too */

bool dt__nn_conv_force_avx2(bool on) {
  bool was = g_force_avx2;
  g_force_avx2 = on && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return was;
}

/* wherever dtrain's own product runs (AVX-512, or AVX2 + FMA; not with DTRAIN_GEMM=blas) */
bool dt__nn_conv_fwd_direct(void) { return strcmp(dt__nn_gemm_name(), "openblas") != 0; }

/* One convolution as the kernels see it: input (H, W, C), window k x k, stride S, padding P,
 * output (OH, OW, OC). The input gradient of a stride-1 layer is such a convolution too. */
typedef struct geom {
  int H, W, C, k, S, P, OH, OW, OC;
} geom;

static geom layer_geom(const nn_layer *l) {
  return (geom){l->in.h, l->in.w, l->in.c, l->k, l->stride, l->pad, l->out.h, l->out.w, l->out.c};
}

/* The input gradient of a stride-1 layer with P <= k-1: dy padded by k-1-P convolved with the
 * weights flipped in space and with channels swapped (pack_weights_flipped). */
static bool dx_direct_ok(const nn_layer *l) { return l->stride == 1 && l->pad <= l->k - 1; }

static geom dx_geom(const nn_layer *l) {
  return (geom){l->out.h, l->out.w, l->out.c, l->k, 1, l->k - 1 - l->pad, l->in.h, l->in.w,
                l->in.c};
}

static size_t padded_floats(const geom *g) {
  return (size_t)(g->H + 2 * g->P) * (size_t)(g->W + 2 * g->P) * (size_t)g->C;
}

/* Workspace layout: padded sample, dW tile, window offsets (K ints), pixel offsets (OH*OW
 * ints). Packed weights live in the layer's own l->wpk, packed once per pass. */
typedef struct ws_parts {
  float *xp, *acc;
  int *koff, *pixoff;
} ws_parts;

static size_t ws_layout(const geom *g, float *ws, ws_parts *w) {
  size_t K = (size_t)g->k * g->k * g->C;
  size_t o_acc = up16(padded_floats(g));
  size_t o_koff = o_acc + (size_t)FMR * NR, o_pix = o_koff + up16(K);
  size_t total = o_pix + up16((size_t)g->OH * g->OW);
  if (ws) {
    w->xp = ws;
    w->acc = ws + o_acc;
    w->koff = (int *)(ws + o_koff);
    w->pixoff = (int *)(ws + o_pix);
  }
  return total;
}

size_t dt__nn_conv_ws_floats(const nn_layer *l) {
  geom g = layer_geom(l), d = dx_geom(l);
  size_t a = ws_layout(&g, NULL, NULL);
  if (dx_direct_ok(l)) {
    size_t b = ws_layout(&d, NULL, NULL);
    a = a > b ? a : b;
  }
  return a;
}

static size_t packed_floats(const geom *g) {
  return up16((size_t)(g->OC + NR - 1) / NR * NR * (size_t)g->k * g->k * g->C);
}

size_t dt__nn_conv_packed_floats(const nn_layer *l) {
  geom g = layer_geom(l), d = dx_geom(l);
  return packed_floats(&g) + (dx_direct_ok(l) ? packed_floats(&d) : 0);
}

/* koff[t]: offset of window tap t = (kh*k + kw)*C + c from the window's top-left in the padded
 * sample; pixoff[p]: offset of output pixel p's window. */
static void fill_offsets(const geom *g, const ws_parts *w) {
  const int C = g->C, k = g->k, S = g->S, Wp = g->W + 2 * g->P;
  for (int t = 0; t < k * k * C; t++)
    w->koff[t] = (t / (k * C)) * Wp * C + t % (k * C);
  for (int oh = 0; oh < g->OH; oh++)
    for (int ow = 0; ow < g->OW; ow++)
      w->pixoff[oh * g->OW + ow] = (oh * S * Wp + ow * S) * C;
}

/* x (H, W, C) of one sample into xp (H+2P, W+2P, C) with zero borders. */
static void pad_input(const geom *g, const float *x, float *xp) {
  const size_t C = (size_t)g->C, H = (size_t)g->H, W = (size_t)g->W, P = (size_t)g->P;
  const size_t Wp = W + 2 * P, rowf = Wp * C;
  memset(xp, 0, P * rowf * sizeof(float));
  for (size_t h = 0; h < H; h++) {
    float *r = xp + (h + P) * rowf;
    memset(r, 0, P * C * sizeof(float));
    memcpy(r + P * C, x + h * W * C, W * C * sizeof(float));
    memset(r + (P + W) * C, 0, P * C * sizeof(float));
  }
  memset(xp + (H + P) * rowf, 0, P * rowf * sizeof(float));
}

static inline __mmask16 lanes(int n) {
  return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

/* ---- forward ---- */

/* y[i][0..nr) = act(bias + sum over k < K of a[koff[k] + i*lda] * Bp[k*NR + j]) for i < mr; mr
 * is a constant at each call site (fwd_dispatch). */
/* Named accumulators instead of arrays: with __m512 arrays (a may_alias type) GCC 12 stored
 * every accumulator to the stack on each step of these loops, which read int offsets too. */
#define REP14(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13)
#define REP10(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9)

AVX512 static inline __attribute__((always_inline)) void fwd_tile(
    const int mr, const float *restrict a, int lda, const int *restrict koff, int K,
    const float *restrict Bp, const float *bias, bool relu, float *y, int ldy, int nr) {
#define DECL(i) __m512 c0_##i = _mm512_setzero_ps(), c1_##i = _mm512_setzero_ps();
  REP14(DECL)
#undef DECL
  for (int k = 0; k < K; k++, Bp += NR) {
    const float *ak = a + koff[k];
    __m512 b0 = _mm512_load_ps(Bp), b1 = _mm512_load_ps(Bp + 16);
#define STEP(i)                                                                                    \
  if (i < mr) {                                                                                    \
    __m512 av = _mm512_set1_ps(ak[(size_t)(i) * lda]);                                             \
    c0_##i = _mm512_fmadd_ps(av, b0, c0_##i);                                                      \
    c1_##i = _mm512_fmadd_ps(av, b1, c1_##i);                                                      \
  }
    REP14(STEP)
#undef STEP
  }
  __mmask16 m0 = lanes(nr), m1 = lanes(nr - 16);
  __m512 bv0 = _mm512_setzero_ps(), bv1 = _mm512_setzero_ps();
  if (bias) {
    bv0 = _mm512_maskz_loadu_ps(m0, bias);
    bv1 = _mm512_maskz_loadu_ps(m1, bias + 16);
  }
  __m512 z = _mm512_setzero_ps();
#define OUT(i)                                                                                     \
  if (i < mr) {                                                                                    \
    __m512 v0 = _mm512_add_ps(c0_##i, bv0), v1 = _mm512_add_ps(c1_##i, bv1);                       \
    if (relu) { /* max(v, 0) returns 0 for NaN and -0, as relu's v > 0 ? v : 0 */                 \
      v0 = _mm512_max_ps(v0, z);                                                                   \
      v1 = _mm512_max_ps(v1, z);                                                                   \
    }                                                                                              \
    float *yr = y + (size_t)(i) * ldy;                                                             \
    if (nr == NR) {                                                                                \
      _mm512_storeu_ps(yr, v0);                                                                    \
      _mm512_storeu_ps(yr + 16, v1);                                                               \
    } else {                                                                                       \
      _mm512_mask_storeu_ps(yr, m0, v0);                                                           \
      _mm512_mask_storeu_ps(yr + 16, m1, v1);                                                      \
    }                                                                                              \
  }
  REP14(OUT)
#undef OUT
}

#define FWD_CASE(n)                                                                                \
  case n:                                                                                          \
    if (relu)                                                                                      \
      fwd_tile(n, a, lda, koff, K, Bp, bias, true, y, ldy, nr);                           \
    else                                                                                           \
      fwd_tile(n, a, lda, koff, K, Bp, bias, false, y, ldy, nr);                          \
    break;

AVX512 static void fwd_dispatch(int mr, const float *a, int lda, const int *koff, int K,
                                const float *Bp, const float *bias, bool relu, float *y, int ldy,
                                int nr) {
  switch (mr) {
    FWD_CASE(14)
    FWD_CASE(13)
    FWD_CASE(12)
    FWD_CASE(11)
    FWD_CASE(10)
    FWD_CASE(9)
    FWD_CASE(8)
    FWD_CASE(7)
    FWD_CASE(6)
    FWD_CASE(5)
    FWD_CASE(4)
    FWD_CASE(3)
    FWD_CASE(2)
    FWD_CASE(1)
  default:
    break;
  }
}
#undef FWD_CASE

/* The same forward tile for CPUs with AVX2 and FMA but no AVX-512F: 16 registers hold a 6 x 16
 * tile (12 accumulators, 2 vectors of B, 1 broadcast), so a 14 x 32 tile of the packed layout is
 * done as up to 3 x 2 of these, each a whole run over the window. */
#define AVX2 __attribute__((target("avx2,fma")))
#define MR2 6
#define REP6(X) X(0) X(1) X(2) X(3) X(4) X(5)

AVX2 static inline __m256i lanes8(int n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
}

AVX2 static inline __attribute__((always_inline)) void fwd_tile2(
    const int mr, const float *restrict a, int lda, const int *restrict koff, int K,
    const float *restrict Bp, const float *bias, bool relu, float *y, int ldy, int nr) {
#define DECL(i) __m256 c0_##i = _mm256_setzero_ps(), c1_##i = _mm256_setzero_ps();
  REP6(DECL)
#undef DECL
  for (int k = 0; k < K; k++, Bp += NR) {
    const float *ak = a + koff[k];
    __m256 b0 = _mm256_load_ps(Bp), b1 = _mm256_load_ps(Bp + 8);
#define STEP(i)                                                                                    \
  if (i < mr) {                                                                                    \
    __m256 av = _mm256_broadcast_ss(ak + (size_t)(i) * lda);                                       \
    c0_##i = _mm256_fmadd_ps(av, b0, c0_##i);                                                      \
    c1_##i = _mm256_fmadd_ps(av, b1, c1_##i);                                                      \
  }
    REP6(STEP)
#undef STEP
  }
  __m256i m0 = lanes8(nr), m1 = lanes8(nr - 8);
  __m256 bv0 = _mm256_setzero_ps(), bv1 = _mm256_setzero_ps();
  if (bias) {
    bv0 = _mm256_maskload_ps(bias, m0);
    bv1 = _mm256_maskload_ps(bias + 8, m1);
  }
  __m256 z = _mm256_setzero_ps();
#define OUT(i)                                                                                     \
  if (i < mr) {                                                                                    \
    __m256 v0 = _mm256_add_ps(c0_##i, bv0), v1 = _mm256_add_ps(c1_##i, bv1);                       \
    if (relu) { /* as the AVX-512 tile: max(v, 0) */                                               \
      v0 = _mm256_max_ps(v0, z);                                                                   \
      v1 = _mm256_max_ps(v1, z);                                                                   \
    }                                                                                              \
    float *yr = y + (size_t)(i) * ldy;                                                             \
    if (nr == 16) {                                                                                \
      _mm256_storeu_ps(yr, v0);                                                                    \
      _mm256_storeu_ps(yr + 8, v1);                                                                \
    } else {                                                                                       \
      _mm256_maskstore_ps(yr, m0, v0);                                                             \
      _mm256_maskstore_ps(yr + 8, m1, v1);                                                         \
    }                                                                                              \
  }
  REP6(OUT)
#undef OUT
}

#define FWD2_CASE(n)                                                                               \
  case n:                                                                                          \
    if (relu)                                                                                      \
      fwd_tile2(n, ai, lda, koff, K, bp, bi, true, yi, ldy, w);                                    \
    else                                                                                           \
      fwd_tile2(n, ai, lda, koff, K, bp, bi, false, yi, ldy, w);                                   \
    break;

/* One 14 x 32 tile of fwd_dispatch's as 6 x 16 pieces: each half of the panel (B at column 0 or
 * 16, stride NR as packed), rows 6 at a time. */
AVX2 static void fwd_dispatch2(int mr, const float *a, int lda, const int *koff, int K,
                               const float *Bp, const float *bias, bool relu, float *y, int ldy,
                               int nr) {
  for (int h = 0; h * 16 < nr; h++)
    for (int i0 = 0; i0 < mr; i0 += MR2) {
      int m = mr - i0 < MR2 ? mr - i0 : MR2, w = nr - h * 16 < 16 ? nr - h * 16 : 16;
      const float *ai = a + (size_t)i0 * lda, *bi = bias ? bias + h * 16 : NULL;
      float *yi = y + (size_t)i0 * ldy + h * 16;
      const float *bp = Bp + h * 16;
      switch (m) {
        FWD2_CASE(6)
        FWD2_CASE(5)
        FWD2_CASE(4)
        FWD2_CASE(3)
        FWD2_CASE(2)
        FWD2_CASE(1)
      default:
        break;
      }
    }
}
#undef FWD2_CASE

/* Weights (OC, K) into NR-channel panels Wp[q][k][j] = W[(q*NR + j)*K + k], zero past OC. */
static void pack_weights(const float *W, int OC, int K, float *Wp) {
  int npan = (OC + NR - 1) / NR;
  if (OC % NR)
    memset(Wp, 0, (size_t)npan * K * NR * sizeof(float));
  for (int o = 0; o < OC; o++) {
    const float *src = W + (size_t)o * K;
    float *d = Wp + (size_t)(o / NR) * K * NR + o % NR;
    for (int k = 0; k < K; k++)
      d[(size_t)k * NR] = src[k];
  }
}

/* Weights (C, k, k, OC) of the input gradient: Wp[q][t'][j] for t' = (kh'*k + kw')*OC + oc and
 * input channel c = q*NR + j is W[oc][k-1-kh'][k-1-kw'][c], zero past C. */
static void pack_weights_flipped(const float *W, int OC, int k, int C, float *Wp) {
  const int K = k * k * C, Kd = k * k * OC, npan = (C + NR - 1) / NR;
  for (int q = 0; q < npan; q++)
    for (int t = 0; t < Kd; t++) {
      int oc = t % OC, tap = t / OC, kh = k - 1 - tap / k, kw = k - 1 - tap % k;
      const float *src = W + (size_t)oc * K + ((size_t)kh * k + kw) * C;
      float *d = Wp + ((size_t)q * Kd + t) * NR;
      for (int j = 0; j < NR; j++) {
        int c = q * NR + j;
        d[j] = c < C ? src[c] : 0.0f;
      }
    }
}

/* nb samples of x (per-sample g->H*W*C) into y (per-sample OH*OW*OC, overwritten) with the
 * weights packed in wpk, then bias (NULL: none) and relu. */
static void conv_run(const geom *g, const ws_parts *w, const float *wpk, const float *x, float *y,
                     int nb, const float *bias, bool relu) {
  const int K = g->k * g->k * g->C, npan = (g->OC + NR - 1) / NR, OC = g->OC;
  const size_t in_sz = (size_t)g->H * g->W * g->C, out_sz = (size_t)g->OH * g->OW * OC;
  const bool avx512 = dt__nn_conv_direct() && !g_force_avx2;
  for (int n = 0; n < nb; n++) {
    pad_input(g, x + (size_t)n * in_sz, w->xp);
    float *ys = y + (size_t)n * out_sz;
    for (int oh = 0; oh < g->OH; oh++)
      for (int ow0 = 0; ow0 < g->OW; ow0 += FMR) {
        int mr = g->OW - ow0 < FMR ? g->OW - ow0 : FMR;
        const float *a = w->xp + w->pixoff[oh * g->OW + ow0];
        float *yt = ys + ((size_t)oh * g->OW + ow0) * OC;
        for (int q = 0; q < npan; q++)
          (avx512 ? fwd_dispatch : fwd_dispatch2)(mr, a, g->S * g->C, w->koff, K, wpk + (size_t)q * K * NR,
                                                  bias ? bias + q * NR : NULL, relu, yt + q * NR, OC,
                                                  OC - q * NR < NR ? OC - q * NR : NR);
      }
  }
}

void dt__nn_conv_forward_direct(const nn_layer *l, const float *P, const nn_slice *s, float *ws) {
  geom g = layer_geom(l);
  ws_parts w = {0};
  ws_layout(&g, ws, &w);
  fill_offsets(&g, &w);
  float *wpk = l->wpk + (size_t)s->t * l->wpk_floats;
  if (s->pack)
    pack_weights(P + l->w_off, g.OC, g.k * g.k * g.C, wpk);
  conv_run(&g, &w, wpk, l->x + (size_t)s->b0 * nn_shape_size(l->in),
           l->y + (size_t)s->b0 * nn_shape_size(l->out), s->nb, P + l->b_off, l->relu_fused);
}

bool dt__nn_conv_dx_direct_ok(const nn_layer *l) { return dx_direct_ok(l); }

void dt__nn_conv_dx_direct(const nn_layer *l, const float *P, const nn_slice *s, float *ws) {
  geom g = dx_geom(l), f = layer_geom(l);
  ws_parts w = {0};
  ws_layout(&g, ws, &w);
  fill_offsets(&g, &w);
  float *wpk = l->wpk + (size_t)s->t * l->wpk_floats + packed_floats(&f);
  if (s->pack)
    pack_weights_flipped(P + l->w_off, l->out.c, l->k, l->in.c, wpk);
  conv_run(&g, &w, wpk, l->dy + (size_t)s->b0 * nn_shape_size(l->out),
           l->dx + (size_t)s->b0 * nn_shape_size(l->in), s->nb, NULL, false);
}

/* ---- weight gradient ---- */

/* acc[i][j] = sum over the sample's np output pixels p of xt[i][pixoff[p]] * dy[p*OC + j], for
 * i < mr, j < 32 (columns past nr read as zero); xt[i] points at tap i in the padded sample. */
AVX512 static inline __attribute__((always_inline)) void dw_tile(
    const int mr, const float *const *xt, const int *restrict pixoff, int np,
    const float *restrict dy, int OC, int nr, float *acc) {
#define DECL(i)                                                                                    \
  __m512 c0_##i = _mm512_setzero_ps(), c1_##i = _mm512_setzero_ps();                               \
  const float *xr_##i = i < mr ? xt[i] : NULL;
  REP10(DECL)
#undef DECL
  __mmask16 m0 = lanes(nr), m1 = lanes(nr - 16);
  for (int p = 0; p < np; p++, dy += OC) {
    const int pix = pixoff[p];
    __m512 b0 = _mm512_maskz_loadu_ps(m0, dy), b1 = _mm512_maskz_loadu_ps(m1, dy + 16);
#define STEP(i)                                                                                    \
  if (i < mr) {                                                                                    \
    __m512 av = _mm512_set1_ps(xr_##i[pix]);                                                       \
    c0_##i = _mm512_fmadd_ps(av, b0, c0_##i);                                                      \
    c1_##i = _mm512_fmadd_ps(av, b1, c1_##i);                                                      \
  }
    REP10(STEP)
#undef STEP
  }
#define OUT(i)                                                                                     \
  if (i < mr) {                                                                                    \
    _mm512_storeu_ps(acc + (size_t)(i) * NR, c0_##i);                                              \
    _mm512_storeu_ps(acc + (size_t)(i) * NR + 16, c1_##i);                                         \
  }
  REP10(OUT)
#undef OUT
}

#define DW_CASE(n)                                                                                 \
  case n: dw_tile(n, xt, pixoff, np, dy, OC, nr, acc); break;

AVX512 static void dw_dispatch(int mr, const float *const *xt, const int *pixoff, int np,
                               const float *dy, int OC, int nr, float *acc) {
  switch (mr) {
    DW_CASE(10)
    DW_CASE(9)
    DW_CASE(8)
    DW_CASE(7)
    DW_CASE(6)
    DW_CASE(5)
    DW_CASE(4)
    DW_CASE(3)
    DW_CASE(2)
    DW_CASE(1)
  default:
    break;
  }
}
#undef DW_CASE

/* Long window runs (k*C >= 32): the other way round, dW[oc0 + i][t0 + j] += sum over pixels p of
 * dy[p*OC + oc0 + i] * xb[pixoff[p] + j] for i < mr output channels and j < nr <= 32 consecutive
 * taps of one kernel row (contiguous in the padded sample), added straight into dW's rows. */
AVX512 static inline __attribute__((always_inline)) void dwa_tile(
    const int mr, const float *restrict xb, const int *restrict pixoff, int np,
    const float *restrict dy, int OC, int nr, float *dW, int K) {
#define DECL(i) __m512 c0_##i = _mm512_setzero_ps(), c1_##i = _mm512_setzero_ps();
  REP14(DECL)
#undef DECL
  __mmask16 m0 = lanes(nr), m1 = lanes(nr - 16);
  for (int p = 0; p < np; p++, dy += OC) {
    const float *xr = xb + pixoff[p];
    __m512 b0 = _mm512_maskz_loadu_ps(m0, xr), b1 = _mm512_maskz_loadu_ps(m1, xr + 16);
#define STEP(i)                                                                                    \
  if (i < mr) {                                                                                    \
    __m512 av = _mm512_set1_ps(dy[i]);                                                             \
    c0_##i = _mm512_fmadd_ps(av, b0, c0_##i);                                                      \
    c1_##i = _mm512_fmadd_ps(av, b1, c1_##i);                                                      \
  }
    REP14(STEP)
#undef STEP
  }
#define OUT(i)                                                                                     \
  if (i < mr) {                                                                                    \
    float *d = dW + (size_t)(i) * K;                                                               \
    _mm512_mask_storeu_ps(d, m0, _mm512_add_ps(_mm512_maskz_loadu_ps(m0, d), c0_##i));             \
    _mm512_mask_storeu_ps(d + 16, m1, _mm512_add_ps(_mm512_maskz_loadu_ps(m1, d + 16), c1_##i));   \
  }
  REP14(OUT)
#undef OUT
}

#define DWA_CASE(n)                                                                                \
  case n: dwa_tile(n, xb, pixoff, np, dy, OC, nr, dW, K); break;

AVX512 static void dwa_dispatch(int mr, const float *xb, const int *pixoff, int np,
                                const float *dy, int OC, int nr, float *dW, int K) {
  switch (mr) {
    DWA_CASE(14)
    DWA_CASE(13)
    DWA_CASE(12)
    DWA_CASE(11)
    DWA_CASE(10)
    DWA_CASE(9)
    DWA_CASE(8)
    DWA_CASE(7)
    DWA_CASE(6)
    DWA_CASE(5)
    DWA_CASE(4)
    DWA_CASE(3)
    DWA_CASE(2)
    DWA_CASE(1)
  default:
    break;
  }
}
#undef DWA_CASE

void dt__nn_conv_dweight_direct(const nn_layer *l, const nn_slice *s, float *ws) {
  geom g = layer_geom(l);
  const int C = g.C, k = g.k, OC = g.OC, np = g.OH * g.OW, K = k * k * C, seg = k * C;
  const int npan = (OC + NR - 1) / NR;
  const size_t in_sz = nn_shape_size(l->in), out_sz = nn_shape_size(l->out);
  ws_parts w = {0};
  ws_layout(&g, ws, &w);
  fill_offsets(&g, &w);
  float *dW = s->grads + l->w_off, *db = s->grads + l->b_off;
  const bool by_oc = seg >= NR;
  const int ntile = by_oc ? (OC + FMR - 1) / FMR : (K + WMR - 1) / WMR;
  for (int n = s->b0; n < s->b0 + s->nb; n++) {
    pad_input(&g, l->x + (size_t)n * in_sz, w.xp);
    const float *dys = l->dy + (size_t)n * out_sz;
    if (by_oc) {
      /* a tap panel's 32 floats per pixel stay in L1 while every channel tile passes over it */
      for (int kh = 0; kh < k; kh++)
        for (int j0 = 0; j0 < seg; j0 += NR) {
          int nr = seg - j0 < NR ? seg - j0 : NR, t0 = kh * seg + j0;
          for (int ti = 0; ti < ntile; ti++) {
            int o0 = (int)((int64_t)OC * ti / ntile), mr = (int)((int64_t)OC * (ti + 1) / ntile) - o0;
            dwa_dispatch(mr, w.xp + w.koff[t0], w.pixoff, np, dys + o0, OC, nr,
                         dW + (size_t)o0 * K + t0, K);
          }
        }
    } else {
      for (int ti = 0; ti < ntile; ti++) {
        int k0 = (int)((int64_t)K * ti / ntile), mr = (int)((int64_t)K * (ti + 1) / ntile) - k0;
        const float *xt[WMR];
        for (int i = 0; i < mr; i++)
          xt[i] = w.xp + w.koff[k0 + i];
        for (int q = 0; q < npan; q++) {
          int nr = OC - q * NR < NR ? OC - q * NR : NR;
          dw_dispatch(mr, xt, w.pixoff, np, dys + q * NR, OC, nr, w.acc);
          for (int j = 0; j < nr; j++) {
            float *d = dW + (size_t)(q * NR + j) * K + k0;
            for (int i = 0; i < mr; i++)
              d[i] += w.acc[(size_t)i * NR + j];
          }
        }
      }
    }
    /* the bias gradient while this sample's dy is in cache, rows in the same order as before */
    for (int p = 0; p < np; p++)
      for (int o = 0; o < OC; o++)
        db[o] += dys[(size_t)p * OC + o];
  }
}
