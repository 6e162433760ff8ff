/* sha256.c - SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104) for the job-secret handshake.
 * Portable C, no hardware acceleration: the handshake hashes a few hundred bytes per
 * connection, so speed does not matter here. Not meant for bulk data checksums (use CRC32C). */
#include <string.h>

#include "core/sha256.h"

/* FIPS 180-4 section 4.2.2: first 32 bits of the fractional parts of the cube roots of the
 * first 64 primes. */
static const uint32_t sha_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline uint32_t sha_rotr(uint32_t x, unsigned n) { return (x >> n) | (x << (32 - n)); }

static void sha_block(uint32_t h[8], const uint8_t *p) {
  uint32_t w[64];
  for (int t = 0; t < 16; t++)
    w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 | (uint32_t)p[4 * t + 2] << 8 | p[4 * t + 3];
  for (int t = 16; t < 64; t++) {
    uint32_t s0 = sha_rotr(w[t - 15], 7) ^ sha_rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    uint32_t s1 = sha_rotr(w[t - 2], 17) ^ sha_rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
  for (int t = 0; t < 64; t++) {
    uint32_t S1 = sha_rotr(e, 6) ^ sha_rotr(e, 11) ^ sha_rotr(e, 25);
    uint32_t ch = (e & f) ^ (~e & g);
    uint32_t t1 = hh + S1 + ch + sha_k[t] + w[t];
    uint32_t S0 = sha_rotr(a, 2) ^ sha_rotr(a, 13) ^ sha_rotr(a, 22);
    uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    uint32_t t2 = S0 + maj;
    hh = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h[0] += a;
  h[1] += b;
  h[2] += c;
  h[3] += d;
  h[4] += e;
  h[5] += f;
  h[6] += g;
  h[7] += hh;
}

void dt__sha256_init(dt__sha256 *s) {
  /* FIPS 180-4 section 5.3.3: square roots of the first 8 primes. */
  static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(s->h, iv, sizeof iv);
  s->nbytes = 0;
  s->nbuf = 0;
}

void dt__sha256_update(dt__sha256 *s, const void *data, size_t n) {
  const uint8_t *p = data;
  s->nbytes += n;
  if (s->nbuf) {
    size_t take = (n < 64 - s->nbuf ? n : 64 - s->nbuf);
    memcpy(s->buf + s->nbuf, p, take);
    s->nbuf += take;
    p += take;
    n -= take;
    if (s->nbuf < 64)
      return;
    sha_block(s->h, s->buf);
    s->nbuf = 0;
  }
  for (; n >= 64; p += 64, n -= 64)
    sha_block(s->h, p);
  if (n) {
    memcpy(s->buf, p, n);
    s->nbuf = n;
  }
}

void dt__sha256_final(dt__sha256 *s, uint8_t out[32]) {
  uint64_t bits = s->nbytes * 8;
  uint8_t pad[72] = {0x80};
  /* Pad to 56 mod 64, then the 64-bit big-endian bit length. */
  size_t padn = (s->nbuf < 56) ? 56 - s->nbuf : 120 - s->nbuf;
  for (int i = 0; i < 8; i++)
    pad[padn + (size_t)i] = (uint8_t)(bits >> (56 - 8 * i));
  uint64_t keep = s->nbytes;
  dt__sha256_update(s, pad, padn + 8);
  s->nbytes = keep;
  for (int i = 0; i < 8; i++) {
    out[4 * i] = (uint8_t)(s->h[i] >> 24);
    out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
    out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
    out[4 * i + 3] = (uint8_t)s->h[i];
  }
  memset(s->buf, 0, sizeof s->buf);
}

void dt__hmac_sha256(const uint8_t *key, size_t keylen, const void *msg, size_t n, uint8_t out[32]) {
  uint8_t k[64] = {0}, ipad[64], opad[64], inner[32];
  dt__sha256 s;
  if (keylen > 64) {
    dt__sha256_init(&s);
    dt__sha256_update(&s, key, keylen);
    dt__sha256_final(&s, k);
  } else if (keylen) {
    memcpy(k, key, keylen);
  }
  for (int i = 0; i < 64; i++) {
    ipad[i] = k[i] ^ 0x36;
    opad[i] = k[i] ^ 0x5c;
  }
  dt__sha256_init(&s);
  dt__sha256_update(&s, ipad, 64);
  dt__sha256_update(&s, msg, n);
  dt__sha256_final(&s, inner);
  dt__sha256_init(&s);
  dt__sha256_update(&s, opad, 64);
  dt__sha256_update(&s, inner, 32);
  dt__sha256_final(&s, out);
  /* The padded key is secret material: do not leave it on the stack. */
  explicit_bzero(k, sizeof k);
  explicit_bzero(ipad, sizeof ipad);
  explicit_bzero(opad, sizeof opad);
  explicit_bzero(inner, sizeof inner);
}

int dt__ct_equal(const void *a, const void *b, size_t n) {
  const volatile uint8_t *x = a, *y = b;
  uint8_t d = 0;
  for (size_t i = 0; i < n; i++)
    d |= (uint8_t)(x[i] ^ y[i]);
  return d == 0;
}
