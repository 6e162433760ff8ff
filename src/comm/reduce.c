/* reduce.c - element-wise reduction kernels for every dtype x op, and the f16/bf16 <-> f32
 * conversions the collectives use to accumulate half types in f32 and round once.
 *
 * Two implementations of each kernel: AVX2 (+F16C for f16, FMA allowed) chosen at run time
 * with __builtin_cpu_supports, and a portable scalar one that also handles the vector loops'
 * tails (the AVX-512 half-type kernels finish theirs with one masked step); where AVX-512 is
 * there, f32 and the half types take AVX-512 kernels instead of AVX2's. All give
 * bit-identical results (same operation order per element, same NaN rule), so ranks on different
 * CPUs agree. Semantics, shared by both:
 *   - floats: IEEE; min/max propagate NaN (if a is NaN -> a, else if b is NaN -> b); with equal
 *     operands (+0/-0) min/max return b, as x86's minps/maxps do.
 *   - integers wrap modulo 2^bits on sum and prod (two's complement, no UB); avg truncates toward
 *     zero after the wrapped sum (u8 avg of large values is therefore meaningless: use i32).
 *   - f16/bf16: both operands converted to f32, reduced, rounded once to nearest-even; NaN stays
 *     a quiet NaN, overflow gives Inf. Conversions are written here (no library).
 * avg is a sum here; dt__reduce_finish divides by the number of contributions.
 * It deliberately does no threading and no non-temporal stores: callers pass cache-sized chunks.
 * The vector loops prefetch a few KiB ahead (v_pf, z_pf): one operand is often the caller's input
 * in DRAM, and the half-type loops, converting every element, otherwise left it at half of f32's
 * rate. A caller whose operands stay in the caches says so (dt__reduce_cached) and they do not:
 * there the prefetches only took load slots. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "comm/coll/coll.h"
#include "comm/comm.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define RED_X86 1
#endif

/* ---------- scalar conversions ---------- */

static inline uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static inline float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

float dt__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f)
    return bits_f32(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    /* zero or subnormal: m * 2^-24, exact in f32 */
    float f = (float)m * 0x1p-24f;
    return bits_f32(f32_bits(f) | sign);
  }
  return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

uint16_t dt__f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) /* Inf, or NaN made quiet keeping the top payload bits (as F16C does) */
    return sign | (x > 0x7f800000u ? (uint16_t)(0x7e00u | ((x >> 13) & 0x3ffu)) : 0x7c00u);
  if (x >= 0x477ff000u) /* >= 65520 = halfway between 65504 and 2^16: rounds to Inf */
    return sign | 0x7c00u;
  if (x < 0x38800000u) { /* below 2^-14: f16 subnormal (or zero) */
    if (x < 0x33000000u) /* <= half of the smallest subnormal 2^-24: rounds to 0 */
      return sign;
    uint32_t e = x >> 23, m = (x & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* 14..24 */
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1)))
      r++; /* may carry into the smallest normal, whose encoding is the next integer */
    return sign | (uint16_t)r;
  }
  uint32_t r = x - 0x38000000u; /* rebias exponent 127 -> 15 */
  r = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;
  return sign | (uint16_t)r;
}

float dt__bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t dt__f32_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN, never rounded into Inf */
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* ---------- scalar kernels ---------- */

#define F_MIN(x, y) ((x) != (x) ? (x) : ((x) < (y) ? (x) : (y)))
#define F_MAX(x, y) ((x) != (x) ? (x) : ((x) > (y) ? (x) : (y)))
#define I_MIN(x, y) ((x) < (y) ? (x) : (y))
#define I_MAX(x, y) ((x) > (y) ? (x) : (y))

typedef void (*red_fn)(void *o, const void *a, const void *b, size_t n);

#define SCALAR(name, T, EXPR)                                                 \
  static void name(void *o_, const void *a_, const void *b_, size_t n) {    \
    T *o = o_;                                                               \
    const T *a = a_, *b = b_;                                                \
    for (size_t i = 0; i < n; i++) {                                         \
      T x = a[i], y = b[i];                                                  \
      o[i] = (EXPR);                                                         \
    }                                                                        \
  }

SCALAR(s_f32_sum, float, x + y)
SCALAR(s_f32_prod, float, x *y)
SCALAR(s_f32_min, float, F_MIN(x, y))
SCALAR(s_f32_max, float, F_MAX(x, y))
SCALAR(s_f64_sum, double, x + y)
SCALAR(s_f64_prod, double, x *y)
SCALAR(s_f64_min, double, F_MIN(x, y))
SCALAR(s_f64_max, double, F_MAX(x, y))
SCALAR(s_i32_sum, int32_t, (int32_t)((uint32_t)x + (uint32_t)y))
SCALAR(s_i32_prod, int32_t, (int32_t)((uint32_t)x * (uint32_t)y))
SCALAR(s_i32_min, int32_t, I_MIN(x, y))
SCALAR(s_i32_max, int32_t, I_MAX(x, y))
SCALAR(s_i64_sum, int64_t, (int64_t)((uint64_t)x + (uint64_t)y))
SCALAR(s_i64_prod, int64_t, (int64_t)((uint64_t)x * (uint64_t)y))
SCALAR(s_i64_min, int64_t, I_MIN(x, y))
SCALAR(s_i64_max, int64_t, I_MAX(x, y))
SCALAR(s_u8_sum, uint8_t, (uint8_t)(x + y))
SCALAR(s_u8_prod, uint8_t, (uint8_t)(x * y))
SCALAR(s_u8_min, uint8_t, I_MIN(x, y))
SCALAR(s_u8_max, uint8_t, I_MAX(x, y))

#define SCALAR_HALF(name, TO, FROM, EXPR)                                     \
  static void name(void *o_, const void *a_, const void *b_, size_t n) {    \
    uint16_t *o = o_;                                                        \
    const uint16_t *a = a_, *b = b_;                                         \
    for (size_t i = 0; i < n; i++) {                                         \
      float x = TO(a[i]), y = TO(b[i]);                                      \
      o[i] = FROM(EXPR);                                                     \
    }                                                                        \
  }

SCALAR_HALF(s_f16_sum, dt__f16_to_f32, dt__f32_to_f16, x + y)
SCALAR_HALF(s_f16_prod, dt__f16_to_f32, dt__f32_to_f16, x *y)
SCALAR_HALF(s_f16_min, dt__f16_to_f32, dt__f32_to_f16, F_MIN(x, y))
SCALAR_HALF(s_f16_max, dt__f16_to_f32, dt__f32_to_f16, F_MAX(x, y))
SCALAR_HALF(s_bf16_sum, dt__bf16_to_f32, dt__f32_to_bf16, x + y)
SCALAR_HALF(s_bf16_prod, dt__bf16_to_f32, dt__f32_to_bf16, x *y)
SCALAR_HALF(s_bf16_min, dt__bf16_to_f32, dt__f32_to_bf16, F_MIN(x, y))
SCALAR_HALF(s_bf16_max, dt__bf16_to_f32, dt__f32_to_bf16, F_MAX(x, y))

/* [dtype][sum, prod, min, max] */
static const red_fn scalar_tab[DT_DTYPE_COUNT][4] = {
    [DT_F32] = {s_f32_sum, s_f32_prod, s_f32_min, s_f32_max},
    [DT_F64] = {s_f64_sum, s_f64_prod, s_f64_min, s_f64_max},
    [DT_F16] = {s_f16_sum, s_f16_prod, s_f16_min, s_f16_max},
    [DT_BF16] = {s_bf16_sum, s_bf16_prod, s_bf16_min, s_bf16_max},
    [DT_I32] = {s_i32_sum, s_i32_prod, s_i32_min, s_i32_max},
    [DT_I64] = {s_i64_sum, s_i64_prod, s_i64_min, s_i64_max},
    [DT_U8] = {s_u8_sum, s_u8_prod, s_u8_min, s_u8_max},
};

static void s_to_f32(float *dst, const uint16_t *src, size_t n, dt_dtype t) {
  if (t == DT_F16)
    for (size_t i = 0; i < n; i++)
      dst[i] = dt__f16_to_f32(src[i]);
  else
    for (size_t i = 0; i < n; i++)
      dst[i] = dt__bf16_to_f32(src[i]);
}

static void s_from_f32(uint16_t *dst, const float *src, size_t n, dt_dtype t) {
  if (t == DT_F16)
    for (size_t i = 0; i < n; i++)
      dst[i] = dt__f32_to_f16(src[i]);
  else
    for (size_t i = 0; i < n; i++)
      dst[i] = dt__f32_to_bf16(src[i]);
}

/* ---------- AVX2 kernels ---------- */
#ifdef RED_X86
#define TGT __attribute__((target("avx2,f16c,fma")))

TGT static inline __m256 v_f32_sum(__m256 x, __m256 y) { return _mm256_add_ps(x, y); }
TGT static inline __m256 v_f32_prod(__m256 x, __m256 y) { return _mm256_mul_ps(x, y); }
/* x * 1 + y rounded once: x + y's bits (NaN aside: which of two NaN operands' payload wins is
 * left open, as everywhere here), on the FMA pipes instead of the adder's (f16_halves) */
