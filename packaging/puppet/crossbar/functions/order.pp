# @summary The concat order of a piece of crossbar.yaml: each service's header, then its backends, services apart.
#
# concat sorts fragments by this string. A name may hold `_` and `-`; `_` is
# written as `=` (concat splits order from title at `__`), and a space separates
# the parts: it sorts before every name character, so service `a`'s backends never
# land after service `a-b`'s header.
#
# @param service
#   The service's name.
# @param backend_order
#   `undef` for the service's header, else the backend's position (0..999).
# @param backend
#   The backend's name.
# @return [String] The order string.
function crossbar::order(
  Crossbar::Name $service,
  Optional[Integer[0, 999]] $backend_order = undef,
  Optional[Crossbar::Name] $backend = undef,
) >> String {
  $s = regsubst($service, '_', '=', 'G')
  if $backend_order =~ Undef {
    "20 ${s} 0"
  } else {
    $b = regsubst(String($backend), '_', '=', 'G')
    "20 ${s} 1 ${sprintf('%03d', $backend_order)} ${b}"
  }
}
