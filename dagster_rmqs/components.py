"""`RabbitMQStreamComponent`: a stream asset, its new-data sensor and its lag check from YAML.

    # src/<project>/defs/orders/defs.yaml
    type: dagster_rmqs.RabbitMQStreamComponent
    attributes:
      name: orders
      superstream: orders
      consumer_name: dagster-orders
      output_path: lake/orders
      sensor: {min_messages: 1}
      lag_check: {max_lag: 100000}
      connection: {uris_env: RMQS_URI}
      asset_attributes:
        group_name: rabbitmq
        automation_condition: "{{ dg.AutomationCondition.on_cron('0 * * * *') }}"

Everything maps onto the Python factories (`build_stream_asset`, `build_new_data_sensor`,
`build_lag_check`), so YAML and Python assets behave alike. `asset_attributes` is Dagster's own
model of asset attributes (the one `post_processing` uses), templates included; `pool` is the
concurrency pool (default `rmqs-<consumer_name>`). Secrets are named, never written:
`password_env` / `uris_env` (and the TLS stores' `*_password_env`) become `EnvVar`s, read when a
run connects. Mutual TLS: `connection: {tls: true, tls_ca_file: ..., tls_cert_file: ...,
tls_key_file: ...}`, or `tls_keystore` with `tls_keystore_password_env`.
"""

from typing import Any, Literal

from dagster import (
    DefaultSensorStatus,
    Definitions,
    EnvVar,
    PartitionsDefinition,
    TimeWindowPartitionsDefinition,
)
from dagster.components import Component, ComponentLoadContext, Model, Resolvable
from dagster.components.resolved.core_models import ResolvedAssetAttributes

from dagster_rmqs.assets import build_stream_asset
from dagster_rmqs.checks import build_lag_check
from dagster_rmqs.partitions import offset_range_partitions
from dagster_rmqs.resources import RabbitMQStreamsResource, SparkSessionResource
from dagster_rmqs.sensors import DEFAULT_RANGE_INTERVAL_S, build_new_data_sensor
from dagster_rmqs.targets import DEFAULT_RABBITMQ_KEY, DEFAULT_SPARK_KEY


class ConnectionModel(Model):
    """A `RabbitMQStreamsResource` provided under the component's `rabbitmq_key`.

    TLS as the resource takes it: the broker's CA (`tls_ca_file` or a JKS/PKCS12 `tls_truststore`)
    and, for mutual TLS, the client's certificate and key as PEM files (`tls_cert_file`,
    `tls_key_file`) or a PKCS12/JKS `tls_keystore`. Store passwords are named by environment
    variable, as the broker password is (`*_password_env`), never written in YAML.
    """

    endpoints: str | None = None
    uris_env: str | None = None  # the name of an environment variable holding the URIs
    username: str | None = None
    password_env: str | None = None  # the name of an environment variable holding the password
    vhost: str | None = None
    tls: bool = False
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_truststore: str | None = None
    tls_truststore_password_env: str | None = None
    tls_keystore: str | None = None
    tls_keystore_password_env: str | None = None
    tls_trust_all: bool = False


def _env(name: str | None) -> Any:
    """An `EnvVar` read when a run connects (a secret named, never written), or None."""
    return EnvVar(name) if name else None


class SparkModel(Model):
    """A `SparkSessionResource` provided under the component's `spark_key`."""

    master: str = "local[2]"
    remote: str | None = None
    spark_conf: dict[str, str] = {}


class TimeWindowModel(Model):
    """Time-window partitions (any cron); `end_offset: 1` makes the open window a partition too."""

    cron_schedule: str
    start: str
    fmt: str
    timezone: str = "UTC"
    end_offset: int = 0
    # Read windows still open by the broker's clock (default: where the output is replaced whole).
    allow_open_windows: bool | None = None


class SensorModel(Model):
    min_messages: int = 1
    minimum_interval_seconds: int = 30
    running: bool = False
    min_range_interval_s: float = DEFAULT_RANGE_INTERVAL_S
    max_range_messages: int | None = None


class LagCheckModel(Model):
    max_lag: int
    blocking: bool = True


# The Dagster asset attributes (`asset_attributes`) the stream asset takes; all go to
# `build_stream_asset` except `metadata`, merged into the asset's own.
ASSET_ATTRIBUTES = frozenset(
    {
        "automation_condition",
        "code_version",
        "deps",
        "description",
        "freshness_policy",
        "group_name",
        "kinds",
        "metadata",
        "owners",
        "tags",
    }
)


