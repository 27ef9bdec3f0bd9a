"""The commit records' index (pyspark_rmqs.runs.outputs.commit_index, issue 47): a run and a reader
list and read O(1) records whatever the history, and the index never hides a commit.

A generator of commit histories (consumers, streams, incarnations, ranges) interleaved with what can
go wrong with the index and the archive (a compaction killed before its index write, after it, in
the middle of the archive moves; two compactions racing with a commit between them; the index
deleted, damaged, an old index object put back; retention expiring records, killed halfway) checks
after every step `committed_spans` and `committed_files` against a model of every commit made, and
that a late retry of any run still finds its record (or, once expired, its whole range committed).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyspark_rmqs.runs.incarnation import UNMARKED
from pyspark_rmqs.runs.incarnation import same as same_incarnation
from pyspark_rmqs.runs.outputs import commit_index
from pyspark_rmqs.runs.outputs.committed import committed_files
from pyspark_rmqs.runs.outputs.delivery import COMMITS, FileCommits, RunToken, covers
from tests.support.folders import FaultyFolder

CONSUMERS = ("c1", "c2", None)
STREAMS = ("s1", "s2")
EVERY = 2  # compaction interval in the generated histories (many compactions in 40 steps)


class Killed(Exception):
    """A compaction or an expire stopped at one of its steps (as SIGKILL would stop it)."""


def faulty(inner: Any, op: str, at: int, before: Callable[[], None] | None = None) -> FaultyFolder:
    """`inner`, stopped (`Killed`) or running `before` ahead of the `at`-th call of operation `op`
    (`write_bytes`, `delete`, `move`)."""

    def act(what: str) -> None:
        if before is None:
            raise Killed(op)
        before()

    return FaultyFolder(inner, at, act, ops=(op,))


def model_spans(commits: list[RunToken], token: RunToken) -> dict[str, list[tuple[int, int]]]:
    """What every commit made says: the spans of `token`'s ranges its consumer's commits hold."""
    found: dict[str, list[tuple[int, int]]] = {}
    for c in commits:
        if c.consumer != token.consumer:
            continue
        for stream, (lo, hi) in token.ranges.items():
            if stream not in c.ranges:
                continue
            theirs = int(c.incarnations.get(stream) or UNMARKED)
            if not same_incarnation(theirs, int(token.incarnations.get(stream) or UNMARKED)):
                continue
            a, b = max(lo, c.ranges[stream][0]), min(hi, c.ranges[stream][1])
            if a < b:
                found.setdefault(stream, []).append((a, b))
    return {s: _merge(v) for s, v in found.items()}


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _file(token: RunToken) -> str:
    return f"rmqs_run={token.value}/part.parquet"


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
# A compaction's steps: its files object written, its spans object written, the files objects a
# kill left behind deleted, the spans objects and the files objects of the indexes it read deleted,
# its records moved.
KILLS = (
    ("write_bytes", 1),
    ("write_bytes", 2),
    ("delete", 1),
    ("delete", 2),
    ("delete", 3),
    ("delete", 4),
    ("move", 1),
    ("move", 2),
)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("commit"), tokens),
        st.tuples(st.just("commit"), tokens),  # commits weigh more: compactions need records
        st.tuples(st.just("commit"), tokens),
        st.tuples(st.just("commit_no_compaction"), tokens),  # the writer died after its record
        st.tuples(st.just("killed_compaction"), st.sampled_from(KILLS)),
        # a commit and a compaction inside another, before its files object or its spans object
        st.tuples(st.just("racing_compaction"), st.tuples(tokens, st.sampled_from((1, 2)))),
        st.tuples(st.just("drop_index"), st.none()),
        st.tuples(st.just("old_index_back"), st.none()),  # a stale index beside the newer
        st.tuples(st.just("garbage_index"), st.none()),
        st.tuples(st.just("garbage_files"), st.none()),  # the file list damaged, the spans whole
        st.tuples(st.just("files_gone"), st.none()),  # the file list deleted, the spans kept
        st.tuples(st.just("legacy_index"), st.none()),  # as rmqs before issue 47 left the folder
        st.tuples(st.just("compact_now"), st.none()),
        st.tuples(st.just("expire"), st.sampled_from((None, 1, 2))),  # killed before its n-th delete
    ),
    min_size=12,  # long enough for compactions, kills and retries to meet
    max_size=40,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=steps, probe=tokens)
def test_the_index_answers_as_every_commit_made(
    tmp_path_factory: Any, history: list[Any], probe: RunToken
) -> None:
    every, commit_index.COMPACT_EVERY = commit_index.COMPACT_EVERY, EVERY
    grace, commit_index.ORPHAN_GRACE_S = commit_index.ORPHAN_GRACE_S, 0.0  # nothing runs beside
    try:
        _run_history(tmp_path_factory.mktemp("out"), history, probe)
    finally:
        commit_index.COMPACT_EVERY, commit_index.ORPHAN_GRACE_S = every, grace


def _run_history(root: Path, history: list[Any], probe: RunToken) -> None:
    commits = FileCommits(str(root))
    made: dict[str, RunToken] = {}  # every commit, by token: the model
    expired: set[str] = set()
    old_index: dict[Path, bytes] = {}  # the first index seen (its spans and files objects)
    where = root / COMMITS
    # Files objects left without their spans object that no index names: a compaction killed
    # between its two writes, or named by a spans object damaged since (`sweep` deletes them)
    unnamed: set[str] = set()

    def commit(token: RunToken, compacts: bool = True) -> None:
        if commits.record(token) is None and token.value not in expired:  # as runs do
            every, commit_index.COMPACT_EVERY = commit_index.COMPACT_EVERY, EVERY if compacts else 10**9
            try:
                commits.commit(token, [_file(token)], 1, 1)
            finally:
                commit_index.COMPACT_EVERY = every
            made[token.value] = token

    for op, arg in history:
        spans_before = set(where.glob(f"{commit_index.INDEX_PREFIX}*.json"))
        if op in ("commit", "commit_no_compaction"):
            commit(arg, compacts=op == "commit")
        elif op == "killed_compaction":
            try:  # killed where it reaches that step (a compaction of nothing stops earlier)
                commit_index.compact(faulty(commits, *arg), every=1)
            except Killed:
                pass
        elif op == "racing_compaction":  # A reads; a run commits and B compacts; then A writes
            token, at = arg

            def other(token: RunToken = token) -> None:
                commit(token, compacts=False)
                commit_index.compact(commits, every=1)

            commit_index.compact(faulty(commits, "write_bytes", at, before=other), every=1)
            arg = token
        elif op == "drop_index":  # the whole index (an older one put back alone is not safe)
            for p in _index_objects(where):
                p.unlink()
            old_index = {}
        elif op == "old_index_back":
            for p, body in old_index.items():
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(body)
        elif op == "garbage_index" and (spans := sorted(where.glob(f"{commit_index.INDEX_PREFIX}*"))):
            unnamed |= {commit_index.files_name(n) for n in commit_index._replaced(spans[0].read_bytes())}
            spans[0].write_text('{"version": 3, "spans": [')
        elif op == "garbage_files" and (lists := sorted(where.glob(f"{commit_index.FILES_DIR}/*"))):
            lists[0].write_text('["rmqs_run=')
        elif op == "files_gone" and (lists := sorted(where.glob(f"{commit_index.FILES_DIR}/*"))):
            lists[0].unlink()
        elif op == "legacy_index":
            _as_legacy(commits, where)
        elif op == "compact_now":
            commit_index.compact(commits, every=1)
        elif op == "expire":
            before = _records(root)
            folder = commits if arg is None else faulty(commits, "delete", arg)
            try:
                commit_index.expire(folder, 0, now=float("inf"))
            except Killed:
                pass
            expired |= before - _records(root)
        if not old_index:
            old_index = {p: p.read_bytes() for p in _index_objects(where)}
        _check(root, commits, made, expired, probe, arg if isinstance(arg, RunToken) else None)
        if op == "killed_compaction" and arg == ("write_bytes", 2):
            unnamed |= _left_over(where)[1]  # its files object, written: its spans object not
        left, nameless = _left_over(where)
        assert nameless <= unnamed, (op, arg, nameless - unnamed)  # the others a compaction deletes
        # A compaction completed (a run's, a racing one's, `compact_now`, `expire`'s): whatever an
        # index named is gone
        killed = op == "killed_compaction" or (op == "expire" and arg is not None)
        if (
            not killed
            and op != "old_index_back"
            and set(where.glob(f"{commit_index.INDEX_PREFIX}*.json")) - spans_before
        ):
            assert left <= unnamed, (op, left - unnamed)
        if op == "expire" and arg is None:  # and what none named
            assert left == set(), left


def test_a_compaction_over_a_damaged_index_still_deletes_what_a_killed_one_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The generator's history (found by it, 2026-12-06): an index B replaces A; B's file list is
    deleted; A is put back beside B; `expire` compacts both into C and is killed between deleting
    A's spans object and A's files object; the next compaction D reads B (damaged) and C. C names A
    as replaced, but a damaged union dropped the spans objects D had read with it, so D left A's
    files object behind, named by no index: it kept what it read to learn what they replaced."""
    monkeypatch.setattr(commit_index, "COMPACT_EVERY", EVERY)
    monkeypatch.setattr(commit_index, "ORPHAN_GRACE_S", 0.0)
    one = RunToken("c1", {"s1": (0, 0)}, {})
    history: list[Any] = [("commit", one)] * 10 + [
        ("commit", RunToken("c1", {"s1": (0, 0), "s2": (0, 1)}, {})),
        ("commit", RunToken("c1", {"s1": (0, 0)}, {"s1": 0, "s2": 0})),
        ("compact_now", None),
        ("files_gone", None),
        ("old_index_back", None),
        ("commit", RunToken("c1", {"s1": (0, 0), "s2": (0, 0)}, {})),
        ("expire", 2),
        ("commit", RunToken("c1", {"s1": (0, 0)}, {"s1": 0})),
    ]
    _run_history(tmp_path, history, one)


