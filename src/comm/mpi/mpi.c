/* mpi.c - the Open MPI transport: dtrain's collectives on a real cluster's MPI.
 *
 * Point-to-point messages travel as two MPI messages (a 32-byte header holding the fingerprint
 * and length, then the payload) so that mismatched calls are caught exactly as on shm and tcp.
 * Collectives that MPI has (allreduce, broadcast, allgather, reduce_scatter, barrier) go to
 * MPI's own tuned algorithms after one small MPI_Iallreduce that checks all ranks' fingerprints
 * agree (on disagreement an allgather of the fingerprints names both sides). f16/bf16 sums are
 * widened to f32 around MPI so they round once.
 *
 * Every wait is a loop of MPI_Test with the communicator's deadline and the job's abort flag, so
 * a dead or stopped peer cannot make us wait past the deadline (Open MPI itself usually ends the
 * job first when a process dies). Calls into MPI are serialized by one process-wide mutex, which
 * is all MPI_THREAD_SERIALIZED asks.
 *
 * Not here: launching (mpirun does that) and the rendezvous store's address, which comm.c gets
 * from dt__mpi_bootstrap below when the job was started by mpirun. */
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "comm/coll/coll.h"
#include "comm/mpi/mpi_boot.h"

struct dt_transport {
  dt_comm *c;
  MPI_Comm mc;
};

typedef struct mpi_hdr {
  dt__fp fp;
  uint64_t len;
} mpi_hdr;

enum { TAG_HDR = 7001, TAG_DATA = 7002, TAG_GROUP = 7003 };

static pthread_mutex_t mpi_lock = PTHREAD_MUTEX_INITIALIZER;
static int mpi_we_initialized;

/* MPI_Finalize waits for every rank. Once the failure detector has declared a rank gone or not
 * answering, that rank may be hung or stopped (SIGSTOP) and never come, so the process would not
 * exit: it then leaves without finalizing, and mpirun, seeing a rank exit so, stops the others
 * and exits non-zero. After a failure every rank saw (a mismatch, an abort) all finalize. */
static void mpi_finalize_at_exit(void) {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin && !dt__health_peer_lost())
    MPI_Finalize();
}

static dt_status mpi_error(int rc, const char *what) {
  char msg[MPI_MAX_ERROR_STRING];
  int n = 0;
  MPI_Error_string(rc, msg, &n);
  return dt_set_error(DT_ERR_SYSTEM, "%s: %s", what, msg);
}

/* Makes sure MPI is initialized (by us, once, with MPI_THREAD_SERIALIZED at least). */
static dt_status mpi_ensure_init(void) {
  int init = 0;
  MPI_Initialized(&init);
  if (init)
    return DT_OK;
  int provided = 0;
  int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
  if (rc != MPI_SUCCESS)
    return mpi_error(rc, "MPI_Init_thread");
  if (provided < MPI_THREAD_SERIALIZED)
    return dt_set_error(DT_ERR_UNSUPPORTED, "this MPI provides thread level %d; dtrain needs MPI_THREAD_SERIALIZED",
                        provided);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  mpi_we_initialized = 1;
  atexit(mpi_finalize_at_exit);
  return DT_OK;
}

dt_status dt__mpi_bootstrap(int *rank, int *size, int *local_rank, int *local_size) {
  pthread_mutex_lock(&mpi_lock);
  dt_status st = mpi_ensure_init();
  if (st == DT_OK) {
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
    MPI_Comm node;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, *rank, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
      MPI_Comm_rank(node, local_rank);
      MPI_Comm_size(node, local_size);
      MPI_Comm_free(&node);
    } else {
      *local_rank = *rank;
      *local_size = *size;
    }
  }
  pthread_mutex_unlock(&mpi_lock);
  return st;
}

/* A bitwise-or allreduce to which only the root contributes, not MPI_Bcast: after any MPI_Bcast
 * (4-300 bytes, 2 ranks) Open MPI 4.1's later 4-byte MPI_Allreduce in the same job ran 0.96-1.00
 * us instead of 0.55-0.57 on the Zen 5 guest, 0.23-0.25 instead of 0.20 when its CPUs sat close;
 * after the allreduce, 0.20 (bench/results/mpirun-bound-2026-12-07e-zen5.txt). A program that
 * uses MPI beside dtrain keeps its own calls' speed. */
