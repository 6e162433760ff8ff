/* fuzz_safetensors.c - libFuzzer target for the safetensors reader: header length, the JSON
 * parser, dtype/shape/offset validation. A file that parses must have every tensor's bytes
 * inside the buffer, so the target reads them all; it also re-writes nothing (the writer is
 * covered by the unit tests). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "dtrain/ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  dt_safetensors *f;
  if (dt_safetensors_parse(data, size, "fuzz.safetensors", &f) != DT_OK)
    return 0;
  volatile uint8_t acc = 0;
  for (size_t i = 0; i < dt_safetensors_count(f); i++) {
    const dt_tensor_view *t = dt_safetensors_tensor(f, i);
    const uint8_t *p = t->data;
    for (uint64_t k = 0; k < t->nbytes; k++)
      acc ^= p[k];
    acc ^= (uint8_t)strlen(t->name);
    if (dt_safetensors_find(f, t->name) == NULL)
      __builtin_trap();
  }
  for (size_t i = 0; i < dt_safetensors_meta_count(f); i++)
    acc ^= (uint8_t)strlen(dt_safetensors_meta(f, i)->value);
  (void)acc;
  dt_safetensors_destroy(f);
  return 0;
}
