"""Errors at the Dagster edge: non-retryable ones fail the step for good, transient ones retry.

One decision, `pyspark_rmqs.errors.classify`, shared with the Airflow operators (DESIGN §9).
"""

from collections.abc import Iterator
from contextlib import contextmanager

from dagster import Failure

from pyspark_rmqs import errors


@contextmanager
def failures() -> Iterator[None]:
    """Non-retryable errors become `Failure(allow_retries=False)`; transient ones propagate (retry)."""
    try:
        yield
    except Failure:
        raise
    except Exception as e:
        verdict = errors.classify(e)
        if verdict.retryable:
            raise
        spark = "" if isinstance(e, errors.RmqsError) else " (raised in Spark)"
        raise Failure(description=f"{verdict.message}{spark}", allow_retries=False) from e
