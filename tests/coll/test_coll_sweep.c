/* test_coll_sweep.c - every collective x dtype x op x count x ranks x algorithm on one transport,
 * in real processes over the real store and transport, each result checked against the serial
 * reference of sweep.h (exact for integers and data movement, justified bounds for floats).
 *
 * Usage: test_coll_sweep <shm|tcp|tcp-poll|tcp-spin> <ranks,...> <counts,...> [colls,...]
 *   tcp-poll / tcp-spin force the tcp transport's way of waiting (tcp.c): tcp-poll sleeps in
 *   poll(2) at once (DTRAIN_TCP_SPIN_US=0), tcp-spin spins before sleeping on messages of any
 *   size (DTRAIN_TCP_SPIN_MAX=1G); plain tcp spins on any size with up to one rank per CPU and
 *   only on small ones above (its default).
 *   colls: allreduce reduce broadcast allgather reduce_scatter gather scatter alltoall barrier
 *   (default all). Algorithms are forced through DTRAIN_ALGO per call: allreduce ring/rd/rhd,
 *   broadcast tree/chain, allgather ring/bruck, reduce_scatter ring/rhd, barrier dissem, plus the
 *   transport's fast path ("shm") and one-round path ("flat") of each collective that has them,
 *   and auto. Small ring and chain pieces and flat slots (4 KiB) make the pipelines run several
 *   pieces per step, and the flat paths several rounds, at count 4099. Ranks above the machine's CPU count
 *   run the shm transport's oversubscribed waiting (short spin, yield, futex sleep).
 * Counts >= 100000 sample dtype x op (every dtype with sum; every op on f32 and f16) and skip
 * "auto", which only picks one of the forced algorithms.
 * Two-rank f16/bf16 allreduces are checked bit for bit (sw_check_half2: one operation, one
 * rounding) on every algorithm, rd's half-type exchange included.
 * Out of place, DT_IN_PLACE and sendbuf == recvbuf (and for allgather/gather sendbuf at the rank's
 * own slot) rotate by (dtype + op + count); scatter's root alternates between separate buffers and
 * sendbuf == recvbuf. Allreduce results are also
 * compared bit for bit across ranks (CRC32C allgathered). Ctest runs several of these, one per
 * transport and size class (CMakeLists.txt). */
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>

#include "common/mp.h"
#include "coll/sweep.h"

typedef struct cfg {
  const char *transport;
  size_t counts[16];
  int ncounts;
  unsigned colls; /* bit per dt__coll */
  int large;       /* some count >= 100000: sample dtype x op (see body) */
} cfg;

static int failures;
/* one write per message so ranks' lines do not interleave */
#define FAILF(...)                                                 \
  do {                                                             \
    if (failures++ < 12) {                                         \
      char m_[1400];                                               \
      int l_ = snprintf(m_, sizeof m_, "rank %d: ", rank);         \
      l_ += snprintf(m_ + l_, sizeof m_ - (size_t)l_, __VA_ARGS__); \
      if (l_ > (int)sizeof m_ - 2)                                 \
        l_ = (int)sizeof m_ - 2;                                   \
      m_[l_++] = '\n';                                             \
      if (write(2, m_, (size_t)l_) < 0)                            \
        failures++;                                                \
    }                                                              \
  } while (0)

/* The call this rank is in, for the signal report below. */
static char cur_what[240];
static int cur_rank = -1;

/* A rank killed by a signal (a crash, or mp_run's alarm when a call hangs past every deadline)
 * says in which call, then dies of the signal as before. Installed only where no handler is
 * (ASan and UBSan keep theirs and print their own report). */
static void on_signal(int sig) {
  char m[400];
  int l = snprintf(m, sizeof m, "rank %d: signal %d during %s\n", cur_rank, sig, cur_what[0] ? cur_what : "setup");
  if (write(2, m, (size_t)DT_MIN(l, (int)sizeof m - 1)) < 0)
    cur_rank = -2;
  signal(sig, SIG_DFL);
  raise(sig);
}

static void catch_signals(void) {
  static const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGALRM};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
    struct sigaction old;
    if (sigaction(sigs[i], NULL, &old) == 0 && !(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_DFL)
      signal(sigs[i], on_signal);
  }
}

