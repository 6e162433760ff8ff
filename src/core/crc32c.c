/* crc32c.c - CRC32C (Castagnoli polynomial 0x82F63B78, reflected), used for checkpoint and
 * message checksums. SSE4.2's crc32 instruction when present, a table otherwise. */
#include <string.h>

#include "core/core.h"

static uint32_t crc_table[256];

static void crc_init_table(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++)
      c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    crc_table[i] = c;
  }
}

static uint32_t crc_soft(uint32_t crc, const unsigned char *p, size_t n) {
  static int ready;
  if (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE)) {
    crc_init_table(); /* idempotent: racing threads write the same values */
    __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
  }
  while (n--)
    crc = crc_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const unsigned char *p, size_t n) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = (uint32_t)c;
  while (n--)
    c32 = __builtin_ia32_crc32qi(c32, *p++);
  return c32;
}
#endif

uint32_t dt_crc32c(uint32_t crc, const void *buf, size_t n) {
  crc = ~crc;
#if defined(__x86_64__)
  if (__builtin_cpu_supports("sse4.2"))
    return ~crc_hw(crc, buf, n);
#endif
  return ~crc_soft(crc, buf, n);
}
