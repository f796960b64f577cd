# Sourced by bench/herd.sh and bench/rolling.sh: the Puppet site both measure. Two
# compile masters of different sizes (c1 also the CA), a catalog that takes a known
# time, agents with certificates signed offline, and the jruby-metrics capture;
# site_setup builds and starts it, the EXIT trap takes it all down again.
#
#   c1.hb.test  127.0.0.41:8140  CA + compiler, max-active-instances J1
#   c2.hb.test  127.0.0.42:8140  compiler, max-active-instances J2
#   puppetfb / puppetlc / puppetha / puppeths.hb.test: the balancers' VIPs
#   agents h01..hNN: own confdir and ssldir, sourceaddress 127.0.0.1NN
#
# The sourcing script sets first: ROOT, PUPPET_GEN, J1, J2, QUEUE, RETRY_DELAY,
# SLEEP, AGENTS, STRICT_PLUGINS and CAPTURE (empty but for herd.sh --capture).

DOMAIN=hb.test
CROSSBAR=${CROSSBAR_BIN:-$ROOT/target/release/crossbar}
IP_C1=127.0.0.41
IP_C2=127.0.0.42
VIP_FB=127.0.0.45
VIP_LC=127.0.0.46
VIP_HA=127.0.0.47
VIP_HS=127.0.0.48
ADMIN_FB=127.0.0.1:19150
ADMIN_LC=127.0.0.1:19151
# Every agent run is bounded: a herd that stalls is a result, not a hang.
AGENT_TIMEOUT=600
JVM_START_TIMEOUT=${JVM_START_TIMEOUT:-900}
# A compiler is idle again (between herds) within this many seconds, or the next
# herd starts anyway and the table says so.
IDLE_TIMEOUT=120
HOSTS_BEGIN="# BEGIN crossbar-herd $$"
HOSTS_END="# END crossbar-herd $$"
FACTER_CONF=/etc/facter/facter.conf

T0=$(date +%s)
declare -A PIDS=()
CREATED_FACTER=0
W=""
PROOT=""   # Puppet 8: the trixie root (tests/puppet/root8.sh)

log() { printf '[%4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*" >&2; }
die() { log "SETUP ERROR: $*"; exit 2; }
now_ms() { date +%s%3N; }

# stop_pid, hosts_remove, jvm_start, jvm_wait, server_conf, install_cert, agent_conf:
# the Puppet E2E's
# shellcheck source=tests/puppet/site.sh
source "$ROOT/tests/puppet/site.sh"
cleanup() {
    local rc=$?
    pids_adopt
    for n in "${!PIDS[@]}"; do stop_pid "$n"; done
    hosts_remove
    root_umount
    [ "$CREATED_FACTER" = 1 ] && rm -f "$FACTER_CONF" && rmdir /etc/facter 2>/dev/null
    if [ -n "$W" ] && [ -d "$W" ]; then
        if [ "${KEEP:-0}" = 1 ]; then log "kept $W"; else rm -rf "$W"; fi
    fi
    log "done in $(( $(date +%s) - T0 ))s"
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# pids_adopt: the compilers compiler_restart started in another process (their
# pids in $W/NAME/pid), into PIDS, so that cleanup stops them too
pids_adopt() {
    local n
    for n in c1 c2; do
        [ -n "$W" ] && [ -s "$W/$n/pid" ] && PIDS[$n]=$(cat "$W/$n/pid")
    done
    return 0
}

# site_setup PREFIX: as root, the packages, crossbar, the Puppet 8 root, a work
# directory /tmp/PREFIX.XXXXXX ($W), the /etc/hosts block, and the site built and
# running with full JRuby pools
site_setup() {
    [ "$(id -u)" = 0 ] || die "run as root (installs packages, edits /etc/hosts)"
    local pkgs
    case $PUPPET_GEN in
        # Puppet 8: the servers and agents from the root; here HAProxy, and Ruby (the
        # JSON one-liners) with Debian 12's agent
        8) pkgs="puppet-agent haproxy" ;;
        7) pkgs="puppetserver puppet-agent haproxy" ;;
        *) die "--gen $PUPPET_GEN: 7 or 8" ;;
    esac
    if ! command -v puppet >/dev/null || { [ "$PUPPET_GEN" = 7 ] && [ ! -f /usr/share/puppetserver/puppetserver.jar ]; } ||
       ! command -v haproxy >/dev/null; then
        log "installing $pkgs"
        # shellcheck disable=SC2086
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y $pkgs >/dev/null 2>&1 ||
            { apt-get -o DPkg::Lock::Timeout=900 update >/dev/null 2>&1 &&
              DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y $pkgs >/dev/null 2>&1; } ||
            die "apt-get install $pkgs failed"
    fi
    if [ -z "${CAPTURE:-}" ] && [ ! -x "$CROSSBAR" ]; then
        log "building crossbar"; (cd "$ROOT" && cargo build --release --bin crossbar >/dev/null 2>&1) || die "cargo build failed"
    fi
    for c in curl java openssl; do command -v $c >/dev/null || die "$c missing"; done
    if [ ! -e "$FACTER_CONF" ]; then
        mkdir -p /etc/facter
        echo 'facts : { blocklist : [ "EC2", "GCE", "az_metadata", "cloud" ] }' > "$FACTER_CONF"
        CREATED_FACTER=1
    fi
    if [ "$PUPPET_GEN" = 8 ]; then
        PROOT=$("$ROOT/tests/puppet/root8.sh") || die "the Puppet 8 root (tests/puppet/root8.sh)"
    fi
    W=$(mktemp -d "/tmp/$1.XXXXXX")
    chmod 755 "$W"
    if [ -n "$PROOT" ]; then
        root_enter || die "entering the Puppet 8 root $PROOT"
        V_SERVER=$(chroot "$PROOT" dpkg-query -W -f='${Version}' puppetserver)
    else
        V_SERVER=$(dpkg-query -W -f='${Version}' puppetserver)
    fi
    log "work dir $W (Puppet $PUPPET_GEN: $(puppet --version) agent, $V_SERVER server, $(haproxy -v | head -1))"
    hosts_remove_stale crossbar-herd
    hosts_write
    site_build
    site_start
}

