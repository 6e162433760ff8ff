/* run_elastic.c - the multi-host elastic agent of `dtrain run` (--nnodes > 1 with
 * --max-restarts): the agents of all hosts agree on each generation's members through an agent
 * store, run their local workers, and after a failure anywhere re-form with the hosts that are
 * still there.
 *
 * The agent store is a rendezvous store (comm/store.h) at --master HOST:PORT, hosted by the agent
 * of node 0. Keys of generation g:
 *   g<g>/join/<node>   "<addr>"   an agent that is ready for generation g (addr: its IP as seen
 *                                 on the route to the store)
 *   g<g>/members       "n:addr,n:addr,..." (original node numbers, ascending), or "abort:<why>"
 *   g<g>/stop          set by any agent whose workers failed: every agent stops its workers;
 *                      "grow <node>" when a host that is not a member asks to join
 *   current            the newest generation whose members were decided
 *   abort              "<why>": an agent whose workers failed in a way no restart mends (exit
 *                      code 2: usage or settings) ends the job; the next generation is "abort:"
 *   g<g>/blame         "<node> <what>" the first account of who failed (compare-and-set)
 *   g<g>/finished      count of agents whose generation ended well
 *   alive/<node>       a counter each agent bumps every 100 ms while it supervises (a lease;
 *                      the store's host reads the others' every 500 ms during a generation and
 *                      reports one that stops; every agent reports a store that stops answering)
 *   agent/<node>       "<addr> <pid> <nonce>": claimed by the agent of that node for as long as
 *                      its store connection is open (dt__store_claim), so a second agent with
 *                      the same --node-rank is refused (exit 2) and the job is left alone
 * The agent of the first member decides the members: everyone who joined within the join window
 * (all previous members, or the window's end; a member whose lease lapsed is not waited for),
 * minus hosts blamed for FAILS_TO_EXCLUDE failures. Generation g's workers meet at a store on the first member's host, port PORT+1+g,
 * so nothing of a failed generation can answer the next one. The world size is members x -n;
 * `dtrain train --batch` is global, so the per-worker batch follows.
 *
 * When the host of the agent store dies, its workers die with it, the other agents see their
 * workers fail and the store vanish, and the store moves: every agent tries the last members in
 * order and the first that is alive hosts a new store (same port, its own address).
 * A host that is not a member of the running generation (it was lost and its agent started
 * again, or it started late) joins the next one and asks the members to stop for it
 * ("grow"): they re-form with it, resuming from the last checkpoint; that is not a failure and
 * spends no restart. Not here: a host excluded for repeated failures coming back, joining while
 * the agent store is away from --master, or surviving the loss of a majority of hosts at once
 * while the store moves (each agent tries each candidate once per window). */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/launch.h"
#include "comm/store.h"
#include "comm/wire.h"
#include "core/core.h"

#define FAILS_TO_EXCLUDE 2
#define EL_MAX_NODES 256
#define EL_RPC_MS 2000 /* one store call */
/* An agent renews alive/<node> every poll tick (100 ms); this long without a renewal while the
 * others re-form means its host is gone. */
#define EL_LEASE_MS 1500

typedef struct el_member {
  int node;
  char addr[64];
} el_member;

typedef struct elastic {
  dt_launch_opts *base; /* the command line's options */
  int me;               /* this host's original node number */
  char my_addr[64];
  char store_addr[256];
  int store_port;
  uint8_t secret[256];
  size_t secret_len;
  dt__store_server *server; /* when this agent hosts the agent store */
  dt__store *st;
  el_member members[EL_MAX_NODES];
  int nmembers;
  int fails[EL_MAX_NODES]; /* blamed failures per original node (kept by whoever decides) */
  int gen;
  int64_t window_ms;
  int store_lost_node; /* the member whose agent store vanished (-1): its agent is gone */
  /* During a generation, the agent hosting the store watches the others' leases (by member
   * index): last value, when it last changed, and whether it is reported as lapsed. */
  int64_t lease_val[EL_MAX_NODES], lease_seen[EL_MAX_NODES], next_watch;
  bool lapsed[EL_MAX_NODES];
  bool store_silent; /* the agent store stopped answering during this generation (reported) */
  int64_t store_ok_ns, store_retry_ns; /* its last answer; when to ask a silent one again */
  int64_t last_poll_ns; /* this agent's last look during the generation (el_poll) */
  int grow_node;     /* >= 0: the running generation was stopped for this host to join */
  char claim[128];   /* agent/<me>'s value: "<addr> <pid> <nonce>", this agent and no other */
  bool duplicate;    /* refused: another live agent holds this node rank */
  int64_t env_timeout_ms; /* DTRAIN_TIMEOUT_MS as the workers read it (300 s unset) */
  int64_t job_end;        /* --timeout: when the whole job stops, every generation included */
} elastic;

