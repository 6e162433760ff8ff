/* train_io.c - the trainer's files: the model as safetensors (save, and rebuild + load for
 * `dtrain eval`), single-process test-set evaluation, and training checkpoints.
 *
 * This is the one place where the parallel layer uses ckpt: a checkpoint must hold the trainer's
 * state (parameters, optimizer buffers, step, sampler position), while dtrain/ckpt.h stays a
 * model-agnostic container of named sections, so the mapping lives with the trainer.
 *
 * Checkpoint layout: sections "params" and one per optimizer buffer (named as
 * dt_optim_state names them: "momentum", "adam_m", "adam_v"), all F32 in the params layout and
 * whole (a run with a sharded optimizer, --zero 1, gathers its shards first: the file does not
 * say how the state was spread, so any run resumes from it);
 * meta keys step, optim_steps, sampler_seed, sampler_epoch, sampler_pos, epoch, model_spec,
 * global_batch, world_size, seed, optimizer, accumulate, param_count, dropout_rng, and the
 * settings a resume compares (momentum: refused when it differs; lr, schedule, weight_decay,
 * epochs, nesterov, clip: a warning; files without them are read as before). Dropout masks are a
 * pure function of (seed, step, the sample's position in the global batch, layer) (see
 * train_internal.h), so no RNG stream needs saving: "dropout_rng" records that rule.
 *
 * Not here: the loop (trainer.c), the checkpoint file format itself (ckpt). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "dtrain/ckpt.h"
#include "dtrain/data.h"
#include "parallel/train_internal.h"

#define META_SPEC "dtrain.model_spec"


dt_status dt_train_model_save(dt_model *m, const char *path) {
  size_t n = dt_model_tensor_count(m);
  dt_tensor_view *v = dt__calloc((n ? n : 1) * sizeof *v);
  if (!v)
    return dt_set_error(DT_ERR_NOMEM, "saving %s: out of memory", path);
  const float *p = dt_model_params(m);
  for (size_t i = 0; i < n; i++) {
    const dt_tensor *t = dt_model_tensor(m, i);
    v[i].name = t->name;
    v[i].dtype = DT_ST_F32;
    v[i].ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++)
      v[i].shape[d] = (uint64_t)t->shape[d];
    v[i].data = p + t->offset;
    v[i].nbytes = t->count * sizeof(float);
  }
  dt_kv meta[] = {{META_SPEC, dt_model_spec(m)}, {"format", "pt"}, {"dtrain.version", dt_version()}};
  dt_status rc = dt__mkdir_parents(path);
  if (rc == DT_OK)
    rc = dt_safetensors_write(path, v, n, meta, DT_ARRAY_LEN(meta));
  dt__free(v);
  return rc;
}

dt_status dt_train_model_load(const char *path, int max_batch, dt_model **out) {
  *out = NULL;
  dt_safetensors *f = NULL;
  DT_CHECK(dt_safetensors_open(path, &f));
  dt_status rc;
  dt_model *m = NULL;
  const char *spec = dt_safetensors_meta_get(f, META_SPEC);
  if (!spec) {
    rc = dt_set_error(DT_ERR_CORRUPT,
                      "%s: no \"%s\" in the metadata: not a model written by dtrain train", path,
                      META_SPEC);
    goto fail;
  }
  /* the spec's size against the file's before anything that size is allocated: a small file
   * naming a huge model is damaged, not a reason to allocate gigabytes */
  size_t want = 0, have = 0;
  rc = dt_model_spec_param_count(spec, &want);
  for (size_t i = 0; rc == DT_OK && i < dt_safetensors_count(f); i++) {
    const dt_tensor_view *v = dt_safetensors_tensor(f, i);
    have += v->nbytes / DT_MAX((size_t)1, dt_st_dtype_size(v->dtype));
  }
  if (rc == DT_OK && want > have) {
    rc = dt_set_error(DT_ERR_CORRUPT, "%s: the model spec in the metadata has %zu parameters, the file's tensors "
                      "hold %zu values", path, want, have);
    goto fail;
  }
  if (rc == DT_OK)
    rc = dt_model_create(spec, max_batch, 0, &m);
  if (rc != DT_OK) {
    rc = dt__error_prefix(rc, "%s: model spec in the metadata", path);
    goto fail;
  }
  float *p = dt_model_params(m);
  for (size_t i = 0; i < dt_model_tensor_count(m); i++) {
    const dt_tensor *t = dt_model_tensor(m, i);
    const dt_tensor_view *v = dt_safetensors_find(f, t->name);
    if (!v) {
      rc = dt_set_error(DT_ERR_CORRUPT, "%s: tensor %s of the model is missing", path, t->name);
      goto fail;
    }
    int same = v->dtype == DT_ST_F32 && v->ndim == t->ndim;
    for (int d = 0; same && d < t->ndim; d++)
      same = v->shape[d] == (uint64_t)t->shape[d];
    if (!same) {
      char has[128], needs[128];
      size_t k = 0;
      for (int d = 0; d < v->ndim && k < sizeof has; d++)
        k += (size_t)snprintf(has + k, sizeof has - k, "%s%llu", d ? "x" : "",
                              (unsigned long long)v->shape[d]);
      k = 0;
      for (int d = 0; d < t->ndim && k < sizeof needs; d++)
        k += (size_t)snprintf(needs + k, sizeof needs - k, "%s%lld", d ? "x" : "",
                              (long long)t->shape[d]);
      rc = dt_set_error(DT_ERR_CORRUPT, "%s: tensor %s is %s %s, the model spec in the metadata "
                        "needs F32 %s", path, t->name,
                        dt_st_dtype_name(v->dtype) ? dt_st_dtype_name(v->dtype) : "?",
                        v->ndim ? has : "(scalar)", needs);
      goto fail;
    }
    memcpy(p + t->offset, v->data, t->count * sizeof(float));
  }
  /* every model tensor was found above (names are unique): more in the file is another model's */
  if (dt_safetensors_count(f) > dt_model_tensor_count(m)) {
    const char *extra = "?";
    for (size_t i = 0; i < dt_safetensors_count(f); i++)
      if (!dt_model_find_tensor(m, dt_safetensors_tensor(f, i)->name))
        extra = dt_safetensors_tensor(f, i)->name;
    rc = dt_set_error(DT_ERR_CORRUPT, "%s: tensor %s is not in the model spec of the metadata (%zu tensors, the "
                      "model has %zu)", path, extra, dt_safetensors_count(f), dt_model_tensor_count(m));
    goto fail;
  }
  dt_safetensors_destroy(f);
  *out = m;
  return DT_OK;
