/* main.c - the dtrain command: dispatches to one subcommand per file under src/cli/. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "dtrain/core.h"
#include "nn/nn.h"

int dt_cli_version(int argc, char **argv) {
  (void)argc;
  (void)argv;
  printf("dtrain %s\n", dt_version());
  return 0;
}

/* One line per subcommand; each lives in src/cli/<name>.c. */
static const dt_cli_cmd commands[] = {
    {"version", dt_cli_version, "print the version"},
    {"run", dt_cli_run, "launch and supervise N workers (torchrun, horovodrun)"},
    {"bench", dt_cli_bench, "measure a collective on N local ranks (nccl-tests columns)"},
    {"train", dt_cli_train, "train a model on Fashion-MNIST or any IDX dataset, on 1..N workers"},
    {"eval", dt_cli_eval, "evaluate a saved model on a test set"},
    {"inspect", dt_cli_inspect, "show and verify a checkpoint, safetensors model or IDX file"},
    {"store", dt_cli_store, "host a job's rendezvous store and failure detector as its own process"},
};

/* "dtrain CMD: MSG[: DETAIL]\n[---> HINT: HINT\n]" in one write(2): a worker stopped midway (a
 * launcher's SIGTERM) leaves the whole message or none of it, never "dtrain train: " alone. */
static void cli_say(const char *cmd, const char *fmt, va_list ap, const char *detail, const char *hint) {
  char b[4096];
  int n = snprintf(b, sizeof b, "dtrain %s: ", cmd);
  n += vsnprintf(b + n, sizeof b - (size_t)n, fmt, ap);
  if (n < (int)sizeof b && detail && *detail)
    n += snprintf(b + n, sizeof b - (size_t)n, ": %s", detail);
  if (n < (int)sizeof b)
    n += snprintf(b + n, sizeof b - (size_t)n, "\n");
  if (n < (int)sizeof b && hint)
    n += snprintf(b + n, sizeof b - (size_t)n, "---> HINT: %s\n", hint);
  if (n >= (int)sizeof b) { /* cut: still one whole line */
    n = (int)sizeof b - 1;
    b[n - 1] = '\n';
  }
  fflush(stderr);
  for (const char *p = b; n > 0;) {
    ssize_t w = write(STDERR_FILENO, p, (size_t)n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      break;
    p += w;
    n -= (int)w;
  }
}

int dt_cli_usage_error(const char *cmd, const char *hint, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  cli_say(cmd, fmt, ap, NULL, hint);
  va_end(ap);
  return 2;
}

int dt_cli_fail(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  cli_say(cmd, fmt, ap, dt_last_error(), NULL);
  va_end(ap);
  return 1;
}

static int stdout_errno; /* first failed write(2) to fd 1 outside stdio (the launcher's) */

void dt_cli_stdout_failed(int err) {
  if (!stdout_errno)
    stdout_errno = err;
}

/* Every command ends here: output that could not be written (a full disk, > /dev/full) makes it
 * fail with exit 1, never exit 0 with a truncated file. A reader that went away (EPIPE) is not
 * reported: that is 141, as if SIGPIPE had ended the process (run's documented code). */
static int finish(int rc) {
  int err = stdout_errno;
  errno = 0;
  if ((fflush(stdout) != 0 || ferror(stdout)) && !err)
    err = errno ? errno : EIO;
  if (fclose(stdout) != 0 && !err)
    err = errno ? errno : EIO;
  if (!err)
    return rc;
  if (err == EPIPE)
    return rc ? rc : 128 + SIGPIPE;
  fprintf(stderr, "dtrain: writing standard output: %s\n", strerror(err));
  return rc ? rc : 1;
}

static void usage(FILE *f) {
  fprintf(f, "usage: dtrain <command> [options]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
  fprintf(f, "\n'dtrain <command> --help' describes each command. Every command exits 1 when its\n"
             "standard output cannot be written (a full disk).\n");
}

int main(int argc, char **argv) {
  /* A standard descriptor closed by our parent (>&-) is opened on /dev/null, so that the next
   * file or socket we open does not take its number (a socket on fd 1 took the workers' output,
   * and its EPIPE read as "the reader went away"); a closed stdout is then reported as the
   * write error it would have been. */
  for (int fd = 0; fd <= 2; fd++)
    if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
      int nfd = open("/dev/null", fd ? O_WRONLY : O_RDONLY);
      if (nfd >= 0 && nfd != fd) {
        dup2(nfd, fd);
        close(nfd);
      }
      if (fd == 1)
        dt_cli_stdout_failed(EBADF);
    }
  /* Past a file-size limit (ulimit -f) a write then fails with EFBIG, which the command reports
   * naming the file (and a checkpoint's temporary file is removed), instead of SIGXFSZ ending the
   * process without a word and leaving the partial file behind. */
  signal(SIGXFSZ, SIG_IGN);
  dt__nn_blas_serial(); /* before OpenBLAS's idle threads spin away the ranks' first moments */
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return finish(argc < 2 ? 2 : 0);
  }
  if (!strcmp(argv[1], "--version"))
    return finish(dt_cli_version(argc - 1, argv + 1));
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(argv[1], commands[i].name))
      return finish(commands[i].main(argc - 1, argv + 1));
  fprintf(stderr, "dtrain: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
