/* dtrain/ckpt.h - model files (safetensors) and training checkpoints.
 *
 * safetensors is the format PyTorch, NumPy and others load directly: an 8-byte little-endian
 * header length, a JSON header {"name": {"dtype", "shape", "data_offsets"}, "__metadata__":
 * {string: string}}, then the raw little-endian tensor bytes. The reader checks every field
 * against the spec and the file and names the file and the problem on failure.
 *
 * A checkpoint (.dtc) holds the whole training state as named byte sections (parameters, each
 * optimizer buffer, anything else) plus a key/value "meta" section (step, epoch, sampler and RNG
 * state, model spec, world size...), each with its length and CRC32C. Files are written
 * atomically (temporary file, fsync, rename, fsync of the directory), so a crash at any point
 * leaves the previous checkpoint loadable; loading the latest verifies checksums and falls back
 * to the previous file when one is corrupt.
 *
 * This layer takes plain lists of named buffers; it knows nothing about models or optimizers. */
#ifndef DTRAIN_CKPT_H
#define DTRAIN_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A key/value pair of strings (metadata). Borrowed when passed in; owned by the file handle
 * when handed out. */
typedef struct dt_kv {
  const char *key;
  const char *value;
} dt_kv;

/* ---- safetensors -------------------------------------------------------------------------- */

/* The element types of the safetensors spec. */
typedef enum dt_st_dtype {
  DT_ST_BOOL, DT_ST_U8, DT_ST_I8, DT_ST_F8_E5M2, DT_ST_F8_E4M3, DT_ST_I16, DT_ST_U16, DT_ST_F16,
  DT_ST_BF16, DT_ST_I32, DT_ST_U32, DT_ST_F32, DT_ST_F64, DT_ST_I64, DT_ST_U64,
  DT_ST_DTYPE_COUNT
} dt_st_dtype;

/* "F32" etc.; NULL for an out-of-range value. */
const char *dt_st_dtype_name(dt_st_dtype t);
/* Bytes per element; 0 for an out-of-range value. */
size_t dt_st_dtype_size(dt_st_dtype t);

#define DT_ST_MAX_DIMS 16
/* The reference implementation's bound on the JSON header (100 MB); longer headers are refused. */
#define DT_ST_MAX_HEADER 100000000ull

/* One tensor: row-major, little-endian data of prod(shape) * dtype size bytes. */
typedef struct dt_tensor_view {
  const char *name;
  dt_st_dtype dtype;
  int ndim;                      /* 0 for a scalar */
  uint64_t shape[DT_ST_MAX_DIMS];
  const void *data;              /* may be unaligned in files from other writers */
  uint64_t nbytes;
} dt_tensor_view;

/* Writes tensors (data borrowed; nbytes must equal prod(shape) * dtype size) and optional string
 * metadata to path, atomically (temporary file in the same directory, fsync, rename, fsync of
 * the directory). Tensors are laid out in the given order; the header is padded with spaces so
 * the data starts 8-byte aligned. Names must be unique, valid UTF-8 and not "__metadata__".
 * Blocks on I/O; DT_ERR_INVALID for bad input, DT_ERR_IO for write failures (the temporary file
 * is removed and an existing file at path is untouched). */
dt_status dt_safetensors_write(const char *path, const dt_tensor_view *tensors, size_t n,
                               const dt_kv *meta, size_t nmeta);

typedef struct dt_safetensors dt_safetensors;

/* Reads and validates a whole safetensors file: header length bound, JSON syntax, dtypes,
 * shape x dtype size against the offsets, offsets inside the data and neither overlapping nor
 * leaving gaps, and the file length. DT_ERR_CORRUPT / DT_ERR_UNSUPPORTED naming the file and
 * the problem; DT_ERR_NOT_FOUND for a missing file. */
dt_status dt_safetensors_open(const char *path, dt_safetensors **out);
/* The same from memory (copied; buf may be freed afterwards); name appears in messages. */
dt_status dt_safetensors_parse(const void *buf, size_t n, const char *name, dt_safetensors **out);
/* Tensors in header order; views are valid until dt_safetensors_destroy. */
size_t dt_safetensors_count(const dt_safetensors *f);
const dt_tensor_view *dt_safetensors_tensor(const dt_safetensors *f, size_t i);
const dt_tensor_view *dt_safetensors_find(const dt_safetensors *f, const char *name);
size_t dt_safetensors_meta_count(const dt_safetensors *f);
const dt_kv *dt_safetensors_meta(const dt_safetensors *f, size_t i);
const char *dt_safetensors_meta_get(const dt_safetensors *f, const char *key); /* NULL if absent */
/* Byte length of the JSON header (including padding), as stored in the first 8 bytes. */
uint64_t dt_safetensors_header_len(const dt_safetensors *f);
void dt_safetensors_destroy(dt_safetensors *f);

