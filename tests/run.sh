#!/usr/bin/env bash
# The test command (README "Testing"; .ci/run calls it too): on a Debian machine it
# installs what the tests need, then runs every test with cargo-nextest's `ci`
# profile. Arguments go to nextest:
#
#   tests/run.sh                  # every test
#   tests/run.sh --test admin     # one test binary
#
# It stops before running any test, naming what is missing, when it can't install
# it (not root, no apt-get) or when the machine can't run the tests at all (no
# network namespaces). No test skips: a test whose tool is missing fails.
set -euo pipefail
cd "$(dirname "$0")/.."

stop() {
    echo "tests/run.sh: $*" >&2
    echo "tests/run.sh: no test was run" >&2
    exit 1
}

missing=()
# need PACKAGE COMMAND-OR-PATH: PACKAGE is missing unless COMMAND is on PATH (or the
# absolute PATH exists).
need() {
    case $2 in
        /*) [ -e "$2" ] ;;
        *) command -v "$2" >/dev/null ;;
    esac || missing+=("$1")
}
# openssl: real TLS peers (s_client, s_server) in the stickiness, relay, confirm
# and ticket-key tests.
need openssl openssl
# haproxy: the PROXY-protocol peer in tests/socket_options.rs and tests/proxy_accept.rs.
need haproxy haproxy
# iproute2 (`ip`, `ss`) and util-linux (`unshare`): network namespaces (tests/ha.rs,
# the freebind test) and keepalive timers (tests/socket_options.rs).
need iproute2 ip
need iproute2 ss
need util-linux unshare
# keepalived, nftables, curl: the two-node tests in tests/ha.rs.
need keepalived keepalived
need nftables nft
need curl curl
# JDK: real JDK TLS servers and clients (javac, java, keytool) in tests/confirm.rs,
# tests/ha.rs and tests/puppet (JdkResume.java).
need openjdk-17-jdk-headless javac
# chromium + chromedriver: tests/status_page.rs renders the admin status page in a
# real headless browser over WebDriver.
need chromium /usr/bin/chromium
need chromium-driver /usr/bin/chromedriver
# testssl.sh, sslscan: the scanners compared direct and through crossbar
# (tests/scanners.rs); golang: Go's crypto/tls client in tests/client_stacks.rs.
need testssl.sh testssl
need sslscan sslscan
need golang go
# dnsmasq: the real DNS server (SRV, A records) tests/discovery.rs changes under load.
need dnsmasq-base /usr/sbin/dnsmasq
# python3-dnslib: the scripted DNS server (tests/common/scripted_dns.py) that answers
# SERVFAIL, REFUSED, late or never, per name.
need python3-dnslib /usr/lib/python3/dist-packages/dnslib
# promtool: `promtool test rules` on docs/prometheus-alerts.yaml (tests/admin.rs).
need prometheus promtool
# The package test .ci/run runs next (tests/package/run.sh): man-db renders
# `man crossbar`, systemd provides systemd-analyze, adduser makes the system user,
# binutils strips.
need man-db man
need systemd systemd-analyze
need adduser adduser
need binutils strip

if [ ${#missing[@]} -gt 0 ]; then
    # One name per package (iproute2 is needed for two commands).
    mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
fi
list="${missing[*]:-}"
also=""
[ -z "$list" ] || also="; missing packages: $list"

# Network namespaces (root with CAP_SYS_ADMIN): the HA lab and the freebind test.
unshare -n true 2>/dev/null ||
    stop "cannot create a network namespace (\`unshare -n\`): the tests need root with CAP_SYS_ADMIN$also"

# apt_waiting ARGS...: apt-get ARGS, waiting for another apt run (unattended-upgrades
# on a freshly booted machine, another helper's install) to let go of its locks
# instead of failing at once. DPkg::Lock::Timeout covers the dpkg lock an install
# takes; apt-get update's lists lock it does not cover (apt 2.6: "Could not get lock
# /var/lib/apt/lists/lock" at once), so a run refused for a lock is tried again
# until APT_LOCK_WAIT seconds have passed.
APT_LOCK_WAIT=${APT_LOCK_WAIT:-900}
apt_waiting() {
    local deadline=$((SECONDS + APT_LOCK_WAIT)) out said=""
    while :; do
        if out=$(DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout="$APT_LOCK_WAIT" "$@" 2>&1); then
            printf '%s\n' "$out"
            return 0
        fi
        case $out in
            *"Could not get lock"* | *"Unable to lock"* | *"Unable to acquire the dpkg frontend lock"*)
                if [ "$SECONDS" -ge "$deadline" ]; then
                    printf '%s\n' "$out" >&2
                    return 1
                fi
                [ -n "$said" ] || echo "tests/run.sh: another apt run holds its lock; waiting (up to ${APT_LOCK_WAIT}s)" >&2
                said=1
                sleep 5
                ;;
            *)
                printf '%s\n' "$out" >&2
                return 1
                ;;
        esac
    done
}

if [ -n "$list" ]; then
    command -v apt-get >/dev/null || stop "no apt-get to install them (a Debian machine is expected)$also"
    echo "tests/run.sh: installing $list"
    apt_waiting update -qq || stop "apt-get update failed"
    apt_waiting install -y -qq "${missing[@]}" || stop "apt-get install $list failed"
fi

# proxy-protocol (PyPI): an independent PROXY protocol implementation that writes the
# headers crossbar receives and reads the ones it sends (tests/proxy_accept.rs).
if ! python3 -c "import proxyprotocol" 2>/dev/null; then
    echo "tests/run.sh: installing proxy-protocol (pip)"
    pip install -q proxy-protocol==0.11.3 2>/dev/null ||
        pip install -q --break-system-packages proxy-protocol==0.11.3 ||
        stop "pip install proxy-protocol failed"
fi

# sslyze (PyPI): the third scanner of tests/scanners.rs (its JSON output is compared).
if ! command -v sslyze >/dev/null; then
    echo "tests/run.sh: installing sslyze (pip)"
    pip install -q sslyze==6.3.1 2>/dev/null ||
        pip install -q --break-system-packages sslyze==6.3.1 ||
        stop "pip install sslyze failed"
fi

if ! cargo nextest --version >/dev/null 2>&1; then
    echo "tests/run.sh: installing cargo-nextest"
    cargo install --locked cargo-nextest
fi

exec cargo nextest run --profile ci "$@"
