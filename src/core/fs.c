/* fs.c - small file-system helpers shared by the layers that write files. */
#include <errno.h>
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
