/* dtrain/comm.h - the communicator and its collectives (what MPI, Gloo and NCCL give).
 *
 * A communicator joins `size` ranks (processes) through a rendezvous store and a transport
 * (shm on one host, tcp across hosts, mpi when built with Open MPI). Every call below that
 * talks to other ranks is collective over the communicator unless it says otherwise, blocks the
 * caller until done, and has a deadline: if a peer exits, is killed, hangs or calls something
 * different, the call returns an error whose dt_last_error() names the rank and the operation,
 * e.g. "rank 2 called allreduce #17 with 4096 x f32 sum, rank 0 called allreduce #17 with
 * 8192 x f32 sum". After any error the communicator is broken: destroy it.
 *
 * Buffers are borrowed for the duration of the call; for the nonblocking variants, until
 * dt_request_wait() returns or dt_request_test() reports completion.
 * A communicator may be used by one application thread at a time. */
#ifndef DTRAIN_COMM_H
#define DTRAIN_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_dtype { DT_F32, DT_F64, DT_F16, DT_BF16, DT_I32, DT_I64, DT_U8, DT_DTYPE_COUNT } dt_dtype;
/* f16 and bf16 are reduced in f32 and rounded once to nearest-even. Integer sums and products
 * wrap (i32/i64 two's complement, u8 modulo 256) on every transport. avg = sum / size (integers
 * truncate toward zero): the wrapped sum divided, so the u8 avg of 200 and 164 is 108 / 2 = 54. */
typedef enum dt_op { DT_SUM, DT_PROD, DT_MIN, DT_MAX, DT_AVG, DT_OP_COUNT } dt_op;

size_t dt_dtype_size(dt_dtype t);      /* 0 for an invalid dtype */
const char *dt_dtype_name(dt_dtype t); /* "f32", ... */
const char *dt_op_name(dt_op op);      /* "sum", ... */
/* Parse "f32"/"float32"/"bf16"... and "sum"/"avg"...; DT_ERR_INVALID on unknown names. */
dt_status dt_dtype_parse(const char *s, dt_dtype *out);
dt_status dt_op_parse(const char *s, dt_op *out);

/* Pass as sendbuf to operate in place on recvbuf. For allgather/gather in place, the rank's own
 * block is already at its slot of recvbuf (passing that slot's address as sendbuf is the same);
 * for reduce_scatter in place, recvbuf holds the full input and the result lands at its start.
 * A sendbuf that is recvbuf itself is still read as a send buffer, so it works on every
 * collective: the same as DT_IN_PLACE for allreduce, reduce, reduce_scatter and alltoall, while
 * allgather's and gather's block is then recvbuf's first count elements (moved to the rank's slot
 * before anything arrives) and scatter's root takes its own block from its slot. An allgather's or
 * gather root's sendbuf that overlaps recvbuf anywhere is moved to the rank's slot first, so it
 * works too. Any other overlap of sendbuf and recvbuf is DT_ERR_INVALID (it would read what it had
 * already written). */
#define DT_IN_PLACE ((const void *)0)

typedef struct dt_comm dt_comm;
typedef struct dt_request dt_request;

/* Largest world size dt_comm_create accepts (a typo'd DTRAIN_WORLD_SIZE is refused at once
 * instead of sizing per-rank tables by it): 1M ranks, about 64 MB of tables on the rank that
 * hosts the store, and above `dtrain run`'s own limits per job it can actually form. */
#define DT_COMM_WORLD_MAX (1 << 20)

/* How to join a job. dt_comm_config_init() fills every field with "take it from the
 * environment": DTRAIN_RANK / DTRAIN_WORLD_SIZE / DTRAIN_LOCAL_RANK / DTRAIN_LOCAL_WORLD_SIZE /
 * DTRAIN_MASTER_ADDR / DTRAIN_MASTER_PORT, else torchrun's RANK / WORLD_SIZE / LOCAL_RANK /
 * MASTER_ADDR / MASTER_PORT, else Open MPI's OMPI_COMM_WORLD_*, else Slurm's SLURM_PROCID /
 * SLURM_NTASKS / SLURM_LOCALID. No variables at all means a single-rank job. */
typedef struct dt_comm_config {
  int rank;             /* -1: from the environment */
  int world_size;       /* -1: from the environment; at most DT_COMM_WORLD_MAX */
  int local_rank;       /* -1: from the environment (or derived from host names) */
  const char *store_addr; /* host of the rendezvous store; NULL: environment */
  int store_port;         /* 0: environment */
  int host_store;         /* -1: rank 0 hosts it (default); 0: it runs elsewhere; 1: this rank hosts it */
  const char *secret;     /* job secret; NULL: DTRAIN_JOB_SECRET or the file named by
                             DTRAIN_JOB_SECRET_FILE. Never logged. */
  const char *transport;  /* "shm", "tcp", "mpi" or NULL: DTRAIN_TRANSPORT, else shm when all
                             ranks share a host and tcp otherwise */
  const char *bind_addr;  /* tcp: address or interface name to listen on; NULL: DTRAIN_BIND_ADDR /
                             DTRAIN_IFNAME, else the address this host uses to reach the store */
  const char *job_id;     /* names shared-memory segments; NULL: DTRAIN_JOB_ID, else derived */
  int timeout_ms;         /* deadline of every blocking call; 0: DTRAIN_TIMEOUT_MS, else 300000 */
  int fault_timeout_ms;   /* a rank with no heartbeat for this long is declared failed;
                             0: DTRAIN_FAULT_TIMEOUT_MS, else 10000 */
  const char *bind;       /* "auto": pin each local rank to its share of the CPUs, "none": leave
                             them; NULL: DTRAIN_BIND, else none */
} dt_comm_config;

