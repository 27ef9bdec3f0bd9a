"""A produce run with `producer_name` (issue 26): one run per name at a time, a retry adds nothing twice.

Every test reads the stream back and counts every body. Two concurrent runs of one producer name
used to reuse publishing ids (the broker silently dropped one run's rows); a retried task used to
number its rows after the broker's sequence, so the rows its failed try had stored were kept twice.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_rmqs.operators import RabbitMQStreamProduceOperator
from pyspark_rmqs.broker.reader import read_range
from pyspark_rmqs.core.errors import ConsumerBusyError
from pyspark_rmqs.runs import lease
from tests.airflow.conftest import load_dag_module, write_dag_file
from tests.support.broker import BrokerSettings
from tests.support.data import client, conn_of

pytestmark = [pytest.mark.airflow]


def context(task_id: str, run_id: str, dag_id: str = "loads", map_index: int = -1) -> dict[str, Any]:
    """The part of an Airflow task context a produce run reads: its task instance."""
    ti = SimpleNamespace(dag_id=dag_id, task_id=task_id, run_id=run_id, map_index=map_index, try_number=1)
    return {"ti": ti, "run_id": run_id}


def bodies_in(broker: BrokerSettings, *streams: str) -> list[bytes]:
    c = client(broker)
    return [
        v for s in streams for v in read_range(conn_of(broker), s, 0, c.tail(s)).column("value").to_pylist()
    ]


def assert_each_once(got: list[bytes], expected: list[bytes]) -> None:
    dups = len(got) - len(set(got))
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    assert not dups and not missing and not extra, (
        f"{len(got)} messages for {len(expected)} rows: {dups} duplicate(s), {len(missing)} missing "
        f"(first: {missing[:3]}), {len(extra)} unexpected (first: {extra[:3]})"
    )


def numbered(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i:05d}".encode() for i in range(n)]


def wait_for_tail(broker: BrokerSettings, streams: list[str], at_least: int, timeout_s: float = 30) -> None:
    """Until the broker holds `at_least` messages over `streams` (a failed try's part is stored)."""
    deadline = time.monotonic() + timeout_s
    while sum(client(broker).tails(streams).values()) < at_least:
        assert time.monotonic() < deadline, f"the broker never held {at_least} messages"
        time.sleep(0.05)


class FailAfter:
    """A producer_function whose first call yields `fail_after` of `n` messages (waiting until the
    broker stored `stored` of them) and raises; later calls yield all `n`, the same, in order."""

    def __init__(
        self, broker: BrokerSettings, streams: list[str], prefix: str, n: int, fail_after: int, stored: int
    ) -> None:
        self.broker, self.streams = broker, streams
        self.prefix, self.n, self.fail_after, self.stored = prefix, n, fail_after, stored
        self.calls = 0

    def message(self, i: int) -> Any:
        return f"{self.prefix}-{i:05d}".encode()

    def __call__(self) -> Iterator[Any]:
        self.calls += 1
        for i in range(self.n):
            if self.calls == 1 and i == self.fail_after:
                wait_for_tail(self.broker, self.streams, self.stored)
                raise RuntimeError(f"injected failure after {self.fail_after} of {self.n} messages")
            yield self.message(i)


class KeyedFailAfter(FailAfter):
    def message(self, i: int) -> Any:
        return {"value": f"{self.prefix}-{i:05d}".encode(), "routing_key": f"key-{i}"}


# ------------------------------------------------------------------------------ (8) one run per name


def test_a_second_producer_of_one_name_is_fenced_before_it_sends(
    broker: BrokerSettings, streams: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs of one producer name at once: the second fails before it sends, naming the producer
    and the stream; the stream holds exactly the first run's 5,000 rows, and the second run's retry
    after the first ended adds its own 5,000 (was: both reported 5,000, the stream held 7,000)."""
    monkeypatch.setattr(lease, "DEFAULT_WAIT_S", 2.0)
    s = streams.stream("pf")
    halfway, go_on = threading.Event(), threading.Event()

    def first_run() -> Iterator[bytes]:
        for i, body in enumerate(numbered("a", 5000)):
            if i == 2500:
                halfway.set()
                assert go_on.wait(60)
            yield body

    a = RabbitMQStreamProduceOperator(
        task_id="load_a", stream=s, producer_name="loader", producer_function=first_run
    )
    b = RabbitMQStreamProduceOperator(
        task_id="load_b", stream=s, producer_name="loader", producer_function=lambda: numbered("b", 5000)
    )
    results: dict[str, Any] = {}
    t = threading.Thread(target=lambda: results.update(a=a.execute(context("load_a", "r1"))))
    t.start()
    try:
        assert halfway.wait(30)
        wait_for_tail(broker, [s], 2000)  # the first run is sending
        with pytest.raises(ConsumerBusyError, match=r"producer 'loader'.*" + s) as caught:
            b.execute(context("load_b", "r1"))
        assert "sent nothing" in str(caught.value)
    finally:
        go_on.set()
        t.join(60)
    assert results["a"]["rows"] == 5000
    assert_each_once(bodies_in(broker, s), numbered("a", 5000))
    # Airflow retries the fenced task once the first run ended: its rows are new, all kept.
    assert b.execute(context("load_b", "r1"))["rows"] == 5000
    assert_each_once(bodies_in(broker, s), numbered("a", 5000) + numbered("b", 5000))


# ------------------------------------------------------------------------- (9) a retry adds nothing twice


def test_a_retried_produce_task_writes_each_row_once(broker: BrokerSettings, streams: Any) -> None:
    """The first try sends 2,500 of 3,000 rows (the broker stores at least 2,000) and fails; the retry
    of the same task instance yields all 3,000 again: the stream holds each once (was: 5,000)."""
    s = streams.stream("pr")
    fn = FailAfter(broker, [s], "r", 3000, fail_after=2500, stored=2000)
    op = RabbitMQStreamProduceOperator(task_id="load", stream=s, producer_name="loader", producer_function=fn)
    with pytest.raises(RuntimeError, match="injected failure"):
        op.execute(context("load", "scheduled__2026-01-01T00"))
    out = op.execute(context("load", "scheduled__2026-01-01T00"))  # the retry: same task instance
    assert_each_once(bodies_in(broker, s), numbered("r", 3000))
    assert out["rows"] == 3000 and out["resumed"] is True
    assert out["already_stored"][s] >= 2000  # the broker dropped what the failed try had stored
    assert out["new"][s] + out["already_stored"][s] == 3000
    # The next run (a new run id) is new data: all of it kept.
    fn.prefix = "next"
    assert op.execute(context("load", "scheduled__2026-01-01T01"))["resumed"] is False
    assert_each_once(bodies_in(broker, s), numbered("r", 3000) + numbered("next", 3000))


def test_a_retry_after_a_later_run_of_the_same_name_still_writes_each_row_once(
    broker: BrokerSettings, streams: Any
) -> None:
    """Run 1 fails after storing part of its rows; run 2 of the same producer name runs in between;
    run 1's retry adds exactly its missing rows (numbering from its old base would drop them all,
    numbering after the broker's sequence would duplicate the stored part)."""
    s = streams.stream("pi")
    fn = FailAfter(broker, [s], "one", 3000, fail_after=2500, stored=2000)
    one = RabbitMQStreamProduceOperator(
        task_id="load", stream=s, producer_name="loader", producer_function=fn
    )
    two = RabbitMQStreamProduceOperator(
        task_id="load", stream=s, producer_name="loader", producer_function=lambda: numbered("two", 1000)
    )
    with pytest.raises(RuntimeError, match="injected failure"):
        one.execute(context("load", "run-1"))
    two.execute(context("load", "run-2"))
    out = one.execute(context("load", "run-1"))
    assert_each_once(bodies_in(broker, s), numbered("one", 3000) + numbered("two", 1000))
    assert out["rows"] == 3000 and out["resumed"] is True
    # Retried once more (say the task is cleared): nothing new.
    again = one.execute(context("load", "run-1"))
    assert sum(again["new"].values()) == 0
    assert_each_once(bodies_in(broker, s), numbered("one", 3000) + numbered("two", 1000))


def test_a_retried_produce_task_on_a_super_stream_writes_each_row_once(
    broker: BrokerSettings, streams: Any
) -> None:
    """The same on a super stream of 3 partitions: each partition stream numbers from its own base."""
    name, parts = streams.super_stream(3)
    fn = KeyedFailAfter(broker, parts, "k", 3000, fail_after=2500, stored=2000)
    op = RabbitMQStreamProduceOperator(
        task_id="load", superstream=name, producer_name="loader", producer_function=fn
    )
    with pytest.raises(RuntimeError, match="injected failure"):
        op.execute(context("load", "run-1", map_index=3))
    out = op.execute(context("load", "run-1", map_index=3))
    assert out["rows"] == 3000
    assert_each_once(bodies_in(broker, *parts), numbered("k", 3000))


def test_a_produce_task_retried_after_a_partition_was_added_writes_each_row_once(
    broker: BrokerSettings, streams: Any
) -> None:
    """The first try stores 2,000 of 3,000 keyed rows over 2 partitions and fails; a third partition
    is bound to the super stream; Airflow's retry of the task instance routes over the 2 partitions
    its first try recorded: each row once (was: about 650 rows dropped as already sent, about 690
    kept twice, and the task succeeded)."""
    if broker.external:
        pytest.skip("binds a partition through the local broker's management API")
    name, parts = streams.super_stream(2)
    fn = KeyedFailAfter(broker, parts, "pa", 3000, fail_after=2500, stored=2000)
    op = RabbitMQStreamProduceOperator(
        task_id="load", superstream=name, producer_name="loader", producer_function=fn
    )
    with pytest.raises(RuntimeError, match="injected failure"):
        op.execute(context("load", "run-1"))
    added = streams.add_partition(name, 2)
    out = op.execute(context("load", "run-1"))
    assert_each_once(bodies_in(broker, parts[0], parts[1], added), numbered("pa", 3000))
    assert out["rows"] == 3000 and out["resumed"] is True and out["messages"][added] == 0
    assert sum(out["already_stored"].values()) >= 2000


def test_without_a_producer_name_a_retry_publishes_again(broker: BrokerSettings, streams: Any) -> None:
    """No producer name, no deduplication (unchanged, documented): the retry's rows are all new."""
    s = streams.stream("pn")
    fn = FailAfter(broker, [s], "n", 3000, fail_after=2500, stored=2000)
    op = RabbitMQStreamProduceOperator(task_id="load", stream=s, producer_function=fn)
    with pytest.raises(RuntimeError, match="injected failure"):
        op.execute(context("load", "run-1"))
    first = client(broker).tail(s)
    assert first >= 2000
    assert op.execute(context("load", "run-1"))["rows"] == 3000
    assert client(broker).tail(s) == first + 3000


# ------------------------------------------------------------------------------ through Airflow's own retry


RETRY_DAG = '''
import os
import time
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_rmqs.hooks import RabbitMQStreamHook
from airflow_rmqs.operators import RabbitMQStreamProduceOperator

STREAM = os.environ["RMQS_TEST_STREAM"]


def rows(attempt):
    """3,000 rows; the first try fails after 2,500, once the broker stored 2,000 of them."""
    for i in range(3000):
        if int(attempt) == 1 and i == 2500:
            deadline = time.monotonic() + 30
            while RabbitMQStreamHook().tails(stream=STREAM)[STREAM] < 2000 and time.monotonic() < deadline:
                time.sleep(0.05)
            raise RuntimeError("injected failure after 2,500 of 3,000 rows")
        yield f"row-{i:05d}".encode()


with DAG("rmqs_test_produce_retry", schedule=None, start_date=datetime(2025, 1, 1)) as dag:
    RabbitMQStreamProduceOperator(
        task_id="produce",
        stream=STREAM,
        producer_name="loader",
        producer_function=rows,
        producer_function_kwargs={"attempt": "{{ ti.try_number }}"},
        retries=1,
        retry_delay=timedelta(seconds=0),
    )
'''


@pytest.mark.slow
def test_airflow_retries_a_failed_produce_task_and_the_stream_holds_each_row_once(
    airflow_db: str, broker: BrokerSettings, streams: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = streams.stream("pd")
    path = write_dag_file("rmqs_test_produce_retry", RETRY_DAG)
    module = load_dag_module(path.stem, {"RMQS_TEST_STREAM": s}, monkeypatch)
    dag_run = module.dag.test()
    assert dag_run.state == "success"
    ti = dag_run.get_task_instance("produce")
    assert ti.try_number == 2
    assert_each_once(bodies_in(broker, s), numbered("row", 3000))
    summary = ti.xcom_pull(task_ids="produce")
    assert summary["rows"] == 3000 and summary["resumed"] is True
    assert summary["run_identity"] == f"rmqs_test_produce_retry/produce/{dag_run.run_id}"
