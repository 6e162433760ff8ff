/* nn/nn.h - internal structures of the training engine: the layer list, its buffers and the
 * kernels each layer runs. Tests include it to reach single layers and the input gradient;
 * other layers use only dtrain/nn.h. */
#ifndef DT_NN_INTERNAL_H
#define DT_NN_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"
#include "dtrain/nn.h"

/* B = batch, C = channels, H/W = height/width, K = kernel taps * input channels, F = features.
 * A layer's shapes are per sample; activations are channels-last (H, W, C). */

typedef enum {
  NN_LINEAR,
  NN_CONV,
  NN_MAXPOOL,
  NN_AVGPOOL,
  NN_RELU,
  NN_GELU,
  NN_DROPOUT,
  NN_FLATTEN,
  NN_LAYERNORM,
} nn_kind;

typedef struct nn_shape {
  int c, h, w; /* a flat vector of F features is (F, 1, 1) */
} nn_shape;

static inline size_t nn_shape_size(nn_shape s) { return (size_t)s.c * (size_t)s.h * (size_t)s.w; }

typedef struct nn_layer {
  nn_kind kind;
  nn_shape in, out;
  int k, stride, pad;       /* conv (k x k kernel) and pooling */
  float p;                  /* dropout probability */
  bool relu_fused;          /* linear/conv: applies relu in its epilogue (next layer is relu) */
  bool fused_away;          /* relu whose forward the previous layer already did */
  bool relu_mask;           /* maxpool after a relu: its backward also applies the relu's mask */
  bool bwd_fused_away;      /* relu whose backward the next layer (maxpool) already does */
  bool init_kaiming;        /* followed by relu/gelu */
  int index;                /* 1-based number among layers of the same family, for names */
  /* parameters: offsets into params/grads (floats); nparams = 0 for parameter-free layers */
  size_t w_off, w_count, b_off, b_count;
  size_t nparams, p_off;    /* whole layer range (weight then bias) */
  /* buffers (views into the activation arena), sized for max_batch */
  float *x, *y;             /* input and output; in-place layers have y == x */
  float *dx, *dy;           /* gradient of input/output; in-place layers have dx == dy */
  float *stats;             /* layernorm: mean and rstd per sample (2B) */
  int32_t *idx;             /* maxpool: arg-max input offset per output */
  uint8_t *mask;            /* dropout keep-mask */
  int chunk;                /* conv: samples per im2col chunk (per thread) */
  int seq;                  /* position in the model, keys the dropout stream */
  size_t ex_x, ex_dy;       /* linear: where its x and dy rows go in an export (floats from its
                             * start; 0: the model exports nothing), see dt_model_defer_linear_grads */
  float *wpk;               /* conv on the AVX-512 path: weights packed for conv.c, wpk_floats
                             * per thread (thread t's at wpk + t * wpk_floats) */
  size_t wpk_floats;
} nn_layer;

/* What one thread works on during a pass: samples [b0, b0 + nb) of the batch (all buffers are
 * sample-major, so a thread's part is a row range), its own conv workspace, and the gradient
 * buffer it accumulates into (the model's for thread 0, a private one for the others). */
typedef struct nn_slice {
  int b0, nb;
  int B;                    /* whole batch (the loss is a mean over it) */
  float *grads;             /* this thread's accumulation buffer (per-sample layers) */
  float *model_grads;       /* the model's: linear layers write their row block of dW here */
  int t, T;                 /* this thread, thread count */
  float *col, *dcol;        /* conv im2col / d(im2col) chunk, max over layers */
  uint64_t key;             /* dropout key of this forward */
  uint64_t first;           /* dropout number of the forward's sample 0 (dt_model_set_dropout_key) */
  bool pack;                /* first call of this pass on this thread: conv.c packs weights */
  float *exp;               /* deferred linear weight gradients: the export (NULL: off) */
  bool fresh;               /* backward after dt_model_discard_grad: a linear layer writes its
                             * rows of model_grads instead of adding (other layers' ranges are
                             * cleared before their backward, model.c) */
} nn_slice;

typedef struct nn_pool nn_pool;

