/* test_bench_cli.c - `dtrain bench` as a user runs it (the real binary from DTRAIN_BIN):
 * --json rows for every size with the documented keys and no wrong element, on shm and tcp and
 * for every collective; the text table; bad flags exit 2 with a hint; a rank killed with SIGKILL
 * mid-run makes the command exit non-zero naming that rank, without hanging; --window and --fresh
 * (inputs rewritten before every call) check every row; the 2-rank allreduce whose path rank 0
 * chooses by timing both gives right results in every call while it switches. */
#include <dirent.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int failures;
#define EXPECT(cond, ...)                       \
  do {                                          \
    if (!(cond)) {                              \
      fprintf(stderr, "FAIL line %d: ", __LINE__); \
      fprintf(stderr, __VA_ARGS__);             \
      fputc('\n', stderr);                      \
      failures++;                               \
    }                                           \
  } while (0)

/* Runs argv with a time limit; captures stdout and stderr into out/err. Returns the exit code
 * (128+signal if killed). If on_start is set it is called with the child's pid from 'delay_ms'
 * on, every 20 ms until it returns non-zero. */
static int run(char *const argv[], char *out, size_t outn, char *err, size_t errn, int limit_s, int (*on_start)(pid_t),
               int delay_ms) {
  int po[2], pe[2];
  if (pipe(po) || pipe(pe))
    return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(po[1], 1);
    dup2(pe[1], 2);
    close(po[0]);
    close(pe[0]);
    execv(argv[0], argv);
    _exit(127);
  }
  close(po[1]);
  close(pe[1]);
  size_t no = 0, ne = 0;
  time_t end = time(NULL) + limit_s;
  int started = 0;
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int status = -1, open_o = 1, open_e = 1;
  while (open_o || open_e) {
    fd_set fs;
    FD_ZERO(&fs);
    if (open_o)
      FD_SET(po[0], &fs);
    if (open_e)
      FD_SET(pe[0], &fs);
    struct timeval tv = {0, 20000};
    int rc = select((po[0] > pe[0] ? po[0] : pe[0]) + 1, &fs, NULL, NULL, &tv);
    if (rc > 0 && open_o && FD_ISSET(po[0], &fs)) {
      ssize_t k = read(po[0], out + no, outn - 1 - no);
      if (k <= 0)
        open_o = 0;
      else
        no += (size_t)k;
    }
    if (rc > 0 && open_e && FD_ISSET(pe[0], &fs)) {
      ssize_t k = read(pe[0], err + ne, errn - 1 - ne);
      if (k <= 0)
        open_e = 0;
      else
        ne += (size_t)k;
    }
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    long ms = (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
    if (on_start && !started && ms >= delay_ms) {
      started = on_start(pid); /* again next round until it did its job */
    }
    if (time(NULL) > end) {
      fprintf(stderr, "FAIL: %s did not finish within %d s\n", argv[1], limit_s);
      kill(pid, SIGKILL);
      failures++;
      break;
    }
  }
  out[no] = '\0';
  err[ne] = '\0';
  close(po[0]);
  close(pe[0]);
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int count_substr(const char *s, const char *sub) {
  int n = 0;
  for (const char *p = strstr(s, sub); p; p = strstr(p + 1, sub))
    n++;
  return n;
}

static char out[1 << 20], err[1 << 16];

/* Kills (SIGKILL) the worker of rank 1: a child of the bench process whose environment has
 * DTRAIN_RANK=1. */
static int killed_rank = -1;
static int kill_rank1(pid_t bench) {
  DIR *d = opendir("/proc");
  struct dirent *e;
  while (d && (e = readdir(d))) {
    pid_t p = (pid_t)atoi(e->d_name);
    if (p <= 0)
      continue;
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)p);
    FILE *f = fopen(path, "r");
    if (!f)
      continue;
    int ppid = 0;
    if (fscanf(f, "%*d %*s %*c %d", &ppid) != 1)
      ppid = 0;
    fclose(f);
    if (ppid != bench)
      continue;
    snprintf(path, sizeof path, "/proc/%d/environ", (int)p);
    f = fopen(path, "r");
    if (!f)
      continue;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    for (size_t i = 0; i < n; i += strlen(buf + i) + 1)
      if (!strcmp(buf + i, "DTRAIN_RANK=1")) {
        kill(p, SIGKILL);
        killed_rank = 1;
      }
  }
  if (d)
    closedir(d);
  return killed_rank == 1;
}

