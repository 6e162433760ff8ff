/* test_coll_errors.c - mismatched calls, invalid arguments and DTRAIN_ALGO errors, on real
 * processes over shm and tcp.
 *
 * Mismatch: after two good allreduces, rank 1 calls #3 with a different count, dtype, op, a
 * different collective, a different root, or count 0 (rooted collectives too: with two ranks
 * their one transfer doubles as the check, see comm/coll/tree.c); every rank must return DT_ERR_MISMATCH or
 * DT_ERR_ABORTED (never hang, never succeed), and its message must name both sides' calls, e.g.
 * "rank 1 called allreduce #3 with 8 x f32 sum" and "rank 0 called allreduce #3 with 4 x f32 sum".
 * The mismatches run with the automatic algorithm choice and with each allreduce algorithm
 * forced (flat, rd, shm, ring), plus one where the two counts take different algorithms (flat
 * against the chunked shm allreduce), so every path's own detection is exercised.
 * A recv against a barrier or a small allreduce on the other rank fails the same way, at once (on
 * shm nothing of the collective passes through the rings the recv watches).
 * Invalid arguments: DT_ERR_INVALID naming the call on the rank that made it, and the other
 * ranks stop with DT_ERR_ABORTED instead of waiting for it. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/check.h"
#include "common/mp.h"
#include "coll/sweep.h"


typedef enum {
  MM_COUNT, MM_DTYPE, MM_OP, MM_COLL, MM_ROOT, MM_ZERO, MM_COUNT_RD3,
  MM_BCAST_COUNT, MM_REDUCE_ROOT, MM_GATHER_ROOT, MM_SCATTER_ROOT, MM_PATHS, MM_RECV_BARRIER, MM_RECV_ALLREDUCE,
  MM_ALLGATHER_COUNT, MM_RS_OP, MM_BCAST_PATHS, MM_ALLGATHER_PATHS, MM_BARRIER_SMALL, MM_BARRIER_LARGE, MM_N
} mm_kind;
static const char *mm_names[MM_N] = {"count", "dtype", "op", "collective", "root", "zero count", "count (3 ranks)",
                                     "broadcast count", "reduce root", "gather root", "scatter root",
                                     "count across algorithms", "recv against barrier",
                                     "recv against allreduce", "allgather count", "reduce_scatter op",
                                     "broadcast count across algorithms", "allgather count across algorithms",
                                     "barrier against a small allreduce", "barrier against a large allreduce"};

typedef struct job {
  mm_kind kind;
  const char *transport;
  const char *algo; /* DTRAIN_ALGO for every call, NULL: automatic */
} job;

