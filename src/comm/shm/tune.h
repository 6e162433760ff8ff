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
 * (bench/results/shm-tune-2026-12-05-zen5.txt).
 *
 * A path timed far slower is timed less often (DT__SHM_TUNE_FAR): on the EPYC Zen 4 guest the
 * staging buffers at times ran a 4 MiB allreduce in 2.1-2.8 ms against the single copy's
 * 0.4-0.5, and each timing run cost the job about 7 ms. Its timing points to a class's 256th call
 * were then 6 runs, now 3 (after the 8th, 32nd and 256th), and 300-call jobs in that state took
 * 0.73-0.96x the time (median 0.86; bench/results/tune-far-2026-12-06-zen4.txt). Timed less
 * often, such a path is taken back later when the host changes: the runs come at least every
 * 1536 calls from the 512th (every 512 before). */
#ifndef DTRAIN_SHM_TUNE_H
#define DTRAIN_SHM_TUNE_H

#include <stdint.h>

#define DT__SHM_TUNE_KEEP 3  /* times kept per path: the choice compares each path's least */
#define DT__SHM_TUNE_FIRST 8 /* calls on the single copy before the staging buffers are first timed */
#define DT__SHM_TUNE_EVERY 512 /* the slower path timed again every this many calls, and at 16-256 */
#define DT__SHM_TUNE_PROBE 3 /* calls per timing run of the slower path (the first pay for the switch) */
/* A timing run that finds the other path at least FAR times slower (least against least) skips
 * the next timing points: 1 after the first such run, then twice as many after each that follows,
 * at most SKIP_MOST, until a run finds it less slow. */
#define DT__SHM_TUNE_FAR 3.0
#define DT__SHM_TUNE_SKIP_MOST 2

typedef struct dt__shm_tune {
  uint64_t calls;                           /* calls recorded */
  unsigned probe;                           /* calls of probe_path still to run */
  int probe_path;                           /* the slower path, being timed again */
  unsigned judge;                           /* times of the timing run still to be recorded */
  unsigned backoff, skip;                   /* timing points skipped after a far slower run; still to skip */
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
