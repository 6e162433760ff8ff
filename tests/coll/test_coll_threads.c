/* test_coll_threads.c - communicators driven at the same time by different threads of each rank.
 *
 * A communicator is used by one application thread at a time (comm.h), but nothing stops an
 * application from driving several at once: a gradient thread on one, the main thread's
 * barriers and metrics on another, a split per pipeline stage. Each rank here makes the world
 * communicator W and two splits of it with every rank (D1 in rank order, D2 reversed), then
 * three threads run random sequences of collectives on W, D1 and D2 at once: allreduce (f32,
 * f64, i32; sum, max; in place or not), allgather, reduce_scatter, broadcast from a random root,
 * alltoall, barrier, and nonblocking batches of two; counts from 1 to 300,000 elements; on shm
 * half the in-place allreduces run in each communicator's shared window. Values
 * are small integers, so every result is exact and checked element by element, with the bytes
 * after each output untouched. Every rank draws the same sequence per communicator (its seed).
 * Then the world communicator is destroyed while the splits go on with one more call each
 * (a split may outlive its parent). Also run under TSan by scripts/test.
 *
 * --mismatch: one rank changes one call (its count, or a barrier becomes an allreduce) on one of
 * the three communicators, picked by the seed. That call fails on every rank naming both calls,
 * the threads in the other communicators' calls fail with the same verdict (or had finished),
 * and any later call on any of them fails naming it, within 20 s. --kill: one rank is SIGKILLed
 * before one call of one communicator instead; the others fail, each thread naming it, likewise.
 *
 *   test_coll_threads TRANSPORT SIZES ITERS [--mismatch|--kill]   e.g. test_coll_threads shm 2,3,4 40 */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/mp.h"
#include "coll/sweep.h"

#define GUARD 64 /* bytes after each output that must stay 0xA5 */

typedef struct {
  dt_comm *c;
  int which, world_rank, iters;
  int perturb; /* the call this rank changes (--mismatch) or dies before (--kill), or -1 */
  bool kill;
  uint64_t seed;
  dt_status st; /* of the failed call */
  char err[1024];
} job;

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/* the value rank r contributes at element i of call k: a small integer, exact in every dtype */
static int val(uint64_t k, int r, size_t i) { return (int)(mix(k * 1315423911u + (uint64_t)r * 2654435761u + i) % 201) - 100; }

static void put(void *b, dt_dtype t, size_t i, int v) {
  if (t == DT_F32)
    ((float *)b)[i] = (float)v;
  else if (t == DT_F64)
    ((double *)b)[i] = v;
  else
    ((int32_t *)b)[i] = v;
}
static int get(const void *b, dt_dtype t, size_t i) {
  if (t == DT_F32)
    return (int)((const float *)b)[i];
  if (t == DT_F64)
    return (int)((const double *)b)[i];
  return ((const int32_t *)b)[i];
}

#define FAILJ(...)                                                                                 \
  do {                                                                                             \
    j->st = st;                                                                                    \
    snprintf(j->err, sizeof j->err, __VA_ARGS__);                                                  \
    goto out;                                                                                      \
  } while (0)