dt_status dt__mpi_bcast_bytes(void *buf, size_t n, int root) {
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  if (me != root)
    memset(buf, 0, n);
  pthread_mutex_lock(&mpi_lock);
  int rc = MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_BYTE, MPI_BOR, MPI_COMM_WORLD);
  pthread_mutex_unlock(&mpi_lock);
  return rc == MPI_SUCCESS ? DT_OK : mpi_error(rc, "MPI_Allreduce broadcasting the store address");
}

/* Waits for reqs with the deadline and the abort flag; yields the core between tests. */
static dt_status mpi_wait(dt_transport *t, int n, MPI_Request *reqs, int peer, const dt__fp *fp, int64_t deadline) {
  int spins = 0;
  for (;;) {
    int done = 0;
    pthread_mutex_lock(&mpi_lock);
    int rc = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
    pthread_mutex_unlock(&mpi_lock);
    if (rc != MPI_SUCCESS)
      return mpi_error(rc, "MPI_Testall");
    if (done)
      return DT_OK;
    if (dt__comm_aborted(t->c))
      return dt__comm_abort_status(t->c);
    if (dt__expired(deadline)) {
      char what[128], who[64] = "the other ranks";
      dt__fp_format(fp, what, sizeof what);
      if (peer >= 0)
        dt__comm_peer_name(t->c, peer, who, sizeof who);
      return dt_set_error(DT_ERR_TIMEOUT, "%s: no answer from %s before the deadline (mpi)", what, who);
    }
    if (++spins > 64) {
      if (spins > 4096)
        dt__sleep_ns(50000);
      else
        sched_yield();
    }
  }
}

static dt_status mpi_create(dt_comm *c, dt_transport **out) {
  *out = NULL;
  int wrank = -1, wsize = 0;
  DT_CHECK(dt__mpi_bootstrap(&wrank, &wsize, &(int){0}, &(int){0}));
  if (c->env.world_size != wsize || c->world_ranks[c->rank] != wrank)
    return dt_set_error(DT_ERR_INVALID,
                        "transport mpi: dtrain world rank %d of %d is MPI rank %d of %d; start the job with "
                        "mpirun so that both agree",
                        c->world_ranks[c->rank], c->env.world_size, wrank, wsize);
  dt_transport *t = dt__calloc(sizeof *t);
  if (!t)
    return DT_ERR_NOMEM;
  t->c = c;
  pthread_mutex_lock(&mpi_lock);
  MPI_Group world, group;
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  int rc = MPI_Group_incl(world, c->size, c->world_ranks, &group);
  if (rc == MPI_SUCCESS)
    rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, TAG_GROUP, &t->mc);
  MPI_Group_free(&world);
  if (rc == MPI_SUCCESS)
    MPI_Group_free(&group);
  if (rc == MPI_SUCCESS)
    MPI_Comm_set_errhandler(t->mc, MPI_ERRORS_RETURN);
  pthread_mutex_unlock(&mpi_lock);
  if (rc != MPI_SUCCESS) {
    dt__free(t);
    return mpi_error(rc, "MPI_Comm_create_group");
  }
  *out = t;
  return DT_OK;
}

static void mpi_destroy(dt_transport *t) {
  if (!t)
    return;
  pthread_mutex_lock(&mpi_lock);
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin && t->mc != MPI_COMM_NULL)
    MPI_Comm_free(&t->mc);
  pthread_mutex_unlock(&mpi_lock);
  dt__free(t);
}

/* MPI counts are int: payloads above 2 GiB go as several messages. */
#define MPI_PIECE ((size_t)1 << 30)

