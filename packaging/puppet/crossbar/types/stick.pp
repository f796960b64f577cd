# @summary A stick table (docs/configuration.md, `stick`); `{}` for all defaults.
#
# In Hiera data quote the key `on` (`'on': [session_id, ticket]`): YAML 1.1, which
# Hiera reads, takes a bare `on` for the boolean true.
type Crossbar::Stick = Struct[{
  Optional[on]               => Array[Enum['session_id', 'ticket', 'psk', 'source'], 1, 4],
  Optional[size]             => Integer[1, 100000000],
  Optional[expire]           => Crossbar::Duration,
  Optional[source_expire]    => Crossbar::Duration,
  Optional[source_prefix_v4] => Integer[0, 32],
  Optional[source_prefix_v6] => Integer[0, 128],
  Optional[ticket_prefix]    => Integer[0, 64],
  Optional[state_file]       => Stdlib::Unixpath,
  Optional[save_interval]    => Crossbar::Duration,
  Optional[probe_interval]   => Crossbar::Duration,
  Optional[confirm]          => Boolean,
  Optional[confirm_tries]    => Integer[1, 16],
}]
