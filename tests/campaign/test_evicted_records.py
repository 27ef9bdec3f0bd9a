"""Run records that retention removed from `rmqs.runs` (`evict_records`), replayed as named tests.

The in-suite budget runs on the shared broker, whose `rmqs.runs` is every test's (1 GB): these
tests take a fresh virtual host on it instead, with a small `rmqs.runs` of its own
(`BrokerOps.recreate_runs_stream`), as `make campaign` has on its own broker. Each is a sequence of
the machine's rules (test_regressions.py's `steps`): what the docs promise once a consumer's newest
record is gone (docs/permissions.md "Size and retention"), and that exactly-once still holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from tests.campaign.broker_ops import BrokerOps
from tests.campaign.config import SLOW_OPERATIONS, CampaignConfig
from tests.campaign.machine import STATS, CampaignMachine, machine_with
from tests.campaign.test_regressions import steps
from tests.support.broker import BrokerSettings
from tests.support.permissions import fresh_vhost

pytestmark = [pytest.mark.broker, pytest.mark.airflow]


@pytest.fixture
def evicting(broker: BrokerSettings) -> Iterator[CampaignMachine]:
    """A fresh machine in a virtual host of its own, whose `rmqs.runs` is small."""
    with fresh_vhost(broker) as vhost:
        BrokerOps(replace(broker, vhost=vhost)).recreate_runs_stream()
        config = CampaignConfig(
            disabled=SLOW_OPERATIONS - {"evict_records"}, evictable_records=True, vhost=vhost
        )
        machine = machine_with(config)()
        try:
            yield machine
        finally:
            machine._cleanup()


def test_a_latest_consumer_placed_only_by_its_record_starts_at_the_tail_once_it_is_gone(
    evicting: CampaignMachine,
) -> None:
    """A `latest` consumer whose first run found its stream empty stores nothing: its record alone
    places it. Once retention removed that record it is a consumer that never ran, and its next run
    plans from the tail: the messages published meanwhile are not its (docs/permissions.md), and
    what arrives after that run planned is (the final check)."""
    evicted = STATS["records_evicted"]
    steps(
        evicting,
        ("run", {"pipeline": "c4@a"}),
        ("publish", {"to": "a", "n": 5}),
        ("evict_records", {"pipeline": "c4@a", "fault": None, "retry": False, "extra": 0}),
        ("publish", {"to": "a", "n": 3}),
        ("run", {"pipeline": "c4@a"}),
    )
    assert STATS["records_evicted"] > evicted


@pytest.mark.parametrize("fault", ["before_delivered", "before_store", "after_first_store", "sink"])
def test_a_failed_try_whose_record_is_gone_is_planned_anew_and_writes_no_offset_twice(
    evicting: CampaignMachine, fault: str
) -> None:
    """A try fails (its process dying after its exactly-once output committed, or its sink failing),
    retention removes its record, new messages arrive, and the retry plans anew from the stored
    watermarks, with another token: every output still holds each offset at most once (the output's
    committed spans), and every owed message at least once."""
    evicted = STATS["records_evicted"]
    steps(
        evicting,
        ("publish", {"to": "ss", "n": 30}),
        ("run", {"pipeline": "c3@ss"}),
        ("publish", {"to": "ss", "n": 20}),
        ("evict_records", {"pipeline": "c2@ss", "fault": fault, "retry": False, "extra": 0}),
        ("evict_records", {"pipeline": "c3@ss", "fault": fault, "retry": False, "extra": 0}),
        ("evict_records", {"pipeline": "c5@ss", "fault": fault, "retry": False, "extra": 0}),
        ("publish", {"to": "ss", "n": 10}),
        ("run", {"pipeline": "c2@ss"}),
        ("run", {"pipeline": "c3@ss"}),
        ("run", {"pipeline": "c5@ss"}),
    )
    assert STATS["records_evicted"] >= evicted + 3


def test_a_try_dying_in_its_outputs_compaction_whose_record_is_gone_writes_no_offset_twice(
    evicting: CampaignMachine,
) -> None:
    """The commit index is compacted every 2 commits here (config.COMPACT_EVERY): a try dies before
    each of the compaction's first mutations in turn (`in_compaction`), its record is removed, new
    messages arrive, and the retry plans anew with another token. What the output committed is
    known from its index and records alone (its committed spans), however far the compaction got:
    each offset at most once, every owed one at least once."""
    calls: list[tuple[str, dict[str, object]]] = [("publish", {"to": "a", "n": 10})]
    retry = {"fault": "in_compaction", "retry": True, "extra": 0}
    for _ in range(6):
        for pipeline in ("c2@a", "c5@a"):
            calls += [
                ("publish", {"to": "a", "n": 7}),
                ("run", {"pipeline": pipeline}),
                ("publish", {"to": "a", "n": 5}),
                ("evict_records", {"pipeline": pipeline, **retry}),
            ]
    died = STATS["evicted:gone:failed-try"]
    steps(evicting, *calls)
    assert STATS["evicted:gone:failed-try"] >= died + 10  # (12 measured) tries died, their records gone


def test_a_watermark_set_after_the_record_is_gone_skips_what_it_moves_past(evicting: CampaignMachine) -> None:
    """A model bug the campaign found (master seed 2874296, batch 2943476093, shrunk): a `latest`
    consumer placed only by its record (its first run found the super stream empty), the record
    removed, one message published, then `rmqs watermark set --to latest`. The set stored offsets
    and wrote a record, so the consumer is placed again, past that message on purpose; the model
    judged what the set skipped while it still took the consumer for one that never ran (nothing
    owed), then placed it again: the skipped message was owed below its watermark (invariant a)."""
    steps(
        evicting,
        ("run_capped", {"cap": 30, "pipeline": "c3@ss"}),
        ("publish_everywhere", {"n": 1}),
        ("evict_records", {"pipeline": "c3@ss", "fault": None, "retry": False, "extra": 0}),
        ("watermark_set", {"pipeline": "c3@ss", "to": "latest"}),
    )
