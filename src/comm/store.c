/* store.c - the rendezvous store: server thread (one poll loop, nonblocking sockets, bounded
 * per-connection buffers) and the synchronous client, plus the failure detector that lives in
 * the server. The protocol is private to this file: after the wire.h handshake each request is
 * one frame
 *     payload = seq u32 | key length u16 | key | op-specific body
 * and each answer one RESP frame
 *     payload = seq u32 | status u32 (a dt_status) | body (value, integer, or error text).
 * A client matches answers to requests by seq, so an answer to a WAIT it gave up on is skipped.
 * Not here: persistence, replication, or moving the store to another host (elastic, later). */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/store.h"
#include "comm/wire.h"

enum {
  OP_SET = 0x5301,
  OP_GET,
  OP_WAIT,
  OP_ADD,
  OP_CAS,
  OP_DELETE,
  OP_HEARTBEAT,
  OP_ABORT,
  OP_GOODBYE,
  OP_CLAIM,
  OP_RESP = 0x5380,
};

#define REQ_PREFIX (4 + 2)
/* Largest request: CAS with two full values. Nothing longer is ever buffered. */
#define REQ_MAX ((uint64_t)REQ_PREFIX + DT_STORE_KEY_MAX + 4 + 2 * (uint64_t)DT_STORE_VALUE_MAX)
#define RESP_MAX ((uint64_t)8 + DT_STORE_VALUE_MAX)
#define MAX_CONNS 4096
#define MAX_WAITS_PER_CONN 64


/* ======================================================================================== */
/* server                                                                                    */
/* ======================================================================================== */

typedef struct kv_entry {
  struct kv_entry *next;
  uint8_t *val;
  size_t n;
  uint64_t owner; /* the connection that claimed the key (OP_CLAIM), 0 if none */
  char key[];
} kv_entry;

typedef struct conn {
  int fd;
  uint64_t cid; /* unique for the server's life; waiters refer to it */
  char peer[80];
  bool authed, dead, reaped;
  int64_t hs_deadline;
  uint8_t nonce[32];
  uint32_t id; /* announced in the handshake: the rank, or anything for tools */
  uint8_t hdr[DT_WIRE_HDR_LEN];
  size_t hdr_got;
  dt__frame f;
  bool in_body;
  uint8_t small[DT_AUTH_LEN]; /* handshake body: no allocation before authentication */
  uint8_t *in;
  size_t in_got;
  uint8_t *out;
  size_t out_len, out_off, out_cap;
  size_t pre_bytes; /* bytes a stranger sent before failing (for the log) */
  int nwaits;
  bool claimed; /* holds keys (OP_CLAIM): they go when it does */
} conn;

typedef struct waiter {
  uint64_t cid;
  bool live; /* answered with the verdict when there is one */
  uint32_t seq;
  int64_t deadline;
  char key[DT_STORE_KEY_MAX + 1];
} waiter;

typedef struct rank_state {
  int64_t last_ns;
  uint64_t hb_cid;
  bool watched, left;
} rank_state;

struct dt__store_server {
  pthread_t thread;
  int lfd, wake_fd;
  atomic_bool stop;
  uint8_t secret[256];
  size_t secret_len;
  int world, fault_ms, hs_ms;
  conn **conns;
  size_t nconns, conns_cap;
  uint64_t next_cid;
  waiter *waits;
  size_t nwaits, waits_cap;
  kv_entry **buckets;
  size_t nbuckets, nkeys;
  rank_state *ranks;
  pthread_mutex_t lock; /* guards the fields read by dt__store_server_drain */
  pthread_cond_t cond;
  int live;             /* ranks watched and neither gone nor failed */
  int seen;             /* ranks that ever sent a heartbeat */
  dt_status verdict_st; /* DT_OK until a rank failed or aborted; then sticky */
  char verdict[DT_STORE_MSG_MAX];
  bool verdict_told;    /* every live rank was sent the verdict (dt__store_server_settle) */
  int64_t listen_pause_until;
  int64_t tick_due; /* when the last poll should have returned at the latest */
  int64_t accept_warned;
  int64_t log_window;
  int log_count, log_suppressed;
};

/* ---- key-value table (chained hash, FNV-1a) ---- */

static uint64_t kv_hash(const char *k) {
  uint64_t h = 1469598103934665603ull;
  for (; *k; k++)
    h = (h ^ (uint8_t)*k) * 1099511628211ull;
  return h;
}

static kv_entry **kv_slot(dt__store_server *s, const char *key) {
  kv_entry **p = &s->buckets[kv_hash(key) & (s->nbuckets - 1)];
  while (*p && strcmp((*p)->key, key) != 0)
    p = &(*p)->next;
  return p;
}

static kv_entry *kv_find(dt__store_server *s, const char *key) { return *kv_slot(s, key); }

static void kv_grow(dt__store_server *s) {
  size_t nb = s->nbuckets * 2;
  kv_entry **b = dt__calloc(nb * sizeof *b);
  if (!b)
    return; /* keep the old table: longer chains, still correct */
  for (size_t i = 0; i < s->nbuckets; i++)
    for (kv_entry *e = s->buckets[i], *next; e; e = next) {
      next = e->next;
      kv_entry **slot = &b[kv_hash(e->key) & (nb - 1)];
      e->next = *slot;
      *slot = e;
    }
  dt__free(s->buckets);
  s->buckets = b;
  s->nbuckets = nb;
}

/* Stores a copy of val (two parts concatenated, so CAS/ADD need no temporary). */
static dt_status kv_put(dt__store_server *s, const char *key, const void *val, size_t n) {
  uint8_t *copy = dt__alloc(n ? n : 1);
  if (!copy)
    return dt_set_error(DT_ERR_NOMEM, "store: cannot allocate %zu bytes for key '%s'", n, key);
  if (n)
    memcpy(copy, val, n);
  kv_entry **slot = kv_slot(s, key);
  if (*slot) {
    dt__free((*slot)->val);
    (*slot)->val = copy;
    (*slot)->n = n;
    return DT_OK;
  }
  size_t kl = strlen(key);
  kv_entry *e = dt__alloc(sizeof *e + kl + 1);
  if (!e) {
    dt__free(copy);
    return dt_set_error(DT_ERR_NOMEM, "store: cannot allocate key '%s'", key);
  }
  memcpy(e->key, key, kl + 1);
  e->val = copy;
  e->n = n;
  e->owner = 0;
  e->next = NULL;
  *slot = e;
  if (++s->nkeys > s->nbuckets)
    kv_grow(s);
  return DT_OK;
}

static void kv_delete(dt__store_server *s, const char *key) {
  kv_entry **slot = kv_slot(s, key);
  if (*slot) {
    kv_entry *e = *slot;
    *slot = e->next;
    dt__free(e->val);
    dt__free(e);
    s->nkeys--;
  }
}

/* The keys a closed connection claimed go with it. */
static void kv_release(dt__store_server *s, uint64_t cid) {
  for (size_t b = 0; b < s->nbuckets; b++)
    for (kv_entry **p = &s->buckets[b]; *p;) {
      kv_entry *e = *p;
      if (e->owner != cid) {
        p = &e->next;
        continue;
      }
      *p = e->next;
      dt__free(e->val);
      dt__free(e);
      s->nkeys--;
    }
}

/* ---- output ---- */

static void conn_kill(dt__store_server *s, conn *c);

/* Tries to send what is queued; leaves the rest for POLLOUT. */
static void conn_flush(dt__store_server *s, conn *c) {
  while (c->out_off < c->out_len) {
    ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      c->out_off += (size_t)w;
      continue;
    }
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    conn_kill(s, c);
    return;
  }
  c->out_off = c->out_len = 0;
  if (c->out_cap > (1u << 20)) { /* do not keep a 16 MiB buffer for a connection that sent one value */
    dt__free(c->out);
    c->out = NULL;
    c->out_cap = 0;
  }
}

