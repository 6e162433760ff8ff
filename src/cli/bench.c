/* bench.c - `dtrain bench`: measures one collective on N local ranks, as nccl-tests does, and
 * validates every result.
 *
 * The command starts N copies of itself (through the launcher of `dtrain run`, so a dead or
 * failing rank stops the job and is named) with a hidden --worker flag and the DTRAIN_* job
 * environment (store on 127.0.0.1 at a free port, random job secret and id). The workers form a
 * communicator and, per size: fill inputs whose reductions are exact in every dtype, run
 * --warmup untimed and --iters timed calls, check results against the value computed here,
 * and rank 0 prints one row. Checked are every warm-up call (the first follows poisoned
 * outputs, so a call that writes nothing fails) and the last timed call, not every timed one:
 * the check costs more CPU than the call, and with more ranks than cores that work between
 * timed calls shifted the scheduler's fairness onto the timed ones (Open MPI's side,
 * bench/mpi_coll.c, checks once after its timed loop).
 *
 * Timing: before every timed call a barrier lines the ranks up; each rank times its own call;
 * after the loop an allreduce(max) gives, per iteration, the slowest rank's time; the row shows
 * the median over iterations of that maximum. algbw = size / time; busbw = algbw x nccl-tests'
 * factor (allreduce 2(n-1)/n; allgather, reduce_scatter, alltoall (n-1)/n; broadcast 1).
 * Sizes follow nccl-tests: allreduce/broadcast the buffer, allgather the gathered total,
 * reduce_scatter the input total, alltoall each rank's whole send buffer.
 * It deliberately measures one collective per run and no other process's peers (that is
 * bench/compare-peers' job). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/launch.h"
#include "comm/coll/coll.h"
#include "core/core.h"
#include "dtrain/comm.h"

#define BENCH_HINT "dtrain bench <allreduce|allgather|reduce_scatter|broadcast|alltoall> -n N [--transport shm|tcp] [--algo NAME] [--sizes 8:256M] [--iters N] [--warmup N] [--dtype f32] [--op sum] [--in-place] [--window] [--fresh] [--hugepages] [--json]"

typedef enum { B_ALLREDUCE, B_ALLGATHER, B_REDUCE_SCATTER, B_BROADCAST, B_ALLTOALL, B_COUNT } bench_coll;
static const char *coll_names[B_COUNT] = {"allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall"};

typedef struct bench_opts {
  bench_coll coll;
  int nproc;
  const char *transport, *algo;
  uint64_t lo, hi;
  int iters, warmup;
  dt_dtype dtype;
  dt_op op;
  int json;
  int in_place; /* calls in place (DT_IN_PLACE), the input written into the output before every call */
  int window;   /* buffers in the communicator's shared window, calls in place (dt_comm_window) */
  int fresh;  /* the input rewritten before every call, as the window's is */
  int hugepages; /* buffers on transparent huge pages */
  int timeout_s;
} bench_opts;

/* The least size that moves anything: one element, per rank where each rank owns a block. */
static uint64_t bench_unit(const bench_opts *o, int nranks) {
  bool blocks = o->coll != B_ALLREDUCE && o->coll != B_BROADCAST;
  return dt_dtype_size(o->dtype) * (uint64_t)(blocks ? nranks : 1);
}

static int parse_int(const char *s, int lo, int hi, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi)
    return -1;
  *out = (int)v;
  return 0;
}

/* Parses argv (argv[0] = "bench"); returns 0, or the exit code 2 after printing the error. */

/* KiB of huge pages backing the mappings that hold [a, a + n) or [b, b + n) (/proc/self/smaps). */
static unsigned long bench_huge_kib(const void *a, const void *b, size_t n) {
  FILE *f = fopen("/proc/self/smaps", "r");
  if (!f)
    return 0;
  char line[256];
  unsigned long lo = 0, hi = 0, kib, total = 0;
  int in = 0;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
      uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
      in = (x < hi && x + n > lo) || (b && y < hi && y + n > lo);
    } else if (in && sscanf(line, "AnonHugePages: %lu kB", &kib) == 1) {
      total += kib;
    }
  }
  fclose(f);
  return total;
}

