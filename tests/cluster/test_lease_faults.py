"""The node a run's lease connection is on killed (kill -9) in the middle of the run, between the read
and the record's `delivered`: the broker ends the lease with the node. The run takes its lease back
through a live node and finishes, or fails with a retryable error naming its consumer; a retry (as
Airflow or Dagster would make) resumes the record. Every offset reaches a sink, the watermark ends
at the tail, and it is stored by one run at a time, never backwards.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from pyspark_rmqs import consume, jobs
from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.broker.writer import StreamProducer, WriteSettings
from pyspark_rmqs.errors import ConsumerBusyError, RmqsError
from pyspark_rmqs.runs import record as run_record
from pyspark_rmqs.runs import steps
from pyspark_rmqs.runs.lease import Lease
from tests.cluster.conftest import ClusterStreams
from tests.cluster.support import ClusterSettings, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_the_node_of_a_runs_lease_killed_mid_run(
    local_cluster: ClusterSettings, cluster_streams: ClusterStreams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the kill, a second run of the consumer tries to start while the first stores its
    watermark: it is turned away (the first took its lease back); without taking it back, it would
    get the name while the first still writes."""
    conn = local_cluster.conn()
    s = cluster_streams.stream("kl")
    n = 3_000
    with StreamProducer(conn, s, superstream=False, settings=WriteSettings()) as p:
        p.send([b"l%06d" % i for i in range(n)])
        p.flush()
    seen: list[int] = []
    killed: list[int] = []
    turned_away: list[BaseException] = []
    stored: list[dict[str, int]] = []
    real_store = steps.store_watermarks_checked

    def store_while_another_run_tries(
        c: Any, consumer: str, wanted: dict[str, int], *a: Any, **k: Any
    ) -> Any:
        if killed and not turned_away:
            try:
                jobs.plan_read(conn, stream=s, consumer="kl", lease_wait_s=2).release()
            except ConsumerBusyError as e:
                turned_away.append(e)
        kept = real_store(c, consumer, wanted, *a, **k)
        stored.append(dict(wanted))
        return kept

    monkeypatch.setattr(steps, "store_watermarks_checked", store_while_another_run_tries)
    tries: list[str] = []
    leases: list[Lease] = []
    for attempt in range(3):
        plan = jobs.plan_read(conn, stream=s, consumer="kl", lease_wait_s=30)
        assert plan.lease is not None
        leases.append(plan.lease)
        t0 = time.monotonic()
        try:
            summary = consume.run_consume(
                conn, plan, _killing_sink(local_cluster, plan.lease, n, seen, killed)
            )
        except RmqsError as e:  # a failed try must be retryable and say whose run it was
            tries.append(f"failed after {time.monotonic() - t0:.1f} s: {e!r}")
            assert e.retryable and "'kl'" in str(e), f"try {attempt + 1}: {e!r}"
            continue
        tries.append(
            f"finished in {time.monotonic() - t0:.1f} s, lease taken back {plan.lease.regained} time(s)"
        )
        break
    else:
        pytest.fail(f"no try finished: {tries}")
    print(f"node {killed} killed; tries: {tries}")
    assert killed, "the lease's node was never killed"
    assert turned_away, "another run got the name while the first was still storing"
    counts = Counter(seen)
    assert sorted(counts) == list(range(n)), f"{n - len(counts)} offset(s) never delivered"
    if len(tries) == 1:  # it finished on its first try: nothing delivered twice
        assert max(counts.values()) == 1 and leases[0].regained == 1
    assert stored and all(v == {s: n - 1} for v in stored), f"stores: {stored}"
    assert len(stored) == 1 or tries[0].startswith("failed"), f"stored twice: {stored}"
    survivors = [i for i in (1, 2, 3) if i not in killed]
    check = BrokerClient(local_cluster.conn(seeds=survivors))
    assert check.stored_offset("kl", s) == n - 1
    record = run_record.latest(local_cluster.conn(seeds=survivors), "kl", s)
    assert record is not None and record.done
    assert summary.watermark_stored


def _killing_sink(
    cluster: ClusterSettings, lease: Lease, n: int, seen: list[int], killed: list[int]
) -> Callable[[pa.RecordBatch], None]:
    """A sink taking the offsets; once it has all `n`, it kills the node of `lease`'s connection
    (the first time only) and waits until the run has seen the connection close."""

    def sink(batch: pa.RecordBatch) -> None:
        seen.extend(int(o) for o in batch.column("offset").to_pylist())
        if len(seen) >= n and not killed:
            victim = cluster.index(lease.node)
            cluster.kill(victim)
            killed.append(victim)
            wait_for(lambda: not lease.held, 30, "the run to see its lease's connection close")

    return sink
