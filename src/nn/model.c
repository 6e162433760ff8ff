/* model.c - building a model from its spec: parameter layout (reverse layer order, see
 * dtrain/nn.h), the tensor table, the one-time activation arena, seeded initialization, and the
 * forward/backward drivers with the gradient hook. No allocation after dt_model_create. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/nn.h"

/* Target size of one conv im2col chunk in floats. With OpenBLAS: 1 Mi floats (4 MiB) keeps the
 * chunk and its gradient near L2/L3 while the sgemm still sees >= ~1000 rows on the cnn preset's
 * layers (measured: 6-sample chunks of conv2 run sgemm at ~100 GFLOP/s on one core, the whole
 * batch at ~80). With dtrain's AVX-512 product (gemm.c), whose packing costs little on few rows,
 * 160 Ki floats (625 KiB, in the 1 MiB L2 with its packed panels: one conv2 sample, 8 of conv1)
 * is better: cnn step CPU time 1 thread, median of 4 interleaved runs, 1 Mi 100 ms, 160 Ki 86-89
 * ms, 80 Ki and 40 Ki about the same as 160 Ki. DTRAIN_CONV_CHUNK overrides it (floats), for
 * tuning and for tests of the chunking. Since conv.c (AVX-512) computes forward and gradients
 * without im2col, there im2col chunks remain only for the input gradient of strided layers. */
#define CONV_CHUNK_FLOATS ((size_t)1 << 20)
#define CONV_CHUNK_FLOATS_OWN_GEMM ((size_t)160000)

/* The layers before the first linear one (convolutions, pools, activations: all per sample)
 * run a few samples at a time, forward and backward, so that what one layer writes is still in
 * L2 when the next reads it: the cnn preset's conv1 output and its gradient are 12.8 MB per 128
 * samples, and conv1's weight gradient waited on memory for dy. Linear layers keep the whole
 * slice (their product wants the rows). Only with conv.c's kernels, which handle any sample
 * count alike; the im2col path's chunks would change with it. Each sample's results and the
 * order of every sum over samples are unchanged. Measured (cnn, 128 samples, 1 thread, CPU time
 * per step, median of 5 interleaved runs on a busy machine): whole slice 49.8 ms, 4 samples 47.9;
 * 1, 2, 4 and 8 samples within noise of each other except 1 (about 5% slower). */
#define STEM_SAMPLES 4

/* Models split batches over their own threads (dt_nn_set_threads), so OpenBLAS runs
 * single-threaded inside each: two thread pools on the same cores would fight (PEERS.md saw
 * 2.3x from that with PyTorch). */
static _Atomic int g_threads = 1;

static size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }

static bool kind_inplace(nn_kind k) { return k == NN_RELU || k == NN_DROPOUT || k == NN_FLATTEN; }

static const char *kind_family(nn_kind k) {
  switch (k) {
  case NN_LINEAR: return "fc";
  case NN_CONV: return "conv";
  case NN_LAYERNORM: return "ln";
  default: return NULL;
  }
}

/* Appends the canonical token of l to buf. */
static void spec_append(char *buf, size_t cap, const nn_layer *l) {
  size_t n = strlen(buf);
  char *p = buf + n;
  size_t left = cap - n;
  switch (l->kind) {
  case NN_LINEAR: snprintf(p, left, ",linear:%d", l->out.c); break;
  case NN_CONV:
    snprintf(p, left, ",conv%dx%d:%d:s%d:p%d", l->k, l->k, l->out.c, l->stride, l->pad);
    break;
  case NN_MAXPOOL: snprintf(p, left, ",maxpool%d:s%d", l->k, l->stride); break;
  case NN_AVGPOOL: snprintf(p, left, ",avgpool%d:s%d", l->k, l->stride); break;
  case NN_RELU: snprintf(p, left, ",relu"); break;
  case NN_GELU: snprintf(p, left, ",gelu"); break;
  case NN_DROPOUT: { /* the shortest form that reads back as the same float */
    char d[32];
    snprintf(d, sizeof d, "%g", (double)l->p);
    if ((float)strtod(d, NULL) != l->p)
      snprintf(d, sizeof d, "%.9g", (double)l->p);
    snprintf(p, left, ",dropout:%s", d);
    break;
  }
  case NN_FLATTEN: snprintf(p, left, ",flatten"); break;
  case NN_LAYERNORM: snprintf(p, left, ",layernorm"); break;
  }
}

static nn_shape layer_out_shape(const nn_spec_layer *s, nn_shape in) {
  switch (s->kind) {
  case NN_LINEAR: return (nn_shape){s->n, 1, 1};
  case NN_CONV:
    return (nn_shape){s->n, (in.h + 2 * s->pad - s->k) / s->stride + 1,
                      (in.w + 2 * s->pad - s->k) / s->stride + 1};
  case NN_MAXPOOL:
  case NN_AVGPOOL:
    return (nn_shape){in.c, (in.h - s->k) / s->stride + 1, (in.w - s->k) / s->stride + 1};
  case NN_FLATTEN: return (nn_shape){(int)nn_shape_size(in), 1, 1};
  default: return in;
  }
}

/* Weights and biases of a layer with input in and output out (0 for layers without). */
static void layer_params(const nn_spec_layer *l, nn_shape in, nn_shape out, size_t *w, size_t *b) {
  *w = *b = 0;
  if (l->kind == NN_LAYERNORM) {
    *w = *b = (size_t)in.c;
  } else if (l->kind == NN_LINEAR) {
    *w = (size_t)out.c * in.c;
    *b = (size_t)out.c;
  } else if (l->kind == NN_CONV) {
    *w = (size_t)out.c * l->k * l->k * in.c;
    *b = (size_t)out.c;
  }
}

