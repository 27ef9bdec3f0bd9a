"""The faults a run can meet, injected through the seams the suite's own fault tests use.

- A sink that fails after `k` batches (`SinkFailure`, an ordinary exception: Airflow retries it).
- A process dying at a chosen point after the sink (`Crash`, a BaseException nothing on the way
  catches), as tests/airflow/test_run_record.py kills a run inside `steps.store_watermarks_checked`:
  before the record says `delivered`, before any watermark is stored, after the first partition's,
  or before the record says `stored`; or inside the compaction of an exactly-once output's commit
  index, which the run then does whatever its count (`in_compaction`: at its 1st to 6th write,
  delete or move: each in turn, shifted by how many names the folder holds).
- Late data: messages published while the run is inside its sink (after its range was fixed).
- A gate: the sink blocks on its first batch until released, so a second run can start meanwhile.
- A local clock ahead of or behind the broker's (`local_clock`): what a run reads as "now" to decide
  whether a time end has passed (`steps.datetime`; Dagster's windows: `factories.datetime`).

Every patch is process-wide and undone on exit; the Parquet sink's `write` is patched once with a
dispatcher that finds the hooks of the thread calling it, so two runs in two threads each meet
only their own faults.
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import subprocess
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark_rmqs.runs import consume, steps
from pyspark_rmqs.runs import record as run_record
from pyspark_rmqs.runs.outputs import commit_index, delivery
from pyspark_rmqs.runs.outputs.iceberg import IcebergSink
from pyspark_rmqs.runs.watermarks import store_watermarks
from tests.support.folders import FaultyFolder

# How far the run's local clock is from the broker's (ms): a worker's clock two minutes ahead or behind.
CLOCK_SKEWS_MS = (0, 0, -120_000, 120_000)
CRASH_POINTS = ("before_delivered", "before_store", "after_first_store", "before_stored", "in_compaction")
COMPACTION_STEPS = 6  # `in_compaction` stops at one of the compaction's first this many mutations
_COMPACTIONS = itertools.count()  # `in_compaction` draws in this process, in turn
COMPACTION_STOPS: Counter[int] = Counter()  # the mutations `in_compaction` stopped before, by number
GATE_TIMEOUT_S = 30.0


class SinkFailure(Exception):
    """The user's sink failing after some batches (injected)."""


class WorkerKilled(Exception):
    """A Spark Python worker killed under a task (injected; what the query failed with, re-wrapped)."""


class Crash(BaseException):
    """The process dying at a chosen point (injected; a BaseException: nothing on the way catches it)."""


@dataclass
class Hooks:
    """What happens to one run's sink, batch by batch."""

    fail_after: int | None = None  # raise SinkFailure before batch number `fail_after` (0: the first)
    late: Callable[[], None] | None = None  # called once, before the first batch (late data)
    gate: tuple[threading.Event, threading.Event] | None = None  # (inside, release) on the first batch
    batches: int = 0  # batches that reached the sink
    active: bool = False  # inside the sink right now (the gate holds it there)
    watch: Hooks | None = None  # another run of the same consumer: is it inside its sink?
    overlaps: int = 0  # batches this run delivered while `watch` was inside its sink
    overtaken: bool = False  # a run watching this one began delivering
    after_overtaken: int = 0  # batches this run began after that (its lease must stop it first)

    def before(self, batch: Any) -> None:
        """Called before a batch reaches the output; may raise, publish or block."""
        if self.batches == 0 and self.late is not None:
            late, self.late = self.late, None
            late()
        if self.fail_after is not None and self.batches >= self.fail_after:
            raise SinkFailure(f"the sink failed after {self.batches} batch(es) (injected)")
        if self.overtaken:
            self.after_overtaken += 1
        if self.watch is not None:
            self.watch.overtaken = True
            if self.watch.active:
                self.overlaps += 1
        self.active = True
        if self.gate is not None and self.batches == 0:
            inside, release = self.gate
            inside.set()
            if not release.wait(GATE_TIMEOUT_S):
                raise SinkFailure("the gate was never released (the campaign's own timeout)")

    def after(self) -> None:
        self.batches += 1
        self.active = False


_hooks_by_thread: dict[int, Hooks] = {}
# The file and table sinks of the Spark-free path, and their own `write`.
_SINKS: tuple[Any, ...] = (consume.ParquetSink, IcebergSink)
_real_writes = {sink: sink.write for sink in _SINKS}


