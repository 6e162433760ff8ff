/* test_mpi.c - dtrain inside a job that Open MPI's mpirun started: no DTRAIN_* variables, no
 * store address; the communicator finds its rank from OMPI_COMM_WORLD_* and the store through
 * MPI. Checks every collective on the transport named by DTRAIN_TRANSPORT (mpi, or shm / tcp
 * bootstrapped by MPI) against values each rank can compute, and (--mismatch) that ranks
 * calling different things get an error naming both sides. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/comm.h"

#define CHECK(cond, ...)                                                      \
  do {                                                                        \
    if (!(cond)) {                                                            \
      fprintf(stderr, "rank %d: FAIL %s:%d: ", rank, __FILE__, __LINE__);     \
      fprintf(stderr, __VA_ARGS__);                                           \
      fprintf(stderr, " (%s)\n", dt_last_error());                            \
      return 1;                                                               \
    }                                                                         \
  } while (0)

static int rank = -1;

static int check_allreduce(dt_comm *c, size_t n) {
  int size = dt_comm_size(c), me = dt_comm_rank(c);
  float *x = malloc((n + 1) * sizeof *x);
  double *d = malloc((n + 1) * sizeof *d);
  int32_t *iv = malloc((n + 1) * sizeof *iv);
  for (size_t i = 0; i < n; i++) {
    x[i] = (float)(me + 1) * 0.5f + (float)(i % 7);
    d[i] = me + 1 + (double)i;
    iv[i] = (int32_t)(me * 3 + (int)(i % 11));
  }
  CHECK(dt_comm_allreduce(c, DT_IN_PLACE, x, n, DT_F32, DT_SUM) == DT_OK, "allreduce f32 n=%zu", n);
  CHECK(dt_comm_allreduce(c, DT_IN_PLACE, d, n, DT_F64, DT_AVG) == DT_OK, "allreduce f64 avg");
  CHECK(dt_comm_allreduce(c, DT_IN_PLACE, iv, n, DT_I32, DT_MAX) == DT_OK, "allreduce i32 max");
  double ranksum = size * (size + 1) / 2.0;
  for (size_t i = 0; i < n; i++) {
    double want = 0.5 * ranksum + size * (double)(i % 7);
    CHECK(fabs(x[i] - want) <= 1e-5 * fabs(want) + 1e-6, "f32 sum [%zu] %g != %g", i, x[i], want);
    double wd = (ranksum + size * (double)i) / size;
    CHECK(fabs(d[i] - wd) <= 1e-12 * fabs(wd), "f64 avg [%zu] %g != %g", i, d[i], wd);
    CHECK(iv[i] == (size - 1) * 3 + (int)(i % 11), "i32 max [%zu] %d", i, iv[i]);
  }
  free(x);
  free(d);
  free(iv);
  return 0;
}

/* u8 sums wrap modulo 256 on every backend (Open MPI's AVX op saturates them from 64 elements
 * on); avg divides the wrapped sum; reduce_scatter goes through the same op. */
static int check_u8(dt_comm *c) {
  int size = dt_comm_size(c);
  enum { N = 1000 };
  uint8_t x[N], y[N], all[N * 4], rs[N];
  for (size_t n = 1; n <= N; n = n * 8 - 1) { /* 1, 7, 55, 439 and whole vectors of 64 */
    for (size_t i = 0; i < n; i++)
      x[i] = y[i] = (uint8_t)(200 + 37 * rank + i);
    CHECK(dt_comm_allreduce(c, DT_IN_PLACE, x, n, DT_U8, DT_SUM) == DT_OK, "allreduce u8 sum n=%zu", n);
    CHECK(dt_comm_allreduce(c, DT_IN_PLACE, y, n, DT_U8, DT_AVG) == DT_OK, "allreduce u8 avg n=%zu", n);
    for (size_t i = 0; i < n; i++) {
      unsigned sum = 0;
      for (int r = 0; r < size; r++)
        sum += (uint8_t)(200 + 37 * r + i);
      CHECK(x[i] == (uint8_t)sum, "u8 sum n=%zu [%zu] = %d, want %d (wrapped)", n, i, x[i], (uint8_t)sum);
      CHECK(y[i] == (uint8_t)sum / size, "u8 avg n=%zu [%zu] = %d, want %d", n, i, y[i], (uint8_t)sum / size);
    }
  }
  if (size <= 4) {
    for (size_t i = 0; i < (size_t)size * 250; i++)
      all[i] = (uint8_t)(250 - rank + i);
    CHECK(dt_comm_reduce_scatter(c, all, rs, 250, DT_U8, DT_SUM) == DT_OK, "reduce_scatter u8 sum");
    for (size_t i = 0; i < 250; i++) {
      unsigned sum = 0;
      for (int r = 0; r < size; r++)
        sum += (uint8_t)(250 - r + (size_t)rank * 250 + i);
      CHECK(rs[i] == (uint8_t)sum, "reduce_scatter u8 sum [%zu] = %d, want %d", i, rs[i], (uint8_t)sum);
    }
  }
  return 0;
}

