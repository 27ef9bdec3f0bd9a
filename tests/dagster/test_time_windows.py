"""Time-window partitions: a window reads the messages whose chunk timestamp falls in it.

Windows are one minute (a cron, the finest Dagster offers): the test publishes into one minute,
waits for the next, publishes again, and counts every offset: each in exactly one window.
"""

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
import pytest
from dagster import (
    DagsterEventType,
    DagsterInstance,
    ExecuteInProcessResult,
    TimeWindowPartitionsDefinition,
    materialize,
)
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG
from pyspark.sql import SparkSession

from dagster_rmqs import (
    ObjectStoreResource,
    RabbitMQStreamsResource,
    build_new_data_sensor,
    build_stream_asset,
)
from pyspark_rmqs.core.errors import ConfigurationError
from pyspark_rmqs.runs.outputs.committed import committed_dataset
from tests.conftest import StreamFactory
from tests.support.broker import BrokerSettings
from tests.support.data import publish
from tests.support.s3 import S3Server

pytestmark = [pytest.mark.dagster, pytest.mark.slow]
FMT = "%Y-%m-%d-%H:%M"


def meta(result: ExecuteInProcessResult, name: str) -> list[dict[str, Any]]:
    return [{k: v.value for k, v in m.metadata.items()} for m in result.asset_materializations_for_node(name)]


def rows(spark: SparkSession, path: Path) -> list[tuple[int, datetime]]:
    df = spark.read.parquet(str(path)).select("offset", "chunk_timestamp")
    return sorted((int(r.offset), r.chunk_timestamp.replace(tzinfo=UTC)) for r in df.collect())


def minute(t: datetime) -> datetime:
    return t.replace(second=0, microsecond=0)


def test_adjacent_windows_split_the_stream_exactly_and_a_backfill_reads_both_in_one_run(
    spark: SparkSession,
    broker: BrokerSettings,
    streams: StreamFactory,
    rabbitmq: RabbitMQStreamsResource,
    tmp_path: Path,
) -> None:
    s = streams.stream()
    now = datetime.now(UTC)
    if now.second >= 45:  # leave the first minute room for its two flushes
        time.sleep(61 - now.second)
    first = minute(datetime.now(UTC))
    publish(broker, s, [f"a{i}".encode() for i in range(30)])
    time.sleep(0.2)
    publish(broker, s, [f"b{i}".encode() for i in range(20)])  # a second chunk, a later timestamp
    second = first + timedelta(minutes=1)
    time.sleep(max(0.0, (second - datetime.now(UTC)).total_seconds()) + 0.5)
    publish(broker, s, [f"c{i}".encode() for i in range(25)])  # the next (still open) minute
    pdef = TimeWindowPartitionsDefinition(  # end_offset=1: the current (open) window is a partition too
        cron_schedule="* * * * *", fmt=FMT, start=first - timedelta(minutes=5), timezone="UTC", end_offset=1
    )
    k1, k2 = first.strftime(FMT), second.strftime(FMT)

    def asset_into(out: Path) -> Any:
        return build_stream_asset(
            "windows", stream=s, consumer_name="dgw", output_path=str(out), partitions_def=pdef
        )

    resources = {"rabbitmq": rabbitmq, "spark": spark}
    instance = DagsterInstance.ephemeral()
    (open_meta,) = meta(
        materialize([asset_into(tmp_path / "w2")], instance=instance, resources=resources, partition_key=k2),
        "windows",
    )
    (closed_meta,) = meta(
        materialize([asset_into(tmp_path / "w1")], instance=instance, resources=resources, partition_key=k1),
        "windows",
    )

    assert open_meta["window_open"] is True and closed_meta["window_open"] is False
    assert (closed_meta["start_offsets"], closed_meta["end_offsets"]) == ({s: 0}, {s: 50})
    assert (open_meta["start_offsets"], open_meta["end_offsets"]) == ({s: 50}, {s: 75})
    assert (closed_meta["dagster/row_count"], open_meta["dagster/row_count"]) == (50, 25)
    w1, w2 = rows(spark, tmp_path / "w1"), rows(spark, tmp_path / "w2")
    assert all(first <= ts < second for _, ts in w1)  # chunk timestamps inside their windows
    assert all(second <= ts for _, ts in w2)
    offsets = [o for o, _ in w1] + [o for o, _ in w2]
    assert sorted(offsets) == list(range(75))  # every offset in exactly one window
    assert rabbitmq.stored_offsets("dgw", stream=s) == {s: None}  # windows never move the watermark

    # A backfill of both windows: one run (single-run policy), one read of the whole span.
    tags = {ASSET_PARTITION_RANGE_START_TAG: k1, ASSET_PARTITION_RANGE_END_TAG: k2}
    backfill = materialize([asset_into(tmp_path / "both")], instance=instance, resources=resources, tags=tags)
    mats = meta(backfill, "windows")
    assert len(mats) == 2 and all(m["partition_keys"] == [k1, k2] for m in mats)
    assert (mats[0]["start_offsets"], mats[0]["end_offsets"], mats[0]["dagster/row_count"]) == (
        {s: 0},
        {s: 75},
        75,
    )
    assert [o for o, _ in rows(spark, tmp_path / "both")] == list(range(75))
    assert rabbitmq.stored_offsets("dgw", stream=s) == {s: None}


