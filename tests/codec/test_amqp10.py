"""AMQP 1.0 bodies: every format code by hand-built vector, proton's codec as an oracle,
bad input as problems, the same records from 0-10 and AMQP 1.0 encodings of the same
QMF v2 content, and the real qpidd-over-AMQP-1.0 samples."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proton import (
    UNDESCRIBED,
    Array,
    Data,
    byte,
    char,
    decimal32,
    decimal64,
    decimal128,
    float32,
    int32,
    short,
    symbol,
    timestamp,
    ubyte,
    uint,
    ulong,
    ushort,
)
from proton import (
    Described as PnDescribed,
)

from pipeline.codec import amqp10 as A
from pipeline.codec.amqp10 import (
    BODY_ENCODING_AMQP10,
    BODY_ENCODING_PROPERTY,
    BODY_ENCODING_STRING,
    Amqp10Array,
    Amqp10List,
    Amqp10Map,
    Described,
)
from pipeline.codec.capture import CapturedMessage, read_capture
from pipeline.codec.errors import CodecError, Malformed, Truncated, UnknownType
from pipeline.codec.message import decode_message
from pipeline.codec.records import Heartbeat, ObjectSample, Record, V2Message
from pipeline.codec.schema import ClassSchema, SchemaKey, SchemaRegistry
from pipeline.codec.seed import seeded_registry
from pipeline.codec.types import Am2ObjectId, TypedList, TypedMap, encode_list, encode_map
from pipeline.codec.v2 import _parse_body, encode_v2
from tests.codec import strategies as S
from tests.codec.test_v2 import AGENT, HASH, QUEUE, list_bytes, props, schema_id
from tests.codec.vectors import map_bytes, u8, u32, u64, v16

# Decode with the kernels the warm-up compiles (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("compiled_decoder")

REPO = Path(__file__).resolve().parents[2]
UID = uuid.UUID("96e8ff02-7df9-4aaa-b0bd-0ef186095f23")


def L(items: list[Any], codes: list[int], code: int = A.LIST32) -> Amqp10List:
    return Amqp10List(items, codes, code)


def M(entries: list[tuple[Any, int, Any, int]], code: int = A.MAP32) -> Amqp10Map:
    """A map from (key, key code, value, value code)."""
    return Amqp10Map(
        [(k, v) for k, _, v, _ in entries],
        {k: vc for k, _, _, vc in entries},
        {k: kc for k, kc, _, _ in entries},
        code,
    )


def same(a: Any, b: Any) -> bool:
    """Equal values *and* equal Python types and recorded codes, recursively."""
    if type(a) is not type(b):
        return False
    if isinstance(a, Amqp10Map):
        return (
            (a.code, a.codes, a.key_codes) == (b.code, b.codes, b.key_codes)
            and list(a) == list(b)
            and all(same(a[k], b[k]) for k in a)
        )
    if isinstance(a, Amqp10List):
        return (a.code, a.codes) == (b.code, b.codes) and all(map(same, a, b)) and len(a) == len(b)
    if isinstance(a, Amqp10Array):
        return (
            (a.code, a.element, a.descriptor, a.descriptor_code)
            == (b.code, b.element, b.descriptor, b.descriptor_code)
            and len(a) == len(b)
            and all(map(same, a, b))
        )
    if isinstance(a, Described):
        return (
            same(a.descriptor, b.descriptor)
            and same(a.value, b.value)
            and (a.descriptor_code, a.value_code) == (b.descriptor_code, b.value_code)
        )
    return bool(a == b)


# (encoded bytes, decoded value, format code): one or more per primitive format code of
# the spec (part 1.6), written from its type table.
VECTORS: list[tuple[str, Any, int]] = [
    ("40", None, A.NULL),
    ("41", True, A.TRUE),
    ("42", False, A.FALSE),
    ("5601", True, A.BOOLEAN),
    ("5600", False, A.BOOLEAN),
    ("50ff", 255, A.UBYTE),
    ("60ffff", 65535, A.USHORT),
    ("70ffffffff", 2**32 - 1, A.UINT),
    ("52ff", 255, A.SMALLUINT),
    ("43", 0, A.UINT0),
    ("80ffffffffffffffff", 2**64 - 1, A.ULONG),
    ("5307", 7, A.SMALLULONG),
    ("44", 0, A.ULONG0),
    ("5180", -128, A.BYTE),
    ("618000", -32768, A.SHORT),
    ("7180000000", -(2**31), A.INT),
    ("54ff", -1, A.SMALLINT),
    ("818000000000000000", -(2**63), A.LONG),
    ("557f", 127, A.SMALLLONG),
    ("723fc00000", 1.5, A.FLOAT),
    ("82bff8000000000000", -1.5, A.DOUBLE),
    ("7401020304", b"\x01\x02\x03\x04", A.DECIMAL32),
    ("840102030405060708", bytes(range(1, 9)), A.DECIMAL64),
    ("94" + bytes(range(16)).hex(), bytes(range(16)), A.DECIMAL128),
    ("730001f600", "\U0001f600", A.CHAR),
    ("73" + "00000041", "A", A.CHAR),
    ("830000018bcfe56800", 1700000000000, A.TIMESTAMP),
    ("98" + UID.hex, UID, A.UUID),
    ("a0026869", "hi", A.VBIN8),  # binary that is UTF-8: text, as 0-10 vbin16
    ("a002ff00", b"\xff\x00", A.VBIN8),  # not UTF-8: bytes
    ("b0000000026869", "hi", A.VBIN32),
    ("a103c3a978", "\u00e9x", A.STR8),
    ("b1000000026869", "hi", A.STR32),
    ("a3026869", "hi", A.SYM8),
    ("b3000000026869", "hi", A.SYM32),
    ("45", L([], [], A.LIST0), A.LIST0),
    ("c00402415505", L([True, 5], [A.TRUE, A.SMALLLONG], A.LIST8), A.LIST8),
    ("d00000000700000002415505", L([True, 5], [A.TRUE, A.SMALLLONG]), A.LIST32),
    ("c10602a101615501", M([("a", A.STR8, 1, A.SMALLLONG)], A.MAP8), A.MAP8),
    ("d10000000900000002a101615501", M([("a", A.STR8, 1, A.SMALLLONG)]), A.MAP32),
    ("d10000000b000000025301a00378797a", M([(1, A.SMALLULONG, "xyz", A.VBIN8)]), A.MAP32),
    (
        "e00a02710000000100000002",
        Amqp10Array([1, 2], A.INT, code=A.ARRAY8),
        A.ARRAY8,
    ),
    ("f00000000d00000002710000000100000002", Amqp10Array([1, 2], A.INT), A.ARRAY32),
    (
        "e00702005301500102",
        Amqp10Array([1, 2], A.UBYTE, descriptor=1, descriptor_code=A.SMALLULONG, code=A.ARRAY8),
        A.ARRAY8,
    ),
    ("00a301645505", Described("d", 5, A.SYM8, A.SMALLLONG), A.DESCRIBED),
]


@pytest.mark.parametrize(("hexed", "value", "code"), VECTORS, ids=[v[0][:12] for v in VECTORS])
def test_vector_decodes_exactly_and_encodes_back(hexed: str, value: Any, code: int) -> None:
    raw = bytes.fromhex(hexed)
    got, got_code = A.decode(raw)
    assert got_code == code
    assert same(got, value), (got, value)
    assert A.encode(got, got_code) == raw
    assert A.encode(value, code) == raw


def test_every_format_code_of_the_spec_has_a_vector() -> None:
    """The spec's primitive format codes plus the described-type constructor."""
    spec = {
        0x40, 0x41, 0x42, 0x56, 0x50, 0x60, 0x70, 0x52, 0x43, 0x80, 0x53, 0x44, 0x51, 0x61,
        0x71, 0x54, 0x81, 0x55, 0x72, 0x82, 0x74, 0x84, 0x94, 0x73, 0x83, 0x98, 0xA0, 0xB0,
        0xA1, 0xB1, 0xA3, 0xB3, 0x45, 0xC0, 0xD0, 0xC1, 0xD1, 0xE0, 0xF0, 0x00,
    }  # fmt: skip
    assert {c for _, _, c in VECTORS} == spec
    assert set(A.DECODERS) | {A.DESCRIBED} == spec
    assert set(A.ENCODERS) == spec


