"""Arrow-vectorized decoding of v1 content records (c/i/g) into Arrow tables.

Two layouts: per-class wide tables (one column per element), or with
``compact=True`` one table for every class with the values in typed lists
(silver's ``object_samples``; see "compact layout" below).

Why: the per-record codec costs microseconds per record in Python, and the
bronze table holds millions of statistics records. Here a numba kernel
(``_kernels.walk``) walks the raw ``body`` buffers of a whole Arrow batch and
splits the concatenated records with the schemas (v1 records carry no
lengths); ``_kernels.fill`` then decodes each class's values column-major, and
the Arrow columns are built from those arrays: no Python loop per record
(only non-empty maps/lists go through the codec, once per distinct encoding).
See docs/performance.md for the design and the figures.

What goes where (one call, ``decode_content``):

* messages made only of AM1/AM2 c/i/g records of known classes: decoded by
  the kernel;
* with ``compact=True``, QMF v2 ``_data`` indications (AMQP 0-10 lists and
  AMQP 1.0 ``amqp-value`` lists) of known classes: decoded by the v2 kernel
  (``_v2kernels``; see "QMF v2 data indications" below);
* every other message (other QMF v2, events, heartbeats, schema traffic, unknown
  schema, truncated or otherwise bad bytes, type 20 values, ...): decoded
  *whole* by the per-record path (``pipeline.codec.message``), never record by
  record, so the result is the same as if the per-record path had done all of
  it. Its object samples are converted with ``records_to_table`` into the same
  per-class tables; its other records are returned in ``others``; its errors
  become quarantine rows (the good records before an error are still kept).

Column types are Spark-friendly: unsigned integers widen to the next signed
type (uint64 stays int64: the bit pattern, values >= 2**63 read negative),
times are int64 ns, strings are UTF-8 (invalid bytes replaced by U+FFFD),
uuids canonical text, object references their text form (``str`` of the
codec's object id), maps and lists JSON text (``to_json``).
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pipeline.codec import _kernels as K
from pipeline.codec import _v2kernels as V
from pipeline.codec.schema import KIND_TABLE, ClassSchema, Element, SchemaKey, SchemaRegistry
from schemas.tables import CONTENT_QUARANTINE, OBJECT_SAMPLE_IDENTITY

I64 = npt.NDArray[np.int64]

# ------------------------------------------------------------------ table layout

#: Columns every object-sample table starts with, then one column per
#: property and statistic in schema order.
IDENTITY_FIELDS: tuple[pa.Field, ...] = tuple(OBJECT_SAMPLE_IDENTITY)
IDENTITY_NAMES = frozenset(f.name for f in IDENTITY_FIELDS)

_INT_TYPES: dict[int, pa.DataType] = {
    1: pa.int16(),
    2: pa.int32(),
    3: pa.int64(),
    4: pa.int64(),
    8: pa.int64(),
    9: pa.int64(),
    16: pa.int8(),
    17: pa.int16(),
    18: pa.int32(),
    19: pa.int64(),
}
_TEXT_TYPES = frozenset({6, 7, 10, 14, 15, 20, 21, 22})


def arrow_type(type_code: int) -> pa.DataType:
    """Arrow type of a QMF element column (see the module docstring)."""
    hit = _ARROW_OF.get(type_code)
    if hit is not None:
        return hit
    if type_code in _INT_TYPES:
        return _INT_TYPES[type_code]
    if type_code == 11:
        return pa.bool_()
    if type_code == 12:
        return pa.float32()
    if type_code == 13:
        return pa.float64()
    if type_code in _TEXT_TYPES:
        return pa.string()
    raise ValueError(f"no column type for QMF type code {type_code}")


_ARROW_OF: dict[int, pa.DataType] = {}
for _t in range(1, 23):
    if _t != 5:
        _ARROW_OF[_t] = arrow_type(_t)
_NUMPY_OF: dict[int, Any] = {
    t: a.to_pandas_dtype() for t, a in _ARROW_OF.items() if t in _INT_TYPES
}


def column_name(name: str) -> str:
    """Element column name; a clash with an identity column gets a ``_value`` suffix."""
    return f"{name}_value" if name in IDENTITY_NAMES else name


def sample_schema(schema: ClassSchema) -> pa.Schema:
    """The fixed Arrow schema of one class's object-sample table."""
    fields = list(IDENTITY_FIELDS)
    seen = set(IDENTITY_NAMES)
    for e in (*schema.properties, *schema.statistics):
        name = column_name(e.name)
        if name in seen:
            raise ValueError(f"{schema.key}: duplicate element column {name!r}")
        seen.add(name)
        fields.append(pa.field(name, arrow_type(e.type_code)))
    return pa.schema(fields, metadata={"qmf_class": str(schema.key)})


QUARANTINE_SCHEMA = CONTENT_QUARANTINE


# --------------------------------------------------------- Python value -> cell


def to_json(value: Any) -> str:
    """Stable JSON text of a decoded map/list value (sorted keys, bytes as base64 text)."""
    return json.dumps(_jsonable(value), sort_keys=True, separators=(",", ":"), allow_nan=True)


def _jsonable(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, bytes | bytearray | memoryview):
        return "base64:" + base64.b64encode(bytes(v)).decode("ascii")
    if v is None or isinstance(v, bool | int | float | str):
        return v
    return str(v)


def _text(v: Any) -> str:
    if isinstance(v, bytes | bytearray):
        return bytes(v).decode("utf-8", "replace")
    return str(v)


def _signed(v: int, bits: int) -> int:
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


