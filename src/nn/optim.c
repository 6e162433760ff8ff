/* optim.c - optimizers over the flat parameter/gradient buffers (SGD with momentum, Nesterov
 * and weight decay; AdamW), gradient clipping by global norm, and learning-rate schedules.
 * Update rules follow PyTorch's torch.optim.SGD / AdamW so results can be compared with it.
 * Each state is one buffer in the params layout; nothing is allocated after dt_optim_create.
 * No per-tensor options (every parameter, biases included, gets the same weight decay). */
/* The elementwise loops here need the vectorizer's full cost model (-O2 in GCC 12 only
 * vectorizes loops without epilogues): bias+relu, pooling and updates ran 3-5x slower without. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/nn.h"

struct dt_optim {
  dt_optim_config cfg;
  dt_model *model;
  size_t n;
  int64_t steps;
  size_t nstate;
  float *state[2];
  const char *state_name[2];
};

dt_optim_config dt_optim_defaults(dt_optim_kind kind) {
  dt_optim_config c = {.kind = kind};
  if (kind == DT_OPTIM_ADAMW) {
    c.beta1 = 0.9f;
    c.beta2 = 0.999f;
    c.eps = 1e-8f;
    c.weight_decay = 0.01f;
  }
  return c;
}

dt_status dt_optim_create(const dt_optim_config *cfg, dt_model *m, dt_optim **out) {
  *out = NULL;
  const dt_optim_config *c = cfg;
  if (c->kind != DT_OPTIM_SGD && c->kind != DT_OPTIM_ADAMW)
    return dt_set_error(DT_ERR_INVALID, "optimizer: unknown kind %d", (int)c->kind);
  if (!(c->weight_decay >= 0.0f))
    return dt_set_error(DT_ERR_INVALID, "optimizer: weight decay %g must be >= 0",
                        (double)c->weight_decay);
  if (c->kind == DT_OPTIM_SGD) {
    if (!(c->momentum >= 0.0f && c->momentum < 1.0f))
      return dt_set_error(DT_ERR_INVALID, "sgd: momentum %g must be in [0, 1)",
                          (double)c->momentum);
    if (c->nesterov && c->momentum <= 0.0f)
      return dt_set_error(DT_ERR_INVALID, "sgd: nesterov needs momentum > 0");
  } else {
    if (!(c->beta1 >= 0.0f && c->beta1 < 1.0f) || !(c->beta2 >= 0.0f && c->beta2 < 1.0f))
      return dt_set_error(DT_ERR_INVALID, "adamw: betas (%g, %g) must be in [0, 1)",
                          (double)c->beta1, (double)c->beta2);
    if (!(c->eps > 0.0f))
      return dt_set_error(DT_ERR_INVALID, "adamw: eps %g must be > 0", (double)c->eps);
  }
  dt_optim *o = calloc(1, sizeof *o);
  if (!o)
    return dt_set_error(DT_ERR_NOMEM, "optimizer: out of memory");
  o->cfg = *c;
  o->model = m;
  o->n = dt_model_param_count(m);
  if (c->kind == DT_OPTIM_SGD && c->momentum > 0.0f) {
    o->nstate = 1;
    o->state_name[0] = "momentum";
  } else if (c->kind == DT_OPTIM_ADAMW) {
    o->nstate = 2;
    o->state_name[0] = "adam_m";
    o->state_name[1] = "adam_v";
  }
  for (size_t i = 0; i < o->nstate; i++) {
    o->state[i] = dt__calloc(o->n * sizeof(float));
    if (!o->state[i]) {
      dt_optim_destroy(o);
      return dt_set_error(DT_ERR_NOMEM, "optimizer: cannot allocate %zu floats of state", o->n);
    }
  }
  *out = o;
  return DT_OK;
}

void dt_optim_destroy(dt_optim *o) {
  if (!o)
    return;
  for (size_t i = 0; i < 2; i++)
    dt__free(o->state[i]);
  free(o);
}

/* One step over params [a, b): the model's threads each take a range. */
typedef struct {
  dt_optim *o;
  float lr;
} upd_job;

