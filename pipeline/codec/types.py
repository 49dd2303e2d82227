"""AMQP 0-10 primitives and QMF value types, decoded and encoded through dispatch tables.

Two families of type codes meet in QMF:

* AMQP 0-10 type codes (``AMQP_TYPES``) tag every value inside 0-10 maps,
  lists and arrays (QMF v2 bodies, v1 schema maps, get queries, type 15/21/22
  values). Decoded containers are ``TypedMap`` / ``TypedList`` /
  ``TypedArray``: ordinary dict/list subclasses that remember each entry's
  wire type code, so ``encode(decode(x)) == x`` byte for byte (qpid writes
  strings as vbin16, counts as uint8 or int32, ... and a plain dict would
  lose that). Plain dicts/lists encode with inferred codes (``infer_code``).
* QMF type codes 1..22 (``qmf_types(dialect)``) tag the elements of a class
  schema; v1 content, events and method arguments carry bare values in
  schema order. AM1 and AM2 differ in object references (8 vs 16 bytes) and
  absTime (uint64 vs int64).

Decoders have the signature ``(buf, off) -> (value, new_off)``; they work on
``bytes`` with precompiled ``struct.Struct`` unpackers and raise only
``CodecError`` subclasses. Encoders are ``(out: bytearray, value) -> None``.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.codec.errors import EncodeError, Malformed, Truncated, UnknownType

Decoder = Callable[[bytes, int], tuple[Any, int]]
Encoder = Callable[[bytearray, Any], None]

U8 = struct.Struct(">B")
U16 = struct.Struct(">H")
U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")
I8 = struct.Struct(">b")
I16 = struct.Struct(">h")
I32 = struct.Struct(">i")
I64 = struct.Struct(">q")
F32 = struct.Struct(">f")
F64 = struct.Struct(">d")
U64X2 = struct.Struct(">QQ")
U32X2 = struct.Struct(">II")


# --------------------------------------------------------------------------- values


class TypedMap(dict[str, Any]):
    """A decoded 0-10 map that remembers each key's wire type code (``codes``)."""

    __slots__ = ("codes",)

    def __init__(
        self,
        items: Iterable[tuple[str, Any]] | Mapping[str, Any] = (),
        codes: Mapping[str, int] | None = None,
    ) -> None:
        super().__init__(items)
        self.codes: dict[str, int] = dict(codes or {})


class TypedList(list[Any]):
    """A decoded 0-10 list that remembers each entry's wire type code (``codes``)."""

    __slots__ = ("codes",)

    def __init__(self, items: Iterable[Any] = (), codes: Iterable[int] | None = None) -> None:
        super().__init__(items)
        self.codes: list[int] = list(codes or [])


class TypedArray(list[Any]):
    """A decoded 0-10 array: one element type code (``code``) for all entries."""

    __slots__ = ("code",)

    def __init__(self, items: Iterable[Any] = (), code: int = 0xF0) -> None:
        super().__init__(items)
        self.code = code


@dataclass(frozen=True, slots=True)
class Am1ObjectId:
    """AM1 object id: one u64 = reserved bit 63, boot sequence 62..48, bank 47..24, object 23..0."""

    boot_seq: int
    bank: int
    object_num: int
    reserved: int = 0

    @classmethod
    def from_int(cls, v: int) -> Am1ObjectId:
        return cls((v >> 48) & 0x7FFF, (v >> 24) & 0xFFFFFF, v & 0xFFFFFF, v >> 63)

    def to_int(self) -> int:
        return (self.reserved << 63) | (self.boot_seq << 48) | (self.bank << 24) | self.object_num

    def columns(self) -> dict[str, Any]:
        return {"boot_seq": self.boot_seq, "bank": self.bank, "object_num": self.object_num}

    def __str__(self) -> str:
        # bit 63 is reserved ("must be zero"): never hide it behind the three parts
        if self.reserved:
            return f"{self.to_int():#018x}"
        return f"{self.boot_seq}-{self.bank}-{self.object_num}"


