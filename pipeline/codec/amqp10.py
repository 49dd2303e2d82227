"""The AMQP 1.0 type system (spec part 1.6), decoded and encoded through dispatch tables.

Why it is here: over AMQP 1.0 a real qpidd sends QMF v2 bodies as an
``amqp-value`` section (a list for ``_data_indication``, a map otherwise), and
the receiver lands the value AMQP 1.0 encoded with the application property
``x-qmf-body-encoding: amqp-1.0`` (``BODY_ENCODING_PROPERTY``). qpidd's strings
arrive as *binary*.

Values decode to what the 0-10 decoder (``types.py``) gives for the same QMF
content, so both encodings make the same records: binary is text when it is
UTF-8 (as 0-10 vbin16 is), else bytes; strings and symbols are ``str``; every
integer width is ``int``; uuid is ``uuid.UUID``; timestamp is an ``int`` (ms);
decimals stay ``bytes``; described values are ``Described``. ``RAW_DECODERS``
(``decode(..., binary_text=False)``) keeps binary as ``bytes``, proton's view.

Containers are ``Amqp10Map`` / ``Amqp10List`` / ``Amqp10Array``: dict/list
subclasses that remember each entry's format code (and their own), so
``encode(decode(x)) == x`` byte for byte. They are deliberately *not*
``TypedMap``/``TypedList`` subclasses: the 0-10 encoder never reads AMQP 1.0
codes as 0-10 ones (``to_0_10`` / ``from_0_10`` translate between the two).

Decoders have the signature ``(buf, off) -> (value, new_off)`` with ``off`` just
after the format code; encoders ``(out, value) -> None`` write the value
without its code. Only ``CodecError`` subclasses are raised, with offsets.
"""

from __future__ import annotations

import math
import struct
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.codec.errors import EncodeError, Malformed, Truncated, UnknownType
from pipeline.codec.types import TypedArray, TypedList, TypedMap, fixed_decoder, infer_code

__all__ = [
    "BODY_ENCODING_AMQP10",
    "BODY_ENCODING_PROPERTY",
    "BODY_ENCODING_STRING",
    "Amqp10Array",
    "Amqp10List",
    "Amqp10Map",
    "Described",
    "Float32",
    "decode",
    "decode_value",
    "encode",
    "encode_value",
    "from_0_10",
    "to_0_10",
]

# The receiver's marker of a body landed from an amqp-value section (receivers/receiver.py).
BODY_ENCODING_PROPERTY = "x-qmf-body-encoding"
BODY_ENCODING_AMQP10 = "amqp-1.0"  # the value AMQP 1.0 encoded (proton's Data.encode)
BODY_ENCODING_STRING = "amqp-value:string"  # a string value, landed as its UTF-8 bytes

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
U8X2 = struct.Struct(">BB")
U32X2 = struct.Struct(">II")

# Format codes (spec 1.6: "Primitive Type Definitions").
DESCRIBED = 0x00
NULL = 0x40
TRUE, FALSE, BOOLEAN = 0x41, 0x42, 0x56
UBYTE, USHORT = 0x50, 0x60
UINT, SMALLUINT, UINT0 = 0x70, 0x52, 0x43
ULONG, SMALLULONG, ULONG0 = 0x80, 0x53, 0x44
BYTE, SHORT = 0x51, 0x61
INT, SMALLINT = 0x71, 0x54
LONG, SMALLLONG = 0x81, 0x55
FLOAT, DOUBLE = 0x72, 0x82
DECIMAL32, DECIMAL64, DECIMAL128 = 0x74, 0x84, 0x94
CHAR, TIMESTAMP, UUID = 0x73, 0x83, 0x98
VBIN8, VBIN32 = 0xA0, 0xB0
STR8, STR32 = 0xA1, 0xB1
SYM8, SYM32 = 0xA3, 0xB3
LIST0, LIST8, LIST32 = 0x45, 0xC0, 0xD0
MAP8, MAP32 = 0xC1, 0xD1
ARRAY8, ARRAY32 = 0xE0, 0xF0

LIST_CODES = frozenset({LIST0, LIST8, LIST32})
MAP_CODES = frozenset({MAP8, MAP32})
ARRAY_CODES = frozenset({ARRAY8, ARRAY32})
BINARY_CODES = frozenset({VBIN8, VBIN32})
STRING_CODES = frozenset({STR8, STR32})
SYMBOL_CODES = frozenset({SYM8, SYM32})

_MAX_ZERO_WIDTH = 1 << 16  # bound on arrays of zero-width elements (null, true, ...)


# --------------------------------------------------------------------------- values


class Amqp10Map(dict[Any, Any]):
    """A decoded AMQP 1.0 map: value codes (``codes``), key codes (``key_codes``), own ``code``."""

    __slots__ = ("code", "codes", "key_codes")

    def __init__(
        self,
        items: Iterable[tuple[Any, Any]] | Mapping[Any, Any] = (),
        codes: Mapping[Any, int] | None = None,
        key_codes: Mapping[Any, int] | None = None,
        code: int = MAP32,
    ) -> None:
        super().__init__(items)
        self.codes: dict[Any, int] = dict(codes or {})
        self.key_codes: dict[Any, int] = dict(key_codes or {})
        self.code = code


