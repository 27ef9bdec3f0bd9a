"""Test-side broker settings and stream lifecycle, straight on rstream (no rmqs code under test)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from rstream import Producer, SuperStreamProducer
from rstream.superstream import SuperStreamCreationOption  # noqa: F401  (documented alternative)

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class BrokerSettings:
    """Where the test broker listens; `uri` is what a user would pass as the `uris` option."""

    host: str = "localhost"
    port: int = 5552
    username: str = "guest"
    password: str = "guest"
    vhost: str = "/"
    external: bool = False
    extra: dict[str, str] = field(default_factory=dict)
    management_port: int = 15672

    @property
    def uri(self) -> str:
        from urllib.parse import quote

        return (
            f"rabbitmq-stream://{quote(self.username)}:{quote(self.password)}@{self.host}:{self.port}/"
            f"{quote(self.vhost, safe='')}"
        )

    @property
    def spark_options(self) -> dict[str, str]:
        return {
            "endpoints": f"{self.host}:{self.port}",
            "username": self.username,
            "password": self.password,
            "vhost": self.vhost,
        }


def settings_from_env() -> BrokerSettings:
    uri = os.environ.get("RMQS_TEST_URI")
    if not uri:
        return BrokerSettings()
    u = urlparse(uri)
    vhost = unquote(u.path[1:]) if u.path and u.path != "/" else "/"
    return BrokerSettings(
        host=u.hostname or "localhost",
        port=u.port or 5552,
        username=unquote(u.username or "guest"),
        password=unquote(u.password or "guest"),
        vhost=vhost or "/",
        external=True,
    )


BROKER_SH = REPO / "scripts" / "broker.sh"

# A second local broker, for the tests that stop, restart or pause one (`restartable_broker` in
# tests/conftest.py): its own home, ports and epmd, a copy of the first broker's installation. With
# it those tests run beside all the others instead of alone after them, and the others never see
# their faults. The fixture starts it when its first test needs it (or `make restartable-broker-up`).
RESTARTABLE_ENV = {
    "RMQS_BROKER_HOME": os.environ.get("RMQS_TEST_RESTARTABLE_HOME", "/var/cache/rmqs-broker-restartable"),
    "RMQS_BROKER_COPY_FROM": os.environ.get("RMQS_BROKER_HOME", "/var/cache/rmqs-broker") + "/trixie",
    "RMQS_BROKER_NODES": "1",
    "RMQS_STREAM_PORT": "5562",
    "RMQS_STREAM_TLS_PORT": "5561",
    "RMQS_AMQP_PORT": "5682",
    "RMQS_MANAGEMENT_PORT": "15682",
    "RMQS_EPMD_PORT": "4379",
}
RESTARTABLE = BrokerSettings(port=5562, management_port=15682)


def ensure_local_broker() -> None:
    """Start the project's broker (idempotent); a no-op when RMQS_TEST_URI names another one."""
    subprocess.run(["bash", str(BROKER_SH), "up"], check=True)


def ensure_restartable_broker() -> BrokerSettings:
    """Start the second local broker (idempotent) and return its settings."""
    done = broker_sh("up", timeout=300, env=RESTARTABLE_ENV)
    assert done.returncode == 0, f"broker.sh up (restartable) failed: {done.stderr[-2000:]}"
    return RESTARTABLE


def broker_sh(
    *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`scripts/broker.sh ARGS` (up, down, ctl ...), its output captured; `env` (e.g.
    `RESTARTABLE_ENV`) picks another broker than the default one."""
    return subprocess.run(
        ["bash", str(BROKER_SH), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else {**os.environ, **env},
    )


def ctl(*args: str) -> subprocess.CompletedProcess[str]:
    """`rabbitmqctl ARGS` on the local broker."""
    return broker_sh("ctl", *args)


def unique_name(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _producer(s: BrokerSettings) -> Producer:
    return Producer(s.host, s.port, username=s.username, password=s.password, vhost=s.vhost)


async def create_stream(s: BrokerSettings, name: str, arguments: dict[str, object] | None = None) -> None:
    async with _producer(s) as p:
        await p.create_stream(name, arguments=arguments)


async def delete_stream(s: BrokerSettings, name: str) -> None:
    async with _producer(s) as p:
        await p.delete_stream(name, missing_ok=True)


async def create_super_stream(s: BrokerSettings, name: str, partitions: int) -> list[str]:
    p = SuperStreamProducer(
        s.host,
        s.port,
        username=s.username,
        password=s.password,
        vhost=s.vhost,
        super_stream=name,
        routing_extractor=lambda m: "k",
    )
    try:
        await p.create_super_stream(name, n_partitions=partitions)
    finally:
        await p.close()
    return [f"{name}-{i}" for i in range(partitions)]


async def delete_super_stream(s: BrokerSettings, name: str) -> None:
    p = SuperStreamProducer(
        s.host,
        s.port,
        username=s.username,
        password=s.password,
        vhost=s.vhost,
        super_stream=name,
        routing_extractor=lambda m: "k",
    )
    try:
        await p.delete_super_stream(name, missing_ok=True)
    finally:
        await p.close()


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def management(method: str, path: str, body: dict[str, Any] | None = None, port: int = 15672) -> Any:
    """One call to a local broker's management HTTP API (guest/guest on 127.0.0.1:`port`); the
    answer's JSON, None when it has none."""
    import base64
    import json
    import urllib.request

    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={
            "content-type": "application/json",
            "authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
        },
    )
    with urllib.request.urlopen(req, timeout=10) as answer:
        text = answer.read()
    return json.loads(text) if text else None


def main(argv: list[str]) -> int:
    """`python -m tests.support.broker restartable up|down|status`: the second broker, from make."""
    if len(argv) != 2 or argv[0] != "restartable" or argv[1] not in ("up", "down", "status"):
        print("usage: python -m tests.support.broker restartable up|down|status")
        return 2
    if argv[1] == "up" and settings_from_env().external:
        return 0  # RMQS_TEST_URI: the restart tests skip, no second broker is needed
    done = broker_sh(argv[1], timeout=300, env=RESTARTABLE_ENV)
    print((done.stdout + done.stderr).strip().replace("broker:", "restartable broker:"))
    return done.returncode


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
