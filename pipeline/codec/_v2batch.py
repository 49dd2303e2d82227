"""QMF v2 data indications of a batch: found, walked by ``_v2kernels`` and built into
the compact layout (``pipeline.codec.vectorized``'s v2 fast path)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pipeline.codec import _kernels as K
from pipeline.codec import _v2kernels as V
from pipeline.codec._columns import (
    _JSON_CACHE_MAX,
    _MISS,
    _bitmap,
    _class_columns,
    _const_str,
    _indices,
    _prim,
    _slow_index_keys,
    _string,
    _string_buffers,
)
from pipeline.codec._compiled import CompiledRegistry, _body_buffers
from pipeline.codec.layout import (
    COMPACT_NAMES,
    COMPACT_SCHEMA,
    I64,
    SLOT_FLOATS,
    SLOT_INTS,
    SLOT_TEXTS,
    cell,
)

# ------------------------------------------------------------ QMF v2 data indications
#
# QMF v2 ``_data`` indications (AMQP 0-10 ``amqp/list`` bodies, or AMQP 1.0
# ``amqp-value`` lists marked ``x-qmf-body-encoding: amqp-1.0``) are decoded by
# ``_v2kernels.v2_walk`` straight into the compact layout. Which messages are
# such indications is read from the application properties by Arrow compute
# (no Python per message); the values the kernel does not format (object
# references, maps, unusual text encodings) are decoded by the codec once per
# distinct encoding (``_v2_cell``). Messages the kernel refuses go whole to the
# per-record path, like every other message it does not take.

_V2_KEYS = (
    b"_schema_id", b"_object_id", b"_update_ts", b"_create_ts", b"_delete_ts", b"_values",
    b"_package_name", b"_class_name", b"_hash", b"_type",
    b"_agent_name", b"_agent_epoch", b"_object_name", b"_event",
)  # fmt: skip
_V2_LITS = np.frombuffer(b"".join(_V2_KEYS), np.uint8).copy()
_V2_LIT_OFF = np.array([0, *itertools.accumulate(map(len, _V2_KEYS))], np.int64)
_V2_PROPS = (
    b"qmf.opcode", b"qmf.content", b"x-qmf-body-encoding", b"qmf.agent",
    b"_data_indication", b"_query_response", b"_data", b"amqp-1.0", b"x-qmf-agent",
)  # fmt: skip
_V2_PROP_LITS = np.frombuffer(b"".join(_V2_PROPS), np.uint8).copy()
_V2_PROP_OFF = np.array([0, *itertools.accumulate(map(len, _V2_PROPS))], np.int64)
_V2_OPCODE_NAMES = pa.array(["", "_data_indication", "_query_response"], pa.string())


@dataclass
class _V2Cands:
    rows: I64  # batch rows of the v2 data indications
    encs: I64  # their encodings (``_v2kernels.ENC_*``)
    opcode: I64  # per batch row: 1 _data_indication, 2 _query_response (``_V2_OPCODE_NAMES``)
    agent_pos: I64  # per batch row: the qmf.agent value in ``agent_buf`` (length -1: none)
    agent_len: I64
    agent_buf: npt.NDArray[np.uint8]


def _v2_candidates(table: pa.Table, body: pa.Array) -> _V2Cands | None:
    """The batch rows that are QMF v2 ``_data`` indications the kernel can read, or None.

    Read from the application properties (an Arrow map of strings) by one
    kernel (``v2_props``); AMQP 0-10 bodies are taken only as ``amqp/list``,
    the content type ``decode_v2`` then reads as a list.
    """
    if "application_properties" not in table.column_names:
        return None
    ap = table.column("application_properties")
    if not (
        pa.types.is_map(ap.type)
        and pa.types.is_string(ap.type.key_type)
        and pa.types.is_string(ap.type.item_type)
    ):
        return None
    ap = ap.combine_chunks() if ap.num_chunks != 1 else ap.chunk(0)
    n = len(ap)
    if ap.null_count == n:
        return None
    row_ok = (
        np.asarray(ap.is_valid().to_numpy(zero_copy_only=False), np.bool_)
        if ap.null_count
        else np.ones(n, np.bool_)
    )
    if body.null_count:
        row_ok &= np.asarray(body.is_valid().to_numpy(zero_copy_only=False), np.bool_)
    m_off = np.asarray(ap.offsets.to_numpy(), np.int64)
    k_off, k_buf = _string_buffers(ap.keys)
    i_off, i_buf = _string_buffers(ap.items)
    items = ap.items
    i_ok = (
        np.asarray(items.is_valid().to_numpy(zero_copy_only=False), np.bool_)
        if items.null_count
        else np.ones(len(items), np.bool_)
    )
    opcode, enc, a_pos, a_len = V.v2_props(
        row_ok, m_off, k_off, k_buf, i_off, i_buf, i_ok, _V2_PROP_LITS, _V2_PROP_OFF
    )
    data = opcode > 0
    if not data.any():
        return None
    if "content_type" in table.column_names:
        import pyarrow.compute as pc

        ctype = table.column("content_type")
        as_list = pc.fill_null(pc.equal(ctype, "amqp/list"), False).to_numpy()
        is010 = (enc == 0) & np.asarray(as_list, np.bool_)
    else:
        is010 = np.zeros(n, np.bool_)
    rows = np.flatnonzero(data & ((enc == 2) | is010)).astype(np.int64)
    if not len(rows):
        return None
    encs = np.where(enc[rows] == 2, V.ENC_10, V.ENC_010).astype(np.int64)
    return _V2Cands(rows, encs, opcode, a_pos, a_len, i_buf)


_V2_CACHE: dict[tuple[int, bytes], bytes | None] = {}
_V2_FAIL: Any = object()


def _v2_cell(raw: bytes, tag: int) -> Any:
    """The text (UTF-8) of one encoded v2 value for QMF type ``tag >> 2`` (0: only check it).

    ``tag & 3`` is the encoding. None for a null cell; ``_V2_FAIL`` when the
    codec rejects the value (its message then goes per record). Cached:
    an object's references and maps repeat in every sample.
    """
    key = (tag, raw)
    hit = _V2_CACHE.get(key, _MISS)
    if hit is not _MISS:
        return hit
    if len(_V2_CACHE) > _JSON_CACHE_MAX:
        _V2_CACHE.clear()
    t, enc = tag >> 2, tag & 3
    out: Any
    try:
        if enc == V.ENC_010:
            from pipeline.codec.types import AMQP_DECODERS

            value, end = AMQP_DECODERS[raw[0]](raw, 1)
            if end != len(raw):
                raise ValueError("value size")
        else:
            from pipeline.codec import amqp10

            value, _code = amqp10.decode(raw)
        text = cell(t, value) if t else ""
        out = None if text is None else str(text).encode("utf-8")
    except Exception:
        out = _V2_FAIL
    _V2_CACHE[key] = out
    return out


def _v2_walk(body: pa.Array, comp: CompiledRegistry, rows: I64, encs: I64) -> tuple[Any, ...]:
    data, offs = _body_buffers(body)
    return (data, *V.v2_walk(
        data, offs, rows, encs, comp.hash_hi, comp.hash_lo, comp.hash16, comp.names,
        comp.name_off, comp.name_table, comp.el_names, comp.el_name_off, comp.el_schema,
        comp.p_start, comp.el_slot, comp.el_type, comp.el_lpos, comp.n_slots,
        _V2_LITS, _V2_LIT_OFF,
    ))  # fmt: skip


def _v2_decode(
    table: pa.Table, body: pa.Array, comp: CompiledRegistry, msg_keys: pa.Array, c: _V2Cands
) -> tuple[tuple[pa.Table, I64], set[int], dict[str, int], set[int]]:
    """The v2 candidates' records as one compact table: (table and message rows, rows decoded,
    refusals by reason, rows refused for want of a schema)."""
    failed: dict[str, int] = {}
    rows, encs = c.rows, c.encs
    for _attempt in range(2):
        (data, rec, status, ints, i_ok, flts, f_ok, tkind, tpos, tlen, ttype, chk) = _v2_walk(
            body, comp, rows, encs
        )
        texts_py, late = _v2_python_values(data, rec, rows, encs, tkind, tpos, tlen, ttype, chk)
        if not late:
            break
        failed["v2: value rejected"] = failed.get("v2: value rejected", 0) + len(late)
        keep = ~np.isin(rows, np.array(sorted(late), np.int64))
        rows, encs = rows[keep], encs[keep]
    else:  # pragma: no cover - the second walk only has messages whose values all passed
        raise AssertionError("v2 values rejected twice")
    bad = status != V.V_OK
    for code in np.unique(status[bad]).tolist():
        name = V.V_STATUS_NAMES[code]
        failed[name] = failed.get(name, 0) + int(np.count_nonzero(status == code))
    ok_rows = set(rows[~bad].tolist())
    unknown = set(rows[status == V.V_UNKNOWN_SCHEMA].tolist())
    return (_v2_table(data, rec, comp, msg_keys, c, ints, i_ok, flts, f_ok, tkind, tpos, tlen,
                      texts_py), rec[V.W_MSG]), ok_rows, failed, unknown  # fmt: skip


def _v2_python_values(
    data: npt.NDArray[np.uint8],
    rec: I64,
    rows: I64,
    encs: I64,
    tkind: npt.NDArray[np.int8],
    tpos: I64,
    tlen: I64,
    ttype: I64,
    chk: I64,
) -> tuple[tuple[I64, I64, npt.NDArray[np.uint8]], set[int]]:
    """Texts of the values left to the codec, one decode per distinct (type, encoding, bytes).

    Returns ((text index per text slot or -1, text offsets, text bytes), batch
    rows whose values the codec rejects). Slots whose text is null become
    ``T_NULL``.
    """
    n_t = len(tkind)
    cidx = np.full(n_t, -1, np.int64)
    py = np.flatnonzero(tkind == V.T_PY)
    n_chk = chk.shape[1]
    if not len(py) and not n_chk:
        return (cidx, np.zeros(1, np.int64), np.zeros(1, np.uint8)), set()
    enc_by_row = np.zeros(int(rows.max()) + 1 if len(rows) else 1, np.int64)
    enc_by_row[rows] = encs
    msg = rec[V.W_MSG]
    t_off = np.append(rec[V.W_TOFF], n_t)
    t_rec = np.repeat(np.arange(rec.shape[1], dtype=np.int64), np.diff(t_off))
    py_row = msg[t_rec[py]]
    chk_row = rows[chk[2]]
    pos = np.concatenate([tpos[py], chk[0]])
    ln = np.concatenate([tlen[py], chk[1]])
    tag = np.concatenate([ttype[py] * 4 + enc_by_row[py_row], enc_by_row[chk_row]])
    row_of = np.concatenate([py_row, chk_row])
    rep, inv = V.raw_groups(data, pos, ln, tag)
    mv = memoryview(data)  # type: ignore[arg-type]
    results = [
        _v2_cell(mv[p : p + m].tobytes(), g)
        for p, m, g in zip(pos[rep].tolist(), ln[rep].tolist(), tag[rep].tolist(), strict=True)
    ]
    bad = np.fromiter((r is _V2_FAIL for r in results), np.bool_, len(results))
    if bad.any():
        return (cidx, np.zeros(1, np.int64), np.zeros(1, np.uint8)), set(row_of[bad[inv]].tolist())
    null = np.fromiter((r is None for r in results), np.bool_, len(results))
    texts = [b"" if r is None else r for r in results]
    c_off = np.fromiter(itertools.accumulate(map(len, texts), initial=0), np.int64, len(texts) + 1)
    joined = b"".join(texts)
    c_buf = np.frombuffer(joined, np.uint8) if joined else np.zeros(1, np.uint8)
    g_py = inv[: len(py)]
    cidx[py] = g_py
    if null.any():
        tkind[py[null[g_py]]] = V.T_NULL
    return (cidx, c_off, c_buf), set()


def _v2_table(
    data: npt.NDArray[np.uint8],
    rec: I64,
    comp: CompiledRegistry,
    msg_keys: pa.Array,
    c: _V2Cands,
    ints: I64,
    i_ok: npt.NDArray[np.bool_],
    flts: I64,
    f_ok: npt.NDArray[np.bool_],
    tkind: npt.NDArray[np.int8],
    tpos: I64,
    tlen: I64,
    texts_py: tuple[I64, I64, npt.NDArray[np.uint8]],
) -> pa.Table:
    """The ``COMPACT_SCHEMA`` table of the v2 kernel's records (identity, index key, lists)."""
    n = rec.shape[1]
    i32, i64 = pa.int32(), pa.int64()

    def offsets(row: int, total: int) -> pa.Buffer:
        return pa.py_buffer(np.append(rec[row], total).astype(np.int32))

    def listed(off: pa.Buffer, v: npt.NDArray[Any], ok: npt.NDArray[np.bool_], t: pa.DataType) -> pa.Array:  # fmt: skip
        nulls = int(ok.size - np.count_nonzero(ok))
        child = pa.Array.from_buffers(
            t, ok.size, [_bitmap(ok) if nulls else None, pa.py_buffer(v)], nulls
        )
        return pa.ListArray.from_buffers(pa.list_(t), n, [None, off], children=[child])

    ints_a = listed(offsets(V.W_IOFF, len(ints)), ints, i_ok, i64)
    floats_a = listed(offsets(V.W_FOFF, len(flts)), flts.view(np.float64), f_ok, pa.float64())
    cidx, c_off, c_buf = texts_py
    o, buf = V.v2_text_values(data, tkind, tpos, tlen, cidx, c_off, c_buf, K.hex_digits())
    t_valid = tkind != V.T_NULL
    t_nulls = int(t_valid.size - np.count_nonzero(t_valid))
    # Arrow's UTF-8 check (fast) on all of it; replaced text, if any, makes the index keys
    t_arr = _string(o, buf, _bitmap(t_valid) if t_nulls else None, t_nulls)
    texts_a = pa.ListArray.from_buffers(
        pa.list_(pa.string()), n, [None, offsets(V.W_TOFF, len(tkind))], children=[t_arr]
    )
    ta_off, ta_buf = _string_buffers(t_arr)
    schema_of = np.ascontiguousarray(rec[V.W_SCHEMA])
    k_off, k_buf, k_ok, slow = K.index_keys(
        schema_of, np.ascontiguousarray(rec[V.W_TOFF]), ta_off, ta_buf, t_valid,
        comp.ix_off, comp.ix_text,
    )  # fmt: skip
    k_nulls = int(n - np.count_nonzero(k_ok))
    key = _string(k_off, k_buf, _bitmap(k_ok) if k_nulls else None, k_nulls, check=False)
    if slow.any():
        key = _slow_index_keys(key, slow, schema_of, ints_a, floats_a, texts_a, comp)

    def text(pos_row: int, len_row: int, empty_if: I64) -> pa.Array:
        so, sb, ok = V.gather_texts(
            data, np.ascontiguousarray(rec[pos_row]), np.ascontiguousarray(rec[len_row]), empty_if
        )
        nulls = int(n - np.count_nonzero(ok))
        return _string(so, sb, _bitmap(ok) if nulls else None, nulls)

    has_oid = np.ascontiguousarray(rec[V.W_HAS_OID])
    agent_name = text(V.W_AN_POS, V.W_AN_LEN, np.zeros(n, np.int64))
    object_name = text(V.W_ON_POS, V.W_ON_LEN, has_oid)
    msg = np.ascontiguousarray(rec[V.W_MSG])
    take = _indices(msg)
    ag_off, ag_buf, ag_ok = V.agent_texts(
        msg, c.agent_pos, c.agent_len, c.agent_buf, data,
        np.ascontiguousarray(rec[V.W_AN_POS]), np.ascontiguousarray(rec[V.W_AN_LEN]),
    )  # fmt: skip
    ag_nulls = int(n - np.count_nonzero(ag_ok))
    agent = _string(ag_off, ag_buf, _bitmap(ag_ok) if ag_nulls else None, ag_nulls)
    epoch_ok = rec[V.W_EPOCH_OK] != 0
    e_nulls = int(n - np.count_nonzero(epoch_ok))
    cols: dict[str, Any] = {
        "msg_key": msg_keys.take(take),
        "record_index": _prim(rec[V.W_IDX].astype(np.int32), i32, None, 0),
        "dialect": _const_str("V2", n),
        "opcode": _V2_OPCODE_NAMES.take(_indices(c.opcode[msg])),
        "seq": _prim(np.zeros(n, np.int64), i64, None, 0),
        "agent": agent,
        **_class_columns(comp, schema_of),
        "update_ns": _prim(np.ascontiguousarray(rec[V.W_UPDATE]), i64, None, 0),
        "create_ns": _prim(np.ascontiguousarray(rec[V.W_CREATE]), i64, None, 0),
        "delete_ns": _prim(np.ascontiguousarray(rec[V.W_DELETE]), i64, None, 0),
        "boot_seq": pa.nulls(n, i32),
        "bank": pa.nulls(n, i32),
        "flags": pa.nulls(n, pa.int8()),
        "epoch": _prim(
            np.ascontiguousarray(rec[V.W_EPOCH]),
            i64,
            _bitmap(epoch_ok) if e_nulls else None,
            e_nulls,
        ),
        "broker_bank": pa.nulls(n, i32),
        "agent_bank": pa.nulls(n, i32),
        "object_num": pa.nulls(n, i64),
        "agent_name": agent_name,
        "object_name": object_name,
        "index_key": key,
        SLOT_INTS: ints_a,
        SLOT_FLOATS: floats_a,
        SLOT_TEXTS: texts_a,
    }
    return pa.Table.from_arrays([cols[name] for name in COMPACT_NAMES], schema=COMPACT_SCHEMA)
