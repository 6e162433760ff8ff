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

/* How long a server gives a connecting stranger to prove the secret: DTRAIN_HANDSHAKE_TIMEOUT_MS,
 * default 5000 (1..3600000; malformed is DT_ERR_INVALID). A server must bound dt__auth_server
 * by this, not by the job's long timeout, so a silent stranger (slow-loris) cannot hold it. */
dt_status dt__handshake_timeout_ms(int *ms);

/* Handshake. Both return DT_ERR_AUTH when the other side cannot prove the secret (the detail
 * names the peer address), DT_ERR_PROTOCOL on bytes that are not dtrain's. `id` is an opaque
 * 32-bit value the client announces (its rank) and the server learns (*client_id). */
dt_status dt__auth_client(int fd, const uint8_t *secret, size_t secret_len, uint16_t role, uint32_t id, int64_t deadline);
dt_status dt__auth_server(int fd, const uint8_t *secret, size_t secret_len, uint16_t role, uint32_t *client_id, int64_t deadline);
/* The caller logs a refusal once, naming the address, and goes on serving others:
 *   DT_LOG_WARN("refused connection from %s: %s", peer, dt_last_error()) */

/* Building blocks of the handshake for event loops that cannot block (the store server runs
 * it per connection inside poll()). The blocking dt__auth_* above are written with these.
 * Handshake frames have exact lengths; anything else is DT_ERR_PROTOCOL. */
#define DT_WIRE_HDR_LEN 16
enum {
  DT_FRAME_HELLO = 0xA001,     /* server -> client: role u16, reserved u16, server nonce[32] */
  DT_FRAME_AUTH = 0xA002,      /* client -> server: role u16, reserved u16, id u32, client nonce[32], mac[32] */
  DT_FRAME_AUTH_OK = 0xA003,   /* server -> client: mac[32] over the nonces in reverse order */
  DT_FRAME_AUTH_FAIL = 0xA004, /* server -> client, empty: "your secret is wrong", then close */
};
#define DT_AUTH_HELLO_LEN 36
#define DT_AUTH_LEN 72
#define DT_AUTH_OK_LEN 32
/* Encodes / validates a 16-byte header (magic, version, len <= max_len). decode never
 * allocates; `what` names the peer in the error. */
void dt__frame_encode(uint8_t hdr[DT_WIRE_HDR_LEN], uint16_t type, uint64_t len);
dt_status dt__frame_decode(const uint8_t hdr[DT_WIRE_HDR_LEN], dt__frame *f, uint64_t max_len, const char *what);
/* Server: fresh nonce and the whole hello frame (header + payload) to send. */
dt_status dt__auth_hello(uint16_t role, uint8_t nonce[32], uint8_t frame[DT_WIRE_HDR_LEN + DT_AUTH_HELLO_LEN]);
/* Server: checks the client's AUTH payload against the nonce sent in hello. On success fills
 * *client_id and the AUTH_OK frame to send back. DT_ERR_AUTH (wrong secret) or
 * DT_ERR_PROTOCOL (wrong role) with `peer` in the message. Constant-time MAC comparison. */
dt_status dt__auth_check(const uint8_t *secret, size_t secret_len, uint16_t role, const uint8_t server_nonce[32],
                         const uint8_t auth[DT_AUTH_LEN], const char *peer, uint32_t *client_id,
                         uint8_t ok_frame[DT_WIRE_HDR_LEN + DT_AUTH_OK_LEN]);

/* Connects once (no retry) within the deadline. DT_ERR_PEER if the host actively refused
 * (nothing listens: the process there is gone), DT_ERR_TIMEOUT / DT_ERR_SYSTEM otherwise. */
dt_status dt__sock_connect_once(const char *host, int port, int64_t deadline, int *fd_out);

/* "1.2.3.4:5678" for a connected socket's peer (for logs of refused connections). */
void dt__sock_peer_name(int fd, char *buf, size_t n);
/* Sets TCP_NODELAY, close-on-exec, and (if bufsize > 0) SO_SNDBUF/SO_RCVBUF. */
void dt__sock_tune(int fd, int bufsize);
/* Connect to host:port with retries until the deadline (the server may not be up yet). The
 * returned socket is nonblocking (the read/write helpers above poll) and tuned. */
dt_status dt__sock_connect(const char *host, int port, int64_t deadline, int *fd_out);
/* Listen on addr:port (port 0 = ephemeral; addr NULL = all interfaces); returns fd and port.
 * The listening socket is nonblocking and close-on-exec: accept after poll(2). When a socket,
 * bind or listen failed, errno is left as the last of them set it (EADDRINUSE: port taken). */
dt_status dt__sock_listen(const char *addr, int port, int *fd_out, int *port_out);

/* Job secret: from cfg_secret if non-NULL, else DTRAIN_JOB_SECRET, else the file named by
 * DTRAIN_JOB_SECRET_FILE (trailing newline stripped). Unset means the empty secret and a
 * one-time warning. */
dt_status dt__secret_load(const char *cfg_secret, uint8_t *buf, size_t cap, size_t *len);

#endif
