"""AM1 test vectors re-derived from the spec's figures, one test per figure.

Source: ``../shared/spec/qmf-v1-m3-management-design.txt`` ("Management Design
notes", M3). Each test names the figure (its caption in the spec) and builds the
bytes field by field from it, then checks both directions: bytes -> record and
record -> bytes. Where a figure leaves a width or type open, the test says so
and what the codec does. AM2 (what qpidd sends) is in ``test_am2_vectors.py``.
"""

from __future__ import annotations

from typing import Any

from pipeline.codec.errors import Problem
from pipeline.codec.methods import MethodContext
from pipeline.codec.records import (
    AttachRequest,
    AttachResponse,
    BrokerRequest,
    BrokerResponse,
    ClassIndication,
    ClassQuery,
    CommandComplete,
    ConsoleAdded,
    GetQuery,
    Heartbeat,
    MethodRequest,
    MethodResponse,
    ObjectSample,
    PackageIndication,
    PackageQuery,
    Record,
    SchemaRequest,
    SchemaResponse,
)
from pipeline.codec.schema import ClassSchema, Element, Method, SchemaKey, SchemaRegistry
from pipeline.codec.types import Am1ObjectId
from pipeline.codec.v1 import decode_v1, encode_record
from tests.codec.vectors import UUID, map_bytes, s8, tmap, u8, u16, u32, u64, v16

PKG, CLS = "org.test", "widget"
HASH = bytes(range(16))
KEY = s8(PKG) + s8(CLS) + HASH
T_SAMPLE, T_CREATE = 1_795_338_169_582_999_363, 1_795_338_100_000_000_000

# A class for the figures that need one (content, method arguments). Type codes are
# the spec's table: 1 uint8, 3 uint32, 4 uint64, 6 str8, 7 str16, 10 objectReference,
# 11 boolean, 13 double, 18 int32; direction codes 1 input, 2 output, 3 IO.
WIDGET = ClassSchema(
    key=SchemaKey(PKG, CLS, HASH),
    properties=(
        Element("name", 6, access=1, index=True),
        Element("option1", 3, access=3, optional=True),
        Element("option2", 10, access=3, optional=True),
    ),
    statistics=(Element("count", 4), Element("load", 13)),
    methods=(
        Method(
            "resize",
            (
                Element("size", 3, extra={"dir": 1}),
                Element("label", 7, extra={"dir": 1}),
                Element("seq", 18, extra={"dir": 3}),
                Element("old", 3, extra={"dir": 2}),
                Element("ok", 11, extra={"dir": 2}),
                Element("note", 6, extra={"dir": 2}),
            ),
        ),
        Method("greet", (Element("out", 6, extra={"dir": 2}),)),
    ),
)


def hdr(op: str, seq: int = 0) -> bytes:
    """Every figure's first row: 'A' 'M' '1' opcode, then seq (4 bytes, big-endian)."""
    return b"AM1" + op.encode() + u32(seq)


def both_ways(raw: bytes, record: Record, registry: SchemaRegistry | None = None) -> None:
    reg = registry if registry is not None else SchemaRegistry([WIDGET])
    assert decode_v1(raw, reg) == ([record], [])
    assert encode_record(record, reg) == raw


def test_object_identifiers_figure() -> None:
    """Figure "Object Identifiers": bit 63 reserved (0), 62..48 sequence, 47..24 bank,
    23..0 object."""
    raw = (0x1234 << 48) | (0xABCDEF << 24) | 0x123456
    oid = Am1ObjectId.from_int(raw)
    assert (oid.boot_seq, oid.bank, oid.object_num, oid.reserved) == (0x1234, 0xABCDEF, 0x123456, 0)
    assert oid.to_int() == raw and str(oid) == f"{0x1234}-{0xABCDEF}-{0x123456}"


