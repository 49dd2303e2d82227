"""Names a person reads: an object's name through its index references, a broker's identity.

QMF names an object by its index properties, some of which reference other objects:
a queue is ``[vhostRef, name]``, a binding ``[exchangeRef, queueRef, bindingKey]``. The
references are object ids (AM1 ``boot-bank-number``, AM2 ``flags-epoch-banks-number``)
or, in QMF v2, maps holding the target's ``_object_name``. A person wants
``q-rate-50``, not ``["0-0-1-0-3","q-rate-50"]``, so a reference is replaced by the
name of the object it points to, recursively:

- a reference to the broker (or its system) is dropped: it is the ``broker`` column
  (an object indexed by the broker alone, qpidd's ``acl``, is named by its class);
- a reference to qpidd's default virtual host ``/`` is dropped (qpid-stat shows a
  queue of it by its queue name alone), any other vhost prefixes ``vhost/``;
- a reference whose target was not seen (yet) is dropped; the name is recomputed over
  every known object on every gold batch, so it completes when the target arrives and
  follows a target that is renamed; a deleted target keeps its last name.

A broker's identity is ``<broker name>@<host>:<port>`` from its ``broker`` object and
the ``system`` object that one references (``nodeName``). qpidd publishing both QMF v1
(AM2 agent ``1.0``) and v2 (agent ``apache.org:qpidd:<uuid>``) describes the same
broker and system objects in both, so both agents get the same identity. An agent with
no broker object keeps its agent id.

Pure functions over plain columns (no Spark, no I/O), called by gold on its lifecycle rows.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import polars as pl
import pyarrow as pa

REF_TYPE = 10  # QMF type code of an object reference
DEFAULT_VHOST = "/"
SEPARATOR = "/"
# Classes that name the broker itself: a reference to one is the broker column's business.
BROKER_CLASSES = frozenset({"broker", "system"})
_AM_ID = re.compile(r"^[0-9]+(?:-[0-9]+){2,4}$")
_V2_EPOCH = re.compile(r"^[0-9]+:")
_MAX_DEPTH = 6


def ref_positions(registry: pa.Table) -> dict[tuple[str, str], frozenset[int]]:
    """Per (package, class): the positions in its index key that hold references,
    from the schema registry (index properties in declaration order, type ``ref``).
    Every version of a class contributes (a position is a reference in any of them)."""
    out: dict[tuple[str, str], set[int]] = {}
    for r in registry.select(["package", "class_name", "properties"]).to_pylist():
        index = [e for e in r["properties"] or () if e["is_index"]]
        refs = out.setdefault((r["package"], r["class_name"]), set())
        refs.update(i for i, e in enumerate(index) if e["type_code"] == REF_TYPE)
    return {k: frozenset(v) for k, v in out.items()}


def ref_key(dialect: str, object_id: str) -> str:
    """What a reference to this object holds: the object id (AM1, AM2), the object
    name (V2: the object id without its ``epoch:`` prefix)."""
    return _V2_EPOCH.sub("", object_id, count=1) if dialect == "V2" else object_id


def parse_ref(dialect: str, value: object) -> str | None:
    """The ``ref_key`` a reference value points to; None when it is not reference-shaped."""
    if not isinstance(value, str):
        return None
    if dialect == "V2":
        if not value.startswith("{"):
            return None
        try:
            m = json.loads(value)
        except ValueError:
            return None
        name = m.get("_object_name") if isinstance(m, dict) else None
        return name if isinstance(name, str) else None
    return value if _AM_ID.match(value) else None


@lru_cache(maxsize=1 << 18)
def index_values(dialect: str, index_key: str | None) -> tuple[tuple[str, str | None], ...]:
    """An index key's values: (its text as a name part, the ``ref_key`` it would point
    to if a reference). Cached: gold resolves every object's key on every batch, and a
    key never changes meaning."""
    return _parse_index(dialect, index_key)


def _parse_index(dialect: str, index_key: str | None) -> tuple[tuple[str, str | None], ...]:
    if not index_key:
        return ()
    try:
        values = json.loads(index_key)
    except ValueError:
        return ((index_key, None),)
    if not isinstance(values, list):
        values = [values]
    return tuple((_literal(v), parse_ref(dialect, v)) for v in values)


def _literal(value: object) -> str:
    if isinstance(value, str):
        return value if value else '""'
    return json.dumps(value, sort_keys=True)


@dataclass(frozen=True, slots=True)
class Obj:
    """One object as the resolver sees it."""

    agent: str
    dialect: str
    package: str
    class_name: str
    object_id: str
    index_key: str | None
    last_seen_ns: int
    properties: Mapping[str, str | None] | None = None


class Resolver:
    """Names of the objects of a set, resolved through each other's index references."""

    def __init__(
        self, objects: Sequence[Obj], refs: Mapping[tuple[str, str], frozenset[int]] | None = None
    ) -> None:
        self.objects = objects
        self.refs = refs or {}
        # (agent, ref_key) -> the object a reference means (the latest seen of equal keys:
        # a V2 object re-created under its name has one lifecycle row per creation).
        self.by_ref: dict[tuple[str, str], Obj] = {}
        for o in objects:
            k = (o.agent, ref_key(o.dialect, o.object_id))
            cur = self.by_ref.get(k)
            if cur is None or o.last_seen_ns >= cur.last_seen_ns:
                self.by_ref[k] = o
        self._names: dict[tuple[str, str, str, str, str, str | None], str] = {}
        self._brokers: dict[str, str] = {}

    def _target(self, o: Obj, pos: int, key: str | None, last: bool) -> tuple[bool, Obj | None]:
        """(is a reference, its target if known) of an index value whose ``parse_ref`` is ``key``."""
        if key is None:
            return False, None
        target = self.by_ref.get((o.agent, key))
        declared = pos in self.refs.get((o.package, o.class_name), frozenset())
        if declared or o.dialect == "V2":
            return True, target
        # No schema says so: an id-shaped value is a reference when it names a known
        # object, or when it is not the last value (names come last in qpid's indexes).
        return (target is not None or not last), target

    def name(self, o: Obj, depth: int = 0) -> str:
        """The object's name for a person (never empty: the object id when nothing else).
        Each row is named from its own index key (two rows of one id, a re-created V2
        object, may differ), so the result does not depend on the order of the calls."""
        k = (o.agent, o.dialect, o.package, o.class_name, o.object_id, o.index_key)
        if k in self._names:
            return self._names[k]
        parts: list[str] = []
        of_broker = False
        values = index_values(o.dialect, o.index_key)
        for pos, (text, key) in enumerate(values):
            is_ref, target = self._target(o, pos, key, pos == len(values) - 1)
            if not is_ref:
                parts.append(text)
                continue
            if target is None or target is o or depth >= _MAX_DEPTH:
                continue
            if target.class_name in BROKER_CLASSES:
                of_broker = True
                continue
            sub = self.name(target, depth + 1)
            if target.class_name == "vhost" and sub == DEFAULT_VHOST:
                continue
            parts.append(sub)
        # Indexed by the broker alone (qpidd's acl, one per broker): named by its class.
        out = SEPARATOR.join(parts) if parts else o.class_name if of_broker else o.object_id
        self._names[k] = out
        return out

    def broker(self, agent: str) -> str:
        """``<name>@<host>:<port>`` of the agent's broker object, else the agent id."""
        if agent in self._brokers:
            return self._brokers[agent]
        brokers = [o for o in self.objects if o.agent == agent and o.class_name == "broker"]
        out = agent
        if brokers:
            b = max(brokers, key=lambda o: o.last_seen_ns)
            out = broker_label(
                b,
                lambda key: self.by_ref.get((agent, key)),
                (o for o in self.objects if o.agent == agent),
                lambda: self.name(b),
            )
        self._brokers[agent] = out
        return out


