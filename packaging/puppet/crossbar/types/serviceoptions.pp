# @summary The settings of a service a preset may give (every key of `crossbar::service` but `listen` and `backends`).
type Crossbar::ServiceOptions = Struct[{
  Optional[mode]           => Enum['tls', 'tcp'],
  Optional[on_non_tls]     => Enum['reject', 'forward'],
  Optional[server_names]   => Array[Crossbar::ServerName],
  Optional[names]          => Array[Crossbar::Host],
  Optional[balance]        => Enum['roundrobin', 'leastconn', 'first', 'source'],
  Optional[failback]       => Enum['manual', 'auto'],
  Optional[stick]          => Crossbar::Stick,
  Optional[timeouts]       => Crossbar::Timeouts,
  Optional[keepalive]      => Crossbar::Keepalive,
  Optional[health]         => Crossbar::Health,
  Optional[max_hello_size] => Integer[512, 1048576],
  Optional[retries]        => Integer[0, 10],
  Optional[queue_size]     => Integer[0, 1000000],
  Optional[slow_start]     => Crossbar::Duration,
  Optional[relay]          => Enum['splice-auto', 'auto'],
}]