def test_object_identifier_reserved_bit_63_is_reported_and_the_record_kept() -> None:
    """Figure "Object Identifiers": "bit 63 - reserved, must be zero". A set bit is a
    (non-fatal) problem on the record; the record and its raw id are kept."""
    raw_id = 0x8000000000000001
    body = hdr("i") + KEY + u64(T_SAMPLE) + u64(T_CREATE) + u64(0) + u64(raw_id)
    body += u64(3) + b"\x3f\xe0" + bytes(6)
    heartbeat = hdr("h") + u64(T_SAMPLE)
    records, problems = decode_v1(body + heartbeat, SchemaRegistry([WIDGET]), agent="a1")
    sample = records[0]
    assert isinstance(sample, ObjectSample)
    assert sample.object_id == Am1ObjectId(0, 0, 1, reserved=1)
    assert sample.object_id.to_int() == raw_id  # the raw id is kept
    assert str(sample.object_id) == "0x8000000000000001"  # never shown as 0-0-1
    assert sample.values == {"count": 3, "load": 0.5}
    assert isinstance(records[1], Heartbeat)  # decoding went on
    assert problems == [
        Problem(
            "ReservedBitSet",
            "reserved bit set at offset 64: bit 63 of AM1 object id 0x8000000000000001 "
            "(must be zero); raw id kept",
            64,  # 8 header + 32 class key (9 + 7 + 16) + 3 x 8 times = the object id
            "i",
            record=0,
            fatal=False,
        )
    ]
    # re-encoding gives the same bytes back: nothing was dropped
    assert encode_record(sample, SchemaRegistry([WIDGET])) == body
    # also in a method request's object id and in an object reference value
    m = hdr("M", 4) + u64(raw_id) + s8("greet")
    records, problems = decode_v1(m, SchemaRegistry([WIDGET]))
    assert len(records) == 1 and [(p.error, p.record, p.fatal) for p in problems] == [
        ("ReservedBitSet", 0, False)
    ]
    c = hdr("c") + KEY + u64(T_SAMPLE) + u64(T_CREATE) + u64(0) + u64(5)
    c += u8(0b10) + s8("w") + u64(raw_id)
    records, problems = decode_v1(c, SchemaRegistry([WIDGET]))
    assert isinstance(records[0], ObjectSample)
    assert records[0].values["option2"] == Am1ObjectId(0, 0, 1, reserved=1)
    assert [p.message for p in problems] == [
        "reserved bit set at offset 72: bit 63 of AM1 object reference 'option2' among the values "
        "0x8000000000000001 (must be zero); raw id kept"
    ]


def test_broker_request_message_figure() -> None:
    """Figure "Broker Request Message": header only, seq 0, no payload."""
    both_ways(hdr("B"), BrokerRequest(dialect="AM1", opcode="B"))


def test_broker_response_message_figure() -> None:
    """Figure "Broker Response Message": header (seq 0), brokerId (uuid, 16 bytes)."""
    both_ways(hdr("b") + UUID.bytes, BrokerResponse(dialect="AM1", opcode="b", broker_id=UUID))


def test_command_completion_message_figure() -> None:
    """Figure "Command Completion Message": Completion Code (4 bytes wide in the figure),
    Completion Text. The figure gives the text no type: the codec uses str8, as qpidd
    writes it (AM2, dialect notes)."""
    raw = hdr("z", 3) + u32(0) + s8("OK")
    both_ways(raw, CommandComplete(dialect="AM1", opcode="z", seq=3, code=0, text="OK"))


def test_class_query_figure() -> None:
    """Figure "Class Query": package name (str8)."""
    both_ways(hdr("Q", 2) + s8(PKG), ClassQuery(dialect="AM1", opcode="Q", seq=2, package=PKG))


def test_class_indication_figure() -> None:
    """Figure "Class Indication": package name (str8), class name (str8), schema hash
    (bin128). No class kind octet (AM2 adds one)."""
    rec = ClassIndication(
        dialect="AM1", opcode="q", class_kind=None, package=PKG, class_name=CLS, schema_hash=HASH
    )
    both_ways(hdr("q") + KEY, rec)


def test_schema_request_figure() -> None:
    """Figure "Schema Request": packageName (str8), className (str8), schema-hash (bin128)."""
    rec = SchemaRequest(
        dialect="AM1", opcode="S", seq=4, package=PKG, class_name=CLS, schema_hash=HASH
    )
    both_ways(hdr("S", 4) + KEY, rec)