/* This host's address on the route to host:port (a UDP connect sends nothing). */
static dt_status el_local_addr(const char *host, int port, char *buf, size_t n) {
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM}, *res;
  char ps[16];
  snprintf(ps, sizeof ps, "%d", port);
  int rc = getaddrinfo(host, ps, &hints, &res);
  if (rc)
    return dt_set_error(DT_ERR_INVALID, "cannot resolve %s: %s", host, gai_strerror(rc));
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a;
  socklen_t len = sizeof a;
  dt_status st = DT_OK;
  if (s < 0 || connect(s, res->ai_addr, res->ai_addrlen) != 0 || getsockname(s, (struct sockaddr *)&a, &len) != 0)
    st = dt__errno(DT_ERR_SYSTEM, "finding this host's address towards %s", host);
  else
    inet_ntop(AF_INET, &a.sin_addr, buf, (socklen_t)n);
  if (s >= 0)
    close(s);
  freeaddrinfo(res);
  return st;
}

static void el_disconnect(elastic *e) {
  dt__store_close(e->st);
  e->st = NULL;
}

/* Hosts the agent store here (on all interfaces, the agreed port). */
static dt_status el_host_store(elastic *e) {
  if (e->server)
    return DT_OK;
  /* world = nodes that may ever send heartbeats; agents send none, the detector stays idle. */
  DT_CHECK(dt__store_server_start(NULL, e->store_port, e->secret, e->secret_len, e->base->max_nodes, 3600000,
                                  &e->server, NULL));
  snprintf(e->store_addr, sizeof e->store_addr, "%s", e->my_addr);
  DT_LOG_INFO("dtrain run: node %d hosts the agent store on port %d", e->me, e->store_port);
  return DT_OK;
}

/* Claims agent/<me> on the connected store. Another agent that holds it is still connected, so
 * it is alive (or stopped; a killed one's claim went with its connection): this one must not
 * join, or the job would run two sets of the same ranks, the workers' store would refuse one,
 * and that would count as a failure. Sets e->duplicate then. */
static dt_status el_claim(elastic *e) {
  char key[32];
  snprintf(key, sizeof key, "agent/%d", e->me);
  dt_status st = dt__store_set(e->st, DT__STORE_AGENTS_KEY, "1", 1, dt__deadline_after_ms(EL_RPC_MS));
  if (st != DT_OK)
    return st;
  st = dt__store_claim(e->st, key, e->claim, strlen(e->claim), dt__deadline_after_ms(EL_RPC_MS));
  if (st != DT_ERR_STATE)
    return st;
  const char *from = strstr(dt_last_error(), "held by another connection, from ");
  char conn[96] = "", holder[128] = "", addr[64] = "";
  if (from)
    snprintf(conn, sizeof conn, "%s", from + strlen("held by another connection, from "));
  size_t n = 0;
  int pid = 0;
  if (dt__store_get(e->st, key, holder, sizeof holder - 1, &n, dt__deadline_after_ms(EL_RPC_MS)) == DT_OK) {
    holder[n] = '\0';
    if (sscanf(holder, "%63s %d", addr, &pid) != 2)
      pid = 0;
  }
  e->duplicate = true;
  char who[160];
  if (pid > 0)
    snprintf(who, sizeof who, "pid %d on %s", pid, addr);
  else
    snprintf(who, sizeof who, "connected from %s", conn[0] ? conn : "another address");
  return dt_set_error(DT_ERR_STATE, "another agent holds node rank %d (%s) and is still connected to the agent store "
                      "at %s:%d; this agent (pid %d on %s) was refused and leaves the job alone", e->me, who,
                      e->store_addr, e->store_port, (int)getpid(), e->my_addr);
}

static dt_status el_connect(elastic *e, const char *host, int64_t deadline) {
  el_disconnect(e);
  DT_CHECK(dt__store_connect(host, e->store_port, e->secret, e->secret_len, e->me, deadline, &e->st));
  snprintf(e->store_addr, sizeof e->store_addr, "%s", host);
  dt_status st = el_claim(e);
  if (st != DT_OK)
    el_disconnect(e);
  return st;
}

/* Node 0 could not host the agent store at --master: if that is because another agent of node 0
 * hosts it there, say so (e->duplicate); otherwise keep the error. */
static dt_status el_host_failed(elastic *e, dt_status st) {
  char keep[1024];
  snprintf(keep, sizeof keep, "%s", dt_last_error());
  if (el_connect(e, e->base->master_addr, dt__deadline_after_ms(EL_RPC_MS)) != DT_OK && e->duplicate)
    return DT_ERR_STATE;
  el_disconnect(e);
  return dt_set_error(st, "%s", keep);
}

/* After the store vanished: the first of the last members that is alive hosts it. Each agent
 * walks the same list; a candidate that is not this host gets a bounded number of tries. */
static dt_status el_move_store(elastic *e) {
  el_disconnect(e);
  for (int k = 0; k < e->nmembers; k++) {
    const el_member *m = &e->members[k];
    if (m->node == e->me) {
      DT_CHECK(el_host_store(e));
      return el_connect(e, e->my_addr, dt__deadline_after_ms(EL_RPC_MS));
    }
    if (!strcmp(m->addr, e->store_addr) && k == 0) {
      e->store_lost_node = m->node; /* the host that just vanished: not waited for */
      continue;
    }
    if (el_connect(e, m->addr, dt__deadline_after_ms(e->window_ms / 2)) == DT_OK) {
      DT_LOG_WARN("dtrain run: the agent store moved to node %d (%s)", m->node, m->addr);
      return DT_OK;
    }
    if (e->duplicate)
      return DT_ERR_STATE;
  }
  return dt_set_error(DT_ERR_PEER, "no surviving host could host the agent store");
}