@dataclass(frozen=True, slots=True)
class Am2ObjectId:
    """AM2 object id: two u64; first = flags 63..60, epoch 59..48, broker bank 47..28, agent bank 27..0."""

    flags: int
    epoch: int
    broker_bank: int
    agent_bank: int
    object_num: int

    @classmethod
    def from_ints(cls, first: int, second: int) -> Am2ObjectId:
        return cls(
            first >> 60, (first >> 48) & 0xFFF, (first >> 28) & 0xFFFFF, first & 0xFFFFFFF, second
        )

    def first(self) -> int:
        return (self.flags << 60) | (self.epoch << 48) | (self.broker_bank << 28) | self.agent_bank

    def columns(self) -> dict[str, Any]:
        return {
            "flags": self.flags,
            "epoch": self.epoch,
            "broker_bank": self.broker_bank,
            "agent_bank": self.agent_bank,
            "object_num": self.object_num,
        }

    def __str__(self) -> str:
        """The text form qpid uses in get queries: ``flags-seq-brokerbank-agentbank-object``."""
        return f"{self.flags}-{self.epoch}-{self.broker_bank}-{self.agent_bank}-{self.object_num}"


@dataclass(frozen=True, slots=True)
class V2ObjectId:
    """QMF v2 object id map: agent name, agent epoch (transient ids only), object name."""

    object_name: str
    agent_name: str | None = None
    epoch: int | None = None

    def columns(self) -> dict[str, Any]:
        return {"agent_name": self.agent_name, "epoch": self.epoch, "object_name": self.object_name}

    def __str__(self) -> str:
        return f"{self.agent_name or ''}:{self.epoch if self.epoch is not None else ''}:{self.object_name}"


ObjectId = Am1ObjectId | Am2ObjectId | V2ObjectId


@dataclass(frozen=True, slots=True)
class QmfValue:
    """A value of QMF type 20 (object) whose inner type code is not 20."""

    code: int
    value: Any


@dataclass(slots=True)
class EmbeddedObject:
    """A QMF type-20 value holding an unmanaged object: class key plus values by name."""

    package: str
    class_name: str
    schema_hash: bytes
    values: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------- decode helpers


def need(buf: bytes, off: int, n: int, what: str = "value") -> int:
    """Return ``off + n`` or raise Truncated if the buffer is shorter."""
    end = off + n
    if end > len(buf):
        raise Truncated(off, n, max(len(buf) - off, 0), what)
    return end


def fixed_decoder(st: struct.Struct, what: str) -> Decoder:
    """A decoder of one big-endian fixed-size value (shared with ``amqp10``)."""
    size = st.size
    unpack = st.unpack_from

    def dec(buf: bytes, off: int) -> tuple[Any, int]:
        end = off + size
        if end > len(buf):
            raise Truncated(off, size, max(len(buf) - off, 0), what)
        return unpack(buf, off)[0], end

    return dec


def _fixed_enc(st: struct.Struct, what: str) -> Encoder:
    pack = st.pack

    def enc(out: bytearray, v: Any) -> None:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise EncodeError(f"{what} needs a number, got {type(v).__name__}")
        try:
            out += pack(v)
        except struct.error as exc:
            raise EncodeError(f"{what} out of range: {v!r}") from exc

    return enc


def _raw(width: int, what: str) -> Decoder:
    def dec(buf: bytes, off: int) -> tuple[Any, int]:
        end = off + width
        if end > len(buf):
            raise Truncated(off, width, max(len(buf) - off, 0), what)
        return buf[off:end], end

    return dec


def _raw_enc(width: int, what: str) -> Encoder:
    def enc(out: bytearray, v: Any) -> None:
        if not isinstance(v, bytes | bytearray) or len(v) != width:
            raise EncodeError(f"{what} needs {width} bytes, got {v!r}")
        out += v

    return enc


def _text(raw: bytes, encoding: str) -> str | bytes:
    """Decode text; invalid text stays bytes so re-encoding is exact."""
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError:
        return raw


def _var(size_st: struct.Struct, encoding: str | None, what: str) -> Decoder:
    """Variable-size value (vbin/str): size prefix then bytes, text decoded if an encoding is given.

    vbin values decode as UTF-8 text when valid (qpid writes strings as vbin16),
    else stay bytes.
    """
    ssize = size_st.size
    unpack = size_st.unpack_from
    enc_name = encoding or "utf-8"

    def dec(buf: bytes, off: int) -> tuple[Any, int]:
        p = off + ssize
        if p > len(buf):
            raise Truncated(off, ssize, max(len(buf) - off, 0), what + " size")
        (n,) = unpack(buf, off)
        end = p + n
        if end > len(buf):
            raise Truncated(p, n, len(buf) - p, what)
        raw = buf[p:end]
        try:
            return raw.decode(enc_name), end
        except UnicodeDecodeError:
            return raw, end

    return dec