void dt_comm_config_init(dt_comm_config *cfg);

/* Joins the job described by cfg (NULL: all from the environment). Collective over all ranks;
 * blocks until every rank has joined or the deadline passes (the error then names the ranks that
 * never joined). On failure *out = NULL. A job may destroy its communicator and create a new one
 * back to back, any number of times: the n-th create of each rank meets the n-th of the others,
 * so every rank must create and destroy the same number of times. A second process with the rank
 * of a running member is refused (DT_ERR_STATE, "rank R is already in this job") and the job goes
 * on; a world size above DT_COMM_WORLD_MAX is DT_ERR_INVALID. */
dt_status dt_comm_create(const dt_comm_config *cfg, dt_comm **out);
/* Leaves the job; not collective. Never blocks long, except on the rank hosting the rendezvous
 * store (rank 0 unless configured otherwise), which keeps serving until every other rank left or
 * was declared failed: at most the communicator's timeout, or about one fault timeout after a
 * failure. Accepts NULL. */
void dt_comm_destroy(dt_comm *c);
/* Stops the job because of a failure on this rank that the other ranks cannot see (a file that
 * could not be written, bad data): every rank's current or next call fails with DT_ERR_ABORTED,
 * its message naming this rank and `reason`, instead of waiting for this rank until the deadline.
 * Returns DT_ERR_ABORTED (with the job's verdict; the first failure raised wins). Not collective. */
dt_status dt_comm_abort(dt_comm *c, const char *reason);

int dt_comm_rank(const dt_comm *c);
int dt_comm_size(const dt_comm *c);
int dt_comm_local_rank(const dt_comm *c);
int dt_comm_local_size(const dt_comm *c);
const char *dt_comm_transport(const dt_comm *c); /* "shm", "tcp", "mpi" */
/* Changes the deadline of later calls on this communicator (ms > 0). Local. */
dt_status dt_comm_set_timeout(dt_comm *c, int timeout_ms);

/* Splits into sub-communicators: ranks with the same color form one, ordered by (key, rank).
 * color < 0 (DT_COMM_UNDEFINED) leaves the rank out: *out = NULL. Collective over c, in order
 * with its other collectives: the colors and keys go round as an allgather of c (2 x i32), so a
 * rank making another call meanwhile is a DT_ERR_MISMATCH naming both. A split may outlive c:
 * destroying c first leaves the split working (and the rendezvous store, if this rank hosts it,
 * up until the last of them is destroyed). */
#define DT_COMM_UNDEFINED (-1)
dt_status dt_comm_split(dt_comm *c, int color, int key, dt_comm **out);

/* Collectives. count is in elements of dtype. Algorithms are chosen by size and transport;
 * DTRAIN_ALGO, read when a communicator is made (dt_comm_create, dt_comm_split), overrides:
 * "ring", "rd", "rhd", "flat", "shm" for allreduce; "coll=name" items, comma-separated,
 * override others: "broadcast=chain,allgather=ring" (broadcast: tree, chain, shm, flat; allgather:
 * ring, bruck, shm, flat; reduce_scatter: ring, rhd, shm, flat; barrier: dissem, shm; "auto"
 * everywhere; shm and flat only on the shm transport). An unknown name makes every collective
 * fail with DT_ERR_INVALID naming it.
 * Every rank must choose the same: dt_comm_create fails on every rank with DT_ERR_MISMATCH, naming
 * both values, when one rank's DTRAIN_ALGO chooses another algorithm for any collective (a
 * spelling that chooses the same, "ring" and "allreduce=ring", is fine).
 * On shm, buffers of 64 KiB and more are copied straight between the ranks' memory; a buffer of
 * 4 MiB or more that such a call meets a second time is collapsed onto transparent huge pages
 * (madvise(MADV_COLLAPSE), once, at most 256 MiB per call; contents unchanged), which makes later
 * calls on it faster and costs the calls that do it up to a few ms per MiB. DTRAIN_SHM_THP=off
 * leaves memory alone. On a Zen 4 CPU (or with DTRAIN_SHM_PIPE=on), a 2-rank shm communicator
 * whose ranks each have a CPU (and may copy between each other) also keeps four pipe descriptors
 * (its own pipe and the other rank's), through which allreduces under 2 MiB and allgathers of
 * blocks under 1 MiB move their data; elsewhere, or with DTRAIN_SHM_PIPE=off, it makes none
 * (docs/TRANSPORTS.md, "Single copies"). */
