/* comm.c - the communicator: joining a job (store, failure detector, host identities, transport
 * choice), leaving it, splitting it, point-to-point messages, and the helpers every transport and
 * collective uses to name ranks and calls in its error messages.
 *
 * It does not move collective data itself: the collectives' entry points and algorithms live in
 * comm/coll/ and comm/progress.c, the byte movement in the transports (comm/shm, comm/tcp). */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/coll/coll.h"
#include "comm/comm.h"
#ifdef DTRAIN_HAVE_MPI
#include "comm/mpi/mpi_boot.h"
#endif

/* Every transport this build has. Adding one is a line here (and its folder). Keep "shm" and
 * "tcp" first: the automatic choice names them. The MPI table joins under DTRAIN_HAVE_MPI when
 * comm/mpi/ provides it. */
static const dt_transport_ops *const comm_transports[] = {
    &dt__transport_shm,
    &dt__transport_tcp,
#ifdef DTRAIN_HAVE_MPI
    &dt__transport_mpi,
#endif
};

/* How long create/split wait for one store key before re-checking the job's health, so a
 * failure elsewhere ends the wait early instead of at the full deadline. */
#define COMM_POLL_MS 100
/* How long a rank that saw a peer vanish waits for the job's verdict (the failure detector's
 * heartbeat interval is at most 200 ms) before publishing its own observation. */
#define COMM_VERDICT_MS 1000

/* Host identity record published by each rank: "<hostname>\n<boot_id>\n<transport>\n<CPUs>\n<algorithms>"
 * (CPUs: the ones the process may run on, dt__comm_cpus_hex). Two ranks share a host (and can
 * share memory) when hostname and boot id both match. */
#define COMM_HOSTID_MAX 1024

void dt_comm_config_init(dt_comm_config *cfg) {
  if (!cfg)
    return;
  memset(cfg, 0, sizeof *cfg);
  cfg->rank = -1;
  cfg->world_size = -1;
  cfg->local_rank = -1;
  cfg->host_store = -1;
}

/* ---- names used in messages ---- */

static const char *const coll_names[DT_COLL_COUNT] = {
    [DT_COLL_NONE] = "none",
    [DT_COLL_ALLREDUCE] = "allreduce",
    [DT_COLL_REDUCE] = "reduce",
    [DT_COLL_BROADCAST] = "broadcast",
    [DT_COLL_ALLGATHER] = "allgather",
    [DT_COLL_REDUCE_SCATTER] = "reduce_scatter",
    [DT_COLL_GATHER] = "gather",
    [DT_COLL_SCATTER] = "scatter",
    [DT_COLL_ALLTOALL] = "alltoall",
    [DT_COLL_BARRIER] = "barrier",
    [DT_COLL_SEND] = "send/recv",
    [DT_COLL_SPLIT] = "split",
    [DT_COLL_CREATE] = "create",
};

const char *dt__coll_name(int coll) {
  if (coll < 0 || coll >= DT_COLL_COUNT)
    return "unknown-call";
  return coll_names[coll];
}

static const char *comm_dtype_name(int t) {
  const char *s = (t >= 0 && t < DT_DTYPE_COUNT) ? dt_dtype_name((dt_dtype)t) : NULL;
  return s ? s : "?dtype";
}

static const char *comm_op_name(int op) {
  const char *s = (op >= 0 && op < DT_OP_COUNT) ? dt_op_name((dt_op)op) : NULL;
  return s ? s : "?op";
}

void dt__fp_format(const dt__fp *fp, char *buf, size_t n) {
  const char *name = dt__coll_name(fp->coll);
  unsigned long long seq = (unsigned long long)fp->seq, cnt = (unsigned long long)fp->count;
  switch (fp->coll) {
  case DT_COLL_BARRIER:
  case DT_COLL_SPLIT:
  case DT_COLL_CREATE:
    snprintf(buf, n, "%s #%llu", name, seq);
    break;
  case DT_COLL_SEND:
    snprintf(buf, n, "%s #%llu with %llu x %s tag %d", name, seq, cnt, comm_dtype_name(fp->dtype), (int)fp->root);
    break;
  case DT_COLL_ALLREDUCE:
  case DT_COLL_REDUCE_SCATTER:
    snprintf(buf, n, "%s #%llu with %llu x %s %s", name, seq, cnt, comm_dtype_name(fp->dtype), comm_op_name(fp->op));
    break;
  case DT_COLL_REDUCE:
    snprintf(buf, n, "%s #%llu with %llu x %s %s to root %d", name, seq, cnt, comm_dtype_name(fp->dtype),
             comm_op_name(fp->op), (int)fp->root);
    break;
  case DT_COLL_BROADCAST:
  case DT_COLL_GATHER:
  case DT_COLL_SCATTER:
    snprintf(buf, n, "%s #%llu with %llu x %s %s root %d", name, seq, cnt, comm_dtype_name(fp->dtype),
             fp->coll == DT_COLL_GATHER ? "to" : "from", (int)fp->root);
    break;
  default:
    snprintf(buf, n, "%s #%llu with %llu x %s", name, seq, cnt, comm_dtype_name(fp->dtype));
    break;
  }
  if (fp->flags & DT__FP_WINDOW) {
    size_t k = strlen(buf);
    snprintf(buf + k, n - k, " in the shared window at element %d", (int)fp->root);
  }
  if (fp->flags & DT__FP_TUNE) {
    size_t k = strlen(buf);
    snprintf(buf + k, n - k, " (the timings that choose the algorithm after call #%llu)", seq);
  }
}

int dt__fp_equal(const dt__fp *a, const dt__fp *b) {
  return a->seq == b->seq && a->count == b->count && a->coll == b->coll && a->dtype == b->dtype &&
         a->op == b->op && a->root == b->root && a->flags == b->flags;
}

