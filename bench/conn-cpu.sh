#!/usr/bin/env bash
# Proxy CPU per new TLS connection, crossbar against HAProxy, in paired runs.
#
# Three TLS 1.3 rustls backends; one crossbar `mode: tls` service with `stick: {}` and
# the equivalent HAProxy `listen` section (the one bench/compare.sh uses). Each round
# runs `loadgen connections --mode full` (16 workers, each from its own 127.0.x.y)
# against crossbar, then against HAProxy, and prints both proxies' CPU per connection
# (utime + stime from /proc/PID/stat) and their ratio; the last line is the median
# ratio. Loopback only, bounded by --rounds x --seconds.
#
#   bench/conn-cpu.sh [--rounds N] [--seconds S] [--mode full|resumed]
#                     [--strace] [--perf] [--count] [--workers N] [--pin]
#                     [--base BIN]
#
# --count:  count, per connection, each proxy's allocator calls (uprobes on libc's
#           malloc, calloc and realloc: `perf probe -x LIBC malloc` etc. first),
#           system calls and context switches during round 1 (perf stat; the
#           uprobes slow that round, so its CPU figures are not comparable).
# --pin:    equal threads (issue #32): crossbar `workers: 1` and HAProxy `nbthread 1`,
#           each proxy pinned to core 0 with taskset, the load generator and the
#           backends to core 1. Without it each proxy takes the whole machine.
# --base:   also measure the crossbar binary BIN (e.g. main's build) with the same
#           config, in the same interleaved rounds: before and after side by side.
#
# --strace: count system calls of each proxy during round 1 (strace -c -f; slows it,
#           so that round's CPU figures are not comparable); tables in the work dir.
# --perf:   perf record -g each proxy for 3 s of round 1; perf.data in the work dir.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/haproxy-tls.sh
source bench/haproxy-tls.sh

ROUNDS=6 SECS=4 MODE=full STRACE=0 PERF=0 COUNT=0 WORKERS= PIN=0 BASE=
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) ROUNDS=$2; shift ;;
        --seconds) SECS=$2; shift ;;
        --mode) MODE=$2; shift ;;
        --strace) STRACE=1 ;;
        --perf) PERF=1 ;;
        --count) COUNT=1 ;;
        --workers) WORKERS=$2; shift ;;
        --pin) PIN=1 WORKERS=1 ;;
        --base) BASE=$2; shift ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
command -v haproxy >/dev/null || { echo "haproxy is needed (apt-get install haproxy)" >&2; exit 1; }

cargo build --release --quiet --bin crossbar --bin loadgen
LG=$PWD/target/release/loadgen
XB=$PWD/target/release/crossbar
W=$(mktemp -d /tmp/crossbar-conn-cpu.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    echo "work dir: $W" >&2
}
trap cleanup EXIT

# With --pin: proxies on core 0, everything else on core 1.
PROXY_CPU=() LOAD_CPU=()
if [ "$PIN" = 1 ]; then PROXY_CPU=(taskset -c 0) LOAD_CPU=(taskset -c 1); fi

"${LOAD_CPU[@]}" "$LG" backends --kind tls --count 3 --tls13 --tickets --ca-out "$W/ca.pem" \
    --name-prefix b- --no-stdin >"$W/backends.out" 2>"$W/backends.err" &
PIDS+=($!)
for _ in $(seq 100); do grep -q READY "$W/backends.out" 2>/dev/null && break; sleep 0.1; done
mapfile -t ADDRS < <(grep -v READY "$W/backends.out")
P_XB=$("$LG" freeport) P_HA=$("$LG" freeport) P_ADMIN=$("$LG" freeport)
P_BASE=$("$LG" freeport) P_BASE_ADMIN=$("$LG" freeport)

{
    [ -n "$WORKERS" ] && echo "workers: $WORKERS"
    echo "admin: { listen: \"127.0.0.1:$P_ADMIN\" }"
    echo "defaults: { health: { check: none } }"
    echo "services:"
    echo "  t13:"
    echo "    listen: [\"127.0.0.1:$P_XB\"]"
    echo "    mode: tls"
    echo "    stick: {}"
    echo "    backends:"
    for i in "${!ADDRS[@]}"; do echo "      - { name: b$i, address: \"${ADDRS[$i]}\" }"; done
} >"$W/crossbar.yaml"
sed -e "s/127.0.0.1:$P_XB/127.0.0.1:$P_BASE/" -e "s/127.0.0.1:$P_ADMIN/127.0.0.1:$P_BASE_ADMIN/" \
    "$W/crossbar.yaml" >"$W/crossbar-base.yaml"
{
    haproxy_head 2000 256
    haproxy_tls_listen t13 "$P_HA" 2000 "${ADDRS[@]}"
} >"$W/haproxy.cfg"
if [ "$PIN" = 1 ]; then sed -i '/^global$/a\    nbthread 1' "$W/haproxy.cfg"; fi

