/* idx.c - IDX reader (the MNIST family's file format), gzip'd or raw.
 *
 * Layout (big-endian): magic 00 00 TT DD (TT element type, DD number of dimensions), DD u32
 * dimensions, then prod(dims) elements. Every header field is checked against the bytes really
 * there before anything large is allocated: a raw buffer's length is known; a gzip stream is
 * inflated in bounded chunks into a buffer that grows only as real data arrives, so a lying
 * header costs at most what the stream actually decodes to. Trailing bytes are an error.
 * It does not mmap or stream: the whole decoded array lives in memory (MNIST-sized sets). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/core.h"
#include "data/data_internal.h"
#include "dtrain/data.h"

/* Decoded bytes produced per inflate call at most: bounds the work done before a short or
 * lying stream is noticed and keeps the output buffer growth in steps. */
#define IDX_CHUNK (4u << 20)

typedef struct idx_src {
  const char *name;
  const uint8_t *p; /* raw: remaining bytes */
  size_t left;
  int gz;           /* 1: inflating from p/left */
  int zinit, zend;
  int truncated;    /* the compressed input ended before the gzip stream did */
  z_stream zs;
} idx_src;

/* zlib's allocations go through dt__alloc like the library's own. */
static voidpf zs_alloc(voidpf opaque, uInt items, uInt size) {
  return dt__alloc((size_t)items * size);
}
static void zs_free(voidpf opaque, voidpf p) { dt__free(p); }

static dt_status src_init(idx_src *s, const void *buf, size_t n, const char *name) {
  memset(s, 0, sizeof *s);
  s->name = name;
  s->p = buf;
  s->left = n;
  if (n >= 2 && s->p[0] == 0x1f && s->p[1] == 0x8b) {
    s->gz = 1;
    s->zs.zalloc = zs_alloc;
    s->zs.zfree = zs_free;
    /* 16 + MAX_WBITS: expect a gzip wrapper (checks its CRC32 and length trailer). */
    int zr = inflateInit2(&s->zs, 16 + MAX_WBITS);
    if (zr == Z_MEM_ERROR)
      return dt__error_prefix(DT_ERR_NOMEM, "%s: zlib's inflate state", name);
    if (zr != Z_OK)
      return dt_set_error(DT_ERR_SYSTEM, "%s: cannot initialise zlib (error %d)", name, zr);
    s->zinit = 1;
  }
  return DT_OK;
}

static void src_end(idx_src *s) {
  if (s->zinit)
    inflateEnd(&s->zs);
  s->zinit = 0;
}

/* Reads up to want bytes of decoded data into dst; *got < want only at the end of the data. */
static dt_status src_read(idx_src *s, void *dst, size_t want, size_t *got) {
  *got = 0;
  if (!s->gz) {
    size_t k = DT_MIN(want, s->left);
    memcpy(dst, s->p, k);
    s->p += k;
    s->left -= k;
    *got = k;
    return DT_OK;
  }
  uint8_t *out = dst;
  while (*got < want && !s->zend) {
    size_t room = DT_MIN(want - *got, (size_t)IDX_CHUNK);
    s->zs.next_in = (Bytef *)s->p;
    s->zs.avail_in = (uInt)DT_MIN(s->left, (size_t)UINT32_MAX);
    s->zs.next_out = out + *got;
    s->zs.avail_out = (uInt)room;
    int rc = inflate(&s->zs, Z_NO_FLUSH);
    size_t used = (size_t)(s->zs.next_in - s->p);
    size_t made = room - s->zs.avail_out;
    s->p += used;
    s->left -= used;
    *got += made;
    if (rc == Z_STREAM_END) {
      /* Another gzip member may follow (concatenated .gz files are valid gzip). */
      if (s->left >= 2 && s->p[0] == 0x1f && s->p[1] == 0x8b) {
        inflateReset(&s->zs);
        continue;
      }
      if (s->left > 0)
        return dt_set_error(DT_ERR_CORRUPT, "%s: %zu bytes of trailing garbage after the gzip stream",
                            s->name, s->left);
      s->zend = 1;
      break;
    }
    if (rc == Z_DATA_ERROR)
      return dt_set_error(DT_ERR_CORRUPT, "%s: corrupt gzip data: %s", s->name,
                          s->zs.msg ? s->zs.msg : "invalid deflate stream");
    if (rc == Z_MEM_ERROR)
      return dt_set_error(DT_ERR_NOMEM, "%s: zlib out of memory", s->name);
    if (rc == Z_BUF_ERROR || (rc == Z_OK && made == 0 && used == 0)) {
      if (s->left == 0) {
        s->truncated = 1; /* callers report it with what they expected */
        break;
      }
      return dt_set_error(DT_ERR_CORRUPT, "%s: gzip stream makes no progress", s->name);
    }
    if (rc != Z_OK)
      return dt_set_error(DT_ERR_CORRUPT, "%s: gzip error %d", s->name, rc);
  }
  return DT_OK;
}

