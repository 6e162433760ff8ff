/* rng.c - xoshiro256** seeded through splitmix64: fast, and its state is 32 plain bytes. */
#include <math.h>

#include "core/core.h"

static uint64_t splitmix64(uint64_t *x) { return dt__mix64(*x += DT__GOLDEN64); }

void dt_rng_seed(dt_rng *r, uint64_t seed) {
  uint64_t x = seed;
  for (int i = 0; i < 4; i++)
    r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t dt_rng_next(dt_rng *r) {
  uint64_t *s = r->s;
  uint64_t result = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

double dt_rng_uniform(dt_rng *r) { return (double)(dt_rng_next(r) >> 11) * 0x1.0p-53; }

double dt_rng_normal(dt_rng *r) {
  double u1 = dt_rng_uniform(r), u2 = dt_rng_uniform(r);
  if (u1 < 1e-300)
    u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(2.0 * 3.14159265358979323846 * u2);
}

uint64_t dt_rng_below(dt_rng *r, uint64_t n) {
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t v;
  do
    v = dt_rng_next(r);
  while (v >= limit);
  return v % n;
}