fail:
  dt_model_destroy(m);
  dt_safetensors_destroy(f);
  return rc;
}

/* dir's images file of a split, or a generic name if it cannot be found again. */
static void images_path(const char *dir, dt_split split, char *path, size_t cap) {
  if (dt_dataset_dir_path(dir, split, false, path, cap) != DT_OK)
    snprintf(path, cap, "the %s images", split == DT_SPLIT_TEST ? "test" : "training");
}

dt_status dt__train_check_data(const dt_model *m, const char *model_name, const char *dir,
                               const dt_dataset *train, const dt_dataset *test) {
  char tp[4096], sp[4096];
  const dt_dataset *ds = train ? train : test;
  const char *mname = model_name ? model_name : dt_model_spec(m);
  images_path(dir, train ? DT_SPLIT_TRAIN : DT_SPLIT_TEST, sp, sizeof sp);
  if (train && (test->c != train->c || test->h != train->h || test->w != train->w)) {
    images_path(dir, DT_SPLIT_TEST, tp, sizeof tp);
    return dt_set_error(DT_ERR_INVALID, "%s holds %dx%dx%d images (C x H x W) but %s holds "
                        "%dx%dx%d: training and test images must have the same shape", tp,
                        test->c, test->h, test->w, sp, train->c, train->h, train->w);
  }
  int c, h, w;
  dt_model_input_shape(m, &c, &h, &w);
  size_t in = (size_t)c * h * w, sample = (size_t)ds->c * ds->h * ds->w;
  bool flat = h == 1 && w == 1;
  if (flat ? in != sample : ds->c != c || ds->h != h || ds->w != w) {
    char want[64];
    if (flat)
      snprintf(want, sizeof want, "%zu values", in);
    else
      snprintf(want, sizeof want, "%dx%dx%d images", c, h, w);
    return dt_set_error(DT_ERR_INVALID, "model '%s' takes %s but %s holds %dx%dx%d images (C x H "
                        "x W)%s", mname, want, sp, ds->c, ds->h, ds->w, in == sample ?
                        ": the same number of values in another order (an N x H x W file is read "
                        "as 1xHxW; N x H x W x C and other orders are refused)" : "");
  }
  int classes = DT_MAX(ds->num_classes, test->num_classes);
  if ((size_t)classes > dt_model_output_size(m))
    return dt_set_error(DT_ERR_INVALID, "model '%s' has %zu outputs but the dataset in %s has %d "
                        "classes", mname, dt_model_output_size(m), dir ? dir : DT_FASHION_MNIST_DIR,
                        classes);
  return DT_OK;
}