int dt__fp_same_place(const dt__fp *a, const dt__fp *b) {
  return a->seq == b->seq && !((a->flags ^ b->flags) & DT__FP_TUNE);
}

void dt__comm_peer_name(const dt_comm *c, int peer, char *buf, size_t n) {
  if (c && c->world_ranks && peer >= 0 && peer < c->size && c->world_ranks[peer] != peer)
    snprintf(buf, n, "rank %d (world rank %d)", peer, c->world_ranks[peer]);
  else
    snprintf(buf, n, "rank %d", peer);
}

dt_status dt__comm_mismatch(const dt_comm *c, int peer, const dt__fp *theirs, const dt__fp *mine) {
  char pn[64], mn[64], tf[160], mf[160];
  dt__comm_peer_name(c, peer, pn, sizeof pn);
  dt__comm_peer_name(c, c->rank, mn, sizeof mn);
  dt__fp_format(theirs, tf, sizeof tf);
  dt__fp_format(mine, mf, sizeof mf);
  return dt_set_error(DT_ERR_MISMATCH, "%s called %s, %s called %s", pn, tf, mn, mf);
}

bool dt__comm_aborted(const dt_comm *c) { return c->health && dt__health_aborted(c->health); }

int dt__comm_abort_fd(const dt_comm *c) { return c->health ? dt__health_abort_fd(c->health) : -1; }

dt_status dt__comm_abort_status(const dt_comm *c) {
  char v[768] = "";
  if (c->health)
    dt__health_verdict(c->health, v, sizeof v);
  return dt_set_error(DT_ERR_ABORTED, "rank %d: job aborted: %s", c->rank, v[0] ? v : "(no reason given)");
}

/* msg past a leading "rank R: " that names this rank (as the transports and the abort status
 * write it), so that the context a caller adds names the rank once. */
const char *dt__comm_skip_self(const dt_comm *c, const char *msg) {
  char me[32];
  int k = snprintf(me, sizeof me, "rank %d: ", c->rank);
  return strncmp(msg, me, (size_t)k) ? msg : msg + k;
}

dt_status dt__comm_call_error(const dt_comm *c, const dt__fp *fp, dt_status st) {
  char me[64], what[160], detail[1024];
  dt__comm_peer_name(c, c->rank, me, sizeof me);
  dt__fp_format(fp, what, sizeof what);
  const char *last = dt_last_error();
  snprintf(detail, sizeof detail, "%s", last[0] ? dt__comm_skip_self(c, last) : dt_strerror(st));
  return dt_set_error(st, "%s: %s: %s", me, what, detail);
}

/* On the rank hosting the store, a failure returns only once the store has sent the job's
 * verdict to every rank: the caller may exit at once, ending the store with its process, and a
 * rank not yet told would then blame the store's host instead of naming the failure. */
static dt_status comm_failed(dt_comm *c, dt_status st) {
  dt__store_server_settle(c->server, dt__deadline_after_ms(COMM_VERDICT_MS));
  return st;
}

dt_status dt__comm_fail(dt_comm *c, dt_status st) {
  if (st == DT_OK || !c || !c->health)
    return st;
  if (st == DT_ERR_ABORTED) /* an abort we merely observed is not a new failure to publish */
    return comm_failed(c, st);
  if (st == DT_ERR_PEER && !strstr(dt_last_error(), ": job failed: ")) {
    /* A peer that vanished may itself have been stopping because of an earlier failure
     * elsewhere: give the failure detector a moment to tell the root cause, and lead with it. */
    int64_t dl = dt__deadline_after_ms(COMM_VERDICT_MS);
    while (!dt__comm_aborted(c) && !dt__expired(dl))
      dt__sleep_ns(5000000);
    if (dt__comm_aborted(c)) {
      char local[900], v[768] = "";
      snprintf(local, sizeof local, "%s", dt__comm_skip_self(c, dt_last_error()));
      dt__health_verdict(c->health, v, sizeof v);
      return comm_failed(c, dt_set_error(st, "rank %d: job failed: %s (seen here: %s)", c->rank, v, local));
    }
  }
  /* The verdict names the failing rank first, once (a collective's detail already does). */
  char msg[1100], who[32];
  snprintf(who, sizeof who, "rank %d: ", c->world_ranks ? c->world_ranks[c->rank] : c->rank);
  const char *detail = dt_last_error();
  snprintf(msg, sizeof msg, "%s%s", strncmp(detail, who, strlen(who)) ? who : "", detail);
  dt__health_raise(c->health, msg);
  return comm_failed(c, st);
}

int64_t dt__comm_deadline(const dt_comm *c) { return dt__deadline_after_ms(c->timeout_ms); }

void dt__comm_key(const dt_comm *c, char *buf, size_t n, const char *fmt, ...) {
  int k = snprintf(buf, n, "%s", c->prefix);
  if (k < 0 || (size_t)k >= n)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + k, n - (size_t)k, fmt, ap);
  va_end(ap);
}

/* ---- accessors ---- */

int dt_comm_rank(const dt_comm *c) { return c ? c->rank : -1; }
int dt_comm_size(const dt_comm *c) { return c ? c->size : 0; }
int dt_comm_local_rank(const dt_comm *c) { return c ? c->local_rank : -1; }
int dt_comm_local_size(const dt_comm *c) { return c ? c->local_size : 0; }
const char *dt_comm_transport(const dt_comm *c) { return c && c->ops ? c->ops->name : ""; }

dt_status dt_comm_set_timeout(dt_comm *c, int timeout_ms) {
  if (!c)
    return dt_set_error(DT_ERR_INVALID, "dt_comm_set_timeout: communicator is NULL");
  if (timeout_ms <= 0)
    return dt_set_error(DT_ERR_INVALID, "dt_comm_set_timeout: timeout %d ms must be > 0", timeout_ms);
  c->timeout_ms = timeout_ms;
  return DT_OK;
}

