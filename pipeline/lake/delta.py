"""The jobs' Delta writes: exactly-once appends, merges and range overwrites.

Spark tasks write Parquet files from Arrow in parallel, straight into the table
folder under their batch's stage prefix (``Stage``); the driver commits them
through delta-spark's own transaction (``pipeline.lake.transaction``). Spark
DataFrames go through delta-spark's writer in the same transaction; tables are
created and evolved by delta-spark. Large batches therefore never pass through
the driver as one Arrow table. Every write carries a Delta app transaction
``(app_id, batch_id)``; a batch id at or below the recorded one is a no-op that
writes no file. The driver reads a table version from delta-spark's snapshot
(``pipeline.lake.snapshot``). See docs/delta.md.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import urllib.parse
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.lake import snapshot, storage, transaction
from pipeline.lake.snapshot import Snapshot

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

FILE_COL = "__delta_file"
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
# Strings longer than this get no min/max stats (delta-spark truncates at 32
# with a tie-breaker; we simply omit long ones, which is always safe).
MAX_STAT_STRING_BYTES = 64
# The message of the row-level check conform() puts on non-nullable columns.
NULL_MARK = "null in non-nullable column"

_PARTITION_TYPES = (
    pa.types.is_string,
    pa.types.is_integer,
    pa.types.is_date32,
    pa.types.is_boolean,
)


class DeltaLayerError(RuntimeError):
    """Base error of the Delta layer."""


class SchemaMismatchError(DeltaLayerError):
    """A data file or DataFrame does not match the table schema; nothing was committed."""


@dataclass(frozen=True)
class CommitResult:
    """What a write did: the committed version, or ``skipped`` for a replayed batch."""

    skipped: bool
    version: int | None
    files_added: int = 0
    files_removed: int = 0
    rows: int = 0
    updated: int = 0


# A commit file of the log: ``<version, 20 digits>.json``.
_COMMIT_FILE = re.compile(r"\d{20}\.json")

# ---------------------------------------------------------------------------
# Tables and schemas


def table_exists(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` holds a Delta log with a commit or a checkpoint: delta-spark
    makes ``_delta_log`` before it writes the first commit, and a table is not there
    to read until that commit is."""
    names = [os.path.basename(f) for f in storage.list_files(_log_dir(path))]
    return any(_COMMIT_FILE.fullmatch(n) or n == "_last_checkpoint" for n in names)


def _log_dir(path: str | os.PathLike[str]) -> str:
    return storage.join(storage.location(path), "_delta_log")


def create_table(
    path: str | os.PathLike[str],
    schema: pa.Schema,
    partition_by: Sequence[str] = (),
    *,
    name: str | None = None,
    configuration: Mapping[str, str | None] | None = None,
) -> Snapshot:
    """Create the table if absent (delta-spark's ``CREATE TABLE IF NOT EXISTS``); an
    existing table must have the same schema, and gains the nullable columns a release
    added (``ALTER TABLE ... ADD COLUMNS``).

    Idempotent so that every job can call it at start-up; ``name`` is not kept (a
    path-based table has none in its metadata).
    """
    path = os.fspath(path)
    for col in partition_by:
        if col not in schema.names:
            raise ValueError(f"partition column {col!r} not in schema")
        if not any(check(schema.field(col).type) for check in _PARTITION_TYPES):
            raise ValueError(
                f"partition column {col!r} has type {schema.field(col).type}; "
                "only string, integer, date and boolean partitions are supported"
            )
    if table_exists(path):
        dt = snapshot.load(path)
        existing = table_schema(dt)
        added = [f for f in schema if f.name not in existing.names]
        strict = [f.name for f in added if not f.nullable]
        if strict:
            raise SchemaMismatchError(
                f"table {path} lacks the non-nullable columns {strict}: existing rows would "
                "break them (a new column must be nullable)"
            )
        if added:
            # A release added nullable columns: the table gains them (older files read
            # them as null), so a lake written before keeps working.
            transaction.add_columns(path, _spark_schema(pa.schema(added)))
            dt = snapshot.load(path)
            existing = table_schema(dt)
            log.info("table %s gained columns %s", path, [f.name for f in added])
        problems = _schema_problems(
            existing, _in_order(schema, existing.names), check_nullability=True
        )
        if problems:
            raise SchemaMismatchError(
                f"table {path} exists with another schema: " + "; ".join(problems)
            )
        if dt.partition_columns != list(partition_by):
            raise SchemaMismatchError(
                f"table {path} is partitioned by {dt.partition_columns}, not {list(partition_by)}"
            )
        return dt
    if not storage.is_object_store(path):
        os.makedirs(path, exist_ok=True)
    transaction.create(path, _spark_schema(schema), partition_by, configuration or {})
    return create_table(path, schema, partition_by, name=name, configuration=configuration)


def _in_order(schema: pa.Schema, names: Sequence[str]) -> pa.Schema:
    """``schema`` with the columns in ``names`` first, in that order (an evolved table
    has its added columns at the end)."""
    first = [schema.field(n) for n in names if n in schema.names]
    return pa.schema(first + [f for f in schema if f.name not in names])


def table_schema(table: Snapshot | str | os.PathLike[str]) -> pa.Schema:
    """The table's Arrow schema, as recorded in its log."""
    return (table if isinstance(table, Snapshot) else snapshot.load(table)).schema


def table_root(table: Snapshot) -> str:
    """The table's folder."""
    return table.root


def partition_columns(table: Snapshot) -> list[str]:
    """The table's partition columns, in log order."""
    return list(table.partition_columns)


def _canonical(t: pa.DataType) -> tuple[Any, ...]:
    """A type's shape for comparison: ignores nullability, nested field names and
    string/binary/list offset widths, which readers treat alike."""
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return ("string",)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return ("binary",)
    if pa.types.is_map(t):
        return ("map", _canonical(t.key_type), _canonical(t.item_type))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return ("list", _canonical(t.value_type))
    if pa.types.is_struct(t):
        return ("struct", tuple((f.name, _canonical(f.type)) for f in t))
    if pa.types.is_timestamp(t):
        tz = t.tz
        if tz in ("UTC", "+00:00", "Etc/UTC"):
            tz = "UTC"
        return ("timestamp", t.unit, tz)
    return ("type", str(t))


def _schema_problems(
    expected: pa.Schema, actual: pa.Schema, *, check_nullability: bool
) -> list[str]:
    """Human-readable differences between two schemas (empty when compatible)."""
    problems: list[str] = []
    missing = [n for n in expected.names if n not in actual.names]
    extra = [n for n in actual.names if n not in expected.names]
    if missing:
        problems.append(f"missing columns {missing}")
    if extra:
        problems.append(f"unexpected columns {extra}")
    for field in expected:
        if field.name not in actual.names:
            continue
        other = actual.field(field.name)
        if _canonical(field.type) != _canonical(other.type):
            problems.append(f"column {field.name!r} is {other.type}, table has {field.type}")
        elif check_nullability and field.nullable != other.nullable:
            problems.append(
                f"column {field.name!r} nullable={other.nullable}, table has {field.nullable}"
            )
    return problems


def _spark_schema(schema: pa.Schema) -> StructType:
    from schemas.tables import spark_schema

    return spark_schema(schema)


