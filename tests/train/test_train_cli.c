/* test_train_cli.c - `dtrain train` and `dtrain eval` as a user runs them, on a tiny IDX dataset
 * the test writes itself. One group per ctest process (argv[1]):
 *   usage   bad flags, impossible specs and missing data exit 2 with one error line and a hint;
 *           --help documents the flags and the spec syntax
 *   json    --json prints exactly one JSON object with the summary keys; the model file and the
 *           metrics file are written and valid; `dtrain eval` on the model gives the same
 *           accuracy and loss, and on a copy with a NaN weight test_loss null (not a bare nan)
 *   shapes  train refuses test images of another shape than the training images (8x7 would
 *           overrun the model's input, 8x9 give a meaningless accuracy) and images whose shape
 *           differs from the model's input in order only (N x H x W x C), with exit 2 naming
 *           both files and both shapes; eval refuses the same with the same check; a flat
 *           model (in=F) takes any image of F values
 *   accum   --accumulate 4 ends with the same parameters as one big batch (1e-5)
 *   resume  a run stopped at step 10 and resumed reproduces the uninterrupted run's losses and
 *           final parameters bit for bit (resume: SGD with Nesterov momentum and dropout;
 *           resume_adamw: AdamW with a cosine schedule and clipping)
 *   ckdir   --checkpoint-dir is made (with parents) and checked at start-up: a regular file is
 *           refused before any step, so is a directory holding an earlier run's checkpoints
 *           (without --resume) and one locked by another job; resuming with another --momentum
 *           is refused as a settings mismatch, with another --lr warned about */
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "dtrain/ckpt.h"
#include "train_test.h"

static char dir[1024], data[2048];

/* Two lines on stderr: the error and the hint. */
static void expect_usage(const char *what, tt_result r, const char *needle) {
  CHECK(r.code == 2, "%s: exit %d, want 2; stderr: %s", what, r.code, r.err);
  CHECK(strstr(r.err, "---> HINT:"), "%s: no hint in: %s", what, r.err);
  CHECK(strstr(r.err, needle), "%s: '%s' not in: %s", what, needle, r.err);
  int lines = 0;
  for (const char *p = r.err; *p; p++)
    lines += *p == '\n';
  CHECK(lines == 2, "%s: %d lines on stderr, want error + hint: %s", what, lines, r.err);
  CHECK(r.out[0] == '\0', "%s: stdout not empty: %s", what, r.out);
  tt_result_free(&r);
}

