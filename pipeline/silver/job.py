"""Running silver: the stream over bronze, batch mode over a bronze range, and the
driver's read of a micro-batch from the query's offset log."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import TYPE_CHECKING

from pipeline.lake import delta
from pipeline.lake.maintain import layer_tables
from pipeline.runtime.streaming import await_query, refuse_old_checkpoint, start_gated
from pipeline.silver.settings import SilverSettings
from pipeline.silver.writer import BatchReport, SilverBatchWriter

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery


def bronze_range(
    spark: SparkSession,
    bronze: str,
    *,
    batch_ids: tuple[int, int] | None = None,
    received: tuple[datetime, datetime] | None = None,
) -> DataFrame:
    """Bronze rows of a batch-id range or a received_at range (both inclusive)."""
    from pyspark.sql import functions as F

    df = delta.read_table(spark, bronze)
    if batch_ids is not None:
        df = df.where(F.col("batch_id").between(batch_ids[0], batch_ids[1]))
    if received is not None:
        df = df.where(F.col("received_at").between(F.lit(received[0]), F.lit(received[1])))
    return df


def run_silver_batch(
    spark: SparkSession,
    settings: SilverSettings,
    batch_id: int,
    *,
    app_id: str = "qmf-silver-batch",
    batch_ids: tuple[int, int] | None = None,
    received: tuple[datetime, datetime] | None = None,
    writer: SilverBatchWriter | None = None,
) -> BatchReport:
    """Batch mode: decode a bronze range as silver batch ``batch_id`` of ``app_id``.

    The same writer as the stream, so results are identical; rerunning the
    same (app_id, batch_id) writes nothing twice.
    """
    w = writer or SilverBatchWriter(settings, app_id=app_id)
    w(bronze_range(spark, settings.bronze, batch_ids=batch_ids, received=received), batch_id)
    return w.reports[-1]


def start_silver(spark: SparkSession, settings: SilverSettings) -> StreamingQuery:
    """Start the streaming query over bronze (Delta's streaming source: the table's appends)."""
    refuse_old_checkpoint(settings.checkpoint, "silver", ["bronze"])
    writer = SilverBatchWriter(settings)
    reader = spark.readStream.format("delta").options(**settings.source_options())
    return start_gated(
        reader.load(settings.bronze),
        writer,
        name=settings.query_name,
        checkpoint=settings.checkpoint,
        trigger=settings.trigger,
        maintenance=settings.maintenance,
        tables=lambda: layer_tables(settings.root),
    )


def run_silver(
    spark: SparkSession,
    settings: SilverSettings,
    timeout_s: float | None,
    stop: threading.Event | None = None,
) -> int:
    """Run the stream until AvailableNow drained bronze, ``timeout_s`` passed, or ``stop``.

    0: ended as intended; 2: AvailableNow did not finish in time; 1: failed.
    """
    query = start_silver(spark, settings)
    return await_query(
        query, "silver", available_now=settings.trigger == "availableNow", timeout_s=timeout_s,
        stop=stop,
    )  # fmt: skip


