# @summary A value `extra` may write to crossbar.yaml: a string, number, boolean, or a list or mapping of these.
type Crossbar::ExtraValue = Variant[
  String,
  Numeric,
  Boolean,
  Array[Crossbar::ExtraValue],
  Hash[String[1], Crossbar::ExtraValue],
]
