#!/usr/bin/env bash
# A real local RabbitMQ 4.0 broker for rmqs:
#   up | down | restart | status | pids | tls-dir | install | ctl ARGS | streams ARGS | plugins ARGS
#
# Debian 13 hosts use the distribution's rabbitmq-server ("host mode"); its own systemd/init service
# is disabled and masked, this script alone starts and stops the broker. Debian 12 hosts (whose
# package is 3.10: no super streams, no StreamStats) run Debian trixie's package inside a
# debootstrap chroot ("chroot mode") that is kept in a machine-level cache ($RMQS_BROKER_HOME), so
# fresh clones reuse it. The host's libc is never touched. RMQS_BROKER_MODE=host|chroot forces a mode.
# Listens on loopback only: stream 5552, stream over TLS 5551, AMQP 5672, management 15672, epmd 4369
# (RMQS_STREAM_PORT, RMQS_STREAM_TLS_PORT, RMQS_AMQP_PORT, RMQS_MANAGEMENT_PORT, RMQS_EPMD_PORT; a
# second broker beside the default one needs its own RMQS_BROKER_HOME and all five).
# The broker runs as the service user `rabbitmq`, created by this script with a uid and gid that no
# host account or group uses (the first free one from $RMQS_BROKER_UID_BASE, default 65536); an older
# chroot whose user collides is moved to such a uid at the next `up`.
# `up` creates (once) a test CA, a server certificate for localhost / 127.0.0.1 and a client
# certificate in the tls folder (`tls-dir` prints its host path); they are for tests only.
# Every command exits 0 when it did its job and says what it did; otherwise it exits non-zero with a
# message (`status`: 3 when stopped). With RMQS_TEST_URI set, another broker is in use and this
# script starts nothing.
#
# A cluster: `up --nodes N` (N >= 2; `down`, `restart`, `status`, `pids` and `ctl` take it too, and
# otherwise use the count the last `up` recorded in $RMQS_BROKER_HOME/nodes) runs N nodes of the same
# installation, rabbit1@localhost .. rabbitN@localhost, on loopback. Node i listens on stream
# RMQS_STREAM_PORT+i-1 (5552-5554 for three), stream TLS RMQS_STREAM_TLS_PORT-(i-1) (5551-5549), AMQP
# RMQS_AMQP_PORT+i-1, management RMQS_MANAGEMENT_PORT+i-1, Erlang distribution RMQS_AMQP_PORT+20000+i-1,
# and advertises localhost and its own stream port (`stream.advertised_host` / `advertised_port`: the
# Metadata command names nodes by them). The nodes share one epmd, which the script starts on its own
# so that killing a node (`pids --node I`, then kill -9) leaves it running. `up` starts the nodes that
# are not running, so after a node was killed it brings that node back. `status` prints every node and,
# per stream of the default virtual host, its leader and replicas.
set -euo pipefail

HOME_DIR="${RMQS_BROKER_HOME:-/var/cache/rmqs-broker}"
MIRROR="${RMQS_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
STREAM_PORT="${RMQS_STREAM_PORT:-5552}"
TLS_PORT="${RMQS_STREAM_TLS_PORT:-5551}"
AMQP_PORT="${RMQS_AMQP_PORT:-5672}"
MGMT_PORT="${RMQS_MANAGEMENT_PORT:-15672}"
EPMD_PORT="${RMQS_EPMD_PORT:-4369}"
DIST_BASE=$((AMQP_PORT + 20000))  # Erlang distribution (RabbitMQ's default rule); CLI tools +10000
CTL_PORT_MIN=$((DIST_BASE + 10000))
UID_BASE="${RMQS_BROKER_UID_BASE:-65536}"
SERVICE_USER=rabbitmq
ROOT="$HOME_DIR/trixie"          # the chroot (chroot mode only)
NODES_FILE="$HOME_DIR/nodes"     # the node count of the last `up` (absent: one node)
NODES=""                         # --nodes N, else RMQS_BROKER_NODES, else NODES_FILE, else 1
NODE=""                          # the node functions work on: "" alone, 1..N in a cluster
ONLY_NODE=""                     # `pids --node I` / `ctl --node I`

log() { printf 'broker: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# shellcheck disable=SC1091
host_major() { local v; v="$(. /etc/os-release 2>/dev/null; echo "${VERSION_ID:-0}")"; echo "${v%%.*}"; }

case "${RMQS_BROKER_MODE:-}" in
    host | chroot) MODE="$RMQS_BROKER_MODE" ;;
    "") if [[ "$(host_major)" -ge 13 ]]; then MODE=host; else MODE=chroot; fi ;;
    *) die "RMQS_BROKER_MODE must be host or chroot, not '$RMQS_BROKER_MODE'" ;;
esac
use_chroot() { [[ $MODE == chroot ]]; }

# ---------------------------------------------------------------------------- nodes

clustered() { [[ -n "$NODE" ]]; }
node_offset() { if clustered; then echo $((NODE - 1)); else echo 0; fi; }
node_name() { if clustered; then echo "rabbit$NODE@localhost"; else echo rabbit@localhost; fi; }
node_short() { local n; n="$(node_name)"; echo "${n%@*}"; }
stream_port() { echo $((STREAM_PORT + $(node_offset))); }
tls_port() { echo $((TLS_PORT - $(node_offset))); }
amqp_port() { echo $((AMQP_PORT + $(node_offset))); }
mgmt_port() { echo $((MGMT_PORT + $(node_offset))); }
dist_port() { echo $((DIST_BASE + $(node_offset))); }
pidfile() { if clustered; then echo "$HOME_DIR/broker-$NODE.pid"; else echo "$HOME_DIR/broker.pid"; fi; }
logfile() { if clustered; then echo "$HOME_DIR/broker-$NODE.log"; else echo "$HOME_DIR/broker.log"; fi; }

