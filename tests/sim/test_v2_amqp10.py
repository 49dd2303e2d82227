"""The ``v2-amqp10`` dialect: QMF v2 as qpidd's AMQP 1.0 module sends it, and quiet objects.

The wire types are checked against what a real qpidd 1.40 sent over AMQP 1.0
(``../shared/samples/qpidd-amqp10``), decoded with proton like the receiver does.
"""

from __future__ import annotations

import base64
import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from pipeline.codec.records import Heartbeat, ObjectSample
from pipeline.qmfxml import default_schema
from pipeline.sim.capture import captured
from pipeline.sim.manifest import record_row
from pipeline.sim.model import NS, LoadConfig
from pipeline.sim.runner import MemorySink, SimConfig, Simulation
from receivers.publisher import amqp_value

from .conftest import START_NS


def run(**kw: Any) -> tuple[Simulation, MemorySink]:
    load = kw.pop("load", LoadConfig(queues=10))
    sink = MemorySink()
    sim = Simulation(SimConfig(start_ns=START_NS, load=load, **kw), sink)
    sim.run()
    return sim, sink


def decoded(sink: MemorySink) -> list[tuple[int, Any]]:
    reg = default_schema().registry()
    out: list[tuple[int, Any]] = []
    for i, m in enumerate(sink.messages):
        res = captured(m, 0).decode(reg)
        assert res.ok, res.problems
        out.extend((i, r) for r in res.records)
    return out


def _value(body: bytes) -> Any:
    """Binaries copied out of proton's buffer (``amqp_value``): its memoryviews die with it."""
    return amqp_value(body)


def _kind(v: Any) -> str:
    if isinstance(v, dict):
        return "map"
    if isinstance(v, list):
        return "list"
    name = type(v).__name__
    return "binary" if name == "bytes" else name


def _wire_types(bodies: Iterable[tuple[bytes, str | None]]) -> dict[tuple[str, str], set[str]]:
    """(class or opcode, field path) -> the AMQP 1.0 types seen there; map keys too."""
    out: dict[tuple[str, str], set[str]] = defaultdict(set)

    def walk(m: dict[Any, Any], cls: str, prefix: str) -> None:
        for k, v in m.items():
            out[(cls, prefix + "<key>")].add(_kind(k))
            out[(cls, prefix + k)].add(_kind(v))
            if isinstance(v, dict) and (k.startswith("_") or k.endswith("Ref")):
                walk(v, cls, f"{prefix}{k}.")

    for body, opcode in bodies:
        value = _value(body)
        for item in value if isinstance(value, list) else [value]:
            sid = item.get("_schema_id")
            walk(item, bytes(sid["_class_name"]).decode() if sid else str(opcode), "")
    return dict(out)


def test_decoded_messages_are_exactly_the_manifest() -> None:
    sim, sink = run(dialect="v2-amqp10", intervals=4, batch=7, restarts=[(0, 2)])
    assert {m.body_encoding for m in sink.messages} == {"amqp-1.0"}
    assert {m.app_id for m in sink.messages} == {None}  # qpidd sets no app-id over 1.0
    got = decoded(sink)
    rows = [r for r in sim.manifest.rows if r.get("source") == "publish"]
    assert len(got) == len(rows) == sim.summary.records
    for (i, rec), row in zip(got, rows, strict=True):
        assert i == row["message"]
        assert sink.messages[i].routing_key == row["routing_key"]
        assert record_row(rec) == {k: row[k] for k in record_row(rec)}
    # the same run in the 0-10 v2 dialect carries the same records (references aside:
    # qpidd's 1.0 module adds the agent epoch to them)
    sim010, sink010 = run(dialect="v2", intervals=4, batch=7, restarts=[(0, 2)])
    assert [m.routing_key for m in sink010.messages] == [m.routing_key for m in sink.messages]
    assert [m.content_type for m in sink010.messages] == [m.content_type for m in sink.messages]
    assert [m.application_properties for m in sink010.messages] == [
        m.application_properties for m in sink.messages
    ]
    assert sim010.summary.records == sim.summary.records


