/* ring.c - ring reduce-scatter, ring allgather, and ring allreduce built from both.
 *
 * Allreduce = reduce-scatter then allgather, 2*(n-1) steps; each rank sends and receives
 * 2*(n-1)/n of the buffer, the bandwidth optimum. Any n >= 1 and any count: the buffer is cut
 * into n segments of count/n (+1 for the first count%n), possibly empty; empty segments still
 * exchange a zero-byte message so every rank stays in the same step.
 *
 * Pipelining: each reduce-scatter step is cut into pieces of at most DTRAIN_RING_PIECE bytes of
 * what travels at that step (default 256 KiB, so a piece and the matching input stay in L2). A
 * piece is received into a small temporary and reduced at once while it is hot; meanwhile the left neighbour is already
 * sending the next piece into the transport's buffers (socket buffer, shm ring), so the
 * reduction of piece p overlaps the transfer of piece p+1. All ranks use the same number of
 * pieces per step (from the largest segment), so the calls pair up.
 *
 * f16/bf16 with sum/prod/avg accumulate in f32 and round once. Two ranks: the one step sends
 * the half-precision input and the owner reduces it with its own. More ranks: direct_rs below
 * sends every piece of input straight to its segment's owner (pairwise steps), which reduces all
 * n contributions in one pass; so the half types move (n-1)/n of their input bytes, as f32
 * does, where ring partials in f32 would carry 4 bytes per element on steps 1..n-2. The
 * allgather moves half precision. The ring_rs code for partials of another type stays general.
 * min/max of half types are exact in any order and run on half precision directly.
 *
 * Result bits are identical on every rank: each segment is reduced along one path by its owner
 * and then copied. It deliberately has no hierarchy or multi-ring: that comes with hierarchical
 * collectives. */
#include <string.h>

#include "comm/coll/coll.h"

size_t dt__ring_piece_bytes(void) {
  static _Atomic size_t cached;
  size_t v = cached;
  if (v == 0) {
    uint64_t b;
    if (dt__env_size("DTRAIN_RING_PIECE", 256 << 10, &b) != DT_OK || b < 4096)
      b = 256 << 10;
    v = (size_t)b;
    cached = v;
  }
  return v;
}

static inline int mod(int a, int n) { return ((a % n) + n) % n; }

/* Splits count into n near-equal segments. */
static void ring_segments(size_t count, int n, size_t *off, size_t *len) {
  size_t base = count / (size_t)n, rem = count % (size_t)n, o = 0;
  for (int i = 0; i < n; i++) {
    len[i] = base + ((size_t)i < rem);
    off[i] = o;
    o += len[i];
  }
}

/* The reduce-scatter core. in: the full input (type t) with segment i at off[i]. At step s a
 * rank sends segment (r - s + shift) and receives (r - s - 1 + shift), so after n-1 steps it
 * owns segment (r + 1 + shift - n) = (r + shift + 1) mod n, which lands in `out` (type t).
 * Partials live in acc (type acc_t): at off[seg] when acc_per_seg, else at 0 (one segment). */
