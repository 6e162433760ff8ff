/* test_train_dp.c - data-parallel `dtrain train` under `dtrain run -n N` (real processes, the real
 * rendezvous store and transport), on a tiny IDX set the test writes. One group per process:
 *   equiv     1, 2, 3 and 4 workers, same global batch (uneven shards with 3 and 4) and seed,
 *             end with the same parameters after K steps: max|a-b| / max|b| <= 1e-5; the
 *             logged losses (global means) agree too; also with accumulation, with short
 *             last batches that leave some ranks (and micro-batches) empty (also with a
 *             gradient bucket per layer, no ZeRO, over shm and tcp), and for a model
 *             with two dropout layers on 1, 2 and 4 workers and with --accumulate 2 (each
 *             sample's mask depends on its position in the global batch, not on the split)
 *   mismatch  rank 1 started with another --seed (through a wrapper script) -> every rank
 *             stops, the error names rank 1 and --seed, exit code 2, and dtrain run names rank 0
 *             first with that reason although rank 0's wrapper exits last
 *   resume    2 workers interrupted at step 12 and resumed on 2 workers repeat the
 *             uninterrupted 2-worker losses and parameters exactly; resumed on 1 and on 4
 *             workers they match within 1e-5; so does the dropout model resumed on 1 worker
 *             with --accumulate 2 and on 4 workers
 *   refuse    rank 0 refusing to resume (another --seed; only corrupt checkpoints) or to start
 *             (a fresh run into a directory with checkpoints) stops both workers within seconds
 *             at the default deadline, exit 2, rank 0 named first with its reason in the summary
 *             although its wrapper exits half a second after rank 1 (dtrain run waits for the
 *             rank the others say refused), and rank 1 saying rank 0 refused; a job restarted by
 *             --max-restarts after a kill takes the checkpoint directory's lock again and finishes
 *   kill      a 2-worker job whose rank 1 is SIGKILLed at step 130 resumes from the step-100
 *             checkpoint and repeats the uninterrupted losses and parameters exactly
 *   bind      2 workers whose compute threads fit the CPUs are pinned to their shares of them
 *             by default (DTRAIN_BIND=auto, comm/bind.c's debug line from both ranks); not with
 *             DTRAIN_BIND=none, nor when their threads would not fit
 *   window    the default (gradients in the shared window, sharded optimizer, one copy of the
 *             parameters per host that every rank updates its blocks of) against private buffers
 *             (DTRAIN_WINDOW=0) with --zero 0 and 1, on 2 and 3 workers: the same parameters (2:
 *             bit for bit with dtrain's AVX-512 product, within 1e-6 with OpenBLAS's); every
 *             rank says it uses the one copy (not with --zero 0); a peer
 *             stopped at a step's start makes rank 0 fail within the deadline, naming the step's
 *             allreduce and rank 1, and one stopped before its update (at=update) the barrier that
 *             ends the step and rank 1, the failing rank named once; DTRAIN_WINDOW=2 is refused, naming it;
 *             the linear weight gradients deferred to the update (dt_model_defer_linear_grads,
 *             DTRAIN_DEFER=1; by default only with dtrain's own AVX-512 product, never with
 *             DTRAIN_GEMM=blas; not with --clip, --accumulate 2 or DTRAIN_DEFER=0) give the same
 *             parameters as summing them (as exactly as above), on 2 and 3 workers and on 2
 *             workers x 2 threads; DTRAIN_DEFER=2 is refused; with a /dev/shm too small for
 *             the window but not for the transport (a 24 MiB tmpfs in a mount namespace of its
 *             own; root only, else skipped with a note) the job warns that the gradients stay
 *             private and trains anyway; with one just large enough for the gradients of both
 *             workers and one copy of the parameters, the window fits; with one too small for
 *             the activation exports too, the window is made without them (one copy, weight
 *             gradients not deferred)
 *   straggler a rank made slow (the slow fault) on 2 workers (shm, one copy) and 3 (tcp, private
 *             buffers) is named by the summary's slowest_rank and compute_imbalance (and rank
 *             0's wait for it, comm_waiting_slowest_s, is counted), by one
 *             warning from rank 0 (also with --progress off, and with --log-interval 1, where the
 *             warning compares a window of intervals), and by the metrics; with uneven shards (30
 *             samples on 4 workers) it is reported but not warned about; one worker reports no
 *             spread; a second straggler is warned about within the first one's quiet time; a
 *             run resumed at its last step names no slowest rank */
#include <sched.h>
#include <time.h>

#include "nn/nn.h" /* dt__nn_gemm_name: which product the workers run */
#include "train_test.h"

static char dir[1024], data[2048];

#define COMMON "--model '" TINY_MODEL "' --batch 30 --optimizer sgd --lr 0.1 --momentum 0.9 " \
               "--threads 1 --log-interval 1 --eval-batch 50"

/* dropout in two layers of different widths, with uneven shards on 4 workers (30 = 8+8+7+7) */
#define DROP_MODEL "in=1x8x8,linear:32,relu,dropout:0.3,linear:16,relu,dropout:0.2,linear:4"

/* Losses of steps [from, to] and the final parameters of run `name` against run `ref`, within
 * 1e-5 (relative). */
static void check_close(const char *name, const char *ref, int from, int to);

static void train_n(int n, const char *extra, const char *out) { tt_train_n(dir, data, COMMON, n, extra, out); }
static double model_diff(const char *a, const char *b) { return tt_runs_model_diff(dir, a, b); }
static void losses(const char *run, double *l, int cap) { tt_run_losses(dir, run, l, cap); }

