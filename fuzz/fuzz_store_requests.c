/* fuzz_store_requests.c - libFuzzer target for the rendezvous store server's request parser
 * (comm/store.c) reached through well-formed frames: after a valid handshake, every request type
 * with hostile keys, lengths and bodies. fuzz_store sends raw bytes, which rarely get past the
 * frame header; here the harness builds the frames, so the fuzzer spends its time in the
 * request bodies. Each input gets a fresh server (so a
 * verdict or a key set by one input cannot change the next one's path) on 127.0.0.1 port 0,
 * one connection that sends the input and half-closes, and a reader that drains the answers
 * until the server closes (bounded by a deadline). A crash, sanitizer report or leak in the
 * server thread ends the run like one in this thread.
 * Not here: the wire helpers on their own (fuzz_wire.c, fuzz_handshake.c).
 *
 * Input: byte 0 = flags, the rest = what the connection sends.
 *   bit 0   authenticate first with the right secret (else the bytes are the handshake)
 *   bit 1-2 the id announced in the handshake (0..2 are ranks of the 3-rank job, 3 is not)
 *   bit 3   framed: the rest is records [type u8][len u16 little-endian][len bytes], each sent
 *           as a well-formed frame of type 0x5301 + type % 12 (reaches the request parser
 *           far more often than raw bytes); else the rest is sent raw. */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/store.h"
#include "comm/wire.h"

static const uint8_t fz_secret[] = "fuzz-secret";
#define FZ_SECRET_LEN (sizeof fz_secret - 1)
#define FZ_WORLD 3
#define FZ_OUT_MAX (256u << 10)

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  setenv("DTRAIN_LOG", "error", 0);
  /* A stranger that stops mid-handshake is cut after this long; keeps the backstop short. */
  setenv("DTRAIN_HANDSHAKE_TIMEOUT_MS", "200", 0);
  return 0;
}

/* Builds what the connection sends. Returns its length (0 for nothing). */
static size_t fz_build(const uint8_t *data, size_t size, bool framed, uint8_t *out) {
  if (!framed) {
    size_t n = DT_MIN(size, (size_t)FZ_OUT_MAX);
    memcpy(out, data, n);
    return n;
  }
  size_t o = 0, i = 0;
  while (i + 3 <= size) {
    uint16_t type = (uint16_t)(0x5301 + data[i] % 12);
    size_t len = (size_t)data[i + 1] | (size_t)data[i + 2] << 8;
    i += 3;
    len = DT_MIN(len, size - i);
    if (o + DT_WIRE_HDR_LEN + len > FZ_OUT_MAX)
      break;
    dt__frame_encode(out + o, type, len);
    memcpy(out + o + DT_WIRE_HDR_LEN, data + i, len);
    o += DT_WIRE_HDR_LEN + len;
    i += len;
  }
  return o;
}

/* Sends buf, half-closes, and reads until the server closes or the deadline passes. */
static void fz_converse(int fd, const uint8_t *buf, size_t n, int64_t deadline) {
  size_t off = 0;
  bool shut = false;
  uint8_t sink[4096];
  while (!dt__expired(deadline)) {
    if (off == n && !shut) {
      shutdown(fd, SHUT_WR);
      shut = true;
    }
    struct pollfd p = {.fd = fd, .events = POLLIN | (shut ? 0 : POLLOUT)};
    if (poll(&p, 1, DT_MAX(dt__ms_left(deadline), 1)) <= 0)
      continue;
    if (p.revents & POLLIN) {
      ssize_t r = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
        return;
    } else if (p.revents & (POLLHUP | POLLERR)) {
      return;
    }
    if ((p.revents & POLLOUT) && off < n) {
      ssize_t w = send(fd, buf + off, n - off, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (w > 0)
        off += (size_t)w;
      else if (w < 0 && errno != EAGAIN && errno != EINTR)
        return;
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  uint8_t flags = data[0];
  static uint8_t out[FZ_OUT_MAX];
  size_t n = fz_build(data + 1, size - 1, flags & 8, out);
  dt__store_server *srv;
  int port;
  if (dt__store_server_start("127.0.0.1", 0, fz_secret, FZ_SECRET_LEN, FZ_WORLD, 60000, &srv, &port) != DT_OK)
    abort(); /* the harness itself is broken: say so loudly */
  int fd = -1;
  int64_t deadline = dt__deadline_after_ms(3000);
  if (dt__sock_connect("127.0.0.1", port, deadline, &fd) != DT_OK)
    abort();
  uint32_t id = (flags >> 1) & 3;
  if (flags & 1) {
    if (dt__auth_client(fd, fz_secret, FZ_SECRET_LEN, DT_ROLE_STORE, id, deadline) != DT_OK)
      abort();
  }
  fz_converse(fd, out, n, deadline);
  close(fd);
  dt__store_server_stop(srv);
  return 0;
}
