/* tests/coll/sweep.h - inputs and the serial reference shared by the collective tests.
 *
 * Rank r's element i of a call is a pure function of (r, i, dtype, op, call salt), so every rank
 * can compute every other rank's input and the expected result without communicating.
 *
 * Tolerances (u = unit roundoff of the type: f32 2^-24, f64 2^-53, f16 2^-11, bf16 2^-8;
 * S = sum of |inputs| of the element; n = ranks):
 *   - integers, min, max, and every data-movement collective: exact (bit-equal).
 *   - f32/f64 sum: any summation order of n terms errs by at most (n-1) u S (Higham,
 *     "Accuracy and Stability of Numerical Algorithms", 4.2); we allow n u S.
 *     (f64: twice that, since the double reference rounds as much). avg adds one rounded division: S u + 2 u |ref|. prod: relative (n-1) u; we allow n u |ref|.
 *   - f16/bf16 accumulate in f32 and round once: the f32 result errs by at most n u32 S as
 *     above, then one rounding to the half type adds u_half |result|: we allow
 *     u_half |ref| + 2 n u32 S (+ half the smallest f16 subnormal). A ring that rounded to half
 *     precision at each of its n-1 steps would err by up to (n-1) u_half S and fail this bound
 *     for n >= 3 on random data, so the test checks "round once", not just "roughly right". */
#ifndef DT_TEST_SWEEP_H
#define DT_TEST_SWEEP_H

#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

#include "comm/coll/coll.h"

