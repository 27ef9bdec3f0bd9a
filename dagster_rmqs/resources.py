"""Dagster resources: the broker connection and a SparkSession.

`RabbitMQStreamsResource` holds connection settings as Dagster config, so the password can come
from an `EnvVar` and the UI shows the variable's name, not its value. Its calls are
`pyspark_rmqs.runs.handle.StreamsHandle`'s, the same code as the Airflow hook's: watermarks
(`watermarks`, `tails`, `stored_offsets`, `lag` (total), `lags` (per partition stream),
`store_watermarks`, and `a...` twins for async code), stream management, `publish`,
`read_batches` and `spark_options`. None of them starts a JVM; only `publish` and `read_batches`
import pyarrow, so sensors and checks use the resource freely.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from dagster import ConfigurableResource, EnvVar
from pydantic import Field

from pyspark_rmqs import jobs
from pyspark_rmqs.core.redact import redact_option
from pyspark_rmqs.errors import ConfigurationError
from pyspark_rmqs.options import ConnectionOptions, parse_connection_options
from pyspark_rmqs.runs.handle import StreamsHandle

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class RabbitMQStreamsResource(StreamsHandle, ConfigurableResource):
    """Where the streams live. Give `endpoints` or `uris` (a URI's password wins over `password`)."""

    endpoints: str | None = Field(default=None, description="Comma-separated host:port (port 5552).")
    uris: str | None = Field(
        default=None, description="Comma-separated rabbitmq-stream://user:password@host:port/vhost."
    )
    username: str | None = Field(default=None, description="Defaults to 'guest'.")
    password: str | None = Field(default=None, description="Use EnvVar('...'); defaults to 'guest'.")
    vhost: str | None = Field(default=None, description="Virtual host; defaults to '/'.")
    tls: bool = False
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_trust_all: bool = False
    tls_truststore: str | None = None
    tls_truststore_password: str | None = None
    tls_keystore: str | None = None
    tls_keystore_password: str | None = None
    address_resolver_class: str | None = Field(
        default=None,
        description="Dotted path of an addressResolverClass (load balancers, NAT: docs/connecting.md).",
    )
    metadata_timeout_s: float = Field(
        default=40.0, description="Bound on one metadata call (sensors must finish within 60 s)."
    )

    def __repr_args__(self) -> Any:  # never show a secret in a repr or a log line
        for name, value in super().__repr_args__():
            yield name, (redact_option(name, value) if name and isinstance(value, str) else value)

    def connection_options(self) -> ConnectionOptions:
        """The parsed connection (validated; a bad setting raises a ConfigurationError naming it)."""
        raw = {
            "endpoints": self.endpoints,
            "uris": self.uris,
            "username": self.username,
            "password": self.password,
            "vhost": self.vhost,
            "tls": "true" if self.tls else None,
            "tls.caFile": self.tls_ca_file,
            "tls.certFile": self.tls_cert_file,
            "tls.keyFile": self.tls_key_file,
            "tls.trustAll": "true" if self.tls_trust_all else None,
            "tls.truststore": self.tls_truststore,
            "tls.truststorePassword": self.tls_truststore_password,
            "tls.keystore": self.tls_keystore,
            "tls.keystorePassword": self.tls_keystore_password,
            "addressResolverClass": self.address_resolver_class,
        }
        return parse_connection_options({k: _value(v) for k, v in raw.items() if v is not None})

    # The shared calls come from `StreamsHandle` (the same code as `airflow_rmqs.hooks.RabbitMQStreamHook`);
    # the resource provides its connection from its config and bounds sync metadata calls by
    # `metadata_timeout_s`.

    def _connection(self) -> ConnectionOptions:
        return self.connection_options()

    async def _aconnection(self) -> ConnectionOptions:
        return self.connection_options()

    def _metadata_timeout_s(self) -> float:
        return self.metadata_timeout_s

    def stream_uri(self, name: str) -> str:
        """`rabbitmq-stream://host:port/vhost/stream`: the stream's identity, without credentials."""
        return stream_uri(self.connection_options(), name)


def produce_run_identity(context: Any) -> str:
    """A produce run's identity for `RabbitMQStreamsResource.publish(..., producer_name=...,
    run_identity=...)` from an asset's (or op's) context: the asset key (or op name), the partition
    key when partitioned, and the run's root run id. Retries of a step (a `RetryPolicy`) and
    re-executions of a failed run (run retries, "re-execute from failure") share it, so they add
    only what the failed try did not get stored; a new run of the job is a new produce run.
    """
    run = getattr(context, "dagster_run", None) or getattr(context, "run", None)
    root = getattr(run, "root_run_id", None) or context.run_id
    try:
        what = context.asset_key.to_user_string()
    except Exception:  # an op, or a multi-asset step
        what = context.op.name
    partition = context.partition_key if getattr(context, "has_partition_key", False) else None
    return "/".join(x for x in (what, partition, root) if x)


def _value(v: str) -> str:
    """A setting's value; an `EnvVar` is read here too, so the resource also works outside a run."""
    return v.get_value() or "" if isinstance(v, EnvVar) else v


def stream_uri(conn: ConnectionOptions, name: str) -> str:
    host, port = conn.addresses()[0]
    host = f"[{host}]" if ":" in host else host
    return f"rabbitmq-stream://{host}:{port}/{quote(conn.vhost, safe='')}/{quote(name, safe='')}"


class SparkSessionResource(ConfigurableResource):
    """A SparkSession: local (`master`) by default, Spark Connect when `remote` is set.

    The session is got-or-created and never stopped here: it is shared by the runs of a process.
    To use a session of your own, pass it directly under the Spark resource key instead (or any
    resource exposing `get_session()` or `spark_session`, e.g. `dagster_pyspark.PySparkResource`).
    """

    master: str = Field(default="local[2]", description="Spark master of a local session.")
    remote: str | None = Field(default=None, description="Spark Connect URL (sc://host:15002).")
    spark_conf: dict[str, str] = Field(default_factory=dict, description="Extra Spark configuration.")
    app_name: str = "rmqs-dagster"
    reuse_session: bool = Field(
        default=True,
        description=(
            "With `remote`: attach to the server-side session every step with the same settings "
            "shares, so the server's Python workers stay up between steps (False: a session per process)."
        ),
    )

    def get_session(self) -> SparkSession:
        return jobs.spark_session(
            master=None if self.remote else self.master,
            conf=self.spark_conf,
            remote=self.remote,
            app=self.app_name,
            reuse_session=self.reuse_session,
        )


def session_of(spark: Any) -> SparkSession:
    """The session behind a Spark resource, whatever its kind.

    Accepted: a SparkSession (classic or Spark Connect) given directly; `SparkSessionResource`, or
    any resource with a `get_session()` method; any resource with a `spark_session` attribute or
    property (`dagster_pyspark.PySparkResource`, without depending on dagster-pyspark).
    """
    get = getattr(spark, "get_session", None)
    if callable(get):
        return get()
    if type(spark).__name__ != "SparkSession":
        session = getattr(spark, "spark_session", None)
        if session is not None:
            return session() if callable(session) else session
    if not hasattr(spark, "read"):
        raise ConfigurationError(
            f"the Spark resource is a {type(spark).__name__}: give a SparkSession, a SparkSessionResource, "
            "or a resource with get_session() or spark_session (such as dagster_pyspark.PySparkResource)"
        )
    return spark


class ObjectStoreResource(ConfigurableResource):
    """Credentials of an object store a Spark-free stream asset writes to (`output_storage_key`).

    S3 and S3-compatible stores (MinIO, Ceph, R2...) through fsspec's s3fs (`pip install
    'rmqs[s3]'`): give the secret as `EnvVar("...")`, so the UI and run metadata show the
    variable's name, never its value. `storage_options` adds any fsspec option (and serves other
    stores: `gs://`, `abfs://`). The same mapping as the Airflow consume operator's
    `output_conn_id` (`pyspark_rmqs.runs.outputs.objectstore.s3_storage_options`).
    """

    aws_access_key_id: str | None = Field(default=None, description="Use EnvVar('...').")
    aws_secret_access_key: str | None = Field(default=None, description="Use EnvVar('...').")
    aws_session_token: str | None = Field(default=None, description="Use EnvVar('...').")
    endpoint_url: str | None = Field(default=None, description="An S3-compatible endpoint's URL.")
    region_name: str | None = None
    storage_options: dict[str, Any] = Field(default_factory=dict, description="More fsspec options.")

    def __repr_args__(self) -> Any:  # never show a secret in a repr or a log line
        from pyspark_rmqs.runs.outputs.objectstore import without_secrets

        shown = without_secrets(dict(super().__repr_args__()))  # type: ignore[arg-type]
        yield from shown.items()

    def fsspec_options(self) -> dict[str, Any]:
        """fsspec storage options for the output (secrets included: hand them to the writer only)."""
        from pyspark_rmqs.runs.outputs.objectstore import s3_storage_options

        return s3_storage_options(
            key=self.aws_access_key_id,
            secret=self.aws_secret_access_key,
            token=self.aws_session_token,
            endpoint_url=self.endpoint_url,
            region_name=self.region_name,
            extra=self.storage_options,
        )
