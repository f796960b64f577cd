#!/usr/bin/env bash
# bench/floor/check.sh [ENGINE...]: check that the floor relay really relays, for each
# engine (default: all four, epoll epoll-del uring tokio). Loopback only, bounded
# (about 15 s an engine); exits non-zero on any failure. Run it through cbench (it is
# load).
#
# For each engine, one floor with four routes:
#   tcp  -> three echo backends:  loadgen connections --mode tcp, 2 s, 16 workers: errors 0
#   tls  -> three TLS 1.3 backends: loadgen connections --mode full, 2 s, 16 workers: errors 0
#   tcp again, bulk: 20 MiB + 3 x 5 MiB of random bytes echoed back intact, then
#           EOF, with a late reader (the relay meets short writes and EAGAIN)
#   half -> relay_check.py serve, which answers only after the client's EOF: the
#           answer arrives intact, then EOF (3 MiB, 10 B, 0 B sent first)
#   dead -> a port nothing listens on: the client is closed, not held
# (relay_check.py runs the bulk, half-close and refused checks)
# then every connection's fds are closed (the floor's fd count is back to its start).
#
# Env: FLOOR (default bench/floor/target/release/floor), LOADGEN (default
# target/release/loadgen; build it with `cargo build --release --bin loadgen`).
set -euo pipefail
cd "$(dirname "$0")/../.."
. bench/lib.sh

FLOOR=${FLOOR:-$PWD/bench/floor/target/release/floor}
LG=${LOADGEN:-$PWD/target/release/loadgen}
CHECK=$PWD/bench/floor/relay_check.py
ENGINES=("$@")
[ ${#ENGINES[@]} -gt 0 ] || ENGINES=(epoll epoll-del uring tokio)
for f in "$FLOOR" "$LG"; do
    [ -x "$f" ] || { echo "missing $f" >&2; exit 1; }
done

bench_workdir floor-check
start echo "$LG" backends --kind echo --count 3 --no-stdin
wait_for "$WORK/echo.out" READY
start tls "$LG" backends --kind tls --count 3 --tls13 --tickets --ca-out "$WORK/ca.pem" \
    --name-prefix b- --no-stdin
wait_for "$WORK/tls.out" READY
start half python3 "$CHECK" serve
wait_for "$WORK/half.out" READY
ECHOS=$(grep -v READY "$WORK/echo.out" | paste -sd,)
TLSB=$(grep -v READY "$WORK/tls.out" | paste -sd,)
HALF=127.0.0.1:$(grep -v READY "$WORK/half.out")

# Five distinct free ports: four routes and the dead backend.
ports() {
    local p all=()
    while [ ${#all[@]} -lt 5 ]; do
        p=$("$LG" freeport)
        [[ " ${all[*]} " == *" $p "* ]] || all+=("$p")
    done
    echo "${all[@]}"
}

FAILED=0
fail() { echo "FAIL [$engine]: $*"; FAILED=1; }

# expect_clean NAME JSON: the loadgen result has connections and no errors.
expect_clean() {
    local conns errors
    conns=$(field conns <<<"$2")
    errors=$(field errors <<<"$2")
    if [ "$conns" -gt 0 ] && [ "$errors" -eq 0 ]; then
        echo "ok [$engine]: $1: $conns connections, 0 errors"
    else
        fail "$1: $conns connections, $errors errors: $2"
    fi
}

fd_count() { ls "/proc/$1/fd" | wc -l; }

for engine in "${ENGINES[@]}"; do
    read -r tcp tls half dead deadb <<<"$(ports)"
    start "floor-$engine" "$FLOOR" --engine "$engine" \
        --route "127.0.0.1:$tcp=$ECHOS" --route "127.0.0.1:$tls=$TLSB" \
        --route "127.0.0.1:$half=$HALF" --route "127.0.0.1:$dead=127.0.0.1:$deadb"
    pid=$LAST_PID
    wait_for "$WORK/floor-$engine.out" READY
    fds=$(fd_count "$pid")

    out=$("$LG" connections --addr "127.0.0.1:$tcp" --mode tcp --seconds 2 --concurrency 16 \
        --distinct-sources | tail -1) || fail "loadgen tcp failed"
    expect_clean "tcp echo" "$out"
    out=$("$LG" connections --addr "127.0.0.1:$tls" --ca "$WORK/ca.pem" --mode full --seconds 2 \
        --concurrency 16 --distinct-sources | tail -1) || fail "loadgen tls failed"
    expect_clean "tls 1.3 full handshakes" "$out"
    if out=$(timeout 120 python3 "$CHECK" client "$tcp" "$half" "$dead"); then
        echo "$out" | sed "s/^/[$engine] /"
    else
        echo "$out"
        fail "relay_check.py"
    fi

    # Every connection is over: the fds must go back to what the floor held at
    # READY (listeners, the epoll or ring fd, stdio). 5 s at most.
    for _ in $(seq 50); do
        [ "$(fd_count "$pid")" -eq "$fds" ] && break
        sleep 0.1
    done
    now=$(fd_count "$pid")
    if [ "$now" -eq "$fds" ]; then
        echo "ok [$engine]: every connection's fds closed ($fds open, as at start)"
    else
        fail "$now fds open, $fds at start"
        ls -l "/proc/$pid/fd" >&2
    fi
    kill -0 "$pid" 2>/dev/null || fail "the floor died: $(cat "$WORK/floor-$engine.err")"
    stop_pid "$pid"
    if [ -s "$WORK/floor-$engine.err" ]; then
        echo "[$engine] stderr:"
        sed 's/^/  /' "$WORK/floor-$engine.err"
    fi
done

if [ "$FAILED" -ne 0 ]; then
    echo "floor check FAILED"
    exit 1
fi
echo "floor check passed: ${ENGINES[*]}"
