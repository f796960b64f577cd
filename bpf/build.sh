#!/bin/sh
# Builds the kernel relay's BPF object from its C source. The object is committed
# (crossbar embeds it, so building crossbar needs no clang); tests/kernel_relay.rs
# rebuilds it with this script and checks the committed one has the same program.
# Usage: bpf/build.sh [OUT]   (default: bpf/relay.bpf.o next to this script)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/relay.bpf.o}
arch_inc=/usr/include/$(uname -m)-linux-gnu
exec clang -O2 -g -target bpf -I"$arch_inc" -c "$here/relay.bpf.c" -o "$out"
