#!/usr/bin/env bash
# A real local RabbitMQ 4.0 broker for rmqs: up | down | status | ctl ARGS | streams ARGS
#
# Debian 13 hosts use the distribution's rabbitmq-server. Debian 12 hosts (whose package is 3.10:
# no super streams, no StreamStats) run Debian trixie's package inside a debootstrap chroot that is
# kept in a machine-level cache ($RMQS_BROKER_HOME), so fresh clones reuse it. The host's libc is
# never touched. Listens on loopback only: stream 5552, AMQP 5672, management 15672.
# With RMQS_TEST_URI set, another broker is in use and this script starts nothing.
set -euo pipefail

HOME_DIR="${RMQS_BROKER_HOME:-/var/cache/rmqs-broker}"
MIRROR="${RMQS_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
STREAM_PORT="${RMQS_STREAM_PORT:-5552}"
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

as_root() { if [[ $EUID -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

apt_install() {
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y --no-install-recommends "$@" >/dev/null \
      || { as_root apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive \
           as_root apt-get install -y --no-install-recommends "$@" >/dev/null; }
}

broker_env() {
    local n; n="$(node_dir)"
    # HOME is the rabbitmq user's: Debian's CLI wrappers read the Erlang cookie from there.
    echo HOME=/var/lib/rabbitmq PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
        RABBITMQ_NODENAME=rabbit@localhost ERL_EPMD_ADDRESS=127.0.0.1 \
        RABBITMQ_CONFIG_FILE="$n/rabbitmq.conf" \
        RABBITMQ_ENABLED_PLUGINS_FILE="$n/enabled_plugins" \
        RABBITMQ_PLUGINS_DIR="$(plugins_dir)" \
        RABBITMQ_MNESIA_BASE="$n/mnesia" RABBITMQ_LOG_BASE="$n/log" \
        RABBITMQ_PID_FILE="$n/rabbit.pid" RABBITMQ_LOGS=- \
        RABBITMQ_ADVANCED_CONFIG_FILE="$n/advanced.config"
}

plugins_dir() {
    local base=""; use_chroot && base="$ROOT"
    local d; d="$(ls -d "$base"/usr/lib/rabbitmq/lib/rabbitmq_server-*/plugins 2>/dev/null | sort -V | tail -1)"
    echo "${d#"$base"}"
}

# Run a command as the rabbitmq user with the node's environment.
as_rabbit() {
    # shellcheck disable=SC2046
    if use_chroot; then
        as_root chroot --userspec=rabbitmq:rabbitmq "$ROOT" env -i $(broker_env) "$@"
    else
        as_root runuser -u rabbitmq -- env -i $(broker_env) "$@"
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

write_config() {
    local n; n="$(node_dir_host)"
    as_root mkdir -p "$n/mnesia" "$n/log"
    cat <<CONF | as_root tee "$n/rabbitmq.conf" >/dev/null
listeners.tcp.1 = 127.0.0.1:$AMQP_PORT
stream.listeners.tcp.1 = 127.0.0.1:$STREAM_PORT
stream.advertised_host = localhost
stream.advertised_port = $STREAM_PORT
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
    if [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null && running; then
        log "already running (pid $(cat "$PIDFILE"))"; return 0
    fi
    if port_open "$STREAM_PORT"; then die "port $STREAM_PORT is in use by a broker this script did not start (set RMQS_TEST_URI to use it)"; fi
    write_config
    use_chroot && { mountpoint -q "$ROOT/proc" || as_root mount -t proc proc "$ROOT/proc"; }
    log "starting RabbitMQ ($(broker_version_pkg)) on 127.0.0.1:$STREAM_PORT"
    # setsid + closed lock fd: the broker must not hold our lock or terminal.
    # shellcheck disable=SC2046
    if use_chroot; then
        setsid chroot --userspec=rabbitmq:rabbitmq "$ROOT" env -i $(broker_env) \
            /usr/sbin/rabbitmq-server >"$LOG" 2>&1 9>&- </dev/null &
    else
        setsid runuser -u rabbitmq -- env -i $(broker_env) \
            /usr/sbin/rabbitmq-server >"$LOG" 2>&1 9>&- </dev/null &
    fi
    echo $! >"$PIDFILE"
    local deadline=$((SECONDS + 120))
    until as_rabbit rabbitmqctl -q -t 10 await_startup >/dev/null 2>&1 && port_open "$STREAM_PORT"; do
        if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then tail -30 "$LOG" >&2; die "the broker exited during boot, see $LOG"; fi
        (( SECONDS < deadline )) || { tail -30 "$LOG" >&2; die "the broker did not boot within 120 s, see $LOG"; }
        sleep 1
    done
    if ! use_chroot; then pgrep -x epmd -u rabbitmq >"$HOME_DIR/epmd.pid" 2>/dev/null || true; fi
    log "up: stream 127.0.0.1:$STREAM_PORT, amqp :$AMQP_PORT, management http://127.0.0.1:$MGMT_PORT (guest/guest)"
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
        echo "running: RabbitMQ $(broker_version_pkg), pid $(cat "$PIDFILE"), stream 127.0.0.1:$STREAM_PORT"
    else
        echo "stopped"; return 3
    fi
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    ctl) shift; as_rabbit rabbitmqctl "$@" ;;
    streams) shift; as_rabbit rabbitmq-streams "$@" ;;
    plugins) shift; as_rabbit rabbitmq-plugins "$@" ;;
    *) echo "usage: $0 up|down|status|ctl ARGS|streams ARGS|plugins ARGS" >&2; exit 2 ;;
esac
