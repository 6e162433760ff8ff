/* test_train_zero.c - ZeRO-1 (`dtrain train --zero 1`: sharded optimizer state) under `dtrain
 * run -n N` with real processes, on a tiny IDX set the test writes. One group per process:
 *   equiv   --zero 1 on 1, 2, 3 and 4 workers ends with the parameters of --zero 0 on as many
 *           workers (max|a-b| / max|b| <= 1e-5; 1 worker: identical), with the same per-step
 *           losses, for SGD with momentum and for AdamW, with --clip small enough to clip
 *           (checked: without it the parameters end elsewhere), several buckets and a tail
 *           (TINY_MODEL has 2212 parameters: never a multiple of 16 x workers), and for a conv
 *           net on 3 workers, with --accumulate 3, and with short last batches that leave two
 *           of 4 workers without a sample; the metrics' allreduce_bytes count the reduce-scatter's and the
 *           allgather's buffers (twice the gradient) and busbw_gbps stays positive
 *   resume  AdamW + clip, 2 workers: a --zero 1 run resumed from its step-12 checkpoint repeats
 *           the uninterrupted --zero 1 run's losses and parameters exactly; its checkpoint holds
 *           the same sections and meta as a --zero 0 run's (dtrain inspect prints the same,
 *           checksums aside) with the same state within 1e-5; resuming it with --zero 0, and
 *           on 4 workers, and resuming a --zero 0 checkpoint with --zero 1, match the
 *           uninterrupted run within 1e-5
 *   errors  --zero 2 and --zero x are usage errors naming the allowed values (exit 2); a job
 *           whose rank 1 has --zero 1 and the others --zero 0 stops with an error naming rank 1
 *           and --zero (exit 2) */
#include "train_test.h"

static char dir[1024], data[2048];

#define COMMON "--model '" TINY_MODEL "' --batch 30 --threads 1 --log-interval 1 --eval-batch 50 " \
               "--bucket-size 256"
#define SGD "--optimizer sgd --lr 0.1 --momentum 0.9 --clip 0.5"
#define ADAMW "--optimizer adamw --lr 0.01 --clip 0.5"

static void train_n(int n, const char *extra, const char *out) { tt_train_n(dir, data, COMMON, n, extra, out); }
static double model_diff(const char *a, const char *b) { return tt_runs_model_diff(dir, a, b); }
static void losses(const char *run, double *l, int cap) { tt_run_losses(dir, run, l, cap); }

static void check_losses(const char *a, const char *b, int from, int to, double tol) {
  double la[64], lb[64];
  losses(a, la, 64);
  losses(b, lb, 64);
  for (int s = from; s <= to; s++) {
    CHECK(!isnan(la[s]) && !isnan(lb[s]), "%s / %s: no loss at step %d", a, b, s);
    if (tol == 0)
      CHECK(la[s] == lb[s], "%s vs %s, step %d: %.9g != %.9g", a, b, s, la[s], lb[s]);
    else
      CHECK(fabs(la[s] - lb[s]) <= tol * fabs(lb[s]) + 1e-7, "%s vs %s, step %d: %.9g vs %.9g", a,
            b, s, la[s], lb[s]);
  }
}

/* allreduce_bytes of the first step line of a run's metrics, and whether every step line has
 * a positive busbw_gbps. */
static double metrics_bytes(const char *run, int *busbw_ok) {
  char p[4096];
  snprintf(p, sizeof p, "%s/%s/metrics.jsonl", dir, run);
  char *s = tt_slurp(p);
  double bytes = NAN;
  int steps = 0;
  *busbw_ok = 1;
  for (char *line = strtok(s, "\n"); line; line = strtok(NULL, "\n")) {
    if (!strstr(line, "\"type\":\"step\""))
      continue;
    if (steps++ == 0)
      bytes = tt_json_num(line, "allreduce_bytes");
    if (!(tt_json_num(line, "busbw_gbps") > 0))
      *busbw_ok = 0;
  }
  free(s);
  CHECK(steps > 0, "%s: no step lines in the metrics", run);
  return bytes;
}

