# @summary A backend address: `host:port`, `v4:port` or `[v6]:port`; host names are resolved at each connect.
type Crossbar::BackendAddress = Pattern[/\A([A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9.])?|\[[0-9A-Fa-f:.]+\]):\d{1,5}\z/]
