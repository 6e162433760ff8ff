/* comm/transport.h - what every transport provides. The collective algorithms (comm/coll/) call
 * only through this table, so adding a transport means adding one table in one folder
 * (comm/shm/, comm/tcp/, comm/mpi/) and one line in comm.c's list.
 *
 * Every message a transport carries is tagged with the fingerprint of the call that sent it;
 * the receiving side compares it with its own before accepting the bytes, which turns
 * mismatched calls across ranks into a DT_ERR_MISMATCH naming both sides instead of a hang or a
 * wrong answer. */
#ifndef DT_COMM_TRANSPORT_H
#define DT_COMM_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/comm.h"

/* Which call a message belongs to. Values are on the wire: append only. */
typedef enum dt__coll {
  DT_COLL_NONE = 0,
  DT_COLL_ALLREDUCE,
  DT_COLL_REDUCE,
  DT_COLL_BROADCAST,
  DT_COLL_ALLGATHER,
  DT_COLL_REDUCE_SCATTER,
  DT_COLL_GATHER,
  DT_COLL_SCATTER,
  DT_COLL_ALLTOALL,
  DT_COLL_BARRIER,
  DT_COLL_SEND, /* point to point; root holds the tag, seq counts messages on that pair */
  DT_COLL_SPLIT,
  DT_COLL_CREATE,
  DT_COLL_COUNT
} dt__coll;

/* Fingerprint of one call, 24 bytes on the wire (little-endian). */
typedef struct dt__fp {
  uint64_t seq;   /* collective number on this communicator, from 1 */
  uint64_t count; /* elements, as the caller passed them */
  uint8_t coll;   /* dt__coll */
  uint8_t dtype;  /* dt_dtype */
  uint8_t op;     /* dt_op (0 when the call has none) */
  uint8_t flags; /* DT__FP_WINDOW: in the shared window, root = element offset (coll_window);
                  * DT__FP_TUNE: the ranks' timings of a timed choice, after call seq (collectives.c) */
  int32_t root;  /* root rank, or tag for SEND, or -1 */
} dt__fp;
#define DT__FP_WINDOW 1
#define DT__FP_TUNE 2

const char *dt__coll_name(int coll);
/* "allreduce #17 with 4096 x f32 sum" / "broadcast #3 with 10 x i32 from root 1". */
void dt__fp_format(const dt__fp *fp, char *buf, size_t n);
int dt__fp_equal(const dt__fp *a, const dt__fp *b);
/* Whether a and b take the same place in the sequence of calls: the same seq, and both or
 * neither the timings that follow call seq (DT__FP_TUNE). A rank that sees a peer in another
 * call at its own place sees a mismatch; one that has finished call seq and sends its timings
 * while the peer is still in it does not. */
int dt__fp_same_place(const dt__fp *a, const dt__fp *b);

typedef struct dt_transport dt_transport; /* each transport defines its own struct */

