# @summary The admin endpoint (/metrics, /healthz, /api); `{}` keeps crossbar's default (on, 127.0.0.1:9140).
#
# `systemctl reload crossbar` goes through this endpoint (`crossbar reload -c`):
# with `enabled => false` the module reloads with SIGHUP instead.
type Crossbar::Admin = Struct[{
  Optional[enabled]       => Boolean,
  Optional[listen]        => Crossbar::ListenAddress,
  Optional[token_file]    => Stdlib::Unixpath,
  Optional[allowed_hosts] => Array[Crossbar::Host],
  # /healthz fails (503) while a service has no backend taking new connections
  Optional[healthz_needs_backends] => Boolean,
}]
