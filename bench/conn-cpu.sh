#!/usr/bin/env bash
# Proxy CPU per new connection: crossbar against HAProxy and nginx's stream module,
# in interleaved rounds.
#
# Three TLS 1.3 rustls backends; one crossbar `mode: tls` service with `stick: {}`,
# the equivalent HAProxy `listen` section (the one bench/compare.sh uses) and an nginx
# stream server reading the ClientHello (`ssl_preread on`, the upstream chosen by a
# map on `$ssl_preread_server_name`). Each round runs `loadgen connections --mode
# full` (16 workers, each from its own 127.0.x.y) against each proxy in turn (the
# order rotates every round) and prints their CPU per connection (utime + stime from
# /proc/PID/stat, nginx's master and workers summed) and crossbar's ratio to each;
# the last lines are the median ratios with the spread of the rounds. Loopback only,
# bounded by --rounds x --seconds x figures x proxies.
#
#   bench/conn-cpu.sh [--rounds N] [--seconds S] [--mode full|resumed] [--tcp]
#                     [--no-nginx] [--strace] [--perf] [--count] [--workers N]
#                     [--pin] [--base BIN] [--base-workers N] [--crossbar-env K=V]
#                     [--no-stick] [--access-log] [--floor] [--nginx-half-close]
#
# --tcp:    also, in every round, plain TCP connections (`loadgen connections --mode
#           tcp`: connect, 64 bytes echoed, close) through a `mode: tcp` service, a
#           plain HAProxy `listen` and an nginx stream server without preread, all
#           round robin over three echo backends.
# --no-nginx: crossbar and HAProxy only. Without it nginx (Debian: nginx-light and
#           libnginx-mod-stream) is installed if missing and run with its own config
#           in the work dir.
# --count:  count, per connection, each proxy's allocator calls (uprobes on libc's
#           malloc, calloc and realloc: `perf probe -x LIBC malloc` etc. first),
#           system calls and context switches during round 1 (perf stat; the
#           uprobes slow that round, so its CPU figures are not comparable).
# --pin:    equal threads (issue #32): crossbar `workers: 1`, HAProxy `nbthread 1`,
#           nginx `worker_processes 1`, each proxy pinned to core 0 with taskset, the
#           load generator and the backends to core 1. Without it each proxy takes
#           the whole machine (nginx `worker_processes auto`).
# --base:   also measure the crossbar binary BIN (e.g. main's build) with the same
#           config, in the same interleaved rounds: before and after side by side
#           (ratios crossbar/base too).
# --base-workers N: the base binary's `workers` (default: the same as crossbar's).
# --no-stick: the crossbar under test (not --base) without `stick: {}`: round robin
#           like nginx's, no stick lookups or learning (the server's flight is still
#           watched, for the handshake metrics). With --base set to the same binary,
#           crossbar/base is what stickiness costs, crossbar/nginx the rest.
# --access-log: both crossbar binaries with RUST_LOG=info, so each writes its access
#           log (to a file in the work dir), as `crossbar run` does by default;
#           without it RUST_LOG=warn (HAProxy and nginx log nothing here either way).
# --floor:  also four floor relays (bench/floor: one thread, no parsing, no stick
#           table, no metrics, no log; only accept, connect, relay and close): `epoll`
#           with the fewest system calls a readiness loop can make, `epoll-del` the
#           same with tokio's epoll_ctl(DEL) before each close, `uring` on io_uring
#           and `tokio` on crossbar's runtime (one worker, copy_bidirectional). What
#           any proxy's CPU per connection on this kernel can come down to with each
#           engine, and crossbar's cost split: kernel floor, DEL, runtime, crossbar's
#           own (crossbar/floor-tokio). In the TLS figure they relay the handshake
#           without reading it.
# --nginx-half-close: nginx with `proxy_half_close on`, so it passes a client's FIN
#           on and waits for the backend's, as crossbar, HAProxy and the floors do
#           (nginx's default closes both sides at the client's FIN: one shutdown, one
#           read and often one wakeup less per TCP connection).
# --crossbar-env K=V: environment for the crossbar under test only (a runtime
#           prototype's switch, say); repeatable.
# At the end: CPU seconds of each crossbar thread (how the work spread over them).
#
# --strace: count system calls of each proxy during round 1 (strace -c -f; slows it,
#           so that round's CPU figures are not comparable); tables in the work dir.
# --perf:   perf record -g each proxy for 3 s of round 1; perf.data in the work dir,
#           and bench/cpu-split.sh prints where each proxy's CPU went.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/haproxy-tls.sh
source bench/haproxy-tls.sh
# shellcheck source=bench/lib.sh
source bench/lib.sh
# shellcheck source=bench/nginx-stream.sh
source bench/nginx-stream.sh

