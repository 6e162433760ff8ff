/* test_oom.c - every allocation of an operation fails in turn (dt__alloc_fail_after): model
 * creation (mlp and cnn presets, 1 and 2 threads) and a training step, deferring the linear weight
 * gradients and a deferred step, optimizer creation (SGD with momentum, AdamW) and a step,
 * checkpoint and safetensors save and load, IDX datasets (raw, gzip'd, the real Fashion-MNIST
 * test split) and the loader. For k = 0, 1, 2, ... the allocation after the first k fails, until
 * the operation runs without reaching it. On every k the call either succeeds with the same
 * result as without failures, or returns DT_ERR_NOMEM with a message naming what it could not
 * allocate; and what was there before (a model, a checkpoint directory) is still usable and
 * unchanged. ASan's leak checker covers "nothing leaks". */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include "core/core.h"
#include "dtrain/ckpt.h"
#include "dtrain/data.h"
#include "dtrain/nn.h"

/* Bound on k: the largest sweep here needs a few hundred. */
#define MAX_K 5000
#define B 6

static int verbose;

static void arm(long k) {
  dt_clear_error();
  dt__alloc_fail_after(k);
}

/* Disarms; true when the armed allocation failed. */
static bool fired(void) { return dt__alloc_fail_after(-1) < 0; }

/* rc of an operation whose k-th allocation failed: DT_ERR_NOMEM and a message that says what
 * (more than dt__alloc's bare "cannot allocate N bytes"). */
static void check_nomem(dt_status rc, const char *op, long k) {
  const char *msg = dt_last_error();
  if (verbose)
    fprintf(stderr, "%s k=%ld: %s: %s\n", op, k, dt_strerror(rc), msg);
  if (rc != DT_ERR_NOMEM)
    fail_msg("%s, allocation %ld failing: status %s (%s), want out of memory", op, k, dt_strerror(rc), msg);
  if (!strstr(msg, "allocate") && !strstr(msg, "memory"))
    fail_msg("%s, allocation %ld failing: message \"%s\" does not say memory ran out", op, k, msg);
  if (!strncmp(msg, "cannot allocate", 15))
    fail_msg("%s, allocation %ld failing: message \"%s\" does not name what", op, k, msg);
}

/* Runs step(ctx, k) for k = 0, 1, ... until it returns false (no failure reached); returns the
 * number of failing allocations tried. */
static long sweep(const char *op, bool (*step)(void *ctx, long k), void *ctx) {
  long k = 0;
  while (step(ctx, k)) {
    if (++k > MAX_K)
      fail_msg("%s: still allocating after %d allocations", op, MAX_K);
  }
  if (verbose)
    fprintf(stderr, "%s: %ld allocations swept\n", op, k);
  assert_true(k > 0); /* it allocates at all: the hook reached it */
  return k;
}

/* ---- a batch and a training step ---- */

static void batch_for(const dt_model *m, float *x, int32_t *y) {
  size_t in = dt_model_input_size(m);
  for (size_t i = 0; i < in * B; i++)
    x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f;
  for (int r = 0; r < B; r++)
    y[r] = (r * 7 + 3) % (int)dt_model_output_size(m);
}

/* forward + backward; the loss through *loss */
static void train_step(dt_model *m, float *loss) {
  size_t in = dt_model_input_size(m);
  float *x = malloc(in * B * sizeof(float));
  int32_t y[B];
  assert_non_null(x);
  batch_for(m, x, y);
  dt_model_zero_grad(m);
  assert_int_equal(dt_model_forward(m, x, B, 1, NULL), DT_OK);
  assert_int_equal(dt_model_backward(m, y, 1.0f, NULL, NULL, loss), DT_OK);
  free(x);
}

/* ---- model creation ---- */

typedef struct {
  const char *spec;
  float loss;       /* of the reference */
  float *grads;     /* the reference's */
  size_t n;
} model_case;

static bool model_step(void *ctx, long k) {
  model_case *c = ctx;
  dt_model *m = (dt_model *)1;
  arm(k);
  dt_status rc = dt_model_create(c->spec, B, 7, &m);
  bool hit = fired();
  if (rc != DT_OK) {
    assert_true(hit);
    check_nomem(rc, "model create", k);
    assert_null(m);
    return true;
  }
  float loss;
  train_step(m, &loss);
  assert_true(loss == c->loss);
  assert_memory_equal(dt_model_grads(m), c->grads, c->n * sizeof(float));
  dt_model_destroy(m);
  return hit;
}