dt_status dt_model_spec_param_count(const char *spec, size_t *count) {
  *count = 0;
  nn_shape s;
  nn_spec_layer *sl;
  int n;
  DT_CHECK(dt__nn_parse_spec(spec, &s, &sl, &n));
  for (int i = 0; i < n; i++) {
    nn_shape o = layer_out_shape(&sl[i], s);
    size_t w, b;
    layer_params(&sl[i], s, o, &w, &b);
    *count += w + b;
    s = o;
  }
  dt__free(sl);
  return DT_OK;
}

static void init_params(dt_model *m, uint64_t seed) {
  dt_rng r;
  dt_rng_seed(&r, seed);
  for (int i = 0; i < m->nlayers; i++) {
    nn_layer *l = &m->layers[i];
    if (!l->nparams)
      continue;
    float *w = m->params + l->w_off, *b = m->params + l->b_off;
    if (l->kind == NN_LAYERNORM) {
      for (size_t j = 0; j < l->w_count; j++)
        w[j] = 1.0f;
    } else {
      double fan_in, fan_out;
      if (l->kind == NN_LINEAR) {
        fan_in = l->in.c;
        fan_out = l->out.c;
      } else {
        fan_in = (double)l->k * l->k * l->in.c;
        fan_out = (double)l->k * l->k * l->out.c;
      }
      if (l->init_kaiming) { /* He et al. 2015, normal, gain sqrt(2) for relu */
        double sd = sqrt(2.0 / fan_in);
        for (size_t j = 0; j < l->w_count; j++)
          w[j] = (float)(sd * dt_rng_normal(&r));
      } else { /* Glorot & Bengio 2010, uniform */
        double a = sqrt(6.0 / (fan_in + fan_out));
        for (size_t j = 0; j < l->w_count; j++)
          w[j] = (float)(a * (2.0 * dt_rng_uniform(&r) - 1.0));
      }
    }
    memset(b, 0, l->b_count * sizeof(float));
  }
}

/* Each engine thread's matrix-product buffers, taken at creation so no step allocates. */
static void gemm_reserve_job(void *arg, int t) { dt__nn_gemm_reserve(); }