static dt_status mpi_sendrecv(dt_transport *t, int dst, const void *sbuf, size_t sn, int src, void *rbuf, size_t rn,
                              const dt__fp *fp, int64_t deadline) {
  mpi_hdr sh = {.fp = *fp, .len = sn}, rh;
  memset(&rh, 0, sizeof rh);
  MPI_Request reqs[2];
  int n = 0;
  pthread_mutex_lock(&mpi_lock);
  if (src >= 0)
    MPI_Irecv(&rh, sizeof rh, MPI_BYTE, src, TAG_HDR, t->mc, &reqs[n++]);
  if (dst >= 0)
    MPI_Isend(&sh, sizeof sh, MPI_BYTE, dst, TAG_HDR, t->mc, &reqs[n++]);
  pthread_mutex_unlock(&mpi_lock);
  DT_CHECK(mpi_wait(t, n, reqs, src >= 0 ? src : dst, fp, deadline));
  if (src >= 0) {
    if (!dt__fp_equal(&rh.fp, fp))
      return dt__comm_mismatch(t->c, src, &rh.fp, fp);
    if (rh.len != rn) {
      char what[128], who[64];
      dt__fp_format(fp, what, sizeof what);
      dt__comm_peer_name(t->c, src, who, sizeof who);
      return dt_set_error(DT_ERR_MISMATCH, "%s: %s sent %llu bytes, expected %zu", what, who,
                          (unsigned long long)rh.len, rn);
    }
  }
  size_t soff = 0, roff = 0;
  while ((dst >= 0 && soff < sn) || (src >= 0 && roff < rn)) {
    n = 0;
    pthread_mutex_lock(&mpi_lock);
    if (src >= 0 && roff < rn) {
      size_t k = DT_MIN(rn - roff, MPI_PIECE);
      MPI_Irecv((char *)rbuf + roff, (int)k, MPI_BYTE, src, TAG_DATA, t->mc, &reqs[n++]);
      roff += k;
    }
    if (dst >= 0 && soff < sn) {
      size_t k = DT_MIN(sn - soff, MPI_PIECE);
      MPI_Isend((const char *)sbuf + soff, (int)k, MPI_BYTE, dst, TAG_DATA, t->mc, &reqs[n++]);
      soff += k;
    }
    pthread_mutex_unlock(&mpi_lock);
    DT_CHECK(mpi_wait(t, n, reqs, src >= 0 ? src : dst, fp, deadline));
  }
  return DT_OK;
}

/* All ranks check that they run the same call: min and max of a hash of the fingerprint in one
 * small allreduce; on disagreement every rank gathers all fingerprints to name two that differ. */
static dt_status mpi_check_fp(dt_transport *t, const dt__fp *fp, int64_t deadline) {
  if (t->c->size == 1)
    return DT_OK;
  uint64_t h = dt_crc32c(0, fp, sizeof *fp) | ((uint64_t)dt_crc32c(7, fp, sizeof *fp) << 32);
  uint64_t v[2] = {h, ~h}, r[2];
  MPI_Request req;
  pthread_mutex_lock(&mpi_lock);
  MPI_Iallreduce(v, r, 2, MPI_UINT64_T, MPI_MIN, t->mc, &req);
  pthread_mutex_unlock(&mpi_lock);
  DT_CHECK(mpi_wait(t, 1, &req, -1, fp, deadline));
  if (r[0] == h && ~r[1] == h)
    return DT_OK;
  dt__fp *all = dt__alloc(sizeof *all * (size_t)t->c->size);
  if (!all)
    return DT_ERR_NOMEM;
  pthread_mutex_lock(&mpi_lock);
  MPI_Iallgather(fp, sizeof *fp, MPI_BYTE, all, sizeof *fp, MPI_BYTE, t->mc, &req);
  pthread_mutex_unlock(&mpi_lock);
  dt_status st = mpi_wait(t, 1, &req, -1, fp, deadline);
  if (st == DT_OK) {
    int other = 0;
    for (int i = 0; i < t->c->size; i++)
      if (!dt__fp_equal(&all[i], fp)) {
        other = i;
        break;
      }
    st = dt__comm_mismatch(t->c, other, &all[other], fp);
  }
  dt__free(all);
  return st;
}

static MPI_Datatype mpi_type(dt_dtype t) {
  switch (t) {
  case DT_F32: return MPI_FLOAT;
  case DT_F64: return MPI_DOUBLE;
  case DT_I32: return MPI_INT32_T;
  case DT_I64: return MPI_INT64_T;
  case DT_U8: return MPI_UINT8_T;
  default: return MPI_UINT16_T; /* f16/bf16: reduced by mpi_half_op */
  }
}

