/* trainer.c - the training loop and its data parallelism (see dtrain/train.h).
 *
 * One step: take this rank's shard of the next global batch from the prefetching loader, split
 * it into `accumulate` micro-batches, forward + backward each with loss scale
 * (micro-batch samples / global batch samples), so that the SUM over ranks and micro-batches of
 * the gradients is the gradient of the global-batch mean loss. During the last micro-batch's
 * backward the gradient hook starts bucket allreduces (SUM, in place in the gradient arena, no
 * bucket buffers) on the communicator's progress thread as soon as backward has finished that
 * prefix of the gradient buffer (dtrain/nn.h lays parameters out in reverse layer order for
 * exactly this). After backward, the step starts the rest, waits for the buckets and the loss,
 * clips, and takes the optimizer step. Nothing is allocated inside a step (the communicator
 * allocates its own request records).
 *
 * Buckets end only at layer ends, once they hold at least bucket_bytes (default 1 MiB): `mlp`
 * makes two per step, fc3+fc2 (4.2 MB, started while fc1's backward runs) and fc1 (3.2 MB,
 * after backward); `cnn` makes fc2+fc1 (6.4 MB) and conv2+conv1 (0.2 MB). The first version
 * cut the buffer every 1 MiB instead: 8 gradient calls + the loss per `mlp` step, and with
 * `dtrain run -n 2 -- dtrain train --model mlp --threads 1 --max-steps 300` on the 2-core guest
 * the job made 27-30 k context switches against 17-19 k now (perf stat; the machine was too
 * loaded by other jobs for the wall times to tell the two apart). Every call is one more
 * rendezvous of the ranks, and when the progress thread shares a core with the compute thread
 * each rendezvous costs a run-queue wait (perf sched: about 0.2 ms per wake-up).
 *
 * ZeRO-1 (--zero 1, "sharded optimizer" below): the same buckets are reduce-scattered instead,
 * each rank updates only its block of each bucket, and the blocks are allgathered. Where the
 * workers share memory ("one copy per host"), nothing is sent at all: they work on one copy of
 * the parameters, and each sums its blocks of everyone's gradients as it updates them.
 *
 * Not here: model files and checkpoints (train_io.c), metrics files and progress display
 * (monitor), process launching (cli/run.c). */
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm/comm.h"
#include "core/core.h"
#include "dtrain/fault.h"
#include "nn/nn.h" /* dt__nn_gemm_name: whether deferring pays */
#include "parallel/train_internal.h"

typedef struct trainer {
  const dt_train_config *cfg;
  const dt_train_observer *obs;
  dt_comm *comm;
  int rank, world;
  dt_dataset train, test;
  dt_model *model;
  dt_optim *optim;
  dt_lr_schedule sched;
  dt_loader *loader, *eval_loader;
  int micro_max;               /* largest micro-batch a rank trains on */
  /* buckets of this step: request i is planned bucket i (ar_end without ZeRO, bk_* with it) */
  size_t bucket_min;           /* bytes a bucket holds at least */
  size_t maxreqs, nreqs;       /* requests room, and started this step */
  dt_request **reqs;
  size_t nar, *ar_end;         /* planned allreduce buckets (no ZeRO): i sums [ar_lo(i), ar_end[i]) */
  int armed;                   /* the hook starts buckets (last micro-batch, world > 1) */
  dt_status hook_rc;           /* first failure inside the hook */
  int64_t first_start_ns;      /* when the step's first bucket started */
  double loss_buf[1];
  dt_request *loss_req;
  /* ZeRO-1, see "sharded optimizer" */
  int zero;                    /* sharded optimizer: world > 1 and cfg->zero 1, or auto on shm */
  size_t nbk;                  /* planned buckets */
  size_t *bk_lo, *bk_c;        /* bucket b: floats [bk_lo, bk_lo + world * bk_c), block r of
                                * bk_c floats is rank r's; the reduce-scatter leaves rank r's
                                * summed block at grads + bk_lo */
  size_t tail_lo;              /* [tail_lo, param_count): summed with the loss, every rank's */
  double *small;               /* loss, sum of squares, tail: one f64 allreduce per step */
  dt_request **ag;             /* this step's parameter allgathers, one per bucket */
  /* one copy per host (shm window): every rank's gradient arena, block sources, clip factor */
  int shared;                  /* set by share_memory */
  float **grads_of;            /* [n]: rank q's gradients */
  const float **blk;           /* [n]: this rank's block of one bucket in each */
  const float **ex_of;         /* [n]: rank q's export, when linear weight gradients are deferred
                                * (dt_model_defer_linear_grads; NULL: not deferred) */
  float clip_f;
  int64_t rs_span_ns, ag_span_ns, ag_wait_ns; /* this step's collectives in flight; waiting */
  int ckpt_lock;               /* rank 0: the checkpoint directory's lock (-1: none) */
  uint64_t train_crc, test_crc; /* data_crc of each set (load_data) */
  char train_id[64];           /* the training set as checkpoints record it */
  int refused_by_root;         /* this rank stops because rank 0 refused the start (see share_start) */
} trainer;

void dt_train_config_init(dt_train_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->model = "mlp";
  cfg->epochs = 1;
  cfg->global_batch = 128;
  cfg->eval_batch = 1000;
  cfg->accumulate = 1;
  cfg->optim = dt_optim_defaults(DT_OPTIM_SGD);
  cfg->lr = 0.05f;
  cfg->seed = 42;
  cfg->checkpoint_every = 0;
  cfg->bucket_bytes = DT_TRAIN_DEFAULT_BUCKET;
  cfg->log_interval = 10;
  cfg->zero = DT_TRAIN_ZERO_AUTO;
}

/* ---- buckets ----------------------------------------------------------------------------
 *
 * A bucket is a range of layers' gradients that holds at least bucket_bytes (the last one: what
 * is left), planned once from the ranges the hook will report (dt_model_grad_segments): the
 * hook starts each bucket as soon as backward has finished it, and finish_allreduce starts the
 * rest. The plan, not the hook, decides where buckets end, because a rank may run no backward
 * in a step, or none in its last micro-batch (fewer samples than ranks or than --accumulate):
 * its hook never runs, yet it must call the same allreduces as every other rank. Buckets never
 * end inside a layer: a layer's gradient becomes final all at once (the hook runs per layer),
 * so cutting it would only add calls, each one more rendezvous of the ranks and one more
 * wake-up of the progress thread, while one call already pipelines its chunks inside the
 * transport. Each bucket is summed in place in the gradient arena. */

static size_t ar_lo(const trainer *t, size_t i) { return i ? t->ar_end[i - 1] : 0; }

/* Starts the allreduce of the next planned bucket. */
static void start_bucket(trainer *t) {
  float *g = dt_model_grads(t->model);
  size_t i = t->nreqs, lo = ar_lo(t, i), hi = t->ar_end[i];
  if (i == 0)
    t->first_start_ns = dt_now_ns();
  t->nreqs++;
  dt_status rc = dt_comm_iallreduce(t->comm, DT_IN_PLACE, g + lo, hi - lo, DT_F32, DT_SUM, &t->reqs[i]);
  if (rc != DT_OK) {
    t->reqs[i] = NULL;
    if (t->hook_rc == DT_OK)
      t->hook_rc = dt__error_prefix(rc, "gradient bucket %zu (floats %zu..%zu)", i, lo, hi);
  }
}

static void start_block_sum(trainer *t);

/* Called by backward after each parameterized layer: [0, off + count) is final. */
static void grad_hook(void *ctx, size_t off, size_t count) {
  trainer *t = ctx;
  if (!t->armed || t->hook_rc != DT_OK)
    return;
  size_t done = off + count;
  if (t->zero) {
    while (t->hook_rc == DT_OK && t->nreqs < t->nbk &&
           t->bk_lo[t->nreqs] + (size_t)t->world * t->bk_c[t->nreqs] <= done)
      start_block_sum(t);
    return;
  }
  while (t->hook_rc == DT_OK && t->nreqs < t->nar && t->ar_end[t->nreqs] <= done)
    start_bucket(t);
}

static dt_status setup_buckets(trainer *t) {
  size_t np = dt_model_param_count(t->model), nseg = dt_model_grad_segments(t->model, NULL, 0);
  /* at most one bucket per layer plus the remainder, whether planned here or by setup_zero */
  t->maxreqs = DT_MAX(nseg, t->nbk) + 1;
  t->reqs = dt__calloc(t->maxreqs * sizeof(dt_request *));
  t->ar_end = dt__calloc(t->maxreqs * sizeof(size_t));
  if (!t->reqs || !t->ar_end)
    return dt__error_prefix(DT_ERR_NOMEM, "%zu allreduce requests", t->maxreqs);
  if (t->zero)
    return DT_OK;
  /* the layer ends, in the order backward finishes them, kept in place where a bucket ends */
  dt_model_grad_segments(t->model, t->ar_end, nseg);
  size_t started = 0;
  t->nar = 0;
  for (size_t i = 0; i < nseg && t->ar_end[i] < np; i++)
    if ((t->ar_end[i] - started) * sizeof(float) >= t->bucket_min)
      started = t->ar_end[t->nar++] = t->ar_end[i];
  t->ar_end[t->nar++] = np;
  return DT_OK;
}

/* Starts what the hook did not, then the loss sum, and waits for all of them. The progress
 * thread runs calls in order, so the loss sum (queued last) completes last: waiting for it
 * first sleeps once, where waiting in order woke this thread once per finished bucket only
 * to sleep again. The buckets are then collected in order (already done) for their status. */
