/* tcp_bw.c - loopback TCP bandwidth, the ceilings of the collectives' tcp bounds in
 * bench/compare-peers.
 *
 * Default (single stream; iperf3 -c 127.0.0.1 measures the same thing): one process sends 256 KiB
 * writes over one TCP connection on 127.0.0.1 to a forked child that reads them, for a fixed
 * time; the rate is the bytes the receiver got / the time it took.
 *
 * --exchange: what a rank of a 2-rank allreduce does, and what the single-stream rate does not
 * say on a machine with few cores: both ends of one connection send and receive at the same
 * time. The parent and a forked child each run a sender thread (256 KiB writes for the fixed
 * time, then shutdown of its direction) and read on their main thread until the other side's
 * shutdown; each side times its receiving from the first byte to end of stream. Reported: the
 * rate of each direction, "gbs" = their mean (the per-direction rate an exchange gets), and the
 * total. --poll does the same on one thread per side (nonblocking send and receive, poll(2)
 * when neither moves: how dtrain's tcp transport waits); --buffer B sets SO_SNDBUF/SO_RCVBUF
 * (dtrain's transport asks for 4 MiB). iperf3 --bidir measures something similar, but its one
 * thread per side alternates blocking sends and receives, which understates the exchange.
 *
 * Otherwise it deliberately tunes nothing (no zero-copy, default socket buffers), as a plain
 * socket user gets.
 *
 * Usage: tcp_bw [--seconds S] [--exchange [--poll] [--buffer BYTES]]   -> one JSON object. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (256 * 1024)

static int sock_buffer; /* --buffer: SO_SNDBUF/SO_RCVBUF on both ends, 0 = the kernel's autotuning */

static void tune(int fd) {
  if (sock_buffer > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sock_buffer, sizeof sock_buffer);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sock_buffer, sizeof sock_buffer);
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Writes CHUNK-byte buffers to fd until `seconds` have passed; 0 on success. */
static int send_for(int fd, const char *buf, double seconds) {
  double end = now_s() + seconds;
  while (now_s() < end) {
    size_t off = 0;
    while (off < CHUNK) {
      ssize_t w = write(fd, buf + off, CHUNK - off);
      if (w <= 0) {
        perror("tcp_bw: write");
        return -1;
      }
      off += (size_t)w;
    }
  }
  return 0;
}

/* Reads fd to end of stream; out[0] = bytes, out[1] = seconds from the first byte to the end. */
static int recv_all(int fd, char *buf, double out[2]) {
  double total = 0, t0 = 0;
  for (;;) {
    ssize_t r = read(fd, buf, CHUNK);
    if (r < 0) {
      perror("tcp_bw: read");
      return -1;
    }
    if (r == 0)
      break;
    if (total == 0)
      t0 = now_s();
    total += (double)r;
  }
  out[0] = total;
  out[1] = total > 0 ? now_s() - t0 : 0;
  return 0;
}

typedef struct sender {
  int fd;
  double seconds;
  int rc;
} sender;

static void *sender_main(void *arg) {
  sender *s = arg;
  char *buf = malloc(CHUNK);
  if (!buf) {
    s->rc = -1;
    return NULL;
  }
  memset(buf, 0x5a, CHUNK);
  s->rc = send_for(s->fd, buf, s->seconds);
  if (s->rc == 0 && shutdown(s->fd, SHUT_WR) != 0) {
    perror("tcp_bw: shutdown");
    s->rc = -1;
  }
  free(buf);
  return NULL;
}

static int use_poll; /* --poll: one thread per side, nonblocking send and receive in a poll loop */

/* One end of the exchange on one thread: nonblocking writes and reads, poll(2) when neither
 * moves (what dtrain's tcp transport does in a sendrecv). */
static int exchange_poll(int fd, double seconds, double got[2]) {
  char *sbuf = malloc(CHUNK), *rbuf = malloc(CHUNK);
  if (!sbuf || !rbuf || fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0) {
    free(sbuf);
    free(rbuf);
    return -1;
  }
  memset(sbuf, 0x5a, CHUNK);
  double end = now_s() + seconds, total = 0, t0 = 0;
  size_t off = 0;
  int sending = 1, receiving = 1, rc = 0;
  while (sending || receiving) {
    int moved = 0;
    if (sending) {
      if (off == 0 && now_s() >= end) {
        sending = 0;
        if (shutdown(fd, SHUT_WR) != 0) {
          rc = -1;
          break;
        }
      } else {
        ssize_t w = send(fd, sbuf + off, CHUNK - off, MSG_NOSIGNAL);
        if (w > 0) {
          off = (off + (size_t)w) % CHUNK;
          moved = 1;
        } else if (errno != EAGAIN && errno != EINTR) {
          perror("tcp_bw: send");
          rc = -1;
          break;
        }
      }
    }
    if (receiving) {
      ssize_t r = recv(fd, rbuf, CHUNK, 0);
      if (r > 0) {
        if (total == 0)
          t0 = now_s();
        total += (double)r;
        moved = 1;
      } else if (r == 0) {
        receiving = 0;
        got[1] = total > 0 ? now_s() - t0 : 0;
      } else if (errno != EAGAIN && errno != EINTR) {
        perror("tcp_bw: recv");
        rc = -1;
        break;
      }
    }
    if (!moved && (sending || receiving)) {
      struct pollfd p = {.fd = fd, .events = (short)((sending ? POLLOUT : 0) | (receiving ? POLLIN : 0))};
      poll(&p, 1, 100);
    }
  }
  got[0] = total;
  free(sbuf);
  free(rbuf);
  return rc;
}

