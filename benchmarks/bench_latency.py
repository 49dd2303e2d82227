"""End-to-end latency: from a sample's timestamp to its row in each layer's Delta table.

Runs the main command (``qmf run``: local broker, simulated agents publishing
with wall-clock sample times, bronze, silver and gold streaming in one Spark
session) for ``--duration`` seconds, then reads the lake it left and, per
layer, the time from each sample's timestamp (``update_ns``) to:

- landed: the receiver's ``received_at`` (bronze row of the sample's message),
- bronze: the commit of the bronze file holding the message,
- silver: the commit of the ``object_samples`` file holding the sample,
- gold: the commit of the ``statistic_rates`` file holding the rate row whose
  interval ends at the sample (``end_ns``).

A file's commit time is its Delta log entry's ``commitInfo.timestamp``
(maintenance is off, so every file is the one its batch wrote). Printed:
p50/p95/max per layer over the whole run and over the samples after the
first ``--warmup`` seconds (JVM start, numba compilation, first batches),
with the load (samples and rate rows per second). The same-run baseline is
the landed latency: what the broker and receiver alone cost.

``--lake DATA`` analyses a lake a ``qmf run`` (or ``qmf soak``) already left
instead, and ``--window S`` adds the figures per S seconds of sample time,
which shows whether a layer's latency stays bounded or grows (a layer that
does not keep up). Files a compaction already vacuumed are skipped (their
rows are counted as missing).

Usage (about 3 minutes with the defaults):

    .venv/bin/python benchmarks/bench_latency.py [--queues 500] [--agents 2] [--duration 120]
    .venv/bin/python benchmarks/bench_latency.py --lake data-soak --window 300
    .venv/bin/python benchmarks/bench_latency.py --trigger "processingTime=1 second" -- --silver-decode-on driver
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse

import numpy as np
import polars as pl
import pyarrow.parquet as pq

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)


def commit_times(table: str) -> dict[str, int]:
    """Data file (path relative to the table) -> commit time in ns, from the Delta log."""
    out: dict[str, int] = {}
    for entry in sorted(glob.glob(os.path.join(table, "_delta_log", "*.json"))):
        adds, ts_ms = [], None
        with open(entry) as f:
            for line in f:
                action = json.loads(line)
                if "commitInfo" in action:
                    ts_ms = action["commitInfo"].get("timestamp")
                if "add" in action and action["add"].get("dataChange", True):
                    adds.append(action["add"]["path"])
        for path in adds:
            out[urllib.parse.unquote(path)] = int(ts_ms) * 1_000_000 if ts_ms is not None else 0
    return out


def rows_with_commit(table: str, columns: list[str]) -> pl.DataFrame:
    """The table's rows (``columns``) with ``committed_ns``: when their file was committed."""
    parts = []
    for path, ns in commit_times(table).items():
        if not os.path.exists(os.path.join(table, path)):
            continue  # compacted and vacuumed since
        t = pl.from_arrow(pq.read_table(os.path.join(table, path), columns=columns))
        assert isinstance(t, pl.DataFrame)
        parts.append(t.with_columns(committed_ns=pl.lit(ns, pl.Int64)))
    return pl.concat(parts) if parts else pl.DataFrame()


def summary(name: str, lat_ns: np.ndarray) -> str:
    if len(lat_ns) == 0:
        return f"{name:8s} no rows"
    s = lat_ns / 1e9
    p50, p95 = np.percentile(s, [50, 95])
    return f"{name:8s} p50 {p50:6.2f} s  p95 {p95:6.2f} s  max {s.max():6.2f} s  ({len(s):,} rows)"


def analyse(data: str, warmup: float, window: float, wall: float | None) -> None:
    """Print each layer's latency from a ``qmf run --data`` folder."""
    bronze = rows_with_commit(os.path.join(data, "bronze"), ["partition", "offset", "received_at"])
    samples = rows_with_commit(
        os.path.join(data, "silver", "object_samples"), ["partition", "offset", "update_ns"]
    ).filter(pl.col("update_ns") > 0)
    rates = rows_with_commit(os.path.join(data, "gold", "statistic_rates"), ["end_ns"])
    landed = samples.join(
        bronze.rename({"committed_ns": "bronze_ns"}), on=["partition", "offset"], how="inner"
    ).with_columns(landed_ns=pl.col("received_at").dt.epoch("ns"))
    start = int(samples["update_ns"].min())  # type: ignore[arg-type]
    span = (int(samples["update_ns"].max()) - start) / 1e9  # type: ignore[arg-type]
    ran = f"qmf run: {wall:.0f} s wall; " if wall is not None else f"{data}: "
    print(f"\n{ran}{samples.height:,} object samples and {rates.height:,} rate rows over {span:.0f} s "
          f"of sample time ({samples.height / max(span, 1):,.0f} samples/s, "
          f"{rates.height / max(span, 1):,.0f} rate rows/s)")  # fmt: skip
    ranges = [("all samples", 0, 2**62), (f"after the first {warmup:.0f} s", start + int(warmup * 1e9), 2**62)]
    if window > 0:
        w = int(window * 1e9)
        ranges += [
            (f"sample time {(lo - start) / 1e9:.0f}-{(lo - start + w) / 1e9:.0f} s", lo, lo + w)
            for lo in range(start, start + int(span * 1e9) + 1, w)
        ]
    for title, lo, hi in ranges:
        print(f"\nlatency from the sample's timestamp, {title}:")
        sel = landed.filter(pl.col("update_ns").is_between(lo, hi, closed="left"))
        print(summary("landed", (sel["landed_ns"] - sel["update_ns"]).to_numpy()))
        print(summary("bronze", (sel["bronze_ns"] - sel["update_ns"]).to_numpy()))
        s = samples.filter(pl.col("update_ns").is_between(lo, hi, closed="left"))
        print(summary("silver", (s["committed_ns"] - s["update_ns"]).to_numpy()))
        r = rates.filter(pl.col("end_ns").is_between(lo, hi, closed="left"))
        print(summary("gold", (r["committed_ns"] - r["end_ns"]).to_numpy()))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queues", type=int, default=500, help="queues per simulated agent")
    ap.add_argument("--agents", type=int, default=2)
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--trigger", default="processingTime=2 seconds")
    ap.add_argument("--warmup", type=float, default=30.0, help="seconds excluded in the steady figures")
    ap.add_argument("--data", default=None, help="keep the lake here (default: a temporary folder)")
    ap.add_argument("--lake", default=None, help="only analyse this existing qmf run --data folder")
    ap.add_argument("--window", type=float, default=0.0, help="also per this many seconds of sample time")
    ap.add_argument("run_args", nargs="*", metavar="-- QMF_RUN_ARG",
                    help="more options for qmf run, after --")  # fmt: skip
    args = ap.parse_args()
    if args.lake:
        analyse(args.lake, args.warmup, args.window, wall=None)
        return 0
    data = args.data or tempfile.mkdtemp(prefix="bench-latency-")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    qmf = os.path.join(os.path.dirname(sys.executable), "qmf")
    cmd = [qmf, "run", "--data", data, "--queues", str(args.queues), "--agents", str(args.agents),
           "--interval", "1", "--duration", str(args.duration), "--trigger", args.trigger,
           "--maintain-every", "0", "--progress", "15", "--queue", "qmf-bench-latency",
           *args.run_args]  # fmt: skip
    try:
        t0 = time.perf_counter()
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, env=env, check=True, cwd=ROOT)
        wall = time.perf_counter() - t0

        analyse(data, args.warmup, args.window, wall)
        return 0
    finally:
        if args.data is None:
            shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
