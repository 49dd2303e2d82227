"""AM2 test vectors (what qpidd sends), kept apart from AM1's, plus the AM1 conventions
the spec leaves open.

Sources, per vector (``SOURCES``): the dialect notes ``../shared/spec/qmf-dialects.md``
section 2 ("AM2 -- what qpidd sends for QMF v1", read off captured bytes), the real
capture ``../shared/samples/qpidd-capture-20s.jsonl``, or, for the two requests qpidd
receives but the capture does not hold ('M', 'A'), qpid's own console/agent code as
noted. AM1 vectors derived from the spec's figures are in ``test_am1_vectors.py``; the
AM1 ones left here ('e', the event-class 's') follow the codec's conventions for what
AM1 does not define (``docs/codec.md``, "AM1 event classes").
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.codec.errors import EncodeError
from pipeline.codec.records import (
    AttachRequest,
    BrokerRequest,
    BrokerResponse,
    ClassIndication,
    ClassQuery,
    CommandComplete,
    ConsoleAdded,
    Event,
    GetQuery,
    Heartbeat,
    MethodRequest,
    MethodResponse,
    ObjectSample,
    PackageIndication,
    Record,
    SchemaRequest,
    SchemaResponse,
)
from pipeline.codec.schema import (
    KIND_EVENT,
    ClassSchema,
    Element,
    Method,
    SchemaKey,
    SchemaRegistry,
)
from pipeline.codec.types import Am1ObjectId, Am2ObjectId, EmbeddedObject
from pipeline.codec.v1 import OPCODES, decode_v1, encode_record, encode_records, schema_response_for
from tests.codec import strategies as S
from tests.codec.vectors import UUID, map_bytes, s8, tmap, u8, u16, u32, u64, v16

PKG, CLS, EV = "org.test", "widget", "alarm"
HASH, EV_HASH = bytes(range(16)), bytes(range(16, 32))
T1, T2 = 1_795_338_169_582_999_363, 1_795_338_100_000_000_000
AM1_OID, AM1_OID_RAW = Am1ObjectId(1, 5, 20), (1 << 48) | (5 << 24) | 20
AM2_OID, AM2_OID_RAW = Am2ObjectId(0, 1, 1, 0, 20), u64((1 << 48) | (1 << 28)) + u64(20)

WIDGET = ClassSchema(
    key=SchemaKey(PKG, CLS, HASH),
    properties=(
        Element("name", 6, access=1, index=True),
        Element("size", 3, access=3, optional=True),
        Element("owner", 10, access=3, optional=True),
    ),
    statistics=(Element("count", 4), Element("load", 13)),
    methods=(
        Method(
            "echo", (Element("seq", 3, extra={"dir": "IO"}), Element("body", 7, extra={"dir": "I"}))
        ),
    ),
)
ALARM = ClassSchema(
    key=SchemaKey(PKG, EV, EV_HASH),
    kind=KIND_EVENT,
    arguments=(Element("who", 6), Element("level", 1)),
)


def registry() -> SchemaRegistry:
    return SchemaRegistry([WIDGET, ALARM])


def hdr(dialect: str, op: str, seq: int = 0) -> bytes:
    return dialect.encode() + op.encode() + u32(seq)


KEY = s8(PKG) + s8(CLS) + HASH
TIMES = u64(T1) + u64(T2) + u64(0)

# (name, record, bytes)
VECTORS: list[tuple[str, Record, bytes]] = [
    ("AM2-B", BrokerRequest(dialect="AM2", opcode="B", seq=7), hdr("AM2", "B", 7)),
    (
        "AM2-b",
        BrokerResponse(dialect="AM2", opcode="b", seq=101, broker_id=UUID),
        hdr("AM2", "b", 101) + UUID.bytes,
    ),
    (
        "AM2-z",
        CommandComplete(dialect="AM2", opcode="z", seq=3, code=7, text="no"),
        hdr("AM2", "z", 3) + u32(7) + s8("no"),
    ),
    (
        "AM2-Q",
        ClassQuery(dialect="AM2", opcode="Q", seq=2, package=PKG),
        hdr("AM2", "Q", 2) + s8(PKG),
    ),
    (
        "AM2-q",
        ClassIndication(
            dialect="AM2", opcode="q", class_kind=2, package=PKG, class_name=CLS, schema_hash=HASH
        ),
        hdr("AM2", "q") + u8(2) + KEY,
    ),
    (
        "AM2-S",
        SchemaRequest(
            dialect="AM2", opcode="S", seq=4, package=PKG, class_name=CLS, schema_hash=HASH
        ),
        hdr("AM2", "S", 4) + KEY,
    ),
    ("AM2-h", Heartbeat(dialect="AM2", opcode="h", timestamp_ns=T1), hdr("AM2", "h") + u64(T1)),
    (
        "AM2-c",
        ObjectSample(
            dialect="AM2",
            opcode="c",
            package=PKG,
            class_name=CLS,
            schema_hash=HASH,
            update_ns=T1,
            create_ns=T2,
            delete_ns=0,
            object_id=AM2_OID,
            values={"name": "w1", "size": 9},
            agent="1.0",
        ),
        hdr("AM2", "c") + KEY + TIMES + AM2_OID_RAW + u8(0b01) + s8("w1") + u32(9),
    ),
    (
        "AM2-i",
        ObjectSample(
            dialect="AM2",
            opcode="i",
            package=PKG,
            class_name=CLS,
            schema_hash=HASH,
            update_ns=T1,
            create_ns=T2,
            delete_ns=T1,
            object_id=AM2_OID,
            values={"count": 3, "load": 0.5},
            agent="1.0",
        ),
        hdr("AM2", "i")
        + KEY
        + u64(T1)
        + u64(T2)
        + u64(T1)
        + AM2_OID_RAW
        + u64(3)
        + b"\x3f\xe0"
        + bytes(6),
    ),
    (
        "AM2-g",
        ObjectSample(
            dialect="AM2",
            opcode="g",
            seq=9,
            package=PKG,
            class_name=CLS,
            schema_hash=HASH,
            update_ns=T1,
            create_ns=T2,
            delete_ns=0,
            object_id=AM2_OID,
            values={
                "name": "w1",
                "size": 9,
                "owner": Am2ObjectId(0, 1, 1, 0, 1),
                "count": 3,
                "load": 0.5,
            },
            agent="1.0",
        ),
        hdr("AM2", "g", 9)
        + KEY
        + TIMES
        + AM2_OID_RAW
        + u8(0b11)
        + s8("w1")
        + u32(9)
        + u64((1 << 48) | (1 << 28))
        + u64(1)
        + u64(3)
        + b"\x3f\xe0"
        + bytes(6),
    ),
    (
        "AM2-G",
        GetQuery(dialect="AM2", opcode="G", seq=5, query=tmap(("_objectid", 0x90, "0-1-1-0-20"))),
        hdr("AM2", "G", 5) + map_bytes(("_objectid", 0x90, v16("0-1-1-0-20"))),
    ),
    (
        "AM2-M",
        MethodRequest(
            dialect="AM2",
            opcode="M",
            seq=6,
            object_id=AM2_OID,
            method_name="echo",
            package=PKG,
            class_name=CLS,
            schema_hash=HASH,
            arguments={"seq": 1, "body": "hi"},
            raw_arguments=u32(1) + v16("hi"),  # the wire bytes stay beside the typed view
        ),
        hdr("AM2", "M", 6) + AM2_OID_RAW + KEY + s8("echo") + u32(1) + v16("hi"),
    ),
    (
        "AM2-m-str8-quirk",
        MethodResponse(
            dialect="AM2", opcode="m", seq=6, status=2, text="UnknownMethod", text_str8=True
        ),
        hdr("AM2", "m", 6) + u32(2) + s8("UnknownMethod"),
    ),
    (
        "AM2-p",
        PackageIndication(dialect="AM2", opcode="p", seq=1, package=PKG),
        hdr("AM2", "p", 1) + s8(PKG),
    ),
    (
        "AM2-A",
        AttachRequest(
            dialect="AM2",
            opcode="A",
            seq=1,
            label="agent",
            system_id=UUID,
            requested_bank=5,
            requested_agent_bank=6,
        ),
        hdr("AM2", "A", 1) + s8("agent") + UUID.bytes + u32(5) + u32(6),
    ),
    ("AM2-x", ConsoleAdded(dialect="AM2", opcode="x"), hdr("AM2", "x")),
    (
        "AM2-e",
        Event(
            dialect="AM2",
            opcode="e",
            package=PKG,
            event_name=EV,
            schema_hash=EV_HASH,
            timestamp_ns=T1,
            severity=6,
            arguments={"who": "me", "level": 2},
        ),
        hdr("AM2", "e") + s8(PKG) + s8(EV) + EV_HASH + u64(T1) + u8(6) + s8("me") + u8(2),
    ),
    (
        "AM1-e",
        Event(
            dialect="AM1",
            opcode="e",
            package=PKG,
            event_name=EV,
            schema_hash=EV_HASH,
            timestamp_ns=T1,
            severity=3,
            arguments={"who": "me", "level": 2},
        ),
        hdr("AM1", "e") + s8(PKG) + s8(EV) + EV_HASH + u64(T1) + u8(3) + s8("me") + u8(2),
    ),
]

# Schema responses, with maps spelled out as qpidd writes them (AM2) / the spec's fields (AM1)
PROP = (
    ("access", 0x02, 1),
    ("index", 0x21, 1),
    ("name", 0x90, "name"),
    ("optional", 0x21, 0),
    ("type", 0x02, 6),
)
PROP_RAW = map_bytes(
    ("access", 0x02, u8(1)),
    ("index", 0x21, u32(1)),
    ("name", 0x90, v16("name")),
    ("optional", 0x21, u32(0)),
    ("type", 0x02, u8(6)),
)
STAT = (("name", 0x90, "count"), ("type", 0x02, 4), ("unit", 0x90, "msg"))
STAT_RAW = map_bytes(
    ("name", 0x90, v16("count")), ("type", 0x02, u8(4)), ("unit", 0x90, v16("msg"))
)
METH = (("argCount", 0x21, 1), ("desc", 0x90, "d"), ("name", 0x90, "echo"))
METH_RAW = map_bytes(
    ("argCount", 0x21, u32(1)), ("desc", 0x90, v16("d")), ("name", 0x90, v16("echo"))
)
ARG_AM2 = (("dir", 0x90, "IO"), ("name", 0x90, "seq"), ("type", 0x02, 3))
ARG_AM2_RAW = map_bytes(("dir", 0x90, v16("IO")), ("name", 0x90, v16("seq")), ("type", 0x02, u8(3)))
ARG_AM1 = (("dir", 0x02, 3), ("name", 0x90, "seq"), ("type", 0x02, 3))
ARG_AM1_RAW = map_bytes(("dir", 0x02, u8(3)), ("name", 0x90, v16("seq")), ("type", 0x02, u8(3)))
EVT_MAIN = (("argCount", 0x21, 0), ("name", 0x90, "gone"))
EVT_MAIN_RAW = map_bytes(("argCount", 0x21, u32(0)), ("name", 0x90, v16("gone")))


def _schema(dialect: str) -> ClassSchema:
    arg_dir = "IO" if dialect == "AM2" else 3
    return ClassSchema(
        key=SchemaKey(PKG, CLS, HASH),
        properties=(Element("name", 6, access=1, index=True, optional=False),),
        statistics=(Element("count", 4, extra={"unit": "msg"}),),
        methods=(
            Method("echo", (Element("seq", 3, extra={"dir": arg_dir}),), extra={"desc": "d"}),
        ),
    )


# An AM1 table class with an event record beside its members (the spec figure's test is
# in test_am1_vectors.py; this one is for schema_response_for below)
AM1_S_RAW = (
    hdr("AM1", "s", 8)
    + KEY
    + u16(1)
    + u16(1)
    + u16(1)
    + u16(1)
    + PROP_RAW
    + STAT_RAW
    + METH_RAW
    + ARG_AM1_RAW
    + EVT_MAIN_RAW
)

SCHEMA_VECTORS: list[tuple[str, Record, bytes]] = [
    (
        "AM2-s-table",
        SchemaResponse(
            dialect="AM2",
            opcode="s",
            seq=8,
            class_kind=1,
            schema=_schema("AM2"),
            property_maps=(tmap(*PROP),),
            statistic_maps=(tmap(*STAT),),
            methods=((tmap(*METH), (tmap(*ARG_AM2),)),),
        ),
        hdr("AM2", "s", 8)
        + u8(1)
        + KEY
        + u16(1)
        + u16(1)
        + u16(1)
        + PROP_RAW
        + STAT_RAW
        + METH_RAW
        + ARG_AM2_RAW,
    ),
    (
        "AM2-s-event",
        SchemaResponse(
            dialect="AM2",
            opcode="s",
            seq=8,
            class_kind=2,
            schema=ClassSchema(
                key=SchemaKey(PKG, EV, EV_HASH), kind=KIND_EVENT, arguments=(Element("who", 6),)
            ),
            argument_maps=(tmap(("name", 0x90, "who"), ("type", 0x02, 6)),),
        ),
        hdr("AM2", "s", 8)
        + u8(2)
        + s8(PKG)
        + s8(EV)
        + EV_HASH
        + u16(1)
        + map_bytes(("name", 0x90, v16("who")), ("type", 0x02, u8(6))),
    ),
]

# An AM1 event class: counts 0/0/0/1, one event record named like the class (main map
# {argCount, desc, name}, then argCount argument maps) that carries the arguments.
EV_DESC_SCHEMA = ClassSchema(
    key=SchemaKey(PKG, EV, EV_HASH),
    kind=KIND_EVENT,
    arguments=(Element("who", 6, extra={"desc": "who did it"}), Element("level", 1)),
)
EV_MAIN = (("argCount", 0x21, 2), ("desc", 0x90, "an alarm"), ("name", 0x90, EV))
EV_MAIN_RAW = map_bytes(
    ("argCount", 0x21, u32(2)), ("desc", 0x90, v16("an alarm")), ("name", 0x90, v16(EV))
)
EV_WHO = (("desc", 0x90, "who did it"), ("name", 0x90, "who"), ("type", 0x02, 6))
EV_WHO_RAW = map_bytes(
    ("desc", 0x90, v16("who did it")), ("name", 0x90, v16("who")), ("type", 0x02, u8(6))
)
EV_LEVEL = (("name", 0x90, "level"), ("type", 0x02, 1))
EV_LEVEL_RAW = map_bytes(("name", 0x90, v16("level")), ("type", 0x02, u8(1)))
AM1_EVENT_CLASS_RAW = (
    hdr("AM1", "s", 9)
    + s8(PKG)
    + s8(EV)
    + EV_HASH
    + u16(0)
    + u16(0)
    + u16(0)
    + u16(1)
    + EV_MAIN_RAW
    + EV_WHO_RAW
    + EV_LEVEL_RAW
)
SCHEMA_VECTORS.append(
    (
        "AM1-s-event",
        SchemaResponse(
            dialect="AM1",
            opcode="s",
            seq=9,
            class_kind=None,
            schema=EV_DESC_SCHEMA,
            events=((tmap(*EV_MAIN), (tmap(*EV_WHO), tmap(*EV_LEVEL))),),
        ),
        AM1_EVENT_CLASS_RAW,
    )
)

ALL = VECTORS + SCHEMA_VECTORS


@pytest.mark.parametrize(("name", "record", "raw"), ALL, ids=[v[0] for v in ALL])
def test_vector_decodes_to_record(name: str, record: Record, raw: bytes) -> None:
    records, problems = decode_v1(raw, registry())
    assert problems == []
    assert records == [record]


@pytest.mark.parametrize(("name", "record", "raw"), ALL, ids=[v[0] for v in ALL])
def test_record_encodes_to_vector(name: str, record: Record, raw: bytes) -> None:
    assert encode_record(record, registry()) == raw


# Where each AM2 vector's layout comes from.
DIALECTS_MD = "qmf-dialects.md section 2"
SAMPLE = "qpidd-capture-20s.jsonl"
SOURCES = {
    "AM2-B": DIALECTS_MD + " (header)",
    "AM2-b": DIALECTS_MD + " (Broker response 'b': 16-byte uuid); " + SAMPLE,
    "AM2-z": DIALECTS_MD + " (Command complete 'z': code u32, text str8); " + SAMPLE,
    "AM2-Q": DIALECTS_MD + " (as AM1)",
    "AM2-q": DIALECTS_MD + " ('q' starts with a kind byte); " + SAMPLE,
    "AM2-S": DIALECTS_MD + " (the schema request 'S' has none)",
    "AM2-h": DIALECTS_MD + " (Heartbeat 'h': timestamp u64); " + SAMPLE,
    "AM2-c": DIALECTS_MD + " (Content, 16-byte object id, presence octets); " + SAMPLE,
    "AM2-i": DIALECTS_MD + " ('i' has no presence octets; delete time); " + SAMPLE,
    "AM2-g": DIALECTS_MD + " ('g' = all properties then all statistics); " + SAMPLE,
    "AM2-G": DIALECTS_MD + " (Get query 'G': `_objectid` text form)",
    "AM2-M": "qpid python console qmf/console.py _sendMethodRequest: object id, class key, "
    "method name str8, input arguments (not in the sample)",
    "AM2-m-str8-quirk": DIALECTS_MD + " (Method response quirk: str8 text, status 2); " + SAMPLE,
    "AM2-p": DIALECTS_MD + " (Package indication 'p': name str8); " + SAMPLE,
    "AM2-A": "qpidd ManagementAgent::handleAttachRequest: label, system id, requested "
    "broker bank, requested agent bank, u32 each (not in the sample)",
    "AM2-x": DIALECTS_MD + " (header)",
    "AM2-e": DIALECTS_MD + " (Event 'e'); " + SAMPLE,
    "AM1-e": "docs/codec.md: AM1 defines no event opcode; AM2's layout, 8-byte references",
    "AM2-s-table": DIALECTS_MD + " (Schema response, table class; map value types); " + SAMPLE,
    "AM2-s-event": DIALECTS_MD + " (Schema response, event class); " + SAMPLE,
    "AM1-s-event": "docs/codec.md: AM1 event classes (convention, no class kind in AM1)",
}


def test_every_vector_names_its_source_and_every_opcode_is_covered() -> None:
    assert set(OPCODES) == set("BbzQqSshcigGMmPpAaxe")
    assert {name for name, _, _ in ALL} == set(SOURCES)
    covered = {r.opcode for _, r, _ in ALL if r.dialect == "AM2"}
    assert covered >= set("BbzQqShcigGMmpAxes")  # AM1's are in test_am1_vectors.py


# (dialect, status, text, text_str8, raw output arguments) of the sample's 'm' records:
# broker.echo (sequence 4242 as u32, body "hello-qmf-v1" as str16), two OKs, and the
# unknown-method quirk.
EXPECTED_SAMPLE_M = [
    ("AM2", 0, "OK", False, "00001092" + "000c" + b"hello-qmf-v1".hex()),
    ("AM2", 0, "OK", False, ""),
    ("AM2", 2, "UnknownMethod", True, ""),
    ("AM2", 0, "OK", False, ""),
]


def test_real_sample_method_responses_decode_unchanged(shared_dir: str) -> None:
    """The sample's four AM2 'm' records, as qpidd wrote them: str16 text (status 0),
    the str8 quirk (status 2), an output argument left raw (no request to type it by)."""
    import os

    from pipeline.codec.capture import read_capture

    path = os.path.join(shared_dir, "samples", "qpidd-capture-20s.jsonl")
    reg = SchemaRegistry()
    got = []
    for m in read_capture(path):
        res = m.decode(reg)
        assert res.problems == []
        for r in res.records:
            if isinstance(r, MethodResponse) and r.dialect == "AM2":
                got.append((r.dialect, r.status, r.text, r.text_str8, r.raw_arguments.hex()))
                assert encode_record(r, reg) == m.body  # one 'm' per message, byte for byte
    assert got == EXPECTED_SAMPLE_M


def test_schema_response_registers_the_class_for_later_records() -> None:
    reg = SchemaRegistry()
    raw = SCHEMA_VECTORS[0][2]
    content = hdr("AM2", "i") + KEY + TIMES + AM2_OID_RAW + u64(42)
    records, problems = decode_v1(raw + content, reg)
    assert problems == []
    assert [r.opcode for r in records] == ["s", "i"]
    assert reg.get(SchemaKey(PKG, CLS, HASH)) == _schema("AM2")
    assert isinstance(records[1], ObjectSample) and records[1].values == {"count": 42}


def test_several_records_in_one_message_in_order() -> None:
    picks = [v for v in VECTORS if v[0] in ("AM2-c", "AM2-i", "AM2-g", "AM2-e", "AM2-h")]
    body = b"".join(raw for _, _, raw in picks)
    records, problems = decode_v1(body, registry())
    assert problems == []
    assert records == [r for _, r, _ in picks]
    assert encode_records(records, registry()) == body


def test_schema_response_for_reproduces_qpid_layout() -> None:
    built = schema_response_for(_schema("AM2"), "AM2", seq=8)
    assert encode_record(built, None) == SCHEMA_VECTORS[0][2]
    built1 = schema_response_for(_schema("AM1"), "AM1", seq=8)
    raw1 = (
        hdr("AM1", "s", 8)
        + KEY
        + u16(1)
        + u16(1)
        + u16(1)
        + u16(0)
        + PROP_RAW
        + STAT_RAW
        + METH_RAW
        + ARG_AM1_RAW
    )
    assert encode_record(built1, None) == raw1


def test_bad_class_kind_is_malformed() -> None:
    records, problems = decode_v1(hdr("AM2", "q") + u8(3) + KEY, registry())
    assert records == []
    assert [p.error for p in problems] == ["Malformed"]
    assert problems[0].message == "malformed data at offset 8: class kind must be 1 or 2, found 3"


def test_presence_bits_span_octets_lowest_bit_first() -> None:
    """Nine optional properties: two presence octets, first octet first, lowest bit first."""
    props = tuple(Element(f"p{i}", 1, access=3, optional=True) for i in range(9))
    schema = ClassSchema(key=SchemaKey(PKG, "many", HASH), properties=props)
    values = {"p0": 10, "p7": 17, "p8": 18}
    rec = ObjectSample(
        dialect="AM2",
        opcode="c",
        package=PKG,
        class_name="many",
        schema_hash=HASH,
        update_ns=T1,
        create_ns=T2,
        delete_ns=0,
        object_id=AM2_OID,
        values=values,
        agent="1.0",
    )
    raw = (
        hdr("AM2", "c")
        + s8(PKG)
        + s8("many")
        + HASH
        + TIMES
        + AM2_OID_RAW
        + bytes([0b1000_0001, 0b1])
        + bytes([10, 17, 18])
    )
    reg = SchemaRegistry([schema])
    assert encode_record(rec, reg) == raw
    assert decode_v1(raw, reg) == ([rec], [])
    # a bit beyond the ninth optional property is malformed
    bad = raw.replace(bytes([0b1000_0001, 0b1]), bytes([0b1000_0001, 0b11]))
    records, problems = decode_v1(bad, reg)
    assert records == []
    assert (
        [p.message for p in problems]
        == [
            "malformed data at offset 78: presence bits set beyond the 9 optional properties"  # 8+9+5+16+24+16
        ]
    )


def test_type_20_embedded_object() -> None:
    """QMF type 20 with inner type 20: class key, then presence bits, properties, statistics."""
    holder = ClassSchema(key=SchemaKey(PKG, "holder", HASH), statistics=(Element("inner", 20),))
    reg = SchemaRegistry([WIDGET, holder])
    inner = EmbeddedObject(PKG, CLS, HASH, {"name": "w", "size": 2, "count": 1, "load": 0.5})
    rec = ObjectSample(
        dialect="AM2",
        opcode="i",
        package=PKG,
        class_name="holder",
        schema_hash=HASH,
        update_ns=T1,
        create_ns=T2,
        delete_ns=0,
        object_id=AM2_OID,
        values={"inner": inner},
        agent="1.0",
    )
    raw = (
        hdr("AM2", "i")
        + s8(PKG)
        + s8("holder")
        + HASH
        + TIMES
        + AM2_OID_RAW
        + u8(20)
        + KEY
        + u8(0b01)
        + s8("w")
        + u32(2)
        + u64(1)
        + b"\x3f\xe0"
        + bytes(6)
    )
    assert encode_record(rec, reg) == raw
    assert decode_v1(raw, reg) == ([rec], [])
    # without the inner class's schema the record cannot be split
    records, problems = decode_v1(raw, SchemaRegistry([holder]))
    assert records == []
    assert [p.error for p in problems] == ["MissingSchema"]


def test_am1_event_class_schema_response_registers_an_event_class() -> None:
    """The AM1 event-class response, then an AM1 'e' of that class, with an empty registry."""
    reg = SchemaRegistry()
    event = hdr("AM1", "e") + s8(PKG) + s8(EV) + EV_HASH + u64(T1) + u8(3) + s8("me") + u8(2)
    records, problems = decode_v1(AM1_EVENT_CLASS_RAW + event, reg, agent="a1")
    assert problems == []
    assert [r.opcode for r in records] == ["s", "e"]
    s_rec = records[0]
    assert isinstance(s_rec, SchemaResponse)
    assert s_rec.class_kind is None and s_rec.schema.kind == KIND_EVENT
    assert reg.get(SchemaKey(PKG, EV, EV_HASH)) == EV_DESC_SCHEMA
    assert records[1] == Event(
        dialect="AM1",
        opcode="e",
        package=PKG,
        event_name=EV,
        schema_hash=EV_HASH,
        timestamp_ns=T1,
        severity=3,
        arguments={"who": "me", "level": 2},
        agent="a1",
    )
    assert encode_records(records, reg) == AM1_EVENT_CLASS_RAW + event


def test_schema_response_for_am1_event_class() -> None:
    """schema_response_for writes an event class in AM1 as one event record named like it."""
    built = schema_response_for(ALARM, "AM1", seq=9)
    main = (("argCount", 0x21, 2), ("name", 0x90, EV))
    who = (("name", 0x90, "who"), ("type", 0x02, 6))
    assert built == SchemaResponse(
        dialect="AM1",
        opcode="s",
        seq=9,
        class_kind=None,
        schema=ALARM,
        events=((tmap(*main), (tmap(*who), tmap(*EV_LEVEL))),),
    )
    raw = (
        hdr("AM1", "s", 9)
        + s8(PKG)
        + s8(EV)
        + EV_HASH
        + u16(0)
        + u16(0)
        + u16(0)
        + u16(1)
        + map_bytes(("argCount", 0x21, u32(2)), ("name", 0x90, v16(EV)))
        + map_bytes(("name", 0x90, v16("who")), ("type", 0x02, u8(6)))
        + EV_LEVEL_RAW
    )
    assert encode_record(built, None) == raw
    reg = SchemaRegistry()
    assert decode_v1(raw, reg) == ([built], [])
    assert reg.get(ALARM.key) == ALARM
    # with no arguments: argCount 0 and nothing after the main map
    bare = ClassSchema(key=SchemaKey(PKG, "ping", EV_HASH), kind=KIND_EVENT)
    raw0 = (
        hdr("AM1", "s")
        + s8(PKG)
        + s8("ping")
        + EV_HASH
        + u16(0) * 3
        + u16(1)
        + map_bytes(("argCount", 0x21, u32(0)), ("name", 0x90, v16("ping")))
    )
    assert encode_record(schema_response_for(bare, "AM1"), None) == raw0
    assert decode_v1(raw0, SchemaRegistry()) == ([schema_response_for(bare, "AM1")], [])


def test_am1_table_schema_keeps_its_event_records() -> None:
    """A table class with event records: still a table class; schema_response_for writes them back."""
    schema = replace(_schema("AM1"), events=(Method("gone"),))
    assert encode_record(schema_response_for(schema, "AM1", seq=8), None) == AM1_S_RAW
    # AM2 has no event records in 's': they are left out there
    assert encode_record(schema_response_for(schema, "AM2", seq=8), None) == SCHEMA_VECTORS[0][2]


@pytest.mark.parametrize(
    ("counts", "event_name", "kind"),
    [
        ((0, 0, 0), EV, KIND_EVENT),  # the convention
        ((0, 0, 0), "other", 1),  # event record not named like the class
        ((1, 0, 0), EV, 1),  # a property beside it
    ],
)
def test_am1_event_class_needs_exactly_the_convention(
    counts: tuple[int, int, int], event_name: str, kind: int
) -> None:
    n_props = counts[0]
    raw = (
        hdr("AM1", "s")
        + s8(PKG)
        + s8(EV)
        + EV_HASH
        + u16(n_props)
        + u16(0)
        + u16(0)
        + u16(1)
        + PROP_RAW * n_props
        + map_bytes(("argCount", 0x21, u32(1)), ("name", 0x90, v16(event_name)))
        + EV_LEVEL_RAW
    )
    reg = SchemaRegistry()
    records, problems = decode_v1(raw, reg)
    assert problems == []
    (rec,) = records
    assert isinstance(rec, SchemaResponse)
    assert rec.schema.kind == kind
    if kind == KIND_EVENT:
        assert rec.schema.arguments == (Element("level", 1),) and rec.schema.events == ()
    else:
        assert rec.schema.arguments == ()
        assert rec.schema.events == (Method(event_name, (Element("level", 1),)),)
    assert reg.get(SchemaKey(PKG, EV, EV_HASH)) == rec.schema
    assert encode_record(rec, None) == raw


def test_schema_response_layout_errors() -> None:
    am1 = schema_response_for(ALARM, "AM1")
    with pytest.raises(EncodeError, match="AM1 schema response has no class kind"):
        encode_record(replace(am1, class_kind=KIND_EVENT), None)
    am2 = schema_response_for(ALARM, "AM2")
    with pytest.raises(EncodeError, match="event arguments in an event record"):
        encode_record(replace(am2, dialect="AM1", class_kind=None), None)
    table = schema_response_for(_schema("AM2"), "AM2")
    with pytest.raises(EncodeError, match="AM2 schema response has no event records"):
        encode_record(replace(table, events=((tmap(*EVT_MAIN), ()),)), None)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_am1_event_class_round_trips(data: st.DataObject) -> None:
    """Any event class: AM1 's' then 'e' in one message, decoded with an empty registry."""
    schema, event = data.draw(S.events("AM1"))
    response = schema_response_for(schema, "AM1")
    body = encode_records([response, event], SchemaRegistry([schema]))
    reg = SchemaRegistry()
    decoded, problems = decode_v1(body, reg)
    assert problems == []
    assert decoded == [response, event]
    assert reg.get(schema.key) == schema
    assert encode_records(decoded, reg) == body