static void group_equiv(void) {
  /* 600 samples / 30 = 20 steps per epoch; 25 steps cross an epoch boundary */
  int ns[] = {1, 2, 3, 4};
  char name[4][16];
  for (int i = 0; i < 4; i++) {
    snprintf(name[i], sizeof name[i], "w%d", ns[i]);
    train_n(ns[i], "--epochs 2 --max-steps 25", name[i]);
  }
  double l1[32], ln[32];
  losses("w1", l1, 32);
  for (int i = 1; i < 4; i++) {
    double d = model_diff(name[i], "w1");
    fprintf(stderr, "%d workers vs 1: parameter rel diff %.3g\n", ns[i], d);
    CHECK(d <= 1e-5, "%d workers end with different parameters: rel diff %g", ns[i], d);
    losses(name[i], ln, 32);
    for (int s = 1; s <= 25; s++)
      CHECK(fabs(ln[s] - l1[s]) <= 1e-5 * fabs(l1[s]) + 1e-7, "%d workers step %d: loss %.9g vs %.9g",
            ns[i], s, ln[s], l1[s]);
  }
  /* the runs trained: the loss fell */
  CHECK(l1[25] < 0.8 * l1[1], "loss did not fall: %g -> %g", l1[1], l1[25]);
  /* gradient accumulation inside data parallel: 2 workers x 3 micro-batches */
  train_n(2, "--epochs 2 --max-steps 25 --accumulate 3", "w2acc");
  double d = model_diff("w2acc", "w1");
  CHECK(d <= 1e-5, "2 workers with --accumulate 3 differ from 1 worker: %g", d);

  /* short last batches: 600 = 598 + 2, so in every epoch's second step ranks 2 and 3 of 4 get
   * no sample at all, and with 3 micro-batches even ranks 0 and 1 have an empty last one */
  train_n(1, "--epochs 2 --batch 598 --accumulate 3 --eval-batch 1000", "e1");
  train_n(4, "--epochs 2 --batch 598 --accumulate 3 --eval-batch 1000", "e4");
  d = model_diff("e4", "e1");
  fprintf(stderr, "short last batch, 4 workers vs 1: rel diff %.3g\n", d);
  CHECK(d <= 1e-5, "4 workers with empty shards differ from 1 worker: %g", d);
  /* a bucket per layer and the whole-gradient allreduce (no ZeRO), over shm and over tcp: a rank
   * with no sample (3 samples on 4 workers), or whose last micro-batch is empty while others'
   * are not (10 = 3+3+2+2 in 3 micro-batches), runs no backward there and so no gradient hook,
   * yet must call the same bucket allreduces as the others (they once ended where its hook had
   * not been: "rank 0 called allreduce #3 with 68 x f32 sum, rank 1 ... with 234 x f32 sum") */
  const char *few[] = {"--batch 3 --max-steps 6", "--batch 10 --accumulate 3 --max-steps 6"};
  for (int i = 0; i < 2; i++) {
    char ex[256];
    snprintf(ex, sizeof ex, "%s --bucket-size 64 --zero 0", few[i]);
    train_n(1, ex, "b1");
    train_n(4, ex, "b4");
    setenv("DTRAIN_TRANSPORT", "tcp", 1);
    train_n(4, ex, "b4t");
    unsetenv("DTRAIN_TRANSPORT");
    CHECK((d = model_diff("b4", "b1")) <= 1e-5, "%s, 4 workers over shm: rel diff %g", ex, d);
    CHECK((d = model_diff("b4t", "b1")) <= 1e-5, "%s, 4 workers over tcp: rel diff %g", ex, d);
  }

  /* a conv net (conv, pool, layernorm layers report their gradients through the hook too) */
  const char *conv = "--epochs 2 --max-steps 25 --model 'in=1x8x8,conv3x3:4:p1,relu,maxpool2,"
                     "flatten,layernorm,linear:16,gelu,linear:4' --bucket-size 256";
  char extra[1024];
  snprintf(extra, sizeof extra, "%s", conv);
  train_n(1, extra, "c1");
  train_n(3, extra, "c3");
  d = model_diff("c3", "c1");
  fprintf(stderr, "conv net, 3 workers vs 1: rel diff %.3g\n", d);
  CHECK(d <= 1e-5, "conv net on 3 workers differs from 1 worker: %g", d);

  /* dropout: the same masks whatever the number of workers and micro-batches */
  const char *drop = "--epochs 2 --max-steps 25 --model '" DROP_MODEL "'";
  train_n(1, drop, "d1");
  train_n(2, drop, "d2");
  train_n(4, drop, "d4");
  snprintf(extra, sizeof extra, "%s --accumulate 2", drop);
  train_n(1, extra, "d1acc");
  train_n(2, extra, "d2acc");
  check_close("d2", "d1", 1, 25);
  check_close("d4", "d1", 1, 25);
  check_close("d1acc", "d1", 1, 25);
  check_close("d2acc", "d1", 1, 25);
  /* the dropout model trained */
  double l1d[32];
  losses("d1", l1d, 32);
  CHECK(l1d[25] < 0.9 * l1d[1], "dropout model: loss did not fall: %g -> %g", l1d[1], l1d[25]);
}

static void check_close(const char *name, const char *ref, int from, int to) {
  double a[64], b[64];
  losses(name, a, 64);
  losses(ref, b, 64);
  for (int s = from; s <= to; s++)
    CHECK(fabs(a[s] - b[s]) <= 1e-5 * fabs(b[s]) + 1e-7, "%s vs %s, step %d: loss %.9g vs %.9g",
          name, ref, s, a[s], b[s]);
  double d = model_diff(name, ref);
  fprintf(stderr, "%s vs %s: parameter rel diff %.3g\n", name, ref, d);
  CHECK(d <= 1e-5, "%s ends with other parameters than %s: rel diff %g", name, ref, d);
}

