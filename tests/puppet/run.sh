#!/usr/bin/env bash
# End-to-end proof: real Debian puppetservers + puppet agents, unmodified,
# talking through crossbar on loopback. Results: docs/puppet.md "Verified with".
#
#   sudo tests/puppet/run.sh            # from the repository root, as root
#
# Two generations (PUPPET_GEN):
#   8 (default): Debian 13's puppetserver 8.7, PuppetDB 8.4, puppet-agent 8.10 and
#     OpenJDK 21, run from a trixie root tests/puppet/root8.sh builds with debootstrap
#     and caches (chroot; the root sees this machine's /tmp, /dev and /etc/hosts, and
#     shares its network). PostgreSQL 15, dnsmasq, openssl and curl are this machine's.
#     Two phases only Puppet 8 has: Debian 12's Puppet 7.23 agents against the Puppet 8
#     masters (a mixed fleet, as during an upgrade), and agents 8.10 in a network
#     namespace behind a 1500-byte MTU veth, whose 1515-byte ClientHellos reach crossbar
#     in two TCP segments (captured with tcpdump and counted).
#   7: Debian 12's puppetserver 7.9.5, PuppetDB 7.12 and puppet-agent 7.23, installed
#     on this machine.
#
# Environment:
#   PUPPET_GEN     8 (default) or 7
#   CROSSBAR_BIN   crossbar binary (default target/release/crossbar; built if missing)
#   KEEP=1         keep the work directory (logs, configs, certificates) afterwards
#   NO_INSTALL=1   fail instead of apt-get installing puppetserver/puppet-agent/puppetdb
#   INSTALL_ONLY=1 install them, then exit (.ci/run, before this runs beside other tests)
#   STOP_AFTER=X   stop after phase X (setup|doctor|bootstrap|runs|puppet7|feedback|file|certs|jdk|serverlist|sni|mtu|exported|failover)
#
# Topology (2 puppetserver JVMs and a PuppetDB JVM (-Xmx256m); docs/puppet.md "Verified with"):
#   ca1 (127.0.0.21:8140) primary CA + compile master 1 + file server 1
#   ca2 (127.0.0.22:8140) hot-standby CA (rsync copy of ca1's cadir) + compile 2 + files 2
#   crossbar VIPs: puppet 127.0.0.10, puppetca 127.0.0.11, puppetfiles 127.0.0.12 (:8140),
#     puppetdb 127.0.0.15 (the PuppetDB preset in front of ca1/ca2: JDK clients resume
#     their sessions through it, the Puppet Server -> PuppetDB pattern)
#   crossbar SNI variant: one shared listener 127.0.0.13:8140
#   a second crossbar whose only service has every backend down: 127.0.0.14:8140
#     (puppetdown.xb.test, the first entry of an agent's server_list)
#   compile3 (127.0.0.23:8140): openssl s_server with a Puppet-signed certificate
#     lacking the service names, for `crossbar doctor`'s error
#   agents a1..aN: own confdir/ssldir/vardir, sourceaddress 127.0.0.10N
#   JDK clients (tests/puppet/JdkResume.java): all from 127.0.0.150
#   pdb1 (127.0.0.31:8081): a real PuppetDB (Debian's puppetdb 7, PostgreSQL 15), its
#     certificate from the Puppet CA; the masters' terminus (puppet-terminus-puppetdb:
#     facts, catalogs, reports, storeconfigs) reaches it through a crossbar whose
#     `puppetdb` service (conf/puppet.yaml's preset) listens on puppetdb.xb.test:8081
#   lb (agent lb.xb.test): applies packaging/puppet/crossbar, which writes the config of
#     a third crossbar: `puppet` (puppetlb.xb.test, 127.0.0.16:8140) from the SRV
#     records a dnsmasq serves for the compilers (`discover`), `puppetdb` (taking over
#     127.0.0.15:8081 from the hand-written one) from the `@@crossbar::backend` pdb1's
#     own agent run exported, `puppetfiles` (127.0.0.17:8140) from the
#     `@@haproxy::balancermember`s the masters' agent runs exported
#     (crossbar::balancermembers); reloaded with `crossbar reload -c` (the unit's
#     ExecReload; no systemd here). Agents run through it.
# Prints "PASS name: figures" / "FAIL name: why" per check, then "N passed, M failed".
# Exit status: 0 when every check passed, 1 otherwise, 2 on a setup error.

set -uo pipefail

DOMAIN=xb.test
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CROSSBAR=${CROSSBAR_BIN:-$ROOT/target/release/crossbar}
VIP_PUPPET=127.0.0.10
VIP_CA=127.0.0.11
VIP_FILES=127.0.0.12
VIP_SNI=127.0.0.13
VIP_DOWN=127.0.0.14
VIP_PDB=127.0.0.15
VIP_LB=127.0.0.16
VIP_LBFILES=127.0.0.17
VIP_FB=127.0.0.18
IP_PDB1=127.0.0.31
IP_COMPILE3=127.0.0.23
IP_CA1=127.0.0.21
IP_CA2=127.0.0.22
ADMIN_PORT=19140
ADMIN_SNI_PORT=19141
ADMIN_DOWN_PORT=19142
ADMIN_PDB_PORT=19143
ADMIN_LB_PORT=19144
ADMIN_MTU_PORT=19145
ADMIN=http://127.0.0.1:$ADMIN_PORT
ADMIN_SNI=http://127.0.0.1:$ADMIN_SNI_PORT
ADMIN_DOWN=http://127.0.0.1:$ADMIN_DOWN_PORT
ADMIN_PDB=http://127.0.0.1:$ADMIN_PDB_PORT
ADMIN_LB=http://127.0.0.1:$ADMIN_LB_PORT
ADMIN_MTU=http://127.0.0.1:$ADMIN_MTU_PORT
# the 1500-byte MTU phase (Puppet 8): a veth pair, crossbar on this side, agents in a
# network namespace on the other (198.18.0.0/15: benchmarking addresses, never routed)
MTU=1500
MTU_VIP=198.18.81.1
MTU_AGENT_IP=198.18.81.2
MTU_VETH=xbmtu$$
MTU_AGENTS=2
PG_CLUSTER="15 main"
PDB_DB=xb_e2e_pdb
# An agent must give up on a balancer that holds a connection only after
# http_connect_timeout (Puppet's default: 2 minutes); the server_list failover
# must finish well before that: under half of it.
SERVER_LIST_LIMIT_MS=60000
NAGENTS=4
# the load feedback herd: agents at once through the puppetfb VIP, each catalog made
# HERD_SLEEP seconds slower (generate), on two compilers of different sizes
# (JRUBIES_CA1, JRUBIES_CA2) with a queue of HERD_QUEUE: more than their JRubies
# hold, so they queue. Not more than the queues hold: Puppet 7.23's agent fails a
# request it retries after a 503 (bench/herd-site.sh), so a refused catalog is a
# failed run
JRUBIES_CA1=1
JRUBIES_CA2=3
HERD=8
HERD_SLEEP=2
HERD_QUEUE=4
# Puppet 8: catalogs of 8 s (the bench's mid-sized site), so that a JRuby is held by
# the sleep more than by the CPU: at load ~16 a catalog of 2 s took 5-16 s to compile
[ "${PUPPET_GEN:-8}" = 8 ] && HERD_SLEEP=8
# JDK clients in parallel, each 1 full handshake + JDK_RESUMES resumption attempts,
# all from one source address (as a Puppet Server's pool of connections to PuppetDB)
JDK_CLIENTS=16
JDK_RESUMES=10
JDK_SRC=127.0.0.150
# resumed on the server of the client's full handshake, percent of attempts (#13)
JDK_KEPT_MIN_PCT=99
JVM_START_TIMEOUT=${JVM_START_TIMEOUT:-600}
HOSTS_BEGIN="# BEGIN crossbar-puppet-e2e $$"
HOSTS_END="# END crossbar-puppet-e2e $$"
FACTER_CONF=/etc/facter/facter.conf
# the masters log each request's authorization with its certname (check client-cert)
AUTH_TRACE=1
# Jetty's idle timeout on the masters: 10 s, not its 30 s. Every `puppet ssl
# bootstrap` sits twice in the known Ruby Net::HTTP + TLS 1.3 stall (PUPPET-NOTES)
# until Jetty closes the idle connection, and the run bootstraps in four rounds.
# Compiles are not cut: the timeout counts between requests (catalogs compiling for
# minutes pass Jetty's default 30 s on every site), and the herd's queue waits pass it.
JETTY_IDLE_MS=10000

T0=$(date +%s)
PASSED=0
FAILED=0
declare -A PIDS=()        # name -> pid of what this script started
CREATED_FACTER=0
MTU_NS=""             # the 1500-byte MTU phase's network namespace, once made
STARTED_PG=0
W=""

