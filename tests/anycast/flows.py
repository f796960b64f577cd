#!/usr/bin/python3
"""Long-lived TCP flows and tagged echo backends for tests/anycast/run.sh.

  flows.py echo ADDR PORT NAME
      An echo server: each connection first gets one line, "NAME PEER_IP" (the
      backend's name and the address the connection came from: the crossbar node
      that carries it), then everything it sends comes back; EOF is answered by
      closing.

  flows.py flows ADDR PORT N CTL
      N connections to ADDR:PORT, each one reading the backend's line, then sending
      16 bytes and reading them back every ROUND_GAP seconds. Control is by files in
      the directory CTL (the test creates them, this process answers in the same
      directory):
        ready               written once all N are connected: "i node backend" lines
        mark-NAME           -> mark-NAME.done once every flow that still works has done
                            MARK_ROUNDS rounds since the mark appeared, or failed
        close-NODE          -> close-NODE.done once every flow carried by NODE has
                            half-closed and read its EOF (a clean finish), or failed
        stop                -> result: close every flow still open, then one line per
                            flow: "i node state rounds rounds_after_last_mark error"
      state is "closed" (clean finish) or "reset" (any failure: a reset, an early
      EOF, wrong bytes, no answer within ROUND_TIMEOUT).
Every wait is bounded; the process ends after "stop" or after LIFETIME seconds.
"""
import os
import socket
import sys
import threading
import time

ROUND_GAP = 0.1  # seconds between a flow's rounds: keeps its router bucket busy
ROUND_TIMEOUT = 15.0  # an echo that takes longer counts as a failed flow (a reset is seen at once)
MARK_ROUNDS = 5  # rounds after a mark that prove a flow still works
LIFETIME = 600.0  # the whole run, at most (the test's own bound is lower)
CONNECT_TIMEOUT = 10.0


def echo(addr, port, name):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, int(port)))
    srv.listen(1024)

    def serve(conn, peer):
        try:
            conn.sendall(f"{name} {peer[0]}\n".encode())
            while True:
                data = conn.recv(4096)
                if not data:
                    break
                conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        finally:
            conn.close()

    while True:
        conn, peer = srv.accept()
        threading.Thread(target=serve, args=(conn, peer), daemon=True).start()


class Flow:
    def __init__(self, i, addr, port):
        self.i = i
        self.sock = socket.create_connection((addr, port), timeout=CONNECT_TIMEOUT)
        self.sock.settimeout(ROUND_TIMEOUT)
        line = b""
        while not line.endswith(b"\n") and len(line) < 64:
            b = self.sock.recv(1)
            if not b:
                raise OSError("closed before the backend's line")
            line += b
        self.backend, self.node = line.decode().split()
        self.state = "open"
        self.error = ""
        self.rounds = 0
        self.after_mark = 0
        self.closing = False

    def fail(self, why):
        self.state = "reset"
        self.error = why.replace(" ", "_")
        try:
            self.sock.close()
        except OSError:
            pass

    def finish(self):
        try:
            self.sock.shutdown(socket.SHUT_WR)
            rest = self.sock.recv(64)
            if rest:
                return self.fail("bytes_after_EOF")
            self.state = "closed"
            self.sock.close()
        except OSError as e:
            self.fail(f"at_close:{e.__class__.__name__}")

    def run(self, stop_all):
        payload = os.urandom(16)
        while self.state == "open":
            if self.closing or stop_all.is_set():
                return self.finish()
            try:
                self.sock.sendall(payload)
                got = b""
                while len(got) < len(payload):
                    b = self.sock.recv(len(payload) - len(got))
                    if not b:
                        return self.fail("EOF")
                    got += b
                if got != payload:
                    return self.fail("wrong_bytes")
            except socket.timeout:
                return self.fail("no_answer")
            except OSError as e:
                return self.fail(e.__class__.__name__)
            self.rounds += 1
            self.after_mark += 1
            time.sleep(ROUND_GAP)


def flows(addr, port, n, ctl):
    port, n = int(port), int(n)
    fl = []
    for i in range(n):
        fl.append(Flow(i, addr, port))
    stop_all = threading.Event()
    threads = [threading.Thread(target=f.run, args=(stop_all,), daemon=True) for f in fl]
    for t in threads:
        t.start()
    with open(os.path.join(ctl, "ready.tmp"), "w") as out:
        for f in fl:
            out.write(f"{f.i} {f.node} {f.backend}\n")
    os.rename(os.path.join(ctl, "ready.tmp"), os.path.join(ctl, "ready"))
    seen = set()
    marks = {}  # name -> {flow index: rounds when the mark appeared}
    closes = set()
    end = time.monotonic() + LIFETIME
    while time.monotonic() < end:
        names = set(os.listdir(ctl))
        for name in sorted(names - seen):
            seen.add(name)
            if name.startswith("mark-") and not name.endswith(".done"):
                marks[name] = {f.i: f.rounds for f in fl}
                for f in fl:
                    f.after_mark = 0
            elif name.startswith("close-") and not name.endswith(".done"):
                closes.add(name)
                for f in fl:
                    if f.node == name[len("close-"):]:
                        f.closing = True
        for name, base in list(marks.items()):
            if all(f.state != "open" or f.closing or f.rounds - base[f.i] >= MARK_ROUNDS for f in fl):
                touch(ctl, name + ".done")
                del marks[name]
        for name in list(closes):
            node = name[len("close-"):]
            if all(f.state != "open" for f in fl if f.node == node):
                touch(ctl, name + ".done")
                closes.discard(name)
        if "stop" in names:
            break
        time.sleep(0.05)
    stop_all.set()
    for t in threads:
        t.join(ROUND_TIMEOUT + 1)
    with open(os.path.join(ctl, "result.tmp"), "w") as out:
        for f in fl:
            out.write(f"{f.i} {f.node} {f.state} {f.rounds} {f.after_mark} {f.error or '-'}\n")
    os.rename(os.path.join(ctl, "result.tmp"), os.path.join(ctl, "result"))


def touch(ctl, name):
    with open(os.path.join(ctl, name), "w"):
        pass


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "echo":
        echo(*sys.argv[2:])
    elif len(sys.argv) == 6 and sys.argv[1] == "flows":
        flows(*sys.argv[2:])
    else:
        sys.exit(__doc__)