def test_raw_mode_keeps_binary_as_bytes_and_float32_nan_bits() -> None:
    assert A.decode(bytes.fromhex("a0026869"), binary_text=False) == (b"hi", A.VBIN8)
    assert A.decode(bytes.fromhex("a1026869"), binary_text=False) == ("hi", A.STR8)
    nan = bytes.fromhex("727f800001")  # a signalling NaN: its payload survives
    v, c = A.decode(nan)
    assert isinstance(v, A.Float32) and A.encode(v, c) == nan


def test_recorded_codes_widen_when_the_value_no_longer_fits() -> None:
    """A recorded compact code is a hint: kept when the value fits, widened otherwise."""
    assert A.encode(300, A.SMALLULONG) == bytes.fromhex("80000000000000012c")
    assert A.encode(5, A.ULONG0) == bytes.fromhex("5305")
    assert A.encode(False, A.TRUE) == b"\x42"
    assert A.encode("x" * 300, A.VBIN8)[:5] == bytes.fromhex("b00000012c")
    big = L(["x" * 300], [A.STR8], A.LIST8)
    assert A.encode(big, A.LIST8) == bytes.fromhex("d00000013500000001b10000012c") + b"x" * 300
    assert A.encode([1], A.LIST0) == bytes.fromhex("d000000006000000015501")


def test_inferred_codes_are_protons() -> None:
    """Plain Python values encode as proton's encoder writes them (what the receiver lands)."""
    for v in [None, True, 0, -1, 300, 2**40, 1.5, "a", "", b"", b"ab", UID, [], [1], {}, {"a": 1}]:
        d = Data()
        d.put_object(v)
        assert A.encode(v) == d.encode(), v


# ------------------------------------------------------------------ bad input


BAD: list[tuple[str, type[CodecError], str]] = [
    ("", Truncated, "truncated value format code at offset 0: expected 1 bytes, found 0"),
    ("57", UnknownType, "unknown AMQP 1.0 type code 0x57 at offset 0"),
    ("5602", Malformed, "malformed data at offset 1: boolean octet must be 0 or 1, found 2"),
    ("8000", Truncated, "truncated ulong at offset 1: expected 8 bytes, found 1"),
    ("a00568", Truncated, "truncated vbin8 at offset 2: expected 5 bytes, found 1"),
    ("b00000", Truncated, "truncated vbin32 size at offset 1: expected 4 bytes, found 2"),
    (
        "7300110000",
        Malformed,
        "malformed data at offset 1: char code point 0x110000 is not a Unicode scalar value",
    ),
    (
        "d0ffffffff00000001",
        Truncated,
        "truncated list32 body at offset 5: expected 4294967295 bytes, found 4",
    ),
    ("c00105", Malformed, "malformed data at offset 1: list8 count 5 cannot fit in 0 bytes"),
    (
        "c103014140",
        Malformed,
        "malformed data at offset 1: map8 count 1 is odd (keys and values pair up)",
    ),
    ("c10904a1016141a1016142", Malformed, "malformed data at offset 7: duplicate map key 'a'"),
    (
        "c003025041",
        Malformed,
        "malformed data at offset 5: list8 entry overruns the list end at 5",
    ),
    (
        "c003014142",
        Malformed,
        "malformed data at offset 4: list8 size says it ends at 5, entries end at 4",
    ),
    ("4040", Malformed, "malformed data at offset 1: 1 bytes after the value"),
    ("e0050271000001", Malformed, "malformed data at offset 1: array8 count 2 x 4 != 3 bytes"),
    (
        "f0000000050001000140",
        Malformed,
        "malformed data at offset 1: array32 of 65537 zero-width elements",
    ),
    # zero-width elements beyond 8 per byte of their array: nested, they would expand a
    # small body into billions of values
    ("e002c840", Malformed, "malformed data at offset 1: array8 of 200 zero-width elements"),
    (
        "e0020100",
        Truncated,
        "truncated array descriptor format code at offset 4: expected 1 bytes, found 0",
    ),
    ("e00100", Malformed, "malformed data at offset 3: array8 has no element constructor"),
    ("c10402454040", Malformed, "malformed data at offset 3: map8 key of type Amqp10List"),
    ("00" * 100_000 + "40", Malformed, "malformed data at offset 0: nesting too deep"),
]