static void equiv_opt(const char *opt, const char *tag) {
  char extra[1024], a[64], b[64];
  int ns[] = {1, 2, 4};
  for (int i = 0; i < 3; i++) {
    snprintf(a, sizeof a, "%s_z0_w%d", tag, ns[i]);
    snprintf(b, sizeof b, "%s_z1_w%d", tag, ns[i]);
    snprintf(extra, sizeof extra, "%s --epochs 2 --max-steps 25 --zero 0", opt);
    train_n(ns[i], extra, a);
    snprintf(extra, sizeof extra, "%s --epochs 2 --max-steps 25 --zero 1", opt);
    train_n(ns[i], extra, b);
    double d = model_diff(b, a);
    fprintf(stderr, "%s, %d worker(s): --zero 1 vs --zero 0 parameter rel diff %.3g\n", tag, ns[i], d);
    if (ns[i] == 1)
      CHECK(d == 0, "%s: --zero 1 on one worker changed the result (%g)", tag, d);
    else
      CHECK(d <= 1e-5, "%s, %d workers: --zero 1 ends with different parameters: rel diff %g", tag,
            ns[i], d);
    check_losses(b, a, 1, 25, ns[i] == 1 ? 0 : 1e-5);
    if (i > 0) { /* and the world sizes agree with each other, as without ZeRO */
      char w1[64];
      snprintf(w1, sizeof w1, "%s_z1_w1", tag);
      d = model_diff(b, w1);
      CHECK(d <= 1e-5, "%s: --zero 1 on %d workers vs 1 worker: rel diff %g", tag, ns[i], d);
    }
  }
  /* the metrics count both collectives: the reduce-scatter's and the allgather's buffers */
  int ok0, ok1;
  snprintf(a, sizeof a, "%s_z0_w2", tag);
  snprintf(b, sizeof b, "%s_z1_w2", tag);
  double b0 = metrics_bytes(a, &ok0), b1 = metrics_bytes(b, &ok1);
  CHECK(b0 == 2212.0 * 4 && b1 == 2 * b0, "allreduce_bytes %g (--zero 0), %g (--zero 1): want %g and %g",
        b0, b1, 2212.0 * 4, 2212.0 * 8);
  CHECK(ok0 && ok1, "a step line without a positive busbw_gbps (--zero 0: %d, --zero 1: %d)", ok0, ok1);
  /* --clip 0.5 really clips here: without it the run ends elsewhere */
  char noclip[1024];
  snprintf(noclip, sizeof noclip, "%s --clip 0 --epochs 2 --max-steps 25 --zero 1", opt);
  snprintf(a, sizeof a, "%s_noclip", tag);
  train_n(2, noclip, a);
  snprintf(b, sizeof b, "%s_z1_w2", tag);
  double d = model_diff(a, b);
  CHECK(d > 1e-3, "%s: --clip 0.5 changed nothing (rel diff %g): the test does not test clipping", tag, d);
}

static void group_equiv(void) {
  equiv_opt(SGD, "sgd");
  equiv_opt(ADAMW, "adamw");
  /* accumulation, and short last batches that leave ranks 2 and 3 of 4 without a sample (600 =
   * 598 + 2): their hook never starts a bucket, finish_block_sums starts them all */
  train_n(2, SGD " --epochs 2 --max-steps 25 --accumulate 3 --zero 0", "acc0");
  train_n(2, SGD " --epochs 2 --max-steps 25 --accumulate 3 --zero 1", "acc1");
  double da = model_diff("acc1", "acc0");
  CHECK(da <= 1e-5, "--accumulate 3 on 2 workers: --zero 1 differs from --zero 0 by %g", da);
  train_n(4, ADAMW " --epochs 2 --batch 598 --accumulate 3 --eval-batch 1000 --zero 0", "e0");
  train_n(4, ADAMW " --epochs 2 --batch 598 --accumulate 3 --eval-batch 1000 --zero 1", "e1");
  da = model_diff("e1", "e0");
  fprintf(stderr, "empty shards, 4 workers: --zero 1 vs --zero 0 rel diff %.3g\n", da);
  CHECK(da <= 1e-5, "empty shards on 4 workers: --zero 1 differs from --zero 0 by %g", da);
  /* a conv net (conv and layernorm layers, 3 workers: blocks of 16 x 3 floats) */
  const char *conv = ADAMW " --epochs 2 --max-steps 25 --model 'in=1x8x8,conv3x3:4:p1,relu,maxpool2,"
                     "flatten,layernorm,linear:16,gelu,linear:4'";
  char extra[1024];
  snprintf(extra, sizeof extra, "%s --zero 0", conv);
  train_n(3, extra, "c0");
  snprintf(extra, sizeof extra, "%s --zero 1", conv);
  train_n(3, extra, "c1");
  double d = model_diff("c1", "c0");
  fprintf(stderr, "conv net, 3 workers: --zero 1 vs --zero 0 rel diff %.3g\n", d);
  CHECK(d <= 1e-5, "conv net on 3 workers: --zero 1 differs from --zero 0: %g", d);
  check_losses("c1", "c0", 1, 25, 1e-5);
}

