"""The error taxonomy (DESIGN §9): one small hierarchy, so callers can tell what to retry.

Messages name the stream, partition, offset and option involved; they never contain a password.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

log = logging.getLogger("pyspark_rmqs.broker.positions")


class RmqsError(Exception):
    """Base of every error raised by rmqs."""

    retryable: bool = False


class ConfigurationError(RmqsError, ValueError):
    """A bad option or column: never retry; the message names it and what would be valid."""


class AuthenticationError(RmqsError):
    """The broker refused the credentials or the virtual host."""


class AccessRefusedError(AuthenticationError):
    """The broker refused an operation on a stream for lack of a permission (`access_refused`).

    Never retried: waiting grants no permission. The message names the user, the virtual host, the
    stream, the permission it needs (configure, write or read) and the `rabbitmqctl set_permissions`
    change that grants it; `resource` and `permission` say the same for code. RabbitMQ checks
    configure to create or delete a stream, write to publish, read to subscribe, to read a stream's
    stats or a stored offset and to store an offset (docs/permissions.md).
    """

    def __init__(self, message: str, resource: str | None = None, permission: str | None = None) -> None:
        super().__init__(message)
        self.resource = resource
        self.permission = permission

    def __reduce__(self) -> Any:  # pickled whole (Spark, multiprocessing): keep the fields
        return (type(self), (str(self), self.resource, self.permission))


# What each permission lets a client do to a stream (the stream protocol, measured: docs/permissions.md).
_DOING = {"configure": "create or delete", "write": "publish to", "read": "read"}
_SLOT = {"configure": 0, "write": 1, "read": 2}
_RUNS_NOTE = (
    "rmqs keeps the records of watermark runs (runs that store their consumer's watermark) in the "
    "stream 'rmqs.runs' of each virtual host: such a run needs read and write on it. "
)


def access_refused(
    conn: Any, stream: str, permission: str, doing: str = "", note: str = "", other_fix: str = ""
) -> AccessRefusedError:
    """The one wording of a refused permission: who, where, which stream, which permission, the fix.

    `conn` is the connection's options (its `username` and `vhost` are read); `permission` is
    "configure", "write" or "read"; `doing` what was refused when more exact than the permission's
    usual verb (e.g. "store an offset on"); `note` what else the user should know, `other_fix` a fix
    to offer before granting the permission (ends with ", or ").
    """
    import re

    user = str(getattr(conn, "username", None) or "guest")
    vhost = str(getattr(conn, "vhost", None) or "/")

    verb = doing or _DOING[permission]
    pattern = "^" + re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", stream) + "$"  # '-' stays as it is
    slots = ["'<configure>'", "'<write>'", "'<read>'"]
    slots[_SLOT[permission]] = f"'<{permission}>|{pattern}'"
    note = note or (_RUNS_NOTE if stream == "rmqs.runs" else "")
    return AccessRefusedError(
        f"access refused: user '{user}' may not {verb} stream '{stream}' in virtual host '{vhost}': "
        f"that needs the {permission} permission on it. {note}Fix: {other_fix}add the stream to the user's "
        f"{permission} pattern, keeping the current patterns (rabbitmqctl list_user_permissions "
        f"{user}): rabbitmqctl set_permissions -p '{vhost}' '{user}' {' '.join(slots)}. Not retried: "
        "waiting grants no permission",
        resource=stream,
        permission=permission,
    )


class StreamNotFoundError(RmqsError):
    """A stream, super stream or partition stream does not exist."""


class DataLossError(RmqsError):
    """Requested offsets are no longer in the stream (retention) or a partition vanished.

    Raised only when `failOnDataLoss` is true; otherwise the connector logs and moves on.
    """


class BrokerUnavailableError(RmqsError, ConnectionError):
    """A transient broker or network failure: safe to retry."""

    retryable = True


class BrokerTimeoutError(BrokerUnavailableError, TimeoutError):
    """The broker did not answer or deliver in time (`pollTimeoutMs`, `maxWaitMs`, confirms)."""


class WatermarkConflictError(RmqsError):
    """Another run moved a consumer's watermark while this one ran: never retried, nothing stored.

    Two runs on one consumer name read overlapping ranges; storing this run's end could move the
    watermark backwards. Serialise runs per consumer name, or give each pipeline its own name.
    """


class OpenWindowError(RmqsError):
    """A read ending at a time the broker's clock has not reached: refused before reading anything.

    Ended now, the range would stop at the tails, and a message timestamped before the end that
    arrives later would be in neither this range nor the next (which starts at that time). The
    message names the end, the broker's clock (its newest chunk per stream) and what to do.
    Retryable: the end passes with time, and a retry after it reads the whole range.
    """

    retryable = True


class UnsupportedBrokerError(RmqsError):
    """The broker is too old for a requested feature (super streams 3.11, filtering 3.13)."""


class UnsupportedVersionError(RmqsError, ImportError):
    """The installed PySpark, Airflow or Dagster is older than rmqs supports (`core/versions.py`).
    An ImportError, raised when that integration is imported: Airflow's provider discovery and
    PySpark's data source lookup report import errors as such."""


