"""Numba kernels for QMF v2 data indications (``pipeline.codec.vectorized``'s v2 fast path).

A v2 ``_data`` indication is a list of maps, each with ``_schema_id``,
``_object_id``, three times and ``_values`` (element name -> value), in one of
two encodings: AMQP 0-10 (``amqp/list``: u32 size and count, type-code
prefixed values, str8 map keys) or AMQP 1.0 (an ``amqp-value`` list, marked
``x-qmf-body-encoding: amqp-1.0``). ``v2_walk`` walks whole bodies in compiled
code: it finds each record's class in the compiled registry, maps every
``_values`` key to its schema slot by hashing the key bytes (then comparing
them byte for byte) and writes the values straight into the compact layout's
typed lists. Values it does not format itself (maps, object references,
text in unusual encodings) are left to Python, once per distinct encoding.

The kernel is conservative: anything it does not fully understand (unknown
class, an ``_event`` schema id, odd value types, sizes that disagree, duplicate
keys, text that may not be UTF-8 where the codec would check it) rolls the
message back and gives it a non-zero status, and the caller decodes that
message whole with the per-record codec, so results never depend on which
path a message took.
"""

from __future__ import annotations

from typing import Any

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from pipeline.codec._kernels import be2, be4, be8, unowned, write_uuid

ENC_010 = 1  # AMQP 0-10 list body
ENC_10 = 2  # AMQP 1.0 amqp-value

# Per-message status (0 ok; anything else: the whole message goes per record).
V_OK = 0
V_MALFORMED = 1  # sizes, counts or a value the codec would reject
V_UNKNOWN_SCHEMA = 2
V_UNSUPPORTED = 3  # a value or layout the kernel leaves to the codec
V_NOT_DATA = 4  # an item that is not a data record (event schema id, not a map)

V_STATUS_NAMES = (
    "ok",
    "v2: malformed",
    "v2: unknown schema",
    "v2: unsupported value",
    "v2: not a data record",
)

# Rows of the (field, record) matrix of ``v2_walk``.
W_MSG = 0  # batch row of the message
W_IDX = 1  # the record's position in its message's list
W_SCHEMA = 2
W_UPDATE = 3
W_CREATE = 4
W_DELETE = 5
W_EPOCH = 6
W_EPOCH_OK = 7
W_HAS_OID = 8  # 1 when the record has an ``_object_id`` map
W_AN_POS = 9  # agent name: position and length (-1: absent)
W_AN_LEN = 10
W_ON_POS = 11  # object name: position and length (-1: absent)
W_ON_LEN = 12
W_IOFF = 13  # the record's first slot in each typed list
W_FOFF = 14
W_TOFF = 15
N_WFIELDS = 16

# Value classes read by ``_scalar``.
C_NULL = 0
C_INT = 1  # signed integer in ``iv``
C_UINT = 2  # unsigned integer, its 64 bits in ``iv``
C_BOOL = 3
C_F32 = 4  # ``iv`` holds the float32 bits
C_F64 = 5  # ``iv`` holds the float64 bits
C_TEXT = 6  # bytes at (pos, len) whose text is their UTF-8 (or replaced) decoding
C_UUID = 7  # 16 bytes at pos
C_OTHER = 8  # anything else: Python decodes the encoded value at (pos, len)
C_BAD = 9  # malformed: the codec rejects it

# Text slot kinds written for ``v2_text_values``.
T_NULL = 0
T_RAW = 1
T_UUID = 2
T_PY = 3

# Top-level keys of a data record (bit flags, for duplicate checks).
_K_SCHEMA = 1
_K_OBJECT = 2
_K_UPDATE = 4
_K_CREATE = 8
_K_DELETE = 16
_K_VALUES = 32


# Positions of the literal names in ``lits`` (vectorized._V2_KEYS): the record's
# six keys first (their bit is 1 << position), then these.
L_PKG = 6
L_TYPE = 9
L_HASH = 8
L_AGENT = 10
L_EPOCH = 11
L_OBJNAME = 12
L_EVENT = 13


@nb.njit(cache=True, inline="always")
def _le_name(data: Any, p: Any, n: Any, lit: Any) -> Any:
    """True when the n bytes at p spell ``lit`` (a uint8 array)."""
    if n != lit.shape[0]:
        return False
    for j in range(n):
        if data[p + j] != lit[j]:
            return False
    return True


@nb.njit(cache=True, inline="always")
def _is_lit(data: Any, p: Any, n: Any, lits: Any, a: Any, b: Any) -> Any:
    """True when the n bytes at p spell ``lits[a:b]``; length and second byte tried first."""
    if b - a != n:
        return False
    if n > 1 and lits[a + 1] != data[p + 1]:
        return False
    for j in range(n):
        if data[p + j] != lits[a + j]:
            return False
    return True


@nb.njit(cache=True, inline="always")
def _ascii(data: Any, p: Any, n: Any) -> Any:
    for j in range(n):
        if data[p + j] >= 0x80:
            return False
    return True


@nb.njit(cache=True, inline="always")
def _width010(code: Any) -> Any:
    """Fixed width of a 0-10 type code, -1/-2/-4 for a size prefix, -9 for no such class."""
    hi = code >> 4
    if hi <= 7:  # 1, 2, 4, ... 128 octets
        return 1 << hi
    if hi == 9:  # vbin16, str16: qpid's strings
        return -2
    if hi == 0xA:  # vbin32, map, list, array
        return -4
    if hi == 8:
        return -1
    if hi == 0xC:
        return 5
    if hi == 0xD:
        return 9
    if hi == 0xF:
        return 0
    return -9


