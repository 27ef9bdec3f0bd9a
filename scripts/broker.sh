#!/usr/bin/env bash
# A real local RabbitMQ 4.0 broker for rmqs: up | down | restart | status | tls-dir | ctl ARGS | streams ARGS
#
# Debian 13 hosts use the distribution's rabbitmq-server. Debian 12 hosts (whose package is 3.10:
# no super streams, no StreamStats) run Debian trixie's package inside a debootstrap chroot that is
# kept in a machine-level cache ($RMQS_BROKER_HOME), so fresh clones reuse it. The host's libc is
# never touched. Listens on loopback only: stream 5552, stream over TLS 5551, AMQP 5672, management
# 15672. `up` creates (once) a test CA, a server certificate for localhost / 127.0.0.1 and a client
# certificate in the tls folder (`tls-dir` prints its host path); they are for tests only.
# With RMQS_TEST_URI set, another broker is in use and this script starts nothing.
set -euo pipefail

HOME_DIR="${RMQS_BROKER_HOME:-/var/cache/rmqs-broker}"
MIRROR="${RMQS_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
STREAM_PORT="${RMQS_STREAM_PORT:-5552}"
TLS_PORT="${RMQS_STREAM_TLS_PORT:-5551}"
AMQP_PORT="${RMQS_AMQP_PORT:-5672}"
MGMT_PORT="${RMQS_MANAGEMENT_PORT:-15672}"
ROOT="$HOME_DIR/trixie"          # the chroot (Debian 12 hosts only)
PIDFILE="$HOME_DIR/broker.pid"
LOG="$HOME_DIR/broker.log"