static void el_key(char *buf, size_t n, int gen, const char *what) { snprintf(buf, n, "g%d/%s", gen, what); }

/* How long the first generation waits for its hosts: what is left of --timeout if given, else
 * DTRAIN_TIMEOUT_MS (the workers' deadline), else 300 s. */
static int64_t el_first_wait_ms(const elastic *e) {
  if (e->base->timeout_ms > 0)
    return DT_MAX(1, dt__ms_left(e->job_end));
  return e->env_timeout_ms;
}

/* Every 10 s of waiting (a quarter of a shorter wait, at least 1 s): one line saying for whom
 * (nobody wonders whether the job hangs). */
#define EL_SAY_MS 10000

static int64_t el_say_ms(int64_t wait_ms) {
  int64_t s = wait_ms / 4;
  return s < 1000 ? 1000 : s > EL_SAY_MS ? EL_SAY_MS : s;
}

/* Parses "n:addr,n:addr" into e->members. */
static dt_status el_parse_members(elastic *e, const char *v) {
  e->nmembers = 0;
  const char *p = v;
  while (*p && e->nmembers < EL_MAX_NODES) {
    el_member *m = &e->members[e->nmembers];
    int used = 0;
    if (sscanf(p, "%d:%63[^,]%n", &m->node, m->addr, &used) != 2)
      return dt_set_error(DT_ERR_PROTOCOL, "agent store: bad members list '%s'", v);
    e->nmembers++;
    p += used;
    if (*p == ',')
      p++;
  }
  return DT_OK;
}

/* The decider's part: who joined generation gen within the window. */
static dt_status el_decide(elastic *e, char *val, size_t cap) {
  char key[64];
  int64_t wait_ms = e->gen == 0 ? el_first_wait_ms(e) : e->window_ms, say_ms = el_say_ms(wait_ms);
  int64_t t0 = dt_now_ns(), end = dt__deadline_after_ms(wait_ms);
  int64_t say = dt__deadline_after_ms(say_ms), last_call = DT_NO_DEADLINE;
  int candidates[EL_MAX_NODES], nc = 0;
  if (e->gen == 0) {
    for (int n = 0; n < e->base->nnodes; n++)
      candidates[nc++] = n;
  } else {
    for (int k = 0; k < e->nmembers; k++)
      candidates[nc++] = e->members[k].node;
  }
  /* Hosts that are not members but joined this generation already (a lost host whose agent
   * started again, or a late one) come in too, up to --max-nodes. */
  for (int n = 0; e->gen > 0 && n < e->base->nnodes && nc < e->base->max_nodes && nc < EL_MAX_NODES; n++) {
    bool known = false;
    for (int k = 0; k < nc; k++)
      known |= candidates[k] == n;
    char a[64];
    size_t an;
    snprintf(key, sizeof key, "g%d/join/%d", e->gen, n);
    if (!known && dt__store_get(e->st, key, a, sizeof a - 1, &an, dt__deadline_after_ms(EL_RPC_MS)) == DT_OK)
      candidates[nc++] = n;
  }
  /* Whoever failed too often is not waited for. */
  char blame[DT_STORE_MSG_MAX];
  size_t bn;
  el_key(key, sizeof key, e->gen - 1, "blame");
  if (e->gen > 0 && dt__store_get(e->st, key, blame, sizeof blame - 1, &bn, dt__deadline_after_ms(EL_RPC_MS)) == DT_OK) {
    blame[bn] = '\0';
    int who = atoi(blame);
    if (who >= 0 && who < EL_MAX_NODES && ++e->fails[who] >= FAILS_TO_EXCLUDE)
      fprintf(stderr, "dtrain run: node %d failed %d times; leaving it out from now on\n", who, e->fails[who]);
  }
  /* Wait for each candidate to join. From generation 1 on, a candidate whose agent stopped
   * renewing its lease (alive/<node>, every 100 ms) for EL_LEASE_MS is gone: no need to wait
   * out the window for a host that died or was cut off. */
  bool joined[EL_MAX_NODES] = {false}, gone[EL_MAX_NODES] = {false};
  char addrs[EL_MAX_NODES][64];
  int64_t lease[EL_MAX_NODES], lease_seen[EL_MAX_NODES];
  for (int k = 0; k < nc; k++) {
    lease[k] = -1;
    lease_seen[k] = dt_now_ns();
    gone[k] = e->fails[candidates[k]] >= FAILS_TO_EXCLUDE || candidates[k] == e->store_lost_node;
  }
  char why[DT_STORE_MSG_MAX];
  size_t wn;
  for (;;) {
    if (dt__store_get(e->st, "abort", why, sizeof why - 1, &wn, dt__deadline_after_ms(EL_RPC_MS)) == DT_OK) {
      why[wn] = '\0';
      snprintf(val, cap, "abort:%s", why);
      el_key(key, sizeof key, e->gen, "members");
      return dt__store_set(e->st, key, val, strlen(val), dt__deadline_after_ms(EL_RPC_MS));
    }
    int pending = 0;
    for (int k = 0; k < nc; k++) {
      if (joined[k] || gone[k])
        continue;
      int n = candidates[k];
      size_t an;
      snprintf(key, sizeof key, "g%d/join/%d", e->gen, n);
      dt_status st = dt__store_get(e->st, key, addrs[k], sizeof addrs[k] - 1, &an, dt__deadline_after_ms(EL_RPC_MS));
      if (st == DT_OK) {
        addrs[k][an] = '\0';
        joined[k] = true;
        continue;
      }
      if (st != DT_ERR_NOT_FOUND)
        return st;
      if (e->gen > 0) {
        char v[32];
        size_t vn;
        snprintf(key, sizeof key, "alive/%d", n);
        int64_t now = dt_now_ns(), cur = -1;
        if (dt__store_get(e->st, key, v, sizeof v - 1, &vn, dt__deadline_after_ms(EL_RPC_MS)) == DT_OK) {
          v[vn] = '\0';
          cur = atoll(v);
        }
        if (cur != lease[k]) {
          lease[k] = cur;
          lease_seen[k] = now;
        } else if (lease[k] >= 0 && now - lease_seen[k] > (int64_t)EL_LEASE_MS * 1000000LL) {
          /* (Never seen on this store, e.g. just after it moved: wait for the window instead.) */
          fprintf(stderr, "dtrain run: node %d shows no sign of life for %d ms; going on without it\n", n,
                  EL_LEASE_MS);
          gone[k] = true;
          continue;
        }
      }
      pending++;
    }
    if (pending == 0)
      break;
    int here = 0;
    for (int k = 0; k < nc; k++)
      here += joined[k];
    /* --min-nodes below the hosts listed: once that many are here, the others get one more
     * window (a "last call"), then the job starts without them */
    if (e->gen == 0 && e->base->min_nodes < nc && here >= e->base->min_nodes && last_call == DT_NO_DEADLINE)
      last_call = dt__deadline_after_ms(e->window_ms);
    if (dt__expired(say)) {
      char who[256] = "";
      size_t o = 0;
      for (int k = 0; k < nc && o < sizeof who - 8; k++)
        if (!joined[k] && !gone[k])
          o += (size_t)snprintf(who + o, sizeof who - o, "%s%d", o ? ", " : "", candidates[k]);
      fprintf(stderr, "dtrain run: node %d: waiting for node%s %s to join generation %d (%d of %d here, %.0f s)\n",
              e->me, pending == 1 ? "" : "s", who, e->gen, here, nc, (double)(dt_now_ns() - t0) / 1e9);
      say = dt__deadline_after_ms(say_ms);
    }
    if (dt__expired(end) || dt__expired(last_call)) {
      for (int k = 0; k < nc; k++)
        if (!joined[k] && !gone[k])
          fprintf(stderr, "dtrain run: node %d did not join generation %d; going on without it\n", candidates[k],
                  e->gen);
      break;
    }
    dt__sleep_ns(50 * 1000000LL);
  }
  size_t o = 0;
  int count = 0;
  val[0] = '\0';
  for (int k = 0; k < nc; k++) {
    if (!joined[k])
      continue;
    o += (size_t)snprintf(val + o, cap - o, "%s%d:%s", count ? "," : "", candidates[k], addrs[k]);
    count++;
  }
  if (count < e->base->min_nodes)
    snprintf(val, cap, "abort:only %d host%s left for generation %d, --min-nodes is %d", count, count == 1 ? "" : "s",
             e->gen, e->base->min_nodes);
  el_key(key, sizeof key, e->gen, "members");
  DT_CHECK(dt__store_set(e->st, key, val, strlen(val), dt__deadline_after_ms(EL_RPC_MS)));
  char g[16];
  snprintf(g, sizeof g, "%d", e->gen);
  return dt__store_set(e->st, "current", g, strlen(g), dt__deadline_after_ms(EL_RPC_MS));
}

