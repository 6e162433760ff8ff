/* test_bench_tools.c - the comparison benchmarks' own programs under bench/ (the C helpers and
 * the harness scripts) build cleanly and tell the truth: the Open MPI peer program checks every
 * collective's result and reports it in dtrain bench's JSON row format, the ceilings programs
 * report positive rates, first_calls (linked with libdtrain, run under `dtrain run`) reports every
 * call-time field, dtype_ab checks every dtype's allreduce, mpirun_latency runs both libraries
 * in one mpirun job with every sum checked, and the harnesses reject bad usage
 * with exit code 2 before installing or running anything.
 *
 * It deliberately times nothing (rates are only checked to be positive and finite) and never
 * needs PyTorch. The C helpers are compiled here with -Wall -Wextra -Werror, as the harnesses do.
 * Every child runs under `timeout`. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *src_dir;
static char tmp_dir[256];
static int failures;

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                         \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fputc('\n', stderr);                                                                         \
      failures++;                                                                                  \
    }                                                                                              \
  } while (0)

/* Runs a shell command; returns its exit code (or 128+signal), stdout in out (NUL-terminated). */
static int run(const char *cmd, char *out, size_t cap) {
  FILE *p = popen(cmd, "r");
  if (!p)
    return -1;
  size_t n = 0;
  while (out && n + 1 < cap) {
    size_t r = fread(out + n, 1, cap - 1 - n, p);
    if (r == 0)
      break;
    n += r;
  }
  if (out)
    out[n] = '\0';
  else {
    char sink[4096];
    while (fread(sink, 1, sizeof sink, p) > 0) {
    }
  }
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* Number of occurrences of needle in hay. */
static int count(const char *hay, const char *needle) {
  int k = 0;
  for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
    k++;
  return k;
}

static void test_mpi_coll(void) {
  char cmd[2048], out[16384];
  snprintf(cmd, sizeof cmd, "timeout 120 mpicc -O2 -Wall -Wextra -Werror -o %s/mpi_coll %s/bench/mpi_coll.c -lm 2>&1",
           tmp_dir, src_dir);
  int rc = run(cmd, out, sizeof out);
  CHECK(rc == 0, "mpicc bench/mpi_coll.c failed (%d): %s", rc, out);
  if (rc)
    return;
  static const char *colls[] = {"allreduce", "allgather", "reduce_scatter", "broadcast"};
  for (int n = 2; n <= 3; n++) {
    for (size_t c = 0; c < sizeof colls / sizeof colls[0]; c++) {
      /* 24 B and 12 KiB are whole f32 blocks for 2 and 3 ranks; 4 B is not for the block collectives */
      snprintf(cmd, sizeof cmd,
               "timeout 120 mpirun %s --oversubscribe -np %d %s/mpi_coll --coll %s --sizes 4,24,12288,1048584 "
               "--iters 3 2>/dev/null",
               geteuid() == 0 ? "--allow-run-as-root" : "", n, tmp_dir, colls[c]);
      rc = run(cmd, out, sizeof out);
      CHECK(rc == 0, "mpi_coll %s -np %d exited %d: %s", colls[c], n, rc, out);
      int block = c == 1 || c == 2;
      int rows = block ? 3 : 4;
      CHECK(count(out, "\"bytes\"") == rows, "%s -np %d: want %d rows, got: %s", colls[c], n, rows, out);
      CHECK(count(out, "\"wrong\": 0,") == rows, "%s -np %d: a result was wrong or unchecked: %s", colls[c], n, out);
      CHECK(strstr(out, "\"busbw_gbs\"") && strstr(out, "\"time_us\"") && strstr(out, "\"dtype\": \"f32\""),
            "%s: row format differs from dtrain bench's: %s", colls[c], out);
      CHECK(out[0] == '[', "%s: stdout must be a JSON array: %s", colls[c], out);
    }
  }
  /* --hugepages: the same rows from buffers advised onto huge pages */
  snprintf(cmd, sizeof cmd,
           "timeout 120 mpirun %s -np 2 %s/mpi_coll --coll allreduce --sizes 24,4194304 --iters 3 --hugepages "
           "2>/dev/null",
           geteuid() == 0 ? "--allow-run-as-root" : "", tmp_dir);
  rc = run(cmd, out, sizeof out);
  CHECK(rc == 0 && count(out, "\"wrong\": 0,") == 2, "mpi_coll --hugepages exited %d: %s", rc, out);
  /* --fresh: inputs rewritten and outputs cleared before every timed call; the checked call after
   * them still right for every collective */
  for (size_t c = 0; c < sizeof colls / sizeof colls[0]; c++) {
    snprintf(cmd, sizeof cmd,
             "timeout 120 mpirun %s -np 2 %s/mpi_coll --coll %s --sizes 24,1048584 --iters 3 --fresh 2>/dev/null",
             geteuid() == 0 ? "--allow-run-as-root" : "", tmp_dir, colls[c]);
    rc = run(cmd, out, sizeof out);
    CHECK(rc == 0 && count(out, "\"wrong\": 0,") == 2, "mpi_coll %s --fresh exited %d: %s", colls[c], rc, out);
  }
  /* --in-place: MPI_IN_PLACE calls, the input rewritten into the receive buffer before every timed
   * call; the checked call after them right for every collective; a broadcast refuses it */
  for (size_t c = 0; c + 1 < sizeof colls / sizeof colls[0]; c++) {
    snprintf(cmd, sizeof cmd,
             "timeout 120 mpirun %s -np 2 %s/mpi_coll --coll %s --sizes 24,1048584 --iters 3 --in-place 2>/dev/null",
             geteuid() == 0 ? "--allow-run-as-root" : "", tmp_dir, colls[c]);
    rc = run(cmd, out, sizeof out);
    CHECK(rc == 0 && count(out, "\"wrong\": 0,") == 2, "mpi_coll %s --in-place exited %d: %s", colls[c], rc, out);
  }
  snprintf(cmd, sizeof cmd,
           "timeout 60 mpirun %s -np 1 %s/mpi_coll --coll broadcast --sizes 4 --in-place >/dev/null 2>&1",
           geteuid() == 0 ? "--allow-run-as-root" : "", tmp_dir);
  CHECK(run(cmd, NULL, 0) != 0, "mpi_coll accepted --in-place for a broadcast");
  /* A wrong collective name is a usage error, not a run. */
  snprintf(cmd, sizeof cmd, "timeout 60 mpirun %s -np 1 %s/mpi_coll --coll gather --sizes 4 >/dev/null 2>&1",
           geteuid() == 0 ? "--allow-run-as-root" : "", tmp_dir);
  CHECK(run(cmd, NULL, 0) != 0, "mpi_coll accepted an unknown collective");
}

static void test_ceilings(void) {
  char cmd[4096], out[8192];
  /* sgemm_peak links the static library that sits beside the dtrain binary (--gemm own) */
  char build_dir[1024];
  const char *bin = getenv("DTRAIN_BIN");
  snprintf(build_dir, sizeof build_dir, "%s", bin ? bin : ".");
  char *slash = strrchr(build_dir, '/');
  if (slash)
    *slash = '\0';
  snprintf(cmd, sizeof cmd,
           "timeout 120 gcc -O2 -Wall -Wextra -Werror -o %s/stream %s/bench/stream.c -lpthread 2>&1 && "
           "timeout 120 gcc -O2 -Wall -Wextra -Werror -o %s/tcp_bw %s/bench/tcp_bw.c -lpthread 2>&1 && "
           "timeout 120 gcc -O2 -Wall -Wextra -Werror -o %s/core_probe %s/bench/core_probe.c -lpthread 2>&1 && "
           "timeout 120 gcc -O2 -Wall -Wextra -Werror -o %s/single_copy_ceiling %s/bench/single_copy_ceiling.c 2>&1 && "
           "timeout 120 gcc -O2 -Wall -Wextra -Werror -I%s/include -I%s/src $(pkg-config --cflags openblas) "
           "-o %s/sgemm_peak %s/bench/sgemm_peak.c %s/libdtrain.a $(pkg-config --libs openblas) -lz -lm "
           "-lpthread 2>&1",
           tmp_dir, src_dir, tmp_dir, src_dir, tmp_dir, src_dir, tmp_dir, src_dir, src_dir, src_dir, tmp_dir, src_dir,
           build_dir);
  int rc = run(cmd, out, sizeof out);
  CHECK(rc == 0, "compiling bench/stream.c, tcp_bw.c, core_probe.c, single_copy_ceiling.c, sgemm_peak.c failed: %s",
        out);
  if (rc)
    return;
  snprintf(cmd, sizeof cmd, "timeout 60 %s/stream --mib 8 --reps 2 --threads 1,2", tmp_dir);
  rc = run(cmd, out, sizeof out);
  CHECK(rc == 0 && count(out, "\"gbs\": ") == 6 && !strstr(out, "\"gbs\": 0.000") && !strstr(out, "nan") &&
            !strstr(out, "inf"),
        "stream: %d %s", rc, out);
  snprintf(cmd, sizeof cmd, "timeout 60 %s/tcp_bw --seconds 0.3", tmp_dir);
  rc = run(cmd, out, sizeof out);
  CHECK(rc == 0 && strstr(out, "\"gbs\": ") && !strstr(out, "\"gbs\": 0.0000"), "tcp_bw: %d %s", rc, out);
  /* the exchange, both ways compare-peers runs: both directions at once, each with a positive rate */
  static const char *ways[] = {"--exchange", "--exchange --poll --buffer 4194304"};
  for (int w = 0; w < 2; w++) {
    snprintf(cmd, sizeof cmd, "timeout 60 %s/tcp_bw %s --seconds 0.3", tmp_dir, ways[w]);
    rc = run(cmd, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "\"mode\": \"exchange\"") && strstr(out, "\"gbs_a_to_b\": ") &&
              strstr(out, "\"gbs_b_to_a\": ") && !strstr(out, ": 0.0000") && !strstr(out, "nan"),
          "tcp_bw %s: %d %s", ways[w], rc, out);
  }
  snprintf(cmd, sizeof cmd, "timeout 60 %s/tcp_bw --exchange --seconds 0 >/dev/null 2>&1", tmp_dir);
  CHECK(run(cmd, NULL, 0) == 2, "tcp_bw accepted --seconds 0");
  const char *bad[] = {"--buffer x", "--buffer 4M", "--buffer -1", "--seconds 1s"};
  for (int b = 0; b < 4; b++) {
    snprintf(cmd, sizeof cmd, "timeout 60 %s/tcp_bw --exchange %s >/dev/null 2>&1", tmp_dir, bad[b]);
    CHECK(run(cmd, NULL, 0) == 2, "tcp_bw accepted %s", bad[b]);
  }
  snprintf(cmd, sizeof cmd, "timeout 60 %s/sgemm_peak --n 128 --reps 2 --threads 1", tmp_dir);
  rc = run(cmd, out, sizeof out);
  CHECK(rc == 0 && strstr(out, "\"check_ok\": true"), "sgemm_peak: %d %s", rc, out);
  if (__builtin_cpu_supports("avx512f")) { /* dtrain's own product, and the training shapes */
    snprintf(cmd, sizeof cmd, "timeout 120 %s/sgemm_peak --n 128 --reps 1 --threads 1,2 --gemm own --shapes",
             tmp_dir);
    rc = run(cmd, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "\"gemm\": \"dtrain-avx512\"") && strstr(out, "\"check_ok\": true") &&
              count(out, "\"gflops\": ") == 2 + 14 && !strstr(out, "\"gflops\": 0.00"),
          "sgemm_peak --gemm own: %d %s", rc, out);
  }
  snprintf(cmd, sizeof cmd, "timeout 60 %s/stream --mib 0 >/dev/null 2>&1", tmp_dir);
  CHECK(run(cmd, NULL, 0) == 2, "stream accepted --mib 0");
  /* core_probe: on CPUs 0 and 1 when this process may use both, else it says it cannot */
  cpu_set_t cpus;
  int both = sched_getaffinity(0, sizeof cpus, &cpus) == 0 && CPU_ISSET(0, &cpus) && CPU_ISSET(1, &cpus);
  snprintf(cmd, sizeof cmd, "timeout 60 %s/core_probe 2>&1", tmp_dir);
  rc = run(cmd, out, sizeof out);
  if (both)
    CHECK(rc == 0 && strstr(out, "\"handoff_ns\":") && atof(strstr(out, "\"handoff_ns\":") + 13) > 0 &&
              strstr(out, "\"speed_ratio\":") && atof(strstr(out, "\"speed_ratio\":") + 14) >= 1 &&
              !strstr(out, "nan") && !strstr(out, "inf"),
          "core_probe: %d %s", rc, out);
  else
    CHECK(rc == 1 && strstr(out, "cannot run on CPU"), "core_probe without CPUs 0 and 1: %d %s", rc, out);
  snprintf(cmd, sizeof cmd, "timeout 60 %s/core_probe 0 >/dev/null 2>&1", tmp_dir);
  CHECK(run(cmd, NULL, 0) == 2, "core_probe accepted one CPU");
  /* single_copy_ceiling: a time per way, or (where process_vm_readv is not allowed) a named failure */
  snprintf(cmd, sizeof cmd, "timeout 60 %s/single_copy_ceiling --mib 4 --passes 2 2>&1", tmp_dir);
  rc = run(cmd, out, sizeof out);
  CHECK((rc == 0 && count(out, " ms, least ") == 4 && !strstr(out, "nan")) ||
            (rc == 1 && strstr(out, "process_vm_readv/writev")),
        "single_copy_ceiling: %d %s", rc, out);
  const char *scc_bad[] = {"--chunk 100", "--mib 0", "--passes 65", "--mib 1 --chunk 393216", "--frob 1"};
  for (int b = 0; b < 5; b++) {
    snprintf(cmd, sizeof cmd, "timeout 60 %s/single_copy_ceiling %s >/dev/null 2>&1", tmp_dir, scc_bad[b]);
    CHECK(run(cmd, NULL, 0) == 2, "single_copy_ceiling accepted %s", scc_bad[b]);
  }
}

