"""Arrow columns from the kernels' arrays: per-class wide tables and the compact
layout's typed lists, built once per batch and class, never per record
(``pipeline.codec.vectorized``)."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pipeline.codec import _kernels as K
from pipeline.codec._compiled import CompiledRegistry, _Walk
from pipeline.codec.layout import (
    ARROW_OF,
    COMPACT_SCHEMA,
    I64,
    IDENTITY_FIELDS,
    INT_TYPES,
    SLOT_FLOATS,
    SLOT_INTS,
    SLOT_TEXTS,
    arrow_type,
    column_name,
    slot_kind,
    to_json,
)
from pipeline.codec.schema import ClassSchema, Element, SchemaKey

_NUMPY_OF: dict[int, Any] = {t: a.to_pandas_dtype() for t, a in ARROW_OF.items() if t in INT_TYPES}


# ------------------------------------------------------------ column builders


def _bitmap(valid: npt.NDArray[np.bool_]) -> pa.Buffer:
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def _numeric(slots: I64, vb: pa.Buffer | None, nulls: int, t: int) -> pa.Array:
    n = len(slots)
    if t == 11:
        return pa.Array.from_buffers(pa.bool_(), n, [vb, _bitmap(slots != 0)], nulls)
    if t == 12:
        arr: npt.NDArray[Any] = slots.astype(np.uint32).view(np.float32)
    elif t == 13:
        arr = slots.view(np.float64)
    else:
        arr = slots.astype(_NUMPY_OF[t], copy=False)
    return pa.Array.from_buffers(ARROW_OF[t], n, [vb, pa.py_buffer(arr)], nulls)


def _string(
    offsets: npt.NDArray[np.int32],
    buf: npt.NDArray[np.uint8],
    vb: pa.Buffer | None,
    nulls: int,
    check: bool = True,
) -> pa.Array:
    """A string column from its buffers; ``check=False`` for text built as ASCII here."""
    n = len(offsets) - 1
    arr = pa.Array.from_buffers(
        pa.string(), n, [vb, pa.py_buffer(offsets), pa.py_buffer(buf)], nulls
    )
    if not check:
        return arr
    try:
        arr.validate(full=True)
    except pa.ArrowInvalid:
        # Rare: text that is not UTF-8. Replace like the per-record view does.
        raw = pa.Array.from_buffers(
            pa.binary(), n, [vb, pa.py_buffer(offsets), pa.py_buffer(buf)], nulls
        )
        arr = pa.array(
            [None if b is None else b.decode("utf-8", "replace") for b in raw.to_pylist()],
            pa.string(),
        )
    return arr


_JSON_CACHE: dict[tuple[int, bytes], bytes | None] = {}
_JSON_CACHE_MAX = 65536
_MISS: Any = object()


def _container_json(raw: bytes, t: int) -> bytes | None:
    """JSON text of one encoded map/list/array of QMF type ``t``; None if the codec rejects it.

    Through a bounded cache: an object's arguments repeat in every sample.
    """
    from pipeline.codec.types import qmf_types

    key = (t, raw)
    cache = _JSON_CACHE
    if key in cache:
        return cache[key]
    if len(cache) > _JSON_CACHE_MAX:
        cache.clear()
    try:
        value, _ = qmf_types("AM2")[t][0](raw, 0)
        text: bytes | None = to_json(value).encode()
    except Exception:
        text = None
    cache[key] = text
    return text


def _container(
    w: _Walk, pos: I64, valid: npt.NDArray[np.bool_], vb: pa.Buffer | None, nulls: int, t: int
) -> tuple[pa.Array, npt.NDArray[np.bool_]]:
    """JSON text column of maps/lists: empty ones in bulk, others through the codec's decoder.

    Non-empty values are decoded once per distinct encoding (an object's
    arguments repeat in every sample), through a bounded cache; the column is
    then assembled by a kernel, so no Python work is done per empty value.
    Returns the column and a per-record "failed" mask (the codec rejected the
    value: that message must go to the per-record path). 0-10 maps, lists and
    arrays decode the same way in AM1 and AM2.
    """
    n = len(pos)
    sizes = np.zeros(n, np.int64)
    K.container_sizes(w.data, pos, valid, sizes)
    failed = np.zeros(n, np.bool_)
    todo = np.flatnonzero(sizes)
    rank = np.full(n, -1, np.int64)
    rank[todo] = np.arange(len(todo))
    texts: list[bytes] = []
    if len(todo):
        # One decode per distinct encoding: hash the encoded bytes in a kernel,
        # group equal hashes, and check byte for byte that each group really
        # holds one encoding (else, on a hash collision, every value is its own).
        hashes = K.container_hashes(w.data, pos, sizes, todo)
        rep, inv = K.unique_hashes(hashes)
        if K.same_bytes(w.data, pos, sizes, todo, rep, inv):
            uniq = todo[rep]
            rank[todo] = inv
        else:
            uniq = todo
        bad = np.zeros(len(uniq), np.bool_)
        mv = memoryview(w.data)  # type: ignore[arg-type]
        for u, (p, size) in enumerate(zip(pos[uniq].tolist(), sizes[uniq].tolist(), strict=True)):
            text = _container_json(mv[p : p + size].tobytes(), t)
            if text is None:
                bad[u] = True
                text = b""
            texts.append(text)
        if bad.any():
            failed[todo] = bad[rank[todo]]
    tx_off = np.zeros(len(texts) + 1, np.int64)
    if texts:
        tx_off[1:] = np.cumsum([len(x) for x in texts])
    joined = b"".join(texts)
    tx_buf = np.frombuffer(joined, np.uint8) if joined else np.zeros(1, np.uint8)
    empty = np.frombuffer(b"{}" if t == 15 else b"[]", np.uint8).copy()
    offsets, buf = K.container_column(valid, rank, tx_off, tx_buf, empty)
    # JSON text from json.dumps (ensure_ascii) or "{}"/"[]": ASCII, no check needed.
    return _string(offsets, buf, vb, nulls, check=False), failed


_STRING = pa.string()


def _str_array(
    offsets: npt.NDArray[np.int32],
    buf: npt.NDArray[np.uint8],
    t: pa.DataType = _STRING,
) -> pa.Array:
    n = len(offsets) - 1
    return pa.Array.from_buffers(t, n, [None, pa.py_buffer(offsets), pa.py_buffer(buf)], 0)


_CONST_CACHE: dict[tuple[bytes, pa.DataType], pa.Array] = {}


def _const_str(value: str | bytes, n: int, t: pa.DataType = _STRING) -> pa.Array:
    """``n`` copies of one string: a zero-copy slice of a cached, longer column.

    The same few constants (package, class, schema hash, dialect) occur in
    every batch, so they are built once (growing when a batch needs more).
    """
    raw = value.encode() if isinstance(value, str) else value
    key = (raw, t)
    hit = _CONST_CACHE.get(key)
    if hit is None or len(hit) < n:
        if len(_CONST_CACHE) > 1024:
            _CONST_CACHE.clear()
        size = max(n, 2 * len(hit)) if hit is not None else max(n, 1024)
        hit = _str_array(*K.repeat_bytes(np.frombuffer(raw, np.uint8).copy(), size), t)
        _CONST_CACHE[key] = hit
    return hit.slice(0, n)


_DIALECTS = ["", "AM1", "AM2"]
_NULL_STRINGS: list[pa.Array] = []
_COUNTING: list[npt.NDArray[np.int32]] = []


def _null_strings(n: int) -> pa.Array:
    """``n`` null strings: a zero-copy slice of a cached all-null column."""
    if not _NULL_STRINGS or len(_NULL_STRINGS[0]) < n:
        _NULL_STRINGS[:] = [pa.nulls(max(n, 4096), pa.string())]
    return _NULL_STRINGS[0].slice(0, n)


def _counting(n: int) -> npt.NDArray[np.int32]:
    """0, 1, ..., n - 1 as int32 (offsets of one-byte strings): a view of a cached array."""
    if not _COUNTING or len(_COUNTING[0]) < n:
        _COUNTING[:] = [np.arange(max(n, 4096), dtype=np.int32)]
    return _COUNTING[0][:n]


@dataclass
class _Ctx:
    w: _Walk
    comp: CompiledRegistry
    msg_keys: pa.Array
    routing_keys: pa.Array | None


def _string_buffers(arr: pa.Array) -> tuple[npt.NDArray[Any], npt.NDArray[np.uint8]]:
    """(offsets, data) of a string or binary array, for the kernels (no copy)."""
    if arr.type not in (pa.string(), pa.binary(), pa.large_string(), pa.large_binary()):
        arr = arr.cast(pa.large_string())
    bufs = arr.buffers()
    odt = np.int64 if arr.type in (pa.large_string(), pa.large_binary()) else np.int32
    offs = np.frombuffer(bufs[1], odt)[arr.offset : arr.offset + len(arr) + 1]
    data = (
        np.frombuffer(bufs[2], np.uint8)
        if bufs[2] is not None and bufs[2].size
        else np.zeros(1, np.uint8)
    )
    return offs, data


def _prim(vals: npt.NDArray[Any], t: pa.DataType, valid: pa.Buffer | None, nulls: int) -> pa.Array:
    """A primitive Arrow column over a numpy array (no copy); all null when ``nulls`` is n."""
    if nulls == len(vals):
        return pa.nulls(len(vals), t)
    return pa.Array.from_buffers(t, len(vals), [valid, pa.py_buffer(vals)], nulls)


def _identity(ctx: _Ctx, sub: I64, schema: ClassSchema | None) -> dict[str, pa.Array]:
    """The identity columns of kernel-decoded records: one class's, or any (``schema=None``)."""
    n = sub.shape[1]
    ver = sub[K.R_VER]
    idx, boot, bank, flags, epoch, bb, ab, obj, n_am1, ops, a_off, a_buf = K.id_fields(sub)
    if n_am1 == 0:
        agent = _str_array(a_off, a_buf)
        dialect = _const_str("AM2", n)
        v1, v2 = None, None  # AM1 fields all null, AM2 fields all valid
    else:
        am1_agents = _agent_am1(ctx.routing_keys, sub[K.R_MSG], n)
        agent = pa.array(
            [
                a if v == 1 else f"{x}.{y}"
                for a, v, x, y in zip(am1_agents, ver, bb, ab, strict=True)
            ],
            pa.string(),
        )
        dialect = pa.array(_DIALECTS, pa.string()).take(pa.array(ver))
        am1 = ver == 1
        v1, v2 = _bitmap(am1), _bitmap(~am1)
    n2 = n - n_am1
    i32, i64 = pa.int32(), pa.int64()
    return {
        "msg_key": ctx.msg_keys.take(_indices(sub[K.R_MSG])),
        "record_index": _prim(idx, i32, None, 0),
        "dialect": dialect,
        "opcode": _str_array(_counting(n + 1), ops),
        "seq": _prim(sub[K.R_SEQ], i64, None, 0),
        "agent": agent,
        **(
            _class_columns(ctx.comp, sub[K.R_SCHEMA])
            if schema is None
            else {
                "package": _const_str(schema.key.package, n),
                "class_name": _const_str(schema.key.name, n),
                "schema_hash": _const_str(schema.key.hash, n, pa.binary()),
            }
        ),
        "update_ns": _prim(sub[K.R_UPDATE], i64, None, 0),
        "create_ns": _prim(sub[K.R_CREATE], i64, None, 0),
        "delete_ns": _prim(sub[K.R_DELETE], i64, None, 0),
        "boot_seq": _prim(boot, i32, v1, n2),
        "bank": _prim(bank, i32, v1, n2),
        "flags": _prim(flags, pa.int8(), v2, n_am1),
        "epoch": _prim(epoch, i64, v2, n_am1),
        "broker_bank": _prim(bb, i32, v2, n_am1),
        "agent_bank": _prim(ab, i32, v2, n_am1),
        "object_num": _prim(obj, i64, None, 0),
        "agent_name": _null_strings(n),
        "object_name": _null_strings(n),
    }


