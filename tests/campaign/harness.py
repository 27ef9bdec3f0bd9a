"""The campaign machine's body: its streams and consumers, running a consumer, settling what a run
did into the model, the invariants after every step and the final check at teardown.

`machine.CampaignMachine` adds the rules (the operation alphabet). One instance is one sequence: it
creates its own streams `a`, `b` and super stream `ss` (2 partitions, a third can be bound), with
five consumers on each target (a pipeline is `<consumer>@<target>`, e.g. `c2@ss`):

    c1  Airflow operator, function sink (at-least-once)   starting_offsets="earliest"
    c2  Airflow operator, Parquet folder (exactly-once)   starting_offsets="earliest"
    c3  Airflow operator, Parquet folder (exactly-once)   starting_offsets="latest"
    c4  Airflow operator, function sink (at-least-once)   starting_offsets="latest"
    c5  Dagster asset, arrow engine, Parquet (exactly-once) starting_offsets="earliest"

After every rule `holds` checks invariants (a)-(c) on the pipelines the rule touched; at teardown
new data arrives on every target, every consumer runs once more, cleanly, and invariant (e) is
checked; then the streams are deleted.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from hypothesis.stateful import RuleBasedStateMachine, invariant

from pyspark_rmqs.runs.outputs import commit_index
from tests.campaign import object_store
from tests.campaign.broker_ops import BrokerOps, partition_of
from tests.campaign.config import COMPACT_EVERY, CampaignConfig
from tests.campaign.dagster_runs import DagsterRuns
from tests.campaign.faults import Crash, Hooks, SinkFailure, crash_at, sink_hooks
from tests.campaign.invariants import (
    Violation,
    check_coverage,
    check_failure,
    check_final,
    check_output,
    check_watermarks,
)
from tests.campaign.model import Model, Part, PipelineModel, TargetModel
from tests.campaign.runs import Attempt, Row, execute, iceberg_rows, parquet_rows, use_broker
from tests.support.broker import RESTARTABLE, settings_from_env

TARGETS = ("a", "b", "ss")
# consumer -> (engine, sink, starting_offsets)
CONSUMERS = {
    "c1": ("airflow", "fn", "earliest"),
    "c2": ("airflow", "parquet", "earliest"),
    "c3": ("airflow", "parquet", "latest"),
    "c4": ("airflow", "fn", "latest"),
    "c5": ("dagster", "parquet", "earliest"),
}
PIPELINES = tuple(f"{c}@{t}" for t in TARGETS for c in CONSUMERS)
# The Spark consumer: the Airflow `RabbitMQStreamReadOperator` on a local SparkSession, exactly-once
# Parquet. Its runs cost seconds (its session ~15 s once), so it exists only where the `spark_run`
# rule is enabled (`make campaign`, not the in-suite budget: config.SUITE).
# c9: Dagster's Spark engine (`build_stream_asset(engine="spark")`, `SparkSessionResource`) into an
# exactly-once Parquet folder, on the same local session.
SPARK_CONSUMERS = {"c6": ("spark", "parquet", "earliest"), "c9": ("dagster-spark", "parquet", "earliest")}
SPARK_PIPELINES = tuple(f"{c}@{t}" for t in TARGETS for c in SPARK_CONSUMERS)
# The drain consumer: AvailableNow drains through the Airflow drain operator, a kept checkpoint
# (drain_rules.py); only where the `drain` rule is enabled.
DRAIN_CONSUMERS = {"c7": ("drain", "parquet", "earliest")}
DRAIN_PIPELINES = tuple(f"{c}@{t}" for t in TARGETS for c in DRAIN_CONSUMERS)
# The Iceberg consumer: the Airflow consume operator into an Iceberg table (pyiceberg, SQL catalog),
# exactly-once by the run's token in the table's snapshots; only where `iceberg_run` is enabled.
ICEBERG_CONSUMERS = {"c8": ("airflow", "iceberg", "earliest")}
ICEBERG_PIPELINES = tuple(f"{c}@{t}" for t in TARGETS for c in ICEBERG_CONSUMERS)
AIRFLOW_PIPELINES = tuple(k for k in PIPELINES if CONSUMERS[k.split("@")[0]][0] == "airflow")
STREAM_KEYS = ("a", "b", "ss-0", "ss-1", "ss-2")
FINAL_MESSAGES = 3  # per partition, published before the final runs

# Counts over every sequence of the process: rules, outcomes, steps avoided (the runner prints them),
# and the seconds each rule took with its invariants.
STATS: Counter[str] = Counter()
SECONDS: defaultdict[str, float] = defaultdict(float)
# Every failure as it happened: (the rules called so far in its sequence, the error). A failure whose
# replay behaves differently (the broker's timing) is reported by hypothesis as `Flaky...` only.
FAILURES: list[tuple[list[str], str]] = []
# Loss reports naming only messages the consumer had (the runner prints the first few).
FALSE_ALARMS: list[str] = []
# Called at the end of every sequence with (steps, seconds) when set (the runner's progress lines).
PROGRESS: list[Callable[[int, float], None]] = []


class CampaignBase(RuleBasedStateMachine):
    """Real streams and consumers, a reference model, the invariants after every step (no rules)."""

    config: ClassVar[CampaignConfig] = CampaignConfig()

    def __init__(self) -> None:
        super().__init__()
        settings = RESTARTABLE if self.config.broker == "restartable" else settings_from_env()
        if self.config.vhost is not None:
            settings = replace(settings, vhost=self.config.vhost)
        use_broker(settings)
        self.ops = BrokerOps(settings)
        self.dagster = DagsterRuns(settings)
        self.model = Model()
        self.uid = uuid.uuid4().hex[:8]
        self.tmp = Path(tempfile.mkdtemp(prefix="rmqs-campaign-"))
        self.rows: dict[str, list[Row]] = {}
        self.dirty: set[str] = set()
        self.healthy = True  # False from a rule's start until its invariants held
        self._began: tuple[str, float] | None = None
        self._cleaned = False
        self._created = time.monotonic()
        self._steps = 0
        self._per_rule: Counter[str] = Counter()
        self.trail: list[str] = []  # the rules called, as hypothesis prints them (machine._traced)
        self.names: dict[str, str] = {}
        # `rmqs.runs`' first offset when records were last observed (config.evictable_records), and
        # per pipeline the partitions an evicted consumer's try found with no stored offset.
        self._runs_first: int | None = None
        self._unplaced: dict[str, set[Part]] = {}
        self.bucket = object_store.server().new_bucket("camp") if self.config.outputs == "s3" else None
        # Compaction of the commit index every COMPACT_EVERY commits, under every rule (16 by default:
        # a sequence's output rarely gets there); put back at cleanup (the in-suite budget shares
        # its process with other tests).
        self._compact_every = commit_index.COMPACT_EVERY
        commit_index.COMPACT_EVERY = COMPACT_EVERY
        for key in ("a", "b"):
            name = self.names[key] = f"camp-{self.uid}-{key}"
            self.ops.create_stream(name)
            self.model.add_target(key, name, [name], superstream=False)
        ss = self.names["ss"] = f"camp-{self.uid}-ss"
        self.model.add_target("ss", ss, self.ops.create_super_stream(ss, 2), superstream=True)
        spark = SPARK_PIPELINES if self.config.enabled("spark_run") else ()
        drains = DRAIN_PIPELINES if self.config.enabled("drain") else ()
        tables = ICEBERG_PIPELINES if self.config.enabled("iceberg_run") else ()
        every = {**CONSUMERS, **SPARK_CONSUMERS, **DRAIN_CONSUMERS, **ICEBERG_CONSUMERS}
        for key in (*PIPELINES, *spark, *drains, *tables):
            consumer, target = key.split("@")
            engine, sink, starting = every[consumer]
            self.model.pipelines[key] = PipelineModel(key, consumer, target, sink, starting, engine)
            self.rows[key] = []
        for target in TARGETS if self.config.initial_messages else ():
            self._publish(target, self.config.initial_messages * len(self.model.targets[target].partitions))
        STATS["sequences"] += 1

    # ------------------------------------------------------------------------------ helpers

    def _step(self, name: str) -> bool:
        """Start rule `name`: False (and counted) when the configuration switched it off."""
        self.healthy = False
        self._began = (name, time.monotonic())
        if not self.config.enabled(name):
            STATS[f"disabled:{name}"] += 1
            return False
        STATS[f"rule:{name}"] += 1
        self._per_rule[name] += 1
        STATS["steps"] += 1
        self._steps += 1
        self._observe_records()
        return True

    def _ran(self, name: str) -> int:
        """How many times rule `name` started in this sequence."""
        return self._per_rule[name]

    def _skip(self, why: str) -> None:
        STATS[f"noop:{why}"] += 1

    def _avoided(self, bug: str) -> bool:
        if self.config.avoids(bug):
            STATS[f"avoided:{bug}"] += 1
            return True
        return False

    def _target(self, p: PipelineModel) -> TargetModel:
        return self.model.targets[p.target]

    def _output(self, p: PipelineModel) -> Path | str | None:
        """Where `p`'s exactly-once output is (None: a function sink); `s3://` under
        `outputs="s3"` for the Airflow consume operator's consumers (object_store.py)."""
        if not p.exactly_once:
            return None
        name = p.key.replace("@", "-at-")
        if p.sink == "iceberg":  # a table in the sequence's catalog (`iceberg_catalog`)
            return f"campaign.{name.replace('-', '_')}"
        if self.bucket is not None and p.engine in ("airflow", "dagster"):
            return f"s3://{self.bucket}/{name}"
        return self.tmp / name

    @property
    def iceberg_catalog(self) -> dict[str, str]:
        """The sequence's pyiceberg catalog (SQL on SQLite, a local warehouse) for the Iceberg consumer."""
        return {
            "type": "sql",
            "uri": f"sqlite:///{self.tmp}/iceberg.db",
            "warehouse": f"file://{self.tmp}/warehouse",
        }

    def _touch(self, target: str) -> None:
        self.dirty.update(p.key for p in self.model.pipelines_of(target))

    def _stream(self, key: str) -> str | None:
        """The broker name of stream key `a`, `b` or `ss-<i>` (None: no such partition yet)."""
        if not key.startswith("ss-"):
            return self.names[key]
        name = f"{self.names['ss']}-{key[3:]}"
        return name if name in self.model.targets["ss"].partitions else None

    def _stored(self, p: PipelineModel) -> dict[str, int | None]:
        """`p`'s stored watermark on each partition stream of its target that exists now.

        Stored offsets only, not `watermarks()`: that also measures each tail, which on a broker
        before 4.3 waits out a probe (1.5 s) on a stream holding only offset-tracking entries."""
        parts = [x.name for x in self.model.current_parts(p.target)]
        return self.ops.stored_on(p.consumer, parts) if parts else {}

    def _publish(self, target: str, n: int) -> None:
        """Publish `n` new messages to `target` (hash routed on a super stream) and record them."""
        t = self.model.targets[target]
        items = self.model.next_bodies(n)
        groups: dict[str, list[tuple[int, bytes]]] = {}
        for seq, body in items:
            dest = partition_of(seq, t.partitions) if t.superstream else t.name
            groups.setdefault(dest, []).append((seq, body))
        began = int(time.time() * 1000) - 1
        counts = self.ops.publish(t.name, items, superstream=t.superstream)
        window = (began, int(time.time() * 1000) + 1)
        self.model.windows.append(window)
        if {s: n for s, n in counts.items() if n} != {s: len(g) for s, g in groups.items()}:
            raise Violation("model", f"publishing to {t.name} routed {counts}, the model expected {groups}")
        tails = self.ops.tails(groups)
        for stream, group in groups.items():
            part = self.model.partitions[stream]
            since = max([part.first, *(m.offset + 1 for m in part.messages[-1:] if m.offset is not None)])
            offsets = self.ops.offsets_of(stream, [body for _, body in group], tails[stream], since)
            self.model.record(stream, group, offsets, window)
        self._touch(target)
        STATS["messages"] += n

    def _publish_direct(self, target: str, stream: str, n: int) -> None:
        """Publish `n` new messages straight to partition stream `stream` of `target` (not routed)."""
        items = self.model.next_bodies(n)
        began = int(time.time() * 1000) - 1
        self.ops.publish(stream, items, superstream=False)
        window = (began, int(time.time() * 1000) + 1)
        self.model.windows.append(window)
        part = self.model.partitions[stream]
        since = max([part.first, *(m.offset + 1 for m in part.messages[-1:] if m.offset is not None)])
        tail = self.ops.tails([stream])[stream]
        self.model.record(
            stream, items, self.ops.offsets_of(stream, [b for _, b in items], tail, since), window
        )
        self._touch(target)
        STATS["messages"] += n

    def _may_run(self, p: PipelineModel) -> bool:
        """Step around the runs that trigger a known bug still open (config.avoid)."""
        fresh = [x for x in self.model.current_parts(p.target) if x.incarnation > 0 and not x.messages]
        return not (fresh and self._avoided("recreated-empty-run"))

    def _attempt(self, p: PipelineModel, hooks: Hooks, *, crash: str | None = None, **kw: Any) -> Attempt:
        """One try of `p`'s run (through its engine), with `hooks` on its sink and a crash at `crash`."""
        if threading.current_thread() is threading.main_thread():  # not the first of concurrent runs
            self._before_run(p)
        with sink_hooks(hooks), crash_at(crash):
            if p.engine in ("dagster", "dagster-spark"):
                lenient = not kw.pop("fail_on_data_loss", True)
                assert not kw, f"a Dagster asset runs from its watermark only: {kw}"
                output = self._output(p)
                assert output is not None, "the Dagster consumers write exactly-once folders"
                return self.dagster.execute(
                    self._target(p), p, output=output, started_seq=self.model.seq, lenient=lenient
                )
            if p.sink == "iceberg":
                kw["iceberg_catalog"] = self.iceberg_catalog
            return execute(
                self._target(p),
                p,
                output=self._output(p),
                hooks=hooks,
                rows=self.rows[p.key],
                started_seq=self.model.seq,
                **kw,
            )

    def _settle(
        self,
        p: PipelineModel,
        attempt: Attempt,
        injected: type[BaseException] | None,
        crash: str | None = None,
    ) -> None:
        """What a finished try means for the model: (d) on failures, promises on success."""
        STATS[f"outcome:{attempt.kind}:{attempt.label}"] += 1
        unmarked = crash in ("before_delivered", "in_compaction") and attempt.error is not None
        # Dagster keeps the exception itself (its step failure event has the class and message only);
        # a drain's commit is Spark's checkpoint, not a commit state.
        lenient = p.engine in ("dagster", "dagster-spark", "drain")
        lenient = lenient or (unmarked and self._avoided("delivered-commit-state"))
        check_failure(p, attempt, injected, needs_state=not lenient)
        self.dirty.add(p.key)
        if attempt.busy:
            return
        planned = (  # the try got past planning: its range was fixed then
            attempt.ok
            or isinstance(attempt.error, (SinkFailure, Crash))
            or attempt.cause in ("SinkFailure", "LeaseLostError")
        )
        # A latest consumer's first storing run places it, from explicit offsets or times too: it wrote
        # a run record (and stores), and from then on its runs start there, not at the tails.
        if attempt.kind != "backfill" and p.starting == "latest" and planned:
            self.model.start_boundary(p, attempt.started_seq)
        if planned and attempt.kind != "backfill":
            p.planned_ever = True
        if (planned or attempt.cause == "Killed") and attempt.kind != "backfill":  # it wrote a record
            self._placed_again(p, attempt)
        self._reported(p, attempt)
        if not attempt.ok:
            since = attempt.started_seq if p.pending_since is None else p.pending_since
            p.pending_since = min(since, attempt.started_seq)
            return
        # A resumed run (a watermark run, or a storing run from explicit offsets: every storing run
        # resumes its consumer's unfinished record) read the range its first try planned: only what
        # was there then is promised (None: it resumed a try the model did not see fail). A capped
        # run (max_messages) read up to where its cap stopped it.
        horizon = p.pending_since if attempt.resumed else attempt.started_seq
        if horizon is not None and attempt.kind not in ("capped", "timed"):
            p.promised.update(m.body for m in self.model.expected(p, horizon))
        # Whatever it was, a run that succeeded delivered every owed message before the ends it
        # reports (the range it read, and what earlier runs read below its start).
        for stream, end in attempt.ends.items():
            if stream in self.model.partitions and self.model.partitions[stream].exists:
                below = self.model.owed_at_or_below(p, stream, end - 1)
                p.promised.update(m.body for m in below)
        p.pending_since = None

    # --------------------------------------------------------------------------- run records

    def _observe_records(self, *, force: bool = False) -> None:
        """Which consumers' newest records retention removed from the campaign's own `rmqs.runs`
        (config.evictable_records), looked at whenever its first offset moved (or `force`)."""
        if not self.config.evictable_records:
            return
        first = self.ops.runs_first()
        if first == self._runs_first and not force:
            return
        if first != self._runs_first:  # retention removes segments in the background: let it finish
            first = self.ops.settled_runs_first()
        self._runs_first = first
        for p in self.model.pipelines.values():
            kept = self.ops.record_kept(p.consumer, self.model.targets[p.target].name)
            if p.has_record and not kept:
                self._record_gone(p)
            p.has_record = kept

    def _record_gone(self, p: PipelineModel) -> None:
        """Retention removed `p`'s newest record: a consumer that never ran, but for its stored
        offsets (an unfinished run is planned anew; the retry's horizon is its own start)."""
        p.evicted = True
        p.planned_ever = False
        p.pending_since = None
        STATS["records_evicted"] += 1
        self.dirty.add(p.key)

    def _before_run(self, p: PipelineModel, *, new_checkpoint: bool = False) -> None:
        """Before a storing try of an evicted consumer: where it stores nothing, it plans from
        `starting_offsets` (an earliest one owes no report of what retention took there; a latest
        one owes nothing published before this try, `_placed_again`). A drain starts there only on
        a new checkpoint (`new_checkpoint`): a kept one says where it stands."""
        if not self.config.evictable_records:
            return
        self._observe_records()
        if not p.evicted or not self.model.target_exists(p.target):
            return
        stored = self._stored(p)
        check_watermarks(self.model, p, stored)
        unplaced = {self.model.part_of(s) for s, v in stored.items() if v is None}
        self._unplaced[p.key] = unplaced
        if p.starting == "earliest" and (p.engine != "drain" or new_checkpoint):
            lost = [self.model.messages[b] for b in p.lost]
            forgotten = [m for m in lost if (m.stream, m.incarnation) in unplaced]
            self.model.excuse(p, forgotten)
            p.lost.difference_update(m.body for m in forgotten)
            STATS["evicted_loss_unreported"] += len(forgotten)

    def _placed_again(self, p: PipelineModel, attempt: Attempt) -> None:
        """A storing try that planned wrote a record: an evicted consumer is placed again, a latest
        one from its tail on the partitions where it stored nothing."""
        p.has_record = True
        if not p.evicted:
            return
        for part in self._unplaced.pop(p.key, set()):
            p.part_boundaries[part] = max(p.part_boundaries.get(part, -1), attempt.started_seq)
        p.evicted = False

    def _reported(self, p: PipelineModel, attempt: Attempt) -> None:
        """A loss the try reported (`DataLossError`, or `data_loss` in its summary) is not silent:
        the messages retention removed in the offsets it names are no longer owed."""
        spans = attempt.lost_spans
        if attempt.data_loss and not spans:  # reported without offsets: every loss of its target
            streams = set(self._target(p).partitions)
            spans = {s: [0, self.model.partitions[s].first] for s in streams if s in self.model.partitions}
        # A partition stream deleted and left so took its messages with it: a report naming what a
        # run had planned there is true (the model no longer knows those messages: no false alarm).
        spans = {
            s: v
            for s, v in spans.items()
            if s not in self.model.partitions or self.model.partitions[s].exists
        }
        if spans:
            named = {m.body for m in self.model.named(spans)}
            # A run from offsets or times the user gave asked for the offsets it reports: what retention
            # removed there is lost to the request, whether or not the consumer owed or had it.
            requested = attempt.kind in ("backfill", "explicit", "timed")
            if not (named if requested else named & (p.lost | p.excused)):
                # Not a silent loss, a false alarm: the consumer had every message the report names
                # (a `DataLossError` then stops its runs until a user acts). Counted and printed.
                STATS["data_loss_false_alarm"] += 1
                rule = self._began[0] if self._began else "final check"
                FALSE_ALARMS.append(f"{p.key} ({attempt.kind} run in {rule}): {attempt.describe()[:400]}")
            excused = self.model.excuse_reported(p, spans)
            STATS["data_loss_reported"] += 1
            STATS["data_loss_messages_excused"] += len(excused)

    def _watermark_run(
        self,
        key: str,
        *,
        fail_after: int | None = None,
        crash: str | None = None,
        late: int = 0,
        cap: int | None = None,
        lenient: bool = False,
    ) -> Attempt | None:
        """A watermark run of pipeline `key` (`cap`: max_messages; `lenient`: fail_on_data_loss=False),
        settled into the model."""
        p = self.model.pipelines[key]
        if not self._may_run(p):
            return None
        hooks = Hooks(fail_after=fail_after)
        if late and self.model.target_exists(p.target):
            hooks.late = lambda: self._publish(p.target, late)
        kw: dict[str, Any] = {} if cap is None else {"kind": "capped", "max_messages": cap}
        if lenient:
            kw["fail_on_data_loss"] = False
        attempt = self._attempt(p, hooks, crash=crash, **kw)
        self._settle(p, attempt, SinkFailure if fail_after is not None else Crash if crash else None, crash)
        return attempt

    def _create(self, name: str) -> None:
        self.ops.create_stream(name)
        if self.ops.tails([name])[name] != 0:
            raise Violation("model", f"{name} was created again but is not empty")
        self.model.create(name)
        target = next(t for t in self.model.targets.values() if name in t.partitions)
        if target.superstream:  # deleting the stream deleted its binding
            self.ops.bind(target.name, name, target.partitions.index(name))
        self._touch(target.key)

    # --------------------------------------------------------------------------- invariants

    @invariant()
    def holds(self) -> None:
        """(a), (b), (c) on every pipeline the last rule touched."""
        try:
            self._holds()
        except BaseException as e:
            FAILURES.append(([*self.trail, "state.holds()"], f"{type(e).__name__}: {e}"))
            raise

    def _holds(self) -> None:
        for key in sorted(self.dirty):
            p = self.model.pipelines[key]
            counts = check_output(self.model, p, self._rows(p))
            if self.model.target_exists(p.target):
                stored = self._stored(p)
                check_watermarks(self.model, p, stored)
                check_coverage(self.model, p, stored, counts)
        self.dirty.clear()
        self.healthy = True
        if self._began is not None:
            SECONDS[self._began[0]] += time.monotonic() - self._began[1]
            self._began = None

    # ----------------------------------------------------------------------------- teardown

    def teardown(self) -> None:
        try:
            if self.healthy and self.config.final:
                self.final_check()
        except BaseException as e:
            FAILURES.append(([*self.trail, "state.teardown()"], f"{type(e).__name__}: {e}"))
            raise
        finally:
            self._cleanup()
            for report in PROGRESS:
                report(self._steps, time.monotonic() - self._created)

    def final_check(self) -> None:
        """(e): every consumer runs cleanly (until a run plans anew), then its output is complete."""
        began = time.monotonic()
        for target in TARGETS:  # data after every fault: what a run skipped would show now
            if self.model.target_exists(target):
                self._publish(target, FINAL_MESSAGES * len(self.model.targets[target].partitions))
        for key in list(self.model.pipelines):
            p = self.model.pipelines[key]
            if not self.model.target_exists(p.target):
                continue
            lenient = False
            tries: list[str] = []  # what each final run did, for a violation's message
            for _ in range(4):  # a resumed run, then one planned anew; retried as an orchestrator would
                attempt = self._watermark_run(key, lenient=lenient)
                tries.append("none" if attempt is None else attempt.describe())
                if attempt is None or (attempt.ok and not attempt.resumed):
                    break
                if attempt.data_loss:  # its user accepts the reported loss: failOnDataLoss=false
                    lenient = True
                    continue
                if not attempt.ok and not attempt.retryable:
                    if self._evicted_conflict(attempt) and self._avoided("evicted-watermark-conflict"):
                        continue  # the next run plans anew from its record (config.KNOWN_BUGS)
                    raise Violation("e", f"a clean final run of {key} failed: {attempt.describe()}")
            if attempt is None:
                continue
            counts = check_output(self.model, p, self._rows(p))
            stored = self._stored(p)
            try:
                check_watermarks(self.model, p, stored)
                check_coverage(self.model, p, stored, counts)
                check_final(self.model, p, counts)
            except Violation as v:
                raise Violation(v.invariant, f"{v.detail}; final runs: {tries}; stored: {stored}") from None
        STATS["final_checks"] += 1
        SECONDS["final_check"] += time.monotonic() - began

    @staticmethod
    def _evicted_conflict(attempt: Attempt) -> bool:
        """A `WatermarkConflictError` whose watermark vanished (the broker dropped it below the
        first offset): config.KNOWN_BUGS["evicted-watermark-conflict"]."""
        return attempt.error_class == "WatermarkConflictError" and "-> None" in str(attempt.error)

    def _rows(self, p: PipelineModel) -> list[Row]:
        """What `p`'s output holds: the function sink's list, or the committed Parquet files."""
        output = self._output(p)
        if p.sink == "iceberg":
            return iceberg_rows(self.iceberg_catalog, str(output))
        return self.rows[p.key] if output is None else parquet_rows(output)

    def _cleanup(self) -> None:
        """Delete the sequence's streams and outputs (idempotent: a regression test's fixture calls it
        again after a failing step)."""
        if self._cleaned:
            return
        self._cleaned = True
        commit_index.COMPACT_EVERY = self._compact_every
        try:
            for key in ("a", "b"):
                self.ops.delete_stream(self.names[key])
            self.ops.delete_super_stream(self.names["ss"], self.model.targets["ss"].partitions)
        finally:
            self.dagster.close()
            shutil.rmtree(self.tmp, ignore_errors=True)
