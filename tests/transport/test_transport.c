/* test_transport.c - the communicator and both transports in real processes: point-to-point
 * messages, concurrent sendrecv rings, the shared-memory allreduce, split, and faults (a rank
 * SIGKILLed or SIGSTOPped mid-exchange, a rank that never joins, mismatched calls, strangers on
 * a worker's port, a silent listener where a worker's port should be). One case per process: `test_transport CASE TRANSPORT`.
 *
 * Every check asserts values or the exact failure a rank must report; every wait is bounded by
 * the harness (mp_run) and by the communicator's deadline. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "comm/coll/coll.h"
#include "comm/comm.h"
#include "comm/store.h"
#include "comm/wire.h"
#include "common/mp.h"
#include "dtrain/comm.h"

static const char *g_tp; /* transport under test */

#define FAIL(...)                                                        \
  do {                                                                   \
    fprintf(stderr, "[rank %d] FAIL %s:%d: ", g_rank, __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__);                                        \
    fprintf(stderr, "\n");                                               \
    return 1;                                                            \
  } while (0)
#define CHECK(cond, ...)  \
  do {                    \
    if (!(cond))          \
      FAIL(__VA_ARGS__);  \
  } while (0)
#define CHECK_OK(call)                                                                          \
  do {                                                                                          \
    dt_status st_ = (call);                                                                     \
    if (st_ != DT_OK)                                                                           \
      FAIL("%s -> %s: %s", #call, dt_strerror(st_), dt_last_error());                            \
  } while (0)

static int g_rank = -1;

static const size_t sizes[] = {0, 1, 7, 4099, (1u << 20) + 3};

static uint8_t pattern(int src, int dst, size_t size, size_t i) {
  return (uint8_t)(i * 131u + (size_t)src * 17u + (size_t)dst * 5u + size * 7u + 1u);
}

static int join(dt_comm **c) {
  setenv("DTRAIN_TRANSPORT", g_tp, 1);
  CHECK_OK(dt_comm_create(NULL, c));
  CHECK(strcmp(dt_comm_transport(*c), g_tp) == 0, "transport %s, expected %s", dt_comm_transport(*c), g_tp);
  return 0;
}

/* Ring pass with the public blocking calls: rank 0 sends first, every other rank receives from
 * its left neighbour and then sends to its right one (works for any size, any message length). */
static int ring_pass(dt_comm *c, size_t size, int tag) {
  int r = dt_comm_rank(c), n = dt_comm_size(c);
  if (n == 1)
    return 0;
  int right = (r + 1) % n, left = (r + n - 1) % n;
  uint8_t *out = malloc(size + 1), *in = malloc(size + 1);
  for (size_t i = 0; i < size; i++)
    out[i] = pattern(r, right, size, i);
  memset(in, 0xEE, size + 1);
  if (r == 0)
    CHECK_OK(dt_comm_send(c, out, size, DT_U8, right, tag));
  CHECK_OK(dt_comm_recv(c, in, size, DT_U8, left, tag));
  if (r != 0)
    CHECK_OK(dt_comm_send(c, out, size, DT_U8, right, tag));
  for (size_t i = 0; i < size; i++)
    CHECK(in[i] == pattern(left, r, size, i), "size %zu byte %zu from rank %d: got %u want %u", size, i, left, in[i],
          pattern(left, r, size, i));
  CHECK(in[size] == 0xEE, "size %zu: byte past the end was written", size);
  free(out);
  free(in);
  return 0;
}

/* p2p: ring passes of every size, then every pair in a fixed order exchanging f32 data. */
static int case_p2p(int rank, int size, void *arg) {
  g_rank = rank;
  dt_comm *c;
  if (join(&c))
    return 1;
  CHECK(dt_comm_rank(c) == rank && dt_comm_size(c) == size, "rank %d size %d", dt_comm_rank(c), dt_comm_size(c));
  CHECK(dt_comm_local_size(c) == size && dt_comm_local_rank(c) == rank, "local %d of %d", dt_comm_local_rank(c),
        dt_comm_local_size(c));
  for (size_t k = 0; k < DT_ARRAY_LEN(sizes); k++)
    if (ring_pass(c, sizes[k], (int)k))
      return 1;
  for (int i = 0; i < size; i++)
    for (int j = i + 1; j < size; j++) {
      if (rank != i && rank != j)
        continue;
      int peer = rank == i ? j : i;
      float out[33], in[33];
      for (int e = 0; e < 33; e++)
        out[e] = (float)(rank * 1000 + e) + 0.25f;
      if (rank == i) {
        CHECK_OK(dt_comm_send(c, out, 33, DT_F32, peer, 7));
        CHECK_OK(dt_comm_recv(c, in, 33, DT_F32, peer, 8));
      } else {
        CHECK_OK(dt_comm_recv(c, in, 33, DT_F32, peer, 7));
        CHECK_OK(dt_comm_send(c, out, 33, DT_F32, peer, 8));
      }
      for (int e = 0; e < 33; e++)
        CHECK(in[e] == (float)(peer * 1000 + e) + 0.25f, "pair %d-%d element %d: %g", i, j, e, (double)in[e]);
    }
  /* Invalid arguments are refused without touching the wire, and fail the job (the others stop
   * with DT_ERR_ABORTED rather than wait for this rank): every rank's pairs are done first, or a
   * rank through with its pairs could abort a recv whose message had already arrived (3 ranks
   * under TSan: rank 1's last recv, after rank 2 had sent it and gone on). A rank still leaving
   * the barrier when another's invalid send lands may see that abort there. */
  dt_status bst = dt_comm_barrier(c);
  CHECK(bst == DT_OK || (bst == DT_ERR_ABORTED && strstr(dt_last_error(), "is not another rank")),
        "barrier before the invalid sends: %s (%s)", dt_strerror(bst), dt_last_error());
  CHECK(dt_comm_send(c, "x", 1, DT_U8, rank, 0) == DT_ERR_INVALID, "send to self accepted");
  CHECK(dt_comm_send(c, "x", 1, DT_U8, size, 0) == DT_ERR_INVALID, "send to rank %d accepted", size);
  dt_comm_destroy(c);
  return 0;
}

/* One sendrecv of n bytes to the right while receiving from the left, then (when rank ^ 1
 * exists) a pairwise exchange with the same peer on both sides; checks every byte and the byte
 * past the end. */
static int exchange(dt_comm *c, int rank, int size, size_t n) {
  int right = (rank + 1) % size, left = (rank + size - 1) % size;
  uint8_t *out = malloc(n + 1), *in = malloc(n + 1);
  for (size_t i = 0; i < n; i++)
    out[i] = pattern(rank, right, n, i);
  memset(in, 0xEE, n + 1);
  dt__fp fp = {.seq = ++c->seq, .count = n, .coll = DT_COLL_ALLGATHER, .dtype = DT_U8, .root = -1};
  CHECK_OK(c->ops->sendrecv(c->tp, right, out, n, left, in, n, &fp, dt__comm_deadline(c)));
  for (size_t i = 0; i < n; i++)
    CHECK(in[i] == pattern(left, rank, n, i), "size %zu byte %zu: got %u", n, i, in[i]);
  CHECK(in[n] == 0xEE, "wrote past the end");
  int partner = rank ^ 1;
  fp.seq = ++c->seq;
  if (partner < size) {
    CHECK_OK(c->ops->sendrecv(c->tp, partner, out, n, partner, in, n, &fp, dt__comm_deadline(c)));
    for (size_t i = 0; i < n; i++)
      CHECK(in[i] == pattern(partner, (partner + 1) % size, n, i), "pairwise size %zu byte %zu", n, i);
  }
  free(out);
  free(in);
  return 0;
}

/* sendrecv through the transport table: every rank sends right and receives from the left at
 * the same time (needs concurrent progress for messages larger than any buffer). */
static int case_sendrecv(int rank, int size, void *arg) {
  g_rank = rank;
  dt_comm *c;
  if (join(&c))
    return 1;
  if (size > 1) {
    for (size_t k = 0; k < DT_ARRAY_LEN(sizes); k++)
      for (int rep = 0; rep < 3; rep++)
        if (exchange(c, rank, size, sizes[k] * (size_t)(rep + 1) + (size_t)rep))
          return 1;
    /* A zero-byte message still synchronizes (barriers use it). */
    dt__fp fp = {.seq = ++c->seq, .coll = DT_COLL_BARRIER, .root = -1};
    CHECK_OK(c->ops->sendrecv(c->tp, (rank + 1) % size, NULL, 0, (rank + size - 1) % size, NULL, 0, &fp,
                              dt__comm_deadline(c)));
  }
  dt_comm_destroy(c);
  return 0;
}

/* segments: messages around whole loopback segments, the ones the tcp transport sends in two
 * parts (tcp.c, tcp_cut): k full segments of the connection's size (advmss, read off a socket
 * here; 65,483 bytes on loopback) and a remainder, header included, for k = 1..5 and
 * remainders of none, 1, 93 and 146 bytes (cut up to k = 4), just under and over a quarter
 * segment (the cut's limit), and 64 and 128 KiB payloads; *arg 1: with the smallest socket
 * buffers allowed (64 KiB), so that sends stop part-way, before and after the cut. Every byte
 * arrives, in order. */
static int case_segments(int rank, int size, void *arg) {
  g_rank = rank;
  if (*(int *)arg)
    setenv("DTRAIN_SOCKET_BUFFER", "64K", 1);
  dt_comm *c;
  if (join(&c))
    return 1;
  int seg = 65483;
  struct tcp_info ti;
  socklen_t tl = sizeof ti;
  for (int fd = 3; fd < 1024; fd++) /* any connected TCP socket of this host says the same */
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) == 0 && ti.tcpi_advmss > 1000) {
      seg = (int)ti.tcpi_advmss;
      break;
    }
  const size_t hdr = 40, tails[] = {0, 1, 93, 146, (size_t)seg / 4 - 1, (size_t)seg / 4 + 1};
  for (size_t k = 1; k <= 5; k++)
    for (size_t i = 0; i < DT_ARRAY_LEN(tails); i++)
      if (exchange(c, rank, size, k * (size_t)seg + tails[i] - hdr))
        return 1;
  if (exchange(c, rank, size, 65536) || exchange(c, rank, size, 131072))
    return 1;
  dt_comm_destroy(c);
  unsetenv("DTRAIN_SOCKET_BUFFER");
  return 0;
}

