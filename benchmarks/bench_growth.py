"""Bronze batch time into a grown table (10M rows) vs into an empty one, side by side.

    .venv/bin/python benchmarks/bench_growth.py [--rows 10000000] [--messages 300000]

1. Grows a bronze table to ``--rows`` synthetic rows with pyarrow +
   ``write_deltalake`` (no Spark), in ``--grow-commits`` appends, the way a
   long-running stream's table has many files and commits.
2. Lands ``--messages`` messages of ``--size`` bytes and streams them with the
   bronze query (AvailableNow, ``--batch`` records per micro-batch) into an
   empty table and into the grown one, alternately, ``--repeats`` times each,
   in the same SparkSession. Each micro-batch's time comes from Spark's
   progress (``triggerExecution``); the first batch of a run is reported apart
   (it pays the first plan).

Target: the steady batch time at 10M rows within 1.2x that of the empty table.
Nothing in a bronze batch reads the table's rows: what could grow is the Delta
log a commit reads (delta-rs writes a checkpoint every 100 commits).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_bronze import make_landing  # noqa: E402
from schemas.tables import BRONZE  # noqa: E402


def synthetic_chunk(first_offset: int, rows: int, size: int, batch_id: int) -> pa.Table:
    """``rows`` bronze rows with bodies of ``size`` bytes; every column filled."""
    offsets = np.arange(first_offset, first_offset + rows, dtype=np.int64)
    pattern = np.frombuffer(bytes(range(256)) * (size // 256 + 1), dtype=np.uint8)[:size]
    data = np.tile(pattern, rows)
    data[0::size] = (offsets % 251).astype(np.uint8)  # not all equal
    body = pa.Array.from_buffers(
        pa.binary(), rows,
        [None, pa.py_buffer(np.arange(0, (rows + 1) * size, size, dtype=np.int32)), pa.py_buffer(data)],
    )  # fmt: skip
    keys = pa.array([f"{o:032x}" for o in offsets.tolist()], pa.string())
    rk = pa.array(["mgmt.agent0.prop.org.apache.qpid.broker.queue"] * rows, pa.string())
    props = pa.array([[("qmf.agent", "agent0")]] * rows, pa.map_(pa.string(), pa.string()))
    ts = pa.array(1_700_000_000_000_000 + offsets, pa.int64()).cast(BRONZE.field("received_at").type)
    nulls = pa.nulls(rows, pa.string())
    cols = {
        "partition": pa.array(["grown"] * rows, pa.string()),
        "offset": pa.array(offsets),
        "msg_key": keys,
        "received_at": ts,
        "routing_key": rk,
        "subject": rk,
        "message_id": nulls,
        "correlation_id": nulls,
        "reply_to": nulls,
        "app_id": nulls,
        "content_type": pa.array(["application/octet-stream"] * rows, pa.string()),
        "application_properties": props,
        "body": body,
        "redelivered": pa.array(np.zeros(rows, dtype=bool)),
        "batch_id": pa.array(np.full(rows, batch_id, dtype=np.int64)),
    }
    return pa.table([cols[f.name] for f in BRONZE], schema=BRONZE)


def grow(table: Path, rows: int, commits: int, size: int) -> float:
    """Write ``rows`` rows in ``commits`` appends; returns seconds."""
    from deltalake import write_deltalake

    from pipeline.lake import delta

    start = time.perf_counter()
    delta.create_table(str(table), BRONZE, name="bronze")
    per = rows // commits
    chunk = synthetic_chunk(0, per, size, 0)
    for i in range(commits):
        offs = pa.array(np.arange(i * per, (i + 1) * per, dtype=np.int64))
        t = chunk.set_column(BRONZE.get_field_index("offset"), BRONZE.field("offset"), offs)
        write_deltalake(str(table), t, mode="append")
    return time.perf_counter() - start


def stream(spark: object, landing: Path, table: Path, ck: Path, batch: int) -> list[float]:
    """One AvailableNow bronze run; per-batch seconds (triggerExecution)."""
    from pipeline.bronze import BronzeSettings, start_bronze

    shutil.rmtree(ck, ignore_errors=True)
    settings = BronzeSettings(
        landing=str(landing), table=str(table), checkpoint=str(ck),
        trigger="availableNow", max_records_per_trigger=batch,
    )  # fmt: skip
    query = start_bronze(spark, settings)  # type: ignore[arg-type]
    if not query.awaitTermination(1800):
        query.stop()
        raise SystemExit("bronze run did not finish in 30 min")
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    return [p["durationMs"]["triggerExecution"] / 1000 for p in query.recentProgress]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000, help="rows of the grown table")
    ap.add_argument("--grow-commits", type=int, default=200, help="appends that grow it")
    ap.add_argument("--messages", type=int, default=300_000, help="messages streamed per run")
    ap.add_argument("--size", type=int, default=400)
    ap.add_argument("--batch", type=int, default=100_000, help="records per micro-batch")
    ap.add_argument("--repeats", type=int, default=2, help="runs per table (alternating)")
    ap.add_argument("--workdir", default=None, help="keep files here (reused: the grown table)")
    args = ap.parse_args()

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-growth-"))
    work.mkdir(parents=True, exist_ok=True)
    grown = work / "grown"
    try:
        from deltalake import DeltaTable

        from pipeline.bronze import tune_shuffles
        from pipeline.lake import delta
        from pipeline.spark import get_spark

        if not delta.table_exists(grown):
            s = grow(grown, args.rows, args.grow_commits, args.size)
            print(f"grew bronze to {args.rows:,} rows in {args.grow_commits} commits in {s:.1f} s")
        if not (work / "landing").exists():
            make_landing(work / "landing", args.messages, args.size, 2, 1_000)
        spark = get_spark("bench-growth")
        tune_shuffles(spark)
        load_before = os.getloadavg()[0]
        runs: dict[str, list[list[float]]] = {"empty": [], "grown": []}
        base_version = DeltaTable(str(grown)).version()
        for r in range(args.repeats):
            for name in ("empty", "grown"):
                table = work / f"empty-{r}" if name == "empty" else grown
                shutil.rmtree(work / f"empty-{r}", ignore_errors=True)
                before = DeltaTable(str(table)).version() if delta.table_exists(table) else -1
                rows0 = _rows(table)
                secs = stream(spark, work / "landing", table, work / f"ck-{name}-{r}", args.batch)
                runs[name].append(secs)
                print(f"run {r} {name:5} (table at {rows0:,} rows, version {before}): batches "
                      + ", ".join(f"{s:.2f}" for s in secs) + " s", flush=True)  # fmt: skip
        spark.stop()
        load_after = os.getloadavg()[0]

        def steady(name: str) -> float:
            return statistics.median(s for run in runs[name] for s in run[1:])

        def first(name: str) -> float:
            return statistics.median(run[0] for run in runs[name])

        ratio = steady("grown") / steady("empty")
        print(f"{'':24} {'empty table':>12} {f'{args.rows / 1e6:.0f}M rows':>12} {'ratio':>6}")
        print(f"{'steady batch (median s)':24} {steady('empty'):12.2f} {steady('grown'):12.2f} {ratio:6.2f}")
        print(f"{'first batch (median s)':24} {first('empty'):12.2f} {first('grown'):12.2f} "
              f"{first('grown') / first('empty'):6.2f}")  # fmt: skip
        print(f"grown table: version {base_version} before the runs, {_rows(grown):,} rows after")
        print(f"load average (1 min) before/after: {load_before:.1f}/{load_after:.1f} on {os.cpu_count()} CPUs")
        print("RESULT " + json.dumps({
            "rows": args.rows, "batch": args.batch, "steady_empty_s": round(steady("empty"), 3),
            "steady_grown_s": round(steady("grown"), 3), "ratio": round(ratio, 3),
            "runs": runs, "load_before": round(load_before, 1), "load_after": round(load_after, 1),
        }))  # fmt: skip
        return 0
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


def _rows(table: Path) -> int:
    from deltalake import DeltaTable

    from pipeline.lake import delta

    if not delta.table_exists(table):
        return 0
    adds = pa.table(DeltaTable(str(table)).get_add_actions(flatten=True))
    return int(sum(adds.column("num_records").to_pylist()))


if __name__ == "__main__":
    sys.exit(main())
