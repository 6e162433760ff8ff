/* mpirun_latency.c - dtrain's and Open MPI's small allreduce in one job started by mpirun, so
 * both run with the placement and binding mpirun gives (by default, two ranks bound to a core
 * each), the libraries alternated round by round.
 *
 *   mpicc -O2 -Iinclude bench/mpirun_latency.c build/libdtrain.a $(pkg-config --libs openblas) \
 *       -lz -lm -lpthread -o mpirun_latency
 *   mpirun -np 2 -x DTRAIN_JOB_SECRET=s ./mpirun_latency [--iters I (20000)] [--rounds R (3)]
 *       [--bytes B (4)]
 *
 * dtrain joins through Open MPI's environment (OMPI_COMM_WORLD_*) and takes its own transport
 * (shm on one host); without MASTER_ADDR it learns the store's address over MPI (src/comm/mpi/mpi.c
 * says why that is no MPI_Bcast). Bad usage exits 2. Per round and library, three timings of I
 * calls (f32 sum, B bytes) after 100 untimed ones, each call after a barrier of the same library:
 *   after barrier: per call the slowest rank's time counts (what bench/compare-peers measures);
 *   late rank 0:   rank 0 spins 3 us after the barrier before it calls, so the others' parts are
 *                  already there; rank 0's time is its own path through the library plus the
 *                  fetch of the others' data;
 *   turns:         rank i % N spins 1 us before barrier i, so the ranks take turns arriving
 *                  last; as "after barrier", plus how far apart in time the ranks left each
 *                  barrier (the latest exit minus the earliest), which the call after it pays.
 * Prints the median and the 10th and 90th percentiles, in ns. Exits 1 if a sum is wrong. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dtrain/comm.h"
#include "dtrain/core.h"

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static void spin_ns(double ns) {
  for (double s = now_ns(); now_ns() - s < ns;) {
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int iters = 20000, rounds = 3, bytes = 4;
  for (int i = 1; i < argc; i += 2) {
    int *v = !strcmp(argv[i], "--iters") ? &iters : !strcmp(argv[i], "--rounds") ? &rounds
                                                   : !strcmp(argv[i], "--bytes")  ? &bytes
                                                                                  : NULL;
    if (!v || i + 1 == argc || (*v = atoi(argv[i + 1])) <= 0) {
      fprintf(stderr, "usage: mpirun_latency [--iters I] [--rounds R] [--bytes B]\n");
      return 2;
    }
  }
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  dt_comm *c = NULL;
  if (dt_comm_create(NULL, &c) != DT_OK) {
    fprintf(stderr, "rank %d: dt_comm_create: %s\n", rank, dt_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  const int n = bytes / 4 > 0 ? bytes / 4 : 1;
  float *in = malloc(sizeof(float) * (size_t)n), *out = malloc(sizeof(float) * (size_t)n);
  double *t = malloc(sizeof(double) * (size_t)iters), *exit_hi = malloc(sizeof(double) * (size_t)iters),
         *exit_lo = malloc(sizeof(double) * (size_t)iters);
  for (int i = 0; i < n; i++)
    in[i] = (float)(rank + 1);
  const float want = (float)(size * (size + 1) / 2);
  int wrong = 0;
  static const char *const mode_name[] = {"after barrier:", "late rank 0:", "turns:"};
  for (int r = 0; r < rounds; r++)
    for (int mode = 0; mode < 3; mode++)
      for (int lib = 0; lib < 2; lib++) { /* lib 0: Open MPI, 1: dtrain */
        for (int i = 0; i < iters + 100; i++) {
          if (mode == 2 && rank == i % size) /* this rank arrives last at this barrier */
            spin_ns(1000);
          if (lib)
            dt_comm_barrier(c);
          else
            MPI_Barrier(MPI_COMM_WORLD);
          double left = now_ns();
          if (mode == 1 && rank == 0)
            spin_ns(3000);
          out[0] = 0;
          double a = now_ns();
          if (lib ? dt_comm_allreduce(c, in, out, (size_t)n, DT_F32, DT_SUM) != DT_OK
                  : MPI_Allreduce(in, out, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS) {
            fprintf(stderr, "rank %d: allreduce failed: %s\n", rank, lib ? dt_last_error() : "MPI");
            MPI_Abort(MPI_COMM_WORLD, 1);
          }
          double b = now_ns();
          wrong += out[0] != want || out[n - 1] != want;
          if (i >= 100) {
            t[i - 100] = mode == 1 && rank != 0 ? 0 : b - a; /* late rank 0: its own time */
            exit_hi[i - 100] = left;
          }
        }
        MPI_Allreduce(MPI_IN_PLACE, t, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        qsort(t, (size_t)iters, sizeof(double), cmp_double);
        if (rank == 0)
          printf("round %d, %d B, %-15s %-7s median %5.0f ns (p10 %5.0f, p90 %5.0f)", r, n * 4, mode_name[mode],
                 lib ? "dtrain" : "openmpi", t[iters / 2], t[iters / 10], t[iters * 9 / 10]);
        if (mode == 2) { /* how far apart the ranks left each barrier: latest exit - earliest */
          memcpy(exit_lo, exit_hi, sizeof(double) * (size_t)iters);
          MPI_Allreduce(MPI_IN_PLACE, exit_hi, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
          MPI_Allreduce(MPI_IN_PLACE, exit_lo, iters, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
          for (int i = 0; i < iters; i++)
            exit_hi[i] -= exit_lo[i];
          qsort(exit_hi, (size_t)iters, sizeof(double), cmp_double);
          if (rank == 0)
            printf("; barrier exits apart: median %4.0f ns (p10 %4.0f, p90 %4.0f)", exit_hi[iters / 2],
                   exit_hi[iters / 10], exit_hi[iters * 9 / 10]);
        }
        if (rank == 0)
          printf("\n");
      }
  MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0 && wrong)
    printf("%d wrong sums\n", wrong);
  dt_comm_destroy(c);
  free(in);
  free(out);
  free(t);
  free(exit_hi);
  free(exit_lo);
  MPI_Finalize();
  return wrong ? 1 : 0;
}
