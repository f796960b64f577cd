#!/usr/bin/python3
"""A DNS server the tests script (tests/common/dns.rs starts it): answers from a
JSON zone file it reads again at every query, so a test changes the answers
without a restart; per name it can answer SERVFAIL, REFUSED or NXDOMAIN, answer
late, or never answer. Built on dnslib (Debian's python3-dnslib): no DNS wire
format is written by hand here.

Usage: scripted_dns.py PORT ZONE.json

ZONE.json:
  {"records": {"name.test.": [{"type": "A", "address": "127.0.0.1", "ttl": 0},
                              {"type": "SRV", "priority": 10, "weight": 1,
                               "port": 8140, "target": "c1.test."}]},
   "rules": {"name.test.": {"rcode": "SERVFAIL"} | {"silent": true} |
                           {"delay_ms": 500}}}
A name in neither map is NXDOMAIN; a rule applies to every query type.
"""
import json
import sys
import threading
import time

from dnslib import AAAA, QTYPE, RCODE, RR, SRV, A
from dnslib.server import BaseResolver, DNSLogger, DNSServer

RCODES = {"SERVFAIL": RCODE.SERVFAIL, "REFUSED": RCODE.REFUSED, "NXDOMAIN": RCODE.NXDOMAIN}
# A name that never answers holds its thread this long (longer than any test).
SILENT_SECONDS = 3600


class Scripted(BaseResolver):
    def __init__(self, path):
        self.path = path

    def zone(self):
        with open(self.path) as f:
            return json.load(f)

    def resolve(self, request, handler):
        zone = self.zone()
        name = str(request.q.qname).lower()
        rule = zone.get("rules", {}).get(name, {})
        if rule.get("silent"):
            time.sleep(SILENT_SECONDS)
        if "delay_ms" in rule:
            time.sleep(rule["delay_ms"] / 1000.0)
        reply = request.reply()
        if "rcode" in rule:
            reply.header.rcode = RCODES[rule["rcode"]]
            return reply
        records = zone.get("records", {})
        if name not in records:
            reply.header.rcode = RCODE.NXDOMAIN
            return reply
        qtype = QTYPE[request.q.qtype]
        for r in records[name]:
            if r["type"] != qtype:
                continue
            ttl = r.get("ttl", 0)
            if qtype == "A":
                rdata = A(r["address"])
            elif qtype == "AAAA":
                rdata = AAAA(r["address"])
            elif qtype == "SRV":
                rdata = SRV(r["priority"], r["weight"], r["port"], r["target"])
            else:
                continue
            reply.add_answer(RR(request.q.qname, QTYPE.reverse[qtype], rdata=rdata, ttl=ttl))
        return reply


def main():
    port, path = int(sys.argv[1]), sys.argv[2]
    resolver = Scripted(path)
    quiet = DNSLogger(log="-request,-reply,-truncated,-error,-recv,-send,-data", prefix=False)
    servers = [
        DNSServer(resolver, port=port, address="127.0.0.1", tcp=tcp, logger=quiet)
        for tcp in (False, True)
    ]
    for s in servers:
        s.server.daemon_threads = True
        s.start_thread()
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
