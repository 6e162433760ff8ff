/* bind.c - DTRAIN_BIND: optionally pins each local rank to its own share of the host's CPUs, as
 * mpirun does by default (--bind-to core for two ranks).
 *
 * Why: the tcp and shm transports wait for small messages by polling for a few tens of
 * microseconds (tcp.c, shm.c). Two ranks the scheduler has put on one core (it likes to, since
 * a socket wake-up pulls the woken task next to the waker) then take turns instead of running
 * side by side. Measured on the 2-core KVM guest with other jobs loading it (load average ~15),
 * `dtrain bench allreduce -n 2 --transport tcp --sizes 64:4K --iters 1000`, 2 repetitions
 * alternating with Open MPI: 22-31 us unbound, 7.3-10 us bound (Open MPI over TCP, which
 * mpirun binds: 11.6-26 us). Under the same load, 128 KiB-32 MiB were up to 2x slower bound
 * (`--sizes 64K:64M --iters 20`: a bound rank cannot leave a busy core), hence off by default.
 *
 * Who decides: dt_comm_config.bind when set (the trainer sets "auto" for data-parallel workers
 * that fit, parallel/trainer.c), else DTRAIN_BIND.
 *
 * Policy (DTRAIN_BIND=auto): the CPUs this process may run on are cut into local_size equal
 * consecutive shares and local rank i takes share i, so threads the rank starts afterwards
 * (progress thread, loader, BLAS pools created later) stay in its share. Nothing happens with
 * one local rank, with more local ranks than CPUs (binding would only fix the oversubscription
 * in place), or when the launcher did not say how many ranks share the host. It deliberately is
 * off by default: see above, and a rank running many compute threads may want every core.
 * Only the calling thread and the threads it starts later are bound (Linux semantics); threads
 * that already exist keep their mask. It runs once the world communicator's transport exists
 * (the shm transport reads the unbound CPU set to tell oversubscription); a transport created
 * later by dt_comm_split sees the bound set. `dtrain bench` turns it on for its ranks (bench.c). */
#include <sched.h>
#include <string.h>

#include "comm/comm.h"

dt_status dt__comm_bind(const char *mode, int local_rank, int local_size, int *bound_cpus) {
  if (bound_cpus)
    *bound_cpus = 0;
  const char *v = mode ? mode : dt__env_str("DTRAIN_BIND");
  if (!v || !*v || !strcmp(v, "none"))
    return DT_OK;
  if (strcmp(v, "auto"))
    return dt_set_error(DT_ERR_INVALID, "%s=%s: expected none or auto", mode ? "dt_comm_config.bind" : "DTRAIN_BIND", v);
  if (local_size <= 1 || local_rank < 0 || local_rank >= local_size)
    return DT_OK;
  cpu_set_t have, mine;
  if (sched_getaffinity(0, sizeof have, &have) != 0)
    return dt__errno(DT_ERR_SYSTEM, "DTRAIN_BIND: sched_getaffinity");
  int ncpu = CPU_COUNT(&have);
  if (local_size > ncpu)
    return DT_OK;
  int per = ncpu / local_size, lo = local_rank * per, k = 0;
  CPU_ZERO(&mine);
  for (int i = 0; i < CPU_SETSIZE && k < lo + per; i++)
    if (CPU_ISSET(i, &have)) {
      if (k >= lo)
        CPU_SET(i, &mine);
      k++;
    }
  if (sched_setaffinity(0, sizeof mine, &mine) != 0)
    return dt__errno(DT_ERR_SYSTEM, "DTRAIN_BIND: binding local rank %d of %d to %d CPU(s)", local_rank, local_size,
                     per);
  if (bound_cpus)
    *bound_cpus = per;
  DT_LOG_DEBUG("DTRAIN_BIND=auto: local rank %d of %d bound to %d of %d CPU(s)", local_rank, local_size, per, ncpu);
  return DT_OK;
}
