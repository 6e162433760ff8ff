/* layers.c - forward and backward kernels of every layer, and the softmax cross-entropy loss.
 * B = batch, C = channels, H/W = height/width, K = KH*KW*IC (one im2col row), F = features.
 * Activations are channels-last: sample n, pixel (h, w), channel c is at ((n*H + h)*W + w)*C + c.
 * Every kernel works on one thread's slice of the batch (nn_slice: samples [b0, b0+nb)).
 * Kernels only read and write buffers the model allocated up front: they never allocate, never
 * fail, and trust the shapes checked by the spec parser. Backward kernels ADD parameter gradients
 * (accumulation across micro-batches) and OVERWRITE input gradients. */
/* The elementwise loops here need the vectorizer's full cost model (-O2 in GCC 12 only
 * vectorizes loops without epilogues): bias+relu, pooling and updates ran 3-5x slower without. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "nn/nn.h"

/* ---- linear: y (B, OUT) = x (B, IN) W^T + b, W (OUT, IN) ---- */

/* y[r][j] += b[j] (then relu) for rows r and columns j < n, rows ld floats apart. */
static void bias_act(float *y, const float *b, size_t rows, int n, size_t ld, bool relu) {
  for (size_t r = 0; r < rows; r++) {
    float *yr = y + r * ld;
    if (relu)
      for (int j = 0; j < n; j++) {
        float v = yr[j] + b[j];
        yr[j] = v > 0.0f ? v : 0.0f;
      }
    else
      for (int j = 0; j < n; j++)
        yr[j] += b[j];
  }
}

/* db[j] += sum over rows of dy[r][j] */
static void bias_grad(float *db, const float *dy, size_t rows, int n) {
  for (size_t r = 0; r < rows; r++) {
    const float *d = dy + r * (size_t)n;
    for (int j = 0; j < n; j++)
      db[j] += d[j];
  }
}

/* Row pointers of a slice: sample b0 of a buffer with sz floats per sample. */
#define ROWS(buf, sz) ((buf) + (size_t)s->b0 * (sz))

/* A linear layer's products are split across threads by columns, not by samples: thread t
 * computes columns [*c0, *c1) of an n-wide result for every sample of the batch (whole 16-float
 * groups, so that no two threads write one cache line of a row; one thread: all of them), and so
 * packs only its part of the weights, where a split by samples had every thread pack all of them
 * for half the rows (mlp, 2 threads, 2026-11-30: BENCHMARKS-LOG.md, "Issues 3 and 4 on the Xeon
 * FP16"). With several threads model.c puts a barrier before such a layer (every thread's rows
 * of its input ready) and after it (every column of its output ready) where the next layer
 * needs them. */
static void split_cols(int n, const nn_slice *s, int *c0, int *c1) {
  *c0 = (int)(((int64_t)n * s->t / s->T) & ~(int64_t)15);
  *c1 = s->t + 1 == s->T ? n : (int)(((int64_t)n * (s->t + 1) / s->T) & ~(int64_t)15);
}

static void linear_forward(nn_layer *l, const float *P, const nn_slice *s) {
  int in = l->in.c, out = l->out.c, c0, c1;
  split_cols(out, s, &c0, &c1);
  if (c1 <= c0)
    return;
  dt__nn_sgemm(false, true, s->B, c1 - c0, in, 1.0f, l->x, in, P + l->w_off + (size_t)c0 * in, in, 0.0f,
               l->y + c0, out);
  bias_act(l->y + c0, P + l->b_off + c0, (size_t)s->B, c1 - c0, (size_t)out, l->relu_fused);
}

/* With several threads, thread t computes output rows [o0, o1) of dW and db from all B
 * samples (every thread's dy is ready: the caller put a barrier before this layer), and its
 * columns of dx for all samples (split_cols). */
