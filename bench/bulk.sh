#!/usr/bin/env bash
# Bulk throughput side by side (issue #32 item 5): 1 and 8 streams pushed into a
# sink directly, through crossbar at several splice pipe sizes (CROSSBAR_PIPE_SIZE),
# through a baseline crossbar binary (before a change) and through HAProxy (mode tcp,
# splice-auto); interleaved rounds, medians, the proxy's CPU per GB moved.
#
#   bench/bulk.sh --baseline /tmp/crossbar-main      # < 4 minutes
#   options: --rounds N --seconds S --pipes "65536 262144 1048576" --no-haproxy
# Prints one JSON line per measurement and a markdown table; writes the lines to
# bench/results/bulk.jsonl. Every process started here is killed by PID on exit.
set -euo pipefail

ROUNDS=3 SECS=4 PIPES="65536 262144 1048576" USE_HAPROXY=1 BASELINE=
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) ROUNDS=$2; shift ;;
        --seconds) SECS=$2; shift ;;
        --pipes) PIPES=$2; shift ;;
        --no-haproxy) USE_HAPROXY=0 ;;
        --baseline) BASELINE=$(realpath "$2"); shift ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift
done

cd "$(dirname "$0")/.."
# shellcheck source=bench/haproxy-tls.sh
source bench/haproxy-tls.sh
# shellcheck source=bench/lib.sh
source bench/lib.sh
bench_workdir crossbar-bulk
build_release

start sink "$LG" backends --kind sink --count 1 --no-stdin
wait_for "$WORK/sink.out" READY
SINK=$(head -1 "$WORK/sink.out")

declare -A PID_OF ADDR_OF
ADDR_OF[direct]=$SINK
TARGETS=direct

# crossbar_target NAME BINARY [PIPE-SIZE]: one crossbar with a single tcp service.
crossbar_target() {
    local name=$1 bin=$2 port
    port=$("$LG" freeport)
    cat >"$WORK/$name.yaml" <<EOF
admin: { enabled: false }
defaults:
  health: { check: none }
services:
  sink:
    listen: ["127.0.0.1:$port"]
    mode: tcp
    backends: [{ name: sink0, address: "$SINK" }]
EOF
    if [ -n "${3:-}" ]; then
        CROSSBAR_PIPE_SIZE=$3 RUST_LOG=warn start "$name" "$bin" run -c "$WORK/$name.yaml"
    else
        RUST_LOG=warn start "$name" "$bin" run -c "$WORK/$name.yaml"
    fi
    PID_OF[$name]=$LAST_PID
    ADDR_OF[$name]=127.0.0.1:$port
    TARGETS="$TARGETS $name"
    wait_port "$port"
}

[ -n "$BASELINE" ] && crossbar_target main "$BASELINE"
for p in $PIPES; do crossbar_target "xb_$((p / 1024))k" "$XB" "$p"; done
if [ "$USE_HAPROXY" = 1 ]; then
    port=$("$LG" freeport)
    {
        haproxy_head 1000 256
        echo "listen sink"
        echo "    bind 127.0.0.1:$port"
        echo "    server sink0 $SINK"
    } >"$WORK/haproxy.cfg"
    haproxy -c -q -f "$WORK/haproxy.cfg"
    start haproxy haproxy -db -f "$WORK/haproxy.cfg"
    PID_OF[haproxy]=$LAST_PID
    ADDR_OF[haproxy]=127.0.0.1:$port
    TARGETS="$TARGETS haproxy"
    wait_port "$port"
fi

OUT=$WORK/bulk.jsonl
: >"$OUT"
for round in $(seq "$ROUNDS"); do
    read -r -a order <<<"$TARGETS"
    shift_by=$(((round - 1) % ${#order[@]}))
    order=("${order[@]:$shift_by}" "${order[@]:0:$shift_by}")
    for streams in 1 8; do
        for t in "${order[@]}"; do
            pid=${PID_OF[$t]:-}
            c0=0
            [ -n "$pid" ] && c0=$(cpu_ticks "$pid")
            r=$("$LG" throughput --addr "${ADDR_OF[$t]}" --streams "$streams" --seconds "$SECS" | tail -1)
            cpu=null
            [ -n "$pid" ] && cpu=$(awk -v a="$c0" -v b="$(cpu_ticks "$pid")" -v t="$TCK" 'BEGIN {printf "%.3f", (b - a) / t}')
            line="{\"round\":$round,\"target\":\"$t\",\"streams\":$streams,\"cpu_s\":$cpu,\"result\":$r}"
            echo "$line" >>"$OUT"
            log "$line"
        done
    done
done

mkdir -p bench/results
cp "$OUT" bench/results/bulk.jsonl
# Medians per target and stream count, as ratios to direct.
python3 - "$OUT" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = {}
for streams in (1, 8):
    for t in dict.fromkeys(r["target"] for r in rows):
        rs = [r for r in rows if r["target"] == t and r["streams"] == streams]
        g = statistics.median(r["result"]["gbit_s"] for r in rs)
        cpu = [r["cpu_s"] / (r["result"]["bytes"] / 1e9) for r in rs if r["cpu_s"] is not None and r["result"]["bytes"]]
        med[t, streams] = (g, statistics.median(cpu) if cpu else None)
print("| target | 1 stream Gbit/s | x direct | CPU-s/GB | 8 streams Gbit/s | x direct | CPU-s/GB |")
print("|---|---|---|---|---|---|---|")
for t in dict.fromkeys(r["target"] for r in rows):
    cells = []
    for s in (1, 8):
        g, c = med[t, s]
        cells += [f"{g:.2f}", f"{g / med['direct', s][0]:.2f}", "-" if c is None else f"{c:.3f}"]
    print(f"| {t} | " + " | ".join(cells) + " |")
EOF
