"""The process settings a campaign needs before Airflow is imported (pytest's conftest and the runner).

The operators read their connection from `AIRFLOW_CONN_RMQS_CAMPAIGN` (runs.py sets it), so no
metadata database is needed; Airflow still reads its configuration once, when first imported, from
`AIRFLOW_HOME`: a throwaway one, unless another conftest (tests/airflow) already chose it.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import tempfile


def prepare_airflow() -> None:
    """A throwaway AIRFLOW_HOME when none is set and Airflow is not imported yet."""
    if "airflow" in sys.modules or os.environ.get("AIRFLOW_HOME"):
        return
    home = tempfile.mkdtemp(prefix="rmqs-campaign-airflow-")
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    os.environ["AIRFLOW_HOME"] = home
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")


def quiet() -> None:
    """Keep the runner's output to the campaign's own lines: every run logs its summary at INFO, and
    every operator called outside a task runner warns so (Airflow's structlog loggers)."""
    import structlog

    logging.disable(logging.ERROR)  # Dagster logs every failed step (injected ones) at ERROR
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
