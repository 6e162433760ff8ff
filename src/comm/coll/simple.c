/* simple.c - the collectives whose best algorithm on a few ranks is direct: linear gather and
 * scatter at the root, pairwise-exchange alltoall, dissemination barrier, and the fingerprint
 * check that rooted collectives start with.
 *
 * With two ranks, gather and scatter make their one transfer an exchange with a zero-byte
 * message back, which checks both fingerprints in the same round trip (collectives.c then skips
 * dt__coll_check; see tree.c).
 *
 * Linear gather/scatter serialize n-1 transfers at the root, which is what the root's link
 * allows anyway for large blocks; it deliberately has no tree variant for many small blocks. */
#include <string.h>

#include "comm/coll/coll.h"

static inline int mod(int a, int n) { return ((a % n) + n) % n; }

/* A dissemination barrier whose zero-byte messages carry the call's fingerprint, each compared by
 * its receiver: a rank passes only once every rank's fingerprint has reached it through a chain
 * of compared messages, so every rank of a mismatched call fails. (A ring of one round let a rank
 * whose left neighbour agreed with it pass: with 3 ranks, rank 2's gather returned DT_OK while
 * rank 0 called scatter.) ceil(log2 n) rounds. */
dt_status dt__coll_check(dt_comm *c, const dt__fp *fp, int64_t deadline) { return dt__barrier_dissem(c, fp, deadline); }

dt_status dt__gather_linear(dt_comm *c, const void *sbuf, void *rbuf, size_t bytes, int root, const dt__fp *fp,
                            int64_t deadline) {
  int n = c->size, r = c->rank, pair = n == 2;
  if (r != root)
    return c->ops->sendrecv(c->tp, root, sbuf, bytes, pair ? root : -1, NULL, 0, fp, deadline);
  char *out = rbuf;
  if (sbuf != out + (size_t)r * bytes)
    dt__copy(out + (size_t)r * bytes, sbuf, bytes);
  for (int k = 1; k < n; k++) {
    int src = mod(root + k, n);
    DT_CHECK(c->ops->sendrecv(c->tp, pair ? src : -1, NULL, 0, src, out + (size_t)src * bytes, bytes, fp, deadline));
  }
  return DT_OK;
}

dt_status dt__scatter_linear(dt_comm *c, const void *sbuf, void *rbuf, size_t bytes, int root, const dt__fp *fp,
                             int64_t deadline) {
  int n = c->size, r = c->rank, pair = n == 2;
  if (r != root)
    return c->ops->sendrecv(c->tp, pair ? root : -1, NULL, 0, root, rbuf, bytes, fp, deadline);
  const char *in = sbuf;
  for (int k = 1; k < n; k++) {
    int dst = mod(root + k, n);
    DT_CHECK(c->ops->sendrecv(c->tp, dst, in + (size_t)dst * bytes, bytes, pair ? dst : -1, NULL, 0, fp, deadline));
  }
  if (rbuf != in + (size_t)r * bytes)
    memmove(rbuf, in + (size_t)r * bytes, bytes);
  return DT_OK;
}

dt_status dt__alltoall_pairwise(dt_comm *c, const void *sbuf, void *rbuf, size_t bytes, const dt__fp *fp,
                                int64_t deadline) {
  int n = c->size, r = c->rank;
  const char *in = sbuf;
  char *out = rbuf;
  if (sbuf == rbuf) { /* in place: the input must survive while blocks arrive */
    char *copy = dt__coll_scratch(c, 0, (size_t)n * bytes);
    if (!copy)
      return DT_ERR_NOMEM;
    dt__copy(copy, rbuf, (size_t)n * bytes);
    in = copy;
  } else {
    dt__copy(out + (size_t)r * bytes, in + (size_t)r * bytes, bytes);
  }
  for (int s = 1; s < n; s++) {
    int dst = mod(r + s, n), src = mod(r - s, n);
    DT_CHECK(c->ops->sendrecv(c->tp, dst, in + (size_t)dst * bytes, bytes, src, out + (size_t)src * bytes, bytes, fp,
                              deadline));
  }
  return DT_OK;
}

/* Bruck's allgather on the dissemination pattern: in round d = 1, 2, 4, ... every rank sends to
 * rank + d the first min(d, n - d) blocks it holds and appends as many from rank - d, so after
 * ceil(log2 n) rounds it holds every block, rank r - i's at position i of a scratch buffer,
 * and one pass puts them in their places. Each rank sends n - 1 blocks in all, as in the ring,
 * but in ceil(log2 n) messages instead of n - 1: the choice for small blocks where the latency
 * of a message is the cost (collectives.c). Every round's messages carry the fingerprint and
 * meet those of the barrier, the trees and the ring's first step, so a mismatched call fails on
 * every rank as in the barrier. */
dt_status dt__allgather_bruck(dt_comm *c, const void *own, void *rbuf, size_t bytes, const dt__fp *fp,
                              int64_t deadline) {
  int n = c->size, r = c->rank;
  char *out = rbuf, *tmp = dt__coll_scratch(c, 0, (size_t)n * bytes);
  if (!tmp)
    return DT_ERR_NOMEM;
  dt__copy(tmp, own ? own : out + (size_t)r * bytes, bytes);
  for (int d = 1; d < n; d <<= 1) {
    size_t m = (size_t)DT_MIN(d, n - d) * bytes;
    DT_CHECK(c->ops->sendrecv(c->tp, mod(r + d, n), tmp, m, mod(r - d, n), tmp + (size_t)d * bytes, m, fp, deadline));
  }
  for (int i = 0; i < n; i++)
    if (i || own)
      dt__copy(out + (size_t)mod(r - i, n) * bytes, tmp + (size_t)i * bytes, bytes);
  return DT_OK;
}

dt_status dt__barrier_dissem(dt_comm *c, const dt__fp *fp, int64_t deadline) {
  int n = c->size, r = c->rank;
  for (int k = 1; k < n; k <<= 1)
    DT_CHECK(c->ops->sendrecv(c->tp, mod(r + k, n), NULL, 0, mod(r - k, n), NULL, 0, fp, deadline));
  return DT_OK;
}
