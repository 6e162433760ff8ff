/* test_safetensors.c - safetensors against its specification: the writer's bytes are checked
 * field by field (little-endian length, JSON text, space padding to 8-byte alignment, offsets),
 * a file composed here by hand in the spec's terms (other key order, whitespace, escapes) is
 * read back, and corrupted variants are each refused with a message naming the problem. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "dtrain/ckpt.h"

static char tmpdir[256];

static const char *tpath(const char *name) {
  static char p[4][512];
  static int k;
  k = (k + 1) % 4;
  snprintf(p[k], sizeof p[k], "%s/%s", tmpdir, name);
  return p[k];
}

static unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)len + 1);
  assert_int_equal(fread(b, 1, (size_t)len, f), (size_t)len);
  fclose(f);
  *n = (size_t)len;
  return b;
}

static void spit(const char *path, const void *b, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(b, 1, n, f), n);
  fclose(f);
}

/* A file from raw parts: the 8-byte LE length of hdr, hdr, then data. */
static size_t compose_n(unsigned char *out, const char *hdr, size_t hl, const void *data, size_t dn) {
  for (int i = 0; i < 8; i++)
    out[i] = (unsigned char)((uint64_t)hl >> (8 * i));
  memcpy(out + 8, hdr, hl);
  memcpy(out + 8 + hl, data, dn);
  return 8 + hl + dn;
}

static size_t compose(unsigned char *out, const char *hdr, const void *data, size_t dn) {
  return compose_n(out, hdr, strlen(hdr), data, dn);
}

static void test_round_trip_and_layout(void **st) {
  float w[6] = {1.5f, -2.f, 3.25f, 0.f, 1e-30f, -7.f};
  int64_t idx[4] = {-1, 0, 1LL << 40, 7};
  uint8_t u[3] = {1, 2, 255};
  double sc = 3.141592653589793;
  dt_tensor_view t[5] = {
      {.name = "fc1.weight", .dtype = DT_ST_F32, .ndim = 2, .shape = {2, 3}, .data = w, .nbytes = 24},
      {.name = "ids", .dtype = DT_ST_I64, .ndim = 1, .shape = {4}, .data = idx, .nbytes = 32},
      {.name = "mask", .dtype = DT_ST_U8, .ndim = 1, .shape = {3}, .data = u, .nbytes = 3},
      {.name = "scalar", .dtype = DT_ST_F64, .ndim = 0, .data = &sc, .nbytes = 8},
      {.name = "empty", .dtype = DT_ST_F32, .ndim = 2, .shape = {0, 5}, .data = NULL, .nbytes = 0},
  };
  dt_kv meta[2] = {{"format", "pt"}, {"spec", "say \"hi\"\\\n\x01 caf\xc3\xa9"}};
  assert_int_equal(dt_safetensors_write(tpath("m.safetensors"), t, 5, meta, 2), DT_OK);

  size_t n;
  unsigned char *b = slurp(tpath("m.safetensors"), &n);
  uint64_t hl = 0;
  for (int i = 0; i < 8; i++)
    hl |= (uint64_t)b[i] << (8 * i);
  assert_int_equal((8 + hl) % 8, 0); /* data buffer starts 8-byte aligned */
  assert_int_equal(n, 8 + hl + 24 + 32 + 3 + 8);
  const char *want =
      "{\"__metadata__\":{\"format\":\"pt\",\"spec\":\"say \\\"hi\\\"\\\\\\n\\u0001 caf\xc3\xa9\"},"
      "\"fc1.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
      "\"ids\":{\"dtype\":\"I64\",\"shape\":[4],\"data_offsets\":[24,56]},"
      "\"mask\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[56,59]},"
      "\"scalar\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[59,67]},"
      "\"empty\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[67,67]}}";
  size_t wl = strlen(want);
  assert_true(hl >= wl && hl < wl + 8);
  assert_memory_equal(b + 8, want, wl);
  for (size_t i = wl; i < hl; i++)
    assert_int_equal(b[8 + i], ' '); /* padding is spaces, as the spec allows */
  assert_memory_equal(b + 8 + hl, w, 24);
  assert_memory_equal(b + 8 + hl + 24, idx, 32);
  assert_memory_equal(b + 8 + hl + 56, u, 3);
  assert_memory_equal(b + 8 + hl + 59, &sc, 8);
  free(b);

  dt_safetensors *f;
  assert_int_equal(dt_safetensors_open(tpath("m.safetensors"), &f), DT_OK);
  assert_int_equal(dt_safetensors_count(f), 5);
  assert_int_equal(dt_safetensors_header_len(f), hl);
  for (int i = 0; i < 5; i++) {
    const dt_tensor_view *v = dt_safetensors_tensor(f, (size_t)i);
    assert_string_equal(v->name, t[i].name);
    assert_int_equal(v->dtype, t[i].dtype);
    assert_int_equal(v->ndim, t[i].ndim);
    for (int d = 0; d < v->ndim; d++)
      assert_int_equal(v->shape[d], t[i].shape[d]);
    assert_int_equal(v->nbytes, t[i].nbytes);
    if (v->nbytes)
      assert_memory_equal(v->data, t[i].data, v->nbytes);
  }
  assert_ptr_equal(dt_safetensors_find(f, "mask"), dt_safetensors_tensor(f, 2));
  assert_null(dt_safetensors_find(f, "nope"));
  assert_string_equal(dt_safetensors_meta_get(f, "format"), "pt");
  assert_string_equal(dt_safetensors_meta_get(f, "spec"), meta[1].value);
  assert_int_equal(dt_safetensors_meta_count(f), 2);
  dt_safetensors_destroy(f);
  dt_safetensors_destroy(NULL);

  /* Without metadata the key is omitted; an empty file set is "{}" padded. */
  assert_int_equal(dt_safetensors_write(tpath("e.safetensors"), NULL, 0, NULL, 0), DT_OK);
  b = slurp(tpath("e.safetensors"), &n);
  assert_int_equal(n, 16);
  assert_memory_equal(b, "\x08\0\0\0\0\0\0\0{}      ", 16);
  free(b);
  assert_int_equal(dt_safetensors_open(tpath("e.safetensors"), &f), DT_OK);
  assert_int_equal(dt_safetensors_count(f), 0);
  dt_safetensors_destroy(f);
}