static void group_mismatch(void) {
  char script[4096];
  snprintf(script, sizeof script, "%s/worker.sh", dir);
  FILE *f = fopen(script, "w");
  CHECK(f, "create %s", script);
  /* rank 0's wrapper exits last: every rank reaches the verdict, yet rank 0 is named */
  fprintf(f, "#!/bin/sh\nseed=42\nif [ \"$DTRAIN_RANK\" = 1 ]; then seed=7; fi\n"
             "'%s' train --data '%s' " COMMON " --max-steps 3 --seed $seed --out '%s/mm'\n"
             "c=$?; [ \"$DTRAIN_RANK\" != 0 ] || sleep 0.5; exit $c\n",
          tt_bin(), data, dir);
  fclose(f);
  chmod(script, 0755);
  tt_result r = tt_run(dir, 300, "%s run -n 3 -- %s", tt_bin(), script);
  CHECK(r.code == 2, "exit %d, want 2: %s", r.code, r.err);
  CHECK(strstr(r.err, "rank 1") && strstr(r.err, "--seed") && strstr(r.err, "7") && strstr(r.err, "42"),
        "error does not name rank 1 and --seed 7 vs 42: %s", r.err);
  const char *sum = strstr(r.err, "dtrain run: rank 0 failed first: exit code 2");
  CHECK(sum && strstr(sum, "rank 1 was started with a different --seed: 7 on rank 1, 42 on rank 0"),
        "rank 0 not named first with its reason: %s", r.err);
  CHECK(strstr(r.err, "rank 2: rank 0 refused to start: rank 1 was started with a different --seed"),
        "rank 2 does not say rank 0 refused: %s", r.err);
  tt_result_free(&r);

  /* a different dataset size on rank 2 */
  char data2[4096];
  snprintf(data2, sizeof data2, "%s/data2", dir);
  mkdir(data2, 0777);
  tt_make_dataset(data2, 590, 200);
  f = fopen(script, "w");
  CHECK(f, "create %s", script);
  fprintf(f, "#!/bin/sh\nd='%s'\nif [ \"$DTRAIN_RANK\" = 2 ]; then d='%s'; fi\n"
             "exec '%s' train --data \"$d\" " COMMON " --max-steps 3 --out '%s/mm'\n",
          data, data2, tt_bin(), dir);
  fclose(f);
  r = tt_run(dir, 300, "%s run -n 3 -- %s", tt_bin(), script);
  CHECK(r.code == 2, "exit %d, want 2: %s", r.code, r.err);
  CHECK(strstr(r.err, "rank 2") && strstr(r.err, "training set size"), "error: %s", r.err);
  tt_result_free(&r);

  /* the same sizes but other samples on rank 2 (another copy of the files, changed) */
  tt_make_split(data2, "train", 600, 7);
  r = tt_run(dir, 300, "%s run -n 3 -- %s", tt_bin(), script);
  CHECK(r.code == 2 && strstr(r.err, "rank 2 was started with a different training set (CRC32C"),
        "other training data: exit %d: %s", r.code, r.err);
  tt_result_free(&r);

  /* a different schedule on rank 1: the message shows both, not their hashes */
  f = fopen(script, "w");
  CHECK(f, "create %s", script);
  fprintf(f, "#!/bin/sh\ns=constant\nif [ \"$DTRAIN_RANK\" = 1 ]; then s=cosine:2; fi\n"
             "exec '%s' train --data '%s' " COMMON " --max-steps 3 --schedule $s --out '%s/mm'\n",
          tt_bin(), data, dir);
  fclose(f);
  r = tt_run(dir, 300, "%s run -n 2 -- %s", tt_bin(), script);
  CHECK(r.code == 2 && strstr(r.err, "different --schedule: 'cosine:2' on rank 1, 'constant' on rank 0"),
        "schedule mismatch: exit %d: %s", r.code, r.err);
  tt_result_free(&r);
}

static void group_resume(void) {
  /* uninterrupted: 2 epochs = 40 steps on 2 workers */
  train_n(2, "--epochs 2", "full");
  char extra[8192];
  snprintf(extra, sizeof extra, "--epochs 2 --max-steps 12 --checkpoint-dir %s/ck --checkpoint-every 6", dir);
  train_n(2, extra, "part");
  /* copy the checkpoints so that each resumed run starts from the same step-12 state */
  char cmd[16384];
  for (int i = 0; i < 3; i++) {
    snprintf(cmd, sizeof cmd, "cp -r %s/ck %s/ck%d", dir, dir, i);
    CHECK(system(cmd) == 0, "copy checkpoints");
  }
  double full[64], res[64];
  losses("full", full, 64);
  int ns[] = {2, 1, 4};
  for (int i = 0; i < 3; i++) {
    char out[32];
    snprintf(out, sizeof out, "res%d", ns[i]);
    snprintf(extra, sizeof extra, "--epochs 2 --checkpoint-dir %s/ck%d --resume", dir, i);
    train_n(ns[i], extra, out);
    losses(out, res, 64);
    double d = model_diff(out, "full");
    fprintf(stderr, "resumed on %d workers: parameter rel diff %.3g\n", ns[i], d);
    for (int s = 13; s <= 40; s++) {
      if (ns[i] == 2)
        CHECK(res[s] == full[s], "same world size, step %d: %.9g != %.9g", s, res[s], full[s]);
      else
        CHECK(fabs(res[s] - full[s]) <= 1e-5 * fabs(full[s]) + 1e-7, "%d workers, step %d: %.9g vs %.9g",
              ns[i], s, res[s], full[s]);
    }
    CHECK(isnan(res[12]), "resumed run should start after step 12");
    if (ns[i] == 2)
      CHECK(d == 0, "same world size: parameters differ (%g)", d);
    else
      CHECK(d <= 1e-5, "%d workers: parameters differ by %g", ns[i], d);
  }

  /* dropout: a 2-worker checkpoint resumed on 1 worker with 2 micro-batches, and on 4 workers */
  const char *drop = "--epochs 2 --model '" DROP_MODEL "'";
  snprintf(extra, sizeof extra, "%s", drop);
  train_n(2, extra, "dfull");
  snprintf(extra, sizeof extra, "%s --max-steps 12 --checkpoint-dir %s/dck --checkpoint-every 6", drop, dir);
  train_n(2, extra, "dpart");
  snprintf(cmd, sizeof cmd, "cp -r %s/dck %s/dck1", dir, dir);
  CHECK(system(cmd) == 0, "copy checkpoints");
  snprintf(extra, sizeof extra, "%s --accumulate 2 --checkpoint-dir %s/dck --resume", drop, dir);
  train_n(1, extra, "dres1");
  snprintf(extra, sizeof extra, "%s --checkpoint-dir %s/dck1 --resume", drop, dir);
  train_n(4, extra, "dres4");
  for (int i = 0; i < 2; i++) {
    const char *out = i ? "dres4" : "dres1";
    losses(out, res, 64);
    CHECK(isnan(res[12]) && !isnan(res[13]), "%s should start after step 12", out);
    check_close(out, "dfull", 13, 40);
  }
}

