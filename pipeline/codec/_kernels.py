"""Numba kernels behind ``pipeline.codec.vectorized``.

v1 content records carry no lengths, so finding record boundaries means
parsing every value. Doing that in Python costs microseconds per record; these
kernels walk the raw Arrow binary buffers (offsets + data) once in compiled
code and write a flat slab of 64-bit value slots, which the column builders
then gather column by column. Everything here is plain numpy in, numpy out:
no Arrow and no Python objects, so the kernels compile once (``cache=True``)
and run without the GIL's per-object costs.

Slot encoding (one int64 per element value):
  * integers, booleans, times: the value (unsigned ones zero-extended, so a
    uint64 above 2**63 reads back as a negative int64: the bit pattern);
  * float: the raw 32 bits, double: the raw 64 bits;
  * every variable-length or 16-byte type (str8, str16, objId, uuid, map,
    list, array): the absolute position of the encoded value in ``data``.
"""

from __future__ import annotations

import sys
from typing import Any

import numba as nb
import numpy as np
import numpy.typing as npt
from numba.core import cgutils, types
from numba.extending import intrinsic

if sys.byteorder != "little":  # ``fill`` loads 8 bytes natively and swaps them
    raise ImportError("pipeline.codec._kernels assumes a little-endian CPU")

# Per-message status written by ``walk``. OK messages were decoded entirely
# here; any other status sends the whole message to the per-record path.
ST_OK = 0
ST_NOT_V1 = 1  # no AM1/AM2 magic (QMF v2, empty, garbage)
ST_NOT_CONTENT = 2  # a record other than c/i/g
ST_UNKNOWN_SCHEMA = 3
ST_TRUNCATED = 4
ST_UNSUPPORTED = 5  # type code the kernel does not handle (e.g. 20), > 64 optional properties
ST_BAD_TYPE = 6  # type code unknown in the schema
ST_MALFORMED = 7  # a value the codec rejects (boolean octet > 1)
# AM1 object id or reference with the reserved bit 63 set: the per-record codec
# keeps the record and reports a non-fatal ReservedBitSet problem, so it decodes them.
ST_RESERVED = 8

STATUS_NAMES = (
    "ok",
    "not AM1/AM2",
    "non-content record",
    "unknown schema",
    "truncated",
    "unsupported type",
    "unknown type code",
    "malformed value",
    "reserved bit set",
)

# Rows of the (field, record) matrix returned by ``walk``.
R_MSG = 0  # row of the message in the input batch
R_IDX = 1  # position of the record in its message
R_SCHEMA = 2  # index into the compiled schema list
R_OP = 3  # opcode byte
R_SEQ = 4
R_VER = 5  # 1 = AM1, 2 = AM2
R_UPDATE = 6
R_CREATE = 7
R_DELETE = 8
R_OID_HI = 9  # AM1: the whole id; AM2: first u64
R_OID_LO = 10  # AM2: object number; AM1: 0
R_PRESENCE = 11  # presence octets, octet 0 in bits 0..7
R_POFF = 12  # first property slot, -1 when the record has no properties
R_SOFF = 13  # first statistic slot, -1 when it has no statistics
N_RFIELDS = 14

OP_C = 0x63
OP_I = 0x69
OP_G = 0x67

# Element kinds: what the kernel does with a value, computed per element from
# its QMF type code by ``element_kind`` (so the hot loop never looks at type codes).
K_U8 = 1
K_U16 = 2
K_U32 = 3  # uint32, float (raw bits)
K_U64 = 4  # uint64, int64, absTime, deltaTime, double (raw bits)
K_I8 = 5
K_I16 = 6
K_I32 = 7
K_BOOL = 8
K_UUID = 9  # 16 bytes, slot = position
K_REF = 10  # 8 (AM1) or 16 (AM2) bytes, slot = position
K_STR8 = 11  # slot = position of the length byte
K_STR16 = 12
K_SIZED32 = 13  # map, list, array: u32 byte size first; slot = position
K_UNSUPPORTED = 14  # type 20 (object): needs the per-record path
K_BAD = 15  # not a QMF type code

_KIND_OF = {
    1: K_U8, 2: K_U16, 3: K_U32, 4: K_U64, 6: K_STR8, 7: K_STR16, 8: K_U64, 9: K_U64,
    10: K_REF, 11: K_BOOL, 12: K_U32, 13: K_U64, 14: K_UUID, 15: K_SIZED32, 16: K_I8,
    17: K_I16, 18: K_I32, 19: K_U64, 20: K_UNSUPPORTED, 21: K_SIZED32, 22: K_SIZED32,
}  # fmt: skip


@intrinsic
def _void_ptr(typingctx: Any, address: Any) -> Any:
    """An integer address as a ``void *`` (for ``nb.carray``)."""
    sig = types.voidptr(address)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return sig, codegen


@nb.njit(cache=True, inline="always")
def unowned(a: Any) -> Any:
    """A view of a 1-D array with no reference count of its own.

    numba counts references to arrays it passes into inlined helpers, and
    cannot drop the count updates in a loop with many branches: two atomic
    operations per value read, a third of the walk's time. A view without a
    meminfo makes them no-ops. Only for use within one kernel call: the
    caller's array keeps the memory alive.
    """
    if not a.flags.c_contiguous:
        raise ValueError("unowned needs a contiguous array")
    return nb.carray(_void_ptr(a.ctypes.data), a.shape, a.dtype)  # type: ignore[call-arg,attr-defined]


def element_kind(type_code: int) -> int:
    """The kernel's kind for a QMF type code."""
    return _KIND_OF.get(type_code, K_BAD)


@nb.njit(cache=True, inline="always")
def be2(d: Any, p: int) -> np.int64:
    return (np.int64(d[p]) << 8) | np.int64(d[p + 1])


