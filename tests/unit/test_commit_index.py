"""The commit records' index (pyspark_rmqs.runs.outputs.commit_index, issue 47): a run and a reader
read O(1) records whatever the history, and the index never hides a commit.

A generator of commit histories (consumers, streams, incarnations, ranges) interleaved with what can
go wrong with an index (deleted, stale after a compaction raced another, never written because the
writer died after its record, unreadable) compares `committed_spans` and `committed_files` after
every step with an oracle that reads every record raw.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyspark_rmqs.runs.incarnation import UNMARKED
from pyspark_rmqs.runs.incarnation import same as same_incarnation
from pyspark_rmqs.runs.outputs import commit_index
from pyspark_rmqs.runs.outputs.committed import committed_files
from pyspark_rmqs.runs.outputs.delivery import COMMITS, FileCommits, RunToken

CONSUMERS = ("c1", "c2", None)
STREAMS = ("s1", "s2")


def oracle_spans(root: Path, token: RunToken) -> dict[str, list[tuple[int, int]]]:
    """Every record read raw, as the code did before the index."""
    found: dict[str, list[tuple[int, int]]] = {}
    for path in (root / COMMITS).glob("*.json"):
        record = json.loads(path.read_text())
        if record.get("consumer") != token.consumer:
            continue
        incs = record.get("incarnations") or {}
        for stream, (lo, hi) in token.ranges.items():
            span = record["ranges"].get(stream)
            if span is None:
                continue
            theirs, ours = int(incs.get(stream) or UNMARKED), int(token.incarnations.get(stream) or UNMARKED)
            if not same_incarnation(theirs, ours):
                continue
            a, b = max(lo, span[0]), min(hi, span[1])
            if a < b:
                found.setdefault(stream, []).append((a, b))
    return {s: _merge(v) for s, v in found.items()}


def oracle_files(root: Path) -> list[str]:
    files = []
    for path in (root / COMMITS).glob("*.json"):
        files += [str(root / f) for f in json.loads(path.read_text())["files"]]
    return sorted(set(files))


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


tokens = st.builds(
    lambda consumer, ranges, incs: RunToken(consumer, ranges, incs),
    st.sampled_from(CONSUMERS),
    st.dictionaries(
        st.sampled_from(STREAMS),
        st.tuples(st.integers(0, 60), st.integers(0, 30)).map(lambda t: (t[0], t[0] + t[1])),
        min_size=1,
    ),
    st.dictionaries(st.sampled_from(STREAMS), st.sampled_from((0, 5, 9))),
)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("commit"), tokens),
        st.tuples(st.just("commit_no_compaction"), tokens),  # the writer died after its record
        st.tuples(st.just("drop_index"), st.none()),
        st.tuples(st.just("stale_index"), st.none()),  # another compaction's older view won the race
        st.tuples(st.just("garbage_index"), st.none()),
        st.tuples(st.just("compact_now"), st.none()),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=steps, probe=tokens)
def test_the_index_answers_as_every_record_read_raw(
    tmp_path_factory: Any, history: list[Any], probe: RunToken
) -> None:
    root = tmp_path_factory.mktemp("out")
    commits = FileCommits(str(root))
    stale: bytes | None = None
    index = root / COMMITS / commit_index.INDEX_DIR / commit_index.INDEX
    for i, (op, token) in enumerate(history):
        if op in ("commit", "commit_no_compaction") and commits.record(token) is None:  # as runs do
            files = [f"rmqs_run={token.value}/part-{i}.parquet"]
            if op == "commit":
                commits.commit(token, files, 1, 1)
            else:
                commit_index_every, commit_index.COMPACT_EVERY = commit_index.COMPACT_EVERY, 10**9
                try:
                    commits.commit(token, files, 1, 1)
                finally:
                    commit_index.COMPACT_EVERY = commit_index_every
        elif op == "drop_index" and index.exists():
            index.unlink()
        elif op == "stale_index" and stale is not None:
            commits.write_index(stale)
        elif op == "garbage_index" and index.exists():
            index.write_text('{"version": 1, "tokens": [')
        elif op == "compact_now":
            commit_index.compact(commits, every=1)
        if index.exists():
            stale = stale or index.read_bytes()
        for t in (probe, token) if token is not None else (probe,):
            assert commits.committed_spans(t) == oracle_spans(root, t), (op, t)
        assert committed_files(str(root)) == oracle_files(root), op


class CountingFolder(FileCommits):
    """FileCommits counting the records it reads raw."""

    reads = 0

    def read_record(self, name: str) -> dict[str, Any] | None:
        CountingFolder.reads += 1
        return super().read_record(name)


def test_a_run_reads_fewer_records_than_the_compaction_interval_whatever_the_history(tmp_path: Path) -> None:
    commits = CountingFolder(str(tmp_path))
    for i in range(1000):
        commits.commit(RunToken("c", {"s": (i * 10, i * 10 + 10)}), [f"f{i}.parquet"], 10, 1)
    CountingFolder.reads = 0
    probe = RunToken("c", {"s": (9_990, 10_020)})
    assert commits.committed_spans(probe) == {"s": [(9_990, 10_000)]}
    assert CountingFolder.reads < commit_index.COMPACT_EVERY, CountingFolder.reads
    assert len(committed_files(str(tmp_path))) == 1000
    # The index is a cache: without it, the same answer from the records.
    (tmp_path / COMMITS / commit_index.INDEX_DIR / commit_index.INDEX).unlink()
    CountingFolder.reads = 0
    assert commits.committed_spans(probe) == {"s": [(9_990, 10_000)]}
    assert CountingFolder.reads == 1000
    assert os.listdir(tmp_path / COMMITS / commit_index.INDEX_DIR) == []
