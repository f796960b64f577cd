#!/usr/bin/env bash
# Side-by-side benchmark: direct connection vs crossbar vs HAProxy (mode tcp) vs
# nginx's stream module (ssl_preread, round robin; Debian's default `worker_processes
# auto`), and optionally vs a baseline crossbar binary (before/after a change, in one
# run), all on loopback, same backends, same clients, interleaved rounds, medians.
#
#   bench/compare.sh            # full run (3 rounds of 5 s per figure), < 12 minutes
#   bench/compare.sh --quick    # 1 round of 2 s, 2,000 idle connections, < 3 minutes
#   bench/compare.sh --baseline /tmp/crossbar-before --no-haproxy --no-nginx   # before vs after
#   options: --rounds N --seconds S --idle N --concurrency C --no-haproxy --no-nginx
#            --baseline BIN --nginx-half-close
# --nginx-half-close: nginx with `proxy_half_close on`, passing a client's FIN on
#            as crossbar and HAProxy do (nginx's default closes both sides at once).
#
# Writes bench/results/latest.json and prints a markdown table (docs/performance.md
# explains every figure). Every process started here is killed by PID on exit.
set -euo pipefail

ROUNDS=3 SECS=5 IDLE_N=10000 CONC=16 LAT_N=20000 USE_HAPROXY=1 USE_NGINX=1 BASELINE=
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) ROUNDS=1 SECS=2 IDLE_N=2000 LAT_N=5000 ;;
        --rounds) ROUNDS=$2; shift ;;
        --seconds) SECS=$2; shift ;;
        --idle) IDLE_N=$2; shift ;;
        --concurrency) CONC=$2; shift ;;
        --no-haproxy) USE_HAPROXY=0 ;;
        --no-nginx) USE_NGINX=0 ;;
        --baseline) BASELINE=$(realpath "$2"); shift ;;
        --nginx-half-close) export NGINX_HALF_CLOSE=on ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift
done

cd "$(dirname "$0")/.."
# shellcheck source=bench/haproxy-tls.sh
source bench/haproxy-tls.sh
# shellcheck source=bench/lib.sh
source bench/lib.sh
# shellcheck source=bench/nginx-stream.sh
source bench/nginx-stream.sh
bench_workdir crossbar-bench

# ---------------------------------------------------------------- build, tools
build_release

if [ "$USE_HAPROXY" = 1 ] && ! command -v haproxy >/dev/null; then
    log "haproxy missing: apt-get install -y haproxy"
    if ! { apt-get install -y -qq haproxy >"$WORK/apt.log" 2>&1 ||
        { apt-get update -qq >>"$WORK/apt.log" 2>&1 &&
            apt-get install -y -qq haproxy >>"$WORK/apt.log" 2>&1; }; }; then
        log "WARNING: could not install haproxy (see $WORK/apt.log): running without it"
        USE_HAPROXY=0
    fi
fi
if [ "$USE_NGINX" = 1 ] && ! nginx_ensure "$WORK/apt-nginx.log"; then
    log "WARNING: could not install nginx's stream module (see $WORK/apt-nginx.log): running without it"
    USE_NGINX=0
fi
TARGETS="direct crossbar"
[ -n "$BASELINE" ] && TARGETS="$TARGETS baseline"
[ "$USE_HAPROXY" = 1 ] && TARGETS="$TARGETS haproxy"
[ "$USE_NGINX" = 1 ] && TARGETS="$TARGETS nginx"
HAPROXY_VERSION=$([ "$USE_HAPROXY" = 1 ] && haproxy -v | head -1 | awk '{print $3}' || echo none)
NGINX_VERSION=$([ "$USE_NGINX" = 1 ] && nginx_version || echo none)

# File descriptors: each idle connection costs the proxy two (client + backend).
# HAProxy refuses to start unless 2 x maxconn + 2 x maxpipes (+ its listeners) fit
# under the limit, so leave 1,500 spare and give it a fixed, small pipe pool.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
NOFILE=$(ulimit -n)
MAX_IDLE=$(((NOFILE - 1500) / 2))
if [ "$IDLE_N" -gt "$MAX_IDLE" ]; then
    log "open-file limit $NOFILE: idle connections capped at $MAX_IDLE (asked $IDLE_N)"
    IDLE_N=$MAX_IDLE
fi
MAXCONN=$((IDLE_N + 200))
MAXPIPES=256

# ---------------------------------------------------------------- backends
log "starting backends"
start sink "$LG" backends --kind sink --count 1 --no-stdin
wait_for "$WORK/sink.out" READY
SINK=$(head -1 "$WORK/sink.out")
start echo "$LG" backends --kind echo --count 1 --no-stdin
wait_for "$WORK/echo.out" READY
ECHO=$(head -1 "$WORK/echo.out")
# Three TLS backend sets: TLS 1.2 session IDs (no tickets), TLS 1.2 tickets, TLS 1.3.
declare -A SET_ARGS=([t12sid]="--tls12" [t12tk]="--tls12 --tickets" [t13]="--tls13 --tickets")
declare -A SET_ADDRS
for set in t12sid t12tk t13; do
    # shellcheck disable=SC2086
    start_tls_set "$set" ${SET_ARGS[$set]}
