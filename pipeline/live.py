"""The live view: the latest rate, gauge and events per object, read as the tables grow.

``qmf top`` and ``qmf serve-metrics`` share it. The gold and silver tables are
Delta tables appended to by the running pipeline; a refresh reads only what
was committed since the previous one (``DeltaTail``: the commit files of the
new versions name the Parquet files they added; those files are read with
pyarrow.parquet, never through delta-rs' dataset readers). What is kept
between refreshes is small: the latest row per (agent, package, class,
series, statistic), the latest events, and every object's name, broker and
whether it has ended.

The first read does not scan history. Gold's ``rate_state`` (one small file,
rewritten by every gold batch) lists every live series with its baseline: the
sample its latest interval ended at. ``statistic_rates`` is then read newest
commit first until every series of the state has that interval
(``RatesTail``); a series whose baseline made no interval yet (its first
sample) stops the walk once the Delta statistics of the files not read prove
they end earlier. The events table is read the same way, newest first, until
the newest ``max_events`` are known.

Folds are idempotent (the latest row by sample time per key; events by their
identity), so reading a file twice is harmless: a compaction (files removed
with ``dataChange: false`` and their rows re-added) only costs a re-read; a
commit removing data (a backfill's range overwrite, a merge) or a version
whose commit file is gone (log cleanup) makes the tail read the table again
(from the state, for the rates) and the view rebuild from it.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import math
import os
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from schemas.gold import AGENT_LIVENESS, OBJECT_LIFECYCLES, RATE_STATE, STATISTIC_RATES
from schemas.silver import EVENTS

if TYPE_CHECKING:
    from deltalake import DeltaTable

NS = 1_000_000_000
ENQUEUES, DEQUEUES, DEPTH, CONSUMERS = (
    "msgTotalEnqueues", "msgTotalDequeues", "msgDepth", "consumerCount",
)  # fmt: skip
RATE_COLUMNS = (
    "agent", "dialect", "package", "class_name", "object_id", "index_key", "statistic", "kind",
    "start_ns", "end_ns", "end_time", "value", "rate", "reset",
)  # fmt: skip
SERIES_KEY = ("agent", "package", "class_name", "series", "statistic")
OBJECT_KEY = ("agent", "object_id")
EVENT_COLUMNS = (
    "partition", "offset", "record_index", "agent", "package", "event_name", "severity",
    "timestamp_ns", "event_time", "arguments",
)  # fmt: skip
EVENT_ID = ("partition", "offset", "record_index")
LIFECYCLE_COLUMNS = (
    "agent", "dialect", "package", "class_name", "object_id", "create_ns", "state",
    "last_seen_ns", "batch_id", "name", "broker",
)  # fmt: skip
STATE_COLUMNS = (
    "agent", "dialect", "package", "class_name", "object_id", "index_key", "series", "statistic",
    "update_ns",
)  # fmt: skip
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
_OLDEST = pl.CompatLevel.oldest()


def _subschema(schema: pa.Schema, names: tuple[str, ...]) -> pa.Schema:
    """The named columns of ``schema``, nullable; a name the schema lacks is a string
    (a column newer than the code reading, e.g. ``name`` before gold wrote it)."""
    return pa.schema(
        [
            schema.field(n).with_nullable(True) if n in schema.names else pa.field(n, pa.string())
            for n in names
        ]
    )


def _arrow(df: pl.DataFrame, schema: pa.Schema | None = None) -> pa.Table:
    """A polars frame as Arrow (plain string columns), cast to ``schema`` when given."""
    t = df.to_arrow(compat_level=_OLDEST)
    return t if schema is None else t.select(schema.names).cast(schema)


def _frame(t: pa.Table) -> pl.DataFrame:
    out = pl.from_arrow(t, rechunk=False)
    assert isinstance(out, pl.DataFrame)
    return out


@dataclass(frozen=True)
class Change:
    """What a table gained since the previous read.

    ``reset``: the rows are the whole table (first read, or data was removed
    since): the reader's view must be rebuilt from them, not extended.
    """

    version: int
    rows: pa.Table
    reset: bool


@dataclass(frozen=True)
class FileStats:
    """A live file of a snapshot: its Delta path, the min and max of one column by the add
    action's statistics (-inf / inf when it has none: it could hold anything), its time."""

    path: str
    low: float
    high: float
    mtime: int


