/* test_cli_random.c - the dtrain command on random command lines: every subcommand (train, eval,
 * run, inspect, bench) with random flags from its own set, each given a value drawn from good
 * ones and hostile ones (empty, negative, zero, huge, overflowing, not a number, NaN, a unit
 * that does not exist, a missing value at the end of the line, a flag twice, an unknown flag),
 * and random files (good and damaged models and checkpoints, an empty file, a directory, a FIFO,
 * /dev/zero, a path that does not exist). Whatever the line, the command must end within its
 * deadline with 0, 1 or 2 (`dtrain run` also with its own 124 after --timeout, or a failing
 * worker's status, which it names), say why on stderr when it fails, and leave no sanitizer
 * report; nothing here decides which lines are right, only that none crashes, hangs or fails
 * silently.
 *
 *   test_cli_random CASES [SEED]      a failure prints the seed and the command line */
#include "train_test.h"

static char dir[1024], data[2048], small_data[2048];
#define PICK(a) ((a)[tt_rnd(sizeof(a) / sizeof *(a))])

/* ---- values ---- */
static const char *v_count[] = {"0", "1", "2", "3", "-1", "7", "2147483648", "99999999999999999999", "abc", "",
                                "1.5", "0x10", " 3", "3x", "-0", "+2", "1e3"};
static const char *v_small[] = {"1", "2", "3", "0", "-3", "abc", "", "4294967297", "2.0"};
static const char *v_float[] = {"0", "0.1", "1e-3", "-1", "nan", "inf", "-inf", "1e309", "abc", "", "0.5.5",
                                "1e-400", "0x1p-3", "5"};
static const char *v_size[] = {"64", "1K", "1M", "0", "-5", "1Y", "K", "1.5M", "99999999999999999999", "abc", "",
                               "8:64K", "4G"};
static const char *v_model[] = {
    "in=1x8x8,linear:16,relu,linear:4", "in=1x8x8,conv3x3:4:p1,relu,maxpool2,flatten,linear:4",
    "in=64,layernorm,linear:4", "mlp", "cnn", "", "linear", "linear:0", "linear:-1", "in=0x0x0,linear:4",
    "conv3x3:4", "in=1x8x8,conv9x9:4,linear:4", "in=1x8x8,maxpool9", "in=1x8x8,linear:4,", ",",
    "in=1x8x8,dropout:1.5,linear:4", "in=1x8x8,layernorm,linear:4", "in=1x8x8,conv3x3:4:s0,linear:4",
    "in=1x8x8,conv3x3:4:p-1,linear:4", "in=1x8x8,avgpool2:s0,linear:4", "in=1x8x8,gelu", "relu",
    "in=1x8x8,linear:4,in=1x8x8", "in=1x8x8,linear:4x", "in=3x8x8,linear:4", "in=1x8x8,flatten,flatten,linear:4",
    "in=1x8x8,linear:100000,linear:4", "in=1x8x8,conv1x1:4:s9,flatten,linear:4", "in=1x8x8,dropout:-0.1,linear:4"};
static const char *v_sched[] = {"constant", "step:2", "step:0", "step:2:0.5", "step:-1", "cosine", "cosine:1:0.1",
                                "cosine:abc", "warmup=2,constant", "warmup=-1,cosine", "warmup=,", "", "linear",
                                "step:2:nan", "cosine:99999999999999999999", "warmup=3"};
static const char *v_fault[] = {"kill:rank=1,step=1", "exit:rank=0,step=1,code=3", "stop:rank=1,step=1",
                                "kill:rank=9,step=1", "kill", "bogus:rank=0", "kill:rank=any,step=1-2;seed=3",
                                "slow:rank=0,step=0,ms=2", "delay:rank=1,step=0,ms=1", "kill:rank=1,step=x",
                                "", ";", "kill:rank=1,step=2,at=middle", "corrupt-ckpt:step=1",
                                "drop:rank=1,step=1,p=2"};
static char f_model[4096], f_ckpt[4200], f_bad[4096], f_empty[4096], f_fifo[4096], f_text[4096], f_ckdir[2048];
static char f_none[4200]; /* under a regular file: neither there nor creatable (--out creates its parents) */
static const char *path_any(void) {
  const char *p[] = {f_model, f_ckpt, f_bad, f_empty, f_fifo, f_text, f_ckdir, dir, "/dev/null", "/dev/zero",
                     f_none, "", data};
  return PICK(p);
}

