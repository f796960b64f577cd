# @summary The settings of one listen address, written once for every service that lists it (class `crossbar`'s `listeners`).
#
# The keys of a `listen` entry's long form but `address`: they belong to the
# address's one socket (HAProxy writes them on its `bind` line), whichever services
# share it.
type Crossbar::ListenSettings = Struct[{
  Optional[backlog]         => Integer[1],
  Optional[freebind]        => Boolean,
  Optional[max_connections] => Integer[1],
  Optional[proxy_protocol]  => Crossbar::ProxyAccept,
  Optional[per_source]      => Crossbar::PerSource,
}]