def test_time_window_assets_refuse_a_new_data_sensor_and_max_messages() -> None:
    daily = TimeWindowPartitionsDefinition(cron_schedule="0 0 * * *", fmt="%Y-%m-%d", start="2026-01-01")
    asset = build_stream_asset("d", stream="s", consumer_name="c", output_path="/tmp/x", partitions_def=daily)
    assert asset.partitions_def == daily and asset.backfill_policy is not None
    with pytest.raises(ConfigurationError, match="automation_condition"):
        build_new_data_sensor(asset)
    with pytest.raises(ConfigurationError, match="max_messages"):
        build_stream_asset(
            "d", stream="s", consumer_name="c", output_path="/x", partitions_def=daily, max_messages=5
        )


def wait_for_second(lo: int, hi: int) -> datetime:
    """Sleep until the wall clock's second is in [lo, hi] (the broker on this host shares the clock)."""
    now = datetime.now(UTC)
    if not lo <= now.second <= hi:
        start = minute(now) + timedelta(seconds=lo)
        if start <= now:
            start += timedelta(minutes=1)
        time.sleep((start - now).total_seconds() + 0.2)
    return datetime.now(UTC)


def sleep_until(t: datetime) -> None:
    time.sleep(max(0.0, (t - datetime.now(UTC)).total_seconds()))


def minute_windows(first: datetime) -> TimeWindowPartitionsDefinition:
    """One-minute windows; `end_offset=1`: the current (open) minute is a partition too."""
    return TimeWindowPartitionsDefinition(
        cron_schedule="* * * * *", fmt=FMT, start=first - timedelta(minutes=5), timezone="UTC", end_offset=1
    )