/* Appends " FLAG VALUE" (or the flag alone, or sometimes nothing after it at the very end). */
#define ARG(...) snprintf(line + strlen(line), sizeof line - strlen(line), __VA_ARGS__)
static char line[16384];

static void q(const char *v) { ARG(" '%s'", v); } /* values are single-quoted for the shell */

static void train_flags(void) {
  for (int i = 0, n = (int)tt_rnd(7); i < n; i++) {
    switch (tt_rnd(24)) {
    case 0: ARG(" --model"); q(PICK(v_model)); break;
    case 1: ARG(" --data"); q(tt_chance(70) ? (tt_chance(50) ? data : small_data) : path_any()); break;
    case 2: ARG(" --batch"); q(PICK(v_count)); break;
    case 3: ARG(" --epochs"); q(PICK(v_small)); break;
    case 4: ARG(" --max-steps"); q(PICK(v_small)); break;
    case 5: ARG(" --accumulate"); q(PICK(v_small)); break;
    case 6: ARG(" --lr"); q(PICK(v_float)); break;
    case 7: ARG(" --momentum"); q(PICK(v_float)); break;
    case 8: ARG(" --weight-decay"); q(PICK(v_float)); break;
    case 9: ARG(" --clip"); q(PICK(v_float)); break;
    case 10: ARG(" --optimizer"); q(PICK(((const char *[]){"sgd", "adamw", "adam", "", "SGD"}))); break;
    case 11: ARG(" --schedule"); q(PICK(v_sched)); break;
    case 12: ARG(" --threads"); q(PICK(v_small)); break;
    case 13: ARG(" --bucket-size"); q(PICK(v_size)); break;
    case 14: ARG(" --zero"); q(PICK(((const char *[]){"auto", "0", "1", "2", ""}))); break;
    case 15: ARG(" --eval-batch"); q(PICK(v_count)); break;
    case 16: ARG(" --log-interval"); q(PICK(v_small)); break;
    case 17: ARG(" --progress"); q(PICK(((const char *[]){"auto", "bar", "lines", "off", "xyz"}))); break;
    case 18: ARG(" --seed"); q(PICK(v_count)); break;
    case 19: ARG(" --out"); q(tt_chance(60) ? f_ckdir : path_any()); break;
    case 20: ARG(" --checkpoint-dir"); q(tt_chance(50) ? f_ckdir : path_any()); break;
    case 21: ARG(" --checkpoint-every"); q(PICK(v_small)); break;
    case 22: ARG(" --keep"); q(PICK(v_small)); break;
    default: ARG(" %s", PICK(((const char *[]){"--resume", "--nesterov", "--json", "--bogus", "-h", "--", "x"})));
    }
  }
}

