/* train.c - `dtrain train`: flags -> dt_train_config, the monitor (metrics file + progress),
 * dt_train_run, and the final summary (text, or one JSON object on stdout with --json).
 * Under `dtrain run` every rank runs this; only rank 0 writes files and prints the summary.
 * Everything the command does is reachable through dtrain/train.h and dtrain/monitor.h. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/core.h"
#include "dtrain/data.h"
#include "dtrain/monitor.h"
#include "dtrain/nn.h"
#include "dtrain/train.h"
#include "nn/nn.h" /* dt__nn_gemm_check */

#define CMD "train"
#define HELP_HINT "see 'dtrain train --help'"
#define DATA_HINT "apt-get install dataset-fashion-mnist, or pass --data DIR (an IDX directory)"

static void help(FILE *f) {
  fprintf(f,
      "usage: dtrain train [options]\n"
      "\n"
      "Trains a model on an IDX dataset (Fashion-MNIST by default), evaluates it on the test set\n"
      "after each epoch and writes DIR/model.safetensors and DIR/metrics.jsonl (DIR from --out).\n"
      "Under 'dtrain run -n N' (or torchrun/mpirun/srun environments) the N workers train one\n"
      "model together: --batch is the global batch, split across workers; gradients are summed\n"
      "in buckets overlapped with backward.\n"
      "\n"
      "model and data:\n"
      "  --model SPEC          preset (mlp, cnn) or spec string, see below (default mlp)\n"
      "  --data DIR            IDX directory with train-/t10k- images and labels\n"
      "                        (default %s); images N x H x W (read as\n"
      "                        1xHxW) or N x C x H x W, one shape in both splits, the model's\n"
      "                        in=CxHxW (in=F takes any image of F values)\n"
      "  --seed S              parameters, shuffling and dropout (default 42)\n"
      "training:\n"
      "  --epochs N            passes over the training set (default 1)\n"
      "  --max-steps K         stop after K optimizer steps in total; the LR schedule still\n"
      "                        spans --epochs (default: no limit)\n"
      "  --batch N             global batch: samples per optimizer step over all workers (128)\n"
      "  --accumulate N        split each worker's shard into N micro-batches, one allreduce\n"
      "                        per step (default 1)\n"
      "  --optimizer sgd|adamw (default sgd)\n"
      "  --lr X                base learning rate (default 0.05; 0 trains nothing, said)\n"
      "  --momentum X          SGD momentum (default 0)\n"
      "  --nesterov            Nesterov momentum (SGD, needs --momentum > 0)\n"
      "  --weight-decay X      SGD: L2 added to the gradient; AdamW: decoupled (default 0 / 0.01)\n"
      "  --schedule S          constant | step:K[:GAMMA] | cosine[:WARMUP[:MIN_LR]], optionally\n"
      "                        prefixed by warmup=W, (default constant)\n"
      "  --clip X              clip gradients to global L2 norm X (default: off; 0 is off)\n"
      "  --threads N           compute threads per worker (default: cores / local workers);\n"
      "                        2+ local workers whose threads fit the cores are each pinned to\n"
      "                        their share (DTRAIN_BIND=none keeps them free)\n"
      "  --bucket-size SIZE    least gradient allreduce bucket (whole layers), e.g. 512K, 1M\n"
      "                        (default 1M)\n"
      "  --zero auto|0|1       ZeRO stage: 1 shards the optimizer state across the workers\n"
      "                        (each keeps and updates 1/N of it: gradients reduce-scattered,\n"
      "                        parameters allgathered); 0 keeps it whole everywhere; auto: 1\n"
      "                        when the workers share memory (shm), else 0 (default auto)\n"
      "evaluation and output:\n"
      "  --eval-batch N        global evaluation batch (default 1000)\n"
      "  --out DIR             model.safetensors and metrics.jsonl go here (default runs/train)\n"
      "  --log-interval K      a metrics line every K steps (default 10)\n"
      "  --progress MODE       auto | bar | lines | off (default auto: bar on a terminal)\n"
      "  --json                print the summary as one JSON object on stdout (here and in\n"
      "                        metrics.jsonl a number that is not finite is null)\n"
      "checkpoints:\n"
      "  --checkpoint-dir D    write checkpoints (ckpt-<step>.dtc) here; created (with its\n"
      "                        parents) and checked at start, locked (D/dtrain.lock) against a\n"
      "                        second job; without --resume it must hold no checkpoints\n"
      "  --checkpoint-every K  every K steps (default: at each epoch's end) and at the end\n"
      "  --keep K              keep the last K checkpoints (default 3)\n"
      "  --resume              continue from the latest valid checkpoint in --checkpoint-dir\n"
      "                        (starts fresh if there is none); the loss sequence repeats the\n"
      "                        uninterrupted run's. --model, --batch, --seed, --optimizer and\n"
      "                        --momentum must be those of the checkpoint; another --lr,\n"
      "                        --schedule, --weight-decay, --epochs or --nesterov is warned about\n"
      "  -h, --help            this text\n"
      "\n"
      "Exit codes: 0 done, 1 runtime failure (a diverged loss too), 2 bad flags, model spec,\n"
      "missing or damaged data, or settings that differ across workers.\n"
      "\n"
      "Model specs:\n%s",
      DT_FASHION_MNIST_DIR, dt_model_spec_help());
}

