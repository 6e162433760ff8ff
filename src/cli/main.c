/* main.c - the dtrain command: dispatches to one subcommand per file under src/cli/. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "dtrain/core.h"

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

int dt_cli_usage_error(const char *cmd, const char *hint, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "dtrain %s: ", cmd);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  if (hint)
    fprintf(stderr, "---> HINT: %s\n", hint);
  return 2;
}

int dt_cli_fail(const char *cmd, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "dtrain %s: ", cmd);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  const char *d = dt_last_error();
  if (d && *d)
    fprintf(stderr, ": %s", d);
  fputc('\n', stderr);
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
