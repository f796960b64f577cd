# @summary An SNI name a shared listener routes on: a host name or a `*.suffix` wildcard.
type Crossbar::ServerName = Pattern[/\A(\*\.)?[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9.])?\z/]
