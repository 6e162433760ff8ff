/* dtrain/train.h - the trainer: what `dtrain train` does, as one call a C program can make.
 *
 * dt_train_run trains a model (preset or spec string, dtrain/nn.h) on an IDX dataset
 * (dtrain/data.h) with a prefetching loader, evaluates on the test set after each epoch, and
 * writes the model as safetensors and, when asked, checkpoints it can resume from.
 *
 * Data parallel. When the process is one rank of a job (the DTRAIN_* / torchrun / Open MPI /
 * Slurm environment, see dtrain/comm.h), every rank calls dt_train_run with the same settings:
 *   - the settings are compared across ranks first; any difference stops every rank with
 *     DT_ERR_MISMATCH naming the rank and the setting;
 *   - parameters are broadcast from rank 0;
 *   - global_batch is the batch summed over ranks: each rank trains on its shard of every global
 *     batch (a shard may be one sample larger than another's, or empty in a short last batch);
 *   - each rank scales its loss by (its samples / global batch samples) and the gradients are
 *     SUMMED, so the update is exactly the gradient of the global-batch mean loss, as one
 *     process would compute it; the sum runs in buckets of whole layers holding at least
 *     bucket_bytes, each started on the communicator's progress thread as soon as backward has
 *     finished the bucket's layers, overlapping the rest of backward;
 *   - with accumulate = k each shard is split into k micro-batches; only the last one's backward
 *     starts buckets, so a step makes one gradient allreduce whatever k is;
 *   - with zero = 1 (ZeRO-1) each bucket is reduce-scattered instead: each rank receives the sum
 *     of its 1/size of the bucket, clips with the global norm (one scalar summed across ranks),
 *     updates only that part with optimizer state for only that part ((size-1)/size of the
 *     state saved per rank), and the updated parameters are allgathered. The numbers are those
 *     of zero = 0 up to float rounding of the sums; checkpoints hold the whole state either way;
 *   - evaluation is split across ranks and the sums combined.
 * Everything that affects the numbers is deterministic: the sampler depends on (seed, epoch),
 * each sample's dropout mask on (seed, step, its position in the global batch, layer) alone (not
 * on the rank, the world size or accumulate: see dt_model_set_dropout_key), the reductions run
 * in a fixed order. Resuming from a checkpoint with the same world size repeats the
 * uninterrupted run bit for bit; with another world size or accumulate (same global batch) it
 * matches within float rounding (about 1e-7 relative), as do runs on different world sizes,
 * with or without dropout.
 *
 * Output. Rank 0 reports through an observer (NULL: silent): each logged step, each epoch, and
 * free-form notes. dtrain/monitor.h provides the observer `dtrain train` uses (metrics JSONL file
 * and progress line). The library never prints on its own except through dt__log.
 *
 * Not here: launching processes (`dtrain run`), model-parallel strategies. */
#ifndef DTRAIN_TRAIN_H
#define DTRAIN_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtrain/core.h"
#include "dtrain/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Caller-owned; strings are borrowed for the duration of dt_train_run. An empty directory
 * name ("") is DT_ERR_INVALID: it would put files at the filesystem root. */
typedef struct dt_train_config {
  const char *model;          /* preset ("mlp", "cnn") or spec string; default "mlp" */
  const char *data_dir;       /* IDX directory; NULL: DT_FASHION_MNIST_DIR */
  int epochs;                 /* >= 1; default 1 */
  int64_t max_steps;          /* > 0: stop after this many optimizer steps in total (the LR
                                 schedule still spans all epochs); 0: none */
  int global_batch;           /* samples per optimizer step over all ranks; default 128 */
  int eval_batch;             /* global evaluation batch; 0: 1000 */
  int accumulate;             /* micro-batches per step (>= 1); default 1 */
  dt_optim_config optim;      /* default SGD, momentum 0 */
  float lr;                   /* base learning rate; default 0.05 */
  const char *schedule;       /* dt_lr_schedule_parse syntax; NULL: "constant" */
  float clip;                 /* max global gradient norm; <= 0: no clipping */
  uint64_t seed;              /* parameters, shuffling, dropout; default 42 */
  int threads;                /* BLAS threads per rank; 0: leave as is */
  const char *out_dir;        /* model.safetensors and metrics here (rank 0); NULL: none */
  const char *checkpoint_dir; /* NULL: no checkpoints */
  int64_t checkpoint_every;   /* steps between checkpoints (> 0 with checkpoint_dir); 0: at the
                                 end of each epoch only */
  int keep;                   /* checkpoints kept; 0: DT_CKPT_DEFAULT_KEEP */
  bool resume;                /* continue from the latest valid checkpoint in checkpoint_dir */
  size_t bucket_bytes;        /* least bytes of a gradient allreduce bucket (whole layers are
                                 added until it holds that much); 0: DT_TRAIN_DEFAULT_BUCKET */
  int64_t log_interval;       /* steps between observer on_step calls; 0: 10 */
  int zero;                   /* ZeRO stage: 0 every rank keeps the whole optimizer state and
                                 updates every parameter; 1 each rank keeps the state of and
                                 updates only its shard (gradients reduce-scattered, parameters
                                 allgathered); DT_TRAIN_ZERO_AUTO (the default) 1 when the
                                 workers share memory (shm transport, where both run in place
                                 in the shared window), else 0. No effect on a single rank. */
} dt_train_config;
#define DT_TRAIN_ZERO_AUTO (-1)

/* 1 MiB: see the measurements in src/parallel/trainer.c. */
#define DT_TRAIN_DEFAULT_BUCKET ((size_t)1 << 20)