@pytest.mark.parametrize(("hexed", "err", "message"), BAD, ids=[b[0][:12] for b in BAD])
def test_bad_input_is_a_codec_error_with_its_offset(
    hexed: str, err: type[CodecError], message: str
) -> None:
    with pytest.raises(err) as exc:
        A.decode(bytes.fromhex(hexed))
    assert str(exc.value) == message


@pytest.mark.parametrize(("hexed", "value", "code"), VECTORS, ids=[v[0][:12] for v in VECTORS])
def test_every_strict_prefix_of_a_vector_is_an_error(hexed: str, value: Any, code: int) -> None:
    raw = bytes.fromhex(hexed)
    for n in range(len(raw)):
        with pytest.raises(CodecError):
            A.decode(raw[:n])


def test_bad_amqp10_bodies_are_problems_not_exceptions() -> None:
    ap = {**props("_data_indication", "_data"), BODY_ENCODING_PROPERTY: BODY_ENCODING_AMQP10}
    res = decode_message(bytes.fromhex("d0000000"), registry=SchemaRegistry(),
                         application_properties=ap, content_type="amqp/list")  # fmt: skip
    assert (res.dialect, res.records) == ("V2", [])
    assert [(p.error, p.message, p.opcode) for p in res.problems] == [
        ("Truncated", "truncated list32 header at offset 1: expected 8 bytes, found 3",
         "_data_indication"),
    ]  # fmt: skip
    other = {**ap, BODY_ENCODING_PROPERTY: "amqp-9"}
    res = decode_message(b"\x40", registry=SchemaRegistry(), application_properties=other)
    assert [p.message for p in res.problems] == [
        "malformed data at offset 0: unknown x-qmf-body-encoding 'amqp-9'"
    ]
    bare = {BODY_ENCODING_PROPERTY: BODY_ENCODING_AMQP10}
    res = decode_message(b"\x40", registry=SchemaRegistry(), application_properties=bare)
    assert (res.dialect, [p.message for p in res.problems]) == (
        None,
        ["malformed data at offset 0: x-qmf-body-encoding 'amqp-1.0' body without qmf.opcode: "
         "not QMF"],
    )  # fmt: skip


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=64))
def test_random_bytes_decode_or_raise_a_codec_error(raw: bytes) -> None:
    try:
        value, code = A.decode(raw)
    except CodecError:
        return
    assert A.encode(value, code) == raw


# --------------------------------------------------------------- proton as oracle


def _text(alphabet: st.SearchStrategy[str] | None = None, n: int = 20) -> st.SearchStrategy[str]:
    chars = st.characters(exclude_categories=("Cs",)) if alphabet is None else alphabet
    return st.text(chars, max_size=n)


_ascii = st.characters(min_codepoint=32, max_codepoint=126)
_scalars: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(0, 0xFF).map(ubyte),
    st.integers(0, 0xFFFF).map(ushort),
    st.integers(0, 2**32 - 1).map(uint),
    st.integers(0, 2**64 - 1).map(ulong),
    st.integers(-128, 127).map(byte),
    st.integers(-(2**15), 2**15 - 1).map(short),
    st.integers(-(2**31), 2**31 - 1).map(int32),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(width=32, allow_nan=False).map(float32),
    st.floats(allow_nan=False),
    st.integers(0, 2**32 - 1).map(decimal32),
    st.integers(0, 2**64 - 1).map(decimal64),
    st.binary(min_size=16, max_size=16).map(decimal128),
    st.characters(exclude_categories=("Cs",)).map(char),
    st.integers(-(2**63), 2**63 - 1).map(timestamp),
    st.uuids(),
    st.binary(max_size=300),
    _text(n=300),
    _text(_ascii).map(symbol),
)
_keys: st.SearchStrategy[Any] = st.one_of(
    _text(), st.integers(0, 2**64 - 1).map(ulong), st.uuids()
)  # (proton decodes binary keys as unhashable memoryviews)
_arrays: st.SearchStrategy[Any] = st.one_of(
    st.lists(st.integers(-(2**31), 2**31 - 1), max_size=5).map(
        lambda xs: Array(UNDESCRIBED, Data.INT, *xs)
    ),
    st.lists(_text(), max_size=5).map(lambda xs: Array(UNDESCRIBED, Data.STRING, *xs)),
    st.lists(st.booleans(), max_size=5).map(lambda xs: Array(UNDESCRIBED, Data.BOOL, *xs)),
    st.lists(st.integers(0, 2**63 - 1), max_size=5).map(  # proton's own limit
        lambda xs: Array(symbol("d"), Data.ULONG, *xs)
    ),
)
proton_values: st.SearchStrategy[Any] = st.recursive(
    st.one_of(_scalars, _arrays),
    lambda kids: st.one_of(
        st.lists(kids, max_size=6),
        st.dictionaries(_keys, kids, max_size=6),
        st.builds(
            PnDescribed,
            st.one_of(_text(_ascii).map(symbol), st.integers(0, 2**64 - 1).map(ulong)),
            # proton's get_object drops a described value's described value
            kids.filter(lambda x: not isinstance(x, PnDescribed)),
        ),
    ),
    max_leaves=25,
)


