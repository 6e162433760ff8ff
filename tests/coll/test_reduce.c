/* test_reduce.c - the reduction kernels and dtype helpers against an independent scalar
 * reference: every dtype x op, lengths around the vector widths with unaligned starts, both the
 * AVX2 and the portable kernels, f16/bf16 rounding corner cases (ties, overflow, subnormals),
 * NaN propagation, avg finishing and the mixed-precision kernel the ring uses; dt__copy; the
 * CPU kind the per-CPU defaults read (dt__cpu_amd, dt__cpu_zen4). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "comm/coll/coll.h"

/* ---- independent references: f16 via the compiler's _Float16 where it has one (GCC 12;
 * clang 14 on x86 has none: there, by decoding exactly and picking the nearer neighbour), bf16
 * by picking the nearer of the two neighbours in double precision ---- */
#ifdef __FLT16_MAX__
static uint16_t ref_f16(float f) {
  _Float16 h = (_Float16)f;
  uint16_t u;
  memcpy(&u, &h, 2);
  return u;
}
static float ref_f16_to_f32(uint16_t u) {
  _Float16 h;
  memcpy(&h, &u, 2);
  return (float)h;
}
#else
static float ref_f16_to_f32(uint16_t u) {
  int e = (u >> 10) & 0x1f, m = u & 0x3ff;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
  return (float)((u & 0x8000) ? -v : v);
}
static uint16_t ref_f16(float f) {
  uint16_t sign = signbit(f) ? 0x8000 : 0;
  double a = fabs((double)f);
  if (isnan(f))
    return (uint16_t)(sign | 0x7e00);
  if (a >= 65520.0) /* halfway between the largest finite (65504) and the next step: rounds to inf */
    return (uint16_t)(sign | 0x7c00);
  unsigned lo = 0, hi = 0x7bff; /* positive finite patterns are ordered by value */
  while (lo < hi) {             /* largest pattern whose value is <= a */
    unsigned mid = (lo + hi + 1) / 2;
    if (ref_f16_to_f32((uint16_t)mid) <= a)
      lo = mid;
    else
      hi = mid - 1;
  }
  double below = ref_f16_to_f32((uint16_t)lo), above = ref_f16_to_f32((uint16_t)(lo + 1));
  unsigned u = lo;
  if (a - below > above - a || (a - below == above - a && (lo & 1)))
    u = lo + 1;
  return (uint16_t)(sign | u);
}
#endif
static float bf_val(uint16_t u) {
  uint32_t x = (uint32_t)u << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}
static uint16_t ref_bf16(float f) {
  if (isnan(f))
    return 0x7fc0;
  uint32_t x;
  memcpy(&x, &f, 4);
  uint16_t lo = (uint16_t)(x >> 16), hi = (uint16_t)(lo + 1); /* truncation and next away from 0 */
  if ((x & 0xffff) == 0)
    return lo;
  double dl = fabs((double)f - (double)bf_val(lo));
  double dh = isinf(bf_val(hi)) ? fabs((double)f - ((double)bf_val(lo) + ldexp(1.0, 128 - 8) * (f < 0 ? -1 : 1)))
                                : fabs((double)f - (double)bf_val(hi));
  if (dl < dh)
    return lo;
  if (dh < dl)
    return hi;
  return (lo & 1) ? hi : lo;
}

static double ref_op(double x, double y, dt_op op) {
  switch (op) {
  case DT_SUM: case DT_AVG: return x + y;
  case DT_PROD: return x * y;
  case DT_MIN: return isnan(x) ? x : (x < y ? x : y);
  default: return isnan(x) ? x : (x > y ? x : y);
  }
}

/* Reference for one element: values as raw bytes of type t. */
static void ref_elem(void *o, const void *a, const void *b, dt_dtype t, dt_op op) {
  switch (t) {
  case DT_F32: { float x, y, r; memcpy(&x, a, 4); memcpy(&y, b, 4);
    r = op == DT_SUM || op == DT_AVG ? x + y : op == DT_PROD ? x * y : (float)ref_op(x, y, op);
    memcpy(o, &r, 4); break; }
  case DT_F64: { double x, y, r; memcpy(&x, a, 8); memcpy(&y, b, 8); r = ref_op(x, y, op); memcpy(o, &r, 8); break; }
  case DT_F16: { uint16_t x, y; memcpy(&x, a, 2); memcpy(&y, b, 2);
    float fx = ref_f16_to_f32(x), fy = ref_f16_to_f32(y);
    float r = op == DT_SUM || op == DT_AVG ? fx + fy : op == DT_PROD ? fx * fy : (float)ref_op(fx, fy, op);
    uint16_t h = ref_f16(r); memcpy(o, &h, 2); break; }
  case DT_BF16: { uint16_t x, y; memcpy(&x, a, 2); memcpy(&y, b, 2);
    float fx = bf_val(x), fy = bf_val(y);
    float r = op == DT_SUM || op == DT_AVG ? fx + fy : op == DT_PROD ? fx * fy : (float)ref_op(fx, fy, op);
    uint16_t h = ref_bf16(r); memcpy(o, &h, 2); break; }
  case DT_I32: { int32_t x, y; int64_t r; memcpy(&x, a, 4); memcpy(&y, b, 4);
    r = op == DT_SUM || op == DT_AVG ? (int64_t)x + y : op == DT_PROD ? (int64_t)x * y : op == DT_MIN ? (x < y ? x : y) : (x > y ? x : y);
    int32_t w = (int32_t)(uint32_t)(uint64_t)r; memcpy(o, &w, 4); break; }
  case DT_I64: { int64_t x, y; memcpy(&x, a, 8); memcpy(&y, b, 8);
    uint64_t r = op == DT_SUM || op == DT_AVG ? (uint64_t)x + (uint64_t)y : op == DT_PROD ? (uint64_t)x * (uint64_t)y
               : (uint64_t)(op == DT_MIN ? (x < y ? x : y) : (x > y ? x : y));
    memcpy(o, &r, 8); break; }
  default: { uint8_t x = *(const uint8_t *)a, y = *(const uint8_t *)b;
    unsigned r = op == DT_SUM || op == DT_AVG ? x + y : op == DT_PROD ? x * y : op == DT_MIN ? (x < y ? x : y) : (x > y ? x : y);
    *(uint8_t *)o = (uint8_t)r; break; }
  }
}

