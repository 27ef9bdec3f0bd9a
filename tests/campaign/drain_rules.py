"""The drain consumer's rule: AvailableNow drains through Airflow's `RabbitMQStreamDrainOperator` on a
local SparkSession into Parquet, the checkpoint kept between runs (pipelines `c7@<target>`).

A drain is the watermark protocol's other shape: Spark's checkpoint says where the next drain
starts, the file sink's log (`_spark_metadata`) says which files are the output, and the consumer's
stored offset follows the checkpoint. Every other rule reaches it too (publish, truncate, recreate,
bind a partition, concurrent runs of its name), and the final check runs it.

A user answers a refused drain as the error says: a checkpoint that read a stream since deleted and
created again, or a new checkpoint into a folder another one wrote, is given up for a new
checkpoint and a new output folder (a new *generation*). The new checkpoint starts at the consumer's
stored offsets (its `consumerName`), so its output continues the old one's: the consumer's output is
every generation's folder together, and exactly-once holds across them. Off in the in-suite budget
(Spark costs seconds per run); on in `make campaign`.

`drain_sink_failing` makes the drain's output folder read-only while it runs: its file sink fails
after the query planned the batch; the retry, the folder writable again, goes on from the checkpoint.

`drain_killed` kills (SIGKILL) the Spark Python workers reading the broker in the middle of a drain,
as a lost executor would: the task fails, so do the query and the drain (Spark local mode retries no
task); Airflow's retry goes on from the checkpoint, and exactly-once holds across the two tries.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from airflow_rmqs.operators import RabbitMQStreamDrainOperator
from tests.campaign.faults import Hooks, SinkFailure, WorkerKilled, read_only
from tests.campaign.harness import STATS, TARGETS
from tests.campaign.model import PipelineModel, TargetModel
from tests.campaign.runs import CONN_ID, Attempt, Row, is_typed, parquet_rows
from tests.campaign.spark_rules import SparkRules, spark_environment
from tests.e2e.faults.support import is_task_worker

# What a refused drain says, and what its user does then (a new checkpoint and output folder).
GIVE_UP = ("deleted and created again", "holds the file sink log of another streaming query")
DRAIN_TIMEOUT_S = 300
KILL_MESSAGES = 2000  # published before a killed drain: a read long enough to be caught in
RETRIES = 2  # tries after a killed drain's first that may still fail from the kill


def flush_dead_workers(rounds: int = 20) -> None:
    """Run small Python jobs until the session's worker pool holds no killed worker any more.

    Spark keeps idle Python workers for reuse; one killed while idle fails the next task handed to
    it ("Stream closed" as the worker factory stops it). That is Spark's pool, not the connector: a
    later step of the sequence (the Spark consumer's run) must not fail from this step's kill.
    """
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is None:
        return
    clean = 0
    for _ in range(rounds):
        try:
            spark.range(0, 8, numPartitions=4).mapInArrow(lambda batches: batches, "id long").count()
            clean += 1
        except Exception:
            clean = 0
        if clean >= 5:  # every idle worker of the pool taken at least once since the last failure
            return


class WorkerKiller:
    """In a thread, while a drain or a Spark publish runs: SIGKILL this process's Spark Python task
    workers (the daemon and the workers it forked: `support.is_task_worker`) as they appear, up to
    `ROUNDS` times (an idle reused worker dies harmlessly; one inside a task fails it)."""

    ROUNDS = 3

    def __init__(self, when: Callable[[], bool] | None = None) -> None:
        self.killed = 0
        self.rounds = 0
        self.when = when  # killing starts once it holds (e.g. the publish has stored a message)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="campaign-worker-killer", daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while self.when is not None and not self.when():
            if self.stop.wait(0.02):
                return
        while self.rounds < self.ROUNDS and not self.stop.wait(0.02):
            victims = [c for c in me.children(recursive=True) if is_task_worker(c.pid)]
            for c in victims:
                try:
                    os.kill(c.pid, signal.SIGKILL)
                    self.killed += 1
                except ProcessLookupError:
                    pass
            self.rounds += bool(victims)

    def __enter__(self) -> WorkerKiller:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


def execute_drain(
    target: TargetModel,
    pipeline: PipelineModel,
    *,
    checkpoint: Path,
    output: Path,
    started_seq: int,
    fail_on_data_loss: bool = True,
) -> Attempt:
    """Run the drain operator once for `pipeline`; never raises what the run raised."""
    where: dict[str, Any] = {"superstream": target.name} if target.superstream else {"stream": target.name}
    attempt = Attempt("watermark", started_seq)
    try:
        attempt.summary = RabbitMQStreamDrainOperator(
            task_id=f"campaign-{pipeline.consumer}",
            rabbitmq_stream_conn_id=CONN_ID,
            consumer_name=pipeline.consumer,
            checkpoint_location=str(checkpoint),
            output_path=str(output),
            source_options={"failOnDataLoss": str(fail_on_data_loss).lower()},
            spark_conf={"spark.ui.showConsoleProgress": "false"},
            timeout=DRAIN_TIMEOUT_S,
            **where,
        ).execute({})
    except BaseException as e:
        attempt.error = e
    return attempt


def _blame(attempt: Attempt, fault: type[Exception]) -> None:
    """An untyped failure of a try the rule faulted is the fault's: re-wrapped as `fault` (invariant
    d then excuses it as injected); an rmqs error stays as it is."""
    if attempt.error is not None and not is_typed(attempt.error):
        attempt.error = fault(f"{type(attempt.error).__name__}: {attempt.error}"[:2000])


class DrainRules(SparkRules):
    """`drain` (see the module docstring); the drain consumer's tries and output."""

    @precondition(lambda self: self.config.enabled("drain"))
    @rule(to=st.sampled_from(TARGETS), new_checkpoint=st.sampled_from((False, False, False, True)))
    def drain(self, to: str, new_checkpoint: bool) -> None:
        """An AvailableNow drain of target `to` on the kept checkpoint, or on a new checkpoint into
        the same folder (refused once the folder holds a log: the user then starts a generation)."""
        if not self._step("drain"):
            return
        spark_environment()
        key = f"c7@{to}"
        if new_checkpoint:
            self._drain_generation(key)[0] += 1
        self._watermark_run(key)

    @precondition(lambda self: self.config.enabled("drain_killed"))
    @rule(to=st.sampled_from(TARGETS))
    def drain_killed(self, to: str) -> None:
        """A drain of `to` whose Spark Python workers reading the broker are killed mid-read; then
        its retry, as Airflow's (a failure that is not rmqs's own is the kill's: invariant d)."""
        p = self._faulted_drain("drain_killed", to)
        if p is None:
            return
        self._publish(p.target, KILL_MESSAGES)
        with WorkerKiller() as killer:
            attempt = self._attempt(p, Hooks())
        if killer.killed:
            flush_dead_workers()
        STATS[f"drain_killed:killed={bool(killer.killed)}:{attempt.label}"] += 1
        # Airflow's retries: Spark hands a task a pooled worker the kill left dead once more (local
        # mode retries no task), so a try after the kill may fail the same untyped way.
        for _ in range(RETRIES):
            if killer.killed:
                _blame(attempt, WorkerKilled)
            self._settle(p, attempt, WorkerKilled if killer.killed else None)
            if attempt.ok:
                return
            attempt = self._attempt(p, Hooks())
            STATS[f"drain_killed:retry:{attempt.label}"] += 1
        self._settle(p, attempt, None)

    @precondition(lambda self: self.config.enabled("drain_sink_failing"))
    @rule(to=st.sampled_from(TARGETS), n=st.integers(1, 60))
    def drain_sink_failing(self, to: str, n: int) -> None:
        """A drain of `to` (after `n` new messages) whose output folder is read-only while it runs (a
        bind mount remounted read-only, as a disk that turned read-only or a lost mount does: even
        root cannot write there): the query has planned its batch (offsets log) and its file sink
        fails to write it, so the drain fails (the failure is the fault's: invariant d). Then
        Airflow's retry, the folder writable again, goes on from the checkpoint: every message
        once, nothing past the failed batch stored as the watermark before it was written."""
        p = self._faulted_drain("drain_sink_failing", to)
        if p is None:
            return
        self._publish(p.target, n)
        output = self._drain_folders(p)[1]
        output.mkdir(exist_ok=True)
        with read_only(output) as mounted:
            if not mounted:
                return self._skip("drain-sink-failing-no-mount")
            attempt = self._attempt(p, Hooks())
        STATS[f"drain_sink_failing:{attempt.label}"] += 1
        _blame(attempt, SinkFailure)
        self._settle(p, attempt, SinkFailure)
        if not attempt.ok:
            retry = self._attempt(p, Hooks())
            STATS[f"drain_sink_failing:retry:{retry.label}"] += 1
            self._settle(p, retry, None)

    def _faulted_drain(self, rule: str, to: str) -> PipelineModel | None:
        """The drain consumer of `to` for a fault rule (`rule`), Spark's environment set; None (the
        step counted as a no-op) where the rule is off or the target cannot be drained now."""
        if not self._step(rule):
            return None
        spark_environment()
        p = self.model.pipelines[f"c7@{to}"]
        if not self.model.target_exists(p.target) or not self._may_run(p):
            self._skip(f"{rule.replace('_', '-')}-not-applicable")
            return None
        return p

    def _drain_folders(self, p: PipelineModel) -> tuple[Path, Path]:
        """The checkpoint and the output folder of `p`'s current generations."""
        name = p.key.replace("@", "-at-")
        cp, out = self._drain_generation(p.key)
        return self.tmp / f"{name}-checkpoint-{cp}", self.tmp / f"{name}-output-{out}"

    def _drain_generation(self, key: str) -> list[int]:
        """[checkpoint, output] generation numbers of `key` (a user's new checkpoint, new folder)."""
        found: dict[str, list[int]] = self.__dict__.setdefault("_drain_generations", {})
        return found.setdefault(key, [0, 0])

    def _attempt(self, p: PipelineModel, hooks: Hooks, *, crash: str | None = None, **kw: Any) -> Attempt:
        if p.engine != "drain":
            return super()._attempt(p, hooks, crash=crash, **kw)
        assert crash is None and hooks.fail_after is None and hooks.late is None, "drains take no faults"
        strict = kw.pop("fail_on_data_loss", True)
        assert not kw, f"a drain runs from its checkpoint only: {kw}"
        if threading.current_thread() is threading.main_thread():
            self._before_run(p)
        for _ in range(2):
            checkpoint, output = self._drain_folders(p)
            attempt = execute_drain(
                self._target(p),
                p,
                checkpoint=checkpoint,
                output=output,
                started_seq=self.model.seq,
                fail_on_data_loss=strict,
            )
            said = "" if attempt.error is None else str(attempt.error)
            refused = next((w for w in GIVE_UP if w in said), None)
            if refused is None:
                return attempt
            STATS[f"drain_refused:{refused}"] += 1
            generation = self._drain_generation(p.key)
            generation[:] = [generation[0] + 1, generation[1] + 1]  # as the error says: both new
            self._before_run(p, new_checkpoint=True)
        return attempt

    def _rows(self, p: PipelineModel) -> list[Row]:
        """For the drain consumer: every generation's committed files together (its whole output)."""
        if p.engine != "drain":
            return super()._rows(p)
        name = p.key.replace("@", "-at-")
        rows: list[Row] = []
        for folder in sorted(self.tmp.glob(f"{name}-output-*")):
            rows.extend(parquet_rows(folder))
        return rows
