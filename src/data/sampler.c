/* sampler.c - the distributed sampler: a seeded permutation per epoch, identical on every rank,
 * cut into global batches and each global batch into `world` contiguous shards.
 * It holds indices only; it never touches sample data (the loader does). */
#include <string.h>

#include "core/core.h"
#include "dtrain/data.h"

/* The permutation of an epoch depends on (seed, epoch) only: rank and world never enter it,
 * which is what makes every rank agree and lets a job resume with a different world size. */
static void build_perm(dt_sampler *s) {
  uint64_t n = s->cfg.num_samples;
  for (uint64_t i = 0; i < n; i++)
    s->perm[i] = (uint32_t)i;
  if (!s->cfg.shuffle)
    return;
  dt_rng r;
  /* Odd constant (2^64 / golden ratio) spreads consecutive epochs over distinct seeds. */
  dt_rng_seed(&r, s->cfg.seed ^ ((s->st.epoch + 1) * 0x9E3779B97F4A7C15ull));
  for (uint64_t i = n - 1; i > 0; i--) {
    uint64_t j = dt_rng_below(&r, i + 1);
    uint32_t t = s->perm[i];
    s->perm[i] = s->perm[j];
    s->perm[j] = t;
  }
}

dt_status dt_sampler_init(dt_sampler *s, const dt_sampler_cfg *cfg) {
  if (!s || !cfg)
    return dt_set_error(DT_ERR_INVALID, "dt_sampler_init: NULL argument");
  memset(s, 0, sizeof *s);
  if (cfg->num_samples == 0 || cfg->num_samples > UINT32_MAX)
    return dt_set_error(DT_ERR_INVALID, "sampler: %llu samples (expected 1..%u)",
                        (unsigned long long)cfg->num_samples, UINT32_MAX);
  if (cfg->global_batch == 0)
    return dt_set_error(DT_ERR_INVALID, "sampler: global batch must be >= 1");
  if (cfg->world < 1 || cfg->rank < 0 || cfg->rank >= cfg->world)
    return dt_set_error(DT_ERR_INVALID, "sampler: rank %d of world %d", cfg->rank, cfg->world);
  if (cfg->drop_last && cfg->global_batch > cfg->num_samples)
    return dt_set_error(DT_ERR_INVALID, "sampler: global batch %llu > %llu samples with drop_last "
                        "leaves no batch", (unsigned long long)cfg->global_batch,
                        (unsigned long long)cfg->num_samples);
  s->perm = dt__alloc((size_t)cfg->num_samples * sizeof(uint32_t));
  if (!s->perm)
    return dt__error_prefix(DT_ERR_NOMEM, "sampler permutation");
  s->cfg = *cfg;
  s->st.seed = cfg->seed;
  build_perm(s);
  return DT_OK;
}

void dt_sampler_free(dt_sampler *s) {
  if (!s)
    return;
  dt__free(s->perm);
  memset(s, 0, sizeof *s);
}

uint64_t dt_sampler_steps_per_epoch(const dt_sampler *s) {
  uint64_t n = s->cfg.num_samples, b = s->cfg.global_batch;
  return s->cfg.drop_last ? n / b : (n + b - 1) / b;
}

uint64_t dt_sampler_max_local(const dt_sampler *s) {
  return (s->cfg.global_batch + (uint64_t)s->cfg.world - 1) / (uint64_t)s->cfg.world;
}

uint64_t dt_sampler_shard_first(const dt_sampler *s, uint64_t global) {
  uint64_t world = (uint64_t)s->cfg.world, r = (uint64_t)s->cfg.rank;
  return r * (global / world) + DT_MIN(r, global % world);
}

bool dt_sampler_next(dt_sampler *s, uint32_t *idx, uint64_t *local, uint64_t *global) {
  uint64_t n = s->cfg.num_samples, B = s->cfg.global_batch, pos = s->st.pos;
  if (pos >= n || (s->cfg.drop_last && n - pos < B)) {
    *local = *global = 0;
    return false;
  }
  uint64_t b = DT_MIN(B, n - pos), world = (uint64_t)s->cfg.world, r = (uint64_t)s->cfg.rank;
  uint64_t cnt = b / world + (r < b % world ? 1 : 0);
  uint64_t off = dt_sampler_shard_first(s, b);
  if (cnt)
    memcpy(idx, s->perm + pos + off, (size_t)cnt * sizeof(uint32_t));
  s->st.pos = pos + b;
  *local = cnt;
  *global = b;
  return true;
}

void dt_sampler_set_epoch(dt_sampler *s, uint64_t epoch) {
  s->st.epoch = epoch;
  s->st.pos = 0;
  build_perm(s);
}

dt_status dt_sampler_restore(dt_sampler *s, const dt_sampler_state *st) {
  if (!s || !st)
    return dt_set_error(DT_ERR_INVALID, "dt_sampler_restore: NULL argument");
  if (st->seed != s->cfg.seed)
    return dt_set_error(DT_ERR_INVALID, "sampler: saved seed %llu != configured seed %llu",
                        (unsigned long long)st->seed, (unsigned long long)s->cfg.seed);
  if (st->pos > s->cfg.num_samples)
    return dt_set_error(DT_ERR_INVALID, "sampler: saved position %llu > %llu samples",
                        (unsigned long long)st->pos, (unsigned long long)s->cfg.num_samples);
  if (st->epoch != s->st.epoch) /* perm always holds the current epoch's permutation */
    dt_sampler_set_epoch(s, st->epoch);
  s->st.pos = st->pos;
  return DT_OK;
}
