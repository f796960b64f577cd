# @summary A host name (a trailing dot is allowed) or an IP address, as in a service's `names`.
type Crossbar::Host = Variant[
  Pattern[/\A[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9.])?\z/],
  Pattern[/\A[0-9A-Fa-f:.]+\z/],
]
