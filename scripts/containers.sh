#!/usr/bin/env bash
# The container side of rmqs's tests (`make test-containers`): a Docker daemon and a local RabbitMQ image.
#   dockerd-up | dockerd-down | image | image-name
#
# No image registry is assumed reachable: the image `rmqs-rabbitmq:4.0` ($RMQS_CONTAINER_IMAGE) is
# built here, once per machine, from the Debian trixie root that scripts/broker.sh installs
# (`broker.sh install`: debootstrap + Debian's rabbitmq-server 4.0, cached in $RMQS_BROKER_HOME).
# That root is only read (tar), never changed; the broker's node folder, TLS material, apt caches
# and the Erlang cookie are left out. A small layer on top sets the user, the environment and the
# command, so that the image behaves like the official `rabbitmq` image for what pytest_rmqs needs:
# `rabbitmq-server` in the foreground, configured through RABBITMQ_* variables. The image carries a
# label with the hash of its recipe: a changed recipe rebuilds it, an unchanged one is reused.
#
# `dockerd-up` starts Debian's dockerd (installing docker.io when missing) when no daemon answers,
# and records its pid in $STATE/dockerd.pid; `dockerd-down` stops only a daemon that this script
# started. The daemon listens on its unix socket only; containers publish ports on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."

BROKER_HOME="${RMQS_BROKER_HOME:-/var/cache/rmqs-broker}"
ROOT="$BROKER_HOME/trixie"
IMAGE="${RMQS_CONTAINER_IMAGE:-rmqs-rabbitmq:4.0}"
STATE="${RMQS_CONTAINER_STATE:-/var/cache/rmqs-containers}"
APT_WAIT=(flock /run/rmqs-apt.lock apt-get -o DPkg::Lock::Timeout=600)

