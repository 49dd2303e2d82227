"""qpidd names its min/max/average statistics differently in v1 schemas and v2 maps.

Its generated code (and its traffic) says ``messageLatencySamples`` /
``messageLatencyAverage`` in the v1 schema and ``messageLatencyCount`` /
``messageLatencyAvg`` in the v2 ``_values`` map; ``Min``/``Max`` are alike. Before
the alias, those two statistics were empty in every V2 queue sample of a live qpidd.
"""

from __future__ import annotations

import base64
import os

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.codec.capture import read_capture
from pipeline.codec.layout import slot_kind
from pipeline.codec.schema import ClassSchema, Element, SchemaKey
from pipeline.codec.seed import seeded_registry
from pipeline.codec.vectorized import decode_content


def _queue() -> ClassSchema:
    return next(s for s in seeded_registry() if s.key.name == "queue")


def test_v2_names_alias_only_complete_min_max_average_groups() -> None:
    q = _queue()
    renamed = {
        e.name: v2
        for e, v2 in zip((*q.properties, *q.statistics), q.v2_names, strict=True)
        if e.name != v2
    }
    assert renamed == {
        "messageLatencySamples": "messageLatencyCount",
        "messageLatencyAverage": "messageLatencyAvg",
    }
    lone = ClassSchema(
        key=SchemaKey("p", "c", b"\x00" * 16),
        statistics=(Element("xSamples", 4), Element("yAverage", 4), Element("yMin", 4)),
    )
    assert lone.v2_names == ("xSamples", "yAverage", "yMin")  # no Min+Max pair: left alone


def test_live_qpidd_v2_queue_samples_carry_the_latency_statistics(shared_dir: str) -> None:
    path = os.path.join(shared_dir, "samples", "qpidd-amqp10", "qmf1-qmf2-60s.jsonl")
    rows = [m.to_json() for m in read_capture(path)]
    batch = pa.table({
        "body": pa.array([base64.b64decode(r["body_base64"]) for r in rows], pa.binary()),
        "routing_key": pa.array([r["routing_key"] for r in rows], pa.string()),
        "content_type": pa.array([r.get("content_type") for r in rows], pa.string()),
        "application_properties": pa.array(
            [list((r.get("application_properties") or {}).items()) for r in rows],
            pa.map_(pa.string(), pa.string()),
        ),
    })  # fmt: skip
    fast = decode_content(batch, seeded_registry(), compact=True)
    slow = decode_content(batch, seeded_registry(), compact=True, v2_kernel=False)
    assert fast.v2_messages == 392
    assert fast.table.equals(slow.table)
    q = _queue()
    position: dict[str, tuple[str, int]] = {}
    used = {"ints": 0, "floats": 0, "texts": 0}
    for e in (*q.properties, *q.statistics):
        kind = slot_kind(e.type_code)
        position[e.name] = (kind, used[kind])
        used[kind] += 1
    queues = fast.table.filter(pc.equal(fast.table["class_name"], "queue")).to_pylist()
    for dialect, samples in (("V2", 190), ("AM2", 190)):
        mine = [r for r in queues if r["dialect"] == dialect and r["ints"] and r["ints"][position["msgTotalEnqueues"][1]] is not None]
        assert len(mine) == samples, dialect
        for name in ("messageLatencySamples", "messageLatencyMin", "messageLatencyMax", "messageLatencyAverage"):
            kind, i = position[name]
            assert all(r[kind][i] is not None for r in mine), (dialect, name)
