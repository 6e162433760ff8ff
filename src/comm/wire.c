/* wire.c - sockets, framing and the job-secret handshake shared by the store and the tcp
 * transport. Every read and write is bounded by a deadline; every header is validated before
 * its length is trusted; the secret is mixed into HMACs and never sent or logged.
 * Not here: what the frame types mean after the handshake (store.c, the transports). */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "comm/wire.h"
#include "core/sha256.h"

#define SECRET_WAIT_MS 10000 /* a job secret read from a pipe: how long its writer may take */

/* Domain separation for the MACs: a client's proof can never be replayed as a server's. */
static const char auth_label[] = "dtrain-auth-v1";


/* ---- sockets ---- */

dt_status dt__sock_write_all(int fd, const void *buf, size_t n, int64_t deadline, const char *what) {
  const uint8_t *p = buf;
  size_t done = 0;
  while (done < n) {
    ssize_t w = send(fd, p + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      done += (size_t)w;
      continue;
    }
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      if (errno == EPIPE || errno == ECONNRESET)
        return dt_set_error(DT_ERR_PEER, "%s: connection closed while sending (%zu of %zu bytes sent)", what, done, n);
      return dt__errno(DT_ERR_SYSTEM, "%s: send", what);
    }
    struct pollfd pfd = {.fd = fd, .events = POLLOUT};
    int ms = dt__ms_left(deadline);
    if (ms == 0)
      return dt_set_error(DT_ERR_TIMEOUT, "%s: deadline exceeded while sending (%zu of %zu bytes sent)", what, done, n);
    int r = poll(&pfd, 1, ms);
    if (r < 0 && errno != EINTR)
      return dt__errno(DT_ERR_SYSTEM, "%s: poll", what);
  }
  return DT_OK;
}

dt_status dt__sock_read_all(int fd, void *buf, size_t n, int64_t deadline, const char *what) {
  uint8_t *p = buf;
  size_t done = 0;
  while (done < n) {
    ssize_t r = recv(fd, p + done, n - done, MSG_DONTWAIT);
    if (r > 0) {
      done += (size_t)r;
      continue;
    }
    if (r == 0)
      return dt_set_error(DT_ERR_PEER, "%s: connection closed (%zu of %zu bytes received)", what, done, n);
    if (errno == EINTR)
      continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      if (errno == ECONNRESET || errno == ETIMEDOUT || errno == EHOSTUNREACH || errno == ENETUNREACH)
        return dt__errno(DT_ERR_PEER, "%s: connection lost (%zu of %zu bytes received)", what, done, n);
      return dt__errno(DT_ERR_SYSTEM, "%s: recv", what);
    }
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int ms = dt__ms_left(deadline);
    if (ms == 0)
      return dt_set_error(DT_ERR_TIMEOUT, "%s: deadline exceeded while receiving (%zu of %zu bytes received)", what, done, n);
    int pr = poll(&pfd, 1, ms);
    if (pr < 0 && errno != EINTR)
      return dt__errno(DT_ERR_SYSTEM, "%s: poll", what);
  }
  return DT_OK;
}

void dt__sock_peer_name(int fd, char *buf, size_t n) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (getpeername(fd, (struct sockaddr *)&ss, &len) == 0) {
    if (ss.ss_family == AF_INET) {
      struct sockaddr_in *a = (struct sockaddr_in *)&ss;
      inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
      port = ntohs(a->sin_port);
    } else if (ss.ss_family == AF_INET6) {
      struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
      inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
      port = ntohs(a->sin6_port);
    } else if (ss.ss_family == AF_UNIX) {
      snprintf(buf, n, "unix socket");
      return;
    }
  }
  if (ss.ss_family == AF_INET6)
    snprintf(buf, n, "[%s]:%d", host, port);
  else
    snprintf(buf, n, "%s:%d", host, port);
}

void dt__sock_tune(int fd, int bufsize) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* fails harmlessly on AF_UNIX */
  fcntl(fd, F_SETFD, FD_CLOEXEC);
  if (bufsize > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bufsize, sizeof bufsize);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bufsize, sizeof bufsize);
  }
}

