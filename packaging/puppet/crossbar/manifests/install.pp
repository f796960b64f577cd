# @summary Installs the crossbar package (a repository's, or a .deb given as `package_source`) and its state directory.
#
# @api private
class crossbar::install {
  assert_private()
  if $crossbar::manage_package {
    if $crossbar::package_source =~ Undef {
      package { $crossbar::package_name:
        ensure => $crossbar::package_ensure,
      }
    } else {
      package { $crossbar::package_name:
        ensure   => $crossbar::package_ensure,
        provider => 'dpkg',
        source   => $crossbar::package_source,
      }
    }
  }
  if $crossbar::manage_state_dir {
    file { '/var/lib/crossbar':
      ensure => directory,
      owner  => 'crossbar',
      group  => 'crossbar',
      mode   => '0750',
    }
    if $crossbar::manage_package {
      Package[$crossbar::package_name] -> File['/var/lib/crossbar']
    }
  }
}
