/* faults.c - built-in fault injection (dtrain/fault.h): a strict parser for DTRAIN_FAULTS and
 * the faults themselves, fired from dt_fault_step() (the training loop) and dt__fault_send()
 * (a transport). Every worker parses the same spec and draws "any" ranks and step ranges from
 * the same seed, so all agree on who the victim is without talking.
 * Not here: noticing the failure (comm/store.c, comm/health.c) or recovering (cli/run.c). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "core/faults.h"
#include "dtrain/fault.h"

#define FAULT_MAX_ITEMS 16
#define FAULT_ANY (-1)

/* kill, stop and exit first: the kinds that take at= (kind <= F_EXIT) */
typedef enum { F_KILL, F_STOP, F_EXIT, F_DELAY, F_CLOSE, F_CORRUPT, F_DROP, F_SLOW, F_KINDS } fault_kind;
static const char *const fault_names[F_KINDS] = {"kill", "stop", "exit", "delay", "close", "corrupt-ckpt", "drop",
                                                 "slow"};

/* Probabilities are kept in parts per million (p=0.25 -> 250000). */
#define FAULT_PPM 1000000

typedef struct fault_item {
  fault_kind kind;
  int64_t rank;            /* FAULT_ANY until resolved */
  int64_t step_lo, step_hi; /* a single step once resolved */
  int64_t gen;             /* FAULT_ANY: every generation */
  int64_t ms, code;
  int64_t count, ppm;      /* drop: messages to drop (0: all from the step on), probability */
  bool truncate;
  dt_fault_at at;          /* kill, stop, exit: where in the step (at=) */
  char dir[512];
  atomic_bool fired;
} fault_item;

typedef struct fault_plan {
  fault_item items[FAULT_MAX_ITEMS];
  int n;
  uint64_t seed;
} fault_plan;

/* ---- parsing ---- */

static bool fault_num(const char *s, size_t n, int64_t *out) {
  if (n == 0 || n > 18)
    return false;
  int64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return false;
    v = v * 10 + (s[i] - '0');
  }
  *out = v;
  return true;
}

/* A probability 0 < p <= 1 as "1", "0.25" or ".5" (at most 6 decimals), in parts per million. */
static bool fault_prob(const char *s, size_t n, int64_t *ppm) {
  size_t i = 0;
  int64_t whole = 0, frac = 0, scale = FAULT_PPM;
  if (i < n && (s[i] == '0' || s[i] == '1'))
    whole = s[i++] - '0';
  if (i < n && s[i] == '.') {
    i++;
    if (i == n || n - i > 6)
      return false;
    for (; i < n; i++) {
      if (s[i] < '0' || s[i] > '9')
        return false;
      scale /= 10;
      frac += (s[i] - '0') * scale;
    }
  }
  if (i != n || n == 0)
    return false;
  *ppm = whole * FAULT_PPM + frac;
  return *ppm >= 1 && *ppm <= FAULT_PPM;
}

/* "S" or "A-B" (A <= B). */
static bool fault_range(const char *s, size_t n, int64_t *lo, int64_t *hi) {
  const char *dash = memchr(s, '-', n);
  if (!dash)
    return fault_num(s, n, lo) && (*hi = *lo, true);
  return fault_num(s, (size_t)(dash - s), lo) && fault_num(dash + 1, n - (size_t)(dash - s) - 1, hi) && *lo <= *hi;
}

static void fault_trim(const char **s, size_t *n) {
  while (*n && (**s == ' ' || **s == '\t')) {
    (*s)++;
    (*n)--;
  }
  while (*n && ((*s)[*n - 1] == ' ' || (*s)[*n - 1] == '\t'))
    (*n)--;
}

#define FAULT_BAD(...) dt_set_error(DT_ERR_INVALID, __VA_ARGS__)

/* The launcher checks rank=R against the world it starts; a worker does not, since an elastic
 * job may have shrunk below R (the fault then concerns nobody). Set only under fault_once or
 * in dt_fault_validate, which a launcher calls before any worker thread exists. */
static bool fault_check_ranks = true;