static dt_status wire_resolve(const char *host, int port, int passive, struct addrinfo **res) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
  if (passive)
    hints.ai_flags = AI_PASSIVE;
  char ports[16];
  snprintf(ports, sizeof ports, "%d", port);
  int rc = getaddrinfo(host, ports, &hints, res);
  if (rc != 0)
    return dt_set_error(DT_ERR_INVALID, "cannot resolve host '%s': %s", host ? host : "*", gai_strerror(rc));
  return DT_OK;
}

/* One nonblocking connect attempt to one address. DT_ERR_PEER: refused. */
static dt_status wire_connect_addr(const struct addrinfo *ai, const char *host, int port, int64_t deadline, int *fd_out) {
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return dt__errno(DT_ERR_SYSTEM, "socket for %s:%d", host, port);
  if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
    goto ok;
  if (errno != EINPROGRESS) {
    int e = errno;
    close(fd);
    errno = e;
    return dt__errno(e == ECONNREFUSED ? DT_ERR_PEER : DT_ERR_SYSTEM, "connect to %s:%d", host, port);
  }
  for (;;) {
    struct pollfd pfd = {.fd = fd, .events = POLLOUT};
    int ms = dt__ms_left(deadline);
    if (ms == 0) {
      close(fd);
      return dt_set_error(DT_ERR_TIMEOUT, "connect to %s:%d: deadline exceeded", host, port);
    }
    int r = poll(&pfd, 1, ms);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      int e = errno;
      close(fd);
      errno = e;
      return dt__errno(DT_ERR_SYSTEM, "connect to %s:%d: poll", host, port);
    }
    if (r == 0)
      continue;
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err) {
      close(fd);
      errno = err;
      return dt__errno(err == ECONNREFUSED ? DT_ERR_PEER : DT_ERR_SYSTEM, "connect to %s:%d", host, port);
    }
    break;
  }
ok:;
  /* Connecting to a port of this host that nobody listens on can succeed with itself: the
   * kernel may pick that very port as the ephemeral source, and a simultaneous open follows.
   * That happens while a store restarts on its port (dt_comm_destroy then dt_comm_create), and
   * the socket would then wait for its own greeting until the deadline and keep the port from
   * the server. It is a refusal: close and let the caller retry. */
  struct sockaddr_storage me, them;
  socklen_t ml = sizeof me, tl = sizeof them;
  if (getsockname(fd, (struct sockaddr *)&me, &ml) == 0 && getpeername(fd, (struct sockaddr *)&them, &tl) == 0 &&
      ml == tl && memcmp(&me, &them, ml) == 0) {
    close(fd);
    return dt_set_error(DT_ERR_PEER, "connect to %s:%d: connected to itself (nobody listens there)", host, port);
  }
  dt__sock_tune(fd, 0);
  *fd_out = fd;
  return DT_OK;
}

dt_status dt__sock_connect_once(const char *host, int port, int64_t deadline, int *fd_out) {
  *fd_out = -1;
  struct addrinfo *res;
  DT_CHECK(wire_resolve(host, port, 0, &res));
  dt_status st = DT_ERR_SYSTEM;
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    st = wire_connect_addr(ai, host, port, deadline, fd_out);
    if (st == DT_OK || st == DT_ERR_TIMEOUT)
      break;
  }
  freeaddrinfo(res);
  return st;
}

dt_status dt__sock_connect(const char *host, int port, int64_t deadline, int *fd_out) {
  *fd_out = -1;
  if (port < 1 || port > 65535)
    return dt_set_error(DT_ERR_INVALID, "connect to %s:%d: port out of range 1..65535", host, port);
  int64_t backoff_ns = 10 * 1000000LL;
  for (;;) {
    dt_status st = dt__sock_connect_once(host, port, deadline, fd_out);
    if (st == DT_OK || st == DT_ERR_INVALID)
      return st;
    if (dt__expired(deadline))
      return dt__error_prefix(DT_ERR_TIMEOUT, "gave up connecting until the deadline");
    /* Refused or unreachable: the server may still be starting. Back off up to 200 ms. */
    int64_t left = (int64_t)dt__ms_left(deadline) * 1000000LL;
    dt__sleep_ns(DT_MIN(backoff_ns, left));
    backoff_ns = DT_MIN(backoff_ns * 2, 200 * 1000000LL);
  }
}

