/* nn_step.c - samples/s of one training step (zero_grad + forward + backward + SGD momentum
 * update) of a model on random data, and the machine's sgemm GFLOP/s for reference. Not a test:
 * it times things, so run it on a quiet machine and alternate settings.
 *   build: cc -O2 -Iinclude bench/nn_step.c -o nn_step build/libdtrain.a -lopenblas -lm -lpthread
 *   usage: nn_step MODEL [BATCH] [THREADS] [STEPS]      e.g. nn_step cnn 128 2 20
 * Prints the median step time (with min/max samples/s), the split forward/backward/update, and
 * the CPU time of all threads per step (wall ~ cpu / threads means the threads scale). */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "dtrain/nn.h"

static double cpu_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  printf("OpenBLAS core %s\n", openblas_get_corename());
  const char *spec = argc > 1 ? argv[1] : "mlp";
  int B = argc > 2 ? atoi(argv[2]) : 128;
  int threads = argc > 3 ? atoi(argv[3]) : 1;
  int steps = argc > 4 ? atoi(argv[4]) : 30;
  dt_nn_set_threads(threads);
  dt_model *m;
  if (dt_model_create(spec, B, 1, &m) != DT_OK) {
    fprintf(stderr, "%s\n", dt_last_error());
    return 2;
  }
  dt_optim_config oc = dt_optim_defaults(DT_OPTIM_SGD);
  oc.momentum = 0.9f;
  dt_optim *o;
  dt_optim_create(&oc, m, &o);
  size_t in = dt_model_input_size(m);
  float *x = malloc(sizeof(float) * in * B);
  int32_t *y = malloc(sizeof(int32_t) * B);
  dt_rng r;
  dt_rng_seed(&r, 7);
  for (size_t i = 0; i < in * B; i++)
    x[i] = (float)dt_rng_uniform(&r);
  for (int i = 0; i < B; i++)
    y[i] = (int32_t)dt_rng_below(&r, dt_model_output_size(m));
  double *t = malloc(sizeof(double) * steps);
  double tf = 0, tb = 0, tu = 0, c0 = 0;
  for (int s = -3; s < steps; s++) {
    int64_t t0 = dt_now_ns();
    dt_model_zero_grad(m);
    dt_model_forward(m, x, B, 1, NULL);
    int64_t t1 = dt_now_ns();
    float loss;
    dt_model_backward(m, y, 1.0f, NULL, NULL, &loss);
    int64_t t2 = dt_now_ns();
    dt_optim_step(o, 0.01f);
    int64_t t3 = dt_now_ns();
    if (s == 0)
      c0 = cpu_s() - (t3 - t0) * 1e-9 * threads; /* approximate: count from step 0 */
    if (s >= 0) {
      t[s] = (t3 - t0) * 1e-9;
      tf += (t1 - t0) * 1e-9;
      tb += (t2 - t1) * 1e-9;
      tu += (t3 - t2) * 1e-9;
    }
  }
  double cpu = cpu_s() - c0;
  qsort(t, steps, sizeof(double), cmp);
  printf("%s B=%d threads=%d: median %.2f ms/step = %.0f samples/s (p10 step %.0f, min %.0f, "
         "max %.0f); fwd %.2f bwd %.2f upd %.2f ms\n",
         spec, B, threads, t[steps / 2] * 1e3, B / t[steps / 2], B / t[steps / 10],
         B / t[steps - 1], B / t[0],
         tf / steps * 1e3, tb / steps * 1e3, tu / steps * 1e3);
  printf("  cpu %.2f ms/step (all threads)\n", cpu / steps * 1e3);
  /* sgemm reference: 1024^3 with OpenBLAS's own threads */
  openblas_set_num_threads(threads);
  int n = 1024;
  float *a = calloc((size_t)n * n, 4), *b = calloc((size_t)n * n, 4), *c = calloc((size_t)n * n, 4);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
  int64_t g0 = dt_now_ns();
  for (int i = 0; i < 5; i++)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
  double gs = (dt_now_ns() - g0) * 1e-9;
  printf("sgemm %dx%dx%d: %.1f GFLOP/s\n", n, n, n, 5 * 2.0 * n * n * n / gs / 1e9);
  return 0;
}
