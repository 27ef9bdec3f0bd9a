"""`rmqs lag`, `rmqs watermark show|set`: look at and move a consumer's watermark; plan, then apply.

A move is computed completely before anything is stored (`plan_move`), so `--dry-run` shows
exactly what `set` would do. Where the next run starts comes from the readers' own resolver
(`runs.steps.plan_read` with `persist=False`, which records nothing); the new watermark is that start
minus one (broker-stored offsets are last processed, DESIGN §6). Applying (`apply_move`) fails when
the watermark changed since it was shown, then clears the recorded plan at the new position (so an
old pending plan can never come back to life), then stores the new watermark.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from pyspark_rmqs.cli.common import (
    EXIT_LAG,
    ConnectionFlags,
    ConsumerOpt,
    JsonOpt,
    StreamOpt,
    SuperOpt,
    YesOpt,
    confirm,
    connected,
    console,
    err,
    print_json,
    show_watermark,
    target,
)
from pyspark_rmqs.core.errors import ConfigurationError, WatermarkConflictError
from pyspark_rmqs.core.target import Target

TO_FORMS = (
    "earliest, latest, an offset (e.g. 1200), an ISO-8601 datetime or offsets JSON like "
    "'{\"orders-0\": 1200}'"
)


@dataclass(frozen=True)
class PartitionMove:
    """One partition stream: the watermark now and after the move (None: nothing stored)."""

    stream: str
    first: int
    tail: int
    current: int | None
    new: int | None
    pending_plan: tuple[int, int] | None = None
    note: str = ""

    @staticmethod
    def _next(first: int, stored: int | None) -> int:
        return first if stored is None else max(stored + 1, first)

    @property
    def lag_before(self) -> int:
        return max(0, self.tail - self._next(self.first, self.current))

    @property
    def lag_after(self) -> int:
        return max(0, self.tail - self._next(self.first, self.new))

    @property
    def change(self) -> str:
        if self.new == self.current:
            return "unchanged"
        if self.current is None or (self.new is not None and self.new > self.current):
            return "forward"
        return "backward"

    def to_dict(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "first": self.first,
            "tail": self.tail,
            "current": self.current,
            "new": self.new,
            "change": self.change,
            "lag_before": self.lag_before,
            "lag_after": self.lag_after,
            "pending_plan": _plan_dict(self.pending_plan),
            "note": self.note or None,
        }


@dataclass(frozen=True)
class Move:
    target: str
    superstream: bool
    consumer: str
    to: str
    partitions: tuple[PartitionMove, ...]

    @property
    def changed(self) -> dict[str, int]:
        return {p.stream: p.new for p in self.partitions if p.change != "unchanged" and p.new is not None}

    @property
    def backwards(self) -> list[str]:
        return [p.stream for p in self.partitions if p.change == "backward"]

    def to_dict(self, *, dry_run: bool, applied: bool) -> dict[str, Any]:
        return {
            "target": self.target,
            "superstream": self.superstream,
            "consumer": self.consumer,
            "to": self.to,
            "dry_run": dry_run,
            "applied": applied,
            "total_lag_before": sum(p.lag_before for p in self.partitions),
            "total_lag_after": sum(p.lag_after for p in self.partitions),
            "partitions": [p.to_dict() for p in self.partitions],
        }


def _plan_dict(plan: tuple[int, int] | None) -> dict[str, int] | None:
    return None if plan is None else {"start": plan[0], "end": plan[1]}


def parse_to(text: str, partitions: list[str]) -> tuple[Any, set[str]]:
    """`--to` as a reader position and the partition streams it moves (JSON names only its own)."""
    from pyspark_rmqs.core import offsets as off

    value = text.strip()
    if value in ("earliest", "latest"):
        return value, set(partitions)
    if re.fullmatch(r"\d+", value):
        n = int(value)
        return {p: n for p in partitions}, set(partitions)
    if value.startswith("{"):
        given = off.offsets_from_json(value, "--to")
        unknown = sorted(set(given) - set(partitions))
        if unknown:
            raise ConfigurationError(
                f"--to names {', '.join(repr(u) for u in unknown)}, not a partition stream of the target "
                f"(its partition streams: {', '.join(partitions)})"
            )
        return dict(given), set(given)
    when = parse_datetime(value)
    if when is None:
        raise ConfigurationError(f"--to must be {TO_FORMS}; got {text!r}")
    return when, set(partitions)


def parse_datetime(text: str) -> datetime | None:
    """An ISO-8601 datetime ('Z' accepted; without a time zone it is UTC), or None."""
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def plan_move(conn: Any, consumer: str, to: str, t: Target) -> Move:
    """Everything `watermark set` would change, computed from the broker now; stores nothing."""
    from pyspark_rmqs.core import offsets as off
    from pyspark_rmqs.runs import steps
    from pyspark_rmqs.runs.lease import check_name
    from pyspark_rmqs.runs.watermarks import watermarks

    check_name(consumer)
    w = watermarks(conn, consumer, **t.kw())
    parts = {p.stream: p for p in w.partitions}
    position, moved = parse_to(to, list(parts))
    notes: dict[str, str] = {}
    if isinstance(position, Mapping):  # explicit offsets: kept within [first, tail] here, said so
        clamped: dict[str, int] = {}
        for s, v in position.items():
            p = parts[s]
            if v in (off.EARLIEST, off.LATEST):
                clamped[s] = v
            elif v < p.first:
                clamped[s] = p.first
                notes[s] = f"offset {v} is before the first offset {p.first} (retention): starts at {p.first}"
            elif v > p.tail:
                clamped[s] = p.tail
                notes[s] = f"offset {v} is past the tail {p.tail}: starts at the tail"
            else:
                clamped[s] = v
        position = clamped
    plan = steps.plan_read(
        conn,
        **t.kw(),
        consumer=consumer,
        start=position,
        end="latest",
        persist=False,
        fail_on_data_loss=False,
    )
    pending = pending_ranges(conn, consumer, w.target)
    out: list[PartitionMove] = []
    impossible: list[str] = []
    for p in w.partitions:
        new: int | None = p.stored
        note = notes.get(p.stream, "")
        if p.stream in moved:
            start = min(plan.start[p.stream], p.tail)
            new = start - 1
            if new < 0:
                if p.stored is None:
                    new = None
                    note = note or "no watermark stored: a run starts at the first offset already"
                else:
                    impossible.append(p.stream)
        out.append(PartitionMove(p.stream, p.first, p.tail, p.stored, new, pending.get(p.stream), note))
    if impossible:
        raise ConfigurationError(
            f"cannot move the watermark of '{consumer}' before offset 0 on {', '.join(impossible)}: RabbitMQ "
            "cannot remove a stored offset, so the lowest watermark is 0 (the next run starts at offset 1). "
            "To read a stream again from its very first message, use a new consumer name"
        )
    return Move(w.target, w.superstream, consumer, to, tuple(out))


def apply_move(conn: Any, move: Move) -> None:
    """Store the move under the consumer's lease: fail if a run holds it or the watermark changed
    since `move` was planned; settle an unfinished run record (it will not be retried); store."""
    from pyspark_rmqs.runs import record as run_record
    from pyspark_rmqs.runs.lease import acquire
    from pyspark_rmqs.runs.watermarks import store_watermarks, watermarks

    changed = move.changed
    if not changed:
        return
    seen = {p.stream: p.current for p in move.partitions}
    key = run_record.run_key(move.consumer, move.target)
    what = f"consumer '{move.consumer}' on '{move.target}'"
    with acquire(conn, run_record.RUNS_STREAM, key, wait_s=5.0, what=what) as lease:
        now = watermarks(conn, move.consumer, **Target(move.target, move.superstream).kw())
        current = now.stored_offsets()
        moved = {s: (seen[s], current.get(s)) for s in changed if current.get(s) != seen[s]}
        if moved:
            where = ", ".join(f"'{s}': {a} -> {b}" for s, (a, b) in sorted(moved.items()))
            raise WatermarkConflictError(
                f"the watermark of consumer '{move.consumer}' changed since it was read ({where}): a run "
                "stored it. Nothing was changed; stop the pipelines of this consumer and try again"
            )
        record = run_record.latest(conn, move.consumer, move.target, lease=lease)
        if record is not None and not record.done:
            run_record.write(conn, record.abandoned(), lease=lease)
        lease.keep("the watermarks")  # a lease lost meanwhile: taken back, or nothing is stored
        store_watermarks(conn, move.consumer, changed, allow_backwards=True)
        # A record of where the consumer now stands, as a run's: the broker forgets a stored offset
        # that retention left below the first offset, and the next run must still know where it
        # stood (and report what retention took from it) instead of starting as a new consumer.
        after = {**{s: v for s, v in current.items() if v is not None}, **changed}
        if after:
            ranges = {s: (v + 1, v + 1) for s, v in after.items()}
            placed = run_record.placed(
                conn, move.consumer, move.target, move.superstream, ranges, current, "rmqs watermark set"
            )
            run_record.write(conn, placed, lease=lease)


def pending_ranges(conn: Any, consumer: str, target: str) -> dict[str, tuple[int, int]]:
    """The ranges of the consumer's unfinished run (its record), which its next try reads again."""
    from pyspark_rmqs.runs import record as run_record

    record = run_record.latest(conn, consumer, target)
    if record is None or record.done:
        return {}
    return dict(run_record.ranges_of(record))


