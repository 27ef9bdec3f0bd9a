"""tests/support/memory.py: a test that grows its process past the limit fails, named, with its stacks,
instead of the OOM killer taking the worker (and pytest-xdist hanging on its replacement)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

GROWING = """
import time

def test_small():
    assert True

def test_grows_without_end():
    kept = []
    while True:
        kept.append(bytearray(20 << 20))
        time.sleep(0.02)

def test_after():
    assert True
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_grow.py").write_text(GROWING)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RMQS_TEST_MAX_RSS_MB": "400"}
    env["RMQS_TEST_RESULTS"] = str(tmp_path)
    env.pop("PYTEST_XDIST_WORKER", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.support.memory",
         "--noconftest", "--junitxml", str(tmp_path / "r.xml"), *args, str(tmp_path / "test_grow.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


XDIST = ["-n", "2", "--max-worker-restart", "0"]


@pytest.mark.parametrize("xdist", [[], XDIST], ids=["one-process", "xdist"])
def test_a_test_past_the_limit_fails_named_and_the_next_one_runs(tmp_path: Path, xdist: list[str]) -> None:
    done = _run(tmp_path, *xdist)
    out = done.stdout + done.stderr
    assert "1 failed, 2 passed" in out, out[-3000:]
    assert "test_grows_without_end grew this test process to" in out, out[-3000:]
    assert "RMQS_TEST_MAX_RSS_MB=400" in out
    (dump,) = tmp_path.glob("memory-*.txt")  # memory-main.txt, or the xdist worker's
    stacks = dump.read_text()
    assert "test_grows_without_end" in stacks and "test_grow.py" in stacks, stacks[:2000]
    junit = (tmp_path / "r.xml").read_text()
    assert 'name="peak_rss_mb"' in junit
