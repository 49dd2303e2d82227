"""The schema registry table: every class schema seen (or seeded), with statistic kinds.

Decoding v1 content needs the class schema (records carry no lengths), and
the rate job needs to know what a statistic *means* (a counter's rate is a
delta, a gauge's is not). The registry is a Delta table (``schemas.silver.
SCHEMA_REGISTRY``), one row per (package, class, hash, kind), seeded from
qpid's management schema XML (``pipeline.qmfxml``: the same hashes qpidd
sends, so known classes decode from the first message) and grown from schema
records on the wire (v1 's', QMF v2 ``_schema_class``).

This module is pure Arrow over ``pipeline.lake.delta``: row builders
(``registry_row``, ``seed_table``, ``wire_table``), the statistic kinds (``StatisticKinds``), the
inverse (``schema_from_row``) and ``RegistryTable``, which loads the table
into a codec ``SchemaRegistry`` as it was *before* a given micro-batch, so a
replayed batch decodes exactly as the first attempt did.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from pipeline.codec.layout import SLOT_FLOATS, SLOT_INTS, SLOT_TEXTS, slot_kind
from pipeline.codec.schema import (
    KIND_EVENT,
    ClassSchema,
    Element,
    Method,
    SchemaKey,
    SchemaRegistry,
)
from pipeline.qmfxml import (
    COUNTER,
    GAUGE,
    MMA_AVERAGE,
    MMA_MAX,
    MMA_MIN,
    MMA_SAMPLES,
    NUMERIC_CODES,
    STATE,
    WATERMARK,
    WATERMARK_HIGH,
    WATERMARK_LOW,
    ManagementSchema,
    default_schema,
)
from schemas.silver import SCHEMA_REGISTRY

# Statistic kinds of the registry (what the rate job reads).
KIND_COUNTER = "counter"
KIND_GAUGE = "gauge"
KIND_WM_HIGH = "watermark_high"
KIND_WM_LOW = "watermark_low"
KIND_MMA_SAMPLES = "mma_samples"
KIND_MMA_MIN = "mma_min"
KIND_MMA_MAX = "mma_max"
KIND_MMA_AVERAGE = "mma_average"
KIND_TEXT = "text"
STATISTIC_KINDS = frozenset(
    {
        KIND_COUNTER,
        KIND_GAUGE,
        KIND_WM_HIGH,
        KIND_WM_LOW,
        KIND_MMA_SAMPLES,
        KIND_MMA_MIN,
        KIND_MMA_MAX,
        KIND_MMA_AVERAGE,
        KIND_TEXT,
    }
)

# qmfxml's kinds -> registry kinds. The current value of a ``hilo`` statistic
# is a level (gauge); its High/Low companions are the interval's extremes.
_FROM_XML: Mapping[str, str] = {
    COUNTER: KIND_COUNTER,
    GAUGE: KIND_GAUGE,
    WATERMARK: KIND_GAUGE,
    WATERMARK_HIGH: KIND_WM_HIGH,
    WATERMARK_LOW: KIND_WM_LOW,
    MMA_SAMPLES: KIND_MMA_SAMPLES,
    MMA_MIN: KIND_MMA_MIN,
    MMA_MAX: KIND_MMA_MAX,
    MMA_AVERAGE: KIND_MMA_AVERAGE,
    STATE: KIND_TEXT,
}

DEFAULT_KINDS_FILE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "schemas", "statistic_kinds.toml"
)

TABLE = "table"
EVENT = "event"
SEED = "seed"
WIRE = "wire"

# Where an element's value goes in object_samples: the codec's compact layout
# (SLOT_INTS, SLOT_FLOATS, SLOT_TEXTS, slot_kind).


def slots(schema: ClassSchema) -> list[tuple[str, int]]:
    """(slot kind, position) of each property then statistic, in schema order."""
    counts = {SLOT_INTS: 0, SLOT_FLOATS: 0, SLOT_TEXTS: 0}
    out: list[tuple[str, int]] = []
    for e in (*schema.properties, *schema.statistics):
        k = slot_kind(e.type_code)
        out.append((k, counts[k]))
        counts[k] += 1
    return out


def slot_counts(schema: ClassSchema) -> tuple[int, int, int]:
    """Lengths of the ints, floats and texts lists of one class's samples."""
    kinds = [slot_kind(e.type_code) for e in (*schema.properties, *schema.statistics)]
    return kinds.count(SLOT_INTS), kinds.count(SLOT_FLOATS), kinds.count(SLOT_TEXTS)


