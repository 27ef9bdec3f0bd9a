"""`RabbitMQStreamHook`: an Airflow connection -> rmqs connection options, plus the shared calls.

The calls (watermarks: `watermarks`, `tails`, `stored_offsets`, `lag`, `lags`, `store_watermarks`
and `a...` twins for the triggerer; stream management; `publish`, `read_batches`, `spark_options`)
are `pyspark_rmqs.runs.handle.StreamsHandle`'s, the same code as Dagster's `RabbitMQStreamsResource`.
The hook provides the connection: from the Airflow connection, looked up without blocking on the
triggerer's event loop, its secrets registered with Airflow's log masker. pyspark is never
imported and pyarrow only by `read_batches` and `publish`, so triggers and sensors can use the hook
in the triggerer. The former names `tail`, `stored`, `store` (and `atail`, `astored`, `astore`) and
the keyword `consumer=` still work, with a DeprecationWarning. The password lives in a `SecretStr`
inside `ConnectionOptions`; only `spark_options()` reveals it, for handing to Spark.

Airflow 3.2 has neither `amask_secret` nor `Connection.aextra_dejson` (both 3.3): there the
triggerer's lookups run the synchronous calls in a worker thread, as Airflow's own hooks did before
3.3, which keeps the event loop free (docs/compatibility.md).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from airflow.sdk import BaseHook

from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.core.redact import secrets_in
from pyspark_rmqs.errors import ConfigurationError, RmqsError
from pyspark_rmqs.options import (
    CONNECTION_OPTIONS,
    DEFAULT_PORT,
    DEFAULT_TLS_PORT,
    ConnectionOptions,
    parse_connection_options,
)
from pyspark_rmqs.runs.handle import StreamsHandle

CONN_TYPE = "rabbitmq_stream"
_PREFIX = f"extra__{CONN_TYPE}__"
# Extra keys users may type: the option names (`tls.caFile`) or their snake_case fields (`tls_ca_file`).
_EXTRA_KEYS = {**{o.lower(): o for o in CONNECTION_OPTIONS.values()}, **dict(CONNECTION_OPTIONS)}
F = TypeVar("F", bound=Callable[..., Any])


def _is_true(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes", "on")


def connection_to_options(conn: Any, extra: Mapping[str, Any] | None = None) -> dict[str, str]:
    """rmqs connection options (as Spark option strings) from an Airflow Connection.

    host (comma-separated for several nodes) and port -> `endpoints`; login/password ->
    `username`/`password`; the virtual host from extra `vhost`, else the `schema` field (a URI's
    path), else "/"; every other connection option from extra, spelled `tls.caFile` or `tls_ca_file`.
    """
    if extra is None:
        extra = conn.extra_dejson if conn.extra else {}
    opts: dict[str, str] = {}
    for raw_key, value in extra.items():
        key = raw_key[len(_PREFIX) :] if raw_key.startswith(_PREFIX) else raw_key
        if value is None or value == "":
            continue
        name = _EXTRA_KEYS.get(key) or _EXTRA_KEYS.get(key.lower()) or key  # unknown keys fail in parsing
        opts[name] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    if "uris" not in opts and "endpoints" not in opts:
        if not conn.host:
            raise ConfigurationError(
                f"connection '{conn.conn_id}' has no host: set Host (and Port, default "
                f"{DEFAULT_PORT}) or extra 'uris'"
            )
        port = conn.port or (DEFAULT_TLS_PORT if _is_true(opts.get("tls", "false")) else DEFAULT_PORT)
        hosts = [h.strip() for h in conn.host.split(",") if h.strip()]
        opts["endpoints"] = ",".join(h if ":" in h else f"{h}:{port}" for h in hosts)
    if conn.login:
        opts.setdefault("username", conn.login)
    if conn.password:
        opts.setdefault("password", conn.password)
    if "vhost" not in opts and conn.schema:
        opts["vhost"] = conn.schema
    return opts


def _renamed_consumer(kwargs: dict[str, Any]) -> dict[str, Any]:
    if "consumer" in kwargs:
        warnings.warn(
            "RabbitMQStreamHook: the keyword 'consumer' is deprecated, use 'consumer_name'",
            DeprecationWarning,
            stacklevel=3,  # the caller of the hook method
        )
        kwargs["consumer_name"] = kwargs.pop("consumer")
    return kwargs


def _consumer_keyword(fn: F) -> F:
    """Let a hook method still take its former keyword `consumer=` (now `consumer_name=`, as everywhere)."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def acall(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await fn(self, *args, **_renamed_consumer(kwargs))

        return acall  # type: ignore[return-value]

    @functools.wraps(fn)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(self, *args, **_renamed_consumer(kwargs))

    return call  # type: ignore[return-value]


