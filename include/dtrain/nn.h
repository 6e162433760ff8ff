/* dtrain/nn.h - the training engine: models built from a spec string, explicit forward and
 * backward passes, optimizers, learning-rate schedules and gradient clipping.
 *
 * Memory. Everything is allocated once, in dt_model_create, for a maximum batch:
 *   params   one float buffer holding every parameter tensor;
 *   grads    one float buffer with exactly the same layout as params;
 *   acts     one buffer for every activation, gradient-of-activation, pooling index and
 *            dropout mask; plus, per compute thread, an im2col workspace and (threads after the
 *            first) a private gradient buffer for the per-sample-accumulated layers;
 *   and each optimizer state (SGD momentum, Adam m, Adam v) is one more buffer of the params
 *   layout, allocated by dt_optim_create.
 * Tensors are views (name, shape, offset) into params/grads. Nothing is allocated by
 * dt_model_forward, dt_model_backward, dt_model_zero_grad, dt_model_eval_batch, dt_optim_step or
 * the clipping calls (tests/nn/test_nn_alloc.c counts).
 *
 * Layout for data parallelism. Parameter tensors are stored in REVERSE layer order: the last
 * layer's weight and bias come first (offset 0), the first layer's last. Backward runs from the
 * last layer to the first, so it finishes the gradient buffer front to back: when the hook
 * reports (offset, count) for a layer, the whole prefix [0, offset + count) is final and will
 * not be written again in this backward. A communication thread can therefore allreduce
 * grads[0 .. k) as soon as the hook has passed k, and a bucket is simply a prefix range.
 * Within one layer the weight comes before the bias.
 *
 * Layouts. Inputs are (B, C, H, W) as PyTorch's and dtrain/data.h's. Inside, activations are
 * channels-last (H, W, C per sample, channel fastest; the input copy converts), which makes
 * im2col a run of contiguous copies. So conv weights are stored (OC, KH, KW, IC) and the tensor
 * table states that shape, and flatten keeps the (h, w, c) order, which is the order the first
 * linear layer after a conv stack sees its features in (PyTorch's flatten would give (c, h, w)).
 * Linear weights are (out, in) as in PyTorch, so MLP weights export unchanged.
 *
 * Threads. A model splits each batch over its own compute threads (the count set by
 * dt_nn_set_threads when it was created; the calling thread is one of them, the others sleep
 * between passes) and calls CBLAS (OpenBLAS, driven single-threaded) on each slice. Results are
 * deterministic for a given thread count; different counts differ by float rounding. A model and
 * its optimizer may be used by one thread at a time; the gradient hook is called on the thread
 * that called dt_model_backward.
 *
 * Not here: data loading (dtrain/data.h), checkpoints and safetensors (ckpt), communication. */
#ifndef DTRAIN_NN_H
#define DTRAIN_NN_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_model dt_model;
typedef struct dt_optim dt_optim;

/* One parameter tensor: a view into the params (and, at the same offset, grads) buffer. */
typedef struct dt_tensor {
  const char *name;   /* "fc1.weight", "conv2.bias", "ln1.weight" */
  int ndim;           /* 1, 2 or 4 */
  int64_t shape[4];   /* linear (out, in); conv (OC, KH, KW, IC); bias / layernorm (C) */
  size_t offset;      /* in floats from the start of the buffer */
  size_t count;       /* product of shape */
} dt_tensor;

/* Called by backward right after a parameterized layer's gradients are final, with the range
 * of the gradient buffer (in floats) that layer owns. Successive calls have increasing offsets
 * and cover the buffer without gaps (see "Layout" above). Must not call back into the model. */
typedef void (*dt_grad_hook)(void *ctx, size_t grad_offset, size_t grad_count);

/* ---- models ---- */

