#!/usr/bin/env bash
# Where each proxy's CPU per connection goes, from the profiles of
# `bench/conn-cpu.sh --perf` (its work dir keeps PROXY.FIGURE.perf.data):
#
#   bench/cpu-split.sh WORK_DIR [US_PER_CONN...]
#
# For every profile it prints the share of the proxy's CPU spent
#   - in the system calls that move connections and bytes (accept4, socket, connect,
#     sendto/recvfrom/read/write/splice, shutdown, close), the kernel's TCP/IP work
#     on loopback included (the receiver's side of a loopback send runs in the
#     sender's system call);
#   - in the event loop (epoll_wait, epoll_ctl);
#   - in the other system calls (socket options, clocks, futex, ...);
#   - in the kernel outside system calls (interrupts, faults);
#   - in user space (the proxy and its libraries).
# Each US_PER_CONN given as PROXY.FIGURE=MICROSECONDS (e.g. crossbar.tcp=79.9, the
# CPU per connection the bench printed) turns the shares into microseconds.
# The first group is work both proxies must do for the same packets; only the rest
# is where one proxy can be cheaper than another.
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,18p' "$0" >&2; exit 2; }
W=$1
shift
command -v perf >/dev/null || { echo "perf is needed (apt-get install linux-perf)" >&2; exit 1; }
shopt -s nullglob
files=("$W"/*.perf.data)
[ ${#files[@]} -gt 0 ] || { echo "no *.perf.data in $W (run bench/conn-cpu.sh --perf)" >&2; exit 1; }
for f in "${files[@]}"; do
    name=$(basename "$f" .perf.data)
    us=
    for a in "$@"; do [ "${a%%=*}" = "$name" ] && us=${a#*=}; done
    {
        echo "@dso"
        perf report -i "$f" --no-children --sort dso -g none 2>/dev/null
        echo "@sys"
        perf report -i "$f" --children --sort sym -g none 2>/dev/null
    } | python3 -c '
import re, sys
name, us = sys.argv[1], sys.argv[2]
net = {"accept4", "accept", "socket", "connect", "sendto", "recvfrom", "sendmsg",
       "recvmsg", "read", "write", "readv", "writev", "splice", "shutdown", "close"}
loop = {"epoll_wait", "epoll_pwait", "epoll_ctl"}
kernel = user = 0.0
calls = {}
part = None
for line in sys.stdin:
    if line.startswith("@"):
        part = line.strip()
        continue
    if line.startswith("#") or not line.strip():
        continue
    if part == "@dso":
        m = re.match(r"\s*([\d.]+)%\s+(.*\S)", line)
        if m:
            if "kernel" in m.group(2):
                kernel += float(m.group(1))
            else:
                user += float(m.group(1))
    else:
        m = re.match(r"\s*([\d.]+)%\s+[\d.]+%\s+\[k\]\s+__x64_sys_(\w+)", line)
        if m:
            calls[m.group(2)] = calls.get(m.group(2), 0.0) + float(m.group(1))
n = sum(v for k, v in calls.items() if k in net)
l = sum(v for k, v in calls.items() if k in loop)
o = sum(v for k, v in calls.items() if k not in net and k not in loop)
rest = max(kernel - n - l - o, 0.0)
rows = [("connections and bytes (syscalls)", n), ("event loop", l), ("other syscalls", o),
        ("kernel, outside syscalls", rest), ("user space", user)]
print(f"{name}:")
for label, v in rows:
    extra = f"  {float(us) * v / 100:7.1f} us" if us else ""
    print(f"  {label:34s} {v:5.1f} %{extra}")
top = sorted(((v, k) for k, v in calls.items() if k not in net and k not in loop), reverse=True)[:5]
print("  other syscalls: " + ", ".join(f"{k} {v:.1f} %" for v, k in top))
' "$name" "$us"
done
