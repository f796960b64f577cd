#!/usr/bin/env bash
# Per-source admission (`listen[].per_source`): what it costs and what it buys.
#
# Two crossbar processes over the same three TLS 1.3 rustls backends, identical but
# for `per_source` on the second (limits agents never reach: the check runs on
# every connection, nothing is refused). In paired rounds:
#
# 1. cost: `loadgen connections --mode full` (16 workers, distinct sources) against
#    each, CPU per connection (utime + stime from /proc) of each process and the
#    ratio on/off; the median ratio over the rounds;
# 2. benefit: 50 agents resuming TLS sessions (`--mode resumed`, 50 distinct
#    sources) for SECONDS, alone and while one source (127.0.9.1) opens and resets
#    connections as fast as one Python process can; agents' p99 handshake latency
#    with the flood over without it, against the process with limits and the one
#    without. The flood's own connections are counted (connects completed).
#
#   bench/admission.sh [--rounds N] [--seconds S]
#
# Loopback only; bounded by rounds x seconds. Run through `cbench`.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh

ROUNDS=5 SECS=3
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) ROUNDS=$2; shift ;;
        --seconds) SECS=$2; shift ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
build_release
bench_workdir crossbar-admission
declare -A SET_ADDRS
start_tls_set b --tls13 --tickets

# crossbar_yaml PORT ADMIN PER_SOURCE: a `mode: tls` service with stickiness.
crossbar_yaml() {
    echo "admin: { listen: \"127.0.0.1:$2\" }"
    echo "defaults: { health: { check: none }, max_connections: 100000 }"
    echo "services:"
    echo "  puppet:"
    echo "    listen:"
    echo "      - address: \"127.0.0.1:$1\""
    [ -n "$3" ] && echo "        per_source: $3"
    echo "    mode: tls"
    echo "    stick: {}"
    echo "    backends:"
    crossbar_backends b
}
declare -A PORT PID
for v in off on; do
    PORT[$v]=$("$LG" freeport)
    admin=$("$LG" freeport)
    limits=
    [ $v = on ] && limits="{ max_connections: 20, rate: 500, burst: 1000 }"
    crossbar_yaml "${PORT[$v]}" "$admin" "$limits" >"$WORK/$v.yaml"
    "$XB" check -c "$WORK/$v.yaml" >/dev/null
    RUST_LOG=warn start "xb-$v" "$XB" run -c "$WORK/$v.yaml"
    PID[$v]=$LAST_PID
    wait_port "${PORT[$v]}"
done

load() { # load PORT MODE CONCURRENCY SECONDS -> JSON line
    "$LG" connections --addr "127.0.0.1:$1" --ca "$WORK/b.ca.pem" \
        --mode "$2" --concurrency "$3" --seconds "$4" --distinct-sources
}
# flood PORT SECONDS: connect and reset from 127.0.9.1 as fast as possible; prints
# the connects completed.
flood() {
    python3 - "$1" "$2" <<'PY'
import socket, struct, sys, time
port, end = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
n = 0
while time.monotonic() < end:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.bind(("127.0.9.1", 0))
    try:
        s.connect(("127.0.0.1", port))
        n += 1
    except OSError:
        pass
    s.close()
print(n)
PY
}

load "${PORT[off]}" full 16 1 >/dev/null # warm up both
load "${PORT[on]}" full 16 1 >/dev/null
COST=() LAT_ON=() LAT_OFF=()
for r in $(seq "$ROUNDS"); do
    declare -A US
    for v in off on; do
        c0=$(cpu_ticks "${PID[$v]}")
        n=$(load "${PORT[$v]}" full 16 "$SECS" | field conns)
        c1=$(cpu_ticks "${PID[$v]}")
        US[$v]=$(awk -v a="$c0" -v b="$c1" -v t="$TCK" -v n="$n" 'BEGIN {printf "%.1f", (b - a) / t / n * 1e6}')
        echo "round $r cost, per_source $v: $n connections, ${US[$v]} us CPU per connection"
    done
    COST+=("$(awk -v a="${US[on]}" -v b="${US[off]}" 'BEGIN {printf "%.3f", a / b}')")
    for v in on off; do
        quiet=$(load "${PORT[$v]}" resumed 50 "$SECS" | field p99_ms)
        flood "${PORT[$v]}" "$SECS" >"$WORK/flood.n" &
        fpid=$!
        out=$(load "${PORT[$v]}" resumed 50 "$SECS")
        wait "$fpid"
        loud=$(echo "$out" | field p99_ms)
        errors=$(echo "$out" | field errors)
        ratio=$(awk -v a="$loud" -v b="$quiet" 'BEGIN {printf "%.3f", a / b}')
        echo "round $r latency, per_source $v: agents' p99 ${quiet} ms alone, ${loud} ms with a flood of $(cat "$WORK/flood.n") connects ($errors agent errors): x$ratio"
        if [ $v = on ]; then LAT_ON+=("$ratio"); else LAT_OFF+=("$ratio"); fi
    done
done
median() {
    printf '%s\n' "$@" | sort -n |
        awk '{v[NR] = $1} END {printf "%.3f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}
echo "median CPU per connection, per_source on/off over $ROUNDS rounds: $(median "${COST[@]}")"
echo "median agents' p99 with flood / without, per_source on: $(median "${LAT_ON[@]}")"
echo "median agents' p99 with flood / without, per_source off: $(median "${LAT_OFF[@]}")"
