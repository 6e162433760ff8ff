/* cli/launch.h - the parts of `dtrain run`: worker output handling (launch_output.c) and the
 * job that forks, supervises and stops the local workers (launch_job.c). run.c parses the
 * command line, fills a dt_launch_opts and prints the outcome.
 * One agent per host. Elastic restarts (run.c, run_elastic.c) go around
 * dt__launch_start/supervise/finish: a restart is a new start with a new rendezvous generation;
 * across hosts the agents agree on generations through an agent store (run_elastic.c). */
#ifndef DT_CLI_LAUNCH_H
#define DT_CLI_LAUNCH_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "dtrain/core.h"

typedef enum {
  DT_OUT_PREFIX, /* every line of every rank, prefixed "[rank R] " */
  DT_OUT_RANK0,  /* rank 0 unprefixed; other ranks only warning/error-like lines, prefixed */
} dt_out_mode;

typedef struct dt_launch_opts {
  int nproc;             /* workers on this host (-n) */
  int nnodes;            /* hosts in the job */
  int node_rank;         /* this host's index in [0, nnodes) */
  char master_addr[256]; /* where rank 0's rendezvous store listens */
  int master_port;
  dt_out_mode out_mode;
  bool raw_stdout;       /* rank 0's stdout byte for byte on our stdout; all else to stderr */
  int64_t kill_after_ms; /* grace between SIGTERM and SIGKILL when stopping workers */
  int64_t timeout_ms;    /* whole-job limit; 0 = none (a later generation: what is left of it) */
  int64_t timeout_given_ms; /* --timeout as given, for messages */
  int tail_lines;        /* lines of the failing rank shown in the failure summary */
  char **argv;           /* worker command, NULL-terminated; borrowed */
  const char *exec_path; /* what to execvp (argv[0], or this binary for "dtrain") */
  /* elastic (issue 6): zero = off */
  int max_restarts;         /* new generations after a worker failure */
  int64_t fault_timeout_ms; /* DTRAIN_FAULT_TIMEOUT_MS for the workers; 0 = their default */
  int min_nodes, max_nodes; /* hosts the job may shrink to / grow to (multi-node restarts) */
} dt_launch_opts;

/* ---- output: line splitting, prefixes, filters, per-rank tails (launch_output.c) ---- */
typedef struct dt_out dt_out;

/* Output state for `nlocal` workers whose global ranks start at rank_base. NULL on no memory. */
dt_out *dt__out_create(int nlocal, int rank_base, dt_out_mode mode, bool raw_stdout,
                       int tail_lines);
void dt__out_destroy(dt_out *o);
/* Bytes read from local worker `local`'s stream (1 = stdout, 2 = stderr). Writes whole lines
 * (terminated by \n, or by \r for progress displays) at once; holds a partial line. */
void dt__out_feed(dt_out *o, int local, int stream, const char *buf, size_t n);
/* The stream closed: a held partial line is written with a newline added. */
void dt__out_eof(dt_out *o, int local, int stream);
/* Ends a progress display left on a terminal (cursor after \r) so a message starts on a fresh
 * line. */
void dt__out_settle(dt_out *o);
/* Writes the last lines of a worker (both streams, arrival order) to fd (1 or 2), each after
 * indent. */
void dt__out_write_tail(dt_out *o, int local, int fd, const char *indent);
/* When a worker first printed a failure verdict ("rank R failed ..."; the comm layer's words
 * for a dead or hung peer), 0 if none yet: the survivors know before they exit. */
int64_t dt__out_verdict_ns(const dt_out *o);
/* The rank that verdict named, -1 if none. */
int dt__out_verdict_rank(const dt_out *o);
/* The rank a worker last said had refused ("rank R refused ..."; the trainer's words on the
 * other ranks when rank 0 refuses to start or resume: rank R stops by its own verdict and
 * needs no signal), -1 if none. A worker naming itself does not count. */
int dt__out_refuser(const dt_out *o, int local);
/* Line k (0 = oldest) of a worker's tail, NULL past the end; valid until the next feed. */
const char *dt__out_tail_line(const dt_out *o, int local, int k);
/* Number of lines dt__out_write_tail would write. */
int dt__out_tail_count(dt_out *o, int local);
/* True once a write to our stdout failed with EPIPE (`dtrain run ... | head`): the job should
 * end as a program killed by SIGPIPE would. */
bool dt__out_stdout_broken(const dt_out *o);
/* fn(ctx) says the job must stop now: a write to a reader that stopped reading then gives up
 * (that output is dropped) instead of holding the launcher. */
void dt__out_set_abandon(dt_out *o, bool (*fn)(void *ctx), void *ctx);
/* Whether output was dropped that way. */
bool dt__out_stalled(const dt_out *o);
/* The job's number of ranks: a worker's "rank R failed" with R outside it is only text. */
void dt__out_set_world(dt_out *o, int world);
/* True if the line looks like a warning or error ("error", "warn", "fatal", "hint",
 * "exception", "traceback", any case): the lines other ranks show in DT_OUT_RANK0 mode. */
bool dt__out_is_alert(const char *s, size_t n);

/* ---- the job (launch_job.c) ---- */
typedef struct dt_worker {
  pid_t pid;       /* 0 if never started (no worker starts after one failed to exec) */
  int local, rank; /* local and global rank */
  int fd[3];       /* read ends of stdout (1) and stderr (2) pipes; -1 when closed */
  bool exited;     /* exit status collected (the zombie is kept until finish) */
  bool reaped;
  int code;        /* exit code, if !sig */
  int sig;         /* terminating signal, 0 if it exited */
  bool core;       /* dumped core */
  int exec_errno;  /* non-zero: the command could not be executed */
  bool stopped;    /* still running when we began stopping the job: we signalled it */
  int64_t exit_ns; /* dt_now_ns() when its exit was seen */
} dt_worker;

