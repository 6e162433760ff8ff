/* test_train_random.c - data parallel against one worker, on random settings. Each case draws a
 * small model (convolutions of random kernel, stride and padding, pooling, layernorm, gelu,
 * dropout, linear layers), a data set (203 or 37 training samples), a global batch (down to
 * fewer samples than workers), a step count that may cross epochs, an optimizer (SGD with or
 * without momentum, Nesterov and weight decay, or AdamW), a learning-rate schedule and gradient
 * clipping, and dtrain's own matrix product or OpenBLAS's (DTRAIN_GEMM=blas). One worker trains
 * with those settings; then 2-4 workers under `dtrain run` train with the same ones and with
 * random choices that must not change the result: micro-batches (--accumulate), compute
 * threads, --bucket-size, --zero, the transport (shm or tcp), the shared window and deferred
 * weight gradients (DTRAIN_WINDOW, DTRAIN_DEFER) and the algorithms of allreduce, allgather and
 * reduce_scatter (DTRAIN_ALGO). Some cases stop the workers at a random step with a checkpoint
 * and resume on another number of workers with other choices; some inject faults that `dtrain
 * run --max-restarts` recovers from (random_faults); some run three hosts on loopback, one of
 * which is lost, lost and back, or has its agent stopped (hosts_script); some start the workers
 * with mpirun. The
 * per-step losses, the summary's final test and training losses and the final parameters must
 * match the one worker's within the rounding of another summation order, and `dtrain eval` of
 * the saved model must repeat the summary's test loss.
 *
 *   test_train_random CASES [SEED [MPIRUN]]   CASES cases from SEED (default 1); with MPIRUN,
 *                                             some start their workers with Open MPI's mpirun
 *                                             (DTRAIN_TRANSPORT mpi, shm or tcp). A failure
 *                                             prints the seed and the command lines to repeat it */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "dtrain/data.h"
#include "train_test.h"

static char dir[1024], data_big[2048], small[2048], fmnist[2048];
#define FMNIST "/usr/share/datasets/fashion-mnist"
#define N_FMNIST 3000 /* training images taken (and a sixth as many test images) */

/* The first n images and labels of one Fashion-MNIST split, written raw into dir. */
static int copy_split(const char *prefix, uint64_t n) {
  const char *kind[2] = {"images-idx3", "labels-idx1"};
  for (int k = 0; k < 2; k++) {
    char in[4096], out[4096];
    snprintf(in, sizeof in, FMNIST "/%s-%s-ubyte.gz", prefix, kind[k]);
    snprintf(out, sizeof out, "%s/%s-%s-ubyte", fmnist, prefix, kind[k]);
    dt_idx idx;
    if (dt_idx_read(in, 0, &idx) != DT_OK)
      return 0;
    uint32_t dims[3];
    for (int d = 0; d < idx.ndim && d < 3; d++)
      dims[d] = (uint32_t)idx.dims[d];
    dims[0] = (uint32_t)n;
    tt_write_idx(out, idx.data, idx.ndim, dims);
    dt_idx_free(&idx);
  }
  return 1;
}


#define CAT(buf, ...) snprintf((buf) + strlen(buf), sizeof(buf) - strlen(buf), __VA_ARGS__)
#define CAT1(buf, cap, ...) snprintf((buf) + strlen(buf), (cap) - strlen(buf), __VA_ARGS__)

/* The sizes a case draws from: train_test.h's 8x8 4-class set, or the first images of the real
 * Fashion-MNIST (28x28, 10 classes) with layers wide enough for the paths a tiny model never
 * takes (several buckets at the default 1 MiB, many ZeRO blocks, deferred weight gradients
 * over several tiles, convolutions of many channels). */
typedef struct scale {
  int side, classes, width, chans, kernel, batch, steps, eval;
} scale;
static const scale tiny = {8, 4, 32, 6, 3, 60, 27, 60}, real = {28, 10, 1100, 40, 5, 300, 6, 600};