log() { printf 'containers: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
as_root() { if [[ $EUID -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

daemon_answers() { timeout 10 docker info >/dev/null 2>&1; }

cmd_dockerd_up() {
    if daemon_answers; then log "a Docker daemon answers: nothing to start"; return 0; fi
    if ! command -v dockerd >/dev/null; then
        log "installing Debian's docker.io (dockerd)"
        DEBIAN_FRONTEND=noninteractive as_root "${APT_WAIT[@]}" install -y --no-install-recommends docker.io >/dev/null \
            || die "apt-get install docker.io failed"
    fi
    command -v docker >/dev/null || die "no docker client on PATH (Debian's docker.io package brings one)"
    as_root mkdir -p "$STATE"
    log "starting dockerd (log: $STATE/dockerd.log)"
    # setsid: the daemon outlives this script and its terminal; stopped by `dockerd-down`.
    as_root setsid dockerd --host unix:///var/run/docker.sock --pidfile "$STATE/dockerd.pid" \
        >"$STATE/dockerd.log" 2>&1 </dev/null &
    local deadline=$((SECONDS + 60))
    until daemon_answers; do
        if (( SECONDS >= deadline )); then tail -20 "$STATE/dockerd.log" >&2 || true; die "dockerd did not answer within 60 s"; fi
        sleep 1
    done
    log "dockerd is up (pid $(cat "$STATE/dockerd.pid"))"
}

cmd_dockerd_down() {
    local pidfile="$STATE/dockerd.pid" pid
    if [[ ! -s $pidfile ]]; then log "no dockerd started by this script: nothing to stop"; return 0; fi
    pid="$(cat "$pidfile")"
    if ! kill -0 "$pid" 2>/dev/null; then log "dockerd (pid $pid) is not running"; as_root rm -f "$pidfile"; return 0; fi
    log "stopping dockerd (pid $pid)"
    as_root kill -TERM "$pid"
    local i; for ((i = 0; i < 60; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then die "dockerd (pid $pid) did not stop within 30 s"; fi
    as_root rm -f "$pidfile"
    log "dockerd stopped"
}

# The layer on top of the imported root: user, environment, command. Its text (and this script's
# exclusion list) is the recipe that the image's label hashes.
dockerfile() {
    cat <<'DOCKERFILE'
FROM rmqs-rabbitmq-root:4.0
# Only what the official image also does: guest may connect from outside the container (its
# published port), logs go to the console. Plugins and listeners come from the RABBITMQ_*
# variables pytest_rmqs sets (RABBITMQ_ENABLED_PLUGINS, RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS).
RUN mkdir -p /etc/rabbitmq /var/lib/rabbitmq/mnesia /var/log/rabbitmq \
 && printf 'loopback_users.guest = false\nlog.console = true\nlog.console.level = warning\nlog.file = false\n' > /etc/rabbitmq/rabbitmq.conf \
 && printf '[rabbitmq_stream].\n' > /etc/rabbitmq/enabled_plugins \
 && : > /etc/rabbitmq/rabbitmq-env.conf \
 && chown -R rabbitmq:rabbitmq /etc/rabbitmq /var/lib/rabbitmq /var/log/rabbitmq
ENV HOME=/var/lib/rabbitmq LANG=C.UTF-8 PATH=/usr/lib/rabbitmq/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    RABBITMQ_LOGS=- RABBITMQ_NODENAME=rabbit@localhost
USER rabbitmq
WORKDIR /var/lib/rabbitmq
EXPOSE 5552 5672
CMD ["rabbitmq-server"]
DOCKERFILE
}

# What of the broker root goes into the image: not the running broker's node folder, its TLS
# material, the cookie, logs, caches or documentation (paths as tar sees them under $ROOT).
# Mount points (/proc, /dev, /run, /tmp...) stay as empty folders.
EXCLUDES=('./proc/*' './sys/*' './dev/*' './run/*' './tmp/*' ./rmqs ./tls './var/cache/apt/*'
    './var/lib/apt/lists/*' ./usr/share/doc ./usr/share/man ./usr/share/locale
    ./var/lib/rabbitmq/.erlang.cookie './var/lib/rabbitmq/mnesia/*' './var/log/rabbitmq/*'
    ./etc/resolv.conf ./etc/hosts ./etc/hostname)

recipe_hash() { { dockerfile; printf '%s\n' "${EXCLUDES[@]}"; } | sha256sum | cut -c1-16; }

cmd_image() {
    daemon_answers || die "no Docker daemon answers: run $0 dockerd-up first"
    local want have
    want="$(recipe_hash)"
    have="$(docker image inspect -f '{{ index .Config.Labels "rmqs.recipe" }}' "$IMAGE" 2>/dev/null || true)"
    if [[ "$have" == "$want" ]]; then log "image $IMAGE is up to date (recipe $want)"; return 0; fi
    if [[ ! -x "$ROOT/usr/sbin/rabbitmq-server" ]]; then
        log "no broker root in $ROOT yet: installing it (scripts/broker.sh install)"
        RMQS_BROKER_MODE=chroot bash scripts/broker.sh install
    fi
    local started=$SECONDS
    log "building $IMAGE from $ROOT (read only)"
    local -a excl=(); local e; for e in "${EXCLUDES[@]}"; do excl+=("--exclude=$e"); done
    as_root tar -C "$ROOT" --one-file-system --numeric-owner "${excl[@]}" -cf - . \
        | docker import - rmqs-rabbitmq-root:4.0 >/dev/null || die "docker import of $ROOT failed"
    local ctx; ctx="$(mktemp -d)"
    dockerfile >"$ctx/Dockerfile"
    local out  # the legacy builder (no BuildKit in Debian 12's docker.io) warns that it is deprecated
    if ! out="$(DOCKER_BUILDKIT=0 docker build -q --label "rmqs.recipe=$want" -t "$IMAGE" "$ctx" 2>&1)"; then
        rm -rf "$ctx"; printf '%s\n' "$out" >&2; die "docker build of $IMAGE failed"
    fi
    rm -rf "$ctx"
    docker image rm rmqs-rabbitmq-root:4.0 >/dev/null 2>&1 || true
    log "built $IMAGE in $((SECONDS - started)) s ($(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%d MB", $1/1e6}'))"
}

case "${1:-}" in
    dockerd-up) cmd_dockerd_up ;;
    dockerd-down) cmd_dockerd_down ;;
    image) cmd_image ;;
    image-name) echo "$IMAGE" ;;
    *) echo "usage: $0 dockerd-up|dockerd-down|image|image-name" >&2; exit 2 ;;
esac
