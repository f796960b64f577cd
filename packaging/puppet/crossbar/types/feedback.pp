# @summary Load feedback (docs/configuration.md, `feedback`): each backend's weight scaled by what it says of its load.
#
# `kind => 'puppet'` polls Puppet Server's JRuby metrics over TLS (a compiler's free
# JRubies and queue); `kind => 'agent'` speaks HAProxy's agent-check protocol (a line
# of words on a TCP port: `port` is required). `crossbar::service` refuses the keys of
# one kind with the other when the catalog is compiled, as `crossbar check` does.
type Crossbar::Feedback = Struct[{
  kind                       => Enum['puppet', 'agent'],
  Optional[interval]         => Crossbar::Duration,
  Optional[timeout]          => Crossbar::Duration,
  Optional[blackout]         => Crossbar::Duration,
  Optional[expiry]           => Crossbar::Duration,
  Optional[smoothing]        => Crossbar::Duration,
  Optional[floor]            => Crossbar::Percent,
  # puppet only
  Optional[saturated_sticky] => Boolean,
  Optional[path]             => Pattern[/\A\//],
  Optional[ca_file]          => Stdlib::Unixpath,
  Optional[server_name]      => Crossbar::Host,
  Optional[client_cert]      => Stdlib::Unixpath,
  Optional[client_key]       => Stdlib::Unixpath,
  Optional[jrubies]          => Integer[1, 1024],
  Optional[queue_limit]      => Integer[1, 1000000],
  Optional[by_pool_size]     => Boolean,
  # agent only: the agent's TCP port, and what to send before reading its answer
  # (HAProxy's agent-send): printable ASCII, tabs and newlines
  Optional[port]             => Integer[1, 65535],
  Optional[send]             => Pattern[/\A[\x20-\x7e\t\n]{0,256}\z/],
}]
