"""An AvailableNow drain's lease ended under it (docs/semantics.md, "A lease lost under a run": a
drain writes no record; taken back, its lease proves only that no watermark run or `rmqs watermark
set` wrote one meanwhile; its final store never moves the watermark backwards).

The broker closes the drain's lease connection (management API, as test_lease_loss.py does to
Spark-free runs) while its query runs, before its final store (`Lease.keep("its final
watermarks")`). The drain (`jobs.run_drain`, the shared SparkSession) takes the lease back and
stores, or, when a watermark run of the name wrote its record meanwhile, fails before storing.
Each test counts offsets: the drain's Parquet output read by Spark, and where the watermark is.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from pyspark_rmqs import consume, jobs
from pyspark_rmqs.errors import ConsumerBusyError, LeaseLostError
from pyspark_rmqs.runs import drain
from pyspark_rmqs.runs.lease import Lease
from pyspark_rmqs.watermarks import watermarks
from tests.conftest import StreamFactory
from tests.e2e.faults.test_lease_loss import close_lease_connection
from tests.support.broker import BrokerSettings
from tests.support.data import conn_of, publish

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]
N = 500
SOURCE = {"metadataFields": ""}


class DrainHooks:
    """The drain's lease as it takes it, and a call made once its query has started (the lease ends
    then, while the query runs and before the final store)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.lease: Lease | None = None
        self.while_running: list[Any] = []
        real_acquire, real_metrics = drain.acquire_lease, drain.ExecutorReadMetrics
        hooks = self

        def acquire(*a: Any, **k: Any) -> Lease:
            hooks.lease = real_acquire(*a, **k)
            return hooks.lease

        class Metrics(real_metrics):  # type: ignore[misc,valid-type]
            def __exit__(self, *exc: object) -> None:  # the query was started just before
                super().__exit__(*exc)
                for fn in hooks.while_running:
                    fn()

        monkeypatch.setattr(drain, "acquire_lease", acquire)
        monkeypatch.setattr(drain, "ExecutorReadMetrics", Metrics)


def _drain(spark: SparkSession, broker: BrokerSettings, s: str, consumer: str, tmp: Path) -> jobs.RunSummary:
    return jobs.run_drain(
        spark,
        conn_of(broker),
        stream=s,
        consumer=consumer,
        checkpoint=str(tmp / "ck"),
        output_path=str(tmp / "out"),
        source_options=SOURCE,
        timeout_s=120,
    )


def _output(spark: SparkSession, out: Path) -> Counter[int]:
    return Counter(int(r.offset) for r in spark.read.parquet(str(out)).select("offset").collect())


def test_a_drain_whose_lease_connection_is_closed_takes_the_lease_back_and_stores(
    spark: SparkSession,
    broker: BrokerSettings,
    streams: StreamFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Closed while the query runs: the drain takes its lease back before its final store (nobody
    wrote a record of the name) and stores the tail; a run trying while it stores is turned away.
    Every offset once in the output, the watermark at the tail."""
    s = streams.stream("drain-back")
    conn = conn_of(broker)
    publish(broker, s, [b"d%04d" % i for i in range(N)])
    hooks = DrainHooks(monkeypatch)
    hooks.while_running.append(lambda: close_lease_connection(broker, hooks.lease))  # type: ignore[arg-type]
    turned_away: list[BaseException] = []
    real_store = drain.store_watermarks

    def store_while_another_run_tries(*a: Any, **k: Any) -> Any:
        try:
            jobs.plan_read(conn, stream=s, consumer="dr", lease_wait_s=1).release()
        except ConsumerBusyError as e:
            turned_away.append(e)
        return real_store(*a, **k)

    monkeypatch.setattr(drain, "store_watermarks", store_while_another_run_tries)
    summary = _drain(spark, broker, s, "dr", tmp_path)
    assert turned_away, "another run got the name while the drain was storing"
    assert hooks.lease is not None and hooks.lease.regained == 1, "the drain did not take its lease back"
    assert summary.rows == N and summary.watermark_stored
    counts = _output(spark, tmp_path / "out")
    assert sorted(counts) == list(range(N)) and max(counts.values()) == 1
    assert watermarks(conn, "dr", stream=s).partitions[0].stored == N - 1


def test_a_drain_whose_name_a_watermark_run_took_meanwhile_fails_before_storing(
    spark: SparkSession,
    broker: BrokerSettings,
    streams: StreamFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Closed while the query runs, and a watermark run of the name takes it, reads 200 offsets and
    stores 199 (writing its records). The drain takes the lease back, finds the record pointer moved
    and fails with the retryable `LeaseLostError` before its final store: the watermark stays the
    other run's 199 (a drain that stored would have moved it to 499). The drain's output, committed
    by Spark's file sink before, holds every offset once."""
    s = streams.stream("drain-lost")
    conn = conn_of(broker)
    publish(broker, s, [b"d%04d" % i for i in range(N)])
    hooks = DrainHooks(monkeypatch)
    other: list[int] = []

    def another_run_takes_the_name() -> None:
        assert hooks.lease is not None
        # The query resolves its start in its own thread: once its first batch is in the offset log
        # it starts at 0 whatever is stored next (else it could start after the other run's 199).
        first_batch = tmp_path / "ck" / "offsets" / "0"
        deadline = time.monotonic() + 60
        while not first_batch.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        close_lease_connection(broker, hooks.lease)
        plan = jobs.plan_read(conn, stream=s, consumer="dl", max_messages=200, lease_wait_s=5)
        consume.run_consume(conn, plan, lambda b: other.extend(b.column("offset").to_pylist()))

    hooks.while_running.append(another_run_takes_the_name)
    with pytest.raises(LeaseLostError) as lost:
        _drain(spark, broker, s, "dl", tmp_path)
    assert lost.value.retryable and "consumer 'dl'" in str(lost.value)
    assert hooks.lease is not None and hooks.lease.regained == 1
    assert sorted(other) == list(range(200))
    assert watermarks(conn, "dl", stream=s).partitions[0].stored == 199, (
        "the drain stored after losing its name"
    )
    counts = _output(spark, tmp_path / "out")
    assert sorted(counts) == list(range(N)) and max(counts.values()) == 1
