/* alloc.c - every allocation of the library, aligned or not, and kernel randomness.
 * Routing them all through here gives tests one place to make an allocation fail
 * (dt__alloc_fail_after); in production that costs one relaxed atomic load per call. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "core/core.h"

/* Allocations still to succeed before the armed one fails; -1: none armed (or it fired). */
static _Atomic long g_fail_after = -1;

long dt__alloc_fail_after(long n) { return atomic_exchange(&g_fail_after, n < 0 ? -1 : n); }

/* True when this allocation is the armed one (which disarms the hook). */
static bool fail_now(void) {
  long v = atomic_load_explicit(&g_fail_after, memory_order_relaxed);
  while (v >= 0)
    if (atomic_compare_exchange_weak(&g_fail_after, &v, v - 1))
      return v == 0;
  return false;
}

static void *nomem(size_t n) {
  dt_set_error(DT_ERR_NOMEM, "cannot allocate %zu bytes", n);
  return NULL;
}

void *dt__alloc(size_t n) {
  void *p = NULL;
  if (fail_now() || posix_memalign(&p, 64, n ? n : 64) != 0)
    return nomem(n);
  return p;
}

void *dt__calloc(size_t n) {
  void *p = dt__alloc(n);
  if (p)
    memset(p, 0, n);
  return p;
}

void *dt__realloc(void *p, size_t n) {
  void *q = fail_now() ? NULL : realloc(p, n ? n : 1);
  return q ? q : nomem(n);
}

char *dt__strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = dt__alloc(n);
  if (d)
    memcpy(d, s, n);
  return d;
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
