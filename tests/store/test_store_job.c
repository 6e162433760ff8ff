/* test_store_job.c - a real 4-rank job (dt_comm_create, hundreds of allreduces checked
 * element by element, barrier) runs while a hostile process hammers its rendezvous store's port
 * for the whole run: wrong and missing secrets, random bytes, absurd lengths, and held-open
 * silent connections. Every rank must finish with correct results. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>

#include <cmocka.h>

#include "dtrain/comm.h"
#include "store_util.h"

#define RANKS 4
#define ITERS 1000
#define COUNT 1031

static int rank_main(int port, int rank, void *arg) {
  mp_set_env(rank, RANKS, port, (const char *)arg);
  dt_comm *c;
  if (dt_comm_create(NULL, &c) != DT_OK) {
    fprintf(stderr, "rank %d: create: %s\n", rank, dt_last_error());
    return 10;
  }
  float *buf = malloc(COUNT * sizeof *buf);
  int rc = 0;
  for (int it = 0; it < ITERS && !rc; it++) {
    for (int i = 0; i < COUNT; i++)
      buf[i] = (float)(rank + 1) * (float)(i % 7 + it % 5);
    if (dt_comm_allreduce(c, DT_IN_PLACE, buf, COUNT, DT_F32, DT_SUM) != DT_OK) {
      fprintf(stderr, "rank %d: allreduce %d: %s\n", rank, it, dt_last_error());
      rc = 11;
      break;
    }
    /* sum over ranks of (r + 1) = 10; small integers, exact in f32 */
    for (int i = 0; i < COUNT; i++)
      if (buf[i] != 10.0f * (float)(i % 7 + it % 5)) {
        fprintf(stderr, "rank %d: allreduce %d: element %d = %g\n", rank, it, i, buf[i]);
        rc = 12;
        break;
      }
  }
  if (!rc && dt_comm_barrier(c) != DT_OK)
    rc = 13;
  free(buf);
  dt_comm_destroy(c);
  return rc;
}

/* Runs until killed: every kind of stranger, over and over, plus a few held open in silence. */
static int attacker(int port, int idx, void *arg) {
  int nheld = 0; /* held sockets stay open until the process is killed */
  for (unsigned round = 0;; round++) {
    int fd;
    if (dt__sock_connect("127.0.0.1", port, dt__deadline_after_ms(2000), &fd) != DT_OK) {
      usleep(10000);
      continue;
    }
    switch (round % 5) {
    case 0: { /* wrong secret, through the real client */
      close(fd);
      dt__store *st;
      dt__store_connect("127.0.0.1", port, (const uint8_t *)"not-it", 6, 0, dt__deadline_after_ms(2000), &st);
      break;
    }
    case 1: { /* random bytes */
      uint8_t junk[512];
      dt__random_bytes(junk, sizeof junk);
      junk[0] = 'X';
      send(fd, junk, sizeof junk, MSG_NOSIGNAL);
      close(fd);
      break;
    }
    case 2: { /* an absurd length */
      uint8_t h[DT_WIRE_HDR_LEN];
      dt__frame_encode(h, DT_FRAME_AUTH, ~0ull);
      send(fd, h, sizeof h, MSG_NOSIGNAL);
      close(fd);
      break;
    }
    case 3: /* no secret at all */
      close(fd);
      {
        dt__store *st;
        dt__store_connect("127.0.0.1", port, NULL, 0, 1, dt__deadline_after_ms(2000), &st);
      }
      break;
    default: /* silent, held open (slow-loris without the bytes) */
      if (nheld < 8)
        nheld++;
      else
        close(fd);
    }
    usleep(2000);
  }
  return 0;
}

static void job_survives_strangers(const char *transport) {
  setenv("DTRAIN_TRANSPORT", transport, 1);
  int port = mp_free_port();
  char job[64];
  snprintf(job, sizeof job, "stranger-%d", (int)getpid());
  pid_t ranks[RANKS];
  for (int r = 0; r < RANKS; r++)
    ranks[r] = spawn_child(rank_main, port, r, job, 100);
  pid_t bad = spawn_child(attacker, port, 0, NULL, 100);
  for (int r = 0; r < RANKS; r++)
    assert_int_equal(reap_child(ranks[r], 90), 0);
  kill(bad, SIGKILL);
  reap_child(bad, 10);
}

static void test_job_shm(void **unused) { job_survives_strangers("shm"); }
static void test_job_tcp(void **unused) { job_survives_strangers("tcp"); }

int main(void) {
  setenv("DTRAIN_JOB_SECRET", SECRET, 1);
  setenv("DTRAIN_TIMEOUT_MS", "60000", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_job_shm, kill_leftovers),
      cmocka_unit_test_teardown(test_job_tcp, kill_leftovers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