class Unread:
    """The live files of a snapshot a reader has not read yet, with their statistics."""

    def __init__(self, dt: DeltaTable, column: str) -> None:
        adds = pa.table(dt.get_add_actions(flatten=True))
        n = adds.num_rows

        def stat(kind: str) -> list[Any]:
            name = f"{kind}.{column}"
            return adds.column(name).to_pylist() if name in adds.column_names else [None] * n

        mtimes = pc.cast(adds.column("modification_time"), pa.int64()).to_pylist()
        self.files: dict[str, FileStats] = {}
        for p, lo, hi, t in zip(adds.column("path").to_pylist(), stat("min"), stat("max"), mtimes, strict=True):
            self.files[urllib.parse.unquote(p)] = FileStats(
                p, -math.inf if lo is None else float(lo), math.inf if hi is None else float(hi), t or 0
            )  # fmt: skip
        self._heap = [(-f.high, k) for k, f in self.files.items()]
        heapq.heapify(self._heap)

    def pop(self, key: str) -> FileStats:
        return self.files.pop(key)

    def max_high(self) -> float:
        """The greatest value any unread file may hold (-inf: none left)."""
        while self._heap and self._heap[0][1] not in self.files:
            heapq.heappop(self._heap)
        return -self._heap[0][0] if self._heap else -math.inf


@dataclass(frozen=True)
class Step:
    """One commit of a newest-first walk (``DeltaTail.newest_first``): the live files it
    added (Delta paths) and its app transactions (appId, version)."""

    paths: list[str]
    txns: list[tuple[str, int]]


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
        self.files_read = 0  # by the last whole read

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

    def snapshot(self) -> DeltaTable:
        """The table's current snapshot (protocol checked)."""
        from deltalake import DeltaTable

        from pipeline import delta

        dt = DeltaTable(self.path)
        delta.check_protocol(dt, write=False)
        return dt

    def _read_all(self) -> Change | None:
        for _attempt in range(3):
            try:
                dt = self.snapshot()
                paths = pa.table(dt.get_add_actions(flatten=True)).column("path").to_pylist()
                rows = self._read_files(paths)
            except FileNotFoundError:  # a file went between the snapshot and the read
                continue
            version = dt.version()
            self.version = version
            self.files_read = len(paths)
            return Change(version, rows, reset=True)
        raise RuntimeError(f"{self.path}: files keep disappearing while reading the table")

    def newest_first(self, dt: DeltaTable, unread: Unread) -> Iterator[Step]:
        """The ``unread`` live files of snapshot ``dt``, newest commit first: each commit
        file from the snapshot's version down (its adds still unread, its app
        transactions), then the files no remaining commit file lists (log cleaned up),
        newest modification first. A file is taken out of ``unread`` when its step is
        yielded; a reader may take files out of order itself (they are not yielded again).
        """
        version = dt.version()
        while version >= 0 and unread.files:
            try:
                actions = _commit_actions(self._log(version))
            except FileNotFoundError:  # older commits cleaned up: the rest by file time
                break
            taken: list[str] = []
            txns: list[tuple[str, int]] = []
            for action in actions:
                if "add" in action:
                    key = urllib.parse.unquote(action["add"]["path"])
                    if key in unread.files:
                        taken.append(unread.pop(key).path)
                elif "txn" in action:
                    txns.append((action["txn"]["appId"], int(action["txn"]["version"])))
            version -= 1
            yield Step(taken, txns)
        for key, f in sorted(unread.files.items(), key=lambda kv: -kv[1].mtime):
            if key in unread.files:
                unread.pop(key)
                yield Step([f.path], [])

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


def _txn(actions: list[dict[str, Any]]) -> tuple[str, int] | None:
    for action in actions:
        if "txn" in action:
            return action["txn"]["appId"], int(action["txn"]["version"])
    return None


