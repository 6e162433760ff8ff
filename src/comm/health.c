/* health.c - the job's failure state in one process: a thread with its own store connection
 * sends a heartbeat every interval (min(200 ms, fault_timeout / 5)) and learns the store's
 * verdict; a local failure is published through the same thread. The first failure seen sets
 * `aborted` and makes an eventfd readable so transports blocked in poll(2) wake at once.
 * A lost store is blamed on the rank that hosts it only when comm.c said one does
 * (dt__health_set_store_rank); a store of its own (`dtrain store`) is named by its address.
 * Not here: deciding who failed (the store server does), or recovering (cli/run*.c). */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/wire.h"

/* How long dt__health_raise waits for the thread to deliver the abort, and how long the
 * goodbye may take on release: short, because both run on the way out of a failure. */
#define HEALTH_SHORT_MS 1000
#define HEALTH_STORE_UNKNOWN (-2)

struct dt__health {
  atomic_int refs;
  atomic_bool aborted;
  int efd;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* CLOCK_MONOTONIC */
  bool stop, raise_pending, raise_done;
  char verdict[DT_STORE_MSG_MAX];
  char host[256];
  int port, rank, world, fault_ms, interval_ms;
  atomic_int store_rank; /* the rank hosting the store, HEALTH_STORE_OUTSIDE, or HEALTH_STORE_UNKNOWN */
  uint8_t secret[256];
  size_t secret_len;
  dt__store *st; /* owned by the thread once it runs */
};

static void health_timespec(struct timespec *ts, int64_t deadline) {
  int64_t ns = deadline == DT_NO_DEADLINE ? dt_now_ns() + 3600 * 1000000000LL : deadline;
  ts->tv_sec = ns / 1000000000LL;
  ts->tv_nsec = ns % 1000000000LL;
}

static atomic_bool peer_lost; /* any communicator of this process */

bool dt__health_peer_lost(void) { return atomic_load(&peer_lost); }

/* First failure wins. Returns true if this call set it. Caller holds mu. */
static bool health_set_locked(dt__health *h, const char *msg) {
  if (atomic_load(&h->aborted))
    return false;
  snprintf(h->verdict, sizeof h->verdict, "%s", msg && *msg ? msg : "aborted (no reason given)");
  atomic_store(&h->aborted, true);
  uint64_t one = 1;
  ssize_t w = write(h->efd, &one, sizeof one); /* never read: stays readable */
  (void)w;
  pthread_cond_broadcast(&h->cv);
  return true;
}

/* lost: the verdict is a rank gone or not answering (not an abort that every rank can see) */
static void health_set(dt__health *h, const char *msg, bool lost) {
  if (lost)
    atomic_store(&peer_lost, true);
  pthread_mutex_lock(&h->mu);
  if (health_set_locked(h, msg))
    DT_LOG_DEBUG("health: %s", msg);
  pthread_mutex_unlock(&h->mu);
}

static void health_drop_conn(dt__health *h) {
  dt__store_close(h->st);
  h->st = NULL;
}

/* (Re)connects within the deadline. A store that actively refuses is gone: *refused = true. */
static dt_status health_connect(dt__health *h, int64_t deadline, bool *refused) {
  *refused = false;
  int probe;
  dt_status rc = dt__sock_connect_once(h->host, h->port, deadline, &probe);
  if (rc == DT_ERR_PEER) {
    *refused = true;
    return rc;
  }
  if (rc)
    return rc;
  close(probe);
  DT_CHECK(dt__store_connect(h->host, h->port, h->secret, h->secret_len, h->rank, deadline, &h->st));
  dt__store_set_world(h->st, h->world);
  return DT_OK;
}

static void health_send_abort(dt__health *h, const char *msg) {
  int64_t deadline = dt__deadline_after_ms(HEALTH_SHORT_MS);
  bool refused;
  if (!h->st && health_connect(h, deadline, &refused) != DT_OK)
    return;
  if (dt__store_abort(h->st, msg, deadline) != DT_OK && dt__store_broken(h->st))
    health_drop_conn(h);
}

