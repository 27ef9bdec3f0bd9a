"""pytest_rmqs against RabbitMQ containers, as a user's tests run with no RMQS_TEST_URI set.

1. The user's project of examples/testing (the plugin's own fixture tests, a DAG under
   `dag.test()`, a Dagster asset) with this checkout's packages: the container is started, its
   stream port published on 127.0.0.1 and advertised there, and removed at the end.
2. A fresh venv with the wheel's `rmqs[testing]` and nothing else, outside the checkout: the
   plugin comes from the entry point, the broker from a container.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.test_wheel_install import Venvs, run, user_env
from tests.support.plugin_runs import USER_PROJECT, checkout_env, plugin_args, user_project

pytestmark = [pytest.mark.slow]


def no_container_left(image: str) -> bool:
    ps = subprocess.run(
        ["docker", "ps", "-aq", "--filter", "label=org.rmqs.pytest", "--filter", f"ancestor={image}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return ps.returncode == 0 and ps.stdout.strip() == ""


def test_the_users_project_runs_against_a_container(
    container_env: dict[str, str], docker_image: str, tmp_path: Path
) -> None:
    project = user_project(tmp_path)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin_args(), "-q", "--durations=3"],
        cwd=project,
        env=checkout_env(container_env),
        capture_output=True,
        text=True,
        timeout=900,
    )
    print(f"{time.monotonic() - started:6.1f} s  the user's project (container start included)")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "6 passed" in done.stdout, done.stdout[-2000:]
    assert no_container_left(docker_image)


def test_a_fresh_venv_with_rmqs_testing_runs_a_users_tests_against_a_container(
    venvs: Venvs, container_env: dict[str, str], docker_image: str, tmp_path: Path
) -> None:
    venv = venvs("testing")
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(USER_PROJECT / "test_streams.py", project)
    env = user_env(
        tmp_path, **{k: container_env[k] for k in ("RMQS_TEST_IMAGE", "TESTCONTAINERS_RYUK_DISABLED")}
    )
    env["RMQS_TEST_WHEN_NO_BROKER"] = "fail"
    done = run(
        [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"], project, env, 600
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "4 passed" in done.stdout, done.stdout[-2000:]
    assert no_container_left(docker_image)
