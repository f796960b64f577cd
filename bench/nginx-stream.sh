# shellcheck shell=bash
# Sourced by bench/compare.sh and bench/conn-cpu.sh: nginx's stream module as a
# third proxy beside crossbar and HAProxy (issue #32), run from a config of its own
# in the bench's work directory (never the system's /etc/nginx).

# nginx_ensure LOGFILE: make sure nginx and its stream module are installed
# (Debian: nginx-light and libnginx-mod-stream); non-zero if they can't be.
nginx_ensure() {
    if command -v nginx >/dev/null && nginx_stream_ok; then return 0; fi
    echo "nginx's stream module missing: apt-get install -y nginx-light libnginx-mod-stream" >&2
    { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light libnginx-mod-stream >"$1" 2>&1 ||
        { apt-get update -qq >>"$1" 2>&1 &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light libnginx-mod-stream >>"$1" 2>&1; }; } &&
        command -v nginx >/dev/null && nginx_stream_ok
}
# nginx_stream_ok: nginx has the stream module built in, or as a module file.
nginx_stream_ok() {
    nginx -V 2>&1 | grep -q -- '--with-stream\( \|$\)' || [ -f /usr/lib/nginx/modules/ngx_stream_module.so ]
}
nginx_version() { nginx -v 2>&1 | sed 's|.*nginx/||'; }

# nginx_head WORKDIR WORKERS CONNECTIONS NOFILE: the main context and the opening of
# `stream {`: WORKERS processes (a number or `auto`) under a master, in the
# foreground, pid and error log in WORKDIR, CONNECTIONS per worker (each proxied
# connection takes two). Close with `nginx_tail`. With NGINX_HALF_CLOSE=on, nginx
# passes a half-close on (`proxy_half_close on`, nginx >= 1.21.4) as crossbar and
# HAProxy do; by default (off) a client's FIN closes both sides at once.
nginx_head() {
    echo "daemon off;"
    echo "master_process on;"
    echo "worker_processes $2;"
    echo "worker_rlimit_nofile $4;"
    echo "pid $1/nginx.pid;"
    echo "error_log $1/nginx.error.log warn;"
    if [ -f /usr/lib/nginx/modules/ngx_stream_module.so ]; then
        echo "load_module /usr/lib/nginx/modules/ngx_stream_module.so;"
    fi
    echo "events { worker_connections $3; }"
    echo "stream {"
    echo "    proxy_connect_timeout 3s;"
    echo "    proxy_timeout 30m;"
    echo "    proxy_half_close ${NGINX_HALF_CLOSE:-off};"
}
nginx_tail() { echo "}"; }

# nginx_upstream NAME BACKEND_ADDR...: an upstream block (round robin, the default).
nginx_upstream() {
    local name=$1 a
    shift
    echo "    upstream $name {"
    for a in "$@"; do echo "        server $a;"; done
    echo "    }"
}

# nginx_tls_server NAME PORT BACKEND_ADDR...: a server that reads the ClientHello
# (`ssl_preread on`) and picks its upstream by SNI through a map, as crossbar's
# `mode: tls` does, then relays to the backends round robin. nginx's stream module
# has no session-ID stickiness (only hash-based balancing), so none is configured.
nginx_tls_server() {
    local name=$1 port=$2
    shift 2
    nginx_upstream "$name" "$@"
    echo "    map \$ssl_preread_server_name \$${name}_pool {"
    echo "        puppet $name;"
    echo "        default $name;"
    echo "    }"
    echo "    server {"
    echo "        listen 127.0.0.1:$port;"
    echo "        ssl_preread on;"
    echo "        proxy_pass \$${name}_pool;"
    echo "    }"
}

# nginx_tcp_server NAME PORT BACKEND_ADDR...: a plain TCP relay, round robin.
nginx_tcp_server() {
    local name=$1 port=$2
    shift 2
    nginx_upstream "$name" "$@"
    echo "    server {"
    echo "        listen 127.0.0.1:$port;"
    echo "        proxy_pass $name;"
    echo "    }"
}

# nginx_cmd WORKDIR: sets the array NGINX_CMD to the command line that runs (or,
# with -t added, checks) WORKDIR/nginx.conf, with WORKDIR as prefix and as home of
# the error log from the first line on.
# shellcheck disable=SC2034 # used by the scripts that source this file
nginx_cmd() { NGINX_CMD=(nginx -p "$1/" -c "$1/nginx.conf" -e "$1/nginx.error.log"); }

# tree_pids PID: PID and its children, one a line (nginx's master and workers).
tree_pids() { echo "$1"; pgrep -P "$1" || true; }
