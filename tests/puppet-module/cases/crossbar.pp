# conf/crossbar.yaml (three VIPs) written by the module: run.sh compares the two
# files' data and `crossbar check`'s summaries. @OUT@ and @BIN@ are filled in by run.sh.
class { 'crossbar':
  manage_package => false,
  manage_service => false,
  config_file    => '@OUT@',
  config_group   => 'root',
  binary         => '@BIN@',
  check_files    => false, # names /etc/crossbar files this machine lacks
  confirm_budget => 100,
  admin          => { 'listen' => '127.0.0.1:9140', 'token_file' => '/etc/crossbar/admin.token' },
  defaults       => {
    'timeouts' => {
      'client_hello' => '5s', 'connect' => '3s', 'server_hello' => '5s',
      'idle' => '30m', 'queue' => '10s', 'shutdown' => '30s',
    },
    'health'   => { 'check' => 'tls-hello', 'interval' => '2s', 'timeout' => '1s', 'rise' => 2, 'fall' => 3 },
    'retries'  => 2,
  },
}
crossbar::service { 'puppetca':
  listen   => ['10.0.0.11:8140'],
  balance  => 'first',
  failback => 'manual',
}
crossbar::backend { 'puppetca/ca1': address => 'puppetca1.example.com:8140', order => 1 }
crossbar::backend { 'puppetca/ca2': address => 'puppetca2.example.com:8140', order => 2, backup => true }

crossbar::service { 'puppet':
  listen   => ['10.0.0.10:8140'],
  balance  => 'leastconn',
  stick    => {
    'on' => ['session_id', 'ticket', 'psk', 'source'], 'size' => 100000, 'expire' => '30m',
    'state_file' => '/var/lib/crossbar/puppet.table', 'confirm' => true, 'confirm_tries' => 3,
  },
  health   => {
    'check' => 'https', 'path' => '/status/v1/simple', 'expect_status' => 200, 'expect_body' => 'running',
    'ca_file' => '/etc/crossbar/puppet-ca.pem', 'server_name' => 'puppet.example.com',
  },
  feedback => { 'kind' => 'puppet' },
}
crossbar::backend { 'puppet/compile1': address => '10.0.1.1:8140', weight => 2, max_connections => 500 }
crossbar::backend { 'puppet/compile2': address => '10.0.1.2:8140', max_connections => 250 }
crossbar::backend { 'puppet/compile3': address => '10.0.1.3:8140', max_connections => 250 }

crossbar::service { 'puppetfiles':
  listen   => ['10.0.0.12:8140'],
  backends => [
    { 'name' => 'files1', 'address' => '10.0.1.1:8140' },
    { 'name' => 'files2', 'address' => '10.0.1.2:8140' },
  ],
}