def plain(v: Any) -> Any:
    """Mine and proton's values in one comparable form (described/array tagged, decimals
    as their bytes, NaN-free floats as floats)."""
    if isinstance(v, Described | PnDescribed):
        return ("described", plain(v.descriptor), plain(v.value))
    if isinstance(v, Array):
        desc = None if v.descriptor is UNDESCRIBED else plain(v.descriptor)
        return ("array", desc, [plain(x) for x in v.elements])
    if isinstance(v, Amqp10Array):
        return ("array", plain(v.descriptor), [plain(x) for x in v])
    if isinstance(v, dict):
        return {plain(k): plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [plain(x) for x in v]
    if isinstance(v, decimal32):
        return int(v).to_bytes(4, "big")
    if isinstance(v, decimal64):
        return int(v).to_bytes(8, "big")
    if isinstance(v, bytes):
        return bytes(v)
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    if isinstance(v, str):
        return str(v)
    return v


def _proton_bytes(v: Any) -> bytes:
    d = Data()
    d.put_object(v)
    return bytes(d.encode())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(proton_values)
def test_protons_encoding_decodes_to_its_values_and_reencodes_exactly(v: Any) -> None:
    raw = _proton_bytes(v)
    back = Data()
    back.decode(raw)
    expected = plain(back.get_object())
    got, code = A.decode(raw, binary_text=False)
    assert plain(got) == expected
    assert A.encode(got, code) == raw
    text_value, text_code = A.decode(raw)  # QMF mode: same bytes again
    assert text_code == code and A.encode(text_value, text_code) == raw


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(-(2**63), 2**63 - 1),
            st.floats(allow_nan=False),
            _text(n=300),
            st.binary(max_size=300),
            st.uuids(),
        ),
        lambda kids: st.one_of(
            st.lists(kids, max_size=5), st.dictionaries(_text(), kids, max_size=5)
        ),
        max_leaves=20,
    )
)
def test_my_encoding_of_plain_values_is_protons(v: Any) -> None:
    assert A.encode(v) == _proton_bytes(v)


# ------------------------------------------------- the same records from both encodings


def amqp10_props(p: dict[str, str]) -> dict[str, str]:
    return {**p, BODY_ENCODING_PROPERTY: BODY_ENCODING_AMQP10}


# 0-10 bodies of every v2 message kind the pipeline handles (opcode, content, body, ctype)
EVENT = map_bytes(
    ("_schema_id", 0xA8, schema_id("bind", "_event")),
    ("_severity", 0x02, u8(6)),
    ("_timestamp", 0x32, u64(99)),
    ("_values", 0xA8, map_bytes(("qName", 0x90, v16("q1")), ("args", 0xA8, map_bytes()))),
)
PROP = map_bytes(
    ("_access", 0x90, v16("RO")), ("_name", 0x90, v16("name")), ("_type", 0x90, v16("TYPE_STRING"))
)
CLS = map_bytes(
    ("_methods", 0xA9, u32(4) + u32(0)),
    ("_properties", 0xA9, list_bytes(PROP)),
    ("_schema_id", 0xA8, schema_id("queue", "_data")),
)
OID = map_bytes(
    (
        "_object_id",
        0xA8,
        map_bytes(
            ("_agent_epoch", 0x32, u64(3)),
            ("_agent_name", 0x90, v16("a1")),
            ("_object_name", 0x90, v16("o1")),
        ),
    ),
    ("_values", 0xA8, map_bytes(("flag", 0x08, b"\x01"), ("big", 0x31, u64(2**40)))),
)
KINDS: list[tuple[str, str | None, bytes, str]] = [
    ("_data_indication", "_data", list_bytes(QUEUE, QUEUE), "amqp/list"),
    ("_data_indication", "_event", list_bytes(EVENT), "amqp/list"),
    ("_query_response", "_data", list_bytes(OID), "amqp/list"),
    ("_query_response", "_schema_id", list_bytes(schema_id("queue", "_data")), "amqp/list"),
    ("_query_response", "_schema_class", list_bytes(CLS), "amqp/list"),
    ("_query_response", "_other", list_bytes(PROP), "amqp/list"),
    (
        "_agent_heartbeat_indication",
        None,
        map_bytes(
            ("_values", 0xA8, map_bytes(("_name", 0x90, v16(AGENT)), ("_timestamp", 0x32, u64(77))))
        ),
        "amqp/map",
    ),
    (
        "_method_response",
        None,
        map_bytes(
            ("_arguments", 0xA8, map_bytes(("body", 0x90, v16("hi")), ("seq", 0x22, u32(7))))
        ),
        "amqp/map",
    ),
    (
        "_exception",
        None,
        map_bytes(
            (
                "_values",
                0xA8,
                map_bytes(("error_code", 0x22, u32(1)), ("error_text", 0x90, v16("no"))),
            )
        ),
        "amqp/map",
    ),
    ("_agent_locate_request", None, u32(4) + u32(0), "amqp/list"),
    (
        "_agent_locate_response",
        None,
        map_bytes(("_values", 0xA8, map_bytes(("_name", 0x90, v16(AGENT))))),
        "amqp/map",
    ),
    ("_subscribe_request", None, map_bytes(("_interval", 0x22, u32(1000))), "amqp/map"),
    ("_data_indication", "_data", u32(4 + 2) + u32(1) + b"\x02\x05", "amqp/list"),  # not maps
]


def decode(
    body: bytes, ap: dict[str, str], ctype: str, reg: SchemaRegistry | None = None
) -> list[Record]:
    res = decode_message(body, registry=reg or SchemaRegistry(), application_properties=ap,
                         content_type=ctype)  # fmt: skip
    assert res.problems == [] and res.dialect == "V2"
    return res.records


@pytest.mark.parametrize(
    ("opcode", "content", "body", "ctype"), KINDS, ids=[k[0] + str(k[1]) for k in KINDS]
)
def test_every_v2_kind_gives_the_same_records_in_both_encodings(
    opcode: str, content: str | None, body: bytes, ctype: str
) -> None:
    p = props(opcode, content)
    records = decode(body, p, ctype)
    assert records
    enc = encode_v2(records, encoding=BODY_ENCODING_AMQP10)
    assert enc.application_properties == {**encode_v2(records).application_properties,
                                          BODY_ENCODING_PROPERTY: BODY_ENCODING_AMQP10}  # fmt: skip
    assert enc.content_type == ctype
    again = decode(enc.body, enc.application_properties, enc.content_type)
    assert again == records
    # the AMQP 1.0 records re-encode exactly, and back to the original 0-10 bytes
    assert encode_v2(again, encoding=BODY_ENCODING_AMQP10).body == enc.body
    assert encode_v2(again).body == body