@nb.njit(cache=True, inline="always")
def _scalar010(data: Any, code: Any, p: Any, end: Any) -> tuple[Any, ...]:
    """One 0-10 value of type ``code`` whose bytes start at p (after the code).

    Returns (class, int value or float bits, position, length, next position).
    Position/length are of the text bytes for C_TEXT, of the 16 bytes for
    C_UUID, and of the whole encoded value *with its code* for C_OTHER.
    """
    w = _width010(code)
    if w == -9:
        return C_BAD, np.int64(0), 0, 0, p
    if w >= 0:
        if p + w > end:
            return C_BAD, np.int64(0), 0, 0, p
        q = p + w
        if code == 0x32:  # uint64: most of qpid's statistics
            return C_UINT, be8(data, p), 0, 0, q
        if code == 0x01:
            v = np.int64(data[p])
            return C_INT, v - 256 if v > 127 else v, 0, 0, q
        if code == 0x02:
            return C_UINT, np.int64(data[p]), 0, 0, q
        if code == 0x08:
            if data[p] > 1:
                return C_BAD, np.int64(0), 0, 0, p
            return C_BOOL, np.int64(data[p]), 0, 0, q
        if code == 0x11:
            v = be2(data, p)
            return C_INT, v - 65536 if v > 32767 else v, 0, 0, q
        if code == 0x12:
            return C_UINT, be2(data, p), 0, 0, q
        if code == 0x21:
            v = be4(data, p)
            return C_INT, v - 4294967296 if v > 2147483647 else v, 0, 0, q
        if code == 0x22:
            return C_UINT, be4(data, p), 0, 0, q
        if code == 0x23:
            return C_F32, be4(data, p), 0, 0, q
        if code == 0x31 or code == 0x38:
            return C_INT, be8(data, p), 0, 0, q
        if code == 0x32:
            return C_UINT, be8(data, p), 0, 0, q
        if code == 0x33:
            return C_F64, be8(data, p), 0, 0, q
        if code == 0x48:
            return C_UUID, np.int64(0), p, 16, q
        if code == 0xF0:
            return C_NULL, np.int64(0), 0, 0, q
        if code == 0x27 and be4(data, p) > 0x10FFFF:
            return C_BAD, np.int64(0), 0, 0, p
        return C_OTHER, np.int64(0), p - 1, w + 1, q
    ss = -w
    if p + ss > end:
        return C_BAD, np.int64(0), 0, 0, p
    n = np.int64(data[p]) if ss == 1 else (be2(data, p) if ss == 2 else be4(data, p))
    q = p + ss + n
    if q > end:
        return C_BAD, np.int64(0), 0, 0, p
    # vbin8, str8, vbin16, str16, vbin32: UTF-8 text when valid, else bytes (the
    # codec), which the schema's text view decodes with replacement: the same text.
    if code == 0x80 or code == 0x85 or code == 0x90 or code == 0x95 or code == 0xA0:
        return C_TEXT, np.int64(0), p + ss, n, q
    return C_OTHER, np.int64(0), p - 1, q - p + 1, q


@nb.njit(cache=True, inline="always")
def _scalar10(data: Any, p: Any, end: Any) -> tuple[Any, ...]:
    """One AMQP 1.0 value whose constructor is at p (see ``_scalar010`` for the result)."""
    if p >= end:
        return C_BAD, np.int64(0), 0, 0, p
    c = data[p]
    p += 1
    hi = c >> 4
    if hi == 4:
        if c == 0x40:
            return C_NULL, np.int64(0), 0, 0, p
        if c == 0x41:
            return C_BOOL, np.int64(1), 0, 0, p
        if c == 0x42:
            return C_BOOL, np.int64(0), 0, 0, p
        if c == 0x43 or c == 0x44:
            return C_UINT, np.int64(0), 0, 0, p
        return C_OTHER, np.int64(0), p - 1, 1, p
    if hi == 5:
        if p + 1 > end:
            return C_BAD, np.int64(0), 0, 0, p
        v = np.int64(data[p])
        if c == 0x50 or c == 0x52 or c == 0x53:
            return C_UINT, v, 0, 0, p + 1
        if c == 0x51 or c == 0x54 or c == 0x55:
            return C_INT, v - 256 if v > 127 else v, 0, 0, p + 1
        if c == 0x56 and v <= 1:
            return C_BOOL, v, 0, 0, p + 1
        return C_OTHER, np.int64(0), p - 1, 2, p + 1
    if hi == 6:
        if p + 2 > end:
            return C_BAD, np.int64(0), 0, 0, p
        v = be2(data, p)
        if c == 0x60:
            return C_UINT, v, 0, 0, p + 2
        if c == 0x61:
            return C_INT, v - 65536 if v > 32767 else v, 0, 0, p + 2
        return C_OTHER, np.int64(0), p - 1, 3, p + 2
    if hi == 7:
        if p + 4 > end:
            return C_BAD, np.int64(0), 0, 0, p
        v = be4(data, p)
        if c == 0x70:
            return C_UINT, v, 0, 0, p + 4
        if c == 0x71:
            return C_INT, v - 4294967296 if v > 2147483647 else v, 0, 0, p + 4
        if c == 0x72:
            return C_F32, v, 0, 0, p + 4
        return C_OTHER, np.int64(0), p - 1, 5, p + 4
    if hi == 8:
        if p + 8 > end:
            return C_BAD, np.int64(0), 0, 0, p
        v = be8(data, p)
        if c == 0x80:
            return C_UINT, v, 0, 0, p + 8
        if c == 0x81:
            return C_INT, v, 0, 0, p + 8
        if c == 0x82:
            return C_F64, v, 0, 0, p + 8
        return C_OTHER, np.int64(0), p - 1, 9, p + 8
    if hi == 9:
        if p + 16 > end:
            return C_BAD, np.int64(0), 0, 0, p
        if c == 0x98:
            return C_UUID, np.int64(0), p, 16, p + 16
        return C_OTHER, np.int64(0), p - 1, 17, p + 16
    if hi == 0xA or hi == 0xB:
        ss = 1 if hi == 0xA else 4
        if p + ss > end:
            return C_BAD, np.int64(0), 0, 0, p
        n = np.int64(data[p]) if ss == 1 else be4(data, p)
        q = p + ss + n
        if q > end:
            return C_BAD, np.int64(0), 0, 0, p
        low = c & 15
        # binary, str and sym decode to text when they can, else stay bytes: either
        # way the schema's text view is their UTF-8 decoding with replacement
        if low == 0 or low == 1 or low == 3:
            return C_TEXT, np.int64(0), p + ss, n, q
        return C_OTHER, np.int64(0), p - 1, q - p + 1, q
    if hi >= 0xC:  # list, map, array: sized; the codec checks their insides
        ss = 1 if (hi == 0xC or hi == 0xE) else 4
        if p + ss > end:
            return C_BAD, np.int64(0), 0, 0, p
        n = np.int64(data[p]) if ss == 1 else be4(data, p)
        q = p + ss + n
        if q > end:
            return C_BAD, np.int64(0), 0, 0, p
        return C_OTHER, np.int64(0), p - 1, q - p + 1, q
    # 0x0_: described values (left to the codec as a whole message), 0x1_-0x3_: no such codes
    return C_BAD, np.int64(0), 0, 0, p