/* A random model on the scale's 1 x side x side images. */
static void random_model(const scale *z, char *m, size_t cap) {
  char s[512];
  snprintf(s, sizeof s, "in=1x%dx%d", z->side, z->side);
  int c = 1, h = z->side, flat = 0;
  if (tt_chance(60)) {
    for (int conv = 0, nconv = 1 + (int)tt_rnd(2); conv < nconv && h >= 2; conv++) {
      int kmax = z->kernel < h ? z->kernel : h;
      int k = 1 + (int)tt_rnd((uint32_t)kmax), st = 1 + (int)tt_rnd(2), p = (int)tt_rnd((uint32_t)k);
      c = 2 + (int)tt_rnd((uint32_t)z->chans - 1); /* one channel: often dead after relu, or a bias a layernorm cancels (see below) */
      CAT(s, ",conv%dx%d:%d:s%d:p%d", k, k, c, st, p);
      h = (h + 2 * p - k) / st + 1;
      if (tt_chance(70))
        CAT(s, ",%s", tt_chance(50) ? "relu" : "gelu");
      if (h >= 2 && tt_chance(40)) {
        int ps = 1 + (int)tt_rnd(2);
        CAT(s, ",%s2:s%d", tt_chance(50) ? "maxpool" : "avgpool", ps);
        h = (h - 2) / ps + 1;
      }
    }
    CAT(s, ",flatten");
    flat = c * h * h;
  } else {
    CAT(s, ",flatten");
    flat = z->side * z->side;
  }
  for (int l = 0, nl = (int)tt_rnd(3); l < nl; l++) {
    if (flat >= 8 && tt_chance(25))
      CAT(s, ",layernorm");
    flat = 4 + (int)tt_rnd((uint32_t)z->width - 3);
    CAT(s, ",linear:%d", flat);
    CAT(s, ",%s", tt_chance(60) ? "relu" : "gelu");
    if (tt_chance(25))
      CAT(s, ",dropout:0.%d", 1 + (int)tt_rnd(4));
  }
  if (flat >= 8 && tt_chance(20))
    CAT(s, ",layernorm");
  CAT(s, ",linear:%d", z->classes);
  snprintf(m, cap, "%s", s);
}

/* The settings both sides share: model, data order, steps, optimizer, schedule, clipping. */
static int random_common(const scale *z, char *c, size_t cap, int n_train, int *batch_out) {
  char m[512];
  random_model(z, m, sizeof m);
  int batch = tt_chance(20) ? 1 + (int)tt_rnd(4) : 5 + (int)tt_rnd((uint32_t)z->batch);
  if (batch > n_train)
    batch = n_train;
  *batch_out = batch;
  int per_epoch = (n_train + batch - 1) / batch, epochs = 1 + (int)tt_rnd(3);
  int steps = 2 + (int)tt_rnd((uint32_t)z->steps);
  if (steps > per_epoch * epochs)
    steps = per_epoch * epochs;
  snprintf(c, cap, "--model '%s' --batch %d --epochs %d --max-steps %d --seed %u --log-interval 1 "
           "--eval-batch %d --progress off --json",
           m, batch, epochs, steps, tt_rnd(1000), 1 + (int)tt_rnd((uint32_t)z->eval));
  char o[256] = "";
  if (tt_chance(65)) {
    CAT(o, " --optimizer sgd --lr 0.%02d", 2 + (int)tt_rnd(9));
    double mom[] = {0, 0.5, 0.9};
    double mo = mom[tt_rnd(3)];
    if (mo > 0)
      CAT(o, " --momentum %g%s", mo, tt_chance(40) ? " --nesterov" : "");
    if (tt_chance(40))
      CAT(o, " --weight-decay %s", tt_chance(50) ? "0.001" : "0.05");
  } else {
    CAT(o, " --optimizer adamw --lr 0.00%d", 2 + (int)tt_rnd(8));
    if (tt_chance(50))
      CAT(o, " --weight-decay %s", tt_chance(50) ? "0" : "0.1");
  }
  switch (tt_rnd(5)) {
  case 0: break;
  case 1: CAT(o, " --schedule step:%d:0.5", 2 + (int)tt_rnd(10)); break;
  case 2: CAT(o, " --schedule cosine"); break;
  case 3: CAT(o, " --schedule cosine:%d:0.001", 1 + (int)tt_rnd(5)); break;
  default: CAT(o, " --schedule warmup=%d,constant", 1 + (int)tt_rnd(6)); break;
  }
  if (tt_chance(35))
    CAT(o, " --clip %s", tt_chance(50) ? "0.5" : "3");
  snprintf(c + strlen(c), cap - strlen(c), "%s", o);
  return steps;
}

static const char *gemm; /* "DTRAIN_GEMM=blas " or "": every run of a case */

