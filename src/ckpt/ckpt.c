/* ckpt.c - the training checkpoint format (.dtc): atomic, checksummed, resumable.
 *
 * Layout, all integers little-endian:
 *   0   header, 64 bytes:
 *         0  magic "DTRCKPT\n" (the newline catches text-mode mangling, as PNG's does)
 *         8  u32 version (1)          12 u32 number of sections (including "meta")
 *        16  u64 step                 24 u64 file size (a torn file is shorter)
 *        32  u64 table offset (64)    40 u32 CRC32C of the section table
 *        44  u32 flags (0)            48 12 reserved zero bytes
 *        60  u32 CRC32C of bytes 0..59
 *   64  section table, 96 bytes per section:
 *         0  name, NUL-padded to 64   64 u64 offset   72 u64 length
 *        80  u32 CRC32C of the data   84 12 reserved zero bytes
 *   then each section's bytes at a 64-byte aligned offset (zero padding between).
 * The "meta" section holds u32 count, then per entry u32 key length, key, u32 value length,
 * value: binary, so keys and values need no escaping.
 *
 * Durability and fallback are the point: a file is never modified in place (dt__afile), the
 * previous checkpoints are pruned only after the new one is durable, and loading the latest
 * walks back past any file that fails a check. It does not shard a checkpoint across ranks:
 * one writer (rank 0) holds the full state. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_internal.h"
#include "core/core.h"
#include "dtrain/ckpt.h"

#define CK_MAGIC "DTRCKPT\n"
#define CK_VERSION 1u
#define CK_HDR 64
#define CK_ENT 96
#define CK_ALIGN 64
/* Bound on sections so a corrupt count cannot make the table huge before its CRC is checked. */
#define CK_MAX_SECTIONS 65536u
#define CK_META "meta"

struct dt_ckpt {
  char *buf;               /* the whole file, 64-byte aligned (owned) */
  size_t len;
  char *path;
  uint64_t step;
  uint32_t version;
  dt_ckpt_section *sec;    /* without "meta" */
  size_t nsec;
  dt_kv *meta;
  char *meta_strings;
  size_t nmeta;
  char *skipped;
};


static uint64_t align_up(uint64_t x) { return (x + CK_ALIGN - 1) & ~(uint64_t)(CK_ALIGN - 1); }

/* ---- writing ------------------------------------------------------------------------------ */

static dt_status encode_meta(const dt_kv *meta, size_t n, uint8_t **out, size_t *len) {
  size_t total = 4;
  for (size_t i = 0; i < n; i++) {
    if (!meta[i].key || !meta[i].value || !meta[i].key[0])
      return dt_set_error(DT_ERR_INVALID, "checkpoint meta entry %zu: empty key or NULL value", i);
    for (size_t j = 0; j < i; j++)
      if (!strcmp(meta[i].key, meta[j].key))
        return dt_set_error(DT_ERR_INVALID, "checkpoint meta: duplicate key \"%s\"", meta[i].key);
    size_t kl = strlen(meta[i].key), vl = strlen(meta[i].value);
    if (kl > UINT32_MAX || vl > UINT32_MAX)
      return dt_set_error(DT_ERR_INVALID, "checkpoint meta \"%.40s\": too long", meta[i].key);
    total += 8 + kl + vl;
  }
  uint8_t *b = dt__alloc(total);
  if (!b)
    return dt__error_prefix(DT_ERR_NOMEM, "checkpoint meta (%zu bytes)", total);
  uint8_t *p = b;
  dt__put32(p, (uint32_t)n);
  p += 4;
  for (size_t i = 0; i < n; i++) {
    size_t kl = strlen(meta[i].key), vl = strlen(meta[i].value);
    dt__put32(p, (uint32_t)kl);
    memcpy(p + 4, meta[i].key, kl);
    p += 4 + kl;
    dt__put32(p, (uint32_t)vl);
    memcpy(p + 4, meta[i].value, vl);
    p += 4 + vl;
  }
  *out = b;
  *len = total;
  return DT_OK;
}

