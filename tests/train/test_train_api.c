/* test_train_api.c - the trainer as a C program uses it (dtrain/train.h, dtrain/monitor.h):
 * dt_train_run with an observer on a tiny IDX set, the summary's fields, observer calls in step
 * order with finite metrics, model save/load round trip, and errors for bad configurations. */
#include "dtrain/monitor.h"
#include "dtrain/train.h"
#include "train_test.h"

typedef struct seen {
  int steps, epochs, notes;
  int64_t last_step;
  int bad;
} seen;

static void on_step(void *ctx, const dt_train_step_info *s) {
  seen *v = ctx;
  if (s->step <= v->last_step || !isfinite(s->loss) || s->samples_per_s <= 0 || s->world_size != 1 ||
      s->total_steps != 40 || s->steps_per_epoch != 20 || s->compute_ms < 0)
    v->bad++;
  v->last_step = s->step;
  v->steps++;
}
static void on_epoch(void *ctx, const dt_train_epoch_info *e) {
  seen *v = ctx;
  if (e->epoch != v->epochs + 1 || !(e->test_accuracy >= 0 && e->test_accuracy <= 1))
    v->bad++;
  v->epochs++;
}
static void on_note(void *ctx, const char *text) { ((seen *)ctx)->notes++; }

int main(void) {
  char dir[1024], data[2048], out[2048];
  tt_scratch(dir, sizeof dir, "api");
  snprintf(data, sizeof data, "%s/data", dir);
  snprintf(out, sizeof out, "%s/out", dir);
  mkdir(data, 0777);
  tt_make_dataset(data, 600, 200);

  dt_train_config cfg;
  dt_train_config_init(&cfg);
  cfg.model = TINY_MODEL;
  cfg.data_dir = data;
  cfg.epochs = 2;
  cfg.global_batch = 30;
  cfg.optim.momentum = 0.9f;
  cfg.lr = 0.1f;
  cfg.threads = 1;
  cfg.log_interval = 5;
  cfg.out_dir = out;
  seen v = {0};
  dt_train_observer obs = {.ctx = &v, .on_step = on_step, .on_epoch = on_epoch, .on_note = on_note};
  dt_train_summary s;
  CHECK(dt_train_run(&cfg, &obs, &s) == DT_OK, "run: %s", dt_last_error());
  CHECK(v.bad == 0, "%d bad observer calls", v.bad);
  CHECK(v.steps == 8 && v.epochs == 2, "observer saw %d steps, %d epochs (want 8, 2)", v.steps, v.epochs);
  CHECK(s.steps == 40 && s.steps_run == 40 && s.epochs == 2 && s.world_size == 1, "summary counts");
  CHECK(s.resumed_from_step == -1, "fresh run");
  CHECK(s.test_accuracy > 0.6 && s.test_loss > 0, "accuracy %g", s.test_accuracy);
  CHECK(s.samples_per_s > 0 && s.steady_samples_per_s > 0 && s.wall_s >= s.train_s && s.peak_rss_mb > 0,
        "timings");
  CHECK(s.param_count == 64 * 32 + 32 + 32 * 4 + 4, "param count %zu", s.param_count);

  /* the saved model rebuilds and evaluates to the same numbers */
  dt_model *m = NULL;
  CHECK(dt_train_model_load(s.model_file, 64, &m) == DT_OK, "load: %s", dt_last_error());
  double loss, acc;
  uint64_t n;
  CHECK(dt_train_evaluate(m, data, 64, &loss, &acc, &n) == DT_OK, "evaluate: %s", dt_last_error());
  CHECK(n == 200 && acc == s.test_accuracy && fabs(loss - s.test_loss) < 1e-6, "eval %g %g vs %g %g", acc,
        loss, s.test_accuracy, s.test_loss);
  /* save again and compare bytes of the parameters */
  char again[4096];
  snprintf(again, sizeof again, "%s/again.safetensors", dir);
  CHECK(dt_train_model_save(m, again) == DT_OK, "save: %s", dt_last_error());
  CHECK(tt_model_rel_diff(again, s.model_file) == 0, "round trip changed parameters");
  dt_model_destroy(m);

  /* a file that is not a dtrain model */
  dt_tensor_view t = {.name = "x", .dtype = DT_ST_F32, .ndim = 1, .shape = {1}, .data = &loss, .nbytes = 4};
  char other[4096];
  snprintf(other, sizeof other, "%s/other.safetensors", dir);
  CHECK(dt_safetensors_write(other, &t, 1, NULL, 0) == DT_OK, "write other");
  CHECK(dt_train_model_load(other, 8, &m) == DT_ERR_CORRUPT && m == NULL, "foreign file accepted");
  CHECK(strstr(dt_last_error(), "dtrain.model_spec"), "message: %s", dt_last_error());
  /* a spec that disagrees with the tensors: the message names both shapes */
  {
    dt_safetensors *f = NULL;
    CHECK(dt_safetensors_open(s.model_file, &f) == DT_OK, "open: %s", dt_last_error());
    dt_tensor_view views[8];
    size_t nv = dt_safetensors_count(f);
    CHECK(nv <= 8, "%zu tensors", nv);
    for (size_t i = 0; i < nv; i++)
      views[i] = *dt_safetensors_tensor(f, i);
    dt_kv spec = {"dtrain.model_spec", "in=1x8x8,linear:16,relu,linear:4"};
    char narrow[4096];
    snprintf(narrow, sizeof narrow, "%s/narrow.safetensors", dir);
    CHECK(dt_safetensors_write(narrow, views, nv, &spec, 1) == DT_OK, "write: %s", dt_last_error());
    dt_safetensors_destroy(f);
    CHECK(dt_train_model_load(narrow, 8, &m) == DT_ERR_CORRUPT && m == NULL, "spec mismatch accepted");
    const char *e = dt_last_error();
    CHECK((strstr(e, "F32 32x64") && strstr(e, "F32 16x64")) || (strstr(e, "F32 4x32") && strstr(e, "F32 4x16")),
          "message does not name both shapes: %s", e);
    /* the model's tensors and one more (another model's file): refused, naming it */
    CHECK(dt_safetensors_open(s.model_file, &f) == DT_OK, "open: %s", dt_last_error());
    const dt_kv *own = NULL;
    for (size_t i = 0; i < dt_safetensors_meta_count(f); i++)
      if (!strcmp(dt_safetensors_meta(f, i)->key, "dtrain.model_spec"))
        own = dt_safetensors_meta(f, i);
    CHECK(own && nv < 8, "model file without its spec");
    for (size_t i = 0; i < nv; i++) /* the views of the file open now */
      views[i] = *dt_safetensors_tensor(f, i);
    dt_kv same = *own;
    views[nv] = t;
    views[nv].name = "head.extra";
    char more[4096];
    snprintf(more, sizeof more, "%s/more.safetensors", dir);
    CHECK(dt_safetensors_write(more, views, nv + 1, &same, 1) == DT_OK, "write: %s", dt_last_error());
    dt_safetensors_destroy(f);
    CHECK(dt_train_model_load(more, 8, &m) == DT_ERR_CORRUPT && m == NULL, "extra tensor accepted");
    CHECK(strstr(dt_last_error(), "head.extra"), "message does not name the extra tensor: %s", dt_last_error());
  }

  /* bad configurations fail cleanly */
  dt_train_config bad = cfg;
  bad.global_batch = 0;
  CHECK(dt_train_run(&bad, NULL, NULL) == DT_ERR_INVALID, "batch 0");
  bad = cfg;
  bad.model = "in=1x8x8,linear:0";
  CHECK(dt_train_run(&bad, NULL, NULL) == DT_ERR_INVALID, "bad spec: %s", dt_last_error());
  bad = cfg;
  bad.data_dir = out; /* no IDX files there */
  CHECK(dt_train_run(&bad, NULL, NULL) == DT_ERR_NOT_FOUND, "missing data: %s", dt_last_error());
  bad = cfg;
  bad.global_batch = 601;
  CHECK(dt_train_run(&bad, NULL, NULL) == DT_ERR_INVALID, "batch > dataset");
  bad = cfg;
  bad.resume = true;
  CHECK(dt_train_run(&bad, NULL, NULL) == DT_ERR_INVALID, "resume without dir");
  bad = cfg;
  bad.out_dir = ""; /* not "/": the model would go to /model.safetensors */
  CHECK(dt_train_run(&bad, NULL, NULL) == DT_ERR_INVALID, "empty out_dir");
  bad = cfg;
  bad.checkpoint_dir = "";
  CHECK(dt_train_run(&bad, NULL, NULL) == DT_ERR_INVALID, "empty checkpoint_dir");

  /* the monitor as an observer: a metrics file of JSON lines */
  char mpath[4096];
  snprintf(mpath, sizeof mpath, "%s/mon/metrics.jsonl", dir);
  dt_monitor_opts mo = {.metrics_path = mpath, .progress = DT_PROGRESS_OFF};
  dt_monitor *mon = NULL;
  CHECK(dt_monitor_create(&mo, &mon) == DT_OK, "monitor: %s", dt_last_error());
  dt_train_observer mobs = dt_monitor_observer(mon);
  cfg.out_dir = NULL;
  cfg.max_steps = 7;
  CHECK(dt_train_run(&cfg, &mobs, &s) == DT_OK, "run 2: %s", dt_last_error());
  /* numbers that are not finite are null: the lines stay JSON (tt_metrics_losses checks each) */
  dt_train_step_info nan_step = {.step = 8, .epoch = 1, .loss = NAN, .lr = INFINITY};
  dt_train_epoch_info nan_epoch = {.epoch = 1, .step = 8, .test_loss = NAN, .train_loss = -INFINITY};
  mobs.on_step(mobs.ctx, &nan_step);
  mobs.on_epoch(mobs.ctx, &nan_epoch);
  dt_monitor_destroy(mon);
  char *mtext = tt_slurp(mpath);
  CHECK(strstr(mtext, "\"loss\":null,\"lr\":null") && strstr(mtext, "\"test_loss\":null"),
        "non-finite numbers are not null: %s", mtext);
  free(mtext);
  CHECK(s.model_file[0] == '\0' && s.steps == 7, "no out dir: no model file");
  double l[16];
  CHECK(tt_metrics_losses(mpath, l, 16) == 8, "metrics up to step 8");
  CHECK(isfinite(l[5]) && isfinite(l[7]) && isnan(l[6]), "logged steps 5 and 7 only");
  tt_rmrf(dir);
  printf("ok\n");
  return 0;
}
