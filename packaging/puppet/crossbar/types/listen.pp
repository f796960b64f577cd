# @summary One entry of a service's `listen`: an address, or the long form with per-listener settings.
type Crossbar::Listen = Variant[
  Crossbar::ListenAddress,
  Struct[{
    address                   => Crossbar::ListenAddress,
    Optional[backlog]         => Integer[1],
    Optional[freebind]        => Boolean,
    Optional[max_connections] => Integer[1],
  }],
]
