# @summary Renders a value as a YAML flow scalar, sequence or mapping, for crossbar.yaml.
#
# Strings are single-quoted (YAML's only escape there is `''`), so no value can
# change the file's structure; one with a newline or a tab (an agent's `send`) is
# double-quoted with YAML's escapes (`\n`, `\t`, `\\`, `\"`), and any other control
# character is refused. Mapping keys come out in the order of
# `crossbar::key_order()` (docs/configuration.md's tables), then alphabetically, so
# the same data always renders the same bytes (no change on the next run).
#
# @param value
#   The value: a string, number, boolean, array or hash of these. A mapping key
#   other than a plain word (letters, digits, `_`) is quoted like a string.
# @return [String] The YAML text, on one line.
function crossbar::flow(
  Variant[String, Numeric, Boolean, Array, Hash] $value,
) >> String {
  case $value {
    Hash: {
      $keys = crossbar::sorted_keys($value)
      $pairs = $keys.map |$k| {
        $key = $k ? {
          /\A[A-Za-z_][A-Za-z0-9_]*\z/ => $k,
          default                       => crossbar::flow($k),
        }
        "${key}: ${crossbar::flow($value[$k])}"
      }
      "{${pairs.join(', ')}}"
    }
    Array: {
      "[${value.map |$v| { crossbar::flow($v) }.join(', ')}]"
    }
    String: {
      if $value =~ /[\x00-\x08\x0b-\x1f\x7f]/ {
        fail("crossbar: a control character (carriage return, escape, ...) in '${value}' cannot be written to crossbar.yaml")
      }
      if $value =~ /[\t\n]/ {
        # double-quoted, YAML's escapes: an agent's `send` ends with a newline
        $escaped = $value.split('').map |$c| {
          $c ? { "\n" => '\n', "\t" => '\t', '\\' => '\\\\', '"' => '\"', default => $c }
        }.join
        "\"${escaped}\""
      } else {
        "'${regsubst($value, "'", "''", 'G')}'"
      }
    }
    default: {
      String($value)
    }
  }
}