/* 0 if v (vn bytes) is w0, 1 if it is w1, else -1. */
static int fault_word(const char *v, size_t vn, const char *w0, const char *w1) {
  if (vn == strlen(w0) && !memcmp(v, w0, vn))
    return 0;
  if (vn == strlen(w1) && !memcmp(v, w1, vn))
    return 1;
  return -1;
}

/* One "key=value" of item `idx` (1-based, for messages). `seen` tracks duplicates. */
static dt_status fault_param(fault_item *it, int idx, const char *s, size_t n, unsigned *seen, int world) {
  const char *eq = memchr(s, '=', n);
  if (!eq)
    return FAULT_BAD("DTRAIN_FAULTS item %d (%s): '%.*s' is not KEY=VALUE", idx, fault_names[it->kind], (int)n, s);
  size_t kn = (size_t)(eq - s), vn = n - kn - 1;
  const char *v = eq + 1;
  static const char *const keys[] = {"rank", "step", "gen", "ms", "code", "dir", "mode", "count", "p", "at"};
  int k = -1;
  for (int i = 0; i < (int)DT_ARRAY_LEN(keys); i++)
    if (strlen(keys[i]) == kn && !memcmp(keys[i], s, kn))
      k = i;
  /* Which kinds take which keys beyond rank/step/gen. */
  bool ok_for_kind = k >= 0 && (k <= 2 || (k == 3 && (it->kind == F_DELAY || it->kind == F_SLOW)) || (k == 4 && it->kind == F_EXIT) ||
                                ((k == 5 || k == 6) && it->kind == F_CORRUPT) ||
                                ((k == 7 || k == 8) && it->kind == F_DROP) || (k == 9 && it->kind <= F_EXIT));
  if (!ok_for_kind)
    return FAULT_BAD("DTRAIN_FAULTS item %d (%s): unknown key '%.*s' (keys: rank, step, gen%s)", idx,
                     fault_names[it->kind], (int)kn, s,
                     it->kind == F_DELAY || it->kind == F_SLOW ? ", ms"
                     : it->kind == F_EXIT    ? ", code, at"
                     : it->kind == F_CORRUPT ? ", dir, mode"
                     : it->kind == F_DROP    ? ", count, p"
                     : it->kind <= F_STOP    ? ", at"
                                             : "");
  if (*seen & (1u << k))
    return FAULT_BAD("DTRAIN_FAULTS item %d (%s): key '%s' given twice", idx, fault_names[it->kind], keys[k]);
  *seen |= 1u << k;
  bool good = true;
  switch (k) {
  case 0:
    if (vn == 3 && !memcmp(v, "any", 3))
      it->rank = FAULT_ANY;
    else
      good = fault_num(v, vn, &it->rank) && (world <= 0 || it->rank < world || !fault_check_ranks);
    if (!good)
      return FAULT_BAD("DTRAIN_FAULTS item %d (%s): rank=%.*s must be 'any' or 0..%d", idx, fault_names[it->kind],
                       (int)vn, v, world > 0 ? world - 1 : 1 << 20);
    break;
  case 1:
    good = fault_range(v, vn, &it->step_lo, &it->step_hi);
    break;
  case 2:
    if (vn == 3 && !memcmp(v, "any", 3))
      it->gen = FAULT_ANY;
    else
      good = fault_num(v, vn, &it->gen);
    break;
  case 3:
    good = fault_num(v, vn, &it->ms) && it->ms >= 1 && it->ms <= 600000;
    break;
  case 4:
    good = fault_num(v, vn, &it->code) && it->code <= 255;
    break;
  case 5:
    good = vn > 0 && vn < sizeof it->dir;
    if (good)
      memcpy(it->dir, v, vn);
    break;
  case 6: {
    int w = fault_word(v, vn, "flip", "truncate");
    it->truncate = w == 1;
    good = w >= 0;
    break;
  }
  case 7:
    good = fault_num(v, vn, &it->count) && it->count >= 1 && it->count <= INT32_MAX;
    break;
  case 8:
    good = fault_prob(v, vn, &it->ppm);
    break;
  case 9: {
    int w = fault_word(v, vn, "start", "update");
    it->at = w == 1 ? DT_FAULT_AT_UPDATE : DT_FAULT_AT_START;
    good = w >= 0;
    break;
  }
  }
  if (!good) {
    static const char *const want[] = {"", "a step S or a range A-B", "a generation number or 'any'",
                                       "milliseconds 1..600000", "an exit code 0..255", "a directory",
                                       "flip or truncate", "a number of messages 1..2147483647",
                                       "a probability 0 < p <= 1 (at most 6 decimals)", "start or update"};
    return FAULT_BAD("DTRAIN_FAULTS item %d (%s): %s=%.*s must be %s", idx, fault_names[it->kind], keys[k], (int)vn,
                     v, want[k]);
  }
  return DT_OK;
}