static void test_harness_usage(void) {
  static const char *bad[] = {
      "bench/compare-peers --ranks 1",
      "bench/compare-peers --colls gather",
      "bench/compare-peers --sides nccl",
      "bench/compare-peers --fresh --in-place",
      "bench/train-vs-pytorch --models resnet",
      "bench/train-vs-pytorch --threads 0",
      "bench/train-vs-pytorch --reps 0",
      "bench/train-vs-pytorch --models mlp --reps cnn=2",
      "bench/train-vs-pytorch --reps mlp=x",
      "bench/ddp-vs-pytorch --workers 1",
      "bench/ddp-vs-pytorch --reps 0",
      "bench/ddp-vs-pytorch --models mlp --reps cnn=2",
      "bench/ddp-vs-pytorch --reps mlp=x",
      "bench/ddp-vs-pytorch --reps mlp=0,cnn=1",
      "bench/ddp-vs-pytorch --max-steps -1",
      "bench/dtypes --reps 0",
      "bench/dtypes --dtypes f16,bf16",
      "bench/dtypes --dtypes f32,f8",
      "bench/dtypes --binaries /nonexistent/dtrain",
  };
  char cmd[2048];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    snprintf(cmd, sizeof cmd, "cd %s && timeout 60 /usr/bin/python3 %s >/dev/null 2>&1", src_dir, bad[i]);
    int rc = run(cmd, NULL, 0);
    CHECK(rc == 2, "'%s' exited %d, want 2 (usage error before any install or run)", bad[i], rc);
  }
  snprintf(cmd, sizeof cmd, "cd %s && timeout 60 /usr/bin/python3 bench/compare-peers --help >/dev/null 2>&1", src_dir);
  CHECK(run(cmd, NULL, 0) == 0, "compare-peers --help failed");
  /* --reps as both training benchmarks read it (bench/benchlib.py): repetition k uses seed k, all
   * models' repetition k before any repetition k+1, accuracy the mean over the seeds. */
  snprintf(cmd, sizeof cmd,
           "cd %s/bench && timeout 60 /usr/bin/python3 -c '"
           "import benchlib as b\n"
           "r = b.parse_reps(\"mlp=3,cnn=1\", [\"mlp\", \"cnn\"])\n"
           "assert r == {\"mlp\": 3, \"cnn\": 1}, r\n"
           "assert b.parse_reps(\"2\", [\"mlp\", \"cnn\"]) == {\"mlp\": 2, \"cnn\": 2}\n"
           "s = list(b.rep_schedule(r, [\"mlp\", \"cnn\"]))\n"
           "assert s == [(0, 1, \"mlp\"), (0, 1, \"cnn\"), (1, 2, \"mlp\"), (2, 3, \"mlp\")], s\n"
           "a, t = b.accuracy_over_seeds([{\"test_accuracy\": 0.8}, {\"test_accuracy\": 0.9}])\n"
           "assert abs(a - 0.85) < 1e-12 and t == \"85.00%% (80.00-90.00)\", t\n"
           "print(\"reps ok\")' 2>&1",
           src_dir);
  char out[4096];
  int rc = run(cmd, out, sizeof out);
  CHECK(rc == 0 && strstr(out, "reps ok"), "benchlib --reps helpers: exit %d: %s", rc, out);
  /* compare-peers' tables with rounds: a side's rows are keyed by (repetition, round), the
   * ratio pairs the two sides' rows of one round, the time is the median over every round, and
   * the latency target also gives the worst ratio of the means (two clusters of draws: dtrain
   * 0.3/0.8 us, the peer 0.5/0.9, so the medians say 1.6x and the means 0.91x). */
  snprintf(cmd, sizeof cmd,
           "cd %s/bench && timeout 60 /usr/bin/python3 -c '"
           "import importlib.machinery as m, importlib.util as u\n"
           "ld = m.SourceFileLoader(\"cp\", \"compare-peers\")\n"
           "cp = u.module_from_spec(u.spec_from_loader(\"cp\", ld)); ld.exec_module(cp)\n"
           "row = lambda t: {\"time_us\": t, \"busbw_gbs\": 0, \"wrong\": 0}\n"
           "k = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]\n"
           "d = dict(zip(k, [0.3, 0.8, 0.8, 0.3, 0.8])); o = dict(zip(k, [0.5, 0.5, 0.9, 0.9, 0.5]))\n"
           "res = {(\"allreduce\", 2, \"dtrain-shm\"): {4: [(x, row(d[x])) for x in k]},\n"
           "       (\"allreduce\", 2, \"ompi-shm\"): {4: [(x, row(o[x])) for x in k]}}\n"
           "t, s = cp.table(\"allreduce\", 2, \"dtrain-shm\", \"ompi-shm\", \"shm\", res, {\"mem\": {}}, 2, [4])\n"
           "r = s[0]\n"
           "assert (r[\"dtrain_us\"], r[\"peer_us\"]) == (0.8, 0.5), r\n"
           "assert abs(r[\"ratio\"] - 0.9 / 0.8) < 1e-12 and abs(r[\"ratio_max\"] - 0.9 / 0.3) < 1e-12, r\n"
           "lat = [x for x in cp.targets({(\"allreduce\", 2, \"dtrain-shm\", \"ompi-shm\"): s}) if \"latency dtrain/Open MPI at\" in x][0]\n"
           "assert \"1.60 (target <= 1.0: NOT met); of the means over repetitions and rounds: 0.91\" in lat, lat\n"
           "print(\"rounds ok\")' 2>&1",
           src_dir);
  rc = run(cmd, out, sizeof out);
  CHECK(rc == 0 && strstr(out, "rounds ok"), "compare-peers' tables over rounds: exit %d: %s", rc, out);
  /* bench/dtypes end to end on two tiny sizes: a row per dtype and binary, and the summary with
   * both half types' ratios to f32 (values are not checked: they are timings) */
  const char *bin = getenv("DTRAIN_BIN");
  if (bin) {
    static char big[16384];
    snprintf(cmd, sizeof cmd,
             "cd %s && timeout 120 /usr/bin/python3 bench/dtypes --binaries %s,%s --reps 1 --sizes 4:8 --iters 2 "
             "--warmup 1 2>&1",
             src_dir, bin, bin);
    rc = run(cmd, big, sizeof big);
    CHECK(rc == 0 && count(big, "shm 1 f32 [") == 2 && count(big, "shm 1 f16 [") == 2 &&
              count(big, "shm 1 bf16 [") == 2 && count(big, "| 4 |") == 2 && count(big, "| 8 |") == 2 &&
              strstr(big, "f16/f32") && strstr(big, "bf16/f32"),
          "bench/dtypes: exit %d: %s", rc, big);
    /* --fresh reaches every run's command line, and the runs still check their results */
    snprintf(cmd, sizeof cmd,
             "cd %s && timeout 120 /usr/bin/python3 bench/dtypes --binaries %s --reps 1 --sizes 4:8 --iters 2 "
             "--warmup 1 --fresh 2>&1",
             src_dir, bin);
    rc = run(cmd, big, sizeof big);
    CHECK(rc == 0 && strstr(big, "--dtype D --json --fresh") && count(big, "shm 1 bf16 [") == 1,
          "bench/dtypes --fresh: exit %d: %s", rc, big);
  }
}

