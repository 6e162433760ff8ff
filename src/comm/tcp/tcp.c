/* tcp.c - the tcp transport: one authenticated TCP connection per pair of ranks, any hosts.
 *
 * Setup: each rank listens on its bind address (DTRAIN_BIND_ADDR / DTRAIN_IFNAME, else the
 * local address it uses to reach the store), publishes "<prefix>tcp/<rank>" = "host port" in
 * the store, connects to every lower rank and accepts every higher one. Each connection proves
 * the job secret (wire.h) before anything else; a stranger that cannot is logged and closed
 * while accepting goes on. Both sides give each handshake DTRAIN_HANDSHAKE_TIMEOUT_MS, so a
 * silent listener or client holds nobody for long. The listening socket closes once every peer
 * arrived.
 *
 * Messages: a 16-byte dt__frame (type DATA, len = 24 + payload) + the 24-byte fingerprint +
 * the payload, written with one sendmsg. The receiver checks magic, version, fingerprint and
 * length before a single payload byte lands in the caller's buffer, and answers a mismatch with
 * a NACK frame carrying its own fingerprint and the rejected one, so the sender reports both
 * sides too. The fingerprint's spare byte carries the message's number on its connection
 * (mod 256), so a message that never arrived is named as soon as a later one takes its place;
 * a peer that goes silent while it says it sent is named through tcp_loss.c. A small message
 * thus costs one sendmsg and (once it is there) one recv on the calling thread.
 *
 * Waiting: a sendrecv retries its nonblocking recv/send for a few tens of microseconds before it
 * sleeps in poll(2) (TCP_SPIN_US below says why; with more ranks than CPUs only small messages).
 *
 * Not here: multiple streams per peer, MSG_ZEROCOPY, and any collective algorithm (comm/coll/
 * builds them from sendrecv). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/tcp/tcp_loss.h"
#include "comm/wire.h"
#include "core/faults.h"

/* Frame types of this protocol (the store's have their own space: each socket speaks one). */
enum { TCP_DATA = 0x101, TCP_NACK = 0x102 };
#define TCP_FP_BYTES 24
#define TCP_HDR_BYTES (16 + TCP_FP_BYTES)
/* Offset in a frame of the fingerprint's spare byte: the message number on its connection. */
#define TCP_MSGNO_AT (16 + 19)
/* Messages up to this size arrive with their header in one recv (saves a system call each). */
#define TCP_SMALL 4096
/* Socket buffer size: large enough to keep a loopback or LAN link busy while the other side
 * of a sendrecv runs; DTRAIN_SOCKET_BUFFER overrides (0 leaves the kernel's autotuning). */
#define TCP_DEFAULT_BUF (4u << 20)
/* Smaller buffers are refused: with 16 KiB (a 32 KiB receive window, half a loopback segment)
 * two ranks exchanging 336 KiB each way stalled for 30-60 s in six runs of nine, the window
 * reopening only through the kernel's zero-window probes (backing off from 200 ms); 32 KiB
 * stalled 0.4 s now and then; from 48 KiB none in six runs (test_transport segments,
 * bench/results/tcp-cut-2026-11-29-xeon.txt). */
#define TCP_MIN_BUF (64u << 10)
/* Connections within this host (tcp_same_host) run Reno whatever the host's default congestion
 * control, and, when every rank has a CPU of its own, with TCP_LOCAL_BUF socket buffers.
 * Loopback neither loses nor queues packets, and with BBR, this Xeon guest's default, a one-way
 * message of 1 MiB or more stalled on BBR's window and pacing: the 2-rank broadcast (one such
 * message) took 287-326 us at 1 MiB and 3.6-4.0 ms at 16 MiB, with Reno 90-104 us and 1.6-1.7
 * ms; 4 ranks 7.4 ms against 15.3 at 16 MiB (one run each); the allreduce and allgather (pieces
 * each way) and latency level (three alternated rounds of `dtrain bench broadcast -n 2 --transport tcp --sizes
 * 256K:16M --iters 40 --warmup 5`, one build switching by an environment variable, 2026-11-29;
 * bench/results/tcp-reno-2026-11-29-xeon.txt). Then with Reno, 1 MiB buffers against 4 MiB
 * (two alternated rounds, `DTRAIN_SOCKET_BUFFER={4M,1M} dtrain bench <coll> -n {2,4} --transport
 * tcp`, bench/results/tcp-sockbuf-2026-11-29-xeon.txt): the 2-rank broadcast 2.1-3x faster
 * from 32 MiB (256 MiB 41-44 ms against 97-105: the sender ran up to 16 MiB ahead, and the
 * receiver's copies met the data out of the caches), level below; the 2-rank allreduce,
 * allgather and reduce_scatter level at 1-256 MiB within the rounds' spread (no size more than
 * 3% slower in both rounds); with 4 ranks on the 2 cores the broadcast
 * 5-30% slower at 4-64 MiB and the allreduce mixed, so oversubscribed ranks keep 4 MiB. Links to
 * other hosts keep the host's congestion control and TCP_DEFAULT_BUF (a longer round trip needs
 * the larger window). */
#define TCP_LOCAL_BUF (1u << 20)
/* Messages that end in a short segment (tcp_cut): on this Xeon guest's loopback (segments of
 * 65,483 bytes), an exchange whose messages end in a segment of a few hundred bytes after full
 * ones ran up to twice as long as it should, most when the ranks had just done other work: a 64
 * KiB payload plus the 40-byte header is one full segment and 93 bytes, 128 KiB two and 146.
 * Cutting such messages so that their last two segments share the remainder (with the chain's
 * piece trimmed to one segment, tree.c), three alternated rounds of both builds, `dtrain bench
 * <coll> -n {2,4} --transport tcp --sizes 4:16M --iters 30 --warmup 4 [--fresh]` (2026-11-29;
 * medians, old time / new): 4 ranks on the 2 cores, fresh, allreduce 1.78 at 128 and 256 KiB,
 * reduce_scatter 1.79 / 2.04, broadcast 2.02 / 1.44; reused, allreduce 1.18 / 1.27 at 256 / 512
 * KiB; 2 ranks fresh, allreduce 1.44 at 256 KiB, allgather and reduce_scatter 1.84 / 1.86 at 512
 * KiB; the rest 0.82-1.39, the spread of the sizes below 64 KiB, where nothing differs. Up to
 * four segments: cutting 8-segment messages too cost the 2-rank broadcast (one message one way)
 * 0.63 at 512 KiB. Not explained (no counters on this guest); rows and commands in
 * bench/results/tcp-cut-2026-11-29-xeon.txt, docs/BENCHMARKS-LOG.md. */