static dt_status fault_item_parse(fault_plan *p, int idx, const char *s, size_t n, int world) {
  const char *end = s + n;
  const char *colon = memchr(s, ':', n);
  size_t kn = colon ? (size_t)(colon - s) : n;
  fault_trim(&s, &kn);
  if (kn > 5 && !memcmp(s, "seed=", 5) && !colon) {
    int64_t v;
    if (!fault_num(s + 5, kn - 5, &v))
      return FAULT_BAD("DTRAIN_FAULTS item %d: seed=%.*s must be a non-negative integer", idx, (int)(kn - 5), s + 5);
    p->seed = (uint64_t)v;
    return DT_OK;
  }
  if (p->n == FAULT_MAX_ITEMS)
    return FAULT_BAD("DTRAIN_FAULTS: more than %d faults", FAULT_MAX_ITEMS);
  fault_item *it = &p->items[p->n];
  memset(it, 0, sizeof *it);
  it->kind = F_KINDS;
  for (int k = 0; k < F_KINDS; k++)
    if (strlen(fault_names[k]) == kn && !memcmp(fault_names[k], s, kn))
      it->kind = (fault_kind)k;
  if (it->kind == F_KINDS)
    return FAULT_BAD("DTRAIN_FAULTS item %d: unknown fault '%.*s' (kill, stop, exit, delay, slow, close, "
                     "drop, corrupt-ckpt, or seed=N)",
                     idx, (int)kn, s);
  it->code = 1;
  it->ppm = FAULT_PPM;
  unsigned seen = 0;
  if (colon) {
    const char *q = colon + 1;
    for (;;) {
      const char *comma = memchr(q, ',', (size_t)(end - q));
      const char *stop = comma ? comma : end;
      const char *ps = q;
      size_t pn = (size_t)(stop - q);
      fault_trim(&ps, &pn);
      if (pn == 0)
        return FAULT_BAD("DTRAIN_FAULTS item %d (%s): empty KEY=VALUE", idx, fault_names[it->kind]);
      DT_CHECK(fault_param(it, idx, ps, pn, &seen, world));
      if (!comma)
        break;
      q = comma + 1;
    }
  }
  if ((it->kind == F_DELAY || it->kind == F_SLOW) && !(seen & (1u << 3)))
    return FAULT_BAD("DTRAIN_FAULTS item %d (%s): needs ms=D", idx, fault_names[it->kind]);
  if (it->kind == F_SLOW) /* the time is spent inside the step's compute, as a slow CPU spends it */
    it->at = DT_FAULT_AT_UPDATE;
  if (it->kind == F_CORRUPT && !(seen & (1u << 5)))
    return FAULT_BAD("DTRAIN_FAULTS item %d (corrupt-ckpt): needs dir=PATH (the --checkpoint-dir)", idx);
  p->n++;
  return DT_OK;
}

/* Parses spec into p and draws "any" ranks and step ranges from the seed (world_size <= 0:
 * unknown, ranks are then only checked for being numbers). */
static dt_status fault_parse(const char *spec, int world, fault_plan *p) {
  memset(p, 0, sizeof *p);
  p->seed = 1;
  int idx = 0;
  const char *s = spec;
  for (;;) {
    const char *semi = strchr(s, ';');
    size_t n = semi ? (size_t)(semi - s) : strlen(s);
    const char *t = s;
    size_t tn = n;
    fault_trim(&t, &tn);
    idx++;
    if (tn == 0) {
      if (semi || idx > 1) /* only a wholly blank spec means "no faults" */
        return FAULT_BAD("DTRAIN_FAULTS item %d is empty ('%s')", idx, spec);
    } else {
      DT_CHECK(fault_item_parse(p, idx, t, tn, world));
    }
    if (!semi)
      break;
    s = semi + 1;
  }
  for (int i = 0; i < p->n; i++) {
    fault_item *it = &p->items[i];
    dt_rng r;
    dt_rng_seed(&r, p->seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(i + 1)));
    if (it->rank == FAULT_ANY)
      it->rank = world > 0 ? (int64_t)dt_rng_below(&r, (uint64_t)world) : 0;
    if (it->step_hi > it->step_lo)
      it->step_lo += (int64_t)dt_rng_below(&r, (uint64_t)(it->step_hi - it->step_lo + 1));
    it->step_hi = it->step_lo;
  }
  return DT_OK;
}

