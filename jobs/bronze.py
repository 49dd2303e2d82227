"""spark-submit entry point: landing log -> bronze Delta table.

    spark-submit jobs/bronze.py --landing L --table T --checkpoint C [--trigger availableNow]

Only argument wiring lives here; the logic is in ``pipeline.bronze``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pipeline.bronze import (
    DRIVER_MAX_BYTES,
    RETENTION_SLACK,
    WRITERS,
    BronzeSettings,
    run_bronze,
)
from pipeline.commands.maintain import add_job_arguments, job_maintenance
from pipeline.lake.retention import RetentionError
from pipeline.runtime.jobrun import run_job, setup_logging, trigger_arg


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    return key, value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bronze", description=__doc__.splitlines()[0])
    p.add_argument("--landing", required=True, help="landing log root")
    p.add_argument("--table", required=True, help="bronze Delta table path")
    p.add_argument("--checkpoint", required=True, help="streaming checkpoint folder")
    p.add_argument("--trigger", type=trigger_arg, default="availableNow",
                   help="availableNow (default) or processingTime=<interval>")
    p.add_argument("--max-records-per-trigger", type=int, default=None)
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds: run time for processingTime, upper bound for availableNow")
    p.add_argument("--retention", choices=("none", "committed"), default="committed",
                   help="delete landing segments once committed to bronze (default; "
                        "none if other queries read the same landing log)")
    p.add_argument("--retention-slack", type=int, default=RETENTION_SLACK,
                   help=f"records kept behind the committed offset ({RETENTION_SLACK})")
    p.add_argument("--writer", choices=WRITERS, default="auto",
                   help="tasks: Spark tasks write the landing ranges with pyarrow, the driver "
                        "commits; arrow: driver threads write them (no Spark job); auto "
                        "(default): arrow up to --driver-max-bytes of landing per batch, else "
                        "tasks; spark: the rows go through Spark's Parquet writer")
    p.add_argument("--driver-max-bytes", type=int, default=DRIVER_MAX_BYTES, metavar="BYTES",
                   help="auto: largest batch (bytes of landing segments) written on the driver")
    p.add_argument("--embedded-receiver", action="store_true",
                   help="run a receiver inside the source (single-machine default)")
    p.add_argument("--receiver-option", type=_key_value, action="append", default=[],
                   metavar="KEY=VALUE", help="receiver.* option, e.g. url=amqp://...")
    add_job_arguments(p)
    return p  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    try:
        maintenance = job_maintenance(args)
    except (RetentionError, ValueError) as exc:
        print(f"bronze: {exc}", file=sys.stderr)
        return 2
    settings = BronzeSettings(
        landing=args.landing,
        table=args.table,
        checkpoint=args.checkpoint,
        trigger=args.trigger,
        max_records_per_trigger=args.max_records_per_trigger,
        retention=args.retention,
        retention_slack=args.retention_slack,
        embedded_receiver=args.embedded_receiver,
        receiver_options=dict(args.receiver_option),
        writer=args.writer,
        driver_max_bytes=args.driver_max_bytes,
        maintenance=maintenance,
    )
    return run_job("qmf-bronze", lambda spark, stop: run_bronze(spark, settings, args.timeout, stop))


if __name__ == "__main__":
    sys.exit(main())