static int mismatch_body(int rank, int size, void *arg) {
  const job *j = arg;
  dt_comm *c = sw_join(rank);
  if (!c)
    return 2;
  if (j->algo)
    setenv("DTRAIN_ALGO", j->algo, 1);
  else
    unsetenv("DTRAIN_ALGO");
  dt__coll_algo_load(c); /* a communicator reads DTRAIN_ALGO when it is made */
  static float a[1 << 19], b[1 << 19];
  for (int i = 0; i < 2; i++)
    CHECK(dt_comm_allreduce(c, a, b, 4, DT_F32, DT_SUM) == DT_OK, "warm-up allreduce: %s", dt_last_error());
  int odd = rank == 1;
  dt_status st;
  const char *mine = NULL, *theirs = NULL; /* substrings every message must hold */
  switch (j->kind) {
  case MM_COUNT:
  case MM_COUNT_RD3:
    st = dt_comm_allreduce(c, a, b, odd ? 8 : 4, DT_F32, DT_SUM);
    theirs = "rank 1 called allreduce #3 with 8 x f32 sum";
    mine = "rank 0 called allreduce #3 with 4 x f32 sum";
    break;
  case MM_DTYPE:
    st = dt_comm_allreduce(c, a, b, 4, odd ? DT_F64 : DT_F32, DT_SUM);
    theirs = "rank 1 called allreduce #3 with 4 x f64 sum";
    mine = "rank 0 called allreduce #3 with 4 x f32 sum";
    break;
  case MM_OP:
    st = dt_comm_allreduce(c, a, b, 4, DT_F32, odd ? DT_MAX : DT_SUM);
    theirs = "rank 1 called allreduce #3 with 4 x f32 max";
    mine = "rank 0 called allreduce #3 with 4 x f32 sum";
    break;
  case MM_COLL:
    st = odd ? dt_comm_broadcast(c, a, 4, DT_F32, 0) : dt_comm_allreduce(c, a, b, 4, DT_F32, DT_SUM);
    theirs = "rank 1 called broadcast #3";
    mine = "rank 0 called allreduce #3 with 4 x f32 sum";
    break;
  case MM_ROOT:
    st = dt_comm_broadcast(c, a, 4, DT_F32, odd ? 1 : 0);
    theirs = "rank 1 called broadcast #3 with 4 x f32 from root 1";
    mine = "rank 0 called broadcast #3 with 4 x f32 from root 0";
    break;
  case MM_PATHS:
    /* 4 floats take the small-buffer algorithm, 65536 the large one (automatic choice) */
    st = dt_comm_allreduce(c, a, b, odd ? 65536 : 4, DT_F32, DT_SUM);
    theirs = "rank 1 called allreduce #3 with 65536 x f32 sum";
    mine = "rank 0 called allreduce #3 with 4 x f32 sum";
    break;
  case MM_BCAST_COUNT:
    st = dt_comm_broadcast(c, a, odd ? 6 : 4, DT_F32, 0);
    theirs = "rank 1 called broadcast #3 with 6 x f32 from root 0";
    mine = "rank 0 called broadcast #3 with 4 x f32 from root 0";
    break;
  case MM_REDUCE_ROOT: /* both believe they are the root: both only receive */
    st = dt_comm_reduce(c, a, b, 4, DT_F32, DT_SUM, odd ? 1 : 0);
    theirs = "rank 1 called reduce #3 with 4 x f32 sum to root 1";
    mine = "rank 0 called reduce #3 with 4 x f32 sum to root 0";
    break;
  case MM_GATHER_ROOT: /* both believe the other is the root: both only send */
    st = dt_comm_gather(c, a, b, 4, DT_F32, odd ? 0 : 1);
    theirs = "rank 1 called gather #3 with 4 x f32 to root 0";
    mine = "rank 0 called gather #3 with 4 x f32 to root 1";
    break;
  case MM_SCATTER_ROOT: /* both believe they are the root: both only send */
    st = dt_comm_scatter(c, a, b, 4, DT_F32, odd ? 1 : 0);
    theirs = "rank 1 called scatter #3 with 4 x f32 from root 1";
    mine = "rank 0 called scatter #3 with 4 x f32 from root 0";
    break;
  case MM_RECV_BARRIER: /* point to point against a collective: the shm barrier uses no ring */
    st = odd ? dt_comm_recv(c, a, 4, DT_F32, 0, 1) : dt_comm_barrier(c);
    theirs = "rank 1 called send/recv #1 with 4 x f32 tag 1";
    mine = "rank 0 called barrier #3";
    break;
  case MM_RECV_ALLREDUCE: /* nor does the flat one */
    st = odd ? dt_comm_allreduce(c, a, b, 4, DT_F32, DT_SUM) : dt_comm_recv(c, a, 4, DT_F32, 1, 1);
    theirs = "rank 1 called allreduce #3 with 4 x f32 sum";
    mine = "rank 0 called send/recv #1 with 4 x f32 tag 1";
    break;
  /* the one-round paths of the other collectives (shm: flat at these counts), and each against
   * the path a larger count takes (2 MiB broadcast: tree; 256 KiB blocks: the staged allgather) */
  case MM_ALLGATHER_COUNT:
    st = dt_comm_allgather(c, a, b, odd ? 8 : 4, DT_F32);
    theirs = "rank 1 called allgather #3 with 8 x f32";
    mine = "rank 0 called allgather #3 with 4 x f32";
    break;
  case MM_RS_OP:
    st = dt_comm_reduce_scatter(c, a, b, 4, DT_F32, odd ? DT_MAX : DT_SUM);
    theirs = "rank 1 called reduce_scatter #3 with 4 x f32 max";
    mine = "rank 0 called reduce_scatter #3 with 4 x f32 sum";
    break;
  case MM_BCAST_PATHS:
    st = dt_comm_broadcast(c, a, odd ? 1 << 19 : 4, DT_F32, 0);
    theirs = "rank 1 called broadcast #3 with 524288 x f32 from root 0";
    mine = "rank 0 called broadcast #3 with 4 x f32 from root 0";
    break;
  case MM_ALLGATHER_PATHS:
    st = dt_comm_allgather(c, a, b, odd ? 1 << 16 : 4, DT_F32);
    theirs = "rank 1 called allgather #3 with 65536 x f32";
    mine = "rank 0 called allgather #3 with 4 x f32";
    break;
  /* the shm barrier is a flat round with no data: against the flat allreduce's round, and against
   * a large allreduce that waits on other counters (staging buffers or single copies) */
  case MM_BARRIER_SMALL:
  case MM_BARRIER_LARGE: {
    size_t n = j->kind == MM_BARRIER_SMALL ? 4 : 1 << 16;
    st = odd ? dt_comm_barrier(c) : dt_comm_allreduce(c, a, b, n, DT_F32, DT_SUM);
    theirs = "rank 1 called barrier #3";
    mine = j->kind == MM_BARRIER_SMALL ? "rank 0 called allreduce #3 with 4 x f32 sum"
                                       : "rank 0 called allreduce #3 with 65536 x f32 sum";
    break;
  }
  default: /* MM_ZERO */
    st = dt_comm_allreduce(c, a, b, odd ? 0 : 4, DT_F32, DT_SUM);
    theirs = "rank 1 called allreduce #3 with 0 x f32 sum";
    mine = "rank 0 called allreduce #3 with 4 x f32 sum";
    break;
  }
  const char *msg = dt_last_error();
  /* With 3 ranks, rank 2 is not part of the disagreement: it waits on rank 1, which stops. It
   * learns the verdict through the job abort, or sees rank 1 leave first (DT_ERR_PEER naming
   * rank 1): both end its call well before the deadline. */
  int bystander = size == 3 && rank == 2;
  /* Against a point-to-point call, the rank in the collective learns it from the verdict: as
   * DT_ERR_ABORTED, or as DT_ERR_PEER carrying it when it sees the other rank leave first. */
  int p2p = j->kind == MM_RECV_BARRIER || j->kind == MM_RECV_ALLREDUCE;
  /* A rank still moving a large message over tcp when the other has reported the mismatch and
   * left sees the connection close first: DT_ERR_PEER, which must then carry the verdict (both
   * calls, checked below; seen under ASan with a 256 KiB-block allgather against a 4-element
   * one). */
  int big = j->kind == MM_PATHS || j->kind == MM_BCAST_PATHS || j->kind == MM_ALLGATHER_PATHS ||
            j->kind == MM_BARRIER_LARGE;
  CHECK(st == DT_ERR_MISMATCH || st == DT_ERR_ABORTED || ((bystander || p2p || big) && st == DT_ERR_PEER),
        "%s mismatch on %s: got %s (%s)", mm_names[j->kind], j->transport, dt_strerror(st), msg);
  if (bystander && st == DT_ERR_PEER) {
    CHECK(strstr(msg, "rank 1"), "message '%s' does not name rank 1", msg);
  } else if (bystander && st == DT_ERR_MISMATCH) {
    /* On shm the bystander can see rank 1's call directly (the transport's call board). */
    CHECK(strstr(msg, theirs) && strstr(msg, "rank 2 called"), "%s mismatch: message '%s' lacks '%s'",
          mm_names[j->kind], msg, theirs);
  } else {
    CHECK(strstr(msg, theirs) && strstr(msg, mine), "%s mismatch: message '%s' lacks '%s' or '%s'",
          mm_names[j->kind], msg, theirs, mine);
  }
  /* the communicator stays broken */
  CHECK(dt_comm_allreduce(c, a, b, 4, DT_F32, DT_SUM) != DT_OK, "a call after the mismatch succeeded");
  dt_comm_destroy(c);
  return 0;
}