/* Is node a member of the members list v ("n:addr,n:addr")? */
static bool el_listed(const char *v, int node) {
  for (const char *p = v; p && *p; p = strchr(p, ','), p = p ? p + 1 : NULL)
    if (atoi(p) == node && strchr(p, ':'))
      return true;
  return false;
}

/* An agent starting while the job already runs a generation it is not a member of: it joins
 * the next generation and asks the members to stop for it. Sets e->gen. */
static dt_status el_late_join(elastic *e) {
  char cur[16], key[64], val[EL_MAX_NODES * 72];
  size_t n;
  if (dt__store_get(e->st, "current", cur, sizeof cur - 1, &n, dt__deadline_after_ms(EL_RPC_MS)) != DT_OK)
    return DT_OK; /* the job is still forming its first generation */
  cur[n] = '\0';
  int g = atoi(cur);
  el_key(key, sizeof key, g, "members");
  DT_CHECK(dt__store_get(e->st, key, val, sizeof val - 1, &n, dt__deadline_after_ms(EL_RPC_MS)));
  val[n] = '\0';
  if (strncmp(val, "abort:", 6) == 0 || el_listed(val, e->me))
    return DT_OK;
  e->gen = g + 1;
  snprintf(key, sizeof key, "g%d/join/%d", e->gen, e->me);
  DT_CHECK(dt__store_set(e->st, key, e->my_addr, strlen(e->my_addr), dt__deadline_after_ms(EL_RPC_MS)));
  char grow[32];
  snprintf(grow, sizeof grow, "grow %d", e->me);
  el_key(key, sizeof key, g, "stop");
  int swapped;
  DT_CHECK(dt__store_cas(e->st, key, NULL, 0, grow, strlen(grow), &swapped, dt__deadline_after_ms(EL_RPC_MS)));
  fprintf(stderr, "dtrain run: node %d: the job runs generation %d without this host; joining generation %d\n", e->me,
          g, e->gen);
  return DT_OK;
}

