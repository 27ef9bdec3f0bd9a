"""The tests that would stop, restart or pause the shared broker (`serial`).

`make test` runs them alone, after the parallel phase (`-m serial`), so no other test sees their
faults. None today: the tests that stop, restart or pause a broker do it to their own
(`restartable_broker`, the "restartable" group of tests/conftest.py). Apart from the conftest so
that scripts/test.sh can ask, without a pytest collection (~10 s), whether there is a phase to run:
`python -m tests.support.serial` exits 1 when there is none.
"""

from __future__ import annotations

SERIAL: tuple[str, ...] = ()
"""Node id prefixes of the serial tests."""

if __name__ == "__main__":
    raise SystemExit(0 if SERIAL else 1)