/* Rooted collectives (and allgather) on 3 and 4 ranks, where a rank's part may be only to
 * send: every rank of a mismatched call fails, also the one whose neighbours agree with it
 * (kind 0: rank 0 scatters while ranks 1 and 2 gather to it; kind 1: rank 2's reduce has one
 * element more; kind 2: rank 0 broadcasts while the others reduce). A ring check of one round once let rank 2 (kinds 0
 * and 2) or rank 1 (kind 1) return DT_OK. The broadcast tree checks as it moves the data
 * (tree.c), forced for kinds 3-5: kind 3: the last rank broadcasts from itself while the others
 * broadcast from rank 0 (it receives nothing in a tree of its own: its partners in the rounds
 * must catch it); kind 4: the last rank's count is larger; kind 5: rank 1 (an inner node of the
 * others' tree) takes root 2; kind 6: an allgather whose last rank's block is large (the ring
 * on tcp) while the others' are small (Bruck's rounds on tcp); kind 7: rank 0 broadcasts (the
 * tree) while the others allgather (Bruck's rounds); kind 8: a reduce_scatter by recursive
 * halving (rhd.c; the ring on 3 ranks) whose last rank's block is one element larger. */
#define ROOTED_KINDS 9
static int rooted_body(int rank, int size, void *arg) {
  int kind = *(const int *)arg;
  dt_comm *c = sw_join(rank);
  if (!c)
    return 2;
  if (kind >= 3) {
    setenv("DTRAIN_ALGO",
           kind == 6   ? "auto"
           : kind == 7 ? "broadcast=tree,allgather=bruck"
           : kind == 8 ? "broadcast=tree,reduce_scatter=rhd"
                       : "broadcast=tree",
           1);
    dt__coll_algo_load(c); /* a communicator reads DTRAIN_ALGO when it is made */
  }
  static float a[8192], b[4 * 8192];
  CHECK(dt_comm_allreduce(c, a, b, 4, DT_F32, DT_SUM) == DT_OK, "warm-up allreduce: %s", dt_last_error());
  CHECK(dt_comm_broadcast(c, a, 16, DT_F32, size - 1) == DT_OK, "warm-up broadcast: %s", dt_last_error());
  int last = rank == size - 1;
  dt_status st;
  switch (kind) {
  case 0: st = rank ? dt_comm_gather(c, a, b, 16, DT_F32, 0) : dt_comm_scatter(c, b, a, 16, DT_F32, 0); break;
  case 1: st = dt_comm_reduce(c, a, b, rank == 2 ? 17 : 16, DT_F32, DT_SUM, 0); break;
  case 2: st = rank ? dt_comm_reduce(c, a, b, 16, DT_F32, DT_SUM, 0) : dt_comm_broadcast(c, a, 16, DT_F32, 0); break;
  case 3: st = dt_comm_broadcast(c, a, 16, DT_F32, last ? rank : 0); break;
  case 4: st = dt_comm_broadcast(c, a, last ? 17 : 16, DT_F32, 0); break;
  case 5: st = dt_comm_broadcast(c, a, 16, DT_F32, rank == 1 ? 2 : 0); break;
  case 6: st = dt_comm_allgather(c, a, b, last ? 8192 : 16, DT_F32); break;
  case 8: st = dt_comm_reduce_scatter(c, b, a, last ? 17 : 16, DT_F32, DT_SUM); break;
  default: st = rank ? dt_comm_allgather(c, a, b, 16, DT_F32) : dt_comm_broadcast(c, a, 16, DT_F32, 0); break;
  }
  unsetenv("DTRAIN_ALGO");
  CHECK(st == DT_ERR_MISMATCH || st == DT_ERR_ABORTED || st == DT_ERR_PEER,
        "rooted mismatch %d (%d ranks), rank %d: got %s (%s)", kind, size, rank, dt_strerror(st), dt_last_error());
  dt_comm_destroy(c);
  return 0;
}

