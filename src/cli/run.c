/* run.c - `dtrain run`: launch N workers on this host and supervise them (torchrun's and
 * horovodrun's job). Parses the command line, prepares the job-wide environment (ranks, the
 * rendezvous address, a per-job secret and id), runs the job (launch_job.c) and prints one
 * summary when it did not end well.
 * Several hosts: one `dtrain run` per host with --nnodes/--node-rank/--master; these agents do
 * not talk to each other (no heartbeats, no restarts: issue 6). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/launch.h"
#include "core/core.h"
#include "dtrain/fault.h"

#define RUN_MAX_NPROC 1024
#define RUN_SECRET_BYTES 32
#define RUN_JOB_ID_BYTES 8

static void run_help(FILE *f) {
  fprintf(f,
"usage: dtrain run -n N [options] [--] COMMAND [ARGS...]\n"
"\n"
"Starts N workers running COMMAND on this host, gives each its rank, and supervises them:\n"
"if one fails the others are stopped and one summary names it; Ctrl-C stops them all.\n"
"\n"
"options:\n"
"  -n, --nproc N         workers on this host (1..%d; required)\n"
"  --nnodes M            hosts in the job (default 1); run one 'dtrain run' on each host\n"
"  --node-rank R         this host's index 0..M-1 (required when M > 1); global rank of\n"
"                        local worker i is R*N + i\n"
"  --master HOST:PORT    where rank 0 hosts the rendezvous store (required when M > 1;\n"
"                        on one host the default is 127.0.0.1 and a free port)\n"
"  --output MODE         prefix: every line of every rank as '[rank R] line' (default)\n"
"                        rank0:  rank 0's output as is, and from other ranks only lines\n"
"                                that look like warnings or errors (error, warn, fatal,\n"
"                                hint, exception, traceback; any case), prefixed\n"
"  --raw-stdout          rank 0's standard output goes to stdout byte for byte, unprefixed;\n"
"                        everything else goes to stderr (for --json output a script parses)\n"
"  --kill-after SECONDS  grace between SIGTERM and SIGKILL when stopping workers (default 5)\n"
"  --timeout SECONDS     stop the whole job after this long and exit 124 (default: none)\n"
"  --tail N              lines of the failing rank shown in the summary (default 10)\n"
"\n"
"fault tolerance:\n"
"  --max-restarts K      after a worker fails, stop the others and start a new generation\n"
"                        of workers (DTRAIN_RESTART_COUNT = 1, 2, ...; a new rendezvous),\n"
"                        up to K times; the workers resume from their last checkpoint\n"
"                        (e.g. dtrain train --checkpoint-dir D --resume). Default 0. A\n"
"                        worker exiting with code 2 (usage or settings) is not restarted\n"
"  --min-nodes A         with --nnodes > 1 and restarts: go on with at least A hosts when\n"
"                        hosts fail (default: all of --nnodes); a host whose workers fail\n"
"                        twice is left out of later generations\n"
"  --max-nodes B         hosts that may join a generation (default --nnodes); a host that\n"
"                        is not in the running generation (restarted after it was lost)\n"
"                        joins by starting its agent again: the job re-forms with it\n"
"  --fault-timeout S     a worker silent for S seconds (hung, stopped, cut off), or whose\n"
"                        data stops arriving for S seconds although it says it sent it, is\n"
"                        declared failed (DTRAIN_FAULT_TIMEOUT_MS; default the workers' 10 s)\n"
"  --inject-fault SPEC   fault injection for rehearsals and tests (DTRAIN_FAULTS; repeat to\n"
"                        add faults), e.g. 'kill:rank=1,step=5' or 'stop:rank=any,step=3-9;\n"
"                        seed=4'; kinds kill, stop, exit, delay (ms=D per message), slow\n"
"                        (ms=D more compute per step: a straggler), close\n"
"                        (cut its connections), drop (its data frames on tcp vanish while\n"
"                        it stays alive: 'drop:rank=1,step=5[,count=N][,p=P]'), corrupt-ckpt\n"
"                        (see include/dtrain/fault.h); a fault fires in generation 0 only\n"
"                        unless gen=G|any says otherwise; kill, stop and exit fire at the\n"
"                        step's start, or with at=update before the worker's optimizer update\n"
"  DTRAIN_RUN_EVENTS=FILE  one JSON line per generation start, failure and end, with\n"
"                        CLOCK_MONOTONIC times (for measuring detection and recovery)\n"
"  -h, --help            this text\n"
"\n"
"Each worker gets DTRAIN_RANK, DTRAIN_WORLD_SIZE, DTRAIN_LOCAL_RANK,\n"
"DTRAIN_LOCAL_WORLD_SIZE, DTRAIN_NODE_RANK, DTRAIN_NNODES, DTRAIN_MASTER_ADDR,\n"
"DTRAIN_MASTER_PORT, DTRAIN_JOB_ID, and torchrun's RANK, WORLD_SIZE, LOCAL_RANK,\n"
"LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT. DTRAIN_JOB_SECRET is generated per job unless\n"
"DTRAIN_JOB_SECRET or DTRAIN_JOB_SECRET_FILE is set (then passed through; with --nnodes > 1\n"
"one of them must be set, the same on every host). Workers read stdin from /dev/null.\n"
"COMMAND 'dtrain' runs this same dtrain binary.\n"
"\n"
"When a worker fails, the others get SIGTERM (SIGKILL after --kill-after): at once if it was\n"
"killed by a signal, 0.25 s later if it exited with a code (the library has told the others\n"
"why; they usually end by themselves, saying so). stderr gets one summary: the first failing\n"
"rank, its exit code or signal, and its last lines. A worker\n"
"that fails saying 'rank R refused ...' points at R: the SIGTERM waits for R's own exit and\n"
"R is named (SIGKILL after --kill-after all the same). With --max-restarts the job goes on\n"
"in a new generation, and at the end stderr lists each failure, when it was detected and\n"
"how long the restart took.\n"
"\n"
"exit status: 0 when every worker exits 0; else the first failing worker's exit code, or\n"
"128+S if it died of signal S; 127 (126) if COMMAND cannot be found (executed); 130/143/129\n"
"after SIGINT/SIGTERM/SIGHUP (the first of them); 141 if our stdout's reader went away, 1 if it cannot be\n"
"written (a full disk); 124 after --timeout; 2 for bad usage.\n",
          RUN_MAX_NPROC);
}

#define USAGE_HINT "see 'dtrain run --help'"

static bool run_parse_int(const char *s, long lo, long hi, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi)
    return false;
  *out = (int)v;
  return true;
}

#define RUN_MAX_SECONDS 10000000 /* 115 days: far beyond any job */

