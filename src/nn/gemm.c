/* gemm.c - the engine's single-precision matrix product, C = alpha op(A) op(B) + beta C, row-major
 * with the semantics of cblas_sgemm(CblasRowMajor, ...).
 *
 * Why our own: the environment pins OpenBLAS 0.3.21 to its AVX2 kernels (OPENBLAS_CORETYPE is set
 * for every process and must stay so), which reach about half of what the AVX-512 units of this
 * machine do; PyTorch gets AVX-512 from oneDNN. So on a CPU with AVX-512F this file computes the
 * product itself, Goto/BLIS style: a KC x NC block of op(B) is packed into 32-column panels that
 * stay in L2, an MR x KC sliver of op(A) is packed (transposed to k-major) into L1, and an
 * AVX-512 micro-kernel keeps an MR x 32 tile of C in registers over the whole KC run. Packing
 * transposes with 16x16 in-register transposes; when N is only one or two panels (the conv
 * layers' 32 or 64 output channels) A is not packed at all but read in place, since there the
 * packing would cost about as much as the multiply. Every other product packs op(B), also x W^T
 * with few rows (a worker's batch slice): a dot-product path that read W in place there
 * (2026-11-22 to 11-30) gained 2-3.5% on one Zen 5 worker alone, nothing beside a second
 * worker, and lost 3-10% to packing on two Intel Xeons (BENCHMARKS-LOG.md, "Issues 3 and 4 on
 * the Xeon FP16").
 *
 * On CPUs with AVX2 and FMA but no AVX-512F the same blocking runs with a 6 x 16 AVX2 tile
 * (below, "AVX2 + FMA"): about OpenBLAS's rate on the engine's shapes (72-96 GFLOP/s against its
 * 74-85 on a Zen 3, but 33-48 against 41-54 on those only 10 or 25 columns wide), and, being
 * dtrain's, bit for bit the same over any rows a call computes, which lets data-parallel
 * training defer the linear weight gradients (trainer.c).
 *
 * It deliberately does not thread: the engine splits each product across its own pool and every
 * thread calls this on its slice. With neither (or with DTRAIN_GEMM=blas) every call goes to
 * cblas_sgemm. Packing buffers are per thread, allocated once on first use (the model reserves
 * them on each of its threads at creation, so a training step never allocates) and freed when
 * the thread exits. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#include <cblas.h>
#include <immintrin.h>
#include <pthread.h>
#include <string.h>

#include "nn/nn.h"

/* Register tile MR x NR: NR = 32 is two zmm vectors, so the conv layers' 32 and 64 output
 * channels fill whole tiles; MR = 14 gives 28 accumulators + 2 B vectors + 1 broadcast = 31 of
 * the 32 zmm registers. */
#define MR 14
#define NR 32
/* Cache blocks: KC x NC floats of packed B stay in L2 (256 x 512 = 512 KiB of the 1 MiB per
 * core); an MR x KC sliver of A (14 KiB) and one KC x NR panel of B (32 KiB) share the 48 KiB L1.
 * Chosen by measurement on this machine (AMD Zen 5, 2026-11-22): the FLOP-weighted rate over the
 * engine's layer shapes (those of bench/sgemm_peak --shapes), thread CPU time, three
 * interleaved rounds, median GFLOP/s: KC/NC 256/512 177, 384/512 175, 512/512 178 (spread
 * 145-185), 256/1024 172, 192/1024 171, 384/768 163, 128/1024 156. 256/512 was the steadiest. */
#define GEMM_KC 256
#define GEMM_NC 512

#define AVX512 __attribute__((target("avx512f")))


/* ---- dispatch ---- */

enum { GEMM_BLAS, GEMM_AVX512, GEMM_AVX2 };
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_mode = GEMM_BLAS;
static dt_status g_status = DT_OK; /* why DTRAIN_GEMM cannot be honoured */
static char g_err[160];