done

# ---------------------------------------------------------------- proxies
declare -A PORT
for svc in sink echo t12sid t12tk t13; do
    PORT[crossbar_$svc]=$("$LG" freeport)
    PORT[baseline_$svc]=$("$LG" freeport)
    PORT[haproxy_$svc]=$("$LG" freeport)
    PORT[nginx_$svc]=$("$LG" freeport)
done
ADMIN_PORT=$("$LG" freeport)

# crossbar_yaml TARGET ADMIN: the config of one crossbar target.
crossbar_yaml() {
    local t=$1
    echo "admin: $2"
    echo "defaults:"
    echo "  health: { check: none }"
    echo "  max_connections: $MAXCONN"
    echo "services:"
    for svc in sink echo; do
        addr=$SINK
        [ $svc = echo ] && addr=$ECHO
        echo "  $svc:"
        echo "    listen: [\"127.0.0.1:${PORT[${t}_$svc]}\"]"
        echo "    mode: tcp"
        echo "    backends: [{ name: ${svc}0, address: \"$addr\" }]"
    done
    for set in t12sid t12tk t13; do
        echo "  $set:"
        echo "    listen: [\"127.0.0.1:${PORT[${t}_$set]}\"]"
        echo "    mode: tls"
        echo "    stick: {}"
        echo "    backends:"
        crossbar_backends "$set"
    done
}
crossbar_yaml crossbar "{ listen: \"127.0.0.1:$ADMIN_PORT\" }" >"$WORK/crossbar.yaml"
crossbar_yaml baseline "{ enabled: false }" >"$WORK/baseline.yaml"

{
    haproxy_head "$MAXCONN" "$MAXPIPES"
    for svc in sink echo; do
        addr=$SINK
        [ $svc = echo ] && addr=$ECHO
        echo "listen $svc"
        echo "    bind 127.0.0.1:${PORT[haproxy_$svc]}"
        echo "    maxconn $MAXCONN"
        echo "    server ${svc}0 $addr"
    done
    for set in t12sid t12tk t13; do
        # shellcheck disable=SC2086
        haproxy_tls_listen "$set" "${PORT[haproxy_$set]}" "$MAXCONN" ${SET_ADDRS[$set]}
    done
} >"$WORK/haproxy.cfg"

# nginx: Debian's `worker_processes auto` (one per core); each worker may take every
# connection (a proxied one counts twice).
mkdir -p "$WORK/nginx"
{
    nginx_head "$WORK/nginx" auto $((2 * MAXCONN + 100)) "$NOFILE"
    nginx_tcp_server sink "${PORT[nginx_sink]}" "$SINK"
    nginx_tcp_server echo "${PORT[nginx_echo]}" "$ECHO"
    for set in t12sid t12tk t13; do
        # shellcheck disable=SC2086
        nginx_tls_server "$set" "${PORT[nginx_$set]}" ${SET_ADDRS[$set]}
    done
    nginx_tail
} >"$WORK/nginx/nginx.conf"

declare -A PID_OF
log "starting crossbar"
"$XB" check -c "$WORK/crossbar.yaml" >"$WORK/crossbar.check" || {
    cat "$WORK/crossbar.check" >&2
    exit 1
}
RUST_LOG=warn start crossbar "$XB" run -c "$WORK/crossbar.yaml"
PID_OF[crossbar]=$LAST_PID
if [ -n "$BASELINE" ]; then
    log "starting the baseline $BASELINE"
    RUST_LOG=warn start baseline "$BASELINE" run -c "$WORK/baseline.yaml"
    PID_OF[baseline]=$LAST_PID
fi
if [ "$USE_HAPROXY" = 1 ]; then
    log "starting haproxy $HAPROXY_VERSION"
    haproxy -c -q -f "$WORK/haproxy.cfg"
    start haproxy haproxy -db -f "$WORK/haproxy.cfg"
    PID_OF[haproxy]=$LAST_PID
fi
if [ "$USE_NGINX" = 1 ]; then
    log "starting nginx $NGINX_VERSION"
    nginx_cmd "$WORK/nginx"
    "${NGINX_CMD[@]}" -t -q
    start nginx "${NGINX_CMD[@]}"
    PID_OF[nginx]=$LAST_PID
fi
for t in $TARGETS; do
    [ "$t" = direct ] && continue
    for svc in sink echo t12sid t12tk t13; do wait_port "${PORT[${t}_$svc]}"; done
done

