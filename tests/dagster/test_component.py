"""The YAML component, loaded as `dg` loads it (the `dg` CLI itself: test_dg_project.py), materialized."""

import textwrap
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from dagster import (
    AssetKey,
    AssetsDefinition,
    AutomationCondition,
    Definitions,
    EnvVar,
    FreshnessPolicy,
    build_sensor_context,
    load_from_defs_folder,
)
from dagster.components.testing import create_defs_folder_sandbox
from dagster.version import __version__ as dagster_version

from dagster_rmqs import RabbitMQStreamComponent, RabbitMQStreamsResource
from tests.conftest import StreamFactory
from tests.support.broker import BrokerSettings
from tests.support.data import publish

pytestmark = pytest.mark.dagster
ROOT = Path(__file__).resolve().parents[2]
# Dagster 1.13 accepts a YAML number as a tag value; 1.12 (make test-compat's lowest end) wants a
# string in the YAML, which its template rendering still turns into a number (rmqs turns it back).
TIER = "1" if tuple(int(p) for p in dagster_version.split(".")[:2]) >= (1, 13) else '"1"'
EXAMPLE = ROOT / "dagster_rmqs" / "examples" / "components_project"


def test_the_example_project_loads_its_yaml_component(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE / "src"))  # what `pip install -e .` of the example does
    defs = load_from_defs_folder(project_root=EXAMPLE)
    Definitions.validate_loadable(defs)
    (node,) = defs.resolve_asset_graph().asset_nodes
    assert node.key.to_user_string() == "orders"
    orders = defs.resolve_assets_def("orders")
    assert orders.op.pool == "rmqs-dagster-orders-yaml"
    spec = orders.specs_by_key[AssetKey("orders")]
    assert spec.group_name == "rabbitmq" and spec.owners == ["team:data"] and spec.tags["domain"] == "orders"
    assert spec.freshness_policy == FreshnessPolicy.time_window(fail_window=timedelta(hours=1))
    assert [s.name for s in defs.sensors or []] == ["orders_new_data"]
    assert len(list(defs.asset_checks or [])) == 1
    rabbitmq = (defs.resources or {})["rabbitmq"]
    assert isinstance(rabbitmq, RabbitMQStreamsResource) and isinstance(rabbitmq.password, EnvVar)


@contextmanager
def yaml_component(attributes: str) -> Iterator[tuple[RabbitMQStreamComponent, AssetsDefinition]]:
    """A defs.yaml holding `attributes` (YAML text), loaded as `dg` loads it: its component and asset."""
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.defs_folder_path / "events"
        path.mkdir()
        body = textwrap.indent(textwrap.dedent(attributes).strip(), "  ")
        (path / "defs.yaml").write_text(
            "type: dagster_rmqs.RabbitMQStreamComponent\nattributes:\n"
            "  name: events\n  stream: events\n  consumer_name: yaml-attrs\n  output_path: lake/events\n"
            "  engine: arrow\n  connection: {endpoints: 'localhost:5552'}\n" + body + "\n"
        )
        with sandbox.load_component_and_build_defs(defs_path=path) as (component, defs):
            assert isinstance(component, RabbitMQStreamComponent)
            yield component, defs.resolve_assets_def("events")


def test_an_automation_condition_in_yaml_is_the_assets_own() -> None:
    with yaml_component(
        """
        asset_attributes:
          automation_condition: "{{ dg.AutomationCondition.on_cron('*/10 * * * *') }}"
        """
    ) as (_, asset):
        condition = asset.specs_by_key[AssetKey("events")].automation_condition
        assert condition == AutomationCondition.on_cron("*/10 * * * *")


def test_pool_in_yaml_is_the_assets_pool_and_defaults_to_the_consumers() -> None:
    with yaml_component("pool: orders-db") as (_, asset):
        assert asset.op.pool == "orders-db"
    with yaml_component("") as (_, asset):
        assert asset.op.pool == "rmqs-yaml-attrs"


def test_dagsters_asset_attributes_pass_through_from_yaml() -> None:
    with yaml_component(
        """
        asset_attributes:
          code_version: "3"
          owners: ["team:data", "ops@example.com"]
          tags: {domain: orders, tier: TIER}
          kinds: [rabbitmq, parquet, lakehouse]
          group_name: streams
          description: Orders as they arrive
          deps: [erp/customers]
          metadata: {runbook: "https://example.com/runbook"}
          freshness_policy: "{{ dg.FreshnessPolicy.time_window(fail_window=datetime.timedelta(hours=2)) }}"
        """.replace("TIER", TIER)
    ) as (_, asset):
        spec = asset.specs_by_key[AssetKey("events")]
        assert spec.code_version == "3"  # templates render "3" as a number; Dagster wants a string
        assert spec.owners == ["team:data", "ops@example.com"]
        assert spec.tags["domain"] == "orders" and spec.tags["tier"] == "1"
        assert spec.kinds == {"rabbitmq", "parquet", "lakehouse"}
        assert spec.group_name == "streams" and spec.description == "Orders as they arrive"
        assert [d.asset_key for d in spec.deps] == [AssetKey(["erp", "customers"])]
        assert spec.metadata["runbook"] == "https://example.com/runbook"
        assert spec.metadata["rmqs/consumer_name"] == "yaml-attrs"  # the asset's own metadata stays
        assert spec.freshness_policy == FreshnessPolicy.time_window(fail_window=timedelta(hours=2))


