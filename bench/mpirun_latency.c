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
 * says why that is no MPI_Bcast). Bad usage exits 2. Per round and library, two timings of I
 * calls (f32 sum, B bytes) after 100 untimed ones:
 *   after barrier: every call follows a barrier of the same library; per call the slower rank's
 *                  time counts (what bench/compare-peers measures);
 *   late rank 0:   rank 0 spins 3 us after the barrier before it calls, so the other rank's part
 *                  is already there; rank 0's time is its own path through the library plus one
 *                  fetch of the other's data.
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
  double *t = malloc(sizeof(double) * (size_t)iters), *worst = malloc(sizeof(double) * (size_t)iters);
  for (int i = 0; i < n; i++)
    in[i] = (float)(rank + 1);
  const float want = (float)(size * (size + 1) / 2);
  int wrong = 0;
  for (int r = 0; r < rounds; r++)
    for (int late = 0; late < 2; late++)
      for (int lib = 0; lib < 2; lib++) { /* lib 0: Open MPI, 1: dtrain */
        for (int i = 0; i < iters + 100; i++) {
          if (lib)
            dt_comm_barrier(c);
          else
            MPI_Barrier(MPI_COMM_WORLD);
          if (late && rank == 0)
            for (double s = now_ns(); now_ns() - s < 3000;) {
            }
          out[0] = 0;
          double a = now_ns();
          if (lib ? dt_comm_allreduce(c, in, out, (size_t)n, DT_F32, DT_SUM) != DT_OK
                  : MPI_Allreduce(in, out, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS) {
            fprintf(stderr, "rank %d: allreduce failed: %s\n", rank, lib ? dt_last_error() : "MPI");
            MPI_Abort(MPI_COMM_WORLD, 1);
          }
          double b = now_ns();
          wrong += out[0] != want || out[n - 1] != want;
          if (i >= 100)
            t[i - 100] = b - a;
        }
        if (late)
          MPI_Bcast(t, iters, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        else
          MPI_Allreduce(t, worst, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        double *v = late ? t : worst;
        qsort(v, (size_t)iters, sizeof(double), cmp_double);
        if (rank == 0)
          printf("round %d, %d B, %-13s %-7s median %5.0f ns (p10 %5.0f, p90 %5.0f)\n", r, n * 4,
                 late ? "late rank 0:" : "after barrier:", lib ? "dtrain" : "openmpi", v[iters / 2], v[iters / 10],
                 v[iters * 9 / 10]);
      }
  MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0 && wrong)
    printf("%d wrong sums\n", wrong);
  dt_comm_destroy(c);
  free(in);
  free(out);
  free(t);
  free(worst);
  MPI_Finalize();
  return wrong ? 1 : 0;
}