static void linear_backward(nn_layer *l, const float *P, const nn_slice *s, bool need_dx) {
  int in = l->in.c, out = l->out.c;
  int o0 = (int)((int64_t)out * s->t / s->T), o1 = (int)((int64_t)out * (s->t + 1) / s->T);
  if (s->exp && s->nb > 0) { /* deferred dW: this slice's rows of x and dy go to the export */
    memcpy(s->exp + l->ex_x + (size_t)s->b0 * in, ROWS(l->x, in), (size_t)s->nb * in * sizeof(float));
    memcpy(s->exp + l->ex_dy + (size_t)s->b0 * out, ROWS(l->dy, out), (size_t)s->nb * out * sizeof(float));
  }
  if (o1 > o0) {
    if (!s->exp)
      dt__nn_sgemm(true, false, o1 - o0, in, s->B, 1.0f, l->dy + o0, out, l->x, in,
                   s->fresh ? 0.0f : 1.0f, s->model_grads + l->w_off + (size_t)o0 * in, in);
    float *db = s->model_grads + l->b_off;
    if (s->fresh)
      memset(db + o0, 0, (size_t)(o1 - o0) * sizeof(float));
    for (int r = 0; r < s->B; r++) {
      const float *d = l->dy + (size_t)r * out;
      for (int k = o0; k < o1; k++)
        db[k] += d[k];
    }
  }
  int c0, c1;
  split_cols(in, s, &c0, &c1);
  if (need_dx && c1 > c0)
    dt__nn_sgemm(false, false, s->B, c1 - c0, out, 1.0f, l->dy, out, P + l->w_off + c0, in, 0.0f, l->dx + c0, in);
}

/* ---- conv2d: im2col over a chunk of samples, then one sgemm per chunk ----
 * A col row holds the KxK window of one output pixel in (kh, kw, ic) order, which matches the
 * weight layout (OC, KH, KW, IC): within a kernel row the window is contiguous in NHWC memory,
 * so each (pixel, kh) is one memcpy of up to K*IC floats plus zero borders. */

static void im2col(const nn_layer *l, const float *x, int nb, float *col) {
  const int H = l->in.h, W = l->in.w, C = l->in.c, k = l->k, S = l->stride, Pd = l->pad;
  const int OH = l->out.h, OW = l->out.w;
  const size_t rowlen = (size_t)k * k * C, seg = (size_t)k * C;
  for (int n = 0; n < nb; n++) {
    const float *xs = x + (size_t)n * H * W * C;
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++) {
        float *r = col + (((size_t)n * OH + oh) * OW + ow) * rowlen;
        int iw0 = ow * S - Pd;
        int kw_lo = iw0 < 0 ? -iw0 : 0;
        int kw_hi = W - iw0 < k ? W - iw0 : k; /* exclusive */
        for (int kh = 0; kh < k; kh++, r += seg) {
          int ih = oh * S - Pd + kh;
          if (ih < 0 || ih >= H || kw_hi <= kw_lo) {
            memset(r, 0, seg * sizeof(float));
            continue;
          }
          if (kw_lo > 0)
            memset(r, 0, (size_t)kw_lo * C * sizeof(float));
          const float *src = xs + ((size_t)ih * W + iw0 + kw_lo) * C;
          size_t len = (size_t)(kw_hi - kw_lo) * C;
          if (len < 32) /* few channels (the first conv): a call per segment costs more */
            for (size_t i = 0; i < len; i++)
              r[(size_t)kw_lo * C + i] = src[i];
          else
            memcpy(r + (size_t)kw_lo * C, src, len * sizeof(float));
          if (kw_hi < k)
            memset(r + (size_t)kw_hi * C, 0, (size_t)(k - kw_hi) * C * sizeof(float));
        }
      }
  }
}

