/* test_coll_split.c - collectives on sub-communicators (dt_comm_split), as the model-parallel
 * groups will use them: 5 ranks split into even and odd world ranks (ordered by descending key,
 * so group ranks differ from world order); each group runs every collective and checks the
 * reference over its own members; the world communicator keeps working in between, and a
 * nonblocking allreduce on the group overlaps a blocking one on the world. A mismatch inside a
 * group names group ranks with their world ranks ("rank 0 (world rank 3)"). A split on one rank
 * against an allreduce on the other fails on both at once as a mismatch naming both calls (it
 * used to wait out the deadline as "never called split"). shm and tcp. */
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "common/check.h"
#include "common/mp.h"
#include "coll/sweep.h"


enum { N = 5003 };

static int body(int rank, int size, void *arg) {
  (void)arg;
  dt_comm *w, *g;
  if (dt_comm_create(NULL, &w)) {
    fprintf(stderr, "rank %d: create: %s\n", rank, dt_last_error());
    return 2;
  }
  dt_comm_set_timeout(w, 60000);
  int color = rank % 2;
  CHECK(dt_comm_split(w, color, -rank, &g) == DT_OK, "split: %s", dt_last_error());
  /* members of my group in group-rank order: descending world rank */
  int members[8], gn = 0;
  for (int r = size - 1; r >= 0; r--)
    if (r % 2 == color)
      members[gn++] = r;
  CHECK(dt_comm_size(g) == gn, "group size %d, want %d", dt_comm_size(g), gn);
  int gr = dt_comm_rank(g);
  CHECK(members[gr] == rank, "group rank %d is world rank %d, not me", gr, members[gr]);

  /* allreduce in the group: salt per group; inputs keyed by world rank, so the reference is
   * the reduction over the members' inputs */
  static float in[N], out[N];
  uint64_t salt = 50 + (uint64_t)color;
  sw_fill(in, N, 0, salt, rank, DT_F32, DT_MAX);
  CHECK(dt_comm_allreduce(g, in, out, N, DT_F32, DT_MAX) == DT_OK, "group allreduce: %s", dt_last_error());
  for (size_t i = 0; i < N; i++) {
    float want = -INFINITY;
    for (int m = 0; m < gn; m++)
      want = fmaxf(want, (float)sw_value(salt, members[m], i, DT_F32, DT_MAX));
    CHECK(out[i] == want, "group allreduce element %zu", i);
  }
  /* world still works, and a group call overlaps a world call */
  dt_request *req;
  static int32_t gi[N], go[N], wi[N], wo[N];
  sw_fill(gi, N, 0, 60, rank, DT_I32, DT_SUM);
  sw_fill(wi, N, 0, 61, rank, DT_I32, DT_SUM);
  CHECK(dt_comm_iallreduce(g, gi, go, N, DT_I32, DT_SUM, &req) == DT_OK, "group iallreduce: %s", dt_last_error());
  CHECK(dt_comm_allreduce(w, wi, wo, N, DT_I32, DT_SUM) == DT_OK, "world allreduce: %s", dt_last_error());
  CHECK(dt_request_wait(req) == DT_OK, "group wait: %s", dt_last_error());
  for (size_t i = 0; i < N; i++) {
    CHECK(sw_check_reduced(wo, i, 61, size, i, DT_I32, DT_SUM), "world element %zu", i);
    int64_t want = 0;
    for (int m = 0; m < gn; m++)
      want += (int64_t)sw_value(60, members[m], i, DT_I32, DT_SUM);
    CHECK(go[i] == (int32_t)want, "group iallreduce element %zu", i);
  }
  /* broadcast from group rank 1 and allgather in the group */
  static double b[N];
  if (gn > 1) {
    if (gr == 1)
      sw_fill(b, N, 0, 70, 0, DT_F64, DT_SUM);
    CHECK(dt_comm_broadcast(g, b, N, DT_F64, 1) == DT_OK, "group broadcast: %s", dt_last_error());
    static double ref[N];
    sw_fill(ref, N, 0, 70, 0, DT_F64, DT_SUM);
    CHECK(!memcmp(ref, b, sizeof b), "group broadcast data");
  }
  int32_t mine = 1000 + rank, all[8];
  CHECK(dt_comm_allgather(g, &mine, all, 1, DT_I32) == DT_OK, "group allgather: %s", dt_last_error());
  for (int m = 0; m < gn; m++)
    CHECK(all[m] == 1000 + members[m], "allgather slot %d", m);
  CHECK(dt_comm_barrier(g) == DT_OK && dt_comm_barrier(w) == DT_OK, "barriers: %s", dt_last_error());

  /* a mismatch in the odd group (world ranks 3 and 1 = group ranks 0 and 1) names both */
  if (color == 1) {
    float x[8] = {0}, y[8];
    dt_status st = dt_comm_allreduce(g, x, y, gr == 1 ? 8 : 4, DT_F32, DT_SUM);
    CHECK(st == DT_ERR_MISMATCH || st == DT_ERR_ABORTED, "group mismatch gave %s (%s)", dt_strerror(st),
          dt_last_error());
    /* group rank 1 is world rank 1: its name needs no world rank */
    CHECK(strstr(dt_last_error(), "rank 1 called allreduce") &&
              strstr(dt_last_error(), "rank 0 (world rank 3) called allreduce"),
          "group mismatch message '%s'", dt_last_error());
  }
  dt_comm_destroy(g);
  dt_comm_destroy(w);
  return 0;
}

/* rank 0 splits, rank 1 reduces: both fail well before the 60 s deadline, as a mismatch */
static int split_mismatch_body(int rank, int size, void *arg) {
  (void)size;
  (void)arg;
  dt_comm *w, *g = NULL;
  if (dt_comm_create(NULL, &w)) {
    fprintf(stderr, "rank %d: create: %s\n", rank, dt_last_error());
    return 2;
  }
  dt_comm_set_timeout(w, 60000);
  float x[4] = {1, 2, 3, 4}, y[4];
  CHECK(dt_comm_allreduce(w, x, y, 4, DT_F32, DT_SUM) == DT_OK, "first allreduce: %s", dt_last_error());
  double t0 = check_now_s();
  dt_status st = rank == 0 ? dt_comm_split(w, 0, 0, &g) : dt_comm_allreduce(w, x, y, 4, DT_F32, DT_SUM);
  double took = check_now_s() - t0;
  CHECK(st == DT_ERR_MISMATCH || st == DT_ERR_ABORTED, "rank %d: %s returned %s: %s", rank,
        rank == 0 ? "split" : "allreduce", dt_strerror(st), dt_last_error());
  CHECK(took < 20, "rank %d: failed only after %.1f s", rank, took);
  if (rank == 0)
    CHECK(g == NULL && strstr(dt_last_error(), "split") && strstr(dt_last_error(), "allreduce"),
          "split's message names neither call: %s", dt_last_error());
  dt_comm_destroy(w);
  return 0;
}

int main(void) {
  int bad = 0, ran = 0;
  const char *tps[] = {"shm", "tcp"};
  for (int t = 0; t < 2; t++) {
    setenv("DTRAIN_TRANSPORT", tps[t], 1);
    ran++;
    if (mp_run(5, body, NULL, 120)) {
      fprintf(stderr, "FAIL: split collectives on %s\n", tps[t]);
      bad++;
    }
    ran++;
    if (mp_run(2, split_mismatch_body, NULL, 120)) {
      fprintf(stderr, "FAIL: split against allreduce on %s\n", tps[t]);
      bad++;
    }
  }
  printf("%d passed, %d failed\n", ran - bad, bad);
  return bad ? 1 : 0;
}
