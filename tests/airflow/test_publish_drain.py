"""Publish and drain operators, executed directly (no metadata DB) against the broker and Spark."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_rmqs.hooks import RabbitMQStreamHook
from airflow_rmqs.operators import RabbitMQStreamDrainOperator, RabbitMQStreamPublishOperator
from tests.support.broker import BrokerSettings
from tests.support.data import publish, settled_bounds

pytestmark = [pytest.mark.airflow, pytest.mark.slow]


def _drain_generation(
    tmp_path: Path, stream: str, consumer: str, name: str, **source: str
) -> RabbitMQStreamDrainOperator:
    """A drain of `stream` whose checkpoint and output folder are generation `name`'s."""
    return RabbitMQStreamDrainOperator(
        task_id="drain",
        stream=stream,
        consumer_name=consumer,
        checkpoint_location=str(tmp_path / f"cp-{name}"),
        output_path=str(tmp_path / f"out-{name}"),
        source_options=source,
    )


def test_publish_then_drain(spark: Any, broker: BrokerSettings, streams, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    name, parts = streams.super_stream(2)
    source = tmp_path / "input"
    spark.createDataFrame(
        [(f"p{i}".encode(), f"key-{i}") for i in range(50)], "value binary, routing_key string"
    ).write.parquet(str(source))
    published = RabbitMQStreamPublishOperator(
        task_id="publish",
        superstream=name,
        input_path=str(source),
        sink_options='{"producerName": "loader", "routingStrategy": "hash"}',  # as a rendered template
    ).execute({})
    assert published["rows"] == 50 and published["target"] == name
    hook = RabbitMQStreamHook()
    assert sum(hook.tails(superstream=name).values()) == 50

    drain = RabbitMQStreamDrainOperator(
        task_id="drain",
        superstream=name,
        consumer_name="drainer",
        checkpoint_location=str(tmp_path / "checkpoint"),
        output_path=str(tmp_path / "out"),
        source_options={"maxRecordsPerTrigger": "20"},
        timeout=120,
    )
    ti = SimpleNamespace(dag_id="lake", task_id="drain", try_number=2)
    summary = drain.execute({"ti": ti})
    assert summary["rows"] == 50 and summary["lag_after"] == 0 and summary["batches"] >= 2
    # The standard run metrics: the task's identity and what the file sink committed, measured.
    assert (summary["pipeline"], summary["retry_count"]) == ("lake/drain", 1)
    assert summary["records_written"] == 50 and summary["bytes_read"] == sum(len(f"p{i}") for i in range(50))
    written = sum(p.stat().st_size for p in (tmp_path / "out").glob("part-*.parquet"))
    assert summary["bytes_written"] == written > 0
    out = sorted(bytes(r.value) for r in spark.read.parquet(str(tmp_path / "out")).collect())
    assert out == sorted(f"p{i}".encode() for i in range(50))

    publish(broker, parts[1], [b"late"] * 3)  # the next drain picks up only what is new
    assert drain.execute({})["rows"] == 3


def test_a_drain_on_a_new_checkpoint_into_a_folder_another_one_wrote_is_refused_and_loses_nothing(
    spark: Any, broker: BrokerSettings, streams, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """A drain whose checkpoint was lost (or replaced) writing into the folder the old checkpoint
    wrote: Spark's file sink would skip the new query's first batches as already in its log while
    the consumer's watermark moved past them (before the fix: 50 of 50 new messages in no file, the
    watermark at the tail, lag 0, no error). It is refused before reading, naming both options; the
    old checkpoint then drains every offset once."""
    from airflow.exceptions import AirflowFailException

    from pyspark_rmqs.committed import committed_dataset
    from pyspark_rmqs.watermarks import watermarks
    from tests.support.data import conn_of

    s = streams.stream("nc")
    publish(broker, s, [f"a{i}".encode() for i in range(100)])
    out = str(tmp_path / "out")

    def drain(checkpoint: str) -> RabbitMQStreamDrainOperator:
        return RabbitMQStreamDrainOperator(
            task_id="drain", stream=s, consumer_name="nc", checkpoint_location=checkpoint, output_path=out
        )

    assert drain(str(tmp_path / "cp1")).execute({})["rows"] == 100
    publish(broker, s, [f"b{i}".encode() for i in range(50)])
    with pytest.raises(AirflowFailException, match="checkpoint_location") as refused:
        drain(str(tmp_path / "cp2")).execute({})
    assert "output_path" in str(refused.value) and "Nothing was read" in str(refused.value)
    assert watermarks(conn_of(broker), "nc", stream=s).partitions[0].stored == 99, (
        "the refused drain moved it"
    )

    assert drain(str(tmp_path / "cp1")).execute({})["rows"] == 50
    got = committed_dataset(out).to_table(columns=["value", "offset"])
    bodies = [bytes(v) for v in got.column("value").to_pylist()]
    assert sorted(bodies) == sorted(
        [f"a{i}".encode() for i in range(100)] + [f"b{i}".encode() for i in range(50)]
    )
    assert len(set(got.column("offset").to_pylist())) == 150, "every offset once"


def test_a_drain_of_a_stream_deleted_and_created_again_is_refused_and_a_new_checkpoint_reads_it_whole(
    spark: Any, broker: BrokerSettings, streams, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """A stream the drain's checkpoint read, deleted and created again, then filled past the old
    stream's end: the checkpoint's offsets are the old stream's, so the drain read only what came
    after the old end (before the fix: 100 drained, the stream re-created, 30 then 600 published,
    530 delivered, the watermark at the tail, lag 0, no error). Refused before reading, naming the
    stream and the options; a new checkpoint and output then read the new stream whole."""
    from airflow.exceptions import AirflowFailException

    from pyspark_rmqs.committed import committed_dataset
    from tests.support import broker as tb

    s = streams.stream("rc")

    def drain(name: str) -> RabbitMQStreamDrainOperator:
        return _drain_generation(tmp_path, s, "rc", name)

    publish(broker, s, [f"a{i}".encode() for i in range(100)])
    assert drain("old").execute({})["rows"] == 100
    tb.run(tb.delete_stream(broker, s))
    tb.run(tb.create_stream(broker, s))
    new = [f"n{i}".encode() for i in range(130)]
    publish(broker, s, new[:30])
    with pytest.raises(AirflowFailException, match="deleted and created again") as refused:
        drain("old").execute({})
    assert "checkpoint_location" in str(refused.value) and repr(s) in str(refused.value)
    publish(broker, s, new[30:])  # past the old stream's end: offsets alone would not tell
    with pytest.raises(AirflowFailException, match="deleted and created again"):
        drain("old").execute({})

    assert drain("new").execute({})["rows"] == 130
    got = committed_dataset(str(tmp_path / "out-new")).to_table(columns=["value"]).column("value")
    assert sorted(bytes(v) for v in got.to_pylist()) == sorted(new), "every new message once"


@pytest.mark.parametrize("checkpoint", ["kept", "new"])
def test_a_drain_skipping_what_retention_removed_names_it_in_data_loss(
    spark: Any, broker: BrokerSettings, streams, tmp_path: Path, checkpoint: str
) -> None:  # type: ignore[no-untyped-def]
    """Retention removed offsets a drain had not read yet (below its checkpoint, or for a new
    checkpoint below where the consumer stood: the broker forgets that stored offset once retention
    passes it). With failOnDataLoss=true the drain fails naming them, before reading; with false it
    skips them and its summary's `data_loss` names them, as a watermark run's does. Before the fix a
    skipping drain's summary carried no `data_loss` (the campaign, seed 2124123701, saw 85 messages
    missing that way), and a new checkpoint read from the first offset kept with no error at all."""
    from airflow.exceptions import AirflowFailException

    from pyspark_rmqs.broker.reader import RangeReader, ReadSettings
    from pyspark_rmqs.committed import committed_dataset
    from pyspark_rmqs.watermarks import watermarks
    from tests.e2e.faults.test_read_guarantees import RETENTION, _publish_chunks
    from tests.support.data import conn_of

    s = streams.stream("dl", arguments=dict(RETENTION))
    _publish_chunks(broker, s, b"a", 400, 5)

    def drain(name: str, **source: str) -> RabbitMQStreamDrainOperator:
        return _drain_generation(tmp_path, s, "dl", name, **source)

    assert drain("old").execute({})["rows"] == 400
    _publish_chunks(broker, s, b"b", 1000, 50)
    first, tail = settled_bounds(broker, s, truncated=True)
    assert first > 400
    name = "old" if checkpoint == "kept" else "new"
    with pytest.raises(AirflowFailException, match=rf"offsets \[400, \d+\) of stream '{s}' are lost"):
        drain(name).execute({})
    summary = drain(name, failOnDataLoss="false").execute({})
    # Retention may remove one more segment meanwhile (the drain's own offset tracking adds bytes).
    assert list(summary["data_loss"]) == [s]
    lost_to = summary["data_loss"][s][1]
    assert summary["data_loss"][s][0] == 400 and first <= lost_to < tail
    still, tail = settled_bounds(broker, s)
    kept = [
        o
        for b in RangeReader(conn_of(broker), s, still, tail, ReadSettings())
        for o in b.column("offset").to_pylist()
    ]
    assert watermarks(conn_of(broker), "dl", stream=s).partitions[0].stored >= tail - 1
    got = (
        committed_dataset(str(tmp_path / f"out-{name}"))
        .to_table(columns=["offset"])
        .column("offset")
        .to_pylist()
    )
    drained_before = 400 if checkpoint == "kept" else 0
    assert sorted(got)[:drained_before] == list(range(drained_before))
    later = sorted(got)[drained_before:]
    assert len(later) == len(set(later)) == summary["rows"] > 0, "each offset once"
    assert later[0] >= lost_to and set(kept) <= set(later), "every offset retention kept"
