/* test_coll_random.c - random sequences of collectives, as an application mixes them: every
 * collective, dtype and op; counts drawn around the transports' thresholds (flat slots, single
 * copies, staging chunks: 4 KiB-1 MiB of bytes, a few elements either side) or log-uniform from
 * 0; buffers at random offsets from 64-byte alignment; in place (DT_IN_PLACE, or sendbuf ==
 * recvbuf) where the API allows it; nonblocking batches of up to three calls in flight between
 * blocking ones; a third of them on a split of the world (even and odd ranks), mixed with the
 * world's; sends and receives between rank pairs; and on shm, allreduces in the shared window
 * between them; now and then one rank late into a call. So a call meets
 * whatever state the calls before it, of other paths and sizes, left behind (sequence counters,
 * staging parity, flat rounds, huge-page bookkeeping), which the per-call sweep
 * (test_coll_sweep.c) does not vary. Every result is checked against the serial reference of
 * sweep.h (exact for data movement and integers, bounded for floats; two-rank f16/bf16
 * reductions bit for bit).
 *
 * The sequence is a pure function of the seed, the same on every rank. A failure prints the seed,
 * the call's index and everything about it, and the first wrong elements. Bytes of recvbuf
 * around the output must stay as they were.
 *
 * --mismatch: one rank (chosen by the seed) makes one call of the sequence differently (a count,
 * dtype, op, root, window offset or another collective); every rank must fail in that call,
 * with an error naming the calls, the rank that found it first exiting at once (as a program
 * would), and none may return from it, hang, or fail earlier.
 *
 * --kill: one rank (chosen by the seed) is killed (SIGKILL) before one call (or before the
 * nonblocking batch that holds it, or right after starting that batch); every other rank must
 * fail in that call (the batch's first; or, killed with calls in flight, in one of them or the
 * next), with an error naming the killed rank, and none may hang. A rank may also fail in an
 * earlier call that the killed rank had already left (a rank may leave a collective before the
 * others: seen, rank 1 still in a scatter from root 2 when rank 3, done with it, was killed),
 * since the job's failure ends every call in progress; never may it return DT_OK from the call
 * the killed rank did not make.
 *
 * Usage: test_coll_random <shm|tcp> <ranks,...> <seeds,...> [calls [--mismatch|--kill]]
 *        mpirun -np N test_coll_random mpi - <seeds,...> [calls]   (the communicator from mpirun)
 * Each seed also picks a DTRAIN_ALGO for its run (shm/tcp; a communicator reads it when made),
 * unless the environment sets one. */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mp.h"
#include "coll/sweep.h"

enum { CALLS_DEFAULT = 120, SLOTS = 3, MAX_COUNT = 1 << 18 };

typedef enum { K_ALLREDUCE, K_REDUCE, K_BROADCAST, K_ALLGATHER, K_REDUCE_SCATTER, K_GATHER, K_SCATTER, K_ALLTOALL,
               K_BARRIER, K_WINDOW, K_P2P, K_COUNT } kind;
static const char *kind_name[K_COUNT] = {"allreduce", "reduce", "broadcast", "allgather", "reduce_scatter",
                                         "gather", "scatter", "alltoall", "barrier", "window allreduce",
                                         "send and recv"};
/* per seed, the algorithms a run forces (DTRAIN_ALGO); "" leaves the automatic choice */
static const char *algos[] = {"", "ring", "rhd,broadcast=chain,allgather=bruck,reduce_scatter=rhd",
                              "rd,broadcast=tree,allgather=ring,reduce_scatter=ring", ""};

typedef struct call {
  bool sub; /* on the split communicator (even and odd ranks), not the world */
  kind k;
  dt_dtype t;
  dt_op op;
  int root, inplace; /* inplace: 0 separate buffers, 1 DT_IN_PLACE, 2 sendbuf == recvbuf */
  size_t count, soff, roff;
  uint64_t salt;
  char *sb, *rb;
  dt_request *req;
} call;

typedef enum { F_NONE, F_MISMATCH, F_KILL } fault;
typedef struct job {
  uint64_t seed;
  int calls;
  fault f; /* F_MISMATCH: one rank changes one call; F_KILL: one rank is killed before one */
} job;

/* The faulty call of a run and the rank that makes it (the same on every rank). A rank is not
 * killed before call 0: the others may still be making the window then (the store's host may
 * leave it first), and fail there, naming the killed rank, but outside the sequence. */
