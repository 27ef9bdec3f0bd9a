"""Resources map settings faithfully, the example definitions load, and the password never leaks."""

import base64
import importlib
import json
import logging
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import DagsterInstance, Definitions, EnvVar, materialize
from pyspark.sql import SparkSession

from dagster_rmqs import RabbitMQStreamsResource, SparkSessionResource, build_stream_asset
from pyspark_rmqs import jobs
from pyspark_rmqs.core.errors import ConfigurationError
from tests.conftest import StreamFactory
from tests.dagster.conftest import resource_of
from tests.support.broker import BrokerSettings
from tests.support.data import publish

pytestmark = pytest.mark.dagster


def test_resource_settings_become_connection_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RMQS_DG_UNIT_PASSWORD", "from-env")
    plain = RabbitMQStreamsResource(
        endpoints="h1:5552,h2", username="u", password=EnvVar("RMQS_DG_UNIT_PASSWORD")
    )
    conn = plain.connection_options()  # an EnvVar also resolves outside a run
    assert conn.addresses() == [("h1", 5552), ("h2", 5552)] and conn.username == "u"
    assert conn.password.get_secret_value() == "from-env" and conn.vhost == "/"
    tls = RabbitMQStreamsResource(uris="rabbitmq-stream+tls://v:pw@h:5551/prod", tls_trust_all=True)
    conn = tls.connection_options()
    assert (conn.tls, conn.tls_trust_all, conn.username, conn.vhost) == (True, True, "v", "prod")
    assert conn.password.get_secret_value() == "pw"
    assert tls.stream_uri("orders") == "rabbitmq-stream://h:5551/prod/orders"
    assert tls.spark_options(superstream="orders", consumerName="c")["superstream"] == "orders"
    with pytest.raises(ConfigurationError, match="endpoints"):
        RabbitMQStreamsResource().connection_options()


def test_spark_session_resource_is_local_by_default_or_spark_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, object]] = []

    def fake_session(**kw: object) -> str:
        calls.append(kw)
        return "session"

    monkeypatch.setattr(jobs, "spark_session", fake_session)
    assert SparkSessionResource(spark_conf={"a": "b"}).get_session() == "session"
    SparkSessionResource(remote="sc://spark:15002").get_session()
    SparkSessionResource(remote="sc://spark:15002", reuse_session=False).get_session()
    local = {"master": "local[2]", "conf": {"a": "b"}, "remote": None, "app": "rmqs-dagster"}
    remote = {"master": None, "conf": {}, "remote": "sc://spark:15002", "app": "rmqs-dagster"}
    assert calls == [
        {**local, "reuse_session": True},
        {**remote, "reuse_session": True},  # steps share the server's session (issue 43)
        {**remote, "reuse_session": False},
    ]


def test_example_definitions_are_loadable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RMQS_URI", "rabbitmq-stream://demo:s3cret@broker.example:5552/%2F")
    monkeypatch.setenv("RMQS_DEMO_SUPERSTREAM", "orders-test")
    import dagster_rmqs.examples.definitions as example

    example = importlib.reload(example)
    Definitions.validate_loadable(example.defs)
    assert example.orders.metadata_by_key[example.orders.key]["rmqs/superstream"] == "orders-test"
    resources = example.defs.resources or {}
    assert isinstance(resources["spark"], SparkSessionResource)
    assert isinstance(resources["rabbitmq"].uris, EnvVar)  # the definitions hold the name, not the password
    monkeypatch.delenv("RMQS_URI")
    monkeypatch.delenv("RMQS_DEMO_SUPERSTREAM")
    example = importlib.reload(example)  # defaults: the local broker, super stream "orders"
    Definitions.validate_loadable(example.defs)
    conn = example.rabbitmq_resource().connection_options()
    assert conn.addresses() == [("localhost", 5552)] and conn.vhost == "/"
    assert example.orders.metadata_by_key[example.orders.key]["rmqs/superstream"] == "orders"


def _management(b: BrokerSettings, method: str, path: str, body: dict[str, object] | None = None) -> None:
    auth = base64.b64encode(f"{b.username}:{b.password}".encode()).decode()
    req = urllib.request.Request(
        f"http://{b.host}:15672/api/{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"Basic {auth}", "Content-Type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=10).close()


@pytest.fixture
def secret_user(broker: BrokerSettings) -> Iterator[tuple[str, str]]:
    """A broker user whose password is a unique string (guest/guest would hide a leak)."""
    user, password = f"dg-{uuid.uuid4().hex[:8]}", f"pw-{uuid.uuid4().hex}"
    try:
        _management(broker, "PUT", f"users/{user}", {"password": password, "tags": ""})
    except (urllib.error.URLError, OSError) as e:
        pytest.skip(f"the management API is not reachable to create a user: {e}")
    vhost = urllib.parse.quote(broker.vhost, safe="")
    _management(
        broker, "PUT", f"permissions/{vhost}/{user}", {"configure": ".*", "write": ".*", "read": ".*"}
    )
    yield user, password
    _management(broker, "DELETE", f"users/{user}")