log() { printf 'broker: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

host_major() { . /etc/os-release; echo "${VERSION_ID%%.*}"; }

use_chroot() {
    [[ "${RMQS_BROKER_MODE:-}" == chroot ]] && return 0
    [[ "${RMQS_BROKER_MODE:-}" == host ]] && return 1
    [[ "$(host_major)" -lt 13 ]]
}

# The node directory as the broker sees it, and as the host sees it.
node_dir() { if use_chroot; then echo /rmqs; else echo "$HOME_DIR/node"; fi; }
node_dir_host() { if use_chroot; then echo "$ROOT/rmqs"; else echo "$HOME_DIR/node"; fi; }
# The test CA and certificates, as the broker sees them and as the host sees them.
tls_dir() { if use_chroot; then echo /tls; else echo "$HOME_DIR/tls"; fi; }
tls_dir_host() { if use_chroot; then echo "$ROOT/tls"; else echo "$HOME_DIR/tls"; fi; }
TLS_FILES=(ca.pem server.pem server.key client.pem client.key)

as_root() { if [[ $EUID -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

apt_install() {
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y --no-install-recommends "$@" >/dev/null \
      || { as_root apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive \
           as_root apt-get install -y --no-install-recommends "$@" >/dev/null; }
}

broker_env() { # one VAR=value per line (values may hold spaces)
    local n; n="$(node_dir)"
    # HOME is the rabbitmq user's: Debian's CLI wrappers read the Erlang cookie from there.
    printf '%s\n' HOME=/var/lib/rabbitmq PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
        RABBITMQ_NODENAME=rabbit@localhost ERL_EPMD_ADDRESS=127.0.0.1 \
        RABBITMQ_CONFIG_FILE="$n/rabbitmq.conf" \
        RABBITMQ_ENABLED_PLUGINS_FILE="$n/enabled_plugins" \
        RABBITMQ_PLUGINS_DIR="$(plugins_dir)" \
        RABBITMQ_MNESIA_BASE="$n/mnesia" RABBITMQ_LOG_BASE="$n/log" \
        RABBITMQ_PID_FILE="$n/rabbit.pid" RABBITMQ_LOGS=- \
        RABBITMQ_ADVANCED_CONFIG_FILE="$n/advanced.config" \
        "RABBITMQ_CTL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}"
    # The last line: CLI tools (rabbitmqctl...) are Erlang nodes too; keep their listener on loopback.
}

plugins_dir() {
    local base=""; use_chroot && base="$ROOT"
    local d; d="$(ls -d "$base"/usr/lib/rabbitmq/lib/rabbitmq_server-*/plugins 2>/dev/null | sort -V | tail -1)"
    echo "${d#"$base"}"
}

# Run a command as the rabbitmq user with the node's environment.
as_rabbit() {
    local -a envs; mapfile -t envs < <(broker_env)
    if use_chroot; then
        as_root chroot --userspec=rabbitmq:rabbitmq "$ROOT" env -i "${envs[@]}" "$@"
    else
        as_root runuser -u rabbitmq -- env -i "${envs[@]}" "$@"
    fi
}

install_chroot() {
    [[ -x "$ROOT/usr/sbin/rabbitmq-server" ]] && return 0
    command -v debootstrap >/dev/null || { log "installing debootstrap"; apt_install debootstrap; }
    local tmp="$ROOT.partial"
    [[ -d "$tmp" ]] && { umount_proc "$tmp"; as_root rm -rf --one-file-system "$tmp"; }
    log "creating a Debian trixie chroot in $ROOT (once per machine, ~1 min)"
    as_root debootstrap --variant=minbase trixie "$tmp" "$MIRROR" >"$HOME_DIR/debootstrap.log" 2>&1 \
        || die "debootstrap failed, see $HOME_DIR/debootstrap.log"
    # Maintainer scripts must not start services; localhost must resolve (epmd dies otherwise).
    printf '#!/bin/sh\nexit 101\n' | as_root tee "$tmp/usr/sbin/policy-rc.d" >/dev/null
    as_root chmod 755 "$tmp/usr/sbin/policy-rc.d"
    printf '127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n' | as_root tee "$tmp/etc/hosts" >/dev/null
    as_root cp /etc/resolv.conf "$tmp/etc/resolv.conf" 2>/dev/null || true
    as_root mount -t proc proc "$tmp/proc"
    log "installing rabbitmq-server in the chroot"
    if ! as_root chroot "$tmp" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
            apt-get install -y --no-install-recommends rabbitmq-server >"$HOME_DIR/apt.log" 2>&1; then
        umount_proc "$tmp"; die "apt-get install rabbitmq-server failed, see $HOME_DIR/apt.log"
    fi
    umount_proc "$tmp"
    as_root mv "$tmp" "$ROOT"
}

install_host() {
    if ! dpkg -s rabbitmq-server >/dev/null 2>&1; then
        log "installing rabbitmq-server from Debian $(host_major)"
        local added=0
        if [[ ! -e /usr/sbin/policy-rc.d ]]; then
            printf '#!/bin/sh\nexit 101\n' | as_root tee /usr/sbin/policy-rc.d >/dev/null
            as_root chmod 755 /usr/sbin/policy-rc.d; added=1
        fi
        apt_install rabbitmq-server || { [[ $added == 1 ]] && as_root rm -f /usr/sbin/policy-rc.d; die "apt-get install rabbitmq-server failed"; }
        [[ $added == 1 ]] && as_root rm -f /usr/sbin/policy-rc.d
    fi
}

umount_proc() { local r="$1"; if mountpoint -q "$r/proc" 2>/dev/null; then as_root umount -l "$r/proc"; fi; }

tls_ready() { local f; for f in "${TLS_FILES[@]}"; do [[ -s "$(tls_dir_host)/$f" ]] || return 1; done; }

gen_tls() { # into folder $1, which holds openssl.cnf
    local tmp="$1" who cn
    as_root openssl req -x509 -new -newkey rsa:2048 -nodes -sha256 -days 3650 -config "$tmp/openssl.cnf" \
        -extensions ca -subj "/CN=rmqs test CA" -keyout "$tmp/ca.key" -out "$tmp/ca.pem" || return 1
    for who in server client; do
        cn=localhost; [[ $who == client ]] && cn=rmqs-test-client
        as_root openssl req -new -newkey rsa:2048 -nodes -sha256 -config "$tmp/openssl.cnf" \
            -subj "/CN=$cn" -keyout "$tmp/$who.key" -out "$tmp/$who.csr" || return 1
        as_root openssl x509 -req -sha256 -days 3650 -in "$tmp/$who.csr" -CA "$tmp/ca.pem" \
            -CAkey "$tmp/ca.key" -set_serial "0x$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')" \
            -extfile "$tmp/openssl.cnf" -extensions "$who" -out "$tmp/$who.pem" || return 1
    done
}

# A test CA, a server certificate (CN and SAN localhost, SAN IP 127.0.0.1) and a client certificate,
# made once with the host's openssl. Certificates and the client key are world-readable (tests read
# them); the server key is readable by the rabbitmq group only; the CA key by root only.
make_tls() {
    local dir; dir="$(tls_dir_host)"
    if ! tls_ready; then
        command -v openssl >/dev/null || { log "installing openssl"; apt_install openssl; }
        local tmp="$dir.partial"
        as_root rm -rf "$tmp"; as_root mkdir -p "$tmp"
        log "creating a test CA and certificates in $dir (once)"
        cat <<'CNF' | as_root tee "$tmp/openssl.cnf" >/dev/null
[req]
distinguished_name = dn
prompt = no
[dn]
CN = rmqs test CA
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
CNF
        gen_tls "$tmp" >"$HOME_DIR/openssl.log" 2>&1 || die "openssl failed, see $HOME_DIR/openssl.log"
        as_root rm -f "$tmp/server.csr" "$tmp/client.csr"
        as_root rm -rf "$dir"
        as_root mv "$tmp" "$dir"
    fi
    # Ownership and modes on every `up` (the rabbitmq uid/gid may change with a new chroot).
    local gid; gid="$(id_of rabbitmq)"; gid="${gid#*:}"
    as_root chown root:root "$dir" "$dir"/*
    as_root chmod 755 "$dir"
    as_root chmod 644 "$dir"/*.pem "$dir/client.key" "$dir/openssl.cnf"
    as_root chmod 600 "$dir/ca.key"
    as_root chown "root:$gid" "$dir/server.key"
    as_root chmod 640 "$dir/server.key"
}

write_config() {
    local n t; n="$(node_dir_host)"; t="$(tls_dir)"
    as_root mkdir -p "$n/mnesia" "$n/log"
    cat <<CONF | as_root tee "$n/rabbitmq.conf" >/dev/null
listeners.tcp.1 = 127.0.0.1:$AMQP_PORT
stream.listeners.tcp.1 = 127.0.0.1:$STREAM_PORT
stream.listeners.ssl.1 = 127.0.0.1:$TLS_PORT
stream.advertised_host = localhost
stream.advertised_port = $STREAM_PORT
stream.advertised_tls_port = $TLS_PORT
ssl_options.cacertfile = $t/ca.pem
ssl_options.certfile = $t/server.pem
ssl_options.keyfile = $t/server.key
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = false
management.tcp.ip = 127.0.0.1
management.tcp.port = $MGMT_PORT
loopback_users = none
log.console = true
log.console.level = warning
log.file = false
CONF
    echo '[rabbitmq_management,rabbitmq_stream,rabbitmq_stream_management].' | as_root tee "$n/enabled_plugins" >/dev/null
    # Erlang distribution (CLI tools <-> node) on loopback only, like every other listener.
    echo '[{kernel, [{inet_dist_use_interface, {127,0,0,1}}]}].' | as_root tee "$n/advanced.config" >/dev/null
    as_root chown -R "$(id_of rabbitmq)" "$n"
}

id_of() { # uid:gid of a user as the broker's passwd sees it
    local passwd=/etc/passwd; use_chroot && passwd="$ROOT/etc/passwd"
    awk -F: -v u="$1" '$1==u {print $3":"$4}' "$passwd"
}

# Every process whose root is the chroot is ours (the broker, epmd, erl_child_setup...).
chroot_pids() {
    local real p; real="$(readlink -f "$ROOT")"
    for p in /proc/[0-9]*; do
        if [[ "$(readlink "$p/root" 2>/dev/null)" == "$real" ]]; then echo "${p#/proc/}"; fi
    done
    return 0
}

ours_pids() {
    if use_chroot; then chroot_pids; return; fi
    # host mode: the broker we started and its epmd
    [[ -f "$PIDFILE" ]] && cat "$PIDFILE"
    [[ -f "$HOME_DIR/epmd.pid" ]] && cat "$HOME_DIR/epmd.pid"
    return 0
}

running() { as_rabbit rabbitmqctl -q -t 5 await_startup >/dev/null 2>&1; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

cmd_up() {
    if [[ -n "${RMQS_TEST_URI:-}" ]]; then log "RMQS_TEST_URI is set: using that broker, starting nothing"; return 0; fi
    as_root mkdir -p "$HOME_DIR"
    exec 9>"$HOME_DIR/.lock"; flock 9
    if use_chroot; then install_chroot; else install_host; fi
    make_tls
    if [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null && running; then
        log "already running (pid $(cat "$PIDFILE"))"
        port_open "$TLS_PORT" || log "no TLS listener on 127.0.0.1:$TLS_PORT: it was started with an older configuration; restart it with: $0 down && $0 up"
        return 0
    fi
    local port
    for port in "$STREAM_PORT" "$TLS_PORT"; do
        if port_open "$port"; then die "port $port is in use by a broker this script did not start (set RMQS_TEST_URI to use it)"; fi
    done
    write_config
    use_chroot && { mountpoint -q "$ROOT/proc" || as_root mount -t proc proc "$ROOT/proc"; }
    log "starting RabbitMQ ($(broker_version_pkg)) on 127.0.0.1:$STREAM_PORT"
    # setsid + closed lock fd: the broker must not hold our lock or terminal.
    local -a envs; mapfile -t envs < <(broker_env)
    if use_chroot; then
        setsid chroot --userspec=rabbitmq:rabbitmq "$ROOT" env -i "${envs[@]}" \
            /usr/sbin/rabbitmq-server >"$LOG" 2>&1 9>&- </dev/null &
    else
        setsid runuser -u rabbitmq -- env -i "${envs[@]}" \
            /usr/sbin/rabbitmq-server >"$LOG" 2>&1 9>&- </dev/null &
    fi
    echo $! >"$PIDFILE"
    local deadline=$((SECONDS + 120))
    until as_rabbit rabbitmqctl -q -t 10 await_startup >/dev/null 2>&1 && port_open "$STREAM_PORT" && port_open "$TLS_PORT"; do
        if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then tail -30 "$LOG" >&2; die "the broker exited during boot, see $LOG"; fi
        (( SECONDS < deadline )) || { tail -30 "$LOG" >&2; die "the broker did not boot within 120 s, see $LOG"; }
        sleep 1
    done
    if ! use_chroot; then pgrep -x epmd -u rabbitmq >"$HOME_DIR/epmd.pid" 2>/dev/null || true; fi
    log "up: stream 127.0.0.1:$STREAM_PORT, stream TLS 127.0.0.1:$TLS_PORT, amqp :$AMQP_PORT, management http://127.0.0.1:$MGMT_PORT (guest/guest)"
    log "test CA: $(tls_dir_host)/ca.pem (client certificate: client.pem, client.key)"
}

cmd_down() {
    if [[ -n "${RMQS_TEST_URI:-}" ]]; then log "RMQS_TEST_URI is set: nothing to stop"; return 0; fi
    [[ -d "$HOME_DIR" ]] || { log "not installed"; return 0; }
    if use_chroot && [[ ! -d "$ROOT" ]]; then log "not installed"; return 0; fi
    as_rabbit rabbitmqctl -q -t 30 stop >/dev/null 2>&1 || true
    local pids i
    for i in $(seq 1 30); do
        pids="$(ours_pids | xargs -r)"; pids="$(for p in $pids; do kill -0 "$p" 2>/dev/null && echo "$p"; done | xargs -r)"
        [[ -z "$pids" ]] && break
        (( i == 10 )) && as_root kill $pids 2>/dev/null || true
        (( i == 25 )) && as_root kill -9 $pids 2>/dev/null || true
        sleep 0.5
    done
    use_chroot && umount_proc "$ROOT"
    rm -f "$PIDFILE" "$HOME_DIR/epmd.pid"
    log "down"
}

broker_version_pkg() {
    if use_chroot; then as_root chroot "$ROOT" dpkg-query -W -f '${Version}' rabbitmq-server 2>/dev/null
    else dpkg-query -W -f '${Version}' rabbitmq-server 2>/dev/null; fi
}

cmd_status() {
    if [[ -n "${RMQS_TEST_URI:-}" ]]; then echo "external broker: RMQS_TEST_URI"; return 0; fi
    if [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null && running; then
        echo "running: RabbitMQ $(broker_version_pkg), pid $(cat "$PIDFILE"), stream 127.0.0.1:$STREAM_PORT, stream TLS 127.0.0.1:$TLS_PORT$(port_open "$TLS_PORT" || echo ' (not listening: restart)')"
    else
        echo "stopped"; return 3
    fi
}

# The host path of the tls folder (ca.pem, client.pem, client.key, ...); fails when `up` has not made it.
cmd_tls_dir() {
    tls_dir_host
    tls_ready || { log "no test certificates in $(tls_dir_host) yet: run $0 up"; return 1; }
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    restart) cmd_down; cmd_up ;;  # a real process restart (the fault-injection tests use it)
    status) cmd_status ;;
    tls-dir) cmd_tls_dir ;;
    ctl) shift; as_rabbit rabbitmqctl "$@" ;;
    streams) shift; as_rabbit rabbitmq-streams "$@" ;;
    plugins) shift; as_rabbit rabbitmq-plugins "$@" ;;
    *) echo "usage: $0 up|down|restart|status|tls-dir|ctl ARGS|streams ARGS|plugins ARGS" >&2; exit 2 ;;
esac