static int same_bits_or_nan(const void *x, const void *y, dt_dtype t) {
  size_t es = dt_dtype_size(t);
  if (!memcmp(x, y, es))
    return 1;
  if (t == DT_F32) { float a, b; memcpy(&a, x, 4); memcpy(&b, y, 4); return isnan(a) && isnan(b); }
  if (t == DT_F64) { double a, b; memcpy(&a, x, 8); memcpy(&b, y, 8); return isnan(a) && isnan(b); }
  if (t == DT_F16) { uint16_t a, b; memcpy(&a, x, 2); memcpy(&b, y, 2); return (a & 0x7fff) > 0x7c00 && (b & 0x7fff) > 0x7c00; }
  if (t == DT_BF16) { uint16_t a, b; memcpy(&a, x, 2); memcpy(&b, y, 2); return (a & 0x7fff) > 0x7f80 && (b & 0x7fff) > 0x7f80; }
  return 0;
}

static void fill(void *p, size_t n, dt_dtype t, dt_rng *rng, int specials) {
  for (size_t i = 0; i < n; i++) {
    double v = (dt_rng_uniform(rng) - 0.5) * 8;
    if (specials && dt_rng_below(rng, 16) == 0) {
      static const double sp[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, 65504.0, 1e-7, 3.0e38};
      v = sp[dt_rng_below(rng, 8)];
    }
    switch (t) {
    case DT_F32: { float f = (float)v; memcpy((float *)p + i, &f, 4); break; }
    case DT_F64: ((double *)p)[i] = v; break;
    case DT_F16: ((uint16_t *)p)[i] = ref_f16((float)v); break;
    case DT_BF16: ((uint16_t *)p)[i] = ref_bf16((float)v); break;
    case DT_I32: ((int32_t *)p)[i] = (int32_t)dt_rng_next(rng); break;
    case DT_I64: ((int64_t *)p)[i] = (int64_t)dt_rng_next(rng); break;
    default: ((uint8_t *)p)[i] = (uint8_t)dt_rng_next(rng); break;
    }
  }
}

static void check_kernels(int scalar) {
  dt__reduce_force_scalar(scalar);
  if (!scalar)
    printf("# vector kernels: %s\n", dt__reduce_isa());
  static const size_t lens[] = {0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 257, 1027};
  dt_rng rng;
  dt_rng_seed(&rng, 42);
  for (int t = 0; t < DT_DTYPE_COUNT; t++)
    for (int op = 0; op < DT_OP_COUNT; op++)
      for (size_t li = 0; li < DT_ARRAY_LEN(lens); li++)
        for (int mis = 0; mis < 2; mis++) {
          size_t n = lens[li], es = dt_dtype_size((dt_dtype)t);
          char *a = malloc((n + 2) * es), *b = malloc((n + 2) * es), *o = malloc((n + 2) * es), *ref = malloc((n + 1) * es);
          char *pa = a + mis * es, *pb = b + mis * es, *po = o + mis * es; /* unaligned start */
          fill(pa, n, (dt_dtype)t, &rng, 1);
          fill(pb, n, (dt_dtype)t, &rng, 1);
          for (size_t i = 0; i < n; i++)
            ref_elem(ref + i * es, pa + i * es, pb + i * es, (dt_dtype)t, (dt_op)op);
          dt__reduce2(po, pa, pb, n, (dt_dtype)t, (dt_op)op);
          for (size_t i = 0; i < n; i++)
            if (!same_bits_or_nan(po + i * es, ref + i * es, (dt_dtype)t)) {
              fail_msg("%s %s %s n=%zu off=%d: element %zu differs from the reference", scalar ? "scalar" : "simd",
                       dt_dtype_name((dt_dtype)t), dt_op_name((dt_op)op), n, mis, i);
            }
          /* in place: dst = dst op src gives the same */
          dt__reduce(pa, pb, n, (dt_dtype)t, (dt_op)op);
          for (size_t i = 0; i < n; i++)
            assert_true(same_bits_or_nan(pa + i * es, ref + i * es, (dt_dtype)t));
          free(a), free(b), free(o), free(ref);
        }
  dt__reduce_force_scalar(0);
}

