# @summary The order crossbar.yaml's keys are written in: that of docs/configuration.md's tables.
#
# @return [Array[String]] Key names, first first.
function crossbar::key_order() >> Array[String] {
  [
    # top level
    'workers', 'confirm_budget', 'admin', 'defaults',
    # backends and listeners
    'name', 'address',
    # feedback's `kind` first
    'kind',
    # admin (and keepalive's `enabled`), health's `check`
    'enabled', 'check', 'listen', 'token_file', 'allowed_hosts', 'healthz_needs_backends',
    # services, defaults
    'mode', 'on_non_tls', 'server_names', 'names', 'default', 'on_marked_down', 'source', 'balance', 'failback',
    'stick', 'timeouts', 'keepalive', 'health', 'max_hello_size', 'retries', 'queue_size',
    'slow_start', 'relay', 'discover', 'feedback', 'backlog', 'freebind', 'max_connections',
    # backends, listeners
    'weight', 'backup', 'proxy_protocol', 'disabled', 'per_source',
    # listen[].proxy_protocol
    'accept_from', 'required',
    # listen[].per_source
    'rate', 'burst', 'allow', 'table_size',
    # discover
    'srv', 'host', 'port', 'resolvers', 'min_ttl', 'max_ttl', 'max_backends', 'backend',
    # timeouts
    'client_hello', 'connect', 'server_hello', 'idle', 'queue', 'shutdown',
    # keepalive, health
    'time', 'interval', 'probes', 'timeout', 'rise', 'fall', 'path', 'expect_status',
    'expect_body', 'ca_file', 'client_cert', 'client_key', 'server_name',
    # stick
    'on', 'size', 'expire', 'source_expire', 'source_prefix_v4', 'source_prefix_v6',
    'ticket_prefix', 'state_file', 'save_interval', 'probe_interval', 'confirm', 'confirm_tries',
    # feedback (`interval`, `timeout`, `path`, the files, `server_name`, `port` above)
    'blackout', 'expiry', 'smoothing', 'floor', 'saturated_sticky', 'jrubies', 'queue_limit',
    'by_pool_size', 'send',
  ]
}
