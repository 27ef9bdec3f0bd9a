#!/usr/bin/env bash
# `make check-debian13`: the Debian 13 path of scripts/broker.sh ("host mode"), checked on any Debian
# machine. A minimal Debian trixie root made once with debootstrap (cached in $RMQS_CHECK_HOME, default
# /var/cache/rmqs-check-debian13) stands in for a Debian 13 host: each run mounts a throwaway overlay
# over it, copies in the machine's CA certificates and this working tree (tracked and untracked, not
# ignored files), and inside it runs `make setup`, then `scripts/broker.sh` status / down / up / status /
# up / restart / status, a smoke subset of the tests, down / status / down, asserting exit codes, that
# the script chose host mode, that the distribution's rabbitmq-server service is disabled and masked,
# that the broker runs as a service user whose uid no host account uses, and that no beam or epmd
# process is left after `down`. The root shares this machine's network, so its broker listens on
# other ports (stream 5702, TLS 5701, AMQP 5700, management 15700, epmd 4370) than the default one.
# Needs root (debootstrap, chroot, mounts). Downloads: the trixie base, rabbitmq-server, a JRE
# (`make setup` installs one) and the Python packages; the .deb files and uv's cache are kept in
# $RMQS_CHECK_HOME for the next run. The last run's root stays in $RMQS_CHECK_HOME/run for inspection.
# `scripts/check_debian13.sh base` only builds the cached base root.
#
# `scripts/check_debian13.sh tests PYTEST_ARGS...` is the Java 21 end of `make test-compat`
# (scripts/compat.py): in the same throwaway root, `make setup` (Debian 13's Python 3.13 and the JRE
# scripts/ensure_java.sh installs there, OpenJDK 21: this machine's own is 17), then pytest with
# PYTEST_ARGS against this machine's broker (RMQS_TEST_URI, default the suite's 127.0.0.1:5552: the
# root shares the network). No broker is installed in the root. uv's cache is this machine's
# (`uv cache dir`), so the packages `make setup` already downloaded here are not fetched again.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${RMQS_CHECK_HOME:-/var/cache/rmqs-check-debian13}"
MIRROR="${RMQS_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
BASE="$CACHE/base"   # debootstrap --variant=minbase trixie + python3, python3-venv, make (cached)
RUN="$CACHE/run"     # this run: overlay upper/work dirs, the merged root, logs
R="$RUN/root"
LOGS="$RUN/logs"
STREAM_PORT=5702 TLS_PORT=5701 AMQP_PORT=5700 MGMT_PORT=15700 EPMD_PORT=4370
SMOKE_TESTS=(tests/integration/test_broker_layer.py)  # the broker layer: a real broker, no Spark
UV_CACHE="$CACHE/uv-cache"
CHECKS=0

say() { printf 'check-debian13: %s\n' "$*" >&2; }
die() { say "FAILED: $*"; exit 1; }
ok() { CHECKS=$((CHECKS + 1)); say "ok: $*"; }

[[ $EUID -eq 0 ]] || die "run as root (debootstrap, chroot and mounts)"

# ------------------------------------------------------------------------------------ the base root

build_base() {
    [[ -f "$BASE/.rmqs-base-ready" ]] && return 0
    command -v debootstrap >/dev/null || { say "installing debootstrap"; apt-get install -y -q debootstrap >/dev/null; }
    local tmp="$BASE.partial"
    rm -rf --one-file-system "$tmp"
    mkdir -p "$CACHE"
    say "creating a Debian trixie root in $BASE (once, a few minutes; log: $CACHE/debootstrap.log)"
    debootstrap --variant=minbase --include=python3,python3-venv,make trixie "$tmp" "$MIRROR" \
        >"$CACHE/debootstrap.log" 2>&1 || { tail -20 "$CACHE/debootstrap.log" >&2; die "debootstrap failed"; }
    printf '127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n' >"$tmp/etc/hosts"
    touch "$tmp/.rmqs-base-ready"
    mv "$tmp" "$BASE"
}

# ------------------------------------------------------------------------------------ one run's root

MOUNTS=()  # mounted by this run, unmounted in reverse order on exit