size_t dt__idx_type_size(int type) {
  switch (type) {
  case DT_IDX_U8:
  case DT_IDX_I8:
    return 1;
  case DT_IDX_I16:
    return 2;
  case DT_IDX_I32:
  case DT_IDX_F32:
    return 4;
  case DT_IDX_F64:
    return 8;
  default:
    return 0;
  }
}

void dt__idx_dims_str(const uint64_t *dims, int ndim, char *buf, size_t cap) {
  size_t off = 0;
  buf[0] = '\0';
  for (int i = 0; i < ndim && off < cap; i++) {
    int k = snprintf(buf + off, cap - off, "%s%llu", i ? " x " : "", (unsigned long long)dims[i]);
    if (k < 0)
      break;
    off += (size_t)k;
  }
}

static uint32_t be32(const uint8_t *b) {
  return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

/* IDX stores multi-byte values big-endian; convert in place to host order. */
static void to_host(void *data, uint64_t count, size_t esz) {
  if (esz == 1 || __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__)
    return;
  uint8_t *p = data;
  for (uint64_t i = 0; i < count; i++, p += esz)
    for (size_t a = 0, b = esz - 1; a < b; a++, b--) {
      uint8_t t = p[a];
      p[a] = p[b];
      p[b] = t;
    }
}

dt_status dt_idx_parse(const void *buf, size_t n, const char *name, uint64_t max_bytes, dt_idx *out) {
  if (!out)
    return dt_set_error(DT_ERR_INVALID, "dt_idx_parse: out is NULL");
  memset(out, 0, sizeof *out);
  if (!name)
    name = "(buffer)";
  if (!buf && n)
    return dt_set_error(DT_ERR_INVALID, "%s: NULL buffer", name);
  if (!max_bytes)
    max_bytes = DT_IDX_DEFAULT_MAX_BYTES;
  idx_src s;
  dt_status rc = src_init(&s, buf, n, name);
  if (rc != DT_OK)
    return rc;
  uint8_t hdr[4 * DT_IDX_MAX_DIMS];
  uint8_t *data = NULL;
  size_t got;
  char dimstr[256];

  DT_CHECK_GOTO(src_read(&s, hdr, 4, &got), rc, fail);
  if (got < 4) {
    rc = dt_set_error(DT_ERR_CORRUPT, "%s: %zu %sbytes, too short for an IDX header (4-byte magic)",
                      name, got, s.gz ? "decoded " : "");
    goto fail;
  }
  uint32_t magic = be32(hdr);
  if (hdr[0] || hdr[1]) {
    rc = dt_set_error(DT_ERR_CORRUPT,
                      "%s: bad magic 0x%08x: not an IDX file (expected 0x00000801 labels or "
                      "0x00000803 images)", name, magic);
    goto fail;
  }
  int type = hdr[2], ndim = hdr[3];
  size_t esz = dt__idx_type_size(type);
  if (!esz) {
    rc = dt_set_error(DT_ERR_UNSUPPORTED,
                      "%s: magic 0x%08x: element type 0x%02x is not an IDX type (expected 0x08 u8, "
                      "0x09 i8, 0x0b i16, 0x0c i32, 0x0d f32 or 0x0e f64)", name, magic, type);
    goto fail;
  }
  if (ndim < 1 || ndim > DT_IDX_MAX_DIMS) {
    rc = dt_set_error(DT_ERR_CORRUPT, "%s: magic 0x%08x: %d dimensions (expected 1..%d)", name,
                      magic, ndim, DT_IDX_MAX_DIMS);
    goto fail;
  }
  DT_CHECK_GOTO(src_read(&s, hdr, 4 * (size_t)ndim, &got), rc, fail);
  if (got < 4 * (size_t)ndim) {
    rc = dt_set_error(DT_ERR_CORRUPT, "%s: header ends after %zu bytes (%d dimensions need %d)",
                      name, 4 + got, ndim, 4 + 4 * ndim);
    goto fail;
  }
  uint64_t count = 1;
  int overflow = 0;
  for (int i = 0; i < ndim; i++) {
    out->dims[i] = be32(hdr + 4 * i);
    if (out->dims[i] == 0) {
      rc = dt_set_error(DT_ERR_CORRUPT, "%s: dimension %d of %d is 0", name, i, ndim);
      goto fail;
    }
    if (count > UINT64_MAX / out->dims[i])
      overflow = 1;
    else
      count *= out->dims[i];
  }
  dt__idx_dims_str(out->dims, ndim, dimstr, sizeof dimstr);
  if (overflow || count > max_bytes / esz) {
    rc = dt_set_error(DT_ERR_CORRUPT,
                      "%s: header claims %s elements of %zu bytes, over the limit of %llu bytes "
                      "(lying or corrupt header)", name, dimstr, esz, (unsigned long long)max_bytes);
    goto fail;
  }
  uint64_t total = count * esz;
  uint64_t hdr_len = 4 + 4 * (uint64_t)ndim;

  if (!s.gz) {
    /* Raw: the buffer length is known, so compare before allocating. */
    if (s.left < total) {
      rc = dt_set_error(DT_ERR_CORRUPT,
                        "%s: header says %s (%llu data bytes) but data ends after %zu bytes",
                        name, dimstr, (unsigned long long)total, s.left);
      goto fail;
    }
    if (s.left > total) {
      rc = dt_set_error(DT_ERR_CORRUPT, "%s: %llu trailing bytes after the %s data (file is %zu bytes, "
                        "header and data %llu)", name, (unsigned long long)(s.left - total), dimstr,
                        n, (unsigned long long)(hdr_len + total));
      goto fail;
    }
    data = dt__alloc((size_t)total);
    if (!data) {
      rc = dt__error_prefix(DT_ERR_NOMEM, "%s", name);
      goto fail;
    }
    memcpy(data, s.p, (size_t)total);
  } else {
    /* gzip: deflate expands at most 1032:1 (a 258-byte match in under 2 bits), so a header
     * within that bound of the compressed bytes left gets its exact buffer at once: no
     * doubling copies, and pages are touched only as data arrives, so peak memory is the
     * data itself. A header beyond the bound is lying: its buffer grows only as real data
     * arrives, and the shortfall is reported below. */
    uint64_t bound = (uint64_t)s.left * 1032 + 4096;
    size_t cap = (size_t)(total <= bound ? total : DT_MIN(total, (uint64_t)IDX_CHUNK)), have = 0;
    data = dt__alloc(cap);
    if (!data) {
      rc = dt__error_prefix(DT_ERR_NOMEM, "%s", name);
      goto fail;
    }
    while (have < total) {
      if (have == cap) {
        size_t ncap = (size_t)DT_MIN(total, (uint64_t)cap * 2);
        uint8_t *nd = dt__alloc(ncap);
        if (!nd) {
          rc = dt__error_prefix(DT_ERR_NOMEM, "%s", name);
          goto fail;
        }
        memcpy(nd, data, have);
        dt__free(data);
        data = nd;
        cap = ncap;
      }
      size_t want = DT_MIN(cap - have, (size_t)IDX_CHUNK);
      rc = src_read(&s, data + have, want, &got);
      have += got;
      if (rc != DT_OK)
        goto fail;
      if (got < want) {
        rc = dt_set_error(DT_ERR_CORRUPT,
                          "%s: header says %s (%llu data bytes) but data ends after %zu bytes%s",
                          name, dimstr, (unsigned long long)total, have,
                          s.truncated ? " (gzip stream truncated)" : "");
        goto fail;
      }
    }
    uint8_t extra[256];
    uint64_t trailing = 0;
    do {
      DT_CHECK_GOTO(src_read(&s, extra, sizeof extra, &got), rc, fail);
      trailing += got;
    } while (got == sizeof extra && trailing < (1u << 20));
    if (s.truncated && !trailing) {
      rc = dt_set_error(DT_ERR_CORRUPT, "%s: gzip stream truncated after the %s data (trailer missing)",
                        name, dimstr);
      goto fail;
    }
    if (trailing) {
      rc = dt_set_error(DT_ERR_CORRUPT, "%s: %s%llu trailing bytes after the %s data", name,
                        got == sizeof extra ? "at least " : "", (unsigned long long)trailing, dimstr);
      goto fail;
    }
  }
  src_end(&s);
  to_host(data, count, esz);
  out->type = (dt_idx_type)type;
  out->ndim = ndim;
  out->count = count;
  out->elem_size = esz;
  out->data = data;
  return DT_OK;
fail:
  src_end(&s);
  dt__free(data);
  memset(out, 0, sizeof *out);
  return rc;
}

dt_status dt_idx_read(const char *path, uint64_t max_bytes, dt_idx *out) {
  if (!out || !path)
    return dt_set_error(DT_ERR_INVALID, "dt_idx_read: NULL argument");
  memset(out, 0, sizeof *out);
  if (!max_bytes)
    max_bytes = DT_IDX_DEFAULT_MAX_BYTES;
  void *buf;
  size_t n;
  /* A compressed file is never much larger than its content (deflate's stored blocks add
   * 5 bytes per 64 KiB), so bounding the file by the data limit plus slack is safe. */
  DT_CHECK(dt__read_file(path, max_bytes + max_bytes / 64 + 4096, &buf, &n));
  dt_status rc = dt_idx_parse(buf, n, path, max_bytes, out);
  dt__free(buf);
  return rc;
}

void dt_idx_free(dt_idx *idx) {
  if (!idx)
    return;
  dt__free(idx->data);
  memset(idx, 0, sizeof *idx);
}
