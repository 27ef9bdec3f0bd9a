"""A standalone Spark cluster for the `spark_cluster` tier: one master and two workers from the
installed pyspark, on loopback and free ports, each in a process group of its own.

Why a real cluster: executors in JVMs of their own are where a Python data source breaks in ways
`local[2]` hides (the package and its Python on the workers, pickled reader state, the driver's
address, a task retried on another executor, an executor lost mid-read).

The workers' Python is this venv's interpreter at the same path (docs/deployment.md, "the same
path" recipe): the driver's `PYSPARK_PYTHON` is what every executor starts, and the venv holds rmqs
(an editable install: the repository is on its `sys.path`, so the executors import `tests.*` too).
Each worker has `--cores 1` and its own work dir under the cluster's temp dir. Executors are the
worker's children, in the worker's process group: `killpg` of a worker stops its executors and
their Python workers with it, and nothing else (`python -m tests.spark_cluster.standalone` starts
one by hand and stops it on Enter).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.support.connect_server import SPARK_HOME, free_port, stop_group

EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
WORKERS = 2
START_TIMEOUT_S = 240.0


@dataclass
class Daemon:
    """One master or worker JVM, the leader of its process group (`start_new_session`)."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    web_port: int

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the group (the JVM, its executors, their Python workers), SIGKILL what outlives it."""
        stop_group(self.proc, timeout_s)

    def kill(self) -> None:
        """SIGKILL the whole group at once: a lost machine, not a graceful stop (no executor is told)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        self.proc.wait(30)

    def executors(self) -> list[psutil.Process]:
        """The executor JVMs this worker runs now (its children running `EXECUTOR_CLASS`)."""
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        found = []
        for child in children:
            try:
                if EXECUTOR_CLASS in " ".join(child.cmdline()):
                    found.append(child)
            except psutil.Error:
                continue
        return found


@dataclass
class StandaloneCluster:
    """A running master and its workers; `url` is the `spark://` master URL the driver passes."""

    root: Path
    port: int
    master: Daemon
    workers: list[Daemon] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def state(self) -> dict[str, object]:
        """The master's JSON status page (workers, their state and free cores, applications)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.master.web_port}/json/", timeout=10) as r:
            return dict(json.loads(r.read()))

    def alive_workers(self) -> list[dict[str, object]]:
        workers = self.state().get("workers", [])
        assert isinstance(workers, list)
        return [w for w in workers if isinstance(w, dict) and w.get("state") == "ALIVE"]

    def executors(self) -> list[psutil.Process]:
        return [e for w in self.workers for e in w.executors()]

    def wait_workers(self, n: int, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until `n` workers are registered ALIVE with the master (a lost one is re-registered late)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for d in (self.master, *self.workers):
                if not d.alive():
                    raise RuntimeError(f"{d.name} exited ({d.proc.returncode}):\n{d.log_tail()}")
            try:
                if len(self.alive_workers()) >= n:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{n} workers did not register within {timeout_s} s:\n{self.master.log_tail()}")

    def wait_no_applications(self, timeout_s: float = 60.0) -> None:
        """Until no application holds the workers' cores (a stopped driver's executors are gone)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if not self.state().get("activeapps") and not self.executors():
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"an application still holds the cluster after {timeout_s} s")

    def start_worker(self, index: int) -> Daemon:
        """Start worker `index` (1-based) with one core and its own work dir; registered by
        `wait_workers`. Also how a test brings back a worker it killed.

        Each worker is a host of its own, `127.0.0.<index>` (all of 127/8 is loopback): Spark never
        runs a speculative copy of a task on the host of its first attempt, so with one host name
        for both workers `spark.speculation` would launch nothing."""
        host = f"127.0.0.{index}"
        work = self.root / f"worker-{index}"
        work.mkdir(exist_ok=True)
        web = free_port()
        args = [
            "org.apache.spark.deploy.worker.Worker",
            self.url,
            "--host",
            host,
            "--port",
            str(free_port()),
            "--webui-port",
            str(web),
            "--cores",
            "1",
            "--memory",
            "1g",
            "--work-dir",
            str(work),
        ]
        daemon = _spawn(f"worker-{index}", args, self.root / f"worker-{index}.log", web, self.root, host)
        self.workers = [w for w in self.workers if w.name != daemon.name] + [daemon]
        self.workers.sort(key=lambda w: w.name)
        return daemon

    def stop(self) -> None:
        """Workers (with their executors) first, then the master; the temp dir goes with them."""
        for d in [*self.workers, self.master]:
            d.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def _env(root: Path, host: str) -> dict[str, str]:
    """The daemons' environment: this venv's Spark and Python, `host` (a loopback address), logs
    and pids under `root`. Executors inherit their worker's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_CONNECT", "SPARK_REMOTE"))}
    env.update(
        {
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": host,
            "SPARK_LOG_DIR": str(root / "logs"),
            "SPARK_PID_DIR": str(root),
            "PYSPARK_PYTHON": sys.executable,
            # A daemon's own heap; executors get `spark.executor.memory` (the driver's setting).
            "SPARK_DAEMON_MEMORY": "256m",
        }
    )
    return env


def _spawn(
    name: str, args: list[str], log: Path, web_port: int, root: Path, host: str = "127.0.0.1"
) -> Daemon:
    """`spark-class <args>` in the foreground (it execs into the JVM) in a new session: its own group."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            env=_env(root, host),
            cwd=root,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return Daemon(name, proc, log, web_port)


def start(workers: int = WORKERS) -> StandaloneCluster:
    """A master and `workers` workers, every worker registered; stopped whole if any fails to start."""
    root = Path(tempfile.mkdtemp(prefix="rmqs-spark-cluster-"))
    port, web = free_port(), free_port()
    master_args = ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port)]
    master = _spawn("master", [*master_args, "--webui-port", str(web)], root / "master.log", web, root)
    cluster = StandaloneCluster(root, port, master)
    try:
        for i in range(1, workers + 1):
            cluster.start_worker(i)
        cluster.wait_workers(workers)
    except BaseException:
        cluster.stop()
        raise
    return cluster


if __name__ == "__main__":
    c = start()
    print(f"{c.url} (master UI http://127.0.0.1:{c.master.web_port}); Enter stops it", flush=True)
    try:
        input()
    finally:
        c.stop()
