# @summary TCP keepalive on both sockets of a relayed connection (docs/configuration.md, `keepalive`).
type Crossbar::Keepalive = Struct[{
  Optional[enabled]  => Boolean,
  Optional[time]     => Crossbar::Duration,
  Optional[interval] => Crossbar::Duration,
  Optional[probes]   => Integer[1, 127],
}]