def _class_table(
    ctx: _Ctx, sub: I64, schema: ClassSchema
) -> tuple[pa.Table | None, npt.NDArray[np.bool_]]:
    """One class's table, or the records whose values failed (None, mask)."""
    w = ctx.w
    n = sub.shape[1]
    cols = _identity(ctx, sub, schema)
    presence = sub[K.R_PRESENCE]
    ver = sub[K.R_VER]
    failed = np.zeros(n, np.bool_)
    bit = 0
    groups = (
        (schema.properties, sub[K.R_POFF], True),
        (schema.statistics, sub[K.R_SOFF], False),
    )
    comp = ctx.comp
    k = int(sub[K.R_SCHEMA, 0])
    for elements, base, is_props in groups:
        if not elements:
            continue
        if not (base >= 0).any():
            for e in elements:
                cols[column_name(e.name)] = pa.nulls(n, arrow_type(e.type_code))
            if is_props:
                bit += sum(1 for e in elements if e.optional)
            continue
        e0 = int(comp.p_start[k] if is_props else comp.s_start[k])
        sl = slice(e0, e0 + len(elements))
        mat = K.fill(
            w.data, base, presence, ver, comp.el_kind[sl], comp.el_bit[sl], comp.u64run[sl]
        )
        has = base >= 0
        n_absent = int(n - np.count_nonzero(has))
        has_bitmap = _bitmap(has) if n_absent else None  # shared by the group's columns
        for j, e in enumerate(elements):
            if is_props and e.optional:
                valid = np.empty(n, np.bool_)
                nulls = K.validity(base, presence, bit, valid)
                vb = _bitmap(valid) if nulls else None
                bit += 1
            else:
                valid, nulls, vb = has, n_absent, has_bitmap
            cols[column_name(e.name)] = _element_column(w, e, mat[j], valid, vb, nulls, ver, failed)
    if failed.any():
        return None, failed
    return pa.table(cols, schema=comp.out_schemas[k]), failed