/* dx (already zeroed) += the windows in dcol, the adjoint of im2col. */
static void col2im(const nn_layer *l, const float *dcol, int nb, float *dx) {
  const int H = l->in.h, W = l->in.w, C = l->in.c, k = l->k, S = l->stride, Pd = l->pad;
  const int OH = l->out.h, OW = l->out.w;
  const size_t rowlen = (size_t)k * k * C, seg = (size_t)k * C;
  for (int n = 0; n < nb; n++) {
    float *ds = dx + (size_t)n * H * W * C;
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++) {
        const float *r = dcol + (((size_t)n * OH + oh) * OW + ow) * rowlen;
        int iw0 = ow * S - Pd;
        int kw_lo = iw0 < 0 ? -iw0 : 0;
        int kw_hi = W - iw0 < k ? W - iw0 : k;
        for (int kh = 0; kh < k; kh++, r += seg) {
          int ih = oh * S - Pd + kh;
          if (ih < 0 || ih >= H || kw_hi <= kw_lo)
            continue;
          float *d = ds + ((size_t)ih * W + iw0 + kw_lo) * C;
          const float *src = r + (size_t)kw_lo * C;
          size_t len = (size_t)(kw_hi - kw_lo) * C;
          for (size_t i = 0; i < len; i++)
            d[i] += src[i];
        }
      }
  }
}

/* Chunks of equal size (within one sample): a short last chunk would run a small, slow sgemm. */
#define CHUNK_START(n, i, k) ((int)((int64_t)(n) * (i) / (k)))

static void conv_forward(nn_layer *l, const float *P, const nn_slice *s) {
  const int OC = l->out.c, K = l->k * l->k * l->in.c;
  const size_t in_sz = nn_shape_size(l->in), out_sz = nn_shape_size(l->out);
  const int pix = l->out.h * l->out.w;
  if (dt__nn_conv_fwd_direct()) {
    dt__nn_conv_forward_direct(l, P, s, s->col);
    return;
  }
  const int nchunks = (s->nb + l->chunk - 1) / l->chunk;
  for (int ci = 0; ci < nchunks; ci++) {
    int c0 = CHUNK_START(s->nb, ci, nchunks), nb = CHUNK_START(s->nb, ci + 1, nchunks) - c0;
    size_t b = (size_t)s->b0 + (size_t)c0;
    im2col(l, l->x + b * in_sz, nb, s->col);
    float *y = l->y + b * out_sz;
    dt__nn_sgemm(false, true, nb * pix, OC, K, 1.0f, s->col, K,
                P + l->w_off, K, 0.0f, y, OC);
    bias_act(y, P + l->b_off, (size_t)nb * pix, OC, (size_t)OC, l->relu_fused);
  }
}

static void conv_backward(nn_layer *l, const float *P, const nn_slice *s, bool need_dx) {
  const int OC = l->out.c, K = l->k * l->k * l->in.c;
  const size_t in_sz = nn_shape_size(l->in), out_sz = nn_shape_size(l->out);
  const int pix = l->out.h * l->out.w;
  /* Without im2col (conv.c): the input gradient of a stride-1 layer with AVX-512 or AVX2, the
   * weight gradient with AVX-512; the rest by im2col and products below */
  if (need_dx && dt__nn_conv_fwd_direct() && dt__nn_conv_dx_direct_ok(l)) {
    dt__nn_conv_dx_direct(l, P, s, s->col);
    need_dx = false;
  }
  const bool dw_direct = dt__nn_conv_direct();
  if (dw_direct)
    dt__nn_conv_dweight_direct(l, s, s->col);
  if (dw_direct && !need_dx)
    return;
  const int nchunks = (s->nb + l->chunk - 1) / l->chunk;
  for (int ci = 0; ci < nchunks; ci++) {
    int c0 = CHUNK_START(s->nb, ci, nchunks), nb = CHUNK_START(s->nb, ci + 1, nchunks) - c0;
    size_t b = (size_t)s->b0 + (size_t)c0;
    int rows = nb * pix;
    const float *dy = l->dy + b * out_sz;
    if (!dw_direct) {
      im2col(l, l->x + b * in_sz, nb, s->col);
      dt__nn_sgemm(true, false, OC, K, rows, 1.0f, dy, OC, s->col, K,
                  1.0f, s->grads + l->w_off, K);
      bias_grad(s->grads + l->b_off, dy, (size_t)rows, OC);
    }
    if (need_dx) {
      dt__nn_sgemm(false, false, rows, K, OC, 1.0f, dy, OC,
                  P + l->w_off, K, 0.0f, s->dcol, K);
      float *dx = l->dx + b * in_sz;
      memset(dx, 0, (size_t)nb * in_sz * sizeof(float));
      col2im(l, s->dcol, nb, dx);
    }
  }
}