def test_schema_response_figure() -> None:
    """Figure "Schema Response": packageName, className, schema-hash, then propCnt,
    statCnt, methodCnt, eventCnt (u16 each), then the property, statistic, method and
    event records as AMQP maps with the fields of the tables under the figure (property:
    name, type, access, index, optional [, unit, min, max, maxlen, desc]; statistic: name,
    type [, unit, desc]; method/event: main map name, argCount [, desc], then argument
    maps name, type, dir (method only, direction codes 1/2/3) ...)."""
    prop = (
        ("access", 0x02, 1),
        ("index", 0x21, 1),
        ("name", 0x90, "name"),
        ("optional", 0x21, 0),
        ("type", 0x02, 6),
    )
    prop_raw = map_bytes(
        ("access", 0x02, u8(1)),
        ("index", 0x21, u32(1)),
        ("name", 0x90, v16("name")),
        ("optional", 0x21, u32(0)),
        ("type", 0x02, u8(6)),
    )
    stat = (("name", 0x90, "count"), ("type", 0x02, 4), ("unit", 0x90, "msg"))
    stat_raw = map_bytes(
        ("name", 0x90, v16("count")), ("type", 0x02, u8(4)), ("unit", 0x90, v16("msg"))
    )
    meth = (("argCount", 0x21, 1), ("desc", 0x90, "d"), ("name", 0x90, "echo"))
    meth_raw = map_bytes(
        ("argCount", 0x21, u32(1)), ("desc", 0x90, v16("d")), ("name", 0x90, v16("echo"))
    )
    arg = (("dir", 0x02, 3), ("name", 0x90, "seq"), ("type", 0x02, 3))  # dir 3 = IO
    arg_raw = map_bytes(("dir", 0x02, u8(3)), ("name", 0x90, v16("seq")), ("type", 0x02, u8(3)))
    evt = (("argCount", 0x21, 0), ("name", 0x90, "gone"))
    evt_raw = map_bytes(("argCount", 0x21, u32(0)), ("name", 0x90, v16("gone")))
    schema = ClassSchema(
        key=SchemaKey(PKG, CLS, HASH),
        properties=(Element("name", 6, access=1, index=True),),
        statistics=(Element("count", 4, extra={"unit": "msg"}),),
        methods=(Method("echo", (Element("seq", 3, extra={"dir": 3}),), extra={"desc": "d"}),),
        events=(Method("gone"),),
    )
    rec = SchemaResponse(
        dialect="AM1",
        opcode="s",
        seq=8,
        class_kind=None,
        schema=schema,
        property_maps=(tmap(*prop),),
        statistic_maps=(tmap(*stat),),
        methods=((tmap(*meth), (tmap(*arg),)),),
        events=((tmap(*evt), ()),),
    )
    raw = hdr("s", 8) + KEY + u16(1) + u16(1) + u16(1) + u16(1)
    raw += prop_raw + stat_raw + meth_raw + arg_raw + evt_raw
    reg = SchemaRegistry()
    both_ways(raw, rec, reg)
    assert reg.get(schema.key) == schema and reg.origin(schema.key) == "wire"


def test_heartbeat_indication_figure() -> None:
    """Figure "Heartbeat Indication": seq 0, timestamp of current interval (datetime:
    uint64 ns since the epoch)."""
    both_ways(hdr("h") + u64(T_SAMPLE), Heartbeat(dialect="AM1", opcode="h", timestamp_ns=T_SAMPLE))


def _content(op: str, values: dict[str, Any], oid: Am1ObjectId, seq: int = 0) -> ObjectSample:
    return ObjectSample(
        dialect="AM1",
        opcode=op,
        seq=seq,
        package=PKG,
        class_name=CLS,
        schema_hash=HASH,
        update_ns=T_SAMPLE,
        create_ns=T_CREATE,
        delete_ns=0,
        object_id=oid,
        values=values,
    )


def test_configuration_and_instrumentation_content_figure() -> None:
    """Figure "Configuration and Instrumentation Content Messages" ('g/c/i'): packageName,
    className, class hash, timestamp of current sample, time created, time deleted
    (uint64 ns), objectId (uint64), presence bitmasks (one bit per optional property,
    first octet first, lowest bit first: the text's option1/option2 example), values in
    schema order. 'c' = properties, 'i' = statistics, 'g' = both."""
    oid_raw = (1 << 48) | (5 << 24) | 20
    oid = Am1ObjectId(1, 5, 20)
    times = u64(T_SAMPLE) + u64(T_CREATE) + u64(0) + u64(oid_raw)
    # option1 absent (bit 0 clear), option2 present (bit 1 set)
    c = hdr("c") + KEY + times + u8(0b10) + s8("w1") + u64((1 << 24) | 1)
    both_ways(c, _content("c", {"name": "w1", "option2": Am1ObjectId(0, 1, 1)}, oid))
    i = hdr("i") + KEY + times + u64(3) + b"\x3f\xe0" + bytes(6)  # no bitmask in 'i'
    both_ways(i, _content("i", {"count": 3, "load": 0.5}, oid))
    g = hdr("g", 9) + KEY + times + u8(0b01) + s8("w1") + u32(7) + u64(3) + b"\x3f\xe0" + bytes(6)
    values = {"name": "w1", "option1": 7, "count": 3, "load": 0.5}
    both_ways(g, _content("g", values, oid, seq=9))


def test_get_query_message_figure() -> None:
    """Figure "Get Query Message": a field table (0-10 map) with "_class" (short-string)."""
    raw = hdr("G", 5) + map_bytes(("_class", 0x95, v16("queue")))
    rec = GetQuery(dialect="AM1", opcode="G", seq=5, query=tmap(("_class", 0x95, "queue")))
    both_ways(raw, rec)


def test_method_request_figure() -> None:
    """Figure "Method Request": objectId (uint64), methodName (str8), input and
    bidirectional argument values in schema order. No class key: without context the
    arguments stay raw bytes; with a context that saw the object they are typed."""
    oid = Am1ObjectId(1, 5, 20)
    args = u32(640) + v16("big") + u32(0xFFFFFFFF)  # size (I), label (I), seq (IO, int32 -1)
    raw = hdr("M", 6) + u64(oid.to_int()) + s8("resize") + args
    both_ways(
        raw,
        MethodRequest(
            dialect="AM1",
            opcode="M",
            seq=6,
            object_id=oid,
            method_name="resize",
            raw_arguments=args,
        ),
    )