int main(void) {
  const char *bin = getenv("DTRAIN_BIN");
  if (!bin) {
    fprintf(stderr, "DTRAIN_BIN is not set\n");
    return 2;
  }
  char b[4096];
  snprintf(b, sizeof b, "%s", bin);
  const char *colls[] = {"allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall"};
  const char *tps[] = {"shm", "tcp"};
  for (int t = 0; t < 2; t++)
    for (int k = 0; k < 5; k++) {
      char *argv[] = {b, "bench", (char *)colls[k], "-n", "3", "--transport", (char *)tps[t], "--sizes", "8:64K",
                      "--iters", "3", "--warmup", "1", "--json", NULL};
      int rc = run(argv, out, sizeof out, err, sizeof err, 120, NULL, 0);
      EXPECT(rc == 0, "%s on %s: exit %d, stderr: %s", colls[k], tps[t], rc, err);
      EXPECT(out[0] == '[' && strstr(out, "]"), "%s: not a JSON array: %s", colls[k], out);
      /* 8 B .. 64 KiB; 8 B is less than one f32 per rank for the block collectives: skipped */
      int rows = k == 0 || k == 3 ? 14 : 13;
      EXPECT(count_substr(out, "\"bytes\"") == rows, "%s: %d rows, want %d", colls[k],
             count_substr(out, "\"bytes\""), rows);
      EXPECT(!strstr(out, "\"count\": 0,"), "%s on %s: a row that moves nothing: %s", colls[k], tps[t], out);
      const char *keys[] = {"\"count\":", "\"dtype\": \"f32\"", "\"time_us\":", "\"algbw_gbs\":", "\"busbw_gbs\":",
                            "\"wrong\": 0"};
      for (int j = 0; j < 6; j++)
        EXPECT(count_substr(out, keys[j]) == rows, "%s on %s: key %s in %d rows", colls[k], tps[t], keys[j],
               count_substr(out, keys[j]));
    }
  /* --window: in place in the shared window, every row checked */
  for (int k = 0; k < 3; k++) {
    char *argv[] = {b, "bench", (char *)colls[k], "-n", "3", "--window", "--sizes", "8:256K", "--iters", "3",
                    "--warmup", "1", "--dtype", k == 1 ? "f32" : "f16", "--json", NULL};
    int rc = run(argv, out, sizeof out, err, sizeof err, 120, NULL, 0);
    EXPECT(rc == 0, "%s --window: exit %d, stderr: %s", colls[k], rc, err);
    int rows = k == 1 ? 15 : 16; /* allgather of f32: 8 B is less than one element per rank */
    EXPECT(count_substr(out, "\"wrong\": 0") == rows, "%s --window: %d correct rows, want %d: %s", colls[k],
           count_substr(out, "\"wrong\": 0"), rows, out);
  }
  /* --in-place: DT_IN_PLACE calls on the caller's buffer, the input rewritten before every call,
   * every row checked; on shm with the single copies from 4 KiB (the staged path below that), and
   * on tcp */
  for (int k = 0; k < 4; k++) {
    const char *coll = k < 3 ? colls[k] : "allreduce";
    char *argv[] = {b, "bench", (char *)coll, "-n", "2", "--in-place", "--transport", k < 3 ? "shm" : "tcp",
                    "--sizes", "1K:256K", "--iters", "3", "--warmup", "2", "--dtype", k == 1 ? "f32" : "bf16",
                    "--json", NULL};
    setenv("DTRAIN_SHM_CMA", "4096", 1);
    int rc = run(argv, out, sizeof out, err, sizeof err, 120, NULL, 0);
    unsetenv("DTRAIN_SHM_CMA");
    EXPECT(rc == 0, "%s --in-place (%s): exit %d, stderr: %s", coll, argv[7], rc, err);
    EXPECT(count_substr(out, "\"wrong\": 0") == 9, "%s --in-place (%s): %d correct rows, want 9: %s", coll, argv[7],
           count_substr(out, "\"wrong\": 0"), out);
  }
  /* --fresh: the inputs rewritten before every call, every row checked (with the single copies
   * from 4 KiB, so that both the staged and the single-copy paths see it) */
  for (int k = 0; k < 5; k++) {
    char *argv[] = {b, "bench", (char *)colls[k], "-n", "2", "--fresh", "--sizes", "1K:256K", "--iters", "3",
                    "--warmup", "1", "--json", NULL};
    setenv("DTRAIN_SHM_CMA", "4096", 1);
    int rc = run(argv, out, sizeof out, err, sizeof err, 120, NULL, 0);
    unsetenv("DTRAIN_SHM_CMA");
    EXPECT(rc == 0, "%s --fresh: exit %d, stderr: %s", colls[k], rc, err);
    EXPECT(count_substr(out, "\"wrong\": 0") == 9, "%s --fresh: %d correct rows, want 9: %s", colls[k],
           count_substr(out, "\"wrong\": 0"), out);
  }
  /* The 2-rank allreduce's path chosen by measurement (SHM_TUNE_* in shm.c): 40 calls per size,
   * every one checked (warm-up calls are), while rank 0 times the single copy and the staging
   * buffers in turn, as its debug log says, in each size class */
  {
    char *argv[] = {b,         "bench", "allreduce", "-n", "2", "--transport", "shm", "--sizes", "256K:1M",
                    "--iters", "1",     "--warmup",  "40", "--json", NULL};
    setenv("DTRAIN_LOG", "debug", 1);
    int rc = run(argv, out, sizeof out, err, sizeof err, 120, NULL, 0);
    unsetenv("DTRAIN_LOG");
    EXPECT(rc == 0, "tuned allreduce: exit %d, stderr: %s", rc, err);
    EXPECT(count_substr(out, "\"wrong\": 0") == 3, "tuned allreduce: %d correct rows, want 3: %s",
           count_substr(out, "\"wrong\": 0"), out);
    const char *cls[] = {"allreduces of 256 KiB", "allreduces of 512 KiB", "allreduces of 1024 KiB"};
    /* where single copies are off (too slow here, or not allowed) there is one path: nothing to time */
    bool single = strstr(err, "process_vm_readv moves") && !strstr(err, "copy through staging buffers");
    if (!single)
      printf("tuned allreduce: single copies are off on this host; only the results checked\n");
    for (int k = 0; k < 3 && single; k++) {
      char want[128];
      snprintf(want, sizeof want, "%s and up to twice that take the staging buffers from call", cls[k]);
      EXPECT(strstr(err, want), "tuned allreduce: no '%s' in the debug log: %s", want, err);
    }
  }
  {
    char *argv[] = {b, "bench", "allreduce", "-n", "1", "--window", "--sizes", "8", NULL};
    int rc = run(argv, out, sizeof out, err, sizeof err, 60, NULL, 0);
    EXPECT(rc == 2 && strstr(err, "one rank shares no memory with another"), "--window on one rank: exit %d, stderr %s",
           rc, err);
  }
  /* --hugepages: the single-copy paths on huge-page buffers, every row checked; refused where the
   * host has transparent huge pages off */
  {
    char thp[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f) {
      if (!fgets(thp, sizeof thp, f))
        thp[0] = '\0';
      fclose(f);
    }
    int on = strstr(thp, "[always]") || strstr(thp, "[madvise]");
    char *argv[] = {b, "bench", "allreduce", "-n", "2", "--hugepages", "--sizes", "64K:4M", "--iters", "2",
                    "--warmup", "1", NULL};
    int rc = run(argv, out, sizeof out, err, sizeof err, 120, NULL, 0);
    if (on)
      EXPECT(rc == 0 && count_substr(out, " sum ") == 7 && strstr(out, "buffers on huge pages") &&
                 strstr(out, "MiB of rank 0's buffers on huge pages"),
             "--hugepages: exit %d, out %s, err %s", rc, out, err);
    else
      EXPECT(rc == 2 && strstr(err, "transparent huge pages are off"), "--hugepages with THP off: exit %d, err %s",
             rc, err);
  }
  /* text table, f16 avg and forced algorithms */
  {
    char *argv[] = {b, "bench", "allreduce", "-n", "2", "--dtype", "bf16", "--op", "avg", "--algo", "ring",
                    "--sizes", "1K:4K", "--iters", "2", NULL};
    int rc = run(argv, out, sizeof out, err, sizeof err, 120, NULL, 0);
    EXPECT(rc == 0 && strstr(out, "algbw") && strstr(out, "busbw") && strstr(out, "#wrong") && strstr(out, "bf16"),
           "table: rc %d out %s err %s", rc, out, err);
    EXPECT(count_substr(out, " bf16 ") == 3, "3 rows of bf16 expected: %s", out);
  }
  /* bad usage exits 2 with a hint */
  {
    char *bad[][8] = {{b, "bench", "allfoo", NULL},
                      {b, "bench", "allreduce", "-n", "0", NULL},
                      {b, "bench", "allreduce", "--sizes", "9:3", NULL},
                      {b, "bench", "allreduce", "--dtype", "f128", NULL},
                      {b, "bench", "allreduce", "--algo", "bogus", NULL},
                      {b, "bench", "allreduce", "--frobnicate", NULL},
                      {b, "bench", "broadcast", "--window", NULL},
                      {b, "bench", "allreduce", "--window", "--transport", "tcp", NULL},
                      {b, "bench", "allreduce", "--sizes", "1:3", NULL},
                      /* 3 B, then 6 B past the end: nothing of a whole f32 would be measured */
                      {b, "bench", "allreduce", "--sizes", "3:5", NULL},
                      /* longer than the parser reads (was cut, measuring 8 B-1 KiB) */
                      {b, "bench", "allreduce", "--sizes", "8:00000000000000000000000000000000000000000000000000000000000000000000001024K", NULL},
                      {b, "bench", "allreduce", "--algo", "allgather=ring", NULL},
                      {b, "bench", "allreduce", "--transport", "mpi", NULL},
                      {b, "bench", "broadcast", "--op", "prod", NULL},
                      {b, "bench", "broadcast", "--in-place", NULL},
                      {b, "bench", "alltoall", "--in-place", NULL},
                      {b, "bench", "allreduce", "--in-place", "--fresh", NULL}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
      int rc = run(bad[i], out, sizeof out, err, sizeof err, 30, NULL, 0);
      EXPECT(rc == 2 && strstr(err, "HINT"), "bad usage %zu: exit %d, stderr %s", i, rc, err);
      bool fresh = false;
      for (int j = 0; bad[i][j]; j++)
        fresh = fresh || strcmp(bad[i][j], "--fresh") == 0;
      if (fresh) /* --in-place --fresh: the conflict is named, not only a usage hint */
        EXPECT(strstr(err, "--fresh") && strstr(err, "already"), "--in-place --fresh: stderr %s", err);
    }
  }
  /* --json of a run that times out: nothing on stdout rather than an array that does not parse */
  {
    char *argv[] = {b, "bench", "allreduce", "-n", "2", "--sizes", "8:256M", "--iters", "50", "--timeout", "1",
                    "--json", NULL};
    int rc = run(argv, out, sizeof out, err, sizeof err, 60, NULL, 0);
    EXPECT(rc == 1 && out[0] == '\0' && strstr(err, "timed out"), "--json timed out: exit %d, stdout %.200s, stderr %s",
           rc, out, err);
  }
  /* a rank killed mid-run: non-zero exit naming it, no hang */
  {
    char *argv[] = {b, "bench", "allreduce", "-n", "2", "--sizes", "64M:64M", "--iters", "1000", "--warmup", "0",
                    "--transport", "tcp", NULL};
    int rc = run(argv, out, sizeof out, err, sizeof err, 120, kill_rank1, 1500);
    EXPECT(killed_rank == 1, "did not find rank 1's process to kill");
    EXPECT(rc != 0, "bench with a killed rank exited 0");
    EXPECT(strstr(err, "rank 1"), "stderr does not name rank 1: %s", err);
  }
  printf("%d passed, %d failed\n", failures ? 0 : 1, failures ? 1 : 0);
  return failures ? 1 : 0;
}
