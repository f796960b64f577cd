# @summary The concat order of a piece of crossbar.yaml: settings, `backends:`, inline then declared backends; services apart.
#
# concat sorts fragments by this string. A name may hold `_`, `-` and (a backend's)
# `.`; `_` is written as `=` (concat splits order from title at `__`), and a space
# separates the parts: it sorts before every name character, so service `a`'s
# pieces never land after service `a-b`'s.
#
# @param service
#   The service's name.
# @param part
#   `settings`, `backends` (the `backends:` key), `inline` (a backend given with the
#   service) or `declared` (a `crossbar::backend`).
# @param position
#   `inline`: the backend's index; `declared`: its `order` (0..999).
# @param backend
#   `declared`: the backend's name.
# @return [String] The order string.
function crossbar::order(
  Crossbar::Name $service,
  Enum['settings', 'backends', 'inline', 'declared'] $part = 'settings',
  Integer[0, 9999] $position = 0,
  Optional[Crossbar::BackendName] $backend = undef,
) >> String {
  $s = regsubst($service, '_', '=', 'G')
  case $part {
    'settings': { "20 ${s} 0" }
    'backends': { "20 ${s} 1" }
    'inline':   { "20 ${s} 2 ${sprintf('%04d', $position)}" }
    default:    { "20 ${s} 3 ${sprintf('%03d', $position)} ${regsubst(String($backend), '_', '=', 'G')}" }
  }
}
