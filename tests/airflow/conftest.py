"""Airflow test setup: a throwaway AIRFLOW_HOME with a migrated SQLite DB, once per session.

Airflow reads its configuration when first imported, so the environment is set here, at
collection time, before any test module imports airflow. Unit tests need no database; only the
`airflow_db` fixture (the `dag.test()` end-to-end tests) migrates one (~5 s).
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support import broker as tb

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"
AIRFLOW_HOME = tempfile.mkdtemp(prefix="rmqs-airflow-")
atexit.register(shutil.rmtree, AIRFLOW_HOME, ignore_errors=True)
# The DAG bundle dag.test() syncs: the example DAGs (symlinked) plus DAG files tests write.
DAGS_FOLDER = Path(AIRFLOW_HOME) / "dags"
DAGS_FOLDER.mkdir()
for _dag_file in DAGS.glob("*.py"):
    (DAGS_FOLDER / _dag_file.name).symlink_to(_dag_file)

if "airflow" in sys.modules:  # configuration already read: these settings would not apply
    raise RuntimeError("tests/airflow/conftest.py must run before airflow is imported")
os.environ.update(
    {
        "AIRFLOW_HOME": AIRFLOW_HOME,
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{AIRFLOW_HOME}/airflow.db",
        "AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT": tb.settings_from_env().uri,
        "TZ": "UTC",
    }
)


@pytest.fixture(scope="session")
def airflow_db() -> str:
    """Migrate the SQLite metadata DB of this session's AIRFLOW_HOME (for `dag.test()`)."""
    from airflow.utils import db

    db.initdb()
    return AIRFLOW_HOME


def load_dag_module(name: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """Import the bundle's `<name>.py` afresh with `env` set (the DAG files read it at parse time)."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    spec = importlib.util.spec_from_file_location(
        f"{name}_{uuid.uuid4().hex[:6]}", DAGS_FOLDER / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_dag_file(name: str, source: str) -> Path:
    """A test-only DAG file in the bundle folder (dag.test() runs only DAGs the bundle holds)."""
    path = DAGS_FOLDER / f"{name}.py"
    path.write_text(source)
    return path


@pytest.fixture
def conn_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Set an Airflow connection from the environment: conn_env(conn_id, uri_or_json)."""

    def set_conn(conn_id: str, value: str) -> None:
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", value)

    yield set_conn


SECRET_PASSWORD = "Pw-" + uuid.uuid4().hex  # distinctive: any leak is found by a plain substring search


@pytest.fixture(scope="session")
def secret_user(broker: tb.BrokerSettings) -> Iterator[tuple[str, str]]:
    """A broker user with a distinctive password (local broker only, via the management API)."""
    if broker.external:
        pytest.skip("needs the local broker's management API")
    user = f"rmqs-airflow-{uuid.uuid4().hex[:6]}"
    try:
        tb.management("PUT", f"users/{user}", {"password": SECRET_PASSWORD, "tags": ""})
        tb.management("PUT", f"permissions/%2F/{user}", {"configure": ".*", "write": ".*", "read": ".*"})
    except OSError as e:
        pytest.skip(f"management API unavailable: {e}")
    yield user, SECRET_PASSWORD
    tb.management("DELETE", f"users/{user}")


def secret_uri(broker: tb.BrokerSettings, user: str, password: str) -> str:
    return f"rabbitmq-stream://{user}:{password}@{broker.host}:{broker.port}/%2F"
