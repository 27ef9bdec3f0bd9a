"""The Spark-free consume path into Apache Iceberg (pyiceberg, SQL catalog on SQLite)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pyspark_rmqs import jobs
from pyspark_rmqs.runs import consume, steps
from pyspark_rmqs.runs.outputs.iceberg import IcebergSink
from tests.support.broker import BrokerSettings
from tests.support.data import conn_of, publish

pytest.importorskip("pyiceberg")
pytestmark = [pytest.mark.broker]


def _catalog(tmp_path: Path) -> dict[str, str]:
    return {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/catalog.db",
        "warehouse": f"file://{tmp_path}/warehouse",
    }


def _offsets(catalog: dict[str, str], table: str) -> list[tuple[str, int]]:
    from pyiceberg.catalog import load_catalog

    t = (
        load_catalog("rmqs", **catalog)
        .load_table(table)
        .scan(selected_fields=("stream", "offset"))
        .to_arrow()
    )
    return sorted(zip(t.column("stream").to_pylist(), t.column("offset").to_pylist(), strict=True))


def test_a_replayed_range_is_recognised_from_the_table_and_not_appended_again(
    broker: BrokerSettings, streams: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = streams.stream("ice")
    publish(broker, s, [f"m{i}".encode() for i in range(400)])
    catalog = _catalog(tmp_path)
    conn = conn_of(broker)

    def run() -> dict[str, Any]:
        plan = jobs.plan_read(conn, stream=s, consumer="ice")
        return consume.run_consume(conn, plan, IcebergSink("lake.events", catalog)).to_dict()

    real_store = steps.store_watermarks_checked

    def store_fails(*a: Any, **k: Any) -> None:
        raise ConnectionError("broker went away after the commit, before the store")

    monkeypatch.setattr(steps, "store_watermarks_checked", store_fails)
    with pytest.raises(ConnectionError) as failed:
        run()
    assert getattr(failed.value, "commit_state", None) == "committed"
    assert _offsets(catalog, "lake.events") == [(s, o) for o in range(400)]
    monkeypatch.setattr(steps, "store_watermarks_checked", real_store)
    publish(broker, s, [b"late"])  # not part of the pending plan
    summary = run()
    assert summary["resumed_plan"] is True and summary["sink_skipped"] is True
    assert summary["delivery"] == "exactly_once" and summary["token"]
    assert _offsets(catalog, "lake.events") == [(s, o) for o in range(400)]  # not appended twice
    nxt = run()  # the next run appends exactly the new message
    got = _offsets(catalog, "lake.events")
    assert len(got) == 401 and got[:400] == [(s, o) for o in range(400)]
    assert nxt["records_written"] == 1
    from pyiceberg.catalog import load_catalog

    snapshots = load_catalog("rmqs", **catalog).load_table("lake.events").metadata.snapshots
    tokens = {sn.summary.additional_properties.get("rmqs.token") for sn in snapshots if sn.summary}
    assert tokens == {summary["token"], nxt["token"]}


def test_a_replayed_run_is_recognised_after_its_snapshot_expired(
    broker: BrokerSettings, streams: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's commit also sets the table property of its consumer's last run, which outlives
    `expire_snapshots`: a retry after the snapshot expired still appends nothing again."""
    import pyarrow as pa
    from pyiceberg.catalog import load_catalog

    from pyspark_rmqs.runs import record as run_record

    s = streams.stream("iceexp")
    publish(broker, s, [f"m{i}".encode() for i in range(300)])
    catalog = _catalog(tmp_path)
    conn = conn_of(broker)

    def run() -> dict[str, Any]:
        plan = jobs.plan_read(conn, stream=s, consumer="iceexp")
        return consume.run_consume(conn, plan, IcebergSink("lake.exp", catalog)).to_dict()

    def died(*a: Any, **k: Any) -> None:
        raise ConnectionError("process died after the table commit, before the record said delivered")

    with monkeypatch.context() as m:
        m.setattr(run_record, "advance", died)
        with pytest.raises(ConnectionError):
            run()
    table = load_catalog("rmqs", **catalog).load_table("lake.exp")
    ours = table.current_snapshot()
    assert ours is not None
    # Someone else appends, then the table's snapshots are expired: ours is gone from the metadata.
    table.append(pa.Table.from_batches([], schema=table.schema().as_arrow()))
    table = load_catalog("rmqs", **catalog).load_table("lake.exp")
    if table.current_snapshot().snapshot_id == ours.snapshot_id:  # an empty append may add nothing
        pytest.skip("this pyiceberg adds no snapshot for an empty append")
    table.maintenance.expire_snapshots().by_id(ours.snapshot_id).commit()
    assert ours.snapshot_id not in {
        sn.snapshot_id for sn in load_catalog("rmqs", **catalog).load_table("lake.exp").metadata.snapshots
    }
    retry = run()
    assert retry["sink_skipped"] is True
    assert _offsets(catalog, "lake.exp") == [(s, o) for o in range(300)]
