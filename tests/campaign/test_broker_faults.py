"""The campaign's broker faults as plain tests, on the campaign's own broker (the suite's second
local one, which they stop or freeze: conftest.FILE_GROUPS runs this file beside the other tests
that do, one after the other)."""

from __future__ import annotations

import pytest

from tests.campaign.config import SLOW_OPERATIONS, CampaignConfig
from tests.campaign.machine import STATS, machine_with
from tests.campaign.test_regressions import steps
from tests.support.broker import BrokerSettings

pytestmark = [pytest.mark.broker, pytest.mark.airflow, pytest.mark.slow]


def test_a_run_the_broker_freezes_under_finishes_or_fails_retryably_and_loses_nothing(
    restartable_broker: BrokerSettings,
) -> None:
    """`broker_pause`: the broker frozen (SIGSTOP) for 12 s, longer than the client's probe timeout,
    from inside an exactly-once run and an at-least-once one, then a third run after more data; the
    invariants after each step and the final check count every message."""
    machine = machine_with(
        CampaignConfig(disabled=SLOW_OPERATIONS - {"broker_pause"}, broker="restartable")
    )()
    before = sum(v for k, v in STATS.items() if k.startswith("paused_run:paused:"))
    try:
        steps(
            machine,
            ("publish", {"n": 30, "to": "ss"}),
            ("broker_pause", {"pipeline": "c2@ss", "seconds": 12.0}),
            ("broker_pause", {"pipeline": "c1@a", "seconds": 3.0}),
            ("publish", {"n": 10, "to": "ss"}),
            ("run", {"pipeline": "c2@ss"}),
        )
    finally:
        machine._cleanup()
    assert sum(v for k, v in STATS.items() if k.startswith("paused_run:paused:")) - before == 2
