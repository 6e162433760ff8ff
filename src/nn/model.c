/* model.c - building a model from its spec: parameter layout (reverse layer order, see
 * dtrain/nn.h), the tensor table, the one-time activation arena, seeded initialization, and the
 * forward/backward drivers with the gradient hook. No allocation after dt_model_create. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/nn.h"

/* Target size of one conv im2col chunk in floats: 1 Mi floats (4 MiB) keeps the chunk and its
 * gradient near L2/L3 while the sgemm still sees >= ~1000 rows on the cnn preset's layers. */
#define CONV_CHUNK_FLOATS ((size_t)1 << 20)

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
  case NN_DROPOUT: snprintf(p, left, ",dropout:%g", (double)l->p); break;
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

dt_status dt_model_create(const char *spec, int max_batch, uint64_t seed, dt_model **out) {
  *out = NULL;
  if (max_batch < 1 || max_batch > (1 << 24))
    return dt_set_error(DT_ERR_INVALID, "model: max batch %d must be in [1, %d]", max_batch,
                        1 << 24);
  nn_shape in;
  nn_spec_layer *sl;
  int n;
  DT_CHECK(dt__nn_parse_spec(spec, &in, &sl, &n));
  dt_status rc = DT_ERR_NOMEM;
  dt_model *m = calloc(1, sizeof *m);
  if (!m)
    goto nomem;
  m->in = in;
  m->max_batch = max_batch;
  m->nlayers = n;
  m->layers = calloc((size_t)(n ? n : 1), sizeof *m->layers);
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
      if (l->kind == NN_LAYERNORM) {
        l->w_count = l->b_count = (size_t)l->in.c;
      } else if (l->kind == NN_LINEAR) {
        l->w_count = (size_t)l->out.c * l->in.c;
        l->b_count = (size_t)l->out.c;
      } else {
        l->w_count = (size_t)l->out.c * l->k * l->k * l->in.c;
        l->b_count = (size_t)l->out.c;
      }
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
  m->tensors = calloc(ntensors ? ntensors : 1, sizeof *m->tensors);
  m->names = calloc(ntensors ? ntensors : 1, 32);
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

  /* activation arena: plan sizes first, then carve */
  const size_t B = (size_t)max_batch;
  size_t total = 2 * align16(B * nn_shape_size(in)); /* input copy and its gradient */
  for (int i = 0; i < n; i++) {
    nn_layer *l = &m->layers[i];
    size_t osz = B * nn_shape_size(l->out);
    if (!kind_inplace(l->kind))
      total += 2 * align16(osz);
    if (l->kind == NN_CONV) {
      size_t rowf = (size_t)l->k * l->k * l->in.c * l->out.h * l->out.w; /* per sample */
      int64_t target;
      if (dt__env_int("DTRAIN_CONV_CHUNK", (int64_t)CONV_CHUNK_FLOATS, &target) != DT_OK || target < 1)
        target = (int64_t)CONV_CHUNK_FLOATS;
      size_t ch = (size_t)target / rowf;
      l->chunk = (int)(ch < 1 ? 1 : ch > B ? B : ch);
      total += 2 * align16((size_t)l->chunk * rowf);
    } else if (l->kind == NN_MAXPOOL) {
      total += align16(osz); /* int32 arg-max, same size as a float */
    } else if (l->kind == NN_DROPOUT) {
      total += align16((osz + 3) / 4);
    } else if (l->kind == NN_LAYERNORM) {
      total += align16(2 * B);
    }
  }
  m->arena_floats = total;
  m->arena = dt__calloc(total * sizeof(float));
  if (!m->arena)
    goto nomem;
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
    if (l->kind == NN_CONV) {
      size_t rowf = (size_t)l->k * l->k * l->in.c * l->out.h * l->out.w;
      l->ws = CARVE((size_t)l->chunk * rowf);
      l->ws2 = CARVE((size_t)l->chunk * rowf);
    } else if (l->kind == NN_MAXPOOL) {
      l->idx = (int32_t *)CARVE(osz);
    } else if (l->kind == NN_DROPOUT) {
      l->mask = (uint8_t *)CARVE((osz + 3) / 4);
    } else if (l->kind == NN_LAYERNORM) {
      l->ws = CARVE(2 * B);
    }
    act = l->y;
    dact = l->dy;
  }
#undef CARVE
  m->logits = act;
  m->dlogits = dact;

  /* canonical spec */
  size_t cap = 64 + 48 * (size_t)n;
  m->spec = malloc(cap);
  if (!m->spec)
    goto nomem;
  if (in.h == 1 && in.w == 1 && (n == 0 || m->layers[0].kind != NN_CONV))
    snprintf(m->spec, cap, "in=%d", in.c);
  else
    snprintf(m->spec, cap, "in=%dx%dx%d", in.c, in.h, in.w);
  for (int i = 0; i < n; i++)
    spec_append(m->spec, cap, &m->layers[i]);

  init_params(m, seed);
  dt_rng_seed(&m->rng, seed ^ 0xD5A7C0DE0D5A7C0DULL);
  free(sl);
  *out = m;
  return DT_OK;
