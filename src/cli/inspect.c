/* inspect.c - `dtrain inspect FILE...`: says what a checkpoint, safetensors model or IDX data file
 * holds and verifies it (every checksum and every header field; the readers do the checking).
 * Exit 0 when every file is valid, 1 when one is corrupt or unreadable, 2 for bad usage.
 * It only reads; it never repairs or rewrites a file. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "dtrain/ckpt.h"
#include "dtrain/core.h"
#include "dtrain/data.h"
#include "dtrain/nn.h"
#include "dtrain/train.h"
#include "parallel/train_internal.h" /* dt__train_ckpt_pos */

static void help(FILE *f) {
  fprintf(f,
          "usage: dtrain inspect FILE...\n\n"
          "Prints what FILE holds and verifies it:\n"
          "  checkpoint (.dtc)  step, sections with sizes and CRC32C, meta keys and values\n"
          "  safetensors        tensors with dtype, shape and bytes; __metadata__; how many\n"
          "                     values are NaN or infinite (the file is still valid)\n"
          "  IDX (.gz or raw)   element type and dimensions\n"
          "  directory          each checkpoint in it, valid or not, and which one a resume uses\n"
          "Exits 1 if a file is corrupt (the message names the file and the problem).\n");
}

/* A name or value of a file, printed with its control characters as \xNN: a newline in metadata
 * must not print a line of its own that reads like one of ours. */
static const char *shown(const char *s, char *buf, size_t cap) {
  size_t o = 0;
  for (; *s && o + 5 < cap; s++) {
    unsigned char c = (unsigned char)*s;
    if (c < 0x20 || c == 0x7f)
      o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
    else
      buf[o++] = (char)c;
  }
  if (*s && o + 4 < cap)
    o += (size_t)snprintf(buf + o, cap - o, "...");
  buf[o] = '\0';
  return buf;
}

static int inspect_ckpt(const char *path) {
  dt_ckpt *c;
  if (dt_ckpt_open(path, &c) != DT_OK)
    return dt_cli_fail("inspect", "corrupt or unreadable checkpoint");
  uint64_t total = 0;
  for (size_t i = 0; i < dt_ckpt_count(c); i++)
    total += dt_ckpt_section_at(c, i)->nbytes;
  printf("%s: dtrain checkpoint v%u, step %llu, %zu sections, %llu data bytes, all CRC32C verified\n",
         path, dt_ckpt_version(c), (unsigned long long)dt_ckpt_step(c), dt_ckpt_count(c),
         (unsigned long long)total);
  printf("sections:\n");
  for (size_t i = 0; i < dt_ckpt_count(c); i++) {
    const dt_ckpt_section *s = dt_ckpt_section_at(c, i);
    printf("  %-24s %12llu bytes  crc32c 0x%08x\n", s->name, (unsigned long long)s->nbytes, s->crc32c);
  }
  printf("meta:\n");
  for (size_t i = 0; i < dt_ckpt_meta_count(c); i++) {
    const dt_kv *kv = dt_ckpt_meta_at(c, i);
    char k[256], v[2048];
    printf("  %s = %s\n", shown(kv->key, k, sizeof k), shown(kv->value, v, sizeof v));
  }
  dt_ckpt_destroy(c);
  return 0;
}

/* NaN and infinite values of a floating-point tensor (F32, F64, F16, BF16, F8_E5M2; F8_E4M3 has
 * NaN only: its 0x7f and 0xff; the other types: 0). */
static uint64_t count_nonfinite(const dt_tensor_view *t) {
  uint64_t n = 0;
  const unsigned char *p = t->data;
  for (size_t i = 0; (t->dtype == DT_ST_F16 || t->dtype == DT_ST_BF16) && i + 2 <= t->nbytes; i += 2) {
    unsigned h = p[i] | (unsigned)p[i + 1] << 8, e = t->dtype == DT_ST_F16 ? 0x7c00u : 0x7f80u;
    n += (h & e) == e;
  }
  for (size_t i = 0; t->dtype == DT_ST_F8_E5M2 && i < t->nbytes; i++)
    n += (p[i] & 0x7cu) == 0x7cu;
  for (size_t i = 0; t->dtype == DT_ST_F8_E4M3 && i < t->nbytes; i++)
    n += (p[i] & 0x7fu) == 0x7fu;
  for (size_t i = 0; t->dtype == DT_ST_F32 && i + 4 <= t->nbytes; i += 4) {
    float v;
    memcpy(&v, p + i, 4);
    n += !isfinite(v);
  }
  for (size_t i = 0; t->dtype == DT_ST_F64 && i + 8 <= t->nbytes; i += 8) {
    double v;
    memcpy(&v, p + i, 8);
    n += !isfinite(v);
  }
  return n;
}

