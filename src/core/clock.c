/* clock.c - monotonic time and deadlines. */
#include <errno.h>
#include <limits.h>
#include <time.h>

#include "core/core.h"

int64_t dt_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

double dt_wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int64_t dt__deadline_after_ms(int64_t ms) {
  if (ms < 0 || ms > INT64_MAX / 2000000)
    return DT_NO_DEADLINE;
  return dt_now_ns() + ms * 1000000LL;
}

int dt__ms_left(int64_t deadline) {
  if (deadline == DT_NO_DEADLINE)
    return INT32_MAX;
  int64_t left = deadline - dt_now_ns();
  if (left <= 0)
    return 0;
  int64_t ms = (left + 999999) / 1000000;
  return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

bool dt__expired(int64_t deadline) { return deadline != DT_NO_DEADLINE && dt_now_ns() >= deadline; }

void dt__sleep_ns(int64_t ns) {
  struct timespec ts = {.tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}
