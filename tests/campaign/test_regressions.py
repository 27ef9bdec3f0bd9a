"""Every failure class the campaign found, as a plain named test: the shrunk sequence, replayed.

Each test is hypothesis's printed failing sequence (`state.<rule>(...)`, `state.holds()` after each
step as the machine checks it), on the machine with no known bug stepped around. A new failure whose
fix is not in yet gets `@pytest.mark.xfail(raises=Violation, strict=True, reason=...)` and a name in
config.KNOWN_BUGS (the in-suite budget steps around it); when the fix lands the test XPASSes, which
strict makes a failure: drop the mark and move the name to config.FIXED_BUGS. Every test here
failed on 968adeb (the code the campaign was first run on); each says which invariant it broke.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from pyspark_rmqs.broker.client import AsyncBrokerClient
from tests.campaign import faults
from tests.campaign.config import SLOW_OPERATIONS, CampaignConfig
from tests.campaign.harness import FALSE_ALARMS
from tests.campaign.invariants import Violation
from tests.campaign.machine import STATS, CampaignMachine, machine_with
from tests.support.broker import BrokerSettings

pytestmark = [pytest.mark.broker, pytest.mark.airflow]


@pytest.fixture
def state(broker: BrokerSettings) -> Iterator[CampaignMachine]:
    """A fresh machine (its own streams); its streams are deleted even when a step failed. Without
    the slow operations (config.SLOW_OPERATIONS): no Spark consumer in the final check."""
    machine = machine_with(CampaignConfig(disabled=SLOW_OPERATIONS))()
    try:
        yield machine
    finally:
        machine._cleanup()


def steps(state: CampaignMachine, *calls: tuple[str, dict[str, object]]) -> None:
    """Replay `calls` as the machine runs them: each rule, then the invariants; then teardown, whose
    final clean runs check invariant (e)."""
    state.holds()
    for name, kwargs in calls:
        getattr(state, name)(**kwargs)
        state.holds()
    state.teardown()


def test_a_run_on_a_recreated_empty_stream_skips_nothing(state: CampaignMachine) -> None:
    """Issue 42 case 1, invariant (a); fails on HEAD 968adeb (fixed in the working tree since): the run
    on the re-created, still empty stream stored the old watermark there; the new stream's first
    messages were then below the watermark and never delivered. Found by the campaign on HEAD
    (seed 11) as `recreate('a')`, a run of `c4@a` while `a` was empty, then new messages."""
    steps(
        state,
        ("publish", {"to": "a", "n": 5}),
        ("run", {"pipeline": "c2@a"}),
        ("recreate", {"stream": "a"}),
        ("run", {"pipeline": "c2@a"}),
        ("publish", {"to": "a", "n": 5}),
        ("run", {"pipeline": "c2@a"}),
    )


def test_a_latest_consumer_reads_a_new_partition_from_its_start(state: CampaignMachine) -> None:
    """Issue 42 case 2, invariant (a); fails on HEAD 968adeb (fixed in the working tree since): a
    starting_offsets='latest' consumer planned a partition bound after its first run from the
    partition's tail; the messages routed there before were lost."""
    steps(
        state,
        ("run", {"pipeline": "c3@ss"}),
        ("bind_partition", {}),
        ("publish", {"to": "ss", "n": 30}),
        ("run", {"pipeline": "c3@ss"}),
    )


def test_a_lease_lost_mid_sink_lets_no_second_run_deliver(state: CampaignMachine) -> None:
    """Issue 42 case 6, invariant (b), found by the campaign at once (seed 1): the first run's lease
    connection is closed while it is inside its sink; a second run of the consumer took the name,
    resumed the first's record and delivered the same range while the first still delivered it. Now
    the first begins no batch after its lease ended and commits nothing (fixed in e82d69b). Since a
    lease cannot stop the sink call its holder is in, this one-batch range passes on 968adeb under
    the refined invariant; the super stream case below is the one that fails there."""
    steps(
        state,
        ("publish", {"to": "a", "n": 22}),
        ("concurrent_runs", {"pipeline": "c1@a", "n": 6, "close_lease": True}),
    )