/* Python's json module as an independent parser of the header, when Python is there. */
static void test_python_json(void **st) {
  if (access("/usr/bin/python3", X_OK) != 0)
    skip();
  float w[4] = {1, 2, 3, 4};
  dt_tensor_view t = {.name = "w\xe2\x82\xac\"", .dtype = DT_ST_F32, .ndim = 2, .shape = {2, 2},
                      .data = w, .nbytes = 16};
  dt_kv meta = {"k\tey", "v\\al"};
  assert_int_equal(dt_safetensors_write(tpath("py.safetensors"), &t, 1, &meta, 1), DT_OK);
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "/usr/bin/python3 -c 'import json,struct,sys\n"
           "b=open(sys.argv[1],\"rb\").read(); n=struct.unpack(\"<Q\",b[:8])[0]\n"
           "h=json.loads(b[8:8+n].decode(\"utf-8\"))\n"
           "assert h[\"__metadata__\"]=={\"k\\tey\":\"v\\\\al\"}, h\n"
           "x=h[\"w\\u20ac\\\"\"]; assert x==dict(dtype=\"F32\",shape=[2,2],data_offsets=[0,16]), x\n"
           "assert struct.unpack(\"<4f\", b[8+n:])==(1,2,3,4)' %s",
           tpath("py.safetensors"));
  assert_int_equal(system(cmd), 0);
}

static void test_hand_made(void **st) {
  /* Composed in the spec's terms: metadata last, keys in another order, whitespace everywhere,
   * JSON escapes in names (\u00e9, a surrogate pair, \/). */
  const char *hdr =
      "{ \"b\\u00e9ta\" : { \"shape\" : [ 2 ] , \"data_offsets\" : [ 8 , 16 ], \"dtype\":\"I32\" },\n"
      "\t\"a\\/\\ud83d\\ude00\": {\"data_offsets\":[0,8],\"dtype\":\"BF16\",\"shape\":[2,2]},\r\n"
      "  \"__metadata__\" : { } }  \n ";
  unsigned char data[16], file[512];
  for (int i = 0; i < 16; i++)
    data[i] = (unsigned char)i;
  size_t n = compose(file, hdr, data, 16);
  dt_safetensors *f;
  assert_int_equal(dt_safetensors_parse(file, n, "hand", &f), DT_OK);
  assert_int_equal(dt_safetensors_count(f), 2);
  const dt_tensor_view *v = dt_safetensors_find(f, "b\xc3\xa9ta");
  assert_non_null(v);
  assert_int_equal(v->dtype, DT_ST_I32);
  assert_memory_equal(v->data, data + 8, 8);
  v = dt_safetensors_find(f, "a/\xf0\x9f\x98\x80");
  assert_non_null(v);
  assert_int_equal(v->dtype, DT_ST_BF16);
  assert_int_equal(v->ndim, 2);
  assert_memory_equal(v->data, data, 8);
  assert_int_equal(dt_safetensors_meta_count(f), 0);
  dt_safetensors_destroy(f);
}

