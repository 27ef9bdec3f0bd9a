"""Provider registration: schema-valid provider info, ProvidersManager discovery, assets, queues."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import resources
from urllib.parse import urlsplit

import jsonschema
import pytest

from airflow_rmqs.get_provider_info import get_provider_info

pytestmark = pytest.mark.airflow


def test_provider_info_is_valid_against_airflows_runtime_schema() -> None:
    schema = json.loads(resources.files("airflow").joinpath("provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    assert info["package-name"] == "rmqs"
    [conn_type] = info["connection-types"]
    assert conn_type["connection-type"] == "rabbitmq_stream"
    assert {"vhost", "tls", "tls_ca_file", "tls_cert_file", "tls_key_file", "uris"} <= set(
        conn_type["conn-fields"]
    )
    behaviour = conn_type["ui-field-behaviour"]
    assert "schema" not in behaviour["relabeling"] and "schema" not in behaviour["hidden-fields"]
    assert behaviour["placeholders"]["port"] == "5552"


def test_providers_manager_discovers_everything() -> None:
    from airflow.providers_manager import ProvidersManager
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    pm, runtime = ProvidersManager(), ProvidersManagerTaskRuntime()
    assert "rmqs" in pm.providers and "rmqs" in runtime.providers
    hook = runtime.hooks["rabbitmq_stream"]
    assert hook is not None
    assert (hook.hook_class_name, hook.connection_id_attribute_name, hook.connection_testable) == (
        "airflow_rmqs.hooks.RabbitMQStreamHook",
        "rabbitmq_stream_conn_id",
        True,
    )
    assert any(t.trigger_class_name == "airflow_rmqs.triggers" for t in pm.trigger)
    assert "airflow_rmqs.queues.RabbitMQStreamMessageQueueProvider" in pm.queue_class_names
    assert "extra__rabbitmq_stream__vhost" in pm.connection_form_widgets
    assert pm.connection_form_widgets["extra__rabbitmq_stream__tls_keystore_password"].is_sensitive
    assert pm.field_behaviours["rabbitmq_stream"]["relabeling"] == {}
    assert "rabbitmq-stream" in runtime.asset_uri_handlers and "rabbitmq-stream" in runtime.asset_factories
    # The provider's settings reach Airflow's configuration (`airflow config list`), with their defaults.
    section = get_provider_info()["config"]["rabbitmq_streams"]
    assert ("rmqs", {"rabbitmq_streams": section}) in pm.provider_configs
    assert section["options"]["triggerer_gc_freeze"]["default"] == "False"


def test_message_queue_trigger_resolves_the_scheme_to_our_trigger() -> None:
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

    from airflow_rmqs.triggers import RabbitMQStreamNewDataTrigger

    mq = MessageQueueTrigger(
        scheme="rabbitmq-stream", superstream="orders", consumer_name="etl", min_messages=5
    )
    assert isinstance(mq.trigger, RabbitMQStreamNewDataTrigger)
    classpath, kwargs = mq.serialize()
    assert classpath == "airflow_rmqs.triggers.RabbitMQStreamNewDataTrigger"
    assert (kwargs["superstream"], kwargs["consumer_name"], kwargs["min_messages"]) == ("orders", "etl", 5)


def test_queue_provider_accepts_a_queue_uri() -> None:
    from airflow_rmqs.queues import RabbitMQStreamMessageQueueProvider

    p = RabbitMQStreamMessageQueueProvider()
    assert p.scheme_matches("rabbitmq-stream") and not p.scheme_matches("kafka")
    assert p.queue_matches("rabbitmq-stream://localhost:5552/%2F/orders")
    assert p.trigger_kwargs("rabbitmq-stream://localhost:5552/%2F/orders") == {"stream": "orders"}
    assert p.trigger_kwargs("rabbitmq-stream://h/%2F/x", superstream="orders") == {}


def test_asset_uri_sanitizer_and_factory() -> None:
    from airflow.sdk import Asset

    from airflow_rmqs.assets import create_asset, sanitize_uri

    assert (
        Asset("rabbitmq-stream://LocalHost/%2F/orders").uri == "rabbitmq-stream://localhost:5552/%2F/orders"
    )
    assert create_asset(host="broker", port=5553, vhost="prod/eu", stream="orders").uri == (
        "rabbitmq-stream://broker:5553/prod%2Feu/orders"
    )
    for bad in (
        "rabbitmq-stream:///%2F/orders",
        "rabbitmq-stream://h:5552/orders",
        "rabbitmq-stream://h/%2F/",
    ):
        with pytest.raises(ValueError, match="rabbitmq-stream://host:port/vhost/stream"):
            sanitize_uri(urlsplit(bad))


def test_triggers_and_hooks_never_import_pyspark() -> None:
    """The triggerer and sensors must not start a JVM, nor even import pyspark."""
    code = (
        "import sys\n"
        "import airflow_rmqs.hooks, airflow_rmqs.triggers, airflow_rmqs.sensors, airflow_rmqs.queues\n"
        "import airflow_rmqs.assets, airflow_rmqs.operators\n"
        "bad = sorted(m for m in sys.modules if m == 'pyspark' or m.startswith(('pyspark.', 'py4j')))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
