# @summary The options every backend `discover` finds gets (docs/configuration.md, `discover.backend`).
#
# As a backend in the file would have them; weight, tier (backup) and address come
# from the records. `health` is merged key by key over the service's.
type Crossbar::DiscoverBackend = Struct[{
  Optional[max_connections] => Integer[1, 4294967295],
  Optional[proxy_protocol]  => Enum['v1', 'v2'],
  Optional[health]          => Crossbar::Health,
  Optional[source]          => Crossbar::IpAddress,
}]