dt_status dt__sock_listen(const char *addr, int port, int *fd_out, int *port_out) {
  *fd_out = -1;
  if (port < 0 || port > 65535)
    return dt_set_error(DT_ERR_INVALID, "listen on port %d: out of range 0..65535", port);
  struct addrinfo *res;
  DT_CHECK(wire_resolve(addr, port, 1, &res));
  dt_status st = DT_ERR_SYSTEM;
  int err = 0; /* errno of the last failure, left in errno on return */
  /* With addr NULL getaddrinfo lists the IPv4 wildcard first on Linux; take the first that binds. */
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      err = errno;
      st = dt__errno(DT_ERR_SYSTEM, "socket");
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
      err = errno;
      st = dt__errno(DT_ERR_SYSTEM, "listen on %s:%d", addr ? addr : "*", port);
      close(fd);
      continue;
    }
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &len);
    *port_out = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    *fd_out = fd;
    st = DT_OK;
    break;
  }
  freeaddrinfo(res);
  if (st != DT_OK)
    errno = err;
  return st;
}

/* ---- framing ---- */

void dt__frame_encode(uint8_t hdr[DT_WIRE_HDR_LEN], uint16_t type, uint64_t len) {
  dt__put32(hdr, DT_WIRE_MAGIC);
  dt__put16(hdr + 4, DT_WIRE_VERSION);
  dt__put16(hdr + 6, type);
  dt__put64(hdr + 8, len);
}

dt_status dt__frame_decode(const uint8_t hdr[DT_WIRE_HDR_LEN], dt__frame *f, uint64_t max_len, const char *what) {
  f->magic = dt__get32(hdr);
  f->version = dt__get16(hdr + 4);
  f->type = dt__get16(hdr + 6);
  f->len = dt__get64(hdr + 8);
  if (f->magic != DT_WIRE_MAGIC)
    return dt_set_error(DT_ERR_PROTOCOL, "%s: bad frame magic 0x%08x (expected 0x%08x): not a dtrain peer", what,
                        f->magic, DT_WIRE_MAGIC);
  if (f->version != DT_WIRE_VERSION)
    return dt_set_error(DT_ERR_PROTOCOL, "%s: wire protocol version %u, this build speaks %u", what, f->version,
                        DT_WIRE_VERSION);
  if (f->len > max_len)
    return dt_set_error(DT_ERR_PROTOCOL, "%s: frame type 0x%04x claims %llu payload bytes, limit is %llu", what,
                        f->type, (unsigned long long)f->len, (unsigned long long)max_len);
  return DT_OK;
}

dt_status dt__frame_send(int fd, uint16_t type, const void *payload, uint64_t len, int64_t deadline, const char *what) {
  uint8_t hdr[DT_WIRE_HDR_LEN];
  dt__frame_encode(hdr, type, len);
  if (len && len <= 4096) {
    /* One send for small frames: fewer packets with TCP_NODELAY. */
    uint8_t buf[DT_WIRE_HDR_LEN + 4096];
    memcpy(buf, hdr, sizeof hdr);
    memcpy(buf + sizeof hdr, payload, len);
    return dt__sock_write_all(fd, buf, sizeof hdr + len, deadline, what);
  }
  DT_CHECK(dt__sock_write_all(fd, hdr, sizeof hdr, deadline, what));
  if (len)
    DT_CHECK(dt__sock_write_all(fd, payload, len, deadline, what));
  return DT_OK;
}

dt_status dt__frame_recv_hdr(int fd, dt__frame *f, uint64_t max_len, int64_t deadline, const char *what) {
  uint8_t hdr[DT_WIRE_HDR_LEN];
  DT_CHECK(dt__sock_read_all(fd, hdr, sizeof hdr, deadline, what));
  return dt__frame_decode(hdr, f, max_len, what);
}

/* ---- handshake ---- */

/* mac = HMAC(secret, label | dir | role | id | first nonce | second nonce). The client proves
 * with (dir 'C', server nonce, client nonce), the server with ('S', client nonce, server nonce). */
