"""QMF v2 map messages: hand-built bodies -> the shared record kinds, and back."""

from __future__ import annotations

import uuid
from dataclasses import replace

from pipeline.codec.message import decode_message
from pipeline.codec.records import (
    ClassIndication,
    Event,
    Heartbeat,
    MethodResponse,
    ObjectSample,
    QmfException,
    SchemaResponse,
    V2Message,
)
from pipeline.codec.schema import KIND_EVENT, KIND_TABLE, SchemaKey, SchemaRegistry
from pipeline.codec.types import V2ObjectId
from pipeline.codec.v2 import encode_v2
from tests.codec.vectors import map_bytes, s8, tmap, u8, u32, u64, v16

HASH = uuid.UUID("1c316b1d-36b4-3b31-0fb1-31bddf40a109")
AGENT = "apache.org:qpidd:96e8ff02"


def list_bytes(*items: bytes) -> bytes:
    """A 0-10 list of maps."""
    body = b"".join(b"\xa8" + i for i in items)
    return u32(4 + len(body)) + u32(len(items)) + body


def schema_id(cls: str, typ: str) -> bytes:
    return map_bytes(
        ("_class_name", 0x90, v16(cls)),
        ("_hash", 0x48, HASH.bytes),
        ("_package_name", 0x90, v16("org.apache.qpid.broker")),
        ("_type", 0x90, v16(typ)),
    )


def props(opcode: str, content: str | None = None, agent: str | None = AGENT) -> dict[str, str]:
    p = {"qmf.opcode": opcode}
    if content:
        p["qmf.content"] = content
    if agent:
        p["qmf.agent"] = agent
    return p


QUEUE = map_bytes(
    ("_create_ts", 0x32, u64(10)),
    ("_delete_ts", 0x32, u64(0)),
    ("_object_id", 0xA8, map_bytes(("_object_name", 0x90, v16("org.apache.qpid.broker:queue:q1")))),
    ("_schema_id", 0xA8, schema_id("queue", "_data")),
    ("_update_ts", 0x32, u64(20)),
    ("_values", 0xA8, map_bytes(("depth", 0x22, u32(5)), ("name", 0x90, v16("q1")))),
)


def test_data_indication_is_an_object_sample_and_encodes_back() -> None:
    body = list_bytes(QUEUE)
    res = decode_message(
        body,
        registry=SchemaRegistry(),
        application_properties=props("_data_indication", "_data"),
        content_type="amqp/list",
        app_id="qmf2",
    )
    assert (res.dialect, res.problems) == ("V2", [])
    expected = ObjectSample(
        dialect="V2",
        opcode="_data_indication",
        package="org.apache.qpid.broker",
        class_name="queue",
        schema_hash=HASH.bytes,
        update_ns=20,
        create_ns=10,
        delete_ns=0,
        object_id=V2ObjectId("org.apache.qpid.broker:queue:q1"),
        values={"depth": 5, "name": "q1"},
        agent=AGENT,
    )
    assert res.records == [expected]
    assert res.records[0].row()["object_name"] == "org.apache.qpid.broker:queue:q1"
    # from fields (no source), values typed like qpidd's
    built = replace(expected, values=tmap(("depth", 0x22, 5), ("name", 0x90, "q1")))
    enc = encode_v2([built])
    assert (enc.body, enc.content_type) == (body, "amqp/list")
    assert enc.application_properties == {
        "method": "indication",
        "qmf.opcode": "_data_indication",
        "qmf.content": "_data",
        "qmf.agent": AGENT,
    }


def test_object_id_with_agent_and_epoch() -> None:
    item = map_bytes(
        (
            "_object_id",
            0xA8,
            map_bytes(
                ("_agent_epoch", 0x32, u64(3)),
                ("_agent_name", 0x90, v16("a1")),
                ("_object_name", 0x90, v16("o1")),
            ),
        ),
        ("_values", 0xA8, map_bytes()),
    )
    res = decode_message(
        list_bytes(item),
        registry=SchemaRegistry(),
        application_properties=props("_query_response", "_data", None),
        content_type="amqp/list",
    )
    (rec,) = res.records
    assert isinstance(rec, ObjectSample)
    assert rec.object_id == V2ObjectId("o1", "a1", 3)
    assert (rec.agent, rec.package, rec.schema_hash) == ("a1", "", b"")
    assert {k: rec.row()[k] for k in ("agent_name", "epoch", "object_name", "boot_seq")} == {
        "agent_name": "a1",
        "epoch": 3,
        "object_name": "o1",
        "boot_seq": None,
    }
    out = encode_v2(res.records)
    assert out.body == list_bytes(item)


