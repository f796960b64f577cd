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

SIZES=12 ROUNDS=1 JRUBIES=1,3 QUEUE=2 RETRY_DELAY=10 SLEEP=2 MODES=fb,lc,ha,hs CAPTURE='' STRICT_PLUGINS=0 PUPPET_GEN=8
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

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# the site's names, addresses, timeouts, cleanup and setup (site_setup)
# shellcheck source=bench/herd-site.sh
source "$ROOT/bench/herd-site.sh"
site_setup crossbar-herd

if [ -n "$CAPTURE" ]; then
    capture "$CAPTURE"
    exit 0
fi

# shellcheck source=bench/herd-run.sh
source "$ROOT/bench/herd-run.sh"
herds