static void auth_mac(const uint8_t *secret, size_t secret_len, char dir, uint16_t role, uint32_t id,
                     const uint8_t first[32], const uint8_t second[32], uint8_t out[32]) {
  uint8_t msg[sizeof auth_label - 1 + 1 + 2 + 4 + 64];
  size_t o = 0;
  memcpy(msg, auth_label, sizeof auth_label - 1);
  o += sizeof auth_label - 1;
  msg[o++] = (uint8_t)dir;
  dt__put16(msg + o, role);
  o += 2;
  dt__put32(msg + o, id);
  o += 4;
  memcpy(msg + o, first, 32);
  memcpy(msg + o + 32, second, 32);
  o += 64;
  dt__hmac_sha256(secret, secret_len, msg, o, out);
}

dt_status dt__auth_hello(uint16_t role, uint8_t nonce[32], uint8_t frame[DT_WIRE_HDR_LEN + DT_AUTH_HELLO_LEN]) {
  DT_CHECK(dt__random_bytes(nonce, 32));
  dt__frame_encode(frame, DT_FRAME_HELLO, DT_AUTH_HELLO_LEN);
  dt__put16(frame + DT_WIRE_HDR_LEN, role);
  dt__put16(frame + DT_WIRE_HDR_LEN + 2, 0);
  memcpy(frame + DT_WIRE_HDR_LEN + 4, nonce, 32);
  return DT_OK;
}

dt_status dt__auth_check(const uint8_t *secret, size_t secret_len, uint16_t role, const uint8_t server_nonce[32],
                         const uint8_t auth[DT_AUTH_LEN], const char *peer, uint32_t *client_id,
                         uint8_t ok_frame[DT_WIRE_HDR_LEN + DT_AUTH_OK_LEN]) {
  uint16_t their_role = dt__get16(auth);
  uint32_t id = dt__get32(auth + 4);
  const uint8_t *client_nonce = auth + 8, *mac = auth + 40;
  if (their_role != role)
    return dt_set_error(DT_ERR_PROTOCOL, "connection from %s asked for service %u, this socket serves %u", peer,
                        their_role, role);
  uint8_t want[32];
  auth_mac(secret, secret_len, 'C', role, id, server_nonce, client_nonce, want);
  int ok = dt__ct_equal(want, mac, 32);
  explicit_bzero(want, sizeof want);
  if (!ok)
    return dt_set_error(DT_ERR_AUTH, "connection from %s: wrong job secret", peer);
  *client_id = id;
  dt__frame_encode(ok_frame, DT_FRAME_AUTH_OK, DT_AUTH_OK_LEN);
  auth_mac(secret, secret_len, 'S', role, id, client_nonce, server_nonce, ok_frame + DT_WIRE_HDR_LEN);
  return DT_OK;
}

/* Reads one handshake frame of exactly `len` bytes and type `type` (AUTH_FAIL is reported as
 * the server refusing our secret; a close without it as DT_ERR_PEER: dtrain's servers say
 * AUTH_FAIL before closing on a wrong secret, so a bare close is a server going away). */
static dt_status auth_recv(int fd, uint16_t type, uint8_t *buf, size_t len, int64_t deadline, const char *peer) {
  dt__frame f;
  dt_status st = dt__frame_recv_hdr(fd, &f, 4096, deadline, peer);
  if (st == DT_ERR_PEER)
    return dt__error_prefix(DT_ERR_PEER, "handshake with %s: the other side closed the connection "
                                         "(shutting down?)", peer);
  if (st)
    return st;
  if (f.type == DT_FRAME_AUTH_FAIL)
    return dt_set_error(DT_ERR_AUTH, "%s refused our job secret (check DTRAIN_JOB_SECRET / DTRAIN_JOB_SECRET_FILE)",
                        peer);
  if (f.type != type || f.len != len)
    return dt_set_error(DT_ERR_PROTOCOL, "handshake with %s: got frame type 0x%04x with %llu bytes, expected 0x%04x with %zu",
                        peer, f.type, (unsigned long long)f.len, type, len);
  return dt__sock_read_all(fd, buf, len, deadline, peer);
}