nomem:
  free(sl);
  dt_model_destroy(m);
  return dt_set_error(rc, "model \"%s\": cannot allocate its buffers (max batch %d)", spec,
                      max_batch);
}

void dt_model_destroy(dt_model *m) {
  if (!m)
    return;
  dt__free(m->params);
  dt__free(m->grads);
  dt__free(m->arena);
  free(m->tensors);
  free(m->names);
  free(m->layers);
  free(m->spec);
  free(m);
}

const char *dt_model_spec(const dt_model *m) { return m->spec; }
int dt_model_max_batch(const dt_model *m) { return m->max_batch; }
size_t dt_model_input_size(const dt_model *m) { return nn_shape_size(m->in); }
size_t dt_model_output_size(const dt_model *m) { return m->nout; }
size_t dt_model_param_count(const dt_model *m) { return m->nparams; }
float *dt_model_params(dt_model *m) { return m->params; }
float *dt_model_grads(dt_model *m) { return m->grads; }
size_t dt_model_tensor_count(const dt_model *m) { return m->ntensors; }
dt_rng *dt_model_rng(dt_model *m) { return &m->rng; }

const dt_tensor *dt_model_tensor(const dt_model *m, size_t i) {
  return i < m->ntensors ? &m->tensors[i] : NULL;
}

const dt_tensor *dt_model_find_tensor(const dt_model *m, const char *name) {
  for (size_t i = 0; i < m->ntensors; i++)
    if (!strcmp(m->tensors[i].name, name))
      return &m->tensors[i];
  return NULL;
}

dt_status dt_model_forward(dt_model *m, const float *x, int batch, int train, const float **logits) {
  if (logits)
    *logits = NULL;
  if (batch < 1 || batch > m->max_batch)
    return dt_set_error(DT_ERR_INVALID, "model forward: batch %d outside [1, %d] (max batch)",
                        batch, m->max_batch);
  memcpy(m->input, x, (size_t)batch * nn_shape_size(m->in) * sizeof(float));
  for (int i = 0; i < m->nlayers; i++)
    dt__nn_forward_layer(&m->layers[i], m->params, batch, train != 0, &m->rng);
  m->batch = batch;
  m->trained_forward = train != 0;
  if (logits)
    *logits = m->logits;
  return DT_OK;
}

static dt_status check_labels(const dt_model *m, const int32_t *labels, int batch, const char *what) {
  for (int i = 0; i < batch; i++)
    if (labels[i] < 0 || (size_t)labels[i] >= m->nout)
      return dt_set_error(DT_ERR_INVALID, "%s: label %d of sample %d outside [0, %zu)", what,
                          labels[i], i, m->nout);
  return DT_OK;
}

dt_status dt_model_backward(dt_model *m, const int32_t *labels, float loss_scale, dt_grad_hook hook,
                            void *ctx, float *loss) {
  if (!m->trained_forward)
    return dt_set_error(DT_ERR_STATE, "model backward: needs a forward pass in train mode first");
  const int B = m->batch;
  DT_CHECK(check_labels(m, labels, B, "model backward"));
  double l = dt__nn_softmax_xent(m->logits, labels, B, (int)m->nout, loss_scale, m->dlogits, NULL);
  if (loss)
    *loss = (float)l;
  /* the first parameterized layer needs no input gradient, and layers before it no backward */
  int first = m->nlayers;
  for (int i = 0; i < m->nlayers; i++)
    if (m->layers[i].nparams) {
      first = i;
      break;
    }
  int stop = m->want_dinput ? 0 : first;
  for (int i = m->nlayers - 1; i >= stop; i--) {
    nn_layer *ly = &m->layers[i];
    dt__nn_backward_layer(ly, m->params, m->grads, B, m->want_dinput || i > first);
    if (ly->nparams && hook)
      hook(ctx, ly->p_off, ly->nparams);
  }
  m->trained_forward = false;
  return DT_OK;
}

void dt_model_zero_grad(dt_model *m) { memset(m->grads, 0, m->nparams * sizeof(float)); }

dt_status dt_model_eval_batch(dt_model *m, const float *x, const int32_t *labels, int batch,
                              double *loss_sum, int64_t *correct) {
  DT_CHECK(dt_model_forward(m, x, batch, 0, NULL));
  DT_CHECK(check_labels(m, labels, batch, "model eval"));
  int64_t c = 0;
  double l = dt__nn_softmax_xent(m->logits, labels, batch, (int)m->nout, 1.0f, NULL, &c);
  if (loss_sum)
    *loss_sum += l * batch;
  if (correct)
    *correct += c;
  return DT_OK;
}

void dt_nn_set_threads(int n) { openblas_set_num_threads(n < 1 ? 1 : n); }
int dt_nn_threads(void) { return openblas_get_num_threads(); }