recorded_nodes() { local n=1; if [[ -r "$NODES_FILE" ]]; then n="$(tr -dc 0-9 <"$NODES_FILE")"; fi; echo "${n:-1}"; }
# The node numbers to work on, one a line: an empty line (one node, the historical layout) or 1..N.
node_list() { if (( NODES > 1 )); then seq 1 "$NODES"; else echo ""; fi; }
# The same as an array, in NODE_LIST (a for loop over "$(node_list)" would skip the empty one).
load_nodes() { mapfile -t NODE_LIST < <(node_list); }

# The node directory as the broker sees it, and as the host sees it.
node_dir() {
    local d; if use_chroot; then d=/rmqs; else d="$HOME_DIR/node"; fi
    if clustered; then d="$d/node$NODE"; fi
    echo "$d"
}
node_dir_host() { if use_chroot; then echo "$ROOT$(node_dir)"; else node_dir; fi; }
# The test CA and certificates, as the broker sees them and as the host sees them.
tls_dir() { if use_chroot; then echo /tls; else echo "$HOME_DIR/tls"; fi; }
tls_dir_host() { if use_chroot; then echo "$ROOT/tls"; else echo "$HOME_DIR/tls"; fi; }
TLS_FILES=(ca.pem server.pem server.key client.pem client.key)