dt_status dt_model_create(const char *spec, int max_batch, uint64_t seed, dt_model **out) {
  *out = NULL;
  DT_CHECK(dt__nn_gemm_check());
  if (max_batch < 1 || max_batch > (1 << 24))
    return dt_set_error(DT_ERR_INVALID, "model: max batch %d must be in [1, %d]", max_batch,
                        1 << 24);
  nn_shape in;
  nn_spec_layer *sl;
  int n;
  DT_CHECK(dt__nn_parse_spec(spec, &in, &sl, &n));
  dt_status rc;
  dt_model *m = dt__calloc(sizeof *m);
  if (!m)
    goto nomem;
  m->in = in;
  m->max_batch = max_batch;
  m->nlayers = n;
  m->layers = dt__calloc((size_t)(n ? n : 1) * sizeof *m->layers);
  if (!m->layers)
    goto nomem;

  /* shapes, fusion, names */
  nn_shape s = in;
  int family_count[3] = {0, 0, 0};
  size_t ntensors = 0;
  for (int i = 0; i < n; i++) {
    nn_layer *l = &m->layers[i];
    l->kind = sl[i].kind;
    l->in = s;
    l->out = layer_out_shape(&sl[i], s);
    l->k = sl[i].k;
    l->stride = sl[i].stride;
    l->pad = sl[i].pad;
    l->p = sl[i].p;
    s = l->out;
    if (l->kind == NN_LINEAR || l->kind == NN_CONV || l->kind == NN_LAYERNORM) {
      int fam = l->kind == NN_LINEAR ? 0 : l->kind == NN_CONV ? 1 : 2;
      l->index = ++family_count[fam];
      ntensors += 2;
      layer_params(&sl[i], l->in, l->out, &l->w_count, &l->b_count);
      l->nparams = l->w_count + l->b_count;
      if (i + 1 < n && (sl[i + 1].kind == NN_RELU || sl[i + 1].kind == NN_GELU))
        l->init_kaiming = l->kind != NN_LAYERNORM;
      if (i + 1 < n && sl[i + 1].kind == NN_RELU && l->kind != NN_LAYERNORM) {
        l->relu_fused = true;
      }
    }
  }
  /* the relu after a fused linear/conv has nothing left to do in forward */
  for (int i = 0; i + 1 < n; i++)
    if (m->layers[i].relu_fused)
      m->layers[i + 1].fused_away = true;
  /* A max-pool whose windows tile its input (layers.c's tiled backward) writes a gradient only at
   * each window's arg-max, where the relu before it let through exactly when the pooled value is
   * > 0: it applies that mask itself and the relu's backward pass over the (large) map goes. */
  for (int i = 1; i < n; i++) {
    nn_layer *p = &m->layers[i];
    if (p->kind == NN_MAXPOOL && p->stride == p->k && p->in.c % 4 == 0 &&
        m->layers[i - 1].kind == NN_RELU) {
      p->relu_mask = true;
      m->layers[i - 1].bwd_fused_away = true;
    }
  }
  m->nout = nn_shape_size(s);

  /* parameters in reverse layer order, weight then bias */
  size_t off = 0;
  for (int i = n - 1; i >= 0; i--) {
    nn_layer *l = &m->layers[i];
    if (!l->nparams)
      continue;
    l->p_off = off;
    l->w_off = off;
    l->b_off = off + l->w_count;
    off += l->nparams;
  }
  m->nparams = off;
  m->params = dt__alloc(off * sizeof(float));
  m->grads = dt__calloc(off * sizeof(float));
  m->tensors = dt__calloc((ntensors ? ntensors : 1) * sizeof *m->tensors);
  m->names = dt__calloc((ntensors ? ntensors : 1) * 32);
  if (!m->params || !m->grads || !m->tensors || !m->names)
    goto nomem;
  m->ntensors = ntensors;
  size_t t = 0;
  for (int i = n - 1; i >= 0; i--) {
    nn_layer *l = &m->layers[i];
    if (!l->nparams)
      continue;
    for (int part = 0; part < 2; part++) {
      dt_tensor *T = &m->tensors[t];
      char *name = m->names + 32 * t;
      snprintf(name, 32, "%s%d.%s", kind_family(l->kind), l->index, part ? "bias" : "weight");
      T->name = name;
      if (part == 1 || l->kind == NN_LAYERNORM) {
        T->ndim = 1;
        T->shape[0] = part ? (int64_t)l->b_count : (int64_t)l->w_count;
      } else if (l->kind == NN_LINEAR) {
        T->ndim = 2;
        T->shape[0] = l->out.c;
        T->shape[1] = l->in.c;
      } else {
        T->ndim = 4;
        T->shape[0] = l->out.c;
        T->shape[1] = l->k;
        T->shape[2] = l->k;
        T->shape[3] = l->in.c;
      }
      T->offset = part ? l->b_off : l->w_off;
      T->count = part ? l->b_count : l->w_count;
      t++;
    }
  }

  m->stem = n;
  for (int i = 0; i < n; i++)
    if (m->layers[i].kind == NN_LINEAR) {
      m->stem = i;
      break;
    }
  m->stem_nb = dt__nn_conv_direct() ? STEM_SAMPLES : 0;

  /* activation arena: plan sizes first, then carve. Conv workspaces are per thread and shared
   * by all conv layers (they run one after another), sized for the largest. */
  const int T = m->nthreads = g_threads;
  openblas_set_num_threads(1);
  const size_t B = (size_t)max_batch;
  const size_t Bt = (B + (size_t)T - 1) / (size_t)T; /* samples per thread at most */
  size_t colf = 0;
  size_t total = 2 * align16(B * nn_shape_size(in)); /* input copy and its gradient */
  for (int i = 0; i < n; i++) {
    nn_layer *l = &m->layers[i];
    size_t osz = B * nn_shape_size(l->out);
    if (!kind_inplace(l->kind))
      total += 2 * align16(osz);
    if (l->kind == NN_CONV) {
      size_t rowf = (size_t)l->k * l->k * l->in.c * l->out.h * l->out.w; /* per sample */
      int64_t target;
      int64_t def = (int64_t)(strcmp(dt__nn_gemm_name(), "avx512") == 0 ? CONV_CHUNK_FLOATS_OWN_GEMM
                                                                          : CONV_CHUNK_FLOATS);
      if (dt__env_int("DTRAIN_CONV_CHUNK", def, &target) != DT_OK || target < 1)
        target = def;
      size_t ch = (size_t)target / rowf;
      l->chunk = (int)(ch < 1 ? 1 : ch > Bt ? Bt : ch);
      colf = DT_MAX(colf, (size_t)l->chunk * rowf);
      if (dt__nn_conv_fwd_direct())
        colf = DT_MAX(colf, dt__nn_conv_ws_floats(l));
    } else if (l->kind == NN_MAXPOOL) {
      total += align16(osz); /* int32 arg-max, same size as a float */
    } else if (l->kind == NN_DROPOUT) {
      total += align16((osz + 3) / 4);
    } else if (l->kind == NN_LAYERNORM) {
      total += align16(2 * B);
    }
  }
  m->arena_floats = total;
  /* not zeroed: every buffer is written before it is read, and untouched pages of a large
   * max batch then cost no memory until used */
  m->arena = dt__alloc(total * sizeof(float));
  m->col_arena = colf ? dt__alloc(2 * (size_t)T * align16(colf) * sizeof(float)) : NULL;
  size_t wpkf = 0; /* conv.c's packed weights, every conv layer, every thread */
  if (dt__nn_conv_fwd_direct())
    for (int i = 0; i < n; i++)
      if (m->layers[i].kind == NN_CONV) {
        m->layers[i].wpk_floats = dt__nn_conv_packed_floats(&m->layers[i]);
        wpkf += (size_t)T * m->layers[i].wpk_floats;
      }
  m->wpk_arena = wpkf ? dt__alloc(wpkf * sizeof(float)) : NULL;
  if (wpkf && !m->wpk_arena)
    goto nomem;
  for (size_t i = 0, o = 0; i < (size_t)n; i++)
    if (m->layers[i].wpk_floats) {
      m->layers[i].wpk = m->wpk_arena + o;
      o += (size_t)T * m->layers[i].wpk_floats;
    }
  m->priv_grads = T > 1 ? dt__alloc((size_t)(T - 1) * align16(m->nparams) * sizeof(float)) : NULL;
  m->slices = dt__calloc((size_t)T * sizeof *m->slices);
  m->loss_part = dt__calloc((size_t)T * sizeof *m->loss_part);
  m->correct_part = dt__calloc((size_t)T * sizeof *m->correct_part);
  if (!m->arena || (colf && !m->col_arena) || (T > 1 && !m->priv_grads) || !m->slices ||
      !m->loss_part || !m->correct_part)
    goto nomem;
  for (int t = 0; t < T; t++) {
    nn_slice *sl_t = &m->slices[t];
    sl_t->grads = t == 0 ? m->grads : m->priv_grads + (size_t)(t - 1) * align16(m->nparams);
    sl_t->model_grads = m->grads;
    sl_t->t = t;
    sl_t->T = T;
    if (colf) {
      sl_t->col = m->col_arena + (size_t)(2 * t) * align16(colf);
      sl_t->dcol = m->col_arena + (size_t)(2 * t + 1) * align16(colf);
    }
  }
  if (T > 1 && (rc = dt__nn_pool_create(T, &m->pool)) != DT_OK)
    goto fail;
  float *cur = m->arena;
#define CARVE(nfloats) (cur += align16(nfloats), cur - align16(nfloats))
  m->input = CARVE(B * nn_shape_size(in));
  m->dinput = CARVE(B * nn_shape_size(in));
  float *act = m->input, *dact = m->dinput;
  for (int i = 0; i < n; i++) {
    nn_layer *l = &m->layers[i];
    size_t osz = B * nn_shape_size(l->out);
    l->x = act;
    l->dx = dact;
    if (kind_inplace(l->kind)) {
      l->y = l->x;
      l->dy = l->dx;
    } else {
      l->y = CARVE(osz);
      l->dy = CARVE(osz);
    }
    l->seq = i;
    if (l->kind == NN_MAXPOOL) {
      l->idx = (int32_t *)CARVE(osz);
    } else if (l->kind == NN_DROPOUT) {
      l->mask = (uint8_t *)CARVE((osz + 3) / 4);
    } else if (l->kind == NN_LAYERNORM) {
      l->stats = CARVE(2 * B);
    }
    act = l->y;
    dact = l->dy;
  }
#undef CARVE
  m->logits = act;
  m->dlogits = dact;

  /* canonical spec */
  size_t cap = 64 + 48 * (size_t)n;
  m->spec = dt__alloc(cap);
  if (!m->spec)
    goto nomem;
  if (in.h == 1 && in.w == 1 && (n == 0 || m->layers[0].kind != NN_CONV))
    snprintf(m->spec, cap, "in=%d", in.c);
  else
    snprintf(m->spec, cap, "in=%dx%dx%d", in.c, in.h, in.w);
  for (int i = 0; i < n; i++)
    spec_append(m->spec, cap, &m->layers[i]);

  dt__nn_parallel(m, gemm_reserve_job, NULL);
  init_params(m, seed);
  dt_rng_seed(&m->rng, seed ^ 0xD5A7C0DE0D5A7C0DULL);
  dt__free(sl);
  *out = m;
  return DT_OK;
nomem:
  dt__free(sl);
  dt_model_destroy(m);
  return dt_set_error(DT_ERR_NOMEM, "model \"%s\": cannot allocate its buffers (max batch %d)",
                      spec, max_batch);
fail:
  dt__free(sl);
  dt_model_destroy(m);
  return rc;
}

