"""What the fault-injection tests share: restarting the broker, finding reader processes, checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa

from pyspark_rmqs.broker.writer import StreamProducer, WriteSettings
from pyspark_rmqs.core.codec import encode
from tests.support.broker import REPO, RESTARTABLE_ENV, BrokerSettings, broker_sh
from tests.support.data import conn_of


def _broker_sh(command: str, timeout_s: float) -> None:
    done = broker_sh(command, timeout=timeout_s, env=RESTARTABLE_ENV)
    assert done.returncode == 0, f"broker.sh {command} failed ({done.returncode}): {done.stderr[-2000:]}"


def broker_down() -> None:
    """Stop the second broker (`restartable_broker`), the one the restart tests may stop."""
    _broker_sh("down", 120)


def broker_up() -> None:
    _broker_sh("up", 300)


def broker_pids() -> list[int]:
    """The processes of the second broker (`restartable_broker`), for SIGSTOP and SIGCONT."""
    done = broker_sh("pids", env=RESTARTABLE_ENV)
    return [int(p) for p in done.stdout.split()]


def connections(port: int) -> set[tuple[int, int]]:
    """(pid, local port) of every established TCP connection to `port` on this machine."""
    found = set()
    for c in psutil.net_connections(kind="tcp"):
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED and c.pid:
            found.add((c.pid, c.laddr.port))
    return found


def spark_worker_pids(port: int, ignore: set[tuple[int, int]] | None = None) -> list[int]:
    """Spark Python workers (not this driver process) with a connection to the broker's stream port
    that is not in `ignore` (idle connections a reused worker pooled in an earlier job)."""
    me = os.getpid()
    # Only this process's own Spark workers: other tests' Spark processes may run beside it.
    mine = {p.pid for p in psutil.Process(me).children(recursive=True)}
    pids = []
    for pid in sorted({p for p, lport in connections(port) - (ignore or set()) if p != me and p in mine}):
        try:
            cmd = " ".join(psutil.Process(pid).cmdline())
        except psutil.NoSuchProcess:
            continue
        if "pyspark" in cmd and ("daemon" in cmd or "worker" in cmd):
            pids.append(pid)
    return pids


def is_task_worker(pid: int) -> bool:
    """A Spark Python worker for tasks: the daemon (`python -m pyspark.daemon pyspark.worker`) or a
    worker it forked (same command line), not a planning worker of a Python data source."""
    try:
        cmd = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    return bool(cmd) and cmd[-1] == "pyspark.worker"


def task_readers(port: int) -> list[int]:
    """Spark Python workers running tasks (not the planning workers of Python data sources, which
    keep a pooled metadata connection) that are connected to the broker."""
    return [pid for pid in spark_worker_pids(port) if is_task_worker(pid)]


def wait_for(predicate: Callable[[], object], timeout_s: float, what: str, every_s: float = 0.05) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


class RestartWhen(threading.Thread):
    """Restarts the broker (a real process restart) as soon as `ready()` is true."""

    def __init__(self, ready: Callable[[], object], timeout_s: float = 120) -> None:
        super().__init__(daemon=True, name="restart-broker")
        self.ready = ready
        self.timeout_s = timeout_s
        self.down_at: float | None = None  # monotonic time the broker was down
        self.up_at: float | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            wait_for(self.ready, self.timeout_s, "the job to start")
            broker_down()
            self.down_at = time.monotonic()
            broker_up()
            self.up_at = time.monotonic()
        except BaseException as e:  # reported by check()
            self.error = e

    def check(self) -> None:
        self.join(300)
        if self.error is not None:
            raise self.error
        assert self.down_at is not None and self.up_at is not None, "the broker was not restarted"


class SteadyProducer(threading.Thread):
    """Publishes numbered messages at a steady rate until stopped, with a producer name (exactly once)."""

    def __init__(
        self,
        b: BrokerSettings,
        target: str,
        *,
        superstream: bool = False,
        rate: int = 2000,
        batch: int = 100,
        name: str = "steady",
    ) -> None:
        super().__init__(daemon=True, name=f"producer-{target}")
        self.b, self.target, self.superstream = b, target, superstream
        self.rate, self.batch, self.name = rate, batch, name
        self.count = 0  # messages sent; their bodies are body(0) .. body(count - 1)
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        settings = WriteSettings(producer_name=self.name, resume_sequence=False)
        try:
            conn = conn_of(self.b)
            with StreamProducer(conn, self.target, superstream=self.superstream, settings=settings) as p:
                started = time.monotonic()
                while not self.stop_event.is_set():
                    n = self.count
                    bodies = [self.body(n + i) for i in range(self.batch)]
                    keys = [f"k{(n + i) % 97}" for i in range(self.batch)] if self.superstream else None
                    p.send([encode(x) for x in bodies], routing_keys=keys)
                    self.count += self.batch
                    ahead = self.count / self.rate - (time.monotonic() - started)
                    if ahead > 0:
                        self.stop_event.wait(ahead)
                p.flush()
        except BaseException as e:
            self.error = e

    @staticmethod
    def body(i: int) -> bytes:
        return f"m{i:09d}".encode()

    def stop(self) -> int:
        """Stop publishing; how many messages were sent (all confirmed)."""
        self.stop_event.set()
        self.join(180)
        if self.error is not None:
            raise self.error
        return self.count

    def finish(self) -> list[bytes]:
        """Stop; the bodies sent, in order (built only now: the soak measures this process's memory)."""
        return [self.body(i) for i in range(self.stop())]


def assert_exact(rows: Sequence[tuple[str, int, bytes]], expected: dict[str, list[bytes]]) -> None:
    """Per partition stream: offsets 0..n-1 once each, in order, with exactly the expected bodies."""
    by_stream: dict[str, list[tuple[int, bytes]]] = {}
    for stream, offset, value in rows:
        by_stream.setdefault(stream, []).append((offset, value))
    assert sorted(by_stream) == sorted(s for s, v in expected.items() if v), "partitions differ"
    for stream, got in by_stream.items():
        got.sort()
        offsets = [o for o, _ in got]
        dups = len(offsets) - len(set(offsets))
        assert dups == 0, f"{stream}: {dups} duplicated offset(s)"
        want = expected[stream]
        assert offsets == list(range(len(want))), (
            f"{stream}: offsets are not exactly 0..{len(want) - 1} (got {len(offsets)} rows, "
            f"first gap at {next((i for i, o in enumerate(offsets) if o != i), None)})"
        )
        assert [v for _, v in got] == want, f"{stream}: bodies differ from what was published"


def output_offsets(out: Path) -> list[tuple[str, int]]:
    """Every (stream, offset) a Parquet reader sees under `out`, sorted: staged files and commit
    records are `_`-prefixed and ignored, `rmqs_run=<token>` folders read as a hive partition."""
    import pyarrow.dataset as ds

    table = ds.dataset(str(out), format="parquet", partitioning="hive").to_table(columns=["stream", "offset"])
    return sorted(zip(table.column("stream").to_pylist(), table.column("offset").to_pylist(), strict=True))


def killed_consume_job(
    cfg: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `tests.e2e.faults.consume_job` with `cfg` (its `kill` point) in a new process, which must
    end killed by its own SIGKILL; `env` is added to this process's environment (the S3 credentials).
    Returns the finished process (its output, for checks that no secret was printed)."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.e2e.faults.consume_job", json.dumps(cfg)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=None if env is None else {**os.environ, **env},
    )
    assert done.returncode == -9, f"the run was not killed ({done.returncode}): {done.stderr[-3000:]}"
    return done


def paced(
    rows: int, delay_s: float, started: Path
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A mapInArrow function passing `rows` rows per `delay_s`, so the job still runs when the fault
    hits (a graceful broker stop takes ~7 s, a killed node's failover ~1 s); it creates `started`
    when the first rows pass."""

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import time as t

        for b in batches:
            for i in range(0, b.num_rows, rows):
                started.touch()
                t.sleep(delay_s)
                yield b.slice(i, rows)

    return fn