/* ---- pooling (no padding): windows k x k, stride S ---- */

/* Max and arg-max over one window, 4 channels at a time in SSE-sized GCC vectors (the baseline
 * x86-64 target lowers them to single instructions; 64-byte vectors it split into spilled scalar
 * code, and the plain loop over y and idx stayed scalar for fear of aliasing: it was a tenth of a
 * cnn step). A last group of fewer than 4 channels runs the scalar loop. */
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

/* 16 channels per step where the CPU has AVX-512F (what dt__nn_conv_direct() also means) and
 * 16 | C: the same comparisons (strictly greater, so the first maximum wins and NaN never does)
 * on four times the lanes. cnn preset, 128 samples, 1 thread: pool1 forward 4.0 -> 1.0 ms, pool2
 * 1.3 -> 0.4 ms (two interleaved runs on a busy machine). */
__attribute__((target("avx512f"))) static void maxpool_forward16(nn_layer *l, const nn_slice *s) {
  const int H = l->in.h, W = l->in.w, C = l->in.c, k = l->k, S = l->stride;
  const int OH = l->out.h, OW = l->out.w;
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int n = s->b0; n < s->b0 + s->nb; n++) {
    const float *xs = l->x + (size_t)n * H * W * C;
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++) {
        size_t o = (((size_t)n * OH + oh) * OW + ow) * C;
        int32_t base = (int32_t)(((size_t)(oh * S) * W + (size_t)(ow * S)) * C);
        for (int c0 = 0; c0 < C; c0 += 16) {
          __m512 m = _mm512_loadu_ps(xs + base + c0);
          __m512i mi = _mm512_add_epi32(lane, _mm512_set1_epi32(base + c0));
          for (int kh = 0; kh < k; kh++)
            for (int kw = 0; kw < k; kw++) {
              int32_t off = base + (int32_t)(((size_t)kh * W + (size_t)kw) * C) + c0;
              __m512 v = _mm512_loadu_ps(xs + off);
              __mmask16 gt = _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ);
              m = _mm512_mask_mov_ps(m, gt, v);
              mi = _mm512_mask_mov_epi32(mi, gt, _mm512_add_epi32(lane, _mm512_set1_epi32(off)));
            }
          _mm512_storeu_ps(l->y + o + c0, m);
          _mm512_storeu_si512((void *)(l->idx + o + c0), mi);
        }
      }
  }
}

static void maxpool_forward(nn_layer *l, const nn_slice *s) {
  const int H = l->in.h, W = l->in.w, C = l->in.c, k = l->k, S = l->stride;
  const int OH = l->out.h, OW = l->out.w;
  const v4i lane = {0, 1, 2, 3};
  if (C % 16 == 0 && dt__nn_conv_direct()) {
    maxpool_forward16(l, s);
    return;
  }
  for (int n = s->b0; n < s->b0 + s->nb; n++) {
    const float *xs = l->x + (size_t)n * H * W * C;
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++) {
        size_t o = (((size_t)n * OH + oh) * OW + ow) * C;
        float *y = l->y + o;
        int32_t *ix = l->idx + o;
        int32_t base = (int32_t)(((size_t)(oh * S) * W + (size_t)(ow * S)) * C);
        int c0 = 0;
        for (; c0 + 4 <= C; c0 += 4) {
          v4f m, v;
          memcpy(&m, xs + base + c0, sizeof m);
          v4i mi = lane + (base + c0);
          for (int kh = 0; kh < k; kh++)
            for (int kw = 0; kw < k; kw++) {
              int32_t off = base + (int32_t)(((size_t)kh * W + (size_t)kw) * C) + c0;
              memcpy(&v, xs + off, sizeof v);
              v4i gt = v > m; /* all ones where strictly greater: the first maximum is kept */
              m = (v4f)(((v4i)v & gt) | ((v4i)m & ~gt));
              mi = ((lane + off) & gt) | (mi & ~gt);
            }
          memcpy(y + c0, &m, sizeof m);
          memcpy(ix + c0, &mi, sizeof mi);
        }
        for (int c = c0; c < C; c++) {
          y[c] = xs[base + c];
          ix[c] = base + c;
          for (int kh = 0; kh < k; kh++)
            for (int kw = 0; kw < k; kw++) {
              int32_t off = base + (int32_t)(((size_t)kh * W + (size_t)kw) * C) + c;
              if (xs[off] > y[c]) {
                y[c] = xs[off];
                ix[c] = off;
              }
            }
        }
      }
  }
}

