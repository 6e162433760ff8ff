/* pool.c - the engine's compute threads: a fixed set of workers created with the model that
 * run one job at a time (a forward, a backward, an optimizer update) on slices of the batch or
 * of the parameter buffer, with the calling thread as thread 0. Workers sleep on a condition
 * variable between jobs, so an idle model costs no CPU (unlike spinning BLAS threads, which
 * would steal the core from a data loader or a communication thread).
 * Not a general task scheduler: one job at a time, every thread runs the same function. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "nn/nn.h"

struct nn_pool {
  int n;                    /* threads including the caller */
  pthread_t *tids;
  pthread_mutex_t mu;
  pthread_cond_t work, done;
  uint64_t seq;             /* job number; workers run each new one once */
  void (*fn)(void *, int);
  void *arg;
  int running;              /* workers still in the current job */
  int *progress;            /* per thread, within a job */
  int bar_count;            /* threads waiting at the barrier */
  uint64_t bar_gen;
  bool quit;
};

typedef struct {
  nn_pool *p;
  int t;
} pool_start;

static void *pool_main(void *arg) {
  pool_start st = *(pool_start *)arg;
  dt__free(arg);
  nn_pool *p = st.p;
  uint64_t seen = 0;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (!p->quit && p->seq == seen)
      pthread_cond_wait(&p->work, &p->mu);
    if (p->quit)
      break;
    seen = p->seq;
    void (*fn)(void *, int) = p->fn;
    void *a = p->arg;
    pthread_mutex_unlock(&p->mu);
    fn(a, st.t);
    pthread_mutex_lock(&p->mu);
    if (--p->running == 0)
      pthread_cond_broadcast(&p->done);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

dt_status dt__nn_pool_create(int nthreads, nn_pool **out) {
  *out = NULL;
  nn_pool *p = dt__calloc(sizeof *p);
  if (!p)
    return dt_set_error(DT_ERR_NOMEM, "nn thread pool: out of memory");
  p->n = nthreads;
  p->tids = dt__calloc((size_t)nthreads * sizeof *p->tids);
  p->progress = dt__calloc((size_t)nthreads * sizeof *p->progress);
  if (!p->tids || !p->progress) {
    dt__free(p->tids);
    dt__free(p->progress);
    dt__free(p);
    return dt_set_error(DT_ERR_NOMEM, "nn thread pool: out of memory");
  }
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->work, NULL);
  pthread_cond_init(&p->done, NULL);
  for (int t = 1; t < nthreads; t++) {
    pool_start *st = dt__alloc(sizeof *st);
    if (st)
      *st = (pool_start){p, t};
    int err = st ? pthread_create(&p->tids[t], NULL, pool_main, st) : -1;
    if (err != 0) {
      dt__free(st);
      p->n = t; /* join the ones that started */
      dt__nn_pool_destroy(p);
      if (!st)
        return dt__error_prefix(DT_ERR_NOMEM, "nn thread pool: thread %d of %d", t, nthreads);
      return dt_set_error(DT_ERR_SYSTEM, "nn thread pool: cannot start thread %d of %d: %s", t,
                          nthreads, strerror(err));
    }
  }
  *out = p;
  return DT_OK;
}

void dt__nn_pool_destroy(nn_pool *p) {
  if (!p)
    return;
  pthread_mutex_lock(&p->mu);
  p->quit = true;
  pthread_cond_broadcast(&p->work);
  pthread_mutex_unlock(&p->mu);
  for (int t = 1; t < p->n; t++)
    pthread_join(p->tids[t], NULL);
  pthread_cond_destroy(&p->work);
  pthread_cond_destroy(&p->done);
  pthread_mutex_destroy(&p->mu);
  dt__free(p->tids);
  dt__free(p->progress);
  dt__free(p);
}

void dt__nn_pool_run(nn_pool *p, void (*fn)(void *arg, int t), void *arg) {
  pthread_mutex_lock(&p->mu);
  p->fn = fn;
  p->arg = arg;
  p->running = p->n - 1;
  for (int t = 0; t < p->n; t++)
    p->progress[t] = 0;
  p->seq++;
  pthread_cond_broadcast(&p->work);
  pthread_mutex_unlock(&p->mu);
  fn(arg, 0);
  pthread_mutex_lock(&p->mu);
  while (p->running > 0)
    pthread_cond_wait(&p->done, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

void dt__nn_pool_progress(nn_pool *p, int t, int k) {
  pthread_mutex_lock(&p->mu);
  p->progress[t] = k;
  pthread_cond_broadcast(&p->done);
  pthread_mutex_unlock(&p->mu);
}

void dt__nn_pool_wait_progress(nn_pool *p, int t, int k) {
  pthread_mutex_lock(&p->mu);
  while (p->progress[t] < k)
    pthread_cond_wait(&p->done, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

void dt__nn_pool_barrier(nn_pool *p) {
  pthread_mutex_lock(&p->mu);
  uint64_t gen = p->bar_gen;
  if (++p->bar_count == p->n) {
    p->bar_count = 0;
    p->bar_gen++;
    pthread_cond_broadcast(&p->done);
  } else {
    while (gen == p->bar_gen)
      pthread_cond_wait(&p->done, &p->mu);
  }
  pthread_mutex_unlock(&p->mu);
}