static void test_kernels_simd(void **s) { (void)s; check_kernels(0); }
/* On a CPU with AVX-512 the half types take 512-bit kernels; this runs the AVX2 ones there. */
static void test_kernels_avx2(void **s) { (void)s; check_kernels(2); }
static void test_kernels_avx512_nobf16(void **s) { (void)s; check_kernels(3); }

/* dt__reduce_mix over every (out, a, b) type triple of {f32, f16, bf16}, every op, with and
 * without a divisor, at lengths around the vector widths, on each ISA level: bit-identical to
 * the portable path (the kernel ranks on different CPUs must agree). Inputs include NaN, Inf,
 * +-0, overflow and values that land on f16/bf16 subnormals. */
static void test_mix_isa_agree(void **s) {
  (void)s;
  static const dt_dtype ty[3] = {DT_F32, DT_F16, DT_BF16};
  static const size_t lens[] = {1, 7, 8, 15, 16, 17, 33, 100, 1027};
  enum { MAXN = 1100 };
  static char a[MAXN * 4], b[MAXN * 4], ref[MAXN * 4], got[MAXN * 4];
  dt_rng rng;
  dt_rng_seed(&rng, 11);
  for (int ot = 0; ot < 3; ot++)
    for (int at = 0; at < 3; at++)
      for (int bt = 0; bt < 3; bt++)
        for (int op = 0; op < DT_OP_COUNT; op++)
          for (size_t li = 0; li < DT_ARRAY_LEN(lens); li++) {
            size_t n = lens[li], oes = dt_dtype_size(ty[ot]);
            fill(a, n, ty[at], &rng, 1);
            fill(b, n, ty[bt], &rng, 1);
            for (size_t i = 0; i < n; i += 5) /* tiny values: subnormal results in f16 and bf16 */
              if (ty[at] == DT_F32) {
                float f = (float)(i + 1) * 1e-39f;
                memcpy(a + i * 4, &f, 4);
              }
            int div = op == DT_AVG ? 3 : 1;
            dt__reduce_force_scalar(1);
            dt__reduce_mix(ref, ty[ot], a, ty[at], b, ty[bt], n, (dt_op)op, div);
            /* 0 widest, 2 AVX2, 3 no BF16 insns and f16 on zmm, 5 f16 in ymm halves */
            for (int lvl = 0; lvl <= 5; lvl += lvl == 0 || lvl == 3 ? 2 : 1) {
              dt__reduce_force_scalar(lvl);
              memset(got, 0x5a, n * oes);
              dt__reduce_mix(got, ty[ot], a, ty[at], b, ty[bt], n, (dt_op)op, div);
              for (size_t i = 0; i < n; i++)
                if (!same_bits_or_nan(got + i * oes, ref + i * oes, ty[ot]))
                  fail_msg("mix %s = %s %s %s (div %d) n=%zu level %d: element %zu differs from the portable path",
                           dt_dtype_name(ty[ot]), dt_dtype_name(ty[at]), dt_op_name((dt_op)op), dt_dtype_name(ty[bt]),
                           div, n, lvl, i);
            }
          }
  dt__reduce_force_scalar(0);
}
static void test_kernels_scalar(void **s) { (void)s; check_kernels(1); }

/* dt__reduce_many against the pairwise chain it replaces (an f32 accumulator the size of the
 * operands for half-type sums; reduce2 + reduce + finish otherwise), bit for bit: k = 1..5
 * sources, every dtype and op, lengths across its 1024-element blocks and the tails of its
 * AVX-512 loops, at every ISA level, out aliasing src[0]. */