as_root() { if [[ $EUID -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

# `make test` installs Java and the broker at the same time: one apt-get at a time (the lock file is
# scripts/ensure_java.sh's too), and wait for a dpkg lock someone else holds rather than fail.
APT_WAIT=(flock /run/rmqs-apt.lock apt-get -o DPkg::Lock::Timeout=600)
apt_install() {
    DEBIAN_FRONTEND=noninteractive as_root "${APT_WAIT[@]}" install -y --no-install-recommends "$@" >/dev/null \
      || { as_root "${APT_WAIT[@]}" update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive \
           as_root "${APT_WAIT[@]}" install -y --no-install-recommends "$@" >/dev/null; }
}

broker_env() { # one VAR=value per line (values may hold spaces)
    local n p; n="$(node_dir)"; p="$(plugins_dir)"
    # HOME is the rabbitmq user's: Debian's CLI wrappers read the Erlang cookie from there.
    printf '%s\n' HOME=/var/lib/rabbitmq PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
        RABBITMQ_NODENAME="$(node_name)" ERL_EPMD_ADDRESS=127.0.0.1 ERL_EPMD_PORT="$EPMD_PORT" \
        RABBITMQ_DIST_PORT="$(dist_port)" RABBITMQ_CTL_DIST_PORT_MIN="$CTL_PORT_MIN" \
        RABBITMQ_CTL_DIST_PORT_MAX=$((CTL_PORT_MIN + 10)) \
        RABBITMQ_CONFIG_FILE="$n/rabbitmq.conf" \
        RABBITMQ_ENABLED_PLUGINS_FILE="$n/enabled_plugins" \
        RABBITMQ_PLUGINS_DIR="$p" \
        RABBITMQ_MNESIA_BASE="$n/mnesia" RABBITMQ_LOG_BASE="$n/log" \
        RABBITMQ_PID_FILE="$n/rabbit.pid" RABBITMQ_LOGS=- \
        RABBITMQ_ADVANCED_CONFIG_FILE="$n/advanced.config" \
        "RABBITMQ_CTL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}"
    # The last line: CLI tools (rabbitmqctl...) are Erlang nodes too; keep their listener on loopback.
    # RABBITMQ_CONFIG_FILE also marks our processes in host mode (see ours_pids).
}

plugins_dir() {
    local base=""; if use_chroot; then base="$ROOT"; fi
    local d
    d="$(printf '%s\n' "$base"/usr/lib/rabbitmq/lib/rabbitmq_server-*/plugins | sort -V | tail -1)" || true
    if [[ -d "$d" ]]; then echo "${d#"$base"}"; fi
}

# Run a command as the service user with the node's environment (never holding our lock).
as_rabbit() {
    local -a envs; mapfile -t envs < <(broker_env)
    if use_chroot; then
        as_root chroot --userspec="$SERVICE_USER:$SERVICE_USER" "$ROOT" env -i "${envs[@]}" "$@" 9>&-
    else
        as_root runuser -u "$SERVICE_USER" -- env -i "${envs[@]}" "$@" 9>&-
    fi
}

# ---------------------------------------------------------------------------- the service user

# uid:gid of a user as the broker's passwd sees it ("" when there is none).
id_of() {
    local passwd=/etc/passwd; if use_chroot; then passwd="$ROOT/etc/passwd"; fi
    [[ -r "$passwd" ]] || return 0
    awk -F: -v u="$1" '$1==u {print $3":"$4}' "$passwd"
}

service_ids() { # uid:gid of the service user; fails with a message when it does not exist
    local ids; ids="$(id_of "$SERVICE_USER")"
    [[ -n "$ids" ]] || die "there is no $SERVICE_USER user $(if use_chroot; then echo "in the chroot $ROOT"; else echo "on this host"; fi)"
    echo "$ids"
}

# The first n >= UID_BASE that is neither a uid nor a gid on the host (NSS included: `getent`) nor,
# when a root is given, in that root's /etc/passwd and /etc/group. Deterministic: the same files give
# the same answer. 65536 and up is the range Debian's adduser never allocates (and above systemd's
# dynamic users, 61184-65519); host accounts come from 0-59999.
free_id() {
    local root="${1:-}" n
    for ((n = UID_BASE; n < UID_BASE + 10000; n++)); do
        if getent passwd "$n" >/dev/null || getent group "$n" >/dev/null; then continue; fi
        if [[ -n "$root" ]] && awk -F: -v n="$n" '$3 == n {f = 1} END {exit !f}' "$root/etc/passwd" "$root/etc/group"; then
            continue
        fi
        echo "$n"; return 0
    done
    die "no free uid/gid in $UID_BASE..$((UID_BASE + 9999))"
}

# Why the chroot's service user must move (empty when it need not): its uid or gid is a host
# account's or group's, or lies where host accounts are allocated (below UID_BASE).
chroot_id_problem() {
    local uid="$1" gid="$2" who grp
    who="$(getent passwd "$uid")" || who=""
    grp="$(getent group "$gid")" || grp=""
    if [[ -n "$who" ]]; then echo "uid $uid is the host user ${who%%:*}'s"
    elif [[ -n "$grp" ]]; then echo "gid $gid is the host group ${grp%%:*}'s"
    elif (( uid < UID_BASE || gid < UID_BASE )); then echo "uid $uid / gid $gid lie below $UID_BASE, where host accounts are allocated"
    fi
    return 0
}

# Create the service user (and its group) with uid = gid = n, on the host or in the root $1.
create_service_user() {
    local root="$1" n="$2" out
    local -a in_root=(); if [[ -n "$root" ]]; then in_root=(chroot "$root"); fi
    # --system keeps useradd away from /etc/subuid; it warns that n is above SYS_UID_MAX: ignored.
    out="$(as_root "${in_root[@]}" groupadd --system --gid "$n" "$SERVICE_USER" 2>&1)" \
        || die "groupadd $SERVICE_USER failed: $out"
    out="$(as_root "${in_root[@]}" useradd --system --uid "$n" --gid "$n" --home-dir /var/lib/rabbitmq \
        --no-create-home --shell /usr/sbin/nologin --comment "RabbitMQ messaging server" "$SERVICE_USER" 2>&1)" \
        || die "useradd $SERVICE_USER failed: $out"
}

# Host mode: the service user exists before the package is installed (its postinst then keeps it).
ensure_host_user() {
    getent passwd "$SERVICE_USER" >/dev/null && return 0
    getent group "$SERVICE_USER" >/dev/null \
        && die "a $SERVICE_USER group exists but no $SERVICE_USER user: remove the group or create the user"
    local n; n="$(free_id "")"
    log "creating the service user $SERVICE_USER (uid $n, gid $n: no host account or group uses them)"
    create_service_user "" "$n"
}

# Chroot mode: move a service user whose uid/gid collides with the host's accounts to a free one,
# and every file in the chroot that the old uid/gid owned (node folder, cookie, logs, server key).
ensure_chroot_user() {
    local ids uid gid why n grp
    ids="$(service_ids)"; uid="${ids%%:*}"; gid="${ids#*:}"
    why="$(chroot_id_problem "$uid" "$gid")"
    [[ -z "$why" ]] && return 0
    grp="$(awk -F: -v g="$gid" '$3 == g {print $1}' "$ROOT/etc/group")"
    [[ "$grp" == "$SERVICE_USER" ]] || die "the chroot's $SERVICE_USER user has primary group '$grp', not $SERVICE_USER: rebuild the chroot (remove $ROOT)"
    n="$(free_id "$ROOT")"
    log "moving the chroot's $SERVICE_USER user from uid $uid / gid $gid to $n / $n ($why)"
    as_root chroot "$ROOT" groupmod --gid "$n" "$SERVICE_USER" || die "groupmod in $ROOT failed"
    as_root chroot "$ROOT" usermod --uid "$n" --gid "$n" "$SERVICE_USER" || die "usermod in $ROOT failed"
    as_root find "$ROOT" -xdev -uid "$uid" -exec chown -h "$n" {} + || die "chown in $ROOT failed"
    as_root find "$ROOT" -xdev -gid "$gid" -exec chgrp -h "$n" {} + || die "chgrp in $ROOT failed"
    log "moved: files of uid $uid / gid $gid in $ROOT now belong to $n / $n"
}

# ---------------------------------------------------------------------------- installation

install_chroot() {
    [[ -x "$ROOT/usr/sbin/rabbitmq-server" ]] && return 0
    # A second broker (the cluster test tier's, say) may copy an installed chroot instead of running
    # debootstrap: RMQS_BROKER_COPY_FROM=/var/cache/rmqs-broker/trixie. Its node data (/rmqs) stays out.
    local from="${RMQS_BROKER_COPY_FROM:-}"
    if [[ -n "$from" && -x "$from/usr/sbin/rabbitmq-server" && ! "$from" -ef "$ROOT" ]]; then
        log "copying the installed chroot $from to $ROOT"
        as_root rm -rf --one-file-system "$ROOT.partial"
        as_root cp -a --one-file-system "$from" "$ROOT.partial" || die "copying $from failed"
        as_root rm -rf --one-file-system "$ROOT.partial/rmqs"
        as_root mv "$ROOT.partial" "$ROOT"
        return 0
    fi
    command -v debootstrap >/dev/null || { log "installing debootstrap"; apt_install debootstrap; }
    local tmp="$ROOT.partial"
    if [[ -d "$tmp" ]]; then umount_proc "$tmp"; as_root rm -rf --one-file-system "$tmp"; fi
    log "creating a Debian trixie chroot in $ROOT (once per machine, ~1 min)"
    as_root debootstrap --variant=minbase trixie "$tmp" "$MIRROR" >"$HOME_DIR/debootstrap.log" 2>&1 \
        || die "debootstrap failed, see $HOME_DIR/debootstrap.log"
    # Maintainer scripts must not start services; localhost must resolve (epmd dies otherwise).
    printf '#!/bin/sh\nexit 101\n' | as_root tee "$tmp/usr/sbin/policy-rc.d" >/dev/null
    as_root chmod 755 "$tmp/usr/sbin/policy-rc.d"
    printf '127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n' | as_root tee "$tmp/etc/hosts" >/dev/null
    as_root cp /etc/resolv.conf "$tmp/etc/resolv.conf" 2>/dev/null || true
    # The service user first, with ids no host account uses (the package's postinst keeps it).
    local n; n="$(free_id "$tmp")"
    log "creating the chroot's service user $SERVICE_USER (uid $n, gid $n: no host or chroot account uses them)"
    create_service_user "$tmp" "$n"
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
    ensure_host_user
    if ! dpkg -s rabbitmq-server >/dev/null 2>&1; then
        log "installing rabbitmq-server from Debian $(host_major) (its own service stays off: this script runs the broker)"
        local added=0
        if [[ ! -e /usr/sbin/policy-rc.d ]]; then  # maintainer scripts must not start the service
            printf '#!/bin/sh\nexit 101\n' | as_root tee /usr/sbin/policy-rc.d >/dev/null
            as_root chmod 755 /usr/sbin/policy-rc.d; added=1
            trap 'as_root rm -f /usr/sbin/policy-rc.d' EXIT  # also when interrupted or failing
        fi
        if ! apt_install rabbitmq-server; then
            if [[ $added == 1 ]]; then as_root rm -f /usr/sbin/policy-rc.d; fi
            die "apt-get install rabbitmq-server failed"
        fi
        disable_distro_service
        if [[ $added == 1 ]]; then as_root rm -f /usr/sbin/policy-rc.d; trap - EXIT; fi
    fi
    disable_distro_service  # on every `up`: an upgrade or an admin may have turned it back on
}

# The distribution's rabbitmq-server service (node rabbit@<hostname>, /etc/rabbitmq, default ports)
# must never run beside, or instead of, the broker this script controls: stopped when running,
# disabled and masked for systemd, disabled for sysvinit. Idempotent and quiet when already so.
disable_distro_service() {
    local unit=rabbitmq-server.service link=/etc/systemd/system/rabbitmq-server.service did=()
    if [[ -d /run/systemd/system ]] && systemctl is-active --quiet "$unit" 2>/dev/null; then
        as_root systemctl stop "$unit" || die "could not stop the distribution's $unit"
        did+=(stopped)
    fi
    if [[ -e /etc/systemd/system/multi-user.target.wants/$unit ]]; then
        if command -v deb-systemd-helper >/dev/null; then as_root deb-systemd-helper disable "$unit" >/dev/null 2>&1 || true; fi
        as_root rm -f "/etc/systemd/system/multi-user.target.wants/$unit"
        did+=(disabled)
    fi
    if [[ "$(readlink "$link" 2>/dev/null || true)" != /dev/null ]]; then
        if [[ -e "$link" && ! -L "$link" ]]; then
            log "warning: $link is a local unit file; not masking it (disable it yourself)"
        else
            as_root mkdir -p /etc/systemd/system
            as_root ln -sfn /dev/null "$link"
            did+=(masked)
        fi
    fi
    local s; for s in /etc/rc[2-5].d/S[0-9][0-9]rabbitmq-server; do
        [[ -e "$s" ]] || continue
        as_root update-rc.d rabbitmq-server disable >/dev/null 2>&1 || as_root rm -f /etc/rc[2-5].d/S[0-9][0-9]rabbitmq-server
        did+=("disabled (sysvinit)"); break
    done
    if (( ${#did[@]} )); then
        if [[ -d /run/systemd/system ]]; then as_root systemctl daemon-reload || true; fi
        log "the distribution's rabbitmq-server service: ${did[*]} (this script alone runs the broker)"
    fi
    return 0
}

umount_proc() { local r="$1"; if mountpoint -q "$r/proc" 2>/dev/null; then as_root umount -l "$r/proc"; fi; }

# ---------------------------------------------------------------------------- TLS material

tls_ready() { local f; for f in "${TLS_FILES[@]}"; do [[ -s "$(tls_dir_host)/$f" ]] || return 1; done; }

gen_tls() { # into folder $1, which holds openssl.cnf
    local tmp="$1" who cn
    as_root openssl req -x509 -new -newkey rsa:2048 -nodes -sha256 -days 3650 -config "$tmp/openssl.cnf" \
        -extensions ca -subj "/CN=rmqs test CA" -keyout "$tmp/ca.key" -out "$tmp/ca.pem" || return 1
    for who in server client; do
        cn=localhost; if [[ $who == client ]]; then cn=rmqs-test-client; fi
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
    local ids; ids="$(service_ids)"
    as_root chown root:root "$dir" "$dir"/*
    as_root chmod 755 "$dir"
    as_root chmod 644 "$dir"/*.pem "$dir/client.key" "$dir/openssl.cnf"
    as_root chmod 600 "$dir/ca.key"
    as_root chown "root:${ids#*:}" "$dir/server.key"
    as_root chmod 640 "$dir/server.key"
}

write_config() {
    local n t ids; n="$(node_dir_host)"; t="$(tls_dir)"; ids="$(service_ids)"
    as_root mkdir -p "$n/mnesia" "$n/log"
    {
        cat <<CONF
listeners.tcp.1 = 127.0.0.1:$(amqp_port)
stream.listeners.tcp.1 = 127.0.0.1:$(stream_port)
stream.listeners.ssl.1 = 127.0.0.1:$(tls_port)
stream.advertised_host = localhost
stream.advertised_port = $(stream_port)
stream.advertised_tls_port = $(tls_port)
ssl_options.cacertfile = $t/ca.pem
ssl_options.certfile = $t/server.pem
ssl_options.keyfile = $t/server.key
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = false
management.tcp.ip = 127.0.0.1
management.tcp.port = $(mgmt_port)
loopback_users = none
log.console = true
log.console.level = warning
log.file = false
CONF
        if clustered; then
            # Every node knows the others: the first boot forms the cluster (peer discovery), later
            # boots rejoin it.
            echo "cluster_formation.peer_discovery_backend = classic_config"
            local i; for ((i = 1; i <= NODES; i++)); do
                echo "cluster_formation.classic_config.nodes.$i = rabbit$i@localhost"
            done
        fi
    } | as_root tee "$n/rabbitmq.conf" >/dev/null
    echo '[rabbitmq_management,rabbitmq_stream,rabbitmq_stream_management].' | as_root tee "$n/enabled_plugins" >/dev/null
    # Erlang distribution (CLI tools <-> node, node <-> node) on loopback only, like every other listener.
    echo '[{kernel, [{inet_dist_use_interface, {127,0,0,1}}]}].' | as_root tee "$n/advanced.config" >/dev/null
    as_root chown -R "$ids" "$n"
}

# ---------------------------------------------------------------------------- our processes

# Prints the pids of our processes, one a line, and never fails. chroot mode: every process whose
# root is the chroot (the broker, epmd, erl_child_setup, CLI tools...). host mode: every process
# whose root is ours and whose environment or command line holds this node's RABBITMQ_CONFIG_FILE
# (broker_env gives it to the broker, its epmd and the CLI tools; runuser has it in its arguments):
# neither another broker on this host nor one in a chroot (whose root differs) is ever taken for ours.
# Markers ($3...): when given, only processes whose environment or command line holds one of them,
# in either mode (one node of a cluster: its RABBITMQ_CONFIG_FILE). Runs in one `bash -c` as root:
# other users' /proc entries are readable by root only.
scan_pids() {
    local target="$1" p f; shift
    if (( $# == 0 )); then
        for p in /proc/[0-9]*; do
            if [[ "$p/root" -ef "$target" ]]; then echo "${p#/proc/}"; fi
        done
    else
        # The patterns come from a file, so that no command line here equals one (grep's would).
        grep -lsFzx -f <(printf '%s\n' "$@") /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null \
            | while IFS= read -r f; do
                p="${f%/*}"
                if [[ "$p/root" -ef "$target" ]]; then echo "${p#/proc/}"; fi
            done | sort -un
    fi
    return 0
}

# The environment entry that marks the processes of the node $NODE ("" alone) as ours.
node_marker() { echo "RABBITMQ_CONFIG_FILE=$(node_dir)/rabbitmq.conf"; }
# ... and the epmd a cluster shares (started by the script, not by a node: it outlives a killed node).
epmd_marker() { echo "RMQS_BROKER_EPMD=$HOME_DIR"; }

ours_pids() {
    local target=/; if use_chroot; then target="$ROOT"; fi
    [[ -d "$target" ]] || return 0
    local -a markers=()
    if [[ -n "$ONLY_NODE" ]]; then
        markers=("$(NODE="$ONLY_NODE" node_marker)")
    elif ! use_chroot; then
        local i NODE_LIST; load_nodes
        for i in "${NODE_LIST[@]}"; do markers+=("$(NODE="$i" node_marker)"); done
        if (( NODES > 1 )); then markers+=("$(epmd_marker)"); fi
    fi
    as_root bash -c "$(declare -f scan_pids); scan_pids \"\$@\"" scan_pids "$target" "${markers[@]}" || true
}

# The pids of node $1's processes (every node's when $1 is empty).
node_pids() { ONLY_NODE="$1" ours_pids; }

# The pids among $@ whose command is $1 (e.g. beam.smp, epmd).
pids_named() {
    local want="$1" p c; shift
    for p in "$@"; do
        c=""; read -r c <"/proc/$p/comm" 2>/dev/null || true
        if [[ "$c" == "$want" ]]; then echo "$p"; fi
    done
    return 0
}

running() { as_rabbit rabbitmqctl -q -n "$(node_name)" -t 5 await_startup >/dev/null 2>&1; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Node names registered with the epmd on 127.0.0.1:$EPMD_PORT (nothing when none listens): the
# NAMES_REQ of the epmd protocol (length 1, 'n'); the answer is epmd's port (4 bytes), then text.
# shellcheck disable=SC2016
epmd_names() {
    timeout 5 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" && printf "\000\001n" >&3 && tail -c +5 <&3' \
        epmd_names "$EPMD_PORT" 2>/dev/null | awk '$1 == "name" {print $2}' || true
}

lock() { exec 9>"$HOME_DIR/.lock"; flock 9; }

# shellcheck disable=SC2016
broker_version_pkg() {
    if use_chroot; then as_root chroot "$ROOT" dpkg-query -W -f '${Version}' rabbitmq-server 2>/dev/null || true
    else dpkg-query -W -f '${Version}' rabbitmq-server 2>/dev/null || true; fi
}

mode_text() {
    if use_chroot; then echo "chroot mode: Debian trixie's package in $ROOT"
    else echo "host mode: Debian $(host_major)'s package"; fi
}

# ---------------------------------------------------------------------------- commands

# The node count: --nodes, else RMQS_BROKER_NODES, else what the last `up` recorded, else 1.
resolve_nodes() {
    if [[ -z "$NODES" ]]; then NODES="${RMQS_BROKER_NODES:-}"; fi
    if [[ -z "$NODES" ]]; then NODES="$(recorded_nodes)"; fi
    [[ "$NODES" =~ ^[1-9][0-9]?$ ]] || die "--nodes must be a number of nodes from 1 to 99, not '$NODES'"
}

cmd_up() {
    if [[ -n "${RMQS_TEST_URI:-}" ]]; then log "RMQS_TEST_URI is set: using that broker, starting nothing"; return 0; fi
    as_root mkdir -p "$HOME_DIR"
    lock
    if use_chroot; then install_chroot; else install_host; fi
    local was; was="$(recorded_nodes)"
    if [[ "$was" != "$NODES" && -n "$(NODES=$was ours_pids)" ]]; then
        die "a broker of $was node(s) of ours runs in $HOME_DIR: run $0 down first (then up --nodes $NODES)"
    fi
    if use_chroot; then ensure_chroot_user; fi
    make_tls
    echo "$NODES" | as_root tee "$NODES_FILE" >/dev/null
    if use_chroot && ! mountpoint -q "$ROOT/proc"; then as_root mount -t proc proc "$ROOT/proc"; fi
    if (( NODES > 1 )); then start_epmd; fi
    local -a started=() NODE_LIST; load_nodes
    for NODE in "${NODE_LIST[@]}"; do
        if start_node; then started+=("$NODE"); fi
    done
    for NODE in "${started[@]}"; do await_node; done
    NODE=""
    if (( NODES > 1 )); then
        await_cluster
        log "up: $NODES nodes, stream 127.0.0.1:$STREAM_PORT-$((STREAM_PORT + NODES - 1)), management http://127.0.0.1:$MGMT_PORT (guest/guest), epmd :$EPMD_PORT"
    elif (( ${#started[@]} )); then
        log "up: stream 127.0.0.1:$STREAM_PORT, stream TLS 127.0.0.1:$TLS_PORT, amqp :$AMQP_PORT, management http://127.0.0.1:$MGMT_PORT (guest/guest), epmd :$EPMD_PORT"
    fi
    if (( ${#started[@]} )); then log "test CA: $(tls_dir_host)/ca.pem (client certificate: client.pem, client.key)"; fi
}

# A cluster's epmd, started once by the script (a node would start its own, which would then die with
# that node when a fault test kills it).
start_epmd() {
    if [[ -n "$(epmd_pids)" ]]; then return 0; fi
    if port_open "$EPMD_PORT"; then die "port $EPMD_PORT (epmd) is in use by something this script did not start: give this cluster its own RMQS_EPMD_PORT"; fi
    local -a envs=(HOME=/var/lib/rabbitmq PATH=/usr/sbin:/usr/bin:/sbin:/bin "$(epmd_marker)")
    if use_chroot; then
        as_root chroot --userspec="$SERVICE_USER:$SERVICE_USER" "$ROOT" env -i "${envs[@]}" \
            epmd -address 127.0.0.1 -port "$EPMD_PORT" -daemon 9>&- </dev/null
    else
        as_root runuser -u "$SERVICE_USER" -- env -i "${envs[@]}" \
            epmd -address 127.0.0.1 -port "$EPMD_PORT" -daemon 9>&- </dev/null
    fi
}

epmd_pids() {
    local target=/; if use_chroot; then target="$ROOT"; fi
    as_root bash -c "$(declare -f scan_pids); scan_pids \"\$@\"" scan_pids "$target" "$(epmd_marker)" || true
}

# Start node $NODE unless it runs; returns 1 when it was running already (0: started).
start_node() {
    local -a pids; mapfile -t pids < <(node_pids "$NODE")
    local what="the broker"; if clustered; then what="node $(node_name)"; fi
    if (( ${#pids[@]} )); then
        if running; then
            log "$what is already running ($(mode_text); pids ${pids[*]}): nothing to do"
            port_open "$(tls_port)" || log "no TLS listener on 127.0.0.1:$(tls_port): it was started with an older configuration; restart it with: $0 restart"
            if use_chroot; then
                local ids why; ids="$(service_ids)"; why="$(chroot_id_problem "${ids%%:*}" "${ids#*:}")"
                if [[ -n "$why" ]]; then log "warning: the broker runs as uid ${ids%%:*} and $why; $0 restart moves it to a free uid"; fi
            fi
            return 1
        fi
        if [[ -n "$(pids_named beam.smp "${pids[@]}")" ]]; then
            # A cluster node whose Erlang VM runs with the rabbit application stopped (seen after a
            # fault test killed another node while it booted): start the application again.
            if clustered && as_rabbit rabbitmqctl -q -n "$(node_name)" -t 10 eval 'rabbit_boot_state:get().' 2>/dev/null | grep -qx stopped; then
                log "$what runs with its rabbit application stopped: starting it"
                as_rabbit rabbitmqctl -q -n "$(node_name)" -t 120 start_app >/dev/null 2>&1 || true
                if running; then return 1; fi
            fi
            die "$what of ours is running but does not answer (pids ${pids[*]}, see $(logfile)): run $0 restart"
        fi
        # e.g. an epmd that a CLI call (`ctl`) started while the broker was down
        log "stopping processes of ours left over from an earlier run (no broker among them): ${pids[*]}"
        ONLY_NODE="$NODE" terminate_ours
    fi
    local port
    for port in "$(stream_port)" "$(tls_port)" "$(amqp_port)" "$(mgmt_port)" "$(dist_port)"; do
        if port_open "$port"; then die "port $port is in use by something this script did not start (set RMQS_TEST_URI to use another broker, or give this one other RMQS_*_PORT values)"; fi
    done
    if ! clustered && grep -qx "$(node_short)" <<<"$(epmd_names)"; then
        die "the epmd on 127.0.0.1:$EPMD_PORT already knows a node named $(node_short), from a broker this script did not start: give this one its own RMQS_EPMD_PORT"
    fi
    write_config
    if ! use_chroot && ! as_rabbit test -w "$(node_dir)/mnesia" 2>/dev/null; then
        die "the service user $SERVICE_USER cannot write $(node_dir): every folder above it must be searchable by that user (chmod o+x)"
    fi
    local ids; ids="$(service_ids)"
    log "starting RabbitMQ $(broker_version_pkg) ($(mode_text); user $SERVICE_USER, uid ${ids%%:*})$(if clustered; then echo " node $(node_name)"; fi) on 127.0.0.1:$(stream_port)"
    # setsid + closed lock fd: the broker must not hold our lock or terminal.
    local -a envs; mapfile -t envs < <(broker_env)
    if use_chroot; then
        setsid chroot --userspec="$SERVICE_USER:$SERVICE_USER" "$ROOT" env -i "${envs[@]}" \
            /usr/sbin/rabbitmq-server >"$(logfile)" 2>&1 9>&- </dev/null &
    else
        setsid runuser -u "$SERVICE_USER" -- env -i "${envs[@]}" \
            /usr/sbin/rabbitmq-server >"$(logfile)" 2>&1 9>&- </dev/null &
    fi
    echo "$!" | as_root tee "$(pidfile)" >/dev/null
    return 0
}

# Wait for node $NODE (started by start_node) to boot: 120 s for one node, 180 s in a cluster.
await_node() {
    local pid; pid="$(cat "$(pidfile)")"
    local limit=120; if clustered; then limit=180; fi
    local deadline=$((SECONDS + limit)) what="the broker"; if clustered; then what="node $(node_name)"; fi
    # The ports first: a bash check that costs nothing, and the listeners open only late in the boot;
    # then `running` (rabbitmqctl: an Erlang VM of its own, about 0.7 s of CPU a call) once or twice.
    until port_open "$(stream_port)" && port_open "$(tls_port)" && running; do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -30 "$(logfile)" >&2 || true; die "$what exited during boot, see $(logfile)"
        fi
        if (( SECONDS >= deadline )); then tail -30 "$(logfile)" >&2 || true; die "$what did not boot within $limit s, see $(logfile)"; fi
        sleep 1
    done
    if clustered; then log "node $(node_name) is up: stream 127.0.0.1:$(stream_port), stream TLS :$(tls_port), amqp :$(amqp_port), management :$(mgmt_port)"; fi
}

# The nodes rabbit1@localhost sees running (one a line).
running_nodes() {
    NODE=1 as_rabbit rabbitmqctl -q -n rabbit1@localhost -t 10 eval \
        'io:format("~s~n", [string:join([atom_to_list(N) || N <- rabbit_nodes:list_running()], "\n")]).' 2>/dev/null \
        | grep '@' || true
}

# Every node in one cluster: peer discovery forms it at the first boot; a node that booted alone
# (its data from another cluster, say) is joined to rabbit1 here.
await_cluster() {
    local deadline=$((SECONDS + 60)) i
    while true; do
        local -a up; mapfile -t up < <(running_nodes)
        (( ${#up[@]} >= NODES )) && return 0
        if (( SECONDS >= deadline )); then
            for ((i = 2; i <= NODES; i++)); do
                if ! printf '%s\n' "${up[@]}" | grep -qx "rabbit$i@localhost"; then
                    log "joining rabbit$i@localhost to rabbit1@localhost"
                    NODE=$i as_rabbit rabbitmqctl -q -n "rabbit$i@localhost" stop_app >/dev/null
                    NODE=$i as_rabbit rabbitmqctl -q -n "rabbit$i@localhost" join_cluster rabbit1@localhost >/dev/null \
                        || die "rabbit$i@localhost could not join rabbit1@localhost, see $(NODE=$i logfile)"
                    NODE=$i as_rabbit rabbitmqctl -q -n "rabbit$i@localhost" start_app >/dev/null
                fi
            done
            mapfile -t up < <(running_nodes)
            (( ${#up[@]} >= NODES )) && return 0
            die "the cluster has ${#up[@]} running node(s) of $NODES (${up[*]}), see $HOME_DIR/broker-*.log"
        fi
        sleep 1
    done
}

# SIGTERM to every process of ours still there (epmd, a node that did not stop), SIGKILL after 10 s;
# fails when one survives. Only node $ONLY_NODE's when set.
terminate_ours() {
    local -a left; local sig i
    for sig in TERM KILL; do
        mapfile -t left < <(ours_pids)
        (( ${#left[@]} )) || break
        log "sending SIG$sig to ${left[*]}"
        as_root kill -s "$sig" "${left[@]}" 2>/dev/null || true
        for ((i = 0; i < 40; i++)); do
            mapfile -t left < <(ours_pids)
            (( ${#left[@]} )) || break
            sleep 0.25
        done
    done
    mapfile -t left < <(ours_pids)
    (( ${#left[@]} == 0 )) || die "processes of ours survived SIGKILL: ${left[*]}"
}

cmd_down() {
    if [[ -n "${RMQS_TEST_URI:-}" ]]; then log "RMQS_TEST_URI is set: nothing to stop"; return 0; fi
    if [[ ! -d "$HOME_DIR" ]] || { use_chroot && [[ ! -d "$ROOT" ]]; }; then
        log "down: no broker installed in $HOME_DIR, nothing to stop"; return 0
    fi
    lock
    local -a pids left; mapfile -t pids < <(ours_pids)
    if (( ${#pids[@]} == 0 )); then
        if use_chroot; then umount_proc "$ROOT"; fi
        local -a NODE_LIST; load_nodes
        for NODE in "${NODE_LIST[@]}"; do as_root rm -f "$(pidfile)"; done; NODE=""
        log "down: no broker process of ours was running ($(mode_text)), nothing to stop"
        return 0
    fi
    log "stopping RabbitMQ$(if (( NODES > 1 )); then echo " ($NODES nodes)"; fi) (pids ${pids[*]})"
    local i
    # A cluster stops its last node first and rabbit1 last: the next `up` boots them together anyway.
    local -a NODE_LIST; mapfile -t NODE_LIST < <(node_list | sort -rn)
    for NODE in "${NODE_LIST[@]}"; do
        local -a mine; mapfile -t mine < <(node_pids "$NODE")
        if [[ -n "$(pids_named beam.smp "${mine[@]}")" ]]; then
            as_rabbit rabbitmqctl -q -n "$(node_name)" -t 30 stop >/dev/null 2>&1 || log "rabbitmqctl stop $(node_name) failed: terminating the processes instead"
            for ((i = 0; i < 60; i++)); do  # the node exits a moment after `stop` returns
                mapfile -t left < <(node_pids "$NODE")
                if [[ -z "$(pids_named beam.smp "${left[@]}")" ]]; then break; fi
                sleep 0.25
            done
        fi
        as_root rm -f "$(pidfile)"
    done
    NODE=""
    terminate_ours
    if use_chroot; then umount_proc "$ROOT"; fi
    log "down: stopped pids ${pids[*]}; no broker or epmd process of ours is left"
}

cmd_status() {
    if [[ -n "${RMQS_TEST_URI:-}" ]]; then echo "external broker: RMQS_TEST_URI is set, this script manages nothing"; return 0; fi
    local -a pids; mapfile -t pids < <(ours_pids)
    if (( ${#pids[@]} == 0 )); then
        echo "stopped: no broker process of ours is running ($(mode_text), $HOME_DIR)"; return 3
    fi
    local beam; beam="$(pids_named beam.smp "${pids[@]}" | xargs)"
    if [[ -z "$beam" ]]; then
        echo "stopped: no broker of ours is running ($(mode_text), $HOME_DIR); left over: pids ${pids[*]} ($0 down stops them)"
        return 3
    fi
    if (( NODES > 1 )); then cluster_status; return; fi
    if running; then
        echo "running: RabbitMQ $(broker_version_pkg) ($(mode_text)), pid $beam, stream 127.0.0.1:$STREAM_PORT, stream TLS 127.0.0.1:$TLS_PORT$(port_open "$TLS_PORT" || echo ' (not listening: restart)')"
        return 0
    fi
    echo "not answering: processes of ours run (pids ${pids[*]}) but the node does not answer; see $(logfile) or run $0 restart"
    return 1
}

# A cluster's status: one line per node, then per stream of the default virtual host its leader and
# replicas (asked from the first node that answers). Exit 0 when every node runs, 1 otherwise.
cluster_status() {
    local ok=0 asker="" state beam
    echo "cluster of $NODES nodes: RabbitMQ $(broker_version_pkg) ($(mode_text), $HOME_DIR)"
    local -a NODE_LIST; load_nodes
    for NODE in "${NODE_LIST[@]}"; do
        local -a mine; mapfile -t mine < <(node_pids "$NODE")
        beam="$(pids_named beam.smp "${mine[@]}" | xargs)"
        if [[ -z "$beam" ]]; then state="stopped"; ok=1
        elif running; then state="running, pid $beam"; asker="${asker:-$NODE}"
        else state="not answering (pids ${mine[*]})"; ok=1; fi
        echo "node $(node_name): $state, stream 127.0.0.1:$(stream_port), stream TLS :$(tls_port), amqp :$(amqp_port), management :$(mgmt_port)"
    done
    NODE=""
    if [[ -z "$asker" ]]; then return 1; fi
    local out
    out="$(NODE=$asker as_rabbit rabbitmqctl -q -n "rabbit$asker@localhost" -t 20 list_queues \
        --no-table-headers name type leader members 2>/dev/null)" || { echo "streams: rabbit$asker@localhost did not list them"; return 1; }
    # rabbitmqctl prints members as [rabbit1@localhost, rabbit2@localhost]; replicas are the others.
    awk -F'\t' '$2 == "stream" {
            n++; members = $4; gsub(/[][ ]/, "", members); split(members, m, ",")
            replicas = ""; for (i in m) if (m[i] != $3) replicas = replicas (replicas == "" ? "" : " ") m[i]
            printf "stream %s: leader %s, replicas %s\n", $1, $3, (replicas == "" ? "(none)" : replicas)
        }
        END { if (!n) print "streams: none in virtual host /" }' <<<"$out"
    return "$ok"
}

# The host path of the tls folder (ca.pem, client.pem, client.key, ...); fails when `up` has not made it.
cmd_tls_dir() {
    tls_dir_host
    tls_ready || { log "no test certificates in $(tls_dir_host) yet: run $0 up"; return 1; }
}

# Install without starting: the package (host mode) or the chroot (chroot mode). scripts/containers.sh
# builds its image from the chroot (RMQS_BROKER_MODE=chroot on any host).
cmd_install() {
    as_root mkdir -p "$HOME_DIR"
    lock
    if use_chroot; then install_chroot; else install_host; fi
    log "installed: RabbitMQ $(broker_version_pkg) ($(mode_text)); nothing started"
}

CMD="${1:-}"; if (( $# )); then shift; fi
ARGS=()
while (( $# )); do
    case "$1" in
        --nodes) NODES="${2:-}"; shift 2 || die "--nodes needs a number" ;;
        --nodes=*) NODES="${1#--nodes=}"; shift ;;
        --node) ONLY_NODE="${2:-}"; shift 2 || die "--node needs a node number" ;;
        --node=*) ONLY_NODE="${1#--node=}"; shift ;;
        *) ARGS=("$@"); break ;;
    esac
done
resolve_nodes
if [[ -n "$ONLY_NODE" ]] && ! { [[ "$ONLY_NODE" =~ ^[0-9]+$ ]] && (( ONLY_NODE >= 1 && ONLY_NODE <= NODES && NODES > 1 )); }; then
    die "--node must be a node number from 1 to $NODES of a cluster (up --nodes N), not '$ONLY_NODE'"
fi
# ctl/streams/plugins talk to one node: --node I, else the first.
if [[ -n "$ONLY_NODE" ]]; then NODE="$ONLY_NODE"; elif (( NODES > 1 )); then NODE=1; fi
case "$CMD" in
    up) NODE=""; cmd_up ;;
    install) NODE=""; cmd_install ;;
    down) NODE=""; cmd_down ;;
    restart) NODE=""; cmd_down; cmd_up ;;  # a real process restart (the fault-injection tests use it)
    status) NODE=""; cmd_status ;;
    pids) ours_pids ;;
    tls-dir) cmd_tls_dir ;;
    ctl) as_rabbit rabbitmqctl -n "$(node_name)" "${ARGS[@]}" ;;
    streams) as_rabbit rabbitmq-streams -n "$(node_name)" "${ARGS[@]}" ;;
    plugins) as_rabbit rabbitmq-plugins -n "$(node_name)" "${ARGS[@]}" ;;
    *) echo "usage: $0 up|down|restart|status|pids|tls-dir|install|ctl ARGS|streams ARGS|plugins ARGS [--nodes N] [--node I]" >&2; exit 2 ;;
esac
