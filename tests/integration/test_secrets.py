"""The password never shows: not in option reprs, logs (rstream's DEBUG frames included), nor in a
Spark checkpoint or its output. Exception messages are covered by test_connect_errors.py.

A dedicated broker user with a distinctive password makes any leak findable by plain search
("guest" would match the user name). It is created on the local broker with `broker.sh ctl` and
deleted after, so these broker tests are skipped when RMQS_TEST_URI names another broker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pytest

from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.broker.connect import connect
from pyspark_rmqs.broker.reader import RangeReader, ReadSettings
from pyspark_rmqs.broker.writer import StreamProducer, WriteSettings
from pyspark_rmqs.core import codec
from pyspark_rmqs.core.errors import AuthenticationError
from pyspark_rmqs.options import parse_connection_options, parse_sink_options, parse_source_options
from tests.support.broker import BrokerSettings, ctl
from tests.support.data import publish

pytestmark = pytest.mark.timeout(300)

USER = "rmqs-secret-user"
PASSWORD = "S3cr3t-Unique-PW"
EXTERNAL = bool(os.environ.get("RMQS_TEST_URI"))


@pytest.fixture(scope="module")
def secret_user(broker: BrokerSettings) -> Iterator[BrokerSettings]:
    """Settings of a user with PASSWORD and full permissions on '/' of the local broker."""
    if EXTERNAL:
        pytest.skip("RMQS_TEST_URI is set: cannot create users on that broker")
    ctl("delete_user", USER)  # left over by an interrupted run
    for args in (("add_user", USER, PASSWORD), ("set_permissions", "-p", "/", USER, ".*", ".*", ".*")):
        out = ctl(*args)
        assert out.returncode == 0, out.stderr
    yield BrokerSettings(host=broker.host, port=broker.port, username=USER, password=PASSWORD, vhost="/")
    ctl("delete_user", USER)


# --------------------------------------------------------------------------------------------- reprs


def test_option_models_never_show_the_password() -> None:
    uri = f"rabbitmq-stream+tls://{USER}:{quote(PASSWORD)}@h:5551/v"
    stores = {
        "tls.truststore": "/t.jks",
        "tls.truststorePassword": PASSWORD + "-trust",
        "tls.keystore": "/k.p12",
        "tls.keystorePassword": PASSWORD + "-key",
    }
    models: list[Any] = []
    for address in ({"uris": uri}, {"endpoints": "h", "tls": "true", "password": PASSWORD}):
        models.append(parse_connection_options({**address, **stores}))
        models.append(parse_source_options({**address, **stores, "stream": "s"}, streaming=True))
        models.append(parse_source_options({**address, **stores, "superstream": "s"}, streaming=False))
        models.append(parse_sink_options({**address, **stores, "stream": "s"}))
    for model in models:
        connection = getattr(model, "connection", model)
        assert connection.password.get_secret_value() == PASSWORD
        for text in (
            repr(model),
            str(model),
            f"{model}",
            model.model_dump_json(),
            str(model.model_dump()),
            repr(connection),
            str(connection.uris),
            str(connection.addresses()),
        ):
            assert PASSWORD not in text, text


def test_pickled_options_round_trip_with_the_secret() -> None:
    """Executors get the options by pickle: the secret must survive it (and only there is it whole)."""
    o = parse_source_options({"endpoints": "h", "password": PASSWORD, "stream": "s"}, streaming=True)
    assert pickle.loads(pickle.dumps(o)).connection.password.get_secret_value() == PASSWORD


# --------------------------------------------------------------------------------------------- logs


def _leaks(caplog: pytest.LogCaptureFixture, secret: str) -> list[str]:
    found = [r.getMessage() for r in caplog.records if secret in r.getMessage() or secret in repr(r.__dict__)]
    if secret in caplog.text:  # formatted records, tracebacks included
        found.append(caplog.text)
    return found


def test_debug_logs_never_show_the_password(
    secret_user: BrokerSettings, streams: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # root: every logger, rstream's and asyncio's included
    for name in ("rstream", "rstream.client", "pyspark_rmqs"):
        caplog.set_level(logging.DEBUG, logger=name)
    s = streams.stream("secret-logs")
    # an address spelled for this test alone, so the pool opens (and logs) fresh connections
    conn = parse_connection_options(
        {"endpoints": f"127.0.0.1:{secret_user.port}", "username": USER, "password": PASSWORD}
    )
    client = BrokerClient(conn)
    assert client.tail(s) == 0
    values = [f"v{i}".encode() for i in range(10)]
    with StreamProducer(conn, s, superstream=False, settings=WriteSettings()) as producer:
        producer.send([codec.encode(v) for v in values])
        producer.flush()
    batches = list(RangeReader(conn, s, 0, 10, ReadSettings(metadata_fields=("properties",))))
    assert pa.Table.from_batches(batches).column("value").to_pylist() == values
    wrong = parse_connection_options(
        {"endpoints": f"127.0.0.1:{secret_user.port}", "username": USER, "password": PASSWORD + "-wrong"}
    )
    with pytest.raises(AuthenticationError):
        BrokerClient(wrong).tail(s)

    assert any("SaslAuthenticate(<redacted>)" in r.getMessage() for r in caplog.records), (
        "rstream no longer logs its SASL frame: re-check connect.py's _RedactSaslFrames"
    )
    assert any(r.name.startswith("rstream") and r.levelno == logging.DEBUG for r in caplog.records)
    assert _leaks(caplog, PASSWORD) == []


def test_the_redaction_filter_is_what_keeps_the_password_out(
    secret_user: BrokerSettings, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without connect.py's filter rstream logs the password: the test above is not vacuous."""
    monkeypatch.setattr(logging.getLogger("rstream.client"), "filters", [])
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="rstream.client")
    conn = parse_connection_options(
        {"endpoints": f"localhost:{secret_user.port}", "username": USER, "password": PASSWORD}
    )

    async def open_and_close() -> None:  # a connection of its own, not the pool's
        client = await connect(conn)
        await client.close()

    asyncio.run(open_and_close())
    assert _leaks(caplog, PASSWORD), (
        "expected rstream's unfiltered SaslAuthenticate frame to hold the password"
    )