/* ---- joining ---- */

static void comm_host_id(char *buf, size_t n) {
  char host[256] = "unknown-host", boot[64] = "no-boot-id";
  if (gethostname(host, sizeof host - 1) != 0)
    snprintf(host, sizeof host, "unknown-host");
  host[sizeof host - 1] = '\0';
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    if (fgets(boot, sizeof boot, f))
      boot[strcspn(boot, "\r\n")] = '\0';
    fclose(f);
  }
  snprintf(buf, n, "%s\n%s", host, boot);
}

static const dt_transport_ops *comm_find_transport(const char *name) {
  for (size_t i = 0; i < DT_ARRAY_LEN(comm_transports); i++)
    if (strcmp(comm_transports[i]->name, name) == 0)
      return comm_transports[i];
  return NULL;
}

/* Lists the ranks (of `size`, world ranks through map if non-NULL) whose key "<fmt % rank>"
 * is absent from the store, into buf: "2, 5", or "2, 5, ... and 37 more" when buf is full.
 * Looks for at most 2 s, and not past `by` (0: no such bound). */
static void comm_missing(dt_comm *c, const char *fmt, const int *map, int size, char *buf, size_t n,
                         int64_t by) {
  size_t used = 0;
  int more = 0, r;
  buf[0] = '\0';
  int64_t dl = by ? DT_MIN(by, dt__deadline_after_ms(2000)) : dt__deadline_after_ms(2000);
  for (r = 0; r < size && !dt__expired(dl); r++) {
    char key[128], tmp[8];
    size_t len = 0;
    snprintf(key, sizeof key, fmt, map ? map[r] : r);
    dt_status st = dt__store_get(c->store, key, tmp, sizeof tmp, &len, dl);
    if (st != DT_ERR_NOT_FOUND)
      continue;
    if (used + 48 < n)
      used += (size_t)snprintf(buf + used, n - used, "%srank %d", used ? ", " : "", r);
    else
      more++;
  }
  if (!used)
    snprintf(buf, n, "(none missing any more)");
  else if (r < size)
    snprintf(buf + used, n - used, " and %d more of ranks %d..%d not checked", more, r, size - 1);
  else if (more)
    snprintf(buf + used, n - used, " and %d more", more);
}

#define COMM_JOIN_SAY_MS 10000

/* The members whose host record is not in the store yet (comm_missing). */
static void comm_missing_hosts(dt_comm *c, char *buf, size_t n, int64_t by) {
  char fmt[64];
  snprintf(fmt, sizeof fmt, "%shost/%%d", c->env.world_prefix);
  comm_missing(c, fmt, c->world_ranks, c->size, buf, n, by);
}

/* Waits for key while checking the job's health every COMM_POLL_MS. */
static dt_status comm_wait_key(dt_comm *c, const char *key, void *buf, size_t cap, size_t *len, int64_t deadline) {
  for (;;) {
    int64_t slice = dt__deadline_after_ms(COMM_POLL_MS);
    dt_status st = dt__store_wait(c->store, key, buf, cap, len, slice < deadline ? slice : deadline);
    if (st != DT_ERR_TIMEOUT)
      return st;
    if (dt__comm_aborted(c))
      return dt__comm_abort_status(c);
    if (dt__expired(deadline))
      return st;
  }
}

/* Line i (from 0) of a host record into out ("" when it has fewer lines). */
static const char *comm_line(const char *id, int i, char *out, size_t n) {
  for (; i > 0 && id; i--)
    if ((id = strchr(id, '\n')) != NULL)
      id++;
  size_t len = id ? strcspn(id, "\n") : 0;
  snprintf(out, n, "%.*s", (int)DT_MIN(len, n - 1), id ? id : "");
  return out;
}
static const char *comm_requested(const char *id, char *out, size_t n) { return comm_line(id, 2, out, n); }

/* The record's last line: the collective algorithms this rank's DTRAIN_ALGO chose, as one
 * digit per collective (what the ranks must agree on), then the variable as given. */
static void comm_algo_line(const dt_comm *c, char *out, size_t n) {
  size_t u = 0;
  for (int k = DT_COLL_ALLREDUCE; k <= DT_COLL_BARRIER && u + 1 < n; k++)
    out[u++] = (char)(c->algo_bad[0] ? '?' : 'a' + c->algo[k]);
  const char *e = dt__env_str("DTRAIN_ALGO");
  snprintf(out + u, n - u, " %.200s", e ? e : "");
}

/* What comm_hosts learns besides locality: this rank's host record and the first member that
 * asked for another transport. Nothing here grows with the number of ranks. */
typedef struct comm_peers {
  char mine[COMM_HOSTID_MAX];
  int other; /* a rank whose DTRAIN_TRANSPORT differs from ours, or -1 */
  char other_req[COMM_HOSTID_MAX];
  int other_algo; /* a rank whose DTRAIN_ALGO chose other algorithms than ours, or -1 */
  char other_algo_line[COMM_HOSTID_MAX];
  uint8_t cpus[DT__CPUS_HEX]; /* the union of the CPUs of the ranks on this host (dt__comm_cpus_or) */
  bool cpus_ok;               /* every one of them said which */
  int host_cpus;              /* CPUs in that union, 0 if not known */
} comm_peers;

/* Reads every member's host record (world rank map -> "<world prefix>host/<world rank>") and
 * derives same_host, local rank and local size. */