static bool run_parse_seconds(const char *s, int64_t *ms) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v) || v < 0 || v > RUN_MAX_SECONDS)
    return false;
  *ms = (int64_t)llround(v * 1000.0);
  return true;
}

/* HOST:PORT or [V6ADDR]:PORT. */
static bool run_parse_master(const char *s, dt_launch_opts *o) {
  const char *colon = strrchr(s, ':');
  if (!colon || colon == s)
    return false;
  const char *h = s;
  size_t hn = (size_t)(colon - s);
  if (h[0] == '[') {
    if (hn < 3 || h[hn - 1] != ']')
      return false;
    h++;
    hn -= 2;
  } else if (memchr(h, ':', hn)) {
    return false; /* a bare IPv6 address is ambiguous: it needs brackets */
  }
  if (hn == 0 || hn >= sizeof o->master_addr)
    return false;
  if (!run_parse_int(colon + 1, 1, 65535, &o->master_port))
    return false;
  memcpy(o->master_addr, h, hn);
  o->master_addr[hn] = '\0';
  return true;
}

/* A port for rank 0's store, held until this launcher exits or picks another: bind port 0 with
 * SO_REUSEADDR, read it back, and keep the socket bound but never listening. Rank 0's store
 * (which also sets SO_REUSEADDR) can still bind and listen on it, while the kernel hands the port
 * to nobody else, neither for another bind(0) nor as a connection's source port. Closing the
 * socket right away left a window in which another job's process on this host (a parallel test
 * suite) took the port before rank 0 bound it, and the job failed at rendezvous. */
static int run_port_hold = -1;