def test_a_lease_lost_mid_sink_stops_the_first_run_at_its_next_batch(state: CampaignMachine) -> None:
    """The same on the super stream: the first run's range is one batch per partition stream, so
    after the sink call it was in when its lease ended it must begin no other batch (it stops with
    `LeaseLostError`), while the second run delivers the whole range once (issue 42, case 6)."""
    closed = STATS["lease_connections_closed"]
    taken = STATS["concurrent:second:ok"]
    steps(
        state,
        ("publish", {"to": "ss", "n": 30}),
        ("concurrent_runs", {"pipeline": "c1@ss", "n": 6, "close_lease": True}),
        ("concurrent_runs", {"pipeline": "c2@ss", "n": 6, "close_lease": True}),
    )
    # Both leases were really closed and both second runs delivered (else nothing was tested).
    assert STATS["lease_connections_closed"] - closed == 2
    assert STATS["concurrent:second:ok"] - taken == 2


def test_a_failure_recording_delivered_says_the_output_is_committed(state: CampaignMachine) -> None:
    """Invariant (d), found by the campaign (seed 7; still on e82d69b, fixed in the working tree
    since): a run failing while its record moved to `delivered` (steps.finish_run, outside the
    commit-state marking) raised without a commit_state, though its exactly-once output was
    committed (a retry only stores)."""
    steps(
        state,
        ("publish", {"to": "a", "n": 10}),
        ("run_crashing", {"pipeline": "c2@a", "point": "before_delivered", "retry": True}),
    )


def test_runs_killed_inside_their_outputs_compaction_are_retried_to_every_offset_once(
    state: CampaignMachine,
) -> None:
    """Issue 47 (compaction in the alphabet): exactly-once runs into Parquet (the Airflow operator,
    c2, and Dagster's Arrow asset, c5) die partway through the compaction of their output's commit
    index, before its first to sixth write, delete or move (each in turn), each
    retried at once; the invariants after every step and the final clean runs count every offset.
    Checked: the stops really happened, at more than one place in the compaction."""
    before = faults.COMPACTION_STOPS.copy()
    calls: list[tuple[str, dict[str, object]]] = []
    for i in range(5):
        calls.append(("publish", {"to": "a", "n": 4 + i}))
        for pipeline in ("c2@a", "c5@a"):
            crash: dict[str, object] = {"pipeline": pipeline, "point": "in_compaction", "retry": i % 2 == 0}
            calls.append(("run_crashing", crash))
    steps(state, *calls)
    stops = faults.COMPACTION_STOPS - before
    assert sum(stops.values()) >= 5 and len(stops) >= 2, stops


def test_runs_sigkilled_or_paused_inside_their_outputs_compaction_deliver_every_offset_once(
    broker: BrokerSettings,
) -> None:
    """The same point in a process of its own (`run_killed`, off in the fixture's machine): SIGKILLed
    there and retried, or SIGSTOPped there while the next run takes the lease and compacts the same
    folder, then resumed to finish its stale compaction after it."""
    machine = machine_with(CampaignConfig(disabled=SLOW_OPERATIONS - {"run_killed"}))()
    killed, ended = STATS["killed:in_compaction"], STATS["killed:ended-first"]
    paused = sum(v for k, v in STATS.items() if k.startswith("paused:in_compaction:resumed:"))
    try:
        calls: list[tuple[str, dict[str, object]]] = []
        for i, how in enumerate(("kill", "stop", "kill", "stop")):
            calls.append(("publish", {"to": "a", "n": 3 + i}))
            kill: dict[str, object] = {"pipeline": "c2@a", "point": "in_compaction", "how": how}
            calls.append(("run_killed", {**kill, "retry": how == "kill"}))
        steps(machine, *calls)
    finally:
        machine._cleanup()
    # Every job reached the point (none ended first), two were killed there and two paused there
    resumed = sum(v for k, v in STATS.items() if k.startswith("paused:in_compaction:resumed:"))
    assert STATS["killed:ended-first"] == ended, dict(STATS)
    assert (STATS["killed:in_compaction"] - killed, resumed - paused) == (2, 2), dict(STATS)


