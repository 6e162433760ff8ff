/* parallel/train_internal.h - the trainer's state shared by trainer.c (the loop and data
 * parallelism) and train_io.c (model files and checkpoints). Not a public interface. */
#ifndef DT_PARALLEL_TRAIN_INTERNAL_H
#define DT_PARALLEL_TRAIN_INTERNAL_H

#include "dtrain/comm.h"
#include "dtrain/data.h"
#include "dtrain/nn.h"
#include "dtrain/train.h"

/* What a checkpoint restores besides the parameter and optimizer buffers. */
typedef struct dt__train_pos {
  int64_t step;               /* optimizer steps done */
  dt_sampler_state sampler;   /* position just after the last trained batch */
  int64_t optim_steps;        /* dt_optim_step_count */
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
 * cfg->checkpoint_dir (rank 0 only). path_out receives the file. Blocks on I/O. */
dt_status dt__train_ckpt_save(const dt_train_config *cfg, dt_model *m, const dt__train_state *st,
                              const dt__train_pos *pos, int world, char *path_out, size_t cap);

/* Loads the latest valid checkpoint of cfg->checkpoint_dir into m's parameters and st's
 * buffers (rank 0 only; the trainer shares them). DT_ERR_NOT_FOUND if there is none;
 * DT_ERR_MISMATCH if it was written for another model, global batch, seed or optimizer. note
 * receives a one-line description. */
dt_status dt__train_ckpt_load(const dt_train_config *cfg, dt_model *m, const dt__train_state *st,
                              dt__train_pos *pos, char *note, size_t cap);

#endif
