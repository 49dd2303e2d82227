"""Gold throughput: the simulator at N queues, 1 s publish interval, one gold micro-batch per interval.

The simulator (AM2, ``--queues N --interval 1``) writes a capture; the silver
writer decodes it into silver, one silver batch per publish interval (the
capture cut into equal parts); then each silver batch goes through the gold
writer (``GoldBatchWriter``, the stream's ``foreachBatch`` function) as one
micro-batch, in order, with the state carried in Delta as in the stream.

Printed per micro-batch: input object samples and statistic values, batch
wall time, rate rows, state rows. Then: processing rate (values/s) vs input
rate (values per simulated second), batch duration p50/p95 (the latency a
sample waits from its batch's start to its rate row in Delta, on top of the
trigger interval and the upstream layers), and the same run's baseline: a
Spark read + collect of the same silver batch (Spark's fixed cost per batch;
ratio in brackets).

``--per-batch K`` makes each gold micro-batch K publish intervals (a longer
trigger); the input rate is then per simulated second (rate rows / K).

``--stream`` runs the gold *streaming job* instead (``start_gold``, AvailableNow,
its default ``maxBytesPerTrigger``) over the whole silver run, twice in the same
process: reading each micro-batch's silver files on the driver (the default)
and, as the same-run baseline, collecting each batch through Spark
(``read_on_driver=False``). It prints each run's wall time against the
simulated time it covers (keeping up: wall < simulated), per-batch durations,
and checks that both runs wrote the same rate rows. 300 intervals is the
issue's five minutes (about 10 minutes to simulate and decode into silver).

Usage (about 1-2 minutes at 10,000 queues and 6 intervals on 2 quiet cores):

    .venv/bin/python benchmarks/bench_gold.py [--queues 10000] [--intervals 6] [--per-batch 1]
    .venv/bin/python benchmarks/bench_gold.py --stream --intervals 300
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import TYPE_CHECKING

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from pipeline.cli import main as qmf
from pipeline.codec.capture import read_capture
from pipeline.gold import DEFAULT_MAX_BYTES_PER_TRIGGER, GoldBatchWriter, GoldSettings, gold_input
from pipeline.lake import delta
from pipeline.silver import SilverBatchWriter, SilverSettings, bronze_rows

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

START_NS = 1_800_000_000_000_000_000


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def stream_runs(
    ss: SilverSettings, tmp: str, intervals: int, max_bytes: int, from_commits: bool = False
) -> int:
    """The gold streaming job over the whole silver run: driver reads vs Spark reads."""
    import polars as pl

    from pipeline.bronze import tune_shuffles
    from pipeline.gold import start_gold
    from pipeline.spark import get_spark

    spark = get_spark("bench-gold")
    tune_shuffles(spark)
    walls: dict[str, float] = {}
    rates: dict[str, dict[str, object]] = {}
    class Timed(GoldBatchWriter):
        """Notes when each batch ended (wall clock), to time the steady part of a run."""

        ends: list[float]

        def __call__(self, df: DataFrame, batch_id: int) -> None:
            super().__call__(df, batch_id)
            self.ends = [*getattr(self, "ends", []), time.perf_counter()]

    for name, on_driver in (("Spark read (baseline)", False), ("driver read", True)):
        gs = GoldSettings(
            silver=ss.root, root=os.path.join(tmp, f"gold-{on_driver}"),
            checkpoint=os.path.join(tmp, f"ckpt-{on_driver}"), read_on_driver=on_driver,
            max_bytes_per_trigger=max_bytes or None,
            starting_versions={"object_samples": 0, "heartbeats": 0} if from_commits else {},
        )  # fmt: skip
        w = Timed(gs)
        t0 = time.perf_counter()
        query = start_gold(spark, gs, w)
        query.awaitTermination()
        wall = walls[name] = time.perf_counter() - t0
        if query.exception() is not None:
            print(f"{name}: the query failed: {query.exception()}")
            return 1
        # Aggregates, not the table: 300 intervals are ~90M rate rows.
        rates[name] = row = (
            pl.scan_delta(gs.path("statistic_rates"))
            .select(
                n=pl.len(), rates=pl.col("rate").count(), resets=pl.col("reset").count(),
                delta=pl.col("delta").sum(), end_ns=pl.col("end_ns").sum(),
                keys=(pl.col("object_id") + pl.col("statistic")).hash().sum(),
            )
            .collect(engine="streaming")
            .row(0, named=True)
        )  # fmt: skip
        n_rates = int(row["n"])
        secs = [r.seconds for r in w.reports]
        steady = secs[1:] or secs
        print(f"{name}: {len(secs)} micro-batches, {n_rates:,} rate rows from {intervals} "
              f"simulated seconds in {wall:.1f} s wall ({intervals / wall:.2f}x real time; "
              f"{n_rates / wall:,.0f} rate rows/s); batch p50 {pct(steady, 0.5):.2f} s, "
              f"p95 {pct(steady, 0.95):.2f} s, max {max(secs):.2f} s (first {secs[0]:.2f} s); "
              f"the writer's time {sum(secs):.1f} s, Spark's own {wall - sum(secs):.1f} s",
              flush=True)  # fmt: skip
        per_sim_s = n_rates / intervals
        after_first = n_rates - w.reports[0].rows.get("rates", 0)
        steady_wall = w.ends[-1] - w.ends[0]
        print(f"  after the first batch: {after_first:,} rate rows in {steady_wall:.1f} s = "
              f"{after_first / max(steady_wall, 1e-9):,.0f} rate rows/s against an input of "
              f"{per_sim_s:,.0f} per simulated second "
              f"({after_first / max(steady_wall, 1e-9) / per_sim_s:.2f}x)", flush=True)  # fmt: skip
        state = delta.read_arrow(gs.path("rate_state")).num_rows
        print(f"  state rows at the end: {state:,}; silver samples per batch: "
              f"{statistics.mean(r.rows.get('input', 0) for r in w.reports[1:] or w.reports):,.0f}")
    same = len(set(map(str, rates.values()))) == 1
    base, drv = walls.values()
    print(f"driver read vs Spark read: {base / drv:.2f}x faster; same rate rows (count, "
          f"sums, key hash): {same}")
    spark.stop()
    return 0 if same else 1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queues", type=int, default=10000)
    ap.add_argument("--intervals", type=int, default=5)
    ap.add_argument("--per-batch", type=int, default=1,
                    help="publish intervals per gold micro-batch (a longer trigger)")  # fmt: skip
    ap.add_argument("--stream", action="store_true", help="run the streaming job (see above)")
    ap.add_argument("--max-bytes-per-trigger", type=int, default=DEFAULT_MAX_BYTES_PER_TRIGGER,
                    help="--stream: silver file bytes per micro-batch and source (1: one "
                         "interval's commit per batch, as a live stream that keeps up has)")  # fmt: skip
    ap.add_argument("--from-commits", action="store_true",
                    help="--stream: read silver's commits from version 0, as a live stream reads "
                         "new commits, not a new checkpoint's starting snapshot")  # fmt: skip
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    tmp = tempfile.mkdtemp(prefix="bench-gold-")
    try:
        cap = os.path.join(tmp, "sim.jsonl")
        t0 = time.perf_counter()
        qmf(["sim", "-o", cap, "--dialect", "am2", "--queues", str(args.queues),
             "--interval", "1", "--intervals", str(args.intervals), "--start-ns", str(START_NS)])  # fmt: skip
        with open(cap, encoding="utf-8") as fh:
            n_msgs = sum(1 for line in fh if line.strip())
        ss = SilverSettings(bronze=os.path.join(tmp, "bronze"), root=os.path.join(tmp, "silver"))
        sw = SilverBatchWriter(ss, app_id="bench-silver")
        size = n_msgs // args.intervals + 1  # one silver batch per publish interval
        it = read_capture(cap)
        for i in range(args.intervals):
            part = list(itertools.islice(it, size))
            sw.decode_local(bronze_rows(part, first_offset=i * size), i)
        os.remove(cap)
        print(f"sim + silver: {n_msgs} messages in {time.perf_counter() - t0:.1f} s", flush=True)
        if args.stream:
            return stream_runs(ss, tmp, args.intervals, args.max_bytes_per_trigger, args.from_commits)

        from pyspark.sql import functions as F

        from pipeline.bronze import tune_shuffles
        from pipeline.spark import get_spark

        spark = get_spark("bench-gold")
        tune_shuffles(spark)
        gs = GoldSettings(silver=ss.root, root=os.path.join(tmp, "gold"))
        w = GoldBatchWriter(gs, app_id="bench-gold")
        samples = delta.read_table(spark, ss.path("object_samples"))
        beats = delta.read_table(spark, ss.path("heartbeats"))
        print("batch  samples  values  gold_s  baseline_s  rates  state", flush=True)
        durations, base_durations, values_in = [], [], []
        prev_rates = 0
        k = args.per_batch
        for b in range(args.intervals // k):
            s_b = samples.where(F.col("batch_id").between(b * k, b * k + k - 1))
            h_b = beats.where(F.col("batch_id").between(b * k, b * k + k - 1))
            tb = time.perf_counter()
            n_samples = len(s_b.toArrow())  # baseline: Spark read + collect of the batch
            base = time.perf_counter() - tb
            tg = time.perf_counter()
            w(gold_input(s_b, h_b), b)
            dur = time.perf_counter() - tg
            rates = delta.read_arrow(gs.path("statistic_rates")).num_rows
            state = delta.read_arrow(gs.path("rate_state")).num_rows
            n_values = rates - prev_rates
            prev_rates = rates
            durations.append(dur)
            base_durations.append(base)
            values_in.append(n_values)
            print(f"{b:5d}  {n_samples:7d}  {n_values:6d}  {dur:6.2f}  {base:10.2f}  {rates:5d}  {state:5d}",
                  flush=True)  # fmt: skip
        steady = durations[1:] or durations
        per_s = sum(values_in[1:]) / max(sum(steady), 1e-9)
        input_per_s = statistics.mean(values_in[1:] or values_in) / k  # an interval: 1 simulated s
        print(f"processing rate: {per_s:,.0f} rate rows/s; input rate: {input_per_s:,.0f} rate rows per"
              f" simulated second ({per_s / max(input_per_s, 1):.2f}x)")  # fmt: skip
        print(f"batch duration p50 {pct(steady, 0.5):.2f} s, p95 {pct(steady, 0.95):.2f} s "
              f"(baseline Spark read+collect p50 {pct(base_durations, 0.5):.2f} s: "
              f"{pct(steady, 0.5) / max(pct(base_durations, 0.5), 1e-9):.1f}x)")  # fmt: skip
        print(f"state rows at the end: {delta.read_arrow(gs.path('rate_state')).num_rows}")
        spark.stop()
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