hosts_write() {
    hosts_remove
    {
        echo "$HOSTS_BEGIN"
        echo "$IP_C1 c1.$DOMAIN puppetca.$DOMAIN"
        echo "$IP_C2 c2.$DOMAIN"
        echo "$VIP_FB puppetfb.$DOMAIN"
        echo "$VIP_LC puppetlc.$DOMAIN"
        echo "$VIP_HA puppetha.$DOMAIN"
        echo "$VIP_HS puppeths.$DOMAIN"
        echo "$HOSTS_END"
    } >> /etc/hosts
}

# master_conf NAME IP JRUBIES: a puppetserver's own directories and config
# (PUPPET-NOTES.md "Running several puppetservers side by side"; conf.d from
# tests/puppet/site.sh).
master_conf() {
    local n=$1 ip=$2 d=$W/$1
    mkdir -p "$d"/{etc,conf.d,services.d,var,run,log,ssl,gems}
    cat > "$d/etc/puppet.conf" <<EOF
[main]
certname = $n.$DOMAIN
server = puppetfb.$DOMAIN
ca_server = puppetca.$DOMAIN
ssldir = $d/ssl
vardir = $d/var
rundir = $d/run
logdir = $d/log
codedir = $W/code
cadir = $d/ca
autosign = false
# no modules beyond the environment's: Debian's /usr/share/puppet/modules would
# make every agent's first run a pluginsync of dozens of files
basemodulepath = $W/code/modules
EOF
    server_conf "$n" "$ip" "$3" "$QUEUE" "$RETRY_DELAY"
    # c1 is the CA; c2 compiles only (an enabled CA with an empty cadir makes a new
    # CA, whose Jetty then refuses every agent's certificate)
    [ "$n" = c1 ] || printf '%s\n' \
        puppetlabs.services.ca.certificate-authority-disabled-service/certificate-authority-disabled-service \
        puppetlabs.trapperkeeper.services.watcher.filesystem-watch-service/filesystem-watch-service \
        > "$d/services.d/ca.cfg"
}

