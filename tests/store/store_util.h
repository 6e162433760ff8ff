/* store_util.h - helpers shared by the store tests: a child-process runner that forks before
 * any thread exists (so children never inherit a lock held by a server thread), bounded waits,
 * and a raw authenticated socket for speaking the protocol by hand. */
#ifndef DT_TEST_STORE_UTIL_H
#define DT_TEST_STORE_UTIL_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/store.h"
#include "comm/wire.h"
#include "common/mp.h"

#define SECRET "test-secret-0123456789abcdef"
#define SECRET_LEN (sizeof SECRET - 1)

typedef int (*child_fn)(int port, int idx, void *arg);

/* Children not yet reaped, so a failed assertion (which skips the test's own cleanup) cannot
 * leave one behind; a stopped child would hold ctest's output pipe open forever. */
static pid_t live_children[64];

static inline void track_child(pid_t p, int on) {
  for (int i = 0; i < 64; i++)
    if (on ? live_children[i] == 0 : live_children[i] == p) {
      live_children[i] = on ? p : 0;
      return;
    }
}

/* cmocka teardown: SIGKILL (works on stopped processes too) and reap every leftover child. */
static inline int kill_leftovers(void **state) {
  (void)state;
  for (int i = 0; i < 64; i++)
    if (live_children[i] > 0) {
      kill(live_children[i], SIGKILL);
      waitpid(live_children[i], NULL, 0);
      live_children[i] = 0;
    }
  return 0;
}

/* Forks a child running fn(port, idx, arg); it exits with fn's value (and dies by alarm after
 * alarm_s so nothing outlives the test). */
static inline pid_t spawn_child(child_fn fn, int port, int idx, void *arg, unsigned alarm_s) {
  fflush(NULL);
  pid_t p = fork();
  if (p == 0) {
    alarm(alarm_s);
    int rc = fn(port, idx, arg);
    fflush(NULL);
    _exit(rc);
  }
  if (p > 0)
    track_child(p, 1);
  return p;
}

/* Waits for pid at most timeout_s (then SIGKILLs it); returns its exit code or 128+signal. */
static inline int reap_child(pid_t pid, int timeout_s) {
  for (int i = 0; i < timeout_s * 100; i++) {
    int st;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) {
      track_child(pid, 0);
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    usleep(10000);
  }
  kill(pid, SIGKILL);
  int st;
  waitpid(pid, &st, 0);
  track_child(pid, 0);
  return 128 + SIGKILL;
}

static inline dt_status connect_store(int port, int rank, dt__store **out) {
  return dt__store_connect("127.0.0.1", port, (const uint8_t *)SECRET, SECRET_LEN, rank, dt__deadline_after_ms(10000),
                           out);
}

#endif