dt_status dt_ckpt_write(const char *path, uint64_t step, const dt_ckpt_section *sections, size_t n,
                        const dt_kv *meta, size_t nmeta) {
  if (!path || (n && !sections) || (nmeta && !meta))
    return dt_set_error(DT_ERR_INVALID, "dt_ckpt_write: NULL argument");
  if (n + 1 > CK_MAX_SECTIONS)
    return dt_set_error(DT_ERR_INVALID, "%s: %zu sections (max %u)", path, n, CK_MAX_SECTIONS - 1);
  for (size_t i = 0; i < n; i++) {
    const char *nm = sections[i].name;
    size_t l = nm ? strlen(nm) : 0;
    if (!l || l > DT_CKPT_NAME_MAX || !strcmp(nm, CK_META) || (sections[i].nbytes && !sections[i].data))
      return dt_set_error(DT_ERR_INVALID, "%s: section %zu \"%s\": name must be 1..%d bytes and not "
                          "\"meta\", data non-NULL", path, i, nm ? nm : "NULL", DT_CKPT_NAME_MAX);
    for (size_t j = 0; j < i; j++)
      if (!strcmp(nm, sections[j].name))
        return dt_set_error(DT_ERR_INVALID, "%s: duplicate section \"%s\"", path, nm);
  }
  uint8_t *mb = NULL, *head = NULL;
  size_t ml = 0;
  dt_status rc;
  dt__afile f;
  f.fd = -1;
  f.tmp[0] = '\0';
  DT_CHECK_GOTO(encode_meta(meta, nmeta, &mb, &ml), rc, fail);
  uint32_t ns = (uint32_t)n + 1;
  size_t head_len = CK_HDR + (size_t)ns * CK_ENT;
  head = dt__calloc(head_len);
  if (!head) {
    rc = dt__error_prefix(DT_ERR_NOMEM, "%s: checkpoint header", path);
    goto fail;
  }
  /* Sections first (user order), meta last; CRCs computed before anything is written. */
  uint64_t off = align_up(head_len);
  for (uint32_t i = 0; i < ns; i++) {
    uint8_t *e = head + CK_HDR + (size_t)i * CK_ENT;
    const char *nm = i < n ? sections[i].name : CK_META;
    const void *d = i < n ? sections[i].data : mb;
    uint64_t len = i < n ? sections[i].nbytes : ml;
    memcpy(e, nm, strlen(nm));
    dt__put64(e + 64, off);
    dt__put64(e + 72, len);
    dt__put32(e + 80, dt_crc32c(0, d, (size_t)len));
    off = align_up(off + len);
  }
  uint64_t file_size = off;
  memcpy(head, CK_MAGIC, 8);
  dt__put32(head + 8, CK_VERSION);
  dt__put32(head + 12, ns);
  dt__put64(head + 16, step);
  dt__put64(head + 24, file_size);
  dt__put64(head + 32, CK_HDR);
  dt__put32(head + 40, dt_crc32c(0, head + CK_HDR, (size_t)ns * CK_ENT));
  dt__put32(head + 60, dt_crc32c(0, head, 60));

  static const uint8_t zeros[CK_ALIGN];
  DT_CHECK_GOTO(dt__afile_open(&f, path), rc, fail);
  DT_CHECK_GOTO(dt__afile_write(&f, head, head_len), rc, fail);
  for (uint32_t i = 0; i < ns; i++) {
    uint64_t at = dt__get64(head + CK_HDR + (size_t)i * CK_ENT + 64);
    if (at > f.written)
      DT_CHECK_GOTO(dt__afile_write(&f, zeros, (size_t)(at - f.written)), rc, fail);
    const void *d = i < n ? sections[i].data : mb;
    uint64_t len = i < n ? sections[i].nbytes : ml;
    DT_CHECK_GOTO(dt__afile_write(&f, d, (size_t)len), rc, fail);
  }
  if (file_size > f.written)
    DT_CHECK_GOTO(dt__afile_write(&f, zeros, (size_t)(file_size - f.written)), rc, fail);
  DT_CHECK_GOTO(dt__afile_commit(&f), rc, fail);
  dt__free(mb);
  dt__free(head);
  return DT_OK;
fail:
  dt__afile_abort(&f);
  dt__free(mb);
  dt__free(head);
  return rc;
}

