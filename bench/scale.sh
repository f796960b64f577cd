#!/usr/bin/env bash
# Scale curves (issue #32 item 6), loopback only, every step bounded:
#  1. CPU and RSS per connection with 1k, 10k and 100k connections held open
#     through crossbar and through HAProxy (a fresh proxy per level, so each level's
#     memory is its own); the level is capped by the open-file limit.
#  2. Stick tables of 1M and 10M entries (`loadgen stick`): memory, lookups/s on two
#     threads, state-file save and load time.
#  3. A reload (SIGHUP) of a crossbar holding the largest level's connections and a
#     1M-entry stick table (loaded from a state file): what new connections see
#     (`loadgen probe`: longest connect + echo, errors), before and during.
#
#   bench/scale.sh                      # all three, < 6 minutes
#   options: --levels "1000 10000 100000" --stick "1000000 10000000" --no-haproxy
#            --no-reload
# Prints JSON lines (one per figure) and writes them to bench/results/scale.jsonl.
# Every process started here is killed by PID on exit.
set -euo pipefail

LEVELS="1000 10000 100000" STICK_SIZES="1000000 10000000" USE_HAPROXY=1 RELOAD=1
RELOAD_ENTRIES=1000000
while [ $# -gt 0 ]; do
    case "$1" in
        --levels) LEVELS=$2; shift ;;
        --stick) STICK_SIZES=$2; shift ;;
        --no-haproxy) USE_HAPROXY=0 ;;
        --no-reload) RELOAD=0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift
done

cd "$(dirname "$0")/.."
# shellcheck source=bench/haproxy-tls.sh
source bench/haproxy-tls.sh
# shellcheck source=bench/lib.sh
source bench/lib.sh
bench_workdir crossbar-scale
build_release
OUT=$WORK/scale.jsonl
: >"$OUT"
emit() { echo "$1" >>"$OUT"; log "$1"; }

# Each held connection costs a proxy two descriptors (client + backend); HAProxy
# also wants 2 x maxpipes. Levels above what the limit allows are capped, and said.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
NOFILE=$(ulimit -n)
CAP=$(((NOFILE - 1500) / 2))
MAXPIPES=64

# wait_held FILE: until the idle client printed HELD (120 s at most: 100k
# connections open in well under that on loopback).
wait_held() {
    local i
    for i in $(seq 1200); do
        grep -qx HELD "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "timed out waiting for HELD in $1" >&2
    return 1
}

start echo "$LG" backends --kind echo --count 1 --no-stdin
wait_for "$WORK/echo.out" READY
ECHO=$(head -1 "$WORK/echo.out")

# proxy_start TARGET MAXCONN [EXTRA-YAML-FILE]: a fresh proxy with one echo service
# on $PORT; sets $PPID_NOW.
proxy_start() {
    local t=$1 maxconn=$2
    PORT=$("$LG" freeport)
    if [ "$t" = crossbar ]; then
        {
            echo "admin: { listen: \"127.0.0.1:$ADMIN_PORT\" }"
            echo "defaults:"
            echo "  health: { check: none }"
            echo "  max_connections: $maxconn"
            echo "services:"
            echo "  echo:"
            echo "    listen: [{ address: \"127.0.0.1:$PORT\", backlog: 4096 }]"
            echo "    mode: tcp"
            echo "    backends: [{ name: echo0, address: \"$ECHO\" }]"
            [ -n "${3:-}" ] && cat "$3"
        } >"$WORK/crossbar.yaml"
        "$XB" check -c "$WORK/crossbar.yaml" >"$WORK/crossbar.check" || {
            cat "$WORK/crossbar.check" >&2
            exit 1
        }
        RUST_LOG=info start crossbar "$XB" run -c "$WORK/crossbar.yaml"
    else
        {
            haproxy_head "$maxconn" "$MAXPIPES"
            echo "listen echo"
            echo "    bind 127.0.0.1:$PORT"
            echo "    maxconn $maxconn"
            echo "    server echo0 $ECHO"
        } >"$WORK/haproxy.cfg"
        haproxy -c -q -f "$WORK/haproxy.cfg"
        start haproxy haproxy -db -f "$WORK/haproxy.cfg"
    fi
    PPID_NOW=$LAST_PID
    wait_port "$PORT"
}
ADMIN_PORT=$("$LG" freeport)
# metric NAME: the sum of a crossbar metric's series (NAME may carry labels).
metric() {
    curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" |
        awk -v m="$1" 'index($1, m) == 1 && ($1 == m || substr($1, length(m) + 1, 1) == "{") {s += $2} END {print s + 0}'
}

# hold N NAME: N idle connections through the proxy on $PORT; sets $IDLE_PID.
hold() {
    start "$2" "$LG" idle --addr "127.0.0.1:$PORT" --count "$1" --seconds 110 --no-stdin
    IDLE_PID=$LAST_PID
    wait_held "$WORK/$2.out"
}

