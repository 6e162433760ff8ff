#!/usr/bin/env bash
# test_netns_elastic.sh - elastic multi-host restarts on a simulated 3-host cluster: one
# `dtrain run --nnodes 3 --max-restarts K` agent per host, one fault_worker each, checkpoints in
# a directory all hosts see. Each scenario must end with the state of an undisturbed run
# (40 steps: x = 820), resumed from a checkpoint, with the expected world size:
#   worker   a worker is killed (injected): the 3 hosts re-form, world 3
#   host     every process of host 2 is killed: the other 2 re-form without it (its agent's
#            lease lapsed, so they do not wait out the join window), world 2
#   master   every process of host 0 (it hosts the agent store) is killed: the store moves to
#            host 1 and the other 2 re-form, world 2
#   repeat   host 2's worker fails in every generation: after 2 failures it is left out
#   rejoin   every process of host 2 is killed, the other 2 re-form (world 2), then host 2's
#            agent is started again: it asks to join and the job ends at world 3 (150 steps:
#            x = 11325), with one failure counted
# Usage: test_netns_elastic.sh [SCENARIO...] (default all). Skips (77) without root/netns.
# Every process is bounded by `timeout`; the cluster goes down in the EXIT trap.
set -uo pipefail

SRC=${DTRAIN_SOURCE_DIR:?}
BIN=${DTRAIN_BIN:?}
WORKER=${FAULT_WORKER:?}
NC="$SRC/scripts/netns-cluster"
H=3

if [[ $(id -u) != 0 ]]; then echo "SKIP: needs root for network namespaces"; exit 77; fi
if ! "$NC" check; then echo "SKIP: network namespaces, veth or tbf not usable here"; exit 77; fi

NAME=
WORK=$(mktemp -d /tmp/dtrain-elastic-XXXXXX)
cleanup() {
  [[ -n $NAME ]] && "$NC" down "$NAME"
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$WORK"/agent*.log; do echo "== $f"; grep -v "ready at" "$f" | tail -15; done; exit 1; }

# run_scenario NAME KILL_HOST MAY_FAIL INJECT MAX_RESTARTS WANT_WORLD  (-1: none)
run_scenario() {
  local scen=$1 victim=$2 may_fail=$3 inject=$4 restarts=$5 want_world=$6
  echo "---- $scen"
  NAME=$("$NC" up $H --rate 1gbit) || fail "cluster did not come up"
  rm -rf "$WORK/ck" "$WORK"/agent*.log
  export DTRAIN_JOB_SECRET="elastic-$$-$RANDOM"
  local ag=() r
  for ((r = 0; r < H; r++)); do
    timeout 90 "$NC" exec "$NAME" $r "$BIN" run -n 1 --nnodes $H --node-rank $r --master 10.213.0.1:29400 \
      --max-restarts "$restarts" --min-nodes 2 --fault-timeout 2 --kill-after 1 ${inject:+--inject-fault "$inject"} \
      -- "$WORKER" --steps 40 --step-ms 30 --ckpt-dir "$WORK/ck" --ckpt-every 3 > "$WORK/agent$r.log" 2>&1 &
    ag+=($!)
  done
  if [[ $victim -ge 0 ]]; then
    local i
    for ((i = 0; i < 200; i++)); do [[ -e $WORK/ck/ckpt-000000012.dtc ]] && break; sleep 0.05; done
    [[ -e $WORK/ck/ckpt-000000012.dtc ]] || fail "$scen: no checkpoint at step 12 within 10 s"
    local pids
    pids=$(ip netns pids "$NAME-h$victim")
    [[ -n $pids ]] && kill -9 $pids
    echo "killed every process of host $victim"
  fi
  for ((r = 0; r < H; r++)); do
    if [[ $r == "$may_fail" ]]; then wait "${ag[$r]}"; continue; fi
    wait "${ag[$r]}" || fail "$scen: agent $r exited with status $?"
  done
  grep -h "done steps" "$WORK"/agent*.log
  grep -q "done steps 40 x 820 resumed [1-9][0-9]* world $want_world generation [1-9]" "$WORK"/agent*.log ||
    fail "$scen: no run ended with x = 820 at world size $want_world after a resume"
  grep -h "new workers started" "$WORK"/agent*.log | head -3
  "$NC" down "$NAME"
  NAME=
}

# A host comes back: its agent, started again, joins the running job (generation 2, world 3).
run_rejoin() {
  echo "---- rejoin"
  NAME=$("$NC" up $H --rate 1gbit) || fail "cluster did not come up"
  rm -rf "$WORK/ck" "$WORK"/agent*.log
  export DTRAIN_JOB_SECRET="elastic-$$-$RANDOM"
  local ag=() r i
  agent() { # agent R LOG
    timeout 90 "$NC" exec "$NAME" "$1" "$BIN" run -n 1 --nnodes $H --node-rank "$1" --master 10.213.0.1:29400 \
      --max-restarts 2 --min-nodes 2 --fault-timeout 2 --kill-after 1 \
      -- "$WORKER" --steps 150 --step-ms 30 --ckpt-dir "$WORK/ck" --ckpt-every 3 > "$2" 2>&1
  }
  for ((r = 0; r < H; r++)); do agent $r "$WORK/agent$r.log" & ag+=($!); done
  for ((i = 0; i < 200; i++)); do [[ -e $WORK/ck/ckpt-000000012.dtc ]] && break; sleep 0.05; done
  [[ -e $WORK/ck/ckpt-000000012.dtc ]] || fail "rejoin: no checkpoint at step 12 within 10 s"
  kill -9 $(ip netns pids "$NAME-h2") 2> /dev/null
  wait "${ag[2]}" 2> /dev/null
  for ((i = 0; i < 300; i++)); do grep -q "generation 1 with 2 hosts" "$WORK/agent0.log" && break; sleep 0.05; done
  grep -q "generation 1 with 2 hosts" "$WORK/agent0.log" || fail "rejoin: the other hosts did not re-form"
  agent 2 "$WORK/agent2b.log" &
  ag[2]=$!
  for ((r = 0; r < H; r++)); do wait "${ag[$r]}" || fail "rejoin: agent $r exited with status $?"; done
  grep -h "done steps" "$WORK"/agent*.log
  grep -q "done steps 150 x 11325 resumed [1-9][0-9]* world 3 generation 2" "$WORK"/agent*.log ||
    fail "rejoin: no run ended with x = 11325 at world size 3 in generation 2"
  grep -q "generation 1 stopped for node 2 to join" "$WORK/agent0.log" || fail "rejoin: no re-forming for node 2"
  grep -q "1 failure, 1 restart" "$WORK/agent0.log" || fail "rejoin: the join was counted as a failure"
  "$NC" down "$NAME"
  NAME=
}

scenarios=("$@")
[[ ${#scenarios[@]} -gt 0 ]] || scenarios=(worker host master repeat rejoin)
for s in "${scenarios[@]}"; do
  case $s in
    worker) run_scenario worker -1 -1 "kill:rank=1,step=10" 2 3 ;;
    host)
      run_scenario host 2 2 "" 2 2
      grep -q "node 2 shows no sign of life" "$WORK"/agent0.log || fail "host: node 2's lapsed lease was not noticed"
      ;;
    master) run_scenario master 0 0 "" 2 2 ;;
    repeat)
      run_scenario repeat -1 2 "kill:rank=2,step=3,gen=any" 3 2
      grep -q "node 2 failed 2 times; leaving it out" "$WORK"/agent0.log || fail "repeat: node 2 was not left out"
      ;;
    rejoin) run_rejoin ;;
    *) fail "unknown scenario $s" ;;
  esac
done
echo PASS