dt_status dt__auth_client(int fd, const uint8_t *secret, size_t secret_len, uint16_t role, uint32_t id, int64_t deadline) {
  char peer[80];
  dt__sock_peer_name(fd, peer, sizeof peer);
  uint8_t hello[DT_AUTH_HELLO_LEN];
  DT_CHECK(auth_recv(fd, DT_FRAME_HELLO, hello, sizeof hello, deadline, peer));
  if (dt__get16(hello) != role)
    return dt_set_error(DT_ERR_PROTOCOL, "%s serves service %u, we asked for %u (wrong port?)", peer, dt__get16(hello), role);
  const uint8_t *server_nonce = hello + 4;
  uint8_t msg[DT_WIRE_HDR_LEN + DT_AUTH_LEN];
  uint8_t *auth = msg + DT_WIRE_HDR_LEN;
  dt__frame_encode(msg, DT_FRAME_AUTH, DT_AUTH_LEN);
  dt__put16(auth, role);
  dt__put16(auth + 2, 0);
  dt__put32(auth + 4, id);
  DT_CHECK(dt__random_bytes(auth + 8, 32));
  auth_mac(secret, secret_len, 'C', role, id, server_nonce, auth + 8, auth + 40);
  DT_CHECK(dt__sock_write_all(fd, msg, sizeof msg, deadline, peer));
  uint8_t mac[DT_AUTH_OK_LEN], want[32];
  DT_CHECK(auth_recv(fd, DT_FRAME_AUTH_OK, mac, sizeof mac, deadline, peer));
  auth_mac(secret, secret_len, 'S', role, id, auth + 8, server_nonce, want);
  int ok = dt__ct_equal(want, mac, 32);
  explicit_bzero(want, sizeof want);
  if (!ok)
    return dt_set_error(DT_ERR_AUTH, "%s could not prove the job secret (it is not our job's server)", peer);
  return DT_OK;
}

dt_status dt__auth_server(int fd, const uint8_t *secret, size_t secret_len, uint16_t role, uint32_t *client_id, int64_t deadline) {
  char peer[80];
  dt__sock_peer_name(fd, peer, sizeof peer);
  uint8_t nonce[32], hello[DT_WIRE_HDR_LEN + DT_AUTH_HELLO_LEN];
  DT_CHECK(dt__auth_hello(role, nonce, hello));
  DT_CHECK(dt__sock_write_all(fd, hello, sizeof hello, deadline, peer));
  uint8_t hdr[DT_WIRE_HDR_LEN], auth[DT_AUTH_LEN];
  dt__frame f;
  DT_CHECK(dt__sock_read_all(fd, hdr, sizeof hdr, deadline, peer));
  DT_CHECK(dt__frame_decode(hdr, &f, DT_AUTH_LEN, peer));
  if (f.type != DT_FRAME_AUTH || f.len != DT_AUTH_LEN)
    return dt_set_error(DT_ERR_PROTOCOL, "handshake with %s: got frame type 0x%04x with %llu bytes, expected 0x%04x with %d",
                        peer, f.type, (unsigned long long)f.len, DT_FRAME_AUTH, DT_AUTH_LEN);
  DT_CHECK(dt__sock_read_all(fd, auth, sizeof auth, deadline, peer));
  uint8_t ok[DT_WIRE_HDR_LEN + DT_AUTH_OK_LEN];
  dt_status st = dt__auth_check(secret, secret_len, role, nonce, auth, peer, client_id, ok);
  if (st == DT_ERR_AUTH) {
    uint8_t fail[DT_WIRE_HDR_LEN];
    dt__frame_encode(fail, DT_FRAME_AUTH_FAIL, 0);
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", dt_last_error());
    /* Best effort, short: the stranger may not read. */
    (void)dt__sock_write_all(fd, fail, sizeof fail, DT_MIN(deadline, dt__deadline_after_ms(100)), peer);
    return dt_set_error(st, "%s", keep);
  }
  if (st)
    return st;
  return dt__sock_write_all(fd, ok, sizeof ok, deadline, peer);
}

dt_status dt__handshake_timeout_ms(int *ms) {
  int64_t v;
  DT_CHECK(dt__env_int("DTRAIN_HANDSHAKE_TIMEOUT_MS", 5000, &v));
  if (v < 1 || v > 3600000)
    return dt_set_error(DT_ERR_INVALID, "DTRAIN_HANDSHAKE_TIMEOUT_MS=%lld must be in 1..3600000", (long long)v);
  *ms = (int)v;
  return DT_OK;
}