TGT static inline __m256 v_f32_sum_fma(__m256 x, __m256 y) { return _mm256_fmadd_ps(x, _mm256_set1_ps(1.0f), y); }
/* minps(x, y) = x < y ? x : y (y when unordered); then x's NaN wins, as in F_MIN */
TGT static inline __m256 v_f32_min(__m256 x, __m256 y) {
  return _mm256_blendv_ps(_mm256_min_ps(x, y), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}
TGT static inline __m256 v_f32_max(__m256 x, __m256 y) {
  return _mm256_blendv_ps(_mm256_max_ps(x, y), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}
TGT static inline __m256d v_f64_sum(__m256d x, __m256d y) { return _mm256_add_pd(x, y); }
TGT static inline __m256d v_f64_prod(__m256d x, __m256d y) { return _mm256_mul_pd(x, y); }
TGT static inline __m256d v_f64_min(__m256d x, __m256d y) {
  return _mm256_blendv_pd(_mm256_min_pd(x, y), x, _mm256_cmp_pd(x, x, _CMP_UNORD_Q));
}
TGT static inline __m256d v_f64_max(__m256d x, __m256d y) {
  return _mm256_blendv_pd(_mm256_max_pd(x, y), x, _mm256_cmp_pd(x, x, _CMP_UNORD_Q));
}
TGT static inline __m256i v_i32_sum(__m256i x, __m256i y) { return _mm256_add_epi32(x, y); }
TGT static inline __m256i v_i32_prod(__m256i x, __m256i y) { return _mm256_mullo_epi32(x, y); }
TGT static inline __m256i v_i32_min(__m256i x, __m256i y) { return _mm256_min_epi32(x, y); }
TGT static inline __m256i v_i32_max(__m256i x, __m256i y) { return _mm256_max_epi32(x, y); }
TGT static inline __m256i v_i64_sum(__m256i x, __m256i y) { return _mm256_add_epi64(x, y); }
TGT static inline __m256i v_i64_min(__m256i x, __m256i y) {
  return _mm256_blendv_epi8(x, y, _mm256_cmpgt_epi64(x, y));
}
TGT static inline __m256i v_i64_max(__m256i x, __m256i y) {
  return _mm256_blendv_epi8(y, x, _mm256_cmpgt_epi64(x, y));
}
TGT static inline __m256i v_u8_sum(__m256i x, __m256i y) { return _mm256_add_epi8(x, y); }
TGT static inline __m256i v_u8_min(__m256i x, __m256i y) { return _mm256_min_epu8(x, y); }
TGT static inline __m256i v_u8_max(__m256i x, __m256i y) { return _mm256_max_epu8(x, y); }

TGT static inline __m256 ld_ps(const float *p) { return _mm256_loadu_ps(p); }
TGT static inline void st_ps(float *p, __m256 v) { _mm256_storeu_ps(p, v); }
TGT static inline __m256d ld_pd(const double *p) { return _mm256_loadu_pd(p); }
TGT static inline void st_pd(double *p, __m256d v) { _mm256_storeu_pd(p, v); }
TGT static inline __m256i ld_si(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
TGT static inline void st_si(void *p, __m256i v) { _mm256_storeu_si256((__m256i *)p, v); }
TGT static inline __m256 ld_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
TGT static inline void st_f16(uint16_t *p, __m256 v) {
  _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
TGT static inline __m256 ld_bf16(const uint16_t *p) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
/* Same rounding as dt__f32_to_bf16: add 0x7fff + lsb, keep the top half; NaN -> quiet NaN.
 * Result: one bf16 per 32-bit lane. */
TGT static inline __m256i bf16_round(__m256 v) {
  __m256i b = _mm256_castps_si256(v);
  __m256i hi = _mm256_srli_epi32(b, 16);
  __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)), lsb), 16);
  __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
}
TGT static inline void st_bf16(uint16_t *p, __m256 v) {
  __m256i r = bf16_round(v);
  __m256i packed = _mm256_packus_epi32(r, r); /* per lane: [r0..3 r0..3 | r4..7 r4..7] */
  packed = _mm256_permute4x64_epi64(packed, 0x08);
  _mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(packed));
}
/* 16 at once: one pack and one permute for two vectors. */
TGT static inline void st2_bf16(uint16_t *p, __m256 v0, __m256 v1) {
  __m256i packed = _mm256_packus_epi32(bf16_round(v0), bf16_round(v1)); /* [a0..3 b0..3 | a4..7 b4..7] */
  _mm256_storeu_si256((__m256i *)p, _mm256_permute4x64_epi64(packed, 0xD8));
}
TGT static inline void st2_f16(uint16_t *p, __m256 v0, __m256 v1) {
  __m256i lo = _mm256_castsi128_si256(_mm256_cvtps_ph(v0, _MM_FROUND_TO_NEAREST_INT));
  _mm256_storeu_si256((__m256i *)p, _mm256_inserti128_si256(lo, _mm256_cvtps_ph(v1, _MM_FROUND_TO_NEAREST_INT), 1));
}

/* One line of each operand RED_PF bytes ahead, per 64 bytes the loop consumes: with one operand
 * in DRAM (a collective's input), f32's add streamed it at 12.5 GB/s without and 15-17 with 2-8
 * KiB of prefetch (one core of the EPYC guest, 256 KiB slices walking a 64 MiB buffer). The
 * address is computed on integers: it may lie past the operand (a prefetch never faults). */
#define RED_PF 4096
/* Operands shorter than this are not prefetched: they are cache-resident or too short for it to
 * pay, and a prefetch past their end pulls in whatever follows (in the shm flat path, the slots
 * other ranks are writing): a 4 KiB f32 allreduce took 0.52-0.59 us prefetching, 0.50-0.52
 * without (shm, 2 ranks, three alternated runs at load 7). */
#define RED_PF_MIN (64u << 10)
/* dt__reduce_cached: this thread's operands stay in the caches, so nothing is prefetched. */
static _Thread_local bool red_cached;
#define RED_PF_ON(bytes) (!red_cached && (bytes) >= RED_PF_MIN)
TGT static inline void v_pf(const void *a, const void *b) {
  _mm_prefetch((const char *)(uintptr_t)((uintptr_t)a + RED_PF), _MM_HINT_T0);
  _mm_prefetch((const char *)(uintptr_t)((uintptr_t)b + RED_PF), _MM_HINT_T0);
}

/* name: kernel; T: element; W: elements per vector; VT: vector type; LD/ST: load/store; VOP:
 * vector op; TAIL: scalar kernel for the last n % W elements. Two vectors per iteration so
 * the loads of the second overlap the op of the first. VKERN_T also takes the target (the
 * AVX-512 f32 kernels below). */
#define VKERN(name, T, W, VT, LD, ST, VOP, TAIL) VKERN_T(name, TGT, T, W, VT, LD, ST, VOP, TAIL)
#define VKERN_T(name, TGTX, T, W, VT, LD, ST, VOP, TAIL)                            \
  TGTX static void name(void *o_, const void *a_, const void *b_, size_t n) {     \
    T *o = o_;                                                                     \
    const T *a = a_, *b = b_;                                                      \
    size_t i = 0;                                                                  \
    const bool pf = RED_PF_ON(n * sizeof(T));                                      \
    for (; i + 2 * (W) <= n; i += 2 * (W)) {                                       \
      if (pf)                                                                      \
        v_pf(a + i, b + i);                                                        \
      VT x0 = LD(a + i), y0 = LD(b + i), x1 = LD(a + i + (W)), y1 = LD(b + i + (W)); \
      ST(o + i, VOP(x0, y0));                                                      \
      ST(o + i + (W), VOP(x1, y1));                                                \
    }                                                                              \
    for (; i + (W) <= n; i += (W))                                                 \
      ST(o + i, VOP(LD(a + i), LD(b + i)));                                        \
    TAIL(o + i, a + i, b + i, n - i);                                              \
  }

VKERN(v_f32_sum_k, float, 8, __m256, ld_ps, st_ps, v_f32_sum, s_f32_sum)
VKERN(v_f32_prod_k, float, 8, __m256, ld_ps, st_ps, v_f32_prod, s_f32_prod)
VKERN(v_f32_min_k, float, 8, __m256, ld_ps, st_ps, v_f32_min, s_f32_min)
VKERN(v_f32_max_k, float, 8, __m256, ld_ps, st_ps, v_f32_max, s_f32_max)
VKERN(v_f64_sum_k, double, 4, __m256d, ld_pd, st_pd, v_f64_sum, s_f64_sum)
VKERN(v_f64_prod_k, double, 4, __m256d, ld_pd, st_pd, v_f64_prod, s_f64_prod)
VKERN(v_f64_min_k, double, 4, __m256d, ld_pd, st_pd, v_f64_min, s_f64_min)
VKERN(v_f64_max_k, double, 4, __m256d, ld_pd, st_pd, v_f64_max, s_f64_max)
VKERN(v_i32_sum_k, int32_t, 8, __m256i, ld_si, st_si, v_i32_sum, s_i32_sum)
VKERN(v_i32_prod_k, int32_t, 8, __m256i, ld_si, st_si, v_i32_prod, s_i32_prod)
VKERN(v_i32_min_k, int32_t, 8, __m256i, ld_si, st_si, v_i32_min, s_i32_min)
VKERN(v_i32_max_k, int32_t, 8, __m256i, ld_si, st_si, v_i32_max, s_i32_max)
VKERN(v_i64_sum_k, int64_t, 4, __m256i, ld_si, st_si, v_i64_sum, s_i64_sum)
VKERN(v_i64_min_k, int64_t, 4, __m256i, ld_si, st_si, v_i64_min, s_i64_min)
VKERN(v_i64_max_k, int64_t, 4, __m256i, ld_si, st_si, v_i64_max, s_i64_max)
VKERN(v_u8_sum_k, uint8_t, 32, __m256i, ld_si, st_si, v_u8_sum, s_u8_sum)
VKERN(v_u8_min_k, uint8_t, 32, __m256i, ld_si, st_si, v_u8_min, s_u8_min)
VKERN(v_u8_max_k, uint8_t, 32, __m256i, ld_si, st_si, v_u8_max, s_u8_max)
/* Half types: 16 per iteration, computed in f32, stored with one 256-bit store. */
#define VKERN_H(name, LD, ST, ST2, VOP, TAIL)                                     \
  TGT static void name(void *o_, const void *a_, const void *b_, size_t n) {    \
    uint16_t *o = o_;                                                            \
    const uint16_t *a = a_, *b = b_;                                             \
    size_t i = 0;                                                                \
    for (; i + 16 <= n; i += 16) {                                               \
      __m256 r0 = VOP(LD(a + i), LD(b + i)), r1 = VOP(LD(a + i + 8), LD(b + i + 8)); \
      ST2(o + i, r0, r1);                                                        \
    }                                                                            \
    for (; i + 8 <= n; i += 8)                                                   \
      ST(o + i, VOP(LD(a + i), LD(b + i)));                                      \
    TAIL(o + i, a + i, b + i, n - i);                                            \
  }

VKERN_H(v_f16_sum_k, ld_f16, st_f16, st2_f16, v_f32_sum, s_f16_sum)
VKERN_H(v_f16_prod_k, ld_f16, st_f16, st2_f16, v_f32_prod, s_f16_prod)
VKERN_H(v_f16_min_k, ld_f16, st_f16, st2_f16, v_f32_min, s_f16_min)
VKERN_H(v_f16_max_k, ld_f16, st_f16, st2_f16, v_f32_max, s_f16_max)