/* Runs a 2-worker job with `flags`, expecting rank 0's refusal: exit 2 within seconds (the
 * collective deadline stays at its default 300 s), rank 0 named first with `why` in the
 * summary. Rank 0 runs in a wrapper that exits half a second after it, so rank 1's exit is
 * the first dtrain run sees (--kill-after 60: not ended by the grace period either). */
static void expect_refusal(const char *flags, const char *why) {
  int64_t t0 = (int64_t)time(NULL);
  tt_result r = tt_run(dir, 120, "%s run -n 2 --kill-after 60 -- sh -c '\"$@\"; c=$?; "
                       "[ \"$DTRAIN_RANK\" != 0 ] || sleep 0.5; exit $c' sh %s train --data %s " COMMON " %s",
                       tt_bin(), tt_bin(), data, flags);
  int64_t took = (int64_t)time(NULL) - t0;
  CHECK(r.code == 2, "%s: exit %d, want 2: %s", why, r.code, r.err);
  CHECK(took < 30, "%s: took %lld s", why, (long long)took);
  const char *sum = strstr(r.err, "dtrain run: rank 0 failed first: exit code 2");
  CHECK(sum, "%s: rank 0 not named first: %s", why, r.err);
  CHECK(sum && strstr(sum, why), "%s: reason not in the summary: %s", why, r.err);
  CHECK(!strstr(r.err, "dataset-fashion-mnist"), "%s: dataset hint: %s", why, r.err);
  tt_result_free(&r);
}

static void group_refuse(void) {
  char flags[8192];
  snprintf(flags, sizeof flags, "--max-steps 6 --checkpoint-every 3 --checkpoint-dir %s/ck --out %s/a", dir, dir);
  train_n(2, flags, "a");
  snprintf(flags, sizeof flags, "--max-steps 9 --seed 7 --checkpoint-dir %s/ck --resume --out %s/b", dir, dir);
  expect_refusal(flags, "was written with --seed 42, this run has 7");
  snprintf(flags, sizeof flags, "--max-steps 9 --checkpoint-dir %s/ck --out %s/b", dir, dir);
  expect_refusal(flags, "holds checkpoints of an earlier run");
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "for f in %s/ck/ckpt-*.dtc; do printf garbage > $f; done", dir);
  CHECK(system(cmd) == 0, "corrupt checkpoints");
  snprintf(flags, sizeof flags, "--max-steps 9 --checkpoint-dir %s/ck --resume --out %s/b", dir, dir);
  expect_refusal(flags, "no valid checkpoint in");
  /* rank 1 says why it stopped (rank 0 exits half a second late, as above: dtrain run stops the
   * others when the first rank fails, and a rank 1 slow to start, as under TSan, would be
   * stopped before it has read rank 0's verdict) */
  tt_result r = tt_run(dir, 120, "%s run -n 2 --output prefix -- sh -c '\"$@\"; c=$?; "
                       "[ \"$DTRAIN_RANK\" != 0 ] || sleep 0.5; exit $c' sh %s train --data %s " COMMON
                       " --max-steps 9 --checkpoint-dir %s/ck --resume --out %s/b",
                       tt_bin(), tt_bin(), data, dir, dir);
  CHECK(r.code == 2 && strstr(r.err, "rank 1: rank 0 refused to resume: no valid checkpoint in"),
        "exit %d: %s", r.code, r.err);
  tt_result_free(&r);

  /* restarts: the killed generation's lock dies with it */
  snprintf(cmd, sizeof cmd, "rm -rf %s/ck", dir);
  CHECK(system(cmd) == 0, "rm");
  r = tt_run(dir, 300, "%s run -n 2 --max-restarts 1 --inject-fault 'kill:rank=0,step=8' -- %s train --data %s "
             COMMON " --max-steps 12 --checkpoint-every 3 --checkpoint-dir %s/ck --resume --out %s/c --json",
             tt_bin(), tt_bin(), data, dir, dir);
  CHECK(r.code == 0, "restarted job: exit %d: %s", r.code, r.err);
  CHECK(!strstr(r.err, "in use by another job") && strstr(r.err, "1 restart"), "lock outlived its job: %s", r.err);
  tt_result_free(&r);
}

/* A job whose rank 1 crashes (SIGKILL, from dtrain run --inject-fault) at step 130 resumes from
 * its step-100 checkpoint and repeats the uninterrupted run's losses and parameters exactly. */
