#!/usr/bin/env bash
# test_mpi_hung.sh MPIRUN DTRAIN TRANSPORT - under mpirun, a rank stopped (SIGSTOP) mid-training:
# the other names it within the fault timeout and the whole job ends non-zero. (Rank 0 used to
# name it and then wait forever in MPI_Finalize for the stopped rank.)
set -uo pipefail
mpirun=$1 dtrain=$2 tp=$3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
timeout 90 "$mpirun" --allow-run-as-root --oversubscribe --mca btl_tcp_if_include lo -np 2 \
  -x DTRAIN_BACKEND="$tp" -x DTRAIN_JOB_SECRET=mpi-hung-secret -x DTRAIN_FAULT_TIMEOUT_MS=2000 \
  -x DTRAIN_FAULTS=stop:rank=1,step=5 \
  "$dtrain" train --model mlp --batch 128 --max-steps 60 --threads 1 --out "$out" --progress off \
  >"$out/stdout" 2>"$out/stderr"
rc=$?
if [ "$rc" = 0 ] || [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
  echo "mpirun with a stopped rank: exit $rc (want a failure before the timeout)"; cat "$out/stderr"; exit 1
fi
grep -q "rank 1 failed: no heartbeat" "$out/stderr" || { echo "the stopped rank is not named:"; cat "$out/stderr"; exit 1; }
echo "stopped rank under mpirun: job ended with exit $rc"
