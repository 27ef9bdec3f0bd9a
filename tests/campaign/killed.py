"""Real process deaths and pauses: `run_killed` runs a consumer's watermark run in a process of its
own (`kill_job.py`), holds it at a point and sends it SIGKILL, or SIGSTOP past its lease's
heartbeats while the next run takes the name over, then SIGCONT.

Why a process: the in-process `Crash` of faults.py unwinds through every `finally` (the lease is
released, connections say goodbye); a SIGKILL leaves the broker to notice a dead TCP connection,
and a SIGSTOP leaves it holding a live one that stops answering. The lease must be handed on in
both cases, and the paused run, once it runs again, must begin no batch and commit nothing
(invariant b), as tests/e2e/faults/test_lease_handover.py checks on one stream.

Model: the killed try is a planned try that failed (`Killed`, a `Crash`: a resumed retry reads the
range it planned); a function sink's rows are what it flushed to its file before it died. Each kill
costs a Python process with Airflow imported (seconds), a pause a few heartbeats more: both are off
in the in-suite budget (config.SUITE) and on in `make campaign`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import rule

from tests.campaign.faults import CRASH_POINTS, Crash, lease_wait
from tests.campaign.harness import AIRFLOW_PIPELINES, STATS
from tests.campaign.invariants import Violation, check_failure
from tests.campaign.model import PipelineModel
from tests.campaign.retention_time import RetentionAndTimeRules
from tests.campaign.runs import Attempt
from tests.support.broker import REPO

KILL_POINTS = ("sink:0", "sink:1", *CRASH_POINTS)
READY_TIMEOUT_S = 120.0
HEARTBEAT_S = 2  # the paused process's heartbeat (rmqs asks for 60 s: the same, after minutes)
TAKEOVER_WAIT_S = 20.0  # how long the next run waits for the paused one's lease


class Killed(Crash):
    """The run's process got SIGKILL (nothing in it reported a commit state: the campaign's own)."""

    commit_state = "unknown"


class ProcessError(Exception):
    """What the run in the process raised: `cause` its class (rmqs's errors are read from the message
    `<Class>: ...`, as `classify` reads them)."""

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(f"{cause}: {message.split(': ', 1)[-1] if message.startswith(cause) else message}")
        self.cause = cause


class Job:
    """One `kill_job` process and the files it talks through."""

    def __init__(self, tmp: Path, cfg: dict[str, Any]) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.ready, self.go, self.rows = tmp / "ready", tmp / "go", tmp / "rows"
        self.stdout, self.stderr = tmp / "stdout", tmp / "stderr"
        cfg = {**cfg, "ready": str(self.ready), "go": str(self.go), "rows": str(self.rows)}
        with self.stdout.open("w") as out, self.stderr.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.campaign.kill_job", json.dumps(cfg)],
                cwd=REPO,
                stdout=out,
                stderr=err,
            )

    def wait_ready(self) -> bool:
        """True when the run reached its point; False when it ended first."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self.ready.exists() and self.proc.poll() is None:
            if time.monotonic() > deadline:
                self.stop()
                raise Violation("d", f"a run in a process never reached its point: {self.tail()}")
            time.sleep(0.02)
        return self.ready.exists()

    def result(self, timeout: float = 120.0) -> dict[str, Any]:
        """Its last JSON line, once it ended by itself."""
        self.proc.wait(timeout)
        for line in reversed(self.stdout.read_text().splitlines()):
            if line.startswith("{"):
                return dict(json.loads(line))
        raise Violation(
            "d", f"a run in a process died without a result ({self.proc.returncode}): {self.tail()}"
        )

    def tail(self) -> str:
        return self.stderr.read_text()[-1500:] if self.stderr.exists() else ""

    def rows_flushed(self) -> list[tuple[bytes, str, int]]:
        """What its function sink persisted (a line cut by the kill is not)."""
        out: list[tuple[bytes, str, int]] = []
        if not self.rows.exists():
            return out
        for line in self.rows.read_text().splitlines():
            parts = line.split(" ")
            if len(parts) == 3 and parts[2].isdigit():
                out.append((bytes.fromhex(parts[0]), parts[1], int(parts[2])))
        return out

    def stop(self) -> None:
        """SIGKILL (a paused process is continued first, so it dies now)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(30)


def attempt_of(kind: str, started_seq: int, result: dict[str, Any]) -> Attempt:
    """An `Attempt` from the process's result line."""
    attempt = Attempt(kind, started_seq)
    if "summary" in result:
        attempt.summary = dict(result["summary"])
    else:
        attempt.error = ProcessError(str(result.get("error")), str(result.get("message", "")))
    return attempt