# ------------------------------------------------------------- statistic kinds


@dataclass(frozen=True)
class StatisticKinds:
    """Kind of every statistic: config override, else the XML, else the default by type.

    ``overrides[package][class][statistic]``; ``xml`` maps (package, class,
    statistic) to the XML-derived kind whatever the class hash (a changed
    class keeps the meaning of the statistics it kept).
    """

    overrides: Mapping[str, Mapping[str, Mapping[str, str]]] = field(default_factory=dict)
    xml: Mapping[tuple[str, str, str], str] = field(default_factory=dict)
    default_numeric: str = KIND_GAUGE
    default_other: str = KIND_TEXT

    def kind(self, package: str, class_name: str, statistic: str, type_code: int) -> str:
        hit = self.overrides.get(package, {}).get(class_name, {}).get(statistic)
        if hit is not None:
            return hit
        hit = self.xml.get((package, class_name, statistic))
        if hit is not None:
            return hit
        return self.default_numeric if type_code in NUMERIC_CODES else self.default_other

    @classmethod
    def load(
        cls, path: str | None = DEFAULT_KINDS_FILE, xml: ManagementSchema | None = None
    ) -> StatisticKinds:
        """The XML's kinds (default: qpid's schema) with the overrides of a TOML file."""
        xml = default_schema() if xml is None else xml
        derived = {
            (c.package, c.name, name): _FROM_XML[info.kind]
            for c in xml
            for name, info in c.statistics.items()
        }
        config: dict[str, Any] = {}
        if path is not None:
            with open(path, "rb") as fh:
                config = tomllib.load(fh)
        default = config.get("default", {})
        overrides = config.get("overrides", {})
        out = cls(
            overrides=overrides,
            xml=derived,
            default_numeric=default.get("numeric", KIND_GAUGE),
            default_other=default.get("other", KIND_TEXT),
        )
        out.validate()
        return out

    def validate(self) -> None:
        bad = [self.default_numeric, self.default_other] + [
            k for classes in self.overrides.values() for stats in classes.values()
            for k in stats.values()
        ]  # fmt: skip
        unknown = sorted({k for k in bad if k not in STATISTIC_KINDS})
        if unknown:
            raise ValueError(f"unknown statistic kinds {unknown}; known: {sorted(STATISTIC_KINDS)}")


# ------------------------------------------------------------------- rows


def _text(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, bytes | bytearray):
        return bytes(v).decode("utf-8", "replace")
    return str(v)


def _int(v: Any) -> int | None:
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None


def element_row(
    e: Element, *, statistic_kind: str | None = None, slot: tuple[str, int] | None = None
) -> dict[str, Any]:
    """One ELEMENT struct value (attributes from the schema map, by their wire names)."""
    x = e.extra
    return {
        "name": e.name,
        "type_code": e.type_code,
        "access": e.access,
        "is_index": e.index,
        "optional": e.optional,
        "unit": _text(x.get("unit")),
        "min": _text(x.get("min")),
        "max": _text(x.get("max")),
        "maxlen": _int(x.get("maxlen")),
        "description": _text(x.get("desc")),
        "direction": _text(x.get("dir")),
        "default": _text(x.get("default")),
        "statistic_kind": statistic_kind,
        "slot_kind": None if slot is None else slot[0],
        "slot": None if slot is None else slot[1],
    }


def registry_row(
    schema: ClassSchema,
    kinds: StatisticKinds,
    *,
    first_seen: datetime,
    last_seen: datetime | None = None,
    source_agent: str | None = None,
    origin: str = WIRE,
    severity: int | None = None,
    first_app: str | None = None,
    first_batch: int = -1,
) -> dict[str, Any]:
    """One registry row of a class or event schema."""
    key = schema.key
    sl = slots(schema)
    np_ = len(schema.properties)
    n_i, n_f, n_t = slot_counts(schema)
    return {
        "package": key.package,
        "class_name": key.name,
        "schema_hash": key.hash,
        "kind": EVENT if schema.kind == KIND_EVENT else TABLE,
        "properties": [element_row(e, slot=sl[i]) for i, e in enumerate(schema.properties)],
        "statistics": [
            element_row(
                e,
                statistic_kind=kinds.kind(key.package, key.name, e.name, e.type_code),
                slot=sl[np_ + i],
            )
            for i, e in enumerate(schema.statistics)
        ],
        "methods": [
            {
                "name": m.name,
                "description": _text(m.extra.get("desc")),
                "arguments": [element_row(a) for a in m.arguments],
            }
            for m in schema.methods
        ],
        "arguments": [element_row(a) for a in schema.arguments],
        "severity": severity,
        "n_ints": n_i,
        "n_floats": n_f,
        "n_texts": n_t,
        "first_seen": first_seen,
        "last_seen": last_seen or first_seen,
        "source_agent": source_agent,
        "origin": origin,
        "first_app": first_app,
        "first_batch": first_batch,
    }