def test_wire_types_are_qpidds(shared_dir: str) -> None:
    """Every field both carry has qpidd's AMQP 1.0 type: keys strings, text binary, counters
    ulong, 32-bit counts uint, heartbeat ushorts, the hash a uuid, refs epoch + name."""
    real: list[tuple[bytes, str | None]] = []
    for name in ("default-60s", "qmf1-qmf2-60s"):
        path = Path(shared_dir) / "samples" / "qpidd-amqp10" / f"{name}.jsonl"
        for line in path.read_text().splitlines():
            m = json.loads(line)
            props = m["application_properties"]
            if props.get("x-qmf-body-encoding") == "amqp-1.0":
                real.append((base64.b64decode(m["body_base64"]), props.get("qmf.opcode")))
    _, sink = run(dialect="v2-amqp10", intervals=3, load=LoadConfig(queues=10))
    ours = _wire_types(
        (m.body, (m.application_properties or {}).get("qmf.opcode")) for m in sink.messages
    )
    theirs = _wire_types(real)
    common = sorted(set(ours) & set(theirs))
    assert len(common) >= 350
    differ = [(k, theirs[k], ours[k]) for k in common if theirs[k] != ours[k]]
    # qpidd writes these two as a plain 0 (int32) while no latency was sampled, although
    # its schema says uint64 (its generated Queue.cpp: Variant(0) when the count is 0)
    assert differ == [
        (("queue", "_values.messageLatencyAvg"), {"int32"}, {"ulong"}),
        (("queue", "_values.messageLatencyMin"), {"int32"}, {"ulong"}),
    ]
    assert ours[("queue", "_values.msgTotalEnqueues")] == {"ulong"}
    assert ours[("queue", "_values.consumerCount")] == {"uint"}
    assert ours[("queue", "_values.name")] == {"binary"}
    assert ours[("queue", "_values.<key>")] == {"str"}
    assert ours[("queue", "_schema_id._hash")] == {"UUID"}
    assert ours[("queue", "_object_id._agent_epoch")] == {"ulong"}
    assert ours[("queue", "_values.vhostRef._object_name")] == {"binary"}
    assert ours[("_agent_heartbeat_indication", "_values._epoch")] == {"ushort"}
    assert ours[("queueDeclare", "_severity")] == {"ubyte"}


def test_bodies_are_what_the_receiver_lands_for_them() -> None:
    """The receiver lands an amqp-value body as proton's encoding of the value: the
    simulator's body bytes are exactly that, so a sim capture file equals a receiver's."""
    from proton import Message

    from receivers.publisher import build_message
    from receivers.receiver import to_landed

    _, sink = run(dialect="v2-amqp10", intervals=2, load=LoadConfig(queues=6))
    for section in ("amqp-value", "amqp-sequence"):
        for m in sink.messages:
            wire = Message()
            wire.decode(build_message(m, section).encode())
            got = to_landed(wire, received_at_us=1)
            assert got.body == m.body
            cap = captured(m, 0)
            assert got.application_properties == {
                k: str(v) for k, v in cap.application_properties.items()
            }
            assert cap.application_properties["x-qmf-body-encoding"] == "amqp-1.0"


@pytest.mark.parametrize("dialect", ["v2", "v2-amqp10", "am2"])
def test_after_the_load_stops_only_changed_objects_are_published(dialect: str) -> None:
    """Like qpidd: a queue whose load stopped is not republished (its watermark reset
    once aside); broker and memory (uptime, malloc figures) and heartbeats go on."""
    load = LoadConfig(queues=8, active_fraction=1.0, watermark_prob=0.5)
    sim, sink = run(dialect=dialect, intervals=8, load_intervals=4, load=load)
    recs = decoded(sink)
    queue_names = {
        sim.agents[0].object_name(sim.agents[0].model.objects[n])
        for n in sim.agents[0].model.queue_nums
    }
    per_interval: dict[int, set[str]] = defaultdict(set)
    classes: dict[int, set[str]] = defaultdict(set)
    beats = []
    for _, r in recs:
        if isinstance(r, Heartbeat):
            beats.append(r.timestamp_ns)
        if isinstance(r, ObjectSample):
            k = (r.update_ns - START_NS) // NS - 1
            classes[k].add(r.class_name)
            if r.class_name == "queue" and r.delete_ns == 0:
                oid = r.object_id
                per_interval[k].add(getattr(oid, "object_name", None) or str(oid))
    assert beats == [START_NS + (k + 1) * NS for k in range(8)]
    if dialect != "am2":
        assert all(per_interval[k] == queue_names for k in range(4))  # all 8 active
    else:
        assert all(len(per_interval[k]) == 8 for k in range(4))
    # interval 4: only a queue whose High watermark resets changes; then nothing at all
    assert 0 < len(per_interval[4]) < 8
    assert [len(per_interval[k]) for k in (5, 6, 7)] == [0, 0, 0]
    assert all({"broker", "memory"} <= classes[k] for k in range(8))
    assert classes[7] == {"broker", "memory"}
    # the manifest lists exactly what went out, quiet intervals included
    rows = [r for r in sim.manifest.rows if r.get("source") == "publish"]
    assert len(rows) == len(recs) == sim.summary.records
    quiet = [r for r in rows if r["kind"] == "object" and r["class_name"] == "queue"
             and r["interval"] >= 5]  # fmt: skip
    assert quiet == []
