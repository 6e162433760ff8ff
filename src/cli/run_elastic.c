/* run_elastic.c - multi-host elastic agent. */
#include <stdio.h>

#include "cli/cli.h"
#include "cli/launch.h"

int dt__run_elastic(dt_launch_opts *o) {
  fprintf(stderr, "dtrain run: multi-host restarts come next\n");
  return 1;
}
