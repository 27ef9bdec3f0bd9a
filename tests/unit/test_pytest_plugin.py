"""pytest_rmqs without a broker: a cheap, inert import; settings; messages; the advertised address."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_rmqs import RabbitMQTestBroker, broker_from_uri
from pytest_rmqs.container import container_environment
from pytest_rmqs.plugin import airflow_connection_json, no_broker_message
from tests.support.plugin_runs import checkout_env, plugin_args

HEAVY = (
    "pyspark",
    "airflow",
    "dagster",
    "pyarrow",
    "rstream",
    "docker",
    "testcontainers",
    "pyspark_rmqs.broker",
)


def test_importing_the_plugin_loads_nothing_heavy() -> None:
    """pytest imports the plugin in every run of every project with rmqs installed."""
    code = (
        "import sys, json; before = set(sys.modules); import pytest_rmqs.plugin; "
        "print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=checkout_env(dict(os.environ))
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    heavy = [m for m in loaded if m.split(".")[0] in HEAVY or m.startswith("pyspark_rmqs.")]
    assert heavy == [], "importing pytest_rmqs.plugin loaded them"


def test_a_uri_gives_every_part() -> None:
    b = broker_from_uri("rabbitmq-stream://alice:s%40cret@broker.example:5553/prod%2Fa")
    assert (b.host, b.port, b.username, b.password, b.vhost, b.tls) == (
        "broker.example",
        5553,
        "alice",
        "s@cret",
        "prod/a",
        False,
    )
    assert b.options == {
        "endpoints": "broker.example:5553",
        "username": "alice",
        "password": "s@cret",
        "vhost": "prod/a",
    }
    assert broker_from_uri(b.uri) == b
    assert (
        broker_from_uri("rabbitmq-stream://h").vhost == "/"
        and broker_from_uri("rabbitmq-stream://h/%2f").vhost == "/"
    )
    tls = broker_from_uri("rabbitmq-stream+tls://u:p@h/")
    assert (tls.port, tls.tls, tls.options["tls"]) == (5551, True, "true")


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("amqp://u:topsecret@h:5672/", "scheme is 'amqp'"),
        ("rabbitmq-stream://u:topsecret@:5552/", "names no host"),
        ("rabbitmq-stream://u:topsecret@h:99999/", "port"),
        ("localhost:5552", "scheme"),
    ],
)
def test_a_bad_uri_names_the_variable_and_the_form_never_the_password(uri: str, says: str) -> None:
    with pytest.raises(ValueError) as e:
        broker_from_uri(uri)
    assert "RMQS_TEST_URI" in str(e.value) and says in str(e.value)
    assert "rabbitmq-stream://user:password@host:5552/%2f" in str(e.value)
    assert "topsecret" not in str(e.value)


def test_the_password_is_in_no_repr() -> None:
    b = RabbitMQTestBroker("h", 5552, "u", "topsecret")
    assert "topsecret" not in repr(b) and "topsecret" not in str(b)


def test_the_container_advertises_the_published_port_on_loopback() -> None:
    env = container_environment(34567)
    assert env["RABBITMQ_ENABLED_PLUGINS"] == "rabbitmq_stream"
    args = env["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"].split()
    assert args == [
        "-rabbitmq_stream",
        "advertised_host",
        '"127.0.0.1"',
        "-rabbitmq_stream",
        "advertised_port",
        "34567",
    ]


def test_the_airflow_connection_is_the_broker() -> None:
    conn = json.loads(airflow_connection_json(RabbitMQTestBroker("h", 5560, "u", "p", "v")))
    assert conn == {
        "conn_type": "rabbitmq_stream",
        "host": "h",
        "port": 5560,
        "login": "u",
        "password": "p",
        "schema": "v",
    }


def test_the_no_broker_message_names_both_ways() -> None:
    text = no_broker_message("rabbitmq:4.0", "no Docker daemon answers")
    assert (
        "RMQS_TEST_URI" in text and "Docker" in text and "rabbitmq:4.0" in text and "RMQS_TEST_IMAGE" in text
    )


USER_TEST = "def test_it(rmqs_stream):\n    assert rmqs_stream\n"


@pytest.mark.parametrize(("when", "outcome"), [("", "1 skipped"), ("fail", "1 error")])
def test_without_uri_and_docker_the_tests_skip_or_fail_naming_both_ways(
    tmp_path: Path, when: str, outcome: str
) -> None:
    (tmp_path / "test_user.py").write_text(USER_TEST)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RMQS_TEST_", "DOCKER_"))}
    env.update(DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock", RMQS_TEST_WHEN_NO_BROKER=when)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin_args(), "-rs", "-q"],
        cwd=tmp_path,
        env=checkout_env(env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert outcome in done.stdout, done.stdout[-3000:]
    assert "RMQS_TEST_URI" in done.stdout and "no Docker daemon answers" in done.stdout


def test_a_bad_when_no_broker_setting_names_the_valid_values(tmp_path: Path) -> None:
    (tmp_path / "test_user.py").write_text(USER_TEST)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RMQS_TEST_")}
    env.update(DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock", RMQS_TEST_WHEN_NO_BROKER="maybe")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin_args(), "-q"],
        cwd=tmp_path,
        env=checkout_env(env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert (
        "RMQS_TEST_WHEN_NO_BROKER" in done.stdout + done.stderr and "skip, fail" in done.stdout + done.stderr
    )