def test_a_watermark_the_broker_dropped_after_retention_fails_no_run(state: CampaignMachine) -> None:
    """Invariant (e), found by the campaign (the in-suite budget's final check, before this name was
    stepped around): consumer c1 stored 29 on `a`; retention moved `a`'s first offset past it
    (`truncate`); a run with `fail_on_data_loss=False` plans from 30 (reporting `[30, first)` lost)
    while new messages arrive during its sink and roll a segment, whose tracking snapshot leaves out
    the offset 29, now below the first offset (the broker's rule, `first - 1` included). The run's
    store then finds None where it planned with 29 and fails with the non-retryable
    `WatermarkConflictError` "moved by another run", though no other run exists: an orchestrator
    does not retry, the user is sent looking for a second pipeline. The next run recovers (it
    plans from its record; nothing is lost), so the failure is the bug: the watermark the broker
    dropped below the first offset is not a move by another run."""
    state.holds()
    for name, kwargs in (
        ("publish", {"to": "a", "n": 30}),
        ("run", {"pipeline": "c1@a"}),
        ("truncate", {"stream": "a", "before": 40}),
    ):
        getattr(state, name)(**kwargs)
        state.holds()
    attempt = state._watermark_run("c1@a", lenient=True, late=60)  # late: a segment rolls mid-run
    state.holds()
    assert attempt is not None
    if not attempt.ok and not attempt.retryable:
        raise Violation("e", f"a run of c1@a with no other run of c1 failed for good: {attempt.describe()}")
    state.teardown()


def test_a_watermark_the_broker_dropped_after_retention_is_no_silent_loss(state: CampaignMachine) -> None:
    """Invariant (a), a silent loss found by `make campaign` (seed 3222448890, shrunk by hand): `rmqs
    watermark set --to half` positions c1 on `b` at 20 (c1 never ran there: no run record);
    retention moves `b`'s first offset past it (`truncate`: offsets 21 and up to the new first
    offset are gone before c1 read them); the next publish rolls a segment, whose tracking snapshot
    leaves out the stored offset below the first offset (the broker's rule). c1's next run finds no
    watermark and no record, starts at the first offset kept ("earliest") and succeeds with no
    `DataLossError` and no `data_loss`: the offsets between its watermark and the first offset kept
    were lost silently (lag 0). A consumer with a run record is safe: its record's end places it."""
    steps(
        state,
        ("publish", {"to": "b", "n": 40}),
        ("watermark_set", {"pipeline": "c1@b", "to": "half"}),
        ("truncate", {"stream": "b", "before": 15}),
        ("publish", {"to": "b", "n": 50}),
        ("run", {"pipeline": "c1@b"}),
    )


def test_a_watermark_set_before_the_first_offset_places_the_next_run_where_the_command_said(
    state: CampaignMachine,
) -> None:
    """Invariant (a), found by `make campaign` (seed 3752431201) once `rmqs watermark set` wrote a run
    record, shrunk by delta debugging: c5 (Dagster) ran on an empty `b`, `b` was deleted and created
    again, retention moved its first offset to 92, and `watermark set --to half` asked for offset 53.
    The command clamps a start before the first offset to the first offset and says so (a note);
    it stored 91, which the broker forgets at once (`first - 1`), and its record places the next run
    at 92. The model read the stored offsets back (None) instead of what the command said it did,
    and counted the 92 messages retention took before the move as owed: a campaign bug, not the
    product's. Kept so the model and the command agree on where a moved consumer stands."""
    steps(
        state,
        ("run_skipping_loss", {"pipeline": "c5@b"}),
        ("delete_or_create", {"stream": "b"}),
        ("delete_or_create", {"stream": "b"}),
        ("explicit_run", {"fault": "sink", "fresh": 0, "pipeline": "c2@ss", "quarter": 4}),
        ("truncate", {"before": 20, "stream": "b"}),
        ("explicit_run", {"fault": "after_first_store", "fresh": 5, "pipeline": "c4@b", "quarter": 1}),
        ("watermark_set", {"pipeline": "c5@b", "to": "half"}),
    )