/* No false alarm: a recv waiting while its peer sends and goes on into a barrier (or a flat
 * allreduce) must get the message, also when the message is larger than the shm ring. */
static int p2p_ok_body(int rank, int size, void *arg) {
  (void)size;
  (void)arg;
  dt_comm *c = sw_join(rank);
  if (!c)
    return 2;
  static float a[1 << 20];
  for (int i = 0; i < 60; i++) {
    size_t n = i == 7 ? 1 << 20 : 4; /* 4 MiB: more than DTRAIN_SHM_SLOTS x DTRAIN_SHM_SLOT */
    if ((i & 1) == rank)
      usleep(2000); /* the other rank waits first */
    dt_status st = rank == 0 ? dt_comm_send(c, a, n, DT_F32, 1, i) : dt_comm_recv(c, a, n, DT_F32, 0, i);
    CHECK(st == DT_OK, "%s %d: %s", rank ? "recv" : "send", i, dt_last_error());
    st = i % 3 ? dt_comm_barrier(c) : dt_comm_allreduce(c, a, a, 4, DT_F32, DT_SUM);
    CHECK(st == DT_OK, "collective after p2p %d: %s", i, dt_last_error());
  }
  dt_comm_destroy(c);
  return 0;
}

/* Two threads of rank 0 in collectives on one communicator at once: the second is told at once
 * (DT_ERR_STATE naming the cause) while the first completes; the calls no longer mix into a
 * hang or a "mismatch" on the other rank. */