def _var_enc(size_st: struct.Struct, encoding: str | None, what: str) -> Encoder:
    pack = size_st.pack
    limit = (1 << (8 * size_st.size)) - 1
    enc_name = encoding or "utf-8"

    def enc(out: bytearray, v: Any) -> None:
        if isinstance(v, str):
            try:
                raw = v.encode(enc_name)
            except UnicodeEncodeError as exc:
                raise EncodeError(f"{what}: {exc}") from exc
        elif isinstance(v, bytes | bytearray | memoryview):
            raw = bytes(v)
        else:
            raise EncodeError(f"{what} needs str or bytes, got {type(v).__name__}")
        if len(raw) > limit:
            raise EncodeError(f"{what} too long: {len(raw)} > {limit}")
        out += pack(len(raw))
        out += raw

    return enc


def _dec_bool(buf: bytes, off: int) -> tuple[Any, int]:
    if off >= len(buf):
        raise Truncated(off, 1, 0, "boolean")
    b = buf[off]
    if b > 1:
        raise Malformed(off, f"boolean octet must be 0 or 1, found {b}")
    return b == 1, off + 1


def _enc_bool(out: bytearray, v: Any) -> None:
    if not isinstance(v, bool | int) or v not in (0, 1):
        raise EncodeError(f"boolean needs True/False, got {v!r}")
    out.append(1 if v else 0)


def _dec_char(buf: bytes, off: int) -> tuple[Any, int]:
    if off >= len(buf):
        raise Truncated(off, 1, 0, "char")
    return chr(buf[off]), off + 1


def _enc_char(out: bytearray, v: Any) -> None:
    if not isinstance(v, str) or len(v) != 1 or ord(v) > 255:
        raise EncodeError(f"char needs one latin-1 character, got {v!r}")
    out.append(ord(v))


def _dec_char32(buf: bytes, off: int) -> tuple[Any, int]:
    v, end = _dec_u32(buf, off)
    if v > 0x10FFFF:
        raise Malformed(off, f"char-utf32 code point 0x{v:x} out of range")
    return chr(v), end


def _enc_char32(out: bytearray, v: Any) -> None:
    if not isinstance(v, str) or len(v) != 1:
        raise EncodeError(f"char-utf32 needs one character, got {v!r}")
    out += U32.pack(ord(v))


def _dec_uuid(buf: bytes, off: int) -> tuple[Any, int]:
    end = off + 16
    if end > len(buf):
        raise Truncated(off, 16, max(len(buf) - off, 0), "uuid")
    return uuid.UUID(bytes=buf[off:end]), end


def _enc_uuid(out: bytearray, v: Any) -> None:
    if isinstance(v, uuid.UUID):
        out += v.bytes
    elif isinstance(v, bytes | bytearray) and len(v) == 16:
        out += v
    else:
        raise EncodeError(f"uuid needs uuid.UUID or 16 bytes, got {v!r}")


def _dec_void(buf: bytes, off: int) -> tuple[Any, int]:
    return None, off


def _enc_void(out: bytearray, v: Any) -> None:
    if v is not None:
        raise EncodeError(f"void needs None, got {v!r}")


def _dec_bit(buf: bytes, off: int) -> tuple[Any, int]:
    return True, off


def _enc_bit(out: bytearray, v: Any) -> None:
    if v is not True:
        raise EncodeError(f"bit needs True, got {v!r}")


_dec_u8 = fixed_decoder(U8, "uint8")
_dec_u16 = fixed_decoder(U16, "uint16")
_dec_u32 = fixed_decoder(U32, "uint32")
_dec_u64 = fixed_decoder(U64, "uint64")

# ------------------------------------------------------------------ containers

_MAX_ZERO_WIDTH = 1 << 16  # bound on arrays of void/bit (they take no bytes per entry)


