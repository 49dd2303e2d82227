"""One version of a table as its log says it is: schema, partitioning, protocol, the
apps' last batches and the live files with their statistics.

The jobs' drivers plan from this (which files a merge rewrites, what a task reads,
whether a batch is already in), so it comes from delta-spark's own snapshot
(``DeltaLog``) whenever a Spark session runs in the process: the same log reader,
file systems and caches as the jobs' commits. delta-rs (``deltalake``) reads it only
where no Spark session runs (``qmf top``, ``qmf serve-metrics``, the run summary).

delta-spark keeps a small table's live files and app transactions in each version's
checksum (``.crc``, up to ``spark.databricks.delta.allFilesInCrc.thresholdNumFiles``
files, 50 by default); listing those costs no Spark job. A larger table's files come
from delta-spark's state reconstruction, a Spark job over its checkpoint and commits.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from datetime import date, datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["Engine", "FileEntry", "Protocol", "Snapshot", "active_session", "jvm_static", "load"]

Engine = Literal["delta-spark", "delta-rs"]


@dataclass(frozen=True)
class FileEntry:
    """A live data file: its path as the log writes it (relative and URI-encoded, or a
    URI), size, modification time (ms), partition values as strings, and Delta's
    statistics JSON (None when the writer kept none)."""

    path: str
    size: int
    modification_time: int
    partition_values: dict[str, str | None]
    stats: str | None


@dataclass(frozen=True)
class Protocol:
    min_reader: int
    min_writer: int
    reader_features: frozenset[str]
    writer_features: frozenset[str]


@dataclass
class Snapshot:
    """A table version; ``files`` and ``app_version`` are read on first use."""

    root: str
    version: int
    schema: pa.Schema
    partition_columns: list[str]
    protocol: Protocol
    engine: Engine
    _jsnap: Any = field(default=None, repr=False)
    _rs: Any = field(default=None, repr=False)
    _apps: dict[str, int | None] = field(default_factory=dict, repr=False)

    @cached_property
    def files(self) -> list[FileEntry]:
        if self._jsnap is not None:
            return _jvm_files(self._jsnap, self._checksum)
        return _rs_files(self._rs)

    def app_version(self, app_id: str) -> int | None:
        """The app's last committed batch in this version (None: it never committed)."""
        if app_id not in self._apps:
            if self._jsnap is not None:
                found = jvm_app_version(self._jsnap, app_id, self._checksum)
                self._apps[app_id] = None if found < 0 else found
            else:
                v = self._rs.transaction_version(app_id)
                self._apps[app_id] = None if v is None else int(v)
        return self._apps[app_id]

    @cached_property
    def _checksum(self) -> Any | None:
        return jvm_checksum(self._jsnap)

    @cached_property
    def _stats(self) -> pa.Table:
        if self._jsnap is not None:
            return _stats_table(self.files, self.schema, self.partition_columns)
        return _rs_stats(self._rs)

    def stats(self) -> pa.Table:
        """One row per live file, in ``files`` order: ``path``, ``size_bytes``,
        ``modification_time`` (ms), ``num_records``, and ``min.<c>``, ``max.<c>``,
        ``null_count.<c>`` of the top-level columns with such statistics (typed as the
        column; null where a file has none)."""
        return self._stats


def active_session() -> SparkSession | None:
    """The thread's active SparkSession, else the process's first one (a thread of the
    driver has no active session of its own); None where pyspark runs no driver (a
    Spark task's worker, ``qmf top``: pyspark not even imported)."""
    if "pyspark.sql" not in sys.modules:
        return None
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    return active if active is not None else SparkSession._instantiatedSession


def load(
    path: str | os.PathLike[str], version: int | None = None, *, engine: Engine | None = None
) -> Snapshot:
    """The table's latest version (or ``version``): delta-spark's when a Spark session
    runs in the process, delta-rs's otherwise (``engine`` chooses; "delta-spark" starts
    the project's session if none runs)."""
    from pipeline.lake import storage

    root = storage.location(path)
    spark = active_session()
    if engine == "delta-spark" and spark is None:
        from pipeline.lake import transaction

        spark = transaction.new_session()
    if spark is not None and engine != "delta-rs":
        return _load_jvm(spark, root, version)
    return _load_rs(root, version)


