# @summary One entry of a service's `listen`: an address, or the long form with per-listener settings.
#
# The long form's settings (`backlog`, `freebind`, `max_connections`, `proxy_protocol`:
# PROXY headers from a tier in front, `per_source`: limits per client source) belong
# to the address: of the services that share it, one writes them and the others may
# name the address alone (or class `crossbar`'s `listeners` gives them to all); a
# service that writes one again must give the same value.
type Crossbar::Listen = Variant[
  Crossbar::ListenAddress,
  Struct[{
    address                   => Crossbar::ListenAddress,
    Optional[backlog]         => Integer[1],
    Optional[freebind]        => Boolean,
    Optional[max_connections] => Integer[1],
    Optional[proxy_protocol]  => Crossbar::ProxyAccept,
    Optional[per_source]      => Crossbar::PerSource,
  }],
]