/* `dtrain inspect` of a checkpoint without its path and checksums. */
static char *inspect_shape(const char *file) {
  tt_result r = tt_run(dir, 60, "%s inspect %s", tt_bin(), file);
  CHECK(r.code == 0, "inspect %s: exit %d: %s", file, r.code, r.err);
  char *o = r.out, *w = o;
  const char *p = o;
  const char *colon = strstr(p, ": dtrain checkpoint");
  CHECK(colon, "inspect output: %s", o);
  p = colon;
  while (*p) {
    const char *crc = strstr(p, "crc32c 0x");
    if (!crc) {
      memmove(w, p, strlen(p) + 1);
      w += strlen(w);
      break;
    }
    memmove(w, p, (size_t)(crc - p));
    w += crc - p;
    p = crc + 17; /* "crc32c 0x" + 8 hex digits */
  }
  *w = '\0';
  free(r.err);
  return o;
}

/* max |a-b| / max |b| over section `name` of two checkpoint files */
static double section_diff(const char *fa, const char *fb, const char *name) {
  dt_ckpt *a, *b;
  CHECK(dt_ckpt_open(fa, &a) == DT_OK, "open %s: %s", fa, dt_last_error());
  CHECK(dt_ckpt_open(fb, &b) == DT_OK, "open %s: %s", fb, dt_last_error());
  const dt_ckpt_section *sa = dt_ckpt_find(a, name), *sb = dt_ckpt_find(b, name);
  CHECK(sa && sb && sa->nbytes == sb->nbytes, "section %s missing or of another size", name);
  double md = 0, mb = 0;
  for (size_t i = 0; i < sa->nbytes / 4; i++) {
    float x, y;
    memcpy(&x, (const char *)sa->data + 4 * i, 4);
    memcpy(&y, (const char *)sb->data + 4 * i, 4);
    md = fmax(md, fabs((double)x - y));
    mb = fmax(mb, fabs((double)y));
  }
  dt_ckpt_destroy(a);
  dt_ckpt_destroy(b);
  return mb > 0 ? md / mb : md;
}

static void copy_dir(const char *from, const char *to) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "rm -rf '%s/%s' && cp -r '%s/%s' '%s/%s'", dir, to, dir, from, dir, to);
  CHECK(system(cmd) == 0, "copy %s to %s", from, to);
}

/* Resumes a copy of checkpoint directory `src` (as `ck`; NULL: src itself) on n workers with
 * --zero `zero` into run `out`, which must continue after step 12 and match run `ref` from step
 * 13 on: exactly when tol is 0, else losses and parameters within tol. */
static void resume_matches(int n, const char *src, const char *ck, int zero, const char *out,
                           const char *ref, double tol, const char *what) {
  if (ck)
    copy_dir(src, ck);
  char extra[4096];
  snprintf(extra, sizeof extra, ADAMW " --epochs 2 --checkpoint-dir %s/%s --resume --zero %d", dir,
           ck ? ck : src, zero);
  train_n(n, extra, out);
  double l[64];
  losses(out, l, 64);
  CHECK(isnan(l[12]) && !isnan(l[13]), "%s should resume after step 12", out);
  check_losses(out, ref, 13, 40, tol);
  double d = model_diff(out, ref);
  CHECK(tol == 0 ? d == 0 : d <= tol, "%s: parameters differ from %s by %g", what, ref, d);
}