static dt_status finish_allreduce(trainer *t) {
  dt_status rc = t->hook_rc;
  t->armed = 0;
  while (rc == DT_OK && t->nreqs < t->nar) {
    start_bucket(t);
    rc = t->hook_rc;
  }
  if (rc == DT_OK)
    rc = dt_comm_iallreduce(t->comm, DT_IN_PLACE, t->loss_buf, 1, DT_F64, DT_SUM, &t->loss_req);
  else
    t->loss_req = NULL;
  dt_status loss_rc = DT_OK;
  char loss_err[256] = "";
  if (t->loss_req) {
    loss_rc = dt_request_wait(t->loss_req);
    t->loss_req = NULL;
    if (loss_rc != DT_OK) /* a bucket's failure, found next, is the one to report */
      snprintf(loss_err, sizeof loss_err, "%s", dt_last_error());
  }
  for (size_t i = 0; i < t->nreqs; i++) {
    if (!t->reqs[i])
      continue;
    dt_status w = dt_request_wait(t->reqs[i]);
    t->reqs[i] = NULL;
    if (w != DT_OK && rc == DT_OK)
      rc = dt__error_prefix(w, "gradient allreduce, bucket %zu of %zu (floats %zu..%zu)", i, t->nar, ar_lo(t, i),
                            t->ar_end[i]);
  }
  if (loss_rc != DT_OK && rc == DT_OK)
    rc = dt_set_error(loss_rc, "loss allreduce: %s", loss_err);
  t->nreqs = 0;
  t->hook_rc = DT_OK;
  return rc;
}

/* ---- sharded optimizer (ZeRO-1) -----------------------------------------------------------
 *
 * The buckets are planned once, before the first step, from the ranges the hook will report
 * (dt_model_grad_segments) by the same rule as above, with one change: reduce_scatter needs
 * the same count from every rank, so a bucket [lo, e) becomes world blocks of c floats, c the
 * largest multiple of 16 with world * c <= e - lo, and the few floats left over (fewer than
 * 16 * world) start the next bucket instead. Every block then begins on a 16-float (64-byte)
 * boundary of the arenas: no rank's block shares a cache line with another's, and the update
 * loops run on aligned vectors. Only the last bucket's remainder, the tail, has no next bucket;
 * it travels with the loss (and the clipping norm's sum of squares) in the one small f64
 * allreduce a step makes anyway, and every rank updates it (fewer than 16 * world floats of
 * state kept everywhere). In f64 the tail's sum of two ranks' floats rounds exactly as f32's.
 *
 * A step: the hook starts each bucket's reduce-scatter (in place: rank r's summed block lands at
 * the bucket's start) once backward has finished it; after backward the rest are started and all
 * are waited for; the small allreduce sums [loss, sum of squares of the owned blocks, tail];
 * clipping scales the owned blocks and the tail by dt_clip_factor of the global sum; then each
 * block is updated and its allgather started at once (in place: the updated block already sits
 * at its slot), so the progress thread sends block b while this thread updates block b + 1, and
 * the step ends when every allgather is done: the next forward needs every parameter.
 *
 * Memory: optimizer state for (1/world of the buckets) + tail instead of everything: mlp with
 * momentum on 2 workers keeps 3.75 MB of momentum per rank instead of 7.5 MB. Checkpoints
 * gather the shards to rank 0 (the file holds the whole state, as without ZeRO), and a resume
 * scatters them again, so neither the file nor a resume depends on --zero or on the world. */

static void plan_add(trainer *t, size_t *started, size_t hi) {
  size_t lo = *started, c = ((hi - lo) / (size_t)t->world) & ~(size_t)15;
  if (c == 0)
    return;
  t->bk_lo[t->nbk] = lo;
  t->bk_c[t->nbk] = c;
  t->nbk++;
  *started = lo + (size_t)t->world * c;
}

static dt_status setup_zero(trainer *t) {
  size_t np = dt_model_param_count(t->model);
  size_t nseg = dt_model_grad_segments(t->model, NULL, 0);
  size_t *ends = dt__alloc((nseg + 1) * sizeof(size_t));
  t->bk_lo = dt__calloc((nseg + 1) * sizeof(size_t));
  t->bk_c = dt__calloc((nseg + 1) * sizeof(size_t));
  t->ag = dt__calloc((nseg + 1) * sizeof(dt_request *));
  t->small = dt__calloc((2 + 16 * (size_t)t->world) * sizeof(double));
  if (!ends || !t->bk_lo || !t->bk_c || !t->ag || !t->small) {
    dt__free(ends);
    return dt__error_prefix(DT_ERR_NOMEM, "ZeRO bucket plan (%zu layers)", nseg);
  }
  dt_model_grad_segments(t->model, ends, nseg);
  size_t started = 0;
  for (size_t i = 0; i < nseg && ends[i] < np; i++)
    if ((ends[i] - started) * sizeof(float) >= t->bucket_min)
      plan_add(t, &started, ends[i]);
  if (started < np)
    plan_add(t, &started, np);
  t->tail_lo = started;
  dt__free(ends);
  /* the optimizer: this rank's block of every bucket, then the tail */
  dt_param_range *own = dt__alloc((t->nbk + 1) * sizeof *own);
  if (!own)
    return dt__error_prefix(DT_ERR_NOMEM, "ZeRO ranges (%zu buckets)", t->nbk);
  size_t n = 0;
  for (size_t b = 0; b < t->nbk; b++) {
    size_t lo = t->bk_lo[b] + (size_t)t->rank * t->bk_c[b];
    own[n++] = (dt_param_range){lo, lo + t->bk_c[b]};
  }
  if (t->tail_lo < np)
    own[n++] = (dt_param_range){t->tail_lo, np};
  dt_status rc = dt_optim_create_ranges(&t->cfg->optim, t->model, own, n, &t->optim);
  dt__free(own);
  if (rc == DT_OK && t->rank == 0)
    DT_LOG_DEBUG("ZeRO-1: %zu bucket(s) over %zu floats, tail %zu floats, %zu floats of state "
                 "per buffer on rank 0", t->nbk, t->tail_lo, np - t->tail_lo,
                 dt_optim_state_size(t->optim));
  return rc;
}

/* Starts the reduce-scatter of the next planned bucket. */
static void start_block_sum(trainer *t) {
  size_t b = t->nreqs, lo = t->bk_lo[b];
  if (b == 0)
    t->first_start_ns = dt_now_ns();
  t->nreqs++;
  dt_status rc = dt_comm_ireduce_scatter(t->comm, DT_IN_PLACE, dt_model_grads(t->model) + lo,
                                         t->bk_c[b], DT_F32, DT_SUM, &t->reqs[b]);
  if (rc != DT_OK) {
    t->reqs[b] = NULL;
    if (t->hook_rc == DT_OK)
      t->hook_rc = dt__error_prefix(rc, "gradient bucket %zu (reduce-scatter of floats %zu..%zu)",
                                    b, lo, lo + (size_t)t->world * t->bk_c[b]);
  }
}

static size_t tail_count(const trainer *t) { return dt_model_param_count(t->model) - t->tail_lo; }

/* Waits for the per-bucket requests reqs[0 .. n) still in flight, last first (the progress
 * thread runs them in order, so this thread sleeps once), and clears them. Returns rc, or the
 * first failure found, named as `what` of its bucket, when rc is DT_OK. */
static dt_status wait_blocks(trainer *t, dt_request **reqs, size_t n, const char *what, dt_status rc) {
  for (size_t k = n; k-- > 0;) {
    if (!reqs[k])
      continue;
    dt_status w = dt_request_wait(reqs[k]);
    reqs[k] = NULL;
    if (w != DT_OK && rc == DT_OK)
      rc = dt__error_prefix(w, "%s, bucket %zu of %zu (floats %zu..%zu)", what, k, t->nbk, t->bk_lo[k],
                            t->bk_lo[k] + (size_t)t->world * t->bk_c[k]);
  }
  return rc;
}

/* After backward: starts the buckets the hook did not, waits for all, sums loss, squares and
 * tail across ranks and clips. Afterwards grads + bk_lo[b] holds this rank's summed block of
 * bucket b and grads + tail_lo the summed tail. */
static dt_status finish_block_sums(trainer *t, double wloss, double *loss) {
  dt_status rc = t->hook_rc;
  t->armed = 0;
  while (rc == DT_OK && t->nreqs < t->nbk) {
    start_block_sum(t);
    rc = t->hook_rc;
  }
  rc = wait_blocks(t, t->reqs, t->nreqs, "gradient reduce-scatter", rc);
  t->rs_span_ns = t->nreqs ? dt_now_ns() - t->first_start_ns : 0;
  t->nreqs = 0;
  t->hook_rc = DT_OK;
  if (rc != DT_OK)
    return rc;
  float *g = dt_model_grads(t->model);
  size_t tail = tail_count(t);
  double sq = 0;
  if (t->cfg->clip > 0)
    for (size_t b = 0; b < t->nbk; b++)
      sq += dt_grad_sumsq(g + t->bk_lo[b], t->bk_c[b]);
  t->small[0] = wloss;
  t->small[1] = sq;
  for (size_t k = 0; k < tail; k++)
    t->small[2 + k] = g[t->tail_lo + k];
  rc = dt_comm_allreduce(t->comm, DT_IN_PLACE, t->small, 2 + tail, DT_F64, DT_SUM);
  if (rc != DT_OK)
    return dt__error_prefix(rc, "loss, norm and gradient tail allreduce (%zu floats)", tail);
  *loss = t->small[0];
  for (size_t k = 0; k < tail; k++)
    g[t->tail_lo + k] = (float)t->small[2 + k];
  if (t->cfg->clip > 0) {
    /* the tail's squares from its f32 values, as dt_clip_grad_norm would see them */
    float f = dt_clip_factor(t->small[1] + dt_grad_sumsq(g + t->tail_lo, tail), t->cfg->clip);
    if (f != 1.0f) {
      for (size_t b = 0; b < t->nbk; b++)
        for (size_t i = 0; i < t->bk_c[b]; i++)
          g[t->bk_lo[b] + i] *= f;
      for (size_t k = 0; k < tail; k++)
        g[t->tail_lo + k] *= f;
    }
  }
  return DT_OK;
}


