/* sgemm_peak.c - the machine's single-precision matrix-multiply rate through CBLAS (OpenBLAS),
 * the compute ceiling that bench/train-vs-pytorch states a training step's FLOP rate against.
 *
 * C = A * B with square n x n float matrices, 2 n^3 FLOPs per call, best of several calls after
 * a warm-up, for each requested thread count (openblas_set_num_threads). It deliberately measures
 * one large square shape only: it is the ceiling, not a model of the network's smaller shapes.
 *
 * Usage: sgemm_peak [--n 1024] [--threads 1,2] [--reps R]   -> one JSON object on stdout. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* OpenBLAS's own entry point (declared in its cblas.h too; repeated so the intent is plain). */
void openblas_set_num_threads(int num_threads);

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  int n = 1024, reps = 10;
  char threads_arg[64] = "1,2";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--n") && i + 1 < argc)
      n = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      snprintf(threads_arg, sizeof threads_arg, "%s", argv[++i]);
    else {
      fprintf(stderr, "usage: sgemm_peak [--n N] [--threads 1,2] [--reps R]\n");
      return 2;
    }
  }
  if (n < 16 || n > 8192 || reps < 1) {
    fprintf(stderr, "sgemm_peak: --n must be in 16..8192 and --reps >= 1\n");
    return 2;
  }
  size_t nn = (size_t)n * n;
  float *a = malloc(nn * sizeof(float)), *b = malloc(nn * sizeof(float)), *c = malloc(nn * sizeof(float));
  if (!a || !b || !c) {
    fprintf(stderr, "sgemm_peak: cannot allocate 3 x %d x %d floats\n", n, n);
    return 1;
  }
  for (size_t i = 0; i < nn; i++) {
    a[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
    b[i] = (float)((i * 5) % 11) / 11.0f - 0.5f;
    c[i] = 0.0f;
  }
  printf("{\"n\": %d, \"reps\": %d, \"results\": [", n, reps);
  int first = 1;
  char *save = NULL;
  for (char *tok = strtok_r(threads_arg, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    int nt = atoi(tok);
    if (nt < 1 || nt > 256) {
      fprintf(stderr, "sgemm_peak: thread count %d out of 1..256\n", nt);
      return 2;
    }
    openblas_set_num_threads(nt);
    double best = 1e30;
    for (int r = 0; r < reps + 2; r++) { /* two warm-up calls: thread pool start, page faults */
      double t0 = now_s();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
      double dt = now_s() - t0;
      if (r >= 2 && dt < best)
        best = dt;
    }
    double gflops = 2.0 * n * (double)n * n / best / 1e9;
    printf("%s{\"threads\": %d, \"gflops\": %.2f, \"best_s\": %.6f}", first ? "" : ", ", nt, gflops, best);
    first = 0;
  }
  /* Check one element so a broken BLAS cannot report a rate for wrong work. */
  double ref = 0.0;
  for (int k = 0; k < n; k++)
    ref += (double)a[(size_t)3 * n + k] * b[(size_t)k * n + 5];
  double got = c[(size_t)3 * n + 5];
  int ok = (got - ref) * (got - ref) <= 1e-6 * (1.0 + ref * ref) * n;
  printf("], \"check_ok\": %s}\n", ok ? "true" : "false");
  free(a);
  free(b);
  free(c);
  return ok ? 0 : 1;
}