def _element_column(
    w: _Walk,
    e: Element,
    slots: I64,
    valid: npt.NDArray[np.bool_],
    vb: pa.Buffer | None,
    nulls: int,
    ver: I64,
    failed: npt.NDArray[np.bool_],
) -> pa.Array:
    t = e.type_code
    if nulls == len(slots):
        return pa.nulls(len(slots), arrow_type(t))
    if t in (6, 7):
        o, buf = K.string_column(w.data, slots, valid, t == 7)
        return _string(o, buf, vb, nulls)
    if t == 14:
        o, buf = K.uuid_column(w.data, slots, valid, K.hex_digits())
        return _string(o, buf, vb, nulls, check=False)  # hex digits and dashes
    if t == 10:
        o, buf = K.objref_column(w.data, slots, valid, ver)
        return _string(o, buf, vb, nulls, check=False)  # decimal digits and dashes
    if t in (15, 21, 22):
        arr, f = _container(w, slots, valid, vb, nulls, t)
        failed |= f
        return arr
    return _numeric(slots, vb, nulls, t)


@dataclass(frozen=True)
class _Layout:
    ints: tuple[int, ...]  # element positions (properties then statistics) per list
    floats: tuple[int, ...]
    texts: tuple[int, ...]
    index: tuple[int, ...]  # index properties