/* Joins generation e->gen and learns its members. DT_ERR_ABORTED when the job cannot go on. */
static dt_status el_join(elastic *e) {
  char key[64], val[EL_MAX_NODES * 72];
  for (int attempt = 0; attempt < 3; attempt++) {
    if (e->st && dt__store_broken(e->st))
      el_disconnect(e);
    if (!e->st) {
      if (e->gen == 0) {
        dt_status hst = e->me == 0 ? el_host_store(e) : DT_OK;
        if (hst != DT_OK)
          return el_host_failed(e, hst);
        DT_CHECK(el_connect(e, e->me == 0 ? e->my_addr : e->base->master_addr,
                            dt__deadline_after_ms(el_first_wait_ms(e))));
        if (e->me != 0)
          DT_CHECK(el_late_join(e));
      } else {
        DT_CHECK(el_move_store(e));
      }
    }
    snprintf(key, sizeof key, "g%d/join/%d", e->gen, e->me);
    dt_status st = dt__store_set(e->st, key, e->my_addr, strlen(e->my_addr), dt__deadline_after_ms(EL_RPC_MS));
    /* The decider is the first of the previous members still here: the store's host. */
    bool decider = e->server != NULL;
    if (!st && decider)
      st = el_decide(e, val, sizeof val);
    size_t n = 0;
    el_key(key, sizeof key, e->gen, "members");
    int64_t wait_ms = e->gen == 0 ? el_first_wait_ms(e) + e->window_ms : 4 * e->window_ms;
    int64_t t0 = dt_now_ns(), end = dt__deadline_after_ms(wait_ms);
    while (!st) {
      int64_t slice = dt__deadline_after_ms(el_say_ms(wait_ms));
      st = dt__store_wait_flags(e->st, key, val, sizeof val - 1, &n, DT_STORE_WAIT_IGNORE_VERDICT,
                                slice < end ? slice : end);
      if (st != DT_ERR_TIMEOUT || dt__expired(end))
        break;
      fprintf(stderr, "dtrain run: node %d: waiting for the members of generation %d (%.0f s)\n", e->me, e->gen,
              (double)(dt_now_ns() - t0) / 1e9);
      st = DT_OK;
    }
    if (st == DT_OK) {
      val[n] = '\0';
      if (!strncmp(val, "abort:", 6))
        return dt_set_error(DT_ERR_ABORTED, "%s", val + 6);
      DT_CHECK(el_parse_members(e, val));
      return DT_OK;
    }
    if (st == DT_ERR_ABORTED || st == DT_ERR_INVALID || st == DT_ERR_AUTH || e->duplicate)
      return st;
    /* Closed, reset or silent (a cut link): look for the store again. */
    DT_LOG_WARN("dtrain run: lost the agent store while joining generation %d: %s", e->gen, dt_last_error());
    el_disconnect(e);
  }
  return dt_set_error(DT_ERR_PEER, "could not reach any agent store for generation %d", e->gen);
}

/* Starts the lease watch of a generation: every member counts as seen now. */
static void el_watch_start(elastic *e) {
  int64_t now = dt_now_ns();
  for (int k = 0; k < e->nmembers; k++) {
    e->lease_val[k] = -1;
    e->lease_seen[k] = now;
    e->lapsed[k] = false;
  }
  e->next_watch = now;
  e->store_silent = false;
  e->store_ok_ns = now;
  e->store_retry_ns = 0;
  e->last_poll_ns = now;
}

/* The store host's watch over the other agents while their workers run (every 500 ms): an
 * agent whose lease stops moving for EL_LEASE_MS is hung or cut off from the store. Its
 * workers may still be healthy, so the job goes on (they fail, and the job re-forms without
 * that host, if anything breaks); it is reported at once and not waited for at the end. */
static void el_watch_leases(elastic *e) {
  int64_t now = dt_now_ns();
  if (!e->server || now < e->next_watch)
    return;
  e->next_watch = now + 500 * 1000000LL;
  for (int k = 0; k < e->nmembers; k++) {
    int node = e->members[k].node;
    if (node == e->me)
      continue;
    char key[64], v[32];
    size_t vn;
    snprintf(key, sizeof key, "alive/%d", node);
    if (dt__store_get(e->st, key, v, sizeof v - 1, &vn, dt__deadline_after_ms(300)) != DT_OK)
      continue;
    v[vn] = '\0';
    int64_t cur = atoll(v);
    if (cur != e->lease_val[k]) {
      if (e->lapsed[k])
        fprintf(stderr, "dtrain run: node %d: the agent of node %d renews its lease again\n", e->me, node);
      e->lease_val[k] = cur;
      e->lease_seen[k] = now;
      e->lapsed[k] = false;
    } else if (!e->lapsed[k] && now - e->lease_seen[k] > (int64_t)EL_LEASE_MS * 1000000LL) {
      e->lapsed[k] = true;
      char what[200];
      snprintf(what, sizeof what, "the agent of node %d shows no sign of life for %d ms (hung or cut off from the store)",
               node, EL_LEASE_MS);
      fprintf(stderr, "dtrain run: node %d: generation %d: %s; its workers go on, the job re-forms without it if "
                      "anything fails\n", e->me, e->gen, what);
      dt__run_event("agent-lost", e->me, e->gen, now, 0, what);
    }
  }
}

