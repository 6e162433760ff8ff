/* tests/train/train_test.h - helpers for the trainer tests: a tiny learnable dataset written as
 * real IDX files, running the dtrain binary with a bounded wait and captured output, a small
 * strict JSON checker, and comparisons of saved safetensors models and metrics files.
 * Header-only; every test is its own process. */
#ifndef DT_TRAIN_TEST_H
#define DT_TRAIN_TEST_H

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dtrain/ckpt.h"

#define CHECK(cond, ...)                                                    \
  do {                                                                      \
    if (!(cond)) {                                                          \
      fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                         \
      fputc('\n', stderr);                                                  \
      exit(1);                                                              \
    }                                                                       \
  } while (0)

/* A seeded stream for the randomized tests (splitmix64): tt_seed(s), then tt_rnd(n) is uniform in
 * [0, n) and tt_chance(p) is true p percent of the time. */
static uint64_t tt_rng_state;
static inline void tt_seed(uint64_t s) { tt_rng_state = s * 0x2545f4914f6cdd1dull; }
static inline uint32_t tt_rnd(uint32_t n) {
  uint64_t z = (tt_rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (uint32_t)((z ^ (z >> 31)) % n);
}
static inline int tt_chance(int percent) { return (int)tt_rnd(100) < percent; }

/* The tiny model every trainer test uses on the tiny dataset below. */
#define TINY_MODEL "in=1x8x8,linear:32,relu,linear:4"

static void tt_write_be32(FILE *f, uint32_t v) {
  unsigned char b[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16), (unsigned char)(v >> 8),
                        (unsigned char)v};
  fwrite(b, 1, 4, f);
}

/* Writes an u8 IDX file with the given dims. */
static inline void tt_write_idx(const char *path, const unsigned char *data, int ndim, const uint32_t *dims) {
  FILE *f = fopen(path, "wb");
  CHECK(f, "cannot create %s", path);
  unsigned char magic[4] = {0, 0, 0x08, (unsigned char)ndim};
  fwrite(magic, 1, 4, f);
  size_t n = 1;
  for (int i = 0; i < ndim; i++) {
    tt_write_be32(f, dims[i]);
    n *= dims[i];
  }
  CHECK(fwrite(data, 1, n, f) == n, "short write %s", path);
  CHECK(fclose(f) == 0, "close %s", path);
}

/* A learnable 4-class set of 8x8 images: class k lights up quadrant k a little, under heavy
 * noise, so the loss keeps falling for a few epochs instead of vanishing at once. */
static inline void tt_make_split(const char *dir, const char *prefix, uint32_t n, uint32_t seed) {
  unsigned char *img = malloc((size_t)n * 64), *lab = malloc(n);
  uint32_t s = seed * 2654435761u + 12345u;
  for (uint32_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    int k = (int)((s >> 16) % 4);
    lab[i] = (unsigned char)k;
    for (int y = 0; y < 8; y++)
      for (int x = 0; x < 8; x++) {
        s = s * 1664525u + 1013904223u;
        int q = (y / 4) * 2 + (x / 4);
        int noise = (int)((s >> 16) % 200);
        img[(size_t)i * 64 + y * 8 + x] = (unsigned char)(q == k ? 50 + noise : noise);
      }
  }
  char p[4096];
  uint32_t d3[3] = {n, 8, 8}, d1[1] = {n};
  snprintf(p, sizeof p, "%s/%s-images-idx3-ubyte", dir, prefix);
  tt_write_idx(p, img, 3, d3);
  snprintf(p, sizeof p, "%s/%s-labels-idx1-ubyte", dir, prefix);
  tt_write_idx(p, lab, 1, d1);
  free(img);
  free(lab);
}

/* A fresh scratch directory under $TMPDIR (or /tmp) for this test process. */
static inline void tt_scratch(char *out, size_t cap, const char *name) {
  if (cap > 1024)
    cap = 1024;
  const char *t = getenv("TMPDIR");
  snprintf(out, cap, "%s/dtrain-%s-%d", t && *t ? t : "/tmp", name, (int)getpid());
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", out, out);
  CHECK(system(cmd) == 0, "cannot create %s", out);
}

static inline void tt_rmrf(const char *dir) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0)
    fprintf(stderr, "warning: could not remove %s\n", dir);
}

/* Writes a tiny dataset (train n_train, test n_test samples) into dir. */
static inline void tt_make_dataset(const char *dir, uint32_t n_train, uint32_t n_test) {
  tt_make_split(dir, "train", n_train, 1);
  tt_make_split(dir, "t10k", n_test, 2);
}

static inline const char *tt_bin(void) {
  const char *b = getenv("DTRAIN_BIN");
  CHECK(b && *b, "DTRAIN_BIN is not set (run under ctest)");
  return b;
}

