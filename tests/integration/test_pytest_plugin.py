"""pytest_rmqs against RMQS_TEST_URI: a user's tests, run by pytest in a folder outside the checkout.

The plugin's fixtures (rmqs_broker, rmqs_stream, rmqs_superstream) and helpers (publish,
read_arrow) on the suite's broker, given as RMQS_TEST_URI the way a user points them at theirs.
The same project with its DAG and Dagster asset runs against a container in `make test-containers`
(tests/containers); a fresh venv with the wheel's `rmqs[testing]` runs it in tests/e2e/test_wheel_install.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.broker import BrokerSettings
from tests.support.plugin_runs import checkout_env, plugin_args, user_project


def test_a_users_tests_run_against_rmqs_test_uri(broker: BrokerSettings, tmp_path: Path) -> None:
    project = user_project(tmp_path)
    env = checkout_env({**os.environ, "RMQS_TEST_URI": broker.uri, "RMQS_TEST_WHEN_NO_BROKER": "fail"})
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin_args(), "-q", "test_streams.py"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "4 passed" in done.stdout


@pytest.mark.airflow
@pytest.mark.dagster
def test_the_airflow_connection_and_dagster_resource_point_at_rmqs_test_uri(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """The fixtures' Airflow connection (resolved by Airflow itself) and Dagster resource."""
    (tmp_path / "test_handles.py").write_text(
        "def test_handles(rmqs_broker, rmqs_airflow_conn_id, rmqs_dagster_resource):\n"
        "    from airflow_rmqs.hooks import RabbitMQStreamHook\n"
        "    hook = RabbitMQStreamHook(rmqs_airflow_conn_id)\n"
        "    assert hook.get_conn().to_options() == rmqs_broker.connection().to_options()\n"
        "    assert rmqs_dagster_resource.connection_options().to_options() == hook.get_conn().to_options()\n"
        "    assert hook.test_connection()[0]\n"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_CONN_")}  # the fixture's alone
    env = checkout_env({**base, "RMQS_TEST_URI": broker.uri, "AIRFLOW_HOME": str(tmp_path / "af")})
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin_args(), "-q", "test_handles.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