_LAYOUTS: dict[SchemaKey, tuple[ClassSchema, _Layout]] = {}


def _layout(schema: ClassSchema) -> _Layout:
    hit = _LAYOUTS.get(schema.key)
    if hit is not None and hit[0] == schema:
        return hit[1]
    groups: dict[str, list[int]] = {SLOT_INTS: [], SLOT_FLOATS: [], SLOT_TEXTS: []}
    for i, e in enumerate((*schema.properties, *schema.statistics)):
        groups[slot_kind(e.type_code)].append(i)
    out = _Layout(
        tuple(groups[SLOT_INTS]),
        tuple(groups[SLOT_FLOATS]),
        tuple(groups[SLOT_TEXTS]),
        tuple(i for i, p in enumerate(schema.properties) if p.index),
    )
    if len(_LAYOUTS) > 4096:
        _LAYOUTS.clear()
    _LAYOUTS[schema.key] = (schema, out)
    return out


def _texts_of(cols: list[pa.Array], n: int) -> pa.Array:
    """Text columns -> one list<string> column, row-major."""
    k = len(cols)
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * k, pa.int32())
    if k == 0:
        return pa.ListArray.from_arrays(offsets, pa.array([], pa.string()))
    flat = pa.concat_arrays(cols) if k > 1 else cols[0]
    if k > 1:
        perm = np.arange(n, dtype=np.int64)[:, None] + np.arange(k, dtype=np.int64)[None, :] * n
        flat = flat.take(pa.array(perm.reshape(-1)))
    return pa.ListArray.from_arrays(offsets, flat)