# --- delta-spark ---------------------------------------------------------------


# Classes and static members the drivers use per commit and per table read, by dotted
# name, each looked up once per JVM gateway: py4j asks the JVM by reflection about every
# package level and static member it is handed by name (eight round trips for
# ``org.apache.spark.sql.delta.DeltaLog.forTable`` before the call itself), about 1 ms
# each; a commit made some 150 of them.
_STATICS: dict[str, Any] = {}
_STATICS_OF: list[Any] = [None]  # the JVM view they were looked up in
_STATICS_LOCK = threading.Lock()


def jvm_static(spark: SparkSession, dotted: str) -> Any:
    """The JVM class, static method or constant ``dotted`` (``java.util.ArrayList``,
    ``scala.Option.empty``), looked up once per JVM gateway."""
    jvm = spark._jvm
    assert jvm is not None
    with _STATICS_LOCK:
        if _STATICS_OF[0] is not jvm:
            _STATICS.clear()
            _STATICS_OF[0] = jvm
        found = _STATICS.get(dotted)
    if found is None:
        found = jvm
        for part in dotted.split("."):
            found = getattr(found, part)
        with _STATICS_LOCK:
            if _STATICS_OF[0] is jvm:
                _STATICS[dotted] = found
    return found


def delta_log(spark: SparkSession, root: str) -> Any:
    """delta-spark's ``DeltaLog`` of the table at ``root`` (cached by the JVM per path)."""
    path = jvm_static(spark, "org.apache.hadoop.fs.Path")(root)
    return jvm_static(spark, "org.apache.spark.sql.delta.DeltaLog.forTable")(spark._jsparkSession, path)


# delta-spark's snapshots as read here, by table root: (version, the JVM object's
# identity) -> Snapshot. ``DeltaLog.update`` hands back the same object while the table
# has no new commit, so a driver that reads a table every batch re-reads nothing of it
# (its schema, files and statistics cross py4j once per version).
_CACHE: dict[str, tuple[tuple[int, int], Snapshot]] = {}
_CACHE_LOCK = threading.Lock()
_CACHE_TABLES = 64


def _load_jvm(spark: SparkSession, root: str, version: int | None) -> Snapshot:
    dlog = delta_log(spark, root)
    if version is None:
        jsnap = _update(dlog)
    else:
        none = jvm_static(spark, "scala.Option.empty")()
        jsnap = dlog.getSnapshotAt(int(version), none, none, False)
    key = (int(jsnap.version()), int(jvm_static(spark, "java.lang.System.identityHashCode")(jsnap)))
    if key[0] < 0:
        raise FileNotFoundError(f"no Delta table at {root}")
    with _CACHE_LOCK:
        cached = _CACHE.get(root)
    if cached is not None and cached[0] == key:
        return cached[1]
    snap = _describe(root, jsnap)
    with _CACHE_LOCK:
        if version is None or cached is None or cached[0][0] <= key[0]:
            _CACHE.pop(root, None)
            _CACHE[root] = (key, snap)
            while len(_CACHE) > _CACHE_TABLES:
                _CACHE.pop(next(iter(_CACHE)))
    return snap


def _describe(root: str, jsnap: Any) -> Snapshot:
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    meta = jsnap.metadata()
    struct = StructType.fromJson(json.loads(meta.schemaString()))
    schema = to_arrow_schema(struct, timezone="UTC", prefers_large_types=False)
    parts = [str(c) for c in _iterate(meta.partitionColumns())]
    proto = jsnap.protocol()
    return Snapshot(
        root=root,
        version=int(jsnap.version()),
        schema=schema,
        partition_columns=parts,
        protocol=Protocol(
            int(proto.minReaderVersion()),
            int(proto.minWriterVersion()),
            _feature_set(proto.readerFeatures()),
            _feature_set(proto.writerFeatures()),
        ),
        engine="delta-spark",
        _jsnap=jsnap,
    )


def _update(dlog: Any) -> Any:
    """``DeltaLog.update()`` (Scala defaults spelt out for py4j): the latest version."""
    return dlog.update(False, getattr(dlog, "update$default$2")(), getattr(dlog, "update$default$3")())


