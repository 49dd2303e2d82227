"""Tails of the Delta tables the live view follows: each read returns what was committed since.

``DeltaTail`` follows one table through its log: the first read takes the live
files, later reads parse the commit files ``_delta_log/<version>.json`` after
the last version read, which list exactly the files each commit added or
removed; those files are read with pyarrow.parquet (never through delta-rs'
dataset readers). ``StateTail`` (gold's ``rate_state``, rewritten whole),
``RatesTail`` (``statistic_rates``: the first read goes newest commit first
down to the state's batch) and ``EventsTail`` (the newest events) specialise
the first read. What is made of the rows is ``pipeline.views.live``'s business.
"""

from __future__ import annotations

import heapq
import json
import math
import os
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.lake import storage
from pipeline.lake.retention import is_retention_commit
from schemas.gold import RATE_STATE, STATISTIC_RATES
from schemas.silver import EVENTS

if TYPE_CHECKING:
    from deltalake import DeltaTable

RATE_COLUMNS = (
    "agent", "dialect", "package", "class_name", "object_id", "index_key", "statistic", "kind",
    "start_ns", "end_ns", "end_time", "value", "rate", "reset",
)  # fmt: skip
EVENT_COLUMNS = (
    "partition", "offset", "record_index", "broker_name", "agent", "package", "event_name",
    "severity",
    "timestamp_ns", "event_time", "arguments",
)  # fmt: skip
STATE_COLUMNS = (
    "agent", "dialect", "package", "class_name", "object_id", "index_key", "series", "statistic",
    "kind", "update_ns", "value",
)  # fmt: skip
OLDEST = pl.CompatLevel.oldest()


def _subschema(schema: pa.Schema, names: tuple[str, ...]) -> pa.Schema:
    """The named columns of ``schema``, nullable; a name the schema lacks is a string
    (a column newer than the code reading, e.g. ``name`` before gold wrote it)."""
    return pa.schema(
        [
            schema.field(n).with_nullable(True) if n in schema.names else pa.field(n, pa.string())
            for n in names
        ]
    )


def to_arrow(df: pl.DataFrame, schema: pa.Schema | None = None) -> pa.Table:
    """A polars frame as Arrow (plain string columns), cast to ``schema`` when given."""
    t = df.to_arrow(compat_level=OLDEST)
    return t if schema is None else t.select(schema.names).cast(schema)


def to_frame(t: pa.Table) -> pl.DataFrame:
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
        self.path = storage.location(path)
        self.schema = _subschema(schema, columns)
        self.version: int | None = None
        self.files_read = 0  # by the last whole read

    def _log(self, version: int) -> str:
        return storage.join(self.path, "_delta_log", f"{version:020d}.json")

    def exists(self) -> bool:
        """A log with a commit (the folder exists a moment before its first commit)."""
        names = storage.list_files(storage.join(self.path, "_delta_log"))
        return any(n.endswith((".json", ".checkpoint.parquet")) for n in names)

    def read(self) -> Change | None:
        """The new rows, or None when nothing was committed since (or the table is not there)."""
        if self.version is None:
            return self._read_all() if self.exists() else None
        adds: list[str] = []
        version = self.version
        while storage.exists(self._log(version + 1)):
            try:
                actions = _commit_actions(self._log(version + 1))
            except FileNotFoundError:  # cleaned up between the check and the read
                return self._read_all()
            if is_retention_commit(actions):
                # Rows deleted for their age, the rest rewritten (already read): a view of
                # now keeps what it read, as the jobs' streams skip such commits.
                version += 1
                continue
            for action in actions:
                if "add" in action:
                    # A compaction's files (dataChange false) hold rows already read: the
                    # files it removed were read when they were added (or are read now).
                    if action["add"].get("dataChange", True):
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

    def skip_to_latest(self) -> bool:
        """Start after the table's current version without reading its rows (a reader
        that only wants what is added from now on); False when there is no table yet."""
        if not self.exists():
            return False
        self.version = self.snapshot().version()
        return True

    def snapshot(self) -> DeltaTable:
        """The table's current snapshot (protocol checked)."""
        from pipeline.lake import delta, snapshot

        dt = storage.rs_table(self.path)
        delta.check_protocol(snapshot.rs_protocol(dt), write=False)
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
        from pipeline.lake import snapshot

        return snapshot.local_path(self.path, delta_path)

    def _read_files(self, delta_paths: list[str]) -> pa.Table:
        pieces = []
        for p in delta_paths:
            pf = storage.parquet_file(self._local(p))
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
    return [json.loads(line) for line in storage.read_text(path).splitlines() if line.strip()]