static void sgd_update(dt_optim *o, float lr, size_t a, size_t b) {
  float *p = dt_model_params(o->model) + a;
  const float *g = dt_model_grads(o->model) + a;
  const float wd = o->cfg.weight_decay, mu = o->cfg.momentum;
  const size_t n = b - a;
  if (mu == 0.0f) {
    for (size_t i = 0; i < n; i++)
      p[i] -= lr * (g[i] + wd * p[i]);
    return;
  }
  float *buf = o->state[0] + a;
  if (o->cfg.nesterov) {
    for (size_t i = 0; i < n; i++) {
      float d = g[i] + wd * p[i];
      float b = mu * buf[i] + d;
      buf[i] = b;
      p[i] -= lr * (d + mu * b);
    }
  } else {
    for (size_t i = 0; i < n; i++) {
      float d = g[i] + wd * p[i];
      float b = mu * buf[i] + d;
      buf[i] = b;
      p[i] -= lr * b;
    }
  }
}

static void adamw_update(dt_optim *o, float lr, size_t a, size_t b) {
  float *p = dt_model_params(o->model) + a;
  const float *g = dt_model_grads(o->model) + a;
  float *mo = o->state[0] + a, *v = o->state[1] + a;
  const float b1 = o->cfg.beta1, b2 = o->cfg.beta2, eps = o->cfg.eps;
  const float decay = 1.0f - lr * o->cfg.weight_decay;
  const double t = (double)o->steps;
  const float bc1 = (float)(1.0 - pow(b1, t)), bc2_sqrt = (float)sqrt(1.0 - pow(b2, t));
  const float step = lr / bc1;
  const size_t n = b - a;
  for (size_t i = 0; i < n; i++) {
    float gi = g[i];
    float m1 = b1 * mo[i] + (1.0f - b1) * gi;
    float v1 = b2 * v[i] + (1.0f - b2) * gi * gi;
    mo[i] = m1;
    v[i] = v1;
    p[i] = p[i] * decay - step * m1 / (sqrtf(v1) / bc2_sqrt + eps);
  }
}

static void update_job(void *arg, int t) {
  upd_job *j = arg;
  int T = dt_model_threads(j->o->model);
  /* 16-float boundaries keep each thread on its own cache lines */
  size_t a = (j->o->n * (size_t)t / (size_t)T) & ~(size_t)15;
  size_t b = t + 1 == T ? j->o->n : (j->o->n * (size_t)(t + 1) / (size_t)T) & ~(size_t)15;
  if (j->o->cfg.kind == DT_OPTIM_SGD)
    sgd_update(j->o, j->lr, a, b);
  else
    adamw_update(j->o, j->lr, a, b);
}

dt_status dt_optim_step(dt_optim *o, float lr) {
  if (!isfinite(lr) || lr < 0.0f)
    return dt_set_error(DT_ERR_INVALID, "optimizer step %lld: learning rate %g must be finite "
                        "and >= 0", (long long)o->steps + 1, (double)lr);
  o->steps++;
  upd_job j = {o, lr};
  dt__nn_parallel(o->model, update_job, &j);
  return DT_OK;
}

int64_t dt_optim_step_count(const dt_optim *o) { return o->steps; }
void dt_optim_set_step_count(dt_optim *o, int64_t steps) { o->steps = steps < 0 ? 0 : steps; }
size_t dt_optim_state_count(const dt_optim *o) { return o->nstate; }

float *dt_optim_state(dt_optim *o, size_t i, const char **name) {
  if (i >= o->nstate) {
    if (name)
      *name = NULL;
    return NULL;
  }
  if (name)
    *name = o->state_name[i];
  return o->state[i];
}

/* ---- clipping ---- */

float dt_clip_grad_norm(float *g, size_t n, float max_norm) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++)
    s += (double)g[i] * g[i];
  double norm = sqrt(s);
  /* 1e-6 as PyTorch's clip_grad_norm_, so a zero gradient stays zero without a division by 0 */
  if (max_norm > 0.0f && norm > max_norm) {
    float c = (float)(max_norm / (norm + 1e-6));
    for (size_t i = 0; i < n; i++)
      g[i] *= c;
  }
  return (float)norm;
}

float dt_model_clip_grad_norm(dt_model *m, float max_norm) {
  return dt_clip_grad_norm(dt_model_grads(m), dt_model_param_count(m), max_norm);
}

/* ---- schedules ---- */