def _iterate(seq: Any) -> list[Any]:
    it = seq.iterator()
    out = []
    while it.hasNext():
        out.append(it.next())
    return out


def _feature_set(opt: Any) -> frozenset[str]:
    if not opt.isDefined():
        return frozenset()
    return frozenset(str(f) for f in _iterate(opt.get()))


# Pauses before each new read of a version's checksum that was not there yet (0.2 s in
# all): its writer writes it right after the commit file.
_CHECKSUM_WAITS = (0.01, 0.03, 0.06, 0.1)


def jvm_checksum(jsnap: Any) -> Any | None:
    """The version's checksum (``.crc``: its live files up to a threshold, and its app
    transactions), or None when it has none.

    A reader that lists the log between another process's commit file and its checksum
    reads the checksum again for up to 0.2 s before its caller falls back to a Spark
    job (measured: 3 of 20 polls of a table another process committed to every 0.3 s
    saw no checksum, and paid 0.9-2.9 s for the job)."""
    found = jsnap.checksumOpt()
    if found.isDefined():
        return found.get()
    dlog = jsnap.deltaLog()
    version = jsnap.version()
    for pause in _CHECKSUM_WAITS:
        time.sleep(pause)
        found = dlog.readChecksum(version, getattr(dlog, "readChecksum$default$2")())
        if found.isDefined():
            return found.get()
    return None


def jvm_app_version(jsnap: Any, app_id: str, checksum: Any | None) -> int:
    """The app's last batch in delta-spark's snapshot, -1 if none.

    Read from the version's ``checksum`` (``jvm_checksum``) because
    ``Snapshot.transactions`` rebuilds the table state in a Spark job on every new
    snapshot (0.5 s, measured); that is the fallback when a version has no checksum
    (a table delta-rs wrote).
    """
    if checksum is not None:
        found = checksum.setTransactions()
        if found.isDefined():
            for t in _iterate(found.get()):
                if t.appId() == app_id:
                    return int(t.version())
            return -1
    got = jsnap.transactions().get(app_id)
    return int(got.get()) if got.isDefined() else -1


def _jvm_files(jsnap: Any, checksum: Any | None) -> list[FileEntry]:
    """The live files: from the ``checksum`` when it lists them, else delta-spark's state
    reconstruction (a Spark job). Each crosses py4j as its log JSON (``AddFile.json``:
    faster than one Jackson serialization of the list, measured)."""
    listed = checksum.allFiles() if checksum is not None else None
    adds = listed.get() if listed is not None and listed.isDefined() else jsnap.allFiles().collectAsList()
    out = []
    for a in (json.loads(x.json())["add"] for x in _iterate(adds)):
        out.append(
            FileEntry(
                path=a["path"],
                size=int(a["size"]),
                modification_time=int(a.get("modificationTime") or 0),
                partition_values=dict(a.get("partitionValues") or {}),
                stats=a.get("stats"),
            )
        )
    return out


# --- delta-rs ------------------------------------------------------------------


def _load_rs(root: str, version: int | None) -> Snapshot:
    from pipeline.lake import storage

    dt = storage.rs_table(root, version)
    return Snapshot(
        root=root,
        version=int(dt.version()),
        schema=pa.schema(dt.schema().to_arrow()),
        partition_columns=list(dt.metadata().partition_columns),
        protocol=rs_protocol(dt),
        engine="delta-rs",
        _rs=dt,
    )


def rs_protocol(dt: Any) -> Protocol:
    """A delta-rs ``DeltaTable``'s protocol (the live views read with delta-rs)."""
    proto = dt.protocol()
    return Protocol(
        int(proto.min_reader_version),
        int(proto.min_writer_version),
        frozenset(proto.reader_features or ()),
        frozenset(proto.writer_features or ()),
    )


