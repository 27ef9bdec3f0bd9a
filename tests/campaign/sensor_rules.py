"""The sensors that schedule the runs: `sensors` pokes Airflow's `RabbitMQStreamNewDataSensor` and
`RabbitMQStreamLagSensor` for a consumer, as a scheduler would between its runs, and for the
Dagster consumer (c5) ticks Dagster's new-data sensor of its asset (`build_new_data_sensor`) and its
observation sensor (`build_observation_sensor`: the lag it records), and runs its blocking lag check
(`build_lag_check(max_lag=0)`: it must fail).

What must hold: a consumer that still owes a readable message (published in a current stream
incarnation, not removed by retention, not in its output) has new data and lag. A new-data sensor
that does not fire then leaves the message unread for good (nothing schedules the run), and a lag
gate that opens lets downstream work go on without it: the "lag 0, nothing reported" shape of the
silent losses issue 42 lists. The other direction (a sensor firing for a consumer that owes
nothing) costs one empty run and is not checked: a sensor does not know where a `latest` consumer
that never ran would start.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import rule

from airflow_rmqs.sensors import RabbitMQStreamLagSensor, RabbitMQStreamNewDataSensor
from tests.campaign.dagster_rules import DagsterRules
from tests.campaign.harness import PIPELINES, STATS
from tests.campaign.invariants import Violation
from tests.campaign.runs import CONN_ID


class SensorRules(DagsterRules):
    """`sensors` (see the module docstring)."""

    @rule(pipeline=st.sampled_from(PIPELINES))
    def sensors(self, pipeline: str) -> None:
        """Poke the new-data and the lag sensor of `pipeline`'s consumer and target."""
        if not self._step("sensors"):
            return
        p = self.model.pipelines[pipeline]
        if not self.model.target_exists(p.target):
            return self._skip("sensors-missing")
        t = self._target(p)
        where = {"superstream": t.name} if t.superstream else {"stream": t.name}
        common: dict[str, Any] = {
            "consumer_name": p.consumer,
            "rabbitmq_stream_conn_id": CONN_ID,
            "deferrable": False,
            **where,
        }
        new_data = RabbitMQStreamNewDataSensor(task_id="campaign-new-data", **common).poke({})
        lag_gate = RabbitMQStreamLagSensor(task_id="campaign-lag", max_lag=0, **common).poke({})
        STATS[f"sensor:new_data={new_data.is_done}:lag_gate={lag_gate.is_done}"] += 1
        dagster_fired = observed_lag = lag_check = None
        if p.engine == "dagster":
            _, asset = self.dagster.asset(t, p, output=self.tmp / "unused")
            dagster_fired = self.dagster.new_data_requested(asset)
            STATS[f"sensor:dagster_new_data={dagster_fired}"] += 1
            observed_lag = self.dagster.observed_lag(asset)
            STATS[f"sensor:dagster_observed_lag={'none' if observed_lag is None else observed_lag > 0}"] += 1
            lag_check = self.dagster.lag_check_passes(asset)
            STATS[f"sensor:dagster_lag_check_passed={lag_check}"] += 1
        held = {body for body, _, _ in self._rows(p)}
        waiting = [
            m.body
            for m in self.model.expected(p)
            if m.body not in held and not self.model.truncated(m) and m.offset is not None
        ]
        if waiting and (
            not new_data.is_done
            or lag_gate.is_done
            or dagster_fired is False
            or observed_lag == 0
            or lag_check is True
        ):
            shown = [b.decode() for b in waiting[:5]]
            dagster = (
                ""
                if dagster_fired is None
                else f", Dagster's new-data sensor requested {dagster_fired}, its observation sensor "
                f"recorded a total lag of {observed_lag}, its lag check passed: {lag_check}"
            )
            raise Violation(
                "a",
                f"{p.key} owes {len(waiting)} readable message(s) ({shown}) not in its output, but the "
                f"new-data sensor {'fired' if new_data.is_done else 'did not fire'} and the lag gate "
                f"{'opened' if lag_gate.is_done else 'stayed closed'}{dagster}",
            )
