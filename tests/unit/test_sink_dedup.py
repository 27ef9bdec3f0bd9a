"""Producer names and publishing ids of the Spark sink's tasks (`producerName` deduplication)."""

from __future__ import annotations

import pytest

from pyspark_rmqs.core.errors import ConfigurationError
from pyspark_rmqs.options import parse_sink_options
from pyspark_rmqs.spark.sink import Dedup, TaskIdentity, check_producer_name, dedup_for, new_job_token

QID = "7279d678-1c56-44ca-ac9b-d7e46af80a37"


def test_no_producer_name_no_dedup() -> None:
    assert dedup_for(None, "t" * 16, TaskIdentity(3, 1)) == Dedup()


def test_batch_attempts_of_one_job_share_name_and_ids() -> None:
    first = dedup_for("loader", "0123456789abcdef", TaskIdentity(partition=2, attempt=0))
    retry = dedup_for("loader", "0123456789abcdef", TaskIdentity(partition=2, attempt=3))
    assert first == retry == Dedup("loader-0123456789abcdef-p2", 1, None)


def test_batch_jobs_and_partitions_never_share_a_name() -> None:
    names = {
        dedup_for("loader", token, TaskIdentity(partition=p)).name
        for token in (new_job_token(), new_job_token())
        for p in (0, 1)
    }
    assert len(names) == 4


def test_streaming_names_follow_the_query_and_ids_the_epoch() -> None:
    e0 = dedup_for("sink", "tok", TaskIdentity(partition=1, attempt=0, epoch=0, query_id=QID))
    e5 = dedup_for("sink", "other", TaskIdentity(partition=1, attempt=2, epoch=5, query_id=QID))
    assert e0.name == e5.name == "sink-7279d6781c5644ca-p1"  # the writer's token plays no part
    assert (e0.first_id, e0.id_limit) == (1, 1 << 32)
    assert (e5.first_id, e5.id_limit) == ((5 << 32) + 1, 6 << 32)


def test_streaming_without_a_query_id_uses_the_epoch_writers_token() -> None:
    d = dedup_for("sink", "0123456789abcdef", TaskIdentity(partition=0, epoch=7))
    assert d.name == "sink-0123456789abcdef-p0" and d.first_id == (7 << 32) + 1


def test_a_producer_name_leaving_no_room_for_the_suffix_is_refused() -> None:
    base = {"endpoints": "localhost:5552", "stream": "s"}
    check_producer_name(parse_sink_options({**base, "producerName": "p" * 227}))
    with pytest.raises(ConfigurationError, match=r"producerName.*at most 227 bytes"):
        check_producer_name(parse_sink_options({**base, "producerName": "p" * 228}))