# addr TARGET SERVICE: where a client of TARGET connects for SERVICE.
addr() {
    case "$1/$2" in
        direct/sink) echo "$SINK" ;;
        direct/echo) echo "$ECHO" ;;
        direct/*) set -- ${SET_ADDRS[$2]} && echo "$1" ;;
        *) echo "127.0.0.1:${PORT[${1}_$2]}" ;;
    esac
}

# ---------------------------------------------------------------- measurements
# proxy_ticks / proxy_rss_kib PID: CPU ticks / RSS of PID and its children (nginx's
# master and workers; crossbar and HAProxy are one process each).
proxy_ticks() {
    local p sum=0
    for p in $(tree_pids "$1"); do sum=$((sum + $(cpu_ticks "$p" 2>/dev/null || echo 0))); done
    echo "$sum"
}
proxy_rss_kib() {
    local p sum=0
    for p in $(tree_pids "$1"); do sum=$((sum + $(rss_kib "$p" 2>/dev/null || echo 0))); done
    echo "$sum"
}
RESULTS=$WORK/results.jsonl
: >"$RESULTS"
# measure ROUND TARGET METRIC CMD...: run CMD, record its JSON line with the proxy's
# CPU seconds spent meanwhile.
measure() {
    local round=$1 target=$2 metric=$3 pid c0 c1 out cpu=null
    shift 3
    pid=${PID_OF[$target]:-}
    [ -n "$pid" ] && c0=$(proxy_ticks "$pid")
    if ! out=$("$@" 2>>"$WORK/loadgen.err" | tail -1) || [ -z "$out" ]; then
        out="{\"kind\":\"failed\",\"error\":\"loadgen exited non-zero, see $WORK/loadgen.err\"}"
    fi
    if [ -n "$pid" ]; then
        c1=$(proxy_ticks "$pid")
        cpu=$(awk -v a="$c0" -v b="$c1" -v t="$TCK" 'BEGIN {printf "%.3f", (b - a) / t}')
    fi
    echo "{\"round\":$round,\"target\":\"$target\",\"metric\":\"$metric\",\"cpu_s\":$cpu,\"result\":$out}" >>"$RESULTS"
    log "round $round $target $metric: $out"
}

tls() { # tls TARGET SET MODE EXTRA...
    local target=$1 set=$2 mode=$3
    shift 3
    "$LG" connections --addr "$(addr "$target" "$set")" --ca "$WORK/$set.ca.pem" \
        --mode "$mode" --seconds "$SECS" --concurrency "$CONC" --distinct-sources "$@"
}

for round in $(seq "$ROUNDS"); do
    # Rotate the target order each round so no target always runs first or last.
    read -r -a order <<<"$TARGETS"
    shift_by=$(((round - 1) % ${#order[@]}))
    order=("${order[@]:$shift_by}" "${order[@]:0:$shift_by}")
    for metric in tput1 tput8 latency conn_full res_t12sid res_t12tk res_t13; do
        for t in "${order[@]}"; do
            case $metric in
                tput1) measure "$round" "$t" $metric "$LG" throughput --addr "$(addr "$t" sink)" --streams 1 --seconds "$SECS" ;;
                tput8) measure "$round" "$t" $metric "$LG" throughput --addr "$(addr "$t" sink)" --streams 8 --seconds "$SECS" ;;
                latency) measure "$round" "$t" $metric "$LG" latency --addr "$(addr "$t" echo)" --count "$LAT_N" ;;
                conn_full) measure "$round" "$t" $metric tls "$t" t13 full --tls13 ;;
                res_t12sid) measure "$round" "$t" $metric tls "$t" t12sid resumed --tls12 --no-tickets ;;
                res_t12tk) measure "$round" "$t" $metric tls "$t" t12tk resumed --tls12 ;;
                res_t13) measure "$round" "$t" $metric tls "$t" t13 resumed --tls13 ;;
            esac
        done
    done
done

# RSS per idle connection: once per proxy, after the rounds.
for t in $TARGETS; do
    [ "$t" = direct ] && continue
    pid=${PID_OF[$t]}
    r0=$(proxy_rss_kib "$pid")
    start "idle_$t" "$LG" idle --addr "$(addr "$t" echo)" --count "$IDLE_N" --seconds 120 --no-stdin
    idle_pid=$LAST_PID
    if wait_for "$WORK/idle_$t.out" HELD; then
        sleep 1
        r1=$(proxy_rss_kib "$pid")
        held=$(head -1 "$WORK/idle_$t.out")
        echo "{\"round\":1,\"target\":\"$t\",\"metric\":\"idle\",\"cpu_s\":null,\"rss_before_kib\":$r0,\"rss_after_kib\":$r1,\"result\":$held}" >>"$RESULTS"
        log "$t idle: RSS $r0 -> $r1 KiB, $held"
    fi
    stop_pid "$idle_pid"
    sleep 1
done

# Errors the proxies themselves counted (crossbar's metrics).
curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" >"$WORK/crossbar.metrics" 2>/dev/null || true

mkdir -p bench/results
"$LG" report --input "$RESULTS" --json-out bench/results/latest.json \
    --haproxy-version "$HAPROXY_VERSION" --nginx-version "$NGINX_VERSION" --rounds "$ROUNDS" --seconds "$SECS" \
    --metrics "$WORK/crossbar.metrics"