static void group_usage(void) {
  const char *b = tt_bin();
  tt_result r = tt_run(dir, 30, "%s train --help", b);
  CHECK(r.code == 0, "--help exit %d", r.code);
  const char *flags[] = {"--model", "--data", "--epochs", "--max-steps", "--batch", "--accumulate",
                         "--optimizer", "--lr", "--momentum", "--nesterov", "--weight-decay",
                         "--schedule", "--clip", "--threads", "--bucket-size", "--eval-batch",
                         "--out", "--json", "--checkpoint-dir", "--checkpoint-every", "--keep",
                         "--resume", "--seed", "presets:", "conv"};
  for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
    CHECK(strstr(r.out, flags[i]), "--help does not mention %s", flags[i]);
  tt_result_free(&r);

  expect_usage("unknown flag", tt_run(dir, 30, "%s train --data %s --bogus 3", b, data), "--bogus");
  expect_usage("bad number", tt_run(dir, 30, "%s train --data %s --lr fast", b, data), "--lr");
  expect_usage("missing value", tt_run(dir, 30, "%s train --data %s --epochs", b, data), "--epochs");
  expect_usage("zero batch", tt_run(dir, 30, "%s train --data %s --batch 0", b, data), "--batch");
  expect_usage("bad optimizer", tt_run(dir, 30, "%s train --data %s --optimizer rmsprop", b, data),
               "rmsprop");
  expect_usage("bad spec token", tt_run(dir, 30, "%s train --data %s --model 'in=1x8x8,linearr:4'", b, data),
               "linearr");
  expect_usage("impossible spec",
               tt_run(dir, 30, "%s train --data %s --model 'in=1x8x8,conv9x9:4,linear:4'", b, data),
               "--model");
  expect_usage("spec vs data",
               tt_run(dir, 60, "%s train --data %s --model mlp --max-steps 1", b, data), "1x28x28");
  expect_usage("missing data", tt_run(dir, 30, "%s train --data %s/nowhere", b, dir),
               "apt-get install dataset-fashion-mnist");
  {
    /* a truncated images file: the error names it */
    char bad[4096], cmd[16384];
    snprintf(bad, sizeof bad, "%s/bad", dir);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/* %s/ && truncate -s 1000 %s/train-images-idx3-ubyte",
             bad, data, bad, bad);
    CHECK(system(cmd) == 0, "prepare truncated data");
    expect_usage("truncated data", tt_run(dir, 30, "%s train --data %s --model '%s'", b, bad, TINY_MODEL),
                 "train-images-idx3-ubyte");
  }
  /* an empty path (an unset shell variable) is refused, not taken as "" + "/model.safetensors";
   * --data nowhere: without the check the run fails later without writing into / */
  const char *paths[] = {"--out", "--data", "--checkpoint-dir"};
  for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
    tt_result r = tt_run(dir, 30, "%s train --data %s/nowhere %s ''", b, dir, paths[i]);
    char what[64];
    snprintf(what, sizeof what, "train %s ''", paths[i]);
    expect_usage(what, r, "bad value '' for");
  }
  expect_usage("eval --model-file ''", tt_run(dir, 30, "%s eval --model-file ''", b),
               "bad value '' for --model-file");
  expect_usage("eval --data ''",
               tt_run(dir, 30, "%s eval --model-file %s/none.safetensors --data ''", b, dir),
               "bad value '' for --data");
  {
    /* a diverged run is a runtime failure (1), not bad usage (2); stdout stays empty */
    tt_result r = tt_run(dir, 60, "%s train --data %s --model 'in=1x8x8,linear:32,linear:4' "
                         "--lr 1000000 --epochs 20 --batch 16 --out %s/div --json --progress off",
                         b, data, dir);
    CHECK(r.code == 1 && strstr(r.err, "diverged") && r.out[0] == '\0',
          "diverged run: exit %d, stdout [%s], stderr: %s", r.code, r.out, r.err);
    tt_result_free(&r);
  }
  expect_usage("resume without dir", tt_run(dir, 30, "%s train --data %s --resume", b, data),
               "--checkpoint-dir");
  expect_usage("checkpoint-every without dir", tt_run(dir, 30, "%s train --data %s --checkpoint-every 2", b, data),
               "--checkpoint-every needs --checkpoint-dir");
  expect_usage("keep without dir", tt_run(dir, 30, "%s train --data %s --keep 1", b, data),
               "--keep needs --checkpoint-dir");
  expect_usage("eval without file", tt_run(dir, 30, "%s eval", b), "--model-file");
  /* settings from the environment are named as such, not blamed on a flag, nor ignored */
  expect_usage("DTRAIN_GEMM", tt_run(dir, 30, "env DTRAIN_GEMM=garbage %s train --data %s --max-steps 1", b, data),
               "DTRAIN_GEMM=\"garbage\": expected auto, own or blas");
  /* a rank or world size that cannot be (it used to train alone, and rank 1 wrote no metrics) */
  expect_usage("RANK=1 WORLD_SIZE=1", tt_run(dir, 30, "env RANK=1 WORLD_SIZE=1 %s train --data %s --max-steps 1", b, data),
               "rank 1 is not below world size 1");
  expect_usage("WORLD_SIZE=0", tt_run(dir, 30, "env RANK=0 WORLD_SIZE=0 %s train --data %s --max-steps 1", b, data),
               "WORLD_SIZE=0 is out of range");
  /* numbers as written: no sign or space before a seed (" -1" was read as 2^64 - 1), no hex */
  expect_usage("--seed ' -1'", tt_run(dir, 30, "%s train --data %s --max-steps 1 --seed ' -1' --out %s/sd", b, data, dir),
               "bad value ' -1' for --seed");
  expect_usage("--lr 0x10", tt_run(dir, 30, "%s train --data %s --max-steps 1 --lr 0x10 --out %s/sd", b, data, dir),
               "bad value '0x10' for --lr");
  /* a refused number says what was expected */
  expect_usage("--batch 0", tt_run(dir, 30, "%s train --data %s --batch 0 --out %s/sd", b, data, dir),
               "bad value '0' for --batch: a whole number from 1 to 16777216");
  expect_usage("--momentum 2", tt_run(dir, 30, "%s train --data %s --momentum 2 --out %s/sd", b, data, dir),
               "bad value '2' for --momentum: a decimal number from 0 to 1");
  expect_usage("eval --batch 0", tt_run(dir, 30, "%s eval --model-file x --batch 0", b),
               "bad value '0' for --batch: a whole number from 1 to 16777216");
  {
    tt_result r = tt_run(dir, 60, "%s train --data %s --model '%s' --max-steps 1 --lr 1e-50 --progress off --out %s/lr0",
                         b, data, TINY_MODEL, dir);
    CHECK(r.code == 0 && strstr(r.err, "the learning rate is 0 (as a 32-bit float)"), "--lr 1e-50: exit %d: %s",
          r.code, r.err);
    tt_result_free(&r);
  }
  /* a decay that flips the weights' sign every step (it used to end "trained", loss 1e28) */
  expect_usage("--weight-decay 100", tt_run(dir, 30, "%s train --data %s --max-steps 1 --lr 0.05 --weight-decay 100 "
                                                      "--optimizer adamw --out %s/wd", b, data, dir),
               "their product must be below 1");
  { /* an --out too long for the summary's model path: refused (the model went to a cut name) */
    char longdir[1200];
    int k = snprintf(longdir, sizeof longdir, "%s/", dir);
    for (; k < 1100; k++)
      longdir[k] = k % 200 ? 'a' : '/';
    longdir[k] = '\0';
    expect_usage("long --out", tt_run(dir, 30, "%s train --data %s --max-steps 1 --out %s", b, data, longdir),
                 "is too long");
  }
  {
    tt_result r = tt_run(dir, 30, "env DTRAIN_RUN_EVENTS=%s/nowhere/events %s run -n 1 -- true", dir, b);
    CHECK(r.code == 0 && strstr(r.err, "DTRAIN_RUN_EVENTS=") && strstr(r.err, "no events will be written"),
          "unusable DTRAIN_RUN_EVENTS: exit %d: %s", r.code, r.err);
    tt_result_free(&r);
    /* a FIFO nobody reads: said, not waited on (tt_run's timeout would end a wait) */
    r = tt_run(dir, 30, "mkfifo %s/evfifo && env DTRAIN_RUN_EVENTS=%s/evfifo %s run -n 1 -- true", dir, dir, b);
    CHECK(r.code == 0 && strstr(r.err, "a FIFO that nobody reads: no events will be written"),
          "DTRAIN_RUN_EVENTS on a FIFO: exit %d: %s", r.code, r.err);
    tt_result_free(&r);
    r = tt_run(dir, 60, "env DTRAIN_LOG=loud %s run -n 2 -- %s train --data %s --model 'in=1x8x8,linear:4' --batch 30 "
               "--max-steps 1 --progress off --out %s/log", b, b, data, dir);
    CHECK(r.code == 0 && strstr(r.err, "DTRAIN_LOG=loud is not a level"), "DTRAIN_LOG=loud: exit %d: %s", r.code,
          r.err);
    tt_result_free(&r);
  }
  expect_usage("eval missing file", tt_run(dir, 30, "%s eval --model-file %s/none.safetensors", b, dir),
               "none.safetensors");
}

