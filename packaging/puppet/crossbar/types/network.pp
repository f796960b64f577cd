# @summary An IP address or network (`10.0.2.0/24`, `2001:db8:2::/64`), as `accept_from` and `allow` take it.
#
# Host bits after the prefix (`10.0.0.1/8`) are refused by `crossbar check`.
type Crossbar::Network = Variant[
  Pattern[/\A\d{1,3}(\.\d{1,3}){3}(\/\d{1,2})?\z/],
  Pattern[/\A[0-9A-Fa-f.]*:[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*(\/\d{1,3})?\z/],
]