def broker_label(
    broker: Obj,
    target: Callable[[str], Obj | None],
    objects: Iterable[Obj],
    name: Callable[[], str],
) -> str:
    """``<name>@<host>:<port>`` of a broker object: the host is the ``nodeName`` of the
    system its ``systemRef`` names (``target``: the agent's object of a reference key),
    else of the agent's latest system among ``objects``; ``name``: the broker object's
    own name, asked for only when it has no ``name`` property."""
    props = broker.properties or {}
    sys_key = parse_ref(broker.dialect, props.get("systemRef"))
    system = target(sys_key) if sys_key else None
    if system is None:
        systems = [o for o in objects if o.class_name == "system"]
        system = max(systems, key=lambda o: o.last_seen_ns) if systems else None
    host = system.properties.get("nodeName") if system is not None and system.properties else None
    bname = props.get("name") or name()
    where = ":".join(p for p in (host, props.get("port")) if p)
    return f"{bname}@{where}" if where else bname


def _props(value: object) -> dict[str, str | None] | None:
    """A Map column's value (polars: list of key/value structs) as a dict."""
    if value is None:
        return None
    if isinstance(value, dict):
        return value
    return {e["key"]: e["value"] for e in value}  # type: ignore[attr-defined]


def objects_of(df: pl.DataFrame) -> list[Obj]:
    """Lifecycle rows (agent, dialect, package, class_name, object_id, index_key,
    last_seen_ns, properties) as resolver objects; properties only where names need them."""
    cols = ("agent", "dialect", "package", "class_name", "object_id", "index_key", "last_seen_ns")
    data = [df[c].to_list() for c in cols]
    needs = df["class_name"].is_in(list(BROKER_CLASSES))
    props: list[object] = [None] * df.height
    for i in needs.arg_true().to_list():
        props[i] = df["properties"][i]
    out = []
    for i, row in enumerate(zip(*data, strict=True)):
        agent, dialect, package, cls, oid, key, seen = row
        out.append(Obj(agent, dialect, package, cls, oid, key, int(seen or 0), _props(props[i])))
    return out