static dt_status comm_hosts(dt_comm *c, int64_t deadline, comm_peers *p) {
  char key[64], id[COMM_HOSTID_MAX], a[COMM_HOSTID_MAX], b[COMM_HOSTID_MAX];
  p->other = p->other_algo = -1;
  for (int i = -1; i < c->size; i++) {
    int r = i < 0 ? c->rank : i; /* our own record first, to compare the others with */
    size_t len = 0;
    snprintf(key, sizeof key, "%shost/%d", c->env.world_prefix, c->world_ranks[r]);
    dt_status st;
    /* Rank 0 says every COMM_JOIN_SAY_MS (a quarter of a shorter timeout, at least 1 s) who has
     * not joined yet, so a job whose other host never starts is not silent until the deadline. */
    for (;;) {
      int say_ms = DT_MIN(COMM_JOIN_SAY_MS, DT_MAX(1000, c->timeout_ms / 4));
      int64_t say = c->rank == 0 ? DT_MIN(deadline, dt__deadline_after_ms(say_ms)) : deadline;
      st = comm_wait_key(c, key, id, sizeof id - 1, &len, say);
      if (st != DT_ERR_TIMEOUT || dt__expired(deadline))
        break;
      char miss[400];
      comm_missing_hosts(c, miss, sizeof miss, deadline);
      DT_LOG_WARN("rank 0: waiting for %s to join (world of %d, store %s:%d); giving up in %d s", miss, c->size,
                  c->env.store_host, c->env.store_port, dt__ms_left(deadline) / 1000);
    }
    if (st == DT_ERR_TIMEOUT) {
      char miss[400];
      comm_missing_hosts(c, miss, sizeof miss, 0);
      return dt_set_error(DT_ERR_TIMEOUT, "rank %d waited %d ms but these never joined: %s (world of %d; store %s:%d)", c->rank,
                          c->timeout_ms, miss, c->size, c->env.store_host, c->env.store_port);
    }
    if (st != DT_OK)
      return dt__error_prefix(st, "rank %d: reading the host record of rank %d", c->rank, r);
    id[len] = '\0';
    if (i < 0) {
      snprintf(p->mine, sizeof p->mine, "%s", id);
      c->same_host = true;
      c->local_rank = 0;
      c->local_size = 0;
      memset(p->cpus, 0, sizeof p->cpus);
      p->cpus_ok = dt__comm_cpus_or(p->cpus, comm_line(id, 3, a, sizeof a));
      continue;
    }
    /* Compare "<hostname>\n<boot_id>" only (the record's third line is the requested transport). */
    const char *nl = strchr(p->mine, '\n');
    nl = nl ? strchr(nl + 1, '\n') : NULL;
    size_t hl = nl ? (size_t)(nl - p->mine) : strlen(p->mine);
    if (strncmp(id, p->mine, hl) == 0 && (id[hl] == '\n' || id[hl] == '\0')) {
      c->local_size++;
      if (r < c->rank)
        c->local_rank++;
      if (r != c->rank)
        p->cpus_ok = p->cpus_ok && dt__comm_cpus_or(p->cpus, comm_line(id, 3, a, sizeof a));
    } else {
      c->same_host = false;
    }
    if (p->other < 0 && strcmp(comm_requested(id, a, sizeof a), comm_requested(p->mine, b, sizeof b)) != 0) {
      p->other = r;
      snprintf(p->other_req, sizeof p->other_req, "%s", a);
    }
    comm_line(id, 4, a, sizeof a);
    comm_line(p->mine, 4, b, sizeof b);
    size_t la = strcspn(a, " "), lb = strcspn(b, " ");
    if (p->other_algo < 0 && (la != lb || strncmp(a, b, la) != 0)) {
      p->other_algo = r;
      snprintf(p->other_algo_line, sizeof p->other_algo_line, "%s", a);
    }
  }
  p->host_cpus = 0;
  for (size_t k = 0; p->cpus_ok && k < sizeof p->cpus; k++)
    p->host_cpus += __builtin_popcount(p->cpus[k]);
  return DT_OK;
}

/* Chooses and connects the transport: the requested one (which every member must agree on),
 * else shm when all members share a host and tcp otherwise. */
static dt_status comm_connect_transport(dt_comm *c, const comm_peers *p) {
  char req[COMM_HOSTID_MAX];
  comm_requested(p->mine, req, sizeof req);
  if (p->other >= 0)
    return dt_set_error(DT_ERR_MISMATCH, "rank %d asked for transport '%s' but rank %d asked for '%s' (DTRAIN_TRANSPORT or DTRAIN_BACKEND)",
                        p->other, p->other_req[0] ? p->other_req : "auto", c->rank, req[0] ? req : "auto");
  /* Ranks running different algorithms for one collective wait for messages that never come:
   * refused here, where every rank sees every record, instead of at the deadline. */
  if (p->other_algo >= 0) {
    char mine[COMM_HOSTID_MAX];
    comm_line(p->mine, 4, mine, sizeof mine);
    const char *t = strchr(p->other_algo_line, ' '), *m = strchr(mine, ' ');
    return dt_set_error(DT_ERR_MISMATCH,
                        "rank %d has DTRAIN_ALGO='%s' but rank %d has '%s': every rank must choose the same "
                        "collective algorithms",
                        p->other_algo, t ? t + 1 : "", c->rank, m ? m + 1 : "");
  }
  const char *name = req[0] ? req : (c->same_host ? "shm" : "tcp");
  c->ops = comm_find_transport(name);
  if (!c->ops) {
    char avail[128] = "";
    for (size_t i = 0; i < DT_ARRAY_LEN(comm_transports); i++)
      snprintf(avail + strlen(avail), sizeof avail - strlen(avail), "%s%s", i ? ", " : "", comm_transports[i]->name);
    return dt_set_error(DT_ERR_INVALID, "unknown transport '%s' (this build has: %s)", name, avail);
  }
  if (strcmp(name, "shm") == 0 && !c->same_host)
    return dt_set_error(DT_ERR_INVALID, "transport shm needs every rank on one host, but ranks run on several hosts");
  dt_status st = c->ops->create(c, &c->tp);
  if (st != DT_OK) { /* the transport's own "rank R: " is this rank again: named once */
    char detail[1024];
    snprintf(detail, sizeof detail, "%s", dt__comm_skip_self(c, dt_last_error()));
    return dt_set_error(st, "rank %d: connecting transport %s: %s", c->rank, name, detail);
  }
  return DT_OK;
}