void dt_model_destroy(dt_model *m) {
  if (!m)
    return;
  if (!m->params_lent)
    dt__free(m->params);
  if (!m->grads_lent)
    dt__free(m->grads);
  dt__free(m->arena);
  dt__nn_pool_destroy(m->pool);
  dt__free(m->col_arena);
  dt__free(m->wpk_arena);
  dt__free(m->priv_grads);
  dt__free(m->dtile);
  dt__free(m->slices);
  dt__free(m->loss_part);
  dt__free(m->correct_part);
  dt__free(m->tensors);
  dt__free(m->names);
  dt__free(m->layers);
  dt__free(m->spec);
  dt__free(m);
}

const char *dt_model_spec(const dt_model *m) { return m->spec; }
int dt_model_max_batch(const dt_model *m) { return m->max_batch; }
size_t dt_model_input_size(const dt_model *m) { return nn_shape_size(m->in); }
void dt_model_input_shape(const dt_model *m, int *c, int *h, int *w) {
  *c = m->in.c;
  *h = m->in.h;
  *w = m->in.w;
}
size_t dt_model_output_size(const dt_model *m) { return m->nout; }
size_t dt_model_param_count(const dt_model *m) { return m->nparams; }
float *dt_model_params(dt_model *m) { return m->params; }
float *dt_model_grads(dt_model *m) { return m->grads; }

/* Moves one arena (*cur, lent or not) into buf (NULL: memory of the model's own), copying what
 * it holds unless !copy. */
static dt_status move_arena(float **cur, bool *lent, float *buf, size_t n, bool copy) {
  float *g = buf ? buf : dt__alloc(n * sizeof(float));
  if (!g)
    return dt__error_prefix(DT_ERR_NOMEM, "arena of %zu floats", n);
  if (g == *cur)
    return DT_OK;
  if (copy)
    memcpy(g, *cur, n * sizeof(float));
  if (!*lent)
    dt__free(*cur);
  *cur = g;
  *lent = buf != NULL;
  return DT_OK;
}

dt_status dt_model_use_memory(dt_model *m, float *params, float *grads) {
  if (!m)
    return dt_set_error(DT_ERR_INVALID, "dt_model_use_memory: model is NULL");
  if ((uintptr_t)params % 64 || (uintptr_t)grads % 64)
    return dt_set_error(DT_ERR_INVALID, "dt_model_use_memory: the buffers %p and %p are not both 64-byte aligned",
                        (void *)params, (void *)grads);
  if (params && grads && (params < grads ? params + m->nparams > grads : grads + m->nparams > params))
    return dt_set_error(DT_ERR_INVALID, "dt_model_use_memory: the buffers %p and %p overlap", (void *)params,
                        (void *)grads);
  if (params || m->params_lent) /* NULL when already the model's own: nothing to do */
    DT_CHECK(move_arena(&m->params, &m->params_lent, params, m->nparams, true));
  if (grads || m->grads_lent)
    DT_CHECK(move_arena(&m->grads, &m->grads_lent, grads, m->nparams, true));
  for (int t = 0; t < m->nthreads; t++) {
    m->slices[t].model_grads = m->grads;
    if (t == 0)
      m->slices[t].grads = m->grads;
  }
  return DT_OK;
}

