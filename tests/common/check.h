/* tests/common/check.h - CHECK(cond, fmt, ...) for multi-process test bodies: on failure writes
 * "rank R: line L: <message>" to stderr in one write(2) (lines from several ranks never mix) and
 * returns 1 from the body. Needs an int `rank` in scope. check_now_s(): monotonic seconds, for
 * the tests that bound how long a failure may take to be reported. */
#ifndef DT_TEST_CHECK_H
#define DT_TEST_CHECK_H

#include <stdio.h>
#include <time.h>
#include <unistd.h>

static inline double check_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define CHECK(cond, ...)                                                            \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      char m_[1600];                                                                \
      int l_ = snprintf(m_, sizeof m_, "rank %d: line %d: ", rank, __LINE__);      \
      l_ += snprintf(m_ + l_, sizeof m_ - (size_t)l_, __VA_ARGS__);                 \
      if (l_ > (int)sizeof m_ - 2)                                                  \
        l_ = (int)sizeof m_ - 2;                                                    \
      m_[l_++] = '\n';                                                              \
      if (write(2, m_, (size_t)l_) < 0) {                                           \
      }                                                                             \
      return 1;                                                                     \
    }                                                                               \
  } while (0)

#endif