# From this many lifecycle rows on, names come from joins (below it, object by object
# is faster: the joins cost ~25 ms whatever the size; at 21,000 rows they take 0.53 of
# the time, at 84,000 0.25: benchmarks/bench_names.py, docs/performance.md, Gold).
JOINS_FROM_ROWS = 8_000


def with_names(
    lifecycles: pl.DataFrame,
    refs: Mapping[tuple[str, str], frozenset[int]] | None = None,
    joins_from: int = JOINS_FROM_ROWS,
) -> pl.DataFrame:
    """Lifecycle rows + ``name`` and ``broker``, resolved over all of them.

    Gold names every known object on every batch, so a large set is named by polars
    joins, one round per level of references (a queue's vhost is one level, a binding's
    queue two); only index keys not met before in this process are parsed in Python.
    A small set (under ``joins_from`` rows), or one whose references go round in a
    cycle or deeper than ``_MAX_DEPTH`` levels, is named by ``Resolver`` object by
    object: the same names where both apply (tested)."""
    named = _names_by_level(lifecycles, refs or {}) if lifecycles.height >= joins_from else None
    if named is None:
        return _with_names_one_by_one(lifecycles, refs)
    names, targets = named
    return _in_fleet(lifecycles.with_columns(
        name=names,
        broker=pl.col("agent").replace(_agent_brokers(lifecycles, names, targets)),
    ))  # fmt: skip


def fleet_broker(agent: pl.Expr) -> pl.Expr:
    """The fleet broker a gold agent id names (``transforms.fleet_agent``: ``<name>/<agent>``),
    else an empty string."""
    named = agent.str.contains("/", literal=True)
    return pl.when(named).then(agent.str.split_exact("/", 1).struct.field("field_0")).otherwise(
        pl.lit("")
    )


def _in_fleet(named: pl.DataFrame) -> pl.DataFrame:
    """A named broker's ``broker`` starts with its name, as its agents do
    (``east/<name>@<host>:<port>``): two brokers of a fleet never share an identity."""
    fleet = fleet_broker(pl.col("agent"))
    prefixed = pl.concat_str([fleet, pl.lit("/"), pl.col("broker")])
    own = (fleet == "") | pl.col("broker").str.starts_with(pl.concat_str([fleet, pl.lit("/")]))
    return named.with_columns(broker=pl.when(own).then(pl.col("broker")).otherwise(prefixed))


def _with_names_one_by_one(
    lifecycles: pl.DataFrame, refs: Mapping[tuple[str, str], frozenset[int]] | None
) -> pl.DataFrame:
    objects = objects_of(lifecycles)
    r = Resolver(objects, refs)
    return _in_fleet(lifecycles.with_columns(
        name=pl.Series([r.name(o) for o in objects], dtype=pl.Utf8),
        broker=pl.Series([r.broker(o.agent) for o in objects], dtype=pl.Utf8),
    ))  # fmt: skip


