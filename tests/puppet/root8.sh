#!/usr/bin/env bash
# Puppet 8 for the E2E (tests/puppet/run.sh PUPPET_GEN=8) and bench/herd.sh: a Debian 13
# (trixie) root built with debootstrap from Debian's own packages (puppetserver 8.7,
# puppet-agent 8.10, PuppetDB 8.4 and its terminus, the modules the E2E's site uses),
# cached between runs under $PUPPET8_CACHE (default /var/cache/crossbar-puppet8), one
# directory per recipe (suite + package list); the package versions it got are in its
# etc/crossbar-puppet8.versions. Works as root on a fresh Debian 12 machine: it installs
# debootstrap like every other tool.
#
#   tests/puppet/root8.sh              # prints the root's path (built if missing)
#
# Environment: PUPPET8_MIRROR (default http://deb.debian.org/debian), PUPPET8_CACHE,
# NO_INSTALL=1 (fail instead of building). Measured on 2 busy cores: ~2.5 min to build.
set -euo pipefail

SUITE=trixie
MIRROR=${PUPPET8_MIRROR:-http://deb.debian.org/debian}
CACHE=${PUPPET8_CACHE:-/var/cache/crossbar-puppet8}
# what the root holds: the agent (debootstrap's --include), then the servers
BASE_PKGS="puppet-agent,ca-certificates"
SERVER_PKGS="puppetserver puppetdb puppet-terminus-puppetdb puppet-module-puppetlabs-stdlib puppet-module-puppetlabs-concat puppet-module-puppetlabs-haproxy"
RECIPE_KEY=$(printf '%s\n' "$SUITE" "$BASE_PKGS" "$SERVER_PKGS" "v1" | sha256sum | cut -c1-12)
ROOTFS=$CACHE/$SUITE-$RECIPE_KEY

msg() { echo "root8: $*" >&2; }
[ "$(id -u)" = 0 ] || { msg "run as root (debootstrap, chroot)"; exit 2; }

if [ -f "$ROOTFS/etc/crossbar-puppet8.versions" ]; then
    echo "$ROOTFS"
    exit 0
fi
[ "${NO_INSTALL:-0}" = 1 ] && { msg "no root at $ROOTFS and NO_INSTALL=1"; exit 2; }
if ! command -v debootstrap >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y debootstrap >/dev/null 2>&1 ||
        { apt-get -o DPkg::Lock::Timeout=900 update >/dev/null 2>&1 &&
          DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y debootstrap >/dev/null 2>&1; } ||
        { msg "apt-get install debootstrap failed"; exit 2; }
fi
# debootstrap of bookworm knows trixie through its script of the same family
[ -e /usr/share/debootstrap/scripts/$SUITE ] || { msg "debootstrap has no script for $SUITE"; exit 2; }

mkdir -p "$CACHE"
BUILD=$(mktemp -d "$CACHE/build.XXXXXX")
unmount_build() {
    for m in proc sys dev/pts dev; do mountpoint -q "$BUILD/$m" 2>/dev/null && umount -l "$BUILD/$m"; done
    return 0
}
trap 'rc=$?; unmount_build; [ $rc = 0 ] || rm -rf --one-file-system "$BUILD"; exit $rc' EXIT
t0=$(date +%s)
msg "debootstrap $SUITE into $BUILD (from $MIRROR)"
debootstrap --variant=minbase --include="$BASE_PKGS" "$SUITE" "$BUILD" "$MIRROR" > "$BUILD.log" 2>&1 ||
    { tail -30 "$BUILD.log" >&2; msg "debootstrap failed (log $BUILD.log)"; exit 2; }
mount -t proc proc "$BUILD/proc"
msg "installing $SERVER_PKGS"
# shellcheck disable=SC2086
DEBIAN_FRONTEND=noninteractive chroot "$BUILD" apt-get install -y --no-install-recommends $SERVER_PKGS >> "$BUILD.log" 2>&1 ||
    { tail -30 "$BUILD.log" >&2; msg "apt-get install in the root failed (log $BUILD.log)"; exit 2; }
chroot "$BUILD" apt-get clean
# keep facter off the network (PUPPET-NOTES: it queries a cloud metadata address)
mkdir -p "$BUILD/etc/facter"
echo 'facts : { blocklist : [ "EC2", "GCE", "az_metadata", "cloud" ] }' > "$BUILD/etc/facter/facter.conf"
# services never start inside the root (no systemd, no init scripts on install)
chroot "$BUILD" dpkg-query -W -f='${Package} ${Version}\n' puppet-agent puppetserver puppetdb \
    puppet-terminus-puppetdb puppet-module-puppetlabs-stdlib puppet-module-puppetlabs-concat \
    puppet-module-puppetlabs-haproxy openjdk-21-jre-headless ruby3.3 > "$BUILD/etc/crossbar-puppet8.versions"
unmount_build
rm -rf --one-file-system "$ROOTFS"
mv "$BUILD" "$ROOTFS"
# roots of older recipes, unless a run has something mounted in them
for old in "$CACHE/$SUITE"-*; do
    [ "$old" = "$ROOTFS" ] || grep -q " $old/" /proc/mounts || rm -rf --one-file-system "$old"
done
rm -f "$BUILD.log"
trap - EXIT
msg "built $ROOTFS in $(( $(date +%s) - t0 ))s: $(tr '\n' ' ' < "$ROOTFS/etc/crossbar-puppet8.versions")"
echo "$ROOTFS"
