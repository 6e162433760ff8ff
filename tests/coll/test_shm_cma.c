/* test_shm_cma.c - the shm transport's single-copy collectives (process_vm_readv/writev between
 * the ranks' own buffers) where they can go wrong, on real processes:
 *   - a rank SIGKILLed while the others are in large single-copy allreduces: every survivor
 *     returns an error naming the dead rank within seconds (never a hang, a crash or DT_OK with
 *     a half-written result);
 *   - the job aborted by one rank while both are in large single-copy allreduces, at 30 moments a
 *     millisecond apart: the other fails naming the abort, and no copy lands in memory the
 *     failed rank unmapped and mapped again after its call returned;
 *   - two ranks calling single-copy allreduces of different sizes: DT_ERR_MISMATCH (or the job's
 *     abort) naming both calls, before either touches the other's buffers;
 *   - a bad DTRAIN_SHM_CMA, DTRAIN_SHM_NT, DTRAIN_SHM_PIPE (or waiting knob): dt_comm_create fails
 *     naming the variable;
 *   - 12 ranks with 4 KiB chunks (slices of 6 lines from 11 peers: more than one chunk's worth);
 *   - a buffer that is not writable, or shorter than the call's count: an error naming the rank
 *     whose buffer it is (not a crash, not the peer blamed);
 *   - ranks that may not read each other's memory (run as an unprivileged user, one of them
 *     PR_SET_DUMPABLE 0: rank 0 itself, or another): every rank takes the staged paths, with
 *     correct results; all of them dumpable, the single copies are on (the probe is real).
 *     Needs root to become that user; skipped otherwise;
 *   - huge pages for the callers' large buffers: a buffer met once is left on small pages, met
 *     twice its whole 2 MiB pages are collapsed onto huge pages (its contents unchanged, the
 *     results right), and so are the 2 MiB pages its unaligned ends lie in where the mapping
 *     holds them whole (the memory around the buffer unchanged; from 2 MiB buffers, which may
 *     have no whole page inside); DTRAIN_SHM_THP=2M collapses one huge page per buffer and call;
 *     DTRAIN_SHM_THP=off, or a buffer advised MADV_NOHUGEPAGE, stays on small pages with the same
 *     results. Where transparent huge pages are "madvise" (elsewhere the
 *     kernel decides alone) and the kernel collapses a scratch buffer (Linux 6.1); skipped
 *     otherwise.
 * Two ranks read each other's pieces from pipes (SHM_PIPE in shm.c; DTRAIN_SHM_PIPE=on, as by
 * default they are only on Zen 4) in calls that fit in them:
 *   - rank 1 SIGKILLed in a loop of allreduces and allgathers that take the pipes: rank 0 fails
 *     naming it within seconds;
 *   - the abort case with 1 MiB calls, at 20 moments half a millisecond apart;
 *   - an allreduce whose input, and an allgather whose output, rank 0 may not read or write
 *     where the pipes take it: rank 0 names its own buffer, rank 1 fails too; the same calls
 *     with the pipes off: rank 1, whose copies meet the bad part, names rank 0's buffer;
 *   - pidfd_getfd or vmsplice refused on rank 0 or rank 1 (seccomp), or a pipe that cannot grow
 *     beyond 64 KiB: both ranks copy a 1 MiB call with process_vm_readv/writev, rightly;
 *   the mismatch case runs that path too (2 ranks, 512 KiB).
 * The results themselves are checked by the collective sweeps (test_coll_sweep_cma_shm). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/check.h"
#include "common/mp.h"
#include "coll/sweep.h"
#include "comm/comm.h"

#define BIG (4u << 20) /* floats: 16 MiB, a few ms per call here */

/* The last rank has a child kill it 300 ms into a loop of calls, most likely while a copy into or
 * out of its buffers is under way; the others loop for at most 20 s and must fail naming it
 * within seconds. 3 ranks: 16 MiB allreduces (process_vm_readv/writev). 2 ranks, through the pipes
 * (SHM_PIPE: calls that fit in them): 1 MiB allreduces and allgathers of 512 KiB blocks, the
 * survivor waiting for pieces that never come or splicing into a pipe nobody reads. */