static dt_status ring_rs(dt_comm *c, const void *in, const size_t *off, const size_t *len, dt_dtype t, dt_op op,
                         int shift, void *acc, dt_dtype acc_t, int acc_per_seg, void *out, const dt__fp *fp,
                         int64_t deadline) {
  int n = c->size, r = c->rank, right = mod(r + 1, n), left = mod(r - 1, n);
  size_t es = dt_dtype_size(t), aes = dt_dtype_size(acc_t);
  size_t maxseg = 0;
  for (int i = 0; i < n; i++)
    maxseg = DT_MAX(maxseg, len[i]);
  /* Pieces are sized in bytes of what travels at the step, not in elements of the widest type:
   * sized by the f32 partials, a half-type input went out in pieces of half the bytes, twice
   * as many sendrecvs (each a poll wake-up on tcp). */
  size_t pb = dt__ring_piece_bytes();
  size_t pe0 = DT_MIN(DT_MAX((size_t)1, pb / es), DT_MAX(maxseg, (size_t)1));  /* step 0: the input type */
  size_t pe1 = DT_MIN(DT_MAX((size_t)1, pb / aes), DT_MAX(maxseg, (size_t)1)); /* later: the partials */
  void *tmp = dt__coll_scratch(c, 1, DT_MAX(pe0 * es, n > 2 ? pe1 * aes : 0));
  if (!tmp)
    return DT_ERR_NOMEM;
  int wide = acc_t != t;
  for (int s = 0; s < n - 1; s++) {
    int sseg = mod(r - s + shift, n), rseg = mod(r - s - 1 + shift, n);
    int last = s == n - 2;
    size_t ses = s == 0 ? es : aes; /* what travels at this step */
    size_t pe = s == 0 ? pe0 : pe1;  /* elements per piece; every rank cuts a step alike */
    size_t pieces = maxseg ? (maxseg + pe - 1) / pe : 1;
    for (size_t p = 0; p < pieces; p++) {
      size_t slo = DT_MIN(p * pe, len[sseg]), shi = DT_MIN(slo + pe, len[sseg]);
      size_t rlo = DT_MIN(p * pe, len[rseg]), rhi = DT_MIN(rlo + pe, len[rseg]);
      const char *sp = s == 0 ? (const char *)in + (off[sseg] + slo) * es
                              : (const char *)acc + ((acc_per_seg ? off[sseg] : 0) + slo) * aes;
      dt_status st = c->ops->sendrecv(c->tp, right, sp, (shi - slo) * ses, left, tmp, (rhi - rlo) * ses, fp, deadline);
      if (st)
        return st;
      size_t m = rhi - rlo;
      if (m == 0)
        continue;
      const char *mine = (const char *)in + (off[rseg] + rlo) * es;
      dt_dtype tt = s == 0 ? t : acc_t; /* type of what arrived */
      if (last) {
        char *o = (char *)out + rlo * es;
        if (wide) {
          dt__reduce_mix(o, t, mine, t, tmp, tt, m, op, op == DT_AVG ? n : 1);
        } else {
          dt__reduce2(o, mine, tmp, m, t, op);
          dt__reduce_finish(o, m, t, op, n);
        }
      } else {
        char *a = (char *)acc + ((acc_per_seg ? off[rseg] : 0) + rlo) * aes;
        if (wide)
          dt__reduce_mix(a, acc_t, mine, t, tmp, tt, m, op, 1);
        else
          dt__reduce2(a, mine, tmp, m, t, op);
      }
    }
  }
  return DT_OK;
}

/* Reduce-scatter of a half type with sum/prod/avg for n > 2, rounding once without f32 partials
 * on the wire: at step s = 1..n-1 each rank sends the piece of its input that belongs to the
 * owner r+s and receives from r-s the piece of its own segment; after the n-1 arrivals of a
 * piece, the owner reduces its input and them in one pass (dt__reduce_many; order: own, r-1,
 * r-2, ..., the same for a segment on every run). Each rank sends (n-1)/n of its input in half
 * precision, the same bytes per input byte as the f32 ring, where the ring's f32 partials carried
 * 4 bytes per element on steps 1..n-2 (4 ranks: 4/3 of f32's bytes per input byte). Same
 * segment ownership as ring_rs with `shift`: rank r ends with segment (r + shift + 1) mod n in
 * out. Scratch: n-1 pieces. */
static dt_status direct_rs(dt_comm *c, const void *in, const size_t *off, const size_t *len, dt_dtype t, dt_op op,
                           int shift, void *out, const dt__fp *fp, int64_t deadline) {
  int n = c->size, r = c->rank, mine = mod(r + shift + 1, n);
  size_t es = dt_dtype_size(t), maxseg = 0;
  for (int i = 0; i < n; i++)
    maxseg = DT_MAX(maxseg, len[i]);
  size_t pe = DT_MIN(DT_MAX((size_t)1, dt__ring_piece_bytes() / es), DT_MAX(maxseg, (size_t)1));
  size_t pieces = maxseg ? (maxseg + pe - 1) / pe : 1;
  char *tmp = dt__coll_scratch(c, 1, (size_t)(n - 1) * pe * es);
  const void *small[16], **srcs = n <= 16 ? small : dt__alloc((size_t)n * sizeof *srcs);
  if (!tmp || !srcs) {
    if (srcs && srcs != small)
      dt__free(srcs);
    return DT_ERR_NOMEM;
  }
  dt_status st = DT_OK;
  for (size_t p = 0; p < pieces && st == DT_OK; p++) {
    size_t rlo = DT_MIN(p * pe, len[mine]), rhi = DT_MIN(rlo + pe, len[mine]), m = rhi - rlo;
    for (int s = 1; s < n && st == DT_OK; s++) {
      int dst = mod(r + s, n), src = mod(r - s, n), sseg = mod(dst + shift + 1, n);
      size_t slo = DT_MIN(p * pe, len[sseg]), shi = DT_MIN(slo + pe, len[sseg]);
      st = c->ops->sendrecv(c->tp, dst, (const char *)in + (off[sseg] + slo) * es, (shi - slo) * es, src,
                            tmp + (size_t)(s - 1) * pe * es, m * es, fp, deadline);
    }
    if (st != DT_OK || m == 0)
      continue;
    srcs[0] = (const char *)in + (off[mine] + rlo) * es;
    for (int s = 1; s < n; s++)
      srcs[s] = tmp + (size_t)(s - 1) * pe * es;
    dt__reduce_many((char *)out + rlo * es, srcs, n, m, t, op, op == DT_AVG ? n : 1);
  }
  if (srcs != small)
    dt__free(srcs);
  return st;
}