/* Updates this rank's blocks (each allgathered as soon as it is updated) and the tail. */
static dt_status update_blocks(trainer *t, float lr) {
  DT_CHECK(dt_optim_begin_step(t->optim, lr));
  float *p = dt_model_params(t->model), *g = dt_model_grads(t->model);
  dt_status rc = DT_OK;
  int64_t a0 = dt_now_ns();
  for (size_t b = 0; b < t->nbk && rc == DT_OK; b++) {
    rc = dt_optim_step_range(t->optim, b, g + t->bk_lo[b]);
    if (b == 0)
      a0 = dt_now_ns();
    if (rc == DT_OK) {
      rc = dt_comm_iallgather(t->comm, DT_IN_PLACE, p + t->bk_lo[b], t->bk_c[b], DT_F32, &t->ag[b]);
      if (rc != DT_OK) {
        t->ag[b] = NULL;
        rc = dt__error_prefix(rc, "parameter allgather, bucket %zu", b);
      }
    }
  }
  if (rc == DT_OK && tail_count(t) > 0)
    rc = dt_optim_step_range(t->optim, t->nbk, g + t->tail_lo);
  int64_t w0 = dt_now_ns();
  rc = wait_blocks(t, t->ag, t->nbk, "parameter allgather", rc);
  t->ag_wait_ns = dt_now_ns() - w0;
  t->ag_span_ns = dt_now_ns() - a0;
  return rc;
}

/* ---- one copy per host ---------------------------------------------------------------------
 *
 * Where the workers share a window (share_memory), it holds the one copy of the parameters that
 * every worker's model uses, and every worker's gradients, where the others can read them. Then
 * a step sends nothing:
 *   - after backward the workers sum the loss and the tail in the one small f64 allreduce, whose
 *     completion also says that every worker's backward is done and its gradients are in place;
 *   - each worker updates its blocks of the one copy from the sum over workers of their
 *     gradients, in rank order, added up a few KiB at a time inside the update
 *     (dt_optim_step_range_sum) and never written out; rank 0 alone updates the tail;
 *   - a barrier ends the step: nobody reads a parameter of the next step before every block is
 *     written, nor overwrites its gradients (next backward) while another may still read them.
 * Against reduce-scatter + allgather in the window, no summed block is written out and read
 * back, nothing is copied to the others, and the ranks meet twice a step instead of five times
 * (mlp). --clip needs the global norm first: one more pass summing the blocks for their squares,
 * and one more f64 allreduce. With 2 workers every sum is the reduce-scatter's, bit for bit. */

/* Points blk at this rank's block of bucket b in every rank's gradients. */
static void block_sources(trainer *t, size_t b) {
  size_t lo = t->bk_lo[b] + (size_t)t->rank * t->bk_c[b];
  for (int q = 0; q < t->world; q++)
    t->blk[q] = t->grads_of[q] + lo;
}

/* After backward: sums loss and tail across ranks (every rank's gradients are then final) and,
 * with --clip, the squares, setting clip_f. */
static dt_status finish_shared(trainer *t, double wloss, double *loss) {
  float *g = dt_model_grads(t->model);
  size_t tail = tail_count(t);
  t->small[0] = wloss;
  t->small[1] = 0;
  if (t->ex_of) /* deferred weights in the tail: this rank's own part, summed below */
    for (size_t a = t->tail_lo, np = t->tail_lo + tail; a < np;) {
      float *d;
      size_t k = dt_model_deferred_grad(t->model, &t->ex_of[t->rank], 1, a, np, &d);
      if (d)
        memcpy(g + a, d, k * sizeof(float));
      a += k;
    }
  for (size_t k = 0; k < tail; k++)
    t->small[2 + k] = g[t->tail_lo + k];
  dt_status rc = dt_comm_allreduce(t->comm, DT_IN_PLACE, t->small, 2 + tail, DT_F64, DT_SUM);
  if (rc != DT_OK)
    return dt__error_prefix(rc, "loss and gradient tail allreduce (%zu floats)", tail);
  *loss = t->small[0];
  for (size_t k = 0; k < tail; k++)
    g[t->tail_lo + k] = (float)t->small[2 + k];
  t->clip_f = 1.0f;
  if (t->cfg->clip > 0) {
    double sq = 0; /* per block, as finish_block_sums adds them */
    for (size_t b = 0; b < t->nbk; b++) {
      block_sources(t, b);
      sq += dt_grad_sumsq_of_sum(t->blk, t->world, t->bk_c[b]);
    }
    rc = dt_comm_allreduce(t->comm, DT_IN_PLACE, &sq, 1, DT_F64, DT_SUM);
    if (rc != DT_OK)
      return dt__error_prefix(rc, "gradient norm allreduce");
    t->clip_f = dt_clip_factor(sq + dt_grad_sumsq(g + t->tail_lo, tail), t->cfg->clip);
    if (t->clip_f != 1.0f)
      for (size_t k = 0; k < tail; k++)
        g[t->tail_lo + k] *= t->clip_f;
  }
  return DT_OK;
}

/* Updates this rank's blocks of the one copy from everyone's gradients, rank 0 the tail, and
 * waits for every rank to have done so. */
static dt_status update_shared(trainer *t, float lr) {
  DT_CHECK(dt_optim_begin_step(t->optim, lr));
  dt_status rc = DT_OK;
  for (size_t b = 0; b < t->nbk && rc == DT_OK; b++) {
    block_sources(t, b);
    rc = t->ex_of ? dt_optim_step_range_deferred(t->optim, b, t->blk, t->ex_of, t->world, t->clip_f)
                  : dt_optim_step_range_sum(t->optim, b, t->blk, t->world, t->clip_f);
  }
  if (rc == DT_OK && tail_count(t) > 0 && t->rank == 0)
    rc = dt_optim_step_range(t->optim, t->nbk, dt_model_grads(t->model) + t->tail_lo);
  int64_t w0 = dt_now_ns();
  if (rc == DT_OK && (rc = dt_comm_barrier(t->comm)) != DT_OK)
    rc = dt__error_prefix(rc, "waiting for every rank's parameter update");
  t->ag_wait_ns = dt_now_ns() - w0;
  return rc;
}

/* The whole optimizer state for a checkpoint: gathered to rank 0 (into *st's buffers, which it
 * allocates; other ranks get none) when sharded, else the optimizer's own buffers. Collective
 * when sharded. Release with state_release. */
static void state_release(trainer *t, dt__train_state *st) {
  if (t->zero)
    for (size_t i = 0; i < st->n; i++)
      dt__free(st->buf[i]);
  memset(st, 0, sizeof *st);
}

static dt_status state_whole(trainer *t, dt__train_state *st, int alloc_on_root) {
  memset(st, 0, sizeof *st);
  st->n = dt_optim_state_count(t->optim);
  for (size_t i = 0; i < st->n; i++) {
    float *own = dt_optim_state(t->optim, i, &st->name[i]);
    if (!t->zero) {
      st->buf[i] = own;
    } else if (t->rank == 0 && alloc_on_root) {
      st->buf[i] = dt__alloc(dt_model_param_count(t->model) * sizeof(float));
      if (!st->buf[i]) {
        state_release(t, st);
        return dt__error_prefix(DT_ERR_NOMEM, "optimizer state %zu for a checkpoint (%zu floats)", i,
                                dt_model_param_count(t->model));
      }
    }
  }
  return DT_OK;
}

static dt_status gather_state(trainer *t, dt__train_state *st) {
  for (size_t i = 0; i < st->n; i++) {
    float *own = dt_optim_state(t->optim, i, NULL);
    for (size_t b = 0; b < t->nbk; b++) {
      dt_status rc = dt_comm_gather(t->comm, own + dt_optim_state_offset(t->optim, b),
                                    t->rank == 0 ? st->buf[i] + t->bk_lo[b] : NULL, t->bk_c[b],
                                    DT_F32, 0);
      if (rc != DT_OK)
        return dt__error_prefix(rc, "gathering optimizer state %s, bucket %zu, for a checkpoint",
                                st->name[i], b);
    }
    if (t->rank == 0 && tail_count(t) > 0)
      memcpy(st->buf[i] + t->tail_lo, own + dt_optim_state_offset(t->optim, t->nbk),
             tail_count(t) * sizeof(float));
  }
  return DT_OK;
}

/* The reverse after a resume: rank 0's whole buffers to every rank's shard. */
static dt_status scatter_state(trainer *t, const dt__train_state *st) {
  for (size_t i = 0; i < st->n; i++) {
    float *own = dt_optim_state(t->optim, i, NULL);
    for (size_t b = 0; b < t->nbk; b++) {
      dt_status rc = dt_comm_scatter(t->comm, t->rank == 0 ? st->buf[i] + t->bk_lo[b] : NULL,
                                     own + dt_optim_state_offset(t->optim, b), t->bk_c[b], DT_F32, 0);
      if (rc != DT_OK)
        return dt__error_prefix(rc, "scattering optimizer state %s, bucket %zu", st->name[i], b);
    }
    float *tail = own + dt_optim_state_offset(t->optim, t->nbk);
    if (t->rank == 0 && tail_count(t) > 0)
      memcpy(tail, st->buf[i] + t->tail_lo, tail_count(t) * sizeof(float));
    dt_status rc = dt_comm_broadcast(t->comm, tail, tail_count(t), DT_F32, 0);
    if (rc != DT_OK)
      return dt__error_prefix(rc, "broadcasting optimizer state %s (tail)", st->name[i]);
  }
  return DT_OK;
}

/* ---- settings check --------------------------------------------------------------------- */

static uint64_t fnv1a(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; s && *s; s++)
    h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static uint64_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

typedef enum { FP_INT, FP_FLOAT, FP_HASH, FP_OPTIMIZER, FP_ZERO_MODE, FP_CRC } fp_kind;
typedef struct fp_field {
  const char *name;
  fp_kind kind;
} fp_field;

static const fp_field fp_fields[] = {
    {"--model (canonical spec)", FP_HASH}, {"--batch (global)", FP_INT}, {"--seed", FP_INT},
    {"training set size", FP_INT}, {"test set size", FP_INT}, {"--optimizer", FP_OPTIMIZER},
    {"--lr", FP_FLOAT}, {"--momentum", FP_FLOAT}, {"--nesterov", FP_INT},
    {"--weight-decay", FP_FLOAT}, {"--accumulate", FP_INT}, {"--epochs", FP_INT},
    {"--max-steps", FP_INT}, {"--clip", FP_FLOAT}, {"--schedule", FP_HASH},
    {"--eval-batch", FP_INT}, {"--checkpoint-every", FP_INT}, {"--resume", FP_INT},
    {"--bucket-size", FP_INT}, {"parameter count", FP_INT}, {"--checkpoint-dir", FP_HASH},
    {"--zero", FP_ZERO_MODE}, {"training set (CRC32C of its images and labels)", FP_CRC},
    {"test set (CRC32C of its images and labels)", FP_CRC},
};
#define FP_N (sizeof fp_fields / sizeof fp_fields[0])
#define FP_TEXT 200 /* bytes of a hashed setting's text shown in the mismatch message */