static void group_kill(void) {
  const char *flags = "--epochs 10 --checkpoint-every 50 --keep 2";
  train_n(2, "--epochs 10", "full");
  char ck[4096];
  snprintf(ck, sizeof ck, "--checkpoint-dir %s/ck", dir);
  tt_result r = tt_run(dir, 300,
                       "%s run -n 2 --inject-fault 'kill:rank=1,step=130' -- %s train --data %s " COMMON
                       " %s %s --out %s/killed",
                       tt_bin(), tt_bin(), data, flags, ck, dir);
  CHECK(r.code != 0 && strstr(r.err, "rank 1"), "the crash was not reported: exit %d: %s", r.code, r.err);
  tt_result_free(&r);
  r = tt_run(dir, 300, "%s run -n 2 --raw-stdout -- %s train --data %s " COMMON " %s %s --resume --out %s/res --json",
             tt_bin(), tt_bin(), data, flags, ck, dir);
  CHECK(r.code == 0, "resume exit %d: %s", r.code, r.err);
  double from = tt_json_num(r.out, "resumed_from_step");
  CHECK(from == 100, "resumed from step %g, want 100 (the last checkpoint before the crash)", from);
  tt_result_free(&r);
  double full[256], res[256];
  losses("full", full, 256);
  losses("res", res, 256);
  for (int s = 101; s <= 200; s++)
    CHECK(res[s] == full[s], "step %d: resumed %.9g != uninterrupted %.9g", s, res[s], full[s]);
  CHECK(model_diff("res", "full") == 0, "parameters differ");
}

/* Debug lines holding `needle` from a short job of `n` workers (env and flags added). */
static int debug_lines(int n, const char *env, const char *flags, const char *needle) {
  tt_result r = tt_run(dir, 300, "env DTRAIN_LOG=debug %s %s run -n %d -- %s train --data %s --model '" TINY_MODEL
                       "' --batch 30 --max-steps 2 --out %s/debug %s",
                       env, tt_bin(), n, tt_bin(), data, dir, flags);
  CHECK(r.code == 0, "exit %d: %s", r.code, r.err);
  int k = 0;
  for (const char *p = strstr(r.err, needle); p; p = strstr(p + 1, needle))
    k++;
  tt_result_free(&r);
  return k;
}

/* Number of "bound to" lines (comm/bind.c's debug message) a 2-worker run logs. */
static int bound_lines(const char *env, int threads) {
  char flags[32];
  snprintf(flags, sizeof flags, "--threads %d", threads);
  return debug_lines(2, env, flags, "DTRAIN_BIND=auto: local rank");
}

static void group_bind(void) {
  cpu_set_t have;
  CHECK(sched_getaffinity(0, sizeof have, &have) == 0, "sched_getaffinity");
  int ncpu = CPU_COUNT(&have);
  fprintf(stderr, "%d CPU(s) available\n", ncpu);
  /* 2 workers x 1 thread fit whenever there are 2 CPUs */
  int n = bound_lines("", 1);
  CHECK(n == (ncpu >= 2 ? 2 : 0), "--threads 1 on %d CPU(s): %d rank(s) bound", ncpu, n);
  n = bound_lines("DTRAIN_BIND=none", 1);
  CHECK(n == 0, "DTRAIN_BIND=none: %d rank(s) bound anyway", n);
  /* 2 workers x ncpu threads never fit in ncpu CPUs */
  n = bound_lines("", ncpu);
  CHECK(n == 0, "--threads %d on %d CPU(s): %d rank(s) bound", ncpu, ncpu, n);
}

/* A 2-worker job with a 2 s deadline and fault `spec`. */
static tt_result stopped_peer(const char *spec) {
  return tt_run(dir, 300, "env DTRAIN_TIMEOUT_MS=2000 %s run -n 2 --inject-fault '%s' -- %s train --data %s --model '"
                TINY_MODEL "' --batch 30 --threads 1 --max-steps 10 --out %s/stopped",
                tt_bin(), spec, tt_bin(), data, dir);
}

/* The largest difference the window group allows between two ways of summing the same weight
 * gradients. With dtrain's own product (AVX-512 or AVX2) a rank's product over its samples is the
 * same bit for bit whichever rows of dW a call computes, so the paths must agree exactly. OpenBLAS's
 * kernels (a CPU without AVX-512F, or DTRAIN_GEMM=blas) round a row differently depending on
 * which other rows the call computes, and the deferred update computes dW in tiles and rank
 * ranges where backward computes it whole: there they agree within rounding. */
static double same_sum_tol(void) { return strcmp(dt__nn_gemm_name(), "openblas") != 0 ? 0.0 : 1e-6; }