static int inspect_st(const char *path) {
  dt_safetensors *f;
  if (dt_safetensors_open(path, &f) != DT_OK)
    return dt_cli_fail("inspect", "corrupt or unreadable safetensors file");
  uint64_t total = 0, elems = 0, nonfinite = 0;
  for (size_t i = 0; i < dt_safetensors_count(f); i++) {
    const dt_tensor_view *t = dt_safetensors_tensor(f, i);
    total += t->nbytes;
    elems += t->nbytes / dt_st_dtype_size(t->dtype);
    nonfinite += count_nonfinite(t);
  }
  /* valid: the checksums and the header hold; NaN or infinite values are still worth a word */
  printf("%s: safetensors, header %llu bytes, %zu tensors, %llu elements, %llu data bytes, valid; "
         "%llu values not finite (NaN or infinity)\n",
         path, (unsigned long long)dt_safetensors_header_len(f), dt_safetensors_count(f),
         (unsigned long long)elems, (unsigned long long)total, (unsigned long long)nonfinite);
  if (dt_safetensors_meta_count(f)) {
    printf("metadata:\n");
    for (size_t i = 0; i < dt_safetensors_meta_count(f); i++) {
      const dt_kv *kv = dt_safetensors_meta(f, i);
      char k[256], v[2048];
      printf("  %s = %s\n", shown(kv->key, k, sizeof k), shown(kv->value, v, sizeof v));
    }
  }
  printf("tensors:\n");
  for (size_t i = 0; i < dt_safetensors_count(f); i++) {
    const dt_tensor_view *t = dt_safetensors_tensor(f, i);
    char shape[256] = "[";
    size_t o = 1;
    for (int d = 0; d < t->ndim && o < sizeof shape; d++)
      o += (size_t)snprintf(shape + o, sizeof shape - o, "%s%llu", d ? ", " : "",
                            (unsigned long long)t->shape[d]);
    if (o < sizeof shape - 1)
      strcat(shape, "]");
    char nm[1024];
    printf("  %-32s %-7s %-20s %12llu bytes\n", shown(t->name, nm, sizeof nm), dt_st_dtype_name(t->dtype), shape,
           (unsigned long long)t->nbytes);
  }
  /* A model file dtrain wrote names its model: check that it loads as that model, as dtrain eval
   * loads it (a spec that does not parse, tensors of other shapes, or more of them). */
  int bad = 0;
  if (dt_safetensors_meta_get(f, "dtrain.model_spec")) {
    dt_model *m = NULL;
    if (dt_train_model_load(path, 1, &m) != DT_OK) {
      fprintf(stderr, "dtrain inspect: %s: does not load as the dtrain model it names: %s\n", path, dt_last_error());
      bad = 1;
    } else {
      printf("model: %s, %zu parameters; loads\n", dt_model_spec(m), dt_model_param_count(m));
      dt_model_destroy(m);
    }
  }
  dt_safetensors_destroy(f);
  return bad;
}

static int inspect_idx(const char *path) {
  dt_idx idx;
  if (dt_idx_read(path, 0, &idx) != DT_OK)
    return dt_cli_fail("inspect", "corrupt or unreadable IDX file");
  static const char *tn[16] = {[8] = "u8", [9] = "i8", [11] = "i16", [12] = "i32", [13] = "f32", [14] = "f64"};
  printf("%s: IDX, %s, %d dimensions [", path, tn[idx.type & 15] ? tn[idx.type & 15] : "?", idx.ndim);
  for (int d = 0; d < idx.ndim; d++)
    printf("%s%llu", d ? ", " : "", (unsigned long long)idx.dims[d]);
  printf("], %llu elements, valid\n", (unsigned long long)idx.count);
  dt_idx_free(&idx);
  return 0;
}

