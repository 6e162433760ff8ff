/* env.c - environment knobs with validation: a malformed value is an error, never ignored. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>

#include "core/core.h"

const char *dt__env_str(const char *name) {
  const char *s = getenv(name);
  return (s && *s) ? s : NULL;
}

dt_status dt__env_int(const char *name, int64_t def, int64_t *out) {
  const char *s = dt__env_str(name);
  if (!s) {
    *out = def;
    return DT_OK;
  }
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end)
    return dt_set_error(DT_ERR_INVALID, "%s=%s is not an integer", name, s);
  *out = v;
  return DT_OK;
}

dt_status dt__env_int_range(const char *name, int64_t def, int64_t lo, int64_t hi, int64_t *out) {
  DT_CHECK(dt__env_int(name, def, out));
  if (dt__env_str(name) && (*out < lo || *out > hi))
    return dt_set_error(DT_ERR_INVALID, "%s=%s is out of range %lld..%lld", name, dt__env_str(name), (long long)lo,
                        (long long)hi);
  return DT_OK;
}

dt_status dt__parse_size(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  if (!s || *s == '-' || *s == '+' || isspace((unsigned char)*s)) /* strtoull would take " -5" as 2^64 - 5 */
    return dt_set_error(DT_ERR_INVALID, "size '%s' is not a non-negative number", s ? s : "");
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s)
    return dt_set_error(DT_ERR_INVALID, "size '%s' is not a number", s);
  uint64_t mul = 1;
  switch (*end) {
  case 'k': case 'K': mul = 1ULL << 10; end++; break;
  case 'm': case 'M': mul = 1ULL << 20; end++; break;
  case 'g': case 'G': mul = 1ULL << 30; end++; break;
  default: break;
  }
  if (*end == 'B' || *end == 'b' || (*end == 'i' && end[1] == 'B' && (end += 1)))
    end++;
  if (*end)
    return dt_set_error(DT_ERR_INVALID, "size '%s' has a bad suffix (use K, M or G)", s);
  if (v > UINT64_MAX / mul)
    return dt_set_error(DT_ERR_INVALID, "size '%s' is too large", s);
  *out = v * mul;
  return DT_OK;
}

dt_status dt__env_size(const char *name, uint64_t def, uint64_t *out) {
  const char *s = dt__env_str(name);
  if (!s) {
    *out = def;
    return DT_OK;
  }
  dt_status st = dt__parse_size(s, out);
  if (st)
    return dt__error_prefix(st, "%s", name);
  return DT_OK;
}