def test_method_response_figure_status_ok_with_text() -> None:
    """Figure "Method Response": status code, status text (str8), output and bidirectional
    arguments. The issue's first body: status 0, text "OK", no argument."""
    raw = bytes.fromhex("414d316d 00000001 00000000 024f4b")
    both_ways(raw, MethodResponse(dialect="AM1", opcode="m", seq=1, status=0, text="OK"))


def test_method_response_figure_empty_text_and_output_argument() -> None:
    """Figure "Method Response", the issue's second body: status 0, empty text, then one
    output argument, str8 "hello". Raw without context; typed ("out" of method "greet",
    type 6 str8) when a context holds the request with seq 2."""
    raw = bytes.fromhex("414d316d 00000002 00000000 00 0568656c6c6f")
    untyped = MethodResponse(
        dialect="AM1", opcode="m", seq=2, status=0, text="", raw_arguments=s8("hello")
    )
    both_ways(raw, untyped)
    oid = Am1ObjectId(1, 5, 20)
    ctx = MethodContext()
    reg = SchemaRegistry([WIDGET])
    sample = hdr("i") + KEY + u64(T_SAMPLE) + u64(T_CREATE) + u64(0) + u64(oid.to_int())
    sample += u64(3) + b"\x3f\xe0" + bytes(6)
    request = hdr("M", 2) + u64(oid.to_int()) + s8("greet")
    for body in (sample, request):
        assert decode_v1(body, reg, methods=ctx)[1] == []
    records, problems = decode_v1(raw, reg, methods=ctx)
    assert problems == []
    assert records == [
        MethodResponse(
            dialect="AM1",
            opcode="m",
            seq=2,
            status=0,
            text="",
            arguments={"out": "hello"},
            raw_arguments=s8("hello"),
            object_id=oid,
            method_name="greet",
            package=PKG,
            class_name=CLS,
            schema_hash=HASH,
        )
    ]
    assert encode_record(records[0], reg) == raw


def test_method_response_figure_error_status_has_no_arguments() -> None:
    """Figure "Method Response": "Output and bidirectional arguments are only included if
    the status code was 0": an error response ends after its text, so a record after it
    in the same message decodes (STATUS_UNKNOWN_METHOD = 2)."""
    raw = hdr("m", 7) + u32(2) + s8("UnknownMethod")
    rec = MethodResponse(dialect="AM1", opcode="m", seq=7, status=2, text="UnknownMethod")
    both_ways(raw, rec)
    after = hdr("h") + u64(T_SAMPLE)
    records, problems = decode_v1(raw + after, SchemaRegistry())
    assert problems == [] and [r.opcode for r in records] == ["m", "h"]


def test_package_query_figure() -> None:
    """Figure "Package Query": header only."""
    both_ways(hdr("P", 1), PackageQuery(dialect="AM1", opcode="P", seq=1))


def test_package_indication_figure() -> None:
    """Figure "Package Indication": package name (str8)."""
    both_ways(
        hdr("p", 1) + s8(PKG), PackageIndication(dialect="AM1", opcode="p", seq=1, package=PKG)
    )


def test_attach_request_figure() -> None:
    """Figure "Attach Request": label (str8), system-id (uuid), requested objId bank
    (4 bytes wide in the figure)."""
    rec = AttachRequest(
        dialect="AM1", opcode="A", seq=1, label="agent", system_id=UUID, requested_bank=5
    )
    both_ways(hdr("A", 1) + s8("agent") + UUID.bytes + u32(5), rec)


def test_attach_response_figure() -> None:
    """Figure "Attach Response (success)": assigned broker bank, assigned objId bank
    (4 bytes each)."""
    rec = AttachResponse(dialect="AM1", opcode="a", seq=1, broker_bank=1, agent_bank=4)
    both_ways(hdr("a", 1) + u32(1) + u32(4), rec)


def test_console_added_indication_figure() -> None:
    """Figure "Console Added Indication": header only."""
    both_ways(hdr("x", 3), ConsoleAdded(dialect="AM1", opcode="x", seq=3))


def test_every_spec_figure_opcode_has_a_test_here() -> None:
    """The spec's figures define 19 opcodes; each has its test above ('e' has no AM1
    figure: the codec's convention is tested in test_am2_vectors.py)."""
    import sys

    source = open(sys.modules[__name__].__file__ or "", encoding="utf-8").read()
    for op in "BbzQqSshcigGMmPpAax":
        assert f'hdr("{op}"' in source, op
