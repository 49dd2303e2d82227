"""The live view: the latest rate, gauge and events per object, read as the tables grow.

``qmf top`` and ``qmf serve-metrics`` share it. The gold and silver tables are
Delta tables appended to by the running pipeline; a refresh reads only what
was committed since the previous one (``DeltaTail``: the commit files of the
new versions name the Parquet files they added; those files are read with
pyarrow.parquet, never through delta-rs' dataset readers, and no Parquet or
Delta statistics are used). What is kept between refreshes is small: the
latest row per (agent, package, class, series, statistic), the latest events,
and which objects have ended.

Folds are idempotent (the latest row by sample time per key; events by their
identity), so reading a file twice is harmless: a compaction (files removed
with ``dataChange: false`` and their rows re-added) only costs a re-read; a
commit removing data (a backfill's range overwrite, a merge) or a version
whose commit file is gone (log cleanup) makes the tail read the whole table
again and the view rebuild from it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from schemas.gold import AGENT_LIVENESS, OBJECT_LIFECYCLES, STATISTIC_RATES
from schemas.silver import EVENTS

NS = 1_000_000_000
ENQUEUES, DEQUEUES, DEPTH, CONSUMERS = (
    "msgTotalEnqueues", "msgTotalDequeues", "msgDepth", "consumerCount",
)  # fmt: skip
RATE_COLUMNS = (
    "agent", "dialect", "package", "class_name", "object_id", "index_key", "statistic", "kind",
    "start_ns", "end_ns", "end_time", "value", "rate", "reset",
)  # fmt: skip
SERIES_KEY = ("agent", "package", "class_name", "series", "statistic")
EVENT_COLUMNS = (
    "partition", "offset", "record_index", "agent", "package", "event_name", "severity",
    "timestamp_ns", "event_time", "arguments",
)  # fmt: skip
EVENT_ID = ("partition", "offset", "record_index")
LIFECYCLE_COLUMNS = ("agent", "object_id", "create_ns", "state", "last_seen_ns", "batch_id")
LIVENESS_COLUMNS = ("agent", "up_start_ns", "last_heartbeat_ns", "heartbeats", "interval_s")
# A counter's rate ages to 0 once its agent was seen this many publish cycles after the
# rate's end without a newer sample of it: one cycle, plus half a cycle of tolerance
# (for the agent's jitter and a cycle landing over two gold batches).
QUIET_CYCLES = 1.5
SEVERITIES = ("emerg", "alert", "crit", "error", "warn", "notice", "info", "debug")
# AM2 index keys hold object references carrying the agent's epoch: blanked so a
# queue's series survives a restart (as gold's series_key does).
_AM2_REF = r'"([0-9]+)-[0-9]+-([0-9]+)-([0-9]+)-([0-9]+)"'
_AM2_REF_BLANK = r'"\1-*-\2-\3-\4"'
# V2 references carry the agent epoch inside their map (gold's series_key drops it).
V2_REF_EPOCH = r'\\"_agent_epoch\\":[0-9]+,'


def _subschema(schema: pa.Schema, names: tuple[str, ...]) -> pa.Schema:
    return pa.schema([schema.field(n).with_nullable(True) for n in names])


@dataclass(frozen=True)
class Change:
    """What a table gained since the previous read.

    ``reset``: the rows are the whole table (first read, or data was removed
    since): the reader's view must be rebuilt from them, not extended.
    """

    version: int
    rows: pa.Table
    reset: bool


class DeltaTail:
    """Follows one Delta table: each ``read`` returns the rows of the files added since the last.

    The first read takes the live files from the log (``get_add_actions``);
    later reads parse the commit files ``_delta_log/<version>.json`` after
    the last version read, which list exactly the files each commit added or
    removed. Only the named columns are read (missing ones, e.g. from before
    a schema change, come back null).
    """

    def __init__(self, path: str | os.PathLike[str], schema: pa.Schema, columns: tuple[str, ...]):
        self.path = os.path.abspath(os.fspath(path))
        self.schema = _subschema(schema, columns)
        self.version: int | None = None

    def _log(self, version: int) -> str:
        return os.path.join(self.path, "_delta_log", f"{version:020d}.json")

    def exists(self) -> bool:
        """A log with a commit (the folder exists a moment before its first commit)."""
        log = os.path.join(self.path, "_delta_log")
        if not os.path.isdir(log):
            return False
        return any(n.endswith((".json", ".checkpoint.parquet")) for n in os.listdir(log))

    def read(self) -> Change | None:
        """The new rows, or None when nothing was committed since (or the table is not there)."""
        if self.version is None:
            return self._read_all() if self.exists() else None
        adds: list[str] = []
        version = self.version
        while os.path.isfile(self._log(version + 1)):
            try:
                actions = _commit_actions(self._log(version + 1))
            except FileNotFoundError:  # cleaned up between the check and the read
                return self._read_all()
            for action in actions:
                if "add" in action:
                    adds.append(action["add"]["path"])
                elif "remove" in action and action["remove"].get("dataChange", True):
                    return self._read_all()  # rows replaced: rebuild
            version += 1
        if version == self.version:
            return None
        try:
            rows = self._read_files(adds)
        except FileNotFoundError:  # compacted and vacuumed under us
            return self._read_all()
        self.version = version
        return Change(version, rows, reset=False)

    def _read_all(self) -> Change | None:
        from deltalake import DeltaTable

        from pipeline import delta

        for _attempt in range(3):
            try:
                dt = DeltaTable(self.path)
                delta.check_protocol(dt, write=False)
                paths = pa.table(dt.get_add_actions(flatten=True)).column("path").to_pylist()
                rows = self._read_files(paths)
            except FileNotFoundError:  # a file went between the snapshot and the read
                continue
            version = dt.version()
            self.version = version
            return Change(version, rows, reset=True)
        raise RuntimeError(f"{self.path}: files keep disappearing while reading the table")

    def _local(self, delta_path: str) -> str:
        if "://" in delta_path:
            parsed = urllib.parse.urlparse(delta_path)
            if parsed.scheme != "file":
                raise ValueError(f"only local tables are supported, not {delta_path}")
            return urllib.parse.unquote(parsed.path)
        if delta_path.startswith("/"):
            return urllib.parse.unquote(delta_path)
        return os.path.join(self.path, urllib.parse.unquote(delta_path))

    def _read_files(self, delta_paths: list[str]) -> pa.Table:
        pieces = []
        for p in delta_paths:
            pf = pq.ParquetFile(self._local(p))
            present = [n for n in self.schema.names if n in pf.schema_arrow.names]
            t = pf.read(columns=present)
            for n in self.schema.names:
                if n not in present:
                    t = t.append_column(n, pa.nulls(t.num_rows, self.schema.field(n).type))
            pieces.append(t.select(self.schema.names).cast(self.schema))
        if not pieces:
            return self.schema.empty_table()
        return pa.concat_tables(pieces)


def _commit_actions(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# ------------------------------------------------------------------ folds


def _key(t: pa.Table, names: tuple[str, ...]) -> np.ndarray:
    """One string per row joining the key columns (nulls as an unprintable marker)."""
    cols = [pc.fill_null(t.column(n).cast(pa.string()), "\x00") for n in names]
    joined = pc.binary_join_element_wise(*cols, "\x1f")
    return np.asarray(joined.to_numpy(zero_copy_only=False), dtype=object)


def _last_per_key(t: pa.Table, key: tuple[str, ...], order: tuple[str, ...]) -> pa.Table:
    """The row with the greatest ``order`` of each ``key`` (ties: any one of equal rows)."""
    if t.num_rows == 0:
        return t
    t = t.append_column("__key", pa.array(_key(t, key), pa.string()))
    t = t.sort_by([("__key", "ascending"), *((o, "ascending") for o in order)])
    keys = np.asarray(t.column("__key").to_numpy(zero_copy_only=False), dtype=object)
    last = np.ones(len(keys), np.bool_)
    last[:-1] = keys[:-1] != keys[1:]
    return t.filter(pa.array(last)).drop_columns(["__key"])


def with_series(rows: pa.Table, known: pa.Table | None = None) -> pa.Table:
    """Rows + ``series``: the restart-proof index key, else the object id.

    Rows without an index key (statistics seen before the object's properties)
    take the key their object has on other rows (of ``rows`` or ``known``), so
    an object's series moves to its index key once that is known, as in gold.
    """
    sources = [rows] if known is None else [rows, known]
    keyed = pa.concat_tables([s.select(["agent", "object_id", "index_key"]) for s in sources])
    keyed = keyed.filter(pc.is_valid(keyed.column("index_key")))
    if keyed.num_rows:
        keys = keyed.group_by(["agent", "object_id"]).aggregate([("index_key", "max")])
        keys = keys.rename_columns(["agent", "object_id", "_known_key"])
        pos = pa.array(np.arange(rows.num_rows), pa.int64())
        joined = rows.append_column("_pos", pos).join(
            keys, ["agent", "object_id"], join_type="left outer"
        )
        joined = joined.sort_by("_pos")
        filled = pc.coalesce(joined.column("index_key"), joined.column("_known_key"))
        rows = joined.drop_columns(["_pos", "_known_key"]).select(rows.column_names)
        rows = rows.set_column(rows.schema.get_field_index("index_key"), "index_key", filled)
    am2 = pc.replace_substring_regex(rows.column("index_key"), _AM2_REF, _AM2_REF_BLANK)
    v2 = pc.replace_substring_regex(rows.column("index_key"), V2_REF_EPOCH, "")
    dialect = rows.column("dialect")
    key = pc.if_else(
        pc.equal(dialect, "AM2"),
        am2,
        pc.if_else(pc.equal(dialect, "V2"), v2, rows.column("index_key")),
    )
    series = pc.coalesce(key, rows.column("object_id"))
    if "series" in rows.column_names:
        return rows.set_column(rows.schema.get_field_index("series"), "series", series)
    return rows.append_column("series", series)


def last_index_value(index_key: str | None) -> str | None:
    """The last value of an index key (a queue's name, a binding's key): what names
    an object to a person. Non-string values come back as their JSON text."""
    if not index_key:
        return None
    try:
        values = json.loads(index_key)
    except ValueError:
        return index_key
    if isinstance(values, list) and values:
        last = values[-1]
        return last if isinstance(last, str) else json.dumps(last, sort_keys=True)
    return index_key


def key_name(index_key: str | None, object_id: str) -> str:
    """A readable name from the index key: its last value (a queue's name), else the id."""
    return last_index_value(index_key) or object_id


@dataclass(frozen=True)
class QueueRow:
    """One queue as it is now: the latest rate of its counters and value of its gauges."""

    agent: str
    package: str
    name: str
    object_id: str
    index_key: str | None
    enqueue_rate: float | None
    dequeue_rate: float | None
    depth: float | None
    consumers: float | None
    end_ns: int
    quiet: bool = False  # not republished for over a publish cycle: counters unchanged (0/s)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class LiveView:
    """The latest state of the gold rates, object lifecycles and silver events under ``root``
    (``qmf run --data`` layout: ``root/gold/<table>``, ``root/silver/<table>``)."""

    root: Path
    max_events: int = 20
    latest: pa.Table = field(init=False)
    events: pa.Table = field(init=False)
    ended: set[tuple[str, str]] = field(init=False, default_factory=set)
    _lifecycles: pa.Table = field(init=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        rate_schema = _subschema(STATISTIC_RATES, RATE_COLUMNS)
        self.rates_tail = DeltaTail(
            self.root / "gold" / "statistic_rates", STATISTIC_RATES, RATE_COLUMNS
        )
        self.events_tail = DeltaTail(self.root / "silver" / "events", EVENTS, EVENT_COLUMNS)
        self.lifecycles_tail = DeltaTail(
            self.root / "gold" / "object_lifecycles", OBJECT_LIFECYCLES, LIFECYCLE_COLUMNS
        )
        self.liveness_tail = DeltaTail(
            self.root / "gold" / "agent_liveness", AGENT_LIVENESS, LIVENESS_COLUMNS
        )
        self._liveness = self.liveness_tail.schema.empty_table()
        self.latest = rate_schema.empty_table().append_column("series", pa.array([], pa.string()))
        self.events = self.events_tail.schema.empty_table()
        self._lifecycles = self.lifecycles_tail.schema.empty_table()

    @property
    def rates_version(self) -> int | None:
        return self.rates_tail.version

    def refresh(self) -> bool:
        """Reads what the tables gained; True when anything changed."""
        changed = False
        rates = self.rates_tail.read()
        if rates is not None:
            changed = True
            new = with_series(
                rates.rows, None if rates.reset else self.latest.drop_columns(["series"])
            )
            both = new if rates.reset else pa.concat_tables([self.latest, new])
            self.latest = _last_per_key(both, SERIES_KEY, ("end_ns",))
        events = self.events_tail.read()
        if events is not None:
            changed = True
            both = events.rows if events.reset else pa.concat_tables([self.events, events.rows])
            both = _last_per_key(both, EVENT_ID, ())
            both = both.sort_by(
                [("timestamp_ns", "descending"), *((c, "descending") for c in EVENT_ID)]
            )
            self.events = both.slice(0, self.max_events)
        life = self.lifecycles_tail.read()
        if life is not None:
            changed = True
            both = life.rows if life.reset else pa.concat_tables([self._lifecycles, life.rows])
            self._lifecycles = _last_per_key(
                both, ("agent", "object_id", "create_ns"), ("batch_id", "last_seen_ns")
            )
            self.ended = _ended(self._lifecycles)
        beats = self.liveness_tail.read()
        if beats is not None:
            changed = True
            both = beats.rows if beats.reset else pa.concat_tables([self._liveness, beats.rows])
            self._liveness = _last_per_key(
                both, ("agent", "up_start_ns"), ("last_heartbeat_ns", "heartbeats")
            )
        return changed

    @property
    def versions(self) -> tuple[int | None, ...]:
        """The versions read of every table the current rows depend on."""
        return (self.rates_version, self.lifecycles_tail.version, self.liveness_tail.version)

    def agents(self) -> dict[str, tuple[int, int]]:
        """Per agent: (the latest time it was seen, its publish cycle), both in ns.

        Seen: its latest heartbeat (gold ``agent_liveness``) or the latest sample of any
        of its objects (the rates' ``end_ns``). Cycle: the spacing of its heartbeats over
        its open up interval (the agent's own clock), else the interval it declares
        (V2 ``_heartbeat_interval``), else the median length of its latest intervals.
        """
        seen: dict[str, int] = {}
        cycle: dict[str, int] = {}
        t = self.latest
        if t.num_rows:
            by = t.group_by("agent").aggregate([("end_ns", "max")])
            seen.update(zip(by["agent"].to_pylist(), by["end_ns_max"].to_pylist(), strict=True))
            ok = t.filter(pc.is_null(t.column("reset")))
            length = pc.subtract(ok.column("end_ns"), ok.column("start_ns"))
            med = pa.table({"agent": ok.column("agent"), "n": length}).group_by("agent").aggregate(
                [("n", "approximate_median")]
            )
            for a, n in zip(med["agent"].to_pylist(), med["n_approximate_median"].to_pylist(), strict=True):
                if n:
                    cycle[a] = int(n)
        newest = _last_per_key(self._liveness, ("agent",), ("up_start_ns",))
        for r in newest.to_pylist():
            a, last = r["agent"], r["last_heartbeat_ns"]
            seen[a] = max(seen.get(a, last), last)
            n = r["heartbeats"] or 0
            if n >= 2:
                cycle[a] = (last - r["up_start_ns"]) // (n - 1)
            elif r["interval_s"]:
                cycle[a] = int(r["interval_s"] * NS)
        return {a: (s, cycle[a]) for a, s in seen.items() if a in cycle}

    def current(self) -> pa.Table:
        """The latest row per series and statistic, without objects that have ended
        (deleted, or lost with their agent) by the lifecycle table, quiet counters at 0.

        An agent that publishes on change (qpidd) leaves an object out of a cycle when
        nothing in it changed: once the agent was seen more than ``QUIET_CYCLES`` publish
        cycles after a counter's latest interval ended, that counter's rate is 0 (column
        ``quiet`` true); gauges and other values keep their last value (unchanged)."""
        t = self.latest
        if self.ended and t.num_rows:
            ids = _key(t, ("agent", "object_id"))
            ended = {f"{a}\x1f{o}" for a, o in self.ended}
            t = t.filter(pa.array([i not in ended for i in ids]))
        return with_quiet(t, self.agents())

    def queues(self, sort: str = "enqueue", limit: int | None = None) -> list[QueueRow]:
        """Queues with their current enqueue/dequeue rates, depth and consumers."""
        t = self.current()
        t = t.filter(pc.equal(t.column("class_name"), "queue"))
        wanted = pa.array([ENQUEUES, DEQUEUES, DEPTH, CONSUMERS])
        t = t.filter(pc.is_in(t.column("statistic"), wanted))
        by: dict[tuple[str, str, str], dict[str, Any]] = {}
        for r in t.to_pylist():
            q = by.setdefault((r["agent"], r["package"], r["series"]), {"end_ns": -1, "quiet": True})
            if r["end_ns"] > q["end_ns"]:
                q.update(end_ns=r["end_ns"], object_id=r["object_id"], index_key=r["index_key"])
            q[r["statistic"]] = r["rate"] if r["kind"] == "counter" else r["value"]
            if r["kind"] == "counter" and r["statistic"] in (ENQUEUES, DEQUEUES):
                q["quiet"] = q["quiet"] and r["quiet"]
        rows = [
            QueueRow(
                agent=agent,
                package=package,
                name=key_name(q["index_key"], q["object_id"]),
                object_id=q["object_id"],
                index_key=q["index_key"],
                enqueue_rate=q.get(ENQUEUES),
                dequeue_rate=q.get(DEQUEUES),
                depth=q.get(DEPTH),
                consumers=q.get(CONSUMERS),
                end_ns=q["end_ns"],
                quiet=q["quiet"] and (ENQUEUES in q or DEQUEUES in q),
            )
            for (agent, package, _series), q in by.items()
        ]
        attr = {"enqueue": "enqueue_rate", "dequeue": "dequeue_rate", "depth": "depth"}[sort]

        def order(row: QueueRow) -> tuple[bool, float, str, str]:
            v = getattr(row, attr)
            return (v is None, -(v or 0.0), row.name, row.agent)

        rows.sort(key=order)
        return rows if limit is None else rows[:limit]

    def latest_events(self, n: int | None = None) -> list[dict[str, Any]]:
        """The newest events first (event time, then delivery order)."""
        rows: list[dict[str, Any]] = self.events.to_pylist()
        return rows if n is None else rows[:n]


def with_quiet(rows: pa.Table, agents: dict[str, tuple[int, int]]) -> pa.Table:
    """``rows`` + ``quiet``: a counter whose agent (``agents``: latest time seen, publish
    cycle) was seen more than ``QUIET_CYCLES`` cycles after the row's end; its ``rate`` is
    then 0. Event time only (the agents' clocks), so a replayed lake shows the same."""
    names = list(agents)
    at = pc.index_in(rows.column("agent"), value_set=pa.array(names, pa.string()))
    pos = np.asarray(pc.fill_null(at, len(names)).to_numpy(zero_copy_only=False), np.int64)
    seen = np.array([agents[a][0] for a in names] + [-1], np.int64)[pos]
    cycle = np.array([agents[a][1] for a in names] + [0], np.int64)[pos]
    end = np.asarray(rows.column("end_ns").to_numpy(zero_copy_only=False), np.int64)
    counter = np.asarray(
        pc.fill_null(pc.equal(rows.column("kind"), "counter"), False).to_numpy(zero_copy_only=False),
        np.bool_,
    )
    quiet = counter & (cycle > 0) & (seen - end > (QUIET_CYCLES * cycle).astype(np.int64))
    rate = pc.if_else(pa.array(quiet), pa.scalar(0.0), rows.column("rate"))
    out = rows.set_column(rows.schema.get_field_index("rate"), "rate", rate)
    if "quiet" in out.column_names:
        return out.set_column(out.schema.get_field_index("quiet"), "quiet", pa.array(quiet))
    return out.append_column("quiet", pa.array(quiet))


def _ended(lifecycles: pa.Table) -> set[tuple[str, str]]:
    """(agent, object_id) of objects with no live row (a V2 id re-created is live again)."""
    live: set[tuple[str, str]] = set()
    gone: set[tuple[str, str]] = set()
    for r in lifecycles.select(["agent", "object_id", "state"]).to_pylist():
        (live if r["state"] == "live" else gone).add((r["agent"], r["object_id"]))
    return gone - live


def severity_name(severity: int | None) -> str:
    if severity is not None and 0 <= severity < len(SEVERITIES):
        return SEVERITIES[severity]
    return "-" if severity is None else str(severity)