static void *second_thread(void *arg) {
  dt_comm *c = arg;
  usleep(100000); /* the first thread is waiting for rank 1 by now */
  float x = 1;
  dt_status st = dt_comm_allreduce(c, DT_IN_PLACE, &x, 1, DT_F32, DT_SUM);
  return (void *)(intptr_t)(st == DT_ERR_STATE && strstr(dt_last_error(), "another thread of this process") ? 0 : 1);
}

static int two_threads_body(int rank, int size, void *arg) {
  (void)size;
  (void)arg;
  dt_comm *c = sw_join(rank);
  if (!c)
    return 2;
  float x = (float)rank + 1;
  pthread_t th;
  if (rank == 0)
    CHECK(pthread_create(&th, NULL, second_thread, c) == 0, "pthread_create");
  else
    usleep(500000); /* rank 0's first call waits for this one meanwhile */
  dt_status st = dt_comm_allreduce(c, DT_IN_PLACE, &x, 1, DT_F32, DT_SUM);
  CHECK(st == DT_OK && x == 3, "the first thread's allreduce: %s, %g", dt_last_error(), x);
  if (rank == 0) {
    void *r;
    pthread_join(th, &r);
    CHECK(r == NULL, "the second thread was not told");
  }
  CHECK(dt_comm_barrier(c) == DT_OK, "after: %s", dt_last_error());
  dt_comm_destroy(c);
  return 0;
}

/* A recv with a NULL buffer (or any bad point-to-point argument) fails the job as a bad
 * collective argument does: the sender's next call is aborted instead of its message being
 * dropped while both went on. */
static int p2p_invalid_body(int rank, int size, void *arg) {
  (void)size;
  (void)arg;
  dt_comm *c = sw_join(rank);
  if (!c)
    return 2;
  float a[4] = {1, 2, 3, 4};
  dt_status st;
  if (rank == 0) {
    st = dt_comm_recv(c, NULL, 4, DT_F32, 1, 0);
    CHECK(st == DT_ERR_INVALID && strstr(dt_last_error(), "buffer is NULL"), "recv NULL gave %s: %s",
          dt_strerror(st), dt_last_error());
    CHECK(dt_comm_iallreduce(c, a, a, 4, DT_F32, DT_SUM, NULL) == DT_ERR_INVALID, "NULL request pointer");
  } else {
    st = dt_comm_send(c, a, 4, DT_F32, 0, 0); /* eager: may return before anyone looks */
    CHECK(st == DT_OK || st == DT_ERR_ABORTED || st == DT_ERR_PEER, "send gave %s", dt_strerror(st));
    int64_t t0 = dt_now_ns();
    st = dt_comm_barrier(c);
    CHECK(st == DT_ERR_ABORTED || st == DT_ERR_PEER, "barrier after the peer's bad recv gave %s: %s",
          dt_strerror(st), dt_last_error());
    CHECK(dt_now_ns() - t0 < 25 * 1000000000ll, "took until the deadline");
  }
  dt_comm_destroy(c);
  return 0;
}

