/* rd.c - recursive-doubling allreduce, for small messages: log2(n) steps of whole-buffer
 * exchanges, so latency is log2(n) hops instead of the ring's 2(n-1).
 *
 * Non-power-of-two n: with p2 the largest power of two <= n and extra = n - p2, ranks below
 * 2*extra pair up first (even rank r sends to r+1 and sits out), the p2 survivors run the
 * doubling, and each odd survivor hands the result back to its even partner.
 *
 * Every exchange computes lower-rank-operand op higher-rank-operand, so both partners get the
 * same bits (matters for min/max of +0/-0 and NaN payloads) and all ranks end bit-identical.
 * f16/bf16 (every op) accumulate in f32 and round once at the end, but the wire carries f32
 * only where a partial sum must: an exchange of two original inputs (the fold's send, and the
 * first doubling round between two ranks that did not fold) moves the half types and the
 * receiver widens both operands while adding (dt__reduce_mix: one f32 operation, no rounding
 * yet), and the hand-back to a folded rank moves the already rounded result. At n = 2 that is
 * the whole collective: one exchange of half types and one f32 operation (and avg's division)
 * rounded once, the same bits as widening the buffer first, with half the bytes and no
 * conversion passes. Every type's first exchange sends from the input and reduces into the
 * output, so a call that is not in place copies nothing first. It deliberately has no bandwidth
 * optimization: large messages go to the ring. */
#include <string.h>

#include "comm/coll/coll.h"

dt_status dt__allreduce_rd(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, dt_op op,
                           const dt__fp *fp, int64_t deadline) {
  int n = c->size, r = c->rank;
  int wide = t == DT_F16 || t == DT_BF16;
  dt_dtype wt = wide ? DT_F32 : t;
  size_t es = dt_dtype_size(wt), bytes = count * es, hbytes = count * dt_dtype_size(t);
  void *buf, *tmp = dt__coll_scratch(c, 1, bytes);
  if (!tmp)
    return DT_ERR_NOMEM;
  int p2 = 1;
  while (p2 * 2 <= n)
    p2 *= 2;
  int extra = n - p2, vr;
  /* orig while this rank's state is still its own input in sbuf: its first exchange sends from
   * there and reduces into buf, so no call copies its input first (f32, 2 ranks on shm, not in
   * place: 12.9-13.1 against 13.1-13.8 us at 128 KiB with the copy, 2-4% faster from 32 KiB;
   * bench/results/half-types-2026-12-04-zen5.txt, section 5) */
  int orig = 1;
  if (wide) {
    if (!(buf = dt__coll_scratch(c, 0, bytes)))
      return DT_ERR_NOMEM;
  } else {
    buf = rbuf;
  }
  dt_status st;
  if (r < 2 * extra) {
    if (r % 2 == 0) {
      st = c->ops->sendrecv(c->tp, r + 1, sbuf, hbytes, -1, NULL, 0, fp, deadline);
      if (st)
        return st;
      orig = 0; /* the result comes back whole (the hand-back) */
      vr = -1;
    } else {
      st = c->ops->sendrecv(c->tp, -1, NULL, 0, r - 1, tmp, hbytes, fp, deadline);
      if (st)
        return st;
      if (wide)
        dt__reduce_mix(buf, DT_F32, tmp, t, sbuf, t, count, op, 1);
      else
        dt__reduce2(buf, tmp, sbuf, count, t, op);
      orig = 0;
      vr = r / 2;
    }
  } else {
    vr = r - extra;
  }
  if (vr >= 0) {
    for (int mask = 1; mask < p2; mask <<= 1) {
      int pv = vr ^ mask, peer = pv < extra ? pv * 2 + 1 : pv + extra;
      /* The first exchange (mask == 1) while both still hold their inputs: from sbuf, reduced
       * into buf (the half types: widened while adding, and at n == 2 that is the whole
       * reduction, straight into rbuf with avg's division before the rounding). Any other type
       * reduces its input with a partner's partial the same way. */
      if (orig && (!wide || peer >= 2 * extra)) {
        st = c->ops->sendrecv(c->tp, peer, sbuf, hbytes, peer, tmp, hbytes, fp, deadline);
        if (st)
          return st;
        const void *lo = peer < r ? tmp : sbuf, *hi = peer < r ? sbuf : tmp;
        orig = 0;
        if (!wide) {
          dt__reduce2(buf, lo, hi, count, t, op);
          continue;
        }
        if (n == 2) {
          dt__reduce_mix(rbuf, t, lo, t, hi, t, count, op, op == DT_AVG ? n : 1);
          return DT_OK;
        }
        dt__reduce_mix(buf, DT_F32, lo, t, hi, t, count, op, 1);
        continue;
      }
      if (orig) { /* the partner folded: it holds an f32 partial, so widen ours */
        dt__to_f32(buf, sbuf, count, t);
        orig = 0;
      }
      st = c->ops->sendrecv(c->tp, peer, buf, bytes, peer, tmp, bytes, fp, deadline);
      if (st)
        return st;
      if (peer < r)
        dt__reduce2(buf, tmp, buf, count, wt, op);
      else
        dt__reduce2(buf, buf, tmp, count, wt, op);
    }
  }
  if (wide && vr >= 0) {
    if (orig) /* n == 1 */
      dt__to_f32(buf, sbuf, count, t);
    if (op == DT_AVG) {
      float *f = buf;
      for (size_t i = 0; i < count; i++)
        f[i] = f[i] / (float)n;
    }
    dt__from_f32(rbuf, buf, count, t);
  }
  if (r < 2 * extra) { /* the hand-back; wide types move the rounded result */
    void *res = wide ? rbuf : buf;
    size_t rb = wide ? hbytes : bytes;
    if (r % 2 == 1)
      st = c->ops->sendrecv(c->tp, r - 1, res, rb, -1, NULL, 0, fp, deadline);
    else
      st = c->ops->sendrecv(c->tp, -1, NULL, 0, r + 1, res, rb, fp, deadline);
    if (st)
      return st;
  }
  if (!wide) {
    if (orig && sbuf != rbuf) /* n == 1 */
      dt__copy(rbuf, sbuf, bytes);
    dt__reduce_finish(rbuf, count, t, op, n);
  }
  return DT_OK;
}