class RatesTail(DeltaTail):
    """``statistic_rates``, whose whole reads start from gold's latest state (``rate_state``)
    rather than all of history; ``state_path=None`` reads every file (the plain tail)."""

    def __init__(self, path: str | os.PathLike[str], state_path: str | os.PathLike[str] | None):
        super().__init__(path, STATISTIC_RATES, RATE_COLUMNS)
        self.state = None if state_path is None else DeltaTail(state_path, RATE_STATE, STATE_COLUMNS)

    def _read_all(self) -> Change | None:
        if self.state is not None and self.state.exists():
            for _attempt in range(3):
                try:
                    return self._read_from_state()
                except FileNotFoundError:  # vacuumed between the snapshot and the read
                    continue
                except _NoState:
                    break
        return super()._read_all()

    def _read_from_state(self) -> Change:
        """The rows that hold every state series' latest interval (and everything newer).

        A series' intervals are appended in sample-time order, the one ending at its
        baseline by the gold batch that wrote the state or an earlier one, and gold
        commits a batch's rates before its state. So every commit from the newest down
        to the rates commit of the state's batch is read (later intervals may be there),
        then, of the older files, those whose ``end_ns`` statistics span the baseline of
        a series not found yet (a file without statistics always): only they can hold
        its interval. A baseline that made no interval (the series' first sample) is not
        found there either; then no row of the series is current. Without the state's
        batch among the commit files (log cleaned up) every file is read.
        """
        assert self.state is not None
        sdt = self.state.snapshot()
        try:
            txn = _txn(_commit_actions(self.state._log(sdt.version())))
        except FileNotFoundError:
            txn = None
        state = self.state._read_files(pa.table(sdt.get_add_actions(flatten=True))["path"].to_pylist())
        if txn is None or state.num_rows == 0:
            raise _NoState
        app, batch = txn
        keys = list(SERIES_KEY)
        want = _frame(state).group_by(keys).agg(pl.col("update_ns").min().alias("_base"))
        known = state.select(["agent", "object_id", "index_key"]).filter(
            pc.is_valid(state.column("index_key"))
        )
        dt = self.snapshot()
        unread = Unread(dt, "end_ns")
        pieces: list[pa.Table] = []
        self.files_read = 0

        def take(paths: list[str]) -> pl.DataFrame:
            rows = with_series(self._read_files(paths), known)
            pieces.append(rows)
            self.files_read += len(paths)
            got = _frame(rows.select([*keys, "end_ns"])).group_by(keys).agg(
                pl.col("end_ns").max().alias("_end")
            )
            out = want.join(got, on=keys, how="left", nulls_equal=True)
            return out.filter(pl.col("_end").is_null() | (pl.col("_end") < pl.col("_base"))).drop("_end")

        passed = False
        for step in self.newest_first(dt, unread):
            if step.paths:
                want = take(step.paths)
            if any(a == app and v <= batch for a, v in step.txns):
                passed = True
                break
        if passed:
            bases = np.sort(want["_base"].to_numpy())
            for key, f in sorted(unread.files.items(), key=lambda kv: -kv[1].high):
                if not len(bases):
                    break
                i = int(np.searchsorted(bases, f.low))
                if i < len(bases) and bases[i] <= f.high:
                    unread.pop(key)
                    want = take([f.path])
                    bases = np.sort(want["_base"].to_numpy())
        rows = pa.concat_tables(pieces) if pieces else with_series(self.schema.empty_table())
        if pieces and rows.column("index_key").null_count:
            # An object's key seen only in another commit's rows: as a whole read keys it.
            rows = with_series(rows.drop_columns(["series"]), known)
        self.version = dt.version()
        return Change(self.version, rows, reset=True)


class _NoState(Exception):
    """The state cannot guide the read (no transaction, empty): read every file."""


