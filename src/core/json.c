/* json.c - the two pieces of every JSON text dtrain writes (train and eval --json, metrics.jsonl,
 * bench --json): strings with their escapes, and numbers, where one that is not finite (a
 * diverged loss, a model with a NaN weight) is written as null: JSON has no NaN or infinity, and
 * parsers refuse a bare nan. Not a parser, and no buffering of its own (a FILE does that). */
#include <math.h>
#include <stdio.h>

#include "core/core.h"

void dt__json_num(FILE *f, const char *fmt, double v) {
  if (isfinite(v))
    fprintf(f, fmt, v);
  else
    fputs("null", f);
}

void dt__json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; s && *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c < 0x20)
      fprintf(f, "\\u%04x", c);
    else
      fputc(c, f);
  }
  fputc('"', f);
}

void dt__json_field(FILE *f, const char *sep, const char *key, const char *fmt, double v) {
  fprintf(f, "%s\"%s\":", sep, key);
  dt__json_num(f, fmt, v);
}