static int bench_parse(int argc, char **argv, bench_opts *o, int *worker) {
  memset(o, 0, sizeof *o);
  o->nproc = 2;
  o->lo = 8;
  o->hi = 64u << 20;
  o->iters = 20;
  o->warmup = 5;
  o->dtype = DT_F32;
  o->op = DT_SUM;
  o->timeout_s = 900;
  *worker = 0;
  int have_coll = 0, op_given = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_VALUE()                                                                          \
  do {                                                                                        \
    if (!v)                                                                                   \
      return dt_cli_usage_error("bench", BENCH_HINT, "%s needs a value", a);                  \
    i++;                                                                                      \
  } while (0)
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      printf("usage: %s\n\n"
             "Starts N local ranks and measures one collective at sizes lo, 2*lo, ... hi (bytes,\n"
             "K/M/G suffixes; each rounded down to whole elements, per rank for allgather,\n"
             "reduce_scatter and alltoall, and skipped below one), printing nccl-tests' columns:\n"
             "size (B), count (elements), type, redop, time (us, median over --iters of the\n"
             "slowest rank), algbw and busbw (GB/s),\n"
             "#wrong (elements that differ from the expected result, summed over ranks and the\n"
             "checked calls: every warm-up call and the last timed one; any wrong element makes\n"
             "the command exit 1). --json prints a JSON array\n"
             "of rows {bytes, count, dtype, time_us, algbw_gbs, busbw_gbs, wrong} instead\n"
             "(a number that is not finite is null).\n"
             "--algo names the algorithm of this collective (DTRAIN_ALGO), --transport sets\n"
             "DTRAIN_TRANSPORT. --timeout S stops the whole run after S seconds (default 900).\n"
             "--in-place (allreduce, reduce_scatter, allgather) calls in place (DT_IN_PLACE), as a\n"
             "training step allreduces its gradients: the input is written into the output\n"
             "buffer before every call, untimed (so not with --fresh).\n"
             "--window (allreduce, reduce_scatter, allgather; shm) puts the buffer in the\n"
             "communicator's shared window (dt_comm_window) and calls in place, so the collective\n"
             "copies nothing in or out; the input is rewritten before every call, untimed.\n"
             "--fresh rewrites the input (and clears the output) before every call, untimed, as\n"
             "a training step writes its gradients before their allreduce; without it the calls\n"
             "reuse one input, as nccl-tests and the MPI benchmarks do.\n"
             "--hugepages puts the buffers on transparent huge pages (2 MiB aligned,\n"
             "madvise(MADV_HUGEPAGE) before first use), as a caller may allocate large buffers;\n"
             "the single-copy shm paths then pin a peer's pages faster (docs/TRANSPORTS.md).\n",
             BENCH_HINT);
      return -1; /* done: the caller's return checks that stdout took it */
    } else if (!strcmp(a, "--worker")) {
      *worker = 1;
    } else if (!strcmp(a, "-n") || !strcmp(a, "--nproc")) {
      NEED_VALUE();
      if (parse_int(v, 1, 256, &o->nproc))
        return dt_cli_usage_error("bench", "-n takes 1..256", "bad -n '%s'", v);
    } else if (!strcmp(a, "--transport")) {
      NEED_VALUE();
      if (!strcmp(v, "mpi"))
        return dt_cli_usage_error("bench", "--transport shm or tcp (dtrain bench starts its own ranks; Open MPI's "
                                  "side is bench/mpi_coll under mpirun)", "--transport mpi needs ranks that mpirun started");
      if (strcmp(v, "shm") && strcmp(v, "tcp"))
        return dt_cli_usage_error("bench", "--transport shm or tcp", "unknown transport '%s'", v);
      o->transport = v;
    } else if (!strcmp(a, "--algo")) {
      NEED_VALUE();
      if (strchr(v, '=') || strchr(v, ','))
        return dt_cli_usage_error("bench", "--algo NAME: the algorithm of the collective measured (ring, rd, ...)",
                                  "--algo '%s': one algorithm name, without a collective (DTRAIN_ALGO's coll=name "
                                  "form is for a job)", v);
      o->algo = v;
    } else if (!strcmp(a, "--sizes")) {
      NEED_VALUE();
      char buf[64];
      if (strlen(v) >= sizeof buf)
        return dt_cli_usage_error("bench", "--sizes LO:HI such as 8:256M", "bad --sizes '%.40s...': too long", v);
      snprintf(buf, sizeof buf, "%s", v);
      char *colon = strchr(buf, ':');
      if (colon)
        *colon = '\0';
      if (dt__parse_size(buf, &o->lo) || (colon ? dt__parse_size(colon + 1, &o->hi) : (o->hi = o->lo, 0)))
        return dt_cli_usage_error("bench", "--sizes LO:HI such as 8:256M", "bad --sizes '%s': %s", v, dt_last_error());
      if (o->lo < 1 || o->hi < o->lo || o->hi > (8ull << 30))
        return dt_cli_usage_error("bench", "--sizes LO:HI with 1 <= LO <= HI <= 8G", "bad --sizes '%s'", v);
    } else if (!strcmp(a, "--iters")) {
      NEED_VALUE();
      if (parse_int(v, 1, 1000000, &o->iters))
        return dt_cli_usage_error("bench", "--iters takes a positive number", "bad --iters '%s'", v);
    } else if (!strcmp(a, "--warmup")) {
      NEED_VALUE();
      if (parse_int(v, 0, 1000000, &o->warmup))
        return dt_cli_usage_error("bench", "--warmup takes a number >= 0", "bad --warmup '%s'", v);
    } else if (!strcmp(a, "--timeout")) {
      NEED_VALUE();
      if (parse_int(v, 1, 86400, &o->timeout_s))
        return dt_cli_usage_error("bench", "--timeout takes seconds", "bad --timeout '%s'", v);
    } else if (!strcmp(a, "--dtype")) {
      NEED_VALUE();
      if (dt_dtype_parse(v, &o->dtype))
        return dt_cli_usage_error("bench", "dtypes: f32 f64 f16 bf16 i32 i64 u8", "%s", dt_last_error());
    } else if (!strcmp(a, "--op")) {
      NEED_VALUE();
      if (dt_op_parse(v, &o->op))
        return dt_cli_usage_error("bench", "ops: sum prod min max avg", "%s", dt_last_error());
      op_given = 1;
    } else if (!strcmp(a, "--json")) {
      o->json = 1;
    } else if (!strcmp(a, "--in-place")) {
      o->in_place = 1;
    } else if (!strcmp(a, "--window")) {
      o->window = 1;
    } else if (!strcmp(a, "--fresh")) {
      o->fresh = 1;
    } else if (!strcmp(a, "--hugepages")) {
      o->hugepages = 1;
    } else if (a[0] != '-' && !have_coll) {
      int k = -1;
      for (int j = 0; j < B_COUNT; j++)
        if (!strcmp(a, coll_names[j]))
          k = j;
      if (k < 0)
        return dt_cli_usage_error("bench", BENCH_HINT, "unknown collective '%s'", a);
      o->coll = (bench_coll)k;
      have_coll = 1;
    } else {
      return dt_cli_usage_error("bench", BENCH_HINT, "unknown argument '%s'", a);
    }
