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

from typing import Any

import numba as nb
import numpy as np
import numpy.typing as npt

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

STATUS_NAMES = (
    "ok",
    "not AM1/AM2",
    "non-content record",
    "unknown schema",
    "truncated",
    "unsupported type",
    "unknown type code",
    "malformed value",
)

# Columns of the per-record matrix returned by ``walk``.
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

# Fixed encoded sizes by type code; 0 = variable / special, -1 = unknown.
# Index 10 (objId) is 8 in AM1 and 16 in AM2, handled in code.
_FIXED = np.array(
    [-1, 1, 2, 4, 8, -1, 0, 0, 8, 8, 0, 1, 4, 8, 16, 0, 1, 2, 4, 8, -2, 0, 0],
    dtype=np.int64,
)


@nb.njit(cache=True, inline="always")
def _be(data: Any, p: int, n: int) -> np.uint64:
    v = np.uint64(0)
    for k in range(n):
        v = (v << np.uint64(8)) | np.uint64(data[p + k])
    return v


@nb.njit(cache=True, inline="always")
def _sext(v: np.uint64, n: int) -> np.int64:
    """Sign-extend an n-byte big-endian integer held in a uint64."""
    if n == 8:
        return np.int64(v)
    bits = np.uint64(8 * n)
    sign = np.uint64(1) << (bits - np.uint64(1))
    if v & sign:
        return np.int64(v) - (np.int64(1) << np.int64(8 * n))
    return np.int64(v)


@nb.njit(cache=True)
def _read_value(data: Any, p: int, end: int, t: int, ver: int) -> tuple[int, int, int]:
    """Decode one value at p: (slot, next position, status)."""
    if t < 0 or t >= 23:
        return 0, p, ST_BAD_TYPE
    size = _FIXED[t]
    if t == 10:
        size = 8 if ver == 1 else 16
    if size > 0:
        if p + size > end:
            return 0, p, ST_TRUNCATED
        if t == 14 or t == 10:
            return p, p + size, ST_OK
        raw = _be(data, p, size)
        if t == 11 and raw > np.uint64(1):
            return 0, p, ST_MALFORMED
        if t >= 16 and t <= 19:
            return _sext(raw, size), p + size, ST_OK
        return np.int64(raw), p + size, ST_OK
    if size == -1:
        return 0, p, ST_BAD_TYPE
    if size == -2:
        return 0, p, ST_UNSUPPORTED
    # variable length
    if t == 6:
        if p + 1 > end:
            return 0, p, ST_TRUNCATED
        q = p + 1 + data[p]
    elif t == 7:
        if p + 2 > end:
            return 0, p, ST_TRUNCATED
        q = p + 2 + (np.int64(data[p]) << 8 | np.int64(data[p + 1]))
    else:  # 15 map, 21 list, 22 array: u32 byte size first
        if p + 4 > end:
            return 0, p, ST_TRUNCATED
        q = p + 4 + np.int64(_be(data, p, 4))
    if q > end:
        return 0, p, ST_TRUNCATED
    return p, q, ST_OK