def show(conn: Any, consumer: str, t: Target) -> dict[str, Any]:
    """`watermark show` as data: per partition the watermark, lag and any pending plan."""
    from pyspark_rmqs.runs.lease import check_name
    from pyspark_rmqs.runs.watermarks import watermarks

    check_name(consumer)
    w = watermarks(conn, consumer, **t.kw())
    pending = pending_ranges(conn, consumer, w.target)
    return {
        "target": w.target,
        "superstream": w.superstream,
        "consumer": consumer,
        "total_lag": w.total_lag,
        "partitions": [
            {
                "stream": p.stream,
                "first": p.first,
                "tail": p.tail,
                "watermark": p.stored,
                "next_offset": p.next_offset,
                "lag": p.lag,
                "pending_plan": _plan_dict(pending.get(p.stream)),
            }
            for p in w.partitions
        ],
    }


# ------------------------------------------------------------------------------------ commands


@connected
def lag_command(
    consumer: ConsumerOpt,
    stream: StreamOpt = None,
    superstream: SuperOpt = None,
    max_lag: Annotated[
        int | None,
        typer.Option(
            "--max-lag",
            min=0,
            help=f"Exit {EXIT_LAG} when the total lag is above N, 0 at or below it (cron, monitoring).",
        ),
    ] = None,
    as_json: JsonOpt = False,
    *,
    conn: ConnectionFlags,
) -> None:
    """Per partition: first offset, tail, watermark (stored offset) and lag of a consumer."""
    from pyspark_rmqs.runs.watermarks import watermarks

    w = watermarks(conn.connect(), consumer, **target(stream, superstream).kw())
    over = max_lag is not None and w.total_lag > max_lag
    if as_json:
        print_json({**w.to_dict(), "max_lag": max_lag, "over_max_lag": over})
    else:
        table = Table(title=f"lag of '{consumer}' on {w.target}")
        for col in ("partition", "first", "tail", "watermark", "lag"):
            table.add_column(col, justify="left" if col == "partition" else "right")
        for p in w.partitions:
            table.add_row(p.stream, str(p.first), str(p.tail), show_watermark(p.stored), str(p.lag))
        table.add_row("total", "", "", "", str(w.total_lag))
        console.print(table)
    if over:
        err.print(f"rmqs: total lag {w.total_lag} of '{consumer}' on {w.target} is above --max-lag {max_lag}")
        raise typer.Exit(EXIT_LAG)