/* Socket buffers too small to carry a loopback segment are refused when the job forms, naming
 * the variable (with 16 KiB two ranks' exchanges stalled for 30-60 s: tcp.c, TCP_MIN_BUF). */
static int case_small_buffer(int rank, int size, void *arg) {
  (void)size;
  (void)arg;
  g_rank = rank;
  setenv("DTRAIN_SOCKET_BUFFER", "16K", 1);
  setenv("DTRAIN_TRANSPORT", g_tp, 1);
  dt_comm *c = NULL;
  dt_status st = dt_comm_create(NULL, &c);
  CHECK(st != DT_OK, "joined with 16 KiB socket buffers");
  CHECK(strstr(dt_last_error(), "DTRAIN_SOCKET_BUFFER=16384") || strstr(dt_last_error(), "rank"),
        "error does not name the setting or a rank: %s", dt_last_error());
  if (st == DT_ERR_INVALID)
    CHECK(strstr(dt_last_error(), "DTRAIN_SOCKET_BUFFER=16384: below the 65536 bytes"), "error: %s",
          dt_last_error());
  return 0;
}

/* Value of element i of rank r's input (small halves: every sum here is exact in f16/f32). */
static double fval(int r, size_t i) { return (double)((int)((i * 7 + (size_t)r * 13) % 1000) - 500) * 0.5; }