/* One random command line for a subcommand. */
static void random_line(void) {
  const char *bin = tt_bin();
  line[0] = '\0';
  switch (tt_rnd(6)) {
  case 0: case 1: /* train: a tiny valid base the random flags change */
    ARG("%s train --data '%s' --model 'in=1x8x8,linear:8,relu,linear:4' --batch 8 --max-steps 3 --progress off --out '%s/o'", bin,
        small_data, dir);
    train_flags();
    break;
  case 2: /* eval */
    ARG("%s eval", bin);
    for (int i = 0, n = 1 + (int)tt_rnd(4); i < n; i++) {
      switch (tt_rnd(6)) {
      case 0: case 1: ARG(" --model-file"); q(tt_chance(50) ? f_model : path_any()); break;
      case 2: ARG(" --data"); q(tt_chance(60) ? small_data : path_any()); break;
      case 3: ARG(" --batch"); q(PICK(v_count)); break;
      case 4: ARG(" --threads"); q(PICK(v_small)); break;
      default: ARG(" %s", PICK(((const char *[]){"--json", "--bogus", "--model-file"}))); break;
      }
    }
    break;
  case 3: { /* run: launcher flags, then a tiny training job */
    ARG("%s run", bin);
    ARG(" -n"); q(tt_chance(70) ? PICK(((const char *[]){"1", "2", "3"})) : PICK(v_small));
    for (int i = 0, n = (int)tt_rnd(4); i < n; i++) {
      switch (tt_rnd(12)) {
      case 0: ARG(" --nnodes"); q(PICK(v_small)); break;
      case 1: ARG(" --node-rank"); q(PICK(v_small)); break;
      case 2: ARG(" --master"); q(PICK(((const char *[]){"127.0.0.1:0", "abc", ":", "127.0.0.1:99999", "[::1]:x", ""}))); break;
      case 3: ARG(" --output"); q(PICK(((const char *[]){"rank0", "prefix", "xyz", ""}))); break;
      case 4: ARG(" --kill-after"); q(PICK(v_float)); break;
      case 5: ARG(" --timeout"); q(PICK(((const char *[]){"0.5", "2", "0", "-1", "abc", "nan", "1e309"}))); break;
      case 6: ARG(" --tail"); q(PICK(v_count)); break;
      case 7: ARG(" --max-restarts"); q(PICK(v_small)); break;
      case 8: ARG(" --min-nodes"); q(PICK(v_small)); break;
      case 9: ARG(" --fault-timeout"); q(PICK(v_float)); break;
      case 10: ARG(" --inject-fault"); q(PICK(v_fault)); break;
      default: ARG(" %s", PICK(((const char *[]){"--raw-stdout", "--bogus", "--max-nodes 1"}))); break;
      }
    }
    ARG(" -- %s train --data '%s' --model 'in=1x8x8,linear:8,relu,linear:4' --batch 8 --max-steps 3 --progress off --out '%s/o'",
        bin, small_data, dir);
    if (tt_chance(30))
      train_flags();
    break;
  }
  case 4: /* inspect */
    ARG("%s inspect", bin);
    for (int i = 0, n = (int)tt_rnd(3); i < n; i++)
      q(path_any());
    break;
  default: /* bench, small sizes */
    ARG("%s bench %s", bin, PICK(((const char *[]){"allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall",
                                                  "gather", ""})));
    ARG(" -n"); q(tt_chance(80) ? PICK(((const char *[]){"1", "2", "3"})) : PICK(v_small));
    for (int i = 0, n = (int)tt_rnd(5); i < n; i++) {
      switch (tt_rnd(10)) {
      case 0: ARG(" --transport"); q(PICK(((const char *[]){"shm", "tcp", "mpi", "udp", ""}))); break;
      case 1: ARG(" --algo"); q(PICK(((const char *[]){"ring", "rd", "rhd", "shm", "flat", "bruck", "tree", "x"}))); break;
      case 2: ARG(" --sizes"); q(PICK(((const char *[]){"8:64K", "4:4", "64K:8", "0:8", "8", ":", "1Y:2Y", "-8:64", "abc", "3:17"}))); break;
      case 3: ARG(" --iters"); q(PICK(v_small)); break;
      case 4: ARG(" --warmup"); q(PICK(v_small)); break;
      case 5: ARG(" --dtype"); q(PICK(((const char *[]){"f32", "f64", "f16", "bf16", "i32", "i64", "u8", "f8", ""}))); break;
      case 6: ARG(" --op"); q(PICK(((const char *[]){"sum", "prod", "min", "max", "avg", "xor", ""}))); break;
      case 7: ARG(" --timeout"); q(PICK(((const char *[]){"5", "0", "-1", "abc"}))); break;
      default: ARG(" %s", PICK(((const char *[]){"--window", "--fresh", "--hugepages", "--json", "--bogus"}))); break;
      }
    }
    if (!strstr(line, "--sizes"))
      ARG(" --sizes 8:4K");
    if (!strstr(line, "--iters"))
      ARG(" --iters 3 --warmup 1");
    break;
  }
  if (tt_chance(8)) /* a flag with its value missing at the very end */
    ARG(" %s", PICK(((const char *[]){"--batch", "--model", "-n", "--data", "--sizes", "--lr"})));
}