/* Which world communicator of its job this is, counted by this process per (store, job, rank):
 * the n-th dt_comm_create of each rank meets the n-th of the others, under store keys of its own
 * ("w/", then "w2/", "w3/", ...), so nothing a previous communicator left in a store (host
 * records, transport addresses, shm names) is taken for this one's. */
static unsigned comm_generation(const dt__comm_env *env) {
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  static struct {
    char id[400];
    unsigned n;
  } seen[16];
  static unsigned next;
  char id[400];
  snprintf(id, sizeof id, "%.255s:%d %.63s %d", env->store_host, env->store_port, env->job_id, env->rank);
  pthread_mutex_lock(&mu);
  size_t i = 0;
  while (i < DT_ARRAY_LEN(seen) && strcmp(seen[i].id, id) != 0)
    i++;
  if (i == DT_ARRAY_LEN(seen)) {
    i = next++ % DT_ARRAY_LEN(seen);
    snprintf(seen[i].id, sizeof seen[i].id, "%s", id);
    seen[i].n = 0;
  }
  unsigned g = ++seen[i].n;
  pthread_mutex_unlock(&mu);
  return g;
}

/* Makes sure c->store serves this generation before anything is read from it or this rank is
 * watched there: rank 0 opens it ("<prefix>open"), the others wait for that key. A rank that
 * creates a communicator right after destroying one may reach the previous store while its
 * host (rank 0) still serves the ranks that have not left: that store never gets the key and
 * closes once they all left, so reconnect until the new one answers. The first generation
 * skips this: there is no earlier store of the job to reach. */
static dt_status comm_meet(dt_comm *c, int64_t deadline) {
  char key[64], v[8];
  size_t len = 0;
  if (c->env.generation <= 1)
    return DT_OK;
  dt__comm_key(c, key, sizeof key, "open");
  if (c->rank == 0)
    return dt__store_set(c->store, key, "1", 1, deadline);
  for (;;) {
    dt_status st = dt__store_wait_flags(c->store, key, v, sizeof v, &len, DT_STORE_WAIT_IGNORE_VERDICT, deadline);
    if (st == DT_OK)
      return DT_OK;
    if (st == DT_ERR_TIMEOUT)
      return dt_set_error(DT_ERR_TIMEOUT,
                          "rank %d waited %d ms for rank 0 to open communicator #%u of this job at the store %s:%d "
                          "(does every rank create and destroy its communicators the same number of times?)",
                          c->rank, c->timeout_ms, c->env.generation, c->env.store_host, c->env.store_port);
    if (!dt__store_broken(c->store))
      return st;
    dt__store_close(c->store);
    c->store = NULL;
    dt__sleep_ns(10 * 1000000LL);
    DT_CHECK(dt__store_connect(c->env.store_host, c->env.store_port, c->env.secret, c->env.secret_len, c->rank,
                               deadline, &c->store));
  }
}

static dt_comm *comm_alloc(int size) {
  dt_comm *c = dt__calloc(sizeof *c);
  if (!c)
    return NULL;
  c->size = size;
  c->world_ranks = dt__calloc(sizeof(int) * (size_t)size);
  c->p2p_sent = dt__calloc(sizeof(uint64_t) * (size_t)size);
  c->p2p_recvd = dt__calloc(sizeof(uint64_t) * (size_t)size);
  c->progress = NULL;
  dt__coll_algo_load(c);
  bool mem = c->world_ranks && c->p2p_sent && c->p2p_recvd;
  if (!mem || pthread_mutex_init(&c->lock, NULL) != 0) {
    dt__free(c->world_ranks);
    dt__free(c->p2p_sent);
    dt__free(c->p2p_recvd);
    dt__free(c);
    if (mem)
      dt_set_error(DT_ERR_NOMEM, "communicator of %d ranks: out of memory for its lock", size);
    else /* dt__alloc said how many bytes */
      dt__error_prefix(DT_ERR_NOMEM, "communicator of %d ranks", size);
    return NULL;
  }
  return c;
}

/* Frees everything. The rank hosting the store says its own goodbye first, then keeps serving
 * until every other rank said goodbye or was declared failed (bounded by the deadline, or by
 * about one fault timeout after a failure), so that nobody sees the store vanish and takes it
 * for a failure, and everybody learns a failure's verdict from it. */
static void comm_free(dt_comm *c) {
  if (!c)
    return;
  dt__progress_destroy(c->progress);
  if (c->ops && c->tp)
    c->ops->destroy(c->tp);
  dt__store_close(c->store);
  bool aborted = dt__comm_aborted(c);
  if (c->health)
    dt__health_release(c->health);
  if (c->server && c->server_users && atomic_fetch_sub(c->server_users, 1) > 1)
    c->server = NULL; /* another communicator of this process (a split, or its world) still uses it */
  else
    dt__free((void *)c->server_users);
  if (c->server) {
    int ms = aborted ? DT_MIN(c->timeout_ms, c->env.fault_timeout_ms + 2000) : c->timeout_ms;
    int live = dt__store_server_drain(c->server, dt__deadline_after_ms(ms));
    if (live > 0)
      DT_LOG_WARN("rank %d: stopping the rendezvous store while %d rank(s) still use it", c->rank, live);
  }
  dt__store_server_stop(c->server);
  pthread_mutex_destroy(&c->lock);
  dt__free(c->world_ranks);
  dt__free(c->p2p_sent);
  dt__free(c->p2p_recvd);
  dt__free(c);
}

