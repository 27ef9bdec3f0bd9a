"""The operation alphabet: user operations and faults as the rules of the campaign's state machine.

Every rule goes through a public entry point (the Airflow operator, a Dagster asset, rmqs's CLI,
rmqs's producer, the broker's management API). A rule that does not apply to the current state
(publishing to a deleted stream, an explicit-offset run of a Dagster asset) does nothing, so
shrinking drops it. `harness.CampaignBase` holds the streams, consumers, model and invariants.

Hypothesis prints a failing sequence as calls on this class (`state.run(pipeline='c2@a', ...)`):
test_regressions.py replays such sequences as plain tests.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule
from typer.testing import CliRunner

from pyspark_rmqs.cli import app as cli
from pyspark_rmqs.runs.record import run_key
from tests.campaign.config import CampaignConfig
from tests.campaign.faults import CRASH_POINTS, Crash, Hooks, SinkFailure, lease_wait, sink_hooks
from tests.campaign.harness import AIRFLOW_PIPELINES, FAILURES, PIPELINES, STATS, STREAM_KEYS, TARGETS
from tests.campaign.invariants import Violation, check_backfill_stored_nothing, check_failure
from tests.campaign.record_rules import RecordRules
from tests.campaign.runs import Attempt, Row, execute

LATE_MESSAGES = 7  # published from inside a run's sink
LEASE_WAIT_S = 0.5  # how long the second of two concurrent runs waits for the consumer name
SET_TO = ("latest", "earliest", "quarter", "half")  # where `rmqs watermark set --to` moves it


class CampaignMachine(RecordRules):
    """The rules; one instance is one sequence on its own streams (see harness.py); the rules on
    retention and time positions are in retention_time.py, real process kills in killed.py, the
    Spark consumer's in spark_rules.py, the drain consumer's in drain_rules.py, broker restarts in
    broker_faults.py, produce runs in produce_rules.py, Dagster's
    partitioned assets in dagster_rules.py, sensors in sensor_rules.py, run records removed by
    retention in record_rules.py."""

    # -------------------------------------------------------------------------------- rules

    @rule(to=st.sampled_from(TARGETS), n=st.integers(1, 50))
    def publish(self, to: str, n: int) -> None:
        """Publish n messages to a stream or super stream (keyed, hash routing)."""
        if not self._step("publish"):
            return
        if not self.model.target_exists(to):
            return self._skip("publish-to-missing")
        self._publish(to, n)

    @rule(n=st.integers(1, 20))
    def publish_everywhere(self, n: int) -> None:
        """New data on every target at once (a busy hour)."""
        if not self._step("publish_everywhere"):
            return
        for target in TARGETS:
            if self.model.target_exists(target):
                self._publish(target, n)

    @rule(pipeline=st.sampled_from(PIPELINES))
    def run(self, pipeline: str) -> None:
        """A watermark run (the scheduled task, the materialization)."""
        if self._step("run"):
            self._watermark_run(pipeline)

    @rule(pipeline=st.sampled_from(AIRFLOW_PIPELINES), cap=st.integers(1, 30))
    def run_capped(self, pipeline: str, cap: int) -> None:
        """A watermark run reading at most `cap` messages (`max_messages`, split by backlog)."""
        if self._step("run_capped"):
            self._watermark_run(pipeline, cap=cap)

    @rule(pipeline=st.sampled_from(PIPELINES))
    def run_with_late_data(self, pipeline: str) -> None:
        """A watermark run while new messages arrive: they are published from inside its sink."""
        if self._step("run_with_late_data"):
            self._watermark_run(pipeline, late=LATE_MESSAGES)

    @rule(
        pipeline=st.sampled_from(PIPELINES),
        after=st.integers(0, 1),
        late=st.sampled_from((0, 0, LATE_MESSAGES)),
        retry=st.booleans(),
    )
    def run_failing_sink(self, pipeline: str, after: int, late: int, retry: bool) -> None:
        """A watermark run whose sink fails after `after` batches; optionally retried at once."""
        if not self._step("run_failing_sink"):
            return
        first = self._watermark_run(pipeline, fail_after=after, late=late)
        if retry and first is not None and not first.ok:
            self._watermark_run(pipeline)

    @rule(pipeline=st.sampled_from(PIPELINES), point=st.sampled_from(CRASH_POINTS), retry=st.booleans())
    def run_crashing(self, pipeline: str, point: str, retry: bool) -> None:
        """A watermark run whose process dies after its sink, at `point`; optionally retried at once."""
        if not self._step("run_crashing"):
            return
        first = self._watermark_run(pipeline, crash=point)
        if retry and first is not None and not first.ok:
            self._watermark_run(pipeline)

    @rule(stream=st.sampled_from(STREAM_KEYS))
    def recreate(self, stream: str) -> None:
        """Delete a stream (or a super stream's partition) and create it again: a new incarnation."""
        if not self._step("recreate"):
            return
        name = self._stream(stream)
        if name is None:
            return self._skip("recreate-unbound-partition")
        if self.model.partitions[name].exists:
            self.ops.delete_stream(name)
            self.model.delete(name)
        self._create(name)

    @rule(stream=st.sampled_from(("a", "b")))
    def delete_or_create(self, stream: str) -> None:
        """Delete a stream and leave it deleted for a while (runs on it then fail typed), or create
        a deleted one again (a new incarnation)."""
        if not self._step("delete_or_create"):
            return
        name = self.names[stream]
        if not self.model.partitions[name].exists:
            return self._create(name)
        self.ops.delete_stream(name)
        self.model.delete(name)
        self._touch(stream)

    @precondition(lambda self: len(self.model.targets["ss"].partitions) == 2)
    @rule()
    def bind_partition(self) -> None:
        """Bind a third partition stream to the super stream (management API, as an operator would)."""
        if not self._step("bind_partition"):
            return
        ran = [p for p in self.model.pipelines_of("ss") if p.starting == "latest" and p.boundary is not None]
        if ran and self._avoided("latest-new-partition"):
            return
        ss = self.names["ss"]
        name = f"{ss}-2"
        self.ops.create_stream(name)
        self.ops.bind(ss, name, 2)
        self.model.add_partition("ss", name)
        if self.ops.partitions(ss) != self.model.targets["ss"].partitions:
            raise Violation("model", f"{ss} lists {self.ops.partitions(ss)} after binding {name}")
        self._touch("ss")

    @precondition(lambda self: len(self.model.targets["ss"].partitions) == 3)
    @rule()
    def drop_partition(self) -> None:
        """Delete the third partition stream of the super stream and leave it deleted (its binding
        goes with it: producers route over two again); `bind_partition` may bind a new one later.
        Runs go on over the partitions left; one resuming a record that planned the deleted one
        reports its range lost."""
        if not self._step("drop_partition"):
            return
        ss = self.names["ss"]
        name = f"{ss}-2"
        self.ops.delete_stream(name)
        self.model.drop_partition("ss", name)
        if self.ops.partitions(ss) != self.model.targets["ss"].partitions:
            raise Violation("model", f"{ss} lists {self.ops.partitions(ss)} after deleting {name}")
        self._touch("ss")

    @rule(pipeline=st.sampled_from(PIPELINES), quarter=st.integers(0, 4))
    def backfill(self, pipeline: str, quarter: int) -> None:
        """A backfill over explicit offsets (from a quarter of each tail to the tail): stores nothing."""
        if not self._step("backfill"):
            return
        p = self.model.pipelines[pipeline]
        t = self._target(p)
        if not self.model.target_exists(p.target):
            return self._skip("backfill-missing")
        tails = self.ops.tails(t.partitions)
        start = {s: tails[s] * quarter // 4 for s in t.partitions}
        before = self._stored(p)
        rows: list[Row] = []
        hooks = Hooks()
        with sink_hooks(hooks):
            attempt = execute(
                t,
                p,
                output=None,
                hooks=hooks,
                rows=rows,
                started_seq=self.model.seq,
                kind="backfill",
                start=start,
                end=dict(tails),
            )
        STATS[f"outcome:backfill:{attempt.label}"] += 1
        check_failure(p, attempt, None)
        check_backfill_stored_nothing(p, before, self._stored(p))
        first = {s: self.model.partitions[s].first for s in t.partitions}
        lost = {s for s in t.partitions if start[s] < first[s] and tails[s] > start[s]}
        if attempt.data_loss and not lost:
            raise Violation(
                "d", f"a backfill of {p.key} over {start}..{tails} reported a loss: {attempt.describe()}"
            )
        if not attempt.ok:
            return
        if lost:  # failOnDataLoss (the default): retention's removals in the range are reported
            raise Violation(
                "a",
                f"a backfill of {p.key} over {start}..{tails} succeeded, though retention removed "
                f"offsets below {first} of it ({attempt.describe()})",
            )
        assert attempt.summary is not None
        if attempt.summary.get("mode") != "backfill" or attempt.summary.get("watermark_stored"):
            raise Violation("c", f"a backfill of {p.key} ran as {attempt.summary.get('mode')}, stored")
        wanted = {
            m.body
            for s in t.partitions
            for m in self.model.partitions[s].messages
            if m.offset is not None and max(start[s], first[s]) <= m.offset < tails[s]
        }
        got = Counter(body for body, _, _ in rows)
        if set(got) != wanted or any(n > 1 for n in got.values()):
            foreign, missing = len(set(got) - wanted), len(wanted - set(got))
            raise Violation(
                "a",
                f"a backfill of {p.key} over {start}..{tails} read {len(got)} messages, "
                f"{len(wanted)} expected ({foreign} foreign, {missing} missing)",
            )

    @rule(
        pipeline=st.sampled_from(AIRFLOW_PIPELINES),
        quarter=st.integers(0, 4),
        fault=st.sampled_from((None, None, "sink", *CRASH_POINTS)),
        fresh=st.sampled_from((0, 5)),
    )
    def explicit_run(self, pipeline: str, quarter: int, fault: str | None, fresh: int) -> None:
        """A run from explicit offsets that stores its watermark (`store_watermark=True`), into the
        consumer's own output; after a fault, `fresh` messages arrive and it is retried with the
        same parameters (Airflow's retry of the task)."""
        if not self._step("explicit_run"):
            return
        p = self.model.pipelines[pipeline]
        t = self._target(p)
        if p.engine != "airflow" or not self.model.target_exists(p.target) or not self._may_run(p):
            return self._skip("explicit-not-applicable")  # a Dagster asset runs from its watermark
        tails = self.ops.tails(t.partitions)
        start = {s: tails[s] * quarter // 4 for s in t.partitions}
        stored = self._stored(p)
        # Owed messages between the watermark and the explicit start are skipped on purpose.
        after = {s: -1 if (v := stored.get(s)) is None else v for s in t.partitions}
        skipped = [
            m
            for s in t.partitions
            for m in self.model.partitions[s].messages
            if m.offset is not None and after[s] < m.offset < start[s]
        ]
        self.model.excuse(p, skipped)
        kw: dict[str, Any] = {"kind": "explicit", "start": start, "store_watermark": True}
        crash = fault if fault in CRASH_POINTS else None
        first = self._attempt(p, Hooks(fail_after=0 if fault == "sink" else None), crash=crash, **kw)
        self._settle(p, first, SinkFailure if fault == "sink" else Crash if crash else None, crash)
        if not first.ok:
            if fresh:
                self._publish(p.target, fresh)
            self._settle(p, self._attempt(p, Hooks(), **kw), None)

    @rule(pipeline=st.sampled_from(PIPELINES), n=st.integers(1, 10), close_lease=st.booleans())
    def concurrent_runs(self, pipeline: str, n: int, close_lease: bool) -> None:
        """Two runs of one consumer at once (n new messages first): the first is held inside its
        sink while the second starts; with `close_lease` the first's lease connection is closed
        meanwhile (management API). Without it, only the first delivers; with it, the second may
        deliver while the first is still inside the sink call it began before its lease ended,
        but the first begins no batch after that, and commits nothing (invariant b). For the
        Dagster consumer: two materializations of its asset at once (a second launch while the
        first runs: Dagster's concurrency pools are opt-in)."""
        if not self._step("concurrent_runs"):
            return
        p = self.model.pipelines[pipeline]
        if not self.model.target_exists(p.target) or not self._may_run(p):
            return self._skip("concurrent-not-applicable")
        if close_lease and self._avoided("lease-close"):
            close_lease = False
        self._publish(p.target, n)
        inside, release = threading.Event(), threading.Event()
        first_hooks = Hooks(gate=(inside, release))
        box: dict[str, Attempt] = {}

        def first() -> None:
            box["first"] = self._attempt(p, first_hooks)

        thread = threading.Thread(target=first, name=f"campaign-first-{p.key}", daemon=True)
        thread.start()
        while not inside.wait(0.05) and thread.is_alive():
            pass
        second: Attempt | None = None
        second_hooks = Hooks(watch=first_hooks)
        if inside.is_set():
            if close_lease:
                key = run_key(p.consumer, self._target(p).name)
                STATS["lease_connections_closed"] += self.ops.close_lease_connections(key)
            with lease_wait(LEASE_WAIT_S):
                second = self._attempt(p, second_hooks)
            release.set()
        thread.join(60)
        if thread.is_alive():
            raise Violation("d", f"the first of two runs of {p.key} never finished")
        self._settle(p, box["first"], None)
        if second is not None:
            STATS[f"concurrent:second:{second.label}"] += 1
            if first_hooks.after_overtaken:
                raise Violation(
                    "b",
                    f"the first of two runs of {p.key} began {first_hooks.after_overtaken} batch(es) after "
                    f"its lease ended and the second run delivered (first: {box['first'].describe()}; "
                    f"second: {second.describe()})",
                )
            # A lease that ends while its holder is inside a sink call cannot stop that call: the
            # honest promise (docs/failure-semantics.md) is that the holder begins no batch after it.
            if second_hooks.overlaps and not close_lease:
                raise Violation(
                    "b",
                    f"two runs of {p.key} delivered at once: the second delivered "
                    f"{second_hooks.overlaps} batch(es) while the first was inside its sink "
                    f"(first: {box['first'].describe()}; second: {second.describe()})",
                )
            self._settle(p, second, None)

    @rule(pipeline=st.sampled_from(PIPELINES), to=st.sampled_from(SET_TO))
    def watermark_set(self, pipeline: str, to: str) -> None:
        """`rmqs watermark set --to ... --yes` (the CLI, in process): forwards skips messages on
        purpose, backwards reads them again; either clears a pending plan."""
        if not self._step("watermark_set"):
            return
        p = self.model.pipelines[pipeline]
        t = self._target(p)
        if not self.model.target_exists(p.target):
            return self._skip("set-missing")
        if to in ("quarter", "half"):
            tails = self.ops.tails(t.partitions)
            to = json_offsets({s: tails[s] // (4 if to == "quarter" else 2) for s in t.partitions})
        where = ["--superstream" if t.superstream else "--stream", t.name]
        s = self.ops.settings
        conn = ["--endpoints", f"{s.host}:{s.port}", "--username", s.username, "--password", s.password]
        conn += ["--vhost", s.vhost]
        args = ["watermark", "set", "--consumer", p.consumer, *where, "--to", to, "--yes", "--json", *conn]
        done = CliRunner().invoke(cli.app, args)
        STATS[f"outcome:watermark_set:{done.exit_code}"] += 1
        if done.exception is not None and not isinstance(done.exception, SystemExit):
            raise Violation("d", f"rmqs watermark set crashed: {done.exception!r}\n{done.output[-1000:]}")
        if done.exit_code != 0:  # refused (typed, a message): say why in the stats
            first = re.sub(r"camp-[\w-]+", "<stream>", (done.output.strip().splitlines() or ["?"])[-1])
            STATS[f"noop:watermark_set refused: {first[:60]}"] += 1
            return
        # What the move put behind the watermark was skipped on purpose; the baseline moves with it.
        # The model follows what the command says it stored (`new`), not the broker's stored offsets
        # read back: a watermark set just below the first offset (an offset retention removed,
        # clamped with a note) is forgotten by the broker at its next segment roll, and the run record
        # the command wrote is what places the consumer then.
        moved = json.loads(done.output)["partitions"]
        stored: dict[str, int | None] = {m["stream"]: m["new"] for m in moved}
        if any(wm is not None for wm in stored.values()):
            # It wrote a record too, which places a consumer whose record retention removed again:
            # what the move skips is judged as for any placed consumer (before it, nothing was owed).
            p.has_record, p.evicted = True, False
        counts = Counter(body for body, _, _ in self._rows(p))
        for stream, wm in stored.items():
            if wm is None or not self.model.partitions[stream].exists:
                continue
            self.model.excuse(
                p, [m for m in self.model.owed_at_or_below(p, stream, wm) if not counts[m.body]]
            )
            p.watermarks[self.model.part_of(stream)] = wm
        for stream in t.partitions:  # a partition moved back to nothing stored: no baseline either
            if stored.get(stream) is None:
                p.watermarks.pop(self.model.part_of(stream), None)
        if any(wm is not None for wm in stored.values()):
            # It stored offsets (and a run record): a latest consumer's runs start there from now on,
            # not at the tails as its first run would (what arrives from now on is its to read).
            self.model.start_boundary(p, self.model.seq)
        self.dirty.add(p.key)


def json_offsets(offsets: dict[str, int]) -> str:
    return json.dumps(offsets)


def machine_with(config: CampaignConfig) -> type[CampaignMachine]:
    """A machine class running under `config` (hypothesis instantiates machines without arguments)."""
    return type("CampaignMachine", (CampaignMachine,), {"config": config})


def _traced(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` (a rule), noting its call in the machine's trail and what it raised in FAILURES."""

    @functools.wraps(function)
    def traced(self: CampaignMachine, **kw: Any) -> Any:
        self.trail.append(f"state.{name}({', '.join(f'{k}={v!r}' for k, v in sorted(kw.items()))})")
        try:
            return function(self, **kw)
        except BaseException as e:
            FAILURES.append((list(self.trail), f"{type(e).__name__}: {e}"))
            raise

    return traced


# Every rule records its call and what it raised: when hypothesis's replay of a failure behaves
# differently (the broker's timing: `Flaky...` errors hide the first failure), the runner prints
# the failure as it happened first.
for _cls in CampaignMachine.__mro__:
    for _name, _member in vars(_cls).items():
        _rule = getattr(_member, "hypothesis_stateful_rule", None)
        if _rule is not None and not hasattr(_rule.function, "__wrapped__"):
            object.__setattr__(_rule, "function", _traced(_name, _rule.function))