static int check(unsigned seed, const tt_result *r) {
  const char *why = NULL;
  /* dtrain run passes on the first failing worker's status (an injected fault's), named */
  int worker = strstr(line, " run ") && strstr(r->err, "dtrain run: rank ") && strstr(r->err, " failed first: ");
  if (r->code == 124 && !(strstr(line, " run ") && strstr(r->err, "dtrain run: --timeout")))
    why = "did not end within its deadline";
  else if (r->code > 2 && r->code != 124 && !worker)
    why = r->code >= 128 ? "died of a signal" : "exit code other than 0, 1 or 2";
  else if (strstr(r->err, "AddressSanitizer") || strstr(r->err, "LeakSanitizer") || strstr(r->err, "runtime error:") ||
           strstr(r->err, "ThreadSanitizer"))
    why = "a sanitizer report";
  else if (r->code != 0 && !strstr(r->err, "dtrain"))
    why = "failed without saying why";
  if (!why)
    return 1;
  fprintf(stderr, "case seed %u: %s (exit %d)\n  $ %s\n%s\n", seed, why, r->code, line, r->err);
  return 0;
}

static void make_files(void) {
  snprintf(data, sizeof data, "%s/data", dir);
  snprintf(small_data, sizeof small_data, "%s/small", dir);
  CHECK(mkdir(data, 0777) == 0 && mkdir(small_data, 0777) == 0, "mkdir");
  tt_make_dataset(data, 203, 50);
  tt_make_dataset(small_data, 37, 7);
  /* a model and a checkpoint directory from one real run */
  snprintf(f_ckdir, sizeof f_ckdir, "%s/ck", dir);
  tt_result r = tt_run(dir, 120, "%s train --data %s --model 'in=1x8x8,linear:8,relu,linear:4' --batch 8 --max-steps 4 "
                       "--checkpoint-dir %s --checkpoint-every 2 --progress off --out %s/m",
                       tt_bin(), small_data, f_ckdir, dir);
  CHECK(r.code == 0, "first run: %s", r.err);
  tt_result_free(&r);
  snprintf(f_model, sizeof f_model, "%s/m/model.safetensors", dir);
  snprintf(f_ckpt, sizeof f_ckpt, "%s/ckpt-000000004.dtc", f_ckdir);
  /* a damaged copy of the model: its header cut in half */
  snprintf(f_bad, sizeof f_bad, "%s/bad.safetensors", dir);
  char *m = tt_slurp(f_model);
  FILE *f = fopen(f_bad, "wb");
  CHECK(f, "create %s", f_bad);
  fwrite(m, 1, 40, f);
  fclose(f);
  free(m);
  snprintf(f_empty, sizeof f_empty, "%s/empty", dir);
  snprintf(f_text, sizeof f_text, "%s/text.dtc", dir);
  CHECK((f = fopen(f_empty, "w")) && fclose(f) == 0, "create %s", f_empty);
  CHECK((f = fopen(f_text, "w")) && fputs("not a checkpoint\n", f) >= 0 && fclose(f) == 0, "create %s", f_text);
  snprintf(f_none, sizeof f_none, "%s/x", f_empty);
  snprintf(f_fifo, sizeof f_fifo, "%s/fifo", dir);
  CHECK(mkfifo(f_fifo, 0600) == 0, "mkfifo %s", f_fifo);
}

int main(int argc, char **argv) {
  int cases = argc > 1 ? atoi(argv[1]) : 100;
  unsigned seed = argc > 2 ? (unsigned)strtoul(argv[2], NULL, 10) : 1;
  tt_scratch(dir, sizeof dir, "clirand");
  make_files();
  setenv("DTRAIN_TIMEOUT_MS", "5000", 1); /* a job that can never form gives up within seconds */
  int bad = 0, codes[3] = {0, 0, 0};
  for (int i = 0; i < cases; i++) {
    tt_seed(seed + (unsigned)i);
    random_line();
    tt_result r = tt_run(dir, 60, "%s", line);
    if (r.code >= 0 && r.code <= 2)
      codes[r.code]++;
    bad += !check(seed + (unsigned)i, &r);
    tt_result_free(&r);
  }
  fprintf(stderr, "%d of %d command lines misbehaved (exit 0: %d, 1: %d, 2: %d)\n", bad, cases, codes[0], codes[1],
          codes[2]);
  if (!bad)
    tt_rmrf(dir);
  return bad ? 1 : 0;
}
