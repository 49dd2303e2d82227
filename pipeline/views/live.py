"""The live view: every live series' latest sample, rate and name, read as the tables grow.

``qmf top`` and ``qmf serve-metrics`` share it. The gold and silver tables are
Delta tables appended to by the running pipeline; a refresh reads only what
was committed since the previous one (``pipeline.views.tails.DeltaTail``: the commit files of the
new versions name the Parquet files they added; those files are read with
pyarrow.parquet, never through delta-rs' dataset readers). The view is one
row per series of gold's ``rate_state`` (``LiveView.rows``): the
``statistic_rates`` row of the interval ending at the series' latest sample
(or later), else a row made from the state (that sample's time and value, no
rate); every object's name and broker come from ``lifecycle_state``.

The first read does not scan history. ``rate_state`` is one small file,
rewritten by every gold batch; ``statistic_rates`` is read newest commit first
down to the rates commit of the state's batch (``RatesTail``), then only the
older files whose ``end_ns`` statistics span the latest sample of a counter
that is not quiet (``LiveView._read_recent``): a quiet counter shows 0 and any
other statistic its latest value, both known from the state. The events table
is read newest first until the newest ``max_events`` are known.

Folds are idempotent (the latest row by sample time per key; events by their
identity), so reading a file twice is harmless; a compaction (files removed
and added with ``dataChange: false``: the same rows) is not read again; a
commit removing data (a backfill's range overwrite, a merge, the state's
replacement) or a version whose commit file is gone (log cleanup) makes the
tail read the table again (from the state, for the rates) and the view
rebuild from it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.lake import storage
from pipeline.views.tails import DeltaTail, EventsTail, RatesTail, StateTail, to_arrow, to_frame
from schemas.gold import AGENT_LIVENESS, LIFECYCLE_STATE
from schemas.silver import QUARANTINE
from schemas.tables import DEFAULT_BROKER

if TYPE_CHECKING:
    pass

NS = 1_000_000_000
ENQUEUES, DEQUEUES, DEPTH, CONSUMERS = (
    "msgTotalEnqueues", "msgTotalDequeues", "msgDepth", "consumerCount",
)  # fmt: skip
SERIES_KEY = ("agent", "package", "class_name", "series", "statistic")
OBJECT_KEY = ("agent", "object_id")
EVENT_ID = ("partition", "offset", "record_index")
LIFECYCLE_COLUMNS = (
    "agent", "dialect", "package", "class_name", "object_id", "index_key", "create_ns", "state",
    "last_seen_ns", "batch_id", "name", "broker",
)  # fmt: skip
LIVENESS_COLUMNS = (
    "agent", "up_start_ns", "last_heartbeat_ns", "heartbeats", "interval_s", "batch_id"
)  # fmt: skip
# A counter's rate ages to 0 once its agent was seen this many publish cycles after the
# rate's end without a newer sample of it: one cycle, plus half a cycle of tolerance
# (for the agent's jitter and a cycle landing over two gold batches).
LIVENESS_KEY = ("agent", "up_start_ns")
QUIET_CYCLES = 1.5
SEVERITIES = ("emerg", "alert", "crit", "error", "warn", "notice", "info", "debug")
# AM2 index keys hold object references carrying the agent's epoch: blanked so a
# queue's series survives a restart (as gold's series_key does).
_AM2_REF = r'"([0-9]+)-[0-9]+-([0-9]+)-([0-9]+)-([0-9]+)"'
_AM2_REF_BLANK = r'"\1-*-\2-\3-\4"'
# V2 references carry the agent epoch inside their map (gold's series_key drops it).
V2_REF_EPOCH = r'\\"_agent_epoch\\":[0-9]+,'


def data_location(data: str) -> Path | str:
    """``--data`` of ``qmf top`` and ``qmf serve-metrics``: a folder, or a bucket's URI
    (``s3a://bucket/prefix``, the store's settings from the standard variables)."""
    return storage.location(data) if storage.is_object_store(data) else Path(data)


def _last_per_key(t: pa.Table, key: tuple[str, ...], order: tuple[str, ...]) -> pa.Table:
    """The row with the greatest ``order`` of each ``key`` (ties: any one of equal rows)."""
    if t.num_rows == 0:
        return t
    return to_arrow(_last_frame(to_frame(t), key, order), t.schema)


def _last_frame(df: pl.DataFrame, key: tuple[str, ...], order: tuple[str, ...]) -> pl.DataFrame:
    if order:
        df = df.sort(list(order), nulls_last=False, maintain_order=True)
    return df.unique(subset=list(key), keep="last", maintain_order=False)


def _heartbeats(rows: pl.DataFrame, batch: int | None) -> pl.DataFrame:
    """Per up interval (``LIVENESS_KEY``) its latest row of the batches up to ``batch``
    (the state's; None: of all), and the rows of later batches, which ``agents`` takes
    once the state has caught up with them."""
    if batch is None:
        return _last_frame(rows, LIVENESS_KEY, ("last_heartbeat_ns", "heartbeats"))
    ahead = pl.col("batch_id") > batch
    return pl.concat(
        [
            _last_frame(rows.filter(~ahead), LIVENESS_KEY, ("last_heartbeat_ns", "heartbeats")),
            rows.filter(ahead).unique(),
        ]
    )


def _keyed(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` + ``_k``: a 64-bit hash of its series key (``SERIES_KEY``). Sorting, joining
    and deduplicating on it is several times faster than on the five strings; the
    functions using it check that equal hashes have equal keys (a collision falls back to
    the strings), so a collision costs time, never a wrong row."""
    k = pl.col(SERIES_KEY[0]).hash(seed=0)
    for seed, column in enumerate(SERIES_KEY[1:], 1):  # per column (fast), combined
        k = k * pl.lit(0x9E3779B97F4A7C15, pl.UInt64) + pl.col(column).hash(seed=seed)
    return df.with_columns(_k=k)


def _same_keys(left: pl.DataFrame, right: pl.DataFrame) -> bool:
    """Whether two frames' rows, taken pairwise, have equal series keys."""
    return bool(
        pl.DataFrame([(left[k] == right[k]).alias(k) for k in SERIES_KEY]).select(
            pl.all_horizontal(pl.all()).all()
        ).item()
    )


def _one_per_series(df: pl.DataFrame, order: str, last: bool) -> pl.DataFrame:
    """The row with the greatest (``last``) or least ``order`` of each series (``_k`` set)."""
    t = df.sort(["_k", order], maintain_order=True)
    k = t["_k"]
    run_end = (k != k.shift(-1)).fill_null(True) if last else (k != k.shift(1)).fill_null(True)
    same = ~(k != k.shift(1)).fill_null(True)
    if same.any():
        pairs = same.arg_true()
        if not _same_keys(t[pairs], t[pairs - 1]):  # a collision: by the strings
            t = df.sort(order, maintain_order=True)
            return t.unique(subset=list(SERIES_KEY), keep="last" if last else "first")
    return t.filter(run_end)


def _baselines(state: pa.Table) -> pl.DataFrame:
    """Gold ``rate_state`` -> per series its baseline (the earliest of its rows: a pending
    sample is later): ``_base`` its sample time, and its object, kind and value."""
    df = _keyed(to_frame(state))
    return _one_per_series(df, "update_ns", last=False).rename({"update_ns": "_base"})


def with_series(rows: pa.Table, known: pa.Table | None = None) -> pa.Table:
    """Rows + ``series``: the restart-proof index key, else the object id.

    Rows without an index key (statistics seen before the object's properties)
    take the key their object has on other rows (of ``rows`` or ``known``), so
    an object's series moves to its index key once that is known, as in gold.
    """
    if rows.column("index_key").null_count:
        sources = [rows] if known is None else [rows, known]
        keyed = pa.concat_tables(
            [s.select(["agent", "object_id", "index_key"]).cast(_KEY_SCHEMA) for s in sources]
        )
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
    # The regular expressions run over the distinct keys (an object's rows share one).
    enc = pc.dictionary_encode(rows.column("index_key").combine_chunks())
    am2 = pc.take(pc.replace_substring_regex(enc.dictionary, _AM2_REF, _AM2_REF_BLANK), enc.indices)
    v2 = pc.take(pc.replace_substring_regex(enc.dictionary, V2_REF_EPOCH, ""), enc.indices)
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
    The fallback for tables from before gold named objects (``lifecycle_state.name``)."""
    return last_index_value(index_key) or object_id


@dataclass(frozen=True)
class QueueRow:
    """One queue as it is now: the latest rate of its counters and value of its gauges.

    ``broker`` and ``name`` say which queue (gold's names); a broker publishing it through
    several agents (qpidd's QMF v1 and v2) gives one row, from the agent whose object was
    seen last (``agent``; V2 on a tie: ``collapse``), ``agents`` listing every agent that
    publishes it."""

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

    ``max_events``: newest events kept (0: the events table is not read at all, unless
    ``health``).
    ``from_state``: start from gold's ``rate_state`` (False: read every rates file).
    ``health``: also count what operators alert on, from the first read on (what the tables
    held before is history, not news): events per (broker, event name, severity) in
    ``event_counts`` and quarantined messages per landing broker in ``quarantined``.
    A read that must start over (rows removed: retention, a backfill) adds nothing.
    """

    root: Path | str  # a folder, or a bucket's URI (s3a://bucket/prefix)
    max_events: int = 20
    from_state: bool = True
    health: bool = False
    event_counts: dict[tuple[str, str, str], int] = field(init=False, default_factory=dict)
    quarantined: dict[str, int] = field(init=False, default_factory=dict)
    events: pa.Table = field(init=False)
    _latest: pl.DataFrame = field(init=False)
    _state: pl.DataFrame | None = field(init=False, default=None)
    _rows: pl.DataFrame | None = field(init=False, default=None)
    _agents: dict[str, tuple[int, int]] | None = field(init=False, default=None)
    _lifecycles: pl.DataFrame = field(init=False)
    _liveness: pl.DataFrame = field(init=False)
    _objects: pl.DataFrame = field(init=False)
    _brokers: pl.DataFrame = field(init=False)
    _ended: pl.DataFrame = field(init=False)

    def __post_init__(self) -> None:
        base = os.fspath(self.root)
        if not storage.is_object_store(base):  # a bucket's URI stays a string
            self.root = Path(base)
        gold = storage.join(base, "gold")
        self.state_tail = StateTail(storage.join(gold, "rate_state"))
        self.rates_tail = RatesTail(
            storage.join(gold, "statistic_rates"),
            (lambda: self.state_tail.txn) if self.from_state else None,
        )
        self.events_tail = EventsTail(storage.join(base, "silver", "events"), max(self.max_events, 1))
        self.quarantine_tail = DeltaTail(
            storage.join(base, "silver", "quarantine"), QUARANTINE, ("broker_name",)
        )
        self.lifecycles_tail = DeltaTail(
            storage.join(gold, "lifecycle_state"), LIFECYCLE_STATE, LIFECYCLE_COLUMNS
        )
        self.liveness_tail = DeltaTail(
            storage.join(gold, "agent_liveness"), AGENT_LIVENESS, LIVENESS_COLUMNS
        )
        rate_schema = self.rates_tail.schema.append(pa.field("series", pa.string()))
        self._latest = _keyed(to_frame(rate_schema.empty_table()))
        self._liveness = to_frame(self.liveness_tail.schema.empty_table())
        self.events = self.events_tail.schema.empty_table()
        self._set_lifecycles(to_frame(self.lifecycles_tail.schema.empty_table()))

    # -------------------------------------------------------------- state

    @property
    def latest(self) -> pa.Table:
        """The latest row per series and statistic (every object, ended ones included)."""
        return to_arrow(self._latest.drop("_k"))

    @latest.setter
    def latest(self, rows: pa.Table) -> None:
        self._latest = _keyed(to_frame(rows))
        self._rows = self._agents = None

    @property
    def rates_version(self) -> int | None:
        return self.rates_tail.version

    @property
    def ended(self) -> set[tuple[str, str]]:
        """(agent, object_id) of objects with no live lifecycle row."""
        return set(self._ended.iter_rows())

    def _set_lifecycles(self, rows: pl.DataFrame) -> None:
        """The lifecycle rows (latest per object and creation), and what the view derives:
        per agent its broker, the objects that ended, and per object (``_objects``) its
        name, broker, whether it ended and whether it is the one shown of its name
        (``collapse``)."""
        self._lifecycles = rows
        latest = _last_frame(rows, OBJECT_KEY, ("batch_id", "last_seen_ns"))
        self._brokers = (
            latest.filter(pl.col("broker").is_not_null())
            .sort("batch_id", "last_seen_ns")
            .group_by("agent")
            .agg(pl.col("broker").last().alias("_agent_broker"))
        )
        live = rows.filter(pl.col("state") == "live").select(OBJECT_KEY).unique()
        gone = rows.filter(pl.col("state") != "live").select(OBJECT_KEY).unique()
        self._ended = gone.join(live, on=list(OBJECT_KEY), how="anti")
        objs = latest.join(self._brokers, on="agent", how="left").join(
            self._ended.with_columns(_ended=pl.lit(True)), on=list(OBJECT_KEY), how="left"
        )
        unnamed = objs["index_key"].filter(objs["name"].is_null())
        objs = objs.with_columns(
            name=pl.coalesce("name", _key_names(objs["index_key"], unnamed), "object_id"),
            broker=pl.coalesce("broker", "_agent_broker", "agent"),
            _ended=pl.col("_ended").fill_null(False),
        )
        self._objects = collapse(objs)

    def refresh(self) -> bool:
        """Reads what the tables gained; True when anything changed.

        The lifecycles, liveness and state are read in a second thread while this one
        reads the rates (once the state's snapshot is chosen: the rates read after it hold
        every interval it refers to); a start from the state then reads the rates of the
        counters that are not quiet by them (``_read_recent``)."""
        self.state_tail.snapped.clear()
        with ThreadPoolExecutor(max_workers=1) as pool:
            side = pool.submit(self._refresh_side)
            self.state_tail.snapped.wait()
            try:
                rates = self.rates_tail.read()
                ready = None
                if rates is not None and not rates.rows.column("index_key").null_count:
                    ready = _keyed(to_frame(with_series(rates.rows)))  # needs no other table
            finally:
                changed = side.result()
        if rates is not None:
            changed = True
            self._fold_rates(rates.rows, rates.reset, ready)
            if rates.reset and self.rates_tail.unread is not None:
                self._read_recent()
        if self.max_events > 0 or self.health:
            events = self.events_tail.read()
            if events is not None:
                changed = True
                if self.health and not events.reset:
                    self._count_events(events.rows)
            if events is not None and self.max_events > 0:
                both_e = (
                    events.rows if events.reset else pa.concat_tables([self.events, events.rows])
                )
                both_e = _last_per_key(both_e, EVENT_ID, ())
                both_e = both_e.sort_by(
                    [("timestamp_ns", "descending"), *((c, "descending") for c in EVENT_ID)]
                )
                self.events = both_e.slice(0, self.max_events)
        if self.health:
            changed = self._count_quarantine() or changed
        return changed

    def _count_events(self, rows: pa.Table) -> None:
        """Add events read to ``event_counts`` by (broker, event name, severity)."""
        brokers = self.brokers()
        names = rows.column("broker_name").to_pylist()
        agents = rows.column("agent").to_pylist()
        events = rows.column("event_name").to_pylist()
        severities = rows.column("severity").to_pylist()
        for name, agent, event, severity in zip(names, agents, events, severities, strict=True):
            key = (event_broker(name, agent, brokers), event or "-", severity_name(severity))
            self.event_counts[key] = self.event_counts.get(key, 0) + 1

    def _count_quarantine(self) -> bool:
        """Add messages quarantined since the last read to ``quarantined``; True if any."""
        tail = self.quarantine_tail
        if tail.version is None:
            tail.skip_to_latest()  # what was quarantined before the first read is history
            return False
        change = tail.read()
        if change is None:
            return False
        if not change.reset:
            for name in change.rows.column("broker_name").to_pylist():
                key = name or DEFAULT_BROKER
                self.quarantined[key] = self.quarantined.get(key, 0) + 1
        return True

    def _refresh_side(self) -> bool:
        """Lifecycles, liveness and state (``refresh``'s second thread); whether any changed.
        Sets the state's ``snapped`` whatever happens, so the rates read cannot wait forever."""
        changed = False
        try:
            state = self.state_tail.read()
            if state is not None:
                changed = True
                self._state = _baselines(state.rows)  # empty: no live series
            life = self.lifecycles_tail.read()
            if life is not None:
                changed = True
                df = to_frame(life.rows)
                both = df if life.reset else pl.concat([self._lifecycles, df], how="vertical_relaxed")
                self._set_lifecycles(
                    _last_frame(both, ("agent", "object_id", "create_ns"), ("batch_id", "last_seen_ns"))
                )
            beats = self.liveness_tail.read()
            if beats is not None:
                changed = True
                df = to_frame(beats.rows)
                old = self._liveness
                if beats.reset:  # gold merges the rows: an interval's earlier rows are gone
                    old = old.join(df.select(LIVENESS_KEY).unique(), on=list(LIVENESS_KEY), how="semi")
                both = pl.concat([old, df], how="vertical_relaxed")
                self._liveness = _heartbeats(both, self._state_batch())
        finally:
            self.state_tail.snapped.set()
        if changed:
            self._rows = self._agents = None
        return changed

    def _state_batch(self) -> int | None:
        """The gold batch of the state read (None: not known)."""
        return None if self.state_tail.txn is None else self.state_tail.txn[1]

    def _known(self, rows: pa.Table, reset: bool) -> pa.Table | None:
        """Index keys known for objects, for rows that lack theirs (``with_series``)."""
        if not rows.column("index_key").null_count:
            return None
        parts = [] if reset else [to_arrow(self._latest.select("agent", "object_id", "index_key"))]
        if self._state is not None:
            parts.append(to_arrow(self._state.select("agent", "object_id", "index_key")))
        return pa.concat_tables(parts) if parts else None

    def _fold_rates(self, rows: pa.Table, reset: bool, ready: pl.DataFrame | None = None) -> None:
        """The latest row per series of ``rows`` (+ what was kept, unless ``reset``);
        ``ready``: ``rows`` with their series and key already."""
        new = ready if ready is not None else _keyed(to_frame(with_series(rows, self._known(rows, reset))))
        new = _one_per_series(new, "end_ns", last=True)
        if not reset and self._latest.height:
            # A new row replaces the kept one of its series unless that one is later.
            old = self._latest.select("_k", *SERIES_KEY, pl.col("end_ns").alias("_old"))
            new = new.join(old, on="_k", how="left", suffix="_kept")
            if not _same_keys(
                new.filter(pl.col("_old").is_not_null()),
                new.filter(pl.col("_old").is_not_null()).select(
                    pl.col(f"{k}_kept").alias(k) for k in SERIES_KEY
                ),
            ):  # a collision: by the strings
                both = pl.concat([self._latest, new.select(self._latest.columns)], how="vertical_relaxed")
                self._latest = both.sort("end_ns").unique(subset=list(SERIES_KEY), keep="last")
                self._rows = self._agents = None
                return
            new = new.filter(pl.col("_old").is_null() | (pl.col("end_ns") >= pl.col("_old")))
            new = new.select(self._latest.columns)
            kept = self._latest.join(new.select("_k"), on="_k", how="anti")
            self._latest = pl.concat([kept, new], how="vertical_relaxed")
        else:
            self._latest = new
        self._rows = self._agents = None

    def _read_recent(self) -> None:
        """After a start from the state: the intervals ending at the latest samples of the
        counters that are not quiet, wherever the first read left them (a row from the
        state has no rate). A quiet counter's rate is 0 whatever its interval said, any
        other statistic shows its latest value: the state has both."""
        agents = self.agents()
        names = list(agents)
        seen = pl.col("agent").replace_strict(names, [agents[a][0] for a in names], default=None)
        cycle = pl.col("agent").replace_strict(names, [agents[a][1] for a in names], default=None)
        quiet = (cycle > 0) & (seen - pl.col("end_ns") > (QUIET_CYCLES * cycle).cast(pl.Int64))
        rows = self.rows()
        need = rows.filter(
            pl.col("from_state") & (pl.col("kind") == "counter") & ~quiet.fill_null(False)
        ).select("_k", "end_ns", "agent", "object_id")  # as with_quiet judges (ended too)
        more, whole = self.rates_tail.read_more(need["end_ns"].unique().to_numpy())
        self.rates_tail.unread = None
        if whole:
            self._fold_rates(more, True)
            return
        # Only the intervals looked for: the other rows of those files are older than what
        # the view holds, or of series it does not show.
        objects = pa.array(need["object_id"].unique().to_list(), pa.string())
        more = more.filter(pc.is_in(more.column("object_id"), value_set=objects))
        if not more.num_rows:
            return
        new = _keyed(to_frame(with_series(more, self._known(more, reset=False))))
        new = new.join(need.select("_k", "end_ns"), on=["_k", "end_ns"], how="semi")
        if new.height:  # rows ending at their series' latest sample: they replace the made ones
            new = new.unique(subset="_k").select(self._latest.columns)
            self._latest = pl.concat(
                [self._latest.join(new.select("_k"), on="_k", how="anti"), new],
                how="vertical_relaxed",
            )
            self._rows = pl.concat(
                [rows.join(new.select("_k"), on="_k", how="anti"),
                 new.with_columns(from_state=pl.lit(False))],
                how="vertical_relaxed",
            )  # fmt: skip
            self._agents = None

    @property
    def versions(self) -> tuple[int | None, ...]:
        """The versions read of every table the current rows depend on."""
        return (
            self.rates_version, self.state_tail.version, self.lifecycles_tail.version,
            self.liveness_tail.version,
        ) + ((self.events_tail.version, self.quarantine_tail.version) if self.health else ())  # fmt: skip

    # -------------------------------------------------------------- what is current

    def rows(self) -> pl.DataFrame:
        """One row per series of gold's state (every series, if there is no state table):
        the rates row of its latest interval when one ends at or after its latest sample,
        else a row made from the state (``from_state``: that sample's time and value,
        no rate: the sample made no interval yet, or the interval was not read)."""
        if self._rows is not None:
            return self._rows
        if self._state is None:
            self._rows = self._latest.with_columns(from_state=pl.lit(False))
            return self._rows
        keys = list(SERIES_KEY)
        st = self._state
        right = st.select("_k", "_base", *(pl.col(k).alias(f"_s_{k}") for k in keys))
        real = self._latest.join(right, on="_k", how="inner")
        if not _same_keys(real, real.select(pl.col(f"_s_{k}").alias(k) for k in keys)):
            real = self._latest.join(st.select(*keys, "_base"), on=keys, how="inner")  # collision
        real = real.filter(pl.col("end_ns") >= pl.col("_base")).select(self._latest.columns)
        made = st.join(real.select("_k"), on="_k", how="anti").select(
            "agent", "dialect", "package", "class_name", "object_id", "index_key", "statistic",
            "kind", pl.lit(None, pl.Int64).alias("start_ns"), pl.col("_base").alias("end_ns"),
            (pl.col("_base") // 1000).cast(pl.Datetime("us", "UTC")).alias("end_time"),
            "value", pl.lit(None, pl.Float64).alias("rate"), pl.lit(None, pl.String).alias("reset"),
            "series", "_k",
        )  # fmt: skip
        self._rows = pl.concat(
            [real.with_columns(from_state=pl.lit(False)),
             made.with_columns(from_state=pl.lit(True))],
            how="vertical_relaxed",
        )  # fmt: skip
        return self._rows

    def agents(self) -> dict[str, tuple[int, int]]:
        """Per agent: (the latest time it was seen, its publish cycle), both in ns.

        Seen: its latest heartbeat (gold ``agent_liveness``, of the batches up to the state's
        read) or the latest sample of any of its series (``rows``). Cycle: the spacing of its heartbeats over its open up
        interval (the agent's own clock), else the interval it declares (V2
        ``_heartbeat_interval``), else the median length of the latest intervals of its
        series (those the view holds: after a start from the state, the recent ones).
        """
        if self._agents is not None:
            return self._agents
        seen: dict[str, int] = {}
        cycle: dict[str, int] = {}
        batch = self._state_batch()
        beats = self._liveness
        if batch is not None:
            # Gold commits a batch's liveness beside its rates, and its state last: a
            # heartbeat of a batch after the state's may be read before that batch's rates
            # are, and would show its counters quiet (0/s) in between.
            beats = beats.filter(pl.col("batch_id") <= batch)
        newest = _last_frame(
            _last_frame(beats, LIVENESS_KEY, ("last_heartbeat_ns", "heartbeats")),
            ("agent",), ("up_start_ns",),
        )  # fmt: skip
        for r in newest.iter_rows(named=True):
            a, last = r["agent"], r["last_heartbeat_ns"]
            seen[a] = last
            n = r["heartbeats"] or 0
            if n >= 2:
                cycle[a] = (last - r["up_start_ns"]) // (n - 1)
            elif r["interval_s"]:
                cycle[a] = int(r["interval_s"] * NS)
        t = self.rows()
        if t.height:
            for a, end in t.group_by("agent").agg(pl.col("end_ns").max()).iter_rows():
                seen[a] = max(seen.get(a, end), end)
            missing = [a for a in seen if a not in cycle]
            if missing:
                ok = t.filter(
                    pl.col("agent").is_in(missing) & pl.col("reset").is_null()
                    & pl.col("start_ns").is_not_null()
                )  # fmt: skip
                med = ok.group_by("agent").agg((pl.col("end_ns") - pl.col("start_ns")).median())
                for a, n in med.iter_rows():
                    if n:
                        cycle[a] = int(n)
        self._agents = {a: (s, cycle[a]) for a, s in seen.items() if a in cycle}
        return self._agents

    def current_frame(
        self, where: pl.Expr | None = None, named: bool = True, collapsed: bool = False
    ) -> pl.DataFrame:
        """``current`` as polars, of the rows ``where`` selects (a filter on their columns:
        ``class_name``, ``statistic``, ...), with ``name``, ``broker``, ``agents`` and
        ``ambiguous`` (``named``); ``collapsed``: only the objects ``collapse`` keeps."""
        t = self.rows()
        if where is not None:
            t = t.filter(where)
        t = t.join(self._objects.select(*OBJECT_KEY, *_OBJECT_COLUMNS), on=list(OBJECT_KEY), how="left")
        keep = ~pl.col("_ended").fill_null(False)
        if collapsed:
            keep = keep & pl.col("_keep").fill_null(True)
        t = t.filter(keep)
        t = to_frame(with_quiet(to_arrow(t), self.agents()))
        t = t.drop("_k")
        if not named:
            return t.drop(*_OBJECT_COLUMNS)
        unnamed = t["index_key"].filter(t["_name"].is_null())
        t = t.join(self._brokers, on="agent", how="left")
        return t.with_columns(
            name=pl.coalesce("_name", _key_names(t["index_key"], unnamed), "object_id"),
            broker=pl.coalesce("_broker", "_agent_broker", "agent"),
            agents=pl.coalesce("_agents", pl.concat_list("agent")),
            ambiguous=pl.col("_ambiguous").fill_null(False),
        ).drop(*_OBJECT_COLUMNS, "_agent_broker")

    def current(self) -> pa.Table:
        """The latest row per series and statistic (``rows``), without objects that have
        ended (deleted, or lost with their agent) by the lifecycle table, quiet counters at
        0, with the object's ``name`` and ``broker``.

        An agent that publishes on change (qpidd) leaves an object out of a cycle when
        nothing in it changed: once the agent was seen more than ``QUIET_CYCLES`` publish
        cycles after a counter's latest interval ended, that counter's rate is 0 (column
        ``quiet`` true); gauges and other values keep their last value (unchanged)."""
        return to_arrow(self.current_frame())

    def objects(self) -> pl.DataFrame:
        """Live objects per (broker, package, class_name): ``count``. A broker publishing
        through several agents (AM2 and V2) counts its objects once (the largest count)."""
        live = self._objects.filter(~pl.col("_ended") & (pl.col("state") == "live"))
        per_agent = live.group_by(pl.col("_broker").alias("broker"), "agent", "package",
                                  "class_name").len("count")  # fmt: skip
        return per_agent.group_by("broker", "package", "class_name").agg(pl.col("count").max())

    def queues(self, sort: str = "enqueue", limit: int | None = None) -> list[QueueRow]:
        """Queues with their current enqueue/dequeue rates, depth and consumers, one row per
        (broker, name) (``collapse``)."""
        t = self.current_frame(
            (pl.col("class_name") == "queue")
            & pl.col("statistic").is_in([ENQUEUES, DEQUEUES, DEPTH, CONSUMERS]),
            collapsed=True,
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
            r["broker"] = event_broker(r.get("broker_name"), r["agent"], brokers)
        return rows

    def agent_health(self) -> pl.DataFrame:
        """Per agent whose publish cycle is known: its broker (gold's identity, else the
        agent id), its landing broker (``broker_name``), when gold last saw it, its
        cycle, and its silence: how far the newest time gold holds from any agent of the
        same landing broker is past its last sighting. The silence does not grow while
        the pipeline lags (every agent's data is late alike); when every agent of a
        landing broker is silent, the pipeline's newest time stops (``newest_by_broker``).
        """
        agents = self.agents()
        brokers = self.brokers()
        names = list(agents)
        df = pl.DataFrame(
            {
                "agent": names,
                "broker": [brokers.get(a, a) for a in names],
                "last_seen_ns": [agents[a][0] for a in names],
                "cycle_ns": [agents[a][1] for a in names],
            },
            schema={"agent": pl.String, "broker": pl.String, "last_seen_ns": pl.Int64,
                    "cycle_ns": pl.Int64},
        )  # fmt: skip
        # A named broker's agents are ``<name>/<agent>`` in gold (pipeline.gold.names'
        # fleet_broker; that package imports Spark, which this view must not).
        named = pl.col("agent").str.contains("/", literal=True)
        fleet = pl.col("agent").str.split_exact("/", 1).struct.field("field_0")
        df = df.with_columns(broker_name=pl.when(named).then(fleet).otherwise(pl.lit(DEFAULT_BROKER)))
        newest = pl.col("last_seen_ns").max().over("broker_name")
        return df.with_columns(silence_ns=newest - pl.col("last_seen_ns")).sort("broker", "agent")

    def newest_by_broker(self, health: pl.DataFrame | None = None) -> dict[str, int]:
        """Per landing broker (``broker_name``): the newest time (ns) gold holds of any of
        its agents (a heartbeat or a sample): how far the pipeline has come. ``health``:
        ``agent_health()`` when the caller has it already."""
        df = self.agent_health() if health is None else health
        return dict(df.group_by("broker_name").agg(pl.col("last_seen_ns").max()).iter_rows())


_OBJECT_COLUMNS = ("_name", "_broker", "_keep", "_agents", "_ambiguous", "_ended", "state")


def _key_names(index_keys: pl.Series, wanted: pl.Series | None = None) -> pl.Series:
    """``last_index_value`` of each key (null where not ``wanted``), computed once per
    distinct key."""
    keys = (index_keys if wanted is None else wanted).unique().drop_nulls()
    names = [last_index_value(k) for k in keys.to_list()]
    return index_keys.replace_strict(keys, names, default=None, return_dtype=pl.String)


def collapse(objects: pl.DataFrame) -> pl.DataFrame:
    """Which object shows each (broker, package, class, name): a broker publishing an object
    through several agents (qpidd: QMF v1 as agent ``1.0`` and v2 as
    ``apache.org:qpidd:<uuid>``) shows it once, from the agent whose object was seen last
    (``last_seen_ns``; V2 on a tie, then the agent id).

    ``objects``: one row per (agent, object_id) with ``name``, ``broker``, ``dialect``,
    ``package``, ``class_name``, ``last_seen_ns``, ``state`` and ``_ended``. Out, per object:
    its class, ``_name``, ``_broker``, ``_keep`` (it is shown), ``_agents`` (every agent publishing
    the name, sorted), ``_ambiguous`` (one agent has two objects of the name: different
    objects, all shown, told apart by agent and object id), ``_ended`` and ``state``.
    Ended objects are not shown and take no part.
    """
    group = ["broker", "package", "class_name", "name"]
    live = objects.filter(~pl.col("_ended"))
    groups = live.group_by(group).agg(
        pl.col("agent").unique().sort().alias("_agents"),
        (pl.len() > pl.col("agent").n_unique()).alias("_ambiguous"),
    )
    v2_first = (pl.col("dialect") != "V2").cast(pl.Int8)
    ranked = (
        live.join(groups, on=group, how="left")
        .sort([pl.col("last_seen_ns"), v2_first, pl.col("agent")], descending=[True, False, False])
        .with_columns(_rank=pl.int_range(pl.len()).over(group))
        .with_columns(_keep=pl.col("_ambiguous") | (pl.col("_rank") == 0))
    )
    out = pl.concat(
        [ranked.drop("_rank"),
         objects.filter(pl.col("_ended")).with_columns(
             _agents=pl.concat_list("agent"), _ambiguous=pl.lit(False), _keep=pl.lit(False))],
        how="diagonal_relaxed",
    )  # fmt: skip
    return out.select(
        *OBJECT_KEY, "package", "class_name", pl.col("name").alias("_name"),
        pl.col("broker").alias("_broker"), "_keep", "_agents", "_ambiguous", "_ended", "state",
    )  # fmt: skip


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


def event_broker(name: str | None, agent: str | None, brokers: dict[str, str]) -> str:
    """The broker an event names: gold's identity of its agent (a named broker's agents
    are ``<name>/<agent>`` there), else that agent id, else the landing broker."""
    named = name not in (None, DEFAULT_BROKER)
    key = f"{name}/{agent}" if named and agent is not None else agent
    if key is None:
        return name or DEFAULT_BROKER
    return brokers.get(key, key)


def severity_name(severity: int | None) -> str:
    if severity is not None and 0 <= severity < len(SEVERITIES):
        return SEVERITIES[severity]
    return "-" if severity is None else str(severity)
