"""Python's ssl module: for each server name, three connections from one
SSLContext, each offering the session the last one ended with (the `session=`
argument), read to the server's close so TLS 1.3 tickets arrive. Prints per
connection "RESULT sni attempt reused backend", where "reused" is the module's
own `session_reused`.

Usage: python3 client.py ca.pem port sni...
"""
import socket
import ssl
import sys

ca, port, *snis = sys.argv[1:]
for sni in snis:
    ctx = ssl.create_default_context(cafile=ca)
    sess = None
    for a in range(3):
        try:
            with socket.create_connection(("127.0.0.1", int(port)), timeout=15) as raw:
                with ctx.wrap_socket(raw, server_hostname=sni, session=sess) as s:
                    s.sendall(f"GET /who HTTP/1.0\r\nHost: {sni}\r\nConnection: close\r\n\r\n".encode())
                    data = b""
                    while len(data) < 65536:
                        try:
                            d = s.recv(4096)
                        except (ssl.SSLEOFError, ConnectionResetError):
                            break
                        if not d:
                            break
                        data += d
                    reused = s.session_reused
                    sess = s.session
            body = data.split(b"\r\n\r\n", 1)[-1].decode().strip()
            print("RESULT", sni, a, str(reused).lower(), body, flush=True)
        except Exception as e:  # noqa: BLE001 - reported to the test, which fails on it
            print("ERROR", sni, a, repr(e).replace("\n", " "), flush=True)
print("VERSION python", sys.version.split()[0], ssl.OPENSSL_VERSION)
