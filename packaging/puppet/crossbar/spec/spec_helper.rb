# rspec-puppet setup: this module from its own directory, stdlib and concat
# from Debian's packages (/usr/share/puppet/modules), strict variables.
#
# Facter is loaded before rspec-puppet so that its gems (hocon, thor) are active,
# their directories in $LOAD_PATH, before the first example. Puppet's test helper
# puts $LOAD_PATH back after every example as it was before it; a gem that facter
# activates during an example (it reads /etc/facter/facter.conf, present on a Puppet
# server and left by tests/puppet/run.sh, with Hocon.load, which requires its parts
# lazily) would lose its directory after that example, and every later compile
# would fail with "cannot load such file -- hocon/config_factory".
require 'facter'
require 'rspec-puppet'

MODULES = [
  File.expand_path('../..', __dir__), # packaging/puppet: holds crossbar/
  ENV.fetch('CROSSBAR_SYSTEM_MODULES', '/usr/share/puppet/modules'),
].join(':')

RSpec.configure do |c|
  c.module_path = MODULES
  c.setup_fixtures = false # no symlink of the module under spec/fixtures
  c.manifest = File.expand_path('fixtures/site.pp', __dir__)
  c.strict_variables = true
  c.default_facts = {
    'os' => { 'family' => 'Debian', 'name' => 'Debian', 'release' => { 'major' => '12' } },
    'networking' => { 'hostname' => 'lb1', 'fqdn' => 'lb1.example.com' },
  }
  c.before(:each) { Puppet[:strict] = :error }
end

# The text of a concat fragment of the catalogue.
def fragment(title)
  r = catalogue.resource('Concat::Fragment', title)
  raise "no Concat::Fragment[#{title}] in the catalogue" unless r

  r[:content]
end

# crossbar.yaml as concat assembles it: the fragments in their order.
def rendered(path = '/etc/crossbar/crossbar.yaml')
  catalogue.resources
           .select { |r| r.type == 'Concat::Fragment' && r[:target] == path }
           .sort_by { |r| [r[:order].to_s, r.title] }
           .map { |r| r[:content].end_with?("\n") ? r[:content] : "#{r[:content]}\n" }
           .join
end
