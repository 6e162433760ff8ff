/* comm/comm.h - the communicator's internals, shared by comm.c, the transports and the
 * collective algorithms. Nothing outside src/comm includes this. */
#ifndef DT_COMM_INTERNAL_H
#define DT_COMM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "comm/store.h"
#include "comm/transport.h"
#include "core/core.h"
#include "dtrain/comm.h"

/* Job-wide failure state, one per process, shared by the world communicator and every
 * communicator split from it (refcounted). A heartbeat thread with its own store connection
 * reports liveness every interval and learns the store's verdict; the first failure seen
 * (locally or through the store) sets `aborted`, stores the message, and makes abort_fd
 * readable so transports blocked in poll(2) wake at once. world_size goes with each heartbeat
 * (0: not said), so a store of another size refuses this rank and ends the job at once. */
typedef struct dt__health dt__health;
dt_status dt__health_start(const char *store_host, int store_port, const uint8_t *secret, size_t secret_len,
                           int world_rank, int world_size, int fault_timeout_ms, dt__health **out);
/* Which rank hosts the store (a lost store is then "rank R (store host H:P) failed"), or
 * rank < 0: none, the store runs outside the job (then "the store at H:P ... failed"). Until
 * called, the store is named by its address only. Thread-safe. */
#define DT_HEALTH_STORE_OUTSIDE (-1)
void dt__health_set_store_rank(dt__health *h, int rank);
/* The heartbeat thread (for DTRAIN_BIND). */
pthread_t dt__health_thread(const dt__health *h);
void dt__health_retain(dt__health *h);
/* Says goodbye to the store (so leaving is not a failure) and stops the thread at refcount 0. */
void dt__health_release(dt__health *h);
bool dt__health_aborted(const dt__health *h);
/* Whether any communicator of this process has seen a rank of its job die or stop answering
 * (the failure detector's verdict, not an abort every rank saw): at exit, MPI_Finalize would
 * then wait for a rank that may never come. */
bool dt__health_peer_lost(void);
int dt__health_abort_fd(const dt__health *h);
/* Copies the verdict ("" if none). */
void dt__health_verdict(const dt__health *h, char *buf, size_t n);
/* Records a local failure (first one wins) and publishes it through the store so that every
 * rank stops within a heartbeat interval. Never blocks longer than a short fixed bound. */
void dt__health_raise(dt__health *h, const char *msg);

/* DTRAIN_BIND=auto pins this thread (and the threads it starts later) and threads[0..nthreads)
 * to local rank local_rank's share of the CPUs (one CPU when oversubscribed); none/unset does
 * nothing (bind.c). DT_ERR_INVALID for another value. */
dt_status dt__comm_bind(const char *mode, int local_rank, int local_size, const pthread_t *threads, int nthreads);
/* CPUs this thread may run on (sched_getaffinity), else the online CPUs. */
int dt__comm_cpus(void);
/* This thread's CPUs as hex digits, digit i holding CPUs 4i..4i+3 (bit b: CPU 4i+b), trailing
 * zeros dropped: "3" is CPUs 0 and 1 ("" when unknown); at most DT__CPUS_HEX digits. */
#define DT__CPUS_HEX 256
void dt__comm_cpus_hex(char *out, size_t n);
/* ORs such a list into acc[DT__CPUS_HEX], a digit's value per byte; false (acc unchanged) when
 * the list is empty or malformed. */
bool dt__comm_cpus_or(uint8_t *acc, const char *hex);

/* Resolves a dt_comm_config (NULL fields and -1 from the environment, as dtrain/comm.h says). */
typedef struct dt__comm_env {
  int rank, world_size, local_rank, local_size;
  char store_host[256];
  int store_port;
  int host_store; /* 1: this rank starts the store server */
  uint8_t secret[256];
  size_t secret_len;
  char transport[16]; /* "" = auto */
  char bind_addr[256];
  char job_id[64];
  int timeout_ms, fault_timeout_ms;
  int progress_follow; /* DTRAIN_PROGRESS_FOLLOW (1): the progress thread runs on its caller's CPU */
  int ring_piece;       /* DTRAIN_RING_PIECE bytes, 0: ring.c's default */
  int ring_ahead;       /* DTRAIN_RING_AHEAD, -1: ring.c's default */
  int chain_piece;      /* DTRAIN_CHAIN_PIECE bytes, 0: tree.c's default */
  char source[32]; /* "dtrain", "torchrun", "openmpi", "slurm", "config", "single" */
  int mpi_boot;     /* started by mpirun with no store address: MPI tells rank 0's store address */
  unsigned generation;  /* n: the n-th world communicator of this job this process created (comm.c) */
  char world_prefix[16]; /* store key prefix of that world communicator: "w/", "w2/", ... */
} dt__comm_env;
dt_status dt__comm_env_resolve(const dt_comm_config *cfg, dt__comm_env *env);

struct dt__progress; /* nonblocking operation queue and its thread (comm/progress.c) */
/* True on a progress thread: the collective it runs overlaps its caller's computation, so a
 * transport waiting there must not spin the caller's core away (comm/progress.c). */
bool dt__on_progress_thread(void);

/* One class (size, element width) of a timed choice between two algorithms (collectives.c,
 * tune_*): two size classes, each for 16-bit elements and for wider ones. */
#define DT__TUNE_CLASSES 4
#define DT__TUNE_TIMED 5 /* timed calls per algorithm in a trial */
typedef struct dt__tune {
  uint64_t calls;     /* calls of the class so far */
  uint64_t trial_end; /* the call that ends the running trial, 0 if none runs */
  int64_t ns[2][DT__TUNE_TIMED]; /* this rank's times in the running trial (0: the fast path, 1: rd) */
  uint8_t algo;       /* the agreed dt__algo, 0 until the first trial ends */
} dt__tune;