/* What must not change the result: the workers' own choices. */
static void random_worker_side(int batch, char *flags, size_t fcap, char *env, size_t ecap) {
  int acc = 1 + (int)tt_rnd(3);
  snprintf(flags, fcap, "--threads %d --accumulate %d", 1 + (int)tt_rnd(2), acc < batch ? acc : batch);
  if (tt_chance(50)) {
    const char *b[] = {"64", "256", "1K", "4K", "1M"};
    CAT1(flags, fcap, " --bucket-size %s", b[tt_rnd(5)]);
  }
  const char *z[] = {"auto", "0", "1"};
  CAT1(flags, fcap, " --zero %s", z[tt_rnd(3)]);
  int tcp = tt_chance(30);
  snprintf(env, ecap, "env %sDTRAIN_TRANSPORT=%s", gemm, tcp ? "tcp" : "shm");
  if (!tcp && tt_chance(30))
    CAT1(env, ecap, " DTRAIN_WINDOW=0");
  if (tt_chance(40))
    CAT1(env, ecap, " DTRAIN_DEFER=%d", (int)tt_rnd(2));
  if (tt_chance(50)) { /* the algorithms, shm's own ones last (not on tcp) */
    const char *ar[] = {"ring", "rd", "rhd", "shm", "flat"}, *ag[] = {"ring", "bruck", "shm", "flat"},
               *rs[] = {"ring", "rhd", "shm", "flat"};
    char algo[128] = "";
    if (tt_chance(60))
      CAT(algo, ",allreduce=%s", ar[tt_rnd(tcp ? 3 : 5)]);
    if (tt_chance(50))
      CAT(algo, ",allgather=%s", ag[tt_rnd(tcp ? 2 : 4)]);
    if (tt_chance(50))
      CAT(algo, ",reduce_scatter=%s", rs[tt_rnd(tcp ? 2 : 4)]);
    if (algo[0])
      CAT1(env, ecap, " DTRAIN_ALGO=%s", algo + 1);
  }
}

/* How far another summation order alone moves run "ref": the one worker again on two compute
 * threads with two micro-batches ("ref2") and with one ("ref3"), where the batch has the
 * samples. An unstable run (a loss that jumps) or a max pooling whose two largest inputs
 * are a rounding apart (the gradient goes to the other one) turns rounding into a visible
 * difference; the workers may then differ from one worker by as much as another summation order
 * of one worker does, times a margin. Two such runs, since one may land on the reference's side
 * of such a tie (seen: two threads, with one or three micro-batches or with OpenBLAS, all moved
 * a conv net's step-6 loss by 8.3e-5; two threads with two micro-batches, and one thread with
 * three, by 1e-7). A run whose loss more than doubles from its first step is unstable enough
 * that even two noise runs understate it: each step multiplies a rounding difference by tens,
 * and the workers' own order (other product shapes per worker) starts it a step earlier (seen:
 * three workers with OpenBLAS on real images, loss 2.98 -> 8.43 -> 7.24, moved step 4 by 7.3e-5
 * from 2e-7 at step 2, where the noise runs moved it by 1.6e-6): there the floor is at least
 * UNSTABLE_FLOOR. */
#define NNOISE 2
#define UNSTABLE_FLOOR 1e-3
static const char *noise_run[NNOISE] = {"ref2", "ref3"}, *noise_flags[NNOISE] = {"--threads 2 --accumulate 2",
                                                                                 "--threads 2 --accumulate 1"};
static char *noise_summary[NNOISE]; /* their stdout (NULL: not run) */
static double floor_loss[64], floor_params, floor_unstable;
#define MARGIN 20

static void measure_floor(int steps) {
  double la[64], lb[64];
  tt_run_losses(dir, "ref", la, 64);
  floor_params = 0;
  for (int s = 0; s < 64; s++)
    floor_loss[s] = 0;
  for (int k = 0; k < NNOISE; k++) {
    if (!noise_summary[k])
      continue;
    tt_run_losses(dir, noise_run[k], lb, 64);
    double worst = 0;
    for (int s = 1; s <= steps && s < 64; s++) {
      if (!isnan(la[s]) && !isnan(lb[s]))
        worst = fmax(worst, fabs(lb[s] - la[s]) / fmax(fabs(la[s]), 1e-30));
      floor_loss[s] = fmax(floor_loss[s], worst);
    }
    floor_params = fmax(floor_params, tt_runs_model_diff(dir, noise_run[k], "ref"));
  }
  floor_unstable = 0;
  for (int s = 2; s <= steps && s < 64; s++)
    if (la[s] > 2 * la[1])
      floor_unstable = UNSTABLE_FLOOR;
  for (int s = 0; s < 64; s++)
    floor_loss[s] = fmax(floor_loss[s], floor_unstable / MARGIN);
  floor_params = fmax(floor_params, floor_unstable / MARGIN);
}

/* Losses of steps (from, to] and (if params) the final parameters of run b against "ref". */
static int compare(const char *b, int from, int to, int params, double tol, const char *what) {
  double la[64], lb[64];
  tt_run_losses(dir, "ref", la, 64);
  tt_run_losses(dir, b, lb, 64);
  for (int s = from + 1; s <= to; s++) {
    if (isnan(lb[s]) || isnan(la[s])) {
      fprintf(stderr, "%s: step %d has no loss (%g, %g)\n", what, s, la[s], lb[s]);
      return 0;
    }
    double allow = fmax(tol, MARGIN * floor_loss[s]);
    if (fabs(lb[s] - la[s]) > allow * fabs(la[s]) + 1e-7) {
      fprintf(stderr, "%s: step %d loss %.9g, one worker %.9g (allowed relative difference %.3g)\n", what,
              s, lb[s], la[s], allow);
      return 0;
    }
  }
  double d = params ? tt_runs_model_diff(dir, b, "ref") : 0, allow = fmax(tol, MARGIN * floor_params);
  if (d > allow) {
    fprintf(stderr, "%s: parameters differ from one worker's by %.3g (relative; allowed %.3g)\n", what, d,
            allow);
    return 0;
  }
  return 1;
}

