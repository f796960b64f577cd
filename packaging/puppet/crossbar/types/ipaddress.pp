# @summary An IP address, without a port or prefix (`10.0.1.250`, `2001:db8:1::250`), as `source` takes it.
type Crossbar::IpAddress = Variant[
  Pattern[/\A\d{1,3}(\.\d{1,3}){3}\z/],
  Pattern[/\A[0-9A-Fa-f.]*:[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*\z/],
]
