"""Running pytest the way a user of rmqs's plugin does: in a folder of their own, outside the checkout."""

from __future__ import annotations

import os
import shutil
from importlib.metadata import entry_points
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
USER_PROJECT = REPO / "examples" / "testing"  # docs/testing.md links to its files


def user_project(where: Path) -> Path:
    """A copy of examples/testing under `where` (outside the checkout, its own rootdir)."""
    target = where / "user_project"
    shutil.copytree(USER_PROJECT, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def plugin_args() -> list[str]:
    """`-p pytest_rmqs.plugin` when this venv predates the plugin's entry point (else it loads by itself)."""
    installed = any(ep.name == "rmqs" for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "pytest_rmqs.plugin"]


def checkout_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with this checkout's packages importable from anywhere (the editable install's paths)."""
    paths = [str(REPO / "connector"), str(REPO / "provider"), str(REPO)]
    return {**env, "PYTHONPATH": os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
