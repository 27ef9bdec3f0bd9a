"""`Lease.keep`, the check before every write under a lease, without a broker: what it costs while
the lease is held (nothing), and what it decides once the lease's connection closed. The same
decisions against real brokers: tests/e2e/faults/test_lease_loss.py, tests/cluster/test_lease_faults.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from pyspark_rmqs.broker import recovery
from pyspark_rmqs.errors import BrokerUnavailableError, ConsumerBusyError, LeaseLostError
from pyspark_rmqs.runs import lease as leases


class FakeClient:
    """The lease's connection: alive or not, and the calls closing it."""

    def __init__(self, alive: bool = True) -> None:
        self.alive = alive
        self.server_properties: dict[str, Any] = {}

    def is_connection_alive(self) -> bool:
        return self.alive

    async def unsubscribe(self, sub: int) -> None:
        pass

    async def close(self) -> None:
        self.alive = False


class Broker:
    """What `keep` asks the broker: a new subscription (`_acquire_within`) and the record pointer."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, pointer: int | None, acquired: Any) -> None:
        self.pointer = pointer
        self.acquired = acquired
        self.subscriptions = 0
        self.pointer_reads = 0
        monkeypatch.setattr(leases, "_acquire_within", self.acquire)
        monkeypatch.setattr(leases, "BrokerClient", lambda conn: self)

    def acquire(
        self, conn: Any, stream: str, name: str, wait_s: float, *, unreachable_s: float | None = None
    ) -> Any:
        self.subscriptions += 1
        self.unreachable_s = unreachable_s
        if isinstance(self.acquired, BaseException):
            raise self.acquired
        return self.acquired

    def stored_offset(self, name: str, stream: str) -> int | None:
        self.pointer_reads += 1
        return self.pointer


def lease_of(client: FakeClient, pointer: int | None = 7) -> leases.Lease:
    lease = leases.Lease(object(), "orders/etl", client, 0, what="consumer 'etl' on stream 'orders'")  # type: ignore[arg-type]
    lease.mark(pointer)
    return lease


def test_a_held_lease_costs_no_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    broker = Broker(monkeypatch, pointer=99, acquired=None)
    lease_of(FakeClient(alive=True)).keep("its record 'delivered'")
    assert broker.subscriptions == broker.pointer_reads == 0


def test_a_lost_lease_taken_back_with_the_pointer_unchanged_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    broker = Broker(monkeypatch, pointer=7, acquired=(FakeClient(), 1))
    lease = lease_of(FakeClient(alive=False), pointer=7)
    lease.keep("its record 'delivered'")
    # An unreachable broker is waited for as long as readers wait (a restart), not only the lease wait.
    assert broker.unreachable_s == recovery.RECOVERY_WINDOW_S
    assert lease.held and lease.regained == 1 and broker.pointer_reads == 1
    lease.keep("its watermarks")  # held again: no further round trip
    assert broker.subscriptions == 1 and broker.pointer_reads == 1


def test_a_lost_lease_whose_record_another_run_moved_fails_before_the_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    Broker(monkeypatch, pointer=12, acquired=(FakeClient(), 1))
    lease = lease_of(FakeClient(alive=False), pointer=7)
    with pytest.raises(LeaseLostError) as lost:
        lease.keep("its record 'delivered'")
    text = str(lost.value)
    assert "consumer 'etl' on stream 'orders'" in text and "record pointer 7 -> 12" in text
    assert "before writing its record 'delivered'" in text and "Retry" in text
    assert lost.value.retryable and isinstance(lost.value, ConsumerBusyError)
    assert not lease.held  # given back


@pytest.mark.parametrize(
    ("acquired", "why"),
    [(None, "another run holds it now"), (BrokerUnavailableError("no member"), "could be subscribed to")],
    ids=["taken", "unreachable"],
)
def test_a_lost_lease_that_cannot_be_taken_back_fails_before_the_write(
    monkeypatch: pytest.MonkeyPatch, acquired: Any, why: str
) -> None:
    broker = Broker(monkeypatch, pointer=7, acquired=acquired)
    lease = lease_of(FakeClient(alive=False))
    with pytest.raises(LeaseLostError) as lost:
        lease.keep("its watermarks")
    assert why in str(lost.value) and "before writing its watermarks" in str(lost.value)
    assert broker.pointer_reads == 0  # nothing to prove without the lease


def test_the_fence_costs_one_round_trip_and_refuses_a_moved_pointer(monkeypatch: pytest.MonkeyPatch) -> None:
    """`fence` before an output commit: held and the pointer where this run left it, go on; moved
    (another run took the name over without this process seeing its lease end), `LeaseLostError`
    and the lease given back."""
    broker = Broker(monkeypatch, pointer=7, acquired=None)
    lease_of(FakeClient(alive=True), pointer=7).fence("its output's commit")
    assert broker.pointer_reads == 1 and broker.subscriptions == 0
    broker.pointer = 9
    lease = lease_of(FakeClient(alive=True), pointer=7)
    with pytest.raises(LeaseLostError, match="took it over") as lost:
        lease.fence("its output's commit")
    assert "record pointer 7 -> 9" in str(lost.value) and lease.node is None  # released
