from pyspark_rmqs.core.progress import lag_from_progress


def test_lag_from_progress_per_source() -> None:
    progress = {
        "sources": [
            {
                "description": "rabbitmq_streams",
                "startOffset": '{"o-0": 10, "o-1": 5}',
                "endOffset": '{"o-0": 20, "o-1": 5}',
                "latestOffset": '{"o-0": 25, "o-1": 9}',
            },
            {"description": "other", "endOffset": None, "latestOffset": None},
        ]
    }
    [lag] = lag_from_progress(progress)
    assert lag["offsetsBehindLatest"] == {"o-0": 5, "o-1": 4}
    assert (lag["minOffsetsBehindLatest"], lag["maxOffsetsBehindLatest"]) == (4, 5)
    assert lag["avgOffsetsBehindLatest"] == 4.5


def test_lag_from_progress_none() -> None:
    assert lag_from_progress(None) == []
