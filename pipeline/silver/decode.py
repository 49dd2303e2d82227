"""Bronze rows -> silver tables: the vectorized decode, its Spark wrapper, and wide views.

``decode_arrow`` is the whole decode of a batch of bronze rows, pure Arrow:
``pipeline.codec.vectorized.decode_content`` (numba over the raw bodies; the
per-record codec only for what the kernel does not take), then each output
is shaped into its silver table (``schemas.silver``). No Python runs per
object sample: the per-class wide tables of ``decode_content`` are packed into
the positional ``ints``/``floats``/``texts`` lists with a few Arrow calls per
class. Events, heartbeats and method responses (a few per message at most)
are built from the codec's records.

What is not decoded goes somewhere, never nowhere:

* a message that needs a schema the registry lacks is *parked* whole (v1
  records carry no lengths, so nothing after the unknown record can be split;
  its records decode together once the schema arrives);
* any other codec problem puts the message into *quarantine* (reason, error
  offset, raw body), while the records decoded before the problem are kept.

``decode_arrow`` is what a Spark task of ``pipeline.silver.tasks`` runs over its
bronze files (``run_task``) or its partition of bronze rows (``run_dataframe``,
through ``mapInArrow``), and what the driver runs for a small batch: one code path,
so the tables are the same wherever it runs.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.codec.layout import to_json
from pipeline.codec.records import (
    Event,
    Heartbeat,
    MethodRequest,
    MethodResponse,
    QmfException,
    SchemaResponse,
)
from pipeline.codec.schema import SchemaKey, SchemaRegistry
from pipeline.codec.types import Am1ObjectId, Am2ObjectId
from pipeline.codec.vectorized import MESSAGE_COLUMNS, decode_content
from pipeline.silver.registry import StatisticKinds, registry_row, rows_table, schema_from_row
from schemas.silver import (
    EVENTS,
    HEARTBEATS,
    METHOD_CALLS,
    METHOD_RESPONSES,
    OBJECT_SAMPLES,
    PARKED,
    QUARANTINE,
    SCHEMA_REGISTRY,
)
from schemas.tables import TS

# Output names of ``decode_arrow`` (silver tables, plus the schemas met).
SAMPLES = "object_samples"
EVENTS_T = "events"
HEARTBEATS_T = "heartbeats"
METHODS_T = "method_responses"
QUARANTINE_T = "quarantine"
PARKED_T = "parked"
SEEN_T = "seen_schemas"  # registry rows (SCHEMA_REGISTRY) of schema records met
# v1 'M'/'m' halves of method calls (METHOD_CALLS rows, untyped): the driver pairs and
# types them (``pipeline.silver.MethodCallTable``), across batches.
CALL_PARTS_T = "method_call_parts"
OUTPUT_SCHEMAS: dict[str, pa.Schema] = {
    SAMPLES: OBJECT_SAMPLES,
    EVENTS_T: EVENTS,
    HEARTBEATS_T: HEARTBEATS,
    METHODS_T: METHOD_RESPONSES,
    QUARANTINE_T: QUARANTINE,
    PARKED_T: PARKED,
    SEEN_T: SCHEMA_REGISTRY,
    CALL_PARTS_T: METHOD_CALLS,
}
ENVELOPE = pa.schema(
    [
        pa.field("table", pa.string(), nullable=False),
        pa.field("rows", pa.int64(), nullable=False),
        pa.field("payload", pa.binary(), nullable=False),
    ]
)
_MISSING = re.compile(r"no schema for (?P<pkg>[^:]*):(?P<cls>.*)\((?P<h>[0-9a-f]*)\) at offset")
_EMPTY_I64 = np.zeros(0, np.int64)


def missing_key(text: str) -> SchemaKey | None:
    """The schema key a ``MissingSchema`` problem names (``pkg:class(hex)``)."""
    m = _MISSING.search(text)
    if m is None:
        return None
    return SchemaKey(m["pkg"], m["cls"], bytes.fromhex(m["h"]))


def key_text(key: SchemaKey) -> str:
    return f"{key.package}:{key.name}({key.hash.hex()})"


def parse_key_text(text: str) -> SchemaKey:
    pkg, _, rest = text.partition(":")
    name, _, h = rest.rpartition("(")
    return SchemaKey(pkg, name, bytes.fromhex(h.rstrip(")")))


# ---------------------------------------------------------------- time columns


def ns_to_timestamp(ns: pa.Array | pa.ChunkedArray) -> pa.Array:
    """QMF ns times -> UTC microsecond timestamps (floor); 0 ("not set") and null -> null."""
    arr = ns.combine_chunks() if isinstance(ns, pa.ChunkedArray) else ns
    vals = np.asarray(pc.fill_null(arr, 0).to_numpy(zero_copy_only=False), np.int64)
    mask = vals == 0
    return pa.array(vals // 1000, type=TS, mask=mask if mask.any() else None)


# ---------------------------------------------------------------- sample packing

_DERIVED = (
    "partition", "offset", "batch_id", "broker_name", "msg_key", "update_time", "create_time",
    "delete_time",
)  # fmt: skip


def pack_samples(
    compact: Sequence[pa.Table], meta_cols: Mapping[str, pa.Array], batch_id: int
) -> pa.Table:
    """Per-class compact tables (``COMPACT_SCHEMA``; ``msg_key`` = bronze row) -> OBJECT_SAMPLES.

    All classes share one schema, so this is one concatenation, then the
    bronze identity and the timestamps, built once per batch.
    """
    t = pa.concat_tables(compact) if len(compact) > 1 else compact[0]
    rows = pc.cast(t.column("msg_key"), pa.int64())
    cols: dict[str, Any] = {
        "partition": meta_cols["partition"].take(rows),
        "offset": meta_cols["offset"].take(rows),
        "batch_id": pa.array(np.full(t.num_rows, batch_id, np.int64)),
        "broker_name": meta_cols["broker_name"].take(rows),
        "msg_key": meta_cols["msg_key"].take(rows),
    }
    for name in ("update", "create", "delete"):
        cols[f"{name}_time"] = ns_to_timestamp(t.column(f"{name}_ns"))
    return pa.table(
        [cols[c] if c in _DERIVED else t.column(c) for c in OBJECT_SAMPLES.names],
        schema=OBJECT_SAMPLES,
    )


# ---------------------------------------------------------------- the decode


@dataclass
class Decoded:
    """Silver rows of one batch by output name (``OUTPUT_SCHEMAS``), plus decode statistics."""

    tables: dict[str, pa.Table] = field(default_factory=dict)
    fast_messages: int = 0
    fallback_messages: int = 0

    def get(self, name: str) -> pa.Table:
        t = self.tables.get(name)
        return OUTPUT_SCHEMAS[name].empty_table() if t is None else t

    @staticmethod
    def concat(parts: Iterable[Decoded]) -> Decoded:
        out = Decoded()
        by: dict[str, list[pa.Table]] = {}
        for d in parts:
            out.fast_messages += d.fast_messages
            out.fallback_messages += d.fallback_messages
            for k, t in d.tables.items():
                by.setdefault(k, []).append(t)
        out.tables = {k: pa.concat_tables(v) for k, v in by.items()}
        return out


def _column(table: pa.Table, name: str, n: int, t: pa.DataType) -> pa.Array:
    if name in table.column_names:
        return table.column(name).combine_chunks()
    return pa.nulls(n, t)


def _text(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, bytes | bytearray):
        return bytes(v).decode("utf-8", "replace")
    return str(v)


def _ns(v: Any) -> int | None:
    if v is None:
        return None
    u = int(v) & 0xFFFFFFFFFFFFFFFF
    return u - (1 << 64) if u >> 63 else u


def _ts_py(ns: int | None) -> int | None:
    return None if not ns else ns // 1000


def call_id(partition: str, offset: int, index: int) -> str:
    """The ``method_calls`` key of a call: its request's record identity (or its response's)."""
    return f"{partition}:{offset}:{index}"


def object_id_bytes(oid: Any) -> bytes | None:
    """A v1 object id as on the wire (AM1 8 bytes, AM2 16), so it can be rebuilt exactly."""
    if isinstance(oid, Am1ObjectId):
        return int(oid.to_int()).to_bytes(8, "big")
    if isinstance(oid, Am2ObjectId):
        return int(oid.first()).to_bytes(8, "big") + int(oid.object_num).to_bytes(8, "big")
    return None


def call_part(
    r: MethodRequest | MethodResponse,
    ident: Mapping[str, Any],
    batch_id: int,
    at: Any,
    agent: str | None,
) -> dict[str, Any]:
    """One half of a v1 method call as a METHOD_CALLS row (untyped; raw arguments kept)."""
    p, o, i = ident["partition"], ident["offset"], ident["record_index"]
    row: dict[str, Any] = {
        "call_id": call_id(p, o, i), "dialect": r.dialect, "seq": r.seq, "batch_id": batch_id,
        "broker_name": ident["broker_name"],
    }  # fmt: skip
    if isinstance(r, MethodRequest):
        row |= {
            "request_batch": batch_id, "request_partition": p, "request_offset": o,
            "request_index": i, "request_at": at, "object_id": str(r.object_id),
            "object_id_raw": object_id_bytes(r.object_id), "package": r.package,
            "class_name": r.class_name, "schema_hash": r.schema_hash,
            "method_name": r.method_name, "raw_in": bytes(r.raw_arguments),
        }  # fmt: skip
    else:
        row |= {
            "response_partition": p, "response_offset": o, "response_index": i,
            "response_at": at, "agent": agent, "status": r.status, "text": _text(r.text),
            "raw_out": bytes(r.raw_arguments),
        }  # fmt: skip
    return row


class _Meta:
    """Per-row bronze values the record builders need (read lazily, per touched row)."""

    def __init__(self, bronze: pa.Table) -> None:
        n = bronze.num_rows
        self.partition = _column(bronze, "partition", n, pa.string())
        self.offset = _column(bronze, "offset", n, pa.int64())
        self.broker_name = _column(bronze, "broker_name", n, pa.string())
        self.msg_key = _column(bronze, "msg_key", n, pa.string())
        self.received_at = _column(bronze, "received_at", n, TS)
        self.routing_key = _column(bronze, "routing_key", n, pa.string())
        self.correlation_id = _column(bronze, "correlation_id", n, pa.string())
        self.app_props = _column(
            bronze, "application_properties", n, pa.map_(pa.string(), pa.string())
        )
        self._cache: dict[str, list[Any]] = {}

    def py(self, name: str) -> list[Any]:
        hit = self._cache.get(name)
        if hit is None:
            hit = getattr(self, name).to_pylist()
            self._cache[name] = hit
        return hit

    def agent(self, row: int) -> str | None:
        """The agent a message came from, when the record does not say (schema records)."""
        props = self.py("app_props")[row]
        if props:
            for k, v in props:
                if k == "qmf.agent":
                    return str(v)
        from pipeline.codec.message import routing_agent

        rk = self.py("routing_key")[row]
        return routing_agent(rk if isinstance(rk, str) else None)

    def ident(self, row: int, index: int) -> dict[str, Any]:
        return {
            "partition": self.py("partition")[row],
            "offset": self.py("offset")[row],
            "record_index": index,
            "broker_name": self.py("broker_name")[row],
        }


_I64 = (-(1 << 63), (1 << 63) - 1)


def typed_arguments(args: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """An event's arguments split by type into three typed maps (queryable without JSON).

    Integers within int64 and booleans (1/0) go to ``arg_ints``, floats to
    ``arg_floats``, everything else (text, ids, uuids, larger integers, maps,
    lists) to ``arg_texts`` as text: maps and lists as JSON, bytes as
    ``base64:...`` (as in the JSON), other values (ids, uuids) as ``str()``.
    ``arguments`` keeps the whole map as JSON besides.
    """
    ints: dict[str, int] = {}
    floats: dict[str, float] = {}
    texts: dict[str, str] = {}
    for k, v in (args or {}).items():
        name = str(k)
        if isinstance(v, bool):
            ints[name] = int(v)
        elif isinstance(v, int) and _I64[0] <= v <= _I64[1]:
            ints[name] = v
        elif isinstance(v, float):
            floats[name] = v
        elif isinstance(v, str):
            texts[name] = v
        elif isinstance(v, bytes | bytearray | memoryview):
            texts[name] = "base64:" + base64.b64encode(bytes(v)).decode("ascii")
        elif isinstance(v, Mapping | list | tuple):
            texts[name] = to_json(v)
        elif v is not None:
            texts[name] = str(v)
    return {"arg_ints": ints, "arg_floats": floats, "arg_texts": texts}


def decode_arrow(
    bronze: pa.Table | pa.RecordBatch,
    registry: SchemaRegistry,
    batch_id: int,
    kinds: StatisticKinds | None = None,
) -> Decoded:
    """Decode bronze rows (columns by name; needs partition, offset, msg_key, received_at, body).

    ``registry`` gains the schemas met in the batch (as in the codec), so
    content after its schema in the same batch decodes.
    """
    table = bronze if isinstance(bronze, pa.Table) else pa.Table.from_batches([bronze])
    table = table.combine_chunks()
    n = table.num_rows
    out = Decoded()
    if n == 0:
        return out
    meta = _Meta(table)
    inp = {
        "body": table.column("body"),
        "msg_key": pa.array(np.arange(n).astype(str).astype(object), pa.string()),
    }
    for c in MESSAGE_COLUMNS:
        if c in table.column_names:
            inp[c] = table.column(c)
    res = decode_content(pa.table(inp), registry, compact=True)
    out.fast_messages, out.fallback_messages = res.fast_messages, res.fallback_messages

    # Messages to park (a schema is missing), and the quarantine (other problems).
    parked: dict[int, SchemaKey] = {}
    problems: list[tuple[int, str, int | None]] = []
    q = res.quarantine
    for key, reason, off in zip(
        q.column("msg_key").to_pylist(),
        q.column("reason").to_pylist(),
        q.column("offset").to_pylist(),
        strict=True,
    ):
        row = int(key)
        mk = missing_key(reason) if reason.startswith("MissingSchema") else None
        if mk is not None:
            parked.setdefault(row, mk)
        else:
            problems.append((row, reason, off))
    for key, r in res.others:
        if getattr(r, "kind", None) == "object":  # QMF v2 data of an unknown class
            parked.setdefault(int(key), SchemaKey(r.package, r.class_name, r.schema_hash))
    park_rows = np.array(sorted(parked), np.int64) if parked else _EMPTY_I64

    # Object samples: every class in one compact table, minus parked messages.
    good_per_row: dict[int, int] = {}
    samples = res.table
    if samples is not None and samples.num_rows and (len(park_rows) or problems):
        rows = np.asarray(pc.cast(samples.column("msg_key"), pa.int64()).to_numpy(), np.int64)
        if len(park_rows):
            keep = ~np.isin(rows, park_rows)
            if not keep.all():
                samples = samples.filter(pa.array(keep))
                rows = rows[keep]
        if problems:
            for r_ in rows.tolist():
                good_per_row[r_] = good_per_row.get(r_, 0) + 1
    if samples is not None and samples.num_rows:
        meta_cols = {"partition": meta.partition, "offset": meta.offset, "msg_key": meta.msg_key,
                     "broker_name": meta.broker_name}  # fmt: skip
        out.tables[SAMPLES] = pack_samples([samples], meta_cols, batch_id)

    events: list[dict[str, Any]] = []
    beats: list[dict[str, Any]] = []
    methods: list[dict[str, Any]] = []
    call_parts: list[dict[str, Any]] = []
    seen: list[dict[str, Any]] = []
    for (key, r), idx in zip(res.others, res.other_index, strict=True):
        row = int(key)
        if row in parked:
            continue
        if problems:
            good_per_row[row] = good_per_row.get(row, 0) + 1
        if isinstance(r, Event):
            ns = _ns(r.timestamp_ns)
            events.append({
                **meta.ident(row, idx), "batch_id": batch_id, "dialect": r.dialect,
                "seq": r.seq, "agent": r.agent, "package": r.package,
                "event_name": r.event_name, "schema_hash": r.schema_hash,
                "severity": r.severity, "timestamp_ns": ns, "event_time": _ts_py(ns),
                "arguments": to_json(r.arguments or {}), **typed_arguments(r.arguments),
            })  # fmt: skip
        elif isinstance(r, Heartbeat):
            ns = _ns(r.timestamp_ns)
            beats.append({
                **meta.ident(row, idx), "batch_id": batch_id, "dialect": r.dialect,
                "seq": r.seq, "agent": r.agent or meta.agent(row), "timestamp_ns": ns,
                "heartbeat_time": _ts_py(ns),
                "attributes": None if r.attributes is None else to_json(r.attributes),
            })  # fmt: skip
        if isinstance(r, MethodRequest | MethodResponse) and r.dialect != "V2":
            call_parts.append(
                call_part(
                    r, meta.ident(row, idx), batch_id, meta.py("received_at")[row],
                    None if isinstance(r, MethodRequest) else meta.agent(row),
                )
            )  # fmt: skip
        if isinstance(r, MethodResponse | QmfException):
            args: Any
            raw: bytes | None = None
            if isinstance(r, QmfException):
                kind, status, args = "exception", r.code, r.values
            else:
                kind, status, args = "method_response", r.status, r.arguments
                raw = bytes(r.raw_arguments) or None
            methods.append({
                **meta.ident(row, idx), "batch_id": batch_id, "kind": kind,
                "dialect": r.dialect, "seq": r.seq,
                "correlation_id": meta.py("correlation_id")[row],
                "routing_key": meta.py("routing_key")[row],
                "agent": getattr(r, "agent", None) or meta.agent(row),
                "status": status, "text": _text(r.text),
                "arguments": None if args is None else to_json(args),
                "raw_arguments": raw, "received_at": meta.py("received_at")[row],
            })  # fmt: skip
        elif isinstance(r, SchemaResponse):
            at = meta.py("received_at")[row]
            seen.append(
                registry_row(
                    r.schema, kinds or _kinds(), first_seen=at, source_agent=meta.agent(row)
                )
            )
    if events:
        out.tables[EVENTS_T] = pa.Table.from_pylist(events, schema=EVENTS)
    if beats:
        out.tables[HEARTBEATS_T] = pa.Table.from_pylist(beats, schema=HEARTBEATS)
    if methods:
        out.tables[METHODS_T] = pa.Table.from_pylist(methods, schema=METHOD_RESPONSES)
    if call_parts:
        out.tables[CALL_PARTS_T] = pa.Table.from_pylist(call_parts, schema=METHOD_CALLS)
    if seen:
        out.tables[SEEN_T] = rows_table(seen)
    if problems:
        quarantine = []
        for row, reason, off in problems:
            error, _, _msg = reason.partition(":")
            quarantine.append({
                "partition": meta.py("partition")[row], "offset": meta.py("offset")[row],
                "batch_id": batch_id, "broker_name": meta.py("broker_name")[row],
                "msg_key": meta.py("msg_key")[row],
                "record_index": good_per_row.get(row, 0), "error": error, "reason": reason,
                "error_offset": off, "first_seen": meta.py("received_at")[row],
                "body": table.column("body")[row].as_py() or b"",
            })  # fmt: skip
        out.tables[QUARANTINE_T] = pa.Table.from_pylist(quarantine, schema=QUARANTINE)
    if parked:
        take = pa.array(park_rows)
        sub = table.take(take)
        cols: dict[str, Any] = {
            "partition": meta.partition.take(take),
            "offset": meta.offset.take(take),
            "batch_id": pa.array(np.full(len(park_rows), batch_id, np.int64)),
            "msg_key": meta.msg_key.take(take),
            "received_at": meta.received_at.take(take),
            "missing": pa.array([key_text(parked[int(r_)]) for r_ in park_rows], pa.string()),
        }
        for f in PARKED:
            if f.name not in cols:
                cols[f.name] = _column(sub, f.name, len(park_rows), f.type)
        out.tables[PARKED_T] = pa.table(cols).select(PARKED.names).cast(PARKED)
    return out


def with_batch_schemas(registry: SchemaRegistry, decoded: Decoded) -> tuple[SchemaRegistry, int]:
    """A copy of ``registry`` with the schemas the batch met, and how many of them were new."""
    ext = registry.copy()
    new = 0
    for r in decoded.get(SEEN_T).to_pylist():
        s = schema_from_row(r)
        if s.key not in ext:
            new += 1
            ext.add(s)
    return ext, new


def decode_parked_again(
    decoded: Decoded, ext: SchemaRegistry, batch_id: int, kinds: StatisticKinds | None
) -> Decoded | None:
    """The batch's parked messages whose schema ``ext`` has now (one its batch brought),
    decoded; ``decoded``'s parked table keeps only the others. None when there are none.

    For a batch decoded in one piece (the driver path, a backfill); the task path
    does this in a second job (``tasks.resolve_task``).
    """
    waiting = decoded.get(PARKED_T)
    if not waiting.num_rows:
        return None
    known = np.array([parse_key_text(m) in ext for m in waiting.column("missing").to_pylist()])
    if not known.any():
        return None
    decoded.tables[PARKED_T] = waiting.filter(pa.array(~known))
    return decode_arrow(waiting.filter(pa.array(known)), ext.copy(), batch_id, kinds)


_KINDS: StatisticKinds | None = None


def _kinds() -> StatisticKinds:
    global _KINDS
    if _KINDS is None:
        _KINDS = StatisticKinds.load()
    return _KINDS