def _plain_text(a: pa.Array) -> bool:
    """True when no value needs a JSON escape (no quote, backslash or control character)."""
    bufs = a.buffers()
    if bufs[2] is None or not len(a):
        return True
    offs = np.frombuffer(bufs[1], np.int32)[a.offset : a.offset + len(a) + 1]
    b = np.frombuffer(bufs[2], np.uint8)[int(offs[0]) : int(offs[-1])]
    return not bool(((b < 0x20) | (b == 0x22) | (b == 0x5C)).any())


def index_key(cols: list[pa.Array], n: int) -> pa.Array:
    """JSON array (of strings) of the index properties' values; null where one is absent.

    One Arrow call in the usual case (names and references need no escape).
    """
    import pyarrow.compute as pc

    if not cols:
        return pa.nulls(n, pa.string())
    parts = [c if c.type == pa.string() else c.cast(pa.string()) for c in cols]
    if not all(_plain_text(p) for p in parts):
        rows = zip(*(p.to_pylist() for p in parts), strict=True)
        return pa.array(  # rare: quotes, backslashes, control characters
            [
                None
                if any(v is None for v in r)
                else json.dumps(list(r), separators=(",", ":"), ensure_ascii=False)
                for r in rows
            ],
            pa.string(),
        )
    pieces: list[Any] = ['["']
    for i, p in enumerate(parts):
        pieces += [p, '"]' if i == len(parts) - 1 else '","']
    return pc.binary_join_element_wise(*pieces, "", null_handling="emit_null")


def _indices(rows: npt.NDArray[np.int64]) -> pa.Array:
    """An int64 Arrow array over record-matrix row values, for ``take`` (no copy if contiguous)."""
    rows = np.ascontiguousarray(rows)
    return pa.Array.from_buffers(pa.int64(), len(rows), [None, pa.py_buffer(rows)])


def _class_columns(comp: CompiledRegistry, idx: I64) -> dict[str, pa.Array]:
    """package, class_name, schema_hash of records of any classes (by compiled schema index).

    Arrow's take: about twice as fast as copying the strings in a kernel.
    """
    assert comp.names_by_index is not None
    taken = comp.names_by_index.take(_indices(idx))
    return {name: taken.column(name) for name in taken.schema.names}


