"""Distinct, quick connection errors: each failure says what is wrong, where, and never the password.

- nothing listening -> BrokerUnavailableError (retryable) naming the address, within 5 s;
- wrong password -> AuthenticationError naming the user;
- a virtual host the user may not use, or one that does not exist -> AuthenticationError naming it.

RabbitMQ answers a failed authentication after a deliberate delay of about 3 s, hence the 10 s
bound there. The vhost tests change the local broker (`broker.sh ctl`) and are skipped when
RMQS_TEST_URI names another broker.
"""

from __future__ import annotations

import os
import socket
import time
import traceback
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.core.errors import AuthenticationError, BrokerUnavailableError, RmqsError
from pyspark_rmqs.options import parse_connection_options
from tests.support.broker import BrokerSettings, ctl

pytestmark = pytest.mark.timeout(120)

SECRET = "C0nnect-Err0r-Secret"
EXTERNAL = bool(os.environ.get("RMQS_TEST_URI"))


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def failure(options: dict[str, str], stream: str = "any-stream") -> tuple[RmqsError, float]:
    """The error of a first call with these options, and how long it took."""
    conn = parse_connection_options(options)
    started = time.monotonic()
    with pytest.raises(RmqsError) as info:
        BrokerClient(conn).tail(stream)
    return info.value, time.monotonic() - started


def assert_no_secret(exc: BaseException, secret: str = SECRET) -> None:
    """Not in the message, the repr, nor anywhere in the printed traceback with its causes."""
    assert secret not in str(exc)
    assert secret not in repr(exc)
    assert secret not in "".join(traceback.format_exception(exc))


def base(b: BrokerSettings, **extra: str) -> dict[str, str]:
    return {
        "endpoints": f"{b.host}:{b.port}",
        "username": b.username,
        "password": b.password,
        "vhost": b.vhost,
        **extra,
    }


@pytest.fixture(scope="module")
def vhost(broker: BrokerSettings) -> Iterator[str]:
    """A virtual host on the local broker with no permissions for anyone; deleted after the module."""
    if EXTERNAL:
        pytest.skip("RMQS_TEST_URI is set: cannot create virtual hosts on that broker")
    name = f"rmqs-noperm-{uuid.uuid4().hex[:8]}"
    out = ctl("add_vhost", name)
    assert out.returncode == 0, out.stderr
    yield name
    ctl("delete_vhost", name)


# --------------------------------------------------------------------------------------------


def test_unreachable_broker_is_quick_retryable_and_names_the_address() -> None:
    port = closed_port()
    exc, took = failure({"endpoints": f"127.0.0.1:{port}", "password": SECRET})
    assert isinstance(exc, BrokerUnavailableError) and exc.retryable
    assert took < 5, took
    assert f"127.0.0.1:{port}" in str(exc) and "connection refused" in str(exc)
    assert_no_secret(exc)


def test_every_unreachable_address_is_named() -> None:
    ports = [closed_port(), closed_port()]
    exc, took = failure({"endpoints": ",".join(f"127.0.0.1:{p}" for p in ports), "password": SECRET})
    assert isinstance(exc, BrokerUnavailableError)
    assert took < 5, took
    for p in ports:
        assert f"127.0.0.1:{p}" in str(exc)
    assert_no_secret(exc)


def test_unreachable_address_in_a_uri_hides_the_uri_password() -> None:
    port = closed_port()
    exc, took = failure({"uris": f"rabbitmq-stream://guest:{SECRET}@127.0.0.1:{port}/%2F"})
    assert isinstance(exc, BrokerUnavailableError) and took < 5
    assert f"127.0.0.1:{port}" in str(exc)
    assert_no_secret(exc)


def test_wrong_password(broker: BrokerSettings) -> None:
    exc, took = failure(base(broker, password=SECRET))
    assert type(exc) is AuthenticationError and not exc.retryable
    assert took < 10, took
    msg = str(exc)
    assert f"'{broker.username}'" in msg and "password" in msg and f"{broker.host}:{broker.port}" in msg
    assert_no_secret(exc)


def test_unknown_user(broker: BrokerSettings) -> None:
    exc, _ = failure(base(broker, username="no-such-user-rmqs", password=SECRET))
    assert type(exc) is AuthenticationError
    assert "'no-such-user-rmqs'" in str(exc)
    assert_no_secret(exc)


def test_vhost_without_permission(broker: BrokerSettings, vhost: str) -> None:
    name = vhost
    exc, took = failure(base(broker, vhost=name))
    assert type(exc) is AuthenticationError
    assert took < 10, took
    msg = str(exc)
    assert f"'{name}'" in msg and "virtual host" in msg and f"'{broker.username}'" in msg
    assert_no_secret(exc.with_traceback(None), SECRET)
    # the password may equal the user name ("guest"): only the user name may show
    assert broker.password not in msg.replace(f"user '{broker.username}'", "")


def test_nonexistent_vhost(broker: BrokerSettings) -> None:
    name = f"rmqs-missing-{uuid.uuid4().hex[:8]}"
    exc, took = failure(base(broker, vhost=name))
    assert type(exc) is AuthenticationError
    assert took < 10, took
    assert f"'{name}'" in str(exc) and "virtual host" in str(exc) and "does not exist" in str(exc)
    assert broker.password not in str(exc).replace(f"user '{broker.username}'", "")


def test_the_errors_are_distinct(broker: BrokerSettings, vhost: str) -> None:
    """One call each: unreachable, wrong password, vhost without permission, missing vhost."""
    cases: dict[str, dict[str, str]] = {
        "unreachable": {"endpoints": f"127.0.0.1:{closed_port()}", "password": SECRET},
        "password": base(broker, password=SECRET),
        "no-permission": base(broker, vhost=vhost),
        "missing-vhost": base(broker, vhost=f"rmqs-missing-{uuid.uuid4().hex[:8]}"),
    }
    errors: dict[str, Any] = {k: failure(v)[0] for k, v in cases.items()}
    assert isinstance(errors["unreachable"], BrokerUnavailableError)
    for key in ("password", "no-permission", "missing-vhost"):
        assert type(errors[key]) is AuthenticationError, key
        assert not isinstance(errors[key], BrokerUnavailableError)  # never retried as transient
    messages = [str(e) for e in errors.values()]
    assert len(set(messages)) == len(messages)
    assert "virtual host" not in str(errors["password"])
    assert "password" not in str(errors["no-permission"])
    for e in errors.values():
        assert_no_secret(e)
