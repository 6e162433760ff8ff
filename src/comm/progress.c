/* progress.c - call ordering between blocking and nonblocking collectives, the per-communicator
 * progress thread, dt_request_wait/test, and the scratch buffers the algorithms reuse.
 *
 * Every collective, blocking or not, runs in the order it was called: a nonblocking call is
 * queued for the progress thread; a blocking call runs inline on the caller's thread when the
 * queue is empty and idle, and otherwise queues behind the pending calls and waits. Whoever
 * runs a call holds c->lock for it. The thread starts on the first nonblocking call and sleeps
 * on a condition variable when idle (no spinning).
 *
 * Requests carry their own completion flag (atomic) so that dt_request_wait after
 * dt_comm_destroy still works: destroy completes every queued request with DT_ERR_STATE.
 * It deliberately runs one call at a time: overlapping two collectives on one communicator
 * would need separate message streams per call.
 *
 * Placement: the thread runs each call on the CPU its caller submitted it from (pinned there
 * until a call comes from another CPU; DTRAIN_PROGRESS_FOLLOW=0 leaves it to the scheduler).
 * The work is the caller's, so it should take the caller's core, not another rank's: the
 * scheduler otherwise moves a thread woken by a futex next to its waker, and in an shm
 * allreduce the waker is the other rank's progress thread, on the other rank's core, whose
 * compute thread then loses the time. Measured on the 2-core guest (other jobs running, load
 * 5-7), 2 unbound workers (DTRAIN_BIND=none) x 1 thread, `dtrain train --max-steps 300`
 * (mlp) / 100 (cnn), alternated runs: mlp 10,897-16,724 samples/s following against
 * 7,068-8,703 floating; cnn 1,976-2,552 against 1,169-1,731. Bound workers (the trainer's
 * default, parallel/trainer.c) have one CPU each, so there it changes nothing. */
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/coll/coll.h"

struct dt_request {
  dt_comm *c;
  dt__coll_call call;
  struct dt_request *next;
  atomic_int done;
  dt_status st;
  char err[1024];
  int on_stack; /* a blocking call's request: the caller owns it */
  int cpu;      /* the CPU the caller submitted from (-1: unknown) */
};

struct dt__progress {
  pthread_mutex_t mu;
  pthread_cond_t work; /* queue non-empty or stop */
  pthread_cond_t done; /* some request completed */
  struct dt_request *head, *tail;
  atomic_int busy;     /* queued + running on the thread; changed under mu, read without it */
  bool started, stop;
  pthread_t th;
  void *scratch[2];
  size_t scratch_n[2];
};

static struct dt__progress *progress_get(dt_comm *c) {
  if (c->progress)
    return c->progress;
  struct dt__progress *p = calloc(1, sizeof *p);
  if (!p) {
    dt_set_error(DT_ERR_NOMEM, "progress state for a communicator");
    return NULL;
  }
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->work, NULL);
  pthread_cond_init(&p->done, NULL);
  c->progress = p;
  return p;
}

void *dt__coll_scratch(dt_comm *c, int slot, size_t bytes) {
  struct dt__progress *p = progress_get(c);
  if (!p)
    return NULL;
  if (bytes == 0)
    bytes = 64;
  if (p->scratch_n[slot] < bytes) {
    dt__free(p->scratch[slot]);
    p->scratch_n[slot] = 0;
    p->scratch[slot] = dt__alloc(bytes);
    if (!p->scratch[slot])
      return NULL;
    p->scratch_n[slot] = bytes;
  }
  return p->scratch[slot];
}

static void finish(struct dt__progress *p, struct dt_request *q, dt_status st, const char *err) {
  q->st = st;
  if (st)
    snprintf(q->err, sizeof q->err, "%s", err);
  atomic_store_explicit(&q->done, 1, memory_order_release);
  pthread_cond_broadcast(&p->done);
}