/* bf16 in pairs (as the AVX-512 zb_* below): 16 bf16 loaded as 8 dwords, the odd ones widened
 * with a mask and the even ones with a shift, rounded in place, merged by one word blend. No
 * zero-extension on the way in and no pack + permute on the way out. */
TGT static inline __m256 vb_even(__m256i w) { return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)); }
TGT static inline __m256 vb_odd(__m256i w) {
  return _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32((int)0xffff0000u)));
}
TGT static inline __m256i vb_round_hi(__m256 v) { /* bf16 in the top half of each lane */
  __m256i b = _mm256_castps_si256(v);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)), lsb);
  __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(r, _mm256_or_si256(b, _mm256_set1_epi32(0x400000)), nan);
}
TGT static inline void vb_store(uint16_t *p, __m256 even, __m256 odd) {
  __m256i e = _mm256_srli_epi32(vb_round_hi(even), 16), o = vb_round_hi(odd);
  _mm256_storeu_si256((__m256i *)p, _mm256_blend_epi16(e, o, 0xAA));
}
/* The same rounding without the NaN test, for what an add, a multiply or a division made of
 * widened bf16: a NaN among those has its low 16 bits zero (the default NaN, or an operand's with
 * the quiet bit set), and adding at most 0x8000 to them carries nothing into the top half, which
 * is already that NaN's quiet bf16. min and max can pass a signalling NaN through unquieted:
 * they keep vb_store. bf16 sums 11-14 -> 14-16 GB/s of output at 8-256 KiB (one core of the EPYC
 * guest, bench/reduce_bw.c; bench/results/bf16-round-2026-11-27-epyc.txt). */
TGT static inline __m256i vb_round_hi_arith(__m256 v) {
  __m256i b = _mm256_castps_si256(v);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  return _mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)), lsb);
}
TGT static inline void vb_store_arith(uint16_t *p, __m256 even, __m256 odd) {
  __m256i e = _mm256_srli_epi32(vb_round_hi_arith(even), 16), o = vb_round_hi_arith(odd);
  _mm256_storeu_si256((__m256i *)p, _mm256_blend_epi16(e, o, 0xAA));
}
#define VB_STORE_v_f32_sum vb_store_arith
#define VB_STORE_v_f32_prod vb_store_arith
#define VB_STORE_v_f32_min vb_store
#define VB_STORE_v_f32_max vb_store
#define VB_PAIR(o, a, b, VOP, DIV)                                                                    \
  do {                                                                                                \
    __m256i wa_ = ld_si(a), wb_ = ld_si(b);                                                           \
    VB_STORE_##VOP(o, DIV(VOP(vb_even(wa_), vb_even(wb_))), DIV(VOP(vb_odd(wa_), vb_odd(wb_))));      \
  } while (0)
#define VB_NODIV(x) (x)
#define VB_DIV(x) _mm256_div_ps((x), vd)
#define VKERN_B(name, VOP, TAIL)                                                  \
  TGT static void name(void *o_, const void *a_, const void *b_, size_t n) {    \
    uint16_t *o = o_;                                                            \
    const uint16_t *a = a_, *b = b_;                                             \
    size_t i = 0;                                                                \
    for (; i + 16 <= n; i += 16)                                                 \
      VB_PAIR(o + i, a + i, b + i, VOP, VB_NODIV);                               \
    for (; i + 8 <= n; i += 8)                                                   \
      st_bf16(o + i, VOP(ld_bf16(a + i), ld_bf16(b + i)));                       \
    TAIL(o + i, a + i, b + i, n - i);                                            \
  }
VKERN_B(v_bf16_sum_k, v_f32_sum, s_bf16_sum)
VKERN_B(v_bf16_prod_k, v_f32_prod, s_bf16_prod)
VKERN_B(v_bf16_min_k, v_f32_min, s_bf16_min)
VKERN_B(v_bf16_max_k, v_f32_max, s_bf16_max)

/* AVX2 has no 64-bit or 8-bit multiply: those products stay scalar. */
static const red_fn avx2_tab[DT_DTYPE_COUNT][4] = {
    [DT_F32] = {v_f32_sum_k, v_f32_prod_k, v_f32_min_k, v_f32_max_k},
    [DT_F64] = {v_f64_sum_k, v_f64_prod_k, v_f64_min_k, v_f64_max_k},
    [DT_F16] = {v_f16_sum_k, v_f16_prod_k, v_f16_min_k, v_f16_max_k},
    [DT_BF16] = {v_bf16_sum_k, v_bf16_prod_k, v_bf16_min_k, v_bf16_max_k},
    [DT_I32] = {v_i32_sum_k, v_i32_prod_k, v_i32_min_k, v_i32_max_k},
    [DT_I64] = {v_i64_sum_k, s_i64_prod, v_i64_min_k, v_i64_max_k},
    [DT_U8] = {v_u8_sum_k, s_u8_prod, v_u8_min_k, v_u8_max_k},
};

TGT static void v_to_f32(float *dst, const uint16_t *src, size_t n, dt_dtype t) {
  size_t i = 0;
  if (t == DT_F16)
    for (; i + 8 <= n; i += 8)
      st_ps(dst + i, ld_f16(src + i));
  else
    for (; i + 8 <= n; i += 8)
      st_ps(dst + i, ld_bf16(src + i));
  s_to_f32(dst + i, src + i, n - i, t);
}

TGT static void v_from_f32(uint16_t *dst, const float *src, size_t n, dt_dtype t) {
  size_t i = 0;
  if (t == DT_F16)
    for (; i + 8 <= n; i += 8)
      st_f16(dst + i, ld_ps(src + i));
  else
    for (; i + 16 <= n; i += 16)
      st2_bf16(dst + i, ld_ps(src + i), ld_ps(src + i + 8));
  for (; i + 8 <= n; i += 8)
    if (t == DT_F16)
      st_f16(dst + i, ld_ps(src + i));
    else
      st_bf16(dst + i, ld_ps(src + i));
  s_from_f32(dst + i, src + i, n - i, t);
}

/* Fused mixed-type reduction for dt__reduce_mix: each 8 elements are loaded from a and b in
 * their types, reduced (and divided) in f32 and stored in out's type in one pass. The
 * three-pass form (convert a block of both operands to f32, reduce, convert back) moved f16
 * at 3.5 GB/s per operand against 27 GB/s for f32 (256 KiB slices, one core of the EPYC guest),
 * so half-type allreduces were far slower in bytes/s than f32. Same operations per element as
 * the scalar path, so the results are bit-identical. Returns how many elements it did (a
 * multiple of 8); the caller finishes the tail. */
TGT static inline __m256 ld_any(const void *p, dt_dtype t, size_t i) {
  if (t == DT_F32)
    return ld_ps((const float *)p + i);
  if (t == DT_F16)
    return ld_f16((const uint16_t *)p + i);
  return ld_bf16((const uint16_t *)p + i);
}
TGT static inline void st_any(void *p, dt_dtype t, size_t i, __m256 v) {
  if (t == DT_F32)
    st_ps((float *)p + i, v);
  else if (t == DT_F16)
    st_f16((uint16_t *)p + i, v);
  else
    st_bf16((uint16_t *)p + i, v);
}
#define VMIX(name, VOP)                                                                          \
  TGT static size_t name(void *o, dt_dtype ot, const void *a, dt_dtype at, const void *b, dt_dtype bt, \
                         size_t n, int div) {                                                    \
    size_t i = 0;                                                                                \
    __m256 vd = _mm256_set1_ps((float)div);                                                      \
    if (div > 1 && at == bt && at == ot && at == DT_F16) {                                       \
      for (; i + 8 <= n; i += 8)                                                                 \
        st_f16((uint16_t *)o + i,                                                                \
               _mm256_div_ps(VOP(ld_f16((const uint16_t *)a + i), ld_f16((const uint16_t *)b + i)), vd)); \
    } else if (div > 1 && at == bt && at == ot && at == DT_BF16) {                               \
      for (; i + 16 <= n; i += 16)                                                               \
        VB_PAIR((uint16_t *)o + i, (const uint16_t *)a + i, (const uint16_t *)b + i, VOP, VB_DIV); \
      for (; i + 8 <= n; i += 8)                                                                 \
        st_bf16((uint16_t *)o + i,                                                               \
                _mm256_div_ps(VOP(ld_bf16((const uint16_t *)a + i), ld_bf16((const uint16_t *)b + i)), vd)); \
    } else if (div > 1) {                                                                        \
      for (; i + 8 <= n; i += 8)                                                                 \
        st_any(o, ot, i, _mm256_div_ps(VOP(ld_any(a, at, i), ld_any(b, bt, i)), vd));          \
    } else if (at == bt && at == ot && at != DT_F32) {                                           \
      /* the all-half case of two ranks, specialized: 2 vectors a step, no type tests */        \
      if (at == DT_F16)                                                                          \
        for (; i + 16 <= n; i += 16)                                                             \
          st2_f16((uint16_t *)o + i, VOP(ld_f16((const uint16_t *)a + i), ld_f16((const uint16_t *)b + i)), \
                  VOP(ld_f16((const uint16_t *)a + i + 8), ld_f16((const uint16_t *)b + i + 8))); \
      else                                                                                       \
        for (; i + 16 <= n; i += 16)                                                             \
          VB_PAIR((uint16_t *)o + i, (const uint16_t *)a + i, (const uint16_t *)b + i, VOP, VB_NODIV); \
    } else {                                                                                     \
      for (; i + 8 <= n; i += 8)                                                                 \
        st_any(o, ot, i, VOP(ld_any(a, at, i), ld_any(b, bt, i)));                              \
    }                                                                                            \
    return i;                                                                                    \
  }
VMIX(v_mix_sum, v_f32_sum)
VMIX(v_mix_prod, v_f32_prod)
VMIX(v_mix_min, v_f32_min)
VMIX(v_mix_max, v_f32_max)