_KEY_COLS = ("dialect", "index_key")
_VALUES_SCHEMA = {
    "dialect": pl.Utf8, "index_key": pl.Utf8, "_pos": pl.Int32, "_text": pl.Utf8,
    "_key": pl.Utf8, "_n": pl.Int32,
}  # fmt: skip
# Parsed values kept per process (~200,000 objects); past it the cache starts again with
# the batch's own keys, so it holds at most max(cap, one batch's values). Measured: ~54
# bytes per value (polars estimated_size; 630,006 values of 270,004 qpidd-shaped keys,
# 33.8 MB), so ~28 MB at the cap, per Python worker.
_VALUES_CAP = 1 << 19


class _ParsedKeys:
    """The values of every index key met in this process, as rows (``_VALUES_SCHEMA``;
    a key without values has one row, ``_pos`` null): a key's values never change, and
    each batch meets the same keys again, so a batch parses only the keys new to it."""

    def __init__(self) -> None:
        self.values = pl.DataFrame(schema=_VALUES_SCHEMA)

    def explode(self, rows: pl.DataFrame) -> pl.DataFrame:
        """``rows`` (with ``dialect``, ``index_key``) joined with their keys' values:
        one row per value, rows without values left out."""
        on = list(_KEY_COLS)
        out = rows.join(self.values, on=on, how="left")
        missing = out.filter(pl.col("index_key").is_not_null() & pl.col("_n").is_null())
        if missing.height:
            new = missing.select(on).unique()
            if self.values.height + new.height * 3 > _VALUES_CAP:
                self.values = self.values.clear()
            cols: dict[str, list[object]] = {c: [] for c in _VALUES_SCHEMA}
            for d, k in zip(new["dialect"].to_list(), new["index_key"].to_list(), strict=True):
                vals = _parse_index(d, k) or ((None, None),)
                n = len(vals) if vals[0][0] is not None else 0
                for pos, (text, ref) in enumerate(vals):
                    row = (d, k, pos if n else None, text, ref, n)
                    for c, v in zip(cols.values(), row, strict=True):
                        c.append(v)
            parsed = pl.DataFrame(cols, schema=_VALUES_SCHEMA)
            self.values = pl.concat([self.values, parsed])
            out = pl.concat([
                out.filter(pl.col("_n").is_not_null()),
                missing.select(rows.columns).join(parsed, on=on, how="inner"),
            ])  # fmt: skip
        return out.filter(pl.col("_pos").is_not_null())


_PARSED = _ParsedKeys()


