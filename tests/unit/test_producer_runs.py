"""A produce run's numbering (`runs.producer.plan_run`): from its record and the broker's sequences.

The broker-level tests (every message counted) are tests/airflow/test_produce_runs.py; these pin
the decisions one by one, including orders of runs those tests do not reach.
"""

from __future__ import annotations

import json

import pytest

from pyspark_rmqs.core.errors import RoutingChangedError
from pyspark_rmqs.core.target import Target
from pyspark_rmqs.runs import record
from pyspark_rmqs.runs.producer import (
    HISTORY,
    ProducerRecord,
    ProducerRun,
    ProducerTry,
    _is_record_of,
    plan_run,
    producer_key,
    routing_name,
)


def rec(*runs: ProducerRun) -> ProducerRecord:
    return ProducerRecord("loader", "orders", runs)


def test_a_new_identity_starts_after_the_sequence() -> None:
    run, resumed, runs = plan_run(None, "r1", {"o-0": 0, "o-1": 41})
    assert run.bases == {"o-0": 1, "o-1": 42} and run.skip == {} and not resumed
    assert runs == (run,)


def test_a_retry_of_the_newest_run_keeps_its_bases_and_writes_nothing() -> None:
    first, _, runs = plan_run(None, "r1", {"o-0": 10})
    assert runs is not None
    # The failed try got 700 stored: the sequence moved, the bases do not.
    again, resumed, write = plan_run(rec(*runs), "r1", {"o-0": 710})
    assert again == first and resumed and write is None


def test_a_partition_added_since_a_first_try_recorded_without_partitions_starts_after_its_sequence() -> None:
    _, _, runs = plan_run(None, "r1", {"o-0": 10})
    assert runs is not None
    again, resumed, write = plan_run(rec(*runs), "r1", {"o-0": 500, "o-1": 7})
    assert again.bases == {"o-0": 11, "o-1": 8} and resumed and write == (again,)


def test_a_later_run_ends_the_previous_one_where_it_begins() -> None:
    _, _, runs = plan_run(None, "r1", {"o-0": 0})
    assert runs is not None
    second, resumed, runs2 = plan_run(rec(*runs), "r2", {"o-0": 2000})  # r1 got 2,000 stored
    assert second.bases == {"o-0": 2001} and not resumed
    assert runs2 is not None and runs2[1].identity == "r1" and runs2[1].ends == {"o-0": 2001}
    assert runs2[1].stored() == {"o-0": 2000}


def test_an_older_run_retried_skips_what_it_got_stored_and_numbers_the_rest_after_the_sequence() -> None:
    _, _, runs = plan_run(None, "r1", {"o-0": 0, "o-1": 0})
    assert runs is not None
    _, _, runs = plan_run(rec(*runs), "r2", {"o-0": 2000, "o-1": 300})
    assert runs is not None
    retry, resumed, runs = plan_run(rec(*runs), "r1", {"o-0": 3000, "o-1": 900})
    assert resumed and retry.skip == {"o-0": 2000, "o-1": 300}
    assert retry.bases == {"o-0": 3001, "o-1": 901}
    assert runs is not None and [r.identity for r in runs] == ["r1", "r2"]
    assert runs[1].ends == {"o-0": 3001, "o-1": 901}  # r2 ended where r1's retry began
    # r1's retry fails after 100 more to o-0; r1 retried again: the same numbering, as the newest.
    again, resumed, write = plan_run(rec(*runs), "r1", {"o-0": 3100, "o-1": 900})
    assert again == retry and resumed and write is None
    # r2 retried after that: it got 1,000 and 600 stored.
    r2, resumed, _ = plan_run(rec(*runs), "r2", {"o-0": 3100, "o-1": 900})
    assert resumed and r2.skip == {"o-0": 1000, "o-1": 600}


