/* tests/common/mp.h - runs a test body in N real processes that form a dtrain job over the
 * real rendezvous store (rank 0 hosts it on a free loopback port), with a bounded wait.
 * Header-only so any test can include it. */
#ifndef DT_TEST_MP_H
#define DT_TEST_MP_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* A TCP port on 127.0.0.1 that stays reserved while *fd is open: bound with SO_REUSEADDR and
 * never listening, so the store (which binds with SO_REUSEADDR and listens) can take it, while
 * nobody else can: neither another test's bind nor the ephemeral port of another test's
 * connect(), which a closed probe would leave open to in a parallel ctest run between
 * the probe and the store's bind (the store's ranks would then wait for it until their deadline). */
static inline int mp_hold_port(int *fd) {
  int one = 1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  *fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (*fd < 0 || setsockopt(*fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) || bind(*fd, (struct sockaddr *)&a, sizeof a) ||
      getsockname(*fd, (struct sockaddr *)&a, &len)) {
    perror("mp_hold_port");
    exit(99);
  }
  return ntohs(a.sin_port);
}

/* A free TCP port on 127.0.0.1, reserved as mp_hold_port does until the next call (the socket
 * stays open in this process, close-on-exec). */
static inline int mp_free_port(void) {
  static int hold = -1;
  if (hold >= 0)
    close(hold);
  return mp_hold_port(&hold);
}

/* Sets the DTRAIN_* job environment of `rank` in this process. */
static inline void mp_set_env(int rank, int size, int port, const char *job) {
  char b[64];
  snprintf(b, sizeof b, "%d", rank);
  setenv("DTRAIN_RANK", b, 1);
  setenv("DTRAIN_LOCAL_RANK", b, 1);
  snprintf(b, sizeof b, "%d", size);
  setenv("DTRAIN_WORLD_SIZE", b, 1);
  setenv("DTRAIN_LOCAL_WORLD_SIZE", b, 1);
  setenv("DTRAIN_MASTER_ADDR", "127.0.0.1", 1);
  snprintf(b, sizeof b, "%d", port);
  setenv("DTRAIN_MASTER_PORT", b, 1);
  setenv("DTRAIN_JOB_ID", job, 1);
  if (!getenv("DTRAIN_JOB_SECRET"))
    setenv("DTRAIN_JOB_SECRET", "test-secret-0123456789abcdef", 1);
}

typedef int (*mp_body)(int rank, int size, void *arg);

/* Forks `size` processes running body(rank, size, arg) in a fresh job; each exits with body's
 * return value. Waits at most timeout_s, then SIGKILLs what is left. exit_codes (if non-NULL,
 * [size]) receives each rank's exit code, or 128+signal. Returns the number of ranks that did
 * not exit 0. */
static inline int mp_run_codes(int size, mp_body body, void *arg, int timeout_s, int *exit_codes) {
  static int jobs;
  char job[64];
  snprintf(job, sizeof job, "t%d-%d", (int)getpid(), jobs++);
  int hold;
  int port = mp_hold_port(&hold);
  pid_t pids[256];
  fflush(NULL);
  for (int r = 0; r < size; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      close(hold);
      mp_set_env(r, size, port, job);
      alarm((unsigned)timeout_s + 5);
      int rc = body(r, size, arg);
      fflush(NULL);
      _exit(rc);
    }
  }
  int failures = 0, left = size;
  time_t end = time(NULL) + timeout_s;
  int done[256] = {0};
  while (left > 0) {
    int st;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p > 0) {
      for (int r = 0; r < size; r++)
        if (pids[r] == p && !done[r]) {
          done[r] = 1;
          left--;
          int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
          if (exit_codes)
            exit_codes[r] = code;
          if (code != 0)
            failures++;
        }
      continue;
    }
    if (time(NULL) > end) {
      fprintf(stderr, "mp_run: timeout after %d s, killing %d rank(s)\n", timeout_s, left);
      for (int r = 0; r < size; r++)
        if (!done[r]) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], NULL, 0);
          if (exit_codes)
            exit_codes[r] = 128 + SIGKILL;
          failures++;
        }
      break;
    }
    usleep(2000);
  }
  close(hold);
  return failures;
}

static inline int mp_run(int size, mp_body body, void *arg, int timeout_s) {
  return mp_run_codes(size, body, arg, timeout_s, NULL);
}

#endif