def rows_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=SCHEMA_REGISTRY)


def seed_table(
    kinds: StatisticKinds, xml: ManagementSchema | None = None, seen_at: datetime | None = None
) -> pa.Table:
    """Registry rows of every class and event of qpid's management schema XML."""
    xml = default_schema() if xml is None else xml
    at = seen_at or datetime.now(UTC)
    return rows_table(
        [
            registry_row(c.schema, kinds, first_seen=at, origin=SEED, severity=c.severity)
            for c in xml
        ]
    )


@dataclass(frozen=True)
class SeenSchema:
    """A schema record met on the wire: the schema, the agent that sent it, when."""

    schema: ClassSchema
    agent: str | None
    seen_at: datetime


def wire_table(
    seen: Iterable[SeenSchema],
    kinds: StatisticKinds,
    *,
    first_app: str | None = None,
    first_batch: int = -1,
    severities: Mapping[tuple[str, str], int] | None = None,
) -> pa.Table:
    """One row per distinct (key, kind) of the schemas seen: first/last seen over them."""
    by_key: dict[tuple[SchemaKey, int], list[SeenSchema]] = {}
    for s in seen:
        by_key.setdefault((s.schema.key, s.schema.kind), []).append(s)
    rows = []
    for (key, _kind), group in sorted(by_key.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        first = min(group, key=lambda s: s.seen_at)
        rows.append(
            registry_row(
                first.schema,
                kinds,
                first_seen=first.seen_at,
                last_seen=max(s.seen_at for s in group),
                source_agent=next((s.agent for s in group if s.agent), None),
                origin=WIRE,
                severity=(severities or {}).get((key.package, key.name)),
                first_app=first_app,
                first_batch=first_batch,
            )
        )
    return rows_table(rows)


def _element(d: Mapping[str, Any]) -> Element:
    extra = {
        wire: d[col]
        for col, wire in (
            ("unit", "unit"),
            ("min", "min"),
            ("max", "max"),
            ("maxlen", "maxlen"),
            ("description", "desc"),
            ("direction", "dir"),
            ("default", "default"),
        )
        if d.get(col) is not None
    }
    return Element(
        name=d["name"],
        type_code=int(d["type_code"]),
        access=d.get("access"),
        index=bool(d.get("is_index")),
        optional=bool(d.get("optional")),
        extra=extra,
    )


def schema_from_row(row: Mapping[str, Any]) -> ClassSchema:
    """The codec's ClassSchema of a registry row (what decoding needs)."""
    return ClassSchema(
        key=SchemaKey(row["package"], row["class_name"], bytes(row["schema_hash"])),
        kind=KIND_EVENT if row["kind"] == EVENT else 1,
        properties=tuple(_element(d) for d in row["properties"] or ()),
        statistics=tuple(_element(d) for d in row["statistics"] or ()),
        methods=tuple(
            Method(
                m["name"],
                tuple(_element(a) for a in m["arguments"] or ()),
                {"desc": m["description"]} if m.get("description") is not None else {},
            )
            for m in row["methods"] or ()
        ),
        arguments=tuple(_element(d) for d in row["arguments"] or ()),
    )


def visible_rows(table: pa.Table, app_id: str | None, batch_id: int | None) -> pa.Table:
    """The rows a batch may use: all but those first written by ``batch_id`` or later of ``app_id``."""
    if app_id is None or batch_id is None or table.num_rows == 0:
        return table
    import pyarrow.compute as pc

    mine = pc.and_(
        pc.equal(pc.fill_null(table.column("first_app"), ""), app_id),
        pc.greater_equal(table.column("first_batch"), batch_id),
    )
    return table.filter(pc.invert(mine))


def to_registry(table: pa.Table) -> SchemaRegistry:
    """A codec registry of every row of a registry table (table classes and events)."""
    return SchemaRegistry(schema_from_row(r) for r in table.to_pylist())


# ------------------------------------------------------------------ the table


class RegistryTable:
    """The registry Delta table: seed once, load as of a batch, add what the wire shows.

    Writes are exactly once: the seed is batch 0 of app ``qmf-registry-seed``;
    updates carry the silver job's ``(app_id, batch_id)``.
    """

    SEED_APP = "qmf-registry-seed"

    def __init__(self, path: str, kinds: StatisticKinds | None = None) -> None:
        self.path = path
        self.kinds = kinds or StatisticKinds.load()
        self._cache: tuple[int, pa.Table] | None = None

    def ensure(self, seed: bool = True) -> None:
        """Create the table; seed it from the XML (once, even across concurrent starts)."""
        from pipeline.lake import delta

        delta.create_table(self.path, SCHEMA_REGISTRY, name="schema_registry")
        if seed and delta.committed_batch(self.path, self.SEED_APP) is None:
            self._append(seed_table(self.kinds), self.SEED_APP, 0)

    def _append(self, rows: pa.Table, app_id: str, batch_id: int) -> None:
        from pipeline.lake import delta

        delta.append_arrow(rows, self.path, app_id=app_id, batch_id=batch_id)

    def table(self) -> pa.Table:
        """Every row (cached per table version)."""
        from pipeline.lake import delta

        version = delta.table_version(self.path)
        if self._cache is not None and self._cache[0] == version:
            return self._cache[1]
        t = delta.read_arrow(self.path, version)
        self._cache = (version, t)
        return t

    def load(self, app_id: str | None = None, batch_id: int | None = None) -> SchemaRegistry:
        """The codec registry as it was before ``batch_id`` of ``app_id`` (default: all)."""
        return to_registry(visible_rows(self.table(), app_id, batch_id))

    def update(
        self,
        seen: Sequence[SeenSchema],
        *,
        app_id: str,
        batch_id: int,
        touch_after_s: float = 60.0,
    ) -> int:
        """Insert new (key, kind) rows, advance ``last_seen`` of known ones, exactly once.

        ``last_seen`` of a known row is only rewritten when it moved by more
        than ``touch_after_s`` (qpid consoles re-request schemas constantly;
        a merge per batch for that would be pure cost). Returns rows written.
        """
        from pipeline.lake import delta

        if not seen:
            return 0
        done = delta.committed_batch(self.path, app_id)
        if done is not None and batch_id <= done:
            return 0
        current = self.table()
        known: dict[tuple[str, str, bytes, str], datetime] = {
            (p, c, bytes(h), k): ls
            for p, c, h, k, ls in zip(
                *(current.column(n).to_pylist()
                  for n in ("package", "class_name", "schema_hash", "kind", "last_seen")),
                strict=True,
            )
        }  # fmt: skip
        wire = wire_table(seen, self.kinds, first_app=app_id, first_batch=batch_id)
        keep = []
        for i, r in enumerate(
            zip(*(wire.column(n).to_pylist()
                  for n in ("package", "class_name", "schema_hash", "kind", "last_seen")), strict=True)
        ):  # fmt: skip
            old = known.get((r[0], r[1], bytes(r[2]), r[3]))
            if old is None or (r[4] - old).total_seconds() > touch_after_s:
                keep.append(i)
        if not keep:
            return 0
        rows = wire.take(pa.array(keep, pa.int64()))
        self._merge(rows, app_id, batch_id)
        return int(rows.num_rows)

    def _merge(self, rows: pa.Table, app_id: str, batch_id: int) -> None:
        """Upsert ``rows``: a known schema keeps its row but for ``last_seen`` (the
        new one) and ``source_agent`` (the first one known)."""
        from pipeline.lake import delta

        keys = ("package", "class_name", "schema_hash", "kind")
        current = {
            (r["package"], r["class_name"], bytes(r["schema_hash"]), r["kind"]): r
            for r in self.table().to_pylist()
        }
        merged = []
        for r in rows.to_pylist():
            old = current.get((r["package"], r["class_name"], bytes(r["schema_hash"]), r["kind"]))
            if old is not None:
                r = {**old, "last_seen": r["last_seen"],
                     "source_agent": old["source_agent"] or r["source_agent"]}  # fmt: skip
            merged.append(r)
        table = pa.Table.from_pylist(merged, schema=rows.schema)
        delta.merge_arrow(table, self.path, keys=keys, app_id=app_id, batch_id=batch_id)
