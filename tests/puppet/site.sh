# Sourced by tests/puppet/run.sh and bench/herd.sh: the pieces of a Puppet site on
# one machine (PUPPET-NOTES.md): the processes they start, puppetservers side by
# side, agents with their own directories; with
#   W                 the work directory; each server's own under $W/NAME
#   PIDS              an associative array, name -> pid of what the script started
#   DOMAIN            the site's domain; $W/ca.pem its CA
#   HOSTS_BEGIN/END   the markers of the script's block in /etc/hosts
#   JVM_START_TIMEOUT seconds a JVM may take to say `running`
#   PROOT             Puppet 8: the trixie root (tests/puppet/root8.sh) the Puppet
#                     commands run from, empty for Puppet 7 (this machine's packages)

stop_pid() { # name: TERM, bounded wait, then KILL
    local name=$1 pid=${PIDS[$1]:-}
    [ -n "$pid" ] || return 0
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    fi
    unset "PIDS[$name]"
}
hosts_remove() {
    if grep -q "^$HOSTS_BEGIN\$" /etc/hosts 2>/dev/null; then
        # /etc/hosts may be a bind mount: rewrite in place, never replace the inode
        local tmp; tmp=$(mktemp)
        sed "/^$HOSTS_BEGIN\$/,/^$HOSTS_END\$/d" /etc/hosts > "$tmp" && cat "$tmp" > /etc/hosts
        rm -f "$tmp"
    fi
}

# hosts_remove_stale PREFIX: the blocks "# BEGIN PREFIX PID" of runs whose PID is
# gone (a run killed before its cleanup): the first line for a name wins, so one
# left behind would send this run's agents to another run's addresses
hosts_remove_stale() {
    local pid tmp
    for pid in $(sed -n "s/^# BEGIN $1 \([0-9]*\)\$/\1/p" /etc/hosts); do
        kill -0 "$pid" 2>/dev/null && continue
        tmp=$(mktemp)
        sed "/^# BEGIN $1 $pid\$/,/^# END $1 $pid\$/d" /etc/hosts > "$tmp" && cat "$tmp" > /etc/hosts
        rm -f "$tmp"
    done
}

