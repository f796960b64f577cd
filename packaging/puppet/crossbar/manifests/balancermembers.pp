# @summary Collects exported `haproxy::balancermember` resources into a crossbar service: switch the class, keep the exports.
#
# A site that runs puppetlabs-haproxy has each compile server export
# `@@haproxy::balancermember { ...: listening_service => 'puppet00', ports => '8140' }`
# and the balancer collect them. On a crossbar balancer this define asks PuppetDB
# for the same exported resources (what `Haproxy::Balancermember <<| ... |>>` would
# collect: active nodes only) and declares a `crossbar::backend` for each address
# and port (`crossbar::haproxy_backends` says how each parameter and HAProxy option
# maps). The exporting nodes need no change, and the puppetlabs-haproxy module need
# not be on the balancer. It needs PuppetDB (as exported resources do) and the
# `puppetdb_query` function of the PuppetDB terminus on the server.
#
# @example The haproxy listen block `puppet00` becomes the crossbar service `puppet`
#   include crossbar
#   crossbar::service { 'puppet': preset => 'puppet', listen => ['10.0.0.10:8140'] }
#   crossbar::balancermembers { 'puppet00': service => 'puppet' }
#
# @param listening_service
#   The exports' `listening_service` (the haproxy `listen` or `backend` name).
# @param service
#   The crossbar service to put them in.
# @param collect_tag
#   Collect only exports that carry this tag, too (`<<| tag == ... |>>`).
define crossbar::balancermembers (
  String[1] $listening_service = $title,
  Crossbar::Name $service = $title,
  Optional[String[1]] $collect_tag = undef,
) {
  unless defined(Class['crossbar']) {
    fail("Crossbar::Balancermembers[${title}]: declare class crossbar first (include crossbar)")
  }
  $tagged = $collect_tag ? {
    undef   => [],
    default => [['=', 'tag', downcase($collect_tag)]],
  }
  $query = ['from', 'resources', ['extract', ['certname', 'title', 'parameters'],
      ['and', ['=', 'type', 'Haproxy::Balancermember'], ['=', 'exported', true],
  ['=', ['parameter', 'listening_service'], $listening_service]] + $tagged]]
  crossbar::haproxy_backends(puppetdb_query($query), $service).each |$backend, $params| {
    crossbar::backend { $backend:
      * => $params,
    }
  }
}