/* ---------- AVX-512 half-type kernels ----------
 * Half types are bound by their conversions, not by memory: 16 lanes per instruction, masked
 * NaN selection and vpmovdw (instead of pack + permute) lift them. Same per-element operations
 * as the scalar path (f16 through the same VCVTPH2PS/VCVTPS2PH rounding to nearest even, bf16
 * through the same integer rounding). Not AVX-512 BF16's VCVTNE2PS2BF16: it flushes subnormal
 * inputs and outputs to zero, so its bits would differ from other ranks' scalar or AVX2 ones. */
#define TGT512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c,fma")))
TGT512 static inline __m512 z_ld_f16(const uint16_t *p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
TGT512 static inline void z_st_f16(uint16_t *p, __m512 v) {
  _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
TGT512 static inline __m512 z_ld_bf16(const uint16_t *p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
TGT512 static inline void z_st_bf16(uint16_t *p, __m512 v) {
  __m512i b = _mm512_castps_si512(v);
  __m512i hi = _mm512_srli_epi32(b, 16);
  __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)), lsb), 16);
  __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
  _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(r));
}
TGT512 static inline __m512 z_ld(const void *p, dt_dtype t, size_t i) {
  if (t == DT_F32)
    return _mm512_loadu_ps((const float *)p + i);
  if (t == DT_F16)
    return z_ld_f16((const uint16_t *)p + i);
  return z_ld_bf16((const uint16_t *)p + i);
}
TGT512 static inline void z_st(void *p, dt_dtype t, size_t i, __m512 v) {
  if (t == DT_F32)
    _mm512_storeu_ps((float *)p + i, v);
  else if (t == DT_F16)
    z_st_f16((uint16_t *)p + i, v);
  else
    z_st_bf16((uint16_t *)p + i, v);
}
TGT512 static inline __m512 z_sum(__m512 x, __m512 y) { return _mm512_add_ps(x, y); }
TGT512 static inline __m512 z_prod(__m512 x, __m512 y) { return _mm512_mul_ps(x, y); }
/* as v_f32_min/max: vminps semantics, then x's NaN wins */
TGT512 static inline __m512 z_min(__m512 x, __m512 y) {
  return _mm512_mask_mov_ps(_mm512_min_ps(x, y), _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}
TGT512 static inline __m512 z_max(__m512 x, __m512 y) {
  return _mm512_mask_mov_ps(_mm512_max_ps(x, y), _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}
/* bf16 in pairs: a bf16 is the top half of its f32, so of 32 bf16 loaded as 16 dwords the odd
 * ones widen with a mask and the even ones with a shift; both halves round in place (the bf16
 * lands in each dword's top half) and one word blend stores them back in order. No cross-lane
 * vpmovzxwd/vpmovdw, which bound the 16-wide form (19-22 GB/s per operand against 37-40 for
 * f16 and 40-56 for f32, 256 KiB slices on one core of the EPYC guest). Same rounding as
 * dt__f32_to_bf16: add 0x7fff + lsb, keep the top half; NaN -> quiet NaN. */
TGT512 static inline __m512i zb_round_hi(__m512 v) {
  __m512i b = _mm512_castps_si512(v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)), lsb);
  return _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), b, _mm512_set1_epi32(0x400000));
}
TGT512 static inline __m512 zb_even(__m512i w) { return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)); }
TGT512 static inline __m512 zb_odd(__m512i w) {
  return _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xffff0000u)));
}
TGT512 static inline void zb_store(uint16_t *p, __m512 even, __m512 odd) {
  __m512i e = _mm512_srli_epi32(zb_round_hi(even), 16), o = zb_round_hi(odd);
  _mm512_storeu_si512(p, _mm512_mask_blend_epi16(0xAAAAAAAAu, e, o));
}
/* Prefetch for the all-half loops, one line of each operand per 32 elements, HALF_PF bytes
 * ahead. With one operand in DRAM (the caller's input, as in the shm slice reduction and the
 * ring's), the f16 loop streamed it at 5.7-7 GB/s where f32's add did 12-17 (one core of the
 * EPYC guest, 256 KiB slices walking a 64 MiB buffer): converting each element, it issues its
 * loads too slowly for the hardware prefetcher to stay ahead of DRAM. Prefetching 2, 4 or 8 KiB
 * ahead: 15, 19, 22-24 GB/s against 8.5 without (alternated in one run; f32's add with its own
 * prefetch, VKERN, 15-17 against 12.5). Computed on integers: the address may lie past the
 * operand (a prefetch never faults). */
#define HALF_PF 8192
TGT512 static inline void z_pf1(const void *a, size_t byte) {
  _mm_prefetch((const char *)(uintptr_t)((uintptr_t)a + byte + HALF_PF), _MM_HINT_T0);
}
TGT512 static inline void z_pf(const void *a, const void *b, size_t i) {
  _mm_prefetch((const char *)(uintptr_t)((uintptr_t)a + i * 2 + HALF_PF), _MM_HINT_T0);
  _mm_prefetch((const char *)(uintptr_t)((uintptr_t)b + i * 2 + HALF_PF), _MM_HINT_T0);
}
/* 32 bf16: o = (a op b) [/ d], stored by ST2(o, even, odd) */
#define ZB_PAIR(o, a, b, ZOP, DIV, ST2)                                                        \
  do {                                                                                         \
    if (pf)                                                                                    \
      z_pf(a, b, 0);                                                                           \
    __m512i wa_ = _mm512_loadu_si512(a), wb_ = _mm512_loadu_si512(b);                          \
    ST2(o, DIV(ZOP(zb_even(wa_), zb_even(wb_))), DIV(ZOP(zb_odd(wa_), zb_odd(wb_))));          \
  } while (0)
#define ZB_NODIV(x) (x)
#define ZB_DIV(x) _mm512_div_ps((x), vd)

/* ZMIX_T's f32 + half -> half loop, in the operands' order (w: the f32 one, h: the half one). */
#define ZMIX_WIDE(ZOP, LD, ST)                                                                    \
  do {                                                                                            \
    if (at == DT_F32)                                                                             \
      for (; i + 16 <= n; i += 16)                                                                \
        ST((uint16_t *)o + i, ZOP(_mm512_loadu_ps(w + i), LD(h + i)));                            \
    else                                                                                          \
      for (; i + 16 <= n; i += 16)                                                                \
        ST((uint16_t *)o + i, ZOP(LD(h + i), _mm512_loadu_ps(w + i)));                            \
  } while (0)

/* Whether the all-f16 loops below convert in 256-bit halves (VCVTPH2PS/VCVTPS2PH and the f32
 * arithmetic on ymm), issue no software prefetch, and sum on the FMA pipes (v_f32_sum_fma): on
 * Zen 4, whose 512-bit VCVTPS2PH converts about half as many elements per cycle as two 256-bit
 * ones, and whose adds share their pipes with the conversions. One core of the EPYC Zen 4 guest,
 * `bench/reduce_bw 65536 262144` (f16 sums of two operands in cache, GB/s of output): 21-22 on
 * zmm, 26 in halves, 30-32 with the FMA (f32 32-37); the prefetch cost the halves 10% in cache
 * and, in the 2-rank shm allreduce, 0.94-0.97x f32's bytes/s at 16-64 MiB against 1.04-1.07x
 * without it. `bench/dtype_ab` (f16 time per byte against f32's, medians of 5 alternated runs):
 * 0.93-0.96 -> 0.97-0.99 at 64 KiB-4 MiB, 0.95-0.98 -> 1.04-1.07 at 16-64 MiB. The k-operand
 * loop (ZMANY) and the f32 + f16 one (ZMIX_WIDE) in halves were level or slower and stay on zmm
 * (bench/results/f16-halves-2026-12-06-zen4.txt). On the Zen 5 guest the 256-bit conversions
 * were the slower (BENCHMARKS-LOG.md, "The half types on the Zen 5"); Intel's not measured: both
 * keep zmm. Same conversions and rounding either way. */
static bool f16_halves(void);
#define YH_DIV(x) _mm256_div_ps((x), vd8)
#define YH_NODIV(x) (x)
/* o = (a op b) [/ div] over all-f16 operands, 32 elements an iteration (then 16) */
#define ZH_LOOP(ZOP, VOP, ZDIV, YDIV)                                                             \
  do {                                                                                            \
    uint16_t *ho = o;                                                                             \
    const uint16_t *ha = a, *hb = b;                                                              \
    if (f16_halves()) /* no software prefetch: see f16_halves */                                 \
      for (; i + 32 <= n; i += 32) {                                                              \
        st_f16(ho + i, YDIV(VOP(ld_f16(ha + i), ld_f16(hb + i))));                                \
        st_f16(ho + i + 8, YDIV(VOP(ld_f16(ha + i + 8), ld_f16(hb + i + 8))));                    \
        st_f16(ho + i + 16, YDIV(VOP(ld_f16(ha + i + 16), ld_f16(hb + i + 16))));                 \
        st_f16(ho + i + 24, YDIV(VOP(ld_f16(ha + i + 24), ld_f16(hb + i + 24))));                 \
      }                                                                                           \
    else                                                                                          \
      for (; i + 32 <= n; i += 32) {                                                              \
        if (pf)                                                                                   \
          z_pf(a, b, i);                                                                          \
        z_st_f16(ho + i, ZDIV(ZOP(z_ld_f16(ha + i), z_ld_f16(hb + i))));                          \
        z_st_f16(ho + i + 16, ZDIV(ZOP(z_ld_f16(ha + i + 16), z_ld_f16(hb + i + 16))));           \
      }                                                                                           \
    for (; i + 16 <= n; i += 16)                                                                  \
      z_st_f16(ho + i, ZDIV(ZOP(z_ld_f16(ha + i), z_ld_f16(hb + i))));                            \
  } while (0)
/* out = (a op b) [/ div] over types (f32, f16, bf16), 16 at a time; returns elements done.
 * ZMIX: AVX-512F/BW; ZMIXB also rounds bf16 with AVX-512 BF16 where that is exact. */