def _left_over(where: Path) -> tuple[set[str], set[str]]:
    """The files objects whose spans object is gone, and those of them no spans object names."""
    spans = {p.name for p in where.glob(f"{commit_index.INDEX_PREFIX}*.json")}
    files = {f"{commit_index.FILES_DIR}/{p.name}" for p in where.glob(f"{commit_index.FILES_DIR}/*.json")}
    left = {f for f in files if f"{commit_index.INDEX_PREFIX}{f.partition('/')[2]}" not in spans}
    named = {
        commit_index.files_name(n) for s in spans for n in commit_index._replaced((where / s).read_bytes())
    }
    return left, left - named


def _index_objects(folder: Path) -> list[Path]:
    """Every index object: spans objects, files objects, and an earlier version's objects."""
    return [
        *folder.glob(f"{commit_index.INDEX_PREFIX}*.json"),
        *folder.glob(f"{commit_index.FILES_DIR}/*.json"),
        *folder.glob(f"{commit_index.INDEX_DIR}/*.json"),
    ]


def _as_legacy(commits: FileCommits, folder: Path) -> None:
    """The folder as rmqs before issue 47 left it: one index object of format 2 (the spans, then
    the files) in `_index/`, holding every commit, the records archived."""
    union = commit_index.snapshot(commits)
    for p in _index_objects(folder):
        p.unlink()
    legacy = folder / commit_index.INDEX_DIR
    legacy.mkdir(parents=True, exist_ok=True)
    (legacy / f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json").write_bytes(union.to_bytes())
    for name in union.listed:
        commits.move(name, f"{commit_index.ARCHIVE_DIR}/{name}")


def _records(root: Path) -> set[str]:
    """The tokens of the records listed or archived."""
    found = [*(root / COMMITS).glob("*.json"), *(root / COMMITS / commit_index.ARCHIVE_DIR).glob("*.json")]
    return {p.stem for p in found if not p.name.startswith("_")}


def _check(
    root: Path,
    commits: FileCommits,
    made: dict[str, RunToken],
    expired: set[str],
    probe: RunToken,
    token: RunToken | None,
) -> None:
    for t in (probe, token) if token is not None else (probe,):
        assert commits.committed_spans(t) == model_spans(list(made.values()), t), t
    assert committed_files(str(root)) == sorted(str(root / _file(t)) for t in made.values())
    for value, t in made.items():  # a late retry of every run recognises it
        if value in expired:
            assert commits.record(t) is None and covers(commits.committed_spans(t), t.ranges), t
        else:
            assert commits.record(t) is not None, t


class CountingFolder(FileCommits):
    """FileCommits counting the records it reads, the bytes of index objects and the names it lists."""

    reads = 0
    listed = 0
    index_bytes = 0

    def read_bytes(self, name: str) -> bytes | None:
        body = super().read_bytes(name)
        if not name.startswith("_") or name.startswith(commit_index.ARCHIVE_DIR):
            CountingFolder.reads += 1
        else:
            CountingFolder.index_bytes += len(body or b"")
        return body

    def list_names(self, sub: str = "") -> list[str]:
        names = super().list_names(sub)
        CountingFolder.listed += len(names)
        return names


def test_a_run_lists_and_reads_fewer_records_than_the_compaction_interval_whatever_the_history(
    tmp_path: Path,
) -> None:
    commits = CountingFolder(str(tmp_path))
    for i in range(1000):
        commits.commit(RunToken("c", {"s": (i * 10, i * 10 + 10)}), [f"f{i}.parquet"], 10, 1)
    CountingFolder.reads = CountingFolder.listed = CountingFolder.index_bytes = 0
    probe = RunToken("c", {"s": (9_990, 10_020)})
    assert commits.committed_spans(probe) == {"s": [(9_990, 10_000)]}
    assert CountingFolder.reads < commit_index.COMPACT_EVERY, CountingFolder.reads
    # One listing: the records (fewer than 16), the index's spans object, `_archive/`, `_files/`.
    assert CountingFolder.listed <= commit_index.COMPACT_EVERY + 2, CountingFolder.listed
    # The index's spans only (one span: the same at 1,000 runs as at 16), never its file list
    # (the whole index was read before issue 47's split: 30 KB here, 437 KB at 10,000 runs).
    assert CountingFolder.index_bytes < 200, CountingFolder.index_bytes
    assert len(committed_files(str(tmp_path))) == 1000
    # A late retry of the first run finds its record, archived.
    assert commits.record(RunToken("c", {"s": (0, 10)})) is not None
    # The index is a cache: without it, the same answer from the archived records.
    index = _index_objects(tmp_path / COMMITS)
    assert len(index) == 2, index  # one index: its spans object and its files object
    for p in index:
        p.unlink()
    CountingFolder.reads = 0
    assert commits.committed_spans(probe) == {"s": [(9_990, 10_000)]}
    assert CountingFolder.reads == 1000
    assert _index_objects(tmp_path / COMMITS) == []  # a read writes nothing


def test_an_index_of_the_earlier_format_is_read_then_folded_into_the_new_one(tmp_path: Path) -> None:
    """An output compacted by rmqs before the split (one object of spans and files in `_index/`):
    runs and readers answer from it, and the next compaction writes the new index and deletes it."""
    commits = FileCommits(str(tmp_path))
    runs = [RunToken("c", {"s": (i * 10, i * 10 + 10)}) for i in range(40)]
    every, commit_index.COMPACT_EVERY = commit_index.COMPACT_EVERY, 10**9
    try:
        for t in runs[:35]:
            commits.commit(t, [_file(t)], 10, 1)
    finally:
        commit_index.COMPACT_EVERY = every
    where = tmp_path / COMMITS
    _as_legacy(commits, where)
    assert [p.parent.name for p in _index_objects(where)] == [commit_index.INDEX_DIR]
    assert sorted(where.iterdir()) == [where / commit_index.ARCHIVE_DIR, where / commit_index.INDEX_DIR]
    probe = RunToken("c", {"s": (0, 400)})
    assert commits.committed_spans(probe) == {"s": [(0, 350)]}
    assert committed_files(str(tmp_path)) == sorted(str(tmp_path / _file(t)) for t in runs[:35])
    assert commits.record(runs[0]) is not None
    for t in runs[35:]:
        commits.commit(t, [_file(t)], 10, 1)
    assert commit_index.compact(commits, every=1)
    objects = _index_objects(where)
    assert sorted(p.name.startswith(commit_index.INDEX_PREFIX) for p in objects) == [False, True], objects
    assert [p.parent.name for p in objects if p.parent != where] == [commit_index.FILES_DIR]
    assert commits.committed_spans(probe) == {"s": [(0, 400)]}
    assert committed_files(str(tmp_path)) == sorted(str(tmp_path / _file(t)) for t in runs)


def test_expire_keeps_what_a_late_retry_and_a_reader_need(tmp_path: Path) -> None:
    commits = FileCommits(str(tmp_path))
    old = [RunToken("c", {"s": (i * 10, i * 10 + 10)}) for i in range(40)]
    for t in old:
        commits.commit(t, [_file(t)], 10, 1)
    report = commit_index.expire(commits, 3600, now=float("inf"))
    assert (report.expired, report.kept) == (40, 0)
    archive = tmp_path / COMMITS / commit_index.ARCHIVE_DIR
    assert [p.name.startswith(commit_index.EXPIRED) for p in archive.iterdir()] == [True]
    assert commits.record(old[0]) is None  # its record is gone: its range still reads as committed
    assert covers(commits.committed_spans(old[0]), old[0].ranges)
    assert len(committed_files(str(tmp_path))) == 40
    # With the index deleted too, the expired snapshot answers.
    for p in _index_objects(tmp_path / COMMITS):
        p.unlink()
    assert covers(commits.committed_spans(old[5]), old[5].ranges)
    assert len(committed_files(str(tmp_path))) == 40
    # Records younger than the cutoff stay.
    new = RunToken("c", {"s": (400, 410)})
    commits.commit(new, [_file(new)], 10, 1)
    assert commit_index.expire(commits, 3600).kept == 1 and commits.record(new) is not None


def test_files_objects_a_killed_compaction_leaves_are_deleted_by_the_next_compaction_or_expire(
    tmp_path: Path,
) -> None:
    """Killed between deleting the spans object of the index it read and that index's files object,
    a compaction leaves a files object no listing shows; its own index names it, and the next
    compaction deletes it. Killed between its own two writes, it leaves one no index names:
    `expire`'s sweep deletes it once older than the grace (a compaction between its writes looks
    the same, for milliseconds)."""
    commits = FileCommits(str(tmp_path))
    where = tmp_path / COMMITS
    runs = [RunToken("c", {"s": (i * 10, i * 10 + 10)}) for i in range(40)]
    for t in runs[:16]:  # one index
        commits.commit(t, [_file(t)], 10, 1)
    commits.commit(runs[16], [_file(runs[16])], 10, 1)
    with pytest.raises(Killed):  # after the old index's spans object is deleted
        commit_index.compact(faulty(commits, "delete", 2), every=1)
    left, nameless = _left_over(where)
    assert len(left) == 1 and nameless == set(), (left, nameless)
    commits.commit(runs[17], [_file(runs[17])], 10, 1)
    assert commit_index.compact(commits, every=1)
    assert _left_over(where) == (set(), set())
    commits.commit(runs[18], [_file(runs[18])], 10, 1)
    with pytest.raises(Killed):  # after its files object, before its spans object
        commit_index.compact(faulty(commits, "write_bytes", 2), every=1)
    left, nameless = _left_over(where)
    assert len(nameless) == 1 and left == nameless
    assert commit_index.sweep(commits) == 0  # younger than the grace: as a compaction's in flight
    assert commit_index.sweep(commits, now=time.time() + commit_index.ORPHAN_GRACE_S + 1) == 1
    assert _left_over(where) == (set(), set())
    assert committed_files(str(tmp_path)) == sorted(str(tmp_path / _file(t)) for t in runs[:19])


def test_rmqs_commits_expire_on_a_folder(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from pyspark_rmqs.cli.app import app

    commits = FileCommits(str(tmp_path))
    runs = [RunToken("c", {"s": (i * 10, i * 10 + 10)}) for i in range(5)]
    for t in runs:
        commits.commit(t, [_file(t)], 10, 1)
    cli = CliRunner()
    dry = cli.invoke(app, ["commits", "expire", str(tmp_path), "--older-than", "0s", "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.stdout) == {"output": str(tmp_path), "expired": 5, "kept": 0, "dry_run": True}
    assert all(commits.record(t) is not None for t in runs)
    kept = cli.invoke(app, ["commits", "expire", str(tmp_path), "--older-than", "30d"])
    assert kept.exit_code == 0 and "expired 0 commit record(s)" in kept.stdout and "kept 5" in kept.stdout
    gone = cli.invoke(app, ["commits", "expire", str(tmp_path), "--older-than", "0s", "--json"])
    assert json.loads(gone.stdout)["expired"] == 5 and all(commits.record(t) is None for t in runs)
    assert all(covers(commits.committed_spans(t), t.ranges) for t in runs)
    assert len(committed_files(str(tmp_path))) == 5
    bad = cli.invoke(app, ["commits", "expire", str(tmp_path), "--older-than", "30"])
    assert bad.exit_code == 1 and "a number and a unit" in bad.output
    empty = cli.invoke(app, ["commits", "expire", str(tmp_path / "nothing"), "--older-than", "1d"])
    assert empty.exit_code == 1 and "no commit records" in empty.output


@pytest.mark.parametrize("through", ["pyarrow", "fsspec"])
def test_on_an_object_store_the_listed_prefix_stays_bounded_and_expire_keeps_late_retries(
    s3: Any, through: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """moto's S3 server: records archived by copy then delete, a compaction killed between its
    index write and its moves, a late retry of an archived run, `rmqs commits expire` on `s3://`."""
    from typer.testing import CliRunner

    from pyspark_rmqs.cli.app import app
    from pyspark_rmqs.runs.outputs.delivery import StoreCommits
    from pyspark_rmqs.runs.outputs.objectstore import locate

    bucket = s3.new_bucket("commits")
    out = f"s3://{bucket}/orders"
    if through == "pyarrow":
        where = locate(out, filesystem=s3.pyarrow_fs())
    else:
        where = locate(out, storage_options=s3.storage_options())
    commits = StoreCommits(where)
    runs = [RunToken("c", {"s": (i * 10, i * 10 + 10)}) for i in range(20)]
    for t in runs[:17]:
        commits.commit(t, [_file(t)], 10, 1)
    listed = [k for k in s3.keys(bucket, "orders/_rmqs_commits/") if k.count("/") == 2 and k[-1] != "/"]
    assert len(listed) == 2 and "/_index-" in listed[1], listed  # 16 folded and archived, the 17th listed
    for t in runs[17:]:  # two more, then a compaction killed after its index write
        commits.commit(t, [_file(t)], 10, 1)
    try:
        commit_index.compact(faulty(commits.folder(), "move", 2), every=1)
    except Killed:
        pass
    answer = committed_files(out, storage_options=s3.storage_options())
    assert answer == sorted(f"{bucket}/orders/{_file(t)}" for t in runs)
    assert commits.record(runs[0]) is not None  # a late retry of an archived run finds its record
    assert covers(commits.committed_spans(RunToken("c", {"s": (0, 200)})), {"s": (0, 200)})
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    done = CliRunner().invoke(app, ["commits", "expire", out, "--older-than", "0s", "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["expired"] == 20
    assert commits.record(runs[0]) is None and covers(commits.committed_spans(runs[0]), runs[0].ranges)
    assert committed_files(out, storage_options=s3.storage_options()) == answer
    kept = [k for k in s3.keys(bucket, "orders/_rmqs_commits/") if not k.endswith("/")]  # not markers
    assert len(kept) == 3, kept  # the expired snapshot, and the index: its files, its spans
    assert "/_archive/_expired-" in kept[0] and "/_files/" in kept[1] and "/_index-" in kept[2], kept


def test_on_s3_a_run_makes_one_listing_and_reads_no_file_list(
    s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """moto's S3 server through s3fs (`storage_options`): the requests of a run's look-ups on its
    output (`record`, `committed_spans`) and of its file's publish. Through pyarrow's fsspec handler
    a read was a HEAD (and, for an absent record, a listing too) and the publish's move three
    listings and three HEADs; a listing's cost grows with the bucket on moto (it scans every key)."""
    import pyarrow as pa

    from pyspark_rmqs.runs.consume import ParquetSink
    from pyspark_rmqs.runs.outputs.delivery import StoreCommits
    from pyspark_rmqs.runs.outputs.objectstore import locate

    calls = _counted_s3_calls(monkeypatch)
    out = f"s3://{s3.new_bucket('requests')}/orders"
    commits = StoreCommits(locate(out, storage_options=s3.storage_options()))
    for i in range(40):  # two compactions: one index, 8 records listed
        t = RunToken("c", {"s": (i * 10, i * 10 + 10)})
        commits.commit(t, [_file(t)], 10, 1)
    token = RunToken("c", {"s": (400, 410)})
    calls.clear()
    assert commits.record(token) is None
    assert commits.committed_spans(token) == {}
    methods = sorted(m for m, _ in calls)
    # The record where it would be, then in the archive; one listing; the index's spans and the
    # 8 listed records. No HEAD, no second listing, no file list.
    assert methods == ["get_object"] * 11 + ["list_objects_v2"], calls
    assert not [k for _, k in calls if f"/{commit_index.FILES_DIR}/" in k], calls
    sink = ParquetSink(out, storage_options=s3.storage_options())
    sink.begin_run(token)
    sink.open("s", 400, 410, pa.schema([("offset", pa.int64())]))
    sink.write(pa.record_batch([pa.array(range(400, 410), pa.int64())], names=["offset"]))
    calls.clear()
    sink.close()
    # The move to the final name (the upload's own PUT goes through s3fs's file object, not
    # counted here): a HEAD (the size), the copy, the delete.
    assert sorted(m for m, _ in calls) == ["copy_object", "delete_object", "head_object"], calls


def test_on_s3_committed_files_lists_twice_at_once_and_reads_the_index_and_log_without_a_head(
    s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """moto's S3 server through s3fs: `committed_files` makes one LIST of `_rmqs_commits/` and one of
    `_spark_metadata/` (in parallel), then GETs: no HEAD, and no listing of the output itself (s3fs's
    `ls` of an absent prefix lists its parent next: every file of the output, a request per 1,000;
    pyarrow's handler probed the log with a LIST, a HEAD and a LIST)."""

    from pyspark_rmqs.runs.outputs.delivery import StoreCommits
    from pyspark_rmqs.runs.outputs.objectstore import locate

    calls = _counted_s3_calls(monkeypatch)
    bucket = s3.new_bucket("reader")
    out = f"s3://{bucket}/orders"
    commits = StoreCommits(locate(out, storage_options=s3.storage_options()))
    runs = [RunToken("c", {"s": (i * 10, i * 10 + 10)}) for i in range(40)]
    for t in runs:  # two compactions: one index, 8 records listed
        commits.commit(t, [_file(t)], 10, 1)
    want = sorted(f"{bucket}/orders/{_file(t)}" for t in runs)
    calls.clear()
    assert committed_files(out, storage_options=s3.storage_options()) == want
    assert sorted(m for m, _ in calls) == ["get_object"] * 10 + ["list_objects_v2"] * 2, calls
    assert sorted(k for m, k in calls if m == "list_objects_v2") == [
        "orders/_rmqs_commits/",
        "orders/_spark_metadata/",
    ], calls
    # A Spark file sink's log beside them (as an AvailableNow drain leaves it): listed once, each
    # batch one GET.
    client = s3.client()
    for batch, name in ((0, "part-0.parquet"), (1, "part-1.parquet")):
        entry = {"path": f"s3a://{bucket}/orders/{name}", "size": 1, "isDir": False, "action": "add"}
        client.put_object(
            Bucket=bucket, Key=f"orders/_spark_metadata/{batch}", Body=f"v1\n{json.dumps(entry)}\n"
        )
    calls.clear()
    found = committed_files(out, storage_options=s3.storage_options())
    assert found == sorted([*want, f"{bucket}/orders/part-0.parquet", f"{bucket}/orders/part-1.parquet"])
    assert sorted(m for m, _ in calls) == ["get_object"] * 12 + ["list_objects_v2"] * 2, calls


def test_each_s3_file_system_has_its_own_session_and_shares_botocore_s_parsed_data() -> None:
    """`locate` with `storage_options` makes a fresh s3fs instance (so a credential rotation is
    seen): its botocore session is new, but the S3 API data botocore parses for a session (100 to
    400 ms of a busy machine, more than a reader's requests) is loaded once per process."""
    import aiobotocore.session

    from pyspark_rmqs.runs.outputs.objectstore import fsspec_of, locate

    options = {"key": "k", "secret": "s", "endpoint_url": "http://127.0.0.1:9"}
    a, b = (fsspec_of(locate("s3://b/o", storage_options=options).fs) for _ in range(2))
    assert a is not b and a.session is not b.session
    assert a.session.get_component("data_loader") is b.session.get_component("data_loader")
    given = aiobotocore.session.AioSession()  # a session the caller gives stays theirs
    assert fsspec_of(locate("s3://b/o", storage_options={**options, "session": given}).fs).session is given


def _counted_s3_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every S3 request s3fs makes from now on, as (method, key or prefix), in order."""
    import s3fs

    calls: list[tuple[str, str]] = []
    call = s3fs.S3FileSystem._call_s3

    async def counted(self: Any, method: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(
            (getattr(method, "__name__", str(method)), str(kwargs.get("Key") or kwargs.get("Prefix")))
        )
        return await call(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counted)
    return calls