#define TCP_CUT_SEGS 4

/* Waiting: before sleeping in poll(2), a sendrecv whose messages (each way) have at most
 * DTRAIN_TCP_SPIN_MAX bytes retries its nonblocking recv/send for up to DTRAIN_TCP_SPIN_US
 * microseconds (default TCP_SPIN_US) without moving a byte. Why: on the 2-core KVM
 * guest a poll(2) sleep costs a wake-up of 10-20 us per message (halt, IPI, schedule), most of a
 * small message's time. Measured with
 *   dtrain bench allreduce -n {2,4} --transport tcp --sizes 8:4K --iters 1000..2000
 * alternating with Open MPI over TCP (bench/mpi_coll.c, mpirun binds its ranks):
 *   2 ranks, each on its own core: no spin 20-45 us, spin 6.6-8.8 us, Open MPI 7.3-9.8 us;
 *   4 ranks on 2 cores (load ~10): 89-100 us spinning, 92-106 us not, Open MPI 99-101 us.
 * Between tries it pauses the CPU, except with more ranks on the host than CPUs, where it calls
 * sched_yield(2) so that the rank sharing the core runs (from 64 KiB that made 4 ranks on 2
 * cores 10-30% faster than not spinning, docs/BENCHMARKS-LOG.md). Each rank owning its core, the
 * yield was harmful: with another busy program on the core a yield hands it the rest of a time
 * slice, and the data arriving meanwhile wakes nobody (the rank never slept): 2 ranks under two
 * busy loops took 3.9-4.0 ms per call at most sizes up to 64 KiB instead of 4.4-4.8 us
 * (docs/BENCHMARKS-LOG.md, "Small tcp messages on a busy host"). Pausing keeps the core for at most
 * the spin time, then poll(2) sleeps, and the wake-up preempts the busy program at once.
 * How large (DTRAIN_TCP_SPIN_MAX): with more ranks than CPUs, TCP_SPIN_MAX: a 64 KiB allreduce
 * (2 ranks bound to their cores, load ~11) took 51-55 us spinning against 189 us not (Open MPI
 * 49 us), while with 4 ranks on 2 cores spinning made a 1 MiB allreduce about 2x slower (11-19 ms
 * against 7-9.5 ms). Each rank owning its core, every size: a broadcast's receiver otherwise
 * sleeps between the pieces the kernel hands over, and the sender between the acknowledgements.
 * 2 ranks, three alternated rounds of `DTRAIN_TCP_SPIN_MAX={64K,256M} dtrain bench <coll> -n 2
 * --transport tcp --sizes 64K:64M --iters 40 --warmup 5` (2026-11-29, Xeon guest;
 * bench/results/tcp-spin-2026-11-29-xeon.txt): broadcast 23-25 us at 128 KiB against 38-44,
 * 47-49 at 512 KiB against 75-101, 3.3-3.8 ms at 16 MiB against 4.2-4.8 (1 MiB mixed), the
 * allreduce, allgather and reduce_scatter level at every size; `dtrain train` over tcp (mlp and
 * cnn, 2 workers, three alternated pairs) level in samples/s. */
#define TCP_SPIN_US 50
#define TCP_SPIN_MAX (64u << 10)

struct dt_transport {
  dt_comm *c;
  int n, rank;
  int *fd;       /* [n]: connection to each peer, -1 for self */
  bool *nacked;  /* [n]: a NACK or a broken stream: the connection carries no more messages */
  int64_t spin_ns; /* DTRAIN_TCP_SPIN_US in ns: how long a small sendrecv polls before poll(2) */
  size_t spin_max; /* sendrecvs whose messages each have up to this many bytes spin */
  bool yield;      /* oversubscribed: spinning yields the core between tries */
  uint64_t *sent, *arrived; /* [n]: messages sent to / fully received from each peer */
  size_t *seg;              /* [n]: within this host, the connection's segment payload (tcp_cut), else 0 */
  dt__tcp_loss *loss;
  size_t queue; /* bytes every connection's send buffer holds for a peer not reading (tcp_ready);
                 * SIZE_MAX while no connection is up */
};

