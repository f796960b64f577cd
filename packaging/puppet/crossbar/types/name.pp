# @summary A service or backend name: letters, digits, `_` and `-` (it appears in metric labels and URLs).
type Crossbar::Name = Pattern[/\A[A-Za-z0-9_-]+\z/]