/* Faults for a run of `steps` steps, a checkpoint every `every`, that recovers by restarts: a
 * worker killed, exiting, stopped (found by the fault timeout), cut off or losing its data (tcp),
 * at a step's start or before its update; sometimes the newest checkpoint damaged first, while
 * an older one is there to fall back to (with none, the resume refuses: tests/train
 * test_train_dp's refuse group); sometimes a second death in the generation that recovers. */
static void random_faults(char *spec, size_t cap, int steps, int every, int tcp) {
  int at = 1 + (int)tt_rnd((uint32_t)steps - 1);
  spec[0] = '\0';
  if (at > 2 * every && tt_chance(40))
    snprintf(spec, cap, "corrupt-ckpt:dir=%s/ck,step=%d,mode=%s;", dir, 2 * every + (int)tt_rnd((uint32_t)(at - 2 * every)),
             tt_chance(50) ? "flip" : "truncate");
  const char *upd = tt_chance(30) ? ",at=update" : "";
  switch (tt_rnd(tcp ? 7 : 5)) {
  case 0: case 1: CAT1(spec, cap, "kill:rank=any,step=%d%s", at, upd); break;
  case 2: CAT1(spec, cap, "exit:rank=any,step=%d,code=%d%s", at, tt_chance(50) ? 1 : 3, upd); break;
  case 3: CAT1(spec, cap, "%s:rank=any,step=%d%s", tt_chance(30) ? "stop" : "kill", at, upd); break;
  case 4: CAT1(spec, cap, "exit:rank=any,step=%d%s", at, upd); break;
  case 5: CAT1(spec, cap, "close:rank=any,step=%d", at); break;
  default: CAT1(spec, cap, "drop:rank=any,step=%d,count=1", at); break;
  }
  if (tt_chance(25))
    CAT1(spec, cap, ";kill:rank=any,step=%d,gen=1", 1 + (int)tt_rnd((uint32_t)steps - 1));
  CAT1(spec, cap, ";seed=%u", tt_rnd(1000));
}

/* A block of n ports on loopback that nothing listens on now. */
static int free_ports(int n) {
  static unsigned calls; /* not the case's stream: a case repeats whichever ports it gets */
  calls++;
  for (int attempt = 0; attempt < 500; attempt++) {
    /* below the ephemeral range (32768 up): no test's outgoing connection takes them meanwhile */
    int base = 20000 + (int)(((unsigned)getpid() * 7919u + (calls * 500u + (unsigned)attempt) * 104729u) % 12000u);
    int ok = 1;
    for (int i = 0; i < n && ok; i++) {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                              .sin_port = htons((uint16_t)(base + i))};
      ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
      if (fd >= 0)
        close(fd);
    }
    if (ok)
      return base;
  }
  CHECK(0, "no block of %d free ports", n);
  return -1;
}

/* Three hosts on loopback (a `dtrain run --nnodes 3 --min-nodes 2` agent each, with `local`
 * workers, its own session, all writing to one --out and one checkpoint directory as on a shared
 * file system). Once the first checkpoint exists (by step 2) one host meets an event:
 *   H_LOST    host 1 or 2 killed whole (its session: agent and workers); the other two re-form
 *   H_STORE   host 0 killed whole, the agent store's: the others move the store and re-form
 *   H_REJOIN  host 1 or 2 killed, and its agent started again once the others re-formed: it
 *             joins, and the job finishes on three hosts again
 *   H_STOPPED one agent (not its workers) stopped past its lease, then continued: its workers go
 *             on and the job finishes on three hosts, nothing re-formed. With `held`, for 3 s
 *             while the job runs on: the others must say that the agent (or, of node 0's, the
 *             agent store) stopped answering; else for 2.5 s, through the job's end.
 * A slow rank 0 stretches the steps: 40 ms each in the first generation; for H_REJOIN 150 ms in
 * every generation, so that the steps left after the first re-forming outlast the lost host's
 * return; for a held H_STOPPED 600 ms, so that they outlast the stop. The script prints the
 * agents' stdout (the summary, from whichever rank 0 finished) and their stderr. */
enum { H_LOST, H_STORE, H_REJOIN, H_STOPPED, H_EVENTS };
static const char *host_event_name[H_EVENTS] = {"a host lost", "the store's host lost", "a host lost and back",
                                                "an agent stopped"};