def cell(type_code: int, value: Any) -> Any:
    """A per-record decoded value as it appears in the wide table (the oracle's view)."""
    if value is None:
        return None
    if type_code in (4, 8, 9, 19):
        return _signed(int(value), 64)
    if type_code in _INT_TYPES or type_code == 11:
        return bool(value) if type_code == 11 else int(value)
    if type_code == 12:
        return float(np.float32(value))
    if type_code == 13:
        return float(value)
    if type_code in (6, 7):
        return _text(value)
    if type_code == 14:
        return str(value if isinstance(value, uuid.UUID) else uuid.UUID(bytes=bytes(value)))
    if type_code in (15, 21, 22):
        return to_json(value)
    if type_code == 10 and isinstance(value, Mapping):  # QMF v2 object id map
        return to_json(value)
    return str(value)


# ------------------------------------------------------------ compiled registry


@dataclass(frozen=True)
class CompiledRegistry:
    """The registry as flat numpy arrays the kernel can search and follow."""

    schemas: tuple[ClassSchema, ...]
    index: dict[SchemaKey, int]
    hash_hi: npt.NDArray[np.uint64]
    hash_lo: npt.NDArray[np.uint64]
    names: npt.NDArray[np.uint8]
    name_off: I64
    p_start: I64
    p_count: I64
    s_start: I64
    s_count: I64
    n_opt: I64
    el_kind: I64
    el_bit: I64  # presence bit of optional properties, -1 otherwise
    run_len: I64  # elements in the run of plain fixed-size values starting here (0: none)
    run_bytes: I64  # encoded bytes of that run
    u64run: I64  # mandatory 8-byte values in a row from here, within the group (0: other)
    out_schemas: tuple[pa.Schema, ...]  # sample_schema of each class
    # The compact layout, for every class at once (``_compact_all``):
    el_type: I64  # QMF type code per element
    el_slot: npt.NDArray[np.int8]  # 0: ints, 1: floats, 2: texts (``slot_kind``)
    n_slots: I64  # (schema, 3): elements per typed list
    ix_off: I64  # schema k's index properties: ix_*[ix_off[k]:ix_off[k + 1]]
    ix_text: I64  # an index property's position in its class's text list, -1: not a text
    ix_el: I64  # its position among the class's elements
    ix_pos: I64  # its position in its class's typed list (``el_slot``)
    # QMF v2 (``_v2kernels``): values arrive by name, so per element its name,
    # class and position in its typed list, and a hash table (class, name) -> element.
    el_lpos: I64
    el_schema: I64
    el_names: npt.NDArray[np.uint8]
    el_name_off: I64
    name_table: I64
    hash16: npt.NDArray[np.bool_]  # the class key's hash is 16 bytes (v2 hashes are uuids)
    # package, class_name and schema_hash, one row per schema: records' columns are a take
    names_by_index: pa.RecordBatch | None = None


_PLAIN_SIZE = {1: 1, 2: 2, 3: 4, 4: 8, 8: 8, 9: 8, 12: 4, 13: 8, 16: 1, 17: 2, 18: 4, 19: 8}


def _runs(
    types: list[int], bits: list[int], groups: list[tuple[int, int]]
) -> tuple[list[int], list[int]]:
    """Per element, the run of plain fixed-size mandatory values it starts (within its group).

    Such values need no look at all when splitting records (no presence bit,
    no length, no boolean check), so the split pass steps over a run at once.
    """
    run_len = [0] * len(types)
    run_bytes = [0] * len(types)
    for start, count in groups:
        n, size = 0, 0
        for e in range(start + count - 1, start - 1, -1):
            plain = types[e] in _PLAIN_SIZE and bits[e] < 0
            if plain:
                n += 1
                size += _PLAIN_SIZE[types[e]]
                run_len[e], run_bytes[e] = n, size
            else:
                n, size = 0, 0
    return run_len, run_bytes


def _u64_runs(types: list[int], bits: list[int], groups: list[tuple[int, int]]) -> list[int]:
    """Per element, how many mandatory 8-byte values follow in a row (itself included)."""
    out = [0] * len(types)
    for start, count in groups:
        n = 0
        for e in range(start + count - 1, start - 1, -1):
            n = n + 1 if _PLAIN_SIZE.get(types[e]) == 8 and bits[e] < 0 else 0
            out[e] = n
    return out


_COMPILED: dict[tuple[int, ...], CompiledRegistry] = {}
_SLOT_NUMBER = {"ints": 0, "floats": 1, "texts": 2}


def _compact_tables_of(schemas: Sequence[ClassSchema], el_type: list[int]) -> dict[str, Any]:
    """The compiled registry's tables for the one-pass compact build."""
    slots = [_SLOT_NUMBER[slot_kind(t)] for t in el_type]
    n_slots = np.zeros((max(len(schemas), 1), 3), np.int64)
    ix_off, ix_text, ix_el, ix_pos = [0], [], [], []
    el_lpos: list[int] = []
    el_schema: list[int] = []
    el_names = bytearray()
    el_name_off = [0]
    for k, s in enumerate(schemas):
        elements = (*s.properties, *s.statistics)
        list_pos: list[int] = []
        for e, v2_name in zip(elements, s.v2_names, strict=True):
            j = _SLOT_NUMBER[slot_kind(e.type_code)]
            list_pos.append(int(n_slots[k, j]))
            n_slots[k, j] += 1
            el_schema.append(k)
            el_names += v2_name.encode()  # the v2 kernel looks `_values` keys up here
            el_name_off.append(len(el_names))
        el_lpos += list_pos
        for i, p in enumerate(s.properties):
            if p.index:
                text = slot_kind(p.type_code) == SLOT_TEXTS
                ix_text.append(list_pos[i] if text else -1)
                ix_el.append(i)
                ix_pos.append(list_pos[i])
        ix_off.append(len(ix_el))
    names_arr = (
        np.frombuffer(bytes(el_names), np.uint8).copy() if el_names else np.zeros(1, np.uint8)
    )
    name_off = np.array(el_name_off, np.int64)
    schema_of = np.array(el_schema, np.int64)
    size = 1 << max(4, (2 * len(el_schema)).bit_length())
    return {
        "el_lpos": np.array(el_lpos or [0], np.int64),
        "el_schema": schema_of,
        "el_names": names_arr,
        "el_name_off": name_off,
        "name_table": V.name_table(names_arr, name_off, schema_of, size),
        "hash16": np.array([len(s.key.hash) == 16 for s in schemas] or [False], np.bool_),
        "el_type": np.array(el_type or [0], np.int64),
        "el_slot": np.array(slots or [0], np.int8),
        "n_slots": n_slots,
        "ix_off": np.array(ix_off, np.int64),
        "ix_text": np.array(ix_text or [-1], np.int64),
        "ix_el": np.array(ix_el or [0], np.int64),
        "ix_pos": np.array(ix_pos or [0], np.int64),
    }


