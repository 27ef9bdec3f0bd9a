"""Map rmqs's error taxonomy (DESIGN §9) onto Airflow's retry semantics.

Configuration, authentication, missing-stream and data-loss errors will fail the same way on every
retry, so they become `AirflowFailException` (no retries); transient broker errors propagate as they
are and Airflow retries them. The decision is `pyspark_rmqs.errors.classify`, shared with Dagster
(it also reads errors that crossed Spark's boundary).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from airflow.sdk.exceptions import AirflowFailException

from pyspark_rmqs.core.redact import redact_text
from pyspark_rmqs.errors import COMMIT_ADVICE, classify

log = logging.getLogger(__name__)


@contextmanager
def airflow_failures(secrets: Iterable[str] = ()) -> Iterator[None]:
    """Raise `AirflowFailException` for non-retryable rmqs errors; keep secrets out of messages."""
    hidden = [s for s in secrets if s]
    try:
        yield
    except AirflowFailException:
        raise
    except Exception as e:
        verdict = classify(e)
        if verdict.commit_state is not None:
            log.warning(
                "rmqs: the run failed with commit state '%s': %s",
                verdict.commit_state,
                COMMIT_ADVICE[verdict.commit_state],
            )
        if not verdict.retryable:
            raise AirflowFailException(redact_text(verdict.message, hidden)) from None
        text = str(e)
        clean = redact_text(text, hidden)
        if clean != text:  # never expected: rmqs messages carry no secrets
            raise RuntimeError(f"{type(e).__name__}: {clean}") from None
        raise
