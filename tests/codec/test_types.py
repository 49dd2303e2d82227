"""AMQP 0-10 and QMF value types: every type code, byte for byte, both ways; errors."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.codec.errors import EncodeError, Malformed, Truncated, UnknownType
from pipeline.codec.schema import SchemaRegistry
from pipeline.codec.types import (
    AMQP_TYPES,
    TypedList,
    TypedMap,
    decode_amqp,
    decode_map,
    encode_list,
    encode_map,
    encode_typed,
)
from pipeline.codec.v1 import _value_codec
from tests.codec.vectors import AMQP_VECTORS, QMF_VECTORS, map_bytes, u32, v16


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b) and not (isinstance(a, dict) and isinstance(b, dict)):
        return False
    if isinstance(a, TypedMap):
        return a == b and a.codes == b.codes and list(a) == list(b)
    if isinstance(a, TypedList):
        return a == b and a.codes == b.codes
    return bool(a == b)


@pytest.mark.parametrize(("code", "value", "raw"), AMQP_VECTORS, ids=lambda x: repr(x)[:20])
def test_amqp_vector_decodes_and_encodes(code: int, value: Any, raw: bytes) -> None:
    buf = b"!" + raw + b"~"  # the value sits between other bytes
    got, end = decode_amqp(buf, 1, code)
    assert _same(got, value)
    assert end == 1 + len(raw)
    out = bytearray()
    encode_typed(out, code, value)
    assert bytes(out) == raw


def test_every_known_amqp_code_has_a_vector() -> None:
    named = {c for c, t in AMQP_TYPES.items() if not t.name.startswith("opaque")}
    assert named - {c for c, _, _ in AMQP_VECTORS} == set()


@pytest.mark.parametrize("code", [0xB0, 0xBF, 0xE0, 0xEF])
def test_reserved_amqp_codes_are_unknown(code: int) -> None:
    assert code not in AMQP_TYPES
    with pytest.raises(UnknownType, match=f"0x{code:02x} at offset 3"):
        decode_amqp(b"\x00" * 8, 3, code)


@pytest.mark.parametrize(
    ("dialect", "code", "value", "raw"), QMF_VECTORS, ids=lambda x: repr(x)[:20]
)
def test_qmf_vector_decodes_and_encodes(dialect: str, code: int, value: Any, raw: bytes) -> None:
    dec, enc = _value_codec(code, dialect, SchemaRegistry())
    got, end = dec(raw + b"tail", 0)
    assert _same(got, value)
    assert end == len(raw)
    out = bytearray()
    enc(out, value)
    assert bytes(out) == raw


def test_every_qmf_type_code_has_a_vector() -> None:
    assert {c for _, c, _, _ in QMF_VECTORS} == set(range(1, 23)) - {5}


def test_qmf_type_5_is_unknown() -> None:
    dec, enc = _value_codec(5, "AM2", SchemaRegistry())
    with pytest.raises(UnknownType, match="unknown QMF type code 0x05 at offset 0"):
        dec(b"\x00", 0)
    with pytest.raises(EncodeError):
        enc(bytearray(), 1)


def test_truncated_value_reports_offset_expected_found() -> None:
    with pytest.raises(Truncated) as err:
        decode_amqp(b"\x00\x00\x00\x01\x02", 2, 0x32)
    assert (err.value.offset, err.value.expected, err.value.found) == (2, 8, 3)
    assert str(err.value) == "truncated uint64 at offset 2: expected 8 bytes, found 3"


def test_truncated_string_reports_its_length() -> None:
    with pytest.raises(Truncated, match="truncated vbin16 at offset 2: expected 5 bytes, found 2"):
        decode_amqp(b"\x00\x05ab", 0, 0x90)


def test_map_size_must_match_entries() -> None:
    good = map_bytes(("a", 0x02, b"\x01"))
    bad = u32(9) + good[4:] + b"\x00"  # claims one byte more than the entries use
    with pytest.raises(Malformed, match="map size says it ends at 13, entries end at 12"):
        decode_map(bad, 0)


def test_map_duplicate_key_is_malformed() -> None:
    raw = map_bytes(("a", 0x02, b"\x01"), ("a", 0x02, b"\x02"))
    with pytest.raises(Malformed, match="duplicate map key 'a'"):
        decode_map(raw, 0)


def test_boolean_other_than_0_1_is_malformed() -> None:
    with pytest.raises(Malformed, match="boolean octet must be 0 or 1, found 2"):
        decode_amqp(b"\x02", 0, 0x08)


def test_plain_dict_encodes_with_qpid_codes() -> None:
    out = bytearray()
    encode_map(out, {"s": "v", "n": 5, "b": True, "x": None})
    assert bytes(out) == map_bytes(
        ("s", 0x90, v16("v")),
        ("n", 0x31, b"\x00" * 7 + b"\x05"),
        ("b", 0x08, b"\x01"),
        ("x", 0xF0, b""),
    )


def test_typed_map_keeps_its_codes_and_order() -> None:
    raw = map_bytes(("z", 0x21, b"\x00\x00\x00\x01"), ("a", 0x95, b"\x00\x01q"))
    m, end = decode_map(raw, 0)
    assert (list(m.items()), m.codes, end) == (
        [("z", 1), ("a", "q")],
        {"z": 0x21, "a": 0x95},
        len(raw),
    )
    out = bytearray()
    encode_map(out, m)
    assert bytes(out) == raw


def test_encode_rejects_out_of_range_and_wrong_types() -> None:
    with pytest.raises(EncodeError, match="uint8 out of range: 256"):
        encode_typed(bytearray(), 0x02, 256)
    with pytest.raises(EncodeError, match="needs a number"):
        encode_typed(bytearray(), 0x22, "1")
    with pytest.raises(EncodeError, match="vbin8 too long"):
        encode_typed(bytearray(), 0x80, "x" * 256)
    with pytest.raises(EncodeError, match="unknown AMQP 0-10 type code 0xb0"):
        encode_typed(bytearray(), 0xB0, 1)


def test_list_round_trip_with_inferred_codes() -> None:
    out = bytearray()
    encode_list(out, [1, "a"])
    assert (
        bytes(out) == u32(4 + 9 + 4) + u32(2) + b"\x31" + b"\x00" * 7 + b"\x01" + b"\x90\x00\x01a"
    )
