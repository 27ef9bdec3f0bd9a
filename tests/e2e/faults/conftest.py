"""Fault tests that stop, restart or pause a broker do it to the second local one (not RMQS_TEST_URI)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.faults.support import broker_up
from tests.support.broker import BrokerSettings


@pytest.fixture
def restartable(restartable_broker: BrokerSettings) -> Iterator[BrokerSettings]:
    """The second local broker (`restartable_broker`), which the test may stop, restart or pause; it
    is running again when the test ends. A file using it overrides `broker` with it too, so that
    `streams` makes the test's streams there."""
    yield restartable_broker
    broker_up()  # a no-op when it is running