#define ZMIX_T(name, ZOP, VOP, TGTX, ST_BF16, ST2_BF16, ST_ANY)                                 \
  TGTX static size_t name(void *o, dt_dtype ot, const void *a, dt_dtype at, const void *b, dt_dtype bt, \
                            size_t n, int div) {                                                  \
    size_t i = 0;                                                                                 \
    const bool pf = RED_PF_ON(n * 2); /* read by the all-half loops */                            \
    __m512 vd = _mm512_set1_ps((float)div);                                                       \
    __m256 vd8 = _mm256_set1_ps((float)div);                                                      \
    if (div > 1 && at == bt && at == ot && at == DT_F16) {                                        \
      ZH_LOOP(ZOP, VOP, ZB_DIV, YH_DIV);                                                          \
    } else if (div > 1 && at == bt && at == ot && at == DT_BF16) {                                \
      for (; i + 32 <= n; i += 32)                                                                \
        ZB_PAIR((uint16_t *)o + i, (const uint16_t *)a + i, (const uint16_t *)b + i, ZOP, ZB_DIV, ST2_BF16); \
      for (; i + 16 <= n; i += 16)                                                                \
        ST_BF16((uint16_t *)o + i,                                                              \
                  _mm512_div_ps(ZOP(z_ld_bf16((const uint16_t *)a + i), z_ld_bf16((const uint16_t *)b + i)), vd)); \
    } else if (div > 1) {                                                                         \
      for (; i + 16 <= n; i += 16)                                                                \
        ST_ANY(o, ot, i, _mm512_div_ps(ZOP(z_ld(a, at, i), z_ld(b, bt, i)), vd));                  \
    } else if (at == bt && at == ot && at == DT_F16) {                                            \
      ZH_LOOP(ZOP, VOP, ZB_NODIV, YH_NODIV);                                                      \
    } else if (at == bt && at == ot && at == DT_BF16) {                                           \
      for (; i + 32 <= n; i += 32)                                                                \
        ZB_PAIR((uint16_t *)o + i, (const uint16_t *)a + i, (const uint16_t *)b + i, ZOP, ZB_NODIV, ST2_BF16); \
      for (; i + 16 <= n; i += 16)                                                                \
        ST_BF16((uint16_t *)o + i, ZOP(z_ld_bf16((const uint16_t *)a + i), z_ld_bf16((const uint16_t *)b + i))); \
    } else if (ot != DT_F32 && ((at == DT_F32 && bt == ot) || (at == ot && bt == DT_F32))) {     \
      /* a half piece widened ahead and the other rank's (shm flat): no type tests */            \
      const float *w = (const float *)(at == DT_F32 ? a : b);                                     \
      const uint16_t *h = (const uint16_t *)(at == DT_F32 ? b : a);                               \
      if (ot == DT_F16)                                                                           \
        ZMIX_WIDE(ZOP, z_ld_f16, z_st_f16);                                                       \
      else                                                                                        \
        ZMIX_WIDE(ZOP, z_ld_bf16, ST_BF16);                                                       \
    } else {                                                                                      \
      for (; i + 16 <= n; i += 16)                                                                \
        ST_ANY(o, ot, i, ZOP(z_ld(a, at, i), z_ld(b, bt, i)));                                      \
    }                                                                                             \
    return i;                                                                                     \
  }
#define ZMIX(name, ZOP, VOP) ZMIX_T(name, ZOP, VOP, TGT512, z_st_bf16, zb_store, z_st)

/* AVX-512 BF16's VCVTNEPS2BF16 rounds to nearest even and quiets NaN exactly as the integer
 * rounding does, but treats subnormal inputs as zero: vectors with a subnormal lane take the
 * integer path (a normal f32 never rounds to a bf16 subnormal: they share the exponent range). */
#define TGTBF __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,f16c,fma")))
TGTBF static inline void b_st_bf16(uint16_t *p, __m512 v) {
  __m256i w = (__m256i)_mm512_cvtneps_pbh(v);
  if (_mm256_testn_epi16_mask(w, _mm256_set1_epi16(0x7fff)) && _mm512_fpclass_ps_mask(v, 0x20)) {
    z_st_bf16(p, v);
    return;
  }
  _mm256_storeu_si256((__m256i *)p, w);
}
TGTBF static inline void b_st(void *p, dt_dtype t, size_t i, __m512 v) {
  if (t == DT_BF16)
    b_st_bf16((uint16_t *)p + i, v);
  else
    z_st(p, t, i, v);
}
/* Even and odd halves (zb_even/zb_odd) rounded by one VCVTNE2PS2BF16 and put back in order by
 * one VPERMW; a pair with a subnormal lane (VFPCLASSPS) takes the integer path. A subnormal lane
 * comes out as a zero word, so the two VFPCLASSPS run only for the pairs with one: one test
 * instead of two classifications and their mask moves on the two vector ports this loop is bound
 * by (bf16 sums 25-28 -> 27-30 GB/s of output in L1 and L2, one core of the Xeon guest with
 * AVX512-BF16; bench/results/bf16-check-2026-11-29-xeon.txt). */
TGTBF static inline void bb_store(uint16_t *p, __m512 even, __m512 odd) {
  __m512i w = (__m512i)_mm512_cvtne2ps_pbh(odd, even);
  if (_mm512_testn_epi16_mask(w, _mm512_set1_epi16(0x7fff)) &&
      (_mm512_fpclass_ps_mask(even, 0x20) | _mm512_fpclass_ps_mask(odd, 0x20))) {
    zb_store(p, even, odd);
    return;
  }
  /* words 0-15: even results, 16-31: odd results -> result word 2i from i, 2i+1 from 16+i */
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  _mm512_storeu_si512(p, _mm512_permutexvar_epi16(idx, w));
}
#define ZMIXB(name, ZOP, VOP) ZMIX_T(name, ZOP, VOP, TGTBF, b_st_bf16, bb_store, b_st)
/* The f32 and f16 loops are written out per type, over a local copy of the source pointers:
 * one loop with z_ld/z_st's type tests on every load and the pointers reloaded after every store
 * (o might have aliased src[]) reduced 4 operands of 64 KiB in L2 at 11.4 GB/s each for f32 and
 * 8.5-9.2 for f16; written out, 25.8-26.1 and 16.1-16.3 (bf16's loop, already separate, 20-21;
 * alternated single-thread runs on one core of the EPYC guest). This is the 4-rank shm slice
 * reduction and the 3-8 rank flat one. */
#define ZMANY_LOOP(ZOP, W, PF_EVERY, LD, ST)                                                           \
  for (; i + (W) <= n; i += (W)) {                                                                \
    if (pf && (i & ((PF_EVERY) - 1)) == 0)                                                        \
      for (int j = 0; j < k; j++)                                                                 \
        z_pf1(s[j], i * es);                                                                      \
    __m512 acc = ZOP(LD(s[0], i), LD(s[1], i));                                                   \
    for (int j = 2; j < k; j++)                                                                   \
      acc = ZOP(acc, LD(s[j], i));                                                                \
    if (div > 1)                                                                                  \
      acc = _mm512_div_ps(acc, vd);                                                               \
    ST(o, i, acc);                                                                                \
  }
#define ZM_LD_F32(p, i) _mm512_loadu_ps((const float *)(p) + (i))
#define ZM_ST_F32(p, i, v) _mm512_storeu_ps((float *)(p) + (i), (v))
#define ZM_LD_F16(p, i) z_ld_f16((const uint16_t *)(p) + (i))
#define ZM_ST_F16(p, i, v) z_st_f16((uint16_t *)(p) + (i), (v))
/* out = (((s0 op s1) op s2) ... op s[k-1]) [/ div] for k >= 2 operands of one type t (f32, f16,
 * bf16), accumulated in registers and rounded once: each operand is read once, out written once,
 * no partials in memory. Returns elements done (the caller finishes the tail). */
#define ZMANY(name, ZOP, TGTX, ST2_BF16)                                                           \
  TGTX static size_t name(void *o, const void *const *src, int k, size_t n, dt_dtype t, int div) { \
    size_t i = 0, es = dt_dtype_size(t);                                                          \
    const bool pf = RED_PF_ON(n * es);                                                            \
    __m512 vd = _mm512_set1_ps((float)div);                                                       \
    const void *s[64];                                                                            \
    for (int j = 0; j < k; j++)                                                                   \
      s[j] = src[j];                                                                              \
    if (t == DT_BF16) {                                                                           \
      for (; i + 32 <= n; i += 32) {                                                              \
        __m512i w0 = _mm512_loadu_si512((const uint16_t *)s[0] + i);                              \
        __m512i w1 = _mm512_loadu_si512((const uint16_t *)s[1] + i);                              \
        if (pf)                                                                                   \
          for (int j = 0; j < k; j++)                                                             \
            z_pf1(s[j], i * 2);                                                                   \
        __m512 e = ZOP(zb_even(w0), zb_even(w1)), od = ZOP(zb_odd(w0), zb_odd(w1));               \
        for (int j = 2; j < k; j++) {                                                             \
          __m512i w = _mm512_loadu_si512((const uint16_t *)s[j] + i);                             \
          e = ZOP(e, zb_even(w));                                                                 \
          od = ZOP(od, zb_odd(w));                                                                \
        }                                                                                         \
        if (div > 1) {                                                                            \
          e = _mm512_div_ps(e, vd);                                                               \
          od = _mm512_div_ps(od, vd);                                                             \
        }                                                                                         \
        ST2_BF16((uint16_t *)o + i, e, od);                                                       \
      }                                                                                           \
    } else if (t == DT_F32) {                                                                     \
      ZMANY_LOOP(ZOP, 16, 16, ZM_LD_F32, ZM_ST_F32) /* a line of each operand per 64 bytes */     \
    } else {                                                                                      \
      ZMANY_LOOP(ZOP, 16, 32, ZM_LD_F16, ZM_ST_F16)                                               \
    }                                                                                             \
    return i;                                                                                     \
  }
ZMIX(z_mix_sum, z_sum, v_f32_sum_fma)
ZMIX(z_mix_prod, z_prod, v_f32_prod)
ZMIX(z_mix_min, z_min, v_f32_min)
ZMIX(z_mix_max, z_max, v_f32_max)

/* f32 of two operands, 16 lanes: each store writes one whole 64-byte line where the AVX2 kernel
 * writes it in two halves (a prefetch per two lines: level with one per line, section 6 of the
 * results file). Same operations per element as the AVX2 kernels (and their scalar tail). The
 * 2-rank shm allreduce on the Zen 5 guest, medians of 6 alternated rounds against AVX2: 0.90-0.97x
 * its time at 8-32 MiB and level at 4 and 64 MiB with this kernel (DTRAIN_NO_AVX512 for AVX2),
 * 0.88-0.91x at 4, 32 and 64 MiB in an earlier set with the host in another state; level at 128
 * KiB-2 MiB and in place; one core's sums from L1/L2 (bench/reduce_bw.c) level within that host's
 * noise (bench/results/f32-avx512-2026-12-03-zen5.txt). */
