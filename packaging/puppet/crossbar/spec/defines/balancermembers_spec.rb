require 'spec_helper'

# crossbar::balancermembers asks PuppetDB for the exported haproxy::balancermember
# resources; here a puppetdb_query of the site manifest stands in for PuppetDB (the
# E2E test, tests/puppet/run.sh, asks a real one) and answers only the query a
# collector `Haproxy::Balancermember <<| listening_service == 'puppet00' and
# tag == 'site1' |>>` would make.
describe 'crossbar::balancermembers' do
  let(:pre_condition) do
    <<~PP
      function puppetdb_query($query) {
        $want = ['from', 'resources', ['extract', ['certname', 'title', 'parameters'],
          ['and', ['=', 'type', 'Haproxy::Balancermember'], ['=', 'exported', true],
            ['=', ['parameter', 'listening_service'], 'puppet00'], ['=', 'tag', 'site1']]]]
        if $query != $want { fail("unexpected query ${query}") }
        [
          { 'certname' => 'compile01.dc1.example.com', 'title' => 'compile01.dc1.example.com',
            'parameters' => { 'listening_service' => 'puppet00', 'ports' => '8140', 'ipaddresses' => '10.0.1.1',
                              'server_names' => 'compile01.dc1.example.com', 'options' => ['check', 'maxconn 250'] } },
          { 'certname' => 'compile02.dc1.example.com', 'title' => 'compile02.dc1.example.com',
            'parameters' => { 'listening_service' => 'puppet00', 'ports' => '8140', 'options' => 'check backup' } },
        ]
      }
      include crossbar
      crossbar::service { 'puppet': listen => ['10.0.0.10:8140'] }
    PP
  end
  let(:title) { 'puppet00' }
  let(:params) { { 'service' => 'puppet', 'collect_tag' => 'Site1' } }

  it 'declares a crossbar::backend per exported member, in the service crossbar::service names' do
    is_expected.to contain_crossbar__backend('puppet/compile01.dc1.example.com').with(
      'address' => '10.0.1.1:8140', 'max_connections' => 250,
    )
    is_expected.to contain_crossbar__backend('puppet/compile02.dc1.example.com').with(
      'address' => 'compile02.dc1.example.com:8140', 'backup' => true,
    )
    expect(rendered).to end_with(<<~YAML)
      \  puppet:
          listen: ['10.0.0.10:8140']
          backends:
            - {name: 'compile01.dc1.example.com', address: '10.0.1.1:8140', max_connections: 250}
            - {name: 'compile02.dc1.example.com', address: 'compile02.dc1.example.com:8140', backup: true}
    YAML
  end

  context 'without class crossbar' do
    let(:pre_condition) { '' }

    it { is_expected.to compile.and_raise_error(%r{Crossbar::Balancermembers\[puppet00\]: declare class crossbar first}) }
  end
end