typedef struct hosts_case {
  int event, victim, held, local; /* local: workers per host */
} hosts_case;
static void hosts_script(char *out, size_t cap, const char *env, const hosts_case *h, const char *data,
                         const char *common, const char *flags, int every) {
  int event = h->event, held = h->held;
  char path[4096], agent[8192];
  snprintf(path, sizeof path, "%s/hosts.sh", dir);
  FILE *f = fopen(path, "w");
  CHECK(f, "create %s", path);
  snprintf(agent, sizeof agent,
           "setsid timeout 100 %s %s run -n %d --nnodes 3 --node-rank $r --master 127.0.0.1:%d --max-restarts 3 "
           "--min-nodes 2 --fault-timeout 2 --kill-after 1 --inject-fault slow:rank=0,step=0,%s --raw-stdout -- "
           "%s train --data %s %s %s --checkpoint-dir $d/ck --checkpoint-every %d --resume --out $d/hosts",
           env, tt_bin(), h->local, free_ports(5), event == H_REJOIN ? "ms=150,gen=any" : held ? "ms=600" : "ms=40",
           tt_bin(), data, common, flags, every);
  fprintf(f, "export DTRAIN_JOB_SECRET=random-hosts; d='%s'; v=%d\n"
             "start() { %s >>$d/agent$r.out 2>>$d/agent$r.err & pid[$r]=$!; }\n"
             "for r in 0 1 2; do start; done\n"
             "for i in $(seq 400); do ls $d/ck/ckpt-*.dtc >/dev/null 2>&1 && break; sleep 0.05; done\n",
          dir, h->victim, agent);
  if (event == H_STOPPED)
    fprintf(f, "a='dtrain run -n'; pkill -STOP -s ${pid[$v]} -f \"$a\"; sleep %s; pkill -CONT -s ${pid[$v]} -f \"$a\"\n",
            held ? "3" : "2.5"); /* the agent (and its timeout), not its workers */
  else
    fprintf(f, "pkill -9 -s ${pid[$v]}\n");
  if (event == H_REJOIN)
    fprintf(f, "for i in $(seq 300); do grep -q 'generation 1 with 2 hosts' $d/agent*.err && break; sleep 0.05; done\n"
               "r=$v; start\n");
  fprintf(f, "wait; cat $d/agent*.out; cat $d/agent*.err >&2\n");
  CHECK(fclose(f) == 0, "write %s", path);
  snprintf(out, cap, "bash %s", path);
}

static int n_plain, n_mpi, n_resumed, n_faulty, n_fired, n_restarts, n_hosts[H_EVENTS]; /* what the cases did */
static const char *mpirun; /* Open MPI's mpirun, when given: some cases start the workers with it */

static void rename_run(const char *from, const char *to) {
  char a[4096], b[4096];
  snprintf(a, sizeof a, "%s/%s", dir, from);
  snprintf(b, sizeof b, "%s/%s", dir, to);
  CHECK(rename(a, b) == 0, "rename %s %s", a, b);
}

static int run_ok(const char *what, tt_result *r, const char *cmd) {
  if (r->code == 0 && tt_json_is_object(r->out))
    return 1;
  fprintf(stderr, "%s: exit %d\n  $ %s\n%s%s\n", what, r->code, cmd, r->out, r->err);
  return 0;
}

/* The summaries' final test loss and the last epoch's mean training loss (a resumed run goes on
 * with its epoch's earlier steps): within tol of one worker's (relative), or of the margin times
 * the noise runs' distance. Not the accuracy: a model whose logits hardly depend on the input
 * yet (dead units after a step or two) changes every answer at once on a rounding. */
static double dp_test_loss; /* the workers' final test loss (workers_run) */

static int compare_summary(const char *ref, const char *dp, double tol) {
  const char *key[] = {"test_loss", "train_loss"};
  for (int i = 0; i < 2; i++) {
    double a = tt_json_num(ref, key[i]), b = tt_json_num(dp, key[i]), noise = 0;
    for (int k = 0; k < NNOISE; k++)
      if (noise_summary[k])
        noise = fmax(noise, fabs(tt_json_num(noise_summary[k], key[i]) - a) / fmax(fabs(a), 1e-30));
    double allow = fmax(fmax(tol, MARGIN * noise), floor_unstable);
    if (!(fabs(b - a) <= allow * fabs(a) + 1e-7)) {
      fprintf(stderr, "summary: %s %.9g, one worker %.9g (allowed relative difference %.3g)\n", key[i], b, a, allow);
      return 0;
    }
  }
  return 1;
}

static char *ref_summary; /* stdout of run "ref" */