static int rooted(dt__coll k) {
  return k == DT_COLL_REDUCE || k == DT_COLL_BROADCAST || k == DT_COLL_GATHER || k == DT_COLL_SCATTER;
}
static int has_op(dt__coll k) {
  return k == DT_COLL_ALLREDUCE || k == DT_COLL_REDUCE || k == DT_COLL_REDUCE_SCATTER;
}

/* Checks elements first, first + step, ... < count of a reduction's output against the
 * reference (element j is global index gbase + j) and reports the first wrong one with what it
 * should be, and how many are wrong in all (one element, a piece, a slice or everything says
 * which step of which algorithm broke). Returns the number of wrong elements. */
static size_t check_reduced(int rank, const char *what, const void *out, size_t first, size_t step, size_t count,
                            size_t gbase, uint64_t salt, int n, dt_dtype t, dt_op op) {
  size_t bad = 0, first_bad = 0, last_bad = 0;
  for (size_t j = first; j < count; j += step)
    if (!sw_check_reduced(out, j, salt, n, gbase + j, t, op)) {
      if (!bad++)
        first_bad = j;
      last_bad = j;
    }
  if (bad) {
    double want, tol;
    sw_expect(salt, n, gbase + first_bad, t, op, &want, &tol);
    FAILF("%s: element %zu = %.9g, expected %.9g (tolerance %.3g); %zu of the %zu elements this rank checks are "
          "wrong, the last at %zu",
          what, first_bad, sw_get(out, first_bad, t), want, tol, bad, count > first ? (count - first + step - 1) / step : 0,
          last_bad);
  }
  return bad;
}

/* Compares count elements of got against want and reports the first that differs, with both
 * values and how many differ. Returns 1 if any differ. */
static int check_same(int rank, const char *what, const char *whose, const void *got, const void *want, size_t count,
                      dt_dtype t) {
  size_t es = dt_dtype_size(t);
  if (!memcmp(got, want, count * es))
    return 0;
  size_t bad = 0, first_bad = 0;
  for (size_t j = 0; j < count; j++)
    if (memcmp((const char *)got + j * es, (const char *)want + j * es, es) && !bad++)
      first_bad = j;
  FAILF("%s: %s differs: element %zu = %.9g, expected %.9g; %zu of %zu elements differ", what, whose, first_bad,
        sw_get(got, first_bad, t), sw_get(want, first_bad, t), bad, count);
  return 1;
}

