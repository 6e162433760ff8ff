/* test_coll_nonblocking.c - nonblocking collectives on the progress thread, over shm and tcp
 * with 2 and 3 ranks: several iallreduce in flight waited for in reverse order; a blocking call
 * issued while nonblocking ones are queued runs after them (else the fingerprints' sequence
 * numbers would disagree across ranks and the calls fail); every nonblocking variant gives the
 * serial reference's result; dt_request_test reports completion; an error on the progress thread
 * reaches dt_request_wait with its message; destroy with queued calls does not hang. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/mp.h"
#include "coll/sweep.h"


enum { K = 6, N = 70001 };

static int body(int rank, int size, void *arg) {
  (void)arg;
  dt_comm *c;
  if (dt_comm_create(NULL, &c)) {
    fprintf(stderr, "rank %d: create: %s\n", rank, dt_last_error());
    return 2;
  }
  dt_comm_set_timeout(c, 60000);
  static float in[K][N], out[K][N];
  static double blk[N], bout[N];
  dt_request *req[K];
  /* K allreduces in flight, plus a blocking one queued behind them */
  for (int k = 0; k < K; k++) {
    sw_fill(in[k], N, 0, 100 + (uint64_t)k, rank, DT_F32, DT_SUM);
    CHECK(dt_comm_iallreduce(c, in[k], out[k], N, DT_F32, DT_SUM, &req[k]) == DT_OK, "iallreduce %d: %s", k,
          dt_last_error());
  }
  sw_fill(blk, N, 0, 200, rank, DT_F64, DT_MAX);
  CHECK(dt_comm_allreduce(c, blk, bout, N, DT_F64, DT_MAX) == DT_OK, "blocking after nonblocking: %s",
        dt_last_error());
  for (int k = K - 1; k >= 0; k--)
    CHECK(dt_request_wait(req[k]) == DT_OK, "wait %d: %s", k, dt_last_error());
  for (int k = 0; k < K; k++)
    for (size_t i = 0; i < N; i++)
      CHECK(sw_check_reduced(out[k], i, 100 + (uint64_t)k, size, i, DT_F32, DT_SUM), "iallreduce %d element %zu", k,
            i);
  for (size_t i = 0; i < N; i++)
    CHECK(sw_check_reduced(bout, i, 200, size, i, DT_F64, DT_MAX), "blocking element %zu", i);

  /* point to point issued while nonblocking collectives are queued leaves after them */
  for (int k = 0; k < K; k++)
    CHECK(dt_comm_iallreduce(c, in[k], out[k], N, DT_F32, DT_SUM, &req[k]) == DT_OK, "iallreduce %d: %s", k,
          dt_last_error());
  int32_t token[3] = {rank, 7, 9}, got[3] = {0};
  int right = (rank + 1) % size, left = (rank + size - 1) % size;
  if (size > 1) {
    if (rank % 2 == 0) {
      CHECK(dt_comm_send(c, token, 3, DT_I32, right, 5) == DT_OK, "send after iallreduce: %s", dt_last_error());
      CHECK(dt_comm_recv(c, got, 3, DT_I32, left, 5) == DT_OK, "recv after iallreduce: %s", dt_last_error());
    } else {
      CHECK(dt_comm_recv(c, got, 3, DT_I32, left, 5) == DT_OK, "recv after iallreduce: %s", dt_last_error());
      CHECK(dt_comm_send(c, token, 3, DT_I32, right, 5) == DT_OK, "send after iallreduce: %s", dt_last_error());
    }
    CHECK(got[0] == left && got[1] == 7 && got[2] == 9, "p2p content %d %d %d", got[0], got[1], got[2]);
  }
  for (int k = 0; k < K; k++)
    CHECK(dt_request_wait(req[k]) == DT_OK, "wait %d after p2p: %s", k, dt_last_error());
  for (size_t i = 0; i < N; i++)
    CHECK(sw_check_reduced(out[0], i, 100, size, i, DT_F32, DT_SUM), "iallreduce before p2p, element %zu", i);

  /* every nonblocking variant, then test() until done */
  static int32_t bc[N], ag[3 * 1000], rsin[3 * 1000], rs[1000];
  if (rank == 1)
    sw_fill(bc, N, 0, 300, 1, DT_I32, DT_SUM);
  else
    memset(bc, 0, sizeof bc);
  int32_t mine[1000];
  sw_fill(mine, 1000, 0, 301, rank, DT_I32, DT_SUM);
  sw_fill(rsin, 1000 * (size_t)size, 0, 302, rank, DT_I32, DT_SUM);
  dt_request *rb, *rg, *rr, *rbar;
  CHECK(dt_comm_ibroadcast(c, bc, N, DT_I32, 1, &rb) == DT_OK, "ibroadcast: %s", dt_last_error());
  CHECK(dt_comm_iallgather(c, mine, ag, 1000, DT_I32, &rg) == DT_OK, "iallgather: %s", dt_last_error());
  CHECK(dt_comm_ireduce_scatter(c, rsin, rs, 1000, DT_I32, DT_SUM, &rr) == DT_OK, "ireduce_scatter: %s",
        dt_last_error());
  CHECK(dt_comm_ibarrier(c, &rbar) == DT_OK, "ibarrier: %s", dt_last_error());
  int done = 0;
  int64_t end = dt_now_ns() + 30 * 1000000000ll;
  while (!done && dt_now_ns() < end) {
    CHECK(dt_request_test(rbar, &done) == DT_OK, "test");
    if (!done)
      usleep(1000);
  }
  CHECK(done, "ibarrier did not complete within 30 s");
  /* the barrier ran last, so the others are done too */
  int d2 = 0;
  CHECK(dt_request_test(rb, &d2) == DT_OK && d2, "ibroadcast not done after a later ibarrier");
  CHECK(dt_request_wait(rbar) == DT_OK && dt_request_wait(rr) == DT_OK && dt_request_wait(rg) == DT_OK &&
            dt_request_wait(rb) == DT_OK,
        "waits: %s", dt_last_error());
  int32_t ref[N];
  sw_fill(ref, N, 0, 300, 1, DT_I32, DT_SUM);
  CHECK(!memcmp(ref, bc, sizeof bc), "ibroadcast data");
  for (int q = 0; q < size; q++) {
    sw_fill(mine, 1000, 0, 301, q, DT_I32, DT_SUM);
    CHECK(!memcmp(mine, ag + q * 1000, sizeof mine), "iallgather block %d", q);
  }
  for (size_t j = 0; j < 1000; j++)
    CHECK(sw_check_reduced(rs, j, 302, size, (size_t)rank * 1000 + j, DT_I32, DT_SUM), "ireduce_scatter %zu", j);

  /* ireduce, igather, iscatter, ialltoall in flight together, root 0 */
  {
    enum { M = 333 };
    static int64_t red_in[M], red_out[M], g_in[M], g_out[8 * M], s_in[8 * M], s_out[M], a_in[8 * M], a_out[8 * M];
    for (int i = 0; i < M; i++)
      red_in[i] = g_in[i] = (int64_t)rank * 1000 + i;
    for (int i = 0; i < size * M; i++) {
      s_in[i] = rank == 0 ? 7 * i : -1;
      a_in[i] = (int64_t)rank * 100000 + i; /* block j goes to rank j */
    }
    dt_request *r4[4];
    CHECK(dt_comm_ireduce(c, red_in, red_out, M, DT_I64, DT_SUM, 0, &r4[0]) == DT_OK, "ireduce: %s", dt_last_error());
    CHECK(dt_comm_igather(c, g_in, g_out, M, DT_I64, 0, &r4[1]) == DT_OK, "igather: %s", dt_last_error());
    CHECK(dt_comm_iscatter(c, s_in, s_out, M, DT_I64, 0, &r4[2]) == DT_OK, "iscatter: %s", dt_last_error());
    CHECK(dt_comm_ialltoall(c, a_in, a_out, M, DT_I64, &r4[3]) == DT_OK, "ialltoall: %s", dt_last_error());
    for (int k = 3; k >= 0; k--)
      CHECK(dt_request_wait(r4[k]) == DT_OK, "wait %d: %s", k, dt_last_error());
    for (int i = 0; i < M; i++) {
      if (rank == 0)
        CHECK(red_out[i] == 1000LL * size * (size - 1) / 2 + (int64_t)size * i, "ireduce [%d]", i);
      CHECK(s_out[i] == 7 * (rank * M + i), "iscatter [%d] = %lld", i, (long long)s_out[i]);
      for (int q = 0; q < size; q++) {
        if (rank == 0)
          CHECK(g_out[q * M + i] == (int64_t)q * 1000 + i, "igather block %d [%d]", q, i);
        CHECK(a_out[q * M + i] == (int64_t)q * 100000 + rank * M + i, "ialltoall block %d [%d]", q, i);
      }
    }
  }

  /* an error on the progress thread comes back through wait with its message: rank 1 makes a
   * different call; both fail */
  dt_request *bad;
  CHECK(dt_comm_iallreduce(c, in[0], out[0], rank == 1 ? 5 : 4, DT_F32, DT_SUM, &bad) == DT_OK, "submit");
  dt_status st = dt_request_wait(bad);
  CHECK(st != DT_OK, "mismatched nonblocking call succeeded");
  CHECK(st != DT_ERR_MISMATCH || (strstr(dt_last_error(), "with 5 x f32") && strstr(dt_last_error(), "with 4 x f32")),
        "message '%s'", dt_last_error());
  /* destroy with queued calls on a broken communicator: returns, and waiting afterwards works */
  dt_request *late;
  CHECK(dt_comm_iallreduce(c, in[1], out[1], 4, DT_F32, DT_SUM, &late) == DT_OK, "submit late");
  dt_comm_destroy(c);
  CHECK(dt_request_wait(late) != DT_OK, "a call on a broken/destroyed communicator succeeded");
  return 0;
}

int main(void) {
  int bad = 0, ran = 0;
  const char *tps[] = {"shm", "tcp"};
  for (int t = 0; t < 2; t++)
    for (int n = 2; n <= 3; n++) {
      setenv("DTRAIN_TRANSPORT", tps[t], 1);
      ran++;
      if (mp_run(n, body, NULL, 120)) {
        fprintf(stderr, "FAIL: nonblocking on %s with %d ranks\n", tps[t], n);
        bad++;
      }
    }
  printf("%d passed, %d failed\n", ran - bad, bad);
  return bad ? 1 : 0;
}
