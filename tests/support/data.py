"""Test data helpers on rmqs's own producer and client (tests of the producer itself live elsewhere)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.broker.writer import StreamProducer, WriteSettings
from pyspark_rmqs.core.codec import encode
from pyspark_rmqs.options import ConnectionOptions, parse_connection_options
from tests.support.broker import BrokerSettings

T = TypeVar("T")


def conn_of(b: BrokerSettings) -> ConnectionOptions:
    return parse_connection_options(
        {"endpoints": f"{b.host}:{b.port}", "username": b.username, "password": b.password, "vhost": b.vhost}
    )


def publish(b: BrokerSettings, stream: str, bodies: Sequence[bytes], batch: int = 1000) -> None:
    """Publish each body as one message to `stream`, waiting for every confirm."""
    with StreamProducer(conn_of(b), stream, superstream=False, settings=WriteSettings()) as p:
        for i in range(0, len(bodies), batch):
            p.send([encode(x) for x in bodies[i : i + batch]])
        p.flush()


def publish_keyed(b: BrokerSettings, superstream: str, items: Sequence[tuple[str, bytes]]) -> None:
    """Publish (routing key, body) pairs to a super stream with hash routing."""
    with StreamProducer(conn_of(b), superstream, superstream=True, settings=WriteSettings()) as p:
        p.send([encode(body) for _, body in items], routing_keys=[k for k, _ in items])
        p.flush()


def client(b: BrokerSettings) -> BrokerClient:
    return BrokerClient(conn_of(b))


def spark_options(b: BrokerSettings, **extra: str) -> dict[str, str]:
    return {**b.spark_options, **{k: str(v) for k, v in extra.items()}}


def settled(
    read: Callable[[], T],
    *,
    stable_s: float,
    wait_s: float,
    poll_s: float,
    done: Callable[[T], bool] = lambda _: True,
) -> T:
    """`read()` once it returned the same value for `stable_s` and `done` holds; its last value after
    `wait_s`. The broker deletes segments in the background, after the publish that rolled them over
    is confirmed: a test that reads a stream's first offset right away races it."""
    last = read()
    since = time.monotonic()
    deadline = since + wait_s
    while time.monotonic() < deadline:
        time.sleep(poll_s)
        now = read()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= stable_s and done(now):
            break
    return last


def settled_bounds(b: BrokerSettings, stream: str, *, truncated: bool = False) -> tuple[int, int]:
    """(first offset, tail) once retention stopped moving (a compat run read a first offset of 0
    right after the publish). With `truncated`, it also waits (up to 15 s) for retention to have
    removed something."""
    bounds = settled(
        lambda: client(b).bounds([stream])[stream],
        stable_s=0.3,
        wait_s=15,
        poll_s=0.3,
        done=lambda now: now is not None and (now[0] > 0 or not truncated),
    )
    assert bounds is not None, f"stream {stream!r} is empty"
    return bounds
