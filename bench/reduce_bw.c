/* reduce_bw.c - how fast the reduction kernels the collectives use run on one core: out = a + b
 * (dt__reduce_many with two operands, as the 2-rank shm allreduce calls it) for f32, f16 and
 * bf16, over buffers that stay in the caches, in GB/s of output written. Three timings per size,
 * each about 2 GB of output. Links the static library, whose internal header it includes:
 *
 *   gcc -O2 -Isrc -Iinclude bench/reduce_bw.c build/libdtrain.a -lm -lpthread -o reduce_bw
 *   ./reduce_bw [BYTES...]   (default 8192 65536 262144)
 *
 * Prints one line per timing: "<bytes> B: f32 X GB/s, f16 Y GB/s, bf16 Z GB/s". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/coll/coll.h"
#include "comm/comm.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double gbs(size_t bytes, dt_dtype t, void *o, const void *a, const void *b) {
  const void *srcs[2] = {a, b};
  size_t n = bytes / dt_dtype_size(t);
  long reps = (long)(2e9 / (double)bytes) + 1;
  double t0 = now_s();
  for (long i = 0; i < reps; i++)
    dt__reduce_many(o, srcs, 2, n, t, DT_SUM, 1);
  return (double)bytes * (double)reps / (now_s() - t0) / 1e9;
}

int main(int argc, char **argv) {
  size_t def[] = {8192, 65536, 262144}, nsizes = argc > 1 ? (size_t)argc - 1 : 3;
  for (size_t k = 0; k < nsizes; k++) {
    size_t bytes = argc > 1 ? strtoull(argv[k + 1], NULL, 0) : def[k];
    bytes = (bytes + 63) / 64 * 64;
    if (!bytes) {
      fprintf(stderr, "reduce_bw: give sizes in bytes\n");
      return 2;
    }
    void *a = aligned_alloc(64, bytes), *b = aligned_alloc(64, bytes), *o = aligned_alloc(64, bytes);
    if (!a || !b || !o) {
      perror("reduce_bw");
      return 1;
    }
    memset(a, 0x3c, bytes); /* finite in every type: 0x3c3c... is about 1.15 (f16) or 0.0115 (bf16, f32) */
    memset(b, 0x3c, bytes);
    for (int rep = 0; rep < 3; rep++)
      printf("%zu B: f32 %.1f GB/s, f16 %.1f GB/s, bf16 %.1f GB/s\n", bytes, gbs(bytes, DT_F32, o, a, b),
             gbs(bytes, DT_F16, o, a, b), gbs(bytes, DT_BF16, o, a, b));
    free(a);
    free(b);
    free(o);
  }
  return 0;
}
