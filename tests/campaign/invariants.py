"""The invariants, each a function of the model and what the broker and the outputs show.

(a) no silent loss: every message a successful run promised (published before the run planned,
    or below the ends it reports; still readable; owed from where the consumer started) is in the
    consumer's output; and every owed message at or below the consumer's stored watermark is in its
    output (a watermark past an undelivered message is a loss waiting for its next run). A message
    retention removed before such a consumer read it stays owed until a run reports it
    (`DataLossError`, `data_loss`): model.excuse_reported.
(b) an exactly-once (Parquet) output holds each message at most once; outputs hold only messages
    published to their target, at the stream and offset they were published at; two runs of one
    consumer do not deliver at once (machine.concurrent_runs checks that one).
(c) a watermark never moves backwards within one stream incarnation; a backfill moves none.
(d) a failed run raises the injected exception or a typed rmqs error (or Airflow's fail exception
    naming one); an injected exception carries the run's `commit_state`.
(e) after a clean final run of every consumer, an exactly-once output holds every owed message
    exactly once, an at-least-once output at least once.

A violation is an AssertionError naming its invariant, so hypothesis shrinks towards it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from pyspark_rmqs.core.errors import CommitState
from tests.campaign.faults import SinkFailure
from tests.campaign.model import Model, PipelineModel
from tests.campaign.runs import Attempt, Row, is_typed


class Violation(AssertionError):
    """An invariant does not hold; `invariant` is its letter (a-e) or `model` (the harness)."""

    def __init__(self, invariant: str, message: str) -> None:
        super().__init__(f"invariant ({invariant}): {message}")
        self.invariant = invariant
        self.detail = message


def _short(bodies: Sequence[bytes] | set[bytes], limit: int = 8) -> str:
    items = sorted(bodies, key=lambda b: int(b.split(b":")[1]))
    text = ", ".join(b.decode() for b in items[:limit])
    return f"{len(items)} message(s): {text}{', ...' if len(items) > limit else ''}"


def check_output(model: Model, p: PipelineModel, rows: Sequence[Row]) -> Counter[bytes]:
    """(a) promised messages are there, (b) at most once where exactly-once, nothing foreign."""
    counts: Counter[bytes] = Counter(body for body, _, _ in rows)
    partitions = set(model.targets[p.target].partitions) | model.targets[p.target].dropped
    for body, stream, offset in rows:
        m = model.messages.get(body)
        if m is None or m.stream not in partitions:
            raise Violation("b", f"{p.key}'s output holds {body!r}, never published to its target")
        if m.stream != stream or (m.offset is not None and m.offset != offset):
            raise Violation(
                "model", f"{p.key}: {body!r} read at {stream}@{offset}, published at {m.stream}@{m.offset}"
            )
    if p.exactly_once:
        twice = [b for b, n in counts.items() if n > 1]
        if twice:
            raise Violation("b", f"{p.key}'s exactly-once output holds {_short(twice)} more than once")
    missing = {b for b in p.promised if counts[b] == 0 and b not in p.excused}
    if missing:
        raise Violation("a", f"{p.key}: a successful run promised {_short(missing)}, not in its output")
    return counts


def check_coverage(
    model: Model, p: PipelineModel, stored: Mapping[str, int | None], counts: Counter[bytes]
) -> None:
    """(a) every owed message at or below the stored watermark is in the output."""
    for stream, wm in stored.items():
        if wm is None or stream not in model.partitions or not model.partitions[stream].exists:
            continue
        lost = [m.body for m in model.owed_at_or_below(p, stream, wm) if counts[m.body] == 0]
        if lost:
            raise Violation(
                "a",
                f"{p.key}: watermark {wm} on {stream} (incarnation "
                f"{model.partitions[stream].incarnation}) is past {_short(lost)} its output never got",
            )


def check_watermarks(model: Model, p: PipelineModel, stored: Mapping[str, int | None]) -> None:
    """(c) never backwards within an incarnation; remembers the highest seen.

    Except that the broker itself forgets a stored offset below the stream's first offset: every
    new segment starts with a snapshot of the offsets tracked, without those (osiris_tracking;
    `first - 1`, "read everything retention removed", goes too). Such a watermark may vanish at any
    segment roll after a truncation; the consumer's next run then starts from its run record."""
    for stream, wm in stored.items():
        if stream not in model.partitions or not model.partitions[stream].exists:
            continue
        part = model.part_of(stream)
        before = p.watermarks.get(part)
        if before is not None and wm is None and before < model.partitions[stream].first:
            del p.watermarks[part]
            continue
        if before is not None and (wm is None or wm < before):
            raise Violation("c", f"{p.key}: watermark on {stream} moved backwards, {before} -> {wm}")
        if wm is not None:
            p.watermarks[part] = wm


def check_backfill_stored_nothing(
    p: PipelineModel, before: Mapping[str, int | None], after: Mapping[str, int | None]
) -> None:
    """(c) a backfill stores no watermark."""
    if dict(before) != dict(after):
        raise Violation("c", f"a backfill of {p.key} moved its watermarks: {dict(before)} -> {dict(after)}")


# A sink failing is before any commit; a crash after the sink may be reported as any state (an
# at-least-once sink's retry delivers again: `before_commit` is honest there), but reported.
EXPECTED_STATE: dict[type[BaseException], tuple[str, ...]] = {SinkFailure: (CommitState.BEFORE.value,)}


def check_failure(
    p: PipelineModel, attempt: Attempt, injected: type[BaseException] | None, *, needs_state: bool = True
) -> None:
    """(d) the failure is the injected one, with its commit state, or a typed rmqs error."""
    e = attempt.error
    if e is None:
        return
    if injected is not None and (isinstance(e, injected) or attempt.cause == injected.__name__):
        state = getattr(e, "commit_state", None)
        if state is None and needs_state:
            raise Violation(
                "d", f"{p.key}: the injected {type(e).__name__} ({e}) came back without a commit_state"
            )
        allowed = EXPECTED_STATE.get(injected, ())
        if state is not None and allowed and state not in allowed:
            raise Violation(
                "d", f"{p.key}: the injected {type(e).__name__} ({e}) says commit_state {state!r}"
            )
        return
    if not is_typed(e):
        raise Violation("d", f"{p.key}: a {attempt.kind} run failed untyped: {type(e).__name__}: {e}")


def check_final(model: Model, p: PipelineModel, counts: Counter[bytes]) -> None:
    """(e) once every consumer ran cleanly: every owed message, exactly once where exactly-once."""
    owed = model.expected(p)
    missing = [m.body for m in owed if counts[m.body] == 0]
    if missing:
        raise Violation("e", f"{p.key}: after a clean final run its output lacks {_short(missing)}")
    if p.exactly_once:
        twice = [m.body for m in owed if counts[m.body] > 1]
        if twice:
            raise Violation("e", f"{p.key}: after a clean final run it holds {_short(twice)} twice")
