# What the module writes for this release's features, checked by the real
# `crossbar check` with the files it names: compilers from SRV records (`discover`),
# a listener behind a PROXY tier with per-source limits, backends named after their
# certnames (one in the place of a discovered backend), load feedback of both kinds
# (an agent's `send` with its newline), keys through `extra`, and the
# Puppet CA copied into place by the class (`ca_source`). run.sh compares the result
# with features.yaml.
class { 'crossbar':
  manage_package => false,
  manage_service => false,
  config_file    => '@OUT@',
  config_group   => 'root',
  binary         => '@BIN@',
  ca_source      => '@W@/ca.pem',
  ca_file        => '@W@/etc/puppet-ca.pem',
  admin          => { 'listen' => '127.0.0.1:9140' },
  defaults       => { 'health' => { 'check' => 'https', 'ca_file' => '@W@/etc/puppet-ca.pem' } },
  extra          => { 'defaults' => { 'slow_start' => '10s' } },
}
crossbar::service { 'puppet':
  preset   => 'puppet',
  listen   => [{
    'address'        => '127.0.0.1:18140',
    'proxy_protocol' => { 'accept_from' => ['10.0.2.0/24', '2001:db8:2::/64'], 'required' => false },
    'per_source'     => {
      'max_connections' => 20, 'rate' => 10, 'burst' => 40, 'source_prefix_v4' => 32, 'source_prefix_v6' => 64,
      'allow' => ['10.0.5.0/24'], 'table_size' => 100000,
    },
  }],
  names    => ['puppet.example.com'],
  stick    => { 'state_file' => '@W@/state/puppet.table' },
  health   => { 'server_name' => 'puppet.example.com' },
  discover => {
    'srv' => '_x-puppet._tcp.example.com', 'resolvers' => ['127.0.0.1:53'], 'min_ttl' => '5s', 'max_ttl' => '5m',
    'timeout' => '2s',
    'backend' => { 'max_connections' => 24, 'proxy_protocol' => 'v2', 'source' => '127.0.0.1', 'health' => { 'interval' => '5s' } },
  },
  feedback => {
    'kind' => 'puppet', 'interval' => '1s', 'queue_limit' => 10, 'floor' => '5%', 'jrubies' => 4,
    'ca_file' => '@W@/etc/puppet-ca.pem', 'server_name' => 'puppet.example.com', 'saturated_sticky' => true,
  },
  extra    => { 'discover' => { 'max_backends' => 16 } },
}
# In the place of the backend the SRV record for compile2.example.com:8140 gives.
crossbar::backend { 'puppet/compile2.example.com-8140': address => '127.0.0.1:28140', max_connections => 100 }
crossbar::service { 'puppetdb':
  preset   => 'puppetdb',
  listen   => ['127.0.0.1:18081'],
  health   => { 'server_name' => 'puppetdb.example.com' },
  # HAProxy's agent-check: an agent on each PuppetDB host
  feedback => { 'kind' => 'agent', 'port' => 5555, 'send' => "puppetdb\n", 'interval' => '2s' },
}
crossbar::backend { 'puppetdb/pdb1.dc1.example.com': address => 'pdb1.dc1.example.com:8081' }
crossbar::service { 'puppetca':
  preset => 'puppetca',
  listen => ['127.0.0.1:18141'],
  health => { 'server_name' => 'puppetca.example.com' },
  extra  => { 'discover' => { 'host' => 'ca.example.com', 'port' => 8140 } },
}
