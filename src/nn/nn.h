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
  bool init_kaiming;        /* followed by relu/gelu */
  int index;                /* 1-based number among layers of the same family, for names */
  /* parameters: offsets into params/grads (floats); nparams = 0 for parameter-free layers */
  size_t w_off, w_count, b_off, b_count;
  size_t nparams, p_off;    /* whole layer range (weight then bias) */
  /* buffers (views into the activation arena), sized for max_batch */
  float *x, *y;             /* input and output; in-place layers have y == x */
  float *dx, *dy;           /* gradient of input/output; in-place layers have dx == dy */
  float *ws;                /* conv: im2col chunk (chunk rows x K); layernorm: mean, rstd */
  float *ws2;               /* conv: d(im2col) chunk */
  int32_t *idx;             /* maxpool: arg-max input offset per output; dropout: unused */
  uint8_t *mask;            /* dropout keep-mask */
  int chunk;                /* conv: samples per im2col chunk */
} nn_layer;

struct dt_model {
  char *spec;               /* canonical spec */
  nn_shape in;
  int max_batch;
  int nlayers;
  nn_layer *layers;
  float *params, *grads;
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
  bool want_dinput;         /* tests: also compute d(loss)/d(input) */
  dt_rng rng;
};

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

/* ---- kernels (layers.c) ---- */
void dt__nn_forward_layer(nn_layer *l, const float *params, int B, bool train, dt_rng *rng);
/* need_dx: compute l->dx (false for the first layer unless the input gradient is wanted). */
void dt__nn_backward_layer(nn_layer *l, const float *params, float *grads, int B, bool need_dx);
/* Mean softmax cross-entropy over B rows of C logits; writes scale * dloss/dlogits into dlogits
 * when dlogits != NULL. Returns the mean loss; labels must already be in range. */
double dt__nn_softmax_xent(const float *logits, const int32_t *labels, int B, int C, float scale,
                           float *dlogits, int64_t *correct);

#endif