static bool conn_queue(conn *c, const void *a, size_t an) {
  if (c->out_len + an > c->out_cap) {
    if (c->out_off) {
      memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
      c->out_len -= c->out_off;
      c->out_off = 0;
    }
    if (c->out_len + an > c->out_cap) {
      size_t cap = DT_MAX(c->out_cap * 2, c->out_len + an);
      uint8_t *p = dt__realloc(c->out, cap);
      if (!p)
        return false;
      c->out = p;
      c->out_cap = cap;
    }
  }
  memcpy(c->out + c->out_len, a, an);
  c->out_len += an;
  return true;
}

/* Queues a RESP frame: seq, status, then body parts. */
static void respond(dt__store_server *s, conn *c, uint32_t seq, dt_status st, const void *b1, size_t n1, const void *b2,
                    size_t n2) {
  if (c->dead)
    return;
  uint8_t head[DT_WIRE_HDR_LEN + 8];
  dt__frame_encode(head, OP_RESP, 8 + n1 + n2);
  dt__put32(head + DT_WIRE_HDR_LEN, seq);
  dt__put32(head + DT_WIRE_HDR_LEN + 4, (uint32_t)st);
  if (!conn_queue(c, head, sizeof head) || (n1 && !conn_queue(c, b1, n1)) || (n2 && !conn_queue(c, b2, n2))) {
    DT_LOG_WARN("store: out of memory answering %s (rank %u); closing it", c->peer, c->id);
    conn_kill(s, c);
    return;
  }
  conn_flush(s, c);
}

static void respond_text(dt__store_server *s, conn *c, uint32_t seq, dt_status st, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void respond_text(dt__store_server *s, conn *c, uint32_t seq, dt_status st, const char *fmt, ...) {
  char msg[DT_STORE_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  respond(s, c, seq, st, msg, (size_t)DT_MIN(n, (int)sizeof msg - 1), NULL, 0);
}

/* At most LOG_PER_S refusal lines per second so a flood cannot drown the log; the rest are
 * counted and reported in one line when the second is over (log_refused_flush). */
#define LOG_PER_S 50
static void log_refused_flush(dt__store_server *s, int64_t sec) {
  if (sec == s->log_window)
    return;
  if (s->log_suppressed)
    DT_LOG_WARN("store: %d more refused connections were not logged", s->log_suppressed);
  s->log_window = sec;
  s->log_count = 0;
  s->log_suppressed = 0;
}

static void log_refused(dt__store_server *s, const char *peer, const char *why) {
  log_refused_flush(s, dt_now_ns() / 1000000000LL);
  if (s->log_count++ < LOG_PER_S)
    DT_LOG_WARN("refused connection from %s: %s", peer, why);
  else
    s->log_suppressed++;
}

/* ---- failure detector ---- */

/* from: the connection whose request brought the verdict (NULL for one the server reached itself):
 * it is answered after every other rank was told, not pushed to. Its answer ends the raising
 * rank's wait (health.c), and that rank may exit at once, ending this store if it is the host,
 * while the loop below has not reached every rank yet. A push wakes another raiser in the host's
 * process the same way, so the host's failing calls also wait for verdict_told
 * (dt__store_server_settle, comm.c). Without both, 4 tcp ranks on 2 cores blamed the store's
 * host instead of the failure in about 1 run of 60 of tests/coll/test_coll_random --mismatch. */
static void set_verdict(dt__store_server *s, dt_status st, const char *msg, const conn *from) {
  pthread_mutex_lock(&s->lock);
  bool first = s->verdict_st == DT_OK;
  if (first) {
    s->verdict_st = st;
    snprintf(s->verdict, sizeof s->verdict, "%s", msg);
    s->verdict_told = false;
  }
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->lock);
  if (!first)
    return;
  DT_LOG_WARN("%s", msg);
  /* Whoever waits for a key now waits in vain: tell them why at once. */
  for (size_t i = 0; i < s->nwaits;) {
    if (!s->waits[i].live) {
      i++;
      continue;
    }
    for (size_t j = 0; j < s->nconns; j++)
      if (s->conns[j]->cid == s->waits[i].cid) {
        s->conns[j]->nwaits--;
        respond(s, s->conns[j], s->waits[i].seq, st, s->verdict, strlen(s->verdict), NULL, 0);
      }
    s->waits[i] = s->waits[--s->nwaits];
  }
  /* And push it on every live rank's heartbeat connection (seq 0, which no request uses): the
   * rank reads it at its next heartbeat even if this store is gone by then, as it is when its
   * host's launcher stops the hosting rank on seeing this verdict. */
  for (size_t j = 0; j < s->nconns; j++) {
    conn *c = s->conns[j];
    if (c != from && !c->dead && c->authed && c->id < (uint32_t)s->world && s->ranks[c->id].hb_cid == c->cid &&
        !s->ranks[c->id].left)
      respond(s, c, 0, st, s->verdict, strlen(s->verdict), NULL, 0);
  }
  pthread_mutex_lock(&s->lock);
  s->verdict_told = true;
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->lock);
}

static void rank_gone(dt__store_server *s, uint32_t id, bool failed, const char *why) {
  rank_state *r = &s->ranks[id];
  if (!r->watched || r->left)
    return;
  pthread_mutex_lock(&s->lock);
  r->left = true;
  s->live--;
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->lock);
  if (failed) {
    char msg[DT_STORE_MSG_MAX];
    snprintf(msg, sizeof msg, "rank %u failed: %s", id, why);
    set_verdict(s, DT_ERR_PEER, msg, NULL);
  }
}

/* ---- connections ---- */

/* Only marks: the consequences (dropping its waits, a verdict if it carried a rank's
 * heartbeats) happen in server_reap, outside any loop over waiters or connections. */
static void conn_kill(dt__store_server *s, conn *c) { c->dead = true; }

static void refuse(dt__store_server *s, conn *c, const char *why) {
  log_refused(s, c->peer, why);
  conn_kill(s, c);
}

static void conn_free(conn *c) {
  close(c->fd);
  dt__free(c->in);
  dt__free(c->out);
  dt__free(c);
}

static void wake_waiters(dt__store_server *s, const char *key, const kv_entry *e) {
  for (size_t i = 0; i < s->nwaits;) {
    if (strcmp(s->waits[i].key, key) != 0) {
      i++;
      continue;
    }
    for (size_t j = 0; j < s->nconns; j++)
      if (s->conns[j]->cid == s->waits[i].cid) {
        s->conns[j]->nwaits--;
        respond(s, s->conns[j], s->waits[i].seq, DT_OK, e->val, e->n, NULL, 0);
      }
    s->waits[i] = s->waits[--s->nwaits];
  }
}

static bool parse_i64(const uint8_t *v, size_t n, int64_t *out) {
  char buf[32];
  if (n == 0 || n >= sizeof buf)
    return false;
  memcpy(buf, v, n);
  buf[n] = '\0';
  char *end;
  errno = 0;
  long long x = strtoll(buf, &end, 10);
  if (errno || *end)
    return false;
  *out = x;
  return true;
}

