#!/usr/bin/env bash
# test_netns_cluster.sh - brings up a 3-host cluster (scripts/netns-cluster, 100 Mbit/s links),
# checks that every host reaches host 0, that a bulk transfer between two hosts runs at the
# link's rate (roughly: the shaping is there, not a measurement), and runs a multi-host job:
# one `dtrain run -n 2 --nnodes 3 --node-rank R --master 10.213.0.1:PORT` agent per host whose
# six workers meet through the rendezvous store across the links, agree on a sum, and see three
# distinct host names (each host has its own UTS namespace).
# Skips (77) when not root or when namespaces cannot be made here. Everything it starts is
# bounded by `timeout` and torn down by the EXIT trap, also on failure.
set -uo pipefail

SRC=${DTRAIN_SOURCE_DIR:?}
BIN=${DTRAIN_BIN:?}
WORKER=${NETNS_STORE_WORKER:?}
NC="$SRC/scripts/netns-cluster"
H=3

if [[ $(id -u) != 0 ]]; then echo "SKIP: needs root for network namespaces"; exit 77; fi
if ! "$NC" check; then echo "SKIP: network namespaces, veth or tbf not usable here"; exit 77; fi
command -v python3 >/dev/null || { echo "SKIP: needs python3 for the traffic checks"; exit 77; }

NAME=
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  [[ -n $NAME ]] && "$NC" down "$NAME"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

NAME=$("$NC" up $H --rate 100mbit) || fail "cluster did not come up"
echo "cluster $NAME"

# ---- connectivity: each host connects to a listener on host 0 and gets its greeting back ----
cat > /tmp/$NAME-echo.py <<'EOF'
import socket, sys, time
mode, port = sys.argv[1], int(sys.argv[2])
def connect(host):
    # The listener may still be starting: retry for up to 10 s.
    for _ in range(100):
        try:
            return socket.create_connection((host, port), timeout=10)
        except ConnectionRefusedError:
            time.sleep(0.1)
    raise SystemExit("cannot connect to %s:%d" % (host, port))
if mode == "serve":
    n = int(sys.argv[3]); s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(8); s.settimeout(20)
    for _ in range(n):
        c, _ = s.accept(); c.settimeout(10); c.sendall(c.recv(64)); c.close()
elif mode == "hello":
    s = connect(sys.argv[3]); s.sendall(b"hi from " + sys.argv[4].encode())
    print(s.recv(64).decode())
elif mode == "sink":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(1); s.settimeout(20)
    c, _ = s.accept(); c.settimeout(20); n = 0
    while True:
        b = c.recv(1 << 16)
        if not b: break
        n += len(b)
    c.sendall(str(n).encode()); c.close()
elif mode == "blast":
    total = int(sys.argv[4]); s = connect(sys.argv[3])
    buf = b"x" * (1 << 16); t0 = time.monotonic(); sent = 0
    while sent < total:
        s.sendall(buf); sent += len(buf)
    s.shutdown(socket.SHUT_WR); got = int(s.recv(64).decode()); dt = time.monotonic() - t0
    print("%d %.3f %.1f" % (got, dt, got / dt / 1e6))
EOF
timeout 30 "$NC" exec "$NAME" 0 python3 /tmp/$NAME-echo.py serve 7000 $H & PIDS+=($!)
sleep 0.3
for ((i = 0; i < H; i++)); do
  out=$(timeout 15 "$NC" exec "$NAME" $i python3 /tmp/$NAME-echo.py hello 7000 10.213.0.1 h$i) || fail "host $i cannot reach host 0"
  [[ $out == "hi from h$i" ]] || fail "host $i got '$out' back"
done
echo "connectivity: $H hosts reach 10.213.0.1"

# ---- rate: 6 MB from host 1 to host 2 over 100 Mbit/s links (12.5 MB/s) ----
timeout 30 "$NC" exec "$NAME" 2 python3 /tmp/$NAME-echo.py sink 7001 & PIDS+=($!)
sleep 0.3
read -r got secs mbs < <(timeout 30 "$NC" exec "$NAME" 1 python3 /tmp/$NAME-echo.py blast 7001 10.213.0.3 6000000) ||
  fail "bulk transfer failed"
echo "rate: $got bytes in $secs s = $mbs MB/s (link 12.5 MB/s)"
(( got >= 6000000 )) || fail "sink got only $got bytes"
# The cap is what the shaping proves; the floor only catches a broken link (a loaded machine
# may not fill it).
awk -v r="$mbs" 'BEGIN { exit !(r > 2 && r < 14) }' || fail "$mbs MB/s is not near the 12.5 MB/s tbf rate"

# ---- a multi-host job: 3 agents x 2 workers meeting through the store on host 0 ----
export DTRAIN_JOB_SECRET="netns-test-$$-$RANDOM"
PORT=29500
AG=()
for ((r = 0; r < H; r++)); do
  timeout 60 "$NC" exec "$NAME" $r "$BIN" run -n 2 --nnodes $H --node-rank $r --master 10.213.0.1:$PORT \
    --timeout 45 -- "$WORKER" > /tmp/$NAME-agent$r.log 2>&1 &
  AG+=($!); PIDS+=($!)
done
for ((r = 0; r < H; r++)); do
  wait "${AG[$r]}" || { cat /tmp/$NAME-agent*.log; fail "agent $r exited with $?"; }
done
cat /tmp/$NAME-agent*.log
n=$(cat /tmp/$NAME-agent*.log | grep -c "of 6: sum 21 hosts 3")
(( n == 6 )) || fail "expected 6 workers to report sum 21 from 3 distinct hosts, got $n"
rm -f /tmp/$NAME-*.log /tmp/$NAME-echo.py
echo "PASS"