def conform(df: DataFrame, schema: pa.Schema) -> DataFrame:
    """Select and cast ``df``'s columns to the table schema (names, order, types).

    Missing nullable columns become typed nulls; a missing non-nullable column
    or an extra column is an error (silently dropping data is worse).
    Every non-nullable column gets a row-level null check (a null fails the
    Spark job with ``NULL_MARK``; the writers report it as
    :class:`SchemaMismatchError`). Spark drops the check where its plan
    already knows the column is non-null, and then writes the column as
    REQUIRED: the footer's schema alone proves it has no null. (No default
    value is ever substituted to force that: a wrong value is worse than the
    driver-side check build_add_actions falls back to for OPTIONAL columns.)
    """
    from pyspark.sql import functions as F

    target = _spark_schema(schema)
    present = set(df.columns)
    extra = [c for c in df.columns if c not in schema.names]
    if extra:
        raise SchemaMismatchError(f"DataFrame has columns not in the table: {extra}")
    cols: list[Column] = []
    for arrow_field, field in zip(schema, target.fields, strict=True):
        if field.name not in present:
            if not arrow_field.nullable:
                raise SchemaMismatchError(f"DataFrame lacks non-nullable column {field.name!r}")
            cols.append(F.lit(None).cast(field.dataType).alias(field.name))
            continue
        col = F.col(f"`{field.name}`").cast(field.dataType)
        if not arrow_field.nullable:
            col = F.when(
                col.isNull(), F.raise_error(F.lit(f"{NULL_MARK} {field.name!r}"))
            ).otherwise(col)
        cols.append(col.alias(field.name))
    return df.select(*cols)


# Features this layer honours: reading plain Parquet files listed by the log
# is only right when no feature changes what a file means.
_SAFE_READER_FEATURES = {"timestampNtz", "v2Checkpoint", "vacuumProtocolCheck", "variantType"}
_SAFE_WRITER_FEATURES = _SAFE_READER_FEATURES | {
    "appendOnly",
    "invariants",
    "changeDataFeed",
    "domainMetadata",
}


def check_protocol(table: Snapshot | snapshot.Protocol, *, write: bool) -> None:
    """Refuse tables whose features this layer would silently get wrong
    (deletion vectors, column mapping, constraints, generated columns...)."""
    proto = table.protocol if isinstance(table, Snapshot) else table
    if proto.min_reader == 2:
        raise DeltaLayerError("tables with column mapping (reader version 2) are not supported")
    unsafe = set(proto.reader_features) - _SAFE_READER_FEATURES
    if write:
        if proto.min_writer in (3, 4, 5, 6):
            raise DeltaLayerError(
                f"writer version {proto.min_writer} (constraints, generated or "
                "identity columns) is not supported"
            )
        unsafe |= set(proto.writer_features) - _SAFE_WRITER_FEATURES
    if unsafe:
        raise DeltaLayerError(f"table features {sorted(unsafe)} are not supported by this layer")


# ---------------------------------------------------------------------------
# Coordination with compaction (pipeline/lake/maintain.py)

LOCK_FILE = "_qmf_table.lock"  # leading underscore: Delta readers and VACUUM ignore it