/* Ranks that read other data (another copy of the files, changed in place) would train on
 * different batches without a word; the sizes alone miss that. CRC32C (SSE4.2) took 7.0 ms for
 * Fashion-MNIST's 47 MB training set on the Intel Xeon guest (a one-off timing of dt_crc32c over
 * a buffer that size, 5 runs, 6.95-7.11 ms), once per run at start. */
static uint64_t data_crc(const dt_dataset *d) {
  uint32_t crc = dt_crc32c(0, d->pixels, (size_t)d->n * (size_t)d->c * (size_t)d->h * (size_t)d->w);
  return dt_crc32c(crc, d->labels, (size_t)d->n * sizeof *d->labels);
}

static void fp_fill(const trainer *t, uint64_t *v) {
  const dt_train_config *c = t->cfg;
  uint64_t x[FP_N] = {
      fnv1a(dt_model_spec(t->model)), (uint64_t)c->global_batch, c->seed, t->train.n, t->test.n,
      (uint64_t)c->optim.kind, fbits(c->lr), fbits(c->optim.momentum), (uint64_t)c->optim.nesterov,
      fbits(c->optim.weight_decay), (uint64_t)c->accumulate, (uint64_t)c->epochs,
      (uint64_t)c->max_steps, fbits(c->clip), fnv1a(c->schedule ? c->schedule : "constant"),
      (uint64_t)c->eval_batch, (uint64_t)c->checkpoint_every, (uint64_t)c->resume,
      (uint64_t)c->bucket_bytes, dt_model_param_count(t->model),
      fnv1a(c->checkpoint_dir ? c->checkpoint_dir : ""), (uint64_t)c->zero, t->train_crc, t->test_crc};
  memcpy(v, x, sizeof x);
}

/* The text behind field i's hash (FP_HASH), for the message when the ranks' hashes differ. */
static const char *fp_text(const trainer *t, size_t i) {
  const dt_train_config *c = t->cfg;
  const char *n = fp_fields[i].name;
  return !strcmp(n, "--schedule")         ? (c->schedule ? c->schedule : "constant")
         : !strcmp(n, "--checkpoint-dir") ? (c->checkpoint_dir ? c->checkpoint_dir : "")
                                          : dt_model_spec(t->model);
}

static void fp_value(char *buf, size_t cap, fp_kind k, uint64_t v) {
  if (k == FP_INT) {
    snprintf(buf, cap, "%llu", (unsigned long long)v);
  } else if (k == FP_OPTIMIZER) {
    snprintf(buf, cap, "%s", v == DT_OPTIM_SGD ? "sgd" : v == DT_OPTIM_ADAMW ? "adamw" : "?");
  } else if (k == FP_CRC) {
    snprintf(buf, cap, "%08llx", (unsigned long long)v);
  } else if (k == FP_ZERO_MODE) {
    snprintf(buf, cap, "%s", (int64_t)v == DT_TRAIN_ZERO_AUTO ? "auto" : v ? "1" : "0");
  } else if (k == FP_FLOAT) {
    uint32_t u = (uint32_t)v;
    float f;
    memcpy(&f, &u, sizeof f);
    snprintf(buf, cap, "%g", (double)f);
  } else {
    snprintf(buf, cap, "hash %016llx", (unsigned long long)v);
  }
}

/* Every rank gathers every rank's settings and compares them with rank 0's, so every rank
 * reaches the same verdict and stops with the same reason; the other ranks word it as rank 0's
 * refusal ("rank 0 refused to start: ..."), as for a refused resume (share_start), so a
 * launcher that hears of them first still names rank 0 and its reason. */
static dt_status check_settings(trainer *t) {
  uint64_t mine[FP_N];
  fp_fill(t, mine);
  uint64_t *all = dt__alloc(sizeof mine * (size_t)t->world);
  if (!all)
    return dt__error_prefix(DT_ERR_NOMEM, "settings of %d ranks", t->world);
  dt_status rc = dt_comm_allgather(t->comm, mine, all, FP_N, DT_I64);
  if (rc != DT_OK) {
    dt__free(all);
    return dt__error_prefix(rc, "comparing settings across ranks");
  }
  for (int r = 1; r < t->world; r++)
    for (size_t i = 0; i < FP_N; i++) {
      uint64_t a = all[i], b = all[(size_t)r * FP_N + i];
      if (a == b)
        continue;
      char va[FP_TEXT + 8], vb[FP_TEXT + 8];
      fp_value(va, sizeof va, fp_fields[i].kind, a);
      fp_value(vb, sizeof vb, fp_fields[i].kind, b);
      dt__free(all);
      /* a hash names nothing: every rank reached this same field, so all trade the text */
      char *txt = fp_fields[i].kind == FP_HASH ? dt__calloc((size_t)t->world * FP_TEXT) : NULL;
      if (txt) {
        char own[FP_TEXT] = "";
        snprintf(own, sizeof own, "%s", fp_text(t, i));
        if (dt_comm_allgather(t->comm, own, txt, FP_TEXT, DT_U8) == DT_OK) {
          snprintf(va, sizeof va, "'%.*s'", FP_TEXT - 1, txt);
          snprintf(vb, sizeof vb, "'%.*s'", FP_TEXT - 1, txt + (size_t)r * FP_TEXT);
        }
        dt__free(txt);
      }
      return dt_set_error(DT_ERR_MISMATCH,
                          "%srank %d was started with a different %s: %s on rank %d, %s on rank 0 "
                          "(every rank must get the same settings)",
                          t->rank ? "rank 0 refused to start: " : "", r, fp_fields[i].name, vb, r, va);
    }
  dt__free(all);
  return DT_OK;
}

/* ---- evaluation --------------------------------------------------------------------------- */

/* One pass over the test set, split across ranks; sums combined with an allreduce. */
static dt_status evaluate(trainer *t, double *loss, double *acc) {
  double sums[2] = {0, 0}; /* loss sum, correct */
  int maxb = dt_model_max_batch(t->model);
  size_t in = dt_model_input_size(t->model);
  for (;;) {
    dt_batch b;
    DT_CHECK(dt_loader_next(t->eval_loader, &b));
    for (uint64_t off = 0; off < b.n; off += (uint64_t)maxb) {
      int n = (int)DT_MIN((uint64_t)maxb, b.n - off);
      int64_t correct = 0;
      DT_CHECK(dt_model_eval_batch(t->model, b.x + off * in, b.y + off, n, &sums[0], &correct));
      sums[1] += (double)correct;
    }
    if (b.last_in_epoch)
      break;
  }
  if (t->world > 1) {
    dt_status rc = dt_comm_allreduce(t->comm, DT_IN_PLACE, sums, 2, DT_F64, DT_SUM);
    if (rc != DT_OK)
      return dt__error_prefix(rc, "evaluation allreduce");
  }
  *loss = sums[0] / (double)t->test.n;
  *acc = sums[1] / (double)t->test.n;
  return DT_OK;
}

/* ---- setup -------------------------------------------------------------------------------- */

static dt_status check_config(const dt_train_config *c) {
  if (c->epochs < 1)
    return dt_set_error(DT_ERR_INVALID, "epochs %d must be >= 1", c->epochs);
  if (c->global_batch < 1)
    return dt_set_error(DT_ERR_INVALID, "global batch %d must be >= 1", c->global_batch);
  if (c->eval_batch < 0)
    return dt_set_error(DT_ERR_INVALID, "eval batch %d must be >= 1", c->eval_batch);
  if (c->accumulate < 1 || c->accumulate > c->global_batch)
    return dt_set_error(DT_ERR_INVALID, "accumulate %d must be in [1, global batch %d]",
                        c->accumulate, c->global_batch);
  if (!(c->lr >= 0) || !isfinite(c->lr))
    return dt_set_error(DT_ERR_INVALID, "learning rate %g must be >= 0", (double)c->lr);
  /* every step scales each weight by 1 - lr x decay (AdamW; SGD's L2 term alike): from 1 on it
   * flips and grows the weights each step, a run that ends "trained" with a loss of 1e28 */
  if ((double)c->lr * c->optim.weight_decay >= 1.0)
    return dt_set_error(DT_ERR_INVALID, "weight decay %g with learning rate %g: their product must be below 1 (each "
                        "step scales every weight by 1 - lr x decay)", (double)c->optim.weight_decay, (double)c->lr);
  if (c->max_steps < 0)
    return dt_set_error(DT_ERR_INVALID, "max steps %lld must be >= 0", (long long)c->max_steps);
  if (c->checkpoint_every < 0)
    return dt_set_error(DT_ERR_INVALID, "checkpoint every %lld must be >= 0",
                        (long long)c->checkpoint_every);
  if ((c->data_dir && !*c->data_dir) || (c->out_dir && !*c->out_dir) ||
      (c->checkpoint_dir && !*c->checkpoint_dir))
    return dt_set_error(DT_ERR_INVALID, "an empty %s directory name (NULL is the default)",
                        c->data_dir && !*c->data_dir ? "data" : c->out_dir && !*c->out_dir ? "out"
                                                                                    : "checkpoint");
  if (c->resume && !c->checkpoint_dir)
    return dt_set_error(DT_ERR_INVALID, "resume needs a checkpoint directory");
  /* The model is written at the end by renaming a temporary file over OUT/model.safetensors: a
   * directory there would lose the whole run's work then (rename replaces anything else). */
  char mp[4096];
  struct stat mst;
  /* the summary names the model file in a fixed buffer: a longer path would be cut there (and
   * the model written under the cut name); 64 bytes spare for the temporary file's suffix */
  size_t mp_max = sizeof(((dt_train_summary *)0)->model_file) - 64;
  if (c->out_dir && strlen(c->out_dir) + strlen("/model.safetensors") > mp_max)
    return dt_set_error(DT_ERR_INVALID, "out directory path of %zu characters is too long (at most %zu)",
                        strlen(c->out_dir), mp_max - strlen("/model.safetensors"));
  snprintf(mp, sizeof mp, "%s/model.safetensors", c->out_dir ? c->out_dir : "");
  if (c->out_dir && lstat(mp, &mst) == 0 && S_ISDIR(mst.st_mode))
    return dt_set_error(DT_ERR_INVALID, "%s is a directory: the trained model could not be written there", mp);
  if (c->zero != 0 && c->zero != 1 && c->zero != DT_TRAIN_ZERO_AUTO)
    return dt_set_error(DT_ERR_INVALID, "zero %d: the ZeRO stage must be 0 (off), 1 (sharded "
                        "optimizer state) or DT_TRAIN_ZERO_AUTO", c->zero);
  if (c->log_interval < 0)
    return dt_set_error(DT_ERR_INVALID, "log interval %lld must be >= 0", (long long)c->log_interval);
  return DT_OK;
}