def _deprecated_alias(old: str, new: str) -> Any:
    """A former hook method name: warns, then calls `new` (the resource's name for the same call)."""

    def alias(self: Any, *args: Any, **kwargs: Any) -> Any:
        warnings.warn(
            f"RabbitMQStreamHook.{old}() is deprecated, use {new}()", DeprecationWarning, stacklevel=2
        )
        return getattr(self, new)(*args, **_renamed_consumer(kwargs))

    alias.__name__ = alias.__qualname__ = old
    alias.__doc__ = f"Deprecated: use `{new}` (same arguments and result)."
    alias.deprecated_for = new  # type: ignore[attr-defined]
    return alias


def secret_values(options: ConnectionOptions) -> list[str]:
    """The secrets in `options` (a URI's password is moved into `password` when parsed)."""
    secrets = (options.password, options.tls_truststore_password, options.tls_keystore_password)
    return [s.get_secret_value() for s in secrets if s is not None and s.get_secret_value()]


def _mask(secrets: list[str]) -> None:
    """Register every secret with Airflow's log masker, so no task log line shows one."""
    from airflow.sdk.log import mask_secret

    for secret in secrets:
        mask_secret(secret)


async def _amask(secrets: list[str]) -> None:
    """`_mask` for an event loop: the sync variant can deadlock against the supervisor there.

    Airflow < 3.3 has no `amask_secret`: the sync variant then runs in a worker thread, off the loop.
    """
    try:
        from airflow.sdk.log import amask_secret
    except ImportError:  # Airflow 3.2
        await asyncio.to_thread(_mask, secrets)
        return
    for secret in secrets:
        await amask_secret(secret)


async def _aextra(conn: Any) -> dict[str, Any]:
    """The connection's extra as a dict, without blocking the event loop (Airflow < 3.3: in a thread)."""
    if not conn.extra:
        return {}
    if hasattr(conn, "aextra_dejson"):
        return dict(await conn.aextra_dejson())
    return dict(await asyncio.to_thread(lambda: conn.extra_dejson))


class RabbitMQStreamHook(StreamsHandle, BaseHook):
    """Connection options, watermarks (tails, stored offsets, lag), stream management, publish and read.

    :param rabbitmq_stream_conn_id: Airflow connection of type `rabbitmq_stream`.
    """

    conn_name_attr = "rabbitmq_stream_conn_id"
    default_conn_name = "rabbitmq_stream_default"
    conn_type = CONN_TYPE
    hook_name = "RabbitMQ Stream"

    def __init__(self, rabbitmq_stream_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rabbitmq_stream_conn_id = rabbitmq_stream_conn_id
        self._options: ConnectionOptions | None = None

    # ------------------------------------------------------------------ connection

    def get_conn(self) -> ConnectionOptions:
        """The parsed connection options (cached: one connection lookup per hook)."""
        if self._options is None:
            conn = self.get_connection(self.rabbitmq_stream_conn_id)
            raw = connection_to_options(conn)
            _mask(secrets_in(raw))  # before parsing: a failed parse must not log them either
            self._options = parse_connection_options(raw)
        return self._options

    async def aget_conn(self) -> ConnectionOptions:
        """`get_conn` for the triggerer's event loop (no blocking connection lookup)."""
        if self._options is None:
            conn = await self.aget_connection(self.rabbitmq_stream_conn_id)
            extra = await _aextra(conn)
            raw = connection_to_options(conn, extra)
            await _amask(secrets_in(raw))  # before parsing: a failed parse must not log them either
            self._options = parse_connection_options(raw)
        return self._options

    def test_connection(self) -> tuple[bool, str]:
        """Connect and authenticate; the message names the broker version or the error (no secrets)."""
        try:
            version = BrokerClient(self.get_conn(), request_timeout_s=10).broker_version()
        except RmqsError as e:
            return False, f"{type(e).__name__}: {e}"
        except Exception as e:  # unexpected failures still must not surface a secret
            return False, f"{type(e).__name__}: connection test failed"
        return True, f"Connected to RabbitMQ {version}"

    # ------------------------------------------------------------------ the shared calls
    # Watermarks, stream management, publish, read_batches and spark_options come from
    # `StreamsHandle` (the same code as `dagster_rmqs.RabbitMQStreamsResource`); the hook adds where
    # its connection comes from, and the former keyword `consumer=` on the calls that took it.

    def _connection(self) -> ConnectionOptions:
        return self.get_conn()

    async def _aconnection(self) -> ConnectionOptions:
        return await self.aget_conn()

    watermarks = _consumer_keyword(StreamsHandle.watermarks)
    lag = _consumer_keyword(StreamsHandle.lag)
    awatermarks = _consumer_keyword(StreamsHandle.awatermarks)
    alag = _consumer_keyword(StreamsHandle.alag)

    # ------------------------------------------------------------------ former names (deprecated)

    tail = _deprecated_alias("tail", "tails")
    stored = _deprecated_alias("stored", "stored_offsets")
    store = _deprecated_alias("store", "store_watermarks")
    atail = _deprecated_alias("atail", "atails")
    astored = _deprecated_alias("astored", "astored_offsets")
    astore = _deprecated_alias("astore", "astore_watermarks")