static int invalid_body(int rank, int size, void *arg) {
  (void)size;
  (void)arg;
  dt_comm *c = sw_join(rank);
  if (!c)
    return 2;
  float a[4] = {1, 2, 3, 4}, b[4];
  CHECK(dt_comm_allreduce(c, a, b, 4, DT_F32, DT_SUM) == DT_OK, "good allreduce: %s", dt_last_error());
  if (rank == 0) {
    dt_status st = dt_comm_allreduce(c, a, NULL, 4, DT_F32, DT_SUM);
    CHECK(st == DT_ERR_INVALID, "NULL recvbuf gave %s", dt_strerror(st));
    CHECK(strstr(dt_last_error(), "rank 0: allreduce #2") && strstr(dt_last_error(), "recvbuf is NULL"),
          "message '%s'", dt_last_error());
    /* more bad calls keep saying what is wrong */
    CHECK(dt_comm_allreduce(c, a, b, 4, (dt_dtype)42, DT_SUM) == DT_ERR_INVALID && strstr(dt_last_error(), "dtype 42"),
          "bad dtype: '%s'", dt_last_error());
    CHECK(dt_comm_allreduce(c, a, b, 4, DT_F32, (dt_op)9) == DT_ERR_INVALID && strstr(dt_last_error(), "op 9"),
          "bad op: '%s'", dt_last_error());
    CHECK(dt_comm_broadcast(c, a, 4, DT_F32, 5) == DT_ERR_INVALID && strstr(dt_last_error(), "root 5"),
          "bad root: '%s'", dt_last_error());
    CHECK(dt_comm_reduce(c, a, b, 4, DT_F32, DT_SUM, -1) == DT_ERR_INVALID && strstr(dt_last_error(), "reduce"),
          "bad reduce root: '%s'", dt_last_error());
    CHECK(dt_comm_scatter(c, NULL, b, 1, DT_F32, 0) == DT_ERR_INVALID && strstr(dt_last_error(), "sendbuf"),
          "scatter without data: '%s'", dt_last_error());
    dt_request *req = (dt_request *)1;
    CHECK(dt_comm_iallreduce(c, a, NULL, 4, DT_F32, DT_SUM, &req) == DT_ERR_INVALID && req == NULL,
          "nonblocking NULL recvbuf");
    /* buffers that overlap without being the same one: refused, never a silently wrong result */
    float o[64] = {0};
    CHECK(dt_comm_allreduce(c, o, o + 1, 10, DT_F32, DT_SUM) == DT_ERR_INVALID && strstr(dt_last_error(), "overlap"),
          "overlapping allreduce: '%s'", dt_last_error());
    CHECK(dt_comm_reduce_scatter(c, o, o + 19, 10, DT_F32, DT_SUM) == DT_ERR_INVALID &&
              strstr(dt_last_error(), "overlap"),
          "overlapping reduce_scatter: '%s'", dt_last_error());
    CHECK(dt_comm_alltoall(c, o + 4, o, 4, DT_F32) == DT_ERR_INVALID && strstr(dt_last_error(), "overlap"),
          "overlapping alltoall: '%s'", dt_last_error());
    CHECK(dt_comm_reduce(c, o + 2, o, 4, DT_F32, DT_MAX, 0) == DT_ERR_INVALID && strstr(dt_last_error(), "overlap"),
          "overlapping reduce on the root: '%s'", dt_last_error());
    CHECK(dt_comm_scatter(c, o, o + 2, 4, DT_F32, 0) == DT_ERR_INVALID && strstr(dt_last_error(), "overlap"),
          "overlapping scatter on the root: '%s'", dt_last_error());
    CHECK(dt_comm_iallreduce(c, o + 4, o, 8, DT_F32, DT_SUM, &req) == DT_ERR_INVALID && req == NULL,
          "nonblocking overlapping allreduce");
  } else {
    /* rank 1 makes the right call and must not wait for rank 0 until the deadline */
    int64_t t0 = dt_now_ns();
    dt_status st = dt_comm_allreduce(c, a, b, 4, DT_F32, DT_SUM);
    CHECK(st == DT_ERR_ABORTED || st == DT_ERR_PEER, "peer of a bad call got %s (%s)", dt_strerror(st),
          dt_last_error());
    CHECK(dt_now_ns() - t0 < 25 * 1000000000ll, "took until the deadline");
    CHECK(strstr(dt_last_error(), "recvbuf is NULL") || st == DT_ERR_PEER, "message '%s' does not say why",
          dt_last_error());
  }
  dt_comm_destroy(c);
  return 0;
}

static int algo_body(int rank, int size, void *arg) {
  (void)arg;
  setenv("DTRAIN_ALGO", "bogus", 1); /* read when the communicator is made */
  dt_comm *c = sw_join(rank);
  if (!c)
    return 2;
  float a[4] = {1, 2, 3, 4}, b[4];
  dt_status st = dt_comm_allreduce(c, a, b, 4, DT_F32, DT_SUM);
  CHECK(st == DT_ERR_INVALID || (size > 1 && st == DT_ERR_ABORTED), "DTRAIN_ALGO=bogus gave %s", dt_strerror(st));
  CHECK(strstr(dt_last_error(), "bogus"), "message '%s' does not name the value", dt_last_error());
  dt_comm_destroy(c);
  return 0;
}

