# @summary The keys of a mapping in the order crossbar.yaml writes them: `crossbar::key_order()`, then any other alphabetically.
#
# Keys the order does not list (written through `extra`) come last, so the same
# data always renders the same bytes (no change on the next run).
#
# @param value
#   The mapping.
# @return [Array[String]] Its keys, in order.
function crossbar::sorted_keys(Hash $value) >> Array[String] {
  $order = crossbar::key_order()
  $value.keys.sort |$a, $b| {
    $ia = $order.index |$k| { $k == $a }
    $ib = $order.index |$k| { $k == $b }
    if $ia =~ Undef and $ib =~ Undef { compare($a, $b) }
    elsif $ia =~ Undef { 1 }
    elsif $ib =~ Undef { -1 }
    else { compare($ia, $ib) }
  }
}
