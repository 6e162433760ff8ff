/* sgemm_peak.c - the machine's single-precision matrix-multiply rate, the compute ceiling that
 * bench/train-vs-pytorch states a training step's FLOP rate against.
 *
 * C = A * B with square n x n float matrices, 2 n^3 FLOPs per call, best of several calls after
 * a warm-up, for each requested thread count. --gemm blas (default) times cblas_sgemm with
 * OpenBLAS's own threads (openblas_set_num_threads); --gemm own times dtrain's engine product
 * (dt__nn_sgemm, src/nn/gemm.c, forced with DTRAIN_GEMM=own), which is single-threaded, split by
 * rows over T threads as the engine splits its work. The square shape is the ceiling, not a model
 * of the network's smaller shapes: --shapes adds, for the chosen implementation on one thread, the
 * products a training step of mlp and cnn runs (one engine thread's slice at batch 128, or at
 * --batch B rows: 64 is each worker's shard of a 2-worker run at global batch 128), warm in cache
 * and timed in thread CPU time.
 *
 * Build (links libdtrain for --gemm own):
 *   gcc -O2 -Iinclude -Isrc bench/sgemm_peak.c -o sgemm_peak build/libdtrain.a -lopenblas -lz -lm -lpthread
 * Usage: sgemm_peak [--n 1024] [--threads 1,2] [--reps R] [--gemm blas|own] [--shapes] [--batch B]
 *   -> one JSON object on stdout. */
#include <cblas.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nn/nn.h"

/* OpenBLAS's own entry point (declared in its cblas.h too; repeated so the intent is plain). */
void openblas_set_num_threads(int num_threads);

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static bool g_own; /* --gemm own */

static void product(bool ta, bool tb, int M, int N, int K, const float *A, int lda, const float *B,
                    int ldb, float *C, int ldc) {
  if (g_own)
    dt__nn_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
  else
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
                K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
}

/* --gemm own with T threads: thread t computes rows [t n / T, (t+1) n / T) of C. */
typedef struct {
  int n, t, T;
  const float *a, *b;
  float *c;
} rows_job;

static void *rows_main(void *arg) {
  rows_job *j = arg;
  int r0 = (int)((long)j->n * j->t / j->T), r1 = (int)((long)j->n * (j->t + 1) / j->T);
  if (r1 > r0)
    product(false, false, r1 - r0, j->n, j->n, j->a + (size_t)r0 * j->n, j->n, j->b, j->n,
            j->c + (size_t)r0 * j->n, j->n);
  return NULL;
}

static int square(int n, int T, const float *a, const float *b, float *c) {
  if (!g_own || T == 1) {
    product(false, false, n, n, n, a, n, b, n, c, n);
    return 0;
  }
  pthread_t tid[256];
  rows_job jobs[256];
  for (int t = 0; t < T; t++) {
    jobs[t] = (rows_job){n, t, T, a, b, c};
    if (t > 0 && pthread_create(&tid[t], NULL, rows_main, &jobs[t]) != 0)
      return -1;
  }
  rows_main(&jobs[0]);
  for (int t = 1; t < T; t++)
    pthread_join(tid[t], NULL);
  return 0;
}

/* The products of one engine thread's training step at batch 128 (src/nn/layers.c): linear
 * forward x W^T, dW = dy^T x, dx = dy W; conv forward col W^T, dW = dy^T col, dcol = dy W, for a
 * 6-sample im2col chunk of conv2 and a 53-sample chunk of conv1 (one thread, batch 128). bat
 * names the dimension that is the batch ('M' or 'K'), which --batch sets for the linear layers
 * (the conv shapes are im2col chunks and keep theirs). */
static const struct {
  const char *name;
  bool ta, tb;
  int M, N, K;
  char bat;
} SHAPES[] = {
    {"mlp fc1 forward", false, true, 128, 1024, 784, 'M'},
    {"mlp fc1 dW", true, false, 1024, 784, 128, 'K'},
    {"mlp fc2 forward", false, true, 128, 1024, 1024, 'M'},
    {"mlp fc2 dW", true, false, 1024, 1024, 128, 'K'},
    {"mlp fc2 dx", false, false, 128, 1024, 1024, 'M'},
    {"mlp fc3 forward", false, true, 128, 10, 1024, 'M'},
    {"cnn conv1 forward", false, true, 41552, 32, 25, 0},
    {"cnn conv1 dW", true, false, 32, 25, 41552, 0},
    {"cnn conv2 forward", false, true, 1176, 64, 800, 0},
    {"cnn conv2 dW", true, false, 64, 800, 1176, 0},
    {"cnn conv2 dcol", false, false, 1176, 800, 64, 0},
    {"cnn fc1 forward", false, true, 128, 512, 3136, 'M'},
    {"cnn fc1 dW", true, false, 512, 3136, 128, 'K'},
    {"cnn fc1 dx", false, false, 128, 3136, 512, 'M'},
};
#define NSHAPES (sizeof SHAPES / sizeof SHAPES[0])