/* ---- reading ------------------------------------------------------------------------------ */

static dt_status decode_meta(dt_ckpt *c, const uint8_t *p, uint64_t len, const char *name) {
  if (len < 4)
    return dt_set_error(DT_ERR_CORRUPT, "%s: section \"meta\" is %llu bytes, too short", name,
                        (unsigned long long)len);
  uint32_t n = dt__get32(p);
  /* Each entry takes at least 8 bytes: bounds the count before allocating. */
  if (n > (len - 4) / 8)
    return dt_set_error(DT_ERR_CORRUPT, "%s: section \"meta\" claims %u entries in %llu bytes", name,
                        n, (unsigned long long)len);
  c->meta = dt__calloc((n ? n : 1) * sizeof *c->meta);
  c->meta_strings = dt__alloc((size_t)len); /* keys + values + NULs fit in len (8 bytes per entry) */
  if (!c->meta || !c->meta_strings)
    return dt__error_prefix(DT_ERR_NOMEM, "%s: meta", name);
  uint64_t at = 4;
  char *s = c->meta_strings;
  for (uint32_t i = 0; i < n; i++) {
    const char *kv[2];
    for (int k = 0; k < 2; k++) {
      if (len - at < 4)
        return dt_set_error(DT_ERR_CORRUPT, "%s: section \"meta\" entry %u truncated", name, i);
      uint32_t l = dt__get32(p + at);
      at += 4;
      if (l > len - at)
        return dt_set_error(DT_ERR_CORRUPT, "%s: section \"meta\" entry %u: length %u past the end",
                            name, i, l);
      if (memchr(p + at, 0, l))
        return dt_set_error(DT_ERR_CORRUPT, "%s: section \"meta\" entry %u holds a NUL byte", name, i);
      memcpy(s, p + at, l);
      s[l] = '\0';
      kv[k] = s;
      s += l + 1;
      at += l;
    }
    if (!kv[0][0])
      return dt_set_error(DT_ERR_CORRUPT, "%s: section \"meta\" entry %u has an empty key", name, i);
    for (uint32_t j = 0; j < i; j++)
      if (!strcmp(c->meta[j].key, kv[0]))
        return dt_set_error(DT_ERR_CORRUPT, "%s: section \"meta\": duplicate key \"%s\"", name, kv[0]);
    c->meta[i].key = kv[0];
    c->meta[i].value = kv[1];
    c->nmeta = i + 1;
  }
  if (at != len)
    return dt_set_error(DT_ERR_CORRUPT, "%s: section \"meta\": %llu trailing bytes", name,
                        (unsigned long long)(len - at));
  return DT_OK;
}

typedef struct ck_span {
  uint64_t b, e;
  uint32_t i;
} ck_span;

static int cmp_ck_span(const void *a, const void *b) {
  const ck_span *x = a, *y = b;
  return x->b < y->b ? -1 : x->b > y->b ? 1 : 0;
}