dt_status dt_model_share_params(dt_model *m, float *params) {
  if (!m || !params || (uintptr_t)params % 64)
    return dt_set_error(DT_ERR_INVALID, "dt_model_share_params: %s", !m ? "model is NULL" : !params ? "params is NULL"
                                                                        : "params is not 64-byte aligned");
  if (params < m->grads + m->nparams && m->grads < params + m->nparams)
    return dt_set_error(DT_ERR_INVALID, "dt_model_share_params: the buffer %p overlaps the gradients", (void *)params);
  return move_arena(&m->params, &m->params_lent, params, m->nparams, false);
}
size_t dt_model_tensor_count(const dt_model *m) { return m->ntensors; }
dt_rng *dt_model_rng(dt_model *m) { return &m->rng; }

void dt_model_set_dropout_key(dt_model *m, uint64_t key, uint64_t first) {
  m->key_set = true;
  m->next_key = key;
  m->next_first = first;
}

const dt_tensor *dt_model_tensor(const dt_model *m, size_t i) {
  return i < m->ntensors ? &m->tensors[i] : NULL;
}

/* Backward reports each parameterized layer from the last to the first (backward_job), and
 * parameters are laid out in that order: the ends are the layers' p_off + nparams backwards. */
size_t dt_model_grad_segments(const dt_model *m, size_t *ends, size_t cap) {
  size_t k = 0;
  for (int i = m->nlayers - 1; i >= 0; i--) {
    const nn_layer *ly = &m->layers[i];
    if (!ly->nparams)
      continue;
    if (k < cap)
      ends[k] = ly->p_off + ly->nparams;
    k++;
  }
  return k;
}

const dt_tensor *dt_model_find_tensor(const dt_model *m, const char *name) {
  for (size_t i = 0; i < m->ntensors; i++)
    if (!strcmp(m->tensors[i].name, name))
      return &m->tensors[i];
  return NULL;
}

/* Splits the batch across the model's threads: thread t gets samples [b0, b0 + nb). */
static void split_batch(dt_model *m, int batch, uint64_t key, uint64_t first) {
  for (int t = 0; t < m->nthreads; t++) {
    nn_slice *s = &m->slices[t];
    s->b0 = (int)((int64_t)batch * t / m->nthreads);
    s->nb = (int)((int64_t)batch * (t + 1) / m->nthreads) - s->b0;
    s->B = batch;
    s->key = key;
    s->first = first;
    s->pack = true;
  }
}

void dt__nn_parallel(dt_model *m, void (*fn)(void *arg, int t), void *arg) {
  if (m->pool)
    dt__nn_pool_run(m->pool, fn, arg);
  else
    fn(arg, 0);
}

typedef struct {
  dt_model *m;
  bool train;
  const int32_t *labels; /* eval: also the loss and hits of each slice */
} fwd_job;

static void forward_job(void *arg, int t) {
  fwd_job *j = arg;
  dt_model *m = j->m;
  const nn_slice *s = &m->slices[t];
  int i0 = 0;
  if (m->stem_nb > 0 && m->stem > 0) {
    nn_slice sub = *s;
    for (int b = 0; b < s->nb; b += m->stem_nb) {
      sub.b0 = s->b0 + b;
      sub.nb = DT_MIN(m->stem_nb, s->nb - b);
      sub.pack = b == 0;
      for (int i = 0; i < m->stem; i++)
        dt__nn_forward_layer(&m->layers[i], m->params, &sub, j->train);
    }
    i0 = m->stem;
  }
  /* A linear layer split by columns (layers.c, split_cols) needs every thread's rows of its
   * input, and the layers after it need every thread's columns: a barrier where rows were
   * written since the last one (rows) or columns (cols). Every thread takes the same ones. */
  bool rows = i0 > 0, cols = false;
  for (int i = i0; i < m->nlayers; i++) {
    nn_layer *ly = &m->layers[i];
    bool split = ly->kind == NN_LINEAR && m->nthreads > 1;
    bool idle = ly->kind == NN_FLATTEN || (ly->kind == NN_RELU && ly->fused_away);
    if ((split && (rows || cols)) || (!split && !idle && cols)) {
      dt__nn_pool_barrier(m->pool);
      rows = cols = false;
    }
    dt__nn_forward_layer(ly, m->params, s, j->train);
    if (split)
      cols = true;
    else if (!idle)
      rows = true;
  }
  if (cols && j->labels)
    dt__nn_pool_barrier(m->pool);
  if (j->labels && s->nb > 0) {
    m->correct_part[t] = 0;
    m->loss_part[t] = dt__nn_softmax_xent(m->logits + (size_t)s->b0 * m->nout, j->labels + s->b0,
                                          s->nb, (int)m->nout, 0.0f, NULL, &m->correct_part[t]);
  } else {
    m->loss_part[t] = 0.0;
    m->correct_part[t] = 0;
  }
}