/* broadcast, allgather and reduce_scatter fast paths (when the transport has them). */
static int fast_others(dt_comm *c, int rank, int size) {
  static const size_t counts[] = {0, 1, 7, 4099, 300007};
  for (size_t ki = 0; ki < DT_ARRAY_LEN(counts); ki++) {
    size_t n = counts[ki];
    float *a = malloc((n * (size_t)size + 1) * 4), *b = malloc((n * (size_t)size + 1) * 4);
    if (c->ops->broadcast)
      for (int root = 0; root < size; root++) {
        for (size_t i = 0; i < n; i++)
          a[i] = rank == root ? (float)fval(root, i) : -1.0f;
        dt__fp fp = {.seq = ++c->seq, .count = n, .coll = DT_COLL_BROADCAST, .dtype = DT_F32, .root = root};
        CHECK_OK(c->ops->broadcast(c->tp, a, n, DT_F32, root, &fp, dt__comm_deadline(c)));
        for (size_t i = 0; i < n; i++)
          CHECK(a[i] == (float)fval(root, i), "broadcast count %zu root %d element %zu = %g", n, root, i, (double)a[i]);
      }
    if (c->ops->allgather)
      for (int inplace = 0; inplace < 2; inplace++) {
        float *mine = inplace ? b + (size_t)rank * n : a;
        for (size_t i = 0; i < n; i++)
          mine[i] = (float)fval(rank, i);
        dt__fp fp = {.seq = ++c->seq, .count = n, .coll = DT_COLL_ALLGATHER, .dtype = DT_F32, .root = -1};
        CHECK_OK(c->ops->allgather(c->tp, inplace ? DT_IN_PLACE : a, b, n, DT_F32, &fp, dt__comm_deadline(c)));
        for (int r = 0; r < size; r++)
          for (size_t i = 0; i < n; i++)
            CHECK(b[(size_t)r * n + i] == (float)fval(r, i), "allgather count %zu block %d element %zu", n, r, i);
      }
    if (c->ops->reduce_scatter)
      for (int ti = 0; ti < 2; ti++)
        for (int inplace = 0; inplace < 2; inplace++) {
          dt_dtype t = ti ? DT_F16 : DT_F32;
          uint16_t *h = (uint16_t *)a;
          float *in = inplace ? b : a;
          for (size_t i = 0; i < n * (size_t)size; i++) {
            if (t == DT_F16)
              ((uint16_t *)(inplace ? (void *)b : (void *)a))[i] = dt__f32_to_f16((float)fval(rank, i));
            else
              in[i] = (float)fval(rank, i);
          }
          dt__fp fp = {.seq = ++c->seq, .count = n, .coll = DT_COLL_REDUCE_SCATTER, .dtype = (uint8_t)t, .op = DT_SUM, .root = -1};
          CHECK_OK(c->ops->reduce_scatter(c->tp, inplace ? DT_IN_PLACE : a, b, n, t, DT_SUM, &fp, dt__comm_deadline(c)));
          for (size_t i = 0; i < n; i++) {
            double want = 0;
            for (int r = 0; r < size; r++)
              want += fval(r, (size_t)rank * n + i);
            double got = t == DT_F16 ? dt__f16_to_f32(((uint16_t *)b)[i]) : b[i];
            CHECK(got == want, "reduce_scatter %s inplace %d count %zu element %zu = %g, want %g", t == DT_F16 ? "f16" : "f32",
                  inplace, n, i, got, want);
          }
          (void)h;
        }
    free(a);
    free(b);
  }
  return 0;
}