/* The allgather core: rbuf (type size es) holds segment (r + shift) complete; at step s a rank
 * sends segment (r + shift - s) and receives (r + shift - s - 1) in place. */
static dt_status ring_ag(dt_comm *c, void *rbuf, const size_t *off, const size_t *len, size_t es, int shift,
                         const dt__fp *fp, int64_t deadline) {
  int n = c->size, r = c->rank, right = mod(r + 1, n), left = mod(r - 1, n);
  for (int s = 0; s < n - 1; s++) {
    int sseg = mod(r + shift - s, n), rseg = mod(r + shift - s - 1, n);
    dt_status st = c->ops->sendrecv(c->tp, right, (char *)rbuf + off[sseg] * es, len[sseg] * es, left,
                                    (char *)rbuf + off[rseg] * es, len[rseg] * es, fp, deadline);
    if (st)
      return st;
  }
  return DT_OK;
}

/* Segment tables on the stack for small n, else heap. */
typedef struct segs {
  size_t *off, *len;
  size_t small[2][64];
} segs;

static dt_status segs_init(segs *g, int n) {
  if (n <= 64) {
    g->off = g->small[0];
    g->len = g->small[1];
    return DT_OK;
  }
  g->off = dt__alloc(2 * (size_t)n * sizeof(size_t));
  if (!g->off)
    return DT_ERR_NOMEM;
  g->len = g->off + n;
  return DT_OK;
}

static void segs_free(segs *g) {
  if (g->off != g->small[0])
    dt__free(g->off);
}

dt_status dt__allreduce_ring(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, dt_op op,
                             const dt__fp *fp, int64_t deadline) {
  int n = c->size;
  segs g;
  DT_CHECK(segs_init(&g, n));
  ring_segments(count, n, g.off, g.len);
  size_t es = dt_dtype_size(t);
  dt_status st;
  int owned = mod(c->rank + 1, n);
  if (dt__coll_wide(t, op) && n > 2) {
    st = direct_rs(c, sbuf, g.off, g.len, t, op, 0, (char *)rbuf + g.off[owned] * es, fp, deadline);
  } else if (dt__coll_wide(t, op)) {
    /* two ranks: the one step carries the half-precision input, nothing to accumulate */
    st = ring_rs(c, sbuf, g.off, g.len, t, op, 0, NULL, DT_F32, 0, (char *)rbuf + g.off[owned] * es, fp, deadline);
  } else {
    /* partials accumulate in rbuf itself: no extra memory */
    st = ring_rs(c, sbuf, g.off, g.len, t, op, 0, rbuf, t, 1, (char *)rbuf + g.off[owned] * es, fp, deadline);
  }
  if (st == DT_OK)
    st = ring_ag(c, rbuf, g.off, g.len, es, 1, fp, deadline);
  segs_free(&g);
  return st;
}

dt_status dt__reduce_scatter_ring(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, dt_op op,
                                  const dt__fp *fp, int64_t deadline) {
  int n = c->size;
  segs g;
  DT_CHECK(segs_init(&g, n));
  for (int i = 0; i < n; i++) {
    g.off[i] = (size_t)i * count;
    g.len[i] = count;
  }
  dt_dtype acc_t = dt__coll_wide(t, op) ? DT_F32 : t;
  dt_status st;
  void *acc = NULL;
  if (acc_t != t && n > 2) {
    /* shift -1: rank r ends owning block r */
    st = direct_rs(c, sbuf, g.off, g.len, t, op, -1, rbuf, fp, deadline);
    goto done;
  }
  if (n > 2 && !(acc = dt__coll_scratch(c, 0, count * dt_dtype_size(acc_t)))) {
    st = DT_ERR_NOMEM;
    goto done;
  }
  /* shift -1: rank r ends owning block r */
  st = ring_rs(c, sbuf, g.off, g.len, t, op, -1, acc, acc_t, 0, rbuf, fp, deadline);
done:
  segs_free(&g);
  return st;
}

dt_status dt__allgather_ring(dt_comm *c, void *rbuf, size_t count, dt_dtype t, const dt__fp *fp, int64_t deadline) {
  int n = c->size;
  segs g;
  DT_CHECK(segs_init(&g, n));
  for (int i = 0; i < n; i++) {
    g.off[i] = (size_t)i * count;
    g.len[i] = count;
  }
  dt_status st = ring_ag(c, rbuf, g.off, g.len, dt_dtype_size(t), 0, fp, deadline);
  segs_free(&g);
  return st;
}