# --------------------------------------------------------------------------------------------- Spark


@pytest.mark.parametrize("form", ["password-option", "uri"])
def test_checkpoint_and_output_never_hold_the_password(
    spark: Any, secret_user: BrokerSettings, broker: BrokerSettings, streams: Any, tmp_path: Path, form: str
) -> None:
    s = streams.stream("secret-ckpt")
    publish(broker, s, [f"m{i}".encode() for i in range(20)])
    if form == "uri":
        where = {"uris": f"rabbitmq-stream://{USER}:{quote(PASSWORD)}@{broker.host}:{broker.port}/%2F"}
    else:
        where = {"endpoints": f"{broker.host}:{broker.port}", "username": USER, "password": PASSWORD}
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    q = (
        spark.readStream.format("rabbitmq_streams")
        .options(**where, stream=s, metadataFields="")
        .load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert q.awaitTermination(180), "AvailableNow query did not finish"
        assert q.exception() is None, q.exception()
        progress = "\n".join(getattr(p, "json", None) or json.dumps(p, default=str) for p in q.recentProgress)
    finally:
        q.stop()
    assert spark.read.parquet(str(out)).count() == 20

    files = [p for p in [*ckpt.rglob("*"), *out.rglob("*")] if p.is_file()]
    assert any(p.parent.name == "offsets" for p in files), sorted(map(str, files))
    assert any(s.encode() in p.read_bytes() for p in files if p.parent.name == "offsets")
    holding = [str(p) for p in files if PASSWORD.encode() in p.read_bytes()]
    assert holding == []
    assert s in progress and PASSWORD not in progress  # progress names the source's offsets, not its options
    assert PASSWORD not in str(q.status) and PASSWORD not in (q.name or "")


# --------------------------------------------------------------------------------------------- plans

# Reserved characters in user-info, then unicode: each must survive the URI (percent-encoded) and
# the `password` option, and never show.
PLAN_PASSWORD = "Pl4n/se@cr:et#?%-ünï"


@pytest.mark.parametrize("form", ["password-option", "uri", "uri-raw-reserved"])
def test_spark_plan_never_shows_the_password(
    spark: Any, broker: BrokerSettings, streams: Any, capsys: pytest.CaptureFixture[str], form: str
) -> None:
    """`df.explain()` of a read (every mode) holds no password, in any of the forms users give it."""
    s = streams.stream("secret-plan")
    publish(broker, s, [b"m"])
    host = f"{broker.host}:{broker.port}"
    if form == "uri":
        where = {"uris": f"rabbitmq-stream://guest:{quote(PLAN_PASSWORD, safe='')}@{host}/%2F"}
    elif form == "uri-raw-reserved":  # typed without percent-encoding: the parse fails, and says so
        where = {"uris": f"rabbitmq-stream://guest:{PLAN_PASSWORD}@{host}/%2F"}
    else:
        where = {"endpoints": host, "username": "guest", "password": PLAN_PASSWORD}
    reader = spark.read.format("rabbitmq_streams").options(**where, stream=s, metadataFields="")
    if form == "uri-raw-reserved":  # not percent-encoded: the URI cannot be parsed, and the error says so
        with pytest.raises(Exception, match="option 'uris' has an invalid URI") as failed:
            reader.load()
        texts = [str(failed.value), capsys.readouterr().out]
    else:
        df = reader.load()
        texts = []
        for mode in ("simple", "extended", "codegen", "cost", "formatted"):
            df.explain(mode=mode)
            texts.append(capsys.readouterr().out)
        assert all("rabbitmq_streams" in t or "PythonDataSource" in t or "BatchScan" in t for t in texts), (
            texts
        )
    for text in texts:
        for spelling in (PLAN_PASSWORD, quote(PLAN_PASSWORD, safe=""), "se@cr:et", "cr:et#?%-ünï"):
            assert spelling not in text, (spelling, text)


WRONG_PASSWORD = "Wr0ng-Spark-Pw-5d1e"


@pytest.mark.spark
def test_wrong_credentials_fail_a_spark_read_a_streaming_query_and_a_write_without_the_password(
    spark: Any, broker: BrokerSettings, streams: Any
) -> None:
    """A wrong password fails each Spark path with `AuthenticationError` (never retried as transient),
    and neither the message nor the traceback holds the password; the write stored nothing. (The
    connection layer's own errors are pinned in test_connect_errors.py; this is what a Spark user,
    and an orchestrator classifying the failure, get.)"""
    import traceback

    from pyspark_rmqs.errors import classify

    s = streams.stream("wrong-creds")
    publish(broker, s, [b"m"] * 10)
    wrong = {
        "endpoints": f"{broker.host}:{broker.port}",
        "username": broker.username,
        "password": WRONG_PASSWORD,
    }
    failures: dict[str, BaseException] = {}

    def fails(what: str, action: Any) -> None:
        with pytest.raises(Exception) as failed:
            action()
        failures[what] = failed.value

    fails("read", lambda: spark.read.format("rabbitmq_streams").options(**wrong, stream=s).load().collect())

    def stream() -> None:
        q = (
            spark.readStream.format("rabbitmq_streams")
            .options(**wrong, stream=s)
            .load()
            .writeStream.format("noop")
            .trigger(availableNow=True)
            .start()
        )
        try:
            q.awaitTermination(120)
        finally:
            q.stop()

    fails("streaming", stream)
    df = spark.range(3).selectExpr("cast(id as string) as value")
    fails(
        "write", lambda: df.write.format("rabbitmq_streams").options(**wrong, stream=s).mode("append").save()
    )
    for what, e in failures.items():
        text = str(e) + "".join(traceback.format_exception(e))
        assert "AuthenticationError" in str(e), (what, str(e)[:2000])
        assert WRONG_PASSWORD not in text, what
        c = classify(e)
        assert c.error == "AuthenticationError" and not c.retryable, (what, c)
    assert BrokerClient(parse_connection_options(wrong | {"password": broker.password})).tail(s) == 10