static void test_reduce_many(void **s) {
  (void)s;
  enum { MAXN = 2600, K = 5 };
  static const size_t lens[] = {1, 17, 1023, 1024, 1025, 2600};
  static char src[K][MAXN * 8], ref[MAXN * 8], got[MAXN * 8];
  static float acc[MAXN];
  dt_rng rng;
  dt_rng_seed(&rng, 9);
  for (int t = 0; t < DT_DTYPE_COUNT; t++)
    for (int op = 0; op < DT_OP_COUNT; op++)
      for (int k = 1; k <= K; k++)
        for (size_t li = 0; li < DT_ARRAY_LEN(lens); li++) {
          dt_dtype ty = (dt_dtype)t;
          size_t n = lens[li], es = dt_dtype_size(ty);
          int div = op == DT_AVG ? k : 1;
          const void *sp[K];
          for (int j = 0; j < k; j++) {
            fill(src[j], n, ty, &rng, 1);
            sp[j] = src[j];
          }
          if (k == 1) {
            memcpy(ref, src[0], n * es);
            dt__reduce_finish(ref, n, ty, (dt_op)op, div);
          } else if (dt__coll_wide(ty, (dt_op)op)) {
            if (k == 2) {
              dt__reduce_mix(ref, ty, src[0], ty, src[1], ty, n, (dt_op)op, div);
            } else {
              dt__reduce_mix(acc, DT_F32, src[0], ty, src[1], ty, n, (dt_op)op, 1);
              for (int j = 2; j < k - 1; j++)
                dt__reduce_mix(acc, DT_F32, acc, DT_F32, src[j], ty, n, (dt_op)op, 1);
              dt__reduce_mix(ref, ty, acc, DT_F32, src[k - 1], ty, n, (dt_op)op, div);
            }
          } else {
            dt__reduce2(ref, src[0], src[1], n, ty, (dt_op)op);
            for (int j = 2; j < k; j++)
              dt__reduce(ref, src[j], n, ty, (dt_op)op);
            dt__reduce_finish(ref, n, ty, (dt_op)op, div);
          }
          /* widest, scalar, AVX2, AVX-512 without BF16 (f16 on zmm), f16 in ymm halves */
          for (int lvl = 0; lvl <= 5; lvl += lvl == 3 ? 2 : 1) {
            dt__reduce_force_scalar(lvl);
            dt__reduce_many(got, sp, k, n, ty, (dt_op)op, div);
            for (size_t i = 0; i < n; i++)
              if (!same_bits_or_nan(got + i * es, ref + i * es, ty))
                fail_msg("reduce_many %s %s k=%d n=%zu level %d: element %zu differs from the pairwise chain",
                         dt_dtype_name(ty), dt_op_name((dt_op)op), k, n, lvl, i);
          }
          dt__reduce_force_scalar(0);
          /* in place over the first source */
          dt__reduce_many(src[0], sp, k, n, ty, (dt_op)op, div);
          for (size_t i = 0; i < n; i++)
            assert_true(same_bits_or_nan(src[0] + i * es, ref + i * es, ty));
        }
}

/* Operands of 64 KiB and more, with the software prefetch (the default) and without it
 * (dt__reduce_cached(true), as the single-copy shm allreduce says below its cached footprint):
 * the same bits either way, and the setting is per call site, restored by its caller. */
static void test_reduce_cached(void **s) {
  (void)s;
  enum { N = 40000, K = 4 };
  static const dt_dtype ts[] = {DT_F32, DT_F16, DT_BF16};
  static char src[K][N * 4], ref[N * 4], got[N * 4];
  dt_rng rng;
  dt_rng_seed(&rng, 5);
  assert_false(dt__reduce_cached(false)); /* the default: operands may stream */
  for (size_t ti = 0; ti < DT_ARRAY_LEN(ts); ti++)
    for (int k = 2; k <= K; k += 2) {
      dt_dtype ty = ts[ti];
      size_t es = dt_dtype_size(ty);
      const void *sp[K];
      for (int j = 0; j < k; j++) {
        fill(src[j], N, ty, &rng, 1);
        sp[j] = src[j];
      }
      dt__reduce_many(ref, sp, k, N, ty, DT_SUM, 1);
      for (int cached = 1; cached >= 0; cached--) {
        assert_int_equal(dt__reduce_cached(cached), !cached ? 1 : 0);
        memset(got, 0, sizeof got);
        dt__reduce_many(got, sp, k, N, ty, DT_SUM, 1);
        for (size_t i = 0; i < N; i++)
          if (!same_bits_or_nan(got + i * es, ref + i * es, ty))
            fail_msg("%s k=%d cached=%d: element %zu differs", dt_dtype_name(ty), k, cached, i);
      }
    }
  assert_false(dt__reduce_cached(false));
}

/* The half-type kernels on bit patterns chosen for their edges, at every ISA level, bit for bit
 * against the portable path (any NaN for a NaN: which of two NaN operands an add returns is the
 * compiler's choice of operand order, on every path): subnormal operands, normal operands that cancel to
 * a subnormal (the AVX-512 BF16 rounding treats those as zero, so such pairs must take the
 * integer path), signalling and quiet NaNs of both signs, Inf, +-0, the largest finite values
 * (sums overflow), rounding ties, and random patterns; lengths around the 16- and 32-wide
 * loops, unaligned starts; dt__reduce2 and dt__reduce_mix with and without a divisor. Each
 * level must really be the one it names (a level that silently fell back would test nothing). */