static dt_status load_data(trainer *t) {
  const char *dir = t->cfg->data_dir ? t->cfg->data_dir : DT_FASHION_MNIST_DIR;
  DT_CHECK(dt_dataset_load_dir(dir, DT_SPLIT_TRAIN, NULL, &t->train));
  DT_CHECK(dt_dataset_load_dir(dir, DT_SPLIT_TEST, NULL, &t->test));
  return DT_OK;
}

static dt_status build(trainer *t) {
  const dt_train_config *c = t->cfg;
  int world = t->world;
  if ((uint64_t)c->global_batch > t->train.n)
    return dt_set_error(DT_ERR_INVALID, "global batch %d is larger than the training set (%llu samples)",
                        c->global_batch, (unsigned long long)t->train.n);
  int local_max = (c->global_batch + world - 1) / world;
  t->micro_max = (local_max + c->accumulate - 1) / c->accumulate;
  int eval_batch = c->eval_batch ? c->eval_batch : 1000;
  if (t->test.n && (uint64_t)eval_batch > t->test.n) /* one batch holds the whole test set */
    eval_batch = (int)t->test.n;
  int eval_local = (eval_batch + world - 1) / world;
  int maxb = DT_MAX(t->micro_max, DT_MIN(eval_local, DT_MAX(t->micro_max, 256)));
  DT_CHECK(dt_model_create(c->model, maxb, c->seed, &t->model));
  if (!dt_model_param_count(t->model))
    return dt_set_error(DT_ERR_INVALID, "model '%s' has no parameters to train (add a layer such as linear:10)",
                        c->model);
  DT_CHECK(dt__train_check_data(t->model, c->model, c->data_dir, &t->train, &t->test));
  t->bucket_min = c->bucket_bytes ? c->bucket_bytes : DT_TRAIN_DEFAULT_BUCKET;
  /* auto: sharded where the workers share memory; there the reduce-scatters and allgathers run
   * in place in the shared window (share_memory), each worker updates half as much and keeps
   * half the state; 2-worker mlp was level to 11% faster than the whole allreduce in the window
   * (docs/BENCHMARKS-LOG.md, "shared window"). Over tcp the allgather after the update is not
   * overlapped with backward; 2 workers over loopback measured level (docs/ZERO.md): off. */
  t->zero = world > 1 && (c->zero == 1 || (c->zero == DT_TRAIN_ZERO_AUTO && !strcmp(dt_comm_transport(t->comm), "shm")));
  if (t->zero)
    DT_CHECK(setup_zero(t));
  else
    DT_CHECK(dt_optim_create(&c->optim, t->model, &t->optim));

  dt_sampler_cfg sc = {.num_samples = t->train.n, .global_batch = (uint64_t)c->global_batch,
                       .rank = t->rank, .world = world, .seed = c->seed, .shuffle = true,
                       .drop_last = false};
  dt_loader_opts lo = {.prefetch = true};
  DT_CHECK(dt_loader_create(&t->train, &sc, &lo, &t->loader));
  dt_sampler_cfg ec = {.num_samples = t->test.n, .global_batch = (uint64_t)eval_batch,
                       .rank = t->rank, .world = world, .seed = c->seed, .shuffle = false,
                       .drop_last = false};
  /* evaluation runs once an epoch and its batches are large (eval_batch / world samples as
   * float): one slot filled on demand saves the second slot's memory at no measurable cost */
  dt_loader_opts elo = {.prefetch = false};
  DT_CHECK(dt_loader_create(&t->test, &ec, &elo, &t->eval_loader));
  return setup_buckets(t);
}

/* The failure's message, led by "rank R: " once: a collective's own "rank R: " (this rank), at
 * the start or after the trainer's context ("comparing the ranks' compute time: rank 1: job
 * failed: ..."), goes. */
static void lead_with_rank(const dt_comm *c, dt_status rc, int rank) {
  char me[32], msg[2048];
  int k = snprintf(me, sizeof me, "rank %d: ", rank);
  snprintf(msg, sizeof msg, "%s", dt__comm_skip_self(c, dt_last_error()));
  char *mid = strstr(msg, me);
  if (mid && mid - msg >= 2 && mid[-2] == ':' && mid[-1] == ' ')
    memmove(mid, mid + k, strlen(mid + k) + 1);
  dt_set_error(rc, "%s%s", me, msg);
}

static void note(trainer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(trainer *t, const char *fmt, ...) {
  if (t->rank != 0 || !t->obs || !t->obs->on_note)
    return;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  t->obs->on_note(t->obs->ctx, buf);
}

static double peak_rss_mb(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru))
    return 0;
  return (double)ru.ru_maxrss / 1024.0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Broadcasts rank 0's start-up verdict on the checkpoints (root_rc: DT_OK, or why it refused:
 * an unusable directory, settings that differ from the checkpoint's, no valid checkpoint) and
 * what it restored (resumed, pos, st: rank 0's whole optimizer state, the optimizer's own
 * buffers unless sharded). A refusal travels with its message, so every rank stops at once
 * with rank 0's reason instead of waiting for data that never comes. */
static dt_status share_start(trainer *t, dt_status root_rc, int resumed, dt__train_pos *pos,
                             const dt__train_state *st) {
  char msg[768] = "";
  if (root_rc != DT_OK)
    snprintf(msg, sizeof msg, "%s", dt_last_error());
  int64_t hdr[7] = {root_rc, resumed, pos->step, (int64_t)pos->sampler.seed,
                    (int64_t)pos->sampler.epoch, (int64_t)pos->sampler.pos, pos->optim_steps};
  DT_CHECK(dt_comm_broadcast(t->comm, hdr, 7, DT_I64, 0));
  if (hdr[0] != DT_OK) {
    DT_CHECK(dt_comm_broadcast(t->comm, msg, sizeof msg, DT_U8, 0));
    msg[sizeof msg - 1] = '\0';
    if (t->rank == 0)
      return dt_set_error(root_rc, "%s", msg);
    t->refused_by_root = 1;
    return dt_set_error((dt_status)hdr[0], "rank 0 refused to %s: %s", t->cfg->resume ? "resume" : "start",
                        msg);
  }
  if (!hdr[1])
    return DT_OK;
  pos->step = hdr[2];
  pos->sampler.seed = (uint64_t)hdr[3];
  pos->sampler.epoch = (uint64_t)hdr[4];
  pos->sampler.pos = (uint64_t)hdr[5];
  pos->optim_steps = hdr[6];
  size_t n = dt_model_param_count(t->model);
  if (!t->shared) /* else rank 0 loaded them into the one copy before the header */
    DT_CHECK(dt_comm_broadcast(t->comm, dt_model_params(t->model), n, DT_F32, 0));
  if (t->zero)
    return scatter_state(t, st);
  for (size_t i = 0; i < st->n; i++)
    DT_CHECK(dt_comm_broadcast(t->comm, dt_optim_state(t->optim, i, NULL), n, DT_F32, 0));
  return DT_OK;
}

/* ---- the loop ----------------------------------------------------------------------------- */

typedef struct interval {
  int64_t steps;
  uint64_t samples;
  int64_t t0_ns;
  double compute_ns, comm_ns, data_ns, span_ns;
  bool uneven;                 /* a step whose global batch did not split evenly across ranks */
} interval;

/* ---- stragglers --------------------------------------------------------------------------
 *
 * Every step waits for the slowest rank, so one CPU that is slower or busier than the others
 * (another job on it, or a hypervisor giving the core to another guest) sets the pace of the
 * whole job, and the others' time shows up as exposed communication, not as their own. So at
 * every log point the ranks compare their compute time (forward, backward and update, no
 * waiting): each puts its own in its slot of a world-sized vector and one f64 sum, exact since
 * the other slots are zeros, gives every rank all of them. Rank 0 reports the spread per interval
 * and over the run, and warns when the slowest rank computed for STRAGGLER_RATIO times as long
 * as the fastest over a window of at least STRAGGLER_STEPS steps (whole log intervals after the
 * warm-up one, so --log-interval 1 warns too), at most every STRAGGLER_QUIET_S seconds for one
 * rank (a passing spike warned about does not hide a lasting straggler elsewhere), and not over a
 * window where a batch did not split evenly (a rank with fewer samples, or none, computes less
 * without anyone being slow). */
#define STRAGGLER_RATIO 1.25
#define STRAGGLER_STEPS 5
#define STRAGGLER_QUIET_S 300

typedef struct spread {
  double max_ns, min_ns;
  int slowest, fastest;
} spread;

/* s from every rank's compute time v[0..n) (no rank is the slowest when none computed: a run
 * resumed at its last step) */
static void spread_of(const double *v, int n, spread *s) {
  *s = (spread){.max_ns = v[0], .min_ns = v[0], .slowest = 0, .fastest = 0};
  for (int q = 1; q < n; q++) {
    if (v[q] > s->max_ns) {
      s->max_ns = v[q];
      s->slowest = q;
    }
    if (v[q] < s->min_ns) {
      s->min_ns = v[q];
      s->fastest = q;
    }
  }
  if (s->max_ns <= 0)
    s->slowest = s->fastest = -1;
}

