# @summary Assembles crossbar.yaml and checks each new version with `crossbar check` before it is put in place.
#
# @api private
class crossbar::config {
  assert_private()
  if $crossbar::manage_config {
    if $crossbar::admin_token =~ NotUndef {
      file { $crossbar::token_file:
        ensure    => file,
        owner     => $crossbar::config_owner,
        group     => $crossbar::config_group,
        mode      => '0640',
        content   => $crossbar::admin_token,
        show_diff => false,
        before    => Concat[$crossbar::config_file],
      }
    }

    $only = $crossbar::check_files ? {
      true  => '',
      false => ' --config-only',
    }
    concat { $crossbar::config_file:
      ensure         => present,
      owner          => $crossbar::config_owner,
      group          => $crossbar::config_group,
      mode           => $crossbar::config_mode,
      order          => 'alpha',
      ensure_newline => true,
      backup         => false,
      validate_cmd   => "${crossbar::binary} check${only} -c %",
    }

    if 'services' in $crossbar::extra {
      fail(@(MSG/L))
        Class[Crossbar]: extra.services: services come from crossbar::service (or the `services` \
        parameter); give a service its own `extra`
        | MSG
    }
    $top = {
      'workers'        => $crossbar::workers,
      'confirm_budget' => $crossbar::confirm_budget,
      'state_file'     => $crossbar::state_file,
      'admin'          => $crossbar::admin_rendered,
      'defaults'       => $crossbar::defaults,
    }.filter |$k, $v| { $v =~ NotUndef and !($v =~ Hash and $v.empty) }

    concat::fragment { 'crossbar header':
      target  => $crossbar::config_file,
      order   => '00',
      content => epp('crossbar/header.yaml.epp', {
          'top' => crossbar::merge_extra($top, $crossbar::extra, 'Class[Crossbar]: extra'),
      }),
    }
  }
}