site_build() {
    local alt="puppetca.$DOMAIN,puppetfb.$DOMAIN,puppetlc.$DOMAIN,puppetha.$DOMAIN,puppeths.$DOMAIN"
    mkdir -p "$W/code/environments/production/manifests" "$W/code/modules"
    # a catalog that takes a known time: generate() runs on the compiler while it compiles
    cat > "$W/code/environments/production/manifests/site.pp" <<EOF
node default {
  \$slow = generate('/bin/sleep', '$SLEEP')
  notify { "compiled for \${trusted['certname']}": }
}
EOF
    chmod -R a+rX "$W/code"
    master_conf c1 $IP_C1 "$J1"
    master_conf c2 $IP_C2 "$J2"
    puppetserver ca setup --config "$W/c1/etc/puppet.conf" --certname "c1.$DOMAIN" \
        --subject-alt-names "$alt,c1.$DOMAIN" > "$W/c1/log/ca-setup.log" 2>&1 ||
        { cat "$W/c1/log/ca-setup.log" >&2; die "ca setup"; }
    cp "$W/c1/ssl/certs/ca.pem" "$W/ca.pem"
    puppetserver ca generate --ca-client --config "$W/c1/etc/puppet.conf" --certname "c2.$DOMAIN" \
        --subject-alt-names "$alt,c2.$DOMAIN" >> "$W/c1/log/ca-generate.log" 2>&1 ||
        { tail -20 "$W/c1/log/ca-generate.log" >&2; die "ca generate c2"; }
    local names="lb.$DOMAIN" i
    for i in $(seq -f '%02g' 1 "$AGENTS"); do names="$names,h$i.$DOMAIN"; done
    puppetserver ca generate --ca-client --config "$W/c1/etc/puppet.conf" --certname "$names" \
        >> "$W/c1/log/ca-generate.log" 2>&1 ||
        { tail -20 "$W/c1/log/ca-generate.log" >&2; die "ca generate agents"; }
    install_cert c2 "$W/c1/ssl" "$W/c2/ssl" || die "c2 certificate"
    install_cert lb "$W/c1/ssl" "$W/lb" || die "lb certificate"
    local k=0
    for i in $(seq -f '%02g' 1 "$AGENTS"); do
        k=$((k + 1))
        agent_conf "h$i" "$k"
        # Puppet 7.23's agent cannot retry after a 503 with Retry-After: it closes
        # the connection, sleeps, then drains the old response from the closed
        # socket ("attempt to read body out of block"), so the request fails. A
        # refused node or catalog request fails the run, a refused report is only
        # logged, and a refused pluginsync request fails the run unless
        # ignore_plugin_errors (`pluginsync = false` does not help: Puppet 7 always
        # syncs). There are no plugins here: a failed pluginsync costs nothing.
        [ "$STRICT_PLUGINS" = 1 ] || echo "ignore_plugin_errors = true" >> "$W/agents/h$i/puppet.conf"
        install_cert "h$i" "$W/c1/ssl" "$W/agents/h$i/ssl" || die "agent h$i certificate"
    done
    log "site built: c1 ($J1 JRuby), c2 ($J2), $AGENTS agents, catalogs sleep ${SLEEP}s, queue $QUEUE, retry delay ${RETRY_DELAY}s"
}

# crossbar_feedback_yaml NAME: $W/crossbar.yaml with the admin endpoint ($ADMIN_FB),
# the defaults, and the feedback service as NAME on $VIP_FB: leastconn, sticky,
# `feedback: { kind: puppet }` with the compilers' queue; the herd's `fb` and the
# rolling bench's crossbar (a caller appends more services)
crossbar_feedback_yaml() {
    local health="check: https, path: /status/v1/simple/server, ca_file: $W/ca.pem, interval: 1s, timeout: 2s"
    cat > "$W/crossbar.yaml" <<EOF
admin:
  listen: $ADMIN_FB
defaults:
  timeouts: { client_hello: 5s, connect: 3s, idle: 30m, queue: 10s, shutdown: 5s }
  health: { $health }
services:
  $1:
    listen: ["$VIP_FB:8140"]
    names: ["puppetfb.$DOMAIN"]
    balance: leastconn
    stick: $STICK
    health: { server_name: puppetfb.$DOMAIN }
    feedback: { kind: puppet, queue_limit: $QUEUE }
    backends:
      - { name: c1, address: "c1.$DOMAIN:8140" }
      - { name: c2, address: "c2.$DOMAIN:8140" }
EOF
}
# the stickiness of the crossbar services: conf/puppet.yaml's keys
STICK="{ on: [session_id, ticket, psk, source], expire: 30m }"

