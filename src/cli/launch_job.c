/* launch_job.c - starts the local workers of `dtrain run` and supervises them.
 * Each worker is fork+exec'd with stdin from /dev/null and its stdout/stderr on pipes that one
 * poll(2) loop reads. All workers (and whatever they start) share one process group, so a stop
 * reaches the whole job with one kill(2). Exit statuses are read with WNOWAIT and the zombies
 * are reaped only in dt__launch_finish: while worker 0's zombie exists its pid, which is the
 * group id, cannot be reused, so signalling the group never hits a stranger.
 * Every wait is bounded by a deadline or ends with a child's exit (SIGCHLD wakes the loop
 * through a self-pipe). It does not restart workers itself (run.c does, around it); an agent
 * that must hear of failures on other hosts passes a poll function the loop calls each tick. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/launch.h"
#include "core/core.h"

/* After every worker exited, how long we still read pipes that processes they started may
 * hold open, before stopping those too. */
#define JOB_DRAIN_MS 1000
/* After SIGKILL, how long we wait for the kernel to finish the workers before giving up on
 * them (a process in uninterruptible sleep); the job then reports them as stuck. */
#define JOB_KILL_WAIT_MS 3000
/* After a worker failed by itself, how long the others may take to end by themselves (having
 * been told by the library) before they get SIGTERM; at most --kill-after. */
#define JOB_SETTLE_MS 250
/* Longest poll(2) sleep: the loop re-checks its deadlines at least this often. */
#define JOB_TICK_MS 1000
/* With a poll function (an elastic agent): how often it is asked. */
#define JOB_POLL_TICK_MS 100

static volatile sig_atomic_t job_sig;       /* first stop signal received: the job's exit status */
static volatile sig_atomic_t job_sig_count; /* stop signals received */
static int wake_fd[2] = {-1, -1};           /* self-pipe: a handler wakes poll(2) */

static void on_signal(int sig) {
  int e = errno;
  if (sig != SIGCHLD && sig != SIGALRM) { /* SIGALRM: --timeout's moment (job_arm_deadline) */
    if (!job_sig) /* a second one, come before the loop saw the first, only hurries the stop */
      job_sig = sig;
    job_sig_count++;
  }
  if (wake_fd[1] >= 0) {
    char c = 0;
    ssize_t w = write(wake_fd[1], &c, 1);
    (void)w;
  }
  errno = e;
}

static const int stop_signals[] = {SIGINT, SIGTERM, SIGHUP};

static dt_status job_install_signals(void) {
  if (pipe2(wake_fd, O_CLOEXEC | O_NONBLOCK) != 0)
    return dt__errno(DT_ERR_SYSTEM, "dtrain run: pipe");
  job_sig = 0;
  job_sig_count = 0;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  /* The stop signals wait for each other's handler, so the handlers run in the order the signals
   * came and job_sig keeps the first. */
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < DT_ARRAY_LEN(stop_signals); i++)
    sigaddset(&sa.sa_mask, stop_signals[i]);
  sa.sa_flags = SA_NOCLDSTOP; /* no SA_RESTART: a blocked write to our stdout must see a stop */
  sigaction(SIGCHLD, &sa, NULL);
  sigaction(SIGALRM, &sa, NULL);
  for (size_t i = 0; i < DT_ARRAY_LEN(stop_signals); i++)
    sigaction(stop_signals[i], &sa, NULL);
  signal(SIGPIPE, SIG_IGN); /* a closed stdout reader must not kill the supervisor */
  /* A parent may have blocked these for us (the mask survives exec); we rely on them. */
  sigset_t m;
  sigemptyset(&m);
  sigaddset(&m, SIGCHLD);
  for (size_t i = 0; i < DT_ARRAY_LEN(stop_signals); i++)
    sigaddset(&m, stop_signals[i]);
  sigprocmask(SIG_UNBLOCK, &m, NULL);
  return DT_OK;
}