/* Builds a model from a preset name ("mlp", "cnn") or a spec string (see dt_model_spec_help),
 * allocates every buffer for batches up to max_batch, and initializes parameters from seed
 * (Kaiming-normal for layers followed by relu/gelu, Xavier-uniform otherwise, biases zero; the
 * same seed gives bit-identical parameters). The dropout RNG is also seeded from seed.
 * Fails with DT_ERR_INVALID naming the offending token and why (bad token, zero size, shapes
 * that do not fit), DT_ERR_NOMEM if the buffers cannot be allocated; *out = NULL then. */
dt_status dt_model_create(const char *spec, int max_batch, uint64_t seed, dt_model **out);
void dt_model_destroy(dt_model *m);
/* The parameters a spec's model has, without building it (nothing the size of the model is
 * allocated). DT_ERR_INVALID as dt_model_create for a spec that does not parse. */
dt_status dt_model_spec_param_count(const char *spec, size_t *count);

/* Help text for the spec syntax (static string, several lines, ends with a newline). */
const char *dt_model_spec_help(void);
/* Canonical spec of a model: "in=1x28x28,conv5x5:32:s1:p2,relu,...". Rebuilding from it gives
 * the same architecture. Owned by the model. */
const char *dt_model_spec(const dt_model *m);

int dt_model_max_batch(const dt_model *m);
/* Floats per input sample (C*H*W) and per output sample (number of classes). */
size_t dt_model_input_size(const dt_model *m);
size_t dt_model_output_size(const dt_model *m);
/* The input shape the spec declares: C, H, W of in=CxHxW, or F, 1, 1 of in=F (flat vectors). */
void dt_model_input_shape(const dt_model *m, int *c, int *h, int *w);

/* The parameter and gradient arenas (param_count floats each). Owned by the model; the
 * pointers never change during the model's life, except by dt_model_use_memory. */
size_t dt_model_param_count(const dt_model *m);
float *dt_model_params(dt_model *m);
float *dt_model_grads(dt_model *m);
/* Moves the parameters and the gradients into the caller's buffers (param_count floats each,
 * 64-byte aligned, not overlapping; e.g. a communicator's shared window, see dt_comm_window),
 * copying what they hold; NULL moves that arena back into memory of the model's own. The
 * caller keeps its buffers alive until the model is destroyed or moved back. Not during a
 * forward or backward pass. DT_ERR_INVALID for misaligned or overlapping buffers (nothing
 * changes then), DT_ERR_NOMEM. */
dt_status dt_model_use_memory(dt_model *m, float *params, float *grads);
/* Like dt_model_use_memory for the parameters alone, but takes the buffer as it is, without
 * copying: parameters another process of the same model keeps there (one copy per host, shared
 * by every worker; see trainer.c). params must not be NULL. */
dt_status dt_model_share_params(dt_model *m, float *params);

/* Tensor table, in increasing offset order (i.e. last layer first). */
size_t dt_model_tensor_count(const dt_model *m);
const dt_tensor *dt_model_tensor(const dt_model *m, size_t i);
/* The tensor with this name, or NULL. */
const dt_tensor *dt_model_find_tensor(const dt_model *m, const char *name);

/* Forward pass on x (batch samples of C*H*W floats, (C, H, W) order), copied into the model so
 * the caller may reuse x at once. train != 0 enables dropout and records what backward needs.
 * *logits (batch * output_size floats, owned by the model) is valid until the next forward.
 * Fails with DT_ERR_INVALID if batch is not in [1, max_batch]. Never allocates. */
dt_status dt_model_forward(dt_model *m, const float *x, int batch, int train, const float **logits);

/* Softmax cross-entropy of the last forward's logits against labels (batch ints in
 * [0, output_size)), mean over the batch, then backward through every layer, ADDING
 * loss_scale * d(mean loss)/d(param) into the gradient buffer (loss_scale = 1 normally, 1/k when
 * accumulating k micro-batches). hook (may be NULL) is called after each parameterized layer.
 * *loss (may be NULL) receives the unscaled mean loss. Requires a preceding forward with
 * train != 0 (DT_ERR_STATE otherwise); a label out of range is DT_ERR_INVALID and leaves the
 * gradients untouched. Never allocates. */
