# @summary Installs crossbar, writes /etc/crossbar/crossbar.yaml from typed parameters, checks it, reloads, runs the service.
#
# The file is assembled (concat) from a header written here, one piece per
# `crossbar::service` and one per `crossbar::backend`, declared here from
# `$services` and `$backends` (Hiera), anywhere else, or collected from
# PuppetDB (`@@crossbar::backend` on compile servers; `$collect_tag`).
#
# Every new version of the file is checked with `crossbar check` before it
# replaces the old one (concat's `validate_cmd`): a file crossbar would refuse
# never reaches the machine, and the running balancer keeps its configuration.
# A change then reloads the service with `systemctl reload crossbar`, whose
# `crossbar reload -c` checks the file again, as the `crossbar` user, and
# applies it without dropping connections.
#
# Wrong values fail when the catalog is compiled: every parameter has a Puppet
# data type that mirrors what `crossbar check` accepts (docs/configuration.md).
#
# @example Two compilers, least connections, sticky sessions (the `puppet` preset)
#   class { 'crossbar':
#     services => {
#       'puppet' => {
#         preset   => 'puppet',
#         listen   => ['10.0.0.10:8140'],
#         names    => ['puppet.example.com'],
#         backends => [
#           { 'name' => 'compile1.example.com', 'address' => 'compile1.example.com:8140' },
#           { 'name' => 'compile2.example.com', 'address' => 'compile2.example.com:8140' },
#         ],
#       },
#     },
#   }
#
# @example Pools built from exported resources
#   # on each compile server
#   @@crossbar::backend { "puppet/${trusted['certname']}":
#     address => "${trusted['certname']}:8140",
#     tag     => 'crossbar-site1',
#   }
#   # on the balancer
#   class { 'crossbar':
#     services    => { 'puppet' => { 'preset' => 'puppet', 'listen' => ['10.0.0.10:8140'] } },
#     collect_tag => 'crossbar-site1',
#   }
#
# @example One address for the CA and the compilers (SNI), its settings written once
#   class { 'crossbar':
#     listeners => {
#       '10.0.0.10:8140' => { 'freebind' => true, 'per_source' => { 'max_connections' => 20 } },
#     },
#     services  => {
#       'puppetca' => { 'preset' => 'puppetca', 'listen' => ['10.0.0.10:8140'], 'server_names' => ['puppetca.example.com'] },
#       'puppet'   => { 'preset' => 'puppet', 'listen' => ['10.0.0.10:8140'], 'server_names' => ['puppet.example.com'] },
#     },
#   }
#
# @example Compilers from SRV records, the balancer's own Puppet CA to verify them
#   class { 'crossbar':
#     ca_source => '/var/lib/puppet/ssl/certs/ca.pem',
#     defaults  => { 'health' => { 'check' => 'https', 'ca_file' => '/etc/crossbar/puppet-ca.pem' } },
#     services  => {
#       'puppet' => {
#         'preset'   => 'puppet',
#         'listen'   => ['10.0.0.10:8140'],
#         'discover' => { 'srv' => '_compilers._tcp.example.com', 'backend' => { 'max_connections' => 24 } },
#       },
#     },
#   }
#
# @param manage_package
#   Install the package.
# @param package_name
#   The package's name.
# @param package_ensure
#   `installed`, `latest` or a version.
# @param package_source
#   A .deb file to install (the `dpkg` provider) instead of the package from a repository.
# @param manage_state_dir
#   Create /var/lib/crossbar (crossbar:crossbar, 0750), where `stick.state_file`s
#   go, before the first check needs it: the unit's StateDirectory makes it only
#   when the service first starts. Needs the `crossbar` user, which the package makes.
# @param manage_config
#   Write the configuration file. With `false` the module leaves the file alone
#   (and `crossbar::service` and `crossbar::backend` have no effect).
# @param config_file
#   The file. The Debian package's unit reads /etc/crossbar/crossbar.yaml.
# @param config_owner
#   Owner of the file.
# @param config_group
#   Group of the file: crossbar reads it as the `crossbar` user.
# @param config_mode
#   Mode of the file.
# @param binary
#   The crossbar executable that checks each new file.
# @param check_files
#   Also check the files the configuration names (token file, certificates,
#   state-file directory), as `crossbar check` does without `--config-only`.
#   Put those files in place with `ca_source`/`ca_content`, `files` or
#   `crossbar::file`, which write them after the package made /etc/crossbar and
#   before the check. The check runs as root; `systemctl reload` checks again as
#   the `crossbar` user, so the files must be readable by it.
# @param ca_file
#   Where `ca_source` or `ca_content` puts the Puppet CA certificate (root:`config_group`,
#   0644); name it as `health.ca_file`.
# @param ca_source
#   The Puppet CA certificate to copy to `ca_file` (a path on the balancer or a
#   `puppet:///` URL). On a Puppet-managed balancer its own agent's CA is the natural
#   one: `/var/lib/puppet/ssl/certs/ca.pem` with Debian's packages (whose
#   /var/lib/puppet is 0750 puppet, so the `crossbar` user can't read it in place),
#   `/etc/puppetlabs/puppet/ssl/certs/ca.pem` with Puppet's own packages.
# @param ca_content
#   The Puppet CA certificate's PEM text, instead of `ca_source`.
# @param files
#   `crossbar::file` resources to declare (path => parameters): client
#   certificates and keys the configuration names.
# @param extra
#   Top-level keys for crossbar.yaml that the module's types don't know yet (and keys
#   to add to `admin` or `defaults`). It only adds: a key a parameter sets is refused
#   when the catalog is compiled. `crossbar check` checks what it writes like the
#   rest.
# @param workers
#   Worker threads; default one per core.
# @param state_file
#   The server-state file (HAProxy's `server-state-file`): what the operator set at
#   run time with `crossbar backend` (drain, disable, enable, weight) and each
#   backend's last known health, kept across restarts and package upgrades, e.g.
#   `/var/lib/crossbar/crossbar.state` (the class makes `/var/lib/crossbar`).
# @param confirm_budget
#   Extra backend handshakes per second that placement confirmation may cost.
# @param admin
#   The admin endpoint; `{}` keeps crossbar's default (on 127.0.0.1:9140).
# @param admin_token
#   The bearer token write operations need. Written to `admin.token_file`
#   (default /etc/crossbar/admin.token), root:`config_group`, mode 0640.
# @param defaults
#   Defaults for every service and listener.
# @param listeners
#   Settings of listen addresses (`backlog`, `freebind`, `max_connections`,
#   `proxy_protocol`, `per_source`), by address, written once here: each service
#   that lists the address gets them (crossbar's file has no section of listeners;
#   an address no service lists is written nowhere). A service's own long-form
#   entry for the address may repeat a setting with the same value; another value
#   fails the catalog.
# @param services
#   `crossbar::service` resources to declare: name => parameters.
# @param backends
#   `crossbar::backend` resources to declare: title => parameters.
# @param presets
#   The settings each `preset` of `crossbar::service` gives (module data: `puppetca`,
#   `puppet`, `puppetfiles`, `puppetdb`, those of conf/puppet.yaml).
# @param collect_tag
#   Collect the exported `crossbar::backend` resources that carry this tag.
# @param manage_service
#   Manage the systemd service.
# @param service_name
#   The unit's name.
# @param service_ensure
#   `running` or `stopped`.
# @param service_enable
#   Start at boot.
class crossbar (
  Hash[Crossbar::Name, Crossbar::ServiceOptions] $presets,
  Boolean $manage_package = true,
  String[1] $package_name = 'crossbar',
  String[1] $package_ensure = 'installed',
  Optional[Stdlib::Absolutepath] $package_source = undef,
  Boolean $manage_state_dir = $manage_package,
  Boolean $manage_config = true,
  Stdlib::Absolutepath $config_file = '/etc/crossbar/crossbar.yaml',
  String[1] $config_owner = 'root',
  String[1] $config_group = 'crossbar',
  Stdlib::Filemode $config_mode = '0640',
  Stdlib::Absolutepath $binary = '/usr/bin/crossbar',
  Boolean $check_files = true,
  Optional[Integer[1, 1024]] $workers = undef,
  Optional[Integer[0, 1000000]] $confirm_budget = undef,
  Optional[Stdlib::Absolutepath] $state_file = undef,
  Crossbar::Admin $admin = {},
  Optional[Sensitive[String[1]]] $admin_token = undef,
  Crossbar::Defaults $defaults = {},
  Hash[Crossbar::ListenAddress, Crossbar::ListenSettings] $listeners = {},
  Hash[Crossbar::Name, Hash] $services = {},
  Hash[String[1], Hash] $backends = {},
  Optional[String[1]] $collect_tag = undef,
  Stdlib::Absolutepath $ca_file = '/etc/crossbar/puppet-ca.pem',
  Optional[String[1]] $ca_source = undef,
  Optional[String[1]] $ca_content = undef,
  Hash[Stdlib::Absolutepath, Hash] $files = {},
  Crossbar::Extra $extra = {},
  Boolean $manage_service = true,
  String[1] $service_name = 'crossbar',
  Enum['running', 'stopped'] $service_ensure = 'running',
  Boolean $service_enable = true,
) {
  $admin_enabled = $admin['enabled'] != false
  $token_file = $admin_token ? {
    undef   => $admin['token_file'],
    default => $admin['token_file'] ? {
      undef   => '/etc/crossbar/admin.token',
      default => $admin['token_file'],
    },
  }
  $admin_rendered = $token_file ? {
    undef   => $admin,
    default => $admin + { 'token_file' => $token_file },
  }

  contain crossbar::install
  contain crossbar::config
  contain crossbar::daemon

  Class['crossbar::install'] -> Class['crossbar::config'] ~> Class['crossbar::daemon']

  if $ca_source =~ NotUndef or $ca_content =~ NotUndef {
    crossbar::file { $ca_file:
      source  => $ca_source,
      content => $ca_content,
      mode    => '0644', # a CA certificate is public
    }
  }
  $files.each |$path, $params| {
    crossbar::file { $path:
      * => $params,
    }
  }
  $services.each |$name, $params| {
    crossbar::service { $name:
      * => $params,
    }
  }
  $backends.each |$title, $params| {
    crossbar::backend { $title:
      * => $params,
    }
  }
  if $collect_tag =~ NotUndef {
    Crossbar::Backend <<| tag == $collect_tag |>>
  }
}
