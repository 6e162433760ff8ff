/* mpi_coll.c - Open MPI's collectives timed the way `dtrain bench` times dtrain's, printing the
 * same JSON rows, so bench/compare-peers can put the two side by side.
 *
 * For each size: fill the buffers, `warmup` untimed calls, then `iters` timed calls, each after a
 * barrier and timed on every rank; per call the slowest rank's time counts, and the row gives the
 * median over the calls (what `dtrain bench` does). Then the outputs are poisoned and
 * one more call is checked element by element against the exact expected values (the inputs are
 * small integers, so float sums are exact); `wrong` is the number of wrong elements over all
 * ranks. Sizes follow nccl-tests' convention, which `dtrain bench` uses too: `bytes` is the
 * per-rank buffer for allreduce/broadcast, the whole gathered buffer for allgather and the
 * whole input for reduce_scatter; busbw = algbw x 2(n-1)/n (allreduce), x (n-1)/n (allgather,
 * reduce_scatter), x 1 (broadcast).
 *
 * It deliberately uses only the calls a user would write (MPI_Allreduce, MPI_Allgather,
 * MPI_Reduce_scatter_block, MPI_Bcast) with Open MPI's own algorithm choice; tuning of Open MPI
 * is left to the command line (--mca ...), as a user would do.
 *
 * As `dtrain bench` does, a broadcast's receivers rewrite their buffer before every call,
 * untimed (a receiver uses what it was sent, so its buffer is in its own cache, not the root's).
 * --fresh, as `dtrain bench --fresh`, rewrites every input and clears every output before every
 * call, untimed, as a training step writes its gradients before their allreduce.
 * --in-place, as `dtrain bench --in-place` (allreduce, allgather, reduce_scatter), calls with
 * MPI_IN_PLACE, the input written into the receive buffer before every call, untimed (this
 * rank's block of it for allgather), as a training step allreduces its gradients in place.
 *
 * Usage: mpirun -np N mpi_coll --coll allreduce --sizes 4,16,1048576 [--iters I] [--warmup W]
 *          [--hugepages] [--fresh] [--in-place]
 *   (sizes in bytes; a size that is not a whole number of f32 elements per rank is skipped;
 *   --hugepages: the buffers 2 MiB aligned and advised onto transparent huge pages before first
 *   use, as `dtrain bench --hugepages` allocates its own) */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hugebuf.h"

enum { C_ALLREDUCE, C_ALLGATHER, C_REDUCE_SCATTER, C_BROADCAST };

/* Input element i of rank r: a small integer, so any sum over <= 1000 ranks is exact in f32. */
static float input_value(int r, size_t i) { return (float)((i * 7 + (size_t)r * 13) % 17 + 1); }

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int die(const char *msg) {
  fprintf(stderr, "mpi_coll: %s\n", msg);
  MPI_Abort(MPI_COMM_WORLD, 2);
  return 2;
}

/* One call of the collective on `count` elements per rank (the per-rank block for allgather and
 * reduce_scatter). */