/* Takes ownership of buf (a dt__alloc'd copy of the file). */
static dt_status parse_owned(char *buf, size_t len, const char *name, dt_ckpt **out) {
  dt_ckpt *c = dt__calloc(sizeof *c);
  if (!c) {
    dt__free(buf);
    return dt__error_prefix(DT_ERR_NOMEM, "%s: checkpoint handle", name);
  }
  c->buf = buf;
  c->len = len;
  c->path = dt__strdup(name);
  dt_status rc;
  ck_span *sp = NULL;
  const uint8_t *u = (const uint8_t *)buf;
  if (!c->path) {
    rc = dt__error_prefix(DT_ERR_NOMEM, "%s: checkpoint path", name);
    goto fail;
  }
  if (len == 0) {
    rc = dt_set_error(DT_ERR_CORRUPT, "%s: empty file (zero length: a write that never happened)", name);
    goto fail;
  }
  if (len < CK_HDR) {
    rc = dt_set_error(DT_ERR_CORRUPT, "%s: %zu bytes, shorter than the %d-byte checkpoint header "
                      "(torn write?)", name, len, CK_HDR);
    goto fail;
  }
  if (memcmp(u, CK_MAGIC, 8) != 0) {
    rc = dt_set_error(DT_ERR_CORRUPT, "%s: bad magic: not a dtrain checkpoint", name);
    goto fail;
  }
  uint32_t hcrc = dt_crc32c(0, u, 60);
  if (hcrc != dt__get32(u + 60)) {
    rc = dt_set_error(DT_ERR_CORRUPT, "%s: header CRC32C 0x%08x != stored 0x%08x", name, hcrc,
                      dt__get32(u + 60));
    goto fail;
  }
  c->version = dt__get32(u + 8);
  if (c->version != CK_VERSION) {
    rc = dt_set_error(DT_ERR_UNSUPPORTED, "%s: checkpoint version %u (this dtrain reads %u)", name,
                      c->version, CK_VERSION);
    goto fail;
  }
  uint32_t ns = dt__get32(u + 12);
  c->step = dt__get64(u + 16);
  uint64_t fsize = dt__get64(u + 24), toff = dt__get64(u + 32);
  if (fsize != len) {
    rc = dt_set_error(DT_ERR_CORRUPT, "%s: header says %llu bytes but the file has %zu (%s)", name,
                      (unsigned long long)fsize, len, fsize > len ? "truncated or torn write" : "trailing bytes");
    goto fail;
  }
  if (ns == 0 || ns > CK_MAX_SECTIONS || toff != CK_HDR ||
      (uint64_t)ns * CK_ENT > len - CK_HDR) {
    rc = dt_set_error(DT_ERR_CORRUPT, "%s: section table (%u entries at offset %llu) does not fit "
                      "the %zu-byte file", name, ns, (unsigned long long)toff, len);
    goto fail;
  }
  uint32_t tcrc = dt_crc32c(0, u + CK_HDR, (size_t)ns * CK_ENT);
  if (tcrc != dt__get32(u + 40)) {
    rc = dt_set_error(DT_ERR_CORRUPT, "%s: section table CRC32C 0x%08x != stored 0x%08x", name, tcrc,
                      dt__get32(u + 40));
    goto fail;
  }
  c->sec = dt__calloc(ns * sizeof *c->sec);
  sp = dt__calloc(ns * sizeof *sp);
  if (!c->sec || !sp) {
    rc = dt__error_prefix(DT_ERR_NOMEM, "%s: section table", name);
    goto fail;
  }
  uint64_t table_end = CK_HDR + (uint64_t)ns * CK_ENT;
  int meta_idx = -1;
  for (uint32_t i = 0; i < ns; i++) {
    const uint8_t *e = u + CK_HDR + (size_t)i * CK_ENT;
    const char *nm = (const char *)e;
    size_t nl = strnlen(nm, 64);
    if (nl == 0 || nl > DT_CKPT_NAME_MAX) {
      rc = dt_set_error(DT_ERR_CORRUPT, "%s: section %u has an empty or unterminated name", name, i);
      goto fail;
    }
    uint64_t off = dt__get64(e + 64), sl = dt__get64(e + 72);
    if (off < table_end || off > len || sl > len - off) {
      rc = dt_set_error(DT_ERR_CORRUPT, "%s: section \"%s\" (offset %llu, %llu bytes) outside the "
                        "%zu-byte file", name, nm, (unsigned long long)off, (unsigned long long)sl, len);
      goto fail;
    }
    for (uint32_t j = 0; j < i; j++)
      if (!strcmp(nm, (const char *)(u + CK_HDR + (size_t)j * CK_ENT))) {
        rc = dt_set_error(DT_ERR_CORRUPT, "%s: duplicate section \"%s\"", name, nm);
        goto fail;
      }
    uint32_t want = dt__get32(e + 80), got = dt_crc32c(0, u + off, (size_t)sl);
    if (want != got) {
      rc = dt_set_error(DT_ERR_CORRUPT, "%s: section \"%s\" (offset %llu, %llu bytes): CRC32C 0x%08x "
                        "!= stored 0x%08x", name, nm, (unsigned long long)off, (unsigned long long)sl,
                        got, want);
      goto fail;
    }
    sp[i] = (ck_span){off, off + sl, i};
    if (!strcmp(nm, CK_META)) {
      meta_idx = (int)i;
      continue;
    }
    dt_ckpt_section *s = &c->sec[c->nsec++];
    s->name = nm;
    s->data = u + off;
    s->nbytes = sl;
    s->crc32c = got;
  }
  qsort(sp, ns, sizeof *sp, cmp_ck_span);
  for (uint32_t i = 1; i < ns; i++)
    if (sp[i].b < sp[i - 1].e) {
      rc = dt_set_error(DT_ERR_CORRUPT, "%s: sections \"%s\" and \"%s\" overlap", name,
                        (const char *)(u + CK_HDR + (size_t)sp[i - 1].i * CK_ENT),
                        (const char *)(u + CK_HDR + (size_t)sp[i].i * CK_ENT));
      goto fail;
    }
  /* Padding between and after sections must be zero: then a flipped bit anywhere in the file is
   * caught (by a CRC or here), not only inside sections. */
  for (uint32_t i = 0; i <= ns; i++) {
    uint64_t from = i ? sp[i - 1].e : table_end, to = i < ns ? sp[i].b : len;
    for (uint64_t k = from; k < to; k++)
      if (u[k]) {
        rc = dt_set_error(DT_ERR_CORRUPT, "%s: non-zero padding byte at offset %llu", name,
                          (unsigned long long)k);
        goto fail;
      }
  }
  if (meta_idx < 0) {
    rc = dt_set_error(DT_ERR_CORRUPT, "%s: no \"meta\" section", name);
    goto fail;
  }
  const uint8_t *me = u + CK_HDR + (size_t)meta_idx * CK_ENT;
  DT_CHECK_GOTO(decode_meta(c, u + dt__get64(me + 64), dt__get64(me + 72), name), rc, fail);
  dt__free(sp);
  *out = c;
  return DT_OK;
fail:
  dt__free(sp);
  dt_ckpt_destroy(c);
  return rc;
}