class DataError(RmqsError):
    """A message that cannot be decoded or a row that cannot be encoded; names stream and offset."""


class PublishError(RmqsError):
    """The broker rejected a published message (negative confirm) or confirms timed out."""

    retryable = True


def lost_message(stream: str, start: int, end: int, why: str) -> str:
    """The one wording of a data-loss report: the stream, the missing offsets and why."""
    return f"offsets [{start}, {end}) of stream '{stream}' are lost ({end - start} offsets): {why}"


def report_data_loss(fail: bool, message: str) -> None:
    """The one place data loss is decided: raise with `failOnDataLoss=true`, else warn and go on.

    Used at planning (driver), in the reader after every (re)subscription and between chunks
    (executors) and between a run's attempts, so every path says the same thing: the stream, the
    missing offsets and the option.
    """
    if fail:
        raise DataLossError(
            message + ". Set failOnDataLoss=false to skip what is lost and continue (at-least-once "
            "becomes at-most-once for the lost range)."
        )
    log.warning("data loss (failOnDataLoss=false): %s", message)


class CommitState(StrEnum):
    """Where a run failed relative to its commit (exactly-once delivery, `delivery.py`).

    BEFORE: nothing was committed; a retry does the whole run again (safe). UNKNOWN: the failure hit
    while committing; the commit record answers whether it happened (a retry checks it first).
    COMMITTED: the output is committed; a retry only stores the watermark, it never writes again.
    """

    BEFORE = "before_commit"
    UNKNOWN = "commit_unknown"
    COMMITTED = "committed"


COMMIT_ADVICE = {
    CommitState.BEFORE.value: "nothing was committed; a retry runs the range again",
    CommitState.UNKNOWN.value: "the commit may have happened; a retry checks the commit record first",
    CommitState.COMMITTED.value: "the output is committed; a retry only stores the watermark",
}


def mark_commit_state(exc: BaseException, state: CommitState) -> BaseException:
    """Note on `exc` where the run failed (read back by `classify`); the first mark wins."""
    if getattr(exc, "commit_state", None) is None:
        try:
            exc.commit_state = state.value  # type: ignore[attr-defined]
        except AttributeError:  # an exception type with __slots__: nothing to note
            pass
    return exc


@dataclass(frozen=True)
class Classified:
    """What an orchestrator needs to know of a failure: retry it or not, and what the user reads."""

    retryable: bool
    message: str
    error: str | None  # the rmqs error class name, when the failure is (or wraps) one
    commit_state: str | None = None  # a CommitState value, for runs with exactly-once delivery


def _error_classes() -> dict[str, type[RmqsError]]:
    found: dict[str, type[RmqsError]] = {}
    todo: list[type[RmqsError]] = [RmqsError]
    while todo:
        cls = todo.pop()
        found[cls.__name__] = cls
        todo.extend(cls.__subclasses__())
    return found