dt_status dt_train_evaluate(dt_model *m, const char *data_dir, int batch, double *test_loss,
                            double *test_accuracy, uint64_t *samples) {
  dt_dataset ds;
  DT_CHECK(dt_dataset_load_dir(data_dir, DT_SPLIT_TEST, NULL, &ds));
  dt_status rc = DT_OK;
  float *x = NULL;
  size_t in = dt_model_input_size(m);
  rc = dt__train_check_data(m, NULL, data_dir, NULL, &ds);
  if (rc != DT_OK)
    goto out;
  int maxb = DT_MIN(batch > 0 ? batch : dt_model_max_batch(m), dt_model_max_batch(m));
  if (ds.n && (uint64_t)maxb > ds.n) /* one batch holds the whole set */
    maxb = (int)ds.n;
  double loss = 0;
  int64_t correct = 0;
  /* the set stays u8; one chunk at a time becomes float */
  x = dt__alloc((size_t)maxb * in * sizeof(float));
  if (!x) {
    rc = dt__error_prefix(DT_ERR_NOMEM, "evaluation batch (%d samples)", maxb);
    goto out;
  }
  for (uint64_t off = 0; off < ds.n; off += (uint64_t)maxb) {
    int n = (int)DT_MIN((uint64_t)maxb, ds.n - off);
    dt_dataset_images(&ds, off, (uint64_t)n, x);
    rc = dt_model_eval_batch(m, x, ds.labels + off, n, &loss, &correct);
    if (rc != DT_OK)
      goto out;
  }
  *test_loss = loss / (double)ds.n;
  *test_accuracy = (double)correct / (double)ds.n;
  if (samples)
    *samples = ds.n;
out:
  dt__free(x);
  dt_dataset_free(&ds);
  return rc;
}

/* ---- checkpoints -------------------------------------------------------------------------- */

dt_status dt__train_ckpt_prepare(const dt_train_config *cfg, int *lock_fd) {
  const char *dir = cfg->checkpoint_dir;
  char p[PATH_MAX];
  *lock_fd = -1;
  if (snprintf(p, sizeof p, "%s/dtrain.lock", dir) >= (int)sizeof p)
    return dt_set_error(DT_ERR_INVALID, "checkpoint directory %s: path too long", dir);
  if (dt__mkdir_parents(p) != DT_OK)
    return dt__error_prefix(DT_ERR_INVALID, "checkpoint directory %s", dir);
  /* creating the lock file is the writability check (EROFS, EACCES, ENOTDIR for a file) */
  int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    return dt__errno(DT_ERR_INVALID, "checkpoint directory %s is not a writable directory: %s", dir, p);
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    char pid[24] = "";
    ssize_t r = pread(fd, pid, sizeof pid - 1, 0);
    pid[r > 0 ? r : 0] = '\0';
    pid[strcspn(pid, "\n")] = '\0';
    close(fd);
    errno = e;
    if (e == EWOULDBLOCK)
      return dt_set_error(DT_ERR_INVALID, "checkpoint directory %s is in use by another job "
                          "(process %s holds %s): give each job its own --checkpoint-dir", dir,
                          pid[0] ? pid : "?", p);
    return dt__errno(DT_ERR_INVALID, "checkpoint directory %s: locking %s", dir, p);
  }
  if (ftruncate(fd, 0) == 0)
    dprintf(fd, "%ld\n", (long)getpid());
  /* A fresh run would prune its own checkpoints and keep the earlier run's higher-numbered
   * ones, which a later --resume would then continue. */
  if (!cfg->resume) {
    char **paths;
    size_t n;
    dt_status rc = dt_ckpt_list_paths(dir, &paths, &n);
    if (rc == DT_OK && n)
      rc = dt_set_error(DT_ERR_INVALID, "checkpoint directory %s holds checkpoints of an earlier run "
                        "(newest %s): pass --resume to continue it, or choose another --checkpoint-dir",
                        dir, paths[n - 1]);
    dt__free(paths);
    if (rc != DT_OK) {
      close(fd);
      return rc;
    }
  }
  *lock_fd = fd;
  return DT_OK;
}

