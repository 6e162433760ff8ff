/* comm/mpi/mpi_boot.h - joining a job that mpirun started: MPI gives rank and size, and rank 0
 * broadcasts the rendezvous store's address, so no MASTER_ADDR is needed under mpirun. Only
 * built with Open MPI (DTRAIN_HAVE_MPI). */
#ifndef DT_COMM_MPI_BOOT_H
#define DT_COMM_MPI_BOOT_H

#include <stddef.h>

#include "core/core.h"

/* Initializes MPI if nobody did (finalized at exit) and reads rank, size and the rank and size
 * within this host. */
dt_status dt__mpi_bootstrap(int *rank, int *size, int *local_rank, int *local_size);
/* Broadcasts n bytes from root over MPI_COMM_WORLD (collective; see mpi.c for why not MPI_Bcast). */
dt_status dt__mpi_bcast_bytes(void *buf, size_t n, int root);

#endif
