"""`python -m tests.campaign`: the campaign with a random seed for a time budget (`make campaign`).

Runs batches of sequences, each batch under its own seed drawn from the master seed, until
`--seconds` (CAMPAIGN_SECONDS, default 600) have passed or a violation is found. Prints the master
and batch seeds, the sequences and steps run, how often each rule and outcome occurred, and on a
violation hypothesis's shrunk failing sequence (the calls to replay in test_regressions.py).
Hypothesis's example database is off: a batch is reproduced from its seed alone
(`--seed <batch seed> --batches 1`), as far as the broker's timing allows.

Known bugs still open are stepped around with `--avoid` / CAMPAIGN_AVOID (names in config.py),
operations switched off with `--disable` / CAMPAIGN_DISABLE; `--outputs` / CAMPAIGN_OUTPUTS puts the
Airflow exactly-once consumers in moto's S3 (`s3`), in local folders (`local`) or, by default, one or the
other by batch seed (`alternate`).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import traceback
from dataclasses import replace

from tests.campaign.env import prepare_airflow, quiet

prepare_airflow()

from hypothesis import HealthCheck, Phase, seed, settings  # noqa: E402
from hypothesis.stateful import run_state_machine_as_test  # noqa: E402

from pyspark_rmqs.runs.record import RUNS_STREAM  # noqa: E402
from tests.campaign import faults, harness  # noqa: E402
from tests.campaign import machine as campaign  # noqa: E402
from tests.campaign.broker_ops import BrokerOps  # noqa: E402
from tests.campaign.config import AVOIDABLE, OPERATIONS, CampaignConfig  # noqa: E402
from tests.support.broker import RESTARTABLE, ensure_restartable_broker, settings_from_env  # noqa: E402


def campaign_settings(examples: int, steps: int, *, shrink: bool = True) -> settings:
    """Hypothesis settings shared by the runner and the in-suite test: no database, no deadline."""
    phases = [Phase.explicit, Phase.generate, *([Phase.shrink] if shrink else [])]
    return settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        phases=phases,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )


def report(started: float, master: int, batches: list[int]) -> None:
    stats = harness.STATS
    print(f"\ncampaign: master seed {master}; batch seeds {batches}")
    print(
        f"campaign: {stats['sequences']} sequences, {stats['steps']} steps, {stats['messages']} messages, "
        f"{stats['final_checks']} final checks in {time.monotonic() - started:.0f} s"
    )
    for prefix in (
        "rule",
        "outcome",
        "concurrent",
        "killed",
        "paused",
        "restarted_run",
        "clock_skew",
        "produce",
        "sensor",
        "drain_refused",
        "drain_killed",
        "drain_sink_failing",
        "spark_publish",
        "evicted",
        "noop",
        "avoided",
        "disabled",
    ):
        found = sorted((k, v) for k, v in stats.items() if k.startswith(prefix + ":"))
        if found:
            print(f"campaign: {prefix}s: " + ", ".join(f"{k.split(':', 1)[1]}={v}" for k, v in found))
    if faults.COMPACTION_STOPS:  # in-process `in_compaction` crashes, by the mutation stopped before
        stops = sorted(faults.COMPACTION_STOPS.items())
        print("campaign: compaction stops (mutation=count): " + ", ".join(f"{k}={v}" for k, v in stops))
    seconds = sorted(harness.SECONDS.items(), key=lambda kv: -kv[1])
    print("campaign: seconds per rule: " + ", ".join(f"{k}={v:.0f}" for k, v in seconds))
    for key in (
        "lease_connections_closed",
        "data_loss_reported",
        "truncated_messages",
        "lost_owed",
        "data_loss_messages_excused",
        "time_open_refused",
        "data_loss_false_alarm",
        "broker_restarts",
        "broker_restarts_mid_run",
        "broker_restart_seconds",
        "drain_generations",
        "records_evicted",
        "evicted_loss_unreported",
    ):
        if stats[key]:
            print(f"campaign: {key}: {stats[key]}")
    for alarm in harness.FALSE_ALARMS[:5]:
        print(f"campaign: a loss reported that the consumer did not suffer: {alarm}")


def run_batches(
    args: argparse.Namespace, config: CampaignConfig, rng: random.Random, started: float, batches: list[int]
) -> int:
    """Batches of sequences until the time budget or `--batches` ran out (the batch seeds are appended
    to `batches`); how many batches failed."""
    failures = 0
    while time.monotonic() - started < args.seconds and (args.batches is None or len(batches) < args.batches):
        # Odd and even batch seeds alternate: `--outputs alternate` writes S3 in every other batch
        # (CampaignConfig.for_batch reads the seed's parity, so a batch replays with its own choice).
        drawn = rng.randrange(2**31) * 2 + (len(batches) + 1) % 2  # the first batch on S3
        batch = args.seed if args.seed is not None and not batches else drawn
        batches.append(batch)
        batch_config = config.for_batch(batch)
        machine = seed(batch)(campaign.machine_with(batch_config))
        print(f"campaign: batch {len(batches)} seed {batch} (outputs: {batch_config.outputs})", flush=True)
        seen = len(harness.FAILURES)
        try:
            run_state_machine_as_test(
                machine, settings=campaign_settings(args.examples, args.steps, shrink=not args.no_shrink)
            )
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt):
                raise
            failures += 1
            print(f"\ncampaign: VIOLATION in batch seed {batch}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exception(e, limit=-3)
            if harness.FAILURES[seen:]:  # as it happened first (hypothesis replays may differ)
                trail, error = harness.FAILURES[seen]
                print(f"campaign: first failure in this batch: {error}\n" + "\n".join(trail), flush=True)
            if not args.keep_going:
                break
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.campaign", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("CAMPAIGN_SECONDS", 600)))
    parser.add_argument("--seed", type=int, default=None, help="master seed (default: random)")
    parser.add_argument("--batches", type=int, default=None, help="stop after this many batches")
    parser.add_argument("--examples", type=int, default=5, help="sequences per batch")
    parser.add_argument("--steps", type=int, default=int(os.environ.get("CAMPAIGN_STEPS", 40)))
    bugs = ", ".join(AVOIDABLE)
    parser.add_argument("--avoid", default="", help=f"known bugs to step around: {bugs}, all")
    parser.add_argument("--disable", default="", help=f"operations to switch off: {', '.join(OPERATIONS)}")
    parser.add_argument(
        "--outputs",
        default=os.environ.get("CAMPAIGN_OUTPUTS", "alternate"),
        help="where the Airflow exactly-once consumers write: local, s3 (moto), alternate (by batch seed)",
    )
    parser.add_argument(
        "--broker",
        default=os.environ.get("CAMPAIGN_BROKER", "restartable"),
        help="shared (the suite's broker, never restarted) or restartable (the second local one: "
        "broker_restart restarts it; the default)",
    )
    parser.add_argument("--no-shrink", action="store_true", help="report the failing sequence unshrunk")
    parser.add_argument("--keep-going", action="store_true", help="go on with the next batch after a failure")
    args = parser.parse_args(argv)
    for var, value in (("CAMPAIGN_AVOID", args.avoid), ("CAMPAIGN_DISABLE", args.disable)):
        if value:
            os.environ[var] = ",".join(x for x in (os.environ.get(var, ""), value) if x)
    os.environ["CAMPAIGN_OUTPUTS"] = args.outputs
    if args.broker == "restartable" and settings_from_env().external:
        args.broker = "shared"  # RMQS_TEST_URI: a broker the campaign must not restart
    os.environ["CAMPAIGN_BROKER"] = args.broker
    config = CampaignConfig.from_env()
    if args.broker == "restartable":
        ensure_restartable_broker()
        if config.enabled("evict_records"):  # the campaign's own, small rmqs.runs (broker_ops)
            BrokerOps(RESTARTABLE).recreate_runs_stream()
            config = replace(config, evictable_records=True)
    quiet()
    master = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    rng = random.Random(master)
    print(
        f"campaign: master seed {master}, {args.seconds:.0f} s, {args.examples} sequences of up to "
        f"{args.steps} steps per batch; avoiding {sorted(config.avoid) or 'nothing'}; "
        f"disabled {sorted(config.disabled) or 'nothing'}; broker: {config.broker}",
        flush=True,
    )
    started = time.monotonic()
    harness.PROGRESS.append(
        lambda steps, seconds: print(
            f"campaign:   sequence {harness.STATS['sequences']}: {steps} steps in {seconds:.1f} s "
            f"({time.monotonic() - started:.0f} s so far)",
            flush=True,
        )
    )
    batches: list[int] = []
    try:
        failures = run_batches(args, config, rng, started, batches)
    finally:
        if config.evictable_records:  # rmqs creates it again, with its own retention, on first use
            BrokerOps(RESTARTABLE).delete_stream(RUNS_STREAM)
    report(started, master, batches)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