/* Reads g<gen>/stop: DT_OK if set (then, for "grow <node>", e->grow_node = node). */
static dt_status el_stop_asked(elastic *e, int ms) {
  char key[64], v[32];
  size_t n;
  el_key(key, sizeof key, e->gen, "stop");
  dt_status st = dt__store_get(e->st, key, v, sizeof v - 1, &n, dt__deadline_after_ms(ms));
  if (st == DT_OK) {
    v[n] = '\0';
    if (e->grow_node < 0 && !strncmp(v, "grow ", 5))
      e->grow_node = atoi(v + 5);
  }
  return st;
}

/* Poll function during a generation: another host's failure, or the store gone. */
static bool el_poll(void *ctx) {
  elastic *e = ctx;
  int64_t now = dt_now_ns();
  if (now - e->last_poll_ns > (int64_t)EL_LEASE_MS * 1000000LL) {
    /* This agent itself did not run (stopped, or starved of the CPU): the store's answers and
     * the others' leases it missed meanwhile are not their silence. Its watch starts over. */
    fprintf(stderr, "dtrain run: node %d: this agent did not run for %.1f s (stopped, or without a CPU); its "
                    "watch over the store and the other agents starts over\n", e->me,
            (double)(now - e->last_poll_ns) / 1e9);
    e->store_ok_ns = now;
    for (int k = 0; k < e->nmembers; k++)
      e->lease_seen[k] = now;
    e->next_watch = now;
  }
  e->last_poll_ns = now;
  bool silent = now - e->store_ok_ns > (int64_t)EL_LEASE_MS * 1000000LL;
  if (!e->st || dt__store_broken(e->st) || silent) {
    /* The workers see a real failure themselves; the store's host may only be hung. Said once,
     * so that a silent supervisor does not go unnoticed until the next failure. */
    if (!e->store_silent) {
      e->store_silent = true;
      fprintf(stderr, "dtrain run: node %d: the agent store at %s:%d stopped answering during generation %d; "
                      "the workers go on, and the store moves if the job re-forms\n", e->me, e->store_addr,
              e->store_port, e->gen);
      dt__run_event("store-lost", e->me, e->gen, dt_now_ns(), 0, e->store_addr);
    }
    /* A silent (not broken) store is asked again now and then, not at every tick: each
     * unanswered call would hold up the supervision of the workers. */
    if (!e->st || dt__store_broken(e->st) || now < e->store_retry_ns)
      return false;
    e->store_retry_ns = now + 1000 * 1000000LL;
  }
  char key[64];
  int64_t beat;
  snprintf(key, sizeof key, "alive/%d", e->me);
  if (dt__store_add(e->st, key, 1, &beat, dt__deadline_after_ms(300)) == DT_OK) {
    e->store_ok_ns = dt_now_ns();
    if (e->store_silent)
      fprintf(stderr, "dtrain run: node %d: the agent store answers again\n", e->me);
    e->store_silent = false;
  }
  dt_status st = el_stop_asked(e, 500);
  if (st != DT_OK && !dt__store_broken(e->st))
    el_watch_leases(e);
  return st == DT_OK;
}

/* The node a failure account names ("rank R failed" -> R's host), else this host. */
static int el_blame(const elastic *e, dt_job *job, const char *what) {
  const char *p = strstr(what, "rank ");
  for (; p; p = strstr(p + 5, "rank ")) {
    int r = dt__run_failed_rank(p);
    if (r >= 0) {
      int idx = r / e->base->nproc;
      if (idx >= 0 && idx < e->nmembers)
        return e->members[idx].node;
    }
  }
  if (job->first_failed >= 0 && job->w[job->first_failed].sig)
    return e->me;
  return job->first_failed >= 0 ? e->me : -1;
}