/* Compiles bench/<name>.c with Open MPI's mpicc against the static library beside the dtrain
 * binary into tmp_dir/<name>, as its header says; build_dir gets that binary's directory.
 * Returns nonzero (and records the failure) if it does not build. */
static int build_with_lib(const char *name, char *build_dir, size_t cap) {
  char cmd[4096], out[8192];
  const char *bin = getenv("DTRAIN_BIN");
  snprintf(build_dir, cap, "%s", bin ? bin : "./dtrain");
  char *slash = strrchr(build_dir, '/');
  if (slash)
    *slash = '\0';
  snprintf(cmd, sizeof cmd,
           "timeout 120 mpicc -O2 -Wall -Wextra -Werror -I%s/include -o %s/%s %s/bench/%s.c "
           "%s/libdtrain.a $(pkg-config --libs openblas) -lz -lm -lpthread 2>&1",
           src_dir, tmp_dir, name, src_dir, name, build_dir);
  int rc = run(cmd, out, sizeof out);
  CHECK(rc == 0, "compiling bench/%s.c failed: %s", name, out);
  return rc;
}

/* first_calls: builds against libdtrain, runs under `dtrain run` on 2 ranks and prints every
 * field with positive times; bad usage exits 2. */
static void test_first_calls(void) {
  char cmd[4096], out[8192], build_dir[1024];
  if (build_with_lib("first_calls", build_dir, sizeof build_dir))
    return;
  snprintf(cmd, sizeof cmd,
           "timeout 60 %s/dtrain run -n 2 --raw-stdout -- %s/first_calls --calls 40 --settle-ms 50 2>/dev/null",
           build_dir, tmp_dir);
  int rc = run(cmd, out, sizeof out);
  CHECK(rc == 0 && strstr(out, "\"first_us\": [") && count(out, "\"median_us\": ") == 10 &&
            count(out, "\"mean_us\": ") == 10 && strstr(out, "\"total_ms\": ") && !strstr(out, ": 0.0,") &&
            !strstr(out, "nan"),
        "first_calls: %d %s", rc, out);
  static const char *bad[] = {"--calls 5", "--calls x", "--count 0", "--frobnicate", "--settle-ms -1"};
  for (int b = 0; b < 5; b++) {
    snprintf(cmd, sizeof cmd, "timeout 30 %s/first_calls %s 2>/dev/null", tmp_dir, bad[b]);
    CHECK(run(cmd, NULL, 0) == 2, "first_calls accepted %s", bad[b]);
  }
}

