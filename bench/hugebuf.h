/* hugebuf.h - the buffers of the benchmarks' own programs (cma_bw.c, mpi_coll.c): 64-byte
 * aligned, or with `huge` 2 MiB aligned, whole huge pages long and advised onto transparent huge
 * pages before anything touches them (as `dtrain bench --hugepages` allocates its own). Free
 * with free(). */
#ifndef BENCH_HUGEBUF_H
#define BENCH_HUGEBUF_H

#include <stdlib.h>
#include <sys/mman.h>

static inline void *bench_buf(size_t n, int huge) {
  const size_t h = 2u << 20;
  void *p = NULL;
  if (posix_memalign(&p, huge ? h : 64, huge ? (n + h - 1) / h * h : n))
    return NULL;
  if (huge)
    (void)madvise(p, (n + h - 1) / h * h, MADV_HUGEPAGE);
  return p;
}

#endif