static void group_window(void) {
  double tol = same_sum_tol();
  fprintf(stderr, "product: %s, so deferred against summed within %g\n", dt__nn_gemm_name(), tol);
  /* deferral is the default only with dtrain's own product; forced here so that every CPU
   * tests it (the default is checked at the end) */
  setenv("DTRAIN_DEFER", "1", 1);
  for (int n = 2; n <= 3; n++) {
    char a[32], b[32], c[32];
    snprintf(a, sizeof a, "shared%d", n);
    snprintf(b, sizeof b, "private%d", n);
    snprintf(c, sizeof c, "private0_%d", n);
    train_n(n, "--epochs 2 --max-steps 25", a);
    setenv("DTRAIN_WINDOW", "0", 1);
    train_n(n, "--epochs 2 --max-steps 25 --zero 1", b);
    train_n(n, "--epochs 2 --max-steps 25 --zero 0", c);
    unsetenv("DTRAIN_WINDOW");
    double d1 = model_diff(a, b), d0 = model_diff(a, c);
    CHECK(n == 2 ? d1 <= tol && d0 <= tol : d1 <= 1e-5 && d0 <= 1e-5,
          "%d workers: shared window against private buffers: %g (--zero 1), %g (--zero 0)", n, d1, d0);
    /* the linear weight gradients deferred to the update (DTRAIN_DEFER=1) against summed in
     * the window: every rank's product over its samples summed in rank order (within tol) */
    snprintf(b, sizeof b, "nodefer%d", n);
    setenv("DTRAIN_DEFER", "0", 1);
    train_n(n, "--epochs 2 --max-steps 25", b);
    setenv("DTRAIN_DEFER", "1", 1);
    double dd = model_diff(a, b);
    CHECK(dd <= tol, "%d workers: deferred weight gradients against summed ones: %g", n, dd);
  }
  /* deferred by every rank (DTRAIN_DEFER=1), also on several compute threads per worker (bit for
   * bit again); not where a step needs the whole gradient before its update (--clip), several
   * backwards (--accumulate), or with DTRAIN_DEFER=0 */
  const char *dl = "linear weight gradients deferred";
  int kd = debug_lines(3, "", "--threads 1", dl);
  CHECK(kd == 3, "3 workers: %d deferred their weight gradients", kd);
  kd = debug_lines(2, "", "--threads 2", dl);
  CHECK(kd == 2, "2 workers x 2 threads: %d deferred their weight gradients", kd);
  train_n(2, "--epochs 2 --max-steps 25 --threads 2", "defer2t");
  setenv("DTRAIN_DEFER", "0", 1);
  train_n(2, "--epochs 2 --max-steps 25 --threads 2", "nodefer2t");
  setenv("DTRAIN_DEFER", "1", 1);
  double dt2 = model_diff("defer2t", "nodefer2t");
  CHECK(dt2 <= tol, "2 workers x 2 threads: deferred weight gradients against summed ones: %g", dt2);
  const char *nodefer[][2] = {{"", "--threads 1 --clip 1"}, {"", "--threads 1 --accumulate 2"},
                              {"DTRAIN_DEFER=0", "--threads 1"}};
  for (size_t i = 0; i < sizeof nodefer / sizeof nodefer[0]; i++) {
    kd = debug_lines(2, nodefer[i][0], nodefer[i][1], dl);
    CHECK(kd == 0, "%s %s: %d deferred their weight gradients", nodefer[i][0], nodefer[i][1], kd);
  }
  /* unset: deferred where dtrain's own product runs, kept where OpenBLAS's does */
  unsetenv("DTRAIN_DEFER");
  kd = debug_lines(2, "", "--threads 1", dl);
  CHECK(kd == (tol == 0 ? 2 : 0), "DTRAIN_DEFER unset, %s product: %d deferred their weight gradients",
        dt__nn_gemm_name(), kd);
  kd = debug_lines(2, "DTRAIN_GEMM=blas", "--threads 1", dl);
  CHECK(kd == 0, "DTRAIN_DEFER unset, DTRAIN_GEMM=blas: %d deferred their weight gradients", kd);
  setenv("DTRAIN_DEFER", "1", 1);
  /* a peer stopped in a step on the one copy: rank 0 names the loss allreduce and rank 1 */
  tt_result st = stopped_peer("stop:rank=1,step=3");
  CHECK(st.code != 0 && strstr(st.err, "rank 0 failed first") && strstr(st.err, "loss and gradient tail allreduce") &&
            strstr(st.err, "waiting for rank 1"),
        "stopped peer: exit %d: %s", st.code, st.err);
  tt_result_free(&st);
  /* stopped once the gradients are summed, before its update: rank 0 waits in the barrier that
   * ends the step, and names it and rank 1 */
  st = stopped_peer("stop:rank=1,step=3,at=update");
  CHECK(st.code != 0 && strstr(st.err, "rank 1 stop at step 3 (generation 0") &&
            strstr(st.err, "before its optimizer update") && strstr(st.err, "rank 0 failed first") &&
            strstr(st.err, "waiting for every rank's parameter update") && strstr(st.err, "waiting for rank 1") &&
            !strstr(st.err, "rank 0: rank 0:"), /* the verdict names the failing rank once */
        "peer stopped before its update: exit %d: %s", st.code, st.err);
  tt_result_free(&st);
  /* sharded, every rank works on the one copy of the parameters; not without sharding */
  const char *one = "parameters: one copy per host";
  int k = debug_lines(3, "", "--threads 1", one);
  CHECK(k == 3, "3 workers: %d said they use the one copy", k);
  k = debug_lines(2, "", "--threads 1 --zero 0", one);
  CHECK(k == 0, "--zero 0: %d said they use the one copy", k);
  tt_result r = tt_run(dir, 300, "env DTRAIN_WINDOW=2 %s run -n 2 -- %s train --data %s --model '" TINY_MODEL
                       "' --batch 30 --threads 1 --max-steps 2 --out %s/badwin",
                       tt_bin(), tt_bin(), data, dir);
  CHECK(r.code != 0 && strstr(r.err, "DTRAIN_WINDOW=2"), "DTRAIN_WINDOW=2: exit %d: %s", r.code, r.err);
  tt_result_free(&r);
  r = tt_run(dir, 300, "env DTRAIN_DEFER=2 %s run -n 2 -- %s train --data %s --model '" TINY_MODEL
             "' --batch 30 --threads 1 --max-steps 2 --out %s/baddefer",
             tt_bin(), tt_bin(), data, dir);
  CHECK(r.code != 0 && strstr(r.err, "DTRAIN_DEFER=2"), "DTRAIN_DEFER=2: exit %d: %s", r.code, r.err);
  tt_result_free(&r);

  if (geteuid() != 0 || system("unshare -m true >/dev/null 2>&1") != 0) {
    fprintf(stderr, "note: not root or no mount namespaces here: the full-/dev/shm case is skipped\n");
    return;
  }
  /* 4.3 M parameters: 2 x 17 MB of window per rank, while the transport's segment needs ~6 MB */
  r = tt_run(dir, 300, "unshare -m sh -c 'mount -t tmpfs -o size=24m tmpfs /dev/shm && exec %s run -n 2 -- %s train "
             "--data %s --model in=1x8x8,linear:2048,relu,linear:2048,relu,linear:4 --batch 30 --threads 1 "
             "--max-steps 3 --out %s/smallshm'",
             tt_bin(), tt_bin(), data, dir);
  CHECK(r.code == 0, "small /dev/shm: exit %d: %s", r.code, r.err);
  CHECK(strstr(r.err, "gradients stay private") && strstr(r.err, "/dev/shm"), "small /dev/shm: no warning: %s",
        r.err);
  tt_result_free(&r);
  /* 60 MiB: room for the segment and 3 arenas of 16.4 MiB (2 workers' gradients and the one copy
   * of the parameters), not for 4 (a parameter copy per worker) */
  r = tt_run(dir, 300, "unshare -m sh -c 'mount -t tmpfs -o size=60m tmpfs /dev/shm && exec env DTRAIN_LOG=debug %s run "
             "-n 2 -- %s train --data %s --model in=1x8x8,linear:2048,relu,linear:2048,relu,linear:4 --batch 30 "
             "--threads 1 --max-steps 3 --out %s/midshm'",
             tt_bin(), tt_bin(), data, dir);
  CHECK(r.code == 0, "60 MiB /dev/shm: exit %d: %s", r.code, r.err);
  CHECK(!strstr(r.err, "gradients stay private") && strstr(r.err, "parameters: one copy per host"),
        "60 MiB /dev/shm: the window did not fit 3 arenas: %s", r.err);
  tt_result_free(&r);
  /* 66 MiB with 300 samples per worker: room for the 3 arenas (52 MB) and the segment, not for
   * the activation exports too (2 x 9.9 MB): the one copy stays, the weight gradients too */
  r = tt_run(dir, 300, "unshare -m sh -c 'mount -t tmpfs -o size=66m tmpfs /dev/shm && exec env DTRAIN_LOG=debug %s run "
             "-n 2 -- %s train --data %s --model in=1x8x8,linear:2048,relu,linear:2048,relu,linear:4 --batch 600 "
             "--threads 1 --max-steps 2 --out %s/exportshm'",
             tt_bin(), tt_bin(), data, dir);
  CHECK(r.code == 0, "66 MiB /dev/shm: exit %d: %s", r.code, r.err);
  CHECK(!strstr(r.err, "gradients stay private") && strstr(r.err, "parameters: one copy per host") &&
            strstr(r.err, "no room for the activation exports") && !strstr(r.err, "weight gradients deferred"),
        "66 MiB /dev/shm: not the one copy without exports: %s", r.err);
  tt_result_free(&r);
}

