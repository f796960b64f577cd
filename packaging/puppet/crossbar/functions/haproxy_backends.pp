# @summary The crossbar backends that exported `haproxy::balancermember` resources describe (puppetlabs-haproxy's parameters).
#
# One backend per address and port, as haproxy's template writes one `server` line
# per pair: `ipaddresses` and `server_names` in lockstep, each on every port of
# `ports` (an array, or a comma-separated string). A member that set no
# `server_names` is named after its node's certname and one without `ipaddresses` is
# dialled at its certname (haproxy would take the *balancer's* own facts there);
# with several ports each backend is named `NAME-PORT`.
#
# HAProxy `options` (an array or a string of words): `backup`, `maxconn N` ->
# `max_connections`, `weight N` (or the `weight` parameter) -> `weight` (0, "no new
# connections", is written as `disabled`), `disabled`, `send-proxy` and
# `send-proxy-v2` -> `proxy_protocol`, `source ADDRESS` (an IP address alone: crossbar
# picks the port) -> `source`. `check` and its `inter`, `rise`, `fall`, `port` are
# the service's `health` in crossbar, which checks every backend, and
# `on-marked-down shutdown-sessions` is the service's `on_marked_down`: both are
# left out, the latter with a warning naming the service's parameter; any other word
# is left out with a warning. `define_cookies` (HTTP cookies) has no layer-4
# equivalent: the service's `stick` keeps agents on their backend.
#
# @param members
#   The resources as PuppetDB returns them: `certname`, `title` and `parameters`.
# @param service
#   The crossbar service they belong to.
# @return [Hash] `crossbar::backend` title (`SERVICE/NAME`) => parameters.
function crossbar::haproxy_backends(Array[Hash] $members, Crossbar::Name $service) >> Hash {
  $members.reduce({}) |$out, $m| {
    $p = $m['parameters'].lest || { {} }
    $what = "Haproxy::Balancermember[${m['title']}] of ${m['certname']}"
    $ports = [$p['ports']].flatten.filter |$x| { $x =~ NotUndef }.map |$x| {
      String($x).split(',').map |$s| { $s.strip }
    }.flatten.filter |$s| { !$s.empty }
    if $ports.empty {
      fail("crossbar::balancermembers: ${what} has no ports; crossbar needs the port to dial")
    }
    $ips = [$p['ipaddresses'].lest || { $m['certname'] }].flatten
    $names = [$p['server_names'].lest || { $m['certname'] }].flatten
    $words = [$p['options'].lest || { [] }].flatten.map |$o| { String($o).split(/\s+/) }.flatten.filter |$w| { !$w.empty }
    # words followed by a value, and the words crossbar maps or covers otherwise
    $valued = ['maxconn', 'weight', 'inter', 'fastinter', 'downinter', 'rise', 'fall', 'port', 'addr', 'source', 'on-marked-down']
    $known = $valued + ['check', 'backup', 'disabled', 'send-proxy', 'send-proxy-v2']
    $skipped = $words.filter |$i, $w| {
      !($w in $known) and !($i > 0 and $words[$i - 1] in $valued)
    }
    unless $skipped.empty {
      warning("crossbar::balancermembers: ${what}: HAProxy options left out: ${skipped.join(' ')}")
    }
    $at_weight = $words.index |$w| { $w == 'weight' }
    $at_maxconn = $words.index |$w| { $w == 'maxconn' }
    $at_source = $words.index |$w| { $w == 'source' }
    $at_down = $words.index |$w| { $w == 'on-marked-down' }
    $source = $at_source.then |$at| { $words[$at + 1] }
    if $at_source =~ NotUndef and $source !~ Crossbar::IpAddress {
      warning("crossbar::balancermembers: ${what}: HAProxy option left out: source ${source} (crossbar's source is an IP address alone)")
    }
    $at_down.then |$at| {
      warning(@("MSG"/L))
        crossbar::balancermembers: ${what}: HAProxy option left out: on-marked-down ${words[$at + 1]} \
        (crossbar sets it per service: crossbar::service { '${service}': on_marked_down => 'shutdown-sessions' })
        |- MSG
    }
    $weight = $p['weight'].lest || { $at_weight.then |$at| { $words[$at + 1] } }
    $maxconn = $at_maxconn.then |$at| { $words[$at + 1] }
    $proxy = 'send-proxy-v2' in $words ? {
      true    => 'v2',
      default => 'send-proxy' in $words ? { true => 'v1', default => undef },
    }
    $settings = {
      'weight'          => $weight ? { undef => undef, default => Integer($weight) },
      'backup'          => 'backup' in $words ? { true => true, default => undef },
      'max_connections' => $maxconn ? { undef => undef, default => Integer($maxconn) },
      'proxy_protocol'  => $proxy,
      'disabled'        => ('disabled' in $words or String($weight) == '0') ? { true => true, default => undef },
      'source'          => $source =~ Crossbar::IpAddress ? { true => $source, default => undef },
    }.filter |$k, $v| { $v =~ NotUndef and !($k == 'weight' and $v == 0) }

    # haproxy pairs them in lockstep (Array#zip); one name for one address
    $pairs = $ips.map |$i, $ip| { [$ip, $names[$i].lest || { $names[0] }] }
    $pairs.reduce($out) |$acc, $pair| {
      [$ip, $name] = $pair
      $ports.reduce($acc) |$acc2, $port| {
        $backend = $ports.length > 1 ? { true => "${name}-${port}", default => $name }
        unless $backend =~ Crossbar::BackendName {
          fail("crossbar::balancermembers: ${what}: '${backend}' is no backend name (letters, digits, '_', '-' and '.')")
        }
        $host = $ip =~ /:/ ? { true => "[${ip}]", default => $ip }
        $acc2 + { "${service}/${backend}" => { 'address' => "${host}:${port}" } + $settings }
      }
    }
  }
}