void dt__progress_drain(dt_comm *c) {
  struct dt__progress *p = c->progress;
  if (!p)
    return;
  pthread_mutex_lock(&p->mu);
  while (atomic_load(&p->busy) > 0)
    pthread_cond_wait(&p->done, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

static _Thread_local bool on_progress_thread;

bool dt__on_progress_thread(void) { return on_progress_thread; }

/* Moves the calling (progress) thread to `cpu`, the CPU its call was submitted from, when that
 * CPU is one it may use (`allowed`: its mask when it started) and it is not there already
 * (*at). Failure leaves it where it was: placement is a performance matter only. */
static void follow_caller(int cpu, const cpu_set_t *allowed, int *at) {
  if (cpu < 0 || cpu == *at || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, allowed))
    return;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  if (sched_setaffinity(0, sizeof one, &one) == 0)
    *at = cpu;
}

static void *progress_main(void *arg) {
  dt_comm *c = arg;
  on_progress_thread = true;
  struct dt__progress *p = c->progress;
  cpu_set_t allowed;
  int follow = c->env.progress_follow; /* checked by dt_comm_create (config.c) */
  int at = -1;
  if (follow && sched_getaffinity(0, sizeof allowed, &allowed) != 0)
    follow = 0;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (!p->head && !p->stop)
      pthread_cond_wait(&p->work, &p->mu);
    if (!p->head)
      break;
    struct dt_request *q = p->head;
    p->head = q->next;
    if (!p->head)
      p->tail = NULL;
    pthread_mutex_unlock(&p->mu);

    if (follow)
      follow_caller(q->cpu, &allowed, &at);
    pthread_mutex_lock(&c->lock);
    dt_status st = dt__coll_exec(c, &q->call);
    pthread_mutex_unlock(&c->lock);

    pthread_mutex_lock(&p->mu);
    atomic_fetch_sub(&p->busy, 1);
    finish(p, q, st, dt_last_error());
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

/* Appends q; starts the thread if needed. Caller holds p->mu. */
static dt_status enqueue(dt_comm *c, struct dt__progress *p, struct dt_request *q) {
  if (!p->started) {
    if (pthread_create(&p->th, NULL, progress_main, c))
      return dt_set_error(DT_ERR_SYSTEM, "cannot start the progress thread of rank %d", c->rank);
    p->started = true;
  }
  q->next = NULL;
  if (p->tail)
    p->tail->next = q;
  else
    p->head = q;
  p->tail = q;
  atomic_fetch_add(&p->busy, 1);
  pthread_cond_signal(&p->work);
  return DT_OK;
}

dt_status dt__progress_run(dt_comm *c, const dt__coll_call *call) {
  struct dt__progress *p = progress_get(c);
  if (!p)
    return DT_ERR_NOMEM;
  /* Nothing pending, and only this (the application) thread can add work: run here, without
   * taking either lock. busy reaches 0 only after the thread released c->lock (its decrement
   * orders everything it did before our acquire load), and it cannot start again until we
   * queue something. Two lock round trips were ~15% of a small allreduce's cost. */
  if (atomic_load_explicit(&p->busy, memory_order_acquire) == 0)
    return dt__coll_exec(c, call);
  pthread_mutex_lock(&p->mu);
  if (atomic_load(&p->busy) == 0) {
    pthread_mutex_unlock(&p->mu);
    return dt__coll_exec(c, call);
  }
  struct dt_request q = {.c = c, .call = *call, .on_stack = 1, .cpu = sched_getcpu()};
  dt_status st = enqueue(c, p, &q);
  if (st == DT_OK)
    while (!atomic_load_explicit(&q.done, memory_order_acquire))
      pthread_cond_wait(&p->done, &p->mu);
  pthread_mutex_unlock(&p->mu);
  if (st)
    return st;
  if (q.st)
    dt_set_error(q.st, "%s", q.err);
  return q.st;
}

dt_status dt__progress_submit(dt_comm *c, const dt__coll_call *call, dt_request **req) {
  struct dt__progress *p = progress_get(c);
  if (!p)
    return DT_ERR_NOMEM;
  struct dt_request *q = calloc(1, sizeof *q);
  if (!q)
    return dt_set_error(DT_ERR_NOMEM, "request for %s", dt__coll_name(call->kind));
  q->c = c;
  q->call = *call;
  q->cpu = sched_getcpu();
  pthread_mutex_lock(&p->mu);
  dt_status st = enqueue(c, p, q);
  pthread_mutex_unlock(&p->mu);
  if (st) {
    free(q);
    return st;
  }
  *req = q;
  return DT_OK;
}

void dt__progress_destroy(struct dt__progress *p) {
  if (!p)
    return;
  pthread_mutex_lock(&p->mu);
  /* Calls that have not started never will: the communicator is going away. */
  while (p->head) {
    struct dt_request *q = p->head;
    p->head = q->next;
    atomic_fetch_sub(&p->busy, 1);
    finish(p, q, DT_ERR_STATE, "communicator destroyed before this nonblocking call ran");
  }
  p->tail = NULL;
  p->stop = true;
  pthread_cond_signal(&p->work);
  bool started = p->started;
  pthread_mutex_unlock(&p->mu);
  if (started)
    pthread_join(p->th, NULL);
  for (int i = 0; i < 2; i++)
    dt__free(p->scratch[i]);
  pthread_cond_destroy(&p->work);
  pthread_cond_destroy(&p->done);
  pthread_mutex_destroy(&p->mu);
  free(p);
}

dt_status dt_request_wait(dt_request *req) {
  if (!req)
    return dt_set_error(DT_ERR_INVALID, "dt_request_wait: request is NULL");
  if (!atomic_load_explicit(&req->done, memory_order_acquire)) {
    /* not done means the communicator (and its progress state) is still alive */
    struct dt__progress *p = req->c->progress;
    pthread_mutex_lock(&p->mu);
    while (!atomic_load_explicit(&req->done, memory_order_acquire))
      pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
  }
  dt_status st = req->st;
  if (st)
    dt_set_error(st, "%s", req->err);
  free(req);
  return st;
}

dt_status dt_request_test(dt_request *req, int *done) {
  if (!req || !done)
    return dt_set_error(DT_ERR_INVALID, "dt_request_test: NULL argument");
  *done = atomic_load_explicit(&req->done, memory_order_acquire);
  return DT_OK;
}

#define SUBMIT(kind, s, r, cnt, t, op, root)                                       \
  do {                                                                             \
    if (!req) /* fails the job as any bad argument of a collective does */        \
      return dt__comm_fail(c, dt_set_error(DT_ERR_INVALID, "%s: request pointer is NULL", dt__coll_name(kind))); \
    *req = NULL;                                                                   \
    DT_CHECK(dt__comm_enter(c, kind));                                             \
    dt__coll_call call_;                                                           \
    dt_status st_ = dt__coll_prepare(c, kind, s, r, cnt, t, op, root, &call_);     \
    if (st_ == DT_OK)                                                              \
      st_ = dt__progress_submit(c, &call_, req);                                   \
    dt__comm_leave(c);                                                             \
    return st_;                                                                    \
  } while (0)

dt_status dt_comm_iallreduce(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t, dt_op op,
                             dt_request **req) {
  SUBMIT(DT_COLL_ALLREDUCE, sendbuf, recvbuf, count, t, op, -1);
}

dt_status dt_comm_ibroadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root, dt_request **req) {
  SUBMIT(DT_COLL_BROADCAST, NULL, buf, count, t, 0, root);
}

dt_status dt_comm_iallgather(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t,
                             dt_request **req) {
  SUBMIT(DT_COLL_ALLGATHER, sendbuf, recvbuf, count, t, 0, -1);
}

dt_status dt_comm_ireduce_scatter(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t,
                                  dt_op op, dt_request **req) {
  SUBMIT(DT_COLL_REDUCE_SCATTER, sendbuf, recvbuf, count, t, op, -1);
}

dt_status dt_comm_ibarrier(dt_comm *c, dt_request **req) { SUBMIT(DT_COLL_BARRIER, NULL, NULL, 0, DT_U8, 0, -1); }

dt_status dt_comm_ireduce(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t, dt_op op,
                          int root, dt_request **req) {
  SUBMIT(DT_COLL_REDUCE, sendbuf, recvbuf, count, t, op, root);
}

dt_status dt_comm_igather(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t, int root,
                          dt_request **req) {
  SUBMIT(DT_COLL_GATHER, sendbuf, recvbuf, count, t, 0, root);
}

dt_status dt_comm_iscatter(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t, int root,
                           dt_request **req) {
  SUBMIT(DT_COLL_SCATTER, sendbuf, recvbuf, count, t, 0, root);
}

dt_status dt_comm_ialltoall(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t,
                            dt_request **req) {
  SUBMIT(DT_COLL_ALLTOALL, sendbuf, recvbuf, count, t, 0, -1);
}