static void model_sweep(const char *spec, int threads) {
  dt_nn_set_threads(threads);
  model_case c = {.spec = spec};
  dt_model *m;
  assert_int_equal(dt_model_create(spec, B, 7, &m), DT_OK);
  train_step(m, &c.loss);
  c.n = dt_model_param_count(m);
  c.grads = malloc(c.n * sizeof(float));
  memcpy(c.grads, dt_model_grads(m), c.n * sizeof(float));
  dt_model_destroy(m);
  sweep(spec, model_step, &c);
  free(c.grads);
  dt_nn_set_threads(1);
}

static void test_model_create(void **st) {
  (void)st;
  model_sweep("mlp", 1);
  model_sweep("cnn", 1);
  model_sweep("mlp", 2);
  model_sweep("cnn", 2);
  model_sweep("in=1x8x8,conv3x3:4,relu,maxpool2,flatten,linear:16,gelu,dropout:0.5,layernorm,linear:3", 2);
}

/* ---- deferred linear weight gradients ---- */

#define DSPEC "in=1x16x16,linear:32,relu,linear:4"

typedef struct {
  float *deferred;  /* parameters after a deferred SGD step */
  float *plain;     /* after the same step from the gradients */
  size_t n;
} defer_case;

static float *export_for(dt_model *m) {
  float *ex = aligned_alloc(64, (dt_model_export_size(m, B) * sizeof(float) + 63) / 64 * 64);
  assert_non_null(ex);
  return ex;
}

/* One SGD step with momentum on m, deferred through ex when ex is not NULL. */
static void sgd_step(dt_model *m, const float *ex) {
  dt_optim_config cfg = dt_optim_defaults(DT_OPTIM_SGD);
  cfg.momentum = 0.9f;
  dt_param_range all = {0, dt_model_param_count(m)};
  dt_optim *o;
  assert_int_equal(dt_optim_create_ranges(&cfg, m, &all, 1, &o), DT_OK);
  float loss;
  dt_model_discard_grad(m);
  train_step(m, &loss);
  assert_int_equal(dt_optim_begin_step(o, 0.1f), DT_OK);
  const float *g = dt_model_grads(m);
  if (ex)
    assert_int_equal(dt_optim_step_range_deferred(o, 0, &g, &ex, 1, 1.0f), DT_OK);
  else
    assert_int_equal(dt_optim_step_range_sum(o, 0, &g, 1, 1.0f), DT_OK);
  dt_optim_destroy(o);
}

static bool defer_step(void *ctx, long k) {
  defer_case *c = ctx;
  dt_model *m;
  assert_int_equal(dt_model_create(DSPEC, B, 3, &m), DT_OK);
  float *ex = export_for(m);
  arm(k);
  dt_status rc = dt_model_defer_linear_grads(m, ex, B);
  bool hit = fired();
  if (rc != DT_OK) {
    assert_true(hit);
    check_nomem(rc, "defer linear grads", k);
    sgd_step(m, NULL); /* trains on without deferral */
    assert_memory_equal(dt_model_params(m), c->plain, c->n * sizeof(float));
  } else {
    sgd_step(m, ex);
    assert_memory_equal(dt_model_params(m), c->deferred, c->n * sizeof(float));
  }
  dt_model_destroy(m);
  free(ex);
  return hit;
}

static void defer_sweep(int threads) {
  dt_nn_set_threads(threads);
  defer_case c;
  dt_model *m;
  assert_int_equal(dt_model_create(DSPEC, B, 3, &m), DT_OK);
  c.n = dt_model_param_count(m);
  sgd_step(m, NULL);
  c.plain = malloc(c.n * sizeof(float));
  memcpy(c.plain, dt_model_params(m), c.n * sizeof(float));
  dt_model_destroy(m);
  assert_int_equal(dt_model_create(DSPEC, B, 3, &m), DT_OK);
  float *ex = export_for(m);
  assert_int_equal(dt_model_defer_linear_grads(m, ex, B), DT_OK);
  sgd_step(m, ex);
  c.deferred = malloc(c.n * sizeof(float));
  memcpy(c.deferred, dt_model_params(m), c.n * sizeof(float));
  dt_model_destroy(m);
  free(ex);
  sweep("defer", defer_step, &c);
  free(c.plain);
  free(c.deferred);
  dt_nn_set_threads(1);
}