int dt__run_elastic(dt_launch_opts *base) {
  elastic e;
  memset(&e, 0, sizeof e);
  e.base = base;
  e.me = base->node_rank;
  e.store_port = base->master_port;
  e.store_lost_node = -1;
  e.job_end = base->timeout_ms > 0 ? dt__deadline_after_ms(base->timeout_ms) : DT_NO_DEADLINE;
  int64_t fault_ms = base->fault_timeout_ms > 0 ? base->fault_timeout_ms : 10000;
  e.window_ms = fault_ms + base->kill_after_ms + 1000;
  /* the workers refuse a bad value at start; the agent must not wait by a misread one first */
  if (dt__env_int_range("DTRAIN_TIMEOUT_MS", 300000, 1, INT_MAX, &e.env_timeout_ms) != DT_OK)
    return dt_cli_usage_error("run", "DTRAIN_TIMEOUT_MS is the workers' deadline in milliseconds", "%s",
                              dt_last_error());
  if (dt__secret_load(NULL, e.secret, sizeof e.secret, &e.secret_len) != DT_OK)
    return dt_cli_fail("run", "job secret");
  if (el_local_addr(base->master_addr, base->master_port, e.my_addr, sizeof e.my_addr) != DT_OK)
    return dt_cli_fail("run", "elastic agent");
  uint8_t nonce[8];
  if (dt__random_bytes(nonce, sizeof nonce) != DT_OK)
    return dt_cli_fail("run", "elastic agent");
  int cl = snprintf(e.claim, sizeof e.claim, "%s %d ", e.my_addr, (int)getpid());
  for (size_t k = 0; k < sizeof nonce; k++)
    cl += snprintf(e.claim + cl, sizeof e.claim - (size_t)cl, "%02x", nonce[k]);
  dt__run_failure fails[64];
  int nfails = 0, rc = 1;
  int64_t detect_ns = 0;
  for (e.gen = 0;; e.gen++) {
    if (el_join(&e) != DT_OK) {
      if (e.duplicate) {
        rc = dt_cli_usage_error("run", "every host needs its own --node-rank below --nnodes; to replace that agent, "
                                "stop it first (a killed agent's node rank is free at once)", "node %d: %s", e.me,
                                dt_last_error());
        break;
      }
      if (dt__expired(e.job_end)) { /* what the join waited for was --timeout's rest */
        fprintf(stderr, "dtrain run: node %d: --timeout %.3g s passed while forming generation %d: %s\n", e.me,
                (double)base->timeout_given_ms / 1e3, e.gen, dt_last_error());
        rc = 124;
        break;
      }
      fprintf(stderr, "dtrain run: node %d: cannot form generation %d: %s\n", e.me, e.gen, dt_last_error());
      rc = 1;
      break;
    }
    int pos = -1;
    for (int k = 0; k < e.nmembers; k++)
      if (e.members[k].node == e.me)
        pos = k;
    if (pos < 0) {
      fprintf(stderr, "dtrain run: node %d was left out of generation %d (its workers failed repeatedly)\n", e.me,
              e.gen);
      rc = 1;
      break;
    }
    dt_launch_opts o = *base;
    if (base->timeout_ms > 0) { /* the rest of it: --timeout bounds the whole job */
      if (dt__expired(e.job_end)) {
        fprintf(stderr, "dtrain run: node %d: --timeout %.3g s passed before generation %d could start\n", e.me,
                (double)base->timeout_given_ms / 1e3, e.gen);
        rc = 124;
        break;
      }
      o.timeout_ms = DT_MAX(1, dt__ms_left(e.job_end));
    }
    o.nnodes = e.nmembers;
    o.node_rank = pos;
    snprintf(o.master_addr, sizeof o.master_addr, "%s", e.members[0].addr);
    o.master_port = base->master_port + 1 + e.gen;
    char v[32];
    snprintf(v, sizeof v, "%d", e.gen);
    setenv("DTRAIN_RESTART_COUNT", v, 1);
    if (dt__run_job_env(&o) != DT_OK)
      return dt_cli_fail("run", "job environment");
    if (e.me == e.members[0].node || e.gen > 0)
      fprintf(stderr, "dtrain run: node %d: generation %d with %d host%s (world size %d), workers' store %s:%d\n",
              e.me, e.gen, e.nmembers, e.nmembers == 1 ? "" : "s", e.nmembers * o.nproc, o.master_addr,
              o.master_port);
    dt_out *out = dt__out_create(o.nproc, o.node_rank * o.nproc, o.out_mode, o.raw_stdout, o.tail_lines);
    if (!out)
      return dt_cli_fail("run", "out of memory");
    dt_job job;
    if (dt__launch_start(&job, &o, out)) {
      dt__out_destroy(out);
      return dt_cli_fail("run", "cannot start the workers");
    }
    if (nfails > 0 && fails[nfails - 1].gen == e.gen - 1)
      fails[nfails - 1].restart_s = (double)(job.start_ns - detect_ns) / 1e9;
    dt__run_event("start", e.me, e.gen, job.start_ns, e.nmembers * o.nproc, NULL);
    el_watch_start(&e);
    e.grow_node = -1;
    dt__launch_supervise_poll(&job, el_poll, &e);
    char key[64];
    if (job.outcome == DT_JOB_OK) {
      el_key(key, sizeof key, e.gen, "finished");
      int64_t fin = 0;
      if (e.st && !dt__store_broken(e.st))
        dt__store_add(e.st, key, 1, &fin, dt__deadline_after_ms(EL_RPC_MS));
      /* The store's host stays until every member finished (bounded), so nobody loses it; an
       * agent whose lease lapsed is not waited for. */
      int lapsed = 0;
      for (int k = 0; k < e.nmembers; k++)
        lapsed += e.lapsed[k];
      for (int t = 0; e.server && fin < e.nmembers - lapsed && t < 200; t++) {
        dt__sleep_ns(50 * 1000000LL);
        if (dt__store_add(e.st, key, 0, &fin, dt__deadline_after_ms(EL_RPC_MS)) != DT_OK)
          break;
      }
      dt__run_event("end", e.me, e.gen, dt_now_ns(), e.nmembers * o.nproc, "ok");
      rc = dt__run_report(&job);
      dt__launch_finish(&job);
      dt__out_destroy(out);
      break;
    }
    bool failed = job.outcome == DT_JOB_FAILED;
    /* Our workers may have failed only because another host stopped its own for a joining
     * host before we saw the request: ask once more. */
    if (failed && e.grow_node < 0 && e.st && !dt__store_broken(e.st))
      (void)el_stop_asked(&e, EL_RPC_MS);
    if (failed && e.grow_node >= 0) {
      /* Stopped for a host to join, not by a failure: no blame, no restart spent. */
      fprintf(stderr, "dtrain run: node %d: generation %d stopped for node %d to join; re-forming\n", e.me, e.gen,
              e.grow_node);
      dt__run_event("grow", e.me, e.gen, dt_now_ns(), e.nmembers * o.nproc, "");
      dt__out_settle(out);
      dt__launch_finish(&job);
      dt__out_destroy(out);
      continue;
    }
    if (failed) {
      dt__run_failure *f = &fails[nfails < 64 ? nfails : 63];
      f->gen = e.gen;
      dt__run_describe_failure(&job, f->what, sizeof f->what);
      detect_ns = job.detect_ns ? job.detect_ns : dt_now_ns();
      f->detect_s = (double)(detect_ns - job.start_ns) / 1e9;
      f->restart_s = -1;
      if (nfails < 64)
        nfails++;
      dt__run_event("failure", e.me, e.gen, detect_ns, e.nmembers * o.nproc, f->what);
      if (e.st && !dt__store_broken(e.st)) {
        el_key(key, sizeof key, e.gen, "stop");
        int set; /* compare-and-set: a "grow" request already there must stay readable */
        dt__store_cas(e.st, key, NULL, 0, "1", 1, &set, dt__deadline_after_ms(EL_RPC_MS));
        int who = el_blame(&e, &job, f->what);
        if (who >= 0) {
          char b[700];
          int bl = snprintf(b, sizeof b, "%d %s", who, f->what);
          int swapped;
          el_key(key, sizeof key, e.gen, "blame");
          dt__store_cas(e.st, key, NULL, 0, b, (size_t)DT_MIN(bl, (int)sizeof b - 1), &swapped,
                        dt__deadline_after_ms(EL_RPC_MS));
        } else {
          /* Our workers only saw that something failed elsewhere: the agent whose workers failed
           * first says who (bounded wait), and the summary tells that instead. */
          char b[DT_STORE_MSG_MAX];
          size_t bn;
          el_key(key, sizeof key, e.gen, "blame");
          if (dt__store_wait_flags(e.st, key, b, sizeof b - 1, &bn, DT_STORE_WAIT_IGNORE_VERDICT,
                                   dt__deadline_after_ms(EL_RPC_MS)) == DT_OK) {
            b[bn] = '\0';
            const char *sp = strchr(b, ' ');
            snprintf(f->what, sizeof f->what, "on node %d: %s", atoi(b), sp ? sp + 1 : "a failure");
          }
        }
      }
    }
    bool final = failed && dt__run_not_restartable(&job);
    if (final && e.st && !dt__store_broken(e.st)) {
      char why[600];
      int wl = snprintf(why, sizeof why, "node %d: %s, which a restart would not mend", e.me, fails[nfails - 1].what);
      int swapped;
      dt__store_cas(e.st, "abort", NULL, 0, why, (size_t)DT_MIN(wl, (int)sizeof why - 1), &swapped,
                    dt__deadline_after_ms(EL_RPC_MS));
      /* The next generation is decided now: every other agent learns it when it joins. The
       * store's host stays until they have joined (bounded), so that none of them misses it. */
      char m[DT_STORE_MSG_MAX];
      snprintf(m, sizeof m, "abort:%s", why);
      el_key(key, sizeof key, e.gen + 1, "members");
      dt__store_set(e.st, key, m, strlen(m), dt__deadline_after_ms(EL_RPC_MS));
      for (int64_t end = dt__deadline_after_ms(e.window_ms); e.server && !dt__expired(end);) {
        int joined = 0;
        for (int k = 0; k < e.nmembers; k++) {
          char a[64];
          size_t an;
          snprintf(key, sizeof key, "g%d/join/%d", e.gen + 1, e.members[k].node);
          joined += e.members[k].node == e.me ||
                    dt__store_get(e.st, key, a, sizeof a - 1, &an, dt__deadline_after_ms(EL_RPC_MS)) == DT_OK;
        }
        if (joined == e.nmembers) {
          dt__sleep_ns(500 * 1000000LL); /* their reads of the members follow their joins */
          break;
        }
        dt__sleep_ns(50 * 1000000LL);
      }
    }
    if (!failed || final || nfails > base->max_restarts) {
      rc = dt__run_report(&job);
      dt__launch_finish(&job);
      dt__out_destroy(out);
      break;
    }
    dt__out_settle(out);
    fprintf(stderr, "dtrain run: node %d: generation %d failed: %s; re-forming (restart %d of %d)\n", e.me, e.gen,
            fails[nfails - 1].what, nfails, base->max_restarts);
    dt__launch_finish(&job);
    dt__out_destroy(out);
  }
  dt__run_print_failures(fails, nfails, base->max_restarts - nfails);
  el_disconnect(&e);
  if (e.server) {
    dt__store_server_stop(e.server);
    e.server = NULL;
  }
  explicit_bzero(e.secret, sizeof e.secret);
  return rc;
}
