"""A commit folder that stops partway: what a process killed inside a compaction or an expire of an
exactly-once output's commit index leaves behind (`commit_index.RecordFolder`).

One wrapper for the commit index's unit tests (tests/unit/test_commit_index.py: a kill at the k-th
write, delete or move; a second compaction racing in before a write) and the campaign's
`in_compaction` crash point (tests/campaign/faults.py: a kill or a pause at the k-th mutation of any
kind, in a real run).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

MUTATIONS = ("write_bytes", "delete", "move")


class FaultyFolder:
    """A `RecordFolder` passing every call to `inner`, calling `before(what)` ahead of the `at`-th
    call among the operations `ops` (every mutation by default). A `before` that raises stops the
    operation there (a kill: it never happens); one that returns lets it go on. Counted under a
    lock: a remote folder deletes and moves from a thread pool."""

    def __init__(
        self, inner: Any, at: int, before: Callable[[str], None], ops: Iterable[str] = MUTATIONS
    ) -> None:
        self.inner, self.at, self.before, self.ops = inner, at, before, frozenset(ops)
        self.remote: bool = inner.remote
        self.calls = 0
        self._lock = threading.Lock()

    def _step(self, op: str, name: str) -> None:
        if op not in self.ops:
            return
        with self._lock:
            self.calls += 1
            hit = self.calls == self.at
        if hit:
            self.before(f"{op} of {name}")

    def list_names(self, sub: str = "") -> list[str]:
        return list(self.inner.list_names(sub))

    def read_bytes(self, name: str) -> bytes | None:
        body: bytes | None = self.inner.read_bytes(name)
        return body

    def write_bytes(self, name: str, body: bytes) -> None:
        self._step("write_bytes", name)
        self.inner.write_bytes(name, body)

    def delete(self, name: str) -> None:
        self._step("delete", name)
        self.inner.delete(name)

    def move(self, name: str, to: str) -> None:
        self._step("move", name)
        self.inner.move(name, to)
