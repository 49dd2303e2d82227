"""Hand-built byte vectors, written from the spec tables (AM1), the dialect notes (AM2)
and the AMQP 0-10 type table; shared by the codec tests (a table like proton's codec tests).

Byte strings are spelled out here with ``struct`` only for integers; nothing here
calls the codec.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

from pipeline.codec.types import Am1ObjectId, Am2ObjectId, QmfValue, TypedArray, TypedList, TypedMap


def u8(v: int) -> bytes:
    return struct.pack(">B", v)


def u16(v: int) -> bytes:
    return struct.pack(">H", v)


def u32(v: int) -> bytes:
    return struct.pack(">I", v)


def u64(v: int) -> bytes:
    return struct.pack(">Q", v)


def s8(s: str) -> bytes:
    raw = s.encode()
    return u8(len(raw)) + raw


def v16(s: str) -> bytes:
    raw = s.encode()
    return u16(len(raw)) + raw


def map_bytes(*entries: tuple[str, int, bytes]) -> bytes:
    """A 0-10 map from (key, type code, encoded value) triples."""
    body = b"".join(s8(k) + u8(c) + v for k, c, v in entries)
    return u32(4 + len(body)) + u32(len(entries)) + body


def tmap(*entries: tuple[str, int, Any]) -> TypedMap:
    return TypedMap([(k, v) for k, _, v in entries], {k: c for k, c, _ in entries})


UUID = uuid.UUID("96e8ff02-7df9-4aaa-b0bd-0ef186095f23")

# (type code, decoded value, encoded bytes after the code octet)
AMQP_VECTORS: list[tuple[int, Any, bytes]] = [
    (0x00, b"\x07", b"\x07"),  # bin8
    (0x01, -2, b"\xfe"),  # int8
    (0x02, 200, b"\xc8"),  # uint8
    (0x04, "A", b"A"),  # char
    (0x08, True, b"\x01"),  # boolean
    (0x08, False, b"\x00"),
    (0x10, b"\x01\x02", b"\x01\x02"),  # bin16
    (0x11, -2, b"\xff\xfe"),  # int16
    (0x12, 0x1234, b"\x12\x34"),  # uint16
    (0x20, b"abcd", b"abcd"),  # bin32
    (0x21, -1, b"\xff\xff\xff\xff"),  # int32
    (0x22, 4242, b"\x00\x00\x10\x92"),  # uint32
    (0x23, 1.5, b"\x3f\xc0\x00\x00"),  # float
    (0x27, "\u20ac", b"\x00\x00\x20\xac"),  # char-utf32
    (0x30, b"12345678", b"12345678"),  # bin64
    (0x31, -2, b"\xff" * 7 + b"\xfe"),  # int64
    (0x32, 1 << 63, b"\x80" + b"\x00" * 7),  # uint64
    (0x33, 1.5, b"\x3f\xf8" + b"\x00" * 6),  # double
    (0x38, 1700000000, b"\x00\x00\x00\x00\x65\x53\xf1\x00"),  # datetime
    (0x40, bytes(range(16)), bytes(range(16))),  # bin128
    (0x48, UUID, UUID.bytes),  # uuid
    (0x50, bytes(32), bytes(32)),  # bin256
    (0x60, bytes(64), bytes(64)),  # bin512
    (0x70, bytes(128), bytes(128)),  # bin1024
    (0x80, b"\xff\x00", b"\x02\xff\x00"),  # vbin8, not text: stays bytes
    (0x80, "ok", b"\x02ok"),  # vbin8 holding text
    (0x84, "\u00e9", b"\x01\xe9"),  # str8-latin
    (0x85, "\u00e9", b"\x02\xc3\xa9"),  # str8 (utf-8)
    (0x86, "\u00e9", b"\x02\x00\xe9"),  # str8-utf16
    (0x90, "abc", b"\x00\x03abc"),  # vbin16 (qpid's strings)
    (0x94, "\u00e9", b"\x00\x01\xe9"),  # str16-latin
    (0x95, "\u00e9", b"\x00\x02\xc3\xa9"),  # str16
    (0x96, "\u00e9", b"\x00\x02\x00\xe9"),  # str16-utf16
    (0xA0, "hi", b"\x00\x00\x00\x02hi"),  # vbin32
    (0xA8, tmap(("a", 0x02, 1)), b"\x00\x00\x00\x08\x00\x00\x00\x01\x01a\x02\x01"),  # map
    (0xA8, TypedMap(), b"\x00\x00\x00\x04\x00\x00\x00\x00"),  # empty map
    (0xA9, TypedList([1, None], [0x02, 0xF0]), b"\x00\x00\x00\x07\x00\x00\x00\x02\x02\x01\xf0"),
    (0xAA, TypedArray([1, 2], 0x12), b"\x00\x00\x00\x09\x12\x00\x00\x00\x02\x00\x01\x00\x02"),
    (0xAB, b"xyz", b"\x00\x00\x00\x03xyz"),  # struct32, kept opaque
    (0xC0, b"12345", b"12345"),  # bin40
    (0xC8, b"\x02\x00\x00\x01\x00", b"\x02\x00\x00\x01\x00"),  # dec32, kept opaque
    (0xD0, b"123456789", b"123456789"),  # bin72
    (0xD8, b"\x02" + bytes(8), b"\x02" + bytes(8)),  # dec64, kept opaque
    (0xF0, None, b""),  # void
    (0xF1, True, b""),  # bit
]

# (dialect, QMF type code, decoded value, encoded bytes) -- spec type table + AM2 notes
QMF_VECTORS: list[tuple[str, int, Any, bytes]] = [
    ("AM1", 1, 7, b"\x07"),
    ("AM1", 2, 0x0102, b"\x01\x02"),
    ("AM1", 3, 4242, b"\x00\x00\x10\x92"),
    ("AM1", 4, (1 << 64) - 1, b"\xff" * 8),
    ("AM1", 6, "q1", b"\x02q1"),
    ("AM1", 7, "q1", b"\x00\x02q1"),
    ("AM1", 8, (1 << 64) - 1, b"\xff" * 8),  # absTime is uint64 in AM1
    ("AM2", 8, -1, b"\xff" * 8),  # ... and read as int64 for AM2
    ("AM1", 9, 5, u64(5)),
    ("AM1", 10, Am1ObjectId(1, 2, 3), b"\x00\x01\x00\x00\x02\x00\x00\x03"),
    ("AM2", 10, Am2ObjectId(0, 1, 1, 0, 20), b"\x00\x01\x00\x00\x10\x00\x00\x00" + u64(20)),
    ("AM1", 11, True, b"\x01"),
    ("AM1", 12, 0.5, b"\x3f\x00\x00\x00"),
    ("AM1", 13, 0.5, b"\x3f\xe0" + bytes(6)),
    ("AM1", 14, UUID, UUID.bytes),
    ("AM1", 15, tmap(("k", 0x90, "v")), map_bytes(("k", 0x90, v16("v")))),
    ("AM1", 16, -1, b"\xff"),
    ("AM1", 17, -2, b"\xff\xfe"),
    ("AM1", 18, -3, b"\xff\xff\xff\xfd"),
    ("AM1", 19, -4, b"\xff" * 7 + b"\xfc"),
    ("AM2", 20, QmfValue(6, "x"), b"\x06\x01x"),  # object holding a non-object value
    ("AM2", 21, TypedList(["a"], [0x90]), b"\x00\x00\x00\x08\x00\x00\x00\x01\x90\x00\x01a"),
    ("AM2", 22, TypedArray([7], 0x22), b"\x00\x00\x00\x09\x22\x00\x00\x00\x01\x00\x00\x00\x07"),
]