class Amqp10List(list[Any]):
    """A decoded AMQP 1.0 list: each entry's format code (``codes``) and its own ``code``."""

    __slots__ = ("code", "codes")

    def __init__(
        self, items: Iterable[Any] = (), codes: Iterable[int] | None = None, code: int = LIST32
    ) -> None:
        super().__init__(items)
        self.codes: list[int] = list(codes or [])
        self.code = code


class Amqp10Array(list[Any]):
    """A decoded AMQP 1.0 array: one element constructor (``element``, maybe described)."""

    __slots__ = ("code", "descriptor", "descriptor_code", "element")

    def __init__(
        self,
        items: Iterable[Any] = (),
        element: int = NULL,
        *,
        descriptor: Any = None,
        descriptor_code: int | None = None,
        code: int = ARRAY32,
    ) -> None:
        super().__init__(items)
        self.element = element
        self.descriptor = descriptor
        self.descriptor_code = descriptor_code
        self.code = code


@dataclass(frozen=True, slots=True)
class Described:
    """A described value (format code 0x00): descriptor and value, with their format codes."""

    descriptor: Any
    value: Any
    descriptor_code: int | None = None
    value_code: int | None = None


class Float32(float):
    """A float32 NaN with its exact bits (a NaN's payload does not survive the double)."""

    __slots__ = ("raw",)
    raw: bytes

    def __new__(cls, raw: bytes) -> Float32:
        obj = super().__new__(cls, F32.unpack(raw)[0])
        obj.raw = raw
        return obj


# ----------------------------------------------------------------- primitive decoders


def _const(value: Any) -> Decoder:
    def dec(buf: bytes, off: int) -> tuple[Any, int]:
        return value, off

    return dec


def _raw(width: int, what: str) -> Decoder:
    def dec(buf: bytes, off: int) -> tuple[Any, int]:
        end = off + width
        if end > len(buf):
            raise Truncated(off, width, max(len(buf) - off, 0), what)
        return buf[off:end], end

    return dec


def _dec_boolean(buf: bytes, off: int) -> tuple[Any, int]:
    if off >= len(buf):
        raise Truncated(off, 1, 0, "boolean")
    b = buf[off]
    if b > 1:
        raise Malformed(off, f"boolean octet must be 0 or 1, found {b}")
    return b == 1, off + 1


def _dec_float(buf: bytes, off: int) -> tuple[Any, int]:
    end = off + 4
    if end > len(buf):
        raise Truncated(off, 4, max(len(buf) - off, 0), "float")
    (v,) = F32.unpack_from(buf, off)
    return (Float32(buf[off:end]) if math.isnan(v) else v), end


def _dec_char(buf: bytes, off: int) -> tuple[Any, int]:
    end = off + 4
    if end > len(buf):
        raise Truncated(off, 4, max(len(buf) - off, 0), "char")
    (v,) = U32.unpack_from(buf, off)
    if v > 0x10FFFF or 0xD800 <= v <= 0xDFFF:
        raise Malformed(off, f"char code point 0x{v:x} is not a Unicode scalar value")
    return chr(v), end


def _dec_uuid(buf: bytes, off: int) -> tuple[Any, int]:
    end = off + 16
    if end > len(buf):
        raise Truncated(off, 16, max(len(buf) - off, 0), "uuid")
    return uuid.UUID(bytes=buf[off:end]), end


def _var(size_st: struct.Struct, what: str, as_text: bool) -> Decoder:
    """Size-prefixed bytes; ``as_text``: UTF-8 text when valid, else the bytes (so
    re-encoding stays exact), as the 0-10 decoder reads vbin and str values."""
    ssize = size_st.size
    unpack = size_st.unpack_from

    def dec(buf: bytes, off: int) -> tuple[Any, int]:
        p = off + ssize
        if p > len(buf):
            raise Truncated(off, ssize, max(len(buf) - off, 0), what + " size")
        (n,) = unpack(buf, off)
        end = p + n
        if end > len(buf):
            raise Truncated(p, n, len(buf) - p, what)
        raw = buf[p:end]
        if as_text:
            try:
                return raw.decode("utf-8"), end
            except UnicodeDecodeError:
                return raw, end
        return raw, end

    return dec


def _dec_symbol(size_st: struct.Struct, what: str) -> Decoder:
    """Symbols are ASCII by the spec; other bytes stay bytes so re-encoding is exact."""
    ssize = size_st.size
    unpack = size_st.unpack_from

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
            return raw.decode("ascii"), end
        except UnicodeDecodeError:
            return raw, end

    return dec


# ------------------------------------------------------------------ compound decoders