static void gemm_init(void) {
  bool have = __builtin_cpu_supports("avx512f");
  bool have2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const char *e = dt__env_str("DTRAIN_GEMM");
  g_mode = have ? GEMM_AVX512 : have2 ? GEMM_AVX2 : GEMM_BLAS;
  if (!e || !strcmp(e, "auto"))
    return;
  if (!strcmp(e, "blas")) {
    g_mode = GEMM_BLAS;
  } else if (!strcmp(e, "own")) {
    if (!have && !have2) {
      g_status = DT_ERR_UNSUPPORTED;
      snprintf(g_err, sizeof g_err,
               "DTRAIN_GEMM=own: this CPU has neither AVX-512F nor AVX2 with FMA (unset it or use "
               "DTRAIN_GEMM=blas)");
    }
  } else {
    g_status = DT_ERR_INVALID;
    snprintf(g_err, sizeof g_err, "DTRAIN_GEMM=\"%.40s\": expected auto, own or blas", e);
  }
}

dt_status dt__nn_gemm_check(void) {
  pthread_once(&g_once, gemm_init);
  if (g_status != DT_OK)
    return dt_set_error(g_status, "%s", g_err);
  return DT_OK;
}

const char *dt__nn_gemm_name(void) {
  pthread_once(&g_once, gemm_init);
  return g_mode == GEMM_AVX512 ? "avx512" : g_mode == GEMM_AVX2 ? "avx2" : "openblas";
}

/* OpenBLAS's pthreads build (Debian's default) starts a pool of one thread per further CPU when
 * it is loaded, before main(), and each spins calling sched_yield for about 0.1 s (2^28 cycles,
 * OPENBLAS_THREAD_TIMEOUT) before it sleeps: 0.09 s of CPU per process on the EPYC Zen 4 guest.
 * dtrain never hands OpenBLAS a threaded call (every product runs on the engine's own threads,
 * OpenBLAS driven single-threaded), so that spin only takes the CPUs from the ranks in a job's
 * first moments: with 4 ranks on 2 CPUs a job's first size took 6.9-9.5 us a call (4 B
 * broadcast or allreduce, 1000 calls) and 3.9-5.2 with the pool ended, level with the sizes
 * after it (bench/results/blas-pool-2026-12-06-zen4.txt, section 2). The pool is ended
 * through the function OpenBLAS itself ends it with before a fork (exported by its pthreads
 * builds; absent elsewhere, where there is no pool to end); a threaded call would start it anew. */
extern int blas_thread_shutdown_(void) __attribute__((weak));

void dt__nn_blas_serial(void) {
  openblas_set_num_threads(1);
  if (blas_thread_shutdown_)
    blas_thread_shutdown_();
}

/* ---- per-thread packing buffers ---- */

#define WS_A_FLOATS ((size_t)MR * GEMM_KC + 16 * MR) /* + slack: packing stores whole vectors */
#define WS_B_FLOATS ((size_t)GEMM_KC * (GEMM_NC + NR))
static pthread_once_t ws_once = PTHREAD_ONCE_INIT;
static pthread_key_t ws_key;
static bool ws_key_ok;
static _Thread_local float *ws_buf;

static void ws_release(void *p) { dt__free(p); }
static void ws_make_key(void) { ws_key_ok = pthread_key_create(&ws_key, ws_release) == 0; }

/* This thread's buffer (WS_A_FLOATS + WS_B_FLOATS), NULL if it cannot be had. The key's
 * destructor frees it when a thread exits; the main thread's stays reachable until exit. */
static float *ws_get(void) {
  if (ws_buf)
    return ws_buf;
  pthread_once(&ws_once, ws_make_key);
  if (!ws_key_ok)
    return NULL;
  float *p = dt__alloc((WS_A_FLOATS + WS_B_FLOATS) * sizeof(float));
  if (!p)
    return NULL;
  if (pthread_setspecific(ws_key, p) != 0) {
    dt__free(p);
    return NULL;
  }
  return ws_buf = p;
}

void dt__nn_gemm_reserve(void) {
  pthread_once(&g_once, gemm_init);
  if (g_mode != GEMM_BLAS)
    (void)ws_get();
}

/* ---- packing ---- */

/* In-place transpose of 16 rows of 16 floats: r[i] element j becomes r[j] element i.
 * Pairs, then quads inside 128-bit lanes, then the lanes themselves across 4 registers. */