/* Collective: fills s from every rank's `mine` (slot: world doubles). */
static dt_status compute_spread(trainer *t, double *slot, double mine, spread *s) {
  memset(slot, 0, (size_t)t->world * sizeof(double));
  slot[t->rank] = mine;
  dt_status rc = dt_comm_allreduce(t->comm, DT_IN_PLACE, slot, (size_t)t->world, DT_F64, DT_SUM);
  if (rc != DT_OK)
    return dt__error_prefix(rc, "comparing the ranks' compute time");
  spread_of(slot, t->world, s);
  return DT_OK;
}

static double spread_ratio(const spread *s) { return s->min_ns > 0 ? s->max_ns / s->min_ns : 1.0; }

/* Moves the gradients into the communicator's shared window when it has one (shm: every worker
 * on this host), so that the bucket allreduces copy nothing in or out (dt_comm_window). With the
 * sharded optimizer the parameters go there too, as one copy per host (see "one copy per host"):
 * the window's parts, back to back, hold every rank's gradients and then the one copy, (n + 1)
 * arenas in all, and the workers' caches and memory carry one copy instead of one each
 * (docs/ZERO.md). A transport without a window, or a window that could not be made (a full
 * /dev/shm: the same answer on every rank), leaves everything where it is. DTRAIN_WINDOW=0 keeps
 * it private (for comparisons). Measured in docs/BENCHMARKS-LOG.md. */
static dt_status share_memory(trainer *t) {
  const char *e = dt__env_str("DTRAIN_WINDOW");
  if (e && strcmp(e, "1")) {
    if (strcmp(e, "0"))
      return dt_set_error(DT_ERR_INVALID, "DTRAIN_WINDOW=%s: 1 (the default) or 0", e);
    return DT_OK;
  }
  size_t arena = (dt_model_param_count(t->model) * sizeof(float) + 63) / 64 * 64, n = (size_t)t->world;
  /* Deferred linear weight gradients (dt_model_defer_linear_grads): each rank's update computes
   * its blocks of the weight gradients from every rank's activations at once, so no rank writes
   * whole weight gradients that another sums again. Needs the one copy (sharded), one backward
   * per step and no global norm before the update. It pays where dtrain's own product runs
   * (AVX-512, or AVX2: 2 workers mlp on a Zen 3, 1.11-1.22x the samples/s of keeping them);
   * OpenBLAS's product over a tile of rows at a time is slower than backward's whole one (there
   * 0.85-0.95x, docs/BENCHMARKS-LOG.md), so with OpenBLAS the default keeps the gradients.
   * DTRAIN_DEFER=1 defers anyway, 0 never (for comparisons). */
  const char *de = dt__env_str("DTRAIN_DEFER");
  if (de && strcmp(de, "0") && strcmp(de, "1"))
    return dt_set_error(DT_ERR_INVALID, "DTRAIN_DEFER=%s: 1 or 0 (unset: 1 where dtrain's own product runs)", de);
  bool want = de ? !strcmp(de, "1") : strcmp(dt__nn_gemm_name(), "openblas") != 0;
  int defer = t->zero && want && t->cfg->accumulate == 1 && t->cfg->clip <= 0;
  size_t exsz = defer ? (dt_model_export_size(t->model, t->micro_max) * sizeof(float) + 63) / 64 * 64 : 0;
  /* sharded: the parts back to back hold n gradient arenas, the one copy, then n exports */
  void *w = NULL;
  dt_status rc = dt_comm_window(t->comm, t->zero ? ((n + 1) * arena + n * exsz + n - 1) / n : arena, &w);
  if (rc == DT_ERR_SYSTEM && defer) { /* every rank failed alike (a full /dev/shm): without the exports */
    DT_LOG_DEBUG("rank %d: no room for the activation exports (%s): keeping the weight gradients",
                 t->rank, dt_last_error());
    defer = 0;
    exsz = 0;
    rc = dt_comm_window(t->comm, ((n + 1) * arena + n - 1) / n, &w);
  }
  if (rc == DT_ERR_UNSUPPORTED)
    return DT_OK;
  if (rc != DT_OK) {
    DT_LOG_WARN("gradients stay private (%s)", dt_last_error());
    return DT_OK;
  }
  if (!t->zero)
    return dt_model_use_memory(t->model, NULL, w);
  char *base = dt_comm_window_part(t->comm, 0);
  float *one = (float *)(base + n * arena);
  t->grads_of = dt__alloc(n * sizeof *t->grads_of);
  t->blk = dt__alloc(n * sizeof *t->blk);
  if (!t->grads_of || !t->blk)
    return dt__error_prefix(DT_ERR_NOMEM, "%d gradient pointers", t->world);
  for (size_t q = 0; q < n; q++)
    t->grads_of[q] = (float *)(base + q * arena);
  DT_CHECK(dt_model_use_memory(t->model, t->rank == 0 ? one : NULL, t->grads_of[t->rank]));
  if (t->rank != 0)
    DT_CHECK(dt_model_share_params(t->model, one));
  if (defer) {
    t->ex_of = dt__alloc(n * sizeof *t->ex_of);
    if (!t->ex_of)
      return dt__error_prefix(DT_ERR_NOMEM, "%d export pointers", t->world);
    for (size_t q = 0; q < n; q++)
      t->ex_of[q] = (const float *)(base + (n + 1) * arena + q * exsz);
    DT_CHECK(dt_model_defer_linear_grads(t->model, (float *)t->ex_of[t->rank], t->micro_max));
    DT_LOG_DEBUG("rank %d: linear weight gradients deferred to the update (%zu bytes of activations "
                 "shared per rank)", t->rank, exsz);
  }
  t->shared = 1;
  DT_LOG_DEBUG("rank %d: parameters: one copy per host, in the shared window", t->rank);
  return DT_OK;
}