ROUNDS=6 SECS=4 MODE=full STRACE=0 PERF=0 COUNT=0 WORKERS="" PIN=0 BASE="" TCP=0 NGINX=1
STICK=1 LOGLEVEL=warn FLOOR=0
BASE_WORKERS="" XB_ENV=()
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) ROUNDS=$2; shift ;;
        --seconds) SECS=$2; shift ;;
        --mode) MODE=$2; shift ;;
        --tcp) TCP=1 ;;
        --no-nginx) NGINX=0 ;;
        --strace) STRACE=1 ;;
        --perf) PERF=1 ;;
        --count) COUNT=1 ;;
        --workers) WORKERS=$2; shift ;;
        --pin) PIN=1 WORKERS=1 ;;
        --base) BASE=$2; shift ;;
        --base-workers) BASE_WORKERS=$2; shift ;;
        --crossbar-env) XB_ENV+=("$2"); shift ;;
        --no-stick) STICK=0 ;;
        --access-log) LOGLEVEL=info ;;
        --floor) FLOOR=1 ;;
        --nginx-half-close) export NGINX_HALF_CLOSE=on ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
command -v haproxy >/dev/null || { echo "haproxy is needed (apt-get install haproxy)" >&2; exit 1; }

cargo build --release --quiet --bin crossbar --bin loadgen
[ "$FLOOR" = 0 ] || cargo build --release --quiet --manifest-path bench/floor/Cargo.toml
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
if [ "$NGINX" = 1 ] && ! nginx_ensure "$W/apt.log"; then
    echo "nginx's stream module could not be installed (see $W/apt.log); --no-nginx to run without" >&2
    exit 1
fi

# With --pin: proxies on core 0, everything else on core 1.
PROXY_CPU=() LOAD_CPU=()
if [ "$PIN" = 1 ]; then PROXY_CPU=(taskset -c 0) LOAD_CPU=(taskset -c 1); fi

"${LOAD_CPU[@]}" "$LG" backends --kind tls --count 3 --tls13 --tickets --ca-out "$W/ca.pem" \
    --name-prefix b- --no-stdin >"$W/backends.out" 2>"$W/backends.err" &
PIDS+=($!)
"${LOAD_CPU[@]}" "$LG" backends --kind echo --count 3 --no-stdin >"$W/echo.out" 2>"$W/echo.err" &
PIDS+=($!)
for f in backends echo; do
    for _ in $(seq 100); do grep -q READY "$W/$f.out" 2>/dev/null && break; sleep 0.1; done
done
mapfile -t ADDRS < <(grep -v READY "$W/backends.out")
mapfile -t ECHOS < <(grep -v READY "$W/echo.out")
declare -A PORT
FLOORS=(epoll epoll-del uring tokio)
for t in crossbar haproxy nginx base "${FLOORS[@]/#/floor-}"; do
    PORT[${t}_tls]=$("$LG" freeport) PORT[${t}_tcp]=$("$LG" freeport)
done
P_ADMIN=$("$LG" freeport) P_BASE_ADMIN=$("$LG" freeport)

crossbar_yaml() { # crossbar_yaml TARGET ADMIN_PORT
    local w=$WORKERS
    [ "$1" = base ] && [ -n "$BASE_WORKERS" ] && w=$BASE_WORKERS
    local stick=1
    [ "$1" = crossbar ] && stick=$STICK
    CPU_STICK=$stick crossbar_cpu_yaml "$w" "$2" "${PORT[${1}_tls]}" "${PORT[${1}_tcp]}"
}
crossbar_yaml crossbar "$P_ADMIN" >"$W/crossbar.yaml"
crossbar_yaml base "$P_BASE_ADMIN" >"$W/crossbar-base.yaml"
{
    haproxy_head 2000 256
    haproxy_tls_listen t13 "${PORT[haproxy_tls]}" 2000 "${ADDRS[@]}"
    haproxy_tcp_listen tcp "${PORT[haproxy_tcp]}" 2000 "${ECHOS[@]}"
} >"$W/haproxy.cfg"
if [ "$PIN" = 1 ]; then sed -i '/^global$/a\    nbthread 1' "$W/haproxy.cfg"; fi
mkdir -p "$W/nginx"
{
    nginx_head "$W/nginx" "$([ "$PIN" = 1 ] && echo 1 || echo auto)" 4096 8192
    nginx_tls_server t13 "${PORT[nginx_tls]}" "${ADDRS[@]}"
    nginx_tcp_server tcp "${PORT[nginx_tcp]}" "${ECHOS[@]}"
    nginx_tail
} >"$W/nginx/nginx.conf"

