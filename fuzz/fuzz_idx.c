/* fuzz_idx.c - libFuzzer target for the IDX reader (raw and gzip'd input).
 * The decoded-size limit is lowered to 64 MiB so a legal but large claim stays under libFuzzer's
 * RSS limit; any crash, leak, sanitizer report or out-of-bounds read is a bug. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "dtrain/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  dt_idx idx;
  if (dt_idx_parse(data, size, "fuzz.idx", 64u << 20, &idx) == DT_OK) {
    /* Touch every decoded byte so ASan sees any overrun of the claimed size. */
    volatile uint8_t acc = 0;
    const uint8_t *p = idx.data;
    for (uint64_t i = 0; i < idx.count * idx.elem_size; i++)
      acc ^= p[i];
    (void)acc;
    dt_idx_free(&idx);
  } else if (idx.data) {
    __builtin_trap(); /* failure must leave the struct empty */
  }
  return 0;
}
