#!/usr/bin/env bash
# Tests of the Puppet module packaging/puppet/crossbar (CI runs it from .ci/run, as
# root on a fresh Debian machine). Installs what it needs from Debian, then:
#   1. metadata.json (metadata-json-lint), `puppet parser validate`, `puppet epp
#      validate`, puppet-lint (warnings fail), REFERENCE.md as puppet-strings writes it;
#   2. the rspec-puppet suite (spec/): rendered pieces, type errors, the validate step,
#      the presets against docs/puppet.md and conf/puppet.yaml; run twice, each in a
#      private mount namespace: once with no /etc/facter/facter.conf, once with the one
#      a Puppet server (or this machine after tests/puppet/run.sh) has;
#   3. round trip through the real binary: `puppet apply` of tests/puppet-module/cases/*.pp
#      writes crossbar.yaml through concat's validate_cmd (`crossbar check`); the
#      result must hold the same data as the example it mirrors (conf/crossbar.yaml,
#      conf/shared-listener.yaml, cases/everything.yaml) and `crossbar check` must print
#      the same summary for both (conf/puppet.yaml from the presets: summary only);
#      cases/features.pp (discover, a listener with proxy_protocol and per_source,
#      extra keys, certname backends, the CA copied by the class) as cases/features.yaml;
#      a second apply changes nothing; a change `crossbar check` refuses (an unknown
#      key through `extra` included), or a wrong type, leaves the file as it was;
#   4. the Debian package built from the tree: the README's quick start applied
#      verbatim on this machine, the package coming from a local apt repository (the
#      apt provider, through APT_CONFIG: nothing of the machine's apt setup changes)
#      and the balancer's agent CA at Debian's path in a private mount namespace; then
#      installed by the module with `package_source` (the dpkg provider). Each time the
#      file is written root:crossbar 0640 and readable by the service user (`crossbar
#      check` as `crossbar`, what ExecReload runs), a second apply changes nothing,
#      then the package is purged. systemd is not PID 1 here (nor in CI): the module's
#      `service` (reload through `systemctl reload`) is checked by rspec, not run
#      (manage_service is false through Hiera for the quick start).
# A missing tool is a failure. Exit 0 when everything passed, 1 otherwise.
#
#   CROSSBAR_BIN=target/debug/crossbar tests/puppet-module/run.sh
#   NO_INSTALL=1   fail instead of apt-get installing the tools
#   INSTALL_ONLY=1 install them, then exit (.ci/run, before this runs beside other tests)
#   KEEP=1         keep the work directory
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
MOD=$ROOT/packaging/puppet/crossbar
CASES=$ROOT/tests/puppet-module/cases
BIN=$(realpath -m "${CROSSBAR_BIN:-target/debug/crossbar}")
SYSMODULES=/usr/share/puppet/modules
MODULEPATH=$ROOT/packaging/puppet:$SYSMODULES
PKGS=(puppet-agent ruby-rspec-puppet puppet-lint puppet-strings metadata-json-lint
    puppet-module-puppetlabs-stdlib puppet-module-puppetlabs-concat dpkg-dev)