static dt_status train(trainer *t, dt_train_summary *sum) {
  const dt_train_config *c = t->cfg;
  int64_t t_start = dt_now_ns();
  dt_status rc;
  if (c->threads > 0)
    dt_nn_set_threads(c->threads);
  DT_CHECK(load_data(t));
  DT_CHECK(build(t));
  if (t->world > 1 || c->checkpoint_dir) {
    t->train_crc = data_crc(&t->train);
    t->test_crc = data_crc(&t->test);
    snprintf(t->train_id, sizeof t->train_id, "%zu samples, CRC32C %08llx", (size_t)t->train.n,
             (unsigned long long)t->train_crc);
  }
  if (t->world > 1) {
    DT_CHECK(check_settings(t));
    DT_CHECK(share_memory(t));
    /* one copy per host: rank 0 put its parameters there, the barrier says so */
    rc = t->shared ? dt_comm_barrier(t->comm)
                   : dt_comm_broadcast(t->comm, dt_model_params(t->model), dt_model_param_count(t->model), DT_F32, 0);
    if (rc != DT_OK)
      return dt__error_prefix(rc, "broadcasting parameters from rank 0");
  }
  int64_t spe = (int64_t)((t->train.n + (uint64_t)c->global_batch - 1) / (uint64_t)c->global_batch);
  int64_t total = spe * c->epochs;
  /* the schedule spans the epochs; max_steps only stops early, so a run cut short follows the
   * same trajectory as the full one (and resumes into it) */
  DT_CHECK(dt_lr_schedule_parse(c->schedule ? c->schedule : "constant", c->lr, total, &t->sched));
  if (c->max_steps > 0 && c->max_steps < total)
    total = c->max_steps;

  /* checkpoints: rank 0, the writer, prepares the directory and, resuming, loads the latest;
   * its verdict reaches every rank with what it restored */
  dt__train_pos pos = {.step = 0, .sampler = {.seed = c->seed, .epoch = 0, .pos = 0}};
  sum->resumed_from_step = -1;
  if (c->checkpoint_dir) {
    char what[1024] = "";
    dt__train_state st = {0};
    if (c->resume)
      DT_CHECK(state_whole(t, &st, 1));
    dt_status lrc = DT_ERR_NOT_FOUND; /* nothing restored */
    if (t->rank == 0) {
      lrc = dt__train_ckpt_prepare(c, &t->ckpt_lock);
      if (lrc == DT_OK)
        lrc = c->resume ? dt__train_ckpt_load(c, t->model, &st, t->train_id, &pos, what, sizeof what) : DT_ERR_NOT_FOUND;
    }
    rc = lrc == DT_ERR_NOT_FOUND ? DT_OK : lrc;
    if (t->world > 1) {
      rc = share_start(t, rc, lrc == DT_OK, &pos, &st);
      if (rc != DT_OK && !t->refused_by_root && t->rank != 0)
        dt__error_prefix(rc, "sharing the checkpoint from rank 0");
    }
    state_release(t, &st);
    if (rc != DT_OK) {
      sum->failed_at_checkpoints = true;
      return rc;
    }
    if (pos.step > 0) {
      dt_optim_set_step_count(t->optim, pos.optim_steps);
      DT_CHECK(dt_loader_seek(t->loader, &pos.sampler));
      sum->resumed_from_step = pos.step;
      if (t->rank == 0)
        note(t, "resumed %s", what);
    } else if (c->resume && t->rank == 0) {
      note(t, "no checkpoint in %s: starting from step 0", c->checkpoint_dir);
    }
    /* every rank has the same pos and total: all stop here alike */
    if (pos.step > total) {
      char why[64] = "";
      if (c->max_steps > 0)
        snprintf(why, sizeof why, ", --max-steps %lld", (long long)c->max_steps);
      sum->failed_at_checkpoints = true;
      return dt_set_error(DT_ERR_INVALID,
                          "the checkpoint resumed is at step %lld, past this run's last step %lld (--epochs %d%s): "
                          "its model would not be the one asked for",
                          (long long)pos.step, (long long)total, c->epochs, why);
    }
  }

  int64_t step = pos.step;
  size_t in = dt_model_input_size(t->model);
  size_t pbytes = dt_model_param_count(t->model) * sizeof(float);
  int64_t nlog = (total - step) / (c->log_interval ? c->log_interval : 10) + 2;
  double *rates = dt__calloc((size_t)nlog * sizeof(double));
  if (!rates)
    return dt__error_prefix(DT_ERR_NOMEM, "step rates of %lld log intervals", (long long)nlog);
  /* world > 1: every rank's compute time this interval, over the warning window, and when rank
   * 0 last warned about each rank (s, 0: never); see "stragglers" */
  double *slot = NULL, *win = NULL, *warned_s = NULL;
  if (t->world > 1) {
    if (!(slot = dt__calloc(3 * (size_t)t->world * sizeof(double)))) {
      dt__free(rates);
      return dt__error_prefix(DT_ERR_NOMEM, "compute times of %d ranks", t->world);
    }
    win = slot + t->world;
    warned_s = win + t->world;
  }
  double compute_total_ns = 0, slowest_wait_ns = 0;
  int64_t win_steps = 0;
  bool win_uneven = false;
  int64_t nrates = 0;
  interval iv = {.t0_ns = dt_now_ns()};
  int64_t log_every = c->log_interval ? c->log_interval : 10;
  int64_t train_ns = 0, comm_ns_total = 0, data_ns_total = 0;
  uint64_t samples_total = 0;
  double epoch_loss = pos.epoch_loss; /* a resume goes on with the epoch's earlier steps */
  int64_t epoch_steps = pos.epoch_steps, epoch_t0 = dt_now_ns(), last_eval_step = -1;
  double test_loss = NAN, test_acc = NAN, last_epoch_loss = NAN;
  int64_t steps_run = 0;

  while (step < total) {
    DT_CHECK_GOTO(dt_fault_step(step), rc, fail); /* DTRAIN_FAULTS: rehearsals and tests of recovery */
    int64_t s0 = dt_now_ns();
    dt_batch b;
    DT_CHECK_GOTO(dt_loader_next(t->loader, &b), rc, fail);
    int64_t s1 = dt_now_ns();
    /* the first micro-batch's backward writes the gradients (it is never empty when the shard
     * is not); a rank with nothing this step contributes zeros */
    if (b.n > 0) {
      dt_model_discard_grad(t->model);
    } else {
      dt_model_zero_grad(t->model);
      dt_model_export_clear(t->model);
    }
    double wloss = 0;
    int k = c->accumulate;
    uint64_t off = 0;
    for (int m = 0; m < k; m++) {
      uint64_t nm = b.n / (uint64_t)k + ((uint64_t)m < b.n % (uint64_t)k);
      t->armed = (m == k - 1) && t->world > 1 && !t->shared;
      if (nm == 0)
        continue;
      /* dropout masks depend only on (seed, step, the sample's position in the global batch):
       * not on the world size nor on --accumulate */
      dt_model_set_dropout_key(t->model, dt__train_dropout_key(c->seed, step), b.first + off);
      DT_CHECK_GOTO(dt_model_forward(t->model, b.x + off * in, (int)nm, 1, NULL), rc, fail);
      float l = 0;
      float scale = (float)((double)nm / (double)b.global_n);
      DT_CHECK_GOTO(dt_model_backward(t->model, b.y + off, scale, grad_hook, t, &l), rc, fail);
      wloss += (double)l * (double)nm / (double)b.global_n;
      off += nm;
    }
    int64_t s2 = dt_now_ns();
    double loss = wloss;
    int64_t span = 0, gather_wait = 0; /* collectives in flight; waiting after the update */
    float lr = dt_lr_at(&t->sched, step);
    if (t->shared) {
      DT_CHECK_GOTO(finish_shared(t, wloss, &loss), rc, fail);
    } else if (t->zero) {
      DT_CHECK_GOTO(finish_block_sums(t, wloss, &loss), rc, fail);
    } else if (t->world > 1) {
      t->loss_buf[0] = wloss;
      if (t->nreqs == 0)
        t->first_start_ns = s2;
      DT_CHECK_GOTO(finish_allreduce(t), rc, fail);
      loss = t->loss_buf[0];
    }
    int64_t s3 = dt_now_ns();
    DT_CHECK_GOTO(dt_fault_point(step, DT_FAULT_AT_UPDATE), rc, fail);
    if (t->shared) {
      /* the gradients are summed inside the update: the span is the whole exchange */
      DT_CHECK_GOTO(update_shared(t, lr), rc, fail);
      span = dt_now_ns() - s2;
      gather_wait = t->ag_wait_ns;
    } else if (t->zero) {
      DT_CHECK_GOTO(update_blocks(t, lr), rc, fail);
      span = t->rs_span_ns + t->ag_span_ns;
      gather_wait = t->ag_wait_ns;
    } else {
      if (t->world > 1)
        span = s3 - t->first_start_ns;
      if (c->clip > 0)
        dt_model_clip_grad_norm(t->model, c->clip);
      DT_CHECK_GOTO(dt_optim_step(t->optim, lr), rc, fail);
    }
    int64_t s4 = dt_now_ns();
    step++;
    steps_run++;
    samples_total += b.global_n;
    train_ns += s4 - s0;
    comm_ns_total += s3 - s2 + gather_wait;
    data_ns_total += s1 - s0;
    epoch_loss += loss;
    epoch_steps++;
    iv.steps++;
    iv.samples += b.global_n;
    iv.uneven |= b.global_n % (uint64_t)t->world != 0;
    iv.compute_ns += (double)((s2 - s1) + (s4 - s3) - gather_wait);
    compute_total_ns += (double)((s2 - s1) + (s4 - s3) - gather_wait);
    iv.comm_ns += (double)(s3 - s2 + gather_wait);
    iv.data_ns += (double)(s1 - s0);
    iv.span_ns += (double)span;
    if (!isfinite(loss)) {
      rc = dt_set_error(DT_ERR_STATE, "loss is %s at step %lld: training diverged (lower --lr or "
                        "use --clip)", isnan(loss) ? "NaN" : loss > 0 ? "+infinity" : "-infinity", (long long)step);
      goto fail;
    }

    int epoch_end = b.last_in_epoch || step == total;
    if (step % log_every == 0 || epoch_end) {
      int64_t now = dt_now_ns();
      double secs = (double)(now - iv.t0_ns) / 1e9;
      double rate = secs > 0 ? (double)iv.samples / secs : 0;
      if (nrates < nlog)
        rates[nrates++] = rate;
      spread sp = {.max_ns = iv.compute_ns, .min_ns = iv.compute_ns, .slowest = -1, .fastest = -1};
      if (t->world > 1) {
        DT_CHECK_GOTO(compute_spread(t, slot, iv.compute_ns, &sp), rc, fail);
        /* the slowest rank's extra compute over the interval is waited for here: a lower bound
         * of the part of this rank's exposed communication that is not the exchange's */
        slowest_wait_ns += fmin(sp.max_ns - iv.compute_ns, iv.comm_ns);
        if (nrates > 1) { /* never on the warm-up interval */
          for (int q = 0; q < t->world; q++)
            win[q] += slot[q];
          win_steps += iv.steps;
          win_uneven |= iv.uneven;
        }
        if (win_steps >= STRAGGLER_STEPS) {
          spread ws;
          spread_of(win, t->world, &ws);
          double now_s = (double)now / 1e9;
          if (ws.slowest >= 0 && !win_uneven && spread_ratio(&ws) >= STRAGGLER_RATIO &&
              (warned_s[ws.slowest] == 0 || now_s - warned_s[ws.slowest] >= STRAGGLER_QUIET_S)) {
            warned_s[ws.slowest] = now_s;
            note(t, "warning: rank %d computed %.2fx as long per step as rank %d over steps %lld-%lld "
                 "(%.2f against %.2f ms); every step waits for the slowest rank: is its CPU slower "
                 "or busy with other work?", ws.slowest, spread_ratio(&ws), ws.fastest,
                 (long long)(step - win_steps + 1), (long long)step, ws.max_ns / 1e6 / (double)win_steps,
                 ws.min_ns / 1e6 / (double)win_steps);
          }
          memset(win, 0, (size_t)t->world * sizeof(double));
          win_steps = 0;
          win_uneven = false;
        }
      }
      if (t->rank == 0 && t->obs && t->obs->on_step) {
        dt_train_step_info si = {
            .step = step, .total_steps = total, .epoch = (int)b.epoch + 1, .epochs = c->epochs,
            .step_in_epoch = (int64_t)b.step + 1, .steps_per_epoch = spe, .loss = (float)loss,
            .lr = lr, .samples_per_s = rate, .compute_ms = iv.compute_ns / 1e6 / (double)iv.steps,
            .comm_ms = iv.comm_ns / 1e6 / (double)iv.steps,
            .data_ms = iv.data_ns / 1e6 / (double)iv.steps,
            .allreduce_bytes = t->world > 1 ? (double)pbytes * (t->zero ? 2 : 1) : 0,
            .busbw_gbps = (t->world > 1 && iv.span_ns > 0)
                              ? (double)pbytes * iv.steps * 2.0 * (t->world - 1) / t->world /
                                    iv.span_ns
                              : 0,
            .eta_s = rate > 0 ? (double)(total - step) * ((double)iv.samples / (double)iv.steps) / rate : 0,
            .world_size = t->world,
            .compute_max_ms = sp.max_ns / 1e6 / (double)iv.steps,
            .compute_min_ms = sp.min_ns / 1e6 / (double)iv.steps,
            .slowest_rank = sp.slowest};
        t->obs->on_step(t->obs->ctx, &si);
      }
      memset(&iv, 0, sizeof iv);
      iv.t0_ns = dt_now_ns();
    }
    /* what a checkpoint of this step keeps of the epoch under way: nothing once the epoch ended,
     * all of it when only this run did (--max-steps; a resume goes on with the epoch) */
    const bool epoch_over = b.last_in_epoch;
    const double ck_loss = epoch_over ? 0 : epoch_loss;
    const int64_t ck_steps = epoch_over ? 0 : epoch_steps;
    if (epoch_end) {
      double train_loss = epoch_loss / (double)(epoch_steps ? epoch_steps : 1);
      last_epoch_loss = train_loss;
      double ep_s = (double)(dt_now_ns() - epoch_t0) / 1e9;
      DT_CHECK_GOTO(evaluate(t, &test_loss, &test_acc), rc, fail);
      last_eval_step = step;
      if (t->rank == 0 && t->obs && t->obs->on_epoch) {
        dt_train_epoch_info ei = {.epoch = (int)b.epoch + 1, .step = step, .test_loss = test_loss,
                                  .test_accuracy = test_acc, .train_loss = train_loss,
                                  .epoch_s = ep_s};
        t->obs->on_epoch(t->obs->ctx, &ei);
      }
      epoch_loss = 0;
      epoch_steps = 0;
      epoch_t0 = dt_now_ns();
      iv.t0_ns = epoch_t0; /* evaluation time is not training time */
    }
    /* sharded: every rank sends its part of the state to rank 0, the writer */
    if (c->checkpoint_dir && (t->rank == 0 || t->zero) &&
        ((c->checkpoint_every > 0 && step % c->checkpoint_every == 0) ||
         (c->checkpoint_every == 0 && epoch_end) || step == total)) {
      dt__train_pos p = {.step = step, .sampler = b.after, .optim_steps = dt_optim_step_count(t->optim),
                         .epoch_loss = ck_loss, .epoch_steps = ck_steps};
      dt__train_state st;
      DT_CHECK_GOTO(state_whole(t, &st, 1), rc, fail);
      rc = t->zero ? gather_state(t, &st) : DT_OK;
      if (rc == DT_OK && t->rank == 0) {
        rc = dt__train_ckpt_save(c, t->model, &st, t->train_id, &p, t->world, sum->checkpoint_file,
                                 sizeof sum->checkpoint_file);
        if (rc == DT_OK)
          note(t, "checkpoint at step %lld: %s", (long long)step, sum->checkpoint_file);
      }
      state_release(t, &st);
      if (rc != DT_OK)
        goto fail;
    }
    if (epoch_end)
      iv.t0_ns = dt_now_ns();
  }
  if (last_eval_step != step)
    DT_CHECK_GOTO(evaluate(t, &test_loss, &test_acc), rc, fail);
  sum->compute_imbalance = 1.0;
  sum->slowest_rank = -1;
  if (t->world > 1) {
    spread sp;
    DT_CHECK_GOTO(compute_spread(t, slot, compute_total_ns, &sp), rc, fail);
    sum->compute_imbalance = spread_ratio(&sp);
    sum->slowest_rank = sp.slowest;
  }

  if (c->out_dir && t->rank == 0) {
    snprintf(sum->model_file, sizeof sum->model_file, "%s/model.safetensors", c->out_dir);
    DT_CHECK_GOTO(dt_train_model_save(t->model, sum->model_file), rc, fail);
  }
  sum->test_accuracy = test_acc;
  sum->test_loss = test_loss;
  sum->train_loss = last_epoch_loss;
  sum->epochs = (int)((step + spe - 1) / spe);
  sum->steps = step;
  sum->steps_run = steps_run;
  sum->train_s = (double)train_ns / 1e9;
  sum->samples_per_s = train_ns > 0 ? (double)samples_total / sum->train_s : 0;
  /* steady state: median of the logged intervals after the first (warm-up) */
  if (nrates > 1) {
    qsort(rates + 1, (size_t)(nrates - 1), sizeof(double), cmp_double);
    const double *r = rates + 1;
    int64_t m = nrates - 1;
    sum->steady_samples_per_s = (m % 2) ? r[m / 2] : 0.5 * (r[m / 2 - 1] + r[m / 2]);
  } else {
    sum->steady_samples_per_s = nrates ? rates[0] : sum->samples_per_s;
  }
  sum->comm_exposed_s = (double)comm_ns_total / 1e9;
  sum->comm_waiting_slowest_s = slowest_wait_ns / 1e9;
  sum->data_wait_s = (double)data_ns_total / 1e9;
  sum->world_size = t->world;
  snprintf(sum->model_spec, sizeof sum->model_spec, "%s", dt_model_spec(t->model));
  sum->param_count = dt_model_param_count(t->model);
  sum->wall_s = (double)(dt_now_ns() - t_start) / 1e9;
  sum->peak_rss_mb = peak_rss_mb();
  dt__free(rates);
  dt__free(slot);
  return DT_OK;
fail:
  dt__free(rates);
  dt__free(slot);
  if (t->world > 1) {
    /* collect requests still in flight so no buffer is borrowed past our return */
    t->armed = 0;
    for (size_t i = 0; i < t->nreqs; i++)
      if (t->reqs[i]) {
        dt_request_wait(t->reqs[i]);
        t->reqs[i] = NULL;
      }
    if (t->zero)
      wait_blocks(t, t->ag, t->nbk, "parameter allgather", rc);
  }
  return rc;
}

