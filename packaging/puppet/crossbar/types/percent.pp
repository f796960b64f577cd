# @summary A percentage from 1% to 100% as crossbar reads it: `5%` (a bare number is refused, as `crossbar check` refuses it).
type Crossbar::Percent = Pattern[/\A\s*(100|[1-9][0-9]?)\s*%\s*\z/]