@nb.njit(cache=True, inline="always")
def be4(d: Any, p: int) -> np.int64:
    return (
        (np.int64(d[p]) << 24)
        | (np.int64(d[p + 1]) << 16)
        | (np.int64(d[p + 2]) << 8)
        | np.int64(d[p + 3])
    )


@nb.njit(cache=True, inline="always")
def be8(d: Any, p: int) -> np.int64:
    return (be4(d, p) << 32) | be4(d, p + 4)


@nb.njit(cache=True, inline="always")
def _bswap64(x: np.uint64) -> np.uint64:
    """Big-endian <-> native for a uint64 loaded little-endian (LLVM emits one bswap)."""
    m32 = np.uint64(0x00000000FFFFFFFF)
    m16 = np.uint64(0x0000FFFF0000FFFF)
    m8 = np.uint64(0x00FF00FF00FF00FF)
    x = ((x & m32) << np.uint64(32)) | ((x >> np.uint64(32)) & m32)
    x = ((x & m16) << np.uint64(16)) | ((x >> np.uint64(16)) & m16)
    return ((x & m8) << np.uint64(8)) | ((x >> np.uint64(8)) & m8)


@nb.njit(cache=True, inline="always")
def _be(data: Any, p: int, n: int) -> np.uint64:
    v = np.uint64(0)
    for k in range(n):
        v = (v << np.uint64(8)) | np.uint64(data[p + k])
    return v


@nb.njit(cache=True, inline="always")
def _read_value(data: Any, p: Any, end: Any, kind: Any, ver: Any) -> tuple[Any, Any, int]:
    """Decode one value at p: (slot, next position, status)."""
    if kind == K_U64:
        if p + 8 > end:
            return np.int64(0), p, ST_TRUNCATED
        return be8(data, p), p + 8, ST_OK
    if kind == K_U32:
        if p + 4 > end:
            return np.int64(0), p, ST_TRUNCATED
        return be4(data, p), p + 4, ST_OK
    if kind == K_STR8:
        if p + 1 > end or p + 1 + np.int64(data[p]) > end:
            return np.int64(0), p, ST_TRUNCATED
        return np.int64(p), p + 1 + np.int64(data[p]), ST_OK
    if kind == K_BOOL or kind == K_U8 or kind == K_I8:
        if p + 1 > end:
            return np.int64(0), p, ST_TRUNCATED
        v = np.int64(data[p])
        if kind == K_BOOL and v > 1:
            return np.int64(0), p, ST_MALFORMED
        if kind == K_I8 and v > 127:
            v -= 256
        return v, p + 1, ST_OK
    if kind == K_U16 or kind == K_I16:
        if p + 2 > end:
            return np.int64(0), p, ST_TRUNCATED
        v = be2(data, p)
        if kind == K_I16 and v > 32767:
            v -= 65536
        return v, p + 2, ST_OK
    if kind == K_I32:
        if p + 4 > end:
            return np.int64(0), p, ST_TRUNCATED
        v = be4(data, p)
        if v > 2147483647:
            v -= 4294967296
        return v, p + 4, ST_OK
    if kind == K_STR16:
        if p + 2 > end or p + 2 + be2(data, p) > end:
            return np.int64(0), p, ST_TRUNCATED
        return np.int64(p), p + 2 + be2(data, p), ST_OK
    if kind == K_UUID or kind == K_REF:
        size = 16 if (kind == K_UUID or ver == 2) else 8
        if p + size > end:
            return np.int64(0), p, ST_TRUNCATED
        if kind == K_REF and ver == 1 and data[p] >= 0x80:
            return np.int64(0), p, ST_RESERVED  # AM1 reference, bit 63 set
        return np.int64(p), p + size, ST_OK
    if kind == K_SIZED32:
        if p + 4 > end or p + 4 + be4(data, p) > end:
            return np.int64(0), p, ST_TRUNCATED
        return np.int64(p), p + 4 + be4(data, p), ST_OK
    if kind == K_UNSUPPORTED:
        return np.int64(0), p, ST_UNSUPPORTED
    return np.int64(0), p, ST_BAD_TYPE


@nb.njit(cache=True, nogil=True)
def _find_schema(
    data: Any,
    pkg_p: Any,
    pkg_n: Any,
    cls_p: Any,
    cls_n: Any,
    h_hi: np.uint64,
    h_lo: np.uint64,
    hash_hi: Any,
    hash_lo: Any,
    names: Any,
    name_off: Any,
    hint: int,
) -> int:
    """Index of the schema (package, class, hash), or -1; tries ``hint`` first."""
    n = hash_hi.shape[0]
    for i in range(-1, n):
        k = hint if i == -1 else i
        if k < 0 or (i >= 0 and k == hint):
            continue
        if hash_hi[k] != h_hi or hash_lo[k] != h_lo:
            continue
        a = name_off[2 * k]
        b = name_off[2 * k + 1]
        c = name_off[2 * k + 2]
        if b - a != pkg_n or c - b != cls_n:
            continue
        same = True
        for j in range(pkg_n):
            if names[a + j] != data[pkg_p + j]:
                same = False
                break
        if same:
            for j in range(cls_n):
                if names[b + j] != data[cls_p + j]:
                    same = False
                    break
        if same:
            return k
    return -1


@nb.njit(cache=True, nogil=True)
def _grow2(a: Any, need: int) -> Any:
    """Grow a (fields, capacity) matrix along its second axis."""
    cap = a.shape[1]
    while cap < need:
        cap *= 2
    out = np.empty((a.shape[0], cap), dtype=a.dtype)
    out[:, : a.shape[1]] = a
    return out


