"""The connection pool: reuse, idle eviction, and a fresh pool per process and loop."""

from __future__ import annotations

import asyncio

import pytest

from pyspark_rmqs.broker import pool as pool_module
from pyspark_rmqs.broker.pool import ConnectionPool, get_pool


class FakeClient:
    def __init__(self) -> None:
        self.alive = True
        self.closed = False
        self.in_use = False

    def busy(self) -> bool:
        return self.in_use

    def is_connection_alive(self) -> bool:
        return self.alive

    async def close(self) -> None:
        self.closed = True
        self.alive = False


class Conn:
    def cache_key(self) -> tuple[str, ...]:
        return ("h", "u")


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[FakeClient]:
    """The connections the pool opened, in order (`connect` replaced by a fake)."""
    opened: list[FakeClient] = []

    async def fake_connect(conn: object, name: str = "rmqs", node: object = None) -> FakeClient:
        opened.append(FakeClient())
        return opened[-1]

    monkeypatch.setattr(pool_module, "connect", fake_connect)
    return opened


def test_acquire_reuses_released_connections_and_evicts_idle(made: list[FakeClient]) -> None:
    async def scenario() -> None:
        pool = ConnectionPool()
        a = await pool.acquire(Conn())
        pool.release(Conn(), a)  # type: ignore[arg-type]
        b = await pool.acquire(Conn())
        assert b is a and len(made) == 1  # reused
        pool.release(Conn(), b)  # type: ignore[arg-type]
        assert await pool.evict_idle(now=10**9) == 1 and a.closed  # idle too long: closed
        c = await pool.acquire(Conn())
        assert c is not a and len(made) == 2
        c.alive = False  # a dead connection is never handed out again
        pool.release(Conn(), c)  # type: ignore[arg-type]
        d = await pool.acquire(Conn())
        assert d is not c
        await pool.close()

    asyncio.run(scenario())


def test_an_idle_locator_is_closed_too_but_never_one_with_a_request_under_way(made: list[FakeClient]) -> None:
    """A reused Spark Python worker keeps its pool while it lives: its metadata connection must not
    outlive IDLE_SECONDS either (the soak saw two such sockets held after the query stopped)."""

    async def scenario() -> None:
        pool = ConnectionPool()
        a = await pool.locator(Conn())
        assert await pool.locator(Conn()) is a  # shared while in use
        assert await pool.evict_idle() == 0 and not a.closed  # used just now
        a.in_use = True  # a request awaits its answer (or a probe is subscribed)
        assert await pool.evict_idle(now=10**9) == 0 and not a.closed
        a.in_use = False
        assert await pool.evict_idle(now=10**9) == 1 and a.closed
        b = await pool.locator(Conn())
        assert b is not a and len(made) == 2  # reopened on the next use
        await pool.close()

    asyncio.run(scenario())


def test_pool_is_per_process_and_loop() -> None:
    async def one() -> ConnectionPool:
        return get_pool()

    p1 = asyncio.run(one())
    p2 = asyncio.run(one())
    assert p1 is not p2  # another loop (a forked child has other loops too): never share sockets


def test_idle_time_comes_from_the_environment_and_bad_values_name_the_variable() -> None:
    import pytest

    assert pool_module.idle_seconds({}) == 60.0
    assert pool_module.idle_seconds({"RMQS_POOL_IDLE_SECONDS": "15"}) == 15.0
    assert pool_module.idle_seconds({"RMQS_POOL_IDLE_SECONDS": "0.5"}) == 0.5
    for bad in ("0", "-3", "soon", "inf", "nan"):
        with pytest.raises(
            ValueError, match=r"RMQS_POOL_IDLE_SECONDS='.*': expected a number of seconds above 0"
        ):
            pool_module.idle_seconds({"RMQS_POOL_IDLE_SECONDS": bad})


def test_the_suite_runs_with_a_short_idle_time_set_before_the_pool_was_imported() -> None:
    """tests/conftest.py sets 15 s so the soak waits for idle eviction 15-23 s, not 60-90 s."""
    import os

    configured = float(os.environ["RMQS_POOL_IDLE_SECONDS"])
    assert configured == pool_module.IDLE_SECONDS


def test_a_connection_handed_out_while_idle_ones_close_is_never_filed_back_as_idle(
    made: list[FakeClient],
) -> None:
    """`evict_idle` awaits each close: an `acquire` in that window takes a fresh idle connection, which
    must stay taken (filed back, a second writer got the same connection and the broker refused its
    publisher id as already taken: seen in a fresh-clone run)."""

    class SlowClose(FakeClient):
        async def close(self) -> None:
            await asyncio.sleep(0.05)  # the broker's close handshake
            await super().close()

    async def scenario() -> None:
        pool = ConnectionPool()
        old, fresh = SlowClose(), FakeClient()
        pool.release(Conn(), old)  # type: ignore[arg-type]
        pool._idle[(Conn().cache_key(), None)] = [(0.0, old), (10**9 - 1.0, fresh)]  # type: ignore[list-item]
        eviction = asyncio.ensure_future(pool.evict_idle(now=10**9))
        await asyncio.sleep(0.01)  # the eviction is closing `old`
        taken = await pool.acquire(Conn())
        assert taken is fresh
        assert await eviction == 1 and old.closed
        again = await pool.acquire(Conn())
        assert again is not taken  # a new connection, not the one in use
        await pool.close()

    asyncio.run(scenario())
