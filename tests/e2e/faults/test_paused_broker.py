"""A paused broker (SIGSTOP, then SIGCONT: a starved or frozen node) never makes a read guess.

The broker these tests pause is the second local one (`restartable_broker`): `broker` below is it,
so `streams` makes their streams there, and the tests other workers run meanwhile never see it stop.
(They were in test_read_guarantees.py, run alone after every other test.)
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from pyspark_rmqs.broker.client import PROBE_TIMEOUT_S
from pyspark_rmqs.broker.reader import RangeReader, ReadSettings
from pyspark_rmqs.broker.writer import StreamProducer, WriteSettings
from pyspark_rmqs.core.codec import encode
from tests.conftest import StreamFactory
from tests.e2e.faults.support import broker_pids
from tests.support.broker import BrokerSettings
from tests.support.data import client, conn_of, publish

pytestmark = [pytest.mark.broker, pytest.mark.slow]


@pytest.fixture
def broker(restartable: BrokerSettings) -> BrokerSettings:
    return restartable


class _Pauser:
    """SIGSTOP the broker for `pause_s` every `every_s`, `times` times, in a thread."""

    def __init__(self, pause_s: float, times: int, every_s: float = 0.7) -> None:
        self.pids = broker_pids()
        self.pause_s, self.times, self.every_s = pause_s, times, every_s
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _signal(self, sig: int) -> None:
        for pid in self.pids:
            os.kill(pid, sig)

    def _run(self) -> None:
        try:
            for _ in range(self.times):
                time.sleep(self.every_s)
                self._signal(signal.SIGSTOP)
                try:
                    time.sleep(self.pause_s)
                finally:
                    self._signal(signal.SIGCONT)
        finally:
            self.done.set()

    def __enter__(self) -> _Pauser:
        if not self.pids:
            pytest.skip("the broker's processes are not on this machine (RMQS_TEST_URI)")
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join(timeout=120)
        self._signal(signal.SIGCONT)


def test_a_paused_broker_never_yields_a_guessed_tail(broker: BrokerSettings, streams: StreamFactory) -> None:
    """Tails asked of a starved broker (paused 2 s, running 5 ms, in turn) are exact, or the call fails.

    A broker that gets a few milliseconds at a time answers a subscription and delivers its chunk
    seconds apart: longer than the probe timeout. A guess (the first chunk id) would show up as 0.
    """
    s = streams.stream("pause")
    publish(broker, s, [f"m{i}".encode() for i in range(1500)], batch=100)
    time.sleep(0.05)
    middle_ms = int(time.time() * 1000)
    time.sleep(0.05)
    publish(broker, s, [f"n{i}".encode() for i in range(1500)], batch=100)
    c = client(broker)
    c.store_offsets("pause-check", {s: 5})  # a tracking entry after the last chunk: the tail stays 3000
    assert c.tail(s) == 3000
    assert c.offset_for_timestamp(s, middle_ms) == 1500
    tails: list[int] = []
    at_middle: list[int] = []

    def ask() -> None:
        own = client(broker)
        while not pauser.done.is_set():
            tails.append(own.tail(s))
            at_middle.append(own.offset_for_timestamp(s, middle_ms))

    with _Pauser(pause_s=PROBE_TIMEOUT_S + 0.5, times=8, every_s=0.005) as pauser:
        askers = [threading.Thread(target=ask) for _ in range(3)]
        for t in askers:
            t.start()
        for t in askers:
            t.join(timeout=300)
    assert len(tails) >= 3  # a loaded machine answers few; each answer must be exact
    assert set(tails) == {3000}
    assert set(at_middle) == {1500}  # the timestamp probe never falls back to the tail either


def test_a_paused_broker_never_shortens_a_filtered_read(
    broker: BrokerSettings, streams: StreamFactory
) -> None:
    """Sparse filter matches spread over the range, the broker paused past the filter idle time."""
    s = streams.stream("fpause")
    conn = conn_of(broker)
    wanted = set()
    with StreamProducer(conn, s, superstream=False, settings=WriteSettings()) as p:
        for chunk in range(40):
            bodies, filters = [], []
            for j in range(50):
                o = chunk * 50 + j
                match = chunk % 4 == 0
                bodies.append(encode(f"{'hit' if match else 'miss'}{o}".encode()))
                filters.append("red" if match else "blue")
                if match:
                    wanted.add(o)
            p.send(bodies, filter_values=filters)
            p.flush()
    settings = ReadSettings(filter_values=("red",), batch_rows=50, queue_capacity=50, poll_timeout_ms=60_000)
    reader = RangeReader(conn, s, 0, 2000, settings)
    got: list[int] = []
    with _Pauser(pause_s=5.0, times=1, every_s=0.2):
        for b in reader:
            got += b.column("offset").to_pylist()
            time.sleep(0.05)
    assert wanted <= set(got), f"missing {sorted(wanted - set(got))[:10]}"
    assert got == sorted(set(got))  # in order, none twice
