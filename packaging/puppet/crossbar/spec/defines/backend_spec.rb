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
        'order' => 10,
      }
    end

    it 'is one line of the service\'s backends' do
      expect(fragment('crossbar backend puppet/compile_1')).to eq(
        "      - {name: 'compile_1', address: 'compile1.example.com:8140', health: {interval: '5s'}, " \
        "max_connections: 500, weight: 2, backup: false, proxy_protocol: 'v1', disabled: true}\n",
      )
    end

    it 'sorts after its service and before the next service, whatever the names' do
      order = catalogue.resource('Concat::Fragment', 'crossbar backend puppet/compile_1')[:order]
      expect(order).to eq('20 puppet 1 010 compile=1')
      expect([order, '20 puppet 0', '20 puppet-0 0'].sort).to eq(['20 puppet 0', order, '20 puppet-0 0'])
    end

    it 'follows its service in the assembled file' do
      expect(rendered).to include(<<~YAML)
        \  puppet:
            listen: ['10.0.0.10:8140']
            backends:
              - {name: 'compile_1', address: 'compile1.example.com:8140', health: {interval: '5s'}, max_connections: 500, weight: 2, backup: false, proxy_protocol: 'v1', disabled: true}
          puppet-0:
            listen: ['10.0.0.20:8140']
            backends:
              - {name: 'z', address: 'z:8140'}
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
      'a name with a dot' => [{ 'address' => 'c:8140', 'backend_name' => 'compile1.example.com' }, %r{parameter 'backend_name' expects a match for Crossbar::Name}],
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

      it { is_expected.to compile.and_raise_error(%r{Crossbar::Backend\[puppet/compile1\]: service 'puppet' has another backend named 'compile1'; set backend_name}) }
    end

    context 'for a service this node does not declare' do
      let(:title) { 'puppetdb/pdb1' }
      let(:params) { { 'address' => 'pdb1:8081' } }

      it { is_expected.to compile.and_raise_error(%r{Crossbar::Backend\[puppetdb/pdb1\]: no crossbar::service 'puppetdb' on this node}) }
    end
  end
end
