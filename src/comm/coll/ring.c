/* ring.c - ring reduce-scatter, ring allgather, and ring allreduce built from both.
 *
 * Allreduce = reduce-scatter then allgather, 2*(n-1) steps; each rank sends and receives
 * 2*(n-1)/n of the buffer, the bandwidth optimum. Any n >= 1 and any count: the buffer is cut
 * into n segments of count/n (+1 for the first count%n), possibly empty; empty segments still
 * exchange a zero-byte message so every rank stays in the same step.
 *
 * Pipelining: every step, the allgather's too, is cut into pieces of at most DTRAIN_RING_PIECE
 * bytes (default 256 KiB less 304 bytes, so that a piece and what it meets stay about the size
 * of L2), the same number per step on every rank (from the largest segment), so the calls pair
 * up. A reduce-scatter piece is received into a small temporary and reduced at once while it is
 * hot. The pieces of all steps run as one wavefront (ring_flow below): the allgather starts on
 * the first reduced pieces while the later ones are still being reduced, a piece is forwarded
 * while still in cache, and each sendrecv sends one piece ahead of the one it receives, so a
 * rank finds its next piece already queued instead of sleeping until its neighbour sends it.
 *
 * f16/bf16 with sum/prod/avg accumulate in f32 and round once. Two ranks: the one step sends
 * the half-precision input and the owner reduces it with its own. More ranks: direct_rs below
 * sends every piece of input straight to its segment's owner (pairwise steps), which reduces all
 * n contributions in one pass; so the half types move (n-1)/n of their input bytes, as f32
 * does, where ring partials in f32 would carry 4 bytes per element on steps 1..n-2. The
 * allgather moves half precision.
 * min/max of half types are exact in any order and run on half precision directly.
 *
 * Result bits are identical on every rank: each segment is reduced along one path by its owner
 * and then copied. It deliberately has no hierarchy or multi-ring: that comes with hierarchical
 * collectives. */
#include <string.h>

#include "comm/coll/coll.h"

/* Default piece: 256 KiB less 304 bytes, so that with the tcp transport's 40-byte frame header
 * it leaves loopback as four segments, none short (a piece ending in a short segment ran up to
 * twice as long, tcp.c's tcp_cut). A rank's working set per piece is the piece it receives, the
 * input it reduces it with, the result, and the pieces in the socket buffers, about the 1 MiB
 * L2. Measured on the Zen 5 guest (2 CPUs, 1 MiB L2), 2026-12-06, one build, the piece set by
 * DTRAIN_RING_PIECE and alternated run by run, 5 repetitions of `dtrain bench {allreduce,
 * allgather,reduce_scatter} -n {2,4} --transport tcp --sizes 1M:64M --iters 15`: against
 * 130,920 bytes, the default until then, 261,840 ran 1.03-1.46x faster at every size but the
 * 4-rank allreduce (rhd) at 32-64 MiB (0.85-0.93x; 4-rank allgather 1.03-1.46x, which had
 * trailed Open MPI at 1-4 MiB; 2-rank allreduce 1.12-1.44x with a quarter less CPU time);
 * 523,680 about the same, 1,047,360 a little less. A second round put that 4-rank allreduce at
 * 1.15-1.23x at 32-64 MiB and shm's 4-rank reduce_scatter (the ring above 32 KiB blocks) at
 * 0.92-1.27x; on the EPYC Zen 4 the same day, 3 repetitions of the tcp runs, 0.99-1.31x
 * (bench/results/ring-piece-2026-12-06-zen5.txt). The 128 KiB piece had been chosen on
 * 2026-11-22 on an older EPYC guest under load (by CPU time: 18.2 ms per 16 MiB allreduce
 * against 21.2-24.5 at 256 KiB), before the wavefront's and the tcp transport's later changes.
 * It is a constant, not asked of the transport: every rank must cut the same pieces, and the
 * segment size a socket reports differs between the ends of one connection and while its window
 * opens. Divisible by 8: whole elements of every dtype. */
#define RING_PIECE_DEFAULT 261840u

size_t dt__ring_piece_bytes(const dt_comm *c) {
  return c->env.ring_piece > 0 ? (size_t)c->env.ring_piece : RING_PIECE_DEFAULT; /* checked in config.c */
}