static void job_restore_signals(void) {
  signal(SIGCHLD, SIG_DFL);
  for (size_t i = 0; i < DT_ARRAY_LEN(stop_signals); i++)
    signal(stop_signals[i], SIG_DFL);
  for (int i = 0; i < 2; i++) {
    if (wake_fd[i] >= 0)
      close(wake_fd[i]);
    wake_fd[i] = -1;
  }
}

const char *dt__signal_name(int sig) {
  static char buf[32];
  const char *a = sigabbrev_np(sig);
  if (a)
    snprintf(buf, sizeof buf, "SIG%s", a);
  else
    snprintf(buf, sizeof buf, "signal %d", sig);
  return buf;
}

/* In the forked child: set up and exec. Never returns. On exec failure reports errno on
 * status_fd (close-on-exec, so the parent reads EOF when exec succeeded) and exits 127/126. */
static void job_child(const dt_job *job, int i, pid_t parent, int out_w, int err_w,
                      int status_w) {
  const dt_launch_opts *o = job->opts;
  for (size_t k = 0; k < DT_ARRAY_LEN(stop_signals); k++)
    signal(stop_signals[k], SIG_DFL);
  signal(SIGCHLD, SIG_DFL);
  signal(SIGPIPE, SIG_DFL);
  signal(SIGXFSZ, SIG_DFL); /* dtrain ignores it (main.c); the worker's program decides for itself */
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL); /* workers start with no signal blocked */
  /* If the supervisor dies without stopping us (SIGKILL), we get SIGTERM rather than run on as
   * an orphan that holds ports and shared memory. */
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent)
    _exit(128 + SIGTERM);
  setpgid(0, job->pgid); /* pgid 0 for worker 0: it leads the job's group */
  int nul = open("/dev/null", O_RDONLY);
  if (nul >= 0 && nul != 0) {
    dup2(nul, 0);
    close(nul);
  }
  dup2(out_w, 1);
  dup2(err_w, 2);
  char v[32];
  int rank = o->node_rank * o->nproc + i;
  snprintf(v, sizeof v, "%d", rank);
  setenv("DTRAIN_RANK", v, 1);
  setenv("RANK", v, 1);
  snprintf(v, sizeof v, "%d", i);
  setenv("DTRAIN_LOCAL_RANK", v, 1);
  setenv("LOCAL_RANK", v, 1);
  execvp(o->exec_path, o->argv);
  int e = errno;
  ssize_t w = write(status_w, &e, sizeof e);
  (void)w;
  _exit(e == ENOENT ? 127 : 126);
}

static void job_close(int *fd) {
  if (*fd >= 0)
    close(*fd);
  *fd = -1;
}

static void job_signal_all(dt_job *job, int sig) {
  if (job->pgid > 0)
    kill(-job->pgid, sig);
  /* A worker that moved itself to another group still gets it. */
  for (int i = 0; i < job->opts->nproc; i++)
    if (job->w[i].pid > 0 && !job->w[i].exited)
      kill(job->w[i].pid, sig);
  /* A stopped worker (SIGSTOP, a debugger, an injected hang) acts on SIGTERM only once it runs
   * again; without this it would always cost the whole grace period. */
  if (sig == SIGTERM) {
    if (job->pgid > 0)
      kill(-job->pgid, SIGCONT);
    for (int i = 0; i < job->opts->nproc; i++)
      if (job->w[i].pid > 0 && !job->w[i].exited)
        kill(job->w[i].pid, SIGCONT);
  }
}