@connected
def show_command(
    consumer: ConsumerOpt,
    stream: StreamOpt = None,
    superstream: SuperOpt = None,
    as_json: JsonOpt = False,
    *,
    conn: ConnectionFlags,
) -> None:
    """Per partition: the watermark, where the next run starts, lag, and any pending run plan."""
    data = show(conn.connect(), consumer, target(stream, superstream))
    if as_json:
        print_json(data)
        return
    table = Table(title=f"watermark of '{consumer}' on {data['target']}")
    for col in ("partition", "first", "tail", "watermark", "next", "lag", "pending plan"):
        table.add_column(col, justify="left" if col in ("partition", "pending plan") else "right")
    for p in data["partitions"]:
        plan = p["pending_plan"]
        table.add_row(
            p["stream"],
            str(p["first"]),
            str(p["tail"]),
            show_watermark(p["watermark"]),
            str(p["next_offset"]),
            str(p["lag"]),
            f"[{plan['start']}, {plan['end']})" if plan else "-",
        )
    table.add_row("total", "", "", "", "", str(data["total_lag"]), "")
    console.print(table)
    if any(p["pending_plan"] for p in data["partitions"]):
        console.print("A pending plan is a run that planned but did not finish: its retry reads exactly it.")


@connected
def set_command(
    consumer: ConsumerOpt,
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="Where the next run starts: earliest, latest, an offset, an ISO-8601 datetime "
            '(UTC if no zone) or offsets JSON like {"orders-0": 1200} (only the partitions named).',
        ),
    ],
    stream: StreamOpt = None,
    superstream: SuperOpt = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Show the current and new watermark per partition; change nothing."),
    ] = False,
    yes: YesOpt = False,
    as_json: JsonOpt = False,
    *,
    conn: ConnectionFlags,
) -> None:
    """Move a consumer's watermark (backwards too, shown as such); the watermark is start - 1."""
    c = conn.connect()
    move = plan_move(c, consumer, to, target(stream, superstream))
    changed = move.changed
    if not as_json:
        _print_move(move, dry_run)
    if dry_run or not changed:
        if as_json:
            print_json(move.to_dict(dry_run=dry_run, applied=False))
        elif dry_run:
            console.print("dry run: nothing was changed")
        else:
            console.print("nothing to change")
        return
    back = f" ({len(move.backwards)} partition(s) BACKWARDS: their messages will be read again)"
    confirm(
        f"Move the watermark of '{consumer}' on {len(changed)} partition(s) of {move.target}"
        f"{back if move.backwards else ''}?",
        yes,
    )
    apply_move(c, move)
    if as_json:
        print_json(move.to_dict(dry_run=False, applied=True))
    else:
        console.print(f"watermark of '{consumer}' moved on {len(changed)} partition(s) of {move.target}")


