/* optim.c - optimizers over the flat parameter/gradient buffers (SGD with momentum, Nesterov
 * and weight decay; AdamW), gradient clipping by global norm, and learning-rate schedules.
 * Update rules follow PyTorch's torch.optim.SGD / AdamW so results can be compared with it.
 * An optimizer updates a list of ranges of the params layout (dt_optim_create: the one range of
 * every parameter; dt_optim_create_ranges: a rank's shard, ZeRO-1) and each state is one buffer
 * holding those ranges back to back; nothing is allocated after creation. The same kernels run
 * on any range, so a sharded update is bit for bit the corresponding part of a full one.
 * No per-tensor options (every parameter, biases included, gets the same weight decay). */
/* The elementwise loops here need the vectorizer's full cost model (-O2 in GCC 12 only
 * vectorizes loops without epilogues): bias+relu, pooling and updates ran 3-5x slower without.
 * CMakeLists.txt builds this file with -ffp-contract=off: the update loops run in one copy per
 * instruction set (below), and a contracted a * b + c rounds once where the others round twice,
 * so a parameter's new value would depend on the CPU and on whether it fell in a vector or in a
 * loop's tail; and with -fno-math-errno, without which AdamW's sqrtf keeps its loop scalar. */
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
  size_t nranges;
  dt_param_range *ranges;   /* increasing, disjoint */
  size_t *state_off;        /* range i's state starts at state_off[i] floats */
  size_t n;                 /* floats per state buffer: the ranges' lengths summed */
  int64_t steps;
  float lr;                 /* of the step begun by dt_optim_begin_step */
  int begun;                /* a step was begun (dt_optim_step_range may run) */
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

static dt_status optim_check(const dt_optim_config *c) {
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
  return DT_OK;
}

dt_status dt_optim_create_ranges(const dt_optim_config *cfg, dt_model *m,
                                 const dt_param_range *ranges, size_t nranges, dt_optim **out) {
  *out = NULL;
  if (!cfg || !m || (nranges && !ranges))
    return dt_set_error(DT_ERR_INVALID, "optimizer: %s is NULL",
                        !cfg ? "cfg" : !m ? "model" : "ranges");
  DT_CHECK(optim_check(cfg));
  size_t np = dt_model_param_count(m);
  for (size_t i = 0; i < nranges; i++) {
    const dt_param_range *r = &ranges[i];
    if (r->lo >= r->hi || r->hi > np || (i > 0 && r->lo < ranges[i - 1].hi))
      return dt_set_error(DT_ERR_INVALID,
                          "optimizer: range %zu [%zu, %zu) is empty, overlaps range %zu or leaves "
                          "the %zu parameters (ranges must be non-empty and increasing)",
                          i, r->lo, r->hi, i ? i - 1 : 0, np);
  }
  dt_optim *o = dt__calloc(sizeof *o);
  if (!o)
    return dt_set_error(DT_ERR_NOMEM, "optimizer: out of memory");
  o->cfg = *cfg;
  o->model = m;
  o->nranges = nranges;
  o->ranges = dt__alloc((nranges ? nranges : 1) * sizeof *o->ranges);
  o->state_off = dt__alloc((nranges ? nranges : 1) * sizeof *o->state_off);
  if (!o->ranges || !o->state_off) {
    dt_optim_destroy(o);
    return dt_set_error(DT_ERR_NOMEM, "optimizer: out of memory (%zu ranges)", nranges);
  }
  for (size_t i = 0; i < nranges; i++) {
    o->ranges[i] = ranges[i];
    o->state_off[i] = o->n;
    o->n += ranges[i].hi - ranges[i].lo;
  }
  if (cfg->kind == DT_OPTIM_SGD && cfg->momentum > 0.0f) {
    o->nstate = 1;
    o->state_name[0] = "momentum";
  } else if (cfg->kind == DT_OPTIM_ADAMW) {
    o->nstate = 2;
    o->state_name[0] = "adam_m";
    o->state_name[1] = "adam_v";
  }
  for (size_t i = 0; i < o->nstate; i++) {
    /* at least one float, so that a rank owning nothing still has a valid buffer */
    o->state[i] = dt__calloc((o->n ? o->n : 1) * sizeof(float));
    if (!o->state[i]) { /* the message before destroy: it reads o->n */
      dt_status rc = dt_set_error(DT_ERR_NOMEM, "optimizer: cannot allocate %zu floats of state", o->n);
      dt_optim_destroy(o);
      return rc;
    }
  }
  *out = o;
  return DT_OK;
}

dt_status dt_optim_create(const dt_optim_config *cfg, dt_model *m, dt_optim **out) {
  *out = NULL;
  if (!m)
    return dt_set_error(DT_ERR_INVALID, "optimizer: model is NULL");
  dt_param_range all = {0, dt_model_param_count(m)};
  return dt_optim_create_ranges(cfg, m, &all, all.hi > 0, out);
}