#define PIPED (1u << 18) /* floats: 1 MiB */
typedef struct {
  size_t count;
  bool gather; /* every other call an allgather of count / 2 per rank */
} kill_case;
static int kill_body(int rank, int size, void *arg) {
  const kill_case *k = arg;
  const int victim = size - 1;
  dt_comm *c = sw_join(rank);
  CHECK(c, "create: %s", dt_last_error());
  float *buf = calloc(k->count, sizeof *buf), *out = calloc(k->count, sizeof *out);
  CHECK(buf && out, "out of memory");
  CHECK(dt_comm_allreduce(c, buf, out, k->count, DT_F32, DT_SUM) == DT_OK, "first allreduce: %s", dt_last_error());
  if (rank == victim) {
    pid_t me = getpid(), kid = fork();
    if (kid == 0) {
      usleep(300000);
      kill(me, SIGKILL);
      _exit(0);
    }
  }
  double t0 = check_now_s(), seen = 0;
  dt_status st = DT_OK;
  for (int i = 0; i < 1000000 && st == DT_OK && check_now_s() - t0 < 20; i++)
    st = k->gather && i % 2 ? dt_comm_allgather(c, buf, out, k->count / 2, DT_F32)
                            : dt_comm_allreduce(c, i % 2 ? DT_IN_PLACE : buf, out, k->count, DT_F32, DT_SUM);
  seen = check_now_s() - t0;
  CHECK(rank != victim, "rank %d survived its own SIGKILL", victim);
  CHECK(st == DT_ERR_PEER || st == DT_ERR_ABORTED, "calls with rank %d killed returned %s: %s", victim,
        dt_strerror(st), dt_last_error());
  char name[32];
  snprintf(name, sizeof name, "rank %d", victim);
  CHECK(strstr(dt_last_error(), name), "the error does not name rank %d: %s", victim, dt_last_error());
  CHECK(seen < 10, "noticed rank %d's death only after %.1f s", victim, seen);
  dt_comm_destroy(c);
  free(buf);
  free(out);
  return 0;
}

/* Rank 0 aborts the job (through a split, from a second thread) at a moment given by *arg (us)
 * while both ranks loop over single-copy allreduces of fresh buffers; a rank whose call failed
 * at once unmaps its buffers and maps a canary over the output's addresses, as a caller that
 * frees and reuses its memory would. The other rank must fail naming the abort, not "buffer not
 * readable" after a copy from freed memory, and no copy may land in the canary: a failed rank
 * leaves the call only once the others stopped touching its buffers. */
