/* comm/coll/coll.h - the collective algorithms (one file per family, as gloo does) and what they
 * share: scratch buffers, f32 accumulation helpers for half types, the call description that the
 * public entry points (collectives.c) and the progress thread (progress.c) execute.
 *
 * Every algorithm here talks only through c->ops->sendrecv with the call's fingerprint, blocks
 * until done or until `deadline`, and returns the transport's status with its detail untouched
 * (collectives.c adds the "rank R: allreduce #S with ..." context and raises the job abort).
 * Buffers: `sbuf` is never NULL here (collectives.c resolves DT_IN_PLACE to rbuf). */
#ifndef DT_COMM_COLL_H
#define DT_COMM_COLL_H

#include "comm/comm.h"

/* ---- kernels beyond comm.h's (reduce.c) ---- */
float dt__f16_to_f32(uint16_t h);
uint16_t dt__f32_to_f16(float f);
float dt__bf16_to_f32(uint16_t h);
uint16_t dt__f32_to_bf16(float f);
/* dst[i] = (float)src[i] for src of type t (f16, bf16 or f32). */
void dt__to_f32(float *dst, const void *src, size_t n, dt_dtype t);
/* dst[i] = round-to-nearest-even(src[i]) into type t (f16, bf16 or f32). */
void dt__from_f32(void *dst, const float *src, size_t n, dt_dtype t);
/* out = a op b computed in f32 (then divided by div when div > 1), each of out/a/b of type f32,
 * f16 or bf16; rounding happens only when storing into a half-typed out. out may alias a or b
 * exactly. avg sums (pass div to finish it). */
void dt__reduce_mix(void *out, dt_dtype ot, const void *a, dt_dtype at, const void *b, dt_dtype bt, size_t n,
                    dt_op op, int div);
/* out = (((src[0] op src[1]) op src[2]) ... op src[k-1]) [/ div when div > 1], all k sources and
 * out of type t, in that order for every element (so every caller gets the same bits). Half types
 * with sum/prod/avg accumulate in f32 and round once: the f32 partials live in a block on the
 * stack, never in memory the size of the operands, so each source is read once and out written
 * once (the pairwise form with an f32 accumulator moved 4 bytes of partials per element per
 * source). div: the divisor of avg (1 for the other ops). out may alias src[0] exactly, no other. */
void dt__reduce_many(void *out, const void *const *src, int k, size_t n, dt_dtype t, dt_op op, int div);
/* Tells the reductions this thread runs next whether their operands stay in the caches (true) or
 * may stream from memory (false, the default); returns the previous setting, for the caller to
 * restore. Streaming operands of 64 KiB or more are prefetched ahead; cached ones are not, since
 * the prefetches then only take load slots (reduce.c, RED_PF_MIN). */
bool dt__reduce_cached(bool cached);
/* Tests: force the portable kernels and dt__copy's 16-byte moves (1), AVX2 without the AVX-512
 * half kernels (2), AVX-512 without its BF16 rounding and FP16 arithmetic (3), dt__copy's
 * vector moves (AMD CPUs' copy) on any CPU (4), or back to run-time selection (0). */
void dt__reduce_force_scalar(int on);
/* "avx2+avx512+bf16+fp16", "avx2+avx512+bf16", "avx2+avx512", "avx2" or "scalar": what
 * dt__reduce uses now. */
const char *dt__reduce_isa(void);

/* True when a reduction of type t with op needs an f32 accumulator to round only once. */
static inline int dt__coll_wide(dt_dtype t, dt_op op) {
  return (t == DT_F16 || t == DT_BF16) && (op == DT_SUM || op == DT_PROD || op == DT_AVG);
}

/* ---- scratch (progress.c): per-communicator buffers reused across calls so large
 * collectives do not pay fresh page faults every time. Used only by whoever holds c->lock.
 * Returns NULL with DT_ERR_NOMEM detail on failure. Slots: 0 and 1. */
void *dt__coll_scratch(dt_comm *c, int slot, size_t bytes);

/* ---- algorithms ---- */
typedef enum dt__algo {
  DT_ALGO_AUTO = 0,
  DT_ALGO_RING,  /* allreduce, allgather, reduce_scatter */
  DT_ALGO_RD,    /* allreduce: recursive doubling */
  DT_ALGO_SHM,   /* the transport's own fast path (ops->allreduce, ...) */
  DT_ALGO_TREE,  /* broadcast, reduce: binomial tree */
  DT_ALGO_CHAIN, /* broadcast: pipelined chain */
  DT_ALGO_DISSEM, /* barrier: dissemination */
  DT_ALGO_PAIRWISE, /* alltoall */
  DT_ALGO_LINEAR, /* gather, scatter */
  DT_ALGO_FLAT,   /* allreduce, broadcast, allgather, reduce_scatter: the transport's one-round path (ops->flat) */
  DT_ALGO_RHD,    /* allreduce: recursive halving reduce-scatter + recursive doubling allgather;
                     reduce_scatter: the halving alone */
  DT_ALGO_BRUCK,  /* allgather: Bruck's log2(n) rounds */
  DT_ALGO_COUNT
} dt__algo;
const char *dt__algo_name(dt__algo a);

/* One collective call, as queued or run inline. */
typedef struct dt__coll_call {
  dt__coll kind;
  const void *sbuf; /* as the caller passed it (DT_IN_PLACE allowed) */
  void *rbuf;
  size_t count;
  dt_dtype dtype;
  dt_op op;
  int root;
  dt__fp fp;
} dt__coll_call;

/* Runs one call to completion (collectives.c): chooses the algorithm, runs it, and on failure
 * prefixes the detail with "rank R: <call>" and raises the job-wide abort. Caller holds c->lock. */
dt_status dt__coll_exec(dt_comm *c, const dt__coll_call *call);