/* "ckpt-<digits>.dtc" -> step. */
static int parse_ckpt_name(const char *nm, uint64_t *step) {
  if (strncmp(nm, "ckpt-", 5) != 0)
    return 0;
  const char *p = nm + 5;
  uint64_t v = 0;
  int digits = 0;
  while (*p >= '0' && *p <= '9') {
    if (v > (UINT64_MAX - 9) / 10)
      return 0;
    v = v * 10 + (uint64_t)(*p++ - '0');
    digits++;
  }
  if (!digits || strcmp(p, ".dtc") != 0)
    return 0;
  *step = v;
  return 1;
}

dt_status dt_ckpt_parse(const void *buf, size_t n, const char *name, dt_ckpt **out) {
  if (!out)
    return dt_set_error(DT_ERR_INVALID, "dt_ckpt_parse: out is NULL");
  *out = NULL;
  void *b;
  DT_CHECK(dt__ckpt_copy_buffer(buf, n, &name, &b));
  return parse_owned(b, n, name, out);
}

dt_status dt_ckpt_open(const char *path, dt_ckpt **out) {
  if (!out || !path)
    return dt_set_error(DT_ERR_INVALID, "dt_ckpt_open: NULL argument");
  *out = NULL;
  void *buf;
  size_t n;
  DT_CHECK(dt__ckpt_read_file(path, &buf, &n));
  DT_CHECK(parse_owned(buf, n, path, out));
  /* a file renamed or copied over another step's name would resume from the wrong place */
  const char *base = strrchr(path, '/');
  uint64_t named;
  if (parse_ckpt_name(base ? base + 1 : path, &named) && named != (*out)->step) {
    dt_status rc = dt_set_error(DT_ERR_CORRUPT, "%s: holds step %llu, but its name says step %llu "
                                "(renamed or copied?)", path, (unsigned long long)(*out)->step,
                                (unsigned long long)named);
    dt_ckpt_destroy(*out);
    *out = NULL;
    return rc;
  }
  return DT_OK;
}

