/* dtype_ab.c - f32, f16 and bf16 allreduces of the same number of bytes, alternated call by call
 * in one job, so that the host's noise (other tenants, frequency, where the pages landed) hits
 * every dtype alike: issue 5's "f16 and bf16 at least as fast in bytes/s as f32" with a spread
 * of a percent or two where `bench/dtypes` (one process per dtype and run) sees 10-30%.
 *
 *   mpicc -O2 -Iinclude bench/dtype_ab.c build/libdtrain.a $(pkg-config --libs openblas) -lz -lm \
 *       -lpthread -o dtype_ab
 *   ./dtype_ab [--ranks N] [--iters I] BYTES...     (default 2 ranks, 2000 calls per dtype)
 *
 * Forks N ranks on loopback (tests/common/mp.h), bound to their CPUs as `dtrain bench` binds
 * them; the transport is the library's choice for one host (shm; DTRAIN_TRANSPORT overrides).
 * Per size, every rank allocates one input and one output of BYTES, and fills the input with the
 * 16-bit pattern 0x3c00 (1.0 in f16, 2^-7 in bf16, 2^-7 + 2^-21 + ... in f32: exact sums of up
 * to 8 ranks in all three), so the three dtypes read and write the same buffers and the same
 * lines. Each round runs one call of each dtype after a barrier, rotating which comes first; each
 * call counts with its slowest rank's time. Prints per size the median time of each dtype and
 * the half types' bytes/s ratio to f32 (> 1: faster), and fails if any output is wrong. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "../tests/common/mp.h"
#include <dtrain/comm.h>
#include <dtrain/core.h>

static int iters = 2000, warmup = 20;
static size_t bytes;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* Every element of out is n times the pattern, in dtype t. */
static int check(const void *out, size_t b, dt_dtype t, int n) {
  for (size_t i = 0; i < b / 4; i++) {
    uint32_t w;
    memcpy(&w, (const char *)out + i * 4, 4);
    uint16_t lo = (uint16_t)w, hi = (uint16_t)(w >> 16);
    float want32, got32;
    uint32_t pat = 0x3c003c00u;
    memcpy(&want32, &pat, 4);
    memcpy(&got32, &w, 4);
    if (t == DT_F32 && got32 != want32 * (float)n)
      return 1;
    if (t == DT_F16 || t == DT_BF16) {
      float one = t == DT_F16 ? 1.0f : ldexpf(1.0f, -7), got[2];
      for (int h = 0; h < 2; h++) {
        uint16_t v = h ? hi : lo;
        if (t == DT_BF16) {
          uint32_t u = (uint32_t)v << 16;
          memcpy(&got[h], &u, 4);
        } else { /* f16 of small integers: normal, exponent and 10 mantissa bits */
          got[h] = ldexpf(1.0f + (float)(v & 0x3ff) / 1024.0f, ((v >> 10) & 0x1f) - 15);
        }
      }
      if (got[0] != one * (float)n || got[1] != one * (float)n)
        return 1;
    }
  }
  return 0;
}

static int body(int rank, int n, void *arg) {
  (void)arg;
  dt_comm_config cfg;
  dt_comm_config_init(&cfg);
  cfg.bind = "auto";
  dt_comm *c = NULL;
  if (dt_comm_create(&cfg, &c)) {
    fprintf(stderr, "dtype_ab: rank %d: %s\n", rank, dt_last_error());
    return 1;
  }
  static const dt_dtype ts[3] = {DT_F32, DT_F16, DT_BF16};
  void *in = aligned_alloc(4096, bytes), *out = aligned_alloc(4096, bytes);
  double *t[3] = {calloc((size_t)iters, sizeof(double)), calloc((size_t)iters, sizeof(double)),
                  calloc((size_t)iters, sizeof(double))};
  int rc = 1, wrong = 0;
  if (!in || !out || !t[0] || !t[1] || !t[2]) {
    fprintf(stderr, "dtype_ab: rank %d: out of memory\n", rank);
    goto done;
  }
  for (size_t i = 0; i < bytes / 2; i++)
    ((uint16_t *)in)[i] = 0x3c00;
  for (int it = -warmup; it < iters; it++)
    for (int j = 0; j < 3; j++) {
      int k = (j + (it + warmup)) % 3; /* rotate which dtype comes first */
      bool checked = it == -warmup || it == iters - 1;
      if (checked)
        memset(out, 0, bytes);
      if (dt_comm_barrier(c))
        goto fail;
      double t0 = now_us();
      if (dt_comm_allreduce(c, in, out, bytes / dt_dtype_size(ts[k]), ts[k], DT_SUM))
        goto fail;
      double t1 = now_us();
      if (it >= 0)
        t[k][it] = t1 - t0;
      if (checked)
        wrong += check(out, bytes, ts[k], n);
    }
  for (int k = 0; k < 3; k++)
    if (dt_comm_allreduce(c, DT_IN_PLACE, t[k], (size_t)iters, DT_F64, DT_MAX))
      goto fail;
  if (dt_comm_allreduce(c, DT_IN_PLACE, &wrong, 1, DT_I32, DT_SUM))
    goto fail;
  if (rank == 0) {
    double med[3];
    for (int k = 0; k < 3; k++) {
      qsort(t[k], (size_t)iters, sizeof(double), cmp_double);
      med[k] = t[k][iters / 2];
    }
    printf("%zu B, %d ranks: f32 %.2f us, f16 %.2f us (%.3f), bf16 %.2f us (%.3f)%s\n", bytes, n, med[0], med[1],
           med[0] / med[1], med[2], med[0] / med[2], wrong ? "  WRONG RESULTS" : "");
    fflush(stdout);
  }
  rc = wrong != 0;
  goto done;
fail:
  fprintf(stderr, "dtype_ab: rank %d: %s\n", rank, dt_last_error());
done:
  free(in);
  free(out);
  for (int k = 0; k < 3; k++)
    free(t[k]);
  dt_comm_destroy(c);
  return rc;
}

static int usage(void) {
  fprintf(stderr, "usage: dtype_ab [--ranks 2..8] [--iters I] BYTES... (multiples of 64)\n");
  return 2;
}

/* A whole decimal (or 0x) number in [lo, hi], else -1. */
static long long number(const char *s, long long lo, long long hi) {
  char *end;
  long long v = strtoll(s, &end, 0);
  return end != s && !*end && v >= lo && v <= hi ? v : -1;
}

int main(int argc, char **argv) {
  int ranks = 2, nsizes = 0, failed = 0;
  size_t sizes[64];
  for (int i = 1; i < argc; i++) { /* everything is checked before anything runs */
    long long v;
    if (!strcmp(argv[i], "--ranks") && i + 1 < argc) {
      if ((v = number(argv[++i], 2, 8)) < 0)
        return usage();
      ranks = (int)v;
    } else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
      if ((v = number(argv[++i], 1, 10000000)) < 0)
        return usage();
      iters = (int)v;
    } else {
      if ((v = number(argv[i], 64, 1ll << 34)) < 0 || v % 64 || nsizes == 64)
        return usage();
      sizes[nsizes++] = (size_t)v;
    }
  }
  if (!nsizes)
    return usage();
  for (int k = 0; k < nsizes; k++) {
    bytes = sizes[k];
    failed += mp_run(ranks, body, NULL, 600) != 0;
  }
  return failed ? 1 : 0;
}
