/* ckpt/ckpt_internal.h - durable file writing and whole-file reading shared by the safetensors
 * and checkpoint code; not part of the public API. */
#ifndef DT_CKPT_INTERNAL_H
#define DT_CKPT_INTERNAL_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "dtrain/core.h"

/* A file being written atomically: bytes go to tmp; commit makes them durable under path. */
typedef struct dt__afile {
  int fd;
  uint64_t written;
  char path[PATH_MAX];
  char tmp[PATH_MAX];
  char dir[PATH_MAX];
} dt__afile;

/* Creates dir/.<base>.tmp.<pid> next to path (O_EXCL). */
dt_status dt__afile_open(dt__afile *f, const char *path);
/* Writes all n bytes (retrying short writes and EINTR); DT_ERR_IO naming path and errno. */
dt_status dt__afile_write(dt__afile *f, const void *buf, size_t n);
/* fsync, close, rename over path, fsync the directory. On failure the temp file is removed. */
dt_status dt__afile_commit(dt__afile *f);
/* Closes and removes the temporary file; keeps the error detail. */
void dt__afile_abort(dt__afile *f);
/* Reads a whole regular file into a 64-byte aligned dt__alloc buffer. */
dt_status dt__ckpt_read_file(const char *path, void **buf, size_t *n);
/* What dt_ckpt_parse and dt_safetensors_parse do first: *name defaults to "(buffer)", a NULL
 * buffer with n > 0 is refused, and *copy receives a dt__alloc'd copy of its n bytes. */
dt_status dt__ckpt_copy_buffer(const void *buf, size_t n, const char **name, void **copy);
/* True for names of temporary files made by dt__afile_open; *pid receives the writer's pid. */
int dt__afile_is_temp(const char *name, long *pid);

#endif
