"""`dg`, Dagster's project CLI, on the example project dagster_rmqs/examples/components_project.

`dg check defs` accepts it (the defs.yaml schema check, then loading every definition), refuses a
broken defs.yaml with dg's own error, and `dg list defs` / `dg list components` show what the
component declares. Each call runs the venv's `dg` in a subprocess, from the project directory, the
way a user runs it.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.dagster
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "dagster_rmqs" / "examples" / "components_project"
DG = Path(sys.executable).parent / "dg"  # dagster-dg-cli, in the dev extra
DEFS_YAML = Path("src", "rmqs_orders", "defs", "orders", "defs.yaml")


def dg(*args: str, project: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`dg ARGS` in `project`, with the project's src/ importable (as `pip install -e .` makes it)."""
    home = tmp_path / "dagster_home"
    home.mkdir(exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    user_config = tmp_path / "dg-user.toml"
    user_config.write_text("[cli.telemetry]\nenabled = false\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "DG_"))}
    path = [project / "src", ROOT / "connector", ROOT / "provider", ROOT]
    env.update(
        PYTHONPATH=os.pathsep.join(str(p) for p in path),
        DAGSTER_HOME=str(home),
        DG_CLI_CONFIG=str(user_config),
        PYTHONDONTWRITEBYTECODE="1",  # nothing written into the example project
        NO_COLOR="1",
        COLUMNS="200",
    )
    return subprocess.run([str(DG), *args], cwd=project, env=env, capture_output=True, text=True, timeout=300)


def broken_copy(tmp_path: Path, old: str, new: str) -> Path:
    """A copy of the example project whose defs.yaml has `old` replaced by `new`."""
    project = tmp_path / "project"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("__pycache__"))
    text = (project / DEFS_YAML).read_text()
    assert old in text
    (project / DEFS_YAML).write_text(text.replace(old, new))
    return project


def test_dg_check_defs_accepts_the_example_project(tmp_path: Path) -> None:
    done = dg("check", "defs", project=EXAMPLE, tmp_path=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "All component YAML validated successfully." in done.stdout + done.stderr
    assert "All definitions loaded successfully." in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        # caught by the schema check of defs.yaml, before any code runs
        (
            "max_lag: 100000",
            "max_lag: lots",
            "defs.yaml:13 - dagster_rmqs.RabbitMQStreamComponent attributes.lag_check {'max_lag': 'lots'} is "
            "not valid",
        ),
        (
            "consumer_name: dagster-orders-yaml",
            "consumer_nmae: dagster-orders-yaml",
            "defs.yaml:7 - dagster_rmqs.RabbitMQStreamComponent attributes.consumer_nmae Additional "
            "properties are not allowed ('consumer_nmae' was unexpected)",
        ),
        # caught when the component builds its definitions (valid YAML, but not for this component)
        (
            "    group_name: rabbitmq",
            "    group_name: rabbitmq\n    skippable: true",
            "asset_attributes ['skippable'] are not supported by RabbitMQStreamComponent",
        ),
        (
            "superstream: orders",
            "superstream: orders\n  stream: orders-0",
            "give exactly one of 'stream' or 'superstream'",
        ),
    ],
    ids=["wrong-type", "unknown-field", "unsupported-asset-attribute", "stream-and-superstream"],
)
def test_dg_check_defs_refuses_a_broken_defs_yaml(tmp_path: Path, old: str, new: str, expected: str) -> None:
    project = broken_copy(tmp_path, old, new)
    done = dg("check", "defs", project=project, tmp_path=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-3000:]
    assert "All definitions loaded successfully." not in output
    assert "defs.yaml" in output
    assert expected in output, output[-3000:]


def test_dg_list_defs_shows_the_asset_sensor_and_check_the_component_declares(tmp_path: Path) -> None:
    done = dg("list", "defs", "--json", project=EXAMPLE, tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    listed = json.loads(done.stdout)
    (asset,) = listed["assets"]
    assert asset["asset_key"] == "orders" and asset["group_name"] == "rabbitmq"
    assert asset["owners"] == [{"team": "data"}]
    assert {"key": "domain", "value": "orders"} in asset["tags"]
    assert set(asset["kinds"]) == {"rabbitmq", "parquet"}  # the Arrow engine writes Parquet
    assert asset["source"].endswith(str(DEFS_YAML) + ":2")
    assert [s["name"] for s in listed["sensors"]] == ["orders_new_data"]
    assert [c["key"] for c in listed["asset_checks"]] == ["orders:consumer_lag"]
    assert [r["name"] for r in listed["resources"]] == ["rabbitmq"]


def test_dg_list_components_finds_the_component_type(tmp_path: Path) -> None:
    """rmqs's `dagster_dg_cli.registry_modules` entry point makes the type known to dg, with no
    `registry_modules` in the project (so `dg scaffold defs` and the defs.yaml schema check know it)."""
    done = dg("list", "components", "--json", project=EXAMPLE, tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    keys = [c["key"] for c in json.loads(done.stdout)["items"]]
    assert "dagster_rmqs.RabbitMQStreamComponent" in keys