/* World size the environment announces, by the conventions dtrain/comm.h lists (the first whose
 * rank variable is set). A single-process run creates no communicator at all: no store server,
 * no failure detector, nothing to warn about. */
static int64_t job_world_size(void) {
  static const char *const conv[][2] = {{"DTRAIN_RANK", "DTRAIN_WORLD_SIZE"},
                                        {"RANK", "WORLD_SIZE"},
                                        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                        {"SLURM_PROCID", "SLURM_NTASKS"}};
  for (size_t i = 0; i < DT_ARRAY_LEN(conv); i++) {
    if (!dt__env_str(conv[i][0]))
      continue;
    int64_t n = 1, r = 0;
    /* a malformed or inconsistent value (a size below 1, a rank outside the size) goes to
     * dt_comm_create, which reports it */
    if (dt__env_int(conv[i][1], 2, &n) != DT_OK || dt__env_int(conv[i][0], 0, &r) != DT_OK || n < 1 || r != 0)
      return 2;
    return n;
  }
  return 1;
}

/* Pins each local worker to its share of the CPUs (comm/bind.c's DTRAIN_BIND=auto) when the
 * user did not choose (DTRAIN_BIND unset; =none keeps every worker free), this host runs two or
 * more workers, and every worker's compute threads fit in its share. A worker is a compute
 * thread per core plus a progress thread that overlaps the gradient allreduce with backward;
 * unbound, the scheduler moves that progress thread next to whoever woke it, which for the shm
 * transport's hand-overs is the other worker's progress thread on the other worker's core: it
 * then takes the core from the other worker's compute thread instead of from its own, and the
 * two workers' steps drift apart. Measured on the 2-core guest at load average 4.6-5.3 (other
 * jobs running), `dtrain run -n 2 -- dtrain train --model mlp --threads 1 --max-steps 300`, 3
 * alternated pairs: unbound 6,073-9,598 samples/s, 177-227 CPU migrations, 29-35% exposed
 * communication; bound 14,519-16,795 samples/s, 3-12 migrations, 17-18% exposed. The cost:
 * a bound worker cannot leave a core another job is using, and the other worker waits for it
 * every step. `cnn` (--max-steps 100, 4 alternated pairs) was level at load 5-6 (bound
 * 1,206-1,837, unbound 1,139-2,027 samples/s) and lost at load 7-13 (medians 790 against
 * 1,060). Against unbound workers whose progress thread follows its caller's CPU (comm/
 * progress.c), 6 pairs at load 5.5-6.5: mlp bound median 17.2 k against 15.9 k samples/s, cnn
 * 2,036 against 1,991. Returns "auto" or NULL (DTRAIN_BIND decides, default none) for
 * dt_comm_config.bind; the communicator binds before any thread of ours starts, so the progress
 * and loader threads inherit the mask. */
static const char *default_binding(const dt_train_config *cfg) {
  if (dt__env_str("DTRAIN_BIND"))
    return NULL;
  dt__comm_env env;
  if (dt__comm_env_resolve(NULL, &env) != DT_OK || env.local_size < 2)
    return NULL; /* dt_comm_create reports a bad environment */
  cpu_set_t have;
  if (sched_getaffinity(0, sizeof have, &have) != 0)
    return NULL;
  int64_t threads = cfg->threads > 0 ? cfg->threads : dt_nn_threads(), local = env.local_size;
  memset(&env, 0, sizeof env); /* it holds the job secret */
  return threads * local <= CPU_COUNT(&have) ? "auto" : NULL;
}

dt_status dt_train_run(const dt_train_config *cfg, const dt_train_observer *obs,
                       dt_train_summary *summary) {
  dt_train_summary local;
  dt_train_summary *sum = summary ? summary : &local;
  memset(sum, 0, sizeof *sum);
  if (!cfg)
    return dt_set_error(DT_ERR_INVALID, "dt_train_run: cfg is NULL");
  DT_CHECK(check_config(cfg));
  trainer t = {.cfg = cfg, .obs = obs, .world = 1, .ckpt_lock = -1};
  dt_status rc = DT_OK;
  if (job_world_size() > 1) {
    dt_comm_config cc;
    dt_comm_config_init(&cc);
    cc.bind = default_binding(cfg);
    rc = dt_comm_create(&cc, &t.comm);
    if (rc != DT_OK)
      return dt__error_prefix(rc, "joining the job");
    t.rank = dt_comm_rank(t.comm);
    t.world = dt_comm_size(t.comm);
  }
  rc = train(&t, sum);
  if (rc != DT_OK && t.world > 1) {
    /* A failure only this rank saw (a checkpoint that could not be written): stop the others now,
     * with this message, instead of leaving them to wait for us until the deadline. */
    if (!dt__comm_aborted(t.comm)) {
      char msg[1024];
      snprintf(msg, sizeof msg, "%s", dt__comm_skip_self(t.comm, dt_last_error()));
      dt_comm_abort(t.comm, msg); /* sets its own message */
      dt_set_error(rc, "%s", msg);
    }
    lead_with_rank(t.comm, rc, t.rank);
  }
  dt_loader_destroy(t.loader);
  dt_loader_destroy(t.eval_loader);
  dt_optim_destroy(t.optim);
  dt_model_destroy(t.model);
  dt_dataset_free(&t.train);
  dt_dataset_free(&t.test);
  dt__free(t.ar_end);
  dt__free(t.reqs);
  dt__free(t.bk_lo);
  dt__free(t.bk_c);
  dt__free(t.ag);
  dt__free(t.grads_of);
  dt__free(t.blk);
  dt__free(t.ex_of);
  dt__free(t.small);
  dt_comm_destroy(t.comm);
  if (t.ckpt_lock >= 0)
    close(t.ckpt_lock);
  return rc;
}