def test_a_resumed_range_retention_overtook_stores_its_end_without_a_conflict(
    state: CampaignMachine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant (e), found by `make campaign` (seed 3752431201, with the record of `rmqs watermark
    set`; its 40 steps replayed fail about every other time): c5's run on `a` fails in its sink (its
    record keeps the range `[0, 5)`); retention moves `a`'s first offset past the range
    (`truncate`). The retry resumes the record (with `fail_on_data_loss=False` it skips what is
    lost) and stores its end, 4, below the first offset; a segment rolls before the store is read
    back (here on purpose: a real publish of chunks bigger than a segment, right after the store),
    and the new segment's snapshot leaves the offset out (None). The run took that for a
    concurrent store and failed with the non-retryable `WatermarkConflictError`, though no other
    run exists, and so did every retry. The record places the consumer there."""
    state.holds()
    for name, kwargs in (
        ("publish", {"to": "a", "n": 5}),
        ("run_failing_sink", {"pipeline": "c5@a", "after": 0, "late": 0, "retry": False}),
        ("truncate", {"stream": "a", "before": 30}),
    ):
        getattr(state, name)(**kwargs)
        state.holds()
    stream = state._target(state.model.pipelines["c5@a"]).name
    store = AsyncBrokerClient.store_offsets

    async def store_then_roll(self: AsyncBrokerClient, consumer: str, offsets: dict[str, int]) -> None:
        await store(self, consumer, offsets)
        if consumer == "c5":  # a roll, whose snapshot drops the entry
            await asyncio.to_thread(state._roll, "a", stream)

    monkeypatch.setattr(AsyncBrokerClient, "store_offsets", store_then_roll)
    attempt = state._watermark_run("c5@a", lenient=True)
    monkeypatch.undo()
    state.holds()
    assert attempt is not None
    if not attempt.ok and not attempt.retryable:
        raise Violation("e", f"a run of c5@a with no other run of c5 failed for good: {attempt.describe()}")
    state.teardown()


def test_a_resumed_range_whose_end_retention_removed_stores_and_moves_on(
    state: CampaignMachine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant (e), found by `make campaign` (seed 2949345665: the Iceberg and drain consumers on a
    super stream; shrunk by hand to a plain consumer): c1's run delivers `[0, 20)` and dies before
    it stores its watermark; retention moves `a`'s first offset past 19. Every later run resumes the
    record and stores 19, which the broker drops when a segment rolls before the store is read back
    (the campaign's segments are tiny: its store's own tracking chunk rolled one, every time; here
    a real publish of chunks bigger than a segment, right after the store). The read-back waited
    for 19 and failed with the retryable `BrokerTimeoutError`, on every run: the consumer stalled
    and its lag grew. The broker's drop is not a failure: the record places the consumer, and the
    next run reports what retention took."""
    state.holds()
    for name, kwargs in (
        ("publish", {"to": "a", "n": 20}),
        ("run_crashing", {"pipeline": "c1@a", "point": "before_store", "retry": False}),
        ("truncate", {"stream": "a", "before": 30}),
    ):
        getattr(state, name)(**kwargs)
        state.holds()
    stream = state._target(state.model.pipelines["c1@a"]).name
    call = AsyncBrokerClient._call

    async def store_then_roll(self: AsyncBrokerClient, what: str, fn: object) -> object:
        out = await call(self, what, fn)
        if what == "store_offset":  # a roll before the read-back, whose snapshot drops it
            await asyncio.to_thread(state._roll, "a", stream)
        return out

    monkeypatch.setattr(AsyncBrokerClient, "_call", store_then_roll)
    attempt = state._watermark_run("c1@a")
    monkeypatch.undo()
    state.holds()
    assert attempt is not None
    if not attempt.ok:
        raise Violation("e", f"a run of c1@a failed where the broker dropped its store: {attempt.describe()}")
    state.publish(to="a", n=5)
    state.holds()
    state.run(pipeline="c1@a")  # reports [20, first) lost: DataLossError, as the model expects
    state.holds()
    state.teardown()


def test_an_iceberg_run_committed_then_killed_whose_partition_is_recreated_writes_no_range_twice(
    broker: BrokerSettings,
) -> None:
    """Invariant (b), found by the campaign's Iceberg consumer (seeds 23 and 1835206980, shrunk): a
    run into Iceberg on a super stream commits its append and dies before its record says
    `delivered`; one partition is deleted and created again; the next run cannot resume that record
    (its marker no longer matches the partition) and plans anew from the old watermark: the table
    recognised only the dead run's exact token, so the other partitions' ranges were appended a
    second time (15 messages twice). The sink now recognises committed spans per partition range, as
    the Parquet commits do."""
    machine = machine_with(CampaignConfig(disabled=SLOW_OPERATIONS - {"iceberg_run"}))()
    try:
        steps(
            machine,
            ("bind_partition", {}),
            ("publish", {"to": "ss", "n": 30}),
            ("iceberg_run", {"to": "ss", "fault": "before_delivered", "retry": False}),
            ("recreate", {"stream": "ss-2"}),
        )
    finally:
        machine._cleanup()


