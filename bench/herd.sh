#!/usr/bin/env bash
# The herd: real puppet agents arriving at once at two real puppetservers of
# different sizes, through crossbar with load feedback, crossbar `leastconn`,
# HAProxy `leastconn` and HAProxy `balance source`, in one run (docs/puppet.md "Load
# feedback in a herd").
#
#   sudo bench/herd.sh                       # 12 agents, compilers of 1 and 3 JRubies
#   sudo bench/herd.sh --gen 7               # Debian 12's Puppet 7 instead of 8
#   sudo bench/herd.sh --agents 6,8 --rounds 2 --sleep 8
#   sudo bench/herd.sh --capture tests/fixtures/jruby-metrics   # the JSON fixtures
#
# It edits /etc/hosts and starts two JVMs, so it takes the Puppet E2E's lock
# (/tmp/puppet-e2e.lock, as .ci/run does). It times things: run it alone on the
# machine (nothing else building or testing beside it).
#
# Options:
#   --gen 8|7         Puppet 8 (default: Debian 13's puppetserver 8.7 and agents 8.10 from
#                     the trixie root tests/puppet/root8.sh builds and caches; agents
#                     8.10 retry a 503 after Retry-After) or Puppet 7 (Debian 12's
#                     7.9.5 and 7.23 installed here; 7.23 fails a request it retries)
#   --agents N[,N...] agents in a herd (default 12); a list runs a herd of each size
#                     per round and mode (the site holds as many agents as the largest)
#   --rounds R        herds per mode, the modes interleaved (default 1)
#   --jrubies A,B     max-active-instances of compiler c1 and c2 (default 1,3)
#   --queue Q         max-queued-requests of both (default 2)
#   --retry-delay D   max-retry-delay of both, seconds (default 10)
#   --sleep S         seconds a catalog takes beyond its compile: generate('/bin/sleep', S) (default 2)
#   --modes LIST      of fb (crossbar, feedback), lc (crossbar leastconn), ha (HAProxy
#                     leastconn), hs (HAProxy balance source); default fb,lc,ha,hs
#   --strict-plugins  a failed pluginsync fails the agent's run (Puppet's default;
#                     here off, ignore_plugin_errors: Puppet 7.23's agent fails
#                     every request it retries after a 503, see herd-site.sh)
#   --capture DIR     instead of herds: write the jruby-metrics documents (idle,
#                     saturated, refused without a certificate, while starting) to DIR
# Environment: CROSSBAR_BIN (default target/release/crossbar, built if missing),
#   KEEP=1 keeps the work directory.
# Prints a markdown table per round and a summary; exit 0 when every herd ran,
# 2 on a setup error.
set -uo pipefail

if [ -z "${HERD_LOCKED:-}" ]; then
    exec flock /tmp/puppet-e2e.lock env HERD_LOCKED=1 "$0" "$@"
fi

SIZES=12 ROUNDS=1 JRUBIES=1,3 QUEUE=2 RETRY_DELAY=10 SLEEP=2 MODES=fb,lc,ha,hs CAPTURE= STRICT_PLUGINS=0 PUPPET_GEN=8
while [ $# -gt 0 ]; do
    case "$1" in
        --gen) PUPPET_GEN=$2; shift ;;
        --agents) SIZES=$2; shift ;;
        --rounds) ROUNDS=$2; shift ;;
        --jrubies) JRUBIES=$2; shift ;;
        --queue) QUEUE=$2; shift ;;
        --retry-delay) RETRY_DELAY=$2; shift ;;
        --sleep) SLEEP=$2; shift ;;
        --modes) MODES=$2; shift ;;
        --capture) CAPTURE=$(realpath -m "$2"); shift ;;
        --strict-plugins) STRICT_PLUGINS=1 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
J1=${JRUBIES%,*} J2=${JRUBIES#*,}
# the site's agents: as many as the largest herd
AGENTS=$(tr ',' '\n' <<< "$SIZES" | sort -n | tail -1)
[[ $SIZES =~ ^[0-9]+(,[0-9]+)*$ ]] && [ "$AGENTS" -gt 0 ] || { echo "--agents takes sizes: 6 or 6,8" >&2; exit 2; }

DOMAIN=hb.test
ROOT=$(cd "$(dirname "$0")/.." && pwd)
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

# shellcheck source=bench/herd-site.sh
source "$ROOT/bench/herd-site.sh"

# ================================================================== setup
[ "$(id -u)" = 0 ] || die "run as root (installs packages, edits /etc/hosts)"
case $PUPPET_GEN in
    # Puppet 8: the servers and agents from the root; here HAProxy, and Ruby (the
    # JSON one-liners) with Debian 12's agent
    8) PKGS="puppet-agent haproxy" ;;
    7) PKGS="puppetserver puppet-agent haproxy" ;;
    *) die "--gen $PUPPET_GEN: 7 or 8" ;;
esac
if ! command -v puppet >/dev/null || { [ "$PUPPET_GEN" = 7 ] && [ ! -f /usr/share/puppetserver/puppetserver.jar ]; } ||
   ! command -v haproxy >/dev/null; then
    log "installing $PKGS"
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y $PKGS >/dev/null 2>&1 ||
        { apt-get -o DPkg::Lock::Timeout=900 update >/dev/null 2>&1 &&
          DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y $PKGS >/dev/null 2>&1; } ||
        die "apt-get install $PKGS failed"
fi
if [ -z "$CAPTURE" ] && [ ! -x "$CROSSBAR" ]; then
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
W=$(mktemp -d /tmp/crossbar-herd.XXXXXX)
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

if [ -n "$CAPTURE" ]; then
    capture "$CAPTURE"
    exit 0
fi

# shellcheck source=bench/herd-run.sh
source "$ROOT/bench/herd-run.sh"
herds
