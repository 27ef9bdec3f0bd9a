"""scripts/broker.sh itself: exit codes and messages, and which uid the broker runs as.

The exit-code tests give the script their own RMQS_BROKER_HOME and ports, so they never touch the
suite's broker. The uid test inspects the suite's running broker (skipped when RMQS_TEST_URI names
another one): its processes must run as the service user the script created, never as one of the
host's accounts (issue 14: the chroot's `rabbitmq` used to get the host `postgres` uid).
`make check-debian13` runs this file inside a Debian 13 root, where the script is in host mode.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.support.broker import BROKER_SH, broker_sh, ensure_local_broker

pytestmark = pytest.mark.timeout(180)

# Ports no broker of the suite uses (the default broker: 5552/5551/5672/15672, epmd 4369).
OWN_PORTS = {
    "RMQS_STREAM_PORT": "5742",
    "RMQS_STREAM_TLS_PORT": "5741",
    "RMQS_AMQP_PORT": "5740",
    "RMQS_MANAGEMENT_PORT": "15740",
    "RMQS_EPMD_PORT": "4374",
}
BROKER_COMMANDS = {"beam.smp", "epmd", "erl_child_setup", "inet_gethost"}


def _own_broker(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """broker.sh ARGS with its own (empty) RMQS_BROKER_HOME and ports."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RMQS_")}
    env.update(OWN_PORTS, RMQS_BROKER_HOME=str(home))
    return subprocess.run(
        ["bash", str(BROKER_SH), *args], capture_output=True, text=True, timeout=120, env=env
    )


@pytest.mark.parametrize("created", [False, True], ids=["no-home", "empty-home"])
def test_down_with_nothing_running_exits_0_and_says_so(tmp_path: Path, created: bool) -> None:
    home = tmp_path / "broker"
    if created:
        home.mkdir()
    done = _own_broker(home, "down")
    assert done.returncode == 0, done.stderr
    assert "nothing to stop" in done.stderr, done.stderr
    # and again: `down` is idempotent
    again = _own_broker(home, "down")
    assert again.returncode == 0 and "nothing to stop" in again.stderr, again.stderr


def test_status_when_down_exits_3_with_a_message(tmp_path: Path) -> None:
    home = tmp_path / "broker"
    home.mkdir()
    done = _own_broker(home, "status")
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert done.stdout.startswith("stopped: "), done.stdout
    assert str(home) in done.stdout


def test_unknown_command_and_mode_fail_with_a_message(tmp_path: Path) -> None:
    bad = _own_broker(tmp_path, "frobnicate")
    assert bad.returncode == 2 and "usage:" in bad.stderr
    env = {**os.environ, "RMQS_BROKER_MODE": "vm", "RMQS_BROKER_HOME": str(tmp_path)}
    env.pop("RMQS_TEST_URI", None)
    mode = subprocess.run(["bash", str(BROKER_SH), "status"], capture_output=True, text=True, env=env)
    assert mode.returncode != 0 and "RMQS_BROKER_MODE must be host or chroot" in mode.stderr


def _ids_by_name(path: Path) -> dict[str, int]:
    """name -> uid (passwd) or gid (group), from a passwd/group style file."""
    out: dict[str, int] = {}
    for line in path.read_text().splitlines():
        parts = line.split(":")
        if len(parts) > 3 and parts[2].isdigit():
            out[parts[0]] = int(parts[2])
    return out