@nb.njit(cache=True)
def _value(data: Any, p: Any, end: Any, enc: Any) -> tuple[Any, ...]:
    """The value at p: a 0-10 type code and its bytes, or an AMQP 1.0 constructor and its bytes."""
    if enc == ENC_010:
        if p >= end:
            return C_BAD, np.int64(0), 0, 0, p
        return _scalar010(data, np.int64(data[p]), p + 1, end)
    return _scalar10(data, p, end)


@nb.njit(cache=True)
def _container(data: Any, p: Any, end: Any, enc: Any, want_map: Any) -> tuple[Any, ...]:
    """Header of a list (or map) value at p (code/constructor included).

    Returns (status, first entry position, entry count, end) where count is
    the number of values (a map's keys and values both count in 1.0; for
    0-10 maps it is the number of pairs).
    """
    if p >= end:
        return V_MALFORMED, 0, 0, 0
    c = data[p]
    if enc == ENC_010:
        if c != (0xA8 if want_map else 0xA9):
            return V_NOT_DATA, 0, 0, 0
        return _header010(data, p + 1, end, want_map)
    if want_map:
        if c == 0xC1 or c == 0xD1:
            ss = 1 if c == 0xC1 else 4
        else:
            return V_NOT_DATA, 0, 0, 0
    else:
        if c == 0x45:
            return V_OK, p + 1, 0, p + 1
        if c == 0xC0 or c == 0xD0:
            ss = 1 if c == 0xC0 else 4
        else:
            return V_NOT_DATA, 0, 0, 0
    p += 1
    if p + 2 * ss > end:
        return V_MALFORMED, 0, 0, 0
    size = np.int64(data[p]) if ss == 1 else be4(data, p)
    count = np.int64(data[p + 1]) if ss == 1 else be4(data, p + 4)
    q = p + ss + size
    if size < ss or q > end:
        return V_MALFORMED, 0, 0, 0
    if want_map and count % 2 != 0:
        return V_MALFORMED, 0, 0, 0
    if count > size - ss:
        return V_MALFORMED, 0, 0, 0
    return V_OK, p + 2 * ss, count, q


@nb.njit(cache=True, inline="always")
def _header010(data: Any, p: Any, end: Any, is_map: Any) -> tuple[Any, ...]:
    """A 0-10 map/list after its code: (status, first entry, count, end), the codec's checks."""
    if p + 8 > end:
        return V_MALFORMED, 0, 0, 0
    size = be4(data, p)
    count = be4(data, p + 4)
    q = p + 4 + size
    if q > end or size < 4:
        return V_MALFORMED, 0, 0, 0
    if (count * 2 if is_map else count) > size - 4:
        return V_MALFORMED, 0, 0, 0
    return V_OK, p + 8, count, q


@nb.njit(cache=True, inline="always")
def _key(data: Any, p: Any, end: Any, enc: Any) -> tuple[Any, ...]:
    """A map key at p: (status, key bytes position, length, position of its value).

    0-10 keys are str8, 1.0 keys str or sym (sym only with ASCII bytes, which the
    decoder makes text). Whether the codec takes the bytes as text is left to the
    caller: a key equal to a name it knows is UTF-8; any other must be ASCII.
    """
    if enc == ENC_010:
        if p >= end:
            return V_MALFORMED, 0, 0, 0
        n = np.int64(data[p])
        if p + 1 + n >= end:
            return V_MALFORMED, 0, 0, 0
        return V_OK, p + 1, n, p + 1 + n
    if p + 2 > end:
        return V_MALFORMED, 0, 0, 0
    c = data[p]
    if c == 0xA1 or c == 0xA3:
        n = np.int64(data[p + 1])
        kp = p + 2
    elif c == 0xB1 or c == 0xB3:
        if p + 5 > end:
            return V_MALFORMED, 0, 0, 0
        n = be4(data, p + 1)
        kp = p + 5
    else:
        return V_UNSUPPORTED, 0, 0, 0
    if kp + n > end:
        return V_MALFORMED, 0, 0, 0
    if (c == 0xA3 or c == 0xB3) and not _ascii(data, kp, n):
        return V_UNSUPPORTED, 0, 0, 0
    return V_OK, kp, n, kp + n


@nb.njit(cache=True, inline="always")
def name_hash(data: Any, p: Any, n: Any, k: Any) -> Any:
    """FNV-1a of a name's bytes, mixed with its class index (the name table's key)."""
    h = np.uint64(0xCBF29CE484222325) ^ (np.uint64(k) * np.uint64(0x9E3779B97F4A7C15))
    prime = np.uint64(0x100000001B3)
    for j in range(n):
        h = (h ^ np.uint64(data[p + j])) * prime
    return h ^ (h >> np.uint64(29))


@nb.njit(cache=True, nogil=True)
def name_table(el_names: Any, el_name_off: Any, el_schema: Any, size: Any) -> Any:
    """Open-addressing table of (class, element name) -> element index; ``size`` a power of 2."""
    table = np.full(size, -1, dtype=np.int64)
    mask = np.uint64(size - 1)
    for e in range(el_schema.shape[0]):
        a = el_name_off[e]
        h = name_hash(el_names, a, el_name_off[e + 1] - a, el_schema[e])
        i = np.int64(h & mask)
        while table[i] >= 0:
            i = (i + 1) & (size - 1)
        table[i] = e
    return table


@nb.njit(cache=True, inline="always")
def _lookup(
    data: Any, p: Any, n: Any, k: Any, table: Any, el_names: Any, el_name_off: Any, el_schema: Any
) -> Any:
    """Element index of key bytes (p, n) in class k, or -1 (exact bytes compared on a hit)."""
    size = table.shape[0]
    i = np.int64(name_hash(data, p, n, k) & np.uint64(size - 1))
    while True:
        e = table[i]
        if e < 0:
            return -1
        if el_schema[e] == k:
            a = el_name_off[e]
            if el_name_off[e + 1] - a == n:
                same = True
                for j in range(n):
                    if el_names[a + j] != data[p + j]:
                        same = False
                        break
                if same:
                    return e
        i = (i + 1) & (size - 1)


