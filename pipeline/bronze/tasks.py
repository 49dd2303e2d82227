"""Bronze's row work, in Spark tasks or on the driver: landing ranges -> Parquet data files.

A micro-batch of bronze is a set of landing ranges (``pipeline.source.LandingRange``:
offsets ``[start, end)`` of one landing partition, known from the offset log). The
driver plans (``plan_units``: the ranges cut and grouped into units of about
equal records, one per task), and each unit is written by ``write_unit``: it
reads its ranges from the landing log with pyarrow (memory-mapped segments),
drops matched redeliveries, writes one Parquet file into the bronze table's
folder under the batch's prefix (``pipeline.lake.delta.Stage``) and returns only its ``pipeline.lake.delta.DataFileInfo``.
The driver then commits every file of the batch in one Delta commit with the
app transaction (``pipeline.lake.delta.commit_staged``, in ``pipeline.bronze.writer``).

The same ``write_unit`` runs in one of two places, so both give the same rows:

* ``run_in_tasks``: one Spark task per unit through the RDD API
  (``parallelize(units).map(write_unit)``), so no row passes through the JVM
  and the work grows with the cluster; the landing log must be on storage
  every executor sees (docs/cluster.md);
* ``run_on_driver``: a thread pool on the driver (pyarrow releases the GIL), for
  the small batches of a live run, where a Spark job's fixed cost would be
  most of the time (``DRIVER_MAX_BYTES``).

The driver's work per batch is planning (offsets and segment sizes) and the
commit: it grows with units and files, not with rows.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.lake import delta, storage
from pipeline.runtime import taskworker
from pipeline.source import DEFAULT_MAX_RECORDS_PER_PARTITION, LandingRange, read_range
from receivers.landing import SEGMENT_RE
from schemas.tables import BRONZE, LANDING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# ``auto``: a micro-batch whose landing ranges hold at most this many bytes (of
# landing segments, Arrow IPC, uncompressed) is written on the driver, larger ones
# in Spark tasks. Below it the driver is done before a Spark job could be: on
# 2 cores (local[2]) an empty 2-task job costs 0.15-0.2 s, while the driver path
# wrote 17 MiB of incompressible 2 KB bodies in 0.08-0.14 s and 68 MiB in
# 0.15-0.32 s, so the crossover is near 32-64 MiB; with more executors the task
# path only gains above it. Live batches of ``qmf run`` (a publish interval of a
# 1,000-queue broker is a few MB) stay on the driver; catch-ups go to the tasks.
DRIVER_MAX_BYTES = 32 << 20
# Fewer records than this are not split over more tasks (a task and a file each).
MIN_UNIT_RECORDS = 10_000
# Columns whose Parquet statistics would be large and useless (bodies).
NO_STATS_COLUMNS = ("body",)
# All-distinct columns: a Parquet dictionary would be built and then dropped.
UNIQUE_COLUMNS = ("msg_key", "message_id", "correlation_id", "body")
ROW_GROUP_ROWS = 1 << 20


@dataclass(frozen=True)
class Unit:
    """What one task writes: landing ranges (plain values: it pickles to executors),
    all into one Parquet file."""

    ranges: tuple[LandingRange, ...]

    @property
    def records(self) -> int:
        return sum(r.end - r.start for r in self.ranges)


@dataclass(frozen=True)
class UnitPlan:
    """What every unit of one batch shares: where files go, the table's schema
    (checked in the task, so the driver never opens a footer), the batch id."""

    stage: str  # the batch's file-name prefix in the table folder (``delta.Stage``)
    schema: pa.Schema
    batch_id: int


def plan_units(
    ranges: Sequence[LandingRange],
    tasks: int,
    *,
    max_records: int = DEFAULT_MAX_RECORDS_PER_PARTITION,
    min_records: int = MIN_UNIT_RECORDS,
) -> list[Unit]:
    """The batch's ranges as about ``tasks`` units of equal records (in partition and
    offset order, deterministic).

    Offsets of a partition are contiguous, so a large range is cut anywhere
    (one busy receiver still feeds every core), and small ranges of several
    partitions share a unit (one file instead of many small ones). A unit
    holds at most ``max_records`` (a task's memory) and, unless the whole
    batch is smaller, at least about ``min_records`` (a task's fixed cost).
    """
    total = sum(max(r.end - r.start, 0) for r in ranges)
    if total == 0:
        return []
    n = max(1, min(tasks, -(-total // max(min_records, 1))))
    chunk = min(max(-(-total // n), 1), max(max_records, 1))
    units: list[Unit] = []
    current: list[LandingRange] = []
    room = chunk
    for r in sorted(ranges, key=lambda r: (r.partition, r.start)):
        lo = r.start
        while lo < r.end:
            hi = min(r.end, lo + room)
            current.append(LandingRange(r.root, r.partition, lo, hi))
            room -= hi - lo
            lo = hi
            if room == 0:
                units.append(Unit(tuple(current)))
                current, room = [], chunk
    if current:
        units.append(Unit(tuple(current)))
    return units


def landing_bytes(ranges: Sequence[LandingRange]) -> int:
    """Bytes of landing segments under ``ranges`` (a segment partly in a range counts
    pro rata by records): the driver's measure of a batch, from a directory listing."""
    by_partition: dict[tuple[str, str], list[LandingRange]] = {}
    for r in ranges:
        by_partition.setdefault((r.root, r.partition), []).append(r)
    total = 0.0
    for (root, partition), rs in by_partition.items():
        try:
            entries = list(os.scandir(os.path.join(root, partition)))
        except FileNotFoundError:
            continue
        for e in entries:
            m = SEGMENT_RE.match(e.name)
            if not m:
                continue
            first, last = int(m.group(1)), int(m.group(2))
            inside = sum(max(0, min(r.end, last + 1) - max(r.start, first)) for r in rs)
            if inside:
                total += e.stat().st_size * inside / (last - first + 1)
    return int(total)


def _bronze_batches(unit: Unit, batch_id: int) -> Iterator[pa.RecordBatch]:
    """Bronze rows of a unit: matched redeliveries left out, ``batch_id`` added."""
    for rng in unit.ranges:
        for b in read_range(rng, LANDING):
            keep = b.filter(pc.is_null(b.column("duplicate_of")))
            if keep.num_rows == 0:
                continue
            cols = [keep.column(f.name) for f in BRONZE if f.name != "batch_id"]
            cols.append(pa.array(np.full(keep.num_rows, batch_id, dtype=np.int64)))
            yield pa.RecordBatch.from_arrays(cols, schema=BRONZE)


def file_name(unit: Unit) -> str:
    """A fresh data file name after the stage's prefix: first partition and offset (for a
    reader of the folder), then a random token (never reused: a retried task's file
    never meets its first try's)."""
    first = unit.ranges[0]
    rel = f"{first.partition}-{first.start}-{uuid.uuid4().hex[:12]}.parquet"
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in rel)


def write_unit(unit: Unit, plan: UnitPlan) -> delta.DataFileInfo | None:
    """One Parquet file in the table folder for one unit, described for the commit
    (None if every row was a matched redelivery). A failed write removes its file;
    what a killed task leaves goes after the batch's commit (``delta.sweep_batch``)."""
    taskworker.settle()
    full = delta.staged_file(plan.stage, file_name(unit))
    writer: pq.ParquetWriter | None = None
    try:
        for b in _bronze_batches(unit, plan.batch_id):
            if writer is None:
                writer = storage.parquet_writer(
                    full,
                    BRONZE,
                    compression="snappy",
                    use_dictionary=[f.name for f in BRONZE if f.name not in UNIQUE_COLUMNS],
                    write_statistics=[f.name for f in BRONZE if f.name not in NO_STATS_COLUMNS],
                )
            writer.write_batch(b, row_group_size=ROW_GROUP_ROWS)
        if writer is None:
            return None
        writer.close()
        writer = None
        return delta.describe_file(full, plan.schema, table=delta.staged_table_root(plan.stage))
    except BaseException:
        if writer is not None:
            writer.close()
        storage.remove_files([full])
        raise


def run_on_driver(
    units: Sequence[Unit], plan: UnitPlan, threads: int | None = None
) -> list[delta.DataFileInfo]:
    """The units written here, one thread each up to ``threads`` (default: the cores)."""
    if not units:
        return []
    workers = max(1, min(len(units), threads or os.cpu_count() or 1))
    if workers == 1:
        got = [write_unit(u, plan) for u in units]
    else:
        with ThreadPoolExecutor(workers, thread_name_prefix="qmf-bronze") as pool:
            got = list(pool.map(lambda u: write_unit(u, plan), units))
    return [f for f in got if f is not None]


def run_in_tasks(
    spark: SparkSession, units: Sequence[Unit], plan: UnitPlan
) -> list[delta.DataFileInfo]:
    """One Spark task per unit (RDD API: the tasks read the landing log themselves and
    return only file descriptions, so no row passes through the JVM)."""
    if not units:
        return []
    rdd = spark.sparkContext.parallelize(list(units), len(units))
    got = rdd.map(lambda u: write_unit(u, plan)).collect()
    return [f for f in got if f is not None]
