#!/usr/bin/env bash
# What confirmed placement (stick.confirm) costs, beside HAProxy, in one run:
#
#   bench/confirm.sh [--seconds S] [--concurrency C] [--rounds N]
#
# Two sets of three rustls TLS 1.3 backends (loadgen backends):
#   cold: stateful tickets from a session cache, no ticketer: no key name, each
#         ticket single-use (like JDK servers): every resumption's placement is
#         unknown, so confirmation pays for it on every resumption (NAT case: all
#         agents on 127.0.0.1, so the source hint is a coin toss);
#   warm: stateless tickets with the backend's own key name, learned by the probe:
#         every placement is known, confirmation never runs.
# Targets per set: crossbar with `stick.confirm: true`, crossbar with
# `confirm: false`, HAProxy (round robin + classic session-ID stickiness). Each
# runs `loadgen connections --mode resumed --tls13` (C agents, each its own session
# cache) for S seconds, rounds interleaved; prints per run: conn/s, p50/p99 of
# connect+handshake, resumed and same-backend ratios (the client's own view), the busiest
# backend's share of connections (herding shows as 100 %), proxy
# CPU ms per 1,000 connections, and crossbar's extra backend handshakes per
# connection (from /metrics). Every process started here is killed by PID on exit.
set -euo pipefail

SECS=5 CONC=16 ROUNDS=2
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) SECS=$2; shift ;;
        --concurrency) CONC=$2; shift ;;
        --rounds) ROUNDS=$2; shift ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift
done

cd "$(dirname "$0")/.."
# shellcheck source=bench/haproxy-tls.sh
source bench/haproxy-tls.sh
WORK=$(mktemp -d /tmp/crossbar-confirm.XXXXXX)
PIDS=()
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    echo "logs kept in $WORK" >&2
}
trap cleanup EXIT
trap 'exit 130' INT TERM
log() { echo "[$(date +%T)] $*" >&2; }
start() {
    local name=$1
    shift
    "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
    LAST_PID=$!
    PIDS+=("$LAST_PID")
}
wait_for() {
    local i
    for i in $(seq 100); do
        grep -qx "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "timed out waiting for $2 in $1" >&2
    return 1
}
wait_port() {
    local i
    for i in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "nothing listens on port $1" >&2
    return 1
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TCK=$(getconf CLK_TCK)

log "building (release)"
cargo build --release --quiet --bin crossbar --bin loadgen
LG=$PWD/target/release/loadgen
XB=$PWD/target/release/crossbar
command -v haproxy >/dev/null || { echo "haproxy missing: apt-get install -y haproxy" >&2; exit 1; }

declare -A SET_ARGS=([cold]="--tls13" [warm]="--tls13 --tickets")
declare -A SET_ADDRS PORT
for set in cold warm; do
    # shellcheck disable=SC2086
    start "$set" "$LG" backends --kind tls --count 3 ${SET_ARGS[$set]} \
        --ca-out "$WORK/$set.ca.pem" --name-prefix "$set-" --no-stdin
    wait_for "$WORK/$set.out" READY
    SET_ADDRS[$set]=$(grep -v READY "$WORK/$set.out" | tr '\n' ' ')
    for t in confirm noconfirm haproxy; do PORT[${t}_$set]=$("$LG" freeport); done
done
ADMIN_PORT=$("$LG" freeport)

{
    echo "admin: { listen: \"127.0.0.1:$ADMIN_PORT\" }"
    echo "confirm_budget: 100000"
    echo "defaults: { health: { check: none } }"
    echo "services:"
    for set in cold warm; do
        for t in confirm noconfirm; do
            echo "  ${t}_$set:"
            echo "    listen: [\"127.0.0.1:${PORT[${t}_$set]}\"]"
            echo "    stick: { on: [session_id, ticket, psk], confirm: $([ $t = confirm ] && echo true || echo false) }"
            echo "    backends:"
            i=0
            for a in ${SET_ADDRS[$set]}; do
                echo "      - { name: $set-$i, address: \"$a\" }"
                i=$((i + 1))
            done
        done
    done
} >"$WORK/crossbar.yaml"
{
    # 2 fds per connection + 2 per pipe + a margin must fit the 20,000 open-file limit
    haproxy_head 9000 256
    for set in cold warm; do
        # shellcheck disable=SC2086
        haproxy_tls_listen "$set" "${PORT[haproxy_$set]}" 9000 ${SET_ADDRS[$set]}
    done
} >"$WORK/haproxy.cfg"

"$XB" check -c "$WORK/crossbar.yaml" >/dev/null
RUST_LOG=warn start crossbar "$XB" run -c "$WORK/crossbar.yaml"
XB_PID=$LAST_PID
haproxy -c -q -f "$WORK/haproxy.cfg"
start haproxy haproxy -db -f "$WORK/haproxy.cfg"
HA_PID=$LAST_PID
for p in "${PORT[@]}"; do wait_port "$p"; done

# extra SERVICE: crossbar's extra backend handshakes for SERVICE so far.
extra() {
    curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" |
        awk -v s="service=\"$1\"" '/^crossbar_stick_confirm_extra_handshakes_total/ && index($0, s) {n += $NF} END {print n + 0}'
}

echo "| round | backends | target | conn/s | p50 ms | p99 ms | resumed | same backend | busiest backend | proxy CPU ms / 1k conns | extra handshakes / conn |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for round in $(seq "$ROUNDS"); do
    for set in cold warm; do
        for t in confirm noconfirm haproxy; do
            pid=$XB_PID
            [ $t = haproxy ] && pid=$HA_PID
            e0=0
            [ $t != haproxy ] && e0=$(extra "${t}_$set")
            c0=$(cpu_ticks "$pid")
            out=$("$LG" connections --addr "127.0.0.1:${PORT[${t}_$set]}" --ca "$WORK/$set.ca.pem" \
                --mode resumed --tls13 --seconds "$SECS" --concurrency "$CONC" 2>>"$WORK/loadgen.err" | tail -1)
            c1=$(cpu_ticks "$pid")
            e1=0
            [ $t != haproxy ] && e1=$(extra "${t}_$set")
            echo "$out" >>"$WORK/results.jsonl"
            python3 - "$out" "$round" "$set" "$t" "$((c1 - c0))" "$TCK" "$((e1 - e0))" <<'EOF'
import json, sys
r = json.loads(sys.argv[1]); rnd, s, t = sys.argv[2:5]
ticks, tck, extra = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
n = max(r.get("conns", 0), 1)
# Share of the busiest backend: stickiness bought by herding every agent onto one
# backend (100 %) is not the same as stickiness with the load spread (~33 %).
busiest = max(r.get("per_backend", {}).values(), default=0) / n
cpu = 1000.0 * ticks / tck / n * 1000
print(f"| {rnd} | {s} | {t} | {r.get('conn_per_s', 0):.0f} | {r.get('p50_ms', 0):.2f} | "
      f"{r.get('p99_ms', 0):.2f} | {100 * r.get('resumed_ratio', 0):.1f} % | "
      f"{100 * r.get('same_backend_ratio', 0):.1f} % | {100 * busiest:.0f} % | {cpu:.0f} | "
      f"{extra / n:.2f} |")
EOF
        done
    done
done