/* ---- flag parsing ---- */

typedef struct flags {
  int argc, i;
  char **argv;
  const char *name; /* flag being parsed, for messages */
} flags;

/* The value of the current flag (--flag=V or --flag V); NULL after printing a usage error. */
static const char *flag_value(flags *f, const char *eq) {
  if (eq)
    return eq + 1;
  if (f->i + 1 >= f->argc)
    return NULL;
  return f->argv[++f->i];
}

/* What the last refused value should have been, for the usage error ("" when unknown). */
static char expected[96];

static int parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (hi >= INT64_MAX / 2)
    snprintf(expected, sizeof expected, ": a whole number from %lld up", (long long)lo);
  else
    snprintf(expected, sizeof expected, ": a whole number from %lld to %lld", (long long)lo, (long long)hi);
  if (errno || end == s || *end || v < lo || v > hi)
    return -1;
  *out = v;
  return 0;
}

static int parse_f(const char *s, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  snprintf(expected, sizeof expected, ": a decimal number from %g to %g", lo, hi);
  /* decimal only: strtod also reads hex (0x10) and leading spaces */
  if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi || isspace((unsigned char)*s) ||
      strpbrk(s, "xXpP"))
    return -1;
  *out = v;
  return 0;
}

static int default_threads(void) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores < 1)
    cores = 1;
  /* workers on this host, by the launchers' conventions (dtrain run, torchrun, Open MPI) */
  static const char *const vars[] = {"DTRAIN_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                     "OMPI_COMM_WORLD_LOCAL_SIZE", "DTRAIN_WORLD_SIZE"};
  int64_t local = 1;
  for (size_t i = 0; i < DT_ARRAY_LEN(vars); i++) {
    int64_t v = 0;
    if (dt__env_int(vars[i], 0, &v) == DT_OK && v >= 1) {
      local = v;
      break;
    }
  }
  long t = cores / local;
  return t < 1 ? 1 : (int)t;
}

/* Prints a failed run's error with its hint; returns the exit code (2: settings or input).
 * at_ckpt: the failure was at the checkpoints (directory, resume), not at the data. */
static int train_error(dt_status rc, bool at_ckpt) {
  const char *hint = NULL;
  if (at_ckpt && (rc == DT_ERR_NOT_FOUND || rc == DT_ERR_CORRUPT || rc == DT_ERR_MISMATCH))
    hint = "check the checkpoints with 'dtrain inspect DIR'; resume with the settings they were "
           "written with, or start afresh with another --checkpoint-dir";
  else if (rc == DT_ERR_NOT_FOUND)
    hint = DATA_HINT;
  else if (rc == DT_ERR_MISMATCH)
    hint = "start every worker with the same flags and data, and resume with the settings the "
           "checkpoint was written with";
  else if (rc == DT_ERR_INVALID)
    hint = HELP_HINT;
  else if (rc == DT_ERR_CORRUPT)
    hint = "the file named above is damaged: regenerate it, reinstall dataset-fashion-mnist, or "
           "check it with 'dtrain inspect FILE'";
  else if (rc == DT_ERR_UNSUPPORTED)
    hint = "this dtrain cannot use the file or setting named above (the data: IDX files of u8 images "
           "and labels, as Fashion-MNIST's)";
  if (!hint)
    return dt_cli_fail(CMD, "training failed");
  return dt_cli_usage_error(CMD, hint, "%s", dt_last_error());
}