/* ---- job secret ---- */

static atomic_int secret_warned;

dt_status dt__secret_load(const char *cfg_secret, uint8_t *buf, size_t cap, size_t *len) {
  *len = 0;
  const char *s = cfg_secret ? cfg_secret : dt__env_str("DTRAIN_JOB_SECRET");
  if (s) {
    size_t n = strlen(s);
    if (n > cap)
      return dt_set_error(DT_ERR_INVALID, "job secret is %zu bytes, at most %zu allowed", n, cap);
    memcpy(buf, s, n);
    *len = n;
    return DT_OK;
  }
  const char *path = dt__env_str("DTRAIN_JOB_SECRET_FILE");
  if (!path) {
    if (!atomic_exchange(&secret_warned, 1))
      DT_LOG_WARN("no job secret (set DTRAIN_JOB_SECRET or DTRAIN_JOB_SECRET_FILE): any process that can reach "
                  "this job's ports can join it");
    return DT_OK;
  }
  /* Opened without waiting: a FIFO nobody writes would hold the process here without a word. A
   * pipe whose writer is slow (<(command)) gets SECRET_WAIT_MS to say something. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return dt__errno(DT_ERR_IO, "DTRAIN_JOB_SECRET_FILE=%s: cannot open", path);
  int64_t until = dt__deadline_after_ms(SECRET_WAIT_MS);
  struct stat sb;
  if (fstat(fd, &sb) == 0 && (sb.st_mode & 077) && !atomic_exchange(&secret_warned, 1))
    DT_LOG_WARN("job secret file %s is readable by other users (chmod 600 it)", path);
  size_t n = 0;
  for (;;) {
    uint8_t tmp[512];
    ssize_t r = read(fd, tmp, sizeof tmp);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0 && errno == EAGAIN && !dt__expired(until)) {
      struct pollfd pf = {.fd = fd, .events = POLLIN};
      (void)poll(&pf, 1, DT_MAX(1, dt__ms_left(until)));
      continue;
    }
    if (r < 0 && errno == EAGAIN) {
      close(fd);
      explicit_bzero(buf, cap);
      return dt_set_error(DT_ERR_INVALID, "DTRAIN_JOB_SECRET_FILE=%s: nothing to read after %d s (a pipe whose "
                          "writer is silent?)", path, SECRET_WAIT_MS / 1000);
    }
    if (r < 0) {
      int e = errno;
      close(fd);
      errno = e;
      explicit_bzero(buf, cap);
      return dt__errno(DT_ERR_IO, "DTRAIN_JOB_SECRET_FILE=%s: read", path);
    }
    if (r == 0)
      break;
    if (n + (size_t)r > cap + 2) { /* room for a trailing \r\n beyond cap */
      close(fd);
      explicit_bzero(buf, cap);
      explicit_bzero(tmp, sizeof tmp);
      return dt_set_error(DT_ERR_INVALID, "DTRAIN_JOB_SECRET_FILE=%s: secret longer than %zu bytes", path, cap);
    }
    size_t take = DT_MIN((size_t)r, cap + 2 - n);
    /* Stage through tmp; bytes past cap can only be the newline we strip below. */
    for (size_t i = 0; i < take; i++) {
      if (n + i < cap)
        buf[n + i] = tmp[i];
      else if (tmp[i] != '\n' && tmp[i] != '\r') {
        close(fd);
        explicit_bzero(buf, cap);
        explicit_bzero(tmp, sizeof tmp);
        return dt_set_error(DT_ERR_INVALID, "DTRAIN_JOB_SECRET_FILE=%s: secret longer than %zu bytes", path, cap);
      }
    }
    n += take;
    explicit_bzero(tmp, sizeof tmp);
  }
  close(fd);
  if (n > cap)
    n = cap;
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
    n--;
  if (n == 0)
    return dt_set_error(DT_ERR_INVALID, "DTRAIN_JOB_SECRET_FILE=%s is empty", path);
  *len = n;
  return DT_OK;
}
