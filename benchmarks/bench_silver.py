"""Silver throughput: object-sample records/s into Delta, next to ``decode_content`` alone, same run.

Two streams of bronze-shaped rows (schemas.tables.BRONZE):

(a) ``mixed``: the real capture's AM2 content messages (11 classes, c/i/g,
    ~4.7 records per message), repeated;
(b) ``queue-i``: broker queue 'i' statistics, 100 records per AM2 message.

Each is cut into micro-batches of ``--small`` messages (200: real traffic's
batch size) and ``--large`` messages. Per configuration it prints records/s
(wall time, best of ``--repeat``) of:

* ``per-record``      the per-record codec (``decode_message`` per message): the baseline;
* ``decode_content``  the vectorized decode alone (per-class wide Arrow tables);
* ``decode_compact``  the vectorized decode alone, silver's layout (``compact=True``: one
                      table for all classes, typed value lists);
* ``decode_arrow``    the silver decode (compact object_samples + the other tables), no Spark;
* ``local->Delta``    decode_arrow + the silver writer's Delta commits, on the driver (no Spark);
* ``job->Delta``      the silver job's micro-batch through Spark: bronze Delta read,
                      ``mapInArrow`` decode on local[2], results to the driver, Delta commits;
* ``wide->Delta``     the alternative layout: ``decode_content``'s per-class wide tables,
                      one Delta table (and commit) per class.

Before those, the 10x check of issue 9: the real mix at 200 messages per micro-batch,
``decode_compact`` over 50 batches (best of 20 passes) against the per-record codec over
2,000 of the same messages (best of 5 passes), the two passes interleaved so that a slow
moment of the machine does not fall on one side only; ``--ratio-only`` prints just that.

``--stream`` runs the silver *streaming job* instead (``start_silver``, AvailableNow,
``decode_on="driver"``, one bronze file of ``--large`` messages per micro-batch), the way
``jobs/silver.py`` runs: offset log -> the batch's bronze files read on the driver ->
decode -> Parquet + Delta commits. It prints object-sample records/s over the steady
batches (all but the first, which Spark reads and which warms up) from the query's
progress, next to ``decode_compact`` and ``local->Delta`` of the same batches.

Usage (about 1-2 minutes on 2 idle cores; ``--stream`` about 2 minutes):

    .venv/bin/python benchmarks/bench_silver.py [--records 100000] [--small 200] [--large 5000]
    .venv/bin/python benchmarks/bench_silver.py --stream [--large 5000] [--batches 8]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from bench_decode import mixed_stream, queue_stream

from pipeline.codec.layout import sample_schema
from pipeline.codec.message import decode_message
from pipeline.codec.schema import SchemaRegistry
from pipeline.codec.vectorized import decode_content, tune_malloc
from pipeline.lake import delta
from pipeline.silver import SilverBatchWriter, SilverSettings
from pipeline.silver.decode import decode_arrow
from pipeline.silver.registry import StatisticKinds, seed_table, to_registry
from schemas.tables import BRONZE

# One glibc arena (decode threads otherwise mmap their big blocks afresh every batch) and
# mimalloc never purging freed pages (pyarrow's pool: each batch's bronze bodies, 400 MB
# for 1M samples, otherwise page-fault in again): see docs/performance.md, session 8.
ALLOCATOR_ENV = {"MALLOC_ARENA_MAX": "1", "MIMALLOC_PURGE_DELAY": "-1"}


def bronze_batches(bodies: Sequence[bytes], size: int, first_batch: int = 0) -> list[pa.Table]:
    """Bronze-shaped tables of ``size`` messages (fresh offsets, distinct keys)."""
    out = []
    for b, i in enumerate(range(0, len(bodies), size)):
        chunk = list(bodies[i : i + size])
        n = len(chunk)
        cols: dict[str, Any] = {
            "partition": pa.array(["p0"] * n),
            "offset": pa.array(np.arange(i, i + n, dtype=np.int64)),
            "msg_key": pa.array([f"{i + j:032x}" for j in range(n)]),
            "received_at": pa.array(np.full(n, 1_795_338_000_000_000, np.int64)).cast(
                BRONZE.field("received_at").type
            ),
            "routing_key": pa.array(["console.obj.1.0.org.apache.qpid.broker.queue"] * n),
            "body": pa.array(chunk, pa.binary()),
            "batch_id": pa.array(np.full(n, first_batch + b, np.int64)),
        }
        for f in BRONZE:
            if f.name not in cols:
                cols[f.name] = (
                    pa.array([False] * n) if f.name == "redelivered" else pa.nulls(n, f.type)
                )
        out.append(pa.table(cols).select(BRONZE.names).cast(BRONZE))
    return out


def best(fn: Callable[[], int], repeat: int) -> tuple[float, int]:
    """Best wall seconds over ``repeat`` runs, and the records counted."""
    t_best, n = float("inf"), 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        n = fn()
        t_best = min(t_best, time.perf_counter() - t0)
    return t_best, n


def line(label: str, n: int, secs: float, base: float | None) -> float:
    rate = n / secs if secs > 0 else float("inf")
    ratio = f"{rate / base:7.1f}x per-record" if base else ""
    print(f"  {label:<16} {rate:>12,.0f} rec/s   ({n:,} records, {secs:.3f} s)  {ratio}")
    return rate


def run(
    name: str,
    bodies: list[bytes],
    reg: SchemaRegistry,
    size: int,
    repeat: int,
    spark: Any,
    work: str,
    max_job_batches: int = 6,
) -> dict[str, float]:
    tables = bronze_batches(bodies, size)
    kinds = StatisticKinds.load()
    print(f"\n[{name}] {len(bodies):,} messages in {len(tables)} micro-batches of {size}")

    sub = bodies[: min(len(bodies), 2000)]

    def per_record() -> int:
        r = reg.copy()
        return sum(len(decode_message(b, registry=r).records) for b in sub)

    def content() -> int:
        return sum(sum(t.num_rows for t in decode_content(b, reg).samples.values()) for b in tables)

    def compact() -> int:
        return sum(decode_content(b, reg, compact=True).table.num_rows for b in tables)  # type: ignore[union-attr]

    def silver() -> int:
        return sum(
            decode_arrow(b, reg.copy(), 0, kinds).get("object_samples").num_rows for b in tables
        )

    out: dict[str, float] = {}
    s, n = best(per_record, repeat)
    base = out["per_record"] = line("per-record", n, s, None)
    s, n = best(content, repeat)
    out["decode_content"] = line("decode_content", n, s, base)
    s, n = best(compact, repeat)
    out["decode_compact"] = line("decode_compact", n, s, base)
    s, n = best(silver, repeat)
    out["decode_arrow"] = line("decode_arrow", n, s, base)

    def fresh(tag: str) -> SilverSettings:
        root = os.path.join(work, f"{name}-{size}-{tag}")
        shutil.rmtree(root, ignore_errors=True)
        return SilverSettings(
            bronze=os.path.join(root, "bronze"), root=os.path.join(root, "silver")
        )

    # Driver only: decode + Delta commits, one per non-empty table.
    st = fresh("local")
    w = SilverBatchWriter(st, app_id="bench")
    t0 = time.perf_counter()
    n = sum(w.decode_local(b, k).rows.get("object_samples", 0) for k, b in enumerate(tables))
    out["local_delta"] = line("local->Delta", n, time.perf_counter() - t0, base)

    # Alternative layout: per-class wide tables, one table + commit per class.
    wide_root = os.path.join(work, f"{name}-{size}-wide")
    shutil.rmtree(wide_root, ignore_errors=True)
    t0 = time.perf_counter()
    n = 0
    for k, b in enumerate(tables):
        for key, t in decode_content(b, reg).samples.items():
            path = os.path.join(wide_root, f"{key.package}.{key.name}.{key.hash.hex()[:8]}")
            sch = sample_schema(reg.get(key))  # type: ignore[arg-type]
            if not delta.table_exists(path):
                delta.create_table(path, sch)
            delta.append_parquet(path, t, app_id="bench", batch_id=k)
            n += t.num_rows
    out["wide_delta"] = line("wide->Delta", n, time.perf_counter() - t0, base)

    if spark is not None:
        from pipeline.silver import run_silver_batch, write_bronze

        for mode in ("spark", "driver"):
            st = fresh(f"job-{mode}")
            st = SilverSettings(bronze=st.bronze, root=st.root, decode_on=mode)
            jobs = tables[:max_job_batches]
            warm = bronze_batches(bodies[:size], size, first_batch=len(jobs))
            write_bronze(st.bronze, [*jobs, *warm])
            # Warm-up (Python workers, numba cache load) on an extra batch into other
            # tables, not timed.
            ws = SilverSettings(bronze=st.bronze, root=st.root + "-warm", decode_on=mode)
            wb = (len(jobs), len(jobs))
            run_silver_batch(
                spark, ws, 0, batch_ids=wb, writer=SilverBatchWriter(ws, app_id="warm")
            )
            w = SilverBatchWriter(st, app_id=f"bench-{mode}")
            t0 = time.perf_counter()
            n = 0
            decode_s = 0.0
            for k in range(len(jobs)):
                r = run_silver_batch(spark, st, k, batch_ids=(k, k), writer=w)
                n += r.rows.get("object_samples", 0)
                decode_s += r.seconds.get("decode", 0.0)
            wall = time.perf_counter() - t0
            out[f"job_{mode}"] = line(f"job->Delta {mode}", n, wall, base)
            print(
                f"  {'':16} {len(jobs)} batches; Spark read + decode + collect: {decode_s / wall:.0%}"
            )
    return out


def stream_run(
    name: str, bodies: list[bytes], reg: SchemaRegistry, size: int, batches: int, work: str,
    spark: Any, from_commits: bool = False,
) -> dict[str, float]:  # fmt: skip
    """The streaming silver job over ``batches`` bronze files of ``size`` messages;
    ``from_commits``: read bronze's commits from version 0 (as a live stream reads what
    comes after its start) rather than the starting snapshot of a new checkpoint."""
    from pipeline.silver import start_silver, write_bronze

    reps = -(-size * batches // len(bodies))
    tables = bronze_batches((bodies * reps)[: size * batches], size)
    kinds = StatisticKinds.load()
    per_batch = decode_arrow(tables[0], reg.copy(), 0, kinds).get("object_samples").num_rows
    print(f"\n[{name}] stream: {batches} micro-batches of {size:,} messages "
          f"({per_batch:,} object samples each)")  # fmt: skip
    out: dict[str, float] = {}
    s, n = best(lambda: decode_content(tables[1], reg, compact=True).table.num_rows, 3)  # type: ignore[union-attr]
    out["decode_compact"] = line("decode_compact", n, s, None)
    root = os.path.join(work, f"stream-{name}")
    shutil.rmtree(root, ignore_errors=True)
    st = SilverSettings(bronze=os.path.join(root, "local-bronze"), root=os.path.join(root, "local"))
    w = SilverBatchWriter(st, app_id="bench")
    w.decode_local(tables[0], 0)
    t0 = time.perf_counter()
    n = sum(
        w.decode_local(b, k + 1).rows.get("object_samples", 0) for k, b in enumerate(tables[1:3])
    )
    out["local_delta"] = line("local->Delta", n, time.perf_counter() - t0, None)
    st = SilverSettings(
        bronze=os.path.join(root, "bronze"), root=os.path.join(root, "silver"),
        checkpoint=os.path.join(root, "checkpoint"), decode_on="driver", max_files_per_trigger=1,
        starting_version=0 if from_commits else None,
    )  # fmt: skip
    write_bronze(st.bronze, tables)
    t0 = time.perf_counter()
    query = start_silver(spark, st)
    query.awaitTermination()
    wall = time.perf_counter() - t0
    durations = [p["durationMs"]["triggerExecution"] / 1000 for p in query.recentProgress]
    # Driver reads leave Spark's input-row counts at 0: batches are counted by id.
    ids = [p["batchId"] for p in query.recentProgress]
    total = sum(b.num_rows for b in delta.iter_batches(st.path("object_samples"), ["offset"]))
    assert total == per_batch * batches, (total, per_batch * batches)
    assert ids == list(range(batches)), ids
    steady = durations[1:]
    rate = per_batch * len(steady) / sum(steady)
    ratio = rate / out["local_delta"]
    print(f"  {'job->Delta stream':<16} {rate:>12,.0f} rec/s   ({len(steady)} steady batches, "
          f"{min(steady):.2f}-{max(steady):.2f} s each; first {durations[0]:.2f} s; "
          f"{total / wall:,.0f} rec/s over the whole run of {wall:.1f} s)  {ratio:.2f}x local->Delta")  # fmt: skip
    out["job_stream"] = rate
    return out


def ratio_check(bodies: list[bytes], reg: SchemaRegistry, size: int, passes: int = 20) -> float:
    """decode_compact / per-record on the real mix at ``size`` messages per batch (issue 9: >= 10x)."""
    tables = bronze_batches(bodies[: size * 50], size)
    sub = bodies[:2000]
    n_fast = sum(decode_content(b, reg, compact=True).table.num_rows for b in tables)  # type: ignore[union-attr]
    r = reg.copy()
    n_per = sum(len(decode_message(b, registry=r).records) for b in sub)
    t_fast = t_per = float("inf")
    for k in range(passes):
        t0 = time.perf_counter()
        for b in tables:
            decode_content(b, reg, compact=True)
        t_fast = min(t_fast, time.perf_counter() - t0)
        if k % 4 == 0:  # the per-record pass is ~10x longer: 5 of them
            r = reg.copy()
            t0 = time.perf_counter()
            for body in sub:
                decode_message(body, registry=r)
            t_per = min(t_per, time.perf_counter() - t0)
    fast, per = n_fast / t_fast, n_per / t_per
    print(f"\n[10x check] real mix, {len(tables)} batches of {size} messages ({n_fast:,} records): "
          f"decode_compact {fast:,.0f} rec/s ({t_fast / len(tables) * 1e3:.3f} ms per batch), "
          f"per-record {per:,.0f} rec/s: {fast / per:.1f}x (target 10x)")  # fmt: skip
    return fast / per


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=60_000, help="records per stream")
    ap.add_argument("--small", type=int, default=200, help="messages per small micro-batch")
    ap.add_argument("--large", type=int, default=5_000, help="messages per large micro-batch")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-spark", action="store_true", help="skip the Spark job figures")
    ap.add_argument("--stream", action="store_true", help="run the streaming job (see above)")
    ap.add_argument("--ratio-only", action="store_true", help="print only the 10x check")
    ap.add_argument("--batches", type=int, default=8, help="--stream: micro-batches per stream")
    ap.add_argument("--from-commits", action="store_true",
                    help="--stream: read bronze's commits from version 0, as a live stream "
                         "reads new commits, not a new checkpoint's starting snapshot")  # fmt: skip
    ap.add_argument("--default-allocators", action="store_true",
                    help="keep the allocators' environment as it is (see ALLOCATOR_ENV)")  # fmt: skip
    args = ap.parse_args(argv)
    # glibc and mimalloc (pyarrow's pool) read these at start-up only: re-run this
    # process with them set, so its figures are those of a tuned job (docs/performance.md).
    if (
        not args.default_allocators
        and argv is None
        and any(os.environ.get(k) != v for k, v in ALLOCATOR_ENV.items())
    ):
        os.environ.update(ALLOCATOR_ENV)
        os.execv(sys.executable, [sys.executable, *sys.argv])
    print("allocators: tune_malloc(), " + ", ".join(
        f"{k}={os.environ.get(k, 'unset')}" for k in ALLOCATOR_ENV))  # fmt: skip
    tune_malloc()
    kinds = StatisticKinds.load()
    seed = to_registry(seed_table(kinds))
    mixed, mreg, _ = mixed_stream(args.records)
    queue, _qreg = queue_stream(args.records)
    for s in mreg:
        seed.add(s)
    # Warm the kernels (numba compile or cache load) outside the timings.
    decode_arrow(bronze_batches(mixed[:50], 50)[0], seed.copy(), 0, kinds)
    if not args.stream:
        ratio_check(mixed, seed, args.small)
        if args.ratio_only:
            return 0
    spark = None
    if not args.no_spark:
        from pipeline.spark import get_spark

        spark = get_spark("qmf-bench-silver")
        spark.sparkContext.setLogLevel("ERROR")
    work = tempfile.mkdtemp(prefix="bench-silver-")
    try:
        if args.stream:
            for name, bodies in (("mixed", mixed), ("queue-i", queue)):
                stream_run(name, bodies, seed, args.large, args.batches, work, spark,
                           args.from_commits)  # fmt: skip
            return 0
        for name, bodies in (("mixed", mixed), ("queue-i", queue)):
            for size in (args.small, args.large):
                n_msgs = len(bodies)
                if size == args.small:  # small batches: a bounded number of them
                    n_msgs = min(n_msgs, size * 12)
                run(name, bodies[:n_msgs], seed, size, args.repeat, spark, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if spark is not None:
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
