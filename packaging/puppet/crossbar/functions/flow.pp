# @summary Renders a value as a YAML flow scalar, sequence or mapping, for crossbar.yaml.
#
# Strings are single-quoted (YAML's only escape there is `''`), so no value can
# change the file's structure; a control character is refused, since a YAML
# single-quoted scalar would fold it. Mapping keys come out in the order of
# `crossbar::key_order()` (docs/configuration.md's tables), then alphabetically, so
# the same data always renders the same bytes (no change on the next run).
#
# @param value
#   The value: a string, integer, boolean, array or hash of these.
# @return [String] The YAML text, on one line.
function crossbar::flow(
  Variant[String, Integer, Boolean, Array, Hash] $value,
) >> String {
  $order = crossbar::key_order()
  case $value {
    Hash: {
      $keys = $value.keys.sort |$a, $b| {
        $ia = $order.index |$k| { $k == $a }
        $ib = $order.index |$k| { $k == $b }
        if $ia =~ Undef and $ib =~ Undef { compare($a, $b) }
        elsif $ia =~ Undef { 1 }
        elsif $ib =~ Undef { -1 }
        else { compare($ia, $ib) }
      }
      $pairs = $keys.map |$k| { "${k}: ${crossbar::flow($value[$k])}" }
      "{${pairs.join(', ')}}"
    }
    Array: {
      "[${value.map |$v| { crossbar::flow($v) }.join(', ')}]"
    }
    String: {
      if $value =~ /[\x00-\x1f\x7f]/ {
        fail("crossbar: a control character (newline, tab, ...) in '${value}' cannot be written to crossbar.yaml")
      }
      "'${regsubst($value, "'", "''", 'G')}'"
    }
    default: {
      String($value)
    }
  }
}