static dt_status run_forward(dt_model *m, const float *x, int batch, bool train,
                             const int32_t *labels) {
  if (batch < 1 || batch > m->max_batch)
    return dt_set_error(DT_ERR_INVALID, "model forward: batch %d outside [1, %d] (max batch)",
                        batch, m->max_batch);
  if (!x)
    return dt_set_error(DT_ERR_INVALID, "model forward: input is NULL");
  const size_t C = (size_t)m->in.c, HW = (size_t)m->in.h * (size_t)m->in.w;
  if (C == 1 || HW == 1) {
    memcpy(m->input, x, (size_t)batch * C * HW * sizeof(float));
  } else { /* (C, H, W) per sample to channels-last (H, W, C) */
    for (size_t n = 0; n < (size_t)batch; n++)
      for (size_t c = 0; c < C; c++)
        for (size_t p = 0; p < HW; p++)
          m->input[(n * HW + p) * C + c] = x[(n * C + c) * HW + p];
  }
  /* every dropout mask of this pass comes from one key: the caller's (dt_model_set_dropout_key,
   * used once), else one draw of the model's RNG, with the samples numbered from 0 */
  uint64_t key = 0, first = 0;
  if (train && m->key_set) {
    key = m->next_key;
    first = m->next_first;
    m->key_set = false;
  } else if (train) {
    key = dt_rng_next(&m->rng);
  }
  split_batch(m, batch, key, first);
  fwd_job j = {m, train, labels};
  dt__nn_parallel(m, forward_job, &j);
  m->batch = batch;
  m->trained_forward = train;
  return DT_OK;
}

dt_status dt_model_forward(dt_model *m, const float *x, int batch, int train, const float **logits) {
  if (logits)
    *logits = NULL;
  DT_CHECK(run_forward(m, x, batch, train != 0, NULL));
  if (logits)
    *logits = m->logits;
  return DT_OK;
}

static dt_status check_labels(const dt_model *m, const int32_t *labels, int batch, const char *what) {
  if (!labels)
    return dt_set_error(DT_ERR_INVALID, "%s: labels are NULL", what);
  for (int i = 0; i < batch; i++)
    if (labels[i] < 0 || (size_t)labels[i] >= m->nout)
      return dt_set_error(DT_ERR_INVALID, "%s: label %d of sample %d outside [0, %zu)", what,
                          labels[i], i, m->nout);
  return DT_OK;
}

static void export_set_batch(float *exp, int batch) {
  int32_t b = batch;
  memcpy(exp, &b, sizeof b);
}

typedef struct {
  dt_model *m;
  const int32_t *labels;
  float loss_scale;
  dt_grad_hook hook;
  void *ctx;
} bwd_job;

/* Every thread runs the whole backward on its samples, but for linear layers, with two ways to
 * combine weight gradients across threads:
 *  - linear layers (the big weights): after a barrier (every thread's dy ready), thread t
 *    computes rows [t*OUT/T, (t+1)*OUT/T) of dW from ALL samples straight into the model's
 *    gradients: no private copy, no reduction pass; and its columns of dx for all samples
 *    (layers.c, split_cols), with a barrier before the layers below read their rows;
 *  - conv and layernorm (small weights, per-sample work): each thread accumulates its samples
 *    into its own buffer (thread 0: the model's; others: private ones cleared just before use)
 *    and thread 0 adds the others in once they are done with the layer.
 * Thread 0 calls the hook when a layer's gradient is complete in the model's buffer, so the
 * hook still sees final gradients in reverse layer order. */
/* After layer ly's backward on every thread's samples: thread t > 0 reports it; thread 0 adds
 * the others' private sums (or, for a split linear layer, waits for their row blocks) and calls
 * the hook. *done counts the parameter layers finished so far. */
static void layer_done(dt_model *m, const bwd_job *j, int t, const nn_layer *ly, bool split,
                       int *done) {
  if (!ly->nparams)
    return;
  (*done)++;
  if (t > 0) {
    dt__nn_pool_progress(m->pool, t, *done);
    return;
  }
  for (int u = 1; u < m->nthreads; u++) {
    if (!split && m->slices[u].nb <= 0)
      continue;
    dt__nn_pool_wait_progress(m->pool, u, *done);
    if (split)
      continue;
    const float *src = m->slices[u].grads + ly->p_off;
    float *dst = m->grads + ly->p_off;
    for (size_t k = 0; k < ly->nparams; k++)
      dst[k] += src[k];
  }
  if (j->hook)
    j->hook(j->ctx, ly->p_off, ly->nparams);
}