TGT512 static inline __m512 z_ld_ps(const float *p) { return _mm512_loadu_ps(p); }
TGT512 static inline void z_st_ps(float *p, __m512 v) { _mm512_storeu_ps(p, v); }
#define ZKERN_F32(name, ZOP, TAIL) VKERN_T(name, TGT512, float, 16, __m512, z_ld_ps, z_st_ps, ZOP, TAIL)
ZKERN_F32(z_f32_sum_k, z_sum, s_f32_sum)
ZKERN_F32(z_f32_prod_k, z_prod, s_f32_prod)
ZKERN_F32(z_f32_min_k, z_min, s_f32_min)
ZKERN_F32(z_f32_max_k, z_max, s_f32_max)
static const red_fn z_f32_tab[4] = {z_f32_sum_k, z_f32_prod_k, z_f32_min_k, z_f32_max_k};
ZMIXB(b_mix_sum, z_sum, v_f32_sum_fma)
ZMIXB(b_mix_prod, z_prod, v_f32_prod)
ZMIXB(b_mix_min, z_min, v_f32_min)
ZMIXB(b_mix_max, z_max, v_f32_max)
ZMANY(z_many_sum, z_sum, TGT512, zb_store)
ZMANY(z_many_prod, z_prod, TGT512, zb_store)
ZMANY(b_many_sum, z_sum, TGTBF, bb_store)
ZMANY(b_many_prod, z_prod, TGTBF, bb_store)

/* f16 sum and product of two operands with AVX512-FP16 (VADDPH, VMULPH: 32 elements per
 * instruction, rounded to nearest even), where the other kernels widen both operands to f32,
 * operate and round back. The bits are the same: f32 carries 24 >= 2 x 11 + 2 significant bits,
 * with which rounding the exact sum or product first to f32 and then to f16 gives the correctly
 * rounded f16 result (S. A. Figueroa, "When is double rounding innocuous?", 1995), which is
 * what VADDPH and VMULPH return. On one core of an Intel Xeon guest with AVX512-FP16
 * (bench/reduce_bw.c, GB/s of output): 121-124 at 8 KiB and 44-45 at 32-256 KiB (with the
 * 256-bit loop below), where the widening kernel ran 30 and 27-30 and f32's 81-82 and 44-45.
 * Only two operands rounded once: more
 * (dt__reduce_many's k > 2) accumulate in f32. */
#define TGTFP16 __attribute__((target("avx512fp16,avx512f,avx512bw,avx512vl,avx2,f16c,fma")))
/* Operands from this many bytes (three of them no longer fit the 48 KiB L1) go 256 bits at a
 * time. From L2 the 512-bit loop ran 39-40 GB/s of output and the 256-bit one 43-45, as f32's
 * AVX2 loop, at 32-256 KiB; in L1 (8-16 KiB) 512 bits ran 114-131 against 88-98 (one core of the
 * Xeon guest with AVX512-FP16, a standalone loop over both forms, 2026-11-29;
 * bench/results/fp16-width-2026-11-29-xeon.txt). The 2-rank allreduce's f16/f32 in bytes/s went
 * from 0.87-0.91 to 0.97-1.06 at 128-512 KiB (dtypes-fp16w-2026-11-29-xeon.txt). */
#define H_L2_BYTES (32u << 10)
#define H_OP2(name, OP, OP256)                                                                    \
  TGTFP16 static void name(uint16_t *o, const uint16_t *a, const uint16_t *b, size_t n) {        \
    size_t i = 0;                                                                                 \
    const bool pf = RED_PF_ON(n * 2);                                                             \
    if (n * 2 >= H_L2_BYTES)                                                                      \
      for (; i + 32 <= n; i += 32) {                                                              \
        if (pf)                                                                                   \
          v_pf(a + i, b + i);                                                                     \
        __m256h x0 = _mm256_castsi256_ph(_mm256_loadu_si256((const __m256i *)(a + i)));          \
        __m256h y0 = _mm256_castsi256_ph(_mm256_loadu_si256((const __m256i *)(b + i)));          \
        __m256h x1 = _mm256_castsi256_ph(_mm256_loadu_si256((const __m256i *)(a + i + 16)));     \
        __m256h y1 = _mm256_castsi256_ph(_mm256_loadu_si256((const __m256i *)(b + i + 16)));     \
        _mm256_storeu_si256((__m256i *)(o + i), _mm256_castph_si256(OP256(x0, y0)));            \
        _mm256_storeu_si256((__m256i *)(o + i + 16), _mm256_castph_si256(OP256(x1, y1)));       \
      }                                                                                           \
    for (; i + 32 <= n; i += 32) {                                                                \
      __m512h x = _mm512_castsi512_ph(_mm512_loadu_si512(a + i));                                \
      __m512h y = _mm512_castsi512_ph(_mm512_loadu_si512(b + i));                                \
      _mm512_storeu_si512(o + i, _mm512_castph_si512(OP(x, y)));                                  \
    }                                                                                             \
    if (i < n) { /* masked lanes are neither read nor written */                                  \
      __mmask32 k = (__mmask32)((1ull << (n - i)) - 1);                                          \
      __m512h x = _mm512_castsi512_ph(_mm512_maskz_loadu_epi16(k, a + i));                       \
      __m512h y = _mm512_castsi512_ph(_mm512_maskz_loadu_epi16(k, b + i));                       \
      _mm512_mask_storeu_epi16(o + i, k, _mm512_castph_si512(OP(x, y)));                         \
    }                                                                                             \
  }
H_OP2(h_f16_sum2, _mm512_add_ph, _mm256_add_ph)
H_OP2(h_f16_prod2, _mm512_mul_ph, _mm256_mul_ph)

/* The last m < 16 elements of a half-type reduction (or a whole short one) in one masked step:
 * the scalar tail converted each element through dt__f16_to_f32 / dt__f32_to_f16 and took 24-35
 * ns for 2-4 elements, 7-13 ns this way, as f32's kernel (single-thread loop over
 * dt__reduce_many, EPYC guest). Lanes past m are neither read (masked loads do not fault) nor
 * written; the conversions and roundings are z_ld_f16/z_st_f16 and z_st_bf16's, so the bits are
 * the scalar path's. */
TGT512 static void z_tail_half(uint16_t *o, const uint16_t *a, const uint16_t *b, size_t m, dt_dtype t, dt_op op) {
  __mmask16 k = (__mmask16)((1u << m) - 1);
  __m256i wa = _mm256_maskz_loadu_epi16(k, a), wb = _mm256_maskz_loadu_epi16(k, b);
  __m512 x, y;
  if (t == DT_F16) {
    x = _mm512_cvtph_ps(wa);
    y = _mm512_cvtph_ps(wb);
  } else {
    x = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(wa), 16));
    y = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(wb), 16));
  }
  __m512 r = op == DT_PROD ? z_prod(x, y) : op == DT_MIN ? z_min(x, y) : op == DT_MAX ? z_max(x, y) : z_sum(x, y);
  if (t == DT_F16) {
    _mm256_mask_storeu_epi16(o, k, _mm512_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
  } else {
    __m512i bits = _mm512_castps_si512(r);
    __m512i hi = _mm512_srli_epi32(bits, 16);
    __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i rr = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), lsb), 16);
    __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    rr = _mm512_mask_mov_epi32(rr, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
    _mm512_mask_cvtepi32_storeu_epi16(o, k, rr);
  }
}

TGT static void v_div_f32(float *p, size_t n, float d) {
  size_t i = 0;
  __m256 vd = _mm256_set1_ps(d);
  for (; i + 8 <= n; i += 8)
    st_ps(p + i, _mm256_div_ps(ld_ps(p + i), vd));
  for (; i < n; i++)
    p[i] = p[i] / d;
}
#endif /* RED_X86 */

/* ---------- dispatch ---------- */

/* 0 unknown, 1 scalar, 2 avx2, 3 + avx512 half kernels, 4 + avx512 bf16, 5 + avx512 fp16 */
static atomic_int simd_state;
static atomic_int force_scalar; /* 1 scalar, 2 no avx512, 3 no avx512 bf16 or fp16 and f16 on
                                  * zmm, 4 dt__copy's moves on any CPU, 5 f16 in ymm halves on any
                                  * AVX-512 CPU (tests) */

static bool use_avx2(void) {
#ifdef RED_X86
  if (atomic_load_explicit(&force_scalar, memory_order_relaxed) == 1)
    return false;
  int s = atomic_load_explicit(&simd_state, memory_order_relaxed);
  if (s == 0) {
    __builtin_cpu_init();
    /* F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c". */
    unsigned a = 0, b = 0, c = 0, d = 0;
    bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    s = (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c) ? 2 : 1;
    if (s == 2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && !dt__env_str("DTRAIN_NO_AVX512"))
      s = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512dq") ? 4 : 3;
    /* AVX512-FP16 (on CPUs that also have BF16): CPUID leaf 7 EDX bit 23, which GCC 12's
     * __builtin_cpu_supports does not report */
    if (s == 4 && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 23)))
      s = 5;
    if (dt__env_str("DTRAIN_NO_SIMD"))
      s = 1;
    atomic_store_explicit(&simd_state, s, memory_order_relaxed);
  }
  return s >= 2;
#else
  return false;
#endif
}

/* AVX-512 for the half-type kernels (implies use_avx2). */
static bool use_avx512(void) {
#ifdef RED_X86
  return use_avx2() && atomic_load_explicit(&simd_state, memory_order_relaxed) >= 3 &&
         atomic_load_explicit(&force_scalar, memory_order_relaxed) != 2;
#else
  return false;
#endif
}

/* AVX-512 BF16 for rounding to bf16 (implies use_avx512). */
static bool use_avx512bf16(void) {
#ifdef RED_X86
  return use_avx512() && atomic_load_explicit(&simd_state, memory_order_relaxed) >= 4 &&
         atomic_load_explicit(&force_scalar, memory_order_relaxed) != 3;
#else
  return false;
#endif
}