/* A check of a workers' run's output beyond its exit status (arg: the check's own). */
typedef int (*run_check)(const tt_result *r, const char *cmd, const void *arg);

/* Faults were injected and fired; counts them and the restarts. */
static int faults_fired(const tt_result *r, const char *cmd, const void *arg) {
  (void)arg;
  for (const char *f = r->err; (f = strstr(f, "dtrain fault: rank ")); f++)
    n_fired++;
  for (const char *f = r->err; (f = strstr(f, "; restarting (")); f++)
    n_restarts++;
  if (strstr(r->err, "dtrain fault: rank"))
    return 1;
  fprintf(stderr, "with faults: no fault fired\n  $ %s\n%s\n", cmd, r->err);
  return 0;
}

/* The hosts went on as the event (hosts_script) says they must (arg: the hosts_case). */
static int hosts_went_on(const tt_result *r, const char *cmd, const void *arg) {
  const hosts_case *h = arg;
  int local = h->local, held = h->held, victim = h->victim, event = h->event;
  int world = (int)tt_json_num(r->out, "world_size");
  char lost[64], self_blind[64], paused[64];
  snprintf(lost, sizeof lost, "the agent of node %d shows no sign of life", victim);
  snprintf(self_blind, sizeof self_blind, "node %d: the agent store at", victim);
  snprintf(paused, sizeof paused, "node %d: this agent did not run for", victim);
  const char *why = NULL;
  if ((event == H_LOST || event == H_STORE) && !(strstr(r->err, "generation 1 with 2 hosts") && world == 2 * local))
    why = "the job did not go on with the two hosts left";
  else if (event == H_REJOIN && !(strstr(r->err, "to join; re-forming") && world == 3 * local))
    why = "the lost host did not join again";
  else if (event == H_STOPPED && !(world == 3 * local && !strstr(r->err, "re-forming")))
    why = "the job did not finish on its three hosts without re-forming";
  else if (event == H_STOPPED && held && !strstr(r->err, victim ? lost : "stopped answering during generation 0"))
    why = victim ? "nobody said that the stopped agent shows no sign of life"
                 : "nobody said that the store stopped answering";
  else if (event == H_STOPPED && held && !strstr(r->err, paused))
    why = "the stopped agent did not say that it had not run";
  /* what it missed while stopped is not the others' silence */
  else if (event == H_STOPPED && (strstr(r->err, self_blind) || (!victim && strstr(r->err, "shows no sign of life"))))
    why = "the stopped agent blamed the store or the others for its own pause";
  if (!why)
    return 1;
  fprintf(stderr, "three hosts, %s: %s (world %d)\n  $ %s\n%s\n", host_event_name[event], why, world, cmd, r->err);
  return 0;
}

/* Runs the workers' command cmd (its summary on stdout, its run in DIR/b): it must exit 0 and
 * pass check (NULL: none); its losses of steps (from, to] must match one worker's, and with
 * final its parameters and summary too. */
static int workers_run(const char *what, const char *cmd, int timeout_s, const char *b, int from, int to, int final,
                       double tol, run_check check, const void *arg) {
  tt_result r = tt_run(dir, timeout_s, "%s", cmd);
  int ok = run_ok(what, &r, cmd) && (!check || check(&r, cmd, arg)) && compare(b, from, to, final, tol, what) &&
           (!final || compare_summary(ref_summary, r.out, tol));
  if (final)
    dp_test_loss = tt_json_num(r.out, "test_loss");
  tt_result_free(&r);
  return ok;
}