static void *health_main(void *arg) {
  dt__health *h = arg;
  pthread_setname_np(pthread_self(), "dt-health");
  int64_t last_ok = dt_now_ns();
  int64_t fault_ns = (int64_t)h->fault_ms * 1000000LL;
  int64_t next_beat = dt_now_ns() + (int64_t)h->interval_ms * 1000000LL;
  char msg[DT_STORE_MSG_MAX];
  for (;;) {
    pthread_mutex_lock(&h->mu);
    while (!h->stop && !h->raise_pending && dt_now_ns() < next_beat) {
      struct timespec ts;
      health_timespec(&ts, next_beat);
      pthread_cond_timedwait(&h->cv, &h->mu, &ts);
    }
    bool stop = h->stop, raise = h->raise_pending;
    if (raise)
      snprintf(msg, sizeof msg, "%s", h->verdict);
    pthread_mutex_unlock(&h->mu);

    if (raise) {
      health_send_abort(h, msg);
      pthread_mutex_lock(&h->mu);
      h->raise_pending = false;
      h->raise_done = true;
      pthread_cond_broadcast(&h->cv);
      pthread_mutex_unlock(&h->mu);
    }
    if (stop)
      break;
    if (dt_now_ns() < next_beat)
      continue;
    next_beat = dt_now_ns() + (int64_t)h->interval_ms * 1000000LL;

    /* Each call is short so that a stop request is seen promptly; an unanswered heartbeat
     * leaves the connection in step (answers carry sequence numbers) and the next one goes on. */
    int64_t deadline = DT_MIN(dt__deadline_after_ms(DT_MAX(h->interval_ms, 100)), last_ok + fault_ns);
    dt_status rc;
    bool refused = false;
    if (!h->st)
      rc = health_connect(h, deadline, &refused);
    else
      rc = DT_OK;
    if (rc == DT_OK) {
      rc = dt__store_heartbeat(h->st, deadline);
      if (rc == DT_OK) {
        last_ok = dt_now_ns();
        continue;
      }
      if (dt__store_told(h->st) && (rc == DT_ERR_PEER || rc == DT_ERR_ABORTED)) {
        last_ok = dt_now_ns(); /* the store answered: it is alive, and it has a verdict */
        health_set(h, dt_last_error(), rc == DT_ERR_PEER);
        continue;
      }
      if (dt__store_broken(h->st)) {
        /* Lost the connection: if the store host now refuses new ones, its process is gone. */
        health_drop_conn(h);
        rc = health_connect(h, DT_MIN(dt__deadline_after_ms(DT_MAX(h->interval_ms, 100)), last_ok + fault_ns), &refused);
        if (rc == DT_OK)
          continue;
      }
    }
    if (atomic_load(&h->aborted))
      continue;
    if (refused || dt_now_ns() - last_ok >= fault_ns) {
      /* Name what was lost: the rank that hosts the store only if one does ("rank R (store
       * host ...) failed" is what launchers blame a rank by), else the store's address. */
      char who[320];
      int sr = atomic_load(&h->store_rank);
      if (sr >= 0)
        snprintf(who, sizeof who, "rank %d (store host %s:%d)", sr, h->host, h->port);
      else
        snprintf(who, sizeof who, "the store at %s:%d%s", h->host, h->port,
                 sr == DT_HEALTH_STORE_OUTSIDE ? " (its own process, not a rank of the job)" : "");
      if (refused)
        snprintf(msg, sizeof msg, "%s failed: connection lost and new ones refused (%s exited or was killed)", who,
                 sr >= 0 ? "process" : "the store's process");
      else
        snprintf(msg, sizeof msg, "%s unreachable: no answer for %d ms (hung, stopped, or cut off)", who, h->fault_ms);
      health_set(h, msg, true);
    }
  }
  if (h->st) {
    (void)dt__store_goodbye(h->st, dt__deadline_after_ms(HEALTH_SHORT_MS));
    health_drop_conn(h);
  }
  return NULL;
}

static void health_free(dt__health *h) {
  dt__store_close(h->st);
  if (h->efd >= 0)
    close(h->efd);
  pthread_mutex_destroy(&h->mu);
  pthread_cond_destroy(&h->cv);
  explicit_bzero(h->secret, sizeof h->secret);
  dt__free(h);
}