AVX512 static inline void tr16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; i++) { /* r[4i + c] lane L: column 4L + c of rows 4i..4i+3 */
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int c = 0; c < 4; c++) {
    __m512 s0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
    __m512 s1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
    __m512 s2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
    __m512 s3 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
    t[c] = _mm512_shuffle_f32x4(s0, s2, 0x88);
    t[8 + c] = _mm512_shuffle_f32x4(s0, s2, 0xDD);
    t[4 + c] = _mm512_shuffle_f32x4(s1, s3, 0x88);
    t[12 + c] = _mm512_shuffle_f32x4(s1, s3, 0xDD);
  }
  for (int i = 0; i < 16; i++)
    r[i] = t[i];
}

static inline __mmask16 lanes(int n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1); }

/* Gathers rows [0, nrow) (nrow <= 16) x columns [0, ncol) of a row-major matrix, transposed, into
 * dst: dst[k * dstride + i] = src[i * ld + k], for k < ncol and all i < 16 (zero for i >= nrow).
 * Writes 16 floats per k: dstride may be smaller than 16 when the caller leaves slack. */
AVX512 static void pack_transposed(const float *src, int ld, int nrow, int ncol, float *dst,
                                   int dstride) {
  __m512 r[16];
  for (int k0 = 0; k0 < ncol; k0 += 16) {
    int w = ncol - k0 < 16 ? ncol - k0 : 16;
    __mmask16 m = lanes(w);
    for (int i = 0; i < 16; i++)
      r[i] = i < nrow ? _mm512_maskz_loadu_ps(m, src + (size_t)i * ld + k0) : _mm512_setzero_ps();
    tr16(r);
    for (int k = 0; k < w; k++)
      _mm512_storeu_ps(dst + (size_t)(k0 + k) * dstride, r[k]);
  }
}

/* op(A) rows [i0, i0+mr) x k [k0, k0+kc) into Ap[k * MR + i], rows mr..MR-1 zero. */
AVX512 static void pack_a(bool ta, const float *A, int lda, int i0, int mr, int k0, int kc,
                          float *Ap) {
  if (!ta) {
    pack_transposed(A + (size_t)i0 * lda + k0, lda, mr, kc, Ap, MR);
  } else { /* op(A)[i][k] = A[k][i]: each k is a contiguous run of mr floats */
    __mmask16 m = lanes(mr);
    for (int k = 0; k < kc; k++)
      _mm512_storeu_ps(Ap + (size_t)k * MR, _mm512_maskz_loadu_ps(m, A + (size_t)(k0 + k) * lda + i0));
  }
}

/* op(B) k [k0, k0+kc) x columns [j0, j0+nc) into NR-wide panels: panel p holds columns
 * j0 + p*NR .. +NR at Bp[p * kc * NR + k * NR + j], columns past nc zero. */
AVX512 static void pack_b(bool tb, const float *B, int ldb, int k0, int kc, int j0, int nc,
                          float *Bp) {
  for (int jp = 0; jp < nc; jp += NR) {
    float *P = Bp + (size_t)jp * kc;
    int w = nc - jp < NR ? nc - jp : NR;
    if (!tb) {
      __mmask16 m0 = lanes(w), m1 = lanes(w > 16 ? w - 16 : 0);
      const float *src = B + (size_t)k0 * ldb + j0 + jp;
      for (int k = 0; k < kc; k++, src += ldb) {
        _mm512_store_ps(P + (size_t)k * NR, _mm512_maskz_loadu_ps(m0, src));
        _mm512_store_ps(P + (size_t)k * NR + 16, _mm512_maskz_loadu_ps(m1, src + 16));
      }
    } else { /* op(B)[k][j] = B[j][k]: transpose 16 columns at a time */
      for (int h = 0; h < 2; h++) {
        int nrow = w - 16 * h;
        if (nrow <= 0) {
          for (int k = 0; k < kc; k++)
            _mm512_store_ps(P + (size_t)k * NR + 16 * h, _mm512_setzero_ps());
          continue;
        }
        /* stride NR: each k's 16 floats land in their half of the 32-float row */
        const float *src = B + (size_t)(j0 + jp + 16 * h) * ldb + k0;
        pack_transposed(src, ldb, nrow, kc, P + 16 * h, NR);
      }
    }
  }
}

