"""Campaign tests: Airflow's settings before it is imported, and the long test handed out early."""

from __future__ import annotations

import pytest

from tests.campaign.env import prepare_airflow

prepare_airflow()

# The in-suite budget takes about as long as a fault test: on xdist workers it starts right after
# them (tests/conftest.py hands the long tests out first), not at the end where it would run alone.
_LONG_FIRST = ("tests/e2e/", "tests/dagster/test_time_windows.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):
        return
    long = [i for i in items if i.nodeid.startswith("tests/campaign/test_campaign.py")]
    if not long:
        return
    rest = [i for i in items if i not in long]
    at = max((n + 1 for n, i in enumerate(rest) if i.nodeid.startswith(_LONG_FIRST)), default=0)
    items[:] = rest[:at] + long + rest[at:]
