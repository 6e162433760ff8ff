/* core/sha256.h - SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the job-secret
 * handshake. Not constant-time beyond what the handshake needs; use dt__ct_equal to compare. */
#ifndef DT_CORE_SHA256_H
#define DT_CORE_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct dt__sha256 {
  uint32_t h[8];
  uint64_t nbytes;
  uint8_t buf[64];
  size_t nbuf;
} dt__sha256;

void dt__sha256_init(dt__sha256 *s);
void dt__sha256_update(dt__sha256 *s, const void *data, size_t n);
void dt__sha256_final(dt__sha256 *s, uint8_t out[32]);
void dt__hmac_sha256(const uint8_t *key, size_t keylen, const void *msg, size_t n, uint8_t out[32]);
/* Constant-time comparison: 1 if equal. */
int dt__ct_equal(const void *a, const void *b, size_t n);

#endif