/* One authenticated request. p/len is the whole payload (validated length). */
static void handle_request(dt__store_server *s, conn *c, uint16_t type, const uint8_t *p, size_t len) {
  if (len < REQ_PREFIX) {
    refuse(s, c, "store request shorter than its header");
    return;
  }
  uint32_t seq = dt__get32(p);
  size_t klen = (size_t)p[4] | (size_t)p[5] << 8;
  if (klen > DT_STORE_KEY_MAX || REQ_PREFIX + klen > len || memchr(p + REQ_PREFIX, 0, klen)) {
    DT_LOG_WARN("store: closing connection from %s (rank %u): malformed key in request 0x%04x", c->peer, c->id, type);
    conn_kill(s, c);
    return;
  }
  char key[DT_STORE_KEY_MAX + 1];
  memcpy(key, p + REQ_PREFIX, klen);
  key[klen] = '\0';
  const uint8_t *body = p + REQ_PREFIX + klen;
  size_t blen = len - REQ_PREFIX - klen;
  bool needs_key = (type >= OP_SET && type <= OP_DELETE) || type == OP_CLAIM;
  if (needs_key && klen == 0) {
    respond_text(s, c, seq, DT_ERR_INVALID, "empty key");
    return;
  }
  switch (type) {
  case OP_SET: {
    if (blen > DT_STORE_VALUE_MAX) {
      respond_text(s, c, seq, DT_ERR_INVALID, "value of %zu bytes exceeds the %u-byte limit", blen, DT_STORE_VALUE_MAX);
      return;
    }
    if (kv_put(s, key, body, blen) != DT_OK) {
      respond_text(s, c, seq, DT_ERR_NOMEM, "%s", dt_last_error());
      return;
    }
    respond(s, c, seq, DT_OK, NULL, 0, NULL, 0);
    wake_waiters(s, key, kv_find(s, key));
    return;
  }
  case OP_GET: {
    kv_entry *e = kv_find(s, key);
    if (e)
      respond(s, c, seq, DT_OK, e->val, e->n, NULL, 0);
    else
      respond_text(s, c, seq, DT_ERR_NOT_FOUND, "no key '%s'", key);
    return;
  }
  case OP_WAIT: {
    if (blen != 8) {
      respond_text(s, c, seq, DT_ERR_PROTOCOL, "wait request body of %zu bytes", blen);
      return;
    }
    kv_entry *e = kv_find(s, key);
    if (e) {
      respond(s, c, seq, DT_OK, e->val, e->n, NULL, 0);
      return;
    }
    bool live = !(dt__get32(body + 4) & DT_STORE_WAIT_IGNORE_VERDICT);
    if (live && s->verdict_st != DT_OK) {
      respond(s, c, seq, s->verdict_st, s->verdict, strlen(s->verdict), NULL, 0);
      return;
    }
    uint32_t ms = dt__get32(body);
    if (ms == 0) {
      respond_text(s, c, seq, DT_ERR_TIMEOUT, "key '%s' not set", key);
      return;
    }
    if (c->nwaits >= MAX_WAITS_PER_CONN) {
      respond_text(s, c, seq, DT_ERR_STATE, "more than %d waits pending on one connection", MAX_WAITS_PER_CONN);
      return;
    }
    if (s->nwaits == s->waits_cap) {
      size_t cap = s->waits_cap ? s->waits_cap * 2 : 16;
      waiter *w = dt__realloc(s->waits, cap * sizeof *w);
      if (!w) {
        respond_text(s, c, seq, DT_ERR_NOMEM, "cannot park a wait");
        return;
      }
      s->waits = w;
      s->waits_cap = cap;
    }
    waiter *w = &s->waits[s->nwaits++];
    w->cid = c->cid;
    w->seq = seq;
    w->deadline = dt__deadline_after_ms(ms);
    w->live = live;
    memcpy(w->key, key, klen + 1);
    c->nwaits++;
    return;
  }
  case OP_ADD: {
    if (blen != 8) {
      respond_text(s, c, seq, DT_ERR_PROTOCOL, "add request body of %zu bytes", blen);
      return;
    }
    int64_t delta = (int64_t)dt__get64(body), cur = 0;
    kv_entry *e = kv_find(s, key);
    if (e && !parse_i64(e->val, e->n, &cur)) {
      respond_text(s, c, seq, DT_ERR_INVALID, "value at key '%s' (%zu bytes) is not a decimal integer", key, e->n);
      return;
    }
    int64_t next;
    if (__builtin_add_overflow(cur, delta, &next)) {
      respond_text(s, c, seq, DT_ERR_INVALID, "key '%s': %" PRId64 " + %" PRId64 " overflows", key, cur, delta);
      return;
    }
    char txt[32];
    int n = snprintf(txt, sizeof txt, "%" PRId64, next);
    if (kv_put(s, key, txt, (size_t)n) != DT_OK) {
      respond_text(s, c, seq, DT_ERR_NOMEM, "%s", dt_last_error());
      return;
    }
    uint8_t r[8];
    dt__put64(r, (uint64_t)next);
    respond(s, c, seq, DT_OK, r, 8, NULL, 0);
    wake_waiters(s, key, kv_find(s, key));
    return;
  }
  case OP_CAS: {
    if (blen < 4 || dt__get32(body) > blen - 4) {
      respond_text(s, c, seq, DT_ERR_PROTOCOL, "malformed compare-and-set body");
      return;
    }
    size_t en = dt__get32(body), dn = blen - 4 - en;
    const uint8_t *exp = body + 4, *des = exp + en;
    if (dn > DT_STORE_VALUE_MAX) {
      respond_text(s, c, seq, DT_ERR_INVALID, "value of %zu bytes exceeds the %u-byte limit", dn, DT_STORE_VALUE_MAX);
      return;
    }
    kv_entry *e = kv_find(s, key);
    bool match = e ? (e->n == en && (en == 0 || memcmp(e->val, exp, en) == 0)) : en == 0;
    uint8_t swapped = match;
    if (match && kv_put(s, key, des, dn) != DT_OK) {
      respond_text(s, c, seq, DT_ERR_NOMEM, "%s", dt_last_error());
      return;
    }
    respond(s, c, seq, DT_OK, &swapped, 1, NULL, 0);
    if (match)
      wake_waiters(s, key, kv_find(s, key));
    return;
  }
  case OP_DELETE:
    kv_delete(s, key);
    respond(s, c, seq, DT_OK, NULL, 0, NULL, 0);
    return;
  case OP_CLAIM: {
    /* The key is this connection's while it is open; another open connection that holds it
     * keeps it, unless it holds the very same value: the same claimant on a new connection
     * (its old one may not look closed yet, e.g. after a cut link). */
    if (blen > DT_STORE_VALUE_MAX) {
      respond_text(s, c, seq, DT_ERR_INVALID, "value of %zu bytes exceeds the %u-byte limit", blen, DT_STORE_VALUE_MAX);
      return;
    }
    kv_entry *e = kv_find(s, key);
    bool same = e && e->n == blen && (blen == 0 || memcmp(e->val, body, blen) == 0);
    for (size_t i = 0; e && e->owner && e->owner != c->cid && !same && i < s->nconns; i++)
      if (s->conns[i]->cid == e->owner && !s->conns[i]->dead) {
        respond_text(s, c, seq, DT_ERR_STATE, "key '%s' is held by another connection, from %s", key,
                     s->conns[i]->peer);
        return;
      }
    if (kv_put(s, key, body, blen) != DT_OK) {
      respond_text(s, c, seq, DT_ERR_NOMEM, "%s", dt_last_error());
      return;
    }
    e = kv_find(s, key);
    e->owner = c->cid;
    c->claimed = true;
    respond(s, c, seq, DT_OK, NULL, 0, NULL, 0);
    wake_waiters(s, key, e);
    return;
  }
  case OP_HEARTBEAT: {
    uint32_t cw = blen >= 4 ? dt__get32(body) : 0; /* the world size the rank came with, 0 if not said */
    if (c->id >= (uint32_t)s->world || (cw && cw != (uint32_t)s->world)) {
      /* Hosts started with different -n or --nnodes (or a dtrain store with another --world):
       * the job cannot form, so end it now for the ranks already waiting, not at their deadline. */
      char why[400], came[64] = "";
      if (cw)
        snprintf(came, sizeof came, " came with world size %u,", cw);
      snprintf(why, sizeof why, "rank %u%s but this job has %d ranks: every host needs the same -n and --nnodes "
               "(dtrain run), and a dtrain store the same --world", c->id, cw ? came : " joined,", s->world);
      set_verdict(s, DT_ERR_ABORTED, why, NULL);
      respond_text(s, c, seq, DT_ERR_INVALID, "%s", why);
      return;
    }
    rank_state *r = &s->ranks[c->id];
    const conn *holder = NULL;
    for (size_t i = 0; i < s->nconns && r->watched && !r->left && r->hb_cid != c->cid; i++)
      if (s->conns[i]->cid == r->hb_cid && !s->conns[i]->dead)
        holder = s->conns[i];
    if (holder) {
      /* A second process with the same rank (a leftover or re-launched worker, or another job
       * on the same port with the same secret): refuse it, and leave the rank it copies alone. */
      char why[400];
      snprintf(why, sizeof why, "rank %u is already in this job (its heartbeat comes from %s); a second process with "
               "rank %u from %s was refused: a leftover or re-launched worker, or another job using the same port and secret?",
               c->id, holder->peer, c->id, c->peer);
      log_refused(s, c->peer, why);
      respond_text(s, c, seq, DT_ERR_STATE, "%s", why);
      return;
    }
    r->last_ns = dt_now_ns();
    r->hb_cid = c->cid;
    if (!r->watched || r->left) {
      pthread_mutex_lock(&s->lock);
      if (!r->watched)
        s->seen++;
      r->watched = true;
      r->left = false;
      s->live++;
      pthread_mutex_unlock(&s->lock);
    }
    if (s->verdict_st != DT_OK)
      respond(s, c, seq, s->verdict_st, s->verdict, strlen(s->verdict), NULL, 0);
    else
      respond(s, c, seq, DT_OK, NULL, 0, NULL, 0);
    return;
  }
  case OP_ABORT: {
    char msg[DT_STORE_MSG_MAX];
    size_t n = DT_MIN(blen, sizeof msg - 1);
    memcpy(msg, body, n);
    msg[n] = '\0';
    for (size_t i = 0; i < n; i++) /* one log line, printable: it came from the network */
      if ((unsigned char)msg[i] < 0x20 || msg[i] == 0x7f)
        msg[i] = ' ';
    char full[DT_STORE_MSG_MAX];
    if (strncmp(msg, "rank ", 5) == 0 || c->id >= (uint32_t)s->world)
      snprintf(full, sizeof full, "%s", msg);
    else
      snprintf(full, sizeof full, "rank %u: %.1000s", c->id, msg);
    set_verdict(s, DT_ERR_ABORTED, full, c);
    respond(s, c, seq, DT_OK, NULL, 0, NULL, 0);
    return;
  }
  case OP_GOODBYE:
    if (c->id < (uint32_t)s->world)
      rank_gone(s, c->id, false, NULL);
    respond(s, c, seq, DT_OK, NULL, 0, NULL, 0);
    return;
  default:
    DT_LOG_WARN("store: closing connection from %s (rank %u): unknown request type 0x%04x", c->peer, c->id, type);
    conn_kill(s, c);
  }
}