log() { printf '[%4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*" >&2; }
die() { log "SETUP ERROR: $*"; exit 2; }
# each line ends with the seconds since the start: where the run's time goes
pass() { PASSED=$((PASSED + 1)); echo "PASS $1: $2 [at $(( $(date +%s) - T0 ))s]"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL $1: $2 [at $(( $(date +%s) - T0 ))s]"; }
now_ms() { date +%s%3N; }

# ---------------------------------------------------------------- teardown
# stop_pid, hosts_remove, jvm_start, jvm_wait, server_conf, install_cert, agent_conf
# shellcheck source=tests/puppet/site.sh
source "$ROOT/tests/puppet/site.sh"
cleanup() {
    local rc=$?
    for n in "${!PIDS[@]}"; do stop_pid "$n"; done
    hosts_remove
    [ -n "$MTU_NS" ] && { ip link del "$MTU_VETH" 2>/dev/null; ip netns del "$MTU_NS" 2>/dev/null; }
    root_umount
    [ "$CREATED_FACTER" = 1 ] && rm -f "$FACTER_CONF" && rmdir /etc/facter 2>/dev/null
    if [ "$STARTED_PG" = 1 ]; then
        # shellcheck disable=SC2086
        pg_ctlcluster $PG_CLUSTER stop >/dev/null 2>&1
    fi
    if [ -n "$W" ] && [ -d "$W" ]; then
        if [ "${KEEP:-0}" = 1 ]; then log "kept $W"; else rm -rf "$W"; fi
    fi
    log "done in $(( $(date +%s) - T0 ))s"
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --------------------------------------------------------------- helpers
hosts_write() { # mode: vip | sni | lb (file content through the module-made balancer)
    hosts_remove
    local p=$VIP_PUPPET c=$VIP_CA f=$VIP_FILES
    [ "$1" = sni ] && p=$VIP_SNI c=$VIP_SNI f=$VIP_SNI
    [ "$1" = lb ] && f=$VIP_LBFILES
    {
        echo "$HOSTS_BEGIN"
        echo "$p puppet.$DOMAIN"
        echo "$c puppetca.$DOMAIN"
        echo "$f puppetfiles.$DOMAIN"
        echo "$VIP_DOWN puppetdown.$DOMAIN"
        echo "$VIP_PDB puppetdb.$DOMAIN"
        echo "$VIP_LB puppetlb.$DOMAIN"
        echo "$VIP_FB puppetfb.$DOMAIN"
        echo "$IP_PDB1 pdb1.$DOMAIN"
        echo "$IP_CA1 ca1.$DOMAIN"
        echo "$IP_CA2 ca2.$DOMAIN"
        echo "$MTU_VIP puppetmtu.$DOMAIN"
        echo "$MTU_VIP puppetcamtu.$DOMAIN"
        echo "$HOSTS_END"
    } >> /etc/hosts
}

# metric NAME LABEL-SUBSTRING... [ADMIN URL via $MURL]; prints the sum (0 if absent)
metric() {
    local name=$1; shift
    curl -s --max-time 5 "${MURL:-$ADMIN}/metrics" | grep -E "^$name[{ ]" |
        { local l; while IFS= read -r l; do
            local ok=1; for s in "$@"; do [[ $l == *"$s"* ]] || ok=0; done
            [ $ok = 1 ] && echo "${l##* }"; done; } |
        awk '{s+=$1} END {printf "%d\n", s}'
}
conns() { metric crossbar_connections_total "service=\"$1\"" "backend=\"$2\""; }
state() { # service backend -> current state name
    curl -s --max-time 5 "${MURL:-$ADMIN}/metrics" | grep -E '^crossbar_backend_state\{' |
        grep "service=\"$1\"" | grep "backend=\"$2\"" | grep -E ' 1(\.0)?$' |
        sed -E 's/.*state="([a-z]+)".*/\1/' | head -1
}
wait_state() { # service backend state timeout_s
    local end=$(( $(date +%s) + $4 ))
    while [ "$(date +%s)" -lt $end ]; do
        [ "$(state "$1" "$2")" = "$3" ] && return 0; sleep 0.5
    done
    return 1
}

# ------------------------------------------------------------ puppet site
master_conf() { # name ip certname alt_names
    local n=$1 ip=$2 d=$W/$1
    mkdir -p "$d"/{etc,conf.d,services.d,var,run,log,ssl,gems}
    cat > "$d/etc/puppet.conf" <<EOF
[main]
certname = $3
server = puppet.$DOMAIN
ca_server = puppetca.$DOMAIN
dns_alt_names = $4
ssldir = $d/ssl
vardir = $d/var
rundir = $d/run
logdir = $d/log
codedir = $W/code
cadir = $d/ca
autosign = $d/etc/autosign.conf
# PuppetDB (puppet-terminus-puppetdb), reached through crossbar's puppetdb service
storeconfigs = true
storeconfigs_backend = puppetdb
reports = puppetdb
EOF
    printf '[main]\nserver_urls = https://puppetdb.%s:8081\nsoft_write_failure = false\n' "$DOMAIN" > "$d/etc/puppetdb.conf"
    printf -- '---\nserver:\n  facts:\n    terminus: puppetdb\n    cache: yaml\nmaster:\n  facts:\n    terminus: puppetdb\n    cache: yaml\n' > "$d/etc/routes.yaml"
    echo "*.$DOMAIN" > "$d/etc/autosign.conf"
    chmod 644 "$d/etc/autosign.conf"
    # the feedback herd (check 2b): a short queue, and short retries after its 503s
    local jrubies=$JRUBIES_CA1; [ "$n" = ca2 ] && jrubies=$JRUBIES_CA2
    server_conf "$n" "$ip" "$jrubies" "$HERD_QUEUE" 5
}

agent() { # name args... (bounded)
    local n=$1; shift
    timeout 300 puppet "$@" --confdir "$W/agents/$n" --color false
}
agent_run() { # name [extra args]; prints the exit code, log into agents/NAME/run-K.log
    local n=$1; shift
    local k; k=$(ls "$W/agents/$n" | grep -c '^run-')
    agent "$n" agent -t "$@" > "$W/agents/$n/run-$k.log" 2>&1
    echo $?
}

# ------------------------------------------------------------- PuppetDB
pg_setup() { # the cluster started if it was down; a fresh database and user for pdb1
    # shellcheck disable=SC2086
    if ! pg_lsclusters -h | awk '{print $1, $2, $4}' | grep -q "^$PG_CLUSTER online"; then
        pg_ctlcluster $PG_CLUSTER start || return 1
        STARTED_PG=1
    fi
    PDB_PASS=$(openssl rand -hex 12)
    runuser -u postgres -- psql -q -v ON_ERROR_STOP=1 <<EOF || return 1
SET client_min_messages = warning;
DROP DATABASE IF EXISTS $PDB_DB;
DROP ROLE IF EXISTS $PDB_DB;
CREATE ROLE $PDB_DB LOGIN PASSWORD '$PDB_PASS';
CREATE DATABASE $PDB_DB OWNER $PDB_DB;
\\c $PDB_DB
CREATE EXTENSION pg_trgm;
EOF
}
pdb_conf() { # pdb1: its own config dir, TLS only, a certificate from the Puppet CA
    local d=$W/pdb1
    mkdir -p "$d"/{conf.d,var,log}
    cp "$PROOT/etc/puppetdb/conf.d/auth.conf" "$d/conf.d/"
    cat > "$d/conf.d/config.ini" <<EOF
[global]
vardir = $d/var
logging-config = $d/logback.xml
[command-processing]
threads = 1
EOF
    cat > "$d/conf.d/database.ini" <<EOF
[database]
subname = //127.0.0.1:5432/$PDB_DB
username = $PDB_DB
password = $PDB_PASS
EOF
    cat > "$d/conf.d/jetty.ini" <<EOF
[jetty]
ssl-host = $IP_PDB1
ssl-port = 8081
ssl-key = $d/ssl/private_keys/pdb1.$DOMAIN.pem
ssl-cert = $d/ssl/certs/pdb1.$DOMAIN.pem
ssl-ca-cert = $W/ca.pem
access-log-config = $d/request-logging.xml
EOF
    jvm_logging "$d" "$d/log" puppetdb
}
pdb_start() {
    local d=$W/pdb1
    printf 0 > "$d/restart"
    java -Xmx256m -XX:+UseSerialGC -cp /usr/share/puppetdb/puppetdb.jar clojure.main \
        -m puppetlabs.puppetdb.core services --config "$d/conf.d" \
        --bootstrap-config /etc/puppetdb/bootstrap.cfg --restart-file "$d/restart" \
        > "$d/log/stdout.log" 2>&1 &
    PIDS[pdb1]=$!
}
pdb_wait() { # until /status/v1/simple says running on pdb1 itself
    local d=$W/pdb1 end=$(( $(date +%s) + JVM_START_TIMEOUT ))
    while [ "$(date +%s)" -lt $end ]; do
        kill -0 "${PIDS[pdb1]}" 2>/dev/null || { tail -20 "$d/log/stdout.log" "$d/log/puppetdb.log" >&2; return 1; }
        if [ "$(head -c1 "$d/restart" 2>/dev/null)" = 1 ] &&
           [ "$(curl -s --max-time 5 --cacert "$W/ca.pem" --cert "$LB_CERT" --key "$LB_KEY" \
                "https://pdb1.$DOMAIN:8081/status/v1/simple")" = running ]; then
            return 0
        fi
        sleep 1
    done
    return 1
}
pdb_query() { # PATH [curl args]: a PuppetDB query through crossbar's puppetdb VIP, with ca1's certificate
    local p=$1; shift
    curl -s --max-time 30 --cacert "$W/ca.pem" --cert "$W/ca1/ssl/certs/ca1.$DOMAIN.pem" \
        --key "$W/ca1/ssl/private_keys/ca1.$DOMAIN.pem" "https://puppetdb.$DOMAIN:8081$p" "$@"
}
pdb_count() { # PATH [curl args]: how many results (an object counts 1 if it names a certname)
    pdb_query "$@" | ruby -rjson -e 'd = JSON.parse($stdin.read) rescue (puts 0; exit)
        puts(d.is_a?(Array) ? d.size : (d.is_a?(Hash) && d["certname"] ? 1 : 0))'
}

# ================================================================== setup
[ "$(id -u)" = 0 ] || die "run as root (installs packages, edits /etc/hosts)"
PUPPET_GEN=${PUPPET_GEN:-8}
PROOT=""   # Puppet 8: the trixie root its masters, PuppetDB and agents run from
if [ "$PUPPET_GEN" = 8 ]; then
    # this machine's part: Puppet 7 agents (the compatibility phase; their Ruby runs
    # this script's JSON one-liners), PostgreSQL 15 for PuppetDB 8.4, the JDK that
    # compiles JdkResume.java, tcpdump and ethtool for the 1500-byte MTU phase, debootstrap
    PKGS="puppet-agent rsync postgresql dnsmasq-base openjdk-17-jdk-headless tcpdump ethtool debootstrap"
    if ! command -v puppet >/dev/null || ! command -v rsync >/dev/null || ! command -v pg_ctlcluster >/dev/null ||
       [ ! -x /usr/sbin/dnsmasq ] || ! command -v javac >/dev/null || ! command -v tcpdump >/dev/null || ! command -v ethtool >/dev/null ||
       ! command -v debootstrap >/dev/null; then
        [ "${NO_INSTALL:-0}" = 1 ] && die "not installed: some of $PKGS"
        log "installing $PKGS"
        # shellcheck disable=SC2086
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y $PKGS >/dev/null 2>&1 ||
            { apt-get -o DPkg::Lock::Timeout=900 update >/dev/null 2>&1 &&
              DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y $PKGS >/dev/null 2>&1; } ||
            die "apt-get install $PKGS failed"
    fi
    PROOT=$("$ROOT/tests/puppet/root8.sh") || die "the Puppet 8 root (tests/puppet/root8.sh)"
    [ "${INSTALL_ONLY:-0}" = 1 ] && { log "installed: $PKGS; Puppet 8 root $PROOT"; exit 0; }
elif [ "$PUPPET_GEN" != 7 ]; then
    die "PUPPET_GEN=$PUPPET_GEN: 7 or 8"
fi
PKGS="puppetserver puppet-agent rsync puppetdb postgresql puppet-terminus-puppetdb puppet-module-puppetlabs-stdlib puppet-module-puppetlabs-concat puppet-module-puppetlabs-haproxy dnsmasq-base"
if [ "$PUPPET_GEN" = 7 ] && { ! command -v puppet >/dev/null || ! command -v rsync >/dev/null || [ ! -f /usr/share/puppetserver/puppetserver.jar ] ||
   [ ! -f /usr/share/puppetdb/puppetdb.jar ] || ! command -v pg_ctlcluster >/dev/null ||
   [ ! -f /usr/lib/ruby/vendor_ruby/puppet/indirector/catalog/puppetdb.rb ] || [ ! -d /usr/share/puppet/modules/concat ] ||
   [ ! -d /usr/share/puppet/modules/haproxy ] || [ ! -x /usr/sbin/dnsmasq ]; }; then
    [ "${NO_INSTALL:-0}" = 1 ] && die "not installed: some of $PKGS"
    log "installing $PKGS"
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y $PKGS >/dev/null 2>&1 ||
        { apt-get -o DPkg::Lock::Timeout=900 update >/dev/null 2>&1 &&
          DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y $PKGS >/dev/null 2>&1; } ||
        die "apt-get install $PKGS failed"
fi
[ "${INSTALL_ONLY:-0}" = 1 ] && { log "installed: $PKGS"; exit 0; }
if [ ! -x "$CROSSBAR" ]; then
    log "building crossbar"; (cd "$ROOT" && cargo build --release >/dev/null 2>&1) || die "cargo build failed"
fi
for c in curl rsync java javac openssl; do command -v $c >/dev/null || die "$c missing"; done
if [ ! -e "$FACTER_CONF" ]; then
    mkdir -p /etc/facter
    echo 'facts : { blocklist : [ "EC2", "GCE", "az_metadata", "cloud" ] }' > "$FACTER_CONF"
    CREATED_FACTER=1
fi

W=$(mktemp -d /tmp/crossbar-puppet.XXXXXX)
chmod 755 "$W"
if [ "$PUPPET_GEN" = 8 ]; then
    # puppet, puppetserver, facter and java run from the root (same paths: it sees /tmp)
    root_enter || die "entering the Puppet 8 root $PROOT"
    # the module runs `crossbar check` from the lb agent's catalog, inside the root
    cp "$CROSSBAR" "$W/crossbar" || die "copying $CROSSBAR"
    CROSSBAR=$W/crossbar
fi
# PuppetDB asks every client for a certificate (client-auth need): crossbar's health
# check and this script present the balancer node's (lb.$DOMAIN, from the Puppet CA)
LB_CERT=$W/agents/lb/ssl/certs/lb.$DOMAIN.pem
LB_KEY=$W/agents/lb/ssl/private_keys/lb.$DOMAIN.pem
javac -d "$W/java" "$ROOT/tests/puppet/JdkResume.java" > "$W/javac.log" 2>&1 || { cat "$W/javac.log" >&2; die "javac JdkResume.java"; }
pkgver() { if [ -n "$PROOT" ]; then chroot "$PROOT" dpkg-query -W -f='${Version}' "$1"; else dpkg-query -W -f='${Version}' "$1"; fi; }
V_SERVER=$(pkgver puppetserver); V_PDB=$(pkgver puppetdb); V_AGENT=$(puppet --version)
log "work dir $W (Puppet $PUPPET_GEN: agent $V_AGENT, puppetserver $V_SERVER, puppetdb $V_PDB)"
# under the lock no other run is under way: a block another run left is stale
hosts_remove_stale crossbar-puppet-e2e
hosts_write vip
# DNS for `discover`: Puppet's SRV records for the compile servers, from a dnsmasq on
# a free loopback port that serves nothing else
DNS_PORT=$(ruby -rsocket -e 'puts TCPServer.new("127.0.0.1", 0).addr[1]')
mkdir -p "$W/dns"
cat > "$W/dns/dnsmasq.conf" <<EOF
port=$DNS_PORT
listen-address=127.0.0.1
bind-interfaces
no-resolv
no-hosts
user=root
pid-file=
local=/$DOMAIN/
srv-host=_x-puppet._tcp.$DOMAIN,ca1.$DOMAIN,8140,10,1
srv-host=_x-puppet._tcp.$DOMAIN,ca2.$DOMAIN,8140,10,1
host-record=ca1.$DOMAIN,$IP_CA1
host-record=ca2.$DOMAIN,$IP_CA2
EOF
/usr/sbin/dnsmasq --keep-in-foreground --conf-file="$W/dns/dnsmasq.conf" > "$W/dns/dnsmasq.log" 2>&1 &
PIDS[dnsmasq]=$!
for _ in $(seq 1 50); do (exec 3<>"/dev/tcp/127.0.0.1/$DNS_PORT") 2>/dev/null && break; sleep 0.1; done
kill -0 "${PIDS[dnsmasq]}" 2>/dev/null || die "dnsmasq did not start: $(cat "$W/dns/dnsmasq.log")"

# code: one environment, one node definition, one file served by puppetfiles
TOKEN=$(openssl rand -hex 12)
mkdir -p "$W/code/environments/production/"{manifests,modules/demo/files} "$W/out"
printf 'hello from crossbar e2e %s\n' "$TOKEN" > "$W/code/environments/production/modules/demo/files/hello.txt"
cat > "$W/code/environments/production/manifests/site.pp" <<EOF
# the feedback herd's agents: a catalog that takes a known time (generate runs on the compiler)
node /^herd\\d+\\.$DOMAIN\$/ {
  \$slow = generate('/bin/sleep', '$HERD_SLEEP')
  notify { "compiled for \${trusted['certname']}": }
}
# the 1500-byte MTU phase's agents: no file (puppetfiles is not reachable from their
# network namespace)
node /^m\\d+\\.$DOMAIN\$/ {
  notify { "compiled for \${trusted['certname']} behind an MTU of $MTU": }
}
node default {
  file { "$W/out/\${trusted['certname']}.txt":
    ensure => file,
    source => 'puppet://puppetfiles.$DOMAIN/modules/demo/hello.txt',
  }
}
# the compile servers' own agent runs export themselves as file servers the way a
# site on puppetlabs-haproxy does (stored in PuppetDB)
node /^ca[12]\\.$DOMAIN\$/ {
  \$ip = { 'ca1.$DOMAIN' => '$IP_CA1', 'ca2.$DOMAIN' => '$IP_CA2' }
  @@haproxy::balancermember { "files-\${trusted['certname']}":
    listening_service => 'puppetfiles00',
    server_names      => \$trusted['certname'],
    ipaddresses       => \$ip[\$trusted['certname']],
    ports             => '8140',
    options           => ['check'],
    tag               => 'xb-e2e',
  }
}
# the PuppetDB node exports itself, named after its certname
node 'pdb1.$DOMAIN' {
  @@crossbar::backend { "puppetdb/\${trusted['certname']}":
    address => "\${trusted['certname']}:8081",
    tag     => 'xb-e2e',
  }
}
# the balancer: the module finds the compilers in DNS, collects PuppetDB and the file
# servers, and writes (and checks) crossbar's config
node 'lb.$DOMAIN' {
  class { 'crossbar':
    manage_package => false,
    manage_service => false, # no systemd here: the test reloads with crossbar reload -c
    config_file    => '$W/lb/crossbar.yaml',
    config_group   => 'root',
    binary         => '$CROSSBAR',
    ca_source      => '$W/agents/lb/ssl/certs/ca.pem', # this node's own agent CA
    ca_file        => '$W/lb/puppet-ca.pem',
    files          => { # PuppetDB asks for a client certificate: this node's own
      '$W/lb/client.pem' => { 'source' => '$LB_CERT' },
      '$W/lb/client.key' => { 'source' => '$LB_KEY' },
    },
    admin          => { 'listen' => '127.0.0.1:$ADMIN_LB_PORT' },
    defaults       => {
      'timeouts' => { 'shutdown' => '5s' },
      'health'   => {
        'check' => 'https', 'ca_file' => '$W/lb/puppet-ca.pem', 'interval' => '1s', 'timeout' => '3s', 'rise' => 2, 'fall' => 2,
      },
    },
    services       => {
      'puppet'      => {
        'preset'   => 'puppet',
        'listen'   => ['$VIP_LB:8140'],
        'names'    => ['puppetlb.$DOMAIN'],
        'balance'  => 'roundrobin', # spreads the test's few agents over the pool
        'stick'    => { 'on' => ['session_id', 'ticket', 'psk'], 'state_file' => '$W/lb/puppet.table' },
        'health'   => { 'server_name' => 'puppetlb.$DOMAIN' },
        'discover' => { 'srv' => '_x-puppet._tcp.$DOMAIN', 'resolvers' => ['127.0.0.1:$DNS_PORT'], 'min_ttl' => '1s', 'max_ttl' => '5s' },
      },
      'puppetdb'    => {
        'preset' => 'puppetdb',
        'listen' => ['$VIP_PDB:8081'],
        'names'  => ['puppetdb.$DOMAIN'],
        'health' => {
          'server_name' => 'puppetdb.$DOMAIN', 'client_cert' => '$W/lb/client.pem', 'client_key' => '$W/lb/client.key',
        },
      },
      'puppetfiles' => {
        'preset' => 'puppetfiles',
        'listen' => ['$VIP_LBFILES:8140'],
        'names'  => ['puppetfiles.$DOMAIN'],
        'health' => { 'server_name' => 'puppetfiles.$DOMAIN' },
      },
    },
    collect_tag    => 'xb-e2e',
  }
  # the masters' exports for puppetlabs-haproxy, as they are
  crossbar::balancermembers { 'puppetfiles00': service => 'puppetfiles', collect_tag => 'xb-e2e' }
}
EOF
# the module under test, with stdlib, concat and haproxy (whose define the masters
# export) from Debian
# (Debian's module dirs are links through /etc/alternatives: resolved in the root they
# belong to)
cp -r "$ROOT/packaging/puppet/crossbar" "$W/code/environments/production/modules/"
for m in stdlib concat haproxy; do
    if [ -n "$PROOT" ]; then src=$PROOT$(chroot "$PROOT" readlink -f "/usr/share/puppet/modules/$m"); else src=$(readlink -f "/usr/share/puppet/modules/$m"); fi
    cp -r "$src" "$W/code/environments/production/modules/$m" || die "module $m ($src)"
done
mkdir -p "$W/lb"
chmod -R a+rX "$W/code"

ALT="puppetca.$DOMAIN,puppet.$DOMAIN,puppetfiles.$DOMAIN,puppetdb.$DOMAIN,puppetlb.$DOMAIN,puppetfb.$DOMAIN,puppetmtu.$DOMAIN,puppetcamtu.$DOMAIN"
master_conf ca1 $IP_CA1 "ca1.$DOMAIN" "$ALT,ca1.$DOMAIN"
master_conf ca2 $IP_CA2 "ca2.$DOMAIN" "$ALT,ca2.$DOMAIN"
# primary CA, offline: root + intermediate, ca1's host cert with every service name
puppetserver ca setup --config "$W/ca1/etc/puppet.conf" --certname "ca1.$DOMAIN" \
    --subject-alt-names "$ALT" > "$W/ca1/log/ca-setup.log" 2>&1 || { cat "$W/ca1/log/ca-setup.log" >&2; die "ca setup"; }
# ca2's host cert, signed offline by the same CA before the copy (so both agree on serials)
puppetserver ca generate --ca-client --config "$W/ca1/etc/puppet.conf" --certname "ca2.$DOMAIN" \
    --subject-alt-names "$ALT" > "$W/ca2/log/ca-generate.log" 2>&1 || { cat "$W/ca2/log/ca-generate.log" >&2; die "ca generate ca2"; }
# compile3: a compiler certificate signed by the same CA but WITHOUT the service
# names in its SANs (no --subject-alt-names): `crossbar doctor` must flag it
puppetserver ca generate --ca-client --config "$W/ca1/etc/puppet.conf" --certname "compile3.$DOMAIN" \
    > "$W/ca1/log/ca-generate-compile3.log" 2>&1 || { cat "$W/ca1/log/ca-generate-compile3.log" >&2; die "ca generate compile3"; }
mkdir -p "$W/compile3/status/v1"
cp "$W/ca1/ssl/certs/compile3.$DOMAIN.pem" "$W/compile3/cert.pem" &&
    cp "$W/ca1/ssl/private_keys/compile3.$DOMAIN.pem" "$W/compile3/key.pem" ||
    die "compile3 certificate not where expected"
echo running > "$W/compile3/status/v1/simple"
# pdb1 (PuppetDB: dialed as puppetdb.$DOMAIN through crossbar) and the balancer node lb
puppetserver ca generate --ca-client --config "$W/ca1/etc/puppet.conf" --certname "pdb1.$DOMAIN" \
    --subject-alt-names "puppetdb.$DOMAIN,pdb1.$DOMAIN" > "$W/ca1/log/ca-generate-pdb1.log" 2>&1 ||
    { cat "$W/ca1/log/ca-generate-pdb1.log" >&2; die "ca generate pdb1"; }
puppetserver ca generate --ca-client --config "$W/ca1/etc/puppet.conf" --certname "lb.$DOMAIN" \
    > "$W/ca1/log/ca-generate-lb.log" 2>&1 || { cat "$W/ca1/log/ca-generate-lb.log" >&2; die "ca generate lb"; }
install_cert pdb1 "$W/ca1/ssl" "$W/pdb1/ssl" || die "pdb1 certificate not where expected"
install_cert lb "$W/ca1/ssl" "$W/agents/lb/ssl" || die "lb certificate not where expected"
# the feedback herd's agents, signed offline in one call (a bootstrap each would cost
# the ~30 s Net::HTTP + TLS 1.3 stall, PUPPET-NOTES)
HERD_NAMES=$(seq -f "herd%g.$DOMAIN" 1 $HERD | paste -sd,)
puppetserver ca generate --ca-client --config "$W/ca1/etc/puppet.conf" --certname "$HERD_NAMES" \
    > "$W/ca1/log/ca-generate-herd.log" 2>&1 || { cat "$W/ca1/log/ca-generate-herd.log" >&2; die "ca generate herd"; }
for i in $(seq 1 $HERD); do
    agent_conf herd$i $((20 + i))
    # Puppet 7.23's agent fails every request it retries after a 503
    # (bench/herd-site.sh), and Puppet 7 ignores `pluginsync = false`: a herd
    # agent's failed pluginsync does not end its run (its catalog needs no plugin)
    echo "ignore_plugin_errors = true" >> "$W/agents/herd$i/puppet.conf"
    install_cert herd$i "$W/ca1/ssl" "$W/agents/herd$i/ssl" || die "herd$i certificate not where expected"
done
mkdir -p "$W/ca2/ssl/"{certs,private_keys,public_keys}
mv "$W/ca1/ssl/certs/ca2.$DOMAIN.pem" "$W/ca2/ssl/certs/"
mv "$W/ca1/ssl/private_keys/ca2.$DOMAIN.pem" "$W/ca2/ssl/private_keys/"
mv "$W/ca1/ssl/public_keys/ca2.$DOMAIN.pem" "$W/ca2/ssl/public_keys/" 2>/dev/null
cp "$W/ca1/ssl/certs/ca.pem" "$W/ca2/ssl/certs/"
cp "$W/ca1/ssl/crl.pem" "$W/ca2/ssl/"
# hot standby: an rsync copy of the primary's cadir, made before it first starts
rsync -a --delete "$W/ca1/ca/" "$W/ca2/ca/"
cp "$W/ca1/ssl/certs/ca.pem" "$W/ca.pem"
pg_setup || die "PostgreSQL: cluster $PG_CLUSTER or database $PDB_DB"
pdb_conf
log "site built; starting ca1, ca2 and pdb1 (PuppetDB) JVMs"

jvm_start ca1
jvm_start ca2 1536m   # 3 JRubies (JRUBIES_CA2)
pdb_start
T_JVM=$(date +%s)
jvm_wait ca1 $IP_CA1 || die "ca1 did not start within ${JVM_START_TIMEOUT}s (log: $W/ca1/log)"
jvm_wait ca2 $IP_CA2 || die "ca2 did not start within ${JVM_START_TIMEOUT}s (log: $W/ca2/log)"
JVM_SECS=$(( $(date +%s) - T_JVM ))
pdb_wait || die "pdb1 did not start within ${JVM_START_TIMEOUT}s (log: $W/pdb1/log)"
PDB_SECS=$(( $(date +%s) - T_JVM ))
log "both masters running after ${JVM_SECS}s, PuppetDB after ${PDB_SECS}s"

# ------------------------------------------------------- crossbar configs
# timeout 10s: a puppetserver compiling on every JRuby of a starved machine can leave
# a ClientHello unanswered for over 3 s (2026-12-05, Puppet 8 run at load ~18: ca2, 3
# JRubies in the herd, down for 2 s on every service at once, "no answer to the
# ClientHello", and the herd's source entries re-learned on ca1); a stopped JVM
# refuses at once, so failover is not slower
HEALTH="check: https, path: /status/v1/simple, expect_status: 200, expect_body: running, ca_file: $W/ca.pem, interval: 1s, timeout: 10s, rise: 2, fall: 2"
cat > "$W/crossbar.yaml" <<EOF
# crossbar in front of two puppetservers, one VIP per service (docs/puppet.md)
admin:
  listen: 127.0.0.1:$ADMIN_PORT
defaults:
  timeouts: { client_hello: 5s, connect: 3s, idle: 30m, queue: 10s, shutdown: 5s }
  health: { $HEALTH }
  retries: 2
services:
  puppetca:
    listen: ["$VIP_CA:8140"]
    names: ["puppetca.$DOMAIN"]
    balance: first
    failback: manual
    health: { server_name: puppetca.$DOMAIN }
    backends:
      - { name: ca1, address: "ca1.$DOMAIN:8140" }
      - { name: ca2, address: "ca2.$DOMAIN:8140", backup: true }
  puppet:
    listen: ["$VIP_PUPPET:8140"]
    names: ["puppet.$DOMAIN"]
    balance: leastconn
    stick:
      on: [session_id, ticket, psk, source]
      expire: 30m
    health: { server_name: puppet.$DOMAIN }
    backends:
      - { name: compile1, address: "ca1.$DOMAIN:8140" }
      - { name: compile2, address: "ca2.$DOMAIN:8140" }
  # the compilers again, with load feedback from their JRuby metrics (check 2b)
  puppetfb:
    listen: ["$VIP_FB:8140"]
    names: ["puppetfb.$DOMAIN"]
    balance: leastconn
    stick:
      on: [session_id, ticket, psk, source]
      expire: 30m
    health: { server_name: puppetfb.$DOMAIN }
    feedback: { kind: puppet, queue_limit: $HERD_QUEUE }
    backends:
      - { name: compile1, address: "ca1.$DOMAIN:8140" }
      - { name: compile2, address: "ca2.$DOMAIN:8140" }
  puppetfiles:
    listen: ["$VIP_FILES:8140"]
    names: ["puppetfiles.$DOMAIN"]
    health: { server_name: puppetfiles.$DOMAIN }
    backends:
      - { name: files1, address: "ca1.$DOMAIN:8140" }
      - { name: files2, address: "ca2.$DOMAIN:8140" }
  # conf/puppet.yaml's PuppetDB preset (session keys, no source) in front of the two
  # puppetservers, each Jetty on Java 17 with its own certificate, as two PuppetDBs
  puppetdb:
    listen: ["$VIP_PDB:8140"]
    names: ["puppetdb.$DOMAIN"]
    balance: leastconn
    stick:
      on: [session_id, ticket, psk]
      expire: 30m
    health: { server_name: puppetdb.$DOMAIN }
    backends:
      - { name: pdb1, address: "ca1.$DOMAIN:8140" }
      - { name: pdb2, address: "ca2.$DOMAIN:8140" }
EOF
cat > "$W/crossbar-sni.yaml" <<EOF
# the same three services on ONE shared listener, routed by the SNI agents send
admin:
  listen: 127.0.0.1:$ADMIN_SNI_PORT
defaults:
  timeouts: { client_hello: 5s, connect: 3s, idle: 30m, queue: 10s, shutdown: 5s }
  health: { $HEALTH }
services:
  puppetca:
    listen: ["$VIP_SNI:8140"]
    server_names: ["puppetca.$DOMAIN"]
    balance: first
    failback: manual
    backends:
      - { name: ca1, address: "ca1.$DOMAIN:8140" }
      - { name: ca2, address: "ca2.$DOMAIN:8140", backup: true }
  puppet:
    listen: ["$VIP_SNI:8140"]
    server_names: ["puppet.$DOMAIN"]
    default: true
    balance: leastconn
    stick: { on: [session_id, ticket, psk, source] }
    backends:
      - { name: compile1, address: "ca1.$DOMAIN:8140" }
      - { name: compile2, address: "ca2.$DOMAIN:8140" }
  puppetfiles:
    listen: ["$VIP_SNI:8140"]
    server_names: ["puppetfiles.$DOMAIN"]
    backends:
      - { name: files1, address: "ca1.$DOMAIN:8140" }
      - { name: files2, address: "ca2.$DOMAIN:8140" }
EOF
cat > "$W/crossbar-down.yaml" <<EOF
# a second balancer VIP whose only service has every backend down (nothing listens
# on :8141): agents with it first in server_list must move on at once
admin:
  listen: 127.0.0.1:$ADMIN_DOWN_PORT
services:
  puppet:
    listen: ["$VIP_DOWN:8140"]
    health: { check: tcp, interval: 1s, timeout: 1s, rise: 2, fall: 1 }
    backends:
      - { name: compile1, address: "$IP_CA1:8141" }
      - { name: compile2, address: "$IP_CA2:8141" }
EOF
cat > "$W/doctor-compile3.yaml" <<EOF
# the puppet pool with compile3, whose certificate lacks puppet.$DOMAIN
admin: { enabled: false }
services:
  puppet:
    listen: ["$VIP_PUPPET:8140"]
    names: ["puppet.$DOMAIN"]
    balance: leastconn
    backends:
      - { name: compile1, address: "ca1.$DOMAIN:8140" }
      - { name: compile3, address: "$IP_COMPILE3:8140" }
EOF
cat > "$W/crossbar-pdb.yaml" <<EOF
# conf/puppet.yaml's puppetdb preset in front of the real PuppetDB: the masters'
# terminus (Puppet Server's JDK client) dials puppetdb.$DOMAIN:8081
admin:
  listen: 127.0.0.1:$ADMIN_PDB_PORT
services:
  puppetdb:
    listen: ["$VIP_PDB:8081"]
    names: ["puppetdb.$DOMAIN"]
    balance: leastconn
    stick: { on: [session_id, ticket, psk], expire: 30m }
    health:
      check: https
      path: /status/v1/simple
      ca_file: $W/ca.pem
      client_cert: $LB_CERT             # PuppetDB wants a client certificate
      client_key: $LB_KEY
      server_name: puppetdb.$DOMAIN
      interval: 1s
      timeout: 3s
      rise: 2
      fall: 2
    backends:
      - { name: pdb1, address: "pdb1.$DOMAIN:8081" }
EOF
for f in crossbar crossbar-sni crossbar-down doctor-compile3 crossbar-pdb; do
    "$CROSSBAR" check -c "$W/$f.yaml" > "$W/$f.check" 2>&1 || { cat "$W/$f.check" >&2; die "crossbar check $f.yaml"; }
done
"$CROSSBAR" run -c "$W/crossbar.yaml" > "$W/crossbar.log" 2>&1 &
PIDS[crossbar]=$!
for _ in $(seq 1 50); do curl -sf --max-time 1 "$ADMIN/healthz" >/dev/null && break; sleep 0.2; done
curl -sf --max-time 2 "$ADMIN/healthz" >/dev/null || die "crossbar did not come up (log: $W/crossbar.log)"
for b in "puppetca ca1" "puppetca ca2" "puppet compile1" "puppet compile2" "puppetdb pdb1" "puppetdb pdb2"; do
    wait_state $b up 20 || die "crossbar: $b not up: $(state $b) (log: $W/crossbar.log)"
done
"$CROSSBAR" run -c "$W/crossbar-pdb.yaml" > "$W/crossbar-pdb.log" 2>&1 &
PIDS[crossbar_pdb]=$!
for _ in $(seq 1 50); do curl -sf --max-time 1 "$ADMIN_PDB/healthz" >/dev/null && break; sleep 0.2; done
MURL=$ADMIN_PDB wait_state puppetdb pdb1 up 20 || die "crossbar-pdb: pdb1 not up (log: $W/crossbar-pdb.log)"
log "crossbar up; setup took $(( $(date +%s) - T0 ))s"
[ "${STOP_AFTER:-}" = setup ] && exit 0

# ============================================================== checks
# 0. crossbar doctor against the real puppetservers: a clean report (exit 0)...
t=$(now_ms)
"$CROSSBAR" doctor -c "$W/crossbar.yaml" --status > "$W/doctor.txt" 2> "$W/doctor.err"; drc=$?
dms=$(( $(now_ms) - t ))
"$CROSSBAR" doctor -c "$W/crossbar.yaml" --format json > "$W/doctor.json" 2>&1
dcerts=$(grep -c '"subject": "CN=ca[12].xb.test"' "$W/doctor.json")
# the puppetfb service's load feedback, polled as `run` polls it: answered by both
dfb=$(ruby -rjson -e 'puts JSON.parse(File.read(ARGV[0]))["backends"].count { |b| (b["feedback"] || {})["ok"] }' "$W/doctor.json")
if [ $drc = 0 ] && grep -q "0 error(s), 0 warning(s): exit 0" "$W/doctor.txt" && [ "$dcerts" -ge 8 ] && [ "$dfb" = 2 ] &&
   grep -q "info     puppetca: ca1 and ca2 serve the same CA certificate" "$W/doctor.txt"; then
    pass doctor-clean "crossbar doctor --status: exit $drc in ${dms}ms, 10 backends, $dcerts leaf certificates read, ca1 and ca2 serve the same CA certificate, jruby-metrics answered by $dfb compilers"
else
    fail doctor-clean "exit $drc; feedback answered by ${dfb:-?}; report: $(tr '\n' '|' < "$W/doctor.txt") $(head -c 500 "$W/doctor.err")"
fi
sed 's/^/  doctor| /' "$W/doctor.txt" >&2
# ... and against compile3, whose Puppet-signed certificate lacks puppet.$DOMAIN: an error
(cd "$W/compile3" && exec openssl s_server -quiet -WWW -accept "$IP_COMPILE3:8140" \
     -cert cert.pem -key key.pem) < /dev/null > "$W/compile3/s_server.log" 2>&1 &
PIDS[compile3]=$!
for _ in $(seq 1 50); do curl -sk --max-time 1 -o /dev/null "https://$IP_COMPILE3:8140/status/v1/simple" && break; sleep 0.2; done
"$CROSSBAR" doctor -c "$W/doctor-compile3.yaml" > "$W/doctor-compile3.txt" 2>&1; drc=$?
stop_pid compile3
if [ $drc = 2 ] && grep -q "ERROR    puppet/compile3: \`puppet.$DOMAIN\` is not in the certificate's subject alternative names" "$W/doctor-compile3.txt" &&
   grep -q "dns_alt_names" "$W/doctor-compile3.txt" && ! grep -q "ERROR    puppet/compile1" "$W/doctor-compile3.txt"; then
    pass doctor-missing-name "compile3 ($(grep -o "subject alternative names ([^)]*)" "$W/doctor-compile3.txt" | head -1)): exit $drc, the error names puppet.$DOMAIN and the dns_alt_names fix; compile1 clean"
else
    fail doctor-missing-name "exit $drc; report: $(tr '\n' '|' < "$W/doctor-compile3.txt")"
fi
[ "${STOP_AFTER:-}" = doctor ] && exit

# 1. bootstrap through the puppetca listener
names=()
for i in $(seq 1 $NAGENTS); do names+=("a$i"); agent_conf "a$i" "$i"; done
# All at once: each bootstrap sits ~30s in the known Ruby Net::HTTP + TLS 1.3 +
# Jetty stall (PUPPET-NOTES) until Jetty's idle timeout; in parallel they overlap.
# d1 bootstraps at the same time straight against ca1 (no crossbar) for comparison.
agent_conf d1 9
sed -i "s/^ca_server = .*/ca_server = ca1.$DOMAIN/" "$W/agents/d1/puppet.conf"
ok=0; BDURS=(); bpids=()
for n in "${names[@]}" d1; do
    ( t=$(now_ms); agent "$n" ssl bootstrap > "$W/agents/$n/bootstrap.log" 2>&1
      echo $(( $(now_ms) - t )) > "$W/agents/$n/bootstrap.ms") &
    bpids+=($!)
done
wait "${bpids[@]}"
for n in "${names[@]}"; do
    [ -s "$W/agents/$n/ssl/certs/$n.$DOMAIN.pem" ] && ok=$((ok + 1))
    BDURS+=("$(cat "$W/agents/$n/bootstrap.ms")")
done
c1=$(conns puppetca ca1); c2=$(conns puppetca ca2)
if [ $ok = $NAGENTS ] && [ "$c1" -gt 0 ] && [ "$c2" = 0 ]; then
    pass bootstrap "$ok/$NAGENTS agents signed via puppetca.$DOMAIN (ms each: ${BDURS[*]}); puppetca connections ca1=$c1 ca2=$c2"
else
    fail bootstrap "$ok/$NAGENTS agents got a certificate; puppetca ca1=$c1 ca2=$c2 (logs: $W/agents/*/bootstrap.log)"
fi
[ "${STOP_AFTER:-}" = bootstrap ] && exit

# 2. repeated agent runs through the puppet listener, spread and sticky
RUNS=2
okruns=0; total=0; declare -a DURS=()
for r in $(seq 1 $RUNS); do
    for n in "${names[@]}"; do
        t=$(now_ms); rc=$(agent_run "$n"); d=$(( $(now_ms) - t ))
        total=$((total + 1)); DURS+=("$d")
        { [ "$rc" = 0 ] || [ "$rc" = 2 ]; } && okruns=$((okruns + 1)) || log "agent $n run rc=$rc"
    done
done
# which master compiled each agent's catalogs (masters' access logs)
spread=""; sticky=1; m1=0; m2=0
for n in "${names[@]}"; do
    k1=$(grep -c "/puppet/v3/catalog/$n.$DOMAIN" "$W/ca1/log/access.log" 2>/dev/null)
    k2=$(grep -c "/puppet/v3/catalog/$n.$DOMAIN" "$W/ca2/log/access.log" 2>/dev/null)
    spread+="$n=ca1:${k1:-0}/ca2:${k2:-0} "
    [ "${k1:-0}" -gt 0 ] && [ "${k2:-0}" -gt 0 ] && sticky=0
    [ "${k1:-0}" -gt 0 ] && m1=$((m1 + 1)); [ "${k2:-0}" -gt 0 ] && m2=$((m2 + 1))
done
p1=$(conns puppet compile1); p2=$(conns puppet compile2)
shit=$(metric crossbar_stick_lookups_total 'service="puppet"' 'key="source"' 'result="hit"')
med=$(printf '%s\n' "${DURS[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
# TLS resumption by agents (measured, not judged): handshakes crossbar saw in the
# ServerHellos of the bootstraps (puppetca) and of these runs (puppet)
rfull=$(metric crossbar_tls_handshakes_total 'service="puppet"' 'kind="full"'); rres=$(metric crossbar_tls_handshakes_total 'service="puppet"' 'kind="resumed"')
bfull=$(metric crossbar_tls_handshakes_total 'service="puppetca"' 'kind="full"'); bres=$(metric crossbar_tls_handshakes_total 'service="puppetca"' 'kind="resumed"')
if [ $okruns = $total ] && [ $sticky = 1 ] && [ $m1 -gt 0 ] && [ $m2 -gt 0 ] && [ $((p1 + p2)) -ge $total ]; then
    pass agent-runs "$okruns/$total runs ok (median ${med}ms); catalogs per agent: ${spread% }; puppet connections compile1=$p1 compile2=$p2 (one per run), source stick hits=$shit; agent $V_AGENT TLS handshakes: runs full=$rfull resumed=$rres, bootstraps full=$bfull resumed=$bres"
else
    fail agent-runs "$okruns/$total runs ok; sticky=$sticky agents-on-ca1=$m1 agents-on-ca2=$m2; catalogs: ${spread}; compile1=$p1 compile2=$p2 (logs: $W/agents/*/run-*.log)"
fi
[ "${STOP_AFTER:-}" = runs ] && exit

# 2a. (Puppet 8) Debian 12's Puppet 7.23 agents against the Puppet 8 masters, through
# the same VIPs: a mixed fleet, as during an upgrade. Bootstrap, 2 runs each (their
# catalogs, sticky, and their file through puppetfiles)
if [ "$PUPPET_GEN" = 8 ]; then
    V7=$(/usr/bin/puppet --version 2>&1)
    oldn=(o1 o2); opids=()
    for n in "${oldn[@]}"; do
        agent_conf "$n" $((10 + ${n#o}))
        ( timeout 300 /usr/bin/puppet ssl bootstrap --confdir "$W/agents/$n" --color false \
              > "$W/agents/$n/bootstrap.log" 2>&1 ) &
        opids+=($!)
    done
    wait "${opids[@]}"
    oboot=0; orun=0; ofile=0; osticky=1; ospread=""
    for n in "${oldn[@]}"; do
        [ -s "$W/agents/$n/ssl/certs/$n.$DOMAIN.pem" ] && oboot=$((oboot + 1))
        for r in 1 2; do
            timeout 300 /usr/bin/puppet agent -t --confdir "$W/agents/$n" --color false > "$W/agents/$n/run-$r.log" 2>&1
            rc=$?; { [ $rc = 0 ] || [ $rc = 2 ]; } && orun=$((orun + 1))
        done
        grep -qx "hello from crossbar e2e $TOKEN" "$W/out/$n.$DOMAIN.txt" 2>/dev/null && ofile=$((ofile + 1))
        k1=$(grep -c "/puppet/v3/catalog/$n.$DOMAIN" "$W/ca1/log/access.log"); k2=$(grep -c "/puppet/v3/catalog/$n.$DOMAIN" "$W/ca2/log/access.log")
        ospread+="$n=ca1:$k1/ca2:$k2 "
        { [ "$k1" = 0 ] || [ "$k2" = 0 ]; } && [ $((k1 + k2)) -ge 2 ] || osticky=0
    done
    if [[ $V7 == 7.* ]] && [ $oboot = 2 ] && [ $orun = 4 ] && [ $ofile = 2 ] && [ $osticky = 1 ]; then
        pass puppet7-agents "agents $V7 (Debian 12) against puppetserver $V_SERVER: $oboot/2 bootstrapped via puppetca.$DOMAIN, $orun/4 runs ok, catalogs ${ospread% } (each on one master), $ofile/2 files through puppetfiles.$DOMAIN"
    else
        fail puppet7-agents "agents '$V7': bootstrapped $oboot/2, runs ok $orun/4, files $ofile/2, catalogs ${ospread% } (sticky: $osticky) (logs: $W/agents/o?/)"
    fi
fi
[ "${STOP_AFTER:-}" = puppet7 ] && exit

# 2b. load feedback with the real compilers: HERD agents at once through the puppetfb
# VIP (feedback on), more catalogs than the compilers' JRubies (1 and 3) hold at once.
# Counts only: every run completes (no catalog refused), both compilers compile and
# the larger one more (leastconn, counting connections, splits a herd evenly), crossbar
# read the real jruby-metrics documents (the two pool sizes, a queue seen during the
# herd). bench/herd.sh times it against leastconn and HAProxy.
MURL=$ADMIN
t=$(now_ms)
from1=$(wc -l < "$W/ca1/log/access.log"); from2=$(wc -l < "$W/ca2/log/access.log")
( maxq=0; while :; do
      q=$(curl -s --max-time 2 "$ADMIN/metrics" | grep -E '^crossbar_backend_feedback_queued\{' |
          grep 'service="puppetfb"' | awk '{ if ($2 > m) m = $2 } END { print m + 0 }')
      [ "${q:-0}" -gt "$maxq" ] && maxq=$q && echo "$maxq" > "$W/herd-maxq"
      sleep 0.3
  done ) &
PIDS[herdwatch]=$!
hpids=()
for i in $(seq 1 $HERD); do
    ( agent "herd$i" agent -t --server "puppetfb.$DOMAIN" > "$W/agents/herd$i/herd.log" 2>&1
      echo $? > "$W/agents/herd$i/herd.rc" ) &
    hpids+=($!)
done
wait "${hpids[@]}"
stop_pid herdwatch
hms=$(( $(now_ms) - t ))
hok=0
for i in $(seq 1 $HERD); do grep -qxE '0|2' "$W/agents/herd$i/herd.rc" && hok=$((hok + 1)); done
tail -n +"$((from1 + 1))" "$W/ca1/log/access.log" > "$W/herd-ca1.log"
tail -n +"$((from2 + 1))" "$W/ca2/log/access.log" > "$W/herd-ca2.log"
hc1=$(grep -c '"POST /puppet/v3/catalog/herd[^"]*" 200 ' "$W/herd-ca1.log")
hc2=$(grep -c '"POST /puppet/v3/catalog/herd[^"]*" 200 ' "$W/herd-ca2.log")
h503=$(cat "$W/herd-ca1.log" "$W/herd-ca2.log" | grep -c '" 503 ')
# agents 8.10 sleep Retry-After and retry (7.23 fails the request)
hretry=$(cat "$W"/agents/herd*/herd.log | grep -c 'Sleeping for')
hmaxq=$(cat "$W/herd-maxq" 2>/dev/null || echo 0)
fbj1=$(metric crossbar_backend_feedback_jrubies 'service="puppetfb"' 'backend="compile1"')
fbj2=$(metric crossbar_backend_feedback_jrubies 'service="puppetfb"' 'backend="compile2"')
fbok=$(metric crossbar_backend_feedback_polls_total 'service="puppetfb"' 'result="ok"')
fbbad=$(curl -s --max-time 5 "$ADMIN/metrics" | grep -E '^crossbar_backend_feedback_polls_total\{' |
        grep 'service="puppetfb"' | grep -v 'result="ok"' | awk '{s += $2} END {print s + 0}')
fbrep=$(metric crossbar_backend_feedback_sticky_replaced_total 'service="puppetfb"')
fbc1=$(conns puppetfb compile1); fbc2=$(conns puppetfb compile2)
if [ $hok = $HERD ] && [ "$hc1" -gt 0 ] && [ "$hc2" -gt "$hc1" ] && [ $((hc1 + hc2)) -ge $HERD ] &&
   [ "$fbj1" = "$JRUBIES_CA1" ] && [ "$fbj2" = "$JRUBIES_CA2" ] && [ "$fbok" -gt 0 ] && [ "$hmaxq" -gt 0 ]; then
    pass feedback-herd "$hok/$HERD runs ok through the feedback VIP (${hms}ms, catalogs +${HERD_SLEEP}s); catalogs compile1=$hc1 compile2=$hc2 (JRubies $JRUBIES_CA1 and $JRUBIES_CA2); 503s $h503, retries after one $hretry; jruby-metrics read from both (num-jrubies $fbj1 and $fbj2, $fbok polls ok, $fbbad failed), largest queue seen $hmaxq; connections compile1=$fbc1 compile2=$fbc2, saturated resumptions placed anew $fbrep"
else
    fail feedback-herd "$hok/$HERD runs ok; catalogs compile1=$hc1 compile2=$hc2 (the larger compile2 should compile more); 503s $h503, retries $hretry; num-jrubies $fbj1 and $fbj2 (expected $JRUBIES_CA1 and $JRUBIES_CA2), polls ok $fbok failed $fbbad, largest queue $hmaxq (logs: $W/agents/herd*/herd.log, $W/herd-ca?.log)"
fi
[ "${STOP_AFTER:-}" = feedback ] && exit

# 3. the file resource came through the puppetfiles listener
okf=0
for n in "${names[@]}"; do
    grep -qx "hello from crossbar e2e $TOKEN" "$W/out/$n.$DOMAIN.txt" 2>/dev/null && okf=$((okf + 1))
done
f1=$(conns puppetfiles files1); f2=$(conns puppetfiles files2)
fc1=$(grep -c 'GET /puppet/v3/file_content/modules/demo/hello.txt' "$W/ca1/log/access.log")
fc2=$(grep -c 'GET /puppet/v3/file_content/modules/demo/hello.txt' "$W/ca2/log/access.log")
if [ $okf = $NAGENTS ] && [ $((f1 + f2)) -gt 0 ] && [ $((fc1 + fc2)) -ge $NAGENTS ]; then
    pass file-source "$okf/$NAGENTS files with the right content; puppetfiles connections files1=$f1 files2=$f2; file_content GETs ca1=$fc1 ca2=$fc2"
else
    fail file-source "$okf/$NAGENTS files right; puppetfiles files1=$f1 files2=$f2; file_content GETs ca1=$fc1 ca2=$fc2"
fi
[ "${STOP_AFTER:-}" = file ] && exit

# 4. the masters saw each agent's own certificate
catalog_code() { # agent-cert node -> http code of POST catalog through the puppet VIP
    local a=$W/agents/$1/ssl
    curl -s -o "$W/agents/$1/catalog-$2.json" -w '%{http_code}' --max-time 120 \
        --cert "$a/certs/$1.$DOMAIN.pem" --key "$a/private_keys/$1.$DOMAIN.pem" --cacert "$W/ca.pem" \
        --resolve "puppet.$DOMAIN:8140:$VIP_PUPPET" \
        -X POST -H 'Accept: application/json' --data 'environment=production' \
        "https://puppet.$DOMAIN:8140/puppet/v3/catalog/$2.$DOMAIN"
}
own=$(catalog_code a1 a1); other=$(catalog_code a1 a2); anon=$(curl -s -o /dev/null -w '%{http_code}' --max-time 60 \
    --cacert "$W/ca.pem" --resolve "puppet.$DOMAIN:8140:$VIP_PUPPET" -X POST --data 'environment=production' \
    "https://puppet.$DOMAIN:8140/puppet/v3/catalog/a1.$DOMAIN")
seen=$(grep -h "a1.$DOMAIN" "$W"/ca?/log/puppetserver.log 2>/dev/null | grep -ci 'catalog' )
if [ "$own" = 200 ] && [ "$other" = 403 ] && [ "$anon" = 403 ] && grep -q "\"name\":\"a1.$DOMAIN\"" "$W/agents/a1/catalog-a1.json"; then
    pass client-cert "POST catalog/a1 with a1's cert -> $own (catalog for a1), catalog/a2 with a1's cert -> $other, no cert -> $anon; master log lines naming a1 on catalog rules: $seen"
else
    fail client-cert "own=$own other=$other nocert=$anon (expected 200/403/403)"
fi
[ "${STOP_AFTER:-}" = certs ] && exit

# 4b. JDK clients resume their sessions through crossbar to the two puppetservers,
# which have different certificates: the Puppet Server -> PuppetDB pattern (#13).
# A resumption sent to the other server would be a full handshake with another
# certificate (SERVER-207: "server certificate change is restricted").
# TLS 1.2 runs in session-ID mode (the client offers no session_ticket extension):
# these Jetty/Java 17 servers answer a TLS 1.2 hello that offers the extension with
# an empty NewSessionTicket and never resume it, straight or through crossbar; the
# `direct` rows below measure that on ca1 itself.
jdk_resume() { # label vip sni protocol tickets(on|off) -> one summary line; lines in $W/jdk-LABEL.txt
    local props=()
    [ "$5" = off ] && props=(-Djdk.tls.client.enableSessionTicketExtension=false)
    timeout 300 java "${props[@]}" -cp "$W/java" JdkResume "$W/ca.pem" "$3" "$4" $JDK_CLIENTS \
        $JDK_RESUMES $JDK_SRC "$2:8140" > "$W/jdk-$1.txt" 2>&1
    echo "rc=$? $(awk -v min=$JDK_KEPT_MIN_PCT '
        $1 == "RESULT" && $3 == 0 { home[$2] = $5; first[$5]++ }
        $1 == "RESULT" && $3 > 0 { n++; if ($4 == "true" && $5 == home[$2]) kept++;
                                   else if ($5 != home[$2]) moved++; else full++ }
        $1 == "ERROR" { err++; if (tolower($0) ~ /certificate change/) chg++ }
        $1 == "DONE" { done = 1 }
        END { f = ""; for (s in first) f = f s "=" first[s] " ";
              ok = done && n > 0 && kept * 100 >= min * n && err == 0;
              printf "ok=%d kept=%d/%d (%.1f%%) moved=%d full-on-home=%d errors=%d certificate-change=%d first-handshakes: %s",
                     ok, kept, n, n ? kept * 100 / n : 0, moved, full, err, chg, f }' "$W/jdk-$1.txt")"
}
jdk_all_ok=1; jdk_lines=()
for mode in "pdb13 $VIP_PDB puppetdb.$DOMAIN TLSv1.3 on" "pdb12 $VIP_PDB puppetdb.$DOMAIN TLSv1.2 off" \
            "puppet13 $VIP_PUPPET puppet.$DOMAIN TLSv1.3 on" "puppet12 $VIP_PUPPET puppet.$DOMAIN TLSv1.2 off"; do
    # shellcheck disable=SC2086
    r=$(jdk_resume $mode)
    jdk_lines+=("${mode%% *}: $r")
    [[ $r == "rc=0 ok=1 "* ]] || jdk_all_ok=0
done
# the PuppetDB pool must have used both servers, or it proved nothing about two certificates
pdb_spread=1
for m in pdb13 pdb12; do
    grep -q ' ca1.xb.test ' "$W/jdk-$m.txt" && grep -q ' ca2.xb.test ' "$W/jdk-$m.txt" || pdb_spread=0
done
confirm=$(curl -s --max-time 5 "$ADMIN/metrics" | grep -E '^crossbar_stick_confirm_total\{' |
    grep -E 'service="(puppetdb|puppet)"' | grep -vE ' 0$' |
    sed -E 's/.*result="([a-z_]+)".*service="([a-z]+)".* ([0-9.]+)$/\2:\1=\3/; s/.*service="([a-z]+)".*result="([a-z_]+)".* ([0-9.]+)$/\1:\2=\3/' | tr '\n' ' ')
extra_pdb=$(metric crossbar_stick_confirm_extra_handshakes_total 'service="puppetdb"')
extra_puppet=$(metric crossbar_stick_confirm_extra_handshakes_total 'service="puppet"')
# for comparison, not judged: straight to ca1, and TLS 1.2 with tickets offered
for mode in "direct13 $IP_CA1 puppetdb.$DOMAIN TLSv1.3 on" "direct12 $IP_CA1 puppetdb.$DOMAIN TLSv1.2 off" \
            "direct12tickets $IP_CA1 puppetdb.$DOMAIN TLSv1.2 on" "pdb12tickets $VIP_PDB puppetdb.$DOMAIN TLSv1.2 on"; do
    # shellcheck disable=SC2086
    r=$(jdk_resume $mode)
    jdk_lines+=("${mode%% *} (not judged): ${r/ ok=[01]/}")
done
jdk_summary="$JDK_CLIENTS JDK clients x (1 + $JDK_RESUMES) from $JDK_SRC per mode; $(printf '%s; ' "${jdk_lines[@]}")crossbar_stick_confirm_total: ${confirm% }; crossbar_stick_confirm_extra_handshakes_total: puppetdb=$extra_pdb puppet=$extra_puppet"
if [ $jdk_all_ok = 1 ] && [ $pdb_spread = 1 ]; then
    pass jdk-resume "$jdk_summary"
else
    fail jdk-resume "spread over both servers in the puppetdb pool=$pdb_spread; $jdk_summary (output: $W/jdk-*.txt)"
fi
[ "${STOP_AFTER:-}" = jdk ] && exit

# 5. timings: through crossbar vs straight to a master
# a1 sticks to one master; run it direct against that one and through crossbar, 3 runs each
home=ca1; [ "$(grep -c "/puppet/v3/catalog/a1.$DOMAIN" "$W/ca2/log/access.log")" -gt 0 ] && home=ca2
tx=(); td=()
for _ in 1 2 3; do
    t=$(now_ms); agent_run a1 >/dev/null; tx+=($(( $(now_ms) - t )))
    t=$(now_ms); agent_run a1 --server "$home.$DOMAIN" >/dev/null; td+=($(( $(now_ms) - t )))
done
medx=$(printf '%s\n' "${tx[@]}" | sort -n | sed -n 2p); medd=$(printf '%s\n' "${td[@]}" | sort -n | sed -n 2p)
bd=$(cat "$W/agents/d1/bootstrap.ms"); [ -s "$W/agents/d1/ssl/certs/d1.$DOMAIN.pem" ] || bd="$bd (failed)"
pass timings "agent -t median of 3: through crossbar ${medx}ms (${tx[*]}), direct to $home.$DOMAIN ${medd}ms (${td[*]}) (file source via the puppetfiles VIP in both); ssl bootstrap (4 in parallel) through crossbar ${BDURS[*]}ms, direct to ca1.$DOMAIN at the same time ${bd}ms"

# 5b. server_list failover: the first VIP has every backend down; crossbar closes
# such connections right after the ClientHello, so the agent moves on to the next
# server at once instead of waiting out http_connect_timeout
"$CROSSBAR" run -c "$W/crossbar-down.yaml" > "$W/crossbar-down.log" 2>&1 &
PIDS[crossbar_down]=$!
for _ in $(seq 1 50); do curl -sf --max-time 1 "$ADMIN_DOWN/healthz" >/dev/null && break; sleep 0.2; done
MURL=$ADMIN_DOWN wait_state puppet compile1 down 20; MURL=$ADMIN_DOWN wait_state puppet compile2 down 20
st_d="$(MURL=$ADMIN_DOWN state puppet compile1)/$(MURL=$ADMIN_DOWN state puppet compile2)"
cat_before=$(cat "$W"/ca?/log/access.log | grep -c "/puppet/v3/catalog/a2.$DOMAIN")
t=$(now_ms); rc=$(agent_run a2 --server_list "puppetdown.$DOMAIN:8140,puppet.$DOMAIN:8140"); sl_ms=$(( $(now_ms) - t ))
cat_after=$(cat "$W"/ca?/log/access.log | grep -c "/puppet/v3/catalog/a2.$DOMAIN")
down_acc=$(MURL=$ADMIN_DOWN metric crossbar_listener_accepts_total)
sl_log=$(ls -t "$W"/agents/a2/run-*.log | head -1)
# the agent's own account: "Unable to connect to server from server_list setting:
# Request to https://puppetdown...:8140/status/v1/simple/server failed after 0.02 seconds"
sl_gave_up=$(grep -o "puppetdown.$DOMAIN:8140/[^ ]* failed after [0-9.]* seconds" "$sl_log" | head -1 | sed 's/.* failed after //')
stop_pid crossbar_down
if { [ "$rc" = 0 ] || [ "$rc" = 2 ]; } && [ "$st_d" = down/down ] && [ "$down_acc" -gt 0 ] &&
   [ "$cat_after" -gt "$cat_before" ] && [ $sl_ms -lt $SERVER_LIST_LIMIT_MS ] && [ -n "$sl_gave_up" ]; then
    pass server-list-failover "agent -t with server_list puppetdown,puppet (first VIP: backends $st_d, $down_acc connection(s) taken and closed; the agent gave up on it after $sl_gave_up): rc=$rc in ${sl_ms}ms (normal runs: median ${medx}ms; a held connection would cost http_connect_timeout, 120 s); catalog compiled via puppet.$DOMAIN"
else
    fail server-list-failover "rc=$rc in ${sl_ms}ms (limit ${SERVER_LIST_LIMIT_MS}ms); down VIP backends $st_d, accepted $down_acc; agent gave up on it after '${sl_gave_up}'; catalogs for a2 $cat_before -> $cat_after (log: $sl_log)"
fi
[ "${STOP_AFTER:-}" = serverlist ] && exit

# 6. SNI variant: one shared listener
"$CROSSBAR" run -c "$W/crossbar-sni.yaml" > "$W/crossbar-sni.log" 2>&1 &
PIDS[crossbar_sni]=$!
for _ in $(seq 1 50); do curl -sf --max-time 1 "$ADMIN_SNI/healthz" >/dev/null && break; sleep 0.2; done
hosts_write sni
MURL=$ADMIN_SNI wait_state puppet compile1 up 20; MURL=$ADMIN_SNI wait_state puppet compile2 up 20
agent_conf s1 5
sb=1; agent s1 ssl bootstrap > "$W/agents/s1/bootstrap.log" 2>&1 && [ -s "$W/agents/s1/ssl/certs/s1.$DOMAIN.pem" ] || sb=0
r1=$(agent_run s1); r2=$(agent_run s1)
sf=0; grep -qx "hello from crossbar e2e $TOKEN" "$W/out/s1.$DOMAIN.txt" 2>/dev/null && sf=1
export MURL=$ADMIN_SNI
sca=$(( $(conns puppetca ca1) + $(conns puppetca ca2) ))
spu=$(( $(conns puppet compile1) + $(conns puppet compile2) ))
sfi=$(( $(conns puppetfiles files1) + $(conns puppetfiles files2) ))
sref=$(metric crossbar_route_refused_total); sherr=$(metric crossbar_client_hello_errors_total)
unset MURL
hosts_write vip
if [ $sb = 1 ] && { [ "$r1" = 0 ] || [ "$r1" = 2 ]; } && { [ "$r2" = 0 ] || [ "$r2" = 2 ]; } && [ $sf = 1 ] &&
   [ $sca -gt 0 ] && [ $spu -gt 0 ] && [ $sfi -gt 0 ] && [ "$sref" = 0 ] && [ "$sherr" = 0 ]; then
    pass sni-shared-listener "s1 bootstrapped, 2 runs rc=$r1,$r2, file ok; connections by SNI route: puppetca=$sca puppet=$spu puppetfiles=$sfi; refused=$sref hello_errors=$sherr"
else
    fail sni-shared-listener "bootstrap=$sb runs rc=$r1,$r2 file=$sf; puppetca=$sca puppet=$spu puppetfiles=$sfi refused=$sref hello_errors=$sherr (log: $W/crossbar-sni.log)"
fi
stop_pid crossbar_sni
[ "${STOP_AFTER:-}" = sni ] && exit

# 6a. (Puppet 8) a real 1500-byte path: agents 8.10 in a network namespace behind a
# veth pair with an MTU of 1500, crossbar listening on this side: their 1515-byte
# ClientHellos (an ML-KEM hybrid key share) arrive in two TCP segments, as on a site's
# Ethernet (loopback's 64 KiB MTU never splits them). One shared listener, routed by
# the SNI in those split hellos: puppetcamtu.$DOMAIN to the CA, puppetmtu.$DOMAIN to
# the compilers with source stickiness. tcpdump on the veth counts each connection's
# ClientHello segments.
if [ "$PUPPET_GEN" = 8 ]; then
    MTU_NS=cbmtu$$
    ip netns add "$MTU_NS" && ip link add "$MTU_VETH" type veth peer name "${MTU_VETH}n" &&
        ip link set "${MTU_VETH}n" netns "$MTU_NS" && ip link set "$MTU_VETH" mtu $MTU up &&
        ip addr add "$MTU_VIP/30" dev "$MTU_VETH" && ip -n "$MTU_NS" link set "${MTU_VETH}n" mtu $MTU up &&
        ip -n "$MTU_NS" addr add "$MTU_AGENT_IP/30" dev "${MTU_VETH}n" && ip -n "$MTU_NS" link set lo up ||
        die "the MTU phase's namespace and veth"
    # no segmentation offload: a veth hands the sender's 16 KiB TSO/GSO packets over
    # whole (measured: one 1523-byte "segment" per hello), where a NIC would cut them at
    # the MSS; and no GRO on this side, which would glue them together again
    ip netns exec "$MTU_NS" ethtool -K "${MTU_VETH}n" tso off gso off gro off > "$W/ethtool.log" 2>&1 &&
        ethtool -K "$MTU_VETH" tso off gso off gro off >> "$W/ethtool.log" 2>&1 ||
        die "ethtool -K on the MTU phase's veth: $(cat "$W/ethtool.log")"
    cat > "$W/crossbar-mtu.yaml" <<EOC
# the CA and the compilers on one listener behind a 1500-byte MTU, routed by SNI
admin:
  listen: 127.0.0.1:$ADMIN_MTU_PORT
defaults:
  timeouts: { client_hello: 5s, connect: 3s, idle: 30m, queue: 10s, shutdown: 5s }
  health: { $HEALTH }
services:
  puppetca:
    listen: ["$MTU_VIP:8140"]
    server_names: ["puppetcamtu.$DOMAIN"]
    balance: first
    failback: manual
    backends:
      - { name: ca1, address: "ca1.$DOMAIN:8140" }
      - { name: ca2, address: "ca2.$DOMAIN:8140", backup: true }
  puppet:
    listen: ["$MTU_VIP:8140"]
    server_names: ["puppetmtu.$DOMAIN"]
    balance: leastconn
    stick: { on: [session_id, ticket, psk, source], expire: 30m }
    backends:
      - { name: compile1, address: "ca1.$DOMAIN:8140" }
      - { name: compile2, address: "ca2.$DOMAIN:8140" }
EOC
    "$CROSSBAR" check -c "$W/crossbar-mtu.yaml" > "$W/crossbar-mtu.check" 2>&1 || { cat "$W/crossbar-mtu.check" >&2; die "crossbar check crossbar-mtu.yaml"; }
    "$CROSSBAR" run -c "$W/crossbar-mtu.yaml" > "$W/crossbar-mtu.log" 2>&1 &
    PIDS[crossbar_mtu]=$!
    for _ in $(seq 1 50); do curl -sf --max-time 1 "$ADMIN_MTU/healthz" >/dev/null && break; sleep 0.2; done
    MURL=$ADMIN_MTU wait_state puppet compile1 up 20; MURL=$ADMIN_MTU wait_state puppet compile2 up 20
    MURL=$ADMIN_MTU wait_state puppetca ca1 up 20
    tcpdump -i "$MTU_VETH" -nn -U -s 256 -w "$W/mtu.pcap" "tcp port 8140" > "$W/tcpdump.log" 2>&1 &
    PIDS[tcpdump]=$!
    for _ in $(seq 1 50); do grep -q 'listening on' "$W/tcpdump.log" && break; sleep 0.2; done
    mtun=(); mpids=()
    for i in $(seq 1 $MTU_AGENTS); do
        mtun+=("m$i"); agent_conf "m$i" $((60 + i))
        sed -i -e "s/^server = .*/server = puppetmtu.$DOMAIN/" -e "s/^ca_server = .*/ca_server = puppetcamtu.$DOMAIN/" \
            -e "s/^sourceaddress = .*/sourceaddress = $MTU_AGENT_IP/" "$W/agents/m$i/puppet.conf"
        ( ip netns exec "$MTU_NS" timeout 300 puppet ssl bootstrap --confdir "$W/agents/m$i" --color false \
              > "$W/agents/m$i/bootstrap.log" 2>&1 ) &
        mpids+=($!)
    done
    wait "${mpids[@]}"
    mboot=0; mrun=0; msticky=1; mspread=""
    for n in "${mtun[@]}"; do
        [ -s "$W/agents/$n/ssl/certs/$n.$DOMAIN.pem" ] && mboot=$((mboot + 1))
        for r in 1 2; do
            ip netns exec "$MTU_NS" timeout 300 puppet agent -t --confdir "$W/agents/$n" --color false > "$W/agents/$n/run-$r.log" 2>&1
            rc=$?; { [ $rc = 0 ] || [ $rc = 2 ]; } && mrun=$((mrun + 1))
        done
        k1=$(grep -c "/puppet/v3/catalog/$n.$DOMAIN" "$W/ca1/log/access.log"); k2=$(grep -c "/puppet/v3/catalog/$n.$DOMAIN" "$W/ca2/log/access.log")
        mspread+="$n=ca1:$k1/ca2:$k2 "
        { [ "$k1" = 0 ] || [ "$k2" = 0 ]; } && [ $((k1 + k2)) -ge 2 ] || msticky=0
    done
    stop_pid tcpdump
    export MURL=$ADMIN_MTU
    macc=$(metric crossbar_listener_accepts_total)
    mca1=$(conns puppetca ca1); mca2=$(conns puppetca ca2)
    mpu=$(( $(conns puppet compile1) + $(conns puppet compile2) ))
    mref=$(metric crossbar_route_refused_total); mherr=$(metric crossbar_client_hello_errors_total)
    mhit=$(metric crossbar_stick_lookups_total 'service="puppet"' 'key="source"' 'result="hit"')
    mfull=$(metric crossbar_tls_handshakes_total 'kind="full"'); mres=$(metric crossbar_tls_handshakes_total 'kind="resumed"')
    unset MURL
    # per connection from the agents' side: its first payload a ClientHello? how long,
    # in how many segments?
    seg=$(ruby - "$W/mtu.pcap" "$MTU_AGENT_IP" <<'RB' 2>&1
data = File.binread(ARGV[0]); me = ARGV[1].split('.').map(&:to_i).pack('C4')
magic = data[0, 4].unpack1('V'); f = [0xa1b2c3d4, 0xa1b23c4d].include?(magic) ? 'V' : 'N'
link = data[20, 4].unpack1(f); l2 = { 1 => 14, 113 => 16 }.fetch(link) { abort "link type #{link}" }
off = 24; conns = Hash.new { |h, k| h[k] = { first: nil, segs: [] } }; maxseg = 0
while off + 16 <= data.bytesize
  incl = data[off + 8, 4].unpack1(f); pkt = data[off + 16, incl]; off += 16 + incl
  ip = pkt.byteslice(l2, pkt.bytesize) || next
  next unless ip.bytesize >= 40 && ip.getbyte(0) >> 4 == 4 && ip.getbyte(9) == 6 && ip.byteslice(12, 4) == me
  ihl = (ip.getbyte(0) & 15) * 4; tcp = ip.byteslice(ihl, ip.bytesize); thl = (tcp.getbyte(12) >> 4) * 4
  plen = ip.byteslice(2, 2).unpack1('n') - ihl - thl
  next if plen <= 0
  c = conns[tcp.byteslice(0, 2).unpack1('n')]
  c[:first] ||= tcp.byteslice(thl, 6)
  c[:segs] << plen; maxseg = plen if plen > maxseg
end
hellos = conns.values.select { |c| c[:first] && c[:first].getbyte(0) == 0x16 && c[:first].getbyte(5) == 1 }
sizes = hellos.map { |c| c[:first].byteslice(3, 2).unpack1('n') + 5 }
split = hellos.zip(sizes).count { |c, n| s = 0; k = c[:segs].index { |l| (s += l) >= n }; k && k >= 1 }
puts "conns=#{conns.size} hellos=#{hellos.size} split=#{split} hello_bytes=#{sizes.minmax.join('-')} max_segment=#{maxseg}"
RB
)
    mconns=$(sed -n 's/.*conns=\([0-9]*\).*/\1/p' <<< "$seg"); mhellos=$(sed -n 's/.*hellos=\([0-9]*\).*/\1/p' <<< "$seg")
    msplit=$(sed -n 's/.*split=\([0-9]*\).*/\1/p' <<< "$seg"); mmaxseg=$(sed -n 's/.*max_segment=\([0-9]*\).*/\1/p' <<< "$seg")
    if [ $mboot = $MTU_AGENTS ] && [ $mrun = $((2 * MTU_AGENTS)) ] && [ $msticky = 1 ] && [ "$mca1" -gt 0 ] && [ "$mca2" = 0 ] &&
       [ "$mpu" -ge $((2 * MTU_AGENTS)) ] && [ "$mref" = 0 ] && [ "$mherr" = 0 ] && [ "$mhit" -gt 0 ] &&
       [ -n "$mconns" ] && [ "$mconns" -ge "$macc" ] && [ "$mhellos" = "$mconns" ] && [ "$msplit" = "$mhellos" ] &&
       [ "$mmaxseg" -le $((MTU - 40)) ]; then
        pass mtu-1500 "$MTU_AGENTS agents $V_AGENT in a netns behind an MTU of $MTU: $mboot bootstrapped via puppetcamtu.$DOMAIN, $mrun runs ok via puppetmtu.$DOMAIN; on the veth: $seg (every ClientHello in 2+ segments); crossbar: $macc accepted, by SNI puppetca ca1=$mca1 ca2=$mca2, puppet=$mpu, refused=$mref, hello_errors=$mherr; catalogs ${mspread% } (each on one master, source hits $mhit); TLS full=$mfull resumed=$mres"
    else
        fail mtu-1500 "bootstrapped $mboot/$MTU_AGENTS, runs $mrun/$((2 * MTU_AGENTS)), catalogs ${mspread% } (sticky $msticky, source hits $mhit); veth: $seg; crossbar accepted $macc, puppetca ca1=$mca1 ca2=$mca2, puppet=$mpu, refused=$mref, hello_errors=$mherr (logs: $W/agents/m?/, $W/crossbar-mtu.log, $W/mtu.pcap)"
    fi
    stop_pid crossbar_mtu
fi
[ "${STOP_AFTER:-}" = mtu ] && exit

# 6b. PuppetDB behind crossbar, and the Puppet module on a balancer node: pools from
# exported resources
# - the masters' terminus stored every node's facts, catalog and reports through
#   crossbar's puppetdb service
pq_nodes=$(pdb_query /pdb/query/v4/nodes | ruby -rjson -e 'puts JSON.parse($stdin.read).map { |n| n["certname"] }.sort.join(" ")' 2>&1)
pq_ok=1; pq_detail=""
for n in "${names[@]}"; do
    nf=$(pdb_count "/pdb/query/v4/nodes/$n.$DOMAIN/facts")
    nc=$(pdb_count "/pdb/query/v4/catalogs/$n.$DOMAIN")
    nr=$(pdb_count /pdb/query/v4/reports --get --data-urlencode "query=[\"=\",\"certname\",\"$n.$DOMAIN\"]")
    pq_detail+="$n facts=$nf catalogs=$nc reports=$nr; "
    { [ "$nf" -gt 10 ] && [ "$nc" = 1 ] && [ "$nr" -ge 2 ]; } || pq_ok=0
done
pdbc=$(MURL=$ADMIN_PDB conns puppetdb pdb1)
pdb_hs_full=$(MURL=$ADMIN_PDB metric crossbar_tls_handshakes_total 'kind="full"')
pdb_hs_res=$(MURL=$ADMIN_PDB metric crossbar_tls_handshakes_total 'kind="resumed"')
if [ $pq_ok = 1 ] && [ "$pdbc" -gt 0 ]; then
    pass puppetdb-store "PuppetDB $V_PDB (PostgreSQL 15) behind crossbar's puppetdb service holds ${pq_detail% } (nodes: ${pq_nodes% }); masters -> PuppetDB connections through crossbar: $pdbc (TLS full $pdb_hs_full, resumed $pdb_hs_res)"
else
    fail puppetdb-store "${pq_detail% }; nodes: ${pq_nodes% }; connections through crossbar: $pdbc (pdb1 log: $W/pdb1/log)"
fi

# - the nodes' own agent runs export themselves: pdb1 a crossbar::backend, ca1 (first)
#   the haproxy::balancermember a site on puppetlabs-haproxy has
for n in ca1 ca2 pdb1; do
    case $n in ca*) i=$(( ${n#ca} + 40 )) ;; pdb1) i=46 ;; esac
    agent_conf $n $i
    mkdir -p "$W/agents/$n/ssl/"{certs,private_keys}
    cp "$W/$n/ssl/certs/$n.$DOMAIN.pem" "$W/agents/$n/ssl/certs/" && cp "$W/ca.pem" "$W/agents/$n/ssl/certs/ca.pem" &&
        cp "$W/$n/ssl/private_keys/$n.$DOMAIN.pem" "$W/agents/$n/ssl/private_keys/" && cp "$W/$n/ssl/crl.pem" "$W/agents/$n/ssl/" ||
        die "$n: certificate, key or CRL not where expected"
done
agent_conf lb 45
LBF=$W/lb/crossbar.yaml
rc_pdb1=$(agent_run pdb1)
rc_ca1=$(agent_run ca1)
rc_lb1=$(agent_run lb)
lb1=$(grep -o "name: '[a-z0-9.-]*', address: '[^']*'" "$LBF" 2>/dev/null | tr '\n' ' ')
if { [ "$rc_pdb1" = 0 ] || [ "$rc_pdb1" = 2 ]; } && { [ "$rc_ca1" = 0 ] || [ "$rc_ca1" = 2 ]; } && [ "$rc_lb1" = 2 ] &&
   grep -q "discover: {srv: '_x-puppet._tcp.$DOMAIN'" "$LBF" &&
   grep -q "name: 'pdb1.$DOMAIN', address: 'pdb1.$DOMAIN:8081'" "$LBF" &&
   grep -q "name: 'ca1.$DOMAIN', address: '$IP_CA1:8140'" "$LBF" && ! grep -q "name: 'ca2.$DOMAIN'" "$LBF" &&
   cmp -s "$W/lb/puppet-ca.pem" "$W/agents/lb/ssl/certs/ca.pem" &&
   "$CROSSBAR" check -c "$LBF" > "$W/lb/check1.txt" 2>&1; then
    pass module-collect "pdb1's agent run exported puppetdb/pdb1.$DOMAIN (rc $rc_pdb1), ca1's its haproxy::balancermember (rc $rc_ca1); lb's agent run (rc $rc_lb1) collected both through PuppetDB, copied its agent CA (ca_source) and wrote and checked $LBF: puppet from SRV _x-puppet._tcp.$DOMAIN, ${lb1% }"
else
    fail module-collect "pdb1 run rc=$rc_pdb1, ca1 run rc=$rc_ca1, lb run rc=$rc_lb1; file: $(tr '\n' '|' < "$LBF" 2>/dev/null) (logs: $W/agents/{pdb1,ca1,lb}/run-*.log)"
fi
# the module-made balancer takes over puppetdb.$DOMAIN:8081 from the hand-written one
# (the masters' terminus reconnects to it), and puppetfiles.$DOMAIN points at it
stop_pid crossbar_pdb
"$CROSSBAR" run -c "$LBF" > "$W/crossbar-lb.log" 2>&1 &
PIDS[crossbar_lb]=$!
for _ in $(seq 1 50); do curl -sf --max-time 1 "$ADMIN_LB/healthz" >/dev/null && break; sleep 0.2; done
for b in "puppet ca1.$DOMAIN-8140" "puppet ca2.$DOMAIN-8140" "puppetdb pdb1.$DOMAIN" "puppetfiles ca1.$DOMAIN"; do
    # shellcheck disable=SC2086
    MURL=$ADMIN_LB wait_state $b up 30 || log "crossbar-lb: $b not up: $(MURL=$ADMIN_LB state $b)"
done
hosts_write lb

# catalogs KEY: per agent, catalog requests in each master's access log
catalogs() { local n; for n in "${names[@]}"; do
    echo "$n $(grep -c "/puppet/v3/catalog/$n.$DOMAIN" "$W/ca1/log/access.log") $(grep -c "/puppet/v3/catalog/$n.$DOMAIN" "$W/ca2/log/access.log")"
done; }
reports() { local n t=0; for n in "${names[@]}"; do
    t=$(( t + $(pdb_count /pdb/query/v4/reports --get --data-urlencode "query=[\"=\",\"certname\",\"$n.$DOMAIN\"]") ))
done; echo $t; }
# - agents through the module-made balancer: each run's catalog compiled by the
#   compiler crossbar chose from DNS; its report stored through crossbar's puppetdb
#   service; its file through the file servers from the haproxy exports
before=$(catalogs); rep0=$(reports)
pdbc0=$(MURL=$ADMIN_LB conns puppetdb "pdb1.$DOMAIN")
lbok=0; rm -f "$W"/out/*.txt
for n in "${names[@]}"; do
    rc=$(agent_run "$n" --server "puppetlb.$DOMAIN"); { [ "$rc" = 0 ] || [ "$rc" = 2 ]; } && lbok=$((lbok + 1))
done
after=$(catalogs)
# PuppetDB stores reports from a queue: wait (bounded) until this round's are in
for _ in $(seq 1 60); do rep1=$(reports); [ "$rep1" -ge $((rep0 + NAGENTS)) ] && break; sleep 1; done
okf=0; for n in "${names[@]}"; do grep -qx "hello from crossbar e2e $TOKEN" "$W/out/$n.$DOMAIN.txt" 2>/dev/null && okf=$((okf + 1)); done
# which compiler answered each agent: the master whose access log got its new catalog
answered=""; one_each=1; m1=0; m2=0
while read -r n b1 b2 && read -r _ a1 a2 <&3; do
    d1=$((a1 - b1)); d2=$((a2 - b2))
    answered+="$n=ca1:$d1/ca2:$d2 "
    [ $((d1 + d2)) -ge 1 ] && { [ $d1 = 0 ] || [ $d2 = 0 ]; } || one_each=0
    m1=$((m1 + d1)); m2=$((m2 + d2))
done < <(echo "$before") 3< <(echo "$after")
l1=$(MURL=$ADMIN_LB conns puppet "ca1.$DOMAIN-8140"); l2=$(MURL=$ADMIN_LB conns puppet "ca2.$DOMAIN-8140")
pdbc=$(( $(MURL=$ADMIN_LB conns puppetdb "pdb1.$DOMAIN") - pdbc0 ))
lf1=$(MURL=$ADMIN_LB conns puppetfiles "ca1.$DOMAIN")
if [ $lbok = $NAGENTS ] && [ $one_each = 1 ] && [ $m1 -gt 0 ] && [ $m2 -gt 0 ] && [ "$l1" -ge $m1 ] && [ "$l2" -ge $m2 ] &&
   [ "$pdbc" -gt 0 ] && [ "$rep1" -ge $((rep0 + NAGENTS)) ] && [ $okf = $NAGENTS ] && [ "$lf1" -gt 0 ]; then
    pass module-agents "$lbok/$NAGENTS agent runs through puppetlb.$DOMAIN; the compiler that answered each (its catalog in that master's access log): ${answered% }; crossbar-lb's puppet connections to the discovered ca1.$DOMAIN-8140=$l1 ca2.$DOMAIN-8140=$l2; reports stored $rep0 -> $rep1 through its puppetdb service ($pdbc connections to pdb1.$DOMAIN); $okf/$NAGENTS files through its puppetfiles service (ca1.$DOMAIN: $lf1 connections)"
else
    fail module-agents "runs ok $lbok/$NAGENTS; catalogs ${answered% } (one compiler each: $one_each); lb puppet ca1=$l1 ca2=$l2; reports $rep0 -> $rep1, puppetdb connections $pdbc; files $okf/$NAGENTS, puppetfiles ca1=$lf1 (log: $W/crossbar-lb.log)"
fi

# - ca2 exports its member; the balancer's next run adds it; a validated reload;
#   agents' files reach it
rc_ca2=$(agent_run ca2)
rc_lb2=$(agent_run lb)
rl=$("$CROSSBAR" reload -c "$LBF" 2>&1); rrc=$?
MURL=$ADMIN_LB wait_state puppetfiles "ca2.$DOMAIN" up 20; st2=$(MURL=$ADMIN_LB state puppetfiles "ca2.$DOMAIN")
lbok=0
for n in "${names[@]}"; do
    rc=$(agent_run "$n" --server "puppetlb.$DOMAIN"); { [ "$rc" = 0 ] || [ "$rc" = 2 ]; } && lbok=$((lbok + 1))
done
l1=$(MURL=$ADMIN_LB conns puppetfiles "ca1.$DOMAIN"); l2=$(MURL=$ADMIN_LB conns puppetfiles "ca2.$DOMAIN")
if [ "$rc_lb2" = 2 ] && [ $rrc = 0 ] && [ "$st2" = up ] && [ $lbok = $NAGENTS ] && [ "$l2" -gt 0 ] && [ "$l1" -gt 0 ]; then
    pass module-join "ca2's agent run exported its member (rc $rc_ca2); lb's next run wrote it (rc $rc_lb2), crossbar reload -c: ok, puppetfiles/ca2.$DOMAIN $st2; $lbok/$NAGENTS agent runs through the balancer: file server connections ca1=$l1 ca2=$l2"
else
    fail module-join "ca2 run rc=$rc_ca2, lb run rc=$rc_lb2, reload rc=$rrc ($rl), ca2 state=$st2, agent runs ok=$lbok/$NAGENTS, connections ca1=$l1 ca2=$l2"
fi

# - ca2 deactivated (puppet node deactivate): the next run drops its member;
#   connections open through the balancer at the reload keep working
held() { # N: one TLS connection through the lb's file VIP, a status request every 2 s
    # until the marker file exists (at most 150), then 3 more; the answers go to held-N.out
    local i=0
    { while [ ! -e "$W/lb/reloaded" ] && [ $i -lt 150 ]; do
          printf 'GET /status/v1/simple HTTP/1.1\r\nHost: puppetfiles.%s\r\n\r\n' "$DOMAIN"; sleep 2; i=$((i + 1)); done
      for _ in 1 2 3; do printf 'GET /status/v1/simple HTTP/1.1\r\nHost: puppetfiles.%s\r\n\r\n' "$DOMAIN"; sleep 2; done
    } | timeout 400 openssl s_client -quiet -no_ign_eof -connect "$VIP_LBFILES:8140" -servername "puppetfiles.$DOMAIN" \
        -CAfile "$W/ca.pem" > "$W/lb/held-$1.out" 2> "$W/lb/held-$1.err"
}
rm -f "$W/lb/reloaded"
held 1 & hp1=$!
held 2 & hp2=$!
for _ in $(seq 1 40); do [ "$(MURL=$ADMIN_LB metric crossbar_active_connections 'service="puppetfiles"')" -ge 2 ] && break; sleep 0.5; done
act2=$(MURL=$ADMIN_LB metric crossbar_active_connections 'service="puppetfiles"' "backend=\"ca2.$DOMAIN\"")
dz=$(timeout 120 puppet node deactivate "ca2.$DOMAIN" --confdir "$W/ca1/etc" --color false 2>&1); drc=$?
rc_lb3=$(agent_run lb)
rl3=$("$CROSSBAR" reload -c "$LBF" 2>&1); rrc3=$?
touch "$W/lb/reloaded"
wait $hp1 $hp2
gone=0; grep -q "name: 'ca2.$DOMAIN'" "$LBF" || gone=1
inpool=$(curl -s --max-time 5 "$ADMIN_LB/api/services" | ruby -rjson -e '
    s = JSON.parse($stdin.read)["services"].find { |x| x["name"] == "puppetfiles" }
    puts s["backends"].count { |b| b["name"] == ARGV[0] }' "ca2.$DOMAIN" 2>&1)
a1=$(grep -o 'running' "$W/lb/held-1.out" | wc -l); a2=$(grep -o 'running' "$W/lb/held-2.out" | wc -l)
n1=$(grep -o 'HTTP/1.1 [0-9]*' "$W/lb/held-1.out" | wc -l); n2=$(grep -o 'HTTP/1.1 [0-9]*' "$W/lb/held-2.out" | wc -l)
if [ $drc = 0 ] && [ "$rc_lb3" = 2 ] && [ $gone = 1 ] && [ $rrc3 = 0 ] && [ "$inpool" = 0 ] &&
   [ "$act2" -ge 1 ] && [ "$a1" -gt 3 ] && [ "$a1" = "$n1" ] && [ "$a2" -gt 3 ] && [ "$a2" = "$n2" ]; then
    pass module-leave "puppet node deactivate ca2; lb's next run dropped its member (rc $rc_lb3), reload ok, ca2.$DOMAIN out of the puppetfiles pool; the 2 connections open through the balancer ($act2 of them on ca2) answered every request across the reload: $a1/$n1 and $a2/$n2"
else
    fail module-leave "deactivate rc=$drc ($dz); lb run rc=$rc_lb3, ca2 gone from file=$gone, reload rc=$rrc3 ($rl3), ca2 in the pool=$inpool; held connections (ca2 had $act2): $a1/$n1, $a2/$n2 answered ($(head -c 300 "$W/lb/held-1.err"))"
fi
# back to the hand-written balancers for the rest
stop_pid crossbar_lb
hosts_write vip
"$CROSSBAR" run -c "$W/crossbar-pdb.yaml" > "$W/crossbar-pdb-2.log" 2>&1 &
PIDS[crossbar_pdb]=$!
[ "${STOP_AFTER:-}" = exported ] && exit

# 7. CA failover and manual fail-back
ca1_before=$(conns puppetca ca1); ca2_before=$(conns puppetca ca2)
# re-seed the standby from the primary (docs/puppet.md step 4) so it continues the serials
rsync -a --delete "$W/ca1/ca/" "$W/ca2/ca/"
tkill=$(now_ms)
stop_pid ca1
wait_state puppetca ca1 down 30; down_ms=$(( $(now_ms) - tkill )); st_down=$(state puppetca ca1)
agent_conf f1 6
fb=0; agent f1 ssl bootstrap > "$W/agents/f1/bootstrap.log" 2>&1 && [ -s "$W/agents/f1/ssl/certs/f1.$DOMAIN.pem" ] && fb=1
ca2_after=$(conns puppetca ca2)
issuer_ok=0; grep -q "f1.$DOMAIN" "$W/ca2/ca/inventory.txt" && ! grep -q "f1.$DOMAIN" "$W/ca1/ca/inventory.txt" && issuer_ok=1
fserial=$(openssl x509 -noout -serial -in "$W/agents/f1/ssl/certs/f1.$DOMAIN.pem" 2>/dev/null | cut -d= -f2)
if [ "$st_down" = down ] && [ $fb = 1 ] && [ "$ca2_after" -gt "$ca2_before" ] && [ $issuer_ok = 1 ]; then
    pass ca-failover "ca1 stopped -> state $st_down after ${down_ms}ms; new agent f1 signed by ca2 (serial 0x$fserial, in ca2's inventory only); puppetca connections ca2 $ca2_before -> $ca2_after"
else
    fail ca-failover "ca1 state=$st_down after ${down_ms}ms; f1 bootstrap=$fb; ca2 connections $ca2_before -> $ca2_after; signed-by-ca2=$issuer_ok"
fi
# fail-back, as documented: primary stopped, copy the standby's CA back, start the primary
rsync -a --delete "$W/ca2/ca/" "$W/ca1/ca/"
trs=$(date +%s)
jvm_start ca1
if jvm_wait ca1 $IP_CA1; then
    restart_s=$(( $(date +%s) - trs ))
    wait_state puppetca ca1 standby 30; st_back=$(state puppetca ca1)
    c1a=$(conns puppetca ca1); c2a=$(conns puppetca ca2)
    # CA traffic while ca1 is standby: 3 CRL downloads through the puppetca VIP
    for _ in 1 2 3; do
        curl -s -o /dev/null --max-time 30 --cacert "$W/ca.pem" "https://puppetca.$DOMAIN:8140/puppet-ca/v1/certificate_revocation_list/ca"
    done
    c1b=$(conns puppetca ca1); c2b=$(conns puppetca ca2)
    en=$(CROSSBAR_ADMIN=$ADMIN "$CROSSBAR" backend enable puppetca/ca1 2>&1)
    st_en=$(state puppetca ca1)
    agent_conf f3 8
    f3ok=0; agent f3 ssl bootstrap > "$W/agents/f3/bootstrap.log" 2>&1 && [ -s "$W/agents/f3/ssl/certs/f3.$DOMAIN.pem" ] && f3ok=1
    c1c=$(conns puppetca ca1); c2c=$(conns puppetca ca2)
    f3ca1=0; grep -q "f3.$DOMAIN" "$W/ca1/ca/inventory.txt" && f3ca1=1
    if [ "$st_back" = standby ] && [ "$c1b" = "$c1a" ] && [ "$c2b" -gt "$c2a" ] && [ "$st_en" = up ] &&
       [ $f3ok = 1 ] && [ "$c1c" -gt "$c1b" ] && [ "$c2c" = "$c2b" ] && [ $f3ca1 = 1 ]; then
        pass ca-failback "ca1 restarted in ${restart_s}s -> $st_back, CA traffic stayed on ca2 (ca1 $c1a->$c1b, ca2 $c2a->$c2b); after rsync + 'crossbar backend enable puppetca/ca1' -> $st_en, f3 signed by ca1 (ca1 $c1b->$c1c, ca2 $c2b->$c2c)"
    else
        fail ca-failback "after restart state=$st_back (ca1 $c1a->$c1b, ca2 $c2a->$c2b); enable -> '$en' state=$st_en; f3 bootstrap=$f3ok in-ca1-inventory=$f3ca1 (ca1 $c1b->$c1c, ca2 $c2b->$c2c)"
    fi
else
    fail ca-failback "ca1 did not restart within ${JVM_START_TIMEOUT}s (log $W/ca1/log)"
fi
[ "${STOP_AFTER:-}" = failover ] && exit

# 8. metrics: every accepted connection relayed; no ClientHello errors
acc=$(metric crossbar_listener_accepts_total)
rel=$(metric crossbar_connections_total)
herr=$(metric crossbar_client_hello_errors_total)
refd=$(metric crossbar_route_refused_total)
cerr=$(metric crossbar_connect_errors_total)
per=$(curl -s --max-time 5 "$ADMIN/metrics" | grep -E '^crossbar_connections_total\{' |
      sed -E 's/.*service="([^"]+)".*backend="([^"]+)".* ([0-9.]+)$/\1\/\2=\3/; s/.*backend="([^"]+)".*service="([^"]+)".* ([0-9.]+)$/\2\/\1=\3/' | tr '\n' ' ')
if [ "$herr" = 0 ] && [ "$refd" = 0 ] && [ "$acc" = "$rel" ] && [ "$acc" -gt 0 ]; then
    pass metrics "accepted=$acc relayed=$rel (${per% }); client_hello_errors=$herr route_refused=$refd connect_errors=$cerr"
else
    fail metrics "accepted=$acc relayed=$rel (${per% }); client_hello_errors=$herr route_refused=$refd connect_errors=$cerr"
fi

echo "budget: total $(( $(date +%s) - T0 ))s (JVM start ${JVM_SECS}s for the two puppetservers, PuppetDB ${PDB_SECS}s, started together), 3 JVMs"
echo "$PASSED passed, $FAILED failed"
[ $FAILED = 0 ]
