/* dtrain/data.h - datasets, the distributed sampler and the prefetching loader.
 *
 * IDX files (the MNIST family's format, gzip'd or raw) are read with every header field checked
 * against the bytes really present, so a truncated or lying file is an error that names the file
 * and the problem, never a crash or a huge allocation. A dataset holds images as the file's
 * u8 pixels (N, C, H, W), a quarter of their float size, with a table of the float each pixel
 * value stands for ([0, 1], optionally normalized); images become float only when copied out
 * (a batch, an evaluation chunk). Labels are int32. The sampler splits each
 * global batch of a seeded per-epoch permutation into `world` contiguous shards; its state is
 * plain data for checkpoints. The loader copies the next batch on a thread while the current
 * step runs.
 *
 * Dimensions: N = samples, C = channels, H = height, W = width, B = global batch. */
#ifndef DTRAIN_DATA_H
#define DTRAIN_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- IDX files ---------------------------------------------------------------------------- */

/* Element types of the IDX format (the third byte of the magic number). */
typedef enum dt_idx_type {
  DT_IDX_U8 = 0x08,
  DT_IDX_I8 = 0x09,
  DT_IDX_I16 = 0x0B,
  DT_IDX_I32 = 0x0C,
  DT_IDX_F32 = 0x0D,
  DT_IDX_F64 = 0x0E,
} dt_idx_type;

#define DT_IDX_MAX_DIMS 8
/* Default bound on the decoded element bytes of one IDX file (a header claiming more is refused
 * before anything is allocated): 8 GiB, far above any MNIST-style set. */
#define DT_IDX_DEFAULT_MAX_BYTES (8ull << 30)

/* A decoded IDX array; caller-owned struct, dt_idx_free releases data. */
typedef struct dt_idx {
  dt_idx_type type;
  int ndim;
  uint64_t dims[DT_IDX_MAX_DIMS];
  uint64_t count;     /* product of dims */
  size_t elem_size;   /* bytes per element */
  void *data;         /* count * elem_size bytes, multi-byte values in host byte order */
} dt_idx;

/* Reads an IDX file, gzip'd (detected by the magic 1f 8b) or raw. max_bytes bounds the decoded
 * data (0: DT_IDX_DEFAULT_MAX_BYTES). Blocks on file I/O. On failure returns DT_ERR_NOT_FOUND
 * (missing file), DT_ERR_IO, DT_ERR_CORRUPT (bad magic, truncated, trailing bytes, bad gzip),
 * DT_ERR_UNSUPPORTED (unknown element type) or DT_ERR_NOMEM; the detail names the file and the
 * problem; *out is zeroed and nothing leaks. */
dt_status dt_idx_read(const char *path, uint64_t max_bytes, dt_idx *out);
/* Same from memory (gzip'd or raw); name is used in messages. The buffer is borrowed. */
dt_status dt_idx_parse(const void *buf, size_t n, const char *name, uint64_t max_bytes, dt_idx *out);
void dt_idx_free(dt_idx *idx);

/* ---- datasets ----------------------------------------------------------------------------- */

/* Where Debian's dataset-fashion-mnist package puts the files. */
#define DT_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

typedef enum dt_split { DT_SPLIT_TRAIN = 0, DT_SPLIT_TEST = 1 } dt_split;

typedef struct dt_dataset_opts {
  bool normalize;   /* x = (pixel/255 - mean) / std when true; pixel/255 otherwise */
  float mean, std;
} dt_dataset_opts;

/* Images and labels in memory; caller-owned struct, dt_dataset_free releases the arrays.
 * A caller building one by hand fills n, c, h, w, num_classes, pixels and labels (allocated
 * with malloc, or freed by itself instead of dt_dataset_free) and then calls
 * dt_dataset_set_scaling. */
typedef struct dt_dataset {
  uint64_t n;          /* N */
  int c, h, w;         /* C, H, W of one image */
  int num_classes;     /* max label + 1 */
  uint8_t *pixels;     /* (N, C, H, W) as stored in the file */
  int32_t *labels;     /* (N) */
  float value[256];    /* value[p]: the float pixel value p stands for (dt_dataset_set_scaling) */
} dt_dataset;

