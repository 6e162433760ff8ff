/* rd.c - recursive-doubling allreduce, for small messages: log2(n) steps of whole-buffer
 * exchanges, so latency is log2(n) hops instead of the ring's 2(n-1).
 *
 * Non-power-of-two n: with p2 the largest power of two <= n and extra = n - p2, ranks below
 * 2*extra pair up first (even rank r sends to r+1 and sits out), the p2 survivors run the
 * doubling, and each odd survivor hands the result back to its even partner.
 *
 * Every exchange computes lower-rank-operand op higher-rank-operand, so both partners get the
 * same bits (matters for min/max of +0/-0 and NaN payloads) and all ranks end bit-identical.
 * f16/bf16 run entirely in f32 (twice the bytes on the wire, which small messages do not
 * notice) and round once at the end. It deliberately has no bandwidth optimization: large
 * messages go to the ring. */
#include <string.h>

#include "comm/coll/coll.h"

dt_status dt__allreduce_rd(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, dt_op op,
                           const dt__fp *fp, int64_t deadline) {
  int n = c->size, r = c->rank;
  int wide = t == DT_F16 || t == DT_BF16;
  dt_dtype wt = wide ? DT_F32 : t;
  size_t es = dt_dtype_size(wt), bytes = count * es;
  void *buf, *tmp = dt__coll_scratch(c, 1, bytes);
  if (!tmp)
    return DT_ERR_NOMEM;
  if (wide) {
    if (!(buf = dt__coll_scratch(c, 0, bytes)))
      return DT_ERR_NOMEM;
    dt__to_f32(buf, sbuf, count, t);
  } else {
    buf = rbuf;
    if (sbuf != rbuf)
      memcpy(rbuf, sbuf, bytes);
  }
  int p2 = 1;
  while (p2 * 2 <= n)
    p2 *= 2;
  int extra = n - p2, vr;
  dt_status st;
  if (r < 2 * extra) {
    if (r % 2 == 0) {
      st = c->ops->sendrecv(c->tp, r + 1, buf, bytes, -1, NULL, 0, fp, deadline);
      if (st)
        return st;
      vr = -1;
    } else {
      st = c->ops->sendrecv(c->tp, -1, NULL, 0, r - 1, tmp, bytes, fp, deadline);
      if (st)
        return st;
      dt__reduce2(buf, tmp, buf, count, wt, op);
      vr = r / 2;
    }
  } else {
    vr = r - extra;
  }
  if (vr >= 0) {
    for (int mask = 1; mask < p2; mask <<= 1) {
      int pv = vr ^ mask, peer = pv < extra ? pv * 2 + 1 : pv + extra;
      st = c->ops->sendrecv(c->tp, peer, buf, bytes, peer, tmp, bytes, fp, deadline);
      if (st)
        return st;
      if (peer < r)
        dt__reduce2(buf, tmp, buf, count, wt, op);
      else
        dt__reduce2(buf, buf, tmp, count, wt, op);
    }
  }
  if (r < 2 * extra) {
    if (r % 2 == 1)
      st = c->ops->sendrecv(c->tp, r - 1, buf, bytes, -1, NULL, 0, fp, deadline);
    else
      st = c->ops->sendrecv(c->tp, -1, NULL, 0, r + 1, buf, bytes, fp, deadline);
    if (st)
      return st;
  }
  if (wide) {
    if (op == DT_AVG) {
      float *f = buf;
      for (size_t i = 0; i < count; i++)
        f[i] = f[i] / (float)n;
    }
    dt__from_f32(rbuf, buf, count, t);
  } else {
    dt__reduce_finish(rbuf, count, t, op, n);
  }
  return DT_OK;
}
