# Every key the module writes, checked as `crossbar check` checks on the balancer:
# with the files the configuration names (token, CA, client certificate and key,
# state-file directory: made by run.sh in @W@). run.sh compares the result with
# everything.yaml, applies it a second time (no change), then breaks it.
class { 'crossbar':
  manage_package => false,
  manage_service => false,
  config_file    => '@OUT@',
  config_group   => 'root',
  binary         => '@BIN@',
  workers        => 2,
  confirm_budget => 0,
  state_file     => '@W@/state/crossbar.state',
  admin          => { 'listen' => '127.0.0.1:9140', 'token_file' => '@W@/admin.token', 'allowed_hosts' => ['lb1.example.com'], 'healthz_needs_backends' => true },
  admin_token    => Sensitive('t0ken-from-hiera'),
  defaults       => {
    'timeouts'        => { 'idle' => '1h 30m', 'queue' => '10s' },
    'keepalive'       => { 'enabled' => true, 'time' => '5m', 'interval' => '30s', 'probes' => 4 },
    'health'          => { 'check' => 'tls-hello', 'interval' => '2s', 'timeout' => '1s', 'rise' => 2, 'fall' => 3 },
    'max_hello_size'  => 16384,
    'retries'         => 2,
    'queue_size'      => 1024,
    'slow_start'      => '0s',
    'relay'           => 'splice-auto',
    'backlog'         => 1024,
    'max_connections' => 10000,
  },
}
crossbar::service { 'puppet':
  listen         => ['127.0.0.1:18140', { 'address' => '[::1]:18140', 'backlog' => 512, 'freebind' => true, 'max_connections' => 5000 }],
  mode           => 'tls',
  on_non_tls     => 'reject',
  server_names   => ['puppet.example.com', '*.puppet.example.com'],
  names          => ['puppet-vip.example.com', '10.0.0.10'],
  is_default     => true,
  on_marked_down => 'shutdown-sessions',
  source         => '127.0.0.1',
  balance        => 'leastconn',
  stick          => {
    'on' => ['session_id', 'ticket', 'psk', 'source'], 'size' => 50000, 'expire' => '30m',
    'source_expire' => '5m', 'source_prefix_v4' => 24, 'source_prefix_v6' => 56, 'ticket_prefix' => 16,
    'state_file' => '@W@/state/puppet.table', 'save_interval' => '60s', 'probe_interval' => '0s',
    'confirm' => true, 'confirm_tries' => 2,
  },
  timeouts       => { 'client_hello' => '3s', 'connect' => '2s', 'server_hello' => '4s', 'shutdown' => '20s' },
  keepalive      => { 'interval' => '10s' },
  health         => {
    'check' => 'https', 'path' => '/status/v1/simple/server', 'expect_status' => 200, 'expect_body' => 'running',
    'ca_file' => '@W@/ca.pem', 'client_cert' => '@W@/lb.pem', 'client_key' => '@W@/lb.key',
    'server_name' => 'puppet.example.com',
  },
  max_hello_size => 8192,
  retries        => 1,
  queue_size     => 100,
  slow_start     => '30s',
  relay          => 'auto',
}
crossbar::backend { 'puppet/compile1':
  address         => '127.0.0.1:28140',
  order           => 1,
  weight          => 2,
  max_connections => 500,
  health          => { 'interval' => '5s' },
}
crossbar::backend { 'puppet/compile2':
  address        => 'localhost:28141',
  order          => 2,
  proxy_protocol => 'v2',
  disabled       => true,
}
crossbar::backend { 'puppet/standby':
  address => '[::1]:28142',
  order   => 3,
  backup  => true,
  source  => '::1',
}
crossbar::service { 'puppetca':
  listen   => ['127.0.0.1:18141'],
  mode     => 'tcp',
  balance  => 'first',
  failback => 'auto',
  stick    => { 'on' => ['source'], 'confirm' => false },
  backends => [{ 'name' => 'ca1', 'address' => '127.0.0.1:28150', 'proxy_protocol' => 'v1', 'source' => '127.0.0.1' }],
}
