"""The bronze stream: ``qmf`` source -> exactly-once Delta appends, one row per delivery.

Exactly once end to end comes from two mechanisms:

* replays of a micro-batch (Spark re-runs the last batch after a crash
  between the Delta commit and the checkpoint's commit) are skipped by the
  Delta app transaction ``(app_id, batch_id)``;
* redeliveries (a message landed again because its settlement did not reach
  the broker) are recognised by the receiver, which lands them with
  ``duplicate_of`` set (``receivers.indoubt``); bronze filters them out
  (``pipeline.bronze.transforms``). No batch reads the table, so the cost of a
  batch does not grow with it. One writer per bronze table.

``app_id`` is ``qmf-bronze-<query id>``, the id Spark keeps in the checkpoint:
stable across restarts of one query, new when the checkpoint is reset (whose
batch ids restart at 0 and must not be mistaken for replays).

Where the rows of a batch are written (``BronzeSettings.writer``): the driver
knows the batch's landing ranges from the offset log (``batch_ranges``), so
the rows never need to pass through Spark: Spark tasks (``tasks``, the path
that grows with the cluster) or driver threads (``arrow``, no Spark job for
small batches) write them with pyarrow straight into the table folder, and
the driver commits the files once (``pipeline.bronze.tasks``); ``auto`` picks
by the batch's landing bytes. A crash between the writes and the commit
leaves files no commit lists; the batch's replay removes them once it has
committed (``pipeline.lake.delta.sweep_batch``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pipeline.bronze import tasks
from pipeline.bronze.tasks import DRIVER_MAX_BYTES
from pipeline.bronze.transforms import bronze_batch
from pipeline.lake import delta, storage
from pipeline.lake.storage import require_local
from pipeline.runtime.streaming import await_query, offset_log_sources, start_gated, trigger_kwargs
from pipeline.source import (
    DEFAULT_MAX_RECORDS_PER_PARTITION,
    LandingRange,
    Offsets,
    register,
    split_ranges,
)
from receivers.landing import LandingLog
from schemas.tables import BRONZE

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from pipeline.lake.maintain import JobMaintenance

log = logging.getLogger(__name__)

# Where a micro-batch's rows are written (docs/DESIGN.md, Bronze):
# ``tasks``: one Spark task per unit of the batch's landing ranges writes a Parquet
# file into the table's staging folder and returns its description; the driver
# commits them (``pipeline.bronze.tasks``): the default path on a cluster.
# ``arrow``: the same files written by driver threads (no Spark job).
# ``auto`` (default): ``arrow`` up to ``driver_max_bytes`` of landing, else ``tasks``.
# ``spark``: the rows go through the DataFrame and Spark's Parquet writer
# (``delta.append_batch``), also the fallback when a batch's ranges are unknown.
WRITERS = ("auto", "tasks", "arrow", "spark")
# Default safety margin of the jobs' landing-log retention: records kept
# behind the committed offset. Correctness needs none (a segment goes only
# once the query has committed past it, and never at or past the partition's
# settle marker); the margin keeps the last few segments for inspection.
# Records, not bytes: 1,000 'i' messages of a 5,000-queue agent are ~18 MB.
RETENTION_SLACK = 1_000


@dataclass(frozen=True)
class BronzeSettings:
    """What a bronze run needs; ``trigger`` is ``availableNow`` or ``processingTime=<interval>``."""

    landing: str
    table: str
    checkpoint: str
    trigger: str = "availableNow"
    max_records_per_trigger: int | None = None
    retention: str = "none"
    retention_slack: int = 0
    embedded_receiver: bool = False
    receiver_options: Mapping[str, str] = field(default_factory=dict)
    query_name: str = "qmf_bronze"
    writer: str = "auto"
    driver_max_bytes: int = DRIVER_MAX_BYTES
    # ``--maintain-every``: the job maintains its table between its micro-batches.
    maintenance: JobMaintenance | None = None

    def __post_init__(self) -> None:
        # The table and the checkpoint may be on an object store (an ingest host
        # writing bronze to the lake); the landing log stays on the ingest host's disk.
        require_local(landing=self.landing)
        trigger_kwargs(self.trigger)  # validate early
        if self.writer not in WRITERS:
            raise ValueError(f"writer {self.writer!r}: expected one of {', '.join(WRITERS)}")
        if self.driver_max_bytes < 0:
            raise ValueError(f"driver_max_bytes {self.driver_max_bytes}: must be >= 0")

    def source_options(self) -> dict[str, str]:
        opts = {
            "path": self.landing,
            "retention": self.retention,
            "retentionSlack": str(self.retention_slack),
            "embeddedReceiver": str(self.embedded_receiver).lower(),
        }
        if self.max_records_per_trigger is not None:
            opts["maxRecordsPerTrigger"] = str(self.max_records_per_trigger)
        opts.update({f"receiver.{k}": v for k, v in self.receiver_options.items()})
        return opts


def checkpoint_query_id(checkpoint: str) -> str:
    """The query id Spark stores in ``<checkpoint>/metadata`` (exists once the query started)."""
    text = storage.read_text(storage.join(checkpoint, "metadata"))
    return str(json.loads(text.splitlines()[0])["id"])


class BronzeBatchWriter:
    """The ``foreachBatch`` function: one micro-batch -> one bronze commit (or none)."""

    def __init__(self, settings: BronzeSettings, app_id: str | None = None) -> None:
        self.settings = settings
        self._app_id = app_id

    @property
    def app_id(self) -> str:
        if self._app_id is None:
            self._app_id = f"qmf-bronze-{checkpoint_query_id(self.settings.checkpoint)}"
        return self._app_id

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        done = delta.committed_batch(self.settings.table, self.app_id)
        if done is not None and batch_id <= done:
            log.info("bronze batch %d already committed: skipped", batch_id)
            if batch_id == done:  # its committing attempt may have died before its sweep
                delta.sweep_committed_batch(self.settings.table, self.app_id, batch_id)
            return
        t0 = time.perf_counter()
        ranges = batch_ranges(self.settings, batch_id) if self.settings.writer != "spark" else None
        mode = choose_writer(self.settings, ranges)
        if ranges is None and self.settings.writer != "spark":
            log.info("bronze batch %d: ranges unknown, written through Spark", batch_id)
        if ranges is not None and mode == "tasks":
            result = write_ranges_tasks(
                df.sparkSession, ranges, self.settings.table, app_id=self.app_id, batch_id=batch_id
            )
        elif ranges is not None and mode == "arrow":
            result = write_ranges_arrow(
                ranges, self.settings.table, app_id=self.app_id, batch_id=batch_id
            )
        else:
            result = delta.append_batch(
                bronze_batch(df, batch_id),
                self.settings.table,
                app_id=self.app_id,
                batch_id=batch_id,
                writer_options=delta.UNIQUE_COLUMNS_OPTIONS,
            )
        log.info(
            "bronze batch %d (%s, %.2f s): %s", batch_id, mode, time.perf_counter() - t0, result
        )


def choose_writer(settings: BronzeSettings, ranges: list[LandingRange] | None) -> str:
    """Where a batch is written: ``settings.writer``, with ``auto`` resolved by the
    batch's landing bytes (``driver_max_bytes``), and ``spark`` whenever the
    ranges are unknown (the rows are then only in the DataFrame)."""
    if ranges is None:
        return "spark"
    if settings.writer != "auto":
        return settings.writer
    small = tasks.landing_bytes(ranges) <= settings.driver_max_bytes
    return "arrow" if small else "tasks"


def _offset_log_entry(checkpoint: str, batch_id: int) -> Offsets | None:
    """End offsets of ``batch_id`` as Spark logged them (the query's one source)."""
    sources = offset_log_sources(checkpoint, batch_id)
    if sources is None:
        return None
    parsed = json.loads(sources[0])
    return {str(k): int(v) for k, v in parsed.items()}


def batch_ranges(settings: BronzeSettings, batch_id: int) -> list[LandingRange] | None:
    """The landing ranges of micro-batch ``batch_id``, or None if they cannot be known.

    End: this batch's offset-log entry. Start: the previous entry (Spark keeps
    at least ``minBatchesToRetain`` of them); for batch 0 the source's initial
    offset, which for ``startingOffsets=earliest`` (bronze's only setting) is
    each partition's first offset on disk, exactly what the source's
    ``partitions()`` uses for a partition the query has not seen.
    """
    end = _offset_log_entry(settings.checkpoint, batch_id)
    if end is None:
        return None
    if batch_id == 0:
        start: Offsets = {}
    else:
        prev = _offset_log_entry(settings.checkpoint, batch_id - 1)
        if prev is None:
            return None
        start = prev
    first = LandingLog(settings.landing).start_offsets() if set(end) - set(start) else {}
    begin = {p: start[p] if p in start else first.get(p, 0) for p in end}
    return split_ranges(settings.landing, begin, end, DEFAULT_MAX_RECORDS_PER_PARTITION)


def _write_staged(
    ranges: list[LandingRange],
    table: str,
    *,
    app_id: str,
    batch_id: int,
    spark: SparkSession | None,
) -> delta.CommitResult:
    """Plan the units, write them (Spark tasks if ``spark``, else driver threads) into
    the table folder under one ``Stage``, commit all the files once."""
    root = storage.location(table)
    with delta.Stage(root, app_id, batch_id) as stage:
        plan = tasks.UnitPlan(stage.prefix, delta.table_schema(root), batch_id)
        if spark is None:
            units = tasks.plan_units(ranges, os.cpu_count() or 1)
            files = tasks.run_on_driver(units, plan)
        else:
            units = tasks.plan_units(ranges, spark.sparkContext.defaultParallelism)
            files = tasks.run_in_tasks(spark, units, plan)
        done = delta.commit_staged(root, files, app_id=app_id, batch_id=batch_id)
        stage.done = True
        return done


def write_ranges_arrow(
    ranges: list[LandingRange], table: str, *, app_id: str, batch_id: int
) -> delta.CommitResult:
    """The driver path: ``ranges`` written as bronze Parquet files by driver threads
    (pyarrow, one per core), committed once. No Spark job: for small batches."""
    return _write_staged(ranges, table, app_id=app_id, batch_id=batch_id, spark=None)


def write_ranges_tasks(
    spark: SparkSession, ranges: list[LandingRange], table: str, *, app_id: str, batch_id: int
) -> delta.CommitResult:
    """The task path: one Spark task per unit of ``ranges`` writes its Parquet file
    and returns its description; the driver commits them once. Throughput grows
    with the executors; the driver's work with the number of files."""
    return _write_staged(ranges, table, app_id=app_id, batch_id=batch_id, spark=spark)


def tune_shuffles(spark: SparkSession) -> None:
    """Few shuffle partitions unless the user chose: bronze only shuffles keys.

    Spark's default of 200 is pure task overhead on a few cores (a 600k-row
    profile on local[2]: 32.6 s with 4 partitions against 50.2 s with 200).
    """
    if spark.sparkContext.getConf().contains("spark.sql.shuffle.partitions"):
        return
    n = max(2, 2 * spark.sparkContext.defaultParallelism)
    spark.conf.set("spark.sql.shuffle.partitions", str(n))


def start_bronze(spark: SparkSession, settings: BronzeSettings) -> StreamingQuery:
    """Create the table if needed and start the streaming query."""
    register(spark)
    delta.create_table(settings.table, BRONZE, name="bronze")
    reader = spark.readStream.format("qmf")
    for k, v in settings.source_options().items():
        reader = reader.option(k, v)
    return start_gated(
        reader.load(),
        BronzeBatchWriter(settings),
        name=settings.query_name,
        checkpoint=settings.checkpoint,
        trigger=settings.trigger,
        maintenance=settings.maintenance,
        tables=lambda: [settings.table],
    )


def run_bronze(
    spark: SparkSession,
    settings: BronzeSettings,
    timeout_s: float | None,
    stop: threading.Event | None = None,
) -> int:
    """Run until AvailableNow drained the log, ``timeout_s`` passed, or ``stop`` is set.

    Returns 0 when the run ended as intended, 2 when AvailableNow did not
    finish in time, 1 when the query failed.
    """
    query = start_bronze(spark, settings)
    return await_query(
        query, "bronze", available_now=settings.trigger == "availableNow", timeout_s=timeout_s,
        stop=stop,
    )  # fmt: skip