static bool comm_is_loopback(const char *h) {
  return strcmp(h, "localhost") == 0 || strncmp(h, "127.", 4) == 0 || strcmp(h, "::1") == 0;
}

#ifdef DTRAIN_HAVE_MPI
/* Under mpirun without a store address: rank 0 starts the store on an ephemeral port of every
 * interface and broadcasts "<hostname> <port>" over MPI; a rank on the same host connects
 * through loopback, others by the host name. */
static dt_status comm_mpi_store(dt_comm *c) {
  int rank, size, lr, ls;
  DT_CHECK(dt__mpi_bootstrap(&rank, &size, &lr, &ls));
  if (rank != c->rank || size != c->size)
    return dt_set_error(DT_ERR_INVALID, "MPI says rank %d of %d but the environment says rank %d of %d", rank, size,
                        c->rank, c->size);
  char msg[300] = {0}, me[256] = {0};
  gethostname(me, sizeof me - 1);
  if (c->rank == 0) {
    int port = 0;
    DT_CHECK(dt__store_server_start(NULL, 0, c->env.secret, c->env.secret_len, c->size, c->env.fault_timeout_ms,
                                    &c->server, &port));
    snprintf(msg, sizeof msg, "%.255s %d", me, port);
  }
  DT_CHECK(dt__mpi_bcast_bytes(msg, sizeof msg, 0));
  char host[256];
  int port = 0;
  if (sscanf(msg, "%255s %d", host, &port) != 2 || port <= 0 || port > 65535)
    return dt_set_error(DT_ERR_PROTOCOL, "rank %d: bad store address from rank 0 over MPI: '%.60s'", c->rank, msg);
  snprintf(c->env.store_host, sizeof c->env.store_host, "%s", strcmp(host, me) == 0 ? "127.0.0.1" : host);
  c->env.store_port = port;
  c->env.host_store = 0;
  return DT_OK;
}

#endif
dt_status dt_comm_create(const dt_comm_config *cfg, dt_comm **out) {
  if (!out)
    return dt_set_error(DT_ERR_INVALID, "dt_comm_create: out is NULL");
  *out = NULL;
  dt__comm_env env;
  DT_CHECK(dt__comm_env_resolve(cfg, &env));
  if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size)
    return dt_set_error(DT_ERR_INVALID, "dt_comm_create: rank %d of world size %d", env.rank, env.world_size);
  dt__log_set_rank(env.rank);
  env.generation = comm_generation(&env);
  if (env.generation == 1)
    snprintf(env.world_prefix, sizeof env.world_prefix, "w/");
  else
    snprintf(env.world_prefix, sizeof env.world_prefix, "w%u/", env.generation);
  dt_comm *c = comm_alloc(env.world_size);
  if (!c)
    return DT_ERR_NOMEM;
  c->env = env;
  c->rank = env.rank;
  c->timeout_ms = env.timeout_ms > 0 ? env.timeout_ms : 300000;
  snprintf(c->prefix, sizeof c->prefix, "%s", env.world_prefix);
  for (int r = 0; r < c->size; r++)
    c->world_ranks[r] = r;
  int64_t deadline = dt__comm_deadline(c);
  dt_status st;
  comm_peers peers;

#ifdef DTRAIN_HAVE_MPI
  if (env.mpi_boot) {
    st = comm_mpi_store(c);
    if (st != DT_OK)
      goto fail;
  }