/* User ops: f16/bf16 min/max (their sums are widened to f32 instead, to round once), and u8 sum
 * and prod, which must wrap modulo 256 as on shm and tcp: Open MPI 4.1's AVX op component adds
 * uint8 with saturation once a buffer has 64 elements or more (200 + 100 = 255, not 44). */
static void mpi_own_op(void *in, void *inout, int *len, MPI_Datatype *dt, dt_dtype t, dt_op op) {
  (void)dt;
  dt__reduce(inout, in, (size_t)*len, t, op);
}
static void op_f16_min(void *a, void *b, int *n, MPI_Datatype *d) { mpi_own_op(a, b, n, d, DT_F16, DT_MIN); }
static void op_f16_max(void *a, void *b, int *n, MPI_Datatype *d) { mpi_own_op(a, b, n, d, DT_F16, DT_MAX); }
static void op_bf16_min(void *a, void *b, int *n, MPI_Datatype *d) { mpi_own_op(a, b, n, d, DT_BF16, DT_MIN); }
static void op_bf16_max(void *a, void *b, int *n, MPI_Datatype *d) { mpi_own_op(a, b, n, d, DT_BF16, DT_MAX); }
static void op_u8_sum(void *a, void *b, int *n, MPI_Datatype *d) { mpi_own_op(a, b, n, d, DT_U8, DT_SUM); }
static void op_u8_prod(void *a, void *b, int *n, MPI_Datatype *d) { mpi_own_op(a, b, n, d, DT_U8, DT_PROD); }

static MPI_Op mpi_op(dt_dtype t, dt_op op, int *user) {
  *user = 0;
  MPI_User_function *f = NULL;
  if (t == DT_F16 || t == DT_BF16)
    f = t == DT_F16 ? (op == DT_MIN ? op_f16_min : op_f16_max) : (op == DT_MIN ? op_bf16_min : op_bf16_max);
  else if (t == DT_U8 && (op == DT_SUM || op == DT_PROD))
    f = op == DT_SUM ? op_u8_sum : op_u8_prod;
  if (f) {
    MPI_Op o;
    MPI_Op_create(f, 1, &o);
    *user = 1;
    return o;
  }
  switch (op) {
  case DT_PROD: return MPI_PROD;
  case DT_MIN: return MPI_MIN;
  case DT_MAX: return MPI_MAX;
  default: return MPI_SUM;
  }
}

/* Runs one MPI collective on count elements (split into int-sized pieces by the caller). */
static dt_status mpi_allreduce_piece(dt_transport *t, const void *s, void *r, size_t count, dt_dtype dt, dt_op op,
                                     const dt__fp *fp, int64_t deadline) {
  int user = 0;
  MPI_Request req;
  pthread_mutex_lock(&mpi_lock);
  MPI_Op mop = mpi_op(dt, op, &user);
  int rc = MPI_Iallreduce(s == r ? MPI_IN_PLACE : s, r, (int)count, mpi_type(dt), mop, t->mc, &req);
  pthread_mutex_unlock(&mpi_lock);
  dt_status st = rc == MPI_SUCCESS ? mpi_wait(t, 1, &req, -1, fp, deadline) : mpi_error(rc, "MPI_Iallreduce");
  if (user) {
    pthread_mutex_lock(&mpi_lock);
    MPI_Op_free(&mop);
    pthread_mutex_unlock(&mpi_lock);
  }
  return st;
}