/* ---- micro-kernel ---- */

/* C[0..mr) x [0..nr) = alpha * op(A) Bp + beta * C over kc steps; mr and lda_direct's use are
 * compile-time constants at each call site (see kern_dispatch) so the tile lives in registers.
 * A is either a packed sliver (a[k * MR + i], lda == 0) or, when direct, rows of the caller's
 * non-transposed matrix (a[i * lda + k]), read in place. beta == 0 never reads C. */
AVX512 static inline __attribute__((always_inline)) void kern(const int mr, const bool direct,
                                                              int kc, const float *restrict a,
                                                              int lda, const float *restrict Bp,
                                                              float *C, int ldc, float alpha,
                                                              float beta, int nr) {
  __m512 c0[MR], c1[MR];
  const size_t sa = direct ? (size_t)lda : 1, sk = direct ? 1 : MR;
  for (int i = 0; i < mr; i++)
    c0[i] = c1[i] = _mm512_setzero_ps();
  for (int k = 0; k < kc; k++) {
    __m512 b0 = _mm512_load_ps(Bp), b1 = _mm512_load_ps(Bp + 16);
    for (int i = 0; i < mr; i++) {
      __m512 av = _mm512_set1_ps(a[i * sa]);
      c0[i] = _mm512_fmadd_ps(av, b0, c0[i]);
      c1[i] = _mm512_fmadd_ps(av, b1, c1[i]);
    }
    a += sk;
    Bp += NR;
  }
  __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  if (nr == NR) {
    for (int i = 0; i < mr; i++) {
      float *c = C + (size_t)i * ldc;
      __m512 v0 = _mm512_mul_ps(va, c0[i]), v1 = _mm512_mul_ps(va, c1[i]);
      if (beta == 1.0f) {
        v0 = _mm512_add_ps(v0, _mm512_loadu_ps(c));
        v1 = _mm512_add_ps(v1, _mm512_loadu_ps(c + 16));
      } else if (beta != 0.0f) {
        v0 = _mm512_fmadd_ps(vb, _mm512_loadu_ps(c), v0);
        v1 = _mm512_fmadd_ps(vb, _mm512_loadu_ps(c + 16), v1);
      }
      _mm512_storeu_ps(c, v0);
      _mm512_storeu_ps(c + 16, v1);
    }
  } else {
    __mmask16 m0 = lanes(nr), m1 = lanes(nr > 16 ? nr - 16 : 0);
    for (int i = 0; i < mr; i++) {
      float *c = C + (size_t)i * ldc;
      __m512 v0 = _mm512_mul_ps(va, c0[i]), v1 = _mm512_mul_ps(va, c1[i]);
      if (beta != 0.0f) {
        v0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, c), v0);
        v1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, c + 16), v1);
      }
      _mm512_mask_storeu_ps(c, m0, v0);
      _mm512_mask_storeu_ps(c + 16, m1, v1);
    }
  }
}

#define KERN_CASE(n)                                                                               \
  case n:                                                                                          \
    if (lda)                                                                                       \
      kern(n, true, kc, a, lda, Bp, C, ldc, alpha, beta, nr);                                      \
    else                                                                                           \
      kern(n, false, kc, a, 0, Bp, C, ldc, alpha, beta, nr);                                       \
    break;

/* lda == 0: a is a packed sliver; otherwise the top-left of mr rows of A read in place. */
AVX512 static void kern_dispatch(int mr, int kc, const float *a, int lda, const float *Bp, float *C,
                                 int ldc, float alpha, float beta, int nr) {
  switch (mr) {
    KERN_CASE(14)
    KERN_CASE(13)
    KERN_CASE(12)
    KERN_CASE(11)
    KERN_CASE(10)
    KERN_CASE(9)
    KERN_CASE(8)
    KERN_CASE(7)
    KERN_CASE(6)
    KERN_CASE(5)
    KERN_CASE(4)
    KERN_CASE(3)
    KERN_CASE(2)
    KERN_CASE(1)
  default:
    break;
  }
}
#undef KERN_CASE

