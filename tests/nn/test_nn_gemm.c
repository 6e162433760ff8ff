/* test_nn_gemm.c - dt__nn_sgemm against a double-precision reference: all four transpose
 * combinations, every size in {1, 7, 15, 17, 31, 33, 100, 257} for M, N and K, alpha and beta in
 * {0, 1, other} (beta == 0 must ignore NaN already in C), leading dimensions wider than the
 * matrices (the padding must stay untouched), the engine's own layer shapes, and the tiles and
 * limits of the few-rows x W^T path.
 *
 * The implementation is chosen once per process from DTRAIN_GEMM, so the test runs itself as
 * child processes: "own" (dtrain's AVX-512 kernel on a CPU with AVX-512F, its AVX2 kernel on one
 * with AVX2 and FMA), the AVX2 kernel forced (so a CPU with AVX-512F tests it too) and "blas"
 * (OpenBLAS), and checks that a bad DTRAIN_GEMM value is refused. The OpenBLAS child first ends
 * OpenBLAS's thread pool as the dtrain command does (dt__nn_blas_serial), and another child checks
 * that the pool's threads are gone. */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cblas.h>
#include <cmocka.h>

#include "nn/nn.h"

extern char **environ;

static const int SIZES[] = {1, 7, 15, 17, 31, 33, 100, 257};
#define NSIZES ((int)(sizeof SIZES / sizeof SIZES[0]))

static uint64_t g_seed = 1;
static float frand(void) { /* [-1, 1) */
  g_seed = g_seed * 6364136223846793005ULL + 1442695040888963407ULL;
  return (float)((double)(g_seed >> 40) / (double)(1ULL << 23) - 1.0);
}

/* n bytes on a 64-byte boundary, as the engine's buffers are. */
static void *alloc64(size_t n) { return aligned_alloc(64, (n + 63) / 64 * 64); }

/* Floats by which check_one shifts B off its 64-byte line (the engine's weights sit 40 bytes
 * past one). */
static int g_boff;

/* One product: op(A) M x K, op(B) K x N, each stored with its leading dimension padded by pad
 * floats of NaN; C likewise. Checks every element of C against the reference and that C's
 * padding is still NaN. Returns the number of wrong elements (and prints the first). */
static int check_one(bool ta, bool tb, int M, int N, int K, float alpha, float beta, int pad) {
  int ar = ta ? K : M, ac = ta ? M : K; /* stored shapes */
  int br = tb ? N : K, bc = tb ? K : N;
  int lda = ac + pad, ldb = bc + pad, ldc = N + pad;
  float *A = alloc64(sizeof(float) * (size_t)ar * lda);
  float *B = (float *)alloc64(sizeof(float) * ((size_t)br * ldb + (size_t)g_boff)) + g_boff;
  float *C = alloc64(sizeof(float) * (size_t)M * ldc);
  double *R = malloc(sizeof(double) * (size_t)M * N); /* reference */
  double *S = malloc(sizeof(double) * (size_t)M * N); /* magnitude: sum |alpha a b| + |beta c| */
  assert_non_null(A);
  assert_non_null(B);
  assert_non_null(C);
  assert_non_null(R);
  assert_non_null(S);
  for (int i = 0; i < ar; i++)
    for (int j = 0; j < lda; j++)
      A[(size_t)i * lda + j] = j < ac ? frand() : NAN;
  for (int i = 0; i < br; i++)
    for (int j = 0; j < ldb; j++)
      B[(size_t)i * ldb + j] = j < bc ? frand() : NAN;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < ldc; j++)
      C[(size_t)i * ldc + j] = j < N && beta != 0.0f ? frand() : NAN;
  int bad = 0;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double s = 0, sa = 0;
      for (int k = 0; k < K; k++) {
        double a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
        double b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
        s += a * b;
        sa += fabs(a * b);
      }
      double c = beta != 0.0f ? C[(size_t)i * ldc + j] : 0.0;
      R[(size_t)i * N + j] = (double)alpha * s + (double)beta * c;
      S[(size_t)i * N + j] = fabs((double)alpha) * sa + fabs((double)beta * c);
    }
  dt__nn_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  for (int i = 0; i < M; i++)
    for (int j = 0; j < ldc; j++) {
      float got = C[(size_t)i * ldc + j];
      if (j >= N) {
        if (!isnan(got) && bad++ == 0)
          fprintf(stderr, "ta=%d tb=%d M=%d N=%d K=%d: padding C[%d][%d] written (%g)\n", ta, tb, M,
                  N, K, i, j, got);
        continue;
      }
      double ref = R[(size_t)i * N + j];
      /* float rounding of K products and sums, relative to the magnitudes summed */
      double tol = 1e-6 * (K + 4) * S[(size_t)i * N + j] + 1e-30;
      if (!(fabs(got - ref) <= tol) && bad++ == 0)
        fprintf(stderr, "ta=%d tb=%d M=%d N=%d K=%d alpha=%g beta=%g pad=%d: C[%d][%d] = %.9g, "
                "expected %.9g\n", ta, tb, M, N, K, alpha, beta, pad, i, j, got, ref);
    }
  free(A);
  free(B - g_boff);
  free(C);
  free(R);
  free(S);
  return bad;
}

