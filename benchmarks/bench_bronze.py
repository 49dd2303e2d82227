"""Landing log -> bronze throughput (records/s), against a plain pyarrow + delta-rs baseline.

    .venv/bin/python benchmarks/bench_bronze.py [--messages 500000] [--size 400]

Both runs read the same landing log in the same process and write a Delta
table with the bronze schema:

* baseline: read every segment with pyarrow, add ``batch_id``, and
  ``write_deltalake`` in chunks of ``--batch`` rows (no Spark, no de-duplication,
  everything through one process);
* pipeline: the ``qmf`` streaming source with ``Trigger.AvailableNow`` and
  ``maxRecordsPerTrigger = --batch`` into ``pipeline.bronze`` (exactly-once
  appends, matched redeliveries filtered), once per ``--writers``: ``arrow``
  (the driver writes the batch's landing ranges with pyarrow, the default)
  and ``spark`` (rows through Spark's Parquet writer).

A third run, the source alone into Spark's ``noop`` sink, shows what reading
costs. SparkSession start-up and a warm-up read (JVM, Python workers) are
excluded (paid once per job); the time to the first bronze commit is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from receivers.landing import LandedMessage, LandingLog, LandingWriter  # noqa: E402
from schemas.tables import BRONZE  # noqa: E402


def make_landing(root: Path, messages: int, size: int, partitions: int, segment: int) -> None:
    """``messages`` AM1-like messages of ``size`` bytes, spread over ``partitions``."""
    pad = bytes(range(256)) * (size // 256 + 1)
    per_part = messages // partitions
    for p in range(partitions):
        writer = LandingWriter(root, f"r{p}", fsync=False)
        done = 0
        while done < per_part:
            n = min(segment, per_part - done)
            msgs = []
            for i in range(done, done + n):
                key = f"mgmt.agent{p}.prop.org.apache.qpid.broker.queue{i % 50}"
                head = b"AM1c" + i.to_bytes(4, "big") + f"{p}:{i}:".encode()
                msgs.append(
                    LandedMessage(
                        body=head + pad[: max(size - len(head), 0)],
                        routing_key=key,
                        subject=key,
                        content_type="application/octet-stream",
                        application_properties={"qmf.agent": f"agent{p}"},
                        received_at_us=1_700_000_000_000_000 + i,
                    )
                )
            writer.append(msgs)
            done += n


def baseline(root: Path, table: Path, batch: int) -> tuple[float, int]:
    """pyarrow reads + write_deltalake appends; returns (seconds, rows)."""
    from deltalake import write_deltalake

    start = time.perf_counter()
    log = LandingLog(root)
    ends = log.end_offsets()
    pending: list[pa.RecordBatch] = []
    pending_rows = 0
    batch_id = 0
    rows = 0

    def flush() -> None:
        nonlocal pending, pending_rows, batch_id, rows
        t = pa.Table.from_batches(pending)
        t = t.filter(pc.is_null(t.column("duplicate_of"))).drop_columns(["duplicate_of"])
        t = t.append_column(
            BRONZE.field("batch_id"), pa.array([batch_id] * t.num_rows, pa.int64())
        )
        write_deltalake(str(table), t.cast(BRONZE), mode="append")
        rows += t.num_rows
        batch_id += 1
        pending, pending_rows = [], 0

    for b in log.iter_batches({p: (0, e) for p, e in ends.items()}):
        pending.append(b)
        pending_rows += b.num_rows
        if pending_rows >= batch:
            flush()
    if pending:
        flush()
    return time.perf_counter() - start, rows


def pipeline_run(
    root: Path, table: Path, ck: Path, batch: int, writer: str = "arrow"
) -> tuple[float, float, int, float]:
    """The bronze stream; returns (seconds, seconds to first commit, rows, session start s)."""
    from deltalake import DeltaTable

    from pipeline.bronze import BronzeSettings, start_bronze, tune_shuffles
    from pipeline.lake import delta
    from pipeline.spark import get_spark

    t0 = time.perf_counter()
    spark = get_spark("bench-bronze")
    tune_shuffles(spark)
    session_s = time.perf_counter() - t0
    settings = BronzeSettings(
        landing=str(root), table=str(table), checkpoint=str(ck),
        trigger="availableNow", max_records_per_trigger=batch, writer=writer,
    )  # fmt: skip
    # Warm-up (JVM, Python workers, imports), as for the source-only run.
    from pipeline.source import register

    register(spark)
    spark.read.format("qmf").option("path", str(root)).option(
        "endingOffsets", json.dumps(dict.fromkeys(LandingLog(root).partitions(), 1))
    ).load().write.format("noop").mode("overwrite").save()
    start = time.perf_counter()
    query = start_bronze(spark, settings)
    first: float | None = None
    deadline = start + 3600
    while not query.awaitTermination(1):
        if first is None and delta.table_exists(table) and DeltaTable(str(table)).version() > 0:
            first = time.perf_counter() - start
        if time.perf_counter() > deadline:
            query.stop()
            raise SystemExit("pipeline run did not finish within an hour")
    elapsed = time.perf_counter() - start
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    if first is None:
        first = elapsed
    # Rows in bronze, from the Delta log (numInputRows counts every scan of the
    # source: the key pass and the row pass).
    adds = DeltaTable(str(table)).get_add_actions(flatten=True)
    rows = sum(int(n) for n in pa.table(adds).column("num_records").to_pylist())
    steady = [p["durationMs"]["triggerExecution"] / 1000 for p in query.recentProgress][1:]
    if steady:
        med = sorted(steady)[len(steady) // 2]
        print(f"  {writer} writer: batches after the first " + ", ".join(f"{x:.2f}" for x in steady)
              + f" s; median {med:.2f} s = {batch / med:,.0f} records/s steady", flush=True)  # fmt: skip
    spark.stop()
    return elapsed, first, rows, session_s


def source_only(root: Path, ck: Path, batch: int) -> tuple[float, list[float]]:
    """The source alone into Spark's ``noop`` sink: what reading costs (seconds in all,
    and each micro-batch's duration after the first, from the query's progress)."""
    from pipeline.source import register
    from pipeline.spark import get_spark

    spark = get_spark("bench-bronze")
    register(spark)
    # Warm-up (JVM, Python workers, imports) so both timed runs are steady state.
    spark.read.format("qmf").option("path", str(root)).load().write.format("noop").mode(
        "overwrite"
    ).save()
    start = time.perf_counter()
    query = (
        spark.readStream.format("qmf").option("path", str(root))
        .option("maxRecordsPerTrigger", str(batch)).load()
        .writeStream.format("noop").option("checkpointLocation", str(ck))
        .trigger(availableNow=True).start()
    )  # fmt: skip
    if not query.awaitTermination(3600):
        query.stop()
        raise SystemExit("source-only run did not finish within an hour")
    elapsed = time.perf_counter() - start
    batches = [p["durationMs"]["triggerExecution"] / 1000 for p in query.recentProgress
               if p["numInputRows"] > 0]  # fmt: skip
    return elapsed, batches[1:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=500_000)
    ap.add_argument("--size", type=int, default=400, help="body bytes per message")
    ap.add_argument("--partitions", type=int, default=2, help="landing partitions (receivers)")
    ap.add_argument("--segment", type=int, default=1_000, help="messages per landing segment")
    ap.add_argument("--batch", type=int, default=200_000, help="records per micro-batch")
    ap.add_argument("--workdir", default=None, help="keep files here (default: a temp dir)")
    ap.add_argument("--writers", default="arrow,spark", help="bronze writers to measure")
    args = ap.parse_args()

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-bronze-"))
    root = work / "landing"
    shutil.rmtree(work / "baseline", ignore_errors=True)
    shutil.rmtree(work / "bronze", ignore_errors=True)
    shutil.rmtree(work / "ck", ignore_errors=True)
    shutil.rmtree(work / "ck-noop", ignore_errors=True)
    try:
        t = time.perf_counter()
        if not root.exists():
            make_landing(root, args.messages, args.size, args.partitions, args.segment)
        landed = sum(LandingLog(root).end_offsets().values())
        print(f"landing log: {landed} messages of ~{args.size} B in {time.perf_counter() - t:.1f} s")

        load_before = os.getloadavg()[0]
        base_s, base_rows = baseline(root, work / "baseline", args.batch)
        base_rate = base_rows / base_s
        print(f"baseline (pyarrow + write_deltalake): {base_rows} rows in {base_s:.1f} s = {base_rate:,.0f} records/s", flush=True)
        source_s, source_batches = source_only(root, work / "ck-noop", args.batch)
        print(f"source alone (qmf -> noop sink): {landed} rows in {source_s:.1f} s = {landed / source_s:,.0f} records/s"
              f" (ratio to baseline {landed / source_s / base_rate:.2f})", flush=True)
        if source_batches:
            med = sorted(source_batches)[len(source_batches) // 2]
            print("  source alone: batches after the first " + ", ".join(f"{x:.2f}" for x in source_batches)
                  + f" s; median {med:.2f} s = {args.batch / med:,.0f} records/s steady", flush=True)  # fmt: skip
        result: dict[str, object] = {
            "messages": landed, "size": args.size, "batch": args.batch, "cpus": os.cpu_count(),
            "baseline_rps": round(base_rate), "source_only_rps": round(landed / source_s),
            "source_ratio": round(landed / source_s / base_rate, 3),
        }
        ok = base_rows == landed
        for writer in args.writers.split(","):
            shutil.rmtree(work / "bronze", ignore_errors=True)
            shutil.rmtree(work / "ck", ignore_errors=True)
            pipe_s, first_s, pipe_rows, session_s = pipeline_run(
                root, work / "bronze", work / "ck", args.batch, writer
            )
            pipe_rate = pipe_rows / pipe_s
            print(f"pipeline (qmf source -> bronze, {writer} writer, exactly-once): {pipe_rows} rows in {pipe_s:.1f} s"
                  f" = {pipe_rate:,.0f} records/s, ratio to baseline {pipe_rate / base_rate:.2f}"
                  f" (first commit after {first_s:.1f} s; session start {session_s:.1f} s, not counted)", flush=True)
            result[f"pipeline_{writer}_rps"] = round(pipe_rate)
            result[f"ratio_{writer}"] = round(pipe_rate / base_rate, 3)
            result[f"first_commit_{writer}_s"] = round(first_s, 1)
            ok = ok and pipe_rows == landed
        load_after = os.getloadavg()[0]
        print(f"load average (1 min) before/after: {load_before:.1f}/{load_after:.1f} on {os.cpu_count()} CPUs")
        result.update(load_before=round(load_before, 1), load_after=round(load_after, 1))
        print("RESULT " + json.dumps(result))
        return 0 if ok else 1
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
