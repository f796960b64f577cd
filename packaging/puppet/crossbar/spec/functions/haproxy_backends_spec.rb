require 'spec_helper'

# Exported haproxy::balancermember resources as PuppetDB returns them (only the
# parameters the exporting node set) -> crossbar::backend titles and parameters.
describe 'crossbar::haproxy_backends' do
  def member(certname, params, title = certname)
    { 'certname' => certname, 'title' => title, 'parameters' => { 'listening_service' => 'puppet00' }.merge(params) }
  end

  it 'maps the README example of puppetlabs-haproxy: one server per member' do
    is_expected.to run.with_params(
      [member('compile01.example.com', { 'ports' => '8140', 'server_names' => 'compile01', 'ipaddresses' => '10.0.1.1', 'options' => 'check' })],
      'puppet',
    ).and_return('puppet/compile01' => { 'address' => '10.0.1.1:8140' })
  end

  it 'names a member without server_names after its certname and dials the certname without ipaddresses' do
    is_expected.to run.with_params([member('compile02.dc1.example.com', { 'ports' => 8140 })], 'puppet')
                      .and_return('puppet/compile02.dc1.example.com' => { 'address' => 'compile02.dc1.example.com:8140' })
  end

  it 'maps backup, maxconn, weight, disabled and send-proxy-v2' do
    is_expected.to run.with_params(
      [
        member('c1', { 'ports' => '8140', 'ipaddresses' => '10.0.1.1', 'options' => ['check', 'backup', 'maxconn 250', 'send-proxy-v2'] }),
        member('c2', { 'ports' => '8140', 'ipaddresses' => '10.0.1.2', 'weight' => '3', 'options' => 'check disabled' }),
        member('c3', { 'ports' => '8140', 'ipaddresses' => '2001:db8::3', 'options' => 'check weight 0 inter 2s rise 2 fall 3' }),
      ],
      'puppet',
    ).and_return(
      'puppet/c1' => { 'address' => '10.0.1.1:8140', 'backup' => true, 'max_connections' => 250, 'proxy_protocol' => 'v2' },
      'puppet/c2' => { 'address' => '10.0.1.2:8140', 'weight' => 3, 'disabled' => true },
      'puppet/c3' => { 'address' => '[2001:db8::3]:8140', 'disabled' => true },
    )
  end

  it 'maps source ADDRESS to the backend\'s source and leaves out on-marked-down, a service setting in crossbar' do
    is_expected.to run.with_params(
      [
        member('c1', { 'ports' => '8140', 'ipaddresses' => '10.0.1.1', 'options' => ['check', 'source 10.0.1.250', 'on-marked-down shutdown-sessions'] }),
        member('c2', { 'ports' => '8140', 'ipaddresses' => '10.0.1.2', 'options' => 'check source 2001:db8:1::250 maxconn 100' }),
      ],
      'puppet',
    ).and_return(
      'puppet/c1' => { 'address' => '10.0.1.1:8140', 'source' => '10.0.1.250' },
      'puppet/c2' => { 'address' => '10.0.1.2:8140', 'max_connections' => 100, 'source' => '2001:db8:1::250' },
    )
  end

  it 'leaves out a source crossbar cannot take (a port: crossbar picks it per connection)' do
    is_expected.to run.with_params([member('c1', { 'ports' => '8140', 'options' => ['source 10.0.1.250:40000 usesrc clientip'] })], 'puppet')
                      .and_return('puppet/c1' => { 'address' => 'c1:8140' })
  end

  it 'says where crossbar sets on-marked-down, and why it left a source out' do
    logs = [] # earlier examples' warnings may arrive here too (Puppet queues them until a destination exists)
    Puppet::Util::Log.with_destination(Puppet::Test::LogCollector.new(logs)) do
      subject.execute([member('c7', { 'ports' => '8140', 'options' => ['check', 'on-marked-down shutdown-sessions', 'source 10.0.1.250:40000'] })], 'puppet')
    end
    expect(logs.select { |l| l.level == :warning }.map(&:message).grep(%r{ of c7: })).to contain_exactly(
      "crossbar::balancermembers: Haproxy::Balancermember[c7] of c7: HAProxy option left out: source 10.0.1.250:40000 (crossbar's source is an IP address alone)",
      "crossbar::balancermembers: Haproxy::Balancermember[c7] of c7: HAProxy option left out: on-marked-down shutdown-sessions " \
      "(crossbar sets it per service: crossbar::service { 'puppet': on_marked_down => 'shutdown-sessions' })",
    )
  end

  def warnings_of(certname, options)
    logs = [] # earlier examples' warnings may arrive here too (Puppet queues them until a destination exists)
    Puppet::Util::Log.with_destination(Puppet::Test::LogCollector.new(logs)) do
      subject.execute([member(certname, { 'ports' => '8140', 'options' => options })], 'puppet')
    end
    logs.select { |l| l.level == :warning }.map(&:message).grep(%r{ of #{Regexp.escape(certname)}: })
  end

  it 'writes the service\'s health for inter, rise and fall (a bare inter in milliseconds), and names what it leaves out' do
    expect(warnings_of('c8', ['check inter 5000 rise 3 fall 2', 'port 8141 fastinter 1s'])).to contain_exactly(
      "crossbar::balancermembers: Haproxy::Balancermember[c8] of c8: HAProxy options inter 5000 rise 3 fall 2 are the service's health check " \
      "in crossbar, which checks every backend alike: crossbar::service { 'puppet': health => {'interval' => '5000ms', 'rise' => 3, 'fall' => 2} }",
      "crossbar::balancermembers: Haproxy::Balancermember[c8] of c8: HAProxy options left out: fastinter 1s port 8141 " \
      '(crossbar checks and asks each backend at its own address and port, at one interval)',
    )
  end

  it 'points agent-check at feedback of kind agent, with its port, quoted send and interval' do
    expect(warnings_of('c9', ['check', 'agent-check agent-port 5555 agent-send "gitlab lb1\\n" agent-inter 2s'])).to contain_exactly(
      "crossbar::balancermembers: Haproxy::Balancermember[c9] of c9: HAProxy option agent-check is the service's load feedback in crossbar, " \
      "which asks every backend's agent: crossbar::service { 'puppet': feedback => {'kind' => 'agent', 'port' => 5555, " \
      "'send' => \"gitlab lb1\\n\", 'interval' => '2s'} }",
    )
  end

  it 'says an agent-check without agent-port needs the port' do
    expect(warnings_of('c10', 'agent-check')).to contain_exactly(
      "crossbar::balancermembers: Haproxy::Balancermember[c10] of c10: HAProxy option agent-check is the service's load feedback in crossbar, " \
      "which asks every backend's agent: crossbar::service { 'puppet': feedback => {'kind' => 'agent'} } (add port: the agent's TCP port)",
    )
  end

  it 'points slowstart at the service\'s slow_start' do
    expect(warnings_of('c11', 'check slowstart 60s maxconn 10')).to contain_exactly(
      "crossbar::balancermembers: Haproxy::Balancermember[c11] of c11: HAProxy option slowstart 60s is the service's slow_start in crossbar: " \
      "crossbar::service { 'puppet': slow_start => '60s' }",
    )
  end

  it 'keeps the backend itself as before: the service options only warn' do
    is_expected.to run.with_params(
      [member('c12', { 'ports' => '8140', 'ipaddresses' => '10.0.1.12', 'options' => 'check inter 2s agent-check agent-port 5555 slowstart 1m maxconn 50' })],
      'puppet',
    ).and_return('puppet/c12' => { 'address' => '10.0.1.12:8140', 'max_connections' => 50 })
  end

  it 'makes one backend per address (lockstep with server_names) and port, as haproxy writes one server line each' do
    is_expected.to run.with_params(
      [member('pe1', { 'ports' => '8140,8142', 'server_names' => ['a', 'b'], 'ipaddresses' => ['10.0.1.1', '10.0.1.2'] })],
      'pe',
    ).and_return(
      'pe/a-8140' => { 'address' => '10.0.1.1:8140' }, 'pe/a-8142' => { 'address' => '10.0.1.1:8142' },
      'pe/b-8140' => { 'address' => '10.0.1.2:8140' }, 'pe/b-8142' => { 'address' => '10.0.1.2:8142' },
    )
  end

  it 'refuses a member without ports, naming it' do
    is_expected.to run.with_params([member('c1', {}, 'c1-puppet')], 'puppet')
                      .and_raise_error(%r{Haproxy::Balancermember\[c1-puppet\] of c1 has no ports})
  end

  it 'refuses a server name crossbar cannot use, naming it' do
    is_expected.to run.with_params([member('c1', { 'ports' => '8140', 'server_names' => 'c 1' })], 'puppet')
                      .and_raise_error(%r{'c 1' is no backend name})
  end
end
