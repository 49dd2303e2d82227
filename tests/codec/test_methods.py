"""Method arguments typed with context (``pipeline.codec.methods``): 'M' inputs, 'm' outputs.

The class ``WIDGET`` has a method with input, output and bidirectional arguments of
several types. AM1 'M' carries no class key (the context supplies it from the
object's samples); no 'm' names its method (the context supplies the pending
request of the same sequence number). Raw bytes stay beside the typed view.
"""

from __future__ import annotations

from dataclasses import replace

from pipeline.codec.errors import Problem
from pipeline.codec.message import decode_message
from pipeline.codec.methods import MethodCall, MethodContext, method_calls, type_method_arguments
from pipeline.codec.records import Heartbeat, MethodRequest, MethodResponse, ObjectSample, Record
from pipeline.codec.schema import ClassSchema, Element, Method, SchemaKey, SchemaRegistry
from pipeline.codec.types import Am1ObjectId, Am2ObjectId
from pipeline.codec.v1 import decode_v1, encode_record
from tests.codec.vectors import UUID, s8, u8, u32, u64, v16

PKG, CLS = "org.test", "widget"
HASH = bytes(range(16))
KEY = s8(PKG) + s8(CLS) + HASH
T = 1_795_338_169_582_999_363

# dir: AM1 codes 1 (I), 2 (O), 3 (IO); the AM2 class below says "I"/"O"/"IO"
ARGS = (
    ("size", 3, 1),  # uint32, in
    ("label", 7, 1),  # str16, in
    ("seq", 18, 3),  # int32, bidirectional
    ("owner", 10, 1),  # objectReference, in
    ("old", 4, 2),  # uint64, out
    ("ok", 11, 2),  # boolean, out
    ("note", 6, 2),  # str8, out
    ("id", 14, 2),  # uuid, out
    ("ratio", 13, 2),  # double, out
)


def widget(dialect: str) -> ClassSchema:
    names = {1: "I", 2: "O", 3: "IO"}
    args = tuple(
        Element(n, t, extra={"dir": d if dialect == "AM1" else names[d]}) for n, t, d in ARGS
    )
    return ClassSchema(
        key=SchemaKey(PKG, CLS, HASH),
        properties=(Element("name", 6, access=1, index=True),),
        statistics=(Element("count", 4),),
        methods=(Method("resize", args), Method("ping")),
    )


OID1 = Am1ObjectId(1, 5, 20)
OID2 = Am2ObjectId(0, 1, 1, 0, 20)
OWNER1 = Am1ObjectId(1, 5, 2)


def hdr(dialect: str, op: str, seq: int = 0) -> bytes:
    return dialect.encode() + op.encode() + u32(seq)


def am1_sample() -> bytes:
    """An 'i' of the object: this is how the context learns its class."""
    return hdr("AM1", "i") + KEY + u64(T) + u64(T) + u64(0) + u64(OID1.to_int()) + u64(3)


IN_RAW = u32(640) + v16("big") + u32(0xFFFFFFFF) + u64(OWNER1.to_int())
IN_TYPED = {"size": 640, "label": "big", "seq": -1, "owner": OWNER1}
# out and bidirectional, in schema order: seq, old, ok, note, id, ratio
OUT_RAW = u32(0xFFFFFFFE) + u64(1 << 40) + u8(1) + s8("done") + UUID.bytes + b"\x3f\xe0" + bytes(6)
OUT_TYPED = {"seq": -2, "old": 1 << 40, "ok": True, "note": "done", "id": UUID, "ratio": 0.5}


def test_am1_request_and_response_typed_with_context() -> None:
    reg = SchemaRegistry([widget("AM1")])
    ctx = MethodContext()
    request = hdr("AM1", "M", 9) + u64(OID1.to_int()) + s8("resize") + IN_RAW
    response = hdr("AM1", "m", 9) + u32(0) + s8("OK") + OUT_RAW
    heartbeat = hdr("AM1", "h") + u64(T)
    assert decode_v1(am1_sample(), reg, methods=ctx)[1] == []
    # the typed request ends where its arguments do: the heartbeat after it decodes too
    (req, hb), problems = decode_v1(request + heartbeat, reg, methods=ctx)
    assert problems == [] and isinstance(hb, Heartbeat)
    assert req == MethodRequest(
        dialect="AM1",
        opcode="M",
        seq=9,
        object_id=OID1,
        method_name="resize",
        package=PKG,
        class_name=CLS,
        schema_hash=HASH,
        arguments=IN_TYPED,
        raw_arguments=IN_RAW,
    )
    (resp,), problems = decode_v1(response, reg, methods=ctx)
    assert problems == []
    assert resp == MethodResponse(
        dialect="AM1",
        opcode="m",
        seq=9,
        status=0,
        text="OK",
        arguments=OUT_TYPED,
        raw_arguments=OUT_RAW,
        object_id=OID1,
        method_name="resize",
        package=PKG,
        class_name=CLS,
        schema_hash=HASH,
    )
    # the wire is unchanged by typing: both re-encode to their bytes, raw or from the
    # typed view alone
    assert encode_record(req, reg) + encode_record(hb, reg) == request + heartbeat
    assert encode_record(resp, reg) == response
    assert encode_record(replace(req, raw_arguments=b""), reg) == request
    assert encode_record(replace(resp, raw_arguments=b""), reg) == response
    # without context: raw, exactly as before
    (raw_req,), _ = decode_v1(request, reg)
    assert isinstance(raw_req, MethodRequest)
    assert (raw_req.arguments, raw_req.raw_arguments) == (None, IN_RAW)


