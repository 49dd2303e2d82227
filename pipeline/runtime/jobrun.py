"""What every ``jobs/*.py`` entry point does around its own work, written once.

Logging, the trigger argument's check, a stop event that SIGTERM and SIGINT
set (a streaming job then ends its query cleanly instead of dying between a
Parquet write and its commit), the SparkSession (the master comes from
spark-submit, else local[2]) and its stop at the end.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

from pipeline import SetupError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JobBody = Callable[["SparkSession", threading.Event], int]


def trigger_arg(text: str) -> str:
    """argparse type of ``--trigger``: availableNow or processingTime=<interval>."""
    from pipeline.runtime.streaming import trigger_kwargs

    try:
        trigger_kwargs(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def starting_version_arg(text: str) -> tuple[str, int]:
    """argparse type of ``--starting-version TABLE=V``: Delta's ``startingVersion`` of one
    source table of a new checkpoint (what a refused old checkpoint's message names)."""
    name, sep, value = text.rpartition("=")
    try:
        version = int(value)
    except ValueError:
        version = -1
    if not sep or not name or version < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected TABLE=VERSION, VERSION >= 0")
    return name, version


def starting_versions(given: list[tuple[str, int]] | None, tables: tuple[str, ...]) -> dict[str, int]:
    """``--starting-version`` values by table, each one of ``tables`` and given once."""
    out: dict[str, int] = {}
    for name, version in given or []:
        if name not in tables:
            raise SystemExit(f"--starting-version {name}={version}: TABLE is one of {', '.join(tables)}")
        if name in out:
            raise SystemExit(f"--starting-version {name}: given twice")
        out[name] = version
    return out


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT (the run loops poll it and stop their query)."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


def run_job(app_name: str, body: JobBody) -> int:
    """Run ``body(spark, stop)`` in a SparkSession set up for the jobs; its exit code."""
    from pipeline.bronze import tune_shuffles
    from pipeline.spark import get_spark

    stop = stop_on_signals()
    spark = get_spark(app_name)
    tune_shuffles(spark)
    try:
        return body(spark, stop)
    except SetupError as exc:  # e.g. a checkpoint this release cannot resume: one clear line
        print(f"{app_name}: {exc}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
