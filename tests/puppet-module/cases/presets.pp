# conf/puppet.yaml (one service per Puppet job) from the module's presets: run.sh
# compares `crossbar check`'s summaries of the two files (the presets set the
# check in each service, the file in `defaults`, so the data differ, not the result).
class { 'crossbar':
  manage_package => false,
  manage_service => false,
  config_file    => '@OUT@',
  config_group   => 'root',
  binary         => '@BIN@',
  check_files    => false,
  admin          => { 'listen' => '127.0.0.1:9140', 'token_file' => '/etc/crossbar/admin.token' },
  defaults       => {
    'timeouts' => {
      'client_hello' => '5s', 'connect' => '3s', 'server_hello' => '5s',
      'idle' => '30m', 'queue' => '10s', 'shutdown' => '30s',
    },
    'health'   => {
      'check' => 'https', 'ca_file' => '/etc/crossbar/puppet-ca.pem',
      'interval' => '2s', 'timeout' => '2s', 'rise' => 2, 'fall' => 3,
    },
    'retries'  => 2,
  },
}
crossbar::service { 'puppetca':
  preset => 'puppetca',
  listen => ['10.0.0.11:8140'],
  names  => ['puppetca.example.com'],
  health => { 'server_name' => 'puppetca.example.com' },
}
crossbar::service { 'puppet':
  preset => 'puppet',
  listen => ['10.0.0.10:8140'],
  names    => ['puppet.example.com'],
  health   => { 'server_name' => 'puppet.example.com' },
  # conf/puppet.yaml turns load feedback on; the preset leaves it to the site
  feedback => { 'kind' => 'puppet' },
}
crossbar::service { 'puppetfiles':
  preset => 'puppetfiles',
  listen => ['10.0.0.12:8140'],
  names  => ['puppetfiles.example.com'],
  health => { 'server_name' => 'puppetfiles.example.com' },
}
crossbar::service { 'puppetdb':
  preset => 'puppetdb',
  listen => ['10.0.0.13:8081'],
  names  => ['puppetdb.example.com'],
  health => { 'server_name' => 'puppetdb.example.com' },
}
# What the compile servers and PuppetDB nodes would export (@@crossbar::backend).
crossbar::backend { 'puppetca/ca1': address => 'puppetca1.example.com:8140', order => 1 }
crossbar::backend { 'puppetca/ca2': address => 'puppetca2.example.com:8140', order => 2, backup => true }
['1', '2', '3'].each |$n| {
  crossbar::backend { "puppet/compile${n}":
    address         => "compile${n}.example.com:8140",
    max_connections => 250,
  }
  crossbar::backend { "puppetfiles/files${n}":
    address => "compile${n}.example.com:8140",
  }
}
crossbar::backend { 'puppetdb/pdb1': address => 'puppetdb1.example.com:8081' }
crossbar::backend { 'puppetdb/pdb2': address => 'puppetdb2.example.com:8081' }
