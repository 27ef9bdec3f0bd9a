"""Two materializations of one watermark never run at once (pool limit 1), and never move it back."""

import itertools
import threading
import time
from typing import Any

import pytest
from dagster import DagsterEventType, RetryPolicy, materialize
from dagster._core.test_utils import instance_for_test

from dagster_rmqs import RabbitMQStreamsResource, build_stream_asset
from tests.conftest import StreamFactory
from tests.support.broker import BrokerSettings
from tests.support.data import publish

pytestmark = pytest.mark.dagster
POOL_LIMIT_1 = {"concurrency": {"pools": {"default_limit": 1}}}  # what users set in dagster.yaml


def test_two_concurrent_runs_against_one_instance_serialise_on_the_consumer_pool(
    broker: BrokerSettings, streams: StreamFactory, rabbitmq: RabbitMQStreamsResource
) -> None:
    s = streams.stream()
    publish(broker, s, [f"x{i}".encode() for i in range(50)])
    spans: list[tuple[float, float, int]] = []
    first = threading.Event()

    def slow_sink(batch: Any) -> None:
        t0 = time.monotonic()
        if not first.is_set():
            first.set()
            publish(broker, s, [f"late{i}".encode() for i in range(20)])  # arrives during run one
            time.sleep(3)  # run two, started meanwhile, must wait for the pool's slot
        spans.append((t0, time.monotonic(), batch.num_rows))

    asset = build_stream_asset("pooled", stream=s, consumer_name="dgc", sink=slow_sink, engine="arrow")
    assert asset.op.pool == "rmqs-dgc"
    results: list[Any] = []
    with instance_for_test(overrides=POOL_LIMIT_1) as instance:

        def run() -> None:
            results.append(materialize([asset], instance=instance, resources={"rabbitmq": rabbitmq}))

        threads = [threading.Thread(target=run) for _ in range(2)]
        for t in threads:
            t.start()
            time.sleep(0.3)
        for t in threads:
            t.join(120)
        assert len(results) == 2 and all(r.success for r in results)
        rows = sorted(
            int(r.asset_materializations_for_node("pooled")[0].metadata["dagster/row_count"].value)
            for r in results
        )
    # One after the other: run two planned after run one stored, so it read only the late 20.
    assert rows == [20, 50]
    assert sum(n for _, _, n in spans) == 70
    ordered = sorted(spans)
    assert all(a_end <= b_start for (_, a_end, _), (b_start, _, _) in itertools.pairwise(ordered))
    # (the watermark sits past 69: the plan and watermark records take offsets in the stream too)
    assert rabbitmq.lag("dgc", stream=s) == {s: 0}


def test_a_run_whose_watermark_moved_meanwhile_fails_clearly_and_never_moves_it_back(
    broker: BrokerSettings, streams: StreamFactory, rabbitmq: RabbitMQStreamsResource
) -> None:
    """The fallback when no pool limit is set: the jobs layer refuses to store (WatermarkConflictError)."""
    s = streams.stream()
    publish(broker, s, [b"c"] * 30)

    def other_run_meanwhile(batch: Any) -> None:
        rabbitmq.store_watermarks("dgx", {s: 29})  # another run got there first

    asset = build_stream_asset(
        "conflicted",
        stream=s,
        consumer_name="dgx",
        sink=other_run_meanwhile,
        engine="arrow",
        retry_policy=RetryPolicy(max_retries=2),
    )
    result = materialize([asset], resources={"rabbitmq": rabbitmq}, raise_on_error=False)
    assert not result.success
    assert not [e for e in result.all_events if e.event_type == DagsterEventType.STEP_UP_FOR_RETRY]
    (failure,) = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
    assert "WatermarkConflictError" in str(failure.step_failure_data.error)
    assert rabbitmq.stored_offsets("dgx", stream=s) == {s: 29}
