"""Every Python and `rmqs` snippet in docs/ runs, against the real broker and Spark.

Snippets use the names a reader would (`orders`, `events`); the test creates fresh streams and
substitutes their names, provides `out_dir`, `checkpoint_dir` and `orders_df`, and runs a page's
snippets in order in one namespace. `make` lines are the project's own commands, run by CI itself.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from typer.testing import CliRunner

from pyspark_rmqs.cli import app
from tests.support.broker import BrokerSettings
from tests.support.data import publish, publish_keyed

pytestmark = [pytest.mark.spark, pytest.mark.broker]

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"```(python|console)\n(.*?)```", re.S)
DOC_PAGES = sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md") if BLOCK.search(p.read_text()))
PAGES = ["README.md", *DOC_PAGES]


def substitute(code: str, names: dict[str, str]) -> str:
    """Stream names in string literals: "orders", 'orders-1', {"events": 200}."""
    for old, new in names.items():
        code = re.sub(rf"(?<=[\"']){re.escape(old)}(?=[\"'-])", new, code)
    return code


@pytest.mark.parametrize("page", PAGES)
def test_snippets_run(
    page: str, spark: SparkSession, broker: BrokerSettings, streams, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    orders, parts = streams.super_stream(3)
    events = streams.stream()
    publish_keyed(broker, orders, [(f"c{i % 97}", f'{{"n": {i}}}'.encode()) for i in range(600)])
    for p in parts:  # enough in every partition for the offset examples
        publish(broker, p, [b"{}"] * 30)
    publish(broker, events, [b"e"] * 250)
    names = {"orders": orders, "events": events}
    ns = {
        "spark": spark,
        "out_dir": str(tmp_path / "out"),
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "orders_df": spark.createDataFrame(
            [("c1", 3, 9.5), ("c2", 1, 20.0)], "customer string, qty int, amount double"
        ),
    }
    runner = CliRunner()
    ran = 0
    for kind, code in BLOCK.findall((ROOT / page).read_text()):
        if kind == "python":
            code = substitute(code, names).replace('"/lake/', f'"{tmp_path}/lake/')
            exec(compile(code, f"{page}:snippet", "exec"), ns)
            ran += 1
            continue
        for line in code.splitlines():
            cmd = line.split("#")[0].strip()
            words = [names.get(w, w) for w in shlex.split(cmd)]
            if not words or not words[0].endswith("rmqs"):
                continue
            if words[1] == "broker":  # never stop the suite's broker; status must say it runs
                if words[2] == "status" and not broker.external:
                    r = runner.invoke(app, words[1:])
                    assert r.exit_code == 0 and "running" in r.output, r.output
                    ran += 1
                continue
            r = runner.invoke(app, [*words[1:], "--endpoints", f"{broker.host}:{broker.port}"])
            assert r.exit_code == 0, (cmd, r.output)
            ran += 1
    assert ran > 0