static void tcp_put(uint8_t *p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t tcp_get(const uint8_t *p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++)
    v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static void tcp_encode(uint8_t *h, uint16_t type, uint64_t payload, const dt__fp *fp) {
  tcp_put(h, DT_WIRE_MAGIC, 4);
  tcp_put(h + 4, DT_WIRE_VERSION, 2);
  tcp_put(h + 6, type, 2);
  tcp_put(h + 8, TCP_FP_BYTES + payload, 8);
  uint8_t *f = h + 16;
  tcp_put(f, fp->seq, 8);
  tcp_put(f + 8, fp->count, 8);
  f[16] = fp->coll;
  f[17] = fp->dtype;
  f[18] = fp->op;
  f[19] = 0; /* the message number goes here (TCP_MSGNO_AT); flags never cross tcp */
  tcp_put(f + 20, (uint32_t)fp->root, 4);
}

static void tcp_decode_fp(const uint8_t *f, dt__fp *fp) {
  fp->seq = tcp_get(f, 8);
  fp->count = tcp_get(f + 8, 8);
  fp->coll = f[16];
  fp->dtype = f[17];
  fp->op = f[18];
  fp->flags = 0;
  fp->root = (int32_t)(uint32_t)tcp_get(f + 20, 4);
}

/* ---- setup ---- */

/* The address to listen on: an explicit address, an interface's IPv4 address, or the local
 * address of the route to the store (found with a connected UDP socket: nothing is sent). */
static dt_status tcp_bind_addr(const dt_comm *c, char *out, size_t n) {
  const char *want = c->env.bind_addr;
  if (want[0]) {
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, want, &a4) == 1 || inet_pton(AF_INET6, want, &a6) == 1) {
      size_t wl = strlen(want);
      if (wl >= n)
        return dt_set_error(DT_ERR_INVALID, "bind address %s is too long", want);
      memcpy(out, want, wl + 1);
      return DT_OK;
    }
    struct ifaddrs *ifs = NULL, *i;
    if (getifaddrs(&ifs) != 0)
      return dt__errno(DT_ERR_SYSTEM, "getifaddrs (looking for interface '%s')", want);
    for (i = ifs; i; i = i->ifa_next)
      if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && strcmp(i->ifa_name, want) == 0) {
        inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, out, (socklen_t)n);
        break;
      }
    freeifaddrs(ifs);
    if (!i)
      return dt_set_error(DT_ERR_INVALID, "bind address '%s' (DTRAIN_BIND_ADDR / DTRAIN_IFNAME) is neither an address nor an interface with an IPv4 address",
                          want);
    return DT_OK;
  }
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM}, *res = NULL;
  char port[16];
  snprintf(port, sizeof port, "%d", c->env.store_port > 0 ? c->env.store_port : 9);
  int rc = getaddrinfo(c->env.store_host, port, &hints, &res);
  if (rc != 0)
    return dt_set_error(DT_ERR_INVALID, "cannot resolve the store host '%s': %s", c->env.store_host, gai_strerror(rc));
  int fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) != 0 || getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
    dt_status st = dt__errno(DT_ERR_SYSTEM, "finding the local address that reaches the store %s", c->env.store_host);
    if (fd >= 0)
      close(fd);
    freeaddrinfo(res);
    return st;
  }
  close(fd);
  freeaddrinfo(res);
  if (ss.ss_family == AF_INET6)
    inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, out, (socklen_t)n);
  else
    inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, out, (socklen_t)n);
  return DT_OK;
}

static void tcp_destroy(dt_transport *t) {
  if (!t)
    return;
  for (int i = 0; t->fd && i < t->n; i++)
    if (t->fd[i] >= 0)
      close(t->fd[i]);
  dt__free(t->fd);
  dt__free(t->nacked);
  dt__free(t->sent);
  dt__free(t->arrived);
  dt__free(t->seg);
  dt__tcp_loss_destroy(t->loss);
  dt__free(t);
}

/* Whether both ends of a connection share an address: a peer on this host (loopback, or the
 * host's own address). */
static bool tcp_same_host(int fd) {
  struct sockaddr_storage a, b;
  socklen_t la = sizeof a, lb = sizeof b;
  if (getsockname(fd, (struct sockaddr *)&a, &la) != 0 || getpeername(fd, (struct sockaddr *)&b, &lb) != 0 ||
      a.ss_family != b.ss_family)
    return false;
  if (a.ss_family == AF_INET)
    return ((struct sockaddr_in *)&a)->sin_addr.s_addr == ((struct sockaddr_in *)&b)->sin_addr.s_addr;
  return a.ss_family == AF_INET6 && !memcmp(&((struct sockaddr_in6 *)&a)->sin6_addr,
                                            &((struct sockaddr_in6 *)&b)->sin6_addr, sizeof(struct in6_addr));
}

static dt_status tcp_ready(dt_transport *t, int peer, int fd) {
  const bool local = tcp_same_host(fd);
  const uint64_t def = local && !t->yield ? TCP_LOCAL_BUF : TCP_DEFAULT_BUF;
  uint64_t buf = def;
  dt_status st = dt__env_size("DTRAIN_SOCKET_BUFFER", def, &buf);
  if (st != DT_OK)
    return st;
  if (buf && buf < TCP_MIN_BUF)
    return dt_set_error(DT_ERR_INVALID, "DTRAIN_SOCKET_BUFFER=%llu: below the %u bytes a connection needs (a window "
                        "under one segment stalls it: loopback segments carry 65483 bytes), or 0 for the kernel's "
                        "autotuning", (unsigned long long)buf, TCP_MIN_BUF);
  dt__sock_tune(fd, buf > (64u << 20) ? (64 << 20) : (int)buf);
  if (local && setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, "reno", 4) != 0) /* TCP_LOCAL_BUF says why */
    DT_LOG_DEBUG("rank %d: Reno for the connection to rank %d: %s (the host's congestion control stays)", t->rank,
                 peer, strerror(errno));
  /* What this connection queues for a peer that is not reading: the kernel reports twice the
   * size asked for (it counts its bookkeeping too); half of that is the payload it is sure to
   * hold, however the bytes are cut into packets. */
  int sb = 0;
  socklen_t sl = sizeof sb;
  size_t q = getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sb, &sl) == 0 && sb > 0 ? (size_t)sb / 2 : 0;
  t->queue = DT_MIN(t->queue, q);
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0)
    return dt__errno(DT_ERR_SYSTEM, "fcntl O_NONBLOCK");
  t->fd[peer] = fd;
  struct tcp_info ti;
  socklen_t tl = sizeof ti;
  t->seg[peer] = local && getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) == 0 ? ti.tcpi_advmss : 0;
  return DT_OK;
}

/* Accepts until every higher rank arrived; strangers are logged and closed. */
/* A connection accepted on the transport port that has not yet proved the secret: its
 * handshake runs inside tcp_accept_all's poll loop, next to the others', so strangers that stay
 * silent cannot hold up a rank behind them (each is dropped at its own deadline). */
typedef struct tcp_pend {
  int fd;
  char who[80];
  uint8_t nonce[32];
  uint8_t in[DT_WIRE_HDR_LEN + DT_AUTH_LEN]; /* the AUTH frame, header and body */
  size_t got;
  int64_t deadline;
} tcp_pend;
#define TCP_PEND_MAX 64 /* handshakes at once; more wait in the listen backlog */

