# conf/shared-listener.yaml (one VIP, SNI routing) written by the module.
class { 'crossbar':
  manage_package => false,
  manage_service => false,
  config_file    => '@OUT@',
  config_group   => 'root',
  binary         => '@BIN@',
  defaults       => { 'health' => { 'check' => 'tls-hello' } },
  services       => {
    # The address's settings written once, here, as the file does; the others name it alone.
    'puppetca'    => {
      'listen' => [{ 'address' => '10.0.0.10:8140', 'freebind' => true, 'per_source' => { 'max_connections' => 20 } }],
      'server_names' => ['puppetca.example.com'], 'balance' => 'first',
      'backends' => [
        { 'name' => 'ca1', 'address' => 'puppetca1.example.com:8140' },
        { 'name' => 'ca2', 'address' => 'puppetca2.example.com:8140', 'backup' => true },
      ],
    },
    'puppet'      => {
      'listen' => ['10.0.0.10:8140'], 'server_names' => ['puppet.example.com', '*.puppet.example.com'],
      'is_default' => true, 'balance' => 'leastconn', 'stick' => {},
    },
    'puppetfiles' => { 'listen' => ['10.0.0.10:8140'], 'server_names' => ['puppetfiles.example.com'] },
  },
  backends       => {
    'puppet/compile1'   => { 'address' => '10.0.1.1:8140' },
    'puppet/compile2'   => { 'address' => '10.0.1.2:8140' },
    'puppetfiles/files1' => { 'address' => '10.0.1.3:8140' },
    'puppetfiles/files2' => { 'address' => '10.0.1.4:8140' },
  },
}