def test_am2_response_typed_from_the_pending_request() -> None:
    """AM2 'M' names its class; its 'm' still needs the request (context) to be typed."""
    reg = SchemaRegistry([widget("AM2")])
    ctx = MethodContext()
    in_raw = u32(640) + v16("big") + u32(0xFFFFFFFF) + u64(1 << 48) + u64(2)  # 16-byte ref
    oid_raw = u64((1 << 48) | (1 << 28)) + u64(20)
    request = hdr("AM2", "M", 3) + oid_raw + KEY + s8("resize") + in_raw
    out_raw = u32(7) + u64(0) + u8(0) + s8("") + UUID.bytes + bytes(8)
    response = hdr("AM2", "m", 3) + u32(0) + v16("OK") + out_raw
    res = decode_message(request, registry=reg, methods=ctx)
    (req,) = res.records
    assert isinstance(req, MethodRequest) and req.arguments == {
        "size": 640,
        "label": "big",
        "seq": -1,
        "owner": Am2ObjectId(0, 1, 0, 0, 2),
    }
    assert req.raw_arguments == in_raw
    (resp,) = decode_message(response, registry=reg, methods=ctx).records
    assert isinstance(resp, MethodResponse)
    assert resp.arguments == {
        "seq": 7,
        "old": 0,
        "ok": False,
        "note": "",
        "id": UUID,
        "ratio": 0.0,
    }
    assert (resp.object_id, resp.method_name, resp.raw_arguments) == (OID2, "resize", out_raw)
    # an error response is not typed (no output arguments after an error)
    err = hdr("AM2", "m", 3) + u32(7) + v16("Exception")
    (e,) = decode_message(err, registry=reg, methods=ctx).records
    assert isinstance(e, MethodResponse) and e.arguments is None and e.method_name is None


def test_arguments_that_do_not_fit_stay_raw_with_a_problem() -> None:
    reg = SchemaRegistry([widget("AM1")])
    ctx = MethodContext()
    decode_v1(am1_sample(), reg, methods=ctx)
    decode_v1(hdr("AM1", "M", 4) + u64(OID1.to_int()) + s8("resize") + IN_RAW, reg, methods=ctx)
    short = hdr("AM1", "m", 4) + u32(0) + s8("OK") + OUT_RAW[:5]
    (resp,), problems = decode_v1(short, reg, methods=ctx)
    assert isinstance(resp, MethodResponse)
    assert (resp.arguments, resp.raw_arguments) == (None, OUT_RAW[:5])
    assert [(p.error, p.record, p.fatal, p.offset) for p in problems] == [
        ("ArgumentMismatch", 0, False, 15)
    ]
    # a method the class does not have is data, not a problem (test below)
    (req,), problems = decode_v1(
        hdr("AM1", "M", 5) + u64(OID1.to_int()) + s8("nope") + b"\x01", reg, methods=ctx
    )
    assert isinstance(req, MethodRequest) and req.arguments is None
    assert (req.raw_arguments, problems) == (b"\x01", [])


def test_request_for_a_method_the_class_lacks_is_data_with_its_raw_arguments() -> None:
    """A well-formed 'M' naming a method its class schema lacks: the agent answers it with
    STATUS_UNKNOWN_METHOD (2), so it is a method call like any other. It decodes, with or
    without context, to the request record with its argument bytes kept and untyped, and
    no problem; it encodes back to the same bytes and pairs with its error response."""
    args = u32(7) + s8("x")
    am1 = hdr("AM1", "M", 12) + u64(OID1.to_int()) + s8("explode") + args
    oid2 = u64((1 << 48) | (1 << 28)) + u64(20)
    am2 = hdr("AM2", "M", 13) + oid2 + KEY + s8("explode") + args
    want1 = MethodRequest(
        dialect="AM1", opcode="M", seq=12, object_id=OID1, method_name="explode",
        raw_arguments=args,
    )  # fmt: skip
    want2 = MethodRequest(
        dialect="AM2", opcode="M", seq=13, object_id=OID2, method_name="explode",
        package=PKG, class_name=CLS, schema_hash=HASH, raw_arguments=args,
    )  # fmt: skip
    for dialect, body, want in (("AM1", am1, want1), ("AM2", am2, want2)):
        reg = SchemaRegistry([widget(dialect)])
        ctx = MethodContext()
        assert decode_v1(am1_sample(), reg, methods=ctx)[1] == []
        for context in (ctx, None):
            records, problems = decode_v1(body, reg, methods=context)
            assert (records, problems) == ([want], [])
            assert records[0].arguments is None
            assert encode_record(records[0], reg) == body
        # typed afterwards (the batch API): unchanged, no problem; pairs with its response
        quirk = hdr(dialect, "m", want.seq) + u32(2) + s8("UnknownMethod: explode")
        (resp,), problems = decode_v1(quirk, reg)
        assert problems == [] and isinstance(resp, MethodResponse) and resp.status == 2
        typed, problems = type_method_arguments([want, resp], reg, MethodContext())
        assert (typed, problems) == ([want, resp], [])
        (call,) = method_calls([want, resp], reg)
        assert (call.method_name, call.status, call.raw_in, call.arguments_in) == (
            "explode", 2, args, None,
        )  # fmt: skip
        assert (call.request, call.response) == (0, 1)


