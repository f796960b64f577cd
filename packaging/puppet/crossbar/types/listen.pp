# @summary One entry of a service's `listen`: an address, or the long form with per-listener settings.
#
# The long form's `proxy_protocol` (PROXY headers from a tier in front) and
# `per_source` (limits per client source) belong to the address: services that
# share an address must give it the same ones.
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
