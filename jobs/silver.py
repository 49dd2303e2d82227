"""spark-submit entry point: bronze Delta table -> silver Delta tables.

    spark-submit jobs/silver.py --bronze B --root R --checkpoint C [--trigger availableNow]
    spark-submit jobs/silver.py --bronze B --root R --batch-id N --bronze-batches LO:HI

The first form streams bronze's appends (Delta's streaming source), restartable
from its checkpoint; the second decodes a bronze range once (by bronze batch
ids, or ``--received-from/--received-to``) as silver batch N of app
``--app-id``, with the same writer. Only argument wiring lives here; the
logic is in ``pipeline.silver``.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from pipeline.commands.maintain import add_job_arguments, job_maintenance
from pipeline.lake.retention import RetentionError
from pipeline.runtime.jobrun import (
    run_job,
    setup_logging,
    starting_version_arg,
    starting_versions,
    trigger_arg,
)
from pipeline.silver import SilverSettings, run_silver, run_silver_batch
from pipeline.silver.settings import CALLS_DRIVER_MAX_ROWS, DRIVER_MAX_BYTES


def _range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    try:
        return int(lo), int(hi if sep else lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LO:HI") from None

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="silver", description=__doc__.splitlines()[0])
    p.add_argument("--bronze", required=True, help="bronze Delta table path")
    p.add_argument("--root", required=True, help="folder of the silver tables")
    p.add_argument("--registry", default=None, help="schema registry table (default ROOT/schema_registry)")
    p.add_argument("--kinds", default=None, help="statistic kinds TOML (default schemas/statistic_kinds.toml)")
    p.add_argument("--checkpoint", default="", help="streaming checkpoint folder (stream mode)")
    p.add_argument("--trigger", type=trigger_arg, default="availableNow",
                   help="availableNow (default) or processingTime=<interval>")
    p.add_argument("--max-files-per-trigger", type=int, default=None)
    p.add_argument("--starting-version", type=starting_version_arg, action="append", metavar="bronze=V",
                   help="a new checkpoint's first bronze version (Delta's startingVersion)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds: run time for processingTime, upper bound for availableNow")
    p.add_argument("--parked-max-age", type=float, default=3600.0, metavar="SECONDS",
                   help="report parked messages of keys waiting longer than this")
    p.add_argument("--decode-on", choices=("auto", "tasks", "driver", "spark"), default="auto",
                   help="where a micro-batch is decoded and written: Spark tasks (the driver "
                        "commits their files), the driver, or auto: the driver for batches of at "
                        "most --driver-max-bytes of bronze files, tasks above ('spark' = tasks)")
    p.add_argument("--driver-max-bytes", type=int, default=DRIVER_MAX_BYTES, metavar="BYTES",
                   help="auto: largest batch (bronze file bytes) decoded on the driver")
    p.add_argument("--calls-driver-max-rows", type=int, default=CALLS_DRIVER_MAX_ROWS, metavar="ROWS",
                   help="task path: v1 method-call halves plus waiting requests paired on the "
                        "driver up to this many, in Spark tasks by bucket above")
    p.add_argument("--schema-wants", default=None, metavar="DIR",
                   help="list the schemas parked messages wait for in DIR, for the receiver's "
                        "console (qmf receive --console --console-wants DIR)")
    p.add_argument("--batch-id", type=int, default=None,
                   help="batch mode: decode a bronze range as this silver batch id")
    p.add_argument("--app-id", default="qmf-silver-batch", help="batch mode: the writer's app id")
    p.add_argument("--bronze-batches", type=_range, default=None, metavar="LO:HI")
    p.add_argument("--received-from", type=datetime.fromisoformat, default=None)
    p.add_argument("--received-to", type=datetime.fromisoformat, default=None)
    add_job_arguments(p)
    return p  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    if args.batch_id is None and not args.checkpoint:
        print("silver: stream mode needs --checkpoint (or give --batch-id)", file=sys.stderr)
        return 2
    try:
        maintenance = job_maintenance(args)
    except (RetentionError, ValueError) as exc:
        print(f"silver: {exc}", file=sys.stderr)
        return 2
    extra = {} if args.kinds is None else {"kinds_file": args.kinds}
    settings = SilverSettings(
        bronze=args.bronze,
        root=args.root,
        checkpoint=args.checkpoint,
        registry=args.registry,
        trigger=args.trigger,
        max_files_per_trigger=args.max_files_per_trigger,
        starting_version=starting_versions(args.starting_version, ("bronze",)).get("bronze"),
        parked_max_age_s=args.parked_max_age,
        decode_on=args.decode_on,
        driver_max_bytes=args.driver_max_bytes,
        calls_driver_max_rows=args.calls_driver_max_rows,
        schema_wants=args.schema_wants,
        maintenance=maintenance,
        **extra,
    )
    def body(spark: SparkSession, stop: threading.Event) -> int:
        if args.batch_id is None:
            return run_silver(spark, settings, args.timeout, stop)
        received = None
        if args.received_from is not None or args.received_to is not None:
            received = (args.received_from or datetime.min, args.received_to or datetime.max)
        print(run_silver_batch(spark, settings, args.batch_id, app_id=args.app_id,
                               batch_ids=args.bronze_batches, received=received))  # fmt: skip
        return 0

    return run_job("qmf-silver", body)


if __name__ == "__main__":
    sys.exit(main())