def decode_map(buf: bytes, off: int) -> tuple[TypedMap, int]:
    """0-10 map: size u32, count u32, entries (key str8, type u8, value)."""
    if off + 8 > len(buf):
        raise Truncated(off, 8, max(len(buf) - off, 0), "map header")
    size, count = U32X2.unpack_from(buf, off)
    end = off + 4 + size
    if end > len(buf):
        raise Truncated(off + 4, size, len(buf) - off - 4, "map body")
    if size < 4:
        raise Malformed(off, f"map size {size} < 4")
    if count * 2 > size - 4:
        raise Malformed(off, f"map count {count} cannot fit in {size - 4} bytes")
    p = off + 8
    result = TypedMap()
    codes = result.codes
    decoders = AMQP_DECODERS
    for _ in range(count):
        if p >= end:
            raise Malformed(p, f"map entry overruns the map end at {end}")
        klen = buf[p]
        kend = p + 1 + klen
        if kend >= end:
            raise Malformed(p, f"map key overruns the map end at {end}")
        try:
            key = buf[p + 1 : kend].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Malformed(p, "map key is not UTF-8") from exc
        if key in codes:
            raise Malformed(p, f"duplicate map key {key!r}")
        code = buf[kend]
        dec = decoders.get(code)
        if dec is None:
            raise UnknownType(kend, code)
        value, p = dec(buf, kend + 1)
        if p > end:
            raise Malformed(kend, f"map value overruns the map end at {end}")
        result[key] = value
        codes[key] = code
    if p != end:
        raise Malformed(p, f"map size says it ends at {end}, entries end at {p}")
    return result, end


def decode_list(buf: bytes, off: int) -> tuple[TypedList, int]:
    """0-10 list: size u32, count u32, entries (type u8, value)."""
    if off + 8 > len(buf):
        raise Truncated(off, 8, max(len(buf) - off, 0), "list header")
    size, count = U32X2.unpack_from(buf, off)
    end = off + 4 + size
    if end > len(buf):
        raise Truncated(off + 4, size, len(buf) - off - 4, "list body")
    if size < 4:
        raise Malformed(off, f"list size {size} < 4")
    if count > size - 4:
        raise Malformed(off, f"list count {count} cannot fit in {size - 4} bytes")
    p = off + 8
    result = TypedList()
    codes = result.codes
    decoders = AMQP_DECODERS
    for _ in range(count):
        if p >= end:
            raise Malformed(p, f"list entry overruns the list end at {end}")
        code = buf[p]
        dec = decoders.get(code)
        if dec is None:
            raise UnknownType(p, code)
        value, q = dec(buf, p + 1)
        if q > end:
            raise Malformed(p, f"list value overruns the list end at {end}")
        result.append(value)
        codes.append(code)
        p = q
    if p != end:
        raise Malformed(p, f"list size says it ends at {end}, entries end at {p}")
    return result, end


def decode_array(buf: bytes, off: int) -> tuple[TypedArray, int]:
    """0-10 array: size u32, element type u8, count u32, values."""
    if off + 9 > len(buf):
        raise Truncated(off, 9, max(len(buf) - off, 0), "array header")
    (size,) = U32.unpack_from(buf, off)
    end = off + 4 + size
    if end > len(buf):
        raise Truncated(off + 4, size, len(buf) - off - 4, "array body")
    if size < 5:
        raise Malformed(off, f"array size {size} < 5")
    code = buf[off + 4]
    (count,) = U32.unpack_from(buf, off + 5)
    dec = AMQP_DECODERS.get(code)
    if dec is None:
        raise UnknownType(off + 4, code)
    if count > (size - 5 if AMQP_WIDTH.get(code, 1) != 0 else _MAX_ZERO_WIDTH):
        raise Malformed(off, f"array count {count} cannot fit in {size - 5} bytes")
    p = off + 9
    result = TypedArray(code=code)
    for _ in range(count):
        value, p = dec(buf, p)
        if p > end:
            raise Malformed(p, f"array value overruns the array end at {end}")
        result.append(value)
    if p != end:
        raise Malformed(p, f"array size says it ends at {end}, values end at {p}")
    return result, end