static int fault_call(const job *jb) {
  uint64_t h = sw_hash(jb->seed ^ 0x5a5a);
  if (jb->f == F_KILL && jb->calls > 1)
    return 1 + (int)(h % (uint64_t)(jb->calls - 1));
  return jb->f ? (int)(h % (uint64_t)jb->calls) : -1;
}
static int fault_rank(const job *jb, int n) { return (int)(sw_hash(sw_hash(jb->seed ^ 0x5a5a)) % (uint64_t)n); }

static uint64_t next(uint64_t *s) { return *s = sw_hash(*s); }

/* The call's elements per rank's input and output. */
static size_t in_elems(const call *c, int n) {
  return c->k == K_REDUCE_SCATTER || c->k == K_SCATTER || c->k == K_ALLTOALL ? c->count * (size_t)n : c->count;
}
static size_t out_elems(const call *c, int n) {
  return c->k == K_ALLGATHER || c->k == K_GATHER || c->k == K_ALLTOALL || c->k == K_REDUCE_SCATTER
             ? c->count * (size_t)(c->k == K_REDUCE_SCATTER ? 1 : n)
             : c->count;
}

static void describe(const call *c, int i, uint64_t seed, char *b, size_t cap) {
  snprintf(b, cap, "seed %llu call %d: %s of %zu x %s %s, root %d, %s, offsets %zu/%zu", (unsigned long long)seed, i,
           kind_name[c->k], c->count, dt_dtype_name(c->t), dt_op_name(c->op), c->root,
           c->inplace == 1 ? "DT_IN_PLACE" : c->inplace == 2 ? "sendbuf == recvbuf" : "out of place", c->soff,
           c->roff);
}

/* Draws the next call of the sequence (the same on every rank of the communicator it goes to);
 * window: a window allreduce may be drawn; p2p: a send and recv between rank pairs may be. */
static void draw(call *c, uint64_t *s, int n, bool window, bool p2p) {
  static const size_t marks[] = {4096, 16384, 32768, 65536, 131072, 262144, 524288, 1048576};
  c->k = (kind)(next(s) % K_COUNT);
  if ((c->k == K_WINDOW && !window) || (c->k == K_P2P && !p2p))
    c->k = K_ALLREDUCE;
  c->t = (dt_dtype)(next(s) % DT_DTYPE_COUNT);
  c->op = (dt_op)(next(s) % DT_OP_COUNT);
  c->root = (int)(next(s) % (uint64_t)n);
  size_t es = dt_dtype_size(c->t);
  uint64_t u = next(s);
  size_t count;
  if (u % 2) { /* around a threshold, in bytes of the call's per-rank buffer */
    long d = (long)((u >> 8) % 9) - 4;
    count = marks[(u >> 16) % 8] / es;
    count = d < 0 && (size_t)-d > count ? 0 : (size_t)((long)count + d);
  } else { /* log-uniform */
    count = (size_t)(next(s) % ((1ull << ((u >> 8) % 19)) + 1));
  }
  if (c->k == K_ALLGATHER || c->k == K_REDUCE_SCATTER || c->k == K_GATHER || c->k == K_SCATTER ||
      c->k == K_ALLTOALL)
    count /= (size_t)n; /* blocks: the threshold falls on the whole buffer */
  c->count = count < MAX_COUNT ? count : MAX_COUNT;
  c->soff = (size_t)(next(s) % 64) / es * es;
  c->roff = (size_t)(next(s) % 64) / es * es;
  uint64_t ip = next(s) % 4;
  c->inplace = 0;
  if (c->k == K_ALLREDUCE || c->k == K_REDUCE_SCATTER || c->k == K_ALLGATHER)
    c->inplace = ip == 1 ? 1 : ip == 2 && c->k == K_ALLREDUCE ? 2 : 0;
  if (c->k == K_WINDOW)
    c->inplace = 1, c->roff = (size_t)(next(s) % 4) * 64; /* the same offset on every rank */
}

/* Where call c's output (recvbuf) starts: in the window, or in its own buffer. */
static char *recv_of(const call *c, char *win) { return c->k == K_WINDOW ? win + c->roff : c->rb + c->roff; }

