/* tree.c - rooted collectives: binomial-tree reduce, binomial-tree broadcast, and a pipelined
 * chain broadcast for large messages.
 *
 * Binomial trees take ceil(log2 n) hops: the right shape for latency-bound messages. For large
 * broadcasts the chain (root -> root+1 -> ... in pieces of DTRAIN_CHAIN_PIECE bytes, default
 * CHAIN_PIECE_DEFAULT, 64 KiB less 96 bytes) keeps every link busy: time ~ (pieces + n - 2)
 * piece transfers instead of log2(n) whole-buffer transfers. 64 KiB pieces against 256 KiB (`DTRAIN_CHAIN_PIECE=
 * {65536,131072,262144} dtrain bench broadcast -n 4 --transport tcp --algo chain --sizes
 * 256K:64M --iters 12 --warmup 3`, three alternated runs, 2026-11-28, EPYC guest): 237-341 us
 * against 496-528 at 256 KiB, 671-1014 against 874-1350 at 1 MiB, 3.6-4.7 ms against 3.5-6.2
 * at 4 MiB, level from 16 MiB (128 KiB pieces in between). Over shm's staged rings (CMA off,
 * 2-32 MiB, two rounds) mixed: at 16 MiB 256 KiB pieces led on 4 ranks (5.4-5.9 ms against
 * 9.3-12.1) and trailed on 3 (6.6-7.0 against 3.5-3.6); rows in
 * bench/results/trees-bruck-chain-2026-11-28-epyc.txt.
 *
 * Mismatch detection: both trees move their data on the pattern of the dissemination barrier
 * that other collectives run first as their check (dt__coll_check): ceil(log2 n) rounds, in
 * round d every rank exchanges with rank + d and rank - d, the tree's transfers where the tree
 * has one and a zero-byte message carrying the fingerprint everywhere else. Every rank hears,
 * through compared messages, from every other, whatever root each believes in, so every rank of
 * a mismatched call fails, and the check costs no round of its own (check + tree took twice the
 * rounds: 4-rank tcp broadcasts of 8 B - 16 KiB 58-96 us against 76-165 before, three
 * alternated runs of `dtrain bench broadcast -n 4 --transport tcp --sizes 4:1M --iters 100`,
 * 2026-11-28). With two ranks that is one exchange: the data one way, a zero-byte message back.
 * The chain checks first (collectives.c).
 *
 * Reduce of f16/bf16 sum/prod/avg carries f32 partials up the tree (twice the bytes) and the
 * root rounds once. It deliberately has no reduce-scatter+gather variant for large messages
 * yet: the tree moves log2(n) whole buffers into the root. */
#include <string.h>

#include "comm/coll/coll.h"

static inline int real_rank(int vr, int root, int n) { return (vr + root) % n; }

dt_status dt__reduce_tree(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, dt_op op, int root,
                          const dt__fp *fp, int64_t deadline) {
  /* virtual ranks counted downwards from the root, so that the tree's transfers (to vr - d) go
   * to rank + d, along the check's pattern (see below) */
  int n = c->size, r = c->rank, vr = (root - r + n) % n;
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
  /* The binomial tree's transfers on the dissemination barrier's pattern, as the broadcast below
   * (in round d every rank sends to rank + d, virtual rank vr - d, and receives from rank - d,
   * vr + d; a mismatched call of the two then still meets and compares): the partial goes up
   * where the sender's lowest set bit is d (vr mod 2d = d), zero-byte messages with the
   * fingerprint everywhere else. */
  for (int d = 1; d < n; d <<= 1) {
    bool give = (vr & (2 * d - 1)) == d, take = (vr & (2 * d - 1)) == 0 && vr + d < n;
    if (take && !tmp && !(tmp = dt__coll_scratch(c, 1, bytes)))
      return DT_ERR_NOMEM;
    dt_status st = c->ops->sendrecv(c->tp, (r + d) % n, give ? acc : NULL, give ? bytes : 0, (r - d + n) % n,
                                    take ? tmp : NULL, take ? bytes : 0, fp, deadline);
    if (st)
      return st;
    if (!take)
      continue;
    if (!own) {
      own = vr == 0 ? rbuf : dt__coll_scratch(c, 0, bytes);
      if (!own)
        return DT_ERR_NOMEM;
    }
    dt__reduce2(own, acc, tmp, count, wt, op);
    acc = own;
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
  /* In round d = 1, 2, 4, ... every rank sends to rank + d and receives from rank - d: the data
   * where the sender has it (vr < d) and the receiver not yet (its vr in [d, 2d)), a zero-byte
   * message with the fingerprint otherwise. Who talks to whom does not depend on the root, so
   * ranks that disagree on it still meet and compare; each round's message leaves after the
   * previous round's arrived, so as in the barrier every rank of a mismatched call fails. */
  for (int d = 1; d < n; d <<= 1) {
    bool give = vr < d && vr + d < n, take = vr >= d && vr < 2 * d;
    dt_status st = c->ops->sendrecv(c->tp, (r + d) % n, give ? buf : NULL, give ? bytes : 0, (r - d + n) % n,
                                    take ? buf : NULL, take ? bytes : 0, fp, deadline);
    if (st)
      return st;
  }
  return DT_OK;
}

/* 64 KiB less 96 bytes: with the tcp transport's 40-byte header a piece leaves loopback as one
 * full 65,483-byte segment, where 64 KiB left as a full one and 93 bytes (as the ring's piece,
 * ring.c). 4 ranks on the 2 cores, three alternated rounds of `DTRAIN_CHAIN_PIECE={65536,65440}
 * dtrain bench broadcast -n 4 --transport tcp --sizes 256K:16M --iters 20 --warmup 3 [--fresh]`
 * (2026-11-29, Xeon guest): 1 MiB 391-393 us against 441-454 fresh and 412-421 against 445-463
 * reused, 4 MiB 1.51-1.57 ms against 1.71-1.85, 16 MiB 7.8-8.1 ms against 9.6-10.9 fresh (9.3-9.5
 * against 10.1-11.0 reused), 256 KiB 119-124 us against 167-171 fresh. Divisible by 8: whole
 * elements of every dtype. */
#define CHAIN_PIECE_DEFAULT 65440u

static size_t chain_piece_bytes(const dt_comm *c) {
  return c->env.chain_piece > 0 ? (size_t)c->env.chain_piece : CHAIN_PIECE_DEFAULT; /* checked in config.c */
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