/* ---- AVX2 + FMA (CPUs without AVX-512F) ----
 * The same blocking and the same 32-column panels of op(B), with a 6 x 16 register tile: 12
 * accumulators + 2 B vectors + 1 broadcast of the 16 ymm registers, a panel in two halves. op(A)
 * is packed into 6-row slivers (or read in place, as above). */
#define MR2 6
#define AVX2 __attribute__((target("avx2,fma")))

/* In-place transpose of 8 rows of 8 floats. */
AVX2 static inline void tr8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; i++) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; i++) { /* u[4i + c] lane L: column 4L + c of rows 4i..4i+3 */
    u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int c = 0; c < 4; c++) {
    r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
    r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
  }
}

/* The first n of 8 lanes (n <= 0: none, n >= 8: all), as a mask for maskload. */
AVX2 static inline __m256i lanes8(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* op(A) rows [i0, i0+mr) x k [k0, k0+kc) into Ap[k * MR2 + i], rows mr..MR2-1 zero. Each k's
 * store is 8 floats wide, the next k's overwriting the 2 extra (WS_A_FLOATS has the slack). */
AVX2 static void pack_a2(bool ta, const float *A, int lda, int i0, int mr, int k0, int kc, float *Ap) {
  if (ta) { /* op(A)[i][k] = A[k][i]: each k is a run of mr floats */
    __m256i m = lanes8(mr);
    for (int k = 0; k < kc; k++)
      _mm256_storeu_ps(Ap + (size_t)k * MR2, _mm256_maskload_ps(A + (size_t)(k0 + k) * lda + i0, m));
    return;
  }
  const float *src = A + (size_t)i0 * lda + k0;
  int k = 0;
  for (; k + 8 <= kc; k += 8) {
    __m256 r[8];
    for (int i = 0; i < 8; i++)
      r[i] = i < mr ? _mm256_loadu_ps(src + (size_t)i * lda + k) : _mm256_setzero_ps();
    tr8(r);
    for (int j = 0; j < 8; j++)
      _mm256_storeu_ps(Ap + (size_t)(k + j) * MR2, r[j]);
  }
  for (; k < kc; k++)
    for (int i = 0; i < MR2; i++)
      Ap[(size_t)k * MR2 + i] = i < mr ? src[(size_t)i * lda + k] : 0.0f;
}

/* As pack_b, for CPUs without AVX-512F. */
AVX2 static void pack_b2(bool tb, const float *B, int ldb, int k0, int kc, int j0, int nc, float *Bp) {
  for (int jp = 0; jp < nc; jp += NR) {
    float *P = Bp + (size_t)jp * kc;
    int w = nc - jp < NR ? nc - jp : NR;
    if (!tb) {
      const float *src = B + (size_t)k0 * ldb + j0 + jp;
      for (int k = 0; k < kc; k++, src += ldb) {
        float *d = P + (size_t)k * NR;
        for (int v = 0; v < NR; v += 8)
          _mm256_store_ps(d + v, w == NR ? _mm256_loadu_ps(src + v)
                                         : _mm256_maskload_ps(src + v, lanes8(w - v)));
      }
      continue;
    }
    /* op(B)[k][j] = B[j][k]: 8 x 8 blocks through registers, the ragged edges one by one */
    int k8 = kc / 8 * 8;
    for (int jb = 0; jb < NR; jb += 8) {
      const float *src = B + (size_t)(j0 + jp + jb) * ldb + k0;
      if (jb + 8 <= w) {
        for (int k = 0; k < k8; k += 8) {
          __m256 r[8];
          for (int i = 0; i < 8; i++)
            r[i] = _mm256_loadu_ps(src + (size_t)i * ldb + k);
          tr8(r);
          for (int i = 0; i < 8; i++)
            _mm256_store_ps(P + (size_t)(k + i) * NR + jb, r[i]);
        }
        for (int k = k8; k < kc; k++)
          for (int j = 0; j < 8; j++)
            P[(size_t)k * NR + jb + j] = src[(size_t)j * ldb + k];
      } else {
        for (int k = 0; k < kc; k++)
          for (int j = 0; j < 8; j++)
            P[(size_t)k * NR + jb + j] = jb + j < w ? src[(size_t)j * ldb + k] : 0.0f;
      }
    }
  }
}

/* C[0..mr) x [0..nr) (nr <= 16) = alpha * op(A) Bp + beta * C over kc steps, Bp a half of a
 * 32-column panel (row stride NR); A packed (a[k * MR2 + i], lda == 0) or read in place. */
AVX2 static inline __attribute__((always_inline)) void kern2(const int mr, const bool direct, int kc,
                                                             const float *restrict a, int lda,
                                                             const float *restrict Bp, float *C, int ldc,
                                                             float alpha, float beta, int nr) {
  __m256 c0[MR2], c1[MR2];
  const size_t sa = direct ? (size_t)lda : 1, sk = direct ? 1 : MR2;
#pragma GCC unroll 6
  for (int i = 0; i < mr; i++)
    c0[i] = c1[i] = _mm256_setzero_ps();
  for (int k = 0; k < kc; k++) {
    __m256 b0 = _mm256_load_ps(Bp), b1 = _mm256_load_ps(Bp + 8);
#pragma GCC unroll 6
    for (int i = 0; i < mr; i++) {
      __m256 av = _mm256_broadcast_ss(a + i * sa);
      c0[i] = _mm256_fmadd_ps(av, b0, c0[i]);
      c1[i] = _mm256_fmadd_ps(av, b1, c1[i]);
    }
    a += sk;
    Bp += NR;
  }
  __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
  /* unrolled, as the loops above: a loop over i here keeps the tile in memory, not registers */
#pragma GCC unroll 6
  for (int i = 0; i < mr; i++) {
    float *c = C + (size_t)i * ldc;
    __m256 v0 = _mm256_mul_ps(va, c0[i]), v1 = _mm256_mul_ps(va, c1[i]);
    if (nr == 16) {
      if (beta == 1.0f) {
        v0 = _mm256_add_ps(v0, _mm256_loadu_ps(c));
        v1 = _mm256_add_ps(v1, _mm256_loadu_ps(c + 8));
      } else if (beta != 0.0f) {
        v0 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(c), v0);
        v1 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(c + 8), v1);
      }
      _mm256_storeu_ps(c, v0);
      _mm256_storeu_ps(c + 8, v1);
    } else { /* a ragged edge: C's columns past nr are neither read nor written */
      float t[16];
      _mm256_storeu_ps(t, v0);
      _mm256_storeu_ps(t + 8, v1);
      for (int j = 0; j < nr; j++)
        c[j] = beta == 0.0f ? t[j] : beta == 1.0f ? t[j] + c[j] : t[j] + beta * c[j];
    }
  }
}