/* Fills this rank's input of call c (salt: the call's) and poisons the output. */
static void fill(call *c, int rank, int n, char *win) {
  size_t es = dt_dtype_size(c->t);
  char *rb = recv_of(c, win);
  if (c->k != K_WINDOW)
    memset(c->rb, 0xa7, c->roff + (out_elems(c, n) + in_elems(c, n)) * es + 64);
  char *in = c->sb + c->soff;
  if (c->inplace || c->k == K_BROADCAST)
    in = c->k == K_ALLGATHER ? rb + (size_t)rank * c->count * es : rb;
  if (c->k == K_BROADCAST && rank != c->root)
    return; /* its buffer stays poisoned: the root's must arrive whole */
  sw_fill(in, in_elems(c, n), 0, c->salt, rank, c->t, c->op);
}

/* Rank pairs (0, 1), (2, 3), ...: the even one sends, then receives; an odd world size's last
 * rank sits out. */
static int p2p_partner(int rank, int n) { return (rank ^ 1) < n ? rank ^ 1 : -1; }

static dt_status start(dt_comm *cm, call *c, char *win, bool nonblocking) {
  char *rb = recv_of(c, win);
  if (c->k == K_P2P) { /* blocking only: drawn outside batches */
    int me = dt_comm_rank(cm), peer = p2p_partner(me, dt_comm_size(cm));
    dt_status st = DT_OK;
    if (peer >= 0 && me % 2 == 0) {
      st = dt_comm_send(cm, c->sb + c->soff, c->count, c->t, peer, 7);
      if (st == DT_OK)
        st = dt_comm_recv(cm, rb, c->count, c->t, peer, 8);
    } else if (peer >= 0) {
      st = dt_comm_recv(cm, rb, c->count, c->t, peer, 7);
      if (st == DT_OK)
        st = dt_comm_send(cm, c->sb + c->soff, c->count, c->t, peer, 8);
    }
    return st;
  }
  const void *sb = c->inplace == 1 ? DT_IN_PLACE : c->inplace == 2 ? (const void *)rb : c->sb + c->soff;
  dt_request **r = nonblocking ? &c->req : NULL;
  switch (c->k) {
  case K_ALLREDUCE:
  case K_WINDOW:
    return r ? dt_comm_iallreduce(cm, sb, rb, c->count, c->t, c->op, r) : dt_comm_allreduce(cm, sb, rb, c->count, c->t, c->op);
  case K_REDUCE:
    return r ? dt_comm_ireduce(cm, sb, rb, c->count, c->t, c->op, c->root, r)
             : dt_comm_reduce(cm, sb, rb, c->count, c->t, c->op, c->root);
  case K_BROADCAST:
    return r ? dt_comm_ibroadcast(cm, rb, c->count, c->t, c->root, r) : dt_comm_broadcast(cm, rb, c->count, c->t, c->root);
  case K_ALLGATHER:
    return r ? dt_comm_iallgather(cm, sb, rb, c->count, c->t, r) : dt_comm_allgather(cm, sb, rb, c->count, c->t);
  case K_REDUCE_SCATTER:
    return r ? dt_comm_ireduce_scatter(cm, sb, rb, c->count, c->t, c->op, r)
             : dt_comm_reduce_scatter(cm, sb, rb, c->count, c->t, c->op);
  case K_GATHER:
    return r ? dt_comm_igather(cm, sb, rb, c->count, c->t, c->root, r) : dt_comm_gather(cm, sb, rb, c->count, c->t, c->root);
  case K_SCATTER:
    return r ? dt_comm_iscatter(cm, sb, rb, c->count, c->t, c->root, r)
             : dt_comm_scatter(cm, sb, rb, c->count, c->t, c->root);
  case K_ALLTOALL:
    return r ? dt_comm_ialltoall(cm, sb, rb, c->count, c->t, r) : dt_comm_alltoall(cm, sb, rb, c->count, c->t);
  default:
    return r ? dt_comm_ibarrier(cm, r) : dt_comm_barrier(cm);
  }
}

/* Element j of this rank's output: the reference value (*want, *tol) or, for data movement,
 * (rank, index) of the input element it must equal. Returns false where the output has no
 * element j on this rank. */