static void *drive(void *arg) {
  job *j = arg;
  const int n = dt_comm_size(j->c), me = dt_comm_rank(j->c);
  static const char *names[] = {"world", "split", "reversed split"};
  const size_t maxc = 300000;
  /* the largest buffer: an allgather or alltoall of maxc / n per rank, or maxc for the rest */
  size_t cap = (maxc + 8) * 8 + GUARD;
  unsigned char *in = malloc(cap), *out = malloc(cap), *in2 = malloc(cap), *out2 = malloc(cap);
  dt_status st = DT_OK;
  unsigned char *win = NULL;
  if (!in || !out || !in2 || !out2)
    FAILJ("malloc");
  if (!strcmp(getenv("DTRAIN_TRANSPORT"), "shm") &&
      (st = dt_comm_window(j->c, cap + 64 * 64, (void **)&win)) != DT_OK)
    FAILJ("%s communicator: dt_comm_window: %s: %s", names[j->which], dt_strerror(st), dt_last_error());
  for (int it = 0; it < j->iters; it++) {
    uint64_t k = mix(j->seed * 7919 + (uint64_t)j->which * 104729 + (uint64_t)it);
    int kind = (int)(k % 8);
    static const dt_dtype types[] = {DT_F32, DT_F64, DT_I32};
    dt_dtype t = types[(k >> 8) % 3];
    dt_op op = (k >> 12) % 2 ? DT_MAX : DT_SUM;
    size_t es = dt_dtype_size(t);
    size_t count = (k >> 16) % 4 == 0 ? 1 + (k >> 20) % 300000 : 1 + (k >> 20) % 3000;
    if (kind == 2 || kind == 3 || kind == 5) /* per-rank blocks */
      count = 1 + count / (size_t)n;
    if (it == j->perturb && j->kill) /* --kill: no goodbye, no destroy: as a crash */
      kill(getpid(), SIGKILL);
    if (it == j->perturb) /* --mismatch: this rank's call differs from the others' */
      count = count > 1 && kind != 4 ? count - 1 : count + 1, kind = kind == 4 ? 0 : kind;
    bool inplace = (k >> 40) % 3 == 0;
    int root = (int)((k >> 44) % (uint64_t)n);
    /* elements out: size * count for the gathers, count for the rest (reduce_scatter takes
     * size * count in) */
    size_t nout = kind == 2 || kind == 5 ? count * (size_t)n : count;
    /* in-place allreduces in the communicator's shared window (shm) half the time, at an offset
     * every rank shares; the rest of the window stays the caller's (the guard bytes) */
    unsigned char *o = out;
    if (win && (kind == 0 || kind == 6) && inplace && (k >> 48) % 2)
      o = win + ((k >> 52) % 64) * 64;
    memset(o, 0xA5, nout * es + GUARD);
    const char *what = "";
    switch (kind) {
    case 0: /* allreduce */
    case 6: /* two nonblocking allreduces, the second on in2/out2 */
      what = kind == 0 ? "allreduce" : "two iallreduce";
      for (size_t i = 0; i < count; i++)
        put(inplace ? o : in, t, i, val(k, me, i));
      if (kind == 0) {
        st = dt_comm_allreduce(j->c, inplace ? DT_IN_PLACE : in, o, count, t, op);
      } else {
        for (size_t i = 0; i < count; i++)
          put(in2, t, i, val(k + 1, me, i));
        memset(out2, 0xA5, count * es + GUARD);
        dt_request *r1 = NULL, *r2 = NULL;
        st = dt_comm_iallreduce(j->c, inplace ? DT_IN_PLACE : in, o, count, t, op, &r1);
        if (st == DT_OK)
          st = dt_comm_iallreduce(j->c, in2, out2, count, t, op, &r2);
        dt_status s1 = r1 ? dt_request_wait(r1) : st, s2 = r2 ? dt_request_wait(r2) : st;
        st = s1 ? s1 : s2;
      }
      break;
    case 1:
      what = "broadcast";
      for (size_t i = 0; i < count; i++)
        put(o, t, i, me == root ? val(k, root, i) : 7);
      st = dt_comm_broadcast(j->c, o, count, t, root);
      break;
    case 2:
      what = "allgather";
      for (size_t i = 0; i < count; i++)
        put(inplace ? o + (size_t)me * count * es : in, t, i, val(k, me, i));
      st = dt_comm_allgather(j->c, inplace ? DT_IN_PLACE : in, o, count, t);
      break;
    case 3:
      what = "reduce_scatter";
      for (size_t i = 0; i < count * (size_t)n; i++)
        put(in, t, i, val(k, me, i));
      st = dt_comm_reduce_scatter(j->c, in, o, count, t, op);
      break;
    case 4:
      what = "barrier";
      st = dt_comm_barrier(j->c);
      nout = 0;
      break;
    case 5:
      what = "alltoall";
      for (size_t i = 0; i < count * (size_t)n; i++)
        put(in, t, i, val(k, me, i));
      st = dt_comm_alltoall(j->c, in, o, count, t);
      break;
    default: /* 7: a nonblocking barrier and broadcast together */
      what = "ibarrier + ibroadcast";
      for (size_t i = 0; i < count; i++)
        put(o, t, i, me == root ? val(k, root, i) : 7);
      {
        dt_request *r1 = NULL, *r2 = NULL;
        st = dt_comm_ibarrier(j->c, &r1);
        if (st == DT_OK)
          st = dt_comm_ibroadcast(j->c, o, count, t, root, &r2);
        dt_status s1 = r1 ? dt_request_wait(r1) : st, s2 = r2 ? dt_request_wait(r2) : st;
        st = s1 ? s1 : s2;
      }
      break;
    }
    if (st != DT_OK)
      FAILJ("%s communicator, call %d (%s of %zu): %s: %s", names[j->which], it, what, count, dt_strerror(st),
            dt_last_error());
    for (size_t i = 0; i < nout; i++) {
      int want;
      if (kind == 0 || kind == 6 || kind == 3) {
        size_t gi = kind == 3 ? (size_t)me * count + i : i;
        want = op == DT_SUM ? 0 : -1000;
        for (int r = 0; r < n; r++)
          want = op == DT_SUM ? want + val(k, r, gi) : (val(k, r, gi) > want ? val(k, r, gi) : want);
      } else if (kind == 1 || kind == 7) {
        want = val(k, root, i);
      } else if (kind == 2) {
        want = val(k, (int)(i / count), i % count);
      } else { /* alltoall: block r of my output is block me of rank r's input */
        want = val(k, (int)(i / count), (size_t)me * count + i % count);
      }
      if (get(o, t, i) != want)
        FAILJ("%s communicator, call %d (%s of %zu, dtype %d): element %zu is %d, expected %d", names[j->which], it,
              what, count, (int)t, i, get(o, t, i), want);
    }
    for (size_t g = 0; g < GUARD; g++)
      if (o[nout * es + g] != 0xA5)
        FAILJ("%s communicator, call %d (%s of %zu): byte %zu after the output was written", names[j->which], it,
              what, count, g);
    if (kind == 6)
      for (size_t i = 0; i < count; i++) {
        int want = op == DT_SUM ? 0 : -1000;
        for (int r = 0; r < n; r++)
          want = op == DT_SUM ? want + val(k + 1, r, i) : (val(k + 1, r, i) > want ? val(k + 1, r, i) : want);
        if (get(out2, t, i) != want)
          FAILJ("%s communicator, call %d (second iallreduce of %zu): element %zu is %d, expected %d", names[j->which],
                it, count, i, get(out2, t, i), want);
      }
  }
out:
  free(in);
  free(out);
  free(in2);
  free(out2);
  return NULL;
}

