"""The pytest plugin (entry point `rmqs` in `pytest11`): fixtures for tests of pipelines built on rmqs.

pytest loads it in every run of every project that has rmqs installed, so it does nothing until a
test asks for one of its fixtures: no hook changes collection or reporting, no fixture is autouse,
and importing it loads neither rmqs's broker layer nor pyarrow, pyspark, airflow, dagster or
docker (tests/unit/test_pytest_plugin.py checks it).

Where the broker comes from, decided once per session (per xdist worker) at the first request:
1. `RMQS_TEST_URI` (`rabbitmq-stream://user:password@host:port/vhost`): a running broker;
2. else a RabbitMQ container, when a Docker daemon answers: image `RMQS_TEST_IMAGE`, else the
   ini option `rmqs_test_image`, else the official `rabbitmq:4.0`; removed at the session's end;
3. else the tests that need a broker are skipped, naming both ways (or fail, with
   `rmqs_when_no_broker = fail` / `RMQS_TEST_WHEN_NO_BROKER=fail`: what CI wants).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from pytest_rmqs.broker import RabbitMQTestBroker, broker_from_uri, unique_name

URI_VAR = "RMQS_TEST_URI"
IMAGE_VAR = "RMQS_TEST_IMAGE"
WHEN_NO_BROKER_VAR = "RMQS_TEST_WHEN_NO_BROKER"
WHEN_NO_BROKER = ("skip", "fail")
AIRFLOW_CONN_ID = "rabbitmq_stream_default"  # airflow_rmqs.hooks' default (DESIGN §5)
SUPERSTREAM_PARTITIONS = 3


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("rmqs_test_image", "RabbitMQ image of the rmqs_broker container (RMQS_TEST_IMAGE wins)")
    parser.addini(
        "rmqs_startup_timeout", "seconds the rmqs_broker container may take to serve streams", default="120"
    )
    parser.addini(
        "rmqs_when_no_broker",
        "skip or fail the tests needing rmqs_broker when neither RMQS_TEST_URI nor Docker gives one",
        default="skip",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "rmqs_superstream(partitions=3): how many partitions the rmqs_superstream fixture makes"
    )


# ---------------------------------------------------------------------------- settings


def _ini(config: pytest.Config, name: str) -> str:
    value = config.getini(name)
    return str(value).strip() if value else ""


def image_of(config: pytest.Config) -> str:
    """The container image: RMQS_TEST_IMAGE, else the ini option, else the official image."""
    from pytest_rmqs.container import DEFAULT_IMAGE

    return os.environ.get(IMAGE_VAR, "").strip() or _ini(config, "rmqs_test_image") or DEFAULT_IMAGE


def startup_timeout_of(config: pytest.Config) -> float:
    raw = _ini(config, "rmqs_startup_timeout") or "120"
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise pytest.UsageError(f"rmqs_startup_timeout must be a positive number of seconds, not {raw!r}")
    return value


def when_no_broker_of(config: pytest.Config) -> str:
    raw = os.environ.get(WHEN_NO_BROKER_VAR, "").strip() or _ini(config, "rmqs_when_no_broker") or "skip"
    if raw.lower() not in WHEN_NO_BROKER:
        valid = ", ".join(WHEN_NO_BROKER)
        raise pytest.UsageError(
            f"{WHEN_NO_BROKER_VAR} / rmqs_when_no_broker must be one of {valid}, not {raw!r}"
        )
    return raw.lower()


def no_broker_message(image: str, why: str) -> str:
    """What a test reads when no broker can be had: both ways to give it one."""
    return (
        f"rmqs_broker: no RabbitMQ broker for this test. Either set {URI_VAR} to a running broker "
        f"(e.g. {URI_VAR}=rabbitmq-stream://guest:guest@localhost:5552/%2f), or run a Docker daemon "
        f"so that a container is started from image {image!r} ({IMAGE_VAR} or the ini option "
        f"rmqs_test_image names another). Docker: {why}"
    )


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def rmqs_broker(request: pytest.FixtureRequest) -> Iterator[RabbitMQTestBroker]:
    """A RabbitMQ broker serving streams: RMQS_TEST_URI's, else a container started for the session."""
    uri = os.environ.get(URI_VAR, "").strip()
    if uri:
        try:
            yield broker_from_uri(uri, origin=URI_VAR)
        except ValueError as e:
            raise pytest.UsageError(str(e)) from None
        return
    from pytest_rmqs.container import DockerUnavailable, start_broker

    config = request.config
    image = image_of(config)
    try:
        running = start_broker(image, startup_timeout_s=startup_timeout_of(config))
    except DockerUnavailable as e:
        message = no_broker_message(image, str(e))
        if when_no_broker_of(config) == "fail":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    try:
        yield running.broker
    finally:
        running.stop()


@pytest.fixture
def rmqs_stream(rmqs_broker: RabbitMQTestBroker) -> Iterator[str]:
    """The name of a new, empty stream (unique), deleted after the test."""
    name = rmqs_broker.create_stream(unique_name())
    try:
        yield name
    finally:
        rmqs_broker.delete_stream(name)


@pytest.fixture
def rmqs_superstream(rmqs_broker: RabbitMQTestBroker, request: pytest.FixtureRequest) -> Iterator[str]:
    """The name of a new super stream (unique) with partitions `<name>-0` .. `<name>-2` (or as many as
    `@pytest.mark.rmqs_superstream(partitions=N)` says), deleted after the test."""
    marker = request.node.get_closest_marker("rmqs_superstream")
    partitions = (
        int(marker.kwargs.get("partitions", SUPERSTREAM_PARTITIONS)) if marker else SUPERSTREAM_PARTITIONS
    )
    name = rmqs_broker.create_super_stream(unique_name(), partitions)
    try:
        yield name
    finally:
        rmqs_broker.delete_super_stream(name)


@pytest.fixture
def rmqs_airflow_conn_id(rmqs_broker: RabbitMQTestBroker, monkeypatch: pytest.MonkeyPatch) -> str:
    """`rabbitmq_stream_default`, defined for the test as `AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT` (JSON)
    pointing at `rmqs_broker`: what every rmqs operator, sensor and hook uses unless told otherwise."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{AIRFLOW_CONN_ID.upper()}", airflow_connection_json(rmqs_broker))
    return AIRFLOW_CONN_ID


def airflow_connection_json(broker: RabbitMQTestBroker) -> str:
    """The broker as an Airflow connection of type `rabbitmq_stream`, in Airflow's JSON form."""
    conn: dict[str, Any] = {
        "conn_type": "rabbitmq_stream",
        "host": broker.host,
        "port": broker.port,
        "login": broker.username,
        "password": broker.password,
        "schema": broker.vhost,
    }
    if broker.tls:
        conn["extra"] = {"tls": "true"}
    return json.dumps(conn)


@pytest.fixture
def rmqs_dagster_resource(rmqs_broker: RabbitMQTestBroker) -> Any:
    """A `dagster_rmqs.RabbitMQStreamsResource` pointing at `rmqs_broker` (needs `rmqs[dagster]`)."""
    from dagster_rmqs.resources import RabbitMQStreamsResource

    return RabbitMQStreamsResource(
        endpoints=rmqs_broker.endpoint,
        username=rmqs_broker.username,
        password=rmqs_broker.password,
        vhost=rmqs_broker.vhost,
        tls=rmqs_broker.tls,
    )
