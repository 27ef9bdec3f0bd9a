"""`StreamsHandle`: the calls the Airflow hook and the Dagster resource share, without a broker.

Each call is written once over `_connection()` / `_aconnection()`: sync calls look the connection
up in the caller's thread, async calls only through `_aconnection()` (the Airflow triggerer must
never block), and every result derives from one `Watermarks`.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from pyspark_rmqs.core.errors import BrokerTimeoutError
from pyspark_rmqs.options import ConnectionOptions, parse_connection_options
from pyspark_rmqs.runs import handle
from pyspark_rmqs.runs.handle import StreamsHandle
from pyspark_rmqs.runs.watermarks import PartitionWatermark, Watermarks

ROOT = Path(__file__).resolve().parents[2]
W = Watermarks(
    "orders",
    "etl",
    True,
    (PartitionWatermark("orders-0", 0, 30, 19), PartitionWatermark("orders-1", 5, 10, None)),
)


class _Handle(StreamsHandle):
    """A side of the handle: counts how its connection was looked up."""

    def __init__(self, timeout_s: float = 5.0) -> None:
        self.conn = parse_connection_options({"endpoints": "h:5552", "password": "pw"})
        self.sync_lookups = self.async_lookups = 0
        self.timeout_s = timeout_s

    def _connection(self) -> ConnectionOptions:
        self.sync_lookups += 1
        return self.conn

    async def _aconnection(self) -> ConnectionOptions:
        self.async_lookups += 1
        return self.conn

    def _metadata_timeout_s(self) -> float:
        return self.timeout_s


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The connector calls the handle made, with `W` as every watermarks answer."""
    seen: list[tuple[Any, ...]] = []

    async def fake_awatermarks(conn: Any, consumer: str, **target: str | None) -> Watermarks:
        seen.append(("watermarks", conn, consumer, target))
        return W

    async def fake_astore(conn: Any, consumer: str, last: Mapping[str, int]) -> None:
        seen.append(("astore", conn, consumer, dict(last)))

    def fake_store(conn: Any, consumer: str, last: Mapping[str, int]) -> None:
        seen.append(("store", conn, consumer, dict(last)))

    monkeypatch.setattr(handle, "awatermarks", fake_awatermarks)
    monkeypatch.setattr(handle, "astore_watermarks", fake_astore)
    monkeypatch.setattr(handle, "store_watermarks", fake_store)
    return seen


def test_sync_calls_derive_from_one_watermarks_answer(calls: list[tuple[Any, ...]]) -> None:
    h = _Handle()
    assert h.watermarks("etl", superstream="orders") is W
    assert h.tails(superstream="orders") == {"orders-0": 30, "orders-1": 10}
    assert h.stored_offsets("etl", superstream="orders") == {"orders-0": 19, "orders-1": None}
    assert h.lag("etl", superstream="orders") == 10 + 5
    assert h.lags("etl", superstream="orders") == {"orders-0": 10, "orders-1": 5}
    h.store_watermarks("etl", {"orders-0": 29})
    target = {"stream": None, "superstream": "orders"}
    assert calls == [
        ("watermarks", h.conn, "etl", target),
        ("watermarks", h.conn, "", target),  # tails: no consumer name
        *[("watermarks", h.conn, "etl", target)] * 3,
        ("store", h.conn, "etl", {"orders-0": 29}),
    ]
    assert (h.sync_lookups, h.async_lookups) == (6, 0)


def test_async_calls_never_look_the_connection_up_the_blocking_way(calls: list[tuple[Any, ...]]) -> None:
    h = _Handle()

    async def run() -> list[Any]:
        await h.astore_watermarks("etl", {"orders-1": 9})
        return [
            await h.awatermarks("etl", stream="orders-0"),
            await h.atails(stream="orders-0"),
            await h.astored_offsets("etl", stream="orders-0"),
            await h.alag("etl", stream="orders-0"),
            await h.alags("etl", stream="orders-0"),
        ]

    got = asyncio.run(run())
    assert got == [W, W.tails(), W.stored_offsets(), W.total_lag, W.lags()]
    assert (h.sync_lookups, h.async_lookups) == (0, 6)
    assert calls[0] == ("astore", h.conn, "etl", {"orders-1": 9})
    assert calls[2][2] == ""  # atails: no consumer name


def test_a_sync_metadata_call_is_bounded_by_the_sides_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    async def slow(*_: Any, **__: Any) -> Watermarks:
        await asyncio.sleep(5)
        return W

    monkeypatch.setattr(handle, "awatermarks", slow)
    with pytest.raises(BrokerTimeoutError, match=r"^watermarks of 'orders' did not finish within 0.05 s$"):
        _Handle(timeout_s=0.05).lag("etl", superstream="orders")


def test_spark_options_add_the_target_and_extra_to_the_connection() -> None:
    h = _Handle()
    base = h.conn.to_options()
    assert h.spark_options() == base and base["password"] == "pw"
    assert h.spark_options(stream="s", consumerName="c") == {**base, "stream": "s", "consumerName": "c"}
    opts = h.spark_options(superstream="ss")
    assert opts["superstream"] == "ss" and "stream" not in opts
    assert h.spark_options(endpoints="other:1")["endpoints"] == "other:1"  # extra wins


def test_a_side_must_say_where_its_connection_comes_from() -> None:
    class NoAsync(StreamsHandle):
        def _connection(self) -> ConnectionOptions:
            raise AssertionError

    with pytest.raises(TypeError, match="_aconnection"):
        NoAsync()  # type: ignore[abstract]


def test_watermarks_helpers_and_the_dict_shape_the_cli_and_xcom_depend_on() -> None:
    assert W.stored_offsets() == {"orders-0": 19, "orders-1": None}
    assert W.lags() == {"orders-0": 10, "orders-1": 5} and sum(W.lags().values()) == W.total_lag
    assert W.to_dict() == {
        "target": "orders",
        "consumer": "etl",
        "superstream": True,
        "total_lag": 15,
        "partitions": [
            {"stream": "orders-0", "first": 0, "tail": 30, "stored": 19, "next_offset": 20, "lag": 10},
            {"stream": "orders-1", "first": 5, "tail": 10, "stored": None, "next_offset": 5, "lag": 5},
        ],
    }


def test_importing_the_handle_loads_neither_pyspark_nor_pyarrow() -> None:
    code = (
        "import sys, pyspark_rmqs.runs.handle; "
        "print(sorted(m for m in ('pyspark', 'pyarrow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
