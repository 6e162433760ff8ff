/* tree.c - rooted collectives: binomial-tree reduce, binomial-tree broadcast, and a pipelined
 * chain broadcast for large messages.
 *
 * Binomial trees take ceil(log2 n) hops: the right shape for latency-bound messages. For large
 * broadcasts the chain (root -> root+1 -> ... in pieces of DTRAIN_CHAIN_PIECE bytes, default
 * 256 KiB) keeps every link busy: time ~ (pieces + n - 2) piece transfers instead of
 * log2(n) whole-buffer transfers.
 *
 * Mismatch detection: with more than two ranks collectives.c runs dt__coll_check first (a
 * dissemination barrier carrying the fingerprint, ceil(log2 n) rounds). With two ranks the tree's one transfer is made an exchange instead:
 * the receiving rank sends a zero-byte message back in the same sendrecv, so each rank sees the
 * other's fingerprint without a second round trip (two ranks that both think they are the root
 * then each receive the other's data where they expected a zero-byte message: a mismatch on both).
 *
 * Reduce of f16/bf16 sum/prod/avg carries f32 partials up the tree (twice the bytes) and the
 * root rounds once. It deliberately has no reduce-scatter+gather variant for large messages
 * yet: the tree moves log2(n) whole buffers into the root. */
#include <string.h>

#include "comm/coll/coll.h"

static inline int real_rank(int vr, int root, int n) { return (vr + root) % n; }

dt_status dt__reduce_tree(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, dt_op op, int root,
                          const dt__fp *fp, int64_t deadline) {
  int n = c->size, r = c->rank, vr = (r - root + n) % n;
  int wide = dt__coll_wide(t, op);
  dt_dtype wt = wide ? DT_F32 : t;
  size_t es = dt_dtype_size(wt), bytes = count * es;
  const void *acc = sbuf; /* what this rank has so far (type wt) */
  void *own = NULL;       /* writable accumulator once something arrived */
  void *tmp = NULL;
  if (wide) {
    if (!(own = dt__coll_scratch(c, 0, bytes)))
      return DT_ERR_NOMEM;
    dt__to_f32(own, sbuf, count, t);
    acc = own;
  }
  dt_status st;
  for (int mask = 1; mask < n; mask <<= 1) {
    if (vr & mask) {
      int to = real_rank(vr - mask, root, n);
      /* two ranks: the root's zero-byte answer carries its fingerprint (the call's check) */
      st = c->ops->sendrecv(c->tp, to, acc, bytes, n == 2 ? to : -1, NULL, 0, fp, deadline);
      if (st)
        return st;
      break;
    }
    if (vr + mask < n) {
      if (!tmp && !(tmp = dt__coll_scratch(c, 1, bytes)))
        return DT_ERR_NOMEM;
      int from = real_rank(vr + mask, root, n);
      st = c->ops->sendrecv(c->tp, n == 2 ? from : -1, NULL, 0, from, tmp, bytes, fp, deadline);
      if (st)
        return st;
      if (!own) {
        own = vr == 0 ? rbuf : dt__coll_scratch(c, 0, bytes);
        if (!own)
          return DT_ERR_NOMEM;
      }
      dt__reduce2(own, acc, tmp, count, wt, op);
      acc = own;
    }
  }
  if (vr != 0)
    return DT_OK;
  if (wide) {
    if (op == DT_AVG) {
      float *f = own;
      for (size_t i = 0; i < count; i++)
        f[i] = f[i] / (float)n;
    }
    dt__from_f32(rbuf, acc, count, t);
  } else {
    if (acc != rbuf)
      dt__copy(rbuf, acc, bytes);
    dt__reduce_finish(rbuf, count, t, op, n);
  }
  return DT_OK;
}

dt_status dt__broadcast_tree(dt_comm *c, void *buf, size_t bytes, int root, const dt__fp *fp, int64_t deadline) {
  int n = c->size, r = c->rank, vr = (r - root + n) % n;
  int mask = 1;
  dt_status st;
  if (n == 2) { /* one exchange: the data one way, a zero-byte message (the call's check) back */
    int peer = 1 - r;
    return vr == 0 ? c->ops->sendrecv(c->tp, peer, buf, bytes, peer, NULL, 0, fp, deadline)
                   : c->ops->sendrecv(c->tp, peer, NULL, 0, peer, buf, bytes, fp, deadline);
  }
  while (mask < n) {
    if (vr & mask) {
      st = c->ops->sendrecv(c->tp, -1, NULL, 0, real_rank(vr - mask, root, n), buf, bytes, fp, deadline);
      if (st)
        return st;
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (vr + mask < n) {
      st = c->ops->sendrecv(c->tp, real_rank(vr + mask, root, n), buf, bytes, -1, NULL, 0, fp, deadline);
      if (st)
        return st;
    }
  return DT_OK;
}

static size_t chain_piece_bytes(const dt_comm *c) {
  return c->env.chain_piece > 0 ? (size_t)c->env.chain_piece : 256u << 10; /* checked in config.c */
}

dt_status dt__broadcast_chain(dt_comm *c, void *buf, size_t bytes, int root, const dt__fp *fp, int64_t deadline) {
  int n = c->size, vr = (c->rank - root + n) % n;
  int prev = vr > 0 ? real_rank(vr - 1, root, n) : -1, next = vr < n - 1 ? real_rank(vr + 1, root, n) : -1;
  size_t pb = chain_piece_bytes(c), pieces = bytes ? (bytes + pb - 1) / pb : 1;
  char *b = buf;
  /* iteration i forwards piece i-1 and receives piece i */
  for (size_t i = 0; i <= pieces; i++) {
    int dst = -1, src = -1;
    size_t so = 0, sn = 0, ro = 0, rn = 0;
    if (vr == 0) {
      if (i == pieces)
        break;
      dst = next, so = i * pb, sn = DT_MIN(pb, bytes - so);
    } else {
      if (i >= 1 && next >= 0)
        dst = next, so = (i - 1) * pb, sn = DT_MIN(pb, bytes - so);
      if (i < pieces)
        src = prev, ro = i * pb, rn = DT_MIN(pb, bytes - ro);
    }
    if (dst < 0 && src < 0)
      continue;
    dt_status st = c->ops->sendrecv(c->tp, dst, b + so, sn, src, b + ro, rn, fp, deadline);
    if (st)
      return st;
  }
  return DT_OK;
}