# crossbar_start: check $W/crossbar.yaml (a setup error if crossbar refuses it), then
# run crossbar on it in the background
crossbar_start() {
    "$CROSSBAR" check -c "$W/crossbar.yaml" > "$W/crossbar-check.log" 2>&1 ||
        { cat "$W/crossbar-check.log" >&2; die "crossbar check"; }
    "$CROSSBAR" run -c "$W/crossbar.yaml" > "$W/crossbar.log" 2>&1 &
    PIDS[crossbar]=$!
}

# heap: 512 MiB per JRuby beyond the first is Puppet's sizing advice; a lab's code is small
heap() { echo "$(( 768 + 256 * $1 ))m"; }

# compiler_start NAME: start compiler c1 or c2 (its pid also in $W/NAME/pid)
compiler_start() {
    local j=$J1
    [ "$1" = c2 ] && j=$J2
    jvm_start "$1" "$(heap "$j")"
    echo "${PIDS[$1]}" > "$W/$1/pid"
}

# alive PID: the process runs (a zombie does not)
alive() {
    local s
    s=$(ps -o stat= -p "$1" 2>/dev/null) && [ "${s#Z}" = "$s" ]
}

# Seconds a puppetserver has to stop after TERM (as systemd's TimeoutStopSec
# would give it) before it is killed.
STOP_TIMEOUT=60

# compiler_restart NAME: what `systemctl restart puppetserver` does to compiler c1
# or c2: TERM, KILL after STOP_TIMEOUT, start again; then wait until it answers
# `running` (within JVM_START_TIMEOUT; 1 if not), printing how long it took
# ("== NAME restarted in S s"). It may run in another process
# (the RESTART command of packaging/rolling-restart, with these functions and the
# site's variables exported): the pid is read from and written to $W/NAME/pid, and
# pids_adopt takes it back into PIDS.
compiler_restart() {
    local n=$1 pid ip=$IP_C1 i t0
    local -A PIDS=()
    t0=$(date +%s%3N)
    [ "$n" = c2 ] && ip=$IP_C2
    pid=$(cat "$W/$n/pid") || return 1
    kill -TERM "$pid" 2>/dev/null
    for i in $(seq 1 $((STOP_TIMEOUT * 5))); do alive "$pid" || break; sleep 0.2; done
    if alive "$pid"; then
        kill -KILL "$pid" 2>/dev/null
        for i in $(seq 1 50); do alive "$pid" || break; sleep 0.2; done
    fi
    alive "$pid" && { echo "compiler_restart: $n (pid $pid) does not stop" >&2; return 1; }
    compiler_start "$n"
    jvm_wait "$n" "$ip" || return 1
    t0=$(( $(date +%s%3N) - t0 ))
    echo "== $n restarted in $((t0 / 1000)).$((t0 % 1000 / 100)) s (stop and start until running)"
}

site_start() {
    compiler_start c1
    compiler_start c2
    local t=$(date +%s)
    jvm_wait c1 $IP_C1 || die "c1 did not start within ${JVM_START_TIMEOUT}s (log: $W/c1/log)"
    jvm_wait c2 $IP_C2 || die "c2 did not start within ${JVM_START_TIMEOUT}s (log: $W/c2/log)"
    log "both compilers running after $(( $(date +%s) - t ))s"
    [ -n "$CAPTURE" ] && return 0 # the capture wants to see c2's pool fill
    # `running` comes with the first JRuby; the herd starts with full pools
    pools_full
    log "both pools full after $(( $(date +%s) - t ))s"
}

# pools_full: wait until every JRuby of both compilers is up and free (at most
# JVM_START_TIMEOUT seconds each; 1 if not)
pools_full() {
    local n j
    for n in c1 c2; do
        j=$J1; [ $n = c2 ] && j=$J2
        for _ in $(seq 1 $((JVM_START_TIMEOUT * 2))); do [ "$(pool $n)" = "$j $j" ] && continue 2; sleep 0.5; done
        log "WARNING: $n's pool not full after ${JVM_START_TIMEOUT}s ($(pool $n))"
        return 1
    done
}