static const char *optim_name(dt_optim_kind k) { return k == DT_OPTIM_ADAMW ? "adamw" : "sgd"; }

/* Settings a resume may change (the run goes on, but not as the uninterrupted one would):
 * stored, and compared with a warning. */
enum { SOFT_N = 7 };
static const char *const soft_key[SOFT_N] = {"lr", "schedule", "weight_decay", "epochs", "nesterov", "clip",
                                             "accumulate"};
static const char *const soft_flag[SOFT_N] = {"--lr",     "--schedule", "--weight-decay", "--epochs",
                                              "--nesterov", "--clip",   "--accumulate"};

static void soft_values(const dt_train_config *cfg, char v[SOFT_N][64]) {
  snprintf(v[0], 64, "%g", cfg->lr);
  snprintf(v[1], 64, "%s", cfg->schedule ? cfg->schedule : "constant");
  snprintf(v[2], 64, "%g", cfg->optim.weight_decay);
  snprintf(v[3], 64, "%d", cfg->epochs);
  snprintf(v[4], 64, "%s", cfg->optim.nesterov ? "on" : "off");
  snprintf(v[5], 64, "%g", cfg->clip > 0 ? cfg->clip : 0.0f); /* 0: off */
  snprintf(v[6], 64, "%d", cfg->accumulate);
}

static float run_momentum(const dt_train_config *cfg) {
  return cfg->optim.kind == DT_OPTIM_SGD ? cfg->optim.momentum : 0;
}

dt_status dt__train_ckpt_save(const dt_train_config *cfg, dt_model *m, const dt__train_state *st, const char *data,
                              const dt__train_pos *pos, int world, char *path_out, size_t cap) {
  size_t np = dt_model_param_count(m);
  dt_ckpt_section sec[4];
  size_t ns = 0;
  sec[ns++] = (dt_ckpt_section){.name = "params", .data = dt_model_params(m), .nbytes = np * 4};
  for (size_t i = 0; i < st->n && ns < DT_ARRAY_LEN(sec); i++)
    sec[ns++] = (dt_ckpt_section){.name = st->name[i], .data = st->buf[i], .nbytes = np * 4};
  char v[10][32];
  snprintf(v[0], 32, "%" PRId64, pos->step);
  snprintf(v[1], 32, "%" PRId64, pos->optim_steps);
  snprintf(v[2], 32, "%" PRIu64, pos->sampler.seed);
  snprintf(v[3], 32, "%" PRIu64, pos->sampler.epoch);
  snprintf(v[4], 32, "%" PRIu64, pos->sampler.pos);
  snprintf(v[5], 32, "%d", cfg->global_batch);
  snprintf(v[6], 32, "%d", world);
  snprintf(v[7], 32, "%" PRIu64, cfg->seed);
  snprintf(v[8], 32, "%zu", np);
  snprintf(v[9], 32, "%" PRIu64, pos->sampler.epoch);
  char ev[2][40];
  snprintf(ev[0], sizeof ev[0], "%.17g", pos->epoch_loss);
  snprintf(ev[1], sizeof ev[1], "%" PRId64, pos->epoch_steps);
  char mom[32], sv[SOFT_N][64];
  snprintf(mom, sizeof mom, "%g", run_momentum(cfg));
  soft_values(cfg, sv);
  dt_kv meta[] = {
      {"step", v[0]},         {"optim_steps", v[1]},  {"sampler_seed", v[2]},
      {"sampler_epoch", v[3]}, {"sampler_pos", v[4]}, {"global_batch", v[5]},
      {"world_size", v[6]},   {"seed", v[7]},         {"accumulate", sv[6]},
      {"param_count", v[8]},  {"epoch", v[9]},        {"model_spec", dt_model_spec(m)},
      {"train_data", data},
      {"optimizer", optim_name(cfg->optim.kind)},
      {"dropout_rng", DT__TRAIN_DROPOUT_RULE},
      {"momentum", mom},      {"lr", sv[0]},          {"schedule", sv[1]},
      {"weight_decay", sv[2]}, {"epochs", sv[3]},     {"nesterov", sv[4]},
      {"clip", sv[5]},
      {"epoch_loss_sum", ev[0]}, {"epoch_loss_steps", ev[1]},
  };
  return dt_ckpt_save(cfg->checkpoint_dir, (uint64_t)pos->step, sec, ns, meta, DT_ARRAY_LEN(meta),
                      cfg->keep, path_out, cap);
}

