#!/usr/bin/env bash
# System calls per connection, by name: crossbar (`workers: 1`) against HAProxy
# (`nbthread 1`), for TLS 1.3 full handshakes through a `mode: tls` service and plain
# TCP connections (64 bytes echoed) through a `mode: tcp` service, the same backends
# and configurations as bench/conn-cpu.sh.
#
# One client at a time (`loadgen connections --concurrency 1`), so each connection's
# sequence is the whole story (with more clients, epoll_wait and accept4's EAGAIN are
# shared between connections). Counted with `strace -c -f` attached to the proxy for
# the run; a table per proxy and figure, each call divided by the connections made.
# strace slows the proxy many times: counts only, never a CPU figure.
#
#   bench/syscalls.sh [--seconds S] [--base BIN]...
#
# --base BIN: also count the crossbar binary BIN (e.g. main's build), same config;
#             may be given more than once.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/haproxy-tls.sh
source bench/haproxy-tls.sh
# shellcheck source=bench/lib.sh
source bench/lib.sh

SECS=2 BASES=()
while [ $# -gt 0 ]; do
    case $1 in
        --seconds) SECS=$2; shift ;;
        --base) BASES+=("$2"); shift ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
command -v haproxy >/dev/null || { echo "haproxy is needed (apt-get install haproxy)" >&2; exit 1; }
command -v strace >/dev/null || { echo "strace is needed (apt-get install strace)" >&2; exit 1; }
bench_workdir crossbar-syscalls
build_release

start backends "$LG" backends --kind tls --count 3 --tls13 --tickets --ca-out "$WORK/ca.pem" \
    --name-prefix b- --no-stdin
PIDS+=("$LAST_PID")
start echo "$LG" backends --kind echo --count 3 --no-stdin
PIDS+=("$LAST_PID")
for f in backends echo; do
    for _ in $(seq 100); do grep -q READY "$WORK/$f.out" 2>/dev/null && break; sleep 0.1; done
done
mapfile -t ADDRS < <(grep -v READY "$WORK/backends.out")
mapfile -t ECHOS < <(grep -v READY "$WORK/echo.out")

TARGETS=(crossbar) BINS=("$XB")
for i in "${!BASES[@]}"; do TARGETS+=("base$i"); BINS+=("${BASES[$i]}"); done
declare -A PORT
for t in "${TARGETS[@]}" haproxy; do
    PORT[${t}_tls]=$("$LG" freeport) PORT[${t}_tcp]=$("$LG" freeport)
done

declare -A PID
for i in "${!TARGETS[@]}"; do
    t=${TARGETS[$i]}
    crossbar_cpu_yaml 1 "$("$LG" freeport)" "${PORT[${t}_tls]}" "${PORT[${t}_tcp]}" \
        >"$WORK/$t.yaml"
    RUST_LOG=warn start "$t" "${BINS[$i]}" run -c "$WORK/$t.yaml"
    PIDS+=("$LAST_PID")
    PID[$t]=$LAST_PID
done
{
    haproxy_head 2000 256
    haproxy_tls_listen t13 "${PORT[haproxy_tls]}" 2000 "${ADDRS[@]}"
    haproxy_tcp_listen tcp "${PORT[haproxy_tcp]}" 2000 "${ECHOS[@]}"
} >"$WORK/haproxy.cfg"
# `nbthread` belongs to `global`, which haproxy_head opens.
sed -i '/^global$/a\    nbthread 1' "$WORK/haproxy.cfg"
start haproxy haproxy -db -f "$WORK/haproxy.cfg"
PIDS+=("$LAST_PID")
PID[haproxy]=$LAST_PID
sleep 1.5

load() { # load FIGURE PORT SECONDS -> JSON line
    local extra=(--mode tcp)
    [ "$1" = tls ] && extra=(--ca "$WORK/ca.pem" --mode full)
    "$LG" connections --addr "127.0.0.1:$2" "${extra[@]}" --seconds "$3" --concurrency 1
}
for fig in tls tcp; do
    for t in "${TARGETS[@]}" haproxy; do
        load "$fig" "${PORT[${t}_$fig]}" 0.5 >/dev/null # warm up
        strace -c -f -p "${PID[$t]}" -o "$WORK/$t.$fig.strace" &
        tracer=$!
        sleep 0.5
        n=$(load "$fig" "${PORT[${t}_$fig]}" "$SECS" | field conns)
        kill -INT "$tracer"
        wait "$tracer" || true
        # strace -c: "% time, seconds, usecs/call, calls, [errors,] syscall"
        awk -v n="$n" -v who="$t $fig" '
            $1 ~ /^[0-9.]+$/ && NF >= 5 {c[$NF] = $4; if (NF == 6) e[$NF] = $5}
            END {
                for (s in c) if (s != "epoll_wait" && s != "total") all += c[s]
                printf "%s: %d connections, %.2f syscalls per connection besides epoll_wait (epoll_wait %.2f)\n",
                    who, n, all / n, c["epoll_wait"] / n
                for (s in c) if (s != "total" && c[s] / n >= 0.05)
                    printf "  %-16s %6.2f%s\n", s, c[s] / n, (e[s] ? sprintf("  (%.2f failed)", e[s] / n) : "")
            }' "$WORK/$t.$fig.strace" | { IFS= read -r head; echo "$head"; sort -k2,2nr; }
    done
done
