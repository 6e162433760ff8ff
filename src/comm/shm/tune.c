/* tune.c - the choice between the shm allreduce's two paths by their times (tune.h). */
#include "comm/shm/tune.h"

#include <stdbool.h>

double dt__shm_tune_least(const dt__shm_tune *u, int path) {
  double m = 0;
  for (unsigned i = 0; i < u->n[path] && i < DT__SHM_TUNE_KEEP; i++)
    m = (i == 0 || u->ns_per_b[path][i] < m) ? u->ns_per_b[path][i] : m;
  return m;
}

/* 1 if the staging buffers are faster by their least times; the single copy until they are timed. */
static int shm_tune_best(const dt__shm_tune *u) {
  return u->n[1] && u->n[0] && dt__shm_tune_least(u, 1) < dt__shm_tune_least(u, 0);
}

int dt__shm_tune_next(dt__shm_tune *u, int path) {
  if (u->probe && path == u->probe_path) /* a call of the probe's run */
    return --u->probe ? path : !path;    /* its last: back, and choose again once it is recorded */
  if (u->probe)
    return u->probe_path;
  return shm_tune_best(u);
}

void dt__shm_tune_record(dt__shm_tune *u, int path, double ns_per_b) {
  ++u->calls;
  u->ns_per_b[path][u->n[path]++ % DT__SHM_TUNE_KEEP] = ns_per_b;
  if (u->n[path] >= 2 * DT__SHM_TUNE_KEEP) /* kept as KEEP .. 2 KEEP - 1 */
    u->n[path] -= DT__SHM_TUNE_KEEP;
  if (u->judge && path == u->probe_path && --u->judge == 0) { /* the timing run's last time */
    const bool far = dt__shm_tune_least(u, path) >= DT__SHM_TUNE_FAR * dt__shm_tune_least(u, !path);
    u->backoff = !far ? 0 : !u->backoff ? 1 : 2 * u->backoff;
    if (u->backoff > DT__SHM_TUNE_SKIP_MOST)
      u->backoff = DT__SHM_TUNE_SKIP_MOST;
    u->skip = u->backoff;
  }
  if (u->probe)
    return;
  const uint64_t k = u->calls;
  if (!u->n[1] ? k == DT__SHM_TUNE_FIRST : k % DT__SHM_TUNE_EVERY == 0 || (k >= 16 && !(k & (k - 1)))) {
    if (u->skip) {
      u->skip--;
      return;
    }
    u->probe = u->judge = DT__SHM_TUNE_PROBE;
    u->probe_path = !shm_tune_best(u);
  }
}