dt_status dt__health_start(const char *store_host, int store_port, const uint8_t *secret, size_t secret_len,
                           int world_rank, int world_size, int fault_timeout_ms, dt__health **out) {
  *out = NULL;
  if (fault_timeout_ms < 1 || secret_len > 256 || !store_host || strlen(store_host) >= 256)
    return dt_set_error(DT_ERR_INVALID, "health: fault timeout %d ms, secret %zu bytes, store host '%s'",
                        fault_timeout_ms, secret_len, store_host ? store_host : "(null)");
  dt__health *h = dt__calloc(sizeof *h);
  if (!h)
    return dt_set_error(DT_ERR_NOMEM, "health: out of memory");
  atomic_init(&h->refs, 1);
  atomic_init(&h->aborted, false);
  h->efd = -1;
  snprintf(h->host, sizeof h->host, "%s", store_host);
  h->port = store_port;
  h->rank = world_rank;
  h->world = world_size;
  atomic_init(&h->store_rank, HEALTH_STORE_UNKNOWN);
  h->fault_ms = fault_timeout_ms;
  h->interval_ms = DT_MAX(DT_MIN(200, fault_timeout_ms / 5), 5);
  if (secret_len)
    memcpy(h->secret, secret, secret_len);
  h->secret_len = secret_len;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&h->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&h->mu, NULL);
  dt_status rc;
  h->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (h->efd < 0) {
    rc = dt__errno(DT_ERR_SYSTEM, "health: eventfd");
    goto fail;
  }
  /* The first heartbeat is synchronous: once start returns, the store watches this rank. */
  int64_t deadline = dt__deadline_after_ms(DT_MAX(fault_timeout_ms, 10000));
  rc = dt__store_connect(store_host, store_port, secret, secret_len, world_rank, deadline, &h->st);
  if (rc == DT_OK) {
    dt__store_set_world(h->st, world_size);
    rc = dt__store_heartbeat(h->st, deadline);
  }
  if (rc) {
    dt__error_prefix(rc, "rank %d: starting the heartbeat", world_rank);
    goto fail;
  }
  int e = pthread_create(&h->thread, NULL, health_main, h);
  if (e) {
    errno = e;
    rc = dt__errno(DT_ERR_SYSTEM, "health: pthread_create");
    goto fail;
  }
  *out = h;
  return DT_OK;
fail:
  health_free(h);
  return rc;
}

void dt__health_set_store_rank(dt__health *h, int rank) {
  if (h)
    atomic_store(&h->store_rank, rank >= 0 ? rank : DT_HEALTH_STORE_OUTSIDE);
}

pthread_t dt__health_thread(const dt__health *h) { return h->thread; }

void dt__health_retain(dt__health *h) { atomic_fetch_add(&h->refs, 1); }

void dt__health_release(dt__health *h) {
  if (!h || atomic_fetch_sub(&h->refs, 1) != 1)
    return;
  pthread_mutex_lock(&h->mu);
  h->stop = true;
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
  pthread_join(h->thread, NULL);
  health_free(h);
}

bool dt__health_aborted(const dt__health *h) { return atomic_load(&((dt__health *)h)->aborted); }

int dt__health_abort_fd(const dt__health *h) { return h->efd; }

void dt__health_verdict(const dt__health *h, char *buf, size_t n) {
  dt__health *m = (dt__health *)h;
  if (!n)
    return;
  pthread_mutex_lock(&m->mu);
  snprintf(buf, n, "%s", atomic_load(&m->aborted) ? m->verdict : "");
  pthread_mutex_unlock(&m->mu);
}

void dt__health_raise(dt__health *h, const char *msg) {
  pthread_mutex_lock(&h->mu);
  if (health_set_locked(h, msg)) {
    /* Hand the message to the thread (it owns the connection) and wait a short, fixed time
     * for it to reach the store, so a process that exits right after still warned the others. */
    h->raise_pending = true;
    h->raise_done = false;
    pthread_cond_broadcast(&h->cv);
    int64_t deadline = dt__deadline_after_ms(HEALTH_SHORT_MS + 200);
    while (!h->raise_done && !dt__expired(deadline)) {
      struct timespec ts;
      health_timespec(&ts, deadline);
      pthread_cond_timedwait(&h->cv, &h->mu, &ts);
    }
  }
  pthread_mutex_unlock(&h->mu);
}