/* A straggler: rank `slow` of n spends 30 ms more per step in its compute (the slow fault), on
 * the transport and buffers `env` selects. The summary names it with the compute spread, rank 0
 * warns naming it once the warm-up interval is past, and the metrics file's step lines after
 * that name it too. */
static void straggler(int n, int slow, const char *env, const char *progress) {
  tt_result r = tt_run(dir, 300, "env %s %s run -n %d --raw-stdout --inject-fault 'slow:rank=%d,ms=30' -- %s "
                       "train --data %s --model '" TINY_MODEL "' --batch 30 --threads 1 --max-steps 18 "
                       "--log-interval 6 --progress %s --json --out %s/slow",
                       env, tt_bin(), n, slow, tt_bin(), data, progress, dir);
  CHECK(r.code == 0, "%s, %d workers: exit %d: %s", env, n, r.code, r.err);
  double who = tt_json_num(r.out, "slowest_rank"), ratio = tt_json_num(r.out, "compute_imbalance");
  CHECK(who == slow && ratio >= 1.25, "%s: slowest rank %g (want %d), imbalance %g: %s", env, who, slow, ratio, r.out);
  /* rank 0 waits about 30 ms a step for a slow rank 1 (18 steps); as the slow one it waits for nobody */
  double waiting = tt_json_num(r.out, "comm_waiting_slowest_s"), exposed = tt_json_num(r.out, "comm_exposed_s");
  CHECK(slow == 0 ? waiting == 0 : (waiting >= 0.25 && waiting <= exposed),
        "%s: %g s of %g s exposed said to be waiting for rank %d: %s", env, waiting, exposed, slow, r.out);
  char want[64];
  snprintf(want, sizeof want, "warning: rank %d computed ", slow);
  const char *w = strstr(r.err, want);
  CHECK(w && strstr(w, "x as long per step as rank ") && strstr(w, "every step waits for the slowest rank"),
        "%s: no warning naming rank %d: %s", env, slow, r.err);
  CHECK(strstr(w + 1, want) == NULL, "%s: warned more than once within the quiet time: %s", env, r.err);
  tt_result_free(&r);
  char path[2048];
  snprintf(path, sizeof path, "%s/slow/metrics.jsonl", dir);
  char *m = tt_slurp(path);
  CHECK(m, "no metrics file %s", path);
  const char *last = strstr(m, "\"step\":18,");
  CHECK(last && tt_json_num(last, "slowest_rank") == slow && tt_json_num(last, "compute_max_ms") >= 30 &&
            tt_json_num(last, "compute_min_ms") < tt_json_num(last, "compute_max_ms"),
        "%s: step 18's metrics do not name rank %d: %s", env, slow, m);
  free(m);
}

