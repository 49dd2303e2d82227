"""Append throughput: parallel Parquet + driver commit vs everything through the driver.

Both sinks get the same cached bronze-like DataFrame (~400 B bodies) in the
same run; the baseline is ``write_deltalake(table, df.toArrow())``, which
funnels the whole batch through the driver as one Arrow table.

    .venv/bin/python benchmarks/bench_delta.py --rows 1000000 --batches 2
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from deltalake import CommitProperties, Transaction, write_deltalake
from pyspark.sql import DataFrame, SparkSession

from pipeline.lake.delta import (
    UNIQUE_COLUMNS_OPTIONS,
    append_batch,
    conform,
    create_table,
    read_arrow,
)
from pipeline.spark import get_spark
from schemas.tables import BRONZE


def bronze_rows(spark: SparkSession, rows: int, parts: int) -> DataFrame:
    """Bronze-shaped rows made by Spark itself (no driver funnel): 400 B bodies of
    incompressible bytes, a 32-char msg_key, a small map of properties."""
    hashes = ", ".join(f"sha2(concat(cast(id AS STRING), '{c}'), 512)" for c in "abcdef")
    return spark.range(0, rows, 1, parts).selectExpr(
        "'p0' AS partition",
        "id AS offset",
        "md5(cast(id AS STRING)) AS msg_key",
        "timestamp_micros(1714564800000000 + id * 1000) AS received_at",
        "concat('mgmt.agent', cast(id % 7 AS STRING), '.obj.org.apache.qpid.broker.queue') AS routing_key",
        "CAST(NULL AS STRING) AS subject",
        "uuid() AS message_id",
        "CAST(NULL AS STRING) AS correlation_id",
        "CAST(NULL AS STRING) AS reply_to",
        "'qmf.agent' AS app_id",
        "'amqp/map' AS content_type",
        "map('qmf.opcode', '_data', 'method', 'indication') AS application_properties",
        f"unhex(concat({hashes}, md5(cast(id AS STRING)))) AS body",
        "CAST(0 AS BIGINT) AS batch_id",
    )


def timed(label: str, rows: int, fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - start
    rate = rows / elapsed
    print(f"{label:<42} {rows:>9,} rows {elapsed:8.2f} s {rate:>12,.0f} rows/s", flush=True)
    return rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per batch")
    parser.add_argument("--batches", type=int, default=2, help="timed batches per sink")
    parser.add_argument("--partitions", type=int, default=4, help="Spark partitions of the batch")
    parser.add_argument("--dir", default=None, help="work folder (default: a temp folder)")
    args = parser.parse_args()

    spark = get_spark(
        "bench-delta", conf={"spark.driver.memory": "6g", "spark.ui.enabled": "false"}
    )
    work = args.dir or tempfile.mkdtemp(prefix="bench-delta-")
    parallel_path = os.path.join(work, "parallel")
    tuned_path = os.path.join(work, "tuned")
    driver_path = os.path.join(work, "driver")
    for p in (parallel_path, tuned_path, driver_path):
        shutil.rmtree(p, ignore_errors=True)
        create_table(p, BRONZE)

    batch = conform(bronze_rows(spark, args.rows, args.partitions), BRONZE).cache()
    print(f"caching {batch.count():,} rows ({args.partitions} partitions) ...", flush=True)
    warm = batch.limit(1000)

    def parallel(batch_id: int, df: DataFrame) -> object:
        return append_batch(df, parallel_path, app_id="bench", batch_id=batch_id)

    def tuned(batch_id: int, df: DataFrame) -> object:
        return append_batch(
            df, tuned_path, app_id="bench", batch_id=batch_id, writer_options=UNIQUE_COLUMNS_OPTIONS
        )

    def through_driver(batch_id: int, df: DataFrame) -> object:
        table = df.toArrow().cast(BRONZE)
        props = CommitProperties(app_transactions=[Transaction("bench", batch_id)])
        return write_deltalake(driver_path, table, mode="append", commit_properties=props)

    # Warm-up (class loading, Python workers) for both, untimed.
    parallel(0, warm)
    tuned(0, warm)
    through_driver(0, warm)

    rates: dict[str, list[float]] = {"parallel": [], "tuned": [], "driver": []}
    for b in range(1, args.batches + 1):
        rates["parallel"].append(
            timed(
                f"parallel Parquet + driver commit (#{b})",
                args.rows,
                partial(parallel, b, batch),
            )
        )
        rates["tuned"].append(
            timed(f"same, no dictionary on unique cols (#{b})", args.rows, partial(tuned, b, batch))
        )
        rates["driver"].append(
            timed(f"toArrow + write_deltalake (#{b})", args.rows, partial(through_driver, b, batch))
        )

    expected = 1000 + args.rows * args.batches
    for p in (parallel_path, tuned_path, driver_path):
        got = read_arrow(p).num_rows
        if got != expected:
            raise SystemExit(f"{p}: {got} rows, expected {expected}")
    best_parallel = max(rates["parallel"])
    best_tuned = max(rates["tuned"])
    best_driver = max(rates["driver"])
    print(f"best parallel: {best_parallel:,.0f} rows/s")
    print(f"best tuned:    {best_tuned:,.0f} rows/s")
    print(f"best driver:   {best_driver:,.0f} rows/s")
    print(f"ratio parallel/driver: {best_parallel / best_driver:.2f}x")
    print(f"ratio tuned/driver:    {best_tuned / best_driver:.2f}x")
    batch.unpersist()
    spark.stop()
    if not args.dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
