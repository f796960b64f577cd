#!/usr/bin/env bash
# The rolling restart: every compiler drained, restarted and put back in turn while
# real puppet agents run in a loop, through crossbar (packaging/rolling-restart:
# `crossbar backend drain --wait`, restart, `enable`, wait until it is back at full
# weight by load feedback's JRuby-fill ramp) and through HAProxy (its runtime API:
# `set server puppet/cN state drain`, poll `show stat` until the server has no
# session, restart, `set server ... state ready`, wait until `slowstart` is over),
# the two interleaved (docs/puppet.md "Rolling restart of the compilers").
#
#   sudo bench/rolling.sh                    # 3 agents, compilers of 1 and 3 JRubies
#   sudo bench/rolling.sh --gen 7            # Debian 12's Puppet 7 instead of 8
#   sudo bench/rolling.sh --agents 3 --rounds 3 --sleep 4
#
# The site is bench/herd.sh's (bench/herd-site.sh): c1 (CA and compiler) and c2, a
# catalog that takes --sleep seconds, agents with their own certificates. It edits
# /etc/hosts and starts two JVMs, so it takes the Puppet E2E's lock
# (/tmp/puppet-e2e.lock, as .ci/run does). It times things: run it alone on the
# machine (nothing else building or testing beside it).
#
# A roll: every agent runs `puppet agent -t` in a loop (each run bounded); once each
# has finished one run, c1 then c2 are rolled; when the last is back at full weight
# the agents finish the run they are in and stop. Measured per roll, over the agent
# runs that overlap it: failed runs (exit neither 0 nor 2), the 503s the compilers
# answered to agent requests (their access logs; health checks and metrics polls
# left out), the agents' retries after a 503, the catalogs each compiler compiled,
# the roll's duration (first drain to the last compiler back at full weight) and the
# agent runs' p50, p95 and max. Then one table of crossbar / HAProxy ratios.
#
# Options:
#   --gen 8|7         Puppet 8 (default: Debian 13's puppetserver 8.7 and agents 8.10
#                     from the trixie root tests/puppet/root8.sh builds and caches) or
#                     Puppet 7 (Debian 12's 7.9.5 and 7.23 installed here)
#   --agents N        agents running in a loop (default 3: what c1 alone takes without
#                     a 503, its JRuby and its queue of 2, while c2 is out; the roll,
#                     not an overload, is under test)
#   --rounds R        rolls per balancer, crossbar and HAProxy interleaved (default 1)
#   --jrubies A,B     max-active-instances of compiler c1 and c2 (default 1,3)
#   --queue Q         max-queued-requests of both (default 2)
#   --retry-delay D   max-retry-delay of both, seconds (default 10)
#   --sleep S         seconds a catalog takes beyond its compile: generate('/bin/sleep', S) (default 2)
#   --slowstart T     HAProxy's slowstart, seconds (default 60)
#   --balancers LIST  of cb (crossbar), ha (HAProxy); default cb,ha
#   --strict-plugins  a failed pluginsync fails the agent's run (see herd.sh)
# Environment: CROSSBAR_BIN (default target/release/crossbar, built if missing),
#   KEEP=1 keeps the work directory (roll-*.log: each roll's steps; runs-*: every
#   agent run; access-*: the compilers' access logs during each roll).
# Prints a markdown table of the rolls and one of ratios; exit 0 when every roll
# ran, 1 when one did not finish (the bench stops there), 2 on a setup error.
set -uo pipefail

if [ -z "${HERD_LOCKED:-}" ]; then
    exec flock /tmp/puppet-e2e.lock env HERD_LOCKED=1 "$0" "$@"
fi

