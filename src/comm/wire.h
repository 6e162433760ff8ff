/* comm/wire.h - framing and authentication shared by every socket dtrain opens (store and tcp
 * transport). Every message starts with a dt__frame header whose magic, version and length are
 * checked before anything is allocated or read further. A connection proves the job secret by
 * a mutual challenge-response (HMAC-SHA256 over both sides' nonces) before any other frame is
 * read; the secret itself never crosses the wire and is never logged. */
#ifndef DT_COMM_WIRE_H
#define DT_COMM_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "core/core.h"

#define DT_WIRE_MAGIC 0x4E525444u /* "DTRN" little-endian */
#define DT_WIRE_VERSION 1

/* Frame header, 16 bytes, little-endian on the wire. `type` meanings belong to the protocol
 * using the socket (store ops, transport data, handshake); `len` counts the payload bytes that
 * follow. Receivers reject a frame whose magic/version differ or whose len exceeds what that
 * type may carry. */
typedef struct dt__frame {
  uint32_t magic;
  uint16_t version;
  uint16_t type;
  uint64_t len;
} dt__frame;

/* Role of a connection in the handshake: which service the client wants. */
enum { DT_ROLE_STORE = 1, DT_ROLE_PEER = 2 };

/* Blocking full read/write on a socket with a deadline (poll + nonblocking I/O, EINTR-safe).
 * A closed connection gives DT_ERR_PEER, the deadline DT_ERR_TIMEOUT; `what` goes into the
 * message ("store", "rank 3"). */
dt_status dt__sock_write_all(int fd, const void *buf, size_t n, int64_t deadline, const char *what);
dt_status dt__sock_read_all(int fd, void *buf, size_t n, int64_t deadline, const char *what);
/* Writes header + payload (len bytes). */
dt_status dt__frame_send(int fd, uint16_t type, const void *payload, uint64_t len, int64_t deadline, const char *what);
/* Reads and validates a header: magic, version, and len <= max_len. */
dt_status dt__frame_recv_hdr(int fd, dt__frame *f, uint64_t max_len, int64_t deadline, const char *what);

/* Handshake. Both return DT_ERR_AUTH when the other side cannot prove the secret (the detail
 * names the peer address), DT_ERR_PROTOCOL on bytes that are not dtrain's. `id` is an opaque
 * 32-bit value the client announces (its rank) and the server learns (*client_id). */
dt_status dt__auth_client(int fd, const uint8_t *secret, size_t secret_len, uint16_t role, uint32_t id, int64_t deadline);
dt_status dt__auth_server(int fd, const uint8_t *secret, size_t secret_len, uint16_t role, uint32_t *client_id, int64_t deadline);

/* "1.2.3.4:5678" for a connected socket's peer (for logs of refused connections). */
void dt__sock_peer_name(int fd, char *buf, size_t n);
/* Sets TCP_NODELAY, close-on-exec, and (if bufsize > 0) SO_SNDBUF/SO_RCVBUF. */
void dt__sock_tune(int fd, int bufsize);
/* Connect to host:port with retries until the deadline (the server may not be up yet). */
dt_status dt__sock_connect(const char *host, int port, int64_t deadline, int *fd_out);
/* Listen on addr:port (port 0 = ephemeral; addr NULL = all interfaces); returns fd and port. */
dt_status dt__sock_listen(const char *addr, int port, int *fd_out, int *port_out);

/* Job secret: from cfg_secret if non-NULL, else DTRAIN_JOB_SECRET, else the file named by
 * DTRAIN_JOB_SECRET_FILE (trailing newline stripped). Unset means the empty secret and a
 * one-time warning. */
dt_status dt__secret_load(const char *cfg_secret, uint8_t *buf, size_t cap, size_t *len);

#endif