def infer_code(v: Any) -> int:
    """The 0-10 type code used for a plain Python value (qpid's choices)."""
    if v is None:
        return 0xF0
    if isinstance(v, bool):
        return 0x08
    if isinstance(v, int):
        return 0x31 if -(1 << 63) <= v < (1 << 63) else 0x32
    if isinstance(v, float):
        return 0x33
    if isinstance(v, str):
        return 0x90 if len(v) <= 0x3FFF else 0xA0
    if isinstance(v, bytes | bytearray):
        return 0xA0
    if isinstance(v, uuid.UUID):
        return 0x48
    if isinstance(v, TypedArray):
        return 0xAA
    if isinstance(v, Mapping):
        return 0xA8
    if isinstance(v, list | tuple):
        return 0xA9
    if isinstance(v, V2ObjectId | Am1ObjectId | Am2ObjectId):
        return 0x90
    raise EncodeError(f"no AMQP 0-10 type for {type(v).__name__}")


def encode_typed(out: bytearray, code: int, v: Any) -> None:
    """Append one value with an explicit 0-10 type code (no code octet)."""
    enc = AMQP_ENCODERS.get(code)
    if enc is None:
        raise EncodeError(f"unknown AMQP 0-10 type code 0x{code:02x}")
    if isinstance(v, V2ObjectId | Am1ObjectId | Am2ObjectId) and code in _TEXT_CODES:
        v = str(v)
    enc(out, v)


def _patch_size(out: bytearray, at: int) -> None:
    size = len(out) - at - 4
    if size > 0xFFFFFFFF:
        raise EncodeError("container larger than 4 GiB")
    out[at : at + 4] = U32.pack(size)


def encode_map(out: bytearray, m: Mapping[str, Any]) -> None:
    """Append a 0-10 map; a TypedMap keeps its recorded codes, other values get inferred ones."""
    codes: Mapping[str, int] = m.codes if isinstance(m, TypedMap) else {}
    at = len(out)
    out += U32X2.pack(0, len(m))
    for key, v in m.items():
        if not isinstance(key, str):
            raise EncodeError(f"map keys must be str, got {key!r}")
        kraw = key.encode("utf-8")
        if len(kraw) > 255:
            raise EncodeError(f"map key too long: {key[:40]!r}")
        out.append(len(kraw))
        out += kraw
        code = codes.get(key)
        if code is None:
            code = infer_code(v)
        out.append(code)
        encode_typed(out, code, v)
    _patch_size(out, at)


def encode_list(out: bytearray, items: Iterable[Any]) -> None:
    items = list(items) if not isinstance(items, list | tuple) else items
    codes: list[int] = items.codes if isinstance(items, TypedList) else []
    at = len(out)
    out += U32X2.pack(0, len(items))
    for i, v in enumerate(items):
        code = codes[i] if i < len(codes) else infer_code(v)
        out.append(code)
        encode_typed(out, code, v)
    _patch_size(out, at)


def encode_array(out: bytearray, items: Iterable[Any], code: int | None = None) -> None:
    items = list(items)
    if code is None:
        code = (
            items.code
            if isinstance(items, TypedArray)
            else (infer_code(items[0]) if items else 0xF0)
        )
    at = len(out)
    out += U32.pack(0)
    out.append(code)
    out += U32.pack(len(items))
    for v in items:
        encode_typed(out, code, v)
    _patch_size(out, at)


def _enc_map(out: bytearray, v: Any) -> None:
    if not isinstance(v, Mapping):
        raise EncodeError(f"map needs a mapping, got {type(v).__name__}")
    encode_map(out, v)


def _enc_list(out: bytearray, v: Any) -> None:
    if not isinstance(v, list | tuple):
        raise EncodeError(f"list needs a list, got {type(v).__name__}")
    encode_list(out, v)


def _enc_array(out: bytearray, v: Any) -> None:
    if not isinstance(v, list | tuple):
        raise EncodeError(f"array needs a list, got {type(v).__name__}")
    encode_array(out, v, v.code if isinstance(v, TypedArray) else None)


# ------------------------------------------------------------------ 0-10 table


@dataclass(frozen=True)
class AmqpType:
    code: int
    name: str
    width: int  # fixed width in octets, or -1/-2/-4 for a 1/2/4-octet size prefix
    decode: Decoder
    encode: Encoder


def _width_of(code: int) -> int | None:
    """Width class of a 0-10 type code (its high bits), None for reserved classes."""
    hi = code >> 4
    fixed = {0: 1, 1: 2, 2: 4, 3: 8, 4: 16, 5: 32, 6: 64, 7: 128, 0xC: 5, 0xD: 9, 0xF: 0}
    if hi in fixed:
        return fixed[hi]
    return {8: -1, 9: -2, 0xA: -4}.get(hi)