static void tcp_refuse(dt_transport *t, tcp_pend *p) {
  DT_LOG_WARN("rank %d: refused a tcp transport connection from %s: %s", t->rank, p->who, dt_last_error());
  close(p->fd);
  p->fd = -1;
}

/* Reads what p's peer sent; on the whole AUTH frame checks it and answers. 1 with *id set: a
 * rank proved the secret; 0: not yet; -1: refuse it (the error says why). */
static int tcp_pend_step(dt_transport *t, tcp_pend *p, uint32_t *id) {
  dt_comm *c = t->c;
  ssize_t k = recv(p->fd, p->in + p->got, sizeof p->in - p->got, 0);
  if (k == 0) {
    dt_set_error(DT_ERR_PROTOCOL, "%s closed the connection during the handshake", p->who);
    return -1;
  }
  if (k < 0) {
    if (errno == EAGAIN || errno == EINTR)
      return 0;
    dt__errno(DT_ERR_PEER, "handshake with %s", p->who);
    return -1;
  }
  size_t before = p->got;
  p->got += (size_t)k;
  if (before < DT_WIRE_HDR_LEN && p->got >= DT_WIRE_HDR_LEN) { /* the header: judged before the body */
    dt__frame f;
    if (dt__frame_decode(p->in, &f, DT_AUTH_LEN, p->who) != DT_OK)
      return -1;
    if (f.type != DT_FRAME_AUTH || f.len != DT_AUTH_LEN) {
      dt_set_error(DT_ERR_PROTOCOL, "handshake with %s: got frame type 0x%04x with %llu bytes, expected 0x%04x with %d",
                   p->who, f.type, (unsigned long long)f.len, DT_FRAME_AUTH, DT_AUTH_LEN);
      return -1;
    }
  }
  if (p->got < sizeof p->in)
    return 0;
  uint8_t ok[DT_WIRE_HDR_LEN + DT_AUTH_OK_LEN];
  dt_status st = dt__auth_check(c->env.secret, c->env.secret_len, DT_ROLE_PEER, p->nonce, p->in + DT_WIRE_HDR_LEN,
                                p->who, id, ok);
  if (st == DT_ERR_AUTH) { /* say so, briefly: the stranger may not read */
    uint8_t fail[DT_WIRE_HDR_LEN];
    dt__frame_encode(fail, DT_FRAME_AUTH_FAIL, 0);
    (void)!send(p->fd, fail, sizeof fail, MSG_NOSIGNAL | MSG_DONTWAIT);
    return -1;
  }
  if (st != DT_OK)
    return -1;
  if (*id <= (uint32_t)t->rank || *id >= (uint32_t)t->n || t->fd[*id] >= 0) {
    dt_set_error(DT_ERR_PROTOCOL, "announced rank %u, expected one of %d..%d not yet connected", *id, t->rank + 1,
                 t->n - 1);
    return -1;
  }
  return dt__sock_write_all(p->fd, ok, sizeof ok, DT_MIN(p->deadline, dt__deadline_after_ms(1000)), p->who) == DT_OK
             ? 1
             : -1;
}

static dt_status tcp_accept_all(dt_transport *t, int lfd, int64_t deadline) {
  dt_comm *c = t->c;
  int need = t->n - 1 - t->rank, hs_ms = 5000;
  if (dt__handshake_timeout_ms(&hs_ms) != DT_OK)
    return DT_ERR_INVALID;
  tcp_pend pend[TCP_PEND_MAX];
  int np = 0;
  dt_status st = DT_OK;
  while (need > 0 && st == DT_OK) {
    int64_t now = dt_now_ns(), wake = deadline;
    for (int i = 0; i < np;) { /* drop the handshakes past their time (the last moves into the gap) */
      if (now >= pend[i].deadline) {
        dt_set_error(DT_ERR_TIMEOUT, "%s did not complete the handshake within %d ms (DTRAIN_HANDSHAKE_TIMEOUT_MS)",
                     pend[i].who, hs_ms);
        tcp_refuse(t, &pend[i]);
        pend[i] = pend[--np];
        continue;
      }
      wake = DT_MIN(wake, pend[i].deadline);
      i++;
    }
    int ms = dt__ms_left(wake);
    if (dt__ms_left(deadline) == 0) {
      char miss[256] = "";
      size_t u = 0;
      for (int r = t->rank + 1; r < t->n; r++)
        if (t->fd[r] < 0 && u + 16 < sizeof miss)
          u += (size_t)snprintf(miss + u, sizeof miss - u, "%s%d", u ? ", " : "", r);
      st = dt_set_error(DT_ERR_TIMEOUT, "rank %d: rank(s) %s never connected to the tcp transport", t->rank, miss);
      break;
    }
    struct pollfd p[TCP_PEND_MAX + 2];
    int nfd = 0, ia = -1;
    for (int i = 0; i < np; i++)
      p[nfd++] = (struct pollfd){.fd = pend[i].fd, .events = POLLIN};
    int il = np < TCP_PEND_MAX ? nfd : -1; /* full: the backlog waits */
    if (il >= 0)
      p[nfd++] = (struct pollfd){.fd = lfd, .events = POLLIN};
    if (dt__comm_abort_fd(c) >= 0) {
      ia = nfd;
      p[nfd++] = (struct pollfd){.fd = dt__comm_abort_fd(c), .events = POLLIN};
    }
    int rc = poll(p, (nfds_t)nfd, ms);
    if (rc < 0 && errno != EINTR) {
      st = dt__errno(DT_ERR_SYSTEM, "poll on the tcp listening socket");
      break;
    }
    if (rc <= 0)
      continue;
    if (ia >= 0 && (p[ia].revents & POLLIN) && dt__comm_aborted(c)) {
      st = dt__comm_abort_status(c);
      break;
    }
    for (int i = np - 1; i >= 0 && st == DT_OK; i--) { /* from the end: a finished one is replaced by the last */
      if (!p[i].revents)
        continue;
      uint32_t id = 0;
      int hs = tcp_pend_step(t, &pend[i], &id);
      if (hs == 0)
        continue;
      if (hs > 0) {
        int fd = pend[i].fd;
        pend[i] = pend[--np];
        if ((st = tcp_ready(t, (int)id, fd)) != DT_OK)
          close(fd);
        else
          need--;
        continue;
      }
      tcp_refuse(t, &pend[i]);
      pend[i] = pend[--np];
    }
    if (st != DT_OK || il < 0 || !(p[il].revents & POLLIN))
      continue;
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED)
        continue;
      st = dt__errno(DT_ERR_SYSTEM, "accept on the tcp transport");
      break;
    }
    tcp_pend *q = &pend[np];
    q->fd = fd;
    q->got = 0;
    q->deadline = DT_MIN(deadline, dt__deadline_after_ms(hs_ms));
    dt__sock_peer_name(fd, q->who, sizeof q->who);
    uint8_t hello[DT_WIRE_HDR_LEN + DT_AUTH_HELLO_LEN];
    /* a fresh connection's send buffer always takes the hello whole */
    if (dt__auth_hello(DT_ROLE_PEER, q->nonce, hello) != DT_OK) {
      tcp_refuse(t, q);
      continue;
    }
    if (send(fd, hello, sizeof hello, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof hello) {
      dt__errno(DT_ERR_PEER, "sending the handshake's hello to %s", q->who);
      tcp_refuse(t, q);
      continue;
    }
    np++;
  }
  for (int i = 0; i < np; i++) /* the job formed (or failed): the rest are strangers */
    close(pend[i].fd);
  return st;
}