def _txn(actions: list[dict[str, Any]]) -> tuple[str, int] | None:
    for action in actions:
        if "txn" in action:
            return action["txn"]["appId"], int(action["txn"]["version"])
    return None


class StateTail(DeltaTail):
    """gold ``rate_state`` (rewritten whole by every gold batch: every change is read whole),
    and the app transaction (appId, batch id) of the commit read: the batch it is from.
    ``snapped`` is set once the snapshot to read is chosen (``txn`` is then its own)."""

    def __init__(self, path: str | os.PathLike[str]):
        super().__init__(path, RATE_STATE, STATE_COLUMNS)
        self.txn: tuple[str, int] | None = None
        self.snapped = threading.Event()

    def read(self) -> Change | None:
        """The whole state when a commit came since the last read (each batch replaces it,
        and an empty state's replacement adds no file: its app transaction is still news)."""
        if self.version is not None and not storage.exists(self._log(self.version + 1)):
            return None
        return self._read_all() if self.exists() else None

    def _read_all(self) -> Change | None:
        for _attempt in range(3):
            try:
                dt = self.snapshot()
                version = dt.version()
                try:
                    self.txn = _txn(_commit_actions(self._log(version)))
                except FileNotFoundError:  # checkpointed and cleaned up: the batch is unknown
                    self.txn = None
                self.snapped.set()
                paths = pa.table(dt.get_add_actions(flatten=True)).column("path").to_pylist()
                rows = self._read_files(paths)
            except FileNotFoundError:  # a file went between the snapshot and the read
                continue
            self.version = version
            self.files_read = len(paths)
            return Change(version, rows, reset=True)
        raise RuntimeError(f"{self.path}: files keep disappearing while reading the table")


class RatesTail(DeltaTail):
    """``statistic_rates``, whose whole reads can start from gold's state: ``guide`` gives
    the (appId, batch id) of the state read (None: read every file)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        guide: Callable[[], tuple[str, int] | None] | None = None,
    ):
        super().__init__(path, STATISTIC_RATES, RATE_COLUMNS)
        self.guide = guide
        self.unread: Unread | None = None  # files the last whole read left for read_more

    def _read_all(self) -> Change | None:
        txn = None if self.guide is None else self.guide()
        if txn is not None:
            for _attempt in range(3):
                try:
                    return self._read_newest(txn)
                except FileNotFoundError:  # vacuumed between the snapshot and the read
                    continue
        self.unread = None
        return super()._read_all()

    def _read_newest(self, txn: tuple[str, int]) -> Change:
        """The rows of every commit from the newest down to the rates commit of the state's
        batch ``txn``; the other files stay in ``unread``.

        Gold appends a batch's rates before it replaces the state, and a series' intervals
        in sample-time order: a row after a series' baseline (its latest sample in the
        state) can only be in those commits. Without the state's batch among the commit
        files (log cleaned up) every file is read.
        """
        app, batch = txn
        dt = self.snapshot()
        unread = Unread(dt, "end_ns")
        paths: list[str] = []
        for step in self.newest_first(dt, unread):
            paths += step.paths
            if any(a == app and v <= batch for a, v in step.txns):
                break
        rows = self._read_files(paths)
        self.files_read = len(paths)
        self.version = dt.version()
        self.unread = unread
        return Change(self.version, rows, reset=True)

    def read_more(self, times: np.ndarray) -> tuple[pa.Table, bool]:
        """Of the files the last whole read left, every one whose ``end_ns`` statistics span
        one of ``times`` (a file without statistics: always): only those can hold a row
        ending then. (rows, whether they are the whole table: a file was gone).
        """
        if self.unread is None or not len(times):
            return self.schema.empty_table(), False
        times = np.sort(times)
        paths = []
        for key, f in list(self.unread.files.items()):
            i = int(np.searchsorted(times, f.low))
            if i < len(times) and times[i] <= f.high:
                self.unread.pop(key)
                paths.append(f.path)
        try:
            rows = self._read_files(paths)
        except FileNotFoundError:  # compacted and vacuumed since: read the table whole
            self.unread = None
            change = super()._read_all()
            assert change is not None
            return change.rows, True
        self.files_read += len(paths)
        return rows, False


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