/* A complete frame has arrived on c. */
static void handle_frame(dt__store_server *s, conn *c) {
  if (!c->authed) {
    uint8_t ok[DT_WIRE_HDR_LEN + DT_AUTH_OK_LEN];
    dt_status st = dt__auth_check(s->secret, s->secret_len, DT_ROLE_STORE, c->nonce, c->small, c->peer, &c->id, ok);
    if (st == DT_ERR_AUTH) {
      uint8_t fail[DT_WIRE_HDR_LEN];
      dt__frame_encode(fail, DT_FRAME_AUTH_FAIL, 0);
      /* Tell an honest client with a stale secret why, then close: no more reads. */
      send(c->fd, fail, sizeof fail, MSG_NOSIGNAL | MSG_DONTWAIT);
      refuse(s, c, "wrong job secret");
      return;
    }
    if (st) {
      refuse(s, c, dt_last_error());
      return;
    }
    c->authed = true;
    if (!conn_queue(c, ok, sizeof ok)) {
      conn_kill(s, c);
      return;
    }
    DT_LOG_DEBUG("store: %s authenticated as id %u", c->peer, c->id);
    conn_flush(s, c);
    return;
  }
  handle_request(s, c, c->f.type, c->in, c->f.len);
}

static void conn_read(dt__store_server *s, conn *c) {
  while (!c->dead && c->out_len == c->out_off) { /* a client that does not read its answers stops being read */
    uint8_t *dst;
    size_t want;
    if (!c->in_body) {
      dst = c->hdr + c->hdr_got;
      want = DT_WIRE_HDR_LEN - c->hdr_got;
    } else {
      dst = (c->authed ? c->in : c->small) + c->in_got;
      want = c->f.len - c->in_got;
    }
    ssize_t r = want ? recv(c->fd, dst, want, MSG_DONTWAIT) : 0;
    if (want && r < 0 && errno == EINTR)
      continue;
    if (want && r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    if (want && r <= 0) {
      if (!c->authed && c->pre_bytes == 0) {
        /* Connect-and-close: a TCP health probe or our own reachability check. Nothing was
         * attempted, so nothing to warn about. */
        DT_LOG_DEBUG("store: %s connected and closed without a word", c->peer);
        conn_kill(s, c);
      } else if (!c->authed) {
        char why[128];
        snprintf(why, sizeof why, "closed during the handshake after sending %zu bytes", c->pre_bytes);
        refuse(s, c, why);
      } else {
        conn_kill(s, c);
      }
      return;
    }
    if (!c->authed)
      c->pre_bytes += (size_t)r;
    if (!c->in_body) {
      c->hdr_got += (size_t)r;
      if (c->hdr_got < DT_WIRE_HDR_LEN)
        continue;
      c->hdr_got = 0;
      dt_status st = dt__frame_decode(c->hdr, &c->f, c->authed ? REQ_MAX : DT_AUTH_LEN, c->authed ? c->peer : "handshake");
      if (st) {
        if (c->authed) {
          DT_LOG_WARN("store: closing connection from %s (rank %u): %s", c->peer, c->id, dt_last_error());
          conn_kill(s, c);
        } else {
          refuse(s, c, dt_last_error());
        }
        return;
      }
      if (!c->authed && (c->f.type != DT_FRAME_AUTH || c->f.len != DT_AUTH_LEN)) {
        char why[160];
        snprintf(why, sizeof why, "handshake frame type 0x%04x with %llu bytes (expected 0x%04x with %d)", c->f.type,
                 (unsigned long long)c->f.len, DT_FRAME_AUTH, DT_AUTH_LEN);
        refuse(s, c, why);
        return;
      }
      if (c->authed) {
        c->in = dt__alloc(c->f.len ? c->f.len : 1);
        if (!c->in) {
          DT_LOG_WARN("store: cannot allocate %llu bytes for a request from %s; closing it",
                      (unsigned long long)c->f.len, c->peer);
          conn_kill(s, c);
          return;
        }
      }
      c->in_body = true;
      c->in_got = 0;
      r = 0; /* fall through to the completeness check (zero-length bodies) */
    } else {
      c->in_got += (size_t)r;
    }
    if (c->in_body && c->in_got == c->f.len) {
      c->in_body = false;
      handle_frame(s, c);
      dt__free(c->in);
      c->in = NULL;
    }
  }
}

static void server_accept(dt__store_server *s) {
  for (int k = 0; k < 64; k++) {
    int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        int64_t now = dt_now_ns();
        if (now - s->accept_warned > 10 * 1000000000LL) { /* once per 10 s, not per retry */
          DT_LOG_WARN("store: cannot accept connections: %s (%zu open; retrying every 100 ms)", strerror(errno),
                      s->nconns);
          s->accept_warned = now;
        }
        s->listen_pause_until = now + 100 * 1000000LL;
      }
      return;
    }
    char peer[80];
    dt__sock_peer_name(fd, peer, sizeof peer);
    if (s->nconns >= MAX_CONNS) {
      log_refused(s, peer, "too many connections");
      close(fd);
      continue;
    }
    if (s->nconns == s->conns_cap) {
      size_t cap = s->conns_cap ? s->conns_cap * 2 : 32;
      conn **p = dt__realloc(s->conns, cap * sizeof *p);
      if (!p) {
        close(fd);
        continue;
      }
      s->conns = p;
      s->conns_cap = cap;
    }
    conn *c = dt__calloc(sizeof *c);
    uint8_t hello[DT_WIRE_HDR_LEN + DT_AUTH_HELLO_LEN];
    if (!c || dt__auth_hello(DT_ROLE_STORE, c->nonce, hello) != DT_OK || !conn_queue(c, hello, sizeof hello)) {
      if (c)
        dt__free(c->out);
      dt__free(c);
      close(fd);
      continue;
    }
    dt__sock_tune(fd, 0);
    c->fd = fd;
    c->cid = ++s->next_cid;
    snprintf(c->peer, sizeof c->peer, "%s", peer);
    c->hs_deadline = dt__deadline_after_ms(s->hs_ms);
    s->conns[s->nconns++] = c;
    conn_flush(s, c);
  }
}

