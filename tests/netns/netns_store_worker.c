/* netns_store_worker.c - a worker for multi-host launcher tests that needs only the rendezvous
 * store: it reads its place in the job from the environment `dtrain run` gives (through the
 * comm layer's resolver), rank 0 hosts the store on all interfaces, every rank adds rank+1 to a
 * shared counter, publishes its host name, waits for all the others, and prints one line
 *     rank R of W: sum S hosts H
 * where S must be W*(W+1)/2 and H the number of distinct host names seen (namespaces share the
 * host name, so the caller compares against what it expects). Exit 0 only if everything
 * matched. Not a collective test: the communicator's own tests do that. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/store.h"

int main(void) {
  dt__comm_env env;
  if (dt__comm_env_resolve(NULL, &env) != DT_OK) {
    fprintf(stderr, "error: %s\n", dt_last_error());
    return 1;
  }
  int64_t deadline = dt__deadline_after_ms(30000);
  dt__store_server *srv = NULL;
  if (env.host_store &&
      dt__store_server_start(NULL, env.store_port, env.secret, env.secret_len, env.world_size, 10000, &srv, NULL) != DT_OK) {
    fprintf(stderr, "error: rank %d: %s\n", env.rank, dt_last_error());
    return 1;
  }
  dt__store *st = NULL;
  int rc = 1;
  if (dt__store_connect(env.store_host, env.store_port, env.secret, env.secret_len, env.rank, deadline, &st) != DT_OK)
    goto out;
  int64_t sum = 0;
  if (dt__store_add(st, "sum", env.rank + 1, &sum, deadline) != DT_OK || dt__store_add(st, "arrived", 1, &sum, deadline))
    goto out;
  char key[64], host[256] = "";
  gethostname(host, sizeof host - 1);
  snprintf(key, sizeof key, "host/%d", env.rank);
  if (dt__store_set(st, key, host, strlen(host), deadline) != DT_OK)
    goto out;
  /* Everyone has added once "arrived" reaches W; the waits below make every rank see it. */
  char name[256];
  size_t n;
  char hosts[64][256];
  int nhosts = 0;
  for (int r = 0; r < env.world_size; r++) {
    snprintf(key, sizeof key, "host/%d", r);
    if (dt__store_wait(st, key, name, sizeof name - 1, &n, deadline) != DT_OK)
      goto out;
    name[n] = '\0';
    int seen = 0;
    for (int i = 0; i < nhosts; i++)
      seen |= strcmp(hosts[i], name) == 0;
    if (!seen && nhosts < 64)
      snprintf(hosts[nhosts++], sizeof hosts[0], "%s", name);
  }
  char val[32];
  if (dt__store_get(st, "sum", val, sizeof val - 1, &n, deadline) != DT_OK)
    goto out;
  val[n] = '\0';
  sum = strtoll(val, NULL, 10);
  printf("rank %d of %d: sum %lld hosts %d\n", env.rank, env.world_size, (long long)sum, nhosts);
  fflush(stdout);
  rc = sum == (int64_t)env.world_size * (env.world_size + 1) / 2 ? 0 : 1;
  /* The host of the store leaves last: everyone else says done first. */
  int64_t done = 0;
  if (dt__store_add(st, "done", 1, &done, deadline) != DT_OK)
    rc = 1;
  for (int i = 0; srv && i < 300 && done < env.world_size; i++) { /* at most 6 s */
    dt__sleep_ns(20 * 1000000LL);
    if (dt__store_add(st, "done", 0, &done, deadline) != DT_OK)
      break;
  }
out:
  if (rc && dt_last_error()[0])
    fprintf(stderr, "error: rank %d: %s\n", env.rank, dt_last_error());
  dt__store_close(st);
  dt__store_server_stop(srv);
  return rc;
}
