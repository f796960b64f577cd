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
      expect(fragment('crossbar service puppetca')).to eq(<<~YAML)
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
      expect(fragment('crossbar service puppet_sni')).to eq(<<~YAML)
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

  context 'with a quote in a value' do
    let(:params) { { 'listen' => ['10.0.0.11:8140'], 'health' => { 'check' => 'https', 'expect_body' => "it's up" } } }

    it 'doubles it (YAML single quotes) so no value can change the structure' do
      expect(fragment('crossbar service puppetca')).to include("health: {check: 'https', expect_body: 'it''s up'}")
    end
  end

  context 'sorts before its backends' do
    let(:params) { { 'listen' => ['10.0.0.11:8140'] } }

    it { expect(catalogue.resource('Concat::Fragment', 'crossbar service puppetca')[:order]).to eq('20 puppetca 0') }
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
      'a newline in a value' => [{ 'listen' => ['10.0.0.11:8140'], 'health' => { 'check' => 'https', 'expect_body' => "a\nb" } }, %r{a control character}],
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
