/* stream.c - the machine's memory bandwidth, STREAM style: copy (c = a), add (c = a + b) and
 * triad (a = b + s * c) over float arrays far larger than the caches, with 1..T threads.
 *
 * It gives the ceiling that the collectives' shared-memory bound in bench/compare-peers is
 * computed from. Bytes are counted as STREAM counts them (reads + writes of the arrays, no
 * write-allocate traffic), and the best of several repetitions is reported, as STREAM does.
 * It deliberately does not pin threads or use non-temporal stores: it measures what ordinary
 * compiled C code (like a reduction kernel) can get.
 *
 * Usage: stream [--mib M] [--threads 1,2] [--reps R]   -> one JSON object on stdout. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct job {
  float *a, *b, *c;
  size_t lo, hi;
  int kind; /* 0 copy, 1 add, 2 triad */
  pthread_barrier_t *start, *stop;
  int rounds;
} job;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void run_kernel(job *j) {
  float *restrict a = j->a, *restrict b = j->b, *restrict c = j->c;
  const float s = 3.0f;
  switch (j->kind) {
  case 0:
    for (size_t i = j->lo; i < j->hi; i++)
      c[i] = a[i];
    break;
  case 1:
    for (size_t i = j->lo; i < j->hi; i++)
      c[i] = a[i] + b[i];
    break;
  default:
    for (size_t i = j->lo; i < j->hi; i++)
      a[i] = b[i] + s * c[i];
    break;
  }
}

/* Each worker runs its slice once per round between two barriers, so the main thread times
 * exactly the rounds and never thread start-up. */
static void *worker(void *arg) {
  job *j = arg;
  for (int r = 0; r < j->rounds; r++) {
    pthread_barrier_wait(j->start);
    run_kernel(j);
    pthread_barrier_wait(j->stop);
  }
  return NULL;
}

/* Best seconds per pass of `kind` with `nt` threads over n elements. The calling thread does
 * slice 0 itself and takes both timestamps, so a timer thread that is descheduled while the
 * workers run (2 cores, 3 threads) cannot shorten the measured interval. */
static double measure(float *a, float *b, float *c, size_t n, int nt, int kind, int reps) {
  pthread_barrier_t start, stop;
  pthread_barrier_init(&start, NULL, (unsigned)nt);
  pthread_barrier_init(&stop, NULL, (unsigned)nt);
  pthread_t th[64];
  job jobs[64];
  for (int t = 0; t < nt; t++) {
    jobs[t] = (job){a, b, c, n * t / nt, n * (t + 1) / nt, kind, &start, &stop, reps + 1};
    if (t > 0 && pthread_create(&th[t], NULL, worker, &jobs[t])) {
      fprintf(stderr, "stream: pthread_create failed\n");
      exit(1);
    }
  }
  double best = 1e30;
  for (int r = 0; r < reps + 1; r++) { /* round 0 is a warm-up */
    double t0 = now_s();
    pthread_barrier_wait(&start);
    run_kernel(&jobs[0]);
    pthread_barrier_wait(&stop);
    double dt = now_s() - t0;
    if (r > 0 && dt < best)
      best = dt;
  }
  for (int t = 1; t < nt; t++)
    pthread_join(th[t], NULL);
  pthread_barrier_destroy(&start);
  pthread_barrier_destroy(&stop);
  return best;
}

int main(int argc, char **argv) {
  size_t mib = 256; /* per array: 3 x 256 MiB is far beyond any L3 here */
  int reps = 8;
  char threads_arg[64] = "1,2";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--mib") && i + 1 < argc)
      mib = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      snprintf(threads_arg, sizeof threads_arg, "%s", argv[++i]);
    else {
      fprintf(stderr, "usage: stream [--mib M] [--threads 1,2] [--reps R]\n");
      return 2;
    }
  }
  if (mib < 1 || reps < 1) {
    fprintf(stderr, "stream: --mib and --reps must be >= 1\n");
    return 2;
  }
  size_t n = mib * 1024 * 1024 / sizeof(float);
  float *a = NULL, *b = NULL, *c = NULL;
  if (posix_memalign((void **)&a, 64, n * sizeof(float)) || posix_memalign((void **)&b, 64, n * sizeof(float)) ||
      posix_memalign((void **)&c, 64, n * sizeof(float))) {
    fprintf(stderr, "stream: cannot allocate 3 x %zu MiB\n", mib);
    return 1;
  }
  for (size_t i = 0; i < n; i++) {
    a[i] = 1.0f;
    b[i] = 2.0f;
    c[i] = 0.5f;
  }
  static const char *names[] = {"copy", "add", "triad"};
  static const int arrays[] = {2, 3, 3}; /* arrays touched per element */
  printf("{\"array_mib\": %zu, \"reps\": %d, \"results\": [", mib, reps);
  int first = 1;
  char *save = NULL;
  for (char *tok = strtok_r(threads_arg, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    int nt = atoi(tok);
    if (nt < 1 || nt > 64) {
      fprintf(stderr, "stream: thread count %d out of 1..64\n", nt);
      return 2;
    }
    for (int k = 0; k < 3; k++) {
      double s = measure(a, b, c, n, nt, k, reps);
      double gbs = (double)arrays[k] * n * sizeof(float) / s / 1e9;
      printf("%s{\"threads\": %d, \"kernel\": \"%s\", \"gbs\": %.3f}", first ? "" : ", ", nt, names[k], gbs);
      first = 0;
    }
  }
  printf("]}\n");
  free(a);
  free(b);
  free(c);
  return 0;
}