def _compact_all(ctx: _Ctx, rec: I64) -> tuple[dict[str, pa.Array] | None, npt.NDArray[np.bool_]]:
    """Index key and the three typed lists of kernel-checked records of any classes.

    One kernel writes every record's values, in input order, straight into
    the three typed lists (``compact_lists``); texts of all types are then
    formatted by one kernel and index keys built by another. So the number of
    Python and Arrow calls per batch does not grow with the classes in it. Returns
    (columns, None) or (None, records whose container value the codec rejects).
    """
    w, comp = ctx.w, ctx.comp
    n = rec.shape[1]
    off, ints_v, ints_ok, flts_v, flts_ok, f32, t_pos, t_valid, t_type, t_ver = K.compact_lists(
        w.data, rec, comp.p_start, comp.p_count, comp.s_start, comp.s_count, comp.el_kind,
        comp.el_bit, comp.u64run, comp.el_slot, comp.el_type, comp.n_slots,
    )  # fmt: skip
    schema_of = rec[K.R_SCHEMA]
    failed = np.zeros(n, np.bool_)

    def listed(j: int, v: npt.NDArray[Any], ok: npt.NDArray[np.bool_], t: pa.DataType) -> pa.Array:
        nulls = int(ok.size - np.count_nonzero(ok))
        child = pa.Array.from_buffers(
            t, ok.size, [_bitmap(ok) if nulls else None, pa.py_buffer(v)], nulls
        )
        return pa.ListArray.from_buffers(
            pa.list_(t), n, [None, pa.py_buffer(off[j])], children=[child]
        )

    ints = listed(0, ints_v, ints_ok, pa.int64())
    if f32.any():
        flts_v[f32] = (
            flts_v[f32].astype(np.uint32).view(np.float32).astype(np.float64).view(np.int64)
        )
    floats = listed(1, flts_v.view(np.float64), flts_ok, pa.float64())

    todo, _sizes, rep, inv, cidx = K.container_groups(w.data, t_pos, t_valid, t_type)
    texts_json: list[bytes] = []
    if len(todo):
        mv = memoryview(w.data)  # type: ignore[arg-type]
        first = todo[rep]  # each group's first slot
        cache = _JSON_CACHE
        texts: list[bytes | None] = []
        for p, size, t in zip(
            t_pos[first].tolist(), _sizes[rep].tolist(), t_type[first].tolist(), strict=True
        ):
            raw = mv[p : p + size].tobytes()
            text = cache.get((t, raw), _MISS)  # the common case: a value seen before
            texts.append(_container_json(raw, t) if text is _MISS else text)
        if None in texts:  # the codec rejects these values: their messages go per record
            bad = np.fromiter((x is None for x in texts), np.bool_, len(texts))
            t_rec = np.repeat(np.arange(n, dtype=np.int64), np.diff(off[2]))
            failed[t_rec[todo[bad[inv]]]] = True
            return None, failed
        texts_json = texts  # type: ignore[assignment]  # no None left
    c_off = np.fromiter(
        itertools.accumulate(map(len, texts_json), initial=0), np.int64, len(texts_json) + 1
    )
    joined = b"".join(texts_json)
    c_buf = np.frombuffer(joined, np.uint8) if joined else np.zeros(1, np.uint8)
    o, buf = K.text_values(
        w.data, t_pos, t_valid, t_type, t_ver, K.hex_digits(), cidx, c_off, c_buf
    )
    t_nulls = int(t_valid.size - np.count_nonzero(t_valid))
    # Only text with a byte >= 0x80 can be invalid UTF-8: check it then alone
    # (replaced text, if any, is what the index keys are then built from).
    checked = K.non_ascii(buf)
    t_arr = _string(o, buf, _bitmap(t_valid) if t_nulls else None, t_nulls, check=checked)
    texts = pa.ListArray.from_buffers(
        pa.list_(pa.string()), n, [None, pa.py_buffer(off[2])], children=[t_arr]
    )
    ta_off, ta_buf = _string_buffers(t_arr) if checked else (o, buf)
    text_start = off[2, :-1].astype(np.int64)
    k_off, k_buf, k_ok, slow = K.index_keys(
        schema_of, text_start, ta_off, ta_buf, t_valid, comp.ix_off, comp.ix_text
    )
    k_nulls = int(n - np.count_nonzero(k_ok))
    key = _string(k_off, k_buf, _bitmap(k_ok) if k_nulls else None, k_nulls, check=False)
    if slow.any():
        key = _slow_index_keys(key, slow, schema_of, ints, floats, texts, comp)
    return {"index_key": key, SLOT_INTS: ints, SLOT_FLOATS: floats, SLOT_TEXTS: texts}, failed