def test_data_indication_in_qpidds_amqp10_layout() -> None:
    """The QUEUE item of test_v2 as qpidd sends it over AMQP 1.0, hand-built: list32 of
    map32, str8 keys, strings as vbin8, uint64 times as ulong (compact forms for small
    values, as proton writes them), uuid hash."""

    def m32(*kv: bytes) -> bytes:
        body = b"".join(kv)
        return b"\xd1" + u32(4 + len(body)) + u32(len(kv)) + body

    def k(s: str) -> bytes:
        return b"\xa1" + u8(len(s)) + s.encode()

    def b8(s: str) -> bytes:
        return b"\xa0" + u8(len(s)) + s.encode()

    sid = m32(k("_class_name"), b8("queue"), k("_hash"), b"\x98" + HASH.bytes,
              k("_package_name"), b8("org.apache.qpid.broker"), k("_type"), b8("_data"))  # fmt: skip
    item = m32(
        k("_create_ts"), b"\x53\x0a", k("_delete_ts"), b"\x44",
        k("_object_id"), m32(k("_object_name"), b8("org.apache.qpid.broker:queue:q1")),
        k("_schema_id"), sid, k("_update_ts"), b"\x53\x14",
        k("_values"), m32(k("depth"), b"\x52\x05", k("name"), b8("q1")),
    )  # fmt: skip
    body = b"\xd0" + u32(4 + len(item)) + u32(1) + item
    p = props("_data_indication", "_data")
    records = decode(list_bytes(QUEUE), p, "amqp/list")
    assert encode_v2(records, encoding=BODY_ENCODING_AMQP10).body == body
    got = decode(body, amqp10_props(p), "amqp/list")
    assert got == records
    (rec,) = got
    assert isinstance(rec, ObjectSample) and rec.values == {"depth": 5, "name": "q1"}
    assert type(rec.values["name"]) is str  # binary arrives as text, as 0-10 vbin16 does
    assert encode_v2(got, encoding=BODY_ENCODING_AMQP10).body == body
    # built records (no source) encode the same way
    built = replace(rec, source=None, values=TypedMap({"depth": 5, "name": "q1"},
                                                      {"depth": 0x22, "name": 0x90}))  # fmt: skip
    assert encode_v2([built], encoding=BODY_ENCODING_AMQP10).body == body


def test_amqp_value_string_bodies_are_kept_whole() -> None:
    ap = {"qmf.opcode": "_exception", BODY_ENCODING_PROPERTY: BODY_ENCODING_STRING}
    (rec,) = decode("ça".encode(), ap, "text/plain")
    assert rec == V2Message(dialect="V2", opcode="_exception", content=None, body="ça")
    enc = encode_v2([rec], encoding=BODY_ENCODING_AMQP10)
    assert (enc.body, enc.application_properties[BODY_ENCODING_PROPERTY]) == (
        "ça".encode(),
        BODY_ENCODING_STRING,
    )
    ap2 = {**ap, "qmf.opcode": "_data_indication", "qmf.content": "_data"}
    assert decode(b"x", ap2, "text/plain") == [
        V2Message(dialect="V2", opcode="_data_indication", content="_data", body="x")
    ]
    res = decode_message(b"\xff", registry=SchemaRegistry(), application_properties=ap)
    assert [p.message for p in res.problems] == [
        "malformed data at offset 0: amqp-value string body is not UTF-8"
    ]


def test_binary_that_is_not_text_takes_the_0_10_path_to_the_schema() -> None:
    """A string element whose bytes are not UTF-8 stays bytes in both encodings (0-10
    vbin16, AMQP 1.0 vbin8) and the records are equal: the schema types both alike."""
    item = map_bytes(
        ("_schema_id", 0xA8, schema_id("queue", "_data")),
        ("_values", 0xA8, map_bytes(("name", 0x90, b"\x00\x02\xff\xfe"))),
    )
    p = props("_data_indication", "_data")
    (r10,) = decode(list_bytes(item), p, "amqp/list")
    enc = encode_v2([r10], encoding=BODY_ENCODING_AMQP10)
    assert b"\xa0\x02\xff\xfe" in enc.body
    (r1,) = decode(enc.body, enc.application_properties, enc.content_type)
    assert isinstance(r1, ObjectSample) and r1 == r10 and r1.values == {"name": b"\xff\xfe"}


# ---------------------------------------------------------------- the real samples


def samples_dir(shared_dir: str) -> str:
    return os.path.join(shared_dir, "samples", "qpidd-amqp10")


def _decode_all(path: str) -> Iterator[tuple[CapturedMessage, list[Record]]]:
    reg = seeded_registry()
    for m in read_capture(path):
        res = m.decode(reg)
        assert res.problems == [], (m.application_properties, res.problems)
        yield m, res.records


# (file, messages, amqp-1.0 bodies, {(dialect, record class): count})
SAMPLES = [
    ("default-60s.jsonl", 618, 523, {
        ("V2", "ObjectSample"): 701, ("V2", "Event"): 94, ("V2", "Heartbeat"): 37,
        ("AM2", "ClassIndication"): 45, ("AM2", "SchemaResponse"): 45,
        ("AM2", "CommandComplete"): 3, ("AM2", "PackageIndication"): 2,
        ("AM2", "BrokerResponse"): 1,
    }),
    ("qmf1-qmf2-60s.jsonl", 1143, 523, {
        ("V2", "ObjectSample"): 845, ("V2", "Event"): 94, ("V2", "Heartbeat"): 37,
        ("AM2", "ObjectSample"): 975, ("AM2", "Event"): 96, ("AM2", "Heartbeat"): 37,
        ("AM2", "ClassIndication"): 45, ("AM2", "SchemaResponse"): 45,
        ("AM2", "CommandComplete"): 3, ("AM2", "PackageIndication"): 2,
        ("AM2", "BrokerResponse"): 1,
    }),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "n_msgs", "n_amqp10", "counts"), SAMPLES, ids=[s[0] for s in SAMPLES]
)
def test_real_qpidd_amqp10_sample_decodes_without_problems(
    shared_dir: str, name: str, n_msgs: int, n_amqp10: int, counts: dict[tuple[str, str], int]
) -> None:
    """Every message decodes, with the exact record counts; every AMQP 1.0 body re-encodes
    byte for byte from its records, and its 0-10 translation decodes to the same records."""
    got: collections.Counter[tuple[str, str]] = collections.Counter()
    n = n10 = 0
    reg10 = seeded_registry()
    for m, records in _decode_all(os.path.join(samples_dir(shared_dir), name)):
        n += 1
        got.update((r.dialect, type(r).__name__) for r in records)
        if m.application_properties.get(BODY_ENCODING_PROPERTY) != BODY_ENCODING_AMQP10:
            continue
        n10 += 1
        enc = encode_v2(records, encoding=BODY_ENCODING_AMQP10)
        assert (enc.body, enc.content_type, enc.application_properties) == (
            m.body,
            m.content_type,
            m.application_properties,
        )
        as010 = encode_v2(records)
        res = decode_message(as010.body, registry=reg10, application_properties=as010.application_properties,
                             content_type=as010.content_type)  # fmt: skip
        assert res.problems == [] and res.records == records
        value, code = A.decode(m.body)
        assert A.encode(A.from_0_10(*A.to_0_10(value, code))[0], code) == m.body
    assert (n, n10) == (n_msgs, n_amqp10)
    assert dict(got) == counts