def compile_registry(registry: SchemaRegistry | Iterable[ClassSchema]) -> CompiledRegistry:
    """Flatten the table classes of a registry (cached on the identity of its schemas).

    The cache holds the schemas it compiled, so an id in a key cannot be reused
    by another object while the entry lives; registry copies share the objects.
    """
    if isinstance(registry, SchemaRegistry):  # unchanged since its last batch: that result
        last = registry.derived.get(_DERIVED_KEY)
        if last is not None and last[0] == registry.generation:
            return last[1]  # type: ignore[no-any-return]
    schemas = tuple(s for s in registry if s.kind == KIND_TABLE)
    keys = tuple(map(id, schemas))
    hit = _COMPILED.get(keys)
    if hit is not None:
        _remember(registry, hit)
        return hit
    hi, lo, names, name_off = [], [], bytearray(), [0]
    p_start: list[int] = []
    p_count: list[int] = []
    s_start: list[int] = []
    s_count: list[int] = []
    n_oct: list[int] = []
    el_type: list[int] = []
    el_bit: list[int] = []
    for s in schemas:
        h = s.key.hash.ljust(16, b"\0")[:16]
        hi.append(int.from_bytes(h[:8], "big"))
        lo.append(int.from_bytes(h[8:], "big"))
        names += s.key.package.encode()
        name_off.append(len(names))
        names += s.key.name.encode()
        name_off.append(len(names))
        p_start.append(len(el_type))
        p_count.append(len(s.properties))
        bit = 0
        for e in s.properties:
            el_type.append(e.type_code)
            el_bit.append(bit if e.optional else -1)
            bit += 1 if e.optional else 0
        n_oct.append(bit)
        s_start.append(len(el_type))
        s_count.append(len(s.statistics))
        for e in s.statistics:
            el_type.append(e.type_code)
            el_bit.append(-1)
    groups = [*zip(p_start, p_count, strict=True), *zip(s_start, s_count, strict=True)]
    run_len, run_bytes = _runs(el_type, el_bit, groups)
    u64run = _u64_runs(el_type, el_bit, groups)
    # name_off = [0, pkg0 end, cls0 end, pkg1 end, ...]: schema k's package is
    # names[off[2k]:off[2k+1]] and its class names[off[2k+1]:off[2k+2]].
    i64 = np.int64
    out = CompiledRegistry(
        schemas=schemas,
        index={s.key: i for i, s in enumerate(schemas)},
        hash_hi=np.array(hi, dtype=np.uint64),
        hash_lo=np.array(lo, dtype=np.uint64),
        names=np.frombuffer(bytes(names), dtype=np.uint8).copy()
        if names
        else np.zeros(1, np.uint8),
        name_off=np.array(name_off, dtype=i64),
        p_start=np.array(p_start, dtype=i64),
        p_count=np.array(p_count, dtype=i64),
        s_start=np.array(s_start, dtype=i64),
        s_count=np.array(s_count, dtype=i64),
        n_opt=np.array(n_oct, dtype=i64),
        el_kind=np.array([K.element_kind(t) for t in el_type] or [0], dtype=i64),
        el_bit=np.array(el_bit or [-1], dtype=i64),
        run_len=np.array(run_len or [0], dtype=i64),
        run_bytes=np.array(run_bytes or [0], dtype=i64),
        u64run=np.array(u64run or [0], dtype=i64),
        out_schemas=tuple(sample_schema(s) for s in schemas),
        **_compact_tables_of(schemas, el_type),
        names_by_index=pa.record_batch(
            {
                "package": pa.array([s.key.package for s in schemas], pa.string()),
                "class_name": pa.array([s.key.name for s in schemas], pa.string()),
                "schema_hash": pa.array([s.key.hash for s in schemas], pa.binary()),
            }
        ),
    )
    if len(_COMPILED) > 64:
        _COMPILED.clear()
    _COMPILED[keys] = out
    _remember(registry, out)
    return out


_DERIVED_KEY = "vectorized.compile_registry"


def _remember(registry: SchemaRegistry | Iterable[ClassSchema], comp: CompiledRegistry) -> None:
    """Keep ``comp`` on a ``SchemaRegistry`` for its current generation (a batch's fast path)."""
    if isinstance(registry, SchemaRegistry):
        registry.derived[_DERIVED_KEY] = (registry.generation, comp)


# ------------------------------------------------------------------- results


