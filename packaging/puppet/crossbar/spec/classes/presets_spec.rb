require 'spec_helper'
require 'yaml'

# The presets (data/common.yaml) against what the docs promise: each preset is
# rendered by crossbar::service and compared with its row of docs/puppet.md's
# "Per-service presets" table and with the service of the same name in
# conf/puppet.yaml, so the three can't drift apart.
REPO = File.expand_path('../../../../..', __dir__)
PRESETS = YAML.safe_load(File.read(File.expand_path('../../data/common.yaml', __dir__)))['crossbar::presets']
PUPPET_YAML = YAML.safe_load(File.read(File.join(REPO, 'conf/puppet.yaml')))

# The table's rows: service name => [balance, stickiness, health check, other].
def docs_rows
  text = File.read(File.join(REPO, 'docs/puppet.md'))
  section = text[%r{^## Per-service presets\n(.*?)^## }m, 1] or raise 'docs/puppet.md: no "Per-service presets" section'
  section.lines.grep(%r{^\| `}).to_h do |line|
    cells = line.split('|').map(&:strip)[1..]
    [cells[0][%r{`([^`]+)`}, 1], cells[1..4]]
  end
end

# Psych reads YAML 1.1, where a bare `on` is the boolean true: give it its name back.
def names_on(value)
  case value
  when Hash then value.to_h { |k, v| [k == true ? 'on' : k, names_on(v)] }
  when Array then value.map { |v| names_on(v) }
  else value
  end
end

# What conf/puppet.yaml's service gives for the keys a preset sets, defaults applied.
def conf_policy(name)
  svc = PUPPET_YAML['services'][name] or raise "conf/puppet.yaml has no service #{name}"
  health = (PUPPET_YAML.dig('defaults', 'health') || {}).merge(svc['health'] || {})
  {
    'balance' => svc['balance'] || 'roundrobin',
    'failback' => svc['failback'],
    'stick' => names_on(svc['stick']),
    'check' => health['check'],
    'path' => health['path'],
  }
end

describe 'the presets' do
  it 'are the services of the docs\' table and of conf/puppet.yaml' do
    expect(PRESETS.keys.sort).to eq(docs_rows.keys.sort)
    expect(PUPPET_YAML['services'].keys.sort).to include(*PRESETS.keys.sort)
  end
end

PRESETS.each_key do |name|
  describe 'crossbar::service', type: :define do
    let(:pre_condition) { 'include crossbar' }
    let(:title) { name }
    let(:params) { { 'preset' => name, 'listen' => ['10.0.0.10:8140'] } }
    let(:settings) { names_on(YAML.safe_load(fragment("crossbar service #{name}")))[name] }
    let(:policy) do
      {
        'balance' => settings['balance'] || 'roundrobin',
        'failback' => settings['failback'],
        'stick' => settings['stick'],
        'check' => settings.dig('health', 'check'),
        'path' => settings.dig('health', 'path'),
      }
    end

    context "with preset #{name}" do
      it 'sets only balancing, failback, stickiness and the health check (the rest is the site\'s)' do
        expect(settings.keys - ['listen', 'balance', 'failback', 'stick', 'health']).to eq([])
        expect(settings.fetch('health', {}).keys - ['check', 'path']).to eq([])
      end

      it 'renders what conf/puppet.yaml\'s service of that name sets' do
        expect(policy).to eq(conf_policy(name))
      end

      it 'renders what docs/puppet.md\'s table says' do
        balance, stickiness, health, other = docs_rows.fetch(name)
        expect(balance[%r{`([^`]+)`}, 1]).to eq(policy['balance'])
        if stickiness.start_with?('none')
          expect(policy['stick']).to be_nil
        else
          expect(stickiness[%r{`on: \[([^\]]*)\]`}, 1].split(', ')).to eq(policy['stick']['on'])
        end
        expect(health.scan(%r{`([^`]+)`}).flatten).to eq([policy['check'], policy['path']])
        expect(other[%r{`failback: (\w+)`}, 1]).to eq(policy['failback'])
        expect(other.include?('`state_file`')).to eq(!policy.dig('stick', 'state_file').nil?)
      end
    end
  end
end
