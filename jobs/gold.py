"""spark-submit entry point: silver Delta tables -> gold Delta tables (rates, lifecycles, liveness).

    spark-submit jobs/gold.py --silver S --root G --checkpoint C [--trigger availableNow]
    spark-submit jobs/gold.py --silver S --root G --batch-id N [--from T0 --to T1]

The first form streams silver's samples and heartbeats (Delta's streaming source),
restartable from its checkpoint, exactly once; the second (backfill) runs
the same writer once over the silver tables, or a sample-time range, as gold
batch N of ``--app-id``. Only argument wiring lives here; the logic is in
``pipeline.gold``.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from pipeline.commands.maintain import add_job_arguments, job_maintenance
from pipeline.gold import DEFAULT_MAX_BYTES_PER_TRIGGER, GoldSettings, run_gold, run_gold_batch
from pipeline.gold.transforms import LivenessRules, RateRules
from pipeline.lake.retention import RetentionError
from pipeline.runtime.jobrun import (
    run_job,
    setup_logging,
    starting_version_arg,
    starting_versions,
    trigger_arg,
)
from receivers.fleet import fleet_intervals

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gold", description=__doc__.splitlines()[0])
    p.add_argument("--silver", required=True, help="folder of the silver tables")
    p.add_argument("--root", required=True, help="folder of the gold tables")
    p.add_argument("--registry", default=None, help="schema registry table (default SILVER/schema_registry)")
    p.add_argument("--checkpoint", default="", help="streaming checkpoint folder (stream mode)")
    p.add_argument("--trigger", type=trigger_arg, default="availableNow",
                   help="availableNow (default) or processingTime=<interval>")
    p.add_argument("--max-files-per-trigger", type=int, default=None)
    p.add_argument("--max-bytes-per-trigger", type=int, default=DEFAULT_MAX_BYTES_PER_TRIGGER,
                   metavar="BYTES",
                   help="silver file bytes per micro-batch and source (Delta's maxBytesPerTrigger; "
                        "0: no limit); the batch is read into the driver")  # fmt: skip
    p.add_argument("--starting-version", type=starting_version_arg, action="append",
                   metavar="TABLE=V",
                   help="a new checkpoint's first version of object_samples or heartbeats "
                        "(Delta's startingVersion)")  # fmt: skip
    p.add_argument("--read-through-spark", action="store_true",
                   help="collect each micro-batch through Spark instead of reading its silver "
                        "files on the driver")  # fmt: skip
    p.add_argument("--compute-on", choices=("auto", "tasks", "driver"), default="auto",
                   help="where a batch is computed: Spark tasks per bucket of agents (the driver "
                        "commits their files), the driver, or auto: the driver for batches of at "
                        "most --driver-max-bytes of silver files, tasks above")
    p.add_argument("--driver-max-bytes", type=int, default=4 << 20, metavar="BYTES",
                   help="auto: largest batch (silver file bytes) computed on the driver")
    p.add_argument("--buckets", type=int, default=None,
                   help="task path: buckets of agents (default: Spark's default parallelism)")
    p.add_argument("--rate-buckets", type=int, default=None, metavar="N",
                   help="task path: buckets of series of the rate stage, which pairs the rates "
                        "apart from the agent tasks so one big agent's rates spread too "
                        "(default: auto, as many as --buckets after a batch whose agents were "
                        "uneven over their buckets, else none; 0: no rate stage)")
    p.add_argument("--scratch", default=None, metavar="FOLDER",
                   help="task path: folder of a batch's intermediate files, shared by every "
                        "executor (default: inside the rates table; needed when --root is on "
                        "an object store)")
    p.add_argument("--keep-mib", type=int, default=512, metavar="MIB",
                   help="task path: MiB of the table files a Python worker's tasks wrote kept "
                        "in that worker for the next batch (0: read them back from storage)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds: run time for processingTime, upper bound for availableNow")
    p.add_argument("--min-interval", type=float, default=1.0, metavar="SECONDS",
                   help="shorter intervals are not made: the sample waits (the baseline stays) "
                        "until a later one or the series goes quiet")
    p.add_argument("--min-interval-jitter", type=float, default=0.1, metavar="SECONDS",
                   help="the agents' publish jitter: intervals down to --min-interval minus "
                        "this are kept")
    p.add_argument("--max-gap", type=float, default=300.0, metavar="SECONDS",
                   help="longer intervals of objects without a create time are resets "
                        "(reason gap)")
    p.add_argument("--state-ttl", type=float, default=86400.0, metavar="SECONDS",
                   help="series idle this long (sample time) leave the rate state")
    p.add_argument("--missed-heartbeats", type=int, default=3)
    p.add_argument("--v1-agent", default="1.0", help="agent that v1 heartbeats stand for")
    p.add_argument("--v1-interval", type=float, default=10.0, metavar="SECONDS",
                   help="v1 heartbeat interval (the broker's mgmt-pub-interval)")
    p.add_argument("--fleet", default=None, metavar="FILE",
                   help="the fleet file (qmf receive --config): each broker's "
                        "heartbeat_interval is its v1 agents' interval")
    p.add_argument("--batch-id", type=int, default=None,
                   help="batch mode: run over silver as this gold batch id")
    p.add_argument("--app-id", default="qmf-gold-batch", help="batch mode: the writer's app id")
    p.add_argument("--from", dest="t_from", type=datetime.fromisoformat, default=None)
    p.add_argument("--to", dest="t_to", type=datetime.fromisoformat, default=None)
    add_job_arguments(p)
    return p  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    if args.batch_id is None and not args.checkpoint:
        print("gold: stream mode needs --checkpoint (or give --batch-id)", file=sys.stderr)
        return 2
    try:
        maintenance = job_maintenance(args)
    except (RetentionError, ValueError) as exc:
        print(f"gold: {exc}", file=sys.stderr)
        return 2
    settings = GoldSettings(
        silver=args.silver,
        root=args.root,
        checkpoint=args.checkpoint,
        registry=args.registry,
        scratch=args.scratch,
        trigger=args.trigger,
        max_files_per_trigger=args.max_files_per_trigger,
        max_bytes_per_trigger=args.max_bytes_per_trigger or None,
        starting_versions=starting_versions(args.starting_version, ("object_samples", "heartbeats")),
        read_on_driver=not args.read_through_spark,
        compute_on=args.compute_on,
        driver_max_bytes=args.driver_max_bytes,
        buckets=args.buckets,
        rate_buckets=args.rate_buckets,
        keep_mib=args.keep_mib,
        rates=RateRules(args.min_interval, args.max_gap, args.state_ttl, args.min_interval_jitter),
        liveness=LivenessRules(args.missed_heartbeats, args.v1_agent, args.v1_interval,
                               fleet_intervals(args.fleet)),
        maintenance=maintenance,
    )

    def body(spark: SparkSession, stop: threading.Event) -> int:
        if args.batch_id is None:
            return run_gold(spark, settings, args.timeout, stop)
        span = None
        if args.t_from is not None or args.t_to is not None:
            span = (args.t_from or datetime.min, args.t_to or datetime.max)
        print(run_gold_batch(spark, settings, args.batch_id, app_id=args.app_id, sample_time=span))
        return 0

    return run_job("qmf-gold", body)


if __name__ == "__main__":
    sys.exit(main())