/* AVX512-FP16 for two-operand f16 sums and products (implies use_avx512bf16). */
static bool use_avx512fp16(void) {
#ifdef RED_X86
  return use_avx512bf16() && atomic_load_explicit(&simd_state, memory_order_relaxed) == 5;
#else
  return false;
#endif
}

typedef size_t (*mix_fn)(void *, dt_dtype, const void *, dt_dtype, const void *, dt_dtype, size_t, int);

/* The widest fused mixed-type kernel for op, NULL when only the scalar one applies. */
static mix_fn mix_kernel(dt_op op) {
#ifdef RED_X86
  if (use_avx512bf16())
    return op == DT_PROD ? b_mix_prod : op == DT_MIN ? b_mix_min : op == DT_MAX ? b_mix_max : b_mix_sum;
  if (use_avx512())
    return op == DT_PROD ? z_mix_prod : op == DT_MIN ? z_mix_min : op == DT_MAX ? z_mix_max : z_mix_sum;
  if (use_avx2())
    return op == DT_PROD ? v_mix_prod : op == DT_MIN ? v_mix_min : op == DT_MAX ? v_mix_max : v_mix_sum;
#endif
  (void)op;
  return NULL;
}

void dt__reduce_force_scalar(int on) { atomic_store(&force_scalar, on >= 1 && on <= 5 ? on : 0); }

const char *dt__reduce_isa(void) {
  return use_avx512fp16()   ? "avx2+avx512+bf16+fp16"
         : use_avx512bf16() ? "avx2+avx512+bf16"
         : use_avx512()     ? "avx2+avx512"
         : use_avx2()       ? "avx2"
                            : "scalar";
}

static red_fn pick(dt_dtype t, dt_op op) {
  int o = op == DT_AVG ? 0 : (int)op; /* avg sums; finish divides */
#ifdef RED_X86
  if (t == DT_F32 && use_avx512())
    return z_f32_tab[o];
  if (use_avx2())
    return avx2_tab[t][o];
#endif
  return scalar_tab[t][o];
}

void dt__reduce2(void *out, const void *a, const void *b, size_t count, dt_dtype t, dt_op op) {
  if (count == 0 || (unsigned)t >= DT_DTYPE_COUNT || (unsigned)op >= DT_OP_COUNT)
    return;
#ifdef RED_X86
  if (t == DT_F16 && (op == DT_SUM || op == DT_AVG || op == DT_PROD) && use_avx512fp16()) {
    (op == DT_PROD ? h_f16_prod2 : h_f16_sum2)(out, a, b, count); /* avg sums: finish divides */
    return;
  }
#endif
  if ((t == DT_F16 || t == DT_BF16) && use_avx512()) {
    /* the fused half kernel is this operation (avg sums here too: finish divides) */
    size_t done = count >= 16 ? mix_kernel(op)(out, t, a, t, b, t, count, 1) : 0;
#ifdef RED_X86
    if (count - done < 16) {
      if (done < count)
        z_tail_half((uint16_t *)out + done, (const uint16_t *)a + done, (const uint16_t *)b + done, count - done, t,
                    op);
      return;
    }
#endif
    if (done < count)
      pick(t, op)((uint16_t *)out + done, (const uint16_t *)a + done, (const uint16_t *)b + done, count - done);
    return;
  }
  pick(t, op)(out, a, b, count);
}

void dt__reduce(void *dst, const void *src, size_t count, dt_dtype t, dt_op op) {
  dt__reduce2(dst, dst, src, count, t, op);
}

void dt__to_f32(float *dst, const void *src, size_t n, dt_dtype t) {
  if (t == DT_F32) {
    if ((const void *)dst != src)
      memmove(dst, src, n * 4);
    return;
  }
#ifdef RED_X86
  if (use_avx2()) {
    v_to_f32(dst, src, n, t);
    return;
  }
#endif
  s_to_f32(dst, src, n, t);
}

void dt__from_f32(void *dst, const float *src, size_t n, dt_dtype t) {
  if (t == DT_F32) {
    if (dst != (const void *)src)
      memmove(dst, src, n * 4);
    return;
  }
#ifdef RED_X86
  if (use_avx2()) {
    v_from_f32(dst, src, n, t);
    return;
  }
#endif
  s_from_f32(dst, src, n, t);
}

static void div_f32(float *p, size_t n, int d) {
#ifdef RED_X86
  if (use_avx2()) {
    v_div_f32(p, n, (float)d);
    return;
  }
#endif
  for (size_t i = 0; i < n; i++)
    p[i] = p[i] / (float)d;
}

/* Block of f32 scratch on the stack: 2 KiB per operand keeps both in L1. */
#define MIX_BLOCK 512

void dt__reduce_mix(void *out, dt_dtype ot, const void *a, dt_dtype at, const void *b, dt_dtype bt, size_t n,
                    dt_op op, int div) {
  if (div <= 1 && at == ot && bt == ot && (ot == DT_F16 || ot == DT_BF16)) {
    /* two inputs of the output's half type rounded once: dt__reduce2's kernels (AVX512-FP16's
     * for f16: the 2-rank recursive doubling's whole reduction; 16 KiB f16 allreduce 0.92x f32's
     * bytes/s through the widening kernel, bench/results/dtypes-2026-11-29-xeon.txt) */
    dt__reduce2(out, a, b, n, ot, op);
    return;
  }
  float fa[MIX_BLOCK], fb[MIX_BLOCK], fo[MIX_BLOCK];
  red_fn k = pick(DT_F32, op);
  mix_fn fused = n >= 8 ? mix_kernel(op) : NULL;
  if (fused) {
    size_t done = fused(out, ot, a, at, b, bt, n, div);
    if (done == n)
      return;
    out = (char *)out + done * dt_dtype_size(ot);
    a = (const char *)a + done * dt_dtype_size(at);
    b = (const char *)b + done * dt_dtype_size(bt);
    n -= done;
  }
  for (size_t off = 0; off < n; off += MIX_BLOCK) {
    size_t m = DT_MIN((size_t)MIX_BLOCK, n - off);
    const float *pa, *pb;
    if (at == DT_F32) {
      pa = (const float *)a + off;
    } else {
      dt__to_f32(fa, (const uint16_t *)a + off, m, at);
      pa = fa;
    }
    if (bt == DT_F32) {
      pb = (const float *)b + off;
    } else {
      dt__to_f32(fb, (const uint16_t *)b + off, m, bt);
      pb = fb;
    }
    float *po = ot == DT_F32 ? (float *)out + off : fo;
    k(po, pa, pb, m);
    if (div > 1)
      div_f32(po, m, div);
    if (ot != DT_F32)
      dt__from_f32((uint16_t *)out + off, po, m, ot);
  }
}

/* Elements per block of dt__reduce_many: the f32 partials (4 KiB) or the output block stay in
 * L1 while each source streams through once. */
#define MANY_BLOCK 1024

bool dt__reduce_cached(bool cached) {
  bool was = red_cached;
  red_cached = cached;
  return was;
}

void dt__reduce_many(void *out, const void *const *src, int k, size_t n, dt_dtype t, dt_op op, int div) {
  size_t es = dt_dtype_size(t);
  if (n == 0 || k < 1 || es == 0)
    return;
  if (k == 1) {
    if (out != src[0])
      memmove(out, src[0], n * es);
    dt__reduce_finish(out, n, t, op, div);
    return;
  }
  if (k == 2) { /* one pass over the whole length (prefetching when it is long), no partials */
    /* dt__reduce2 of half types is the same single rounding as dt__reduce_mix without the
     * division, and skips its f32 staging blocks: 2, 4 and 8 f16 took 45, 57 and 41 ns through
     * them, 24, 35 and 14 ns without (f32: 12-14 ns; a single-thread loop over this function) */
    if (dt__coll_wide(t, op) && div > 1) {
      dt__reduce_mix(out, t, src[0], t, src[1], t, n, op, div);
    } else {
      dt__reduce2(out, src[0], src[1], n, t, op);
      dt__reduce_finish(out, n, t, op, div);
    }
    return;
  }
#ifdef RED_X86
  /* f32, f16, bf16 sum/prod/avg of 3 or more operands with AVX-512: in registers, one pass */
  if ((t == DT_F32 || dt__coll_wide(t, op)) && (op == DT_SUM || op == DT_PROD || op == DT_AVG) && k > 2 && k <= 64 &&
      use_avx512()) {
    bool bf = use_avx512bf16();
    size_t done = op == DT_PROD ? (bf ? b_many_prod : z_many_prod)(out, src, k, n, t, div)
                                : (bf ? b_many_sum : z_many_sum)(out, src, k, n, t, div);
    if (done == n)
      return;
    if (done) { /* the tail (under 32 elements; the kernel does none of it again) */
      const void *rest[64];
      for (int j = 0; j < k; j++)
        rest[j] = (const char *)src[j] + done * es;
      dt__reduce_many((char *)out + done * es, rest, k, n - done, t, op, div);
      return;
    }
  }
#endif
  float acc[MANY_BLOCK];
  for (size_t off = 0; off < n; off += MANY_BLOCK) {
    size_t m = DT_MIN((size_t)MANY_BLOCK, n - off), b = off * es;
    if (dt__coll_wide(t, op)) {
      dt__reduce_mix(acc, DT_F32, (const char *)src[0] + b, t, (const char *)src[1] + b, t, m, op, 1);
      for (int j = 2; j < k - 1; j++)
        dt__reduce_mix(acc, DT_F32, acc, DT_F32, (const char *)src[j] + b, t, m, op, 1);
      dt__reduce_mix((char *)out + b, t, acc, DT_F32, (const char *)src[k - 1] + b, t, m, op, div);
    } else {
      dt__reduce2((char *)out + b, (const char *)src[0] + b, (const char *)src[1] + b, m, t, op);
      for (int j = 2; j < k; j++)
        dt__reduce((char *)out + b, (const char *)src[j] + b, m, t, op);
      dt__reduce_finish((char *)out + b, m, t, op, div);
    }
  }
}

