/* test_launch.c - `dtrain run` end to end: real launcher processes ($DTRAIN_BIN run ...) start
 * real workers (sh scripts), and the tests check what the workers saw (files they write),
 * what the launcher printed and how it exited, and that no worker outlives it.
 * One executable per group (argv[1]: env, output, fail, signal, usage) so each is its own
 * ctest process. Every wait is bounded: poll loops with deadlines, and alarm() as a backstop. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "dtrain/core.h"

static const char *bin;  /* the dtrain binary */
static char dir[256];    /* scratch directory of the current test */

/* ---- helpers ---- */

static void msleep(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  size_t cap = 4096, n = 0;
  char *s = malloc(cap);
  size_t r;
  while ((r = fread(s + n, 1, cap - n - 1, f)) > 0) {
    n += r;
    if (cap - n - 1 == 0) {
      cap *= 2;
      s = realloc(s, cap);
    }
  }
  fclose(f);
  s[n] = '\0';
  return s;
}

static char *pathf(const char *fmt, ...) {
  static char buf[4][512];
  static int k;
  char *p = buf[k++ % 4];
  int n = snprintf(p, 512, "%s/", dir);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p + n, (size_t)(512 - n), fmt, ap);
  va_end(ap);
  return p;
}

static int count_of(const char *hay, const char *needle) {
  int c = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
    c++;
  return c;
}

/* Starts `dtrain ARGS...` (NULL-terminated) with stderr to dir/err and stdout on fd out, or to
 * dir/out (OUT_FILE), or closed (OUT_CLOSED); keep_closed (>= 0): an fd the child closes. */
