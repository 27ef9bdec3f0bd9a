"""Time intervals (`start="{{ data_interval_start }}"`, `end="{{ data_interval_end }}"`) through the
public operators, against the real broker, counting offsets.

An interval's end is a time on the broker's clock (chunk timestamps). Before the broker's clock
reaches it, the end would resolve to the tails: a message timestamped inside the interval that
arrives after the run would be in neither that interval's run nor the next one's, which starts at
the end. Such a run is refused (`OpenWindowError`, retryable) before it reads anything.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_rmqs.operators import RabbitMQStreamConsumeOperator, RabbitMQStreamReadOperator
from pyspark_rmqs.errors import OpenWindowError, classify
from tests.airflow.conftest import secret_uri
from tests.support.broker import BrokerSettings
from tests.support.data import client, publish

pytestmark = [pytest.mark.broker, pytest.mark.airflow]


def rendered(ms: int) -> str:
    """A time as Airflow renders `{{ data_interval_end }}` into a templated field."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def rows_of(batches: list[pa.RecordBatch]) -> list[tuple[int, int]]:
    """(offset, chunk timestamp in epoch ms) of every row a run delivered, repeats kept."""
    out = []
    for b in batches:
        stamps = b["chunk_timestamp"].cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64()).to_pylist()
        out.extend(zip(b["offset"].to_pylist(), stamps, strict=True))
    return sorted(out)


def test_an_interval_run_before_its_end_passed_on_the_broker_loses_no_message(
    broker: BrokerSettings, streams: Any
) -> None:
    """The reported loss, shortened to seconds: interval 1 is run while its end is still ahead of the
    broker's clock (10 messages in it so far); 20 more arrive, timestamped inside interval 1, after
    that run; 15 arrive in interval 2; the stream is then idle. Interval 1's run is refused, and its
    retry after the end passed, then interval 2's run, deliver every offset once, each in the
    interval its chunk timestamp falls in. The old code ended interval 1 at the tail (offsets
    [0, 10)) and interval 2 started at its start (offset 30): offsets 10-29 were in neither run.
    """
    s = streams.stream("interval")
    publish(broker, s, [f"a{i}".encode() for i in range(10)])
    found = client(broker).oldest_chunks([s])[s]
    assert found is not None
    broker_then = found[1]  # the broker's clock at the first publish (epoch ms)
    # An upper bound on how far the local clock is ahead of the broker's (the publish's latency too).
    ahead_s = time.time() - broker_then / 1000
    start1, end1 = broker_then - 1000, broker_then + 5000
    end2 = end1 + 2000

    def sleep_until_broker_passed(ms: int) -> None:
        time.sleep(max(0.0, ms / 1000 + ahead_s + 0.3 - time.time()))

    delivered: dict[str, list[pa.RecordBatch]] = {"interval 1": [], "interval 2": []}

    def interval(name: str, start: int, end: int) -> RabbitMQStreamConsumeOperator:
        return RabbitMQStreamConsumeOperator(
            task_id=name.replace(" ", "_"),
            stream=s,
            start=rendered(start),
            end=rendered(end),
            apply_function=delivered[name].append,
            retries=3,
        )

    first = interval("interval 1", start1, end1)
    t0 = time.monotonic()
    refused: OpenWindowError | None = None
    try:
        first.execute({})  # the early run: interval 1's end is ~5 s ahead of the broker's clock
    except OpenWindowError as e:
        refused = e
    refusal_s = time.monotonic() - t0
    publish(broker, s, [f"b{i}".encode() for i in range(20)])  # after the run, inside interval 1
    sleep_until_broker_passed(end1)
    publish(broker, s, [f"c{i}".encode() for i in range(15)])  # interval 2
    sleep_until_broker_passed(end2)  # nothing is published after interval 2: only a stamp closes it
    if refused is not None:
        retried = first.execute({})  # Airflow's retry, once the interval ended
        assert retried["rows"] == 30 and retried["end_offsets"] == {s: 30}, retried
    second = interval("interval 2", end1, end2).execute({})

    one, two = rows_of(delivered["interval 1"]), rows_of(delivered["interval 2"])
    offsets = [o for o, _ in one + two]
    assert sorted(offsets) == list(range(45)), f"{len(offsets)} rows for 45 published messages: {offsets}"
    assert all(start1 <= ts < end1 for _, ts in one), "the test was too slow: 'b' landed after interval 1"
    assert all(end1 <= ts < end2 for _, ts in two)
    assert second["start_offsets"] == {s: 30} and second["rows"] == 15
    # Refused, and cheaply: one probe of the broker's clock, nothing read, nothing recorded.
    assert refused is not None and refusal_s < 4.0
    text = str(refused)
    assert f"({end1} ms)" in text and "broker's clock has not reached" in text, text
    assert classify(refused).retryable  # Airflow retries it (airflow_failures lets it through)


def test_an_open_interval_is_refused_by_the_spark_operator_too_naming_it_without_secrets(
    broker: BrokerSettings, streams: Any, secret_user: tuple[str, str], conn_env: Any, tmp_path: Path
) -> None:
    """The Spark read operator shares the check: refused before a session starts or a file is
    written, the error names the interval, the broker's clock and what to do, and no password.
    An end that is not a time is not checked: a start in the future with `end="latest"` reads
    nothing (every message at or after the start comes later), and fails nothing."""
    user, password = secret_user
    conn_env("rmqs_secret", secret_uri(broker, user, password))
    s = streams.stream("open")
    publish(broker, s, [b"x"] * 5)
    now = datetime.now(UTC)
    op = RabbitMQStreamReadOperator(
        task_id="read",
        stream=s,
        rabbitmq_stream_conn_id="rmqs_secret",
        start=(now - timedelta(hours=1)).isoformat(),
        end=(now + timedelta(hours=1)).isoformat(),
        output_path=str(tmp_path / "out"),
    )
    with pytest.raises(OpenWindowError) as refused:
        op.execute({})
    assert not isinstance(refused.value, AirflowFailException)
    text = str(refused.value)
    assert password not in text and user not in text
    assert "the newest chunk of" in text and s in text and "Retry once" in text, text
    assert not (tmp_path / "out").exists() and op._spark is None

    future_start = RabbitMQStreamConsumeOperator(
        task_id="future",
        stream=s,
        rabbitmq_stream_conn_id="rmqs_secret",
        start=(now + timedelta(hours=1)).isoformat(),
        end="latest",
        apply_function=lambda batch: None,
    )
    summary = future_start.execute({})
    assert summary["rows"] == 0 and summary["end_offsets"] == {s: 5}
