"""Broker restarts and pauses: `broker_restart` restarts the broker (a real process restart: every
connection closed, new ones refused for seconds, then "stream not available" until the streams are
back) between two steps, or from inside a run's sink at its first batch; `broker_pause` freezes it
(SIGSTOP, then SIGCONT: a starved or frozen node, its connections open but silent) for seconds while
a run goes on.

What must hold (docs/failure-semantics.md, "Broker restarts"): everything durable survives a
restart (streams, stored offsets, run records, leases taken back), and a run the restart or the
pause meets either finishes on its first try (its reader resubscribes at its next offset, it takes
its lease back) or fails typed and retryable; the invariants after the step and the final check
count every message either way.

The restart is of the broker the sequence runs on: the campaign's own (the suite's second local
broker, `tests.support.broker.RESTARTABLE`, `--broker restartable`, the runner's default), never the
broker other tests share: on `--broker shared` (the in-suite budget) the rule does nothing. A
restart costs 10-20 s: off in the in-suite budget (config.SUITE); so is a pause.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from tests.campaign.drain_rules import DrainRules
from tests.campaign.faults import Hooks
from tests.campaign.harness import PIPELINES, STATS
from tests.e2e.faults.support import broker_pids
from tests.support.broker import RESTARTABLE_ENV, broker_sh

# Seconds the broker stays frozen: shorter and longer than the client's probe timeout
# (`broker.client.PROBE_TIMEOUT_S`) and than a store's or a lease query's wait, far below the
# connections' heartbeat (60 s), so the connections stay open and silent.
PAUSE_SECONDS = (3.0, 12.0, 25.0)

RESTART_TIMEOUT_S = 300
# Restarts per sequence at most: each costs 10-20 s, and hypothesis's swarm of enabled rules can make
# a sequence mostly restarts; past this the rule is not drawn (a precondition), so no step is lost.
MAX_RESTARTS = 2


def restart_broker() -> float:
    """Restart the campaign's broker (down, then up); the seconds it took."""
    began = time.monotonic()
    done = broker_sh("restart", timeout=RESTART_TIMEOUT_S, env=RESTARTABLE_ENV)
    if done.returncode != 0:
        raise RuntimeError(f"the campaign's broker did not restart: {(done.stdout + done.stderr)[-1500:]}")
    return time.monotonic() - began


class Pause:
    """The campaign's broker frozen for `seconds` in a thread, from `start()` on; `join()` waits for
    SIGCONT (sent on every path: a broker left stopped would stall every later step)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.pids = broker_pids()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _signal(self, sig: int) -> None:
        for pid in self.pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def _run(self) -> None:
        self._signal(signal.SIGSTOP)
        try:
            time.sleep(self.seconds)
        finally:
            self._signal(signal.SIGCONT)

    def start(self) -> None:
        if not self.pids:
            raise RuntimeError("the campaign's broker has no process on this machine to pause")
        self.thread.start()

    def join(self) -> None:
        """Wait for the pause to end (nothing to wait for when the run reached no batch)."""
        if self.thread.ident is not None:
            self.thread.join(timeout=self.seconds + 60)
            self._signal(signal.SIGCONT)


class BrokerFaultRules(DrainRules):
    """`broker_restart` (see the module docstring)."""

    @precondition(
        lambda self: (
            self.config.broker == "restartable"
            and self.config.enabled("broker_restart")
            and self._ran("broker_restart") < MAX_RESTARTS
        )
    )
    # Mid-run first: hypothesis draws the first elements most often (and shrinks towards them).
    @rule(pipeline=st.sampled_from((*PIPELINES, None)))
    def broker_restart(self, pipeline: str | None) -> None:
        """Restart the broker between steps (`pipeline` None), or from inside a watermark run of
        `pipeline` at its first batch; the run goes on."""
        if not self._step("broker_restart"):
            return
        if self.config.broker != "restartable":
            return self._skip("broker-restart-on-a-shared-broker")
        if pipeline is None:
            STATS["broker_restarts"] += 1
            STATS["broker_restart_seconds"] += round(restart_broker())
            return
        p = self.model.pipelines[pipeline]
        if not self._may_run(p):
            return
        hooks = Hooks()

        def restart() -> None:
            STATS["broker_restarts_mid_run"] += 1
            STATS["broker_restart_seconds"] += round(restart_broker())

        hooks.late = restart  # called once, before the first batch reaches the sink
        if self.model.target_exists(p.target):
            self._publish(p.target, 5)  # new data: a batch for the restart to happen in
        attempt = self._attempt(p, hooks)
        STATS[f"restarted_run:{attempt.label}"] += 1
        self._settle(p, attempt, None)
        if not attempt.ok and attempt.retryable:  # as the orchestrator would: the retry
            self._settle(p, self._attempt(p, Hooks()), None)

    @precondition(
        lambda self: (
            self.config.broker == "restartable"
            and self.config.enabled("broker_pause")
            and self._ran("broker_pause") < MAX_RESTARTS
        )
    )
    @rule(pipeline=st.sampled_from(PIPELINES), seconds=st.sampled_from(PAUSE_SECONDS))
    def broker_pause(self, pipeline: str, seconds: float) -> None:
        """Freeze the broker for `seconds` from inside a watermark run of `pipeline`, at its first
        batch: the run goes on against a broker whose connections are open and silent (its reads,
        stores, lease checks and record writes wait or time out), then it wakes up."""
        if not self._step("broker_pause"):
            return
        if self.config.broker != "restartable":
            return self._skip("broker-pause-on-a-shared-broker")
        p = self.model.pipelines[pipeline]
        if not self._may_run(p):
            return
        pause = Pause(seconds)
        hooks = Hooks()
        hooks.late = pause.start  # the pause begins before the first batch reaches the sink
        if self.model.target_exists(p.target):
            self._publish(p.target, 5)  # new data: a batch for the pause to happen in
        try:
            attempt = self._attempt(p, hooks)
        finally:
            pause.join()
        paused = pause.thread.ident is not None  # not when the run reached no batch
        STATS[f"paused_run:{'paused' if paused else 'no-batch'}:{attempt.label}"] += 1
        STATS["broker_pause_seconds"] += round(seconds) if paused else 0
        self._settle(p, attempt, None)
        if not attempt.ok and attempt.retryable:  # as the orchestrator would: the retry
            self._settle(p, self._attempt(p, Hooks()), None)