/* The transport's allreduce fast path (shm) against a serial reference. */
static int case_allreduce(int rank, int size, void *arg) {
  g_rank = rank;
  dt_comm *c;
  if (join(&c))
    return 1;
  if (!c->ops->allreduce) {
    dt_comm_destroy(c);
    return 0;
  }
  static const size_t counts[] = {0, 1, 7, 4099, 300007, (1u << 20) + 3};
  static const dt_op ops[] = {DT_SUM, DT_MAX, DT_AVG};
  for (size_t ki = 0; ki < DT_ARRAY_LEN(counts); ki++)
    for (int ti = 0; ti < 2; ti++)
      for (size_t oi = 0; oi < DT_ARRAY_LEN(ops); oi++)
        for (int inplace = 0; inplace < 2; inplace++) {
          size_t n = counts[ki];
          dt_dtype t = ti ? DT_I32 : DT_F32;
          dt_op op = ops[oi];
          int32_t *si = malloc(n * 4 + 4), *ri = malloc(n * 4 + 4);
          float *sf = (float *)si, *rf = (float *)ri;
          for (size_t i = 0; i < n; i++) {
            int v = (int)((i * 7 + (size_t)rank * 13) % 1000) - 500;
            if (t == DT_I32)
              si[i] = v;
            else
              sf[i] = (float)v * 0.5f; /* halves: sums of a few are exact in f32 */
          }
          if (inplace)
            memcpy(ri, si, n * 4);
          else
            memset(ri, 0x55, n * 4);
          dt__fp fp = {.seq = ++c->seq, .count = n, .coll = DT_COLL_ALLREDUCE, .dtype = (uint8_t)t, .op = (uint8_t)op, .root = -1};
          CHECK_OK(c->ops->allreduce(c->tp, inplace ? DT_IN_PLACE : si, ri, n, t, op, &fp, dt__comm_deadline(c)));
          for (size_t i = 0; i < n; i++) {
            double acc = op == DT_MAX ? -1e30 : 0;
            for (int r = 0; r < size; r++) {
              int v = (int)((i * 7 + (size_t)r * 13) % 1000) - 500;
              double x = t == DT_I32 ? v : v * 0.5;
              acc = op == DT_MAX ? (x > acc ? x : acc) : acc + x;
            }
            if (op == DT_AVG)
              acc = t == DT_I32 ? (double)(long long)(acc / size) : acc / size;
            double got = t == DT_I32 ? ri[i] : rf[i];
            double tol = t == DT_I32 ? 0 : 1e-6 * (1 + (acc < 0 ? -acc : acc));
            double d = got - acc;
            CHECK(d <= tol && -d <= tol, "count %zu %s %s inplace %d: element %zu = %g, want %g", n, t == DT_I32 ? "i32" : "f32",
                  dt_op_name(op), inplace, i, got, acc);
          }
          free(si);
          free(ri);
        }
  /* f16/bf16 sums must round once: rank 0 holds 1024, the others a value below half of the
   * type's spacing there, so rounding after every addition would never move off 1024. */
  for (int ti = 0; ti < 2 && c->ops->allreduce; ti++)
    for (int avg = 0; avg < 2; avg++) {
      dt_dtype t = ti ? DT_BF16 : DT_F16;
      dt_op op = avg ? DT_AVG : DT_SUM;
      if (avg && (size & (size - 1)))
        continue; /* avg checked where dividing by size is exact */
      float small = t == DT_F16 ? 0.5f : 3.0f;
      size_t n = 4099;
      uint16_t *h = malloc(n * 2);
      for (size_t i = 0; i < n; i++) {
        float v = rank == 0 ? 1024.0f : small * (float)(1 + i % 2);
        h[i] = t == DT_F16 ? dt__f32_to_f16(v) : dt__f32_to_bf16(v);
      }
      dt__fp fp = {.seq = ++c->seq, .count = n, .coll = DT_COLL_ALLREDUCE, .dtype = (uint8_t)t, .op = (uint8_t)op, .root = -1};
      CHECK_OK(c->ops->allreduce(c->tp, DT_IN_PLACE, h, n, t, op, &fp, dt__comm_deadline(c)));
      for (size_t i = 0; i < n; i++) {
        float exact = 1024.0f + small * (float)(1 + i % 2) * (float)(size - 1);
        if (avg)
          exact /= (float)size;
        uint16_t want = t == DT_F16 ? dt__f32_to_f16(exact) : dt__f32_to_bf16(exact);
        CHECK(h[i] == want, "%s %s n=%d element %zu: 0x%04x, want 0x%04x (%g)", t == DT_F16 ? "f16" : "bf16",
              avg ? "avg" : "sum", size, i, h[i], want, (double)exact);
      }
      free(h);
    }
  if (fast_others(c, rank, size))
    return 1;
  if (c->ops->barrier) {
    dt__fp fp = {.seq = ++c->seq, .coll = DT_COLL_BARRIER, .root = -1};
    CHECK_OK(c->ops->barrier(c->tp, &fp, dt__comm_deadline(c)));
  }
  dt_comm_destroy(c);
  return 0;
}

/* Mismatched calls on the fast paths: different counts, then a barrier against an allreduce.
 * Both sides must report DT_ERR_MISMATCH naming both calls. */
static int case_fastmismatch(int rank, int size, void *arg) {
  g_rank = rank;
  int which = *(int *)arg;
  dt_comm *c;
  if (join(&c))
    return 1;
  float buf[64] = {0};
  dt__fp fp = {.seq = 1, .count = rank ? 20 : 10, .coll = DT_COLL_ALLREDUCE, .dtype = DT_F32, .op = DT_SUM, .root = -1};
  dt_status st;
  const char *want0 = "rank 0 called allreduce #1 with 10 x f32 sum", *want1 = "rank 1 called allreduce #1 with 20 x f32 sum";
  if (which == 0) {
    st = c->ops->allreduce(c->tp, buf, buf, fp.count, DT_F32, DT_SUM, &fp, dt__comm_deadline(c));
  } else {
    want0 = "rank 0 called barrier #1";
    if (rank == 0) {
      fp = (dt__fp){.seq = 1, .coll = DT_COLL_BARRIER, .root = -1};
      st = c->ops->barrier(c->tp, &fp, dt__comm_deadline(c));
    } else {
      st = c->ops->allreduce(c->tp, buf, buf, fp.count, DT_F32, DT_SUM, &fp, dt__comm_deadline(c));
    }
  }
  CHECK(st == DT_ERR_MISMATCH, "status %s: %s", dt_strerror(st), dt_last_error());
  CHECK(strstr(dt_last_error(), want0) && strstr(dt_last_error(), want1), "message: %s", dt_last_error());
  fprintf(stderr, "[rank %d] expected failure: %s: %s\n", rank, dt_strerror(st), dt_last_error());
  dt_comm_destroy(c);
  return 0;
}

/* split: even/odd colors with reversed keys, then point-to-point inside; a rank with color
 * DT_COMM_UNDEFINED gets NULL. */
static int case_split(int rank, int size, void *arg) {
  g_rank = rank;
  dt_comm *c, *s = NULL, *none = NULL;
  if (join(&c))
    return 1;
  CHECK_OK(dt_comm_split(c, rank % 2, -rank, &s));
  int members = (size - rank % 2 + 1) / 2;
  CHECK(s && dt_comm_size(s) == members, "split size %d, want %d", s ? dt_comm_size(s) : -1, members);
  int want = members - 1 - rank / 2; /* keys reversed: the highest world rank comes first */
  CHECK(dt_comm_rank(s) == want, "split rank %d, want %d", dt_comm_rank(s), want);
  CHECK(strcmp(dt_comm_transport(s), g_tp) == 0, "split transport %s", dt_comm_transport(s));
  for (size_t k = 0; k < DT_ARRAY_LEN(sizes); k++)
    if (ring_pass(s, sizes[k], 100 + (int)k))
      return 1;
  /* The world still works after the split, and a second split leaves rank 0 out. */
  if (ring_pass(c, 4099, 9))
    return 1;
  CHECK_OK(dt_comm_split(c, rank == 0 ? DT_COMM_UNDEFINED : 1, 0, &none));
  CHECK((rank == 0) == (none == NULL), "undefined color gave %p", (void *)none);
  if (none) {
    CHECK(dt_comm_size(none) == size - 1 && dt_comm_rank(none) == rank - 1, "second split %d of %d", dt_comm_rank(none),
          dt_comm_size(none));
    if (ring_pass(none, 7, 3))
      return 1;
  }
  /* The world may go first: its splits, and the store rank 0 hosts for them, live on (rank 0's
   * destroy once waited out the deadline for the splits' store connections). */
  int64_t t0 = dt_now_ns();
  dt_comm_destroy(c);
  CHECK(dt_now_ns() - t0 < 5000000000ll, "destroying the world before its splits took %lld ms",
        (long long)((dt_now_ns() - t0) / 1000000));
  if (none && ring_pass(none, 7, 4))
    return 1;
  if (ring_pass(s, 4099, 12))
    return 1;
  dt_comm_destroy(none);
  dt_comm_destroy(s);
  return 0;
}