typedef struct {
  dt_comm *d;
  int us;
} abort_arg;
static void *abort_later(void *arg) {
  abort_arg *a = arg;
  usleep((useconds_t)a->us);
  dt_comm_abort(a->d, "rehearsed abort");
  return NULL;
}
static size_t abort_count = BIG; /* floats per call: BIG, or PIPED for calls through the pipes */
static int abort_body(int rank, int size, void *arg) {
  (void)size;
  dt_comm *c = sw_join(rank), *d = NULL;
  CHECK(c, "create: %s", dt_last_error());
  CHECK(dt_comm_split(c, 0, rank, &d) == DT_OK, "split: %s", dt_last_error());
  const size_t bytes = (size_t)abort_count * sizeof(float);
  float *in = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  float *out = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(in != MAP_FAILED && out != MAP_FAILED, "mmap: %s", strerror(errno));
  CHECK(dt_comm_allreduce(c, in, out, abort_count, DT_F32, DT_SUM) == DT_OK, "first allreduce: %s", dt_last_error());
  abort_arg a = {d, *(const int *)arg};
  pthread_t th;
  if (rank == 0)
    CHECK(pthread_create(&th, NULL, abort_later, &a) == 0, "pthread_create");
  dt_status st = DT_OK;
  double t0 = check_now_s();
  for (int i = 0; st == DT_OK && check_now_s() - t0 < 10; i++) {
    for (size_t j = 0; j < abort_count; j += 1024) /* fresh inputs, as a training step's */
      in[j] = (float)(i + j);
    st = dt_comm_allreduce(c, in, out, abort_count, DT_F32, DT_SUM);
  }
  /* the caller's memory goes back and comes again, under a canary */
  CHECK(munmap(in, bytes) == 0 && munmap(out, bytes) == 0, "munmap: %s", strerror(errno));
  unsigned char *canary = mmap(out, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  CHECK(canary == (unsigned char *)out, "mmap of the canary: %s", strerror(errno));
  memset(canary, 0x5A, bytes);
  char err[1024];
  snprintf(err, sizeof err, "%s", dt_last_error());
  if (rank == 0)
    pthread_join(th, NULL);
  usleep(100000);
  size_t hit = bytes;
  for (size_t j = 0; j < bytes && hit == bytes; j++)
    if (canary[j] != 0x5A)
      hit = j;
  CHECK(hit == bytes, "byte %zu of memory mapped where the output was, after the call failed, was written", hit);
  CHECK(st == DT_ERR_ABORTED || st == DT_ERR_PEER, "allreduce with the job aborted returned %s: %s", dt_strerror(st), err);
  CHECK(strstr(err, "rehearsed abort"), "the error does not name the abort: %s", err);
  munmap(canary, bytes);
  dt_comm_destroy(d);
  dt_comm_destroy(c);
  return 0;
}

static int mismatch_body(int rank, int size, void *arg) {
  (void)size;
  (void)arg;
  dt_comm *c = sw_join(rank);
  CHECK(c, "create: %s", dt_last_error());
  static float a[1 << 18], b[1 << 18];
  CHECK(dt_comm_allreduce(c, a, b, 1 << 17, DT_F32, DT_SUM) == DT_OK, "warm-up: %s", dt_last_error());
  size_t count = rank == 1 ? 200000 : 1 << 17;
  dt_status st = dt_comm_allreduce(c, a, b, count, DT_F32, DT_SUM);
  CHECK(st == DT_ERR_MISMATCH || st == DT_ERR_ABORTED, "mismatched allreduce returned %s", dt_strerror(st));
  CHECK(strstr(dt_last_error(), "allreduce #2 with 200000 x f32 sum") &&
            strstr(dt_last_error(), "allreduce #2 with 131072 x f32 sum"),
        "the error does not name both calls: %s", dt_last_error());
  dt_comm_destroy(c);
  return 0;
}

/* arg: "NAME=VALUE", set on every rank. */
static int bad_env_body(int rank, int size, void *arg) {
  (void)size;
  char name[64];
  const char *eq = strchr(arg, '=');
  snprintf(name, sizeof name, "%.*s", (int)(eq - (const char *)arg), (const char *)arg);
  setenv(name, eq + 1, 1);
  dt_comm *c = NULL;
  dt_status st = dt_comm_create(NULL, &c);
  if (rank > 0) { /* DTRAIN_SHM_CMA, _NT: only rank 0 reads it (it sets the segment up); the others see it fail */
    CHECK(st != DT_OK, "create succeeded although rank 0's failed");
    return 0;
  }
  CHECK(st == DT_ERR_INVALID, "%s: create returned %s", (const char *)arg, dt_strerror(st));
  CHECK(strstr(dt_last_error(), name), "the error does not name %s: %s", name, dt_last_error());
  return 0;
}

static int many_body(int rank, int size, void *arg) {
  (void)arg;
  dt_comm *c = sw_join(rank);
  CHECK(c, "create: %s", dt_last_error());
  enum { N = 1 << 16 };
  static float in[N], out[N];
  for (int i = 0; i < N; i++)
    in[i] = (float)(rank + 1) * (float)(i % 100);
  for (int rep = 0; rep < 3; rep++) {
    CHECK(dt_comm_allreduce(c, in, out, N, DT_F32, DT_SUM) == DT_OK, "allreduce: %s", dt_last_error());
    float k = (float)size * (float)(size + 1) / 2;
    for (int i = 0; i < N; i++)
      CHECK(out[i] == k * (float)(i % 100), "element %d: %g, expected %g", i, out[i], k * (float)(i % 100));
  }
  dt_comm_destroy(c);
  return 0;
}

/* Kind 2: a 1 MiB allreduce whose input on rank 0 ends in 256 KiB it may not read; kind 3: an
 * allgather of 256 KiB blocks whose output on rank 0 may not be written where rank 1's block
 * goes. Through the pipes (DTRAIN_SHM_PIPE=on) rank 0 splices the second half of each 512 KiB
 * chunk to rank 1, and reads rank 1's block from its pipe: rank 0 names its own buffer, rank 1
 * fails with the job's verdict or naming rank 0. Kinds 4 and 5 are the same calls with the pipes
 * off (process_vm_readv/writev, the default off Zen 4): rank 1 reads that half of rank 0's input
 * and writes its block into rank 0's output, so rank 1 names rank 0's buffer, and rank 0 fails
 * with the job's verdict or naming rank 0. */
static int badbuf_two(dt_comm *c, int rank, int kind) {
  const bool piped = kind < 4, gather = kind & 1;
  const size_t bytes = 1u << 20, bad = 256u << 10;
  float *in = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  float *out = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(in != MAP_FAILED && out != MAP_FAILED, "mmap: %s", strerror(errno));
  CHECK(dt_comm_allreduce(c, in, out, bytes / sizeof(float), DT_F32, DT_SUM) == DT_OK, "warm-up: %s", dt_last_error());
  if (rank == 0)
    CHECK(mprotect(gather ? (char *)out + bad : (char *)in + bytes - bad, bad, gather ? PROT_READ : PROT_NONE) == 0,
          "mprotect: %s", strerror(errno));
  dt_status st = gather ? dt_comm_allgather(c, in, out, bad / sizeof(float), DT_F32)
                        : dt_comm_allreduce(c, in, out, bytes / sizeof(float), DT_F32, DT_SUM);
  const char *e = dt_last_error();
  CHECK(st != DT_OK, "%s with a bad buffer returned DT_OK", gather ? "allgather" : "allreduce");
  const char *own = gather ? "its own buffer is not writable" : "its own buffer is not readable";
  const char *named = gather ? "rank 0's buffer is not writable" : "rank 0's buffer is not readable";
  if (rank == (piped ? 0 : 1)) /* the rank that touches the bad part */
    CHECK(st == DT_ERR_INVALID && ((piped && strstr(e, own)) || strstr(e, named)), "unexpected error: %s", e);
  else
    CHECK(st == DT_ERR_ABORTED || strstr(e, "rank 0"), "unexpected error: %s", e);
  dt_comm_destroy(c);
  munmap(in, bytes);
  munmap(out, bytes);
  return 0;
}

/* arg 0: rank 1's broadcast buffer is read-only; 1: the root's buffer ends (PROT_NONE) halfway
 * through the call's count; 2 to 5: badbuf_two. */
static int badbuf_body(int rank, int size, void *arg) {
  (void)size;
  int kind = *(const int *)arg;
  dt_comm *c = sw_join(rank);
  CHECK(c, "create: %s", dt_last_error());
  if (kind >= 2) /* 2 ranks, a part of rank 0's input or output unusable */
    return badbuf_two(c, rank, kind);
  size_t bytes = 128 << 10;
  float *buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(buf != MAP_FAILED, "mmap: %s", strerror(errno));
  if (kind == 0 && rank == 1)
    CHECK(mprotect(buf, bytes, PROT_READ) == 0, "mprotect: %s", strerror(errno));
  if (kind == 1 && rank == 0)
    CHECK(mprotect((char *)buf + bytes / 2, bytes / 2, PROT_NONE) == 0, "mprotect: %s", strerror(errno));
  dt_status st = dt_comm_broadcast(c, buf, bytes / sizeof(float), DT_F32, 0);
  const char *e = dt_last_error();
  CHECK(st != DT_OK, "broadcast into a bad buffer returned DT_OK");
  if (kind == 0) /* both sides name rank 1's buffer: each as the one it could not write, or by
                  * passing on the other's verdict when that arrives first (rank 1 copies nothing
                  * once it sees the root quit the call) */
    CHECK(strstr(e, "rank 1's buffer is not writable") || strstr(e, "its own buffer is not writable"),
          "unexpected error: %s", e);
  else if (rank == 1)
    CHECK(strstr(e, "rank 0's buffer is not readable"), "unexpected error: %s", e);
  else
    CHECK(st == DT_ERR_ABORTED || strstr(e, "rank 0"), "unexpected error: %s", e);
  dt_comm_destroy(c);
  munmap(buf, bytes);
  return 0;
}

/* 1 MiB of (rank + 1) * (i % 1000) in mib_in, allreduced into mib_out and checked element by
 * element (nodump_body, refuse_body). */
enum { MIB_N = 1 << 18 };
static float mib_in[MIB_N], mib_out[MIB_N];
static int allreduce_mib(dt_comm *c, int rank, int size) {
  for (int i = 0; i < MIB_N; i++)
    mib_in[i] = (float)(rank + 1) * (float)(i % 1000);
  CHECK(dt_comm_allreduce(c, mib_in, mib_out, MIB_N, DT_F32, DT_SUM) == DT_OK, "allreduce: %s", dt_last_error());
  float k = (float)size * (float)(size + 1) / 2;
  for (int i = 0; i < MIB_N; i++)
    CHECK(mib_out[i] == k * (float)(i % 1000), "element %d: %g, expected %g", i, mib_out[i], k * (float)(i % 1000));
  return 0;
}

/* Setting the pipes up refused on one rank (a seccomp filter returning EPERM for one system call,
 * as a container's may): pidfd_getfd (taking the other rank's pipe) or vmsplice (the probe of a
 * rank's own pipe), on rank 0 (which sets the segment up) or rank 1. Both ranks must agree to
 * copy with process_vm_readv/writev instead: a 1 MiB allreduce and allgather give the right
 * results, and the bad-input case of that path (badbuf_two's kind 4) fails as it does there, not
 * as through the pipes. The same when a rank's pipe cannot grow from 64 KiB (fcntl F_SETPIPE_SZ
 * refused): the pipes stay, but a 1 MiB call no longer fits in them. */
typedef struct {
  int rank;
  long nr;
  long arg1; /* only calls with this second argument (fcntl's command), or -1: every call */
} refusal;
static int refuse_body(int rank, int size, void *arg) {
  const refusal *r = arg;
  if (rank == r->rank) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)r->nr, r->arg1 < 0 ? 2 : 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[1])), /* its low half */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)r->arg1, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof f / sizeof f[0], f};
    CHECK(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0,
          "seccomp: %s", strerror(errno));
  }
  dt_comm *c = sw_join(rank);
  CHECK(c, "create: %s", dt_last_error());
  if (allreduce_mib(c, rank, size))
    return 1;
  const int h = MIB_N / 2; /* each rank's block: the first half of its input */
  CHECK(dt_comm_allgather(c, mib_in, mib_out, h, DT_F32) == DT_OK, "allgather: %s", dt_last_error());
  for (int i = 0; i < MIB_N; i++)
    CHECK(mib_out[i] == (float)(i / h + 1) * (float)(i % h % 1000), "allgather element %d: %g", i, mib_out[i]);
  return badbuf_two(c, rank, 4);
}

