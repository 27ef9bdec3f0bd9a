"""`rmqs commits expire`: the retention of an exactly-once output's commit history.

Every exactly-once run leaves a commit record in `<output>/_rmqs_commits/`; compaction moves them
out of the listed folder into `_archive/`, so a run's cost does not grow with them, but they are
still stored (one small object per run: 8,760 a year at an hourly schedule). This command deletes
the archived records older than a cutoff, after folding what they said into one snapshot
(`commit_index.expire`): the output's files and their committed ranges stay known, so readers
still see the files and a late retry of an expired run writes nothing again. No broker: it reads
and writes the output folder only (an object store through the AWS environment, as pyarrow does).
"""

from __future__ import annotations

import re
from typing import Annotated

import typer

from pyspark_rmqs.cli.common import JsonOpt, console, fail, print_json

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """`30d`, `12h`, `90m`, `3600s` in seconds (a unit is required: a bare number is ambiguous)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text)
    if m is None:
        raise ValueError(f"--older-than {text!r}: give a number and a unit, e.g. 30d, 12h, 90m, 3600s")
    return float(m.group(1)) * _UNITS[m.group(2)]


def expire_command(
    output: Annotated[
        str,
        typer.Argument(
            help="The exactly-once output folder: a path, or a URI (s3://bucket/prefix: credentials and "
            "endpoint from the AWS environment, AWS_ENDPOINT_URL included)."
        ),
    ],
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than", help="Expire records committed longer ago than this: 30d, 12h, 90m, 3600s."
        ),
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would expire; change nothing (no compaction).")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Delete an exactly-once output's commit records older than a cutoff, keeping what they said."""
    from pyspark_rmqs.runs.outputs import commit_index
    from pyspark_rmqs.runs.outputs.delivery import COMMITS, FileCommits, StoreCommits, local_path
    from pyspark_rmqs.runs.outputs.objectstore import locate

    try:
        seconds = parse_duration(older_than)
    except ValueError as e:
        fail(e)
    root = local_path(output)
    folder: commit_index.RecordFolder
    try:
        folder = FileCommits(output) if root is not None else StoreCommits(locate(output)).folder()
        if not folder.list_names() and not folder.list_names(commit_index.ARCHIVE_DIR):
            fail(f"no commit records under {output}/{COMMITS} (not an exactly-once output?)")
        done = commit_index.expire(folder, seconds, dry_run=dry_run)
    except typer.Exit:
        raise
    except Exception as e:  # a file system's error: one line, as every rmqs command fails
        fail(f"{type(e).__name__}: {e}")
    body = {"output": output, "expired": done.expired, "kept": done.kept, "dry_run": dry_run}
    if as_json:
        print_json(body)
        return
    verb = "would expire" if dry_run else "expired"
    console.print(
        f"{output}: {verb} {done.expired} commit record(s) committed more than {older_than} ago, "
        f"kept {done.kept}; their files and ranges stay in the index (a late retry writes nothing again)",
        highlight=False,
    )
