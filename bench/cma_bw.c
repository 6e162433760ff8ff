/* cma_bw.c - how fast one process gets another's memory: with process_vm_readv (what the shm
 * transport's single-copy collectives do with more than two ranks), and with vmsplice into a pipe
 * by the owner plus read from it by the other (what two ranks do, shm.c's SHM_PIPE), against
 * memcpy of the same buffer in the same run. A forked child holds the source buffer; the parent
 * reads all of it per call, `reps` calls per timing (each rate from the median call), three
 * timings per size; both the source and the destination are touched first.
 *
 * Usage: cma_bw [--hugepages] [BYTES...]   (default 65536 1048576 16777216 67108864)
 * --hugepages: both buffers 2 MiB aligned and advised onto transparent huge pages before first
 * use, which makes the kernel's pinning of the source's pages cheaper.
 * Prints one line per size and timing: "<bytes> B: process_vm_readv X GB/s, memcpy Y GB/s,
 * vmsplice+read Z GB/s (vmsplice A us + read B us)": Z from the sum of the two sides' times (the
 * medians A and B: each side's own system call, the handshake between them not counted). The
 * pipe is sized to the buffer (F_SETPIPE_SZ; beyond /proc/sys/fs/pipe-max-size only for root);
 * where it cannot be, the vmsplice column says so. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hugebuf.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int huge;

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The child: per byte on `cmd`, 'v' splices all of src into `data` and answers the seconds it
 * took on `ans`; end of file ends it. Holds src (a copy-on-write twin of the parent's). */
static void child_loop(const char *src, size_t n, int cmd, int data, int ans) {
  char b;
  while (read(cmd, &b, 1) == 1) {
    double t0 = now_s();
    size_t off = 0;
    while (off < n) {
      struct iovec v = {(void *)(src + off), n - off};
      ssize_t w = vmsplice(data, &v, 1, 0);
      if (w <= 0)
        _exit(1);
      off += (size_t)w;
    }
    double t = now_s() - t0;
    if (write(ans, &t, sizeof t) != (ssize_t)sizeof t)
      _exit(1);
  }
  _exit(0);
}

static int one(size_t n) {
  /* src on whole pages (huge ones too), so that the pipe needs a slot per page of n */
  char *src = huge ? bench_buf(n, huge) : aligned_alloc(4096, (n + 4095) / 4096 * 4096), *dst = bench_buf(n, huge);
  int cmd[2], data[2], ans[2];
  if (!src || !dst || pipe(cmd) != 0 || pipe(data) != 0 || pipe(ans) != 0) {
    perror("cma_bw");
    return 1;
  }
  int piped = n <= 0x7fffffff && fcntl(data[1], F_SETPIPE_SZ, (int)n) >= (int)n;
  memset(src, 1, n);
  memset(dst, 2, n);
  pid_t child = fork();
  if (child == 0) {
    close(cmd[1]);
    child_loop(src, n, cmd[0], data[1], ans[1]);
  }
  close(cmd[0]);
  int reps = (int)(1e9 / (double)n);
  reps = reps < 3 ? 3 : reps > 2000 ? 2000 : reps;
  double *tv = malloc(sizeof(double) * (size_t)reps), *tr = malloc(sizeof(double) * (size_t)reps),
         *tc = malloc(sizeof(double) * (size_t)reps), *tm = malloc(sizeof(double) * (size_t)reps);
  int rc = !tv || !tr || !tc || !tm;
  for (int k = 0; k < 3 && !rc; k++) {
    for (int i = 0; i < reps; i++) {
      struct iovec l = {dst, n}, r = {src, n};
      double t0 = now_s();
      if (process_vm_readv(child, &l, 1, &r, 1, 0) != (ssize_t)n) {
        perror("process_vm_readv");
        rc = 1;
        break;
      }
      tc[i] = now_s() - t0;
    }
    for (int i = 0; i < reps; i++) {
      double t0 = now_s();
      memcpy(dst, src, n);
      __asm__ volatile("" : : "r"(dst) : "memory");
      tm[i] = now_s() - t0;
    }
    for (int i = 0; i < reps && piped && !rc; i++) {
      if (write(cmd[1], "v", 1) != 1 || read(ans[0], &tv[i], sizeof tv[i]) != (ssize_t)sizeof tv[i]) {
        perror("cma_bw: the child");
        rc = 1;
        break;
      }
      double r0 = now_s();
      for (size_t off = 0; off < n;) {
        ssize_t g = read(data[0], dst + off, n - off);
        if (g <= 0) {
          perror("cma_bw: read from the pipe");
          rc = 1;
          break;
        }
        off += (size_t)g;
      }
      tr[i] = now_s() - r0;
    }
    if (rc)
      break;
    qsort(tc, (size_t)reps, sizeof *tc, cmp_d);
    qsort(tm, (size_t)reps, sizeof *tm, cmp_d);
    printf("%zu B: process_vm_readv %.2f GB/s, memcpy %.2f GB/s", n, (double)n / tc[reps / 2] / 1e9,
           (double)n / tm[reps / 2] / 1e9);
    if (piped) {
      qsort(tv, (size_t)reps, sizeof *tv, cmp_d);
      qsort(tr, (size_t)reps, sizeof *tr, cmp_d);
      double a = tv[reps / 2], b = tr[reps / 2];
      printf(", vmsplice+read %.2f GB/s (vmsplice %.1f us + read %.1f us)\n", (double)n / (a + b) / 1e9, a * 1e6,
             b * 1e6);
    } else {
      printf(", vmsplice+read: no pipe of %zu bytes here\n", n);
    }
  }
  close(cmd[1]);
  waitpid(child, NULL, 0);
  free(tv);
  free(tr);
  free(tc);
  free(tm);
  free(src);
  free(dst);
  return rc;
}

int main(int argc, char **argv) {
  static const size_t def[] = {65536, 1048576, 16777216, 67108864};
  int rc = 0, first = 1;
  if (argc > 1 && !strcmp(argv[1], "--hugepages"))
    huge = 1, first = 2;
  if (argc > first)
    for (int i = first; i < argc && !rc; i++)
      rc = one((size_t)strtoull(argv[i], NULL, 10));
  else
    for (size_t i = 0; i < sizeof def / sizeof def[0] && !rc; i++)
      rc = one(def[i]);
  return rc;
}
