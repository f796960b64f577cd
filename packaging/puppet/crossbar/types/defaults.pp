# @summary Defaults for every service and listener (docs/configuration.md, `defaults`).
type Crossbar::Defaults = Struct[{
  Optional[timeouts]        => Crossbar::Timeouts,
  Optional[keepalive]       => Crossbar::Keepalive,
  Optional[health]          => Crossbar::Health,
  Optional[max_hello_size]  => Integer[512, 1048576],
  Optional[retries]         => Integer[0, 10],
  Optional[queue_size]      => Integer[0, 1000000],
  Optional[slow_start]      => Crossbar::Duration,
  Optional[relay]           => Enum['splice-auto', 'auto'],
  Optional[backlog]         => Integer[1],
  Optional[max_connections] => Integer[1],
}]