/* Handshake deadlines, parked waits, silent ranks. Returns ms until the next such event. */
static int server_timers(dt__store_server *s) {
  int64_t now = dt_now_ns(), next = now + 1000 * 1000000LL;
  log_refused_flush(s, now / 1000000000LL);
  if (s->log_suppressed)
    next = DT_MIN(next, (now / 1000000000LL + 1) * 1000000000LL);
  for (size_t i = 0; i < s->nconns; i++) {
    conn *c = s->conns[i];
    if (c->dead || c->authed)
      continue;
    if (now >= c->hs_deadline) {
      char why[160];
      snprintf(why, sizeof why, "no valid handshake within %d ms (%zu bytes received)", s->hs_ms, c->pre_bytes);
      refuse(s, c, why);
    } else {
      next = DT_MIN(next, c->hs_deadline);
    }
  }
  for (size_t i = 0; i < s->nwaits;) {
    waiter *w = &s->waits[i];
    if (now < w->deadline) {
      next = DT_MIN(next, w->deadline);
      i++;
      continue;
    }
    for (size_t j = 0; j < s->nconns; j++)
      if (s->conns[j]->cid == w->cid) {
        s->conns[j]->nwaits--;
        respond_text(s, s->conns[j], w->seq, DT_ERR_TIMEOUT, "key '%s' was not set in time", w->key);
      }
    s->waits[i] = s->waits[--s->nwaits];
  }
  int64_t fault_ns = (int64_t)s->fault_ms * 1000000LL;
  if (s->tick_due && now - s->tick_due > fault_ns / 2) {
    /* This thread itself did not run for a while (the hosting process was stopped or starved):
     * the silence is ours, not the ranks'. Restart their clocks instead of blaming one. */
    DT_LOG_WARN("store: server thread stalled for %lld ms; not counting it against the ranks",
                (long long)((now - s->tick_due) / 1000000));
    for (int r = 0; r < s->world; r++)
      s->ranks[r].last_ns = DT_MAX(s->ranks[r].last_ns, now);
  }
  for (int r = 0; r < s->world; r++) {
    rank_state *rs = &s->ranks[r];
    if (!rs->watched || rs->left)
      continue;
    if (now - rs->last_ns >= fault_ns) {
      char why[160];
      snprintf(why, sizeof why, "no heartbeat for %d ms (hung, stopped, or cut off)", s->fault_ms);
      rank_gone(s, (uint32_t)r, true, why);
    } else {
      next = DT_MIN(next, rs->last_ns + fault_ns);
    }
  }
  int64_t ms = (next - now + 999999) / 1000000;
  return (int)DT_MAX(ms, 1);
}

/* Removes dead connections and the waits they parked; a dead connection that carried a rank's
 * heartbeats makes that rank failed. A verdict answers waiters, which may kill more
 * connections, hence the loop until nothing new died. */
static void server_reap(dt__store_server *s) {
  bool again = true;
  while (again) {
    again = false;
    for (size_t i = 0; i < s->nconns; i++) {
      conn *c = s->conns[i];
      if (!c->dead || c->reaped)
        continue;
      c->reaped = again = true;
      for (size_t j = 0; j < s->nwaits;)
        if (s->waits[j].cid == c->cid)
          s->waits[j] = s->waits[--s->nwaits];
        else
          j++;
      if (c->authed && c->id < (uint32_t)s->world && s->ranks[c->id].hb_cid == c->cid)
        rank_gone(s, c->id, true, "connection lost (process exited or was killed)");
      if (c->claimed)
        kv_release(s, c->cid);
    }
  }
  size_t k = 0;
  for (size_t i = 0; i < s->nconns; i++) {
    if (s->conns[i]->dead)
      conn_free(s->conns[i]);
    else
      s->conns[k++] = s->conns[i];
  }
  s->nconns = k;
}

static void *server_main(void *arg) {
  dt__store_server *s = arg;
  pthread_setname_np(pthread_self(), "dt-store");
  struct pollfd *pfds = NULL;
  size_t pcap = 0;
  while (!atomic_load(&s->stop)) {
    int timeout = server_timers(s);
    server_reap(s);
    if (pcap < s->nconns + 2) {
      size_t cap = s->nconns + 64;
      struct pollfd *p = dt__realloc(pfds, cap * sizeof *p);
      if (!p) {
        dt__sleep_ns(10 * 1000000LL);
        continue;
      }
      pfds = p;
      pcap = cap;
    }
    bool paused = dt_now_ns() < s->listen_pause_until;
    pfds[0] = (struct pollfd){.fd = paused ? -1 : s->lfd, .events = POLLIN};
    pfds[1] = (struct pollfd){.fd = s->wake_fd, .events = POLLIN};
    if (paused)
      timeout = DT_MIN(timeout, 100);
    size_t n = s->nconns;
    for (size_t i = 0; i < n; i++) {
      conn *c = s->conns[i];
      pfds[2 + i] = (struct pollfd){.fd = c->fd, .events = c->out_len > c->out_off ? POLLOUT : POLLIN};
    }
    s->tick_due = dt_now_ns() + (int64_t)timeout * 1000000LL;
    int r = poll(pfds, 2 + n, timeout);
    if (r < 0) {
      if (errno != EINTR)
        dt__sleep_ns(1000000LL);
      continue;
    }
    if (pfds[1].revents)
      continue; /* stop requested */
    for (size_t i = 0; i < n; i++) {
      conn *c = s->conns[i];
      short ev = pfds[2 + i].revents;
      if (!ev || c->dead)
        continue;
      if (ev & POLLOUT)
        conn_flush(s, c);
      if (ev & (POLLIN | POLLHUP | POLLERR))
        conn_read(s, c);
      if ((ev & (POLLHUP | POLLERR)) && !(ev & POLLIN) && !c->dead)
        conn_kill(s, c);
    }
    if (pfds[0].revents & POLLIN)
      server_accept(s);
  }
  dt__free(pfds);
  return NULL;
}