/* DTRAIN_ALGO that chooses the same algorithms however spelled is fine; one that chooses
 * another algorithm for any collective on one rank fails every rank's dt_comm_create at once,
 * naming both values (not at the deadline of the first call whose messages never come). */
static int algo_differs_body(int rank, int size, void *arg) {
  (void)size;
  (void)arg;
  setenv("DTRAIN_ALGO", rank == 0 ? "ring" : "allreduce=ring,broadcast=auto", 1);
  dt_comm *c = sw_join(rank);
  CHECK(c, "the same algorithms spelled differently were refused");
  float a[4] = {1, 2, 3, 4}, b[4];
  CHECK(dt_comm_allreduce(c, a, b, 4, DT_F32, DT_SUM) == DT_OK && b[3] == 8, "allreduce: %s", dt_last_error());
  dt_comm_destroy(c);
  setenv("DTRAIN_ALGO", rank == 0 ? "ring" : "ring,barrier=dissem", 1);
  c = NULL;
  int64_t t0 = dt_now_ns();
  dt_status st = dt_comm_create(NULL, &c);
  CHECK(st == DT_ERR_MISMATCH && !c, "different algorithms gave %s", dt_strerror(st));
  CHECK(strstr(dt_last_error(), "DTRAIN_ALGO") && strstr(dt_last_error(), "'ring'") &&
            strstr(dt_last_error(), "'ring,barrier=dissem'"),
        "message '%s' does not name both values", dt_last_error());
  CHECK(dt_now_ns() - t0 < 20 * 1000000000ll, "took until the deadline");
  return 0;
}

/* A send nobody receives is lost with the communicator: over shm the receiver's destroy says so
 * (its stderr, captured here). */
static int lost_send_body(int rank, int size, void *arg) {
  (void)size;
  (void)arg;
  dt_comm *c = sw_join(rank);
  if (!c)
    return 2;
  float a[4] = {1, 2, 3, 4};
  if (rank == 0)
    CHECK(dt_comm_send(c, a, 4, DT_F32, 1, 0) == DT_OK, "send: %s", dt_last_error());
  CHECK(dt_comm_barrier(c) == DT_OK, "barrier: %s", dt_last_error());
  if (rank != 1) {
    dt_comm_destroy(c);
    return 0;
  }
  char path[] = "/tmp/dt_lost_send_XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0, "mkstemp");
  fflush(stderr);
  int saved = dup(STDERR_FILENO);
  dup2(fd, STDERR_FILENO);
  dt_comm_destroy(c);
  fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  char log[4096] = "";
  ssize_t n = pread(fd, log, sizeof log - 1, 0);
  close(fd);
  unlink(path);
  log[n > 0 ? n : 0] = '\0';
  CHECK(strstr(log, "what rank 0 sent were never received"), "destroy did not say a message was lost: '%s'", log);
  return 0;
}

/* A single-rank communicator (no job variables at all) accepts good calls. */
static int single_rank_ok(void) {
  int rank = 0;
  for (const char *const *v = (const char *const[]){"DTRAIN_RANK", "DTRAIN_WORLD_SIZE", "DTRAIN_LOCAL_RANK",
                                                    "DTRAIN_LOCAL_WORLD_SIZE", "DTRAIN_MASTER_ADDR",
                                                    "DTRAIN_MASTER_PORT", NULL};
       *v; v++)
    unsetenv(*v);
  dt_comm *c = sw_join(0);
  CHECK(c, "single-rank create");
  int32_t a[3] = {1, 2, 3}, b[3] = {0};
  CHECK(dt_comm_allreduce(c, a, b, 3, DT_I32, DT_SUM) == DT_OK && b[2] == 3, "single-rank allreduce");
  CHECK(dt_comm_allreduce(c, NULL, NULL, 0, DT_I32, DT_SUM) == DT_OK, "count 0 with NULL buffers");
  CHECK(dt_comm_allreduce(NULL, a, b, 3, DT_I32, DT_SUM) == DT_ERR_INVALID, "NULL communicator");
  CHECK(dt_comm_set_timeout(NULL, 5) == DT_ERR_INVALID && strstr(dt_last_error(), "communicator is NULL"),
        "set_timeout(NULL): '%s'", dt_last_error());
  dt_comm_destroy(c);
  /* DTRAIN_BACKEND (dtrain run --backend's spelling) is named when it is the one that is wrong */
  setenv("DTRAIN_BACKEND", "garbage", 1);
  unsetenv("DTRAIN_TRANSPORT");
  c = NULL;
  CHECK(dt_comm_create(NULL, &c) == DT_ERR_INVALID && !c && strstr(dt_last_error(), "DTRAIN_BACKEND 'garbage'"),
        "DTRAIN_BACKEND=garbage: '%s'", dt_last_error());
  unsetenv("DTRAIN_BACKEND");
  return 0;
}

