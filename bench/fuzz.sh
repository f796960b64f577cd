#!/usr/bin/env bash
# Run each cargo-fuzz target of fuzz/ for N seconds (default 60) and print, per
# target, libFuzzer's exec count, exec/s, coverage (cov = edges, ft = features) and
# corpus size. Needs a nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`);
# CI never runs this: tests/fuzz_props.rs checks the same properties on stable.
#
#   bench/fuzz.sh                 # every target, 60 s each
#   bench/fuzz.sh 20 config       # 20 s, one target
#   FUZZ_SANITIZER=address bench/fuzz.sh 60   # with ASan (slower; default none:
#                                             # crossbar is #![deny(unsafe_code)])
#
# Seeds come from tests/fixtures (hellos, server flights, config files); the working
# corpus and any crash artifacts stay under fuzz/target/ and fuzz/artifacts/. A crash
# stops that target and is reported with its artifact path: minimise it with
# `cargo +nightly fuzz tmin <target> <artifact>` and add it to tests/fuzz_props.rs.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(client_hello server_watcher proxy_header proxy_accept config)
sanitizer=${FUZZ_SANITIZER:-none}

seeds=fuzz/target/seeds
rm -rf "$seeds"
mkdir -p "$seeds"/{client_hello,server_watcher,proxy_header,config}
# client_hello: first byte = segment length selector (1..=64 bytes per read).
for f in tests/fixtures/hellos/*.bin tests/fixtures/server_flights/*.hello.bin; do
    b=$(basename "$f" .bin)
    for seg in 00 05 3f; do
        { printf "\\x$seg"; cat "$f"; } > "$seeds/client_hello/$b.$seg"
    done
done
# server_watcher: byte 1 = chunk length selector, byte 2 = limit selector (1: 64 KiB).
for f in tests/fixtures/server_flights/*.server.bin; do
    b=$(basename "$f" .bin)
    for seg in 00 0f 7f; do
        { printf "\\x$seg\\x01"; cat "$f"; } > "$seeds/server_watcher/$b.$seg"
    done
done
# proxy_header: flag byte, 32 address bytes, 4 port bytes, authority.
printf '\x80\x0a\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x0a\x00\x00\x0a\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x0f\xa0\x1f\xccpuppet.example.com' \
    > "$seeds/proxy_header/v4_sni"
printf '\x91\x20\x01\x0d\xb8\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x01\xff\xff' \
    > "$seeds/proxy_header/v6"
cp conf/*.yaml tests/fixtures/config/bad/*.yaml "$seeds/config/"

summary=$(mktemp)
trap 'rm -f "$summary"' EXIT
printf '%-15s %12s %10s %8s %8s %10s  %s\n' target execs exec/s cov ft corpus result >> "$summary"
for t in "${targets[@]}"; do
    corpus=fuzz/target/corpus/$t
    mkdir -p "$corpus"
    log=fuzz/target/fuzz-$t.log
    echo "== $t: ${secs}s (sanitizer $sanitizer) -> $log"
    result=ok
    (cd fuzz && cargo +nightly fuzz run --sanitizer "$sanitizer" "$t" \
        "../$corpus" "../$seeds/$t" -- \
        -max_total_time="$secs" -print_final_stats=1 -rss_limit_mb=2048 -timeout=10) \
        > "$log" 2>&1 || result="CRASH (see $log, fuzz/artifacts/$t/)"
    # libFuzzer's last status line: "#N  DONE  cov: C ft: F corp: K/S exec/s: E ..."
    last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
    execs=$(sed -nE 's/^#([0-9]+).*/\1/p' <<<"$last")
    runs=$(sed -nE 's/^Done ([0-9]+) runs.*/\1/p' "$log" | tail -1)
    cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$last")
    ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$last")
    corp=$(sed -nE 's/.* corp: ([0-9]+\/[0-9]+[a-zA-Z]*).*/\1/p' <<<"$last")
    eps=$(sed -nE 's/.* exec\/s: ([0-9]+).*/\1/p' <<<"$last")
    printf '%-15s %12s %10s %8s %8s %10s  %s\n' "$t" "${runs:-${execs:-?}}" "${eps:-?}" \
        "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result" >> "$summary"
done
echo
cat "$summary"