/* dtype_ab: builds against libdtrain, runs its 2 ranks on one size and checks every dtype's
 * result (a wrong one fails it); bad usage exits 2. */
static void test_dtype_ab(void) {
  char cmd[4096], out[8192], build_dir[1024];
  if (build_with_lib("dtype_ab", build_dir, sizeof build_dir))
    return;
  snprintf(cmd, sizeof cmd, "timeout 120 %s/dtype_ab --iters 20 65536 2>/dev/null", tmp_dir);
  int rc = run(cmd, out, sizeof out);
  CHECK(rc == 0 && strstr(out, "65536 B, 2 ranks: f32 ") && strstr(out, " f16 ") && strstr(out, " bf16 ") &&
            !strstr(out, "WRONG") && !strstr(out, "nan") && !strstr(out, "inf"),
        "dtype_ab: %d %s", rc, out);
  static const char *bad[] = {"", "100", "--ranks 1 65536", "--iters 0 65536", "64k", "65536 --ranks x", "--iters"};
  for (int b = 0; b < 7; b++) {
    snprintf(cmd, sizeof cmd, "timeout 30 %s/dtype_ab %s 2>/dev/null", tmp_dir, bad[b]);
    CHECK(run(cmd, NULL, 0) == 2, "dtype_ab accepted '%s'", bad[b]);
  }
}

