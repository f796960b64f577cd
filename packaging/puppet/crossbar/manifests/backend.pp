# @summary One backend of a crossbar service; export it from the backend's own node and collect it on the balancer.
#
# The pattern of puppetlabs-haproxy's `haproxy::balancermember`: each compile
# server (or PuppetDB node) exports itself, the balancer collects, and a new
# server joins the pool at the balancer's next run after its own. A title of
# the form `SERVICE/NAME` (as `crossbar backend drain puppet/compile01.example.com`
# names a backend) sets `service` and `backend_name`. Name each backend after its
# node's certname: unique across the site, so two sites' `compile01` under one tag
# never collide.
#
# @example On each compile server
#   @@crossbar::backend { "puppet/${trusted['certname']}":
#     address => "${trusted['certname']}:8140",
#     tag     => 'crossbar-site1',
#   }
#
# @example On the balancer
#   include crossbar
#   crossbar::service { 'puppet': preset => 'puppet', listen => ['10.0.0.10:8140'] }
#   Crossbar::Backend <<| tag == 'crossbar-site1' |>>
#
# @param address
#   `host:port`, `v4:port` or `[v6]:port`.
# @param service
#   The `crossbar::service` this backend belongs to. Default: the part of the title
#   before `/`. Set it explicitly to collect by it (`<<| service == 'puppet' |>>`):
#   a collector sees only the parameters the exporting node set.
# @param backend_name
#   Unique in the service; in metrics, logs and the API: letters, digits, `_`, `-`
#   and `.` (a certname fits). Default: the part of the title after `/`.
# @param order
#   Position among the service's backends (0..999, then by name): the order
#   `balance: first` tries them in.
# @param weight
#   Relative weight (1..256).
# @param backup
#   Serve only when no primary backend is available.
# @param max_connections
#   Concurrent connections; more wait in the service's queue.
# @param proxy_protocol
#   Send a PROXY header, `v1` or `v2`.
# @param health
#   This backend's health check, over the service's.
# @param disabled
#   Start in maintenance.
# @param source
#   The local IP address connections to this backend are made from, over the
#   service's `source` (HAProxy's `source` on a `server` line).
# @param extra
#   Keys for the backend that the module's types don't know yet (added only; checked
#   by `crossbar check`).
define crossbar::backend (
  Crossbar::BackendAddress $address,
  Crossbar::Name $service = $title.split('/')[0],
  Crossbar::BackendName $backend_name = $title.split('/')[-1],
  Integer[0, 999] $order = 500,
  Optional[Integer[1, 256]] $weight = undef,
  Optional[Boolean] $backup = undef,
  Optional[Integer[1]] $max_connections = undef,
  Optional[Enum['v1', 'v2']] $proxy_protocol = undef,
  Optional[Crossbar::Health] $health = undef,
  Optional[Boolean] $disabled = undef,
  Optional[Crossbar::IpAddress] $source = undef,
  Crossbar::Extra $extra = {},
) {
  unless defined(Class['crossbar']) {
    fail("Crossbar::Backend[${title}]: declare class crossbar first (include crossbar)")
  }
  # Without its service the piece would land under another service's backends.
  unless defined(Crossbar::Service[$service]) {
    fail(@("MSG"/L))
      Crossbar::Backend[${title}]: no crossbar::service '${service}' on this node; declare it, \
      or collect only this balancer's backends (<<| tag == ... |>>)
      | MSG
  }
  $entry = {
    'name'            => $backend_name,
    'address'         => $address,
    'weight'          => $weight,
    'backup'          => $backup,
    'max_connections' => $max_connections,
    'proxy_protocol'  => $proxy_protocol,
    'health'          => $health,
    'disabled'        => $disabled,
    'source'          => $source,
  }.filter |$k, $v| { $v =~ NotUndef }
  $written = crossbar::merge_extra($entry, $extra, "Crossbar::Backend[${title}]: extra")

  if $crossbar::manage_config {
    $piece = "crossbar backend ${service}/${backend_name}"
    if defined(Concat::Fragment[$piece]) {
      fail(@("MSG"/$L))
        Crossbar::Backend[${title}]: service '${service}' already has a backend named '${backend_name}' \
        (from another crossbar::backend); each needs its own name: name each after its node's certname \
        (title "${service}/\${trusted['certname']}")
        | MSG
    }
    unless defined(Concat::Fragment["crossbar service ${service} backends"]) {
      concat::fragment { "crossbar service ${service} backends":
        target  => $crossbar::config_file,
        order   => crossbar::order($service, 'backends'),
        content => "    backends:\n",
      }
    }
    concat::fragment { $piece:
      target  => $crossbar::config_file,
      order   => crossbar::order($service, 'declared', $order, $backend_name),
      content => epp('crossbar/backend.yaml.epp', { 'backend' => $written }),
    }
  }
}
