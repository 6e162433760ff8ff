/* tcp_loss.c - telling a peer whose link loses data from a peer that is merely slow, for the
 * tcp transport. A rank whose sendrecv has been blocked for half the fault timeout publishes in
 * the store how many messages it has handed to each peer ("<prefix>tcp/sent/<rank>" = "n0 n1
 * ..."); a rank that has heard nothing from a peer for the whole fault timeout reads that peer's
 * count for it. If the peer says it sent more than arrived, the missing message has been on its
 * way for at least half the fault timeout while the peer's heartbeats kept arriving: its link
 * loses data, and the receiver names it. A peer that is slow (computing, writing a checkpoint)
 * publishes nothing new, so it is never blamed here; the collective deadline still bounds that.
 * Not here: the per-connection message numbers that catch a lost message as soon as a later one
 * arrives (tcp.c), and heartbeats (health.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "comm/tcp/tcp_loss.h"

/* Store calls made from inside a blocked sendrecv are kept short: the store is only asked for
 * evidence, and a store that does not answer is the health thread's business. */
#define LOSS_RPC_MS 1000

struct dt__tcp_loss {
  dt_comm *c;
  dt__store *st; /* own connection, opened at the first need (the comm's belongs to its caller) */
  char *last;    /* the value last published ("" before) */
  size_t cap;
};

dt_status dt__tcp_loss_create(dt_comm *c, dt__tcp_loss **out) {
  *out = NULL;
  dt__tcp_loss *l = dt__calloc(sizeof *l);
  if (!l)
    return dt_set_error(DT_ERR_NOMEM, "tcp loss watch for %d ranks", c->size);
  l->c = c;
  l->cap = (size_t)c->size * 21 + 1; /* a uint64 in decimal and a space per rank */
  l->last = dt__calloc(l->cap);
  if (!l->last) {
    dt__free(l);
    return dt_set_error(DT_ERR_NOMEM, "tcp loss watch for %d ranks", c->size);
  }
  *out = l;
  return DT_OK;
}

void dt__tcp_loss_destroy(dt__tcp_loss *l) {
  if (!l)
    return;
  dt__store_close(l->st);
  dt__free(l->last);
  dt__free(l);
}

static bool loss_connect(dt__tcp_loss *l, int64_t deadline) {
  if (l->st && dt__store_broken(l->st)) {
    dt__store_close(l->st);
    l->st = NULL;
  }
  if (l->st)
    return true;
  const dt__comm_env *e = &l->c->env;
  int me = l->c->world_ranks ? l->c->world_ranks[l->c->rank] : l->c->rank;
  return dt__store_connect(e->store_host, e->store_port, e->secret, e->secret_len, me, deadline, &l->st) == DT_OK;
}

void dt__tcp_loss_publish(dt__tcp_loss *l, const uint64_t *sent) {
  char *val = dt__alloc(l->cap);
  if (!val)
    return;
  size_t u = 0;
  for (int r = 0; r < l->c->size; r++)
    u += (size_t)snprintf(val + u, l->cap - u, "%s%llu", r ? " " : "", (unsigned long long)sent[r]);
  int64_t dl = dt__deadline_after_ms(LOSS_RPC_MS);
  if (strcmp(val, l->last) != 0 && loss_connect(l, dl)) {
    char key[128];
    dt__comm_key(l->c, key, sizeof key, "tcp/sent/%d", l->c->rank);
    if (dt__store_set(l->st, key, val, u, dl) == DT_OK)
      memcpy(l->last, val, u + 1);
  }
  dt__free(val);
}

dt_status dt__tcp_loss_check(dt__tcp_loss *l, int src, uint64_t arrived, int64_t silent_ns, const dt__fp *fp) {
  dt_comm *c = l->c;
  int64_t dl = dt__deadline_after_ms(LOSS_RPC_MS);
  if (!loss_connect(l, dl))
    return DT_OK;
  char key[128], *val = dt__alloc(l->cap);
  if (!val)
    return DT_OK;
  size_t n = 0;
  dt__comm_key(c, key, sizeof key, "tcp/sent/%d", src);
  dt_status st = dt__store_get(l->st, key, val, l->cap - 1, &n, dl);
  unsigned long long sent = 0;
  bool have = false;
  if (st == DT_OK) {
    val[n] = '\0';
    char *p = val, *end;
    for (int r = 0; r <= c->rank && *p; r++, p = end) {
      sent = strtoull(p, &end, 10);
      if (end == p)
        break;
      have = r == c->rank;
    }
  }
  dt__free(val);
  if (!have || sent <= arrived)
    return DT_OK; /* no evidence of loss: the peer is slow, or has not been blocked long */
  char pn[64], me[64], what[160];
  dt__comm_peer_name(c, src, pn, sizeof pn);
  dt__comm_peer_name(c, c->rank, me, sizeof me);
  dt__fp_format(fp, what, sizeof what);
  /* TIMEOUT, not PEER: the peer is alive, so there is no root cause elsewhere to wait for. */
  return dt_set_error(DT_ERR_TIMEOUT,
                      "%s: %s failed: no data from it for %.1f s in %s (heartbeats still arriving): it reports "
                      "%llu message%s sent to %s, %llu arrived - its link loses data",
                      me, pn, (double)silent_ns / 1e9, what, sent, sent == 1 ? "" : "s", me, (unsigned long long)arrived);
}