float dt_lr_at(const dt_lr_schedule *s, int64_t step) {
  if (step < 0)
    step = 0;
  double lr = s->base_lr;
  switch (s->kind) {
  case DT_SCHED_CONSTANT: break;
  case DT_SCHED_STEP:
    if (s->step_size > 0)
      lr *= pow((double)s->gamma, (double)(step / s->step_size));
    break;
  case DT_SCHED_COSINE: {
    int64_t span = s->total_steps - s->warmup_steps;
    if (step >= s->warmup_steps && span > 0) {
      double t = (double)(step - s->warmup_steps) / (double)span;
      if (t > 1.0)
        t = 1.0;
      lr = s->min_lr + (s->base_lr - s->min_lr) * 0.5 * (1.0 + cos(3.14159265358979323846 * t));
    } else if (step >= s->warmup_steps) {
      lr = s->min_lr;
    }
    break;
  }
  }
  if (step < s->warmup_steps)
    lr *= (double)(step + 1) / (double)s->warmup_steps;
  return (float)lr;
}

static bool sched_num(const char *p, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double v = strtod(p, &end);
  if (errno || end == p || *end || !(v >= lo && v <= hi))
    return false;
  *out = v;
  return true;
}

dt_status dt_lr_schedule_parse(const char *text, float base_lr, int64_t total_steps,
                               dt_lr_schedule *out) {
  dt_lr_schedule s = {.kind = DT_SCHED_CONSTANT, .base_lr = base_lr, .gamma = 0.1f,
                      .total_steps = total_steps};
  char buf[128];
  if (!text || !*text || strlen(text) >= sizeof buf)
    return dt_set_error(DT_ERR_INVALID, "lr schedule \"%s\": expected constant, step:K[:GAMMA] "
                        "or cosine[:WARMUP[:MIN_LR]]", text ? text : "(null)");
  strcpy(buf, text);
  bool have_kind = false;
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *f[4] = {0};
    int nf = 0;
    for (char *s2 = NULL, *x = strtok_r(tok, ":", &s2); x && nf < 4; x = strtok_r(NULL, ":", &s2))
      f[nf++] = x;
    double v;
    if (!strncmp(f[0], "warmup=", 7) && nf == 1) {
      if (!sched_num(f[0] + 7, 0, 1e15, &v) || v != floor(v))
        return dt_set_error(DT_ERR_INVALID, "lr schedule \"%s\": warmup must be a whole number "
                            "of steps", text);
      s.warmup_steps = (int64_t)v;
      continue;
    }
    if (have_kind)
      return dt_set_error(DT_ERR_INVALID, "lr schedule \"%s\": two schedule kinds", text);
    have_kind = true;
    if (!strcmp(f[0], "constant") && nf == 1) {
      s.kind = DT_SCHED_CONSTANT;
    } else if (!strcmp(f[0], "step") && nf >= 2 && nf <= 3) {
      s.kind = DT_SCHED_STEP;
      if (!sched_num(f[1], 1, 1e15, &v) || v != floor(v))
        return dt_set_error(DT_ERR_INVALID, "lr schedule \"%s\": step size \"%s\" must be a "
                            "whole number >= 1", text, f[1]);
      s.step_size = (int64_t)v;
      if (nf == 3) {
        if (!sched_num(f[2], 0, 1, &v))
          return dt_set_error(DT_ERR_INVALID, "lr schedule \"%s\": gamma \"%s\" must be in "
                              "[0, 1]", text, f[2]);
        s.gamma = (float)v;
      }
    } else if (!strcmp(f[0], "cosine") && nf <= 3) {
      s.kind = DT_SCHED_COSINE;
      if (nf >= 2) {
        if (!sched_num(f[1], 0, 1e15, &v) || v != floor(v))
          return dt_set_error(DT_ERR_INVALID, "lr schedule \"%s\": warm-up \"%s\" must be a "
                              "whole number of steps", text, f[1]);
        s.warmup_steps = (int64_t)v;
      }
      if (nf == 3) {
        if (!sched_num(f[2], 0, base_lr, &v))
          return dt_set_error(DT_ERR_INVALID, "lr schedule \"%s\": min lr \"%s\" must be in "
                              "[0, base lr %g]", text, f[2], (double)base_lr);
        s.min_lr = (float)v;
      }
    } else {
      return dt_set_error(DT_ERR_INVALID, "lr schedule \"%s\": unknown \"%s\" (expected "
                          "constant, step:K[:GAMMA] or cosine[:WARMUP[:MIN_LR]])", text, tok);
    }
  }
  if (!have_kind)
    return dt_set_error(DT_ERR_INVALID, "lr schedule \"%s\": no schedule kind (constant, step or "
                        "cosine)", text);
  *out = s;
  return DT_OK;
}
