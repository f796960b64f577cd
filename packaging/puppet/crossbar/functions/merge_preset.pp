# @summary Merges a service's own settings over its preset's: maps (`stick`, `health`, ...) key by key, anything else replaced.
#
# A `feedback` of another `kind` than the preset's replaces it whole: the keys of
# one kind are refused with the other.
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
    if $k == 'feedback' and $k in $acc and $acc[$k] =~ Hash and $v =~ Hash and $acc[$k]['kind'] != $v['kind'] {
      $acc
    } elsif $k in $acc and $acc[$k] =~ Hash and $v =~ Hash {
      $acc + { $k => $v + $acc[$k] }
    } elsif $k in $acc {
      $acc
    } else {
      $acc + { $k => $v }
    }
  }
}