/* Every size triple, each transpose combination, with general alpha and beta. */
static void test_sizes(void **state) {
  int bad = 0;
  for (int t = 0; t < 4; t++)
    for (int a = 0; a < NSIZES; a++)
      for (int b = 0; b < NSIZES; b++)
        for (int c = 0; c < NSIZES; c++)
          bad += check_one(t & 1, t >> 1, SIZES[a], SIZES[b], SIZES[c], 1.25f, -0.5f, 0) != 0;
  assert_int_equal(bad, 0);
}

/* alpha and beta in {0, 1, other}; beta == 0 over a C full of NaN. */
static void test_alpha_beta(void **state) {
  static const float AL[] = {0.0f, 1.0f, -0.75f}, BE[] = {0.0f, 1.0f, 2.5f};
  static const int dims[][3] = {{17, 33, 31}, {100, 7, 257}, {1, 257, 15}, {33, 100, 1}};
  int bad = 0;
  for (int t = 0; t < 4; t++)
    for (int x = 0; x < 3; x++)
      for (int y = 0; y < 3; y++)
        for (int d = 0; d < 4; d++)
          bad += check_one(t & 1, t >> 1, dims[d][0], dims[d][1], dims[d][2], AL[x], BE[y], 0) != 0;
  assert_int_equal(bad, 0);
}

/* Leading dimensions wider than the rows: the padding is NaN in A and B (must not be read) and in
 * C (must not be written). */
static void test_leading_dims(void **state) {
  static const int pads[] = {1, 3, 16, 35};
  int bad = 0;
  for (int t = 0; t < 4; t++)
    for (int p = 0; p < 4; p++)
      for (int a = 0; a < NSIZES; a += 2)
        for (int b = 1; b < NSIZES; b += 2)
          bad += check_one(t & 1, t >> 1, SIZES[a], SIZES[b], SIZES[(a + b) % NSIZES], 0.5f,
                           p % 2 ? 0.0f : 1.0f, pads[p]) != 0;
  assert_int_equal(bad, 0);
}

/* The shapes the engine runs (one thread's slice): linear fwd/dW/dX of mlp and cnn, conv forward,
 * dW and dX of both cnn layers (a 6-sample im2col chunk of conv2). */
static void test_engine_shapes(void **state) {
  static const struct {
    bool ta, tb;
    int M, N, K;
    float beta;
  } s[] = {
      {false, true, 64, 1024, 784, 0.0f},  {false, true, 64, 10, 1024, 0.0f},
      {true, false, 512, 1024, 128, 1.0f}, {false, false, 64, 784, 1024, 0.0f},
      {false, true, 1176, 64, 800, 0.0f},  {false, true, 784, 32, 25, 0.0f},
      {true, false, 64, 800, 1176, 1.0f},  {true, false, 32, 25, 1568, 1.0f},
      {false, false, 1176, 800, 64, 0.0f}, {false, true, 64, 512, 3136, 0.0f},
  };
  int bad = 0;
  for (size_t i = 0; i < sizeof s / sizeof s[0]; i++)
    bad += check_one(s[i].ta, s[i].tb, s[i].M, s[i].N, s[i].K, 1.0f, s[i].beta, 0) != 0;
  assert_int_equal(bad, 0);
}

/* x W^T with few rows, as a worker's batch slice makes (op(A) = A, op(B) = B^T, M <= 65 with
 * K up to 1040): every row tail of the micro-kernel's tiles, column tails, K in whole 16-float
 * loads and with a tail, alpha and beta general, 1 and 0, and A's and B's rows on and off the
 * 64-byte grid (the engine's weights sit 40 bytes past one). */
static void test_few_rows_shapes(void **state) {
  static const int Ms[] = {1, 3, 4, 5, 63, 64, 65}, Ns[] = {1, 4, 5, 6, 7, 11, 12, 13, 25};
  static const int Ks[] = {16, 17, 48, 1000, 1024, 1040};
  static const float AB[][2] = {{1.25f, -0.5f}, {1.0f, 1.0f}, {-0.75f, 0.0f}};
  int bad = 0;
  for (int a = 0; a < 7; a++)
    for (int b = 0; b < 9; b++)
      for (int c = 0; c < 6; c++) {
        int v = (a + b + c) % 3;
        int pad = (16 - Ks[c] % 16) % 16 + ((a + c) % 2 ? 16 : 0); /* K + pad: a multiple of 16 */
        bad += check_one(false, true, Ms[a], Ns[b], Ks[c], AB[v][0], AB[v][1], pad) != 0;
        if (b == 8) { /* A's rows off the 64-byte grid; B's rows off it (as the engine's W) */
          bad += check_one(false, true, Ms[a], Ns[b], Ks[c], AB[v][0], AB[v][1], pad + 1) != 0;
          g_boff = 10;
          bad += check_one(false, true, Ms[a], Ns[b], Ks[c], AB[v][0], AB[v][1], pad) != 0;
          g_boff = 0;
        }
      }
  assert_int_equal(bad, 0);
}

