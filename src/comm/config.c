/* config.c - resolves how this process joins a job: explicit dt_comm_config fields first, then
 * the first launcher convention whose rank variable is set, in this order:
 *   dtrain    DTRAIN_RANK / DTRAIN_WORLD_SIZE / DTRAIN_LOCAL_RANK / DTRAIN_LOCAL_WORLD_SIZE
 *   torchrun  RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE
 *   openmpi   OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE
 *   slurm     SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID / SLURM_NTASKS_PER_NODE
 * and with none of them a single-rank job hosting its own store on 127.0.0.1. The store address
 * is DTRAIN_MASTER_ADDR/PORT, else MASTER_ADDR/PORT, else (Slurm) the first host of the step's
 * node list with DTRAIN_MASTER_PORT or MASTER_PORT. Every number is validated; a malformed one
 * is DT_ERR_INVALID naming the variable and its value.
 * Not here: bootstrapping through MPI itself (the MPI backend does that), or deriving local
 * rank/size from host names when no variable gives them (left -1 for dt_comm_create). */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/wire.h"

typedef struct cfg_convention {
  const char *name;
  const char *rank, *size, *local_rank, *local_size;
} cfg_convention;

static const cfg_convention cfg_conventions[] = {
    {"dtrain", "DTRAIN_RANK", "DTRAIN_WORLD_SIZE", "DTRAIN_LOCAL_RANK", "DTRAIN_LOCAL_WORLD_SIZE"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
};

/* An integer variable in [lo, hi]; unset leaves *out = def. */
static dt_status cfg_int(const char *name, int def, int lo, int hi, int *out) {
  int64_t v;
  DT_CHECK(dt__env_int_range(name, def, lo, hi, &v));
  *out = (int)v;
  return DT_OK;
}

/* Slurm writes SLURM_NTASKS_PER_NODE as "4" or "4(x2),3": the leading count is this node's
 * only when the list is uniform, so anything else is "unknown" (-1). */
static int cfg_slurm_per_node(void) {
  const char *s = dt__env_str("SLURM_NTASKS_PER_NODE");
  if (!s)
    return -1;
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || v < 1 || v > INT_MAX)
    return -1;
  if (*end == '\0' || (strncmp(end, "(x", 2) == 0 && !strchr(end, ',')))
    return (int)v;
  return -1;
}

/* First host of a Slurm node list: "node[03-05,07],gpu1" -> "node03", "a,b" -> "a". */
static bool cfg_slurm_first_host(const char *list, char *out, size_t n) {
  size_t i = 0, o = 0;
  while (list[i] && list[i] != ',' && list[i] != '[' && o + 1 < n)
    out[o++] = list[i++];
  if (list[i] == '[') {
    i++;
    while (list[i] && list[i] != ',' && list[i] != '-' && list[i] != ']' && o + 1 < n)
      out[o++] = list[i++];
  }
  out[o] = '\0';
  return o > 0;
}

static void cfg_copy(char *dst, size_t n, const char *src) { snprintf(dst, n, "%s", src ? src : ""); }

static dt_status cfg_port(const char *name, int *port) {
  return cfg_int(name, *port, 1, 65535, port);
}

