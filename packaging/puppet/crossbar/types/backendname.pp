# @summary A backend name: letters, digits, `_`, `-` and `.`, not starting with `.` (a certname such as `compile01.dc1.example.com` fits).
#
# It names the backend in metrics, logs, stick tables and the API
# (`crossbar backend drain puppet/compile01.dc1.example.com`). A discovered
# backend's name, `target-port` (`compile2.example.com-8140`), fits too: a backend
# given that name in the file takes the discovered one's place.
type Crossbar::BackendName = Pattern[/\A[A-Za-z0-9_-][A-Za-z0-9_.-]*\z/]