/* Fills cfg with the defaults above. */
void dt_train_config_init(dt_train_config *cfg);

/* One logged step (rank 0's view; loss is the global-batch mean). Times cover the steps since
 * the previous log. */
typedef struct dt_train_step_info {
  int64_t step;               /* 1-based optimizer step */
  int64_t total_steps;
  int epoch;                  /* 1-based */
  int epochs;
  int64_t step_in_epoch;      /* 1-based */
  int64_t steps_per_epoch;
  float loss;                 /* this step's global mean loss */
  float lr;
  double samples_per_s;       /* global samples / wall time over the interval */
  double compute_ms;          /* per step: forward + backward + optimizer (mean over interval) */
  double comm_ms;             /* per step: exposed communication (waiting after backward) */
  double data_ms;             /* per step: waiting for the loader */
  double allreduce_bytes;     /* per step, per rank: the gradient payload; with zero = 1 the
                                 reduce-scatter's plus the allgather's buffers (twice it) */
  double busbw_gbps;          /* bus bandwidth of those collectives, GB/s, nccl-tests convention:
                                 allreduce bytes * 2(n-1)/n, reduce-scatter and allgather
                                 bytes * (n-1)/n, over the time they were in flight */
  double eta_s;               /* estimated time to the last step */
  int world_size;
  /* compute_ms of the slowest and of the fastest rank over the interval, and which rank was the
   * slowest (-1 with one worker, where both are compute_ms): every step waits for the slowest */
  double compute_max_ms, compute_min_ms;
  int slowest_rank;
} dt_train_step_info;

typedef struct dt_train_epoch_info {
  int epoch;                  /* 1-based */
  int64_t step;
  double test_loss;           /* mean over the test set */
  double test_accuracy;       /* fraction */
  double train_loss;          /* mean of the epoch's step losses */
  double epoch_s;             /* wall time of the epoch's training steps */
} dt_train_epoch_info;

/* Callbacks on rank 0 (other ranks never call them). Any may be NULL. They run on the training
 * thread between steps; their time counts as training time, so keep them short. */
typedef struct dt_train_observer {
  void *ctx;
  void (*on_step)(void *ctx, const dt_train_step_info *s);
  void (*on_epoch)(void *ctx, const dt_train_epoch_info *e);
  /* A one-line note ("resumed from ...", "checkpoint ..."), no newline. */
  void (*on_note)(void *ctx, const char *text);
} dt_train_observer;

typedef struct dt_train_summary {
  double test_accuracy, test_loss;  /* last evaluation */
  double train_loss;                /* mean loss of the last epoch's steps */
  int epochs;                       /* epochs (partly) trained, counting resumed ones */
  int64_t steps;                    /* optimizer steps at the end, counting resumed ones */
  int64_t steps_run;                /* steps this call ran */
  double samples_per_s;             /* samples trained / training time of this call */
  double steady_samples_per_s;      /* median of logged intervals after the first */
  double wall_s;                    /* whole call */
  double train_s;                   /* steps only, no evaluation */
  double comm_exposed_s;            /* summed exposed communication time (rank 0) */
  double comm_waiting_slowest_s;    /* of that, at least this much was rank 0 waiting for a rank
                                       that computed longer (compute times compared per log
                                       interval; 0 with one worker) */
  double data_wait_s;
  double compute_imbalance;         /* the slowest rank's compute time over the fastest's, whole
                                       run (1 with one worker) */
  int slowest_rank;                 /* -1 with one worker or no step run */
  double peak_rss_mb;               /* this process (getrusage) */
  int world_size;
  int64_t resumed_from_step;        /* -1: fresh start */
  char model_spec[512];             /* canonical spec */
  size_t param_count;
  char model_file[1024];            /* "" if no out_dir */
  char checkpoint_file[1024];       /* last checkpoint written, "" if none */
  bool failed_at_checkpoints;       /* the call failed preparing the checkpoint directory or
                                       resuming (not at the data or in training) */
} dt_train_summary;

/* Trains as described at the top of this file. Blocks until done. Collective over the job when
 * there is one. On failure returns the status with dt_last_error() naming what failed
 * (DT_ERR_INVALID for bad settings or model spec, DT_ERR_NOT_FOUND for missing data or
 * checkpoint, DT_ERR_MISMATCH for settings differing across ranks, DT_ERR_STATE for a loss
 * that is not finite (diverged), comm errors for a failed peer); nothing is leaked. summary may be NULL. */
dt_status dt_train_run(const dt_train_config *cfg, const dt_train_observer *obs,
                       dt_train_summary *summary);

/* Writes m's parameters to path as safetensors (F32, tensor names and shapes from the model's
 * tensor table) with metadata "dtrain.model_spec" = the canonical spec, so dt_train_model_load
 * can rebuild it. Atomic; blocks on I/O. */
dt_status dt_train_model_save(dt_model *m, const char *path);
/* Rebuilds the model saved by dt_train_model_save (for batches up to max_batch) and loads its
 * parameters. DT_ERR_NOT_FOUND / DT_ERR_CORRUPT name the file and what is missing or wrong. */
dt_status dt_train_model_load(const char *path, int max_batch, dt_model **out);

/* Evaluates m on the test split of data_dir (NULL: Fashion-MNIST) in batches of batch
 * (<= model max batch): mean loss and accuracy over the whole set. Single process. */
dt_status dt_train_evaluate(dt_model *m, const char *data_dir, int batch, double *test_loss,
                            double *test_accuracy, uint64_t *samples);

#ifdef __cplusplus
}
#endif
#endif
