"""The shared Spark Connect session id (pyspark_rmqs.runs.connect_sessions): the same settings give the
same id in every process, the token never enters it, a closed id is stepped over. The server side
(a second task starting no Python process) is tests/airflow/test_spark_connect_operators.py."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from pyspark_rmqs.runs import connect_sessions as cs

URL = "sc://spark.example:15002/;use_ssl=true;token=s3cr3t"


def test_the_id_is_stable_token_free_and_follows_the_settings() -> None:
    base = cs.shared_session_id(URL, "rmqs", {"a": "1", "b": "2"})
    assert base == cs.shared_session_id(URL.replace("s3cr3t", "other"), "rmqs", {"b": "2", "a": "1"})
    assert uuid.UUID(base).version == 5
    others = {
        cs.shared_session_id(URL, "rmqs2", {"a": "1", "b": "2"}),
        cs.shared_session_id(URL, "rmqs", {"a": "1"}),
        cs.shared_session_id(URL.replace("15002", "15003"), "rmqs", {"a": "1", "b": "2"}),
        cs.shared_session_id(URL + ";user_id=etl", "rmqs", {"a": "1", "b": "2"}),
        cs.shared_session_id(URL, "rmqs", {"a": "1", "b": "2"}, generation=1),
    }
    assert base not in others and len(others) == 5


def test_the_url_gets_the_id_as_a_parameter() -> None:
    assert cs.with_session_id("sc://h:1", "x") == "sc://h:1/;session_id=x"
    assert cs.with_session_id("sc://h:1/;token=t", "x") == "sc://h:1/;token=t;session_id=x"
    assert not cs.has_session_id(URL) and cs.has_session_id(URL + ";session_id=abc")


class Session:
    release_session_on_close = True


def test_a_closed_id_is_stepped_over_and_a_users_own_id_kept() -> None:
    tried: list[str] = []
    closed = {cs.with_session_id(URL, cs.shared_session_id(URL, "a", {}, g)) for g in (0, 1)}

    def create(url: str) -> Any:
        tried.append(url)
        if url in closed:
            raise RuntimeError("[INVALID_HANDLE.SESSION_CLOSED] The handle is invalid. Session was closed.")
        return Session()

    spark = cs.open_shared(URL, "a", {}, create)
    assert len(tried) == 3 and tried[-1].endswith(cs.shared_session_id(URL, "a", {}, 2))
    assert spark.release_session_on_close is False  # stop() leaves the session to the next task

    own = URL + ";session_id=" + str(uuid.uuid4())
    tried.clear()
    assert cs.open_shared(own, "a", {}, create).release_session_on_close is True
    assert tried == [own]

    def refused(url: str) -> Any:
        raise RuntimeError("Invalid authentication token")

    with pytest.raises(RuntimeError, match="authentication"):
        cs.open_shared(URL, "a", {}, refused)
