"""RabbitMQStreamHook: connection mapping, test_connection and watermarks, without a metadata DB."""

from __future__ import annotations

import asyncio
import json
import logging
import warnings

import pytest

from airflow_rmqs.hooks import RabbitMQStreamHook, connection_to_options
from pyspark_rmqs.core.errors import ConfigurationError
from tests.airflow.conftest import secret_uri
from tests.support.broker import BrokerSettings
from tests.support.data import publish

pytestmark = pytest.mark.airflow


def options_of(conn_env, value: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    from airflow.sdk import BaseHook

    conn_env("rmqs_map", value)
    return connection_to_options(BaseHook.get_connection("rmqs_map"))


def test_uri_connection_maps_to_options(conn_env) -> None:  # type: ignore[no-untyped-def]
    opts = options_of(
        conn_env, "rabbitmq-stream://app:p%40ss@node1,node2:5552/prod?tls=true&tls.caFile=/ca.pem"
    )
    assert opts == {
        "endpoints": "node1:5552,node2:5552",
        "username": "app",
        "password": "p@ss",
        "vhost": "prod",  # from the URI path (the `schema` field)
        "tls": "true",
        "tls.caFile": "/ca.pem",
    }


def test_json_connection_extra_spellings_and_tls_port(conn_env) -> None:  # type: ignore[no-untyped-def]
    value = {
        "conn_type": "rabbitmq_stream",
        "host": "broker",
        "login": "u",
        "password": "pw",
        "schema": "ignored",
        "extra": {
            "vhost": "/",
            "tls": True,
            "tls_trust_all": True,
            "extra__rabbitmq_stream__tls_cert_file": "",
        },
    }
    opts = options_of(conn_env, json.dumps(value))
    assert opts == {
        "endpoints": "broker:5551",  # TLS default port
        "username": "u",
        "password": "pw",
        "vhost": "/",
        "tls": "true",
        "tls.trustAll": "true",
    }
    uris = {"conn_type": "rabbitmq_stream", "extra": {"uris": "rabbitmq-stream://a:b@h1:5552/%2F"}}
    assert options_of(conn_env, json.dumps(uris)) == {"uris": "rabbitmq-stream://a:b@h1:5552/%2F"}


def test_bad_connections_fail_with_configuration_errors(conn_env) -> None:  # type: ignore[no-untyped-def]
    conn_env(
        "rmqs_bad", json.dumps({"conn_type": "rabbitmq_stream", "host": "h", "extra": {"tls.cafle": "x"}})
    )
    with pytest.raises(ConfigurationError, match=r"did you mean 'tls\.caFile'"):
        RabbitMQStreamHook("rmqs_bad").get_conn()
    conn_env("rmqs_nohost", json.dumps({"conn_type": "rabbitmq_stream", "login": "u"}))
    with pytest.raises(ConfigurationError, match="no host"):
        RabbitMQStreamHook("rmqs_nohost").get_conn()


def test_test_connection(broker: BrokerSettings, conn_env, caplog) -> None:  # type: ignore[no-untyped-def]
    ok, message = RabbitMQStreamHook().test_connection()
    assert ok and message.startswith("Connected to RabbitMQ 4.")
    password = "wrong-Pw-5f1c9e"
    conn_env("rmqs_wrong", f"rabbitmq-stream://guest:{password}@{broker.host}:{broker.port}/%2F")
    caplog.set_level(logging.DEBUG)
    ok, message = RabbitMQStreamHook("rmqs_wrong").test_connection()
    assert not ok and "AuthenticationError" in message
    assert password not in message and password not in caplog.text


def test_watermarks_sync_and_async(broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    name, parts = streams.super_stream(2)
    publish(broker, parts[0], [b"a"] * 30)
    publish(broker, parts[1], [b"b"] * 10)
    hook = RabbitMQStreamHook()
    assert hook.tails(superstream=name) == {parts[0]: 30, parts[1]: 10}
    assert hook.stored_offsets("etl", superstream=name) == {parts[0]: None, parts[1]: None}
    assert hook.lag("etl", superstream=name) == 40
    hook.store_watermarks("etl", {parts[0]: 19})
    assert hook.stored_offsets("etl", superstream=name) == {parts[0]: 19, parts[1]: None}
    assert hook.lag("etl", superstream=name) == 20
    assert hook.lags("etl", superstream=name) == {parts[0]: 10, parts[1]: 10}

    async def check() -> tuple[dict[str, int], dict[str, int | None], int, dict[str, int]]:
        h = RabbitMQStreamHook()
        await h.astore_watermarks("etl", {parts[1]: 9})
        return (
            await h.atails(superstream=name),
            await h.astored_offsets("etl", superstream=name),
            await h.alag("etl", superstream=name),
            await h.alags("etl", superstream=name),
        )

    tails, stored, lag, lags = asyncio.run(check())
    assert (tails, stored, lag) == ({parts[0]: 30, parts[1]: 10}, {parts[0]: 19, parts[1]: 9}, 10)
    assert lags == {parts[0]: 10, parts[1]: 0}
    w = hook.watermarks("etl", stream=parts[0])
    assert (w.partitions[0].tail, w.partitions[0].stored, w.total_lag) == (30, 19, 10)


def test_former_hook_names_and_the_consumer_keyword_still_work_with_a_deprecation_warning(
    broker: BrokerSettings,
    streams,  # type: ignore[no-untyped-def]
) -> None:
    """DAGs written against `tail` / `stored` / `store` (and `atail` / `astored` / `astore`) or
    `consumer=` keep working; the warning names the new call and points at the DAG's line."""
    s = streams.stream()
    publish(broker, s, [b"a"] * 5)
    hook = RabbitMQStreamHook()
    with pytest.warns(DeprecationWarning, match=r"store\(\) is deprecated, use store_watermarks\(\)") as w:
        hook.store("old", {s: 1})
    assert w[0].filename == __file__
    with pytest.warns(DeprecationWarning, match=r"tail\(\) is deprecated, use tails\(\)"):
        assert hook.tail(stream=s) == {s: 5}
    with pytest.warns(DeprecationWarning, match=r"stored\(\) is deprecated, use stored_offsets\(\)"):
        assert hook.stored("old", stream=s) == {s: 1}
    with pytest.warns(DeprecationWarning, match="keyword 'consumer' is deprecated") as w:
        assert hook.lag(consumer="old", stream=s) == 3
    assert w[0].filename == __file__
    with pytest.warns(DeprecationWarning, match="keyword 'consumer' is deprecated"):
        assert hook.watermarks(consumer="old", stream=s).total_lag == 3
    with warnings.catch_warnings(record=True) as both:
        warnings.simplefilter("always")
        assert hook.stored(consumer="old", stream=s) == {s: 1}  # a former name and a former keyword
    assert [str(x.message).split(" is ")[0] for x in both] == [
        "RabbitMQStreamHook.stored()",
        "RabbitMQStreamHook: the keyword 'consumer'",
    ]

    async def former() -> list[object]:
        h = RabbitMQStreamHook()
        with pytest.warns(DeprecationWarning, match=r"astore\(\) is deprecated, use astore_watermarks"):
            await h.astore("old", {s: 2})
        with pytest.warns(DeprecationWarning, match=r"atail\(\) is deprecated, use atails"):
            tails = await h.atail(stream=s)
        with pytest.warns(DeprecationWarning, match=r"astored\(\) is deprecated, use astored_offsets"):
            stored = await h.astored("old", stream=s)
        with pytest.warns(DeprecationWarning, match="keyword 'consumer' is deprecated") as w:
            lag = await h.alag(consumer="old", stream=s)
        assert w[0].filename == __file__
        with pytest.warns(DeprecationWarning, match="keyword 'consumer' is deprecated"):
            total = (await h.awatermarks(consumer="old", stream=s)).total_lag
        return [tails, stored, lag, total]

    assert asyncio.run(former()) == [{s: 5}, {s: 2}, 2, 2]


def test_password_never_in_repr_or_options_dump(secret_user, broker: BrokerSettings, conn_env) -> None:  # type: ignore[no-untyped-def]
    user, password = secret_user
    conn_env("rmqs_secret", secret_uri(broker, user, password))
    hook = RabbitMQStreamHook("rmqs_secret")
    options = hook.get_conn()
    assert password not in repr(options) and password not in str(options.model_dump())
    assert hook.spark_options()["password"] == password  # only for handing to Spark
    assert hook.test_connection()[0]


RESERVED_PASSWORD = "Af/se@cr:et#?%-ünï-Pw"


def _leaks(texts: list[str]) -> list[str]:
    from urllib.parse import quote

    spellings = (RESERVED_PASSWORD, quote(RESERVED_PASSWORD, safe=""), "se@cr:et#?%")
    return [t for t in texts if any(s in t for s in spellings)]


def test_reserved_characters_in_a_connection_password_never_show(conn_env, caplog) -> None:  # type: ignore[no-untyped-def]
    """Airflow connection URIs (percent-encoded, as Airflow wants) and `uris` extras (raw): a bad
    setting fails naming the option, in the hook, the triggerer's async path and an operator's
    failure wrapper, and no text or log line holds the password."""
    from urllib.parse import quote

    from airflow.sdk.exceptions import AirflowFailException

    from airflow_rmqs.failures import airflow_failures

    caplog.set_level(logging.DEBUG)
    encoded = quote(RESERVED_PASSWORD, safe="")
    conn_env("rmqs_reserved_uri", f"rabbitmq-stream://bob:{encoded}@h:5552/v?tls=maybe")
    raw_extra = {"uris": f"rabbitmq-stream://bob:{RESERVED_PASSWORD}@h:5552/v"}
    conn_env("rmqs_reserved_extra", json.dumps({"conn_type": "rabbitmq_stream", "extra": raw_extra}))
    texts: list[str] = []
    for conn_id, option in (("rmqs_reserved_uri", "option 'tls'"), ("rmqs_reserved_extra", "option 'uris'")):
        with pytest.raises(ConfigurationError, match=option) as sync:
            RabbitMQStreamHook(conn_id).get_conn()
        with pytest.raises(ConfigurationError, match=option) as async_:
            asyncio.run(RabbitMQStreamHook(conn_id).aget_conn())
        with pytest.raises(AirflowFailException) as failed, airflow_failures([RESERVED_PASSWORD]):
            RabbitMQStreamHook(conn_id).get_conn()
        ok, message = RabbitMQStreamHook(conn_id).test_connection()
        assert not ok
        texts += [str(sync.value), str(async_.value), str(failed.value), message]
    assert _leaks([*texts, caplog.text]) == []