#undef NEED_VALUE
  }
  if (!have_coll)
    return dt_cli_usage_error("bench", BENCH_HINT, "which collective?");
  if (o->window && o->coll != B_ALLREDUCE && o->coll != B_REDUCE_SCATTER && o->coll != B_ALLGATHER)
    return dt_cli_usage_error("bench", "--window with allreduce, reduce_scatter or allgather",
                              "%s has no in-place window path", coll_names[o->coll]);
  if (o->in_place && o->coll != B_ALLREDUCE && o->coll != B_REDUCE_SCATTER && o->coll != B_ALLGATHER)
    return dt_cli_usage_error("bench", "--in-place with allreduce, reduce_scatter or allgather",
                              "%s has no in-place form", coll_names[o->coll]);
  if (o->in_place && o->fresh)
    return dt_cli_usage_error("bench", "--in-place or --fresh", "in place every input is rewritten before each call "
                              "already");
  o->in_place |= o->window;
  if (o->window && o->nproc < 2)
    return dt_cli_usage_error("bench", "--window with -n 2 or more", "one rank shares no memory with another");
  if (op_given && o->coll != B_ALLREDUCE && o->coll != B_REDUCE_SCATTER)
    return dt_cli_usage_error("bench", "--op with allreduce or reduce_scatter", "%s reduces nothing: --op %s would "
                              "not be used", coll_names[o->coll], dt_op_name(o->op));
  if (o->window && o->transport && strcmp(o->transport, "shm"))
    return dt_cli_usage_error("bench", "--window needs --transport shm (all ranks share memory)",
                              "--transport %s has no shared window", o->transport);
  if (o->hugepages && dt__thp_enabled() != 1)
    return dt_cli_usage_error("bench", "--hugepages where transparent huge pages are 'always' or 'madvise'",
                              "transparent huge pages are not on here (/sys/kernel/mm/transparent_hugepage/enabled)");
  /* Each size is rounded down to whole elements (per rank, where each rank owns a block); sizes
   * below one are skipped (a row would time a call that moves nothing), and some must remain. */
  uint64_t top = o->lo; /* the largest size measured: lo, 2 lo, ... up to hi */
  while (top <= o->hi / 2)
    top *= 2;
  if (top < bench_unit(o, o->nproc))
    return dt_cli_usage_error("bench", "--sizes LO:HI with HI at least one element (per rank for allgather, reduce_scatter and alltoall)",
                              "--sizes measures up to %llu bytes, less than one %s element%s (%llu bytes)",
                              (unsigned long long)top, dt_dtype_name(o->dtype),
                              o->coll != B_ALLREDUCE && o->coll != B_BROADCAST ? " per rank" : "",
                              (unsigned long long)bench_unit(o, o->nproc));
  return 0;
}