@nb.njit(cache=True, inline="always")
def _skip_group(
    data: Any,
    p: int,
    end: int,
    e0: int,
    count: int,
    el_kind: Any,
    el_bit: Any,
    run_len: Any,
    run_bytes: Any,
    presence: np.uint64,
    ver: int,
) -> tuple[int, int]:
    """Step over one record's properties or statistics, checking them: (end position, status).

    Runs of plain fixed-size values are skipped in one step (``run_len`` /
    ``run_bytes`` per element, 0 when the element needs a look).
    """
    e = e0
    stop = e0 + count
    while e < stop:
        rl = run_len[e]
        if rl > 0:
            p += run_bytes[e]
            if p > end:
                return p - run_bytes[e], ST_TRUNCATED
            e += rl
            continue
        b = el_bit[e]
        if b >= 0 and (presence >> np.uint64(b)) & np.uint64(1) == 0:
            e += 1
            continue
        _v, q, st = _read_value(data, p, end, el_kind[e], ver)
        if st != ST_OK:
            return p, st
        p = q
        e += 1
    return p, ST_OK


@nb.njit(cache=True, nogil=True)
def fill(data: Any, pos: Any, presence: Any, ver: Any, kinds: Any, bits: Any, u64run: Any) -> Any:
    """Decode one group (properties or statistics) of checked records, column-major.

    ``pos[i]`` is where record i's values start (-1: the record lacks the
    group); returns a (len(kinds), n) int64 slot matrix, so each column is a
    contiguous row. Absent values get 0 (their validity comes from presence).
    ``u64run[j]`` > 0 marks a run of that many mandatory 8-byte values at j.
    """
    data = unowned(data)
    kinds = unowned(kinds)
    bits = unowned(bits)
    u64run = unowned(u64run)
    n = pos.shape[0]
    w = kinds.shape[0]
    out = np.empty((w, n), dtype=np.int64)
    end = data.shape[0]
    for i in range(n):
        p = pos[i]
        if p < 0:
            for j in range(w):
                out[j, i] = 0
            continue
        pres = np.uint64(presence[i])
        vr = ver[i]
        j = 0
        while j < w:
            r = u64run[j]
            if r > 0:  # a run of mandatory 8-byte values: no dispatch
                run = data[p : p + 8 * r].view(np.uint64)  # unaligned loads, then byte swap
                for t in range(r):
                    out[j + t, i] = np.int64(_bswap64(run[t]))
                p += 8 * r
                j += r
                continue
            b = bits[j]
            if b >= 0 and (pres >> np.uint64(b)) & np.uint64(1) == 0:
                out[j, i] = 0
                j += 1
                continue
            v, q, _st = _read_value(data, p, end, kinds[j], vr)
            out[j, i] = v
            p = q
            j += 1
    return out


