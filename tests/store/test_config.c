/* test_config.c - how a process finds its rank, world and store: each launcher convention
 * (dtrain, torchrun, Open MPI, Slurm), their precedence, explicit config fields, defaults, and
 * malformed values refused with the variable named. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "comm/comm.h"

static const char *all_vars[] = {
    "DTRAIN_RANK", "DTRAIN_WORLD_SIZE", "DTRAIN_LOCAL_RANK", "DTRAIN_LOCAL_WORLD_SIZE", "DTRAIN_MASTER_ADDR",
    "DTRAIN_MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_STEP_NODELIST",
    "SLURM_JOB_NODELIST", "DTRAIN_JOB_ID", "DTRAIN_TIMEOUT_MS", "DTRAIN_FAULT_TIMEOUT_MS", "DTRAIN_TRANSPORT",
    "DTRAIN_BIND_ADDR", "DTRAIN_IFNAME", "DTRAIN_JOB_SECRET", "DTRAIN_JOB_SECRET_FILE", "DTRAIN_HOST_STORE", "DTRAIN_PROGRESS_FOLLOW",
    "DTRAIN_RING_PIECE", "DTRAIN_RING_AHEAD", "DTRAIN_CHAIN_PIECE",
};

static int clean_env(void **unused) {
  for (size_t i = 0; i < sizeof all_vars / sizeof all_vars[0]; i++)
    unsetenv(all_vars[i]);
  setenv("DTRAIN_JOB_SECRET", "s", 1); /* no warning noise */
  return 0;
}

static dt_comm_config cfg_env(void) {
  return (dt_comm_config){.rank = -1, .world_size = -1, .local_rank = -1, .host_store = -1};
}

static void test_single(void **unused) {
  dt__comm_env e;
  assert_int_equal(dt__comm_env_resolve(NULL, &e), DT_OK);
  assert_string_equal(e.source, "single");
  assert_int_equal(e.rank, 0);
  assert_int_equal(e.world_size, 1);
  assert_int_equal(e.local_rank, 0);
  assert_int_equal(e.local_size, 1);
  assert_string_equal(e.store_host, "127.0.0.1");
  assert_int_equal(e.store_port, 0);
  assert_int_equal(e.host_store, 1);
  assert_int_equal(e.timeout_ms, 300000);
  assert_int_equal(e.fault_timeout_ms, 10000);
  assert_string_equal(e.transport, "");
  assert_int_equal(e.secret_len, 1);
  assert_true(strncmp(e.job_id, "single-", 7) == 0);
}

static void test_dtrain_vars(void **unused) {
  setenv("DTRAIN_RANK", "2", 1);
  setenv("DTRAIN_WORLD_SIZE", "4", 1);
  setenv("DTRAIN_LOCAL_RANK", "0", 1);
  setenv("DTRAIN_LOCAL_WORLD_SIZE", "2", 1);
  setenv("DTRAIN_MASTER_ADDR", "node-a", 1);
  setenv("DTRAIN_MASTER_PORT", "29500", 1);
  setenv("DTRAIN_TIMEOUT_MS", "1234", 1);
  setenv("DTRAIN_FAULT_TIMEOUT_MS", "500", 1);
  setenv("DTRAIN_TRANSPORT", "tcp", 1);
  setenv("DTRAIN_IFNAME", "eth1", 1);
  /* torchrun's are there too but lose. */
  setenv("RANK", "3", 1);
  setenv("WORLD_SIZE", "8", 1);
  dt__comm_env e;
  assert_int_equal(dt__comm_env_resolve(NULL, &e), DT_OK);
  assert_string_equal(e.source, "dtrain");
  assert_int_equal(e.rank, 2);
  assert_int_equal(e.world_size, 4);
  assert_int_equal(e.local_rank, 0);
  assert_int_equal(e.local_size, 2);
  assert_string_equal(e.store_host, "node-a");
  assert_int_equal(e.store_port, 29500);
  assert_int_equal(e.host_store, 0);
  assert_int_equal(e.timeout_ms, 1234);
  assert_int_equal(e.fault_timeout_ms, 500);
  assert_string_equal(e.transport, "tcp");
  assert_string_equal(e.bind_addr, "eth1");
  assert_string_equal(e.job_id, "node-a-29500");
  setenv("DTRAIN_BIND_ADDR", "10.1.2.3", 1);
  setenv("DTRAIN_JOB_ID", "my job/1", 1);
  assert_int_equal(dt__comm_env_resolve(NULL, &e), DT_OK);
  assert_string_equal(e.bind_addr, "10.1.2.3");
  assert_string_equal(e.job_id, "my_job_1");
}

