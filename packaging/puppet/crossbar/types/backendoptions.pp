# @summary One backend as a service's inline `backends` entry (the same keys as `crossbar::backend`).
type Crossbar::BackendOptions = Struct[{
  name                      => Crossbar::BackendName,
  address                   => Crossbar::BackendAddress,
  Optional[weight]          => Integer[1, 256],
  Optional[backup]          => Boolean,
  Optional[max_connections] => Integer[1],
  Optional[proxy_protocol]  => Enum['v1', 'v2'],
  Optional[health]          => Crossbar::Health,
  Optional[disabled]        => Boolean,
  Optional[source]          => Crossbar::IpAddress,
  Optional[extra]           => Crossbar::Extra,
}]