typedef struct {
  int iters;
  uint64_t seed;
  bool mismatch, kill;
} params;

/* --mismatch: every thread either ended its calls before the verdict reached it or failed
 * naming the mismatch (" called "), the communicator of the changed call failed on every rank,
 * and every later call on any of the three fails naming it too, all within 20 s. */
static int check_mismatch(int rank, const job *jobs, int bad, dt_comm *const *cs, double t0) {
  CHECK(jobs[bad].err[0], "the changed call on the %s communicator did not fail", bad ? "split" : "world");
  for (int i = 0; i < 3; i++)
    CHECK(!jobs[i].err[0] || strstr(jobs[i].err, " called "), "thread %d failed without naming the mismatch: %s", i,
          jobs[i].err);
  for (int i = 0; i < 3; i++) {
    dt_status st = dt_comm_barrier(cs[i]);
    CHECK(st != DT_OK && strstr(dt_last_error(), " called "), "a barrier on communicator %d after the mismatch: %s: %s",
          i, dt_strerror(st), dt_last_error());
  }
  CHECK(check_now_s() - t0 < 20, "took %.1f s", check_now_s() - t0);
  return 0;
}

/* --kill: every thread either ended its calls before it learned or failed with DT_ERR_PEER or
 * DT_ERR_ABORTED naming the killed rank (world rank `dead`), the communicator of the call it
 * died before failed, and a later call on any of the three fails naming it, within 20 s. */
static int check_kill(int rank, const job *jobs, int bad, int dead, dt_comm *const *cs, double t0) {
  char name[32];
  snprintf(name, sizeof name, "rank %d", dead);
  CHECK(jobs[bad].err[0], "the %s communicator's calls went on after world rank %d died", bad ? "split" : "world",
        dead);
  for (int i = 0; i < 3; i++)
    CHECK(!jobs[i].err[0] || ((jobs[i].st == DT_ERR_PEER || jobs[i].st == DT_ERR_ABORTED) && strstr(jobs[i].err, name)),
          "thread %d failed without naming world rank %d: %s", i, dead, jobs[i].err);
  for (int i = 0; i < 3; i++) {
    dt_status st = dt_comm_barrier(cs[i]);
    CHECK(st != DT_OK && strstr(dt_last_error(), name), "a barrier on communicator %d after world rank %d died: %s: %s",
          i, dead, dt_strerror(st), dt_last_error());
  }
  CHECK(check_now_s() - t0 < 20, "took %.1f s", check_now_s() - t0);
  return 0;
}

