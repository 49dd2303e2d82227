"""The registry compiled into the flat arrays the numba kernels read, and the walk
that splits a batch's bodies into records with them (``pipeline.codec.vectorized``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pipeline.codec import _kernels as K
from pipeline.codec import _v2kernels as V
from pipeline.codec.layout import I64, SLOT_TEXTS, sample_schema, slot_kind
from pipeline.codec.schema import KIND_TABLE, ClassSchema, SchemaKey, SchemaRegistry

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