@nb.njit(cache=True)
def _find_schema(
    data: Any,
    pkg_p: int,
    pkg_n: int,
    cls_p: int,
    cls_n: int,
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


@nb.njit(cache=True)
def _grow2(a: Any, need: int) -> Any:
    cap = a.shape[0]
    while cap < need:
        cap *= 2
    out = np.empty((cap, a.shape[1]), dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


@nb.njit(cache=True)
def _grow1(a: Any, need: int) -> Any:
    cap = a.shape[0]
    while cap < need:
        cap *= 2
    out = np.empty(cap, dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


@nb.njit(cache=True)
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
    n_octets: Any,
    el_type: Any,
    el_bit: Any,
    am1_i_presence: bool,
) -> tuple[Any, int, Any, int, Any, Any]:
    """Split and decode every c/i/g record of every message.

    Returns (records, n_records, slots, n_slots, status per message, error
    position per message). A message with any problem is rolled back
    entirely (none of its records stay) and gets a non-zero status.
    """
    n_msgs = offs.shape[0] - 1
    total = offs[n_msgs] - offs[0]
    rec = np.empty((max(16, total // 200), N_RFIELDS), dtype=np.int64)
    vals = np.empty(max(64, total // 6), dtype=np.int64)
    status = np.zeros(n_msgs, dtype=np.uint8)
    errpos = np.zeros(n_msgs, dtype=np.int64)
    nrec = 0
    nv = 0
    hint = -1
    for m in range(n_msgs):
        start = offs[m]
        end = offs[m + 1]
        r0 = nrec
        v0 = nv
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
            seq = np.int64(_be(data, pos + 4, 4))
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
            h_hi = _be(data, p, 8)
            h_lo = _be(data, p + 8, 8)
            k = _find_schema(
                data, pkg_p, pkg_n, cls_p, cls_n, h_hi, h_lo, hash_hi, hash_lo, names, name_off, hint
            )
            if k < 0:
                st = ST_UNKNOWN_SCHEMA
                break
            hint = k
            p += 16
            upd = np.int64(_be(data, p, 8))
            cre = np.int64(_be(data, p + 8, 8))
            dele = np.int64(_be(data, p + 16, 8))
            p += 24
            oid_hi = np.int64(_be(data, p, 8))
            oid_lo = np.int64(0)
            if ver == 2:
                oid_lo = np.int64(_be(data, p + 8, 8))
            p += oid_n
            presence = np.uint64(0)
            if op != OP_I or (ver == 1 and am1_i_presence):
                no = n_octets[k]
                if no > 8:
                    st = ST_UNSUPPORTED
                    break
                if p + no > end:
                    st = ST_TRUNCATED
                    break
                for j in range(no):
                    presence |= np.uint64(data[p + j]) << np.uint64(8 * j)
                p += no
            need = nv + p_count[k] + s_count[k]
            if need > vals.shape[0]:
                vals = _grow1(vals, need)
            poff = -1
            soff = -1
            if op != OP_I:
                poff = nv
                e0 = p_start[k]
                for e in range(e0, e0 + p_count[k]):
                    b = el_bit[e]
                    if b >= 0 and (presence >> np.uint64(b)) & np.uint64(1) == 0:
                        vals[nv] = 0
                        nv += 1
                        continue
                    v, q, s = _read_value(data, p, end, el_type[e], ver)
                    if s != ST_OK:
                        st = s
                        break
                    vals[nv] = v
                    nv += 1
                    p = q
                if st != ST_OK:
                    break
            if op != OP_C:
                soff = nv
                e0 = s_start[k]
                for e in range(e0, e0 + s_count[k]):
                    v, q, s = _read_value(data, p, end, el_type[e], ver)
                    if s != ST_OK:
                        st = s
                        break
                    vals[nv] = v
                    nv += 1
                    p = q
                if st != ST_OK:
                    break
            if nrec >= rec.shape[0]:
                rec = _grow2(rec, nrec + 1)
            r = rec[nrec]
            r[R_MSG] = m
            r[R_IDX] = ridx
            r[R_SCHEMA] = k
            r[R_OP] = op
            r[R_SEQ] = seq
            r[R_VER] = ver
            r[R_UPDATE] = upd
            r[R_CREATE] = cre
            r[R_DELETE] = dele
            r[R_OID_HI] = oid_hi
            r[R_OID_LO] = oid_lo
            r[R_PRESENCE] = np.int64(presence)
            r[R_POFF] = poff
            r[R_SOFF] = soff
            nrec += 1
            ridx += 1
            pos = p
        if st != ST_OK:
            nrec = r0
            nv = v0
            status[m] = st
            errpos[m] = pos - start
    return rec, nrec, vals, nv, status, errpos


# --------------------------------------------------------------------------
# Column builders: one element of one class, gathered over its records.


@nb.njit(cache=True)
def gather_slots(vals: Any, base: Any, j: int, out: Any) -> None:
    """out[i] = vals[base[i] + j] where base[i] >= 0, else 0."""
    for i in range(base.shape[0]):
        b = base[i]
        out[i] = vals[b + j] if b >= 0 else 0


@nb.njit(cache=True)
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


@nb.njit(cache=True)
def string_column(data: Any, pos: Any, valid: Any, wide: bool) -> tuple[Any, Any]:
    """(int32 offsets, bytes) of str8 (or str16 when ``wide``) values at ``pos``."""
    n = pos.shape[0]
    offsets = np.empty(n + 1, dtype=np.int32)
    offsets[0] = 0
    total = 0
    for i in range(n):
        if valid[i]:
            p = pos[i]
            ln = (np.int64(data[p]) << 8 | np.int64(data[p + 1])) if wide else np.int64(data[p])
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


@nb.njit(cache=True)
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
        if not valid[i]:
            continue
        o = offsets[i]
        p = pos[i]
        w = 0
        for k in range(16):
            if k == 4 or k == 6 or k == 8 or k == 10:
                buf[o + w] = 0x2D
                w += 1
            b = data[p + k]
            buf[o + w] = hexd[b >> 4]
            buf[o + w + 1] = hexd[b & 15]
            w += 2
    return offsets, buf


@nb.njit(cache=True, inline="always")
def _put_dec(buf: Any, w: int, v: np.uint64) -> int:
    """Write v in decimal at buf[w:], return the new write position."""
    tmp = np.empty(20, dtype=np.uint8)
    n = 0
    if v == 0:
        buf[w] = 0x30
        return w + 1
    while v > 0:
        tmp[n] = 0x30 + np.uint8(v % np.uint64(10))
        v //= np.uint64(10)
        n += 1
    for k in range(n):
        buf[w + k] = tmp[n - 1 - k]
    return w + n


@nb.njit(cache=True)
def objref_column(data: Any, pos: Any, valid: Any, ver: Any) -> tuple[Any, Any]:
    """Text form of object references, as ``str`` of the codec's object ids.

    AM2: ``flags-epoch-brokerbank-agentbank-object``; AM1: ``bootseq-bank-object``.
    """
    n = pos.shape[0]
    offsets = np.empty(n + 1, dtype=np.int32)
    buf = np.empty(n * 100, dtype=np.uint8)
    offsets[0] = 0
    w = 0
    for i in range(n):
        if valid[i]:
            p = pos[i]
            hi = _be(data, p, 8)
            if ver[i] == 2:
                w = _put_dec(buf, w, hi >> np.uint64(60))
                buf[w] = 0x2D
                w = _put_dec(buf, w + 1, (hi >> np.uint64(48)) & np.uint64(0xFFF))
                buf[w] = 0x2D
                w = _put_dec(buf, w + 1, (hi >> np.uint64(28)) & np.uint64(0xFFFFF))
                buf[w] = 0x2D
                w = _put_dec(buf, w + 1, hi & np.uint64(0xFFFFFFF))
                buf[w] = 0x2D
                w = _put_dec(buf, w + 1, _be(data, p + 8, 8))
            else:
                w = _put_dec(buf, w, (hi >> np.uint64(48)) & np.uint64(0x7FFF))
                buf[w] = 0x2D
                w = _put_dec(buf, w + 1, (hi >> np.uint64(24)) & np.uint64(0xFFFFFF))
                buf[w] = 0x2D
                w = _put_dec(buf, w + 1, hi & np.uint64(0xFFFFFF))
        offsets[i + 1] = w
    return offsets, buf[:w].copy()


@nb.njit(cache=True)
def empty_container(data: Any, pos: Any, valid: Any, out: Any) -> None:
    """out[i] = 1 when the 0-10 map or list at pos[i] (u32 size, u32 count) is empty."""
    for i in range(pos.shape[0]):
        out[i] = 0
        if valid[i]:
            p = pos[i]
            if _be(data, p, 4) >= np.uint64(4) and _be(data, p + 4, 4) == np.uint64(0):
                out[i] = 1


def hex_digits() -> npt.NDArray[np.uint8]:
    """The lowercase hex digit table for ``uuid_column``."""
    return _HEX
