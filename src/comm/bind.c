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
 * (progress thread, loader, BLAS pools created later) stay in its share. With more local ranks
 * than CPUs (oversubscribed), local rank i takes CPU i mod ncpu: measured on the 2-core guest,
 * quiet, 4 ranks, `DTRAIN_TRANSPORT=tcp DTRAIN_BIND=auto|none dtrain run -n 4 -- first_calls
 * --calls 3000` (bench/first_calls.c), the 4-byte allreduce's window medians 24-40 us pinned
 * against 27-95 unpinned (the unpinned median jumps as the scheduler regroups the ranks). But
 * the first ~300 calls (~100 ms) of a pinned run average 290-340 us, with single calls of
 * 0.5-2.5 ms, so a 3,000-call loop takes 140-168 ms pinned against 122-149 unpinned; the cause
 * of that start-up transient was not found (pinning the threads below did not remove it; with
 * tcp's spinning off it goes, but the steady state doubles). docs/BENCHMARKS-LOG.md. Nothing happens with one
 * local rank or when the launcher did not say how many ranks share the host. It deliberately is
 * off by default: see above, and a rank running many compute threads may want every core.
 * The calling thread, the threads it starts later (Linux semantics) and the communicator's own
 * threads passed in (the heartbeat thread, the store server) are bound; other threads that
 * already exist keep their mask (a pinned rank's own threads then stay on its CPU). It runs before the world
 * communicator's transport is connected; the shm transport judges oversubscription by the
 * CPUs from before (dt_comm.host_cpus). `dtrain bench` turns it on for its ranks (bench.c). */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"

dt_status dt__comm_bind(const char *mode, int local_rank, int local_size, const pthread_t *threads, int nthreads) {
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
  bool over = local_size > ncpu;
  int per = over ? 1 : ncpu / local_size, lo = over ? local_rank % ncpu : local_rank * per, k = 0;
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
  for (int i = 0; i < nthreads; i++) {
    int e = pthread_setaffinity_np(threads[i], sizeof mine, &mine);
    if (e != 0) {
      errno = e;
      return dt__errno(DT_ERR_SYSTEM, "DTRAIN_BIND: binding a communicator thread of local rank %d", local_rank);
    }
  }
  DT_LOG_DEBUG("DTRAIN_BIND=auto: local rank %d of %d bound to %d of %d CPU(s)%s", local_rank, local_size, per, ncpu,
               over ? " (oversubscribed)" : "");
  return DT_OK;
}

void dt__comm_cpus_hex(char *out, size_t n) {
  cpu_set_t have;
  size_t len = 0;
  if (n && sched_getaffinity(0, sizeof have, &have) == 0)
    for (int i = 0; i < CPU_SETSIZE && i / 4 < DT__CPUS_HEX && len + 1 < n; i += 4) {
      int d = 0;
      for (int b = 0; b < 4; b++)
        d |= CPU_ISSET(i + b, &have) ? 1 << b : 0;
      out[len++] = "0123456789abcdef"[d];
    }
  while (len && out[len - 1] == '0')
    len--;
  if (n)
    out[len] = '\0';
}

bool dt__comm_cpus_or(uint8_t *acc, const char *hex) {
  static const char digits[] = "0123456789abcdef";
  size_t len = strnlen(hex, DT__CPUS_HEX + 1);
  if (!len || len > DT__CPUS_HEX || strspn(hex, digits) != len)
    return false;
  for (size_t i = 0; i < len; i++)
    acc[i] |= (uint8_t)(strchr(digits, hex[i]) - digits);
  return true;
}

int dt__comm_cpus(void) {
  cpu_set_t have;
  if (sched_getaffinity(0, sizeof have, &have) == 0)
    return CPU_COUNT(&have);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}
