# @summary An address to listen on: `ip:port`, IPv6 in brackets (`[::]:8140`).
type Crossbar::ListenAddress = Pattern[/\A(\d{1,3}(\.\d{1,3}){3}|\[[0-9A-Fa-f:.]+\]):\d{1,5}\z/]