typedef struct bad_case {
  const char *hdr;
  size_t data_len;
  dt_status want;
  const char *msg;
  size_t hlen; /* header bytes when it holds a NUL; 0: strlen */
} bad_case;

static void test_corrupt_headers(void **st) {
  static const bad_case cases[] = {
      {"[1]", 0, DT_ERR_CORRUPT, "must be a JSON object", 0},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4, DT_ERR_CORRUPT, "expected ',' or '}'", 0},
      {"{\"a\" {\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, DT_ERR_CORRUPT, "expected ':'", 0},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},}", 4, DT_ERR_CORRUPT, "expected a string", 0},
      {"{\"a:{}}", 0, DT_ERR_CORRUPT, "unterminated string", 0},
      {"{\"a\\q\":{}}", 0, DT_ERR_CORRUPT, "bad escape", 0},
      {"{\"a\xff\":{}}", 0, DT_ERR_CORRUPT, "invalid UTF-8", 0},
      {"{\"a\xc0\x80\":{}}", 0, DT_ERR_CORRUPT, "invalid UTF-8", 0},
      {"{\"a\x01\":{}}", 0, DT_ERR_CORRUPT, "control character 0x01", 0},
      {"{\"\\ud800x\":{}}", 0, DT_ERR_CORRUPT, "lone high surrogate", 0},
      {"{\"\\u0000\":{}}", 0, DT_ERR_CORRUPT, "\\u0000", 0},
      {"{\"a\":{}}", 0, DT_ERR_CORRUPT, "has no dtype", 0},
      {"{\"a\":{\"dtype\":\"F17\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, DT_ERR_UNSUPPORTED, "dtype \"F17\" is not supported", 0},
      {"{\"a\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, DT_ERR_CORRUPT, "dtype is not a string", 0},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4, DT_ERR_CORRUPT, "must be an integer", 0},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, DT_ERR_CORRUPT, "non-negative integer", 0},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", 4, DT_ERR_CORRUPT, "leading zero", 0},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,4]}}", 4, DT_ERR_CORRUPT, "overflows 64 bits", 0},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, DT_ERR_CORRUPT, "exactly 2 integers", 0},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 0, DT_ERR_CORRUPT, "lacks data_offsets", 0},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4, DT_ERR_CORRUPT, "unknown field \"x\"", 0},
      {"{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, DT_ERR_CORRUPT, "duplicate dtype", 0},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 20, DT_ERR_CORRUPT, "shape [2,3] of F32 needs 24 bytes but data_offsets [0, 20] span 20", 0},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,4]}}", 4, DT_ERR_CORRUPT, "needs more than", 0},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, DT_ERR_CORRUPT, "end before they begin", 0},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, DT_ERR_CORRUPT, "beyond the 4-byte data buffer", 0},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, DT_ERR_CORRUPT, "overlap", 0},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, DT_ERR_CORRUPT, "gap of 4 unused bytes before tensor \"a\"", 0},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 9, DT_ERR_CORRUPT, "5 trailing bytes", 0},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, DT_ERR_CORRUPT, "duplicate tensor name \"a\"", 0},
      {"{\"__metadata__\":{\"k\":1}}", 0, DT_ERR_CORRUPT, "is not a string", 0},
      {"{\"__metadata__\":{\"k\":\"v\",\"k\":\"w\"}}", 0, DT_ERR_CORRUPT, "duplicate __metadata__ key", 0},
      {"{\"__metadata__\":{},\"__metadata__\":{}}", 0, DT_ERR_CORRUPT, "duplicate __metadata__", 0},
      {"{}x", 0, DT_ERR_CORRUPT, "unexpected bytes after the JSON object", 0},
      {"{}\0", 0, DT_ERR_CORRUPT, "unexpected bytes", 3},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, DT_ERR_CORRUPT, "more than 16 dimensions", 0},
  };
  unsigned char data[64] = {0}, file[1024];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const bad_case *c = &cases[i];
    size_t n = compose_n(file, c->hdr, c->hlen ? c->hlen : strlen(c->hdr), data, c->data_len);
    dt_safetensors *f;
    dt_status rc = dt_safetensors_parse(file, n, "bad.safetensors", &f);
    if (rc != c->want || !strstr(dt_last_error(), c->msg) || !strstr(dt_last_error(), "bad.safetensors"))
      fail_msg("case %zu (%s): got %s '%s', want %s with '%s'", i, c->hdr, dt_strerror(rc),
               dt_last_error(), dt_strerror(c->want), c->msg);
    assert_null(f);
  }
}

