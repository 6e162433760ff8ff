/* tcp_bw.c - single-stream loopback TCP bandwidth, the ceiling of the collectives' tcp bound in
 * bench/compare-peers when iperf3 is not installed (iperf3 -c 127.0.0.1 measures the same thing).
 *
 * One process sends 256 KiB writes over one TCP connection on 127.0.0.1 to a forked child that
 * reads them, for a fixed time; the rate is the bytes the receiver got / the time it took. It
 * deliberately tunes nothing (no socket buffer sizes, no zero-copy), as a plain socket user gets.
 *
 * Usage: tcp_bw [--seconds S]   -> one JSON object on stdout. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (256 * 1024)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  double seconds = 3.0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
      seconds = atof(argv[++i]);
    else {
      fprintf(stderr, "usage: tcp_bw [--seconds S]\n");
      return 2;
    }
  }
  if (seconds <= 0 || seconds > 60) {
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
  if (child == 0) { /* receiver */
    close(pipefd[0]);
    int s = accept(ls, NULL, NULL);
    if (s < 0)
      _exit(1);
    double total = 0, t0 = 0;
    for (;;) {
      ssize_t r = read(s, buf, CHUNK);
      if (r <= 0)
        break;
      if (total == 0)
        t0 = now_s();
      total += (double)r;
    }
    double dt = now_s() - t0;
    double out[2] = {total, dt};
    if (write(pipefd[1], out, sizeof out) != (ssize_t)sizeof out)
      _exit(1);
    _exit(0);
  }
  close(pipefd[1]);
  close(ls);
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0 || connect(s, (struct sockaddr *)&addr, sizeof addr)) {
    perror("tcp_bw: connect to 127.0.0.1");
    kill(child, SIGKILL);
    return 1;
  }
  memset(buf, 0x5a, CHUNK);
  double end = now_s() + seconds;
  while (now_s() < end) {
    size_t off = 0;
    while (off < CHUNK) {
      ssize_t w = write(s, buf + off, CHUNK - off);
      if (w <= 0) {
        perror("tcp_bw: write");
        kill(child, SIGKILL);
        return 1;
      }
      off += (size_t)w;
    }
  }
  close(s);
  double res[2] = {0, 0};
  ssize_t got = read(pipefd[0], res, sizeof res);
  int status = 0;
  waitpid(child, &status, 0);
  if (got != (ssize_t)sizeof res || !WIFEXITED(status) || WEXITSTATUS(status) || res[1] <= 0) {
    fprintf(stderr, "tcp_bw: receiver failed\n");
    return 1;
  }
  printf("{\"tool\": \"tcp_bw\", \"seconds\": %.3f, \"bytes\": %.0f, \"gbs\": %.4f}\n", res[1], res[0],
         res[0] / res[1] / 1e9);
  free(buf);
  return 0;
}
