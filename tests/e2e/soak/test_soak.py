"""Soak: a streaming query reading a stream and writing another for minutes at a steady rate.

Memory of every process (this driver, the JVM heap after a GC, each Spark Python worker that lives
through the run) stays flat; the count of this test's connections does not grow while the query runs;
and after the query stops, the consumers and publishers of its streams are gone at once and its
connections once idle pooled ones are evicted (no leaked producer, consumer or connection).
`make soak` runs it for 10 minutes (CI, after `make test`, which leaves it out: a soak is a tier of
its own); RMQS_SOAK_SECONDS=40 is the shortest whose thirds still hold connection samples.

The broker is shared with the tests other pytest-xdist workers run meanwhile, so everything is counted
for this test alone: connections by the client port of a process of this test (this driver, its
JVM, the JVM's Python workers), consumers and publishers by stream.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from pathlib import Path

import psutil
import pytest
from pyspark.sql import SparkSession

from pyspark_rmqs.broker import pool
from pyspark_rmqs.broker.reader import read_range
from tests.e2e.faults.support import SteadyProducer, wait_for
from tests.support.broker import BrokerSettings, management
from tests.support.data import client, conn_of, spark_options

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow, pytest.mark.soak]

SOAK_SECONDS = float(os.environ.get("RMQS_SOAK_SECONDS", "40"))
RATE = int(os.environ.get("RMQS_SOAK_RATE", "1000"))  # messages per second
MiB = 1024 * 1024


def _ours() -> list[psutil.Process]:
    """This process and its descendants: the driver, the Spark JVM and its Python workers."""
    me = psutil.Process()
    return [me, *me.children(recursive=True)]


def _stream_connections(port: int) -> list[str]:
    """This test's open connections to the broker's stream port, as "pid command local-port".

    Counted on the client side (the sockets of this test's processes): the broker is shared with the
    tests other xdist workers run meanwhile, and its own lists lag (management) or fail for a
    connection caught mid-handshake (rabbitmqctl's list_stream_connections, seen here)."""
    out = []
    for p in _ours():
        try:
            cmd = p.cmdline()[-1] if p.cmdline() else "?"
            socks = p.net_connections(kind="tcp")
        except psutil.Error:
            continue
        for c in socks:
            if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED:
                out.append(f"{p.pid} {cmd} :{c.laddr.port}")
    return sorted(out)


def _consumers_and_publishers(streams: set[str]) -> dict[str, int]:
    """The consumers and publishers of `streams`, as the broker counts them (management API)."""
    return {
        kind: sum(x["queue"]["name"] in streams for x in management("GET", f"stream/{kind}") or [])
        for kind in ("consumers", "publishers")
    }


class Sampler(threading.Thread):
    """Every 2 s: RSS of this process and of each Python process under the JVM, and the JVM heap
    after a GC; every 10 s this test's stream connections."""

    def __init__(self, spark: SparkSession, port: int) -> None:
        super().__init__(daemon=True, name="soak-sampler")
        self.spark = spark
        self.port = port
        self.rss: dict[str, list[tuple[float, int]]] = {}
        self.heap: list[tuple[float, int]] = []
        self.connections: list[tuple[float, int]] = []
        self.stop_event = threading.Event()

    def _processes(self) -> dict[str, psutil.Process]:
        me = psutil.Process()
        found = {f"driver-python[{me.pid}]": me}
        for p in me.children(recursive=True):
            try:
                cmd = p.cmdline()
            except psutil.Error:
                continue
            if cmd and "pyspark.daemon" in " ".join(cmd) and cmd[-1] != "pyspark.daemon":
                found[f"{cmd[-1]}[{p.pid}]"] = p
        return found

    def run(self) -> None:
        jvm = self.spark.sparkContext._jvm  # type: ignore[attr-defined]
        started = time.monotonic()
        while not self.stop_event.is_set():
            t = time.monotonic() - started
            for name, p in self._processes().items():
                try:
                    self.rss.setdefault(name, []).append((t, p.memory_info().rss))
                except psutil.Error:
                    pass
            jvm.java.lang.System.gc()
            rt = jvm.java.lang.Runtime.getRuntime()
            self.heap.append((t, rt.totalMemory() - rt.freeMemory()))
            if not self.connections or t - self.connections[-1][0] >= 10:
                self.connections.append((t, len(_stream_connections(self.port))))
            self.stop_event.wait(2.0)

    def finish(self) -> None:
        self.stop_event.set()
        self.join(30)


def _thirds(samples: list[tuple[float, int]], duration: float) -> tuple[list[int], list[int]]:
    """Values in the middle and the last third of the run (the first third is warm-up)."""
    mid = [v for t, v in samples if duration / 3 <= t < 2 * duration / 3]
    last = [v for t, v in samples if t >= 2 * duration / 3]
    return mid, last


def _flat(samples: list[tuple[float, int]], duration: float, rel: float, slack: int) -> tuple[bool, str]:
    mid, last = _thirds(samples, duration)
    if len(mid) < 2 or len(last) < 2:
        return True, "too few samples"
    a, b = statistics.median(mid), statistics.median(last)
    return b <= a * (1 + rel) + slack, f"{a / MiB:.1f} -> {b / MiB:.1f} MiB"


def test_soak_streaming_read_and_write(
    spark: SparkSession, broker: BrokerSettings, streams, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    if broker.external:
        pytest.skip("the soak counts the local broker's consumers and publishers through its management API")
    src, dst = streams.stream("soak-in"), streams.stream("soak-out")
    client(broker).tail(src)  # this process's metadata connection belongs to the baseline
    ours = {src, dst}
    baseline_connections = _stream_connections(broker.port)
    producer = SteadyProducer(broker, src, rate=RATE, batch=max(1, RATE // 10), name="soak-producer")
    producer.start()
    q = (
        spark.readStream.format("rabbitmq_streams")
        .options(**spark_options(broker, stream=src, metadataFields=""))
        .load()
        .select("value")
        .writeStream.format("rabbitmq_streams")
        .options(**spark_options(broker, stream=dst, producerName="soak"))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="1 second")
        .start()
    )
    sampler = Sampler(spark, broker.port)
    sampler.start()
    started = time.monotonic()
    try:
        while time.monotonic() - started < SOAK_SECONDS:
            assert q.exception() is None, q.exception()
            time.sleep(1)
        sent_count = producer.stop()
        caught_up = lambda: client(broker).tail(dst) >= sent_count or q.exception()  # noqa: E731
        wait_for(caught_up, 120, "the query to catch up", 0.5)
        assert q.exception() is None, q.exception()
    finally:
        sampler.finish()
        q.stop()
        producer.stop()
    duration = time.monotonic() - started

    # Every message, once, in order.
    got = read_range(conn_of(broker), dst, 0, client(broker).tail(dst)).column("value").to_pylist()
    sent = producer.finish()  # the expected bodies, built after the memory sampling ended
    assert got == sent

    report: list[str] = [f"soak {duration:.0f} s at {RATE} msg/s: {len(sent)} messages through the query"]
    problems: list[str] = []
    for name, samples in sorted(sampler.rss.items()):
        if samples[0][0] > duration / 3 or samples[-1][0] < 2 * duration / 3 - 2:
            continue  # not alive through the run: a short-lived worker
        ok, text = _flat(samples, duration, rel=0.10, slack=16 * MiB)
        report.append(f"RSS {name}: {text}")
        if not ok:
            problems.append(f"RSS of {name} grew: {text}")
    ok, text = _flat(sampler.heap, duration, rel=0.25, slack=32 * MiB)
    report.append(f"JVM heap after GC: {text}")
    if not ok:
        problems.append(f"JVM heap after GC grew: {text}")
    mid, last = _thirds(sampler.connections, duration)
    if mid and last:  # a run shorter than ~30 s has no connection sample in one of its thirds
        report.append(f"connections: baseline {len(baseline_connections)}, run max {max(mid)} -> {max(last)}")
        if max(last) > max(mid) + 2:
            problems.append(f"broker connections grew during the run: {max(mid)} -> {max(last)}")

    # After the stop: no subscription or publisher left; pooled connections close once idle.
    # The management API's lists lag by up to its statistics interval (5 s).
    wait_for(
        lambda: _consumers_and_publishers(ours) == {"consumers": 0, "publishers": 0},
        20,
        "no consumer or publisher left on the soak's streams",
        0.5,
    )
    try:
        wait_for(
            lambda: len(_stream_connections(broker.port)) <= len(baseline_connections),
            pool.IDLE_SECONDS * 1.5 + 10,
            "connections back to the baseline after idle eviction",
            1.0,
        )
    except AssertionError as e:
        now = _stream_connections(broker.port)
        raise AssertionError(f"{e}: baseline {baseline_connections}, now {now}") from None
    report.append("after stop: no consumer or publisher left, connections back to the baseline")
    print("\n".join(report))
    assert not problems, "\n".join(problems + report)