static void test_defer(void **st) {
  (void)st;
  defer_sweep(1);
  defer_sweep(2);
}

/* ---- optimizers ---- */

typedef struct {
  dt_optim_config cfg;
  float *want;      /* parameters after two steps */
  size_t n;
} optim_case;

static void two_steps(dt_model *m, dt_optim *o) {
  for (int s = 0; s < 2; s++) {
    float loss;
    train_step(m, &loss);
    assert_int_equal(dt_optim_step(o, 0.05f), DT_OK);
  }
}

static bool optim_step(void *ctx, long k) {
  optim_case *c = ctx;
  dt_model *m;
  assert_int_equal(dt_model_create("mlp", B, 11, &m), DT_OK);
  dt_optim *o = (dt_optim *)1;
  arm(k);
  dt_status rc = dt_optim_create(&c->cfg, m, &o);
  bool hit = fired();
  if (rc != DT_OK) {
    assert_true(hit);
    check_nomem(rc, "optimizer create", k);
    assert_null(o);
  } else {
    two_steps(m, o);
    assert_memory_equal(dt_model_params(m), c->want, c->n * sizeof(float));
    dt_optim_destroy(o);
  }
  dt_model_destroy(m);
  return hit;
}

static void optim_sweep(dt_optim_config cfg) {
  optim_case c = {.cfg = cfg};
  dt_model *m;
  dt_optim *o;
  assert_int_equal(dt_model_create("mlp", B, 11, &m), DT_OK);
  assert_int_equal(dt_optim_create(&cfg, m, &o), DT_OK);
  two_steps(m, o);
  c.n = dt_model_param_count(m);
  c.want = malloc(c.n * sizeof(float));
  memcpy(c.want, dt_model_params(m), c.n * sizeof(float));
  dt_optim_destroy(o);
  dt_model_destroy(m);
  sweep(cfg.kind == DT_OPTIM_SGD ? "sgd" : "adamw", optim_step, &c);
  free(c.want);
}

static void test_optim(void **st) {
  (void)st;
  dt_optim_config sgd = dt_optim_defaults(DT_OPTIM_SGD);
  sgd.momentum = 0.9f;
  optim_sweep(sgd);
  optim_sweep(dt_optim_defaults(DT_OPTIM_ADAMW));
}

/* ---- checkpoints and safetensors ---- */

static char g_dir[64];
static float g_a[1000], g_b[77];
static const dt_kv g_meta[] = {{"model", "mlp"}, {"seed", "11"}, {"step", "0"}};

static void sections(dt_ckpt_section *s, float shift) {
  for (size_t i = 0; i < 1000; i++)
    g_a[i] = (float)i + shift;
  for (size_t i = 0; i < 77; i++)
    g_b[i] = -(float)i - shift;
  s[0] = (dt_ckpt_section){.name = "params", .data = g_a, .nbytes = sizeof g_a};
  s[1] = (dt_ckpt_section){.name = "optim.momentum", .data = g_b, .nbytes = sizeof g_b};
}

/* The checkpoint c holds step with the sections sections(shift) made. */
static void check_ckpt(const dt_ckpt *c, uint64_t step, float shift) {
  dt_ckpt_section s[2];
  sections(s, shift);
  assert_int_equal(dt_ckpt_step(c), step);
  assert_int_equal(dt_ckpt_count(c), 2);
  for (int i = 0; i < 2; i++) {
    const dt_ckpt_section *r = dt_ckpt_find(c, s[i].name);
    assert_non_null(r);
    assert_int_equal(r->nbytes, s[i].nbytes);
    assert_memory_equal(r->data, s[i].data, s[i].nbytes);
  }
  assert_string_equal(dt_ckpt_meta_get(c, "model"), "mlp");
  assert_int_equal(dt_ckpt_meta_count(c), 3);
}

