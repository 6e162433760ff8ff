/* single_copy_ceiling.c - what the 2-rank single-copy allreduce's data movement costs on this
 * host when nothing synchronizes it: two processes, one per CPU, each with its own input and
 * output (f32, on transparent huge pages, as the shm transport collapses large buffers), run the
 * copies and the reduction of one allreduce over the whole buffer, chunk by chunk, at the same
 * time. No process waits for the other between chunks, so the times are a floor for the real
 * call (src/comm/shm/shm.c, shm_allreduce_cma), not results: nothing here is checked.
 *
 * Four ways of arranging the same work per chunk (rank r owns half r of every chunk):
 *   push:      process_vm_readv the other's half-r input into a cached buffer, reduce it with the
 *              own input into the own output, process_vm_writev that into the other's output
 *              (what shm_allreduce_cma does);
 *   pull-nt:   as push, but the own output written with non-temporal stores, and the other's half
 *              read back from the other's output (process_vm_readv) into a cached buffer and
 *              streamed into the own output;
 *   pull:      as push, but the other's half read from its output straight into the own output;
 *   stream:    the sum reduced into the cached buffer, written from there into the other's output,
 *              then streamed into the own output (DTRAIN_SHM_NT's way).
 * Each way runs `passes` times after a one-second settle (on some guests memory-bound work runs
 * up to 2x slower in the first second of a process); rank 0 prints the median and least pass.
 *
 * Build: gcc -O2 bench/single_copy_ceiling.c -o single_copy_ceiling
 * Usage: single_copy_ceiling [--mib M (64)] [--chunk BYTES (262144)] [--passes N (12)]
 *   (exit 2 on bad usage, 1 when a system call fails: e.g. ptrace_scope forbids process_vm_*) */
#define _GNU_SOURCE
#include <immintrin.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TGT __attribute__((target("avx2")))
enum { PUSH, PULL_NT, PULL, STREAM, WAYS };
static const char *names[WAYS] = {"push", "pull-nt", "pull", "stream"};

typedef struct shared {
  _Atomic int go;
  _Atomic int failed;
  char *in[2], *out[2];
  pid_t pid[2];
} shared;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static char *huge_buf(size_t n) {
  char *p = aligned_alloc(2u << 20, n);
  if (!p)
    return NULL;
  madvise(p, n, MADV_HUGEPAGE);
  for (size_t i = 0; i < n / 4; i++)
    ((float *)p)[i] = 1.0f;
  return p;
}

TGT static void reduce(float *o, const float *a, const float *b, size_t n, int nt) {
  for (size_t i = 0; i < n; i += 8) {
    __m256 v = _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
    if (nt)
      _mm256_stream_ps(o + i, v);
    else
      _mm256_storeu_ps(o + i, v);
  }
  if (nt)
    _mm_sfence();
}

TGT static void copy_nt(char *d, const char *s, size_t n) {
  for (size_t i = 0; i < n; i += 32)
    _mm256_stream_si256((__m256i *)(d + i), _mm256_loadu_si256((const __m256i *)(s + i)));
  _mm_sfence();
}

/* One move between this process (local) and the other (remote); false if it failed. */
static int move(pid_t pid, int write, void *local, char *remote, size_t n) {
  struct iovec l = {local, n}, r = {remote, n};
  ssize_t got = write ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
  return got == (ssize_t)n;
}

static int pass(shared *sh, int me, int way, size_t bytes, size_t chunk, char *buf, char *buf2) {
  const int other = 1 - me;
  const size_t half = chunk / 2;
  char *in = sh->in[me], *out = sh->out[me];
  for (size_t c = 0; c < bytes; c += chunk) {
    size_t mine = c + (size_t)me * half, theirs = c + (size_t)other * half;
    if (!move(sh->pid[other], 0, buf, sh->in[other] + mine, half))
      return 0;
    float *o = way == STREAM ? (float *)buf : (float *)(out + mine);
    reduce(o, (const float *)(in + mine), (const float *)buf, half / 4, way == PULL_NT);
    switch (way) {
    case PUSH:
      if (!move(sh->pid[other], 1, out + mine, sh->out[other] + mine, half))
        return 0;
      break;
    case PULL_NT:
      if (!move(sh->pid[other], 0, buf2, sh->out[other] + theirs, half))
        return 0;
      copy_nt(out + theirs, buf2, half);
      break;
    case PULL:
      if (!move(sh->pid[other], 0, out + theirs, sh->out[other] + theirs, half))
        return 0;
      break;
    default:
      if (!move(sh->pid[other], 1, buf, sh->out[other] + mine, half))
        return 0;
      copy_nt(out + mine, buf, half);
      break;
    }
  }
  return 1;
}