static int one_case(unsigned seed) {
  tt_seed(seed);
  gemm = tt_chance(15) ? "DTRAIN_GEMM=blas " : "";
  char common[2048], flags[512], env[256];
  int batch, which = (int)tt_rnd(100); /* the 203/50 set, the 37/7 one, or real images */
  int big = which < 10 && fmnist[0], few = !big && which < 35;
  const char *data = big ? fmnist : few ? small : data_big;
  int steps = random_common(big ? &real : &tiny, common, sizeof common, big ? N_FMNIST : few ? 37 : 203, &batch);
  random_worker_side(batch, flags, sizeof flags, env, sizeof env);
  int n = 2 + (int)tt_rnd(3);
  /* AdamW's step does not shrink with the gradient: an element whose gradient is tiny (a gelu
   * input far below zero, a feature dropout and layernorm leave almost constant) moves by about
   * the learning rate in a direction its rounding decides, so another summation order moves it
   * by up to lr per step (seen: 1e-3 of the largest parameter after 4 steps, through 2e-3 in the
   * loss). AdamW cases catch what breaks its state (shards, resumes, step counts), which moves
   * far more; SGD cases hold the workers to the rounding of one worker. */
  double tol = strstr(common, "adamw") ? 1e-2 : 5e-5;
  int resume_at = steps > 2 && tt_chance(35) ? 1 + (int)tt_rnd((uint32_t)steps - 1) : 0;

  char ref[4096], noise_cmd[4096] = "", cmd[12288] = "", cmd2[8192] = "";
  int passed = 0;
  snprintf(ref, sizeof ref, "env %s%s run -n 1 --raw-stdout -- %s train --data %s %s --threads 1 --zero 0 --out %s/ref",
           gemm, tt_bin(), tt_bin(), data, common, dir);
  tt_result r = tt_run(dir, 120, "%s", ref);
  if (r.code == 1 && strstr(r.err, "training diverged")) { /* nothing to compare: drawn again */
    tt_result_free(&r);
    return -1;
  }
  int ok = run_ok("one worker", &r, ref);
  ref_summary = r.out;
  free(r.err);
  if (!ok)
    goto done;
  for (int k = 0; k < NNOISE && batch >= 2; k++) {
    snprintf(noise_cmd, sizeof noise_cmd, "env %s%s run -n 1 --raw-stdout -- %s train --data %s %s %s --zero 0 --out %s/%s", gemm,
             tt_bin(), tt_bin(), data, common, noise_flags[k], dir, noise_run[k]);
    r = tt_run(dir, 120, "%s", noise_cmd);
    ok = run_ok("one worker, another summation order", &r, noise_cmd);
    noise_summary[k] = r.out;
    free(r.err);
    if (!ok)
      goto done;
  }
  measure_floor(steps);
  if (!resume_at && steps >= 2 && tt_chance(50)) {
    /* faults, and restarts that resume from the last good checkpoint */
    char spec[2048];
    int every = 1 + (int)tt_rnd(4);
    random_faults(spec, sizeof spec, steps, every, strstr(env, "tcp") != NULL);
    snprintf(cmd, sizeof cmd, "%s %s run -n %d --max-restarts 3 --fault-timeout 2 --inject-fault '%s' --raw-stdout -- "
             "%s train --data %s %s %s --checkpoint-dir %s/ck --checkpoint-every %d --resume --out %s/dp",
             env, tt_bin(), n, spec, tt_bin(), data, common, flags, dir, every, dir);
    n_faulty++;
    ok = workers_run("with faults", cmd, 120, "dp", 0, steps, 1, tol, faults_fired, NULL);
  } else if (!resume_at && steps >= 8 && tt_chance(15)) {
    /* three hosts, one meets an event (hosts_script); the global batch unchanged */
    hosts_case h = {.local = 1 + (int)tt_rnd(2), .event = (int)tt_rnd(H_EVENTS)};
    h.victim = h.event == H_STORE ? 0 : h.event == H_STOPPED ? (int)tt_rnd(3) : 1 + (int)tt_rnd(2);
    h.held = h.event == H_STOPPED && tt_chance(50);
    hosts_script(cmd, sizeof cmd, env, &h, data, common, flags, 1 + (int)tt_rnd(2));
    n_hosts[h.event]++;
    ok = workers_run(host_event_name[h.event], cmd, 150, "hosts", 0, steps, 1, tol, hosts_went_on, &h);
    if (ok)
      rename_run("hosts", "dp");
  } else if (!resume_at && mpirun && tt_chance(50)) {
    /* started by Open MPI's mpirun, collectives over dtrain's transport or over MPI (which has
     * its own algorithms: DTRAIN_ALGO would be refused, naming it) */
    snprintf(cmd, sizeof cmd, "%s --allow-run-as-root --oversubscribe --mca btl_tcp_if_include lo -np %d %s "
             "DTRAIN_JOB_SECRET=train-random %s%s train --data %s %s %s --out %s/dp",
             mpirun, n, env, tt_chance(40) ? "env -u DTRAIN_ALGO DTRAIN_TRANSPORT=mpi " : "", tt_bin(), data, common,
             flags, dir);
    n_mpi++;
    ok = workers_run("under mpirun", cmd, 120, "dp", 0, steps, 1, tol, NULL, NULL);
  } else if (!resume_at) {
    snprintf(cmd, sizeof cmd, "%s %s run -n %d --raw-stdout -- %s train --data %s %s %s --out %s/dp", env, tt_bin(),
             n, tt_bin(), data, common, flags, dir);
    n_plain++;
    ok = workers_run("data parallel", cmd, 120, "dp", 0, steps, 1, tol, NULL, NULL);
  } else {
    /* stop at resume_at (a checkpoint at the end), go on with other workers and settings */
    int n2 = 1 + (int)tt_rnd(4);
    char flags2[512], env2[256];
    random_worker_side(batch, flags2, sizeof flags2, env2, sizeof env2);
    snprintf(cmd, sizeof cmd, "%s %s run -n %d --raw-stdout -- %s train --data %s %s %s --max-steps %d "
             "--checkpoint-dir %s/ck --checkpoint-every %d --out %s/part1",
             env, tt_bin(), n, tt_bin(), data, common, flags, resume_at, dir, 1 + (int)tt_rnd(4), dir);
    snprintf(cmd2, sizeof cmd2, "%s %s run -n %d --raw-stdout -- %s train --data %s %s %s --checkpoint-dir %s/ck "
             "--resume --out %s/dp",
             env2, tt_bin(), n2, tt_bin(), data, common, flags2, dir, dir);
    n_resumed++;
    ok = workers_run("first part", cmd, 120, "part1", 0, resume_at, 0, tol, NULL, NULL) &&
         workers_run("resumed", cmd2, 120, "dp", resume_at, steps, 1, tol, NULL, NULL);
  }
  if (!ok)
    goto done;
  /* the model the workers saved evaluates as their summary said, in other batches and threads */
  char ev[4096];
  snprintf(ev, sizeof ev, "%s eval --model-file %s/dp/model.safetensors --data %s --batch %d --threads %d --json",
           tt_bin(), dir, data, 1 + (int)tt_rnd(60), 1 + (int)tt_rnd(2));
  r = tt_run(dir, 120, "%s", ev);
  ok = run_ok("dtrain eval", &r, ev);
  if (ok) {
    double a = tt_json_num(r.out, "test_loss"), b = dp_test_loss;
    if (!(fabs(a - b) <= 1e-5 * fabs(b) + 1e-7)) {
      fprintf(stderr, "dtrain eval: test_loss %.9g, the workers' summary %.9g\n", a, b);
      ok = 0;
    }
  }
  tt_result_free(&r);
  if (!ok)
    goto done;
  passed = 1;
done:
  free(ref_summary);
  ref_summary = NULL;
  for (int k = 0; k < NNOISE; k++) {
    free(noise_summary[k]);
    noise_summary[k] = NULL;
  }
  if (passed)
    return 1;
  fprintf(stderr, "case seed %u failed (noise floor: loss %.3g, parameters %.3g)\n  one worker: $ %s\n"
          "  workers: $ %s\n", seed, floor_loss[steps < 64 ? steps : 63], floor_params, ref, cmd);
  if (cmd2[0])
    fprintf(stderr, "  resumed: $ %s\n", cmd2);
  return 0;
}

