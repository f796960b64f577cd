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
# picks the port) -> `source`. What crossbar sets per service, not per backend, is
# left out with a warning that writes the service's parameter for it: `inter`,
# `rise`, `fall` -> `health => { interval, rise, fall }` (crossbar checks every
# backend alike; HAProxy's bare number of milliseconds becomes `2000ms`),
# `agent-check` with `agent-port`, `agent-send`, `agent-inter` -> `feedback => {
# kind => 'agent', port, send, interval }`, `slowstart` -> `slow_start`,
# `on-marked-down shutdown-sessions` -> `on_marked_down`. `check` alone needs
# nothing (every backend gets the service's `health`); `fastinter`, `downinter`,
# `port`, `addr` and `agent-addr` (crossbar checks and asks each backend at its own
# address, at one interval) and any other word are left out with a warning.
# `define_cookies` (HTTP cookies) has no layer-4 equivalent: the service's `stick`
# keeps agents on their backend.
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
    $text = [$p['options'].lest || { [] }].flatten.map |$o| { String($o) }.join(' ')
    # agent-send's string may be quoted and hold spaces: taken out whole first
    $send_re = /(\A|\s)agent-send\s+("(?:[^"\\]|\\.)*"|[^\s"]+)/
    # HAProxy's escapes in it (\n, \t) become the characters
    $send = $text.match($send_re).then |$m| {
      $m[2].regsubst(/\A"(.*)"\z/, '\1').regsubst(/\\n/, "\n", 'G').regsubst(/\\t/, "\t", 'G')
    }
    $words = $text.regsubst($send_re, '\1agent-send SEND').split(/\s+/).filter |$w| { !$w.empty }
    # words followed by a value, and the words crossbar maps or covers otherwise
    $valued = ['maxconn', 'weight', 'inter', 'rise', 'fall', 'source', 'on-marked-down', 'slowstart',
      'agent-port', 'agent-inter', 'agent-send']
    $dropped = ['fastinter', 'downinter', 'port', 'addr', 'agent-addr']
    $known = $valued + ['check', 'backup', 'disabled', 'send-proxy', 'send-proxy-v2', 'agent-check']
    $skipped = $words.filter |$i, $w| {
      !($w in $known) and !($w in $dropped) and !($i > 0 and ($words[$i - 1] in $valued or $words[$i - 1] in $dropped))
    }
    unless $skipped.empty {
      warning("crossbar::balancermembers: ${what}: HAProxy options left out: ${skipped.join(' ')}")
    }
    # each word with the one after it (the first of a repeated word wins)
    $opt = Hash($words.map |$i, $w| { [$w, $words[$i + 1]] }.reverse)
    $check_dropped = $dropped.filter |$w| { $w in $words }.map |$w| { "${w} ${opt[$w]}".strip }
    unless $check_dropped.empty {
      warning(@("MSG"/L))
        crossbar::balancermembers: ${what}: HAProxy options left out: ${check_dropped.join(' ')} \
        (crossbar checks and asks each backend at its own address and port, at one interval)
        |- MSG
    }
    crossbar::haproxy_service_options($opt + { 'agent-send' => $send }, $words, $service, $what)
    $at_weight = $words.index |$w| { $w == 'weight' }
    $at_maxconn = $words.index |$w| { $w == 'maxconn' }
    $at_source = $words.index |$w| { $w == 'source' }
    $source = $at_source.then |$at| { $words[$at + 1] }
    if $at_source =~ NotUndef and $source !~ Crossbar::IpAddress {
      warning("crossbar::balancermembers: ${what}: HAProxy option left out: source ${source} (crossbar's source is an IP address alone)")
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