def _var_raw(st: struct.Struct, what: str) -> Decoder:
    ssize = st.size
    unpack = st.unpack_from

    def dec(buf: bytes, off: int) -> tuple[Any, int]:
        p = off + ssize
        if p > len(buf):
            raise Truncated(off, ssize, max(len(buf) - off, 0), what + " size")
        (n,) = unpack(buf, off)
        end = p + n
        if end > len(buf):
            raise Truncated(p, n, len(buf) - p, what)
        return buf[p:end], end

    return dec


def _build_amqp_table() -> dict[int, AmqpType]:
    known: list[tuple[int, str, Decoder, Encoder]] = [
        (0x01, "int8", fixed_decoder(I8, "int8"), _fixed_enc(I8, "int8")),
        (0x02, "uint8", _dec_u8, _fixed_enc(U8, "uint8")),
        (0x04, "char", _dec_char, _enc_char),
        (0x08, "boolean", _dec_bool, _enc_bool),
        (0x11, "int16", fixed_decoder(I16, "int16"), _fixed_enc(I16, "int16")),
        (0x12, "uint16", _dec_u16, _fixed_enc(U16, "uint16")),
        (0x21, "int32", fixed_decoder(I32, "int32"), _fixed_enc(I32, "int32")),
        (0x22, "uint32", _dec_u32, _fixed_enc(U32, "uint32")),
        (0x23, "float", fixed_decoder(F32, "float"), _fixed_enc(F32, "float")),
        (0x27, "char-utf32", _dec_char32, _enc_char32),
        (0x31, "int64", fixed_decoder(I64, "int64"), _fixed_enc(I64, "int64")),
        (0x32, "uint64", _dec_u64, _fixed_enc(U64, "uint64")),
        (0x33, "double", fixed_decoder(F64, "double"), _fixed_enc(F64, "double")),
        (0x38, "datetime", fixed_decoder(I64, "datetime"), _fixed_enc(I64, "datetime")),
        (0x48, "uuid", _dec_uuid, _enc_uuid),
        (0x80, "vbin8", _var(U8, None, "vbin8"), _var_enc(U8, None, "vbin8")),
        (
            0x84,
            "str8-latin",
            _var(U8, "latin-1", "str8-latin"),
            _var_enc(U8, "latin-1", "str8-latin"),
        ),
        (0x85, "str8", _var(U8, "utf-8", "str8"), _var_enc(U8, "utf-8", "str8")),
        (
            0x86,
            "str8-utf16",
            _var(U8, "utf-16-be", "str8-utf16"),
            _var_enc(U8, "utf-16-be", "str8-utf16"),
        ),
        (0x90, "vbin16", _var(U16, None, "vbin16"), _var_enc(U16, None, "vbin16")),
        (
            0x94,
            "str16-latin",
            _var(U16, "latin-1", "str16-latin"),
            _var_enc(U16, "latin-1", "str16-latin"),
        ),
        (0x95, "str16", _var(U16, "utf-8", "str16"), _var_enc(U16, "utf-8", "str16")),
        (
            0x96,
            "str16-utf16",
            _var(U16, "utf-16-be", "str16-utf16"),
            _var_enc(U16, "utf-16-be", "str16-utf16"),
        ),
        (0xA0, "vbin32", _var(U32, None, "vbin32"), _var_enc(U32, None, "vbin32")),
        (0xA8, "map", decode_map, _enc_map),
        (0xA9, "list", decode_list, _enc_list),
        (0xAA, "array", decode_array, _enc_array),
        (0xF0, "void", _dec_void, _enc_void),
        (0xF1, "bit", _dec_bit, _enc_bit),
    ]
    table: dict[int, AmqpType] = {}
    for code, name, dec, enc in known:
        w = _width_of(code)
        assert w is not None
        table[code] = AmqpType(code, name, w, dec, enc)
    # Every other code of a known width class decodes as opaque bytes (the 0-10
    # spec makes widths derivable from the code so unknown types can be skipped).
    for code in range(256):
        if code in table:
            continue
        w = _width_of(code)
        if w is None:
            continue
        name = f"opaque-0x{code:02x}"
        if w >= 0:
            table[code] = AmqpType(code, name, w, _raw(w, name), _raw_enc(w, name))
        else:
            st = {-1: U8, -2: U16, -4: U32}[w]
            table[code] = AmqpType(code, name, w, _var_raw(st, name), _var_enc(st, None, name))
    return table