def test_yaml_metadata_cannot_override_the_assets_own_rmqs_keys() -> None:
    """Sensors and checks read the target back from the `rmqs/*` keys: a user's metadata under the
    same key must not change what they read (the key is the asset's, the rest is merged)."""
    with yaml_component(
        """
        asset_attributes:
          metadata: {rmqs/consumer_name: someone-else, runbook: "https://example.com/runbook"}
        """
    ) as (_, asset):
        spec = asset.specs_by_key[AssetKey("events")]
        assert spec.metadata["rmqs/consumer_name"] == "yaml-attrs"
        assert spec.metadata["runbook"] == "https://example.com/runbook"


def chain(error: BaseException | None) -> str:
    """The messages of an error and of the errors it was raised from (Dagster wraps load errors)."""
    parts = []
    while error is not None:
        parts.append(str(error))
        error = error.__cause__ or error.__context__
    return "\n".join(parts)


@pytest.mark.parametrize(
    "attributes",
    ["skippable: true", "partitions_def: {type: static, partition_keys: [a, b]}"],
)
def test_asset_attributes_the_stream_asset_cannot_take_are_refused(attributes: str) -> None:
    with pytest.raises(Exception) as raised, yaml_component(f"asset_attributes: {{{attributes}}}"):
        pass
    assert "not supported by RabbitMQStreamComponent" in chain(raised.value)
    assert attributes.split(":")[0] in chain(raised.value)


def test_an_invalid_automation_condition_template_names_the_field() -> None:
    with (
        pytest.raises(Exception) as raised,
        yaml_component("asset_attributes: {automation_condition: '{{ dg.AutomationCondition.nope() }}'}"),
    ):
        pass
    assert "automation_condition" in chain(raised.value) and "nope" in chain(raised.value)


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
              asset_attributes: {{code_version: v3}}
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
    assert defs.resolve_assets_def("events").code_versions_by_key == {AssetKey("events"): "v3"}
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


def test_a_yaml_component_connects_with_mutual_tls(
    broker: BrokerSettings, streams: StreamFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Client certificate and key from YAML reach the broker's TLS listener: the test CA's client
    certificate reads the stream; a certificate from another CA, same YAML otherwise, is refused
    (so the certificate is presented, not ignored). A PKCS12 keystore's password comes from an
    environment variable, never from the YAML."""
    from pyspark_rmqs.broker.client import BrokerClient
    from pyspark_rmqs.core.errors import BrokerUnavailableError
    from tests.integration.test_tls import TLS_PORT, make_ca, make_cert, openssl
    from tests.support.broker import broker_sh

    if broker.external:
        pytest.skip("needs the local broker's test CA and TLS listener")
    certs = Path(broker_sh("tls-dir").stdout.strip())  # the test CA and its client certificate
    s = streams.stream("mtls")
    publish(broker, s, [b"m"] * 7)
    intruder = make_cert(tmp_path, make_ca(tmp_path, "intruder-ca"), "intruder")
    store = tmp_path / "client.p12"
    openssl("pkcs12", "-export", "-in", certs / "client.pem", "-inkey", certs / "client.key",
            "-out", store, "-passout", "pass:St0re-PW")  # fmt: skip
    monkeypatch.setenv("RMQS_DG_KEYSTORE_PASSWORD", "St0re-PW")

    def resource(client_tls: str) -> RabbitMQStreamsResource:
        with create_defs_folder_sandbox() as sandbox:
            path = sandbox.defs_folder_path / "events"
            path.mkdir()
            (path / "defs.yaml").write_text(
                "type: dagster_rmqs.RabbitMQStreamComponent\nattributes:\n"
                f"  name: events\n  stream: {s}\n  consumer_name: mtls\n  output_path: lake/events\n"
                f"  engine: arrow\n  connection:\n    endpoints: 'localhost:{TLS_PORT}'\n"
                f"    tls: true\n    tls_ca_file: '{certs / 'ca.pem'}'\n{client_tls}"
            )
            with sandbox.load_component_and_build_defs(defs_path=path) as (_, defs):
                found = (defs.resources or {})["rabbitmq"]
                assert isinstance(found, RabbitMQStreamsResource)
                return found

    pem = resource(
        f"    tls_cert_file: '{certs / 'client.pem'}'\n    tls_key_file: '{certs / 'client.key'}'\n"
    )
    assert BrokerClient(pem.connection_options()).tail(s) == 7
    p12 = resource(f"    tls_keystore: '{store}'\n    tls_keystore_password_env: RMQS_DG_KEYSTORE_PASSWORD\n")
    assert "St0re-PW" not in repr(p12)
    assert BrokerClient(p12.connection_options()).tail(s) == 7
    refused = resource(f"    tls_cert_file: '{intruder[0]}'\n    tls_key_file: '{intruder[1]}'\n")
    with pytest.raises(BrokerUnavailableError, match="client certificate"):
        BrokerClient(refused.connection_options()).tail(s)