@dataclass
class ContentResult:
    """What ``decode_content`` returns for one batch.

    ``samples``: one wide table per class (only classes that occurred); empty with
    ``compact=True``, where ``table`` holds every class's samples in one
    ``COMPACT_SCHEMA`` table, in input order (``class_tables`` splits it).
    ``quarantine``: messages the codec could not decode fully (msg_key, reason, body).
    ``others``: (msg_key, record) of the non-content records, from the per-record path;
    ``other_index``: each one's position in its message (parallel to ``others``).
    ``fast_messages`` / ``fallback_messages``: how each message was decoded
    (``v2_messages`` of the fast ones were QMF v2 data indications).
    """

    samples: dict[SchemaKey, pa.Table]
    quarantine: pa.Table
    others: list[tuple[str, Any]] = field(default_factory=list)
    fast_messages: int = 0
    fallback_messages: int = 0
    fallback_reasons: dict[str, int] = field(default_factory=dict)
    other_index: list[int] = field(default_factory=list)
    table: pa.Table | None = None
    v2_messages: int = 0  # QMF v2 data indications decoded by the v2 kernel (compact only)

    def class_tables(self) -> dict[SchemaKey, pa.Table]:
        """Object samples per class: ``samples``, or the compact ``table`` split by class."""
        if self.table is None:
            return self.samples
        t = self.table
        keys = list(
            zip(
                t.column("package").to_pylist(),
                t.column("class_name").to_pylist(),
                t.column("schema_hash").to_pylist(),
                strict=True,
            )
        )
        rows: dict[SchemaKey, list[int]] = {}
        for i, k in enumerate(keys):
            rows.setdefault(SchemaKey(*k), []).append(i)
        return {k: t.take(pa.array(v, pa.int64())) for k, v in rows.items()}


# ------------------------------------------------------------------ the walk


def _body_buffers(body: pa.Array) -> tuple[npt.NDArray[np.uint8], I64]:
    """Zero-copy (data, offsets) of a binary / large_binary Arrow array."""
    if pa.types.is_binary(body.type) or pa.types.is_string(body.type):
        odt: Any = np.int32
    elif pa.types.is_large_binary(body.type) or pa.types.is_large_string(body.type):
        odt = np.int64
    else:
        raise TypeError(f"body must be binary, got {body.type}")
    bufs = body.buffers()
    n = len(body)
    offs = np.frombuffer(bufs[1], dtype=odt)[body.offset : body.offset + n + 1].astype(np.int64)
    data = (
        np.frombuffer(bufs[2], dtype=np.uint8)
        if bufs[2] is not None and bufs[2].size
        else np.zeros(1, dtype=np.uint8)
    )
    return data, offs


@dataclass
class _Walk:
    rec: I64
    status: npt.NDArray[np.uint8]
    errpos: I64
    data: npt.NDArray[np.uint8]


def _walk(body: pa.Array, comp: CompiledRegistry) -> _Walk:
    data, offs = _body_buffers(body)
    rec, nrec, status, errpos = K.walk(
        data,
        offs,
        comp.hash_hi,
        comp.hash_lo,
        comp.names,
        comp.name_off,
        comp.p_start,
        comp.p_count,
        comp.s_start,
        comp.s_count,
        comp.n_opt,
        comp.el_kind,
        comp.el_bit,
        comp.run_len,
        comp.run_bytes,
    )
    if body.null_count:
        status[np.asarray(body.is_null())] = K.ST_NOT_V1
    return _Walk(rec[:, :nrec], status, errpos, data)


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
    return pa.Array.from_buffers(_ARROW_OF[t], n, [vb, pa.py_buffer(arr)], nulls)


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


# ------------------------------------------------------------ compact layout
#
# One table for every class: the identity columns, the index key, then the
# element values in three typed lists (``ints``: integers, booleans as 0/1,
# times; ``floats``: float and double; ``texts``: every text column above),
# each in schema order (properties, then statistics). An element's position
# in its list is its *slot* (``slots``). Built for the records of all classes
# at once (``_compact_all``): kernels write the lists, format the texts and
# build the index keys, so no Python or Arrow call is made per class or element.

SLOT_INTS = "ints"
SLOT_FLOATS = "floats"
SLOT_TEXTS = "texts"
_FLOAT_CODES = frozenset({12, 13})


def slot_kind(type_code: int) -> str:
    """The typed list that holds values of this QMF type in the compact layout."""
    if type_code in _FLOAT_CODES:
        return SLOT_FLOATS
    if type_code in _TEXT_TYPES:
        return SLOT_TEXTS
    return SLOT_INTS


COMPACT_SCHEMA = pa.schema(
    [
        *IDENTITY_FIELDS,
        pa.field("index_key", pa.string()),
        pa.field(SLOT_INTS, pa.list_(pa.int64())),
        pa.field(SLOT_FLOATS, pa.list_(pa.float64())),
        pa.field(SLOT_TEXTS, pa.list_(pa.string())),
    ]
)


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
    b"_data_indication", b"_query_response", b"_data", b"amqp-1.0",
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
    return pa.Table.from_arrays([cols[name] for name in _COMPACT_NAMES], schema=COMPACT_SCHEMA)


# ------------------------------------------------------------ per-record path

PerRecord = Callable[[bytes, SchemaRegistry, Mapping[str, Any]], tuple[list[Any], list[Any]]]


def per_record_decode(
    body: bytes, registry: SchemaRegistry, meta: Mapping[str, Any]
) -> tuple[list[Any], list[Any]]:
    """Decode one whole message with the pure codec: (records, problems)."""
    from pipeline.codec.message import decode_message

    res = decode_message(
        body,
        registry=registry,
        application_properties=meta.get("application_properties"),
        content_type=meta.get("content_type"),
        app_id=meta.get("app_id"),
        routing_key=meta.get("routing_key"),
    )
    return list(res.records), list(res.problems)