def test_real_0_10_v2_traffic_gives_the_same_records_as_amqp10(shared_dir: str) -> None:
    """The 0-10 encoded v2 messages of the same broker version, translated to qpidd's AMQP
    1.0 layout: the same records, and translated back the same bytes."""
    reg0, reg1 = seeded_registry(), seeded_registry()
    kinds: collections.Counter[tuple[str, str]] = collections.Counter()
    for m in read_capture(os.path.join(shared_dir, "samples", "qpidd-capture-20s.jsonl")):
        r0 = m.decode(reg0)
        assert r0.problems == []
        if r0.dialect != "V2":
            continue
        kinds.update((type(r).__name__, r.opcode) for r in r0.records)
        value, code = A.from_0_10(_parse_body(m.body, m.content_type))
        body = A.encode(value, code)
        ap = amqp10_props(dict(m.application_properties))
        r1 = decode_message(
            body, registry=reg1, application_properties=ap, content_type=m.content_type
        )
        assert r1.problems == [] and r1.records == r0.records
        back = bytearray()
        v10, c10 = A.to_0_10(*A.decode(body))
        (encode_map if c10 == 0xA8 else encode_list)(back, v10)
        assert bytes(back) == m.body
        if r0.records:
            assert encode_v2(r0.records, encoding=BODY_ENCODING_AMQP10).body == body
    assert dict(kinds) == {
        ("ObjectSample", "_data_indication"): 604, ("Event", "_data_indication"): 142,
        ("ObjectSample", "_query_response"): 96, ("Heartbeat", "_agent_heartbeat_indication"): 18,
        ("MethodResponse", "_method_response"): 9, ("QmfException", "_exception"): 3,
        ("V2Message", "_agent_locate_request"): 2, ("V2Message", "_agent_locate_response"): 1,
    }  # fmt: skip


@pytest.mark.parametrize("name", [s[0] for s in SAMPLES])
def test_cli_decode_summary_reports_no_problems(shared_dir: str, name: str) -> None:
    out = subprocess.run(
        [str(REPO / ".venv" / "bin" / "qmf"), "decode", "--input",
         os.path.join(samples_dir(shared_dir), name), "--summary"],
        capture_output=True, text=True, check=True, cwd=REPO,
    )  # fmt: skip
    assert '"decode_problems": 0' in out.stdout
    summary = json.loads(out.stdout)
    assert summary["decode_problems"] == 0
    assert summary["v2_by_opcode_content_ctype"] == {
        "_agent_heartbeat_indication|None|amqp/map": 37,
        "_data_indication|_data|amqp/list": 392,
        "_data_indication|_event|amqp/list": 94,
    }


# ------------------------------------------------------- cross-dialect agreement


class _Objects:
    """Object identities of one dialect: class + index properties, references followed."""

    def __init__(self, registry: SchemaRegistry, samples: list[ObjectSample], dialect: str) -> None:
        self.registry = registry
        self.dialect = dialect
        self.first: dict[Any, ObjectSample] = {}
        for r in samples:
            if dialect == "V2" or r.opcode == "c":  # AM2: properties come with 'c'
                self.first.setdefault(self.key_of(r), r)

    def key_of(self, r: ObjectSample) -> Any:
        oid = r.object_id
        return oid.object_name if self.dialect == "V2" else oid  # type: ignore[union-attr]

    def schema(self, r: ObjectSample) -> ClassSchema:
        s = self.registry.get(SchemaKey(r.package, r.class_name, r.schema_hash))
        assert s is not None
        return s

    def ref(self, v: Any) -> Any:
        """The object a reference names, as an identity."""
        if self.dialect == "V2":
            v = v.get("_object_name") if isinstance(v, dict) else None
        r = self.first.get(v)
        return None if r is None else self.identity(r)

    def identity(self, r: ObjectSample) -> Any:
        r = self.first.get(self.key_of(r), r)
        parts = []
        for e in self.schema(r).properties:
            if e.index:
                v = r.values.get(e.name)
                parts.append(self.ref(v) if e.type_code == 10 else v)
        return (r.class_name, tuple(parts))