static bool expect(const call *c, int rank, int n, size_t j, int *src, size_t *gi, bool *reduced) {
  size_t cnt = c->count;
  *reduced = false;
  switch (c->k) {
  case K_ALLREDUCE:
  case K_WINDOW:
  case K_REDUCE:
    if (c->k == K_REDUCE && rank != c->root)
      return false;
    *reduced = true, *gi = j;
    return j < cnt;
  case K_REDUCE_SCATTER:
    *reduced = true, *gi = (size_t)rank * cnt + j;
    return j < cnt;
  case K_BROADCAST:
    *src = c->root, *gi = j;
    return j < cnt;
  case K_ALLGATHER:
  case K_GATHER:
    if (c->k == K_GATHER && rank != c->root)
      return false;
    if (!cnt)
      return false;
    *src = (int)(j / cnt), *gi = j % cnt;
    return j < cnt * (size_t)n;
  case K_SCATTER:
    *src = c->root, *gi = (size_t)rank * cnt + j;
    return j < cnt;
  case K_ALLTOALL:
    if (!cnt)
      return false;
    *src = (int)(j / cnt), *gi = (size_t)rank * cnt + j % cnt;
    return j < cnt * (size_t)n;
  case K_P2P:
    *src = p2p_partner(rank, n), *gi = j;
    return *src >= 0 && j < cnt;
  default:
    return false;
  }
}

/* Whether the call wrote outside its output: the poisoned bytes before it and the 64 after what
 * this rank's recvbuf holds (its output, or in place the input's blocks too; nothing where a
 * rank has no output: reduce and gather off the root) must be untouched. */
static size_t guards(const call *c, int i, uint64_t seed, int rank, int n) {
  size_t es = dt_dtype_size(c->t);
  bool none = ((c->k == K_REDUCE || c->k == K_GATHER) && rank != c->root) || (c->k == K_P2P && p2p_partner(rank, n) < 0);
  size_t span = none ? 0 : c->k == K_REDUCE_SCATTER && c->inplace ? in_elems(c, n) : out_elems(c, n);
  if (c->k == K_BARRIER)
    span = 0;
  size_t hi = c->roff + span * es;
  for (size_t b = c->roff ? 0 : hi; b < hi + 64; b = b + 1 == c->roff ? hi : b + 1)
    if ((unsigned char)c->rb[b] != 0xa7) {
      char what[300];
      describe(c, i, seed, what, sizeof what);
      fprintf(stderr, "rank %d: %s: wrote byte %zd of recvbuf, outside its %zu bytes\n", rank, what,
              (ssize_t)b - (ssize_t)c->roff, hi - c->roff);
      return 1;
    }
  return 0;
}

/* Checks this rank's output of call i; returns the number of wrong elements (the first few said)
 * and adds the number checked to *seen. */
static size_t verify(const call *c, int i, uint64_t seed, int rank, int n, char *win, size_t *seen) {
  const char *out = recv_of(c, win);
  size_t bad = c->k == K_WINDOW ? 0 : guards(c, i, seed, rank, n);
  for (size_t j = 0;; j++, ++*seen) {
    int src = 0;
    size_t gi = 0;
    bool reduced;
    if (!expect(c, rank, n, j, &src, &gi, &reduced))
      break;
    bool ok;
    double want, tol = 0;
    if (!reduced) {
      want = sw_value(c->salt, src, gi, c->t, c->op);
      ok = sw_get(out, j, c->t) == want;
    } else if (n == 2 && (c->t == DT_F16 || c->t == DT_BF16)) {
      ok = sw_check_half2(out, j, c->salt, gi, c->t, c->op);
      sw_expect(c->salt, n, gi, c->t, c->op, &want, &tol);
    } else {
      ok = sw_check_reduced(out, j, c->salt, n, gi, c->t, c->op);
      sw_expect(c->salt, n, gi, c->t, c->op, &want, &tol);
    }
    if (!ok && bad++ < 3) {
      char what[300];
      describe(c, i, seed, what, sizeof what);
      fprintf(stderr, "rank %d: %s: element %zu = %.9g, expected %.9g (tolerance %.3g)\n", rank, what, j,
              sw_get(out, j, c->t), want, tol);
    }
  }
  return bad;
}

/* The mismatch of --mismatch: call c as one rank makes it differently, by something the other
 * ranks' calls must be found to disagree with (a count, dtype, op, root, collective or window
 * offset). */