/* ---- this process's plan ---- */

static pthread_once_t fault_once = PTHREAD_ONCE_INIT;
static fault_plan fault_the_plan;
static dt_status fault_init_st;
static char fault_init_msg[512];
static int64_t fault_rank, fault_gen;
static atomic_bool fault_active;   /* any item concerns this rank and generation */
static atomic_int fault_delay_ms;  /* > 0 once a delay fault is live */
static atomic_int fault_slow_ms;   /* > 0 once a slow fault is live */
static atomic_bool fault_send_hooked;
/* A live drop fault: drop_left messages still to discard (-1: every one), each chosen with
 * probability drop_ppm by drop_rng (seeded from the spec's seed and this rank). */
static atomic_bool fault_drop_on;
static _Atomic int64_t fault_drop_left;
static int64_t fault_drop_ppm;
static dt_rng fault_drop_rng;
static pthread_mutex_t fault_drop_mu = PTHREAD_MUTEX_INITIALIZER;

static int64_t fault_env(const char *const names[], int n, int64_t def) {
  for (int i = 0; i < n; i++) {
    const char *v = getenv(names[i]);
    int64_t x;
    if (v && fault_num(v, strlen(v), &x))
      return x;
  }
  return def;
}

static void fault_init(void) {
  const char *spec = getenv("DTRAIN_FAULTS");
  if (!spec || !*spec)
    return;
  static const char *const rank_vars[] = {"DTRAIN_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"};
  static const char *const size_vars[] = {"DTRAIN_WORLD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"};
  static const char *const gen_vars[] = {"DTRAIN_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"};
  fault_rank = fault_env(rank_vars, 4, 0);
  fault_gen = fault_env(gen_vars, 2, 0);
  int world = (int)fault_env(size_vars, 4, 0);
  fault_check_ranks = false;
  fault_init_st = fault_parse(spec, world, &fault_the_plan);
  if (fault_init_st) {
    snprintf(fault_init_msg, sizeof fault_init_msg, "%s", dt_last_error());
    return;
  }
  bool any = false;
  for (int i = 0; i < fault_the_plan.n; i++) {
    fault_item *it = &fault_the_plan.items[i];
    any |= it->rank == fault_rank && (it->gen == FAULT_ANY || it->gen == fault_gen);
  }
  atomic_store(&fault_active, any);
}

static void fault_announce(const fault_item *it, int64_t step, const char *extra) {
  fprintf(stderr, "dtrain fault: rank %lld %s at step %lld (generation %lld, t=%lld)%s\n", (long long)fault_rank,
          fault_names[it->kind], (long long)step, (long long)fault_gen, (long long)dt_now_ns(), extra);
  fflush(stderr);
}

/* Shuts down every connected TCP socket of this process except the store's (local or remote
 * port = the master port): the transport's links break as a cut cable would look to peers. */
