/* loader.c - the prefetching batch loader: double buffering with one producer thread.
 *
 * Two batch slots allocated at creation. The caller holds one slot (the batch it is training
 * on) while the producer copies the next batch's samples into the other; dt_loader_next hands
 * the filled slot over and gives the held one back. Only the producer touches the sampler while
 * it runs, and slots are filled and taken in the same fixed order, so the batch sequence is the
 * serial one whatever the thread timing. No allocation after creation. Filling a slot converts
 * the dataset's u8 pixels to float (dt_dataset_gather), so that work happens on the producer
 * thread, off the training step. It does not augment or otherwise transform samples. */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "core/core.h"
#include "dtrain/data.h"

typedef struct slot {
  float *x;       /* (max_local, C, H, W) */
  int32_t *y;     /* (max_local) */
  uint32_t *idx;  /* (max_local) sample indices drawn from the sampler */
  dt_batch b;
  int full;       /* filled and not yet handed out */
} slot;

struct dt_loader {
  const dt_dataset *ds;
  dt_sampler s;
  size_t sample_floats;   /* C * H * W */
  int prefetch;
  slot slots[2];
  int take;               /* slot the caller gets next */
  int fill;               /* slot the producer fills next */
  int held;               /* slot the caller holds (-1: none) */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t th;
  int running, stop;
};

/* Draws the next global batch (rolling over to the next epoch) and copies this rank's samples.
 * Runs on the producer thread, or on the caller's thread without prefetch. */
static void fill_slot(dt_loader *l, slot *sl) {
  dt_sampler *s = &l->s;
  uint64_t B = s->cfg.global_batch, n, g;
  if (!dt_sampler_next(s, sl->idx, &n, &g)) {
    dt_sampler_set_epoch(s, s->st.epoch + 1);
    dt_sampler_next(s, sl->idx, &n, &g); /* an epoch always has >= 1 batch (checked at init) */
  }
  dt_dataset_gather(l->ds, sl->idx, n, sl->x, sl->y);
  uint64_t N = s->cfg.num_samples, pos = s->st.pos;
  sl->b.x = sl->x;
  sl->b.y = sl->y;
  sl->b.n = n;
  sl->b.global_n = g;
  sl->b.first = dt_sampler_shard_first(s, g);
  sl->b.epoch = s->st.epoch;
  sl->b.step = (pos - g) / B;
  sl->b.last_in_epoch = pos >= N || (s->cfg.drop_last && N - pos < B);
  sl->b.after = s->st;
}

