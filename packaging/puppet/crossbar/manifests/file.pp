# @summary A file crossbar.yaml names (a CA, a client certificate or key), put in place after the package and before the check.
#
# `crossbar check` (the validate step) opens the files the configuration names,
# so they must exist before it runs; /etc/crossbar exists only once the package is
# installed. This define orders the file between the two, and a change to it
# reloads the service. The file is root:`crossbar::config_group` (the `crossbar`
# user reads it), 0640 unless `mode` says otherwise.
#
# @example The balancer's own agent certificate and key, for a PuppetDB whose certificate-allowlist covers its status page
#   crossbar::file { '/etc/crossbar/client.pem':
#     source => "/var/lib/puppet/ssl/certs/${trusted['certname']}.pem",
#   }
#   crossbar::file { '/etc/crossbar/client.key':
#     source => "/var/lib/puppet/ssl/private_keys/${trusted['certname']}.pem",
#   }
#
# @param source
#   Where to copy it from: a path on the node or a `puppet:///` URL.
# @param content
#   Its content instead (a key as `Sensitive`).
# @param mode
#   Its mode.
# @param owner
#   Its owner.
# @param group
#   Its group; default `crossbar::config_group`.
define crossbar::file (
  Optional[String[1]] $source = undef,
  Optional[Variant[String[1], Sensitive[String[1]]]] $content = undef,
  Stdlib::Filemode $mode = '0640',
  String[1] $owner = 'root',
  Optional[String[1]] $group = undef,
) {
  unless defined(Class['crossbar']) {
    fail("Crossbar::File[${title}]: declare class crossbar first (include crossbar)")
  }
  unless $title =~ Stdlib::Absolutepath {
    fail("Crossbar::File[${title}]: the title is the file's absolute path")
  }
  if ($source =~ Undef) == ($content =~ Undef) {
    fail("Crossbar::File[${title}]: give either source or content")
  }
  file { $title:
    ensure    => file,
    owner     => $owner,
    group     => pick($group, $crossbar::config_group),
    mode      => $mode,
    source    => $source,
    content   => $content,
    show_diff => false,
    require   => Class['crossbar::install'],
    before    => Class['crossbar::config'],
    notify    => Class['crossbar::daemon'],
  }
}