static void backward_job(void *arg, int t) {
  bwd_job *j = arg;
  dt_model *m = j->m;
  const nn_slice *s = &m->slices[t];
  const int B = s->B;
  if (s->nb > 0)
    m->loss_part[t] = dt__nn_softmax_xent(
        m->logits + (size_t)s->b0 * m->nout, j->labels + s->b0, s->nb, (int)m->nout,
        j->loss_scale / (float)B, m->dlogits + (size_t)s->b0 * m->nout, NULL);
  else
    m->loss_part[t] = 0.0;
  int first = m->nlayers;
  for (int i = 0; i < m->nlayers; i++)
    if (m->layers[i].nparams) {
      first = i;
      break;
    }
  int stop = m->want_dinput ? 0 : first;
  /* the stem in sub-slices (see STEM_SAMPLES) once the layers after it are done */
  int sub_end = m->stem_nb > 0 && m->stem > stop ? m->stem : stop;
  int done = 0;
  bool cols = false; /* a split linear wrote its columns of dx: the layers below need all of them */
  for (int i = m->nlayers - 1; i >= sub_end; i--) {
    nn_layer *ly = &m->layers[i];
    bool split = ly->kind == NN_LINEAR && m->nthreads > 1;
    bool need_dx = m->want_dinput || i > first;
    if (split || cols) {
      dt__nn_pool_barrier(m->pool);
      cols = false;
    }
    if (!split && ly->nparams && (t > 0 || (s->fresh && ly->kind != NN_LINEAR)))
      memset(s->grads + ly->p_off, 0, ly->nparams * sizeof(float)); /* a fresh linear writes */
    dt__nn_backward_layer(ly, m->params, s, need_dx);
    cols = split && need_dx;
    layer_done(m, j, t, ly, split, &done);
  }
  if (sub_end == stop)
    return;
  if (cols)
    dt__nn_pool_barrier(m->pool);
  for (int i = sub_end - 1; i >= stop; i--)
    if (m->layers[i].nparams && (t > 0 || s->fresh))
      memset(s->grads + m->layers[i].p_off, 0, m->layers[i].nparams * sizeof(float));
  nn_slice sub = *s;
  sub.fresh = false; /* the sub-slices add up */
  for (int b = 0; b < s->nb; b += m->stem_nb) {
    sub.b0 = s->b0 + b;
    sub.nb = DT_MIN(m->stem_nb, s->nb - b);
    sub.pack = b == 0;
    for (int i = sub_end - 1; i >= stop; i--)
      dt__nn_backward_layer(&m->layers[i], m->params, &sub, m->want_dinput || i > first);
  }
  for (int i = sub_end - 1; i >= stop; i--)
    layer_done(m, j, t, &m->layers[i], false, &done);
}

dt_status dt_model_backward(dt_model *m, const int32_t *labels, float loss_scale, dt_grad_hook hook,
                            void *ctx, float *loss) {
  if (!m->trained_forward)
    return dt_set_error(DT_ERR_STATE, "model backward: needs a forward pass in train mode first");
  DT_CHECK(check_labels(m, labels, m->batch, "model backward"));
  if (m->exp && m->batch > m->exp_rows)
    return dt_set_error(DT_ERR_INVALID, "model backward: batch %d above the export's %d rows "
                        "(dt_model_defer_linear_grads)", m->batch, m->exp_rows);
  bwd_job j = {m, labels, loss_scale, hook, ctx};
  for (int t = 0; t < m->nthreads; t++)
    m->slices[t].fresh = m->discarded;
  dt__nn_parallel(m, backward_job, &j);
  m->discarded = false;
  if (m->exp)
    export_set_batch(m->exp, m->batch);
  double total = 0.0;
  for (int t = 0; t < m->nthreads; t++)
    total += m->loss_part[t];
  if (loss)
    *loss = (float)(total / m->batch);
  m->trained_forward = false;
  return DT_OK;
}

static void zero_job(void *arg, int t) {
  dt_model *m = arg;
  size_t a = m->nparams * (size_t)t / (size_t)m->nthreads;
  size_t b = m->nparams * (size_t)(t + 1) / (size_t)m->nthreads;
  memset(m->grads + a, 0, (b - a) * sizeof(float));
}

void dt_model_zero_grad(dt_model *m) {
  m->discarded = false;
  dt__nn_parallel(m, zero_job, m);
}

void dt_model_discard_grad(dt_model *m) { m->discarded = true; }

/* ---- deferred linear weight gradients ----
 * An export is a 16-float header (the batch of the last backward, as an int32) and then, for
 * each linear layer in model order, `rows` rows of its input x and of its output gradient dy,
 * each block 16-float aligned. Every process of the same model lays out an export of the same
 * rows alike, so one rank reads another's at the same offsets. */
#define EXP_HEADER 16
/* Floats of weight gradient computed at a time by dt_model_deferred_grad (at least one row):
 * 512 KiB, in L2 until the update has used it. */
#define DEFER_TILE ((size_t)128 * 1024)

size_t dt_model_export_size(const dt_model *m, int rows) {
  size_t n = EXP_HEADER;
  for (int i = 0; i < m->nlayers; i++) {
    const nn_layer *l = &m->layers[i];
    if (l->kind == NN_LINEAR)
      n += align16((size_t)rows * l->in.c) + align16((size_t)rows * l->out.c);
  }
  return n;
}

static int export_batch(const float *exp) {
  int32_t b;
  memcpy(&b, exp, sizeof b);
  return b;
}

dt_status dt_model_defer_linear_grads(dt_model *m, float *exp, int rows) {
  if (!m)
    return dt_set_error(DT_ERR_INVALID, "dt_model_defer_linear_grads: model is NULL");
  if (exp && (rows < 1 || rows > m->max_batch))
    return dt_set_error(DT_ERR_INVALID, "dt_model_defer_linear_grads: %d rows outside [1, %d] (max batch)",
                        rows, m->max_batch);
  if ((uintptr_t)exp % 64)
    return dt_set_error(DT_ERR_INVALID, "dt_model_defer_linear_grads: the export %p is not 64-byte aligned",
                        (void *)exp);
  size_t o = EXP_HEADER;
  for (int i = 0; i < m->nlayers; i++) {
    nn_layer *l = &m->layers[i];
    l->ex_x = l->ex_dy = 0;
    if (l->kind != NN_LINEAR || !exp)
      continue;
    l->ex_x = o;
    o += align16((size_t)rows * l->in.c);
    l->ex_dy = o;
    o += align16((size_t)rows * l->out.c);
  }
  size_t tile = 0;
  for (int i = 0; exp && i < m->nlayers; i++)
    if (m->layers[i].ex_x && (size_t)m->layers[i].in.c > tile)
      tile = (size_t)m->layers[i].in.c;
  tile = tile > DEFER_TILE ? tile : DEFER_TILE;
  if (exp && m->dtile_floats < tile) { /* two tiles per thread (wgrad_rows's out and aux) */
    float *t = dt__alloc((size_t)m->nthreads * 2 * tile * sizeof(float));
    if (!t) {
      for (int i = 0; i < m->nlayers; i++)
        m->layers[i].ex_x = m->layers[i].ex_dy = 0;
      return dt__error_prefix(DT_ERR_NOMEM, "dt_model_defer_linear_grads: a tile of %zu floats", tile);
    }
    dt__free(m->dtile);
    m->dtile = t;
    m->dtile_floats = tile;
  }
  m->exp = exp;
  m->exp_rows = exp ? rows : 0;
  for (int t = 0; t < m->nthreads; t++)
    m->slices[t].exp = exp;
  if (exp)
    export_set_batch(exp, 0);
  return DT_OK;
}