void dt__reduce_finish(void *buf, size_t count, dt_dtype t, dt_op op, int n) {
  if (op != DT_AVG || n <= 1 || count == 0)
    return;
  switch (t) {
  case DT_F32:
    div_f32(buf, count, n);
    break;
  case DT_F64: {
    double *p = buf;
    for (size_t i = 0; i < count; i++)
      p[i] = p[i] / (double)n;
    break;
  }
  case DT_F16:
  case DT_BF16: {
    float f[MIX_BLOCK];
    for (size_t off = 0; off < count; off += MIX_BLOCK) {
      size_t m = DT_MIN((size_t)MIX_BLOCK, count - off);
      dt__to_f32(f, (uint16_t *)buf + off, m, t);
      div_f32(f, m, n);
      dt__from_f32((uint16_t *)buf + off, f, m, t);
    }
    break;
  }
  case DT_I32: {
    int32_t *p = buf;
    for (size_t i = 0; i < count; i++)
      p[i] = p[i] / n;
    break;
  }
  case DT_I64: {
    int64_t *p = buf;
    for (size_t i = 0; i < count; i++)
      p[i] = p[i] / n;
    break;
  }
  case DT_U8: {
    uint8_t *p = buf;
    for (size_t i = 0; i < count; i++)
      p[i] = (uint8_t)(p[i] / n);
    break;
  }
  default:
    break;
  }
}

/* glibc's memcpy moves anything from about 2 KiB with `rep movsb`. On the Zen 3 EPYC guest that
 * made the copies of the shared-memory staged paths slow whenever the caller had just rewritten
 * its input (as a training step does before the allreduce of its gradients): the 2-rank staged
 * allreduce took 44-54 us at 64 KiB, 705-930 at 1 MiB and 8.3-11.2 ms at 16 MiB, against 9-15 us,
 * 153-191 us and 3.5-4.0 ms with 16-byte moves (4 alternated rounds; BENCHMARKS-LOG, "Fifth EPYC
 * session"), and a 4 KiB flat allreduce went from 0.71 to 0.51 us (`DTRAIN_ALGO=flat dtrain bench
 * allreduce -n 2 --sizes 2K:64K`, with and without GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold
 * raised, 2026-11-27). So where that `rep movsb` is the slow kind (amd_kind below: not
 * Zen 4) the collectives copy from 2 KiB with 32-byte moves where the CPU has AVX2 (1.1-3x faster
 * again than 16-byte ones there), with 16-byte ones elsewhere.
 * Everywhere else, and below 2 KiB, glibc's memcpy: on the Intel Xeon guest with AVX512-FP16 the
 * 32-byte moves ran every copy into a slot or staging buffer that the other core had just read
 * about twice as slowly (presumably because a plain store fetches the line from the other core
 * first and a string copy's whole-line stores need not; not measured):
 * 2-rank shm broadcast 2.2-3.3 us at 4 KiB against 1.0-1.3, reduce_scatter 3.3 at 16 KiB and
 * 12.1-12.9 at 64 KiB against 2.0-2.2 and 6.8-7.5, allgather 2.6-2.8 at 8 KiB gathered against
 * 1.2-1.3, the 4 KiB flat allreduce 2.9-3.0 against 1.3-2.1, level where the single copies take
 * over (six alternated runs each, reused and fresh inputs; bench/results/copy-2026-11-29-xeon.txt).
 * glibc's memcpy was what these paths used on the Intel hosts before 2026-11-28 (the flat slots'
 * thresholds were chosen with it). */
#ifdef RED_X86
/* 128 bytes per iteration, plain or (nt, d 32-byte aligned) streaming stores; returns bytes done. */
__attribute__((target("avx2"))) static inline size_t copy128_avx2(uint8_t *d, const uint8_t *s, size_t n, bool nt) {
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    __m256i x[4];
    for (int j = 0; j < 4; j++)
      x[j] = _mm256_loadu_si256((const __m256i *)(s + i + 32 * j));
    for (int j = 0; j < 4; j++)
      if (nt)
        _mm256_stream_si256((__m256i *)(d + i + 32 * j), x[j]);
      else
        _mm256_storeu_si256((__m256i *)(d + i + 32 * j), x[j]);
  }
  return i;
}
__attribute__((target("avx2"))) static void copy_avx2(uint8_t *d, const uint8_t *s, size_t n) {
  size_t i = copy128_avx2(d, s, n, false);
  for (; i + 32 <= n; i += 32)
    _mm256_storeu_si256((__m256i *)(d + i), _mm256_loadu_si256((const __m256i *)(s + i)));
  if (i < n)
    memcpy(d + i, s + i, n - i);
}
#endif

/* Whether glibc's memcpy (its `rep movsb` from about 2 KiB) is the slow kind on this AMD CPU
 * (amd_kind 3):
 * family 25 (0x19) other than Zen 4, and older families. On the Zen 3 EPYC guest (family 25
 * model 1) it ran the staged allreduce at about 1.2 GB/s whenever the caller had just rewritten
 * its input (BENCHMARKS-LOG, "Fifth EPYC session"). On an EPYC Zen 4 guest (family 25 model 17)
 * memcpy beat the moves instead, reused or freshly written: 2-rank allgather blocks of 8 KiB
 * 0.47-0.64 us against 1.18-1.80, of 1 MiB 51-62 against 59-72
 * (bench/results/copy-memcpy-2026-12-01-zen4.txt). Zen 4's models: 0x10-0x1f, 0x60-0x7f,
 * 0xa0-0xaf. Family 26 (Zen 5) ran every measurement of its sessions on memcpy. */
#ifdef RED_X86
/* 2 for an AMD CPU, 3 if its `rep movsb` is the slow kind, 4 for Zen 4, 5 for family 26 (Zen 5)
 * or later (cpu_kind's values) */
static int amd_kind(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d))
    return 2;
  unsigned fam = (a >> 8) & 0xf, model = (a >> 4) & 0xf;
  if (fam == 0xf) {
    fam += (a >> 20) & 0xff;
    model |= ((a >> 16) & 0xf) << 4;
  }
  bool zen4 = fam == 0x19 && ((model >= 0x10 && model <= 0x1f) || (model >= 0x60 && model <= 0x7f) ||
                              (model >= 0xa0 && model <= 0xaf));
  return zen4 ? 4 : fam <= 0x19 ? 3 : 5;
}
#endif

/* 0 unknown, 1 not AMD, 2 AMD, 3 AMD whose `rep movsb` is slow, 4 AMD Zen 4, 5 AMD Zen 5 or later
 * (amd_kind) */
static atomic_int cpu_kind;
static int cpu_kind_get(void) {
  int v = atomic_load_explicit(&cpu_kind, memory_order_relaxed);
#ifdef RED_X86
  if (v == 0) {
    __builtin_cpu_init();
    v = !__builtin_cpu_is("amd") ? 1 : amd_kind();
    atomic_store_explicit(&cpu_kind, v, memory_order_relaxed);
  }
#endif
  return v;
}
bool dt__cpu_amd(void) { return cpu_kind_get() >= 2; }
bool dt__cpu_zen4(void) { return cpu_kind_get() == 4; }
bool dt__cpu_zen5(void) { return cpu_kind_get() == 5; }
#ifdef RED_X86
/* force_scalar 5 takes the halves on any AVX-512 CPU, 3 never (tests) */
static bool f16_halves(void) {
  int f = atomic_load_explicit(&force_scalar, memory_order_relaxed);
  return f == 5 || (f != 3 && cpu_kind_get() == 4);
}
#endif

/* Whether dt__copy moves from 2 KiB itself: where memcpy is slow (above), and tests forcing it
 * (1 or 4). */
static bool copy_by_moves(void) {
  int f = atomic_load_explicit(&force_scalar, memory_order_relaxed);
  return f == 1 || f == 4 || cpu_kind_get() == 3;
}

void dt__copy(void *dst, const void *src, size_t n) {
  uint8_t *d = dst;
  const uint8_t *s = src;
  if (n < 2048 || !copy_by_moves()) {
    memcpy(d, s, n);
    return;
  }
#ifdef RED_X86
  if (use_avx2()) {
    copy_avx2(d, s, n);
    return;
  }
#endif
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    memcpy(d + i, s + i, 16);
  if (i < n)
    memcpy(d + i, s + i, n - i);
}

/* Non-temporal stores from the first 64-byte boundary of dst (glibc's memcpy around it): the
 * lines go to memory without being read for ownership first and without evicting the caller's
 * working set. */
#ifdef RED_X86
__attribute__((target("avx2"))) static size_t copy_nt_avx2(uint8_t *d, const uint8_t *s, size_t n) {
  return copy128_avx2(d, s, n, true);
}
static size_t copy_nt_sse2(uint8_t *d, const uint8_t *s, size_t n) {
  size_t i = 0;
  for (; i + 64 <= n; i += 64)
    for (size_t j = 0; j < 64; j += 16)
      _mm_stream_si128((__m128i *)(d + i + j), _mm_loadu_si128((const __m128i *)(s + i + j)));
  return i;
}
/* One whole line per store: 64 MiB allreduces (2 ranks, streaming) 11.1-11.2 ms against
 * 11.2-11.5 with the 32-byte stores, 32 MiB 4.4-4.8 against 5.0-5.2 (three alternated rounds,
 * bench/results/nt-out-2026-11-29-xeon.txt). */
__attribute__((target("avx512f"))) static size_t copy_nt_512(uint8_t *d, const uint8_t *s, size_t n) {
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    __m512i x0 = _mm512_loadu_si512((const void *)(s + i)), x1 = _mm512_loadu_si512((const void *)(s + i + 64));
    _mm512_stream_si512((void *)(d + i), x0);
    _mm512_stream_si512((void *)(d + i + 64), x1);
  }
  return i;
}
#endif

void dt__copy_nt(void *dst, const void *src, size_t n) {
  uint8_t *d = dst;
  const uint8_t *s = src;
#ifdef RED_X86
  size_t head = (64 - ((uintptr_t)d & 63)) & 63;
  if (n >= head + 128) { /* force_scalar 1 takes the SSE2 loop, 2 the AVX2 one */
    memcpy(d, s, head);
    size_t (*loop)(uint8_t *, const uint8_t *, size_t) = use_avx512() ? copy_nt_512
                                                         : use_avx2()   ? copy_nt_avx2
                                                                        : copy_nt_sse2;
    size_t done = head + loop(d + head, s + head, n - head);
    _mm_sfence(); /* the streamed lines are ordered before whatever the caller publishes next */
    memcpy(d + done, s + done, n - done);
    return;
  }
#endif
  memcpy(d, s, n);
}
