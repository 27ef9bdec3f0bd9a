"""Every Python and `rmqs` snippet of the READMEs and docs/ runs, against the real broker and Spark.

Snippets use the names a reader would (`orders`, `events`); the test creates fresh streams and
substitutes their names, points `/lake/...` paths into a temporary folder, and runs a page's
snippets in order in one namespace that starts empty: a snippet defines what it uses (the test's
SparkSession is the one `SparkSession.builder.getOrCreate()` returns). Blocks that cannot run here
say why in a `<!-- not run: ... -->` comment (tests/support/docs.py; tests/unit/test_docs.py
checks that every other block is one this test runs).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from typer.testing import CliRunner

from pyspark_rmqs.cli.app import app
from tests.support import docs
from tests.support.broker import BrokerSettings
from tests.support.data import publish, publish_keyed

pytestmark = [pytest.mark.spark, pytest.mark.broker]

PAGES = [page for page in docs.pages() if any(docs.runs(b) for b in docs.blocks(page))]


def substitute(code: str, names: dict[str, str]) -> str:
    """Stream names in string literals: "orders", 'orders-1', {"events": 200}."""
    for old, new in names.items():
        code = re.sub(rf"(?<=[\"']){re.escape(old)}(?=[\"'-])", new, code)
    return code


@pytest.mark.parametrize("page", PAGES)
def test_snippets_run(
    page: str,
    spark: SparkSession,
    broker: BrokerSettings,
    streams,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # type: ignore[no-untyped-def]
    # What the pages' shell lines set (docs/airflow.md's `export AIRFLOW_CONN_...`, RMQS_PASSWORD).
    monkeypatch.setenv("AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT", broker.uri)
    monkeypatch.setenv("RMQS_PASSWORD", broker.password)
    orders, parts = streams.super_stream(3)
    events = streams.stream()
    publish_keyed(broker, orders, [(f"c{i % 97}", f'{{"n": {i}}}'.encode()) for i in range(600)])
    for p in parts:  # enough in every partition for the offset examples
        publish(broker, p, [b"{}"] * 30)
    publish(broker, events, [b"e"] * 250)
    names = {"orders": orders, "events": events}
    ns: dict[str, object] = {}
    runner = CliRunner()
    ran = 0
    for block in docs.blocks(page):
        if not docs.runs(block):
            continue
        if block.lang == "python":
            code = substitute(block.code, names).replace('"/lake/', f'"{tmp_path}/lake/')
            exec(compile(code, block.where, "exec"), ns)
            ran += 1
            continue
        for cmd in docs.rmqs_lines(block.code):
            words = [names.get(w, w) for w in shlex.split(cmd)]
            if words[1] == "broker":  # never stop the suite's broker; status must say it runs
                if words[2] == "status" and not broker.external:
                    r = runner.invoke(app, words[1:])
                    assert r.exit_code == 0 and "running" in r.output, r.output
                    ran += 1
                continue
            r = runner.invoke(app, [*words[1:], "--endpoints", f"{broker.host}:{broker.port}"])
            assert r.exit_code == 0, (block.where, cmd, r.output)
            ran += 1
    assert ran > 0
