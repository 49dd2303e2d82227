"""Arrow-vectorized decoding of v1 content records (c/i/g) into Arrow tables.

Two layouts: per-class wide tables (one column per element), or with
``compact=True`` one table for every class with the values in typed lists
(silver's ``object_samples``; ``pipeline.codec.layout``).

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
  (``_v2kernels``; ``_v2batch``);
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

The module is the entry point and the orchestration (``decode_content``: walk,
schema cuts, class tables, per-record fallback, threads, ``arrow_mapper``).
The rest is split by role:

* ``layout``: the column types, cells and the compact schema (public, shared
  with silver);
* ``_compiled``: the registry compiled into the kernels' flat arrays, and the walk;
* ``_columns``: Arrow columns and tables from the kernels' arrays;
* ``_v2batch``: the QMF v2 fast path (candidates, walk, compact table).

The three underscored modules are internal to the codec: they share underscored
names with each other and with this module, and nothing outside imports them.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from pipeline.codec import _kernels as K
from pipeline.codec._columns import _class_table, _compact_all, _Ctx, _identity, wide_to_compact
from pipeline.codec._compiled import CompiledRegistry, _Walk, _walk, compile_registry
from pipeline.codec._v2batch import _v2_candidates, _v2_decode
from pipeline.codec.layout import (
    COMPACT_NAMES,
    COMPACT_SCHEMA,
    I64,
    QUARANTINE_SCHEMA,
    cell,
    column_name,
    sample_schema,
    signed_int,
)
from pipeline.codec.schema import ClassSchema, SchemaKey, SchemaRegistry

__all__ = [
    "DECODE_THREADS",
    "MESSAGE_COLUMNS",
    "PARALLEL_RECORDS",
    "ContentResult",
    "arrow_mapper",
    "compile_registry",
    "decode_content",
    "decode_threads",
    "per_record_decode",
    "records_to_table",
    "tune_malloc",
    "wide_to_compact",
]



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
            row[c] = None if row[c] is None else signed_int(int(row[c]), 64)
        v2 = row.get("dialect") == "V2"
        for (col, name, t), v2_name in zip(types, v2_names, strict=True):
            row[col] = cell(t, values.get(v2_name if v2 else name))
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=out_schema)


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
    per-record path (see "schemas met in the batch" in docs/performance-log.md).
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
        g + 1 for g, nxt in zip(grew, ends, strict=True) if np.any((unknown > g) & (unknown < nxt))
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
    return pa.Table.from_arrays([cols[c] for c in COMPACT_NAMES], schema=COMPACT_SCHEMA), set()


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