static int body(int rank, int size, void *arg) {
  const params *P = arg;
  dt_comm *w = sw_join(rank), *d[2] = {NULL, NULL};
  CHECK(w, "join failed");
  CHECK(dt_comm_split(w, 0, rank, &d[0]) == DT_OK, "split: %s", dt_last_error());
  CHECK(dt_comm_split(w, 0, size - rank, &d[1]) == DT_OK, "reversed split: %s", dt_last_error());
  CHECK(dt_comm_rank(d[1]) == size - 1 - rank, "reversed split: rank %d", dt_comm_rank(d[1]));
  job jobs[3];
  dt_comm *cs[3] = {w, d[0], d[1]};
  pthread_t th[3];
  /* --mismatch: which communicator, which rank and which call, from the seed */
  const uint64_t h = mix(P->seed + 99);
  const int bad = (int)(h % 3), bad_rank = (int)((h >> 8) % (uint64_t)size), bad_call = 2 + (int)((h >> 16) % 8);
  double t0 = check_now_s();
  for (int i = 0; i < 3; i++) {
    jobs[i] = (job){.c = cs[i], .which = i, .world_rank = rank, .iters = P->iters, .seed = P->seed, .perturb = -1};
    if ((P->mismatch || P->kill) && i == bad && rank == bad_rank)
      jobs[i].perturb = bad_call, jobs[i].kill = P->kill;
    CHECK(pthread_create(&th[i], NULL, drive, &jobs[i]) == 0, "pthread_create");
  }
  for (int i = 0; i < 3; i++)
    pthread_join(th[i], NULL);
  if (P->mismatch || P->kill) {
    int rc = P->kill ? check_kill(rank, jobs, bad, bad_rank, cs, t0) : check_mismatch(rank, jobs, bad, cs, t0);
    for (int i = 2; i >= 0; i--)
      dt_comm_destroy(cs[i]);
    return rc;
  }
  for (int i = 0; i < 3; i++)
    CHECK(!jobs[i].err[0], "seed %llu: %s", (unsigned long long)P->seed, jobs[i].err);
  dt_comm_destroy(w); /* the splits outlive it */
  for (int i = 0; i < 2; i++) {
    int32_t v = rank + 1;
    CHECK(dt_comm_allreduce(d[i], DT_IN_PLACE, &v, 1, DT_I32, DT_SUM) == DT_OK, "split after the world went: %s",
          dt_last_error());
    CHECK(v == size * (size + 1) / 2, "split after the world went: %d", v);
    dt_comm_destroy(d[i]);
  }
  return 0;
}

int main(int argc, char **argv) {
  bool mismatch = argc == 5 && !strcmp(argv[4], "--mismatch"), killing = argc == 5 && !strcmp(argv[4], "--kill");
  if (argc != 4 && !mismatch && !killing) {
    fprintf(stderr, "usage: test_coll_threads TRANSPORT SIZES ITERS [--mismatch|--kill]\n");
    return 2;
  }
  setenv("DTRAIN_TRANSPORT", argv[1], 1);
  int iters = atoi(argv[3]), failures = 0;
  char *sizes = strdup(argv[2]);
  uint64_t seed = 1;
  for (char *s = strtok(sizes, ","); s; s = strtok(NULL, ","), seed++) {
    int n = atoi(s);
    params P = {iters, seed, mismatch, killing};
    int codes[64] = {0}, f = mp_run_codes(n, body, &P, 240, codes);
    if (killing) { /* the rank the seed picked died of SIGKILL, the others exited 0 */
      int dead = (int)((mix(seed + 99) >> 8) % (uint64_t)n);
      f = 0;
      for (int r = 0; r < n; r++)
        f += r == dead ? codes[r] != 128 + SIGKILL : codes[r] != 0;
    }
    printf("test_coll_threads: %s, %d ranks, 3 communicators x %d calls at once (seed %llu%s): %s\n", argv[1], n,
           iters, (unsigned long long)seed,
           mismatch ? ", one call changed on one rank" : killing ? ", one rank killed" : "", f ? "FAILED" : "ok");
    failures += f;
  }
  free(sizes);
  return failures ? 1 : 0;
}