dt_status dt__store_server_start(const char *addr, int port, const uint8_t *secret, size_t secret_len,
                                 int world_size, int fault_timeout_ms, dt__store_server **out, int *port_out) {
  *out = NULL;
  if (world_size < 1 || fault_timeout_ms < 1)
    return dt_set_error(DT_ERR_INVALID, "store server: world size %d and fault timeout %d ms must be positive",
                        world_size, fault_timeout_ms);
  if (secret_len > sizeof((dt__store_server *)0)->secret)
    return dt_set_error(DT_ERR_INVALID, "store server: job secret longer than 256 bytes");
  int hs_ms;
  DT_CHECK(dt__handshake_timeout_ms(&hs_ms));
  dt__store_server *s = dt__calloc(sizeof *s);
  if (!s)
    return dt_set_error(DT_ERR_NOMEM, "store server: out of memory");
  s->lfd = s->wake_fd = -1;
  s->world = world_size;
  s->fault_ms = fault_timeout_ms;
  s->hs_ms = hs_ms;
  if (secret_len)
    memcpy(s->secret, secret, secret_len);
  s->secret_len = secret_len;
  s->nbuckets = 64;
  s->buckets = dt__calloc(s->nbuckets * sizeof *s->buckets);
  s->ranks = dt__calloc((size_t)world_size * sizeof *s->ranks);
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->cond, NULL);
  dt_status st;
  if (!s->buckets || !s->ranks) {
    st = dt_set_error(DT_ERR_NOMEM, "store server: out of memory for %d ranks", world_size);
    goto fail;
  }
  s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s->wake_fd < 0) {
    st = dt__errno(DT_ERR_SYSTEM, "store server: eventfd");
    goto fail;
  }
  int bound;
  st = dt__sock_listen(addr, port, &s->lfd, &bound);
  if (st) {
    if (errno == EADDRINUSE) /* usually two hosts both told to host the store */
      st = dt_set_error(st, "store server: %s (is another job's store or another agent with the same --node-rank, or "
                        "a rank 0 of another job, using this port?)", dt_last_error());
    else
      dt__error_prefix(st, "store server");
    goto fail;
  }
  int rc = pthread_create(&s->thread, NULL, server_main, s);
  if (rc) {
    errno = rc;
    st = dt__errno(DT_ERR_SYSTEM, "store server: pthread_create");
    goto fail;
  }
  DT_LOG_INFO("store: listening on %s:%d for %d ranks (fault timeout %d ms)", addr ? addr : "*", bound, world_size,
              fault_timeout_ms);
  if (port_out)
    *port_out = bound;
  *out = s;
  return DT_OK;
fail:
  if (s->lfd >= 0)
    close(s->lfd);
  if (s->wake_fd >= 0)
    close(s->wake_fd);
  pthread_mutex_destroy(&s->lock);
  pthread_cond_destroy(&s->cond);
  explicit_bzero(s->secret, sizeof s->secret);
  dt__free(s->buckets);
  dt__free(s->ranks);
  dt__free(s);
  return st;
}

pthread_t dt__store_server_thread(const dt__store_server *s) { return s->thread; }

void dt__store_server_stop(dt__store_server *s) {
  if (!s)
    return;
  atomic_store(&s->stop, true);
  uint64_t one = 1;
  ssize_t w = write(s->wake_fd, &one, sizeof one);
  (void)w;
  pthread_join(s->thread, NULL);
  log_refused_flush(s, -1);
  for (size_t i = 0; i < s->nconns; i++)
    conn_free(s->conns[i]);
  dt__free(s->conns);
  dt__free(s->waits);
  for (size_t i = 0; i < s->nbuckets; i++)
    for (kv_entry *e = s->buckets[i], *next; e; e = next) {
      next = e->next;
      dt__free(e->val);
      dt__free(e);
    }
  dt__free(s->buckets);
  dt__free(s->ranks);
  close(s->lfd);
  close(s->wake_fd);
  pthread_mutex_destroy(&s->lock);
  pthread_cond_destroy(&s->cond);
  explicit_bzero(s->secret, sizeof s->secret);
  dt__free(s);
}

/* One wait on s->cond (lock held) of at most 50 ms and the deadline: bounded sleeps, since the
 * condition variable uses the realtime clock and deadlines the monotonic one. */
static void server_cond_wait(dt__store_server *s, int64_t deadline) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += DT_MIN((int64_t)dt__ms_left(deadline), 50) * 1000000LL;
  ts.tv_sec += ts.tv_nsec / 1000000000L;
  ts.tv_nsec %= 1000000000L;
  pthread_cond_timedwait(&s->cond, &s->lock, &ts);
}

int dt__store_server_drain(dt__store_server *s, int64_t deadline) {
  if (!s)
    return 0;
  pthread_mutex_lock(&s->lock);
  while (s->live > 0 && !dt__expired(deadline))
    server_cond_wait(s, deadline);
  int live = s->live;
  pthread_mutex_unlock(&s->lock);
  return live;
}

void dt__store_server_settle(dt__store_server *s, int64_t deadline) {
  if (!s)
    return;
  pthread_mutex_lock(&s->lock);
  while (s->verdict_st != DT_OK && !s->verdict_told && !dt__expired(deadline))
    server_cond_wait(s, deadline);
  pthread_mutex_unlock(&s->lock);
}

dt_status dt__store_server_status(dt__store_server *s, int *seen, int *live, char *verdict, size_t n) {
  pthread_mutex_lock(&s->lock);
  if (seen)
    *seen = s->seen;
  if (live)
    *live = s->live;
  if (verdict && n)
    snprintf(verdict, n, "%s", s->verdict_st ? s->verdict : "");
  dt_status st = s->verdict_st;
  pthread_mutex_unlock(&s->lock);
  return st;
}

/* ======================================================================================== */
/* client                                                                                    */
/* ======================================================================================== */

struct dt__store {
  int fd;
  uint32_t seq;
  int rank;
  bool broken; /* a frame was cut by a deadline: the stream can no longer be trusted */
  bool told;   /* an answer (or a push) from the server carried the job's verdict */
  uint32_t world; /* announced with each heartbeat; 0: not said */
  char what[300];
};

#define STORE_QUIET_MS 10000
/* A heartbeat that could not be sent looks this long for a verdict the store pushed before it
 * went: what arrived is read at once, a closed connection reads as closed at once, so only a
 * store that hangs costs the wait. It was 1 ms, which a thread preempted between setting the
 * deadline and polling (4 ranks on 2 cores) can miss, leaving the verdict unread (reasoned from
 * the code; not seen in a test). */
#define STORE_PUSHED_MS 100