static double thread_cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Best rate of each shape on the calling thread over about 0.3 s of calls, timed in the thread's
 * CPU time (other jobs on the machine take turns, not rate); batch rows per thread for the
 * linear layers. Prints JSON rows. */
static void shapes(int reps, int batch) {
  int dims[NSHAPES][3];
  size_t most = 0;
  for (size_t i = 0; i < NSHAPES; i++) {
    dims[i][0] = SHAPES[i].bat == 'M' ? batch : SHAPES[i].M;
    dims[i][1] = SHAPES[i].N;
    dims[i][2] = SHAPES[i].bat == 'K' ? batch : SHAPES[i].K;
    size_t m = (size_t)dims[i][0], n = (size_t)dims[i][1], k = (size_t)dims[i][2];
    size_t e = m * k > k * n ? m * k : k * n;
    e = e > m * n ? e : m * n;
    most = e > most ? e : most;
  }
  /* on 64-byte lines, as the engine's activations and weights are (gemm.c's x W^T path needs it) */
  size_t bytes = (most * sizeof(float) + 63) / 64 * 64;
  float *a = aligned_alloc(64, bytes), *b = aligned_alloc(64, bytes), *c = aligned_alloc(64, bytes);
  if (!a || !b || !c) {
    fprintf(stderr, "sgemm_peak: cannot allocate the shape buffers\n");
    exit(1);
  }
  for (size_t i = 0; i < most; i++) {
    a[i] = (float)(i % 7) * 0.1f;
    b[i] = (float)(i % 5) * 0.1f;
  }
  openblas_set_num_threads(1);
  printf(", \"shapes\": [");
  for (size_t i = 0; i < NSHAPES; i++) {
    int M = dims[i][0], N = dims[i][1], K = dims[i][2];
    int lda = SHAPES[i].ta ? M : K, ldb = SHAPES[i].tb ? K : N;
    double flop = 2.0 * M * N * K;
    int calls = (int)(1e8 / flop) + 1;
    double best = 1e30;
    for (int r = 0; r < reps + 1; r++) {
      double t0 = thread_cpu_s();
      for (int q = 0; q < calls; q++)
        product(SHAPES[i].ta, SHAPES[i].tb, M, N, K, a, lda, b, ldb, c, N);
      double dt = (thread_cpu_s() - t0) / calls;
      if (r >= 1 && dt < best)
        best = dt;
    }
    printf("%s{\"name\": \"%s\", \"trans\": \"%c%c\", \"M\": %d, \"N\": %d, \"K\": %d, "
           "\"gflops\": %.2f}", i ? ", " : "", SHAPES[i].name, SHAPES[i].ta ? 'T' : 'N',
           SHAPES[i].tb ? 'T' : 'N', M, N, K, flop / best / 1e9);
  }
  printf("]");
  free(a);
  free(b);
  free(c);
}

int main(int argc, char **argv) {
  int n = 1024, reps = 10, batch = 128;
  bool with_shapes = false;
  char threads_arg[64] = "1,2";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--n") && i + 1 < argc)
      n = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      snprintf(threads_arg, sizeof threads_arg, "%s", argv[++i]);
    else if (!strcmp(argv[i], "--gemm") && i + 1 < argc && (!strcmp(argv[i + 1], "own") || !strcmp(argv[i + 1], "blas")))
      g_own = !strcmp(argv[++i], "own");
    else if (!strcmp(argv[i], "--shapes"))
      with_shapes = true;
    else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
      batch = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: sgemm_peak [--n N] [--threads 1,2] [--reps R] [--gemm blas|own] [--shapes] "
                      "[--batch B]\n");
      return 2;
    }
  }
  if (g_own) {
    setenv("DTRAIN_GEMM", "own", 1); /* read once, at the first product below */
    if (dt__nn_gemm_check() != DT_OK) {
      fprintf(stderr, "sgemm_peak: --gemm own: %s\n", dt_last_error());
      return 1;
    }
  }
  if (n < 16 || n > 8192 || reps < 1 || batch < 1 || batch > 4096) {
    fprintf(stderr, "sgemm_peak: --n must be in 16..8192, --reps >= 1, --batch in 1..4096\n");
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
  printf("{\"gemm\": \"%s%s\", \"n\": %d, \"reps\": %d, \"results\": [", g_own ? "dtrain-" : "",
         g_own ? dt__nn_gemm_name() : "openblas", n, reps);
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
      if (square(n, nt, a, b, c) != 0) {
        fprintf(stderr, "sgemm_peak: cannot start %d threads\n", nt);
        return 1;
      }
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
  printf("], \"check_ok\": %s", ok ? "true" : "false");
  if (with_shapes)
    shapes(reps, batch);
  printf("}\n");
  free(a);
  free(b);
  free(c);
  return ok ? 0 : 1;
}