AGENTS=3 ROUNDS=1 JRUBIES=1,3 QUEUE=2 RETRY_DELAY=10 SLEEP=2 SLOWSTART=60 BALANCERS=cb,ha STRICT_PLUGINS=0 PUPPET_GEN=8
CAPTURE=""
while [ $# -gt 0 ]; do
    case "$1" in
        --gen) PUPPET_GEN=$2; shift ;;
        --agents) AGENTS=$2; shift ;;
        --rounds) ROUNDS=$2; shift ;;
        --jrubies) JRUBIES=$2; shift ;;
        --queue) QUEUE=$2; shift ;;
        --retry-delay) RETRY_DELAY=$2; shift ;;
        --sleep) SLEEP=$2; shift ;;
        --slowstart) SLOWSTART=$2; shift ;;
        --balancers) BALANCERS=$2; shift ;;
        --strict-plugins) STRICT_PLUGINS=1 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
J1=${JRUBIES%,*} J2=${JRUBIES#*,}
for v in "$AGENTS" "$ROUNDS" "$J1" "$J2" "$QUEUE" "$RETRY_DELAY" "$SLEEP" "$SLOWSTART"; do
    [[ $v =~ ^[0-9]+$ ]] && [ "$v" -gt 0 ] || { echo "a count or a time is a positive integer, not '$v'" >&2; exit 2; }
done
[[ $BALANCERS =~ ^(cb|ha)(,(cb|ha))*$ ]] || { echo "--balancers takes cb and/or ha: cb,ha" >&2; exit 2; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# A drain ends with the longest agent run, which is bounded by AGENT_TIMEOUT.
DRAIN_TIMEOUT=600
# After `running` (its first JRuby), the rest of the pool and the ramp.
BACK_TIMEOUT=600
# The whole roll at most: per compiler a drain, a stop (STOP_TIMEOUT), a start and
# the way back; past it the roll is stopped and counted as not finished.
ROLL_TIMEOUT=$(( 2 * (DRAIN_TIMEOUT + 60 + ${JVM_START_TIMEOUT:-900} + BACK_TIMEOUT) ))
# Every agent loop ends by this many seconds after it starts even if the roll never
# says so, and after this many runs (a run takes seconds; this is only a bound).
LOOP_TIMEOUT=$(( ROLL_TIMEOUT + 600 ))
MAX_RUNS=10000

# the site's names, addresses, timeouts, cleanup and setup (site_setup)
# shellcheck source=bench/herd-site.sh
source "$ROOT/bench/herd-site.sh"
# metrics, pool, busy, wait_idle, warm, lines, percentiles
# shellcheck source=bench/herd-run.sh
source "$ROOT/bench/herd-run.sh"

[ -x "$ROOT/packaging/rolling-restart" ] || { echo "no packaging/rolling-restart in $ROOT" >&2; exit 2; }
site_setup crossbar-rolling

# ================================================================== balancers
# crossbar: herd.sh's feedback service (leastconn, stick, feedback) named puppet;
# HAProxy: leastconn with an HTTPS check of the same status page (an operator's
# roll needs the check to know when a compiler is back) and slowstart
rolling_balancers_start() {
    crossbar_feedback_yaml puppet
    crossbar_start
    cat > "$W/haproxy.cfg" <<EOF
global
    maxconn 4096
    stats socket $W/haproxy.sock mode 600 level admin
defaults
    mode tcp
    timeout connect 3s
    timeout client 30m
    timeout server 30m
listen puppet
    bind $VIP_HA:8140
    balance leastconn
    # /status/v1/simple/server answers 200 and 'running' once it is, 503 before
    option httpchk
    http-check send meth GET uri /status/v1/simple/server ver HTTP/1.1 hdr Host puppetha.$DOMAIN
    http-check expect status 200
    default-server check inter 1s check-ssl ca-file $W/ca.pem check-sni puppetha.$DOMAIN verifyhost puppetha.$DOMAIN slowstart ${SLOWSTART}s
    server c1 $IP_C1:8140
    server c2 $IP_C2:8140
EOF
    haproxy -c -f "$W/haproxy.cfg" > "$W/haproxy-check.log" 2>&1 || { cat "$W/haproxy-check.log" >&2; die "haproxy -c"; }
    haproxy -db -f "$W/haproxy.cfg" > "$W/haproxy.log" 2>&1 &
    PIDS[haproxy]=$!
    local vip
    for vip in $VIP_FB $VIP_HA; do
        for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/$vip/8140") 2>/dev/null && break; sleep 0.1; done
    done
    settled || die "the balancers never saw both compilers up (logs: $W/haproxy.log, $W/crossbar.log)"
}

# SETTLE_TIMEOUT: seconds both balancers have to see both compilers back at full
# weight before a roll (a HAProxy slowstart, crossbar's feedback ramp)
SETTLE_TIMEOUT=300

# settled: both compilers UP for HAProxy with no slowstart left, and up for crossbar
# with feedback active (out of its blackout and ramp), within SETTLE_TIMEOUT; 1 if not
settled() {
    local b end=$((SECONDS + SETTLE_TIMEOUT))
    for b in c1 c2; do
        until [ "$(ha_stat $b | cut -d, -f2-)" = "UP," ]; do
            [ "$SECONDS" -lt "$end" ] || { log "HAProxy: $b is $(ha_stat $b) (scur,status,throttle)"; return 1; }
            sleep 0.5
        done
    done
    until [ "$(curl -s "http://$ADMIN_FB/metrics" | grep -c '^crossbar_backend_feedback_phase{.*phase="active".*} 1')" = 2 ]; do
        [ "$SECONDS" -lt "$end" ] || { log "crossbar: feedback not active on both"; return 1; }
        sleep 0.5
    done
}

# ha_cmd COMMAND: one command on HAProxy's runtime API (the stats socket), its answer
ha_cmd() {
    timeout 10 ruby -rsocket -e 's = UNIXSocket.new(ARGV[0]); s.write(ARGV[1] + "\n")
        s.close_write; print s.read' "$W/haproxy.sock" "$1"
}
# ha_stat SERVER: "scur,status,throttle" of puppet/SERVER from `show stat` (throttle
# empty once slowstart is over)
ha_stat() {
    ha_cmd "show stat" | awk -F, -v s="$1" '
        NR == 1 { sub(/^# /, ""); for (i = 1; i <= NF; i++) f[$i] = i; next }
        $1 == "puppet" && $2 == s { print $f["scur"] "," $f["status"] "," $f["throttle"] }'
}

# ================================================================== the rolls
# ha_roll: HAProxy's procedure, per compiler: drain, poll until it has no session
# (every second), restart, ready, poll until it is UP with no slowstart left (every
# 2 s, as packaging/rolling-restart polls); 1 at the first step that fails or times out
ha_roll() {
    local b st end
    for b in c1 c2; do
        echo "== puppet/$b: set server puppet/$b state drain, waiting up to ${DRAIN_TIMEOUT}s for its last session"
        [ -z "$(ha_cmd "set server puppet/$b state drain")" ] || { echo "ha_roll: drain $b refused" >&2; return 1; }
        end=$((SECONDS + DRAIN_TIMEOUT))
        while st=$(ha_stat $b); [ "${st%%,*}" != 0 ]; do
            [ "$SECONDS" -lt "$end" ] || { echo "ha_roll: $b still has sessions after ${DRAIN_TIMEOUT}s ($st)" >&2; return 1; }
            sleep 1
        done
        echo "== puppet/$b: restarting"
        compiler_restart $b || { echo "ha_roll: restarting $b failed" >&2; return 1; }
        [ -z "$(ha_cmd "set server puppet/$b state ready")" ] || { echo "ha_roll: ready $b refused" >&2; return 1; }
        echo "== puppet/$b: ready, waiting up to ${BACK_TIMEOUT}s for it to be UP with slowstart over"
        end=$((SECONDS + BACK_TIMEOUT))
        while st=$(ha_stat $b); [ "${st#*,}" != "UP," ]; do
            [ "$SECONDS" -lt "$end" ] || { echo "ha_roll: $b not back after ${BACK_TIMEOUT}s ($st)" >&2; return 1; }
            sleep 2
        done
        echo "== puppet/$b: back ($st)"
    done
}

# cb_roll: crossbar's, packaging/rolling-restart itself, restarting by compiler_restart
cb_roll() {
    PATH="$W/bin:$PATH" RESTART='compiler_restart {}' CROSSBAR_ARGS="-c $W/crossbar.yaml" \
        DRAIN_TIMEOUT=${DRAIN_TIMEOUT}s BACK_TIMEOUT=$BACK_TIMEOUT "$ROOT/packaging/rolling-restart" puppet c1 c2
}

# agents MODE TAG: every agent running `puppet agent -t` through puppetMODE in a loop
# until $W/stop-TAG exists; each run a line "agent run exit start_ms end_ms" in
# $W/runs-TAG, its output in $W/agents/AGENT/TAG-RUN.log
agents() {
    local vip=$1 tag=$2 i
    AGENT_PIDS=()
    : > "$W/runs-$tag"
    for i in $(seq -f '%02g' 1 "$AGENTS"); do
        (
            local end=$((SECONDS + LOOP_TIMEOUT)) k s rc
            for k in $(seq 1 $MAX_RUNS); do
                [ -e "$W/stop-$tag" ] || [ "$SECONDS" -ge "$end" ] && break
                s=$(now_ms)
                timeout "$AGENT_TIMEOUT" puppet agent -t --server "$vip.$DOMAIN" \
                    --confdir "$W/agents/h$i" --color false > "$W/agents/h$i/$tag-$k.log" 2>&1
                rc=$?
                echo "h$i $k $rc $s $(now_ms)" >> "$W/runs-$tag"
            done
        ) &
        AGENT_PIDS+=($!)
    done
}

# started_once TAG: every agent has finished a run (within AGENT_TIMEOUT)
started_once() {
    local end=$((SECONDS + AGENT_TIMEOUT))
    while [ "$(awk '{print $1}' "$W/runs-$1" | sort -u | wc -l)" -lt "$AGENTS" ]; do
        [ "$SECONDS" -lt "$end" ] || return 1
        sleep 0.5
    done
}

label() { case $1 in cb) echo "crossbar (drain --wait, feedback ramp)" ;; ha) echo "HAProxy (drain, slowstart ${SLOWSTART}s)" ;; esac; }

# roll MODE ROUND: one roll under the agents' loop; one row of the table; 1 if the
# roll did not finish
roll() {
    local mode=$1 tag=$1-$2 vip=puppetfb rc
    [ "$mode" = ha ] && vip=puppetha
    wait_idle
    pools_full || log "WARNING: the $tag roll starts without full pools"
    settled || log "WARNING: the $tag roll starts with a compiler not back at full weight"
    warm
    agents "$vip" "$tag"
    started_once "$tag" || log "WARNING: not every agent finished a run within ${AGENT_TIMEOUT}s before the $tag roll"
    local from1 from2 t0 t1
    from1=$(lines c1); from2=$(lines c2)
    log "$tag: rolling c1, c2 through $(label "$mode")"
    t0=$(now_ms)
    if [ "$mode" = cb ]; then
        timeout "$ROLL_TIMEOUT" bash -c 'cb_roll' 2>&1 | stamp "$t0" > "$W/roll-$tag.log"
    else
        timeout "$ROLL_TIMEOUT" bash -c 'ha_roll' 2>&1 | stamp "$t0" > "$W/roll-$tag.log"
    fi
    rc=${PIPESTATUS[0]}
    t1=$(now_ms)
    pids_adopt
    sed 's/^/    /' "$W/roll-$tag.log" >&2
    touch "$W/stop-$tag"
    wait "${AGENT_PIDS[@]}"
    tail -n +"$((from1 + 1))" "$W/c1/log/access.log" > "$W/access-c1-$tag"
    tail -n +"$((from2 + 1))" "$W/c2/log/access.log" > "$W/access-c2-$tag"
    roll_result "$mode" "$tag" "$2" "$t0" "$t1" "$rc"
    [ "$rc" = 0 ]
}

# stamp T0: each line of stdin after the seconds since T0 (milliseconds)
stamp() {
    local line ms
    while IFS= read -r line; do
        ms=$(( $(now_ms) - $1 ))
        printf '[+%3d.%ds] %s\n' $((ms / 1000)) $((ms % 1000 / 100)) "$line"
    done
}

# in_roll TAG T0 T1: the runs of runs-TAG that overlap the roll (started before its
# end, ended after its start)
in_roll() { awk -v a="$2" -v b="$3" '$4 < b && $5 > a' "$W/runs-$1"; }

# roll_result MODE TAG ROUND T0 T1 RC: | balancer | round | roll | roll beyond the
# restarts | runs | failed runs |
# 503s | retries after 503 | catalogs c1 / c2 | p50 | p95 | max |
roll_result() {
    local mode=$1 tag=$2 t0=$4 t1=$5 rc=$6 runs failed s503 retries cat1 cat2 p50 p95 max took restarts beyond
    in_roll "$tag" "$t0" "$t1" > "$W/roll-runs-$tag"
    runs=$(wc -l < "$W/roll-runs-$tag")
    # a failed run: an exit code other than 0 or 2, or an `Error:` line (a cut
    # pluginsync ends 0 with one; the Puppet E2E's rolling-restart found it)
    failed=$(awk -v d="$W/agents" -v t="$tag" '{
            bad = ($3 != 0 && $3 != 2)
            f = d "/" $1 "/" t "-" $2 ".log"
            while (!bad && (getline l < f) > 0) if (l ~ /^Error:/) bad = 1
            close(f)
            if (bad) n++
        } END { print n + 0 }' "$W/roll-runs-$tag")
    # agents' requests only: a restarting puppetserver answers its status page 503
    s503=$(cat "$W/access-c1-$tag" "$W/access-c2-$tag" | grep -cE '"[A-Z]+ /puppet(-ca)?/[^"]*" 503 ')
    retries=$(awk -v d="$W/agents" -v t="$tag" '{ print d "/" $1 "/" t "-" $2 ".log" }' "$W/roll-runs-$tag" |
        xargs -r cat | grep -c 'Sleeping for')
    cat1=$(grep -c '"POST /puppet/v3/catalog/[^"]*" 200 ' "$W/access-c1-$tag")
    cat2=$(grep -c '"POST /puppet/v3/catalog/[^"]*" 200 ' "$W/access-c2-$tag")
    read -r p50 p95 max < <(awk '{print $5 - $4}' "$W/roll-runs-$tag" | percentiles)
    took=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", (b - a) / 1000 }')
    # the roll beyond the restarts themselves: the drains and the ways back to full
    # weight, what the balancer decides (a JVM's start-up is the same for both)
    restarts=$(awk '/^\[[^]]*\] == c[12] restarted in / { s += $(NF - 6) } END { printf "%.1f", s }' "$W/roll-$tag.log")
    beyond=$(awk -v t="$(( t1 - t0 ))" -v r="$restarts" 'BEGIN { printf "%.0f", t / 1000 - r }')
    [ "$rc" = 0 ] || took="$took (NOT FINISHED: exit $rc, see $W/roll-$tag.log)"
    echo "$mode $runs $failed $s503 $((t1 - t0)) $beyond" >> "$W/totals"
    awk '{print $5 - $4}' "$W/roll-runs-$tag" >> "$W/durations-$mode"
    printf '| %s | %s | %s s | %s s | %s | %s | %s | %s | %s / %s | %s s | %s s | %s s |\n' \
        "$(label "$mode")" "$3" "$took" "$beyond" "$runs" "$failed" "$s503" "$retries" "$cat1" "$cat2" "$p50" "$p95" "$max" |
        tee -a "$W/results.md"
}

# ratio A B: A / B to two places; "–" when B is 0 ("– (both 0)" when A is too)
ratio() {
    awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0) print (a == 0 ? "– (both 0)" : "– (HAProxy 0)"); else printf "%.2f\n", a / b }'
}

# ratios: crossbar / HAProxy over every roll of each (counts summed, durations
# averaged, run times pooled)
ratios() {
    local m f5 c h
    declare -A runs failed s503 ms bey n p50 p95
    for m in cb ha; do
        read -r n[$m] runs[$m] failed[$m] s503[$m] ms[$m] bey[$m] < <(awk -v m=$m '$1 == m { n++; r += $2; f += $3; s += $4; t += $5; b += $6 }
            END { printf "%d %d %d %d %.0f %.0f\n", n, r, f, s, n ? t / n / 1000 : 0, n ? b / n : 0 }' "$W/totals")
        read -r p50[$m] p95[$m] _ < <(percentiles < "$W/durations-$m" 2>/dev/null || echo "- - -")
    done
    echo
    echo "crossbar / HAProxy, ${n[cb]} and ${n[ha]} rolls (counts summed, roll durations averaged, agent runs pooled):"
    echo
    echo "| | crossbar | HAProxy | crossbar / HAProxy |"
    echo "|---|---|---|---|"
    echo "| agent runs during the rolls | ${runs[cb]} | ${runs[ha]} | $(ratio "${runs[cb]}" "${runs[ha]}") |"
    echo "| failed agent runs | ${failed[cb]} | ${failed[ha]} | $(ratio "${failed[cb]}" "${failed[ha]}") |"
    echo "| 503s answered to agents | ${s503[cb]} | ${s503[ha]} | $(ratio "${s503[cb]}" "${s503[ha]}") |"
    echo "| roll duration | ${ms[cb]} s | ${ms[ha]} s | $(ratio "${ms[cb]}" "${ms[ha]}") |"
    echo "| roll beyond the restarts (drains, ways back) | ${bey[cb]} s | ${bey[ha]} s | $(ratio "${bey[cb]}" "${bey[ha]}") |"
    for f5 in p50 p95; do
        if [ "$f5" = p50 ]; then c=${p50[cb]} h=${p50[ha]}; else c=${p95[cb]} h=${p95[ha]}; fi
        if [ "$c" = - ] || [ "$h" = - ]; then
            echo "| agent run $f5 | $c s | $h s | – |"
        else
            echo "| agent run $f5 | $c s | $h s | $(ratio "$c" "$h") |"
        fi
    done
}

# ================================================================== main
mkdir -p "$W/bin"
ln -s "$CROSSBAR" "$W/bin/crossbar"
rolling_balancers_start
# the rolls run in a child bash (under `timeout`), and packaging/rolling-restart's
# RESTART in a grandchild: the functions and the site's variables they need
export -f cb_roll ha_roll ha_cmd ha_stat compiler_restart compiler_start jvm_start jvm_wait heap alive
export W DOMAIN IP_C1 IP_C2 J1 J2 JVM_START_TIMEOUT STOP_TIMEOUT DRAIN_TIMEOUT BACK_TIMEOUT ROOT
log "warming every JRuby"
warm
echo "rolling restarts of c1 ($J1 JRuby) and c2 ($J2) under $AGENTS agents in a loop; max-queued-requests $QUEUE, max-retry-delay ${RETRY_DELAY}s; catalogs +${SLEEP}s (generate sleep); HAProxy slowstart ${SLOWSTART}s"
echo
echo "| balancer | round | roll | roll beyond the restarts | agent runs | failed runs | 503s | retries after 503 | catalogs c1 / c2 | p50 | p95 | max |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
: > "$W/totals"
: > "$W/durations-cb"
: > "$W/durations-ha"
status=0
for r in $(seq 1 "$ROUNDS"); do
    for m in ${BALANCERS//,/ }; do
        roll "$m" "$r" || { status=1; log "the $m-$r roll did not finish: no more rolls"; break 2; }
    done
done
if [[ $BALANCERS == *cb* && $BALANCERS == *ha* ]]; then ratios; fi
echo
echo "work dir: $W (results.md, roll-*.log, runs-*, access-*, agents/*/MODE-ROUND-RUN.log; KEEP=1 keeps it)"
exit $status