def _slow_index_keys(
    key: pa.Array,
    slow: npt.NDArray[np.bool_],
    schema_of: I64,
    ints: pa.ListArray,
    floats: pa.ListArray,
    texts: pa.ListArray,
    comp: CompiledRegistry,
) -> pa.Array:
    """Index keys the kernel left to Python: numeric index values, text that needs escaping."""
    out = key.to_pylist()
    lists = (ints, floats, texts)
    for i in np.flatnonzero(slow).tolist():
        k = int(schema_of[i])
        parts: list[Any] = []
        for x in range(int(comp.ix_off[k]), int(comp.ix_off[k + 1])):
            e = int(comp.p_start[k]) + int(comp.ix_el[x])
            j, t = int(comp.el_slot[e]), int(comp.el_type[e])
            v = lists[j][i].values[int(comp.ix_pos[x])]
            if j != 2 and v.is_valid:
                v = pa.array([v.as_py() != 0 if t == 11 else v.as_py()], arrow_type(t))
                v = v.cast(pa.string())[0]
            parts.append(v.as_py())
        out[i] = (
            None
            if any(v is None for v in parts)
            else json.dumps(parts, separators=(",", ":"), ensure_ascii=False)
        )
    return pa.array(out, pa.string())


def wide_to_compact(wide: pa.Table, schema: ClassSchema) -> pa.Table:
    """A per-class wide table (``sample_schema``) -> ``COMPACT_SCHEMA`` (the per-record path's way)."""
    n = wide.num_rows
    lay = _layout(schema)
    names = [column_name(e.name) for e in (*schema.properties, *schema.statistics)]

    def col(i: int) -> pa.Array:
        return wide.column(names[i]).combine_chunks()

    def packed(idx: tuple[int, ...], t: pa.DataType) -> pa.Array:
        offsets = pa.array(np.arange(n + 1, dtype=np.int32) * len(idx), pa.int32())
        if not idx:
            return pa.ListArray.from_arrays(offsets, pa.array([], t))
        return _texts_of([col(i).cast(t) for i in idx], n).cast(pa.list_(t))

    cols: dict[str, Any] = {f.name: wide.column(f.name) for f in IDENTITY_FIELDS}
    cols["index_key"] = index_key([col(i) for i in lay.index], n)
    cols[SLOT_INTS] = packed(lay.ints, pa.int64())
    cols[SLOT_FLOATS] = packed(lay.floats, pa.float64())
    cols[SLOT_TEXTS] = packed(lay.texts, pa.string())
    return pa.table(cols, schema=COMPACT_SCHEMA)


def _am1_agent_of(routing_key: Any) -> str | None:
    from pipeline.codec.message import routing_agent

    return routing_agent(routing_key if isinstance(routing_key, str) else None)


# ------------------------------------------------------------------ entry points


def _agent_am1(routing_keys: pa.Array | None, rows: I64, n: int) -> list[str | None]:
    if routing_keys is None:
        return [None] * n
    return [_am1_agent_of(k) for k in routing_keys.take(pa.array(rows)).to_pylist()]