def _names_by_level(
    df: pl.DataFrame, refs: Mapping[tuple[str, str], frozenset[int]]
) -> tuple[pl.Series, pl.DataFrame] | None:
    """(each row's name, the reference targets) as ``Resolver`` gives them, by joins;
    None when references go round or deeper than ``_MAX_DEPTH`` levels.

    A row's values (``_pos`` order) are text parts or references; a reference's target
    is the latest seen row of its ``ref_key``. A row is named once every target it takes
    a part from is named, so round k names the rows k levels deep."""
    base = df.select(
        "agent", "dialect", "package", "class_name", "object_id", "index_key",
        _seen=pl.col("last_seen_ns").fill_null(0).cast(pl.Int64),
    ).with_row_index("_r")  # fmt: skip
    base = base.with_columns(
        _ref=pl.when(pl.col("dialect") == "V2")
        .then(pl.col("object_id").str.replace(_V2_EPOCH.pattern, ""))
        .otherwise(pl.col("object_id"))
    )
    # Of equal keys the latest seen, the last row of those (as Resolver.by_ref).
    targets = (
        base.sort(["_seen", "_r"])
        .group_by(["agent", "_ref"])
        .agg(pl.col("_r").last().alias("_t"))
    )
    declared = pl.DataFrame(
        [(p, c, pos) for (p, c), ps in refs.items() for pos in ps],
        schema={"package": pl.Utf8, "class_name": pl.Utf8, "_pos": pl.Int32},
        orient="row",
    ).unique().with_columns(_decl=pl.lit(True))
    vals = (
        _PARSED.explode(base.select("_r", "agent", "dialect", "package", "class_name", "index_key"))
        .join(targets.rename({"_ref": "_key"}), on=["agent", "_key"], how="left")
        .join(declared, on=["package", "class_name", "_pos"], how="left")
        .join(base.select(_t="_r", _tc="class_name"), on="_t", how="left")
    )
    is_ref = pl.col("_key").is_not_null() & (
        pl.col("_decl").fill_null(False)
        | (pl.col("dialect") == "V2")
        | pl.col("_t").is_not_null()
        | (pl.col("_pos") != pl.col("_n") - 1)
    )
    known = pl.col("_t").is_not_null() & (pl.col("_t") != pl.col("_r"))
    vals = vals.with_columns(
        _kind=pl.when(~is_ref).then(pl.lit("text"))
        .when(~known).then(pl.lit("skip"))
        .when(pl.col("_tc").is_in(list(BROKER_CLASSES))).then(pl.lit("broker"))
        .otherwise(pl.lit("ref"))
    )  # fmt: skip
    texts = vals.filter(pl.col("_kind") == "text").select("_r", "_pos", _part="_text")
    of_broker = vals.filter(pl.col("_kind") == "broker").select("_r").unique()
    fallback = base.select(
        "_r",
        _else=pl.when(pl.col("_r").is_in(of_broker["_r"].implode()))
        .then(pl.col("class_name"))
        .otherwise(pl.col("object_id")),
    )
    deps = vals.filter(pl.col("_kind") == "ref").select("_r", "_pos", "_t", "_tc")
    named = pl.DataFrame(schema={"_r": pl.UInt32, "name": pl.Utf8})
    todo = base.select("_r")
    for _level in range(_MAX_DEPTH):
        j = deps.join(named.rename({"_r": "_t", "name": "_sub"}), on="_t", how="left")
        blocked = j.filter(pl.col("_sub").is_null()).select("_r").unique()
        ready = todo.join(blocked, on="_r", how="anti")
        parts = pl.concat([
            texts.join(ready, on="_r", how="semi"),
            j.join(ready, on="_r", how="semi")
            .filter(~((pl.col("_tc") == "vhost") & (pl.col("_sub") == DEFAULT_VHOST)))
            .select("_r", "_pos", _part="_sub"),
        ])  # fmt: skip
        joined = parts.sort("_r", "_pos").group_by("_r", maintain_order=True).agg(
            pl.col("_part").str.join(SEPARATOR)
        )
        level = (
            ready.join(joined, on="_r", how="left")
            .join(fallback, on="_r", how="left")
            .select("_r", name=pl.coalesce("_part", "_else"))
        )
        named = pl.concat([named, level])
        todo = blocked
        deps = j.join(blocked, on="_r", how="semi").select("_r", "_pos", "_t", "_tc")
        if todo.height == 0:
            return named.sort("_r")["name"], targets
        if level.height == 0:
            return None  # references that go round
    return None


def _agent_brokers(df: pl.DataFrame, names: pl.Series, targets: pl.DataFrame) -> dict[str, str]:
    """agent -> ``<name>@<host>:<port>`` (``Resolver.broker``) for agents with a broker row;
    only the broker and system rows are read in Python."""
    rows = df.with_row_index("_r").filter(pl.col("class_name").is_in(list(BROKER_CLASSES)))
    objs: dict[int, Obj] = {}
    for r, o in zip(rows["_r"].to_list(), objects_of(rows), strict=True):
        objs[r] = o
    out: dict[str, str] = {}
    for agent in {o.agent for o in objs.values() if o.class_name == "broker"}:
        mine = [(r, o) for r, o in objs.items() if o.agent == agent]
        b_row, b = max((p for p in mine if p[1].class_name == "broker"), key=lambda p: p[1].last_seen_ns)

        def target(key: str, agent: str = agent) -> Obj | None:
            hit = targets.filter((pl.col("agent") == agent) & (pl.col("_ref") == key))["_t"]
            if not hit.len():
                return None
            return objs.get(int(hit[0])) or Obj(agent, "", "", "", "", None, 0)  # no properties

        def own_name(row: int = b_row) -> str:
            return names[row]  # type: ignore[no-any-return]

        out[agent] = broker_label(b, target, (o for _, o in mine), own_name)
    return out


def agent_brokers(rows: Iterable[tuple[str, str | None]]) -> dict[str, str]:
    """(agent, broker) pairs (e.g. lifecycle rows) -> agent -> broker, where known."""
    return {a: b for a, b in rows if b}