/* ---- directories -------------------------------------------------------------------------- */

/* A checkpoint file as found in a directory: the step its name gives, and the name itself
 * (which need not be the 9-digit one this code writes: ckpt-50.dtc is step 50 too). */
typedef struct ck_file {
  uint64_t step;
  char name[256];
} ck_file;

static int cmp_ck_file(const void *a, const void *b) {
  const ck_file *x = a, *y = b;
  return x->step < y->step ? -1 : x->step > y->step ? 1 : strcmp(x->name, y->name);
}

static void ckpt_path(const char *dir, const char *name, char *buf, size_t cap) {
  snprintf(buf, cap, "%s/%s", dir, name);
}

/* Lists checkpoint files (ascending by step) and removes temp files whose writer process is
 * gone. */
static dt_status scan_dir(const char *dir, ck_file **files, size_t *n) {
  *files = NULL;
  *n = 0;
  DIR *d = opendir(dir);
  if (!d)
    return dt__errno(errno == ENOENT ? DT_ERR_NOT_FOUND : DT_ERR_IO, "checkpoint directory %s", dir);
  size_t cap = 0;
  struct dirent *de;
  dt_status rc = DT_OK;
  while ((de = readdir(d))) {
    uint64_t s;
    long pid;
    if (parse_ckpt_name(de->d_name, &s) && strlen(de->d_name) < sizeof (*files)->name) {
      if (*n == cap) {
        cap = cap ? cap * 2 : 16;
        ck_file *nf = dt__realloc(*files, cap * sizeof *nf);
        if (!nf) {
          rc = dt__error_prefix(DT_ERR_NOMEM, "listing %s", dir);
          break;
        }
        *files = nf;
      }
      (*files)[*n].step = s;
      snprintf((*files)[*n].name, sizeof (*files)->name, "%s", de->d_name);
      (*n)++;
    } else if (dt__afile_is_temp(de->d_name, &pid) && strstr(de->d_name, ".dtc.tmp.")) {
      /* A writer that died mid-write leaves its temp file; a live one (ours or another's) may
       * still be writing, so only the dead one's is removed. */
      if (pid != (long)getpid() && kill((pid_t)pid, 0) != 0 && errno == ESRCH) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (unlink(p) == 0)
          DT_LOG_WARN("removed %s: a checkpoint write that never finished (its writer, pid %ld, is gone)", p, pid);
      }
    }
  }
  closedir(d);
  if (rc != DT_OK) {
    dt__free(*files);
    *files = NULL;
    *n = 0;
    return rc;
  }
  if (*n)
    qsort(*files, *n, sizeof **files, cmp_ck_file);
  return DT_OK;
}

dt_status dt_ckpt_list(const char *dir, uint64_t **steps, size_t *n) {
  if (!dir || !steps || !n)
    return dt_set_error(DT_ERR_INVALID, "dt_ckpt_list: NULL argument");
  ck_file *f;
  DT_CHECK(scan_dir(dir, &f, n));
  *steps = dt__alloc((*n ? *n : 1) * sizeof **steps);
  if (!*steps) {
    dt__free(f);
    return dt__error_prefix(DT_ERR_NOMEM, "listing %s", dir);
  }
  for (size_t i = 0; i < *n; i++)
    (*steps)[i] = f[i].step;
  dt__free(f);
  return DT_OK;
}

