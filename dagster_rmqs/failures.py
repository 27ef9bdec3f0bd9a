"""Errors at the Dagster edge: non-retryable ones fail the step for good, transient ones retry.

One decision, `pyspark_rmqs.errors.classify`, shared with the Airflow operators (DESIGN §9).
"""

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from dagster import Failure

from pyspark_rmqs import errors

log = logging.getLogger(__name__)


@contextmanager
def failures() -> Iterator[None]:
    """Non-retryable errors become `Failure(allow_retries=False)`; transient ones propagate (retry)."""
    try:
        yield
    except Failure:
        raise
    except Exception as e:
        verdict = errors.classify(e)
        if verdict.commit_state is not None:  # what a retry will do: run again, verify, or only store
            advice = errors.COMMIT_ADVICE[verdict.commit_state]
            log.warning("rmqs: the run failed with commit state '%s': %s", verdict.commit_state, advice)
        if verdict.retryable:
            raise
        spark = "" if isinstance(e, errors.RmqsError) else " (raised in Spark)"
        raise Failure(description=f"{verdict.message}{spark}", allow_retries=False) from e
