"""`jobs.plan_read` and the run-level deciders over an in-memory broker (no Spark, no network)."""

from __future__ import annotations

from typing import Any

import pytest

from pyspark_rmqs import jobs
from pyspark_rmqs.core.errors import ConfigurationError, DataLossError
from pyspark_rmqs.runs import drain, steps
from pyspark_rmqs.runs import plan as range_plan
from pyspark_rmqs.runs.outputs.delivery import RunToken
from tests.unit.test_offsets import _CONN, _Tracking, tracking  # noqa: F401 - the fixture


class _Lease:
    released = 0

    def release(self) -> None:
        type(self).released += 1


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The run layer in memory: each consumer's latest record, a lease that always comes, and one
    incarnation per stream (`incarnation` in the returned dict changes it)."""
    from pyspark_rmqs.runs import record

    state: dict[str, Any] = {"records": {}, "written": [], "incarnation": 1, "leases": 0}

    def write(conn: Any, r: record.RunRecord, **kw: Any) -> record.RunRecord:
        state["records"][r.consumer] = r
        state["written"].append(r)
        return r

    def lease(*a: Any, **k: Any) -> _Lease:
        state["leases"] += 1
        return _Lease()

    monkeypatch.setattr(record, "latest", lambda conn, c, target, **kw: state["records"].get(c))
    monkeypatch.setattr(record, "write", write)
    monkeypatch.setattr(steps, "acquire_lease", lease)
    monkeypatch.setattr(
        range_plan, "incarnations_of", lambda conn, ss, mark=True: dict.fromkeys(ss, state["incarnation"])
    )
    return state


def test_a_watermark_run_plans_from_the_watermark_to_the_tails_and_records_the_plan(
    tracking: type[_Tracking],  # noqa: F811
    runs: dict[str, Any],
) -> None:
    tracking.stored[("etl", "o-0")] = 49
    tracking.stored[("etl", "o-1")] = 29
    plan = jobs.plan_read(_CONN, superstream="o", consumer="etl", pipeline="dag/task")
    assert plan.ranges == {"o-0": (50, 100), "o-1": (30, 200)}
    assert plan.seen == {"o-0": 49, "o-1": 29} and not plan.resumed and plan.fail_on_data_loss
    (record,) = runs["written"]
    assert record.state == "planned" and record.ranges == {"o-0": (50, 100), "o-1": (30, 200)}
    assert record.incarnations == {"o-0": 1, "o-1": 1} and record.pipeline == "dag/task"
    assert record.token == plan.token.value and runs["leases"] == 1 and plan.mode == "watermark"
    assert tracking.stores == []  # nothing is stored before the run


def test_a_first_run_starts_at_starting_offsets_and_a_partition_new_to_the_consumer_at_its_start(
    tracking: type[_Tracking],  # noqa: F811
    runs: dict[str, Any],
) -> None:
    """Issue 42, case 2: `starting_offsets` places a consumer's first run only. A partition stream the
    consumer has run without (bound to the super stream since) began after the consumer did: it is
    read from offset 0, and what retention removed from it before is data loss, as Spark's Kafka
    source treats a partition added to a topic."""
    first = jobs.plan_read(_CONN, superstream="o", consumer="new", starting_offsets="latest")
    assert first.ranges == {}  # a first run at latest: both partitions at their tails
    assert first.start == {"o-0": 100, "o-1": 200}
    tracking.stored[("etl", "o-0")] = 49  # etl has run, and never on o-1
    with pytest.raises(DataLossError, match=r"offsets \[0, 20\) of stream 'o-1' are lost"):
        jobs.plan_read(_CONN, superstream="o", consumer="etl", starting_offsets="latest")
    plan = jobs.plan_read(
        _CONN, superstream="o", consumer="etl", starting_offsets="latest", fail_on_data_loss=False
    )
    assert plan.ranges == {"o-0": (50, 100), "o-1": (20, 200)} and plan.data_loss == {"o-1": [0, 20]}


def test_an_unfinished_record_is_resumed_whole_whatever_the_retry_asks(
    tracking: type[_Tracking],  # noqa: F811
    runs: dict[str, Any],
) -> None:
    first = jobs.plan_read(_CONN, superstream="o", consumer="etl", max_messages=30)
    tracking.stored[("etl", "o-0")] = first.end["o-0"] - 1  # the try died after storing o-0 only
    retry = jobs.plan_read(_CONN, superstream="o", consumer="etl", max_messages=5, end={"o-0": 99})
    assert retry.resumed and retry.ranges == first.ranges  # both partitions, as recorded
    assert retry.token.value == first.token.value and retry.seen == first.seen
    # A resumed record is written again as its next attempt: the record pointer moves (the fence).
    assert [(r.attempt, r.state, r.token) for r in runs["written"]] == [
        (0, "planned", first.token.value),
        (1, "planned", first.token.value),
    ]


def test_a_finished_or_foreign_record_is_not_resumed(
    tracking: type[_Tracking],  # noqa: F811
    runs: dict[str, Any],
) -> None:
    from pyspark_rmqs.runs import record as run_record

    plan = jobs.plan_read(_CONN, stream="single", consumer="etl")
    assert plan.ranges == {"single": (0, 5)}
    runs["records"]["etl"] = runs["records"]["etl"].moved_to(run_record.STORED)
    tracking.stored[("etl", "single")] = 2  # done up to 2 (stored by hand): the next range
    again = jobs.plan_read(_CONN, stream="single", consumer="etl")
    assert not again.resumed and again.ranges == {"single": (3, 5)}
    # An unfinished record on a stream since deleted and created again no longer applies.
    runs["incarnation"] = 2
    fresh = jobs.plan_read(_CONN, stream="single", consumer="etl")
    assert not fresh.resumed and fresh.ranges == {"single": (3, 5)}
    assert fresh.token.value != again.token.value  # another incarnation, another token


def test_backfills_and_persist_false_hold_nothing_and_record_nothing(
    tracking: type[_Tracking],  # noqa: F811
    runs: dict[str, Any],
) -> None:
    explicit = jobs.plan_read(_CONN, superstream="o", consumer="etl", start={"o-0": 12}, end={"o-0": 15})
    assert not explicit.resumed and explicit.ranges == {"o-0": (12, 15), "o-1": (20, 200)}
    assert explicit.mode == "backfill" and not explicit.stores
    peek = jobs.plan_read(_CONN, superstream="o", consumer="etl", persist=False)
    assert peek.mode == "backfill" and peek.ranges["o-0"] == (10, 100)
    assert runs["written"] == [] and runs["leases"] == 0 and tracking.stores == []
    stored = jobs.plan_read(_CONN, superstream="o", consumer="etl", start={"o-0": 12}, persist=True)
    assert stored.mode == "watermark" and runs["leases"] == 1 and len(runs["written"]) == 1


def test_a_first_run_at_latest_records_where_it_started(
    tracking: type[_Tracking],  # noqa: F811
    runs: dict[str, Any],
) -> None:
    from pyspark_rmqs.runs import record as run_record

    first = jobs.plan_read(_CONN, superstream="o", consumer="new", starting_offsets="latest")
    assert first.is_empty and first.start == {"o-0": 100, "o-1": 200}
    assert steps._watermarks_to_store(first) == {"o-0": 99, "o-1": 199}  # stored although empty
    runs["records"]["new"] = runs["records"]["new"].moved_to(run_record.STORED)
    # Nothing stored yet (say the store never happened on an empty stream): the record's start holds.
    later = jobs.plan_read(_CONN, superstream="o", consumer="new", starting_offsets="latest")
    assert later.start == {"o-0": 100, "o-1": 200}


def test_retention_below_the_plan_is_data_loss_or_clamped(
    tracking: type[_Tracking],  # noqa: F811
    runs: dict[str, Any],
) -> None:
    tracking.stored[("etl", "o-0")] = 19
    tracking.stored[("etl", "o-1")] = 4  # next 5, but o-1 starts at 20 now
    with pytest.raises(DataLossError, match=r"offsets \[5, 20\) of stream 'o-1' are lost \(15 offsets\)"):
        jobs.plan_read(_CONN, superstream="o", consumer="etl")
    plan = jobs.plan_read(_CONN, superstream="o", consumer="etl", fail_on_data_loss=False)
    assert plan.ranges["o-1"] == (20, 200) and not plan.fail_on_data_loss
    # Skipped, and said: the run's summary carries what planning found lost.
    assert plan.data_loss == {"o-1": [5, 20]}


def test_a_resumed_range_retention_overtook_is_lost_only_where_the_retry_reads_it_again(
    tracking: type[_Tracking],  # noqa: F811
    runs: dict[str, Any],
) -> None:
    """A try planned `[4, 50)` of o-0 and died; retention moved o-0's first offset to 10 since. The
    retry resumes the record whole: `[4, 10)` is lost only if it must be read again, so planning
    reports nothing (the run step tells whether the output committed the run: a Parquet commit
    record, the run's token in an Iceberg table). Reading again reports it, but not the offsets the
    output holds; a record that says `delivered` has nothing to read again and nothing lost."""
    from pyspark_rmqs.runs import record as run_record

    tracking.stored[("etl", "o-0")] = 3
    tracking.stored[("etl", "o-1")] = 19
    runs["records"]["etl"] = run_record.RunRecord(
        consumer="etl",
        run_id="r1",
        target="o",
        superstream=True,
        state=run_record.PLANNED,
        ranges={"o-0": (4, 50), "o-1": (20, 200)},
        incarnations={"o-0": 1, "o-1": 1},
        seen={"o-0": 3, "o-1": 19},
        token="t",
    )
    retry = jobs.plan_read(_CONN, superstream="o", consumer="etl")
    assert retry.resumed and retry.ranges == {"o-0": (4, 50), "o-1": (20, 200)}
    assert retry.retry_loss == {"o-0": [4, 10]}
    with pytest.raises(DataLossError, match=r"offsets \[4, 10\) of stream 'o-0' .*before this retry"):
        range_plan.report_retry_loss(retry)
    with pytest.raises(DataLossError, match=r"offsets \[7, 10\) of stream 'o-0' are lost"):
        range_plan.report_retry_loss(retry, {"o-0": [(4, 7)], "o-1": [(20, 200)]})
    range_plan.report_retry_loss(retry, {"o-0": [(0, 6), (6, 50)]})  # the output holds it all
    lenient = jobs.plan_read(_CONN, superstream="o", consumer="etl", fail_on_data_loss=False)
    range_plan.report_retry_loss(lenient)  # logged; the reader skips it and names it
    runs["records"]["etl"] = runs["records"]["etl"].moved_to(run_record.DELIVERED)
    delivered = jobs.plan_read(_CONN, superstream="o", consumer="etl")
    assert delivered.resumed and delivered.delivered and delivered.retry_loss == {}


def test_caps_and_bad_arguments(
    tracking: type[_Tracking],  # noqa: F811
    runs: dict[str, Any],
) -> None:
    plan = jobs.plan_read(_CONN, superstream="o", consumer="etl", max_messages=27)
    assert sum(e - s for s, e in plan.ranges.values()) == 27
    with pytest.raises(ConfigurationError, match="starting_offsets must be 'earliest' or 'latest'"):
        jobs.plan_read(_CONN, superstream="o", consumer="etl", starting_offsets="soon")
    with pytest.raises(ConfigurationError, match="max_messages must be at least 1"):
        jobs.plan_read(_CONN, superstream="o", consumer="etl", max_messages=0)
    with pytest.raises(ConfigurationError, match="needs a consumer_name"):
        jobs.plan_read(_CONN, superstream="o")
    latest = jobs.plan_read(_CONN, superstream="o", consumer="new", starting_offsets="latest")
    assert latest.is_empty and latest.offsets_span == 0


def test_file_outputs_tokens_and_summaries() -> None:
    assert jobs.write_output("/tmp/x").exactly_once
    assert not jobs.write_output("/tmp/x", mode="overwrite").exactly_once
    assert not jobs.write_output("/tmp/x", delivery="at_least_once").exactly_once
    with pytest.raises(ConfigurationError, match="delivery must be one of exactly_once, at_least_once"):
        jobs.write_output("/tmp/x", delivery="maybe")
    a = RunToken("etl", {"o-0": (1, 5), "o-1": (0, 2)})
    assert a.value == RunToken("etl", {"o-1": (0, 2), "o-0": (1, 5)}).value  # order does not matter
    assert a.value != RunToken("etl", {"o-0": (1, 6), "o-1": (0, 2)}).value
    assert a.value != RunToken("other", {"o-0": (1, 5), "o-1": (0, 2)}).value
    s = jobs.RunSummary("o", {"o-0": 1}, {"o-0": 5}, rows=4, bytes=40, extra={"x": 1}).to_dict()
    assert (s["records_read"], s["bytes_read"], s["x"], s["delivery"]) == (4, 40, 1, "at_least_once")
    assert len(s["run_id"]) == 32 and s["retry_count"] == 0


def test_a_sink_gets_the_token_only_when_it_asks() -> None:
    got: list[Any] = []
    token = RunToken("etl", {"o-0": (0, 1)})
    steps._call_sink(lambda df: got.append(("plain", df)), "df", token)
    steps._call_sink(lambda df, token: got.append(("token", token.value)), "df", token)
    steps._call_sink(lambda df, **kw: got.append(("kw", kw["token"].value)), "df", token)
    assert got == [("plain", "df"), ("token", token.value), ("kw", token.value)]


def test_a_drain_never_moves_a_watermark_another_run_moved_further(
    tracking: type[_Tracking],  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A drain ending below what another run already stored keeps that stream's watermark."""
    from pyspark_rmqs.core.target import Target

    tracking.stored.update({("etl", "o-0"): 80, ("etl", "o-1"): 10})
    kept = drain._never_backwards(_CONN, "etl", {"o-0": 59, "o-1": 99}, Target.of(superstream="o"))
    assert kept == {"o-1": 99}  # o-0 stays at 80: the drain's 59 is behind it
    assert "already past this drain" in caplog.text and "'o-0': (80, 59)" in caplog.text
    assert drain._never_backwards(_CONN, "etl", {}, Target.of(superstream="o")) == {}
