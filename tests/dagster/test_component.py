"""The YAML component: loaded from a defs folder in-process, validated by Dagster's CLI, materialized."""

import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from dagster import Definitions, EnvVar, build_sensor_context, load_from_defs_folder

from dagster_rmqs import RabbitMQStreamComponent, RabbitMQStreamsResource
from tests.conftest import StreamFactory
from tests.support.broker import BrokerSettings
from tests.support.data import publish

pytestmark = pytest.mark.dagster
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "dagster_rmqs" / "examples" / "components_project"
EXAMPLE_MODULE = "dagster_rmqs.examples.components_project.definitions"


def test_the_example_project_loads_its_yaml_component(monkeypatch: pytest.MonkeyPatch) -> None:
    defs = load_from_defs_folder(project_root=EXAMPLE)
    Definitions.validate_loadable(defs)
    (node,) = defs.resolve_asset_graph().asset_nodes
    assert node.key.to_user_string() == "orders"
    assert defs.resolve_assets_def("orders").op.pool == "rmqs-dagster-orders-yaml"
    assert [s.name for s in defs.sensors or []] == ["orders_new_data"]
    assert len(list(defs.asset_checks or [])) == 1
    rabbitmq = (defs.resources or {})["rabbitmq"]
    assert isinstance(rabbitmq, RabbitMQStreamsResource) and isinstance(rabbitmq.password, EnvVar)


def test_the_example_project_passes_dagsters_definition_check() -> None:
    """What `dg check defs` runs: `dagster definitions validate` on the project's code location."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "dagster"), "definitions", "validate", "-m", EXAMPLE_MODULE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Validation successful" in done.stdout + done.stderr
    dg = shutil.which("dg") or str(Path(sys.executable).parent / "dg")
    if Path(dg).exists():  # dagster-dg-cli is not a dependency (it would pin an older dagster)
        checked = subprocess.run(
            [dg, "check", "defs"], cwd=EXAMPLE, capture_output=True, text=True, timeout=300
        )
        assert checked.returncode == 0, checked.stderr[-3000:]


def test_a_yaml_declared_stream_asset_sensor_and_check_run_against_the_broker(
    broker: BrokerSettings, streams: StreamFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = streams.stream()
    publish(broker, s, [f"y{i}".encode() for i in range(33)])
    module = f"rmqs_yaml_{uuid.uuid4().hex[:8]}"
    project = tmp_path / "project"
    (project / module / "defs" / "events").mkdir(parents=True)
    (project / module / "__init__.py").write_text("")
    (project / module / "defs" / "__init__.py").write_text("")
    (project / "dg.toml").write_text(f'directory_type = "project"\n[project]\nroot_module = "{module}"\n')
    out = tmp_path / "lake"
    (project / module / "defs" / "events" / "defs.yaml").write_text(
        textwrap.dedent(
            f"""
            type: dagster_rmqs.RabbitMQStreamComponent
            attributes:
              name: events
              stream: {s}
              consumer_name: dg-yaml
              output_path: {out}
              engine: arrow
              rabbitmq_key: broker_a
              code_version: v3
              sensor: {{min_messages: 10}}
              lag_check: {{max_lag: 0}}
              connection:
                endpoints: {broker.host}:{broker.port}
                username: {broker.username}
                password_env: RMQS_DG_YAML_PASSWORD
            """
        )
    )
    monkeypatch.setenv("RMQS_DG_YAML_PASSWORD", broker.password)
    monkeypatch.syspath_prepend(str(project))
    defs = load_from_defs_folder(project_root=project)
    assert (
        RabbitMQStreamComponent.__name__ in (project / module / "defs" / "events" / "defs.yaml").read_text()
    )
    (sensor,) = defs.sensors or []
    resources = {"broker_a": (defs.resources or {})["broker_a"]}
    tick = sensor(build_sensor_context(resources=resources))
    assert len(tick.run_requests or []) == 1  # type: ignore[union-attr]
    result = defs.resolve_implicit_global_asset_job_def().execute_in_process()
    assert result.success
    (m,) = result.asset_materializations_for_node("events")
    assert m.metadata["dagster/row_count"].value == 33 and m.metadata["engine"].value == "arrow"
    assert all(e.passed for e in result.get_asset_check_evaluations())
    assert sorted(pq.read_table(out).column("value").to_pylist()) == sorted(
        f"y{i}".encode() for i in range(33)
    )
