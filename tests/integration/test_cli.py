"""The `rmqs` command against the real broker."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from pyspark_rmqs.cli.app import app, sample_orders
from tests.support.broker import BrokerSettings
from tests.support.data import client

runner = CliRunner()


def args(b: BrokerSettings) -> list[str]:
    return ["--endpoints", f"{b.host}:{b.port}", "--username", b.username, "--password", b.password]


def test_create_publish_offsets_and_lag(broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    name, parts = streams.super_stream(3)
    r = runner.invoke(app, ["publish", "--superstream", name, "--count", "3000", *args(broker)])
    assert r.exit_code == 0, r.output
    assert "published 3,000 messages" in r.output
    r = runner.invoke(app, ["offsets", "--superstream", name, "--json", *args(broker)])
    rows = json.loads(r.output)
    assert [x["stream"] for x in rows] == parts
    assert sum(x["tail"] for x in rows) == 3000
    client(broker).store_offsets("cli", {parts[0]: rows[0]["tail"] - 1})
    r = runner.invoke(app, ["lag", "--superstream", name, "--consumer", "cli", "--json", *args(broker)])
    w = json.loads(r.output)
    assert w["partitions"][0]["lag"] == 0
    assert w["total_lag"] == 3000 - rows[0]["tail"]
    r = runner.invoke(app, ["lag", "--superstream", name, "--consumer", "cli", *args(broker)])
    assert r.exit_code == 0 and "total" in r.output and parts[1] in r.output


def test_publish_a_json_lines_file(broker: BrokerSettings, streams, tmp_path) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    f = tmp_path / "orders.jsonl"
    f.write_text("\n".join(json.dumps(o) for o in sample_orders(25)) + "\n")
    r = runner.invoke(app, ["publish", "--stream", s, "--file", str(f), *args(broker)])
    assert r.exit_code == 0, r.output
    assert client(broker).tail(s) == 25


def test_unreachable_broker_is_one_clear_line() -> None:
    r = runner.invoke(app, ["lag", "--stream", "s", "--consumer", "c", "--endpoints", "127.0.0.1:5999"])
    assert r.exit_code == 1
    assert "could not connect to RabbitMQ Streams at 127.0.0.1:5999" in r.output


def test_missing_stream_and_bad_arguments(broker: BrokerSettings) -> None:
    r = runner.invoke(app, ["lag", "--stream", "no-such-stream-cli", "--consumer", "c", *args(broker)])
    assert r.exit_code == 1 and "stream 'no-such-stream-cli' does not exist" in r.output
    r = runner.invoke(app, ["lag", "--consumer", "c", *args(broker)])
    assert r.exit_code == 1 and "exactly one of --stream or --superstream" in r.output


def test_sample_orders_are_deterministic() -> None:
    assert list(sample_orders(3)) == list(sample_orders(3))
    assert [o["order_id"] for o in sample_orders(3)] == ["o-0000000", "o-0000001", "o-0000002"]
