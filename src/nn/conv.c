/* conv.c - convolution without im2col, on CPUs where dtrain runs its own AVX-512 product.
 * B = batch, C = input channels, OC = output channels, K = k*k*C (one window), P = pad.
 *
 * Forward is an implicit GEMM: a sample's input is copied once into a zero-bordered buffer, and
 * the micro-kernel reads each output pixel's window straight from it. Within one kernel row kh,
 * the window of output pixel (oh, ow) is k*C contiguous floats (channels-last), and neighbouring
 * pixels' windows are S*C floats apart, so a run of up to 14 pixels of one output row is a
 * 14 x K operand with row stride S*C, read k runs at a time. The 14 x 32 tile of outputs stays
 * in registers over the whole window and gets bias (and the fused relu) before its only store.
 * This replaces writing and re-reading a K-times larger im2col matrix and a separate bias pass
 * (cnn preset, 128 samples, 1 thread, median of 15, two interleaved runs on a busy machine:
 * conv1 forward 4.6 -> 1.0 ms, conv2 forward 15.7 -> 12.2 ms; conv1 weight gradient 6.2 -> 3.5).
 *
 * The weight gradient of layers with a short window (K small: the first layer of an image
 * model, where an im2col GEMM has N = 25 and runs at a sixth of the kernel's peak) is a
 * register-blocked reduction over pixels: a tile of up to 10 window taps x 32 output channels
 * accumulates dy[pixel] (two vectors) times the tap's input value over one sample's pixels, then
 * is added to dW. Each sample's partial sum is added separately, as the im2col path adds each
 * chunk's, so rounding stays of the same size.
 *
 * It deliberately does not do the input gradient (layers.c keeps the GEMM + col2im for that),
 * and does nothing without AVX-512F: callers check dt__nn_conv_direct() first. */
/* GCC 12 needs O3 to unroll the kernels' loops over the tile rows; it then keeps the tile in
 * registers only if the loop around them has no inner control flow (a nested loop or a branch
 * made it store every accumulator to the stack on every step), hence the offset tables. */
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

static size_t padded_floats(const nn_layer *l) {
  return (size_t)(l->in.h + 2 * l->pad) * (size_t)(l->in.w + 2 * l->pad) * (size_t)l->in.c;
}

/* Workspace layout: packed weights, padded sample, dW tile, window offsets (K ints), pixel
 * offsets (OH*OW ints). */
typedef struct ws_parts {
  float *wpk, *xp, *acc;
  int *koff, *pixoff;
} ws_parts;

static size_t ws_layout(const nn_layer *l, float *ws, ws_parts *w) {
  size_t K = (size_t)l->k * l->k * l->in.c, npan = ((size_t)l->out.c + NR - 1) / NR;
  size_t o_xp = up16(npan * NR * K), o_acc = o_xp + up16(padded_floats(l));
  size_t o_koff = o_acc + (size_t)WMR * NR, o_pix = o_koff + up16(K);
  size_t total = o_pix + up16((size_t)l->out.h * l->out.w);
  if (ws) {
    w->wpk = ws;
    w->xp = ws + o_xp;
    w->acc = ws + o_acc;
    w->koff = (int *)(ws + o_koff);
    w->pixoff = (int *)(ws + o_pix);
  }
  return total;
}

size_t dt__nn_conv_ws_floats(const nn_layer *l) { return ws_layout(l, NULL, NULL); }

/* koff[t]: offset of window tap t = (kh*k + kw)*C + c from the window's top-left in the padded
 * sample; pixoff[p]: offset of output pixel p's window. */
static void fill_offsets(const nn_layer *l, const ws_parts *w) {
  const int C = l->in.c, k = l->k, S = l->stride, Wp = l->in.w + 2 * l->pad;
  for (int t = 0; t < k * k * C; t++)
    w->koff[t] = (t / (k * C)) * Wp * C + t % (k * C);
  for (int oh = 0; oh < l->out.h; oh++)
    for (int ow = 0; ow < l->out.w; ow++)
      w->pixoff[oh * l->out.w + ow] = (oh * S * Wp + ow * S) * C;
}

/* x (H, W, C) of one sample into xp (H+2P, W+2P, C) with zero borders. */
static void pad_input(const nn_layer *l, const float *x, float *xp) {
  const size_t C = (size_t)l->in.c, H = (size_t)l->in.h, W = (size_t)l->in.w, P = (size_t)l->pad;
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
  __m512 bv0 = _mm512_maskz_loadu_ps(m0, bias), bv1 = _mm512_maskz_loadu_ps(m1, bias + 16);
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

/* Weights (OC, K) into NR-channel panels Wp[q][k][j] = W[(q*NR + j)*K + k], zero past OC. */
static void pack_weights(const float *W, int OC, int K, float *Wp) {
  int npan = (OC + NR - 1) / NR;
  for (int q = 0; q < npan; q++)
    for (int k = 0; k < K; k++) {
      float *d = Wp + ((size_t)q * K + k) * NR;
      for (int j = 0; j < NR; j++) {
        int o = q * NR + j;
        d[j] = o < OC ? W[(size_t)o * K + k] : 0.0f;
      }
    }
}

void dt__nn_conv_forward_direct(const nn_layer *l, const float *P, const nn_slice *s, float *ws) {
  const int C = l->in.c, k = l->k, S = l->stride, OC = l->out.c, OH = l->out.h, OW = l->out.w;
  const int K = k * k * C, npan = (OC + NR - 1) / NR;
  const size_t in_sz = nn_shape_size(l->in), out_sz = nn_shape_size(l->out);
  ws_parts w;
  ws_layout(l, ws, &w);
  fill_offsets(l, &w);
  pack_weights(P + l->w_off, OC, K, w.wpk);
  const float *bias = P + l->b_off;
  for (int n = s->b0; n < s->b0 + s->nb; n++) {
    pad_input(l, l->x + (size_t)n * in_sz, w.xp);
    float *ys = l->y + (size_t)n * out_sz;
    for (int oh = 0; oh < OH; oh++)
      for (int ow0 = 0; ow0 < OW; ow0 += FMR) {
        int mr = OW - ow0 < FMR ? OW - ow0 : FMR;
        const float *a = w.xp + w.pixoff[oh * OW + ow0];
        float *y = ys + ((size_t)oh * OW + ow0) * OC;
        for (int q = 0; q < npan; q++)
          fwd_dispatch(mr, a, S * C, w.koff, K, w.wpk + (size_t)q * K * NR, bias + q * NR,
                       l->relu_fused, y + q * NR, OC, OC - q * NR < NR ? OC - q * NR : NR);
      }
  }
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

bool dt__nn_conv_dweight_direct_ok(const nn_layer *l) {
  /* Above this the im2col GEMM's K-blocked kernel is as fast and keeps one pass over dy. */
  return (size_t)l->k * l->k * l->in.c <= 64;
}

void dt__nn_conv_dweight_direct(const nn_layer *l, const nn_slice *s, float *ws) {
  const int C = l->in.c, k = l->k, OC = l->out.c, np = l->out.h * l->out.w;
  const int K = k * k * C, npan = (OC + NR - 1) / NR;
  const size_t in_sz = nn_shape_size(l->in), out_sz = nn_shape_size(l->out);
  ws_parts w;
  ws_layout(l, ws, &w);
  fill_offsets(l, &w);
  float *dW = s->grads + l->w_off;
  const int ntile = (K + WMR - 1) / WMR;
  for (int n = s->b0; n < s->b0 + s->nb; n++) {
    pad_input(l, l->x + (size_t)n * in_sz, w.xp);
    const float *dys = l->dy + (size_t)n * out_sz;
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
}