/* KiB of the mapping holding p that are on huge pages (its AnonHugePages line in smaps), -1 if
 * none was found. */
static long huge_kib(const void *p) {
  FILE *f = fopen("/proc/self/smaps", "r");
  if (!f)
    return -1;
  char line[256];
  long kib = -1;
  bool in = false;
  uintptr_t at = (uintptr_t)p;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
      in = lo <= at && at < hi;
    else if (in && sscanf(line, "AnonHugePages: %ld kB", &kib) == 1)
      break;
  }
  fclose(f);
  return kib;
}

/* `bytes` of private anonymous memory 2 MiB aligned, between two inaccessible pages (so that the
 * kernel cannot merge it with a neighbouring mapping, whose huge pages smaps would count too). */
static void *thp_map(size_t bytes) {
  size_t h = 2u << 20, g = 4096;
  uint8_t *m = mmap(NULL, bytes + 2 * h, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED)
    return NULL;
  uint8_t *p = (uint8_t *)(((uintptr_t)m + h - 1) & ~(uintptr_t)(h - 1));
  if (p - m < (ptrdiff_t)g)
    p += h;
  return mprotect(p, bytes, PROT_READ | PROT_WRITE) == 0 ? p : NULL;
}

/* Whether this host can show the collapse: transparent huge pages "madvise" and MADV_COLLAPSE of
 * a scratch buffer taking. Says why not. */