static int check_others(dt_comm *c) {
  int size = dt_comm_size(c);
  int32_t b[5] = {0};
  if (rank == size - 1)
    for (int i = 0; i < 5; i++)
      b[i] = 100 + i;
  CHECK(dt_comm_broadcast(c, b, 5, DT_I32, size - 1) == DT_OK, "broadcast");
  for (int i = 0; i < 5; i++)
    CHECK(b[i] == 100 + i, "broadcast [%d] = %d", i, b[i]);
  int64_t mine[2] = {rank, rank * 10}, all[2 * 64];
  CHECK(dt_comm_allgather(c, mine, all, 2, DT_I64) == DT_OK, "allgather");
  for (int r = 0; r < size; r++)
    CHECK(all[2 * r] == r && all[2 * r + 1] == r * 10, "allgather block %d", r);
  float in[3 * 64], out[3];
  for (int i = 0; i < 3 * size; i++)
    in[i] = (float)(i + rank);
  CHECK(dt_comm_reduce_scatter(c, in, out, 3, DT_F32, DT_SUM) == DT_OK, "reduce_scatter");
  for (int i = 0; i < 3; i++) {
    float want = (float)size * (float)(rank * 3 + i) + (float)(size * (size - 1) / 2);
    CHECK(out[i] == want, "reduce_scatter [%d] %g != %g", i, out[i], want);
  }
  CHECK(dt_comm_barrier(c) == DT_OK, "barrier");
  if (size >= 2 && rank < 2) {
    uint8_t msg[4] = {1, 2, 3, 4}, got[4] = {0};
    if (rank == 0)
      CHECK(dt_comm_send(c, msg, 4, DT_U8, 1, 9) == DT_OK, "send");
    else {
      CHECK(dt_comm_recv(c, got, 4, DT_U8, 0, 9) == DT_OK, "recv");
      CHECK(memcmp(got, msg, 4) == 0, "recv content");
    }
  }
  return 0;
}

/* Small whole numbers as f16 or bf16 bits (exact: at most 8 significant bits). */
static uint16_t half_of(int v, int bf) {
  float f = (float)v;
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if (bf || v == 0)
    return (uint16_t)(u >> 16);
  int e = (int)((u >> 23) & 0xff) - 127;
  return (uint16_t)(((u >> 16) & 0x8000) | (uint32_t)(e + 15) << 10 | ((u >> 13) & 0x3ff));
}

/* reduce_scatter of f16 and bf16 sums (they accumulate in f32 and round once, as on every
 * transport): out of place and in place, with blocks of more than 2 Mi elements, which the mpi
 * transport moves in several pieces. Whole numbers, so every sum is exact. */
static int check_reduce_scatter_half(dt_comm *c) {
  int size = dt_comm_size(c);
  const size_t count = ((size_t)1 << 21) + 5, total = count * (size_t)size;
  uint16_t *in = malloc(total * sizeof *in), *out = malloc(count * sizeof *out);
  CHECK(in && out, "out of memory");
  for (int bf = 0; bf < 2; bf++)
    for (int inplace = 0; inplace < 2; inplace++) {
      for (size_t g = 0; g < total; g++)
        in[g] = half_of((int)(g % 7) + rank, bf);
      dt_dtype t = bf ? DT_BF16 : DT_F16;
      CHECK(dt_comm_reduce_scatter(c, inplace ? DT_IN_PLACE : in, inplace ? in : out, count, t, DT_SUM) == DT_OK,
            "reduce_scatter %s sum%s", bf ? "bf16" : "f16", inplace ? " in place" : "");
      const uint16_t *got = inplace ? in : out;
      for (size_t i = 0; i < count; i++) {
        size_t g = (size_t)rank * count + i;
        int want = size * (int)(g % 7) + size * (size - 1) / 2;
        CHECK(got[i] == half_of(want, bf), "reduce_scatter %s sum%s [%zu] = 0x%04x, want %d (0x%04x)",
              bf ? "bf16" : "f16", inplace ? " in place" : "", i, got[i], want, half_of(want, bf));
      }
    }
  free(in);
  free(out);
  return 0;
}

int main(int argc, char **argv) {
  int mismatch = argc > 1 && strcmp(argv[1], "--mismatch") == 0;
  dt_comm *c = NULL;
  if (dt_comm_create(NULL, &c) != DT_OK) {
    fprintf(stderr, "dt_comm_create: %s\n", dt_last_error());
    return 1;
  }
  rank = dt_comm_rank(c);
  const char *want = getenv("DTRAIN_TRANSPORT");
  if (dt_comm_size(c) > 1 && want)
    CHECK(strcmp(dt_comm_transport(c), want) == 0, "transport %s, asked for %s", dt_comm_transport(c), want);
  if (mismatch) {
    float x[8] = {0};
    dt_status st = dt_comm_allreduce(c, DT_IN_PLACE, x, rank == 0 ? 8 : 4, DT_F32, DT_SUM);
    CHECK(st == DT_ERR_MISMATCH || st == DT_ERR_ABORTED, "mismatch not detected: %s", dt_strerror(st));
    const char *e = dt_last_error();
    CHECK(strstr(e, "8 x f32 sum") && strstr(e, "4 x f32 sum"), "message names both sides: %s", e);
    dt_comm_destroy(c);
    printf("rank %d: mismatch detected: %s\n", rank, e);
    return 0;
  }
  size_t sizes[] = {0, 1, 7, 4099, (1 << 20) + 3};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    if (check_allreduce(c, sizes[i]))
      return 1;
  if (check_others(c) || check_u8(c) || check_reduce_scatter_half(c))
    return 1;
  /* A split: even and odd ranks. */
  dt_comm *half = NULL;
  CHECK(dt_comm_split(c, rank % 2, -rank, &half) == DT_OK, "split");
  if (check_allreduce(half, 1000))
    return 1;
  dt_comm_destroy(half);
  dt_comm_destroy(c);
  printf("rank %d: ok\n", rank);
  return 0;
}
