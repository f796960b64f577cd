# Ruby's OpenSSL through the Puppet agent's own HTTP client, Net::HTTP: for each
# server name, one Net::HTTP object (which keeps its TLS session between
# connections, as the agent does) makes three connections: a full handshake, then
# two resumptions. Prints per connection
#   RESULT sni attempt reused backend
# where "reused" is OpenSSL's own SSL_session_reused() for that connection.
#
# Usage: ruby client.rb ca.pem port sni...
require 'net/http'
require 'openssl'

ca, port, *snis = ARGV
snis.each do |sni|
  http = Net::HTTP.new(sni, port.to_i)
  http.ipaddr = '127.0.0.1'
  http.use_ssl = true
  http.ca_file = ca
  http.verify_mode = OpenSSL::SSL::VERIFY_PEER
  http.open_timeout = 15
  http.read_timeout = 15
  3.times do |a|
    begin
      http.start do |h|
        body = h.get('/who').body.to_s.strip
        reused = h.instance_variable_get(:@socket).io.session_reused?
        puts "RESULT #{sni} #{a} #{reused} #{body}"
      end
    rescue StandardError => e
      puts "ERROR #{sni} #{a} #{e.class}: #{e.message.tr("\n", ' ')}"
    end
    $stdout.flush
  end
end
puts "VERSION ruby #{RUBY_VERSION} #{OpenSSL::OPENSSL_LIBRARY_VERSION}"