int dt_cli_train(int argc, char **argv) {
  dt_train_config cfg;
  dt_train_config_init(&cfg);
  cfg.threads = 0;
  const char *out_dir = "runs/train", *optimizer = "sgd", *progress = "auto";
  int json = 0;
  double momentum = -1, wd = -1;
  int nesterov = 0;
  flags f = {.argc = argc, .argv = argv, .i = 1};
  for (; f.i < argc; f.i++) {
    char *a = argv[f.i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      help(stdout);
      return 0;
    }
    if (strncmp(a, "--", 2))
      return dt_cli_usage_error(CMD, HELP_HINT, "unexpected argument '%s'", a);
    char name[64];
    const char *eq = strchr(a, '=');
    size_t nl = eq ? (size_t)(eq - a) : strlen(a);
    if (nl >= sizeof name)
      return dt_cli_usage_error(CMD, HELP_HINT, "unknown flag '%s'", a);
    memcpy(name, a, nl);
    name[nl] = '\0';
    /* boolean flags */
    if (!strcmp(name, "--json") || !strcmp(name, "--nesterov") || !strcmp(name, "--resume")) {
      if (eq)
        return dt_cli_usage_error(CMD, HELP_HINT, "%s takes no value", name);
      if (!strcmp(name, "--json"))
        json = 1;
      else if (!strcmp(name, "--nesterov"))
        nesterov = 1;
      else
        cfg.resume = true;
      continue;
    }
    static const char *const valued[] = {
        "--model", "--data", "--seed", "--epochs", "--max-steps", "--batch", "--accumulate",
        "--optimizer", "--lr", "--momentum", "--weight-decay", "--schedule", "--clip",
        "--threads", "--bucket-size", "--eval-batch", "--out", "--log-interval", "--progress",
        "--checkpoint-dir", "--checkpoint-every", "--keep", "--zero"};
    int known = 0;
    for (size_t k = 0; k < DT_ARRAY_LEN(valued); k++)
      known |= !strcmp(name, valued[k]);
    if (!known)
      return dt_cli_usage_error(CMD, HELP_HINT, "unknown flag '%s'", name);
    const char *v = flag_value(&f, eq);
    if (!v)
      return dt_cli_usage_error(CMD, HELP_HINT, "%s needs a value", name);
    if (!*v) /* an unset shell variable: --out "" would write into / */
      return dt_cli_usage_error(CMD, HELP_HINT, "bad value '' for %s", name);
    int64_t iv;
    double dv;
    int bad = 0;
    if (!strcmp(name, "--model")) cfg.model = v;
    else if (!strcmp(name, "--data")) cfg.data_dir = v;
    else if (!strcmp(name, "--out")) out_dir = v;
    else if (!strcmp(name, "--schedule")) cfg.schedule = v;
    else if (!strcmp(name, "--checkpoint-dir")) cfg.checkpoint_dir = v;
    else if (!strcmp(name, "--optimizer")) optimizer = v;
    else if (!strcmp(name, "--progress")) progress = v;
    else if (!strcmp(name, "--seed")) {
      char *end;
      errno = 0;
      unsigned long long s = strtoull(v, &end, 10);
      bad = errno || end == v || *end || !isdigit((unsigned char)*v); /* no sign, no space: strtoull wraps " -1" */
      snprintf(expected, sizeof expected, ": a whole number from 0 up");
      cfg.seed = s;
    } else if (!strcmp(name, "--epochs")) {
      bad = parse_i64(v, 1, 1000000, &iv);
      cfg.epochs = (int)iv;
    } else if (!strcmp(name, "--max-steps")) {
      bad = parse_i64(v, 1, INT64_MAX / 2, &iv);
      cfg.max_steps = iv;
    } else if (!strcmp(name, "--batch")) {
      bad = parse_i64(v, 1, 1 << 24, &iv);
      cfg.global_batch = (int)iv;
    } else if (!strcmp(name, "--eval-batch")) {
      bad = parse_i64(v, 1, 1 << 24, &iv);
      cfg.eval_batch = (int)iv;
    } else if (!strcmp(name, "--accumulate")) {
      bad = parse_i64(v, 1, 1 << 20, &iv);
      cfg.accumulate = (int)iv;
    } else if (!strcmp(name, "--threads")) {
      bad = parse_i64(v, 1, 1024, &iv);
      cfg.threads = (int)iv;
    } else if (!strcmp(name, "--log-interval")) {
      bad = parse_i64(v, 1, INT64_MAX / 2, &iv);
      cfg.log_interval = iv;
    } else if (!strcmp(name, "--checkpoint-every")) {
      bad = parse_i64(v, 1, INT64_MAX / 2, &iv);
      cfg.checkpoint_every = iv;
    } else if (!strcmp(name, "--keep")) {
      bad = parse_i64(v, 1, 1000000, &iv);
      cfg.keep = (int)iv;
    } else if (!strcmp(name, "--lr")) {
      bad = parse_f(v, 0, 1e6, &dv);
      cfg.lr = (float)dv;
    } else if (!strcmp(name, "--momentum")) {
      bad = parse_f(v, 0, 1, &dv);
      momentum = dv;
    } else if (!strcmp(name, "--weight-decay")) {
      bad = parse_f(v, 0, 1e6, &dv);
      wd = dv;
    } else if (!strcmp(name, "--clip")) {
      bad = parse_f(v, 0, 1e30, &dv);
      cfg.clip = (float)dv;
    } else if (!strcmp(name, "--zero")) {
      if (strcmp(v, "0") && strcmp(v, "1") && strcmp(v, "auto"))
        return dt_cli_usage_error(CMD, "use --zero 0 (whole optimizer state on every worker), "
                                  "--zero 1 (sharded across workers) or --zero auto",
                                  "bad value '%s' for --zero: the allowed values are auto, 0 and 1", v);
      cfg.zero = strcmp(v, "auto") ? v[0] - '0' : DT_TRAIN_ZERO_AUTO;
    } else if (!strcmp(name, "--bucket-size")) {
      uint64_t sz;
      bad = dt__parse_size(v, &sz) != DT_OK || sz < 4 || sz > ((uint64_t)1 << 40);
      snprintf(expected, sizeof expected, ": a size in bytes from 4 to 1T, e.g. 25M");
      cfg.bucket_bytes = (size_t)sz;
    }
    if (bad)
      return dt_cli_usage_error(CMD, HELP_HINT, "bad value '%s' for %s%s", v, name, expected);
  }

  if (!strcmp(optimizer, "sgd"))
    cfg.optim = dt_optim_defaults(DT_OPTIM_SGD);
  else if (!strcmp(optimizer, "adamw"))
    cfg.optim = dt_optim_defaults(DT_OPTIM_ADAMW);
  else
    return dt_cli_usage_error(CMD, "use --optimizer sgd or --optimizer adamw",
                              "unknown optimizer '%s'", optimizer);
  if (momentum >= 0) {
    if (cfg.optim.kind != DT_OPTIM_SGD)
      return dt_cli_usage_error(CMD, "--momentum applies to --optimizer sgd", "--momentum with adamw");
    cfg.optim.momentum = (float)momentum;
  }
  if (nesterov) {
    if (cfg.optim.kind != DT_OPTIM_SGD || cfg.optim.momentum <= 0)
      return dt_cli_usage_error(CMD, "add --momentum X with X > 0", "--nesterov needs SGD momentum");
    cfg.optim.nesterov = 1;
  }
  if (wd >= 0)
    cfg.optim.weight_decay = (float)wd;
  dt_progress_mode pm;
  if (!strcmp(progress, "auto")) pm = DT_PROGRESS_AUTO;
  else if (!strcmp(progress, "bar")) pm = DT_PROGRESS_BAR;
  else if (!strcmp(progress, "lines")) pm = DT_PROGRESS_LINES;
  else if (!strcmp(progress, "off")) pm = DT_PROGRESS_OFF;
  else
    return dt_cli_usage_error(CMD, "use auto, bar, lines or off", "unknown --progress '%s'", progress);
  if (cfg.resume && !cfg.checkpoint_dir)
    return dt_cli_usage_error(CMD, "add --checkpoint-dir D", "--resume needs --checkpoint-dir");
  if ((cfg.checkpoint_every || cfg.keep) && !cfg.checkpoint_dir) /* else no checkpoint would be written */
    return dt_cli_usage_error(CMD, "add --checkpoint-dir D", "%s needs --checkpoint-dir",
                              cfg.checkpoint_every ? "--checkpoint-every" : "--keep");
  if (cfg.accumulate > cfg.global_batch)
    return dt_cli_usage_error(CMD, HELP_HINT, "--accumulate %d is larger than --batch %d",
                              cfg.accumulate, cfg.global_batch);
  if (cfg.threads == 0)
    cfg.threads = default_threads();
  cfg.out_dir = out_dir;

  /* Cheap checks first so a typo fails in milliseconds, not after loading the data. */
  dt_model *probe = NULL;
  if (dt__nn_gemm_check() != DT_OK) /* the product the engine was told to use, before the spec */
    return dt_cli_usage_error(CMD, "unset DTRAIN_GEMM, or set it to auto, own or blas", "%s", dt_last_error());
  if (dt_model_create(cfg.model, 1, cfg.seed, &probe) != DT_OK)
    return dt_cli_usage_error(CMD, "see the model specs in 'dtrain train --help'", "bad --model '%s': %s",
                              cfg.model, dt_last_error());
  dt_model_destroy(probe);
  dt_lr_schedule sched;
  if (dt_lr_schedule_parse(cfg.schedule ? cfg.schedule : "constant", cfg.lr, 1000, &sched) != DT_OK)
    return dt_cli_usage_error(CMD, HELP_HINT, "bad --schedule '%s': %s", cfg.schedule, dt_last_error());
  {
    const char *dir = cfg.data_dir ? cfg.data_dir : DT_FASHION_MNIST_DIR;
    char p1[4096], p2[4096];
    snprintf(p1, sizeof p1, "%s/train-images-idx3-ubyte.gz", dir);
    snprintf(p2, sizeof p2, "%s/train-images-idx3-ubyte", dir);
    if (access(p1, R_OK) && access(p2, R_OK)) {
      const char *there = !access(p1, F_OK) ? p1 : !access(p2, F_OK) ? p2 : NULL;
      if (there && access(there, R_OK)) /* there, but not for this user */
        return dt_cli_usage_error(CMD, "make the dataset's files readable by the user that trains",
                                  "cannot read %s: %s", there, strerror(errno));
      return dt_cli_usage_error(CMD, DATA_HINT, "no training images in %s (looked for %s[.gz])", dir,
                                "train-images-idx3-ubyte");
    }
  }

  /* This process's rank by the conventions dtrain/comm.h lists (dtrain run, torchrun, mpirun,
   * srun): only rank 0 writes metrics and prints the summary. */
  int64_t rank = 0;
  static const char *const rank_vars[] = {"DTRAIN_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"};
  for (size_t i = 0; i < sizeof rank_vars / sizeof rank_vars[0]; i++)
    if (dt__env_str(rank_vars[i])) {
      if (dt__env_int(rank_vars[i], 0, &rank) != DT_OK)
        rank = 0;
      break;
    }
  if (rank == 0 && cfg.lr == 0.0f)
    fprintf(stderr, "dtrain train: warning: the learning rate is 0 (as a 32-bit float): the parameters will not "
                    "change\n");
  char metrics_path[4096];
  snprintf(metrics_path, sizeof metrics_path, "%s/metrics.jsonl", out_dir);
  dt_monitor *mon = NULL;
  dt_train_observer obs = {0};
  /* Only rank 0 observes; the trainer calls observers on rank 0 only, but the file must not
   * be created (or truncated) by other ranks either. */
  dt_monitor_opts mo = {.metrics_path = rank == 0 ? metrics_path : NULL, .append = cfg.resume,
                        .progress = pm};
  if (dt_monitor_create(&mo, &mon) != DT_OK)
    return dt_cli_usage_error(CMD, "--out DIR takes this run's metrics.jsonl and model: a directory this run may write "
                              "and no other run uses", "%s", dt_last_error());
  obs = dt_monitor_observer(mon);

  dt_train_summary s;
  dt_status rc = dt_train_run(&cfg, &obs, &s);
  dt_monitor_finish(mon);
  bool metrics_lost = dt_monitor_lost(mon);
  dt_monitor_destroy(mon);
  if (rc != DT_OK) {
    /* When rank 0 refused the settings or the checkpoints, the other ranks' message says so
     * ("rank 0 refused to ...: its reason"): a launcher told of any rank's exit first has rank
     * 0's reason, and dtrain run names rank 0 itself once it exits (launch_job.c's hold). */
    return train_error(rc, s.failed_at_checkpoints);
  }
  if (s.world_size > 1 && rank != 0)
    return 0;
  if (json) {
    FILE *o = stdout;
    dt__json_field(o, "{", "test_accuracy", "%.10g", s.test_accuracy);
    dt__json_field(o, ",", "test_loss", "%.10g", s.test_loss);
    dt__json_field(o, ",", "train_loss", "%.10g", s.train_loss);
    fprintf(o, ",\"epochs\":%d,\"steps\":%lld,\"steps_run\":%lld", s.epochs, (long long)s.steps,
            (long long)s.steps_run);
    dt__json_field(o, ",", "samples_per_s", "%.10g", s.samples_per_s);
    dt__json_field(o, ",", "steady_samples_per_s", "%.10g", s.steady_samples_per_s);
    dt__json_field(o, ",", "wall_s", "%.10g", s.wall_s);
    dt__json_field(o, ",", "train_s", "%.10g", s.train_s);
    dt__json_field(o, ",", "comm_exposed_s", "%.10g", s.comm_exposed_s);
    dt__json_field(o, ",", "comm_exposed_share", "%.10g", s.train_s > 0 ? s.comm_exposed_s / s.train_s : 0);
    dt__json_field(o, ",", "comm_waiting_slowest_s", "%.10g", s.comm_waiting_slowest_s);
    dt__json_field(o, ",", "data_wait_s", "%.10g", s.data_wait_s);
    dt__json_field(o, ",", "compute_imbalance", "%.10g", s.compute_imbalance);
    fprintf(o, ",\"slowest_rank\":%d", s.slowest_rank);
    dt__json_field(o, ",", "peak_rss_mb", "%.10g", s.peak_rss_mb);
    fprintf(o, ",\"world_size\":%d,\"threads\":%d,\"global_batch\":%d,\"params\":%zu,\"model\":",
            s.world_size, cfg.threads, cfg.global_batch, s.param_count);
    dt__json_str(o, s.model_spec);
    fputs(",\"model_file\":", o);
    dt__json_str(o, s.model_file);
    fputs(",\"metrics_file\":", o);
    dt__json_str(o, metrics_path);
    fprintf(o, ",\"metrics_complete\":%s", metrics_lost ? "false" : "true");
    fputs(",\"checkpoint_dir\":", o);
    if (cfg.checkpoint_dir)
      dt__json_str(o, cfg.checkpoint_dir);
    else
      fputs("null", o);
    fputs(",\"checkpoint_file\":", o);
    if (s.checkpoint_file[0])
      dt__json_str(o, s.checkpoint_file);
    else
      fputs("null", o);
    fprintf(o, ",\"resumed_from_step\":%lld}\n", (long long)s.resumed_from_step);
    fflush(o);
    return 0;
  }
  /* a resumed run names the steps it ran, which its time and rate are for */
  char steps[64];
  if (s.resumed_from_step >= 0 && s.steps <= s.resumed_from_step)
    snprintf(steps, sizeof steps, "no step left (the checkpoint is at step %lld)", (long long)s.resumed_from_step);
  else if (s.resumed_from_step >= 0)
    snprintf(steps, sizeof steps, "steps %lld-%lld", (long long)s.resumed_from_step + 1, (long long)s.steps);
  else
    snprintf(steps, sizeof steps, "%lld steps", (long long)s.steps);
  if (s.resumed_from_step >= 0)
    printf("resumed from step %lld\n", (long long)s.resumed_from_step);
  printf("trained %s (%zu parameters): %d epoch%s, %s in %.1f s, %.0f samples/s "
         "(%d worker%s x %d thread%s)\n",
         cfg.model, s.param_count, s.epochs, s.epochs == 1 ? "" : "s", steps, s.train_s,
         s.samples_per_s, s.world_size, s.world_size == 1 ? "" : "s", cfg.threads,
         cfg.threads == 1 ? "" : "s");
  if (s.world_size > 1 && s.train_s > 0)
    printf("exposed communication %.1f%% of training time (%.2f s, at least %.2f s of it waiting for "
           "slower ranks), data wait %.1f%%\n",
           100.0 * s.comm_exposed_s / s.train_s, s.comm_exposed_s, s.comm_waiting_slowest_s,
           100.0 * s.data_wait_s / s.train_s);
  if (s.world_size > 1 && s.slowest_rank >= 0) /* -1 too when no step ran (resumed at the end) */
    printf("slowest rank %d: %.2fx the fastest rank's compute time\n", s.slowest_rank,
           s.compute_imbalance);
  printf("test accuracy %.4f, test loss %.4f\n", s.test_accuracy, s.test_loss);
  printf("model:       %s\n", s.model_file);
  if (cfg.checkpoint_dir)
    printf("checkpoints: %s%s%s%s\n", cfg.checkpoint_dir, s.checkpoint_file[0] ? " (last " : "",
           s.checkpoint_file, s.checkpoint_file[0] ? ")" : "");
  printf("metrics:     %s%s\n", metrics_path, metrics_lost ? " (incomplete: a write failed, see the warning)" : "");
  return 0;
}