static void test_half_patterns_isa_agree(void **s) {
  (void)s;
  const char *widest = dt__reduce_isa();
  static const uint16_t bf_sp[] = {0x0001, 0x0041, 0x007f, 0x8001, 0x807f, 0x0080, 0x8080, 0x0081, 0x8081, 0x7f81,
                                   0xff81, 0x7fc1, 0xffc0, 0x7f80, 0xff80, 0x0000, 0x8000, 0x7f7f, 0xff7f, 0x3f80, 0x3b80};
  static const uint16_t h_sp[] = {0x0001, 0x0201, 0x03ff, 0x8001, 0x83ff, 0x0400, 0x8400, 0x0401, 0x8401, 0x7c01,
                                  0xfc01, 0x7e01, 0xfe00, 0x7c00, 0xfc00, 0x0000, 0x8000, 0x7bff, 0xfbff, 0x3c00, 0x1400};
  static const size_t lens[] = {16, 31, 32, 33, 47, 64, 65, 100, 1027};
  enum { MAXN = 1100 };
  static uint16_t a[MAXN + 1], b[MAXN + 1], ref[MAXN + 1], got[MAXN + 1];
  dt_rng rng;
  dt_rng_seed(&rng, 5);
  for (int ti = 0; ti < 2; ti++) {
    dt_dtype t = ti ? DT_BF16 : DT_F16;
    const uint16_t *sp = ti ? bf_sp : h_sp;
    size_t nsp = ti ? DT_ARRAY_LEN(bf_sp) : DT_ARRAY_LEN(h_sp);
    for (int op = 0; op < DT_OP_COUNT; op++)
      for (size_t li = 0; li < DT_ARRAY_LEN(lens); li++)
        for (int mis = 0; mis < 2; mis++)
          for (int div = 1; div <= 3; div += 2) {
            size_t n = lens[li];
            uint16_t *pa = a + mis, *pb = b + mis;
            for (size_t i = 0; i < n; i++) {
              uint32_t k = dt_rng_below(&rng, 4);
              pa[i] = k < 2 ? sp[dt_rng_below(&rng, (uint32_t)nsp)] : (uint16_t)dt_rng_next(&rng);
              pb[i] = k == 0 || k == 3 ? sp[dt_rng_below(&rng, (uint32_t)nsp)] : (uint16_t)dt_rng_next(&rng);
              if (k == 1 && dt_rng_below(&rng, 2)) /* an opposite neighbour: cancels to one ulp */
                pb[i] = (uint16_t)((pa[i] ^ 0x8000) + 1);
            }
            dt__reduce_force_scalar(1);
            if (div == 1)
              dt__reduce2(ref, pa, pb, n, t, (dt_op)op);
            else
              dt__reduce_mix(ref, t, pa, t, pb, t, n, (dt_op)op, div);
            for (int lvl = 0; lvl <= 5; lvl += lvl == 0 || lvl == 3 ? 2 : 1) { /* 5: f16 in ymm halves */
              dt__reduce_force_scalar(lvl);
              const char *isa = dt__reduce_isa();
              if (lvl == 2 && strcmp(widest, "scalar"))
                assert_string_equal(isa, "avx2");
              if (lvl == 3 && strstr(widest, "avx512"))
                assert_string_equal(isa, "avx2+avx512");
              if (lvl == 0 || lvl == 5) /* 5 changes only the f16 loops' width */
                assert_string_equal(isa, widest);
              memset(got, 0x5a, sizeof got);
              if (div == 1)
                dt__reduce2(got, pa, pb, n, t, (dt_op)op);
              else
                dt__reduce_mix(got, t, pa, t, pb, t, n, (dt_op)op, div);
              for (size_t i = 0; i < n; i++)
                if (!same_bits_or_nan(got + i, ref + i, t))
                  fail_msg("%s %s n=%zu off=%d div %d level %d (%s): element %zu: %04x %s %04x gave %04x, portable %04x",
                           dt_dtype_name(t), dt_op_name((dt_op)op), n, mis, div, lvl, isa, i, pa[i],
                           dt_op_name((dt_op)op), pb[i], got[i], ref[i]);
            }
          }
  }
  dt__reduce_force_scalar(0);
}

/* f16 sums and products of two operands, every f16 against 32 fixed others (the special values,
 * then random ones) and against 32 patterns of a neighbour of its negation, on the widest path (on a CPU with AVX512-FP16: VADDPH/VMULPH, which must give the
 * bits of widening to f32 and rounding once) against the portable one. */
static void test_f16_every_value(void **s) {
  (void)s;
  enum { NA = 65536, NB = 64 };
  static const uint16_t sp[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x83ff, 0x0400, 0x8400, 0x7bff, 0xfbff,
                                0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7c01, 0x3c00, 0xbc00, 0x3c01, 0x3800, 0x1400};
  uint16_t *a = malloc(NA * 2), *b = malloc(NA * 2), *ref = malloc(NA * 2), *got = malloc(NA * 2);
  assert_non_null(a), assert_non_null(b), assert_non_null(ref), assert_non_null(got);
  dt_rng rng;
  dt_rng_seed(&rng, 16);
  for (uint32_t u = 0; u < NA; u++)
    a[u] = (uint16_t)u;
  for (int j = 0; j < NB; j++) {
    uint16_t y = j / 2 < (int)DT_ARRAY_LEN(sp) ? sp[j / 2] : (uint16_t)dt_rng_next(&rng);
    for (uint32_t u = 0; u < NA; u++) /* odd j: y; even j: a neighbour of -a (cancels to a few ulps) */
      b[u] = j % 2 ? y : (uint16_t)((u ^ 0x8000) + (uint32_t)(j % 5));
    for (int op = 0; op < 2; op++) {
      dt_op o = op ? DT_PROD : DT_SUM;
      dt__reduce_force_scalar(1);
      dt__reduce2(ref, a, b, NA, DT_F16, o);
      dt__reduce_force_scalar(0);
      /* whole (operands past L1: the 256-bit loop with AVX512-FP16), then in pieces of 4099 (the
       * 512-bit loop and a masked tail) */
      for (int pieces = 0; pieces < 2; pieces++) {
        for (uint32_t at = 0, m; at < NA; at += m) {
          m = pieces ? DT_MIN(4099u, NA - at) : NA;
          dt__reduce2(got + at, a + at, b + at, m, DT_F16, o);
        }
        for (uint32_t u = 0; u < NA; u++)
          if (!same_bits_or_nan(got + u, ref + u, DT_F16))
            fail_msg("f16 %04x %s %04x: %s gave %04x, portable %04x (%s)", a[u], dt_op_name(o), b[u],
                     dt__reduce_isa(), got[u], ref[u], pieces ? "in pieces" : "whole");
      }
    }
  }
  free(a), free(b), free(ref), free(got);
}

