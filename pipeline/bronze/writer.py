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
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline import delta
from pipeline.bronze.transforms import bronze_batch
from pipeline.source import (
    DEFAULT_MAX_RECORDS_PER_PARTITION,
    LandingRange,
    Offsets,
    read_range,
    register,
    split_ranges,
)
from pipeline.streaming import await_query, offset_log_sources
from receivers.landing import LandingLog
from schemas.tables import BRONZE, LANDING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)

# ``arrow``: the driver writes each micro-batch's landing ranges straight to
# Parquet with pyarrow (no row conversion in the JVM); ``spark``: the rows go
# through the DataFrame and Spark's Parquet writer (``delta.append_batch``).
WRITERS = ("arrow", "spark")
# Default safety margin of the jobs' landing-log retention: records kept
# behind the committed offset. Correctness needs none (a segment goes only
# once the query has committed past it, and never at or past the partition's
# settle marker); the margin keeps the last few segments for inspection.
# Records, not bytes: 1,000 'i' messages of a 5,000-queue agent are ~18 MB.
RETENTION_SLACK = 1_000
# Columns whose Parquet statistics would be large and useless (bodies).
NO_STATS_COLUMNS = ("body",)
# All-distinct columns: a Parquet dictionary would be built and then dropped.
UNIQUE_COLUMNS = ("msg_key", "message_id", "correlation_id", "body")
ROW_GROUP_ROWS = 1 << 20


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
    writer: str = "arrow"

    def __post_init__(self) -> None:
        trigger_kwargs(self.trigger)  # validate early
        if self.writer not in WRITERS:
            raise ValueError(f"writer {self.writer!r}: expected one of {', '.join(WRITERS)}")

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


def trigger_kwargs(trigger: str) -> dict[str, bool | str]:
    """``availableNow`` -> ``{"availableNow": True}``; ``processingTime=5 seconds`` -> that."""
    if trigger == "availableNow":
        return {"availableNow": True}
    name, sep, value = trigger.partition("=")
    if name == "processingTime" and sep and value.strip():
        return {"processingTime": value.strip()}
    raise ValueError(f"trigger {trigger!r}: expected availableNow or processingTime=<interval>")


def checkpoint_query_id(checkpoint: str) -> str:
    """The query id Spark stores in ``<checkpoint>/metadata`` (exists once the query started)."""
    with open(os.path.join(checkpoint, "metadata"), encoding="utf-8") as f:
        return str(json.loads(f.readline())["id"])


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
            return
        if self.settings.writer == "arrow":
            ranges = batch_ranges(self.settings, batch_id)
            if ranges is not None:
                result = write_ranges_arrow(
                    ranges, self.settings.table, app_id=self.app_id, batch_id=batch_id
                )
                log.info("bronze batch %d (arrow): %s", batch_id, result)
                return
            log.info("bronze batch %d: ranges unknown, written through Spark", batch_id)
        rows = bronze_batch(df, batch_id)
        result = delta.append_batch(
            rows,
            self.settings.table,
            app_id=self.app_id,
            batch_id=batch_id,
            writer_options=delta.UNIQUE_COLUMNS_OPTIONS,
        )
        log.info("bronze batch %d: %s", batch_id, result)


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


def _bronze_batches(rng: LandingRange, batch_id: int) -> Iterator[pa.RecordBatch]:
    """Bronze rows of one landing range: matched redeliveries left out, ``batch_id`` added."""
    for b in read_range(rng, LANDING):
        keep = b.filter(pc.is_null(b.column("duplicate_of")))
        if keep.num_rows == 0:
            continue
        cols = [keep.column(f.name) for f in BRONZE if f.name != "batch_id"]
        cols.append(pa.array(np.full(keep.num_rows, batch_id, dtype=np.int64)))
        yield pa.RecordBatch.from_arrays(cols, schema=BRONZE)


def _file_name(rng: LandingRange, batch_id: int) -> str:
    rel = f"part-{batch_id:06d}-{rng.partition}-{rng.start}-{uuid.uuid4().hex[:12]}.parquet"
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in rel)


def _write_range(rng: LandingRange, full: str, batch_id: int) -> int:
    """One Parquet file at ``full`` for one landing range; returns its rows (no file if 0)."""
    rows = 0
    writer: pq.ParquetWriter | None = None
    try:
        for b in _bronze_batches(rng, batch_id):
            if writer is None:
                writer = pq.ParquetWriter(
                    full,
                    BRONZE,
                    compression="snappy",
                    use_dictionary=[f.name for f in BRONZE if f.name not in UNIQUE_COLUMNS],
                    write_statistics=[f.name for f in BRONZE if f.name not in NO_STATS_COLUMNS],
                )
            writer.write_batch(b, row_group_size=ROW_GROUP_ROWS)
            rows += b.num_rows
    finally:
        if writer is not None:
            writer.close()
    return rows


def write_ranges_arrow(
    ranges: list[LandingRange], table: str, *, app_id: str, batch_id: int
) -> delta.CommitResult:
    """Write ``ranges`` as bronze Parquet files (pyarrow, one thread per core) and commit once.

    The JVM never sees the rows: Arrow slices of the memory-mapped segments
    go to Parquet. Files land in the table folder under fresh names and are
    invisible until the commit; a failure removes them.
    """
    root = os.path.abspath(table)
    names = [_file_name(r, batch_id) for r in ranges]
    committed = False
    try:
        workers = max(1, min(len(ranges), os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=workers) as ex:
            counts = list(
                ex.map(lambda rn: _write_range(rn[0], os.path.join(root, rn[1]), batch_id),
                       zip(ranges, names, strict=True))
            )  # fmt: skip
        files: list[tuple[str, Mapping[str, str | None]]] = [
            (rel, {}) for rel, n in zip(names, counts, strict=True) if n > 0
        ]
        result = delta.commit_files(
            root, files, app_id=app_id, batch_id=batch_id, operation="append"
        )
        committed = not result.skipped
        return result
    finally:
        if not committed:
            for rel in names:
                try:
                    os.remove(os.path.join(root, rel))
                except FileNotFoundError:
                    pass


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
    return (
        reader.load()
        .writeStream.queryName(settings.query_name)
        .foreachBatch(BronzeBatchWriter(settings))
        .option("checkpointLocation", settings.checkpoint)
        .trigger(**trigger_kwargs(settings.trigger))  # type: ignore[arg-type]
        .start()
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