/* Runs one call and checks it; returns 0 on success (mismatches are counted in failures). */
static int one(dt_comm *c, dt__coll k, dt_dtype t, dt_op op, size_t count, int root, int inplace, uint64_t salt,
               const char *algo) {
  int rank = dt_comm_rank(c), n = dt_comm_size(c);
  size_t es = dt_dtype_size(t), blocks = (k == DT_COLL_ALLREDUCE || k == DT_COLL_REDUCE || k == DT_COLL_BROADCAST) ? 1 : (size_t)n;
  size_t total = count * (size_t)n + 8;
  char *in = dt__alloc(total * es + 64), *out = dt__alloc(total * es + 64);
  if (!in || !out) {
    FAILF("out of memory");
    return -1;
  }
  memset(out, 0xa5, total * es);
  const void *sb = in;
  void *rb = out;
  dt_status st = DT_OK;
  char what[200];
  snprintf(what, sizeof what, "%s %s %s count %zu root %d %s algo %s n %d", dt__coll_name(k), dt_dtype_name(t),
           has_op(k) ? dt_op_name(op) : "-", count, root,
           inplace == 3 ? "sendbuf==own slot" : inplace == 2 ? "sendbuf==recvbuf" : inplace ? "in-place" : "out-of-place",
           algo, n);
  memcpy(cur_what, what, sizeof what);
  switch (k) {
  case DT_COLL_ALLREDUCE:
  case DT_COLL_REDUCE:
    sw_fill(in, count, 0, salt, rank, t, op);
    if (inplace) {
      memcpy(out, in, count * es);
      sb = inplace == 2 ? out : DT_IN_PLACE;
    }
    st = k == DT_COLL_ALLREDUCE ? dt_comm_allreduce(c, sb, rb, count, t, op)
                                : dt_comm_reduce(c, sb, rb, count, t, op, root);
    /* allreduce: rank r checks elements i % n == r against the reference, and the CRC
     * comparison below proves every rank holds the same bits, so all elements are checked */
    if (st == DT_OK && k == DT_COLL_ALLREDUCE)
      check_reduced(rank, what, out, (size_t)rank, (size_t)n, count, 0, salt, n, t, op);
    else if (st == DT_OK && rank == root)
      check_reduced(rank, what, out, 0, 1, count, 0, salt, n, t, op);
    /* two ranks, half types: bit-exact (one rounding), every element on every rank */
    if (st == DT_OK && k == DT_COLL_ALLREDUCE && n == 2 && (t == DT_F16 || t == DT_BF16))
      for (size_t i = 0; i < count; i++)
        if (!sw_check_half2(out, i, salt, i, t, op)) {
          FAILF("%s: element %zu = %.9g (0x%04x) is not the single rounding", what, i, sw_get(out, i, t),
                ((uint16_t *)out)[i]);
          break;
        }
    break;
  case DT_COLL_REDUCE_SCATTER:
    sw_fill(in, count * (size_t)n, 0, salt, rank, t, op);
    if (inplace) {
      memcpy(out, in, count * (size_t)n * es);
      sb = inplace == 2 ? out : DT_IN_PLACE;
    }
    st = dt_comm_reduce_scatter(c, sb, rb, count, t, op);
    if (st == DT_OK)
      check_reduced(rank, what, out, 0, 1, count, (size_t)rank * count, salt, n, t, op);
    break;
  case DT_COLL_BROADCAST:
    if (rank == root)
      sw_fill(out, count, 0, salt, root, t, DT_SUM);
    st = dt_comm_broadcast(c, out, count, t, root);
    if (st == DT_OK) {
      sw_fill(in, count, 0, salt, root, t, DT_SUM);
      check_same(rank, what, "data from the root", out, in, count, t);
    }
    break;
  case DT_COLL_ALLGATHER:
  case DT_COLL_GATHER:
    /* 1, 3: the block already at this rank's slot (DT_IN_PLACE, or its address); 2: at the start
     * of recvbuf, which is sendbuf (comm.h: read as a send buffer, so the library moves it) */
    sw_fill(in, count, 0, salt, rank, t, DT_SUM);
    if (inplace) {
      char *own = out + (inplace == 2 ? 0 : (size_t)rank * count * es);
      memcpy(own, in, count * es);
      sb = inplace == 1 ? DT_IN_PLACE : own;
    }
    st = k == DT_COLL_ALLGATHER ? dt_comm_allgather(c, sb, rb, count, t) : dt_comm_gather(c, sb, rb, count, t, root);
    if (st == DT_OK && (k == DT_COLL_ALLGATHER || rank == root))
      for (int q = 0; q < n; q++) {
        sw_fill(in, count, 0, salt, q, t, DT_SUM);
        char whose[40];
        snprintf(whose, sizeof whose, "the block of rank %d", q);
        if (check_same(rank, what, whose, out + (size_t)q * count * es, in, count, t))
          break;
      }
    break;
  case DT_COLL_SCATTER:
    if (rank == root)
      sw_fill(inplace == 2 ? out : in, count * (size_t)n, 0, salt, root, t, DT_SUM);
    st = dt_comm_scatter(c, rank != root ? NULL : inplace == 2 ? out : in, rb, count, t, root);
    if (st == DT_OK) {
      sw_fill(in, count, (size_t)rank * count, salt, root, t, DT_SUM);
      check_same(rank, what, "my block", out, in, count, t);
    }
    break;
  case DT_COLL_ALLTOALL:
    sw_fill(in, count * (size_t)n, 0, salt, rank, t, DT_SUM);
    if (inplace) {
      memcpy(out, in, count * (size_t)n * es);
      sb = inplace == 2 ? out : DT_IN_PLACE;
    }
    st = dt_comm_alltoall(c, sb, rb, count, t);
    if (st == DT_OK)
      for (int q = 0; q < n; q++) {
        sw_fill(in, count, (size_t)rank * count, salt, q, t, DT_SUM);
        char whose[40];
        snprintf(whose, sizeof whose, "the block from rank %d", q);
        if (check_same(rank, what, whose, out + (size_t)q * count * es, in, count, t))
          break;
      }
    break;
  case DT_COLL_BARRIER:
    st = dt_comm_barrier(c);
    break;
  default:
    break;
  }
  if (st != DT_OK) {
    FAILF("%s: %s: %s", what, dt_strerror(st), dt_last_error());
    dt__free(in);
    dt__free(out);
    return -1;
  }
  if (k == DT_COLL_ALLREDUCE && n > 1) {
    /* every rank must hold the same bits */
    uint32_t crc = dt_crc32c(0, out, count * es), all[256];
    st = dt_comm_allgather(c, &crc, all, 1, DT_I32);
    if (st != DT_OK) {
      FAILF("%s: crc allgather: %s", what, dt_last_error());
      dt__free(in);
      dt__free(out);
      return -1;
    }
    for (int q = 0; q < n; q++)
      if (all[q] != crc) {
        FAILF("%s: rank %d's result differs in its bits from mine (crc32c %08x against %08x)", what, q, all[q], crc);
        break;
      }
  }
  (void)blocks;
  dt__free(in);
  dt__free(out);
  return 0;
}