static void test_f16_rounding(void **s) {
  (void)s;
  for (int sc = 0; sc < 2; sc++) {
    dt__reduce_force_scalar(sc);
    struct { float in; uint16_t out; } cases[] = {
        {1.0f, 0x3c00},                      {1.0f + 0x1p-11f, 0x3c00},   /* tie -> even (down) */
        {1.0f + 3 * 0x1p-11f, 0x3c02},       /* tie -> even (up) */
        {1.0f + 0x1p-11f + 0x1p-20f, 0x3c01}, /* just above the tie */
        {65504.0f, 0x7bff},                  {65519.0f, 0x7bff},          {65520.0f, 0x7c00},
        {-65520.0f, 0xfc00},                 {0x1p-24f, 0x0001},          {0x1p-25f, 0x0000},
        {0x1p-25f * 1.0001f, 0x0001},        {0x1.8p-24f, 0x0002},        /* 1.5 subnormal ulps: tie -> 2 */
        {0x1p-14f, 0x0400},                  {0x1.ffcp-15f, 0x0400},      /* rounds up into the normals */
        {-0.0f, 0x8000},                     {INFINITY, 0x7c00},          {-INFINITY, 0xfc00},
        {1e-10f, 0x0000},
    };
    for (size_t i = 0; i < DT_ARRAY_LEN(cases); i++) {
      assert_int_equal(dt__f32_to_f16(cases[i].in), cases[i].out);
      assert_int_equal(ref_f16(cases[i].in), cases[i].out);
      /* the vector path (8 at once) agrees */
      float v[9];
      uint16_t h[9];
      for (int j = 0; j < 9; j++)
        v[j] = cases[i].in;
      dt__from_f32(h, v, 9, DT_F16);
      for (int j = 0; j < 9; j++)
        assert_int_equal(h[j], cases[i].out);
    }
    uint16_t nan = dt__f32_to_f16(NAN);
    assert_true((nan & 0x7c00) == 0x7c00 && (nan & 0x3ff));
    /* every f16 round-trips exactly */
    for (uint32_t u = 0; u < 0x10000; u++) {
      float f = dt__f16_to_f32((uint16_t)u);
      if ((u & 0x7fff) > 0x7c00) {
        assert_true(isnan(f));
        continue;
      }
      assert_true(f == ref_f16_to_f32((uint16_t)u) || (f == 0 && ref_f16_to_f32((uint16_t)u) == 0));
      assert_int_equal(dt__f32_to_f16(f), u);
    }
  }
  dt__reduce_force_scalar(0);
}

static void test_bf16_rounding(void **s) {
  (void)s;
  for (int sc = 0; sc < 2; sc++) {
    dt__reduce_force_scalar(sc);
    struct { float in; uint16_t out; } cases[] = {
        {1.0f, 0x3f80},           {1.0f + 0x1p-8f, 0x3f80},             /* tie -> even */
        {1.0f + 3 * 0x1p-8f, 0x3f82}, {1.0f + 0x1p-8f + 0x1p-20f, 0x3f81},
        {0x1.fffffep127f, 0x7f80}, /* max float rounds to Inf */
        {-0.0f, 0x8000},          {INFINITY, 0x7f80},                   {0x1p-133f, 0x0001}, {0x1p-134f, 0x0000}, {0x1.8p-133f, 0x0002},
    };
    for (size_t i = 0; i < DT_ARRAY_LEN(cases); i++) {
      assert_int_equal(dt__f32_to_bf16(cases[i].in), cases[i].out);
      assert_int_equal(ref_bf16(cases[i].in), cases[i].out);
      float v[9];
      uint16_t h[9];
      for (int j = 0; j < 9; j++)
        v[j] = cases[i].in;
      dt__from_f32(h, v, 9, DT_BF16);
      for (int j = 0; j < 9; j++)
        assert_int_equal(h[j], cases[i].out);
    }
    /* NaN stays NaN, even one whose payload would carry into the exponent */
    uint32_t nb = 0x7fffffff;
    float nf;
    memcpy(&nf, &nb, 4);
    float v[9];
    uint16_t h[9];
    for (int j = 0; j < 9; j++)
      v[j] = nf;
    dt__from_f32(h, v, 9, DT_BF16);
    for (int j = 0; j < 9; j++)
      assert_true((h[j] & 0x7fff) > 0x7f80);
    assert_true((dt__f32_to_bf16(nf) & 0x7fff) > 0x7f80);
  }
  dt__reduce_force_scalar(0);
}