mount_() { mount "$@"; MOUNTS+=("${*: -1}"); }

# Processes whose root is the run's root: what the check started in there.
root_pids() {
    local p
    [[ -d "$R" ]] || return 0
    for p in /proc/[0-9]*; do
        if [[ "$p/root" -ef "$R" ]]; then echo "${p#/proc/}"; fi
    done
    return 0
}

cleanup() {
    local rc=$? pids i
    if [[ -d "$R/work/rmqs" ]] && [[ -n "$(root_pids)" ]]; then
        say "cleanup: stopping what is left in the root"
        in_root "bash scripts/broker.sh down" >>"$LOGS/cleanup.log" 2>&1 || true
        for i in 1 2; do
            mapfile -t pids < <(root_pids)
            (( ${#pids[@]} )) || break
            kill -9 "${pids[@]}" 2>/dev/null || true
            sleep 1
        done
    fi
    for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
        umount "${MOUNTS[i]}" 2>/dev/null || umount -l "${MOUNTS[i]}" 2>/dev/null || true
    done
    if (( rc == 0 )); then say "PASSED: $CHECKS checks (logs: $LOGS)"; else say "logs: $LOGS"; fi
}

prepare_run() {
    local m
    # A previous run interrupted hard may have left mounts: only ones under $RUN, innermost first.
    while read -r m; do umount -l "$m" 2>/dev/null || true; done \
        < <(awk -v r="$RUN/" 'index($2, r) == 1 {print $2}' /proc/self/mounts | sort -r)
    rm -rf --one-file-system "$RUN"
    mkdir -p "$RUN/upper" "$RUN/work" "$R" "$LOGS" "$CACHE/apt-archives/partial" "$UV_CACHE"
    trap cleanup EXIT
    mount_ -t overlay overlay -o "lowerdir=$BASE,upperdir=$RUN/upper,workdir=$RUN/work" "$R"
    mount_ -t proc proc "$R/proc"
    mount_ --bind /dev "$R/dev"
    mount_ --bind /dev/pts "$R/dev/pts"
    mount_ -t tmpfs -o mode=1777 tmpfs "$R/dev/shm"
    mkdir -p "$R/var/cache/apt/archives" "$R/root/.cache/uv"
    mount_ --bind "$CACHE/apt-archives" "$R/var/cache/apt/archives"
    mount_ --bind "$UV_CACHE" "$R/root/.cache/uv"
    # The machine's CA certificates (TLS may be intercepted on the way to PyPI), dereferenced; the
    # local ones too, so that update-ca-certificates in the root (a JRE install runs it) keeps them.
    mkdir -p "$R/etc/ssl/certs" "$R/usr/local/share/ca-certificates"
    cp -rL /etc/ssl/certs/. "$R/etc/ssl/certs/" 2>/dev/null || true
    if [[ -d /usr/local/share/ca-certificates ]]; then cp -rL /usr/local/share/ca-certificates/. "$R/usr/local/share/ca-certificates/"; fi
    cp /etc/resolv.conf "$R/etc/resolv.conf" 2>/dev/null || true
    # This working tree, without the host's .venv and caches.
    mkdir -p "$R/work/rmqs"
    git -C "$REPO" ls-files -z --cached --others --exclude-standard \
        | (cd "$REPO" && tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -C "$R/work/rmqs" -xf -
    [[ -f "$R/work/rmqs/scripts/broker.sh" ]] || die "copying the working tree into the root failed"
}

# Run a shell command in the root, in the repository, with a clean environment and our ports
# (and ROOT_ENV: NAME=value words the tests mode adds, kept out of the commands it prints).
ROOT_ENV=()
in_root() {
    chroot "$R" env -i "${ROOT_ENV[@]}" HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        LANG=C.UTF-8 TERM=dumb DEBIAN_FRONTEND=noninteractive \
        SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
        REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
        RMQS_STREAM_PORT="$STREAM_PORT" RMQS_STREAM_TLS_PORT="$TLS_PORT" RMQS_AMQP_PORT="$AMQP_PORT" \
        RMQS_MANAGEMENT_PORT="$MGMT_PORT" RMQS_EPMD_PORT="$EPMD_PORT" \
        bash -c "cd /work/rmqs && $1"
}

# step NAME EXPECTED_RC COMMAND [PATTERN]: run COMMAND in the root; its exit code must be EXPECTED_RC
# and its output (stdout and stderr) must match the extended regex PATTERN when given.
OUT=""
step() {
    local name="$1" want="$2" cmd="$3" pattern="${4:-}" rc=0 t0=$SECONDS
    say "running: $cmd"
    in_root "$cmd" >"$LOGS/$name.log" 2>&1 || rc=$?
    OUT="$(cat "$LOGS/$name.log")"
    sed 's/^/    | /' "$LOGS/$name.log" | tail -n 12 >&2
    [[ $rc == "$want" ]] || die "$cmd: exit code $rc, expected $want (full output: $LOGS/$name.log)"
    if [[ -n "$pattern" ]] && ! grep -Eq "$pattern" <<<"$OUT"; then
        die "$cmd: output does not match /$pattern/ (full output: $LOGS/$name.log)"
    fi
    ok "$cmd -> exit $rc ($((SECONDS - t0)) s)"
}

# ------------------------------------------------------------------------------------ assertions

broker_uid() { awk -F: '$1 == "rabbitmq" {print $3}' "$R/etc/passwd"; }

assert_host_mode() {
    [[ -x "$R/usr/sbin/rabbitmq-server" ]] || die "rabbitmq-server is not installed in the root itself"
    [[ ! -e "$R/var/cache/rmqs-broker/trixie" ]] || die "the script built a chroot: it did not pick host mode"
    ok "host mode: the distribution's rabbitmq-server is installed in the root, no chroot was built"
}

assert_service_off() {
    local unit=rabbitmq-server.service s
    [[ "$(readlink "$R/etc/systemd/system/$unit" || true)" == /dev/null ]] || die "$unit is not masked"
    [[ ! -e "$R/etc/systemd/system/multi-user.target.wants/$unit" ]] || die "$unit is enabled"
    for s in "$R"/etc/rc[2-5].d/S[0-9][0-9]rabbitmq-server; do
        [[ -e "$s" ]] && die "the sysvinit service is enabled: ${s#"$R"}"
    done
    [[ ! -e "$R/usr/sbin/policy-rc.d" ]] || die "the install left /usr/sbin/policy-rc.d behind"
    ok "the distribution's service is masked and disabled (systemd and sysvinit), policy-rc.d removed"
}

assert_broker_user() {
    local uid p comm n=0 who
    uid="$(broker_uid)"
    [[ -n "$uid" ]] || die "no rabbitmq user in the root"
    (( uid >= 65536 )) || die "the rabbitmq user has uid $uid, below 65536"
    who="$(getent passwd "$uid")" || who=""
    [[ -z "$who" ]] || die "uid $uid of the root's rabbitmq user is this machine's user ${who%%:*}"
    for p in $(root_pids); do
        comm="$(cat "/proc/$p/comm" 2>/dev/null)" || continue
        [[ $comm == beam.smp || $comm == epmd ]] || continue
        read -r _ a b c d < <(grep '^Uid:' "/proc/$p/status") || continue
        [[ "$a $b $c $d" == "$uid $uid $uid $uid" ]] || die "$comm (pid $p) runs as uid $a/$b/$c/$d, not $uid"
        n=$((n + 1))
    done
    (( n >= 2 )) || die "expected a beam.smp and an epmd in the root, found $n"
    ok "beam.smp and epmd run as the script's rabbitmq user (uid $uid), which no account of this machine has"
}

assert_nothing_left() {
    local p comm state left=()
    for p in $(root_pids); do
        comm="$(cat "/proc/$p/comm" 2>/dev/null)" || continue
        state="$(awk '/^State:/ {print $2}' "/proc/$p/status" 2>/dev/null)" || continue
        [[ $state == Z ]] && continue  # exited, not yet reaped
        case "$comm" in beam.smp | epmd | erl_child_setup | inet_gethost | rabbitmq-server) left+=("$comm:$p") ;; esac
    done
    (( ${#left[@]} == 0 )) || die "left after down: ${left[*]}"
    ok "no beam, epmd or other broker process is left in the root"
}

# ------------------------------------------------------------------------------------ the tests mode

# The Java 21 end of the compatibility tier: `make setup` in the root, then pytest "$@" against this
# machine's broker. Prints "check-debian13: versions: Java X, Python Y" for scripts/compat.py's table.
run_tests() {
    local host_uv versions java_major
    host_uv="$REPO/.venv/bin/uv"
    if [[ -x "$host_uv" ]]; then UV_CACHE="$("$host_uv" cache dir)"; fi
    prepare_run
    grep -qx 'VERSION_ID="13"' "$R/etc/os-release" || die "the root is not Debian 13"
    step setup 0 "make setup"
    step versions 0 'java -version 2>&1 | head -1; .venv/bin/python -V'
    java_major="$(sed -n 's/.*version "\([0-9]*\).*/\1/p' <<<"$OUT" | head -1)"
    [[ "$java_major" -ge 21 ]] || die "the root's Java is not 21 or newer: $OUT"
    versions="$(sed -n 's/.*version "\([^"]*\)".*/Java \1/p' <<<"$OUT" | head -1), $(grep -o 'Python [0-9.]*' <<<"$OUT")"
    say "versions: $versions"
    ROOT_ENV=(
        "RMQS_TEST_URI=${RMQS_TEST_URI:-rabbitmq-stream://guest:guest@127.0.0.1:5552/%2f}"
        PYSPARK_PYTHON=/work/rmqs/.venv/bin/python PYSPARK_DRIVER_PYTHON=/work/rmqs/.venv/bin/python
        SPARK_LOCAL_IP=127.0.0.1
    )
    step tests 0 ".venv/bin/python -m pytest -p no:cacheprovider -q $*" ' passed'
    ROOT_ENV=()
}

# ------------------------------------------------------------------------------------ the check

build_base
case "${1:-}" in
    base) say "base root ready: $BASE"; exit 0 ;;
    tests) shift; run_tests "$@"; exit 0 ;;
esac
for port in "$STREAM_PORT" "$TLS_PORT" "$AMQP_PORT" "$MGMT_PORT" "$EPMD_PORT" $((AMQP_PORT + 20000)); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then die "port $port is in use: is another check running?"; fi
done
prepare_run
grep -qx 'VERSION_ID="13"' "$R/etc/os-release" || die "the root is not Debian 13: $(grep PRETTY_NAME "$R/etc/os-release")"
ok "the root is Debian 13: $(grep PRETTY_NAME "$R/etc/os-release")"

step setup 0 "make setup"
step status-before 3 "bash scripts/broker.sh status" '^stopped'
step down-before 0 "bash scripts/broker.sh down" 'nothing to stop'
step up 0 "bash scripts/broker.sh up" 'host mode'
assert_host_mode
assert_service_off
assert_broker_user
step status-up 0 "bash scripts/broker.sh status" '^running: .*host mode'
step up-again 0 "bash scripts/broker.sh up" 'already running'
step restart 0 "bash scripts/broker.sh restart" 'broker: up: '
grep -q 'down: stopped' <<<"$OUT" || die "restart did not say that it stopped the broker"
assert_broker_user
step status-restarted 0 "bash scripts/broker.sh status" '^running: '
step smoke-tests 0 "RMQS_TEST_URI=rabbitmq-stream://guest:guest@localhost:$STREAM_PORT/%2f .venv/bin/python -m pytest -x -q -p no:cacheprovider ${SMOKE_TESTS[*]}" ' passed'
step script-tests 0 ".venv/bin/python -m pytest -x -q -p no:cacheprovider tests/integration/test_broker_script.py" ' passed'
step down 0 "bash scripts/broker.sh down" 'down: stopped .*no broker or epmd process of ours is left'
assert_nothing_left
step status-after 3 "bash scripts/broker.sh status" '^stopped'
step down-again 0 "bash scripts/broker.sh down" 'nothing to stop'
assert_service_off