def test_a_new_drain_checkpoint_reports_what_retention_took_where_the_consumer_stood(
    broker: BrokerSettings,
) -> None:
    """Found by `make campaign` on a fresh clone (seed 3553289418, then these steps by hand). A
    drain read a super stream while its third partition was empty (so it stored no offset there);
    retention then truncated that partition and another partition was re-created. The drain on the
    old checkpoint is refused; its user starts a new checkpoint and folder. That checkpoint began at
    `startingOffsets=earliest` on the truncated partition (and on any stream whose stored offset the
    broker forgot once retention passed it): what retention took after the consumer's last drain
    was skipped silently (76 messages "promised", invariant (a)). It now starts where a watermark
    run of the consumer would (`runs.drain_start`) and reports the loss."""
    from tests.campaign.spark_rules import spark_environment

    spark_environment()
    machine = machine_with(CampaignConfig(disabled=SLOW_OPERATIONS - {"drain"}))()
    try:
        steps(
            machine,
            ("bind_partition", {}),
            ("publish_everywhere", {"n": 15}),
            ("recreate", {"stream": "ss-2"}),
            ("drain", {"new_checkpoint": False, "to": "ss"}),
            ("truncate", {"before": 15, "stream": "ss-2"}),
            ("publish_everywhere", {"n": 14}),
            ("recreate", {"stream": "ss-1"}),
        )
    finally:
        machine._cleanup()


@pytest.mark.parametrize(
    ("pipeline", "fault"),
    [
        ("c2@b", "before_delivered"),  # the Parquet commit record names the run; its record: `planned`
        ("c2@b", "before_store"),  # its record says `delivered`
        ("c8@b", "before_delivered"),  # the run's token is in the Iceberg table's snapshots
        ("c6@ss", "before_delivered"),  # Spark's file commit record names the run
    ],
)
def test_a_retry_whose_output_holds_its_range_reports_no_loss_of_what_retention_took_since(
    broker: BrokerSettings, pipeline: str, fault: str
) -> None:
    """The campaign's false alarms (`make campaign`: `c8@b` and `c6@ss` failing with "offsets [0, 5)
    ... are lost: retention removed them before this retry"). A run delivers 5 messages, `[0, 5)`, and
    its process dies after its output committed them (or after its record said `delivered`);
    retention then removes `[0, 5)`. The retry resumes the record and failed with the non-retryable
    `DataLossError` at planning, before it looked at its output, though the output held all five:
    the pipeline stopped until a user acted, and nothing was lost. Now a resumed range is reported
    lost only where the retry reads it again."""
    from tests.campaign.spark_rules import spark_environment

    consumer, target = pipeline.split("@")
    rule = {"c6": "spark_run", "c8": "iceberg_run"}.get(consumer)
    if consumer == "c6":
        spark_environment()
    machine = machine_with(CampaignConfig(disabled=SLOW_OPERATIONS - {rule} if rule else SLOW_OPERATIONS))()
    alarms = len(FALSE_ALARMS)
    stream = "ss-1" if target == "ss" else target
    crashing: tuple[str, dict[str, object]] = (
        ("spark_run", {"to": target, "consumer": "c6", "crash": fault, "retry": False})
        if consumer == "c6"
        else ("iceberg_run", {"to": target, "fault": fault, "retry": False})
        if consumer == "c8"
        else ("run_crashing", {"pipeline": pipeline, "point": fault, "retry": False})
    )
    try:
        machine.holds()
        for name, kwargs in (
            ("publish", {"to": target, "n": 10 if target == "ss" else 5}),
            crashing,
            ("truncate", {"stream": stream, "before": 0}),
        ):
            getattr(machine, name)(**kwargs)
            machine.holds()
        retry = machine._watermark_run(pipeline)
        machine.holds()
        assert retry is not None and retry.ok and retry.resumed, retry and retry.describe()
        assert FALSE_ALARMS[alarms:] == []
        machine.teardown()
    finally:
        machine._cleanup()


