/* cli/cli.h - the dtrain subcommands, one file each. A subcommand returns the process exit
 * code: 0 success, 1 runtime failure, 2 bad usage (wrong flag, impossible value). main turns a
 * failure to write standard output into exit 1 with "dtrain: writing standard output: ...". */
#ifndef DT_CLI_H
#define DT_CLI_H

typedef struct dt_cli_cmd {
  const char *name;
  int (*main)(int argc, char **argv); /* argv[0] is the subcommand name */
  const char *summary;
} dt_cli_cmd;

/* Prints "dtrain <cmd>: <msg>" and, if hint is non-NULL, "---> HINT: <hint>" to stderr;
 * returns 2 (usage) so callers can `return dt_cli_usage_error(...)`. */
int dt_cli_usage_error(const char *cmd, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prints "dtrain <cmd>: <msg>: <dt_last_error()>" and returns 1. */
int dt_cli_fail(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Records a failed write(2) to standard output made outside stdio (the launcher copying its
 * workers' output); main reports the first at exit, with stdio's own errors, and exits 1. */
void dt_cli_stdout_failed(int err);

int dt_cli_version(int argc, char **argv);
int dt_cli_run(int argc, char **argv);
int dt_cli_bench(int argc, char **argv);
int dt_cli_train(int argc, char **argv);
int dt_cli_eval(int argc, char **argv);
int dt_cli_inspect(int argc, char **argv);
int dt_cli_store(int argc, char **argv);

#endif