/* ---------------- worker ---------------- */

/* Input of rank r at element i, chosen so every reduction is exact in every dtype up to 8
 * ranks (sums <= 252 fit u8 and bf16's 8 bits; products are small powers of two). */
static double input_value(dt_op op, int r, size_t i) {
  switch (op) {
  case DT_PROD: return ((i + (size_t)r) % 4 == 0) ? 2 : 1;
  case DT_MIN: case DT_MAX: return (double)(((size_t)r * 3 + i) % 11);
  default: return (double)((r + 1) * (int)(i % 7 + 1));
  }
}

static double expected_reduce(dt_op op, int n, size_t i, dt_dtype t) {
  double acc = input_value(op, 0, i);
  for (int r = 1; r < n; r++) {
    double v = input_value(op, r, i);
    acc = op == DT_PROD ? acc * v : op == DT_MIN ? fmin(acc, v) : op == DT_MAX ? fmax(acc, v) : acc + v;
  }
  if (t == DT_U8 && (op == DT_SUM || op == DT_AVG || op == DT_PROD))
    acc = (double)((uint64_t)acc & 0xff);
  if (op == DT_AVG)
    acc = (t == DT_F32 || t == DT_F64 || t == DT_F16 || t == DT_BF16) ? acc / n : (double)((int64_t)acc / n);
  return acc;
}

static void put(void *buf, size_t i, dt_dtype t, double v) {
  switch (t) {
  case DT_F32: ((float *)buf)[i] = (float)v; break;
  case DT_F64: ((double *)buf)[i] = v; break;
  case DT_F16: ((uint16_t *)buf)[i] = dt__f32_to_f16((float)v); break;
  case DT_BF16: ((uint16_t *)buf)[i] = dt__f32_to_bf16((float)v); break;
  case DT_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
  case DT_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
  default: ((uint8_t *)buf)[i] = (uint8_t)v; break;
  }
}

static double get(const void *buf, size_t i, dt_dtype t) {
  switch (t) {
  case DT_F32: return ((const float *)buf)[i];
  case DT_F64: return ((const double *)buf)[i];
  case DT_F16: return dt__f16_to_f32(((const uint16_t *)buf)[i]);
  case DT_BF16: return dt__bf16_to_f32(((const uint16_t *)buf)[i]);
  case DT_I32: return ((const int32_t *)buf)[i];
  case DT_I64: return (double)((const int64_t *)buf)[i];
  default: return ((const uint8_t *)buf)[i];
  }
}

/* Exact dtypes must match exactly; avg of floats is one rounded division. */
static int differs(double got, double want, dt_dtype t) {
  double tol = t == DT_F16 ? 1.0 / 1024 : t == DT_BF16 ? 1.0 / 128 : t == DT_F32 ? 1e-6 : t == DT_F64 ? 1e-14 : 0;
  return !(fabs(got - want) <= tol * fmax(1.0, fabs(want)));
}

typedef struct bench_size {
  size_t bytes;  /* the size column */
  size_t count;  /* elements per rank per block (the API's count) */
  size_t total;  /* the count column: elements of the size */
  double factor; /* busbw / algbw */
} bench_size;

static bench_size size_of(bench_coll k, uint64_t bytes, dt_dtype t, int n) {
  bench_size s;
  size_t es = dt_dtype_size(t);
  switch (k) {
  case B_ALLREDUCE: s.count = bytes / es; s.total = s.count; s.factor = 2.0 * (n - 1) / n; break;
  case B_BROADCAST: s.count = bytes / es; s.total = s.count; s.factor = 1; break;
  default: s.count = bytes / es / (size_t)n; s.total = s.count * (size_t)n; s.factor = (double)(n - 1) / n; break;
  }
  s.bytes = s.total * es;
  return s;
}

/* Fills the send side (and poisons the receive side) for one size. */
static void fill_inputs(const bench_opts *o, int r, int n, const bench_size *s, void *sbuf, void *rbuf) {
  dt_dtype t = o->dtype;
  size_t es = dt_dtype_size(t);
  switch (o->coll) {
  case B_ALLREDUCE:
    for (size_t i = 0; i < s->count; i++)
      put(sbuf, i, t, input_value(o->op, r, i));
    memset(rbuf, 0xa5, s->count * es);
    break;
  case B_REDUCE_SCATTER:
    for (size_t i = 0; i < s->count * (size_t)n; i++)
      put(sbuf, i, t, input_value(o->op, r, i));
    memset(rbuf, 0xa5, s->count * es);
    break;
  case B_ALLGATHER:
    for (size_t i = 0; i < s->count; i++)
      put(sbuf, i, t, input_value(DT_SUM, r, i));
    memset(rbuf, 0xa5, s->count * (size_t)n * es);
    break;
  case B_ALLTOALL:
    for (size_t i = 0; i < s->count * (size_t)n; i++)
      put(sbuf, i, t, input_value(DT_SUM, r, i));
    memset(rbuf, 0xa5, s->count * (size_t)n * es);
    break;
  case B_BROADCAST:
    if (r == 0)
      for (size_t i = 0; i < s->count; i++)
        put(rbuf, i, t, input_value(DT_SUM, 0, i));
    else
      memset(rbuf, 0xa5, s->count * es);
    break;
  default:
    break;
  }
}