def test_the_password_never_appears_in_metadata_events_logs_or_reprs(
    spark: SparkSession,
    broker: BrokerSettings,
    streams: StreamFactory,
    secret_user: tuple[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    user, password = secret_user
    monkeypatch.setenv("RMQS_DG_TEST_PASSWORD", password)
    s = streams.stream()
    publish(broker, s, [b"secret-test"] * 10)
    rabbitmq = resource_of(broker, username=user, password=EnvVar("RMQS_DG_TEST_PASSWORD"))
    uri_resource = RabbitMQStreamsResource(
        uris=f"rabbitmq-stream://{user}:{password}@{broker.host}:{broker.port}/%2F"
    )
    ok = build_stream_asset("secretive", stream=s, consumer_name="dgs", output_path=str(tmp_path / "o"))
    missing = build_stream_asset("absent", stream=f"{s}-absent", consumer_name="dgs", output_path="/tmp/x")
    caplog.set_level(logging.DEBUG)

    instance = DagsterInstance.ephemeral()
    results = [
        materialize([ok], instance=instance, resources={"rabbitmq": rabbitmq, "spark": spark}),
        materialize(
            [missing],
            instance=instance,
            resources={"rabbitmq": uri_resource, "spark": spark},
            raise_on_error=False,
        ),
    ]
    assert results[0].success and not results[1].success
    assert rabbitmq.stored_offsets("dgs", stream=s) == {s: 9}  # the secret password really connected
    # py4j's own DEBUG wire trace echoes every Spark option sent to the JVM (any connector's password
    # too); everything else, at DEBUG, from rmqs, rstream, Dagster and Spark, must stay clean.
    records = [r for r in caplog.records if not r.name.startswith("py4j")]
    assert any(r.name.startswith("rstream") for r in records)
    texts = [
        *(f"{r.getMessage()} {r.exc_text or ''}" for r in records),
        repr(uri_resource),
        repr(rabbitmq.connection_options()),
        str(uri_resource),
    ]
    logs = [entry for r in results for entry in instance.all_logs(r.run_id)]
    assert any("reading stream" in (e.user_message or "") for e in logs)  # context.log lines are in
    assert any("StreamNotFoundError" in repr(e) for e in logs)  # and so is the failure
    texts += [repr(e) for e in logs]
    leaks = [t for t in texts if password in t]
    assert not leaks
    assert "***" in repr(uri_resource)


def test_errors_that_crossed_spark_are_classified_by_their_rmqs_class() -> None:
    from dagster import Failure

    from dagster_rmqs.assets import _failures

    wrapped = (
        "PythonException:\n  pyspark_rmqs.core.errors.DataLossError: offsets [0, 5) of 's' were removed\n..."
    )
    with pytest.raises(Failure, match=r"^DataLossError: offsets \[0, 5\)") as failure, _failures():
        raise RuntimeError(wrapped)
    assert failure.value.allow_retries is False
    with pytest.raises(RuntimeError, match="MetadataError"), _failures():  # not ours: retry policy applies
        raise RuntimeError("SomeMetadataError: transient")


RESERVED_PASSWORD = "Dg/se@cr:et#?%-ünï-Pw"


def _spellings(secret: str) -> list[str]:
    from urllib.parse import quote

    return [secret, quote(secret, safe=""), "se@cr:et#?%"]


@pytest.mark.parametrize(
    "fields",
    [
        {"uris": f"rabbitmq-stream://bob:{RESERVED_PASSWORD}@h:5552/v"},  # not percent-encoded: invalid
        {"endpoints": "h", "password": RESERVED_PASSWORD, "tls_keystore_password": RESERVED_PASSWORD},
        {"endpoints": f"bob:{RESERVED_PASSWORD}@h:5552"},  # credentials typed into endpoints
    ],
    ids=["raw-uri", "password-and-store-password", "endpoints"],
)
def test_reserved_characters_in_a_resource_password_never_show(
    fields: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """A bad setting fails the materialization naming the option, and the failure holds no secret."""
    caplog.set_level(logging.DEBUG)
    resource = RabbitMQStreamsResource(**fields)
    with pytest.raises(ConfigurationError) as failed:
        resource.connection_options()
    asset = build_stream_asset("reserved", stream="s", consumer_name="dg-reserved", output_path="/tmp/none")
    instance = DagsterInstance.ephemeral()
    result = materialize(
        [asset], instance=instance, resources={"rabbitmq": resource, "spark": object()}, raise_on_error=False
    )
    assert not result.success
    logs = instance.all_logs(result.run_id)
    assert any("ConfigurationError" in repr(e) for e in logs)
    texts = [str(failed.value), repr(resource), str(resource), caplog.text, *(repr(e) for e in logs)]
    for text in texts:
        for spelling in _spellings(RESERVED_PASSWORD):
            assert spelling not in text, (spelling, text)


def test_stream_assets_share_a_concurrency_pool_per_consumer_name() -> None:
    """Two materializations of one watermark would read one range twice: one pool per consumer name."""
    from dagster_rmqs.assets import consumer_pool

    a = build_stream_asset("a", stream="s", consumer_name="orders", output_path="/tmp/a")
    b = build_stream_asset("b", superstream="ss", consumer_name="orders", output_path="/tmp/b")
    other = build_stream_asset("c", stream="s", consumer_name="audit", output_path="/tmp/c")
    assert a.op.pool == b.op.pool == consumer_pool("orders") == "rmqs-orders"
    assert other.op.pool == "rmqs-audit"
    mine = build_stream_asset("d", stream="s", consumer_name="orders", output_path="/tmp/d", pool="etl")
    assert mine.op.pool == "etl"