static bool thp_testable(void) {
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  char line[128] = "";
  if (f) {
    if (!fgets(line, sizeof line, f))
      line[0] = 0;
    fclose(f);
  }
  if (!strstr(line, "[madvise]")) {
    printf("skipped: huge pages for large buffers (transparent huge pages are not 'madvise' here: %s)\n",
           line[0] ? line : "no setting");
    return false;
  }
  size_t bytes = 4u << 20;
  uint8_t *p = thp_map(bytes);
  bool ok = p && (memset(p, 1, bytes), madvise(p, bytes, 25 /* MADV_COLLAPSE */) == 0) && huge_kib(p) > 0;
  if (!ok)
    printf("skipped: huge pages for large buffers (the kernel did not collapse a scratch buffer: %s)\n",
           strerror(errno));
  return ok;
}

/* arg 0: default; 1: DTRAIN_SHM_THP=off; 2: the buffers advised MADV_NOHUGEPAGE; 3:
 * DTRAIN_SHM_THP=2M (one huge page per buffer and call). 8 MiB allreduces (plus the last one in
 * place), 8 MiB broadcasts and allgathers of 4 MiB blocks into 8 MiB of mmap'd buffers, three of
 * each (five for 3). */
static int thp_body(int rank, int size, void *arg) {
  int kind = *(const int *)arg;
  if (kind == 1 || kind == 3)
    setenv("DTRAIN_SHM_THP", kind == 1 ? "off" : "2M", 1);
  dt_comm *c = sw_join(rank);
  CHECK(c, "create: %s", dt_last_error());
  enum { N = 2 << 20 };
  size_t bytes = N * sizeof(float);
  float *in = thp_map(bytes), *out = thp_map(bytes), *bc = thp_map(bytes), *ag = thp_map(bytes);
  CHECK(in && out && bc && ag, "mmap: %s", strerror(errno));
  if (kind == 2)
    CHECK(madvise(in, bytes, MADV_NOHUGEPAGE) == 0 && madvise(out, bytes, MADV_NOHUGEPAGE) == 0 &&
              madvise(bc, bytes, MADV_NOHUGEPAGE) == 0 && madvise(ag, bytes, MADV_NOHUGEPAGE) == 0,
          "madvise: %s", strerror(errno));
  float k = (float)size * (float)(size + 1) / 2;
  const int calls = kind == 3 ? 5 : 3;
  for (int call = 0; call < calls; call++) {
    for (int i = 0; i < N; i++) {
      in[i] = (float)(rank + 1) * (float)(i % 1000 + call);
      bc[i] = rank == 0 ? (float)(i % 777 + call) : -1.0f;
    }
    CHECK(dt_comm_allreduce(c, in, out, N, DT_F32, DT_SUM) == DT_OK, "allreduce %d: %s", call, dt_last_error());
    CHECK(dt_comm_broadcast(c, bc, N, DT_F32, 0) == DT_OK, "broadcast %d: %s", call, dt_last_error());
    CHECK(dt_comm_allgather(c, in, ag, N / 2, DT_F32) == DT_OK, "allgather %d: %s", call, dt_last_error());
    for (int i = 0; i < N; i++) {
      CHECK(out[i] == k * (float)(i % 1000 + call), "call %d element %d: %g", call, i, out[i]);
      CHECK(bc[i] == (float)(i % 777 + call), "broadcast %d element %d: %g", call, i, bc[i]);
      int from = i / (N / 2), j = i % (N / 2); /* block `from` is rank from's first N / 2 inputs */
      CHECK(ag[i] == (float)(from + 1) * (float)(j % 1000 + call), "allgather %d element %d: %g", call, i, ag[i]);
    }
    long hin = huge_kib(in), hout = huge_kib(out), hbc = huge_kib(bc), hag = huge_kib(ag);
    CHECK(hin >= 0 && hout >= 0 && hbc >= 0 && hag >= 0, "no smaps entry for the buffers");
    if (call == 0 || kind == 1 || kind == 2)
      CHECK(hag == 0, "kind %d call %d: %ld KiB of the allgather's output on huge pages", kind, call, hag);
    else if (kind == 3) /* one page more per call at most; at least one by the last (see below) */
      CHECK(hag <= 2048L * call && (call < calls - 1 || hag >= 2048),
            "call %d: %ld KiB of the allgather's output on huge pages", call, hag);
    else
      CHECK(hag > 0, "call %d: the allgather's output is not on huge pages", call);
    if (call == 0 || kind == 1 || kind == 2)
      CHECK(hin == 0 && hout == 0 && hbc == 0, "kind %d call %d: %ld, %ld and %ld KiB of the buffers on huge pages, "
            "expected none", kind, call, hin, hout, hbc);
    else if (kind == 3)
      /* 2 MiB more of each buffer per call from the second, at most. Not exactly: a collapse the
       * kernel refuses (a page it finds in use: the host's own reclaim may be scanning it) ends
       * the buffer's collapses, and the host may split a huge page again; seen under ctest -j2 on
       * a guest running DAMON's pageout, one buffer a page short. */
      CHECK(hin <= 2048L * call && hout <= 2048L * call && hbc <= 2048L * call &&
                (call < calls - 1 || (hin >= 2048 && hout >= 2048 && hbc >= 2048)),
            "call %d: %ld, %ld and %ld KiB of the buffers on huge pages, expected %ld each at most (one page "
            "at least by the last call)", call, hin, hout, hbc, 2048L * call);
    else
      /* (all of them, unless the kernel ran short of huge pages meanwhile) */
      CHECK(hin > 0 && hout > 0 && hbc > 0, "call %d: %ld, %ld and %ld KiB of the %zu KiB buffers on huge pages", call,
            hin, hout, hbc, bytes >> 10);
  }
  CHECK(dt_comm_allreduce(c, DT_IN_PLACE, out, N, DT_F32, DT_SUM) == DT_OK, "in place: %s", dt_last_error());
  for (int i = 0; i < N; i++)
    CHECK(out[i] == (float)size * k * (float)(i % 1000 + calls - 1), "in place element %d: %g", i, out[i]);
  dt_comm_destroy(c);
  return 0;
}