dt_status dt__comm_env_resolve(const dt_comm_config *cfg, dt__comm_env *env) {
  memset(env, 0, sizeof *env);
  env->local_rank = env->local_size = -1;
  env->rank = env->world_size = -1;
  dt_comm_config none = {.rank = -1, .world_size = -1, .local_rank = -1, .host_store = -1};
  if (!cfg)
    cfg = &none;

  /* ---- which convention ---- */
  /* A convention is in use when its rank or its size variable is set (a size without a rank is
   * a mistake worth reporting, not a single-rank job). Slurm only by its rank: an salloc shell
   * has SLURM_NTASKS without being a task. */
  const cfg_convention *conv = NULL;
  for (size_t i = 0; i < DT_ARRAY_LEN(cfg_conventions); i++) {
    const cfg_convention *cv = &cfg_conventions[i];
    if (dt__env_str(cv->rank) || (strcmp(cv->name, "slurm") != 0 && dt__env_str(cv->size))) {
      conv = cv;
      break;
    }
  }
  if (conv) {
    if (!dt__env_str(conv->rank) && cfg->rank < 0)
      return dt_set_error(DT_ERR_INVALID, "%s=%s is set but %s is not (set both, as the %s launcher does)",
                          conv->size, dt__env_str(conv->size), conv->rank, conv->name);
    DT_CHECK(cfg_int(conv->rank, -1, 0, INT_MAX - 1, &env->rank));
    if (!dt__env_str(conv->size) && cfg->world_size < 1)
      return dt_set_error(DT_ERR_INVALID, "%s=%s is set but %s is not (set both, as the %s launcher does)",
                          conv->rank, dt__env_str(conv->rank), conv->size, conv->name);
    DT_CHECK(cfg_int(conv->size, -1, 1, DT_COMM_WORLD_MAX, &env->world_size));
    DT_CHECK(cfg_int(conv->local_rank, -1, 0, INT_MAX - 1, &env->local_rank));
    if (strcmp(conv->name, "slurm") == 0)
      env->local_size = cfg_slurm_per_node();
    else
      DT_CHECK(cfg_int(conv->local_size, -1, 1, INT_MAX, &env->local_size));
    cfg_copy(env->source, sizeof env->source, conv->name);
  }
  if (cfg->rank >= 0)
    env->rank = cfg->rank;
  if (cfg->world_size >= 1)
    env->world_size = cfg->world_size;
  if (cfg->local_rank >= 0)
    env->local_rank = cfg->local_rank;
  if (cfg->rank < -1 || cfg->world_size < -1 || cfg->world_size == 0 || cfg->world_size > DT_COMM_WORLD_MAX ||
      cfg->local_rank < -1)
    return dt_set_error(DT_ERR_INVALID,
                        "config: rank %d, world_size %d, local_rank %d (use -1 for 'from the environment'; world_size "
                        "at most %d)",
                        cfg->rank, cfg->world_size, cfg->local_rank, DT_COMM_WORLD_MAX);
  if (cfg->rank >= 0 && cfg->world_size >= 1)
    cfg_copy(env->source, sizeof env->source, "config");
  if (env->rank < 0 && env->world_size < 0) {
    env->rank = 0;
    env->world_size = 1;
    cfg_copy(env->source, sizeof env->source, "single");
  }
  if (env->rank < 0 || env->world_size < 1)
    return dt_set_error(DT_ERR_INVALID, "rank %d of world size %d: both must be given (config or environment)", env->rank,
                        env->world_size);
  if (env->rank >= env->world_size)
    return dt_set_error(DT_ERR_INVALID, "rank %d is not below world size %d (source: %s)", env->rank, env->world_size,
                        env->source);
  if (env->world_size == 1 && env->local_rank < 0) {
    env->local_rank = 0;
    env->local_size = 1;
  }
  if (env->local_size > env->world_size || (env->local_size >= 1 && env->local_rank >= env->local_size))
    return dt_set_error(DT_ERR_INVALID, "local rank %d of local size %d in a world of %d (source: %s)", env->local_rank,
                        env->local_size, env->world_size, env->source);

  /* ---- the store ---- */
  const char *host = cfg->store_addr;
  if (!host)
    host = dt__env_str("DTRAIN_MASTER_ADDR");
  if (!host)
    host = dt__env_str("MASTER_ADDR");
  char slurm_host[256];
  if (!host && conv && strcmp(conv->name, "slurm") == 0) {
    const char *list = dt__env_str("SLURM_STEP_NODELIST");
    if (!list)
      list = dt__env_str("SLURM_JOB_NODELIST");
    if (list && cfg_slurm_first_host(list, slurm_host, sizeof slurm_host))
      host = slurm_host;
  }
  int port = 0;
  if (cfg->store_port < 0 || cfg->store_port > 65535)
    return dt_set_error(DT_ERR_INVALID, "config: store port %d out of range 1..65535", cfg->store_port);
  if (cfg->store_port)
    port = cfg->store_port;
  else if (dt__env_str("DTRAIN_MASTER_PORT"))
    DT_CHECK(cfg_port("DTRAIN_MASTER_PORT", &port));
  else if (dt__env_str("MASTER_PORT"))
    DT_CHECK(cfg_port("MASTER_PORT", &port));
  if (env->world_size == 1 && (!host || !port)) {
    host = host ? host : "127.0.0.1";
#ifdef DTRAIN_HAVE_MPI
  } else if (!host && !port && conv && strcmp(conv->name, "openmpi") == 0) {
    /* Started by mpirun: rank 0 starts the store and MPI tells everyone where (comm.c). */
    env->mpi_boot = 1;
    host = "";
#endif
  } else if (!host || !port) {
    const char *how = conv ? conv->name : "config";
    return dt_set_error(DT_ERR_INVALID,
                        "rank %d of %d (%s): no rendezvous store address: set %s%s (the host and a free port "
                        "that rank 0 listens on)",
                        env->rank, env->world_size, how,
                        !host ? "DTRAIN_MASTER_ADDR (or MASTER_ADDR)" : "",
                        !port ? (!host ? " and DTRAIN_MASTER_PORT (or MASTER_PORT)" : "DTRAIN_MASTER_PORT (or MASTER_PORT)") : "");
  }
  if (strlen(host) >= sizeof env->store_host)
    return dt_set_error(DT_ERR_INVALID, "store host name of %zu bytes is too long", strlen(host));
  cfg_copy(env->store_host, sizeof env->store_host, host);
  env->store_port = port;
  int host_store = cfg->host_store;
  if (host_store < -1 || host_store > 1)
    return dt_set_error(DT_ERR_INVALID, "config: host_store %d (use -1, 0 or 1)", host_store);
  if (host_store == -1)
    DT_CHECK(cfg_int("DTRAIN_HOST_STORE", -1, 0, 1, &host_store));
  env->host_store = host_store == -1 ? env->rank == 0 : host_store;

  /* ---- secret, transport, bind address, job id, timeouts ---- */
  DT_CHECK(dt__secret_load(cfg->secret, env->secret, sizeof env->secret, &env->secret_len));
  const char *tp = cfg->transport ? cfg->transport : dt__env_str("DTRAIN_TRANSPORT");
  if (!tp)
    tp = dt__env_str("DTRAIN_BACKEND"); /* `dtrain run --backend` and the spelling */
  if (tp && *tp && strcmp(tp, "auto") != 0) {
    if (strcmp(tp, "shm") && strcmp(tp, "tcp") && strcmp(tp, "mpi"))
      return dt_set_error(DT_ERR_INVALID, "%s '%s' is not a transport (use shm, tcp or mpi)",
                          cfg->transport                    ? "config transport"
                          : dt__env_str("DTRAIN_TRANSPORT") ? "DTRAIN_TRANSPORT"
                                                            : "DTRAIN_BACKEND",
                          tp);
    cfg_copy(env->transport, sizeof env->transport, tp);
  }
  const char *bind = cfg->bind_addr;
  if (!bind)
    bind = dt__env_str("DTRAIN_BIND_ADDR");
  if (!bind)
    bind = dt__env_str("DTRAIN_IFNAME");
  if (bind && strlen(bind) >= sizeof env->bind_addr)
    return dt_set_error(DT_ERR_INVALID, "bind address '%.40s...' is too long", bind);
  cfg_copy(env->bind_addr, sizeof env->bind_addr, bind);

  const char *job = cfg->job_id ? cfg->job_id : dt__env_str("DTRAIN_JOB_ID");
  char derived[sizeof env->store_host + 16];
  if (!job) {
    if (env->store_port)
      snprintf(derived, sizeof derived, "%s-%d", env->store_host, env->store_port);
    else
      snprintf(derived, sizeof derived, "single-%d", (int)getpid());
    job = derived;
  }
  /* Job ids name shared-memory segments and files: keep them to a safe alphabet. */
  size_t o = 0;
  for (size_t i = 0; job[i] && o + 1 < sizeof env->job_id; i++) {
    char ch = job[i];
    env->job_id[o++] = (isalnum((unsigned char)ch) || ch == '-' || ch == '_' || ch == '.') ? ch : '_';
  }
  env->job_id[o] = '\0';
  if (o == 0)
    return dt_set_error(DT_ERR_INVALID, "empty job id");

  if (cfg->timeout_ms < 0 || cfg->fault_timeout_ms < 0)
    return dt_set_error(DT_ERR_INVALID, "config: timeout %d ms and fault timeout %d ms must not be negative",
                        cfg->timeout_ms, cfg->fault_timeout_ms);
  env->timeout_ms = cfg->timeout_ms;
  if (!env->timeout_ms)
    DT_CHECK(cfg_int("DTRAIN_TIMEOUT_MS", 300000, 1, INT_MAX, &env->timeout_ms));
  env->fault_timeout_ms = cfg->fault_timeout_ms;
  if (!env->fault_timeout_ms)
    DT_CHECK(cfg_int("DTRAIN_FAULT_TIMEOUT_MS", 10000, 1, INT_MAX, &env->fault_timeout_ms));
  DT_CHECK(cfg_int("DTRAIN_PROGRESS_FOLLOW", 1, 0, 1, &env->progress_follow));
  /* pipelined pieces of the ring and rhd (coll/ring.c): every rank must cut the same pieces,
   * whole elements of every dtype */
  DT_CHECK(cfg_int("DTRAIN_RING_PIECE", 0, 4096, 64 << 20, &env->ring_piece));
  if (env->ring_piece % 8)
    return dt_set_error(DT_ERR_INVALID, "DTRAIN_RING_PIECE=%d is not a multiple of 8 bytes", env->ring_piece);
  DT_CHECK(cfg_int("DTRAIN_RING_AHEAD", -1, 0, 64, &env->ring_ahead));
  DT_CHECK(cfg_int("DTRAIN_CHAIN_PIECE", 0, 1024, 64 << 20, &env->chain_piece));
  return DT_OK;
}
