"""Where an AvailableNow drain on a new checkpoint starts, and the record of where it ended.

A checkpoint that has read is the source of truth: Spark resumes it and the source reports a gap
retention made below it. A new checkpoint (none yet, or the one a refused drain told its user to
start) begins at the consumer's broker-stored offsets, and at `startingOffsets` on streams with
none. But the broker forgets a stored offset once retention leaves it below the stream's first
offset: the consumer then looks new, and a new checkpoint started at `earliest` silently skipped
what retention took after the consumer's last read (found by counting: 400 drained, 1,000 more
published, retention to 1,013, a new checkpoint read from 1,013 with failOnDataLoss=true, no error).

So a drain keeps a run record of where it ended (`record.placed`), as watermark runs and
`rmqs watermark set` do, and a drain on a new checkpoint plans its start exactly as a watermark run
does (`plan.plan_range`: stored offsets, else the record's ends, new partitions of a consumer that
has run from their start), hands it to the query as explicit starting offsets, and reports what
retention took from there: `DataLossError` before reading, or the summary's `data_loss`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

from pyspark_rmqs.core.target import Target
from pyspark_rmqs.options import ConnectionOptions, SourceOptions
from pyspark_rmqs.runs import record as run_record
from pyspark_rmqs.runs.lease import Lease
from pyspark_rmqs.runs.outputs.objectstore import Location
from pyspark_rmqs.runs.plan import ReadPlan, plan_range

log = logging.getLogger(__name__)

# The `startingOffsets` kinds a watermark run's plan falls back to where a consumer has no position.
_PLANNED_KINDS = ("earliest", "latest")


def is_new(where: Location | None) -> bool:
    """Whether the checkpoint has planned no batch yet (Spark writes `offsets/<batch>` first).

    A folder that cannot be opened here counts as not new: Spark's checkpoint then decides alone."""
    if where is None:
        return False
    from pyarrow.fs import FileSelector, FileType

    found = where.fs.get_file_info(FileSelector(where.path("offsets"), allow_not_found=True))
    return not any(f.type == FileType.File and f.base_name.isdigit() for f in found)


def planned_start(
    conn: ConnectionOptions,
    lease: Lease,
    target: Target,
    consumer: str,
    options: SourceOptions,
) -> ReadPlan | None:
    """For a new checkpoint: the plan of a watermark run of the consumer to the tails, whose `start`
    is where the checkpoint starts and whose `data_loss` is what retention took before it (with
    failOnDataLoss=true, `DataLossError` instead). None where the user chose an explicit start (an
    offset, a time or a JSON map), which the source then applies as it is."""
    if options.starting_offsets not in _PLANNED_KINDS:
        return None
    previous = run_record.latest(conn, consumer, target.name, lease=lease)
    plan = plan_range(
        conn,
        target,
        consumer,
        "watermark",
        "latest",
        None,
        str(options.starting_offsets),
        options.fail_on_data_loss,
        previous,
    )
    if plan.data_loss:
        log.warning("the drain's new checkpoint starts past what retention removed: %s", plan.data_loss)
    return plan


def starting_offsets_option(start: Mapping[str, int]) -> str:
    """`start` as the source's `startingOffsets` JSON (partition stream -> next offset)."""
    return json.dumps(dict(start), sort_keys=True)


def record_end(
    conn: ConnectionOptions,
    lease: Lease,
    target: Target,
    consumer: str,
    start: Mapping[str, int],
    end: Mapping[str, int],
    seen: Mapping[str, int | None],
    pipeline: str | None,
) -> None:
    """A finished record of the drained ranges `[start, end)` (where the consumer now stands)."""
    ranges = {s: (min(start.get(s, v), v), v) for s, v in end.items()}
    if not ranges:
        return
    done = run_record.placed(conn, consumer, target.name, target.is_super, ranges, seen, pipeline or "drain")
    run_record.write(conn, done, lease=lease)