static dt_status tcp_create(dt_comm *c, dt_transport **out) {
  *out = NULL;
  dt_transport *t = dt__calloc(sizeof *t);
  if (!t)
    return DT_ERR_NOMEM;
  t->c = c;
  t->n = c->size;
  t->rank = c->rank;
  t->fd = dt__alloc(sizeof(int) * (size_t)t->n);
  t->nacked = dt__calloc(sizeof(bool) * (size_t)t->n);
  t->sent = dt__calloc(sizeof(uint64_t) * (size_t)t->n);
  t->arrived = dt__calloc(sizeof(uint64_t) * (size_t)t->n);
  t->seg = dt__calloc(sizeof(size_t) * (size_t)t->n);
  if (!t->fd || !t->nacked || !t->sent || !t->arrived || !t->seg || dt__tcp_loss_create(c, &t->loss) != DT_OK) {
    tcp_destroy(t);
    return DT_ERR_NOMEM;
  }
  for (int i = 0; i < t->n; i++)
    t->fd[i] = -1;
  /* more ranks on this host than CPUs: the tries yield the core to the rank sharing it, and only
   * small messages spin (TCP_SPIN_MAX above) */
  int ncpu = c->host_cpus > 0 ? c->host_cpus : dt__comm_cpus();
  t->yield = ncpu > 0 && DT_MAX(c->local_size, c->env.local_size) > ncpu;
  int64_t spin_us = TCP_SPIN_US;
  uint64_t spin_max = t->yield ? TCP_SPIN_MAX : UINT64_MAX;
  dt_status st = dt__env_int("DTRAIN_TCP_SPIN_US", TCP_SPIN_US, &spin_us);
  if (st == DT_OK && (spin_us < 0 || spin_us > 1000000))
    st = dt_set_error(DT_ERR_INVALID, "DTRAIN_TCP_SPIN_US=%lld must be in 0..1000000", (long long)spin_us);
  if (st == DT_OK)
    st = dt__env_size("DTRAIN_TCP_SPIN_MAX", spin_max, &spin_max);
  if (st != DT_OK) {
    tcp_destroy(t);
    return st;
  }
  t->spin_ns = spin_us * 1000;
  t->spin_max = (size_t)DT_MIN(spin_max, (uint64_t)SIZE_MAX);
  t->queue = SIZE_MAX; /* until tcp_ready lowers it to the smallest connection's */
  if (t->n == 1) {
    *out = t;
    return DT_OK;
  }
  int64_t deadline = dt__comm_deadline(c);
  int lfd = -1, port = 0, hs_ms = 5000;
  char addr[INET6_ADDRSTRLEN + 16], key[128], val[INET6_ADDRSTRLEN + 32];
  st = dt__handshake_timeout_ms(&hs_ms);
  if (st == DT_OK)
    st = tcp_bind_addr(c, addr, sizeof addr);
  if (st != DT_OK)
    goto fail;
  if (t->rank < t->n - 1) {
    st = dt__sock_listen(addr, 0, &lfd, &port);
    if (st != DT_OK) {
      dt__error_prefix(st, "listening on %s", addr);
      goto fail;
    }
  }
  snprintf(val, sizeof val, "%s %d", addr, port);
  dt__comm_key(c, key, sizeof key, "tcp/%d", t->rank);
  DT_CHECK_GOTO(dt__store_set(c->store, key, val, strlen(val), deadline), st, fail);
  for (int r = 0; r < t->rank; r++) {
    char peer[sizeof val], host[sizeof val];
    size_t len = 0;
    int pport = 0, fd = -1;
    dt__comm_key(c, key, sizeof key, "tcp/%d", r);
    st = dt__store_wait(c->store, key, peer, sizeof peer - 1, &len, deadline);
    if (st != DT_OK) {
      dt__error_prefix(st, "waiting for the tcp address of rank %d", r);
      goto fail;
    }
    peer[len] = '\0';
    if (sscanf(peer, "%63s %d", host, &pport) != 2) {
      st = dt_set_error(DT_ERR_PROTOCOL, "rank %d published a malformed tcp address '%s'", r, peer);
      goto fail;
    }
    /* Connect in short attempts so a failure elsewhere in the job ends the wait early. Each
     * handshake gets the handshake timeout, as the store client's does, not the whole deadline:
     * something that accepts on rank r's port but never says HELLO (a stranger that took the
     * port, or rank r stopped: the kernel accepts for it) would otherwise hold this rank until
     * the deadline, deaf to the verdict on rank r. Rank r says HELLO only once it has connected
     * to the ranks below it, so a silent attempt is closed and made again (rank r drops the
     * closed one with a warning) until the deadline or a verdict. */
    int silent = 0;
    for (;;) {
      int64_t slice = dt__deadline_after_ms(250);
      st = dt__sock_connect(host, pport, slice < deadline ? slice : deadline, &fd);
      if (st == DT_OK) {
        int64_t hs = dt__deadline_after_ms(hs_ms);
        st = dt__auth_client(fd, c->env.secret, c->env.secret_len, DT_ROLE_PEER, (uint32_t)t->rank,
                             hs < deadline ? hs : deadline);
        silent = st == DT_ERR_TIMEOUT ? silent + 1 : 0;
        if (!silent)
          break;
        close(fd);
        fd = -1;
      } else {
        silent = 0;
      }
      if (dt__expired(deadline))
        break;
      if (dt__comm_aborted(c)) {
        st = dt__comm_abort_status(c);
        silent = 0;
        break;
      }
    }
    if (st != DT_OK && silent)
      st = dt_set_error(st, "something there accepted the connection but did not answer the dtrain handshake within "
                        "%d ms (%d attempt%s; a stranger on rank %d's port, or rank %d stopped?)", hs_ms, silent,
                        silent == 1 ? "" : "s", r, r);
    if (st == DT_OK)
      st = tcp_ready(t, r, fd);
    if (st != DT_OK) {
      if (fd >= 0)
        close(fd);
      char detail[1024]; /* e.g. the verdict of an abort, which names this rank again */
      snprintf(detail, sizeof detail, "%s", dt__comm_skip_self(c, dt_last_error()));
      dt_set_error(st, "connecting to rank %d at %s:%d: %s", r, host, pport, detail);
      goto fail;
    }
  }
  if (lfd >= 0) {
    st = tcp_accept_all(t, lfd, deadline);
    close(lfd);
    lfd = -1;
    if (st != DT_OK)
      goto fail;
  }
  *out = t;
  return DT_OK;
fail:
  if (lfd >= 0)
    close(lfd);
  tcp_destroy(t);
  return st;
}