/* ---- faults ---- */

static int *g_pids; /* shared with the harness process: each rank's pid */

static bool names_rank(const char *msg, int r) {
  char a[32];
  snprintf(a, sizeof a, "rank %d ", r);
  if (strstr(msg, a))
    return true;
  snprintf(a, sizeof a, "rank %d:", r);
  if (strstr(msg, a))
    return true;
  snprintf(a, sizeof a, "rank %d", r);
  const char *p = strstr(msg, a);
  return p && (p[strlen(a)] == '\0' || p[strlen(a)] == ',' || p[strlen(a)] == ')');
}

/* Long ring exchange; the victim (last rank) dies (SIGKILL) or freezes (SIGSTOP) in the
 * middle. Every survivor must fail with PEER or ABORTED naming the victim. */
static int fault_body(int rank, int size, int sig) {
  g_rank = rank;
  g_pids[rank] = getpid();
  dt_comm *c;
  if (join(&c))
    return 1;
  int victim = size - 1, right = (rank + 1) % size, left = (rank + size - 1) % size;
  size_t n = 1u << 20;
  uint8_t *out = calloc(n, 1), *in = calloc(n, 1);
  dt_status st = DT_OK;
  for (int it = 0; it < 100000 && st == DT_OK; it++) {
    if (rank == victim && it == 21) /* the others are then inside an allreduce */
      raise(sig);
    if (it % 2) {
      /* A real collective (on shm its fast path) half of the time. */
      st = dt_comm_allreduce(c, DT_IN_PLACE, in, n / 4, DT_F32, DT_SUM);
    } else {
      dt__fp fp = {.seq = ++c->seq, .count = n, .coll = DT_COLL_ALLGATHER, .dtype = DT_U8, .root = -1};
      st = c->ops->sendrecv(c->tp, right, out, n, left, in, n, &fp, dt__comm_deadline(c));
    }
  }
  if (rank == victim)
    FAIL("the victim survived: %s", dt_last_error());
  dt__comm_fail(c, st);
  CHECK(st == DT_ERR_PEER || st == DT_ERR_ABORTED, "status %s: %s", dt_strerror(st), dt_last_error());
  CHECK(names_rank(dt_last_error(), victim), "error does not name rank %d: %s", victim, dt_last_error());
  fprintf(stderr, "[rank %d] expected failure: %s: %s\n", rank, dt_strerror(st), dt_last_error());
  /* Later calls fail at once too. */
  uint8_t b = 0;
  CHECK(dt_comm_send(c, &b, 1, DT_U8, right, 0) != DT_OK, "send after the failure succeeded");
  if (sig == SIGSTOP && rank == 0)
    kill(g_pids[victim], SIGKILL);
  dt_comm_destroy(c);
  free(out);
  free(in);
  return 0;
}

static int case_kill(int rank, int size, void *arg) { return fault_body(rank, size, SIGKILL); }
static int case_stop(int rank, int size, void *arg) { return fault_body(rank, size, SIGSTOP); }

/* The last rank never joins: create fails on every other rank, naming it. */
static int case_nojoin(int rank, int size, void *arg) {
  g_rank = rank;
  if (rank == size - 1)
    return 0;
  setenv("DTRAIN_TIMEOUT_MS", "1500", 1);
  setenv("DTRAIN_TRANSPORT", g_tp, 1);
  dt_comm *c = (dt_comm *)1;
  dt_status st = dt_comm_create(NULL, &c);
  CHECK(st != DT_OK && c == NULL, "create: %s, comm %p", dt_strerror(st), (void *)c);
  CHECK(names_rank(dt_last_error(), size - 1), "error does not name rank %d: %s", size - 1, dt_last_error());
  fprintf(stderr, "[rank %d] expected failure: %s: %s\n", rank, dt_strerror(st), dt_last_error());
  return 0;
}

/* Mismatched point-to-point calls (count, then tag): the receiver reports both sides, and the
 * sender learns it on its next call, also naming both. */
static int case_mismatch(int rank, int size, void *arg) {
  g_rank = rank;
  int which = *(int *)arg;
  dt_comm *c;
  if (join(&c))
    return 1;
  float buf[64] = {0};
  dt_status st;
  const char *want0, *want1;
  if (which == 0) {
    want0 = "rank 0 called send/recv #1 with 10 x f32 tag 1";
    want1 = "rank 1 called send/recv #1 with 20 x f32 tag 1";
    st = rank == 0 ? dt_comm_send(c, buf, 10, DT_F32, 1, 1) : dt_comm_recv(c, buf, 20, DT_F32, 0, 1);
  } else {
    want0 = "rank 0 called send/recv #1 with 10 x f32 tag 3";
    want1 = "rank 1 called send/recv #1 with 10 x f32 tag 4";
    st = rank == 0 ? dt_comm_send(c, buf, 10, DT_F32, 1, 3) : dt_comm_recv(c, buf, 10, DT_F32, 0, 4);
  }
  if (rank == 0) {
    CHECK(st == DT_OK, "eager send: %s: %s", dt_strerror(st), dt_last_error());
    st = dt_comm_recv(c, buf, 1, DT_F32, 1, 99);
  }
  CHECK(st == DT_ERR_MISMATCH || (rank == 0 && st == DT_ERR_ABORTED), "status %s: %s", dt_strerror(st), dt_last_error());
  CHECK(strstr(dt_last_error(), want0) && strstr(dt_last_error(), want1), "message: %s", dt_last_error());
  fprintf(stderr, "[rank %d] expected failure: %s: %s\n", rank, dt_strerror(st), dt_last_error());
  dt_comm_destroy(c);
  return 0;
}