def _dispatching(real: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    def write(self: Any, batch: Any) -> None:
        hooks = _hooks_by_thread.get(threading.get_ident())
        if hooks is None:
            real(self, batch)
            return
        hooks.before(batch)
        try:
            real(self, batch)
        finally:
            hooks.after()

    return write


@contextlib.contextmanager
def sink_hooks(hooks: Hooks) -> Iterator[Hooks]:
    """`hooks` apply to the Parquet and Iceberg sinks this thread writes through while inside."""
    ident = threading.get_ident()
    _hooks_by_thread[ident] = hooks
    for sink in _SINKS:
        sink.write = _dispatching(_real_writes[sink])
    try:
        yield hooks
    finally:
        _hooks_by_thread.pop(ident, None)
        if not _hooks_by_thread:
            for sink in _SINKS:
                sink.write = _real_writes[sink]


def function_sink(hooks: Hooks, out: list[tuple[bytes, str, int]]) -> Callable[[Any], None]:
    """An `apply_function` appending every row's (body, stream, offset) to `out`, through `hooks`."""

    def sink(batch: Any) -> None:
        hooks.before(batch)
        try:
            rows = zip(
                batch.column("value").to_pylist(),
                batch.column("stream").to_pylist(),
                batch.column("offset").to_pylist(),
                strict=True,
            )
            out.extend((bytes(v), s, int(o)) for v, s, o in rows)
        finally:
            hooks.after()

    return sink


@contextlib.contextmanager
def crash_at(point: str | None) -> Iterator[None]:
    """The run's process dies at `point` (one of CRASH_POINTS; None: no crash)."""
    if point is None:
        yield
        return
    if point not in CRASH_POINTS:
        raise ValueError(f"unknown crash point {point!r}")

    def crash(why: str) -> None:
        raise Crash(f"process killed {why}")

    with stop_at(point, crash):
        yield


@contextlib.contextmanager
def stop_at(point: str, stop: Callable[[str], None]) -> Iterator[None]:
    """`stop(why)` at the protocol step `point` names (a CRASH_POINTS name; others match nothing):
    before the record says `delivered` or `stored`, before any watermark is stored, after the
    first partition's, or partway through a compaction of the commit index (`in_compaction`). A
    `stop` that returns lets the run go on (a paused process resumed); `crash_at` raises,
    `kill_job` holds the process until it is killed."""
    real_advance, real_store = run_record.advance, steps.store_watermarks_checked
    real_compact = delivery._compact_quietly

    def advance(conn: Any, record: Any, state: str, **kw: Any) -> Any:
        before = {"before_delivered": run_record.DELIVERED, "before_stored": run_record.STORED}
        if before.get(point) == state:
            stop(f"before the record says {state}")
        return real_advance(conn, record, state, **kw)

    def store(
        conn: Any,
        consumer: str,
        last_offsets: Mapping[str, int],
        seen: Mapping[str, int | None],
        *,
        resumed: bool = False,
    ) -> dict[str, int]:
        if point == "before_store":
            stop("before storing any watermark")
        if point == "after_first_store" and last_offsets:
            first = sorted(last_offsets)[0]
            store_watermarks(conn, consumer, {first: last_offsets[first]})
            stop(f"after storing the watermark of {first}")
        return real_store(conn, consumer, last_offsets, seen, resumed=resumed)

    def compact_quietly(folder: commit_index.RecordFolder, listed: int | None) -> None:
        if point != "in_compaction":
            return real_compact(folder, listed)
        # now, whatever the count (any count is valid: `expire` compacts at 1), dying partway: at
        # the next mutation in turn, shifted by the folder's state (a process of its own, where
        # the turn is always the first, still stops past the first mutation)
        at = 1 + (next(_COMPACTIONS) + len(folder.list_names())) % COMPACTION_STEPS

        def stop_there(what: str) -> None:
            COMPACTION_STOPS[at] += 1
            stop(f"inside the commit index's compaction, before its {what} (mutation {at})")

        commit_index.compact(FaultyFolder(folder, at, stop_there), every=1)
        return None

    run_record.advance = advance
    steps.store_watermarks_checked = store
    delivery._compact_quietly = compact_quietly
    try:
        yield
    finally:
        run_record.advance = real_advance
        steps.store_watermarks_checked = real_store
        delivery._compact_quietly = real_compact


@contextlib.contextmanager
def lease_wait(seconds: float) -> Iterator[None]:
    """A run waits `seconds` (not 10) for a consumer name another run holds, then fails busy."""
    real = steps.DEFAULT_LEASE_WAIT_S
    steps.DEFAULT_LEASE_WAIT_S = seconds
    try:
        yield
    finally:
        steps.DEFAULT_LEASE_WAIT_S = real


@contextlib.contextmanager
def local_clock(skew_ms: int) -> Iterator[None]:
    """The run's clock `skew_ms` ahead of (positive) or behind the broker's, while inside."""
    if not skew_ms:
        yield
        return
    from datetime import datetime, timedelta, tzinfo

    from dagster_rmqs import factories

    real = steps.datetime

    class Skewed(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> datetime:  # type: ignore[override]
            return real.now(tz) + timedelta(milliseconds=skew_ms)

    steps.datetime = factories.datetime = Skewed  # type: ignore[misc]
    try:
        yield
    finally:
        steps.datetime = factories.datetime = real  # type: ignore[misc]


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[bool]:
    """`folder` read-only for everyone, root included, inside the block: a bind mount of itself,
    remounted read-only, unmounted after. Yields False (and changes nothing) where this process
    may not mount (no CAP_SYS_ADMIN: a container, a user without root)."""
    mount = shutil.which("mount") or "mount"
    if subprocess.run([mount, "--bind", str(folder), str(folder)], capture_output=True).returncode:
        yield False
        return
    try:
        done = subprocess.run([mount, "-o", "remount,bind,ro", str(folder)], capture_output=True)
        yield done.returncode == 0
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True, check=True)
