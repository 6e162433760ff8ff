/* A program outside the tree, linked against an installed libdtrain: joins a one-rank job and
 * runs a real allreduce through the public API. */
#include <dtrain/comm.h>
#include <dtrain/core.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  if (strcmp(dt_version(), "0.1.0") != 0)
    return 1;
  if (dt_crc32c(0, "123456789", 9) != 0xE3069283u)
    return 2;
  dt_comm *c = NULL;
  if (dt_comm_create(NULL, &c) != DT_OK) {
    fprintf(stderr, "dt_comm_create: %s\n", dt_last_error());
    return 3;
  }
  float x[3] = {1, 2, 3};
  dt_status st = dt_comm_allreduce(c, DT_IN_PLACE, x, 3, DT_F32, DT_SUM);
  int rank = dt_comm_rank(c), size = dt_comm_size(c);
  dt_comm_destroy(c);
  if (st != DT_OK || rank != 0 || size != 1 || x[2] != 3.0f)
    return 4;
  printf("consumer ok: dtrain %s\n", dt_version());
  return 0;
}
