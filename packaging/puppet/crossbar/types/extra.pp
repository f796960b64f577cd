# @summary Keys for crossbar.yaml that the module's types don't know yet, merged into a service, a backend or the top level.
#
# `extra` only adds: a key a parameter (or the preset) already sets is refused when
# the catalog is compiled, except that mappings merge key by key, so
# `{ 'discover' => { 'new_key' => ... } }` adds to a `discover` the parameters give.
# What it writes is checked by `crossbar check` (the validate step) like the rest:
# an unknown key or a wrong value never reaches the balancer.
type Crossbar::Extra = Hash[Pattern[/\A[a-z][a-z0-9_]*\z/], Crossbar::ExtraValue]
