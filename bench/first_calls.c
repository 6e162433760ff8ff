/* first_calls.c - the time of every call of a loop of small allreduces, for what a median hides:
 * slow calls at the start of a job (a start-up transient) or now and then (a rank descheduled).
 * `dtrain bench` reports medians over its timed calls after a warm-up; this reports the first
 * calls one by one and, in ten windows of the loop, each window's median and mean.
 *
 * Run one process per rank under the launcher, e.g. 4 ranks on tcp, pinned as `dtrain bench`
 * pins them:
 *   DTRAIN_TRANSPORT=tcp DTRAIN_BIND=auto build/dtrain run -n 4 -- first_calls --calls 3000
 * Rank 0 prints one JSON object: {"first_us": [...12 calls...], "windows": [{"median_us", "mean_us"}
 * x 10], "max_first_us", "total_ms"}. A call's time is this rank's, from entering the allreduce
 * to its return; the loop starts after a barrier.
 *
 * Build (links libdtrain; its MPI backend needs Open MPI's library when it was built with it):
 *   gcc -O2 -Iinclude bench/first_calls.c -o first_calls build/libdtrain.a -lmpi -lopenblas -lz -lm -lpthread
 * --settle-ms M sleeps M ms on every rank (then a barrier) before the loop: on the Zen 5 guest of
 * 2026-12-03 the memory-bound calls of a job's first second ran up to 2x slower whatever ran them
 * (bench/results/single-copy-2026-12-03-zen5.txt), and this tells such a start-up transient from
 * one of the calls themselves.
 * Unlike the dtrain command, this program keeps the thread pool OpenBLAS starts when it is loaded,
 * which spins for its first 0.1 s or so (bench/results/blas-pool-2026-12-06-zen4.txt): run it with
 * OPENBLAS_NUM_THREADS=1 to start as a dtrain worker does.
 * Usage: first_calls [--calls N] [--count FLOATS] [--settle-ms M]
 *   (exit 2 on bad usage, 1 on a failed call) */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dtrain/comm.h"
#include "dtrain/core.h"

#define FIRST 12
#define WINDOWS 10

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* A whole number in [lo, hi], else -1. */
static long number(const char *s, long lo, long hi) {
  char *end;
  long v = strtol(s, &end, 10);
  return *s && !*end && v >= lo && v <= hi ? v : -1;
}

int main(int argc, char **argv) {
  long calls = 3000, count = 1, settle_ms = 0;
  for (int i = 1; i < argc; i++) {
    long *dst = !strcmp(argv[i], "--calls")         ? &calls
                : !strcmp(argv[i], "--count")       ? &count
                : !strcmp(argv[i], "--settle-ms") ? &settle_ms
                                                    : NULL;
    long lo = dst == &calls ? WINDOWS * 2 : dst == &settle_ms ? 0 : 1;
    if (!dst || i + 1 >= argc || (*dst = number(argv[++i], lo, 100000000)) < 0) {
      fprintf(stderr, "usage: first_calls [--calls N >= %d] [--count FLOATS >= 1] [--settle-ms M >= 0]\n",
              WINDOWS * 2);
      return 2;
    }
  }
  dt_comm *c = NULL;
  if (dt_comm_create(NULL, &c) != DT_OK) {
    fprintf(stderr, "first_calls: %s\n", dt_last_error());
    return 1;
  }
  float *buf = calloc((size_t)count, sizeof *buf);
  double *t = malloc((size_t)calls * sizeof *t), *sorted = malloc((size_t)calls * sizeof *sorted);
  if (!buf || !t || !sorted) {
    fprintf(stderr, "first_calls: out of memory\n");
    return 1;
  }
  struct timespec settle = {settle_ms / 1000, settle_ms % 1000 * 1000000};
  while (settle_ms && nanosleep(&settle, &settle) != 0 && errno == EINTR)
    ;
  if (dt_comm_barrier(c) != DT_OK) {
    fprintf(stderr, "first_calls: barrier: %s\n", dt_last_error());
    return 1;
  }
  double t0 = now_us();
  for (long i = 0; i < calls; i++) {
    double s = now_us();
    if (dt_comm_allreduce(c, DT_IN_PLACE, buf, (size_t)count, DT_F32, DT_SUM) != DT_OK) {
      fprintf(stderr, "first_calls: allreduce #%ld: %s\n", i, dt_last_error());
      return 1;
    }
    t[i] = now_us() - s;
  }
  double total = now_us() - t0, max_first = 0;
  if (dt_comm_rank(c) == 0) {
    printf("{\"first_us\": [");
    for (int i = 0; i < FIRST && i < calls; i++) {
      printf("%s%.1f", i ? ", " : "", t[i]);
      max_first = t[i] > max_first ? t[i] : max_first;
    }
    printf("], \"windows\": [");
    long w = calls / WINDOWS;
    for (int k = 0; k < WINDOWS; k++) {
      double sum = 0;
      for (long i = 0; i < w; i++)
        sum += t[k * w + i];
      memcpy(sorted, t + k * w, (size_t)w * sizeof *t);
      qsort(sorted, (size_t)w, sizeof *sorted, cmp_double);
      printf("%s{\"median_us\": %.1f, \"mean_us\": %.1f}", k ? ", " : "", sorted[w / 2], sum / (double)w);
    }
    printf("], \"max_first_us\": %.1f, \"total_ms\": %.1f}\n", max_first, total / 1000.0);
  }
  free(buf);
  free(t);
  free(sorted);
  dt_comm_destroy(c);
  return 0;
}
