"""End to end: the example DAGs under `dag.test()` against the real broker and Spark.

Each test runs DAG files from `dags/` (parsed with RMQS_DEMO_* pointing at fresh streams) and
checks the exact rows in the sink and the broker-stored watermarks afterwards.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_rmqs.hooks import RabbitMQStreamHook
from tests.airflow.conftest import load_dag_module, secret_uri, write_dag_file
from tests.support.broker import BrokerSettings
from tests.support.data import publish, publish_keyed

pytestmark = [pytest.mark.airflow, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _airflow_and_spark(airflow_db: str, spark: Any) -> None:
    """dag.test() needs the metadata DB; operators reuse the session's SparkSession (getOrCreate)."""


def rows(spark: Any, path: Path) -> list[bytes]:
    return sorted(bytes(r.value) for r in spark.read.parquet(str(path)).collect())


def xcom(dag_run: Any, task_id: str) -> Any:
    return dag_run.get_task_instance(task_id).xcom_pull(task_ids=task_id)


def demo_env(superstream: str, out: Path, consumer: str) -> dict[str, str]:
    return {
        "RMQS_DEMO_SUPERSTREAM": superstream,
        "RMQS_DEMO_OUTPUT": str(out),
        "RMQS_DEMO_CONSUMER": consumer,
        "RMQS_DEMO_EVENTS_CONSUMER": consumer,
        "RMQS_DEMO_POKE_INTERVAL": "0.5",
        "RMQS_DEMO_SENSOR_TIMEOUT": "120",
        "RMQS_DEMO_MAX_LAG": "0",
    }


