#!/usr/bin/env bash
# test_mpi_train.sh MPIRUN DTRAIN TRANSPORT - `mpirun -np 2 dtrain train` trains one model
# together: the JSON summary says 2 workers on the asked transport, and the loss went down.
set -euo pipefail
mpirun=$1 dtrain=$2 tp=$3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
timeout 240 "$mpirun" --allow-run-as-root --oversubscribe --mca btl_tcp_if_include lo -np 2 \
  -x DTRAIN_BACKEND="$tp" -x DTRAIN_JOB_SECRET=mpi-train-secret \
  "$dtrain" train --model mlp --batch 128 --max-steps 60 --lr 0.05 --momentum 0.9 --threads 1 \
  --eval-batch 2000 --out "$out" --progress off --json >"$out/summary.json" 2>"$out/stderr" || {
  echo "mpirun dtrain train failed:"; cat "$out/stderr"; exit 1; }
python3 - "$out/summary.json" "$out/metrics.jsonl" "$tp" <<'PY'
import json, sys
lines = [l for l in open(sys.argv[1]).read().splitlines() if l.strip().startswith("{")]
assert len(lines) == 1, f"expected one JSON summary from rank 0, got {len(lines)}"
s = json.loads(lines[0])
assert s["world_size"] == 2, s
assert s.get("transport", sys.argv[3]) == sys.argv[3], s
assert s["test_accuracy"] > 0.6, s
steps = [json.loads(l) for l in open(sys.argv[2]) if '"loss"' in l and '"step"' in l]
assert steps and steps[-1]["loss"] < steps[0]["loss"], (steps[0], steps[-1])
print("mpirun training ok:", s["test_accuracy"])
PY