static int64_t count_wrong(const bench_opts *o, int r, int n, const bench_size *s, const void *rbuf) {
  dt_dtype t = o->dtype;
  int64_t wrong = 0;
  switch (o->coll) {
  case B_ALLREDUCE:
    for (size_t i = 0; i < s->count; i++)
      wrong += differs(get(rbuf, i, t), expected_reduce(o->op, n, i, t), t);
    break;
  case B_REDUCE_SCATTER:
    for (size_t j = 0; j < s->count; j++)
      wrong += differs(get(rbuf, j, t), expected_reduce(o->op, n, (size_t)r * s->count + j, t), t);
    break;
  case B_ALLGATHER:
    for (int q = 0; q < n; q++)
      for (size_t j = 0; j < s->count; j++)
        wrong += differs(get(rbuf, (size_t)q * s->count + j, t), input_value(DT_SUM, q, j), t);
    break;
  case B_ALLTOALL:
    for (int q = 0; q < n; q++)
      for (size_t j = 0; j < s->count; j++)
        wrong += differs(get(rbuf, (size_t)q * s->count + j, t), input_value(DT_SUM, q, (size_t)r * s->count + j), t);
    break;
  case B_BROADCAST:
    for (size_t i = 0; i < s->count; i++)
      wrong += differs(get(rbuf, i, t), input_value(DT_SUM, 0, i), t);
    break;
  default:
    break;
  }
  return wrong;
}

/* --in-place, --window: the input in place in the output (rbuf) instead of in sbuf, as the call
 * expects. */
static void fill_in_place(const bench_opts *o, int r, int n, const bench_size *s, void *rbuf) {
  dt_dtype t = o->dtype;
  size_t es = dt_dtype_size(t);
  if (o->coll == B_ALLGATHER) {
    memset(rbuf, 0xa5, s->count * (size_t)n * es);
    for (size_t i = 0; i < s->count; i++)
      put((char *)rbuf + (size_t)r * s->count * es, i, t, input_value(DT_SUM, r, i));
    return;
  }
  size_t m = o->coll == B_REDUCE_SCATTER ? s->count * (size_t)n : s->count;
  for (size_t i = 0; i < m; i++)
    put(rbuf, i, t, input_value(o->op, r, i));
}