def _am1_agent_of(routing_key: Any) -> str | None:
    from pipeline.codec.message import routing_agent

    return routing_agent(routing_key if isinstance(routing_key, str) else None)


def _is_sample(r: Any) -> bool:
    return getattr(r, "kind", None) == "object"


def _sample_tables(
    samples: Mapping[SchemaKey, list[tuple[str, int, Any]]], registry: SchemaRegistry
) -> dict[SchemaKey, pa.Table] | str:
    """One message's samples as one wide table per class, or why they cannot be rows.

    A value whose type does not fit its element (text in an integer statistic, a
    uuid that is not 16 bytes) would make ``records_to_table`` raise for the whole
    batch; the message is quarantined instead, with its raw bytes."""
    out: dict[SchemaKey, pa.Table] = {}
    for sk, items in samples.items():
        schema = registry.get(sk)
        assert schema is not None
        try:
            out[sk] = records_to_table(items, schema)
        except (ValueError, TypeError, OverflowError, pa.ArrowException) as exc:
            return f"ValueRejected: {sk.package}:{sk.name}: {type(exc).__name__}: {exc}"
    return out


def records_to_table(items: Iterable[tuple[str, int, Any]], schema: ClassSchema) -> pa.Table:
    """Per-record object samples (msg_key, record_index, record) of one class -> its wide table.

    This is also the oracle's conversion: the vectorized tables must equal it.
    """
    out_schema = sample_schema(schema)
    types = [
        (column_name(e.name), e.name, e.type_code) for e in (*schema.properties, *schema.statistics)
    ]
    v2_names = schema.v2_names
    rows: list[dict[str, Any]] = []
    for msg_key, index, r in items:
        row = r.row()
        row.pop("kind", None)
        values = row.pop("values") or {}
        row["msg_key"] = msg_key
        row["record_index"] = index
        for c in ("update_ns", "create_ns", "delete_ns", "object_num", "epoch"):
            row[c] = None if row[c] is None else _signed(int(row[c]), 64)
        v2 = row.get("dialect") == "V2"
        for (col, name, t), v2_name in zip(types, v2_names, strict=True):
            row[col] = cell(t, values.get(v2_name if v2 else name))
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=out_schema)


# ------------------------------------------------------------------ entry points


def _agent_am1(routing_keys: pa.Array | None, rows: I64, n: int) -> list[str | None]:
    if routing_keys is None:
        return [None] * n
    return [_am1_agent_of(k) for k in routing_keys.take(pa.array(rows)).to_pylist()]


# Columns read as one Arrow array (others are read per fallback message, any chunking).
_ONE_CHUNK = ("body", "msg_key", "routing_key")


def decode_content(
    batch: pa.RecordBatch | pa.Table,
    registry: SchemaRegistry,
    *,
    per_record: PerRecord | None = None,
    compact: bool = False,
    v2_kernel: bool = True,
) -> ContentResult:
    """Decode the object samples of a batch of raw messages (see the module docstring).

    ``batch`` needs a binary ``body`` column; ``msg_key`` (else the row number)
    and ``routing_key`` / ``app_id`` / ``content_type`` /
    ``application_properties`` are used when present. Output rows are in
    input order (message row, then record index). As in the per-record codec,
    schema responses met in fallback messages are added to ``registry``, and
    content after its schema decodes, content before it does not.
    ``per_record`` replaces the per-message decoder (tests, instrumentation).
    ``compact=True``: every class's table has ``COMPACT_SCHEMA`` (identity,
    index key, typed value lists in slot order) instead of one column per element;
    then QMF v2 data indications are decoded by the v2 kernel too, unless
    ``v2_kernel=False`` (the per-record path for them: tests' and benchmarks' baseline).

    A batch that brings schemas for content later in it (a console that starts
    with its agents, a backlog) is cut after each message that adds a schema
    some later content lacks, and each part is walked with the registry as it
    stands there: that content stays on the kernels instead of going to the
    per-record path (see "schemas met in the batch" in docs/performance.md).
    """
    table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
    names = table.column_names
    if any(table.column(c).num_chunks > 1 for c in _ONE_CHUNK if c in names):
        table = table.combine_chunks()
    if "msg_key" not in names:  # the row number, kept across the parts of a cut batch
        keys = pa.array(np.arange(table.num_rows).astype(str).astype(object), pa.string())
        table = table.append_column("msg_key", keys)
    decode_one = per_record or per_record_decode
    whole = _Walked(table, registry, compact, v2_kernel)
    done: dict[int, _Decoded] = {}  # per-record results found by the look-ahead, by row
    cuts = _schema_cuts(whole, registry, decode_one, done)
    if not cuts:
        return _finish(whole, registry, decode_one, done, 0)
    parts = []
    for a, b in itertools.pairwise([0, *cuts, table.num_rows]):
        part = _Walked(table.slice(a, b - a), registry, compact, v2_kernel)
        parts.append(_finish(part, registry, decode_one, done, a))
    return _joined(parts)


_Decoded = tuple[int, list[Any], list[Any]]  # registry generation before, records, problems


