# @summary Backends from DNS (docs/configuration.md, `discover`): SRV records, or a host name's A/AAAA records on `port`.
#
# Give `srv` (`_compilers._tcp.example.com`: a name of the compilers' own, since
# `_x-puppet._tcp`, the record agents read, usually names the balancer itself and
# crossbar leaves out records naming itself), or `host` with `port`. Discovered
# backends are named `target-port` (`compile1.example.com-8140`); a backend of that
# name given in the file (inline or a `crossbar::backend`) takes the discovered one's
# place. `backend` gives every discovered backend its options (HAProxy's
# `server-template ... maxconn 250`).
type Crossbar::Discover = Struct[{
  Optional[srv]          => Crossbar::DnsName,
  Optional[host]         => Crossbar::DnsName,
  Optional[port]         => Integer[1, 65535],
  # `ip:port` of each DNS server to ask; default: those of /etc/resolv.conf
  Optional[resolvers]    => Array[Crossbar::ListenAddress, 1],
  Optional[min_ttl]      => Crossbar::Duration,
  Optional[max_ttl]      => Crossbar::Duration,
  Optional[max_backends] => Integer[1, 1024],
  Optional[timeout]      => Crossbar::Duration,
  Optional[backend]      => Crossbar::DiscoverBackend,
}]