static dt_status run_once(dt_comm *c, const bench_opts *o, const bench_size *s, const void *sbuf, void *rbuf) {
  if (o->in_place)
    switch (o->coll) {
    case B_ALLREDUCE: return dt_comm_allreduce(c, DT_IN_PLACE, rbuf, s->count, o->dtype, o->op);
    case B_REDUCE_SCATTER: return dt_comm_reduce_scatter(c, DT_IN_PLACE, rbuf, s->count, o->dtype, o->op);
    default: return dt_comm_allgather(c, DT_IN_PLACE, rbuf, s->count, o->dtype);
    }
  switch (o->coll) {
  case B_ALLREDUCE: return dt_comm_allreduce(c, sbuf, rbuf, s->count, o->dtype, o->op);
  case B_ALLGATHER: return dt_comm_allgather(c, sbuf, rbuf, s->count, o->dtype);
  case B_REDUCE_SCATTER: return dt_comm_reduce_scatter(c, sbuf, rbuf, s->count, o->dtype, o->op);
  case B_BROADCAST: return dt_comm_broadcast(c, rbuf, s->count, o->dtype, 0);
  default: return dt_comm_alltoall(c, sbuf, rbuf, s->count, o->dtype);
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The ranks are bound to their share of the CPUs (DTRAIN_BIND=auto unless the user set
 * DTRAIN_BIND, see comm/bind.c), as mpirun binds its ranks by default (--bind-to core for 2
 * ranks), so that the two sides are measured alike: two unbound ranks that land on one CPU's
 * run queue wait a whole time slice for each other (2 ranks, 32 KiB, load average 13: a 10 ms
 * median in one run of four). Returns the number of CPUs this process may use. */
static int bench_cpus(void) {
  cpu_set_t s;
  return sched_getaffinity(0, sizeof s, &s) == 0 ? CPU_COUNT(&s) : 0;
}

/* A buffer for the calls: from dt__alloc, or with --hugepages 2 MiB aligned, whole huge pages
 * long and advised onto transparent huge pages before anything touches it. */
static void *bench_alloc(size_t n, int huge) {
  if (!huge)
    return dt__alloc(n);
  const size_t h = 2u << 20;
  void *p = NULL;
  if (posix_memalign(&p, h, (n + h - 1) / h * h))
    return NULL;
  (void)madvise(p, (n + h - 1) / h * h, MADV_HUGEPAGE); /* a hint: without it the pages stay small */
  return p;
}

static int bench_worker(const bench_opts *o) {
  dt_comm *c = NULL;
  setenv("DTRAIN_BIND", "auto", 0);
  int cpus_before = bench_cpus();
  if (dt_comm_create(NULL, &c))
    return dt_cli_fail("bench", "cannot join the job");
  int r = dt_comm_rank(c), n = dt_comm_size(c), rc = 1;
  int bound = bench_cpus() < cpus_before;
  size_t es = dt_dtype_size(o->dtype);
  size_t cap = (size_t)o->hi + (size_t)n * es + 64;
  char *sbuf = bench_alloc(cap, o->hugepages), *rbuf = NULL;
  if (o->window) {
    void *w = NULL;
    if (dt_comm_window(c, cap, &w)) {
      fprintf(stderr, "dtrain bench: rank %d: no shared window: %s\n", r, dt_last_error());
      dt__free(sbuf);
      dt_comm_destroy(c);
      return 1;
    }
    rbuf = w;
  } else {
    rbuf = bench_alloc(cap, o->hugepages);
  }
  double *times = malloc(sizeof(double) * (size_t)o->iters);
  int64_t total_wrong = 0;
  /* --json: the rows are kept and printed as one array once every size ran, so that a run that
   * fails or times out leaves nothing rather than an array that does not parse */
  char *jbuf = NULL;
  size_t jlen = 0;
  FILE *js = r == 0 && o->json ? open_memstream(&jbuf, &jlen) : NULL;
  if (!sbuf || !rbuf || !times || (r == 0 && o->json && !js)) {
    fprintf(stderr, "dtrain bench: rank %d: out of memory for %zu-byte buffers\n", r, cap);
    goto done;
  }
  if (r == 0) {
    if (o->json) {
      fputs("[", js);
    } else {
      printf("# dtrain bench %s: %d ranks, transport %s, algo %s, dtype %s, op %s, iters %d, warmup %d%s%s\n",
             coll_names[o->coll], n, dt_comm_transport(c), o->algo ? o->algo : "auto", dt_dtype_name(o->dtype),
             dt_op_name(o->op), o->iters, o->warmup, o->window ? ", in place in the shared window" : o->in_place ? ", in place" : "",
             o->hugepages ? ", buffers on huge pages" : "");
      printf("# time: median over iterations of the slowest rank's time (ranks start together after a barrier)\n");
      if (o->lo < bench_unit(o, n))
        printf("# sizes below %llu bytes skipped: less than one element%s\n", (unsigned long long)bench_unit(o, n),
               o->coll != B_ALLREDUCE && o->coll != B_BROADCAST ? " per rank" : "");
      printf("# ranks %s\n", !bound ? "not bound (one rank, or DTRAIN_BIND=none)"
                             : n > cpus_before ? "bound round-robin, local rank i to CPU i mod CPUs (DTRAIN_BIND=auto; more ranks than CPUs)"
                                               : "bound to their share of the CPUs (DTRAIN_BIND=auto, as mpirun binds)");
      printf("#%11s %12s %6s %6s %11s %9s %9s %8s\n", "size(B)", "count", "type", "redop", "time(us)", "algbw",
             "busbw", "#wrong");
      printf("#%11s %12s %6s %6s %11s %9s %9s %8s\n", "", "(elements)", "", "", "", "(GB/s)", "(GB/s)", "");
    }
    fflush(stdout);
  }
  int rows = 0;
  for (uint64_t b = o->lo; b <= o->hi; b *= 2) {
    if (b < bench_unit(o, o->nproc))
      continue;
    bench_size s = size_of(o->coll, b, o->dtype, n);
    if (!o->in_place)
      fill_inputs(o, r, n, &s, sbuf, rbuf);
    int64_t wrong = 0;
    for (int it = 0; it < o->warmup + o->iters; it++) {
      if (o->in_place || (o->fresh && it > 0)) {
        /* every rank out of the last call first: with more ranks than cores, a rank refilling
         * its input would take the core from one still in the call, and that shows in its time */
        if (it > 0 && dt_comm_barrier(c))
          goto fail;
        if (o->in_place)
          fill_in_place(o, r, n, &s, rbuf);
        else
          fill_inputs(o, r, n, &s, sbuf, rbuf);
      }
      if (o->coll == B_BROADCAST && r != 0 && it > 0)
        memset(rbuf, 0xa5, s.count * es);
      if (dt_comm_barrier(c))
        goto fail;
      int64_t t0 = dt_now_ns();
      if (run_once(c, o, &s, sbuf, rbuf))
        goto fail;
      int64_t t1 = dt_now_ns();
      if (it >= o->warmup)
        times[it - o->warmup] = (double)(t1 - t0) / 1e3;
      if (it < o->warmup || it == 0 || it == o->warmup + o->iters - 1)
        wrong += count_wrong(o, r, n, &s, rbuf);
    }
    if (dt_comm_allreduce(c, DT_IN_PLACE, times, (size_t)o->iters, DT_F64, DT_MAX) ||
        dt_comm_allreduce(c, DT_IN_PLACE, &wrong, 1, DT_I64, DT_SUM))
      goto fail;
    total_wrong += wrong;
    qsort(times, (size_t)o->iters, sizeof(double), cmp_double);
    double us = o->iters % 2 ? times[o->iters / 2] : (times[o->iters / 2 - 1] + times[o->iters / 2]) / 2;
    double algbw = us > 0 ? (double)s.bytes / (us * 1e3) : 0, busbw = algbw * s.factor;
    if (r == 0) {
      if (o->json) {
        fprintf(js, "%s\n  {\"bytes\": %zu, \"count\": %zu, \"dtype\": \"%s\", \"time_us\": ", rows ? "," : "",
                s.bytes, s.total, dt_dtype_name(o->dtype));
        dt__json_num(js, "%.3f", us);
        fputs(", \"algbw_gbs\": ", js);
        dt__json_num(js, "%.4f", algbw);
        fputs(", \"busbw_gbs\": ", js);
        dt__json_num(js, "%.4f", busbw);
        fprintf(js, ", \"wrong\": %lld}", (long long)wrong);
      } else {
        printf(" %11zu %12zu %6s %6s %11.2f %9.3f %9.3f %8lld\n", s.bytes, s.total, dt_dtype_name(o->dtype),
               o->coll == B_ALLREDUCE || o->coll == B_REDUCE_SCATTER ? dt_op_name(o->op) : "-", us, algbw, busbw,
               (long long)wrong);
      }
      fflush(stdout);
    }
    rows++;
    if (b > UINT64_MAX / 2)
      break;
  }
  if (js) {
    fclose(js);
    js = NULL;
    printf("%s\n]\n", jbuf);
    fflush(stdout);
  }
  if (r == 0 && !o->hugepages && !o->json && !o->window) {
    unsigned long kib = bench_huge_kib(sbuf, rbuf, cap);
    if (kib)
      printf("# %lu MiB of rank 0's buffers ended on huge pages (the shm transport collapses large buffers it meets "
             "twice; DTRAIN_SHM_THP=off leaves them alone)\n", kib >> 10);
  }
  if (r == 0 && o->hugepages) {
    unsigned long kib = bench_huge_kib(sbuf, o->window ? NULL : rbuf, cap);
    if (!o->json)
      printf("# --hugepages: %lu MiB of rank 0's buffers on huge pages\n", kib >> 10);
    if (!kib)
      fprintf(stderr, "dtrain bench: warning: --hugepages: the kernel backed none of rank 0's buffers with huge "
                      "pages (memory too fragmented?); the rows measured small pages\n");
  }
  if (total_wrong) {
    if (r == 0)
      fprintf(stderr, "dtrain bench: error: %lld wrong elements\n", (long long)total_wrong);
    goto done;
  }
  rc = 0;
  goto done;
fail:
  fprintf(stderr, "dtrain bench: error: %s\n", dt_last_error());
done:
  if (js)
    fclose(js);
  free(jbuf);
  dt__free(sbuf);
  if (!o->window)
    dt__free(rbuf);
  free(times);
  dt_comm_destroy(c);
  return rc;
}

/* ---------------- launcher side ---------------- */

/* A port that was free a moment ago on 127.0.0.1 (bind port 0, read it back). */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  int port = -1;
  if (fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a) && !getsockname(fd, (struct sockaddr *)&a, &len))
    port = ntohs(a.sin_port);
  if (fd >= 0)
    close(fd);
  return port;
}