/* Runs this program with DTRAIN_GEMM=mode and argument arg; returns its exit status. */
static int run_child(const char *self, const char *mode, const char *arg) {
  char var[64];
  snprintf(var, sizeof var, "DTRAIN_GEMM=%s", mode);
  size_t n = 0;
  while (environ[n])
    n++;
  char **env = calloc(n + 2, sizeof *env);
  assert_non_null(env);
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (strncmp(environ[i], "DTRAIN_GEMM=", 12) != 0)
      env[k++] = environ[i];
  env[k++] = var;
  char *argv[] = {(char *)self, (char *)arg, NULL};
  pid_t pid;
  int rc = posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, env);
  free(env);
  assert_int_equal(rc, 0);
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static const char *g_self;

static bool have_avx2(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

static void test_own(void **state) {
  if (!__builtin_cpu_supports("avx512f") && !have_avx2()) {
    print_message("no AVX-512F and no AVX2 with FMA here: DTRAIN_GEMM=own must be refused\n");
    assert_int_equal(run_child(g_self, "own", "--check"), 3);
    skip();
  }
  assert_int_equal(run_child(g_self, "own", "--run"), 0);
}

/* The AVX2 kernel, also where AVX-512F would be chosen. */
static void test_avx2(void **state) {
  if (!have_avx2())
    skip();
  assert_int_equal(run_child(g_self, "own", "--run-avx2"), 0);
}

static void test_blas(void **state) { assert_int_equal(run_child(g_self, "blas", "--run"), 0); }

/* This process's threads. */
static int count_threads(void) {
  DIR *d = opendir("/proc/self/task");
  if (!d)
    return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));)
    n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* The child of test_blas_pool: exit 0 when dt__nn_blas_serial ended OpenBLAS's pool, 77 when
 * OpenBLAS started none here (one CPU, or a build without threads), 1 when threads stayed. */
static int blas_pool_child(void) {
  int before = count_threads();
  dt__nn_blas_serial();
  /* a joined thread can stay listed for a moment while the kernel reaps it: up to 2 s */
  int after = count_threads();
  for (int i = 0; i < 2000 && after >= before && before > 1; i++) {
    usleep(1000);
    after = count_threads();
  }
  dt__nn_blas_serial(); /* a second call finds no pool and changes nothing */
  int again = count_threads();
  printf("threads: %d at the start, %d after the pool's end, %d after a second call\n", before, after, again);
  if (before < 0 || after < 0 || again != after)
    return 1;
  if (before == 1)
    return 77;
  return after < before ? 0 : 1;
}

/* OpenBLAS's pool (one idle thread per further CPU, spinning at the start) ends. */
static void test_blas_pool(void **state) {
  int rc = run_child(g_self, "blas", "--pool");
  if (rc == 77)
    skip();
  assert_int_equal(rc, 0);
}

/* A misspelt DTRAIN_GEMM stops model creation with a message rather than being ignored. */
static void test_bad_env(void **state) { assert_int_equal(run_child(g_self, "fast", "--check"), 4); }

int main(int argc, char **argv) {
  g_self = argv[0];
  if (argc > 1 && !strcmp(argv[1], "--check")) { /* exit 0 ok, 3 unsupported, 4 invalid */
    dt_status st = dt__nn_gemm_check();
    if (st != DT_OK)
      fprintf(stderr, "%s\n", dt_last_error());
    return st == DT_OK ? 0 : st == DT_ERR_UNSUPPORTED ? 3 : st == DT_ERR_INVALID ? 4 : 5;
  }
  if (argc > 1 && !strcmp(argv[1], "--pool"))
    return blas_pool_child();
  if (argc > 1 && (!strcmp(argv[1], "--run") || !strcmp(argv[1], "--run-avx2"))) {
    dt__nn_blas_serial(); /* as the dtrain command runs it: the engine's own threads split the work */
    if (dt__nn_gemm_check() != DT_OK) {
      fprintf(stderr, "%s\n", dt_last_error());
      return 1;
    }
    bool own = strcmp(getenv("DTRAIN_GEMM"), "own") == 0;
    const char *want = !own ? "openblas" : __builtin_cpu_supports("avx512f") ? "avx512" : "avx2";
    if (!strcmp(argv[1], "--run-avx2")) {
      if (!dt__nn_gemm_force_avx2()) {
        fprintf(stderr, "the AVX2 kernel could not be forced\n");
        return 1;
      }
      want = "avx2";
    }
    if (strcmp(dt__nn_gemm_name(), want) != 0) {
      fprintf(stderr, "DTRAIN_GEMM=%s ran %s\n", getenv("DTRAIN_GEMM"), dt__nn_gemm_name());
      return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_alpha_beta),
        cmocka_unit_test(test_leading_dims),
        cmocka_unit_test(test_engine_shapes),
        cmocka_unit_test(test_few_rows_shapes),
    };
    return cmocka_run_group_tests_name(want, tests, NULL, NULL) == 0 ? 0 : 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_own),
      cmocka_unit_test(test_avx2),
      cmocka_unit_test(test_blas),
      cmocka_unit_test(test_blas_pool),
      cmocka_unit_test(test_bad_env),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
