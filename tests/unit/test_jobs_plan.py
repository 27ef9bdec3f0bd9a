"""`jobs.plan_read` and the run-level deciders over an in-memory broker (no Spark, no network)."""

from __future__ import annotations

from typing import Any

import pytest

from pyspark_rmqs import jobs
from pyspark_rmqs.delivery import RunToken
from pyspark_rmqs.errors import ConfigurationError, DataLossError
from tests.unit.test_offsets import _CONN, _Tracking, tracking  # noqa: F401 - the fixture

PLAN_START, PLAN_END = "etl.rmqs-plan-start", "etl.rmqs-plan-end"


def test_a_watermark_run_plans_from_the_watermark_to_the_tails_and_records_the_plan(
    tracking: type[_Tracking],  # noqa: F811
) -> None:
    tracking.stored[("etl", "o-0")] = 49
    plan = jobs.plan_read(_CONN, superstream="o", consumer="etl")
    assert plan.ranges == {"o-0": (50, 100), "o-1": (20, 200)}
    assert plan.seen == {"o-0": 49, "o-1": None} and not plan.resumed and plan.fail_on_data_loss
    assert tracking.stores == [(PLAN_START, {"o-0": 50, "o-1": 20}), (PLAN_END, {"o-0": 100, "o-1": 200})]


def test_a_pending_plan_is_read_again_whatever_else_the_retry_asks(tracking: type[_Tracking]) -> None:  # noqa: F811
    tracking.stored.update({(PLAN_START, "o-0"): 10, (PLAN_END, "o-0"): 60})
    retry = jobs.plan_read(_CONN, superstream="o", consumer="etl", max_messages=5, end={"o-0": 99})
    assert retry.resumed and retry.ranges == {"o-0": (10, 60)}  # o-1 has no pending plan: nothing
    assert retry.end["o-1"] == retry.start["o-1"]
    assert tracking.stores == []  # a resumed plan is not recorded again


def test_a_completed_or_stale_plan_is_not_pending(tracking: type[_Tracking]) -> None:  # noqa: F811
    tracking.stored.update({(PLAN_START, "single"): 0, (PLAN_END, "single"): 3, ("etl", "single"): 2})
    plan = jobs.plan_read(_CONN, stream="single", consumer="etl")
    assert not plan.resumed and plan.ranges == {"single": (3, 5)}  # completed: the next range
    tracking.stored[("etl", "single")] = 0  # moved by hand: the recorded start (3) no longer matches
    plan = jobs.plan_read(_CONN, stream="single", consumer="etl")
    assert not plan.resumed and plan.ranges == {"single": (1, 5)}
    # A partition with a pending plan is read alone: the others wait for the next run.
    tracking.stored.update({(PLAN_START, "o-0"): 10, (PLAN_END, "o-0"): 60})
    plan = jobs.plan_read(_CONN, superstream="o", consumer="etl")
    assert plan.resumed and plan.ranges == {"o-0": (10, 60)}


def test_backfills_and_persist_false_leave_the_plan_alone(tracking: type[_Tracking]) -> None:  # noqa: F811
    tracking.stored.update({(PLAN_START, "o-0"): 10, (PLAN_END, "o-0"): 60})
    explicit = jobs.plan_read(_CONN, superstream="o", consumer="etl", start={"o-0": 12}, end={"o-0": 15})
    assert not explicit.resumed and explicit.ranges == {"o-0": (12, 15), "o-1": (20, 200)}
    peek = jobs.plan_read(_CONN, superstream="o", consumer="etl", persist=False)
    assert not peek.resumed and peek.ranges["o-0"] == (10, 100)
    assert tracking.stores == []


def test_retention_below_the_plan_is_data_loss_or_clamped(tracking: type[_Tracking]) -> None:  # noqa: F811
    tracking.stored[("etl", "o-1")] = 4  # next 5, but o-1 starts at 20 now
    with pytest.raises(DataLossError, match=r"offsets \[5, 20\) of stream 'o-1' are lost \(15 offsets\)"):
        jobs.plan_read(_CONN, superstream="o", consumer="etl")
    plan = jobs.plan_read(_CONN, superstream="o", consumer="etl", fail_on_data_loss=False)
    assert plan.ranges["o-1"] == (20, 200) and not plan.fail_on_data_loss


def test_caps_and_bad_arguments(tracking: type[_Tracking]) -> None:  # noqa: F811
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
    jobs._call_sink(lambda df: got.append(("plain", df)), "df", token)
    jobs._call_sink(lambda df, token: got.append(("token", token.value)), "df", token)
    jobs._call_sink(lambda df, **kw: got.append(("kw", kw["token"].value)), "df", token)
    assert got == [("plain", "df"), ("token", token.value), ("kw", token.value)]


def test_a_drain_never_moves_a_watermark_another_run_moved_further(
    tracking: type[_Tracking],  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A drain ending below what another run already stored keeps that stream's watermark."""
    from pyspark_rmqs.target import Target

    tracking.stored.update({("etl", "o-0"): 80, ("etl", "o-1"): 10})
    kept = jobs._never_backwards(_CONN, "etl", {"o-0": 59, "o-1": 99}, Target.of(superstream="o"))
    assert kept == {"o-1": 99}  # o-0 stays at 80: the drain's 59 is behind it
    assert "already past this drain" in caplog.text and "'o-0': (80, 59)" in caplog.text
    assert jobs._never_backwards(_CONN, "etl", {}, Target.of(superstream="o")) == {}
