/* fuzz_wire.c - libFuzzer target for the wire protocol's parsers: frame header validation,
 * the server's check of a client's AUTH message, and the client side of the handshake reading
 * whatever a (possibly hostile) server sends. No input may crash, leak, allocate from a claimed
 * length, or authenticate without the secret. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/wire.h"

static const uint8_t fz_secret[] = "fuzz-secret";

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  setenv("DTRAIN_LOG", "error", 1);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size >= DT_WIRE_HDR_LEN) {
    dt__frame f;
    if (dt__frame_decode(data, &f, 1u << 20, "fuzz") == DT_OK && f.len > (1u << 20))
      __builtin_trap();
  }
  if (size >= DT_AUTH_LEN) {
    uint8_t nonce[32] = {1, 2, 3}, ok[DT_WIRE_HDR_LEN + DT_AUTH_OK_LEN];
    uint32_t id;
    /* Without the secret the MAC cannot match (2^-256): success means a broken check. */
    if (dt__auth_check(fz_secret, sizeof fz_secret - 1, DT_ROLE_STORE, nonce, data, "fuzz", &id, ok) == DT_OK)
      __builtin_trap();
  }
  /* The client reading a hostile server's bytes (then EOF). */
  int sv[2];
  if (size > 60000 || socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
    return 0;
  size_t off = 0;
  while (off < size) {
    ssize_t w = write(sv[0], data + off, size - off);
    if (w <= 0)
      break;
    off += (size_t)w;
  }
  shutdown(sv[0], SHUT_WR);
  dt_status st = dt__auth_client(sv[1], fz_secret, sizeof fz_secret - 1, DT_ROLE_STORE, 7, dt__deadline_after_ms(1000));
  if (st == DT_OK)
    __builtin_trap(); /* a server that does not know the secret was believed */
  close(sv[0]);
  close(sv[1]);
  return 0;
}