static inline uint64_t sw_hash(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Uniform in [0,1) from (salt, rank, index). */
static inline double sw_unit(uint64_t salt, int r, size_t i) {
  return (double)(sw_hash(salt * 0x100000001b3ull ^ ((uint64_t)r << 40) ^ (uint64_t)i) >> 11) * 0x1p-53;
}

static inline int sw_is_float(dt_dtype t) { return t == DT_F32 || t == DT_F64 || t == DT_F16 || t == DT_BF16; }

/* The input as a double (already representable in t). */
static inline double sw_value(uint64_t salt, int r, size_t i, dt_dtype t, dt_op op) {
  double u = sw_unit(salt, r, i);
  double v;
  if (sw_is_float(t)) {
    if (op == DT_PROD)
      v = (0.5 + u) * (sw_unit(salt + 1, r, i) < 0.5 ? -1 : 1);
    else
      v = 2 * u - 1;
    switch (t) {
    case DT_F32: v = (float)v; break;
    case DT_F16: v = dt__f16_to_f32(dt__f32_to_f16((float)v)); break;
    case DT_BF16: v = dt__bf16_to_f32(dt__f32_to_bf16((float)v)); break;
    default: break;
    }
    return v;
  }
  int64_t k = (int64_t)(u * 2001) - 1000; /* [-1000, 1000] */
  if (op == DT_PROD)
    k = (int64_t)(u * 7) - 3; /* [-3, 3] */
  if (t == DT_U8)
    k = (int64_t)(u * 256);
  return (double)k;
}

static inline void sw_put(void *buf, size_t i, dt_dtype t, double v) {
  switch (t) {
  case DT_F32: ((float *)buf)[i] = (float)v; break;
  case DT_F64: ((double *)buf)[i] = v; break;
  case DT_F16: ((uint16_t *)buf)[i] = dt__f32_to_f16((float)v); break;
  case DT_BF16: ((uint16_t *)buf)[i] = dt__f32_to_bf16((float)v); break;
  case DT_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
  case DT_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
  default: ((uint8_t *)buf)[i] = (uint8_t)(int)v; break;
  }
}

static inline double sw_get(const void *buf, size_t i, dt_dtype t) {
  switch (t) {
  case DT_F32: return ((const float *)buf)[i];
  case DT_F64: return ((const double *)buf)[i];
  case DT_F16: return dt__f16_to_f32(((const uint16_t *)buf)[i]);
  case DT_BF16: return dt__bf16_to_f32(((const uint16_t *)buf)[i]);
  case DT_I32: return ((const int32_t *)buf)[i];
  case DT_I64: return (double)((const int64_t *)buf)[i];
  default: return ((const uint8_t *)buf)[i];
  }
}

/* Fills elements [0, count) of buf with rank r's input for global indices base + i. */
static inline void sw_fill(void *buf, size_t count, size_t base, uint64_t salt, int r, dt_dtype t, dt_op op) {
  for (size_t i = 0; i < count; i++)
    sw_put(buf, i, t, sw_value(salt, r, base + i, t, op));
}

/* The reduction over n ranks of global index gi (*want) and the error allowed around it (*tol, 0
 * where the result must be exact), by the bounds above. */
static inline void sw_expect(uint64_t salt, int n, size_t gi, dt_dtype t, dt_op op, double *want, double *tol) {
  *tol = 0;
  if (!sw_is_float(t)) {
    /* modular arithmetic in 64 bits, truncated to the type's width: exact */
    uint64_t acc = 0;
    int64_t mn = INT64_MAX, mx = INT64_MIN;
    for (int r = 0; r < n; r++) {
      int64_t v = (int64_t)sw_value(salt, r, gi, t, op);
      if (r == 0)
        acc = (uint64_t)v;
      else if (op == DT_PROD)
        acc *= (uint64_t)v;
      else
        acc += (uint64_t)v;
      mn = v < mn ? v : mn;
      mx = v > mx ? v : mx;
    }
    int64_t w;
    if (op == DT_MIN)
      w = mn;
    else if (op == DT_MAX)
      w = mx;
    else {
      if (t == DT_I32)
        w = (int32_t)(uint32_t)acc;
      else if (t == DT_U8)
        w = (uint8_t)acc;
      else
        w = (int64_t)acc;
      if (op == DT_AVG)
        w /= n;
    }
    *want = (double)w;
    return;
  }
  double sum = 0, prod = 1, s_abs = 0, mn = INFINITY, mx = -INFINITY;
  for (int r = 0; r < n; r++) {
    double v = sw_value(salt, r, gi, t, op);
    sum += v;
    prod *= v;
    s_abs += fabs(v);
    mn = fmin(mn, v);
    mx = fmax(mx, v);
  }
  if (op == DT_MIN || op == DT_MAX) {
    *want = op == DT_MIN ? mn : mx;
    return;
  }
  double ref = op == DT_PROD ? prod : op == DT_AVG ? sum / n : sum;
  double u = t == DT_F64 ? 0x1p-53 : 0x1p-24, uh = t == DT_F16 ? 0x1p-11 : t == DT_BF16 ? 0x1p-8 : 0;
  double err_acc; /* bound of the accumulation in f32/f64 */
  if (op == DT_PROD)
    err_acc = n * u * fabs(ref);
  else if (op == DT_AVG)
    err_acc = u * s_abs + 2 * u * fabs(ref);
  else
    err_acc = n * u * s_abs;
  double bound = uh ? uh * fabs(ref) + 2 * err_acc + 0x1p-25 : err_acc;
  if (t == DT_F64)
    bound *= 2; /* the double reference itself rounds as much as the result */
  *want = ref;
  *tol = bound * 1.0000001;
}

/* Checks element j of got_buf (raw, type t) against the reduction over n ranks of global index
 * gi. Returns 1 if it is within the bound above. */
static inline int sw_check_reduced(const void *got_buf, size_t j, uint64_t salt, int n, size_t gi, dt_dtype t,
                                   dt_op op) {
  double want, tol;
  sw_expect(salt, n, gi, t, op, &want, &tol);
  if (!sw_is_float(t))
    return (int64_t)sw_get(got_buf, j, t) == (int64_t)want;
  double got = sw_get(got_buf, j, t);
  if (op == DT_MIN || op == DT_MAX)
    return got == want;
  return fabs(got - want) <= tol;
}

/* Two ranks, f16/bf16: one operation, so every algorithm must return exactly the single rounding
 * of lower-rank op higher-rank computed in f32 (avg: divided by 2 in f32 first); min/max as
 * reduce.c (equal operands give the second). Returns 1 if element j of got_buf has those bits. A
 * path that rounded the sum to the half type and then again after avg's division, or that added
 * in the half type, differs in some elements of a 4099-element call. */
static inline int sw_check_half2(const void *got_buf, size_t j, uint64_t salt, size_t gi, dt_dtype t, dt_op op) {
  float x = (float)sw_value(salt, 0, gi, t, op), y = (float)sw_value(salt, 1, gi, t, op), f;
  switch (op) {
  case DT_PROD: f = x * y; break;
  case DT_MIN: f = x != x ? x : x < y ? x : y; break;
  case DT_MAX: f = x != x ? x : x > y ? x : y; break;
  case DT_AVG: f = (x + y) / 2.0f; break;
  default: f = x + y; break;
  }
  uint16_t want = t == DT_F16 ? dt__f32_to_f16(f) : dt__f32_to_bf16(f);
  return ((const uint16_t *)got_buf)[j] == want;
}

/* Joins the job from the environment with a 30 s deadline per call; NULL (after saying why on
 * stderr) if it cannot. */
static inline dt_comm *sw_join(int rank) {
  dt_comm *c = NULL;
  if (dt_comm_create(NULL, &c)) {
    fprintf(stderr, "rank %d: create: %s\n", rank, dt_last_error());
    return NULL;
  }
  dt_comm_set_timeout(c, 30000);
  return c;
}

#endif
