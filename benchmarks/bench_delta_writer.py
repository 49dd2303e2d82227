"""Where delta-spark's write time goes for bronze-shaped rows (issue 48).

The same N bronze rows (500-byte bodies, a 4-entry ``application_properties`` map,
bronze's schema) written by: pyarrow (one process, the baseline of the run), delta-rs
(``write_deltalake``), and Spark from Python tasks (``mapInArrow``, as a bronze job
reads its landing ranges) into the ``noop`` sink (the Arrow-to-row cost alone), Parquet,
and Delta with and without its file statistics; then the same Spark paths without the
map column, and without the map and the body. Each line prints rows/s and the ratio to
the pyarrow baseline; every Spark figure is the second run of its path (the first
compiles and creates the table).

Usage (about 2 minutes on 2 quiet cores):

    .venv/bin/python benchmarks/bench_delta_writer.py [--rows 400000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from schemas.tables import BRONZE


def bronze_rows(n: int) -> pa.Table:
    """``n`` bronze-shaped rows: a v2 data indication's properties and a 500-byte body."""
    rng = np.random.default_rng(1)
    bodies = [bytes(rng.integers(0, 255, 500, dtype=np.uint8)) for _ in range(1000)]
    props = [("qmf.opcode", "_data_indication"), ("qmf.agent", "apache.org:qpidd:96e8ff02"),
             ("method", "indication"), ("qmf.content", "_data")]  # fmt: skip
    cols = {
        "partition": ["p0"] * n, "offset": np.arange(n), "msg_key": [f"{i:032x}" for i in range(n)],
        "received_at": pa.array(1_796_000_000_000_000 + np.arange(n), pa.timestamp("us", "UTC")),
        "routing_key": ["agent.ind.data.org_apache_qpid_broker.queue"] * n,
        "subject": ["qmf.default.topic"] * n, "message_id": [None] * n, "correlation_id": [None] * n,
        "reply_to": [None] * n, "app_id": ["qmf2"] * n, "content_type": ["amqp/list"] * n,
        "application_properties": pa.array([props] * n, pa.map_(pa.string(), pa.string())),
        "body": [bodies[i % len(bodies)] for i in range(n)], "redelivered": [False] * n,
        "batch_id": [0] * n,
    }  # fmt: skip
    return pa.table(cols).cast(BRONZE)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=400_000)
    args = p.parse_args()
    n = args.rows
    table = bronze_rows(n)
    out = tempfile.mkdtemp(prefix="bench-delta-writer-")
    base = 0.0

    def timed(label: str, f: Callable[[], object]) -> None:
        nonlocal base
        t = time.perf_counter()
        f()
        dt = time.perf_counter() - t
        base = base or n / dt
        print(f"{label:58s} {dt:6.2f} s {n / dt:12,.0f} rows/s  {n / dt / base:5.2f}x", flush=True)

    try:
        timed("pyarrow write_table, 1 process (baseline)",
              lambda: pq.write_table(table, f"{out}/a.parquet", compression="snappy"))  # fmt: skip
        from deltalake import write_deltalake

        timed("delta-rs write_deltalake", lambda: write_deltalake(f"{out}/rs", table))
        from pyspark.sql.pandas.types import from_arrow_schema

        from pipeline.spark import get_spark

        spark = get_spark("bench-delta-writer")
        src = f"{out}/src"
        os.makedirs(src)
        half = n // 2
        pq.write_table(table.slice(0, half), f"{src}/0.parquet")
        pq.write_table(table.slice(half), f"{src}/1.parquet")
        for label, cols in (
            ("", BRONZE.names),
            ("no map: ", [c for c in BRONZE.names if c != "application_properties"]),
            ("no map or body: ",
             [c for c in BRONZE.names if c not in ("application_properties", "body")]),
        ):  # fmt: skip
            schema = from_arrow_schema(pa.schema([BRONZE.field(c) for c in cols]))

            def gen(it: Iterator[pa.RecordBatch], cols: list[str] = cols) -> Iterator[pa.RecordBatch]:
                for b in it:
                    for i in b.column(0).to_pylist():
                        yield from pq.read_table(f"{src}/{i}.parquet", columns=cols).to_batches(10_000)

            def df(schema: object = schema, gen: object = gen) -> object:
                return spark.range(0, 2, numPartitions=2).selectExpr("cast(id as int) id").mapInArrow(gen, schema)  # type: ignore[arg-type]

            tag = f"{out}/{len(cols)}"
            paths: list[tuple[str, Callable[[int], None]]] = [
                ("noop", lambda k, df=df: df().write.format("noop").mode("overwrite").save()),  # type: ignore[attr-defined]
                ("parquet", lambda k, df=df, t=tag: df().write.mode("overwrite").parquet(f"{t}-pq")),  # type: ignore[attr-defined]
                ("delta", lambda k, df=df, t=tag: df().write.format("delta").mode("append").save(f"{t}-d")),  # type: ignore[attr-defined]
                ("delta, stats.collect=false",
                 lambda k, df=df, t=tag: df().write.format("delta").mode("append").save(f"{t}-s")),  # type: ignore[attr-defined]
            ]  # fmt: skip
            for name, write in paths:
                stats = "false" if "stats" in name else "true"
                spark.conf.set("spark.databricks.delta.stats.collect", stats)
                write(0)  # compile, create the table
                timed(f"spark mapInArrow -> {label}{name}", lambda write=write: write(1))  # type: ignore[misc]
        spark.stop()
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
