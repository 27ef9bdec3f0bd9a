"""Map rmqs's error taxonomy (DESIGN §9) onto Airflow's retry semantics.

Configuration, authentication, missing-stream and data-loss errors will fail the same way on every
retry, so they become `AirflowFailException` (no retries); transient broker errors propagate as they
are and Airflow retries them. Errors raised inside Spark's Python workers reach the driver as
Spark exceptions carrying the original traceback text, so those are recognised by class name.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from airflow.sdk.exceptions import AirflowFailException

from pyspark_rmqs.errors import (
    AuthenticationError,
    ConfigurationError,
    DataError,
    DataLossError,
    StreamNotFoundError,
    UnsupportedBrokerError,
    WatermarkConflictError,
)
from pyspark_rmqs.redact import redact_text

NON_RETRYABLE: tuple[type[Exception], ...] = (
    ConfigurationError,
    AuthenticationError,
    StreamNotFoundError,
    DataLossError,
    UnsupportedBrokerError,
    DataError,
    WatermarkConflictError,
)
_NAMES = tuple(c.__name__ for c in NON_RETRYABLE)


def _spark_cause(text: str) -> str | None:
    """The rmqs error line inside a Spark exception's text (`pyspark_rmqs.errors.X: ...`), if any."""
    for line in text.splitlines():
        for name in _NAMES:
            marker = f"{name}: "
            if marker in line and ("pyspark_rmqs" in line or line.lstrip().startswith(marker)):
                return line[line.index(marker) :].strip()
    return None


@contextmanager
def airflow_failures(secrets: Iterable[str] = ()) -> Iterator[None]:
    """Raise `AirflowFailException` for non-retryable rmqs errors; keep secrets out of messages."""
    hidden = [s for s in secrets if s]
    try:
        yield
    except AirflowFailException:
        raise
    except NON_RETRYABLE as e:
        text = f"{type(e).__name__}: {e}"
        clean = redact_text(text, hidden)
        if clean != text:  # never expected: rmqs messages carry no secrets
            raise AirflowFailException(clean) from None
        raise AirflowFailException(text) from e
    except Exception as e:
        text = str(e)
        cause = _spark_cause(text)
        if cause is not None:
            raise AirflowFailException(redact_text(cause, hidden)) from None
        clean = redact_text(text, hidden)
        if clean != text:
            raise RuntimeError(f"{type(e).__name__}: {clean}") from None
        raise
