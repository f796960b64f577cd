# Sourced by bench/herd.sh once the site runs: the three balancers in front of c1
# and c2, the herds, and the table of what each herd did.
#
#   crossbar  puppetfb (127.0.0.45)  leastconn + stick + feedback: { kind: puppet }
#   crossbar  puppetlc (127.0.0.46)  leastconn + stick, no feedback (conf/puppet.yaml's preset)
#   haproxy   puppetha (127.0.0.47)  leastconn, mode tcp, check (Puppet's documented setup)
#   haproxy   puppeths (127.0.0.48)  balance source: the stickiness many Puppet sites use
#
# A herd: every agent's `puppet agent -t` started at once; its completion time is
# from the herd's start. 503s and catalogs are counted in the compilers' access
# logs (what they answered), retries in the agents' logs.

balancers_start() {
    crossbar_feedback_yaml puppetfb
    cat >> "$W/crossbar.yaml" <<EOF
  puppetlc:
    listen: ["$VIP_LC:8140"]
    names: ["puppetlc.$DOMAIN"]
    balance: leastconn
    stick: $STICK
    health: { server_name: puppetlc.$DOMAIN }
    backends:
      - { name: c1, address: "c1.$DOMAIN:8140" }
      - { name: c2, address: "c2.$DOMAIN:8140" }
EOF
    crossbar_start
    cat > "$W/haproxy.cfg" <<EOF
global
    maxconn 4096
defaults
    mode tcp
    timeout connect 3s
    timeout client 30m
    timeout server 30m
listen puppetha
    bind $VIP_HA:8140
    balance leastconn
    server c1 $IP_C1:8140 check inter 1s
    server c2 $IP_C2:8140 check inter 1s
listen puppeths
    bind $VIP_HS:8140
    balance source
    server c1 $IP_C1:8140 check inter 1s
    server c2 $IP_C2:8140 check inter 1s
EOF
    haproxy -c -f "$W/haproxy.cfg" > "$W/haproxy-check.log" 2>&1 || { cat "$W/haproxy-check.log" >&2; die "haproxy -c"; }
    haproxy -db -f "$W/haproxy.cfg" > "$W/haproxy.log" 2>&1 &
    PIDS[haproxy]=$!
    local vip
    for vip in $VIP_FB $VIP_LC $VIP_HA $VIP_HS; do
        for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/$vip/8140") 2>/dev/null && break; sleep 0.1; done
    done
    # every compiler sampled by the feedback service, out of its blackout
    for _ in $(seq 1 300); do
        [ "$(curl -s "http://$ADMIN_FB/metrics" | grep -c '^crossbar_backend_feedback_phase{.*phase="active".*} 1')" = 2 ] && return 0
        sleep 0.2
    done
    die "feedback never became active (log: $W/crossbar.log)"
}

# queue COMPILER: borrowed + requested JRuby requests now (0 when idle)
busy() {
    metrics "$1" | ruby -rjson -e 'm = JSON.parse(STDIN.read)["status"]["experimental"]["metrics"]
        puts m["borrowed-instances"].size + m["requested-instances"].size' 2>/dev/null || echo 99
}
wait_idle() {
    for _ in $(seq 1 $((IDLE_TIMEOUT * 2))); do
        [ "$(busy c1)" = 0 ] && [ "$(busy c2)" = 0 ] && return 0
        sleep 0.5
    done
    log "WARNING: compilers still busy after ${IDLE_TIMEOUT}s"
}

# warm: each compiler compiles on every JRuby twice before anything is measured
warm() {
    local n pids=() k
    for n in c1 c2; do
        local j=$J1; [ $n = c2 ] && j=$J2
        for k in 1 2; do
            for i in $(seq -f '%02g' 1 "$j"); do catalog "h$i" $n > /dev/null & pids+=($!); done
            wait "${pids[@]}"; pids=()
        done
    done
}

lines() { wc -l < "$W/$1/log/access.log"; }

# herd MODE ROUND SIZE: SIZE agents at once through puppetMODE; one result line
herd() {
    local mode=$1 round=$2 size=$3 tag="$1-$2-$3" i k=0 pids=()
    wait_idle
    local from1 from2; from1=$(lines c1); from2=$(lines c2)
    REPLACED0=$(replaced)
    local t0; t0=$(now_ms)
    : > "$W/times-$tag"
    for i in $(seq -f '%02g' 1 "$size"); do
        k=$((k + 1))
        (
            timeout "$AGENT_TIMEOUT" puppet agent -t --server "puppet$mode.$DOMAIN" \
                --confdir "$W/agents/h$i" --color false > "$W/agents/h$i/$tag.log" 2>&1
            echo "h$i $? $(( $(now_ms) - t0 ))" >> "$W/times-$tag"
        ) &
        pids+=($!)
    done
    wait "${pids[@]}"
    tail -n +"$((from1 + 1))" "$W/c1/log/access.log" > "$W/access-c1-$tag"
    tail -n +"$((from2 + 1))" "$W/c2/log/access.log" > "$W/access-c2-$tag"
    result "$mode" "$tag" "$round" "$size"
}

# percentiles: "p50 p95 max" (seconds) of the milliseconds on stdin, "- - -" without any
percentiles() {
    sort -n | awk '{v[NR] = $1} END { if (NR == 0) { print "- - -"; exit }
        i50 = int((NR * 50 + 99) / 100); i95 = int((NR * 95 + 99) / 100)
        printf "%.1f %.1f %.1f\n", v[i50] / 1000, v[i95] / 1000, v[NR] / 1000 }'
}

