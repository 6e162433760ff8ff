/* error.c - status text and the thread-local error detail. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core/core.h"

static _Thread_local char err_detail[1024];

static const char *status_text[] = {
#define DT_STATUS_TEXT(name, text) text,
    DT_STATUS_MAP(DT_STATUS_TEXT)
#undef DT_STATUS_TEXT
};

const char *dt_strerror(dt_status st) {
  if ((unsigned)st >= DT_STATUS_COUNT)
    return "unknown status";
  return status_text[st];
}

const char *dt_last_error(void) { return err_detail; }

void dt_clear_error(void) { err_detail[0] = '\0'; }

dt_status dt_set_error(dt_status st, const char *fmt, ...) {
  char msg[sizeof err_detail]; /* an argument may be dt_last_error() itself, this same buffer */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  memcpy(err_detail, msg, sizeof msg);
  return st;
}

dt_status dt__errno(dt_status st, const char *fmt, ...) {
  int e = errno;
  char what[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  snprintf(err_detail, sizeof err_detail, "%s: %s", what, strerror(e));
  errno = e;
  return st;
}

dt_status dt__error_prefix(dt_status st, const char *fmt, ...) {
  char ctx[512], old[sizeof err_detail];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctx, sizeof ctx, fmt, ap);
  va_end(ap);
  memcpy(old, err_detail, sizeof old);
  const char *rest = old[0] ? old : dt_strerror(st);
  size_t n = strlen(ctx);
  if (n > sizeof err_detail - 3)
    n = sizeof err_detail - 3;
  memcpy(err_detail, ctx, n);
  memcpy(err_detail + n, ": ", 2);
  size_t m = strlen(rest);
  if (m > sizeof err_detail - n - 3)
    m = sizeof err_detail - n - 3;
  memcpy(err_detail + n + 2, rest, m);
  err_detail[n + 2 + m] = '\0';
  return st;
}

const char *dt_version(void) { return "0.1.0"; }
