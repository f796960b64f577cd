# @summary An HAProxy time (`2000`, `2s`, `500ms`) as a crossbar duration (`2000ms`, `2s`), or undef when it is none.
#
# HAProxy reads a bare number as milliseconds; crossbar refuses a bare number.
#
# @param time
#   The HAProxy time, as written after `inter`, `slowstart`, `agent-inter`.
# @return [Optional[Crossbar::Duration]] The same duration for crossbar.
function crossbar::haproxy_duration(String $time) >> Optional[Crossbar::Duration] {
  $time ? {
    /\A[0-9]+\z/                    => "${time}ms",
    /\A[0-9]+(us|ms|s|m|h|d)\z/     => $time,
    default                         => undef,
  }
}