/* Strangers on the workers' tcp ports while the job forms: the last process first plays a
 * stranger against every listening rank (no bytes, garbage, an absurd frame length, a wrong
 * secret), then joins; the job must form and exchange data correctly. */

/* The host record dt_comm_create publishes for a tcp rank on this host (w/host/R). */
static void host_record(char *rec, size_t cap) {
  char host[256] = "", boot[64] = "";
  gethostname(host, sizeof host - 1);
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    if (fgets(boot, sizeof boot, f))
      boot[strcspn(boot, "\n")] = '\0';
    fclose(f);
  }
  /* then the CPUs it may run on, and the algorithms (comm.c's comm_algo_line): every collective
   * automatic, no DTRAIN_ALGO */
  char cpus[DT__CPUS_HEX + 1], algo[DT_COLL_COUNT + 2] = "";
  dt__comm_cpus_hex(cpus, sizeof cpus);
  for (int k = DT_COLL_ALLREDUCE; k <= DT_COLL_BARRIER; k++)
    strcat(algo, "a");
  snprintf(rec, cap, "%s\n%s\ntcp\n%s\n%s ", host, boot, cpus, algo);
}

static int case_stranger(int rank, int size, void *arg) {
  g_rank = rank;
  int hold = arg ? *(const int *)arg : 0; /* silent strangers per listening rank, kept open while joining */
  int held[64], nheld = 0;
  if (rank == size - 1) {
    const char *secret = getenv("DTRAIN_JOB_SECRET");
    dt__store *st = NULL;
    int port = atoi(getenv("DTRAIN_MASTER_PORT"));
    int64_t dl = dt__deadline_after_ms(20000);
    CHECK_OK(dt__store_connect("127.0.0.1", port, (const uint8_t *)secret, strlen(secret), rank, dl, &st));
    /* Publish the host record dt_comm_create would (so the others go on to listen). */
    char rec[1024], key[64];
    host_record(rec, sizeof rec);
    snprintf(key, sizeof key, "w/host/%d", rank);
    CHECK_OK(dt__store_set(st, key, rec, strlen(rec), dl));
    for (int r = 0; r < size - 1; r++) {
      char val[128], h[64];
      size_t len = 0;
      int p = 0;
      snprintf(key, sizeof key, "w/tcp/%d", r);
      CHECK_OK(dt__store_wait(st, key, val, sizeof val - 1, &len, dl));
      val[len] = '\0';
      CHECK(sscanf(val, "%63s %d", h, &p) == 2, "address '%s'", val);
      for (int k = 0; k < hold && nheld < 64; k++)
        CHECK_OK(dt__sock_connect(h, p, dl, &held[nheld++]));
      for (int attack = 0; attack < 4 && !hold; attack++) {
        int fd = -1;
        CHECK_OK(dt__sock_connect(h, p, dl, &fd));
        if (attack == 1) {
          const char junk[] = "GET / HTTP/1.0\r\n\r\n";
          (void)!write(fd, junk, sizeof junk);
        } else if (attack == 2) {
          uint8_t hdr[16] = {0x44, 0x54, 0x52, 0x4e, 1, 0, 0x02, 0xA0, 0, 0, 0, 0, 0, 0, 0, 0x40};
          (void)!write(fd, hdr, sizeof hdr);
        } else if (attack == 3) {
          const char *bad = "wrong-secret";
          dt_status a = dt__auth_client(fd, (const uint8_t *)bad, strlen(bad), DT_ROLE_PEER, (uint32_t)rank,
                                        dt__deadline_after_ms(3000));
          CHECK(a != DT_OK, "a wrong secret was accepted by rank %d", r);
        }
        usleep(20000);
        close(fd);
      }
    }
    dt__store_close(st);
  }
  dt_comm *c;
  if (join(&c))
    return 1;
  for (int k = 0; k < nheld; k++)
    close(held[k]);
  for (size_t k = 0; k < DT_ARRAY_LEN(sizes); k++)
    if (ring_pass(c, sizes[k], (int)k))
      return 1;
  dt_comm_destroy(c);
  return 0;
}

/* Something that accepts on rank 0's tcp port but never says HELLO. Rank 0 is played by this
 * test (it hosts the store and publishes its host record, and as its tcp address a listener that
 * never accepts: the kernel does), rank 1 joins for real with a handshake timeout of 300 ms and
 * a deadline of 3 s. *arg 0: rank 0 looks healthy to the store (a stranger took its port): rank
 * 1 gives up at its deadline, naming rank 0, its address and the silence. *arg 1: rank 0 sends
 * one heartbeat once rank 1 is there, then none (a stopped process): rank 1 stops with that
 * verdict about a fault timeout (1 s) later, not at its deadline. */
/* reno: every connection of the tcp transport to another rank on this host runs Reno (tcp.c's
 * tcp_ready, TCP_LOCAL_BUF), whatever the host's default congestion control: this process's
 * connected TCP sockets whose two ends share an address, the rendezvous store's connection
 * among them (it keeps the host's default), number at least size - 1 running "reno". */