#endif
  if (env.host_store && !c->server) {
    int port = 0;
    const char *bind = comm_is_loopback(env.store_host) ? env.store_host : NULL;
    st = dt__store_server_start(bind, env.store_port, env.secret, env.secret_len, env.world_size, env.fault_timeout_ms,
                                &c->server, &port);
    if (st != DT_OK) {
      dt__error_prefix(st, "rank %d: starting the rendezvous store on %s:%d", c->rank, env.store_host, env.store_port);
      goto fail;
    }
    c->env.store_port = port;
  }
  if (!c->env.store_host[0])
    snprintf(c->env.store_host, sizeof c->env.store_host, "127.0.0.1");
  st = dt__store_connect(c->env.store_host, c->env.store_port, env.secret, env.secret_len, c->rank, deadline, &c->store);
  if (st != DT_OK) {
    dt__error_prefix(st, "rank %d: connecting to the rendezvous store %s:%d", c->rank, c->env.store_host,
                     c->env.store_port);
    goto fail;
  }
  if (!c->server) { /* a dtrain run agent's store (elastic hosts) at the address: no worker will meet us there */
    char v[8];
    size_t vn = 0;
    if (dt__store_get(c->store, DT__STORE_AGENTS_KEY, v, sizeof v, &vn, deadline) == DT_OK) {
      st = dt_set_error(DT_ERR_MISMATCH, "rank %d: %s:%d is the store of dtrain run's agents (a host started with "
                        "--max-restarts and --nnodes > 1), not a job's: start every host's dtrain run with the same "
                        "--max-restarts", c->rank, c->env.store_host, c->env.store_port);
      goto fail;
    }
    dt_clear_error();
  }
  DT_CHECK_GOTO(comm_meet(c, deadline), st, fail);
  st = dt__health_start(c->env.store_host, c->env.store_port, env.secret, env.secret_len, c->rank, c->size,
                        env.fault_timeout_ms,
                        &c->health);
  if (st != DT_OK) {
    dt__error_prefix(st, "rank %d: starting the failure detector", c->rank);
    goto fail;
  }

  /* Publish who we are (and, on the rank hosting the store, that it does: before our host
   * record, so whoever has read every host record knows who hosts the store), then learn
   * everybody else. */
  char me[COMM_HOSTID_MAX], key[64];
  if (c->server) {
    if (!(c->server_users = dt__calloc(sizeof *c->server_users))) {
      st = dt__error_prefix(DT_ERR_NOMEM, "rank %d: store user count", c->rank);
      goto fail;
    }
    atomic_store(c->server_users, 1);
    char r[16];
    snprintf(r, sizeof r, "%d", c->rank);
    dt__comm_key(c, key, sizeof key, "store-host");
    DT_CHECK_GOTO(dt__store_set(c->store, key, r, strlen(r), deadline), st, fail);
  }
  comm_host_id(me, 320);
  snprintf(me + strlen(me), sizeof me - strlen(me), "\n%.32s\n", env.transport);
  dt__comm_cpus_hex(me + strlen(me), sizeof me - strlen(me) - 1);
  strcat(me, "\n");
  comm_algo_line(c, me + strlen(me), sizeof me - strlen(me));
  dt__comm_key(c, key, sizeof key, "host/%d", c->rank);
  DT_CHECK_GOTO(dt__store_set(c->store, key, me, strlen(me), deadline), st, fail);
  DT_CHECK_GOTO(comm_hosts(c, deadline, &peers), st, fail);
  {
    char r[16] = "";
    size_t rl = 0;
    dt__comm_key(c, key, sizeof key, "store-host");
    st = dt__store_get(c->store, key, r, sizeof r - 1, &rl, deadline);
    if (st != DT_OK && st != DT_ERR_NOT_FOUND)
      goto fail;
    r[rl] = '\0';
    dt__health_set_store_rank(c->health, st == DT_OK ? atoi(r) : DT_HEALTH_STORE_OUTSIDE);
    st = DT_OK;
  }
  if (env.local_rank >= 0 && env.local_size > 0) {
    /* The launcher knows best (e.g. containers with distinct host names on one machine). */
    c->local_rank = env.local_rank;
    c->local_size = env.local_size;
  }
  /* DTRAIN_BIND (bind.c) before the transport, so that whatever the transport starts runs where
   * the rank will; the shm transport judges oversubscription by the CPUs from before. */
  c->host_cpus = peers.host_cpus > 0 ? peers.host_cpus : dt__comm_cpus();
  {
    pthread_t own[2];
    int nown = 0;
    own[nown++] = dt__health_thread(c->health);
    if (c->server)
      own[nown++] = dt__store_server_thread(c->server);
    DT_CHECK_GOTO(dt__comm_bind(cfg ? cfg->bind : NULL, c->local_rank, c->local_size, own, nown), st, fail);
  }
  DT_CHECK_GOTO(comm_connect_transport(c, &peers), st, fail);
  DT_LOG_DEBUG("joined: rank %d of %d (local %d of %d), transport %s, store %s:%d (%s)", c->rank, c->size,
               c->local_rank, c->local_size, c->ops->name, c->env.store_host, c->env.store_port, env.source);
  *out = c;
  return DT_OK;

fail:
  if (c->health && st != DT_ERR_ABORTED)
    dt__comm_fail(c, st);
  comm_free(c);
  return st;
}

void dt_comm_destroy(dt_comm *c) {
  if (!c)
    return;
  /* Nonblocking calls not yet started fail; the progress thread stops before the transport
   * it uses goes away. */
  dt__progress_destroy(c->progress);
  c->progress = NULL;
  comm_free(c);
}

dt_status dt_comm_abort(dt_comm *c, const char *reason) {
  if (!c)
    return dt_set_error(DT_ERR_INVALID, "dt_comm_abort: the communicator is NULL");
  if (dt__comm_aborted(c))
    return dt__comm_abort_status(c);
  dt_set_error(DT_ERR_ABORTED, "rank %d: %s", c->world_ranks ? c->world_ranks[c->rank] : c->rank,
               reason && reason[0] ? reason : "aborted by the application");
  dt__comm_fail(c, DT_ERR_STATE); /* any status but OK, ABORTED, PEER: publishes the message as the verdict */
  return dt__comm_abort_status(c);
}

/* ---- split ---- */

typedef struct comm_member {
  int color, key, rank;
} comm_member;

static int comm_member_cmp(const void *a, const void *b) {
  const comm_member *x = a, *y = b;
  if (x->key != y->key)
    return x->key < y->key ? -1 : 1;
  return (x->rank > y->rank) - (x->rank < y->rank);
}