AMQP_TYPES: dict[int, AmqpType] = _build_amqp_table()
AMQP_DECODERS: dict[int, Decoder] = {c: t.decode for c, t in AMQP_TYPES.items()}
AMQP_ENCODERS: dict[int, Encoder] = {c: t.encode for c, t in AMQP_TYPES.items()}
AMQP_WIDTH: dict[int, int] = {c: t.width for c, t in AMQP_TYPES.items()}
_TEXT_CODES = frozenset({0x80, 0x84, 0x85, 0x86, 0x90, 0x94, 0x95, 0x96, 0xA0})


def decode_amqp(buf: bytes, off: int, code: int) -> tuple[Any, int]:
    """Decode one 0-10 value of the given type code."""
    dec = AMQP_DECODERS.get(code)
    if dec is None:
        raise UnknownType(off, code)
    return dec(buf, off)


# ----------------------------------------------------------- QMF value types

QMF_TYPE_NAMES: dict[int, str] = {
    1: "uint8",
    2: "uint16",
    3: "uint32",
    4: "uint64",
    6: "sstr",
    7: "lstr",
    8: "absTime",
    9: "deltaTime",
    10: "ref",
    11: "bool",
    12: "float",
    13: "double",
    14: "uuid",
    15: "map",
    16: "int8",
    17: "int16",
    18: "int32",
    19: "int64",
    20: "object",
    21: "list",
    22: "array",
}


def _dec_ref_am1(buf: bytes, off: int) -> tuple[Any, int]:
    end = off + 8
    if end > len(buf):
        raise Truncated(off, 8, max(len(buf) - off, 0), "object id")
    return Am1ObjectId.from_int(U64.unpack_from(buf, off)[0]), end


def _enc_ref_am1(out: bytearray, v: Any) -> None:
    if isinstance(v, Am1ObjectId):
        out += U64.pack(v.to_int())
    elif isinstance(v, int) and not isinstance(v, bool) and 0 <= v < (1 << 64):
        out += U64.pack(v)
    else:
        raise EncodeError(f"AM1 object reference needs Am1ObjectId, got {v!r}")


def _dec_ref_am2(buf: bytes, off: int) -> tuple[Any, int]:
    end = off + 16
    if end > len(buf):
        raise Truncated(off, 16, max(len(buf) - off, 0), "object id")
    a, b = U64X2.unpack_from(buf, off)
    return Am2ObjectId.from_ints(a, b), end


def _enc_ref_am2(out: bytearray, v: Any) -> None:
    if not isinstance(v, Am2ObjectId):
        raise EncodeError(f"AM2 object reference needs Am2ObjectId, got {v!r}")
    try:
        out += U64X2.pack(v.first(), v.object_num)
    except struct.error as exc:
        raise EncodeError(f"AM2 object id out of range: {v}") from exc


def _dec_qbool(buf: bytes, off: int) -> tuple[Any, int]:
    if off >= len(buf):
        raise Truncated(off, 1, 0, "bool")
    b = buf[off]
    if b > 1:
        raise Malformed(off, f"bool octet must be 0 or 1, found {b}")
    return b == 1, off + 1


