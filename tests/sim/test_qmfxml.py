"""qmfxml against qpid's XML and against what a real qpidd put on the wire."""

from __future__ import annotations

import os

import pytest

from pipeline.codec.capture import read_capture
from pipeline.codec.records import ClassIndication, SchemaResponse
from pipeline.codec.schema import KIND_EVENT, KIND_TABLE, SchemaRegistry
from pipeline.qmfxml import (
    COUNTER,
    GAUGE,
    MMA_AVERAGE,
    MMA_SAMPLES,
    STATE,
    WATERMARK,
    WATERMARK_HIGH,
    WATERMARK_LOW,
    SchemaXmlError,
    default_schema,
    parse_schema_xml,
)


def _real_schemas(shared_dir: str) -> dict[object, object]:
    reg = SchemaRegistry()
    out: dict[object, object] = {}
    for m in read_capture(os.path.join(shared_dir, "samples", "qpidd-capture-20s.jsonl")):
        for rec in m.decode(reg).records:
            if isinstance(rec, SchemaResponse):
                out[rec.schema.key] = rec.schema
    return out


def test_every_schema_of_the_real_broker_is_reproduced_exactly(shared_dir: str) -> None:
    real = _real_schemas(shared_dir)
    assert len(real) == 45  # 20 broker + 1 acl table classes, 24 event classes
    ours = default_schema()
    for key, schema in real.items():
        assert ours.get(key.package, key.name).schema == schema  # type: ignore[attr-defined]


def test_class_indications_of_the_real_broker_carry_our_hashes(shared_dir: str) -> None:
    ours = {(c.package, c.name): c.key.hash for c in default_schema()}
    reg = SchemaRegistry()
    seen = 0
    for m in read_capture(os.path.join(shared_dir, "samples", "qpidd-capture-20s.jsonl")):
        for rec in m.decode(reg).records:
            if isinstance(rec, ClassIndication):
                assert ours[(rec.package, rec.class_name)] == rec.schema_hash
                seen += 1
    assert seen == 45


def test_queue_class() -> None:
    q = default_schema().get("org.apache.qpid.broker", "queue")
    assert q.key.hash.hex() == "3db4e9111b6b1523a48b6855f4c5627b"
    assert q.xml_name == "Queue"
    assert [p.name for p in q.index_properties] == ["vhostRef", "name"]
    assert [p.name for p in q.schema.optional_properties] == ["altExchange"]
    assert q.schema.presence_octets == 1
    assert q.references == {"vhostRef": "vhost", "altExchange": "exchange"}
    assert q.parent_ref == "vhostRef"
    assert [(p.name, p.type_code, p.access) for p in q.schema.properties[:3]] == [
        ("vhostRef", 10, 1),
        ("name", 6, 1),
        ("durable", 11, 1),
    ]
    stats = [s.name for s in q.schema.statistics]
    assert len(stats) == 47
    i = stats.index("consumerCount")
    assert stats[i : i + 3] == ["consumerCount", "consumerCountHigh", "consumerCountLow"]
    j = stats.index("messageLatencySamples")
    assert stats[j : j + 4] == [
        "messageLatencySamples",
        "messageLatencyMin",
        "messageLatencyMax",
        "messageLatencyAverage",
    ]
    assert q.schema.statistics[i + 1].extra == {
        "unit": "consumer",
        "desc": "Current consumers on queue (High)",
    }
    kinds = {n: q.statistic_kind(n) for n in stats}
    assert kinds["msgTotalEnqueues"] == COUNTER
    assert kinds["msgDepth"] == GAUGE  # assign="msgTotalEnqueues - msgTotalDequeues"
    assert (kinds["consumerCount"], kinds["consumerCountHigh"], kinds["consumerCountLow"]) == (
        WATERMARK,
        WATERMARK_HIGH,
        WATERMARK_LOW,
    )
    assert (kinds["messageLatencySamples"], kinds["messageLatencyAverage"]) == (
        MMA_SAMPLES,
        MMA_AVERAGE,
    )
    assert kinds["flowStopped"] == STATE
    assert q.statistics["consumerCountHigh"].base == "consumerCount"
    purge = next(m for m in q.schema.methods if m.name == "purge")
    assert [(a.name, a.type_code, a.extra["dir"]) for a in purge.arguments] == [
        ("request", 3, "I"),
        ("filter", 15, "I"),
    ]


def test_counts_that_are_levels_are_gauges() -> None:
    s = default_schema()
    session = s.get("org.apache.qpid.broker", "session")
    assert session.statistic_kind("TxnCount") == GAUGE  # "Current pending transactions"
    assert session.statistic_kind("TxnStarts") == COUNTER
    assert s.get("org.apache.qpid.broker", "broker").statistic_kind("queueCount") == GAUGE


def test_events() -> None:
    ev = default_schema().get("org.apache.qpid.broker", "queueDeclare")
    assert ev.schema.kind == KIND_EVENT and ev.is_event
    assert ev.severity == 6
    assert [a.name for a in ev.schema.arguments] == [
        "rhost",
        "user",
        "qName",
        "durable",
        "excl",
        "autoDel",
        "altEx",
        "args",
        "disp",
    ]
    assert ev.key.hash.hex() == "0c79df0a17d90211a52f23e3204e8e08"
    assert default_schema().get("org.apache.qpid.acl", "fileLoadFailed").severity == 3


def test_default_set() -> None:
    s = default_schema()
    assert s.packages == [
        "org.apache.qpid.broker",
        "org.apache.qpid.acl",
        "org.apache.qpid.ha",
        "org.apache.qpid.linearstore",
    ]
    assert len(s) == 49
    assert sum(1 for c in s if c.schema.kind == KIND_TABLE) == 24
    assert len(s.registry()) == 49


def test_bad_xml_is_refused() -> None:
    with pytest.raises(SchemaXmlError, match="unknown type"):
        parse_schema_xml(
            '<schema package="p"><class name="A"><property name="x" type="nope"/></class></schema>'
        )
    with pytest.raises(SchemaXmlError, match="undeclared event argument"):
        parse_schema_xml('<schema package="p"><event name="e" args="zz"/></schema>')
    with pytest.raises(SchemaXmlError, match="no package"):
        parse_schema_xml("<schema/>")


def test_derived_class_table_is_up_to_date() -> None:
    import json

    from pipeline.qmfxml import DESCRIPTION_FILE, describe

    with open(DESCRIPTION_FILE, encoding="utf-8") as fh:
        assert json.load(fh) == describe(default_schema())  # regenerate: python -m pipeline.qmfxml
    (queue,) = [c for c in describe(default_schema()) if c["name"] == "queue"]
    depth = next(s for s in queue["statistics"] if s["name"] == "msgDepth")
    assert depth == {
        "name": "msgDepth",
        "type": 4,
        "xml_type": "count64",
        "kind": "gauge",
        "base": "msgDepth",
        "unit": "message",
    }