static void perturb(call *c, uint64_t *s, int n) {
  bool reduces = c->k == K_ALLREDUCE || c->k == K_REDUCE || c->k == K_REDUCE_SCATTER || c->k == K_WINDOW;
  bool rooted = c->k == K_REDUCE || c->k == K_BROADCAST || c->k == K_GATHER || c->k == K_SCATTER;
  switch (next(s) % 5) {
  case 0:
    if (c->k != K_BARRIER) {
      c->count++;
      return;
    }
    break;
  case 1:
    if (c->k != K_BARRIER) {
      c->t = (dt_dtype)((c->t + 1 + next(s) % (DT_DTYPE_COUNT - 1)) % DT_DTYPE_COUNT);
      if (c->op == DT_AVG && !sw_is_float(c->t))
        c->op = DT_SUM;
      size_t es = dt_dtype_size(c->t); /* whole elements of the new type from the offsets on */
      c->soff = c->soff / es * es;
      c->roff = c->roff / es * es;
      return;
    }
    break;
  case 2:
    if (reduces && c->op != DT_AVG) {
      c->op = c->op == DT_SUM ? DT_MAX : DT_SUM;
      return;
    }
    break;
  case 3:
    if (rooted && n > 1) {
      c->root = (c->root + 1) % n;
      return;
    }
    if (c->k == K_WINDOW) {
      c->roff += 64;
      return;
    }
    break;
  default:
    break;
  }
  /* another collective */
  c->k = c->k == K_ALLREDUCE ? K_BROADCAST : K_ALLREDUCE;
  c->inplace = 0;
  if (c->k == K_ALLREDUCE && c->count == 0)
    c->count = 1;
}

/* A call that failed: with a fault, the call where it must show failing as it must passes.
 * --mismatch: its own DT_ERR_MISMATCH, or where another rank found it first DT_ERR_ABORTED (that
 * rank's report) or DT_ERR_PEER (that rank gone after its report: the job's first failure is
 * named), each naming the calls ("rank R called ..."); the last two also in an earlier call, where
 * a rank still finishing it (its last bytes on the way, or a rooted call others have left) learns
 * of the report (seen on tcp, 4 ranks: ranks 0 and 3 still in the allgather before the gather
 * that differed). Only the call that differs may report the mismatch itself. --kill: DT_ERR_PEER
 * or DT_ERR_ABORTED naming the killed rank, there or in an earlier call. Anything else is said
 * and fails. */
static int failed(const call *c, int i, const job *jb, int lo, int hi, dt_status st, int rank, int odd,
                  const char *how) {
  char what[300], killed[32];
  describe(c, i, jb->seed, what, sizeof what);
  snprintf(killed, sizeof killed, "rank %d", odd);
  const char *e = dt_last_error();
  bool ok = (i >= lo || jb->f == F_KILL || (jb->f == F_MISMATCH && st != DT_ERR_MISMATCH)) && i <= hi &&
            (jb->f == F_MISMATCH ? (st == DT_ERR_MISMATCH || st == DT_ERR_ABORTED || st == DT_ERR_PEER) && strstr(e, " called ")
                                 : (st == DT_ERR_PEER || st == DT_ERR_ABORTED) && strstr(e, killed));
  if (ok) {
    if (rank == 0 || (rank == 1 && odd == 0))
      printf("  rank %d: %s: %s%s\n", rank, what, how, e);
    return 0;
  }
  fprintf(stderr, "rank %d: %s: %s%s (%s)\n", rank, what, how, e, dt_strerror(st));
  return 1;
}