def _qmf_table(dialect: str) -> dict[int, tuple[Decoder, Encoder]]:
    ref = (_dec_ref_am2, _enc_ref_am2) if dialect == "AM2" else (_dec_ref_am1, _enc_ref_am1)
    abstime = (
        (fixed_decoder(I64, "absTime"), _fixed_enc(I64, "absTime"))
        if dialect == "AM2"
        else (_dec_u64, _fixed_enc(U64, "absTime"))
    )
    return {
        1: (_dec_u8, _fixed_enc(U8, "uint8")),
        2: (_dec_u16, _fixed_enc(U16, "uint16")),
        3: (_dec_u32, _fixed_enc(U32, "uint32")),
        4: (_dec_u64, _fixed_enc(U64, "uint64")),
        6: (_var(U8, "utf-8", "sstr"), _var_enc(U8, "utf-8", "sstr")),
        7: (_var(U16, "utf-8", "lstr"), _var_enc(U16, "utf-8", "lstr")),
        8: abstime,
        9: (_dec_u64, _fixed_enc(U64, "deltaTime")),
        10: ref,
        11: (_dec_qbool, _enc_bool),
        12: (fixed_decoder(F32, "float"), _fixed_enc(F32, "float")),
        13: (fixed_decoder(F64, "double"), _fixed_enc(F64, "double")),
        14: (_dec_uuid, _enc_uuid),
        15: (decode_map, _enc_map),
        16: (fixed_decoder(I8, "int8"), _fixed_enc(I8, "int8")),
        17: (fixed_decoder(I16, "int16"), _fixed_enc(I16, "int16")),
        18: (fixed_decoder(I32, "int32"), _fixed_enc(I32, "int32")),
        19: (fixed_decoder(I64, "int64"), _fixed_enc(I64, "int64")),
        21: (decode_list, _enc_list),
        22: (decode_array, _enc_array),
    }


_QMF_TABLES = {"AM1": _qmf_table("AM1"), "AM2": _qmf_table("AM2")}


def qmf_types(dialect: str) -> dict[int, tuple[Decoder, Encoder]]:
    """QMF type code -> (decoder, encoder) for a v1 dialect ("AM1" or "AM2").

    Type 20 (object) is not in the table: it needs the schema registry and is
    handled by ``pipeline.codec.v1``.
    """
    return _QMF_TABLES["AM2" if dialect == "AM2" else "AM1"]


# --------------------------------------------------------- small wire helpers


def read_str8(buf: bytes, off: int, what: str = "str8") -> tuple[str, int]:
    """A str8 that must be text (package/class/method names)."""
    if off >= len(buf):
        raise Truncated(off, 1, 0, what + " size")
    n = buf[off]
    end = off + 1 + n
    if end > len(buf):
        raise Truncated(off + 1, n, len(buf) - off - 1, what)
    try:
        return buf[off + 1 : end].decode("utf-8"), end
    except UnicodeDecodeError as exc:
        raise Malformed(off, f"{what} is not UTF-8") from exc


def read_text8(buf: bytes, off: int, what: str = "str8") -> tuple[str | bytes, int]:
    """A str8 that stays bytes when it is not UTF-8 (free text: exact re-encoding)."""
    if off >= len(buf):
        raise Truncated(off, 1, 0, what + " size")
    n = buf[off]
    end = off + 1 + n
    if end > len(buf):
        raise Truncated(off + 1, n, len(buf) - off - 1, what)
    return _text(buf[off + 1 : end], "utf-8"), end


def read_text16(buf: bytes, off: int, what: str = "str16") -> tuple[str | bytes, int]:
    if off + 2 > len(buf):
        raise Truncated(off, 2, max(len(buf) - off, 0), what + " size")
    (n,) = U16.unpack_from(buf, off)
    end = off + 2 + n
    if end > len(buf):
        raise Truncated(off + 2, n, len(buf) - off - 2, what)
    return _text(buf[off + 2 : end], "utf-8"), end


def write_str8(out: bytearray, s: str | bytes, what: str = "str8") -> None:
    raw = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    if len(raw) > 255:
        raise EncodeError(f"{what} too long: {len(raw)} > 255")
    out.append(len(raw))
    out += raw


def write_str16(out: bytearray, s: str | bytes, what: str = "str16") -> None:
    raw = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    if len(raw) > 0xFFFF:
        raise EncodeError(f"{what} too long: {len(raw)} > 65535")
    out += U16.pack(len(raw))
    out += raw


def read_bin(buf: bytes, off: int, n: int, what: str) -> tuple[bytes, int]:
    end = off + n
    if end > len(buf):
        raise Truncated(off, n, max(len(buf) - off, 0), what)
    return buf[off:end], end


def read_u8(buf: bytes, off: int, what: str = "uint8") -> tuple[int, int]:
    if off >= len(buf):
        raise Truncated(off, 1, 0, what)
    return buf[off], off + 1


def read_struct(st: struct.Struct, buf: bytes, off: int, what: str) -> tuple[Any, ...]:
    if off + st.size > len(buf):
        raise Truncated(off, st.size, max(len(buf) - off, 0), what)
    return st.unpack_from(buf, off)