dt_status dt_comm_split(dt_comm *c, int color, int key, dt_comm **out) {
  if (!out)
    return dt_set_error(DT_ERR_INVALID, "dt_comm_split: out is NULL");
  *out = NULL;
  if (!c)
    return dt_set_error(DT_ERR_INVALID, "dt_comm_split: communicator is NULL");
  if (dt__comm_aborted(c))
    return dt__comm_abort_status(c);
  if (color < 0)
    color = DT_COMM_UNDEFINED;
  int64_t deadline = dt__comm_deadline(c);
  uint64_t id = ++c->nsplits;
  /* Running out of memory here fails the job, as any error of a collective does: the others are
   * in (or on their way into) the exchange below and learn why at once. */
  comm_member *all = dt__calloc(sizeof *all * (size_t)c->size);
  if (!all)
    return dt__comm_fail(c, dt__error_prefix(DT_ERR_NOMEM, "split #%llu of %d ranks", (unsigned long long)id, c->size));
  dt_status st = DT_OK;
  dt_comm *n = NULL;
  /* Colors and keys go round as an allgather of this communicator: checked against every rank's
   * call like any collective (a rank in another collective is a mismatch at once, not a wait to
   * the deadline) and ordered after this rank's pending nonblocking calls. */
  int32_t mine[2] = {color, key}, *pairs = dt__calloc(sizeof *pairs * 2 * (size_t)c->size);
  if (!pairs) {
    st = dt__error_prefix(DT_ERR_NOMEM, "split #%llu of %d ranks", (unsigned long long)id, c->size);
    goto done;
  }
  st = dt_comm_allgather(c, mine, pairs, 2, DT_I32);
  if (st != DT_OK) {
    st = dt__error_prefix(st, "split #%llu (its colors and keys exchanged by an allgather)", (unsigned long long)id);
    goto done;
  }
  for (int r = 0; r < c->size; r++)
    all[r] = (comm_member){pairs[2 * r] < 0 ? DT_COMM_UNDEFINED : pairs[2 * r], pairs[2 * r + 1], r};
  if (color == DT_COMM_UNDEFINED)
    goto done;
  int m = 0;
  for (int r = 0; r < c->size; r++)
    if (all[r].color == color)
      all[m++] = all[r];
  qsort(all, (size_t)m, sizeof *all, comm_member_cmp);
  n = comm_alloc(m);
  if (!n) {
    st = dt__error_prefix(DT_ERR_NOMEM, "split #%llu", (unsigned long long)id);
    goto done;
  }
  n->env = c->env;
  n->timeout_ms = c->timeout_ms;
  n->host_cpus = c->host_cpus;
  n->health = c->health;
  dt__health_retain(c->health);
  if (c->server && c->server_users) { /* the store stays up while the split is alive */
    n->server = c->server;
    n->server_users = c->server_users;
    atomic_fetch_add(n->server_users, 1);
  }
  for (int i = 0; i < m; i++) {
    n->world_ranks[i] = c->world_ranks[all[i].rank];
    if (all[i].rank == c->rank)
      n->rank = i;
  }
  int pl = snprintf(n->prefix, sizeof n->prefix, "%s%llu.%d/", c->prefix, (unsigned long long)id, color);
  if (pl < 0 || (size_t)pl >= sizeof n->prefix) {
    st = dt_set_error(DT_ERR_INVALID, "split #%llu: communicators nested too deeply (store prefix '%s...')",
                      (unsigned long long)id, c->prefix);
    goto done;
  }
  DT_CHECK_GOTO(dt__store_connect(c->env.store_host, c->env.store_port, c->env.secret, c->env.secret_len,
                                  n->world_ranks[n->rank], deadline, &n->store),
                st, done);
  comm_peers peers;
  st = comm_hosts(n, deadline, &peers);
  if (st == DT_OK && peers.host_cpus > 0)
    n->host_cpus = peers.host_cpus;
  if (st == DT_OK)
    st = comm_connect_transport(n, &peers);

done:
  dt__free(all);
  dt__free(pairs);
  if (st != DT_OK) {
    comm_free(n);
    return dt__comm_fail(c, st);
  }
  *out = n;
  return DT_OK;
}

/* ---- point to point ---- */

static dt_status comm_p2p_check(dt_comm *c, const void *buf, size_t count, dt_dtype t, int peer, const char *what,
                                size_t *bytes) {
  if (!c)
    return dt_set_error(DT_ERR_INVALID, "dt_comm_%s: communicator is NULL", what);
  /* a bad argument fails the job as in a collective: the peer must not wait for (or lose) the
   * message this call would have moved, nor the next call go on as if it had */
  size_t es = dt_dtype_size(t);
  if (!es)
    return dt__comm_fail(c, dt_set_error(DT_ERR_INVALID, "dt_comm_%s: invalid dtype %d", what, (int)t));
  if (peer < 0 || peer >= c->size || peer == c->rank)
    return dt__comm_fail(c, dt_set_error(DT_ERR_INVALID, "dt_comm_%s: rank %d: peer %d is not another rank of 0..%d",
                                         what, c->rank, peer, c->size - 1));
  if (count > SIZE_MAX / es)
    return dt__comm_fail(c, dt_set_error(DT_ERR_INVALID, "dt_comm_%s: count %zu x %zu bytes overflows", what, count,
                                         es));
  if (count && !buf)
    return dt__comm_fail(c, dt_set_error(DT_ERR_INVALID, "dt_comm_%s: buffer is NULL with count %zu", what, count));
  if (dt__comm_aborted(c))
    return dt__comm_abort_status(c);
  *bytes = count * es;
  return DT_OK;
}

dt_status dt_comm_send(dt_comm *c, const void *buf, size_t count, dt_dtype t, int peer, int tag) {
  size_t n = 0;
  DT_CHECK(comm_p2p_check(c, buf, count, t, peer, "send", &n));
  dt__progress_drain(c); /* after the nonblocking calls made before it */
  pthread_mutex_lock(&c->lock);
  dt__fp fp = {.seq = ++c->p2p_sent[peer], .count = count, .coll = DT_COLL_SEND, .dtype = (uint8_t)t, .root = tag};
  dt_status st = c->ops->sendrecv(c->tp, peer, buf, n, -1, NULL, 0, &fp, dt__comm_deadline(c));
  pthread_mutex_unlock(&c->lock);
  if (st != DT_OK)
    dt__comm_call_error(c, &fp, st);
  return dt__comm_fail(c, st);
}

dt_status dt_comm_recv(dt_comm *c, void *buf, size_t count, dt_dtype t, int peer, int tag) {
  size_t n = 0;
  DT_CHECK(comm_p2p_check(c, buf, count, t, peer, "recv", &n));
  dt__progress_drain(c); /* after the nonblocking calls made before it */
  pthread_mutex_lock(&c->lock);
  dt__fp fp = {.seq = ++c->p2p_recvd[peer], .count = count, .coll = DT_COLL_SEND, .dtype = (uint8_t)t, .root = tag};
  dt_status st = c->ops->sendrecv(c->tp, -1, NULL, 0, peer, buf, n, &fp, dt__comm_deadline(c));
  pthread_mutex_unlock(&c->lock);
  if (st != DT_OK)
    dt__comm_call_error(c, &fp, st);
  return dt__comm_fail(c, st);
}