static void group_straggler(void) {
  straggler(2, 1, "DTRAIN_LOG=warn", "lines");                       /* shm, one copy, deferred */
  straggler(3, 0, "DTRAIN_WINDOW=0 DTRAIN_TRANSPORT=tcp", "off");     /* tcp, private, zero auto */
  /* 30 samples on 4 workers (8, 8, 7, 7): the spread is reported, but not warned about, since
   * the ranks' shares differ */
  tt_result r4 = tt_run(dir, 300, "%s run -n 4 --raw-stdout --inject-fault 'slow:rank=3,ms=30' -- %s train --data %s "
                        "--model '" TINY_MODEL "' --batch 30 --threads 1 --max-steps 18 --log-interval 6 --json "
                        "--out %s/uneven", tt_bin(), tt_bin(), data, dir);
  CHECK(r4.code == 0 && tt_json_num(r4.out, "slowest_rank") == 3 && !strstr(r4.err, "warning: rank"),
        "uneven shards: exit %d: %s %s", r4.code, r4.out, r4.err);
  tt_result_free(&r4);
  tt_result r = tt_run(dir, 300, "%s train --data %s --model '" TINY_MODEL "' --batch 30 --max-steps 3 --json "
                       "--out %s/one", tt_bin(), data, dir);
  CHECK(r.code == 0 && tt_json_num(r.out, "slowest_rank") == -1 && tt_json_num(r.out, "compute_imbalance") == 1,
        "one worker: exit %d: %s %s", r.code, r.out, r.err);
  tt_result_free(&r);
  /* --log-interval 1: every interval is one step, the warning compares a window of them */
  r = tt_run(dir, 300, "%s run -n 2 --inject-fault 'slow:rank=1,ms=30' -- %s train --data %s --model '" TINY_MODEL
             "' --batch 30 --threads 1 --max-steps 8 --log-interval 1 --progress off --out %s/slow1",
             tt_bin(), tt_bin(), data, dir);
  CHECK(r.code == 0 && strstr(r.err, "warning: rank 1 computed "), "--log-interval 1: exit %d, no warning naming rank 1: %s",
        r.code, r.err);
  tt_result_free(&r);
  /* rank 0 slow from the start is warned about; rank 1 much slower from step 13 on is too, within
   * rank 0's quiet time */
  r = tt_run(dir, 300, "%s run -n 2 --inject-fault 'slow:rank=0,ms=30;slow:rank=1,ms=120,step=12' -- %s train "
             "--data %s --model '" TINY_MODEL "' --batch 30 --threads 1 --max-steps 18 --log-interval 6 "
             "--progress off --out %s/slow2", tt_bin(), tt_bin(), data, dir);
  CHECK(r.code == 0 && strstr(r.err, "warning: rank 0 computed ") && strstr(r.err, "warning: rank 1 computed "),
        "two stragglers in turn: exit %d, not both warned about: %s", r.code, r.err);
  tt_result_free(&r);
  /* a delay fault without a transport hook (one worker) sleeps once before each step: not
   * twice, and not in the step's compute (a slow link, not a slow CPU) */
  r = tt_run(dir, 300, "%s run -n 1 --inject-fault 'delay:ms=60' -- %s train --data %s --model '" TINY_MODEL
             "' --batch 30 --threads 1 --max-steps 4 --log-interval 4 --progress off --out %s/delay",
             tt_bin(), tt_bin(), data, dir);
  CHECK(r.code == 0, "delay on one worker: exit %d: %s", r.code, r.err);
  tt_result_free(&r);
  char mpath[2048];
  snprintf(mpath, sizeof mpath, "%s/delay/metrics.jsonl", dir);
  char *dm = tt_slurp(mpath);
  const char *d4 = dm ? strstr(dm, "\"step\":4,") : NULL;
  CHECK(d4 && tt_json_num(d4, "compute_ms") < 30, "delay counted as compute: %s", dm ? dm : "(no metrics)");
  free(dm);
  /* resumed at its last step: no step ran, so no rank was the slowest */
  r = tt_run(dir, 300, "%s run -n 2 -- %s train --data %s --model '" TINY_MODEL "' --batch 30 --threads 1 "
             "--max-steps 3 --checkpoint-dir %s/ck --out %s/slow3", tt_bin(), tt_bin(), data, dir, dir);
  CHECK(r.code == 0, "3 steps with checkpoints: exit %d: %s", r.code, r.err);
  tt_result_free(&r);
  r = tt_run(dir, 300, "%s run -n 2 --raw-stdout -- %s train --data %s --model '" TINY_MODEL "' --batch 30 "
             "--threads 1 --max-steps 3 --checkpoint-dir %s/ck --resume --json --out %s/slow3",
             tt_bin(), tt_bin(), data, dir, dir);
  CHECK(r.code == 0 && tt_json_num(r.out, "steps_run") == 0 && tt_json_num(r.out, "slowest_rank") == -1 &&
            tt_json_num(r.out, "compute_imbalance") == 1,
        "resumed at the end: exit %d: %s %s", r.code, r.out, r.err);
  tt_result_free(&r);
  r = tt_run(dir, 300, "%s run -n 2 -- %s train --data %s --model '" TINY_MODEL "' --batch 30 --threads 1 "
             "--max-steps 3 --checkpoint-dir %s/ck --resume --progress off --out %s/slow3",
             tt_bin(), tt_bin(), data, dir, dir);
  CHECK(r.code == 0 && !strstr(r.out, "slowest rank") && !strstr(r.err, "slowest rank"),
        "resumed at the end names a slowest rank: exit %d: %s %s", r.code, r.out, r.err);
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
  else if (!strcmp(g, "mismatch"))
    group_mismatch();
  else if (!strcmp(g, "resume"))
    group_resume();
  else if (!strcmp(g, "kill"))
    group_kill();
  else if (!strcmp(g, "refuse"))
    group_refuse();
  else if (!strcmp(g, "bind"))
    group_bind();
  else if (!strcmp(g, "window"))
    group_window();
  else if (!strcmp(g, "straggler"))
    group_straggler();
  else
    CHECK(0, "unknown group %s", g);
  tt_rmrf(dir);
  printf("ok %s\n", g);
  return 0;
}