def test_v2_and_am2_samples_of_the_same_object_agree(shared_dir: str) -> None:
    """qmf1-qmf2-60s: qpidd publishes each object in both dialects with the same update
    time. Every AM2 object sample has its V2 sample (same object by class and index
    properties, references followed; same update time). Typed by the schema, they hold
    the same values for every property both carry. Statistics agree except where qpidd
    read the object again between its two publishes (V2 is written after AM2): watermark
    statistics (reset at each publish) and a few counters one increment later."""
    reg = seeded_registry()
    v2: list[ObjectSample] = []
    am2: list[ObjectSample] = []
    for _, records in _decode_all(os.path.join(samples_dir(shared_dir), "qmf1-qmf2-60s.jsonl")):
        for r in records:
            if isinstance(r, ObjectSample):
                (v2 if r.dialect == "V2" else am2).append(r)
    objs_v2, objs_am2 = _Objects(reg, v2, "V2"), _Objects(reg, am2, "AM2")
    by_time: dict[Any, list[ObjectSample]] = collections.defaultdict(list)
    for r in v2:
        by_time[(objs_v2.identity(r), r.update_ns)].append(r)
    pairs = compared = 0
    differ: collections.Counter[str] = collections.Counter()
    later_counter = True
    q50: list[tuple[int, int]] = []
    for r in am2:
        ident = objs_am2.identity(r)
        # a deleted object's V2 deletion notice reuses its last update time: either sample
        cands = by_time[(ident, r.update_ns)]
        assert cands, (ident, r.update_ns)
        pairs += 1
        schema = objs_am2.schema(r)
        types = {e.name: e.type_code for e in (*schema.properties, *schema.statistics)}
        stats = {e.name for e in schema.statistics}
        for name in r.values.keys() & set().union(*(c.values.keys() for c in cands)):
            compared += 1
            mine = objs_am2.ref(r.values[name]) if types[name] == 10 else r.values[name]
            theirs = [objs_v2.ref(c.values.get(name)) if types[name] == 10 else c.values.get(name)
                      for c in cands]  # fmt: skip
            if mine in theirs:
                continue
            watermark = (
                name.endswith(("High", "Low"))
                and name.removesuffix("High").removesuffix("Low") in types
            )
            differ[
                "watermark" if watermark else ("statistic" if name in stats else "property")
            ] += 1
            if "Total" in name and not all(t > mine for t in theirs):
                later_counter = False
        if ident[0] == "queue" and ident[1][-1] == "q-rate-50" and "msgTotalEnqueues" in r.values:
            assert len(cands) == 1
            q50.append((r.values["msgTotalEnqueues"], cands[0].values["msgTotalEnqueues"]))
    assert (len(v2), len(am2), pairs, compared, dict(differ), later_counter) == (
        845,
        975,
        975,
        13547,
        {"watermark": 63, "statistic": 34},
        True,
    )
    assert later_counter  # a Total counter that differs is always higher in V2 (read later)
    assert len(q50) == 31 and all(a == b for a, b in q50)
    assert isinstance(am2[0].object_id, Am2ObjectId)


def test_heartbeats_of_both_encodings_name_the_agent(shared_dir: str) -> None:
    beats = [r for _, rs in _decode_all(os.path.join(samples_dir(shared_dir), "default-60s.jsonl"))
             for r in rs if isinstance(r, Heartbeat)]  # fmt: skip
    assert len(beats) == 37 and {b.agent for b in beats} == {
        "apache.org:qpidd:5d96acd7-cdc3-439a-b982-ded428b19f02"
    }
    assert all(b.timestamp_ns > 1_700_000_000 * 10**9 for b in beats)


