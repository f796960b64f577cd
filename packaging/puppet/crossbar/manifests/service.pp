# @summary One crossbar service: where it listens, how it balances, and its backends.
#
# Writes the service's part of crossbar.yaml: its settings and the `backends`
# given here, followed by every `crossbar::backend` whose `service` is this
# one (declared anywhere, or collected from PuppetDB). A `preset` fills in the
# settings of conf/puppet.yaml's service of that name; what is given here wins,
# maps (`stick`, `health`, `timeouts`, `keepalive`, a `feedback` of the same `kind`)
# key by key.
#
# A service must end up with at least one backend, or `discover`: `crossbar check`
# refuses an empty pool, so the file is then not written and the run reports why.
#
# @example The compilers' service, its pool exported by the compilers
#   crossbar::service { 'puppet':
#     preset => 'puppet',
#     listen => ['10.0.0.10:8140'],
#     names  => ['puppet.example.com'],
#     health => { 'ca_file' => '/etc/crossbar/puppet-ca.pem', 'server_name' => 'puppet.example.com' },
#   }
#
# @example Compilers from SRV records, behind a cloud load balancer that sends PROXY headers
#   crossbar::service { 'puppet':
#     preset   => 'puppet',
#     listen   => [{
#       'address'        => '10.0.0.10:8140',
#       'proxy_protocol' => { 'accept_from' => ['10.0.2.0/24'] },
#       'per_source'     => { 'max_connections' => 20, 'rate' => 10 },
#     }],
#     discover => { 'srv' => '_compilers._tcp.example.com', 'backend' => { 'max_connections' => 24 } },
#   }
#
# @example Closing a dead compiler's connections, from a source address of the balancer's own
#   crossbar::service { 'puppet':
#     preset         => 'puppet',
#     listen         => ['10.0.0.10:8140'],
#     on_marked_down => 'shutdown-sessions',
#     source         => '10.0.1.250',
#   }
#
# @param listen
#   Addresses to accept on: `ip:port` or `{ address, backlog, freebind,
#   max_connections, proxy_protocol, per_source }` (PROXY headers from a tier in
#   front, limits per client source: docs/configuration.md). Those settings belong
#   to the address: where services share it, one writes them and the others name the
#   address alone, or class `crossbar`'s `listeners` gives them to every service that
#   lists the address (a setting written here too must have the same value).
# @param preset
#   The name of an entry of `crossbar::presets`: `puppetca`, `puppet`, `puppetfiles`,
#   `puppetdb` (docs/puppet.md, "Per-service presets").
# @param mode
#   `tls` reads the ClientHello; `tcp` picks a backend at accept.
# @param on_non_tls
#   `tls` mode: what to do with bytes that are not a TLS handshake.
# @param server_names
#   SNI names routed here on a listener shared with other services.
# @param names
#   Further names agents dial (checked against backend certificates by `crossbar doctor`).
# @param is_default
#   On a shared listener, this service takes hellos whose name matches no service
#   (crossbar's `default` key).
# @param on_marked_down
#   What a backend's health checks marking it down do to its open connections:
#   `shutdown-sessions` closes them (HAProxy's `on-marked-down shutdown-sessions`),
#   `none` (crossbar's default) lets them go on.
# @param source
#   The local IP address connections to the backends are made from (HAProxy's
#   `source`); a backend's own `source` wins. Health checks keep the system's choice.
# @param balance
#   `roundrobin`, `leastconn`, `first` or `source`.
# @param failback
#   `manual` or `auto` (after a failover with `balance: first`).
# @param stick
#   The stick table; `{}` for all defaults.
# @param timeouts
#   Timeouts, over `defaults`.
# @param keepalive
#   TCP keepalive, over `defaults`.
# @param health
#   The health check, over `defaults`.
# @param max_hello_size
#   Largest ClientHello buffered, in bytes.
# @param retries
#   Other backends tried after a failed connect.
# @param queue_size
#   Connections that may wait when every backend is full.
# @param slow_start
#   A recovered backend's weight ramps up over this period.
# @param relay
#   `splice-auto` or `auto`.
# @param discover
#   Backends from DNS: `{ srv => NAME }` or `{ host => NAME, port => N }`, plus
#   `resolvers`, `min_ttl`, `max_ttl`, `max_backends`, `timeout`.
# @param feedback
#   Load feedback: each backend's weight scaled by what it says of its load.
#   `{ kind => 'puppet' }` polls the compilers' JRuby metrics over TLS (add
#   `queue_limit`, the compilers' `max-queued-requests`, and the https check's
#   `ca_file` is used); `{ kind => 'agent', port => N }` speaks HAProxy's
#   agent-check (`agent-check agent-port N`). Off by default.
# @param extra
#   Keys for the service that the module's types don't know yet: added to what the
#   parameters and the preset give (mappings key by key; a key they already set is
#   refused), and checked by `crossbar check` with the rest.
# @param backends
#   Backends written with the service, before the `crossbar::backend` ones.
define crossbar::service (
  Array[Crossbar::Listen, 1] $listen,
  Optional[Crossbar::Name] $preset = undef,
  Optional[Enum['tls', 'tcp']] $mode = undef,
  Optional[Enum['reject', 'forward']] $on_non_tls = undef,
  Optional[Array[Crossbar::ServerName, 1]] $server_names = undef,
  Optional[Array[Crossbar::Host, 1]] $names = undef,
  Optional[Boolean] $is_default = undef,
  Optional[Enum['none', 'shutdown-sessions']] $on_marked_down = undef,
  Optional[Crossbar::IpAddress] $source = undef,
  Optional[Enum['roundrobin', 'leastconn', 'first', 'source']] $balance = undef,
  Optional[Enum['manual', 'auto']] $failback = undef,
  Optional[Crossbar::Stick] $stick = undef,
  Optional[Crossbar::Timeouts] $timeouts = undef,
  Optional[Crossbar::Keepalive] $keepalive = undef,
  Optional[Crossbar::Health] $health = undef,
  Optional[Integer[512, 1048576]] $max_hello_size = undef,
  Optional[Integer[0, 10]] $retries = undef,
  Optional[Integer[0, 1000000]] $queue_size = undef,
  Optional[Crossbar::Duration] $slow_start = undef,
  Optional[Enum['splice-auto', 'auto']] $relay = undef,
  Optional[Crossbar::Discover] $discover = undef,
  Optional[Crossbar::Feedback] $feedback = undef,
  Crossbar::Extra $extra = {},
  Array[Crossbar::BackendOptions] $backends = [],
) {
  # The title is the service's name in crossbar.yaml, metrics and the API.
  $service_name = assert_type(Crossbar::Name, $title) |$expected, $actual| {
    fail("Crossbar::Service[${title}]: the title is the service's name: letters, digits, '_' and '-' only")
  }
  unless defined(Class['crossbar']) {
    fail("Crossbar::Service[${title}]: declare class crossbar first (include crossbar)")
  }
  if $preset =~ NotUndef and !($preset in $crossbar::presets) {
    fail("Crossbar::Service[${title}]: unknown preset '${preset}'; crossbar::presets has: ${crossbar::presets.keys.sort.join(', ')}")
  }
  # Settings class crossbar's `listeners` gives an address, added to each entry of it.
  $listen_written = $listen.map |$i, $l| {
    $entry = $l ? {
      String  => { 'address' => $l },
      default => $l,
    }
    $shared = $crossbar::listeners[$entry['address']].lest || { {} }
    $shared.each |$k, $v| {
      if $k in $entry and $entry[$k] != $v {
        fail(@("MSG"/L))
          Crossbar::Service[${title}]: listen[${i}].${k}: differs from crossbar::listeners['${entry['address']}'] \
          (an address's settings belong to its one socket: give them once, there)
          | MSG
      }
    }
    $shared.empty ? {
      true    => $l,
      default => $entry + $shared,
    }
  }
  $own = {
    'listen'         => $listen_written,
    'mode'           => $mode,
    'on_non_tls'     => $on_non_tls,
    'server_names'   => $server_names,
    'names'          => $names,
    'default'        => $is_default,
    'on_marked_down' => $on_marked_down,
    'source'         => $source,
    'balance'        => $balance,
    'failback'       => $failback,
    'stick'          => $stick,
    'timeouts'       => $timeouts,
    'keepalive'      => $keepalive,
    'health'         => $health,
    'max_hello_size' => $max_hello_size,
    'retries'        => $retries,
    'queue_size'     => $queue_size,
    'slow_start'     => $slow_start,
    'relay'          => $relay,
    'discover'       => $discover,
    'feedback'       => $feedback,
    'extra'          => $extra,
  }
  $from_preset = $preset ? {
    undef   => {},
    default => $crossbar::presets[$preset],
  }
  $merged = crossbar::merge_preset($from_preset, $own)
  $settings = crossbar::merge_extra($merged - 'extra', $merged['extra'].lest || { {} }, "Crossbar::Service[${title}]: extra")
  if $settings['discover'] =~ Hash {
    $d = $settings['discover']
    if ('srv' in $d) == ('host' in $d) {
      fail("Crossbar::Service[${title}]: discover: give either srv (an SRV name) or host with port")
    }
    if 'srv' in $d and 'port' in $d {
      fail("Crossbar::Service[${title}]: discover: an SRV record carries its own port: remove port")
    }
    if 'host' in $d and !('port' in $d) {
      fail("Crossbar::Service[${title}]: discover: host needs port, the port every address is dialled on")
    }
  }

  if $settings['feedback'] =~ Hash {
    $f = $settings['feedback']
    $other = $f['kind'] ? {
      'puppet' => ['port', 'send'],
      default  => ['saturated_sticky', 'path', 'ca_file', 'server_name', 'client_cert', 'client_key', 'jrubies',
      'queue_limit', 'by_pool_size'],
    }.filter |$k| { $k in $f }
    unless $other.empty {
      fail("Crossbar::Service[${title}]: feedback: ${other.join(', ')}: not with kind => '${f['kind']}'")
    }
    if $f['kind'] == 'agent' and !('port' in $f) {
      fail("Crossbar::Service[${title}]: feedback: kind => 'agent' needs port, the agent's TCP port on each backend's host")
    }
  }

  if $crossbar::manage_config {
    concat::fragment { "crossbar service ${service_name}":
      target  => $crossbar::config_file,
      order   => crossbar::order($service_name),
      content => epp('crossbar/service.yaml.epp', {
          'name'     => $service_name,
          'settings' => $settings,
      }),
    }
    # The `backends:` key, once, by whichever comes first: this service with inline
    # backends or a crossbar::backend of it. A service with neither (its pool from
    # `discover` alone) has no such key.
    if !$backends.empty and !defined(Concat::Fragment["crossbar service ${service_name} backends"]) {
      concat::fragment { "crossbar service ${service_name} backends":
        target  => $crossbar::config_file,
        order   => crossbar::order($service_name, 'backends'),
        content => "    backends:\n",
      }
    }
    $backends.each |$i, $b| {
      $entry = crossbar::merge_extra($b - 'extra', $b['extra'].lest || { {} }, "Crossbar::Service[${title}]: backends[${i}].extra")
      concat::fragment { "crossbar service ${service_name} backend ${i}":
        target  => $crossbar::config_file,
        order   => crossbar::order($service_name, 'inline', $i),
        content => epp('crossbar/backend.yaml.epp', { 'backend' => $entry }),
      }
    }
  }
}
