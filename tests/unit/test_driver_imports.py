"""What the driver side of a read imports: Spark starts a fresh Python process for every streaming
query's source (pyspark's `python_streaming_source_runner`) and pays every module-level import of
`spark.source` / `spark.streaming` on each query start. The executor-only reader (`broker.reader`,
`batches`, `pyarrow.compute`) is imported by `read_partition` when a task runs, never by planning.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXECUTOR_ONLY = ("pyspark_rmqs.broker.reader", "pyspark_rmqs.core.batches", "pyarrow.compute")


def _loaded_after(modules: str) -> list[str]:
    code = (
        f"import json, sys, {modules}; "
        f"print(json.dumps(sorted(m for m in {list(EXECUTOR_ONLY)!r} if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return list(json.loads(out.stdout))


@pytest.mark.parametrize(
    "modules",
    [
        "pyspark_rmqs.spark.source",
        "pyspark_rmqs.spark.source, pyspark_rmqs.spark.streaming",
        "pyspark_rmqs.spark.source, pyspark_rmqs.spark.batch",
    ],
)
def test_the_driver_side_of_a_read_does_not_import_the_executor_side_reader(modules: str) -> None:
    assert _loaded_after(modules) == []


def test_the_executor_side_imports_the_reader_when_a_task_needs_it() -> None:
    code = (
        "import sys; from pyspark_rmqs.options import parse_source_options; "
        "from pyspark_rmqs.spark import common; "
        "opts = parse_source_options({'stream': 's', 'endpoints': 'localhost:5552'}, streaming=False); "
        "print(type(common.read_settings(opts)).__module__)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "pyspark_rmqs.broker.reader"