"$XB" check -c "$W/crossbar.yaml" >/dev/null
env RUST_LOG=$LOGLEVEL "${XB_ENV[@]}" "${PROXY_CPU[@]}" "$XB" run -c "$W/crossbar.yaml" >"$W/crossbar.log" 2>&1 &
XB_PID=$!
PIDS+=("$XB_PID")
"${PROXY_CPU[@]}" haproxy -db -f "$W/haproxy.cfg" >"$W/haproxy.log" 2>&1 &
HA_PID=$!
PIDS+=("$HA_PID")
PROXIES=("crossbar:$XB_PID" "haproxy:$HA_PID")
if [ "$NGINX" = 1 ]; then
    nginx_cmd "$W/nginx"
    "${NGINX_CMD[@]}" -t -q
    "${PROXY_CPU[@]}" "${NGINX_CMD[@]}" >"$W/nginx.log" 2>&1 &
    NG_PID=$!
    PIDS+=("$NG_PID")
    PROXIES+=("nginx:$NG_PID")
fi
if [ -n "$BASE" ]; then
    RUST_LOG=$LOGLEVEL "${PROXY_CPU[@]}" "$BASE" run -c "$W/crossbar-base.yaml" >"$W/crossbar-base.log" 2>&1 &
    BASE_PID=$!
    PIDS+=("$BASE_PID")
    PROXIES=("base:$BASE_PID" "${PROXIES[@]}")
fi
if [ "$FLOOR" = 1 ]; then
    for engine in "${FLOORS[@]}"; do
        "${PROXY_CPU[@]}" bench/floor/target/release/floor --engine "$engine" \
            --route "127.0.0.1:${PORT[floor-${engine}_tls]}=$(IFS=,; echo "${ADDRS[*]}")" \
            --route "127.0.0.1:${PORT[floor-${engine}_tcp]}=$(IFS=,; echo "${ECHOS[*]}")" \
            >"$W/floor-$engine.log" 2>&1 &
        PIDS+=($!)
        PROXIES+=("floor-$engine:$!")
    done
fi
sleep 1.5
for t in "${PROXIES[@]}"; do
    kill -0 "${t#*:}" 2>/dev/null || { echo "${t%%:*} did not start (logs in $W)" >&2; exit 1; }
done

PAIRS=(crossbar/haproxy crossbar/nginx base/haproxy base/nginx crossbar/base
    floor-epoll/haproxy floor-uring/haproxy floor-tokio/haproxy nginx/haproxy
    floor-epoll-del/floor-epoll floor-uring/floor-epoll floor-tokio/floor-epoll-del
    crossbar/floor-tokio crossbar/floor-epoll)
FIGURES=(tls)
[ "$TCP" = 1 ] && FIGURES+=(tcp)
load() { # load FIGURE PORT SECONDS -> JSON line
    if [ "$1" = tcp ]; then
        "${LOAD_CPU[@]}" "$LG" connections --addr "127.0.0.1:$2" --mode tcp \
            --seconds "$3" --concurrency 16 --distinct-sources
    else
        "${LOAD_CPU[@]}" "$LG" connections --addr "127.0.0.1:$2" --ca "$W/ca.pem" --mode "$MODE" \
            --seconds "$3" --concurrency 16 --distinct-sources
    fi
}
# ticks PID: utime + stime of PID and of its children (nginx's workers).
ticks() {
    local p sum=0
    for p in $(tree_pids "$1"); do
        sum=$((sum + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)))
    done
    echo "$sum"
}
# pid_list PID: PID and its children, comma separated (for perf -p).
pid_list() { tree_pids "$1" | paste -sd,; }

for fig in "${FIGURES[@]}"; do # warm up all
    for t in "${PROXIES[@]}"; do load "$fig" "${PORT[${t%%:*}_$fig]}" 1 >/dev/null; done
