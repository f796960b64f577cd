#!/usr/bin/env bash
# Anycast with BGP, proven in network namespaces (docs/ha.md "Anycast with BGP";
# issue 54). Root; CI runs it from .ci/run. Installs what it needs from Debian
# (bird2, iproute2, openssl, curl, python3), then builds:
#
#   client 198.51.100.10 --- router --- node1 10.55.1.2   crossbar + BIRD 2 + crossbar-anycast
#                              |    --- node2 10.55.2.2   (VIP 203.0.113.100 on lo)
#                              |    --- node3 10.55.3.2
#                              +------- backends 10.55.100.10-12: echo servers (flows.py)
#                                       and openssl s_server, each its own ticket key
#
# The router runs BIRD 2 (packaging/anycast/bird-router.conf) with a BGP session to
# every node's BIRD (bird-node.conf); each node's crossbar-anycast announces the VIP
# only while crossbar's /healthz passes. The router spreads flows by ECMP hashing on
# ports: first a plain multipath route (what BIRD installs), then a resilient
# next-hop group (packaging/anycast/crossbar-anycast-router). For each it measures,
# with 40 long-lived flows exchanging 16 bytes every 100 ms:
#   join   a third node starts announcing: flows reset (resilient: must be 0);
#   crash  a node's crossbar, BIRD and watcher are killed (-9): flows reset
#          (resilient: only the crashed node's own);
#   leave  `crossbar-anycast` gets SIGTERM (what `systemctl stop crossbar` does
#          first): it announces GRACEFUL_SHUTDOWN, waits for crossbar's connections
#          to end, withdraws, then crossbar gets SIGTERM (resilient: 0 of the other
#          nodes' flows reset; the leaving node's own flows keep working after the
#          drain began and finish cleanly before its crossbar stops).
# Then, with the resilient group and three nodes: >= 99 % of TLS 1.3 resumptions land
# on the backend that holds the session (the backend's own -www page says which
# backend answered and that it resumed), whichever node carries them; a node whose
# backends are all unreachable withdraws (admin.healthz_needs_backends); flapping
# health is damped by HOLD; BIRD stopped, or running without the VIP's protocols:
# crossbar keeps serving and the watcher says the VIP is not announced, and why; it
# is announced again once a right BIRD is back; a watcher that restarts alone adopts
# the announcement instead of withdrawing the node.
#
# Prints PASS/FAIL lines and the figures (docs/ha.md quotes them), ends with
# "N passed, M failed"; exit 1 on any failure. A missing tool is a failure.
#
#   CROSSBAR_BIN=target/debug/crossbar tests/anycast/run.sh
#   NO_INSTALL=1   fail instead of apt-get installing the tools
#   INSTALL_ONLY=1 install them, then exit (.ci/run, before this runs beside other tests)
#   KEEP=1         keep the work directory (logs of every process)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
BIN=$(realpath -m "${CROSSBAR_BIN:-target/debug/crossbar}")
PKG=$ROOT/packaging/anycast
FLOWS_PY=$ROOT/tests/anycast/flows.py
PKGS=(bird2 iproute2 openssl curl python3)

VIP=203.0.113.100
NODES=(1 2 3)
ECHO_PORT=7000
TLS_PORT=8443
SNI=puppet.example.com
FLOWS=40            # long-lived flows per scenario (the issue's figure)
TLS_CLIENTS=10      # TLS 1.3 sessions ...
TLS_ROUNDS=10       # ... each resumed this many times through the VIP
TARGET_PCT=99       # resumptions that must land on their own backend
HOLD=6              # the watcher's hold-down in the lab (default 10 s)
DRAIN_MAX=8         # the watcher's drain limit in the lab (default 300 s)
WAIT=30             # bound of every wait on the lab (seconds; not a threshold)
DEADLINE=600        # the whole run, at most (seconds)