/* Loads an images file (u8 IDX, 3 dims N,H,W or 4 dims N,C,H,W) and a labels file (u8 IDX,
 * 1 dim N). opts may be NULL. Errors as dt_idx_read; a count mismatch between the two files,
 * or an image file of the wrong rank, is DT_ERR_CORRUPT naming both files. */
dt_status dt_dataset_load_idx(const char *images_path, const char *labels_path,
                              const dt_dataset_opts *opts, dt_dataset *out);
/* Loads the standard MNIST-family names from dir (NULL: DT_FASHION_MNIST_DIR):
 * train-images-idx3-ubyte[.gz] + train-labels-idx1-ubyte[.gz] for DT_SPLIT_TRAIN, t10k-* for
 * DT_SPLIT_TEST; the .gz name is tried first. A missing file is DT_ERR_NOT_FOUND naming the path
 * (callers add the hint "apt-get install dataset-fashion-mnist"). */
dt_status dt_dataset_load_dir(const char *dir, dt_split split, const dt_dataset_opts *opts,
                              dt_dataset *out);
/* The file dt_dataset_load_dir reads for split's images (labels false) or labels, into path
 * (cap bytes): dir/<name>.gz if it exists, else dir/<name>. Errors as dt_dataset_load_dir. */
dt_status dt_dataset_dir_path(const char *dir, dt_split split, bool labels, char *path,
                              size_t cap);
void dt_dataset_free(dt_dataset *ds);
/* Fills ds->value: value[p] = p/255, or (p/255 - mean)/std with opts->normalize, computed as
 * p * (1/(255 std)) - mean/std in float, the same bits for every copy. opts may be NULL.
 * DT_ERR_INVALID when normalizing with std <= 0. The loaders call it; hand-built sets must. */
dt_status dt_dataset_set_scaling(dt_dataset *ds, const dt_dataset_opts *opts);
/* Writes images first .. first+n-1 as float (n, C, H, W) to x (caller-owned, n*C*H*W floats).
 * The caller keeps first + n <= N. Never allocates or blocks. */
void dt_dataset_images(const dt_dataset *ds, uint64_t first, uint64_t n, float *x);
/* Writes the images idx[0..n-1] as float (n, C, H, W) to x and their labels to y (either may
 * be NULL to skip it). Indices must be < N. Never allocates or blocks. */
void dt_dataset_gather(const dt_dataset *ds, const uint32_t *idx, uint64_t n, float *x,
                       int32_t *y);

/* ---- distributed sampler ------------------------------------------------------------------ */

/* Everything needed to resume at an exact position; plain data, identical on every rank. */
typedef struct dt_sampler_state {
  uint64_t seed;
  uint64_t epoch;
  uint64_t pos;     /* samples of this epoch's permutation already handed out (all ranks) */
} dt_sampler_state;

typedef struct dt_sampler_cfg {
  uint64_t num_samples;   /* N */
  uint64_t global_batch;  /* B, summed over ranks */
  int rank, world;
  uint64_t seed;
  bool shuffle;           /* false: identity order every epoch (evaluation) */
  bool drop_last;         /* drop the final global batch of an epoch when it has < B samples */
} dt_sampler_cfg;

/* Caller-owned. Each epoch is a permutation of 0..N-1 that depends only on (seed, epoch), so
 * every rank draws the same one. Each global batch (B consecutive permutation entries, the last
 * one possibly shorter) is split into `world` contiguous shards: with b samples in the batch,
 * rank r gets b/world samples, plus one if r < b % world, starting after the shards of ranks
 * 0..r-1. So the first b % world ranks carry one extra sample, and a rank may get 0 samples in
 * a short last batch. Shards of one batch are disjoint and cover it. */
