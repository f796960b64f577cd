#!/usr/bin/env bash
# User-space instructions per connection, counted by valgrind's callgrind: the one
# measure of crossbar's own CPU on this shared VM that does not move between runs
# (the same binary, load and config give the same count within ~1 %), so a change to
# the connection path's user space can be judged without the ±5-10 % noise of
# bench/conn-cpu.sh. It sees no kernel time (on loopback most of a connection's CPU:
# docs/performance.md, "Where the CPU goes") and runs crossbar ~50x slower, so it
# gives counts and splits, never a time or a ratio to another proxy.
#
# Three TLS 1.3 rustls backends (or three echo servers with --mode tcp) and the
# crossbar service bench/conn-cpu.sh uses (`workers: 1`, `stick: {}`); crossbar runs
# under callgrind, takes a warm-up, has its counters zeroed, takes `loadgen
# connections` for --seconds, and its counters are dumped. bench/callgrind-split.py
# then prints the instructions per connection split by kind (crossbar, tokio, the
# allocator, logging, ...) and the top functions. With --base, the same for another
# binary, one after the other (counts, not times: no need to interleave).
#
#   bench/callgrind.sh [--mode full|resumed|tcp] [--seconds S] [--base BIN]
#                      [--no-stick] [--access-log] [--top N]
#
# --no-stick:   the service without `stick: {}` (round robin).
# --access-log: RUST_LOG=info, so the access log is written (off by default, as in
#               conn-cpu.sh: RUST_LOG=warn).
# Loopback only; bounded by --seconds per target.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh

MODE=full SECS=5 BASE="" STICK=1 LOGLEVEL=warn TOP=25
while [ $# -gt 0 ]; do
    case $1 in
        --mode) MODE=$2; shift ;;
        --seconds) SECS=$2; shift ;;
        --base) BASE=$2; shift ;;
        --no-stick) STICK=0 ;;
        --access-log) LOGLEVEL=info ;;
        --top) TOP=$2; shift ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
for tool in valgrind callgrind_control python3; do
    command -v "$tool" >/dev/null || { echo "$tool is needed (apt-get install valgrind python3)" >&2; exit 1; }
done
bench_workdir crossbar-callgrind
build_release

start backends "$LG" backends --kind tls --count 3 --tls13 --tickets --ca-out "$WORK/ca.pem" \
    --name-prefix b- --no-stdin
start echo "$LG" backends --kind echo --count 3 --no-stdin
wait_for "$WORK/backends.out" READY
wait_for "$WORK/echo.out" READY
mapfile -t ADDRS < <(grep -v READY "$WORK/backends.out")
mapfile -t ECHOS < <(grep -v READY "$WORK/echo.out")

TARGETS=(crossbar) BINS=("$XB")
if [ -n "$BASE" ]; then TARGETS+=(base) BINS+=("$BASE"); fi
load() { # load PORT SECONDS -> JSON line
    local extra=(--mode tcp)
    [ "$MODE" != tcp ] && extra=(--ca "$WORK/ca.pem" --mode "$MODE")
    "$LG" connections --addr "127.0.0.1:$1" "${extra[@]}" --seconds "$2" --concurrency 4
}
for i in "${!TARGETS[@]}"; do
    t=${TARGETS[$i]}
    tls=$("$LG" freeport) tcp=$("$LG" freeport)
    CPU_STICK=$STICK crossbar_cpu_yaml 1 "$("$LG" freeport)" "$tls" "$tcp" >"$WORK/$t.yaml"
    port=$tls
    [ "$MODE" = tcp ] && port=$tcp
    log "$t under callgrind ($MODE, $SECS s)"
    RUST_LOG=$LOGLEVEL start "$t" valgrind --tool=callgrind \
        --callgrind-out-file="$WORK/$t.cg" "${BINS[$i]}" run -c "$WORK/$t.yaml"
    pid=$LAST_PID
    wait_port "$port" 60 # valgrind takes a while to start
    load "$port" 2 >/dev/null # warm up: pools, thread-local buffers, the stick table
    callgrind_control -z "$pid" >/dev/null
    out=$(load "$port" "$SECS")
    callgrind_control -d "$pid" >/dev/null
    n=$(field conns <<<"$out") errors=$(field errors <<<"$out")
    stop_pid "$pid"
    echo "== $t ($MODE$([ "$STICK" = 0 ] && echo ', no stick')$([ "$LOGLEVEL" = info ] && echo ', access log on'); $errors errors)"
    python3 bench/callgrind-split.py "$WORK/$t.cg.1" "$n" "$TOP"
done
