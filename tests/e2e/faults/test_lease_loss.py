"""A run's lease ended under it: the broker closes the lease's connection between the read and the
record's `delivered` (the management API's `DELETE /api/connections/<name>`, as when the node the
connection is on dies; the node itself is killed in tests/cluster/test_lease_loss.py).

Spark-free runs (`consume.run_consume`; `jobs.run_read` ends through the same `finish_run`) on the
shared broker. Each test counts offsets: what each sink received, and where the watermark is.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pytest

from pyspark_rmqs import consume, jobs
from pyspark_rmqs.errors import ConsumerBusyError, LeaseLostError
from pyspark_rmqs.runs import record as run_record
from pyspark_rmqs.runs import steps
from pyspark_rmqs.runs.lease import Lease
from pyspark_rmqs.watermarks import watermarks
from tests.conftest import StreamFactory
from tests.support.broker import BrokerSettings, management
from tests.support.data import client, conn_of, publish

pytestmark = [pytest.mark.broker]
N = 500


def _until(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def close_lease_connection(broker: BrokerSettings, lease: Lease | str) -> None:
    """Have the broker close `lease`'s connection (found by its client-provided name; a lease's name
    when the lease object is not at hand), then, given the lease, wait until the run's process has
    seen it close: the lease ended under the run."""
    if broker.external:
        pytest.skip("closes a connection through the local broker's management API")
    wanted = f"rmqs-lease:{lease if isinstance(lease, str) else lease.name}"[:120]

    def named() -> str | None:  # the management API lists a connection after its first stats (~5 s)
        for c in management("GET", "connections?columns=name,client_properties"):
            if (c.get("client_properties") or {}).get("connection_name") == wanted:
                return str(c["name"])
        return None

    name = _until(named, 30, f"the connection '{wanted}' in the management API")
    management("DELETE", f"connections/{quote(name, safe='')}")
    if not isinstance(lease, str):
        _until(lambda: not lease.held, 15, "the run to see its lease's connection closed")


def _offsets(batch: pa.RecordBatch) -> list[int]:
    return [int(o) for o in batch.column("offset").to_pylist()]


def test_a_run_whose_lease_connection_is_closed_takes_the_lease_back_and_finishes(
    broker: BrokerSettings, streams: StreamFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closed between the read and `delivered`: the run takes the lease back before writing its
    record and finishes; every offset once, the watermark at the tail; and it holds the name again
    while it stores: a run trying meanwhile is turned away (without taking the lease back, that run
    would get the name while the first still stores)."""
    s = streams.stream("lease-back")
    conn = conn_of(broker)
    publish(broker, s, [b"m%04d" % i for i in range(N)])
    plan = jobs.plan_read(conn, stream=s, consumer="lb")
    assert plan.lease is not None
    seen: list[int] = []

    def sink(batch: pa.RecordBatch) -> None:
        seen.extend(_offsets(batch))
        if len(seen) >= N and plan.lease is not None and plan.lease.held:
            close_lease_connection(broker, plan.lease)  # the whole range is in the sink

    turned_away: list[BaseException] = []
    real_store = steps.store_watermarks_checked

    def store_while_another_run_tries(*a: Any, **k: Any) -> dict[str, int]:
        try:
            jobs.plan_read(conn, stream=s, consumer="lb", lease_wait_s=1).release()
        except ConsumerBusyError as e:
            turned_away.append(e)
        return real_store(*a, **k)

    monkeypatch.setattr(steps, "store_watermarks_checked", store_while_another_run_tries)
    summary = consume.run_consume(conn, plan, sink)
    assert turned_away, "another run got the name while this one was still storing"
    assert plan.lease.regained == 1, "the run did not take its lease back"
    counts = Counter(seen)
    assert sorted(counts) == list(range(N)) and max(counts.values()) == 1
    assert summary.rows == N and summary.watermark_stored
    assert watermarks(conn, "lb", stream=s).partitions[0].stored == N - 1
    record = run_record.latest(conn, "lb", s)
    assert record is not None and record.done
    again = jobs.plan_read(conn, stream=s, consumer="lb")
    assert again.is_empty
    again.release()


def test_a_run_that_lost_its_lease_to_another_run_fails_clearly_and_stores_nothing(
    broker: BrokerSettings, streams: StreamFactory
) -> None:
    """Closed between the read and `delivered`, and another run of the name takes it meanwhile,
    resumes the record and finishes it. The first run takes the lease back, finds the record moved
    and fails with `LeaseLostError` (retryable, naming the consumer) before writing anything: its
    record and watermark stay the other run's. The next run reads exactly what arrived since, once."""
    s = streams.stream("lease-lost")
    conn = conn_of(broker)
    publish(broker, s, [b"m%04d" % i for i in range(N)])
    first = jobs.plan_read(conn, stream=s, consumer="ll")
    assert first.lease is not None
    delivered: dict[str, list[int]] = {"first": [], "other": [], "next": []}
    pointer: list[int | None] = []

    def first_sink(batch: pa.RecordBatch) -> None:
        delivered["first"].extend(_offsets(batch))
        if len(delivered["first"]) < N or first.lease is None or not first.lease.held:
            return
        close_lease_connection(broker, first.lease)
        other = jobs.plan_read(conn, stream=s, consumer="ll", lease_wait_s=5)  # takes the name
        assert other.resumed and other.ranges == first.ranges
        consume.run_consume(conn, other, lambda b: delivered["other"].extend(_offsets(b)))
        publish(broker, s, [b"n%04d" % i for i in range(N)])  # arrives after the other run
        pointer.append(client(broker).stored_offset(run_record.run_key("ll", s), run_record.RUNS_STREAM))

    with pytest.raises(LeaseLostError) as lost:
        consume.run_consume(conn, first, first_sink)
    message = str(lost.value)
    assert "consumer 'll'" in message and "record pointer" in message and "Retry" in message
    assert lost.value.retryable
    # The first run stored nothing: the pointer and the watermark are the other run's.
    key = run_record.run_key("ll", s)
    assert client(broker).stored_offset(key, run_record.RUNS_STREAM) == pointer[0]
    assert watermarks(conn, "ll", stream=s).partitions[0].stored == N - 1
    assert sorted(delivered["other"]) == list(range(N))
    summary = consume.run_consume(
        conn,
        jobs.plan_read(conn, stream=s, consumer="ll"),
        lambda b: delivered["next"].extend(_offsets(b)),
    )
    nxt = Counter(delivered["next"])
    assert len(nxt) == N and max(nxt.values()) == 1, "the next run read an offset twice or missed one"
    assert min(nxt) >= N, "the next run read offsets the other run had delivered"
    assert summary.rows == N
    assert watermarks(conn, "ll", stream=s).partitions[0].stored == max(nxt)
