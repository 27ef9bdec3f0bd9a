"""Produce runs and the Spark sink. `spark_publish` publishes through Airflow's
`RabbitMQStreamPublishOperator` (the Spark sink, `producerName`; off in the in-suite budget): each
message once; with its Spark Python workers killed mid-publish and Airflow's retry, the documented
at-least-once (a scratch target: repeats only of what a failed try stored). `produce_run` publishes
through Airflow's `RabbitMQStreamProduceOperator` with a
producer name and a run identity, its producer function failing part way, a partition optionally
bound to the super stream before the retry, and the same run retried until it succeeds.

What must hold (issue 42, case 4; docs/failure-semantics.md "Writes with `producerName`"): every
message of the run is in the target exactly once, in the partition hash routing over the first
try's partition list chose (a retry keeps the first try's routing; a partition bound between tries
gets none of the run's messages), whatever the failed try had stored. The messages are then in
the model like any other publish: every consumer's invariants count them, so a message stored
twice shows as a body at two offsets, one missing as a message the model cannot find.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from airflow_rmqs.plain_operators import RabbitMQStreamProduceOperator
from tests.campaign.broker_faults import BrokerFaultRules
from tests.campaign.broker_ops import BrokerOps, partition_of, routing_key
from tests.campaign.drain_rules import RETRIES, WorkerKiller, flush_dead_workers
from tests.campaign.faults import SinkFailure
from tests.campaign.harness import STATS, TARGETS
from tests.campaign.invariants import Violation
from tests.campaign.runs import CONN_ID
from tests.campaign.spark_rules import spark_environment

MAX_TRIES = 3
BATCH = 4  # messages per publish batch: a try failing after some batches has stored a few
# Published by a killed Spark publish (to a scratch target): its workers are killed once the first
# message is stored, and the rest takes long enough to be cut in the middle.
PUBLISH_KILL_MESSAGES = 50_000


class ProduceRules(BrokerFaultRules):
    """`produce_run` (see the module docstring)."""

    _produce_runs = itertools.count()

    @rule(
        to=st.sampled_from(TARGETS),
        n=st.integers(1, 40),
        fail_at=st.one_of(st.none(), st.integers(0, 40)),
        bind_between=st.booleans(),
    )
    def produce_run(self, to: str, n: int, fail_at: int | None, bind_between: bool) -> None:
        """A produce run of `n` keyed messages whose producer function fails after `fail_at` of them
        on its first try (None: never); with `bind_between`, the super stream gets its third
        partition before the retry; retried under the same run identity until it succeeds."""
        if not self._step("produce_run"):
            return
        if not self.model.target_exists(to):
            return self._skip("produce-to-missing")
        t = self.model.targets[to]
        items = self.model.next_bodies(n)
        first_partitions = list(t.partitions)
        since = self.ops.tails(first_partitions)
        identity = f"campaign-{self.uid}-{next(self._produce_runs)}"
        began = int(time.time() * 1000) - 1
        outcomes: list[str] = []
        for attempt in range(MAX_TRIES):
            failing = attempt == 0 and fail_at is not None and fail_at < n
            error = self._produce_try(t.name, t.superstream, items, identity, fail_at if failing else None)
            outcomes.append("ok" if error is None else type(error).__name__)
            if error is None:
                break
            if not failing and not _retryable(error):
                raise Violation(
                    "d", f"a produce run to {t.name} failed untyped: {type(error).__name__}: {error}"
                )
            if attempt == 0 and bind_between and to == "ss" and len(t.partitions) == 2:
                self.bind_partition()  # type: ignore[attr-defined]  # between the tries (machine.py)
        else:
            raise Violation(
                "d", f"a produce run to {t.name} did not succeed in {MAX_TRIES} tries: {outcomes}"
            )
        STATS[f"produce:{'>'.join(outcomes)}"] += 1
        self._published_once(to, items, first_partitions, since, began, f"a produce run ({outcomes})")

    @precondition(lambda self: self.config.enabled("spark_publish"))
    @rule(to=st.sampled_from(TARGETS), n=st.integers(1, 40), kill=st.sampled_from((False, False, True)))
    def spark_publish(self, to: str, n: int, kill: bool) -> None:
        """`n` keyed messages published through the Spark sink (`RabbitMQStreamPublishOperator` on a
        local SparkSession, `producerName`, hash routing): each in the target exactly once, in the
        partition hash routing chose, and then read by every consumer like any other publish. With
        `kill`: `_killed_spark_publish` instead."""
        if not self._step("spark_publish"):
            return
        if kill:
            return self._killed_spark_publish(to, n)
        if not self.model.target_exists(to):
            return self._skip("spark-publish-to-missing")
        t = self.model.targets[to]
        items = self.model.next_bodies(n)
        partitions = list(t.partitions)
        since = self.ops.tails(partitions)
        run = next(self._produce_runs)
        source = self._publish_input(run, items)
        where: dict[str, Any] = {"superstream": t.name} if t.superstream else {"stream": t.name}
        began = int(time.time() * 1000) - 1
        error = _spark_publish_try(source, f"campaign-{self.uid}-spark-{run}", where)
        if error is not None:
            raise Violation("d", f"a Spark publish to {t.name} failed: {type(error).__name__}: {error}")
        STATS["spark_publish:ok"] += 1
        self._published_once(to, items, partitions, since, began, "a Spark publish")

    def _killed_spark_publish(self, to: str, n: int) -> None:
        """`n + PUBLISH_KILL_MESSAGES` keyed messages through the Spark sink with `producerName`, its
        Spark Python workers killed (SIGKILL) once the first message is stored, as a lost executor
        would: the task and the operator fail (Spark local mode retries no task); Airflow's retries
        (up to `RETRIES`) publish the same input again. An Airflow retry is another write job, so
        the promise is at-least-once (docs/failure-semantics.md, "Writes with `producerName`"):
        every message stored, and only messages a failed try had stored stored again, at most once
        per try. The repeats would break the model's one-offset-per-message: the publish goes to a
        scratch stream (or super stream with as many partitions as `to`), checked and deleted."""
        spark_environment()
        run = next(self._produce_runs)
        name = f"camp-{self.uid}-pub{run}"
        t = self.model.targets[to]
        if t.superstream:
            partitions = self.ops.create_super_stream(name, len(self.model.current_parts(to)) or 2)
        else:
            self.ops.create_stream(name)
            partitions = [name]
        where: dict[str, Any] = {"superstream": name} if t.superstream else {"stream": name}
        items = [(i, f"pub:{self.uid}:{run}:{i}".encode()) for i in range(n + PUBLISH_KILL_MESSAGES)]
        source = self._publish_input(run, items)
        empty = self.ops.tails(partitions)
        outcomes: list[str] = []
        killed = 0
        stored_by_failed: set[bytes] = set()
        try:
            for _ in range(1 + RETRIES):
                first = not outcomes
                killing = WorkerKiller(lambda: self.ops.tails(partitions) != empty) if first else None
                with killing or contextlib.nullcontext() as killer:
                    error = _spark_publish_try(source, f"campaign-{self.uid}-spark-{run}", where)
                killed += killer.killed if killer is not None else 0
                if killed:
                    flush_dead_workers()
                outcomes.append("ok" if error is None else type(error).__name__)
                if error is None:
                    break
                if not killed:
                    raise Violation("d", f"a Spark publish to {name} failed: {type(error).__name__}: {error}")
                stored_by_failed.update(_stored_bodies(self.ops, partitions))
            else:
                raise Violation(
                    "d", f"a Spark publish to {name} killed {killed} worker(s), failed: {outcomes}"
                )
            got = Counter(_stored_bodies(self.ops, partitions))
        finally:
            if t.superstream:
                self.ops.delete_super_stream(name, partitions)
            else:
                self.ops.delete_stream(name)
        missing = {body for _, body in items} - set(got)
        again = {body: k for body, k in got.items() if k > 1}
        wrong = {body: k for body, k in again.items() if body not in stored_by_failed or k > len(outcomes)}
        what = f"a killed Spark publish of {len(items)} ({outcomes}, {killed} worker(s) killed)"
        if missing or wrong or set(got) - {body for _, body in items}:
            raise Violation(
                "produce",
                f"{what}: {len(missing)} message(s) never stored (first: {sorted(missing)[:3]}), "
                f"{len(wrong)} stored again though no failed try had stored them (first: {list(wrong)[:3]})",
            )
        STATS[f"spark_publish:killed={bool(killed)}:failed_try_stored={bool(stored_by_failed)}"] += 1
        STATS[f"spark_publish:killed:{'>'.join(outcomes)}"] += 1
        STATS["spark_publish:killed:repeated"] += len(again)

    def _publish_input(self, run: int, items: list[tuple[int, bytes]]) -> str:
        """A Parquet folder of `items` as the publish task's input (value, routing key)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        source = self.tmp / f"spark-publish-{run}"
        source.mkdir()
        table = pa.table(
            {"value": [body for _, body in items], "routing_key": [routing_key(seq) for seq, _ in items]}
        )
        pq.write_table(table, source / "part-0.parquet")
        return str(source)

    def _published_once(
        self,
        to: str,
        items: list[tuple[int, bytes]],
        partitions: list[str],
        since: dict[str, int],
        began: int,
        what: str,
    ) -> None:
        """`items`, published to target `to` since `since` (tails) in the window from `began`, into the
        model: each found exactly once, in the partition hash routing over `partitions` chose."""
        t = self.model.targets[to]
        window = (began, int(time.time() * 1000) + 1)
        self.model.windows.append(window)
        groups: dict[str, list[tuple[int, bytes]]] = {}
        for seq, body in items:
            dest = partition_of(seq, partitions) if t.superstream else t.name
            groups.setdefault(dest, []).append((seq, body))
        tails = self.ops.tails(groups)
        for stream, group in groups.items():
            try:
                offsets = self.ops.offsets_of(stream, [b for _, b in group], tails[stream], since[stream])
            except AssertionError as e:
                raise Violation("produce", f"{what} to {t.name}: {e}") from None
            self.model.record(stream, group, offsets, window)
        self._touch(to)
        STATS["messages"] += len(items)

    def _produce_try(
        self,
        target: str,
        superstream: bool,
        items: list[tuple[int, bytes]],
        identity: str,
        fail_at: int | None,
    ) -> BaseException | None:
        """One try of the produce task; what it raised (None: it succeeded)."""

        def messages() -> Iterator[dict[str, Any]]:
            for i, (seq, body) in enumerate(items):
                if i == fail_at:
                    raise SinkFailure(f"the producer function failed after {i} messages (injected)")
                yield {"value": body, "routing_key": routing_key(seq)}

        where: dict[str, Any] = {"superstream": target} if superstream else {"stream": target}
        try:
            RabbitMQStreamProduceOperator(
                task_id="campaign-produce",
                rabbitmq_stream_conn_id=CONN_ID,
                producer_function=messages,
                producer_name="campaign-producer",
                run_identity=identity,
                batch_size=BATCH,
                **where,
            ).execute({})
        except Exception as e:
            return e
        return None


def _spark_publish_try(source: str, producer: str, where: dict[str, Any]) -> BaseException | None:
    """One try of the Spark publish task over the Parquet input `source`; what it raised."""
    from airflow_rmqs.operators import RabbitMQStreamPublishOperator

    try:
        RabbitMQStreamPublishOperator(
            task_id="campaign-spark-publish",
            rabbitmq_stream_conn_id=CONN_ID,
            input_path=source,
            sink_options={"producerName": producer, "routingStrategy": "hash"},
            spark_conf={"spark.ui.showConsoleProgress": "false"},
            **where,
        ).execute({})
    except Exception as e:
        return e
    return None


def _stored_bodies(ops: BrokerOps, streams: list[str]) -> list[bytes]:
    """Every message body stored in `streams`, repeats kept."""
    from pyspark_rmqs.broker.reader import read_range

    tails = ops.tails(streams)
    return [b for s in streams for b in read_range(ops.conn, s, 0, tails[s]).column("value").to_pylist()]


def _retryable(error: BaseException) -> bool:
    from pyspark_rmqs.errors import classify

    return isinstance(error, Exception) and classify(error).retryable