struct dt_model {
  char *spec;               /* canonical spec */
  nn_shape in;
  int max_batch;
  int nlayers;
  nn_layer *layers;
  float *params, *grads;
  bool params_lent, grads_lent; /* the caller's memory (dt_model_use_memory), not freed here */
  size_t nparams;
  dt_tensor *tensors;
  char *names;              /* storage for tensor names */
  size_t ntensors;
  float *arena;             /* activations, gradients, workspace */
  size_t arena_floats;
  float *input;             /* copy of the forward input: layers[0].x */
  float *dinput;            /* gradient of the input, computed only when want_dinput */
  float *logits, *dlogits;
  size_t nout;
  int batch;                /* batch of the last forward */
  bool trained_forward;     /* last forward was train mode: backward allowed */
  bool discarded;           /* dt_model_discard_grad since the last backward */
  bool want_dinput;         /* tests: also compute d(loss)/d(input) */
  dt_rng rng;
  uint64_t fwd_key;         /* dropout key of the last forward */
  bool key_set;             /* dt_model_set_dropout_key since the last training forward */
  uint64_t next_key, next_first; /* what it set */
  int nthreads;
  int stem;                 /* layers [0, stem) come before the first linear layer */
  int stem_nb;              /* > 0: they run stem_nb samples at a time (see model.c) */
  nn_slice *slices;         /* per thread */
  float *priv_grads;        /* (nthreads - 1) private gradient buffers, nparams each */
  float *col_arena;         /* per-thread conv workspaces */
  float *wpk_arena;         /* conv layers' packed weights (nn_layer.wpk) */
  nn_pool *pool;            /* NULL when nthreads == 1 */
  float *exp;               /* dt_model_defer_linear_grads's export, NULL when off */
  int exp_rows;             /* samples an export holds */
  float *dtile;             /* dt_model_deferred_grad's results: one tile per thread */
  size_t dtile_floats;
  /* per-pass results of each thread */
  double *loss_part;
  int64_t *correct_part;
};

/* ---- thread pool (pool.c): the caller is thread 0, workers 1..n-1 ---- */
dt_status dt__nn_pool_create(int nthreads, nn_pool **out);
void dt__nn_pool_destroy(nn_pool *p);
/* Runs fn(arg, t) on every thread t in [0, n) (the caller runs t = 0) and returns when all are
 * done. fn must not fail. */
void dt__nn_pool_run(nn_pool *p, void (*fn)(void *arg, int t), void *arg);
/* Within a running job: thread t reports it finished step k (monotonic per job), and thread 0
 * waits until thread t reported at least step k. */
void dt__nn_pool_progress(nn_pool *p, int t, int k);
void dt__nn_pool_wait_progress(nn_pool *p, int t, int k);
/* Within a running job: returns when all n threads have called it. */
void dt__nn_pool_barrier(nn_pool *p);
/* Runs fn(arg, t, n) over the model's threads (inline when it has one). */
void dt__nn_parallel(dt_model *m, void (*fn)(void *arg, int t), void *arg);

/* ---- spec parsing (spec.c) ---- */
typedef struct nn_spec_layer {
  nn_kind kind;
  int n;        /* linear out features, conv out channels */
  int k, stride, pad;
  float p;
} nn_spec_layer;

/* Parses spec into input shape and layers (array malloc'd into *layers, *n entries), checking
 * every shape. DT_ERR_INVALID naming the token on failure. */
dt_status dt__nn_parse_spec(const char *spec, nn_shape *in, nn_spec_layer **layers, int *n);

/* ---- matrix product (gemm.c) ---- */
/* C (M x N, row stride ldc) = alpha * op(A) * op(B) + beta * C, row-major, op(X) = X^T when
 * trans: the semantics of cblas_sgemm(CblasRowMajor, ...), including that beta == 0 never reads
 * C. Single-threaded (callers split the work); never fails and never allocates after this
 * thread's first call (or dt__nn_gemm_reserve). Uses dtrain's AVX-512 kernel when the CPU has
 * AVX-512F, its AVX2 kernel on CPUs with AVX2 and FMA, OpenBLAS otherwise; DTRAIN_GEMM=blas|own|auto
 * overrides (read once per process). */
/* The run of k over which dt__nn_sgemm sums each element before adding it to C: a product with
 * K at most this and beta 1 gives C + (the product with beta 0) exactly; beyond it, and for 0
 * (OpenBLAS), later runs are added onto C one after another. */
int dt__nn_sgemm_kblock(void);
void dt__nn_sgemm(bool transA, bool transB, int M, int N, int K, float alpha, const float *A,
                  int lda, const float *B, int ldb, float beta, float *C, int ldc);
