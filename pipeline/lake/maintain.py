"""Table maintenance: retention, compaction and vacuum, safe while the streams run.

Rows older than their table's keep are deleted first (Delta's ``DELETE`` by
event time: ``retain_table``; the keeps are ``pipeline.lake.retention``'s).
Streaming writes leave one or a few small files per micro-batch and table;
reads then open thousands of files. ``maintain_table`` rewrites them into
few large files (Delta's ``OPTIMIZE``) and deletes files that no version
anyone may still read needs (Delta's ``VACUUM``), both through delta-spark in
a session of their own. Why it is safe with the bronze, silver and gold
streams running (docs/maintenance.md):

* rows: a compaction commit only re-packs rows (``dataChange=false`` adds and
  removes). Delta's streaming source skips such commits, so downstream jobs
  do not read the rows again; readers of any version see every row once. A
  retention commit deletes rows: the jobs' streams skip it (Delta's
  ``skipChangeCommits``), so nothing downstream is read twice or un-read;
* concurrent writers: appends commute with compaction (Delta's conflict
  check lets OPTIMIZE commit on top of them); writers that remove files
  (merges, replace commits) hold ``pipeline.lake.delta.table_lock`` shared from
  their snapshot to their commit and compaction holds it exclusive, so
  neither sees the other half-way. A conflict with any other writer fails
  the compaction's commit, which is retried on the new version;
* exactly once: app transactions (``txn`` actions) are table state, carried
  by every version: compaction and vacuum keep them;
* vacuum: a file is deleted only when it was removed more than
  ``retention_hours`` ago *and* it is not live in any version a stream or a
  recovery may still read (``stream_pins``): versions from the oldest
  Delta source offset a checkpoint's next (or replayed) batch starts at, and
  from the version before a not-yet-checkpointed batch of a streaming writer
  (silver's ``table_before`` reads it on a replay). Such files are left out of
  the inventory VACUUM is given (``VACUUM ... USING INVENTORY``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, Row, SparkSession

from pipeline.lake import delta, retention, snapshot, storage
from pipeline.lake.retention import RetentionPolicy, may_hold_rows_before
from pipeline.lake.snapshot import Snapshot

log = logging.getLogger(__name__)

DEFAULT_RETENTION_HOURS = 168  # Delta's default deletedFileRetentionDuration (1 week)
DEFAULT_TARGET_SIZE = 128 * 1024 * 1024
DEFAULT_MIN_FILES = 10
DEFAULT_ATTEMPTS = 5
# Tables maintained at once. A pass over small tables is mostly driver and log work
# (listing, planning, commits) between short jobs: two tables at a time keep two
# cores busy (a pass over the simulated lake's 15 tables: see docs/maintenance.md).
DEFAULT_PARALLEL = 2
OPERATION = "compact"


@dataclass(frozen=True)
class MaintainSettings:
    """What a maintenance pass does.

    ``min_files``: a table is compacted only when it has at least this many
    files smaller than ``target_size`` (a table rewritten whole every batch,
    such as gold's ``rate_state``, has one and is never touched).
    ``retention_hours``: removed files younger than this stay (readers of
    older snapshots, e.g. a notebook's query, still open them).
    """

    retention_hours: int = DEFAULT_RETENTION_HOURS
    target_size: int = DEFAULT_TARGET_SIZE
    min_files: int = DEFAULT_MIN_FILES
    dry_run: bool = False
    compact: bool = True
    vacuum: bool = True
    attempts: int = DEFAULT_ATTEMPTS
    parallel: int = DEFAULT_PARALLEL
    # Rows older than their table's keep are deleted first (pipeline.lake.retention);
    # ``now``: the time the keeps count back from (None: the pass's start).
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    now: datetime | None = None

    def __post_init__(self) -> None:
        if self.retention_hours < 0:
            raise ValueError("retention_hours must be >= 0")
        if self.target_size <= 0:
            raise ValueError("target_size must be > 0")
        if self.min_files < 2:
            raise ValueError("min_files must be >= 2 (one file cannot be compacted)")
        if self.attempts < 1:
            raise ValueError("attempts must be >= 1")
        if self.parallel < 1:
            raise ValueError("parallel must be >= 1")


@dataclass(frozen=True)
class StreamCheckpoint:
    """A streaming query's checkpoint and the Delta tables it streams from (Delta's source).

    ``reads=None``: not known. If such a checkpoint holds Delta source
    offsets, they could point into any table: nothing is vacuumed.
    """

    path: str
    reads: tuple[str, ...] | None = ()


@dataclass
class TableReport:
    """What maintenance did to one table (or would do, with ``dry_run``)."""

    path: str
    files_before: int = 0
    files_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    version_before: int = -1
    version_after: int = -1
    rows_deleted: int = 0
    cutoff: datetime | None = None
    compacted_removed: int = 0
    compacted_added: int = 0
    conflicts: int = 0
    keep_from: int | None = None
    vacuumed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    dry_run: bool = False

    def line(self) -> str:
        keep = "" if self.keep_from is None else f", versions >= {self.keep_from} kept"
        notes = f" ({'; '.join(self.notes)})" if self.notes else ""
        would = "would " if self.dry_run else ""
        retained = ""
        if self.cutoff is not None:
            verb = "would delete" if self.dry_run else "deleted"
            retained = f"{verb} {self.rows_deleted} rows before {self.cutoff:%Y-%m-%dT%H:%M:%SZ}, "
        if self.dry_run:
            done = f"{would}compact {self.compacted_removed} files, {would}vacuum {len(self.vacuumed)}"
        else:
            done = (
                f"compacted {self.compacted_removed} into {self.compacted_added}, "
                f"vacuumed {len(self.vacuumed)}"
            )
        done = retained + done
        return (
            f"{self.path}: files {self.files_before} -> {self.files_after}, {done}{keep}, "
            f"{self.seconds:.1f} s{notes}"
        )


# ---------------------------------------------------------------------------
# What the streams may still read


def _batch_ids(folder: str) -> list[int]:
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def _positions(checkpoint: str, batch_id: int) -> list[tuple[int, bool]] | None:
    """The Delta source offsets (version, starting snapshot) of one offset-log entry, in
    source order; None if the entry is gone. Other sources' offsets are left out."""
    try:
        with open(os.path.join(checkpoint, "offsets", str(batch_id)), encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        return None
    out: list[tuple[int, bool]] = []
    for line in lines[2:]:  # line 1: log version, line 2: batch metadata
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict) and "reservoirVersion" in value:
            out.append((int(value["reservoirVersion"]), bool(value.get("isStartingVersion"))))
    return out


def read_pin(checkpoint: str) -> int | None:
    """The oldest table version the query's next batch, or the replay of its last
    uncommitted one, reads from (its Delta source start offsets); None when it
    holds no such offset.

    Spark re-runs an uncommitted batch N from the end of batch N-1; a committed
    one is followed by a batch starting at its end. A position in version v reads
    the files commit v (and later ones) added, a starting-snapshot position the
    files live at v: both need versions >= v. An uncommitted first batch starts
    at the snapshot its end lies in, or, once past it, at a snapshot whose
    version is not logged: then every version is needed (0).
    """
    offsets = _batch_ids(os.path.join(checkpoint, "offsets"))
    if not offsets:
        return None
    last = offsets[-1]
    newest = _positions(checkpoint, last)
    if not newest:
        return None  # no Delta source (bronze reads the landing log)
    if last in set(_batch_ids(os.path.join(checkpoint, "commits"))):
        start = newest
    elif last > 0 and (previous := _positions(checkpoint, last - 1)):
        start = previous
    elif all(snapshot for _v, snapshot in newest):
        start = newest
    else:
        return 0  # a replay from a starting snapshot whose version is not logged
    return min(v for v, _snapshot in start)


def _query_id(checkpoint: str) -> str | None:
    try:
        with open(os.path.join(checkpoint, "metadata"), encoding="utf-8") as fh:
            return str(json.loads(fh.readline())["id"])
    except (FileNotFoundError, KeyError, json.JSONDecodeError):
        return None


def app_commits(table: str) -> list[tuple[str, int, int]]:
    """(app id, batch id, version) of the table's commits with an app transaction (the
    streaming writers', delta-rs's and delta-spark's alike)."""
    return delta.app_transactions(table)


def write_pin(checkpoint: str, commits: Sequence[tuple[str, int, int]]) -> int | None:
    """The version before this query's first commit (of a table's ``app_commits``) of
    a batch the checkpoint has not committed yet: a replay reads the table as of
    then (``pipeline.silver.table_before``). None if there is no such commit.

    The writers' app ids end with the checkpoint's query id
    (``qmf-<layer>-<query id>``).
    """
    qid = _query_id(checkpoint)
    if qid is None:
        return None
    committed = _batch_ids(os.path.join(checkpoint, "commits"))
    done = committed[-1] if committed else -1
    first = min((v for app, b, v in commits if app.endswith(qid) and b > done), default=None)
    return None if first is None else max(first - 1, 0)


def stream_pins(tables: Sequence[str], streams: Sequence[StreamCheckpoint]) -> dict[str, int]:
    """Per table, the oldest version some stream may still read (absent: none)."""
    pins: dict[str, int] = {}

    def pin(table: str, version: int) -> None:
        pins[table] = min(version, pins.get(table, version))

    norm = {os.path.abspath(t): t for t in tables}
    for s in streams:
        v = read_pin(s.path)
        if v is not None:
            # Several sources (gold reads two tables): their order in the offset
            # log is the plan's; take the oldest for each, which is always safe.
            targets = (
                list(norm.values())
                if s.reads is None
                else [norm[os.path.abspath(t)] for t in s.reads if os.path.abspath(t) in norm]
            )
            for t in targets:
                pin(t, 0 if s.reads is None else v)
    writers = [s for s in streams if _query_id(s.path) is not None]
    if writers:
        for t in tables:
            commits = app_commits(t)
            for s in writers:
                w = write_pin(s.path, commits)
                if w is not None:
                    pin(t, w)
    return pins


def keep_versions(path: str, keep_from: int, latest: int) -> list[int]:
    """Versions whose files cover every file live in any version ``keep_from..latest``.

    A file removed by commit r was live at r - 1, so the versions before each
    commit with removes (plus ``keep_from``) suffice: one snapshot per such
    version, not one per version.
    """
    keep = {keep_from}
    log_dir = storage.join(path, "_delta_log")
    for r in range(keep_from + 1, latest + 1):
        try:
            lines = storage.read_text(storage.join(log_dir, f"{r:020d}.json")).splitlines()
            removes = any('"remove"' in line and "remove" in json.loads(line) for line in lines)
        except FileNotFoundError:
            removes = True  # log cleaned up: assume the worst
        if removes:
            keep.add(r - 1)
    return sorted(keep)


def pinned_files(path: str, keep_from: int, latest: int) -> set[str]:
    """The data files (relative paths, as the log names them) live in any version from
    ``keep_from`` on: what a stream pinned there may still open."""
    files: set[str] = set()
    for v in keep_versions(path, keep_from, latest):
        files.update(urllib.parse.unquote(f.path) for f in snapshot.load(path, v).files)
    return files


# ---------------------------------------------------------------------------
# One table


def _files(dt: Snapshot) -> tuple[int, int, list[int]]:
    sizes = [f.size for f in dt.files]
    return len(sizes), sum(sizes), sizes


_SESSION_LOCK = threading.Lock()


def _session() -> SparkSession:
    """A session of its own over the process's SparkContext (``get_spark``'s, or one
    started for ``qmf maintain``): the OPTIMIZE and VACUUM settings below stay out of
    the streams' session."""
    from pipeline.spark import get_spark

    with _SESSION_LOCK:  # maintain()'s threads may ask for the first session at once
        spark = get_spark("qmf-maintain").newSession()
    # Delta's defaults are sized for large clusters and tables: VACUUM lists the folder
    # in a job of 10,000 tasks, a snapshot's state is rebuilt in 50 partitions and the
    # file lists are joined over 200. On two cores a VACUUM of a one-file table took
    # 6-7 s so, 0.8-1.7 s with one partition per core (measured 2026-12-05); OPTIMIZE
    # 4.9 -> 1.3 s. VACUUM writes no START/END commits: they would wake every stream
    # reading the table for nothing.
    cores = str(spark.sparkContext.defaultParallelism)
    for key in ("spark.sql.sources.parallelPartitionDiscovery.parallelism",
                "spark.databricks.delta.snapshotPartitions", "spark.sql.shuffle.partitions"):
        spark.conf.set(key, cores)
    spark.conf.set("spark.databricks.delta.vacuum.logging.enabled", "false")
    return spark


def _is_conflict(exc: Exception) -> bool:
    """A Delta commit conflict (``ConcurrentModificationException`` and its kin): another
    writer changed what OPTIMIZE read; the next attempt reads the new version."""
    text = str(exc)
    return "Concurrent" in text or "DELTA_CONCURRENT" in text


def _unless_conflict(
    spark: SparkSession, sql: str, what: str, path: str, attempt: int, report: TableReport
) -> Row | None:
    """The first row of a committing statement (DELETE, OPTIMIZE), or None after a Delta
    commit conflict (counted and logged): the caller backs off (``_back_off``, outside
    the table lock) and its next attempt reads the new version. Any other error is
    raised."""
    try:
        row = spark.sql(sql).first()
    except Exception as exc:
        if not _is_conflict(exc):
            raise
        report.conflicts += 1
        log.info("%s of %s conflicted (attempt %d): %s", what, path, attempt + 1, exc)
        return None
    if row is None:
        raise RuntimeError(f"{what} of {path}: {sql.split()[0]} returned no row")
    return row


def _back_off(attempt: int) -> None:
    time.sleep(0.2 * (attempt + 1))


def retain_table(path: str, settings: MaintainSettings, report: TableReport) -> None:
    """Delete the rows older than the table's keep (``settings.retention``): Delta's
    ``DELETE`` by event time (delta-spark), a commit that removes and rewrites files.

    The jobs' streaming reads skip such commits (``skipChangeCommits``): a deleted
    row is not un-read downstream, and a stream behind still reads the files the
    rows were added in (vacuum spares what its checkpoint pins). Under the
    exclusive table lock, which our writers hold shared from their first file to
    their commit: open-source Delta runs a DELETE Serializable only, so any append
    committed meanwhile would fail it (the table has no partitions to tell them
    apart). Retried on a commit conflict as a compaction is. The
    files' Delta statistics, where present, spare a DELETE that would find nothing.
    """
    rule = settings.retention.rule(path)
    if rule is None:
        return
    cutoff = rule.cutoff(settings.now or datetime.now(UTC))
    if cutoff is None:
        return
    report.cutoff = cutoff
    when = f"`{rule.column}` < TIMESTAMP '{cutoff.astimezone(UTC):%Y-%m-%d %H:%M:%S.%f}+00:00'"
    table = f"delta.`{_quoted(path)}`"
    spark: SparkSession | None = None
    for attempt in range(settings.attempts):
        with delta.table_lock(path, exclusive=True):
            dt = snapshot.load(path)
            if rule.column not in dt.schema.names:
                report.notes.append(f"no column {rule.column}: no row deleted")
                return
            if not may_hold_rows_before((f.stats for f in dt.files), rule.column, cutoff):
                return
            if spark is None:  # only for a table that may hold such rows
                spark = _session()
                spark.conf.set("spark.databricks.delta.commitInfo.userMetadata", retention.MARK)
            if settings.dry_run:
                report.rows_deleted = int(spark.sql(f"SELECT count(*) FROM {table} WHERE {when}").first()[0])  # type: ignore[index]
                return
            delta.check_protocol(dt, write=True)
            row = _unless_conflict(spark, f"DELETE FROM {table} WHERE {when}", "retention",
                                   path, attempt, report)  # fmt: skip
        if row is None:
            _back_off(attempt)
            continue
        report.rows_deleted = int(row[0])
        return
    report.notes.append(f"retention gave up after {settings.attempts} conflicts")


def compact_table(path: str, settings: MaintainSettings, report: TableReport) -> None:
    """Rewrite the table's small files into files of about ``target_size``: Delta's
    ``OPTIMIZE`` (delta-spark), its commit ``dataChange=false``.

    Holds the table lock exclusive (our writers that remove files wait); a commit
    conflict (another writer changed what was read) is retried on the new version,
    up to ``attempts`` times.
    """
    spark: SparkSession | None = None
    for attempt in range(settings.attempts):
        with delta.table_lock(path, exclusive=True):
            dt = snapshot.load(path)
            delta.check_protocol(dt, write=True)
            _n, _b, sizes = _files(dt)
            small = sum(1 for s in sizes if s < settings.target_size)
            if small < settings.min_files:
                report.notes.append(f"{small} small files: not compacted")
                return
            if settings.dry_run:
                report.compacted_removed = small
                return
            if spark is None:  # only for a table with enough small files to compact
                spark = _session()
                # Files below the target are candidates and are packed into files up to
                # it (the rule delta-rs' compact had; Delta's defaults are 1 GiB).
                for bound in ("minFileSize", "maxFileSize"):
                    spark.conf.set(f"spark.databricks.delta.optimize.{bound}", str(settings.target_size))
                spark.conf.set("spark.databricks.delta.commitInfo.userMetadata", f"qmf.operation={OPERATION}")
            row = _unless_conflict(spark, f"OPTIMIZE delta.`{_quoted(path)}`", "compaction",
                                   path, attempt, report)  # fmt: skip
        if row is None:
            _back_off(attempt)
            continue
        metrics = row["metrics"]
        report.compacted_removed += int(metrics["numFilesRemoved"])
        report.compacted_added += int(metrics["numFilesAdded"])
        return
    report.notes.append(f"compaction gave up after {settings.attempts} conflicts")


def _quoted(path: str) -> str:
    return path.replace("`", "``")


def vacuum_table(
    path: str, settings: MaintainSettings, keep_from: int | None, report: TableReport
) -> None:
    """Delete removed files older than the retention that no pinned version needs:
    Delta's ``VACUUM`` (delta-spark).

    A pin (``keep_from``): the files live in any version from it on are left out of
    the inventory VACUUM works from (``USING INVENTORY``), so it keeps them. Under the
    exclusive table lock: no other compaction (a second maintainer) or merge of ours
    removes files meanwhile, and no writer has data files in flight (written, not yet
    committed: they hold the lock shared from their first file to their commit).
    """
    with delta.table_lock(path, exclusive=True):
        _vacuum_locked(path, settings, keep_from, report)


def vacuum_inventory(spark: SparkSession, path: str, spared: set[str]) -> DataFrame:
    """The table folder's data files but ``spared`` (paths relative to the table), as the
    inventory Delta's ``VACUUM ... USING INVENTORY`` takes: VACUUM then considers only
    these. Listed by Spark's own file index through the table's Hadoop file system (any
    store Spark reaches), which skips what starts with ``_`` or ``.``: ``_delta_log``
    and our ``_scratch`` are never Delta's to delete."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hpath = jvm.org.apache.hadoop.fs.Path(storage.location(path))
    fs = hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    root = str(fs.makeQualified(hpath).toString()).rstrip("/") + "/"
    files = (
        spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(root)
        .select("path", "length", "modificationTime")
    )  # fmt: skip
    if spared:
        gone = spark.createDataFrame([(root + rel,) for rel in sorted(spared)], "path STRING")
        files = files.join(gone, on="path", how="left_anti")
    # VACUUM wants these fields exactly, nullable (the file index gives them non-null).
    schema = StructType([
        StructField("path", StringType()), StructField("length", LongType()),
        StructField("isDir", BooleanType()), StructField("modificationTime", LongType()),
    ])  # fmt: skip
    return files.select(
        "path", "length", F.when(F.col("length") >= 0, F.lit(False)).alias("isDir"),
        F.unix_millis("modificationTime").alias("modificationTime"),
    ).to(schema)


def _vacuum_locked(
    path: str, settings: MaintainSettings, keep_from: int | None, report: TableReport
) -> None:
    dt = snapshot.load(path)
    latest = dt.version
    before = storage.data_files(path)
    if before <= {urllib.parse.unquote(f.path) for f in dt.files}:
        # Every file in the folder is live: VACUUM, which never deletes a live file,
        # would list the folder and reconstruct the state in Spark jobs (two seconds
        # and more a table, twice with its dry run) to delete nothing.
        report.vacuumed = []
        return
    spark = _session()
    # Our rule is the retention plus the streams' pins, not Delta's 7-day minimum.
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    spark.conf.set("spark.databricks.delta.commitInfo.userMetadata", "qmf.operation=vacuum")
    target = f"delta.`{_quoted(path)}`"
    if keep_from is not None and keep_from < latest:
        # Files live in a pinned version stay out of VACUUM's inventory, so it cannot
        # delete them whatever their age.
        report.keep_from = keep_from
        vacuum_inventory(spark, path, pinned_files(path, keep_from, latest)).createOrReplaceTempView(
            "qmf_vacuum_inventory"
        )
        target += " USING INVENTORY (SELECT * FROM qmf_vacuum_inventory)"
    sql = f"VACUUM {target} RETAIN {settings.retention_hours} HOURS"
    if settings.dry_run:
        report.vacuumed = [str(r[0]) for r in spark.sql(f"{sql} DRY RUN").collect()]
        return
    # One pass (a dry run first would list the folder and rebuild the state again):
    # what it deleted is what the folder no longer holds (under the exclusive lock
    # nothing else deletes meanwhile).
    spark.sql(sql).collect()
    gone = before - storage.data_files(path)
    report.vacuumed = [storage.join(path, rel) for rel in sorted(gone)]


def maintain_table(
    path: str, settings: MaintainSettings, keep_from: int | None = None
) -> TableReport:
    """Delete the rows past the table's retention, compact, then vacuum one table."""
    t0 = time.perf_counter()
    report = TableReport(path, dry_run=settings.dry_run)
    dt = snapshot.load(path)
    report.version_before = dt.version
    report.files_before, report.bytes_before, _ = _files(dt)
    retain_table(path, settings, report)
    if settings.compact:
        compact_table(path, settings, report)
    if settings.vacuum:
        vacuum_table(path, settings, keep_from, report)
    dt = snapshot.load(path)
    report.version_after = dt.version
    report.files_after, report.bytes_after, _ = _files(dt)
    report.seconds = time.perf_counter() - t0
    return report


# ---------------------------------------------------------------------------
# Every table of a data folder


def data_tables(data: str | os.PathLike[str]) -> list[str]:
    """The tables of a ``qmf run --data`` folder: bronze, silver/*, gold/*."""
    root = Path(data)
    found = [root / "bronze"] if delta.table_exists(root / "bronze") else []
    for layer in ("silver", "gold"):
        folder = root / layer
        if folder.is_dir():
            found.extend(p for p in sorted(folder.iterdir()) if delta.table_exists(p))
    return [str(p) for p in found]


def data_streams(data: str | os.PathLike[str]) -> list[StreamCheckpoint]:
    """The checkpoints under ``DATA/checkpoints`` with the tables each reads
    (``qmf run``'s queries; any other checkpoint is taken as unknown)."""
    root = Path(data)
    known: Mapping[str, tuple[str, ...]] = {
        "bronze": (),  # reads the landing log
        "silver": (str(root / "bronze"),),
        "gold": (str(root / "silver" / "object_samples"), str(root / "silver" / "heartbeats")),
    }
    folder = root / "checkpoints"
    if not folder.is_dir():
        return []
    return [
        StreamCheckpoint(str(p), known.get(p.name)) for p in sorted(folder.iterdir()) if p.is_dir()
    ]


def maintain(
    tables: Iterable[str],
    streams: Sequence[StreamCheckpoint],
    settings: MaintainSettings,
) -> list[TableReport]:
    """Maintain every table, ``settings.parallel`` at a time (each table under its own
    lock, in a Spark session of its own); a failure on one table is reported, the
    others go on. Reports come in the order of ``tables``. A table on an object store
    is refused: it has no table lock to keep a compaction from the job's merges."""
    tables = list(tables)
    on_store = [t for t in tables if storage.is_object_store(t)]
    if on_store:
        raise ValueError(
            f"table {on_store[0]!r} is on an object store, where no lock keeps a maintenance"
            " pass from its job's commits: run the job with --maintain-every, which maintains"
            " its tables between its micro-batches (docs/maintenance.md)"
        )
    paths = [os.path.abspath(t) for t in tables]
    pins = stream_pins(paths, streams)

    def one(p: str) -> TableReport:
        try:
            return maintain_table(p, settings, pins.get(p))
        except Exception as exc:
            log.warning("maintenance of %s failed: %s", p, exc)
            return TableReport(p, notes=[f"failed: {exc}"])

    if settings.parallel == 1 or len(paths) < 2:
        return [one(p) for p in paths]
    # Spark starts only when a table needs it (``_session``): a dry run, or a lake with
    # nothing to do, reads the tables' logs and folders alone.
    with ThreadPoolExecutor(settings.parallel, thread_name_prefix="qmf-maintain") as pool:
        return list(pool.map(one, paths))


def maintain_data(data: str | os.PathLike[str], settings: MaintainSettings) -> list[TableReport]:
    """Maintain every table of a ``qmf run --data`` folder."""
    return maintain(data_tables(data), data_streams(data), settings)


class PeriodicMaintenance:
    """``maintain_data`` every ``every_s`` seconds in a daemon thread (``qmf run``).

    Errors are logged, never raised: maintenance must not stop the pipeline.
    """

    def __init__(self, data: str | os.PathLike[str], every_s: float,
                 settings: MaintainSettings | None = None) -> None:  # fmt: skip
        self.data = data
        self.every_s = every_s
        self.settings = settings or MaintainSettings()
        self.runs: list[list[TableReport]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="qmf-maintain", daemon=True)

    def start(self) -> PeriodicMaintenance:
        if self.every_s > 0:
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.runs.append(maintain_data(self.data, self.settings))
                for r in self.runs[-1]:
                    log.info("maintenance: %s", r.line())
            except Exception:
                log.exception("maintenance pass failed")

    def stop(self, timeout_s: float = 300.0) -> None:
        """Stop after the pass under way (if any)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)


@dataclass(frozen=True)
class JobMaintenance:
    """A job's ``--maintain-every``: a pass over its own tables every ``every_s`` seconds,
    between its micro-batches (``BetweenBatches``)."""

    every_s: float
    settings: MaintainSettings = field(default_factory=MaintainSettings)

    def __post_init__(self) -> None:
        if self.every_s < 0:
            raise ValueError("maintain-every must be >= 0 seconds")

    def around(
        self, fn: Callable[[DataFrame, int], Any], tables: Callable[[], Sequence[str]]
    ) -> BetweenBatches:
        return BetweenBatches(fn, tables, self)


class BetweenBatches:
    """A streaming job's own tables maintained by the job, between its micro-batches.

    Wraps the job's ``foreachBatch`` function: after a batch, once ``every_s`` has
    passed since the last pass (or the job's start), each table ``tables()`` lists
    gets ``maintain_table``. That is where a table on an object store can be
    maintained while its job runs: no ``flock`` reaches a bucket, but the job is the
    table's one writer and does not write while its batch function runs this (a
    ``qmf maintain`` beside it would race its merges and its DELETE would lose to
    every append). Vacuum spares every version from the one before the batch's
    first commit (a replay of the batch, should the job die before Spark records
    it, reads its tables as of then). A failure is logged, never raised: it must not
    stop the job; the next pass tries again.
    """

    def __init__(
        self, fn: Callable[[DataFrame, int], Any], tables: Callable[[], Sequence[str]],
        plan: JobMaintenance,
    ) -> None:  # fmt: skip
        self.fn = fn
        self.tables = tables
        self.every_s = plan.every_s
        self.settings = plan.settings
        self.runs: list[list[TableReport]] = []
        self._last = time.monotonic()

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        due = time.monotonic() - self._last >= self.every_s
        # Listed once a pass (a LIST request on a store): a table this batch creates
        # holds one commit, nothing to maintain; the next pass finds it.
        paths = list(self.tables()) if due else []
        before = self._versions(paths)
        self.fn(df, batch_id)
        if not due:
            return
        reports = []
        for path in paths:
            try:
                report = maintain_table(path, self.settings, before.get(path))
            except Exception as exc:
                log.warning("maintenance of %s failed: %s", path, exc)
                report = TableReport(path, notes=[f"failed: {exc}"])
            log.info("maintenance after batch %d: %s", batch_id, report.line())
            reports.append(report)
        self.runs.append(reports)
        self._last = time.monotonic()

    @staticmethod
    def _versions(paths: Sequence[str]) -> dict[str, int]:
        out = {}
        for path in paths:
            try:
                out[path] = snapshot.load(path).version
            except Exception:  # not made yet: the batch creates it
                continue
        return out


def layer_tables(root: str) -> list[str]:
    """The Delta tables directly under a layer's folder (local or on a store)."""
    from pyarrow import fs as pafs

    fs, path = storage.arrow_filesystem(storage.location(root))
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except FileNotFoundError:
        return []
    found = [storage.join(root, i.base_name) for i in infos if i.type == pafs.FileType.Directory]
    return sorted(t for t in found if delta.table_exists(t))