static dt_status meta_expect(const dt_ckpt *c, const char *key, const char *want, const char *flag) {
  const char *have = dt_ckpt_meta_get(c, key);
  if (!have)
    return dt_set_error(DT_ERR_CORRUPT, "%s: meta key %s missing", dt_ckpt_path(c), key);
  if (strcmp(have, want))
    return dt_set_error(DT_ERR_MISMATCH, "%s was written with %s %s, this run has %s",
                        dt_ckpt_path(c), flag, have, want);
  return DT_OK;
}

/* A position field of the checkpoint: missing or not a number means the file is damaged (its
 * checksums hold, so another writer made it), never "no checkpoint". */
static dt_status meta_pos(const dt_ckpt *c, const char *key, uint64_t *out) {
  dt_status rc = dt_ckpt_meta_u64(c, key, out);
  if (rc == DT_ERR_NOT_FOUND)
    return dt_set_error(DT_ERR_CORRUPT, "%s: meta key %s missing (its checksums hold: was it written by another "
                        "program?)", dt_ckpt_path(c), key);
  return rc;
}

dt_status dt__train_ckpt_pos(const dt_ckpt *c, dt__train_pos *pos) {
  uint64_t step, ost, sseed, sepoch, spos;
  DT_CHECK(meta_pos(c, "step", &step));
  DT_CHECK(meta_pos(c, "optim_steps", &ost));
  DT_CHECK(meta_pos(c, "sampler_seed", &sseed));
  DT_CHECK(meta_pos(c, "sampler_epoch", &sepoch));
  DT_CHECK(meta_pos(c, "sampler_pos", &spos));
  if (step != dt_ckpt_step(c) || step > INT64_MAX || ost > INT64_MAX)
    return dt_set_error(DT_ERR_CORRUPT, "%s: meta step %" PRIu64 " (optimizer steps %" PRIu64 ") against step %" PRIu64
                        " in its header", dt_ckpt_path(c), step, ost, dt_ckpt_step(c));
  *pos = (dt__train_pos){.step = (int64_t)step, .optim_steps = (int64_t)ost,
                         .sampler = {.seed = sseed, .epoch = sepoch, .pos = spos}};
  /* the epoch's loss so far: only for its record, so a file without it (or with a value that
   * does not read) resumes, averaging the steps after the resume as before */
  const char *el = dt_ckpt_meta_get(c, "epoch_loss_sum"), *es = dt_ckpt_meta_get(c, "epoch_loss_steps");
  if (el && es) {
    char *e1, *e2;
    double l = strtod(el, &e1);
    long long k = strtoll(es, &e2, 10);
    if (!*e1 && !*e2 && isfinite(l) && k >= 0 && (uint64_t)k <= step) {
      pos->epoch_loss = l;
      pos->epoch_steps = k;
    }
  }
  return DT_OK;
}