/* A checkpoint directory: one line per file, and the one dt_ckpt_open_latest would pick. */
static int inspect_dir(const char *dir) {
  char **paths;
  size_t n;
  if (dt_ckpt_list_paths(dir, &paths, &n) != DT_OK)
    return dt_cli_fail("inspect", "cannot list %s", dir);
  if (!n) {
    free(paths);
    fprintf(stderr, "dtrain inspect: %s: no checkpoint files (ckpt-*.dtc)\n", dir);
    return 1;
  }
  int bad = 0;
  long long resume = -1; /* -2: the newest valid file is DAMAGED */
  printf("%s: %zu checkpoint files\n", dir, n);
  for (size_t i = 0; i < n; i++) {
    dt_ckpt *c = NULL;
    dt__train_pos pos;
    /* a dtrain train checkpoint (it names its model) whose checksums hold but which lacks a
     * position: a resume stops at it when it is the newest valid file; other programs' files
     * (dt_ckpt_save) hold what they hold */
    if (dt_ckpt_open(paths[i], &c) == DT_OK && dt_ckpt_meta_get(c, "model_spec") &&
        dt__train_ckpt_pos(c, &pos) != DT_OK) {
      printf("  step %-10llu DAMAGED  %s\n", (unsigned long long)dt_ckpt_step(c), dt_last_error());
      resume = -2;
      bad = 1;
      dt_ckpt_destroy(c);
    } else if (c) {
      printf("  step %-10llu valid    %s\n", (unsigned long long)dt_ckpt_step(c), paths[i]);
      resume = (long long)dt_ckpt_step(c);
      dt_ckpt_destroy(c);
    } else {
      unsigned long long named = 0; /* the step the name gives */
      sscanf(strrchr(paths[i], '/') + 1, "ckpt-%llu", &named);
      printf("  step %-10llu CORRUPT  %s\n", named, dt_last_error());
      bad = 1;
    }
  }
  /* names like a checkpoint's that the listing does not take (ckpt-x.dtc, a step past 2^64):
   * a resume passes them over, so say so rather than leave them unmentioned */
  DIR *d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d));) {
    size_t len = strlen(e->d_name);
    if (len < 9 || strncmp(e->d_name, "ckpt-", 5) || strcmp(e->d_name + len - 4, ".dtc"))
      continue;
    bool listed = false;
    for (size_t i = 0; i < n && !listed; i++)
      listed = !strcmp(strrchr(paths[i], '/') + 1, e->d_name);
    if (!listed) {
      char nm[600];
      printf("  ignored           %s (not ckpt-<step>.dtc with a step a resume can read)\n",
             shown(e->d_name, nm, sizeof nm));
    }
  }
  if (d)
    closedir(d);
  if (resume >= 0)
    printf("a resume would use step %lld\n", resume);
  else if (resume == -2)
    printf("the newest checkpoint with valid checksums has no usable position: a resume would stop at it\n");
  else
    printf("no valid checkpoint: a resume would fail\n");
  free(paths);
  return bad;
}

static int inspect_one(const char *path) {
  struct stat st;
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
    return inspect_dir(path);
  unsigned char m[9] = {0};
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO: refused below, not waited on */
  if (fd < 0) {
    fprintf(stderr, "dtrain inspect: %s: %s\n", path, strerror(errno));
    return 1;
  }
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    fprintf(stderr, "dtrain inspect: %s: not a regular file\n", path);
    close(fd);
    return 1;
  }
  ssize_t k = read(fd, m, sizeof m);
  int read_errno = errno;
  close(fd);
  if (k >= 8 && !memcmp(m, "DTRCKPT\n", 8))
    return inspect_ckpt(path);
  if (k >= 2 && m[0] == 0x1f && m[1] == 0x8b)
    return inspect_idx(path);
  if (k >= 4 && m[0] == 0 && m[1] == 0 && m[2] >= 0x08 && m[2] <= 0x0E && m[3] >= 1 && m[3] <= 8)
    return inspect_idx(path);
  if (k == 9 && m[8] == '{')
    return inspect_st(path);
  if (k < 0) {
    fprintf(stderr, "dtrain inspect: %s: %s\n", path, strerror(read_errno));
    return 1;
  }
  if (k == 0) {
    fprintf(stderr, "dtrain inspect: %s: empty file (neither checkpoint, safetensors nor IDX)\n", path);
    return 1;
  }
  fprintf(stderr, "dtrain inspect: %s: unknown format (first bytes match no checkpoint, safetensors or "
          "IDX header)\n", path);
  return 1;
}

int dt_cli_inspect(int argc, char **argv) {
  int nfiles = 0, dashdash = argc; /* after "--" every argument is a file, "-x" too */
  for (int i = 1; i < argc; i++) {
    if (i < dashdash && !strcmp(argv[i], "--")) {
      dashdash = i;
      continue;
    }
    bool files_from = i > dashdash;
    if (!files_from && (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))) {
      help(stdout);
      return 0;
    }
    if (!files_from && argv[i][0] == '-' && argv[i][1])
      return dt_cli_usage_error("inspect", "dtrain inspect --help (a file named -x: dtrain inspect -- -x)",
                                "unknown flag '%s'", argv[i]);
    nfiles++;
  }
  if (!nfiles)
    return dt_cli_usage_error("inspect", "dtrain inspect FILE (a .dtc checkpoint, a .safetensors "
                              "model or an IDX file)", "no file given");
  int rc = 0;
  for (int i = 1; i < argc; i++) {
    if (i == dashdash)
      continue;
    int r = inspect_one(argv[i]);
    if (r > rc)
      rc = r;
  }
  return rc;
}
