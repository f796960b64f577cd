# @summary Merges a service's own settings over its preset's: maps (`stick`, `health`, ...) key by key, anything else replaced.
#
# @param preset
#   The preset's settings.
# @param own
#   The service's settings; `undef` values are left out first.
# @return [Hash] The merged settings.
function crossbar::merge_preset(Hash $preset, Hash $own) >> Hash {
  $set = $own.filter |$k, $v| { $v !~ Undef }
  $preset.reduce($set) |$acc, $kv| {
    [$k, $v] = $kv
    if $k in $acc and $acc[$k] =~ Hash and $v =~ Hash {
      $acc + { $k => $v + $acc[$k] }
    } elsif $k in $acc {
      $acc
    } else {
      $acc + { $k => $v }
    }
  }
}
