"""Content decoding throughput: vectorized (numba over Arrow) vs the per-record codec, same run.

Two streams, decoded on one core (the process is single-threaded):

(a) queue-class 'i' statistics, 100 records per AM2 message (qpidd's batching),
    class schema from qpid's management XML (47 statistics, 2 of them str8);
(b) a mixed c/i/g stream like the real capture: its 200 AM2 content messages
    (11 classes, 932 records, c+i mixed in one message), repeated.

For each stream it prints records/s of ``decode_content`` (the Arrow tables
built, per-class wide tables) and of the per-record path (``decode_message``
per message, the codec's ObjectSample records; no table built, so the ratio
favours the per-record path), by CPU time (``time.process_time``, what one
core delivers even when other processes share the machine) and by wall time,
plus their ratio. The numba first call (compile, or cache load with
``cache=True``) is timed separately and excluded. Usage:

    .venv/bin/python benchmarks/bench_decode.py [--records 200000] [--batch 1000]
    NUMBA_CACHE_DIR=$(mktemp -d) .venv/bin/python benchmarks/bench_decode.py  # cold compile
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from pipeline import qmfxml
from pipeline.codec.capture import read_capture
from pipeline.codec.message import decode_message
from pipeline.codec.records import ObjectSample
from pipeline.codec.schema import SchemaRegistry
from pipeline.codec.types import Am2ObjectId
from pipeline.codec.v1 import encode_records

SHARED = os.environ.get(
    "QMF_SHARED_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "shared")
)


def queue_stream(n_records: int) -> tuple[list[bytes], SchemaRegistry]:
    """AM2 'i' records of the broker queue class, 100 per message (20 distinct messages, repeated)."""
    reg = qmfxml.default_schema().registry()
    q = qmfxml.default_schema().get("org.apache.qpid.broker", "queue").schema
    distinct = []
    for m in range(20):
        recs = []
        for j in range(100):
            i = m * 100 + j
            values: dict[str, Any] = {}
            for e in q.statistics:
                t = e.type_code
                values[e.name] = (
                    f"queue-{i}" if t == 6 else bool(i & 1) if t == 11 else (i * 7919 + len(e.name)) % (1 << 31)
                )
            recs.append(
                ObjectSample(
                    dialect="AM2", opcode="i", seq=0, package=q.key.package,
                    class_name=q.key.name, schema_hash=q.key.hash,
                    update_ns=1_700_000_000_000_000_000 + i, create_ns=1_700_000_000_000_000_000,
                    delete_ns=0, object_id=Am2ObjectId(0, 1, 1, 0, 1000 + i), values=values,
                )
            )  # fmt: skip
        distinct.append(encode_records(recs, reg))
    n_msgs = max(1, n_records // 100)
    return [distinct[i % len(distinct)] for i in range(n_msgs)], reg


def mixed_stream(n_records: int) -> tuple[list[bytes], SchemaRegistry, int]:
    """The capture's AM2 content messages, repeated to about n_records records."""
    reg = SchemaRegistry()
    content: list[bytes] = []
    per_pass = 0
    for m in read_capture(os.path.join(SHARED, "samples", "qpidd-capture-20s.jsonl")):
        res = m.decode(reg)
        if res.records and all(isinstance(r, ObjectSample) for r in res.records) and m.body[:3] == b"AM2":
            content.append(m.body)
            per_pass += len(res.records)
    reps = max(1, n_records // per_pass)
    return content * reps, reg, per_pass * reps


def batches(bodies: Sequence[bytes], size: int) -> list[pa.Table]:
    out = []
    for i in range(0, len(bodies), size):
        chunk = bodies[i : i + size]
        out.append(
            pa.table(
                {
                    "msg_key": [f"k{i + j}" for j in range(len(chunk))],
                    "body": pa.array(chunk, pa.binary()),
                }
            )
        )
    return out


def timed(fn: Callable[[], int], repeat: int) -> tuple[float, float, int]:
    """Best (cpu s, wall s) over ``repeat`` runs, and the records the run returned."""
    best_cpu = best_wall = float("inf")
    n = 0
    for _ in range(repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        n = fn()
        best_cpu = min(best_cpu, time.process_time() - c0)
        best_wall = min(best_wall, time.perf_counter() - w0)
    return best_cpu, best_wall, n


def run(name: str, bodies: list[bytes], reg: SchemaRegistry, batch: int, per_record_msgs: int, repeat: int) -> dict[str, float]:
    from pipeline.codec.vectorized import decode_content

    tables = batches(bodies, batch)

    def vectorized() -> int:
        n = 0
        for t in tables:
            res = decode_content(t, reg)
            assert res.fallback_messages == 0, res.fallback_reasons
            n += sum(x.num_rows for x in res.samples.values())
        return n

    sub = bodies[:per_record_msgs]

    def per_record() -> int:
        n = 0
        r = reg.copy()
        for b in sub:
            res = decode_message(b, registry=r)
            assert not res.problems
            n += len(res.records)
        return n

    def per_record_tables() -> int:
        """The same output as the vectorized path: records, then the per-class tables."""
        from pipeline.codec.schema import SchemaKey
        from pipeline.codec.vectorized import records_to_table

        r = reg.copy()
        by_class: dict[SchemaKey, list[tuple[str, int, Any]]] = {}
        for k, b in enumerate(sub):
            res = decode_message(b, registry=r)
            for i, rec in enumerate(res.records):
                if isinstance(rec, ObjectSample):
                    key = SchemaKey(rec.package, rec.class_name, rec.schema_hash)
                    by_class.setdefault(key, []).append((f"k{k}", i, rec))
        n = 0
        for key, items in by_class.items():
            schema = r.get(key)
            assert schema is not None
            n += records_to_table(items, schema).num_rows
        return n

    v_cpu, v_wall, v_n = timed(vectorized, repeat)
    p_cpu, p_wall, p_n = timed(per_record, max(1, repeat // 2))
    t_cpu, t_wall, t_n = timed(per_record_tables, 1)
    v_rate, p_rate, t_rate = v_n / v_cpu, p_n / p_cpu, t_n / t_cpu
    print(f"\n[{name}] {v_n:,} records in {len(bodies):,} messages, batches of {batch} messages")
    print(f"  vectorized (Arrow tables)     : {v_rate:>11,.0f} rec/s cpu  {v_n / v_wall:>11,.0f} rec/s wall")
    print(f"  per-record (records only)     : {p_rate:>11,.0f} rec/s cpu  {p_n / p_wall:>11,.0f} rec/s wall  ({p_n:,} records)")
    print(f"  per-record + same Arrow tables: {t_rate:>11,.0f} rec/s cpu  {t_n / t_wall:>11,.0f} rec/s wall")
    print(f"  ratio vs records only         : {v_rate / p_rate:>11.1f} x cpu   {(v_n / v_wall) / (p_n / p_wall):>11.1f} x wall")
    print(f"  ratio vs same tables          : {v_rate / t_rate:>11.1f} x cpu   {(v_n / v_wall) / (t_n / t_wall):>11.1f} x wall")
    return {"vectorized": v_rate, "per_record": p_rate, "ratio": v_rate / p_rate, "ratio_tables": v_rate / t_rate}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000, help="records per stream (vectorized)")
    ap.add_argument("--batch", type=int, default=200, help="messages per Arrow batch, stream (a)")
    ap.add_argument("--mixed-batch", type=int, default=10000, help="messages per batch, stream (b) (Spark default maxRecordsPerBatch)")
    ap.add_argument("--per-record-messages", type=int, default=300, help="messages for the per-record path")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tune-malloc", action="store_true", help="vectorized.tune_malloc() first")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    from pipeline.codec import vectorized

    if args.tune_malloc:
        print(f"tune_malloc: {vectorized.tune_malloc()}")

    q_bodies, q_reg = queue_stream(args.records)
    warm = batches(q_bodies[:2], 2)[0]
    c0 = time.perf_counter()
    vectorized.decode_content(warm, q_reg)
    first = time.perf_counter() - c0
    print(f"numba first call (compile or cache load, excluded below): {first:.2f} s"
          f"  (cache dir: {os.environ.get('NUMBA_CACHE_DIR', 'pipeline/codec/__pycache__')})")
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")

    a = run("a: queue 'i', 100 per message", q_bodies, q_reg, args.batch, args.per_record_messages, args.repeat)
    m_bodies, m_reg, _ = mixed_stream(args.records)
    mixed_batch = args.mixed_batch
    b = run("b: mixed c/i/g like the capture", m_bodies, m_reg, mixed_batch, args.per_record_messages * 20, args.repeat)
    print("\ntargets: (a) >= 2,000,000/s, (b) >= 1,000,000/s, >= 20x per-record")
    for tag, r, target in (("a", a, 2e6), ("b", b, 1e6)):
        print(f"({tag}) {r['vectorized']:,.0f}/s {'MET' if r['vectorized'] >= target else 'NOT MET'}; "
              f"{r['ratio']:.1f}x vs records only {'MET' if r['ratio'] >= 20 else 'NOT MET'}; "
              f"{r['ratio_tables']:.1f}x vs same tables {'MET' if r['ratio_tables'] >= 20 else 'NOT MET'}")
    print(f"total run {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