class KilledRules(RetentionAndTimeRules):
    """`run_killed` (see the module docstring)."""

    @rule(
        pipeline=st.sampled_from(AIRFLOW_PIPELINES),
        point=st.sampled_from(KILL_POINTS),
        how=st.sampled_from(("kill", "kill", "stop")),
        retry=st.booleans(),
    )
    def run_killed(self, pipeline: str, point: str, how: str, retry: bool) -> None:
        """A watermark run in its own process, held at `point`: SIGKILL (then, with `retry`, the run
        again in process), or SIGSTOP while the next run takes the lease over, then SIGCONT."""
        if not self._step("run_killed"):
            return
        p = self.model.pipelines[pipeline]
        if not self.model.target_exists(p.target) or not self._may_run(p):
            return self._skip("killed-not-applicable")
        self._before_run(p)
        t = self._target(p)
        output = self._output(p)
        cfg = {
            "target": t.name,
            "superstream": t.superstream,
            "consumer": p.consumer,
            "starting": p.starting,
            "output": None if output is None else str(output),
            "point": point,
            "heartbeat_s": HEARTBEAT_S if how == "stop" else 60,
        }
        started = self.model.seq
        job = Job(self.tmp / f"job-{STATS['rule:run_killed']}", cfg)
        try:
            if not job.wait_ready():  # the point was never reached: the run ended by itself
                result = job.result()
                self.rows[p.key].extend(job.rows_flushed())
                self._settle(p, attempt_of("watermark", started, result), None)
                STATS["killed:ended-first"] += 1
                return
            if how == "kill":
                job.stop()
                self.rows[p.key].extend(job.rows_flushed())
                STATS[f"killed:{point}"] += 1
                died = Attempt("watermark", started, error=Killed(f"SIGKILL at {point}"))
                self._settle(p, died, Killed, point)
                if retry:
                    self._watermark_run(pipeline)
                return
            self._paused(p, job, started, point)
        finally:
            job.stop()

    def _paused(self, p: PipelineModel, job: Job, started: int, point: str) -> None:
        """SIGSTOP at `point`; the next run takes the name once the broker missed the paused one's
        heartbeats; SIGCONT: the paused run must stop before its next batch and commit nothing."""
        os.kill(job.proc.pid, signal.SIGSTOP)
        # For the model the paused try planned and has not finished: a resumed run reads its range.
        self._settle(p, Attempt("watermark", started, error=Killed(f"SIGSTOP at {point}")), Killed, point)
        with lease_wait(TAKEOVER_WAIT_S):
            took = self._watermark_run(p.key)
        STATS[f"paused:{point}:next:{'none' if took is None else took.label}"] += 1
        os.kill(job.proc.pid, signal.SIGCONT)
        time.sleep(0.5)  # it sees its connections closed (else the fence before its commit stops it)
        job.go.touch()
        result = job.result()
        self.rows[p.key].extend(job.rows_flushed())
        late = attempt_of("watermark", started, result)
        STATS[f"paused:{point}:resumed:{late.label}"] += 1
        check_failure(p, late, None)  # (d): a typed error (LeaseLostError: its lease was taken over)
        if took is None or not took.ok:
            return
        if result.get("after_go"):
            raise Violation(
                "b",
                f"a run of {p.key} paused at {point} began {result['after_go']} batch(es) after it ran "
                f"again, its lease taken over and its range delivered by the next run ({late.describe()})",
            )
        if point.startswith("sink:") and late.ok:
            raise Violation(
                "b",
                f"a run of {p.key} paused at {point} succeeded after the next run took its lease and "
                f"delivered its range: {late.describe()}",
            )
        self.dirty.add(p.key)