"$XB" check -c "$W/crossbar.yaml" >/dev/null
RUST_LOG=warn "${PROXY_CPU[@]}" "$XB" run -c "$W/crossbar.yaml" >"$W/crossbar.log" 2>&1 &
XB_PID=$!
PIDS+=($XB_PID)
"${PROXY_CPU[@]}" haproxy -db -f "$W/haproxy.cfg" >"$W/haproxy.log" 2>&1 &
HA_PID=$!
PIDS+=($HA_PID)
PROXIES=(crossbar:$P_XB:$XB_PID haproxy:$P_HA:$HA_PID)
if [ -n "$BASE" ]; then
    RUST_LOG=warn "${PROXY_CPU[@]}" "$BASE" run -c "$W/crossbar-base.yaml" >"$W/crossbar-base.log" 2>&1 &
    BASE_PID=$!
    PIDS+=($BASE_PID)
    PROXIES=(base:$P_BASE:$BASE_PID "${PROXIES[@]}")
fi
sleep 1.5

load() { # load PORT SECONDS -> JSON line
    "${LOAD_CPU[@]}" "$LG" connections --addr "127.0.0.1:$1" --ca "$W/ca.pem" --mode "$MODE" \
        --seconds "$2" --concurrency 16 --distinct-sources
}
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
conns() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["conns"])'; }
TCK=$(getconf CLK_TCK)

load "$P_XB" 1 >/dev/null # warm up all
load "$P_HA" 1 >/dev/null
[ -n "$BASE" ] && load "$P_BASE" 1 >/dev/null
RATIOS=() BASE_RATIOS=()
for r in $(seq "$ROUNDS"); do
    declare -A US
    for t in "${PROXIES[@]}"; do
        IFS=: read -r name port pid <<<"$t"
        tracer=
        if [ "$r" = 1 ] && [ "$STRACE" = 1 ]; then
            strace -c -f -p "$pid" -o "$W/$name.strace" &
            tracer=$!
            sleep 0.5
        fi
        if [ "$r" = 1 ] && [ "$PERF" = 1 ]; then
            perf record -q -F 2000 -g -p "$pid" -o "$W/$name.perf.data" -- sleep 3 \
                >/dev/null 2>&1 &
            tracer=$!
        fi
        if [ "$r" = 1 ] && [ "$COUNT" = 1 ]; then
            perf stat -x, -o "$W/$name.counts" -p "$pid" \
                -e probe_libc:malloc,probe_libc:calloc,probe_libc:realloc \
                -e raw_syscalls:sys_enter,context-switches &
            tracer=$!
            sleep 0.5
        fi
        c0=$(ticks "$pid")
        n=$(load "$port" "$SECS" | conns)
        c1=$(ticks "$pid")
        if [ -n "$tracer" ]; then
            [ "$STRACE" = 1 ] || [ "$COUNT" = 1 ] && kill -INT "$tracer" 2>/dev/null
            wait "$tracer" 2>/dev/null || true
        fi
        US[$name]=$(awk -v a="$c0" -v b="$c1" -v t="$TCK" -v n="$n" \
            'BEGIN {printf "%.1f", (b - a) / t / n * 1e6}')
        echo "round $r $name: $n connections, ${US[$name]} us CPU per connection"
        if [ "$r" = 1 ] && [ "$COUNT" = 1 ]; then
            awk -F, -v n="$n" -v who="$name" '$3 ~ /probe_libc/ {a += $1}
                $3 == "raw_syscalls:sys_enter" {s = $1} $3 == "context-switches" {c = $1}
                END {printf "counts %s: %.2f allocator calls, %.2f syscalls, %.2f context switches per connection\n",
                    who, a / n, s / n, c / n}' "$W/$name.counts"
        fi
    done
    ratio=$(awk -v a="${US[crossbar]}" -v b="${US[haproxy]}" 'BEGIN {printf "%.3f", a / b}')
    RATIOS+=("$ratio")
    echo "round $r crossbar/haproxy: $ratio"
    if [ -n "$BASE" ]; then
        ratio=$(awk -v a="${US[base]}" -v b="${US[haproxy]}" 'BEGIN {printf "%.3f", a / b}')
        BASE_RATIOS+=("$ratio")
        echo "round $r base/haproxy: $ratio"
    fi
done
if [ -n "$BASE" ]; then
    printf '%s\n' "${BASE_RATIOS[@]}" | sort -n |
        awk '{v[NR] = $1} END {m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
            printf "median base/haproxy CPU per connection over %d rounds: %.3f\n", NR, m}'
fi
printf '%s\n' "${RATIOS[@]}" | sort -n |
    awk '{v[NR] = $1} END {m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
        printf "median crossbar/haproxy CPU per connection over %d rounds: %.3f\n", NR, m}'
