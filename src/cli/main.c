/* main.c - the dtrain command: dispatches to one subcommand per file under src/cli/. */
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

static void usage(FILE *f) {
  fprintf(f, "usage: dtrain <command> [options]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
  fprintf(f, "\n'dtrain <command> --help' describes each command.\n");
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!strcmp(argv[1], "--version"))
    return dt_cli_version(argc - 1, argv + 1);
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(argv[1], commands[i].name))
      return commands[i].main(argc - 1, argv + 1);
  fprintf(stderr, "dtrain: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
