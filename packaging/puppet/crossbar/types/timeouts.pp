# @summary Service timeouts (docs/configuration.md, `timeouts`); keys left out keep the level above's value.
type Crossbar::Timeouts = Struct[{
  Optional[client_hello] => Crossbar::Duration,
  Optional[connect]      => Crossbar::Duration,
  Optional[server_hello] => Crossbar::Duration,
  Optional[idle]         => Crossbar::Duration,
  Optional[queue]        => Crossbar::Duration,
  Optional[shutdown]     => Crossbar::Duration,
}]
