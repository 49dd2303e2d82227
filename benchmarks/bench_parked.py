"""What a late schema costs: content parked in one batch, decoded when its schema comes.

Bronze of ``--messages`` AM2 messages of a class the registry does not know
(``org.bench:widget``, ``--records`` records each: properties and statistics), in
two runs of silver's batch writer on the task path (``decode_on="tasks"``,
``local[2]``), same run, same bronze:

* ``known`` (the baseline): the schema comes in batch 0, the content in batch 1,
  which decodes at once (the steady state: the registry knows the class);
* ``together``: one batch, the schema first, then the content (a consumer that
  starts with an agent: the schema is met in the batch, not in the registry);
* ``late``: batch 0 is the content alone, so every message parks (tasks write
  ``parked`` files, the driver keeps a summary by key); batch 1 is the schema,
  so every parked message is decoded again by tasks that read the ``parked``
  table (``pipeline.silver.tasks.resolve_task``).

Before Spark, the codec alone (``decode_content(compact=True)``, one process, no
Spark) decodes the same messages with the class known and with its schema first in
the batch (``codec_together_over_known``: until 2026-11-28 that content went per
record, 136x slower; now the batch is cut after the schema and stays on the kernels).

Prints each batch's wall time, records/s, the ratio of ``late`` (both batches) to
``known``, the parked bytes, and the driver's memory: the Python driver's RSS
growth and the driver JVM's heap in use after each batch. The parked messages
never pass through the driver (before 2026-11-28 every one of them came back to
it and stayed there until its schema came). The last line is ``RESULT {json}``.

Usage (about 2 minutes on 2 idle cores at the defaults):

    .venv/bin/python benchmarks/bench_parked.py [--messages 20000] [--records 50]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from pipeline.codec.capture import CapturedMessage
from pipeline.codec.records import Am2ObjectId, ObjectSample
from pipeline.codec.schema import ClassSchema, Element, SchemaKey, SchemaRegistry
from pipeline.codec.v1 import encode_records, schema_response_for
from pipeline.lake import delta

WIDGET = ClassSchema(
    key=SchemaKey("org.bench", "widget", b"\x05" * 16),
    properties=(Element("name", 6, access=1, index=True), Element("size", 3, access=3)),
    statistics=(Element("count", 4), Element("bytes", 4), Element("temp", 13)),
)
T0 = 1_795_338_000_000_000_000
NOW = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")  # parked this run: not stale


def _message(first: int, records: int) -> CapturedMessage:
    recs = []
    for i in range(records):
        n = first + i
        values = {"name": f"w{n}", "size": i, "count": 7 * i, "bytes": 11 * i, "temp": i + 0.5}
        rec = ObjectSample(
            dialect="AM2", opcode="g", seq=n, package="org.bench", class_name="widget",
            schema_hash=WIDGET.key.hash, update_ns=T0 + n, create_ns=T0, delete_ns=0,
            object_id=Am2ObjectId(0, 1, 1, 0, n), values=values, agent="1.0",
        )  # fmt: skip
        recs.append(rec)
    return CapturedMessage(
        body=encode_records(recs, SchemaRegistry([WIDGET])),
        routing_key="console.obj.1.0.org.bench.widget",
        received_at=NOW,
    )


def _announce() -> CapturedMessage:
    return CapturedMessage(
        body=encode_records([schema_response_for(WIDGET, "AM2")], SchemaRegistry()),
        routing_key="console.schema.1.0.org.bench.widget",
        received_at=NOW,
    )


def _codec(content: Sequence[CapturedMessage], records: int) -> dict[str, float]:
    """Seconds of ``decode_content`` over the content, class known vs schema first in the batch."""
    import pyarrow as pa

    from pipeline.codec.vectorized import decode_content

    def table(msgs: Sequence[CapturedMessage]) -> pa.Table:
        return pa.table(
            {
                "body": pa.array([m.body for m in msgs], pa.binary()),
                "routing_key": [m.routing_key for m in msgs],
            }
        )

    def known() -> SchemaRegistry:
        return SchemaRegistry([WIDGET])

    runs: dict[str, tuple[pa.Table, Callable[[], SchemaRegistry]]] = {
        "known": (table(content), known),
        "together": (table([_announce(), *content]), SchemaRegistry),
    }
    out: dict[str, float] = {}
    for name, (t, registry) in runs.items():
        decode_content(t, registry(), compact=True)  # warm-up (numba, caches)
        best = float("inf")
        for _ in range(3):
            reg = registry()
            t0 = time.perf_counter()
            res = decode_content(t, reg, compact=True)
            best = min(best, time.perf_counter() - t0)
        assert res.table is not None and res.table.num_rows == records, (name, res.fallback_reasons)
        out[name] = best
    return out


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _heap_mb(spark: Any) -> float:
    rt = spark.sparkContext._jvm.java.lang.Runtime.getRuntime()
    return float(rt.totalMemory() - rt.freeMemory()) / 2**20


def _run(spark: Any, root: str, batches: Sequence[Sequence[CapturedMessage]]) -> list[dict[str, Any]]:
    from pipeline.silver import (
        SilverBatchWriter,
        SilverSettings,
        bronze_rows,
        run_silver_batch,
        write_bronze,
    )

    s = SilverSettings(
        bronze=os.path.join(root, "bronze"), root=os.path.join(root, "silver"), decode_on="tasks"
    )
    writer = SilverBatchWriter(s, app_id="bench-parked")
    out = []
    offset = 0
    for k, msgs in enumerate(batches):
        write_bronze(s.bronze, [bronze_rows(msgs, first_offset=offset, batch_id=k)])
        offset += len(msgs)
        rss0 = _rss_mb()
        t0 = time.perf_counter()
        r = run_silver_batch(spark, s, k, app_id="bench-parked", batch_ids=(k, k), writer=writer)
        wall = time.perf_counter() - t0
        out.append(
            {
                "batch": k,
                "seconds": round(wall, 3),
                "samples": r.rows.get("object_samples", 0),
                "parked": r.rows.get("parked", 0),
                "resolved": r.resolved,
                "resolved_on": r.resolved_on,
                "driver_rss_growth_mb": round(_rss_mb() - rss0, 1),
                "driver_heap_mb": round(_heap_mb(spark), 1),
            }
        )
    parked = delta.snapshot_files(s.path("parked"))[2]
    out[-1]["parked_bytes"] = sum(os.path.getsize(f.local_path) for f in parked)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--records", type=int, default=50, help="records per message")
    ap.add_argument("--distinct", type=int, default=200, help="distinct bodies (repeated)")
    ap.add_argument("--master", default="local[2]")
    a = ap.parse_args(argv)
    from pipeline.spark import get_spark

    spark = get_spark("bench-parked", master=a.master)
    bodies = [_message(i * a.records, a.records) for i in range(a.distinct)]
    content = [bodies[i % a.distinct] for i in range(a.messages)]
    records = a.messages * a.records
    results: dict[str, Any] = {"messages": a.messages, "records": records, "master": a.master}
    codec = _codec(content, records)
    print(f"codec alone: class known {codec['known']:.3f} s, schema first in the batch "
          f"{codec['together']:.3f} s ({codec['together'] / codec['known']:.2f}x)")  # fmt: skip
    results["codec_known_s"] = round(codec["known"], 3)
    results["codec_together_s"] = round(codec["together"], 3)
    results["codec_together_over_known"] = round(codec["together"] / codec["known"], 2)
    with tempfile.TemporaryDirectory(prefix="bench-parked-") as tmp:
        # A warm-up run of both kinds of batch (Python workers, numba), not measured.
        _run(spark, os.path.join(tmp, "warm"), [content[: a.distinct], [_announce()]])
        known = _run(spark, os.path.join(tmp, "known"), [[_announce()], content])
        together = _run(spark, os.path.join(tmp, "together"), [[_announce(), *content]])
        late = _run(spark, os.path.join(tmp, "late"), [content, [_announce()]])
    for name, rows in (("known", known), ("together", together), ("late", late)):
        for r in rows:
            print(f"{name:8s} batch {r['batch']}: {r['seconds']:7.2f} s  samples {r['samples']:>9,}"
                  f"  parked {r['parked']:>7,}  resolved {r['resolved']:>7,} {r['resolved_on']:6s}"
                  f"  driver RSS +{r['driver_rss_growth_mb']} MB, JVM heap {r['driver_heap_mb']} MB")  # fmt: skip
    t_known = known[1]["seconds"]
    t_late = sum(r["seconds"] for r in late)
    assert known[1]["samples"] == records and late[1]["samples"] == records, (known, late)
    assert late[0]["parked"] == a.messages and late[1]["resolved"] == a.messages, late
    results.update(
        {
            "known_s": t_known,
            "known_records_per_s": round(records / t_known),
            "together_s": together[0]["seconds"],
            "together_over_known": round(together[0]["seconds"] / t_known, 2),
            "late_park_s": late[0]["seconds"],
            "late_resolve_s": late[1]["seconds"],
            "late_records_per_s": round(records / t_late),
            "late_over_known": round(t_late / t_known, 2),
            "parked_bytes": late[-1]["parked_bytes"],
            "driver_rss_growth_mb": max(r["driver_rss_growth_mb"] for r in late),
            "driver_heap_mb": max(r["driver_heap_mb"] for r in late),
        }
    )
    print(f"late schema: {t_late:.2f} s (both batches) against {t_known:.2f} s known "
          f"({results['late_over_known']}x); {results['parked_bytes'] / 2**20:.1f} MiB parked")  # fmt: skip
    print("RESULT " + json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