dt_status dt_model_backward(dt_model *m, const int32_t *labels, float loss_scale, dt_grad_hook hook,
                            void *ctx, float *loss);

/* The ranges backward reports to the hook, in the order it reports them (one per layer with
 * parameters): range i is [ends[i-1], ends[i]) with ends[-1] = 0. Writes at most cap ends and
 * returns how many there are, so a caller can plan its buckets before the first backward. */
size_t dt_model_grad_segments(const dt_model *m, size_t *ends, size_t cap);

/* Sets every gradient to zero (start of a step; backward accumulates). */
void dt_model_zero_grad(dt_model *m);
/* Start of a step without the zeroing pass: the next dt_model_backward writes the gradients
 * instead of adding to them (later ones add again, for accumulation), which saves a pass over
 * the whole gradient buffer (and, for linear layers, reading it back). Until that backward has
 * run, the gradients' contents are unspecified: a step that may run no backward at all must use
 * dt_model_zero_grad. */
void dt_model_discard_grad(dt_model *m);

/* Deferred weight gradients of linear layers, for data-parallel workers that share memory.
 * After dt_model_defer_linear_grads(m, exp), dt_model_backward no longer computes the weight
 * gradients of linear layers (their part of the gradient buffer is left as it was; biases and
 * every other layer's gradients are computed as before): it copies each linear layer's input
 * rows x and output-gradient rows dy into exp instead (the export: dt_model_export_size(m,
 * rows) floats for backwards of at most rows samples (a larger one is DT_ERR_INVALID), 64-byte
 * aligned, e.g. in a communicator's shared window), with the batch. Another process of
 * the same model (same spec and max batch) can read it there. The weight gradient is then
 * computed where it is used, from every worker's export at once (dt_model_deferred_grad,
 * dt_optim_step_range_deferred): one product over all the workers' samples per block of rows,
 * never written to the gradient buffer nor summed across workers afterwards. An export holds the
 * last backward only (no accumulation over micro-batches). dt_model_export_clear marks it empty,
 * for a step that runs no backward. exp NULL turns it off. DT_ERR_INVALID if misaligned,
 * DT_ERR_NOMEM. */
size_t dt_model_export_size(const dt_model *m, int rows);
dt_status dt_model_defer_linear_grads(dt_model *m, float *exp, int rows);
void dt_model_export_clear(dt_model *m);
/* The stretch of parameters starting at lo (below hi) that is all deferred or all not: returns
 * its length (0 when lo >= hi). Deferred: *g points at its gradient summed over the n exports ex
 * left to right (in the model's tile, up to 128 Ki floats at a time, valid until the next
 * call); not deferred: *g = NULL and the gradient is in the gradient buffers as usual. */
size_t dt_model_deferred_grad(dt_model *m, const float *const *ex, int n, size_t lo, size_t hi,
                              float **g);

/* Evaluation in eval mode of batch samples (any number >= 1: more than max_batch are done in
 * pieces): adds the SUM of per-sample losses to *loss_sum and the number of samples whose
 * arg-max logit equals the label to *correct. Does not touch grads; ends any pending backward
 * (a following dt_model_backward is DT_ERR_STATE). */
dt_status dt_model_eval_batch(dt_model *m, const float *x, const int32_t *labels, int batch,
                              double *loss_sum, int64_t *correct);

/* Dropout masks. Each sample's mask in each dropout layer is a pure function of (key, the
 * sample's number, the layer's position in the model), drawn from a counter-based generator,
 * so it does not depend on the thread split nor on how a batch is cut into forwards.
 * dt_model_set_dropout_key sets the key of the NEXT training forward and numbers its samples
 * first, first + 1, ...; it is used once. Forwarding a batch in pieces, each keyed by the same key
 * and its first sample's position in the whole batch, draws the very masks of one forward of the
 * whole batch: the trainer keys every micro-batch of every rank with (seed, step) and the
 * sample's position in the global batch. A training forward without it draws its key from the
 * model's RNG (seeded from the model's seed; plain data, save and restore it by copying *rng)
 * and numbers its samples from 0. Eval forwards apply no dropout and consume nothing. */