/* ---- checkpoints -------------------------------------------------------------------------- */

/* A named section of raw bytes (borrowed when writing; a view into the file when reading, 64-byte
 * aligned in memory). Names are 1..63 bytes; "meta" is reserved for the key/value section. */
typedef struct dt_ckpt_section {
  const char *name;
  const void *data;
  uint64_t nbytes;
  uint32_t crc32c;   /* filled by the reader */
} dt_ckpt_section;

#define DT_CKPT_NAME_MAX 63
#define DT_CKPT_DEFAULT_KEEP 3

typedef struct dt_ckpt dt_ckpt;

/* Writes one checkpoint file at path atomically: a temporary file ".<name>.tmp.<pid>" in the same
 * directory is written, fsync'd, renamed over path, and the directory fsync'd; an existing file
 * at path stays intact until the new one is durable. On any failure (ENOSPC, EFBIG, EIO...) the
 * temporary file is removed and DT_ERR_IO names the path and the reason. Blocks on I/O. */
dt_status dt_ckpt_write(const char *path, uint64_t step, const dt_ckpt_section *sections, size_t n,
                        const dt_kv *meta, size_t nmeta);
/* Writes dir/ckpt-<step, 9 digits>.dtc with dt_ckpt_write (creating dir if needed), then keeps
 * the keep_last (0: DT_CKPT_DEFAULT_KEEP) checkpoints of the highest steps, never deleting the
 * one just written, and removes temporary files left by dead writers. path_out (may be NULL)
 * receives the file's path. A failed write leaves every earlier checkpoint in place. */
dt_status dt_ckpt_save(const char *dir, uint64_t step, const dt_ckpt_section *sections, size_t n,
                       const dt_kv *meta, size_t nmeta, int keep_last, char *path_out,
                       size_t path_cap);

/* Reads a checkpoint and verifies everything: magic, version, header and table checksums,
 * file length (torn or truncated files), section bounds and overlaps, each section's CRC32C,
 * and, for a file named ckpt-<step>.dtc, that it holds that step (a renamed or copied file).
 * DT_ERR_CORRUPT names the file and the section; DT_ERR_UNSUPPORTED for a newer version. */
dt_status dt_ckpt_open(const char *path, dt_ckpt **out);
/* The same from memory (copied); name appears in messages. */
dt_status dt_ckpt_parse(const void *buf, size_t n, const char *name, dt_ckpt **out);
/* Opens the valid checkpoint of the highest step in dir. Corrupt ones are skipped with a warning
 * (logged, and kept in dt_ckpt_skipped) naming the file and the problem; stray temporary files
 * of dead writers are removed. DT_ERR_NOT_FOUND when dir holds no checkpoint file at all,
 * DT_ERR_CORRUPT (listing each file's problem) when none of them is valid. */
dt_status dt_ckpt_open_latest(const char *dir, dt_ckpt **out);
/* Steps of the checkpoint files in dir (valid or not), ascending; *steps is malloc'd. */
dt_status dt_ckpt_list(const char *dir, uint64_t **steps, size_t *n);
/* The same as paths "dir/name", each with the file's real name (ckpt-50.dtc stays so), in the
 * same order; *paths is one malloc'd block holding the strings too: free(*paths) alone. */
dt_status dt_ckpt_list_paths(const char *dir, char ***paths, size_t *n);

uint64_t dt_ckpt_step(const dt_ckpt *c);
const char *dt_ckpt_path(const dt_ckpt *c);
uint32_t dt_ckpt_version(const dt_ckpt *c);
/* What dt_ckpt_open_latest skipped before this one ("" if nothing). */
const char *dt_ckpt_skipped(const dt_ckpt *c);
/* Sections other than "meta", in file order; views valid until dt_ckpt_destroy. */
size_t dt_ckpt_count(const dt_ckpt *c);
const dt_ckpt_section *dt_ckpt_section_at(const dt_ckpt *c, size_t i);
const dt_ckpt_section *dt_ckpt_find(const dt_ckpt *c, const char *name);
size_t dt_ckpt_meta_count(const dt_ckpt *c);
const dt_kv *dt_ckpt_meta_at(const dt_ckpt *c, size_t i);
const char *dt_ckpt_meta_get(const dt_ckpt *c, const char *key); /* NULL if absent */
/* Parses a meta value as an unsigned decimal; DT_ERR_NOT_FOUND / DT_ERR_CORRUPT name the key. */
dt_status dt_ckpt_meta_u64(const dt_ckpt *c, const char *key, uint64_t *out);
void dt_ckpt_destroy(dt_ckpt *c);

#ifdef __cplusplus
}
#endif
#endif
