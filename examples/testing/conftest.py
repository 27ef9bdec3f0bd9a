"""Airflow for `dag.test()`: a throwaway home and SQLite database, set before airflow is imported."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

AIRFLOW_HOME = tempfile.mkdtemp(prefix="airflow-home-")
os.environ.update(
    {
        "AIRFLOW_HOME": AIRFLOW_HOME,
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(Path(__file__).parent / "dags"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{AIRFLOW_HOME}/airflow.db",
    }
)


@pytest.fixture(scope="session")
def airflow_db() -> None:
    from airflow.utils import db

    db.initdb()
