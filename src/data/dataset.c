/* dataset.c - an image classification set (MNIST family) held in memory as the file's u8
 * pixels and int32 labels, and the copy-out to float through a 256-entry value table (a batch
 * is converted when it is assembled, so the set costs 1 byte per pixel instead of 4). It reads
 * u8 IDX images and labels only; other element types, augmentation and datasets larger than
 * memory are out of scope here. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "data/data_internal.h"
#include "dtrain/data.h"

dt_status dt_dataset_load_idx(const char *images_path, const char *labels_path,
                              const dt_dataset_opts *opts, dt_dataset *out) {
  if (!out || !images_path || !labels_path)
    return dt_set_error(DT_ERR_INVALID, "dt_dataset_load_idx: NULL argument");
  memset(out, 0, sizeof *out);
  dt_idx im = {0}, lb = {0};
  dt_status rc;
  DT_CHECK(dt_dataset_set_scaling(out, opts));
  DT_CHECK_GOTO(dt_idx_read(images_path, 0, &im), rc, fail);
  DT_CHECK_GOTO(dt_idx_read(labels_path, 0, &lb), rc, fail);
  char dims[256];
  dt__idx_dims_str(im.dims, im.ndim, dims, sizeof dims);
  if (im.type != DT_IDX_U8 || lb.type != DT_IDX_U8) {
    rc = dt_set_error(DT_ERR_UNSUPPORTED, "%s: element type 0x%02x: images and labels must be u8 "
                      "(magic 0x00000803 / 0x00000801)", im.type != DT_IDX_U8 ? images_path : labels_path,
                      im.type != DT_IDX_U8 ? im.type : lb.type);
    goto fail;
  }
  if (im.ndim != 3 && im.ndim != 4) {
    rc = dt_set_error(DT_ERR_CORRUPT, "%s: images have %d dimensions (%s); expected 3 (N x H x W) or "
                      "4 (N x C x H x W)", images_path, im.ndim, dims);
    goto fail;
  }
  if (lb.ndim != 1) {
    char ld[256];
    dt__idx_dims_str(lb.dims, lb.ndim, ld, sizeof ld);
    rc = dt_set_error(DT_ERR_CORRUPT, "%s: labels have %d dimensions (%s); expected 1 (N)",
                      labels_path, lb.ndim, ld);
    goto fail;
  }
  if (im.dims[0] != lb.dims[0]) {
    rc = dt_set_error(DT_ERR_CORRUPT, "%s holds %llu images but %s holds %llu labels", images_path,
                      (unsigned long long)im.dims[0], labels_path, (unsigned long long)lb.dims[0]);
    goto fail;
  }
  uint64_t c = im.ndim == 4 ? im.dims[1] : 1, h = im.dims[im.ndim - 2], w = im.dims[im.ndim - 1];
  if (c > INT_MAX || h > INT_MAX || w > INT_MAX) {
    rc = dt_set_error(DT_ERR_UNSUPPORTED, "%s: image shape %s too large", images_path, dims);
    goto fail;
  }
  out->n = im.dims[0];
  out->c = (int)c;
  out->h = (int)h;
  out->w = (int)w;
  out->labels = dt__alloc((size_t)lb.count * sizeof(int32_t));
  if (!out->labels) {
    rc = dt__error_prefix(DT_ERR_NOMEM, "%s", labels_path);
    goto fail;
  }
  out->pixels = im.data; /* the decoded array is kept as it is: no copy */
  im.data = NULL;
  const uint8_t *ly = lb.data;
  int maxl = 0;
  for (uint64_t i = 0; i < lb.count; i++) {
    out->labels[i] = ly[i];
    if (ly[i] > maxl)
      maxl = ly[i];
  }
  out->num_classes = maxl + 1;
  dt_idx_free(&im);
  dt_idx_free(&lb);
  return DT_OK;
fail:
  dt_idx_free(&im);
  dt_idx_free(&lb);
  dt_dataset_free(out);
  return rc;
}