def _status_ids(pid: str, key: str) -> set[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return {int(v) for v in line.split()[1:]}
    raise AssertionError(f"no {key} in /proc/{pid}/status")


@pytest.mark.broker
@pytest.mark.skipif(bool(os.environ.get("RMQS_TEST_URI")), reason="RMQS_TEST_URI: not the script's broker")
def test_broker_runs_as_the_scripts_service_user_not_a_host_account() -> None:
    ensure_local_broker()
    listed = broker_sh("pids", timeout=60)
    assert listed.returncode == 0, listed.stderr
    host_users = _ids_by_name(Path("/etc/passwd"))
    host_groups = _ids_by_name(Path("/etc/group"))
    seen: set[str] = set()
    for pid in listed.stdout.split():
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            if comm not in BROKER_COMMANDS:
                continue  # runuser (root) in host mode, CLI tools, shells
            root = os.readlink(f"/proc/{pid}/root")
            uids, gids = _status_ids(pid, "Uid"), _status_ids(pid, "Gid")
            # The accounts as the process sees them: the chroot's in chroot mode, the host's otherwise.
            own_users = _ids_by_name(Path(f"/proc/{pid}/root/etc/passwd"))
            own_groups = _ids_by_name(Path(f"/proc/{pid}/root/etc/group"))
        except FileNotFoundError:
            continue  # exited meanwhile
        assert len(uids) == 1 and len(gids) == 1, f"{comm} ({pid}): mixed ids {uids} {gids}"
        uid, gid = uids.pop(), gids.pop()
        assert own_users.get("rabbitmq") == uid, f"{comm} ({pid}) runs as uid {uid}, not rabbitmq's"
        assert own_groups.get("rabbitmq") == gid, f"{comm} ({pid}) runs as gid {gid}, not rabbitmq's"
        # On the host (root "/") the service user is a host account itself; in a chroot it is none.
        allowed = {"rabbitmq"} if root == "/" else set()
        users = {name for name, n in host_users.items() if n == uid}
        groups = {name for name, n in host_groups.items() if n == gid}
        assert users <= allowed, f"{comm} ({pid}) runs as uid {uid}, the host's {sorted(users)}"
        assert groups <= allowed, f"{comm} ({pid}) runs as gid {gid}, the host's {sorted(groups)}"
        seen.add(comm)
    assert "beam.smp" in seen, f"no broker process among `broker.sh pids`: {listed.stdout!r}"


def _process_roots() -> dict[str, str]:
    roots: dict[str, str] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                roots[entry.name] = os.readlink(entry / "root")
            except OSError:
                continue  # exited, or not ours to read
    return roots


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.skipif(bool(os.environ.get("RMQS_TEST_URI")), reason="RMQS_TEST_URI: not the script's broker")
def test_own_broker_up_status_restart_down() -> None:
    """A second broker on its own home and ports: every command exits 0, `down` leaves nothing.

    In chroot mode its chroot is a copy of the suite's (without its node and certificates); in host
    mode it shares the host's package. Issue 21: `down` used to exit 1 silently once it had stopped.
    """
    ensure_local_broker()
    # Not under tmp_path: in host mode the service user must reach the node folder (pytest's is 0700).
    home = Path(tempfile.mkdtemp(prefix="rmqs-broker-test-", dir="/var/tmp"))
    home.chmod(0o755)
    chroot = "chroot mode" in broker_sh("status", timeout=60).stdout
    if chroot:
        suite_root = Path(os.environ.get("RMQS_BROKER_HOME", "/var/cache/rmqs-broker")) / "trixie"
        (home / "trixie").mkdir()
        src, dst = shlex.quote(str(suite_root)), shlex.quote(str(home / "trixie"))
        skip = "--exclude=./rmqs --exclude=./tls --exclude='./proc/*'"  # its node, certificates, /proc
        copy = f"tar -C {src} --one-file-system {skip} -cf - . | tar -C {dst} -xf -"
        subprocess.run(["bash", "-o", "pipefail", "-c", copy], check=True, timeout=300)
    try:
        for command, code, said in [
            ("up", 0, "broker: up: "),
            ("status", 0, "running: "),
            ("up", 0, "already running"),
            ("restart", 0, "broker: up: "),
            ("down", 0, "no broker or epmd process of ours is left"),
            ("status", 3, "stopped: "),
            ("down", 0, "nothing to stop"),
        ]:
            done = _own_broker(home, command)
            output = done.stdout + done.stderr
            assert done.returncode == code, f"broker.sh {command}: exit {done.returncode}\n{output}"
            assert said in output, f"broker.sh {command}\n{output}"
        assert _own_broker(home, "pids").stdout.strip() == ""
        if chroot:
            left = [pid for pid, root in _process_roots().items() if root == str(home / "trixie")]
            assert not left, f"processes left in the chroot after down: {left}"
    finally:
        _own_broker(home, "down")
        subprocess.run(["rm", "-rf", "--one-file-system", str(home)], check=False)