T0=$(date +%s)
PASSED=0
FAILED=0
log() { printf '[%4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*" >&2; }
pass() { PASSED=$((PASSED + 1)); echo "PASS $1: $2"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL $1: $2"; }
check() { if [ "$2" = 1 ]; then pass "$1" "$3"; else fail "$1" "$3"; fi; }
figure() { echo "FIGURE $*"; }
finish() {
    echo "$PASSED passed, $FAILED failed ($(( $(date +%s) - T0 )) s)"
    [ "$FAILED" = 0 ] && exit 0
    exit 1
}
die() { fail setup "$*"; finish; }

# ------------------------------------------------------------------ tools
[ "$(id -u)" = 0 ] || die "needs root (network namespaces, apt-get)"
missing=()
for p in "${PKGS[@]}"; do
    [ "$(dpkg-query -W -f '${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    [ "${NO_INSTALL:-0}" = 1 ] && die "not installed: ${missing[*]}"
    log "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 ||
        { apt-get -o DPkg::Lock::Timeout=600 update >/dev/null 2>&1 &&
          apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1; } ||
        die "apt-get install ${missing[*]} failed"
fi
if [ "${INSTALL_ONLY:-0}" = 1 ]; then
    echo "tests/anycast/run.sh: the tools are installed (INSTALL_ONLY=1)"
    exit 0
fi
for t in bird birdc ip openssl curl /usr/bin/python3 "$BIN"; do
    command -v "$t" >/dev/null || die "missing $t"
done
unshare -n true 2>/dev/null || die "cannot create network namespaces"
ip nexthop show >/dev/null 2>&1 || die "this kernel has no nexthop objects (ip nexthop; Linux >= 5.3, resilient groups >= 5.13)"

# ------------------------------------------------------------------ the lab
P=cbac$$                      # namespace prefix: cbac<pid>-<host> (tests/ha.rs uses cbha)
NS_R=$P-r NS_C=$P-c NS_BE=$P-be
ns() { echo "$P-n$1"; }
W=$(mktemp -d /tmp/crossbar-anycast.XXXXXX)
PIDS=()                       # every process this script started in the lab

# Namespaces of an earlier run that was killed (its PID is gone): kill what runs in
# them and delete them. A run still going (its PID alive) is left alone.
for f in /run/netns/cbac*; do
    [ -e "$f" ] || continue
    name=${f##*/}
    owner=${name#cbac}; owner=${owner%%-*}
    [[ $owner =~ ^[0-9]+$ ]] || continue
    [ -d "/proc/$owner" ] && continue
    for pid in $(ip netns pids "$name" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns del "$name" 2>/dev/null && log "removed $name (left by a killed run)"
done

cleanup() {
    local pid n
    kill -TERM "$WATCHDOG" 2>/dev/null
    for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null; done
    for n in "$NS_R" "$NS_C" "$NS_BE" "$(ns 1)" "$(ns 2)" "$(ns 3)"; do
        [ -e "/run/netns/$n" ] || continue
        for pid in $(ip netns pids "$n" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
        ip netns del "$n" 2>/dev/null
    done
    if [ "${KEEP:-0}" = 1 ]; then log "kept $W"; else rm -rf "$W"; fi
}
trap cleanup EXIT
# bash reports every lab process it SIGKILLs ("line N: PID Killed ..."): not news here.
exec 2> >(grep --line-buffered -v ': line [0-9]*: *[0-9]* Killed ' >&2)
trap 'fail signal "interrupted"; finish' INT TERM
# The whole run is bounded: past DEADLINE the lab is torn down and the run fails.
( trap 'kill "$s" 2>/dev/null; exit 0' TERM; sleep "$DEADLINE" & s=$!; wait "$s" && kill -TERM $$ 2>/dev/null ) &
WATCHDOG=$!

in_ns() { local n=$1; shift; ip netns exec "$n" "$@"; }
sysctl_in() { in_ns "$1" sh -c "echo $3 > /proc/sys/${2//.//}"; }

# spawn NAME NS CMD...: start a process in a namespace, its output in $W/NAME.log;
# its PID in $SPAWNED and in PIDS.
spawn() {
    local name=$1 n=$2; shift 2
    ip netns exec "$n" "$@" >"$W/$name.log" 2>&1 &
    SPAWNED=$!
    PIDS+=("$SPAWNED")
}

# wait_for WHAT LIMIT CMD...: poll CMD every 0.2 s until it succeeds; fails after LIMIT s.
wait_for() {
    local what=$1 limit=$2 end; shift 2
    end=$(( $(date +%s%N) + limit * 1000000000 ))
    until "$@" 2>/dev/null; do
        if [ "$(date +%s%N)" -gt "$end" ]; then
            log "timed out ($limit s): $what"
            return 1
        fi
        sleep 0.2
    done
}
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
alive() { kill -0 "$1" 2>/dev/null; }

build_lab() {
    local i
    for n in "$NS_R" "$NS_C" "$NS_BE" "$(ns 1)" "$(ns 2)" "$(ns 3)"; do
        ip netns add "$n" || return 1
        ip -n "$n" link set lo up
    done
    sysctl_in "$NS_R" net.ipv4.ip_forward 1
    # Hash on ports too: one client address spreads its flows over the nodes.
    sysctl_in "$NS_R" net.ipv4.fib_multipath_hash_policy 1
    ip -n "$NS_R" link add cli type veth peer name eth0 netns "$NS_C"
    ip -n "$NS_R" addr add 198.51.100.1/24 dev cli
    ip -n "$NS_C" addr add 198.51.100.10/24 dev eth0
    ip -n "$NS_R" link add be type veth peer name eth0 netns "$NS_BE"
    ip -n "$NS_R" addr add 10.55.100.1/24 dev be
    for i in 0 1 2; do ip -n "$NS_BE" addr add "10.55.100.1$i/24" dev eth0; done
    for i in "${NODES[@]}"; do
        ip -n "$NS_R" link add "n$i" type veth peer name eth0 netns "$(ns "$i")"
        ip -n "$NS_R" addr add "10.55.$i.1/24" dev "n$i"
        ip -n "$(ns "$i")" addr add "10.55.$i.2/24" dev eth0
        ip -n "$(ns "$i")" addr add "$VIP/32" dev lo
        ip -n "$NS_R" link set "n$i" up
        ip -n "$(ns "$i")" link set eth0 up
        ip -n "$(ns "$i")" route add default via "10.55.$i.1"
    done
    ip -n "$NS_R" link set cli up
    ip -n "$NS_R" link set be up
    ip -n "$NS_C" link set eth0 up
    ip -n "$NS_BE" link set eth0 up
    ip -n "$NS_C" route add default via 198.51.100.1
    ip -n "$NS_BE" route add default via 10.55.100.1
}

crossbar_yaml() {
    echo 'admin: { listen: "127.0.0.1:9140", healthz_needs_backends: true }'
    echo 'defaults:'
    echo '  health: { check: tcp, interval: 1s, timeout: 500ms, rise: 1, fall: 2 }'
    echo '  timeouts: { shutdown: 10s }'
    echo 'services:'
    echo '  echo:'
    echo '    mode: tcp'
    echo "    listen: [\"0.0.0.0:$ECHO_PORT\"]"
    echo '    balance: roundrobin'
    echo '    backends:'
    for i in 0 1 2; do echo "      - { name: be$i, address: \"10.55.100.1$i:$ECHO_PORT\" }"; done
    echo '  tls13:'
    echo "    listen: [\"0.0.0.0:$TLS_PORT\"]"
    echo '    balance: roundrobin'
    echo '    stick: { on: [session_id, ticket, psk], probe_interval: 2s }'
    echo '    backends:'
    for i in 0 1 2; do echo "      - { name: be$i, address: \"10.55.100.1$i:$TLS_PORT\" }"; done
}

# BIRD configs: the shipped examples, with this lab's log target and short BGP
# restart timers (a node that comes back is taken again within seconds instead of
# BIRD's default error wait of 60 s).
TIMERS='connect delay time 1; connect retry time 2; error wait time 1, 3;'
node_bird_conf() {
    sed -e "s/10\.55\.1\./10.55.$1./g" -e "s/^router id /log stderr all;\nrouter id /" \
        -e "s/keepalive time 1;/keepalive time 1; $TIMERS/" "$PKG/bird-node.conf"
}
router_bird_conf() {
    sed -e "s/^router id /log stderr all;\nrouter id /" \
        -e "s/keepalive time 1;/keepalive time 1; $TIMERS/" "$PKG/bird-router.conf"
}

declare -A CB BIRD WATCH          # node -> PID
birdc_n() { birdc -s "$W/bird-n$1.ctl" "${@:2}"; }
healthz() { in_ns "$(ns "$1")" curl -s -m 1 -o /dev/null -w '%{http_code}' http://127.0.0.1:9140/healthz; }
healthy() { [ "$(healthz "$1")" = 200 ]; }
unhealthy() { ! healthy "$1"; }
bird_up() { birdc_n "$1" show status 2>/dev/null | grep -q "Daemon is up"; }
start_crossbar() {
    spawn "crossbar-n$1-$(date +%s%N)" "$(ns "$1")" "$BIN" run -c "$W/crossbar.yaml"
    CB[$1]=$SPAWNED
    wait_for "crossbar on node $1 healthy" "$WAIT" healthy "$1"
}
start_bird() {
    node_bird_conf "$1" > "$W/bird-n$1.conf"
    spawn "bird-n$1-$(date +%s%N)" "$(ns "$1")" bird -f -c "$W/bird-n$1.conf" \
        -s "$W/bird-n$1.ctl" -P "$W/bird-n$1.pid"
    BIRD[$1]=$SPAWNED
    wait_for "BIRD on node $1" "$WAIT" bird_up "$1"
}
start_watcher() {
    WATCH_LOG[$1]="watch-n$1-$(date +%s%N)"
    spawn "${WATCH_LOG[$1]}" "$(ns "$1")" env VIP="$VIP" HOLD="$HOLD" DRAIN_MAX="$DRAIN_MAX" \
        ROUTER_WAIT=1 BIRDC="birdc -s $W/bird-n$1.ctl" "$PKG/crossbar-anycast"
    WATCH[$1]=$SPAWNED
}
declare -A WATCH_LOG
watch_log() { cat "$W/${WATCH_LOG[$1]}.log"; }

# The router's ECMP set for the VIP, e.g. "n1 n2 n3:drain" (resilient: from the
# group's weights; plain: the multipath route in table 100).
MODE=plain
members() {
    local out
    if [ "$MODE" = plain ]; then
        ip -n "$NS_R" -4 route show table 100 "$VIP/32" | grep -o 'via 10\.55\.[0-9]*\.2' |
            sed 's/via 10\.55\.\([0-9]*\)\.2/n\1/' | sort | tr '\n' ' ' | sed 's/ $//'
    else
        out=$(ip -n "$NS_R" nexthop show id 100 2>/dev/null) || return 0
        grep -o 'group [0-9,/]*' <<<"$out" | cut -d' ' -f2 | tr '/' '\n' |
            awk -F, '{ n = int(($1 - 10000) / 256); w = ($2 == "" ? 1 : $2);
                       printf "n%d%s\n", n, (w == 1 ? ":drain" : "") }' | sort | tr '\n' ' ' | sed 's/ $//'
    fi
}
members_are() { [ "$(members)" = "$1" ]; }
# Node $1 in the set: taking new flows (active), draining, or either (present).
active() { members | tr ' ' '\n' | grep -qx "n$1"; }
draining() { members | tr ' ' '\n' | grep -qx "n$1:drain"; }
present() { members | tr ' ' '\n' | grep -q "^n$1\(:drain\)\?$"; }
absent() { ! present "$1"; }
gone() { ! kill -0 "$1" 2>/dev/null; }
# Buckets of the resilient group held by node $1.
buckets_of() { ip -n "$NS_R" nexthop bucket show id 100 nhid $((10000 + $1 * 256 + 2)) 2>/dev/null | wc -l; }
has_buckets() { [ "$(buckets_of "$1")" -gt 0 ]; }

# ------------------------------------------------------------------ flows
# flows_start NAME: FLOWS long-lived flows through the VIP (flows.py).
flows_start() {
    local d=$W/flows-$1
    mkdir -p "$d"
    spawn "flows-$1" "$NS_C" /usr/bin/python3 "$FLOWS_PY" flows "$VIP" "$ECHO_PORT" "$FLOWS" "$d"
    FLOWS_PID=$SPAWNED
    wait_for "$FLOWS flows connected ($1)" "$WAIT" test -e "$d/ready" || return 1
    log "flows $1: $(awk '{ print $2 }' "$d/ready" | sort | uniq -c | awk '{ printf "%s on %s; ", $1, $2 }')"
}
flows_ctl() { touch "$W/flows-$1/$2"; wait_for "flows $1: $2" "$WAIT" test -e "$W/flows-$1/$2.done"; }
flows_stop() {
    touch "$W/flows-$1/stop"
    wait_for "flows $1 stopped" "$WAIT" test -e "$W/flows-$1/result"
    wait "$FLOWS_PID" 2>/dev/null
}
# resets NAME [NODE_IP] [not]: flows reset (of those on NODE_IP, or on any other node).
resets() {
    awk -v node="${2:-}" -v neg="${3:-}" '
        node == "" || (neg == "" && $2 == node) || (neg != "" && $2 != node) { if ($3 == "reset") r++ }
        END { print r + 0 }' "$W/flows-$1/result"
}
count_on() { awk -v node="$2" -v neg="${3:-}" '(neg == "" && $2 == node) || (neg != "" && $2 != node) { n++ } END { print n + 0 }' "$W/flows-$1/result"; }
nodeip() { echo "10.55.$1.2"; }

# New short connections through the VIP: how many of N land on node $1.
new_on() {
    local n=$2 k hits=0 line
    for ((k = 0; k < n; k++)); do
        line=$(in_ns "$NS_C" timeout 5 bash -c "exec 3<>/dev/tcp/$VIP/$ECHO_PORT && head -1 <&3" 2>/dev/null)
        [ "${line#* }" = "$(nodeip "$1")" ] && hits=$((hits + 1))
    done
    echo "$hits"
}

# ------------------------------------------------------------------ scenarios
# join MODE J: J's crossbar and BIRD run, its watcher starts: the router adds it.
scenario_join() {
    local mode=$1 j=$2 name="$1-join" before after r
    before=$(members)
    flows_start "$name" || { fail "$name" "flows did not start"; return; }
    start_watcher "$j"
    wait_for "node $j announced ($mode)" "$((HOLD + WAIT))" active "$j" ||
        { fail "$name" "node $j was never announced: $(watch_log "$j" | tail -3)"; flows_stop "$name"; return; }
    after=$(members)
    if [ "$mode" = resilient ]; then
        # Idle buckets move to the new node after idle_timer; busy ones stay.
        wait_for "node $j gets buckets" "$WAIT" has_buckets "$j"
    fi
    flows_ctl "$name" mark-joined
    local newcomers; newcomers=$(new_on "$j" 20)
    flows_stop "$name"
    r=$(resets "$name")
    figure "$mode join: router [$before] -> [$after]; $r/$FLOWS established flows reset; $newcomers/20 new connections on node $j; buckets on node $j: $([ "$mode" = resilient ] && buckets_of "$j" || echo -)"
    if [ "$mode" = resilient ]; then
        check "$name" "$([ "$r" = 0 ] && echo 1)" "$r/$FLOWS flows reset when node $j joined (must be 0)"
    fi
    check "$name-serves" "$([ "$newcomers" -gt 0 ] && echo 1)" "$newcomers/20 new connections reached the joining node $j"
}

# crash MODE C: kill -9 of C's crossbar, BIRD and watcher (the node dies).
scenario_crash() {
    local mode=$1 c=$2 name="$1-crash" before after own other
    before=$(members)
    flows_start "$name" || { fail "$name" "flows did not start"; return; }
    kill -9 "${CB[$c]}" "${BIRD[$c]}" "${WATCH[$c]}" 2>/dev/null
    local t0; t0=$(now_ms)
    wait_for "node $c gone from the router" "$WAIT" absent "$c" ||
        fail "$name" "the router kept node $c"
    local gone=$(( $(now_ms) - t0 ))
    after=$(members)
    flows_ctl "$name" mark-crashed
    flows_stop "$name"
    own=$(resets "$name" "$(nodeip "$c")")
    other=$(resets "$name" "$(nodeip "$c")" not)
    figure "$mode crash of node $c: router [$before] -> [$after] after ${gone} ms; reset: $own/$(count_on "$name" "$(nodeip "$c")") of its own flows, $other/$(count_on "$name" "$(nodeip "$c")" not) of the other nodes' ($((own + other))/$FLOWS)"
    if [ "$mode" = resilient ]; then
        check "$name" "$([ "$other" = 0 ] && echo 1)" "crash of node $c reset $other of the other nodes' flows (must be 0) and $own of its own"
    fi
    wait "${CB[$c]}" "${BIRD[$c]}" "${WATCH[$c]}" 2>/dev/null
}

# leave MODE L: graceful stop of L (watcher SIGTERM first, then crossbar SIGTERM).
scenario_leave() {
    local mode=$1 l=$2 name="$1-leave" before during after own other closed t0 rc
    local ip; ip=$(nodeip "$l")
    before=$(members)
    flows_start "$name" || { fail "$name" "flows did not start"; return; }
    local mine; mine=$(awk -v n="$ip" '$2 == n' "$W/flows-$name/ready" | wc -l)
    t0=$(now_ms)
    kill -TERM "${WATCH[$l]}"
    if [ "$mode" = resilient ]; then
        wait_for "node $l draining" "$WAIT" draining "$l" ||
            fail "$name" "node $l never showed as draining: [$(members)]"
    else
        wait_for "node $l out of the ECMP route" "$WAIT" absent "$l" ||
            fail "$name" "node $l stayed in the route: [$(members)]"
    fi
    during=$(members)
    local drained_ms=$(( $(now_ms) - t0 ))
    # Every flow that still works does 5 more rounds, now that the drain began.
    flows_ctl "$name" mark-draining
    local newcomers; newcomers=$(new_on "$l" 20)
    # The leaving node's own flows end (their clients are done): clean closes.
    flows_ctl "$name" "close-$ip"
    local cb_alive_when_closed=0
    alive "${CB[$l]}" && cb_alive_when_closed=1
    wait_for "watcher on node $l exits" "$((DRAIN_MAX + WAIT))" gone "${WATCH[$l]}"
    local watcher_ms=$(( $(now_ms) - t0 ))
    after=$(members)
    kill -TERM "${CB[$l]}"
    wait_for "crossbar on node $l exits" "$WAIT" gone "${CB[$l]}"
    wait "${CB[$l]}"; rc=$?
    local total_ms=$(( $(now_ms) - t0 ))
    flows_stop "$name"
    own=$(resets "$name" "$ip")
    other=$(resets "$name" "$ip" not)
    closed=$(awk -v n="$ip" '$2 == n && $3 == "closed"' "$W/flows-$name/result" | wc -l)
    figure "$mode graceful leave of node $l: router [$before] -> [$during] after ${drained_ms} ms -> [$after]; watcher done after ${watcher_ms} ms, crossbar exited $rc after ${total_ms} ms; reset: $other/$((FLOWS - mine)) of the other nodes' flows, $own/$mine of its own; its own closed cleanly: $closed/$mine; new connections on it while draining: $newcomers/20"
    watch_log "$l" | sed 's/^/    watcher: /' | tail -5
    if [ "$mode" = resilient ]; then
        check "$name-others" "$([ "$other" = 0 ] && echo 1)" "graceful leave of node $l reset $other of the other nodes' flows (must be 0)"
        check "$name-own" "$([ "$closed" = "$mine" ] && [ "$mine" -gt 0 ] && [ "$cb_alive_when_closed" = 1 ] && echo 1)" \
            "$closed/$mine of node $l's own flows kept working after the drain began and finished cleanly while its crossbar still ran"
        check "$name-order" "$([ "$rc" = 0 ] && absent "$l" &&
            watch_log "$l" | grep -q 'GRACEFUL_SHUTDOWN' && watch_log "$l" | grep -q 'withdrawn' && echo 1)" \
            "drain announced, then the VIP withdrawn, then crossbar stopped (exit $rc); router now [$(members)]"
    fi
}

# A node (back) with crossbar, BIRD (unless it still runs) and, unless $2 = no, its
# watcher; waits for it to be in the router's set.
node_up() {
    start_crossbar "$1" || return 1
    bird_up "$1" || start_bird "$1" || return 1   # BIRD stays up when crossbar stops
    [ "${2:-}" = no ] && return 0
    start_watcher "$1"
    wait_for "node $1 announced" "$((HOLD + WAIT))" active "$1"
}

# ------------------------------------------------------------------ run
log "work directory $W; namespaces $P-*"
build_lab || die "building the namespaces failed"
crossbar_yaml > "$W/crossbar.yaml"
"$BIN" check -c "$W/crossbar.yaml" >"$W/check.log" 2>&1 || die "crossbar check: $(cat "$W/check.log")"

# Backends: tagged echo servers and openssl s_server -www (each its own process,
# session cache and ticket key; -context names the backend on its own status page).
for i in 0 1 2; do
    spawn "echo-be$i" "$NS_BE" /usr/bin/python3 "$FLOWS_PY" echo "10.55.100.1$i" "$ECHO_PORT" "be$i"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
        -subj "/CN=be$i" -addext "subjectAltName=DNS:$SNI" \
        -keyout "$W/be$i.key" -out "$W/be$i.crt" >/dev/null 2>&1 || die "openssl req"
    spawn "s_server-be$i" "$NS_BE" openssl s_server -accept "10.55.100.1$i:$TLS_PORT" -www \
        -context "be$i" -cert "$W/be$i.crt" -key "$W/be$i.key"
done

router_bird_conf > "$W/bird-r.conf"
spawn bird-r "$NS_R" bird -f -c "$W/bird-r.conf" -s "$W/bird-r.ctl" -P "$W/bird-r.pid"
wait_for "router BIRD" "$WAIT" bash -c "birdc -s $W/bird-r.ctl show status | grep -q 'Daemon is up'" ||
    die "the router's BIRD did not start: $(tail -5 "$W/bird-r.log")"
ip -n "$NS_R" rule add to "$VIP/32" lookup 100 pref 100

# ---- plain ECMP: BIRD's multipath route
# Node 1 is the one that joins, crashes and leaves (first in the router's next-hop
# order: with plain ECMP's hash-threshold the first and the last cost the others
# flows, the middle one does not; resilient groups don't care).
MODE=plain
for i in 2 3; do node_up "$i" || die "node $i did not come up: $(tail -3 "$W"/*n$i*.log)"; done
node_up 1 no || die "node 1 did not start"
wait_for "router ECMP over nodes 2 3" "$WAIT" members_are "n2 n3" || die "router has [$(members)]"
pass setup "3 nodes, BGP to the router, VIP announced by nodes 2 and 3 (plain ECMP: [$(members)])"
scenario_join plain 1
scenario_crash plain 1
node_up 1 || die "node 1 did not come back"
scenario_leave plain 1

# ---- resilient next-hop group, built by crossbar-anycast-router from BIRD's paths
MODE=resilient
# IDLE_TIMER 8 s (default 120): the lab's flows send every 0.1 s (80 times that leaves
# room for a client starved on a busy machine), and a joining node gets its idle
# buckets within the run.
spawn router-sync "$NS_R" env VIP="$VIP" BIRDC="birdc -s $W/bird-r.ctl" IDLE_TIMER=8 "$PKG/crossbar-anycast-router"
wait_for "resilient group over nodes 2 3" "$WAIT" members_are "n2 n3" || die "group has [$(members)]: $(tail -3 "$W/router-sync.log")"
ip -n "$NS_R" rule del to "$VIP/32" lookup 100 pref 100
node_up 1 no || die "node 1 did not come back"
scenario_join resilient 1
scenario_crash resilient 1
node_up 1 || die "node 1 did not come back"
scenario_leave resilient 1
node_up 1 || die "node 1 did not come back"
wait_for "three nodes in the group" "$WAIT" members_are "n1 n2 n3" || fail group "router has [$(members)]"

# ---- TLS 1.3 resumptions through the VIP, whichever node carries them
prefixes() { in_ns "$(ns "$1")" curl -fsS -m 2 http://127.0.0.1:9140/api/tables/tls13 | grep -o '"ticket_prefix"' | wc -l; }
knows_keys() { [ "$(prefixes "$1")" -ge 3 ]; }
for i in "${NODES[@]}"; do
    wait_for "node $i learns the key names" "$WAIT" knows_keys "$i" || fail tls13-keys "node $i never learned the backends' key names"
done
resumed_on() { # node -> resumed handshakes it relayed so far (tls13)
    in_ns "$(ns "$1")" curl -fsS -m 2 http://127.0.0.1:9140/metrics |
        awk '/^crossbar_tls_handshakes_total\{/ && /service="tls13"/ && /kind="resumed"/ { n += $NF } END { print n + 0 }'
}
# One s_client through the VIP; prints "<New|Reused> <backend>" as the backend's
# own status page (s_server -www) says: its session context is its name.
tls_once() {
    local out page how ctx
    out=$(printf 'GET / HTTP/1.0\r\n\r\n' | in_ns "$NS_C" timeout 15 openssl s_client -connect "$VIP:$TLS_PORT" \
        -servername "$SNI" -tls1_3 -ign_eof "$@" 2>/dev/null)
    page=$(sed -n '/<pre>/,/<\/pre>/p' <<<"$out")
    how=$(grep -o -m1 '^\(New\|Reused\), TLSv1.3' <<<"$page" | cut -d, -f1)
    ctx=$(grep -m1 'Session-ID-ctx:' <<<"$page" | awk '{ print $2 }')
    echo "${how:-none} $(unhex "${ctx:-3f}")"
}
unhex() { local h=$1 out=""; while [ -n "$h" ]; do out+=$(printf "\\x${h:0:2}"); h=${h:2}; done; echo "$out"; }
declare -A before_res
for i in "${NODES[@]}"; do before_res[$i]=$(resumed_on "$i"); done
firsts=()
for ((c = 0; c < TLS_CLIENTS; c++)); do
    read -r how be < <(tls_once -sess_out "$W/sess-$c")
    firsts+=("$be")
done
home=0 total=0 notes=""
for ((r = 0; r < TLS_ROUNDS; r++)); do
    for ((c = 0; c < TLS_CLIENTS; c++)); do
        read -r how be < <(tls_once -sess_in "$W/sess-$c")
        total=$((total + 1))
        if [ "$how" = Reused ] && [ "$be" = "${firsts[$c]}" ]; then
            home=$((home + 1))
        else
            notes+=" [$c/$r: $how on $be, home ${firsts[$c]}]"
        fi
    done
done
spread="" all_carried=1
for i in "${NODES[@]}"; do
    d=$(( $(resumed_on "$i") - before_res[$i] ))
    spread+="node $i: $d; "
    [ "$d" -gt 0 ] || all_carried=0
done
figure "TLS 1.3 resumptions home (backend's own view: resumed, same backend): $home/$total; first handshakes on $(printf '%s\n' "${firsts[@]}" | sort | uniq -c | tr -s ' ' | tr '\n' ';'); resumed handshakes relayed per node: $spread${notes:+ misses:$notes}"
check tls13-home "$([ $((home * 100)) -ge $((TARGET_PCT * total)) ] && [ "$all_carried" = 1 ] && echo 1)" \
    "$home/$total TLS 1.3 resumptions landed on the backend that holds them (>= $TARGET_PCT %), carried by every node ($spread)"

# ---- /healthz fails (node 3 can reach no backend): withdrawn; flapping is damped
t0=$(now_ms)
ip -n "$(ns 3)" route add prohibit 10.55.100.0/24
wait_for "node 3 withdrawn" "$WAIT" absent 3
ok=$?
body=$(in_ns "$(ns 3)" curl -s -m 1 http://127.0.0.1:9140/healthz)
figure "all backends unreachable from node 3: withdrawn from the router after $(( $(now_ms) - t0 )) ms; /healthz: $body"
check health-withdraw "$([ "$ok" = 0 ] && grep -q healthz_needs_backends <<<"$body" && echo 1)" \
    "a node whose backends are all down withdraws the VIP (router now [$(members)])"
# Flap: backends reachable just long enough for /healthz to pass, then not, 3 times.
( while :; do present 3 && echo "n3 in [$(members)] at $(now_ms)"; sleep 0.2; done ) > "$W/flap-watch.log" 2>&1 &
FLAPWATCH=$!; PIDS+=("$FLAPWATCH")
flaps=0
for k in 1 2 3; do
    ip -n "$(ns 3)" route del prohibit 10.55.100.0/24
    wait_for "node 3 healthy (flap $k)" "$WAIT" healthy 3 && flaps=$((flaps + 1))
    ip -n "$(ns 3)" route add prohibit 10.55.100.0/24
    wait_for "node 3 unhealthy (flap $k)" "$WAIT" unhealthy 3
    # Down for two of the watcher's check intervals, so it sees the failure.
    sleep 2
done
kill "$FLAPWATCH" 2>/dev/null; wait "$FLAPWATCH" 2>/dev/null
ip -n "$(ns 3)" route del prohibit 10.55.100.0/24
wait_for "node 3 healthy" "$WAIT" healthy 3
t_ok=$(now_ms)
wait_for "node 3 announced again" "$((HOLD + WAIT))" active 3
ok=$?
back=$(( $(now_ms) - t_ok ))
said=$(watch_log 3 | grep 'announcing:' | tail -1)
passed_for=$(sed -n 's/.*passed for \([0-9]*\) s.*/\1/p' <<<"$said")
figure "flapping /healthz on node 3 ($flaps flaps: ~2 s passing, 2 s failing; HOLD $HOLD s): announced during the flapping $(wc -l < "$W/flap-watch.log") times (router sampled every 0.2 s); announced again ${back} ms after /healthz passed for good (watcher: $said)"
check health-damped "$([ "$flaps" = 3 ] && [ ! -s "$W/flap-watch.log" ] && [ "$ok" = 0 ] && [ "${passed_for:-0}" -ge "$HOLD" ] && echo 1)" \
    "flapping health kept the VIP withdrawn; announced again once /healthz had passed for HOLD ($HOLD s) in a row, ${back} ms after it passed for good"

# ---- BIRD stops on node 3: crossbar keeps serving; the watcher says the VIP is not announced
kill -TERM "${BIRD[3]}"; wait "${BIRD[3]}" 2>/dev/null
wait_for "node 3 gone from the router" "$WAIT" absent 3
line=$(in_ns "$NS_C" timeout 5 bash -c "exec 3<>/dev/tcp/$(nodeip 3)/$ECHO_PORT && head -1 <&3" 2>/dev/null)
wait_for "watcher says not announced" "$WAIT" grep -q 'NOT announced: BIRD does not answer' "$W/${WATCH_LOG[3]}.log"
said=$?
check bird-down "$([ "${line#* }" = "$(nodeip 3)" ] && [ "$said" = 0 ] && echo 1)" \
    "BIRD stopped on node 3: crossbar still serves (a connection to node 3 reached ${line:-nothing}); watcher: $(grep 'NOT announced' "$W/${WATCH_LOG[3]}.log" | tail -1)"
# A BIRD whose config lacks the watcher's protocols: the same, and the log says why.
node_bird_conf 3 | awk '/^protocol static crossbar_vip/ { skip = 1 } skip && /^}/ { skip = 0; next } !skip' \
    > "$W/bird-n3-bad.conf"
spawn bird-n3-bad "$(ns 3)" bird -f -c "$W/bird-n3-bad.conf" -s "$W/bird-n3.ctl" -P "$W/bird-n3.pid"
BADBIRD=$SPAWNED
wait_for "watcher says misconfigured" "$WAIT" grep -q 'NOT announced: BIRD has no protocol' "$W/${WATCH_LOG[3]}.log"
said=$?
line=$(in_ns "$NS_C" timeout 5 bash -c "exec 3<>/dev/tcp/$(nodeip 3)/$ECHO_PORT && head -1 <&3" 2>/dev/null)
check bird-misconfigured "$([ "$said" = 0 ] && absent 3 && [ "${line#* }" = "$(nodeip 3)" ] && echo 1)" \
    "BIRD without the VIP's protocols on node 3: not announced (router [$(members)]), crossbar still serves (${line:-nothing}); watcher: $(grep 'NOT announced' "$W/${WATCH_LOG[3]}.log" | tail -1)"
kill -TERM "$BADBIRD"; wait "$BADBIRD" 2>/dev/null
start_bird 3
wait_for "node 3 announced again" "$WAIT" active 3
ok=$?
wait_for "watcher says announced" "$WAIT" bash -c "tail -1 '$W/${WATCH_LOG[3]}.log' | grep -q 'announced (BGP sessions up: 1/1)'"
said=$?
check bird-back "$([ "$ok" = 0 ] && [ "$said" = 0 ] && echo 1)" \
    "BIRD back on node 3: the watcher re-enabled the VIP (router [$(members)]; watcher: $(watch_log 3 | tail -1))"

# ---- The watcher alone restarts (an upgrade, a crash of it) on node 2: it adopts the
# announcement BIRD still carries; the router never loses node 2.
( while :; do present 2 || echo "n2 missing from [$(members)] at $(now_ms)"; sleep 0.2; done ) > "$W/restart-watch.log" 2>&1 &
RESTARTWATCH=$!; PIDS+=("$RESTARTWATCH")
kill -9 "${WATCH[2]}"; wait "${WATCH[2]}" 2>/dev/null
start_watcher 2
wait_for "the new watcher on node 2 reports" "$WAIT" grep -q 'announced (BGP sessions up' "$W/${WATCH_LOG[2]}.log"
said=$?
kill "$RESTARTWATCH" 2>/dev/null; wait "$RESTARTWATCH" 2>/dev/null
check watcher-restart "$([ "$said" = 0 ] && ! grep -q withdrawn "$W/${WATCH_LOG[2]}.log" && [ ! -s "$W/restart-watch.log" ] && active 2 && echo 1)" \
    "watcher restarted on node 2: it adopted the announcement, the router never lost the node ($(grep -c . "$W/restart-watch.log") samples without it); watcher: $(watch_log 2 | sed -n 2p)"

kill "$WATCHDOG" 2>/dev/null
finish
