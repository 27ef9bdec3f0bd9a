"""`errors.classify`: the one retry decision Airflow and Dagster share, and data-loss wording."""

from __future__ import annotations

import pytest

from pyspark_rmqs.core import errors
from pyspark_rmqs.core.errors import (
    BrokerTimeoutError,
    BrokerUnavailableError,
    ConfigurationError,
    DataLossError,
    PublishError,
    WatermarkConflictError,
    classify,
    lost_message,
    report_data_loss,
)


@pytest.mark.parametrize(
    ("exc", "retryable"),
    [
        (ConfigurationError("option 'x' is bad"), False),
        (DataLossError("offsets lost"), False),
        (WatermarkConflictError("moved"), False),
        (errors.AuthenticationError("refused"), False),
        (errors.AccessRefusedError("access refused", "s", "read"), False),
        (errors.StreamNotFoundError("gone"), False),
        (errors.UnsupportedBrokerError("old"), False),
        (errors.DataError("bad message"), False),
        (BrokerUnavailableError("blip"), True),
        (BrokerTimeoutError("slow"), True),
        (PublishError("nack"), True),
        (errors.OpenWindowError("the end has not passed"), True),
        (RuntimeError("executor lost"), True),
    ],
)
def test_rmqs_errors_say_whether_to_retry(exc: Exception, retryable: bool) -> None:
    verdict = classify(exc)
    assert verdict.retryable is retryable
    assert str(exc) in verdict.message
    if isinstance(exc, errors.RmqsError):
        assert verdict.error == type(exc).__name__
        assert verdict.message == f"{type(exc).__name__}: {exc}"
    else:
        assert verdict.error is None


def test_an_error_raised_inside_spark_is_classified_by_its_rmqs_line() -> None:
    wrapped = Exception(
        "[PYTHON_DATA_SOURCE_ERROR] Failed to plan: Traceback (most recent call last):\n"
        '  File "x.py", line 1\n'
        "pyspark_rmqs.core.errors.DataLossError: offsets [0, 5) of stream 's' are lost (5 offsets): gone\n"
        " SQLSTATE: 38000"
    )
    verdict = classify(wrapped)
    assert verdict == errors.Classified(
        False, "DataLossError: offsets [0, 5) of stream 's' are lost (5 offsets): gone", "DataLossError"
    )
    transient = Exception("Traceback\npyspark_rmqs.core.errors.BrokerUnavailableError: connection lost\n")
    assert classify(transient).retryable is True
    assert classify(transient).error == "BrokerUnavailableError"


def test_data_loss_has_one_wording_and_obeys_fail_on_data_loss(caplog: pytest.LogCaptureFixture) -> None:
    text = lost_message("orders-1", 10, 25, "retention removed them")
    assert text == "offsets [10, 25) of stream 'orders-1' are lost (15 offsets): retention removed them"
    with pytest.raises(DataLossError) as lost:
        report_data_loss(True, text)
    assert str(lost.value).startswith(text) and "failOnDataLoss=false" in str(lost.value)
    report_data_loss(False, text)
    assert text in caplog.text and "failOnDataLoss=false" in caplog.text


def test_the_commit_state_of_a_failure_travels_with_it() -> None:
    from pyspark_rmqs.core.errors import COMMIT_ADVICE, CommitState, mark_commit_state

    e = mark_commit_state(ConnectionError("lost"), CommitState.COMMITTED)
    mark_commit_state(e, CommitState.BEFORE)  # the first mark wins: it is where the run failed
    verdict = classify(e)
    assert verdict.commit_state == "committed" and verdict.retryable
    assert set(COMMIT_ADVICE) == {s.value for s in CommitState}
    assert classify(RuntimeError("plain")).commit_state is None


def test_access_refused_names_the_stream_permission_and_fix_and_is_never_retried() -> None:
    import pickle

    import rstream.exceptions as rx

    class Conn:
        username, vhost = "team-a", "/prod"

    e = errors.access_refused(Conn(), "rmqs.runs", "write")
    assert (e.resource, e.permission, e.retryable) == ("rmqs.runs", "write", False)
    assert isinstance(e, errors.AuthenticationError)
    assert str(e).startswith(
        "access refused: user 'team-a' may not publish to stream 'rmqs.runs' in virtual host '/prod': "
        "that needs the write permission on it."
    )
    assert "needs read and write on it" in str(e)  # rmqs.runs: what a watermark run needs there
    assert (
        r"rabbitmqctl set_permissions -p '/prod' 'team-a' '<configure>' '<write>|^rmqs\.runs$' '<read>'"
        in str(e)
    )
    back = pickle.loads(pickle.dumps(e))  # crosses processes (Spark, Dagster) whole
    assert (type(back), str(back), back.resource, back.permission) == (type(e), str(e), "rmqs.runs", "write")
    # rstream's bare error (an empty message), should a path not name the stream: still final.
    assert classify(rx.AccessRefused()) == errors.Classified(
        False,
        "AccessRefusedError: the broker refused an operation for lack of a permission",
        "AccessRefusedError",
    )
    spark = Exception(f"Traceback\npyspark_rmqs.errors.AccessRefusedError: {e}\n SQLSTATE: 38000")
    assert classify(spark).retryable is False and classify(spark).error == "AccessRefusedError"