/* DT_ERR_INVALID for a DTRAIN_GEMM value that is not auto/own/blas, DT_ERR_UNSUPPORTED for
 * DTRAIN_GEMM=own on a CPU with neither AVX-512F nor AVX2 and FMA (dt__nn_sgemm then uses
 * OpenBLAS). */
dt_status dt__nn_gemm_check(void);
/* "avx512", "avx2" or "openblas": which implementation dt__nn_sgemm runs. */
const char *dt__nn_gemm_name(void);
/* OpenBLAS single-threaded and its thread pool ended (gemm.c): for a process's start, before its
 * own threads. */
void dt__nn_blas_serial(void);
/* Allocates the calling thread's packing buffers now, so that its first product does not. */
void dt__nn_gemm_reserve(void);
/* For tests, before any product: dtrain's AVX2 kernel on a CPU with AVX-512F too. False (and
 * nothing changed) where it cannot run or OpenBLAS was chosen. */
bool dt__nn_gemm_force_avx2(void);

/* For tests: the widest copy of the optimizer's update loops that may run (optim.c): 2 AVX-512,
 * 1 AVX2, 0 the base x86-64 one; a CPU without the instructions runs a narrower one anyway.
 * Returns the setting it replaced. */
int dt__nn_optim_isa_cap(int cap);

/* ---- convolution without im2col (conv.c) ---- */
/* True when dtrain's AVX-512 product runs (dt__nn_gemm_name() is "avx512"): every function
 * below may run. */
bool dt__nn_conv_direct(void);
/* True when the forward and the stride-1 input gradient run here: wherever dtrain's own product
 * runs (dt__nn_gemm_name() is not "openblas"); the weight gradient needs dt__nn_conv_direct(). */
bool dt__nn_conv_fwd_direct(void);
/* For tests: the forward and input-gradient kernels of CPUs without AVX-512F run on one with it
 * too (ignored where the CPU lacks AVX2 or FMA). Returns the setting it replaced. */
bool dt__nn_conv_force_avx2(bool on);
/* Floats of per-thread workspace the functions below need for layer l (the model sizes each
 * thread's s->col to at least this when dt__nn_conv_fwd_direct()). */
size_t dt__nn_conv_ws_floats(const nn_layer *l);
/* Floats per thread of l->wpk (weights packed for the forward and the input gradient). */
size_t dt__nn_conv_packed_floats(const nn_layer *l);
/* l->y of the slice's samples from l->x, with bias and (l->relu_fused) relu; ws as above.
 * Packs the weights into this thread's part of l->wpk when s->pack. */
void dt__nn_conv_forward_direct(const nn_layer *l, const float *params, const nn_slice *s,
                                float *ws);
/* s->grads' weight and bias parts of l += their gradients over the slice's samples (from l->x
 * and l->dy); ws as above. */
void dt__nn_conv_dweight_direct(const nn_layer *l, const nn_slice *s, float *ws);
/* Whether dt__nn_conv_dx_direct can compute l's input gradient (stride 1, pad <= k-1). */
bool dt__nn_conv_dx_direct_ok(const nn_layer *l);
/* l->dx of the slice's samples (overwritten) from l->dy and the weights; ws as above. Packs
 * the flipped weights into this thread's part of l->wpk when s->pack. */
void dt__nn_conv_dx_direct(const nn_layer *l, const float *params, const nn_slice *s, float *ws);

/* ---- kernels (layers.c) ---- */
void dt__nn_forward_layer(nn_layer *l, const float *params, const nn_slice *s, bool train);
/* need_dx: compute l->dx (false for the first layer unless the input gradient is wanted).
 * Adds the slice's parameter gradients into s->grads. */
/* dt_model_deferred_grad on thread t's tile (model threads splitting one update). */
size_t dt__nn_deferred_grad(dt_model *m, int t, const float *const *ex, int n, size_t lo, size_t hi,
                            float **g);
void dt__nn_backward_layer(nn_layer *l, const float *params, const nn_slice *s, bool need_dx);
/* Softmax cross-entropy of n rows of C logits: returns the SUM of the row losses, writes
 * grad_scale * (softmax - onehot) into dlogits when not NULL (grad_scale = loss_scale / batch for
 * the gradient of a batch mean), counts arg-max hits into *correct when not NULL. Labels must
 * already be in range. */
double dt__nn_softmax_xent(const float *logits, const int32_t *labels, int n, int C,
                           float grad_scale, float *dlogits, int64_t *correct);

#endif