static int body(int rank, int size, void *arg) {
  const cfg *g = arg;
  (void)size;
  setenv("DTRAIN_TRANSPORT", g->transport, 1);
  cur_rank = rank;
  catch_signals();
  dt_comm *c;
  if (dt_comm_create(NULL, &c)) {
    fprintf(stderr, "rank %d: create: %s\n", rank, dt_last_error());
    return 2;
  }
  int n = dt_comm_size(c);
  uint64_t salt = 1;
  for (int k = DT_COLL_ALLREDUCE; k <= DT_COLL_BARRIER; k++) {
    if (!(g->colls & (1u << k)))
      continue;
    /* every algorithm of this collective, and the transport's fast path when it has one */
    const char *algos[7] = {"auto"};
    int nalgo = 1;
    if (k == DT_COLL_ALLREDUCE) {
      algos[nalgo++] = "ring";
      algos[nalgo++] = "rd";
      algos[nalgo++] = "rhd";
      if (c->ops->allreduce)
        algos[nalgo++] = "shm";
      if (c->ops->flat)
        algos[nalgo++] = "flat";
    } else if (k == DT_COLL_BROADCAST) {
      algos[nalgo++] = "broadcast=tree";
      algos[nalgo++] = "broadcast=chain";
      if (c->ops->broadcast)
        algos[nalgo++] = "broadcast=shm";
      if (c->ops->flat)
        algos[nalgo++] = "broadcast=flat";
    } else if (k == DT_COLL_ALLGATHER) {
      algos[nalgo++] = "allgather=ring";
      algos[nalgo++] = "allgather=bruck";
      if (c->ops->allgather)
        algos[nalgo++] = "allgather=shm";
      if (c->ops->flat)
        algos[nalgo++] = "allgather=flat";
    } else if (k == DT_COLL_REDUCE_SCATTER) {
      algos[nalgo++] = "reduce_scatter=ring";
      algos[nalgo++] = "reduce_scatter=rhd";
      if (c->ops->reduce_scatter)
        algos[nalgo++] = "reduce_scatter=shm";
      if (c->ops->flat)
        algos[nalgo++] = "reduce_scatter=flat";
    } else if (k == DT_COLL_BARRIER) {
      algos[nalgo++] = "barrier=dissem";
      if (c->ops->barrier)
        algos[nalgo++] = "barrier=shm";
    }
    for (int a = 0; a < nalgo; a++) {
      if (g->large && a == 0 && nalgo > 1)
        continue; /* auto picks one of the forced ones */
      setenv("DTRAIN_ALGO", algos[a], 1);
      dt__coll_algo_load(c); /* a communicator reads it when it is made */
      int ndt = k == DT_COLL_BARRIER ? 1 : DT_DTYPE_COUNT, nop = has_op((dt__coll)k) ? DT_OP_COUNT : 1;
      for (int t = 0; t < ndt; t++)
        for (int op = 0; op < nop; op++)
          for (int ci = 0; ci < g->ncounts; ci++) {
            size_t count = k == DT_COLL_BARRIER ? 0 : g->counts[ci];
            /* Large counts: every dtype with sum, and every op on f32 and f16 (the kernels
             * of every dtype x op are proven by test_reduce; what a large count adds is many
             * pipeline pieces and segments, which do not depend on the op). */
            if (g->large && op != DT_SUM && t != DT_F32 && t != DT_F16)
              continue;
            int root = rooted((dt__coll)k) ? (int)((count + (size_t)t + (size_t)op) % (size_t)n) : -1;
            /* 0 out of place, 1 DT_IN_PLACE, 2 sendbuf == recvbuf, 3 (allgather, gather) sendbuf
             * at this rank's slot of recvbuf; scatter has no DT_IN_PLACE (1 is out of place) */
            int ag = k == DT_COLL_ALLGATHER || k == DT_COLL_GATHER;
            int inplace = (t + op + (int)ci) % (ag ? 4 : 3);
            if (one(c, (dt__coll)k, (dt_dtype)t, (dt_op)op, count, root, inplace, salt++, algos[a]))
              goto out;
            if (k == DT_COLL_BARRIER)
              break;
          }
    }
  }
out:
  dt_comm_destroy(c);
  return failures ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s <shm|tcp> <ranks,...> <counts,...> [colls,...]\n", argv[0]);
    return 2;
  }
  cfg g = {.transport = argv[1]};
  if (!strcmp(argv[1], "tcp-poll") || !strcmp(argv[1], "tcp-spin")) {
    setenv(argv[1][4] == 'p' ? "DTRAIN_TCP_SPIN_US" : "DTRAIN_TCP_SPIN_MAX", argv[1][4] == 'p' ? "0" : "1G", 1);
    g.transport = "tcp";
  }
  int ranks[16], nranks = 0;
  for (char *s = strtok(argv[2], ","); s && nranks < 16; s = strtok(NULL, ","))
    ranks[nranks++] = atoi(s);
  for (char *s = strtok(argv[3], ","); s && g.ncounts < 16; s = strtok(NULL, ","))
    g.counts[g.ncounts++] = (size_t)strtoull(s, NULL, 10);
  if (argc > 4) {
    for (char *s = strtok(argv[4], ","); s; s = strtok(NULL, ",")) {
      int found = 0;
      for (int k = DT_COLL_ALLREDUCE; k <= DT_COLL_BARRIER; k++)
        if (!strcmp(s, dt__coll_name(k)))
          g.colls |= 1u << k, found = 1;
      if (!found) {
        fprintf(stderr, "unknown collective %s\n", s);
        return 2;
      }
    }
  } else {
    g.colls = ~0u;
  }
  /* several pieces per pipeline step already at count 4099; large counts keep the default
   * pieces (4 KiB pieces of a megabyte would test nothing new, only slowly) */
  size_t maxcount = 0;
  for (int i = 0; i < g.ncounts; i++)
    maxcount = g.counts[i] > maxcount ? g.counts[i] : maxcount;
  g.large = maxcount >= 100000;
  if (maxcount < 100000 && !getenv("DTRAIN_RING_PIECE"))
    setenv("DTRAIN_RING_PIECE", "4096", 1);
  if (maxcount < 100000 && !getenv("DTRAIN_CHAIN_PIECE"))
    setenv("DTRAIN_CHAIN_PIECE", "4096", 1);
  if (maxcount < 100000 && !getenv("DTRAIN_SHM_FLAT"))
    setenv("DTRAIN_SHM_FLAT", "4096", 1);
  /* A call that never completes fails with its deadline well before ctest's TIMEOUT (300 s)
   * kills the test and its output: the error names the call, the rank and whom it waited for. */
  if (!getenv("DTRAIN_TIMEOUT_MS"))
    setenv("DTRAIN_TIMEOUT_MS", "120000", 1);
  int bad = 0;
  for (int i = 0; i < nranks; i++) {
    printf("# %s, %d ranks\n", g.transport, ranks[i]);
    fflush(stdout);
    int codes[256] = {0};
    int f = mp_run_codes(ranks[i], body, &g, 600, codes);
    if (f) {
      /* which ranks, and how: 1 = a check failed (its lines above), 2 = no communicator, 128+N =
       * killed by signal N (SIGKILL after mp_run's timeout, SIGALRM from its alarm, ASan/UBSan
       * abort), so a failure seen once on CI says what happened */
      char m[1024];
      int l = snprintf(m, sizeof m, "FAIL: %s with %d ranks: %d rank(s) failed:", g.transport, ranks[i], f);
      for (int r = 0; r < ranks[i] && l < (int)sizeof m - 64; r++)
        if (codes[r])
          l += codes[r] > 128 ? snprintf(m + l, sizeof m - (size_t)l, " rank %d killed by signal %d (%s);", r,
                                         codes[r] - 128, strsignal(codes[r] - 128))
                              : snprintf(m + l, sizeof m - (size_t)l, " rank %d exit %d;", r, codes[r]);
      fprintf(stderr, "%s\n", m);
      bad++;
    }
  }
  printf("%d passed, %d failed\n", nranks - bad, bad);
  return bad ? 1 : 0;
}