static void test_torchrun(void **unused) {
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("LOCAL_RANK", "0", 1);
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "29400", 1);
  /* Open MPI's are set too (mpirun launching torchrun-style scripts): torchrun wins. */
  setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  dt__comm_env e;
  assert_int_equal(dt__comm_env_resolve(NULL, &e), DT_OK);
  assert_string_equal(e.source, "torchrun");
  assert_int_equal(e.rank, 0);
  assert_int_equal(e.host_store, 1);
  assert_int_equal(e.store_port, 29400);
  /* DTRAIN_MASTER_* override the torchrun address. */
  setenv("DTRAIN_MASTER_PORT", "30000", 1);
  assert_int_equal(dt__comm_env_resolve(NULL, &e), DT_OK);
  assert_int_equal(e.store_port, 30000);
  /* Without the store address: a clear error. */
  unsetenv("DTRAIN_MASTER_PORT");
  unsetenv("MASTER_PORT");
  assert_int_equal(dt__comm_env_resolve(NULL, &e), DT_ERR_INVALID);
  assert_non_null(strstr(dt_last_error(), "MASTER_PORT"));
  assert_non_null(strstr(dt_last_error(), "torchrun"));
}

static void test_openmpi(void **unused) {
  setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  dt__comm_env e;
#ifdef DTRAIN_HAVE_MPI
  /* Built with Open MPI: the store's address will come through MPI (comm.c). */
  assert_int_equal(dt__comm_env_resolve(NULL, &e), DT_OK);
  assert_int_equal(e.mpi_boot, 1);
#else
  assert_int_equal(dt__comm_env_resolve(NULL, &e), DT_ERR_INVALID);
  assert_non_null(strstr(dt_last_error(), "DTRAIN_MASTER_ADDR"));
  assert_non_null(strstr(dt_last_error(), "openmpi"));
#endif
  setenv("DTRAIN_MASTER_ADDR", "head", 1);
  setenv("DTRAIN_MASTER_PORT", "4000", 1);
  assert_int_equal(dt__comm_env_resolve(NULL, &e), DT_OK);
  assert_string_equal(e.source, "openmpi");
  assert_int_equal(e.rank, 3);
  assert_int_equal(e.world_size, 4);
  assert_int_equal(e.local_rank, 1);
  assert_int_equal(e.local_size, 2);
  assert_string_equal(e.store_host, "head");
  /* mpirun -n 1 needs no store address. */
  setenv("OMPI_COMM_WORLD_RANK", "0", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "1", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1", 1);
  unsetenv("DTRAIN_MASTER_ADDR");
  unsetenv("DTRAIN_MASTER_PORT");
  assert_int_equal(dt__comm_env_resolve(NULL, &e), DT_OK);
  assert_int_equal(e.world_size, 1);
  assert_int_equal(e.host_store, 1);
}

static void test_slurm(void **unused) {
  setenv("SLURM_PROCID", "5", 1);
  setenv("SLURM_NTASKS", "8", 1);
  setenv("SLURM_LOCALID", "1", 1);
  setenv("SLURM_NTASKS_PER_NODE", "4(x2)", 1);
  setenv("SLURM_STEP_NODELIST", "gpu[07-08,11],cpu1", 1);
  setenv("MASTER_PORT", "6000", 1);
  dt__comm_env e;
  assert_int_equal(dt__comm_env_resolve(NULL, &e), DT_OK);
  assert_string_equal(e.source, "slurm");
  assert_int_equal(e.rank, 5);
  assert_int_equal(e.world_size, 8);
  assert_int_equal(e.local_rank, 1);
  assert_int_equal(e.local_size, 4);
  assert_string_equal(e.store_host, "gpu07");
  assert_int_equal(e.store_port, 6000);
  /* Uneven tasks per node: local size unknown (-1), left for dt_comm_create to derive. */
  setenv("SLURM_NTASKS_PER_NODE", "3(x2),2", 1);
  setenv("SLURM_STEP_NODELIST", "alpha,beta", 1);
  assert_int_equal(dt__comm_env_resolve(NULL, &e), DT_OK);
  assert_int_equal(e.local_size, -1);
  assert_string_equal(e.store_host, "alpha");
  unsetenv("MASTER_PORT");
  assert_int_equal(dt__comm_env_resolve(NULL, &e), DT_ERR_INVALID);
  assert_non_null(strstr(dt_last_error(), "slurm"));
}

static void test_config_struct(void **unused) {
  setenv("DTRAIN_RANK", "1", 1);
  setenv("DTRAIN_WORLD_SIZE", "2", 1);
  setenv("DTRAIN_MASTER_ADDR", "env-host", 1);
  setenv("DTRAIN_MASTER_PORT", "1000", 1);
  dt_comm_config c = cfg_env();
  c.rank = 0;
  c.world_size = 3;
  c.store_addr = "cfg-host";
  c.store_port = 2000;
  c.host_store = 0;
  c.secret = "cfg-secret";
  c.transport = "shm";
  c.timeout_ms = 77;
  c.fault_timeout_ms = 66;
  c.job_id = "j1";
  dt__comm_env e;
  assert_int_equal(dt__comm_env_resolve(&c, &e), DT_OK);
  assert_string_equal(e.source, "config");
  assert_int_equal(e.rank, 0);
  assert_int_equal(e.world_size, 3);
  assert_string_equal(e.store_host, "cfg-host");
  assert_int_equal(e.store_port, 2000);
  assert_int_equal(e.host_store, 0);
  assert_int_equal(e.secret_len, 10);
  assert_memory_equal(e.secret, "cfg-secret", 10);
  assert_string_equal(e.transport, "shm");
  assert_int_equal(e.timeout_ms, 77);
  assert_int_equal(e.fault_timeout_ms, 66);
  assert_string_equal(e.job_id, "j1");
  /* Only some fields from the config: the rest from the environment. */
  c = cfg_env();
  c.fault_timeout_ms = 1000;
  assert_int_equal(dt__comm_env_resolve(&c, &e), DT_OK);
  assert_string_equal(e.source, "dtrain");
  assert_int_equal(e.rank, 1);
  assert_int_equal(e.fault_timeout_ms, 1000);
  assert_string_equal(e.store_host, "env-host");
  c.transport = "carrier-pigeon";
  assert_int_equal(dt__comm_env_resolve(&c, &e), DT_ERR_INVALID);
  assert_non_null(strstr(dt_last_error(), "carrier-pigeon"));
}

static void expect_invalid(const char *var, const char *val, const char *needle) {
  const char *old = getenv(var);
  char keep[64] = "";
  if (old)
    snprintf(keep, sizeof keep, "%s", old);
  setenv(var, val, 1);
  dt__comm_env e;
  assert_int_equal(dt__comm_env_resolve(NULL, &e), DT_ERR_INVALID);
  if (!strstr(dt_last_error(), needle))
    fail_msg("%s=%s: '%s' does not mention '%s'", var, val, dt_last_error(), needle);
  if (old)
    setenv(var, keep, 1);
  else
    unsetenv(var);
}

static void test_malformed(void **unused) {
  setenv("DTRAIN_RANK", "1", 1);
  setenv("DTRAIN_WORLD_SIZE", "2", 1);
  setenv("DTRAIN_MASTER_ADDR", "h", 1);
  setenv("DTRAIN_MASTER_PORT", "1000", 1);
  dt__comm_env e;
  assert_int_equal(dt__comm_env_resolve(NULL, &e), DT_OK);
  expect_invalid("DTRAIN_RANK", "one", "DTRAIN_RANK=one");
  expect_invalid("DTRAIN_RANK", "2", "rank 2 is not below world size 2");
  expect_invalid("DTRAIN_RANK", "-1", "DTRAIN_RANK=-1");
  expect_invalid("DTRAIN_WORLD_SIZE", "0", "DTRAIN_WORLD_SIZE=0");
  expect_invalid("DTRAIN_WORLD_SIZE", "2x", "DTRAIN_WORLD_SIZE=2x");
  expect_invalid("DTRAIN_MASTER_PORT", "70000", "DTRAIN_MASTER_PORT=70000");
  expect_invalid("DTRAIN_MASTER_PORT", "0", "DTRAIN_MASTER_PORT=0");
  expect_invalid("DTRAIN_MASTER_PORT", "http", "DTRAIN_MASTER_PORT=http");
  expect_invalid("DTRAIN_TIMEOUT_MS", "-5", "DTRAIN_TIMEOUT_MS=-5");
  expect_invalid("DTRAIN_FAULT_TIMEOUT_MS", "10s", "DTRAIN_FAULT_TIMEOUT_MS=10s");
  expect_invalid("DTRAIN_TRANSPORT", "udp", "DTRAIN_TRANSPORT");
  expect_invalid("DTRAIN_PROGRESS_FOLLOW", "yes", "DTRAIN_PROGRESS_FOLLOW=yes");
  expect_invalid("DTRAIN_PROGRESS_FOLLOW", "2", "DTRAIN_PROGRESS_FOLLOW=2 is out of range 0..1");
  expect_invalid("DTRAIN_RING_PIECE", "1000", "DTRAIN_RING_PIECE=1000 is out of range 4096..67108864");
  expect_invalid("DTRAIN_RING_PIECE", "64k", "DTRAIN_RING_PIECE=64k");
  expect_invalid("DTRAIN_RING_PIECE", "65540", "DTRAIN_RING_PIECE=65540 is not a multiple of 8 bytes");
  expect_invalid("DTRAIN_RING_AHEAD", "65", "DTRAIN_RING_AHEAD=65 is out of range 0..64");
  expect_invalid("DTRAIN_RING_AHEAD", "-1", "DTRAIN_RING_AHEAD=-1 is out of range 0..64");
  expect_invalid("DTRAIN_CHAIN_PIECE", "512", "DTRAIN_CHAIN_PIECE=512 is out of range 1024..67108864");
  expect_invalid("DTRAIN_LOCAL_RANK", "x", "DTRAIN_LOCAL_RANK=x");
  setenv("DTRAIN_LOCAL_WORLD_SIZE", "2", 1);
  expect_invalid("DTRAIN_LOCAL_RANK", "2", "local rank 2 of local size 2");
  unsetenv("DTRAIN_WORLD_SIZE");
  assert_int_equal(dt__comm_env_resolve(NULL, &e), DT_ERR_INVALID);
  assert_non_null(strstr(dt_last_error(), "DTRAIN_WORLD_SIZE is not"));
  /* A world size without a rank is a mistake, not a single-rank job. */
  unsetenv("DTRAIN_RANK");
  unsetenv("DTRAIN_LOCAL_RANK");
  unsetenv("DTRAIN_LOCAL_WORLD_SIZE");
  setenv("WORLD_SIZE", "4", 1);
  assert_int_equal(dt__comm_env_resolve(NULL, &e), DT_ERR_INVALID);
  assert_non_null(strstr(dt_last_error(), "WORLD_SIZE=4 is set but RANK is not"));
  unsetenv("WORLD_SIZE");
  /* An salloc shell (SLURM_NTASKS, no SLURM_PROCID) is not a task: single rank. */
  setenv("SLURM_NTASKS", "4", 1);
  unsetenv("DTRAIN_MASTER_ADDR");
  unsetenv("DTRAIN_MASTER_PORT");
  assert_int_equal(dt__comm_env_resolve(NULL, &e), DT_OK);
  assert_string_equal(e.source, "single");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_single, clean_env),      cmocka_unit_test_setup(test_dtrain_vars, clean_env),
      cmocka_unit_test_setup(test_torchrun, clean_env),    cmocka_unit_test_setup(test_openmpi, clean_env),
      cmocka_unit_test_setup(test_slurm, clean_env),       cmocka_unit_test_setup(test_config_struct, clean_env),
      cmocka_unit_test_setup(test_malformed, clean_env),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