static dt_status mpi_allreduce(dt_transport *t, const void *sbuf, void *rbuf, size_t count, dt_dtype dt, dt_op op,
                               const dt__fp *fp, int64_t deadline) {
  DT_CHECK(mpi_check_fp(t, fp, deadline));
  const void *s = sbuf ? sbuf : rbuf;
  if (count == 0)
    return DT_OK;
  dt_op base = op == DT_AVG ? DT_SUM : op;
  size_t esz = dt_dtype_size(dt);
  if (dt__coll_wide(dt, op)) {
    /* Widen to f32 so the sum rounds once, in pieces to bound the scratch. */
    const size_t piece = (size_t)1 << 22;
    float *w = dt__coll_scratch(t->c, 0, DT_MIN(count, piece) * sizeof(float));
    if (!w)
      return DT_ERR_NOMEM;
    for (size_t off = 0; off < count; off += piece) {
      size_t k = DT_MIN(piece, count - off);
      dt__to_f32(w, (const char *)s + off * esz, k, dt);
      DT_CHECK(mpi_allreduce_piece(t, w, w, k, DT_F32, base, fp, deadline));
      if (op == DT_AVG)
        dt__reduce_finish(w, k, DT_F32, DT_AVG, t->c->size);
      dt__from_f32((char *)rbuf + off * esz, w, k, dt);
    }
    return DT_OK;
  }
  for (size_t off = 0; off < count; off += MPI_PIECE / 8) {
    size_t k = DT_MIN(MPI_PIECE / 8, count - off);
    const char *sp = (const char *)s + off * esz;
    char *rp = (char *)rbuf + off * esz;
    DT_CHECK(mpi_allreduce_piece(t, sp == rp ? rp : sp, rp, k, dt, base, fp, deadline));
  }
  if (op == DT_AVG)
    dt__reduce_finish(rbuf, count, dt, DT_AVG, t->c->size);
  return DT_OK;
}

static dt_status mpi_broadcast(dt_transport *t, void *buf, size_t count, dt_dtype dt, int root, const dt__fp *fp,
                               int64_t deadline) {
  DT_CHECK(mpi_check_fp(t, fp, deadline));
  size_t bytes = count * dt_dtype_size(dt);
  for (size_t off = 0; off < bytes; off += MPI_PIECE) {
    size_t k = DT_MIN(MPI_PIECE, bytes - off);
    MPI_Request req;
    pthread_mutex_lock(&mpi_lock);
    int rc = MPI_Ibcast((char *)buf + off, (int)k, MPI_BYTE, root, t->mc, &req);
    pthread_mutex_unlock(&mpi_lock);
    if (rc != MPI_SUCCESS)
      return mpi_error(rc, "MPI_Ibcast");
    DT_CHECK(mpi_wait(t, 1, &req, root, fp, deadline));
  }
  return DT_OK;
}

static dt_status mpi_allgather(dt_transport *t, const void *sbuf, void *rbuf, size_t count, dt_dtype dt,
                               const dt__fp *fp, int64_t deadline) {
  DT_CHECK(mpi_check_fp(t, fp, deadline));
  size_t bytes = count * dt_dtype_size(dt);
  if (bytes > MPI_PIECE)
    return dt_set_error(DT_ERR_UNSUPPORTED, "transport mpi: allgather blocks above 1 GiB per rank");
  char *own = (char *)rbuf + (size_t)t->c->rank * bytes;
  const void *s = (sbuf == NULL || sbuf == own) ? MPI_IN_PLACE : sbuf;
  MPI_Request req;
  pthread_mutex_lock(&mpi_lock);
  int rc = MPI_Iallgather(s, (int)bytes, MPI_BYTE, rbuf, (int)bytes, MPI_BYTE, t->mc, &req);
  pthread_mutex_unlock(&mpi_lock);
  if (rc != MPI_SUCCESS)
    return mpi_error(rc, "MPI_Iallgather");
  return mpi_wait(t, 1, &req, -1, fp, deadline);
}

/* One MPI_Ireduce_scatter_block: s holds size * count elements, r receives count; separate
 * buffers (MPI's in-place form is not used). */
static dt_status mpi_reduce_scatter_piece(dt_transport *t, const void *s, void *r, size_t count, dt_dtype dt,
                                          dt_op op, const dt__fp *fp, int64_t deadline) {
  int user = 0;
  MPI_Request req;
  pthread_mutex_lock(&mpi_lock);
  MPI_Op mop = mpi_op(dt, op, &user);
  int rc = MPI_Ireduce_scatter_block(s, r, (int)count, mpi_type(dt), mop, t->mc, &req);
  pthread_mutex_unlock(&mpi_lock);
  dt_status st = rc == MPI_SUCCESS ? mpi_wait(t, 1, &req, -1, fp, deadline) : mpi_error(rc, "MPI_Ireduce_scatter_block");
  if (user) {
    pthread_mutex_lock(&mpi_lock);
    MPI_Op_free(&mop);
    pthread_mutex_unlock(&mpi_lock);
  }
  return st;
}

