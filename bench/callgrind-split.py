#!/usr/bin/env python3
"""Self instructions per connection from a callgrind dump (bench/callgrind.sh).

    callgrind-split.py DUMP CONNECTIONS [TOP]

Prints the total, a split by kind (crossbar's own code, the tokio runtime, the
allocator, logging and formatting, clock reads, memcpy/memset, the rest) and the TOP
functions by self cost. valgrind counts each iteration of a `rep movs`/`rep stos` as
an instruction, so memcpy and memset of a few KiB look far dearer than they run.
"""
import collections
import re
import sys

KINDS = [
    ("logging and formatting", ("tracing", "nu_ansi_term", "core::fmt", "<core::fmt",
                                "<alloc::string::String as core::fmt", "<str as core::fmt",
                                "<u8 as core::fmt", "<u16 as core::fmt", "<u64 as core::fmt",
                                "crossbar::log_writer", "crossbar::access_log")),
    ("allocator", ("malloc", "free", "_int_", "_mid_memalign", "posix_memalign",
                   "unlink_chunk", "malloc_consolidate", "alloc::raw_vec", "realloc")),
    ("memcpy, memset", ("__memcpy", "__memset", "__memmove")),
    ("clock reads", ("clock_gettime", "Timespec", "__vdso")),
    ("crossbar", ("crossbar::", "<crossbar::")),
    ("tokio runtime", ("tokio::", "<tokio::", "tokio_util", "<tokio_util", "mio::", "<mio::")),
]


def kind(name):
    for k, prefixes in KINDS:
        if any(p in name for p in prefixes):
            return k
    return "other (std, libc, dashmap, prometheus, ...)"


def main():
    path, conns = sys.argv[1], int(sys.argv[2])
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 25
    names, own = {}, collections.Counter()
    cur, call_cost_next = None, False
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith(("fn=", "cfn=")):
                m = re.match(r"c?fn=\((\d+)\)(?: (.*))?", line.strip())
                if m:
                    if m.group(2):
                        names[m.group(1)] = m.group(2)
                    if line.startswith("fn="):
                        cur = names.get(m.group(1), m.group(1))
                continue
            if line.startswith("calls="):
                call_cost_next = True  # the next cost line is the call's inclusive cost
                continue
            if line[:1].isdigit() or line[:1] in "+-*":
                parts = line.split()
                if len(parts) >= 2:
                    if call_cost_next:
                        call_cost_next = False
                    else:
                        own[cur] += int(parts[1])
    total = sum(own.values())
    print(f"user-space instructions per connection: {total / conns:,.0f} ({conns} connections)")
    by_kind = collections.Counter()
    for name, cost in own.items():
        by_kind[kind(name or "")] += cost
    for k, cost in by_kind.most_common():
        print(f"  {k:<44} {cost / conns:>8,.0f}  {100 * cost / total:5.1f} %")
    print(f"top {top} functions, self instructions per connection:")
    for name, cost in own.most_common(top):
        print(f"  {cost / conns:>8,.0f}  {100 * cost / total:5.1f} %  {(name or '?')[:120]}")


if __name__ == "__main__":
    main()
