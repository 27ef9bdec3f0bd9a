"""Dagster resources: the broker connection and a SparkSession.

`RabbitMQStreamsResource` holds connection settings as Dagster config, so the password can come
from an `EnvVar` and the UI shows the variable's name, not its value. Its calls are those of the
Airflow hook, with the same names, signatures and results: watermarks (`watermarks`, `tails`,
`stored_offsets`, `lag` (total), `lags` (per partition stream), `store_watermarks`, and `a...`
twins for async code), stream management, `publish` and `read_batches`. None of them starts a JVM;
only `publish` and `read_batches` import pyarrow, so sensors and checks use the resource freely.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from dagster import ConfigurableResource, EnvVar
from pydantic import Field

from pyspark_rmqs import jobs
from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.broker.loop import run_sync
from pyspark_rmqs.errors import ConfigurationError
from pyspark_rmqs.options import ConnectionOptions, parse_connection_options
from pyspark_rmqs.redact import redact_option
from pyspark_rmqs.watermarks import Watermarks, astore_watermarks, awatermarks, store_watermarks

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession


class RabbitMQStreamsResource(ConfigurableResource):
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
        }
        return parse_connection_options({k: _value(v) for k, v in raw.items() if v is not None})

    # The same names, signatures and return shapes as `airflow_rmqs.hooks.RabbitMQStreamHook`
    # (tests/airflow/test_hook_resource_parity.py); each is one call into the connector. The
    # metadata calls are bounded by `metadata_timeout_s`.

    def watermarks(
        self, consumer_name: str, *, stream: str | None = None, superstream: str | None = None
    ) -> Watermarks:
        """First offset, tail, stored offset and lag of `consumer_name` per partition stream."""
        coro = self.awatermarks(consumer_name, stream=stream, superstream=superstream)
        return run_sync(coro, self.metadata_timeout_s, f"watermarks of '{superstream or stream}'")

    def tails(self, *, stream: str | None = None, superstream: str | None = None) -> dict[str, int]:
        """The next offset to be written, per partition stream."""
        return self.watermarks("", stream=stream, superstream=superstream).tails()

    def stored_offsets(
        self, consumer_name: str, *, stream: str | None = None, superstream: str | None = None
    ) -> dict[str, int | None]:
        """The watermark (last processed offset) of `consumer_name` per partition stream; None if none."""
        w = self.watermarks(consumer_name, stream=stream, superstream=superstream)
        return {p.stream: p.stored for p in w.partitions}

    def lag(self, consumer_name: str, *, stream: str | None = None, superstream: str | None = None) -> int:
        """Messages published after `consumer_name`'s watermark, summed over partition streams."""
        return self.watermarks(consumer_name, stream=stream, superstream=superstream).total_lag

    def lags(
        self, consumer_name: str, *, stream: str | None = None, superstream: str | None = None
    ) -> dict[str, int]:
        """Messages published after `consumer_name`'s watermark, per partition stream."""
        w = self.watermarks(consumer_name, stream=stream, superstream=superstream)
        return {p.stream: p.lag for p in w.partitions}

    def store_watermarks(self, consumer_name: str, last_offsets: Mapping[str, int]) -> None:
        """Store the watermarks (last processed offset per stream): only after the sink succeeded."""
        store_watermarks(self.connection_options(), consumer_name, last_offsets)

    async def awatermarks(
        self, consumer_name: str, *, stream: str | None = None, superstream: str | None = None
    ) -> Watermarks:
        """`watermarks` in async code (bound it yourself there, e.g. with `asyncio.timeout`)."""
        return await awatermarks(
            self.connection_options(), consumer_name, stream=stream, superstream=superstream
        )

    async def atails(self, *, stream: str | None = None, superstream: str | None = None) -> dict[str, int]:
        return (await self.awatermarks("", stream=stream, superstream=superstream)).tails()

    async def astored_offsets(
        self, consumer_name: str, *, stream: str | None = None, superstream: str | None = None
    ) -> dict[str, int | None]:
        w = await self.awatermarks(consumer_name, stream=stream, superstream=superstream)
        return {p.stream: p.stored for p in w.partitions}

    async def alag(
        self, consumer_name: str, *, stream: str | None = None, superstream: str | None = None
    ) -> int:
        return (await self.awatermarks(consumer_name, stream=stream, superstream=superstream)).total_lag

    async def alags(
        self, consumer_name: str, *, stream: str | None = None, superstream: str | None = None
    ) -> dict[str, int]:
        w = await self.awatermarks(consumer_name, stream=stream, superstream=superstream)
        return {p.stream: p.lag for p in w.partitions}

    async def astore_watermarks(self, consumer_name: str, last_offsets: Mapping[str, int]) -> None:
        await astore_watermarks(self.connection_options(), consumer_name, last_offsets)

    def create_stream(self, stream: str, arguments: Mapping[str, Any] | None = None) -> None:
        """Create a stream (`arguments` such as `max-length-bytes`); an existing one is left as it is."""
        BrokerClient(self.connection_options()).create_stream(stream, arguments)

    def delete_stream(self, stream: str) -> None:
        """Delete a stream and its messages; a missing one is not an error."""
        BrokerClient(self.connection_options()).delete_stream(stream)

    def create_super_stream(
        self, superstream: str, partitions: int, arguments: Mapping[str, Any] | None = None
    ) -> None:
        """Create a super stream with partitions `<name>-0` .. `<name>-(N-1)` (binding keys "0".."N-1")."""
        BrokerClient(self.connection_options()).create_super_stream(superstream, partitions, arguments)

    def delete_super_stream(self, superstream: str) -> None:
        """Delete a super stream and its partition streams; a missing one is not an error."""
        BrokerClient(self.connection_options()).delete_super_stream(superstream)

    def publish(
        self,
        messages: Iterable[Any],
        *,
        stream: str | None = None,
        superstream: str | None = None,
        producer_name: str | None = None,
        routing_strategy: str = "hash",
    ) -> dict[str, int]:
        """Publish `bytes` / `str` / dict messages (see `pyspark_rmqs.produce`) and wait for every confirm.

        Returns the messages published per partition stream.
        """
        from pyspark_rmqs import produce
        from pyspark_rmqs.broker.writer import WriteSettings

        settings = WriteSettings(producer_name=producer_name, routing_strategy=routing_strategy)
        return produce.publish(
            self.connection_options(), messages, stream=stream, superstream=superstream, settings=settings
        )

    def read_batches(
        self,
        stream: str,
        start: int,
        end: int,
        *,
        metadata_fields: Iterable[str] = (),
        queue_capacity: int = 10_000,
        fail_on_data_loss: bool = True,
    ) -> Iterator[pa.RecordBatch]:
        """Offsets `[start, end)` of one (partition) stream as Arrow RecordBatches of the source schema.

        Memory is bounded by `queue_capacity`; the watermark is not touched (the assets'
        `engine="arrow"` reads advance it).
        """
        from pyspark_rmqs.broker.reader import RangeReader, ReadSettings

        settings = ReadSettings(
            metadata_fields=tuple(metadata_fields),
            queue_capacity=queue_capacity,
            fail_on_data_loss=fail_on_data_loss,
        )
        yield from RangeReader(self.connection_options(), stream, start, end, settings)

    def spark_options(
        self, *, stream: str | None = None, superstream: str | None = None, **extra: str
    ) -> dict[str, str]:
        """`spark.read.format("rabbitmq_streams")` options. They hold the password: never log them."""
        opts = self.connection_options().to_options()
        if stream is not None:
            opts["stream"] = stream
        if superstream is not None:
            opts["superstream"] = superstream
        opts.update(extra)
        return opts

    def stream_uri(self, name: str) -> str:
        """`rabbitmq-stream://host:port/vhost/stream`: the stream's identity, without credentials."""
        return stream_uri(self.connection_options(), name)


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

    def get_session(self) -> SparkSession:
        return jobs.spark_session(
            master=None if self.remote else self.master,
            conf=self.spark_conf,
            remote=self.remote,
            app=self.app_name,
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
