/* safetensors.c - safetensors writer and strict reader.
 *
 * Layout: u64 little-endian N, N bytes of UTF-8 JSON (an object; the writer pads it with spaces
 * so 8 + N is a multiple of 8), then the byte buffer the tensors' data_offsets index into.
 * The reader has its own small JSON parser for exactly this grammar: a top-level object whose
 * members are tensor objects {"dtype": str, "shape": [uint...], "data_offsets": [uint, uint]}
 * or "__metadata__": {str: str}. Nesting is therefore bounded (depth 3), every string is
 * checked for valid UTF-8 and escapes, numbers must be plain non-negative integers, duplicate
 * keys are refused, and offsets must tile the buffer exactly (no overlap, no gap, no slack), as
 * the reference implementation requires. It does not memory-map: the file is read whole. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_internal.h"
#include "core/core.h"
#include "dtrain/ckpt.h"

static const struct {
  const char *name;
  size_t size;
} st_types[DT_ST_DTYPE_COUNT] = {
    [DT_ST_BOOL] = {"BOOL", 1},       [DT_ST_U8] = {"U8", 1},     [DT_ST_I8] = {"I8", 1},
    [DT_ST_F8_E5M2] = {"F8_E5M2", 1}, [DT_ST_F8_E4M3] = {"F8_E4M3", 1},
    [DT_ST_I16] = {"I16", 2},         [DT_ST_U16] = {"U16", 2},   [DT_ST_F16] = {"F16", 2},
    [DT_ST_BF16] = {"BF16", 2},       [DT_ST_I32] = {"I32", 4},   [DT_ST_U32] = {"U32", 4},
    [DT_ST_F32] = {"F32", 4},         [DT_ST_F64] = {"F64", 8},   [DT_ST_I64] = {"I64", 8},
    [DT_ST_U64] = {"U64", 8},
};

const char *dt_st_dtype_name(dt_st_dtype t) {
  return (unsigned)t < DT_ST_DTYPE_COUNT ? st_types[t].name : NULL;
}

size_t dt_st_dtype_size(dt_st_dtype t) {
  return (unsigned)t < DT_ST_DTYPE_COUNT ? st_types[t].size : 0;
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 if invalid (overlong, surrogate, > U+10FFFF). */
static int utf8_len(const unsigned char *s, size_t left) {
  unsigned c = s[0];
  if (c < 0x80)
    return 1;
  int n;
  unsigned min, cp;
  if ((c & 0xE0) == 0xC0) {
    n = 2, min = 0x80, cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3, min = 0x800, cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4, min = 0x10000, cp = c & 0x07;
  } else {
    return 0;
  }
  if ((size_t)n > left)
    return 0;
  for (int i = 1; i < n; i++) {
    if ((s[i] & 0xC0) != 0x80)
      return 0;
    cp = cp << 6 | (s[i] & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
    return 0;
  return n;
}

/* ---- writer ------------------------------------------------------------------------------- */

typedef struct sbuf {
  char *p;
  size_t len, cap;
  int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
  if (b->oom)
    return;
  if (b->len + n + 1 > b->cap) {
    size_t nc = DT_MAX(b->cap * 2, b->len + n + 256);
    char *np = dt__realloc(b->p, nc);
    if (!np) {
      b->oom = 1;
      return;
    }
    b->p = np;
    b->cap = nc;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
  char tmp[128];
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (k > 0)
    sb_put(b, tmp, (size_t)DT_MIN((size_t)k, sizeof tmp - 1));
}

/* Appends s as a JSON string; DT_ERR_INVALID if s is not valid UTF-8. */
static dt_status sb_json_str(sbuf *b, const char *s, const char *what) {
  sb_put(b, "\"", 1);
  const unsigned char *u = (const unsigned char *)s;
  size_t left = strlen(s);
  while (left) {
    unsigned c = *u;
    if (c == '"' || c == '\\') {
      char e[2] = {'\\', (char)c};
      sb_put(b, e, 2);
    } else if (c < 0x20) {
      /* The short escapes where JSON has them (as Python's json.dumps writes), else \u00XX. */
      const char *shortesc = c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r"
                           : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
      if (shortesc)
        sb_put(b, shortesc, 2);
      else
        sb_printf(b, "\\u%04x", c);
    } else if (c >= 0x80) {
      int n = utf8_len(u, left);
      if (!n)
        return dt_set_error(DT_ERR_INVALID, "%s \"%s\" is not valid UTF-8", what, s);
      sb_put(b, (const char *)u, (size_t)n);
      u += n;
      left -= (size_t)n;
      continue;
    } else {
      sb_put(b, (const char *)u, 1);
    }
    u++;
    left--;
  }
  sb_put(b, "\"", 1);
  return DT_OK;
}

dt_status dt_safetensors_write(const char *path, const dt_tensor_view *t, size_t n,
                               const dt_kv *meta, size_t nmeta) {
  if (!path || (n && !t) || (nmeta && !meta))
    return dt_set_error(DT_ERR_INVALID, "dt_safetensors_write: NULL argument");
  sbuf h = {0};
  dt_status rc = DT_OK;
  dt__afile f;
  f.fd = -1;
  f.tmp[0] = '\0';
  sb_put(&h, "{", 1);
  int first = 1;
  if (nmeta) {
    sb_put(&h, "\"__metadata__\":{", 16);
    for (size_t i = 0; i < nmeta; i++) {
      if (!meta[i].key || !meta[i].value) {
        rc = dt_set_error(DT_ERR_INVALID, "%s: metadata entry %zu has a NULL key or value", path, i);
        goto fail;
      }
      for (size_t j = 0; j < i; j++)
        if (!strcmp(meta[i].key, meta[j].key)) {
          rc = dt_set_error(DT_ERR_INVALID, "%s: duplicate metadata key \"%s\"", path, meta[i].key);
          goto fail;
        }
      if (i)
        sb_put(&h, ",", 1);
      DT_CHECK_GOTO(sb_json_str(&h, meta[i].key, "metadata key"), rc, fail);
      sb_put(&h, ":", 1);
      DT_CHECK_GOTO(sb_json_str(&h, meta[i].value, "metadata value"), rc, fail);
    }
    sb_put(&h, "}", 1);
    first = 0;
  }
  uint64_t off = 0;
  for (size_t i = 0; i < n; i++) {
    const dt_tensor_view *v = &t[i];
    size_t esz = dt_st_dtype_size(v->dtype);
    if (!v->name || !esz || v->ndim < 0 || v->ndim > DT_ST_MAX_DIMS || (v->nbytes && !v->data)) {
      rc = dt_set_error(DT_ERR_INVALID, "%s: tensor %zu (%s): bad name, dtype %d, rank %d or data",
                        path, i, v->name ? v->name : "NULL", (int)v->dtype, v->ndim);
      goto fail;
    }
    if (!strcmp(v->name, "__metadata__")) {
      rc = dt_set_error(DT_ERR_INVALID, "%s: \"__metadata__\" is reserved, not a tensor name", path);
      goto fail;
    }
    uint64_t count = 1;
    for (int d = 0; d < v->ndim; d++) {
      if (v->shape[d] && count > UINT64_MAX / v->shape[d] / esz) {
        rc = dt_set_error(DT_ERR_INVALID, "%s: tensor \"%s\": shape overflows", path, v->name);
        goto fail;
      }
      count *= v->shape[d];
    }
    if (count * esz != v->nbytes) {
      rc = dt_set_error(DT_ERR_INVALID, "%s: tensor \"%s\": shape gives %llu bytes of %s but nbytes is %llu",
                        path, v->name, (unsigned long long)(count * esz), st_types[v->dtype].name,
                        (unsigned long long)v->nbytes);
      goto fail;
    }
    for (size_t j = 0; j < i; j++)
      if (!strcmp(v->name, t[j].name)) {
        rc = dt_set_error(DT_ERR_INVALID, "%s: duplicate tensor name \"%s\"", path, v->name);
        goto fail;
      }
    if (!first)
      sb_put(&h, ",", 1);
    first = 0;
    DT_CHECK_GOTO(sb_json_str(&h, v->name, "tensor name"), rc, fail);
    sb_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", st_types[v->dtype].name);
    for (int d = 0; d < v->ndim; d++)
      sb_printf(&h, "%s%llu", d ? "," : "", (unsigned long long)v->shape[d]);
    sb_printf(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
              (unsigned long long)(off + v->nbytes));
    off += v->nbytes;
  }
  sb_put(&h, "}", 1);
  /* Pad with spaces (the spec's allowed trailing whitespace) so the data starts 8-aligned. */
  while ((8 + h.len) % 8 && !h.oom)
    sb_put(&h, " ", 1);
  if (h.oom) {
    rc = dt__error_prefix(DT_ERR_NOMEM, "%s: header buffer", path);
    goto fail;
  }
  uint8_t len8[8];
  for (int i = 0; i < 8; i++)
    len8[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
  DT_CHECK_GOTO(dt__afile_open(&f, path), rc, fail);
  DT_CHECK_GOTO(dt__afile_write(&f, len8, 8), rc, fail);
  DT_CHECK_GOTO(dt__afile_write(&f, h.p, h.len), rc, fail);
  for (size_t i = 0; i < n; i++)
    DT_CHECK_GOTO(dt__afile_write(&f, t[i].data, (size_t)t[i].nbytes), rc, fail);
  DT_CHECK_GOTO(dt__afile_commit(&f), rc, fail);
  dt__free(h.p);
  return DT_OK;
fail:
  dt__afile_abort(&f);
  dt__free(h.p);
  return rc;
}

/* ---- reader ------------------------------------------------------------------------------- */

struct dt_safetensors {
  char *buf;              /* the whole file (owned) */
  size_t len;
  uint64_t header_len;
  char *strings;          /* decoded JSON strings (arena, owned) */
  dt_tensor_view *t;
  size_t n, cap;
  dt_kv *meta;
  size_t nmeta, meta_cap;
};

typedef struct jp {
  const char *name;       /* file name for messages */
  const char *s, *p, *end;
  char *arena;            /* decoded strings go here; never longer than their encoding */
  size_t arena_used;
} jp;

#define JERR(j, ...) jerr(j, __VA_ARGS__)
static dt_status jerr(jp *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static dt_status jerr(jp *j, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return dt_set_error(DT_ERR_CORRUPT, "%s: JSON header at byte %zu: %s", j->name,
                      (size_t)(j->p - j->s), msg);
}

static void jws(jp *j) {
  while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
    j->p++;
}

static dt_status jexpect(jp *j, char c) {
  jws(j);
  if (j->p >= j->end)
    return JERR(j, "expected '%c' but the header ends", c);
  if (*j->p != c)
    return JERR(j, "expected '%c', found '%c'", c, *j->p);
  j->p++;
  return DT_OK;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

static dt_status jhex4(jp *j, unsigned *out) {
  if (j->end - j->p < 4)
    return JERR(j, "truncated \\u escape");
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    int h = hexval(j->p[i]);
    if (h < 0)
      return JERR(j, "bad hex digit in \\u escape");
    v = v << 4 | (unsigned)h;
  }
  j->p += 4;
  *out = v;
  return DT_OK;
}

/* Parses a JSON string into the arena; *out points at the NUL-terminated decoded text. Strings
 * with an embedded NUL (\u0000) are refused: names and metadata are C strings here. */
static dt_status jstring(jp *j, const char **out) {
  jws(j);
  if (j->p >= j->end || *j->p != '"')
    return JERR(j, "expected a string");
  j->p++;
  char *o = j->arena + j->arena_used, *start = o;
  for (;;) {
    if (j->p >= j->end)
      return JERR(j, "unterminated string");
    unsigned char c = (unsigned char)*j->p;
    if (c == '"') {
      j->p++;
      break;
    }
    if (c < 0x20)
      return JERR(j, "control character 0x%02x in a string", c);
    if (c == '\\') {
      j->p++;
      if (j->p >= j->end)
        return JERR(j, "unterminated escape");
      char e = *j->p++;
      switch (e) {
      case '"': *o++ = '"'; break;
      case '\\': *o++ = '\\'; break;
      case '/': *o++ = '/'; break;
      case 'b': *o++ = '\b'; break;
      case 'f': *o++ = '\f'; break;
      case 'n': *o++ = '\n'; break;
      case 'r': *o++ = '\r'; break;
      case 't': *o++ = '\t'; break;
      case 'u': {
        unsigned cp;
        DT_CHECK(jhex4(j, &cp));
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          unsigned lo;
          if (j->end - j->p < 2 || j->p[0] != '\\' || j->p[1] != 'u')
            return JERR(j, "lone high surrogate \\u%04x", cp);
          j->p += 2;
          DT_CHECK(jhex4(j, &lo));
          if (lo < 0xDC00 || lo > 0xDFFF)
            return JERR(j, "high surrogate \\u%04x not followed by a low one", cp);
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
          return JERR(j, "lone low surrogate \\u%04x", cp);
        }
        if (cp == 0)
          return JERR(j, "\\u0000 in a string");
        /* UTF-8 of cp is at most 4 bytes; its escape was at least 6: the arena cannot overflow. */
        if (cp < 0x80) {
          *o++ = (char)cp;
        } else if (cp < 0x800) {
          *o++ = (char)(0xC0 | cp >> 6);
          *o++ = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
          *o++ = (char)(0xE0 | cp >> 12);
          *o++ = (char)(0x80 | (cp >> 6 & 0x3F));
          *o++ = (char)(0x80 | (cp & 0x3F));
        } else {
          *o++ = (char)(0xF0 | cp >> 18);
          *o++ = (char)(0x80 | (cp >> 12 & 0x3F));
          *o++ = (char)(0x80 | (cp >> 6 & 0x3F));
          *o++ = (char)(0x80 | (cp & 0x3F));
        }
        break;
      }
      default:
        return JERR(j, "bad escape '\\%c'", e);
      }
      continue;
    }
    int n = utf8_len((const unsigned char *)j->p, (size_t)(j->end - j->p));
    if (!n)
      return JERR(j, "invalid UTF-8 in a string");
    memcpy(o, j->p, (size_t)n);
    o += n;
    j->p += n;
  }
  *o++ = '\0';
  j->arena_used += (size_t)(o - start);
  *out = start;
  return DT_OK;
}

/* A non-negative integer without sign, fraction or exponent (JSON allows those, shapes don't). */
static dt_status juint(jp *j, uint64_t *out, const char *what) {
  jws(j);
  if (j->p >= j->end || *j->p < '0' || *j->p > '9')
    return JERR(j, "%s must be a non-negative integer", what);
  if (*j->p == '0' && j->p + 1 < j->end && j->p[1] >= '0' && j->p[1] <= '9')
    return JERR(j, "%s has a leading zero", what);
  uint64_t v = 0;
  while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
    unsigned d = (unsigned)(*j->p - '0');
    if (v > (UINT64_MAX - d) / 10)
      return JERR(j, "%s overflows 64 bits", what);
    v = v * 10 + d;
    j->p++;
  }
  if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E'))
    return JERR(j, "%s must be an integer", what);
  *out = v;
  return DT_OK;
}

static int jpeek(jp *j) {
  jws(j);
  return j->p < j->end ? (unsigned char)*j->p : -1;
}

static dt_status add_meta(dt_safetensors *f, const char *k, const char *v) {
  if (f->nmeta == f->meta_cap) {
    size_t nc = f->meta_cap ? f->meta_cap * 2 : 8;
    dt_kv *nm = dt__realloc(f->meta, nc * sizeof *nm);
    if (!nm)
      return dt__error_prefix(DT_ERR_NOMEM, "safetensors metadata");
    f->meta = nm;
    f->meta_cap = nc;
  }
  f->meta[f->nmeta].key = k;
  f->meta[f->nmeta].value = v;
  f->nmeta++;
  return DT_OK;
}

static dt_status parse_metadata(jp *j, dt_safetensors *f) {
  DT_CHECK(jexpect(j, '{'));
  if (jpeek(j) == '}') {
    j->p++;
    return DT_OK;
  }
  for (;;) {
    const char *k, *v;
    DT_CHECK(jstring(j, &k));
    DT_CHECK(jexpect(j, ':'));
    if (jpeek(j) != '"')
      return JERR(j, "__metadata__ value of \"%s\" is not a string (the spec allows only strings)", k);
    DT_CHECK(jstring(j, &v));
    for (size_t i = 0; i < f->nmeta; i++)
      if (!strcmp(f->meta[i].key, k))
        return JERR(j, "duplicate __metadata__ key \"%s\"", k);
    DT_CHECK(add_meta(f, k, v));
    int c = jpeek(j);
    if (c == ',') {
      j->p++;
      continue;
    }
    if (c == '}') {
      j->p++;
      return DT_OK;
    }
    return JERR(j, "expected ',' or '}' in __metadata__");
  }
}

/* Parses {"dtype":..,"shape":[..],"data_offsets":[b,e]} in any key order into v (offsets in
 * shape[]-free temporaries b/e). */
static dt_status parse_tensor(jp *j, dt_tensor_view *v, uint64_t *b, uint64_t *e) {
  int have_dtype = 0, have_shape = 0, have_off = 0;
  DT_CHECK(jexpect(j, '{'));
  if (jpeek(j) == '}')
    return JERR(j, "tensor \"%s\" has no dtype, shape or data_offsets", v->name);
  for (;;) {
    const char *k;
    DT_CHECK(jstring(j, &k));
    DT_CHECK(jexpect(j, ':'));
    if (!strcmp(k, "dtype")) {
      if (have_dtype++)
        return JERR(j, "tensor \"%s\": duplicate dtype", v->name);
      const char *d;
      if (jpeek(j) != '"')
        return JERR(j, "tensor \"%s\": dtype is not a string", v->name);
      DT_CHECK(jstring(j, &d));
      int found = -1;
      for (int i = 0; i < DT_ST_DTYPE_COUNT; i++)
        if (!strcmp(d, st_types[i].name))
          found = i;
      if (found < 0)
        return dt_set_error(DT_ERR_UNSUPPORTED, "%s: tensor \"%s\": dtype \"%.32s\" is not supported",
                            j->name, v->name, d);
      v->dtype = (dt_st_dtype)found;
    } else if (!strcmp(k, "shape")) {
      if (have_shape++)
        return JERR(j, "tensor \"%s\": duplicate shape", v->name);
      DT_CHECK(jexpect(j, '['));
      v->ndim = 0;
      if (jpeek(j) == ']') {
        j->p++;
      } else {
        for (;;) {
          if (v->ndim == DT_ST_MAX_DIMS)
            return JERR(j, "tensor \"%s\": more than %d dimensions", v->name, DT_ST_MAX_DIMS);
          DT_CHECK(juint(j, &v->shape[v->ndim], "a shape entry"));
          v->ndim++;
          int c = jpeek(j);
          if (c == ',') {
            j->p++;
            continue;
          }
          if (c == ']') {
            j->p++;
            break;
          }
          return JERR(j, "tensor \"%s\": expected ',' or ']' in shape", v->name);
        }
      }
    } else if (!strcmp(k, "data_offsets")) {
      if (have_off++)
        return JERR(j, "tensor \"%s\": duplicate data_offsets", v->name);
      DT_CHECK(jexpect(j, '['));
      DT_CHECK(juint(j, b, "data_offsets[0]"));
      DT_CHECK(jexpect(j, ','));
      DT_CHECK(juint(j, e, "data_offsets[1]"));
      if (jpeek(j) != ']')
        return JERR(j, "tensor \"%s\": data_offsets must hold exactly 2 integers", v->name);
      j->p++;
    } else {
      return JERR(j, "tensor \"%s\": unknown field \"%.32s\" (expected dtype, shape, data_offsets)",
                  v->name, k);
    }
    int c = jpeek(j);
    if (c == ',') {
      j->p++;
      continue;
    }
    if (c == '}') {
      j->p++;
      break;
    }
    return JERR(j, "tensor \"%s\": expected ',' or '}'", v->name);
  }
  if (!have_dtype || !have_shape || !have_off)
    return JERR(j, "tensor \"%s\" lacks %s", v->name,
                !have_dtype ? "dtype" : !have_shape ? "shape" : "data_offsets");
  return DT_OK;
}

typedef struct span {
  uint64_t b, e;
  size_t i;
} span;

static int cmp_span(const void *a, const void *b) {
  const span *x = a, *y = b;
  if (x->b != y->b)
    return x->b < y->b ? -1 : 1;
  if (x->e != y->e)
    return x->e < y->e ? -1 : 1;
  return 0;
}

static int cmp_name(const void *a, const void *b) {
  const dt_tensor_view *const *x = a, *const *y = b;
  return strcmp((*x)->name, (*y)->name);
}

/* Parses owned (len bytes, from dt__alloc), which the handle keeps: freed with it, or here on
 * failure. dt_safetensors_open hands over the file it read: one copy of the file in memory. */
static dt_status st_parse_take(void *owned, size_t len, const char *name, dt_safetensors **out) {
  dt_safetensors *f = dt__calloc(sizeof *f);
  if (!f) {
    dt__free(owned);
    return dt__error_prefix(DT_ERR_NOMEM, "%s: safetensors handle", name);
  }
  f->buf = owned;
  f->len = len;
  dt_status rc;
  span *sp = NULL;
  const dt_tensor_view **by_name = NULL;
  const uint8_t *u = (const uint8_t *)f->buf;
  if (len < 8) {
    rc = dt_set_error(DT_ERR_CORRUPT, "%s: %zu bytes, too short for a safetensors file (8-byte "
                      "header length)", name, len);
    goto fail;
  }
  uint64_t hl = 0;
  for (int i = 0; i < 8; i++)
    hl |= (uint64_t)u[i] << (8 * i);
  if (len >= 8 && !memcmp(u, "DTRCKPT\n", 8)) { /* ckpt.c's magic: a checkpoint given for a model */
    rc = dt_set_error(DT_ERR_CORRUPT, "%s is a dtrain checkpoint, not a safetensors model file (dtrain inspect "
                      "shows what it holds; a run writes its model to --out DIR/model.safetensors)", name);
    goto fail;
  }
  if (hl > DT_ST_MAX_HEADER) {
    rc = dt_set_error(DT_ERR_CORRUPT, "%s: header length %llu exceeds the %llu-byte limit (not a "
                      "safetensors file?)", name, (unsigned long long)hl,
                      (unsigned long long)DT_ST_MAX_HEADER);
    goto fail;
  }
  if (hl > len - 8) {
    rc = dt_set_error(DT_ERR_CORRUPT, "%s: header length %llu but the file has only %zu bytes after "
                      "the length field (truncated?)", name, (unsigned long long)hl, len - 8);
    goto fail;
  }
  if (hl < 2 || f->buf[8] != '{') {
    rc = dt_set_error(DT_ERR_CORRUPT, "%s: the header must be a JSON object starting with '{'", name);
    goto fail;
  }
  f->header_len = hl;
  f->strings = dt__alloc((size_t)hl + 1);
  if (!f->strings) {
    rc = dt__error_prefix(DT_ERR_NOMEM, "%s: header strings", name);
    goto fail;
  }
  jp j = {.name = name, .s = f->buf + 8, .p = f->buf + 8, .end = f->buf + 8 + hl,
          .arena = f->strings};
  size_t ntens_cap = 0;
  uint64_t *offs = NULL; /* pairs (b, e) per tensor, grown with t */
  DT_CHECK_GOTO(jexpect(&j, '{'), rc, fail);
  int have_meta = 0;
  if (jpeek(&j) == '}') {
    j.p++;
  } else {
    for (;;) {
      const char *k;
      DT_CHECK_GOTO(jstring(&j, &k), rc, fail_offs);
      DT_CHECK_GOTO(jexpect(&j, ':'), rc, fail_offs);
      if (!strcmp(k, "__metadata__")) {
        if (have_meta++) {
          rc = JERR(&j, "duplicate __metadata__");
          goto fail_offs;
        }
        DT_CHECK_GOTO(parse_metadata(&j, f), rc, fail_offs);
      } else {
        if (f->n == ntens_cap) {
          size_t nc = ntens_cap ? ntens_cap * 2 : 16;
          dt_tensor_view *nt = dt__realloc(f->t, nc * sizeof *nt);
          if (nt)
            f->t = nt;
          uint64_t *no = nt ? dt__realloc(offs, nc * 2 * sizeof *no) : NULL;
          if (!nt || !no) {
            rc = dt__error_prefix(DT_ERR_NOMEM, "%s: tensor table", name);
            goto fail_offs;
          }
          offs = no;
          ntens_cap = nc;
        }
        dt_tensor_view *v = &f->t[f->n];
        memset(v, 0, sizeof *v);
        v->name = k;
        DT_CHECK_GOTO(parse_tensor(&j, v, &offs[2 * f->n], &offs[2 * f->n + 1]), rc, fail_offs);
        f->n++;
      }
      int c = jpeek(&j);
      if (c == ',') {
        j.p++;
        continue;
      }
      if (c == '}') {
        j.p++;
        break;
      }
      rc = JERR(&j, "expected ',' or '}' after a member of the top-level object");
      goto fail_offs;
    }
  }
  jws(&j);
  if (j.p != j.end) {
    rc = JERR(&j, "unexpected bytes after the JSON object (only whitespace may pad the header)");
    goto fail_offs;
  }
  /* Now the numbers: sizes, then the tiling of the data buffer. */
  uint64_t data_len = len - 8 - hl;
  const uint8_t *data = (const uint8_t *)f->buf + 8 + hl;
  sp = dt__alloc((f->n ? f->n : 1) * sizeof *sp);
  by_name = dt__alloc((f->n ? f->n : 1) * sizeof *by_name);
  if (!sp || !by_name) {
    rc = dt__error_prefix(DT_ERR_NOMEM, "%s: tensor index", name);
    goto fail_offs;
  }
  for (size_t i = 0; i < f->n; i++) {
    dt_tensor_view *v = &f->t[i];
    uint64_t b = offs[2 * i], e = offs[2 * i + 1], esz = st_types[v->dtype].size, cnt = 1;
    char shp[160] = "";
    size_t so = 0;
    int ovf = 0;
    for (int d = 0; d < v->ndim; d++) {
      if (so < sizeof shp)
        so += (size_t)snprintf(shp + so, sizeof shp - so, "%s%llu", d ? "," : "",
                               (unsigned long long)v->shape[d]);
      if (v->shape[d] && cnt > UINT64_MAX / v->shape[d])
        ovf = 1;
      else
        cnt *= v->shape[d];
    }
    if (!ovf && cnt > UINT64_MAX / esz)
      ovf = 1;
    if (e < b) {
      rc = dt_set_error(DT_ERR_CORRUPT, "%s: tensor \"%s\": data_offsets [%llu, %llu] end before they "
                        "begin", name, v->name, (unsigned long long)b, (unsigned long long)e);
      goto fail_offs;
    }
    if (ovf || cnt * esz != e - b) {
      rc = dt_set_error(DT_ERR_CORRUPT, "%s: tensor \"%s\": shape [%s] of %s needs %s%llu bytes but "
                        "data_offsets [%llu, %llu] span %llu", name, v->name, shp,
                        st_types[v->dtype].name, ovf ? "more than " : "",
                        ovf ? (unsigned long long)UINT64_MAX : (unsigned long long)(cnt * esz),
                        (unsigned long long)b, (unsigned long long)e, (unsigned long long)(e - b));
      goto fail_offs;
    }
    if (e > data_len) {
      rc = dt_set_error(DT_ERR_CORRUPT, "%s: tensor \"%s\": data_offsets [%llu, %llu] beyond the "
                        "%llu-byte data buffer (truncated file?)", name, v->name,
                        (unsigned long long)b, (unsigned long long)e, (unsigned long long)data_len);
      goto fail_offs;
    }
    v->data = data + b;
    v->nbytes = e - b;
    sp[i] = (span){b, e, i};
    by_name[i] = v;
  }
  qsort(by_name, f->n, sizeof *by_name, cmp_name);
  for (size_t i = 1; i < f->n; i++)
    if (!strcmp(by_name[i]->name, by_name[i - 1]->name)) {
      rc = dt_set_error(DT_ERR_CORRUPT, "%s: duplicate tensor name \"%s\"", name, by_name[i]->name);
      goto fail_offs;
    }
  qsort(sp, f->n, sizeof *sp, cmp_span);
  uint64_t at = 0;
  for (size_t i = 0; i < f->n; i++) {
    if (sp[i].b < at) {
      rc = dt_set_error(DT_ERR_CORRUPT, "%s: tensors \"%s\" and \"%s\" overlap (bytes %llu..%llu)", name,
                        f->t[sp[i - 1].i].name, f->t[sp[i].i].name, (unsigned long long)sp[i].b,
                        (unsigned long long)at);
      goto fail_offs;
    }
    if (sp[i].b > at) {
      rc = dt_set_error(DT_ERR_CORRUPT, "%s: gap of %llu unused bytes before tensor \"%s\" at offset %llu",
                        name, (unsigned long long)(sp[i].b - at), f->t[sp[i].i].name,
                        (unsigned long long)sp[i].b);
      goto fail_offs;
    }
    at = sp[i].e;
  }
  if (at != data_len) {
    rc = dt_set_error(DT_ERR_CORRUPT, "%s: tensors cover %llu bytes but %llu data bytes follow the "
                      "header (%llu trailing bytes)", name, (unsigned long long)at,
                      (unsigned long long)data_len, (unsigned long long)(data_len - at));
    goto fail_offs;
  }
  dt__free(offs);
  dt__free(sp);
  dt__free(by_name);
  *out = f;
  return DT_OK;
fail_offs:
  dt__free(offs);
fail:
  dt__free(sp);
  dt__free(by_name);
  dt_safetensors_destroy(f);
  return rc;
}

dt_status dt_safetensors_parse(const void *buf, size_t len, const char *name, dt_safetensors **out) {
  if (!out)
    return dt_set_error(DT_ERR_INVALID, "dt_safetensors_parse: out is NULL");
  *out = NULL;
  void *copy;
  DT_CHECK(dt__ckpt_copy_buffer(buf, len, &name, &copy));
  return st_parse_take(copy, len, name, out);
}

dt_status dt_safetensors_open(const char *path, dt_safetensors **out) {
  if (!out || !path)
    return dt_set_error(DT_ERR_INVALID, "dt_safetensors_open: NULL argument");
  *out = NULL;
  void *buf;
  size_t n;
  DT_CHECK(dt__ckpt_read_file(path, &buf, &n));
  return st_parse_take(buf, n, path, out);
}

size_t dt_safetensors_count(const dt_safetensors *f) { return f ? f->n : 0; }

const dt_tensor_view *dt_safetensors_tensor(const dt_safetensors *f, size_t i) {
  return f && i < f->n ? &f->t[i] : NULL;
}

const dt_tensor_view *dt_safetensors_find(const dt_safetensors *f, const char *name) {
  for (size_t i = 0; f && name && i < f->n; i++)
    if (!strcmp(f->t[i].name, name))
      return &f->t[i];
  return NULL;
}

size_t dt_safetensors_meta_count(const dt_safetensors *f) { return f ? f->nmeta : 0; }

const dt_kv *dt_safetensors_meta(const dt_safetensors *f, size_t i) {
  return f && i < f->nmeta ? &f->meta[i] : NULL;
}

const char *dt_safetensors_meta_get(const dt_safetensors *f, const char *key) {
  for (size_t i = 0; f && key && i < f->nmeta; i++)
    if (!strcmp(f->meta[i].key, key))
      return f->meta[i].value;
  return NULL;
}

uint64_t dt_safetensors_header_len(const dt_safetensors *f) { return f ? f->header_len : 0; }

void dt_safetensors_destroy(dt_safetensors *f) {
  if (!f)
    return;
  dt__free(f->buf);
  dt__free(f->strings);
  dt__free(f->t);
  dt__free(f->meta);
  dt__free(f);
}