/* Stride == window with 4 | C (the cnn preset's pools): the windows tile the input, so each input
 * position is written once, with its window's gradient where it was the arg-max and 0 elsewhere,
 * instead of zeroing dx and scattering into it (two passes over dx, the second one scalar).
 * Rows and columns past the last whole window get zeros. */
static void maxpool_backward_tiled(nn_layer *l, const nn_slice *s) {
  const int H = l->in.h, W = l->in.w, C = l->in.c, k = l->k;
  const int OH = l->out.h, OW = l->out.w;
  const size_t in_sz = nn_shape_size(l->in), out_sz = nn_shape_size(l->out);
  const v4i lane = {0, 1, 2, 3};
  for (int n = s->b0; n < s->b0 + s->nb; n++) {
    float *dx = l->dx + (size_t)n * in_sz;
    const float *dy = l->dy + (size_t)n * out_sz;
    const int32_t *ix = l->idx + (size_t)n * out_sz;
    const float *ys = l->y + (size_t)n * out_sz;
    for (int ih = 0; ih < H; ih++) {
      float *drow = dx + (size_t)ih * W * C;
      int oh = ih / k;
      if (oh >= OH) {
        memset(drow, 0, (size_t)W * C * sizeof(float));
        continue;
      }
      for (int iw = 0; iw < OW * k; iw++) {
        int ow = iw / k;
        const float *g = dy + ((size_t)oh * OW + ow) * C;
        const int32_t *m = ix + ((size_t)oh * OW + ow) * C;
        const float *yv = ys + ((size_t)oh * OW + ow) * C;
        float *d = drow + (size_t)iw * C;
        int32_t pos = (int32_t)(((size_t)ih * W + (size_t)iw) * C);
        for (int c = 0; c < C; c += 4) {
          v4f gv;
          v4i mv;
          memcpy(&gv, g + c, sizeof gv);
          memcpy(&mv, m + c, sizeof mv);
          v4i sel = mv == lane + (pos + c);
          if (l->relu_mask) { /* the relu's y > 0 at the arg-max is the pooled value > 0 */
            v4f pv;
            memcpy(&pv, yv + c, sizeof pv);
            sel &= pv > 0.0f;
          }
          v4f out = (v4f)((v4i)gv & sel);
          memcpy(d + c, &out, sizeof out);
        }
      }
      if (OW * k < W)
        memset(drow + (size_t)OW * k * C, 0, (size_t)(W - OW * k) * C * sizeof(float));
    }
  }
}

static void maxpool_backward(nn_layer *l, const nn_slice *s) {
  if (l->stride == l->k && l->in.c % 4 == 0) {
    maxpool_backward_tiled(l, s);
    return;
  }
  const size_t in_sz = nn_shape_size(l->in), out_sz = nn_shape_size(l->out);
  memset(ROWS(l->dx, in_sz), 0, (size_t)s->nb * in_sz * sizeof(float));
  for (int n = s->b0; n < s->b0 + s->nb; n++) {
    float *dx = l->dx + (size_t)n * in_sz;
    const float *dy = l->dy + (size_t)n * out_sz;
    const int32_t *ix = l->idx + (size_t)n * out_sz;
    for (size_t i = 0; i < out_sz; i++)
      dx[ix[i]] += dy[i];
  }
}

