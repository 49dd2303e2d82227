"""decode_message: dialect detection, problems with offsets, good records kept before a bad one."""

from __future__ import annotations

import pytest

from pipeline.codec.message import decode_message, detect_dialect, routing_agent
from pipeline.codec.records import Heartbeat, ObjectSample
from pipeline.codec.schema import SchemaRegistry
from tests.codec.test_am2_vectors import AM1_OID, AM1_OID_RAW, HASH, KEY, TIMES, hdr, registry
from tests.codec.vectors import map_bytes, u32, u64

HB = hdr("AM2", "h") + u64(5)


@pytest.mark.parametrize(
    ("body", "props", "app_id", "expected"),
    [
        (b"AM1h", None, None, "AM1"),
        (b"AM2h", None, None, "AM2"),
        (b"AM2h", {"qmf.opcode": "_exception"}, None, "V2"),  # the header wins over bytes
        (map_bytes(), None, "qmf2", "V2"),
        (map_bytes(), {"x": 1}, None, None),
        (b"", None, None, None),
    ],
)
def test_detect_dialect(
    body: bytes, props: dict[str, object] | None, app_id: str | None, expected: str | None
) -> None:
    assert detect_dialect(body, application_properties=props, app_id=app_id) == expected


def test_bad_magic_and_empty_body_are_problems() -> None:
    res = decode_message(b"XYZh\x00\x00\x00\x00", registry=SchemaRegistry())
    assert (res.dialect, res.records) == (None, [])
    assert [p.message for p in res.problems] == [
        "bad magic at offset 0: expected b'AM1' or b'AM2', found b'XYZ'"
    ]
    res = decode_message(b"", registry=SchemaRegistry())
    assert [p.message for p in res.problems] == [
        "truncated record header at offset 0: expected 8 bytes, found 0"
    ]


def test_good_records_before_a_bad_tail_are_kept() -> None:
    body = HB + HB + b"AM2h\x00\x00"
    res = decode_message(memoryview(body), registry=SchemaRegistry())
    assert [type(r) for r in res.records] == [Heartbeat, Heartbeat]
    assert [(p.error, p.offset, p.message) for p in res.problems] == [
        ("Truncated", 32, "truncated record header at offset 32: expected 8 bytes, found 6")
    ]


def test_problems_name_offsets_and_expectations() -> None:
    cases = [
        (HB + b"AM2?" + u32(0), "UnknownOpcode", "unknown opcode '?' at offset 19"),
        (
            HB + b"QM2h" + u32(0),
            "BadMagic",
            "bad magic at offset 16: expected b'AM1' or b'AM2', found b'QM2'",
        ),
        (
            HB + hdr("AM2", "h") + b"\x00\x01",
            "Truncated",
            "truncated heartbeat timestamp at offset 24: expected 8 bytes, found 2",
        ),
        (
            HB + hdr("AM1", "i") + KEY[:-16] + bytes(16) + TIMES + u64(AM1_OID.to_int()),
            "MissingSchema",
            "no schema for org.test:widget(00000000000000000000000000000000) at offset 24",
        ),
        (
            HB + hdr("AM1", "G") + u32(8) + u32(1) + b"\x01a\xe5\x00",
            "UnknownType",
            "unknown AMQP 0-10 type code 0xe5 at offset 34",
        ),
    ]
    for body, error, message in cases:
        res = decode_message(body, registry=registry())
        assert [type(r) for r in res.records] == [Heartbeat]
        assert [(p.error, p.message) for p in res.problems] == [(error, message)]


def test_deep_nesting_is_a_problem_not_a_crash() -> None:
    inner = map_bytes()
    for _ in range(3000):
        inner = map_bytes(("m", 0xA8, inner))
    res = decode_message(hdr("AM2", "G") + inner, registry=SchemaRegistry())
    assert res.records == []
    assert [p.error for p in res.problems] == ["Malformed"]
    assert "nesting too deep" in res.problems[0].message


def test_am1_agent_comes_from_the_routing_key() -> None:
    raw = hdr("AM1", "i") + KEY + TIMES + u64(AM1_OID_RAW) + u64(3) + b"\x3f\xe0" + bytes(6)
    res = decode_message(raw, registry=registry(), routing_key="mgmt.agent7.stat.org.test.widget")
    (rec,) = res.records
    assert isinstance(rec, ObjectSample) and rec.agent == "agent7"
    assert rec.schema_hash == HASH
    assert routing_agent("console.obj.1.0.org.test.widget") is None


def test_application_properties_as_arrow_map_pairs() -> None:
    body = map_bytes(("_arguments", 0xA8, map_bytes()))
    res = decode_message(
        body, registry=SchemaRegistry(), application_properties=[("qmf.opcode", "_method_response")]
    )
    assert res.dialect == "V2"
    assert [r.opcode for r in res.records] == ["_method_response"]


def test_a_missing_body_is_a_problem() -> None:
    res = decode_message(None, registry=SchemaRegistry())  # type: ignore[arg-type]
    assert [(p.error, p.message) for p in res.problems] == [
        ("Malformed", "malformed data at offset 0: body is NoneType, not bytes")
    ]