/* Picks dir/base.gz, else dir/base; DT_ERR_NOT_FOUND naming both when neither exists. */
static dt_status find_file(const char *dir, const char *base, char *path, size_t cap) {
  int k = snprintf(path, cap, "%s/%s.gz", dir, base);
  if (k < 0 || (size_t)k >= cap)
    return dt_set_error(DT_ERR_INVALID, "dataset directory name too long: %s", dir);
  if (access(path, F_OK) == 0)
    return DT_OK;
  snprintf(path, cap, "%s/%s", dir, base);
  if (access(path, F_OK) == 0)
    return DT_OK;
  return dt_set_error(DT_ERR_NOT_FOUND, "%s/%s.gz: no such file (nor %s without .gz)", dir, base,
                      base);
}

dt_status dt_dataset_dir_path(const char *dir, dt_split split, bool labels, char *path,
                              size_t cap) {
  char base[64];
  snprintf(base, sizeof base, "%s-%s", split == DT_SPLIT_TEST ? "t10k" : "train",
           labels ? "labels-idx1-ubyte" : "images-idx3-ubyte");
  return find_file(dir ? dir : DT_FASHION_MNIST_DIR, base, path, cap);
}

dt_status dt_dataset_load_dir(const char *dir, dt_split split, const dt_dataset_opts *opts,
                              dt_dataset *out) {
  if (!out)
    return dt_set_error(DT_ERR_INVALID, "dt_dataset_load_dir: out is NULL");
  memset(out, 0, sizeof *out);
  char ip[4096], lp[4096];
  DT_CHECK(dt_dataset_dir_path(dir, split, false, ip, sizeof ip));
  DT_CHECK(dt_dataset_dir_path(dir, split, true, lp, sizeof lp));
  return dt_dataset_load_idx(ip, lp, opts, out);
}

void dt_dataset_free(dt_dataset *ds) {
  if (!ds)
    return;
  dt__free(ds->pixels);
  dt__free(ds->labels);
  memset(ds, 0, sizeof *ds);
}

dt_status dt_dataset_set_scaling(dt_dataset *ds, const dt_dataset_opts *opts) {
  if (!ds)
    return dt_set_error(DT_ERR_INVALID, "dt_dataset_set_scaling: ds is NULL");
  float mean = 0.f, inv_std = 1.f;
  if (opts && opts->normalize) {
    if (!(opts->std > 0.f) || !isfinite(opts->std) || !isfinite(opts->mean))
      return dt_set_error(DT_ERR_INVALID, "normalization mean %g std %g: std must be > 0 and both "
                          "finite", (double)opts->mean, (double)opts->std);
    mean = opts->mean;
    inv_std = 1.f / opts->std;
  }
  /* One multiply-add per value: x = p * (1/255) * inv_std - mean * inv_std. The table is
   * computed once, so every copy of a pixel is the same float. */
  float scale = inv_std / 255.f, shift = -mean * inv_std;
  for (int p = 0; p < 256; p++)
    ds->value[p] = (float)p * scale + shift;
  return DT_OK;
}

void dt_dataset_images(const dt_dataset *ds, uint64_t first, uint64_t n, float *x) {
  size_t sf = (size_t)ds->c * (size_t)ds->h * (size_t)ds->w, cnt = (size_t)n * sf;
  const uint8_t *px = ds->pixels + (size_t)first * sf;
  for (size_t i = 0; i < cnt; i++)
    x[i] = ds->value[px[i]];
}

void dt_dataset_gather(const dt_dataset *ds, const uint32_t *idx, uint64_t n, float *x,
                       int32_t *y) {
  size_t sf = (size_t)ds->c * (size_t)ds->h * (size_t)ds->w;
  for (uint64_t i = 0; i < n; i++) {
    if (x) {
      const uint8_t *px = ds->pixels + (size_t)idx[i] * sf;
      float *dst = x + (size_t)i * sf;
      for (size_t j = 0; j < sf; j++)
        dst[j] = ds->value[px[j]];
    }
    if (y)
      y[i] = ds->labels[idx[i]];
  }
}