static void call(int coll, const float *send, float *recv, size_t count) {
  switch (coll) {
  case C_ALLREDUCE:
    MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    break;
  case C_ALLGATHER:
    MPI_Allgather(send, (int)count, MPI_FLOAT, recv, (int)count, MPI_FLOAT, MPI_COMM_WORLD);
    break;
  case C_REDUCE_SCATTER:
    MPI_Reduce_scatter_block(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    break;
  default:
    MPI_Bcast(recv, (int)count, MPI_FLOAT, 0, MPI_COMM_WORLD);
    break;
  }
}

/* Fills the inputs of one size: send holds this rank's values (n blocks for reduce_scatter);
 * for broadcast the root's buffer is the input. */
static void fill(int coll, int rank, int n, float *send, float *recv, size_t count) {
  size_t in = coll == C_REDUCE_SCATTER ? count * (size_t)n : count;
  for (size_t i = 0; i < in; i++)
    send[i] = input_value(rank, i);
  if (coll == C_BROADCAST)
    for (size_t i = 0; i < count; i++)
      recv[i] = rank == 0 ? input_value(0, i) : -1.0f;
}

static long long check(int coll, int rank, int n, const float *recv, size_t count) {
  long long wrong = 0;
  switch (coll) {
  case C_ALLREDUCE:
    for (size_t i = 0; i < count; i++) {
      float want = 0.0f;
      for (int r = 0; r < n; r++)
        want += input_value(r, i);
      wrong += recv[i] != want;
    }
    break;
  case C_ALLGATHER:
    for (int r = 0; r < n; r++)
      for (size_t i = 0; i < count; i++)
        wrong += recv[(size_t)r * count + i] != input_value(r, i);
    break;
  case C_REDUCE_SCATTER:
    for (size_t i = 0; i < count; i++) {
      float want = 0.0f;
      for (int r = 0; r < n; r++)
        want += input_value(r, (size_t)rank * count + i);
      wrong += recv[i] != want;
    }
    break;
  default:
    for (size_t i = 0; i < count; i++)
      wrong += recv[i] != input_value(0, i);
    break;
  }
  return wrong;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);

  int coll = -1, iters = 20, warmup = -1, huge = 0, fresh = 0, in_place = 0;
  const char *sizes_arg = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--coll") && i + 1 < argc) {
      const char *c = argv[++i];
      coll = !strcmp(c, "allreduce")        ? C_ALLREDUCE
             : !strcmp(c, "allgather")      ? C_ALLGATHER
             : !strcmp(c, "reduce_scatter") ? C_REDUCE_SCATTER
             : !strcmp(c, "broadcast")      ? C_BROADCAST
                                            : -2;
    } else if (!strcmp(argv[i], "--sizes") && i + 1 < argc)
      sizes_arg = argv[++i];
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
      iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--warmup") && i + 1 < argc)
      warmup = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--hugepages"))
      huge = 1;
    else if (!strcmp(argv[i], "--fresh"))
      fresh = 1;
    else if (!strcmp(argv[i], "--in-place"))
      in_place = 1;
    else
      return die("usage: mpi_coll --coll allreduce|allgather|reduce_scatter|broadcast --sizes B1,B2,... "
                 "[--iters I] [--warmup W] [--hugepages] [--fresh] [--in-place]");
  }
  if (coll < 0)
    return die("--coll must be allreduce, allgather, reduce_scatter or broadcast");
  if (!sizes_arg)
    return die("--sizes B1,B2,... (bytes) is required");
  if (iters < 1)
    return die("--iters must be >= 1");
  if (in_place && coll == C_BROADCAST)
    return die("--in-place with allreduce, allgather or reduce_scatter (a broadcast is always in place)");
  if (warmup < 0)
    warmup = iters / 10 < 1 ? 1 : iters / 10 > 20 ? 20 : iters / 10;

  size_t sizes[64];
  int nsizes = 0;
  size_t max_bytes = 0;
  for (const char *p = sizes_arg; *p && nsizes < 64;) {
    char *end;
    unsigned long long v = strtoull(p, &end, 10);
    if (end == p)
      return die("--sizes must be a comma-separated list of byte counts");
    sizes[nsizes++] = v;
    if (v > max_bytes)
      max_bytes = v;
    p = *end == ',' ? end + 1 : end;
  }

  /* Buffers sized for the largest call, touched once so that page faults of first use are not
   * timed (Open MPI's own temporaries are its business and are timed, as a user sees them). */
  size_t elems = max_bytes / sizeof(float) + 16;
  float *send = NULL, *recv = NULL;
  if (!(send = bench_buf(elems * sizeof(float), huge)) || !(recv = bench_buf(elems * sizeof(float), huge)))
    return die("cannot allocate the buffers");
  memset(send, 0, elems * sizeof(float));
  memset(recv, 0, elems * sizeof(float));
  double *times = malloc((size_t)iters * sizeof(double));
  if (!times)
    return die("cannot allocate the timing array");

  if (rank == 0)
    printf("[");
  int printed = 0;
  for (int s = 0; s < nsizes; s++) {
    size_t total = sizes[s] / sizeof(float); /* elements the nccl-tests size stands for */
    size_t count = (coll == C_ALLGATHER || coll == C_REDUCE_SCATTER) ? total / (size_t)n : total;
    if (count == 0 || count > INT32_MAX)
      continue;
    size_t bytes_elems = (coll == C_ALLGATHER || coll == C_REDUCE_SCATTER) ? count * (size_t)n : count;
    /* in place: the input is written where the call reads it (this rank's block, allgather) */
    float *in = !in_place ? send : coll == C_ALLGATHER ? recv + (size_t)rank * count : recv;
    const float *arg = in_place ? (const float *)MPI_IN_PLACE : send;
    fill(coll, rank, n, in, recv, count);
    for (int w = 0; w < warmup; w++)
      call(coll, arg, recv, count);
    size_t out_elems = coll == C_ALLGATHER ? count * (size_t)n : count;
    for (int it = 0; it < iters; it++) {
      if (fresh || in_place) {
        MPI_Barrier(MPI_COMM_WORLD); /* every rank out of the last call before any refills */
        if (coll != C_BROADCAST && !in_place)
          memset(recv, 0, out_elems * sizeof(float));
        fill(coll, rank, n, in, recv, count);
      } else if (coll == C_BROADCAST && rank != 0) {
        memset(recv, 0xa5, count * sizeof(float));
      }
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      call(coll, arg, recv, count);
      times[it] = MPI_Wtime() - t0;
    }
    MPI_Allreduce(MPI_IN_PLACE, times, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    qsort(times, (size_t)iters, sizeof(double), cmp_double);
    double slowest = iters % 2 ? times[iters / 2] : 0.5 * (times[iters / 2 - 1] + times[iters / 2]);

    /* Validation call on fresh inputs and poisoned outputs (in place: all but the input). */
    if (coll != C_BROADCAST)
      for (size_t i = 0; i < bytes_elems; i++)
        recv[i] = NAN;
    fill(coll, rank, n, in, recv, count);
    call(coll, arg, recv, count);
    long long wrong = check(coll, rank, n, recv, count), all_wrong = 0;
    MPI_Reduce(&wrong, &all_wrong, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);

    if (rank == 0) {
      double bytes = (double)bytes_elems * sizeof(float);
      double algbw = bytes / slowest / 1e9;
      double factor = coll == C_ALLREDUCE ? 2.0 * (n - 1) / n : coll == C_BROADCAST ? 1.0 : (double)(n - 1) / n;
      printf("%s\n {\"bytes\": %.0f, \"count\": %zu, \"dtype\": \"f32\", \"time_us\": %.3f, \"algbw_gbs\": %.4f, "
             "\"busbw_gbs\": %.4f, \"wrong\": %lld, \"iters\": %d, \"ranks\": %d}",
             printed ? "," : "", bytes, bytes_elems, slowest * 1e6, algbw, algbw * factor, all_wrong, iters, n);
      printed = 1;
      fflush(stdout);
    }
  }
  if (rank == 0)
    printf("\n]\n");
  free(times);
  free(send);
  free(recv);
  MPI_Finalize();
  return 0;
}