/* How many pieces a rank sends ahead of the one it receives (DTRAIN_RING_AHEAD overrides, up to
 * 64): one. Deeper lets a rank run further while its neighbour is descheduled, but spreads the
 * wavefront (a piece is forwarded `ahead` + 1 pieces after it arrived, colder) and keeps more in
 * the socket buffers; measured it lost. `dtrain bench {allgather,allreduce} -n 2 --transport tcp
 * --sizes 2M:32M --iters 10`, 4 alternated repetitions, 2026-11-22 18:53 UTC, load 6-7 (another
 * helper's sanitizer tests), medians at 4 / 16 / 32 MiB: allgather ahead 1: 823 / 8,419 / 18,254
 * us, ahead 4: 1,354 / 15,951 / 35,995, the step-by-step ring before this file's wavefront: 1,619
 * / 10,023 / 22,863; allreduce 2,545 / 14,766 / 30,469, 3,099 / 20,534 / 38,731, 5,015 / 17,522 /
 * 32,784. */
#define RING_AHEAD_DEFAULT 1

size_t dt__coll_send_ahead(dt_comm *c, size_t pieces, size_t piece_bytes) {
  size_t want = c->env.ring_ahead >= 0 ? (size_t)c->env.ring_ahead : RING_AHEAD_DEFAULT; /* config.c checks */
  size_t q = c->ops->queue_msgs ? c->ops->queue_msgs(c->tp, piece_bytes) : 0;
  size_t ahead = DT_MIN(want, pieces ? pieces - 1 : 0);
  /* the pieces ahead and the one the receiver has yet to take must all fit */
  return q == 0 ? 0 : DT_MIN(ahead, q - 1);
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

/* Reduce-scatter of a half type with sum/prod/avg for n > 2, rounding once without f32 partials
 * on the wire: at step s = 1..n-1 each rank sends the piece of its input that belongs to the
 * owner r+s and receives from r-s the piece of its own segment; after the n-1 arrivals of a
 * piece, the owner reduces its input and them in one pass (dt__reduce_many; order: own, r-1,
 * r-2, ..., the same for a segment on every run). Each rank sends (n-1)/n of its input in half
 * precision, the same bytes per input byte as the f32 ring, where the ring's f32 partials carried
 * 4 bytes per element on steps 1..n-2 (4 ranks: 4/3 of f32's bytes per input byte). Same
 * segment ownership as the ring's reduce-scatter with `shift`: rank r ends with segment
 * (r + shift + 1) mod n in out. Scratch: n-1 pieces. */
static dt_status direct_rs(dt_comm *c, const void *in, const size_t *off, const size_t *len, dt_dtype t, dt_op op,
                           int shift, void *out, const dt__fp *fp, int64_t deadline) {
  int n = c->size, r = c->rank, mine = mod(r + shift + 1, n);
  size_t es = dt_dtype_size(t), maxseg = 0;
  for (int i = 0; i < n; i++)
    maxseg = DT_MAX(maxseg, len[i]);
  size_t pe = DT_MIN(DT_MAX((size_t)1, dt__ring_piece_bytes(c) / es), DT_MAX(maxseg, (size_t)1));
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

/* ---- the pipelined ring ----
 *
 * A ring collective is T steps (reduce-scatter steps, then allgather steps) of P pieces each;
 * at every (step s, piece p) a rank sends one piece to its right neighbour and receives one from
 * its left. Piece p of step s needs only piece p of step s-1 (the partial it forwards, or the
 * reduced segment the allgather starts from), so the calls run in wavefront order: by p + D*s,
 * then by step. Steps overlap: the allgather of piece 0 starts while later pieces are still
 * being reduced, and a piece is forwarded about D pieces after it arrived, while it is still
 * in this core's cache. Each sendrecv sends the item `ahead` (dt__coll_send_ahead, default 1)
 * items after the one it receives, so the neighbour finds its next piece already queued and
 * neither side sleeps waiting for the other to start sending. The wavefront's skew D = ahead + 1
 * keeps an item's input more than `ahead` calls back, so nothing is sent before it arrived
 * (checked exhaustively for P <= 11 pieces, T <= 8 steps, ahead <= 7). Why this cannot deadlock:
 * the rank furthest behind, at call i, waits only for item i from its left neighbour, which sent
 * it `ahead` calls ago, and sends item i + ahead to its right neighbour, which is at call i or
 * later and so takes item i, leaving at most `ahead` + 1 items to queue; dt__coll_send_ahead
 * bounds `ahead` by what the transport can queue (ops->queue_msgs: socket buffers, shm ring
 * slots), else 0: the classic step-by-step exchange. */

typedef struct ring_flow {
  int rs, T;             /* reduce-scatter steps (the first rs of the T steps) */
  size_t P, pe, es;      /* pieces per step, elements per piece, element size */
  const size_t *off, *len;
  const char *in;        /* reduce-scatter input: sent at step 0, reduced with at every step */
  char *acc;             /* partials of steps 0..rs-2: at off[seg] when acc_per_seg, else at 0 */
  int acc_per_seg;
  char *out;             /* the owned segment's result (last reduce-scatter step) */
  char *ag;              /* allgather buffer: segment i at off[i] */
  const char *own;       /* allgather: the segment the first step sends, when not yet in ag */
  int shift_rs, shift_ag;
  dt_dtype t;
  dt_op op;
  int wide;              /* half type reduced in f32 (n = 2 only: the one step is the last) */
  char *tmp;             /* one received reduce-scatter piece */
  size_t D;              /* wavefront skew: item (s, p) has key p + D*s */
} ring_flow;

/* Wavefront position: item (s, k - D*s). */
typedef struct ring_wave {
  size_t k;
  int s, valid;
} ring_wave;

/* Moves w to the first item at key >= k (lowest step first). */
static void wave_seek(const ring_flow *f, ring_wave *w, size_t k) {
  size_t kmax = (f->P - 1) + f->D * (size_t)(f->T - 1);
  for (; k <= kmax; k++) {
    size_t slo = k > f->P - 1 ? (k - (f->P - 1) + f->D - 1) / f->D : 0;
    if (slo <= (size_t)(f->T - 1) && f->D * slo <= k) {
      w->k = k;
      w->s = (int)slo;
      w->valid = 1;
      return;
    }
  }
  w->valid = 0;
}

static void wave_next(const ring_flow *f, ring_wave *w) {
  int s = w->s + 1;
  if (s <= f->T - 1 && f->D * (size_t)s <= w->k) {
    w->s = s;
    return;
  }
  wave_seek(f, w, w->k + 1);
}

/* Element range [lo, hi) of piece p in segment seg. */
static void flow_piece(const ring_flow *f, int seg, size_t p, size_t *lo, size_t *hi) {
  *lo = DT_MIN(p * f->pe, f->len[seg]);
  *hi = DT_MIN(*lo + f->pe, f->len[seg]);
}

static void flow_send(const ring_flow *f, int r, int n, const ring_wave *w, const char **buf, size_t *bytes) {
  size_t p = w->k - f->D * (size_t)w->s, lo, hi;
  if (w->s < f->rs) {
    int seg = mod(r - w->s + f->shift_rs, n);
    flow_piece(f, seg, p, &lo, &hi);
    *buf = w->s == 0 ? f->in + (f->off[seg] + lo) * f->es
                     : f->acc + ((f->acc_per_seg ? f->off[seg] : 0) + lo) * f->es;
  } else {
    int seg = mod(r + f->shift_ag - (w->s - f->rs), n);
    flow_piece(f, seg, p, &lo, &hi);
    *buf = (f->own && w->s == f->rs ? f->own + lo * f->es : f->ag + (f->off[seg] + lo) * f->es);
  }
  *bytes = (hi - lo) * f->es;
}

static void flow_recv(const ring_flow *f, int r, int n, const ring_wave *w, char **buf, size_t *bytes) {
  size_t p = w->k - f->D * (size_t)w->s, lo, hi;
  if (w->s < f->rs) {
    flow_piece(f, mod(r - w->s - 1 + f->shift_rs, n), p, &lo, &hi);
    *buf = f->tmp;
  } else {
    int seg = mod(r + f->shift_ag - (w->s - f->rs) - 1, n);
    flow_piece(f, seg, p, &lo, &hi);
    *buf = f->ag + (f->off[seg] + lo) * f->es;
  }
  *bytes = (hi - lo) * f->es;
}

/* After a piece of `own` went out (buf, bytes from flow_send): its copy into the allgather
 * buffer, while the send left it in cache. */
static void flow_own(const ring_flow *f, int r, int n, const ring_wave *w, const char *buf, size_t bytes) {
  if (!f->own || w->s != f->rs || buf == NULL || bytes == 0)
    return;
  int seg = mod(r + f->shift_ag, n);
  char *dst = f->ag + f->off[seg] * f->es + (size_t)(buf - f->own);
  if (dst != buf)
    memmove(dst, buf, bytes);
}

/* After a reduce-scatter piece arrived in tmp: reduce it with this rank's input into the
 * partials, or on the last step into the result (finishing avg there). */
static void flow_reduce(const ring_flow *f, int r, int n, const ring_wave *w) {
  size_t p = w->k - f->D * (size_t)w->s, lo, hi;
  int seg = mod(r - w->s - 1 + f->shift_rs, n);
  flow_piece(f, seg, p, &lo, &hi);
  size_t m = hi - lo;
  if (m == 0)
    return;
  const char *mine = f->in + (f->off[seg] + lo) * f->es;
  if (w->s == f->rs - 1) {
    char *o = f->out + lo * f->es;
    if (f->wide) {
      dt__reduce_mix(o, f->t, mine, f->t, f->tmp, f->t, m, f->op, f->op == DT_AVG ? n : 1);
    } else {
      dt__reduce2(o, mine, f->tmp, m, f->t, f->op);
      dt__reduce_finish(o, m, f->t, f->op, n);
    }
  } else {
    dt__reduce2(f->acc + ((f->acc_per_seg ? f->off[seg] : 0) + lo) * f->es, mine, f->tmp, m, f->t, f->op);
  }
}

/* Runs f: T steps of P pieces, in wavefront order, sending as far ahead as the header above
 * says. */
static dt_status flow_run(dt_comm *c, ring_flow *f, const dt__fp *fp, int64_t deadline) {
  int n = c->size, r = c->rank, right = mod(r + 1, n), left = mod(r - 1, n);
  size_t piece = f->pe * f->es;
  if (f->rs > 0 && !(f->tmp = dt__coll_scratch(c, 1, piece)))
    return DT_ERR_NOMEM;
  size_t ahead = dt__coll_send_ahead(c, f->P, piece);
  f->D = ahead + 1; /* keeps what a piece forwards more than `ahead` calls back (see above) */
  ring_wave sw, rw;
  wave_seek(f, &sw, 0);
  wave_seek(f, &rw, 0);
  const char *sb;
  char *rb;
  size_t sn, rn;
  for (size_t i = 0; i < ahead && sw.valid; i++) {
    flow_send(f, r, n, &sw, &sb, &sn);
    DT_CHECK(c->ops->sendrecv(c->tp, right, sb, sn, -1, NULL, 0, fp, deadline));
    flow_own(f, r, n, &sw, sb, sn);
    wave_next(f, &sw);
  }
  while (rw.valid) {
    sb = NULL;
    sn = 0;
    if (sw.valid)
      flow_send(f, r, n, &sw, &sb, &sn);
    flow_recv(f, r, n, &rw, &rb, &rn);
    DT_CHECK(c->ops->sendrecv(c->tp, sw.valid ? right : -1, sb, sn, left, rb, rn, fp, deadline));
    if (sw.valid)
      flow_own(f, r, n, &sw, sb, sn);
    if (rw.s < f->rs)
      flow_reduce(f, r, n, &rw);
    wave_next(f, &rw);
    if (sw.valid)
      wave_next(f, &sw);
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

/* A flow over the segments g with pieces of DTRAIN_RING_PIECE bytes of type t (every step
 * moves type t: the half types' f32 partials never travel, see direct_rs). */
static void flow_init(const dt_comm *c, ring_flow *f, const segs *g, int n, dt_dtype t, dt_op op) {
  size_t es = dt_dtype_size(t), maxseg = 0;
  for (int i = 0; i < n; i++)
    maxseg = DT_MAX(maxseg, g->len[i]);
  *f = (ring_flow){.off = g->off, .len = g->len, .es = es, .t = t, .op = op};
  f->pe = DT_MIN(DT_MAX((size_t)1, dt__ring_piece_bytes(c) / es), DT_MAX(maxseg, (size_t)1));
  f->P = maxseg ? (maxseg + f->pe - 1) / f->pe : 1;
  /* A step of 3-4 pieces goes in two: there the calls cost more than the finer overlap gains.
   * `dtrain bench allreduce -n 2 --transport tcp --sizes 1M:2M --iters 100 --warmup 10`, 5
   * alternated repetitions at load 2.8-4.3, medians at 1 MiB (segments of 512 KiB): 4 pieces of
   * 128 KiB 272 us, 2 of 256 KiB 213, 1 of 512 KiB 501, the step-by-step ring before ring_flow
   * (2 reduce-scatter pieces, one allgather message) 200; at 2 MiB 4 pieces: 621 against 1,157
   * with 2 of 512 KiB. */
  if (f->P > 2 && f->P <= 4) {
    f->pe = (maxseg + 1) / 2;
    f->P = 2;
  }
}

dt_status dt__allreduce_ring(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, dt_op op,
                             const dt__fp *fp, int64_t deadline) {
  int n = c->size;
  segs g;
  DT_CHECK(segs_init(&g, n));
  ring_segments(count, n, g.off, g.len);
  size_t es = dt_dtype_size(t);
  int owned = mod(c->rank + 1, n);
  ring_flow f;
  flow_init(c, &f, &g, n, t, op);
  f.ag = rbuf;
  f.shift_ag = 1; /* rank r's allgather starts from segment r + 1, the one it reduced */
  f.T = n - 1;
  dt_status st = DT_OK;
  if (dt__coll_wide(t, op) && n > 2) {
    st = direct_rs(c, sbuf, g.off, g.len, t, op, 0, (char *)rbuf + g.off[owned] * es, fp, deadline);
  } else {
    /* reduce-scatter and allgather as one flow; partials accumulate in rbuf itself. Two ranks
     * of a half type: the one step carries the half-precision input, reduced in f32 */
    f.rs = n - 1;
    f.T = 2 * (n - 1);
    f.in = sbuf;
    f.acc = rbuf;
    f.acc_per_seg = 1;
    f.out = (char *)rbuf + g.off[owned] * es;
    f.wide = dt__coll_wide(t, op);
  }
  if (st == DT_OK)
    st = flow_run(c, &f, fp, deadline);
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
  dt_status st;
  if (dt__coll_wide(t, op) && n > 2) {
    /* shift -1: rank r ends owning block r */
    st = direct_rs(c, sbuf, g.off, g.len, t, op, -1, rbuf, fp, deadline);
    goto done;
  }
  ring_flow f;
  flow_init(c, &f, &g, n, t, op);
  f.rs = f.T = n - 1;
  f.shift_rs = -1; /* rank r ends owning block r */
  f.in = sbuf;
  f.out = rbuf;
  f.wide = dt__coll_wide(t, op); /* two ranks only, see above */
  /* partials of one block at a time (the pieces of a step overwrite the previous step's only
   * after forwarding them: a piece is sent before the one it is reduced into is received) */
  if (n > 2 && !(f.acc = dt__coll_scratch(c, 0, count * dt_dtype_size(t)))) {
    st = DT_ERR_NOMEM;
    goto done;
  }
  st = flow_run(c, &f, fp, deadline);
done:
  segs_free(&g);
  return st;
}

dt_status dt__allgather_ring(dt_comm *c, const void *own, void *rbuf, size_t count, dt_dtype t, const dt__fp *fp,
                             int64_t deadline) {
  int n = c->size;
  segs g;
  DT_CHECK(segs_init(&g, n));
  for (int i = 0; i < n; i++) {
    g.off[i] = (size_t)i * count;
    g.len[i] = count;
  }
  ring_flow f;
  flow_init(c, &f, &g, n, t, DT_SUM);
  f.T = n - 1;
  f.ag = rbuf;
  f.own = own;
  dt_status st = flow_run(c, &f, fp, deadline);
  segs_free(&g);
  return st;
}