typedef struct dt_sampler {
  dt_sampler_cfg cfg;
  dt_sampler_state st;
  uint32_t *perm;          /* (N) permutation of the current epoch */
} dt_sampler;

/* Validates cfg (N >= 1 and < 2^32, B >= 1, 0 <= rank < world) and builds epoch 0's
 * permutation. Allocates N * 4 bytes. */
dt_status dt_sampler_init(dt_sampler *s, const dt_sampler_cfg *cfg);
void dt_sampler_free(dt_sampler *s);
/* Global batches per epoch (counting a short last one unless drop_last). */
uint64_t dt_sampler_steps_per_epoch(const dt_sampler *s);
/* Largest shard this rank can receive: ceil(B / world). Size idx buffers with it. */
uint64_t dt_sampler_max_local(const dt_sampler *s);
/* Writes this rank's sample indices of the next global batch of the current epoch to idx
 * (capacity dt_sampler_max_local) and returns true; *local = count written, *global = size of
 * the whole global batch. Returns false, writing nothing, when the epoch is exhausted. */
bool dt_sampler_next(dt_sampler *s, uint32_t *idx, uint64_t *local, uint64_t *global);
/* Where this rank's shard of a global batch of `global` samples starts in it: the number of
 * samples the ranks before it get (the split dt_sampler_next makes). */
uint64_t dt_sampler_shard_first(const dt_sampler *s, uint64_t global);
/* Starts epoch e at position 0 (rebuilds the permutation). */
void dt_sampler_set_epoch(dt_sampler *s, uint64_t epoch);
/* Continues exactly where st says (a state saved by any rank with any world size and the same
 * N, B and seed). DT_ERR_INVALID if st.seed differs from the config or pos > N. */
dt_status dt_sampler_restore(dt_sampler *s, const dt_sampler_state *st);

/* ---- prefetching loader ------------------------------------------------------------------- */

typedef struct dt_loader dt_loader;

/* One batch as handed out by dt_loader_next. x and y are owned by the loader and valid until the
 * next dt_loader_next, dt_loader_seek or dt_loader_destroy. */
typedef struct dt_batch {
  const float *x;          /* (n, C, H, W) */
  const int32_t *y;        /* (n) */
  uint64_t n;              /* this rank's samples (may be 0 in a short last batch) */
  uint64_t global_n;       /* samples of the global batch over all ranks */
  uint64_t first;          /* position of this rank's first sample in the global batch */
  uint64_t epoch;          /* epoch this batch belongs to */
  uint64_t step;           /* index of this batch within its epoch */
  bool last_in_epoch;      /* no further batch in this epoch */
  dt_sampler_state after;  /* sampler state just after this batch: save it to resume after it */
} dt_batch;

typedef struct dt_loader_opts {
  bool prefetch;           /* true: a thread fills the next batch while the caller works */
} dt_loader_opts;

/* Creates a loader over ds (borrowed; it must outlive the loader) with its own sampler built from
 * cfg (cfg->num_samples must equal ds->n). Batch buffers are allocated here, once: two of them
 * with prefetch. Epochs follow one another without end; the caller stops when it has enough.
 * Pixels become float (ds->value) as the batch is assembled, on the prefetch thread.
 * DT_ERR_INVALID for a dataset without pixels, labels or scaling (all of ds->value equal).
 * The batch sequence depends only on (ds, cfg) and any seek, never on thread timing. */
dt_status dt_loader_create(const dt_dataset *ds, const dt_sampler_cfg *cfg,
                           const dt_loader_opts *opts, dt_loader **out);
/* Returns the next batch; blocks until the prefetch thread has filled it. Never allocates. */
dt_status dt_loader_next(dt_loader *l, dt_batch *out);
/* Discards prefetched batches and continues from st (e.g. a checkpoint's dt_batch.after). */
dt_status dt_loader_seek(dt_loader *l, const dt_sampler_state *st);
/* Stops and joins the prefetch thread, frees the buffers. Accepts NULL. */
void dt_loader_destroy(dt_loader *l);

#ifdef __cplusplus
}
#endif
#endif