#define OUT_FILE (-2)
#define OUT_CLOSED (-1)
static pid_t spawn_with_stdout(const char *const *args, int out, int keep_closed) {
  const char *argv[64];
  int n = 0;
  argv[n++] = bin;
  while (*args && n < 63)
    argv[n++] = *args++;
  argv[n] = NULL;
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int e = open(pathf("err"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(e, 2);
    if (out == OUT_FILE)
      out = open(pathf("out"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out >= 0)
      dup2(out, 1);
    else
      close(1);
    if (keep_closed >= 0)
      close(keep_closed);
    execv(bin, (char *const *)argv);
    _exit(99);
  }
  return pid;
}

/* Starts `dtrain ARGS...` (NULL-terminated) with stdout/stderr to dir/out, dir/err. */
static pid_t spawn_dtrain(const char *const *args) { return spawn_with_stdout(args, OUT_FILE, -1); }

/* Waits at most ms for pid; returns its wait status, or -1 (after killing it) on timeout. */
static int wait_bounded(pid_t pid, int ms) {
  for (int t = 0; t <= ms; t += 10) {
    int st;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid)
      return st;
    msleep(10);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return -1;
}

/* Like run_dtrain, and *cpu_s = the launcher's own CPU seconds (user + system). */
static int run_dtrain_cpu(int ms, const char *const *args, double *cpu_s) {
  pid_t pid = spawn_dtrain(args);
  for (int t = 0; t <= ms; t += 10) {
    int st;
    struct rusage ru;
    if (wait4(pid, &st, WNOHANG, &ru) == pid) {
      *cpu_s = (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
               (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    msleep(10);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return -1;
}

/* Runs dtrain to completion (bounded); returns the exit code, 128+signal, or -1 on timeout. */
static int run_dtrain(int ms, const char *const *args) {
  int st = wait_bounded(spawn_dtrain(args), ms);
  if (st == -1)
    return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static bool file_exists(const char *p) { return access(p, F_OK) == 0; }

/* Waits (bounded) until dir/NAME.i exists and is non-empty for i in 0..n-1. */
static bool wait_files(const char *name, int n, int ms) {
  for (int t = 0; t <= ms; t += 10) {
    int ok = 0;
    for (int i = 0; i < n; i++) {
      struct stat sb;
      if (stat(pathf("%s.%d", name, i), &sb) == 0 && sb.st_size > 0)
        ok++;
    }
    if (ok == n)
      return true;
    msleep(10);
  }
  return false;
}

static int read_pid(const char *p) {
  char *s = slurp(p);
  assert_non_null(s);
  int pid = atoi(s);
  free(s);
  assert_true(pid > 1);
  return pid;
}

/* Gone: no such process, or a zombie (dead; its parent has not reaped it yet). Orphans we
 * inherit as subreaper are reaped here. Bounded wait. */
static bool pid_gone(int pid, int ms) {
  for (int t = 0; t <= ms; t += 10) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    char p[64], buf[512];
    snprintf(p, sizeof p, "/proc/%d/stat", pid);
    FILE *f = fopen(p, "r");
    if (!f)
      return true;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *rp = strrchr(buf, ')');
    if (!rp || (rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X')))
      return true;
    msleep(10);
  }
  return false;
}

static int setup_dir(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/dtrain-launch-XXXXXX");
  assert_non_null(mkdtemp(dir));
  unsetenv("DTRAIN_JOB_SECRET");
  unsetenv("DTRAIN_JOB_SECRET_FILE");
  return 0;
}

static int teardown_dir(void **state) {
  (void)state;
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
  return 0;
}

/* ---- env ---- */

/* Each worker writes what it was given to dir/env.RANK. */
static const char *env_script =
    "echo \"$DTRAIN_RANK $DTRAIN_WORLD_SIZE $DTRAIN_LOCAL_RANK $DTRAIN_LOCAL_WORLD_SIZE "
    "$DTRAIN_NODE_RANK $DTRAIN_NNODES $DTRAIN_MASTER_ADDR $DTRAIN_MASTER_PORT "
    "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT "
    "$DTRAIN_JOB_ID $DTRAIN_JOB_SECRET\" > \"$1/env.tmp.$DTRAIN_RANK\" && "
    "mv \"$1/env.tmp.$DTRAIN_RANK\" \"$1/env.$DTRAIN_RANK\"; echo started $DTRAIN_RANK";

typedef struct {
  int rank, world, local, lworld, node, nnodes;
  char maddr[64];
  int mport;
  int t_rank, t_world, t_local, t_lworld;
  char t_maddr[64];
  int t_mport;
  char job_id[64], secret[160];
} env_seen;

static void read_env(int rank, env_seen *e) {
  char *s = slurp(pathf("env.%d", rank));
  assert_non_null(s);
  memset(e, 0, sizeof *e);
  int n = sscanf(s, "%d %d %d %d %d %d %63s %d %d %d %d %d %63s %d %63s %159s", &e->rank,
                 &e->world, &e->local, &e->lworld, &e->node, &e->nnodes, e->maddr, &e->mport,
                 &e->t_rank, &e->t_world, &e->t_local, &e->t_lworld, e->t_maddr, &e->t_mport,
                 e->job_id, e->secret);
  free(s);
  assert_int_equal(n, 16);
}

static bool is_hex(const char *s, size_t len) {
  if (strlen(s) != len)
    return false;
  for (; *s; s++)
    if (!isxdigit((unsigned char)*s))
      return false;
  return true;
}

static void test_env_single_node(void **state) {
  const char *args[] = {"run", "-n", "4", "--", "sh", "-c", env_script, "sh", dir, NULL};
  assert_int_equal(run_dtrain(30000, args), 0);
  env_seen e[4];
  for (int r = 0; r < 4; r++) {
    read_env(r, &e[r]);
    assert_int_equal(e[r].rank, r);
    assert_int_equal(e[r].world, 4);
    assert_int_equal(e[r].local, r);
    assert_int_equal(e[r].lworld, 4);
    assert_int_equal(e[r].node, 0);
    assert_int_equal(e[r].nnodes, 1);
    assert_string_equal(e[r].maddr, "127.0.0.1");
    assert_true(e[r].mport > 0 && e[r].mport < 65536);
    assert_int_equal(e[r].t_rank, r);
    assert_int_equal(e[r].t_world, 4);
    assert_int_equal(e[r].t_local, r);
    assert_int_equal(e[r].t_lworld, 4);
    assert_string_equal(e[r].t_maddr, "127.0.0.1");
    assert_int_equal(e[r].t_mport, e[r].mport);
    assert_true(is_hex(e[r].secret, 64));
    assert_true(is_hex(e[r].job_id, 16));
    assert_int_equal(e[r].mport, e[0].mport);
    assert_string_equal(e[r].secret, e[0].secret);
    assert_string_equal(e[r].job_id, e[0].job_id);
  }
  assert_false(file_exists(pathf("env.4")));
  char *out = slurp(pathf("out")), *err = slurp(pathf("err"));
  for (int r = 0; r < 4; r++) {
    char want[32];
    snprintf(want, sizeof want, "[rank %d] started %d\n", r, r);
    assert_int_equal(count_of(out, want), 1);
  }
  /* The secret is never printed. */
  assert_null(strstr(out, e[0].secret));
  assert_null(strstr(err, e[0].secret));
  free(out);
  free(err);

  /* A second job gets a different secret, id and (usually) port. */
  char first_secret[160], first_id[64];
  strcpy(first_secret, e[0].secret);
  strcpy(first_id, e[0].job_id);
  const char *args1[] = {"run", "-n", "1", "--", "sh", "-c", env_script, "sh", dir, NULL};
  assert_int_equal(run_dtrain(30000, args1), 0);
  read_env(0, &e[0]);
  assert_string_not_equal(e[0].secret, first_secret);
  assert_string_not_equal(e[0].job_id, first_id);
}

/* The store's port is held by the launcher for the whole job: while a worker runs, nobody else
 * can bind it (a parallel job could otherwise take it before rank 0's store binds it). */
static void test_env_port_held(void **state) {
  const char *script = "echo $DTRAIN_MASTER_PORT > \"$1/port.tmp\" && mv \"$1/port.tmp\" \"$1/port.0\"; "
                       "i=0; while [ ! -e \"$1/go\" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done";
  const char *args[] = {"run", "-n", "1", "--", "sh", "-c", script, "sh", dir, NULL};
  pid_t pid = spawn_dtrain(args);
  assert_true(wait_files("port", 1, 20000));
  char *s = slurp(pathf("port.0"));
  int port = atoi(s);
  free(s);
  assert_true(port > 0 && port < 65536);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  int b = bind(fd, (struct sockaddr *)&a, sizeof a), e = errno;
  close(fd);
  FILE *go = fopen(pathf("go"), "w");
  assert_non_null(go);
  fclose(go);
  assert_int_equal(wait_bounded(pid, 20000), 0);
  assert_int_equal(b, -1);
  assert_int_equal(e, EADDRINUSE);
}

static void test_env_secret_passthrough(void **state) {
  setenv("DTRAIN_JOB_SECRET", "0123456789abcdef0123456789abcdef", 1);
  const char *args[] = {"run", "-n", "2", "sh", "-c", env_script, "sh", dir, NULL};
  int rc = run_dtrain(30000, args);
  unsetenv("DTRAIN_JOB_SECRET");
  assert_int_equal(rc, 0);
  for (int r = 0; r < 2; r++) {
    env_seen e;
    read_env(r, &e);
    assert_string_equal(e.secret, "0123456789abcdef0123456789abcdef");
  }
  /* With a secret file set, no secret is generated: the workers read the file. */
  FILE *f = fopen(pathf("secret"), "w");
  assert_non_null(f);
  fputs("fedcba9876543210fedcba9876543210\n", f);
  fclose(f);
  setenv("DTRAIN_JOB_SECRET_FILE", pathf("secret"), 1);
  const char *args2[] = {"run", "-n", "2", "sh", "-c",
                         "echo \"${DTRAIN_JOB_SECRET:-none} $DTRAIN_JOB_SECRET_FILE\" > "
                         "\"$1/s.$DTRAIN_RANK\"",
                         "sh", dir, NULL};
  rc = run_dtrain(30000, args2);
  assert_int_equal(rc, 0);
  char want[600];
  snprintf(want, sizeof want, "none %s\n", pathf("secret"));
  for (int r = 0; r < 2; r++) {
    char *s = slurp(pathf("s.%d", r));
    assert_string_equal(s, want);
    free(s);
  }
  /* An unreadable secret file is refused before anything starts. */
  setenv("DTRAIN_JOB_SECRET_FILE", pathf("no-such-secret"), 1);
  rc = run_dtrain(30000, args2);
  unsetenv("DTRAIN_JOB_SECRET_FILE");
  assert_int_equal(rc, 2);
  char *err = slurp(pathf("err"));
  assert_non_null(strstr(err, "DTRAIN_JOB_SECRET_FILE"));
  free(err);
}

/* The elastic agent reads DTRAIN_TIMEOUT_MS as the workers do: "5s" is not 5 ms, garbage is
 * not 300 s; either is refused before anything starts. */
static void test_elastic_bad_timeout(void **state) {
  (void)state;
  setenv("DTRAIN_JOB_SECRET", "00112233445566778899aabbccddeeff", 1);
  const char *vals[] = {"5s", "abc", "0"};
  for (int i = 0; i < 3; i++) {
    setenv("DTRAIN_TIMEOUT_MS", vals[i], 1);
    const char *args[] = {"run", "--nnodes", "2", "--node-rank", "0", "--master", "127.0.0.1:29557", "-n", "1",
                          "--max-restarts", "1", "--", "true", NULL};
    int rc = run_dtrain(30000, args);
    unsetenv("DTRAIN_TIMEOUT_MS");
    assert_int_equal(rc, 2);
    char *err = slurp(pathf("err"));
    assert_non_null(strstr(err, "DTRAIN_TIMEOUT_MS"));
    free(err);
  }
  unsetenv("DTRAIN_JOB_SECRET");
}

static void test_env_multi_node(void **state) {
  /* Two agents of one job on this machine, as two hosts would run them. */
  setenv("DTRAIN_JOB_SECRET", "00112233445566778899aabbccddeeff", 1);
  pid_t a[2];
  for (int node = 0; node < 2; node++) {
    char nr[8];
    snprintf(nr, sizeof nr, "%d", node);
    const char *args[] = {"run", "--nnodes", "2", "--node-rank", nr, "--master",
                          "127.0.0.1:29555", "-n", "2", "--", "sh", "-c", env_script, "sh",
                          dir, NULL};
    a[node] = spawn_dtrain(args); /* both write dir/out: only exit codes matter here */
  }
  int st0 = wait_bounded(a[0], 30000), st1 = wait_bounded(a[1], 30000);
  unsetenv("DTRAIN_JOB_SECRET");
  assert_true(st0 != -1 && WIFEXITED(st0) && WEXITSTATUS(st0) == 0);
  assert_true(st1 != -1 && WIFEXITED(st1) && WEXITSTATUS(st1) == 0);
  for (int r = 0; r < 4; r++) {
    env_seen e;
    read_env(r, &e);
    assert_int_equal(e.rank, r);
    assert_int_equal(e.world, 4);
    assert_int_equal(e.local, r % 2);
    assert_int_equal(e.lworld, 2);
    assert_int_equal(e.node, r / 2);
    assert_int_equal(e.nnodes, 2);
    assert_string_equal(e.maddr, "127.0.0.1");
    assert_int_equal(e.mport, 29555);
    assert_int_equal(e.t_mport, 29555);
    assert_string_equal(e.secret, "00112233445566778899aabbccddeeff");
  }
  assert_false(file_exists(pathf("env.4")));

  /* Without a shared secret several agents cannot be one job. */
  const char *args[] = {"run", "--nnodes", "2", "--node-rank", "1", "--master", "127.0.0.1:29555",
                        "-n", "2", "--", "true", NULL};
  assert_int_equal(run_dtrain(30000, args), 2);
  char *err = slurp(pathf("err"));
  assert_non_null(strstr(err, "DTRAIN_JOB_SECRET"));
  free(err);
}

/* ---- output ---- */

static void test_output_prefix(void **state) {
  /* 200 lines of 100+ characters per rank: every output line must be whole and its own. */
#define X10 "xxxxxxxxxx"
  const char *script =
      "i=0; while [ $i -lt 200 ]; do "
      "echo \"r$DTRAIN_RANK l$i " X10 X10 X10 X10 X10 X10 X10 X10 X10 X10 X10 "\"; i=$((i+1)); done; "
      "echo \"to stderr $DTRAIN_RANK\" >&2; "
      "printf 'p1\\rp2\\rdone\\n'; printf 'partial %s' $DTRAIN_RANK";
  const char *args[] = {"run", "-n", "3", "--", "sh", "-c", script, NULL};
  assert_int_equal(run_dtrain(30000, args), 0);
  char *out = slurp(pathf("out")), *err = slurp(pathf("err"));
  int lines[3] = {0, 0, 0};
  for (char *line = out; *line;) {
    char *end = line + strcspn(line, "\r\n");
    int rank = -1, n = -1;
    assert_int_equal(sscanf(line, "[rank %d] %n", &rank, &n), 1);
    assert_true(rank >= 0 && rank < 3 && n > 0);
    char *body = line + n;
    int br = -1, bl = -1, m = -1;
    if (sscanf(body, "r%d l%d %n", &br, &bl, &m) == 2 && m > 0) {
      assert_int_equal(br, rank);
      assert_int_equal(bl, lines[rank]); /* in order, none lost */
      assert_int_equal((int)(end - (body + m)), 110);
      assert_int_equal((int)strspn(body + m, "x"), 110);
      lines[rank]++;
    }
    line = *end ? end + 1 : end;
  }
  for (int r = 0; r < 3; r++) {
    assert_int_equal(lines[r], 200);
    char want[64];
    snprintf(want, sizeof want, "[rank %d] p1\r[rank %d] p2\r[rank %d] done\n", r, r, r);
    assert_non_null(strstr(out, want));
    snprintf(want, sizeof want, "[rank %d] partial %d\n", r, r);
    assert_non_null(strstr(out, want));
    snprintf(want, sizeof want, "[rank %d] to stderr %d\n", r, r);
    assert_int_equal(count_of(err, want), 1);
    assert_null(strstr(out, "to stderr"));
  }
  free(out);
  free(err);
}

static void test_output_rank0_as_is(void **state) {
  /* rank0 mode passes rank 0's output as it came: a 100,000-byte line without a newline (longer
   * than the launcher's line buffer) and \r\n endings, nothing added. */
  const char *script = "[ $DTRAIN_RANK = 0 ] || exit 0; printf 'a\\r\\nb\\n'; "
                       "head -c 100000 /dev/zero | tr '\\0' x";
  const char *args[] = {"run", "-n", "2", "--output", "rank0", "--", "sh", "-c", script, NULL};
  assert_int_equal(run_dtrain(30000, args), 0);
  char *out = slurp(pathf("out"));
  assert_int_equal(strlen(out), 5 + 100000);
  assert_memory_equal(out, "a\r\nb\n", 5);
  assert_int_equal(strspn(out + 5, "x"), 100000);
  free(out);
}

/* ...but another rank's line written to the same file after a partial rank-0 line starts on a
 * line of its own (it used to continue rank 0's line). */
static void test_output_rank0_partial(void **state) {
  const char *script = "if [ $DTRAIN_RANK = 0 ]; then printf 'final loss=0.25'; else sleep 0.3; "
                       "echo 'warning: slow disk'; fi";
  const char *args[] = {"run", "-n", "2", "--output", "rank0", "--", "sh", "-c", script, NULL};
  assert_int_equal(run_dtrain(30000, args), 0);
  char *out = slurp(pathf("out"));
  assert_string_equal(out, "final loss=0.25\n[rank 1] warning: slow disk\n");
  free(out);
}

static void test_output_rank0(void **state) {
  const char *script = "echo \"progress of $DTRAIN_RANK\"; "
                       "echo \"WARNING: low memory on $DTRAIN_RANK\" >&2; "
                       "echo \"info chatter $DTRAIN_RANK\" >&2; "
                       "echo \"an Error in $DTRAIN_RANK\"; "
                       "echo \"---> HINT: try $DTRAIN_RANK\" >&2; "
                       "echo \"dtrain train: rank $DTRAIN_RANK: rank 0 refused to resume: no checkpoint\" >&2";
  const char *args[] = {"run", "-n", "3", "--output", "rank0", "--", "sh", "-c", script, NULL};
  assert_int_equal(run_dtrain(30000, args), 0);
  char *out = slurp(pathf("out")), *err = slurp(pathf("err"));
  /* Rank 0 in full and unprefixed. */
  assert_int_equal(count_of(out, "progress of 0\n"), 1);
  assert_null(strstr(out, "[rank 0]"));
  assert_int_equal(count_of(err, "info chatter 0\n"), 1);
  /* Others: warnings and errors only, prefixed. */
  assert_null(strstr(out, "progress of 1"));
  assert_null(strstr(out, "progress of 2"));
  assert_null(strstr(err, "info chatter 1"));
  assert_null(strstr(err, "info chatter 2"));
  for (int r = 1; r < 3; r++) {
    char want[128];
    snprintf(want, sizeof want, "[rank %d] WARNING: low memory on %d\n", r, r);
    assert_int_equal(count_of(err, want), 1);
    snprintf(want, sizeof want, "[rank %d] an Error in %d\n", r, r);
    assert_int_equal(count_of(out, want), 1);
    snprintf(want, sizeof want, "[rank %d] ---> HINT: try %d\n", r, r);
    assert_int_equal(count_of(err, want), 1);
    snprintf(want, sizeof want, "[rank %d] dtrain train: rank %d: rank 0 refused to resume: no checkpoint\n", r, r);
    assert_int_equal(count_of(err, want), 1);
  }
  free(out);
  free(err);
}

static void test_output_raw_stdout(void **state) {
  /* Rank 0's stdout is exactly what it wrote, partial last line included; other ranks' stdout
   * goes to stderr. */
  const char *script = "if [ \"$DTRAIN_RANK\" = 0 ]; then "
                       "printf '{\"loss\": 0.5,\\n  \"acc\": [1, 2]}'; "
                       "else echo \"noise from $DTRAIN_RANK\"; fi; echo \"log $DTRAIN_RANK\" >&2";
  const char *args[] = {"run", "-n", "3", "--raw-stdout", "--", "sh", "-c", script, NULL};
  assert_int_equal(run_dtrain(30000, args), 0);
  char *out = slurp(pathf("out")), *err = slurp(pathf("err"));
  assert_string_equal(out, "{\"loss\": 0.5,\n  \"acc\": [1, 2]}");
  assert_int_equal(count_of(err, "[rank 1] noise from 1\n"), 1);
  assert_int_equal(count_of(err, "[rank 2] noise from 2\n"), 1);
  assert_int_equal(count_of(err, "[rank 0] log 0\n"), 1);
  free(out);
  free(err);

  /* "dtrain" runs this same binary: its output passes through unchanged. */
  const char *v[] = {"version", NULL};
  assert_int_equal(run_dtrain(30000, v), 0);
  char *want = slurp(pathf("out"));
  const char *args2[] = {"run", "-n", "2", "--raw-stdout", "--", "dtrain", "version", NULL};
  assert_int_equal(run_dtrain(30000, args2), 0);
  out = slurp(pathf("out"));
  assert_true(strncmp(want, "dtrain ", 7) == 0);
  assert_string_equal(out, want);
  err = slurp(pathf("err"));
  assert_non_null(strstr(err, "[rank 1] dtrain "));
  free(want);
  free(out);
  free(err);
}

/* A stdout that cannot be written (/dev/full: ENOSPC) is exit 1 and one message, for the
 * launcher's own write(2)s of its workers' output as for stdio (main.c checks both at exit). */
static void test_output_full(void **state) {
  if (access("/dev/full", W_OK) != 0)
    skip();
  const char *cmds[] = {"version", "run -n 2 -- echo hi", "run -n 2 --raw-stdout -- echo hi",
                        "run -n 2 --output rank0 -- echo hi"};
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' %s > /dev/full 2> '%s'", bin, cmds[i], pathf("err"));
    int st = system(cmd);
    char *err = slurp(pathf("err"));
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 1 ||
        !strstr(err, "dtrain: writing standard output: No space left on device"))
      fail_msg("dtrain %s > /dev/full: status 0x%x, stderr: %s", cmds[i], st, err);
    free(err);
  }
}

/* ---- failures ---- */

/* Workers other than `bad` record their pid and sleep; `bad` waits until they did, then runs
 * `then`. */
static char *fail_script(int n, const char *bad, const char *then) {
  static char s[2048];
  char waits[512] = "";
  for (int i = 0; i < n; i++) {
    char one[96];
    snprintf(one, sizeof one, "{ [ -s \"$1/pid.%d\" ] || [ \"$DTRAIN_RANK\" = %d ]; } ", i, i);
    strcat(waits, i ? "&& " : "");
    strcat(waits, one);
  }
  snprintf(s, sizeof s,
           "if [ \"$DTRAIN_RANK\" = %s ]; then k=0; "
           "until %s; do sleep 0.01; k=$((k+1)); [ $k -lt 2000 ] || exit 99; done; %s; "
           "else echo $$ > \"$1/pid.tmp.$DTRAIN_RANK\"; "
           "mv \"$1/pid.tmp.$DTRAIN_RANK\" \"$1/pid.$DTRAIN_RANK\"; exec sleep 60; fi",
           bad, waits, then);
  return s;
}

static void test_fail_exit_code(void **state) {
  /* --kill-after 60 with a 30 s bound: the sleepers must die of SIGTERM promptly. */
  const char *script = fail_script(
      3, "1", "i=1; while [ $i -le 15 ]; do echo \"line $i of rank 1\"; i=$((i+1)); done; exit 3");
  const char *args[] = {"run", "-n", "3", "--kill-after", "60", "--", "sh", "-c", script, "sh",
                        dir, NULL};
  int rc = run_dtrain(30000, args);
  assert_int_equal(rc, 3);
  char *err = slurp(pathf("err"));
  assert_int_equal(count_of(err, "failed first"), 1);
  assert_non_null(strstr(err, "dtrain run: rank 1 failed first: exit code 3"));
  assert_non_null(strstr(err, "stopped the other 2 running workers"));
  assert_null(strstr(err, "SIGKILL was needed"));
  /* The last 10 lines, in order, and not the 5 before. */
  const char *p = err;
  for (int i = 6; i <= 15; i++) {
    char want[64];
    snprintf(want, sizeof want, "  | line %d of rank 1\n", i);
    p = strstr(p, want);
    assert_non_null(p);
  }
  assert_null(strstr(err, "  | line 5 of rank 1\n"));
  assert_null(strstr(err, "rank 0 failed"));
  free(err);
  assert_true(pid_gone(read_pid(pathf("pid.0")), 5000));
  assert_true(pid_gone(read_pid(pathf("pid.2")), 5000));
}

/* A worker that exits with a code: the others get 0.25 s to end by themselves (having been told
 * by the library, a dtrain worker says why) before their SIGTERM. Rank 1 ends 0.1 s after rank
 * 0's failure with its own words, not the SIGTERM's; rank 2 never ends by itself and gets the
 * SIGTERM all the same. */
static void test_fail_others_settle(void **state) {
  const char *args[] = {"run", "-n", "3", "--kill-after", "60", "--", "sh", "-c",
                        "case $DTRAIN_RANK in 0) exit 3 ;; 1) t=0.1 ;; *) t=30 ;; esac; "
                        "trap 'echo got SIGTERM; exit 5' TERM; sleep $t; echo own last words; exit 1",
                        NULL};
  assert_int_equal(run_dtrain(30000, args), 3);
  char *out = slurp(pathf("out")), *err = slurp(pathf("err"));
  if (!strstr(out, "[rank 1] own last words") || strstr(out, "[rank 1] got SIGTERM") ||
      !strstr(out, "[rank 2] got SIGTERM") || !strstr(err, "rank 0 failed first: exit code 3") ||
      !strstr(err, "stopped the other 1 running worker"))
    fail_msg("stdout:\n%s\nstderr:\n%s", out, err);
  free(out);
  free(err);
}

static void test_fail_signal(void **state) {
  const char *script = fail_script(2, "1", "echo about to die; kill -9 $$");
  const char *args[] = {"run", "-n", "2", "--", "sh", "-c", script, "sh", dir, NULL};
  int rc = run_dtrain(30000, args);
  assert_int_equal(rc, 128 + 9);
  char *err = slurp(pathf("err"));
  assert_int_equal(count_of(err, "failed first"), 1);
  assert_non_null(strstr(err, "rank 1 failed first: killed by signal 9 (SIGKILL)"));
  assert_non_null(strstr(err, "  | about to die\n"));
  free(err);
  assert_true(pid_gone(read_pid(pathf("pid.0")), 5000));
}

static void test_fail_rank0_mode_shows_hidden_tail(void **state) {
  /* In rank0 mode rank 2's plain lines were hidden; the summary still shows them. */
  const char *script = fail_script(3, "2", "echo quiet detail 1; echo quiet detail 2; exit 1");
  const char *args[] = {"run", "-n", "3", "--output", "rank0", "--", "sh", "-c", script, "sh",
                        dir, NULL};
  assert_int_equal(run_dtrain(30000, args), 1);
  char *out = slurp(pathf("out")), *err = slurp(pathf("err"));
  assert_null(strstr(out, "quiet detail"));
  assert_non_null(strstr(err, "rank 2 failed first: exit code 1"));
  assert_non_null(strstr(err, "  | quiet detail 1\n  | quiet detail 2\n"));
  free(out);
  free(err);
}

static void test_fail_not_found(void **state) {
  const char *args[] = {"run", "-n", "3", "--", "no-such-command-for-dtrain-test", "x", NULL};
  assert_int_equal(run_dtrain(30000, args), 127);
  char *err = slurp(pathf("err"));
  assert_non_null(strstr(err, "cannot execute 'no-such-command-for-dtrain-test'"));
  assert_int_equal(count_of(err, "cannot execute"), 1);
  free(err);
  const char *args2[] = {"run", "-n", "1", "--", pathf("."), NULL}; /* a directory */
  assert_int_equal(run_dtrain(30000, args2), 126);
}

static void test_fail_usage_not_restarted(void **state) {
  /* Exit code 2 (a usage or settings error) ends the job: no restart would mend it. Each start
   * appends a line to starts.0; exactly one generation ran. */
  const char *args[] = {"run", "-n", "2", "--max-restarts", "3", "--", "sh", "-c",
                        "[ \"$DTRAIN_RANK\" = 0 ] || exec sleep 30; echo x >> \"$1/starts\"; exit 2", "sh", dir,
                        NULL};
  assert_int_equal(run_dtrain(30000, args), 2);
  char *err = slurp(pathf("err")), *starts = slurp(pathf("starts"));
  assert_non_null(strstr(err, "rank 0 exited with code 2 (a usage or settings error)"));
  assert_non_null(strstr(err, "not restarting"));
  assert_string_equal(starts, "x\n");
  free(err);
  free(starts);
  /* any other failure is restarted */
  const char *args3[] = {"run", "-n", "1", "--max-restarts", "2", "--", "sh", "-c",
                         "echo x >> \"$1/starts3\"; exit 3", "sh", dir, NULL};
  assert_int_equal(run_dtrain(30000, args3), 3);
  starts = slurp(pathf("starts3"));
  assert_string_equal(starts, "x\nx\nx\n");
  free(starts);
}

static void test_fail_refused(void **state) {
  /* Ranks 1 and 2 say rank 0 refused and exit 2 at once; rank 0 exits 2 with its reason only
   * after rank 1 has gone. dtrain run waits for rank 0's own exit (no SIGTERM: --kill-after 60
   * would show) and names it, with its reason, and does not restart a settings error. */
  const char *script =
      "if [ \"$DTRAIN_RANK\" = 0 ]; then k=0; until [ -e \"$1/said.1\" ]; do sleep 0.01; k=$((k+1)); "
      "[ $k -lt 2000 ] || exit 99; done; sleep 0.3; echo \"worker: the checkpoint says no\" >&2; exit 2; "
      "else echo \"worker: rank $DTRAIN_RANK: rank 0 refused to resume: the checkpoint says no\" >&2; "
      ": > \"$1/said.$DTRAIN_RANK\"; exit 2; fi";
  const char *args[] = {"run", "-n", "3", "--kill-after", "60", "--max-restarts", "2", "--", "sh", "-c",
                        script, "sh", dir, NULL};
  time_t t0 = time(NULL);
  assert_int_equal(run_dtrain(30000, args), 2);
  assert_true(time(NULL) - t0 < 20);
  char *err = slurp(pathf("err"));
  assert_int_equal(count_of(err, "failed first"), 1);
  const char *sum = strstr(err, "dtrain run: rank 0 failed first: exit code 2");
  assert_non_null(sum);
  assert_non_null(strstr(sum, "  | worker: the checkpoint says no\n"));
  assert_null(strstr(err, "SIGKILL was needed"));
  assert_non_null(strstr(err, "rank 0 exited with code 2 (a usage or settings error)"));
  assert_int_equal(count_of(err, "not restarting"), 1);
  free(err);
}

static void test_fail_refuser_hangs(void **state) {
  /* A rank named as refusing that never exits holds the stop only for the grace period: it is
   * then killed, and the rank that failed is named. */
  const char *script = fail_script(2, "1", "echo \"rank 0 refused to start: no\" >&2; exit 2");
  const char *args[] = {"run", "-n", "2", "--kill-after", "0.5", "--", "sh", "-c", script, "sh", dir, NULL};
  time_t t0 = time(NULL);
  assert_int_equal(run_dtrain(30000, args), 2);
  assert_true(time(NULL) - t0 < 20);
  char *err = slurp(pathf("err"));
  assert_non_null(strstr(err, "dtrain run: rank 1 failed first: exit code 2"));
  assert_non_null(strstr(err, "  | rank 0 refused to start: no\n"));
  assert_non_null(
      strstr(err, "stopped the other 1 running worker (SIGKILL was needed after the grace period)"));
  free(err);
  assert_true(pid_gone(read_pid(pathf("pid.0")), 5000));
}


/* A reader of our stdout that stops reading (a paused pager) holds neither --timeout nor a
 * signal: the job ends (124), saying that the rest of the output was dropped. */
static void test_stalled_reader(void **state) {
  int p[2];
  assert_int_equal(pipe(p), 0);
  const char *args[] = {"run", "-n", "1", "--timeout", "1", "--kill-after", "1", "--", "sh", "-c", "yes hello", NULL};
  pid_t pid = spawn_with_stdout(args, p[1], p[0]);
  close(p[1]);
  int st = wait_bounded(pid, 30000);
  close(p[0]);
  char *err = slurp(pathf("err"));
  if (!(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 124 && strstr(err, "output was dropped once the job had to stop")))
    fail_msg("stalled reader: status %d: %s", st, err);
  free(err);
}

/* Started with stdout closed (>&-): the job runs to its end (a socket took fd 1 and its EPIPE
 * stopped the job at once, exit 141 without a word), then exit 1 naming the closed stdout. */
static void test_closed_stdout(void **state) {
  const char *args[] = {"run", "-n", "1", "--", "sh", "-c", "echo hi; sleep 0.3; echo done >&2", NULL};
  int st = wait_bounded(spawn_with_stdout(args, OUT_CLOSED, -1), 30000);
  char *err = slurp(pathf("err"));
  if (!(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 1 && strstr(err, "[rank 0] done") &&
        strstr(err, "writing standard output: Bad file descriptor")))
    fail_msg("closed stdout: status %d: %s", st, err);
  free(err);
  /* a worker's own words "rank 7 failed" in a 2-rank job are text, not a verdict */
  const char *args2[] = {"run", "-n", "2", "--", "sh", "-c",
                         "[ $RANK = 1 ] && echo 'rank 7 failed: to parse line 3'; sleep 0.3; exit 0", NULL};
  assert_int_equal(run_dtrain(30000, args2), 0);
}

static void test_fail_timeout(void **state) {
  const char *args[] = {"run", "-n", "2", "--timeout", "0.3", "--", "sh", "-c",
                        "echo $$ > \"$1/pid.$DTRAIN_RANK\"; exec sleep 60", "sh", dir, NULL};
  int code = run_dtrain(30000, args);
  char *err = slurp(pathf("err"));
  /* once seen failing under ASan on a loaded Zen 3, cause unknown: say what dtrain run wrote */
  if (code != 124 || !strstr(err, "--timeout 0.3 s passed; stopped 2 running workers"))
    print_error("exit %d, stderr:\n%s\n", code, err);
  assert_int_equal(code, 124);
  assert_non_null(strstr(err, "--timeout 0.3 s passed; stopped 2 running workers"));
  free(err);
  assert_true(pid_gone(read_pid(pathf("pid.0")), 5000));
  assert_true(pid_gone(read_pid(pathf("pid.1")), 5000));
}

static void test_detached_grandchild(void **state) {
  /* A process a worker started in its own session holds the output pipe after every worker
   * exited: the launcher says so and ends, rather than wait for it (here --kill-after 60). */
  const char *args[] = {"run", "-n", "1", "--kill-after", "60", "--", "sh", "-c",
                        "setsid sh -c 'echo $$ > \"$1/pid.g\"; exec sleep 60' sh \"$1\" & echo hi", "sh", dir,
                        NULL};
  assert_int_equal(run_dtrain(30000, args), 0);
  char *err = slurp(pathf("err"));
  assert_non_null(strstr(err, "still holds its output open; not waiting for it"));
  free(err);
  int g = read_pid(pathf("pid.g"));
  assert_true(g > 0);
  kill(g, SIGKILL);
}

/* A process a worker left behind in its group that ignores SIGTERM and holds the output: killed
 * (SIGKILL, said), not left running until the end with a message blaming setsid. */
static void test_deaf_grandchild(void **state) {
  const char *args[] = {"run", "-n", "1", "--", "sh", "-c",
                        "sh -c 'trap \"\" TERM; echo $$ > \"$1/pid.g\"; sleep 60; echo late' sh \"$1\" & echo hi", "sh",
                        dir, NULL};
  assert_int_equal(run_dtrain(30000, args), 0);
  char *err = slurp(pathf("err"));
  if (!strstr(err, "still held their output after SIGTERM; killed them") || strstr(err, "setsid"))
    fail_msg("stderr: %s", err);
  free(err);
  assert_true(pid_gone(read_pid(pathf("pid.g")), 5000));
}

static void test_all_ok_some_early(void **state) {
  /* Rank 0 finishing long before the others is not a failure. */
  const char *args[] = {"run", "-n", "3", "--", "sh", "-c",
                        "[ \"$DTRAIN_RANK\" = 0 ] || sleep 0.3; echo done", NULL};
  assert_int_equal(run_dtrain(30000, args), 0);
  char *out = slurp(pathf("out")), *err = slurp(pathf("err"));
  assert_int_equal(count_of(out, "] done\n"), 3);
  assert_string_equal(err, "");
  free(out);
  free(err);
}

static void test_ok_with_failure_words(void **state) {
  /* A program's own text about a rank failing or refusing is not dtrain's verdict: the job goes
   * on (it used to be stopped 2 ms after the first line and restarted until none were left). */
  const char *args[] = {"run", "-n", "2", "--max-restarts", "2", "--", "sh", "-c",
                        "echo \"warning: rank $DTRAIN_RANK failed to import a plugin; rank 1 refused the offer\" >&2; "
                        "sleep 0.3; echo done", NULL};
  assert_int_equal(run_dtrain(30000, args), 0);
  char *out = slurp(pathf("out")), *err = slurp(pathf("err"));
  assert_int_equal(count_of(out, "] done\n"), 2);
  assert_null(strstr(err, "restart"));
  free(out);
  free(err);
}

/* ---- signals ---- */

/* Each worker starts a grandchild (background sleep), records both pids, and waits. */
static const char *tree_script =
    "sleep 60 & echo $! > \"$1/gpid.tmp.$DTRAIN_RANK\"; "
    "mv \"$1/gpid.tmp.$DTRAIN_RANK\" \"$1/gpid.$DTRAIN_RANK\"; "
    "echo $$ > \"$1/pid.tmp.$DTRAIN_RANK\"; mv \"$1/pid.tmp.$DTRAIN_RANK\" \"$1/pid.$DTRAIN_RANK\"; "
    "wait";

static void stop_by_signal(int sig, int want_rc, const char *want_name) {
  const char *args[] = {"run", "-n", "3", "--", "sh", "-c", tree_script, "sh", dir, NULL};
  pid_t l = spawn_dtrain(args);
  assert_true(wait_files("pid", 3, 20000));
  assert_true(wait_files("gpid", 3, 20000));
  kill(l, sig);
  int st = wait_bounded(l, 20000);
  assert_true(st != -1);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), want_rc);
  char *err = slurp(pathf("err"));
  char want[64];
  snprintf(want, sizeof want, "got %s; stopped 3 running workers", want_name);
  assert_non_null(strstr(err, want));
  free(err);
  for (int r = 0; r < 3; r++) {
    assert_true(pid_gone(read_pid(pathf("pid.%d", r)), 5000));
    assert_true(pid_gone(read_pid(pathf("gpid.%d", r)), 5000));
  }
}

static void test_signal_term(void **state) { stop_by_signal(SIGTERM, 143, "SIGTERM"); }

/* Two stop signals that arrive before the launcher's loop looks: the first decides the exit
 * status. The launcher stopped (SIGSTOP) gets SIGINT then SIGTERM, and on SIGCONT runs both
 * handlers (the kernel delivers pending standard signals lowest number first: SIGINT, the one
 * sent first) before its loop resumes; exit 130, not 143 (a CI run under TSan met this race
 * with SIGTERM and then SIGHUP 185 ms later, while the launcher was still starting workers). */
static void test_signal_first_decides(void **state) {
  const char *args[] = {"run", "-n", "3", "--", "sh", "-c", tree_script, "sh", dir, NULL};
  pid_t l = spawn_dtrain(args);
  assert_true(wait_files("pid", 3, 20000));
  assert_true(wait_files("gpid", 3, 20000));
  kill(l, SIGSTOP);
  kill(l, SIGINT);
  kill(l, SIGTERM);
  kill(l, SIGCONT);
  int st = wait_bounded(l, 20000);
  assert_true(st != -1);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 130);
  char *err = slurp(pathf("err"));
  assert_non_null(strstr(err, "got SIGINT"));
  free(err);
  for (int r = 0; r < 3; r++) {
    assert_true(pid_gone(read_pid(pathf("pid.%d", r)), 5000));
    assert_true(pid_gone(read_pid(pathf("gpid.%d", r)), 5000));
  }
}
static void test_signal_int(void **state) { stop_by_signal(SIGINT, 130, "SIGINT"); }

/* Two workers that ignore SIGTERM, the launcher sent SIGTERM `signals` times (200 ms apart):
 * both workers gone, exit 143, and the summary holds `want` and not `unwanted`. */
static void stop_deaf_workers(const char *kill_after, int signals, const char *want, const char *unwanted) {
  const char *args[] = {"run", "-n", "2", "--kill-after", kill_after, "--", "sh", "-c",
                        "trap '' TERM; echo $$ > \"$1/pid.tmp.$DTRAIN_RANK\"; "
                        "mv \"$1/pid.tmp.$DTRAIN_RANK\" \"$1/pid.$DTRAIN_RANK\"; "
                        "while :; do sleep 0.05; done",
                        "sh", dir, NULL};
  pid_t l = spawn_dtrain(args);
  assert_true(wait_files("pid", 2, 20000));
  for (int i = 0; i < signals; i++) {
    if (i)
      usleep(200000);
    kill(l, SIGTERM);
  }
  int st = wait_bounded(l, 10000);
  assert_true(st != -1 && WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 143);
  char *err = slurp(pathf("err"));
  assert_non_null(strstr(err, want));
  if (unwanted)
    assert_null(strstr(err, unwanted));
  free(err);
  assert_true(pid_gone(read_pid(pathf("pid.0")), 5000));
  assert_true(pid_gone(read_pid(pathf("pid.1")), 5000));
}

/* A worker that ignores SIGTERM is SIGKILLed after --kill-after. */
static void test_signal_escalates_to_kill(void **state) { stop_deaf_workers("0.3", 1, "SIGKILL was needed", NULL); }

/* A second signal: SIGKILL at once, said as such (not "after the grace period", 30 s here). */
static void test_signal_twice_kills_at_once(void **state) {
  stop_deaf_workers("30", 2, "(SIGKILL at a second signal)", "grace period");
}

static void test_signal_no_busy_wait(void **state) {
  /* While the launcher waits out a grace period it sleeps in poll(2): its own CPU time stays
   * far below the ~1.5 s it waits. A worker ignoring SIGTERM after --timeout: */
  double cpu = -1;
  const char *args[] = {"run", "-n", "1", "--timeout", "0.2", "--kill-after", "1.5", "--", "sh",
                        "-c", "trap '' TERM; while :; do sleep 0.05; done", NULL};
  assert_int_equal(run_dtrain_cpu(30000, args, &cpu), 124);
  assert_true(cpu >= 0 && cpu < 0.5);
  /* A worker that exits 0 but leaves a SIGTERM-ignoring child holding its stdout. */
  const char *args2[] = {"run", "-n", "1", "--kill-after", "1", "--", "sh", "-c",
                         "(trap '' TERM; while :; do sleep 0.05; done) & echo started", NULL};
  assert_int_equal(run_dtrain_cpu(30000, args2, &cpu), 0);
  assert_true(cpu >= 0 && cpu < 0.5);
  char *out = slurp(pathf("out"));
  assert_string_equal(out, "[rank 0] started\n");
  free(out);
}

static void test_signal_launcher_killed(void **state) {
  /* Even a SIGKILLed launcher leaves no worker behind (they get SIGTERM when it dies). */
  const char *args[] = {"run", "-n", "2", "--", "sh", "-c",
                        "echo $$ > \"$1/pid.tmp.$DTRAIN_RANK\"; "
                        "mv \"$1/pid.tmp.$DTRAIN_RANK\" \"$1/pid.$DTRAIN_RANK\"; exec sleep 60",
                        "sh", dir, NULL};
  pid_t l = spawn_dtrain(args);
  assert_true(wait_files("pid", 2, 20000));
  kill(l, SIGKILL);
  assert_true(wait_bounded(l, 20000) != -1);
  assert_true(pid_gone(read_pid(pathf("pid.0")), 5000));
  assert_true(pid_gone(read_pid(pathf("pid.1")), 5000));
}

static void test_signal_stdout_closed(void **state) {
  /* `dtrain run ... | head -1`: when our stdout's reader goes away the job ends (exit 141,
   * as for SIGPIPE), instead of running endless workers with nowhere to write. */
  int p[2];
  assert_int_equal(pipe(p), 0);
  pid_t l = fork();
  assert_true(l >= 0);
  if (l == 0) {
    dup2(p[1], 1);
    close(p[0]);
    close(p[1]);
    execl(bin, bin, "run", "-n", "2", "--", "sh", "-c",
          "echo $$ > \"$1/pid.tmp.$DTRAIN_RANK\"; "
          "mv \"$1/pid.tmp.$DTRAIN_RANK\" \"$1/pid.$DTRAIN_RANK\"; exec yes",
          "sh", dir, (char *)NULL);
    _exit(99);
  }
  close(p[1]);
  char buf[64];
  assert_true(read(p[0], buf, sizeof buf) > 0);
  assert_true(wait_files("pid", 2, 20000));
  close(p[0]);
  int st = wait_bounded(l, 20000);
  assert_true(st != -1 && WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 128 + SIGPIPE);
  assert_true(pid_gone(read_pid(pathf("pid.0")), 5000));
  assert_true(pid_gone(read_pid(pathf("pid.1")), 5000));
}

/* ---- usage ---- */

static void expect_usage(const char *const *args, const char *msg) {
  assert_int_equal(run_dtrain(30000, args), 2);
  char *err = slurp(pathf("err"));
  if (!strstr(err, msg))
    fail_msg("stderr '%s' lacks '%s'", err, msg);
  assert_true(strncmp(err, "dtrain run: ", 12) == 0);
  assert_int_equal(count_of(err, "\n"), 2); /* one error line, one hint line */
  assert_non_null(strstr(err, "\n---> HINT: "));
  free(err);
}

static void test_usage(void **state) {
  expect_usage((const char *[]){"run", "-n", "2", NULL}, "no command");
  expect_usage((const char *[]){"run", "-n", "2", "--", NULL}, "no command");
  expect_usage((const char *[]){"run", "true", NULL}, "-n is required");
  expect_usage((const char *[]){"run", "-n", "0", "true", NULL}, "-n '0'");
  expect_usage((const char *[]){"run", "-n", "two", "true", NULL}, "-n 'two'");
  expect_usage((const char *[]){"run", "-n", NULL}, "-n needs a value");
  expect_usage((const char *[]){"run", "-n", "2", "--bogus", "true", NULL}, "unknown option '--bogus'");
  expect_usage((const char *[]){"run", "-n", "2", "--master", "nohost", "true", NULL}, "--master 'nohost'");
  expect_usage((const char *[]){"run", "-n", "2", "--master", "h:0", "true", NULL}, "--master 'h:0'");
  expect_usage((const char *[]){"run", "-n", "2", "--master", "h:70000", "true", NULL}, "--master 'h:70000'");
  expect_usage((const char *[]){"run", "-n", "2", "--master", ":80", "true", NULL}, "--master ':80'");
  expect_usage((const char *[]){"run", "-n", "2", "--nnodes", "2", "true", NULL}, "needs --master");
  expect_usage((const char *[]){"run", "-n", "2", "--nnodes", "2", "--master", "h:1", "true", NULL},
               "needs --node-rank");
  expect_usage((const char *[]){"run", "-n", "2", "--node-rank", "1", "true", NULL},
               "--node-rank 1 is not below --nnodes 1");
  expect_usage((const char *[]){"run", "-n", "2", "--output", "loud", "true", NULL}, "--output mode 'loud'");
  expect_usage((const char *[]){"run", "-n", "2", "--kill-after", "-1", "true", NULL}, "--kill-after '-1'");
  expect_usage((const char *[]){"run", "-n", "2", "--timeout", "0", "true", NULL}, "--timeout '0'");
  /* out of range above: the message states the range, not just "> 0" */
  expect_usage((const char *[]){"run", "-n", "2", "--timeout", "1e30", "true", NULL},
               "--timeout '1e30' is not seconds in 0.001..10000000");
  expect_usage((const char *[]){"run", "-n", "2", "--kill-after", "1e30", "true", NULL},
               "--kill-after '1e30' is not seconds in 0..10000000");
  expect_usage((const char *[]){"run", "-n", "2", "--tail", "99999999999", "true", NULL},
               "is not a line count 1..10000");
  expect_usage((const char *[]){"run", "-n", "2", "--raw-stdout=1", "true", NULL}, "takes no value");

  /* Accepted spellings. */
  const char *ok[] = {"run", "-n2", "--output=prefix", "--master=[::1]:29500", "true", NULL};
  assert_int_equal(run_dtrain(30000, ok), 0);
  const char *help[] = {"run", "--help", NULL};
  assert_int_equal(run_dtrain(30000, help), 0);
  char *out = slurp(pathf("out"));
  assert_non_null(strstr(out, "--raw-stdout"));
  assert_non_null(strstr(out, "--output MODE"));
  assert_non_null(strstr(out, "DTRAIN_JOB_SECRET"));
  free(out);
}

/* ---- random ---- */

/* Workers of random behaviours (per rank: finish, exit with a code, kill itself, ignore SIGTERM,
 * hang, flood its output; some start a grandchild that holds the output) and a launcher that
 * gets zero, one or two of SIGINT/SIGTERM/SIGHUP at random moments, with random --kill-after and
 * --timeout: `dtrain run` must end within its bounds, with an exit status the case allows (a
 * failing worker's, 128 + the signal, 124, or 0 when nothing failed), say why on stderr when
 * not 0, and leave no worker or grandchild running. Cases until RANDOM_CASES or RANDOM_SECONDS;
 * a failure prints the case. */
static const char *random_script =
    "d=$1; shift; i=0; for b; do [ $i = \"$DTRAIN_RANK\" ] && break; i=$((i+1)); done\n"
    "IFS=,; set -- $b; unset IFS; kind=$1; t=$2; arg=$3\n"
    "if [ \"$4\" = 1 ]; then sleep 60 & echo $! > \"$d/g.$DTRAIN_RANK\"; mv \"$d/g.$DTRAIN_RANK\" \"$d/gpid.$DTRAIN_RANK\"; fi\n"
    "echo $$ > \"$d/p.$DTRAIN_RANK\"; mv \"$d/p.$DTRAIN_RANK\" \"$d/pid.$DTRAIN_RANK\"\n"
    "case $kind in\n"
    "  ok) sleep $t; echo done ;;\n"
    "  code) sleep $t; echo \"failing with $arg\" >&2; exit $arg ;;\n"
    "  sig) sleep $t; kill -$arg $$ ;;\n"
    "  deaf) trap '' TERM; while :; do sleep 0.05; done ;;\n"
    "  hang) sleep 60 ;;\n"
    "  flood) head -c $arg /dev/zero | tr '\\0' x; echo; sleep $t ;;\n"
    "esac\n";
#define RANDOM_CASES 40
#define RANDOM_SECONDS 75
static dt_rng rnd_rng;
static uint32_t rnd(uint32_t n) { return (uint32_t)dt_rng_below(&rnd_rng, n); }

static void test_random_stops(void **state) {
  (void)state;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int cases = 0;
  for (unsigned seed = 1; seed <= RANDOM_CASES; seed++) {
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (t1.tv_sec - t0.tv_sec > RANDOM_SECONDS)
      break;
    dt_rng_seed(&rnd_rng, seed);
    static const char *sigs[] = {"INT", "TERM", "HUP"};
    static const int signo[] = {SIGINT, SIGTERM, SIGHUP};
    int n = 1 + (int)rnd(4), endless = 0, failing = 0;
    bool allowed[256] = {false};
    char beh[4][64], killarg[16], toarg[16], desc[1024];
    const char *args[32];
    int a = 0;
    args[a++] = "run";
    args[a++] = "-n";
    char nbuf[12];
    snprintf(nbuf, sizeof nbuf, "%d", n);
    args[a++] = nbuf;
    snprintf(killarg, sizeof killarg, "%.1f", 0.2 + 0.1 * rnd(9));
    args[a++] = "--kill-after";
    args[a++] = killarg;
    for (int r = 0; r < n; r++) {
      double t = 0.05 * rnd(20);
      int g = rnd(4) == 0;
      switch (rnd(8)) {
      case 0:
      case 1: snprintf(beh[r], sizeof beh[r], "ok,%.2f,0,%d", t, g); break;
      case 2: {
        static const int codes[] = {1, 2, 3, 42};
        int c = codes[rnd(4)];
        allowed[c] = true;
        failing = 1;
        snprintf(beh[r], sizeof beh[r], "code,%.2f,%d,%d", t, c, g);
        break;
      }
      case 3: {
        int sg = rnd(2) ? 9 : 11;
        allowed[128 + sg] = true;
        failing = 1;
        snprintf(beh[r], sizeof beh[r], "sig,%.2f,%d,%d", t, sg, g);
        break;
      }
      case 4: endless = 1; snprintf(beh[r], sizeof beh[r], "deaf,0,0,%d", g); break;
      case 5: endless = 1; snprintf(beh[r], sizeof beh[r], "hang,0,0,%d", g); break;
      default: snprintf(beh[r], sizeof beh[r], "flood,%.2f,%d,%d", t, 1 << (10 + rnd(9)), g); break;
      }
    }
    int nsig = (int)rnd(3), timeout = endless && !failing && !nsig ? 1 : (int)rnd(2);
    if (timeout) {
      snprintf(toarg, sizeof toarg, "%.1f", 0.5 + 0.5 * rnd(4));
      args[a++] = "--timeout";
      args[a++] = toarg;
      allowed[124] = true;
    }
    args[a++] = "--";
    args[a++] = "sh";
    args[a++] = "-c";
    args[a++] = random_script;
    args[a++] = "sh";
    args[a++] = dir;
    for (int r = 0; r < n; r++)
      args[a++] = beh[r];
    args[a] = NULL;
    int which[2] = {0, 0}, when[2] = {0, 0};
    for (int k = 0; k < nsig; k++) {
      which[k] = (int)rnd(3);
      when[k] = (k ? when[0] : 0) + (int)rnd(1500);
    }
    if (nsig)
      allowed[128 + signo[which[0]]] = true;
    if (!failing && !endless)
      allowed[0] = true;
    int dl = snprintf(desc, sizeof desc, "case %u: dtrain run -n %d --kill-after %s%s%s, ranks:", seed, n, killarg,
                      timeout ? " --timeout " : "", timeout ? toarg : "");
    for (int r = 0; r < n; r++)
      dl += snprintf(desc + dl, sizeof desc - (size_t)dl, " %s", beh[r]);
    for (int k = 0; k < nsig; k++)
      dl += snprintf(desc + dl, sizeof desc - (size_t)dl, "; SIG%s at %d ms", sigs[which[k]], when[k]);
    for (int r = 0; r < 4; r++) {
      unlink(pathf("pid.%d", r));
      unlink(pathf("gpid.%d", r));
    }
    pid_t l = spawn_dtrain(args);
    for (int k = 0; k < nsig; k++) {
      msleep(when[k] - (k ? when[k - 1] : 0));
      kill(l, signo[which[k]]);
    }
    int st = wait_bounded(l, 20000);
    if (st == -1)
      fail_msg("%s: did not end within 20 s", desc);
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    /* a signal before the launcher set its handlers ends it as it ends any program, without a
     * word; the handlers come before the first worker, so this is allowed only when no worker
     * started (a loaded machine can take hundreds of ms to load the launcher's libraries) */
    bool started = false;
    for (int r = 0; r < n; r++)
      started = started || file_exists(pathf("pid.%d", r));
    bool early = WIFSIGNALED(st) && nsig && WTERMSIG(st) == signo[which[0]] && !started;
    char *err = slurp(pathf("err"));
    if (!allowed[rc & 255] || (rc != 0 && !early && !strstr(err, "dtrain run:")) || strstr(err, "Sanitizer") ||
        strstr(err, "runtime error"))
      fail_msg("%s: exit %d\n%s", desc, rc, err);
    free(err);
    for (int r = 0; r < n; r++) {
      const char *pf[2] = {pathf("pid.%d", r), pathf("gpid.%d", r)};
      for (int k = 0; k < 2; k++)
        if (file_exists(pf[k]) && !pid_gone(read_pid(pf[k]), 5000))
          fail_msg("%s: %s of rank %d still runs after exit %d", desc, k ? "a grandchild" : "the worker", r, rc);
    }
    cases++;
  }
  fprintf(stderr, "%d random cases\n", cases);
}

int main(int argc, char **argv) {
  bin = getenv("DTRAIN_BIN");
  if (!bin) {
    fprintf(stderr, "test_launch: DTRAIN_BIN is not set\n");
    return 1;
  }
  alarm(110);                           /* backstop for every bounded wait below */
  prctl(PR_SET_CHILD_SUBREAPER, 1);     /* orphaned grandchildren come to us, so we see them die */
  const char *group = argc > 1 ? argv[1] : "all";
  const struct CMUnitTest env[] = {
      cmocka_unit_test_setup_teardown(test_env_single_node, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_env_port_held, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_env_secret_passthrough, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_env_multi_node, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_elastic_bad_timeout, setup_dir, teardown_dir),
  };
  const struct CMUnitTest output[] = {
      cmocka_unit_test_setup_teardown(test_output_prefix, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_output_rank0, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_output_rank0_as_is, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_output_rank0_partial, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_detached_grandchild, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_deaf_grandchild, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_output_raw_stdout, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_output_full, setup_dir, teardown_dir),
  };
  const struct CMUnitTest failures[] = {
      cmocka_unit_test_setup_teardown(test_fail_exit_code, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_fail_signal, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_fail_others_settle, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_fail_rank0_mode_shows_hidden_tail, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_fail_not_found, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_fail_usage_not_restarted, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_fail_refused, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_fail_refuser_hangs, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_fail_timeout, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_stalled_reader, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_closed_stdout, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_all_ok_some_early, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_ok_with_failure_words, setup_dir, teardown_dir),
  };
  const struct CMUnitTest signals[] = {
      cmocka_unit_test_setup_teardown(test_signal_term, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_signal_int, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_signal_first_decides, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_signal_escalates_to_kill, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_signal_twice_kills_at_once, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_signal_launcher_killed, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_signal_no_busy_wait, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_signal_stdout_closed, setup_dir, teardown_dir),
  };
  const struct CMUnitTest usage[] = {
      cmocka_unit_test_setup_teardown(test_usage, setup_dir, teardown_dir),
  };
  const struct CMUnitTest random[] = {
      cmocka_unit_test_setup_teardown(test_random_stops, setup_dir, teardown_dir),
  };
  int fails = 0;
  bool all = !strcmp(group, "all");
  if (all || !strcmp(group, "env"))
    fails += cmocka_run_group_tests_name("launch_env", env, NULL, NULL);
  if (all || !strcmp(group, "output"))
    fails += cmocka_run_group_tests_name("launch_output", output, NULL, NULL);
  if (all || !strcmp(group, "fail"))
    fails += cmocka_run_group_tests_name("launch_fail", failures, NULL, NULL);
  if (all || !strcmp(group, "signal"))
    fails += cmocka_run_group_tests_name("launch_signal", signals, NULL, NULL);
  if (all || !strcmp(group, "usage"))
    fails += cmocka_run_group_tests_name("launch_usage", usage, NULL, NULL);
  if (all || !strcmp(group, "random"))
    fails += cmocka_run_group_tests_name("launch_random", random, NULL, NULL);
  return fails ? 1 : 0;
}