@pytest.mark.parametrize(
    "calls",
    [
        pytest.param(  # the run asked for offsets 0.. of a truncated stream
            [
                ("publish", {"to": "b", "n": 40}),
                ("truncate", {"stream": "b", "before": 30}),
                ("explicit_run", {"pipeline": "c3@b", "quarter": 0, "fault": None, "fresh": 0}),
            ],
            id="explicit-start-below-the-first-offset",
        ),
        pytest.param(  # c3's first run, from offset 0 of an empty stream, placed it there
            [
                ("explicit_run", {"pipeline": "c3@b", "quarter": 0, "fault": None, "fresh": 0}),
                ("publish", {"to": "b", "n": 40}),
                ("truncate", {"stream": "b", "before": 30}),
                ("run", {"pipeline": "c3@b"}),
            ],
            id="placed-by-an-explicit-run",
        ),
        pytest.param(  # `rmqs watermark set` placed c3; `b` re-created since is read from its start
            [
                ("publish", {"to": "b", "n": 8}),
                ("watermark_set", {"pipeline": "c3@b", "to": "half"}),
                ("recreate", {"stream": "b"}),
                ("publish", {"to": "b", "n": 40}),
                ("truncate", {"stream": "b", "before": 30}),
                ("run", {"pipeline": "c3@b"}),
            ],
            id="placed-by-watermark-set",
        ),
    ],
)
def test_a_latest_consumers_report_of_what_it_was_placed_at_or_asked_for_is_no_false_alarm(
    state: CampaignMachine, calls: list[tuple[str, dict[str, object]]]
) -> None:
    """The model, not the product (`make campaign`: "c3@b: ... DataLossError: offsets [0, 126) of
    stream '...-b' are lost: retention removed them before this run", counted as a false alarm). `c3`
    starts at `latest`, and the model owed it nothing until its first *watermark* run: it took a
    report of what retention removed for one naming only messages the consumer did not lose. But a
    run from explicit offsets asked for them (as a backfill does, which was never counted), and a
    storing run from explicit offsets, or `rmqs watermark set`, places the consumer as its first
    watermark run would: its run record says where it stands (offset 0 of the empty stream, or of
    the stream re-created since), and what retention took after that is its loss, rightly reported."""
    alarms = len(FALSE_ALARMS)
    steps(state, *calls)
    assert FALSE_ALARMS[alarms:] == []


def test_the_sensors_rule_ticks_dagsters_new_data_sensor_of_a_consumer_that_owes_messages(
    state: CampaignMachine,
) -> None:
    """The `sensors` rule covers Dagster's new-data sensor (`build_new_data_sensor`) for the Dagster
    consumer c5: new messages it owes, and the sensor must request a run (a sensor that never fires
    leaves them unread, lag or not). Seen failing with the sensor's lag check mutated to skip."""
    steps(
        state,
        ("run", {"pipeline": "c5@a"}),
        ("publish", {"n": 7, "to": "a"}),
        ("sensors", {"pipeline": "c5@a"}),
    )
    assert STATS["sensor:dagster_new_data=True"] >= 1


def test_the_spark_publish_rule_finds_each_message_once_and_every_consumer_reads_it(
    broker: BrokerSettings,
) -> None:
    """The `spark_publish` rule (the Spark sink through `RabbitMQStreamPublishOperator`, off in the
    in-suite budget): its messages are each found once where hash routing put them, and the final
    check reads them through every consumer."""
    from tests.campaign.spark_rules import spark_environment

    spark_environment()
    machine = machine_with(CampaignConfig(disabled=SLOW_OPERATIONS - {"spark_publish"}))()
    try:
        steps(
            machine,
            ("spark_publish", {"n": 23, "to": "ss", "kill": False}),
            ("run", {"pipeline": "c2@ss"}),
            ("spark_publish", {"n": 5, "to": "a", "kill": False}),
        )
    finally:
        machine._cleanup()
    assert STATS["spark_publish:ok"] >= 2


