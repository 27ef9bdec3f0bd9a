"""Limited broker users for the permission tests: one user per test, through the management API.

Each user is allowed `configure`, `write` and `read` regexes on one virtual host (the team's own
streams, `rmqs.runs` where a test grants it) and is deleted afterwards, with its permissions.
A virtual host made here (`fresh_vhost`) is deleted too.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

import pytest

from tests.support.broker import BrokerSettings, management

RUNS = r"^rmqs\.runs$"


def team_prefix() -> str:
    """A unique team name: its streams are `<team>-...`, its regex `^<team>-.*`."""
    return f"team{uuid.uuid4().hex[:8]}"


@contextmanager
def limited_user(
    broker: BrokerSettings, *, configure: str, write: str, read: str, vhost: str | None = None
) -> Iterator[BrokerSettings]:
    """`broker` as a new user with only these permission regexes on `vhost` (default the broker's)."""
    if broker.external:
        pytest.skip("needs the local broker's management API to create users")
    where = broker.vhost if vhost is None else vhost
    user = f"rmqs-perm-{uuid.uuid4().hex[:8]}"
    password = "pw-" + uuid.uuid4().hex
    management("PUT", f"users/{user}", {"password": password, "tags": ""}, port=broker.management_port)
    try:
        management(
            "PUT",
            f"permissions/{quote(where, safe='')}/{user}",
            {"configure": configure, "write": write, "read": read},
            port=broker.management_port,
        )
        yield dataclasses.replace(broker, username=user, password=password, vhost=where)
    finally:
        management("DELETE", f"users/{user}", port=broker.management_port)


def grant(broker: BrokerSettings, user: BrokerSettings, *, configure: str, write: str, read: str) -> None:
    """Replace the permissions of `user` (from `limited_user`) in place: its open connections stay,
    as a team's long-lived process sees an administrator's fix."""
    management(
        "PUT",
        f"permissions/{quote(user.vhost, safe='')}/{user.username}",
        {"configure": configure, "write": write, "read": read},
        port=broker.management_port,
    )


@contextmanager
def fresh_vhost(broker: BrokerSettings) -> Iterator[str]:
    """A new, empty virtual host (no `rmqs.runs` yet) on which guest may do anything; deleted after."""
    if broker.external:
        pytest.skip("needs the local broker's management API to create virtual hosts")
    name = f"rmqs-perm-{uuid.uuid4().hex[:8]}"
    management("PUT", f"vhosts/{quote(name, safe='')}", port=broker.management_port)
    try:
        management(
            "PUT",
            f"permissions/{quote(name, safe='')}/guest",
            {"configure": ".*", "write": ".*", "read": ".*"},
            port=broker.management_port,
        )
        yield name
    finally:
        management("DELETE", f"vhosts/{quote(name, safe='')}", port=broker.management_port)
