"""Fault tests stop and restart the local broker: they need one this run started (not RMQS_TEST_URI)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.faults.support import broker_up
from tests.support.broker import BrokerSettings


@pytest.fixture
def restartable(broker: BrokerSettings) -> Iterator[BrokerSettings]:
    """The local broker, which the test may restart; it is running again when the test ends."""
    if broker.external:
        pytest.skip("RMQS_TEST_URI points at a broker these tests must not restart")
    yield broker
    broker_up()  # a no-op when it is running
