"""Where the suite's time goes: per-test CPU beside wall time, and the report `make test` ends with.

Each test records the CPU its process tree spent (this process and every process below it: Spark's
JVM and Python workers, subprocesses) as the junit property `cpu_s`; `python -m tests.support.timing
A.xml B.xml` then prints, for the runs those files hold: the slowest 15 tests, the wall and CPU time
per tier and the most idle test files (wall minus CPU: waiting on the broker, Spark, a server or a
sleep), and last a plain `N passed, N failed, N skipped` line over all of them.
"""

from __future__ import annotations

import os
import resource
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import psutil
import pytest


def _tree_cpu() -> float:
    """CPU seconds of this process, its live descendants and the children it reaped (user + system)."""
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = reaped.ru_utime + reaped.ru_stime
    me = psutil.Process()
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


_START = pytest.StashKey[tuple[float, float]]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_START] = (_tree_cpu(), time.monotonic())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    # Before the teardown report is made: junitxml writes the properties that report carries.
    if call.when == "teardown" and _START in item.stash:
        cpu0, t0 = item.stash[_START]
        item.user_properties.append(("file", item.nodeid.split("::", 1)[0]))
        item.user_properties.append(("cpu_s", round(max(0.0, _tree_cpu() - cpu0), 3)))
        item.user_properties.append(("wall_s", round(time.monotonic() - t0, 3)))
        # When and where it ran, to lay the run out in time (which worker waited, and when).
        item.user_properties.append(("started", round(time.time() - (time.monotonic() - t0), 1)))
        item.user_properties.append(("worker", os.environ.get("PYTEST_XDIST_WORKER", "main")))
        item.user_properties.append(("pid", os.getpid()))  # to find a test's processes in `sa`/`dump-acct`
    yield


class Case(NamedTuple):
    """One junit test case, as the report reads it."""

    file: str
    name: str
    wall: float
    cpu: float
    outcome: str
    peak_mb: int | None  # its process's peak resident memory (tests/support/memory.py), when recorded


def _cases(paths: list[Path]) -> Iterator[Case]:
    """Every test case of the junit files."""
    for path in paths:
        if not path.exists():
            continue
        for case in ET.parse(path).getroot().iter("testcase"):
            props, wall = _measured(case)
            cpu = float(props.get("cpu_s") or 0)
            outcome = "passed"
            for child in case:
                if child.tag in ("failure", "error"):
                    outcome = "failed"
                elif child.tag == "skipped":
                    outcome = "skipped"
            file = props.get("file") or case.get("classname", "").replace(".", "/") + ".py"
            peak = props.get("peak_rss_mb")
            yield Case(file, case.get("name", ""), wall, cpu, outcome, int(peak) if peak else None)


def _measured(case: ET.Element) -> tuple[dict[str | None, str | None], float]:
    """A junit test case's properties (what `pytest_runtest_makereport` recorded) and its wall time."""
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    return props, float(props.get("wall_s") or case.get("time") or 0)


def _span(path: Path) -> str | None:
    """When a run's first test started and its last ended, counted from its session's start, and
    when the file was written: the time before the first test (workers starting and collecting) and
    after the last (teardown, workers exiting), which no test's own time shows."""
    from datetime import datetime

    if not path.exists():
        return None
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    starts: list[float] = []
    ends: list[float] = []
    for case in root.iter("testcase"):
        props, wall = _measured(case)
        started = props.get("started")
        if started:
            starts.append(float(started))
            ends.append(starts[-1] + wall)
    if suite is None or not suite.get("timestamp") or not starts:
        return None
    began = datetime.fromisoformat(suite.get("timestamp", "")).timestamp()
    written = path.stat().st_mtime
    return (
        f"{path.name}: first test {min(starts) - began:.0f} s after the session began, last test ended "
        f"{max(ends) - began:.0f} s after it, results written {written - began:.0f} s after it"
    )


def report(paths: list[Path]) -> int:
    cases = list(_cases(paths))
    if not cases:
        print("timing: no test results found")
        return 1
    print("\nslowest 15 tests (wall s, cpu s):")
    for c in sorted(cases, key=lambda c: -c.wall)[:15]:
        print(f"  {c.wall:7.1f} {c.cpu:7.1f}  {c.file}::{c.name}")
    tiers: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for file, _, wall, cpu, *_ in cases:
        parts = Path(file).parts
        tier = "/".join(parts[:3] if len(parts) > 3 and parts[1] == "e2e" else parts[:2])
        tiers[tier][0] += wall
        tiers[tier][1] += cpu
        tiers[tier][2] += 1
        files[file][0] += wall
        files[file][1] += cpu
    print("per tier (tests, wall s summed over workers, cpu s):")
    for tier, (wall, cpu, n) in sorted(tiers.items(), key=lambda t: -t[1][0]):
        print(f"  {tier:28} {int(n):5d} {wall:8.1f} {cpu:8.1f}")
    print("most idle files (wall - cpu s):")
    for file, (wall, cpu) in sorted(files.items(), key=lambda f: -(f[1][0] - f[1][1]))[:10]:
        print(f"  {wall - cpu:7.1f}  {file}")
    peaks = sorted(((c.peak_mb, f"{c.file}::{c.name}") for c in cases if c.peak_mb), reverse=True)[:5]
    if peaks:
        print("largest test processes (peak resident MB; limit: RMQS_TEST_MAX_RSS_MB):")
        for mb, test in peaks:
            print(f"  {mb:7d}  {test}")
    counts: defaultdict[str, int] = defaultdict(int)
    for c in cases:
        counts[c.outcome] += 1
    for path in paths:
        span = _span(path)
        if span:
            print(span)
    print(f"total: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(report([Path(a) for a in sys.argv[1:]]))
