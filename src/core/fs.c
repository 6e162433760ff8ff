/* fs.c - small file-system helpers shared by the layers that read and write files. */
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/core.h"

dt_status dt__mkdir_parents(const char *path) {
  char buf[4096];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
    return dt_set_error(DT_ERR_INVALID, "path too long: %s", path);
  char *slash = strrchr(buf, '/');
  if (!slash || slash == buf)
    return DT_OK;
  *slash = '\0';
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/')
      continue;
    *p = '\0';
    if (mkdir(buf, 0777) && errno != EEXIST)
      return dt__errno(DT_ERR_IO, "creating directory %s", buf);
    *p = '/';
  }
  if (mkdir(buf, 0777) && errno != EEXIST)
    return dt__errno(DT_ERR_IO, "creating directory %s", buf);
  return DT_OK;
}

const char *dt__open_failure(const char *path, int err) {
  struct stat st;
  if (err == ENXIO && stat(path, &st) == 0)
    return S_ISSOCK(st.st_mode) ? "a socket, not a file" : "a FIFO that nobody reads";
  return strerror(err);
}

dt_status dt__read_file(const char *path, uint64_t max_bytes, void **buf, size_t *n) {
  *buf = NULL;
  *n = 0;
  /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer (forever), before
   * the check below could refuse it; on a regular file it changes nothing */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    /* not there, or not for this user (a setting to fix, not a failure to retry) */
    return dt__errno(errno == ENOENT ? DT_ERR_NOT_FOUND : errno == EACCES || errno == EPERM ? DT_ERR_INVALID : DT_ERR_IO,
                     "%s", path);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    dt_status rc = dt__errno(DT_ERR_IO, "%s: fstat", path);
    close(fd);
    return rc;
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return dt_set_error(DT_ERR_INVALID, "%s: not a regular file", path);
  }
  if ((uint64_t)st.st_size > max_bytes) {
    close(fd);
    return dt_set_error(DT_ERR_INVALID, "%s: file is %lld bytes, over the limit of %llu", path,
                        (long long)st.st_size, (unsigned long long)max_bytes);
  }
  size_t len = (size_t)st.st_size;
  uint8_t *b = dt__alloc(len ? len : 1);
  if (!b) {
    close(fd);
    return dt__error_prefix(DT_ERR_NOMEM, "%s", path);
  }
  size_t off = 0;
  while (off < len) {
    ssize_t r = read(fd, b + off, len - off);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      dt_status rc = dt__errno(DT_ERR_IO, "%s: read at offset %zu", path, off);
      close(fd);
      dt__free(b);
      return rc;
    }
    if (r == 0)
      break; /* shrank while reading: parse what is there */
    off += (size_t)r;
  }
  close(fd);
  *buf = b;
  *n = off;
  return DT_OK;
}

int dt__thp_enabled(void) {
  char line[128] = "";
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (!f)
    return -1;
  if (!fgets(line, sizeof line, f))
    line[0] = '\0';
  fclose(f);
  return strstr(line, "[always]") || strstr(line, "[madvise]") ? 1 : strstr(line, "[never]") ? 0 : -1;
}