dt_status dt__train_ckpt_load(const dt_train_config *cfg, dt_model *m, const dt__train_state *st, const char *data,
                              dt__train_pos *pos, char *note, size_t cap) {
  dt_ckpt *c = NULL;
  DT_CHECK(dt_ckpt_open_latest(cfg->checkpoint_dir, &c));
  dt_status rc;
  char buf[32];
  DT_CHECK_GOTO(meta_expect(c, "model_spec", dt_model_spec(m), "--model"), rc, fail);
  snprintf(buf, sizeof buf, "%d", cfg->global_batch);
  DT_CHECK_GOTO(meta_expect(c, "global_batch", buf, "--batch"), rc, fail);
  snprintf(buf, sizeof buf, "%" PRIu64, cfg->seed);
  DT_CHECK_GOTO(meta_expect(c, "seed", buf, "--seed"), rc, fail);
  DT_CHECK_GOTO(meta_expect(c, "optimizer", optim_name(cfg->optim.kind), "--optimizer"), rc, fail);
  const char *had_data = dt_ckpt_meta_get(c, "train_data");
  if (had_data && data && data[0] && strcmp(had_data, data)) {
    rc = dt_set_error(DT_ERR_MISMATCH, "%s was written training on another training set (%s; --data %s now gives "
                      "%s): resuming would not continue that run; to start afresh, choose another "
                      "--checkpoint-dir", dt_ckpt_path(c), had_data,
                      cfg->data_dir ? cfg->data_dir : DT_FASHION_MNIST_DIR, data);
    goto fail;
  }
  /* momentum: stored by name; older files tell by their momentum buffer */
  char mom[32];
  snprintf(mom, sizeof mom, "%g", run_momentum(cfg));
  const char *had = dt_ckpt_meta_get(c, "momentum");
  int buffer = dt_ckpt_find(c, "momentum") != NULL;
  if (cfg->optim.kind == DT_OPTIM_SGD && (had ? strcmp(had, mom) != 0 : buffer != (run_momentum(cfg) > 0))) {
    rc = dt_set_error(DT_ERR_MISMATCH, "%s was written with --momentum %s, this run has %s", dt_ckpt_path(c),
                      had ? had : buffer ? "> 0" : "0", mom);
    goto fail;
  }
  char sv[SOFT_N][64], now[512] = "", then[512] = "";
  soft_values(cfg, sv);
  for (int i = 0; i < SOFT_N; i++) {
    const char *h = dt_ckpt_meta_get(c, soft_key[i]);
    if (!h || !strcmp(h, sv[i]))
      continue;
    size_t a = strlen(now), b = strlen(then);
    snprintf(now + a, sizeof now - a, "%s%s %s", a ? ", " : "", soft_flag[i], sv[i]);
    snprintf(then + b, sizeof then - b, "%s%s", b ? ", " : "", h);
  }
  if (now[0])
    DT_LOG_WARN("resuming with %s; the checkpoint was written with %s: the loss sequence will differ "
                "from the uninterrupted run's", now, then);
  size_t np = dt_model_param_count(m);
  const dt_ckpt_section *s = dt_ckpt_find(c, "params");
  if (!s || s->nbytes != np * 4) {
    rc = dt_set_error(DT_ERR_CORRUPT, "%s: section params %s (model has %zu floats)", dt_ckpt_path(c),
                      s ? "has the wrong size" : "missing", np);
    goto fail;
  }
  for (size_t i = 0; i < st->n; i++) {
    const char *name = st->name[i];
    const dt_ckpt_section *os = dt_ckpt_find(c, name);
    if (!os || os->nbytes != np * 4) {
      rc = dt_set_error(DT_ERR_CORRUPT, "%s: optimizer section %s %s", dt_ckpt_path(c), name,
                        os ? "has the wrong size" : "missing (was it written with another optimizer?)");
      goto fail;
    }
  }
  DT_CHECK_GOTO(dt__train_ckpt_pos(c, pos), rc, fail);
  memcpy(dt_model_params(m), s->data, np * 4);
  for (size_t i = 0; i < st->n; i++)
    memcpy(st->buf[i], dt_ckpt_find(c, st->name[i])->data, np * 4);
  const char *ws = dt_ckpt_meta_get(c, "world_size");
  const char *skipped = dt_ckpt_skipped(c);
  /* an older dtrain drew the masks per (micro-batch, rank): the state resumes, the masks follow
   * the rule of this build from here on */
  const char *rule = dt_ckpt_meta_get(c, "dropout_rng");
  bool old_rule = strstr(dt_model_spec(m), ",dropout:") && (!rule || strcmp(rule, DT__TRAIN_DROPOUT_RULE));
  if (old_rule)
    DT_LOG_WARN("%s was written by a dtrain that drew dropout masks %s; this one draws them "
                DT__TRAIN_DROPOUT_RULE ": the run resumes, but its losses from here on differ from "
                "what the interrupted run would have logged", dt_ckpt_path(c),
                rule ? rule : "by an unrecorded rule");
  snprintf(note, cap, "from %s (step %" PRIu64 ", epoch %" PRIu64 ", written by %s worker(s))%s%s%s", dt_ckpt_path(c),
           (uint64_t)pos->step, pos->sampler.epoch + 1, ws ? ws : "?", old_rule ? "; dropout masks drawn by another rule before it" : "",
           skipped && *skipped ? "; skipped: " : "", skipped ? skipped : "");
  dt_ckpt_destroy(c);
  return DT_OK;
fail:
  dt_ckpt_destroy(c);
  return rc;
}