class EventsTail(DeltaTail):
    """silver ``events``, whose whole reads stop once the newest ``keep`` events are known."""

    def __init__(self, path: str | os.PathLike[str], keep: int):
        super().__init__(path, EVENTS, EVENT_COLUMNS)
        self.keep = keep

    def _read_all(self) -> Change | None:
        for _attempt in range(3):
            try:
                dt = self.snapshot()
                unread = Unread(dt, "timestamp_ns")
                pieces: list[pa.Table] = []
                times = np.zeros(0, np.int64)
                for step in self.newest_first(dt, unread):
                    if step.paths:
                        rows = self._read_files(step.paths)
                        pieces.append(rows)
                        ts = rows.column("timestamp_ns").drop_null().to_numpy()
                        times = np.sort(np.concatenate([times, ts]))[-self.keep :]
                    # Strictly earlier: an equal time could still win on delivery order.
                    if len(times) >= self.keep and float(times[0]) > unread.max_high():
                        break
            except FileNotFoundError:
                continue
            self.version = dt.version()
            rows = pa.concat_tables(pieces) if pieces else self.schema.empty_table()
            return Change(self.version, rows, reset=True)
        raise RuntimeError(f"{self.path}: files keep disappearing while reading the table")


# ------------------------------------------------------------------ folds


def _last_per_key(t: pa.Table, key: tuple[str, ...], order: tuple[str, ...]) -> pa.Table:
    """The row with the greatest ``order`` of each ``key`` (ties: any one of equal rows)."""
    if t.num_rows == 0:
        return t
    return _arrow(_last_frame(_frame(t), key, order), t.schema)


def _last_frame(df: pl.DataFrame, key: tuple[str, ...], order: tuple[str, ...]) -> pl.DataFrame:
    if order:
        df = df.sort(list(order), nulls_last=False, maintain_order=True)
    return df.unique(subset=list(key), keep="last", maintain_order=False)


def with_series(rows: pa.Table, known: pa.Table | None = None) -> pa.Table:
    """Rows + ``series``: the restart-proof index key, else the object id.

    Rows without an index key (statistics seen before the object's properties)
    take the key their object has on other rows (of ``rows`` or ``known``), so
    an object's series moves to its index key once that is known, as in gold.
    """
    sources = [rows] if known is None else [rows, known]
    keyed = pa.concat_tables(
        [s.select(["agent", "object_id", "index_key"]).cast(_KEY_SCHEMA) for s in sources]
    )
    if rows.column("index_key").null_count and keyed.num_rows:
        keyed = keyed.filter(pc.is_valid(keyed.column("index_key")))
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


_KEY_SCHEMA = pa.schema([("agent", pa.string()), ("object_id", pa.string()), ("index_key", pa.string())])


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
    """A readable name from the index key: its last value (a queue's name), else the id.
    The fallback for tables from before gold named objects (``object_lifecycles.name``)."""
    return last_index_value(index_key) or object_id


