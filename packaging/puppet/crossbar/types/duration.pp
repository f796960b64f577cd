# @summary A duration as crossbar reads it: a humantime string such as `500ms`, `5s`, `30m`, `1h 30m`.
#
# A bare number is refused, as `crossbar check` refuses it: write `5s`, not `5`.
type Crossbar::Duration = Pattern[
  /\A\s*(\d+\s*(nanos|nsec|ns|usec|us|millis|msec|ms|s|secs?|seconds?|m|mins?|minutes?|h|hrs?|hours?|d|days?|w|weeks?|M|months?|y|years?)\s*)+\z/, # lint:ignore:140chars
]