def test_records_decoded_without_context_are_typed_afterwards_and_paired() -> None:
    """The batch API for a silver method-call table: records decoded earlier, in order."""
    reg = SchemaRegistry([widget("AM1")])
    bodies = [
        am1_sample(),
        hdr("AM1", "M", 9) + u64(OID1.to_int()) + s8("resize") + IN_RAW,
        hdr("AM1", "M", 10) + u64(OID1.to_int()) + s8("ping"),
        hdr("AM1", "m", 9) + u32(0) + s8("OK") + OUT_RAW,
        hdr("AM1", "m", 11) + u32(1) + s8("UnknownObject"),  # its request was never seen
    ]
    records: list[Record] = []
    for b in bodies:
        recs, problems = decode_v1(b, reg)  # no context
        assert problems == []
        records.extend(recs)
    typed, problems = type_method_arguments(records, reg)
    assert problems == []
    assert isinstance(typed[0], ObjectSample) and typed[0] is records[0]
    assert isinstance(typed[1], MethodRequest) and typed[1].arguments == IN_TYPED
    assert isinstance(typed[2], MethodRequest) and typed[2].arguments == {}
    assert isinstance(typed[3], MethodResponse) and typed[3].arguments == OUT_TYPED
    assert typed[3].raw_arguments == OUT_RAW
    calls = method_calls(records, reg)
    assert calls == [
        MethodCall(
            dialect="AM1",
            seq=9,
            object_id=OID1,
            package=PKG,
            class_name=CLS,
            schema_hash=HASH,
            method_name="resize",
            status=0,
            text="OK",
            arguments_in=IN_TYPED,
            arguments_out=OUT_TYPED,
            raw_in=IN_RAW,
            raw_out=OUT_RAW,
            request=1,
            response=3,
        ),
        MethodCall(
            dialect="AM1",
            seq=11,
            object_id=None,
            package=None,
            class_name=None,
            schema_hash=None,
            method_name=None,
            status=1,
            text="UnknownObject",
            arguments_in=None,
            arguments_out=None,
            raw_in=None,
            raw_out=b"",
            request=None,
            response=4,
        ),
        MethodCall(
            dialect="AM1",
            seq=10,
            object_id=OID1,
            package=PKG,
            class_name=CLS,
            schema_hash=HASH,
            method_name="ping",
            status=None,
            text=None,
            arguments_in={},
            arguments_out=None,
            raw_in=b"",
            raw_out=None,
            request=2,
            response=None,
        ),
    ]
    # a raw tail that is longer than the arguments is reported, not typed
    long = replace(records[3], raw_arguments=OUT_RAW + b"AM1h")
    _, problems = type_method_arguments([*records[:3], long], reg)
    assert problems == [
        Problem(
            "ArgumentMismatch",
            f"method arguments at offset {len(OUT_RAW)} do not fit: resize of "
            f"{SchemaKey(PKG, CLS, HASH)}: 4 bytes left after them",
            len(OUT_RAW),
            "m",
            record=3,
            fatal=False,
        )
    ]


def test_context_is_bounded_and_follows_the_latest_request() -> None:
    ctx = MethodContext(max_objects=2, max_pending=2)
    reg = SchemaRegistry([widget("AM1")])
    for num in (1, 2, 3):
        oid = Am1ObjectId(1, 5, num)
        body = hdr("AM1", "i") + KEY + u64(T) + u64(T) + u64(0) + u64(oid.to_int()) + u64(0)
        decode_v1(body, reg, methods=ctx)
    assert ctx.class_of(Am1ObjectId(1, 5, 1)) is None  # the oldest went first
    assert ctx.class_of(Am1ObjectId(1, 5, 3)) == SchemaKey(PKG, CLS, HASH)
    for seq, name in ((1, "ping"), (2, "ping"), (1, "resize"), (3, "ping")):
        oid = Am1ObjectId(1, 5, 3)
        decode_v1(hdr("AM1", "M", seq) + u64(oid.to_int()) + s8(name), reg, methods=ctx)
    assert sorted(ctx.pending) == [("AM1", 1), ("AM1", 3)]
    assert ctx.pending[("AM1", 1)].method_name == "resize"