def test_skips_add_up_over_retries_and_an_older_run_leaving_keeps_the_others_ends() -> None:
    _, _, runs = plan_run(None, "r1", {"s": 0})  # r1: ids 1..
    assert runs is not None
    _, _, runs = plan_run(rec(*runs), "r2", {"s": 100})  # r1 stored 100; r2: 101..
    assert runs is not None
    _, _, runs = plan_run(rec(*runs), "r3", {"s": 150})  # r2 stored 50; r3: 151..
    assert runs is not None
    r2, _, runs = plan_run(rec(*runs), "r2", {"s": 170})  # r3 stored 20; r2 again: skip 50, 171..
    assert runs is not None and r2.skip == {"s": 50} and r2.bases == {"s": 171}
    r1, _, runs = plan_run(rec(*runs), "r1", {"s": 180})  # r2 stored 10 more
    assert r1.skip == {"s": 100}  # r1's own count, untouched by r2 leaving the middle
    assert runs is not None
    r2_again, _, _ = plan_run(rec(*runs), "r2", {"s": 180})
    assert r2_again.skip == {"s": 60}  # 50 + 10


def test_the_record_keeps_the_newest_runs_only() -> None:
    runs: tuple[ProducerRun, ...] = ()
    for i in range(HISTORY + 5):
        _, _, new = plan_run(rec(*runs), f"r{i}", {"s": i * 10})
        assert new is not None
        runs = new
    assert len(runs) == HISTORY and runs[0].identity == f"r{HISTORY + 4}"
    # A run older than the history is a new run (at-least-once), never numbered from a lost base.
    old, resumed, _ = plan_run(rec(*runs), "r0", {"s": 999})
    assert not resumed and old.bases == {"s": 1000} and old.skip == {}


def test_record_json_round_trip_and_matching() -> None:
    r = rec(
        ProducerRun("a/b/c", {"o-0": 5}, {"o-0": 3}, None, "dag/task", 1.5),
        ProducerRun("x", {"o-0": 1}, {}, {"o-0": 5}, None, 1.0),
    )
    body = r.to_json()
    assert ProducerRecord.from_json(body) == r
    assert _is_record_of("loader", "orders")(body)
    assert not _is_record_of("loader", "other")(body) and not _is_record_of("load", "orders")(body)
    # Consumers' run records are never taken for a producer's, nor the reverse.
    assert not record._is_record_of("loader", "orders")(body)
    consumer = json.dumps({"consumer": "loader", "target": "orders", "runs": []}).encode()
    assert not _is_record_of("loader", "orders")(consumer)
    assert producer_key("loader", "orders") != record.run_key("loader", "orders")


def test_already_stored_counts_what_was_skipped_and_what_the_broker_dropped() -> None:
    run = ProducerRun("r1", {"a": 11, "b": 1}, {"b": 40})
    t = ProducerTry(None, "p", Target.of("x", None), run, True, {"a": 710, "b": 0}, None, 1.0)  # type: ignore[arg-type]
    # a: ids 11..1010, the broker held up to 710 (700 of them); b: 40 skipped, 60 sent, none held.
    assert t.already_stored({"a": 1000, "b": 60}, {"b": 40}) == {"a": 700, "b": 40}


# ------------------------------------------------- a super stream: the first try's partitions and routing

TWO = ["o-0", "o-1"]
THREE = ["o-0", "o-1", "o-2"]


def test_routing_names() -> None:
    assert routing_name("hash") == "hash" and routing_name("key") == "key"
    assert routing_name("custom", "my.mod.Part") == "custom:my.mod.Part"


def test_a_new_run_on_a_super_stream_records_todays_partitions_and_routing() -> None:
    run, _, runs = plan_run(None, "r1", {"o-0": 0, "o-1": 0}, partitions=TWO, routing="hash")
    assert run.partitions == ("o-0", "o-1") and run.routing == "hash" and runs == (run,)
    # A stream records neither (its runs route nowhere).
    plain, _, _ = plan_run(None, "r1", {"s": 0})
    assert plain.partitions is None and plain.routing is None
    assert "partitions" not in plain.to_dict() and "routing" not in plain.to_dict()


