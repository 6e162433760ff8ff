/* parallel/train_internal.h - the trainer's state shared by trainer.c (the loop and data
 * parallelism) and train_io.c (model files and checkpoints). Not a public interface. */
#ifndef DT_PARALLEL_TRAIN_INTERNAL_H
#define DT_PARALLEL_TRAIN_INTERNAL_H

#include "core/core.h"
#include "dtrain/ckpt.h"
#include "dtrain/comm.h"
#include "dtrain/data.h"
#include "dtrain/nn.h"
#include "dtrain/train.h"

/* Dropout. Every micro-batch of every rank keys its forward (dt_model_set_dropout_key) with
 * dt__train_dropout_key(seed, step) and the position of its first sample in the global batch
 * (the rank's shard start, dt_batch.first, plus the micro-batches before it), so each sample's
 * mask depends only on (seed, step, its position in the global batch, layer): 1, 2 or 4
 * workers, with any --accumulate, draw the same masks, and a checkpoint holds no RNG state.
 * DT__TRAIN_DROPOUT_RULE is the checkpoint meta "dropout_rng" that records this rule; a
 * checkpoint with another value (dtrain before this rule: "reseeded per micro-batch from (seed,
 * step, micro-batch, rank)") still resumes, with a warning for a model with dropout. */
#define DT__TRAIN_DROPOUT_RULE "per sample from (seed, step, position in the global batch, layer)"
static inline uint64_t dt__train_dropout_key(uint64_t seed, int64_t step) {
  return dt__mix64(dt__mix64(seed ^ 0xD50F0D50F0D50F0DULL) + (uint64_t)step * DT__GOLDEN64);
}

/* What a checkpoint restores besides the parameter and optimizer buffers. */
typedef struct dt__train_pos {
  int64_t step;               /* optimizer steps done */
  dt_sampler_state sampler;   /* position just after the last trained batch */
  int64_t optim_steps;        /* dt_optim_step_count */
  /* the epoch under way: its summed step losses and steps so far, so that the epoch record after
   * a resume averages the whole epoch (0 in files written before them). Its seconds are not
   * kept (a checkpoint holds no timings: the same run writes the same bits); the record's
   * epoch_s after a resume counts the resumed run's part. */
  double epoch_loss;
  int64_t epoch_steps;
} dt__train_pos;

/* The optimizer state a checkpoint holds: n buffers (as dt_optim_state names them), each
 * param_count floats in the params layout. Always the whole state, also when the trainer's
 * optimizer holds only this rank's shard of it (ZeRO-1): the trainer gathers the shards into
 * such buffers before saving and scatters them after loading, so a checkpoint does not depend
 * on --zero or the number of workers. The buffers are borrowed. */
typedef struct dt__train_state {
  size_t n;
  const char *name[2];
  float *buf[2];
} dt__train_state;

/* Makes cfg->checkpoint_dir ready at start-up (rank 0, the one writer): creates it with its
 * parents, checks that it is a writable directory, locks it against a second job (flock on
 * DIR/dtrain.lock; *lock_fd holds the lock until closed, or until the process ends, so a
 * restarted job takes it again) and, unless cfg->resume, refuses a directory that holds
 * checkpoints already. DT_ERR_INVALID naming the directory and the cause; *lock_fd = -1. */
dt_status dt__train_ckpt_prepare(const dt_train_config *cfg, int *lock_fd);

/* Writes a checkpoint of the model's parameters, the state st and the position into
 * cfg->checkpoint_dir (rank 0 only); data names the training set (its size and CRC). path_out
 * receives the file. Blocks on I/O. */
dt_status dt__train_ckpt_save(const dt_train_config *cfg, dt_model *m, const dt__train_state *st, const char *data,
                              const dt__train_pos *pos, int world, char *path_out, size_t cap);

/* The position checkpoint c holds: DT_ERR_CORRUPT naming the key when one is missing or not a
 * number (its checksums hold, so another writer made it), or when its step is not its header's. */
dt_status dt__train_ckpt_pos(const dt_ckpt *c, dt__train_pos *pos);

/* Loads the latest valid checkpoint of cfg->checkpoint_dir into m's parameters and st's
 * buffers (rank 0 only; the trainer shares them). DT_ERR_NOT_FOUND if there is none;
 * DT_ERR_MISMATCH if it was written for another model, global batch, seed, optimizer or
 * training set (data, as dt__train_ckpt_save took it; files without it are not compared);
 * DT_ERR_CORRUPT if its checksums hold but its position is missing or contradicts itself. note
 * receives a one-line description. */
dt_status dt__train_ckpt_load(const dt_train_config *cfg, dt_model *m, const dt__train_state *st, const char *data,
                              dt__train_pos *pos, char *note, size_t cap);

/* The one check that data fits a model, run when the data is loaded (dt_train_run before it
 * trains, dt_train_evaluate): the test images have the training images' C x H x W (train may
 * be NULL), the model's input takes them (a model with in=F takes any image of F values; one
 * with in=CxHxW exactly that shape: an N x H x W file is read as 1xHxW, any other order is
 * refused) and has an output for every class. DT_ERR_INVALID naming the files (from dir, as
 * dt_dataset_load_dir reads them) and both shapes. model_name NULL: the model's spec. */
dt_status dt__train_check_data(const dt_model *m, const char *model_name, const char *dir,
                               const dt_dataset *train, const dt_dataset *test);

#endif