# replaced: crossbar_backend_feedback_sticky_replaced_total of the feedback service
replaced() {
    curl -s "http://$ADMIN_FB/metrics" | grep '^crossbar_backend_feedback_sticky_replaced_total' |
        awk '{s += $2} END {print s + 0}'
}

# result MODE TAG ROUND SIZE: | mode | agents | round | 503s | catalogs c1 / c2 | p50 | p95 |
# max | p95 of the runs that got their catalog | failed | retries | retries placed anew |
result() {
    local tag=$2 anew=-
    [ "$1" = fb ] && anew=$(( $(replaced) - REPLACED0 ))
    local s503 cat1 cat2 failed retries p50 p95 max okp95
    s503=$(cat "$W/access-c1-$tag" "$W/access-c2-$tag" | grep -c '" 503 ')
    cat1=$(grep -c '"POST /puppet/v3/catalog/[^"]*" 200 ' "$W/access-c1-$tag")
    cat2=$(grep -c '"POST /puppet/v3/catalog/[^"]*" 200 ' "$W/access-c2-$tag")
    failed=$(awk '$2 != 0 && $2 != 2' "$W/times-$tag" | wc -l)
    retries=$(cat "$W"/agents/h*/"$tag.log" | grep -c 'Sleeping for')
    read -r p50 p95 max < <(awk '{print $3}' "$W/times-$tag" | percentiles)
    # a failed run's end is when its agent gave up, not when it had a catalog
    read -r _ okp95 _ < <(awk '$2 == 0 || $2 == 2 {print $3}' "$W/times-$tag" | percentiles)
    printf '| %s | %s | %s | %s | %s / %s | %s s | %s s | %s s | %s s | %s | %s | %s |\n' \
        "$(label "$1")" "$4" "$3" "$s503" "$cat1" "$cat2" "$p50" "$p95" "$max" "$okp95" "$failed" "$retries" "$anew" |
        tee -a "$W/results.md"
}
label() {
    case $1 in
        fb) echo "crossbar leastconn + feedback" ;;
        lc) echo "crossbar leastconn" ;;
        ha) echo "HAProxy leastconn" ;;
        hs) echo "HAProxy balance source" ;;
    esac
}

herds() {
    balancers_start
    log "warming every JRuby"
    warm
    echo "herds of ${SIZES//,/ and } agents at once; c1 $J1 JRuby, c2 $J2; max-queued-requests $QUEUE, max-retry-delay ${RETRY_DELAY}s; catalogs +${SLEEP}s (generate sleep)"
    echo
    echo "| balancer | agents | round | 503s | catalogs c1 / c2 | p50 | p95 | max | p95, runs with a catalog | failed runs | retries after 503 | retries placed anew |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
    local r m n
    for r in $(seq 1 "$ROUNDS"); do
        for n in ${SIZES//,/ }; do
            for m in ${MODES//,/ }; do
                herd "$m" "$r" "$n"
            done
        done
    done
    echo
    echo "crossbar feedback: retries and resumptions placed like new connections (saturated compiler): $(replaced)"
    echo "work dir: $W (results.md, access-*, times-*, agents/*/MODE-ROUND-SIZE.log)"
}
