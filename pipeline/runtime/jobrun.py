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
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

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
    finally:
        spark.stop()
