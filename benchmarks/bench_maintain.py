"""Files and a day's read time before and after maintenance, on a table of many small appends.

    .venv/bin/python benchmarks/bench_maintain.py [--commits 500] [--rows 200] [--repeats 2]

1. Builds a bronze table the way a streaming job does: ``--commits`` small
   commits (one pyarrow Parquet file each, committed with an app
   transaction as ``pipeline.lake.delta.commit_files`` does), ``--rows`` rows each, ``received_at`` spread over
   two days.
2. Times "a day's query" (the rows of one day, counted per routing key) with
   Spark (``pipeline.lake.delta.read_table``) and with pyarrow
   (``pipeline.lake.delta.read_arrow``), ``--repeats`` times each: the baseline.
3. Runs ``pipeline.lake.maintain.maintain_table`` (compaction + vacuum, retention 0:
   no stream reads the table) and times the same queries again.

Prints files, bytes and versions before/after, the maintenance time, the
median read times and the before/after ratios, and checks the day's answer
and the app transaction are unchanged.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.lake import delta  # noqa: E402
from pipeline.lake.maintain import MaintainSettings, maintain_table  # noqa: E402
from schemas.tables import BRONZE  # noqa: E402

DAY0 = datetime(2027, 1, 15, tzinfo=UTC)
APP = "bench-bronze"


def chunk(first: int, rows: int, start_us: int, step_us: int, batch_id: int) -> pa.Table:
    """``rows`` bronze rows: 300-byte bodies, 50 routing keys, times from ``start_us``."""
    rng = np.random.default_rng(first)
    offsets = np.arange(first, first + rows, dtype=np.int64)
    bodies = [rng.bytes(300) for _ in range(rows)]
    keys = [f"mgmt.console.obj.q{i % 50}" for i in offsets]
    cols: dict[str, pa.Array] = {
        "partition": pa.array(["0"] * rows, pa.string()),
        "offset": pa.array(offsets),
        "msg_key": pa.array([b.hex()[:32] for b in bodies], pa.string()),
        "received_at": pa.array(start_us + np.arange(rows) * step_us, pa.timestamp("us", "UTC")),
        "routing_key": pa.array(keys, pa.string()),
        "subject": pa.array(keys, pa.string()),
        "application_properties": pa.array(
            [[("qmf.opcode", "_data")]] * rows, pa.map_(pa.string(), pa.string())
        ),
        "body": pa.array(bodies, pa.binary()),
        "redelivered": pa.array([False] * rows),
        "batch_id": pa.array(np.full(rows, batch_id, dtype=np.int64)),
    }
    return pa.table(
        [cols[f.name] if f.name in cols else pa.nulls(rows, f.type) for f in BRONZE],
        schema=BRONZE,
    )


def build(path: str, commits: int, rows: int) -> float:
    """One file and one commit (with its app transaction) per batch, as the bronze
    arrow writer commits them (through delta-spark's transaction)."""
    delta.create_table(path, BRONZE, name="bronze")
    span_us = 2 * 86_400 * 1_000_000
    step = span_us // (commits * rows)
    t0 = time.perf_counter()
    for b in range(commits):
        t = chunk(b * rows, rows, int(DAY0.timestamp() * 1e6) + b * rows * step, step, b)
        name = f"part-{b:06d}-{uuid.uuid4().hex}.parquet"
        pq.write_table(t, os.path.join(path, name), compression="snappy")
        delta.commit_files(path, [(name, {})], app_id=APP, batch_id=b)
    return time.perf_counter() - t0


def spark_day(spark: Any, path: str) -> list[tuple[str, int]]:
    from pyspark.sql import functions as F

    day = delta.read_table(spark, path).where(
        F.col("received_at").between(F.lit(DAY0), F.lit(DAY0 + timedelta(days=1)))
    )
    rows = day.groupBy("routing_key").count().collect()
    return sorted((str(r[0]), int(r[1])) for r in rows)


def arrow_day(path: str) -> list[tuple[str, int]]:
    t = delta.read_arrow(path)
    lo = pa.scalar(DAY0, pa.timestamp("us", "UTC"))
    hi = pa.scalar(DAY0 + timedelta(days=1), pa.timestamp("us", "UTC"))
    ts = t.column("received_at")
    day = t.filter(pc.and_(pc.greater_equal(ts, lo), pc.less_equal(ts, hi)))
    counts = day.group_by("routing_key").aggregate([([], "count_all")])
    return sorted(
        zip(counts.column("routing_key").to_pylist(), counts.column("count_all").to_pylist(),
            strict=True)
    )  # fmt: skip


def timed(fn: Callable[[], list[tuple[str, int]]], repeats: int) -> tuple[float, Any]:
    times, answer = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        answer = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), answer


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--commits", type=int, default=500)
    p.add_argument("--rows", type=int, default=200, help="rows per commit")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--no-spark", action="store_true", help="pyarrow reads only")
    p.add_argument("--keep", action="store_true", help="keep the table folder")
    args = p.parse_args()

    work = tempfile.mkdtemp(prefix="bench-maintain-")
    path = os.path.join(work, "bronze")
    spark = None
    try:
        build_s = build(path, args.commits, args.rows)
        print(f"built {args.commits} commits x {args.rows} rows in {build_s:.1f} s")
        if not args.no_spark:
            from pipeline.spark import get_spark

            spark = get_spark("bench-maintain", test=True)
            warm = os.path.join(work, "warm-up")
            build(warm, 2, 10)
            spark_day(spark, warm)  # JVM and plan caches warm, without a third slow read
        before: dict[str, tuple[float, Any]] = {
            "arrow": timed(lambda: arrow_day(path), args.repeats)
        }
        if spark is not None:
            before["spark"] = timed(lambda: spark_day(spark, path), args.repeats)
        txn = delta.committed_batch(path, APP)

        report = maintain_table(path, MaintainSettings(retention_hours=0, min_files=2))

        after: dict[str, tuple[float, Any]] = {
            "arrow": timed(lambda: arrow_day(path), args.repeats)
        }
        if spark is not None:
            after["spark"] = timed(lambda: spark_day(spark, path), args.repeats)
        print(f"files        {report.files_before} -> {report.files_after}")
        print(f"bytes        {report.bytes_before:,} -> {report.bytes_after:,}")
        print(f"versions     {report.version_before} -> {report.version_after}")
        print(f"maintenance  {report.seconds:.2f} s (compacted {report.compacted_removed} "
              f"into {report.compacted_added}, vacuumed {len(report.vacuumed)})")  # fmt: skip
        for k in before:
            b, a = before[k][0], after[k][0]
            print(f"day query ({k:5s}) {b:.3f} s -> {a:.3f} s  (before/after {b / a:.1f}x)")
            assert before[k][1] == after[k][1], f"{k}: the day's answer changed"
        day_rows = sum(n for _k, n in after["arrow"][1])
        print(f"day rows     {day_rows:,} of {args.commits * args.rows:,}; "
              f"app transaction {txn} -> {delta.committed_batch(path, APP)}")  # fmt: skip
        assert delta.committed_batch(path, APP) == txn
    finally:
        if spark is not None:
            spark.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