def test_a_retry_routes_over_its_first_tries_partitions_after_one_was_added() -> None:
    _, _, runs = plan_run(None, "r1", {"o-0": 0, "o-1": 0}, partitions=TWO, routing="hash")
    assert runs is not None
    again, resumed, write = plan_run(
        rec(*runs), "r1", {"o-0": 1000, "o-1": 1000, "o-2": 4}, partitions=THREE, routing="hash"
    )
    assert resumed and again.partitions == ("o-0", "o-1")  # hash routing over 2, as the first try
    assert again.bases == {"o-0": 1, "o-1": 1, "o-2": 5}  # the added one numbered after its sequence
    assert write == (again,)
    # Retried once more: the same, and nothing to write.
    third, _, write = plan_run(
        rec(again), "r1", {"o-0": 1500, "o-1": 1400, "o-2": 4}, partitions=THREE, routing="hash"
    )
    assert third == again and write is None
    # A new run identity routes over today's three.
    new, resumed, _ = plan_run(rec(again), "r2", {"o-0": 1500, "o-1": 1500, "o-2": 4}, partitions=THREE)
    assert not resumed and new.partitions == tuple(THREE)


def test_a_retry_after_a_partition_of_its_first_try_was_removed_fails() -> None:
    _, _, runs = plan_run(None, "r1", {"o-0": 0, "o-1": 0, "o-2": 0}, partitions=THREE, routing="hash")
    assert runs is not None
    with pytest.raises(
        RoutingChangedError, match=r"\['o-2'\] of super stream 'orders'.*run 'r1' of producer 'loader'"
    ):
        plan_run(rec(*runs), "r1", {"o-0": 700, "o-1": 700}, partitions=TWO, routing="hash")
    # Not retryable as it is (a retry would fail the same way), and a ConfigurationError.
    assert RoutingChangedError.retryable is False


def test_an_older_run_retried_keeps_its_partitions_and_fails_when_one_was_removed() -> None:
    _, _, runs = plan_run(None, "r1", {"o-0": 0, "o-1": 0}, partitions=TWO, routing="hash")
    assert runs is not None
    _, _, runs = plan_run(
        rec(*runs), "r2", {"o-0": 600, "o-1": 700, "o-2": 0}, partitions=THREE, routing="hash"
    )
    assert runs is not None and runs[0].partitions == tuple(THREE)
    r1, resumed, runs2 = plan_run(
        rec(*runs), "r1", {"o-0": 900, "o-1": 900, "o-2": 300}, partitions=THREE, routing="hash"
    )
    assert resumed and r1.partitions == tuple(TWO) and r1.skip == {"o-0": 600, "o-1": 700}
    assert runs2 is not None and runs2[0] == r1
    with pytest.raises(RoutingChangedError, match="o-2"):
        plan_run(rec(*runs), "r2", {"o-0": 900, "o-1": 900}, partitions=TWO, routing="hash")


def test_a_retry_routing_by_another_strategy_fails() -> None:
    _, _, runs = plan_run(None, "r1", {"o-0": 0, "o-1": 0}, partitions=TWO, routing="key")
    assert runs is not None
    with pytest.raises(RoutingChangedError, match=r"routed by 'key' on its first try.*'hash'"):
        plan_run(rec(*runs), "r1", {"o-0": 5, "o-1": 5}, partitions=TWO, routing="hash")
    again, resumed, _ = plan_run(rec(*runs), "r1", {"o-0": 5, "o-1": 5}, partitions=TWO, routing="key")
    assert resumed and again.routing == "key"


def test_a_run_recorded_without_partitions_routes_over_todays_from_its_retry_on() -> None:
    old = ProducerRun("r1", {"o-0": 1, "o-1": 1})  # a record written before runs kept their partitions
    again, resumed, write = plan_run(rec(old), "r1", {"o-0": 9, "o-1": 9}, partitions=TWO, routing="hash")
    assert resumed and again.partitions == tuple(TWO) and again.routing == "hash" and write == (again,)


def test_the_partitions_and_routing_survive_the_record() -> None:
    r = rec(ProducerRun("a", {"o-0": 5, "o-1": 1}, {}, None, None, 1.5, ("o-0", "o-1"), "custom:m.P"))
    assert ProducerRecord.from_json(r.to_json()) == r