done
PERF_US=() # PROXY.FIGURE=us of round 1, for bench/cpu-split.sh
declare -A RATIOS # "FIGURE OTHER" -> space-separated ratios of crossbar (or base) to OTHER
for r in $(seq "$ROUNDS"); do
    # Rotate the proxy order each round so no proxy always runs first or last.
    shift_by=$(((r - 1) % ${#PROXIES[@]}))
    order=("${PROXIES[@]:$shift_by}" "${PROXIES[@]:0:$shift_by}")
    for fig in "${FIGURES[@]}"; do
        declare -A US=()
        for t in "${order[@]}"; do
            IFS=: read -r name pid <<<"$t"
            port=${PORT[${name}_$fig]}
            tracer=
            if [ "$r" = 1 ] && [ "$STRACE" = 1 ]; then
                mapfile -t tp < <(tree_pids "$pid")
                strace -c -f "${tp[@]/#/-p}" -o "$W/$name.$fig.strace" &
                tracer=$!
                sleep 0.5
            fi
            if [ "$r" = 1 ] && [ "$PERF" = 1 ]; then
                perf record -q -F 2000 -g -p "$(pid_list "$pid")" -o "$W/$name.$fig.perf.data" -- sleep 3 \
                    >/dev/null 2>&1 &
                tracer=$!
            fi
            if [ "$r" = 1 ] && [ "$COUNT" = 1 ]; then
                perf stat -x, -o "$W/$name.$fig.counts" -p "$(pid_list "$pid")" \
                    -e probe_libc:malloc,probe_libc:calloc,probe_libc:realloc \
                    -e raw_syscalls:sys_enter,context-switches &
                tracer=$!
                sleep 0.5
            fi
            c0=$(ticks "$pid")
            out=$(load "$fig" "$port" "$SECS")
            c1=$(ticks "$pid")
            n=$(field conns <<<"$out") errs=$(field errors <<<"$out")
            if [ -n "$tracer" ]; then
                [ "$STRACE" = 1 ] || [ "$COUNT" = 1 ] && kill -INT "$tracer" 2>/dev/null
                wait "$tracer" 2>/dev/null || true
            fi
            US[$name]=$(awk -v a="$c0" -v b="$c1" -v t="$TCK" -v n="$n" \
                'BEGIN {printf "%.1f", (b - a) / t / n * 1e6}')
            echo "round $r $fig $name: $n connections ($errs errors), ${US[$name]} us CPU per connection"
            [ "$r" = 1 ] && PERF_US+=("$name.$fig=${US[$name]}")
            if [ "$r" = 1 ] && [ "$COUNT" = 1 ]; then
                awk -F, -v n="$n" -v who="$name $fig" '$3 ~ /probe_libc/ {a += $1}
                    $3 == "raw_syscalls:sys_enter" {s = $1} $3 == "context-switches" {c = $1}
                    END {printf "counts %s: %.2f allocator calls, %.2f syscalls, %.2f context switches per connection\n",
                        who, a / n, s / n, c / n}' "$W/$name.$fig.counts"
            fi
        done
        for pair in "${PAIRS[@]}"; do
            a=${pair%/*} b=${pair#*/}
            if [ -z "${US[$a]:-}" ] || [ -z "${US[$b]:-}" ]; then continue; fi
            ratio=$(awk -v a="${US[$a]}" -v b="${US[$b]}" 'BEGIN {printf "%.3f", a / b}')
            RATIOS[$fig $pair]="${RATIOS[$fig $pair]:-} $ratio"
            echo "round $r $fig $pair: $ratio"
        done
    done
done
for fig in "${FIGURES[@]}"; do
    for pair in "${PAIRS[@]}"; do
        [ -n "${RATIOS[$fig $pair]:-}" ] || continue
        # shellcheck disable=SC2086
        printf '%s\n' ${RATIOS[$fig $pair]} | sort -n |
            awk -v what="$fig $pair" '{v[NR] = $1} END {m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
                printf "median %s CPU per connection over %d rounds: %.3f (rounds %.3f-%.3f)\n", what, NR, m, v[1], v[NR]}'
    done
done
for t in "${PROXIES[@]}"; do
    case ${t%%:*} in crossbar | base) ;; *) continue ;; esac
    for task in /proc/"${t#*:}"/task/*; do
        awk -v tck="$TCK" -v comm="$(cat "$task/comm")" '{printf "%s=%.1f ", comm, ($14 + $15) / tck}' "$task/stat"
    done | sed "s/^/threads ${t%%:*} (CPU s): /"
    echo
done
# Where the CPU of the profiled round went (perf slows that round: shares, not totals).
if [ "$PERF" = 1 ]; then bench/cpu-split.sh "$W" "${PERF_US[@]}"; fi
