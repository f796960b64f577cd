require 'spec_helper'

describe 'crossbar' do
  let(:compilers) do
    {
      'puppet' => {
        'preset' => 'puppet',
        'listen' => ['10.0.0.10:8140'],
        'names' => ['puppet.example.com'],
        'backends' => [
          { 'name' => 'compile1', 'address' => 'compile1.example.com:8140', 'max_connections' => 250 },
        ],
      },
    }
  end

  context 'with one service' do
    let(:params) { { 'services' => compilers } }

    it { is_expected.to compile.with_all_deps }
    it { is_expected.to contain_package('crossbar').with_ensure('installed') }

    it 'checks every new file with crossbar check (files it names included) before it is put in place' do
      is_expected.to contain_concat('/etc/crossbar/crossbar.yaml').with(
        'validate_cmd' => '/usr/bin/crossbar check -c %',
        'owner' => 'root', 'group' => 'crossbar', 'mode' => '0640',
      )
    end

    it 'reloads through the unit (its ExecReload checks again) and never restarts' do
      is_expected.to contain_service('crossbar').with(
        'ensure' => 'running', 'enable' => true, 'restart' => 'systemctl reload crossbar',
      )
    end

    it 'makes the state directory after the package (its user) and before the first check' do
      is_expected.to contain_file('/var/lib/crossbar').with(
        'ensure' => 'directory', 'owner' => 'crossbar', 'group' => 'crossbar', 'mode' => '0750',
      ).that_requires('Package[crossbar]')
    end

    it 'installs, then writes the file, then reloads on a change' do
      is_expected.to contain_class('crossbar::install').that_comes_before('Class[crossbar::config]')
      is_expected.to contain_class('crossbar::config').that_notifies('Class[crossbar::daemon]')
    end

    it 'renders the preset merged with the service' do
      expect(rendered).to eq(<<~YAML)
        # crossbar configuration, managed by Puppet (module crossbar): local changes are
        # overwritten. Each version was checked with `crossbar check` before it was put here.
        # Keys: docs/configuration.md (/usr/share/doc/crossbar/configuration.md).
        services:
          puppet:
            listen: ['10.0.0.10:8140']
            names: ['puppet.example.com']
            balance: 'leastconn'
            stick: {on: ['session_id', 'ticket', 'psk', 'source'], expire: '30m', state_file: '/var/lib/crossbar/puppet.table'}
            health: {check: 'https', path: '/status/v1/simple/server'}
            backends:
              - {name: 'compile1', address: 'compile1.example.com:8140', max_connections: 250}
      YAML
    end
  end

  context 'with top-level settings' do
    let(:params) do
      {
        'services' => compilers,
        'workers' => 4,
        'confirm_budget' => 50,
        'state_file' => '/var/lib/crossbar/crossbar.state',
        'admin' => { 'listen' => '127.0.0.1:9140', 'allowed_hosts' => ['lb1.example.com'], 'healthz_needs_backends' => true },
        'defaults' => {
          'retries' => 1,
          'health' => { 'interval' => '2s', 'check' => 'https', 'ca_file' => '/etc/crossbar/ca.pem' },
          'timeouts' => { 'idle' => '1h 30m', 'client_hello' => '5s' },
          'keepalive' => { 'enabled' => false },
        },
      }
    end

    it 'writes them in the documented key order' do
      expect(fragment('crossbar header')).to end_with(<<~YAML)
        workers: 4
        confirm_budget: 50
        admin: {listen: '127.0.0.1:9140', allowed_hosts: ['lb1.example.com'], healthz_needs_backends: true}
        defaults:
          timeouts: {client_hello: '5s', idle: '1h 30m'}
          keepalive: {enabled: false}
          health: {check: 'https', interval: '2s', ca_file: '/etc/crossbar/ca.pem'}
          retries: 1
        state_file: '/var/lib/crossbar/crossbar.state'
        services:
      YAML
    end
  end

  context 'with extra top-level keys' do
    let(:params) do
      {
        'services' => compilers,
        'workers' => 2,
        'defaults' => { 'retries' => 1 },
        'extra' => { 'new_section' => { '10.0.0.10:8140' => { 'backlog' => 512 } }, 'defaults' => { 'new_default' => '5s' } },
      }
    end

    it 'adds them: new keys after the known ones, mappings key by key' do
      expect(fragment('crossbar header')).to end_with(<<~YAML)
        workers: 2
        defaults:
          retries: 1
          new_default: '5s'
        new_section: {'10.0.0.10:8140': {backlog: 512}}
        services:
      YAML
    end
  end

  context 'with the settings of a shared listen address written once (listeners)' do
    let(:params) do
      {
        'listeners' => {
          '10.0.0.10:8140' => {
            'backlog' => 512, 'freebind' => true, 'max_connections' => 5000,
            'proxy_protocol' => { 'accept_from' => ['10.0.2.0/24'] }, 'per_source' => { 'max_connections' => 20 },
          },
          '10.0.0.99:8140' => { 'freebind' => true },
        },
        'services' => {
          'puppetca' => {
            'listen' => ['10.0.0.10:8140'], 'server_names' => ['puppetca.example.com'],
            'backends' => [{ 'name' => 'ca1', 'address' => 'ca1:8140' }]
          },
          'puppet' => {
            'listen' => [{ 'address' => '10.0.0.10:8140', 'freebind' => true }, '10.0.0.11:8140'],
            'server_names' => ['puppet.example.com'], 'backends' => [{ 'name' => 'c1', 'address' => 'c1:8140' }]
          },
        },
      }
    end

    it 'gives them to each service that lists the address, bare or long, and to no other address' do
      settings = "{address: '10.0.0.10:8140', backlog: 512, freebind: true, max_connections: 5000, " \
                 "proxy_protocol: {accept_from: ['10.0.2.0/24']}, per_source: {max_connections: 20}}"
      expect(fragment('crossbar service puppetca')).to include("    listen: [#{settings}]\n")
      expect(fragment('crossbar service puppet')).to include("    listen: [#{settings}, '10.0.0.11:8140']\n")
      expect(rendered).not_to include('10.0.0.99')
    end
  end

  context 'with an empty entry in listeners' do
    let(:params) { { 'services' => compilers, 'listeners' => { '10.0.0.10:8140' => {} } } }

    it { expect(fragment('crossbar service puppet')).to include("    listen: ['10.0.0.10:8140']\n") }
  end

  context 'with presets that close a dead backend\'s connections from a source address' do
    let(:params) do
      {
        'presets' => { 'pinned' => { 'balance' => 'first', 'on_marked_down' => 'shutdown-sessions', 'source' => '2001:db8:1::250' } },
        'services' => { 'puppet' => { 'preset' => 'pinned', 'listen' => ['10.0.0.10:8140'], 'source' => '10.0.1.250' } },
      }
    end

    it 'merges them like any preset setting, the service\'s own winning' do
      expect(fragment('crossbar service puppet')).to eq(<<~YAML)
        \  puppet:
            listen: ['10.0.0.10:8140']
            on_marked_down: 'shutdown-sessions'
            source: '10.0.1.250'
            balance: 'first'
      YAML
    end
  end

  context 'with the Puppet CA copied from the balancer\'s own agent (ca_source)' do
    let(:params) { { 'services' => compilers, 'ca_source' => '/var/lib/puppet/ssl/certs/ca.pem' } }

    it 'writes ca_file after the package made /etc/crossbar and before the check, readable by crossbar' do
      is_expected.to contain_file('/etc/crossbar/puppet-ca.pem').with(
        'source' => '/var/lib/puppet/ssl/certs/ca.pem', 'owner' => 'root', 'group' => 'crossbar', 'mode' => '0644',
      ).that_requires('Class[crossbar::install]').that_comes_before('Class[crossbar::config]').that_notifies('Class[crossbar::daemon]')
    end
  end

  context 'with the Puppet CA as text (ca_content) elsewhere' do
    let(:params) { { 'services' => compilers, 'ca_content' => "-----BEGIN CERTIFICATE-----\n", 'ca_file' => '/etc/crossbar/ca.pem' } }

    it { is_expected.to contain_file('/etc/crossbar/ca.pem').with_content("-----BEGIN CERTIFICATE-----\n") }
  end

  context 'with a client key as Hiera data (files)' do
    let(:params) do
      { 'services' => compilers, 'files' => { '/etc/crossbar/client.key' => { 'content' => sensitive('KEY') } } }
    end

    it 'is not readable by others and ordered like the CA' do
      is_expected.to contain_file('/etc/crossbar/client.key').with(
        'mode' => '0640', 'group' => 'crossbar', 'show_diff' => false, 'content' => sensitive('KEY'),
      ).that_requires('Class[crossbar::install]').that_comes_before('Concat[/etc/crossbar/crossbar.yaml]')
    end
  end

  context 'with an admin token' do
    let(:params) { { 'services' => compilers, 'admin_token' => sensitive('s3cret') } }

    it 'writes the token file before the configuration, not readable by others, and names it' do
      is_expected.to contain_file('/etc/crossbar/admin.token').with(
        'owner' => 'root', 'group' => 'crossbar', 'mode' => '0640', 'show_diff' => false,
        'content' => sensitive('s3cret'),
      ).that_comes_before('Concat[/etc/crossbar/crossbar.yaml]')
      expect(fragment('crossbar header')).to include("admin: {token_file: '/etc/crossbar/admin.token'}\n")
    end
  end

  context 'with check_files => false' do
    let(:params) { { 'services' => compilers, 'check_files' => false } }

    it { is_expected.to contain_concat('/etc/crossbar/crossbar.yaml').with_validate_cmd('/usr/bin/crossbar check --config-only -c %') }
  end

  context 'with the admin endpoint off' do
    let(:params) { { 'services' => compilers, 'admin' => { 'enabled' => false } } }

    it 'reloads with SIGHUP (crossbar reload -c needs the endpoint)' do
      is_expected.to contain_service('crossbar').with_restart('systemctl kill --signal=HUP crossbar')
    end
  end

  context 'with a .deb as package_source' do
    let(:params) { { 'services' => compilers, 'package_source' => '/tmp/crossbar_0.1.0_amd64.deb' } }

    it { is_expected.to contain_package('crossbar').with(provider: 'dpkg', source: '/tmp/crossbar_0.1.0_amd64.deb') }
  end

  context 'with nothing managed but the file' do
    let(:params) { { 'services' => compilers, 'manage_package' => false, 'manage_service' => false } }

    it { is_expected.not_to contain_package('crossbar') }
    it { is_expected.not_to contain_file('/var/lib/crossbar') }
    it { is_expected.not_to contain_service('crossbar') }
    it { is_expected.to contain_concat('/etc/crossbar/crossbar.yaml') }
  end

  context 'with backends given as class data (Hiera)' do
    let(:params) do
      {
        'services' => compilers,
        'backends' => { 'puppet/compile2.example.com' => { 'address' => '10.0.1.2:8140', 'weight' => 3 } },
      }
    end

    it { is_expected.to contain_crossbar__backend('puppet/compile2.example.com') }
    it { expect(rendered).to include("      - {name: 'compile2.example.com', address: '10.0.1.2:8140', weight: 3}\n") }
  end

  context 'collecting exported backends by tag' do
    let(:params) { { 'services' => compilers, 'collect_tag' => 'crossbar-site1' } }

    # Without storeconfigs the collector is empty; the E2E test collects from PuppetDB.
    it { is_expected.to compile.with_all_deps }
  end

  describe 'refuses wrong values when the catalog is compiled' do
    {
      'a duration without a unit' => [{ 'defaults' => { 'timeouts' => { 'idle' => '30' } } }, %r{entry 'idle' expects a match for Crossbar::Duration}],
      'an unknown health check' => [{ 'defaults' => { 'health' => { 'check' => 'http' } } }, %r{entry 'check' expects a match for Enum\['https', 'none', 'tcp', 'tls-hello'\], got 'http'}],
      'a misspelt key' => [{ 'defaults' => { 'retires' => 2 } }, %r{parameter 'defaults' unrecognized key 'retires'}],
      'retries out of range' => [{ 'defaults' => { 'retries' => 11 } }, %r{entry 'retries' expects an Integer\[0, 10\] value, got Integer\[11, 11\]}],
      'the retired kernel relay' => [{ 'defaults' => { 'relay' => 'kernel' } }, %r{entry 'relay' expects a match for Enum\['auto', 'splice-auto'\], got 'kernel'}],
      'a host name as admin listen address' => [{ 'admin' => { 'listen' => 'localhost:9140' } }, %r{entry 'listen' expects a match for Crossbar::ListenAddress}],
      'workers 0' => [{ 'workers' => 0 }, %r{parameter 'workers' expects a value of type Undef or Integer\[1, 1024\], got Integer\[0, 0\]}],
      'both ca_source and ca_content' => [{ 'ca_source' => '/a', 'ca_content' => 'b' }, %r{Crossbar::File\[/etc/crossbar/puppet-ca.pem\]: give either source or content}],
      'a file with neither source nor content' => [{ 'files' => { '/etc/crossbar/x.pem' => {} } }, %r{Crossbar::File\[/etc/crossbar/x.pem\]: give either source or content}],
      'an extra key a parameter sets' => [{ 'workers' => 2, 'extra' => { 'workers' => 3 } }, %r{Class\[Crossbar\]: extra.workers: also set by a parameter}],
      'extra services' => [{ 'extra' => { 'services' => {} } }, %r{Class\[Crossbar\]: extra.services: services come from crossbar::service}],
      'a listener without a port' => [{ 'listeners' => { '10.0.0.10' => { 'freebind' => true } } }, %r{parameter 'listeners' key of entry '10.0.0.10' expects a match for Crossbar::ListenAddress}],
      'an address in a listener\'s settings' => [{ 'listeners' => { '10.0.0.10:8140' => { 'address' => '10.0.0.10:8140' } } }, %r{parameter 'listeners' entry '10.0.0.10:8140' unrecognized key 'address'}],
      'a misspelt listener setting' => [{ 'listeners' => { '10.0.0.10:8140' => { 'maxconn' => 20 } } }, %r{parameter 'listeners' entry '10.0.0.10:8140' unrecognized key 'maxconn'}],
      'a preset with an unknown on_marked_down' => [{ 'presets' => { 'p' => { 'on_marked_down' => 'shutdown' } } }, %r{parameter 'presets' entry 'p' entry 'on_marked_down' expects a match for Enum\['none', 'shutdown-sessions'\], got 'shutdown'}],
      'a service name with a dot' => [{ 'services' => { 'pup.pet' => { 'listen' => ['10.0.0.1:8140'] } } }, %r{parameter 'services' key of entry 'pup\.pet' expects a match for Crossbar::Name}],
    }.each do |what, (params, message)|
      context "with #{what}" do
        let(:params) { { 'services' => compilers }.merge(params) }

        it { is_expected.to compile.and_raise_error(message) }
      end
    end
  end
end