/* Validates a public call, names it with the next sequence number (c->seq++) and fills *call.
 * On bad arguments: DT_ERR_INVALID naming the call, and the job abort is raised so peers stop.
 * Application thread only. */
dt_status dt__coll_prepare(dt_comm *c, dt__coll kind, const void *sbuf, void *rbuf, size_t count, dt_dtype t,
                           dt_op op, int root, dt__coll_call *call);

/* Checks DTRAIN_ALGO as dt__coll_algo_load would read it (DT_ERR_INVALID naming the bad item). */
dt_status dt__coll_algo_validate(void);
/* Reads DTRAIN_ALGO into c->algo / c->algo_bad: once per communicator, when it is made (a getenv
 * per call cost ~17% of a 4-byte shared-memory allreduce); tests that switch algorithms on one
 * communicator call it again after setenv. */
void dt__coll_algo_load(dt_comm *c);

/* progress.c: runs a prepared call in call order: inline on this thread when nothing is queued
 * (holding c->lock), else queued behind the pending nonblocking calls and waited for. */
dt_status dt__progress_run(dt_comm *c, const dt__coll_call *call);
/* Queues a prepared call on the progress thread (started on first use); *req on success. */
dt_status dt__progress_submit(dt_comm *c, const dt__coll_call *call, dt_request **req);
/* Waits until every queued nonblocking call has finished, so that a point-to-point message
 * leaves after them, in call order. Application thread only (it alone adds work). */
void dt__progress_drain(dt_comm *c);
/* Stops the progress thread (queued calls that have not started complete with DT_ERR_STATE;
 * a running one is waited for) and frees scratch. For dt_comm_destroy. Accepts NULL. */
void dt__progress_destroy(struct dt__progress *p);

/* ring.c. seg_off/seg_len: n segments in elements. */
dt_status dt__allreduce_ring(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, dt_op op,
                             const dt__fp *fp, int64_t deadline);
dt_status dt__reduce_scatter_ring(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, dt_op op,
                                  const dt__fp *fp, int64_t deadline);
/* own: this rank's block, copied to r * count of rbuf piece by piece as it is sent (while the
 * send left it in cache), or NULL when rbuf already holds it there. */
dt_status dt__allgather_ring(dt_comm *c, const void *own, void *rbuf, size_t count, dt_dtype t, const dt__fp *fp,
                             int64_t deadline);

/* Bytes of what travels per pipelined piece: DTRAIN_RING_PIECE, default 261,840 bytes (ring.c). */
size_t dt__ring_piece_bytes(const dt_comm *c);

/* How many pieces ahead of the one it receives an exchange cut into `pieces` pieces of up to
 * piece_bytes may send: at most DTRAIN_RING_AHEAD (ring.c), at most pieces - 1, and so that the
 * pieces ahead and the one being received fit in what the transport queues for a peer that is
 * not receiving yet (ops->queue_msgs). 0: step by step. ring.c says why it is safe. */
size_t dt__coll_send_ahead(dt_comm *c, size_t pieces, size_t piece_bytes);

/* rhd.c: Rabenseifner's allreduce, any n (a fold for non-powers of two); half types with
 * sum/prod/avg run the ring. */
dt_status dt__allreduce_rhd(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, dt_op op,
                            const dt__fp *fp, int64_t deadline);
/* rhd.c: reduce_scatter by recursive halving, n a power of two > 2 (else the ring). */
dt_status dt__reduce_scatter_rhd(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, dt_op op,
                                 const dt__fp *fp, int64_t deadline);

/* rd.c */
dt_status dt__allreduce_rd(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, dt_op op,
                           const dt__fp *fp, int64_t deadline);

/* tree.c. rbuf is only used on the root. */
dt_status dt__reduce_tree(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, dt_op op, int root,
                          const dt__fp *fp, int64_t deadline);
dt_status dt__broadcast_tree(dt_comm *c, void *buf, size_t bytes, int root, const dt__fp *fp, int64_t deadline);
dt_status dt__broadcast_chain(dt_comm *c, void *buf, size_t bytes, int root, const dt__fp *fp, int64_t deadline);

/* simple.c */
dt_status dt__gather_linear(dt_comm *c, const void *sbuf, void *rbuf, size_t bytes, int root, const dt__fp *fp,
                            int64_t deadline);
dt_status dt__scatter_linear(dt_comm *c, const void *sbuf, void *rbuf, size_t bytes, int root, const dt__fp *fp,
                             int64_t deadline);
dt_status dt__alltoall_pairwise(dt_comm *c, const void *sbuf, void *rbuf, size_t bytes, const dt__fp *fp,
                                int64_t deadline);
dt_status dt__barrier_dissem(dt_comm *c, const dt__fp *fp, int64_t deadline);
/* own: this rank's block, or NULL when it is already in its place in rbuf (bytes per block) */
dt_status dt__allgather_bruck(dt_comm *c, const void *own, void *rbuf, size_t bytes, const dt__fp *fp,
                              int64_t deadline);
/* A dissemination barrier of zero-byte messages carrying fp (ceil(log2 n) rounds): a rank passes
 * only when every rank's fingerprint reached it through compared messages, so if any two ranks
 * disagree on the call, none returns DT_OK (one gets DT_ERR_MISMATCH, the abort stops the rest). Gather,
 * scatter and the chain broadcast start with it because their data flow alone can leave a
 * mismatch unseen (two ranks that both believe they are the root only send); the trees move
 * their data on its pattern instead (tree.c). With two ranks the linear algorithms do without
 * it: their one transfer is an exchange with a zero-byte message back, which checks in the same
 * round trip. */
dt_status dt__coll_check(dt_comm *c, const dt__fp *fp, int64_t deadline);

#endif