static void avgpool_forward(nn_layer *l, const nn_slice *s) {
  const int H = l->in.h, W = l->in.w, C = l->in.c, k = l->k, S = l->stride;
  const int OH = l->out.h, OW = l->out.w;
  const float inv = 1.0f / (float)(k * k);
  for (int n = s->b0; n < s->b0 + s->nb; n++) {
    const float *xs = l->x + (size_t)n * H * W * C;
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++) {
        float *y = l->y + (((size_t)n * OH + oh) * OW + ow) * C;
        memset(y, 0, (size_t)C * sizeof(float));
        for (int kh = 0; kh < k; kh++)
          for (int kw = 0; kw < k; kw++) {
            const float *xv = xs + ((size_t)(oh * S + kh) * W + (size_t)(ow * S + kw)) * C;
            for (int c = 0; c < C; c++)
              y[c] += xv[c];
          }
        for (int c = 0; c < C; c++)
          y[c] *= inv;
      }
  }
}

static void avgpool_backward(nn_layer *l, const nn_slice *s) {
  const int H = l->in.h, W = l->in.w, C = l->in.c, k = l->k, S = l->stride;
  const int OH = l->out.h, OW = l->out.w;
  const float inv = 1.0f / (float)(k * k);
  memset(ROWS(l->dx, nn_shape_size(l->in)), 0,
         (size_t)s->nb * nn_shape_size(l->in) * sizeof(float));
  for (int n = s->b0; n < s->b0 + s->nb; n++) {
    float *ds = l->dx + (size_t)n * H * W * C;
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++) {
        const float *dy = l->dy + (((size_t)n * OH + oh) * OW + ow) * C;
        for (int kh = 0; kh < k; kh++)
          for (int kw = 0; kw < k; kw++) {
            float *d = ds + ((size_t)(oh * S + kh) * W + (size_t)(ow * S + kw)) * C;
            for (int c = 0; c < C; c++)
              d[c] += dy[c] * inv;
          }
      }
  }
}

/* ---- elementwise: relu and dropout run in place (y == x, dx == dy); gelu does not ---- */

static void relu_forward(nn_layer *l, const nn_slice *s) {
  size_t sz = nn_shape_size(l->in), n = (size_t)s->nb * sz;
  float *y = ROWS(l->y, sz);
  for (size_t i = 0; i < n; i++)
    y[i] = y[i] > 0.0f ? y[i] : 0.0f;
}

static void relu_backward(nn_layer *l, const nn_slice *s) {
  size_t sz = nn_shape_size(l->in), n = (size_t)s->nb * sz;
  const float *y = ROWS(l->y, sz);
  float *d = ROWS(l->dx, sz);
  for (size_t i = 0; i < n; i++)
    d[i] = y[i] > 0.0f ? d[i] : 0.0f;
}