static void test_corrupt_files(void **st) {
  float w[4] = {1, 2, 3, 4};
  dt_tensor_view t = {.name = "w", .dtype = DT_ST_F32, .ndim = 1, .shape = {4}, .data = w, .nbytes = 16};
  assert_int_equal(dt_safetensors_write(tpath("ok.safetensors"), &t, 1, NULL, 0), DT_OK);
  size_t n;
  unsigned char *b = slurp(tpath("ok.safetensors"), &n);
  dt_safetensors *f;
  /* Every strict prefix (a torn or truncated file) is refused, naming the file. */
  for (size_t k = 0; k < n; k++) {
    spit(tpath("cut.safetensors"), b, k);
    assert_int_not_equal(dt_safetensors_open(tpath("cut.safetensors"), &f), DT_OK);
    assert_non_null(strstr(dt_last_error(), "cut.safetensors"));
    assert_null(f);
  }
  spit(tpath("cut.safetensors"), b, 5);
  assert_int_equal(dt_safetensors_open(tpath("cut.safetensors"), &f), DT_ERR_CORRUPT);
  assert_non_null(strstr(dt_last_error(), "5 bytes, too short"));
  spit(tpath("cut.safetensors"), b, n - 1);
  assert_int_equal(dt_safetensors_open(tpath("cut.safetensors"), &f), DT_ERR_CORRUPT);
  assert_non_null(strstr(dt_last_error(), "beyond the 15-byte data buffer"));
  /* A header length past the end, and one over the 100 MB bound. */
  b[0] = 0xff;
  spit(tpath("len.safetensors"), b, n);
  assert_int_equal(dt_safetensors_open(tpath("len.safetensors"), &f), DT_ERR_CORRUPT);
  assert_non_null(strstr(dt_last_error(), "truncated?"));
  b[5] = 0x01;
  spit(tpath("len.safetensors"), b, n);
  assert_int_equal(dt_safetensors_open(tpath("len.safetensors"), &f), DT_ERR_CORRUPT);
  assert_non_null(strstr(dt_last_error(), "exceeds the 100000000-byte limit"));
  free(b);
  assert_int_equal(dt_safetensors_open(tpath("missing.safetensors"), &f), DT_ERR_NOT_FOUND);
  assert_non_null(strstr(dt_last_error(), "missing.safetensors"));
}

static void test_writer_rejects(void **st) {
  float w[4] = {0};
  dt_tensor_view t[2] = {
      {.name = "w", .dtype = DT_ST_F32, .ndim = 1, .shape = {4}, .data = w, .nbytes = 16},
      {.name = "w", .dtype = DT_ST_F32, .ndim = 1, .shape = {4}, .data = w, .nbytes = 16},
  };
  assert_int_equal(dt_safetensors_write(tpath("x.safetensors"), t, 2, NULL, 0), DT_ERR_INVALID);
  assert_non_null(strstr(dt_last_error(), "duplicate tensor name \"w\""));
  t[1].name = "__metadata__";
  assert_int_equal(dt_safetensors_write(tpath("x.safetensors"), t, 2, NULL, 0), DT_ERR_INVALID);
  t[1].name = "bad\xff";
  assert_int_equal(dt_safetensors_write(tpath("x.safetensors"), t, 2, NULL, 0), DT_ERR_INVALID);
  assert_non_null(strstr(dt_last_error(), "not valid UTF-8"));
  t[1].name = "v";
  t[1].nbytes = 12;
  assert_int_equal(dt_safetensors_write(tpath("x.safetensors"), t, 2, NULL, 0), DT_ERR_INVALID);
  assert_non_null(strstr(dt_last_error(), "shape gives 16 bytes of F32 but nbytes is 12"));
  dt_kv dup[2] = {{"a", "1"}, {"a", "2"}};
  assert_int_equal(dt_safetensors_write(tpath("x.safetensors"), t, 1, dup, 2), DT_ERR_INVALID);
  assert_int_equal(access(tpath("x.safetensors"), F_OK), -1); /* nothing written */
  assert_int_equal(dt_safetensors_write("/nonexistent-dir/x.safetensors", t, 1, NULL, 0), DT_ERR_NOT_FOUND);
  assert_non_null(strstr(dt_last_error(), "/nonexistent-dir/x.safetensors"));
  assert_string_equal(dt_st_dtype_name(DT_ST_BF16), "BF16");
  assert_int_equal(dt_st_dtype_size(DT_ST_I64), 8);
  assert_null(dt_st_dtype_name(DT_ST_DTYPE_COUNT));
}

static int setup(void **st) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/dt_test_st_XXXXXX");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **st) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip_and_layout), cmocka_unit_test(test_python_json),
      cmocka_unit_test(test_hand_made),             cmocka_unit_test(test_corrupt_headers),
      cmocka_unit_test(test_corrupt_files),         cmocka_unit_test(test_writer_rejects),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