#define KERN2_CASE(n)                                                                              \
  case n:                                                                                          \
    if (lda)                                                                                       \
      kern2(n, true, kc, a, lda, Bp, C, ldc, alpha, beta, nr);                                     \
    else                                                                                           \
      kern2(n, false, kc, a, 0, Bp, C, ldc, alpha, beta, nr);                                      \
    break;

AVX2 static void kern2_dispatch(int mr, int kc, const float *a, int lda, const float *Bp, float *C, int ldc,
                                float alpha, float beta, int nr) {
  switch (mr) {
    KERN2_CASE(6)
    KERN2_CASE(5)
    KERN2_CASE(4)
    KERN2_CASE(3)
    KERN2_CASE(2)
    KERN2_CASE(1)
  default:
    break;
  }
}
#undef KERN2_CASE

/* ---- driver ---- */

/* C = beta * C for the degenerate products (K == 0 or alpha == 0); beta == 0 writes zeros. */
static void scale_c(int M, int N, float beta, float *C, int ldc) {
  for (int i = 0; i < M; i++) {
    float *c = C + (size_t)i * ldc;
    if (beta == 0.0f)
      memset(c, 0, (size_t)N * sizeof(float));
    else if (beta != 1.0f)
      for (int j = 0; j < N; j++)
        c[j] *= beta;
  }
}

/* What the blocked product needs of an instruction set: its sliver height, its packing, and
 * the C tile of one sliver x one 32-column panel. */