/* ---- messages ---- */

static dt_status tcp_closed(dt_transport *t, int peer) {
  char pn[64];
  dt__comm_peer_name(t->c, peer, pn, sizeof pn);
  return dt_set_error(DT_ERR_PEER, "%s closed the connection (it exited or was killed)", pn);
}

/* A NACK header h (already read, with `have` bytes after it) from peer: its fingerprint, then
 * the echo of the message of ours it rejected. */
static dt_status tcp_nacked(dt_transport *t, int peer, const uint8_t *h, size_t have, int64_t deadline) {
  t->nacked[peer] = true;
  dt__fp theirs, mine;
  uint8_t echo[TCP_FP_BYTES];
  char pn[64];
  dt__comm_peer_name(t->c, peer, pn, sizeof pn);
  tcp_decode_fp(h + 16, &theirs);
  if (tcp_get(h + 8, 8) != 2 * TCP_FP_BYTES)
    return dt_set_error(DT_ERR_PROTOCOL, "rank %d: malformed NACK from %s", t->rank, pn);
  /* `have` bytes of the echo may already sit after the header in h. */
  have = DT_MIN(have, sizeof echo);
  memcpy(echo, h + TCP_HDR_BYTES, have);
  int64_t dl = dt__deadline_after_ms(1000);
  if (have < sizeof echo)
    DT_CHECK(dt__sock_read_all(t->fd[peer], echo + have, sizeof echo - have, dl < deadline ? dl : deadline, pn));
  tcp_decode_fp(echo, &mine);
  return dt__comm_mismatch(t->c, peer, &theirs, &mine);
}

/* A received header: DATA with our fingerprint and length, else a mismatch naming both. A NACK
 * means the peer rejected a message of ours: its fingerprint follows. */
static dt_status tcp_check_hdr(dt_transport *t, int src, const uint8_t *h, size_t have, size_t rn, const dt__fp *fp,
                               int64_t deadline) {
  uint32_t magic = (uint32_t)tcp_get(h, 4);
  uint16_t ver = (uint16_t)tcp_get(h + 4, 2), type = (uint16_t)tcp_get(h + 6, 2);
  uint64_t len = tcp_get(h + 8, 8);
  char pn[64];
  dt__comm_peer_name(t->c, src, pn, sizeof pn);
  if (magic != DT_WIRE_MAGIC || ver != DT_WIRE_VERSION || (type != TCP_DATA && type != TCP_NACK))
    return dt_set_error(DT_ERR_PROTOCOL, "rank %d: bad frame from %s (magic 0x%08x version %u type 0x%x)", t->rank, pn,
                        magic, ver, type);
  dt__fp theirs;
  tcp_decode_fp(h + 16, &theirs);
  if (type == TCP_NACK)
    return tcp_nacked(t, src, h, have, deadline);
  if (h[TCP_MSGNO_AT] != (uint8_t)t->arrived[src]) {
    t->nacked[src] = true;
    char what[160];
    dt__fp_format(fp, what, sizeof what);
    /* PROTOCOL, not PEER: the peer is alive, so there is no root cause elsewhere to wait for. */
    return dt_set_error(DT_ERR_PROTOCOL,
                        "rank %d: %s failed: its message #%llu (mod 256) to rank %d never arrived, #%u came in its "
                        "place during %s - its link loses data",
                        t->rank, pn, (unsigned long long)t->arrived[src] % 256, t->rank, h[TCP_MSGNO_AT], what);
  }
  if (!dt__fp_equal(&theirs, fp)) {
    t->nacked[src] = true;
    /* NACK = our fingerprint + theirs echoed, so the sender can name both calls. */
    uint8_t nack[TCP_HDR_BYTES + TCP_FP_BYTES];
    tcp_encode(nack, TCP_NACK, TCP_FP_BYTES, fp);
    memcpy(nack + TCP_HDR_BYTES, h + 16, TCP_FP_BYTES);
    (void)!send(t->fd[src], nack, sizeof nack, MSG_NOSIGNAL | MSG_DONTWAIT);
    return dt__comm_mismatch(t->c, src, &theirs, fp);
  }
  if (len != TCP_FP_BYTES + rn) {
    t->nacked[src] = true;
    char what[160];
    dt__fp_format(fp, what, sizeof what);
    return dt_set_error(DT_ERR_MISMATCH, "rank %d: %s sent %llu bytes for %s, rank %d expected %zu", t->rank, pn,
                        (unsigned long long)(len - TCP_FP_BYTES), what, t->rank, rn);
  }
  (void)deadline;
  return DT_OK;
}