dt_status dt_ckpt_list_paths(const char *dir, char ***paths, size_t *n) {
  if (!dir || !paths || !n)
    return dt_set_error(DT_ERR_INVALID, "dt_ckpt_list_paths: NULL argument");
  *paths = NULL;
  ck_file *f;
  DT_CHECK(scan_dir(dir, &f, n));
  size_t dl = strlen(dir), bytes = (*n ? *n : 1) * sizeof(char *);
  for (size_t i = 0; i < *n; i++)
    bytes += dl + strlen(f[i].name) + 2;
  char **p = dt__alloc(bytes);
  if (!p) {
    dt__free(f);
    return dt__error_prefix(DT_ERR_NOMEM, "listing %s", dir);
  }
  char *s = (char *)(p + (*n ? *n : 1));
  for (size_t i = 0; i < *n; i++) {
    p[i] = s;
    s += sprintf(s, "%s/%s", dir, f[i].name) + 1;
  }
  dt__free(f);
  *paths = p;
  return DT_OK;
}

dt_status dt_ckpt_save(const char *dir, uint64_t step, const dt_ckpt_section *sections, size_t n,
                       const dt_kv *meta, size_t nmeta, int keep_last, char *path_out,
                       size_t path_cap) {
  if (!dir)
    return dt_set_error(DT_ERR_INVALID, "dt_ckpt_save: NULL directory");
  if (keep_last < 0)
    return dt_set_error(DT_ERR_INVALID, "checkpoint keep_last %d must be >= 0", keep_last);
  if (!keep_last)
    keep_last = DT_CKPT_DEFAULT_KEEP;
  if (mkdir(dir, 0755) != 0 && errno != EEXIST)
    return dt__errno(DT_ERR_IO, "cannot create checkpoint directory %s", dir);
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/ckpt-%09llu.dtc", dir, (unsigned long long)step);
  DT_CHECK(dt_ckpt_write(path, step, sections, n, meta, nmeta));
  if (path_out && path_cap)
    snprintf(path_out, path_cap, "%s", path);
  /* Prune only now that the new file is durable; never the one just written. */
  ck_file *files;
  size_t ns;
  if (scan_dir(dir, &files, &ns) != DT_OK) {
    DT_LOG_WARN("checkpoint %s written, but pruning %s failed: %s", path, dir, dt_last_error());
    return DT_OK;
  }
  size_t kept = 0;
  for (size_t i = ns; i-- > 0;) {
    if (!strcmp(files[i].name, strrchr(path, '/') + 1) || kept < (size_t)keep_last) {
      kept++;
      continue;
    }
    char old[PATH_MAX];
    ckpt_path(dir, files[i].name, old, sizeof old);
    if (unlink(old) != 0 && errno != ENOENT)
      DT_LOG_WARN("cannot remove old checkpoint %s: %s", old, strerror(errno));
  }
  dt__free(files);
  return DT_OK;
}