/* One end of the exchange on connected socket fd: sends on a thread while reading here. */
static int exchange_side(int fd, double seconds, double got[2]) {
  if (use_poll)
    return exchange_poll(fd, seconds, got);
  char *buf = malloc(CHUNK);
  sender s = {.fd = fd, .seconds = seconds, .rc = 0};
  pthread_t th;
  if (!buf || pthread_create(&th, NULL, sender_main, &s) != 0) {
    fprintf(stderr, "tcp_bw: cannot start the sender thread\n");
    free(buf);
    return -1;
  }
  int rc = recv_all(fd, buf, got);
  pthread_join(th, NULL);
  free(buf);
  return rc || s.rc ? -1 : 0;
}

/* A whole decimal argument: 1 and *out set, or 0 when it is not one ("x", "4M", ""). */
static int num_arg(const char *s, double *out) {
  char *end;
  errno = 0;
  *out = strtod(s, &end);
  return end != s && *end == '\0' && errno == 0;
}

int main(int argc, char **argv) {
  double seconds = 3.0, buffer = 0;
  int exchange = 0;
  for (int i = 1; i < argc; i++) {
    int ok = 1;
    if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
      ok = num_arg(argv[++i], &seconds);
    else if (!strcmp(argv[i], "--exchange"))
      exchange = 1;
    else if (!strcmp(argv[i], "--poll"))
      use_poll = 1;
    else if (!strcmp(argv[i], "--buffer") && i + 1 < argc)
      ok = num_arg(argv[++i], &buffer);
    else
      ok = 0;
    if (!ok) {
      fprintf(stderr, "usage: tcp_bw [--seconds S] [--exchange [--poll] [--buffer BYTES]]\n");
      return 2;
    }
  }
  if (!(buffer >= 0 && buffer <= (64 << 20)) || buffer != (int)buffer) {
    fprintf(stderr, "tcp_bw: --buffer must be a whole number of bytes in [0, 64 MiB]\n");
    return 2;
  }
  sock_buffer = (int)buffer;
  if (!(seconds > 0 && seconds <= 60)) {
    fprintf(stderr, "tcp_bw: --seconds must be in (0, 60]\n");
    return 2;
  }
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t alen = sizeof addr;
  if (ls < 0 || bind(ls, (struct sockaddr *)&addr, sizeof addr) || listen(ls, 1) ||
      getsockname(ls, (struct sockaddr *)&addr, &alen)) {
    perror("tcp_bw: listen on 127.0.0.1");
    return 1;
  }
  int pipefd[2];
  if (pipe(pipefd)) {
    perror("tcp_bw: pipe");
    return 1;
  }
  alarm((unsigned)seconds + 30); /* never hang, whatever the peer does */
  pid_t child = fork();
  if (child < 0) {
    perror("tcp_bw: fork");
    return 1;
  }
  char *buf = malloc(CHUNK);
  if (!buf)
    return 1;
  if (child == 0) { /* receiver; with --exchange, also a sender */
    close(pipefd[0]);
    int s = accept(ls, NULL, NULL);
    if (s < 0)
      _exit(1);
    tune(s);
    double out[2];
    if ((exchange ? exchange_side(s, seconds, out) : recv_all(s, buf, out)) != 0)
      _exit(1);
    if (write(pipefd[1], out, sizeof out) != (ssize_t)sizeof out)
      _exit(1);
    _exit(0);
  }
  close(pipefd[1]);
  close(ls);
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (s >= 0)
    tune(s);
  if (s < 0 || connect(s, (struct sockaddr *)&addr, sizeof addr)) {
    perror("tcp_bw: connect to 127.0.0.1");
    kill(child, SIGKILL);
    return 1;
  }
  double mine[2] = {0, 0};
  if (exchange) {
    if (exchange_side(s, seconds, mine) != 0) {
      kill(child, SIGKILL);
      return 1;
    }
  } else {
    memset(buf, 0x5a, CHUNK);
    if (send_for(s, buf, seconds) != 0) {
      kill(child, SIGKILL);
      return 1;
    }
  }
  close(s);
  double res[2] = {0, 0};
  ssize_t got = read(pipefd[0], res, sizeof res);
  int status = 0;
  waitpid(child, &status, 0);
  if (got != (ssize_t)sizeof res || !WIFEXITED(status) || WEXITSTATUS(status) || res[1] <= 0 ||
      (exchange && mine[1] <= 0)) {
    fprintf(stderr, "tcp_bw: receiver failed\n");
    return 1;
  }
  if (exchange) {
    /* res: what the child received (parent -> child), mine: child -> parent */
    double a = res[0] / res[1] / 1e9, b = mine[0] / mine[1] / 1e9;
    printf("{\"tool\": \"tcp_bw\", \"mode\": \"exchange\", \"seconds\": %.3f, \"bytes\": %.0f, "
           "\"gbs_a_to_b\": %.4f, \"gbs_b_to_a\": %.4f, \"gbs\": %.4f, \"total_gbs\": %.4f}\n",
           (res[1] + mine[1]) / 2, res[0] + mine[0], a, b, (a + b) / 2, a + b);
  } else {
    printf("{\"tool\": \"tcp_bw\", \"mode\": \"stream\", \"seconds\": %.3f, \"bytes\": %.0f, \"gbs\": %.4f}\n", res[1],
           res[0], res[0] / res[1] / 1e9);
  }
  free(buf);
  return 0;
}