@nb.njit(cache=True, nogil=True)
def walk(
    data: Any,
    offs: Any,
    hash_hi: Any,
    hash_lo: Any,
    names: Any,
    name_off: Any,
    p_start: Any,
    p_count: Any,
    s_start: Any,
    s_count: Any,
    n_opt: Any,
    el_kind: Any,
    el_bit: Any,
    run_len: Any,
    run_bytes: Any,
) -> tuple[Any, int, Any, Any]:
    """Split every c/i/g record of every message and check its values.

    Returns (records, n_records, status per message, error position per
    message); each record row holds its header fields and the byte positions
    of its property and statistic values, which ``fill`` then decodes into
    columns. A message with any problem is rolled back entirely (none of its
    records stay) and gets a non-zero status.
    """
    data = unowned(data)
    offs = unowned(offs)
    p_start = unowned(p_start)
    p_count = unowned(p_count)
    s_start = unowned(s_start)
    s_count = unowned(s_count)
    n_opt = unowned(n_opt)
    el_kind = unowned(el_kind)
    el_bit = unowned(el_bit)
    run_len = unowned(run_len)
    run_bytes = unowned(run_bytes)
    hash_hi = unowned(hash_hi)
    hash_lo = unowned(hash_lo)
    names = unowned(names)
    name_off = unowned(name_off)
    n_msgs = offs.shape[0] - 1
    total = offs[n_msgs] - offs[0]
    rec = np.empty((N_RFIELDS, max(16, total // 200)), dtype=np.int64)
    status = np.zeros(n_msgs, dtype=np.uint8)
    errpos = np.zeros(n_msgs, dtype=np.int64)
    nrec = 0
    hint = -1
    for m in range(n_msgs):
        start = offs[m]
        end = offs[m + 1]
        r0 = nrec
        st = ST_OK
        pos = start
        ridx = 0
        if end - start < 8:
            st = ST_NOT_V1
        while pos < end and st == ST_OK:
            if end - pos < 8:
                st = ST_TRUNCATED
                break
            if data[pos] != 0x41 or data[pos + 1] != 0x4D:
                st = ST_NOT_V1 if pos == start else ST_TRUNCATED
                break
            vb = data[pos + 2]
            if vb == 0x31:
                ver = 1
            elif vb == 0x32:
                ver = 2
            else:
                st = ST_NOT_V1
                break
            op = data[pos + 3]
            if op != OP_C and op != OP_I and op != OP_G:
                st = ST_NOT_CONTENT
                break
            seq = be4(data, pos + 4)
            p = pos + 8
            if p + 1 > end:
                st = ST_TRUNCATED
                break
            pkg_n = np.int64(data[p])
            pkg_p = p + 1
            p = pkg_p + pkg_n
            if p + 1 > end:
                st = ST_TRUNCATED
                break
            cls_n = np.int64(data[p])
            cls_p = p + 1
            p = cls_p + cls_n
            oid_n = 8 if ver == 1 else 16
            if p + 16 + 24 + oid_n > end:
                st = ST_TRUNCATED
                break
            h_hi = np.uint64(be8(data, p))
            h_lo = np.uint64(be8(data, p + 8))
            k = _find_schema(
                data,
                pkg_p,
                pkg_n,
                cls_p,
                cls_n,
                h_hi,
                h_lo,
                hash_hi,
                hash_lo,
                names,
                name_off,
                hint,
            )
            if k < 0:
                st = ST_UNKNOWN_SCHEMA
                break
            hint = k
            p += 16
            upd = be8(data, p)
            cre = be8(data, p + 8)
            dele = be8(data, p + 16)
            p += 24
            oid_hi = be8(data, p)
            if ver == 1 and oid_hi < 0:
                st = ST_RESERVED  # AM1 id, bit 63 set: the per-record path reports it
                break
            oid_lo = np.int64(0)
            if ver == 2:
                oid_lo = be8(data, p + 8)
            p += oid_n
            presence = np.uint64(0)
            if op != OP_I:  # 'i' carries no presence octets (AM2 notes; the codec agrees for AM1)
                nb_opt = n_opt[k]
                no = (nb_opt + 7) // 8
                if no > 8:
                    st = ST_UNSUPPORTED
                    break
                if p + no > end:
                    st = ST_TRUNCATED
                    break
                for j in range(no):
                    presence |= np.uint64(data[p + j]) << np.uint64(8 * j)
                if nb_opt < 64 and (presence >> np.uint64(nb_opt)) != np.uint64(0):
                    st = ST_MALFORMED  # bits beyond the optional properties
                    break
                p += no
            poff = -1
            soff = -1
            if op != OP_I:
                poff = p
                p, st = _skip_group(data, p, end, p_start[k], p_count[k], el_kind, el_bit, run_len, run_bytes, presence, ver)  # fmt: skip
                if st != ST_OK:
                    break
            if op != OP_C:
                soff = p
                p, st = _skip_group(data, p, end, s_start[k], s_count[k], el_kind, el_bit, run_len, run_bytes, presence, ver)  # fmt: skip
                if st != ST_OK:
                    break
            if nrec >= rec.shape[1]:
                rec = _grow2(rec, nrec + 1)
            rec[R_MSG, nrec] = m
            rec[R_IDX, nrec] = ridx
            rec[R_SCHEMA, nrec] = k
            rec[R_OP, nrec] = op
            rec[R_SEQ, nrec] = seq
            rec[R_VER, nrec] = ver
            rec[R_UPDATE, nrec] = upd
            rec[R_CREATE, nrec] = cre
            rec[R_DELETE, nrec] = dele
            rec[R_OID_HI, nrec] = oid_hi
            rec[R_OID_LO, nrec] = oid_lo
            rec[R_PRESENCE, nrec] = np.int64(presence)
            rec[R_POFF, nrec] = poff
            rec[R_SOFF, nrec] = soff
            nrec += 1
            ridx += 1
            pos = p
        if st != ST_OK:
            nrec = r0
            status[m] = st
            errpos[m] = pos - start
    return rec, nrec, status, errpos


# --------------------------------------------------------------------------
# Column builders: one element of one class, gathered over its records.


@nb.njit(cache=True, nogil=True)
def validity(base: Any, presence: Any, bit: int, out: Any) -> int:
    """Presence of one element per record; returns the null count."""
    nulls = 0
    for i in range(base.shape[0]):
        ok = base[i] >= 0
        if ok and bit >= 0:
            ok = (np.uint64(presence[i]) >> np.uint64(bit)) & np.uint64(1) == 1
        out[i] = ok
        if not ok:
            nulls += 1
    return nulls


@nb.njit(cache=True, nogil=True)
def string_column(data: Any, pos: Any, valid: Any, wide: bool) -> tuple[Any, Any]:
    """(int32 offsets, bytes) of str8 (or str16 when ``wide``) values at ``pos``."""
    n = pos.shape[0]
    offsets = np.empty(n + 1, dtype=np.int32)
    offsets[0] = 0
    total = 0
    for i in range(n):
        if valid[i]:
            p = pos[i]
            ln: Any = (
                (np.int64(data[p]) << 8 | np.int64(data[p + 1])) if wide else np.int64(data[p])
            )
            total += ln
        offsets[i + 1] = total
    buf = np.empty(total, dtype=np.uint8)
    hdr = 2 if wide else 1
    for i in range(n):
        if valid[i]:
            a = offsets[i]
            ln = offsets[i + 1] - a
            p = pos[i] + hdr
            for k in range(ln):
                buf[a + k] = data[p + k]
    return offsets, buf


_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8).copy()


@nb.njit(cache=True, inline="always")
def write_uuid(buf: Any, o: int, data: Any, p: int, hexd: Any) -> int:
    """Canonical 8-4-4-4-12 text of the 16 bytes at p, written at buf[o:]; returns o + 36."""
    w = 0
    for k in range(16):
        if k == 4 or k == 6 or k == 8 or k == 10:
            buf[o + w] = 0x2D
            w += 1
        b = data[p + k]
        buf[o + w] = hexd[b >> 4]
        buf[o + w + 1] = hexd[b & 15]
        w += 2
    return o + 36


@nb.njit(cache=True, nogil=True)
def uuid_column(data: Any, pos: Any, valid: Any, hexd: Any) -> tuple[Any, Any]:
    """Canonical 8-4-4-4-12 text of 16-byte uuids at ``pos``."""
    n = pos.shape[0]
    offsets = np.empty(n + 1, dtype=np.int32)
    offsets[0] = 0
    total = 0
    for i in range(n):
        if valid[i]:
            total += 36
        offsets[i + 1] = total
    buf = np.empty(total, dtype=np.uint8)
    for i in range(n):
        if valid[i]:
            write_uuid(buf, offsets[i], data, pos[i], hexd)
    return offsets, buf


@nb.njit(cache=True, inline="always")
def _put_dec(buf: Any, w: int, v: np.uint64) -> int:
    """Write v in decimal at buf[w:], return the new write position (no temporaries)."""
    n = 1
    t = v // np.uint64(10)
    while t > np.uint64(0):
        n += 1
        t //= np.uint64(10)
    for k in range(n - 1, -1, -1):
        buf[w + k] = np.uint8(0x30 + np.uint8(v % np.uint64(10)))
        v //= np.uint64(10)
    return w + n


@nb.njit(cache=True, inline="always")
def _write_ref(buf: Any, w: int, data: Any, p: int, ver: int) -> int:
    """Text of the object reference at p (``str`` of the codec's object id) at buf[w:].

    AM2: ``flags-epoch-brokerbank-agentbank-object``; AM1: ``bootseq-bank-object``.
    At most 64 bytes; returns the new write position.
    """
    hi = _be(data, p, 8)
    if ver == 2:
        w = _put_dec(buf, w, hi >> np.uint64(60))
        buf[w] = 0x2D
        w = _put_dec(buf, w + 1, (hi >> np.uint64(48)) & np.uint64(0xFFF))
        buf[w] = 0x2D
        w = _put_dec(buf, w + 1, (hi >> np.uint64(28)) & np.uint64(0xFFFFF))
        buf[w] = 0x2D
        w = _put_dec(buf, w + 1, hi & np.uint64(0xFFFFFFF))
        buf[w] = 0x2D
        return _put_dec(buf, w + 1, _be(data, p + 8, 8))
    w = _put_dec(buf, w, (hi >> np.uint64(48)) & np.uint64(0x7FFF))
    buf[w] = 0x2D
    w = _put_dec(buf, w + 1, (hi >> np.uint64(24)) & np.uint64(0xFFFFFF))
    buf[w] = 0x2D
    return _put_dec(buf, w + 1, hi & np.uint64(0xFFFFFF))


@nb.njit(cache=True, nogil=True)
def objref_column(data: Any, pos: Any, valid: Any, ver: Any) -> tuple[Any, Any]:
    """Text form of object references (``_write_ref``), one per record."""
    n = pos.shape[0]
    offsets = np.empty(n + 1, dtype=np.int32)
    buf = np.empty(n * 64, dtype=np.uint8)
    offsets[0] = 0
    w = 0
    for i in range(n):
        if valid[i]:
            w = _write_ref(buf, w, data, pos[i], ver[i])
        offsets[i + 1] = w
    return offsets, buf[:w].copy()


@nb.njit(cache=True, nogil=True)
def container_sizes(data: Any, pos: Any, valid: Any, out: Any) -> None:
    """Encoded size (u32 size field + 4) of the map/list at pos[i]; 0 when empty or absent.

    An empty 0-10 map or list is exactly ``size=4, count=0``; anything else
    (entries, or size fields that disagree) is left to the codec's decoder.
    """
    for i in range(pos.shape[0]):
        out[i] = 0
        if valid[i]:
            p = pos[i]
            size = be4(data, p)
            if not (size == 4 and be4(data, p + 4) == 0):
                out[i] = size + 4


@nb.njit(cache=True, nogil=True)
def group_records(rec: Any, n_schemas: int) -> tuple[Any, Any]:
    """Records grouped by class, stably, in one pass: (flat int64 buffer, group starts).

    Class ``k``'s records ``starts[k]:starts[k + 1]`` (in their input order)
    occupy ``flat[F * starts[k] : F * starts[k + 1]]`` as a C-contiguous
    (F, count) matrix, F being the number of record fields.
    """
    nf = rec.shape[0]
    n = rec.shape[1]
    counts = np.zeros(n_schemas + 1, dtype=np.int64)
    for i in range(n):
        counts[rec[R_SCHEMA, i] + 1] += 1
    starts = np.cumsum(counts)
    fill_at = starts[:-1].copy()
    flat = np.empty(nf * n, dtype=np.int64)
    for i in range(n):
        k = rec[R_SCHEMA, i]
        j = fill_at[k] - starts[k]
        fill_at[k] += 1
        base = nf * starts[k]
        cnt = starts[k + 1] - starts[k]
        for f in range(nf):
            flat[base + f * cnt + j] = rec[f, i]
    return flat, starts


@nb.njit(cache=True, nogil=True)
def container_hashes(data: Any, pos: Any, sizes: Any, todo: Any) -> Any:
    """64-bit FNV-1a hash of the encoded bytes of each container ``todo[k]`` (for dedup)."""
    out = np.empty(todo.shape[0], dtype=np.uint64)
    prime = np.uint64(0x100000001B3)
    for k in range(todo.shape[0]):
        i = todo[k]
        p = pos[i]
        h = np.uint64(0xCBF29CE484222325) ^ np.uint64(sizes[i])
        for j in range(sizes[i]):
            h = (h ^ np.uint64(data[p + j])) * prime
        out[k] = h
    return out


@nb.njit(cache=True, nogil=True)
def same_bytes(data: Any, pos: Any, sizes: Any, todo: Any, rep: Any, inv: Any) -> bool:
    """True when every container ``todo[k]`` has exactly the bytes of ``todo[rep[inv[k]]]``."""
    for k in range(todo.shape[0]):
        i = todo[k]
        r = todo[rep[inv[k]]]
        if i == r:
            continue
        n = sizes[i]
        if sizes[r] != n:
            return False
        a = pos[i]
        b = pos[r]
        for j in range(n):
            if data[a + j] != data[b + j]:
                return False
    return True


@nb.njit(cache=True, nogil=True)
def container_column(
    valid: Any, rank: Any, tx_off: Any, tx_buf: Any, empty: Any
) -> tuple[Any, Any]:
    """(int32 offsets, bytes) of a JSON text column: ``empty`` text, or text ``rank[i]``."""
    n = valid.shape[0]
    offsets = np.empty(n + 1, dtype=np.int32)
    offsets[0] = 0
    total = 0
    for i in range(n):
        if valid[i]:
            r = rank[i]
            total += (tx_off[r + 1] - tx_off[r]) if r >= 0 else empty.shape[0]
        offsets[i + 1] = total
    buf = np.empty(total, dtype=np.uint8)
    for i in range(n):
        if valid[i]:
            o = offsets[i]
            r = rank[i]
            if r >= 0:
                a = tx_off[r]
                for k in range(tx_off[r + 1] - a):
                    buf[o + k] = tx_buf[a + k]
            else:
                for k in range(empty.shape[0]):
                    buf[o + k] = empty[k]
    return offsets, buf


def hex_digits() -> npt.NDArray[np.uint8]:
    """The lowercase hex digit table for ``uuid_column``."""
    return _HEX


@nb.njit(cache=True, nogil=True)
def repeat_bytes(value: Any, n: int) -> tuple[Any, Any]:
    """(int32 offsets, bytes) of ``n`` copies of one string."""
    m = value.shape[0]
    out_off = np.empty(n + 1, dtype=np.int32)
    buf = np.empty(n * m, dtype=np.uint8)
    for i in range(n + 1):
        out_off[i] = i * m
    for i in range(n):
        for j in range(m):
            buf[i * m + j] = value[j]
    return out_off, buf


# --------------------------------------------------------------------------
# The compact layout in one pass over records of any classes (no per-class work).


@nb.njit(cache=True, nogil=True)
def compact_lists(
    data: Any,
    rec: Any,
    p_start: Any,
    p_count: Any,
    s_start: Any,
    s_count: Any,
    el_kind: Any,
    el_bit: Any,
    u64run: Any,
    el_slot: Any,
    el_type: Any,
    n_slots: Any,
) -> tuple[Any, ...]:
    """Every element value of checked records of any classes, into the three typed lists.

    Record i's values go, in schema order (properties, then statistics), to
    the list of their slot kind (``el_slot``: 0 ints, 1 floats, 2 texts).
    Returns the list offsets (3, n + 1) and per list its slots and validity;
    floats also say which hold float32 bits, texts their type code and the
    record's dialect (for ``text_values``). Absent values (no such group in
    the record, or an optional property left out) get slot 0, valid False.
    """
    data = unowned(data)
    el_kind = unowned(el_kind)
    el_bit = unowned(el_bit)
    u64run = unowned(u64run)
    el_slot = unowned(el_slot)
    el_type = unowned(el_type)
    n = rec.shape[1]
    off = np.empty((3, n + 1), dtype=np.int32)
    off[:, 0] = 0
    for i in range(n):
        k = rec[R_SCHEMA, i]
        for s in range(3):
            off[s, i + 1] = off[s, i] + n_slots[k, s]
    ints = np.empty(off[0, n], dtype=np.int64)
    i_ok = np.empty(off[0, n], dtype=np.bool_)
    flts = np.empty(off[1, n], dtype=np.int64)
    f_ok = np.empty(off[1, n], dtype=np.bool_)
    f32 = np.empty(off[1, n], dtype=np.bool_)
    tpos = np.empty(off[2, n], dtype=np.int64)
    t_ok = np.empty(off[2, n], dtype=np.bool_)
    ttype = np.empty(off[2, n], dtype=np.int64)
    tver = np.empty(off[2, n], dtype=np.int64)
    end = data.shape[0]
    for i in range(n):
        k = rec[R_SCHEMA, i]
        pres = np.uint64(rec[R_PRESENCE, i])
        vr = rec[R_VER, i]
        a = off[0, i]
        b = off[1, i]
        c = off[2, i]
        for g in range(2):
            p = rec[R_POFF, i] if g == 0 else rec[R_SOFF, i]
            e0 = p_start[k] if g == 0 else s_start[k]
            cnt = p_count[k] if g == 0 else s_count[k]
            j = 0
            while j < cnt:
                e = e0 + j
                r = u64run[e] if p >= 0 else 0
                if r > 0:  # mandatory 8-byte values in a row: one view, no dispatch
                    run = data[p : p + 8 * r].view(np.uint64)
                    for t in range(r):
                        v = np.int64(_bswap64(run[t]))
                        s = el_slot[e + t]
                        if s == 0:
                            ints[a] = v
                            i_ok[a] = True
                            a += 1
                        else:  # 8-byte values are integers, times or doubles
                            flts[b] = v
                            f_ok[b] = True
                            f32[b] = False
                            b += 1
                    p += 8 * r
                    j += r
                    continue
                v = np.int64(0)
                ok = False
                if p >= 0:
                    bit = el_bit[e]
                    if bit < 0 or (pres >> np.uint64(bit)) & np.uint64(1) == 1:
                        v, p, _st = _read_value(data, p, end, el_kind[e], vr)
                        ok = True
                s = el_slot[e]
                if s == 0:
                    ints[a] = v
                    i_ok[a] = ok
                    a += 1
                elif s == 1:
                    flts[b] = v
                    f_ok[b] = ok
                    f32[b] = el_type[e] == 12
                    b += 1
                else:
                    tpos[c] = v
                    t_ok[c] = ok
                    ttype[c] = el_type[e]
                    tver[c] = vr
                    c += 1
                j += 1
    return off, ints, i_ok, flts, f_ok, f32, tpos, t_ok, ttype, tver


@nb.njit(cache=True, nogil=True)
def text_values(
    data: Any,
    pos: Any,
    valid: Any,
    types: Any,
    ver: Any,
    hexd: Any,
    cidx: Any,
    c_off: Any,
    c_buf: Any,
) -> tuple[Any, Any]:
    """(int32 offsets, bytes) of text values of mixed QMF types, one per slot.

    str8/str16 (6, 7) are copied, uuids (14) and references (10) formatted;
    containers (15, 21, 22) take text ``cidx[i]`` of (``c_off``, ``c_buf``),
    their JSON made beforehand, or ``{}`` / ``[]`` where ``cidx[i]`` is -1.
    """
    data = unowned(data)
    pos = unowned(pos)
    valid = unowned(valid)
    types = unowned(types)
    ver = unowned(ver)
    hexd = unowned(hexd)
    cidx = unowned(cidx)
    c_off = unowned(c_off)
    c_buf = unowned(c_buf)
    n = pos.shape[0]
    cap: Any = 0
    for i in range(n):
        if valid[i]:
            t = types[i]
            p = pos[i]
            if t == 6:
                cap += np.int64(data[p])
            elif t == 7:
                cap += be2(data, p)
            elif t == 14:
                cap += 36
            elif t == 10:
                cap += 64
            else:
                c = cidx[i]
                cap += c_off[c + 1] - c_off[c] if c >= 0 else 2
    buf = np.empty(cap, dtype=np.uint8)
    offsets = np.empty(n + 1, dtype=np.int32)
    offsets[0] = 0
    w: Any = 0
    for i in range(n):
        if valid[i]:
            t = types[i]
            p = pos[i]
            if t == 6 or t == 7:
                ln = np.int64(data[p]) if t == 6 else be2(data, p)
                p += 1 if t == 6 else 2
                buf[w : w + ln] = data[p : p + ln]
                w += ln
            elif t == 14:
                w = write_uuid(buf, w, data, p, hexd)
            elif t == 10:
                w = _write_ref(buf, w, data, p, ver[i])
            else:
                c = cidx[i]
                if c >= 0:
                    ln = c_off[c + 1] - c_off[c]
                    buf[w : w + ln] = c_buf[c_off[c] : c_off[c + 1]]
                    w += ln
                else:  # empty: {} or []
                    buf[w] = 0x7B if t == 15 else 0x5B
                    buf[w + 1] = 0x7D if t == 15 else 0x5D
                    w += 2
        offsets[i + 1] = w
    return offsets, buf[:w]


@nb.njit(cache=True, nogil=True)
def index_keys(
    schema_of: Any,
    text_start: Any,
    t_off: Any,
    t_buf: Any,
    t_valid: Any,
    ix_off: Any,
    ix_text: Any,
) -> tuple[Any, Any, Any, Any]:
    """Index keys of records of any classes: JSON arrays of their index texts.

    Schema k's index properties are ``ix_text[ix_off[k]:ix_off[k + 1]]``, each
    the property's position in the record's text list (-1: not a text).
    Record i's texts start at ``text_start[i]`` in (``t_off``, ``t_buf``).
    Returns (offsets, bytes, valid, slow): null where the class has no index
    or a value is absent; ``slow`` where the key needs Python (a numeric index
    property). Quotes, backslashes and control characters are escaped as
    ``json.dumps(..., ensure_ascii=False)`` does (QMF v2 references are JSON text).
    """
    schema_of = unowned(schema_of)
    text_start = unowned(text_start)
    t_off = unowned(t_off)
    t_buf = unowned(t_buf)
    t_valid = unowned(t_valid)
    ix_off = unowned(ix_off)
    ix_text = unowned(ix_text)
    n = schema_of.shape[0]
    cap = 0
    for i in range(n):
        k = schema_of[i]
        cap += 2
        for x in range(ix_off[k], ix_off[k + 1]):
            s = ix_text[x]
            if s >= 0:
                e = text_start[i] + s
                cap += 6 * (t_off[e + 1] - t_off[e]) + 3  # every byte escaped at worst
    buf = np.empty(cap, dtype=np.uint8)
    offsets = np.empty(n + 1, dtype=np.int32)
    ok = np.zeros(n, dtype=np.bool_)
    slow = np.zeros(n, dtype=np.bool_)
    offsets[0] = 0
    w = 0
    for i in range(n):
        k = schema_of[i]
        a = ix_off[k]
        b = ix_off[k + 1]
        good = b > a
        for x in range(a, b):
            s = ix_text[x]
            if s < 0:
                slow[i] = True
                good = False
                break
            if not t_valid[text_start[i] + s]:
                good = False
                break
        if good:
            buf[w] = 0x5B  # [
            w += 1
            for x in range(a, b):
                if x > a:
                    buf[w] = 0x2C  # ,
                    w += 1
                buf[w] = 0x22  # "
                w += 1
                e = text_start[i] + ix_text[x]
                for c in range(t_off[e], t_off[e + 1]):
                    ch = t_buf[c]
                    if ch >= 0x20 and ch != 0x22 and ch != 0x5C:
                        buf[w] = ch
                        w += 1
                        continue
                    buf[w] = 0x5C  # backslash
                    if ch == 0x22 or ch == 0x5C:
                        buf[w + 1] = ch
                    elif ch == 0x0A:
                        buf[w + 1] = 0x6E  # n
                    elif ch == 0x0D:
                        buf[w + 1] = 0x72  # r
                    elif ch == 0x09:
                        buf[w + 1] = 0x74  # t
                    elif ch == 0x08:
                        buf[w + 1] = 0x62  # b
                    elif ch == 0x0C:
                        buf[w + 1] = 0x66  # f
                    else:  # \u00XX, lowercase hex like json.dumps
                        buf[w + 1] = 0x75
                        buf[w + 2] = 0x30
                        buf[w + 3] = 0x30
                        buf[w + 4] = 0x30 + (ch >> 4)
                        lo = ch & 15
                        buf[w + 5] = (0x30 + lo) if lo < 10 else (0x57 + lo)
                        w += 4
                    w += 2
                buf[w] = 0x22
                w += 1
            buf[w] = 0x5D  # ]
            w += 1
        ok[i] = good
        offsets[i + 1] = w
    return offsets, buf[:w], ok, slow


@nb.njit(cache=True, nogil=True)
def unique_hashes(hashes: Any) -> tuple[Any, Any]:
    """(first index of each distinct hash, group of each hash): ``np.unique``'s
    ``return_index`` / ``return_inverse``, groups in sorted hash order."""
    n = hashes.shape[0]
    order = np.argsort(hashes, kind="mergesort")  # stable: the first index leads its group
    inv = np.empty(n, dtype=np.int64)
    rep = np.empty(n, dtype=np.int64)
    g = -1
    for j in range(n):
        i = order[j]
        if j == 0 or hashes[i] != hashes[order[j - 1]]:
            g += 1
            rep[g] = i
        inv[i] = g
    return rep[: g + 1], inv


@nb.njit(cache=True, nogil=True)
def id_fields(rec: Any) -> tuple[Any, ...]:
    """The decomposed object ids of records, in one pass.

    Returns record index (int32), AM1 boot sequence and bank (int32), AM2
    flags (int8), epoch (int64), broker bank and agent bank (int32), object
    number (int64; AM1: the id's low 24 bits), how many records are AM1, the
    opcodes as bytes, and (offsets, bytes) of the AM2 agent text
    ``<broker_bank>.<agent_bank>`` (meaningless for AM1 records): one call
    instead of three, a fixed cost that counts in small batches.
    """
    n = rec.shape[1]
    idx = np.empty(n, dtype=np.int32)
    boot = np.empty(n, dtype=np.int32)
    bank = np.empty(n, dtype=np.int32)
    flags = np.empty(n, dtype=np.int8)
    epoch = np.empty(n, dtype=np.int64)
    bb = np.empty(n, dtype=np.int32)
    ab = np.empty(n, dtype=np.int32)
    obj = np.empty(n, dtype=np.int64)
    ops = np.empty(n, dtype=np.uint8)
    a_off = np.empty(n + 1, dtype=np.int32)
    a_buf = np.empty(n * 20, dtype=np.uint8)
    a_off[0] = 0
    w = 0
    n_am1 = 0
    for i in range(n):
        hi = np.uint64(rec[R_OID_HI, i])
        ops[i] = np.uint8(rec[R_OP, i])
        w = _put_dec(a_buf, w, (hi >> np.uint64(28)) & np.uint64(0xFFFFF))
        a_buf[w] = 0x2E
        w = _put_dec(a_buf, w + 1, hi & np.uint64(0xFFFFFFF))
        a_off[i + 1] = w
        idx[i] = rec[R_IDX, i]
        boot[i] = np.int32((hi >> np.uint64(48)) & np.uint64(0x7FFF))
        bank[i] = np.int32((hi >> np.uint64(24)) & np.uint64(0xFFFFFF))
        flags[i] = np.int8(hi >> np.uint64(60))
        epoch[i] = np.int64((hi >> np.uint64(48)) & np.uint64(0xFFF))
        bb[i] = np.int32((hi >> np.uint64(28)) & np.uint64(0xFFFFF))
        ab[i] = np.int32(hi & np.uint64(0xFFFFFFF))
        if rec[R_VER, i] == 1:
            n_am1 += 1
            obj[i] = np.int64(hi & np.uint64(0xFFFFFF))
        else:
            obj[i] = rec[R_OID_LO, i]
    return idx, boot, bank, flags, epoch, bb, ab, obj, n_am1, ops, a_off, a_buf[:w]


@nb.njit(cache=True, nogil=True)
def container_groups(data: Any, pos: Any, valid: Any, types: Any) -> tuple[Any, Any, Any, Any, Any]:
    """The non-empty maps, lists and arrays among text slots, grouped by encoding.

    Returns (slots, encoded sizes, group representatives as positions in
    ``slots``, group of each, and per text slot its group or -1): one decode
    per distinct (type, bytes). Empty
    ones (``size=4, count=0``) are left out: ``text_values`` writes them.
    Groups come from a 64-bit hash and are then checked byte for byte; on a
    collision every value is its own group.
    """
    data = unowned(data)
    pos = unowned(pos)
    valid = unowned(valid)
    types = unowned(types)
    n = pos.shape[0]
    todo = np.empty(n, dtype=np.int64)
    sizes = np.empty(n, dtype=np.int64)
    hashes = np.empty(n, dtype=np.uint64)
    prime = np.uint64(0x100000001B3)
    m = 0
    for i in range(n):
        t = types[i]
        if not valid[i] or not (t == 15 or t == 21 or t == 22):
            continue
        p = pos[i]
        size = be4(data, p)
        if size == 4 and be4(data, p + 4) == 0:
            continue
        todo[m] = i
        sizes[m] = size + 4
        h = (np.uint64(0xCBF29CE484222325) ^ np.uint64(size + 4)) * prime
        h = (h ^ np.uint64(t)) * prime
        for j in range(size + 4):
            h = (h ^ np.uint64(data[p + j])) * prime
        hashes[m] = h
        m += 1
    todo = todo[:m]
    sizes = sizes[:m]
    rep, inv = unique_hashes(hashes[:m])
    for k in range(m):
        r = rep[inv[k]]
        if r == k:
            continue
        a = pos[todo[k]]
        b = pos[todo[r]]
        same = sizes[k] == sizes[r] and types[todo[k]] == types[todo[r]]
        if same:
            for j in range(sizes[k]):
                if data[a + j] != data[b + j]:
                    same = False
                    break
        if not same:
            rep = np.arange(m)
            inv = np.arange(m)
            break
    cidx = np.full(n, -1, dtype=np.int64)
    for k in range(m):
        cidx[todo[k]] = inv[k]
    return todo, sizes, rep, inv, cidx


@nb.njit(cache=True, nogil=True)
def non_ascii(buf: Any) -> bool:
    """True when a byte is >= 0x80 (only then can text be invalid UTF-8)."""
    for i in range(buf.shape[0]):
        if buf[i] >= 0x80:
            return True
    return False