class RabbitMQStreamComponent(Component, Model, Resolvable):
    """A (super) stream read into an output under the watermark protocol, declared in YAML."""

    name: str
    consumer_name: str
    stream: str | None = None
    superstream: str | None = None
    output_path: str
    output_format: str = "parquet"
    engine: Literal["spark", "arrow"] = "spark"
    metadata_fields: str | None = None
    key_prefix: list[str] | None = None
    # Dagster's asset attributes, resolved as in `post_processing` (templates such as
    # "{{ dg.AutomationCondition.eager() }}" included): see ASSET_ATTRIBUTES for those accepted.
    asset_attributes: ResolvedAssetAttributes = {}
    pool: str | None = None  # the concurrency pool; default rmqs-<consumer_name>
    offset_ranges: str | None = None  # the name of dynamic offset-range partitions
    time_window: TimeWindowModel | None = None
    sensor: SensorModel | None = None
    lag_check: LagCheckModel | None = None
    rabbitmq_key: str = DEFAULT_RABBITMQ_KEY
    spark_key: str = DEFAULT_SPARK_KEY
    connection: ConnectionModel | None = None
    spark: SparkModel | None = None

    def partitions(self) -> PartitionsDefinition | None:
        if self.offset_ranges and self.time_window:
            raise ValueError("give offset_ranges or time_window, not both")
        if self.offset_ranges:
            return offset_range_partitions(self.offset_ranges)
        if self.time_window:
            w = self.time_window
            return TimeWindowPartitionsDefinition(
                cron_schedule=w.cron_schedule,
                start=w.start,
                fmt=w.fmt,
                timezone=w.timezone,
                end_offset=w.end_offset,
            )
        return None

    def factory_attributes(self) -> dict[str, Any]:
        """`asset_attributes` as `build_stream_asset` keywords."""
        given = dict(self.asset_attributes)
        unknown = sorted(set(given) - ASSET_ATTRIBUTES)
        if unknown:
            raise ValueError(
                f"asset_attributes {unknown} are not supported by RabbitMQStreamComponent (partitions: "
                f"time_window or offset_ranges); supported: {sorted(ASSET_ATTRIBUTES)}"
            )
        if given.get("kinds") is not None:
            given["kinds"] = set(given["kinds"])
        if given.get("owners") is not None:
            given["owners"] = list(given["owners"])
        if given.get("code_version") is not None:  # template rendering turns "3" into the number 3
            given["code_version"] = str(given["code_version"])
        if given.get("tags") is not None:  # the same for a tag's "1" (Dagster 1.13 turns it back, 1.12 fails)
            given["tags"] = {str(k): str(v) for k, v in dict(given["tags"]).items()}
        return given

    def build_defs(self, context: ComponentLoadContext) -> Definitions:
        attributes = self.factory_attributes()
        stream_asset = build_stream_asset(
            self.name,
            stream=self.stream,
            superstream=self.superstream,
            consumer_name=self.consumer_name,
            output_path=self.output_path,
            output_format=self.output_format,
            engine=self.engine,
            metadata_fields=self.metadata_fields,
            partitions_def=self.partitions(),
            allow_open_windows=self.time_window.allow_open_windows if self.time_window else None,
            rabbitmq_key=self.rabbitmq_key,
            spark_key=self.spark_key,
            key_prefix=self.key_prefix,
            pool=self.pool,
            **attributes,
        )
        sensors = []
        if self.sensor is not None:
            s = self.sensor
            sensors.append(
                build_new_data_sensor(
                    stream_asset,
                    s.min_messages,
                    minimum_interval_seconds=s.minimum_interval_seconds,
                    default_status=DefaultSensorStatus.RUNNING if s.running else DefaultSensorStatus.STOPPED,
                    min_range_interval_s=s.min_range_interval_s,
                    max_range_messages=s.max_range_messages,
                )
            )
        checks = []
        if self.lag_check is not None:
            checks.append(
                build_lag_check(stream_asset, self.lag_check.max_lag, blocking=self.lag_check.blocking)
            )
        resources: dict[str, object] = {}
        if self.connection is not None:
            c = self.connection
            resources[self.rabbitmq_key] = RabbitMQStreamsResource(
                endpoints=c.endpoints,
                uris=EnvVar(c.uris_env) if c.uris_env else None,
                username=c.username,
                password=EnvVar(c.password_env) if c.password_env else None,
                vhost=c.vhost,
                tls=c.tls,
                tls_ca_file=c.tls_ca_file,
                tls_cert_file=c.tls_cert_file,
                tls_key_file=c.tls_key_file,
                tls_truststore=c.tls_truststore,
                tls_truststore_password=_env(c.tls_truststore_password_env),
                tls_keystore=c.tls_keystore,
                tls_keystore_password=_env(c.tls_keystore_password_env),
                tls_trust_all=c.tls_trust_all,
            )
        if self.spark is not None and self.engine == "spark":
            resources[self.spark_key] = SparkSessionResource(
                master=self.spark.master, remote=self.spark.remote, spark_conf=dict(self.spark.spark_conf)
            )
        return Definitions(assets=[stream_asset], sensors=sensors, asset_checks=checks, resources=resources)