static int case_reno(int rank, int size, void *arg) {
  (void)arg;
  g_rank = rank;
  dt_comm *c = NULL;
  if (join(&c))
    return 1;
  int reno = 0;
  for (int fd = 3; fd < 4096; fd++) {
    struct sockaddr_in a, b;
    socklen_t la = sizeof a, lb = sizeof b;
    char cc[16] = "";
    socklen_t lc = sizeof cc - 1;
    if (getsockname(fd, (struct sockaddr *)&a, &la) != 0 || getpeername(fd, (struct sockaddr *)&b, &lb) != 0 ||
        a.sin_family != AF_INET || a.sin_addr.s_addr != b.sin_addr.s_addr ||
        getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, &lc) != 0)
      continue;
    reno += !strcmp(cc, "reno");
  }
  CHECK(reno >= size - 1, "%d of this rank's same-host connections run reno, want at least %d", reno, size - 1);
  /* and they carry data: a broadcast of 1 MiB, one message each way */
  enum { N = 1 << 18 };
  float *buf = malloc(N * sizeof *buf);
  for (int i = 0; i < N; i++)
    buf[i] = rank == 0 ? (float)(i % 1000) : -1.0f;
  CHECK_OK(dt_comm_broadcast(c, buf, N, DT_F32, 0));
  for (int i = 0; i < N; i++)
    CHECK(buf[i] == (float)(i % 1000), "element %d: %g", i, buf[i]);
  free(buf);
  dt_comm_destroy(c);
  return 0;
}

static int case_silent(int rank, int size, void *arg) {
  g_rank = rank;
  int stopped = *(const int *)arg;
  const char *secret = getenv("DTRAIN_JOB_SECRET");
  int port = atoi(getenv("DTRAIN_MASTER_PORT"));
  int64_t dl = dt__deadline_after_ms(30000);
  char key[64], val[128];
  dt__store *st = NULL;
  if (rank == 0) {
    dt__store_server *srv = NULL;
    int lfd = -1, lport = 0;
    CHECK_OK(dt__store_server_start("127.0.0.1", port, (const uint8_t *)secret, strlen(secret), size, 1000, &srv,
                                    NULL));
    CHECK_OK(dt__sock_listen("127.0.0.1", 0, &lfd, &lport));
    CHECK_OK(dt__store_connect("127.0.0.1", port, (const uint8_t *)secret, strlen(secret), rank, dl, &st));
    char rec[400];
    host_record(rec, sizeof rec);
    CHECK_OK(dt__store_set(st, "w/host/0", rec, strlen(rec), dl));
    snprintf(val, sizeof val, "127.0.0.1 %d", lport);
    CHECK_OK(dt__store_set(st, "w/tcp/0", val, strlen(val), dl));
    size_t n;
    if (stopped) {
      /* Rank 1 published its host record: it is about to connect. One heartbeat, then silence. */
      CHECK_OK(dt__store_wait(st, "w/host/1", val, sizeof val, &n, dl));
      dt__store_set_world(st, size);
      CHECK_OK(dt__store_heartbeat(st, dl));
    }
    CHECK_OK(dt__store_wait_flags(st, "test/done", val, sizeof val, &n, DT_STORE_WAIT_IGNORE_VERDICT, dl));
    dt__store_close(st);
    dt__store_server_stop(srv);
    close(lfd);
    return 0;
  }
  setenv("DTRAIN_TRANSPORT", "tcp", 1);
  dt_comm *c = NULL;
  int64_t t0 = dt_now_ns();
  dt_status rc = dt_comm_create(NULL, &c);
  int64_t ms = (dt_now_ns() - t0) / 1000000;
  char msg[2048];
  snprintf(msg, sizeof msg, "%s", dt_last_error());
  fprintf(stderr, "[rank 1] %s after %lld ms: %s: %s\n", stopped ? "stopped rank 0" : "stranger on rank 0's port",
          (long long)ms, dt_strerror(rc), msg);
  CHECK_OK(dt__store_connect("127.0.0.1", port, (const uint8_t *)secret, strlen(secret), 100, dl, &st));
  size_t n; /* read before saying done: rank 0 then stops the store */
  CHECK_OK(dt__store_get(st, "w/tcp/0", val, sizeof val - 1, &n, dl));
  val[n] = '\0';
  CHECK_OK(dt__store_set(st, "test/done", "1", 1, dl));
  dt__store_close(st);
  CHECK(rc != DT_OK && c == NULL, "joined a job whose rank 0 never answered");
  if (stopped) {
    CHECK(rc == DT_ERR_ABORTED || rc == DT_ERR_PEER, "status %s", dt_strerror(rc));
    CHECK(strstr(msg, "rank 0 failed: no heartbeat for 1000 ms"), "message: %s", msg);
    const char *me = strstr(msg, "rank 1: ");
    CHECK(me && !strstr(me + 1, "rank 1: "), "the message names rank 1 more than once: %s", msg);
    CHECK(ms < 2500, "took %lld ms: the verdict on rank 0 came after about 1000 ms", (long long)ms);
  } else {
    int lport = 0;
    CHECK(sscanf(val, "%*s %d", &lport) == 1, "address '%s'", val);
    snprintf(key, sizeof key, "connecting to rank 0 at 127.0.0.1:%d: ", lport);
    CHECK(rc == DT_ERR_TIMEOUT, "status %s", dt_strerror(rc));
    CHECK(strstr(msg, key), "message does not name rank 0 and its address (%s): %s", key, msg);
    CHECK(strstr(msg, "accepted the connection but did not answer the dtrain handshake"), "message: %s",
          msg);
    CHECK(ms >= 2900 && ms < 5000, "took %lld ms, the deadline is 3000", (long long)ms);
  }
  return 0;
}