class _Tables:
    """One decoder table (binary as text, or raw): containers recurse through it."""

    def __init__(self, binary_text: bool) -> None:
        self.binary_text = binary_text
        self.table: dict[int, Decoder] = {}

    def value(self, buf: bytes, off: int, what: str = "value") -> tuple[Any, int, int]:
        """One constructor + value at ``off``: (value, format code, end)."""
        if off >= len(buf):
            raise Truncated(off, 1, 0, what + " format code")
        code = buf[off]
        if code == DESCRIBED:
            desc, dcode, p = self.value(buf, off + 1, "descriptor")
            val, vcode, end = self.value(buf, p, "described value")
            return Described(desc, val, dcode, vcode), DESCRIBED, end
        dec = self.table.get(code)
        if dec is None:
            raise UnknownType(off, code, "AMQP 1.0")
        v, end = dec(buf, off + 1)
        return v, code, end

    def _header(self, buf: bytes, off: int, wide: bool, what: str) -> tuple[int, int, int]:
        """(count, first entry offset, end) of a list/map/array with a 1- or 4-octet size."""
        hs = 8 if wide else 2
        if off + hs > len(buf):
            raise Truncated(off, hs, max(len(buf) - off, 0), what + " header")
        size, count = (U32X2 if wide else U8X2).unpack_from(buf, off)
        w = hs // 2
        end = off + w + size
        if end > len(buf):
            raise Truncated(off + w, size, len(buf) - off - w, what + " body")
        if size < w:
            raise Malformed(off, f"{what} size {size} < {w}")
        return count, off + hs, end

    def list_(self, wide: bool) -> Decoder:
        what = "list32" if wide else "list8"
        own = LIST32 if wide else LIST8

        def dec(buf: bytes, off: int) -> tuple[Any, int]:
            count, p, end = self._header(buf, off, wide, what)
            if count > end - p:
                raise Malformed(off, f"{what} count {count} cannot fit in {end - p} bytes")
            items: list[Any] = []
            codes: list[int] = []
            for _ in range(count):
                if p >= end:
                    raise Malformed(p, f"{what} entry overruns the list end at {end}")
                v, c, q = self.value(buf, p, "list entry")
                if q > end:
                    raise Malformed(p, f"{what} entry overruns the list end at {end}")
                items.append(v)
                codes.append(c)
                p = q
            if p != end:
                raise Malformed(p, f"{what} size says it ends at {end}, entries end at {p}")
            return Amqp10List(items, codes, own), end

        return dec

    def map_(self, wide: bool) -> Decoder:
        what = "map32" if wide else "map8"
        own = MAP32 if wide else MAP8

        def dec(buf: bytes, off: int) -> tuple[Any, int]:
            count, p, end = self._header(buf, off, wide, what)
            if count % 2:
                raise Malformed(off, f"{what} count {count} is odd (keys and values pair up)")
            if count > end - p:
                raise Malformed(off, f"{what} count {count} cannot fit in {end - p} bytes")
            result = Amqp10Map(code=own)
            codes, kcodes = result.codes, result.key_codes
            value = self.value
            binary_text = self.binary_text
            key: Any
            v: Any
            for _ in range(count // 2):
                if p >= end:
                    raise Malformed(p, f"{what} entry overruns the map end at {end}")
                # fast path: a str8 key wholly inside the map (QMF's keys); else the general one
                kc = buf[p]
                q = p + 2 + buf[p + 1] if kc == STR8 and p + 1 < end else end
                if q < end:
                    raw = buf[p + 2 : q]
                    try:
                        key = raw.decode("utf-8")
                    except UnicodeDecodeError:
                        key = raw
                else:
                    key, kc, q = value(buf, p, "map key")
                    if q >= end:
                        raise Malformed(p, f"{what} key overruns the map end at {end}")
                try:
                    dup = key in kcodes
                except TypeError as exc:  # a list or map as a key
                    raise Malformed(p, f"{what} key of type {type(key).__name__}") from exc
                if dup:
                    raise Malformed(p, f"duplicate map key {key!r}")
                # fast paths for the common values, when wholly inside the map
                vc = buf[q]
                simple = _SIMPLE.get(vc)
                r = end + 1
                if simple is not None:
                    unpack, width = simple
                    r = q + 1 + width
                    if r <= end:
                        v = unpack(buf, q + 1)[0]
                elif vc in _CONSTS:
                    v, r = _CONSTS[vc], q + 1
                elif (vc == VBIN8 or vc == STR8) and q + 1 < end:
                    r = q + 2 + buf[q + 1]
                    if r <= end:
                        v = buf[q + 2 : r]
                        if vc == STR8 or binary_text:
                            try:
                                v = v.decode("utf-8")
                            except UnicodeDecodeError:
                                pass
                if r > end:
                    v, vc, r = value(buf, q, "map value")
                    if r > end:
                        raise Malformed(q, f"{what} value overruns the map end at {end}")
                result[key] = v
                kcodes[key] = kc
                codes[key] = vc
                p = r
            if p != end:
                raise Malformed(p, f"{what} size says it ends at {end}, entries end at {p}")
            return result, end

        return dec

    def array_(self, wide: bool) -> Decoder:
        what = "array32" if wide else "array8"
        own = ARRAY32 if wide else ARRAY8

        def dec(buf: bytes, off: int) -> tuple[Any, int]:
            count, p, end = self._header(buf, off, wide, what)
            if p >= end:
                raise Malformed(p, f"{what} has no element constructor")
            descriptor: Any = None
            dcode: int | None = None
            code = buf[p]
            if code == DESCRIBED:
                descriptor, dcode, p = self.value(buf, p + 1, "array descriptor")
                if p >= end:
                    raise Malformed(p, f"{what} has no element constructor")
                code = buf[p]
            if code == DESCRIBED:
                raise Malformed(p, f"{what} element constructor described twice")
            elem = self.table.get(code)
            if elem is None:
                raise UnknownType(p, code, "AMQP 1.0")
            p += 1
            width = FIXED_WIDTH.get(code)
            if width == 0:
                # Each element costs no bytes: bound them by the array's own size too, or
                # nested arrays of them would expand a 1 MB body into billions of values.
                if count > min(_MAX_ZERO_WIDTH, 8 * (end - off)):
                    raise Malformed(off, f"{what} of {count} zero-width elements")
            elif width is not None and count * width != end - p:
                raise Malformed(off, f"{what} count {count} x {width} != {end - p} bytes")
            elif count > end - p:
                raise Malformed(off, f"{what} count {count} cannot fit in {end - p} bytes")
            items: list[Any] = []
            for _ in range(count):
                v, q = elem(buf, p)
                if q > end:
                    raise Malformed(p, f"{what} element overruns the array end at {end}")
                items.append(v)
                p = q
            if p != end:
                raise Malformed(p, f"{what} size says it ends at {end}, elements end at {p}")
            return (
                Amqp10Array(items, code, descriptor=descriptor, descriptor_code=dcode, code=own),
                end,
            )

        return dec

    def build(self) -> dict[int, Decoder]:
        t = self.table
        t.update(
            {
                NULL: _const(None),
                TRUE: _const(True),
                FALSE: _const(False),
                BOOLEAN: _dec_boolean,
                UBYTE: fixed_decoder(U8, "ubyte"),
                USHORT: fixed_decoder(U16, "ushort"),
                UINT: fixed_decoder(U32, "uint"),
                SMALLUINT: fixed_decoder(U8, "smalluint"),
                UINT0: _const(0),
                ULONG: fixed_decoder(U64, "ulong"),
                SMALLULONG: fixed_decoder(U8, "smallulong"),
                ULONG0: _const(0),
                BYTE: fixed_decoder(I8, "byte"),
                SHORT: fixed_decoder(I16, "short"),
                INT: fixed_decoder(I32, "int"),
                SMALLINT: fixed_decoder(I8, "smallint"),
                LONG: fixed_decoder(I64, "long"),
                SMALLLONG: fixed_decoder(I8, "smalllong"),
                FLOAT: _dec_float,
                DOUBLE: fixed_decoder(F64, "double"),
                DECIMAL32: _raw(4, "decimal32"),
                DECIMAL64: _raw(8, "decimal64"),
                DECIMAL128: _raw(16, "decimal128"),
                CHAR: _dec_char,
                TIMESTAMP: fixed_decoder(I64, "timestamp"),
                UUID: _dec_uuid,
                VBIN8: _var(U8, "vbin8", self.binary_text),
                VBIN32: _var(U32, "vbin32", self.binary_text),
                STR8: _var(U8, "str8-utf8", True),
                STR32: _var(U32, "str32-utf8", True),
                SYM8: _dec_symbol(U8, "sym8"),
                SYM32: _dec_symbol(U32, "sym32"),
                LIST0: _const_list,
                LIST8: self.list_(False),
                LIST32: self.list_(True),
                MAP8: self.map_(False),
                MAP32: self.map_(True),
                ARRAY8: self.array_(False),
                ARRAY32: self.array_(True),
            }
        )
        return t


def _const_list(buf: bytes, off: int) -> tuple[Any, int]:
    return Amqp10List((), (), LIST0), off


# Values the map decoder reads inline (fixed width, no validation needed), and constants.
_SIMPLE: dict[int, tuple[Callable[[bytes, int], tuple[Any, ...]], int]] = {
    UBYTE: (U8.unpack_from, 1), USHORT: (U16.unpack_from, 2), UINT: (U32.unpack_from, 4),
    SMALLUINT: (U8.unpack_from, 1), ULONG: (U64.unpack_from, 8), SMALLULONG: (U8.unpack_from, 1),
    BYTE: (I8.unpack_from, 1), SHORT: (I16.unpack_from, 2), INT: (I32.unpack_from, 4),
    SMALLINT: (I8.unpack_from, 1), LONG: (I64.unpack_from, 8), SMALLLONG: (I8.unpack_from, 1),
    DOUBLE: (F64.unpack_from, 8), TIMESTAMP: (I64.unpack_from, 8),
}  # fmt: skip
_CONSTS: dict[int, Any] = {NULL: None, TRUE: True, FALSE: False, UINT0: 0, ULONG0: 0}

# Fixed widths in octets (variable-width and compound codes are absent).
FIXED_WIDTH: dict[int, int] = {
    NULL: 0, TRUE: 0, FALSE: 0, UINT0: 0, ULONG0: 0, LIST0: 0,
    BOOLEAN: 1, UBYTE: 1, BYTE: 1, SMALLUINT: 1, SMALLULONG: 1, SMALLINT: 1, SMALLLONG: 1,
    USHORT: 2, SHORT: 2,
    UINT: 4, INT: 4, FLOAT: 4, DECIMAL32: 4, CHAR: 4,
    ULONG: 8, LONG: 8, DOUBLE: 8, DECIMAL64: 8, TIMESTAMP: 8,
    DECIMAL128: 16, UUID: 16,
}  # fmt: skip

_TEXT_TABLES = _Tables(True)
_RAW_TABLES = _Tables(False)
DECODERS: dict[int, Decoder] = _TEXT_TABLES.build()
RAW_DECODERS: dict[int, Decoder] = _RAW_TABLES.build()


def decode_value(buf: bytes, off: int = 0, *, binary_text: bool = True) -> tuple[Any, int, int]:
    """One AMQP 1.0 value (constructor included) at ``off``: (value, format code, end)."""
    tables = _TEXT_TABLES if binary_text else _RAW_TABLES
    try:
        return tables.value(buf, off)
    except RecursionError:
        raise Malformed(off, "nesting too deep") from None


def decode(buf: bytes | bytearray | memoryview, *, binary_text: bool = True) -> tuple[Any, int]:
    """A whole buffer as exactly one AMQP 1.0 value: (value, format code); bytes after it
    are an error."""
    data = bytes(buf)
    value, code, end = decode_value(data, 0, binary_text=binary_text)
    if end != len(data):
        raise Malformed(end, f"{len(data) - end} bytes after the value")
    return value, code


# ------------------------------------------------------------------------- encoders


def _int_enc(st: struct.Struct, what: str) -> Encoder:
    pack = st.pack

    def enc(out: bytearray, v: Any) -> None:
        if isinstance(v, bool) or not isinstance(v, int):
            raise EncodeError(f"{what} needs an int, got {type(v).__name__}")
        try:
            out += pack(v)
        except struct.error as exc:
            raise EncodeError(f"{what} out of range: {v!r}") from exc

    return enc


def _zero_enc(value: Any, what: str) -> Encoder:
    def enc(out: bytearray, v: Any) -> None:
        if v != value or isinstance(v, bool) != isinstance(value, bool):
            raise EncodeError(f"{what} needs {value!r}, got {v!r}")

    return enc


def _enc_null(out: bytearray, v: Any) -> None:
    if v is not None:
        raise EncodeError(f"null needs None, got {v!r}")


def _enc_boolean(out: bytearray, v: Any) -> None:
    if not isinstance(v, bool):
        raise EncodeError(f"boolean needs True/False, got {v!r}")
    out.append(1 if v else 0)


def _enc_float(out: bytearray, v: Any) -> None:
    if isinstance(v, Float32):
        out += v.raw
        return
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise EncodeError(f"float needs a number, got {type(v).__name__}")
    try:
        out += F32.pack(v)
    except (struct.error, OverflowError) as exc:
        raise EncodeError(f"float out of range: {v!r}") from exc


def _enc_double(out: bytearray, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise EncodeError(f"double needs a number, got {type(v).__name__}")
    try:
        out += F64.pack(v)
    except (struct.error, OverflowError) as exc:
        raise EncodeError(f"double out of range: {v!r}") from exc


def _raw_enc(width: int, what: str) -> Encoder:
    def enc(out: bytearray, v: Any) -> None:
        if not isinstance(v, bytes | bytearray) or len(v) != width:
            raise EncodeError(f"{what} needs {width} bytes, got {v!r}")
        out += v

    return enc


def _enc_char(out: bytearray, v: Any) -> None:
    if not isinstance(v, str) or len(v) != 1:
        raise EncodeError(f"char needs one character, got {v!r}")
    out += U32.pack(ord(v))


def _enc_uuid(out: bytearray, v: Any) -> None:
    if isinstance(v, uuid.UUID):
        out += v.bytes
    elif isinstance(v, bytes | bytearray) and len(v) == 16:
        out += v
    else:
        raise EncodeError(f"uuid needs uuid.UUID or 16 bytes, got {v!r}")


def _raw_bytes(v: Any, what: str, encoding: str = "utf-8") -> bytes:
    if isinstance(v, str):
        try:
            return v.encode(encoding)
        except UnicodeEncodeError as exc:
            raise EncodeError(f"{what}: {exc}") from exc
    if isinstance(v, bytes | bytearray | memoryview):
        return bytes(v)
    raise EncodeError(f"{what} needs str or bytes, got {type(v).__name__}")


def _var_enc(size_st: struct.Struct, what: str, encoding: str = "utf-8") -> Encoder:
    pack = size_st.pack
    limit = (1 << (8 * size_st.size)) - 1

    def enc(out: bytearray, v: Any) -> None:
        raw = _raw_bytes(v, what, encoding)
        if len(raw) > limit:
            raise EncodeError(f"{what} too long: {len(raw)} > {limit}")
        out += pack(len(raw))
        out += raw

    return enc


class _Overflow(Exception):
    """A list8/map8/array8 whose content outgrew its 1-octet size (``encode_value`` widens it)."""

    def __init__(self, at: int, count: int) -> None:
        super().__init__(at, count)
        self.at = at
        self.count = count


def _patch(out: bytearray, at: int, wide: bool, count: int, what: str) -> None:
    """Write the size (octets after the size field) and count of a compound at ``at``."""
    w = 4 if wide else 1
    size = len(out) - at - w
    if wide:
        if size > 0xFFFFFFFF or count > 0xFFFFFFFF:
            raise EncodeError(f"{what} larger than 4 GiB")
        out[at : at + 8] = U32X2.pack(size, count)
    elif size > 0xFF or count > 0xFF:
        raise _Overflow(at, count)
    else:
        out[at : at + 2] = U8X2.pack(size, count)


def _enc_list(wide: bool) -> Encoder:
    what = "list32" if wide else "list8"

    def enc(out: bytearray, v: Any) -> None:
        if not isinstance(v, list | tuple):
            raise EncodeError(f"{what} needs a list, got {type(v).__name__}")
        codes = v.codes if isinstance(v, Amqp10List) else []
        at = len(out)
        out += bytes(8 if wide else 2)
        for i, item in enumerate(v):
            encode_value(out, item, codes[i] if i < len(codes) else None)
        _patch(out, at, wide, len(v), what)

    return enc


def _enc_list0(out: bytearray, v: Any) -> None:
    if not isinstance(v, list | tuple) or len(v):
        raise EncodeError(f"list0 needs an empty list, got {v!r}")


def _enc_map(wide: bool) -> Encoder:
    what = "map32" if wide else "map8"

    def enc(out: bytearray, v: Any) -> None:
        if not isinstance(v, Mapping):
            raise EncodeError(f"{what} needs a mapping, got {type(v).__name__}")
        codes = v.codes if isinstance(v, Amqp10Map) else {}
        kcodes = v.key_codes if isinstance(v, Amqp10Map) else {}
        at = len(out)
        out += bytes(8 if wide else 2)
        for key, item in v.items():
            encode_value(out, key, kcodes.get(key))
            encode_value(out, item, codes.get(key))
        _patch(out, at, wide, 2 * len(v), what)

    return enc


def _enc_array(wide: bool) -> Encoder:
    what = "array32" if wide else "array8"

    def enc(out: bytearray, v: Any) -> None:
        if not isinstance(v, list | tuple):
            raise EncodeError(f"{what} needs a list, got {type(v).__name__}")
        items = list(v)
        if isinstance(v, Amqp10Array):
            code, descriptor, dcode = v.element, v.descriptor, v.descriptor_code
            described = dcode is not None or descriptor is not None
        else:
            code = _array_element_code(items)
            descriptor, dcode, described = None, None, False
        code = _array_fit(code, items)
        enc_el = ENCODERS.get(code)
        if enc_el is None or code == DESCRIBED:
            raise EncodeError(f"no AMQP 1.0 array element code 0x{code:02x}")
        at = len(out)
        out += bytes(8 if wide else 2)
        if described:
            out.append(DESCRIBED)
            encode_value(out, descriptor, dcode)
        out.append(code)
        try:
            for item in items:
                enc_el(out, item)
        except _Overflow as exc:
            raise EncodeError(f"{what} element too large for code 0x{code:02x}") from exc
        _patch(out, at, wide, len(items), what)

    return enc


def _enc_described(out: bytearray, v: Any) -> None:
    if not isinstance(v, Described):
        raise EncodeError(f"described needs Described, got {type(v).__name__}")
    encode_value(out, v.descriptor, v.descriptor_code)
    encode_value(out, v.value, v.value_code)


ENCODERS: dict[int, Encoder] = {
    DESCRIBED: _enc_described,
    NULL: _enc_null,
    TRUE: _zero_enc(True, "true"),
    FALSE: _zero_enc(False, "false"),
    BOOLEAN: _enc_boolean,
    UBYTE: _int_enc(U8, "ubyte"),
    USHORT: _int_enc(U16, "ushort"),
    UINT: _int_enc(U32, "uint"),
    SMALLUINT: _int_enc(U8, "smalluint"),
    UINT0: _zero_enc(0, "uint0"),
    ULONG: _int_enc(U64, "ulong"),
    SMALLULONG: _int_enc(U8, "smallulong"),
    ULONG0: _zero_enc(0, "ulong0"),
    BYTE: _int_enc(I8, "byte"),
    SHORT: _int_enc(I16, "short"),
    INT: _int_enc(I32, "int"),
    SMALLINT: _int_enc(I8, "smallint"),
    LONG: _int_enc(I64, "long"),
    SMALLLONG: _int_enc(I8, "smalllong"),
    FLOAT: _enc_float,
    DOUBLE: _enc_double,
    DECIMAL32: _raw_enc(4, "decimal32"),
    DECIMAL64: _raw_enc(8, "decimal64"),
    DECIMAL128: _raw_enc(16, "decimal128"),
    CHAR: _enc_char,
    TIMESTAMP: _int_enc(I64, "timestamp"),
    UUID: _enc_uuid,
    VBIN8: _var_enc(U8, "vbin8"),
    VBIN32: _var_enc(U32, "vbin32"),
    STR8: _var_enc(U8, "str8-utf8"),
    STR32: _var_enc(U32, "str32-utf8"),
    SYM8: _var_enc(U8, "sym8", "ascii"),
    SYM32: _var_enc(U32, "sym32", "ascii"),
    LIST0: _enc_list0,
    LIST8: _enc_list(False),
    LIST32: _enc_list(True),
    MAP8: _enc_map(False),
    MAP32: _enc_map(True),
    ARRAY8: _enc_array(False),
    ARRAY32: _enc_array(True),
}

# A compact code whose value does not fit -> the next wider code (a recorded code is
# kept whenever the value fits, so decoded values re-encode exactly). list8/map8/array8
# are widened after their content is written (``_Overflow``).
_WIDER = {
    SMALLUINT: UINT, UINT0: SMALLUINT, SMALLULONG: ULONG, ULONG0: SMALLULONG,
    SMALLINT: INT, SMALLLONG: LONG, VBIN8: VBIN32, STR8: STR32, SYM8: SYM32, LIST0: LIST32,
}  # fmt: skip
_WIDE_COMPOUND = {LIST8: LIST32, MAP8: MAP32, ARRAY8: ARRAY32}


def _fits(code: int, v: Any) -> bool:
    if code in (UINT0, ULONG0):
        return isinstance(v, int) and not isinstance(v, bool) and v == 0
    if code in (SMALLUINT, SMALLULONG):
        return isinstance(v, int) and 0 <= v <= 0xFF
    if code in (SMALLINT, SMALLLONG):
        return isinstance(v, int) and -128 <= v <= 127
    if code == TRUE:
        return v is True
    if code == FALSE:
        return v is False
    if code in (VBIN8, STR8, SYM8):
        try:
            return len(_raw_bytes(v, "value", "ascii" if code == SYM8 else "utf-8")) <= 0xFF
        except EncodeError:
            return True  # let the encoder report it
    if code == LIST0:
        return isinstance(v, list | tuple) and not v
    return True


def _fit(code: int, v: Any) -> int:
    if code in (TRUE, FALSE) and isinstance(v, bool):
        return TRUE if v else FALSE
    for _ in range(3):
        if code not in _WIDER or _fits(code, v):
            break
        code = _WIDER[code]
    return code


def _array_fit(code: int, items: list[Any]) -> int:
    """An array's element code, widened until it holds every element."""
    if code in (TRUE, FALSE) and not all(_fits(code, x) for x in items):
        return BOOLEAN
    for _ in range(3):
        if code not in _WIDER or all(_fits(code, x) for x in items):
            break
        code = _WIDER[code]
    return code


def infer(v: Any) -> int:
    """The format code proton's encoder picks for a plain Python value (compact forms)."""
    if v is None:
        return NULL
    if isinstance(v, bool):
        return TRUE if v else FALSE
    if isinstance(v, int):
        if -128 <= v <= 127:
            return SMALLLONG
        if -(1 << 63) <= v < (1 << 63):
            return LONG
        return ULONG
    if isinstance(v, Float32):
        return FLOAT
    if isinstance(v, float):
        return DOUBLE
    if isinstance(v, str):
        return STR8 if len(v.encode("utf-8", "surrogatepass")) <= 0xFF else STR32
    if isinstance(v, bytes | bytearray | memoryview):
        return VBIN8 if len(v) <= 0xFF else VBIN32
    if isinstance(v, uuid.UUID):
        return UUID
    if isinstance(v, Described):
        return DESCRIBED
    if isinstance(v, Amqp10Array):
        return v.code
    if isinstance(v, Amqp10Map | Amqp10List):
        return v.code
    if isinstance(v, Mapping):
        return MAP32
    if isinstance(v, list | tuple):
        return LIST32 if v else LIST0
    raise EncodeError(f"no AMQP 1.0 type for {type(v).__name__}")


def _array_element_code(items: list[Any]) -> int:
    """Element code of a plain list sent as an array: the full-width code of the first item."""
    if not items:
        return NULL
    code = infer(items[0])
    return {
        TRUE: BOOLEAN, FALSE: BOOLEAN, SMALLLONG: LONG, LIST0: LIST32,
        VBIN8: VBIN32, STR8: STR32,
    }.get(code, code)  # fmt: skip


def encode_value(out: bytearray, v: Any, code: int | None = None) -> None:
    """Append one value with its constructor; ``code`` is the wanted format code (widened
    when the value does not fit it), else inferred as proton would."""
    code = _fit(infer(v) if code is None else code, v)
    enc = ENCODERS.get(code)
    if enc is None:
        raise EncodeError(f"unknown AMQP 1.0 format code 0x{code:02x}")
    at = len(out)
    out.append(code)
    try:
        enc(out, v)
    except _Overflow as exc:
        # the content does not depend on the header: widen the header in place
        out[at] = _WIDE_COMPOUND[code]
        out[exc.at : exc.at + 2] = bytes(8)
        _patch(out, exc.at, True, exc.count, "compound")


def encode(v: Any, code: int | None = None) -> bytes:
    """One value AMQP 1.0 encoded (constructor included)."""
    out = bytearray()
    try:
        encode_value(out, v, code)
    except RecursionError:
        raise EncodeError("nesting too deep") from None
    return bytes(out)


# ----------------------------------------------------------- 0-10 <-> AMQP 1.0 types

# AMQP 0-10 type code -> the AMQP 1.0 type qpid maps it to (full-width code; compacted by value).
_FROM_0_10: dict[int, int] = {
    0x01: BYTE, 0x02: UBYTE, 0x04: CHAR, 0x08: BOOLEAN, 0x11: SHORT, 0x12: USHORT,
    0x21: INT, 0x22: UINT, 0x23: FLOAT, 0x27: CHAR, 0x31: LONG, 0x32: ULONG, 0x33: DOUBLE,
    0x38: TIMESTAMP, 0x48: UUID, 0x80: VBIN32, 0x90: VBIN32, 0xA0: VBIN32,
    0x84: STR32, 0x85: STR32, 0x86: STR32, 0x94: STR32, 0x95: STR32, 0x96: STR32,
    0xA8: MAP32, 0xA9: LIST32, 0xAA: ARRAY32, 0xF0: NULL,
}  # fmt: skip


def canonical(code: int, v: Any) -> int:
    """The compact code proton writes for a value of this type (what a receiver lands)."""
    if code in (UINT, SMALLUINT, UINT0):
        return UINT0 if v == 0 else (SMALLUINT if 0 <= v <= 0xFF else UINT)
    if code in (ULONG, SMALLULONG, ULONG0):
        return ULONG0 if v == 0 else (SMALLULONG if 0 <= v <= 0xFF else ULONG)
    if code in (INT, SMALLINT):
        return SMALLINT if -128 <= v <= 127 else INT
    if code in (LONG, SMALLLONG):
        return SMALLLONG if -128 <= v <= 127 else LONG
    if code in (BOOLEAN, TRUE, FALSE):
        return TRUE if v else FALSE
    if code in (VBIN8, VBIN32, STR8, STR32, SYM8, SYM32):
        small = {VBIN32: VBIN8, STR32: STR8, SYM32: SYM8}.get(code, code)
        return small if _fits(small, v) else _WIDER[small]
    if code in (LIST0, LIST8, LIST32):
        return LIST32 if v else LIST0
    if code in (MAP8, MAP32):
        return MAP32
    if code in (ARRAY8, ARRAY32):
        return ARRAY32
    return code


def from_0_10(v: Any, code: int | None = None) -> tuple[Any, int]:
    """A 0-10 typed value (``TypedMap``/``TypedList``/``TypedArray`` codes, else inferred)
    as the AMQP 1.0 value and compact code qpidd + proton would put on the wire:
    vbin strings become binary, sizes as proton writes them. Returns (value, code)."""
    if code is None:
        code = infer_code(v)
    target = _FROM_0_10.get(code)
    if target is None:  # opaque 0-10 types travel as binary
        return v, canonical(VBIN32, v)
    if target == MAP32:
        m = Amqp10Map()
        codes = v.codes if isinstance(v, TypedMap) else {}
        for k, item in v.items():
            m[k], m.codes[k] = from_0_10(item, codes.get(k))
            m.key_codes[k] = canonical(STR32, k)
        return m, MAP32
    if target == LIST32:
        lcodes = v.codes if isinstance(v, TypedList) else []
        lst = Amqp10List(code=LIST32 if v else LIST0)
        for i, item in enumerate(v):
            x, c = from_0_10(item, lcodes[i] if i < len(lcodes) else None)
            lst.append(x)
            lst.codes.append(c)
        return lst, lst.code
    if target == ARRAY32:
        el0 = v.code if isinstance(v, TypedArray) else (infer_code(v[0]) if v else 0xF0)
        el = _FROM_0_10.get(el0, VBIN32)
        items = [from_0_10(x, el0)[0] for x in v]
        return Amqp10Array(items, el), ARRAY32
    if target == CHAR:
        return v, CHAR
    if target == BOOLEAN:
        return bool(v), TRUE if v else FALSE
    if target in (VBIN32, STR32):
        if not isinstance(v, str | bytes | bytearray):
            v = str(v)  # object ids in a text field, as the 0-10 encoder writes them
        return v, canonical(target, v)
    return v, canonical(target, v)


# AMQP 1.0 code -> the 0-10 code qpid uses for the same type (binary: by size).
_TO_0_10: dict[int, int] = {
    NULL: 0xF0, TRUE: 0x08, FALSE: 0x08, BOOLEAN: 0x08, UBYTE: 0x02, USHORT: 0x12,
    UINT: 0x22, SMALLUINT: 0x22, UINT0: 0x22, ULONG: 0x32, SMALLULONG: 0x32, ULONG0: 0x32,
    BYTE: 0x01, SHORT: 0x11, INT: 0x21, SMALLINT: 0x21, LONG: 0x31, SMALLLONG: 0x31,
    FLOAT: 0x23, DOUBLE: 0x33, CHAR: 0x27, TIMESTAMP: 0x38, UUID: 0x48,
    LIST0: 0xA9, LIST8: 0xA9, LIST32: 0xA9, MAP8: 0xA8, MAP32: 0xA8,
    ARRAY8: 0xAA, ARRAY32: 0xAA,
}  # fmt: skip


def _text_0_10(code: int, v: Any) -> int:
    n = len(_raw_bytes(v, "text"))
    if code in BINARY_CODES:
        return 0x90 if n <= 0xFFFF else 0xA0
    return 0x95 if n <= 0xFFFF else 0xA0  # 0-10 has no str32: vbin32 holds the bytes


def to_0_10(v: Any, code: int | None = None) -> tuple[Any, int]:
    """An AMQP 1.0 value as the 0-10 typed value qpid would send over 0-10 (binary ->
    vbin16, string -> str16, ulong -> uint64, ...). Returns (value, 0-10 code).
    Decimals and described values have no 0-10 equivalent: ``EncodeError``."""
    if code is None:
        code = infer(v)
    if code in BINARY_CODES | STRING_CODES | SYMBOL_CODES:
        return v, _text_0_10(code, v)
    if code in MAP_CODES:
        m = TypedMap()
        codes = v.codes if isinstance(v, Amqp10Map) else {}
        for k, item in v.items():
            if not isinstance(k, str):
                raise EncodeError(f"0-10 map keys must be text, got {k!r}")
            m[k], m.codes[k] = to_0_10(item, codes.get(k))
        return m, 0xA8
    if code in LIST_CODES:
        lcodes = v.codes if isinstance(v, Amqp10List) else []
        lst = TypedList()
        for i, item in enumerate(v):
            x, c = to_0_10(item, lcodes[i] if i < len(lcodes) else None)
            lst.append(x)
            lst.codes.append(c)
        return lst, 0xA9
    if code in ARRAY_CODES:
        el = v.element if isinstance(v, Amqp10Array) else _array_element_code(list(v))
        conv = [to_0_10(x, el) for x in v]
        el10 = conv[0][1] if conv else _TO_0_10.get(el, 0x90)
        return TypedArray([x for x, _ in conv], el10), 0xAA
    target = _TO_0_10.get(code)
    if target is None:
        raise EncodeError(f"no AMQP 0-10 type for AMQP 1.0 format code 0x{code:02x}")
    if isinstance(v, Float32):
        v = float(v)
    return v, target