/* Both processes meet at every step k; a partner not there within 10 s (gone) fails the run. */
static void meet(shared *sh, int k) {
  atomic_fetch_add(&sh->go, 1);
  double give_up = now_s() + 10;
  while (atomic_load(&sh->go) < 2 * k && !atomic_load(&sh->failed))
    if (now_s() > give_up) {
      fprintf(stderr, "single_copy_ceiling: the other process did not arrive within 10 s\n");
      atomic_store(&sh->failed, 1);
    }
}

int main(int argc, char **argv) {
  long mib = 64, chunk = 256 << 10, passes = 12;
  for (int i = 1; i < argc; i++) {
    long *dst = !strcmp(argv[i], "--mib") ? &mib : !strcmp(argv[i], "--chunk") ? &chunk
                                            : !strcmp(argv[i], "--passes")      ? &passes
                                                                                : NULL;
    if (!dst || i + 1 >= argc || (*dst = atol(argv[++i])) <= 0 || (dst == &chunk && chunk % 64) ||
        (dst == &passes && passes > 64)) {
      fprintf(stderr, "usage: single_copy_ceiling [--mib M] [--chunk BYTES, a multiple of 64] [--passes N <= 64]\n");
      return 2;
    }
  }
  const size_t bytes = (size_t)mib << 20;
  if (bytes % (size_t)chunk) {
    fprintf(stderr, "single_copy_ceiling: --chunk must divide the buffer\n");
    return 2;
  }
  shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED)
    return 1;
  fflush(stdout);
  pid_t child = fork();
  if (child < 0)
    return 1;
  const int me = child == 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(me, &set);
  sched_setaffinity(0, sizeof set, &set); /* a host with one CPU still runs, shared */
  sh->pid[me] = getpid();
  sh->in[me] = huge_buf(bytes);
  sh->out[me] = huge_buf(bytes);
  char *buf = huge_buf((size_t)chunk), *buf2 = huge_buf((size_t)chunk);
  if (!sh->in[me] || !sh->out[me] || !buf || !buf2)
    atomic_store(&sh->failed, 1);
  int k = 1;
  meet(sh, k++);
  usleep(1000000);
  double t[WAYS][64];
  for (int w = 0; w < WAYS; w++)
    for (int p = 0; p < passes && !atomic_load(&sh->failed); p++) {
      meet(sh, k++);
      double t0 = now_s();
      if (!pass(sh, me, w, bytes, (size_t)chunk, buf, buf2)) {
        perror("single_copy_ceiling: process_vm_readv/writev");
        atomic_store(&sh->failed, 1);
      }
      t[w][p] = now_s() - t0;
    }
  meet(sh, k); /* neither leaves while the other may still copy from or into its buffers */
  if (me == 1)
    _exit(atomic_load(&sh->failed));
  int status = 0;
  waitpid(child, &status, 0);
  if (atomic_load(&sh->failed) || !WIFEXITED(status) || WEXITSTATUS(status))
    return 1;
  printf("# %ld MiB per rank, %ld-byte chunks, %ld passes per way, rank 0's times\n", mib, chunk, passes);
  for (int w = 0; w < WAYS; w++) {
    qsort(t[w], (size_t)passes, sizeof(double), cmp_d);
    printf("%-8s median %.2f ms, least %.2f ms\n", names[w], t[w][passes / 2] * 1e3, t[w][0] * 1e3);
  }
  return 0;
}