# metrics NAME [CURL ARGS]: the jruby-metrics document of a compiler (anonymous by default)
metrics() {
    local n=$1; shift
    curl -s --max-time 5 --cacert "$W/ca.pem" "$@" \
        "https://$n.$DOMAIN:8140/status/v1/services/jruby-metrics?level=debug"
}
# catalog AGENT COMPILER: one catalog request with the agent's certificate; prints
# the status and the Retry-After header
catalog() {
    local d=$W/agents/$1/ssl
    curl -s --max-time 120 -o /dev/null -D - --cacert "$W/ca.pem" \
        --cert "$d/certs/$1.$DOMAIN.pem" --key "$d/private_keys/$1.$DOMAIN.pem" \
        -H 'X-Puppet-Version: 7.23.0' -H 'Accept: application/json' \
        "https://$2.$DOMAIN:8140/puppet/v3/catalog/$1.$DOMAIN?environment=production" |
        tr -d '\r' | awk 'NR == 1 { s = $2 } tolower($1) == "retry-after:" { r = $2 } END { print s, r }'
}

# free COMPILER [CURL ARGS]: num-jrubies and num-free-jrubies of its document ("3 1")
pool() {
    metrics "$@" | ruby -rjson -e 'm = JSON.parse(STDIN.read)["status"]["experimental"]["metrics"]
        puts "#{m["num-jrubies"]} #{m["num-free-jrubies"]}"' 2>/dev/null
}

# capture DIR: the documents tests/fixtures/jruby-metrics holds, from these servers
capture() {
    local dir=$1 i
    mkdir -p "$dir"
    metrics c1 > "$dir/idle-1-jruby.json"
    # A compiler reports `running` after its first JRuby; the others follow (the
    # pool's size is num-jrubies from the start, the missing ones neither free nor
    # borrowed): wait for all of c2's
    for _ in $(seq 1 600); do [ "$(pool c2)" = "$J2 $J2" ] && break; sleep 0.5; done
    metrics c2 > "$dir/idle-$J2-jrubies.json"
    # c1 saturated: more catalog requests at once than its JRuby and queue hold
    local jobs=()
    for i in $(seq -f '%02g' 1 8); do catalog "h$i" c1 > "$W/catalog-$i.out" & jobs+=($!); done
    local best=0 doc q
    for _ in $(seq 1 40); do
        doc=$(metrics c1)
        q=$(printf '%s' "$doc" | grep -o '"requested-instances":\[[^]]*\]' | grep -o '"time"' | wc -l)
        if [ "$q" -gt "$best" ]; then best=$q; printf '%s' "$doc" > "$dir/saturated-1-jruby.json"; fi
        sleep 0.2
    done
    wait "${jobs[@]}" # only these: the JVMs are children too
    metrics c1 > "$dir/after-503s-1-jruby.json"
    log "catalogs at once on c1 (status, Retry-After): $(cat "$W"/catalog-*.out | sort | uniq -c | tr '\n' ';')"
    # c2 restarted with the status service restricted to a certificate allowlist (as
    # PE sites do): anonymous is refused; the allowed certificate reads it, and what
    # it says while its pool fills
    stop_pid c2
    rm -f "$W/c2/pid"
    ruby -e '
      t = File.read(ARGV[0])
      rule = t.index("puppetlabs status service - full") or abort "no status rule in auth.conf"
      start = t.rindex("{", rule)
      t[start...rule] = t[start...rule].sub("allow-unauthenticated: true", "allow: [\"lb.'"$DOMAIN"'\"]")
      File.write(ARGV[0], t)' "$W/c2/conf.d/auth.conf" || die "auth.conf rule"
    compiler_start c2
    local seen="" now end=$(( $(date +%s) + JVM_START_TIMEOUT ))
    while [ "$(date +%s)" -lt $end ]; do
        now=$(pool c2 --cert "$W/lb/certs/lb.$DOMAIN.pem" --key "$W/lb/private_keys/lb.$DOMAIN.pem")
        if [ -n "$now" ] && [ "$now" != "$seen" ]; then
            seen=$now
            metrics c2 --cert "$W/lb/certs/lb.$DOMAIN.pem" --key "$W/lb/private_keys/lb.$DOMAIN.pem" > "$dir/starting-$J2-jrubies-${now#* }-free.json"
            [ "$now" = "$J2 $J2" ] && break
        fi
        sleep 0.2
    done
    curl -s --max-time 5 --cacert "$W/ca.pem" -o "$dir/refused-anonymous.body" -D "$dir/refused-anonymous.head" \
        "https://c2.$DOMAIN:8140/status/v1/services/jruby-metrics?level=debug"
    sed -i '/^Date: /d' "$dir/refused-anonymous.head"
    log "captured into $dir: $(ls "$dir" | tr '\n' ' ')"
}