static int body(int rank, int n, void *arg) {
  const job *jb = arg;
  dt_comm *cm = sw_join(rank);
  if (!cm)
    return 2;
  size_t cap = (size_t)MAX_COUNT * (size_t)n * 8 * 2 + 256;
  call cs[SLOTS];
  char *bufs[2 * SLOTS];
  for (int i = 0; i < 2 * SLOTS; i++)
    if (!(bufs[i] = dt__alloc(cap))) {
      fprintf(stderr, "rank %d: out of memory\n", rank);
      return 2;
    }
  /* a window where the transport has one (shm with 2+ ranks): the same answer on every rank */
  void *win = NULL;
  dt_status ws = dt_comm_window(cm, (size_t)MAX_COUNT * 8 + 256, &win);
  if (ws != DT_OK && ws != DT_ERR_UNSUPPORTED) {
    fprintf(stderr, "rank %d: window: %s\n", rank, dt_last_error());
    return 1;
  }
  /* without a fault, a third of the calls go to a split of the world (even and odd ranks, in
   * reverse order), between and among the world's, blocking or in flight together */
  dt_comm *sub = NULL;
  if (!jb->f && dt_comm_split(cm, rank % 2, -rank, &sub) != DT_OK) {
    fprintf(stderr, "rank %d: split: %s\n", rank, dt_last_error());
    return 1;
  }
  uint64_t s = jb->seed * 0x9e3779b97f4a7c15ull + 1;
  /* the fault: at call `bad_call`, on rank `odd` */
  const int bad_call = fault_call(jb), odd = fault_rank(jb, n);
  int lo = bad_call, hi = bad_call; /* the other ranks must fail in one of calls lo..hi */
  size_t wrong = 0, seen = 0;
  for (int i = 0; i < jb->calls && !wrong;) {
    /* a quarter of the time a nonblocking batch of 1-3 calls (never in the window) */
    int batch = next(&s) % 4 == 0 ? 1 + (int)(next(&s) % SLOTS) : 0, m = batch ? batch : 1;
    /* --kill: before the batch that holds the call (the others fail in its first call), or for
     * a nonblocking batch followed by more calls, half the time right after starting it: then
     * its calls may complete or not, and the others fail in one of them or in the next call */
    bool kill_after = false;
    if (jb->f == F_KILL && i <= bad_call && bad_call < i + m) {
      kill_after = batch && i + m < jb->calls && sw_hash(jb->seed ^ 0x77) % 2;
      lo = i, hi = kill_after ? i + m : i;
      if (rank == odd && !kill_after)
        kill(getpid(), SIGKILL); /* no goodbye, no destroy: as a crash */
    }
    for (int j = 0; j < m; j++) {
      call *c = &cs[j];
      memset(c, 0, sizeof *c);
      c->sub = sub && next(&s) % 3 == 0;
      dt_comm *on = c->sub ? sub : cm;
      int cr = dt_comm_rank(on), cn = dt_comm_size(on);
      draw(c, &s, cn, win != NULL && !batch && !c->sub, !batch && !jb->f);
      if (jb->f == F_MISMATCH && i + j == bad_call && rank == odd) {
        uint64_t ps = sw_hash(jb->seed ^ 0x5a5a);
        perturb(c, &ps, n);
      }
      c->salt = jb->seed * 1000003ull + (uint64_t)(i + j);
      c->sb = bufs[2 * j];
      c->rb = bufs[2 * j + 1];
      fill(c, cr, cn, win);
      /* now and then this rank comes late (up to 3 ms; each rank its own draw): the others wait
       * inside the call, or run ahead to the next */
      uint64_t late = sw_hash(jb->seed ^ ((uint64_t)rank << 32) ^ (uint64_t)(i + j));
      if (!jb->f && late % 8 == 0)
        dt__sleep_ns((int64_t)(late >> 8) % 3000000);
      dt_status st = start(on, c, win, batch > 0);
      if (st != DT_OK)
        return failed(c, i + j, jb, lo, hi, st, rank, odd, "");
    }
    if (kill_after && rank == odd)
      kill(getpid(), SIGKILL); /* its calls in flight, on its progress thread */
    for (int j = 0; j < m; j++) {
      dt_status st = cs[j].req ? dt_request_wait(cs[j].req) : DT_OK;
      if (st != DT_OK)
        return failed(&cs[j], i + j, jb, lo, hi, st, rank, odd, "wait: ");
      if (i + j == hi) {
        fprintf(stderr, "rank %d: seed %llu call %d returned DT_OK where rank %d's call %s\n", rank,
                (unsigned long long)jb->seed, i + j, odd, jb->f == F_KILL ? "never came (killed)" : "differed");
        return 1;
      }
      dt_comm *on = cs[j].sub ? sub : cm;
      wrong += verify(&cs[j], i + j, jb->seed, dt_comm_rank(on), dt_comm_size(on), win, &seen);
    }
    i += m;
  }
  if (rank == 0 && !wrong)
    printf("  rank 0 checked %zu elements of %d calls%s\n", seen, jb->calls, win ? " (with the shared window)" : "");
  dt_comm_destroy(sub);
  dt_comm_destroy(cm);
  for (int i = 0; i < 2 * SLOTS; i++)
    dt__free(bufs[i]);
  return wrong ? 1 : 0;
}