# root_mount / root_umount: what the Puppet 8 root needs from this machine, mounted
# for the run and gone after it: /proc, /sys (read-only: facter reads it), /dev, /tmp
# (the work directory at the same path inside and out) and /etc/hosts (the run's names)
ROOT_MOUNTS=()
root_mount() {
    local m
    mount -t proc proc "$PROOT/proc" && ROOT_MOUNTS+=("$PROOT/proc") || return 1
    mount -t sysfs -o ro sysfs "$PROOT/sys" && ROOT_MOUNTS+=("$PROOT/sys") || return 1
    for m in /dev /dev/pts /tmp /etc/hosts; do
        mount --bind "$m" "$PROOT$m" && ROOT_MOUNTS+=("$PROOT$m") || return 1
    done
}
# root_enter: the Puppet 8 root mounted, and puppet, puppetserver, facter and java
# run from it (wrappers in $W/bin8, first in PATH; the same paths inside and out)
root_enter() {
    local c
    root_mount || return 1
    mkdir -p "$W/bin8" || return 1
    for c in puppet puppetserver facter java; do
        printf '#!/bin/sh\nexec env PATH=/usr/sbin:/usr/bin:/sbin:/bin chroot %s /usr/bin/%s "$@"\n' "$PROOT" "$c" > "$W/bin8/$c"
        chmod 755 "$W/bin8/$c"
    done
    export PATH="$W/bin8:$PATH"
}
root_umount() { # the last mounted first
    local i
    for (( i = ${#ROOT_MOUNTS[@]} - 1; i >= 0; i-- )); do umount -l "${ROOT_MOUNTS[$i]}" 2>/dev/null; done
    ROOT_MOUNTS=()
}

jvm_start() { # name [heap, default 1g]
    local d=$W/$1
    printf 0 > "$d/restart"
    # shellcheck disable=SC2086
    java -Xms512m "-Xmx${2:-1g}" -XX:+UseSerialGC ${JAVA_EXTRA:-} \
        -Djruby.logger.class=com.puppetlabs.jruby_utils.jruby.Slf4jLogger \
        -Djruby.lib=/usr/share/jruby/lib \
        -jar /usr/share/puppetserver/puppetserver.jar \
        --config "$d/conf.d" --bootstrap-config "$d/services.d" \
        --restart-file "$d/restart" > "$d/log/stdout.log" 2>&1 &
    PIDS[$1]=$!
}
jvm_wait() { # name ip -> waits until /status/v1/simple says running
    local d=$W/$1 end=$(( $(date +%s) + JVM_START_TIMEOUT ))
    while [ "$(date +%s)" -lt $end ]; do
        kill -0 "${PIDS[$1]}" 2>/dev/null || { tail -20 "$d/log/stdout.log" "$d/log/puppetserver.log" >&2; return 1; }
        if [ "$(head -c1 "$d/restart" 2>/dev/null)" = 1 ] &&
           [ "$(curl -s --max-time 5 --cacert "$W/ca.pem" "https://$1.$DOMAIN:8140/status/v1/simple" \
                --resolve "$1.$DOMAIN:8140:$2")" = running ]; then
            return 0
        fi
        sleep 1
    done
    return 1
}

# jvm_logging CONF_DIR LOG_DIR NAME [LOGGERS]: a Jetty JVM's logback.xml (its log in
# LOG_DIR/NAME.log, with LOGGERS: more <logger> lines) and request-logging.xml (every
# request in LOG_DIR/access.log), both in CONF_DIR; puppetserver's and PuppetDB's
jvm_logging() {
    cat > "$1/logback.xml" <<EOC
<configuration>
  <appender name="F" class="ch.qos.logback.core.FileAppender">
    <file>$2/$3.log</file>
    <encoder><pattern>%d{HH:mm:ss.SSS} %-5p [%c{2}] %m%n</pattern></encoder>
  </appender>
  <logger name="org.eclipse.jetty" level="INFO"/>
${4:-}
  <root level="info"><appender-ref ref="F"/></root>
</configuration>
EOC
    cat > "$1/request-logging.xml" <<EOC
<configuration debug="false">
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>$2/access.log</file>
    <encoder><pattern>%h %l %u [%t] "%r" %s %b %D</pattern></encoder>
  </appender>
  <appender-ref ref="FILE"/>
</configuration>
EOC
}

# server_conf NAME IP JRUBIES [QUEUE RETRY]: a puppetserver's conf.d and services.d
# under $W/NAME (its puppet.conf is the caller's): TLS on IP:8140 asking for client
# certificates, JRUBIES instances, a shared code dir $W/code, an access log (%D:
# milliseconds) and Debian's auth.conf; QUEUE and RETRY set max-queued-requests and
# max-retry-delay. AUTH_TRACE=1 logs each request's authorization with its certname;
# JETTY_IDLE_MS sets Jetty's idle timeout (its default: 30 s).
server_conf() {
    local d=$W/$1 ip=$2 limits=""
    [ -n "${4:-}" ] && limits="    max-queued-requests: $4
    max-retry-delay: $5"
    mkdir -p "$d"/{etc,conf.d,services.d,var,run,log,ssl,gems}
    cat > "$d/conf.d/webserver.conf" <<EOC
webserver: {
    access-log-config: $d/conf.d/request-logging.xml
    client-auth: want
    ssl-host: $ip
    ssl-port: 8140
${JETTY_IDLE_MS:+    idle-timeout-milliseconds: $JETTY_IDLE_MS}
}
EOC
    cat > "$d/conf.d/puppetserver.conf" <<EOC
jruby-puppet: {
    ruby-load-path: [/usr/lib/puppetserver/ruby/vendor_ruby]
    gem-home: $d/gems
    gem-path: [\${jruby-puppet.gem-home}, "/usr/lib/puppetserver/vendored-jruby-gems"]
    server-conf-dir: $d/etc
    server-code-dir: $W/code
    server-var-dir: $d/var
    server-run-dir: $d/run
    server-log-dir: $d/log
    max-active-instances: $3
$limits
}
http-client: {
}
profiler: {
}
product: {
    check-for-updates: false
}
EOC
    printf 'global: {\n    logging-config: %s/conf.d/logback.xml\n}\n' "$d" > "$d/conf.d/global.conf"
    printf 'certificate-authority: {\n    allow-subject-alt-names: true\n}\n' > "$d/conf.d/ca.conf"
    local trace=""
    [ "${AUTH_TRACE:-0}" = 1 ] && trace='  <logger name="puppetlabs.trapperkeeper.authorization.rules" level="TRACE"/>'
    jvm_logging "$d/conf.d" "$d/log" puppetserver "$trace"
    cp "${PROOT:-}"/etc/puppet/puppetserver/conf.d/{auth.conf,web-routes.conf,metrics.conf} "$d/conf.d/"
    cp "${PROOT:-}"/etc/puppet/puppetserver/services.d/{bootstrap.cfg,ca.cfg} "$d/services.d/"
}

# install_cert NAME CA_SSLDIR DST_SSLDIR: move NAME's certificate and key, signed
# offline by `puppetserver ca generate` into CA_SSLDIR, to DST_SSLDIR with the CA
# certificate and CRL, as `puppet ssl bootstrap` would have left them
install_cert() {
    local n=$1 src=$2 dst=$3
    mkdir -p "$dst/"{certs,private_keys}
    mv "$src/certs/$n.$DOMAIN.pem" "$dst/certs/" && mv "$src/private_keys/$n.$DOMAIN.pem" "$dst/private_keys/" ||
        return 1
    rm -f "$src/public_keys/$n.$DOMAIN.pem"
    chmod 600 "$dst/private_keys/$n.$DOMAIN.pem"
    cp "$src/certs/ca.pem" "$dst/certs/"
    cp "$src/crl.pem" "$dst/"
}

agent_conf() { # name index: an agent with its own dirs and source address 127.0.0.(100 + index)
    local d=$W/agents/$1
    mkdir -p "$d"
    cat > "$d/puppet.conf" <<EOC
[main]
certname = $1.$DOMAIN
server = puppet.$DOMAIN
ca_server = puppetca.$DOMAIN
sourceaddress = 127.0.0.$((100 + $2))
ssldir = $d/ssl
vardir = $d/var
logdir = $d/log
rundir = $d/run
codedir = $d/code
waitforcert = 0
report = true
EOC
}