static void group_json(void) {
  const char *b = tt_bin();
  {
    /* the progress bar shows the run's progress: full at its last step, also when --max-steps
     * ends the run early in an epoch (it used to show the epoch's 2 of 15 steps) */
    tt_result p = tt_run(dir, 120, "%s train --data %s --model '%s' --batch 40 --max-steps 2 --threads 1 "
                         "--out %s/bar --progress bar", b, data, TINY_MODEL, dir);
    CHECK(p.code == 0 && strstr(p.err, "[########################] step 2/2"), "progress bar: exit %d: %s", p.code,
          p.err);
    tt_result_free(&p);
  }
  tt_result r = tt_run(dir, 120,
                       "%s train --data %s --model '%s' --epochs 2 --batch 32 --optimizer sgd "
                       "--lr 0.05 --momentum 0.9 --threads 1 --out %s/run --json",
                       b, data, TINY_MODEL, dir);
  CHECK(r.code == 0, "train exit %d: %s", r.code, r.err);
  CHECK(tt_json_is_object(r.out), "stdout is not one JSON object: [%s]", r.out);
  const char *keys[] = {"test_accuracy", "test_loss", "epochs", "samples_per_s",
                        "steady_samples_per_s", "wall_s", "peak_rss_mb", "world_size"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    CHECK(isfinite(tt_json_num(r.out, keys[i])), "key %s missing or not a number: %s", keys[i], r.out);
  double acc = tt_json_num(r.out, "test_accuracy"), loss = tt_json_num(r.out, "test_loss");
  CHECK(acc >= 0.85 && acc <= 1.0, "tiny set should be learnt: accuracy %g", acc);
  CHECK(loss > 0 && loss < 0.6, "test loss %g", loss);
  CHECK(tt_json_num(r.out, "epochs") == 2, "epochs");
  CHECK(tt_json_num(r.out, "world_size") == 1, "world size");
  CHECK(tt_json_num(r.out, "steps") == 2 * 19, "steps: 600 samples / 32 = 19 per epoch: %s", r.out);
  CHECK(tt_json_num(r.out, "peak_rss_mb") > 1, "rss");
  CHECK(strstr(r.out, "\"metrics_complete\":true"), "metrics_complete: %s", r.out);
  char model[1024];
  CHECK(tt_json_str(r.out, "model_file", model, sizeof model), "model_file missing");
  char want[4096];
  snprintf(want, sizeof want, "%s/run/model.safetensors", dir);
  CHECK(!strcmp(model, want), "model_file %s, want %s", model, want);
  tt_result_free(&r);

  /* a metrics file that cannot be written (a full disk) is reported when it happens */
  char full[4096];
  snprintf(full, sizeof full, "mkdir -p %s/full && ln -sf /dev/full %s/full/metrics.jsonl", dir, dir);
  CHECK(system(full) == 0, "%s", full);
  r = tt_run(dir, 120, "%s train --data %s --model '%s' --max-steps 2 --batch 32 --threads 1 --out %s/full --json",
             b, data, TINY_MODEL, dir);
  CHECK(r.code == 0 && strstr(r.err, "metrics.jsonl: write failed: No space left on device") &&
            strstr(r.out, "\"metrics_complete\":false"),
        "exit %d: %s %s", r.code, r.err, r.out);
  tt_result_free(&r);

  /* the model file: named tensors with the model's shapes and the spec in the metadata */
  dt_safetensors *f = NULL;
  CHECK(dt_safetensors_open(want, &f) == DT_OK, "open model: %s", dt_last_error());
  CHECK(dt_safetensors_count(f) == 4, "4 tensors");
  const dt_tensor_view *w = dt_safetensors_find(f, "fc1.weight");
  CHECK(w && w->ndim == 2 && w->shape[0] == 32 && w->shape[1] == 64, "fc1.weight (32, 64)");
  const char *spec = dt_safetensors_meta_get(f, "dtrain.model_spec");
  CHECK(spec && strstr(spec, "linear:32"), "spec metadata");
  dt_safetensors_destroy(f);

  /* the metrics file: JSON lines, steps every 10 plus epoch ends, and two epoch records */
  char mpath[4096];
  snprintf(mpath, sizeof mpath, "%s/run/metrics.jsonl", dir);
  char *m = tt_slurp(mpath);
  int steps = 0, epochs = 0;
  for (char *line = strtok(m, "\n"); line; line = strtok(NULL, "\n")) {
    CHECK(tt_json_is_object(line), "metrics line not JSON: %s", line);
    if (strstr(line, "\"type\":\"step\"")) {
      steps++;
      CHECK(isfinite(tt_json_num(line, "loss")) && isfinite(tt_json_num(line, "samples_per_s")) &&
                isfinite(tt_json_num(line, "compute_ms")) && isfinite(tt_json_num(line, "comm_ms")) &&
                isfinite(tt_json_num(line, "data_ms")) && isfinite(tt_json_num(line, "lr")),
            "step line keys: %s", line);
    } else if (strstr(line, "\"type\":\"epoch\"")) {
      epochs++;
      CHECK(isfinite(tt_json_num(line, "test_accuracy")), "epoch line: %s", line);
    }
  }
  free(m);
  CHECK(epochs == 2, "%d epoch lines", epochs);
  CHECK(steps == 5, "%d step lines, want steps 10, 19 (epoch end), 20, 30, 38", steps);

  /* dtrain eval gives what training reported */
  r = tt_run(dir, 60, "%s eval --model-file %s --data %s --json", b, want, data);
  CHECK(r.code == 0, "eval exit %d: %s", r.code, r.err);
  CHECK(tt_json_is_object(r.out), "eval stdout not JSON: %s", r.out);
  CHECK(tt_json_num(r.out, "test_accuracy") == acc, "eval accuracy %g != train's %g",
        tt_json_num(r.out, "test_accuracy"), acc);
  CHECK(fabs(tt_json_num(r.out, "test_loss") - loss) < 1e-6 * (1 + loss), "eval loss %g vs %g",
        tt_json_num(r.out, "test_loss"), loss);
  CHECK(tt_json_num(r.out, "samples") == 200, "samples");
  tt_result_free(&r);

  /* a disk that is full: exit 1 and a message, not exit 0 and an empty result file */
  if (access("/dev/full", W_OK) == 0) {
    r = tt_run(dir, 60, "sh -c 'exec %s eval --model-file %s --data %s --json > /dev/full'", b,
               want, data);
    CHECK(r.code == 1 && strstr(r.err, "dtrain: writing standard output: No space left on device"),
          "eval --json > /dev/full: exit %d: %s", r.code, r.err);
    tt_result_free(&r);
  }

  /* a small file whose spec names a huge model (4 GiB of parameters): refused before anything
   * that size is allocated (it took 8 GB and 21 s to find the shapes wrong) */
  {
    dt_safetensors *g = NULL;
    CHECK(dt_safetensors_open(want, &g) == DT_OK, "open %s: %s", want, dt_last_error());
    size_t nt = dt_safetensors_count(g);
    dt_tensor_view tv[16];
    for (size_t i = 0; i < nt && i < 16; i++)
      tv[i] = *dt_safetensors_tensor(g, i);
    dt_kv kv = {"dtrain.model_spec", "in=1048576,linear:1024,linear:10"};
    char hf[4096];
    snprintf(hf, sizeof hf, "%s/huge.safetensors", dir);
    CHECK(nt <= 16 && dt_safetensors_write(hf, tv, nt, &kv, 1) == DT_OK, "write %s: %s", hf, dt_last_error());
    dt_safetensors_destroy(g);
    r = tt_run(dir, 60, "%s eval --model-file %s --data %s", b, hf, data);
    CHECK(r.code == 2 && strstr(r.err, "has 1073753098 parameters, the file's tensors hold"), "huge spec: exit %d: %s",
          r.code, r.err);
    tt_result_free(&r);
  }
  /* a model with a NaN weight: its loss is NaN, written as null so that stdout stays JSON */
  {
    char nanf[4096], cmd[16384];
    snprintf(nanf, sizeof nanf, "%s/nan.safetensors", dir);
    snprintf(cmd, sizeof cmd, "cp %s %s", want, nanf);
    CHECK(system(cmd) == 0, "copy model");
    FILE *f = fopen(nanf, "r+b");
    unsigned char hl[8];
    CHECK(f && fread(hl, 1, 8, f) == 8, "read %s", nanf);
    long data_at = 8;
    for (int i = 0; i < 8; i++)
      data_at += (long)hl[i] << (8 * i);
    const unsigned char qnan[4] = {0x00, 0x00, 0xc0, 0x7f}; /* f32 NaN, little-endian */
    CHECK(fseek(f, data_at, SEEK_SET) == 0 && fwrite(qnan, 1, 4, f) == 4 && fclose(f) == 0,
          "poke NaN into %s", nanf);
    r = tt_run(dir, 60, "%s eval --model-file %s --data %s --json", b, nanf, data);
    CHECK(r.code == 0, "eval NaN model exit %d: %s", r.code, r.err);
    CHECK(tt_json_is_object(r.out) && strstr(r.out, "\"test_loss\":null"),
          "eval of a NaN model: stdout not JSON with test_loss null: %s", r.out);
    CHECK(strstr(r.err, "warning: the model's outputs are not finite"), "eval of a NaN model: no warning: %s", r.err);
    tt_result_free(&r);
  }

  /* the text summary (no --json) ends with where things went */
  r = tt_run(dir, 120, "%s train --data %s --model '%s' --max-steps 3 --batch 32 --threads 1 --out %s/run2",
             b, data, TINY_MODEL, dir);
  CHECK(r.code == 0, "exit %d: %s", r.code, r.err);
  CHECK(strstr(r.out, "test accuracy") && strstr(r.out, "run2/model.safetensors") &&
            strstr(r.out, "run2/metrics.jsonl"),
        "summary: %s", r.out);
  tt_result_free(&r);

  /* a run refused at start (here: 3 outputs for 4-class data) leaves the earlier run's
   * metrics as they were; a FIFO nobody reads is refused instead of blocking the run */
  char mp[4096];
  snprintf(mp, sizeof mp, "%s/run2/metrics.jsonl", dir);
  struct stat before, after;
  CHECK(stat(mp, &before) == 0 && before.st_size > 0, "%s", mp);
  r = tt_run(dir, 120, "%s train --data %s --model 'in=1x8x8,linear:3' --max-steps 3 --batch 32 --threads 1 --out %s/run2",
             b, data, dir);
  after.st_size = -1;
  CHECK(r.code == 2 && stat(mp, &after) == 0 && after.st_size == before.st_size,
        "refused run: exit %d, metrics %lld bytes, were %lld: %s", r.code, (long long)after.st_size,
        (long long)before.st_size, r.err);
  tt_result_free(&r);
  char fifo[4096];
  snprintf(fifo, sizeof fifo, "mkdir -p %s/fifo && mkfifo %s/fifo/metrics.jsonl", dir, dir);
  CHECK(system(fifo) == 0, "%s", fifo);
  r = tt_run(dir, 60, "%s train --data %s --model '%s' --max-steps 1 --batch 32 --threads 1 --out %s/fifo", b, data,
             TINY_MODEL, dir);
  CHECK(r.code == 2 && strstr(r.err, "is a FIFO that nobody reads"), "FIFO metrics: exit %d: %s", r.code, r.err);
  tt_result_free(&r);
  /* a socket there is named as one (open(2) says ENXIO for both) */
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int sfd = socket(AF_UNIX, SOCK_STREAM, 0);
  int sl = snprintf(sa.sun_path, sizeof sa.sun_path, "%s/sock/metrics.jsonl", dir);
  snprintf(fifo, sizeof fifo, "mkdir -p %s/sock", dir);
  CHECK(sfd >= 0 && sl < (int)sizeof sa.sun_path && system(fifo) == 0 &&
            bind(sfd, (struct sockaddr *)&sa, sizeof sa) == 0,
        "socket at %s", sa.sun_path);
  r = tt_run(dir, 60, "%s train --data %s --model '%s' --max-steps 1 --batch 32 --threads 1 --out %s/sock", b, data,
             TINY_MODEL, dir);
  CHECK(r.code == 2 && strstr(r.err, "is a socket, not a file"), "socket metrics: exit %d: %s", r.code, r.err);
  tt_result_free(&r);
  close(sfd);
}

/* dir/<prefix>-{images,labels} of n samples: images of the given dims after N (ndim 2 or 3). */
static void write_split(const char *d, const char *prefix, uint32_t n, int ndim, const uint32_t *dims) {
  uint32_t all[4] = {n};
  size_t per = 1;
  for (int i = 0; i < ndim; i++)
    per *= all[i + 1] = dims[i];
  unsigned char *img = malloc(n * per), *lab = malloc(n);
  for (size_t i = 0; i < n * per; i++)
    img[i] = (unsigned char)(i * 37);
  for (uint32_t i = 0; i < n; i++)
    lab[i] = (unsigned char)(i % 4);
  char p[4096];
  snprintf(p, sizeof p, "%s/%s-images-idx3-ubyte", d, prefix);
  tt_write_idx(p, img, ndim + 1, all);
  snprintf(p, sizeof p, "%s/%s-labels-idx1-ubyte", d, prefix);
  tt_write_idx(p, lab, 1, all);
  free(img);
  free(lab);
}

static void group_shapes(void) {
  const char *b = tt_bin();
  char d[2048];
  const uint32_t hw[2] = {8, 8}, narrow[2] = {8, 7}, wide[2] = {8, 9}, hwc[3] = {8, 8, 1};
  const uint32_t *tests[2] = {narrow, wide};
  for (int k = 0; k < 2; k++) {
    snprintf(d, sizeof d, "%s/test8x%u", dir, tests[k][1]);
    mkdir(d, 0777);
    write_split(d, "train", 64, 2, hw);
    write_split(d, "t10k", 32, 2, tests[k]);
    tt_result r = tt_run(dir, 60, "%s train --data %s --model '%s' --max-steps 2 --batch 16 "
                         "--out %s/run --progress off", b, d, TINY_MODEL, dir);
    char shape[16];
    snprintf(shape, sizeof shape, "1x8x%u", tests[k][1]);
    CHECK(strstr(r.err, "t10k-images-idx3-ubyte") && strstr(r.err, "train-images-idx3-ubyte") &&
              strstr(r.err, shape) && strstr(r.err, "1x8x8"),
          "test 8x%u: message names neither both files nor both shapes: %s", tests[k][1], r.err);
    expect_usage("test images of another shape", r, "same shape");
  }
  /* N x H x W x C: the values of 1x8x8 images in another order */
  snprintf(d, sizeof d, "%s/hwc", dir);
  mkdir(d, 0777);
  write_split(d, "train", 64, 3, hwc);
  write_split(d, "t10k", 32, 3, hwc);
  tt_result r = tt_run(dir, 60, "%s train --data %s --model '%s' --max-steps 2 --batch 16 "
                       "--out %s/run --progress off", b, d, TINY_MODEL, dir);
  CHECK(strstr(r.err, "train-images-idx3-ubyte") && strstr(r.err, "8x8x1") &&
            strstr(r.err, "1x8x8"), "N x H x W x C: message: %s", r.err);
  expect_usage("N x H x W x C images", r, "order");
  /* a flat input takes them; its model file is refused by eval on 8x9 images by the same check */
  r = tt_run(dir, 60, "%s train --data %s --model 'in=64,linear:4' --max-steps 2 --batch 16 "
             "--out %s/flat --progress off", b, d, dir);
  CHECK(r.code == 0, "flat model on N x H x W x C: exit %d: %s", r.code, r.err);
  tt_result_free(&r);
  snprintf(d, sizeof d, "%s/test8x9", dir);
  r = tt_run(dir, 60, "%s eval --data %s --model-file %s/flat/model.safetensors", b, d, dir);
  CHECK(strstr(r.err, "t10k-images-idx3-ubyte") && strstr(r.err, "64 values") &&
            strstr(r.err, "1x8x9"), "eval 8x9: message: %s", r.err);
  expect_usage("eval on images of another size", r, "HINT");
  /* a model without parameters has nothing to train */
  r = tt_run(dir, 60, "%s train --data %s --model 'in=64' --max-steps 2 --batch 16 --out %s/noparam --progress off",
             b, data, dir);
  expect_usage("model without parameters", r, "no parameters to train");
  /* eval on a damaged test file: the damaged-file hint, not "evaluate on the kind of data" */
  {
    char dd[1100], p[1200];
    snprintf(dd, sizeof dd, "%s/damaged", dir);
    mkdir(dd, 0777);
    tt_make_dataset(dd, 64, 32);
    snprintf(p, sizeof p, "%s/t10k-images-idx3-ubyte", dd);
    CHECK(truncate(p, 100) == 0, "truncate %s", p);
    r = tt_run(dir, 60, "%s eval --data %s --model-file %s/flat/model.safetensors", b, dd, dir);
    expect_usage("eval on a damaged file", r, "is damaged");
  }
  /* an IDX element type dtrain does not read (0x0d, f32) is a usage error naming it, exit 2, not
   * a failure that a supervisor would restart; for eval too */
  snprintf(d, sizeof d, "%s/f32", dir);
  mkdir(d, 0777);
  tt_make_dataset(d, 64, 32);
  for (int k = 0; k < 2; k++) {
    char p[2100];
    snprintf(p, sizeof p, "%s/%s-images-idx3-ubyte", d, k ? "t10k" : "train");
    uint32_t nimg = k ? 32 : 64;
    unsigned char hdr[16] = {0, 0, 0x0d, 3, (unsigned char)(nimg >> 24), (unsigned char)(nimg >> 16),
                             (unsigned char)(nimg >> 8), (unsigned char)nimg, 0, 0, 0, 8, 0, 0, 0, 8};
    float *px = calloc((size_t)nimg * 64, sizeof *px);
    FILE *f = fopen(p, "wb");
    CHECK(px && f && fwrite(hdr, 1, 16, f) == 16 && fwrite(px, sizeof *px, (size_t)nimg * 64, f) == nimg * 64u &&
              fclose(f) == 0, "write %s", p);
    free(px);
    r = k ? tt_run(dir, 60, "%s eval --data %s --model-file %s/flat/model.safetensors", b, d, dir)
          : tt_run(dir, 60, "%s train --data %s --model 'in=64,linear:4' --max-steps 2 --batch 16 --out %s/f32run "
                   "--progress off", b, d, dir);
    CHECK(r.code == 2 && strstr(r.err, "element type 0x0d") && strstr(r.err, "HINT"), "%s on f32 images: exit %d: %s",
          k ? "eval" : "train", r.code, r.err);
    tt_result_free(&r);
  }
  /* an evaluation batch beyond the test set is one batch of the whole set: under a 2 GB address
   * space limit the 2^24 samples it names (4 GiB as floats) would not fit (not under the
   * sanitizers, whose shadow memory alone passes such a limit) */
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  r = tt_run(dir, 60, "prlimit --as=2000000000 %s train --data %s --model '%s' --max-steps 2 --batch 16 "
             "--eval-batch 16777216 --threads 1 --out %s/bigeval --progress off", b, data, TINY_MODEL, dir);
  CHECK(r.code == 0 && strstr(r.out, "test accuracy"), "--eval-batch 2^24: exit %d: %s", r.code, r.err);
  tt_result_free(&r);
  /* eval sizes the model for --batch before it reads the data: too large is named as the flag */
  r = tt_run(dir, 60, "prlimit --as=2000000000 %s eval --data %s --model-file %s/bigeval/model.safetensors "
             "--batch 16777216", b, data, dir);
  expect_usage("eval --batch 2^24", r, "smaller --batch");
#endif
  /* training images there but unreadable: said so (not "no training images", not "install the
   * dataset"); needs root to become nobody, and a dtrain that nobody may run */
  r = tt_run(dir, 30, "setpriv --reuid=65534 --regid=65534 --clear-groups %s --version", b);
  int can = geteuid() == 0 && r.code == 0;
  tt_result_free(&r);
  if (can) {
    snprintf(d, sizeof d, "%s/unread", dir);
    mkdir(d, 0755);
    chmod(dir, 0755);
    tt_make_dataset(d, 64, 32);
    char p[2100];
    snprintf(p, sizeof p, "%s/train-images-idx3-ubyte", d);
    CHECK(chmod(p, 0) == 0, "chmod %s", p);
    r = tt_run(dir, 60, "setpriv --reuid=65534 --regid=65534 --clear-groups %s train --data %s --model '%s' "
               "--max-steps 2 --batch 16 --out %s/unread-run --progress off", b, d, TINY_MODEL, dir);
    CHECK(!strstr(r.err, "apt-get"), "unreadable images blamed on a missing dataset: %s", r.err);
    expect_usage("unreadable training images", r, "Permission denied"); /* frees r */
  } else {
    printf("skipped: unreadable data (needs root and a dtrain that nobody may run)\n");
  }
}

static void group_accum(void) {
  const char *b = tt_bin();
  const char *common = "--model '" TINY_MODEL "' --batch 48 --max-steps 6 --optimizer sgd --lr 0.1 "
                       "--momentum 0.9 --threads 1 --log-interval 1";
  tt_result r = tt_run(dir, 120, "%s train --data %s %s --out %s/big --json", b, data, common, dir);
  CHECK(r.code == 0, "big batch exit %d: %s", r.code, r.err);
  tt_result_free(&r);
  r = tt_run(dir, 120, "%s train --data %s %s --accumulate 4 --out %s/acc --json", b, data, common, dir);
  CHECK(r.code == 0, "accumulate exit %d: %s", r.code, r.err);
  tt_result_free(&r);
  r = tt_run(dir, 120, "%s train --data %s %s --accumulate 5 --out %s/acc5 --json", b, data, common, dir);
  CHECK(r.code == 0, "accumulate 5 (uneven micro-batches) exit %d: %s", r.code, r.err);
  tt_result_free(&r);
  char p1[4096], p2[4096], p3[4096];
  snprintf(p1, sizeof p1, "%s/big/model.safetensors", dir);
  snprintf(p2, sizeof p2, "%s/acc/model.safetensors", dir);
  snprintf(p3, sizeof p3, "%s/acc5/model.safetensors", dir);
  double d = tt_model_rel_diff(p2, p1), d5 = tt_model_rel_diff(p3, p1);
  fprintf(stderr, "accumulate 4 vs big batch: rel diff %.3g; accumulate 5: %.3g\n", d, d5);
  CHECK(d <= 1e-5 && d5 <= 1e-5, "accumulated gradients differ from the big batch: %g, %g", d, d5);
  /* and the runs really trained: parameters moved away from the initialization */
  r = tt_run(dir, 120, "%s train --data %s %s --max-steps 1 --lr 0 --out %s/init --json", b, data,
             common, dir);
  CHECK(r.code == 0, "init run exit %d", r.code);
  tt_result_free(&r);
  char p0[4096];
  snprintf(p0, sizeof p0, "%s/init/model.safetensors", dir);
  CHECK(tt_model_rel_diff(p0, p1) > 1e-3, "training did not change the parameters");
}

static void group_resume(int adamw) {
  const char *b = tt_bin();
  const char *common = adamw ? "--model 'in=1x8x8,linear:32,relu,dropout:0.1,linear:4' --batch 40 --epochs 2 "
                               "--optimizer adamw --lr 0.003 --weight-decay 0.01 --schedule cosine:5 "
                               "--clip 1 --threads 1 --log-interval 1"
                             : "--model 'in=1x8x8,linear:32,relu,dropout:0.1,linear:4' --batch 40 --epochs 2 "
                               "--optimizer sgd --lr 0.05 --momentum 0.9 --nesterov --weight-decay 0.0005 "
                               "--threads 1 --log-interval 1";
  /* 600 / 40 = 15 steps per epoch; 30 in all. Uninterrupted: */
  tt_result r = tt_run(dir, 120, "%s train --data %s %s --out %s/full --json", b, data, common, dir);
  CHECK(r.code == 0, "full run exit %d: %s", r.code, r.err);
  double full_loss = tt_json_num(r.out, "train_loss");
  tt_result_free(&r);
  /* Interrupted after step 20 (mid-epoch 2), checkpoints every 4 steps, keep 2 */
  r = tt_run(dir, 120,
             "%s train --data %s %s --max-steps 20 --checkpoint-dir %s/ck --checkpoint-every 4 "
             "--keep 2 --out %s/part --json",
             b, data, common, dir, dir);
  CHECK(r.code == 0, "part run exit %d: %s", r.code, r.err);
  tt_result_free(&r);
  uint64_t *steps = NULL;
  size_t n = 0;
  char ck[4096];
  snprintf(ck, sizeof ck, "%s/ck", dir);
  CHECK(dt_ckpt_list(ck, &steps, &n) == DT_OK, "list: %s", dt_last_error());
  CHECK(n == 2 && steps[0] == 16 && steps[1] == 20, "kept checkpoints: %zu (want 16, 20)", n);
  free(steps);
  /* the max-steps cap differs, so the resumed run gets --epochs 2 as the full one */
  r = tt_run(dir, 120, "%s train --data %s %s --checkpoint-dir %s/ck --resume --out %s/res --json", b,
             data, common, dir, dir);
  CHECK(r.code == 0, "resume exit %d: %s", r.code, r.err);
  CHECK(tt_json_num(r.out, "resumed_from_step") == 20, "resumed from %g", tt_json_num(r.out, "resumed_from_step"));
  CHECK(tt_json_num(r.out, "steps") == 30 && tt_json_num(r.out, "steps_run") == 10, "steps: %s", r.out);
  /* epoch 2's loss averages its 15 steps, the 5 before the resume included (they were dropped) */
  CHECK(fabs(tt_json_num(r.out, "train_loss") - full_loss) <= 1e-9 * fabs(full_loss),
        "resumed epoch loss %.9g, uninterrupted %.9g", tt_json_num(r.out, "train_loss"), full_loss);
  tt_result_free(&r);
  double full[64], res[64];
  char p[4096];
  snprintf(p, sizeof p, "%s/full/metrics.jsonl", dir);
  CHECK(tt_metrics_losses(p, full, 64) == 30, "full run logged 30 steps");
  snprintf(p, sizeof p, "%s/res/metrics.jsonl", dir);
  CHECK(tt_metrics_losses(p, res, 64) == 30, "resumed run logged up to step 30");
  for (int s = 21; s <= 30; s++)
    CHECK(res[s] == full[s], "step %d: resumed loss %.9g != uninterrupted %.9g", s, res[s], full[s]);
  char a[4096], c[4096];
  snprintf(a, sizeof a, "%s/full/model.safetensors", dir);
  snprintf(c, sizeof c, "%s/res/model.safetensors", dir);
  CHECK(tt_model_rel_diff(c, a) == 0, "resumed parameters differ from uninterrupted ones");

  /* a corrupt newest checkpoint falls back to the previous one (step 16) and still matches */
  snprintf(p, sizeof p, "%s/ck/ckpt-000000030.dtc", dir);
  FILE *f = fopen(p, "r+b");
  CHECK(f, "open %s", p);
  fseek(f, 200, SEEK_SET);
  fputc(0x5a, f);
  fclose(f);
  r = tt_run(dir, 120, "%s train --data %s %s --checkpoint-dir %s/ck --resume --out %s/res2 --json", b,
             data, common, dir, dir);
  CHECK(r.code == 0, "resume after corruption exit %d: %s", r.code, r.err);
  CHECK(tt_json_num(r.out, "resumed_from_step") == 20, "fell back to %g (want 20)",
        tt_json_num(r.out, "resumed_from_step"));
  tt_result_free(&r);
  snprintf(c, sizeof c, "%s/res2/model.safetensors", dir);
  CHECK(tt_model_rel_diff(c, a) == 0, "resumed (fallback) parameters differ");

  /* a checkpoint of another model is refused with a usage error naming the setting */
  r = tt_run(dir, 120, "%s train --data %s --model '%s' --batch 40 --checkpoint-dir %s/ck --resume --out %s/x",
             b, data, TINY_MODEL, dir, dir);
  CHECK(r.code == 2 && strstr(r.err, "--model"), "other model: exit %d: %s", r.code, r.err);
  tt_result_free(&r);
  /* a checkpoint is not a model file, and eval says which it is */
  r = tt_run(dir, 60, "%s eval --data %s --model-file \"$(ls %s/ck/*.dtc | head -n 1)\"", b, data, dir);
  CHECK(r.code != 0 && strstr(r.err, "is a dtrain checkpoint, not a safetensors model file"),
        "checkpoint as a model: exit %d: %s", r.code, r.err);
  tt_result_free(&r);
  /* nor does a run whose last step comes before the checkpoint's go on from it */
  r = tt_run(dir, 120, "%s train --data %s %s --max-steps 8 --checkpoint-dir %s/ck --resume --out %s/x", b, data,
             common, dir, dir);
  CHECK(r.code == 2 && strstr(r.err, "past this run's last step 8") && strstr(r.err, "--max-steps 8"),
        "resume past --max-steps: exit %d: %s", r.code, r.err);
  tt_result_free(&r);
}

/* The checkpoint directory is checked at start-up, not at the first checkpoint. */
static void group_ckdir(void) {
  const char *b = tt_bin();
  const char *common = "--model '" TINY_MODEL "' --batch 40 --threads 1 --log-interval 1 --checkpoint-every 5";
  /* missing parents are created; a regular file is refused before any step */
  tt_result r = tt_run(dir, 120, "%s train --data %s %s --max-steps 1 --checkpoint-dir %s/x/y/ck --out %s/o1",
                       b, data, common, dir, dir);
  CHECK(r.code == 0, "exit %d: %s", r.code, r.err);
  tt_result_free(&r);
  char p[4096];
  snprintf(p, sizeof p, "%s/x/y/ck/dtrain.lock", dir);
  CHECK(access(p, F_OK) == 0, "%s/x/y/ck was not created at start", dir);
  snprintf(p, sizeof p, "%s/afile", dir);
  FILE *f = fopen(p, "w");
  CHECK(f, "create %s", p);
  fclose(f);
  r = tt_run(dir, 120, "%s train --data %s %s --max-steps 10 --checkpoint-dir %s --out %s/o2", b, data, common, p, dir);
  CHECK(r.code == 2 && strstr(r.err, p) && strstr(r.err, "Not a directory"), "file as dir: exit %d: %s", r.code, r.err);
  tt_result_free(&r);
  snprintf(p, sizeof p, "%s/o2/metrics.jsonl", dir);
  double l[16];
  CHECK(tt_metrics_losses(p, l, 16) == 0, "steps were trained before the directory was checked");
  /* a file-size limit hit while writing a checkpoint: reported naming the file, the temporary
   * file removed (SIGXFSZ used to end the process without a word and leave it) */
  r = tt_run(dir, 120, "prlimit --fsize=8192 %s train --data %s %s --max-steps 10 --checkpoint-dir %s/ckf --out %s/of", b, data,
             common, dir, dir);
  CHECK(r.code == 1 && strstr(r.err, "ckpt-000000005.dtc") && strstr(r.err, "File too large"),
        "file-size limit: exit %d: %s", r.code, r.err);
  tt_result_free(&r);
  r = tt_run(dir, 30, "ls -A %s/ckf", dir);
  CHECK(r.code == 0 && !strstr(r.out, ".tmp"), "temporary file left: %s", r.out);
  tt_result_free(&r);
  /* the same with two workers: the other rank stops at once with rank 0's reason (dt_comm_abort),
   * not a bare "closed the connection" or, on shm, a wait for the deadline */
  r = tt_run(dir, 120, "env DTRAIN_TRANSPORT=tcp prlimit --fsize=8192 %s run -n 2 -- %s train --data %s %s --max-steps 10 "
             "--progress off --checkpoint-dir %s/ckf2 --out %s/of2", b, b, data, common, dir, dir);
  CHECK(r.code == 1 && strstr(r.err, "[rank 1] dtrain train: training failed: rank 1:") &&
            strstr(r.err, "job failed: rank 0: ") && strstr(r.err, "ckpt-000000005.dtc: write at offset 8192: File too large"),
        "file-size limit, 2 workers: exit %d: %s", r.code, r.err);
  { /* the failing rank named once at the head of its line, not again after a context */
    const char *head = "[rank 1] dtrain train: training failed: rank 1:";
    const char *line = strstr(r.err, head) + strlen(head);
    const char *again = strstr(line, "rank 1: "), *eol = strchr(line, '\n');
    CHECK(!again || (eol && again > eol), "rank 1 named twice: %s", r.err);
  }
  tt_result_free(&r);
  /* on shm the limit already stops the shared memory from being sized, and says so */
  r = tt_run(dir, 120, "prlimit --fsize=65536 %s run -n 2 -- %s train --data %s %s --max-steps 10 --progress off "
             "--checkpoint-dir %s/ckf3 --out %s/of3", b, b, data, common, dir, dir);
  CHECK(r.code == 1 && strstr(r.err, "a file-size limit, ulimit -f?"), "file-size limit, shm: exit %d: %s", r.code,
        r.err);
  tt_result_free(&r);
  /* a second run with the same --out is refused at start (it used to interleave its metrics
   * records with the first's, NUL bytes between them) */
  {
    char cmd[16384], pidf[1200], mf[1200];
    snprintf(pidf, sizeof pidf, "%s/lk.pid", dir);
    snprintf(mf, sizeof mf, "%s/lk/metrics.jsonl", dir);
    snprintf(cmd, sizeof cmd, "timeout 120 %s train --data %s %s --epochs 1000000 --max-steps 100000000 --progress off "
             "--checkpoint-dir %s/lkck --out %s/lk >/dev/null 2>&1 & echo $! > %s", b, data, common, dir, dir, pidf);
    CHECK(system(cmd) == 0, "starting %s", cmd);
    for (int i = 0; i < 200 && access(mf, F_OK) != 0; i++)
      usleep(50000);
    r = tt_run(dir, 60, "%s train --data %s --model '" TINY_MODEL "' --max-steps 1 --out %s/lk", b, data, dir);
    snprintf(cmd, sizeof cmd, "kill $(cat %s)", pidf);
    if (system(cmd) != 0)
      fprintf(stderr, "could not stop the first run\n");
    CHECK(r.code == 2 && strstr(r.err, "is being written by another run"), "same --out twice: exit %d: %s", r.code,
          r.err);
    tt_result_free(&r);
  }
  /* so is a directory where the model will be written, before any step rather than after all */
  snprintf(p, sizeof p, "%s/omodel", dir);
  CHECK(mkdir(p, 0700) == 0, "mkdir %s", p);
  snprintf(p, sizeof p, "%s/omodel/model.safetensors", dir);
  CHECK(mkdir(p, 0700) == 0, "mkdir %s", p);
  r = tt_run(dir, 120, "%s train --data %s %s --max-steps 10 --checkpoint-dir %s/ckm --out %s/omodel", b, data,
             common, dir, dir);
  CHECK(r.code == 2 && strstr(r.err, p) && strstr(r.err, "is a directory"), "model path a directory: exit %d: %s",
        r.code, r.err);
  tt_result_free(&r);
  snprintf(p, sizeof p, "%s/omodel/metrics.jsonl", dir);
  CHECK(tt_metrics_losses(p, l, 16) == 0, "steps were trained before the model path was checked");
  /* a fresh run into an earlier run's checkpoints is refused, naming the newest */
  r = tt_run(dir, 120, "%s train --data %s %s --max-steps 10 --checkpoint-dir %s/ck --out %s/o3", b, data, common,
             dir, dir);
  CHECK(r.code == 0, "exit %d: %s", r.code, r.err);
  tt_result_free(&r);
  r = tt_run(dir, 120, "%s train --data %s %s --max-steps 10 --checkpoint-dir %s/ck --out %s/o4", b, data, common,
             dir, dir);
  CHECK(r.code == 2 && strstr(r.err, "ckpt-000000010.dtc") && strstr(r.err, "--resume"), "stale dir: exit %d: %s",
        r.code, r.err);
  tt_result_free(&r);
  /* another momentum is a settings mismatch (not damage); a changed --lr is accepted with a warning */
  r = tt_run(dir, 120, "%s train --data %s %s --max-steps 12 --momentum 0.9 --checkpoint-dir %s/ck --resume "
             "--out %s/o4", b, data, common, dir, dir);
  CHECK(r.code == 2 && strstr(r.err, "was written with --momentum 0, this run has 0.9") &&
        !strstr(r.err, "dataset-fashion-mnist"), "momentum: exit %d: %s", r.code, r.err);
  tt_result_free(&r);
  r = tt_run(dir, 120, "%s train --data %s %s --max-steps 12 --lr 0.1 --progress off --checkpoint-dir %s/ck --resume "
             "--out %s/o4", b, data, common, dir, dir);
  CHECK(r.code == 0 && strstr(r.err, "resuming with --lr 0.1; the checkpoint was written with 0.05") &&
        strstr(r.out, "resumed from step 10") && strstr(r.out, "steps 11-12 in"), "lr: exit %d: %s%s", r.code, r.out, r.err);
  tt_result_free(&r);
  r = tt_run(dir, 120, "%s train --data %s %s --max-steps 14 --lr 0.1 --clip 2 --progress off --checkpoint-dir %s/ck "
             "--resume --out %s/o4", b, data, common, dir, dir);
  CHECK(r.code == 0 && strstr(r.err, "resuming with --clip 2; the checkpoint was written with 0"), "clip: exit %d: %s",
        r.code, r.err);
  tt_result_free(&r);
  /* --accumulate is a setting a resume warns about; a resume with no step left says so */
  r = tt_run(dir, 120, "%s train --data %s %s --max-steps 14 --lr 0.1 --clip 2 --accumulate 2 --progress off "
             "--checkpoint-dir %s/ck --resume --out %s/o4", b, data, common, dir, dir);
  CHECK(r.code == 0 && strstr(r.err, "resuming with --accumulate 2; the checkpoint was written with 1") &&
            strstr(r.out, "no step left (the checkpoint is at step 14)"),
        "accumulate / no step left: exit %d: %s%s", r.code, r.out, r.err);
  tt_result_free(&r);
  /* a checkpoint written on another training set is refused, naming both sets */
  {
    char data2[1100];
    snprintf(data2, sizeof data2, "%s/data2", dir);
    CHECK(mkdir(data2, 0700) == 0, "mkdir %s", data2);
    tt_make_dataset(data2, 300, 200);
    r = tt_run(dir, 120, "%s train --data %s %s --max-steps 16 --lr 0.1 --clip 2 --checkpoint-dir %s/ck --resume "
               "--out %s/o4", b, data2, common, dir, dir);
    CHECK(r.code == 2 && strstr(r.err, "another training set (600 samples") && strstr(r.err, "now gives 300 samples"),
          "other data: exit %d: %s", r.code, r.err);
    tt_result_free(&r);
  }
  /* a checkpoint whose checksums hold but whose step is missing is damage: refused, and not
   * overwritten by a fresh start */
  {
    dt_ckpt *c = NULL;
    char src[1100], dst[1100];
    snprintf(src, sizeof src, "%s/ck/ckpt-000000014.dtc", dir);
    snprintf(dst, sizeof dst, "%s/cknostep", dir);
    CHECK(mkdir(dst, 0700) == 0, "mkdir %s", dst);
    snprintf(dst, sizeof dst, "%s/cknostep/ckpt-000000014.dtc", dir);
    CHECK(dt_ckpt_open(src, &c) == DT_OK, "open %s: %s", src, dt_last_error());
    dt_ckpt_section secs[8];
    dt_kv meta[64];
    size_t ns = 0, nm = 0;
    for (size_t i = 0; c && i < dt_ckpt_count(c) && ns < 8; i++)
      secs[ns++] = *dt_ckpt_section_at(c, i);
    for (size_t i = 0; c && i < dt_ckpt_meta_count(c) && nm < 64; i++)
      if (strcmp(dt_ckpt_meta_at(c, i)->key, "step"))
        meta[nm++] = *dt_ckpt_meta_at(c, i);
    CHECK(c && dt_ckpt_write(dst, 14, secs, ns, meta, nm) == DT_OK, "write %s: %s", dst, dt_last_error());
    /* and one whose meta step is not its header's */
    char other[1100];
    snprintf(other, sizeof other, "%s/ckstep10", dir);
    CHECK(mkdir(other, 0700) == 0, "mkdir %s", other);
    snprintf(other, sizeof other, "%s/ckstep10/ckpt-000000014.dtc", dir);
    meta[nm++] = (dt_kv){"step", "10"};
    CHECK(c && dt_ckpt_write(other, 14, secs, ns, meta, nm) == DT_OK, "write %s: %s", other, dt_last_error());
    dt_ckpt_destroy(c);
    r = tt_run(dir, 120, "%s train --data %s %s --max-steps 16 --lr 0.1 --clip 2 --checkpoint-dir %s/ckstep10 "
               "--resume --out %s/o7", b, data, common, dir, dir);
    CHECK(r.code == 2 && strstr(r.err, "meta step 10") && strstr(r.err, "against step 14 in its header"),
          "step 10 in a step-14 file: exit %d: %s", r.code, r.err);
    tt_result_free(&r);
    struct stat before, after;
    CHECK(stat(dst, &before) == 0, "stat %s", dst);
    r = tt_run(dir, 120, "%s train --data %s %s --max-steps 16 --lr 0.1 --clip 2 --checkpoint-dir %s/cknostep "
               "--resume --out %s/o6", b, data, common, dir, dir);
    CHECK(r.code == 2 && strstr(r.err, "meta key step missing"), "no step: exit %d: %s", r.code, r.err);
    tt_result_free(&r);
    r = tt_run(dir, 60, "%s inspect %s/cknostep", b, dir);
    CHECK(r.code == 1 && strstr(r.out, "DAMAGED") && strstr(r.out, "meta key step missing") &&
              strstr(r.out, "a resume would stop at it"), "inspect of a file without a step: exit %d: %s%s", r.code,
          r.out, r.err);
    tt_result_free(&r);
    CHECK(stat(dst, &after) == 0 && after.st_mtime == before.st_mtime && after.st_size == before.st_size &&
              after.st_ino == before.st_ino, "the damaged checkpoint was replaced");
  }
  /* a second job on a locked directory is refused */
  r = tt_run(dir, 120, "flock %s/ck/dtrain.lock %s train --data %s %s --max-steps 12 --checkpoint-dir %s/ck --resume "
             "--out %s/o5", dir, b, data, common, dir, dir);
  CHECK(r.code == 2 && strstr(r.err, "in use by another job"), "locked: exit %d: %s", r.code, r.err);
  tt_result_free(&r);
}

int main(int argc, char **argv) {
  const char *g = argc > 1 ? argv[1] : "usage";
  tt_scratch(dir, sizeof dir, g);
  snprintf(data, sizeof data, "%s/data", dir);
  mkdir(data, 0777);
  tt_make_dataset(data, 600, 200);
  if (!strcmp(g, "usage"))
    group_usage();
  else if (!strcmp(g, "json"))
    group_json();
  else if (!strcmp(g, "shapes"))
    group_shapes();
  else if (!strcmp(g, "accum"))
    group_accum();
  else if (!strcmp(g, "resume"))
    group_resume(0);
  else if (!strcmp(g, "resume_adamw"))
    group_resume(1);
  else if (!strcmp(g, "ckdir"))
    group_ckdir();
  else
    CHECK(0, "unknown group %s", g);
  tt_rmrf(dir);
  printf("ok %s\n", g);
  return 0;
}