void dt_optim_destroy(dt_optim *o) {
  if (!o)
    return;
  for (size_t i = 0; i < 2; i++)
    dt__free(o->state[i]);
  dt__free(o->ranges);
  dt__free(o->state_off);
  dt__free(o);
}

/* The kernels take one stretch: n parameters p, their gradients g and their state (s0, s1), all
 * already offset; the update rules are PyTorch's. A job's gradient is g, or the sum of the nsum
 * arrays sum[k] times scale (dt_optim_step_range_sum). */
typedef struct {
  dt_optim *o;
  float *p;
  const float *g;
  const float *const *sum;
  int nsum;
  float scale;
  float *s0, *s1;
  size_t n;
  size_t lo;                   /* deferred (dt_optim_step_range_deferred): the range's start */
  const float *const *ex;      /* and the exports, else NULL */
} upd_job;

/* The update loops, inlined into one copy per instruction set: the base x86-64 one (4 floats a
 * step), AVX2 and AVX-512 (8 and 16). The same operations in the same order on every element
 * and no contraction, so every copy gives the same bits (test_nn_optim's lanes test). On the
 * Xeon FP16 guest one SGD-momentum step over mlp's 1.86 M parameters (three 7.4 MB arrays) took
 * 1.36 ms in base x86-64 and 0.80 with AVX-512: the base loop is bound by its instructions, not
 * by memory (2026-11-30, a standalone loop, best of 50). */
