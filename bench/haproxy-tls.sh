# Sourced by bench/compare.sh, bench/conn-cpu.sh and bench/syscalls.sh: the HAProxy
# configuration crossbar is compared with (mode tcp, classic TLS session-ID
# stickiness, and a plain round-robin section for TCP).

# haproxy_tls_listen NAME PORT MAXCONN BACKEND_ADDR...: a `listen` section in
# `mode tcp` (from the defaults) balancing round robin over the backends, sticking on
# the TLS <= 1.2 session ID: learned from the ServerHello, looked up in the
# ClientHello. Servers are named NAME-0, NAME-1, ...
haproxy_tls_listen() {
    haproxy_listen_head "$1" "$2" "$3"
    echo "    acl clienthello req_ssl_hello_type 1"
    echo "    acl serverhello rep_ssl_hello_type 2"
    echo "    tcp-request inspect-delay 5s"
    echo "    tcp-request content accept if clienthello"
    echo "    tcp-response content accept if serverhello"
    echo "    stick-table type binary len 32 size 100k expire 30m"
    echo "    stick on payload_lv(43,1) if clienthello"
    echo "    stick store-response payload_lv(43,1) if serverhello"
    local name=$1
    shift 3
    haproxy_servers "$name" "$@"
}

# haproxy_tcp_listen NAME PORT MAXCONN SERVER_ADDR...: a plain `listen` section
# balancing round robin over the servers, named NAME-0, NAME-1, ...
haproxy_tcp_listen() {
    haproxy_listen_head "$1" "$2" "$3"
    local name=$1
    shift 3
    haproxy_servers "$name" "$@"
}

# haproxy_listen_head NAME PORT MAXCONN: a `listen` section's first lines, round robin.
haproxy_listen_head() {
    echo "listen $1"
    echo "    bind 127.0.0.1:$2"
    echo "    maxconn $3"
    echo "    balance roundrobin"
}

# haproxy_servers NAME ADDR...: one `server` line per address, named NAME-0, NAME-1, ...
haproxy_servers() {
    local name=$1 i=0 a
    shift
    for a in "$@"; do
        echo "    server $name-$i $a"
        i=$((i + 1))
    done
}

# haproxy_head MAXCONN MAXPIPES: the `global` and `defaults` sections both scripts
# use: `mode tcp`, long client/server timeouts, `option splice-auto`.
haproxy_head() {
    echo "global"
    echo "    maxconn $1"
    echo "    maxpipes $2"
    echo "defaults"
    echo "    mode tcp"
    echo "    timeout connect 3s"
    echo "    timeout client 30m"
    echo "    timeout server 30m"
    echo "    option splice-auto"
}