dt_status dt__store_connect(const char *host, int port, const uint8_t *secret, size_t secret_len, int rank,
                            int64_t deadline, dt__store **out) {
  *out = NULL;
  dt__store *st = dt__calloc(sizeof *st);
  if (!st)
    return dt_set_error(DT_ERR_NOMEM, "store client: out of memory");
  st->fd = -1;
  st->rank = rank;
  snprintf(st->what, sizeof st->what, "store %s:%d", host, port);
  int hs_ms, silent = 0;
  dt_status rc;
  if ((rc = dt__handshake_timeout_ms(&hs_ms))) {
    dt__free(st);
    return rc;
  }
  /* Nothing listening yet is normal for a while (the store's host may start later); after
   * STORE_QUIET_MS it is said once, so a job whose store never comes is not silent until the
   * deadline (e.g. DTRAIN_HOST_STORE=0 and no `dtrain store` running). */
  int64_t said_at = dt__deadline_after_ms(STORE_QUIET_MS);
  for (;;) {
    rc = dt__sock_connect(host, port, said_at && said_at < deadline ? said_at : deadline, &st->fd);
    if (rc == DT_ERR_TIMEOUT && said_at && said_at < deadline && !dt__expired(deadline)) {
      if (silent)
        DT_LOG_WARN("rank %d: something at %s:%d accepts connections but does not answer as a dtrain store (%d s; "
                    "another program on this port?); trying until the deadline, %d s from now",
                    rank, host, port, STORE_QUIET_MS / 1000, dt__ms_left(deadline) / 1000);
      else
        DT_LOG_WARN("rank %d: nothing answers at %s:%d yet (%d s); trying until the deadline, %d s from now (the "
                    "store runs on the rank that hosts it, rank 0 unless DTRAIN_HOST_STORE says otherwise, or as "
                    "`dtrain store`)",
                    rank, host, port, STORE_QUIET_MS / 1000, dt__ms_left(deadline) / 1000);
      said_at = 0;
      continue;
    }
    if (rc == DT_OK) {
      /* A store says HELLO as soon as it accepts: one that stays silent for the handshake
       * timeout is not a store, or a stuck one. Each attempt gets that long, not the deadline. */
      rc = dt__auth_client(st->fd, secret, secret_len, DT_ROLE_STORE, (uint32_t)rank,
                           DT_MIN(deadline, dt__deadline_after_ms(hs_ms)));
      silent = rc == DT_ERR_TIMEOUT ? silent + 1 : 0;
    } else {
      silent = 0;
    }
    /* Closed during the handshake: a store shutting down (e.g. the previous communicator's,
     * while a new one is about to listen on its port). Try again, as for a refused connect. */
    if ((rc != DT_ERR_PEER && !silent) || dt__expired(deadline))
      break;
    close(st->fd);
    st->fd = -1;
    dt__sleep_ns(DT_MIN(20 * 1000000LL, (int64_t)dt__ms_left(deadline) * 1000000LL));
  }
  if (rc && silent)
    dt_set_error(rc, "something at %s:%d accepted the connection but did not answer the dtrain handshake (%d "
                 "attempt%s of up to %d ms each, until the deadline; not a dtrain store?)", host, port, silent,
                 silent == 1 ? "" : "s", hs_ms);
  if (rc) {
    dt__error_prefix(rc, "rank %d: connecting to %s", rank, st->what);
    if (st->fd >= 0)
      close(st->fd);
    dt__free(st);
    return rc;
  }
  *out = st;
  return DT_OK;
}

bool dt__store_broken(const dt__store *st) { return st->broken; }

bool dt__store_told(const dt__store *st) { return st->told; }

void dt__store_close(dt__store *st) {
  if (!st)
    return;
  if (st->fd >= 0)
    close(st->fd);
  dt__free(st);
}

static dt_status store_key_check(const dt__store *st, const char *op, const char *key) {
  size_t kl = key ? strlen(key) : 0;
  if (kl == 0 || kl > DT_STORE_KEY_MAX)
    return dt_set_error(DT_ERR_INVALID, "%s %s: key of %zu bytes (must be 1..%d)", st->what, op, kl, DT_STORE_KEY_MAX);
  return DT_OK;
}

/* Sends one request: prefix, extra (fixed fields), then up to two values. */
static dt_status store_send(dt__store *st, uint16_t type, const char *key, const void *extra, size_t extra_n,
                            const void *v1, size_t n1, const void *v2, size_t n2, int64_t deadline) {
  if (st->broken)
    return dt_set_error(DT_ERR_STATE, "%s: connection unusable after an earlier interrupted reply; reconnect", st->what);
  size_t kl = key ? strlen(key) : 0;
  uint8_t buf[DT_WIRE_HDR_LEN + REQ_PREFIX + DT_STORE_KEY_MAX + 16 + 1024];
  size_t total = REQ_PREFIX + kl + extra_n + n1 + n2;
  st->seq++;
  dt__frame_encode(buf, type, total);
  size_t o = DT_WIRE_HDR_LEN;
  dt__put32(buf + o, st->seq);
  buf[o + 4] = (uint8_t)kl;
  buf[o + 5] = (uint8_t)(kl >> 8);
  o += REQ_PREFIX;
  if (kl)
    memcpy(buf + o, key, kl);
  o += kl;
  if (extra_n)
    memcpy(buf + o, extra, extra_n);
  o += extra_n;
  if (n1 + n2 <= sizeof buf - o) { /* small request: one send */
    if (n1)
      memcpy(buf + o, v1, n1);
    if (n2)
      memcpy(buf + o + n1, v2, n2);
    o += n1 + n2;
    n1 = n2 = 0;
  }
  dt_status rc = dt__sock_write_all(st->fd, buf, o, deadline, st->what);
  if (!rc && n1)
    rc = dt__sock_write_all(st->fd, v1, n1, deadline, st->what);
  if (!rc && n2)
    rc = dt__sock_write_all(st->fd, v2, n2, deadline, st->what);
  if (rc)
    st->broken = true;
  return rc;
}

static dt_status store_drain(dt__store *st, size_t n, int64_t deadline) {
  uint8_t junk[4096];
  while (n) {
    size_t k = DT_MIN(n, sizeof junk);
    DT_CHECK(dt__sock_read_all(st->fd, junk, k, deadline, st->what));
    n -= k;
  }
  return DT_OK;
}

/* Receives the answer to the current request. *remote is the server's status; on DT_OK the
 * body goes to buf (first cap bytes; *n is its full length), otherwise its text to msg. */
static dt_status store_recv(dt__store *st, dt_status *remote, void *buf, size_t cap, size_t *n, char *msg,
                            size_t msgcap, int64_t deadline) {
  for (;;) {
    /* Nothing consumed yet: a deadline here leaves the stream in step (answers carry seq). */
    struct pollfd pfd = {.fd = st->fd, .events = POLLIN};
    for (;;) {
      int ms = dt__ms_left(deadline);
      if (ms == 0)
        return dt_set_error(DT_ERR_TIMEOUT, "%s: no answer before the deadline", st->what);
      int r = poll(&pfd, 1, ms);
      if (r > 0)
        break;
      if (r < 0 && errno != EINTR)
        return dt__errno(DT_ERR_SYSTEM, "%s: poll", st->what);
    }
    /* A frame has started: a healthy server finishes it quickly, so allow a grace period. */
    int64_t frame_deadline = DT_MAX(deadline, dt__deadline_after_ms(5000));
    dt__frame f;
    uint8_t head[8];
    dt_status rc = dt__frame_recv_hdr(st->fd, &f, RESP_MAX, frame_deadline, st->what);
    if (!rc && (f.type != OP_RESP || f.len < 8))
      rc = dt_set_error(DT_ERR_PROTOCOL, "%s: unexpected frame type 0x%04x with %llu bytes", st->what, f.type,
                        (unsigned long long)f.len);
    if (!rc)
      rc = dt__sock_read_all(st->fd, head, 8, frame_deadline, st->what);
    if (rc) {
      st->broken = true;
      return rc;
    }
    size_t body = (size_t)f.len - 8;
    uint32_t seq = dt__get32(head);
    dt_status status = (dt_status)dt__get32(head + 4);
    bool pushed = seq == 0 && (status == DT_ERR_PEER || status == DT_ERR_ABORTED); /* the job's verdict */
    if (seq != st->seq && !pushed) { /* the late answer to a request we gave up on */
      if ((rc = store_drain(st, body, frame_deadline))) {
        st->broken = true;
        return rc;
      }
      continue;
    }
    *remote = status;
    if (*remote == DT_OK) {
      size_t take = DT_MIN(body, cap);
      if (n)
        *n = body;
      rc = take ? dt__sock_read_all(st->fd, buf, take, frame_deadline, st->what) : DT_OK;
      if (!rc)
        rc = store_drain(st, body - take, frame_deadline);
    } else {
      size_t take = DT_MIN(body, msgcap - 1);
      rc = take ? dt__sock_read_all(st->fd, msg, take, frame_deadline, st->what) : DT_OK;
      msg[rc ? 0 : take] = '\0';
      if (!rc)
        rc = store_drain(st, body - take, frame_deadline);
    }
    if (rc)
      st->broken = true;
    return rc;
  }
}

/* Request + answer. Remote errors become this thread's error: PEER/ABORTED verdicts verbatim,
 * everything else prefixed with the operation. */
