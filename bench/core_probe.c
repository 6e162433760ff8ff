/* core_probe.c - what the host gives two cores right now, in about 70 ms, for telling apart the
 * states a shared (virtual) machine switches between while a benchmark runs:
 *   handoff_ns  one-way time for a cache line written on one CPU to be seen on the other (a
 *               ping-pong of one atomic, median of 9 batches): tens of ns when the two share
 *               a last-level cache, a few hundred when they do not (another CCD or socket);
 *   speed_ratio how much slower the slower CPU runs a register-only arithmetic loop than the faster,
 *               both running at once (1.00: alike; 1.4: one of them is shared with other work,
 *               e.g. the hypervisor's other guests on its SMT sibling);
 *   together    how much longer that loop takes on average when both CPUs run it at once than
 *               on CPU_A alone (1.00: independent cores; near 2: two threads of one core).
 * Data-parallel workers on the two CPUs exchange cache lines every step and wait for the slower
 * of them, so both numbers bear on their scaling efficiency, while neither touches memory.
 *
 * Usage: core_probe [CPU_A CPU_B]   (default 0 1)   -> one JSON object on stdout.
 * Exit code 1 if the CPUs cannot be pinned (not in this process's affinity mask). */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define ROUNDS 4000  /* handoffs per batch */
#define BATCHES 9
#define FMA_ITERS 12000000 /* about 20 ms */

static _Alignas(64) atomic_int flag;
static int cpu_a, cpu_b;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  return pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

/* The other side of the ping-pong: answers each odd value with the next even one. */
static void *pong(void *arg) {
  (void)arg;
  if (pin(cpu_b) != 0)
    return (void *)1;
  for (int k = 0; k < BATCHES; k++)
    for (int i = 0; i < ROUNDS; i++) {
      int want = 2 * (k * ROUNDS + i) + 1;
      while (atomic_load_explicit(&flag, memory_order_acquire) != want)
        ;
      atomic_store_explicit(&flag, want + 1, memory_order_release);
    }
  return NULL;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* 8 independent multiply-add chains in registers: the core's arithmetic rate, no memory.
 * Returns seconds; the result is folded into *sink so the loop is not removed. */
static double fma_loop(float *sink) {
  float a[8];
  for (int k = 0; k < 8; k++)
    a[k] = 1.0f + (float)k * 1e-7f;
  static volatile float vm = 0.9999999f, vc = 1e-7f; /* unknown to the compiler: no folding */
  const float m = vm, c = vc;
  double t0 = now_s();
  for (long i = 0; i < FMA_ITERS; i++)
    for (int k = 0; k < 8; k++)
      a[k] = a[k] * m + c;
  double t = now_s() - t0;
  for (int k = 0; k < 8; k++)
    *sink += a[k];
  return t;
}

typedef struct fma_job {
  int cpu;
  double secs;
  float sink;
  pthread_barrier_t *go;
} fma_job;

static void *fma_thread(void *arg) {
  fma_job *j = arg;
  pin(j->cpu);
  pthread_barrier_wait(j->go);
  j->secs = fma_loop(&j->sink);
  return NULL;
}

int main(int argc, char **argv) {
  cpu_a = argc > 2 ? atoi(argv[1]) : 0;
  cpu_b = argc > 2 ? atoi(argv[2]) : 1;
  if (argc != 1 && argc != 3) {
    fprintf(stderr, "usage: core_probe [CPU_A CPU_B]\n");
    return 2;
  }
  if (pin(cpu_a) != 0) {
    fprintf(stderr, "core_probe: cannot run on CPU %d\n", cpu_a);
    return 1;
  }
  pthread_t t;
  pthread_create(&t, NULL, pong, NULL);
  double batch_ns[BATCHES];
  for (int k = 0; k < BATCHES; k++) {
    double t0 = now_s();
    for (int i = 0; i < ROUNDS; i++) {
      int v = 2 * (k * ROUNDS + i) + 1;
      atomic_store_explicit(&flag, v, memory_order_release);
      while (atomic_load_explicit(&flag, memory_order_acquire) != v + 1)
        ;
    }
    batch_ns[k] = (now_s() - t0) * 1e9 / (2.0 * ROUNDS);
  }
  void *bad;
  pthread_join(t, &bad);
  if (bad) {
    fprintf(stderr, "core_probe: cannot run on CPU %d\n", cpu_b);
    return 1;
  }
  qsort(batch_ns, BATCHES, sizeof(double), cmp_double);

  float sink = 0;
  double alone = fma_loop(&sink);
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, 2);
  fma_job ja = {.cpu = cpu_a, .go = &go}, jb = {.cpu = cpu_b, .go = &go};
  pthread_t ta, tb;
  pthread_create(&ta, NULL, fma_thread, &ja);
  pthread_create(&tb, NULL, fma_thread, &jb);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  pthread_barrier_destroy(&go);
  double slow = ja.secs > jb.secs ? ja.secs : jb.secs, fast = ja.secs > jb.secs ? jb.secs : ja.secs;
  volatile float keep = sink + ja.sink + jb.sink;
  (void)keep;
  printf("{\"cpus\":[%d,%d],\"handoff_ns\":%.1f,\"handoff_ns_min\":%.1f,\"handoff_ns_max\":%.1f,"
         "\"speed_ratio\":%.3f,\"slower_cpu\":%d,\"together\":%.3f}\n",
         cpu_a, cpu_b, batch_ns[BATCHES / 2], batch_ns[0], batch_ns[BATCHES - 1], slow / fast,
         ja.secs > jb.secs ? cpu_a : cpu_b, (ja.secs + jb.secs) / 2 / alone);
  return 0;
}
