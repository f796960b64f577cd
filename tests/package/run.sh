#!/usr/bin/env bash
# Acceptance test of the Debian package on this machine (root; CI runs it from .ci/run):
# build it, `dpkg -i`, `crossbar check` with no -c, `systemd-analyze verify` and
# `security` on the installed unit (score asserted), `man crossbar` renders, the
# completions load, then `dpkg --purge` leaves nothing behind except the crossbar
# user and group (Debian policy keeps them).
#
#   CROSSBAR_BIN=target/debug/crossbar tests/package/run.sh   # package that binary
#
# systemd is not PID 1 here (nor in CI): the unit is verified and scored offline, and
# the maintainer scripts skip starting it; the reload command and the sd_notify
# messages are tested without systemd in tests/reload/command.rs.
set -euo pipefail
cd "$(dirname "$0")/../.."

MAX_EXPOSURE=2.0   # the issue's bar for `systemd-analyze security`
fail() { echo "PACKAGE: FAIL: $*" >&2; exit 1; }
step() { echo "PACKAGE: $*"; }

[ "$(id -u)" = 0 ] || fail "needs root (dpkg -i)"
if dpkg -s crossbar >/dev/null 2>&1; then
    fail "a crossbar package is already installed; remove it first (dpkg --purge crossbar)"
fi
exec 9>/tmp/crossbar-package-test.lock
flock 9   # one package test at a time on this machine

deb=$(packaging/build-deb.sh)
step "built $deb ($(du -h "$deb" | cut -f1))"
cleanup() { dpkg --purge crossbar >/dev/null 2>&1 || true; }
trap cleanup EXIT

dpkg -i "$deb" >/dev/null || fail "dpkg -i"
[ "$(dpkg-query -W -f '${Status}' crossbar)" = "install ok installed" ] || fail "not installed"
getent passwd crossbar >/dev/null || fail "no crossbar user"
for f in /usr/bin/crossbar /etc/crossbar/crossbar.yaml /lib/systemd/system/crossbar.service \
    /usr/share/man/man1/crossbar.1.gz /usr/share/bash-completion/completions/crossbar \
    /usr/share/man/man1/crossbar-run.1.gz /usr/share/doc/crossbar/copyright; do
    [ -e "$f" ] || fail "$f missing after install"
done
[ ! -e /usr/bin/loadgen ] || fail "the bench tools must not be installed"
[ "$(stat -c %U:%G:%a /etc/crossbar)" = root:crossbar:750 ] || fail "/etc/crossbar: $(stat -c %U:%G:%a /etc/crossbar)"
grep -qx /etc/crossbar/crossbar.yaml /var/lib/dpkg/info/crossbar.conffiles || fail "not a conffile"
step "installed: user, files, conffile, no bench tools"

out=$(runuser -u crossbar -- crossbar check) || fail "crossbar check (no -c) as the crossbar user: $out"
grep -q "^/etc/crossbar/crossbar.yaml: OK$" <<<"$out" || fail "check did not use the default path: $out"
step "crossbar check with no -c: OK"

unit=/lib/systemd/system/crossbar.service
verify=$(systemd-analyze verify "$unit" 2>&1) || fail "systemd-analyze verify: $verify"
[ -z "$verify" ] || fail "systemd-analyze verify warns: $verify"
score=$(systemd-analyze security --offline=true "$unit" 2>&1 | sed -n 's/.*Overall exposure level for .*: \([0-9.]*\) .*/\1/p')
[ -n "$score" ] || fail "no exposure score"
awk -v s="$score" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(s <= m) }' || fail "exposure $score > $MAX_EXPOSURE"
step "unit verified; systemd-analyze security exposure $score (<= $MAX_EXPOSURE)"

man_text=$(MANWIDTH=80 man -P cat crossbar 2>&1 | tr -s " ") || fail "man crossbar: $man_text"
grep -q "Layer-4 TLS-passthrough load balancer" <<<"$man_text" || fail "man page: $man_text"
grep -q "crossbar-reload(1)" <<<"$man_text" || fail "man page lacks the subcommands"
sub=$(MANWIDTH=80 man -P cat crossbar-reload 2>&1) || fail "man crossbar-reload: $sub"
grep -q -- "--config" <<<"$sub" || fail "man crossbar-reload: $sub"
step "man crossbar renders ($(wc -l <<<"$man_text") lines)"

# The bash completion offers the subcommands: the function the installed script
# registers for `crossbar` (complete -p names it), called as bash would at a TAB.
words=$(bash -c 'source /usr/share/bash-completion/completions/crossbar
    fn=$(complete -p crossbar | sed -n "s/.* -F \([^ ]*\) .*/\1/p")
    [ -n "$fn" ] || { echo "no completion function registered for crossbar"; exit 0; }
    COMP_WORDS=(crossbar re); COMP_CWORD=1; COMP_LINE="crossbar re"; COMP_POINT=${#COMP_LINE}
    "$fn" crossbar re crossbar; echo "${COMPREPLY[@]}"')
grep -qw reload <<<"$words" || fail "bash completion of 're': '$words'"
step "bash completion: 'crossbar re<TAB>' -> $words"

files=$(dpkg -L crossbar)
mkdir -p /var/lib/crossbar && touch /var/lib/crossbar/puppet.table   # as a running crossbar would
dpkg --purge crossbar >/dev/null || fail "dpkg --purge"
trap - EXIT
left=()
while read -r f; do
    case "$f" in /. | /etc | /lib | /lib/systemd | /lib/systemd/system | /usr | /usr/bin | /usr/share | \
        /usr/share/man | /usr/share/man/man1 | /usr/share/doc | /usr/share/bash-completion | \
        /usr/share/bash-completion/completions | /usr/share/zsh | /usr/share/zsh/vendor-completions | \
        /usr/share/fish | /usr/share/fish/vendor_completions.d) continue ;; esac
    [ -e "$f" ] && left+=("$f")
done <<<"$files"
for f in /etc/crossbar /var/lib/crossbar /run/crossbar /etc/systemd/system/multi-user.target.wants/crossbar.service \
    /var/lib/dpkg/info/crossbar.list; do
    [ -e "$f" ] && left+=("$f")
done
[ ${#left[@]} -eq 0 ] || fail "left behind after purge: ${left[*]}"
step "purged: nothing left but the crossbar user and group (Debian policy keeps them)"
step "PASS"
