# Sourced by every bench/*.sh that starts processes: a work directory whose background processes are killed by PID
# on exit, bounded waits, per-process CPU and memory, the TLS backend sets
# compare.sh and confirm.sh measure, and the services conn-cpu.sh and syscalls.sh
# measure.

# bench_workdir PREFIX: make $WORK (/tmp/PREFIX.XXXXXX, kept for its logs) and kill
# every process `start` started, by PID, when the script exits.
bench_workdir() {
    WORK=$(mktemp -d "/tmp/$1.XXXXXX")
    PIDS=()
    trap bench_cleanup EXIT
    trap 'exit 130' INT TERM
}
bench_cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    echo "logs kept in $WORK" >&2
}

log() { echo "[$(date +%T)] $*" >&2; }

# build_release: crossbar and loadgen, release; sets $XB and $LG.
build_release() {
    log "building (release)"
    cargo build --release --quiet --bin crossbar --bin loadgen
    LG=$PWD/target/release/loadgen
    XB=$PWD/target/release/crossbar
}

# start NAME CMD...: run in the background, stdout to $WORK/NAME.out, stderr to
# $WORK/NAME.err; sets $LAST_PID.
start() {
    local name=$1
    shift
    "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
    LAST_PID=$!
    PIDS+=("$LAST_PID")
}
# stop_pid PID: kill one process `start` started and forget it.
stop_pid() {
    local keep=() p
    kill "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
    for p in "${PIDS[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
    PIDS=("${keep[@]}")
}
# wait_for FILE WORD: until WORD is a line of FILE (10 s at most).
wait_for() {
    local i
    for i in $(seq 100); do
        grep -qx "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "timed out waiting for $2 in $1" >&2
    cat "${1%.out}.err" >&2 || true
    return 1
}
# wait_port PORT [SECONDS]: until something accepts on 127.0.0.1:PORT (SECONDS at
# most, 10 by default).
wait_port() {
    local i
    for i in $(seq $((${2:-10} * 10))); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "nothing listens on port $1" >&2
    return 1
}

# field NAME: the value of NAME in the JSON object on stdin (a loadgen result line).
field() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read())[sys.argv[1]])' "$1"; }

# cpu_ticks PID: user + system CPU so far, in clock ticks ($TCK a second).
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# rss_kib PID: resident memory now.
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
TCK=$(getconf CLK_TCK)

# start_tls_set SET LOADGEN-ARGS...: three TLS backends (`loadgen backends --kind
# tls`) named SET-0..2, their CA in $WORK/SET.ca.pem; their addresses, space
# separated, into SET_ADDRS[SET] (an associative array the caller declares).
start_tls_set() {
    local set=$1
    shift
    start "$set" "$LG" backends --kind tls --count 3 "$@" \
        --ca-out "$WORK/$set.ca.pem" --name-prefix "$set-" --no-stdin
    wait_for "$WORK/$set.out" READY
    SET_ADDRS[$set]=$(grep -v READY "$WORK/$set.out" | tr '\n' ' ')
}

# crossbar_backends SET: the `backends:` entries of a crossbar service over SET's
# backends (names as on the backends themselves: SET-0, SET-1, ...).
crossbar_backends() {
    local i=0 a
    for a in ${SET_ADDRS[$1]}; do
        echo "      - { name: $1-$i, address: \"$a\" }"
        i=$((i + 1))
    done
}

# crossbar_cpu_yaml WORKERS ADMIN_PORT TLS_PORT TCP_PORT: a whole crossbar config
# for bench/conn-cpu.sh, bench/syscalls.sh and bench/callgrind.sh: `workers` (left
# out when WORKERS is empty), the admin API, no health checks, and the services of
# crossbar_cpu_services.
crossbar_cpu_yaml() {
    [ -n "$1" ] && echo "workers: $1"
    echo "admin: { listen: \"127.0.0.1:$2\" }"
    echo "defaults: { health: { check: none } }"
    crossbar_cpu_services "$3" "$4"
}

# crossbar_cpu_services TLS_PORT TCP_PORT: the `services:` of a crossbar under
# bench/conn-cpu.sh and bench/syscalls.sh: `t13` (mode tls, `stick: {}` unless
# CPU_STICK=0) over the TLS backends in $ADDRS, `tcp` (mode tcp) over the echo
# servers in $ECHOS.
crossbar_cpu_services() {
    local i
    echo "services:"
    echo "  t13:"
    echo "    listen: [\"127.0.0.1:$1\"]"
    echo "    mode: tls"
    [ "${CPU_STICK:-1}" = 0 ] || echo "    stick: {}"
    echo "    backends:"
    for i in "${!ADDRS[@]}"; do echo "      - { name: b$i, address: \"${ADDRS[$i]}\" }"; done
    echo "  tcp:"
    echo "    listen: [\"127.0.0.1:$2\"]"
    echo "    mode: tcp"
    echo "    backends:"
    for i in "${!ECHOS[@]}"; do echo "      - { name: e$i, address: \"${ECHOS[$i]}\" }"; done
}
