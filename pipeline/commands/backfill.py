"""``qmf backfill``: re-derive silver and gold for a time range from bronze (as jobs/backfill.py).

Spark's and the JVM's own output goes to a log file beside the gold folder
(``DATA/logs/spark-backfill-<time>.log``), its path printed once on stderr; the
backfill's report and our own log lines stay on the terminal. (``spark-submit
jobs/backfill.py`` keeps Spark's console: spark-submit owns that JVM.)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    from pipeline.backfill import add_arguments

    p = subparsers.add_parser(
        "backfill",
        help="re-derive silver and gold for a time range from bronze (idempotent)",
        description=__doc__,
    )
    add_arguments(p)
    p.add_argument(
        "--keep-spark", action="store_true", help=argparse.SUPPRESS
    )  # in-process callers (tests) keep their SparkSession
    p.set_defaults(func=backfill)


def log_file(gold: str, stamp: str | None = None) -> Path:
    """The Spark log of a backfill: ``logs/`` beside the gold folder (DATA/logs)."""
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    return Path(gold).resolve().parent / "logs" / f"spark-backfill-{stamp}.log"


def backfill(args: argparse.Namespace) -> int:
    from pipeline.backfill import run_from_args, settings_from_args

    if not args.keep_spark:
        try:
            settings = settings_from_args(args)
        except ValueError:
            settings = None  # run_from_args says what is wrong, before Spark starts
        if settings is not None:
            from pyspark.errors import PySparkRuntimeError

            from pipeline.runtime import sparklog
            from pipeline.spark import get_spark, spark_log

            log = log_file(settings.gold)
            try:
                get_spark("qmf-backfill", log_file=log)  # the session run_from_args gets
            except PySparkRuntimeError as exc:  # the JVM did not start: why is in its output
                sparklog.report_start_failure("qmf backfill", exc, log)
                return 1
            if spark_log() is not None:
                print(f"qmf backfill: Spark's and the JVM's own output: {spark_log()}",
                      file=sys.stderr, flush=True)  # fmt: skip
    return run_from_args(args, "qmf backfill", stop_spark=not args.keep_spark)
