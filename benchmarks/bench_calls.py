"""Silver's v1 method-call pairing: on the driver against Spark tasks by bucket, same run.

A batch's call halves (``pipeline.silver.methods``) are paired on the driver when they
and the stored waiting requests number at most ``CALLS_DRIVER_MAX_ROWS``, else in one
Spark task per bucket of (dialect, seq). This benchmark is where that threshold comes
from. For each size, AM2 purge calls of qpid's queue class: every request with its
response, split into part files by bucket as the decode tasks write them. The driver
(``run_pairing(None, ...)``) and the Spark tasks (``run_pairing(spark, ...)``, one task
per core) pair the same files, alternated, best and median of ``--repeat`` after one
untimed run each; both write their Parquet files and must give the same rows.

Usage (about a minute on 2 quiet cores):

    .venv/bin/python benchmarks/bench_calls.py [--sizes 1000,5000,20000,80000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.qmfxml import default_schema
from pipeline.silver.methods import PairPlan, PartWriter, run_pairing
from pipeline.silver.settings import CALLS_DRIVER_MAX_ROWS
from pipeline.spark import get_spark
from schemas.silver import METHOD_CALLS


def halves(calls: int) -> pa.Table:
    """``calls`` AM2 purge requests, each answered right after (status 0)."""
    q = default_schema().get("org.apache.qpid.broker", "queue").schema
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    rows: list[dict[str, object]] = []
    for i in range(calls):
        at = t0 + timedelta(microseconds=2 * i)
        rows.append({
            "call_id": f"p0:{2 * i}:0", "dialect": "AM2", "seq": i, "batch_id": 1,
            "request_batch": 1, "request_partition": "p0", "request_offset": 2 * i,
            "request_index": 0, "request_at": at, "object_id": f"0-4-1-0-{i}",
            "object_id_raw": bytes(8) + i.to_bytes(8, "big"), "package": q.key.package,
            "class_name": "queue", "schema_hash": q.key.hash, "method_name": "purge",
            "raw_in": b"",
        })  # fmt: skip
        rows.append({
            "call_id": f"p0:{2 * i + 1}:0", "dialect": "AM2", "seq": i, "batch_id": 1,
            "response_partition": "p0", "response_offset": 2 * i + 1, "response_index": 0,
            "response_at": at + timedelta(microseconds=1), "agent": "a", "status": 0,
            "text": "OK", "raw_out": b"",
        })  # fmt: skip
    return pa.Table.from_pylist(rows, schema=METHOD_CALLS)


def rows_of(files: list[str]) -> pa.Table:
    return pa.concat_tables([pq.read_table(f) for f in files]).sort_by("call_id")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="500,2500,10000,40000", help="calls per batch (halves: twice)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args()
    spark = get_spark("bench-calls", master=args.master)
    buckets = spark.sparkContext.defaultParallelism
    schemas = (default_schema().get("org.apache.qpid.broker", "queue").schema,)
    work = Path(tempfile.mkdtemp(prefix="bench-calls-"))
    print(f"pairing on the driver up to {CALLS_DRIVER_MAX_ROWS:,} rows; {buckets} buckets on {args.master}")
    result = []
    try:
        for calls in (int(s) for s in args.sizes.split(",")):
            parts_dir = work / f"parts-{calls}"
            parts_dir.mkdir()
            w = PartWriter(str(parts_dir), 1, buckets)
            w.write(halves(calls))
            parts = tuple(f.location for f in w.close())

            def plan(out: Path, parts: tuple[str, ...] = parts) -> PairPlan:
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir()
                return PairPlan(
                    schemas=schemas, app_id="bench", batch_id=1, buckets=buckets, parts=parts,
                    stored_schema=METHOD_CALLS, stored=(), samples=(), samples_path="",
                    staging=str(out),
                )  # fmt: skip

            times: dict[str, list[float]] = {"driver": [], "tasks": []}
            got: dict[str, pa.Table] = {}
            for i in range(args.repeat + 1):
                for where, session in (("driver", None), ("tasks", spark)):
                    out = work / f"out-{where}"
                    p = plan(out)
                    t = time.perf_counter()
                    files, changed = run_pairing(session, p)
                    dt = time.perf_counter() - t
                    assert changed == calls, (where, changed)
                    if i:
                        times[where].append(dt)
                    else:
                        got[where] = rows_of([f.location for f in files])
            assert got["driver"].equals(got["tasks"]), calls
            d, k = min(times["driver"]), min(times["tasks"])
            print(
                f"{2 * calls:>8,} halves: driver {1e3 * d:7.1f} ms (median {1e3 * statistics.median(times['driver']):7.1f}), "
                f"tasks {1e3 * k:7.1f} ms (median {1e3 * statistics.median(times['tasks']):7.1f}): "
                f"tasks take {k / d:.2f} of the time"
            )
            result.append({"halves": 2 * calls, "driver_ms": round(1e3 * d, 1), "tasks_ms": round(1e3 * k, 1),
                           "ratio": round(k / d, 3)})  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("RESULT " + json.dumps({"calls_driver_max_rows": CALLS_DRIVER_MAX_ROWS, "buckets": buckets,
                                  "sizes": result}))  # fmt: skip


if __name__ == "__main__":
    main()
