# @summary Adds `extra` keys to settings the parameters gave: mappings merge key by key, a key both give is refused.
#
# `extra` is for keys the module's types don't know yet. A key the parameters (or
# the preset) already set must be written with the parameter, where its type checks
# it: letting `extra` replace it would take that check away.
#
# @param settings
#   What the parameters (and the preset) give.
# @param extra
#   The `extra` keys.
# @param where
#   The resource and the path so far, for the message (`Crossbar::Service[puppet]: extra`).
# @return [Hash] `settings` with `extra`'s keys added.
function crossbar::merge_extra(Hash $settings, Hash $extra, String $where) >> Hash {
  $extra.reduce($settings) |$acc, $kv| {
    [$k, $v] = $kv
    if !($k in $acc) {
      $acc + { $k => $v }
    } elsif $acc[$k] =~ Hash and $v =~ Hash {
      $acc + { $k => crossbar::merge_extra($acc[$k], $v, "${where}.${k}") }
    } else {
      fail("${where}.${k}: also set by a parameter (or the preset); set it there, where its type checks it: `extra` only adds keys the module's types don't know")
    }
  }
}