static void test_nan_minmax(void **s) {
  (void)s;
  float a[16], b[16], o[16];
  for (int i = 0; i < 16; i++)
    a[i] = (float)i, b[i] = (float)(16 - i);
  a[3] = NAN;
  b[5] = NAN;
  a[12] = NAN;
  b[12] = 1;
  for (int op = DT_MIN; op <= DT_MAX; op++) {
    dt__reduce2(o, a, b, 16, DT_F32, (dt_op)op);
    assert_true(isnan(o[3]) && isnan(o[5]) && isnan(o[12]));
    assert_true(o[0] == (op == DT_MIN ? 0 : 16));
  }
  dt__reduce2(o, a, b, 16, DT_F32, DT_SUM);
  assert_true(isnan(o[3]) && isnan(o[5]) && o[0] == 16);
}

static void test_finish_and_mix(void **s) {
  (void)s;
  int32_t vi[9] = {7, -7, 8, 9, -9, 0, 1, -1, 100};
  dt__reduce_finish(vi, 9, DT_I32, DT_AVG, 4);
  int32_t ei[9] = {1, -1, 2, 2, -2, 0, 0, 0, 25}; /* truncation toward zero */
  assert_memory_equal(vi, ei, sizeof vi);
  int64_t vl[3] = {-10, 10, 3};
  dt__reduce_finish(vl, 3, DT_I64, DT_AVG, 3);
  assert_true(vl[0] == -3 && vl[1] == 3 && vl[2] == 1);
  uint8_t vu[2] = {250, 9};
  dt__reduce_finish(vu, 2, DT_U8, DT_AVG, 4);
  assert_true(vu[0] == 62 && vu[1] == 2);
  float vf[11];
  for (int i = 0; i < 11; i++)
    vf[i] = (float)(3 * i);
  dt__reduce_finish(vf, 11, DT_F32, DT_AVG, 3);
  for (int i = 0; i < 11; i++)
    assert_true(vf[i] == (float)i);
  dt__reduce_finish(vf, 11, DT_F32, DT_SUM, 3); /* not avg: untouched */
  assert_true(vf[10] == 10.0f);
  uint16_t vh[10];
  for (int i = 0; i < 10; i++)
    vh[i] = ref_f16((float)(6 * i));
  dt__reduce_finish(vh, 10, DT_F16, DT_AVG, 6);
  for (int i = 0; i < 10; i++)
    assert_int_equal(vh[i], ref_f16((float)i));
  double vd[2] = {1, 3};
  dt__reduce_finish(vd, 2, DT_F64, DT_AVG, 2);
  assert_true(vd[0] == 0.5 && vd[1] == 1.5);

  /* mixed: f16 + f32 partial -> f16 rounded once; f16 + f16 -> f32 exact */
  enum { N = 1100 };
  static uint16_t h1[N], h2[N], out[N];
  static float part[N], out32[N];
  dt_rng rng;
  dt_rng_seed(&rng, 7);
  for (int i = 0; i < N; i++) {
    h1[i] = ref_f16((float)(dt_rng_uniform(&rng) * 4 - 2));
    h2[i] = ref_f16((float)(dt_rng_uniform(&rng) * 4 - 2));
    part[i] = (float)(dt_rng_uniform(&rng) * 4 - 2);
  }
  dt__reduce_mix(out, DT_F16, h1, DT_F16, part, DT_F32, N, DT_SUM, 1);
  for (int i = 0; i < N; i++)
    assert_int_equal(out[i], ref_f16(ref_f16_to_f32(h1[i]) + part[i]));
  dt__reduce_mix(out, DT_F16, h1, DT_F16, part, DT_F32, N, DT_AVG, 3);
  for (int i = 0; i < N; i++)
    assert_int_equal(out[i], ref_f16((ref_f16_to_f32(h1[i]) + part[i]) / 3.0f));
  dt__reduce_mix(out32, DT_F32, h1, DT_F16, h2, DT_F16, N, DT_PROD, 1);
  for (int i = 0; i < N; i++)
    assert_true(out32[i] == ref_f16_to_f32(h1[i]) * ref_f16_to_f32(h2[i]));
  for (int i = 0; i < N; i++)
    h1[i] = ref_bf16((float)i * 0.37f);
  dt__reduce_mix(out, DT_BF16, h1, DT_BF16, part, DT_F32, N, DT_SUM, 1);
  for (int i = 0; i < N; i++)
    assert_int_equal(out[i], ref_bf16(bf_val(h1[i]) + part[i]));
}

