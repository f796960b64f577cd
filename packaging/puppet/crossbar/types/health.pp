# @summary An active health check (docs/configuration.md, `health`); merged key by key with the level above.
#
# The https options (`path` to `server_name`) are accepted only where the check,
# its own or inherited, is `https`: `crossbar check` refuses them elsewhere.
type Crossbar::Health = Struct[{
  Optional[check]         => Enum['none', 'tcp', 'tls-hello', 'https'],
  Optional[interval]      => Crossbar::Duration,
  Optional[timeout]       => Crossbar::Duration,
  Optional[rise]          => Integer[1, 1000],
  Optional[fall]          => Integer[1, 1000],
  Optional[path]          => Pattern[/\A\//],
  Optional[expect_status] => Integer[100, 599],
  Optional[expect_body]   => String,
  Optional[ca_file]       => Stdlib::Unixpath,
  Optional[client_cert]   => Stdlib::Unixpath,
  Optional[client_key]    => Stdlib::Unixpath,
  Optional[server_name]   => Crossbar::Host,
}]
