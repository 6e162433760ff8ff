/* comm/store.h - the rendezvous store: a TCP key-value server (hosted by one rank in a thread,
 * or anywhere else) through which ranks find each other, plus the job's failure detector.
 *
 * Keys are strings (<= 255 bytes), values byte strings (<= 16 MiB). Every connection proves the
 * job secret first (wire.h); a connection that cannot is refused and logged with its address
 * while the server goes on serving others. One server thread serves all connections with
 * poll(); no connection can make it block or allocate more than a frame's bounded length.
 *
 * Failure detection: each rank's heartbeat (dt__store_heartbeat) tells the server it is alive;
 * the server declares a rank failed when its heartbeat connection closes without a goodbye or
 * nothing arrives for fault_timeout_ms, and then answers every heartbeat with that verdict, so
 * all ranks learn who failed within about one heartbeat interval. A rank may also raise an abort
 * with its own message (dt__store_abort); the first verdict wins. */
#ifndef DT_COMM_STORE_H
#define DT_COMM_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"

#define DT_STORE_KEY_MAX 255             /* bytes, without the terminating NUL */
#define DT_STORE_VALUE_MAX (16u << 20)   /* 16 MiB */
#define DT_STORE_MSG_MAX 1024            /* abort messages and verdicts are cut to this */

typedef struct dt__store_server dt__store_server;
typedef struct dt__store dt__store;

/* Starts a server thread listening on addr:port (addr NULL: all interfaces; port 0: ephemeral,
 * *port_out tells which). world_size is the number of ranks whose heartbeats it watches. */
dt_status dt__store_server_start(const char *addr, int port, const uint8_t *secret, size_t secret_len,
                                 int world_size, int fault_timeout_ms, dt__store_server **out, int *port_out);
/* Stops the thread and closes every connection. Accepts NULL. Other ranks' heartbeat threads
 * treat a vanished store as its host's failure, so the hosting rank should first release its
 * own health (goodbye) and dt__store_server_drain with a short deadline. */
void dt__store_server_stop(dt__store_server *s);
/* The server's thread (for DTRAIN_BIND). */
pthread_t dt__store_server_thread(const dt__store_server *s);
/* Waits (at most until the deadline) until every rank that ever sent a heartbeat has said
 * goodbye or been declared failed, so the hosting rank can stop the server without the others'
 * health threads seeing the store vanish under them. Returns the number of ranks still live
 * (0 = all gone). Safe from any thread while the server runs. */
int dt__store_server_drain(dt__store_server *s, int64_t deadline);
/* Waits (at most until the deadline) until a verdict the server holds has been sent to every
 * live rank: a hosting process on its way out after a failure calls it, since its exit ends the
 * store and with it the telling of ranks not yet told (comm.c, dt__comm_fail). Returns at once
 * without a verdict. Accepts NULL. */
void dt__store_server_settle(dt__store_server *s, int64_t deadline);
/* Snapshot for a supervisor: how many ranks ever sent a heartbeat, how many are live (neither
 * said goodbye nor failed), and the verdict (returned status DT_OK and "" if there is none). */
dt_status dt__store_server_status(dt__store_server *s, int *seen, int *live, char *verdict, size_t n);

/* Connects and authenticates (retrying until the deadline while the server starts). `rank`
 * identifies the client in logs. Each dt__store handle is used by one thread at a time. */
dt_status dt__store_connect(const char *host, int port, const uint8_t *secret, size_t secret_len,
                            int rank, int64_t deadline, dt__store **out);
void dt__store_close(dt__store *st);
/* True once the connection is lost or out of step (closed, reset, a reply cut by a deadline):
 * every later call fails; close and reconnect. A verdict or a timed-out wait does not break it. */
bool dt__store_broken(const dt__store *st);
/* True once the server answered (or pushed, on a heartbeat connection) the job's verdict: a
 * DT_ERR_PEER / DT_ERR_ABORTED then came from the store, not from a lost socket. */
bool dt__store_told(const dt__store *st);

/* Set by dtrain run's elastic agents in their own store, so that a worker started as a plain
 * job's and pointed at it says so instead of waiting for ranks that never come. */
#define DT__STORE_AGENTS_KEY "dtrain/agents"

dt_status dt__store_set(dt__store *st, const char *key, const void *val, size_t n, int64_t deadline);
/* Copies the value into buf (cap bytes); *n is its full length. DT_ERR_NOT_FOUND if absent,
 * DT_ERR_INVALID if cap is too small. Never blocks waiting for the key. */
dt_status dt__store_get(dt__store *st, const char *key, void *buf, size_t cap, size_t *n, int64_t deadline);
/* Like get, but waits until the key exists or the deadline passes (DT_ERR_TIMEOUT). Once the
 * job has a verdict (a rank failed or aborted) a wait for a missing key returns it at once
 * (DT_ERR_PEER / DT_ERR_ABORTED): nobody waits for a rank that is gone. */
dt_status dt__store_wait(dt__store *st, const char *key, void *buf, size_t cap, size_t *n, int64_t deadline);
/* dt__store_wait with flags: DT_STORE_WAIT_IGNORE_VERDICT keeps waiting after a verdict (for
 * agents and tools that coordinate after a failure, e.g. to re-form the job). */
#define DT_STORE_WAIT_IGNORE_VERDICT 1u
dt_status dt__store_wait_flags(dt__store *st, const char *key, void *buf, size_t cap, size_t *n, unsigned flags,
                               int64_t deadline);
/* Atomically adds delta to the integer stored at key (absent = 0); *result is the new value.
 * The value is kept as decimal text, so get/wait see "42"; a non-integer value or an overflow
 * is DT_ERR_INVALID. */
dt_status dt__store_add(dt__store *st, const char *key, int64_t delta, int64_t *result, int64_t deadline);
/* Sets key to desired iff its current value equals expected (expected_n == 0 matches an absent
 * key or an empty value). *swapped = 1 if it did, 0 if the value differed. */
dt_status dt__store_cas(dt__store *st, const char *key, const void *expected, size_t expected_n,
                        const void *desired, size_t desired_n, int *swapped, int64_t deadline);
/* Claims key for this connection: sets it to val, and the key is deleted when the connection
 * closes (a lock held by a process, e.g. an agent's node rank). DT_ERR_STATE, naming the
 * holder's address, if another open connection holds it with another value; the same value
 * from a new connection takes the key over (the same claimant reconnecting). */
dt_status dt__store_claim(dt__store *st, const char *key, const void *val, size_t n, int64_t deadline);
/* Removes key; deleting an absent key is not an error. */
dt_status dt__store_delete(dt__store *st, const char *key, int64_t deadline);

/* Heartbeat from `rank` (the handle passed to dt__store_connect). Returns DT_OK while the job
 * is healthy; DT_ERR_PEER / DT_ERR_ABORTED with the verdict as detail once a rank failed or
 * aborted ("rank 2 failed: no heartbeat for 10000 ms (hung, stopped, or cut off)"). */
dt_status dt__store_heartbeat(dt__store *st, int64_t deadline);
/* The world size this handle's heartbeats announce (0, the default: none). The server refuses
 * a rank whose world size differs from its own, or whose rank is beyond it, and ends the job
 * with an abort naming both sizes, so the ranks already waiting stop at once. */
void dt__store_set_world(dt__store *st, int world);
/* Raises an abort with msg (first one wins). */
dt_status dt__store_abort(dt__store *st, const char *msg, int64_t deadline);
/* Tells the server this rank leaves cleanly (its connection closing is then not a failure). */
dt_status dt__store_goodbye(dt__store *st, int64_t deadline);

#endif
