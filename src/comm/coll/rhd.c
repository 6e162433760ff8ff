/* rhd.c - Rabenseifner's allreduce: reduce-scatter by recursive halving, then allgather by
 * recursive doubling.
 *
 * Each rank sends and receives 2(n-1)/n of the buffer, the same bytes as the ring, in 2 log2(n)
 * exchanges instead of the ring's 2(n-1) steps. What that buys: every step of a ring waits for
 * the slowest of the n ranks to hand its piece on, and with more ranks than cores (4 ranks on 2
 * cores) each hand-over waits for a rank that shares a core to be scheduled; halving the number
 * of steps halves those waits. Round k (mask = p2/2, p2/4, ..., 1) pairs rank v with v ^ mask:
 * both hold the same window of the buffer, each keeps one half (the upper half when its mask bit
 * is set), sends the other and reduces the half it keeps with what arrives. The exchange is cut
 * into pieces of DTRAIN_RING_PIECE bytes (ring.c) so that the reduction of a piece overlaps the
 * transfer of the next. After log2(p2) rounds rank v owns window v (1/p2 of the buffer, fully
 * reduced, avg finished there), and the allgather retraces the windows in reverse, doubling.
 *
 * Non-power-of-two n: as in rd.c, with p2 the largest power of two <= n and extra = n - p2,
 * even ranks below 2*extra first hand their whole input to the odd rank above them and sit out;
 * the p2 survivors run the algorithm; each odd survivor then sends the result back. That costs
 * the folded pairs a whole buffer each way, so choose() uses this only for powers of two; the
 * fold keeps any n correct when DTRAIN_ALGO forces it.
 *
 * Every element is reduced along one path (one tree of exchanges) and the result copied, so all
 * ranks end bit-identical; each exchange computes lower-rank operand op higher-rank operand.
 * f16/bf16 with sum/prod/avg go to the ring (ring.c's direct reduce-scatter), which rounds once
 * without sending f32 partials: halving would have to carry f32 partials after its first round.
 * It deliberately does not pipeline across rounds: a round's partner is known only once the
 * previous round's window is reduced. */
#include "comm/coll/coll.h"

/* One round of recursive halving with `peer`: this rank keeps [klo, klo + kn) and sends
 * [slo, slo + sn) of `src` (elements), receiving the peer's copy of the kept window in pieces
 * into tmp and reducing each at once into dst (dst may equal src). Both sides cut the same
 * number of pieces, from the longer of the two halves. */
static dt_status rhd_halve(dt_comm *c, int peer, const char *src, char *dst, size_t slo, size_t sn, size_t klo,
                           size_t kn, dt_dtype t, dt_op op, char *tmp, size_t pe, const dt__fp *fp,
                           int64_t deadline) {
  size_t es = dt_dtype_size(t), most = DT_MAX(sn, kn);
  size_t pieces = most ? (most + pe - 1) / pe : 1;
  int peer_first = peer < c->rank;
  for (size_t p = 0; p < pieces; p++) {
    size_t so = DT_MIN(p * pe, sn), sm = DT_MIN(so + pe, sn) - so;
    size_t ko = DT_MIN(p * pe, kn), km = DT_MIN(ko + pe, kn) - ko;
    dt_status st = c->ops->sendrecv(c->tp, peer, src + (slo + so) * es, sm * es, peer, tmp, km * es, fp, deadline);
    if (st)
      return st;
    if (km == 0)
      continue;
    const char *mine = src + (klo + ko) * es;
    char *out = dst + (klo + ko) * es;
    if (peer_first)
      dt__reduce2(out, tmp, mine, km, t, op);
    else
      dt__reduce2(out, mine, tmp, km, t, op);
  }
  return DT_OK;
}

dt_status dt__allreduce_rhd(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, dt_op op,
                            const dt__fp *fp, int64_t deadline) {
  if (dt__coll_wide(t, op))
    return dt__allreduce_ring(c, sbuf, rbuf, count, t, op, fp, deadline);
  int n = c->size, r = c->rank;
  size_t es = dt_dtype_size(t), bytes = count * es;
  int p2 = 1;
  while (p2 * 2 <= n)
    p2 *= 2;
  int extra = n - p2, vr;
  size_t pe = DT_MAX((size_t)1, dt__ring_piece_bytes() / es);
  size_t tmp_n = DT_MIN(pe, (count + 1) / 2 + 1) * es;
  char *tmp = dt__coll_scratch(c, 1, r < 2 * extra && r % 2 ? DT_MAX(tmp_n, bytes) : tmp_n);
  if (!tmp)
    return DT_ERR_NOMEM;
  const char *src = sbuf;
  dt_status st;
  /* Fold: even ranks below 2*extra give their input to the odd rank above and wait. */
  if (r < 2 * extra) {
    if (r % 2 == 0) {
      st = c->ops->sendrecv(c->tp, r + 1, sbuf, bytes, -1, NULL, 0, fp, deadline);
      if (st == DT_OK)
        st = c->ops->sendrecv(c->tp, -1, NULL, 0, r + 1, rbuf, bytes, fp, deadline);
      return st;
    }
    st = c->ops->sendrecv(c->tp, -1, NULL, 0, r - 1, tmp, bytes, fp, deadline);
    if (st)
      return st;
    dt__reduce2(rbuf, tmp, sbuf, count, t, op);
    src = rbuf;
    vr = r / 2;
  } else {
    vr = r - extra;
  }
  /* Windows before each halving round, for the allgather to retrace: [lo[i], hi[i]). */
  size_t lo[32], hi[32], wlo = 0, whi = count;
  int i = 0;
  for (int mask = p2 / 2; mask >= 1; mask /= 2, i++) {
    int pv = vr ^ mask, peer = pv < extra ? pv * 2 + 1 : pv + extra;
    size_t mid = wlo + (whi - wlo) / 2;
    lo[i] = wlo;
    hi[i] = whi;
    int upper = (vr & mask) != 0;
    size_t slo = upper ? wlo : mid, sn = upper ? mid - wlo : whi - mid;
    size_t klo = upper ? mid : wlo, kn = upper ? whi - mid : mid - wlo;
    st = rhd_halve(c, peer, src, rbuf, slo, sn, klo, kn, t, op, tmp, pe, fp, deadline);
    if (st)
      return st;
    src = rbuf; /* from the second round on, the partials live in rbuf */
    wlo = klo;
    whi = klo + kn;
  }
  dt__reduce_finish((char *)rbuf + wlo * es, whi - wlo, t, op, n);
  /* Allgather: retrace the windows, doubling: send what this rank holds, receive the sibling. */
  for (int mask = 1; mask < p2; mask *= 2) {
    i--;
    int pv = vr ^ mask, peer = pv < extra ? pv * 2 + 1 : pv + extra;
    /* the sibling half, by the mask bit: a window's halves may be empty, so bounds cannot tell */
    size_t mid = lo[i] + (hi[i] - lo[i]) / 2;
    size_t olo = (vr & mask) ? lo[i] : mid, ohi = (vr & mask) ? mid : hi[i];
    st = c->ops->sendrecv(c->tp, peer, (char *)rbuf + wlo * es, (whi - wlo) * es, peer, (char *)rbuf + olo * es,
                          (ohi - olo) * es, fp, deadline);
    if (st)
      return st;
    wlo = lo[i];
    whi = hi[i];
  }
  if (r < 2 * extra) /* odd survivor: the result back to the even partner */
    return c->ops->sendrecv(c->tp, r - 1, rbuf, bytes, -1, NULL, 0, fp, deadline);
  return DT_OK;
}