/* The ends of buffers that do not start or end on a 2 MiB boundary: allreduces of an 8 MiB
 * buffer 1 MiB into a 12 MiB mapping (3 whole huge pages inside it, its ends in the 2 MiB pages
 * on either side) and of a 3 MiB one 1 MiB into a 6 MiB mapping (none inside, one page per end),
 * in place; the bytes around them in the mappings carry a pattern. From the second call the
 * mappings hold up to 10 and 4 MiB of huge pages (here: exactly that; at least one page each
 * where the host takes some away, see thp_body), the pattern around the buffers is intact and
 * the results right. A 1 MiB buffer (below SHM_THP_MIN) stays on small pages. */
static int thp_ends_body(int rank, int size, void *arg) {
  (void)arg;
  dt_comm *c = sw_join(rank);
  CHECK(c, "create: %s", dt_last_error());
  const size_t mib = 1u << 20, maps[3] = {12 * mib, 6 * mib, 4 * mib}, lens[3] = {8 * mib, 3 * mib, mib};
  const long most[3] = {10240, 4096, 0}, least[3] = {2048, 2048, 0};
  uint8_t *m[3];
  for (int b = 0; b < 3; b++) {
    CHECK((m[b] = thp_map(maps[b])) != NULL, "mmap: %s", strerror(errno));
    memset(m[b], 0xa5, maps[b]);
  }
  float k = (float)size * (float)(size + 1) / 2;
  for (int call = 0; call < 3; call++) {
    for (int b = 0; b < 3; b++) {
      float *x = (float *)(m[b] + mib);
      size_t n = lens[b] / sizeof(float);
      for (size_t i = 0; i < n; i++)
        x[i] = (float)(rank + 1) * (float)(i % 1000);
      CHECK(dt_comm_allreduce(c, DT_IN_PLACE, x, n, DT_F32, DT_SUM) == DT_OK, "allreduce %d of buffer %d: %s", call,
            b, dt_last_error());
      for (size_t i = 0; i < n; i++)
        CHECK(x[i] == k * (float)(i % 1000), "call %d buffer %d element %zu: %g", call, b, i, x[i]);
      for (size_t o = 0; o < maps[b]; o++)
        if (o < mib || o >= mib + lens[b])
          CHECK(m[b][o] == 0xa5, "call %d: byte %zu of mapping %d, outside the buffer, changed to %#x", call, o, b,
                m[b][o]);
      /* From the second call at most all those pages, and at least one: for the 3 MiB buffer,
       * which holds no whole page, that is one of its ends (not exact: see thp_body on what the
       * host may take away) */
      long kib = huge_kib(m[b]);
      if (call == 0)
        CHECK(kib == 0, "call 0: %ld KiB of mapping %d on huge pages", kib, b);
      else
        CHECK(kib >= least[b] && kib <= most[b], "call %d: %ld KiB of mapping %d on huge pages, expected %ld-%ld",
              call, kib, b, least[b], most[b]);
    }
  }
  dt_comm_destroy(c);
  return 0;
}