/* "2,3,5" -> {2, 3, 5}; returns how many, 0 on a bad list. */
static int parse_list(const char *s, long *out, int cap) {
  int k = 0;
  while (*s && k < cap) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || v < 0)
      return 0;
    out[k++] = v;
    s = *end == ',' ? end + 1 : end;
    if (*end && *end != ',')
      return 0;
  }
  return k;
}

int main(int argc, char **argv) {
  long ranks[16], seeds[64];
  int nr = argc > 2 && strcmp(argv[2], "-") ? parse_list(argv[2], ranks, 16) : 0;
  int ns = argc > 3 ? parse_list(argv[3], seeds, 64) : 0;
  int calls = argc > 4 ? atoi(argv[4]) : CALLS_DEFAULT;
  bool mpi = argc > 1 && !strcmp(argv[1], "mpi");
  fault f = argc < 6 ? F_NONE : !strcmp(argv[5], "--mismatch") ? F_MISMATCH : !strcmp(argv[5], "--kill") ? F_KILL : -1;
  if (argc < 4 || argc > 6 || !ns || calls <= 0 || (!mpi && !nr) || (int)f < 0 || (mpi && f)) {
    fprintf(stderr, "usage: test_coll_random <shm|tcp> <ranks,...> <seeds,...> [calls [--mismatch|--kill]]\n"
                    "       mpirun -np N test_coll_random mpi - <seeds,...> [calls]\n");
    return 2;
  }
  /* a call that never completes fails with its deadline (a fault must be found well before) */
  if (!getenv("DTRAIN_TIMEOUT_MS"))
    setenv("DTRAIN_TIMEOUT_MS", f ? "20000" : "120000", 1);
  int bad = 0, runs = 0;
  if (mpi) { /* one job, made by mpirun: every seed in turn */
    setenv("DTRAIN_TRANSPORT", "mpi", 1);
    const char *re = getenv("OMPI_COMM_WORLD_RANK"), *se = getenv("OMPI_COMM_WORLD_SIZE");
    if (!re || !se) {
      fprintf(stderr, "test_coll_random mpi: start it with mpirun\n");
      return 2;
    }
    int rank = atoi(re), n = atoi(se);
    for (int i = 0; i < ns; i++, runs++) {
      job jb = {(uint64_t)seeds[i], calls, f};
      if (body(rank, n, &jb)) {
        fprintf(stderr, "FAIL: mpi, %d ranks, seed %ld\n", n, seeds[i]);
        bad++;
      }
    }
    if (rank == 0)
      printf("%d passed, %d failed\n", runs - bad, bad);
    return bad ? 1 : 0;
  }
  setenv("DTRAIN_TRANSPORT", argv[1], 1);
  const char *given = getenv("DTRAIN_ALGO"); /* a DTRAIN_ALGO of the caller's holds for every seed */
  for (int r = 0; r < nr; r++)
    for (int i = 0; i < ns; i++, runs++) {
      job jb = {(uint64_t)seeds[i], calls, f};
      const char *algo = given ? given : algos[(size_t)seeds[i] % (sizeof algos / sizeof algos[0])];
      if (*algo)
        setenv("DTRAIN_ALGO", algo, 1);
      else
        unsetenv("DTRAIN_ALGO");
      printf("# %s, %ld ranks, seed %ld, DTRAIN_ALGO=%s\n", argv[1], ranks[r], seeds[i], *algo ? algo : "(auto)");
      fflush(stdout);
      int codes[64] = {0}, odd = fault_rank(&jb, (int)ranks[r]);
      int failures = mp_run_codes((int)ranks[r], body, &jb, 300, codes);
      if (f == F_KILL) /* the killed rank must have died of it, and only it */
        failures = codes[odd] == 128 + SIGKILL ? failures - 1 : failures + 1;
      if (failures) {
        fprintf(stderr, "FAIL: %s, %ld ranks, seed %ld:", argv[1], ranks[r], seeds[i]);
        for (int k = 0; k < ranks[r]; k++)
          if (codes[k])
            fprintf(stderr, " rank %d %s %d;", k, codes[k] > 128 ? "killed by signal" : "exit",
                    codes[k] > 128 ? codes[k] - 128 : codes[k]);
        fprintf(stderr, "\n");
        bad++;
      }
    }
  printf("%d passed, %d failed\n", runs - bad, bad);
  return bad ? 1 : 0;
}