def _print_move(move: Any, dry_run: bool) -> None:
    title = f"{'dry run: ' if dry_run else ''}watermark of '{move.consumer}' on {move.target} -> {move.to}"
    table = Table(title=title)
    for col in ("partition", "watermark", "new", "change", "lag", "lag after"):
        table.add_column(col, justify="left" if col in ("partition", "change") else "right")
    notes: list[str] = []
    for p in move.partitions:
        change = p.change.upper() if p.change == "backward" else p.change
        table.add_row(
            p.stream,
            show_watermark(p.current),
            show_watermark(p.new),
            change,
            str(p.lag_before),
            str(p.lag_after),
        )
        if p.note:
            notes.append(f"{p.stream}: {p.note}")
        if p.pending_plan and p.change != "unchanged":
            start, end = p.pending_plan
            notes.append(
                f"{p.stream}: pending plan [{start}, {end}) dropped (a failed run will not retry it)"
            )
        if p.change == "backward":
            notes.append(
                f"{p.stream}: BACKWARD by {p.current - p.new}: those messages will be read again "
                "(exactly-once file outputs skip the offsets they already hold)"
            )
    before = sum(p.lag_before for p in move.partitions)
    after = sum(p.lag_after for p in move.partitions)
    table.add_row("total", "", "", "", str(before), str(after))
    console.print(table)
    for note in notes:
        console.print(note, markup=False, highlight=False)