dt_status dt__launch_start(dt_job *job, const dt_launch_opts *opts, dt_out *out) {
  memset(job, 0, sizeof *job);
  job->opts = opts;
  job->out = out;
  job->first_failed = -1;
  dt__out_set_world(out, opts->nnodes * opts->nproc);
  job->w = calloc((size_t)opts->nproc, sizeof *job->w);
  if (!job->w)
    return dt_set_error(DT_ERR_NOMEM, "dtrain run: %d workers", opts->nproc);
  for (int i = 0; i < opts->nproc; i++) {
    job->w[i].fd[0] = job->w[i].fd[1] = job->w[i].fd[2] = -1;
    job->w[i].local = i;
    job->w[i].rank = opts->node_rank * opts->nproc + i;
  }
  dt_status st = job_install_signals();
  if (st)
    return st;
  job->start_ns = dt_now_ns();
  pid_t self = getpid();
  for (int i = 0; i < opts->nproc; i++) {
    dt_worker *w = &job->w[i];
    int po[2] = {-1, -1}, pe[2] = {-1, -1}, ps[2] = {-1, -1};
    if (pipe2(po, O_CLOEXEC) || pipe2(pe, O_CLOEXEC) || pipe2(ps, O_CLOEXEC)) {
      st = dt__errno(DT_ERR_SYSTEM, "dtrain run: pipe for local rank %d", i);
      for (int k = 0; k < 2; k++) {
        job_close(&po[k]);
        job_close(&pe[k]);
        job_close(&ps[k]);
      }
      goto fail;
    }
    pid_t pid = fork();
    if (pid == 0)
      job_child(job, i, self, po[1], pe[1], ps[1]);
    close(po[1]);
    close(pe[1]);
    close(ps[1]);
    if (pid < 0) {
      st = dt__errno(DT_ERR_SYSTEM, "dtrain run: fork for local rank %d", i);
      close(po[0]);
      close(pe[0]);
      close(ps[0]);
      goto fail;
    }
    w->pid = pid;
    if (i == 0)
      job->pgid = pid;
    setpgid(pid, job->pgid); /* also here: whichever of parent and child runs first sets it */
    w->fd[1] = po[0];
    w->fd[2] = pe[0];
    fcntl(po[0], F_SETFL, O_NONBLOCK);
    fcntl(pe[0], F_SETFL, O_NONBLOCK);
    /* Bounded by the child: it either execs (EOF) or writes errno and exits. */
    int e = 0;
    ssize_t r;
    do
      r = read(ps[0], &e, sizeof e);
    while (r < 0 && errno == EINTR);
    close(ps[0]);
    if (r == (ssize_t)sizeof e) {
      w->exec_errno = e;
      break; /* the others would fail the same way: start no more */
    }
  }
  return DT_OK;
fail:
  /* Resource failure mid-start: stop what runs, through the normal bounded path. */
  job->outcome = DT_JOB_SIGNALED;
  job->stop_signal = 0;
  job_signal_all(job, SIGKILL);
  for (int i = 0; i < opts->nproc; i++) {
    if (job->w[i].pid > 0) {
      waitpid(job->w[i].pid, NULL, 0); /* SIGKILLed just now: returns promptly */
      job->w[i].reaped = true;
    }
    job_close(&job->w[i].fd[1]);
    job_close(&job->w[i].fd[2]);
  }
  job_restore_signals();
  free(job->w);
  job->w = NULL;
  return st;
}

/* Notes workers that exited since the last call. Returns the local index of the one that failed
 * (non-zero exit or signal) first, or -1. Exits seen in the same call cannot be ordered; then a
 * worker killed by a signal wins over one that exited with an error, since a crash is usually
 * the cause and the error exits of its peers ("peer failed") the effect. */