dt_rng *dt_model_rng(dt_model *m);
void dt_model_set_dropout_key(dt_model *m, uint64_t key, uint64_t first);

/* Scales the model's gradients so that their global L2 norm is at most max_norm (no change if
 * it already is, or if max_norm <= 0). Returns the norm before clipping. */
float dt_model_clip_grad_norm(dt_model *m, float max_norm);
/* The same on any float buffer (e.g. after an allreduce of a custom layout). */
float dt_clip_grad_norm(float *grads, size_t count, float max_norm);
/* The pieces of clipping, for gradients spread over ranks (ZeRO): the sum of squares of a
 * buffer (in double), and the factor dt_clip_grad_norm multiplies by when the squares of the
 * whole gradient sum to sumsq (1 when no clipping is needed or max_norm <= 0). */
double dt_grad_sumsq(const float *grads, size_t count);
/* dt_grad_sumsq of (grads[0] + ... + grads[n-1]), summed as dt_optim_step_range_sum sums them
 * and never written out (n >= 1). */
double dt_grad_sumsq_of_sum(const float *const *grads, int n, size_t count);
float dt_clip_factor(double sumsq, float max_norm);

/* Compute threads for models created from now on (n >= 1, default 1); process-wide. Also sets
 * OpenBLAS to one thread, as models do their own threading. */
void dt_nn_set_threads(int n);
int dt_nn_threads(void);
/* The compute threads of this model. */
int dt_model_threads(const dt_model *m);

/* ---- optimizers ---- */

typedef enum dt_optim_kind { DT_OPTIM_SGD = 0, DT_OPTIM_ADAMW = 1 } dt_optim_kind;

typedef struct dt_optim_config {
  dt_optim_kind kind;
  float weight_decay; /* SGD: L2 added to the gradient (PyTorch SGD); AdamW: decoupled */
  float momentum;     /* SGD, 0 = plain SGD (no state buffer) */
  int nesterov;       /* SGD, needs momentum > 0 */
  float beta1, beta2, eps; /* AdamW */
} dt_optim_config;

/* PyTorch's defaults: SGD momentum 0, wd 0; AdamW betas (0.9, 0.999), eps 1e-8, wd 0.01. */
dt_optim_config dt_optim_defaults(dt_optim_kind kind);

/* A stretch [lo, hi) of the params layout, in floats. */
typedef struct dt_param_range {
  size_t lo, hi;
} dt_param_range;

/* Allocates the state buffers (zeroed) for m's parameters; m must outlive the optimizer.
 * DT_ERR_INVALID for out-of-range settings (negative momentum, beta outside [0,1), ...). */
dt_status dt_optim_create(const dt_optim_config *cfg, dt_model *m, dt_optim **out);
/* The same for a shard of the parameters (ZeRO-1: each rank updates only the ranges it owns):
 * the optimizer updates only ranges[0 .. nranges) (copied; non-empty, increasing, disjoint,
 * within the model; nranges may be 0) and keeps state only for them, so each state buffer
 * holds the ranges' lengths summed, range i's state at dt_optim_state_offset(o, i). Updates
 * follow the same rules with the same global step count, so a parameter updated by a sharded
 * optimizer ends bit for bit as under dt_optim_create. DT_ERR_INVALID names a bad range. */
dt_status dt_optim_create_ranges(const dt_optim_config *cfg, dt_model *m,
                                 const dt_param_range *ranges, size_t nranges, dt_optim **out);
void dt_optim_destroy(dt_optim *o);

/* One update of every owned parameter from the model's current gradients with learning rate
 * lr; increments the step count first (AdamW's bias correction uses it). Never allocates. */