static void hex(char *out, const unsigned char *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    sprintf(out + 2 * i, "%02x", b[i]);
}

int dt_cli_bench(int argc, char **argv) {
  bench_opts o;
  int worker;
  int rc = bench_parse(argc, argv, &o, &worker);
  if (rc)
    return rc < 0 ? 0 : rc;
  if (worker)
    return bench_worker(&o);

  if (o.transport)
    setenv("DTRAIN_TRANSPORT", o.transport, 1);
  if (o.algo) {
    char a[128];
    if (o.coll == B_ALLREDUCE)
      snprintf(a, sizeof a, "%s", o.algo);
    else
      snprintf(a, sizeof a, "%s=%s", coll_names[o.coll], o.algo);
    setenv("DTRAIN_ALGO", a, 1);
    if (dt__coll_algo_validate())
      return dt_cli_usage_error("bench", "see DTRAIN_ALGO in dtrain/comm.h", "--algo %s: %s", o.algo, dt_last_error());
  }
  char num[32];
  snprintf(num, sizeof num, "%d", o.nproc);
  setenv("DTRAIN_WORLD_SIZE", num, 1);
  setenv("DTRAIN_LOCAL_WORLD_SIZE", num, 1);
  setenv("DTRAIN_MASTER_ADDR", "127.0.0.1", 1);
  int port = free_port();
  if (port <= 0)
    return dt_cli_fail("bench", "cannot find a free port for the rendezvous store");
  snprintf(num, sizeof num, "%d", port);
  setenv("DTRAIN_MASTER_PORT", num, 1);
  unsigned char rnd[40];
  char id[17], secret[65];
  if (dt__random_bytes(rnd, sizeof rnd))
    return dt_cli_fail("bench", "cannot draw a job secret");
  hex(id, rnd, 8);
  hex(secret, rnd + 8, 32);
  memset(rnd, 0, sizeof rnd);
  setenv("DTRAIN_JOB_ID", id, 1);
  setenv("DTRAIN_JOB_SECRET", secret, 1);
  memset(secret, 0, sizeof secret);

  static char self[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0)
    return dt_cli_fail("bench", "cannot find the dtrain executable (/proc/self/exe)");
  self[len] = '\0';
  /* worker argv: dtrain bench --worker <our arguments> */
  char **wargv = calloc((size_t)argc + 3, sizeof *wargv);
  if (!wargv)
    return dt_cli_fail("bench", "out of memory");
  wargv[0] = self;
  wargv[1] = "bench";
  wargv[2] = "--worker";
  for (int i = 1; i < argc; i++)
    wargv[i + 2] = argv[i];

  dt_launch_opts lo = {
      .nproc = o.nproc, .nnodes = 1, .node_rank = 0, .master_port = port, .out_mode = DT_OUT_RANK0,
      .raw_stdout = true, .kill_after_ms = 2000, .timeout_ms = (int64_t)o.timeout_s * 1000, .tail_lines = 5,
      .argv = wargv, .exec_path = self,
  };
  snprintf(lo.master_addr, sizeof lo.master_addr, "127.0.0.1");
  dt_out *out = dt__out_create(o.nproc, 0, DT_OUT_RANK0, true, 5);
  if (!out) {
    free(wargv);
    return dt_cli_fail("bench", "out of memory for %d ranks", o.nproc);
  }
  dt_job job;
  if (dt__launch_start(&job, &lo, out)) {
    dt__out_destroy(out);
    free(wargv);
    return dt_cli_fail("bench", "cannot start the ranks");
  }
  dt__launch_supervise(&job);
  rc = 0;
  if (job.outcome != DT_JOB_OK) {
    dt__out_settle(out);
    rc = 1;
    if (job.outcome == DT_JOB_TIMED_OUT) {
      fprintf(stderr, "dtrain bench: timed out after %d s (--timeout); ranks stopped\n", o.timeout_s);
    } else if (job.outcome == DT_JOB_SIGNALED) {
      fprintf(stderr, "dtrain bench: stopped by %s\n", dt__signal_name(job.stop_signal));
    } else if (job.first_failed >= 0) {
      const dt_worker *w = &job.w[job.first_failed];
      if (w->sig)
        fprintf(stderr, "dtrain bench: rank %d was killed by %s\n", w->rank, dt__signal_name(w->sig));
      else if (w->exec_errno)
        fprintf(stderr, "dtrain bench: rank %d could not start: %s\n", w->rank, strerror(w->exec_errno));
      else
        fprintf(stderr, "dtrain bench: rank %d failed with exit code %d\n", w->rank, w->code);
      if (dt__out_tail_count(out, job.first_failed) > 0) {
        fprintf(stderr, "dtrain bench: last lines of rank %d:\n", w->rank);
        fflush(stderr);
        dt__out_write_tail(out, job.first_failed, 2, "  ");
      }
    } else {
      fprintf(stderr, "dtrain bench: the run failed\n");
    }
  }
  dt__launch_finish(&job);
  dt__out_destroy(out);
  free(wargv);
  return rc;
}