class _Walked:
    """One batch (or part of one) walked by the kernels with the registry as it stands:
    what they decoded, and which messages go to the per-record path and why."""

    def __init__(
        self, table: pa.Table, registry: SchemaRegistry, compact: bool, v2_kernel: bool
    ) -> None:
        self.table, self.compact = table, compact
        n = table.num_rows

        def single(name: str, t: pa.DataType) -> pa.Array:
            col = table.column(name)
            arr = col.chunk(0) if col.num_chunks else pa.array([], t)
            return arr if arr.type == t or t == pa.binary() else arr.cast(t)

        self.body = body = single("body", pa.binary())
        self.msg_keys = msg_keys = single("msg_key", pa.string())
        names = table.column_names
        rkeys = single("routing_key", pa.string()) if "routing_key" in names else None
        self.comp = comp = compile_registry(registry)
        self.w = w = _walk_parallel(body, comp)
        self.ctx = _Ctx(w, comp, msg_keys, rkeys)
        self.n = n
        fallback: set[int] = (
            set(np.flatnonzero(w.status != K.ST_OK).tolist()) if w.status.any() else set()
        )
        # Messages the kernels left for want of a schema: a schema met earlier in
        # the batch may serve them (``_schema_cuts``).
        self.unknown: set[int] = set(np.flatnonzero(w.status == K.ST_UNKNOWN_SCHEMA).tolist())
        reasons: dict[str, int] = {}
        self.v2_part: tuple[pa.Table, I64] | None = None
        self.v2_ok: set[int] = set()
        v2_failed: dict[str, int] = {}
        if compact and v2_kernel and fallback:
            cands = _v2_candidates(table, body)
            if cands is not None:
                self.v2_part, self.v2_ok, v2_failed, v2_unknown = _v2_decode(
                    table, body, comp, msg_keys, cands
                )
                fallback -= self.v2_ok
                self.unknown |= v2_unknown
                for name, count in v2_failed.items():
                    reasons[name] = reasons.get(name, 0) + count
        for m in fallback:
            name = K.STATUS_NAMES[int(w.status[m])]
            reasons[name] = reasons.get(name, 0) + 1
        if self.v2_part is not None and v2_failed:  # v2 failures were counted by their own reasons
            reasons["not AM1/AM2"] -= sum(v2_failed.values())
            if not reasons["not AM1/AM2"]:
                del reasons["not AM1/AM2"]
        self.fallback, self.reasons = fallback, reasons

    def meta(self, m: int) -> dict[str, Any]:
        """Message ``m``'s properties as the per-record codec takes them."""
        names = self.table.column_names
        meta = {c: self.table.column(c)[m].as_py() for c in MESSAGE_COLUMNS if c in names}
        if isinstance(meta.get("application_properties"), list):  # Arrow map -> pairs
            meta["application_properties"] = dict(meta["application_properties"])
        return meta


# The message properties the per-record path reads besides ``body`` (callers pass them on).
MESSAGE_COLUMNS = ("routing_key", "app_id", "content_type", "application_properties")


def _schema_cuts(
    whole: _Walked, registry: SchemaRegistry, decode_one: PerRecord, done: dict[int, _Decoded]
) -> list[int]:
    """Rows to cut the batch before: each just after a message that adds a schema, when
    content the kernels left for want of a schema follows it (before the next such cut).

    The per-record messages before the last such content are decoded here in
    order, on a copy of the registry, to see which ones add schemas; their
    results are kept in ``done`` for ``_finish``, so none is decoded twice.
    """
    if not whole.unknown or len(whole.fallback) == len(whole.unknown):
        return []
    last = max(whole.unknown)
    scratch = registry.copy()
    grew: list[int] = []
    for m in sorted(whole.fallback - whole.unknown):
        if m > last:
            break
        gen = scratch.generation
        recs, problems = decode_one(whole.body[m].as_py() or b"", scratch, whole.meta(m))
        done[m] = (gen, recs, problems)
        if scratch.generation != gen:
            grew.append(m)
    if not grew:
        return []
    unknown = np.array(sorted(whole.unknown), np.int64)
    ends = [*grew[1:], whole.n]
    return [
        g + 1
        for g, nxt in zip(grew, ends, strict=True)
        if np.any((unknown > g) & (unknown < nxt))
    ]