static dt_status run_free_port(int *port) {
  if (run_port_hold >= 0)
    close(run_port_hold);
  run_port_hold = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (run_port_hold < 0)
    return dt__errno(DT_ERR_SYSTEM, "socket");
  int one = 1;
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (setsockopt(run_port_hold, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      bind(run_port_hold, (struct sockaddr *)&a, sizeof a) != 0 ||
      getsockname(run_port_hold, (struct sockaddr *)&a, &len) != 0) {
    dt_status st = dt__errno(DT_ERR_SYSTEM, "bind 127.0.0.1:0");
    close(run_port_hold);
    run_port_hold = -1;
    return st;
  }
  *port = ntohs(a.sin_port);
  return DT_OK;
}

static dt_status run_random_hex(char *out, size_t nbytes) {
  unsigned char b[64];
  DT_CHECK(dt__random_bytes(b, nbytes));
  for (size_t i = 0; i < nbytes; i++)
    sprintf(out + 2 * i, "%02x", b[i]);
  memset(b, 0, sizeof b);
  return DT_OK;
}

static void run_setenv_int(const char *a, const char *b, int v) {
  char s[32];
  snprintf(s, sizeof s, "%d", v);
  setenv(a, s, 1);
  if (b)
    setenv(b, s, 1);
}

dt_status dt__run_job_env(const dt_launch_opts *o) {
  run_setenv_int("DTRAIN_WORLD_SIZE", "WORLD_SIZE", o->nnodes * o->nproc);
  run_setenv_int("DTRAIN_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE", o->nproc);
  run_setenv_int("DTRAIN_NODE_RANK", NULL, o->node_rank);
  run_setenv_int("DTRAIN_NNODES", NULL, o->nnodes);
  run_setenv_int("DTRAIN_MASTER_PORT", "MASTER_PORT", o->master_port);
  setenv("DTRAIN_MASTER_ADDR", o->master_addr, 1);
  setenv("MASTER_ADDR", o->master_addr, 1);
  /* A fresh id per agent: it names this host's shared-memory segments, so two jobs (or two
   * agents on one machine) never collide. */
  char id[2 * RUN_JOB_ID_BYTES + 1];
  DT_CHECK(run_random_hex(id, RUN_JOB_ID_BYTES));
  setenv("DTRAIN_JOB_ID", id, 1);
  if (!dt__env_str("DTRAIN_JOB_SECRET") && !dt__env_str("DTRAIN_JOB_SECRET_FILE")) {
    char secret[2 * RUN_SECRET_BYTES + 1];
    DT_CHECK(run_random_hex(secret, RUN_SECRET_BYTES));
    setenv("DTRAIN_JOB_SECRET", secret, 1);
    memset(secret, 0, sizeof secret);
  }
  return DT_OK;
}

/* How the stop ended, for the summary: "" when every worker left on SIGTERM. */
static const char *run_kill_note(const dt_job *job) {
  return !job->killed        ? ""
         : job->killed_asked ? " (SIGKILL at a second signal)"
                             : " (SIGKILL was needed after the grace period)";
}

/* 2 pipes per worker: lift the soft descriptor limit to the hard one for big -n. */
static void run_raise_nofile(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

static void run_describe_exit(const dt_worker *w, char *buf, size_t n) {
  if (w->sig)
    snprintf(buf, n, "killed by signal %d (%s)%s", w->sig, dt__signal_name(w->sig),
             w->core ? ", core dumped" : "");
  else
    snprintf(buf, n, "exit code %d", w->code);
}

/* One summary for a job that did not end well; returns our exit code. */
int dt__run_report(dt_job *job) {
  const dt_launch_opts *o = job->opts;
  char what[128];
  int rc = 0;
  dt__out_settle(job->out);
  if (dt__out_stalled(job->out))
    fprintf(stderr, "dtrain run: the workers' output was dropped once the job had to stop: the reader of our output "
                    "was not reading\n");
  if (job->outcome == DT_JOB_EXEC) {
    const dt_worker *w = &job->w[job->first_failed];
    fprintf(stderr, "dtrain run: cannot execute '%s' (rank %d): %s\n", o->argv[0], w->rank,
            strerror(w->exec_errno));
    fprintf(stderr, "---> HINT: %s\n",
            w->exec_errno == ENOENT
                ? (strchr(o->argv[0], '/') ? "check the path" : "check the name and PATH")
                : "check that the file is an executable program and you may run it");
    rc = w->exec_errno == ENOENT ? 127 : 126;
  } else if (job->outcome == DT_JOB_FAILED && job->first_failed < 0) {
    char what[600];
    dt__run_describe_failure(job, what, sizeof what);
    fprintf(stderr, "dtrain run: the job failed: %s; stopped %d worker%s here\n", what, job->stopped,
            job->stopped == 1 ? "" : "s");
    rc = 1;
  } else if (job->outcome == DT_JOB_FAILED) {
    const dt_worker *w = &job->w[job->first_failed];
    run_describe_exit(w, what, sizeof what);
    fprintf(stderr, "dtrain run: rank %d failed first: %s (local rank %d, pid %d, after %.2f s)\n",
            w->rank, what, w->local, (int)w->pid, (double)(w->exit_ns - job->start_ns) / 1e9);
    /* The first to fail may have been still running when a peer's verdict line made us stop
     * the job: it is not one of the others. */
    int others = job->stopped - (w->stopped ? 1 : 0);
    if (others > 0)
      fprintf(stderr, "dtrain run: stopped the other %d running worker%s%s\n", others, others == 1 ? "" : "s",
              run_kill_note(job));
    int nt = dt__out_tail_count(job->out, w->local);
    if (nt == 0) {
      fprintf(stderr, "dtrain run: rank %d wrote no output\n", w->rank);
    } else {
      fprintf(stderr, "dtrain run: last %d line%s of rank %d:\n", nt, nt == 1 ? "" : "s", w->rank);
      dt__out_write_tail(job->out, w->local, 2, "  | ");
    }
    rc = w->sig ? 128 + w->sig : w->code;
  } else if (job->outcome == DT_JOB_SIGNALED && job->stop_signal == SIGPIPE) {
    rc = 128 + SIGPIPE; /* quiet, like any program whose reader went away */
  } else if (job->outcome == DT_JOB_SIGNALED) {
    fprintf(stderr, "dtrain run: got %s; stopped %d running worker%s%s\n",
            dt__signal_name(job->stop_signal), job->stopped, job->stopped == 1 ? "" : "s",
            run_kill_note(job));
    rc = 128 + job->stop_signal;
  } else if (job->outcome == DT_JOB_TIMED_OUT) {
    fprintf(stderr, "dtrain run: --timeout %.3g s passed; stopped %d running worker%s%s\n",
            (double)o->timeout_given_ms / 1e3, job->stopped, job->stopped == 1 ? "" : "s",
            run_kill_note(job));
    rc = 124;
  }
  if (job->stuck > 0) {
    fprintf(stderr, "dtrain run: %d worker%s did not exit even after SIGKILL:", job->stuck,
            job->stuck == 1 ? "" : "s");
    for (int i = 0; i < o->nproc; i++)
      if (job->w[i].pid > 0 && !job->w[i].exited)
        fprintf(stderr, " rank %d pid %d", job->w[i].rank, (int)job->w[i].pid);
    fputc('\n', stderr);
    if (rc == 0)
      rc = 1;
  }
  return rc;
}

/* One line per failure that led to a restart, and the end of the story. */
void dt__run_print_failures(const dt__run_failure *f, int n, int restarts_left) {
  if (n == 0)
    return;
  int restarts = 0;
  for (int k = 0; k < n; k++)
    restarts += f[k].restart_s >= 0;
  fprintf(stderr, "dtrain run: %d failure%s, %d restart%s:\n", n, n == 1 ? "" : "s", restarts,
          restarts == 1 ? "" : "s");
  for (int k = 0; k < n; k++)
    if (f[k].restart_s >= 0)
      fprintf(stderr, "  generation %d: %s; detected %.3f s into the generation, new workers started %.3f s later\n",
              f[k].gen, f[k].what, f[k].detect_s, f[k].restart_s);
    else
      fprintf(stderr, "  generation %d: %s; detected %.3f s into the generation, no new workers\n", f[k].gen,
              f[k].what, f[k].detect_s);
  (void)restarts_left;
}

/* Picks the clearest account of a failure: the first line of any worker's tail that names a
 * failed rank ("rank 3 failed: no heartbeat ..."), which tells a hang from its victims' errors. */
void dt__run_event(const char *event, int node, int gen, int64_t t_ns, int world, const char *what) {
  const char *path = dt__env_str("DTRAIN_RUN_EVENTS");
  if (!path)
    return;
  char w[700], line[900];
  size_t k = 0;
  for (const char *p = what ? what : ""; *p && k < sizeof w - 1; p++)
    w[k++] = (*p == '"' || *p == '\\') ? '\'' : ((unsigned char)*p < 0x20 ? ' ' : *p);
  w[k] = '\0';
  int n = snprintf(line, sizeof line, "{\"event\":\"%s\",\"node\":%d,\"gen\":%d,\"t_ns\":%lld,\"world\":%d,\"what\":\"%s\"}\n",
                   event, node, gen, (long long)t_ns, world, w);
  /* without waiting: a FIFO nobody reads must not hold the launcher */
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd < 0) {
    static bool said; /* the agent's own thread only */
    if (!said)
      fprintf(stderr, "dtrain run: DTRAIN_RUN_EVENTS=%s: %s: no events will be written\n", path,
              dt__open_failure(path, errno));
    said = true;
    return;
  }
  ssize_t r = write(fd, line, (size_t)DT_MIN(n, (int)sizeof line - 1)); /* one write: lines of agents do not mix */
  (void)r;
  close(fd);
}

/* R if p starts "rank R <word>" or "rank R (...) <word>", else -1. */
static int run_rank_then(const char *p, const char *word) {
  int r, used = 0;
  if (sscanf(p, "rank %d%n", &r, &used) != 1 || r < 0)
    return -1;
  p += used;
  while (*p == ' ')
    p++;
  if (*p == '(') { /* "rank 0 (store host 10.0.0.1:29500) failed" */
    const char *close = strchr(p, ')');
    if (!close)
      return -1;
    p = close + 1;
    while (*p == ' ')
      p++;
  }
  return strncmp(p, word, strlen(word)) == 0 ? r : -1;
}

/* The library's verdicts read "rank R failed: why" (store.c, health.c), the trainer's refusal
 * "rank 0 refused to start: ..." or "... to resume: ...". A program's own text ("rank 3 failed
 * to load a plugin") must not stop a healthy job, so only those forms count. */
int dt__run_failed_rank(const char *p) { return run_rank_then(p, "failed:"); }
int dt__run_refused_rank(const char *p) {
  int r = run_rank_then(p, "refused to start");
  return r >= 0 ? r : run_rank_then(p, "refused to resume");
}

void dt__run_cause(dt_job *job, char *buf, size_t n) {
  buf[0] = '\0';
  for (int i = 0; i < job->opts->nproc; i++) {
    const char *line;
    for (int k = 0; (line = dt__out_tail_line(job->out, i, k)); k++)
      for (const char *p = strstr(line, "rank "); p; p = strstr(p + 5, "rank "))
        if (dt__run_failed_rank(p) >= 0) {
          snprintf(buf, n, "%s", p);
          return;
        }
  }
}

void dt__run_describe_failure(dt_job *job, char *buf, size_t n) {
  char cause[512], what[128];
  dt__run_cause(job, cause, sizeof cause);
  if (job->first_failed >= 0) {
    run_describe_exit(&job->w[job->first_failed], what, sizeof what);
    snprintf(buf, n, "rank %d %s%s%s%s", job->w[job->first_failed].rank, what, cause[0] ? " (" : "", cause,
             cause[0] ? ")" : "");
  } else {
    snprintf(buf, n, "%s", cause[0] ? cause : "a failure on another host");
  }
}

/* Runs the job on this host, and again in a new generation after each worker failure while
 * restarts are left. Returns the exit code. */
static int run_generations(dt_launch_opts *o, bool have_master) {
  dt__run_failure fails[64];
  int nfails = 0;
  int64_t run_start = dt_now_ns(), total_ms = o->timeout_ms, detect_ns = 0;
  int rc = 0;
  for (int gen = 0;; gen++) {
    char v[32];
    snprintf(v, sizeof v, "%d", gen);
    setenv("DTRAIN_RESTART_COUNT", v, 1);
    if (gen > 0 && !have_master) { /* a fresh store: nothing of the failed generation lingers */
      if (run_free_port(&o->master_port))
        return dt_cli_fail("run", "cannot find a free port for the rendezvous store");
      run_setenv_int("DTRAIN_MASTER_PORT", "MASTER_PORT", o->master_port);
    }
    if (total_ms > 0) {
      o->timeout_ms = total_ms - (dt_now_ns() - run_start) / 1000000;
      if (o->timeout_ms < 1)
        o->timeout_ms = 1;
    }
    dt_out *out = dt__out_create(o->nproc, o->node_rank * o->nproc, o->out_mode, o->raw_stdout, o->tail_lines);
    if (!out)
      return dt_cli_fail("run", "out of memory for %d workers", o->nproc);
    DT_LOG_INFO("dtrain run: generation %d: %d workers (ranks %d..%d of %d), store at %s:%d", gen, o->nproc,
                o->node_rank * o->nproc, o->node_rank * o->nproc + o->nproc - 1, o->nnodes * o->nproc,
                o->master_addr, o->master_port);
    dt_job job;
    if (dt__launch_start(&job, o, out)) {
      dt__out_destroy(out);
      return dt_cli_fail("run", "cannot start the workers");
    }
    if (gen > 0 && nfails > 0)
      fails[nfails - 1].restart_s = (double)(job.start_ns - detect_ns) / 1e9;
    dt__run_event("start", o->node_rank, gen, job.start_ns, o->nnodes * o->nproc, NULL);
    dt__launch_supervise(&job);
    if (job.outcome == DT_JOB_FAILED && gen < o->max_restarts && nfails < (int)DT_ARRAY_LEN(fails) &&
        !dt__run_not_restartable(&job)) {
      dt__run_failure *f = &fails[nfails++];
      f->gen = gen;
      f->restart_s = -1;
      dt__run_describe_failure(&job, f->what, sizeof f->what);
      detect_ns = job.detect_ns;
      f->detect_s = (double)(detect_ns - job.start_ns) / 1e9;
      dt__run_event("failure", o->node_rank, gen, detect_ns, o->nnodes * o->nproc, f->what);
      dt__out_settle(out);
      fprintf(stderr, "dtrain run: generation %d failed: %s; restarting (%d of %d)\n", gen, f->what, gen + 1,
              o->max_restarts);
      dt__launch_finish(&job);
      dt__out_destroy(out);
      continue;
    }
    dt__run_event(job.outcome == DT_JOB_OK ? "end" : "failure", o->node_rank, gen, dt_now_ns(),
                  o->nnodes * o->nproc, job.outcome == DT_JOB_OK ? "ok" : "no restarts left");
    rc = dt__run_report(&job);
    dt__launch_finish(&job);
    dt__out_destroy(out);
    break;
  }
  dt__run_print_failures(fails, nfails, o->max_restarts - nfails);
  return rc;
}

bool dt__run_not_restartable(const dt_job *job) {
  if (job->outcome != DT_JOB_FAILED || job->first_failed < 0)
    return false;
  const dt_worker *w = &job->w[job->first_failed];
  if (w->sig || w->code != 2)
    return false;
  fprintf(stderr, "dtrain run: rank %d exited with code 2 (a usage or settings error): a restart would fail "
                  "the same way; not restarting\n", w->rank);
  return true;
}

int dt_cli_run(int argc, char **argv) {
  dt_launch_opts o;
  memset(&o, 0, sizeof o);
  o.nproc = 0;
  o.nnodes = 1;
  o.node_rank = -1;
  o.out_mode = DT_OUT_PREFIX;
  o.kill_after_ms = 5000;
  o.tail_lines = 10;
  bool have_master = false;
  static char faults[4096];
  faults[0] = '\0';
  int i = 1;
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--")) {
      i++;
      break;
    }
    if (a[0] != '-' || !a[1])
      break; /* the command starts here */
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      run_help(stdout);
      return 0;
    }
    /* --flag=value and --flag value; -n N and -nN. */
    const char *val = NULL;
    char name[32];
    const char *eq = strchr(a, '=');
    if (a[1] == '-' && eq) {
      snprintf(name, sizeof name, "%.*s", (int)(eq - a), a);
      val = eq + 1;
    } else if (a[1] == 'n' && a[2]) {
      snprintf(name, sizeof name, "-n");
      val = a + 2;
    } else {
      snprintf(name, sizeof name, "%s", a);
    }
    bool flag = !strcmp(name, "--raw-stdout");
    bool known = flag || !strcmp(name, "-n") || !strcmp(name, "--nproc") ||
                 !strcmp(name, "--nnodes") || !strcmp(name, "--node-rank") ||
                 !strcmp(name, "--master") || !strcmp(name, "--output") ||
                 !strcmp(name, "--kill-after") || !strcmp(name, "--timeout") ||
                 !strcmp(name, "--tail") || !strcmp(name, "--max-restarts") ||
                 !strcmp(name, "--min-nodes") || !strcmp(name, "--max-nodes") ||
                 !strcmp(name, "--fault-timeout") || !strcmp(name, "--inject-fault");
    if (!known)
      return dt_cli_usage_error("run", USAGE_HINT, "unknown option '%s'", a);
    if (flag) {
      if (val)
        return dt_cli_usage_error("run", USAGE_HINT, "%s takes no value", name);
      o.raw_stdout = true;
      continue;
    }
    if (!val) {
      if (i + 1 >= argc)
        return dt_cli_usage_error("run", USAGE_HINT, "%s needs a value", name);
      val = argv[++i];
    }
    if (!strcmp(name, "-n") || !strcmp(name, "--nproc")) {
      if (!run_parse_int(val, 1, RUN_MAX_NPROC, &o.nproc))
        return dt_cli_usage_error("run", "-n is the number of workers on this host, e.g. -n 4",
                                  "-n '%s' is not a worker count in 1..%d", val, RUN_MAX_NPROC);
    } else if (!strcmp(name, "--nnodes")) {
      if (!run_parse_int(val, 1, 65536, &o.nnodes))
        return dt_cli_usage_error("run", USAGE_HINT, "--nnodes '%s' is not a host count >= 1", val);
    } else if (!strcmp(name, "--node-rank")) {
      if (!run_parse_int(val, 0, 65535, &o.node_rank))
        return dt_cli_usage_error("run", USAGE_HINT, "--node-rank '%s' is not an index >= 0", val);
    } else if (!strcmp(name, "--master")) {
      if (!run_parse_master(val, &o))
        return dt_cli_usage_error("run", "give it as HOST:PORT, e.g. --master 10.0.0.1:29500",
                                  "--master '%s' is not HOST:PORT with a port in 1..65535", val);
      have_master = true;
    } else if (!strcmp(name, "--output")) {
      if (!strcmp(val, "prefix"))
        o.out_mode = DT_OUT_PREFIX;
      else if (!strcmp(val, "rank0"))
        o.out_mode = DT_OUT_RANK0;
      else
        return dt_cli_usage_error("run", "--output is 'prefix' or 'rank0'",
                                  "unknown --output mode '%s'", val);
    } else if (!strcmp(name, "--kill-after")) {
      if (!run_parse_seconds(val, &o.kill_after_ms))
        return dt_cli_usage_error("run", USAGE_HINT, "--kill-after '%s' is not seconds in 0..%d", val,
                                  RUN_MAX_SECONDS);
    } else if (!strcmp(name, "--timeout")) {
      if (!run_parse_seconds(val, &o.timeout_ms) || o.timeout_ms == 0)
        return dt_cli_usage_error("run", USAGE_HINT, "--timeout '%s' is not seconds in 0.001..%d", val,
                                  RUN_MAX_SECONDS);
      o.timeout_given_ms = o.timeout_ms;
    } else if (!strcmp(name, "--tail")) {
      if (!run_parse_int(val, 1, 10000, &o.tail_lines))
        return dt_cli_usage_error("run", USAGE_HINT, "--tail '%s' is not a line count 1..10000", val);
    } else if (!strcmp(name, "--max-restarts")) {
      if (!run_parse_int(val, 0, 10000, &o.max_restarts))
        return dt_cli_usage_error("run", USAGE_HINT, "--max-restarts '%s' is not a count 0..10000", val);
    } else if (!strcmp(name, "--min-nodes")) {
      if (!run_parse_int(val, 1, 65536, &o.min_nodes))
        return dt_cli_usage_error("run", USAGE_HINT, "--min-nodes '%s' is not a host count 1..65536", val);
    } else if (!strcmp(name, "--max-nodes")) {
      if (!run_parse_int(val, 1, 65536, &o.max_nodes))
        return dt_cli_usage_error("run", USAGE_HINT, "--max-nodes '%s' is not a host count 1..65536", val);
    } else if (!strcmp(name, "--fault-timeout")) {
      if (!run_parse_seconds(val, &o.fault_timeout_ms) || o.fault_timeout_ms < 1 || o.fault_timeout_ms > 86400000)
        return dt_cli_usage_error("run", USAGE_HINT, "--fault-timeout '%s' is not seconds in 0.001..86400", val);
    } else if (!strcmp(name, "--inject-fault")) {
      size_t have = strlen(faults), add = strlen(val);
      if (have + add + 2 > sizeof faults)
        return dt_cli_usage_error("run", USAGE_HINT, "--inject-fault: specs longer than %zu bytes", sizeof faults - 2);
      if (have)
        faults[have++] = ';';
      memcpy(faults + have, val, add + 1);
    }
  }
  if (o.nproc == 0)
    return dt_cli_usage_error("run", "e.g. dtrain run -n 2 -- dtrain train",
                              "the number of workers -n is required");
  if (i >= argc)
    return dt_cli_usage_error("run", "e.g. dtrain run -n 2 -- dtrain train",
                              "no command to run");
  if (o.nnodes > 1) {
    if (!have_master)
      return dt_cli_usage_error("run", "every host's agent needs the same --master HOST:PORT",
                                "--nnodes %d needs --master HOST:PORT", o.nnodes);
    if (o.node_rank < 0)
      return dt_cli_usage_error("run", "give each host its index, 0 on the master's host",
                                "--nnodes %d needs --node-rank", o.nnodes);
    if (!dt__env_str("DTRAIN_JOB_SECRET") && !dt__env_str("DTRAIN_JOB_SECRET_FILE"))
      return dt_cli_usage_error("run",
                                "set DTRAIN_JOB_SECRET (or DTRAIN_JOB_SECRET_FILE) to the same "
                                "random value on every host",
                                "--nnodes %d needs a job secret shared by all hosts", o.nnodes);
  }
  if (o.node_rank < 0)
    o.node_rank = 0;
  if (o.node_rank >= o.nnodes)
    return dt_cli_usage_error("run", "node ranks are 0..nnodes-1",
                              "--node-rank %d is not below --nnodes %d", o.node_rank, o.nnodes);
  if ((long)o.nnodes * o.nproc > INT_MAX / 2)
    return dt_cli_usage_error("run", USAGE_HINT, "world size %d x %d is too large", o.nnodes,
                              o.nproc);
  if (o.min_nodes == 0)
    o.min_nodes = o.nnodes;
  if (o.max_nodes == 0)
    o.max_nodes = o.nnodes;
  if (o.min_nodes > o.nnodes || o.max_nodes < o.nnodes)
    return dt_cli_usage_error("run", "use --min-nodes <= --nnodes <= --max-nodes",
                              "--min-nodes %d / --max-nodes %d do not bracket --nnodes %d", o.min_nodes,
                              o.max_nodes, o.nnodes);
  /* the plan of --inject-fault, else one given in the environment (a rank=R beyond the world
   * would never fire) */
  const char *plan = faults[0] ? faults : dt__env_str("DTRAIN_FAULTS");
  if (plan && dt_fault_validate(plan, o.nnodes * o.nproc) != DT_OK)
    return dt_cli_usage_error("run", "see 'dtrain run --help' and include/dtrain/fault.h", "%s: %s",
                              faults[0] ? "--inject-fault" : "DTRAIN_FAULTS", dt_last_error());
  if (faults[0])
    setenv("DTRAIN_FAULTS", faults, 1);
  if (o.fault_timeout_ms > 0) {
    char v[32];
    snprintf(v, sizeof v, "%lld", (long long)o.fault_timeout_ms);
    setenv("DTRAIN_FAULT_TIMEOUT_MS", v, 1);
  }
  const char *sf = dt__env_str("DTRAIN_JOB_SECRET_FILE");
  if (sf && !dt__env_str("DTRAIN_JOB_SECRET") && access(sf, R_OK) != 0)
    return dt_cli_usage_error("run", "point DTRAIN_JOB_SECRET_FILE at a readable file",
                              "DTRAIN_JOB_SECRET_FILE '%s': %s", sf, strerror(errno));
  o.argv = argv + i;
  o.exec_path = o.argv[0];
  static char self[PATH_MAX];
  if (!strcmp(o.argv[0], "dtrain")) {
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
      self[n] = '\0';
      o.exec_path = self;
    }
  }
  if (!have_master) {
    snprintf(o.master_addr, sizeof o.master_addr, "127.0.0.1");
    if (run_free_port(&o.master_port))
      return dt_cli_fail("run", "cannot find a free port for the rendezvous store");
  }
  if (dt__run_job_env(&o))
    return dt_cli_fail("run", "cannot prepare the job environment");
  run_raise_nofile();
  if (o.nnodes > 1 && o.max_restarts > 0)
    return dt__run_elastic(&o);
  return run_generations(&o, have_master);
}
