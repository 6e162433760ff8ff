/* dtrain/fault.h - built-in fault injection, for tests and for users who want to rehearse
 * recovery: DTRAIN_FAULTS (set by `dtrain run --inject-fault SPEC`) names faults that fire
 * inside the workers at chosen steps. A training loop calls dt_fault_step() at the top of each
 * step; with DTRAIN_FAULTS unset that is one relaxed atomic load.
 *
 * Spec: items separated by ';', each  KIND[:KEY=VALUE[,KEY=VALUE...]]  or  seed=N.
 *   kill          SIGKILL this worker (a crash: its connections close at once)
 *   stop          SIGSTOP this worker (a hang: nothing closes; only heartbeats reveal it)
 *   exit          _exit(code) without cleanup (code=N, default 1)
 *   delay         sleep ms=D before each message this worker sends, from the step on
 *                 (a slow link or straggler); with no transport hook, before each step
 *   slow          sleep ms=D in each step's compute (just before the optimizer update), from
 *                 the step on: a straggler, a CPU slower or busier than the others'
 *   close         shut down every peer TCP connection of this worker (not the store's):
 *                 a cut link as the peers see it
 *   drop          discard the data frames this worker sends on the tcp transport, from the
 *                 step on (count=N: only N frames; p=P: each frame with probability P, drawn
 *                 from the seed), while the process and its heartbeats stay alive: a link
 *                 that loses data. The receivers name it within about the fault timeout
 *                 ("rank R failed: no data from it for ...") or, if a later frame arrives in
 *                 place of a lost one, at once. Other transports drop nothing.
 *   corrupt-ckpt  damage the newest checkpoint in dir=PATH (mode=flip: bytes in its middle
 *                 flipped, default; mode=truncate: cut to half, a torn write)
 * Keys: rank=R|any (default 0), step=S|A-B (default 0; a range picks one step with the seed),
 *       gen=G|any (restart generation it fires in, DTRAIN_RESTART_COUNT; default 0, so a fault
 *       does not fire again in the job that recovers from it); kill, stop and exit also take
 *       at=start|update (default start: at the top of the step; update: once the step's
 *       gradients are summed across the workers, before this worker's optimizer update, the
 *       point where, with one copy of the parameters per host, the others have started
 *       updating theirs).
 * "any" and ranges are drawn from seed=N (default 1) identically on every worker, so exactly
 * one worker is chosen. Example: "kill:rank=any,step=3-9;seed=7".
 * Every fault that fires writes one line to stderr first:
 *   dtrain fault: rank R KIND at step S (generation G, t=MONO_NS)
 * where MONO_NS is CLOCK_MONOTONIC in ns (comparable across processes on one machine). */
#ifndef DTRAIN_FAULT_H
#define DTRAIN_FAULT_H

#include <stdint.h>

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where in a step a fault fires (at= in the spec). */
typedef enum dt_fault_at { DT_FAULT_AT_START = 0, DT_FAULT_AT_UPDATE = 1 } dt_fault_at;

/* Applies the faults of DTRAIN_FAULTS due at this step (this worker's rank from DTRAIN_RANK,
 * RANK, OMPI_COMM_WORLD_RANK or SLURM_PROCID; world size likewise). Returns DT_ERR_INVALID
 * with the detail naming the bad item if DTRAIN_FAULTS is malformed (checked once, at the
 * first call); kill, stop and exit do not return. Thread-safe. */
dt_status dt_fault_step(int64_t step);

/* The same at a given point of the step: dt_fault_step(s) is dt_fault_point(s,
 * DT_FAULT_AT_START); a training loop calls dt_fault_point(s, DT_FAULT_AT_UPDATE) just before
 * its optimizer update. Faults without at= fire at the start. */
dt_status dt_fault_point(int64_t step, dt_fault_at at);

/* Checks a spec without applying it (what `dtrain run --inject-fault` does before starting
 * anything): DT_OK, or DT_ERR_INVALID with the detail. world_size bounds rank=R. */
dt_status dt_fault_validate(const char *spec, int world_size);

#ifdef __cplusplus
}
#endif

#endif