static int fault_close_links(void) {
  static const char *const port_vars[] = {"DTRAIN_MASTER_PORT", "MASTER_PORT"};
  int64_t store_port = fault_env(port_vars, 2, -1);
  DIR *d = opendir("/proc/self/fd");
  if (!d)
    return 0;
  int closed = 0, dfd = dirfd(d);
  struct dirent *e;
  while ((e = readdir(d))) {
    int64_t fd;
    if (!fault_num(e->d_name, strlen(e->d_name), &fd) || fd == dfd)
      continue;
    struct stat sb;
    if (fstat((int)fd, &sb) != 0 || !S_ISSOCK(sb.st_mode))
      continue;
    struct sockaddr_storage a, b;
    socklen_t la = sizeof a, lb = sizeof b;
    int type = 0;
    socklen_t lt = sizeof type;
    if (getsockopt((int)fd, SOL_SOCKET, SO_TYPE, &type, &lt) != 0 || type != SOCK_STREAM)
      continue;
    if (getsockname((int)fd, (struct sockaddr *)&a, &la) != 0 || getpeername((int)fd, (struct sockaddr *)&b, &lb) != 0)
      continue; /* listening or unconnected */
    if (a.ss_family != AF_INET && a.ss_family != AF_INET6)
      continue;
    int lport = ntohs(a.ss_family == AF_INET ? ((struct sockaddr_in *)&a)->sin_port : ((struct sockaddr_in6 *)&a)->sin6_port);
    int rport = ntohs(b.ss_family == AF_INET ? ((struct sockaddr_in *)&b)->sin_port : ((struct sockaddr_in6 *)&b)->sin6_port);
    if (lport == store_port || rport == store_port)
      continue;
    if (shutdown((int)fd, SHUT_RDWR) == 0)
      closed++;
  }
  closedir(d);
  return closed;
}

/* The newest ckpt-*.dtc in dir (names carry the zero-padded step, so the largest name). */
static bool fault_newest_ckpt(const char *dir, char *path, size_t cap) {
  DIR *d = opendir(dir);
  if (!d)
    return false;
  char best[256] = "";
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t n = strlen(e->d_name);
    if (n > 9 && !strncmp(e->d_name, "ckpt-", 5) && !strcmp(e->d_name + n - 4, ".dtc") && n < sizeof best &&
        strcmp(e->d_name, best) > 0)
      snprintf(best, sizeof best, "%s", e->d_name);
  }
  closedir(d);
  if (!best[0])
    return false;
  snprintf(path, cap, "%s/%s", dir, best);
  return true;
}

static void fault_corrupt(const fault_item *it, int64_t step) {
  char path[1024], extra[1100];
  if (!fault_newest_ckpt(it->dir, path, sizeof path)) {
    fault_announce(it, step, " - no checkpoint to corrupt");
    return;
  }
  int fd = open(path, O_RDWR | O_CLOEXEC);
  struct stat sb;
  if (fd < 0 || fstat(fd, &sb) != 0) {
    if (fd >= 0)
      close(fd);
    snprintf(extra, sizeof extra, " - cannot open %s: %s", path, strerror(errno));
    fault_announce(it, step, extra);
    return;
  }
  int rc;
  if (it->truncate) {
    rc = ftruncate(fd, sb.st_size / 2);
  } else {
    uint8_t buf[64];
    off_t at = sb.st_size / 2;
    ssize_t n = pread(fd, buf, sizeof buf, at);
    for (ssize_t i = 0; i < n; i++)
      buf[i] ^= 0xA5;
    rc = n > 0 && pwrite(fd, buf, (size_t)n, at) == n ? 0 : -1;
  }
  fsync(fd);
  close(fd);
  snprintf(extra, sizeof extra, " - %s %s%s", it->truncate ? "truncated" : "flipped bytes in", path,
           rc ? " (failed)" : "");
  fault_announce(it, step, extra);
}

dt_status dt_fault_step(int64_t step) { return dt_fault_point(step, DT_FAULT_AT_START); }

