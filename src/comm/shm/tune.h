/* tune.h - the choice between the two paths of the shm allreduce, broadcast and allgather (the
 * single copy, the staging buffers) by their measured times, per collective and size class: a state machine of rank 0's with no I/O,
 * so that a test can drive it with made-up times (tests/coll/test_shm_tune.c). shm.c publishes
 * what it answers to the other ranks (shm_tune_pick).
 *
 * Each path keeps the times per byte of its last DT__SHM_TUNE_KEEP calls, and the choice is the
 * path with the lower least time. The slower path is timed again in runs of DT__SHM_TUNE_PROBE
 * calls: the first call after a switch pays for it as much as for its path (the other path's
 * buffers took the caches and the address translations), and on the Zen 5 guest the single
 * copy's one call after staged ones read up to 3.5x the single copy's own time that minute. Timed
 * by that one call, a class that had taken the staging buffers while a job's first calls ran
 * slow on either path stayed there, at about 1.5x the time per call, in 9 of 12 jobs of 512 KiB
 * (bench/results/shm-tune-2026-12-05-zen5.txt). */
#ifndef DTRAIN_SHM_TUNE_H
#define DTRAIN_SHM_TUNE_H

#include <stdint.h>

#define DT__SHM_TUNE_KEEP 3  /* times kept per path: the choice compares each path's least */
#define DT__SHM_TUNE_FIRST 8 /* calls on the single copy before the staging buffers are first timed */
#define DT__SHM_TUNE_EVERY 512 /* the slower path timed again every this many calls, and at 16-256 */
#define DT__SHM_TUNE_PROBE 3 /* calls per timing run of the slower path (the first pay for the switch) */

typedef struct dt__shm_tune {
  uint64_t calls;                           /* calls recorded */
  unsigned probe;                           /* calls of probe_path still to run */
  int probe_path;                           /* the slower path, being timed again */
  unsigned n[2];                            /* times kept per path (0: single copy, 1: staging) */
  double ns_per_b[2][DT__SHM_TUNE_KEEP];    /* round robin */
} dt__shm_tune;

/* All zeros is the state before a class's first call. The path for the calls after this one,
 * which takes `path`: the faster (ties: the single copy, 0), or the slower while it is timed. */
int dt__shm_tune_next(dt__shm_tune *u, int path);
/* A call took ns_per_b on `path`. */
void dt__shm_tune_record(dt__shm_tune *u, int path, double ns_per_b);
/* The least of a path's kept times per byte (0 when it has none). */
double dt__shm_tune_least(const dt__shm_tune *u, int path);

#endif
