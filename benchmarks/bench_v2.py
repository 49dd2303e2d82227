"""QMF v2 data indications on the compact fast path, against its baselines in the same run.

Streams (real qpidd traffic, messages repeated to fill the batches):

(a) the QMF v2 ``_data`` indications of ``qpidd-amqp10/qmf1-qmf2-60s.jsonl``
    (AMQP 1.0 ``amqp-value`` bodies), decoded by ``decode_content(compact=True)``;
(b) the same messages through the per-record path (``v2_kernel=False``: what
    ``decode_content`` did with every v2 message before, the same output table);
(c) the AM2 content messages (c/i/g) of the same capture: the same broker, objects
    and period in QMF v1, decoded by the compact kernel path;
and the same three for the AMQP 0-10 encoded v2 of ``qpidd-capture-20s.jsonl``.

For each batch size (messages per Arrow batch), every measurement is taken in
turn within each pass (interleaved), and each figure is the best of the passes:
records/s and body bytes/s by CPU time (``time.process_time``: one core's
throughput, robust to other processes; the decode of these batches is single
threaded) and by wall time. Printed: the ratios v2 fast / per-record (target
>= 20x) and v2 bytes/s / AM2 bytes/s (target >= 1.0), then ``RESULT {json}``.

    flock /tmp/qmf-heavy.lock .venv/bin/python benchmarks/bench_v2.py [--batches 200,2000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from pipeline.codec.capture import CapturedMessage, read_capture
from pipeline.codec.records import ObjectSample
from pipeline.codec.schema import SchemaRegistry
from pipeline.codec.vectorized import decode_content

SHARED = os.environ.get(
    "QMF_SHARED_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "shared")
)
AMQP10 = os.path.join(SHARED, "samples", "qpidd-amqp10", "qmf1-qmf2-60s.jsonl")
AMQP010 = os.path.join(SHARED, "samples", "qpidd-capture-20s.jsonl")


def load(
    path: str,
) -> tuple[list[CapturedMessage], list[CapturedMessage], SchemaRegistry, int, int]:
    """(v2 data indications, AM2 content messages, registry, their records per pass)."""
    msgs = list(read_capture(path))
    reg = SchemaRegistry()
    v2: list[CapturedMessage] = []
    am2: list[CapturedMessage] = []
    v2_recs = am2_recs = 0
    for m in msgs:
        res = m.decode(reg)
        ap = m.application_properties
        if ap.get("qmf.opcode") == "_data_indication" and ap.get("qmf.content") == "_data":
            assert not res.problems, res.problems
            v2.append(m)
            v2_recs += len(res.records)
        elif (
            m.body[:3] == b"AM2"
            and res.records
            and not res.problems
            and all(isinstance(r, ObjectSample) for r in res.records)
        ):
            am2.append(m)
            am2_recs += len(res.records)
    return v2, am2, reg, v2_recs, am2_recs


def table_of(msgs: Sequence[CapturedMessage], first: int) -> pa.Table:
    """A bronze-like Arrow batch (the columns decode_content reads)."""
    return pa.table(
        {
            "msg_key": [f"k{first + i}" for i in range(len(msgs))],
            "routing_key": [m.routing_key for m in msgs],
            "content_type": [m.content_type for m in msgs],
            "application_properties": pa.array(
                [[(str(k), str(v)) for k, v in m.application_properties.items()] for m in msgs],
                pa.map_(pa.string(), pa.string()),
            ),
            "body": pa.array([m.body for m in msgs], pa.binary()),
        }
    )


def batches(msgs: list[CapturedMessage], size: int, total: int) -> list[pa.Table]:
    """``total`` messages (the sample repeated) in batches of ``size``."""
    stream = [msgs[i % len(msgs)] for i in range(total)]
    return [table_of(stream[i : i + size], i) for i in range(0, total, size)]


class Measure:
    """One measurement: best CPU and wall seconds over the passes, records and bytes per run."""

    def __init__(self, name: str, tables: list[pa.Table], fn: Callable[[pa.Table], int]) -> None:
        self.name, self.tables, self.fn = name, tables, fn
        self.bytes = sum(t.column("body").combine_chunks().buffers()[2].size for t in tables)
        self.cpu = self.wall = float("inf")
        self.records = 0

    def once(self) -> None:
        c0, w0 = time.process_time(), time.perf_counter()
        n = sum(self.fn(t) for t in self.tables)
        self.cpu = min(self.cpu, time.process_time() - c0)
        self.wall = min(self.wall, time.perf_counter() - w0)
        self.records = n

    def figures(self) -> dict[str, float]:
        return {
            "records": self.records,
            "bytes": self.bytes,
            "rec_s": self.records / self.cpu,
            "bytes_s": self.bytes / self.cpu,
            "rec_s_wall": self.records / self.wall,
            "bytes_s_wall": self.bytes / self.wall,
        }


def fast(reg: SchemaRegistry, want_v2: bool) -> Callable[[pa.Table], int]:
    def run(t: pa.Table) -> int:
        res = decode_content(t, reg, compact=True)
        assert res.fallback_messages == 0, res.fallback_reasons  # all on the kernels
        assert res.v2_messages == (t.num_rows if want_v2 else 0)
        assert res.table is not None
        return int(res.table.num_rows)

    return run


def per_record(reg: SchemaRegistry) -> Callable[[pa.Table], int]:
    def run(t: pa.Table) -> int:
        res = decode_content(t, reg, compact=True, v2_kernel=False)
        assert res.fallback_messages == t.num_rows and not res.quarantine.num_rows
        assert res.table is not None
        return int(res.table.num_rows)

    return run


def stream(
    label: str, path: str, sizes: Sequence[int], total: int, per_record_total: int, passes: int
) -> dict[str, Any]:
    v2, am2, reg, v2_recs, am2_recs = load(path)
    print(
        f"\n[{label}] {os.path.basename(path)}: {len(v2)} v2 data indications ({v2_recs} records,"
        f" {sum(len(m.body) for m in v2) / v2_recs:.0f} body bytes per record);"
        f" {len(am2)} AM2 content messages ({am2_recs} records,"
        f" {sum(len(m.body) for m in am2) / am2_recs:.0f} bytes per record)"
    )
    out: dict[str, Any] = {}
    for size in sizes:
        n_fast = max(size, total // size * size)
        n_slow = max(size, min(n_fast, per_record_total) // size * size)
        ms = [
            Measure("v2 fast", batches(v2, size, n_fast), fast(reg, True)),
            Measure("v2 per-record", batches(v2, size, n_slow), per_record(reg)),
            Measure("AM2 fast", batches(am2, size, n_fast), fast(reg, False)),
        ]
        for m in ms:  # warm: numba cache load, the compiled registry, the value cache
            m.fn(m.tables[0])
        for _ in range(passes):
            for m in ms:
                m.once()
        f = {m.name: m.figures() for m in ms}
        speedup = f["v2 fast"]["rec_s"] / f["v2 per-record"]["rec_s"]
        bytes_ratio = f["v2 fast"]["bytes_s"] / f["AM2 fast"]["bytes_s"]
        print(f"  batches of {size} messages:")
        for name, x in f.items():
            print(
                f"    {name:<14} {x['rec_s']:>11,.0f} rec/s {x['bytes_s'] / 1e6:>8.1f} MB/s cpu"
                f"   {x['rec_s_wall']:>11,.0f} rec/s {x['bytes_s_wall'] / 1e6:>8.1f} MB/s wall"
                f"   ({x['records']:,} records, {x['bytes'] / 1e6:.1f} MB)"
            )
        print(
            f"    v2 fast / per-record: {speedup:6.1f}x  (target >= 20: "
            f"{'MET' if speedup >= 20 else 'NOT MET'});  v2 bytes/s / AM2 bytes/s: "
            f"{bytes_ratio:5.2f}  (target >= 1.0: {'MET' if bytes_ratio >= 1.0 else 'NOT MET'})"
        )
        out[str(size)] = {**f, "speedup": speedup, "bytes_ratio": bytes_ratio}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--batches", default="200,2000", help="messages per batch, comma separated")
    ap.add_argument("--messages", type=int, default=20_000, help="messages per fast measurement")
    ap.add_argument(
        "--per-record-messages", type=int, default=2_000, help="messages per per-record measurement"
    )
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.batches.split(",")]
    t0 = time.perf_counter()
    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    result = {
        "amqp10": stream(
            "AMQP 1.0 v2", AMQP10, sizes, args.messages, args.per_record_messages, args.passes
        ),
        "amqp010": stream(
            "AMQP 0-10 v2", AMQP010, sizes, args.messages, args.per_record_messages, args.passes
        ),
        "load_average": os.getloadavg()[0],
        "passes": args.passes,
    }
    print(f"\ntotal run {time.perf_counter() - t0:.1f} s")
    print("RESULT " + json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
