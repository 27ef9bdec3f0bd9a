"""The installed `rmqs` entry point, as an operator runs it: a subprocess against the real broker.

Every command and exit code of docs/cli.md: lag --max-lag (0 / 3 / 1), watermark show|set
(--dry-run changes nothing, no --yes and no terminal refuses, backwards is shown as such, pending
plans shown and cleared), peek (text, hex, empty ranges, missing streams), stream delete, TLS flags
and their RMQS_* variables, --version and completion. Prompts on a terminal are driven through
typer's CliRunner (a subprocess has no terminal). No output ever holds the password.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pyspark_rmqs.cli import app as cli
from pyspark_rmqs.cli import common as cli_common
from pyspark_rmqs.cli.watermark import pending_ranges
from pyspark_rmqs.jobs import plan_read
from tests.support.broker import REPO, BrokerSettings
from tests.support.data import client, conn_of, publish, publish_keyed

pytestmark = pytest.mark.timeout(300)

RMQS = Path(sys.executable).parent / "rmqs"
TLS_PORT = 5551


def rmqs(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`.venv/bin/rmqs ARGS` without a terminal on stdin; no RMQS_* from the caller's environment."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RMQS_")}
    return subprocess.run(
        [str(RMQS), *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**base, **(env or {})},
        cwd=cwd,
        timeout=180,
    )


def conn_args(b: BrokerSettings) -> list[str]:
    return ["--endpoints", f"{b.host}:{b.port}", "--username", b.username, "--password", b.password]


def ok(r: subprocess.CompletedProcess[str], code: int = 0) -> subprocess.CompletedProcess[str]:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    return r


def stored(b: BrokerSettings, consumer: str, streams: list[str]) -> dict[str, int | None]:
    return client(b).stored_offsets(consumer, streams)


# ------------------------------------------------------------------------------ version, help


def test_version_help_and_completion() -> None:
    from importlib.metadata import version

    r = ok(rmqs("--version"))
    assert r.stdout.strip() == f"rmqs {version('rmqs')}"
    r = ok(rmqs("--help"))
    for word in ("--install-completion", "--show-completion", "watermark", "peek", "stream", "--version"):
        assert word in r.stdout
    r = ok(rmqs("--show-completion", "bash"))
    assert "_RMQS_COMPLETE" in r.stdout
    r = ok(rmqs("lag", "--help"))
    for flag in ("--max-lag", "--tls", "--ca-file", "--cert-file", "--key-file", "--trust-all", "RMQS_URI"):
        assert flag in r.stdout
    ok(rmqs("lag", "--stream", "s", "--consumer", "c", "--max-lag", "-1"), 2)  # a usage error is click's 2


# ----------------------------------------------------------------------------------------- lag


def test_lag_max_lag_exit_codes(broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    publish(broker, s, [b"x"] * 30)
    client(broker).store_offsets("cron", {s: 9})  # lag 20
    a = ["lag", "--stream", s, "--consumer", "cron", *conn_args(broker)]
    ok(rmqs(*a, "--max-lag", "20"), 0)
    ok(rmqs(*a, "--max-lag", "1000"), 0)
    r = ok(rmqs(*a, "--max-lag", "19"), cli_common.EXIT_LAG)
    assert cli_common.EXIT_LAG == 3
    assert f"total lag 20 of 'cron' on {s} is above --max-lag 19" in r.stderr
    r = ok(rmqs(*a, "--max-lag", "0", "--json"), 3)
    data = json.loads(r.stdout)
    assert (data["total_lag"], data["max_lag"], data["over_max_lag"]) == (20, 0, True)
    assert data["partitions"][0] == {
        "stream": s,
        "first": 0,
        "tail": 30,
        "stored": 9,
        "next_offset": 10,
        "lag": 20,
    }
    data = json.loads(ok(rmqs(*a, "--json")).stdout)
    assert (data["max_lag"], data["over_max_lag"]) == (None, False)
    r = ok(
        rmqs(
            "lag", "--stream", "no-such-stream-cli2", "--consumer", "c", *conn_args(broker), "--max-lag", "0"
        ),
        1,
    )
    assert "stream 'no-such-stream-cli2' does not exist" in r.stderr
    r = ok(
        rmqs("lag", "--stream", s, "--consumer", "c", "--endpoints", "127.0.0.1:5999", "--max-lag", "0"), 1
    )
    assert "could not connect to RabbitMQ Streams at 127.0.0.1:5999" in r.stderr


# ----------------------------------------------------------------------------------- watermark


def test_watermark_set_dry_run_confirmation_and_backwards(broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    name, parts = streams.super_stream(3)
    publish_keyed(broker, name, [(f"k{i}", b"m") for i in range(300)])
    tails = client(broker).tails(parts)
    a = ["--superstream", name, "--consumer", "ops", *conn_args(broker)]

    r = ok(rmqs("watermark", "set", *a, "--to", "latest", "--dry-run", "--json"))
    move = json.loads(r.stdout)
    assert (move["dry_run"], move["applied"], move["to"]) == (True, False, "latest")
    assert [(p["stream"], p["current"], p["new"], p["change"]) for p in move["partitions"]] == [
        (p, None, tails[p] - 1, "forward") for p in parts
    ]
    assert move["total_lag_before"] == 300 and move["total_lag_after"] == 0
    assert stored(broker, "ops", parts) == dict.fromkeys(parts)  # a dry run changes nothing

    r = ok(rmqs("watermark", "set", *a, "--to", "latest"), 1)  # no --yes, no terminal: refused
    assert "refusing without --yes" in r.stderr
    assert stored(broker, "ops", parts) == dict.fromkeys(parts)

    ok(rmqs("watermark", "set", *a, "--to", "latest", "--yes"))
    assert stored(broker, "ops", parts) == {p: tails[p] - 1 for p in parts}
    assert json.loads(ok(rmqs("lag", *a, "--json", "--max-lag", "0")).stdout)["total_lag"] == 0

    r = ok(rmqs("watermark", "set", *a, "--to", "5", "--dry-run"))  # backwards: shown, not done
    assert "BACKWARD" in r.stdout and "dry run: nothing was changed" in r.stdout
    assert stored(broker, "ops", parts) == {p: tails[p] - 1 for p in parts}
    r = ok(rmqs("watermark", "set", *a, "--to", "5", "--yes", "--json"))
    move = json.loads(r.stdout)
    assert move["applied"] and {p["change"] for p in move["partitions"]} == {"backward"}
    assert stored(broker, "ops", parts) == dict.fromkeys(parts, 4)
    lag = json.loads(ok(rmqs("lag", *a, "--json")).stdout)
    assert lag["total_lag"] == sum(tails[p] - 5 for p in parts)

    # offsets JSON moves only the partitions it names; a datetime after the last message is the tail
    r = ok(rmqs("watermark", "set", *a, "--to", json.dumps({parts[1]: 7}), "--yes"))
    assert stored(broker, "ops", parts) == {parts[0]: 4, parts[1]: 6, parts[2]: 4}
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    ok(rmqs("watermark", "set", *a, "--to", later, "--yes"))
    assert stored(broker, "ops", parts) == {p: tails[p] - 1 for p in parts}

    r = ok(rmqs("watermark", "set", *a, "--to", "yesterday-ish", "--dry-run"), 1)
    assert "--to must be earliest, latest, an offset" in r.stderr
    r = ok(rmqs("watermark", "set", *a, "--to", '{"not-a-partition": 3}', "--dry-run"), 1)
    assert "'not-a-partition', not a partition stream" in r.stderr


def test_watermark_show_and_set_clear_pending_plans(broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    publish(broker, s, [b"x"] * 40)
    client(broker).store_offsets("etl", {s: 9})
    conn = conn_of(broker)
    plan_read(conn, stream=s, consumer="etl").release()  # a run that planned [10, 40) and then died
    a = ["--stream", s, "--consumer", "etl", *conn_args(broker)]
    show = json.loads(ok(rmqs("watermark", "show", *a, "--json")).stdout)
    assert show["partitions"] == [
        {
            "stream": s,
            "first": 0,
            "tail": 40,
            "watermark": 9,
            "next_offset": 10,
            "lag": 30,
            "pending_plan": {"start": 10, "end": 40},
        }
    ]
    assert "[10, 40)" in ok(rmqs("watermark", "show", *a)).stdout
    r = ok(rmqs("watermark", "set", *a, "--to", "20", "--dry-run"))
    assert "pending plan [10, 40) dropped" in r.stdout
    ok(rmqs("watermark", "set", *a, "--to", "20", "--yes"))  # the plan is stale now
    # Back to 9: the old run's record was settled by `set`, so its plan never comes back.
    ok(rmqs("watermark", "set", *a, "--to", "10", "--yes"))
    assert stored(broker, "etl", [s]) == {s: 9}
    assert pending_ranges(conn, "etl", s) == {}
    assert (
        json.loads(ok(rmqs("watermark", "show", *a, "--json")).stdout)["partitions"][0]["pending_plan"]
        is None
    )
    assert plan_read(conn, stream=s, consumer="etl").ranges == {s: (10, 40)}  # a fresh plan, not the old


def test_watermark_set_refuses_before_offset_zero(broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    publish(broker, s, [b"x"] * 5)
    a = ["--stream", s, "--consumer", "z", *conn_args(broker)]
    r = ok(rmqs("watermark", "set", *a, "--to", "earliest", "--dry-run"))  # nothing stored: nothing to do
    assert "unchanged" in r.stdout
    client(broker).store_offsets("z", {s: 3})
    r = ok(rmqs("watermark", "set", *a, "--to", "earliest", "--yes"), 1)
    assert "RabbitMQ cannot remove a stored offset" in r.stderr
    assert stored(broker, "z", [s]) == {s: 3}


def test_watermark_set_prompts_on_a_terminal(broker: BrokerSettings, streams, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    publish(broker, s, [b"x"] * 10)
    monkeypatch.setattr(cli_common, "stdin_is_tty", lambda: True)
    runner = CliRunner()
    a = ["watermark", "set", "--stream", s, "--consumer", "tty", "--to", "4", *conn_args(broker)]
    r = runner.invoke(cli.app, a, input="n\n")
    assert r.exit_code == 1 and "Move the watermark of 'tty'" in r.output and "cancelled" in r.output
    assert stored(broker, "tty", [s]) == {s: None}
    r = runner.invoke(cli.app, a, input="y\n")
    assert r.exit_code == 0, r.output
    assert stored(broker, "tty", [s]) == {s: 3}
    r = runner.invoke(
        cli.app, [*a[: -len(conn_args(broker)) - 2], "--to", "1", *conn_args(broker)], input="y\n"
    )
    assert r.exit_code == 0 and "BACKWARDS" in r.output, r.output
    assert stored(broker, "tty", [s]) == {s: 0}


# ---------------------------------------------------------------------------------------- peek


def test_peek(broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    ok(rmqs("publish", "--stream", s, "--count", "5", *conn_args(broker)))
    publish(broker, s, [b"\xff\x00binary"])
    a = ["peek", "--stream", s, *conn_args(broker)]
    out = json.loads(ok(rmqs(*a, "--count", "3", "--json")).stdout)
    assert (out["target"], out["from"], out["count"], out["notes"]) == (s, "earliest", 3, [])
    msgs = out["messages"]
    assert [m["offset"] for m in msgs] == [0, 1, 2]
    first = msgs[0]
    assert set(first) == {
        "stream",
        "offset",
        "chunk_timestamp",
        "properties",
        "application_properties",
        "body",
        "body_encoding",
    }
    assert first["properties"]["message_id"] == "o-0000000"
    assert first["properties"]["content_type"] == "application/json"
    assert set(first["application_properties"]) == {"region", "routing_key"}
    assert json.loads(first["body"])["order_id"] == "o-0000000" and first["body_encoding"] == "utf-8"
    datetime.fromisoformat(first["chunk_timestamp"])

    last = json.loads(ok(rmqs(*a, "--from", "latest", "--count", "1", "--json")).stdout)["messages"]
    assert [(m["offset"], m["body"], m["body_encoding"]) for m in last] == [
        (5, b"\xff\x00binary".hex(), "hex")
    ]
    text = ok(rmqs(*a, "--from", "4", "--count", "3")).stdout
    assert f"{s} offset 4" in text and f"{s} offset 5" in text and "body (hex): ff00" in text
    assert "offset 3" not in text

    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    r = ok(rmqs(*a, "--from", later, "--json"))
    assert json.loads(r.stdout)["messages"] == [] and "no messages from offset 6" in r.stderr
    r = ok(rmqs(*a, "--from", "100"))
    assert r.stdout == "" and "no messages from offset 100 (the tail is 6)" in r.stderr
    r = ok(rmqs("peek", "--stream", "no-such-stream-peek", *conn_args(broker)), 1)
    assert "stream 'no-such-stream-peek' does not exist" in r.stderr
    r = ok(rmqs("peek", "--stream", streams.stream(), *conn_args(broker)))
    assert "is empty" in r.stderr
    r = ok(rmqs(*a, "--from", "soon"), 1)
    assert "--from must be earliest, latest" in r.stderr


def test_peek_a_super_stream(broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    name, parts = streams.super_stream(3)
    publish_keyed(broker, name, [(f"k{i}", f"m{i}".encode()) for i in range(60)])
    out = json.loads(
        ok(rmqs("peek", "--superstream", name, "--count", "2", "--json", *conn_args(broker))).stdout
    )
    assert [(m["stream"], m["offset"]) for m in out["messages"]] == [(p, o) for p in parts for o in (0, 1)]
    assert out["superstream"] is True


# ------------------------------------------------------------------------------ stream delete


def test_stream_delete(broker: BrokerSettings, streams, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    publish(broker, s, [b"x"] * 3)
    r = ok(rmqs("stream", "delete", "--stream", s, *conn_args(broker)), 1)
    assert "refusing without --yes" in r.stderr and client(broker).stream_exists(s)
    r = ok(rmqs("stream", "delete", "--stream", s, "--yes", "--json", *conn_args(broker)))
    assert json.loads(r.stdout) == {"target": s, "superstream": False, "deleted": [s]}
    assert not client(broker).stream_exists(s)
    r = ok(rmqs("stream", "delete", "--stream", s, "--yes", *conn_args(broker)), 1)
    assert f"stream '{s}' does not exist" in r.stderr

    name, parts = streams.super_stream(2)
    r = ok(rmqs("stream", "delete", "--superstream", name, "--yes", *conn_args(broker)))
    assert parts[0] in r.stdout
    assert not any(client(broker).stream_exists(p) for p in parts)

    t = streams.stream()
    monkeypatch.setattr(cli_common, "stdin_is_tty", lambda: True)
    runner = CliRunner()
    r = runner.invoke(cli.app, ["stream", "delete", "--stream", t, *conn_args(broker)], input="n\n")
    assert r.exit_code == 1 and "cannot be undone" in r.output and client(broker).stream_exists(t)
    r = runner.invoke(cli.app, ["stream", "delete", "--stream", t, *conn_args(broker)], input="y\n")
    assert r.exit_code == 0, r.output
    assert not client(broker).stream_exists(t)


def test_create_publish_and_offsets_print_json(broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()  # exists already: create is idempotent
    assert json.loads(ok(rmqs("create", "--stream", s, "--json", *conn_args(broker))).stdout) == {
        "target": s,
        "superstream": False,
        "partitions": [s],
    }
    out = json.loads(ok(rmqs("publish", "--stream", s, "--count", "7", "--json", *conn_args(broker))).stdout)
    assert (out["target"], out["published"]) == (s, 7)
    rows = json.loads(ok(rmqs("offsets", "--stream", s, "--json", *conn_args(broker))).stdout)
    assert [(r["stream"], r["first_offset"], r["tail"]) for r in rows] == [(s, 0, 7)]


# ------------------------------------------------------------------------------ TLS and secrets


@pytest.fixture(scope="module")
def tls_dir(broker: BrokerSettings) -> Path:
    if broker.external:
        pytest.skip("RMQS_TEST_URI is set: the TLS tests need the local broker's test CA and TLS listener")
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "broker.sh"), "tls-dir"], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    socket.create_connection(("127.0.0.1", TLS_PORT), timeout=3).close()
    return Path(out.stdout.strip())


def test_tls_flags_and_environment(broker: BrokerSettings, streams, tls_dir: Path) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    publish(broker, s, [b"x"] * 4)
    creds = ["--username", broker.username, "--password", broker.password]
    base = [
        "lag",
        "--stream",
        s,
        "--consumer",
        "tls",
        "--endpoints",
        f"localhost:{TLS_PORT}",
        *creds,
        "--json",
    ]
    r = ok(rmqs(*base, "--tls", "--ca-file", str(tls_dir / "ca.pem")))
    assert json.loads(r.stdout)["total_lag"] == 4
    ok(
        rmqs(
            *base,
            "--ca-file",
            str(tls_dir / "ca.pem"),
            "--cert-file",
            str(tls_dir / "client.pem"),
            "--key-file",
            str(tls_dir / "client.key"),
        )
    )
    env = {
        "RMQS_TLS": "true",
        "RMQS_CA_FILE": str(tls_dir / "ca.pem"),
        "RMQS_ENDPOINTS": f"localhost:{TLS_PORT}",
    }
    ok(rmqs("lag", "--stream", s, "--consumer", "tls", *creds, env=env))
    r = ok(rmqs(*base, "--tls"), 1)  # the test CA is not trusted by default
    assert "TLS certificate verification failed" in r.stderr
    r = ok(rmqs(*base, "--trust-all"))
    assert "--trust-all" in r.stderr and "not verified" in r.stderr and json.loads(r.stdout)["total_lag"] == 4
    r = ok(rmqs("peek", "--stream", s, "--count", "1", "--json", *base[5:-1], "--trust-all"))
    assert len(json.loads(r.stdout)["messages"]) == 1


def test_no_output_holds_the_password(broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    secret = "pa:ss@w0rd/Sécret"
    from urllib.parse import quote

    uri = f"rabbitmq-stream://guest:{quote(secret, safe='')}@127.0.0.1:5999/%2F"
    runs = [
        rmqs("lag", "--stream", "s", "--consumer", "c", "--uri", uri),
        rmqs("watermark", "set", "--stream", "s", "--consumer", "c", "--to", "1", "--uri", uri),
        rmqs("peek", "--stream", "s", env={"RMQS_URI": uri}),
        rmqs(
            "stream",
            "delete",
            "--stream",
            "s",
            "--yes",
            "--password",
            secret,
            "--endpoints",
            "127.0.0.1:5999",
        ),
        rmqs("lag", "--help", env={"RMQS_URI": uri, "RMQS_PASSWORD": secret}),
        rmqs(
            "lag",
            "--stream",
            streams.stream(),
            "--consumer",
            "c",
            "--endpoints",
            f"{broker.host}:{broker.port}",
            "--password",
            secret,
        ),  # wrong password: refused
    ]
    for r in runs:
        text = r.stdout + r.stderr
        assert secret not in text and quote(secret, safe="") not in text, text
        assert "Traceback" not in text
    assert runs[0].returncode == 1 and "127.0.0.1:5999" in runs[0].stderr
    assert runs[5].returncode == 1 and "refused user 'guest'" in runs[5].stderr


# ---------------------------------------------------------------------- outside a checkout


def test_broker_and_demo_explain_themselves_outside_a_checkout(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(cli, "checkout_root", lambda: None)
    runner = CliRunner()
    for words in (["broker", "status"], ["broker", "up"], ["demo"]):
        r = runner.invoke(cli.app, words)
        assert r.exit_code == 1, r.output
        assert "needs a checkout of the rmqs repository" in r.output and "RMQS_URI" in r.output
    from pyspark_rmqs.cli import demo

    monkeypatch.setattr(cli_common, "checkout_root", lambda: None)
    assert demo.run_demo() == 1


def test_broker_status_from_another_directory(broker: BrokerSettings, tmp_path: Path) -> None:
    if broker.external:
        pytest.skip("the local broker is not used")
    # scripts/broker.sh's own settings (where its broker lives, its ports) describe this machine, not
    # the CLI's flags: they pass through (a broker under another RMQS_BROKER_HOME is still ours).
    own = ("RMQS_BROKER_", "RMQS_EPMD_PORT", "RMQS_STREAM_", "RMQS_AMQP_PORT", "RMQS_MANAGEMENT_PORT")
    env = {k: v for k, v in os.environ.items() if k.startswith(own)}
    r = rmqs("broker", "status", cwd=tmp_path, env=env)  # the checkout is found beside the package
    assert r.returncode == 0 and "running" in r.stdout, r.stdout + r.stderr
