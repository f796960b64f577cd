# @summary Warns of the HAProxy server options crossbar sets per service, writing the service's parameter for each.
#
# `inter`, `rise`, `fall` -> `health`; `agent-check` (`agent-port`, `agent-send`,
# `agent-inter`) -> `feedback => { kind => 'agent' }`; `slowstart` -> `slow_start`;
# `on-marked-down` -> `on_marked_down`. A member cannot set them on the service (it
# is declared elsewhere, and applies to every backend alike): the warning says what
# to write there, with this member's values.
#
# @param opt
#   Each option word with the word after it (`agent-send` with its whole string).
# @param words
#   The option words, in order.
# @param service
#   The crossbar service the member belongs to.
# @param what
#   The member, as warnings name it.
# @return [Undef] Nothing: warnings only.
function crossbar::haproxy_service_options(Hash $opt, Array[String] $words, Crossbar::Name $service, String $what) >> Undef {
  $where = "crossbar::balancermembers: ${what}:"
  $health_words = ['inter', 'rise', 'fall'].filter |$w| { $w in $words }
  unless $health_words.empty {
    $interval = $opt['inter'].then |$t| { crossbar::haproxy_duration($t) }
    $health = {
      'interval' => $interval,
      'rise'     => $opt['rise'].then |$n| { $n =~ /\A[0-9]+\z/ ? { true => Integer($n), default => undef } },
      'fall'     => $opt['fall'].then |$n| { $n =~ /\A[0-9]+\z/ ? { true => Integer($n), default => undef } },
    }.filter |$k, $v| { $v =~ NotUndef }
    $said = $health_words.map |$w| { "${w} ${opt[$w]}" }.join(' ')
    warning(@("MSG"/L))
      ${where} HAProxy options ${said} are the service's health check in crossbar, which checks \
      every backend alike: crossbar::service { '${service}': health => ${String($health, '%p')} }
      |- MSG
  }
  if 'agent-check' in $words {
    $feedback = {
      'kind'     => 'agent',
      'port'     => $opt['agent-port'].then |$n| { $n =~ /\A[0-9]+\z/ ? { true => Integer($n), default => undef } },
      'send'     => $opt['agent-send'],
      'interval' => $opt['agent-inter'].then |$t| { crossbar::haproxy_duration($t) },
    }.filter |$k, $v| { $v =~ NotUndef }
    $port = 'port' in $feedback ? { true => '', default => ' (add port: the agent\'s TCP port)' }
    warning(@("MSG"/L))
      ${where} HAProxy option agent-check is the service's load feedback in crossbar, which asks \
      every backend's agent: crossbar::service { '${service}': feedback => ${String($feedback, '%p')} }${port}
      |- MSG
  }
  if 'slowstart' in $words {
    $ramp = $opt['slowstart'].then |$t| { crossbar::haproxy_duration($t) }
    warning(@("MSG"/L))
      ${where} HAProxy option slowstart ${opt['slowstart']} is the service's slow_start in crossbar: \
      crossbar::service { '${service}': slow_start => '${ramp}' }
      |- MSG
  }
  if 'on-marked-down' in $words {
    warning(@("MSG"/L))
      ${where} HAProxy option left out: on-marked-down ${opt['on-marked-down']} \
      (crossbar sets it per service: crossbar::service { '${service}': on_marked_down => 'shutdown-sessions' })
      |- MSG
  }
  undef
}
