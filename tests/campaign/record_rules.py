"""Run records removed by retention: `evict_records` fills the campaign's own `rmqs.runs` until
retention removed a consumer's newest record, optionally between a failed try and its retry.

rmqs keeps each consumer's run records in `rmqs.runs` (`runs/record.py`), which has size retention
(1 GB by default; rmqs creates it only when missing). The runner creates the campaign's own small
(`broker_ops.RUNS_STREAM_ARGS`, on its own broker only: config.evictable_records), so retention
removes records here as 1 GB of other runs would in a busy virtual host: the filler of this rule,
and the campaign's own runs too. The harness observes whose newest record is gone
(`CampaignBase._observe_records`, read on the broker, not through rmqs) and the model follows what
the docs promise then (docs/permissions.md "Size and retention"): the consumer plans from its stored
offsets, elsewhere from `starting_offsets`, as a consumer that never ran; a `latest` one owes
nothing published there before that run planned; no loss report is owed for what retention took
below a watermark the broker forgot. Every other invariant holds as before: exactly-once outputs
hold every offset at most once, and no run fails for good.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import rule

from tests.campaign.faults import CRASH_POINTS
from tests.campaign.harness import ICEBERG_PIPELINES, PIPELINES, SPARK_PIPELINES, STATS
from tests.campaign.model import PipelineModel
from tests.campaign.sensor_rules import SensorRules
from tests.campaign.spark_rules import spark_environment

MAX_FILL = 16  # filler segments at most (retention keeps 8): the record is gone well before
FAULTS = (None, None, "sink", *CRASH_POINTS)


class RecordRules(SensorRules):
    """`evict_records` (see the module docstring)."""

    @rule(
        pipeline=st.sampled_from((*PIPELINES, *SPARK_PIPELINES, *ICEBERG_PIPELINES)),
        fault=st.sampled_from(FAULTS),
        retry=st.booleans(),
        extra=st.integers(0, 2),
    )
    def evict_records(self, pipeline: str, fault: str | None, retry: bool, extra: int) -> None:
        """Filler into `rmqs.runs` until retention removed `pipeline`'s newest record (then `extra`
        segments more); with `fault`, a watermark run failing so first (its sink, or its process
        dying at a protocol step), and with `retry` the run again once the record is gone."""
        if not self._step("evict_records"):
            return
        if not self.config.evictable_records:
            return self._skip("evict-shared-runs-stream")
        p = self.model.pipelines.get(pipeline)
        if p is None:
            return self._skip("evict-no-such-consumer")
        first = None
        if fault is not None and self.model.target_exists(p.target):
            if p.engine in ("spark", "dagster-spark"):
                spark_environment()
            crash = fault if fault in CRASH_POINTS else None
            first = self._watermark_run(pipeline, fail_after=0 if fault == "sink" else None, crash=crash)
        gone = self._evict(p, extra)
        after = "failed-try" if first is not None and not first.ok else "idle"
        STATS[f"evicted:{'gone' if gone else 'none'}:{after}"] += 1
        if retry and first is not None and not first.ok:
            self._watermark_run(pipeline)

    def _evict(self, p: PipelineModel, extra: int) -> bool:
        """Filler until `p`'s newest record is gone (none: `extra` segments only); True if it had one."""
        self._observe_records(force=True)
        had = p.has_record
        name = self.model.targets[p.target].name
        for _ in range(MAX_FILL if had else 0):
            self.ops.fill_runs(1)
            if not self.ops.record_kept(p.consumer, name):
                break
        self.ops.fill_runs(extra)
        self._observe_records(force=True)
        if had and not p.evicted:
            STATS["evicted:record-survived"] += 1
        return had