typedef struct gemm_isa {
  int mr;
  void (*pack_a)(bool ta, const float *A, int lda, int i0, int mr, int k0, int kc, float *Ap);
  void (*pack_b)(bool tb, const float *B, int ldb, int k0, int kc, int j0, int nc, float *Bp);
  /* lda == 0: a is a packed sliver; otherwise the top-left of mr rows of A read in place */
  void (*panel)(int mr, int kc, const float *a, int lda, const float *Bp, float *C, int ldc, float alpha,
                float beta, int nr);
} gemm_isa;

AVX2 static void panel2(int mr, int kc, const float *a, int lda, const float *Bp, float *C, int ldc,
                        float alpha, float beta, int nr) {
  kern2_dispatch(mr, kc, a, lda, Bp, C, ldc, alpha, beta, nr < 16 ? nr : 16);
  if (nr > 16)
    kern2_dispatch(mr, kc, a, lda, Bp + 16, C + 16, ldc, alpha, beta, nr - 16);
}

static const gemm_isa isa_avx512 = {MR, pack_a, pack_b, kern_dispatch};
static const gemm_isa isa_avx2 = {MR2, pack_a2, pack_b2, panel2};

static void gemm_blocked(const gemm_isa *isa, bool ta, bool tb, int M, int N, int K, float alpha,
                         const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc,
                         float *ws) {
  float *Ap = ws, *Bp = ws + WS_A_FLOATS;
  for (int jc = 0; jc < N; jc += GEMM_NC) {
    int nc = N - jc < GEMM_NC ? N - jc : GEMM_NC;
    for (int pc = 0; pc < K; pc += GEMM_KC) {
      int kc = K - pc < GEMM_KC ? K - pc : GEMM_KC;
      float b = pc == 0 ? beta : 1.0f; /* later K blocks accumulate onto the first */
      isa->pack_b(tb, B, ldb, pc, kc, jc, nc, Bp);
      /* A read in place when packing it would cost about as much as the multiply: one or two
       * B panels (the conv layers' 32 or 64 output channels; measured: conv1 forward 60 -> 125
       * GFLOP/s, conv2 forward 175 -> 207). Short K runs (conv dX, K = 64) gained nothing.
       * Not for rows 4 KiB apart: all of a sliver's rows would fall into the same L1 sets. */
      bool direct = !ta && nc <= 2 * NR && (size_t)lda * sizeof(float) % 4096 != 0;
      for (int ic = 0; ic < M; ic += isa->mr) {
        int mr = M - ic < isa->mr ? M - ic : isa->mr;
        const float *a = A + (size_t)ic * lda + pc;
        if (!direct) {
          isa->pack_a(ta, A, lda, ic, mr, pc, kc, Ap);
          a = Ap;
        }
        float *Crow = C + (size_t)ic * ldc + jc;
        for (int jr = 0; jr < nc; jr += NR)
          isa->panel(mr, kc, a, direct ? lda : 0, Bp + (size_t)jr * kc, Crow + jr, ldc, alpha, b,
                     nc - jr < NR ? nc - jr : NR);
      }
    }
  }
}

bool dt__nn_gemm_force_avx2(void) {
  pthread_once(&g_once, gemm_init);
  if (g_mode == GEMM_BLAS || !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
    return false;
  g_mode = GEMM_AVX2;
  return true;
}

int dt__nn_sgemm_kblock(void) {
  pthread_once(&g_once, gemm_init);
  return g_mode != GEMM_BLAS ? GEMM_KC : 0;
}

void dt__nn_sgemm(bool transA, bool transB, int M, int N, int K, float alpha, const float *A,
                  int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  if (M <= 0 || N <= 0)
    return;
  pthread_once(&g_once, gemm_init);
  float *ws;
  if (g_mode != GEMM_BLAS && (ws = ws_get()) != NULL) {
    if (K <= 0 || alpha == 0.0f)
      scale_c(M, N, beta, C, ldc);
    else if (g_mode == GEMM_AVX2)
      gemm_blocked(&isa_avx2, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ws);
    else
      gemm_blocked(&isa_avx512, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ws);
    return;
  }
  cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans,
              M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
