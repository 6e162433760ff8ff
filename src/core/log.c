/* log.c - one line per message to stderr, level from DTRAIN_LOG. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"

static atomic_int log_level = -1; /* -1: not read from the environment yet */
static atomic_int log_rank = -1;

static int level_from_env(void) {
  const char *s = getenv("DTRAIN_LOG");
  if (!s || !*s)
    return DT_LOG_WARN;
  if (!strcmp(s, "error")) return DT_LOG_ERROR;
  if (!strcmp(s, "warn")) return DT_LOG_WARN;
  if (!strcmp(s, "info")) return DT_LOG_INFO;
  if (!strcmp(s, "debug")) return DT_LOG_DEBUG;
  /* said once (level_from_env runs until the level is stored; a race says it twice at most) */
  fprintf(stderr, "[dtrain] warn: DTRAIN_LOG=%.40s is not a level (error, warn, info, debug): using warn\n", s);
  return DT_LOG_WARN;
}

bool dt__log_enabled(dt_log_level lvl) {
  int l = atomic_load(&log_level);
  if (l < 0) {
    l = level_from_env();
    atomic_store(&log_level, l);
  }
  return (int)lvl <= l;
}

void dt__log_set_rank(int rank) { atomic_store(&log_rank, rank); }

void dt__log(dt_log_level lvl, const char *fmt, ...) {
  static const char *names[] = {"error", "warn", "info", "debug"};
  if (!dt__log_enabled(lvl))
    return;
  char line[2048];
  int n, rank = atomic_load(&log_rank);
  if (rank >= 0)
    n = snprintf(line, sizeof line, "[dtrain r%d] %s: ", rank, names[lvl]);
  else
    n = snprintf(line, sizeof line, "[dtrain] %s: ", names[lvl]);
  va_list ap;
  va_start(ap, fmt);
  n += vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof line - 2)
    n = (int)sizeof line - 2;
  line[n++] = '\n';
  ssize_t w = write(STDERR_FILENO, line, (size_t)n);
  (void)w;
}
