# @summary Reading PROXY headers from the tier in front of a listen address (docs/configuration.md, `listen[].proxy_protocol`).
#
# `accept_from` lists the tier's own addresses, nothing wider: a source in it may
# claim any client address.
type Crossbar::ProxyAccept = Struct[{
  accept_from        => Array[Crossbar::Network, 1],
  Optional[required] => Boolean,
}]
