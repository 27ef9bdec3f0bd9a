"""`RabbitMQTestBroker`: where a test broker listens, and the calls a test makes on it.

The fixtures hand this object to users' tests; it is also usable without pytest (a notebook, a
script that seeds data). It holds plain values and imports rmqs's broker layer only inside its
methods, so importing it (and the plugin that imports it) costs nothing: no rstream, no pyarrow.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlsplit

if TYPE_CHECKING:
    import pyarrow as pa

    from pyspark_rmqs.options import ConnectionOptions
    from pyspark_rmqs.runs.handle import StreamsHandle

SCHEMES = {"rabbitmq-stream": False, "rabbitmq-stream+tls": True}
DEFAULT_PORTS = {False: 5552, True: 5551}


@dataclass(frozen=True)
class RabbitMQTestBroker:
    """A broker's stream-protocol address and credentials, with helpers for tests.

    `origin` says where it came from (`RMQS_TEST_URI`, or the container's id), for messages.
    The password never appears in `repr`, `str` or an error message.
    """

    host: str
    port: int
    username: str = "guest"
    password: str = field(default="guest", repr=False)
    vhost: str = "/"
    tls: bool = False
    origin: str = "RMQS_TEST_URI"

    # ------------------------------------------------------------------ addresses and options

    @property
    def endpoint(self) -> str:
        """`host:port`, as the `endpoints` option takes it."""
        return f"{self.host}:{self.port}"

    @property
    def uri(self) -> str:
        """`rabbitmq-stream://user:password@host:port/vhost` (holds the password: never log it)."""
        scheme = "rabbitmq-stream+tls" if self.tls else "rabbitmq-stream"
        userinfo = f"{quote(self.username, safe='')}:{quote(self.password, safe='')}"
        return f"{scheme}://{userinfo}@{self.host}:{self.port}/{quote(self.vhost, safe='')}"

    @property
    def options(self) -> dict[str, str]:
        """Connection options for `spark.read.format("rabbitmq_streams")`, the CLI's flags, a hook's
        extra: `endpoints`, `username`, `password`, `vhost` (and `tls`). Add `stream` or `superstream`."""
        opts = {
            "endpoints": self.endpoint,
            "username": self.username,
            "password": self.password,
            "vhost": self.vhost,
        }
        if self.tls:
            opts["tls"] = "true"
        return opts

    def connection(self) -> ConnectionOptions:
        """The parsed connection, as rmqs's own code takes it."""
        from pyspark_rmqs.options import parse_connection_options

        return parse_connection_options(self.options)

    def handle(self) -> StreamsHandle:
        """The calls Airflow's hook and Dagster's resource share (watermarks, lag, publish...)."""
        return _fixed_handle(self.connection())

    # ------------------------------------------------------------------ streams

    def create_stream(self, name: str | None = None, arguments: Mapping[str, Any] | None = None) -> str:
        """Create a stream (a unique `rmqs-test-...` name when none is given); returns its name."""
        name = name or unique_name()
        self.handle().create_stream(name, arguments)
        return name

    def delete_stream(self, name: str) -> None:
        """Delete a stream; a missing one is not an error."""
        self.handle().delete_stream(name)

    def create_super_stream(self, name: str | None = None, partitions: int = 3) -> str:
        """Create a super stream with partitions `<name>-0` .. `<name>-(N-1)`; returns its name."""
        name = name or unique_name()
        self.handle().create_super_stream(name, partitions)
        return name

    def delete_super_stream(self, name: str) -> None:
        """Delete a super stream and its partition streams; a missing one is not an error."""
        self.handle().delete_super_stream(name)

    # ------------------------------------------------------------------ messages

    def publish(
        self, messages: Iterable[Any], *, stream: str | None = None, superstream: str | None = None
    ) -> dict[str, int]:
        """Publish `bytes` / `str` / dict messages (a dict: `value`, `routing_key`, `properties`,
        `application_properties`, `message_annotations`) and wait for every confirm. A super stream
        routes by `routing_key` (hash). Returns the messages published per partition stream."""
        return self.handle().publish(messages, stream=stream, superstream=superstream)

    def read_arrow(
        self,
        *,
        stream: str | None = None,
        superstream: str | None = None,
        metadata_fields: Iterable[str] = (),
    ) -> pa.Table:
        """Every message now in the stream (or in each partition of the super stream, partition by
        partition) as one Arrow table of the source schema: `value`, `stream`, `offset`,
        `chunk_timestamp`, plus `metadata_fields` (e.g. `application_properties`, `routing_key`).
        Reads up to the tail at the call; no watermark is read or stored."""
        import pyarrow as pa

        from pyspark_rmqs.core.schema import source_arrow_schema

        handle = self.handle()
        fields = tuple(metadata_fields)
        marks = handle.watermarks("", stream=stream, superstream=superstream)
        batches = [
            batch
            for part in marks.partitions
            if part.tail > part.first
            for batch in handle.read_batches(part.stream, part.first, part.tail, metadata_fields=fields)
        ]
        return pa.Table.from_batches(batches, schema=source_arrow_schema(fields))


def _fixed_handle(connection: ConnectionOptions) -> StreamsHandle:
    """A `StreamsHandle` on fixed connection options (defined on first use: importing
    `pyspark_rmqs.runs.handle` loads the broker layer, which the plugin's import must not)."""
    from pyspark_rmqs.runs.handle import StreamsHandle

    class FixedHandle(StreamsHandle):
        def _connection(self) -> ConnectionOptions:
            return connection

        async def _aconnection(self) -> ConnectionOptions:
            return connection

    return FixedHandle()


def unique_name(prefix: str = "rmqs-test") -> str:
    """A stream name no other test (or test run) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def broker_from_uri(uri: str, *, origin: str = "RMQS_TEST_URI") -> RabbitMQTestBroker:
    """Parse `rabbitmq-stream[+tls]://user:password@host:port/vhost` (vhost `%2f` or empty: `/`).

    A malformed value raises `ValueError` naming `origin` and the expected form, never the password.
    """
    expected = "rabbitmq-stream://user:password@host:5552/%2f (or rabbitmq-stream+tls://...)"
    parts = urlsplit(uri.strip())
    if parts.scheme not in SCHEMES:
        shown = parts.scheme or "no scheme"
        raise ValueError(f"{origin} must look like {expected}; its scheme is {shown!r}")
    tls = SCHEMES[parts.scheme]
    try:
        port = parts.port or DEFAULT_PORTS[tls]
    except ValueError:
        raise ValueError(
            f"{origin} has a port that is not a number from 1 to 65535; expected {expected}"
        ) from None
    if not parts.hostname:
        raise ValueError(f"{origin} names no host; expected {expected}")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    return RabbitMQTestBroker(
        host=parts.hostname,
        port=port,
        username=unquote(parts.username) if parts.username else "guest",
        password=unquote(parts.password) if parts.password else "guest",
        vhost=unquote(path) or "/",
        tls=tls,
        origin=origin,
    )
