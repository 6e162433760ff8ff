/* test_idx.c - the IDX reader and dataset loader on fixtures written here in the real format
 * (raw and gzip'd): good files, truncated, wrong magic, wrong ranks, zero and oversized
 * dimensions, trailing bytes, images/labels mismatch; then the real Fashion-MNIST if installed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include "dtrain/data.h"

static char tmpdir[256];

static void put_be32(uint8_t *b, uint32_t v) {
  b[0] = (uint8_t)(v >> 24);
  b[1] = (uint8_t)(v >> 16);
  b[2] = (uint8_t)(v >> 8);
  b[3] = (uint8_t)v;
}

/* Builds an IDX byte string: magic 00 00 type ndim, dims, then data (already big-endian). */
static size_t make_idx(uint8_t *buf, int type, int ndim, const uint32_t *dims, const void *data,
                       size_t nbytes) {
  buf[0] = 0;
  buf[1] = 0;
  buf[2] = (uint8_t)type;
  buf[3] = (uint8_t)ndim;
  for (int i = 0; i < ndim; i++)
    put_be32(buf + 4 + 4 * i, dims[i]);
  memcpy(buf + 4 + 4 * ndim, data, nbytes);
  return 4 + 4 * (size_t)ndim + nbytes;
}

static void write_raw(const char *path, const void *buf, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(buf, 1, n, f), n);
  fclose(f);
}