typedef struct dt_transport_ops {
  const char *name; /* "shm", "tcp", "mpi": logs and DTRAIN_TRANSPORT */
  /* Connects this rank to every other rank of c (using c's store to exchange addresses).
   * Collective; bounded by c's deadline; on failure *out = NULL. */
  dt_status (*create)(dt_comm *c, dt_transport **out);
  /* Sends sn bytes to rank dst while receiving rn bytes from rank src, concurrently (so two
   * ranks exchanging large buffers never deadlock); dst or src may be -1 to skip that side, and
   * dst == src is allowed. sn/rn may be 0 (a message is still exchanged: barriers use this).
   * The received message must carry a fingerprint equal to *fp and exactly rn bytes, else
   * DT_ERR_MISMATCH with dt__comm_mismatch's message. A peer that closed or died gives
   * DT_ERR_PEER naming it; the deadline, DT_ERR_TIMEOUT naming the rank waited for; an abort
   * raised anywhere in the job (dt__comm_aborted), DT_ERR_ABORTED with the verdict. */
  dt_status (*sendrecv)(dt_transport *t, int dst, const void *sbuf, size_t sn, int src, void *rbuf,
                        size_t rn, const dt__fp *fp, int64_t deadline);
  /* How many messages of `bytes` bytes each sendrecvs can hand over to one peer that is not yet
   * receiving them (socket buffers, shm ring slots). The pipelined algorithms (ring.c, rhd.c)
   * send pieces ahead of the one they receive only as far as this allows. NULL or 0: a send may
   * wait for its matching receive (MPI's rendezvous), so nothing is sent ahead. */
  size_t (*queue_msgs)(dt_transport *t, size_t bytes);
  /* Optional whole-collective fast paths, NULL when absent. Same contract as the public call
   * (sendbuf may be DT_IN_PLACE); the fingerprint is already built. The comm layer uses them
   * when the algorithm choice says so. */
  dt_status (*allreduce)(dt_transport *t, const void *sbuf, void *rbuf, size_t count, dt_dtype dt, dt_op op,
                         const dt__fp *fp, int64_t deadline);
  /* One-round paths for small buffers (shm: every rank posts its piece in a slot and reads the
   * others'): allreduce, broadcast, allgather or reduce_scatter (kind), each with the contract of
   * its fast path (broadcast: rbuf is the buffer, root used; op unused where there is none);
   * valid at any count (pieces). */
  dt_status (*flat)(dt_transport *t, dt__coll kind, const void *sbuf, void *rbuf, size_t count, dt_dtype dt,
                    dt_op op, int root, const dt__fp *fp, int64_t deadline);
  dt_status (*broadcast)(dt_transport *t, void *buf, size_t count, dt_dtype dt, int root, const dt__fp *fp,
                         int64_t deadline);
  dt_status (*allgather)(dt_transport *t, const void *sbuf, void *rbuf, size_t count, dt_dtype dt,
                         const dt__fp *fp, int64_t deadline);
  dt_status (*reduce_scatter)(dt_transport *t, const void *sbuf, void *rbuf, size_t count, dt_dtype dt,
                              dt_op op, const dt__fp *fp, int64_t deadline);
  dt_status (*barrier)(dt_transport *t, const dt__fp *fp, int64_t deadline);
  /* Optional: the bytes per rank (an allgather's block, a broadcast's buffer) from which the
   * fast allgather and broadcast copy once between the ranks' own buffers (shm:
   * process_vm_readv/writev), 0 when they never do; the same on every rank. */
  size_t (*single_copy)(dt_transport *t);
  /* Optional: the shared window (dt_comm_window). Collective: maps `bytes` (a multiple of 64)
   * per rank that every rank can read and write, sets *out to this rank's part (zeroed, 64-byte
   * aligned). Fails on every rank alike (rank 0 says whether all mapped it). */
  dt_status (*window)(dt_transport *t, size_t bytes, void **out, int64_t deadline);
  /* With window, after it succeeded: rank r's part as mapped in this process. */
  void *(*window_part)(dt_transport *t, int r);
  /* Optional with window: allreduce, reduce_scatter or allgather (kind) in place at element
   * off of every rank's window part, count elements (per block for the last two), with the
   * public calls' in-place layout; same off and count everywhere (the fingerprint carries off). */
  dt_status (*coll_window)(dt_transport *t, dt__coll kind, size_t off, size_t count, dt_dtype dt, dt_op op,
                           const dt__fp *fp, int64_t deadline);
  /* 1 when the fast paths above beat dtrain's own algorithms at every size, so they are used
   * whenever present (mpi: the library's tuned collectives); 0 lets the size decide. */
  int fast_paths_always;
  /* Closes every connection and frees t; never blocks long. Accepts NULL. */
  void (*destroy)(dt_transport *t);
} dt_transport_ops;

extern const dt_transport_ops dt__transport_shm;
extern const dt_transport_ops dt__transport_tcp;
#ifdef DTRAIN_HAVE_MPI
extern const dt_transport_ops dt__transport_mpi;
#endif

#endif
