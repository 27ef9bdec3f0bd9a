"""Spark Connect sessions that scheduled tasks share on a warm server.

Why: a Spark Connect server keeps each session's Python workers apart (their environment carries
the session's artifact UUID, `SPARK_JOB_ARTIFACT_UUID`, whatever `spark.sql.artifact.isolation.enabled`
says), so every new session makes the server start new Python processes for a read: a daemon and a
worker for the data source's creation, the same for its planning, a daemon and a worker per core
for the read, each importing pyspark, pyarrow and rmqs (7 per task, measured by `bench.warm_spark
--breakdown`). An Airflow task or a Dagster step is a new process, hence a new session, hence all
of that again on every run, on a server started to be warm.

A session id derived from the server's address, the client's parameters other than the token, the
app name and the session's configuration lets every task with the same settings attach to one
server-side session (`sc://...;session_id=<uuid>`): its Python workers stay up between tasks. The
task's `stop()` then closes its own connection only (`release_session_on_close = False`). Tasks
with other settings get another session. A released or expired session's id stays closed on the
server (`INVALID_HANDLE.SESSION_CLOSED`): the id of the next generation is tried, so every process
lands on the first one still open, without talking to the others.

What is shared: the session's temporary views, UDFs and runtime configuration a task's own code
sets (`spark.conf.set`). Tasks that need their own set `reuse_session=False` (or their own
`session_id` in the URL, which is used as given).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# A fixed namespace: the same settings give the same session id in every process and release.
NAMESPACE = uuid.UUID("9b7e3c52-4f0a-4d51-8a6e-2c1d5b3f7a90")
MAX_GENERATIONS = 100  # closed ids the server remembers before one is found open (its tombstones)
_PRIVATE_PARAMS = ("token", "session_id")


def _split(remote: str) -> tuple[str, list[str]]:
    address, *params = remote.split(";")
    return address, [p for p in params if p.strip()]


def _param_name(param: str) -> str:
    return param.split("=", 1)[0].strip()


def has_session_id(remote: str) -> bool:
    """Whether the URL names its session itself (then it is used as given)."""
    return any(_param_name(p) == "session_id" for p in _split(remote)[1])


def shared_session_id(remote: str, app: str, conf: Mapping[str, str], generation: int = 0) -> str:
    """The session id every task with these settings uses (the token is not part of it)."""
    address, params = _split(remote)
    kept = sorted(p for p in params if _param_name(p) not in _PRIVATE_PARAMS)
    settings = [f"{k}={v}" for k, v in sorted(conf.items())]
    key = "\n".join([address.rstrip("/"), *kept, f"app={app}", *settings, f"generation={generation}"])
    return str(uuid.uuid5(NAMESPACE, key))


def with_session_id(remote: str, session_id: str) -> str:
    """`remote` with `session_id` among its parameters (`sc://host:port/;...;session_id=<uuid>`)."""
    address, params = _split(remote)
    if not address.endswith("/"):
        address += "/"
    return ";".join([address, *params, f"session_id={session_id}"])


def open_shared(
    remote: str, app: str, conf: Mapping[str, str], create: Callable[[str], SparkSession]
) -> SparkSession:
    """`create(url)` on the shared session of these settings; its `stop()` leaves the session open."""
    if has_session_id(remote):
        return create(remote)
    for generation in range(MAX_GENERATIONS):
        try:
            spark = create(with_session_id(remote, shared_session_id(remote, app, conf, generation)))
        except Exception as e:
            if "SESSION_CLOSED" in str(e):  # released or expired: the next generation's id
                continue
            raise
        spark.release_session_on_close = False  # type: ignore[attr-defined]
        return spark
    raise RuntimeError(
        f"no open Spark Connect session among {MAX_GENERATIONS} shared ids (every one closed on the "
        "server): set reuse_session=False"
    )


def connect(
    remote: str,
    app: str,
    conf: Mapping[str, str] | None = None,
    *,
    reuse_session: bool = True,
    new: bool = True,
) -> SparkSession:
    """A Spark Connect session on `remote`: the shared one of these settings unless `reuse_session=False`.

    `new`: `builder.create()` (a client of its own, never the process's earlier session: an Airflow
    task) rather than `getOrCreate()` (the process's session when it has one: Dagster's resource).
    A session that fails to start (a wrong token, a closed id) is stopped, not left as the
    process's default, where the next `getOrCreate()` would find it.
    """
    settings = dict(conf or {})

    def create(url: str) -> SparkSession:
        from pyspark.sql import SparkSession
        from pyspark.sql.connect.session import SparkSession as ConnectSession

        before = ConnectSession.getActiveSession()
        builder = SparkSession.builder.remote(url).appName(app)
        for key, value in settings.items():
            builder = builder.config(key, value)
        try:
            return builder.create() if new else builder.getOrCreate()
        except BaseException:
            failed = ConnectSession.getActiveSession()
            if failed is not None and failed is not before:  # create() made it the default first
                failed.stop()
            raise

    if not reuse_session:
        return create(remote)
    return open_shared(remote, app, settings, create)