#define UPD_INLINE_ALWAYS static inline __attribute__((always_inline))
UPD_INLINE_ALWAYS void sgd_loop(float *p, const float *g, float *buf, size_t n, float lr, float mu, float wd,
                                int nesterov) {
  if (mu == 0.0f) {
    for (size_t i = 0; i < n; i++)
      p[i] -= lr * (g[i] + wd * p[i]);
  } else if (nesterov) {
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

UPD_INLINE_ALWAYS void adamw_loop(float *p, const float *g, float *mo, float *v, size_t n, float b1, float b2,
                                  float eps, float decay, float step, float bc2_sqrt) {
  for (size_t i = 0; i < n; i++) {
    float gi = g[i];
    float m1 = b1 * mo[i] + (1.0f - b1) * gi;
    float v1 = b2 * v[i] + (1.0f - b2) * gi * gi;
    mo[i] = m1;
    v[i] = v1;
    p[i] = p[i] * decay - step * m1 / (sqrtf(v1) / bc2_sqrt + eps);
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define UPD_ISA_COPIES 1
#define SGD_ARGS float *p, const float *g, float *buf, size_t n, float lr, float mu, float wd, int nesterov
#define ADAMW_ARGS float *p, const float *g, float *mo, float *v, size_t n, float b1, float b2, float eps, \
                   float decay, float step, float bc2_sqrt
__attribute__((target("avx512f"))) static void sgd_avx512(SGD_ARGS) { sgd_loop(p, g, buf, n, lr, mu, wd, nesterov); }
__attribute__((target("avx2"))) static void sgd_avx2(SGD_ARGS) { sgd_loop(p, g, buf, n, lr, mu, wd, nesterov); }
__attribute__((target("avx512f"))) static void adamw_avx512(ADAMW_ARGS) {
  adamw_loop(p, g, mo, v, n, b1, b2, eps, decay, step, bc2_sqrt);
}
__attribute__((target("avx2"))) static void adamw_avx2(ADAMW_ARGS) {
  adamw_loop(p, g, mo, v, n, b1, b2, eps, decay, step, bc2_sqrt);
}
#endif

static int g_isa_cap = 2; /* dt__nn_optim_isa_cap */

int dt__nn_optim_isa_cap(int cap) {
  int was = g_isa_cap;
  g_isa_cap = cap;
  return was;
}

#ifdef UPD_ISA_COPIES
/* 2 AVX-512, 1 AVX2, 0 base: the widest copy this CPU runs, within the tests' cap. */
static int upd_isa(void) {
  if (g_isa_cap >= 2 && __builtin_cpu_supports("avx512f"))
    return 2;
  return g_isa_cap >= 1 && __builtin_cpu_supports("avx2");
}
#endif

static void sgd_update(const dt_optim *o, float lr, float *p, const float *g, float *buf, size_t n) {
  const float wd = o->cfg.weight_decay, mu = o->cfg.momentum;
  const int nest = o->cfg.nesterov;
#ifdef UPD_ISA_COPIES
  const int isa = upd_isa();
  if (isa == 2) {
    sgd_avx512(p, g, buf, n, lr, mu, wd, nest);
    return;
  }
  if (isa == 1) {
    sgd_avx2(p, g, buf, n, lr, mu, wd, nest);
    return;
  }
#endif
  sgd_loop(p, g, buf, n, lr, mu, wd, nest);
}

static void adamw_update(const dt_optim *o, float lr, float *p, const float *g, float *mo, float *v,
                         size_t n) {
  const float b1 = o->cfg.beta1, b2 = o->cfg.beta2, eps = o->cfg.eps;
  const float decay = 1.0f - lr * o->cfg.weight_decay;
  const double t = (double)o->steps;
  const float bc1 = (float)(1.0 - pow(b1, t)), bc2_sqrt = (float)sqrt(1.0 - pow(b2, t));
  const float step = lr / bc1;
#ifdef UPD_ISA_COPIES
  const int isa = upd_isa();
  if (isa == 2) {
    adamw_avx512(p, g, mo, v, n, b1, b2, eps, decay, step, bc2_sqrt);
    return;
  }
  if (isa == 1) {
    adamw_avx2(p, g, mo, v, n, b1, b2, eps, decay, step, bc2_sqrt);
    return;
  }
#endif
  adamw_loop(p, g, mo, v, n, b1, b2, eps, decay, step, bc2_sqrt);
}

/* Updates parameters [a, a + n) of the job from gradient g (already offset). */
static void update_span(const upd_job *j, const float *g, size_t a, size_t n) {
  const dt_optim *o = j->o;
  if (o->cfg.kind == DT_OPTIM_SGD)
    sgd_update(o, o->lr, j->p + a, g, j->s0 ? j->s0 + a : NULL, n);
  else
    adamw_update(o, o->lr, j->p + a, g, j->s0 + a, j->s1 + a, n);
}

/* Floats of a summed gradient at a time: 2 KiB, in L1 until it is used. */
#define SUM_CHUNK 512

/* g[0 .. m) = (sum[0] + ... + sum[n-1])[c .. c + m), left to right. */
static void sum_chunk(float *g, const float *const *sum, int n, size_t c, size_t m) {
  const float *s = sum[0] + c;
  for (size_t i = 0; i < m; i++)
    g[i] = s[i];
  for (int k = 1; k < n; k++) {
    s = sum[k] + c;
    for (size_t i = 0; i < m; i++)
      g[i] += s[i];
  }
}

static void update_part(upd_job *j, size_t a, size_t b) {
  if (a >= b)
    return;
  if (!j->sum) {
    update_span(j, j->g + a, a, b - a);
    return;
  }
  float g[SUM_CHUNK];
  for (size_t c = a; c < b; c += SUM_CHUNK) {
    size_t m = b - c < SUM_CHUNK ? b - c : SUM_CHUNK;
    sum_chunk(g, j->sum, j->nsum, c, m);
    if (j->scale != 1.0f)
      for (size_t i = 0; i < m; i++)
        g[i] *= j->scale;
    update_span(j, g, c, m);
  }
}


/* Updates [a, b) of a deferred job on model thread t: stretch by stretch, the deferred ones from
 * the thread's tile. */
static void defer_part(upd_job *j, int t, size_t a, size_t b) {
  while (a < b) {
    float *g;
    size_t k = dt__nn_deferred_grad(j->o->model, t, j->ex, j->nsum, j->lo + a, j->lo + b, &g);
    if (!g) {
      update_part(j, a, a + k);
    } else {
      if (j->scale != 1.0f)
        for (size_t e = 0; e < k; e++)
          g[e] *= j->scale;
      update_span(j, g, a, k);
    }
    a += k;
  }
}

static void job_part(upd_job *j, int t, size_t a, size_t b) {
  if (j->ex)
    defer_part(j, t, a, b);
  else
    update_part(j, a, b);
}

static void update_job(void *arg, int t) {
  upd_job *j = arg;
  int T = dt_model_threads(j->o->model);
  /* 16-float boundaries keep each thread on its own cache lines */
  size_t a = (j->n * (size_t)t / (size_t)T) & ~(size_t)15;
  size_t b = t + 1 == T ? j->n : (j->n * (size_t)(t + 1) / (size_t)T) & ~(size_t)15;
  job_part(j, t, a, b);
}

dt_status dt_optim_begin_step(dt_optim *o, float lr) {
  if (!isfinite(lr) || lr < 0.0f)
    return dt_set_error(DT_ERR_INVALID, "optimizer step %lld: learning rate %g must be finite "
                        "and >= 0", (long long)o->steps + 1, (double)lr);
  o->steps++;
  o->lr = lr;
  o->begun = 1;
  return DT_OK;
}

/* Ranges below this many floats are updated on the calling thread alone: waking the model's
 * threads costs more than the update (a ZeRO tail is a few dozen floats). */
#define UPD_INLINE 4096

static dt_status step_range(dt_optim *o, size_t i, const float *grad, const float *const *sum, int nsum,
                            float scale, const float *const *ex) {
  if (!o->begun)
    return dt_set_error(DT_ERR_STATE, "optimizer: dt_optim_step_range before dt_optim_begin_step");
  if (i >= o->nranges)
    return dt_set_error(DT_ERR_INVALID, "optimizer: range %zu of %zu", i, o->nranges);
  const dt_param_range r = o->ranges[i];
  size_t so = o->state_off[i];
  upd_job j = {.o = o, .p = dt_model_params(o->model) + r.lo,
               .g = grad ? grad : dt_model_grads(o->model) + r.lo, .sum = sum, .nsum = nsum,
               .scale = scale, .s0 = o->nstate > 0 ? o->state[0] + so : NULL,
               .s1 = o->nstate > 1 ? o->state[1] + so : NULL, .n = r.hi - r.lo, .lo = r.lo, .ex = ex};
  if (j.n < UPD_INLINE || dt_model_threads(o->model) == 1)
    job_part(&j, 0, 0, j.n);
  else
    dt__nn_parallel(o->model, update_job, &j);
  return DT_OK;
}

dt_status dt_optim_step_range(dt_optim *o, size_t i, const float *grad) {
  return step_range(o, i, grad, NULL, 0, 1.0f, NULL);
}

/* The sources of a summed (or, with ex, deferred) range: n >= 1 of them, none NULL. */
static dt_status check_sum(const float *const *grads, const float *const *ex, int n) {
  if (!grads || n < 1)
    return dt_set_error(DT_ERR_INVALID, "optimizer: a sum of %d gradients", grads ? n : 0);
  for (int k = 0; k < n; k++)
    if (!grads[k] || (ex && !ex[k]))
      return dt_set_error(DT_ERR_INVALID, "optimizer: %s %d of the sum is NULL", grads[k] ? "export" : "gradient", k);
  return DT_OK;
}

dt_status dt_optim_step_range_sum(dt_optim *o, size_t i, const float *const *grads, int n, float scale) {
  DT_CHECK(check_sum(grads, NULL, n));
  return step_range(o, i, NULL, grads, n, scale, NULL);
}

dt_status dt_optim_step_range_deferred(dt_optim *o, size_t i, const float *const *grads,
                                       const float *const *ex, int n, float scale) {
  if (!ex)
    return dt_set_error(DT_ERR_INVALID, "optimizer: a deferred sum without exports");
  DT_CHECK(check_sum(grads, ex, n));
  return step_range(o, i, NULL, grads, n, scale, ex);
}

dt_status dt_optim_step(dt_optim *o, float lr) {
  DT_CHECK(dt_optim_begin_step(o, lr));
  for (size_t i = 0; i < o->nranges; i++)
    DT_CHECK(dt_optim_step_range(o, i, NULL));
  return DT_OK;
}

size_t dt_optim_range_count(const dt_optim *o) { return o->nranges; }

dt_param_range dt_optim_range(const dt_optim *o, size_t i) {
  return i < o->nranges ? o->ranges[i] : (dt_param_range){0, 0};
}

size_t dt_optim_state_size(const dt_optim *o) { return o->n; }

size_t dt_optim_state_offset(const dt_optim *o, size_t i) {
  return i < o->nranges ? o->state_off[i] : o->n;
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

float dt_clip_factor(double sumsq, float max_norm) {
  double norm = sqrt(sumsq);
  /* 1e-6 as PyTorch's clip_grad_norm_, so a zero gradient stays zero without a division by 0 */
  if (max_norm > 0.0f && norm > max_norm)
    return (float)(max_norm / (norm + 1e-6));
  return 1.0f;
}

double dt_grad_sumsq(const float *g, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++)
    s += (double)g[i] * g[i];
  return s;
}

double dt_grad_sumsq_of_sum(const float *const *grads, int n, size_t count) {
  float g[SUM_CHUNK];
  double s = 0.0;
  for (size_t c = 0; c < count; c += SUM_CHUNK) {
    size_t m = count - c < SUM_CHUNK ? count - c : SUM_CHUNK;
    sum_chunk(g, grads, n, c, m);
    for (size_t i = 0; i < m; i++)
      s += (double)g[i] * g[i];
  }
  return s;
}

float dt_clip_grad_norm(float *g, size_t n, float max_norm) {
  double s = dt_grad_sumsq(g, n);
  float c = dt_clip_factor(s, max_norm);
  if (c != 1.0f)
    for (size_t i = 0; i < n; i++)
      g[i] *= c;
  return (float)sqrt(s);
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