int main(int argc, char **argv) {
  int cases = argc > 1 ? atoi(argv[1]) : 20;
  unsigned seed = argc > 2 ? (unsigned)strtoul(argv[2], NULL, 10) : 1;
  mpirun = argc > 3 ? argv[3] : NULL;
  tt_scratch(dir, sizeof dir, "trainrand");
  snprintf(data_big, sizeof data_big, "%s/data", dir);
  CHECK(mkdir(data_big, 0777) == 0, "mkdir %s", data_big);
  tt_make_dataset(data_big, 203, 50);
  snprintf(small, sizeof small, "%s/small", dir);
  CHECK(mkdir(small, 0777) == 0, "mkdir %s", small);
  tt_make_dataset(small, 37, 7);
  snprintf(fmnist, sizeof fmnist, "%s/fmnist", dir);
  CHECK(mkdir(fmnist, 0777) == 0, "mkdir %s", fmnist);
  if (!copy_split("train", N_FMNIST) || !copy_split("t10k", N_FMNIST / 6)) {
    fprintf(stderr, "note: no Fashion-MNIST in " FMNIST ": the real-image cases are not drawn\n");
    fmnist[0] = '\0';
  }
  int bad = 0, diverged = 0;
  for (int i = 0; i < cases + diverged; i++) {
    char rm[8192];
    snprintf(rm, sizeof rm, "rm -rf '%s/ref' '%s'/ref? '%s/dp' '%s/part1' '%s/ck' '%s'/host? '%s'/agent?.*", dir, dir,
             dir, dir, dir, dir, dir);
    CHECK(system(rm) == 0, "%s", rm);
    int rc = one_case(seed + (unsigned)i);
    bad += rc == 0;
    diverged += rc < 0;
  }
  fprintf(stderr, "%d plain, %d under mpirun, %d resumed on other workers, %d with faults (%d fired, %d restarts), "
          "three hosts: %d with a host lost, %d with the store's host lost, %d with a host back, %d with an agent "
          "stopped\n", n_plain, n_mpi, n_resumed, n_faulty, n_fired, n_restarts, n_hosts[H_LOST], n_hosts[H_STORE],
          n_hosts[H_REJOIN], n_hosts[H_STOPPED]);
  fprintf(stderr, "%d of %d cases differ (%d more drawn where one worker's training diverged)\n", bad, cases,
          diverged);
  if (!bad)
    tt_rmrf(dir);
  return bad ? 1 : 0;
}
