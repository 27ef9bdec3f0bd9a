"""Shared benchmark plumbing: broker settings, stream setup, timing and the one-line report."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.broker.writer import StreamProducer, WriteSettings
from pyspark_rmqs.core.codec import encode
from pyspark_rmqs.options import ConnectionOptions, parse_connection_options

REPO = Path(__file__).resolve().parents[1]
ROUNDS = 3  # default rounds of best_of: enough to dodge a disturbed run, short enough for make bench


def connection() -> ConnectionOptions:
    """RMQS_TEST_URI's broker, else the project's local one (started if needed)."""
    uri = os.environ.get("RMQS_TEST_URI")
    if uri:
        return parse_connection_options({"uris": uri})
    subprocess.run(["bash", str(REPO / "scripts" / "broker.sh"), "up"], check=True)
    return parse_connection_options({"endpoints": "localhost:5552"})


@contextmanager
def temp_stream(conn: ConnectionOptions, prefix: str = "bench") -> Iterator[str]:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    client = BrokerClient(conn)
    client.create_stream(name)
    try:
        yield name
    finally:
        client.delete_stream(name)


@contextmanager
def temp_super_stream(
    conn: ConnectionOptions, partitions: int, prefix: str = "bench"
) -> Iterator[tuple[str, list[str]]]:
    """A fresh super stream; yields its name and its partition streams (`name-0` .. `name-(N-1)`)."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    client = BrokerClient(conn)
    client.create_super_stream(name, partitions)
    try:
        yield name, [f"{name}-{i}" for i in range(partitions)]
    finally:
        client.delete_super_stream(name)