/* shm: once the communicator exists, the pages of the segment its collectives use are in this
 * process's page table (shm_prefault), so a job's first calls do not pay for first touches. Two
 * ranks use both staging buffers of each rank (4 x 512 KiB) and the two rings between them (4 x
 * 256 KiB of slots each): at least 1024 of the mapping's pages must be present, where the
 * handshake alone touches a few. Counted with /proc/self/pagemap's present bit (bit 63). */
static int case_prefault(int rank, int size, void *arg) {
  (void)arg;
  (void)size;
  g_rank = rank;
  dt_comm *c = NULL;
  if (join(&c))
    return 1;
  FILE *maps = fopen("/proc/self/maps", "r");
  CHECK(maps, "open /proc/self/maps: %s", strerror(errno));
  int pm = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  CHECK(pm >= 0, "open /proc/self/pagemap: %s", strerror(errno));
  char line[512];
  size_t present = 0, pages = 0;
  int found = 0;
  while (fgets(line, sizeof line, maps)) {
    unsigned long lo, hi;
    if (!strstr(line, "/dev/shm/dtrain-") || sscanf(line, "%lx-%lx", &lo, &hi) != 2)
      continue;
    found++;
    for (unsigned long a = lo; a < hi; a += 4096, pages++) {
      uint64_t e = 0;
      CHECK(pread(pm, &e, sizeof e, (off_t)(a / 4096 * sizeof e)) == (ssize_t)sizeof e, "pagemap: %s", strerror(errno));
      present += e >> 63;
    }
  }
  fclose(maps);
  close(pm);
  CHECK(found == 1, "%d mappings of a dtrain segment in /proc/self/maps, expected 1", found);
  CHECK(present >= 1024, "%zu of the segment's %zu pages in the page table after setup, expected at least 1024",
        present, pages);
  CHECK_OK(dt_comm_barrier(c));
  dt_comm_destroy(c);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s p2p|sendrecv|fast|fastmismatch|prefault|split|kill|stop|nojoin|mismatch|stranger|silent|reno|"
                    "segments shm|tcp\n", argv[0]);
    return 2;
  }
  const char *cs = argv[1];
  g_tp = argv[2];
  setenv("DTRAIN_TIMEOUT_MS", "60000", 1);
  g_pids = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  int failures = 0;
  if (!strcmp(cs, "p2p") || !strcmp(cs, "sendrecv") || !strcmp(cs, "fast") || !strcmp(cs, "split")) {
    mp_body b = !strcmp(cs, "p2p") ? case_p2p : !strcmp(cs, "sendrecv") ? case_sendrecv
                : !strcmp(cs, "fast") ? case_allreduce : case_split;
    for (int n = 1; n <= 4; n++) {
      int f = mp_run(n, b, NULL, 100);
      fprintf(stderr, "%s %s with %d rank(s): %s\n", cs, g_tp, n, f ? "FAILED" : "ok");
      failures += f;
    }
  } else if (!strcmp(cs, "kill") || !strcmp(cs, "stop")) {
    setenv("DTRAIN_FAULT_TIMEOUT_MS", "1000", 1);
    for (int n = 2; n <= 3; n++) {
      int codes[8] = {0};
      mp_run_codes(n, !strcmp(cs, "kill") ? case_kill : case_stop, NULL, 60, codes);
      for (int r = 0; r < n; r++) {
        int want = r == n - 1 ? 128 + SIGKILL : 0;
        if (codes[r] != want) {
          fprintf(stderr, "%s %s n=%d: rank %d exited %d, want %d\n", cs, g_tp, n, r, codes[r], want);
          failures++;
        }
      }
    }
  } else if (!strcmp(cs, "prefault")) {
    failures += mp_run(2, case_prefault, NULL, 60);
  } else if (!strcmp(cs, "nojoin")) {
    failures += mp_run(3, case_nojoin, NULL, 60);
  } else if (!strcmp(cs, "fastmismatch")) {
    for (int which = 0; which < 2; which++)
      failures += mp_run(2, case_fastmismatch, &which, 60);
  } else if (!strcmp(cs, "mismatch")) {
    for (int which = 0; which < 2; which++)
      failures += mp_run(2, case_mismatch, &which, 60);
  } else if (!strcmp(cs, "stranger")) {
    failures += mp_run(3, case_stranger, NULL, 60);
    /* Eight silent strangers queued on every listening rank's port before the last rank connects:
     * their handshakes wait side by side with the rank's, so it joins at once (one at a time,
     * each stranger held the port for the handshake timeout and the rank's own attempts timed
     * out behind them). The deadline leaves no time for one-at-a-time. */
    setenv("DTRAIN_HANDSHAKE_TIMEOUT_MS", "2000", 1);
    setenv("DTRAIN_TIMEOUT_MS", "6000", 1);
    int hold = 8;
    failures += mp_run(3, case_stranger, &hold, 60);
    unsetenv("DTRAIN_HANDSHAKE_TIMEOUT_MS");
    unsetenv("DTRAIN_TIMEOUT_MS");
  } else if (!strcmp(cs, "segments")) {
    for (int small = 0; small < 2; small++)
      for (int n = 2; n <= 3; n++)
        failures += mp_run(n, case_segments, &small, 60);
    failures += mp_run(2, case_small_buffer, NULL, 60);
  } else if (!strcmp(cs, "reno")) {
    for (int n = 2; n <= 3; n++)
      failures += mp_run(n, case_reno, NULL, 60);
  } else if (!strcmp(cs, "silent")) {
    setenv("DTRAIN_TIMEOUT_MS", "3000", 1);
    setenv("DTRAIN_HANDSHAKE_TIMEOUT_MS", "300", 1);
    setenv("DTRAIN_FAULT_TIMEOUT_MS", "1000", 1);
    for (int stopped = 0; stopped < 2; stopped++)
      failures += mp_run(2, case_silent, &stopped, 40);
  } else {
    fprintf(stderr, "unknown case %s\n", cs);
    return 2;
  }
  printf("%s %s: %s\n", cs, g_tp, failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