static int job_collect(dt_job *job) {
  int failed = -1;
  for (int i = 0; i < job->opts->nproc; i++) {
    dt_worker *w = &job->w[i];
    if (w->pid <= 0 || w->exited)
      continue;
    siginfo_t si;
    memset(&si, 0, sizeof si);
    if (waitid(P_PID, (id_t)w->pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid != w->pid)
      continue;
    w->exited = true;
    w->exit_ns = dt_now_ns();
    if (si.si_code == CLD_EXITED) {
      w->code = si.si_status;
    } else {
      w->sig = si.si_status;
      w->core = si.si_code == CLD_DUMPED;
    }
    if ((w->code != 0 || w->sig != 0) && (failed < 0 || (w->sig && !job->w[failed].sig)))
      failed = i;
  }
  return failed;
}

typedef struct {
  bool stopping, killed, draining, drain_stopped, drain_killed;
  int hold;         /* local index of a refuser whose own exit the SIGTERM waits for, or -1 */
  int64_t kill_at;  /* SIGKILL when this passes */
  int64_t term_at;  /* a worker failed: SIGTERM to the others when this passes (they may end first) */
  int64_t give_up;  /* after SIGKILL: stop waiting */
  int64_t drain_until;
} job_stop;

/* Notes the workers still running as stopped by us. */
static void job_mark_stopped(dt_job *job) {
  job->stopped = 0;
  for (int i = 0; i < job->opts->nproc; i++)
    if (job->w[i].pid > 0 && !job->w[i].exited) {
      job->w[i].stopped = true;
      job->stopped++;
    }
}

static void job_term(dt_job *job) {
  job_mark_stopped(job);
  DT_LOG_INFO("dtrain run: stopping %d running workers (SIGTERM, SIGKILL after %lld ms)",
              job->stopped, (long long)job->opts->kill_after_ms);
  job_signal_all(job, SIGTERM);
}

/* Stops the job: SIGTERM now, SIGKILL after the grace period. With s->hold set (a worker that
 * failed said that worker had refused, so it is ending by its own verdict), the SIGTERM waits
 * for that worker's own exit, which names the failure; SIGKILL still comes at the same time. */
static void job_begin_stop(dt_job *job, job_stop *s) {
  if (s->stopping)
    return;
  s->stopping = true;
  s->kill_at = dt__deadline_after_ms(job->opts->kill_after_ms);
  if (s->hold >= 0)
    DT_LOG_INFO("dtrain run: rank %d refused: waiting for it to exit before stopping the others "
                "(SIGKILL after %lld ms)", job->w[s->hold].rank, (long long)job->opts->kill_after_ms);
  else if (s->term_at == DT_NO_DEADLINE)
    job_term(job);
}

/* Ends a hold or a settle: the refuser exited, the settle time passed (or the job must stop now
 * for another reason). */
static void job_release(dt_job *job, job_stop *s) {
  if (s->hold < 0 && s->term_at == DT_NO_DEADLINE)
    return;
  s->hold = -1;
  s->term_at = DT_NO_DEADLINE;
  job_term(job);
}

static void job_kill(dt_job *job, job_stop *s) {
  if (s->killed)
    return;
  s->killed = true;
  if (s->hold >= 0 || s->term_at != DT_NO_DEADLINE) { /* SIGKILL came before the SIGTERM: they are ours too */
    s->hold = -1;
    s->term_at = DT_NO_DEADLINE;
    job_mark_stopped(job);
  }
  for (int i = 0; i < job->opts->nproc; i++)
    if (job->w[i].pid > 0 && !job->w[i].exited)
      job->killed = true; /* a worker outlived the grace period: worth reporting */
  job_signal_all(job, SIGKILL);
  s->kill_at = DT_NO_DEADLINE;
  s->give_up = dt__deadline_after_ms(JOB_KILL_WAIT_MS);
}

/* Reads what is available on one worker stream; closes it at EOF. Returns the bytes read. */
static ssize_t job_read(dt_job *job, int i, int stream) {
  static char buf[64 * 1024];
  dt_worker *w = &job->w[i];
  ssize_t r = read(w->fd[stream], buf, sizeof buf);
  if (r > 0) {
    dt__out_feed(job->out, i, stream, buf, (size_t)r);
  } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
    dt__out_eof(job->out, i, stream);
    job_close(&w->fd[stream]);
  }
  return r;
}

/* Reads what exited worker i wrote before its exit, so that its last words are known when its
 * failure is judged. All of it is in the pipe by now; at most the pipe's capacity is read per
 * stream, since more can only come from processes it left behind. */