/* Called each time a sendrecv is about to poll: after half the fault timeout blocked, publishes
 * this rank's sent counts; after a whole fault timeout without a byte from src, asks whether src
 * says it sent what never came (tcp_loss.c). Shortens *ms to the next of those moments. */
typedef struct tcp_wait {
  int64_t blocked, last_rx, next_check; /* 0 until the call first polls */
  bool r_moved;                         /* bytes arrived since the last poll */
} tcp_wait;

static dt_status tcp_stall(dt_transport *t, int src, const dt__fp *fp, tcp_wait *w, int *ms) {
  int64_t now = dt_now_ns(), fault_ns = (int64_t)t->c->env.fault_timeout_ms * 1000000LL, half = fault_ns / 2;
  if (!w->blocked)
    w->blocked = w->last_rx = now;
  if (w->r_moved)
    w->last_rx = now;
  w->r_moved = false;
  int64_t next = now - w->blocked >= half ? now + half : w->blocked + half;
  if (now - w->blocked >= half)
    dt__tcp_loss_publish(t->loss, t->sent);
  if (src >= 0) {
    int64_t due = DT_MAX(w->last_rx + fault_ns, w->next_check);
    if (now >= due) {
      DT_CHECK(dt__tcp_loss_check(t->loss, src, t->arrived[src], now - w->last_rx, fp));
      due = w->next_check = now + half; /* no evidence yet: ask again in half a fault timeout */
    }
    next = DT_MIN(next, due);
  }
  int64_t wait_ms = (next - dt_now_ns()) / 1000000 + 1;
  *ms = (int)DT_MAX(1, DT_MIN((int64_t)*ms, wait_ms));
  return DT_OK;
}

/* Where to cut a message of `total` bytes (header included) to rank dst: the offset at which
 * the first part ends, 0 for no cut. Within this host a message of one to four full segments
 * and a short remainder (under a quarter of a segment) goes out in two sendmsg calls, the first
 * with MSG_EOR, so that its last two segments share the remainder instead of ending in a short
 * one (TCP_CUT_SEGS says why). A kernel that predates MSG_EOR for TCP ignores the flag: the
 * message then merely takes two calls. */
static size_t tcp_cut(const dt_transport *t, int dst, size_t total) {
  size_t seg = t->seg[dst], tail = seg && total > seg && total <= TCP_CUT_SEGS * seg + seg / 4 ? total % seg : 0;
  return tail && tail < seg / 4 ? total - (seg + tail) / 2 : 0;
}

