"""Delta commits through delta-spark's own transaction (``DeltaLog`` / ``OptimisticTransaction``).

Why not Spark's Delta writer (``df.write.format("delta")``): the jobs' Spark
tasks write Parquet with pyarrow from Arrow batches, 10-20x faster than
Spark's row-wise writer (benchmarks/bench_delta_writer.py, docs/performance.md).
What they write is then committed here exactly as delta-spark's own writer and
streaming sink commit what their tasks wrote: a transaction on the table's
``DeltaLog`` that checks the app's last batch (``txnVersion``), adds the files
with a ``txn`` action, and commits with Delta's conflict checks, commit info,
checksums, checkpoints and log clean-up. delta-rs commits nothing in the jobs.
Rows that are a Spark DataFrame (bronze's ``spark`` writer, backfills) are
written by Delta's own writer in the same transaction (``write``).

This runs on the driver, in the JVM of the active SparkSession (or one made
with the project's settings); the actions cross py4j as Delta's log JSON.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pipeline.lake import snapshot, storage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

__all__ = [
    "TABLE_PROPERTIES", "AddFile", "Outcome", "RemoveFile", "add_columns", "commit", "concurrently", "create",
    "new_session", "session", "write",
]  # fmt: skip

T = TypeVar("T")


@dataclass(frozen=True)
class AddFile:
    """A data file a commit adds: its path as the log writes it (relative, URI-encoded)."""

    path: str
    size: int
    stats: str | None
    partition_values: Mapping[str, str | None]

    def action(self, now_ms: int) -> dict[str, Any]:
        add: dict[str, Any] = {
            "path": self.path,
            "partitionValues": dict(self.partition_values),
            "size": self.size,
            "modificationTime": now_ms,
            "dataChange": True,
        }
        if self.stats:
            add["stats"] = self.stats
        return {"add": add}


@dataclass(frozen=True)
class RemoveFile:
    """A live file a commit removes (path as the log has it)."""

    path: str
    size: int
    partition_values: Mapping[str, str | None]

    def action(self, now_ms: int) -> dict[str, Any]:
        return {
            "remove": {
                "path": self.path,
                "deletionTimestamp": now_ms,
                "dataChange": True,
                "extendedFileMetadata": True,
                "partitionValues": dict(self.partition_values),
                "size": self.size,
            }
        }


@dataclass(frozen=True)
class Outcome:
    """A commit's version, or ``skipped`` (the app's batch was already in the table);
    for ``write``, the files its writer added and their rows (from their statistics)."""

    skipped: bool
    version: int | None
    files: int = 0
    rows: int = 0


def new_session() -> SparkSession:
    """The session a commit starts when none is active: the project's settings
    (delta-spark loaded). A test suite points this at its own session."""
    from pipeline.spark import get_spark

    return get_spark(app_name="qmf-commit")


def session() -> SparkSession:
    """The active SparkSession (a job's), or ``new_session()``."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    return active if active is not None else new_session()


def concurrently(calls: Mapping[str, Callable[[], T]]) -> dict[str, T]:
    """Run independent commits (each on its own table) at once, one thread each, and
    return their results by name; the first error is raised once all have ended.

    A commit's time is mostly the JVM's (the log read, the write of the commit
    file and its checksum, py4j round trips), so commits of different tables
    overlap well. Each thread gets the caller's SparkSession as its active session
    (Spark keeps it per thread).
    """
    from concurrent.futures import ThreadPoolExecutor

    if len(calls) < 2:
        return {name: call() for name, call in calls.items()}
    spark = session()

    def run(call: Callable[[], T]) -> T:
        snapshot.jvm_static(spark, "org.apache.spark.sql.SparkSession.setActiveSession")(spark._jsparkSession)
        return call()

    with ThreadPoolExecutor(max_workers=len(calls), thread_name_prefix="qmf-commit") as pool:
        futures = {name: pool.submit(run, call) for name, call in calls.items()}
    for f in futures.values():
        error = f.exception()
        if error is not None:
            raise error
    return {name: f.result() for name, f in futures.items()}


def _app_version(txn: Any, app_id: str) -> int:
    """The app's last batch in the transaction's snapshot (-1: none)."""
    snap = txn.snapshot()
    return snapshot.jvm_app_version(snap, app_id, snapshot.jvm_checksum(snap))


def commit(
    root: str | os.PathLike[str],
    adds: Sequence[AddFile],
    removes: Sequence[RemoveFile] = (),
    *,
    app_id: str,
    batch_id: int,
    operation: str,
    overwrite: bool = False,
) -> Outcome:
    """Commit ``adds`` and ``removes`` to the table at ``root`` as ``app_id``'s
    ``batch_id``, exactly once: a batch the table already has commits nothing.

    ``operation`` is recorded in the commit info (``userMetadata``
    ``qmf.operation=...``); the history shows Delta's ``WRITE`` (append, or
    overwrite when ``overwrite``).
    """
    spark = session()
    txn = snapshot.delta_log(spark, storage.location(root)).startTransaction()
    if _app_version(txn, app_id) >= batch_id:
        return Outcome(skipped=True, version=int(txn.snapshot().version()))
    now_ms = int(time.time() * 1000)
    actions = [json.dumps(a.action(now_ms), separators=(",", ":")) for a in adds]
    version = _commit(spark, txn, [], actions, removes, app_id, batch_id, operation, overwrite)
    return Outcome(skipped=False, version=version)


def write(
    df: Any,
    root: str | os.PathLike[str],
    removes: Sequence[RemoveFile] = (),
    *,
    app_id: str,
    batch_id: int,
    operation: str,
    options: Mapping[str, str] | None = None,
) -> Outcome:
    """Write the DataFrame ``df`` with delta-spark's own writer and commit its files
    with ``removes`` as ``app_id``'s ``batch_id``, exactly once.

    ``OptimisticTransaction.writeFiles`` is what ``df.write.format("delta")`` runs:
    Spark tasks write Parquet straight into the table folder under Delta's commit
    protocol (no staging folder, no rename), checking the table's NOT NULL columns.
    Unlike that writer, the same transaction also removes the files the caller
    chose (a file-level replace: a backfill's range). A replayed batch writes nothing.
    Files of a failed write stay unreferenced, for VACUUM, as with Delta's writer.
    """
    spark = session()
    txn = snapshot.delta_log(spark, storage.location(root)).startTransaction()
    if _app_version(txn, app_id) >= batch_id:
        return Outcome(skipped=True, version=int(txn.snapshot().version()))
    before = {k: spark.conf.get(k, None) for k in options or {}}
    try:
        for k, v in (options or {}).items():
            spark.conf.set(k, v)
        written = txn.writeFiles(df._jdf)
    finally:
        for k, old in before.items():
            if old is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, old)
    files = rows = 0
    it = written.iterator()
    jactions = []
    while it.hasNext():
        action = it.next()
        jactions.append(action)
        add = json.loads(action.json()).get("add")
        if add is not None:
            files += 1
            rows += int(json.loads(add.get("stats") or "{}").get("numRecords", 0))
    version = _commit(spark, txn, jactions, [], removes, app_id, batch_id, operation, False)
    return Outcome(skipped=False, version=version, files=files, rows=rows)