typedef enum {
  DT_JOB_OK,        /* every worker exited 0 */
  DT_JOB_FAILED,    /* a worker failed; first_failed names it */
  DT_JOB_EXEC,      /* the command could not be started; first_failed names the worker */
  DT_JOB_SIGNALED,  /* we got SIGINT/SIGTERM/SIGHUP (stop_signal) and stopped the workers;
                     * SIGPIPE: our stdout's reader went away */
  DT_JOB_TIMED_OUT, /* --timeout passed and we stopped the workers */
} dt_job_outcome;

typedef struct dt_job {
  const dt_launch_opts *opts;
  dt_worker *w;       /* opts->nproc */
  pid_t pgid;         /* one process group for all workers and their children */
  dt_out *out;
  int64_t start_ns;
  dt_job_outcome outcome;
  int first_failed;   /* local index, -1 if none (or the failure was seen in a verdict line) */
  int64_t detect_ns;  /* when the failure was first seen (an exit, a verdict line, a poll) */
  int stop_signal;    /* signal that made us stop, for DT_JOB_SIGNALED */
  int stopped;        /* workers still running when we began stopping them */
  bool killed;        /* SIGKILL was needed */
  bool killed_asked;  /* ... because a second signal asked for it, not after the grace period */
  int stuck;          /* workers that did not die even after SIGKILL (not reaped) */
} dt_job;

/* Installs signal handlers, creates the process group and starts every worker with its
 * environment (set by the caller for the job-wide variables; per-rank ones set here).
 * A worker whose command cannot be executed is found here (outcome DT_JOB_EXEC after
 * supervise). Fails (status + detail) only on resource errors (pipes, fork); workers already
 * started are then stopped before returning. */
dt_status dt__launch_start(dt_job *job, const dt_launch_opts *opts, dt_out *out);
/* Runs until every worker has exited, a worker fails (exits badly, or a worker prints a
 * failure verdict naming a rank), a stop signal arrives or the timeout passes; copies all output meanwhile. On failure, signal or timeout it stops the others
 * (SIGTERM, then SIGKILL after opts->kill_after_ms). A failed worker whose output says a local
 * rank R refused (dt__out_refuser) makes the SIGTERM wait for R's own exit, and R is then the
 * one first_failed names; SIGKILL comes at the same time either way. Every wait is bounded or ends with a
 * child's exit. Sets job->outcome. */
void dt__launch_supervise(dt_job *job);
/* Like dt__launch_supervise, but calls poll_fn(ctx) every tick (about 100 ms, also while
 * stopping); when it returns true the job is stopped as on a failure elsewhere (outcome DT_JOB_FAILED with
 * first_failed -1 unless a local worker failed first). For agents that learn of failures on
 * other hosts. poll_fn may be NULL. */
void dt__launch_supervise_poll(dt_job *job, bool (*poll_fn)(void *ctx), void *ctx);
/* Reaps the workers and frees the job's resources (not opts, not out). */
void dt__launch_finish(dt_job *job);

/* ---- elastic restarts (run.c, run_elastic.c) ---- */
typedef struct dt__run_failure {
  int gen;          /* generation that failed */
  char what[600];   /* who failed and how */
  double detect_s;  /* from the generation's start until the failure was seen */
  double restart_s; /* from then until the next generation's workers were started; < 0: none were */
} dt__run_failure;
/* With DTRAIN_RUN_EVENTS=FILE: appends {"event","node","gen","t_ns" (CLOCK_MONOTONIC),"world",
 * "what"} as one line (one write, so agents sharing the file do not interleave). */
void dt__run_event(const char *event, int node, int gen, int64_t t_ns, int world, const char *what);
/* R if p starts "rank R failed:" or "rank R (...) failed:", else -1. */
int dt__run_failed_rank(const char *p);
/* R if p starts "rank R refused to start" or "... to resume" (the trainer's refusals), else -1. */
int dt__run_refused_rank(const char *p);
/* The first line in any worker's recent output naming a failed rank ("rank 3 failed: ..."), or "". */
void dt__run_cause(dt_job *job, char *buf, size_t n);
/* "rank 1 killed by signal 9 (SIGKILL) (rank 1 failed: connection lost ...)". */
void dt__run_describe_failure(dt_job *job, char *buf, size_t n);
/* The variables every worker of this host shares (world size, node rank, store address, a new
 * job id, a secret if none is set); per-rank ones are set in each child. */
dt_status dt__run_job_env(const dt_launch_opts *o);
/* One summary for a job that did not end well; returns the exit code. */
int dt__run_report(dt_job *job);
/* A failure restarting cannot mend: the first failed worker exited with 2, the conventional code
 * of a usage or settings error (dtrain's own commands use it for bad flags, data or settings
 * that differ across workers or from the checkpoint). Says so on stderr. */
bool dt__run_not_restartable(const dt_job *job);
/* The list of failures that led to restarts (stderr). */
void dt__run_print_failures(const dt__run_failure *f, int n, int restarts_left);
/* Multi-host elastic agent (--nnodes > 1 with --max-restarts): returns the exit code. The job
 * environment is already set up (run_job_env). */
int dt__run_elastic(dt_launch_opts *o);

/* "SIGKILL" for 9; "signal N" style fallback owned by a static buffer. */
const char *dt__signal_name(int sig);

#endif