struct dt_comm {
  int rank, size;
  int local_rank, local_size;
  int *world_ranks;     /* [size]: each member's rank in the world communicator */
  bool same_host;       /* every member runs on this host */
  int host_cpus;        /* CPUs the members on this host could run on before DTRAIN_BIND pinned
                         * them, the union of their affinities (mpirun binds each rank to a CPU
                         * of its own): what the shm and tcp transports compare the number of
                         * ranks on the host against to decide whether they are oversubscribed */
  dt__comm_env env;     /* how the world was joined (store address, secret, knobs) */
  dt__store *store;     /* this communicator's own store connection (application thread) */
  dt__store_server *server; /* non-NULL on the rank hosting the store: the world's, shared with
                             * its splits (a split may outlive the world communicator) */
  _Atomic int *server_users; /* with server: this process's communicators using it; the last
                              * one destroyed drains and stops it */
  dt__health *health;   /* shared with splits */
  char prefix[64];      /* store key prefix of this communicator: "w/", "w/3.1/", ... */
  const dt_transport_ops *ops;
  dt_transport *tp;
  int timeout_ms;
  uint64_t seq;         /* number of the last collective started */
  uint64_t nsplits;     /* splits made from this communicator (names their store prefix) */
  uint64_t *p2p_sent, *p2p_recvd; /* [size]: point-to-point message counters per peer */
  struct dt__progress *progress;
  uint8_t *win;         /* this rank's part of the shared window (dt_comm_window), or NULL */
  size_t win_bytes;
  pthread_mutex_t lock; /* serializes operations between the caller and the progress thread */
  _Atomic int in_call;  /* an application thread is in a collective call (dt__comm_enter) */
  /* DTRAIN_ALGO as read when the communicator was made (dt__coll_algo_load): the algorithm forced
   * per collective (DT_ALGO_AUTO: none), or algo_bad, the error every collective then returns */
  uint8_t algo[DT_COLL_COUNT];
  char algo_bad[320];
  dt__tune tune[DT__TUNE_CLASSES]; /* the timed choice of the 2-rank allreduce (collectives.c) */
};

/* Around a collective call of the application: one thread at a time (dtrain/comm.h). A second
 * thread calling while another is in a call gets DT_ERR_STATE at once, naming it, instead of the
 * two calls mixing into a hang or a "mismatch" on another rank. */
dt_status dt__comm_enter(dt_comm *c, dt__coll kind);
void dt__comm_leave(dt_comm *c);

/* "rank 3", or "rank 1 (world rank 3)" in a split communicator. */
void dt__comm_peer_name(const dt_comm *c, int peer, char *buf, size_t n);
/* Sets DT_ERR_MISMATCH: "rank P called <theirs>, rank M called <mine>" and returns it. */
dt_status dt__comm_mismatch(const dt_comm *c, int peer, const dt__fp *theirs, const dt__fp *mine);
/* True once anything in the job failed; transports check it while waiting. */
bool dt__comm_aborted(const dt_comm *c);
int dt__comm_abort_fd(const dt_comm *c);
/* Sets DT_ERR_ABORTED with the verdict as detail and returns it. */
dt_status dt__comm_abort_status(const dt_comm *c);
/* Puts "rank R: <the call>: " before the last error's detail, naming this rank once (a detail
 * that starts by naming it loses that), and returns st. */
dt_status dt__comm_call_error(const dt_comm *c, const dt__fp *fp, dt_status st);
/* msg past a leading "rank R: " that names c's own rank, for context that names it already. */
const char *dt__comm_skip_self(const dt_comm *c, const char *msg);
/* After a local error: publishes the current dt_last_error() so all ranks stop. Returns st. */
dt_status dt__comm_fail(dt_comm *c, dt_status st);
/* Deadline for an operation starting now. */
int64_t dt__comm_deadline(const dt_comm *c);
/* Store key with this communicator's prefix: "<prefix><fmt...>". */
void dt__comm_key(const dt_comm *c, char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Element-wise reduction kernels (comm/reduce.c): dst[i] = dst[i] op src[i]; for f16/bf16
 * each is converted to f32, reduced and rounded once. avg is applied by dt__reduce_finish
 * (divide by n) after all contributions are summed. */
void dt__reduce(void *dst, const void *src, size_t count, dt_dtype t, dt_op op);
/* out[i] = a[i] op b[i]; out may alias a or b. */
void dt__reduce2(void *out, const void *a, const void *b, size_t count, dt_dtype t, dt_op op);
void dt__reduce_finish(void *buf, size_t count, dt_dtype t, dt_op op, int n);
/* memcpy for the collectives' bulk copies (comm/reduce.c): on AMD CPUs whose `rep movsb` is slow
 * (Zen 3 and older; not Zen 4) from 2 KiB with its own vector moves; elsewhere glibc's memcpy. */
void dt__copy(void *dst, const void *src, size_t n);
/* memcpy whose stores bypass the caches (x86; elsewhere memcpy): for outputs larger than the
 * caches, which a plain store would first read from memory. */
void dt__copy_nt(void *dst, const void *src, size_t n);
/* Whether this is an AMD CPU (CPUID vendor; false off x86), for choices measured per vendor. */
bool dt__cpu_amd(void);
/* Whether this is an AMD Zen 4 CPU (family 25, models 0x10-0x1f, 0x60-0x7f, 0xa0-0xaf). */
bool dt__cpu_zen4(void);
/* Whether this is an AMD CPU of family 26 (Zen 5) or later. */
bool dt__cpu_zen5(void);

#endif