void dt_model_export_clear(dt_model *m) {
  if (m->exp)
    export_set_batch(m->exp, 0);
}

/* The linear layer whose weights hold parameter pos, when its gradient is deferred; else NULL.
 * *end: where that weight ends, or else where the next deferred weight starts (or the end). */
static const nn_layer *deferred_at(const dt_model *m, size_t pos, size_t *end) {
  *end = m->nparams;
  for (int i = 0; i < m->nlayers; i++) {
    const nn_layer *l = &m->layers[i];
    if (!l->ex_x)
      continue;
    if (pos >= l->w_off && pos < l->w_off + l->w_count) {
      *end = l->w_off + l->w_count;
      return l;
    }
    if (l->w_off > pos && l->w_off < *end)
      *end = l->w_off;
  }
  return NULL;
}

/* Rows [r0, r1) of l's weight gradient, summed over the n exports left to right, into out
 * ((r1 - r0) x in floats): each export's part is one product over its own samples, rounded as
 * backward would have written it, then added on, so with several exports the result is what
 * summing the ranks' gradients gives, bit for bit. A product over few enough samples is added
 * by the product itself (beta 1); one over more, whose runs of samples the product would add
 * onto out one by one, goes through aux first. */
static void wgrad_rows(const nn_layer *l, const float *const *ex, int n, int r0, int r1, float *out, float *aux) {
  int in = l->in.c, outc = l->out.c, kb = dt__nn_sgemm_kblock();
  size_t cnt = (size_t)(r1 - r0) * in;
  bool first = true;
  for (int q = 0; q < n; q++) {
    int nb = export_batch(ex[q]);
    if (nb <= 0)
      continue;
    bool direct = first || nb <= kb;
    dt__nn_sgemm(true, false, r1 - r0, in, nb, 1.0f, ex[q] + l->ex_dy + r0, outc, ex[q] + l->ex_x, in,
                 first || !direct ? 0.0f : 1.0f, direct ? out : aux, in);
    if (!direct)
      for (size_t i = 0; i < cnt; i++)
        out[i] += aux[i];
    first = false;
  }
  if (first)
    memset(out, 0, cnt * sizeof(float));
}

size_t dt_model_deferred_grad(dt_model *m, const float *const *ex, int n, size_t lo, size_t hi,
                              float **g) {
  return dt__nn_deferred_grad(m, 0, ex, n, lo, hi, g);
}

size_t dt__nn_deferred_grad(dt_model *m, int t, const float *const *ex, int n, size_t lo, size_t hi,
                            float **g) {
  size_t end;
  const nn_layer *l = lo < hi ? deferred_at(m, lo, &end) : NULL;
  *g = NULL;
  if (lo >= hi)
    return 0;
  if (hi > end)
    hi = end;
  if (!l)
    return hi - lo;
  size_t in = (size_t)l->in.c;
  size_t r0 = (lo - l->w_off) / in, r1 = (hi - l->w_off + in - 1) / in;
  size_t rows = m->dtile_floats / in;
  if (r1 > r0 + rows)
    r1 = r0 + rows;
  float *tile = m->dtile + (size_t)t * 2 * m->dtile_floats;
  wgrad_rows(l, ex, n, (int)r0, (int)r1, tile, tile + m->dtile_floats);
  *g = tile + (lo - l->w_off - r0 * in);
  size_t stop = l->w_off + r1 * in;
  return (stop < hi ? stop : hi) - lo;
}

dt_status dt_model_eval_batch(dt_model *m, const float *x, const int32_t *labels, int batch,
                              double *loss_sum, int64_t *correct) {
  if (batch < 1)
    return dt_set_error(DT_ERR_INVALID, "model eval: batch %d must be >= 1", batch);
  DT_CHECK(check_labels(m, labels, batch, "model eval"));
  /* larger than the buffers: in pieces of max_batch */
  for (int b0 = 0; b0 < batch; b0 += m->max_batch) {
    int nb = DT_MIN(m->max_batch, batch - b0);
    DT_CHECK(run_forward(m, x + (size_t)b0 * nn_shape_size(m->in), nb, false, labels + b0));
    for (int t = 0; t < m->nthreads; t++) {
      if (loss_sum)
        *loss_sum += m->loss_part[t];
      if (correct)
        *correct += m->correct_part[t];
    }
  }
  return DT_OK;
}

int dt_model_threads(const dt_model *m) { return m->nthreads; }

void dt_nn_set_threads(int n) {
  g_threads = n < 1 ? 1 : n > 256 ? 256 : n;
  openblas_set_num_threads(1);
}

int dt_nn_threads(void) { return g_threads; }