def test_an_unfinished_run_planned_anew_starts_where_its_sink_never_delivered(state: CampaignMachine) -> None:
    """Invariant (a), found by `make campaign` (batch seed 2622322657) and shrunk by hand. A latest
    consumer's run failed in its sink (its record `planned`); retention then passed the consumer's
    stored offset on `ss-0` and the broker forgot it, so the retry planned anew (the watermark
    "moved") and placed `ss-0` at the failed record's end, as if its range had been delivered: the
    data-loss report named only what lay past that end (17 messages the consumer owed, unreported).
    A record's ends place its consumer only once its sink succeeded (`plan._recorded_positions`).
    Seen failing with `_recorded_positions` taking the ends of a `planned` record."""
    steps(
        state,
        ("bind_partition", {}),
        ("dagster_ranges", {"new": 5, "quarter": 1, "to": "ss"}),
        ("run_with_late_data", {"pipeline": "c4@ss"}),
        ("publish", {"n": 20, "to": "ss"}),
        ("run_failing_sink", {"after": 0, "late": 7, "pipeline": "c4@ss", "retry": False}),
        ("truncate", {"before": 28, "stream": "ss-0"}),
    )


def test_two_dagster_materializations_at_once_deliver_each_message_once(state: CampaignMachine) -> None:
    """`concurrent_runs` for the Dagster consumer: a second materialization of its asset while the
    first is inside its sink gets `ConsumerBusyError`; with the first's lease connection closed,
    the second delivers and the first stops with `LeaseLostError` before its commit. Every message
    once in the exactly-once output (invariants b and e)."""
    steps(
        state,
        ("publish", {"n": 20, "to": "ss"}),
        ("concurrent_runs", {"pipeline": "c5@ss", "n": 5, "close_lease": False}),
        ("concurrent_runs", {"pipeline": "c5@a", "n": 5, "close_lease": True}),
        ("publish", {"n": 5, "to": "a"}),
        ("run", {"pipeline": "c5@a"}),
    )
    assert STATS["concurrent:second:ConsumerBusyError"] >= 1 and STATS["concurrent:second:ok"] >= 1


def test_a_partition_left_deleted_is_owed_to_nobody_and_a_record_that_planned_it_reports_it(
    state: CampaignMachine,
) -> None:
    """`drop_partition`: the third partition stream deleted and left so, with a record of c2 that
    planned it unfinished (its sink failed): c2's retry fails with `DataLossError` naming the
    partition (the final check runs it again with fail_on_data_loss=False), the other consumers go
    on over two partitions, and a partition bound again later is a new incarnation, read whole."""
    steps(
        state,
        ("publish", {"n": 20, "to": "ss"}),
        ("bind_partition", {}),
        ("publish", {"n": 30, "to": "ss"}),
        ("run", {"pipeline": "c1@ss"}),
        ("run_failing_sink", {"after": 0, "late": 3, "pipeline": "c2@ss", "retry": False}),
        ("drop_partition", {}),
        ("run", {"pipeline": "c2@ss"}),
        ("publish", {"n": 10, "to": "ss"}),
        ("run", {"pipeline": "c1@ss"}),
        ("run", {"pipeline": "c5@ss"}),
        ("bind_partition", {}),
        ("publish", {"n": 30, "to": "ss"}),
        ("run", {"pipeline": "c3@ss"}),
        ("run", {"pipeline": "c2@ss"}),
    )
    assert STATS["outcome:watermark:DataLossError"] >= 1


def test_a_drain_whose_spark_workers_are_killed_mid_read_retries_to_every_offset_once(
    broker: BrokerSettings,
) -> None:
    """`drain_killed` (off in the in-suite budget): the Spark Python task workers of a drain killed
    (SIGKILL) mid-read fail the query; Airflow's retry goes on from the checkpoint, and the drain
    consumer's output holds every offset once (invariants after each step and the final check)."""
    from tests.campaign.spark_rules import spark_environment

    spark_environment()
    machine = machine_with(
        CampaignConfig(disabled=SLOW_OPERATIONS - {"drain", "drain_killed", "spark_run"})
    )()
    try:
        steps(
            machine,
            ("publish", {"n": 20, "to": "ss"}),
            ("drain", {"new_checkpoint": False, "to": "ss"}),
            ("drain_killed", {"to": "ss"}),
            ("publish", {"n": 10, "to": "ss"}),
            # The Spark consumer's run on the same session: the kill's dead pooled workers are gone.
            ("spark_run", {"to": "ss", "consumer": "c6", "crash": None, "retry": False}),
        )
    finally:
        machine._cleanup()
    assert STATS["drain_killed:killed=True:StreamingQueryException"] >= 1