/* Files in g_dir (checkpoints, temporaries, anything). */
static int dir_entries(void) {
  DIR *d = opendir(g_dir);
  assert_non_null(d);
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d)))
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
      n++;
  closedir(d);
  return n;
}

static void latest_is(uint64_t step, float shift) {
  dt_ckpt *c;
  assert_int_equal(dt_ckpt_open_latest(g_dir, &c), DT_OK);
  check_ckpt(c, step, shift);
  assert_string_equal(dt_ckpt_skipped(c), "");
  dt_ckpt_destroy(c);
}

static bool save_step(void *ctx, long k) {
  (void)ctx;
  dt_ckpt_section s[2];
  sections(s, 2.0f);
  char path[256];
  arm(k);
  dt_status rc = dt_ckpt_save(g_dir, 2, s, 2, g_meta, 3, 0, path, sizeof path);
  bool hit = fired();
  if (rc != DT_OK) {
    assert_true(hit);
    check_nomem(rc, "checkpoint save", k);
    assert_int_equal(dir_entries(), 1); /* step 1 alone, no temporary file */
    latest_is(1, 1.0f);
  } else {
    assert_int_equal(dir_entries(), 2);
    latest_is(2, 2.0f);
    assert_int_equal(unlink(path), 0);
  }
  return hit;
}

static bool open_step(void *ctx, long k) {
  (void)ctx;
  dt_ckpt *c = (dt_ckpt *)1;
  arm(k);
  dt_status rc = dt_ckpt_open_latest(g_dir, &c);
  bool hit = fired();
  if (rc != DT_OK) { /* never the older step 1 instead */
    assert_true(hit);
    check_nomem(rc, "checkpoint load", k);
    assert_null(c);
  } else {
    check_ckpt(c, 2, 2.0f);
    dt_ckpt_destroy(c);
  }
  return hit;
}

static bool list_step(void *ctx, long k) {
  (void)ctx;
  uint64_t *steps = NULL;
  char **paths = NULL;
  size_t n = 0, np = 0;
  arm(k);
  dt_status rc = dt_ckpt_list(g_dir, &steps, &n);
  dt_status rp = rc == DT_OK ? dt_ckpt_list_paths(g_dir, &paths, &np) : DT_OK;
  bool hit = fired();
  if (rc != DT_OK || rp != DT_OK) {
    assert_true(hit);
    check_nomem(rc != DT_OK ? rc : rp, "checkpoint list", k);
  } else {
    assert_int_equal(n, 2);
    assert_int_equal(np, 2);
    assert_int_equal(steps[1], 2);
  }
  free(steps);
  free(paths);
  return hit;
}

static void test_ckpt(void **st) {
  (void)st;
  snprintf(g_dir, sizeof g_dir, "/tmp/dtrain-oom-%d", (int)getpid());
  dt_ckpt_section s[2];
  sections(s, 1.0f);
  assert_int_equal(dt_ckpt_save(g_dir, 1, s, 2, g_meta, 3, 0, NULL, 0), DT_OK);
  sweep("checkpoint save", save_step, NULL);
  sections(s, 2.0f);
  assert_int_equal(dt_ckpt_save(g_dir, 2, s, 2, g_meta, 3, 0, NULL, 0), DT_OK);
  sweep("checkpoint load", open_step, NULL);
  sweep("checkpoint list", list_step, NULL);
  char p[128];
  for (int step = 1; step <= 2; step++) {
    snprintf(p, sizeof p, "%s/ckpt-%09d.dtc", g_dir, step);
    assert_int_equal(unlink(p), 0);
  }
  assert_int_equal(rmdir(g_dir), 0);
}

static char g_st[96];

static void st_views(dt_tensor_view *v) {
  for (size_t i = 0; i < 1000; i++)
    g_a[i] = (float)i * 0.5f;
  v[0] = (dt_tensor_view){.name = "fc1.weight", .dtype = DT_ST_F32, .ndim = 2, .shape = {10, 100},
                          .data = g_a, .nbytes = sizeof g_a};
  v[1] = (dt_tensor_view){.name = "fc1.bias", .dtype = DT_ST_F32, .ndim = 1, .shape = {77},
                          .data = g_b, .nbytes = sizeof g_b};
}

