require 'spec_helper'

describe 'crossbar::backend' do
  let(:pre_condition) do
    <<~PP
      include crossbar
      crossbar::service { 'puppet': listen => ['10.0.0.10:8140'] }
      crossbar::service { 'puppet-0': listen => ['10.0.0.20:8140'], backends => [{ name => 'z', address => 'z:8140' }] }
    PP
  end

  context 'titled SERVICE/NAME, every option' do
    let(:title) { 'puppet/compile_1' }
    let(:params) do
      {
        'address' => 'compile1.example.com:8140',
        'weight' => 2,
        'backup' => false,
        'max_connections' => 500,
        'proxy_protocol' => 'v1',
        'health' => { 'interval' => '5s' },
        'disabled' => true,
        'source' => '10.0.1.250',
        'order' => 10,
      }
    end

    it 'is one line of the service\'s backends' do
      expect(fragment('crossbar backend puppet/compile_1')).to eq(
        "      - {name: 'compile_1', address: 'compile1.example.com:8140', source: '10.0.1.250', health: {interval: '5s'}, " \
        "max_connections: 500, weight: 2, backup: false, proxy_protocol: 'v1', disabled: true}\n",
      )
    end

    it 'sorts after its service and before the next service, whatever the names' do
      order = catalogue.resource('Concat::Fragment', 'crossbar backend puppet/compile_1')[:order]
      expect(order).to eq('20 puppet 3 010 compile=1')
      key = catalogue.resource('Concat::Fragment', 'crossbar service puppet backends')[:order]
      expect(key).to eq('20 puppet 1')
      inline = catalogue.resource('Concat::Fragment', 'crossbar service puppet-0 backend 0')[:order]
      expect(inline).to eq('20 puppet-0 2 0000')
      expect([inline, order, '20 puppet-0 0', '20 puppet 0', key].sort).to eq(['20 puppet 0', key, order, '20 puppet-0 0', inline])
    end

    it 'follows its service in the assembled file' do
      expect(rendered).to include(<<~YAML)
        \  puppet:
            listen: ['10.0.0.10:8140']
            backends:
              - {name: 'compile_1', address: 'compile1.example.com:8140', source: '10.0.1.250', health: {interval: '5s'}, max_connections: 500, weight: 2, backup: false, proxy_protocol: 'v1', disabled: true}
          puppet-0:
            listen: ['10.0.0.20:8140']
            backends:
              - {name: 'z', address: 'z:8140'}
      YAML
    end
  end

  context 'titled SERVICE/CERTNAME' do
    let(:title) { 'puppet/compile01.dc1.example.com' }
    let(:params) { { 'address' => 'compile01.dc1.example.com:8140', 'extra' => { 'new_key' => 'x' } } }

    it 'is named after the certname, extra keys after the known ones' do
      expect(fragment('crossbar backend puppet/compile01.dc1.example.com')).to eq(
        "      - {name: 'compile01.dc1.example.com', address: 'compile01.dc1.example.com:8140', new_key: 'x'}\n",
      )
    end

    it 'writes the backends key once' do
      expect(rendered.scan('backends:').size).to eq(2) # puppet's and puppet-0's
    end
  end

  context 'of a service whose other backends come from DNS' do
    let(:pre_condition) do
      <<~PP
        include crossbar
        crossbar::service { 'puppet': listen => ['10.0.0.10:8140'], discover => { 'srv' => '_x-puppet._tcp.example.com' } }
      PP
    end
    let(:title) { 'puppet/compile2.lab.test-8140' }
    let(:params) { { 'address' => '10.0.1.9:8140' } }

    it 'takes the place of the discovered backend of that name' do
      expect(rendered).to end_with(<<~YAML)
        \  puppet:
            listen: ['10.0.0.10:8140']
            discover: {srv: '_x-puppet._tcp.example.com'}
            backends:
              - {name: 'compile2.lab.test-8140', address: '10.0.1.9:8140'}
      YAML
    end
  end

  context 'with service and backend_name given, any title' do
    let(:title) { 'compile2.example.com puppet' }
    let(:params) { { 'service' => 'puppet', 'backend_name' => 'compile2', 'address' => '10.0.1.2:8140' } }

    it { expect(fragment('crossbar backend puppet/compile2')).to eq("      - {name: 'compile2', address: '10.0.1.2:8140'}\n") }
  end

  describe 'refuses wrong values when the catalog is compiled' do
    let(:title) { 'puppet/compile1' }

    {
      'an address without a port' => [{ 'address' => 'compile1.example.com' }, %r{parameter 'address' expects a match for Crossbar::BackendAddress}],
      'a weight above 256' => [{ 'address' => 'c:8140', 'weight' => 257 }, %r{parameter 'weight' expects a value of type Undef or Integer\[1, 256\], got Integer\[257, 257\]}],
      'an unknown PROXY version' => [{ 'address' => 'c:8140', 'proxy_protocol' => 'v3' }, %r{parameter 'proxy_protocol' expects an undef value or a match for Enum\['v1', 'v2'\], got 'v3'}],
      'a name starting with a dot' => [{ 'address' => 'c:8140', 'backend_name' => '.compile1' }, %r{parameter 'backend_name' expects a match for Crossbar::BackendName}],
      'a name with a space' => [{ 'address' => 'c:8140', 'backend_name' => 'compile 1' }, %r{parameter 'backend_name' expects a match for Crossbar::BackendName}],
      'a source with a port' => [{ 'address' => 'c:8140', 'source' => '10.0.1.250:40000' }, %r{parameter 'source' expects a match for Crossbar::IpAddress = Pattern}],
      'an IPv6 source in brackets' => [{ 'address' => 'c:8140', 'source' => '[2001:db8::250]' }, %r{parameter 'source' expects a match for Crossbar::IpAddress = Pattern}],
      'an extra key a parameter sets' => [{ 'address' => 'c:8140', 'weight' => 2, 'extra' => { 'weight' => 3 } }, %r{Crossbar::Backend\[puppet/compile1\]: extra.weight: also set by a parameter}],
    }.each do |what, (params, message)|
      context "with #{what}" do
        let(:params) { params }

        it { is_expected.to compile.and_raise_error(message) }
      end
    end

    context 'with a name another backend of the service has' do
      let(:pre_condition) do
        <<~PP
          include crossbar
          crossbar::service { 'puppet': listen => ['10.0.0.10:8140'] }
          crossbar::backend { 'compile1 old': service => 'puppet', backend_name => 'compile1', address => 'old:8140' }
        PP
      end
      let(:params) { { 'address' => 'c:8140' } }

      it 'names the fix: a name per node, its certname' do
        is_expected.to compile.and_raise_error(
          %r{Crossbar::Backend\[puppet/compile1\]: service 'puppet' already has a backend named 'compile1' \(from another crossbar::backend\); each needs its own name: name each after its node's certname \(title "puppet/\$\{trusted\['certname'\]\}"\)},
        )
      end
    end

    context 'for a service this node does not declare' do
      let(:title) { 'puppetdb/pdb1' }
      let(:params) { { 'address' => 'pdb1:8081' } }

      it { is_expected.to compile.and_raise_error(%r{Crossbar::Backend\[puppetdb/pdb1\]: no crossbar::service 'puppetdb' on this node}) }
    end
  end
end