# ---------------------------------------------------------------- 1. connections
TARGETS=crossbar
[ "$USE_HAPROXY" = 1 ] && TARGETS="crossbar haproxy"
TOP=0
for want in $LEVELS; do
    n=$want
    if [ "$n" -gt "$CAP" ]; then
        n=$CAP
        emit "{\"kind\":\"capped\",\"asked\":$want,\"held\":$n,\"nofile\":$NOFILE,\"why\":\"RLIMIT_NOFILE hard limit $NOFILE (no CAP_SYS_RESOURCE to raise it): 2 descriptors per proxied connection\"}"
    fi
    [ "$n" -le "$TOP" ] && continue
    TOP=$n
    for t in $TARGETS; do
        proxy_start "$t" $((n + 500))
        pid=$PPID_NOW
        sleep 0.5
        r0=$(rss_kib "$pid") c0=$(cpu_ticks "$pid") w0=$(date +%s.%N)
        hold "$n" "idle_${t}_$n"
        c1=$(cpu_ticks "$pid") w1=$(date +%s.%N)
        sleep 1
        r1=$(rss_kib "$pid") c2=$(cpu_ticks "$pid")
        sleep 5
        c3=$(cpu_ticks "$pid")
        held=$(head -1 "$WORK/idle_${t}_$n.out")
        emit "$(awk -v t="$t" -v n="$n" -v r0="$r0" -v r1="$r1" -v c0="$c0" -v c1="$c1" \
            -v c2="$c2" -v c3="$c3" -v w0="$w0" -v w1="$w1" -v tck="$TCK" -v held="$held" 'BEGIN {
            printf "{\"kind\":\"conns\",\"target\":\"%s\",\"n\":%d,\"rss_base_kib\":%d,\"rss_held_kib\":%d,", t, n, r0, r1
            printf "\"rss_per_conn_b\":%.0f,\"open_cpu_us_per_conn\":%.1f,\"open_wall_s\":%.2f,", (r1 - r0) * 1024 / n, (c1 - c0) / tck * 1e6 / n, w1 - w0
            printf "\"held_cpu_pct\":%.2f,\"client\":%s}", (c3 - c2) / tck / 5 * 100, held }')"
        stop_pid "$IDLE_PID"
        stop_pid "$pid"
    done
done

# ---------------------------------------------------------------- 2. stick tables
for n in $STICK_SIZES; do
    out=$("$LG" stick --entries "$n" --file "$WORK/stick-$n.table")
    emit "$out"
done

# ---------------------------------------------------------------- 3. reload
if [ "$RELOAD" = 1 ] && [ "$TOP" -gt 0 ]; then
    declare -A SET_ADDRS
    start_tls_set t13 --tls13 --tickets
    table=$WORK/reload.table
    "$LG" stick --entries "$RELOAD_ENTRIES" --file "$table" --keep \
        --backends t13-0,t13-1,t13-2 >/dev/null
    {
        echo "  t13:"
        echo "    listen: [\"127.0.0.1:$("$LG" freeport)\"]"
        echo "    mode: tls"
        echo "    stick: { size: $RELOAD_ENTRIES, state_file: \"$table\", save_interval: 1h }"
        echo "    backends:"
        crossbar_backends t13
    } >"$WORK/t13.yaml"
    proxy_start crossbar $((TOP + 500)) "$WORK/t13.yaml"
    pid=$PPID_NOW
    entries=$(metric crossbar_stick_table_entries)
    hold "$TOP" idle_reload
    r0=$(rss_kib "$pid") active0=$(metric crossbar_active_connections)
    # Quiet: what new connections see with the load held and no reload.
    quiet=$("$LG" probe --addr "127.0.0.1:$PORT" --seconds 4)
    # Reload 2 s into an 8 s probe, then wait for the probe to finish.
    start probe "$LG" probe --addr "127.0.0.1:$PORT" --seconds 8
    probe_pid=$LAST_PID
    sleep 2
    kill -HUP "$pid"
    wait "$probe_pid" || true
    during=$(tail -1 "$WORK/probe.out")
    r1=$(rss_kib "$pid")
    after=$(metric crossbar_stick_table_entries)
    emit "{\"kind\":\"reload\",\"conns\":$TOP,\"stick_entries_before\":$entries,\"stick_entries_after\":$after,\"active_before\":$active0,\"active_after\":$(metric crossbar_active_connections),\"reloads_ok\":$(metric 'crossbar_config_reloads_total{result="ok"}'),\"rss_kib_before\":$r0,\"rss_kib_after\":$r1,\"quiet\":$quiet,\"during\":$during}"
    grep -i "reload" "$WORK/crossbar.err" | tail -3 >&2 || true
    stop_pid "$IDLE_PID"
    stop_pid "$pid"
fi

mkdir -p bench/results
cp "$OUT" bench/results/scale.jsonl
cat "$OUT"