static void test_dtype_helpers(void **s) {
  (void)s;
  static const size_t sizes[] = {4, 8, 2, 2, 4, 8, 1};
  for (int t = 0; t < DT_DTYPE_COUNT; t++) {
    dt_dtype back;
    assert_int_equal(dt_dtype_size((dt_dtype)t), sizes[t]);
    assert_int_equal(dt_dtype_parse(dt_dtype_name((dt_dtype)t), &back), DT_OK);
    assert_int_equal(back, t);
  }
  assert_int_equal(dt_dtype_size((dt_dtype)99), 0);
  dt_dtype d;
  assert_int_equal(dt_dtype_parse("float32", &d), DT_OK);
  assert_int_equal(d, DT_F32);
  assert_int_equal(dt_dtype_parse("bfloat16", &d), DT_OK);
  assert_int_equal(d, DT_BF16);
  assert_int_equal(dt_dtype_parse("f128", &d), DT_ERR_INVALID);
  assert_non_null(strstr(dt_last_error(), "f128"));
  for (int o = 0; o < DT_OP_COUNT; o++) {
    dt_op back;
    assert_int_equal(dt_op_parse(dt_op_name((dt_op)o), &back), DT_OK);
    assert_int_equal(back, o);
  }
  dt_op op;
  assert_int_equal(dt_op_parse("xor", &op), DT_ERR_INVALID);
  assert_non_null(strstr(dt_last_error(), "xor"));
  assert_string_equal(dt_op_name(DT_AVG), "avg");
}

/* dt__copy, as on this CPU, with its own 16-byte and vector moves (AMD CPUs'): every length to
 * 4 KiB + 130 and some longer, unaligned starts on both sides; the bytes around the destination
 * stay untouched. */
static void test_copy(void **s) {
  (void)s;
  enum { MAXN = 20000, PAD = 64 };
  uint8_t *src = malloc(MAXN + PAD), *dst = malloc(MAXN + 2 * PAD);
  assert_non_null(src);
  assert_non_null(dst);
  for (size_t i = 0; i < MAXN + PAD; i++)
    src[i] = (uint8_t)(i * 131 + 7);
  static const size_t longer[] = {8191, 8192, 8193, 12345, MAXN - 64};
  /* dt__copy: native, 16-byte moves, vector moves; dt__copy_nt: AVX-512 where present (0), AVX2
   * (2) and SSE2 (1) streams */
  static const int modes[] = {0, 1, 4, 0, 2, 1};
  for (int m = 0; m < 6; m++) {
    dt__reduce_force_scalar(modes[m]);
    for (size_t n = 0; n < 4096 + 130 + 5; n++) {
      size_t len = n < 4096 + 130 ? n : longer[n - 4096 - 130];
      size_t so = (n * 7) % 33, dof = (n * 13) % 37;
      size_t end = PAD + dof + len + PAD, bad = end;
      memset(dst, 0xEE, end);
      (m < 3 ? dt__copy : dt__copy_nt)(dst + PAD + dof, src + so, len);
      assert_memory_equal(dst + PAD + dof, src + so, len);
      for (size_t i = 0; i < end && bad == end; i++)
        if ((i < PAD + dof || i >= PAD + dof + len) && dst[i] != 0xEE)
          bad = i;
      assert_int_equal(bad, end);
    }
  }
  dt__reduce_force_scalar(0);
  free(src);
  free(dst);
}

/* dt__cpu_amd and dt__cpu_zen4 (the per-CPU defaults of the shm transport) against the
 * kernel's own decoding of the CPU in /proc/cpuinfo (vendor, family and model in decimal,
 * extended fields folded in). */
static void test_cpu_kind(void **s) {
  (void)s;
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f)
    skip();
  char line[512], vendor[64] = "";
  int family = -1, model = -1;
  while (fgets(line, sizeof line, f) && (family < 0 || model < 0 || !vendor[0])) {
    if (!vendor[0])
      (void)sscanf(line, "vendor_id : %63s", vendor);
    if (family < 0)
      (void)sscanf(line, "cpu family : %d", &family);
    if (model < 0 && !strncmp(line, "model\t", 6))
      (void)sscanf(line, "model : %d", &model);
  }
  fclose(f);
  bool amd = !strcmp(vendor, "AuthenticAMD");
  bool zen4 = amd && family == 25 &&
              ((model >= 0x10 && model <= 0x1f) || (model >= 0x60 && model <= 0x7f) || (model >= 0xa0 && model <= 0xaf));
  assert_int_equal(dt__cpu_amd(), amd);
  assert_int_equal(dt__cpu_zen4(), zen4);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cpu_kind),
      cmocka_unit_test(test_copy),
      cmocka_unit_test(test_kernels_simd),   cmocka_unit_test(test_kernels_scalar),
      cmocka_unit_test(test_kernels_avx2),   cmocka_unit_test(test_kernels_avx512_nobf16),
      cmocka_unit_test(test_mix_isa_agree),  cmocka_unit_test(test_half_patterns_isa_agree),
      cmocka_unit_test(test_reduce_many),    cmocka_unit_test(test_reduce_cached),
      cmocka_unit_test(test_f16_rounding),   cmocka_unit_test(test_bf16_rounding),
      cmocka_unit_test(test_f16_every_value),
      cmocka_unit_test(test_nan_minmax),     cmocka_unit_test(test_finish_and_mix),
      cmocka_unit_test(test_dtype_helpers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