static dt_status store_call(dt__store *st, const char *op, uint16_t type, const char *key, const void *extra,
                            size_t extra_n, const void *v1, size_t n1, const void *v2, size_t n2, void *buf, size_t cap,
                            size_t *n, int64_t deadline) {
  dt_status rc = store_send(st, type, key, extra, extra_n, v1, n1, v2, n2, deadline);
  dt_status remote = DT_OK;
  char msg[DT_STORE_MSG_MAX];
  if (!rc)
    rc = store_recv(st, &remote, buf, cap, n, msg, sizeof msg, deadline);
  else if (type == OP_HEARTBEAT && store_recv(st, &remote, NULL, 0, NULL, msg, sizeof msg,
                                               dt__deadline_after_ms(STORE_PUSHED_MS)) == DT_OK)
    rc = DT_OK; /* the store is gone, but it pushed the job's verdict before it went: that is the news */
  if (rc) {
    if (key)
      return dt__error_prefix(rc, "rank %d: store %s '%s'", st->rank, op, key);
    return dt__error_prefix(rc, "rank %d: store %s", st->rank, op);
  }
  if (remote == DT_OK)
    return DT_OK;
  if ((unsigned)remote >= DT_STATUS_COUNT)
    remote = DT_ERR_PROTOCOL;
  if (remote == DT_ERR_PEER || remote == DT_ERR_ABORTED) {
    st->told = true;
    return dt_set_error(remote, "%s", msg);
  }
  if (key)
    return dt_set_error(remote, "rank %d: %s %s '%s': %s", st->rank, st->what, op, key, msg);
  return dt_set_error(remote, "rank %d: %s %s: %s", st->rank, st->what, op, msg);
}

/* A set or a claim: key and a value of at most DT_STORE_VALUE_MAX bytes, no answer. */
static dt_status store_put(dt__store *st, const char *op, uint16_t type, const char *key, const void *val, size_t n,
                           int64_t deadline) {
  DT_CHECK(store_key_check(st, op, key));
  if (n > DT_STORE_VALUE_MAX)
    return dt_set_error(DT_ERR_INVALID, "rank %d: store %s '%s': value of %zu bytes exceeds the %u-byte limit",
                        st->rank, op, key, n, DT_STORE_VALUE_MAX);
  return store_call(st, op, type, key, NULL, 0, val, n, NULL, 0, NULL, 0, NULL, deadline);
}

dt_status dt__store_set(dt__store *st, const char *key, const void *val, size_t n, int64_t deadline) {
  return store_put(st, "set", OP_SET, key, val, n, deadline);
}

static dt_status store_fetch(dt__store *st, const char *op, uint16_t type, const char *key, const void *extra,
                             size_t extra_n, void *buf, size_t cap, size_t *n, int64_t deadline) {
  DT_CHECK(store_key_check(st, op, key));
  size_t full = 0;
  DT_CHECK(store_call(st, op, type, key, extra, extra_n, NULL, 0, NULL, 0, buf, cap, &full, deadline));
  if (n)
    *n = full;
  if (full > cap)
    return dt_set_error(DT_ERR_INVALID, "rank %d: store %s '%s': value of %zu bytes does not fit a %zu-byte buffer",
                        st->rank, op, key, full, cap);
  return DT_OK;
}

dt_status dt__store_get(dt__store *st, const char *key, void *buf, size_t cap, size_t *n, int64_t deadline) {
  return store_fetch(st, "get", OP_GET, key, NULL, 0, buf, cap, n, deadline);
}

dt_status dt__store_wait(dt__store *st, const char *key, void *buf, size_t cap, size_t *n, int64_t deadline) {
  return dt__store_wait_flags(st, key, buf, cap, n, 0, deadline);
}

dt_status dt__store_wait_flags(dt__store *st, const char *key, void *buf, size_t cap, size_t *n, unsigned flags,
                               int64_t deadline) {
  /* The server gives up at the same moment, so a forgotten wait does not stay parked. */
  uint8_t body[8];
  int left = dt__ms_left(deadline);
  dt__put32(body, (uint32_t)left);
  dt__put32(body + 4, flags);
  int64_t t0 = dt_now_ns();
  dt_status rc = store_fetch(st, "wait", OP_WAIT, key, body, 8, buf, cap, n, deadline);
  if (rc == DT_ERR_TIMEOUT)
    return dt_set_error(rc, "rank %d: store wait: key '%s' was not set within %lld ms", st->rank, key,
                        (long long)((dt_now_ns() - t0) / 1000000));
  return rc;
}

dt_status dt__store_add(dt__store *st, const char *key, int64_t delta, int64_t *result, int64_t deadline) {
  DT_CHECK(store_key_check(st, "add", key));
  uint8_t d[8], r[8];
  size_t n = 0;
  dt__put64(d, (uint64_t)delta);
  DT_CHECK(store_call(st, "add", OP_ADD, key, d, 8, NULL, 0, NULL, 0, r, 8, &n, deadline));
  if (n != 8)
    return dt_set_error(DT_ERR_PROTOCOL, "rank %d: store add '%s': answer of %zu bytes", st->rank, key, n);
  if (result)
    *result = (int64_t)dt__get64(r);
  return DT_OK;
}

dt_status dt__store_cas(dt__store *st, const char *key, const void *expected, size_t expected_n, const void *desired,
                        size_t desired_n, int *swapped, int64_t deadline) {
  DT_CHECK(store_key_check(st, "cas", key));
  if (expected_n > DT_STORE_VALUE_MAX || desired_n > DT_STORE_VALUE_MAX)
    return dt_set_error(DT_ERR_INVALID, "rank %d: store cas '%s': values of %zu and %zu bytes exceed the %u-byte limit",
                        st->rank, key, expected_n, desired_n, DT_STORE_VALUE_MAX);
  uint8_t en[4], r = 0;
  size_t n = 0;
  dt__put32(en, (uint32_t)expected_n);
  DT_CHECK(store_call(st, "cas", OP_CAS, key, en, 4, expected, expected_n, desired, desired_n, &r, 1, &n, deadline));
  if (n != 1)
    return dt_set_error(DT_ERR_PROTOCOL, "rank %d: store cas '%s': answer of %zu bytes", st->rank, key, n);
  if (swapped)
    *swapped = r;
  return DT_OK;
}

dt_status dt__store_claim(dt__store *st, const char *key, const void *val, size_t n, int64_t deadline) {
  return store_put(st, "claim", OP_CLAIM, key, val, n, deadline);
}

dt_status dt__store_delete(dt__store *st, const char *key, int64_t deadline) {
  DT_CHECK(store_key_check(st, "delete", key));
  return store_call(st, "delete", OP_DELETE, key, NULL, 0, NULL, 0, NULL, 0, NULL, 0, NULL, deadline);
}

void dt__store_set_world(dt__store *st, int world) { st->world = world > 0 ? (uint32_t)world : 0; }

dt_status dt__store_heartbeat(dt__store *st, int64_t deadline) {
  uint8_t w[4];
  dt__put32(w, st->world);
  return store_call(st, "heartbeat", OP_HEARTBEAT, NULL, st->world ? w : NULL, st->world ? 4 : 0, NULL, 0, NULL, 0,
                    NULL, 0, NULL, deadline);
}

dt_status dt__store_abort(dt__store *st, const char *msg, int64_t deadline) {
  size_t n = msg ? strnlen(msg, DT_STORE_MSG_MAX - 1) : 0;
  return store_call(st, "abort", OP_ABORT, NULL, NULL, 0, msg, n, NULL, 0, NULL, 0, NULL, deadline);
}

dt_status dt__store_goodbye(dt__store *st, int64_t deadline) {
  return store_call(st, "goodbye", OP_GOODBYE, NULL, NULL, 0, NULL, 0, NULL, 0, NULL, 0, NULL, deadline);
}
