"""A real Spark Connect server for the tests: PySpark's bundled server, with a token.

Started in the foreground with `spark-submit --class ...SparkConnectServer` in a session of its own
(the script execs into the JVM, whose Python workers are its children), so one `killpg` on that PID
stops everything it started and nothing else. The pre-shared token is handed over in the
environment (`SPARK_CONNECT_AUTHENTICATE_TOKEN`, not on the command line, where `ps` shows it);
clients send it as a bearer token. Without SSL, PySpark sends a token only to the host `localhost`
(local channel credentials), so that is the host tests connect to.

Clients run in another process: a Connect session sets `SPARK_CONNECT_MODE_ENABLED` for good and
cannot be created next to the test run's local SparkSession (tests/airflow/connect_server.py runs
Airflow task processes; tests/e2e/test_spark_connect.py a plain client).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pyspark

from tests.support.broker import REPO

SPARK_HOME = Path(pyspark.__file__).parent
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ConnectServer:
    """A running server: `sc://localhost:<port>` with `token`; `stop()` ends its process group."""

    port: int
    token: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"sc://localhost:{self.port}"

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the server's process group (JVM and Python workers), SIGKILL what outlives it."""
        stop_group(self.proc, timeout)


def stop_group(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """End the process group led by `proc` (started with `start_new_session`): SIGTERM, then SIGKILL
    what outlives `timeout_s` (a Connect server, a standalone Spark master or worker)."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and _group_alive(proc.pid):
            if proc.poll() is None:
                try:
                    proc.wait(0.2)
                except subprocess.TimeoutExpired:
                    pass
            else:
                time.sleep(0.2)
        if not _group_alive(proc.pid):
            break
    if proc.poll() is None:
        proc.wait(5)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_members(pgid: int) -> list[int]:
    """PIDs still in the process group `pgid` (zombies excluded)."""
    out = subprocess.run(["ps", "-o", "pid=,stat=", "-g", str(pgid)], capture_output=True, text=True)
    return [int(p) for p, stat in (line.split() for line in out.stdout.splitlines()) if "Z" not in stat]


def python_descendants(pid: int) -> list[int]:
    """The Python processes under `pid` alive now (a Connect server's daemons and workers: a new
    session starts its own, a shared one reuses them; bench.warm_spark counts them per task)."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid=,comm="], capture_output=True, text=True).stdout
    parents = {int(a): (int(b), c) for a, b, c in (line.split(None, 2) for line in out.splitlines())}
    found = []
    for child, (_, comm) in parents.items():
        q = child
        while q in parents and q not in (pid, 1):
            q = parents[q][0]
        if q == pid and comm.startswith("python"):
            found.append(child)
    return found


def start_connect_server(
    work: Path, token: str, startup_timeout: float = 180.0, conf: Mapping[str, str] | None = None
) -> ConnectServer:
    """Start a local[2] Connect server on a free port; it can load `rabbitmq_streams` (editable install).

    `conf`: more `--conf` settings for the server (bench.warm_spark compares server settings)."""
    port = free_port()
    log = work / "connect-server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_CONNECT", "SPARK_REMOTE"))}
    env.update(
        {
            "SPARK_HOME": str(SPARK_HOME),
            "PYSPARK_PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("connector", "provider", "")),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_CONNECT_AUTHENTICATE_TOKEN": token,
        }
    )
    cmd = [
        str(SPARK_HOME / "bin" / "spark-submit"),
        "--class",
        SERVER_CLASS,
        "--master",
        "local[2]",
        "--name",
        f"rmqs-test-connect-{port}",
        "--conf",
        f"spark.connect.grpc.binding.port={port}",
        "--conf",
        "spark.connect.grpc.binding.address=127.0.0.1",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.driver.bindAddress=127.0.0.1",
        "--conf",
        "spark.sql.shuffle.partitions=2",
        "--conf",
        "spark.sql.session.timeZone=UTC",
    ]
    for key, value in (conf or {}).items():
        cmd += ["--conf", f"{key}={value}"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    server = ConnectServer(port, token, proc, log)
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        if not server.alive():
            raise RuntimeError(f"the Spark Connect server exited ({proc.returncode}):\n{server.log_tail()}")
        if "Spark Connect server started" in server.log_tail(20_000):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return server
        time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"the Spark Connect server did not listen on {port}:\n{server.log_tail()}")