def test_event_indication() -> None:
    item = map_bytes(
        ("_schema_id", 0xA8, schema_id("bind", "_event")),
        ("_severity", 0x02, u8(6)),
        ("_timestamp", 0x32, u64(99)),
        ("_values", 0xA8, map_bytes(("qName", 0x90, v16("q1")))),
    )
    res = decode_message(
        list_bytes(item),
        registry=SchemaRegistry(),
        application_properties=props("_data_indication", "_event"),
        content_type="amqp/list",
        app_id="qmf2",
    )
    assert res.records == [
        Event(
            dialect="V2",
            opcode="_data_indication",
            package="org.apache.qpid.broker",
            event_name="bind",
            schema_hash=HASH.bytes,
            timestamp_ns=99,
            severity=6,
            arguments={"qName": "q1"},
            agent=AGENT,
        )
    ]
    assert encode_v2([replace(res.records[0], source=None)]).body == list_bytes(item)


def test_heartbeat_method_response_exception() -> None:
    hb = map_bytes(
        ("_values", 0xA8, map_bytes(("_name", 0x90, v16(AGENT)), ("_timestamp", 0x32, u64(77))))
    )
    res = decode_message(
        hb,
        registry=SchemaRegistry(),
        application_properties=props("_agent_heartbeat_indication"),
        content_type="amqp/map",
    )
    assert res.records == [
        Heartbeat(
            dialect="V2",
            opcode="_agent_heartbeat_indication",
            timestamp_ns=77,
            agent=AGENT,
            attributes={"_name": AGENT, "_timestamp": 77},
        )
    ]
    mr = map_bytes(
        ("_arguments", 0xA8, map_bytes(("body", 0x90, v16("hi")), ("sequence", 0x22, u32(7))))
    )
    res = decode_message(
        mr,
        registry=SchemaRegistry(),
        application_properties=props("_method_response"),
        content_type="amqp/map",
    )
    assert res.records == [
        MethodResponse(
            dialect="V2",
            opcode="_method_response",
            status=0,
            arguments={"body": "hi", "sequence": 7},
        )
    ]
    ex = map_bytes(
        ("_values", 0xA8, map_bytes(("error_code", 0x22, u32(1)), ("error_text", 0x90, v16("no"))))
    )
    res = decode_message(
        ex,
        registry=SchemaRegistry(),
        application_properties=props("_exception"),
        content_type="amqp/map",
    )
    assert res.records == [
        QmfException(
            dialect="V2",
            opcode="_exception",
            code=1,
            text="no",
            values={"error_code": 1, "error_text": "no"},
            agent=AGENT,
        )
    ]
    assert encode_v2(res.records).body == ex


def test_schema_id_and_schema_class() -> None:
    res = decode_message(
        list_bytes(schema_id("queue", "_data"), schema_id("bind", "_event")),
        registry=SchemaRegistry(),
        application_properties=props("_query_response", "_schema_id"),
        content_type="amqp/list",
    )
    assert [
        (type(r), r.class_kind, r.class_name) for r in res.records if isinstance(r, ClassIndication)
    ] == [
        (ClassIndication, KIND_TABLE, "queue"),
        (ClassIndication, KIND_EVENT, "bind"),
    ]
    prop = map_bytes(
        ("_access", 0x90, v16("RO")),
        ("_name", 0x90, v16("name")),
        ("_type", 0x90, v16("TYPE_STRING")),
    )
    cls = map_bytes(
        ("_methods", 0xA9, u32(4) + u32(0)),
        ("_properties", 0xA9, list_bytes(prop)),
        ("_schema_id", 0xA8, schema_id("queue", "_data")),
    )
    reg = SchemaRegistry()
    res = decode_message(
        list_bytes(cls),
        registry=reg,
        application_properties=props("_query_response", "_schema_class"),
        content_type="amqp/list",
    )
    (rec,) = res.records
    assert isinstance(rec, SchemaResponse)
    key = SchemaKey("org.apache.qpid.broker", "queue", HASH.bytes)
    assert rec.schema.key == key and reg.get(key) == rec.schema
    assert [(e.name, e.type_code, e.access) for e in rec.schema.properties] == [("name", 7, 3)]
    assert encode_v2(res.records).body == list_bytes(cls)


def test_locate_request_and_bad_bodies() -> None:
    res = decode_message(
        u32(4) + u32(0),
        registry=SchemaRegistry(),
        application_properties={"qmf.opcode": "_agent_locate_request"},
        content_type="amqp/list",
    )
    assert res.records == [
        V2Message(dialect="V2", opcode="_agent_locate_request", content=None, body=[])
    ]
    res = decode_message(
        map_bytes() + b"\x00",
        registry=SchemaRegistry(),
        application_properties=props("_method_response"),
        content_type="amqp/map",
    )
    assert res.records == []
    assert [(p.error, p.message, p.opcode) for p in res.problems] == [
        ("Malformed", "malformed data at offset 8: 1 bytes after the body", "_method_response")
    ]
    res = decode_message(
        u32(100) + s8("x"),
        registry=SchemaRegistry(),
        application_properties=props("_exception"),
        content_type="amqp/map",
    )
    assert [(p.error, p.message) for p in res.problems] == [
        ("Truncated", "truncated map header at offset 0: expected 8 bytes, found 6")
    ]