dt_status dt_ckpt_open_latest(const char *dir, dt_ckpt **out) {
  if (!dir || !out)
    return dt_set_error(DT_ERR_INVALID, "dt_ckpt_open_latest: NULL argument");
  *out = NULL;
  ck_file *files;
  size_t ns;
  DT_CHECK(scan_dir(dir, &files, &ns));
  if (!ns) {
    dt__free(files);
    return dt_set_error(DT_ERR_NOT_FOUND, "no checkpoint (ckpt-*.dtc) in %s", dir);
  }
  /* Skip notes accumulate here; bounded because each line is bounded by the error detail size. */
  size_t cap = 0, used = 0;
  char *notes = NULL;
  dt_status rc = DT_ERR_CORRUPT;
  for (size_t i = ns; i-- > 0;) {
    char path[PATH_MAX];
    ckpt_path(dir, files[i].name, path, sizeof path);
    dt_ckpt *c;
    dt_status r = dt_ckpt_open(path, &c);
    if (r == DT_OK) {
      if (used) {
        DT_LOG_WARN("resuming from %s (step %llu) instead", path, (unsigned long long)files[i].step);
        c->skipped = notes;
        notes = NULL;
      }
      *out = c;
      rc = DT_OK;
      break;
    }
    if (r == DT_ERR_NOMEM) {
      rc = r;
      break;
    }
    const char *why = dt_last_error();
    DT_LOG_WARN("skipping checkpoint %s: %s", path, why);
    size_t need = strlen(why) + 3;
    if (used + need + 1 > cap) {
      size_t nc = DT_MAX(cap * 2, used + need + 256);
      char *nn = dt__realloc(notes, nc);
      if (!nn) {
        rc = dt__error_prefix(DT_ERR_NOMEM, "checkpoint notes");
        break;
      }
      notes = nn;
      cap = nc;
    }
    used += (size_t)snprintf(notes + used, cap - used, "%s%s", used ? "; " : "", why);
  }
  if (rc == DT_ERR_CORRUPT)
    dt_set_error(DT_ERR_CORRUPT, "no valid checkpoint in %s: %.800s", dir, notes ? notes : "");
  dt__free(notes);
  dt__free(files);
  return rc;
}

uint64_t dt_ckpt_step(const dt_ckpt *c) { return c ? c->step : 0; }
const char *dt_ckpt_path(const dt_ckpt *c) { return c ? c->path : NULL; }
uint32_t dt_ckpt_version(const dt_ckpt *c) { return c ? c->version : 0; }
const char *dt_ckpt_skipped(const dt_ckpt *c) { return c && c->skipped ? c->skipped : ""; }
size_t dt_ckpt_count(const dt_ckpt *c) { return c ? c->nsec : 0; }

const dt_ckpt_section *dt_ckpt_section_at(const dt_ckpt *c, size_t i) {
  return c && i < c->nsec ? &c->sec[i] : NULL;
}

const dt_ckpt_section *dt_ckpt_find(const dt_ckpt *c, const char *name) {
  for (size_t i = 0; c && name && i < c->nsec; i++)
    if (!strcmp(c->sec[i].name, name))
      return &c->sec[i];
  return NULL;
}

size_t dt_ckpt_meta_count(const dt_ckpt *c) { return c ? c->nmeta : 0; }

const dt_kv *dt_ckpt_meta_at(const dt_ckpt *c, size_t i) {
  return c && i < c->nmeta ? &c->meta[i] : NULL;
}

const char *dt_ckpt_meta_get(const dt_ckpt *c, const char *key) {
  for (size_t i = 0; c && key && i < c->nmeta; i++)
    if (!strcmp(c->meta[i].key, key))
      return c->meta[i].value;
  return NULL;
}

dt_status dt_ckpt_meta_u64(const dt_ckpt *c, const char *key, uint64_t *out) {
  const char *v = dt_ckpt_meta_get(c, key);
  if (!v)
    return dt_set_error(DT_ERR_NOT_FOUND, "%s: no meta key \"%s\"", c ? c->path : "(null)",
                        key ? key : "(null)");
  char *end;
  errno = 0;
  if (*v < '0' || *v > '9')
    return dt_set_error(DT_ERR_CORRUPT, "%s: meta \"%s\" = \"%.40s\" is not an unsigned integer",
                        c->path, key, v);
  unsigned long long x = strtoull(v, &end, 10);
  if (errno || *end)
    return dt_set_error(DT_ERR_CORRUPT, "%s: meta \"%s\" = \"%.40s\" is not an unsigned integer",
                        c->path, key, v);
  *out = x;
  return DT_OK;
}

void dt_ckpt_destroy(dt_ckpt *c) {
  if (!c)
    return;
  dt__free(c->buf);
  dt__free(c->path);
  dt__free(c->sec);
  dt__free(c->meta);
  dt__free(c->meta_strings);
  dt__free(c->skipped);
  dt__free(c);
}