def test_module_is_importable_without_proton() -> None:
    """The codec does not need proton (only the oracle tests do)."""
    code = (
        "import sys; sys.modules['proton'] = None; import pipeline.codec.amqp10, pipeline.codec.v2"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_a_binary_hash_that_reads_as_text_is_still_the_hash() -> None:
    """Binary decodes as text when it is UTF-8 (as 0-10 vbin16): a 16-byte ``_hash`` sent as
    binary rather than uuid that happens to be ASCII still gives the schema hash."""
    h = b"0123456789abcdef"
    sid = Amqp10Map(
        [("_class_name", "queue"), ("_hash", h), ("_package_name", "p"), ("_type", "_data")]
    )
    body = Amqp10List([Amqp10Map([("_schema_id", sid), ("_values", Amqp10Map([("n", 1)]))])])
    p = amqp10_props(props("_data_indication", "_data"))
    (rec,) = decode(A.encode(body), p, "amqp/list")
    assert isinstance(rec, ObjectSample) and (rec.package, rec.class_name, rec.schema_hash) == (
        "p",
        "queue",
        h,
    )


@pytest.mark.parametrize(
    ("name", "n_samples", "n_others"),
    [("default-60s.jsonl", 701, 227), ("qmf1-qmf2-60s.jsonl", 1820, 360)],
)
@pytest.mark.parametrize("compact", [False, True])
def test_batch_decode_gives_the_same_tables_from_both_encodings(
    shared_dir: str, name: str, n_samples: int, n_others: int, compact: bool
) -> None:
    """Downstream of the codec (``decode_content``, what silver runs): the sample as
    landed (AMQP 1.0 bodies) and the same messages with 0-10 bodies give equal sample
    tables (values typed by the schema: binary strings become the same texts) and equal
    other records, with nothing quarantined."""
    import pyarrow as pa

    from pipeline.codec.vectorized import decode_content

    reg = seeded_registry()
    landed: list[tuple[bytes, str | None, dict[str, Any]]] = []
    as010: list[tuple[bytes, str | None, dict[str, Any]]] = []
    for m in read_capture(os.path.join(samples_dir(shared_dir), name)):
        ap = dict(m.application_properties)
        landed.append((m.body, m.content_type, ap))
        if ap.get(BODY_ENCODING_PROPERTY) == BODY_ENCODING_AMQP10:
            res = decode_message(m.body, registry=reg, application_properties=ap,
                                 content_type=m.content_type)  # fmt: skip
            enc = encode_v2(res.records)
            as010.append((enc.body, enc.content_type, enc.application_properties))
        else:
            as010.append((m.body, m.content_type, ap))

    def batch(rows: list[tuple[bytes, str | None, dict[str, Any]]]) -> pa.Table:
        return pa.table({
            "body": pa.array([r[0] for r in rows], pa.binary()),
            "content_type": pa.array([r[1] for r in rows], pa.string()),
            "application_properties": pa.array(
                [list(r[2].items()) for r in rows], pa.map_(pa.string(), pa.string())
            ),
        })  # fmt: skip

    a = decode_content(batch(landed), seeded_registry(), compact=compact)
    b = decode_content(batch(as010), seeded_registry(), compact=compact)
    assert (a.quarantine.num_rows, b.quarantine.num_rows) == (0, 0)
    if compact:
        assert a.table is not None and b.table is not None
        assert a.table.num_rows == n_samples and a.table.equals(b.table)
    else:
        assert a.samples.keys() == b.samples.keys()
        assert sum(t.num_rows for t in a.samples.values()) == n_samples
        assert all(a.samples[k].equals(b.samples[k]) for k in a.samples)
    assert len(a.others) == n_others and [r for _, r in a.others] == [r for _, r in b.others]


def test_prefixes_and_byte_flips_of_a_real_body_are_errors_or_exact(shared_dir: str) -> None:
    """A real qpidd data indication (maps of str8 keys: the decoder's inline path): every
    strict prefix is a codec error; every one-byte change decodes to something that
    re-encodes to exactly the changed bytes, or is a codec error."""
    body = next(
        m.body
        for m in read_capture(os.path.join(samples_dir(shared_dir), "default-60s.jsonl"))
        if m.application_properties.get("qmf.content") == "_data"
    )
    for n in range(len(body)):
        with pytest.raises(CodecError):
            A.decode(body[:n])
    outcomes: collections.Counter[str] = collections.Counter()
    for i in range(len(body)):
        for delta in (1, 0x80):
            changed = bytearray(body)
            changed[i] = (changed[i] + delta) & 0xFF
            try:
                value, code = A.decode(bytes(changed))
            except CodecError:
                outcomes["error"] += 1
                continue
            assert A.encode(value, code) == bytes(changed)
            outcomes["exact"] += 1
    assert sum(outcomes.values()) == 2 * len(body) and outcomes["error"] > 0
    assert outcomes["exact"] > 0


# qpidd's value types in v2 maps (qpid::types::Variant over 0-10), for the property test
_QPIDD_LEAVES: list[tuple[int, st.SearchStrategy[Any]]] = [
    (0x01, st.integers(-128, 127)),
    (0x02, S.u8s),
    (0x08, st.booleans()),
    (0x11, st.integers(-(1 << 15), (1 << 15) - 1)),
    (0x12, S.u16s),
    (0x21, st.integers(-(1 << 31), (1 << 31) - 1)),
    (0x22, S.u32s),
    (0x23, st.floats(width=32, allow_nan=False)),
    (0x31, S.i64s),
    (0x32, S.u64s),
    (0x33, st.floats(allow_nan=False)),
    (0x48, S.uuids),
    (0x90, S.texts),
    (0x95, S.texts),
    (0xF0, st.none()),
]


def _qpidd_maps() -> st.SearchStrategy[TypedMap]:
    leaf = st.one_of([st.tuples(st.just(c), s) for c, s in _QPIDD_LEAVES])

    def containers(kids: st.SearchStrategy[tuple[int, Any]]) -> st.SearchStrategy[tuple[int, Any]]:
        maps = st.dictionaries(S.names, kids, max_size=4).map(
            lambda d: (
                0xA8,
                TypedMap([(k, v) for k, (_, v) in d.items()], {k: c for k, (c, _) in d.items()}),
            )
        )
        lists = st.lists(kids, max_size=4).map(
            lambda xs: (0xA9, TypedList([v for _, v in xs], [c for c, _ in xs]))
        )
        return st.one_of(maps, lists)

    values = st.recursive(leaf, containers, max_leaves=8)
    return st.dictionaries(S.names, values, max_size=5).map(
        lambda d: TypedMap([(k, v) for k, (_, v) in d.items()], {k: c for k, (c, _) in d.items()})
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(S.v2_records(), st.data())
def test_any_v2_message_gives_the_same_records_in_both_encodings(
    records: list[Record], data: st.DataObject
) -> None:
    """Records of every v2 kind the strategies build, with qpidd's value types: encoded
    0-10 and AMQP 1.0, both decode to the records; the AMQP 1.0 ones re-encode exactly in
    AMQP 1.0 and give the 0-10 bytes back."""
    fields = {"ObjectSample": "values", "Event": "arguments", "MethodResponse": "arguments",
              "V2Message": "body"}  # fmt: skip
    records = [
        replace(r, **{fields[type(r).__name__]: data.draw(_qpidd_maps())})  # type: ignore[arg-type]
        if type(r).__name__ in fields
        else r
        for r in records
    ]
    enc10 = encode_v2(records)
    enc1 = encode_v2(records, encoding=BODY_ENCODING_AMQP10)
    assert enc1.application_properties == {
        **enc10.application_properties,
        BODY_ENCODING_PROPERTY: BODY_ENCODING_AMQP10,
    }
    r10 = decode(enc10.body, enc10.application_properties, enc10.content_type)
    r1 = decode(enc1.body, enc1.application_properties, enc1.content_type)
    assert r10 == records and r1 == records
    assert encode_v2(r1, encoding=BODY_ENCODING_AMQP10).body == enc1.body
    assert encode_v2(r1).body == enc10.body


@pytest.mark.parametrize("field", ["_properties", "_methods"])
@pytest.mark.parametrize("odd", [7, {"x": 1}])
def test_a_schema_whose_element_list_is_not_a_list_decodes_without_raising(field: str, odd: Any) -> None:
    """Well-formed AMQP 1.0, but not QMF's shape: never an exception out of the codec."""
    sid = {"_package_name": b"p", "_class_name": b"c", "_hash": uuid.UUID(int=1), "_type": b"_data"}
    item = {"_schema_id": sid, "_properties": [], "_methods": []}
    item[field] = odd
    d = Data()
    d.put_object([item])
    res = decode_message(
        bytes(d.encode()), registry=SchemaRegistry(), content_type="amqp/list",
        application_properties={"qmf.opcode": "_query_response", "qmf.content": "_schema_class",
                                 A.BODY_ENCODING_PROPERTY: A.BODY_ENCODING_AMQP10},
    )  # fmt: skip
    assert res.problems == []
    [rec] = res.records
    assert rec.schema.key == SchemaKey("p", "c", uuid.UUID(int=1).bytes)  # type: ignore[attr-defined]
    assert (rec.schema.properties, rec.schema.methods) == ((), ())  # type: ignore[attr-defined]
