/* fileio.c - atomic, durable file replacement and whole-file reads for model and checkpoint
 * files. The sequence write temp -> fsync -> rename -> fsync(dir) means a crash at any point
 * leaves either the old file or the complete new one under the final name, never a mix.
 * It does not lock: one writer per destination directory is the caller's contract. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_internal.h"
#include "core/core.h"

dt_status dt__afile_open(dt__afile *f, const char *path) {
  memset(f, 0, sizeof *f);
  f->fd = -1;
  if (!path || !*path)
    return dt_set_error(DT_ERR_INVALID, "empty output path");
  if (strlen(path) >= sizeof f->path - 32)
    return dt_set_error(DT_ERR_INVALID, "path too long: %s", path);
  snprintf(f->path, sizeof f->path, "%s", path);
  char a[PATH_MAX], b[PATH_MAX];
  snprintf(a, sizeof a, "%s", path);
  snprintf(b, sizeof b, "%s", path);
  const char *d = dirname(a), *base = basename(b);
  snprintf(f->dir, sizeof f->dir, "%s", d);
  int k = snprintf(f->tmp, sizeof f->tmp, "%s/.%s.tmp.%ld", d, base, (long)getpid());
  if (k < 0 || (size_t)k >= sizeof f->tmp)
    return dt_set_error(DT_ERR_INVALID, "path too long: %s", path);
  f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f->fd < 0)
    return dt__errno(errno == ENOENT ? DT_ERR_NOT_FOUND : DT_ERR_IO, "%s: cannot create %s", path,
                     f->tmp);
  return DT_OK;
}

dt_status dt__afile_write(dt__afile *f, const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    /* 64 MiB per call keeps one write(2) bounded in time for very large sections. */
    ssize_t w = write(f->fd, p, DT_MIN(n, (size_t)64 << 20));
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return dt__errno(DT_ERR_IO, "%s: write at offset %llu", f->path,
                       (unsigned long long)f->written);
    }
    if (w == 0)
      return dt_set_error(DT_ERR_IO, "%s: write returned 0 at offset %llu", f->path,
                          (unsigned long long)f->written);
    p += w;
    n -= (size_t)w;
    f->written += (uint64_t)w;
  }
  return DT_OK;
}

void dt__afile_abort(dt__afile *f) {
  int e = errno;
  if (f->fd >= 0)
    close(f->fd);
  f->fd = -1;
  if (f->tmp[0])
    unlink(f->tmp);
  f->tmp[0] = '\0';
  errno = e;
}

dt_status dt__afile_commit(dt__afile *f) {
  dt_status rc;
  if (fsync(f->fd) != 0) {
    rc = dt__errno(DT_ERR_IO, "%s: fsync", f->path);
    dt__afile_abort(f);
    return rc;
  }
  int fd = f->fd;
  f->fd = -1;
  if (close(fd) != 0) {
    rc = dt__errno(DT_ERR_IO, "%s: close", f->path);
    dt__afile_abort(f);
    return rc;
  }
  if (rename(f->tmp, f->path) != 0) {
    rc = dt__errno(DT_ERR_IO, "%s: rename from %s", f->path, f->tmp);
    dt__afile_abort(f);
    return rc;
  }
  f->tmp[0] = '\0';
  /* The rename is durable only once the directory entry is: fsync the directory. */
  int dfd = open(f->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0)
    return dt__errno(DT_ERR_IO, "%s: open directory %s for fsync", f->path, f->dir);
  if (fsync(dfd) != 0 && errno != EINVAL) { /* EINVAL: the file system cannot sync directories */
    rc = dt__errno(DT_ERR_IO, "%s: fsync of directory %s", f->path, f->dir);
    close(dfd);
    return rc;
  }
  close(dfd);
  return DT_OK;
}

int dt__afile_is_temp(const char *name, long *pid) {
  if (name[0] != '.')
    return 0;
  const char *t = strstr(name, ".tmp.");
  if (!t)
    return 0;
  const char *q = t + 5;
  if (!*q)
    return 0;
  char *end;
  errno = 0;
  long v = strtol(q, &end, 10);
  if (*end || errno || v <= 0)
    return 0;
  *pid = v;
  return 1;
}

dt_status dt__ckpt_copy_buffer(const void *buf, size_t n, const char **name, void **copy) {
  if (!*name)
    *name = "(buffer)";
  if (!buf && n)
    return dt_set_error(DT_ERR_INVALID, "%s: NULL buffer", *name);
  if (!(*copy = dt__alloc(n ? n : 1)))
    return dt__error_prefix(DT_ERR_NOMEM, "%s", *name);
  if (n)
    memcpy(*copy, buf, n);
  return DT_OK;
}

dt_status dt__ckpt_read_file(const char *path, void **buf, size_t *n) {
  return dt__read_file(path, UINT64_MAX, buf, n);
}
