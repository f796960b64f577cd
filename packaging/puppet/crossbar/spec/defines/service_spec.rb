require 'spec_helper'

describe 'crossbar::service' do
  let(:pre_condition) { 'include crossbar' }
  let(:title) { 'puppetca' }

  context 'with the puppetca preset, a standby and own health settings' do
    let(:params) do
      {
        'preset' => 'puppetca',
        'listen' => ['10.0.0.11:8140', { 'address' => '[2001:db8::11]:8140', 'freebind' => true, 'backlog' => 512 }],
        'names' => ['puppetca.example.com'],
        'health' => { 'server_name' => 'puppetca.example.com', 'interval' => '5s' },
        'timeouts' => { 'idle' => '1h' },
        'backends' => [
          { 'name' => 'ca1', 'address' => 'puppetca1.example.com:8140' },
          { 'name' => 'ca2', 'address' => 'puppetca2.example.com:8140', 'backup' => true },
        ],
      }
    end

    it 'merges the health map key by key and keeps the preset balance' do
      expect(rendered).to end_with(<<~YAML)
        \  puppetca:
            listen: ['10.0.0.11:8140', {address: '[2001:db8::11]:8140', backlog: 512, freebind: true}]
            names: ['puppetca.example.com']
            balance: 'first'
            failback: 'manual'
            timeouts: {idle: '1h'}
            health: {check: 'https', interval: '5s', path: '/status/v1/simple/ca', server_name: 'puppetca.example.com'}
            backends:
              - {name: 'ca1', address: 'puppetca1.example.com:8140'}
              - {name: 'ca2', address: 'puppetca2.example.com:8140', backup: true}
      YAML
    end
  end

  context 'with a shared listener (SNI), default service, every service key' do
    let(:title) { 'puppet_sni' }
    let(:params) do
      {
        'listen' => ['10.0.0.10:8140'],
        'mode' => 'tls',
        'on_non_tls' => 'forward',
        'server_names' => ['puppet.example.com', '*.puppet.example.com'],
        'is_default' => true,
        'balance' => 'source',
        'failback' => 'auto',
        'stick' => { 'on' => ['source'], 'source_prefix_v4' => 24, 'state_file' => '/var/lib/crossbar/puppet.table', 'confirm' => false },
        'keepalive' => { 'time' => '5m', 'probes' => 4 },
        'max_hello_size' => 16_384,
        'retries' => 2,
        'queue_size' => 0,
        'slow_start' => '30s',
        'relay' => 'splice-auto',
        'backends' => [{ 'name' => 'c1', 'address' => '[2001:db8::1]:8140', 'proxy_protocol' => 'v2', 'health' => { 'check' => 'tcp' } }],
      }
    end

    it 'writes each key once, in the documented order' do
      expect(rendered).to end_with(<<~YAML)
        \  puppet_sni:
            listen: ['10.0.0.10:8140']
            mode: 'tls'
            on_non_tls: 'forward'
            server_names: ['puppet.example.com', '*.puppet.example.com']
            default: true
            balance: 'source'
            failback: 'auto'
            stick: {on: ['source'], source_prefix_v4: 24, state_file: '/var/lib/crossbar/puppet.table', confirm: false}
            keepalive: {time: '5m', probes: 4}
            max_hello_size: 16384
            retries: 2
            queue_size: 0
            slow_start: '30s'
            relay: 'splice-auto'
            backends:
              - {name: 'c1', address: '[2001:db8::1]:8140', health: {check: 'tcp'}, proxy_protocol: 'v2'}
      YAML
    end
  end

  context 'closing a dead backend\'s connections, from a source address, one backend from another' do
    let(:params) do
      {
        'listen' => ['10.0.0.11:8140'],
        'on_marked_down' => 'shutdown-sessions',
        'source' => '10.0.1.250',
        'balance' => 'first',
        'backends' => [
          { 'name' => 'ca1', 'address' => 'ca1:8140' },
          { 'name' => 'ca2', 'address' => 'ca2:8140', 'source' => '2001:db8:1::250', 'backup' => true },
        ],
      }
    end

    it 'writes on_marked_down and source after default and before balance, a backend\'s source with it' do
      expect(rendered).to end_with(<<~YAML)
        \  puppetca:
            listen: ['10.0.0.11:8140']
            on_marked_down: 'shutdown-sessions'
            source: '10.0.1.250'
            balance: 'first'
            backends:
              - {name: 'ca1', address: 'ca1:8140'}
              - {name: 'ca2', address: 'ca2:8140', source: '2001:db8:1::250', backup: true}
      YAML
    end
  end

  context 'with on_marked_down none (crossbar\'s default, written as given)' do
    let(:params) { { 'listen' => ['10.0.0.11:8140'], 'on_marked_down' => 'none' } }

    it { expect(fragment('crossbar service puppetca')).to include("    on_marked_down: 'none'\n") }
  end

  describe 'on an address whose settings class crossbar gives (listeners)' do
    let(:pre_condition) do
      <<~PP
        class { 'crossbar':
          listeners => { '10.0.0.10:8140' => { 'freebind' => true, 'per_source' => { 'max_connections' => 20 } } },
        }
      PP
    end

    context 'named alone' do
      let(:params) { { 'listen' => ['10.0.0.10:8140', '10.0.0.11:8140'] } }

      it 'writes the long form with them; other addresses as given' do
        expect(fragment('crossbar service puppetca')).to include(
          "    listen: [{address: '10.0.0.10:8140', freebind: true, per_source: {max_connections: 20}}, '10.0.0.11:8140']\n",
        )
      end
    end

    context 'in the long form, with a setting of its own and one repeated with the same value' do
      let(:params) { { 'listen' => [{ 'address' => '10.0.0.10:8140', 'backlog' => 512, 'freebind' => true }] } }

      it 'writes both' do
        expect(fragment('crossbar service puppetca')).to include(
          "    listen: [{address: '10.0.0.10:8140', backlog: 512, freebind: true, per_source: {max_connections: 20}}]\n",
        )
      end
    end

    context 'in the long form, with another value' do
      let(:params) { { 'listen' => ['10.0.0.11:8140', { 'address' => '10.0.0.10:8140', 'per_source' => { 'max_connections' => 50 } }] } }

      it 'fails, naming the entry, the setting and where it is written once' do
        is_expected.to compile.and_raise_error(
          %r{Crossbar::Service\[puppetca\]: listen\[1\]\.per_source: differs from crossbar::listeners\['10\.0\.0\.10:8140'\] \(an address's settings belong to its one socket: give them once, there\)},
        )
      end
    end
  end

  context 'with a quote in a value' do
    let(:params) { { 'listen' => ['10.0.0.11:8140'], 'health' => { 'check' => 'https', 'expect_body' => "it's up" } } }

    it 'doubles it (YAML single quotes) so no value can change the structure' do
      expect(fragment('crossbar service puppetca')).to include("health: {check: 'https', expect_body: 'it''s up'}")
    end
  end

  context 'with discover, a listener behind a PROXY tier with per-source limits, and extra keys' do
    let(:title) { 'puppet' }
    let(:params) do
      {
        'preset' => 'puppet',
        'listen' => [{
          'address' => '10.0.0.10:8140',
          'proxy_protocol' => { 'accept_from' => ['10.0.2.0/24', '2001:db8:2::/64'], 'required' => false },
          'per_source' => {
            'max_connections' => 20, 'rate' => 10, 'burst' => 40, 'source_prefix_v4' => 32,
            'source_prefix_v6' => 64, 'allow' => ['10.0.5.0/24'], 'table_size' => 100_000,
          },
        }],
        'discover' => {
          'srv' => '_x-puppet._tcp.example.com', 'resolvers' => ['10.0.0.2:53'], 'min_ttl' => '5s',
          'max_ttl' => '5m', 'max_backends' => 64, 'timeout' => '2s',
        },
        'extra' => { 'stick' => { 'new_stick_key' => 1 }, 'discover' => { 'backend' => { 'max_connections' => 250 } }, 'new_key' => ['a', 2] },
      }
    end

    it 'writes them, extra keys merged into the mappings and the rest after the known keys' do
      expect(rendered).to end_with(<<~YAML)
        services:
          puppet:
            listen: [{address: '10.0.0.10:8140', proxy_protocol: {accept_from: ['10.0.2.0/24', '2001:db8:2::/64'], required: false}, per_source: {max_connections: 20, rate: 10, burst: 40, allow: ['10.0.5.0/24'], table_size: 100000, source_prefix_v4: 32, source_prefix_v6: 64}}]
            balance: 'leastconn'
            stick: {on: ['session_id', 'ticket', 'psk', 'source'], expire: '30m', state_file: '/var/lib/crossbar/puppet.table', new_stick_key: 1}
            health: {check: 'https', path: '/status/v1/simple/server'}
            discover: {srv: '_x-puppet._tcp.example.com', resolvers: ['10.0.0.2:53'], min_ttl: '5s', max_ttl: '5m', max_backends: 64, backend: {max_connections: 250}, timeout: '2s'}
            new_key: ['a', 2]
      YAML
    end

    it 'has no backends key: its pool comes from DNS alone' do
      is_expected.not_to contain_concat__fragment('crossbar service puppet backends')
    end
  end

  context 'with a host name to discover' do
    let(:params) { { 'listen' => ['10.0.0.11:8140'], 'discover' => { 'host' => 'pool.example.com', 'port' => 8140 } } }

    it { expect(fragment('crossbar service puppetca')).to include("    discover: {host: 'pool.example.com', port: 8140}\n") }
  end

  context 'with a template for the discovered backends' do
    let(:params) do
      {
        'listen' => ['10.0.0.11:8140'],
        'discover' => {
          'srv' => '_compilers._tcp.example.com',
          'backend' => { 'max_connections' => 24, 'proxy_protocol' => 'v2', 'source' => '10.0.1.250', 'health' => { 'interval' => '5s' } },
        },
      }
    end

    it 'writes it under discover' do
      expect(fragment('crossbar service puppetca')).to include(
        "    discover: {srv: '_compilers._tcp.example.com', backend: {source: '10.0.1.250', health: {interval: '5s'}, max_connections: 24, proxy_protocol: 'v2'}}\n",
      )
    end
  end

  context 'with load feedback from the compilers\' JRuby metrics' do
    let(:params) do
      {
        'listen' => ['10.0.0.11:8140'],
        'feedback' => {
          'kind' => 'puppet', 'queue_limit' => 10, 'floor' => '10%', 'interval' => '2s', 'jrubies' => 4, 'by_pool_size' => false,
          'client_cert' => '/etc/crossbar/lb.pem', 'client_key' => '/etc/crossbar/lb.key', 'saturated_sticky' => true,
        },
      }
    end

    it 'writes it after discover, kind first' do
      expect(fragment('crossbar service puppetca')).to include(
        "    feedback: {kind: 'puppet', interval: '2s', client_cert: '/etc/crossbar/lb.pem', client_key: '/etc/crossbar/lb.key', " \
        "floor: '10%', saturated_sticky: true, jrubies: 4, queue_limit: 10, by_pool_size: false}\n",
      )
    end
  end

  context 'with an agent-check that sends a line' do
    let(:params) { { 'listen' => ['10.0.0.11:8140'], 'feedback' => { 'kind' => 'agent', 'port' => 5555, 'send' => "gitlab\tlb1\n" } } }

    it 'writes the line double-quoted, its newline and tab escaped' do
      expect(fragment('crossbar service puppetca')).to include("    feedback: {kind: 'agent', port: 5555, send: \"gitlab\\tlb1\\n\"}\n")
    end
  end

  context 'with a preset whose feedback is of the other kind' do
    let(:pre_condition) do
      "class { 'crossbar': presets => { 'polled' => { 'feedback' => { 'kind' => 'puppet', 'queue_limit' => 10 } } } }"
    end
    let(:params) { { 'listen' => ['10.0.0.11:8140'], 'preset' => 'polled', 'feedback' => { 'kind' => 'agent', 'port' => 5555 } } }

    it 'replaces it whole (the puppet keys are refused with an agent)' do
      expect(fragment('crossbar service puppetca')).to include("    feedback: {kind: 'agent', port: 5555}\n")
    end
  end

  context 'with a preset whose feedback is of the same kind' do
    let(:pre_condition) do
      "class { 'crossbar': presets => { 'polled' => { 'feedback' => { 'kind' => 'puppet', 'queue_limit' => 10 } } } }"
    end
    let(:params) { { 'listen' => ['10.0.0.11:8140'], 'preset' => 'polled', 'feedback' => { 'kind' => 'puppet', 'interval' => '2s' } } }

    it 'merges it key by key' do
      expect(fragment('crossbar service puppetca')).to include("    feedback: {kind: 'puppet', interval: '2s', queue_limit: 10}\n")
    end
  end

  context 'with a key the backend template does not take' do
    let(:params) { { 'listen' => ['10.0.0.11:8140'], 'discover' => { 'srv' => '_compilers._tcp.example.com', 'backend' => { 'weight' => 2 } } } }

    it { is_expected.to compile.and_raise_error(%r{discover.*backend.*weight}) }
  end

  context 'with extra keys on an inline backend' do
    let(:params) do
      { 'listen' => ['10.0.0.11:8140'], 'backends' => [{ 'name' => 'ca1', 'address' => 'ca1:8140', 'extra' => { 'new_key' => true } }] }
    end

    it { expect(rendered).to end_with("    backends:\n      - {name: 'ca1', address: 'ca1:8140', new_key: true}\n") }
  end

  context 'sorts before its backends' do
    let(:params) { { 'listen' => ['10.0.0.11:8140'] } }

    it { expect(catalogue.resource('Concat::Fragment', 'crossbar service puppetca')[:order]).to eq('20 puppetca 0') }
  end

  describe 'covers every key of a service in docs/configuration.md' do
    # The rows of the first table under "## Services".
    doc = File.read(File.expand_path('../../../../../docs/configuration.md', __dir__))
    table = doc[%r{^## Services\n(.*?\n)\n(?!\|)}m, 1]
    table = table[table.index("\n|")..]
    keys = table.lines.grep(%r{\A\| `}).flat_map { |row| row.split('|')[1].scan(%r{`([a-z_]+)`}).flatten }
    # Written otherwise: `default` is the parameter is_default (a Puppet keyword),
    # `backends` also comes from crossbar::backend.
    params = keys.map { |k| k == 'default' ? 'is_default' : k }

    it { expect(keys).to include('listen', 'discover', 'feedback') }

    params.each do |k|
      it "has a typed parameter #{k}" do
        source = File.read(File.expand_path('../../manifests/service.pp', __dir__))
        expect(source).to match(%r{^  [A-Z]\S.* \$#{k}( = .*)?,$})
      end
    end
  end

  describe 'refuses wrong values when the catalog is compiled' do
    {
      'no listen address' => [{ 'listen' => [] }, %r{parameter 'listen' expects size to be at least 1}],
      'a listen address without a port' => [{ 'listen' => ['10.0.0.11'] }, %r{parameter 'listen' index 0 expects a Crossbar::Listen = .* value, got String}],
      'an unknown balance' => [{ 'listen' => ['10.0.0.11:8140'], 'balance' => 'fastest' }, %r{parameter 'balance' expects an undef value or a match for Enum\['first', 'leastconn', 'roundrobin', 'source'\], got 'fastest'}],
      'an unknown stick key' => [{ 'listen' => ['10.0.0.11:8140'], 'stick' => { 'color' => 'red' } }, %r{parameter 'stick' unrecognized key 'color'}],
      'an unknown stick key kind' => [{ 'listen' => ['10.0.0.11:8140'], 'stick' => { 'on' => ['cookie'] } }, %r{parameter 'stick' entry 'on' index 0 expects a match for Enum\['psk', 'session_id', 'source', 'ticket'\], got 'cookie'}],
      'a health path without /' => [{ 'listen' => ['10.0.0.11:8140'], 'health' => { 'path' => 'status' } }, %r{parameter 'health' entry 'path' expects a match for Pattern}],
      'a backend weight of 0' => [{ 'listen' => ['10.0.0.11:8140'], 'backends' => [{ 'name' => 'a', 'address' => 'a:8140', 'weight' => 0 }] }, %r{parameter 'backends' index 0 entry 'weight' expects an Integer\[1, 256\] value, got Integer\[0, 0\]}],
      'a backend without address' => [{ 'listen' => ['10.0.0.11:8140'], 'backends' => [{ 'name' => 'a' }] }, %r{parameter 'backends' index 0 expects a value for key 'address'}],
      'an unknown preset' => [{ 'listen' => ['10.0.0.11:8140'], 'preset' => 'haproxy' }, %r{Crossbar::Service\[puppetca\]: unknown preset 'haproxy'; crossbar::presets has: puppet, puppetca, puppetdb, puppetfiles}],
      'a carriage return in a value' => [{ 'listen' => ['10.0.0.11:8140'], 'health' => { 'check' => 'https', 'expect_body' => "a\rb" } }, %r{a control character}],
      'discover with srv and host' => [{ 'listen' => ['10.0.0.11:8140'], 'discover' => { 'srv' => '_x._tcp.example.com', 'host' => 'h.example.com' } }, %r{Crossbar::Service\[puppetca\]: discover: give either srv \(an SRV name\) or host with port}],
      'discover with neither' => [{ 'listen' => ['10.0.0.11:8140'], 'discover' => { 'min_ttl' => '5s' } }, %r{discover: give either srv}],
      'discover with srv and a port' => [{ 'listen' => ['10.0.0.11:8140'], 'discover' => { 'srv' => '_x._tcp.example.com', 'port' => 8140 } }, %r{discover: an SRV record carries its own port: remove port}],
      'discover with host and no port' => [{ 'listen' => ['10.0.0.11:8140'], 'discover' => { 'host' => 'h.example.com' } }, %r{discover: host needs port}],
      'a misspelt discover key' => [{ 'listen' => ['10.0.0.11:8140'], 'discover' => { 'srv' => '_x._tcp.example.com', 'ttl' => '5s' } }, %r{parameter 'discover' unrecognized key 'ttl'}],
      'max_backends above 1024' => [{ 'listen' => ['10.0.0.11:8140'], 'discover' => { 'srv' => '_x._tcp.example.com', 'max_backends' => 2000 } }, %r{parameter 'discover' entry 'max_backends' expects an Integer\[1, 1024\] value}],
      'a resolver without a port' => [{ 'listen' => ['10.0.0.11:8140'], 'discover' => { 'srv' => '_x._tcp.example.com', 'resolvers' => ['10.0.0.2'] } }, %r{parameter 'discover' entry 'resolvers' index 0 expects a match for Crossbar::ListenAddress}],
      'proxy_protocol without accept_from' => [{ 'listen' => [{ 'address' => '10.0.0.11:8140', 'proxy_protocol' => { 'required' => true } }] }, %r{parameter 'listen' index 0 variant 1 entry 'proxy_protocol' expects a value for key 'accept_from'}],
      'accept_from with a port' => [{ 'listen' => [{ 'address' => '10.0.0.11:8140', 'proxy_protocol' => { 'accept_from' => ['10.0.2.1:8140'] } }] }, %r{entry 'proxy_protocol' entry 'accept_from' index 0 expects a match for Crossbar::Network}],
      'a per_source rate of 0' => [{ 'listen' => [{ 'address' => '10.0.0.11:8140', 'per_source' => { 'rate' => 0 } }] }, %r{entry 'per_source' entry 'rate' expects an Integer\[1, 1000000\] value, got Integer\[0, 0\]}],
      'an unknown per_source key' => [{ 'listen' => [{ 'address' => '10.0.0.11:8140', 'per_source' => { 'max_conns' => 5 } }] }, %r{entry 'per_source' unrecognized key 'max_conns'}],
      'an unknown on_marked_down' => [{ 'listen' => ['10.0.0.11:8140'], 'on_marked_down' => 'shutdown' }, %r{parameter 'on_marked_down' expects an undef value or a match for Enum\['none', 'shutdown-sessions'\], got 'shutdown'}],
      'a source with a port' => [{ 'listen' => ['10.0.0.11:8140'], 'source' => '10.0.1.250:0' }, %r{parameter 'source' expects a match for Crossbar::IpAddress = Pattern}],
      'a source host name' => [{ 'listen' => ['10.0.0.11:8140'], 'source' => 'lb1.example.com' }, %r{parameter 'source' expects a match for Crossbar::IpAddress = Pattern}],
      'a source network' => [{ 'listen' => ['10.0.0.11:8140'], 'source' => '10.0.1.0/24' }, %r{parameter 'source' expects a match for Crossbar::IpAddress = Pattern}],
      'a backend source with brackets' => [{ 'listen' => ['10.0.0.11:8140'], 'backends' => [{ 'name' => 'a', 'address' => 'a:8140', 'source' => '[2001:db8::1]' }] }, %r{parameter 'backends' index 0 entry 'source' expects a match for Crossbar::IpAddress = Pattern}],
      'an extra key a parameter sets' => [{ 'listen' => ['10.0.0.11:8140'], 'balance' => 'first', 'extra' => { 'balance' => 'leastconn' } }, %r{Crossbar::Service\[puppetca\]: extra.balance: also set by a parameter \(or the preset\); set it there}],
      'an extra key the preset sets' => [{ 'listen' => ['10.0.0.11:8140'], 'preset' => 'puppet', 'extra' => { 'stick' => { 'on' => ['source'] } } }, %r{Crossbar::Service\[puppetca\]: extra.stick.on: also set by a parameter \(or the preset\)}],
      'feedback without kind' => [{ 'listen' => ['10.0.0.11:8140'], 'feedback' => { 'interval' => '1s' } }, %r{parameter 'feedback' expects a value for key 'kind'}],
      'an agent without port' => [{ 'listen' => ['10.0.0.11:8140'], 'feedback' => { 'kind' => 'agent' } }, %r{Crossbar::Service\[puppetca\]: feedback: kind => 'agent' needs port, the agent's TCP port on each backend's host}],
      'a puppet key with an agent' => [{ 'listen' => ['10.0.0.11:8140'], 'feedback' => { 'kind' => 'agent', 'port' => 5555, 'queue_limit' => 10 } }, %r{Crossbar::Service\[puppetca\]: feedback: queue_limit: not with kind => 'agent'}],
      'an agent key with puppet' => [{ 'listen' => ['10.0.0.11:8140'], 'feedback' => { 'kind' => 'puppet', 'port' => 5555 } }, %r{Crossbar::Service\[puppetca\]: feedback: port: not with kind => 'puppet'}],
      'a floor without its %' => [{ 'listen' => ['10.0.0.11:8140'], 'feedback' => { 'kind' => 'puppet', 'floor' => '5' } }, %r{parameter 'feedback' entry 'floor' expects a match for Crossbar::Percent}],
      'a floor of 0%' => [{ 'listen' => ['10.0.0.11:8140'], 'feedback' => { 'kind' => 'puppet', 'floor' => '0%' } }, %r{entry 'floor' expects a match for Crossbar::Percent}],
      'an unknown feedback key' => [{ 'listen' => ['10.0.0.11:8140'], 'feedback' => { 'kind' => 'puppet', 'queue' => 10 } }, %r{parameter 'feedback' unrecognized key 'queue'}],
      'an unknown feedback kind' => [{ 'listen' => ['10.0.0.11:8140'], 'feedback' => { 'kind' => 'haproxy' } }, %r{parameter 'feedback' entry 'kind' expects a match for Enum\['agent', 'puppet'\], got 'haproxy'}],
      'an interval without unit' => [{ 'listen' => ['10.0.0.11:8140'], 'feedback' => { 'kind' => 'puppet', 'interval' => '1' } }, %r{entry 'interval' expects a match for Crossbar::Duration}],
      'a control character in send' => [{ 'listen' => ['10.0.0.11:8140'], 'feedback' => { 'kind' => 'agent', 'port' => 1, 'send' => "a\rb" } }, %r{entry 'send' expects a match for Pattern}],
      'an extra key that is no YAML word' => [{ 'listen' => ['10.0.0.11:8140'], 'extra' => { 'Bad Key' => 1 } }, %r{parameter 'extra' key of entry 'Bad Key' expects a match for Pattern}],
    }.each do |what, (params, message)|
      context "with #{what}" do
        let(:params) { params }

        it { is_expected.to compile.and_raise_error(message) }
      end
    end

    context 'with a title that is no service name' do
      let(:title) { 'puppet.example.com' }
      let(:params) { { 'listen' => ['10.0.0.10:8140'] } }

      it { is_expected.to compile.and_raise_error(%r{Crossbar::Service\[puppet.example.com\]: the title is the service's name}) }
    end

    context 'without class crossbar' do
      let(:pre_condition) { '' }
      let(:params) { { 'listen' => ['10.0.0.11:8140'] } }

      it { is_expected.to compile.and_raise_error(%r{declare class crossbar first}) }
    end
  end
end