dt_status dt_comm_allreduce(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t, dt_op op);
dt_status dt_comm_reduce(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t, dt_op op, int root);
dt_status dt_comm_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root);
/* recvbuf holds size * count elements, rank r's block at r * count. The mpi transport takes
 * blocks of at most 1 GiB per rank (DT_ERR_UNSUPPORTED above); shm and tcp have no such limit. */
dt_status dt_comm_allgather(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t);
/* sendbuf holds size * count elements; rank r receives the reduction of block r. */
dt_status dt_comm_reduce_scatter(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t, dt_op op);
dt_status dt_comm_gather(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t, int root);
dt_status dt_comm_scatter(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t, int root);
/* sendbuf and recvbuf hold size * count elements; block j of sendbuf goes to rank j. */
dt_status dt_comm_alltoall(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t);
dt_status dt_comm_barrier(dt_comm *c);

/* Shared window: `bytes` of memory per rank (rounded up to 64) that the communicator's ranks map
 * into each other's address space, so that an allreduce over it copies nothing in or out: each
 * rank reduces its slice of the range straight from every rank's window and writes the result
 * into every rank's window (per rank, the range is read once and written once, against about
 * 4.5 times its size through the staging buffers). An in-place allreduce (sendbuf DT_IN_PLACE,
 * or equal to recvbuf) whose buffer lies inside the window takes that path, blocking or not
 * (a few KiB or less: one round through small per-rank slots, which is faster there); every
 * rank must then pass the same offset into its window (else DT_ERR_MISMATCH). DTRAIN_ALGO does
 * not apply to it. While such an allreduce runs, other ranks read and write its range of
 * this rank's window; the rest of the window is the caller's. *out: this rank's part, zeroed,
 * 64-byte aligned, valid until dt_comm_destroy. Collective over c; at most one per
 * communicator; waits for the nonblocking calls in flight first. DT_ERR_UNSUPPORTED (on every
 * rank) when the transport shares no memory (tcp, mpi, or a single rank). The ranks' requests
 * go round first (an allgather of c, checked like any collective), so these fail on every rank
 * at once and leave c usable: DT_ERR_INVALID when any rank passed bad arguments or has a
 * window already (DT_ERR_STATE on that rank; the others name it), DT_ERR_MISMATCH when ranks
 * ask for different sizes (naming both); DT_ERR_SYSTEM on every rank when any rank could not
 * map it (a full /dev/shm). */
dt_status dt_comm_window(dt_comm *c, size_t bytes, void **out);
/* Rank `rank`'s part of the window as this process maps it (every rank's part is mapped in every
 * rank), or NULL without a window or for a rank outside the communicator. The parts lie back to
 * back in rank order, as MPI_Win_allocate_shared's do by default: part(r + 1) - part(r) is the
 * same for every r and at least `bytes`, so the size parts can be used as one arena. Not
 * collective. The caller orders its reads and writes of other ranks' parts (a barrier, a
 * collective), and must leave alone the range of a window collective in flight. */
void *dt_comm_window_part(const dt_comm *c, int rank);

/* Point to point. Not collective: the peer must make the matching call with the same count,
 * dtype and tag, in the same order, and before the next collective between the two (a send
 * may not cross a collective as MPI's eager ones may: over tcp the collective then fails as a
 * mismatch). A message never received is lost when the communicator is destroyed; over shm
 * the receiver's dt_comm_destroy warns about it. */
dt_status dt_comm_send(dt_comm *c, const void *buf, size_t count, dt_dtype t, int peer, int tag);
dt_status dt_comm_recv(dt_comm *c, void *buf, size_t count, dt_dtype t, int peer, int tag);

/* Nonblocking collectives: start the operation on the communicator's progress thread and
 * return at once. Operations (blocking or not) run in the order they were called. */
dt_status dt_comm_iallreduce(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t, dt_op op, dt_request **req);
dt_status dt_comm_ibroadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root, dt_request **req);
dt_status dt_comm_iallgather(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t, dt_request **req);
dt_status dt_comm_ireduce_scatter(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t, dt_op op, dt_request **req);
dt_status dt_comm_ibarrier(dt_comm *c, dt_request **req);
dt_status dt_comm_ireduce(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t, dt_op op, int root, dt_request **req);
dt_status dt_comm_igather(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t, int root, dt_request **req);
dt_status dt_comm_iscatter(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t, int root, dt_request **req);
dt_status dt_comm_ialltoall(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t, dt_request **req);
/* Waits for req and frees it; returns the operation's status (with its detail). */
dt_status dt_request_wait(dt_request *req);
/* *done = 1 when finished (then call dt_request_wait to collect the status and free it). */
dt_status dt_request_test(dt_request *req, int *done);

#ifdef __cplusplus
}
#endif
#endif
