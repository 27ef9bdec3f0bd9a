"""pytest_rmqs against RMQS_TEST_URI: a user's tests, run by pytest in a folder outside the checkout.

examples/testing, the project docs/testing.md links to (the plugin's fixtures and helpers, a DAG
under `dag.test()`, a Dagster asset), on the suite's broker given as RMQS_TEST_URI the way a user
points them at theirs: an example that breaks fails here. The same project runs against a container
in `make test-containers` (tests/containers); a fresh venv with the wheel's `rmqs[testing]` runs its
test_streams.py in tests/e2e/test_wheel_install.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.broker import BrokerSettings
from tests.support.plugin_runs import checkout_env, plugin_args, user_project


@pytest.mark.airflow
@pytest.mark.dagster
def test_the_example_project_runs_against_rmqs_test_uri(broker: BrokerSettings, tmp_path: Path) -> None:
    """Every test of examples/testing passes (none skipped: the DAG's and the asset's need Airflow and
    Dagster, which the suite has): about 15 s, most of it Airflow's database and `dag.test()`."""
    project = user_project(tmp_path)
    base = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_")}  # a user's own
    env = checkout_env({**base, "RMQS_TEST_URI": broker.uri, "RMQS_TEST_WHEN_NO_BROKER": "fail"})
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin_args(), "-q", "-rs"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "6 passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]


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