static void job_drain(dt_job *job, int i) {
  for (int k = 1; k <= 2; k++) {
    int cap = job->w[i].fd[k] >= 0 ? fcntl(job->w[i].fd[k], F_GETPIPE_SZ) : 0;
    ssize_t got = 0, r;
    while (job->w[i].fd[k] >= 0 && got < (cap > 0 ? cap : 64 * 1024) && (r = job_read(job, i, k)) > 0)
      got += r;
  }
}

/* The local worker whose refusal failed worker i's exit reports ("rank R refused ..." in its
 * output), if it is one of ours and still running: it is ending by its own verdict, and its
 * exit, not i's, is the failure to name. -1 otherwise, and for a worker killed by a signal. */
static int job_refuser(dt_job *job, int i) {
  if (job->w[i].sig)
    return -1;
  job_drain(job, i);
  int r = dt__out_refuser(job->out, i) - job->opts->node_rank * job->opts->nproc;
  if (r < 0 || r >= job->opts->nproc || r == i || job->w[r].exited)
    return -1;
  return r;
}

void dt__launch_supervise(dt_job *job) { dt__launch_supervise_poll(job, NULL, NULL); }

/* SIGALRM at the job's deadline (0: none; a pending one is cancelled): a write of the workers'
 * output that a stalled reader holds then returns EINTR and gives up (dt__out_set_abandon), as
 * it does on a stop signal, so that --timeout ends the job. */
static void job_arm_deadline(int64_t deadline) {
  struct itimerval it = {{0, 0}, {0, 0}};
  if (deadline != DT_NO_DEADLINE) {
    int64_t ns = DT_MAX((int64_t)1000000, deadline - dt_now_ns() + 1000000);
    it.it_value.tv_sec = (time_t)(ns / 1000000000);
    it.it_value.tv_usec = (suseconds_t)(ns % 1000000000 / 1000);
  }
  setitimer(ITIMER_REAL, &it, NULL);
}

/* What a stalled write to our stdout asks (dt__out_set_abandon): must the job stop now? */
typedef struct job_abandon {
  const int *seen_sigs;
  const int64_t *deadline;
  const bool *stopping;
} job_abandon;

static bool job_over(void *ctx) {
  (void)ctx;
  return true;
}

static bool job_must_stop(void *ctx) {
  const job_abandon *a = ctx;
  return job_sig_count != *a->seen_sigs || dt__expired(*a->deadline) || *a->stopping;
}