@nb.njit(cache=True, inline="always")
def _find(
    data: Any,
    pp: Any,
    pn: Any,
    cp: Any,
    cn: Any,
    hp: Any,
    hash_hi: Any,
    hash_lo: Any,
    hash16: Any,
    names: Any,
    name_off: Any,
    hint: Any,
) -> Any:
    """Index of the class (package bytes, class bytes, 16 hash bytes at hp), or -1."""
    h_hi = np.uint64(be8(data, hp))
    h_lo = np.uint64(be8(data, hp + 8))
    n = hash_hi.shape[0]
    for i in range(-1, n):
        k = hint if i == -1 else i
        if k < 0 or (i >= 0 and k == hint):
            continue
        if hash_hi[k] != h_hi or hash_lo[k] != h_lo or not hash16[k]:
            continue
        a = name_off[2 * k]
        b = name_off[2 * k + 1]
        c = name_off[2 * k + 2]
        if b - a != pn or c - b != cn:
            continue
        same = True
        for j in range(pn):
            if names[a + j] != data[pp + j]:
                same = False
                break
        if same:
            for j in range(cn):
                if names[b + j] != data[cp + j]:
                    same = False
                    break
        if same:
            return k
    return -1


@nb.njit(cache=True, nogil=True)
def _grow_i64(a: Any, need: Any) -> Any:
    cap = max(a.shape[0], 16)
    while cap < need:
        cap *= 2
    out = np.empty(cap, dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


@nb.njit(cache=True, nogil=True)
def _grow_rec(a: Any, need: Any) -> Any:
    cap = max(a.shape[1], 16)
    while cap < need:
        cap *= 2
    out = np.empty((a.shape[0], cap), dtype=a.dtype)
    out[:, : a.shape[1]] = a
    return out


@nb.njit(cache=True, inline="always")
def _int_fits(cls: Any, v: Any, t: Any) -> Any:
    """Whether an integer value fits the wide table's column of QMF type t (else the codec decides)."""
    if cls == C_UINT and v < 0:  # >= 2**63: only the 64-bit types keep the bit pattern
        return t == 4 or t == 8 or t == 9 or t == 19 or t == 11
    if t == 16:
        return -128 <= v <= 127
    if t == 1 or t == 17:
        return -32768 <= v <= 32767
    if t == 2 or t == 18:
        return -2147483648 <= v <= 2147483647
    return True


@nb.njit(cache=True, nogil=True)
def v2_walk(
    data: Any,
    offs: Any,
    rows: Any,
    encs: Any,
    hash_hi: Any,
    hash_lo: Any,
    hash16: Any,
    names: Any,
    name_off: Any,
    table: Any,
    el_names: Any,
    el_name_off: Any,
    el_schema: Any,
    p_start: Any,
    el_slot: Any,
    el_type: Any,
    el_lpos: Any,
    n_slots: Any,
    lits: Any,
    lit_off: Any,
) -> tuple[Any, ...]:
    """Walk the v2 data indications ``rows`` (batch rows, encodings ``encs``).

    Returns (records, n_records, status per candidate, ints, ints valid,
    n_ints, floats (float64 bits), floats valid, n_floats, text kinds,
    text positions, text lengths, text types, n_texts, checks, n_checks):
    the record matrix (``W_*`` rows) and the compact layout's typed lists,
    every record taking its class's slot counts (absent values not valid).
    Texts are raw bytes, uuids, or encoded values for Python (``T_PY``);
    ``checks`` are (position, length, candidate) of encoded values outside
    the schema's slots that the codec must also accept (nested containers).
    """
    data = unowned(data)
    offs = unowned(offs)
    names = unowned(names)
    name_off = unowned(name_off)
    table = unowned(table)
    el_names = unowned(el_names)
    el_name_off = unowned(el_name_off)
    el_schema = unowned(el_schema)
    el_slot = unowned(el_slot)
    el_type = unowned(el_type)
    el_lpos = unowned(el_lpos)
    lits = unowned(lits)
    nc = rows.shape[0]
    total = 0
    for j in range(nc):
        total += offs[rows[j] + 1] - offs[rows[j]]
    est = max(16, total // 400)
    rec = np.empty((N_WFIELDS, est), dtype=np.int64)
    ints = np.empty(est * 24, dtype=np.int64)
    i_ok = np.empty(est * 24, dtype=np.bool_)
    flts = np.empty(16, dtype=np.int64)
    f_ok = np.empty(16, dtype=np.bool_)
    tkind = np.empty(est * 4, dtype=np.int8)
    tpos = np.empty(est * 4, dtype=np.int64)
    tlen = np.empty(est * 4, dtype=np.int64)
    ttype = np.empty(est * 4, dtype=np.int64)
    chk = np.empty((3, 16), dtype=np.int64)
    stamp = np.full(max(el_schema.shape[0], 1), -1, dtype=np.int64)
    succ = np.full(max(el_schema.shape[0], 1), -1, dtype=np.int64)  # see the values loop
    first = np.full(max(hash_hi.shape[0], 1), -1, dtype=np.int64)
    status = np.zeros(nc, dtype=np.uint8)
    xk = np.empty((2, 64), dtype=np.int64)  # a record's keys that are not in its schema
    bits = np.empty(1, dtype=np.int64)  # float bit casts
    bits_f = bits.view(np.float64)
    bits32 = np.empty(1, dtype=np.uint32)
    bits32_f = bits32.view(np.float32)
    last_sid_p, last_sid_n, last_k = 0, -1, -1
    nrec = 0
    ni = 0
    nf = 0
    nt = 0
    nx = 0
    serial = 0
    hint = -1
    for j in range(nc):
        m = rows[j]
        enc = encs[j]
        start = offs[m]
        end = offs[m + 1]
        r0, i0, f0, t0, x0 = nrec, ni, nf, nt, nx
        if enc == ENC_010:
            st, p, count, body_end = _header010(data, start, end, False)
        else:
            st, p, count, body_end = _container(data, start, end, enc, False)
        if st == V_OK and body_end != end:
            st = V_MALFORMED  # bytes after the body
        ridx = 0
        while st == V_OK and ridx < count:
            if p >= body_end:
                st = V_MALFORMED
                break
            st, q, n_entries, rec_end = _container(data, p, body_end, enc, True)
            if st != V_OK:
                break
            if enc == ENC_010:
                n_pairs = n_entries
            else:
                n_pairs = n_entries // 2
            # the record map: remember where each part is, then read the values
            seen = 0
            sid_p = -1
            oid_p = -1
            vals_p = -1
            upd = np.int64(0)
            cre = np.int64(0)
            dele = np.int64(0)
            for _e in range(n_pairs):
                st, kp, kn, vp = _key(data, q, rec_end, enc)
                if st != V_OK:
                    break
                cls, iv, vpos, vlen, q = _value(data, vp, rec_end, enc)
                if cls == C_BAD:
                    st = V_MALFORMED
                    break
                flag = 0
                for L in range(6):
                    if _is_lit(data, kp, kn, lits, lit_off[L], lit_off[L + 1]):
                        flag = 1 << L
                        break
                if flag == 0 or seen & flag:  # another key, or one twice: the codec decides
                    st = V_UNSUPPORTED  # duplicate key
                    break
                seen |= flag
                if flag == _K_SCHEMA or flag == _K_OBJECT or flag == _K_VALUES:
                    if cls == C_NULL:
                        continue
                    if cls != C_OTHER:
                        st = V_UNSUPPORTED
                        break
                    if flag == _K_SCHEMA:
                        sid_p = vpos
                    elif flag == _K_OBJECT:
                        oid_p = vpos
                    else:
                        vals_p = vpos
                    continue
                # a time: an integer (or boolean) is the value, anything else 0 (the codec's _i)
                tv = iv if (cls == C_INT or cls == C_UINT or cls == C_BOOL) else np.int64(0)
                if cls == C_OTHER:
                    st = V_UNSUPPORTED
                    break
                if flag == _K_UPDATE:
                    upd = tv
                elif flag == _K_CREATE:
                    cre = tv
                else:
                    dele = tv
            if st != V_OK:
                break
            if q != rec_end:
                st = V_MALFORMED
                break
            # _schema_id -> class
            if sid_p < 0:
                st = V_UNKNOWN_SCHEMA
                break
            st, q, n_entries, sid_end = _container(data, sid_p, rec_end, enc, True)
            if st != V_OK:
                st = V_UNSUPPORTED if st == V_NOT_DATA else st
                break
            # the same schema id bytes as the last record's: the same class (checked then)
            sid_n = sid_end - sid_p
            if sid_n == last_sid_n and _same(data, last_sid_p, data, sid_p, sid_n):
                k = last_k
            else:
                n_pairs = n_entries if enc == ENC_010 else n_entries // 2
                pp, pn, cp, cn, hp = -1, 0, -1, 0, -1
                sseen = 0
                for _e in range(n_pairs):
                    st, kp, kn, vp = _key(data, q, sid_end, enc)
                    if st != V_OK:
                        break
                    cls, iv, vpos, vlen, q = _value(data, vp, sid_end, enc)
                    if cls == C_BAD:
                        st = V_MALFORMED
                        break
                    which = -1
                    for L in range(L_PKG, L_TYPE + 1):
                        if _is_lit(data, kp, kn, lits, lit_off[L], lit_off[L + 1]):
                            which = L
                            break
                    if which < 0:  # another key (maybe not UTF-8, maybe twice): the codec's
                        st = V_UNSUPPORTED
                        break
                    if sseen & (1 << which):
                        st = V_UNSUPPORTED
                        break
                    sseen |= 1 << which
                    if which == L_HASH:
                        if cls != C_UUID:
                            st = V_UNSUPPORTED
                            break
                        hp = vpos
                    elif which == L_TYPE:
                        if cls == C_OTHER:
                            st = V_UNSUPPORTED
                            break
                        if cls == C_TEXT and _le_name(data, vpos, vlen, lits[lit_off[L_EVENT] : lit_off[L_EVENT + 1]]):  # fmt: skip
                            st = V_NOT_DATA
                            break
                    elif cls != C_TEXT:
                        st = V_UNSUPPORTED
                        break
                    elif which == L_PKG:
                        pp, pn = vpos, vlen
                    else:
                        cp, cn = vpos, vlen
                if st != V_OK:
                    break
                if q != sid_end:
                    st = V_MALFORMED
                    break
                if pp < 0 or cp < 0 or hp < 0:
                    st = V_UNKNOWN_SCHEMA
                    break
                k = _find(data, pp, pn, cp, cn, hp, hash_hi, hash_lo, hash16, names, name_off, hint)
                if k < 0:
                    st = V_UNKNOWN_SCHEMA
                    break
                hint = k
                last_sid_p, last_sid_n, last_k = sid_p, sid_n, k
            # _object_id
            an_p, an_n, on_p, on_n = -1, -1, -1, -1
            epoch = np.int64(0)
            epoch_ok = 0
            if oid_p >= 0:
                st, q, n_entries, oid_end = _container(data, oid_p, rec_end, enc, True)
                if st != V_OK:
                    st = V_UNSUPPORTED if st == V_NOT_DATA else st
                    break
                n_pairs = n_entries if enc == ENC_010 else n_entries // 2
                oseen = 0
                for _e in range(n_pairs):
                    st, kp, kn, vp = _key(data, q, oid_end, enc)
                    if st != V_OK:
                        break
                    cls, iv, vpos, vlen, q = _value(data, vp, oid_end, enc)
                    if cls == C_BAD:
                        st = V_MALFORMED
                        break
                    which = -1
                    for L in range(L_AGENT, L_OBJNAME + 1):
                        if _is_lit(data, kp, kn, lits, lit_off[L], lit_off[L + 1]):
                            which = L
                            break
                    if which < 0:  # another key (maybe not UTF-8, maybe twice): the codec's
                        st = V_UNSUPPORTED
                        break
                    if oseen & (1 << which):
                        st = V_UNSUPPORTED
                        break
                    oseen |= 1 << which
                    if cls == C_NULL:
                        continue
                    if which == L_EPOCH:
                        if cls == C_INT or cls == C_BOOL or (cls == C_UINT and iv >= 0):
                            epoch = iv
                        elif cls == C_UINT or cls == C_OTHER:
                            st = V_UNSUPPORTED
                            break
                        epoch_ok = 1  # other values: 0 (the codec's _i)
                    elif cls != C_TEXT:
                        st = V_UNSUPPORTED
                        break
                    elif which == L_AGENT:
                        an_p, an_n = vpos, vlen
                    else:
                        on_p, on_n = vpos, vlen
                if st != V_OK:
                    break
                if q != oid_end:
                    st = V_MALFORMED
                    break
            # slots of this record, all absent to begin with
            si, sf, stx = n_slots[k, 0], n_slots[k, 1], n_slots[k, 2]
            if ni + si > ints.shape[0]:
                ints = _grow_i64(ints, ni + si)
                i_ok = _grow_i64(i_ok, ni + si)
            if nf + sf > flts.shape[0]:
                flts = _grow_i64(flts, nf + sf)
                f_ok = _grow_i64(f_ok, nf + sf)
            if nt + stx > tkind.shape[0]:
                tkind = _grow_i64(tkind, nt + stx)
                tpos = _grow_i64(tpos, nt + stx)
                tlen = _grow_i64(tlen, nt + stx)
                ttype = _grow_i64(ttype, nt + stx)
            for x in range(si):
                ints[ni + x] = 0
                i_ok[ni + x] = False
            for x in range(sf):
                flts[nf + x] = 0
                f_ok[nf + x] = False
            for x in range(stx):
                tkind[nt + x] = T_NULL
                tpos[nt + x] = 0
                tlen[nt + x] = 0
                ttype[nt + x] = 0
            serial += 1
            if vals_p >= 0:
                st, q, n_entries, vals_end = _container(data, vals_p, rec_end, enc, True)
                if st != V_OK:
                    st = V_UNSUPPORTED if st == V_NOT_DATA else st
                    break
                n_pairs = n_entries if enc == ENC_010 else n_entries // 2
                n_extra = 0
                prev = -1
                for _e in range(n_pairs):
                    st, kp, kn, vp = _key(data, q, vals_end, enc)
                    if st != V_OK:
                        break
                    cls, iv, vpos, vlen, q = _value(data, vp, vals_end, enc)
                    if cls == C_BAD:
                        st = V_MALFORMED
                        break
                    # first guess: the key that followed the previous one last time (an
                    # agent writes its maps in one order), checked byte for byte; else the
                    # hash table, and the guess is learnt
                    e = first[k] if prev < 0 else succ[prev]
                    if e >= 0:
                        a = el_name_off[e]
                        if el_name_off[e + 1] - a != kn or not _same(el_names, a, data, kp, kn):
                            e = -1
                    if e < 0:
                        e = _lookup(data, kp, kn, k, table, el_names, el_name_off, el_schema)
                        if e >= 0:
                            if prev < 0:
                                first[k] = e
                            else:
                                succ[prev] = e
                    if e >= 0:
                        prev = e
                    if e < 0:  # not in the schema: ignored, but checked like any value
                        # (a key twice is a codec error: compare with the other such keys)
                        if n_extra >= xk.shape[1] or not _ascii(data, kp, kn):
                            st = V_UNSUPPORTED
                            break
                        for y in range(n_extra):
                            if xk[1, y] == kn:
                                dup = True
                                for b in range(kn):
                                    if data[xk[0, y] + b] != data[kp + b]:
                                        dup = False
                                        break
                                if dup:
                                    st = V_UNSUPPORTED
                                    break
                        if st != V_OK:
                            break
                        xk[0, n_extra] = kp
                        xk[1, n_extra] = kn
                        n_extra += 1
                        if cls == C_OTHER:
                            if nx >= chk.shape[1]:
                                chk = _grow_rec(chk, nx + 1)
                            chk[0, nx] = vpos
                            chk[1, nx] = vlen
                            chk[2, nx] = j
                            nx += 1
                        continue
                    if stamp[e] == serial:
                        st = V_UNSUPPORTED  # duplicate key
                        break
                    stamp[e] = serial
                    if cls == C_NULL:
                        continue
                    s = el_slot[e]
                    t = el_type[e]
                    lp = el_lpos[e]
                    if s == 0:
                        if cls == C_INT or cls == C_UINT or cls == C_BOOL:
                            if not _int_fits(cls, iv, t):
                                st = V_UNSUPPORTED
                                break
                            ints[ni + lp] = (1 if iv != 0 else 0) if t == 11 else iv
                            i_ok[ni + lp] = True
                        else:
                            st = V_UNSUPPORTED
                            break
                    elif s == 1:
                        if cls == C_F64:
                            bits[0] = iv
                            if t == 12:  # a float element: the double rounded to float32
                                bits_f[0] = np.float64(np.float32(bits_f[0]))
                            flts[nf + lp] = bits[0]
                        elif cls == C_F32:
                            bits32[0] = np.uint32(iv)
                            bits_f[0] = np.float64(bits32_f[0])
                            flts[nf + lp] = bits[0]
                        else:
                            st = V_UNSUPPORTED
                            break
                        f_ok[nf + lp] = True
                    else:
                        if cls == C_TEXT and (t == 6 or t == 7):
                            tkind[nt + lp] = T_RAW
                        elif cls == C_UUID and t == 14:
                            tkind[nt + lp] = T_UUID
                        elif cls == C_TEXT or cls == C_UUID:
                            # text or uuid bytes for another type: the codec's view decides
                            tkind[nt + lp] = T_PY
                            if enc == ENC_010:
                                vpos, vlen = _encoded010(data, vp)
                            else:
                                vpos, vlen = _encoded10(data, vp)
                        elif cls == C_OTHER:
                            tkind[nt + lp] = T_PY
                        else:  # a number or boolean for a text element
                            tkind[nt + lp] = T_PY
                            if enc == ENC_010:
                                vpos, vlen = _encoded010(data, vp)
                            else:
                                vpos, vlen = _encoded10(data, vp)
                        tpos[nt + lp] = vpos
                        tlen[nt + lp] = vlen
                        ttype[nt + lp] = t
                if st != V_OK:
                    break
                if q != vals_end:
                    st = V_MALFORMED
                    break
            if nrec >= rec.shape[1]:
                rec = _grow_rec(rec, nrec + 1)
            rec[W_MSG, nrec] = m
            rec[W_IDX, nrec] = ridx
            rec[W_SCHEMA, nrec] = k
            rec[W_UPDATE, nrec] = upd
            rec[W_CREATE, nrec] = cre
            rec[W_DELETE, nrec] = dele
            rec[W_EPOCH, nrec] = epoch
            rec[W_EPOCH_OK, nrec] = epoch_ok
            rec[W_HAS_OID, nrec] = 1 if oid_p >= 0 else 0
            rec[W_AN_POS, nrec] = an_p
            rec[W_AN_LEN, nrec] = an_n
            rec[W_ON_POS, nrec] = on_p
            rec[W_ON_LEN, nrec] = on_n
            rec[W_IOFF, nrec] = ni
            rec[W_FOFF, nrec] = nf
            rec[W_TOFF, nrec] = nt
            ni += si
            nf += sf
            nt += stx
            nrec += 1
            ridx += 1
            p = rec_end
        if st == V_OK and p != body_end:
            st = V_MALFORMED
        if st != V_OK:
            status[j] = st
            nrec, ni, nf, nt, nx = r0, i0, f0, t0, x0
    return (
        rec[:, :nrec], status, ints[:ni], i_ok[:ni], flts[:nf], f_ok[:nf],
        tkind[:nt], tpos[:nt], tlen[:nt], ttype[:nt], chk[:, :nx],
    )  # fmt: skip


@nb.njit(cache=True, inline="always")
def _encoded010(data: Any, vp: Any) -> tuple[Any, Any]:
    """(position, length) of the whole 0-10 value at vp (type code included)."""
    code = np.int64(data[vp])
    w = _width010(code)
    if w >= 0:
        return vp, w + 1
    ss = -w
    n = (
        np.int64(data[vp + 1])
        if ss == 1
        else (be2(data, vp + 1) if ss == 2 else be4(data, vp + 1))
    )
    return vp, 1 + ss + n


@nb.njit(cache=True, inline="always")
def _encoded10(data: Any, vp: Any) -> tuple[Any, Any]:
    """(position, length) of the whole AMQP 1.0 value at vp (constructor included)."""
    _c, _v, _p, _n, q = _scalar10(data, vp, data.shape[0])
    return vp, q - vp


@intrinsic
def _memcpy(typingctx: Any, dst: Any, src: Any, n: Any) -> Any:
    """memcpy between two addresses (LLVM's, so it stays cacheable, unlike a ctypes call)."""
    sig = types.void(types.int64, types.int64, types.int64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        d = builder.inttoptr(args[0], cgutils.voidptr_t)
        s = builder.inttoptr(args[1], cgutils.voidptr_t)
        cgutils.raw_memcpy(builder, d, s, args[2], 1)  # type: ignore[no-untyped-call]
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _load8(typingctx: Any, addr: Any) -> Any:
    """The 8 bytes at an address as a uint64, any alignment (one load)."""
    sig = types.uint64(types.int64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        ptr = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        return builder.load(ptr, align=1)

    return sig, codegen


@nb.njit(cache=True, inline="always")
def _same(a: Any, pa: Any, b: Any, pb: Any, n: Any) -> Any:
    """a[pa:pa + n] == b[pb:pb + n], 8 bytes at a time (the last word may overlap)."""
    if n < 8:
        for j in range(n):
            if a[pa + j] != b[pb + j]:
                return False
        return True
    aa = a.ctypes.data + pa
    bb = b.ctypes.data + pb
    j = 0
    while j + 8 < n:
        if _load8(aa + j) != _load8(bb + j):  # type: ignore[call-arg]
            return False
        j += 8
    return _load8(aa + n - 8) == _load8(bb + n - 8)  # type: ignore[call-arg]


@nb.njit(cache=True, inline="always")
def _copy(dst: Any, d: Any, src: Any, s: Any, n: Any) -> None:
    """dst[d:d + n] = src[s:s + n] by memcpy: a byte loop or numba's slice assignment
    copies about 1 byte per ns, and v2 object names are long (about 100 bytes)."""
    if n > 0:
        _memcpy(dst.ctypes.data + d, src.ctypes.data + s, np.int64(n))  # type: ignore[call-arg]


@nb.njit(cache=True, nogil=True)
def v2_text_values(
    data: Any, kind: Any, pos: Any, ln: Any, cidx: Any, c_off: Any, c_buf: Any, hexd: Any
) -> tuple[Any, Any]:
    """(int32 offsets, bytes) of the texts of ``v2_walk``: raw bytes, uuids, Python's texts."""
    data = unowned(data)
    kind = unowned(kind)
    pos = unowned(pos)
    ln = unowned(ln)
    cidx = unowned(cidx)
    c_off = unowned(c_off)
    c_buf = unowned(c_buf)
    n = kind.shape[0]
    cap = 0
    for i in range(n):
        kd = kind[i]
        if kd == T_RAW:
            cap += ln[i]
        elif kd == T_UUID:
            cap += 36
        elif kd == T_PY:
            c = cidx[i]
            if c >= 0:
                cap += c_off[c + 1] - c_off[c]
    buf = np.empty(cap, dtype=np.uint8)
    offsets = np.empty(n + 1, dtype=np.int32)
    offsets[0] = 0
    w = 0
    for i in range(n):
        kd = kind[i]
        if kd == T_RAW:
            m = ln[i]
            _copy(buf, w, data, pos[i], m)
            w += m
        elif kd == T_UUID:
            w = write_uuid(buf, w, data, pos[i], hexd)
        elif kd == T_PY:
            c = cidx[i]
            if c >= 0:
                m = c_off[c + 1] - c_off[c]
                _copy(buf, w, c_buf, c_off[c], m)
                w += m
        offsets[i + 1] = w
    return offsets, buf[:w]


@nb.njit(cache=True, nogil=True)
def gather_texts(data: Any, pos: Any, ln: Any, empty_if: Any) -> tuple[Any, Any, Any]:
    """(int32 offsets, bytes, valid) of byte ranges; length -1: "" where ``empty_if``, else null."""
    data = unowned(data)
    pos = unowned(pos)
    ln = unowned(ln)
    empty_if = unowned(empty_if)
    n = pos.shape[0]
    offsets = np.empty(n + 1, dtype=np.int32)
    valid = np.empty(n, dtype=np.bool_)
    offsets[0] = 0
    total = 0
    for i in range(n):
        if ln[i] >= 0:
            total += ln[i]
        offsets[i + 1] = total
    buf = np.empty(total, dtype=np.uint8)
    for i in range(n):
        m = ln[i]
        valid[i] = m >= 0 or empty_if[i] != 0
        if m > 0:
            _copy(buf, offsets[i], data, pos[i], m)
    return offsets, buf, valid


@nb.njit(cache=True, nogil=True)
def raw_groups(data: Any, pos: Any, ln: Any, tag: Any) -> tuple[Any, Any]:
    """Group equal (tag, bytes) ranges: (representative of each group, group of each range).

    A 64-bit hash and an open-addressing table group them, equal bytes checked
    on every hash hit (a collision makes two groups, never a wrong one).
    """
    data = unowned(data)
    pos = unowned(pos)
    ln = unowned(ln)
    tag = unowned(tag)
    n = pos.shape[0]
    hashes = np.empty(n, dtype=np.uint64)
    prime = np.uint64(0x100000001B3)
    base = data.ctypes.data
    for i in range(n):
        h = (np.uint64(0xCBF29CE484222325) ^ np.uint64(ln[i])) * prime
        h = (h ^ np.uint64(tag[i])) * prime
        p = pos[i]
        m = ln[i]
        j = 0
        while j + 8 <= m:  # a word at a time, then the tail bytes
            h = (h ^ _load8(base + p + j)) * prime  # type: ignore[call-arg]
            h ^= h >> np.uint64(32)
            j += 8
        while j < m:
            h = (h ^ np.uint64(data[p + j])) * prime
            j += 1
        hashes[i] = h
    size = 16
    while size < 2 * n:
        size *= 2
    slots = np.full(size, -1, dtype=np.int64)  # open addressing: slot -> group
    inv = np.empty(n, dtype=np.int64)
    rep = np.empty(n, dtype=np.int64)
    g = 0
    for i in range(n):
        h = hashes[i]
        at = np.int64(h & np.uint64(size - 1))
        while True:
            grp = slots[at]
            if grp < 0:  # a new encoding
                slots[at] = g
                rep[g] = i
                inv[i] = g
                g += 1
                break
            r = rep[grp]
            if (
                hashes[r] == h
                and ln[r] == ln[i]
                and tag[r] == tag[i]
                and _same(data, pos[i], data, pos[r], ln[i])
            ):
                inv[i] = grp
                break
            at = (at + 1) & (size - 1)
    return rep[:g], inv


_P_OPCODE = 0
_P_CONTENT = 1
_P_ENCODING = 2
_P_AGENT = 3
_P_AGENT_NAMED = 4  # x-qmf-agent, the name at literal 8 (after the four names and four values)


@nb.njit(cache=True, inline="always")
def _same_bytes(buf: Any, a: Any, n: Any, lit: Any) -> Any:
    if n != lit.shape[0]:
        return False
    for j in range(n):
        if buf[a + j] != lit[j]:
            return False
    return True


@nb.njit(cache=True, nogil=True)
def v2_props(
    row_ok: Any,
    m_off: Any,
    k_off: Any,
    k_buf: Any,
    i_off: Any,
    i_buf: Any,
    i_ok: Any,
    lits: Any,
    lit_off: Any,
) -> tuple[Any, Any, Any, Any]:
    """Which messages are v2 data indications, from their application properties (an Arrow map).

    ``lits`` holds the names qmf.opcode, qmf.content, x-qmf-body-encoding,
    qmf.agent, then the values _data_indication, _query_response, _data,
    amqp-1.0, then the name x-qmf-agent (the receiver's name for the agent behind
    qpidd's alias ``broker``: it wins over qmf.agent). A key given twice counts with its last value (as a
    dict of the pairs does). Returns per message the opcode (0: not a data
    indication, 1: _data_indication, 2: _query_response), the body encoding
    (0: none marked, 2: AMQP 1.0, -1: another one) and the position and length
    of the qmf.agent value in ``i_buf`` (length -1: none).
    """
    row_ok = unowned(row_ok)
    m_off = unowned(m_off)
    k_off = unowned(k_off)
    k_buf = unowned(k_buf)
    i_off = unowned(i_off)
    i_buf = unowned(i_buf)
    i_ok = unowned(i_ok)
    lits = unowned(lits)
    lit_off = unowned(lit_off)
    n = row_ok.shape[0]
    opcode = np.zeros(n, dtype=np.int64)
    enc = np.zeros(n, dtype=np.int64)
    a_pos = np.zeros(n, dtype=np.int64)
    a_len = np.full(n, -1, dtype=np.int64)
    for m in range(n):
        if not row_ok[m]:
            continue
        op = 0
        content = False
        en = 0
        x_pos = 0
        x_len = -1
        for x in range(m_off[m], m_off[m + 1]):
            ka = k_off[x]
            kn = k_off[x + 1] - ka
            which = -1
            for L in range(4):
                if _same_bytes(k_buf, ka, kn, lits[lit_off[L] : lit_off[L + 1]]):
                    which = L
                    break
            if which < 0 and _same_bytes(k_buf, ka, kn, lits[lit_off[8] : lit_off[9]]):
                which = _P_AGENT_NAMED
            if which < 0:
                continue
            va = i_off[x]
            vn = i_off[x + 1] - va
            valid = i_ok[x]
            if which == _P_AGENT_NAMED:
                x_pos = va
                x_len = vn if valid else -1
            elif which == _P_OPCODE:
                op = 0
                if valid:
                    if _same_bytes(i_buf, va, vn, lits[lit_off[4] : lit_off[5]]):
                        op = 1
                    elif _same_bytes(i_buf, va, vn, lits[lit_off[5] : lit_off[6]]):
                        op = 2
            elif which == _P_CONTENT:
                content = valid and _same_bytes(i_buf, va, vn, lits[lit_off[6] : lit_off[7]])
            elif which == _P_ENCODING:
                en = 0
                if valid:
                    en = 2 if _same_bytes(i_buf, va, vn, lits[lit_off[7] : lit_off[8]]) else -1
            else:
                a_pos[m] = va
                a_len[m] = vn if valid else -1
        if x_len > 0:  # the receiver named the agent behind qpidd's alias "broker"
            a_pos[m] = x_pos
            a_len[m] = x_len
        opcode[m] = op if content else 0
        enc[m] = en
    return opcode, enc, a_pos, a_len


@nb.njit(cache=True, nogil=True)
def agent_texts(
    msg: Any, h_pos: Any, h_len: Any, h_buf: Any, data: Any, an_pos: Any, an_len: Any
) -> tuple[Any, Any, Any]:
    """Each record's agent: its message's qmf.agent header unless null or empty, else the
    object id's agent name (null when that is absent too): (int32 offsets, bytes, valid)."""
    data = unowned(data)
    h_buf = unowned(h_buf)
    msg = unowned(msg)
    h_pos = unowned(h_pos)
    h_len = unowned(h_len)
    an_pos = unowned(an_pos)
    an_len = unowned(an_len)
    n = msg.shape[0]
    offsets = np.empty(n + 1, dtype=np.int32)
    valid = np.empty(n, dtype=np.bool_)
    offsets[0] = 0
    total = 0
    for i in range(n):
        hl = h_len[msg[i]]
        total += hl if hl > 0 else max(an_len[i], 0)
        offsets[i + 1] = total
    buf = np.empty(total, dtype=np.uint8)
    for i in range(n):
        m = msg[i]
        hl = h_len[m]
        o = offsets[i]
        if hl > 0:
            _copy(buf, o, h_buf, h_pos[m], hl)
            valid[i] = True
        else:
            ln = an_len[i]
            valid[i] = ln >= 0
            if ln > 0:
                _copy(buf, o, data, an_pos[i], ln)
    return offsets, buf, valid