static inline char *tt_slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return calloc(1, 1);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  size_t got = fread(b, 1, (size_t)n, f);
  b[got] = '\0';
  fclose(f);
  return b;
}

typedef struct tt_result {
  int code;     /* exit code, or 128+signal */
  char *out, *err;
} tt_result;

static inline void tt_result_free(tt_result *r) {
  free(r->out);
  free(r->err);
}

/* Runs a shell command line (bounded by coreutils timeout) capturing stdout and stderr. */
static inline tt_result tt_run(const char *scratch, int timeout_s, const char *fmt, ...) {
  char cmd[8192], line[20000], o[4096], e[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  snprintf(o, sizeof o, "%s/.out", scratch);
  snprintf(e, sizeof e, "%s/.err", scratch);
  snprintf(line, sizeof line, "timeout -k 5 %d %s >'%s' 2>'%s' </dev/null", timeout_s, cmd, o, e);
  fflush(NULL);
  int st = system(line);
  tt_result r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = tt_slurp(o);
  r.err = tt_slurp(e);
  fprintf(stderr, "$ %s -> %d\n", cmd, r.code);
  return r;
}

/* ---- a strict JSON checker (RFC 8259 values) ---- */

static inline const char *tt_json_ws(const char *p) {
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
    p++;
  return p;
}

static inline const char *tt_json_value(const char *p);

static inline const char *tt_json_string(const char *p) {
  if (*p != '"')
    return NULL;
  for (p++; *p && *p != '"'; p++) {
    if ((unsigned char)*p < 0x20)
      return NULL;
    if (*p == '\\') {
      p++;
      if (*p == 'u') {
        for (int i = 1; i <= 4; i++)
          if (!isxdigit((unsigned char)p[i]))
            return NULL;
        p += 4;
      } else if (!strchr("\"\\/bfnrt", *p) || !*p) {
        return NULL;
      }
    }
  }
  return *p == '"' ? p + 1 : NULL;
}

static inline const char *tt_json_number(const char *p) {
  const char *s = p;
  if (*p == '-')
    p++;
  if (*p == '0')
    p++;
  else if (isdigit((unsigned char)*p))
    while (isdigit((unsigned char)*p))
      p++;
  else
    return NULL;
  if (*p == '.') {
    p++;
    if (!isdigit((unsigned char)*p))
      return NULL;
    while (isdigit((unsigned char)*p))
      p++;
  }
  if (*p == 'e' || *p == 'E') {
    p++;
    if (*p == '+' || *p == '-')
      p++;
    if (!isdigit((unsigned char)*p))
      return NULL;
    while (isdigit((unsigned char)*p))
      p++;
  }
  return p > s ? p : NULL;
}

static inline const char *tt_json_value(const char *p) {
  p = tt_json_ws(p);
  if (*p == '{' || *p == '[') {
    char close = *p == '{' ? '}' : ']';
    int obj = *p == '{';
    p = tt_json_ws(p + 1);
    if (*p == close)
      return p + 1;
    for (;;) {
      if (obj) {
        p = tt_json_string(tt_json_ws(p));
        if (!p)
          return NULL;
        p = tt_json_ws(p);
        if (*p++ != ':')
          return NULL;
      }
      p = tt_json_value(p);
      if (!p)
        return NULL;
      p = tt_json_ws(p);
      if (*p == ',') {
        p++;
        continue;
      }
      return *p == close ? p + 1 : NULL;
    }
  }
  if (*p == '"')
    return tt_json_string(p);
  if (!strncmp(p, "true", 4))
    return p + 4;
  if (!strncmp(p, "false", 5))
    return p + 5;
  if (!strncmp(p, "null", 4))
    return p + 4;
  return tt_json_number(p);
}

/* True if s is exactly one JSON object (surrounding whitespace allowed). */
static inline int tt_json_is_object(const char *s) {
  const char *p = tt_json_ws(s);
  if (*p != '{')
    return 0;
  p = tt_json_value(p);
  return p && *tt_json_ws(p) == '\0';
}

/* The number at top-level key (a simple search: keys in our output are unique). NAN if absent. */
static inline double tt_json_num(const char *s, const char *key) {
  char k[128];
  snprintf(k, sizeof k, "\"%s\":", key);
  const char *p = strstr(s, k);
  if (!p)
    return NAN;
  p += strlen(k);
  char *end;
  double v = strtod(p, &end);
  return end == p ? NAN : v;
}

/* Copies the string value of key into out; returns 0 if absent. */
static inline int tt_json_str(const char *s, const char *key, char *out, size_t cap) {
  char k[128];
  snprintf(k, sizeof k, "\"%s\":\"", key);
  const char *p = strstr(s, k);
  if (!p)
    return 0;
  p += strlen(k);
  size_t i = 0;
  while (*p && *p != '"' && i + 1 < cap)
    out[i++] = *p++;
  out[i] = '\0';
  return 1;
}

/* ---- models and metrics ---- */

/* max |a - b| / max |b| over every tensor of two safetensors models with the same tensors. */
static inline double tt_model_rel_diff(const char *a_path, const char *b_path) {
  dt_safetensors *a = NULL, *b = NULL;
  CHECK(dt_safetensors_open(a_path, &a) == DT_OK, "open %s: %s", a_path, dt_last_error());
  CHECK(dt_safetensors_open(b_path, &b) == DT_OK, "open %s: %s", b_path, dt_last_error());
  CHECK(dt_safetensors_count(a) == dt_safetensors_count(b), "tensor counts differ");
  double maxdiff = 0, maxb = 0;
  for (size_t i = 0; i < dt_safetensors_count(a); i++) {
    const dt_tensor_view *ta = dt_safetensors_tensor(a, i);
    const dt_tensor_view *tb = dt_safetensors_find(b, ta->name);
    CHECK(tb && tb->nbytes == ta->nbytes && ta->dtype == DT_ST_F32, "tensor %s differs in shape",
          ta->name);
    size_t n = ta->nbytes / 4;
    for (size_t j = 0; j < n; j++) {
      float x, y;
      memcpy(&x, (const char *)ta->data + 4 * j, 4);
      memcpy(&y, (const char *)tb->data + 4 * j, 4);
      CHECK(isfinite(x) && isfinite(y), "non-finite parameter in %s", ta->name);
      maxdiff = fmax(maxdiff, fabs((double)x - (double)y));
      maxb = fmax(maxb, fabs((double)y));
    }
  }
  dt_safetensors_destroy(a);
  dt_safetensors_destroy(b);
  return maxb > 0 ? maxdiff / maxb : maxdiff;
}

/* Reads the "step" lines of a metrics file: loss[step] for steps 1..cap-1 (NAN where absent).
 * Returns the highest step seen. */
static inline int tt_metrics_losses(const char *path, double *loss, int cap) {
  for (int i = 0; i < cap; i++)
    loss[i] = NAN;
  char *s = tt_slurp(path);
  int maxstep = 0;
  for (char *line = strtok(s, "\n"); line; line = strtok(NULL, "\n")) {
    CHECK(tt_json_is_object(line), "metrics line is not a JSON object: %s", line);
    if (!strstr(line, "\"type\":\"step\""))
      continue;
    int step = (int)tt_json_num(line, "step");
    if (step > 0 && step < cap) {
      loss[step] = tt_json_num(line, "loss");
      if (step > maxstep)
        maxstep = step;
    }
  }
  free(s);
  return maxstep;
}

/* Data-parallel runs in a scratch directory DIR, each writing to DIR/OUT: `dtrain run -n N
 * --raw-stdout -- dtrain train --data DATA COMMON EXTRA --out DIR/OUT --json`, checked to exit 0
 * with one JSON summary whose world_size is N (fails the test otherwise). */
static inline void tt_train_n(const char *dir, const char *data, const char *common, int n,
                              const char *extra, const char *out) {
  tt_result r = tt_run(dir, 300, "%s run -n %d --raw-stdout -- %s train --data %s %s %s --out %s/%s --json",
                       tt_bin(), n, tt_bin(), data, common, extra, dir, out);
  CHECK(r.code == 0, "%d workers (%s) exit %d: %s", n, out, r.code, r.err);
  CHECK(tt_json_is_object(r.out), "stdout is not one JSON object: [%s]", r.out);
  CHECK(tt_json_num(r.out, "world_size") == n, "world_size %g != %d", tt_json_num(r.out, "world_size"), n);
  tt_result_free(&r);
}

/* tt_model_rel_diff of the models of runs DIR/A and DIR/B. */
static inline double tt_runs_model_diff(const char *dir, const char *a, const char *b) {
  char pa[4096], pb[4096];
  snprintf(pa, sizeof pa, "%s/%s/model.safetensors", dir, a);
  snprintf(pb, sizeof pb, "%s/%s/model.safetensors", dir, b);
  return tt_model_rel_diff(pa, pb);
}

/* tt_metrics_losses of run DIR/RUN. */
static inline void tt_run_losses(const char *dir, const char *run, double *l, int cap) {
  char p[4096];
  snprintf(p, sizeof p, "%s/%s/metrics.jsonl", dir, run);
  tt_metrics_losses(p, l, cap);
}

#endif
