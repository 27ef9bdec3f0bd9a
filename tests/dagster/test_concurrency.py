"""Two materializations of one watermark never run at once (pool limit 1), and never move it back."""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterEventType, DagsterInstance, RetryPolicy, materialize

from dagster_rmqs import RabbitMQStreamsResource, build_stream_asset
from tests.conftest import StreamFactory
from tests.support.broker import BrokerSettings
from tests.support.data import publish

pytestmark = pytest.mark.dagster
ROOT = Path(__file__).resolve().parents[2]


RUN = textwrap.dedent(
    """
    import json, os, pathlib, sys, time
    from dagster import DagsterInstance, materialize
    from dagster_rmqs import RabbitMQStreamsResource, build_stream_asset

    endpoints, user, password, stream, rendezvous = sys.argv[1:6]

    def slow_sink(batch):
        # Hold the pool's slot until the other run's step waits for it: first until the other
        # process is about to materialize (however long its imports took), then until its step is
        # pending in the instance's pool (asked once a second: the instance is one SQLite file).
        if not batch.num_rows:
            return
        deadline = time.monotonic() + 120
        while len(list(pathlib.Path(rendezvous).glob("ready-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if instance.event_log_storage.get_concurrency_info("rmqs-dgc").pending_step_count:
                return
            time.sleep(1.0)

    asset = build_stream_asset("pooled", stream=stream, consumer_name="dgc", sink=slow_sink, engine="arrow")
    rabbitmq = RabbitMQStreamsResource(endpoints=endpoints, username=user, password=password)
    instance = DagsterInstance.get()  # DAGSTER_HOME: one instance shared by both processes
    (pathlib.Path(rendezvous) / f"ready-{os.getpid()}").touch()
    result = materialize([asset], instance=instance, resources={"rabbitmq": rabbitmq})
    (m,) = result.asset_materializations_for_node("pooled")
    logs = [e.message or "" for e in instance.all_logs(result.run_id)]
    blocked = any("blocked by limit for pool rmqs-dgc" in line for line in logs)
    print(json.dumps({"rows": m.metadata["dagster/row_count"].value, "blocked": blocked}))
    """
)


def test_two_concurrent_runs_against_one_instance_serialise_on_the_consumer_pool(
    broker: BrokerSettings, streams: StreamFactory, rabbitmq: RabbitMQStreamsResource, tmp_path: Path
) -> None:
    """Two processes materialize one watermark asset against one instance (pools default_limit 1)."""
    s = streams.stream()
    publish(broker, s, [f"x{i}".encode() for i in range(50)])
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("concurrency:\n  pools:\n    default_limit: 1\n")
    # The pool's limit as Dagster sets it at the first claim, set once before both processes start:
    # two first claims in the same few milliseconds both started their steps (seen once in a
    # fresh-clone run: one slot row, both STEP_START 5 ms apart, neither blocked).
    with DagsterInstance.from_config(str(home)) as instance:
        assert instance.event_log_storage.initialize_concurrency_limit_to_default("rmqs-dgc")
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    rendezvous = tmp_path / "rendezvous"
    rendezvous.mkdir()
    args = [f"{broker.host}:{broker.port}", broker.username, broker.password, s, str(rendezvous)]
    procs = []
    for _ in range(2):
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", RUN, *args],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
        time.sleep(0.5)
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    # Serialised: the run that got the slot read all 50; the other waited for it, then planned from
    # the stored watermark and read nothing. Run at once, both would read the same recorded range.
    assert sorted(r["rows"] for r in reports) == [0, 50]
    assert any(r["blocked"] for r in reports)
    assert rabbitmq.lags("dgc", stream=s) == {s: 0} and rabbitmq.lag("dgc", stream=s) == 0


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