static bool st_write_step(void *ctx, long k) {
  (void)ctx;
  dt_tensor_view v[2];
  st_views(v);
  arm(k);
  dt_status rc = dt_safetensors_write(g_st, v, 2, g_meta, 3);
  bool hit = fired();
  if (rc != DT_OK) {
    assert_true(hit);
    check_nomem(rc, "safetensors write", k);
    assert_int_equal(access(g_st, F_OK), -1);
  } else {
    assert_int_equal(unlink(g_st), 0);
  }
  return hit;
}

static bool st_open_step(void *ctx, long k) {
  (void)ctx;
  dt_safetensors *f = (dt_safetensors *)1;
  arm(k);
  dt_status rc = dt_safetensors_open(g_st, &f);
  bool hit = fired();
  if (rc != DT_OK) {
    assert_true(hit);
    check_nomem(rc, "safetensors open", k);
    assert_null(f);
  } else {
    assert_int_equal(dt_safetensors_count(f), 2);
    const dt_tensor_view *w = dt_safetensors_find(f, "fc1.weight");
    assert_non_null(w);
    assert_memory_equal(w->data, g_a, sizeof g_a);
    assert_string_equal(dt_safetensors_meta_get(f, "seed"), "11");
    dt_safetensors_destroy(f);
  }
  return hit;
}

static void test_safetensors(void **st) {
  (void)st;
  snprintf(g_st, sizeof g_st, "/tmp/dtrain-oom-%d.safetensors", (int)getpid());
  sweep("safetensors write", st_write_step, NULL);
  dt_tensor_view v[2];
  st_views(v);
  assert_int_equal(dt_safetensors_write(g_st, v, 2, g_meta, 3), DT_OK);
  sweep("safetensors open", st_open_step, NULL);
  assert_int_equal(unlink(g_st), 0);
}

/* ---- datasets and the loader ---- */

enum { DN = 300, DH = 5, DW = 4 };
static char g_img[96], g_lab[96];

/* An IDX file: magic 0x0000080<nd>, big-endian dims, u8 data; gzip'd when gz. */
static void write_idx(const char *path, int nd, const uint32_t *dims, const uint8_t *data, size_t n, bool gz) {
  uint8_t head[4 + 4 * 4] = {0, 0, 0x08, (uint8_t)nd};
  for (int d = 0; d < nd; d++)
    for (int b = 0; b < 4; b++)
      head[4 + 4 * d + b] = (uint8_t)(dims[d] >> (24 - 8 * b));
  if (gz) {
    gzFile f = gzopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(gzwrite(f, head, (unsigned)(4 + 4 * nd)), 4 + 4 * nd);
    assert_int_equal(gzwrite(f, data, (unsigned)n), (int)n);
    assert_int_equal(gzclose(f), Z_OK);
  } else {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(head, 1, (size_t)(4 + 4 * nd), f), (size_t)(4 + 4 * nd));
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
  }
}

static void write_set(bool gz) {
  static uint8_t px[DN * DH * DW], lb[DN];
  for (size_t i = 0; i < sizeof px; i++)
    px[i] = (uint8_t)(i * 37 + 5);
  for (int i = 0; i < DN; i++)
    lb[i] = (uint8_t)(i % 10);
  uint32_t di[3] = {DN, DH, DW}, dl[1] = {DN};
  write_idx(g_img, 3, di, px, sizeof px, gz);
  write_idx(g_lab, 1, dl, lb, sizeof lb, gz);
}

typedef struct {
  const char *dir;  /* NULL: g_img, g_lab */
  uint64_t n;       /* samples */
  uint32_t crc;     /* of pixels then labels */
} data_case;

static uint32_t set_crc(const dt_dataset *ds) {
  size_t px = (size_t)ds->n * (size_t)ds->c * (size_t)ds->h * (size_t)ds->w;
  return dt_crc32c(dt_crc32c(0, ds->pixels, px), ds->labels, (size_t)ds->n * sizeof(int32_t));
}

static dt_status load(const data_case *c, dt_dataset *ds) {
  return c->dir ? dt_dataset_load_dir(c->dir, DT_SPLIT_TEST, NULL, ds)
                : dt_dataset_load_idx(g_img, g_lab, NULL, ds);
}