@contextmanager
def table_lock(path: str | os.PathLike[str], *, exclusive: bool = False) -> Iterator[None]:
    """Advisory lock of one table (fcntl on ``<table>/_qmf_table.lock``).

    Writers that remove files (merges, commits with removes) hold it shared
    from their snapshot to their commit; compaction holds it exclusive. A
    compaction landing in between would otherwise make a merge fail
    (delta-rs counts its adds as new data) or let a raw remove+add commit
    re-add rows the compaction had already rewritten (measured: doubled
    rows). Every writer holds it shared from its first data file to its
    commit (``Stage``, ``write_and_commit``, the Arrow writers): VACUUM, which
    holds it exclusive, would otherwise delete the files in flight, which no
    commit lists yet.

    A table on an object store has no such lock (no ``flock`` there): it has one
    writer, its job, and ``qmf maintain`` refuses it (``pipeline.lake.maintain``).
    """
    if storage.is_object_store(path):
        yield
        return
    fd = os.open(os.path.join(os.fspath(path), LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # closing releases the lock


# ---------------------------------------------------------------------------
# What a writer may keep between its batches


@dataclass(frozen=True)
class CommitStamp:
    """One commit of a table, as its file on disk says: a writer that remembers what it
    committed (a column's maximum, say) may use that while its stamp is the table's
    latest (``is_latest``) instead of reading the table again. A table deleted and made
    again at the same path writes new commit files, whose stamps differ: besides the
    file's inode, time and size (an inode is soon reused, a time may be coarse), a
    digest of its first ``STAMP_BYTES`` (a commit's actions carry its time and its data
    files' random names)."""

    version: int
    inode: int
    mtime_ns: int
    size: int
    head: bytes


STAMP_BYTES = 4096


def _commit_file(path: str | os.PathLike[str], version: int) -> str:
    return os.path.join(os.fspath(path), "_delta_log", f"{version:020d}.json")


def commit_stamp(path: str | os.PathLike[str], version: int) -> CommitStamp | None:
    """The stamp of commit ``version`` of the table (None: its file is not there, or the
    table is on an object store, where its writer reads the table again instead)."""
    import hashlib

    if storage.is_object_store(path):
        return None
    try:
        with open(_commit_file(path, version), "rb") as fh:
            st = os.fstat(fh.fileno())
            head = hashlib.blake2b(fh.read(STAMP_BYTES), digest_size=16).digest()
    except OSError:
        return None
    return CommitStamp(version, st.st_ino, st.st_mtime_ns, st.st_size, head)


def latest_stamp(path: str | os.PathLike[str]) -> CommitStamp | None:
    """The stamp of the table's latest commit (None: no table, or no commit file)."""
    if storage.is_object_store(path):
        return None
    try:
        names = os.listdir(os.path.join(os.fspath(path), "_delta_log"))
    except OSError:
        return None
    versions = [int(n[:20]) for n in names if len(n) == 25 and n.endswith(".json") and n[:20].isdigit()]
    return commit_stamp(path, max(versions)) if versions else None


def is_latest(path: str | os.PathLike[str], stamp: CommitStamp | None) -> bool:
    """Whether ``stamp`` still names the table's latest commit: its file unchanged and no
    later commit written (a small read and a ``stat``)."""
    if stamp is None or commit_stamp(path, stamp.version) != stamp:
        return False
    return not os.path.exists(_commit_file(path, stamp.version + 1))


# ---------------------------------------------------------------------------
# Exactly-once bookkeeping


def committed_batch(path: str | os.PathLike[str], app_id: str) -> int | None:
    """The last batch id committed by ``app_id`` (None if it never wrote)."""
    return snapshot.load(path).app_version(app_id)


def table_version(path: str | os.PathLike[str]) -> int:
    """The table's latest version."""
    return snapshot.load(path).version


def open_for_write(path: str | os.PathLike[str]) -> Snapshot:
    """The table's latest version, refused if its features are ones this layer would
    get wrong."""
    dt = snapshot.load(path)
    check_protocol(dt, write=True)
    return dt


def already_committed(dt: Snapshot, app_id: str, batch_id: int) -> bool:
    recorded = dt.app_version(app_id)
    return recorded is not None and batch_id <= recorded


# ---------------------------------------------------------------------------
# Parquet files -> add actions


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _stat_value(t: pa.DataType, raw: Any, *, is_max: bool) -> Any:
    """A footer min/max as Delta stats JSON, or None when it cannot be exact/safe
    (the column then has no min/max in the add action: readers just cannot skip)."""
    try:
        if pa.types.is_signed_integer(t):
            return int(raw)
        if pa.types.is_date32(t):
            return (date(1970, 1, 1) + timedelta(days=int(raw))).isoformat()
        if pa.types.is_timestamp(t) and t.unit == "us" and t.tz is not None:
            # Delta stats carry milliseconds: widen the range so skipping stays
            # safe. Integer division: float division misrounds far from 1970.
            micros = int(raw)
            millis = -(-micros // 1000) if is_max else micros // 1000
            moment = _EPOCH + timedelta(milliseconds=millis)
            # Zero-padded year: strftime's %Y gives "999" for year 999.
            return f"{moment.year:04d}-{moment:%m-%dT%H:%M:%S}.{moment.microsecond // 1000:03d}Z"
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            data = raw if isinstance(raw, bytes) else str(raw).encode()
            if len(data) > MAX_STAT_STRING_BYTES:
                return None
            return data.decode("utf-8")
    except (OverflowError, ValueError):  # outside datetime's years 1-9999, or not UTF-8
        return None
    return None


def _top_level_leaves(metadata: pq.FileMetaData) -> dict[str, int]:
    """Column (leaf) index of each top-level primitive column of a footer.

    A leaf of a nested column has a path longer than its name; a top-level
    column whose name contains a dot has path == name.
    """
    out: dict[str, int] = {}
    for i in range(metadata.num_columns):
        col = metadata.schema.column(i)
        if col.path == col.name and col.max_repetition_level == 0:
            out[col.name] = i
    return out


def file_stats(metadata: pq.FileMetaData, schema: pa.Schema) -> dict[str, Any]:
    """Delta ``stats`` from a footer: ``numRecords``, and per top-level primitive
    column a ``nullCount`` when every row group records one and ``minValues``/
    ``maxValues`` when every row group's are present and exact.

    Footer statistics are optional: parquet-mr (Spark 4.3) keeps none, not even
    a null count, for a column chunk whose min and max exceed 4 KB together.
    A column missing here only means readers cannot skip files on it; nothing
    in this layer needs it (see build_add_actions for the null check).
    """
    stats: dict[str, Any] = {"numRecords": metadata.num_rows}
    nulls: dict[str, int] = {}
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    for name, i in _top_level_leaves(metadata).items():
        if name not in schema.names:
            continue
        t = schema.field(name).type
        null_total: int | None = 0
        lo: tuple[Any, Any] | None = None
        hi: tuple[Any, Any] | None = None
        minmax_ok = True
        for rg in range(metadata.num_row_groups):
            group = metadata.row_group(rg)
            if group.num_rows == 0:
                continue
            st = group.column(i).statistics
            count = st.null_count if st is not None and st.has_null_count else None
            null_total = None if null_total is None or count is None else null_total + count
            if count == group.num_rows:
                continue  # all null: no min/max in this row group
            if st is None or not st.has_min_max:
                minmax_ok = False
                continue
            a = _stat_value(t, st.min_raw, is_max=False)
            b = _stat_value(t, st.max_raw, is_max=True)
            if a is None or b is None:
                minmax_ok = False
                continue
            if lo is None or st.min_raw < lo[0]:
                lo = (st.min_raw, a)
            if hi is None or st.max_raw > hi[0]:
                hi = (st.max_raw, b)
        if null_total is not None:
            nulls[name] = null_total
        if minmax_ok and lo is not None and hi is not None:
            mins[name] = lo[1]
            maxs[name] = hi[1]
    stats["minValues"] = mins
    stats["maxValues"] = maxs
    stats["nullCount"] = nulls
    return stats


def _null_problems(pf: pq.ParquetFile, schema: pa.Schema, stats: Mapping[str, Any]) -> list[str]:
    """Non-nullable columns of a data file that hold nulls, proven from what
    every file has rather than from optional statistics.

    A REQUIRED column (what Spark writes for a field its plan knows to be
    non-null) cannot hold a null: the footer's schema settles it. An OPTIONAL one is settled by the footer's null counts when
    every row group has one; otherwise the column itself is read (only the
    row groups without a count) and its nulls counted.
    """
    meta = pf.metadata
    leaves = _top_level_leaves(meta)
    arrow = pf.schema_arrow
    problems: list[str] = []
    for f in schema:
        if f.nullable:
            continue
        if f.name in leaves:
            i = leaves[f.name]
            if meta.schema.column(i).max_definition_level == 0:
                continue  # REQUIRED
            count = stats["nullCount"].get(f.name)
            if count is None:
                count = 0
                for rg in range(meta.num_row_groups):
                    st = meta.row_group(rg).column(i).statistics
                    if st is not None and st.has_null_count:
                        count += st.null_count
                    else:
                        count += pf.read_row_group(rg, columns=[f.name]).column(0).null_count
        elif not arrow.field(f.name).nullable:
            continue  # a REQUIRED group (map, list, struct)
        else:
            count = pf.read(columns=[f.name]).column(0).null_count
        if count:
            problems.append(f"non-nullable column {f.name!r} has {count} nulls")
    return problems


def build_add_actions(
    table: Snapshot,
    files: Iterable[tuple[str, Mapping[str, str | None]]],
) -> tuple[list[transaction.AddFile], int]:
    """Validate data files (relative to the table root) and describe them as added files.

    Pitfall: a raw commit does not check files against the
    table schema, and a bad file makes every later read fail, so each footer
    is checked here: columns and types must match the table's (partition
    columns excluded), and non-nullable columns must hold no null (proven by
    the footer's schema, its null counts, or the data: see _null_problems;
    never refused for lack of statistics). Each action carries the stats the
    footer has (file_stats), which may be partial. Returns the actions and
    the total row count.
    """
    root = table_root(table)
    schema = table_schema(table)
    parts = partition_columns(table)
    file_schema = pa.schema([f for f in schema if f.name not in parts])
    actions: list[transaction.AddFile] = []
    rows = 0
    for rel_path, pvalues in files:
        f = describe_file(
            os.path.join(root, rel_path), file_schema, dict(pvalues), name=rel_path, table=root
        )
        for col in parts:
            if pvalues.get(col) is None and not schema.field(col).nullable:
                raise SchemaMismatchError(
                    f"file {rel_path} does not match table {root}: "
                    f"non-nullable partition column {col!r} is null"
                )
        rows += f.rows
        actions.append(f.add_file())
    return actions, rows


@dataclass(frozen=True)
class DataFileInfo:
    """What a commit needs to know of a data file, found where the file was written.

    A Spark task that writes a file describes it (``describe_file``) and returns
    this; the driver commits it without opening the file again, so the driver's
    work per batch grows with the number of files, not of rows.
    """

    name: str  # path relative to the table root, once committed
    location: str  # where it is now (a staging folder of the table, or the root)
    size: int
    rows: int
    stats: str  # Delta ``stats`` JSON: what the footer holds (possibly partial)
    partition_values: tuple[tuple[str, str | None], ...] = ()

    def add_file(self) -> transaction.AddFile:
        """The file as a commit adds it (its path in the log's URI-encoded form)."""
        return transaction.AddFile(
            path=urllib.parse.quote(self.name, safe="/="),
            size=self.size,
            stats=self.stats,
            partition_values=dict(self.partition_values),
        )


def describe_file(
    full_path: str,
    schema: pa.Schema,
    partition_values: Mapping[str, str | None] | None = None,
    *,
    name: str | None = None,
    table: str = "",
) -> DataFileInfo:
    """Check a Parquet file against ``schema`` (the table's, partition columns
    excluded) and describe it for a commit.

    Pitfall: a raw commit does not check files against the
    table schema, and a bad file makes every later read fail, so the footer
    is checked: columns and types must match, and non-nullable columns must
    hold no null (proven by the footer's schema, its null counts, or the data:
    see _null_problems; never refused for lack of statistics). The stats are
    what the footer has (file_stats), which may be partial.
    """
    pf = storage.parquet_file(full_path)
    meta = pf.metadata
    label = name or os.path.basename(full_path)
    problems = _schema_problems(schema, meta.schema.to_arrow_schema(), check_nullability=False)
    if problems:  # before reading stats, whose raw values assume the right types
        raise SchemaMismatchError(f"file {label} does not match table {table}: " + "; ".join(problems))
    stats = file_stats(meta, schema)
    problems.extend(_null_problems(pf, schema, stats))
    if problems:
        raise SchemaMismatchError(f"file {label} does not match table {table}: " + "; ".join(problems))
    return DataFileInfo(
        name=label,
        location=full_path,
        size=storage.file_size(full_path),
        rows=int(meta.num_rows),
        stats=json.dumps(stats, separators=(",", ":")),
        partition_values=tuple(sorted((partition_values or {}).items())),
    )


# ---------------------------------------------------------------------------
# Where one attempt of a batch writes a table's new data files


def batch_prefix(path: str | os.PathLike[str], app_id: str, batch_id: int) -> str:
    """``<root>/part-<batch, 8 digits or more>-<app digest, 16 hex>``: the data files every
    attempt of one app's batch writes into the table folder start so. A dash ends each
    field and the digest has a fixed width, so no other batch's or app's prefix extends
    this one."""
    import hashlib

    digest = hashlib.sha1(app_id.encode(), usedforsecurity=False).hexdigest()[:16]
    return storage.join(storage.location(path), f"part-{batch_id:08d}-{digest}")


def staged_file(prefix: str, name: str) -> str:
    """The full path of a data file ``name`` written under a ``Stage``'s ``prefix``."""
    return f"{prefix}-{name}"


_STAGED_NAME = re.compile(r"part-\d{8,}-[0-9a-f]{16}-[0-9a-f]{12}-(.+)")


def staged_name(name: str) -> str:
    """The writer's own part of a data file name written under a ``Stage`` (what its
    writer passed to ``staged_file``); any other name as it is (files of older
    releases, of delta-spark's writer)."""
    found = _STAGED_NAME.fullmatch(os.path.basename(name))
    return found.group(1) if found else os.path.basename(name)


def staged_table_root(prefix: str) -> str:
    """The table folder a ``Stage``'s ``prefix`` writes into."""
    return os.path.dirname(prefix)


class Stage:
    """Where one attempt of a batch writes one table's new files: straight into the table
    folder, where they are committed, under names that start with ``prefix`` (the
    batch's ``batch_prefix`` and a token of this attempt). No staging folder, no rename
    (on an object store, a copy).

    Held as a context: the table lock is held shared from the first file to the end
    (``table_lock``): a VACUUM cannot take the files in flight for garbage. The writer
    sets ``done`` once ``commit_staged`` returned; without it, leaving removes what the
    attempt wrote, unless the table has the batch (a commit that raised after it
    landed: its files are then left to VACUUM). A killed attempt's files are removed
    by the commit of a later attempt of the batch (``commit_staged``), or by VACUUM.
    """

    def __init__(self, path: str | os.PathLike[str], app_id: str, batch_id: int) -> None:
        self.root = storage.location(path)
        self.app_id = app_id
        self.batch_id = batch_id
        self.prefix = f"{batch_prefix(self.root, app_id, batch_id)}-{uuid.uuid4().hex[:12]}"
        self.done = False
        self._held = ExitStack()

    def file(self, name: str) -> str:
        return staged_file(self.prefix, name)

    def __enter__(self) -> Stage:
        self._held.enter_context(table_lock(self.root))
        return self

    def __exit__(self, *exc: object) -> None:
        with self._held:  # the lock goes last, whatever discard does
            if not self.done:
                self.discard()

    def discard(self) -> None:
        """Remove this attempt's files, unless the table has the batch."""
        mine = storage.list_files(self.root, os.path.basename(self.prefix) + "-")
        if not mine:
            return
        done = committed_batch(self.root, self.app_id)
        if done is None or done < self.batch_id:
            storage.remove_files(mine)


class Stages:
    """The ``Stage`` of each table one attempt of a batch writes into (one per table
    folder, made at its first use), closed together after the batch's commits."""

    def __init__(self, app_id: str, batch_id: int) -> None:
        self.app_id = app_id
        self.batch_id = batch_id
        self._by_root: dict[str, Stage] = {}
        self._open = ExitStack()

    def prefix(self, path: str | os.PathLike[str]) -> str:
        """The file-name prefix of the table's stage (entered now if new)."""
        root = storage.location(path)
        stage = self._by_root.get(root)
        if stage is None:
            stage = self._by_root[root] = self._open.enter_context(
                Stage(root, self.app_id, self.batch_id)
            )
        return stage.prefix

    def done(self, path: str | os.PathLike[str]) -> None:
        """``commit_staged`` returned for the table: its files are settled."""
        stage = self._by_root.get(storage.location(path))
        if stage is not None:
            stage.done = True

    def close(self) -> None:
        """Leave every stage (``Stage.__exit__``; each is left even if another fails)."""
        self._by_root = {}
        self._open.close()

    def __enter__(self) -> Stages:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sweep_batch(
    path: str | os.PathLike[str], app_id: str, batch_id: int, keep: Iterable[str]
) -> list[str]:
    """After the batch's commit: remove the files of its other attempts (killed before
    their commits; one writer per app, so none is still writing) and what this one wrote
    but did not commit. ``keep``: the committed file names. The removed paths."""
    prefix = batch_prefix(path, app_id, batch_id)
    kept = set(keep)
    gone = [
        p for p in storage.list_files(os.path.dirname(prefix), os.path.basename(prefix) + "-")
        if os.path.basename(p) not in kept
    ]  # fmt: skip
    storage.remove_files(gone)
    return gone


def sweep_committed_batch(path: str | os.PathLike[str], app_id: str, batch_id: int) -> list[str]:
    """``sweep_batch`` for a replay that finds its batch committed: the attempt that
    committed it may have died (or lost its store) before its own sweep, leaving other
    attempts' files. Keeps the files the batch's commit added, found by reading the log's
    commit files from the newest back to that commit (a replay is of the last batches).
    Nothing is removed when the commit is no longer in the log (cleaned up)."""
    commits = sorted(
        (loc for loc in storage.list_files(_log_dir(path))
         if _COMMIT_FILE.fullmatch(os.path.basename(loc))),
        reverse=True,
    )  # fmt: skip
    for loc in commits:
        try:
            actions = [json.loads(line) for line in storage.read_text(loc).splitlines() if line]
        except FileNotFoundError:
            continue  # cleaned up meanwhile
        txns = [a["txn"] for a in actions if "txn" in a and a["txn"]["appId"] == app_id]
        if any(int(t["version"]) == batch_id for t in txns):
            keep = [
                os.path.basename(urllib.parse.unquote(a["add"]["path"])) for a in actions if "add" in a
            ]
            return sweep_batch(path, app_id, batch_id, keep)
        if any(int(t["version"]) < batch_id for t in txns):
            break  # the app's commits come in batch order: the batch's is not in the log
    return []


# Scratch folders: a batch's intermediate files that are never committed (gold's shuffle).
SCRATCH_DIR = "_scratch"


def scratch_dir(path: str | os.PathLike[str], label: str, batch_id: int) -> str:
    """A fresh scratch folder of the table (``_scratch/<label>-<batch>-<token>``, hidden
    from readers and VACUUM), after removing those an earlier attempt of the batch left
    (one writer per label, so none is in use)."""
    import glob

    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
    start = os.path.join(os.path.abspath(os.fspath(path)), SCRATCH_DIR, f"{safe}-{batch_id}")
    for old in glob.glob(glob.escape(start) + "-*"):
        shutil.rmtree(old, ignore_errors=True)
    folder = f"{start}-{uuid.uuid4().hex[:12]}"
    os.makedirs(folder, exist_ok=True)
    return folder


def remove_scratch_dir(folder: str) -> None:
    """Remove a scratch folder, and the table's ``_scratch`` once empty."""
    shutil.rmtree(folder, ignore_errors=True)
    parent = os.path.dirname(folder.rstrip(os.sep))
    if os.path.basename(parent) == SCRATCH_DIR:
        try:
            os.rmdir(parent)
        except OSError:
            pass


class DataFileWriter:
    """One Parquet data file written part by part, then described for a commit.

    Statistics and dictionaries for the flat columns only: the value lists get
    neither (Delta keeps no stats for nested columns; ~35% of the write time);
    ``unique`` columns (all values distinct) get no dictionary either. The file
    is opened at the first non-empty part; ``close`` returns None when there
    was none (no file).
    """

    def __init__(
        self, full_path: str, schema: pa.Schema, *, unique: Sequence[str] = ("msg_key", "body")
    ) -> None:
        self.full_path = full_path
        self.schema = schema
        self.unique = tuple(unique)
        self.rows = 0
        self._writer: pq.ParquetWriter | None = None

    def write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        if self._writer is None:
            flat = [f.name for f in self.schema if not pa.types.is_nested(f.type)]
            self._writer = storage.parquet_writer(
                self.full_path,
                self.schema,
                compression="snappy",
                write_statistics=flat,
                use_dictionary=[c for c in flat if c not in self.unique],
            )
        self._writer.write_table(table.select(self.schema.names).cast(self.schema))
        self.rows += table.num_rows

    def close(self) -> DataFileInfo | None:
        if self._writer is None:
            return None
        self._writer.close()
        self._writer = None
        return describe_file(self.full_path, self.schema)

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        storage.remove_files([self.full_path])


def data_file_name() -> str:
    """A fresh data file name for a ``Stage`` (a random token: never reused)."""
    return f"{uuid.uuid4().hex}.parquet"


def commit_staged(
    path: str | os.PathLike[str],
    files: Sequence[DataFileInfo],
    *,
    app_id: str,
    batch_id: int,
    operation: str = "append",
    replace: bool = False,
    remove: Sequence[str] = (),
) -> CommitResult:
    """Commit files written in the table folder (a ``Stage``'s), exactly once.

    The footers are not read again: ``describe_file`` checked them where they were
    written. After the commit, the batch's files of other attempts go
    (``sweep_batch``); a replayed batch (already committed) removes ``files``
    instead. ``replace``: the files are the table's whole new content; every live
    file is removed in the same commit (listed under the table lock, so a compaction
    cannot slip in). ``remove``: Delta paths of live files these files replace (a
    file-level upsert; checked live under the table lock).
    """
    if replace:
        with table_lock(path):
            return _commit_staged(path, files, app_id, batch_id, "overwrite", True)
    if remove:
        with table_lock(path):
            return _commit_staged(path, files, app_id, batch_id, operation, False, remove)
    return _commit_staged(path, files, app_id, batch_id, operation, False)


def _commit_staged(
    path: str | os.PathLike[str],
    files: Sequence[DataFileInfo],
    app_id: str,
    batch_id: int,
    operation: str,
    replace: bool,
    remove: Sequence[str] = (),
    opened: Snapshot | None = None,
) -> CommitResult:
    """Commit the files in place. Only a commit that removes files reads the table
    version (``opened``: the caller's, taken under the table lock it holds): an append
    lets delta-spark's transaction check the app's last batch (a replay commits nothing
    and its files go again)."""
    root = storage.location(path)
    outside = [f.location for f in files if f.location != storage.join(root, f.name)]
    if outside:
        raise DeltaLayerError(f"not data files of {root}: {outside[:3]}")
    dt = opened
    if dt is None and (replace or remove):
        dt = open_for_write(path)
    if dt is not None and already_committed(dt, app_id, batch_id):
        storage.remove_files(f.location for f in files)
        sweep_committed_batch(root, app_id, batch_id)
        return CommitResult(skipped=True, version=dt.version)
    removals: list[transaction.RemoveFile] = []
    if replace or remove:
        assert dt is not None
        removals = _removals(dt, None if replace else remove)
    outcome = transaction.commit(
        root, [f.add_file() for f in files], removals, app_id=app_id, batch_id=batch_id,
        operation=operation, overwrite=replace,
    )  # fmt: skip
    if outcome.skipped:  # a replay of a committed batch (or a concurrent one): ours are extra
        storage.remove_files(f.location for f in files)
        sweep_committed_batch(root, app_id, batch_id)
        return CommitResult(skipped=True, version=outcome.version)
    sweep_batch(root, app_id, batch_id, (f.name for f in files))
    return CommitResult(
        skipped=False, version=outcome.version, files_added=len(files),
        files_removed=len(removals), rows=sum(f.rows for f in files),
    )  # fmt: skip


def append_parquet(
    path: str | os.PathLike[str],
    table: pa.Table,
    *,
    app_id: str,
    batch_id: int,
    parallel_rows: int = 100_000,
    threads: int = 4,
) -> CommitResult:
    """Append Arrow rows exactly once as Parquet files written here: one file, or one
    per thread for more than ``parallel_rows`` rows (pyarrow's writer releases the
    GIL, and list columns make it the costliest step); ``commit_staged`` commits them."""
    from concurrent.futures import ThreadPoolExecutor

    dt = open_for_write(path)
    if already_committed(dt, app_id, batch_id):
        return CommitResult(skipped=True, version=dt.version)
    schema = table_schema(dt)
    data = conform_arrow(table, schema)
    parts = 1
    if data.num_rows > parallel_rows:
        parts = min(max(1, threads), -(-data.num_rows // parallel_rows))
    step = -(-data.num_rows // parts)
    with Stage(path, app_id, batch_id) as stage:

        def write(i: int) -> DataFileInfo:
            w = DataFileWriter(stage.file(f"{i}.parquet"), schema)
            w.write(data.slice(i * step, step))
            info = w.close()
            assert info is not None
            return info

        if parts == 1:
            infos = [write(0)]
        else:
            with ThreadPoolExecutor(parts, thread_name_prefix="qmf-parquet") as pool:
                infos = list(pool.map(write, range(parts)))
        done = commit_staged(path, infos, app_id=app_id, batch_id=batch_id)
        stage.done = True
        return done


def commit_files(
    path: str | os.PathLike[str],
    files: Sequence[tuple[str, Mapping[str, str | None]]],
    *,
    app_id: str,
    batch_id: int,
    remove: Sequence[str] = (),
    operation: str = "append",
) -> CommitResult:
    """Commit data files already inside the table folder, exactly once.

    ``files`` are (path relative to the table root, partition values);
    ``remove`` are Delta paths of live files this commit replaces (checked
    live under the table lock, so a concurrent compaction cannot slip in).
    Raises :class:`SchemaMismatchError` before committing if a file does not match.
    """
    if remove:
        with table_lock(path):
            return _commit_files(path, files, app_id, batch_id, remove, operation)
    return _commit_files(path, files, app_id, batch_id, remove, operation)


def _commit_files(
    path: str | os.PathLike[str],
    files: Sequence[tuple[str, Mapping[str, str | None]]],
    app_id: str,
    batch_id: int,
    remove: Sequence[str],
    operation: str,
) -> CommitResult:
    dt = open_for_write(path)
    if already_committed(dt, app_id, batch_id):
        return CommitResult(skipped=True, version=dt.version)
    actions, rows = build_add_actions(dt, files)
    removals = _removals(dt, remove) if remove else []
    outcome = transaction.commit(
        table_root(dt), actions, removals, app_id=app_id, batch_id=batch_id,
        operation=operation, overwrite=operation == "overwrite",
    )  # fmt: skip
    return CommitResult(
        skipped=outcome.skipped,
        version=outcome.version,
        files_added=0 if outcome.skipped else len(actions),
        files_removed=0 if outcome.skipped else len(removals),
        rows=0 if outcome.skipped else rows,
    )


def _removals(dt: Snapshot, paths: Sequence[str] | None) -> list[transaction.RemoveFile]:
    """Live files of the table version to remove (Delta paths as the log writes them;
    None: every live file)."""
    live = _live_actions(dt)
    out: list[transaction.RemoveFile] = []
    for p in live if paths is None else paths:
        if p not in live:
            raise DeltaLayerError(f"cannot remove {p}: not a live file of {table_root(dt)}")
        size, pvalues = live[p]
        out.append(transaction.RemoveFile(p, size, pvalues))
    return out


def _live_actions(dt: Snapshot) -> dict[str, tuple[int, dict[str, str | None]]]:
    """Live files of the table version: Delta path -> (size, partition values)."""
    return {f.path: (f.size, dict(f.partition_values)) for f in dt.files}


# ---------------------------------------------------------------------------
# Spark-side writes


def no_dictionary(*columns: str) -> dict[str, str]:
    """Parquet writer options that skip dictionary encoding for these columns.

    For columns whose values are (nearly) all distinct (message bodies, keys,
    ids) parquet-mr builds a dictionary, finds it too big and falls back:
    wasted work on every page.
    """
    return {f"parquet.enable.dictionary#{c}": "false" for c in columns}


# For bronze/landing-shaped tables.
UNIQUE_COLUMNS_OPTIONS = no_dictionary("msg_key", "message_id", "correlation_id", "body")


@contextmanager
def _nulls_refused() -> Iterator[None]:
    """Report conform()'s row-level null check (a failed Spark job) as
    :class:`SchemaMismatchError`, like every other schema violation."""
    try:
        yield
    except SchemaMismatchError:
        raise
    except Exception as exc:
        if NULL_MARK not in str(exc):
            raise
        found = re.search(re.escape(NULL_MARK) + r" ('[^']*'|\"[^\"]*\")", str(exc))
        what = found.group(0) if found else NULL_MARK
        raise SchemaMismatchError(f"{what}: nothing was committed") from exc


def write_and_commit(
    df: DataFrame,
    dt: Snapshot,
    *,
    app_id: str,
    batch_id: int,
    operation: str,
    remove: Sequence[str] = (),
    writer_options: Mapping[str, str] | None = None,
) -> CommitResult:
    """Write ``df`` (already conformed) with delta-spark's writer straight into the table
    and commit it, replacing the live files ``remove``, exactly once
    (``transaction.write``). The table lock is held shared from the removes' check to
    the commit: no compaction replaces them, no VACUUM deletes the files in flight."""
    root = table_root(dt)
    with table_lock(root):
        removals: list[transaction.RemoveFile] = []
        if remove:
            dt = snapshot.load(table_root(dt))
            removals = _removals(dt, remove)
        with _nulls_refused():
            done = transaction.write(
                df, root, removals, app_id=app_id, batch_id=batch_id, operation=operation,
                options=writer_options,
            )  # fmt: skip
    if done.skipped:
        return CommitResult(skipped=True, version=done.version)
    return CommitResult(
        skipped=False, version=done.version, files_added=done.files,
        files_removed=len(removals), rows=done.rows,
    )  # fmt: skip


def append_batch(
    df: DataFrame,
    path: str | os.PathLike[str],
    *,
    app_id: str,
    batch_id: int,
    writer_options: Mapping[str, str] | None = None,
) -> CommitResult:
    """Append a micro-batch exactly once (a replayed ``batch_id`` writes nothing).

    Meant for ``foreachBatch``: ``append_batch(df, path, app_id=query_name, batch_id=batch_id)``.
    ``writer_options`` go to Spark's Parquet writer, e.g. ``UNIQUE_COLUMNS_OPTIONS``.
    """
    dt = open_for_write(path)
    if already_committed(dt, app_id, batch_id):
        return CommitResult(skipped=True, version=dt.version)
    schema = table_schema(dt)
    return write_and_commit(
        conform(df, schema),
        dt,
        app_id=app_id,
        batch_id=batch_id,
        operation="append",
        writer_options=writer_options,
    )


# ---------------------------------------------------------------------------
# Readers


@dataclass(frozen=True)
class LiveFile:
    delta_path: str
    local_path: str
    partition_values: dict[str, str | None]


def live_files(dt: Snapshot) -> list[LiveFile]:
    """The version's files with their partition values, taken from the log."""
    root = table_root(dt)
    out: list[LiveFile] = []
    for f in sorted(dt.files, key=lambda f: f.path):
        try:
            local = snapshot.local_path(root, f.path)
        except ValueError as exc:
            raise DeltaLayerError(str(exc)) from exc
        out.append(LiveFile(f.path, local, dict(f.partition_values)))
    return out


def prune_files(
    dt: Snapshot, files: Sequence[LiveFile], column: str, low: Any, high: Any
) -> list[LiveFile]:
    """The files that may hold rows with ``low <= column <= high``, by the log's
    min/max stats. Stats are optional (Spark writes none for large values):
    a file without a min or max for the column is always kept, so missing
    stats cost a scan, never a row. Timestamp stats are millisecond-truncated
    by some writers, so maxima get 1 ms slack.
    """
    schema = table_schema(dt)
    if column not in schema.names:
        raise SchemaMismatchError(f"column {column!r} not in table")
    if column in partition_columns(dt):
        raise ValueError(f"{column!r} is a partition column: filter partitions instead")
    adds = dt.stats()
    if f"min.{column}" not in adds.column_names or f"max.{column}" not in adds.column_names:
        return list(files)
    t = schema.field(column).type
    lo = pa.scalar(low, t)
    hi = pa.scalar(high, t)
    maxima = adds.column(f"max.{column}")
    if pa.types.is_timestamp(t):
        maxima = pc.add(maxima, pa.scalar(timedelta(milliseconds=1), pa.duration(t.unit)))
    minima = adds.column(f"min.{column}")
    # Kleene "or": one bound outside the range is proof enough; a missing one
    # (null) proves nothing, so a file without either is kept.
    outside = pc.or_kleene(pc.less(maxima, lo), pc.greater(minima, hi))
    skip = {
        p
        for p, out in zip(adds.column("path").to_pylist(), outside.to_pylist(), strict=True)
        if out is True
    }
    return [f for f in files if f.delta_path not in skip]


def _open(path: str | os.PathLike[str], version: int | None) -> Snapshot:
    dt = snapshot.load(path, version)
    check_protocol(dt, write=False)
    return dt


def read_arrow(path: str | os.PathLike[str], version: int | None = None) -> pa.Table:
    """The table (latest or ``version``) as one Arrow table, for tests and notebooks.

    Reads the files the log lists with pyarrow.parquet, never through
    ``to_pyarrow_table``/``to_pyarrow_dataset`` (they can abort the process at
    exit, delta-rs issue 2184). Partition values come from the log.
    """
    dt = _open(path, version)
    schema = table_schema(dt)
    pieces = [read_data_file(live, schema) for live in live_files(dt)]
    if not pieces:
        return schema.empty_table()
    return pa.concat_tables(pieces).cast(schema)


def read_data_file(
    live: LiveFile, schema: pa.Schema, columns: Sequence[str] | None = None
) -> pa.Table:
    """One data file of a table in the table's ``schema`` (or its ``columns``), nullable:
    columns added to the table after the file was written read null, partition columns
    come from the log. Runs anywhere the file is visible (a Spark task reads its share of
    a table's files from a snapshot the driver listed: ``snapshot_files``)."""
    names = list(schema.names if columns is None else columns)
    parts = [c for c in names if c in live.partition_values]
    pf = storage.parquet_file(live.local_path)
    have = set(pf.schema_arrow.names)
    t = pf.read(columns=[n for n in names if n in have and n not in parts])
    for name in names:
        if name not in have and name not in parts:
            t = t.append_column(name, pa.nulls(t.num_rows, schema.field(name).type))
    for col in parts:
        raw = pa.array([live.partition_values.get(col)] * t.num_rows, pa.string())
        t = t.append_column(col, raw.cast(schema.field(col).type))
    want = pa.schema([schema.field(n).with_nullable(True) for n in names])
    return t.select(names).cast(want)


def snapshot_files(path: str | os.PathLike[str]) -> tuple[int, pa.Schema, list[LiveFile]]:
    """(version, schema, live files) of the table's latest version: what a driver hands
    to tasks that read the table themselves (``read_data_file``)."""
    dt = _open(path, None)
    return dt.version, table_schema(dt), live_files(dt)


def iter_batches(
    path: str | os.PathLike[str], columns: Sequence[str], batch_size: int = 10_000
) -> Iterator[pa.RecordBatch]:
    """The table's rows as Arrow batches, file by file, only ``columns`` (not partition
    columns): bounded memory for tables of any size, and no concatenation (a binary
    column over 2 GiB in all overflows ``read_arrow``'s 32-bit offsets)."""
    dt = _open(path, None)
    schema = table_schema(dt)
    wanted = pa.schema([schema.field(c).with_nullable(True) for c in columns])
    for live in live_files(dt):
        pf = storage.parquet_file(live.local_path)
        have = set(pf.schema_arrow.names)
        present = [c for c in columns if c in have]
        for batch in pf.iter_batches(batch_size=batch_size, columns=present):
            arrays = [
                batch.column(c) if c in have else pa.nulls(batch.num_rows, wanted.field(c).type)
                for c in columns
            ]  # columns added to the table after this file was written read null
            yield pa.RecordBatch.from_arrays(arrays, schema=wanted)


def newest_files(path: str | os.PathLike[str], max_rows: int) -> tuple[list[str], int, int]:
    """The newest live files (by the log's modification time) holding at most ``max_rows``
    rows (at least one file): (local paths, their rows, the table's rows).

    For summaries that must stay bounded however long the table has grown.
    """
    dt = _open(path, None)
    local = {f.delta_path: f.local_path for f in live_files(dt)}
    adds = dt.stats()
    if adds.num_rows == 0:
        return [], 0, 0
    rows = adds.column("num_records").to_pylist()
    total = sum(int(r or 0) for r in rows)
    order = sorted(
        zip(adds.column("modification_time").to_pylist(), adds.column("path").to_pylist(), rows,
            strict=True),
        key=lambda a: (a[0], a[1]),
        reverse=True,
    )  # fmt: skip
    out: list[str] = []
    taken = 0
    for _mtime, p, n in order:
        n = int(n or 0)
        if out and taken + n > max_rows:
            break
        out.append(local[p])  # both keyed by the add action's path
        taken += n
    return out, taken, total


def _spark_uri_key(uri: str) -> str:
    """Normalise a Hadoop file URI (``file:/x`` vs ``file:///x``) for matching."""
    if uri.startswith("file:"):
        rest = uri[len("file:") :]
        return "/" + rest.lstrip("/")
    return uri


def _spark_uris(spark: SparkSession, local_paths: Sequence[str]) -> list[str]:
    """How Spark's ``_metadata.file_path`` will spell each file (Hadoop's URI
    encoding), so rows can be traced back to Delta files exactly."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    out: list[str] = []
    fs = None
    for p in local_paths:
        jpath = jvm.org.apache.hadoop.fs.Path(p)
        if fs is None:
            fs = jpath.getFileSystem(conf)
        out.append(_spark_uri_key(str(fs.makeQualified(jpath).toUri().toString())))
    return out


def _scan_files(spark: SparkSession, dt: Snapshot, files: Sequence[LiveFile]) -> DataFrame:
    """Spark DataFrame over ``files`` in table column order (nullable columns, as
    Spark's Parquet reader always makes them), partition values from the log."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    schema = table_schema(dt)
    parts = partition_columns(dt)
    target = _spark_schema(schema)
    file_struct = StructType([f for f in target.fields if f.name not in parts])
    if not files:
        return spark.createDataFrame([], target)
    data = spark.read.schema(file_struct).parquet(*[f.local_path for f in files])
    if not parts:
        return data.select(*[F.col(f"`{n}`") for n in schema.names])
    key = "__delta_uri"
    uris = _spark_uris(spark, [f.local_path for f in files])
    rows = [
        (u, *[f.partition_values.get(c) for c in parts]) for u, f in zip(uris, files, strict=True)
    ]
    map_schema = StructType(
        [StructField(key, StringType())] + [StructField(c, StringType()) for c in parts]
    )
    mapping = spark.createDataFrame(rows, map_schema)
    for c in parts:
        mapping = mapping.withColumn(c, F.col(f"`{c}`").cast(target[c].dataType))
    joined = data.withColumn(key, _file_key()).join(F.broadcast(mapping), on=key, how="inner")
    return joined.select(*[F.col(f"`{n}`") for n in schema.names])


def read_table(
    spark: SparkSession, path: str | os.PathLike[str], version: int | None = None
) -> DataFrame:
    """A Spark DataFrame of the table, latest or at ``version``.

    Lists the version's files from its snapshot (``snapshot.load``: the checksum's
    listing, no Spark job for a small table) and lets Spark read them in parallel;
    partition values come from the log. An empty table gives an empty DataFrame with
    the table's schema. Not ``spark.read.format("delta")``: its read of a new version
    rebuilds the table state in a Spark job (measured on a 30-file bronze: 5.2 s for
    the process's first read, then 0.27-0.31 s against 0.14-0.2 s; silver's batch mode reads a
    new bronze version every batch, and the test suite took 7 minutes longer).
    """
    dt = _open(path, version)
    return _scan_files(spark, dt, live_files(dt))


def read_delta(
    spark: SparkSession,
    path: str | os.PathLike[str],
    version: int | None = None,
    *,
    with_file: bool = False,
) -> DataFrame:
    """Delta's own batch read of the table, latest or at ``version`` (``versionAsOf``):
    its partition pruning and data skipping. For the reads a run makes once (the
    backfill), where rebuilding a version's state in a Spark job costs once; ``read_table``
    serves the reads repeated every micro-batch. ``with_file`` adds ``FILE_COL``: how
    Spark spells the row's file (``file_keys`` maps the live files to it)."""

    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    df = reader.load(os.fspath(path))
    return df.withColumn(FILE_COL, _file_key()) if with_file else df


def _file_key() -> Column:
    """A row's file as ``_spark_uris`` spells it (``_metadata.file_path``, ``file:`` cut)."""
    from pyspark.sql import functions as F

    return F.regexp_replace(F.col("_metadata.file_path"), "^file:/+", "/")


def file_keys(spark: SparkSession, files: Sequence[LiveFile]) -> dict[str, LiveFile]:
    """The live files by their ``FILE_COL`` value in ``read_delta(with_file=True)``."""
    return dict(zip(_spark_uris(spark, [f.local_path for f in files]), files, strict=True))


# ---------------------------------------------------------------------------
# Merges and range overwrites


def _merge_target(
    path: str | os.PathLike[str], keys: Sequence[str], app_id: str, batch_id: int
) -> tuple[Snapshot, pa.Schema, CommitResult | None]:
    """The table a merge writes, its schema, and the result if the batch is already in it."""
    if not keys:
        raise ValueError("merge needs at least one key column")
    dt = open_for_write(path)
    schema = table_schema(dt)
    if already_committed(dt, app_id, batch_id):
        return dt, schema, CommitResult(skipped=True, version=dt.version)
    for k in keys:
        if k not in schema.names:
            raise SchemaMismatchError(f"key column {k!r} not in table {path}")
    return dt, schema, None


# ---------------------------------------------------------------------------
# Arrow writers: results computed on the driver (gold, silver's small tables,
# backfills) go to Delta without a DataFrame.


def conform_arrow(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` as ``schema``: its columns in order and cast; a NULL in a non-nullable
    column is a :class:`SchemaMismatchError` (nothing is written)."""
    missing = [n for n in schema.names if n not in table.column_names]
    if missing:
        raise SchemaMismatchError(f"missing columns {missing}: nothing was committed")
    try:
        out = table.select(schema.names).cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SchemaMismatchError(f"{exc}: nothing was committed") from exc
    for f in schema:
        if not f.nullable and out.column(f.name).null_count:
            raise SchemaMismatchError(f"{NULL_MARK} {f.name!r}: nothing was committed")
    return out


def _write_staged(stage: Stage, table: pa.Table, dt: Snapshot) -> list[DataFileInfo]:
    """``table`` (conformed) as one data file of the stage; none for no rows."""
    if dt.partition_columns:
        raise DeltaLayerError("the Arrow writers write unpartitioned tables only")
    writer = DataFileWriter(stage.file(data_file_name()), dt.schema, unique=())
    writer.write(table)
    info = writer.close()
    return [] if info is None else [info]


def _commit_arrow(
    table: pa.Table, path: str | os.PathLike[str], *, app_id: str, batch_id: int, replace: bool
) -> CommitResult:
    # The stage holds the table lock from the listing and the file's write to the
    # commit: no VACUUM takes the file in flight, no compaction comes between a
    # replace's listing and its commit.
    with Stage(path, app_id, batch_id) as stage:
        dt = open_for_write(path)
        if already_committed(dt, app_id, batch_id):
            sweep_committed_batch(path, app_id, batch_id)
            return CommitResult(skipped=True, version=dt.version)
        files = _write_staged(stage, conform_arrow(table, dt.schema), dt)
        operation = "overwrite" if replace else "append"
        result = _commit_staged(path, files, app_id, batch_id, operation, replace, opened=dt)
        stage.done = True
        return result


def append_arrow(
    table: pa.Table, path: str | os.PathLike[str], *, app_id: str, batch_id: int
) -> CommitResult:
    """Append Arrow rows as one Parquet file, exactly once (a replayed batch writes nothing)."""
    return _commit_arrow(table, path, app_id=app_id, batch_id=batch_id, replace=False)


def replace_arrow(
    table: pa.Table, path: str | os.PathLike[str], *, app_id: str, batch_id: int
) -> CommitResult:
    """Replace a small table's whole content with ``table`` in one commit, exactly once."""
    return _commit_arrow(table, path, app_id=app_id, batch_id=batch_id, replace=True)


def merge_arrow(
    table: pa.Table,
    path: str | os.PathLike[str],
    *,
    keys: Sequence[str],
    app_id: str,
    batch_id: int,
) -> CommitResult:
    """Upsert Arrow rows on ``keys`` exactly once: the files holding matched keys are
    rewritten without them, with the new rows, in one commit (a file-level merge, as
    Delta's MERGE does, here in Arrow on the driver for small state tables: delta-spark's
    MERGE costs seconds of Spark jobs per batch). Duplicate keys in ``table`` are an
    error."""
    # The stage holds the table lock: no compaction between choosing the files and the
    # commit, no VACUUM of the file in flight.
    with Stage(path, app_id, batch_id) as stage:
        dt, schema, done = _merge_target(path, keys, app_id, batch_id)
        if done is not None:
            return done
        source = conform_arrow(table, schema)
        if source.num_rows:
            counts = source.group_by(list(keys)).aggregate([([], "count_all")])
            if pc.max(counts.column("count_all")).as_py() > 1:
                raise ValueError(f"batch {batch_id} has duplicate keys {list(keys)}")
        touched: list[LiveFile] = []
        kept: list[pa.Table] = []
        matched = 0
        source_keys = source.select(list(keys))
        for f in live_files(dt):
            target = read_data_file(f, schema, keys)
            target = target.append_column("__row", pa.array(range(target.num_rows), pa.int64()))
            keep = target.join(source_keys, keys=list(keys), join_type="left anti")
            if keep.num_rows < target.num_rows:
                touched.append(f)
                matched += target.num_rows - keep.num_rows
                rows = read_data_file(f, schema)  # map columns cannot pass a join: take
                at = keep.column("__row")
                kept.append(rows.take(at.take(pc.sort_indices(at))))
        out = pa.concat_tables([conform_arrow(t, schema) for t in kept] + [source])
        files = _write_staged(stage, out, dt)
        result = _commit_staged(
            path, files, app_id, batch_id, "upsert", False, [f.delta_path for f in touched],
            opened=dt,
        )  # fmt: skip
        stage.done = True
    if result.skipped:
        return result
    return CommitResult(
        skipped=False,
        version=result.version,
        files_added=result.files_added,
        files_removed=result.files_removed,
        rows=source.num_rows - matched,
        updated=matched,
    )


def version_before_batch(path: str, app_id: str, batch_id: int) -> int | None:
    """The version ``app_id``'s ``batch_id`` first saw: the one before its first commit
    of (app_id, >= batch_id); None when it has not committed the batch (the latest),
    -1 when that commit created the table (empty before it).

    Commits of one app come in batch order, so this is the state that batch first saw.
    """
    done = committed_batch(path, app_id)
    if done is None or done < batch_id:
        return None
    first = min((v for a, b, v in app_transactions(path) if a == app_id and b >= batch_id), default=None)
    return None if first is None else first - 1


def app_transactions(path: str | os.PathLike[str]) -> list[tuple[str, int, int]]:
    """(app id, batch id, version) of every commit carrying an app transaction, in
    version order: the ``txn`` actions of the log's commit files, which delta-rs
    (``CommitProperties``) and delta-spark (``txnAppId``/``txnVersion``) both write.
    Commit files Delta's log cleanup removed are not seen."""
    out: list[tuple[str, int, int]] = []
    files = sorted(storage.list_files(_log_dir(path)))
    for loc in files:
        name = os.path.basename(loc)
        if not _COMMIT_FILE.fullmatch(name):
            continue
        version = int(name[:20])
        try:
            text = storage.read_text(loc)
        except FileNotFoundError:
            continue  # cleaned up meanwhile
        for line in text.splitlines():
            if '"txn"' in line and "txn" in (action := json.loads(line)):
                out.append((str(action["txn"]["appId"]), int(action["txn"]["version"]), version))
    return out


def _open_before_batch(path: str, app_id: str, batch_id: int) -> tuple[Snapshot, bool]:
    """The table as ``batch_id`` first saw it (``version_before_batch``), and whether it
    was empty then (the batch created it: the latest version is opened, for its schema)."""
    version = version_before_batch(path, app_id, batch_id)
    if version is not None and version < 0:
        return _open(path, None), True
    return _open(path, version), False


def read_before_batch(
    path: str,
    app_id: str,
    batch_id: int,
    columns: Sequence[str] | None = None,
    within: tuple[str, Any, Any] | None = None,
) -> pa.Table:
    """The table as it was before ``app_id`` committed ``batch_id`` (or now, if it has not).

    ``columns``: only these; ``within`` = (column, low, high): only the files whose log
    stats allow a value in [low, high] (``prune_files``; rows are not filtered)."""
    dt, empty = _open_before_batch(path, app_id, batch_id)
    schema = table_schema(dt)
    names = list(schema.names if columns is None else columns)
    if empty:
        return pa.schema([schema.field(n) for n in names]).empty_table()
    live = live_files(dt)
    if within is not None:
        live = prune_files(dt, live, *within)
    want = pa.schema([schema.field(n) for n in names])
    pieces = [read_data_file(f, schema, names) for f in live]
    if not pieces:
        return want.empty_table()
    return pa.concat_tables(pieces).cast(want)


@dataclass(frozen=True)
class FileFacts:
    """A live file with what the log says of it: rows, and nulls of one column (None:
    the log keeps no such stat, so nothing is proven)."""

    live: LiveFile
    rows: int | None
    nulls: int | None


def file_facts_before_batch(
    path: str, app_id: str, batch_id: int, column: str
) -> tuple[pa.Schema, list[FileFacts]]:
    """(schema, live files with their row and ``column`` null counts) of the table as
    ``batch_id`` first saw it (``version_before_batch``)."""
    dt, empty = _open_before_batch(path, app_id, batch_id)
    if empty:
        return table_schema(dt), []
    adds = dt.stats()
    paths = adds.column("path").to_pylist()

    def stat(name: str) -> list[Any]:
        return adds.column(name).to_pylist() if name in adds.column_names else [None] * len(paths)

    facts = dict(zip(paths, zip(stat("num_records"), stat(f"null_count.{column}"), strict=True), strict=True))
    out = []
    for f in live_files(dt):
        rows, nulls = facts.get(f.delta_path, (None, None))
        out.append(FileFacts(f, None if rows is None else int(rows), None if nulls is None else int(nulls)))
    return table_schema(dt), out


def files_before_batch(
    path: str, app_id: str, batch_id: int
) -> tuple[pa.Schema, list[LiveFile]]:
    """(schema, live files) of the table as ``batch_id`` first saw it
    (``version_before_batch``): for tasks that read it themselves (``read_data_file``)."""
    dt, empty = _open_before_batch(path, app_id, batch_id)
    return table_schema(dt), [] if empty else live_files(dt)