static void group_resume(void) {
  char extra[4096];
  /* uninterrupted: 2 epochs = 40 steps on 2 workers */
  train_n(2, ADAMW " --epochs 2 --zero 1", "full1");
  train_n(2, ADAMW " --epochs 2 --zero 0", "full0");
  snprintf(extra, sizeof extra, ADAMW " --epochs 2 --max-steps 12 --checkpoint-dir %s/ck1 --zero 1", dir);
  train_n(2, extra, "part1");
  snprintf(extra, sizeof extra, ADAMW " --epochs 2 --max-steps 12 --checkpoint-dir %s/ck0 --zero 0", dir);
  train_n(2, extra, "part0");

  /* the sharded run's checkpoint is an ordinary one */
  char f1[4096], f0[4096];
  snprintf(f1, sizeof f1, "%s/ck1/ckpt-%09d.dtc", dir, 12);
  snprintf(f0, sizeof f0, "%s/ck0/ckpt-%09d.dtc", dir, 12);
  char *s1 = inspect_shape(f1), *s0 = inspect_shape(f0);
  CHECK(!strcmp(s1, s0), "dtrain inspect differs:\n--zero 1:\n%s\n--zero 0:\n%s", s1, s0);
  CHECK(strstr(s1, "adam_m") && strstr(s1, "adam_v") && strstr(s1, "params"), "sections: %s", s1);
  free(s1);
  free(s0);
  const char *secs[] = {"params", "adam_m", "adam_v"};
  for (int i = 0; i < 3; i++) {
    double d = section_diff(f1, f0, secs[i]);
    fprintf(stderr, "checkpoint section %s: --zero 1 vs --zero 0 rel diff %.3g\n", secs[i], d);
    CHECK(d <= 1e-5, "section %s of the --zero 1 checkpoint differs from --zero 0's by %g", secs[i], d);
  }

  /* same world, same --zero: exactly the uninterrupted run */
  resume_matches(2, "ck1", "ck1a", 1, "r1_2", "full1", 0, "--zero 1 resumed on 2 workers");
  /* --zero 1 checkpoint resumed with --zero 0, and on 4 workers */
  resume_matches(2, "ck1", "ck1b", 0, "r0_2", "full1", 1e-5, "--zero 1 checkpoint resumed with --zero 0");
  resume_matches(4, "ck1", "ck1c", 1, "r1_4", "full1", 1e-5, "--zero 1 checkpoint resumed on 4 workers");
  /* a --zero 0 checkpoint resumed with --zero 1 (on 4 workers too) */
  resume_matches(2, "ck0", "ck0a", 1, "r01_2", "full0", 1e-5, "--zero 0 checkpoint resumed with --zero 1");
  resume_matches(4, "ck0", "ck0b", 1, "r01_4", "full0", 1e-5,
                 "--zero 0 checkpoint resumed with --zero 1 on 4 workers");
  /* and a checkpoint written by 4 sharded workers resumed on 2 */
  snprintf(extra, sizeof extra, ADAMW " --epochs 2 --max-steps 12 --checkpoint-dir %s/ck4 --zero 1", dir);
  train_n(4, extra, "part4");
  resume_matches(2, "ck4", NULL, 1, "r41_2", "full1", 1e-5, "4-worker --zero 1 checkpoint resumed on 2");
}

static void group_errors(void) {
  const char *bad[] = {"2", "x", "-1", "01"};
  for (int i = 0; i < 4; i++) {
    tt_result r = tt_run(dir, 60, "%s train --data %s --zero %s --max-steps 1 --out %s/bad", tt_bin(),
                         data, bad[i], dir);
    CHECK(r.code == 2, "--zero %s: exit %d, want 2: %s", bad[i], r.code, r.err);
    CHECK(strstr(r.err, "--zero") && strstr(r.err, "0 and 1") && strstr(r.err, bad[i]),
          "--zero %s: the error does not name the value and the allowed ones: %s", bad[i], r.err);
    tt_result_free(&r);
  }
  char script[4096];
  snprintf(script, sizeof script, "%s/worker.sh", dir);
  FILE *f = fopen(script, "w");
  CHECK(f, "create %s", script);
  fprintf(f, "#!/bin/sh\nz=0\nif [ \"$DTRAIN_RANK\" = 1 ]; then z=1; fi\n"
             "exec '%s' train --data '%s' " COMMON " " SGD " --max-steps 3 --zero $z --out '%s/mm'\n",
          tt_bin(), data, dir);
  fclose(f);
  chmod(script, 0755);
  tt_result r = tt_run(dir, 300, "%s run -n 3 -- %s", tt_bin(), script);
  CHECK(r.code == 2, "exit %d, want 2: %s", r.code, r.err);
  CHECK(strstr(r.err, "rank 1") && strstr(r.err, "--zero"), "error does not name rank 1 and --zero: %s", r.err);
  tt_result_free(&r);
}

int main(int argc, char **argv) {
  const char *g = argc > 1 ? argv[1] : "equiv";
  tt_scratch(dir, sizeof dir, g);
  snprintf(data, sizeof data, "%s/data", dir);
  mkdir(data, 0777);
  tt_make_dataset(data, 600, 200);
  if (!strcmp(g, "equiv"))
    group_equiv();
  else if (!strcmp(g, "resume"))
    group_resume();
  else if (!strcmp(g, "errors"))
    group_errors();
  else
    CHECK(0, "unknown group %s", g);
  tt_rmrf(dir);
  printf("ok %s\n", g);
  return 0;
}