static bool data_step(void *ctx, long k) {
  data_case *c = ctx;
  dt_dataset ds;
  arm(k);
  dt_status rc = load(c, &ds);
  bool hit = fired();
  if (rc != DT_OK) {
    assert_true(hit);
    check_nomem(rc, "dataset load", k);
    assert_null(ds.pixels);
    assert_null(ds.labels);
  } else {
    assert_int_equal(ds.n, c->n);
    assert_int_equal(set_crc(&ds), c->crc);
    dt_dataset_free(&ds);
  }
  return hit;
}

static void data_sweep(data_case *c) {
  dt_dataset ds;
  assert_int_equal(load(c, &ds), DT_OK);
  c->n = ds.n;
  c->crc = set_crc(&ds);
  dt_dataset_free(&ds);
  sweep(c->dir ? c->dir : g_img, data_step, c);
}

typedef struct {
  dt_dataset ds;
  bool prefetch;
  float x[3][16 * DH * DW]; /* the first three batches */
  int32_t y[3][16];
} loader_case;

static const dt_sampler_cfg *loader_cfg(void) {
  static dt_sampler_cfg cfg = {.num_samples = DN, .global_batch = 32, .rank = 1, .world = 2,
                               .seed = 5, .shuffle = true};
  return &cfg;
}

static void three_batches(dt_loader *l, loader_case *c, bool record) {
  for (int i = 0; i < 3; i++) {
    dt_batch b;
    assert_int_equal(dt_loader_next(l, &b), DT_OK);
    assert_int_equal(b.n, 16);
    if (record) {
      memcpy(c->x[i], b.x, sizeof c->x[i]);
      memcpy(c->y[i], b.y, sizeof c->y[i]);
    } else {
      assert_memory_equal(c->x[i], b.x, sizeof c->x[i]);
      assert_memory_equal(c->y[i], b.y, sizeof c->y[i]);
    }
  }
}

static bool loader_step(void *ctx, long k) {
  loader_case *c = ctx;
  dt_loader_opts o = {.prefetch = c->prefetch};
  dt_loader *l = (dt_loader *)1;
  arm(k);
  dt_status rc = dt_loader_create(&c->ds, loader_cfg(), &o, &l);
  bool hit = fired();
  if (rc != DT_OK) {
    assert_true(hit);
    check_nomem(rc, "loader create", k);
    assert_null(l);
  } else {
    three_batches(l, c, false);
    dt_loader_destroy(l);
  }
  return hit;
}

static void test_data(void **st) {
  (void)st;
  snprintf(g_img, sizeof g_img, "/tmp/dtrain-oom-%d-images", (int)getpid());
  snprintf(g_lab, sizeof g_lab, "/tmp/dtrain-oom-%d-labels", (int)getpid());
  data_case c = {0};
  write_set(false);
  data_sweep(&c);
  write_set(true);
  data_sweep(&c);
  static loader_case lc;
  assert_int_equal(dt_dataset_load_idx(g_img, g_lab, NULL, &lc.ds), DT_OK);
  for (int p = 0; p < 2; p++) {
    lc.prefetch = p;
    dt_loader_opts o = {.prefetch = lc.prefetch};
    dt_loader *l;
    assert_int_equal(dt_loader_create(&lc.ds, loader_cfg(), &o, &l), DT_OK);
    three_batches(l, &lc, true);
    dt_loader_destroy(l);
    sweep("loader", loader_step, &lc);
  }
  dt_dataset_free(&lc.ds);
  assert_int_equal(unlink(g_img), 0);
  assert_int_equal(unlink(g_lab), 0);
  char path[4096];
  if (dt_dataset_dir_path(NULL, DT_SPLIT_TEST, false, path, sizeof path) != DT_OK) {
    fprintf(stderr, "Fashion-MNIST not installed: its sweep skipped\n");
    return;
  }
  data_case f = {.dir = DT_FASHION_MNIST_DIR};
  data_sweep(&f);
}

int main(void) {
  verbose = getenv("DTRAIN_OOM_VERBOSE") != NULL;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_model_create), cmocka_unit_test(test_defer),
      cmocka_unit_test(test_optim),        cmocka_unit_test(test_ckpt),
      cmocka_unit_test(test_safetensors),  cmocka_unit_test(test_data),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
