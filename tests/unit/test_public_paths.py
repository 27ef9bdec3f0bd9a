"""The import paths users write keep working after the move into layer folders (issue #30).

Each facade (`pyspark_rmqs.jobs`, `.watermarks`, `.committed`, ...) hands out the very objects of
the module that holds the code, so `isinstance`, `except` and monkeypatching the real module behave
as before; the console script and `python -m pyspark_rmqs.demo` still resolve.
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FACADES = {
    "pyspark_rmqs.errors": "pyspark_rmqs.core.errors",
    "pyspark_rmqs.extensions": "pyspark_rmqs.core.extensions",
    "pyspark_rmqs.progress": "pyspark_rmqs.core.progress",
    "pyspark_rmqs.consume": "pyspark_rmqs.runs.consume",
    "pyspark_rmqs.produce": "pyspark_rmqs.runs.produce",
    "pyspark_rmqs.committed": "pyspark_rmqs.runs.outputs.committed",
    "pyspark_rmqs.watermarks": "pyspark_rmqs.runs.watermarks",
}


@pytest.mark.parametrize("facade", sorted(FACADES))
def test_a_facade_hands_out_the_objects_of_the_module_with_the_code(facade: str) -> None:
    public, real = importlib.import_module(facade), importlib.import_module(FACADES[facade])
    assert public.__all__
    for name in public.__all__:
        assert getattr(public, name) is getattr(real, name), name


def test_the_jobs_path_keeps_the_protocol_entry_points() -> None:
    from pyspark_rmqs import jobs

    for name in ("plan_read", "run_read", "run_drain", "spark_session", "read_options", "write_output"):
        assert callable(getattr(jobs, name)), name
    assert {"ReadPlan", "RunSummary", "FileOutput"} <= set(jobs.__all__)


def test_top_level_names_and_the_console_script_resolve() -> None:
    import pyspark_rmqs
    from pyspark_rmqs.cli import main

    progress = importlib.import_module("pyspark_rmqs.core.progress")
    assert pyspark_rmqs.lag_from_progress is progress.lag_from_progress
    assert callable(main)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["rmqs"] == "pyspark_rmqs.cli:main"


def test_the_demo_path_runs_the_demo_only_as_main() -> None:
    """`python -m pyspark_rmqs.demo` (runpy) runs `pyspark_rmqs.cli.demo`; importing it runs nothing."""
    assert importlib.util.find_spec("pyspark_rmqs.cli.demo") is not None
    code = "import sys, pyspark_rmqs.demo; print('pyspark_rmqs.cli.demo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


def test_errors_are_named_by_their_public_path_and_pickle() -> None:
    """Spark prints `module.Class: message` for an executor's error and users match on it; a pickled
    error (from an executor, a subprocess) must load on the other side by that name."""
    import pickle

    from pyspark_rmqs import errors

    for name in errors.__all__:
        cls = getattr(errors, name)
        if isinstance(cls, type) and issubclass(cls, Exception):
            assert cls.__module__ == "pyspark_rmqs.errors", name
            again = pickle.loads(pickle.dumps(cls("boom")))
            assert type(again) is cls and str(again) == "boom"