int main(void) {
  int bad = 0, ran = 0;
  const char *tps[] = {"shm", "tcp"};
  for (int t = 0; t < 2; t++) {
    setenv("DTRAIN_TRANSPORT", tps[t], 1);
    /* Each allreduce algorithm detects a mismatch itself: force each (collectives without
     * them keep their automatic choice). */
    const char *algos[] = {NULL, "flat", "rd", "shm", "ring"};
    for (int a = 0; a < 5; a++)
      for (int k = 0; k < MM_N; k++) {
        int allreduce_kind = k <= MM_COUNT_RD3 && k != MM_ROOT;
        if ((a > 0 && !allreduce_kind) || (t == 1 && (a == 1 || a == 3)))
          continue; /* forced: only the allreduce mismatches; tcp has no flat or shm allreduce */
        if (a == 4 && k == MM_COUNT_RD3)
          continue; /* in a 3-rank ring rank 0 is a bystander too (it may see rank 2 leave) */
        job j = {(mm_kind)k, tps[t], algos[a]};
        int f = mp_run(k == MM_COUNT_RD3 ? 3 : 2, mismatch_body, &j, 60);
        ran++;
        if (f) {
          fprintf(stderr, "FAIL: %s mismatch on %s, DTRAIN_ALGO=%s\n", mm_names[k], tps[t],
                  algos[a] ? algos[a] : "(auto)");
          bad++;
        }
      }
    for (int kind = 0; kind < ROOTED_KINDS; kind++)
      for (int n = 3; n <= 4; n++) {
        ran++;
        if (mp_run(n, rooted_body, &kind, 60)) {
          fprintf(stderr, "FAIL: rooted mismatch %d on %d ranks over %s\n", kind, n, tps[t]);
          bad++;
        }
      }
    ran++;
    if (mp_run(2, p2p_ok_body, NULL, 60)) {
      fprintf(stderr, "FAIL: send/recv next to collectives on %s\n", tps[t]);
      bad++;
    }
    ran++;
    if (mp_run(2, two_threads_body, NULL, 60)) {
      fprintf(stderr, "FAIL: two threads in collectives at once on %s\n", tps[t]);
      bad++;
    }
    ran++;
    if (mp_run(2, p2p_invalid_body, NULL, 60)) {
      fprintf(stderr, "FAIL: bad point-to-point arguments on %s\n", tps[t]);
      bad++;
    }
    ran++;
    if (mp_run(2, invalid_body, NULL, 60)) {
      fprintf(stderr, "FAIL: invalid arguments on %s\n", tps[t]);
      bad++;
    }
    ran++;
    if (mp_run(2, algo_body, NULL, 60)) {
      fprintf(stderr, "FAIL: DTRAIN_ALGO on %s\n", tps[t]);
      bad++;
    }
    if (t == 0) {
      ran++;
      if (mp_run(2, lost_send_body, NULL, 60)) {
        fprintf(stderr, "FAIL: a send never received on %s\n", tps[t]);
        bad++;
      }
    }
    ran++;
    if (mp_run(2, algo_differs_body, NULL, 60)) {
      fprintf(stderr, "FAIL: DTRAIN_ALGO differing across ranks on %s\n", tps[t]);
      bad++;
    }
  }
  ran++;
  if (mp_run(1, algo_body, NULL, 60)) {
    fprintf(stderr, "FAIL: DTRAIN_ALGO on one rank\n");
    bad++;
  }
  ran++;
  if (single_rank_ok()) {
    fprintf(stderr, "FAIL: single rank\n");
    bad++;
  }
  printf("%d passed, %d failed\n", ran - bad, bad);
  return bad ? 1 : 0;
}
