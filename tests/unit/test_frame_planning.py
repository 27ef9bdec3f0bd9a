"""How publish frames are cut: by entry count and by bytes against the negotiated frame_max."""

from __future__ import annotations

from pyspark_rmqs.broker.frames import plan_frames


def test_frames_hold_at_most_max_entries() -> None:
    assert plan_frames([1] * 7, 3, 1000) == [(0, 3), (3, 6), (6, 7)]


def test_frames_hold_at_most_max_bytes() -> None:
    assert plan_frames([40, 40, 40, 30, 10], 100, 100) == [(0, 2), (2, 5)]


def test_an_entry_over_the_limit_gets_a_frame_of_its_own() -> None:
    assert plan_frames([10, 500, 10, 10], 100, 100) == [(0, 1), (1, 2), (2, 4)]


def test_no_entries_no_frames() -> None:
    assert plan_frames([], 10, 100) == []
