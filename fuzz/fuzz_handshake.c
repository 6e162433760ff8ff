/* fuzz_handshake.c - libFuzzer target for the blocking side of the wire protocol (comm/wire.c)
 * that fuzz_wire does not drive: dt__auth_server reading a hostile client (the path the tcp
 * transport's listener takes), and a stream of frames read with dt__frame_recv_hdr +
 * dt__sock_read_all the way a transport reads its peer. The peer is a socketpair whose other
 * end holds the input and is already shut for writing, so every read ends at the input's end
 * (never at a deadline) and one input is one deterministic run.
 * Not here: header decode / auth_check / the client handshake (fuzz_wire.c), store requests
 * (fuzz_store.c, fuzz_store_requests.c).
 *
 * Input: bit 0 of byte 0 picks the mode, the rest is what the peer says.
 *   0  dt__auth_server against a "client" that sends the input
 *   1  a stream of frames: header, then as many body bytes as it claims (<= 4096), repeated */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/wire.h"

static const uint8_t fz_secret[] = "fuzz-secret";
#define FZ_SECRET_LEN (sizeof fz_secret - 1)
#define FZ_MAX_INPUT (48u << 10) /* stays below a unix socket's buffer: writing never blocks */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  setenv("DTRAIN_LOG", "error", 0);
  return 0;
}

/* fds[0] is ours; the peer end has the input and is shut for writing. */
static int fz_peer(const uint8_t *data, size_t size, int fds[2]) {
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
    return -1;
  size_t off = 0;
  while (off < size) {
    ssize_t w = write(fds[1], data + off, size - off);
    if (w <= 0)
      break;
    off += (size_t)w;
  }
  shutdown(fds[1], SHUT_WR);
  return 0;
}

static void fz_frames(int fd) {
  uint8_t *body = malloc(4096);
  if (!body)
    return;
  for (int i = 0; i < 64; i++) {
    dt__frame f;
    if (dt__frame_recv_hdr(fd, &f, 4096, dt__deadline_after_ms(1000), "fuzz") != DT_OK)
      break;
    if (dt__sock_read_all(fd, body, (size_t)f.len, dt__deadline_after_ms(1000), "fuzz") != DT_OK)
      break;
  }
  free(body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > FZ_MAX_INPUT)
    return 0;
  int mode = data[0] & 1;
  data++;
  size--;
  int fds[2];
  if (fz_peer(data, size, fds) != 0)
    return 0;
  /* The deadline is only a backstop: the peer's EOF ends every read. */
  int64_t deadline = dt__deadline_after_ms(2000);
  if (mode == 0) {
    uint32_t id = 0;
    if (dt__auth_server(fds[0], fz_secret, FZ_SECRET_LEN, DT_ROLE_STORE, &id, deadline) == DT_OK)
      __builtin_trap(); /* the server nonce is fresh: recorded bytes cannot pass */
  } else {
    fz_frames(fds[0]);
  }
  close(fds[0]);
  close(fds[1]);
  return 0;
}