def _commit(
    spark: SparkSession,
    txn: Any,
    jactions: Sequence[Any],
    actions: Sequence[str],
    removes: Sequence[RemoveFile],
    app_id: str,
    batch_id: int,
    operation: str,
    overwrite: bool,
) -> int:
    """Commit Delta actions (``jactions`` already in the JVM, ``actions`` as log JSON),
    ``removes`` and the app's ``txn`` action; the committed version."""
    def static(dotted: str) -> Any:
        return snapshot.jvm_static(spark, dotted)

    now_ms = int(time.time() * 1000)
    texts = [*actions, *(json.dumps(r.action(now_ms), separators=(",", ":")) for r in removes)]
    txn_action = {"txn": {"appId": app_id, "version": batch_id, "lastUpdated": now_ms}}
    texts.append(json.dumps(txn_action, separators=(",", ":")))
    parse = static("org.apache.spark.sql.delta.actions.Action.fromJson")
    jlist = static("java.util.ArrayList")()
    for a in jactions:
        jlist.add(a)
    for text in texts:
        jlist.add(parse(text))
    seq = static("scala.jdk.javaapi.CollectionConverters.asScala")(jlist).toSeq()
    mode = static(f"org.apache.spark.sql.SaveMode.{'Overwrite' if overwrite else 'Append'}")
    none = static("scala.Option.empty")()
    meta = static("scala.Option.apply")(f"qmf.operation={operation};qmf.app_id={app_id};qmf.batch_id={batch_id}")
    op = static("org.apache.spark.sql.delta.DeltaOperations$Write")(mode, none, none, meta, *([none] * 5))
    return int(txn.commit(seq, op))


# Every table's properties at creation (a caller's own win):
# - no deletion vectors, whatever a session's defaults say: delta-rs and polars read the
#   tables, and our own readers list files from the log (docs/delta.md);
# - a checkpoint every 100 commits (delta-rs's default), not delta-spark's 10: each is a
#   Spark job of about 1.2 s in the committing driver, and gold commits five tables per
#   batch (docs/performance.md, 2026-12-05); readers replay at most 99 small JSON commits.
TABLE_PROPERTIES: Mapping[str, str] = {
    "delta.enableDeletionVectors": "false",
    "delta.checkpointInterval": "100",
}


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def create(
    root: str | os.PathLike[str],
    schema: StructType,
    partition_by: Sequence[str] = (),
    properties: Mapping[str, str | None] | None = None,
) -> None:
    """Create a path-based table by delta-spark (``CREATE TABLE IF NOT EXISTS``) with
    ``TABLE_PROPERTIES``: a table another process created first is left as it is.
    Nested fields are declared nullable: Delta has no NOT NULL inside arrays, maps and
    structs."""
    from delta.tables import DeltaTable

    builder = DeltaTable.createIfNotExists(session()).location(storage.location(root))
    builder = builder.addColumns(_nested_nullable(schema))
    if partition_by:
        builder = builder.partitionedBy(*partition_by)
    for key, value in {**TABLE_PROPERTIES, **(properties or {})}.items():
        if value is not None:
            builder = builder.property(key, value)
    builder.execute()


def _nested_nullable(schema: StructType) -> StructType:
    """``schema`` with its top-level nullability and every nested field nullable."""
    from pyspark.sql.types import ArrayType, DataType, MapType, StructField, StructType

    def relax(t: DataType) -> DataType:
        if isinstance(t, ArrayType):
            return ArrayType(relax(t.elementType), True)
        if isinstance(t, MapType):
            return MapType(relax(t.keyType), relax(t.valueType), True)
        if isinstance(t, StructType):
            return StructType([StructField(f.name, relax(f.dataType), True) for f in t.fields])
        return t

    return StructType([StructField(f.name, relax(f.dataType), f.nullable) for f in schema.fields])


def add_columns(root: str | os.PathLike[str], columns: StructType) -> None:
    """Add nullable columns at the end of a table (``ALTER TABLE ... ADD COLUMNS``)."""
    ddl = ", ".join(
        f"{_quoted(f.name)} {f.dataType.simpleString()}" for f in _nested_nullable(columns).fields
    )
    path = storage.location(root).replace("`", "``")
    session().sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({ddl})")
