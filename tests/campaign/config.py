"""What a campaign explores, and which known bugs it steps around.

A failure the campaign found and that is being fixed would fail every later run at once, hiding
the next one: each known bug has a name here, and `avoid` makes the machine step around exactly
the sequences that trigger it (a guard in the rule, counted as `avoided:<name>` in the stats), so
the search goes on past it. Remove a name once its fix is in: the in-suite budget
(`test_campaign.py`) then covers it again. `CAMPAIGN_AVOID` / `CAMPAIGN_DISABLE` (comma-separated)
set them for `make campaign`; `all` in CAMPAIGN_AVOID means every name (open or fixed).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

# Each known failure class still open: what it is, the regression test that reproduces it.
KNOWN_BUGS: dict[str, str] = {}

# Failure classes fixed since (in the working tree when the campaign was written): their guards stay,
# so `--avoid` can still step around them on older code.
FIXED_BUGS: dict[str, str] = {
    "evicted-watermark-silent": (
        "found by the campaign: a consumer positioned only by a stored watermark (`rmqs watermark "
        "set`, no run record yet) whose watermark retention passed: the broker drops the stored "
        "offset at its next segment roll, and the next run starts at the first offset kept, "
        "reporting no loss (silent, lag 0) "
        "(test_regressions.py::test_a_watermark_the_broker_dropped_after_retention_is_no_silent_loss)"
    ),
    "evicted-watermark-conflict": (
        "found by the campaign: retention moved a stream's first offset past a consumer's stored "
        "watermark; the broker drops that stored offset at its next segment roll, and a run that "
        "planned before the drop fails at its store with a non-retryable WatermarkConflictError "
        "('moved by another run ...: <watermark> -> None'), though no other run exists "
        "(test_regressions.py::test_a_watermark_the_broker_dropped_after_retention_fails_no_run)"
    ),
    "lease-close": (
        "issue 42 case 6: a lease lost mid-sink let a second run deliver the same range at once "
        "(test_regressions.py::test_a_lease_lost_mid_sink_lets_no_second_run_deliver)"
    ),
    "delivered-commit-state": (
        "found by the campaign: a run failing while its record moved to `delivered` (after the sink "
        "returned, after an exactly-once output committed) raised without a commit_state "
        "(test_regressions.py::test_a_failure_recording_delivered_says_the_output_is_committed)"
    ),
    "recreated-empty-run": (
        "issue 42 case 1: a watermark run on a deleted and re-created stream while it is still empty "
        "stores the old incarnation's watermark on the new one; the first messages are skipped "
        "(test_regressions.py::test_a_run_on_a_recreated_empty_stream_skips_nothing)"
    ),
    "latest-new-partition": (
        "issue 42 case 2: a starting_offsets='latest' consumer plans a partition bound after its "
        "first run from its tail, losing its first messages "
        "(test_regressions.py::test_a_latest_consumer_reads_a_new_partition_from_its_start)"
    ),
}
AVOIDABLE = (*KNOWN_BUGS, *FIXED_BUGS)

OUTPUTS = ("local", "s3", "alternate")
# Which broker a sequence runs on: "shared" (the suite's, or RMQS_TEST_URI's: never restarted) or
# "restartable" (the suite's second local broker, which `broker_restart` restarts: the runner's default).
BROKERS = ("shared", "restartable")
# Commit records outside an output's index before a run folds them in (`commit_index.COMPACT_EVERY`,
# 16 by default: a sequence's output rarely gets there), in the machine's process and kill_job's.
COMPACT_EVERY = 2

# Operations that can be switched off by name (the rule names of machine.py).
OPERATIONS = (
    "publish",
    "publish_everywhere",
    "run",
    "run_capped",
    "run_with_late_data",
    "run_failing_sink",
    "run_crashing",
    "recreate",
    "delete_or_create",
    "bind_partition",
    "drop_partition",
    "backfill",
    "explicit_run",
    "concurrent_runs",
    "watermark_set",
    "truncate",
    "run_skipping_loss",
    "backfill_by_time",
    "timed_run",
    "run_killed",
    "spark_run",
    "drain",
    "drain_killed",
    "drain_sink_failing",
    "broker_restart",
    "broker_pause",
    "produce_run",
    "dagster_ranges",
    "dagster_window",
    "iceberg_run",
    "sensors",
    "spark_publish",
    "evict_records",
)


def _names(variable: str, known: tuple[str, ...]) -> frozenset[str]:
    raw = {x.strip() for x in os.environ.get(variable, "").split(",") if x.strip()}
    if "all" in raw:
        return frozenset(known)
    unknown = raw - set(known)
    if unknown:
        raise ValueError(f"{variable}: unknown name(s) {sorted(unknown)}; known: {', '.join(known)}")
    return frozenset(raw)


@dataclass(frozen=True)
class CampaignConfig:
    """The machine's knobs: known bugs to step around, operations switched off, the final check."""

    avoid: frozenset[str] = field(default_factory=frozenset)
    disabled: frozenset[str] = field(default_factory=frozenset)
    final: bool = True  # the clean final run of every consumer and invariant (e) at teardown
    # Messages per partition each target starts with (0: empty streams, as `make campaign` runs).
    # On a broker before 4.3 a stream holding only offset-tracking entries costs every tail lookup
    # a 1.5 s probe (a marker on an empty stream did, until runs stopped marking empty streams);
    # streams in use keep the in-suite budget's time steady; re-created streams and bound
    # partitions still start empty.
    initial_messages: int = 0
    # Where the Airflow consume operator's and the Dagster arrow asset's exactly-once consumers write:
    # "local" folders, "s3" (moto's server: object_store.py), or "alternate" (the runner: s3 for odd
    # batch seeds, so a batch replays with its own choice).
    outputs: str = "local"
    broker: str = "shared"
    # Whether `rmqs.runs` on the sequence's broker is the campaign's own, small one
    # (`BrokerOps.recreate_runs_stream`: the runner's, on its own broker): retention removes run
    # records, and the model follows which consumers' newest records are gone (`evict_records`).
    evictable_records: bool = False
    # The virtual host the sequence's streams live in (None: the broker settings' own): the tests of
    # evicted records take a fresh one on the shared broker, whose `rmqs.runs` they may make small.
    vhost: str | None = None

    def avoids(self, bug: str) -> bool:
        assert bug in AVOIDABLE, bug
        return bug in self.avoid

    def enabled(self, operation: str) -> bool:
        assert operation in OPERATIONS, operation
        return operation not in self.disabled

    @classmethod
    def from_env(cls, base: CampaignConfig | None = None) -> CampaignConfig:
        base = base or cls()
        avoid = _names("CAMPAIGN_AVOID", AVOIDABLE)
        disabled = _names("CAMPAIGN_DISABLE", OPERATIONS)
        outputs = os.environ.get("CAMPAIGN_OUTPUTS", base.outputs)
        if outputs not in OUTPUTS:
            raise ValueError(f"CAMPAIGN_OUTPUTS: {outputs!r}; known: {', '.join(OUTPUTS)}")
        broker = os.environ.get("CAMPAIGN_BROKER", base.broker)
        if broker not in BROKERS:
            raise ValueError(f"CAMPAIGN_BROKER: {broker!r}; known: {', '.join(BROKERS)}")
        return replace(
            base,
            avoid=base.avoid | avoid,
            disabled=base.disabled | disabled,
            outputs=outputs,
            broker=broker,
        )

    def for_batch(self, batch: int) -> CampaignConfig:
        """This configuration for the batch seeded `batch` ("alternate" outputs decided by the seed)."""
        if self.outputs != "alternate":
            return self
        return replace(self, outputs="s3" if batch % 2 else "local")


# The in-suite budget steps around every known bug still open (not the fixed ones), so `make test`
# stays green while the regression tests (xfail, strict) say when a fix lands.
# Rules costing seconds per step are off here: a Python process with Airflow imported, Spark, and
# time positions (on a broker before 4.3, a time past a partition's newest chunk costs a 1.5 s
# probe: every end in the future, most ends just past). Without `spark_run` the Spark consumer
# (harness.SPARK_PIPELINES) does not exist at all.
SLOW_OPERATIONS = frozenset(
    {
        "run_killed",
        "spark_run",
        "drain",
        "drain_killed",
        "drain_sink_failing",
        "broker_restart",
        "broker_pause",
        "timed_run",
        "backfill_by_time",
        "dagster_window",
        "iceberg_run",
        "spark_publish",
        # The shared broker's `rmqs.runs` is every test's (1 GB): only the campaign's own is small.
        "evict_records",
    }
)
SUITE = CampaignConfig(avoid=frozenset(KNOWN_BUGS), disabled=SLOW_OPERATIONS, initial_messages=2)
