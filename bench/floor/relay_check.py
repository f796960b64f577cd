#!/usr/bin/env python3
"""Relay checks for bench/floor/check.sh: bytes intact and in order, a client's
half-close passed on (and the backend's answer after it, then its FIN), a refused
backend closing the client. Loopback only; every socket has a timeout (a hang
guard, not a speed threshold).

  relay_check.py serve
      A backend that reads until EOF, then answers sha256(what it read) followed
      by ANSWER bytes and closes: its answer exists only if the client's FIN came
      through, and arrives only if the relay keeps the other direction open.
      Prints its port, then READY; serves until killed.
  relay_check.py client ECHO_PORT HALF_PORT DEAD_PORT
      ECHO_PORT: the floor routed to echo backends; HALF_PORT: to `serve`;
      DEAD_PORT: to a backend port nothing listens on. Exits 1 on any failure.
"""

import hashlib
import os
import socket
import sys
import threading
import time

ANSWER = 1 << 20  # bytes the half-close backend sends after the client's EOF
TIMEOUT = 30  # seconds any one socket call may block: a hang guard only


def pattern(n):
    """n deterministic bytes (the half-close backend's answer)."""
    return bytes(i * 7 % 251 for i in range(n))


def serve():
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0))
    ls.listen(128)
    print(ls.getsockname()[1])
    print("READY", flush=True)
    answer = pattern(ANSWER)

    def one(s):
        with s:
            s.settimeout(TIMEOUT)
            h = hashlib.sha256()
            while True:
                b = s.recv(65536)
                if not b:
                    break
                h.update(b)
            s.sendall(h.digest() + answer)

    while True:
        s, _ = ls.accept()
        threading.Thread(target=one, args=(s,), daemon=True).start()


def recv_all(s):
    """Everything until EOF, and its sha256."""
    h = hashlib.sha256()
    n = 0
    while True:
        b = s.recv(1 << 16)
        if not b:
            return n, h.hexdigest()
        n += len(b)
        h.update(b)


def echo_stream(port, size, delay, results, i):
    """Sends `size` random bytes through the relay to an echo backend, then
    half-closes; the reader starts `delay` seconds late so the relay meets full
    socket buffers (short writes, EAGAIN) on the way back."""
    data = os.urandom(size)
    s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    with s:
        got = {}

        def reader():
            time.sleep(delay)
            try:
                got["n"], got["sha"] = recv_all(s)
            except OSError as e:
                got["err"] = e

        t = threading.Thread(target=reader)
        t.start()
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        t.join(TIMEOUT * 2)
    want = hashlib.sha256(data).hexdigest()
    if "err" in got:
        results[i] = f"echo stream {i} ({size} B): {got['err']}"
    elif t.is_alive():
        results[i] = f"echo stream {i} ({size} B): reader hung"
    elif (got["n"], got["sha"]) != (size, want):
        results[i] = f"echo stream {i}: {got['n']} B came back of {size}, sha256 differs"
    else:
        results[i] = None


def check_bulk(port):
    sizes = [20 << 20, 5 << 20, 5 << 20, 5 << 20, 1, 0]
    results = [None] * len(sizes)
    threads = [
        threading.Thread(target=echo_stream, args=(port, n, 0.3, results, i))
        for i, n in enumerate(sizes)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in results if r]


def check_half_close(port, size):
    """The client's FIN must reach the backend (or no answer comes), and the
    answer it sends afterwards must reach the client, then its EOF."""
    data = os.urandom(size)
    s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    with s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        buf = bytearray()
        while True:
            b = s.recv(1 << 16)
            if not b:
                break
            buf += b
    want = hashlib.sha256(data).digest() + pattern(ANSWER)
    if bytes(buf) != want:
        return [f"half-close ({size} B sent): {len(buf)} B answered of {len(want)}, or wrong bytes"]
    return []


def check_refused(port):
    """A backend that refuses: the relay must close the client, not hold it."""
    s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    with s:
        try:
            s.sendall(b"hello")
            b = s.recv(10)
        except ConnectionResetError:
            return []
        except socket.timeout:
            return ["refused backend: client still open after the timeout"]
    return [] if b == b"" else [f"refused backend: got {b!r}"]


def client(echo_port, half_port, dead_port):
    fails = []
    fails += check_bulk(echo_port)
    fails += check_half_close(half_port, 3 << 20)
    # A FIN right behind a few bytes, most likely before the backend's connect
    # is done: the relay must hold it until it can pass it on.
    fails += check_half_close(half_port, 10)
    fails += check_half_close(half_port, 0)
    fails += check_refused(dead_port)
    for f in fails:
        print("FAIL:", f)
    if not fails:
        print("ok: bulk (20+3x5 MiB, 1 B, 0 B echoed intact), half-close (client FIN first, answer after it), refused backend")
    return 1 if fails else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve()
    elif sys.argv[1:2] == ["client"] and len(sys.argv) == 5:
        sys.exit(client(*map(int, sys.argv[2:5])))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