/* arg: the rank made non-dumpable, or -1 for none. */
static int nodump_body(int rank, int size, void *arg) {
  int which = *(const int *)arg;
  CHECK(setgroups(0, NULL) == 0 && setgid(65534) == 0 && setuid(65534) == 0, "becoming nobody: %s", strerror(errno));
  CHECK(prctl(PR_SET_DUMPABLE, rank == which ? 0 : 1) == 0, "prctl: %s", strerror(errno));
  dt_comm *c = sw_join(rank);
  CHECK(c, "create: %s", dt_last_error());
  size_t single = c->ops->single_copy ? c->ops->single_copy(c->tp) : 0;
  if (which >= 0)
    CHECK(single == 0, "single copies on although rank %d may not be read", which);
  else
    CHECK(single == 64 << 10, "single copies from %zu bytes, expected 65536 (every rank dumpable)", single);
  if (allreduce_mib(c, rank, size))
    return 1;
  CHECK(dt_comm_broadcast(c, mib_in, MIB_N, DT_F32, size - 1) == DT_OK, "broadcast: %s", dt_last_error());
  for (int i = 0; i < MIB_N; i++)
    CHECK(mib_in[i] == (float)size * (float)(i % 1000), "broadcast element %d: %g", i, mib_in[i]);
  dt_comm_destroy(c);
  return 0;
}