def _finish(
    walked: _Walked,
    registry: SchemaRegistry,
    decode_one: PerRecord,
    done: dict[int, _Decoded],
    first_row: int,
) -> ContentResult:
    """The class tables of what the kernels took, then the per-record messages in order.

    ``done`` holds per-record results found ahead (``_schema_cuts``) by batch row
    (``first_row`` is this part's first): one is used when the registry stands
    where it stood then (the schemas it added are added again); any other change
    of the registry drops them all.
    """
    ctx, comp, compact = walked.ctx, walked.comp, walked.compact
    body, msg_keys, fallback = walked.body, walked.msg_keys, walked.fallback
    reasons = dict(walked.reasons)
    # Build every class table; a container value the codec rejects sends its
    # message to the per-record path, and the build runs once more without it
    # (bounded: the second pass only has records that passed the first).
    tables: dict[SchemaKey, list[tuple[pa.Table, I64]]] = {}
    whole: list[tuple[pa.Table, I64]] = []  # compact: every class's kernel rows, one table
    rec = walked.w.rec
    for _attempt in range(2):
        tables, whole = {}, []
        late: set[int] = set()
        if rec.shape[1] and compact:
            chunks = _in_parallel(lambda r: _compact_chunk(ctx, r), _split_records(rec))
            for _, bad in chunks:
                late |= bad
            if not late:
                whole = [(_concat([t for t, _ in chunks]), rec[K.R_MSG])]
        elif rec.shape[1]:
            ks = rec[K.R_SCHEMA]
            subs: list[I64] = [rec]  # one class: use the matrix as it is, no copy
            if not (ks == ks[0]).all():
                # One kernel pass: each class's records as a contiguous matrix.
                flat, starts = K.group_records(rec, len(comp.schemas))
                nf = rec.shape[0]
                subs = [
                    flat[nf * a : nf * b].reshape(nf, b - a)
                    for a, b in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True)
                    if b > a
                ]
            for sub in subs:
                schema = comp.schemas[int(sub[K.R_SCHEMA, 0])]
                tbl, failed = _class_table(ctx, sub, schema)
                if tbl is not None and not failed.any():
                    tables[schema.key] = [(tbl, sub[K.R_MSG])]
                if failed.any():
                    late |= set(sub[K.R_MSG][failed].tolist())
        if not late:
            break
        reasons["container value rejected"] = len(late)
        fallback = fallback | late
        rec = np.ascontiguousarray(
            rec[:, ~np.isin(rec[K.R_MSG], np.array(sorted(late), dtype=np.int64))]
        )

    quarantine: list[dict[str, Any]] = []
    others: list[tuple[str, Any]] = []
    other_index: list[int] = []
    per_class: dict[SchemaKey, list[pa.Table]] = {}
    fb_rows: dict[SchemaKey, list[int]] = {}
    for m in sorted(fallback):
        key = msg_keys[m].as_py()
        raw = body[m].as_py() or b""
        ahead = done.pop(first_row + m, None)
        gen = registry.generation
        if ahead is not None and ahead[0] == gen:
            _, recs, problems = ahead
            for r in recs:  # what decoding it added to the copy, added here too
                if isinstance(getattr(r, "schema", None), ClassSchema):
                    registry.add(r.schema)
        else:
            recs, problems = decode_one(raw, registry, walked.meta(m))
            if registry.generation != gen:
                done.clear()  # the registry took another way than the look-ahead's copy
        mine: dict[SchemaKey, list[tuple[str, int, Any]]] = {}
        for i, r in enumerate(recs):
            if _is_sample(r):
                sk = SchemaKey(r.package, r.class_name, r.schema_hash)
                if sk in registry:
                    mine.setdefault(sk, []).append((key, i, r))
        converted = _sample_tables(mine, registry)
        if isinstance(converted, str):  # the whole message to quarantine, as a codec problem
            quarantine.append({"msg_key": key, "reason": converted, "offset": None, "body": raw})
            continue
        for sk, part in converted.items():
            per_class.setdefault(sk, []).append(part)
            fb_rows.setdefault(sk, []).extend([m] * part.num_rows)
        for i, r in enumerate(recs):
            if not (_is_sample(r) and SchemaKey(r.package, r.class_name, r.schema_hash) in mine):
                others.append((key, r))
                other_index.append(i)
        for p in problems:
            quarantine.append(
                {
                    "msg_key": key,
                    "reason": f"{p.error}: {p.message}",
                    "offset": getattr(p, "offset", None),
                    "body": raw,
                }
            )
    if walked.v2_part is not None and walked.v2_part[0].num_rows:
        whole.append(walked.v2_part)
    for sk, parts in per_class.items():
        sch = registry.get(sk)
        assert sch is not None
        rows = np.array(fb_rows[sk], np.int64)
        wide = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        if compact:
            whole.append((wide_to_compact(wide, sch), rows))
        else:
            tables.setdefault(sk, []).append((wide, rows))
    return ContentResult(
        samples={k: _in_input_order(v) for k, v in tables.items()},
        table=(_in_input_order(whole) if whole else COMPACT_SCHEMA.empty_table())
        if compact
        else None,
        quarantine=pa.Table.from_pylist(quarantine, schema=QUARANTINE_SCHEMA)
        if quarantine
        else _NO_QUARANTINE,
        others=others,
        fast_messages=walked.n - len(fallback),
        fallback_messages=len(fallback),
        fallback_reasons=reasons,
        other_index=other_index,
        v2_messages=len(walked.v2_ok),
    )


def _joined(parts: list[ContentResult]) -> ContentResult:
    """The results of a cut batch's parts (in batch order) as one."""
    samples: dict[SchemaKey, list[pa.Table]] = {}
    reasons: dict[str, int] = {}
    for p in parts:
        for k, t in p.samples.items():
            samples.setdefault(k, []).append(t)
        for name, c in p.fallback_reasons.items():
            reasons[name] = reasons.get(name, 0) + c
    quarantine = [p.quarantine for p in parts if p.quarantine.num_rows]
    tables = [p.table for p in parts if p.table is not None]
    return ContentResult(
        samples={k: pa.concat_tables(v) for k, v in samples.items()},
        table=pa.concat_tables(tables) if tables else None,
        quarantine=pa.concat_tables(quarantine) if quarantine else _NO_QUARANTINE,
        others=[o for p in parts for o in p.others],
        fast_messages=sum(p.fast_messages for p in parts),
        fallback_messages=sum(p.fallback_messages for p in parts),
        fallback_reasons=reasons,
        other_index=[i for p in parts for i in p.other_index],
        v2_messages=sum(p.v2_messages for p in parts),
    )


# Large batches are decoded by several threads (the kernels release the GIL):
# records per chunk (about 256 body bytes each), and the most threads used
# (``QMF_DECODE_THREADS``: Spark's Python workers get their task's cores,
# pipeline.spark.TASK_THREAD_ENV).
PARALLEL_RECORDS = 50_000


def decode_threads(value: str | None, cores: int | None) -> int:
    """The most decode threads: ``QMF_DECODE_THREADS`` if set (a whole number >= 1),
    else the cores, at most 4."""
    if not value:
        return max(1, min(4, cores or 1))
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"QMF_DECODE_THREADS={value!r}: expected a whole number >= 1")
    return n


DECODE_THREADS = decode_threads(os.environ.get("QMF_DECODE_THREADS"), os.cpu_count())
_POOL: list[ThreadPoolExecutor] = []
_T = TypeVar("_T")
_R = TypeVar("_R")