def spark_session(app: str) -> Any:
    """A local[2] SparkSession with this interpreter as the worker Python; no UI, WARN logging."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    return session


def fill(conn: ConnectionOptions, stream: str, count: int, size: int = 100, batch: int = 10_000) -> None:
    """Publish `count` messages with `size`-byte bodies (one data section each)."""
    body = b"x" * size
    with StreamProducer(conn, stream, superstream=False, settings=WriteSettings()) as p:
        for i in range(0, count, batch):
            p.send([encode(body)] * min(batch, count - i))
        p.flush()


async def _send_batches(conn: ConnectionOptions, stream: str, count: int, size: int, batch: int) -> None:
    from rstream import Producer
    from rstream.producer import ConfirmationStatus

    host, port = conn.addresses()[0]
    message = encode(b"x" * size)
    confirmed = 0
    target = 0
    done = asyncio.Event()

    def on_confirm(status: ConfirmationStatus) -> None:
        nonlocal confirmed
        if not status.is_confirmed:
            raise RuntimeError(f"publish not confirmed: {status}")
        confirmed += 1
        if confirmed >= target:
            done.set()

    async with Producer(
        host, port, username=conn.username, password=conn.password.get_secret_value(), vhost=conn.vhost
    ) as p:
        for i in range(0, count, batch):
            target = min(count, i + batch)
            done.clear()
            # bytes: rstream wraps each in a fresh RawMessage with its own publishing id
            await p.send_batch(stream, [message] * (target - i), on_publish_confirm=on_confirm)
            # One batch at a time: frames sent back to back would be merged into bigger chunks.
            await asyncio.wait_for(done.wait(), 60)


def fill_batches(
    conn: ConnectionOptions, stream: str | dict[str, int], count: int, batch: int, size: int = 100
) -> None:
    """Publish `count` `size`-byte messages as a producer in the field does: rstream's
    `Producer.send_batch` of `batch` messages per call, not our writer. Each call waits for its
    confirms before the next: the broker merges publish frames that arrive together into one chunk,
    so a pipelining producer would get bigger chunks than it sends. A call whose messages exceed
    the frame size goes out as several frames. `chunk_stats` tells what the broker made. `stream`
    may be a dict of streams and their counts (`count` is then ignored): filled concurrently."""
    counts = stream if isinstance(stream, dict) else {stream: count}

    async def all_streams() -> None:  # the partitions of a super stream side by side
        await asyncio.gather(*(_send_batches(conn, s, n, size, batch) for s, n in counts.items() if n))

    asyncio.run(all_streams())


def chunk_stats(conn: ConnectionOptions, stream: str, count: int) -> float:
    """Average user messages per chunk over [0, count) of `stream`, as the reader sees them."""
    from pyspark_rmqs.broker.reader import RangeReader, ReadSettings

    reader = RangeReader(conn, stream, 0, count, ReadSettings())
    for _ in reader:
        pass
    return count / max(1, reader.chunks)


@dataclass(frozen=True)
class Measured:
    """One measured span: its wall seconds and the local broker's CPU seconds over the same span
    (None when no broker runs on this machine)."""

    seconds: float
    broker_cpu: float | None = None


class Span:
    """Starts measuring when made; `done()` gives the `Measured` span. The broker's CPU is read
    (a scan of /proc) just outside the wall clock, so the scan is not timed."""

    def __init__(self) -> None:
        self._cpu = broker_cpu_s()
        self._t = time.perf_counter()

    def done(self) -> Measured:
        seconds = time.perf_counter() - self._t
        after = broker_cpu_s()
        return Measured(seconds, None if self._cpu is None or after is None else after - self._cpu)


def timed(fn: Callable[[], Any]) -> tuple[Measured, Any]:
    span = Span()
    result = fn()
    return span.done(), result


def broker_cpu_s() -> float | None:
    """CPU seconds (user + system) the local RabbitMQ has used so far, or None when none runs here.

    The benches share the machine with the broker: where the broker's own work per message or per
    chunk sets the pace, no client can go faster than the broker's CPU time for the same messages.
    Printing it beside each side's time shows which side is waiting on whom. Only a broker on this
    machine can be measured (not one `RMQS_TEST_URI` points at elsewhere).
    """
    total = 0.0
    found = False
    tick = os.sysconf("SC_CLK_TCK")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        name, _, rest = stat.partition(" (")[2].rpartition(") ")
        if name != "beam.smp":
            continue
        fields = rest.split()
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14 and 15)
        found = True
    return total if found else None


def best_measured(
    rounds: int,
    sides: dict[str, Callable[[int], Measured]],
    broker_cpu: dict[str, float] | None = None,
) -> dict[str, float]:
    """The best (shortest) seconds of each side over `rounds` rounds, the sides interleaved.

    A 2-core machine shared with a broker, a JVM and other processes is noisy: one run per side
    measures whatever else ran at that moment. Interleaving the sides spreads that noise over all of
    them, and the best round is the one least disturbed. Each side is called with the round number
    (for fresh output paths or consumer names) and returns the span it measured itself (`Span`):
    only what its clock covers, not its setup.

    With `broker_cpu`, it receives the local broker's CPU seconds over each side's best span, when
    a broker runs here.
    """
    best: dict[str, float] = {}
    for r in range(rounds):
        for label, side in sides.items():
            m = side(r)
            if m.seconds < best.get(label, float("inf")):
                best[label] = m.seconds
                if broker_cpu is not None and m.broker_cpu is not None:
                    broker_cpu[label] = m.broker_cpu
    return best


def best_of(
    rounds: int,
    count: int,
    sides: dict[str, Callable[[int], int]],
    broker_cpu: dict[str, float] | None = None,
) -> dict[str, float]:
    """`best_measured` of sides timed whole; each must return `count` (the rows or messages it saw)."""
    timed_sides = {label: timed_side(label, count, side) for label, side in sides.items()}
    return best_measured(rounds, timed_sides, broker_cpu)


def timed_side(label: str, count: int, side: Callable[[int], int]) -> Callable[[int], Measured]:
    """A `best_measured` side timing `side` whole, which must return `count` (what it saw)."""

    def run(r: int) -> Measured:
        measured, seen = timed(lambda: side(r))
        assert seen == count, f"{label}: saw {seen:,} of {count:,}"
        return measured

    return run


def report(
    label: str,
    count: int,
    seconds: float,
    baseline_rate: float | None = None,
    broker_cpu: float | None = None,
) -> float:
    """Print `label: rate msg/s (count in seconds)`, the ratio to `baseline_rate`, the broker's CPU."""
    rate = count / seconds
    line = f"{label}: {rate:,.0f} msg/s ({count:,} in {seconds:.2f} s)"
    if baseline_rate:
        line += f", {rate / baseline_rate:.2f}x"
    if broker_cpu is not None:
        line += f"; broker CPU {broker_cpu:.2f} s"
    print(line, flush=True)
    return rate


def broker_bound(count: int, bare_s: float, broker_s: float | None, target: float = 1.5) -> None:
    """Print the time a `target` ratio to the bare producer allows beside the broker's own CPU
    seconds for the same messages, published one entry per message: the broker appends a stream's
    entries on about one core, so that CPU time bounds any client's time on this machine."""
    if broker_s is None:
        return
    budget = bare_s / target
    print(
        f"broker-bound: {target}x the bare producer means {count:,} messages in {budget:.2f} s; "
        f"the broker alone spent {broker_s:.2f} s of CPU on them ({broker_s / budget:.0%} of that)",
        flush=True,
    )
