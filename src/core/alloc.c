/* alloc.c - aligned allocation and kernel randomness. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "core/core.h"

void *dt__alloc(size_t n) {
  void *p = NULL;
  if (posix_memalign(&p, 64, n ? n : 64) != 0) {
    dt_set_error(DT_ERR_NOMEM, "cannot allocate %zu bytes", n);
    return NULL;
  }
  return p;
}

void *dt__calloc(size_t n) {
  void *p = dt__alloc(n);
  if (p)
    memset(p, 0, n);
  return p;
}

void dt__free(void *p) { free(p); }

dt_status dt__random_bytes(void *buf, size_t n) {
  unsigned char *b = buf;
  while (n) {
    ssize_t r = getrandom(b, n, 0);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return dt__errno(DT_ERR_SYSTEM, "getrandom");
    }
    b += r;
    n -= (size_t)r;
  }
  return DT_OK;
}