@dataclass(frozen=True)
class QueueRow:
    """One queue as it is now: the latest rate of its counters and value of its gauges.

    ``broker`` and ``name`` say which queue (gold's names); a broker publishing it through
    several agents (qpidd's QMF v1 and v2) gives one row, from the agent with the newest
    sample (``agent``; V2 on a tie), ``agents`` listing every agent that published it."""

    broker: str
    name: str
    agent: str
    agents: list[str]
    dialect: str
    package: str
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
    (``qmf run --data`` layout: ``root/gold/<table>``, ``root/silver/<table>``).

    ``max_events``: newest events kept (0: the events table is not read at all).
    ``from_state``: start from gold's ``rate_state`` (False: read every rates file).
    """

    root: Path
    max_events: int = 20
    from_state: bool = True
    events: pa.Table = field(init=False)
    _latest: pl.DataFrame = field(init=False)
    _lifecycles: pl.DataFrame = field(init=False)
    _liveness: pl.DataFrame = field(init=False)
    _names: pl.DataFrame = field(init=False)
    _brokers: pl.DataFrame = field(init=False)
    _ended: pl.DataFrame = field(init=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        gold = self.root / "gold"
        self.rates_tail = RatesTail(
            gold / "statistic_rates", gold / "rate_state" if self.from_state else None
        )
        self.events_tail = EventsTail(self.root / "silver" / "events", max(self.max_events, 1))
        self.lifecycles_tail = DeltaTail(
            gold / "object_lifecycles", OBJECT_LIFECYCLES, LIFECYCLE_COLUMNS
        )
        self.liveness_tail = DeltaTail(gold / "agent_liveness", AGENT_LIVENESS, LIVENESS_COLUMNS)
        rate_schema = self.rates_tail.schema.append(pa.field("series", pa.string()))
        self._latest = _frame(rate_schema.empty_table())
        self._liveness = _frame(self.liveness_tail.schema.empty_table())
        self.events = self.events_tail.schema.empty_table()
        self._set_lifecycles(_frame(self.lifecycles_tail.schema.empty_table()))

    # -------------------------------------------------------------- state

    @property
    def latest(self) -> pa.Table:
        """The latest row per series and statistic (every object, ended ones included)."""
        return _arrow(self._latest)

    @latest.setter
    def latest(self, rows: pa.Table) -> None:
        self._latest = _frame(rows)

    @property
    def rates_version(self) -> int | None:
        return self.rates_tail.version

    @property
    def ended(self) -> set[tuple[str, str]]:
        """(agent, object_id) of objects with no live lifecycle row."""
        return set(self._ended.iter_rows())

    def _set_lifecycles(self, rows: pl.DataFrame) -> None:
        self._lifecycles = rows
        latest = _last_frame(rows, OBJECT_KEY, ("batch_id", "last_seen_ns"))
        self._names = latest.select("agent", "object_id", "name", "broker", "state", "package",
                                    "class_name")  # fmt: skip
        self._brokers = (
            latest.filter(pl.col("broker").is_not_null())
            .sort("batch_id", "last_seen_ns")
            .group_by("agent")
            .agg(pl.col("broker").last().alias("_agent_broker"))
        )
        live = rows.filter(pl.col("state") == "live").select(OBJECT_KEY).unique()
        gone = rows.filter(pl.col("state") != "live").select(OBJECT_KEY).unique()
        self._ended = gone.join(live, on=list(OBJECT_KEY), how="anti")

    def refresh(self) -> bool:
        """Reads what the tables gained; True when anything changed."""
        changed = False
        rates = self.rates_tail.read()
        if rates is not None:
            changed = True
            new = rates.rows
            if "series" not in new.column_names:
                new = with_series(new, None if rates.reset else self.latest.drop_columns(["series"]))
            df = _frame(new)
            both = df if rates.reset else pl.concat([self._latest, df], how="vertical_relaxed")
            self._latest = _last_frame(both, SERIES_KEY, ("end_ns",))
        if self.max_events > 0:
            events = self.events_tail.read()
            if events is not None:
                changed = True
                both_e = (
                    events.rows if events.reset else pa.concat_tables([self.events, events.rows])
                )
                both_e = _last_per_key(both_e, EVENT_ID, ())
                both_e = both_e.sort_by(
                    [("timestamp_ns", "descending"), *((c, "descending") for c in EVENT_ID)]
                )
                self.events = both_e.slice(0, self.max_events)
        life = self.lifecycles_tail.read()
        if life is not None:
            changed = True
            df = _frame(life.rows)
            both = df if life.reset else pl.concat([self._lifecycles, df], how="vertical_relaxed")
            self._set_lifecycles(
                _last_frame(both, ("agent", "object_id", "create_ns"), ("batch_id", "last_seen_ns"))
            )
        beats = self.liveness_tail.read()
        if beats is not None:
            changed = True
            df = _frame(beats.rows)
            both = df if beats.reset else pl.concat([self._liveness, df], how="vertical_relaxed")
            self._liveness = _last_frame(
                both, ("agent", "up_start_ns"), ("last_heartbeat_ns", "heartbeats")
            )
        return changed

    @property
    def versions(self) -> tuple[int | None, ...]:
        """The versions read of every table the current rows depend on."""
        return (self.rates_version, self.lifecycles_tail.version, self.liveness_tail.version)

    # -------------------------------------------------------------- what is current

    def _alive(self) -> pl.DataFrame:
        t = self._latest
        if self._ended.height and t.height:
            t = t.join(self._ended, on=list(OBJECT_KEY), how="anti")
        return t

    def agents(self) -> dict[str, tuple[int, int]]:
        """Per agent: (the latest time it was seen, its publish cycle), both in ns.

        Seen: its latest heartbeat (gold ``agent_liveness``) or the latest sample of any
        of its objects that have not ended (the rates' ``end_ns``). Cycle: the spacing of
        its heartbeats over its open up interval (the agent's own clock), else the
        interval it declares (V2 ``_heartbeat_interval``), else the median length of the
        latest intervals of its objects.
        """
        seen: dict[str, int] = {}
        cycle: dict[str, int] = {}
        t = self._alive()
        if t.height:
            by = t.group_by("agent").agg(pl.col("end_ns").max())
            seen.update(by.iter_rows())
            ok = t.filter(pl.col("reset").is_null())
            med = ok.group_by("agent").agg((pl.col("end_ns") - pl.col("start_ns")).median())
            for a, n in med.iter_rows():
                if n:
                    cycle[a] = int(n)
        newest = _last_frame(self._liveness, ("agent",), ("up_start_ns",))
        for r in newest.iter_rows(named=True):
            a, last = r["agent"], r["last_heartbeat_ns"]
            seen[a] = max(seen.get(a, last), last)
            n = r["heartbeats"] or 0
            if n >= 2:
                cycle[a] = (last - r["up_start_ns"]) // (n - 1)
            elif r["interval_s"]:
                cycle[a] = int(r["interval_s"] * NS)
        return {a: (s, cycle[a]) for a, s in seen.items() if a in cycle}

    def current_frame(self) -> pl.DataFrame:
        """``current`` as polars, with every row's ``name`` and ``broker``."""
        t = self._alive()
        t = _frame(with_quiet(_arrow(t), self.agents()))
        return self._named(t)

    def current(self) -> pa.Table:
        """The latest row per series and statistic, without objects that have ended
        (deleted, or lost with their agent) by the lifecycle table, quiet counters at 0,
        with the object's ``name`` and ``broker``.

        An agent that publishes on change (qpidd) leaves an object out of a cycle when
        nothing in it changed: once the agent was seen more than ``QUIET_CYCLES`` publish
        cycles after a counter's latest interval ended, that counter's rate is 0 (column
        ``quiet`` true); gauges and other values keep their last value (unchanged)."""
        return _arrow(self.current_frame())

    def _named(self, t: pl.DataFrame) -> pl.DataFrame:
        """Rows + ``name`` (gold's, else the index key's last value, else the object id)
        and ``broker`` (gold's for the object, else for its agent, else the agent id)."""
        t = t.join(
            self._names.select(*OBJECT_KEY, pl.col("name").alias("_name"),
                               pl.col("broker").alias("_broker")),
            on=list(OBJECT_KEY), how="left",
        ).join(self._brokers, on="agent", how="left")  # fmt: skip
        keys = t["index_key"].unique().drop_nulls().to_list()
        from_key = pl.col("index_key").replace_strict(
            keys, [last_index_value(k) for k in keys], default=None, return_dtype=pl.String
        )
        return t.with_columns(
            name=pl.coalesce("_name", from_key, "object_id"),
            broker=pl.coalesce("_broker", "_agent_broker", "agent"),
        ).drop("_name", "_broker", "_agent_broker")

    def objects(self) -> pl.DataFrame:
        """Live objects per (broker, package, class_name): ``count``. A broker publishing
        through several agents (AM2 and V2) counts its objects once (the largest count)."""
        live = self._names.filter(pl.col("state") == "live").join(
            self._brokers, on="agent", how="left"
        )
        live = live.with_columns(broker=pl.coalesce("broker", "_agent_broker", "agent"))
        per_agent = live.group_by("broker", "agent", "package", "class_name").len("count")
        return per_agent.group_by("broker", "package", "class_name").agg(pl.col("count").max())

    def queues(self, sort: str = "enqueue", limit: int | None = None) -> list[QueueRow]:
        """Queues with their current enqueue/dequeue rates, depth and consumers, one row per
        (broker, name) (``collapse``)."""
        t = collapse(self.current_frame())
        t = t.filter(
            (pl.col("class_name") == "queue")
            & pl.col("statistic").is_in([ENQUEUES, DEQUEUES, DEPTH, CONSUMERS])
        )
        counter = pl.col("kind") == "counter"
        value = pl.when(counter).then(pl.col("rate")).otherwise(pl.col("value"))
        enq_deq = counter & pl.col("statistic").is_in([ENQUEUES, DEQUEUES])

        def stat(name: str) -> pl.Expr:
            return value.filter(pl.col("statistic") == name).first().alias(name)

        by = (
            t.sort("end_ns")
            .group_by("agent", "package", "series")
            .agg(
                pl.col("end_ns").max(),
                *(pl.col(c).last() for c in ("object_id", "index_key", "name", "broker",
                                             "dialect", "agents")),
                stat(ENQUEUES), stat(DEQUEUES), stat(DEPTH), stat(CONSUMERS),
                pl.col("quiet").filter(enq_deq).all().alias("_quiet"),
                enq_deq.any().alias("_rates"),
            )
        )  # fmt: skip
        rows = [
            QueueRow(
                broker=r["broker"],
                name=r["name"],
                agent=r["agent"],
                agents=list(r["agents"]),
                dialect=r["dialect"],
                package=r["package"],
                object_id=r["object_id"],
                index_key=r["index_key"],
                enqueue_rate=r[ENQUEUES],
                dequeue_rate=r[DEQUEUES],
                depth=r[DEPTH],
                consumers=r[CONSUMERS],
                end_ns=r["end_ns"],
                quiet=bool(r["_quiet"] and r["_rates"]),
            )
            for r in by.iter_rows(named=True)
        ]
        attr = {"enqueue": "enqueue_rate", "dequeue": "dequeue_rate", "depth": "depth"}[sort]

        def order(row: QueueRow) -> tuple[bool, float, str, str, str]:
            v = getattr(row, attr)
            return (v is None, -(v or 0.0), row.name, row.broker, row.agent)

        rows.sort(key=order)
        return rows if limit is None else rows[:limit]

    def brokers(self) -> dict[str, str]:
        """agent -> its broker's identity (gold's), for agents whose broker is known."""
        return dict(self._brokers.iter_rows())

    def latest_events(self, n: int | None = None) -> list[dict[str, Any]]:
        """The newest events first (event time, then delivery order), each with its
        agent's ``broker`` (the agent id when no broker is known)."""
        rows: list[dict[str, Any]] = self.events.to_pylist()
        rows = rows if n is None else rows[:n]
        brokers = self.brokers()
        for r in rows:
            r["broker"] = brokers.get(r["agent"], r["agent"])
        return rows


def collapse(rows: pl.DataFrame) -> pl.DataFrame:
    """One object per (broker, package, class, name): a broker publishing an object through
    several agents (qpidd: QMF v1 as agent ``1.0`` and v2 as ``apache.org:qpidd:<uuid>``)
    keeps the series with the newest sample (V2 on a tie, then the agent id). ``rows``:
    current rows with ``name``, ``broker``, ``dialect``; out: the kept series' rows +
    ``agents`` (every agent of the object, sorted) and ``ambiguous``: one agent has two
    objects of that name (different objects, all kept: tell them apart by agent and id).
    """
    series = ["agent", "package", "class_name", "series"]
    group = ["broker", "package", "class_name", "name"]
    if rows.height == 0:
        return rows.with_columns(
            agents=pl.lit(None, pl.List(pl.String)), ambiguous=pl.lit(None, pl.Boolean)
        )
    objs = (
        rows.sort("end_ns")
        .group_by(series)
        .agg(pl.col("end_ns").max().alias("_end"), *(pl.col(c).last() for c in ("name", "broker", "dialect")))
    )  # fmt: skip
    groups = objs.group_by(group).agg(
        pl.col("agent").unique().sort().alias("agents"),
        (pl.len() > pl.col("agent").n_unique()).alias("ambiguous"),
    )
    objs = objs.join(groups, on=group, how="left")
    v2_first = (pl.col("dialect") != "V2").cast(pl.Int8)
    objs = objs.sort([pl.col("_end"), v2_first, pl.col("agent")], descending=[True, False, False])
    objs = objs.with_columns(_rank=pl.int_range(pl.len()).over(group))
    keep = objs.filter(pl.col("ambiguous") | (pl.col("_rank") == 0)).select(
        *series, "agents", "ambiguous"
    )
    return rows.join(keep, on=series, how="inner")


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


def severity_name(severity: int | None) -> str:
    if severity is not None and 0 <= severity < len(SEVERITIES):
        return SEVERITIES[severity]
    return "-" if severity is None else str(severity)