static void *producer(void *arg) {
  dt_loader *l = arg;
  pthread_mutex_lock(&l->mu);
  while (!l->stop) {
    slot *sl = &l->slots[l->fill];
    if (sl->full || l->held == l->fill) {
      pthread_cond_wait(&l->cv, &l->mu);
      continue;
    }
    pthread_mutex_unlock(&l->mu);
    fill_slot(l, sl); /* the slot is neither full nor held: nobody else touches it */
    pthread_mutex_lock(&l->mu);
    sl->full = 1;
    l->fill ^= 1;
    pthread_cond_broadcast(&l->cv);
  }
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

static dt_status start_thread(dt_loader *l) {
  l->stop = 0;
  int e = pthread_create(&l->th, NULL, producer, l);
  if (e) {
    errno = e;
    return dt__errno(DT_ERR_SYSTEM, "loader: pthread_create");
  }
  l->running = 1;
  return DT_OK;
}

static void stop_thread(dt_loader *l) {
  if (!l->running)
    return;
  pthread_mutex_lock(&l->mu);
  l->stop = 1;
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
  pthread_join(l->th, NULL);
  l->running = 0;
}

static void reset_slots(dt_loader *l) {
  l->slots[0].full = l->slots[1].full = 0;
  l->take = l->fill = 0;
  l->held = -1;
}

dt_status dt_loader_create(const dt_dataset *ds, const dt_sampler_cfg *cfg,
                           const dt_loader_opts *opts, dt_loader **out) {
  if (!out)
    return dt_set_error(DT_ERR_INVALID, "dt_loader_create: out is NULL");
  *out = NULL;
  if (!ds || !cfg || !ds->pixels || !ds->labels)
    return dt_set_error(DT_ERR_INVALID, "dt_loader_create: NULL or empty dataset");
  if (ds->value[0] == ds->value[255])
    return dt_set_error(DT_ERR_INVALID, "dt_loader_create: the dataset's pixel values are not set "
                        "(value[0] == value[255] == %g; call dt_dataset_set_scaling)",
                        (double)ds->value[0]);
  if (cfg->num_samples != ds->n)
    return dt_set_error(DT_ERR_INVALID, "loader: sampler over %llu samples but dataset has %llu",
                        (unsigned long long)cfg->num_samples, (unsigned long long)ds->n);
  dt_loader *l = dt__calloc(sizeof *l);
  if (!l)
    return dt__error_prefix(DT_ERR_NOMEM, "loader");
  dt_status rc;
  l->ds = ds;
  l->prefetch = opts ? opts->prefetch : 1;
  l->sample_floats = (size_t)ds->c * (size_t)ds->h * (size_t)ds->w;
  DT_CHECK_GOTO(dt_sampler_init(&l->s, cfg), rc, fail_nomutex);
  size_t m = (size_t)dt_sampler_max_local(&l->s);
  for (int i = 0; i < (l->prefetch ? 2 : 1); i++) {
    slot *sl = &l->slots[i];
    sl->x = dt__alloc(m * l->sample_floats * sizeof(float));
    sl->y = dt__alloc(m * sizeof(int32_t));
    sl->idx = dt__alloc(m * sizeof(uint32_t));
    if (!sl->x || !sl->y || !sl->idx) {
      rc = dt__error_prefix(DT_ERR_NOMEM, "loader batch buffers (%zu samples)", m);
      goto fail_nomutex;
    }
  }
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->cv, NULL);
  reset_slots(l);
  if (l->prefetch)
    DT_CHECK_GOTO(start_thread(l), rc, fail);
  *out = l;
  return DT_OK;
fail:
  pthread_mutex_destroy(&l->mu);
  pthread_cond_destroy(&l->cv);
fail_nomutex:
  for (int i = 0; i < 2; i++) {
    dt__free(l->slots[i].x);
    dt__free(l->slots[i].y);
    dt__free(l->slots[i].idx);
  }
  dt_sampler_free(&l->s);
  dt__free(l);
  return rc;
}

dt_status dt_loader_next(dt_loader *l, dt_batch *out) {
  if (!l || !out)
    return dt_set_error(DT_ERR_INVALID, "dt_loader_next: NULL argument");
  if (!l->prefetch) {
    fill_slot(l, &l->slots[0]);
    *out = l->slots[0].b;
    return DT_OK;
  }
  if (!l->running)
    return dt_set_error(DT_ERR_STATE, "loader: prefetch thread not running (failed restart)");
  pthread_mutex_lock(&l->mu);
  if (l->held >= 0) { /* the caller is done with the previous batch */
    l->slots[l->held].full = 0;
    l->held = -1;
    pthread_cond_broadcast(&l->cv);
  }
  /* Bounded: the producer never blocks while a slot is free, and filling is a memcpy loop. */
  while (!l->slots[l->take].full)
    pthread_cond_wait(&l->cv, &l->mu);
  l->held = l->take;
  l->take ^= 1;
  *out = l->slots[l->held].b;
  pthread_mutex_unlock(&l->mu);
  return DT_OK;
}

dt_status dt_loader_seek(dt_loader *l, const dt_sampler_state *st) {
  if (!l || !st)
    return dt_set_error(DT_ERR_INVALID, "dt_loader_seek: NULL argument");
  stop_thread(l);
  reset_slots(l);
  dt_status rc = dt_sampler_restore(&l->s, st);
  if (l->prefetch) {
    dt_status rc2 = start_thread(l);
    if (rc == DT_OK)
      rc = rc2;
  }
  return rc;
}

void dt_loader_destroy(dt_loader *l) {
  if (!l)
    return;
  stop_thread(l);
  pthread_mutex_destroy(&l->mu);
  pthread_cond_destroy(&l->cv);
  for (int i = 0; i < 2; i++) {
    dt__free(l->slots[i].x);
    dt__free(l->slots[i].y);
    dt__free(l->slots[i].idx);
  }
  dt_sampler_free(&l->s);
  dt__free(l);
}