/* Block r of the input reduces into rank r's output. One call straight between the caller's
 * buffers where MPI can take it; else in pieces of every block, gathered into scratch: f16/bf16
 * sums, products and averages widened to f32 (rounded once, as the other transports do), blocks
 * above 128 Mi elements, and in place (the input's block 0 is the output). In place, piece k of
 * the output overwrites piece k of block 0 only after every block's piece k was copied out. */
static dt_status mpi_reduce_scatter(dt_transport *t, const void *sbuf, void *rbuf, size_t count, dt_dtype dt,
                                    dt_op op, const dt__fp *fp, int64_t deadline) {
  DT_CHECK(mpi_check_fp(t, fp, deadline));
  if (count == 0)
    return DT_OK;
  const int n = t->c->size;
  const char *s = sbuf ? sbuf : rbuf;
  const size_t esz = dt_dtype_size(dt);
  const bool wide = dt__coll_wide(dt, op);
  const dt_op base = op == DT_AVG ? DT_SUM : op;
  if (!wide && count <= MPI_PIECE / 8 && s != (const char *)rbuf) {
    DT_CHECK(mpi_reduce_scatter_piece(t, s, rbuf, count, dt, base, fp, deadline));
    if (op == DT_AVG)
      dt__reduce_finish(rbuf, count, dt, DT_AVG, n);
    return DT_OK;
  }
  const dt_dtype wt = wide ? DT_F32 : dt;
  const size_t wes = dt_dtype_size(wt);
  /* elements per block per piece: the scratch holds n pieces of at most 16 MiB together */
  const size_t piece = DT_MIN(count, DT_MAX((size_t)1, ((size_t)16 << 20) / wes / (size_t)n));
  char *in = dt__coll_scratch(t->c, 0, (size_t)n * piece * wes), *out = dt__coll_scratch(t->c, 1, piece * wes);
  if (!in || !out)
    return DT_ERR_NOMEM;
  for (size_t off = 0; off < count; off += piece) {
    size_t k = DT_MIN(piece, count - off);
    for (int r = 0; r < n; r++) {
      const char *from = s + ((size_t)r * count + off) * esz;
      if (wide)
        dt__to_f32((float *)(in + (size_t)r * k * wes), from, k, dt);
      else
        memcpy(in + (size_t)r * k * wes, from, k * esz);
    }
    DT_CHECK(mpi_reduce_scatter_piece(t, in, out, k, wt, base, fp, deadline));
    if (op == DT_AVG)
      dt__reduce_finish(out, k, wt, DT_AVG, n);
    if (wide)
      dt__from_f32((char *)rbuf + off * esz, (const float *)out, k, dt);
    else
      memcpy((char *)rbuf + off * esz, out, k * esz);
  }
  return DT_OK;
}

static dt_status mpi_barrier(dt_transport *t, const dt__fp *fp, int64_t deadline) {
  DT_CHECK(mpi_check_fp(t, fp, deadline));
  MPI_Request req;
  pthread_mutex_lock(&mpi_lock);
  int rc = MPI_Ibarrier(t->mc, &req);
  pthread_mutex_unlock(&mpi_lock);
  if (rc != MPI_SUCCESS)
    return mpi_error(rc, "MPI_Ibarrier");
  return mpi_wait(t, 1, &req, -1, fp, deadline);
}

const dt_transport_ops dt__transport_mpi = {
    .name = "mpi",
    .create = mpi_create,
    .sendrecv = mpi_sendrecv,
    .allreduce = mpi_allreduce,
    .broadcast = mpi_broadcast,
    .allgather = mpi_allgather,
    .reduce_scatter = mpi_reduce_scatter,
    .barrier = mpi_barrier,
    .fast_paths_always = 1,
    .destroy = mpi_destroy,
};