def classify(exc: BaseException) -> Classified:
    """The one decision, for Airflow and Dagster alike: is `exc` worth retrying, and what does it say?

    rmqs errors carry `retryable`. Errors raised inside Spark (an executor, a Python data source
    worker) reach the driver wrapped, with the original `pyspark_rmqs.core.errors.X: message` line in
    their text: that line decides, and becomes the message. Anything else is retryable (a network
    blip, a Spark executor lost): the orchestrator's retry policy applies.
    """
    state = getattr(exc, "commit_state", None)
    if type(exc).__name__ == "AccessRefused" and type(exc).__module__.startswith("rstream"):
        # rstream's own, where a path did not name the stream (`access_refused`): still never retried.
        text = "AccessRefusedError: the broker refused an operation for lack of a permission"
        return Classified(False, text, "AccessRefusedError", state)
    if isinstance(exc, RmqsError):
        return Classified(exc.retryable, f"{type(exc).__name__}: {exc}", type(exc).__name__, state)
    classes = _error_classes()
    for line in str(exc).splitlines():
        for name, cls in classes.items():
            marker = f"{name}: "
            if marker in line and ("pyspark_rmqs" in line or line.lstrip().startswith(marker)):
                return Classified(cls.retryable, line[line.index(marker) :].strip()[:2000], name, state)
    return Classified(True, f"{type(exc).__name__}: {exc}", None, state)


class ConsumerBusyError(RmqsError):
    """Another run holds the consumer (or producer) name: this run stopped before reading or sending.

    Retryable: the holder's lease ends when its run ends, or when its process dies (the broker
    closes its connection). The message names the holder's run when its record says who it is.
    """

    retryable = True


class ProducerBusyError(ConsumerBusyError):
    """Another run holds the producer name on this stream or super stream: this run sent nothing.

    Two runs of one producer name would number their messages with the same publishing ids, and the
    broker would drop one run's rows as duplicates: the second run is stopped before it sends.
    Retryable, as `ConsumerBusyError`.
    """


class RoutingChangedError(ConfigurationError):
    """A produce run's retry cannot route its messages as its first try did: a partition stream that
    try published to is no longer part of the super stream, or the retry routes by another strategy.

    The broker drops a re-sent message only when it reaches the same partition stream under the same
    publishing id; routed otherwise, the retry's messages would be dropped as re-sent where they are
    new and kept twice where they are not. Raised before the retry sends anything. Not retryable as
    it is: bind the partition stream again (or route as the first try did) and retry, or publish
    under a new run identity (a new run: what the first try stored is then published again).
    """


class LeaseLostError(ConsumerBusyError):
    """A run lost its name's lease mid-run (the broker node its lease's connection was on died, or
    the broker restarted) and could not prove it is still the one run of the name: it could not
    take the lease back in time, or another run wrote the name's record meanwhile. Raised before the
    run wrote anything more (no record, no watermark, no message); its record stays as it was, so a
    retry resumes it (or, when another run moved it, plans after that run). Retryable.
    """

    retryable = True


# Tracebacks, Spark's error text ("pyspark_rmqs.errors.DataLossError: ...") and pickles name a class
# by its `__module__`: give the path users import and match on (the facade `pyspark_rmqs.errors`,
# docs/api.md), not the folder the code happens to live in. Unpickling imports the facade, which
# imports this module: the same class.
for _error in (
    RmqsError,
    ConfigurationError,
    AuthenticationError,
    AccessRefusedError,
    StreamNotFoundError,
    DataLossError,
    BrokerUnavailableError,
    BrokerTimeoutError,
    WatermarkConflictError,
    OpenWindowError,
    UnsupportedBrokerError,
    UnsupportedVersionError,
    DataError,
    PublishError,
    ConsumerBusyError,
    ProducerBusyError,
    LeaseLostError,
    RoutingChangedError,
):
    _error.__module__ = "pyspark_rmqs.errors"
