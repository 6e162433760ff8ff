/* rhd.c - Rabenseifner's allreduce: reduce-scatter by recursive halving, then allgather by
 * recursive doubling.
 *
 * Each rank sends and receives 2(n-1)/n of the buffer, the same bytes as the ring, in 2 log2(n)
 * exchanges instead of the ring's 2(n-1) steps. What that buys: every step of a ring waits for
 * the slowest of the n ranks to hand its piece on, and with more ranks than cores (4 ranks on 2
 * cores) each hand-over waits for a rank that shares a core to be scheduled; halving the number
 * of steps halves those waits. Round k (mask = p2/2, p2/4, ..., 1) pairs rank v with v ^ mask:
 * both hold the same window of the buffer, each keeps one half (the upper half when its mask bit
 * is set), sends the other and reduces the half it keeps with what arrives. Every exchange, the
 * doubling ones too, is cut into pieces of DTRAIN_RING_PIECE bytes (ring.c) so that the reduction
 * of a piece overlaps the transfer of the next, and sends one piece ahead where the transport
 * queues it (rhd_swap), so that neither side of a pair waits for the other to start. After log2(p2) rounds rank v owns window v (1/p2 of the buffer, fully
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
 * It deliberately does not pipeline across rounds: what a round sends is the half of the window
 * that the previous round finished reducing only at its end.
 *
 * The halving alone is also a reduce_scatter (dt__reduce_scatter_rhd): over the n blocks of the
 * input, rank r's last window is block r. It sends the ring's (n-1) blocks in log2(n) exchanges
 * instead of n - 1 steps; powers of two above 2 only (2 ranks: one exchange either way). */
#include "comm/coll/coll.h"

/* One exchange with `peer`: sends sn elements from sp while receiving rn elements, in pieces of
 * pe elements (both sides cut the same number, from the longer side). Received pieces land at
 * rp, or, when tmp is given, in tmp and are reduced at once with `mine` (at the same offsets)
 * into rp, lower rank's operand first. Pieces go out dt__coll_send_ahead pieces ahead of the
 * one received (ring.c), so the peer finds its next pieces already there; the pieces sent never
 * depend on the ones received within one exchange. */
static dt_status rhd_swap(dt_comm *c, int peer, const char *sp, size_t sn, char *rp, size_t rn, char *tmp,
                          const char *mine, dt_dtype t, dt_op op, size_t pe, const dt__fp *fp, int64_t deadline) {
  size_t es = dt_dtype_size(t), most = DT_MAX(sn, rn);
  if (most <= 2 * pe)
    pe = DT_MAX(most, (size_t)1); /* two pieces overlap little and cost a third call when sent ahead */
  size_t pieces = most ? (most + pe - 1) / pe : 1;
  int peer_first = peer < c->rank;
  size_t ahead = dt__coll_send_ahead(c, pieces, pe * es);
  for (size_t q = 0; q < ahead; q++) {
    size_t so = DT_MIN(q * pe, sn);
    DT_CHECK(c->ops->sendrecv(c->tp, peer, sp + so * es, (DT_MIN(so + pe, sn) - so) * es, -1, NULL, 0, fp,
                              deadline));
  }
  for (size_t p = 0; p < pieces; p++) {
    size_t q = p + ahead; /* the piece sent now */
    size_t so = DT_MIN(q * pe, sn), sm = DT_MIN(so + pe, sn) - so;
    size_t ro = DT_MIN(p * pe, rn), rm = DT_MIN(ro + pe, rn) - ro;
    dt_status st = c->ops->sendrecv(c->tp, q < pieces ? peer : -1, sp + so * es, sm * es, peer,
                                    tmp ? tmp : rp + ro * es, rm * es, fp, deadline);
    if (st)
      return st;
    if (!tmp || rm == 0)
      continue;
    const char *m = mine + ro * es;
    char *out = rp + ro * es;
    if (peer_first)
      dt__reduce2(out, tmp, m, rm, t, op);
    else
      dt__reduce2(out, m, tmp, rm, t, op);
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
  size_t pe = DT_MAX((size_t)1, dt__ring_piece_bytes(c) / es);
  size_t tmp_n = DT_MIN(2 * pe, (count + 1) / 2 + 1) * es;
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
    st = rhd_swap(c, peer, src + slo * es, sn, (char *)rbuf + klo * es, kn, tmp, src + klo * es, t, op, pe, fp,
                  deadline);
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
    st = rhd_swap(c, peer, (char *)rbuf + wlo * es, whi - wlo, (char *)rbuf + olo * es, ohi - olo, NULL, NULL, t, op,
                  pe, fp, deadline);
    if (st)
      return st;
    wlo = lo[i];
    whi = hi[i];
  }
  if (r < 2 * extra) /* odd survivor: the result back to the even partner */
    return c->ops->sendrecv(c->tp, r - 1, rbuf, bytes, -1, NULL, 0, fp, deadline);
  return DT_OK;
}

/* Recursive halving over the n blocks of sbuf (n a power of two > 2; else, and for the half
 * types with sum/prod/avg, the ring). Round one reads sbuf and keeps its half's partials in
 * scratch; the later rounds halve within the scratch; the last writes block r into rbuf. sbuf may
 * be rbuf (in place): only round one reads it, and only the last writes rbuf. */
dt_status dt__reduce_scatter_rhd(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, dt_op op,
                                 const dt__fp *fp, int64_t deadline) {
  int n = c->size, r = c->rank;
  if (n <= 2 || (n & (n - 1)) || dt__coll_wide(t, op))
    return dt__reduce_scatter_ring(c, sbuf, rbuf, count, t, op, fp, deadline);
  size_t es = dt_dtype_size(t), total = (size_t)n * count;
  size_t pe = DT_MAX((size_t)1, dt__ring_piece_bytes(c) / es);
  char *tmp = dt__coll_scratch(c, 1, DT_MIN(2 * pe, total / 2 + 1) * es);
  char *acc = tmp ? dt__coll_scratch(c, 0, total / 2 * es) : NULL;
  if (!acc)
    return DT_ERR_NOMEM;
  bool first = true;
  size_t wlo = 0, whi = total, base = 0; /* acc holds elements [base, base + total / 2) */
  for (int mask = n / 2; mask >= 1; mask /= 2) {
    size_t mid = wlo + (whi - wlo) / 2;
    int upper = (r & mask) != 0;
    size_t slo = upper ? wlo : mid, sn = upper ? mid - wlo : whi - mid;
    size_t klo = upper ? mid : wlo, kn = upper ? whi - mid : mid - wlo;
    if (first)
      base = klo;
    char *dst = mask == 1 ? (char *)rbuf : acc + (klo - base) * es;
    const char *sp = first ? (const char *)sbuf + slo * es : acc + (slo - base) * es;
    const char *mine = first ? (const char *)sbuf + klo * es : acc + (klo - base) * es;
    dt_status st = rhd_swap(c, r ^ mask, sp, sn, dst, kn, tmp, mine, t, op, pe, fp, deadline);
    if (st)
      return st;
    first = false;
    wlo = klo;
    whi = klo + kn;
  }
  dt__reduce_finish(rbuf, count, t, op, n);
  return DT_OK;
}