def _rs_files(dt: Any) -> list[FileEntry]:
    adds = pa.table(dt.get_add_actions(flatten=True))
    parts = list(dt.metadata().partition_columns)
    cols = {c: adds.column(c).to_pylist() for c in ("path", "size_bytes", "modification_time")}
    pcols = {c: adds.column(f"partition.{c}").to_pylist() for c in parts}
    nrec = adds.column("num_records").to_pylist() if "num_records" in adds.column_names else None
    out = []
    for i, p in enumerate(cols["path"]):
        mtime = cols["modification_time"][i]
        out.append(
            FileEntry(
                path=p,
                size=int(cols["size_bytes"][i]),
                modification_time=_ms(mtime),
                partition_values={c: partition_string(pcols[c][i]) for c in parts},
                stats=None if nrec is None or nrec[i] is None else json.dumps({"numRecords": nrec[i]}),
            )
        )
    return out


def _rs_stats(dt: Any) -> pa.Table:
    """delta-rs's flattened add actions, their modification time in ms as delta-spark's."""
    adds = pa.table(dt.get_add_actions(flatten=True))
    i = adds.column_names.index("modification_time")
    mtime = adds.column(i)
    if pa.types.is_timestamp(mtime.type):
        mtime = mtime.cast(pa.timestamp("ms")).cast(pa.int64())
    return adds.set_column(i, "modification_time", mtime.cast(pa.int64()))


def _ms(v: Any) -> int:
    if isinstance(v, datetime):
        return int(v.timestamp() * 1000)
    return int(v or 0)


def partition_string(value: Any) -> str | None:
    """A typed partition value as the log writes it."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, date):
        return value.isoformat()
    return str(value)


# --- statistics ------------------------------------------------------------------


_STAT_TYPES = (
    pa.types.is_integer, pa.types.is_floating, pa.types.is_string, pa.types.is_timestamp,
    pa.types.is_date32, pa.types.is_boolean,
)  # fmt: skip


def _stat_type(t: pa.DataType) -> bool:
    """Whether Delta's min/max of a column of type ``t`` is read back (a top-level
    primitive)."""
    return any(bool(check(t)) for check in _STAT_TYPES)


def _value(t: pa.DataType, raw: Any) -> Any:
    if raw is None:
        return None
    if pa.types.is_timestamp(t):
        return datetime.fromisoformat(str(raw))  # delta-spark writes ms with a "Z"
    if pa.types.is_date32(t):
        return date.fromisoformat(str(raw))
    return raw


def _stats_table(files: list[FileEntry], schema: pa.Schema, parts: list[str]) -> pa.Table:
    parsed = [json.loads(f.stats) if f.stats else {} for f in files]
    cols: dict[str, pa.Array] = {
        "path": pa.array([f.path for f in files], pa.string()),
        "size_bytes": pa.array([f.size for f in files], pa.int64()),
        "modification_time": pa.array([f.modification_time for f in files], pa.int64()),
        "num_records": pa.array([p.get("numRecords") for p in parsed], pa.int64()),
    }
    for f in schema:
        if f.name in parts:
            raw = pa.array([x.partition_values.get(f.name) for x in files], pa.string())
            cols[f"partition.{f.name}"] = raw.cast(f.type)
            continue
        nulls = [p.get("nullCount", {}).get(f.name) for p in parsed]
        if any(isinstance(n, int) for n in nulls):
            cols[f"null_count.{f.name}"] = pa.array([n if isinstance(n, int) else None for n in nulls], pa.int64())
        if not _stat_type(f.type):
            continue
        for kind, key in (("min", "minValues"), ("max", "maxValues")):
            values = [p.get(key, {}).get(f.name) for p in parsed]
            if any(v is not None for v in values):
                cols[f"{kind}.{f.name}"] = pa.array([_value(f.type, v) for v in values], f.type)
    return pa.table(cols)


def local_path(root: str, path: str) -> str:
    """A log path as a file's location: a local path, or a URI under a table on an
    object store (``pipeline.lake.storage``)."""
    from pipeline.lake import storage

    if storage.is_object_store(root):
        if storage.is_object_store(path):
            return storage.location(path)
        return storage.join(root, urllib.parse.unquote(path))
    if "://" in path:
        parsed = urllib.parse.urlparse(path)
        if parsed.scheme != "file":
            raise ValueError(f"only local files are supported, not {path}")
        return urllib.parse.unquote(parsed.path)
    if path.startswith("/"):
        return urllib.parse.unquote(path)
    return os.path.join(root, urllib.parse.unquote(path))