def _in_parallel(fn: Callable[[_T], _R], items: list[_T]) -> list[_R]:
    """``fn(item)`` for each item, on the decode threads when there are several."""
    if len(items) == 1:
        return [fn(items[0])]
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(DECODE_THREADS, thread_name_prefix="qmf-decode"))
    return list(_POOL[0].map(fn, items))


def _ranges(n: int, parts: int) -> list[tuple[int, int]]:
    bounds = np.linspace(0, n, max(1, parts) + 1).astype(np.int64).tolist()
    return list(itertools.pairwise(bounds))


def _split_records(rec: I64) -> list[I64]:
    """The record matrix in column chunks, one per decode thread (one if small)."""
    parts = min(DECODE_THREADS, rec.shape[1] // PARALLEL_RECORDS)
    if parts <= 1:
        return [rec]
    return [rec[:, a:b] for a, b in _ranges(rec.shape[1], parts)]  # views: no copy


def _compact_chunk(ctx: _Ctx, rec: I64) -> tuple[pa.Table | None, set[int]]:
    """One chunk of records as a ``COMPACT_SCHEMA`` table, or the messages that failed."""
    vals, failed = _compact_all(ctx, rec)
    if vals is None:
        return None, set(rec[K.R_MSG][failed].tolist())
    cols: dict[str, Any] = _identity(ctx, rec, None)
    cols.update(vals)
    return pa.Table.from_arrays([cols[c] for c in _COMPACT_NAMES], schema=COMPACT_SCHEMA), set()


def _concat(tables: list[pa.Table | None]) -> pa.Table:
    ts = [t for t in tables if t is not None]
    return ts[0] if len(ts) == 1 else pa.concat_tables(ts)  # chunked: no copy


def _walk_parallel(body: pa.Array, comp: CompiledRegistry) -> _Walk:
    """``_walk`` over message ranges on the decode threads, for batches of many bytes."""
    data = body.buffers()[2] if len(body) else None
    size = data.size if data is not None else 0
    parts = min(DECODE_THREADS, len(body), size // (PARALLEL_RECORDS * 256))
    if parts <= 1:
        return _walk(body, comp)
    ranges = _ranges(len(body), parts)
    walks = _in_parallel(lambda ab: _walk(body.slice(ab[0], ab[1] - ab[0]), comp), ranges)
    for wk, (a, _) in zip(walks, ranges, strict=True):
        wk.rec[K.R_MSG] += a
    return _Walk(
        np.concatenate([wk.rec for wk in walks], axis=1),
        np.concatenate([wk.status for wk in walks]),
        np.concatenate([wk.errpos for wk in walks]),
        walks[0].data,
    )


_COMPACT_NAMES = tuple(COMPACT_SCHEMA.names)
_NO_QUARANTINE = QUARANTINE_SCHEMA.empty_table()  # Arrow tables are immutable: one serves all


def _in_input_order(parts: list[tuple[pa.Table, I64]]) -> pa.Table:
    """Kernel rows and fallback rows of one class, merged in (message row, record index) order."""
    if len(parts) == 1:
        return parts[0][0]
    t = pa.concat_tables([p for p, _ in parts])
    rows = np.concatenate([r for _, r in parts])
    idx = np.asarray(t.column("record_index").to_numpy(), np.int64)
    return t.take(pa.array(np.lexsort((idx, rows))))


def tune_malloc(keep_bytes: int = 1 << 30) -> bool:
    """Keep freed memory in glibc's heap so each batch's output does not page-fault afresh.

    Large numpy arrays are mmap'ed by glibc and unmapped when freed, so every
    batch's columns (tens of MB) arrive as fresh pages: in measurements a
    third of the decode time went to minor page faults. Raising the mmap and
    trim thresholds lets glibc reuse the memory instead. Threads get arenas of
    their own, which serve blocks over 64 MB by mmap whatever the threshold,
    so the arenas are also limited to one; glibc fixes that limit when a second
    thread first allocates, so only ``MALLOC_ARENA_MAX=1`` in the environment
    is sure to apply it (with it, a 500,000-record batch on two threads:
    decode 0.2 -> 0.12 s, the batch into Delta 0.51 -> 0.46 s). It is
    process-wide, so it is opt-in (benchmarks, Spark workers); same effect as
    the ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` /
    ``MALLOC_TOP_PAD_`` / ``MALLOC_ARENA_MAX`` environment variables.
    Returns False where glibc's ``mallopt`` is missing.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_top_pad, m_mmap_threshold, m_arena_max = -1, -2, -3, -8
    cap = min(keep_bytes, (1 << 31) - 1)
    results = [
        mallopt(m_mmap_threshold, cap),
        mallopt(m_trim_threshold, cap),
        mallopt(m_top_pad, min(cap, 1 << 29)),
        mallopt(m_arena_max, 1),
    ]
    return all(int(r) == 1 for r in results)


def arrow_mapper(
    registry: SchemaRegistry, class_key: SchemaKey
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function: raw-message batches -> one class's sample batches.

    Every yielded batch has ``sample_schema(registry.get(class_key))``, as
    Spark requires; batches without samples of the class yield nothing.
    """
    if registry.get(class_key) is None:
        raise KeyError(f"no schema for {class_key}")
    # Only the schemas travel to the workers: a live registry caches decode
    # plans (struct.Struct objects), which do not pickle.
    schemas = tuple(registry)

    def mapper(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        reg = SchemaRegistry(schemas)
        for b in batches:
            t = decode_content(b, reg).samples.get(class_key)
            if t is not None and t.num_rows:
                yield from t.to_batches()

    return mapper