def test_ingest_dag(spark, broker: BrokerSettings, streams, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    name, parts = streams.super_stream(3)
    out = tmp_path / "orders"
    module = load_dag_module("rmqs_ingest", demo_env(name, out, "ingest"), monkeypatch)
    first = [(f"k{i}", f"order-{i}".encode()) for i in range(90)]
    # Published only once the deferrable new-data sensor waits in its trigger.
    later = threading.Timer(3.0, publish_keyed, (broker, name, first))
    later.start()
    try:
        dag_run = module.dag.test()
    finally:
        later.join()
    assert dag_run.state == "success"
    assert rows(spark, out) == sorted(body for _, body in first)
    hook = RabbitMQStreamHook()
    w = hook.watermarks("ingest", superstream=name)
    assert all(p.stored == p.tail - 1 for p in w.partitions if p.tail)  # advanced to the end of the read
    summary = xcom(dag_run, "read_to_parquet")
    assert (summary["rows"], summary["lag_after"], summary["watermark_stored"]) == (90, 0, True)
    assert summary["start_offsets"] == {p: 0 for p in parts}
    assert summary["end_offsets"] == {p.stream: p.tail for p in w.partitions}
    assert sum(summary["end_offsets"].values()) == 90  # watermark moved by exactly the rows read
    sensed = xcom(dag_run, "wait_for_new_data")
    assert sensed["total_lag"] >= 1 and set(sensed["pending"]) <= set(parts)
    assert xcom(dag_run, "report") == {"rows": 90, "output": str(out)}

    second = [(f"k{i}", f"order-{i}".encode()) for i in range(90, 120)]
    publish_keyed(broker, name, second)
    dag_run = module.dag.test()
    assert dag_run.state == "success"
    summary = xcom(dag_run, "read_to_parquet")
    assert summary["rows"] == 30 and summary["lag_after"] == 0
    assert rows(spark, out) == sorted(body for _, body in first + second)  # only the new rows were added
    after = hook.watermarks("ingest", superstream=name)
    assert {p.stream: p.stored + 1 for p in after.partitions if p.stored is not None} == {
        s: e for s, e in summary["end_offsets"].items() if e
    }


FAILING_DAG = '''
import json
import os
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_rmqs.hooks import RabbitMQStreamHook
from airflow_rmqs.operators import RabbitMQStreamReadOperator

OUT = os.environ["RMQS_TEST_OUT"]
STREAM = os.environ["RMQS_TEST_STREAM"]
CONN_ID = os.environ["RMQS_TEST_CONN_ID"]


def sink_then_fail_once(df, context, token):
    """Write the rows, then fail the first attempt before the sink "commits" (returns)."""
    attempt = context["ti"].try_number
    with open(os.path.join(OUT, f"token-{attempt}.json"), "w") as f:
        json.dump(token.to_dict(), f)
    stored = RabbitMQStreamHook(CONN_ID).stored_offsets("job", stream=STREAM)
    with open(os.path.join(OUT, f"watermark-before-{attempt}.json"), "w") as f:
        json.dump(stored, f)
    df.write.parquet(os.path.join(OUT, f"attempt-{attempt}"))
    if attempt == 1:
        # New data arrives before the retry: the retry must still read exactly the planned range.
        from pyspark_rmqs.broker.writer import StreamProducer, WriteSettings
        from pyspark_rmqs.core.codec import encode

        conn = RabbitMQStreamHook(CONN_ID).get_conn()
        with StreamProducer(conn, STREAM, superstream=False, settings=WriteSettings()) as p:
            p.send([encode(f"late{i}".encode()) for i in range(25)])
            p.flush()
        raise RuntimeError("injected failure after the read, before the sink commit")


with DAG("rmqs_test_retry", schedule=None, start_date=datetime(2025, 1, 1)) as dag:
    RabbitMQStreamReadOperator(
        task_id="read",
        stream=STREAM,
        consumer_name="job",
        process=sink_then_fail_once,
        rabbitmq_stream_conn_id=CONN_ID,
        retries=1,
        retry_delay=timedelta(seconds=0),
    )
'''


def test_failure_before_the_sink_commit_keeps_the_watermark_and_the_retry_rereads(
    spark, broker: BrokerSettings, streams, secret_user, tmp_path: Path, monkeypatch, conn_env, capfd, caplog
) -> None:  # type: ignore[no-untyped-def]
    user, password = secret_user
    conn_env("rmqs_secret", secret_uri(broker, user, password))
    s = streams.stream()
    bodies = [f"m{i}".encode() for i in range(40)]
    publish(broker, s, bodies)
    path = write_dag_file("rmqs_test_retry", FAILING_DAG)
    env = {"RMQS_TEST_OUT": str(tmp_path), "RMQS_TEST_STREAM": s, "RMQS_TEST_CONN_ID": "rmqs_secret"}
    module = load_dag_module(path.stem, env, monkeypatch)
    dag_run = module.dag.test()
    assert dag_run.state == "success"
    assert json.loads((tmp_path / "watermark-before-2.json").read_text()) == {
        s: None
    }  # unchanged by the failure
    # The retry read the recorded plan [0, 40), not the 25 messages published after it.
    assert rows(spark, tmp_path / "attempt-1") == rows(spark, tmp_path / "attempt-2") == sorted(bodies)
    assert RabbitMQStreamHook().stored_offsets("job", stream=s) == {s: 39}
    summary = xcom(dag_run, "read")
    assert summary["rows"] == 40
    assert summary["start_offsets"] == {s: 0} and summary["end_offsets"] == {s: 40}
    assert summary["resumed_plan"] is True
    # The process got the run's range token, the same on the retry (to make its own writes idempotent).
    tokens = [json.loads((tmp_path / f"token-{i}.json").read_text()) for i in (1, 2)]
    assert tokens[0] == tokens[1]
    incarnations = tokens[0].pop("incarnations")  # the stream's identity is part of the token
    assert list(incarnations) == [s] and incarnations[s] > 0
    assert tokens[0] == {"token": summary["token"], "consumer": "job", "ranges": {s: [0, 40]}}
    assert summary["pipeline"] == "rmqs_test_retry/read" and summary["retry_count"] == 1
    assert summary["records_read"] == summary["records_written"] == 40
    # The password is in no log line, XCom value or rendered field.
    from airflow.models.renderedtifields import RenderedTaskInstanceFields

    rendered = RenderedTaskInstanceFields.get_templated_fields(dag_run.get_task_instance("read"))
    assert rendered and rendered["stream"] == s
    captured = capfd.readouterr()
    for text in (
        captured.out,
        captured.err,
        caplog.text,
        json.dumps(summary),
        json.dumps(rendered, default=str),
    ):
        assert password not in text


def test_event_driven_dag(spark, broker: BrokerSettings, streams, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from airflow_rmqs.triggers import RabbitMQStreamNewDataTrigger

    name, parts = streams.super_stream(2)
    out = tmp_path / "orders"
    module = load_dag_module("rmqs_event_driven", demo_env(name, out, "events"), monkeypatch)
    [asset] = module.dag.timetable.asset_condition.objects
    assert asset.uri == f"rabbitmq-stream://localhost:5552/%2F/{name}"
    [watcher] = asset.watchers
    trigger = watcher.trigger
    assert isinstance(trigger, RabbitMQStreamNewDataTrigger)
    trigger.poll_interval = 0.1

    bodies = [(f"k{i}", f"e{i}".encode()) for i in range(25)]
    publish_keyed(broker, name, bodies)

    async def first_event() -> dict[str, Any]:
        gen = trigger.run()
        try:
            return (await asyncio.wait_for(anext(gen), 10)).payload
        finally:
            await gen.aclose()

    event = asyncio.run(first_event())
    assert event["total_lag"] == 25 and set(event["partitions"]) == set(parts)
    dag_run = module.dag.test()
    assert dag_run.state == "success"
    assert rows(spark, Path(f"{out}-events")) == sorted(b for _, b in bodies)
    assert RabbitMQStreamHook().lag("events", superstream=name) == 0


def test_backfill_dag_reads_exactly_its_range_and_leaves_the_live_watermark(
    spark, broker: BrokerSettings, streams, tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    name, parts = streams.super_stream(2)
    publish(broker, parts[0], [f"a{i}".encode() for i in range(10)])
    publish(broker, parts[1], [f"b{i}".encode() for i in range(10)])
    time.sleep(1.2)  # chunk timestamps are in milliseconds: leave a clear gap around the cut
    cut = datetime.now(UTC)
    time.sleep(1.2)
    publish(broker, parts[0], [f"late-a{i}".encode() for i in range(5)])
    publish(broker, parts[1], [f"late-b{i}".encode() for i in range(3)])
    hook = RabbitMQStreamHook()
    hook.store_watermarks("live", {parts[0]: 3, parts[1]: 4})
    module = load_dag_module("rmqs_backfill", demo_env(name, tmp_path / "orders", "live"), monkeypatch)

    offsets_out = tmp_path / f"offsets-{uuid.uuid4().hex[:4]}"
    conf = {
        "start": {parts[0]: 2, parts[1]: 7},
        "end": {parts[0]: 5, parts[1]: 9},
        "output_path": str(offsets_out),
    }
    dag_run = module.dag.test(run_conf=conf)
    assert dag_run.state == "success"
    assert rows(spark, offsets_out) == sorted([b"a2", b"a3", b"a4", b"b7", b"b8"])
    summary = xcom(dag_run, "backfill_range")
    assert (summary["rows"], summary["watermark_stored"]) == (5, False)

    time_out = tmp_path / "time-range"
    dag_run = module.dag.test(
        run_conf={"start": cut.isoformat(), "end": "latest", "output_path": str(time_out)}
    )
    assert dag_run.state == "success"
    expected = [f"late-a{i}".encode() for i in range(5)] + [f"late-b{i}".encode() for i in range(3)]
    assert rows(spark, time_out) == sorted(expected)
    assert hook.stored_offsets("live", superstream=name) == {
        parts[0]: 3,
        parts[1]: 4,
    }  # the live watermark is untouched
