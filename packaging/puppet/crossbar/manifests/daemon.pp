# @summary Runs the crossbar service; a changed configuration reloads it (`systemctl reload`, which checks the file first).
#
# @api private
class crossbar::daemon {
  assert_private()
  if $crossbar::manage_service {
    # The unit's ExecReload (`crossbar reload -c`) checks the file as the crossbar
    # user and reloads through the admin endpoint; without that endpoint, SIGHUP.
    $reload = $crossbar::admin_enabled ? {
      true  => "systemctl reload ${crossbar::service_name}",
      false => "systemctl kill --signal=HUP ${crossbar::service_name}",
    }
    service { $crossbar::service_name:
      ensure  => $crossbar::service_ensure,
      enable  => $crossbar::service_enable,
      restart => $reload,
    }
  }
}