T0=$(date +%s)
PASSED=0
FAILED=0
W=""
log() { printf '[%4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*" >&2; }
pass() { PASSED=$((PASSED + 1)); echo "PASS $1: $2"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL $1: $2"; }
die() { echo "FAIL setup: $*"; exit 1; }

PKG_INSTALLED=0
MADE_FACTER_DIR=0
cleanup() {
    [ "$PKG_INSTALLED" = 1 ] && dpkg --purge crossbar >/dev/null 2>&1
    [ "$MADE_FACTER_DIR" = 1 ] && rmdir /etc/facter 2>/dev/null
    if [ -n "$W" ] && [ -d "$W" ]; then
        if [ "${KEEP:-0}" = 1 ]; then log "kept $W"; else rm -rf "$W"; fi
    fi
}
trap cleanup EXIT

# ------------------------------------------------------------------ tools
[ "$(id -u)" = 0 ] || die "needs root (apt-get, dpkg, files owned by root)"
missing=()
for p in "${PKGS[@]}"; do
    [ "$(dpkg-query -W -f '${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    [ "${NO_INSTALL:-0}" = 1 ] && die "not installed: ${missing[*]}"
    log "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 ||
        { apt-get update >/dev/null 2>&1 &&
          apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1; } ||
        die "apt-get install ${missing[*]} failed"
fi
[ "${INSTALL_ONLY:-0}" = 1 ] && { log "installed: ${PKGS[*]}"; exit 0; }
for c in puppet puppet-lint rspec metadata-json-lint ruby openssl sha256sum unshare dpkg-scanpackages; do
    command -v "$c" >/dev/null || die "$c missing"
done
puppet strings --help >/dev/null 2>&1 || die "puppet strings missing"
[ -d "$SYSMODULES/stdlib" ] && [ -d "$SYSMODULES/concat" ] || die "stdlib or concat missing in $SYSMODULES"
[ -x "$BIN" ] || die "no crossbar binary at $BIN (set CROSSBAR_BIN)"
W=$(mktemp -d /tmp/crossbar-module.XXXXXX)
log "work dir $W; puppet $(puppet --version), binary $BIN"

# ------------------------------------------------------------ 1. static
out=$(metadata-json-lint --strict-dependencies --strict-license "$MOD/metadata.json" 2>&1) &&
    pass metadata "metadata.json valid" || fail metadata "$out"

n=0 bad=""
while IFS= read -r -d '' f; do
    n=$((n + 1))
    o=$(puppet parser validate --strict=error "$f" 2>&1) || bad+="$f: $o"$'\n'
done < <(find "$MOD/manifests" "$MOD/types" "$MOD/functions" "$CASES" -name '*.pp' -print0)
o=$(puppet epp validate "$MOD"/templates/*.epp 2>&1) || bad+="epp: $o"$'\n'
[ -z "$bad" ] && pass parser "$n manifests and $(ls "$MOD"/templates/*.epp | wc -l) templates valid" ||
    fail parser "$bad"

o=$(cd "$MOD" && puppet-lint --fail-on-warnings --relative manifests types functions 2>&1) &&
    pass lint "puppet-lint $(puppet-lint --version | awk '{print $2}'): no warnings" ||
    fail lint "$o"

# REFERENCE.md is what puppet-strings writes from the code's comments.
(cd "$MOD" && puppet strings generate --format markdown --out "$W/REFERENCE.md" \
    'manifests/**/*.pp' 'functions/**/*.pp' 'types/**/*.pp' >"$W/strings.log" 2>&1) ||
    fail reference "puppet strings: $(cat "$W/strings.log")"
if [ -f "$W/REFERENCE.md" ]; then
    if d=$(diff -u "$MOD/REFERENCE.md" "$W/REFERENCE.md"); then
        pass reference "REFERENCE.md matches puppet strings"
    else
        fail reference "REFERENCE.md is stale; regenerate (see packaging/puppet/crossbar/README.md): $(head -40 <<<"$d")"
    fi
    grep -q '^\[warn\]' "$W/strings.log" && fail reference-warnings "$(grep '^\[warn\]' "$W/strings.log")"
fi

# ------------------------------------------------------------- 2. rspec
# rspec_in with|without: the suite in a private mount namespace whose /etc/facter
# holds a facter.conf (as a Puppet server's, or this machine's after tests/puppet/run.sh)
# or nothing; the machine's own /etc/facter is never changed (made empty if missing).
[ -d /etc/facter ] || { mkdir /etc/facter && MADE_FACTER_DIR=1; }
rspec_in() {
    local d=$W/facter-$1
    mkdir -p "$d"
    [ "$1" = with ] && echo 'facts : { blocklist : [ "EC2", "GCE", "az_metadata", "cloud" ] }' > "$d/facter.conf"
    if unshare -m sh -c "mount --bind '$d' /etc/facter && cd '$MOD' && exec rspec spec" >"$W/rspec-$1.log" 2>&1; then
        pass "rspec-$1-facter-conf" "$(grep -E '^[0-9]+ examples' "$W/rspec-$1.log")"
    else
        fail "rspec-$1-facter-conf" "$(tail -60 "$W/rspec-$1.log")"
    fi
}
rspec_in without
rspec_in with
[ "$MADE_FACTER_DIR" = 1 ] && rmdir /etc/facter 2>/dev/null && MADE_FACTER_DIR=0

# ------------------------------------------------------- 3. round trip
# apply NAME OUT [SOURCE]: puppet apply of SOURCE (default cases/NAME.pp) writing OUT;
# the log in $W/NAME.log; sets RC.
apply() {
    local name=$1 out=$2 src=${3:-$CASES/$1.pp}
    sed -e "s#@OUT@#$out#g" -e "s#@BIN@#$BIN#g" -e "s#@W@#$W#g" "$src" > "$W/$name.pp"
    puppet apply --strict=error --detailed-exitcodes --color=false --modulepath="$MODULEPATH" \
        "$W/$name.pp" > "$W/$name.log" 2>&1
    RC=$?
}
same_data() { # A B: the two YAML files hold the same data
    ruby -ryaml -e 'a, b = ARGV.map { |f| YAML.safe_load(File.read(f)) }
        exit 0 if a == b
        (a.keys | b.keys).each { |k| warn "#{k}: #{a[k].inspect}\n  != #{b[k].inspect}" unless a[k] == b[k] }
        exit 1' "$1" "$2"
}
summary() { # FILE: `crossbar check --config-only`'s summary, the file name taken out and
    # the services sorted by name (crossbar lists them in file order, the module by name;
    # the order means nothing to crossbar)
    "$BIN" check --config-only -c "$1" 2>&1 | sed -e "s#$1#FILE#g" | ruby -e '
        lines = $stdin.readlines
        tail = lines.select { |l| l.start_with?("relay: ", "FILE: ") }
        blocks = (lines - tail).join.split(/\n\n+/).map(&:chomp)
        puts blocks[0], *blocks[1..].sort, *tail.sort'
}
roundtrip() { # CASE REFERENCE data|summary [SOURCE]
    local case=$1 ref=$2 how=$3 out=$W/$1.yaml
    apply "$case" "$out" "${4:-}"
    if [ "$RC" != 2 ] || [ ! -s "$out" ]; then
        fail "roundtrip-$case" "puppet apply exit $RC (2 = changes applied): $(grep -v 'rb_sysopen - /proc/1/environ' "$W/$case.log" | tail -20)"
        return
    fi
    grep -q "Concat\[$out\]/File\[$out\]/ensure: defined content" "$W/$case.log" ||
        { fail "roundtrip-$case" "no file written: $(cat "$W/$case.log")"; return; }
    local ds="" ss
    if [ "$how" = data ]; then
        ds=$(same_data "$out" "$ref" 2>&1) ||
            { fail "roundtrip-$case" "data differs from $ref: $ds"; return; }
        ds=", same data"
    fi
    ss=$(diff <(summary "$ref") <(summary "$out")) ||
        { fail "roundtrip-$case" "crossbar check summaries differ from $ref: $ss"; return; }
    grep -q ': OK$' <(summary "$out") || { fail "roundtrip-$case" "crossbar check: $(summary "$out")"; return; }
    local shown=${ref#"$ROOT"/}
    shown=${shown/#$W\/everything-expected.yaml/tests/puppet-module/cases/everything.yaml}
    pass "roundtrip-$case" "written through crossbar check as $shown$ds, same check summary ($(grep -c '^service ' <(summary "$out")) services)"
}

roundtrip crossbar "$ROOT/conf/crossbar.yaml" data
roundtrip shared-listener "$ROOT/conf/shared-listener.yaml" data

# listeners: the same, the address's settings given once to the class (`listeners`)
# instead of in puppetca's long-form entry: the module writes them with each service,
# and crossbar must read what it reads from the file, which writes them once.
long="'listen' => \[{ 'address' => '10.0.0.10:8140', 'freebind' => true, 'per_source' => { 'max_connections' => 20 } }\],"
sed -e "s#$long#'listen' => ['10.0.0.10:8140'],#" \
    -e "s#^  defaults       => #  listeners      => { '10.0.0.10:8140' => { 'freebind' => true, 'per_source' => { 'max_connections' => 20 } } },\n&#" \
    "$CASES/shared-listener.pp" > "$W/listeners.src"
if [ "$(grep -c "listeners      => \|'listen' => \['10.0.0.10:8140'\]" "$W/listeners.src")" = 4 ]; then
    roundtrip listeners "$ROOT/conf/shared-listener.yaml" summary "$W/listeners.src"
    [ "$(grep -c "address: '10.0.0.10:8140', freebind: true, per_source: {max_connections: 20}" "$W/listeners.yaml")" = 3 ] &&
        pass listeners-written "listeners' settings written with each of the 3 services listing the address" ||
        fail listeners-written "$(grep -n 'listen:' "$W/listeners.yaml")"
else
    fail listeners "cases/shared-listener.pp no longer has the lines this case changes: $(cat "$W/listeners.src")"
fi
# Two services writing one setting of their shared address differently: the types
# let it pass, crossbar check refuses it naming the setting, the file stays as it was.
if [ -s "$W/shared-listener.yaml" ]; then
    before=$(sha256sum < "$W/shared-listener.yaml")
    sed "s#'listen' => \['10.0.0.10:8140'\], 'server_names' => \['puppetfiles#'listen' => [{ 'address' => '10.0.0.10:8140', 'freebind' => false }], 'server_names' => ['puppetfiles#" \
        "$CASES/shared-listener.pp" > "$W/differing.src"
    apply differing "$W/shared-listener.yaml" "$W/differing.src"
    msg=$(grep -o "services\.puppetfiles\.listen\[0\]\.freebind: [^\"]*" "$W/differing.log" | head -1)
    { [ "$RC" = 4 ] || [ "$RC" = 6 ]; } && [ "$before" = "$(sha256sum < "$W/shared-listener.yaml")" ] && [ -n "$msg" ] &&
        pass refused-shared "apply exit $RC: crossbar check said \"${msg:0:120}\"; file unchanged" ||
        fail refused-shared "apply exit $RC: $(grep -v environ "$W/differing.log" | tail -10)"
fi
roundtrip presets "$ROOT/conf/puppet.yaml" summary

# everything: every key, and the files it names (checked by the module's validate_cmd).
mkdir -p "$W/state"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=lb.test \
    -keyout "$W/lb.key" -out "$W/lb.pem" >/dev/null 2>&1 || die "openssl req"
cp "$W/lb.pem" "$W/ca.pem"
chmod 600 "$W/lb.key"
sed "s#@W@#$W#g" "$CASES/everything.yaml" > "$W/everything-expected.yaml"
roundtrip everything "$W/everything-expected.yaml" data

# features: discover, a listener with proxy_protocol and per_source, extra keys; the
# class copies the CA (ca_source) to where the configuration names it.
mkdir -p "$W/etc"
sed "s#@W@#$W#g" "$CASES/features.yaml" > "$W/features-expected.yaml"
roundtrip features "$W/features-expected.yaml" data
if [ -s "$W/features.yaml" ]; then
    [ "$(stat -c '%a' "$W/etc/puppet-ca.pem")" = 644 ] && cmp -s "$W/ca.pem" "$W/etc/puppet-ca.pem" &&
        pass ca-source "ca_source copied the CA to ca_file (0644) before the check opened it" ||
        fail ca-source "$(stat -c '%a %U:%G' "$W/etc/puppet-ca.pem" 2>&1)"
    before=$(sha256sum < "$W/features.yaml")
    # A key crossbar does not know, through `extra`: the types let it pass, the check
    # refuses it and the file stays as it was.
    sed "s#  extra    => { 'discover' => { 'max_backends' => 16 } },#  extra    => { 'discover' => { 'max_backends' => 16 }, 'frobnicate' => true },#" \
        "$CASES/features.pp" > "$W/unknown.src"
    apply unknown "$W/features.yaml" "$W/unknown.src"
    msg=$(grep -o "services\.puppet\.frobnicate[^\"]*" "$W/unknown.log" | head -1)
    { [ "$RC" = 4 ] || [ "$RC" = 6 ]; } && [ "$before" = "$(sha256sum < "$W/features.yaml")" ] && [ -n "$msg" ] &&
        pass refused-extra "apply exit $RC: crossbar check said \"${msg:0:100}\"; file unchanged" ||
        fail refused-extra "apply exit $RC: $(grep -v environ "$W/unknown.log" | tail -10)"
fi
OUT=$W/everything.yaml
if [ -s "$OUT" ]; then
    [ "$(stat -c %a "$W/admin.token")" = 640 ] && [ "$(cat "$W/admin.token")" = t0ken-from-hiera ] &&
        pass token-file "admin_token written to admin.token_file, mode 0640, before the check read it" ||
        fail token-file "$(stat -c '%a %U:%G' "$W/admin.token"): $(cat "$W/admin.token")"

    apply everything "$OUT"
    [ "$RC" = 0 ] && pass idempotent "second puppet apply: exit 0 (no change)" ||
        fail idempotent "second puppet apply exit $RC (0 = no change): $(grep -v environ "$W/everything.log" | tail -20)"

    before=$(sha256sum < "$OUT")
    # A change every Puppet type accepts but crossbar refuses: two backends named
    # ca1 in one service (one inline, one declared).
    cp "$CASES/everything.pp" "$W/refused.src"
    printf "crossbar::backend { 'dup': service => 'puppetca', backend_name => 'ca1', address => '127.0.0.1:28149' }\n" >> "$W/refused.src"
    apply refused "$OUT" "$W/refused.src"
    after=$(sha256sum < "$OUT")
    msg=$(grep -o "services\.puppetca\.backends\[[0-9]\]\.name: [^\"]*" "$W/refused.log" | head -1)
    if [ "$RC" = 4 ] || [ "$RC" = 6 ]; then
        if [ "$before" = "$after" ] && [ -n "$msg" ] && ! ls "$W" | grep -q '^everything.yaml.\+'; then
            pass refused-by-check "apply exit $RC, crossbar check said \"${msg:0:110}\"; file unchanged, no temporary file left"
        else
            fail refused-by-check "file changed or no crossbar message: $(grep -v environ "$W/refused.log" | tail -10)"
        fi
    else
        fail refused-by-check "apply exit $RC (want 4/6: failures): $(grep -v environ "$W/refused.log" | tail -10)"
    fi

    # A change while the state-file directory is gone: the full check (the module's
    # default) refuses it.
    rmdir "$W/state"
    sed "s#weight          => 2,#weight          => 3,#" "$CASES/everything.pp" > "$W/nostate.src"
    apply nostate "$OUT" "$W/nostate.src"
    after=$(sha256sum < "$OUT")
    msg=$(grep -o "stick.state_file: [^\"]*" "$W/nostate.log" | head -1)
    { [ "$RC" = 4 ] || [ "$RC" = 6 ]; } && [ "$before" = "$after" ] && [ -n "$msg" ] &&
        pass refused-files "apply exit $RC with the state-file directory missing: \"${msg:0:100}\"; file unchanged" ||
        fail refused-files "apply exit $RC, file $([ "$before" = "$after" ] && echo unchanged || echo CHANGED): $(grep -v environ "$W/nostate.log" | tail -10)"
    mkdir "$W/state"

    # A wrong type: the catalog does not compile, nothing is touched.
    sed "s#'idle' => '1h 30m'#'idle' => '90'#" "$CASES/everything.pp" > "$W/badtype.src"
    apply badtype "$OUT" "$W/badtype.src"
    after=$(sha256sum < "$OUT")
    msg=$(grep -o "parameter 'defaults' entry 'timeouts' entry 'idle' expects a match for Crossbar::Duration" "$W/badtype.log")
    [ "$RC" = 1 ] && [ "$before" = "$after" ] && [ -n "$msg" ] &&
        pass refused-type "catalog not compiled (exit 1): \"$msg\"; file unchanged" ||
        fail refused-type "apply exit $RC: $(grep -v environ "$W/badtype.log" | tail -5)"
fi

# ------------------------------------------- 4. the package, installed by the module
# installed_ok NAME APPLY-LOG: after an apply that installed the package and wrote the
# file: the file's owner and mode, and the crossbar user's own check (ExecReload's)
installed_ok() {
    local f=/etc/crossbar/crossbar.yaml mode check
    mode=$(stat -c '%U:%G %a' $f 2>&1)
    grep -q "^# crossbar configuration, managed by Puppet" $f && [ "$mode" = "root:crossbar 640" ] ||
        { fail "$1" "$f: $mode: $(head -3 $f 2>&1); $(grep -v environ "$2" | tail -10)"; return 1; }
    check=$(runuser -u crossbar -- /usr/bin/crossbar check 2>&1) ||
        { fail "$1" "crossbar check as the crossbar user (what ExecReload runs): $check"; return 1; }
}

# The README's quick start, verbatim (the puppet block between its markers), on this
# machine as on a fresh balancer: the package from a repository (a local one, through
# APT_CONFIG), /etc/crossbar and /var/lib/crossbar from the package and the module,
# the balancer's agent CA where Debian's agent keeps it (a tmpfs over /var/lib/puppet
# in a private mount namespace), `crossbar_admin_token` and manage_service => false
# (no systemd here) from Hiera.
quickstart() {
    local deb=$1 repo=$W/repo rc
    sed -n '/^<!-- quick start: begin -->$/,/^<!-- quick start: end -->$/p' "$MOD/README.md" |
        sed -n '/^```puppet$/,/^```$/p' | sed '1d;$d' > "$W/quickstart.pp"
    grep -q "^class { 'crossbar':" "$W/quickstart.pp" ||
        { fail quickstart "no quick start block between the markers of $MOD/README.md"; return; }
    mkdir -p "$repo/lists/partial" "$repo/parts" "$repo/cache/archives/partial" "$W/hiera/data"
    cp "$ROOT/$deb" "$repo/"
    (cd "$repo" && dpkg-scanpackages --multiversion . /dev/null > Packages 2>"$W/scanpackages.log") ||
        { fail quickstart "dpkg-scanpackages: $(cat "$W/scanpackages.log")"; return; }
    echo "deb [trusted=yes] file:$repo ./" > "$repo/sources.list"
    cat > "$repo/apt.conf" <<EOF
Dir::Etc::SourceList "$repo/sources.list";
Dir::Etc::SourceParts "$repo/parts";
Dir::State::Lists "$repo/lists";
Dir::Cache "$repo/cache";
DPkg::Lock::Timeout "900";
EOF
    export APT_CONFIG=$repo/apt.conf
    apt-get update > "$W/quickstart-apt.log" 2>&1 || { unset APT_CONFIG; fail quickstart "apt-get update of the local repository: $(tail -5 "$W/quickstart-apt.log")"; return; }
    printf -- "---\nversion: 5\ndefaults:\n  datadir: %s/hiera/data\n  data_hash: yaml_data\nhierarchy:\n  - name: test\n    path: test.yaml\n" "$W" > "$W/hiera/hiera.yaml"
    printf -- "---\ncrossbar_admin_token: from-hiera\ncrossbar::manage_service: false\n" > "$W/hiera/data/test.yaml"
    local run="mount -t tmpfs -o mode=0750 tmpfs /var/lib/puppet && mkdir -p /var/lib/puppet/ssl/certs"
    run+=" && cp '$W/ca.pem' /var/lib/puppet/ssl/certs/ca.pem && exec puppet apply --strict=error"
    run+=" --detailed-exitcodes --color=false --modulepath='$MODULEPATH' --hiera_config='$W/hiera/hiera.yaml' '$W/quickstart.pp'"
    unshare -m sh -c "$run" > "$W/quickstart.log" 2>&1
    rc=$?
    dpkg -s crossbar >/dev/null 2>&1 && PKG_INSTALLED=1
    [ "$rc" = 2 ] || { unset APT_CONFIG; fail quickstart "puppet apply exit $rc: $(grep -v environ "$W/quickstart.log" | tail -20)"; return; }
    installed_ok quickstart "$W/quickstart.log" || { unset APT_CONFIG; return; }
    cmp -s "$W/ca.pem" /etc/crossbar/puppet-ca.pem || { unset APT_CONFIG; fail quickstart "/etc/crossbar/puppet-ca.pem is not the agent's CA"; return; }
    unshare -m sh -c "$run" > "$W/quickstart2.log" 2>&1
    rc=$?
    unset APT_CONFIG
    [ "$rc" = 0 ] || { fail quickstart "second apply exit $rc (0 = no change): $(grep -v environ "$W/quickstart2.log" | tail -20)"; return; }
    pass quickstart "README.md's quick start applied verbatim: the apt provider installed $(basename "$deb") from a repository, the module made /var/lib/crossbar and copied the agent's CA before crossbar check read them, wrote /etc/crossbar/crossbar.yaml (root:crossbar 640) that the crossbar user checks OK; second apply: no change"
}

pkgtest() {
    local deb=$1
    cat > "$W/package.pp" <<EOF
class { 'crossbar':
  package_source => '$ROOT/$deb',
  manage_service => false, # systemd is not PID 1 here
  admin_token    => Sensitive('from-puppet'),
  services       => {
    'puppet' => {
      'preset'   => 'puppet',
      'listen'   => ['127.0.0.1:18140'],
      'backends' => [{ 'name' => 'compile1.example.com', 'address' => '127.0.0.1:28140' }],
    },
  },
}
EOF
    puppet apply --strict=error --detailed-exitcodes --color=false --modulepath="$MODULEPATH" \
        "$W/package.pp" > "$W/package.log" 2>&1
    local rc=$?
    dpkg -s crossbar >/dev/null 2>&1 && PKG_INSTALLED=1
    [ "$rc" = 2 ] || { fail package "puppet apply exit $rc: $(grep -v environ "$W/package.log" | tail -20)"; return; }
    installed_ok package "$W/package.log" || return
    puppet apply --strict=error --detailed-exitcodes --color=false --modulepath="$MODULEPATH" \
        "$W/package.pp" > "$W/package2.log" 2>&1
    rc=$?
    [ "$rc" = 0 ] || { fail package "second apply exit $rc (0 = no change): $(grep -v environ "$W/package2.log" | tail -20)"; return; }
    pass package "the module installed $(basename "$deb") (package_source, the dpkg provider), wrote /etc/crossbar/crossbar.yaml that the crossbar user checks OK; second apply: no change"
}
exec 9>/tmp/crossbar-package-test.lock
flock 9   # the package test (tests/package/run.sh) installs the same package
if dpkg -s crossbar >/dev/null 2>&1; then
    fail package "a crossbar package is already installed; remove it first (dpkg --purge crossbar)"
elif DEB=$(CROSSBAR_BIN="$BIN" packaging/build-deb.sh 2>"$W/build-deb.log"); then
    quickstart "$DEB"
    dpkg --purge crossbar >/dev/null 2>&1; PKG_INSTALLED=0
    pkgtest "$DEB"
    dpkg --purge crossbar >/dev/null 2>&1; PKG_INSTALLED=0
else
    fail package "packaging/build-deb.sh: $(tail -5 "$W/build-deb.log")"
fi
flock -u 9

echo "$PASSED passed, $FAILED failed ($(( $(date +%s) - T0 ))s)"
[ "$FAILED" = 0 ]
