/* fuzz_store.c - libFuzzer target for the rendezvous store server: a real server thread on
 * loopback receives each input on a fresh connection, either raw (the first byte even: a
 * stranger's handshake bytes) or after a correct handshake (first byte odd: the request
 * parser, keys, values, CAS, ADD, WAIT, heartbeats, aborts). The server must never crash,
 * leak, hang, or allocate beyond its frame limits; the server is restarted every 500 inputs so
 * the stored keys stay bounded. */
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/store.h"
#include "comm/wire.h"

static const uint8_t fz_secret[] = "fuzz-secret";
static dt__store_server *fz_srv;
static int fz_port;
static unsigned fz_runs;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  setenv("DTRAIN_LOG", "error", 1);
  setenv("DTRAIN_HANDSHAKE_TIMEOUT_MS", "1000", 1);
  return 0;
}

static void fz_server(void) {
  if (fz_srv && fz_runs++ % 500 != 0)
    return;
  dt__store_server_stop(fz_srv);
  if (dt__store_server_start("127.0.0.1", 0, fz_secret, sizeof fz_secret - 1, 4, 600000, &fz_srv, &fz_port) != DT_OK)
    __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  fz_server();
  int fd;
  int64_t dl = dt__deadline_after_ms(3000);
  if (dt__sock_connect("127.0.0.1", fz_port, dl, &fd) != DT_OK)
    __builtin_trap();
  if ((data[0] & 1) && dt__auth_client(fd, fz_secret, sizeof fz_secret - 1, DT_ROLE_STORE, data[0] >> 1 & 3, dl) != DT_OK)
    __builtin_trap(); /* the right secret must always get in */
  (void)dt__sock_write_all(fd, data + 1, size - 1, dl, "fuzz"); /* the server may hang up early */
  shutdown(fd, SHUT_WR);
  /* Drain answers until the server closes: then it has processed the whole input. */
  char buf[4096];
  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int ms = dt__ms_left(dl);
    if (ms == 0)
      __builtin_trap(); /* the server kept a half-closed connection open: a hang */
    if (poll(&p, 1, ms) <= 0)
      continue;
    ssize_t r = recv(fd, buf, sizeof buf, 0);
    if (r <= 0)
      break;
  }
  close(fd);
  return 0;
}