static dt_status tcp_sendrecv(dt_transport *t, int dst, const void *sbuf, size_t sn, int src, void *rbuf, size_t rn,
                              const dt__fp *fp, int64_t deadline) {
  dt_comm *c = t->c;
  if ((dst >= 0 && (dst >= t->n || dst == t->rank)) || (src >= 0 && (src >= t->n || src == t->rank)))
    return dt_set_error(DT_ERR_INVALID, "rank %d: tcp sendrecv with dst %d src %d of %d ranks", t->rank, dst, src, t->n);
  if (dt__comm_aborted(c))
    return dt__comm_abort_status(c);
  for (int p = 0; p < 2; p++) {
    int peer = p ? src : dst;
    if (peer >= 0 && t->nacked[peer]) {
      char pn[64];
      dt__comm_peer_name(c, peer, pn, sizeof pn);
      return dt_set_error(DT_ERR_STATE, "rank %d: the connection to %s broke after an earlier mismatch", t->rank, pn);
    }
  }
  const int sfd = dst >= 0 ? t->fd[dst] : -1, rfd = src >= 0 ? t->fd[src] : -1, afd = dt__comm_abort_fd(c);
  /* Small messages are read with their header in one recv into rhdr, and copied to the
   * caller's buffer only after the header was checked. */
  uint8_t shdr[TCP_HDR_BYTES], rhdr[TCP_HDR_BYTES + TCP_SMALL];
  const bool small = rn <= TCP_SMALL;
  size_t s_total = dst >= 0 ? TCP_HDR_BYTES + sn : 0, s_done = 0, s_cut = dst >= 0 ? tcp_cut(t, dst, s_total) : 0;
  size_t r_hdr = 0, r_done = 0;
  bool r_need = src >= 0, watch_nack = dst >= 0 && dst != src;
  /* spin_until: 0 until the first try that moved nothing, then the end of the spin phase */
  const bool spin = t->spin_ns > 0 && (dst < 0 || sn <= t->spin_max) && (src < 0 || rn <= t->spin_max);
  int64_t spin_until = 0;
  bool abort_seen = false; /* the abort fd was readable at the last poll */
  tcp_wait w = {0};
  if (dst >= 0) {
    tcp_encode(shdr, TCP_DATA, sn, fp);
    shdr[TCP_MSGNO_AT] = (uint8_t)t->sent[dst]++;
    dt__fault_send(); /* a "delay" fault of DTRAIN_FAULTS holds this message back */
    if (dt__fault_drop())
      s_done = s_total; /* a "drop" fault: as if it had gone out */
  }
  for (;;) {
    bool moved = false;
    if (s_done < s_total) {
      struct iovec iov[2];
      int k = 0;
      if (s_done < TCP_HDR_BYTES) {
        iov[k++] = (struct iovec){shdr + s_done, TCP_HDR_BYTES - s_done};
        if (sn)
          iov[k++] = (struct iovec){(void *)sbuf, sn};
      } else {
        iov[k++] = (struct iovec){(uint8_t *)sbuf + (s_done - TCP_HDR_BYTES), s_total - s_done};
      }
      int eor = 0;
      if (s_done < s_cut) { /* the first part of a cut message (tcp_cut) */
        size_t room = s_cut - s_done;
        if (iov[0].iov_len >= room)
          k = 1;
        iov[k - 1].iov_len = k == 1 ? room : room - iov[0].iov_len;
        eor = MSG_EOR;
      }
      struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)k};
      ssize_t w = sendmsg(sfd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT | eor);
      if (w > 0) {
        s_done += (size_t)w;
        moved = true;
      } else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        if (errno == EPIPE || errno == ECONNRESET)
          return tcp_closed(t, dst);
        return dt__errno(DT_ERR_SYSTEM, "rank %d: send to rank %d", t->rank, dst);
      }
    }
    if (r_need) {
      ssize_t g;
      if (r_hdr < TCP_HDR_BYTES) {
        g = recv(rfd, rhdr + r_hdr, TCP_HDR_BYTES + (small ? rn : 0) - r_hdr, MSG_DONTWAIT);
        if (g > 0) {
          r_hdr += (size_t)g;
          moved = true;
          if (r_hdr >= TCP_HDR_BYTES) {
            size_t extra = r_hdr - TCP_HDR_BYTES;
            DT_CHECK(tcp_check_hdr(t, src, rhdr, extra, rn, fp, deadline));
            if (extra)
              memcpy(rbuf, rhdr + TCP_HDR_BYTES, extra);
            r_done = extra;
            r_hdr = TCP_HDR_BYTES;
          }
        }
      } else if (r_done < rn) {
        g = recv(rfd, (uint8_t *)rbuf + r_done, rn - r_done, MSG_DONTWAIT);
        if (g > 0) {
          r_done += (size_t)g;
          moved = true;
        }
      } else {
        g = 1;
      }
      if (g == 0)
        return tcp_closed(t, src);
      if (g < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        if (errno == ECONNRESET)
          return tcp_closed(t, src);
        return dt__errno(DT_ERR_SYSTEM, "rank %d: recv from rank %d", t->rank, src);
      }
      if (g > 0)
        w.r_moved = true;
      if (r_hdr == TCP_HDR_BYTES && r_done == rn) {
        r_need = false;
        t->arrived[src]++;
      }
    }
    if (s_done == s_total && !r_need)
      return DT_OK;
    if (moved)
      continue;
    if (spin) {
      int64_t now = dt_now_ns();
      if (!spin_until)
        spin_until = now + t->spin_ns;
      if (now < spin_until) {
        if (t->yield) /* hand the core to the rank sharing it */
          sched_yield();
        else
          for (int i = 0; i < 64; i++) /* a few us per try */
            dt__cpu_relax();
        continue;
      }
    }

    struct pollfd p[4];
    int np = 0, is = -1, ir = -1, ia = -1;
    if (s_done < s_total) {
      is = np;
      p[np++] = (struct pollfd){.fd = sfd, .events = POLLOUT | (watch_nack ? POLLIN : 0)};
    }
    if (r_need) {
      if (is >= 0 && sfd == rfd) {
        p[is].events |= POLLIN;
        ir = is;
      } else {
        ir = np;
        p[np++] = (struct pollfd){.fd = rfd, .events = POLLIN};
      }
    }
    if (afd >= 0) {
      ia = np;
      p[np++] = (struct pollfd){.fd = afd, .events = POLLIN};
    }
    int ms = dt__ms_left(deadline);
    if (ms > 0)
      DT_CHECK(tcp_stall(t, r_need ? src : -1, fp, &w, &ms));
    if (ms == 0) {
      int waited = r_need ? src : dst;
      char pn[64];
      dt__comm_peer_name(c, waited, pn, sizeof pn);
      return dt_set_error(DT_ERR_TIMEOUT, "deadline (%d ms) passed waiting for %s (sent %zu of %zu bytes, received %zu of %zu)",
                          c->timeout_ms, pn, s_done, s_total, r_hdr + r_done,
                          src >= 0 ? TCP_HDR_BYTES + rn : 0);
    }
    int rc = poll(p, (nfds_t)np, ms);
    if (rc < 0 && errno != EINTR)
      return dt__errno(DT_ERR_SYSTEM, "rank %d: poll in tcp sendrecv", t->rank);
    if (rc <= 0)
      continue;
    /* The job failed (a later call of the others, maybe): this call still completes if what it
     * waits for has arrived too (a peer sent its last part and left before the abort), so one
     * more round of progress first; the next poll that shows the abort ends it. */
    if (ia >= 0 && (p[ia].revents & POLLIN) && dt__comm_aborted(c)) {
      if (abort_seen)
        return dt__comm_abort_status(c);
      abort_seen = true;
      continue;
    }
    /* Input on the send-only socket: a NACK for an earlier message of ours is fatal; data for a
     * later call is left queued and no longer watched. */
    if (is >= 0 && is != ir && (p[is].revents & (POLLIN | POLLHUP | POLLERR))) {
      uint8_t h[TCP_HDR_BYTES];
      ssize_t g = recv(sfd, h, sizeof h, MSG_PEEK | MSG_DONTWAIT);
      if (g == (ssize_t)sizeof h && tcp_get(h + 6, 2) == TCP_NACK) {
        (void)!recv(sfd, h, sizeof h, MSG_DONTWAIT);
        return tcp_nacked(t, dst, h, 0, deadline);
      }
      if (g == 0)
        return tcp_closed(t, dst);
      if (g > 0)
        watch_nack = false;
    }
  }
}

/* Each message carries a header (TCP_HDR_BYTES) and is counted with room to spare. */
static size_t tcp_queue_msgs(dt_transport *t, size_t bytes) {
  return t->queue == SIZE_MAX ? 0 : t->queue / (bytes + 2 * TCP_HDR_BYTES);
}

const dt_transport_ops dt__transport_tcp = {
    .name = "tcp",
    .create = tcp_create,
    .sendrecv = tcp_sendrecv,
    .queue_msgs = tcp_queue_msgs,
    .destroy = tcp_destroy,
};