dt_status dt_optim_step(dt_optim *o, float lr);
/* The same step in pieces, for a caller that updates ranges as their gradients arrive (and
 * sends each updated range on while the next is computed): dt_optim_begin_step checks lr
 * (DT_ERR_INVALID) and increments the step count; then dt_optim_step_range(o, i, grad)
 * updates range i once from grad (the range's length in floats; NULL: the model's gradients
 * at the range's own offsets) with that lr and count. DT_ERR_STATE before any begin,
 * DT_ERR_INVALID for i out of range. Never allocates. */
dt_status dt_optim_begin_step(dt_optim *o, float lr);
dt_status dt_optim_step_range(dt_optim *o, size_t i, const float *grad);
/* The same, with the gradient (grads[0] + grads[1] + ... + grads[n-1]) * scale, summed left to
 * right in f32 and then scaled (not when scale is 1), a few KiB at a time, so that it is never
 * written out: each grads[k] holds the range's length in floats (e.g. every worker's gradient
 * of the range, read in place from a shared window). n >= 1 and no NULL, else DT_ERR_INVALID. */
dt_status dt_optim_step_range_sum(dt_optim *o, size_t i, const float *const *grads, int n, float scale);
/* dt_optim_step_range_sum where the model defers its linear weight gradients
 * (dt_model_defer_linear_grads): those of the range are computed from the n exports ex, a tile
 * at a time, and used at once; the rest are summed from grads as there. Split across the
 * model's threads like the other updates. */
dt_status dt_optim_step_range_deferred(dt_optim *o, size_t i, const float *const *grads,
                                       const float *const *ex, int n, float scale);

/* Steps taken (for checkpoints); set it when restoring state. */
int64_t dt_optim_step_count(const dt_optim *o);
void dt_optim_set_step_count(dt_optim *o, int64_t steps);

/* The ranges it updates (dt_optim_create: one, [0, param_count), or none for a model without
 * parameters); a range past the end reads as {0, 0}. */
size_t dt_optim_range_count(const dt_optim *o);
dt_param_range dt_optim_range(const dt_optim *o, size_t i);

/* State buffers: SGD with momentum has one ("momentum"), AdamW two ("adam_m", "adam_v"), plain
 * SGD none. Each holds dt_optim_state_size(o) floats: the ranges back to back (for
 * dt_optim_create the whole params layout), range i from dt_optim_state_offset(o, i) (past the
 * last range: the size). Owned by the optimizer. */
size_t dt_optim_state_count(const dt_optim *o);
float *dt_optim_state(dt_optim *o, size_t i, const char **name);
size_t dt_optim_state_size(const dt_optim *o);
size_t dt_optim_state_offset(const dt_optim *o, size_t i);

/* ---- learning-rate schedules ---- */

typedef enum dt_sched_kind { DT_SCHED_CONSTANT = 0, DT_SCHED_STEP = 1, DT_SCHED_COSINE = 2 } dt_sched_kind;

typedef struct dt_lr_schedule {
  dt_sched_kind kind;
  float base_lr;
  int64_t warmup_steps; /* any kind: linear ramp base_lr*(s+1)/warmup for steps s < warmup */
  int64_t step_size;    /* STEP: multiply by gamma every step_size steps (counted from step 0) */
  float gamma;
  int64_t total_steps;  /* COSINE: decays from base_lr at warmup to min_lr at total_steps */
  float min_lr;
} dt_lr_schedule;

/* Learning rate for 0-based step s (the s-th call of dt_optim_step). Pure function. */
float dt_lr_at(const dt_lr_schedule *s, int64_t step);

/* Parses "constant", "step:K[:GAMMA]" (gamma default 0.1), "cosine[:WARMUP[:MIN_LR]]" into *out
 * with base_lr and total_steps given (warm-up may also prefix any kind: "warmup=W,step:K").
 * DT_ERR_INVALID naming the token otherwise. */
dt_status dt_lr_schedule_parse(const char *text, float base_lr, int64_t total_steps,
                               dt_lr_schedule *out);

#ifdef __cplusplus
}
#endif
#endif
