/* store.c - `dtrain store`: runs a job's rendezvous store (and failure detector) as its own
 * process, for jobs whose store lives at a fixed address rather than inside rank 0
 * (DTRAIN_HOST_STORE=0 / dt_comm_config.host_store = 0 on every rank).
 *
 *   dtrain store --world N [--port P] [--bind ADDR] [--fault-timeout MS] [--until-done]
 *
 * The job secret comes from DTRAIN_JOB_SECRET / DTRAIN_JOB_SECRET_FILE, as for the ranks. The
 * first line on stdout is "listening on ADDR:PORT" (scripts read the port when --port 0).
 * Runs until SIGINT/SIGTERM, or with --until-done until all N ranks have joined and left (or a
 * verdict is out and no rank is left, or the ranks that came left and no other came for a fault
 * timeout); the exit code is 1 if a rank failed or aborted (the verdict is printed) or ranks
 * never came (a warning says how many), else 0.
 * Not here: persistence or replication of the store (a restarted store starts empty). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "comm/store.h"
#include "comm/wire.h"
#include "core/core.h"

#define STORE_HINT "dtrain store --world N [--port P] [--bind ADDR] [--fault-timeout MS] [--until-done]"

static int store_int(const char *s, long lo, long hi, int *out) {
  char *end;
  errno = 0;
  long v = s ? strtol(s, &end, 10) : 0;
  if (!s || errno || end == s || *end || v < lo || v > hi)
    return -1;
  *out = (int)v;
  return 0;
}

int dt_cli_store(int argc, char **argv) {
  int world = 0, port = 0, fault_ms = 0, until_done = 0;
  const char *bind = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--world") || !strcmp(a, "-n")) {
      if (store_int(v, 1, 1 << 20, &world))
        return dt_cli_usage_error("store", STORE_HINT, "%s needs a number of ranks in 1..%d, got '%s'", a, 1 << 20,
                                  v ? v : "");
      i++;
    } else if (!strcmp(a, "--port")) {
      if (store_int(v, 0, 65535, &port))
        return dt_cli_usage_error("store", STORE_HINT, "--port needs 0..65535, got '%s'", v ? v : "");
      i++;
    } else if (!strcmp(a, "--fault-timeout")) {
      if (store_int(v, 1, 24 * 3600 * 1000, &fault_ms))
        return dt_cli_usage_error("store", STORE_HINT, "--fault-timeout needs milliseconds >= 1, got '%s'", v ? v : "");
      i++;
    } else if (!strcmp(a, "--bind")) {
      if (!v)
        return dt_cli_usage_error("store", STORE_HINT, "--bind needs an address");
      bind = v;
      i++;
    } else if (!strcmp(a, "--until-done")) {
      until_done = 1;
    } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      printf("usage: %s\n", STORE_HINT);
      return 0;
    } else {
      return dt_cli_usage_error("store", STORE_HINT, "unknown argument '%s'", a);
    }
  }
  if (!world)
    return dt_cli_usage_error("store", STORE_HINT, "--world N is required (the number of ranks to watch)");
  if (!fault_ms) {
    int64_t v;
    if (dt__env_int("DTRAIN_FAULT_TIMEOUT_MS", 10000, &v) != DT_OK || v < 1 || v > INT32_MAX)
      return dt_cli_usage_error("store", STORE_HINT, "DTRAIN_FAULT_TIMEOUT_MS must be a positive number of ms");
    fault_ms = (int)v;
  }
  uint8_t secret[256];
  size_t secret_len;
  if (dt__secret_load(NULL, secret, sizeof secret, &secret_len) != DT_OK)
    return dt_cli_fail("store", "job secret");

  /* Signals are taken synchronously, so the server thread never sees them. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL);

  dt__store_server *s;
  int bound;
  dt_status st = dt__store_server_start(bind, port, secret, secret_len, world, fault_ms, &s, &bound);
  explicit_bzero(secret, sizeof secret);
  if (st == DT_ERR_INVALID) /* the address given: a bad flag, not a runtime failure */
    return dt_cli_usage_error("store", "--bind takes an address of this host, e.g. 0.0.0.0",
                              "bad value '%s' for --bind: %s", bind ? bind : "", dt_last_error());
  if (st)
    return dt_cli_fail("store", "cannot start the store on %s:%d", bind ? bind : "*", port);
  printf("listening on %s:%d\n", bind ? bind : "0.0.0.0", bound);
  if (fflush(stdout) != 0 || ferror(stdout)) { /* scripts read the port from that line: no use going on */
    dt_cli_stdout_failed(errno ? errno : EIO);
    dt__store_server_stop(s);
    return 1;
  }

  int seen = 0, live = 0, signo = 0, missing = 0;
  int64_t idle_since = 0; /* when the last live rank left while some never came */
  char verdict[DT_STORE_MSG_MAX];
  for (;;) {
    struct timespec ts = {.tv_sec = 0, .tv_nsec = 100 * 1000000L};
    int sig = sigtimedwait(&set, NULL, &ts);
    if (sig > 0) {
      signo = sig;
      break;
    }
    dt_status vst = dt__store_server_status(s, &seen, &live, verdict, sizeof verdict);
    if (until_done && live == 0 && (seen >= world || vst != DT_OK))
      break;
    /* The ranks that came are done, and for a fault timeout nobody else came: a job smaller
     * than --world (ranks of another world size are refused with a verdict, above). */
    idle_since = until_done && seen > 0 && live == 0 ? (idle_since ? idle_since : dt_now_ns()) : 0;
    if (idle_since && dt_now_ns() - idle_since >= (int64_t)fault_ms * 1000000LL) {
      missing = world - seen;
      break;
    }
  }
  /* A last look: the server may have ruled while we were waking up. */
  dt_status vst = dt__store_server_status(s, &seen, &live, verdict, sizeof verdict);
  dt__store_server_stop(s);
  if (vst != DT_OK) {
    fprintf(stderr, "dtrain store: job failed: %s\n", verdict);
    return 1;
  }
  if (signo)
    fprintf(stderr, "dtrain store: stopped by signal %d with %d of %d rank(s) live\n", signo, live, world);
  if (missing) {
    fprintf(stderr, "dtrain store: warning: %d of %d rank(s) joined and left, and %d never came within %d ms; "
            "was the job started with fewer ranks than --world %d?\n", seen, world, missing, fault_ms, world);
    return 1;
  }
  return 0;
}