/* mpirun_latency: builds against libdtrain, runs both libraries under mpirun on 2 ranks (every
 * sum checked: a wrong one exits 1) and prints both timings of both; bad usage exits 2. */
static void test_mpirun_latency(void) {
  char cmd[4096], out[8192], build_dir[1024];
  if (build_with_lib("mpirun_latency", build_dir, sizeof build_dir))
    return;
  snprintf(cmd, sizeof cmd,
           "timeout 120 mpirun %s --oversubscribe -np 2 -x DTRAIN_JOB_SECRET=t %s/mpirun_latency --iters 50 "
           "--rounds 1 --bytes 64 2>/dev/null",
           geteuid() == 0 ? "--allow-run-as-root" : "", tmp_dir);
  int rc = run(cmd, out, sizeof out);
  CHECK(rc == 0 && count(out, "round 0, 64 B, ") == 6 && count(out, "dtrain  median ") == 3 &&
            count(out, "openmpi median ") == 3 && count(out, "late rank 0:") == 2 &&
            count(out, "; barrier exits apart: median ") == 2 && !strstr(out, "wrong") && !strstr(out, "nan"),
        "mpirun_latency: %d %s", rc, out);
  static const char *bad[] = {"--iters 0", "--rounds x", "--bytes", "--frobnicate 1"};
  for (int b = 0; b < 4; b++) {
    snprintf(cmd, sizeof cmd, "timeout 30 %s/mpirun_latency %s 2>/dev/null", tmp_dir, bad[b]);
    CHECK(run(cmd, NULL, 0) == 2, "mpirun_latency accepted '%s'", bad[b]);
  }
}

int main(void) {
  src_dir = getenv("DTRAIN_SOURCE_DIR");
  if (!src_dir) {
    fprintf(stderr, "DTRAIN_SOURCE_DIR is not set (run under ctest)\n");
    return 1;
  }
  snprintf(tmp_dir, sizeof tmp_dir, "/tmp/dtrain-test-bench-XXXXXX");
  if (!mkdtemp(tmp_dir)) {
    perror("mkdtemp");
    return 1;
  }
  test_mpi_coll();
  test_ceilings();
  test_harness_usage();
  test_first_calls();
  test_dtype_ab();
  test_mpirun_latency();
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
  if (system(cmd) != 0)
    fprintf(stderr, "warning: could not remove %s\n", tmp_dir);
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("test_bench_tools: all checks passed\n");
  return 0;
}