int main(void) {
  setenv("DTRAIN_TRANSPORT", "shm", 1);
  int bad = 0, ran = 0;
  setenv("DTRAIN_SHM_CMA", "64K", 1); /* single copies also with 3 ranks on 2 cores */
  setenv("DTRAIN_SHM_PIPE", "on", 1);  /* the pipes on every CPU (by default only on Zen 4) */
  ran++;
  int codes[3] = {0};
  kill_case big = {BIG, false}, piped = {PIPED, true};
  mp_run_codes(3, kill_body, &big, 60, codes);
  if (codes[0] || codes[1] || codes[2] != 128 + SIGKILL) {
    fprintf(stderr, "FAIL: a rank killed during single-copy allreduces (exit codes %d %d %d)\n", codes[0], codes[1],
            codes[2]);
    bad++;
  }
  ran++;
  mp_run_codes(2, kill_body, &piped, 60, codes);
  if (codes[0] || codes[1] != 128 + SIGKILL) {
    fprintf(stderr, "FAIL: a rank killed during calls through the pipes (exit codes %d %d)\n", codes[0], codes[1]);
    bad++;
  }
  ran++;
  for (int us = 0; us < 30000; us += 1000) /* the abort at every millisecond of a few calls */
    if (mp_run(2, abort_body, &us, 60)) {
      fprintf(stderr, "FAIL: single-copy allreduces with the job aborted %d us into them\n", us);
      bad++;
      break;
    }
  ran++;
  abort_count = PIPED; /* the same through the pipes (two ranks, 1 MiB calls) */
  for (int us = 0; us < 10000; us += 500)
    if (mp_run(2, abort_body, &us, 60)) {
      fprintf(stderr, "FAIL: allreduces through the pipes with the job aborted %d us into them\n", us);
      bad++;
      break;
    }
  abort_count = BIG;
  ran++;
  if (mp_run(2, mismatch_body, NULL, 60)) {
    fprintf(stderr, "FAIL: mismatched single-copy allreduces\n");
    bad++;
  }
  setenv("DTRAIN_SHM_CHUNK", "4096", 1);
  ran++;
  if (mp_run(12, many_body, NULL, 120)) {
    fprintf(stderr, "FAIL: 12 ranks with 4 KiB chunks\n");
    bad++;
  }
  unsetenv("DTRAIN_SHM_CHUNK");
  if (thp_testable()) {
    for (int kind = 0; kind < 4; kind++) {
      ran++;
      if (mp_run(2, thp_body, &kind, 60)) {
        fprintf(stderr, "FAIL: huge pages for large buffers, case %d\n", kind);
        bad++;
      }
    }
    ran++;
    if (mp_run(2, thp_ends_body, NULL, 60)) {
      fprintf(stderr, "FAIL: huge pages for the ends of unaligned buffers\n");
      bad++;
    }
  }
  for (int kind = 0; kind < 6; kind++) {
    ran++;
    if (kind == 4)
      setenv("DTRAIN_SHM_PIPE", "off", 1);
    if (mp_run(2, badbuf_body, &kind, 60)) {
      fprintf(stderr, "FAIL: bad buffer %d\n", kind);
      bad++;
    }
  }
  setenv("DTRAIN_SHM_PIPE", "on", 1);
  const refusal refusals[] = {{0, SYS_pidfd_getfd, -1}, {1, SYS_pidfd_getfd, -1}, {0, SYS_vmsplice, -1},
                              {1, SYS_vmsplice, -1},       {0, SYS_fcntl, F_SETPIPE_SZ}, {1, SYS_fcntl, F_SETPIPE_SZ}};
  for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; i++) {
    ran++;
    if (mp_run(2, refuse_body, (void *)&refusals[i], 60)) {
      fprintf(stderr, "FAIL: rank %d refused system call %ld (%ld) while setting the pipes up\n", refusals[i].rank,
              refusals[i].nr, refusals[i].arg1);
      bad++;
    }
  }
  /* (the waiting knobs used to be clamped silently) */
  const char *bads[] = {"DTRAIN_SHM_CMA=0", "DTRAIN_SHM_CMA=lots", "DTRAIN_SHM_CMA=-5", "DTRAIN_SHM_CMA= -5",
                        "DTRAIN_SHM_SPIN_US=-1", "DTRAIN_SHM_YIELD_US=99999999999", "DTRAIN_SHM_THP=yes", "DTRAIN_SHM_THP=1M",
                        "DTRAIN_SHM_THP=-2M", "DTRAIN_SHM_NT=0", "DTRAIN_SHM_NT=big", "DTRAIN_SHM_NT=-1",
                        "DTRAIN_SHM_PIPE=yes"};
  for (size_t i = 0; i < sizeof bads / sizeof bads[0]; i++) {
    ran++;
    if (mp_run(2, bad_env_body, (void *)bads[i], 60)) {
      fprintf(stderr, "FAIL: %s\n", bads[i]);
      bad++;
    }
  }
  if (geteuid() == 0) {
    int whiches[] = {-1, 0, 1};
    for (int i = 0; i < 3; i++) {
      ran++;
      if (mp_run(3, nodump_body, &whiches[i], 60)) {
        fprintf(stderr, "FAIL: unprivileged ranks, rank %d not dumpable\n", whiches[i]);
        bad++;
      }
    }
  } else {
    printf("skipped: unprivileged ranks (needs root to become nobody)\n");
  }
  printf("%d passed, %d failed\n", ran - bad, bad);
  return bad ? 1 : 0;
}
