"""The container tier (`make test-containers`): a Docker daemon and the local RabbitMQ image, once.

No image registry is reachable here, so the image is rmqs's own (scripts/containers.sh builds it
from the broker's trixie root, once per machine) and testcontainers' reaper (Ryuk, pulled from a
registry) is off: each container is removed by the fixture that started it. A dockerd this session
started is stopped at its end; one that was already running is left alone.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# The wheel and its fresh venvs, as tests/e2e/test_wheel_install.py makes them (fixtures, shared).
from tests.e2e.test_wheel_install import venvs, wheel  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "containers.sh"


def containers_sh(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def docker_image() -> Iterator[str]:
    """The image's name, built (or found up to date) on a daemon that answers."""
    answered = subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
    if not answered:
        up = containers_sh("dockerd-up", timeout=600)
        if up.returncode != 0:
            pytest.fail(f"no Docker daemon, and scripts/containers.sh dockerd-up failed:\n{up.stderr}")
    started = time.monotonic()
    built = containers_sh("image")
    assert built.returncode == 0, built.stderr
    print(f"\n{time.monotonic() - started:6.1f} s  image: {built.stderr.strip().splitlines()[-1]}")
    yield containers_sh("image-name").stdout.strip()
    if not answered:
        containers_sh("dockerd-down", timeout=120)


@pytest.fixture
def container_env(docker_image: str) -> dict[str, str]:
    """The environment of a test run that must start its broker in a container (no RMQS_TEST_URI)."""
    env = {k: v for k, v in os.environ.items() if k != "RMQS_TEST_URI"}
    env.update(
        RMQS_TEST_IMAGE=docker_image, TESTCONTAINERS_RYUK_DISABLED="true", RMQS_TEST_WHEN_NO_BROKER="fail"
    )
    return env