/* Exact (erf) GELU as PyTorch's default: y = x * Phi(x). */
static void gelu_forward(nn_layer *l, const nn_slice *s) {
  size_t sz = nn_shape_size(l->in), n = (size_t)s->nb * sz;
  const float *x = ROWS(l->x, sz);
  float *y = ROWS(l->y, sz);
  for (size_t i = 0; i < n; i++)
    y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

static void gelu_backward(nn_layer *l, const nn_slice *s) {
  size_t sz = nn_shape_size(l->in), n = (size_t)s->nb * sz;
  const float *x = ROWS(l->x, sz), *dy = ROWS(l->dy, sz);
  float *dx = ROWS(l->dx, sz);
  for (size_t i = 0; i < n; i++) {
    float cdf = 0.5f * (1.0f + erff(x[i] * 0.70710678118654752f));
    float pdf = 0.39894228040143268f * expf(-0.5f * x[i] * x[i]);
    dx[i] = dy[i] * (cdf + x[i] * pdf);
  }
}

/* v when keep is 1, +0.0f when it is 0, without a branch: the masks are random, so a branch
 * would be mispredicted for about every other value (that cost more than drawing the masks). */
static inline float keep_or_zero(float v, uint32_t keep) {
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  u &= 0u - keep;
  memcpy(&v, &u, sizeof v);
  return v;
}

/* Inverted dropout: kept values are scaled by 1/(1-p) in training, eval is the identity. The mask
 * of a sample is a pure function of (forward key, the sample's number, layer): a counter-based
 * stream, word j = dt__mix64(h + (j + 1) * golden) with h hashed from those three, 16 bits per
 * value (4 values per word, two multiplies). The sample's number is s->first + its row, so the
 * masks depend neither on how the batch is split across threads nor on how the caller splits a
 * larger batch into forwards (micro-batches, data-parallel shards: see
 * dt_model_set_dropout_key). */
static void dropout_forward(nn_layer *l, const nn_slice *s, bool train) {
  if (!train || l->p <= 0.0f)
    return;
  const size_t sz = nn_shape_size(l->in);
  const uint32_t thresh = (uint32_t)((double)l->p * 65536.0);
  const float scale = 1.0f / (1.0f - l->p);
  for (int n = s->b0; n < s->b0 + s->nb; n++) {
    uint64_t ctr = dt__mix64(s->key ^ dt__mix64(((uint64_t)l->seq << 48) + s->first + (uint64_t)n));
    float *y = l->y + (size_t)n * sz;
    uint8_t *mask = l->mask + (size_t)n * sz;
    for (size_t i = 0; i < sz; i += 4) {
      uint64_t bits = dt__mix64(ctr += DT__GOLDEN64);
      size_t e = DT_MIN(sz - i, (size_t)4);
      for (size_t k = 0; k < e; k++) {
        uint32_t keep = (uint32_t)(bits >> (16 * k) & 0xffff) >= thresh;
        mask[i + k] = (uint8_t)keep;
        y[i + k] = keep_or_zero(y[i + k] * scale, keep);
      }
    }
  }
}

static void dropout_backward(nn_layer *l, const nn_slice *s) {
  if (l->p <= 0.0f)
    return;
  size_t sz = nn_shape_size(l->in), n = (size_t)s->nb * sz;
  const float scale = 1.0f / (1.0f - l->p);
  float *dx = ROWS(l->dx, sz);
  const uint8_t *mask = l->mask + (size_t)s->b0 * sz;
  for (size_t i = 0; i < n; i++)
    dx[i] = keep_or_zero(dx[i] * scale, mask[i]);
}

/* ---- layernorm over the F features of each sample, eps 1e-5 as PyTorch ---- */

#define LN_EPS 1e-5

static void layernorm_forward(nn_layer *l, const float *P, const nn_slice *s) {
  const int F = l->in.c;
  const float *g = P + l->w_off, *be = P + l->b_off;
  for (int n = s->b0; n < s->b0 + s->nb; n++) {
    const float *x = l->x + (size_t)n * F;
    float *y = l->y + (size_t)n * F;
    double sum = 0.0, s2 = 0.0;
    for (int i = 0; i < F; i++)
      sum += x[i];
    double mean = sum / F;
    for (int i = 0; i < F; i++) {
      double d = x[i] - mean;
      s2 += d * d;
    }
    float rstd = (float)(1.0 / sqrt(s2 / F + LN_EPS));
    float mf = (float)mean;
    l->stats[2 * n] = mf;
    l->stats[2 * n + 1] = rstd;
    for (int i = 0; i < F; i++)
      y[i] = (x[i] - mf) * rstd * g[i] + be[i];
  }
}

static void layernorm_backward(nn_layer *l, const float *P, const nn_slice *s, bool need_dx) {
  const int F = l->in.c;
  const float *g = P + l->w_off;
  float *dg = s->grads + l->w_off, *db = s->grads + l->b_off;
  for (int n = s->b0; n < s->b0 + s->nb; n++) {
    const float *x = l->x + (size_t)n * F, *dy = l->dy + (size_t)n * F;
    float mean = l->stats[2 * n], rstd = l->stats[2 * n + 1];
    double sd = 0.0, sdx = 0.0; /* sums of dxhat and dxhat*xhat */
    for (int i = 0; i < F; i++) {
      float xh = (x[i] - mean) * rstd;
      float dxh = dy[i] * g[i];
      dg[i] += dy[i] * xh;
      db[i] += dy[i];
      sd += dxh;
      sdx += (double)dxh * xh;
    }
    if (!need_dx)
      continue;
    float md = (float)(sd / F), mdx = (float)(sdx / F);
    float *dx = l->dx + (size_t)n * F;
    for (int i = 0; i < F; i++) {
      float xh = (x[i] - mean) * rstd;
      dx[i] = rstd * (dy[i] * g[i] - md - xh * mdx);
    }
  }
}

/* ---- dispatch ---- */

void dt__nn_forward_layer(nn_layer *l, const float *params, const nn_slice *s, bool train) {
  if (s->nb <= 0 && l->kind != NN_LINEAR) /* a linear layer works on every sample (split_cols) */
    return;
  switch (l->kind) {
  case NN_LINEAR: linear_forward(l, params, s); break;
  case NN_CONV: conv_forward(l, params, s); break;
  case NN_MAXPOOL: maxpool_forward(l, s); break;
  case NN_AVGPOOL: avgpool_forward(l, s); break;
  case NN_RELU:
    if (!l->fused_away)
      relu_forward(l, s);
    break;
  case NN_GELU: gelu_forward(l, s); break;
  case NN_DROPOUT: dropout_forward(l, s, train); break;
  case NN_FLATTEN: break;
  case NN_LAYERNORM: layernorm_forward(l, params, s); break;
  }
}

void dt__nn_backward_layer(nn_layer *l, const float *params, const nn_slice *s, bool need_dx) {
  if (s->nb <= 0 && l->kind != NN_LINEAR)
    return;
  switch (l->kind) {
  case NN_LINEAR: linear_backward(l, params, s, need_dx); return;
  case NN_CONV: conv_backward(l, params, s, need_dx); return;
  case NN_LAYERNORM: layernorm_backward(l, params, s, need_dx); return;
  default: break;
  }
  /* The rest have no parameters: their backward only produces dx. */
  if (!need_dx)
    return;
  switch (l->kind) {
  case NN_MAXPOOL: maxpool_backward(l, s); break;
  case NN_AVGPOOL: avgpool_backward(l, s); break;
  case NN_RELU:
    if (!l->bwd_fused_away)
      relu_backward(l, s);
    break;
  case NN_GELU: gelu_backward(l, s); break;
  case NN_DROPOUT: dropout_backward(l, s); break;
  default: break;
  }
}

/* ---- softmax cross-entropy ---- */

double dt__nn_softmax_xent(const float *logits, const int32_t *labels, int n, int C,
                           float grad_scale, float *dlogits, int64_t *correct) {
  double total = 0.0;
  for (int r = 0; r < n; r++) {
    const float *z = logits + (size_t)r * C;
    int best = 0;
    float mx = z[0];
    bool nan = z[0] != z[0];
    for (int j = 1; j < C; j++) {
      if (z[j] > mx) {
        mx = z[j];
        best = j;
      }
      nan |= z[j] != z[j];
    }
    if (nan) /* no class is the most likely: counted wrong, whatever the comparisons left in best */
      best = -1;
    double sum = 0.0;
    for (int j = 0; j < C; j++)
      sum += exp((double)(z[j] - mx));
    int y = labels[r];
    total += log(sum) - (double)(z[y] - mx);
    if (correct && best == y)
      (*correct)++;
    if (dlogits) {
      float *d = dlogits + (size_t)r * C;
      float isum = (float)(1.0 / sum);
      for (int j = 0; j < C; j++)
        d[j] = expf(z[j] - mx) * isum * grad_scale;
      d[y] -= grad_scale;
    }
  }
  return total;
}
