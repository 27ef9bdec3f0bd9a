"""Which incarnation of each stream an AvailableNow drain's checkpoint read, so that a stream deleted
and created again is not resumed at the old stream's offsets.

A Structured Streaming checkpoint holds the next offset per partition stream and nothing about which
stream that was. A stream deleted and created again under the same name starts again at offset 0;
a drain on the old checkpoint asks the new stream for offsets from the old one's end: nothing while
the new stream is shorter (its messages wait unread), then everything after the old end, so its
first messages are in no output while the consumer's watermark moves past them (found by counting:
100 read, the stream re-created, 630 published, 530 delivered, lag 0, no error).

rmqs's streams carry an identity (`runs.incarnation`: a marker stored in the stream itself, absent
from a re-created one). The drain keeps the markers of the streams its checkpoint read in
`<checkpoint>/rmqs_incarnations.json` (Spark ignores files it does not own there), checked before
the query starts and written again after it: a recorded marker that no longer matches refuses the
drain before anything is read, naming the stream and what to do. Only rmqs's drains keep the
file; a query a user starts directly has the source's own check (a tail below the checkpoint's
offset) and no more.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pyspark_rmqs.core.errors import ConfigurationError
from pyspark_rmqs.options import ConnectionOptions
from pyspark_rmqs.runs.incarnation import UNMARKED, incarnations, same
from pyspark_rmqs.runs.outputs.delivery import write_atomically
from pyspark_rmqs.runs.outputs.objectstore import Location, locate

log = logging.getLogger(__name__)

FILE = "rmqs_incarnations.json"


@dataclass
class Recorded:
    """The checkpoint's folder and the markers recorded there (what `record` adds to after the drain)."""

    where: Location
    markers: dict[str, int]


def check_and_record(conn: ConnectionOptions, checkpoint: str, streams: Sequence[str]) -> Recorded | None:
    """Refuse a drain whose checkpoint read another incarnation of one of `streams`; record the
    markers of the streams it reads now (marking streams that hold messages). None when the
    checkpoint's folder cannot be opened here (the check is skipped, with a warning)."""
    where = _where(checkpoint)
    if where is None:
        return None
    recorded = _read(where)
    current = incarnations(conn, streams, mark=True)
    changed = sorted(s for s, m in recorded.items() if s in current and not same(m, current[s]))
    if changed:
        raise ConfigurationError(
            f"checkpoint_location '{checkpoint}' read {', '.join(repr(s) for s in changed)} before "
            f"{'it was' if len(changed) == 1 else 'they were'} deleted and created again: its offsets are "
            "the old stream's, and the drain would skip the new stream's first messages. Nothing was "
            "read. Drain the new stream with a new checkpoint_location and a new output_path: the new "
            "checkpoint starts at the consumer's stored offsets, and at startingOffsets on a stream where "
            "it stored none"
        )
    return Recorded(where, _record(where, recorded, current))


def record(conn: ConnectionOptions, recorded: Recorded | None, streams: Sequence[str]) -> None:
    """After a drain: the markers of the streams it read (a stream empty before it may hold
    messages now, and be marked), added to what `check_and_record` recorded."""
    if recorded is not None:
        _record(recorded.where, recorded.markers, incarnations(conn, streams, mark=True))


def _record(where: Location, recorded: dict[str, int], current: dict[str, int]) -> dict[str, int]:
    """`recorded` with the markers of `current` merged in, written when that changed anything."""
    merged = dict(recorded)
    for s, marker in current.items():
        if marker != UNMARKED or s not in merged:
            merged[s] = marker
    if merged == recorded:
        return merged
    # Whole or absent (a lost write only means the next drain records again): locally the atomic
    # write of the commit records, on an object store one PUT.
    body = json.dumps(merged, sort_keys=True).encode()
    if where.local:
        write_atomically(Path(where.path(FILE)), body)
    else:
        with where.fs.open_output_stream(where.path(FILE)) as out:
            out.write(body)
    return merged


def _read(where: Location) -> dict[str, int]:
    try:
        with where.fs.open_input_stream(where.path(FILE)) as f:
            found = json.loads(f.read())
    except FileNotFoundError:
        return {}
    return {str(s): int(m) for s, m in found.items()}


def _where(checkpoint: str) -> Location | None:
    try:
        return locate(checkpoint)
    except (ConfigurationError, OSError) as e:
        log.warning(
            "cannot open checkpoint_location here to record which stream incarnations it read (%s): a "
            "stream deleted and created again would be resumed at the old stream's offsets",
            type(e).__name__,
        )
        return None
