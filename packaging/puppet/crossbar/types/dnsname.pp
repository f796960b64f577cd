# @summary A DNS name to look up, as `discover` takes it: an SRV name (`_compilers._tcp.example.com`) or a host name.
type Crossbar::DnsName = Pattern[/\A[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9.])?\z/]
