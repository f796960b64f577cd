# @summary Limits per client source on a listen address (docs/configuration.md, `listen[].per_source`).
#
# Give `max_connections`, `rate` or both (`crossbar check` refuses neither); `burst`
# needs `rate`. Services sharing an address share its limits (written once).
type Crossbar::PerSource = Struct[{
  Optional[max_connections]  => Integer[1, 4294967295],
  Optional[rate]             => Integer[1, 1000000],
  Optional[burst]            => Integer[1, 10000000],
  Optional[source_prefix_v4] => Integer[0, 32],
  Optional[source_prefix_v6] => Integer[0, 128],
  Optional[allow]            => Array[Crossbar::Network],
  Optional[table_size]       => Integer[1, 1000000],
}]
