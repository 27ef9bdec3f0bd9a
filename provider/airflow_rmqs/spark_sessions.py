"""How a Spark operator gets its SparkSession: pyspark present, a Spark Connect URL (with its token)
from an Airflow connection, a task's own Connect session.

Apart from the operators (airflow_rmqs.operators) because it changes with PySpark's and Spark
Connect's rules (URL syntax, session creation, what must be masked), not with the watermark
protocol. Nothing here imports pyspark at module level.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from airflow.sdk.exceptions import AirflowFailException

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SPARK_EXTRA = "rmqs[spark]"


def require_pyspark(operator: str) -> None:
    """Fail the task at once, naming the extra, where pyspark is not installed."""
    if importlib.util.find_spec("pyspark") is None:
        raise AirflowFailException(
            f"{operator} runs Spark, but pyspark is not installed on this worker: install "
            f"'{SPARK_EXTRA}' (or '{SPARK_EXTRA[:-1]},connect]' for Spark Connect), or use "
            "RabbitMQStreamConsumeOperator / RabbitMQStreamProduceOperator, which need no Spark"
        )


def spark_connect_url(conn: Any) -> tuple[str | None, str | None]:
    """(Spark Connect URL, master) from an Airflow connection; the URL holds the token.

    The Apache Spark provider's `spark_connect` connection type: Host `sc://host` or `host` (port
    default 15002), the token in Password (or extra `token`), the user id in Login (or extra
    `user_id`), extra `use_ssl` -> `sc://host:15002/;use_ssl=true;user_id=...;token=...`. A host
    that is a Spark master (`local[...]`, `spark://`, `yarn`, `k8s://`: the provider's `spark`
    connection type) starts a local driver on it instead. The connection's type is not checked.
    Parameter values are percent-encoded (PySpark decodes them): a token may hold `/ ; = +`.
    """
    extra = conn.extra_dejson if conn.extra else {}
    host = (conn.host or "").strip()
    if not host:
        raise AirflowFailException(f"Spark connection '{conn.conn_id}' has no host")
    if host.startswith(("local", "spark://", "yarn", "k8s://", "mesos://")):
        return None, host if not conn.port or "://" not in host else f"{host}:{conn.port}"
    base = host[len("sc://") :] if host.startswith("sc://") else host
    base = base.rstrip("/")
    if ":" not in base.split("/")[0]:
        base = f"{base}:{conn.port or 15002}"
    params = []
    token = conn.password or extra.get("token")
    if str(extra.get("use_ssl", "")).lower() in ("true", "1", "yes"):
        params.append("use_ssl=true")
    user_id = extra.get("user_id") or getattr(conn, "login", None)
    if user_id:
        params.append(f"user_id={quote(str(user_id), safe='')}")
    if token:
        params.append(f"token={quote(str(token), safe='')}")
    return f"sc://{base}/" + (";" + ";".join(params) if params else ""), None


def connect_secrets(remote: str | None, *tokens: str | None) -> list[str]:
    """What must never show of a Spark Connect session: the URL and its token, in every spelling."""
    found = [str(t) for t in tokens if t]
    if remote:
        found.append(remote)
        for param in remote.split(";")[1:]:
            key, _, value = param.partition("=")
            if key.strip() == "token" and value:
                found.append(value)
    spellings = [form for secret in found for form in (secret, unquote(secret), quote(secret, safe=""))]
    return list(dict.fromkeys(spellings))


def connect_session(
    remote: str, conf: Mapping[str, str], app: str, *, reuse_session: bool = True
) -> SparkSession:
    """A Spark Connect session on `remote` for one task try (`_untag` closes it at the end).

    Not `getOrCreate()`: that returns the process's existing Connect session whatever the URL, so a
    second task in one process (`dag.test()`) would run on the first one's server and token. By
    default the task attaches to the server-side session every task with the same connection, app
    name and `spark_conf` shares (`pyspark_rmqs.runs.connect_sessions`: the server's Python workers
    stay up between tasks); the connection's extra `reuse_session: false` gives each try its own.
    """
    from pyspark_rmqs.runs.connect_sessions import connect

    return connect(remote, app, conf, reuse_session=reuse_session, new=True)


def reuse_session(conn: Any) -> bool:
    """The Spark connection's extra `reuse_session` (default true): share the server-side session."""
    extra = conn.extra_dejson if conn.extra else {}
    value = extra.get("reuse_session", True)
    return value if isinstance(value, bool) else str(value).strip().lower() not in ("false", "0", "no", "off")


def is_connect(spark: Any) -> bool:
    """Whether `spark` is a Spark Connect session (a client, no SparkContext)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")