# The tests of this file run one after the other on one worker (the `clock` group), in this order,
# which follows the second each needs to start at: the one above ends ~25 s into a minute, this one
# starts at 31-38 s and ends 1 s into the next, where the one below starts (0-15 s): about 35 s less
# waiting for the clock than the other way round.
def test_a_dagster_clock_ahead_of_the_broker_puts_every_offset_in_exactly_one_window(
    spark: SparkSession,
    broker: BrokerSettings,
    streams: StreamFactory,
    rabbitmq: RabbitMQStreamsResource,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue "Time-window partitions" (b): the Dagster process's clock 30 s ahead of the broker's.

    Minute M is read 31 s into it (the skewed clock says it ended), 20 more offsets land in M, then
    15 in M+1. A window is materialized again when its last materialization said `window_open`.
    The old code called M closed by its own clock and ended it at the tail: offsets 10-29 landed in
    neither window (25 of 45 in the output).
    """
    import dagster_rmqs.factories as factories

    class Ahead(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> "Ahead":  # type: ignore[override]
            t = datetime.now(tz) + timedelta(seconds=30)
            return cls.fromtimestamp(t.timestamp(), tz)

    s = streams.stream()
    wait_for_second(31, 38)
    m = minute(datetime.now(UTC))
    k1, k2 = m.strftime(FMT), (m + timedelta(minutes=1)).strftime(FMT)
    asset = build_stream_asset(
        "skewed",
        stream=s,
        consumer_name="dgw",
        output_path=str(tmp_path / "out"),
        partitions_def=minute_windows(m),
        engine="arrow",
    )
    resources = {"rabbitmq": rabbitmq}
    instance = DagsterInstance.ephemeral()

    def run(key: str) -> dict[str, Any]:
        (m_,) = meta(
            materialize([asset], instance=instance, resources=resources, partition_key=key), "skewed"
        )
        return m_

    monkeypatch.setattr(factories, "datetime", Ahead)
    bodies = [f"a{i}".encode() for i in range(10)]
    publish(broker, s, bodies)
    first = run(k1)  # 31 s into M by the broker's clock, 1 s after M by the Dagster process's clock
    more = [f"b{i}".encode() for i in range(20)]
    publish(broker, s, more)  # still in M for the broker
    assert datetime.now(UTC) < m + timedelta(minutes=1), "the test was too slow: M ended early"
    sleep_until(m + timedelta(minutes=1, seconds=1))
    late = [f"c{i}".encode() for i in range(15)]
    publish(broker, s, late)  # in M+1
    again = run(k1) if first["window_open"] else first  # materialized again now that it closed
    second = run(k2)

    # Offsets, not only counts: the clock probe's offset-tracking entry takes an offset too.
    out = spark.read.parquet(str(tmp_path / "out")).select("offset", "value").collect()
    values = sorted(bytes(r.value) for r in out)
    assert values == sorted(bodies + more + late), f"{len(values)} rows for 45 published messages"
    assert len({r.offset for r in out}) == len(out)
    assert first["window_open"] is True  # by the broker's clock, whatever the Dagster clock said
    assert again["window_open"] is False and again["end_offsets"] == second["start_offsets"]


def test_an_open_window_materialized_again_after_it_closed_holds_every_offset_once(
    spark: SparkSession,
    broker: BrokerSettings,
    streams: StreamFactory,
    rabbitmq: RabbitMQStreamsResource,
    s3: S3Server,
    tmp_path: Path,
) -> None:
    """Issue "Time-window partitions" (a): 50 published, the window read open ([0, 30)) then closed.

    Every offset once in each engine's output: the closed window's output replaces the open one's,
    it is never added next to it (the old code wrote `[0, 30)` and `[0, 50)`: 80 rows). The stream
    is idle after the window: only the broker's clock (a probe) can close it. `arrow_s3` is the
    Spark-free engine into `s3://` (moto's server) with an `ObjectStoreResource`: the window's
    objects and manifest are replaced there too, for manifest readers and listing readers alike.
    """
    s = streams.stream()
    wait_for_second(0, 15)
    m = minute(datetime.now(UTC))
    key = m.strftime(FMT)
    pdef = minute_windows(m)
    engines = ("spark", "arrow", "arrow_s3")
    bucket = s3.new_bucket()
    lake = ObjectStoreResource(
        aws_access_key_id=s3.key,
        aws_secret_access_key=s3.secret,
        endpoint_url=s3.endpoint,
        region_name=s3.region,
    )
    assets = {
        e: build_stream_asset(
            f"w_{e}",
            stream=s,
            consumer_name="dgw",
            output_path=f"s3://{bucket}/w" if e == "arrow_s3" else str(tmp_path / e),
            partitions_def=pdef,
            engine="arrow" if e == "arrow_s3" else e,
            output_storage_key="lake" if e == "arrow_s3" else None,
        )
        for e in engines
    }
    resources = {"rabbitmq": rabbitmq, "spark": spark, "lake": lake}
    instance = DagsterInstance.ephemeral()

    def run() -> dict[str, dict[str, Any]]:
        out = {}
        for e in engines:
            res = materialize([assets[e]], instance=instance, resources=resources, partition_key=key)
            (out[e],) = meta(res, f"w_{e}")
        return out

    publish(broker, s, [f"a{i}".encode() for i in range(30)])
    opened = run()
    publish(broker, s, [f"b{i}".encode() for i in range(20)])
    assert datetime.now(UTC) < m + timedelta(minutes=1), "the test was too slow: the window closed early"
    sleep_until(m + timedelta(minutes=1, seconds=1))  # nothing is published after the window
    closed = run()

    for e in engines:
        if e == "arrow_s3":
            committed = committed_dataset(f"s3://{bucket}/w", storage_options=lake.fsspec_options())
            listed = pads.dataset(f"{bucket}/w", filesystem=s3.pyarrow_fs(), format="parquet")
            offsets = committed.to_table(columns=["offset"]).column("offset").to_pylist()
            assert sorted(listed.to_table(columns=["offset"]).column("offset").to_pylist()) == sorted(offsets)
        else:
            offsets = [o for o, _ in rows(spark, tmp_path / e)]
        assert sorted(offsets) == list(range(50)), f"{e}: {len(offsets)} rows for 50 offsets"
        assert (opened[e]["window_open"], closed[e]["window_open"]) == (True, False), e
        assert (opened[e]["end_offsets"], closed[e]["end_offsets"]) == ({s: 30}, {s: 50}), e


def test_an_open_window_is_refused_for_a_sink_function_unless_allowed(
    broker: BrokerSettings, streams: StreamFactory, rabbitmq: RabbitMQStreamsResource
) -> None:
    """A sink function cannot have its rows replaced: an open window is refused, naming the window
    and when it closes by the broker's clock; `allow_open_windows=True` reads it (the sink then
    sees its rows again when the window is materialized after it closed)."""
    s = streams.stream()
    wait_for_second(0, 45)
    m = minute(datetime.now(UTC))
    key = m.strftime(FMT)
    publish(broker, s, [f"a{i}".encode() for i in range(5)])
    got: list[int] = []

    def sink(batch: Any) -> None:
        got.extend(batch.column("offset").to_pylist())

    def asset(**kw: Any) -> Any:
        return build_stream_asset(
            "sunk",
            stream=s,
            consumer_name="dgw",
            sink=sink,
            partitions_def=minute_windows(m),
            engine="arrow",
            **kw,
        )

    refused = materialize(
        [asset()], resources={"rabbitmq": rabbitmq}, partition_key=key, raise_on_error=False
    )
    assert not refused.success and got == []
    (failure,) = [e for e in refused.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
    text = str(failure.step_failure_data.error)
    assert key in text and "open" in text and (m + timedelta(minutes=1)).isoformat() in text, text

    allowed = materialize(
        [asset(allow_open_windows=True)], resources={"rabbitmq": rabbitmq}, partition_key=key
    )
    assert meta(allowed, "sunk")[0]["window_open"] is True and got == list(range(5))


def test_keep_only_leaves_one_run_in_a_window_folder_and_keys_are_escaped_as_spark_does(
    tmp_path: Path,
) -> None:
    from dagster_rmqs.windows import escape_key, keep_only, window_path
    from pyspark_rmqs.runs.outputs.delivery import FileCommits, RunToken

    assert escape_key("2026-01-01-12:01") == "2026-01-01-12%3A01" and escape_key("2026-01-01") == "2026-01-01"
    folder = window_path(str(tmp_path), "2026-01-01-12:01")
    assert folder == f"{tmp_path}/rmqs_window=2026-01-01-12%3A01"
    root = Path(folder)
    commits = FileCommits(folder)
    old, new = RunToken("c", {"s": (0, 30)}), RunToken("c", {"s": (0, 50)})
    for token in (old, new):  # a Spark run's layout: rmqs_run=<token>/part-*.parquet and its record
        part = root / f"rmqs_run={token.value}" / "part-0.parquet"
        part.parent.mkdir(parents=True)
        part.write_bytes(b"x")
        commits.commit(token, [str(part.relative_to(root))], 1, 1)
    (root / "s-0-30.parquet").write_bytes(b"x")  # a Spark-free run's file, no longer recorded
    (root / ".s-0-40.parquet.1234.tmp").write_bytes(b"x")  # a crashed write
    (root / "_rmqs_staging" / "x").mkdir(parents=True)

    keep_only(folder, new)
    assert sorted(p.name for p in root.iterdir()) == [
        "_rmqs_commits",
        "_rmqs_staging",
        f"rmqs_run={new.value}",
    ]
    assert commits.record(old) is None and commits.record(new) is not None
    keep_only(folder, RunToken("c", {}))  # a window with nothing to read: replaced by nothing
    assert sorted(p.name for p in root.iterdir()) == ["_rmqs_commits", "_rmqs_staging"]
    assert not list((root / "_rmqs_commits").iterdir())


def test_keep_only_keeps_the_run_s_own_record_when_a_compaction_archived_it(tmp_path: Path) -> None:
    """A window folder's records compacted (issue 47: the index and `_archive/`) before the
    replacement: the run's own record is listed again, the other run's record, the index and the
    archive go, and the folder reads as the run alone."""
    from dagster_rmqs.windows import keep_only
    from pyspark_rmqs.runs.outputs import commit_index
    from pyspark_rmqs.runs.outputs.committed import committed_files
    from pyspark_rmqs.runs.outputs.delivery import COMMITS, FileCommits, RunToken

    commits = FileCommits(str(tmp_path))
    old, new = RunToken("c", {"s": (0, 30)}), RunToken("c", {"s": (0, 50)})
    for token in (old, new):
        part = tmp_path / f"rmqs_run={token.value}" / "part-0.parquet"
        part.parent.mkdir(parents=True)
        part.write_bytes(b"x")
        commits.commit(token, [str(part.relative_to(tmp_path))], 1, 1)
    commit_index.compact(commits, every=1)
    names = sorted(commits.list_names())  # the archive, the index's files and its spans object
    assert names[:2] == [commit_index.ARCHIVE_DIR, commit_index.FILES_DIR], names
    assert len(names) == 3 and names[2].startswith(commit_index.INDEX_PREFIX), names
    keep_only(str(tmp_path), new)
    assert sorted(p.name for p in (tmp_path / COMMITS).iterdir()) == [f"{new.value}.json"]
    assert commits.record(new) is not None and commits.record(old) is None
    assert committed_files(str(tmp_path)) == [str(tmp_path / f"rmqs_run={new.value}" / "part-0.parquet")]
