/* fuzz_ckpt.c - libFuzzer target for the checkpoint reader: header and table checksums, section
 * bounds and overlaps, padding, the meta key/value section. Checksums make random mutations
 * fail early, so the seed corpus holds valid files and the target also re-seals the input (fixes
 * the header, table and section CRCs) to reach the structural checks behind them. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/ckpt.h"
#include "dtrain/core.h"

static uint32_t rd32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static void wr32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

static void check(const uint8_t *data, size_t size) {
  dt_ckpt *c;
  if (dt_ckpt_parse(data, size, "fuzz.dtc", &c) != DT_OK)
    return;
  volatile uint8_t acc = 0;
  for (size_t i = 0; i < dt_ckpt_count(c); i++) {
    const dt_ckpt_section *s = dt_ckpt_section_at(c, i);
    const uint8_t *p = s->data;
    for (uint64_t k = 0; k < s->nbytes; k++)
      acc ^= p[k];
  }
  for (size_t i = 0; i < dt_ckpt_meta_count(c); i++)
    acc ^= (uint8_t)strlen(dt_ckpt_meta_at(c, i)->key);
  (void)acc;
  dt_ckpt_destroy(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  check(data, size);
  if (size < 64 || size > (1u << 20))
    return 0;
  uint8_t *b = malloc(size);
  if (!b)
    return 0;
  memcpy(b, data, size);
  uint32_t ns = rd32(b + 12);
  if (ns && ns <= 1024 && 64 + (uint64_t)ns * 96 <= size) {
    for (uint32_t i = 0; i < ns; i++) {
      uint8_t *e = b + 64 + (size_t)i * 96;
      uint64_t off = rd64(e + 64), len = rd64(e + 72);
      if (off <= size && len <= size - off)
        wr32(e + 80, dt_crc32c(0, b + off, (size_t)len));
    }
    wr32(b + 40, dt_crc32c(0, b + 64, (size_t)ns * 96));
  }
  wr32(b + 60, dt_crc32c(0, b, 60));
  check(b, size);
  free(b);
  return 0;
}