/* gzip-wraps buf (deflate with a gzip header, as gzip(1) writes) into out; returns its size. */
static size_t gzip_buf(const void *buf, size_t n, uint8_t *out, size_t cap) {
  z_stream zs;
  memset(&zs, 0, sizeof zs);
  assert_int_equal(deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  zs.next_in = (Bytef *)buf;
  zs.avail_in = (uInt)n;
  zs.next_out = out;
  zs.avail_out = (uInt)cap;
  assert_int_equal(deflate(&zs, Z_FINISH), Z_STREAM_END);
  size_t k = cap - zs.avail_out;
  deflateEnd(&zs);
  return k;
}

static void write_gz(const char *path, const void *buf, size_t n) {
  size_t cap = n + n / 8 + 1024;
  uint8_t *z = malloc(cap);
  size_t k = gzip_buf(buf, n, z, cap);
  write_raw(path, z, k);
  free(z);
}

static const char *tpath(const char *name) {
  static char p[8][512];
  static int k;
  k = (k + 1) % 8;
  snprintf(p[k], sizeof p[k], "%s/%s", tmpdir, name);
  return p[k];
}

/* 3 images of 4 x 5 with pixel i*20+j and labels 0, 7, 2. */
static uint8_t img_px[60];
static const uint8_t lbl[3] = {0, 7, 2};
static const uint32_t img_dims[3] = {3, 4, 5};

static void expect_fail(const char *path, dt_status want, const char *substr) {
  dt_idx idx;
  dt_status rc = dt_idx_read(path, 0, &idx);
  if (rc != want || !strstr(dt_last_error(), substr))
    fail_msg("%s: got %s '%s', want %s containing '%s'", path, dt_strerror(rc), dt_last_error(),
             dt_strerror(want), substr);
  assert_null(idx.data);
  assert_true(strstr(dt_last_error(), path) != NULL); /* every message names the file */
}

static void test_good_raw_and_gzip(void **st) {
  uint8_t buf[256];
  size_t n = make_idx(buf, 0x08, 3, img_dims, img_px, sizeof img_px);
  write_raw(tpath("img.idx"), buf, n);
  write_gz(tpath("img.idx.gz"), buf, n);
  for (int gz = 0; gz < 2; gz++) {
    dt_idx idx;
    assert_int_equal(dt_idx_read(tpath(gz ? "img.idx.gz" : "img.idx"), 0, &idx), DT_OK);
    assert_int_equal(idx.type, DT_IDX_U8);
    assert_int_equal(idx.ndim, 3);
    assert_int_equal(idx.dims[0], 3);
    assert_int_equal(idx.dims[1], 4);
    assert_int_equal(idx.dims[2], 5);
    assert_int_equal(idx.count, 60);
    assert_memory_equal(idx.data, img_px, 60);
    dt_idx_free(&idx);
    assert_null(idx.data);
  }
  uint32_t ld = 3;
  n = make_idx(buf, 0x08, 1, &ld, lbl, 3);
  write_gz(tpath("lbl.idx.gz"), buf, n);
  dt_dataset ds;
  dt_dataset_opts o = {.normalize = true, .mean = 0.5f, .std = 0.25f};
  assert_int_equal(dt_dataset_load_idx(tpath("img.idx.gz"), tpath("lbl.idx.gz"), NULL, &ds), DT_OK);
  assert_int_equal(ds.n, 3);
  assert_int_equal(ds.c, 1);
  assert_int_equal(ds.h, 4);
  assert_int_equal(ds.w, 5);
  assert_int_equal(ds.num_classes, 8);
  assert_int_equal(ds.labels[1], 7);
  float x[60];
  dt_dataset_images(&ds, 0, 3, x);
  assert_memory_equal(ds.pixels, img_px, 60);
  for (int i = 0; i < 60; i++)
    assert_float_equal(x[i], img_px[i] / 255.0f, 1e-6);
  /* gather: images 2, 0 in that order, with their labels */
  float g[40];
  int32_t gy[2];
  const uint32_t gi[2] = {2, 0};
  dt_dataset_gather(&ds, gi, 2, g, gy);
  assert_memory_equal(g, x + 40, 20 * sizeof(float));
  assert_memory_equal(g + 20, x, 20 * sizeof(float));
  assert_int_equal(gy[0], 2);
  assert_int_equal(gy[1], 0);
  dt_dataset_free(&ds);
  assert_int_equal(dt_dataset_load_idx(tpath("img.idx"), tpath("lbl.idx.gz"), &o, &ds), DT_OK);
  dt_dataset_images(&ds, 0, 3, x);
  for (int i = 0; i < 60; i++)
    assert_float_equal(x[i], (img_px[i] / 255.0f - 0.5f) / 0.25f, 1e-5);
  dt_dataset_free(&ds);
  dt_dataset_free(&ds); /* free twice is harmless: the struct was zeroed */
}

static void test_wide_types(void **st) {
  /* i32 and f64 arrays: values stored big-endian must come back in host order. */
  uint8_t buf[128], data[64];
  uint32_t d = 3;
  int32_t iv[3] = {-5, 70000, 1};
  for (int i = 0; i < 3; i++)
    put_be32(data + 4 * i, (uint32_t)iv[i]);
  size_t n = make_idx(buf, 0x0C, 1, &d, data, 12);
  write_raw(tpath("i32.idx"), buf, n);
  dt_idx idx;
  assert_int_equal(dt_idx_read(tpath("i32.idx"), 0, &idx), DT_OK);
  assert_int_equal(idx.elem_size, 4);
  assert_memory_equal(idx.data, iv, sizeof iv);
  dt_idx_free(&idx);
  double dv[2] = {1.5, -2.25};
  d = 2;
  for (int i = 0; i < 2; i++) {
    uint64_t u;
    memcpy(&u, &dv[i], 8);
    put_be32(data + 8 * i, (uint32_t)(u >> 32));
    put_be32(data + 8 * i + 4, (uint32_t)u);
  }
  n = make_idx(buf, 0x0E, 1, &d, data, 16);
  write_gz(tpath("f64.idx.gz"), buf, n);
  assert_int_equal(dt_idx_read(tpath("f64.idx.gz"), 0, &idx), DT_OK);
  assert_memory_equal(idx.data, dv, sizeof dv);
  dt_idx_free(&idx);
}

static void test_truncated(void **st) {
  uint8_t buf[256];
  size_t n = make_idx(buf, 0x08, 3, img_dims, img_px, sizeof img_px);
  write_raw(tpath("trunc.idx"), buf, n - 30);
  expect_fail(tpath("trunc.idx"), DT_ERR_CORRUPT,
              "header says 3 x 4 x 5 (60 data bytes) but data ends after 30 bytes");
  write_raw(tpath("trunc_hdr.idx"), buf, 9);
  expect_fail(tpath("trunc_hdr.idx"), DT_ERR_CORRUPT, "header ends after 9 bytes");
  write_raw(tpath("tiny.idx"), buf, 2);
  expect_fail(tpath("tiny.idx"), DT_ERR_CORRUPT, "too short for an IDX header");
  write_raw(tpath("empty.idx"), buf, 0);
  expect_fail(tpath("empty.idx"), DT_ERR_CORRUPT, "0 bytes");

  /* gzip'd and cut in the middle of the deflate stream: a bigger, poorly compressible file. */
  enum { N = 50, H = 28, W = 28 };
  size_t raw_n = 16 + (size_t)N * H * W;
  uint8_t *big = malloc(raw_n), *px = malloc((size_t)N * H * W), *z = malloc(raw_n * 2);
  uint32_t s = 12345;
  for (size_t i = 0; i < (size_t)N * H * W; i++) {
    s = s * 1103515245u + 12345u;
    px[i] = (uint8_t)(s >> 16);
  }
  uint32_t dims[3] = {N, H, W};
  make_idx(big, 0x08, 3, dims, px, (size_t)N * H * W);
  size_t zn = gzip_buf(big, raw_n, z, raw_n * 2);
  write_raw(tpath("trunc.idx.gz"), z, zn / 2);
  expect_fail(tpath("trunc.idx.gz"), DT_ERR_CORRUPT, "header says 50 x 28 x 28 (39200 data bytes) but data ends after");
  expect_fail(tpath("trunc.idx.gz"), DT_ERR_CORRUPT, "gzip stream truncated");
  /* Cut inside the 8-byte gzip trailer: all data present, the stream is still incomplete. */
  write_raw(tpath("trunc_trailer.idx.gz"), z, zn - 3);
  expect_fail(tpath("trunc_trailer.idx.gz"), DT_ERR_CORRUPT, "trailer missing");
  /* A flipped byte inside the deflate data: zlib's CRC or decoder catches it. */
  z[zn / 2] ^= 0x55;
  write_raw(tpath("flip.idx.gz"), z, zn);
  expect_fail(tpath("flip.idx.gz"), DT_ERR_CORRUPT, "gzip");
  free(big);
  free(px);
  free(z);
}

static void test_bad_magic_and_dims(void **st) {
  uint8_t buf[256];
  size_t n = make_idx(buf, 0x08, 3, img_dims, img_px, sizeof img_px);
  buf[0] = 0x12;
  write_raw(tpath("magic.idx"), buf, n);
  expect_fail(tpath("magic.idx"), DT_ERR_CORRUPT, "bad magic 0x12000803");
  buf[0] = 0;
  buf[2] = 0x0A;
  write_raw(tpath("type.idx"), buf, n);
  expect_fail(tpath("type.idx"), DT_ERR_UNSUPPORTED, "element type 0x0a");
  buf[2] = 0x08;
  buf[3] = 0;
  write_raw(tpath("ndim0.idx"), buf, n);
  expect_fail(tpath("ndim0.idx"), DT_ERR_CORRUPT, "0 dimensions (expected 1..8)");
  buf[3] = 40;
  write_gz(tpath("ndim40.idx.gz"), buf, n);
  expect_fail(tpath("ndim40.idx.gz"), DT_ERR_CORRUPT, "40 dimensions");

  uint32_t d0[3] = {3, 0, 5};
  n = make_idx(buf, 0x08, 3, d0, img_px, 0);
  write_raw(tpath("dim0.idx"), buf, n);
  expect_fail(tpath("dim0.idx"), DT_ERR_CORRUPT, "dimension 1 of 3 is 0");

  /* Lying headers: the reader must refuse before allocating what they claim. */
  uint32_t huge[2] = {1u << 31, 1u << 31};
  n = make_idx(buf, 0x08, 2, huge, img_px, 60);
  write_raw(tpath("huge.idx"), buf, n);
  expect_fail(tpath("huge.idx"), DT_ERR_CORRUPT, "header claims 2147483648 x 2147483648 elements");
  write_gz(tpath("huge.idx.gz"), buf, n);
  expect_fail(tpath("huge.idx.gz"), DT_ERR_CORRUPT, "over the limit");
  uint32_t ovf[4] = {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 7};
  n = make_idx(buf, 0x0E, 4, ovf, img_px, 60);
  write_raw(tpath("ovf.idx"), buf, n);
  expect_fail(tpath("ovf.idx"), DT_ERR_CORRUPT, "over the limit");
  /* Under the default limit but far beyond the data: 1 GB claimed, 60 bytes present. */
  uint32_t big[3] = {1000000, 1000, 1};
  n = make_idx(buf, 0x08, 3, big, img_px, 60);
  write_gz(tpath("lie.idx.gz"), buf, n);
  expect_fail(tpath("lie.idx.gz"), DT_ERR_CORRUPT, "header says 1000000 x 1000 x 1 (1000000000 data bytes) but data ends after 60 bytes");
  write_raw(tpath("lie.idx"), buf, n);
  expect_fail(tpath("lie.idx"), DT_ERR_CORRUPT, "but data ends after 60 bytes");
  /* A caller-given limit applies too. */
  n = make_idx(buf, 0x08, 3, img_dims, img_px, 60);
  write_raw(tpath("limit.idx"), buf, n);
  dt_idx idx;
  assert_int_equal(dt_idx_read(tpath("limit.idx"), 59, &idx), DT_ERR_CORRUPT);
  assert_non_null(strstr(dt_last_error(), "over the limit of 59 bytes"));
}

static void test_trailing(void **st) {
  uint8_t buf[256];
  size_t n = make_idx(buf, 0x08, 3, img_dims, img_px, sizeof img_px);
  memcpy(buf + n, "JUNK", 4);
  write_raw(tpath("trail.idx"), buf, n + 4);
  expect_fail(tpath("trail.idx"), DT_ERR_CORRUPT, "4 trailing bytes after the 3 x 4 x 5 data");
  write_gz(tpath("trail.idx.gz"), buf, n + 4);
  expect_fail(tpath("trail.idx.gz"), DT_ERR_CORRUPT, "4 trailing bytes after the 3 x 4 x 5 data");
  /* Garbage after a complete gzip member. */
  uint8_t z[512];
  size_t zn = gzip_buf(buf, n, z, sizeof z);
  memcpy(z + zn, "xyz", 3);
  write_raw(tpath("garbage.idx.gz"), z, zn + 3);
  expect_fail(tpath("garbage.idx.gz"), DT_ERR_CORRUPT, "3 bytes of trailing garbage after the gzip stream");
  /* Two concatenated gzip members are one valid gzip file (as `cat a.gz b.gz` makes). */
  size_t z1 = gzip_buf(buf, 20, z, sizeof z);
  size_t z2 = gzip_buf(buf + 20, n - 20, z + z1, sizeof z - z1);
  write_raw(tpath("multi.idx.gz"), z, z1 + z2);
  dt_idx idx;
  assert_int_equal(dt_idx_read(tpath("multi.idx.gz"), 0, &idx), DT_OK);
  assert_memory_equal(idx.data, img_px, 60);
  dt_idx_free(&idx);
}

static void test_dataset_errors(void **st) {
  uint8_t buf[256];
  size_t n = make_idx(buf, 0x08, 3, img_dims, img_px, sizeof img_px);
  write_raw(tpath("d_img.idx"), buf, n);
  uint8_t l4[4] = {1, 2, 3, 4};
  uint32_t d4 = 4;
  n = make_idx(buf, 0x08, 1, &d4, l4, 4);
  write_raw(tpath("d_lbl4.idx"), buf, n);
  dt_dataset ds;
  assert_int_equal(dt_dataset_load_idx(tpath("d_img.idx"), tpath("d_lbl4.idx"), NULL, &ds),
                   DT_ERR_CORRUPT);
  assert_non_null(strstr(dt_last_error(), "holds 3 images but"));
  assert_non_null(strstr(dt_last_error(), "d_lbl4.idx holds 4 labels"));
  assert_null(ds.pixels);
  /* Labels with 2 dimensions; images with 2 dimensions. */
  uint32_t d2[2] = {3, 1};
  n = make_idx(buf, 0x08, 2, d2, lbl, 3);
  write_raw(tpath("d_lbl2d.idx"), buf, n);
  assert_int_equal(dt_dataset_load_idx(tpath("d_img.idx"), tpath("d_lbl2d.idx"), NULL, &ds),
                   DT_ERR_CORRUPT);
  assert_non_null(strstr(dt_last_error(), "labels have 2 dimensions (3 x 1); expected 1"));
  uint32_t di[2] = {3, 20};
  n = make_idx(buf, 0x08, 2, di, img_px, 60);
  write_raw(tpath("d_img2d.idx"), buf, n);
  n = make_idx(buf, 0x08, 1, img_dims, lbl, 3);
  write_raw(tpath("d_lbl.idx"), buf, n);
  assert_int_equal(dt_dataset_load_idx(tpath("d_img2d.idx"), tpath("d_lbl.idx"), NULL, &ds),
                   DT_ERR_CORRUPT);
  assert_non_null(strstr(dt_last_error(), "images have 2 dimensions (3 x 20)"));
  /* Missing files. */
  assert_int_equal(dt_dataset_load_idx(tpath("nope.idx"), tpath("d_lbl.idx"), NULL, &ds),
                   DT_ERR_NOT_FOUND);
  assert_non_null(strstr(dt_last_error(), tpath("nope.idx")));
  assert_int_equal(dt_dataset_load_dir(tmpdir, DT_SPLIT_TRAIN, NULL, &ds), DT_ERR_NOT_FOUND);
  assert_non_null(strstr(dt_last_error(), "train-images-idx3-ubyte.gz"));
  assert_non_null(strstr(dt_last_error(), tmpdir));
  /* A directory with the standard names (one raw, one gzip'd) loads. */
  n = make_idx(buf, 0x08, 3, img_dims, img_px, sizeof img_px);
  write_raw(tpath("t10k-images-idx3-ubyte"), buf, n);
  n = make_idx(buf, 0x08, 1, img_dims, lbl, 3);
  write_gz(tpath("t10k-labels-idx1-ubyte.gz"), buf, n);
  assert_int_equal(dt_dataset_load_dir(tmpdir, DT_SPLIT_TEST, NULL, &ds), DT_OK);
  assert_int_equal(ds.n, 3);
  dt_dataset_free(&ds);
  dt_dataset_opts bad = {.normalize = true, .mean = 0, .std = 0};
  assert_int_equal(dt_dataset_load_dir(tmpdir, DT_SPLIT_TEST, &bad, &ds), DT_ERR_INVALID);
}

static void test_memory_parse(void **st) {
  uint8_t buf[256];
  size_t n = make_idx(buf, 0x08, 3, img_dims, img_px, sizeof img_px);
  dt_idx idx;
  assert_int_equal(dt_idx_parse(buf, n, "mem", 0, &idx), DT_OK);
  dt_idx_free(&idx);
  /* Every strict prefix is refused, never read past. */
  for (size_t k = 0; k < n; k++) {
    assert_int_equal(dt_idx_parse(buf, k, "mem", 0, &idx), DT_ERR_CORRUPT);
    assert_non_null(strstr(dt_last_error(), "mem: "));
  }
}

static void test_real_fashion_mnist(void **st) {
  if (access(DT_FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz", R_OK) != 0) {
    print_message("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist): skipped\n");
    skip();
  }
  for (int sp = 0; sp < 2; sp++) {
    dt_dataset ds;
    assert_int_equal(dt_dataset_load_dir(NULL, sp ? DT_SPLIT_TEST : DT_SPLIT_TRAIN, NULL, &ds), DT_OK);
    assert_int_equal(ds.n, sp ? 10000 : 60000);
    assert_int_equal(ds.c, 1);
    assert_int_equal(ds.h, 28);
    assert_int_equal(ds.w, 28);
    assert_int_equal(ds.num_classes, 10);
    long hist[10] = {0};
    for (uint64_t i = 0; i < ds.n; i++) {
      assert_in_range(ds.labels[i], 0, 9);
      hist[ds.labels[i]]++;
    }
    for (int c = 0; c < 10; c++) /* Fashion-MNIST is balanced: 6000 / 1000 per class */
      assert_int_equal(hist[c], sp ? 1000 : 6000);
    float lo = 1, hi = 0;
    double sum = 0;
    float x[784];
    for (uint64_t k = 0; k < ds.n; k++) {
      dt_dataset_images(&ds, k, 1, x);
      for (int i = 0; i < 784; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
        sum += x[i];
      }
    }
    assert_float_equal(lo, 0.0, 0);
    assert_float_equal(hi, 1.0, 0);
    /* Published mean pixel of Fashion-MNIST's training set is 0.2860. */
    assert_float_equal(sum / ((double)ds.n * 784), 0.286, 0.01);
    dt_dataset_free(&ds);
  }
}

static int setup(void **st) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/dt_test_idx_XXXXXX");
  if (!mkdtemp(tmpdir))
    return -1;
  for (int i = 0; i < 60; i++)
    img_px[i] = (uint8_t)(i * 4 + 3);
  return 0;
}

static int teardown(void **st) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_good_raw_and_gzip), cmocka_unit_test(test_wide_types),
      cmocka_unit_test(test_truncated),         cmocka_unit_test(test_bad_magic_and_dims),
      cmocka_unit_test(test_trailing),          cmocka_unit_test(test_dataset_errors),
      cmocka_unit_test(test_memory_parse),      cmocka_unit_test(test_real_fashion_mnist),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
