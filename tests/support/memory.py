"""A memory limit per test process: a test that grows past it fails, naming itself and its stacks.

CI's `make test` once hung at 98% for the rest of its 90 minutes: one xdist worker grew to 20 GB,
the kernel's OOM killer killed it, and pytest-xdist 3.8's `loadgroup` scheduler never finished after
replacing it (pytest-xdist#1378). Nothing said which test had grown. Here a thread samples this
process's resident memory every `INTERVAL_S`; past `RMQS_TEST_MAX_RSS_MB` (default 4,096: three
workers at the limit still leave the JVMs and the broker room on 24 GB) it writes every thread's
stack to `.test-results/memory-<worker>.txt`, and the running test fails with that file named
(SIGUSR2, handled in the main thread the way pytest-timeout's signal method fails a test). When the
process still grows to twice the limit (the main thread blocked in C, or a background thread that
keeps allocating), it exits at once instead of waiting for the OOM killer: the worker's crash names
the test, and `scripts/test.sh` stops xdist from replacing it (`--max-worker-restart 0`).

Each test's peak is its junit property `peak_rss_mb`; the timing report prints the largest.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import psutil
import pytest

INTERVAL_S = 0.25
MB = 1 << 20


def limit_mb() -> int:
    return int(os.environ.get("RMQS_TEST_MAX_RSS_MB", "4096"))


class Guard:
    """The sampling thread and what it saw during the current test."""

    def __init__(self, limit: int, out: Path) -> None:
        self.limit = limit * MB
        self.out = out
        self.proc = psutil.Process()
        self.test = ""
        self.peak = 0
        self.tripped = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rmqs-memory-guard", daemon=True)

    def start(self) -> None:
        signal.signal(signal.SIGUSR2, self._fail)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def begin(self, nodeid: str) -> None:
        self.test, self.peak, self.tripped = nodeid, self.proc.memory_info().rss, ""

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            try:
                rss = self.proc.memory_info().rss
            except psutil.Error:
                return
            self.peak = max(self.peak, rss)
            if rss > self.limit and not self.tripped:
                self.tripped = self._dump(rss)
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR2)
            elif rss > 2 * self.limit:
                self._dump(rss)
                sys.stderr.write(f"\n{self.tripped}: still growing ({rss // MB} MB), exiting\n")
                sys.stderr.flush()
                os._exit(70)

    def _dump(self, rss: int) -> str:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        with self.out.open("a") as f:
            f.write(f"\n== {time.strftime('%H:%M:%S')} {self.test}: {rss // MB} MB resident ==\n")
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
        return (
            f"{self.test} grew this test process to {rss // MB} MB, past RMQS_TEST_MAX_RSS_MB="
            f"{self.limit // MB}: every thread's stack is in {self.out}"
        )

    def _fail(self, signum: int, frame: FrameType | None) -> None:
        if self.tripped:
            pytest.fail(self.tripped, pytrace=True)


_GUARD: Guard | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _GUARD
    if config.option.collectonly or _is_xdist_controller(config):
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    out = Path(os.environ.get("RMQS_TEST_RESULTS", ".test-results")) / f"memory-{worker}.txt"
    _GUARD = Guard(limit_mb(), out.absolute())
    _GUARD.start()


def _is_xdist_controller(config: pytest.Config) -> bool:
    """The controller runs no test: its workers each have their own guard."""
    return not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses", None))


def pytest_unconfigure(config: pytest.Config) -> None:
    if _GUARD is not None:
        _GUARD.stop()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _GUARD is not None:
        _GUARD.begin(item.nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    if call.when == "teardown" and _GUARD is not None and _GUARD.test == item.nodeid:
        item.user_properties.append(("peak_rss_mb", _GUARD.peak // MB))
    yield