dt_status dt_fault_point(int64_t step, dt_fault_at at) {
  pthread_once(&fault_once, fault_init);
  if (fault_init_st)
    return dt_set_error(fault_init_st, "%s", fault_init_msg);
  if (!atomic_load_explicit(&fault_active, memory_order_relaxed))
    return DT_OK;
  for (int i = 0; i < fault_the_plan.n; i++) {
    fault_item *it = &fault_the_plan.items[i];
    if (it->rank != fault_rank || (it->gen != FAULT_ANY && it->gen != fault_gen) || step < it->step_lo)
      continue;
    if (it->kind != F_DELAY && it->kind != F_DROP && it->kind != F_SLOW && step != it->step_lo)
      continue;
    if (it->at != at)
      continue;
    if (atomic_exchange(&it->fired, true))
      continue;
    char extra[320] = "";
    const char *where = at == DT_FAULT_AT_UPDATE ? " - before its optimizer update" : "";
    switch (it->kind) {
    case F_KILL:
      fault_announce(it, step, where);
      kill(getpid(), SIGKILL);
      break;
    case F_STOP:
      fault_announce(it, step, where);
      kill(getpid(), SIGSTOP);
      break;
    case F_EXIT:
      snprintf(extra, sizeof extra, "%s - exit code %lld", where, (long long)it->code);
      fault_announce(it, step, extra);
      _exit((int)it->code);
    case F_DELAY:
      snprintf(extra, sizeof extra, " - %lld ms per message from now on", (long long)it->ms);
      fault_announce(it, step, extra);
      atomic_store(&fault_delay_ms, (int)it->ms);
      break;
    case F_SLOW:
      snprintf(extra, sizeof extra, " - %lld ms more compute per step from now on", (long long)it->ms);
      fault_announce(it, step, extra);
      atomic_store(&fault_slow_ms, (int)it->ms);
      break;
    case F_CLOSE: {
      int n = fault_close_links();
      snprintf(extra, sizeof extra, " - shut down %d connection%s", n, n == 1 ? "" : "s");
      fault_announce(it, step, extra);
      break;
    }
    case F_CORRUPT:
      fault_corrupt(it, step);
      break;
    case F_DROP: {
      char what[48] = "every data frame";
      if (it->count)
        snprintf(what, sizeof what, "%lld data frame%s", (long long)it->count, it->count == 1 ? "" : "s");
      if (it->ppm < FAULT_PPM)
        snprintf(extra, sizeof extra, " - discarding each data frame with p=%.6g (up to %s) on tcp", it->ppm / 1e6,
                 what);
      else
        snprintf(extra, sizeof extra, " - discarding %s it sends on tcp from now on", what);
      if (!atomic_load(&fault_send_hooked)) /* no tcp send so far: shm and mpi have no frames to drop */
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra),
                 "; but this rank has sent nothing over tcp, so it drops nothing (the fault needs DTRAIN_TRANSPORT=tcp)");
      fault_announce(it, step, extra);
      pthread_mutex_lock(&fault_drop_mu);
      dt_rng_seed(&fault_drop_rng, fault_the_plan.seed ^ (0xd1b54a32d192ed03ull * (uint64_t)(fault_rank + 1)) ^
                                       (uint64_t)(it - fault_the_plan.items));
      fault_drop_ppm = it->ppm;
      pthread_mutex_unlock(&fault_drop_mu);
      atomic_store(&fault_drop_left, it->count ? it->count : -1);
      atomic_store(&fault_drop_on, true);
      break;
    }
    case F_KINDS:
      break;
    }
  }
  int ms = atomic_load(&fault_delay_ms);
  if (ms > 0 && at == DT_FAULT_AT_START && !atomic_load(&fault_send_hooked)) /* once a step */
    dt__sleep_ns((int64_t)ms * 1000000LL);
  int slow = atomic_load(&fault_slow_ms);
  if (slow > 0 && at == DT_FAULT_AT_UPDATE)
    dt__sleep_ns((int64_t)slow * 1000000LL);
  return DT_OK;
}

void dt__fault_send(void) {
  if (!atomic_load_explicit(&fault_send_hooked, memory_order_relaxed))
    atomic_store(&fault_send_hooked, true);
  int ms = atomic_load_explicit(&fault_delay_ms, memory_order_relaxed);
  if (ms > 0)
    dt__sleep_ns((int64_t)ms * 1000000LL);
}

bool dt__fault_drop(void) {
  if (!atomic_load_explicit(&fault_drop_on, memory_order_relaxed))
    return false;
  pthread_mutex_lock(&fault_drop_mu);
  bool pick = fault_drop_ppm >= FAULT_PPM || (int64_t)dt_rng_below(&fault_drop_rng, FAULT_PPM) < fault_drop_ppm;
  pthread_mutex_unlock(&fault_drop_mu);
  if (!pick)
    return false;
  int64_t left = atomic_load(&fault_drop_left);
  while (left != 0) {
    if (left < 0 || atomic_compare_exchange_weak(&fault_drop_left, &left, left - 1))
      return true;
  }
  return false;
}

dt_status dt_fault_validate(const char *spec, int world_size) {
  if (!spec)
    return DT_OK;
  fault_plan p;
  return fault_parse(spec, world_size, &p);
}