void dt__launch_supervise_poll(dt_job *job, bool (*poll_fn)(void *ctx), void *ctx) {
  const dt_launch_opts *o = job->opts;
  int n = o->nproc;
  struct pollfd *pf = calloc((size_t)2 * n + 1, sizeof *pf);
  int *who = calloc((size_t)2 * n + 1, sizeof *who);
  job_stop s = {.hold = -1, .kill_at = DT_NO_DEADLINE, .term_at = DT_NO_DEADLINE, .give_up = DT_NO_DEADLINE,
                .drain_until = DT_NO_DEADLINE};
  int64_t job_deadline = o->timeout_ms > 0 ? job->start_ns + o->timeout_ms * 1000000 : DT_NO_DEADLINE;
  int seen_sigs = 0;
  job_abandon ab = {.seen_sigs = &seen_sigs, .deadline = &job_deadline, .stopping = &s.stopping};
  dt__out_set_abandon(job->out, job_must_stop, &ab);
  job_arm_deadline(job_deadline);
  job->outcome = DT_JOB_OK;
  for (int i = 0; i < n; i++) {
    if (job->w[i].exec_errno) {
      job->outcome = DT_JOB_EXEC;
      job->first_failed = i;
      job_begin_stop(job, &s);
      break;
    }
  }
  for (;;) {
    int failed = job_collect(job);
    if (failed >= 0 && job->outcome == DT_JOB_OK) {
      job->outcome = DT_JOB_FAILED;
      job->first_failed = failed;
      job->detect_ns = job->w[failed].exit_ns;
      s.hold = job_refuser(job, failed);
      /* A worker that failed by itself has, through the library, told the others why: they
       * usually end within milliseconds, saying so. SIGTERM goes to the ones still there after
       * JOB_SETTLE_MS, so that each rank's own last words reach the output. */
      if (s.hold < 0 && !job->w[failed].sig && !s.stopping)
        s.term_at = dt__deadline_after_ms(DT_MIN(JOB_SETTLE_MS, o->kill_after_ms));
      job_begin_stop(job, &s);
    }
    if (dt__expired(s.term_at))
      job_release(job, &s);
    /* The refuser exited by itself: its failure (and reason) is the one to report, whichever
     * exit came first (the others stop because of its verdict). */
    if (s.hold >= 0 && job->w[s.hold].exited) {
      const dt_worker *w = &job->w[s.hold];
      if (w->code != 0 || w->sig)
        job->first_failed = s.hold;
      job_release(job, &s);
    }
    /* The verdict came first, but the rank it names is one of ours and ended by itself (not by
     * our stop): that is the failure to report, with its own exit code. */
    if (job->outcome == DT_JOB_FAILED && job->first_failed < 0) {
      int v = dt__out_verdict_rank(job->out) - o->node_rank * o->nproc;
      if (v >= 0 && v < n && job->w[v].exited) {
        const dt_worker *w = &job->w[v];
        if (w->code != 0 || (w->sig && w->sig != SIGTERM && !(w->sig == SIGKILL && s.killed)))
          job->first_failed = v;
      }
      /* The stop came from elsewhere (another host, or a verdict naming no rank of ours) before
       * we reaped one of ours that ended with code 2, a usage or settings error: never a reaction
       * to being stopped, so it is this host's failure (and no restart mends it). */
      for (int i = 0; i < n && job->first_failed < 0; i++)
        if (job->w[i].exited && !job->w[i].sig && job->w[i].code == 2)
          job->first_failed = i;
    }
    /* A survivor named a dead or hung rank: no need to wait for the survivors to exit. */
    if (job->outcome == DT_JOB_OK && !s.stopping && dt__out_verdict_ns(job->out)) {
      job->outcome = DT_JOB_FAILED;
      job->detect_ns = dt__out_verdict_ns(job->out);
      job_begin_stop(job, &s);
    }
    if (job_sig_count != seen_sigs) {
      seen_sigs = job_sig_count;
      if (!s.stopping) {
        job->outcome = DT_JOB_SIGNALED;
        job->stop_signal = job_sig;
        job_begin_stop(job, &s);
      } else if (s.hold >= 0 || s.term_at != DT_NO_DEADLINE) {
        job_release(job, &s); /* a first Ctrl-C while holding or settling: SIGTERM now */
      } else {
        /* A second Ctrl-C while stopping: do not wait out the grace period. */
        job->killed_asked = true;
        job_kill(job, &s);
      }
    }
    if (!s.stopping && dt__out_stdout_broken(job->out)) {
      job->outcome = DT_JOB_SIGNALED;
      job->stop_signal = SIGPIPE;
      job_begin_stop(job, &s);
    }
    if (dt__expired(job_deadline)) {
      job_deadline = DT_NO_DEADLINE; /* acted on: must not make poll(2) spin */
      if (!s.stopping) {
        job->outcome = DT_JOB_TIMED_OUT;
        job_begin_stop(job, &s);
      }
    }
    /* Asked every tick, also while stopping (an agent renews its lease there). */
    bool stop_asked = poll_fn && poll_fn(ctx);
    if (!s.stopping && stop_asked) {
      job->outcome = DT_JOB_FAILED; /* first_failed stays -1: the failure was elsewhere */
      job->detect_ns = dt_now_ns();
      job_begin_stop(job, &s);
    }
    if (s.stopping && dt__expired(s.kill_at))
      job_kill(job, &s);

    bool all_exited = true, open_fds = false;
    for (int i = 0; i < n; i++) {
      all_exited &= job->w[i].pid <= 0 || job->w[i].exited;
      open_fds |= job->w[i].fd[1] >= 0 || job->w[i].fd[2] >= 0;
    }
    if (all_exited && !open_fds)
      break;
    if (all_exited && !s.draining) {
      s.draining = true;
      s.drain_until = dt__deadline_after_ms(JOB_DRAIN_MS);
    }
    if (dt__expired(s.drain_until) && s.drain_stopped && !s.drain_killed && job->pgid > 0) {
      /* left behind in the workers' group and deaf to SIGTERM: SIGKILL, as for a worker */
      s.drain_killed = true;
      s.drain_until = dt__deadline_after_ms(JOB_DRAIN_MS);
      kill(-job->pgid, SIGKILL);
      fprintf(stderr, "dtrain run: every worker exited, but processes they started still held their output "
                      "after SIGTERM; killed them\n");
    }
    if (dt__expired(s.drain_until) && s.drain_stopped) {
      /* what still holds the pipes left the workers' process group (setsid): not ours to wait for */
      fprintf(stderr, "dtrain run: every worker exited, but a process one of them started outside its "
                      "process group (setsid?) still holds its output open; not waiting for it\n");
      break;
    }
    if (dt__expired(s.drain_until)) {
      /* processes the workers left behind in their group still hold our pipes: stop them, and
       * give them as long again to go */
      s.drain_stopped = true;
      s.drain_until = dt__deadline_after_ms(JOB_DRAIN_MS);
      job_begin_stop(job, &s);
    }
    if (dt__expired(s.give_up))
      break;

    int np = 0;
    if (pf && who) {
      pf[np].fd = wake_fd[0];
      pf[np].events = POLLIN;
      who[np++] = -1;
      for (int i = 0; i < n; i++)
        for (int k = 1; k <= 2; k++)
          if (job->w[i].fd[k] >= 0) {
            pf[np].fd = job->w[i].fd[k];
            pf[np].events = POLLIN;
            who[np++] = i * 3 + k;
          }
    }
    int64_t next = DT_MIN(DT_MIN(DT_MIN(job_deadline, s.kill_at), DT_MIN(s.give_up, s.drain_until)), s.term_at);
    int ms = DT_MIN(dt__ms_left(next), poll_fn ? JOB_POLL_TICK_MS : JOB_TICK_MS);
    int r = np ? poll(pf, (nfds_t)np, ms) : (dt__sleep_ns((int64_t)ms * 1000000), 0);
    if (r <= 0)
      continue; /* timeout, or EINTR: the top of the loop looks at what happened */
    for (int k = 0; k < np; k++) {
      if (!pf[k].revents)
        continue;
      if (who[k] < 0) {
        char drain[64];
        while (read(wake_fd[0], drain, sizeof drain) > 0) {
        }
      } else {
        job_read(job, who[k] / 3, who[k] % 3);
      }
    }
  }
  for (int i = 0; i < n; i++)
    for (int k = 1; k <= 2; k++)
      if (job->w[i].fd[k] >= 0) {
        dt__out_eof(job->out, i, k);
        job_close(&job->w[i].fd[k]);
      }
  for (int i = 0; i < n; i++)
    if (job->w[i].pid > 0 && !job->w[i].exited)
      job->stuck++;
  dt__out_set_abandon(job->out, job_over, NULL); /* the job is over: nothing may hold the summary */
  job_arm_deadline(DT_NO_DEADLINE);
  free(pf);
  free(who);
}

void dt__launch_finish(dt_job *job) {
  if (!job->w)
    return;
  /* Whatever the workers started and left in the group goes with the job. The group still
   * exists (worker 0's zombie is in it), so this cannot reach an unrelated process. */
  if (job->pgid > 0)
    kill(-job->pgid, SIGKILL);
  for (int i = 0; i < job->opts->nproc; i++) {
    dt_worker *w = &job->w[i];
    if (w->pid > 0 && !w->reaped && waitpid(w->pid, NULL, w->exited ? 0 : WNOHANG) == w->pid)
      w->reaped = true;
    job_close(&w->fd[1]);
    job_close(&w->fd[2]);
  }
  job_restore_signals();
  free(job->w);
  job->w = NULL;
}
