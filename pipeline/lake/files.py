"""A micro-batch's Delta files, as Spark planned them, read with pyarrow where the row work runs.

silver and gold read their input with Delta's own streaming source
(``spark.readStream.format("delta")``). The DataFrame a ``foreachBatch``
function gets already holds the batch's scan: Spark's ``FileScanRDD`` over the
files Delta's source chose for the batch (from the offsets Spark logged, so a
replay after a crash gets the same files). ``batch_files`` reads that list from
the DataFrame's plan (no job, about 0.01 s) so the jobs can read those files
with pyarrow in their own tasks or on the driver: the same rows as the
DataFrame, without Spark's Parquet-to-row-to-Arrow round trip (docs/DESIGN.md,
"Reading Delta in the jobs"). When the plan holds no file scan it can read,
``batch_files`` says so (None) and the caller uses the DataFrame itself
(``mapInArrow`` or ``toArrow``), which is always correct.

Reading whole files is the DataFrame's content because the jobs' tables have no
deletion vectors (``transaction.TABLE_PROPERTIES``) and no partition columns.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.lake import storage

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

ARROW_BATCH_ROWS = 10_000
ARROW_BATCH_BYTES = 64 * 1024 * 1024
FILE_SCAN_RDD = "FileScanRDD"


class MissingFileError(RuntimeError):
    """A file the batch's plan names is gone (vacuumed before the batch read it?)."""


@dataclass(frozen=True)
class DataFile:
    """One Parquet file of a table: where it is and its size. Plain values, so it pickles."""

    path: str  # its location (``pipeline.lake.storage``): a local absolute path, or a URI
    size: int
    rows: int | None = None  # when known (only for planning, never for correctness)


def file_location(uri: str) -> str:
    """A data file of Spark's plan (a ``file:`` or bucket URI, or a plain path) as its
    location: a local path, or the bucket URI as ``pipeline.lake.storage`` names it."""
    if storage.is_object_store(uri):
        return storage.location(urllib.parse.unquote(uri))
    if "://" not in uri and not uri.startswith("file:"):
        return uri
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme != "file":
        raise ValueError(f"a data file on {parsed.scheme}:// cannot be read here: {uri}")
    return urllib.parse.unquote(parsed.path)


def _scans(jrdd: Any, out: dict[str, int], seen: set[int]) -> bool:
    """Collect the files of every ``FileScanRDD`` under ``jrdd``; whether one was found."""
    if jrdd.id() in seen:
        return False
    seen.add(jrdd.id())
    if jrdd.getClass().getSimpleName() == FILE_SCAN_RDD:
        parts = jrdd.filePartitions()
        for k in range(parts.size()):
            for f in parts.apply(k).files():
                out[f.filePath().toString()] = int(f.fileSize())
        return True
    found = False
    deps = jrdd.dependencies().iterator()
    while deps.hasNext():
        found = _scans(deps.next().rdd(), out, seen) or found
    return found


def plan_files(df: DataFrame) -> dict[str, int] | None:
    """Every file (URI -> size) a ``foreachBatch`` DataFrame's file scans read; None when
    ``df`` is not one or its plan has no file scan (then only the DataFrame itself says
    what it holds).

    Only for a stream whose plan unions and projects its Delta sources: a filter in
    the plan would not show in the list (the batch-mode DataFrames of the jobs have
    filters, and are not ``foreachBatch``'s ``LogicalRDD``, so they get None).
    """
    try:
        plan = df._jdf.queryExecution().logical()
    except Exception:  # not a JVM DataFrame (e.g. Spark Connect): use the DataFrame
        return None
    if plan.getClass().getSimpleName() != "LogicalRDD":
        return None
    out: dict[str, int] = {}
    try:
        found = _scans(plan.rdd(), out, set())
    except Exception as exc:  # a Spark release whose internals differ: say so, once
        _warn_fallback(exc)
        return None
    return out if found else None


_warned = False


def _warn_fallback(exc: BaseException) -> None:
    """One warning per process: the batches are read through the DataFrame (correct,
    slower) because the file scan of Spark's plan could not be read."""
    import logging

    global _warned
    if not _warned:
        _warned = True
        logging.getLogger(__name__).warning(
            "cannot read the files of a micro-batch's plan (%s: %s); reading its rows "
            "through the DataFrame instead (correct, slower)", type(exc).__name__, exc,
        )  # fmt: skip


def batch_files(df: DataFrame, tables: Sequence[str]) -> list[list[DataFile]] | None:
    """The files ``df`` reads, per table of ``tables`` (their root folders), each list in
    path order; None when the plan shows no file scan. A file of none of the tables
    is an error: the DataFrame reads something the caller did not expect."""
    found = plan_files(df)
    if found is None:
        return None
    roots = [storage.location(t).rstrip("/") + "/" for t in tables]
    out: list[list[DataFile]] = [[] for _ in tables]
    for uri, size in sorted(found.items()):
        path = file_location(uri)
        for i, root in enumerate(roots):
            if path.startswith(root):
                out[i].append(DataFile(path, size))
                break
        else:
            raise ValueError(f"the batch reads {path}, outside {', '.join(tables)}")
    return out


def arrow_schema(schema: StructType) -> pa.Schema:
    """A Spark schema as the Arrow schema Spark's Arrow functions expect (UTC times)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def _batch_rows(meta: pq.FileMetaData) -> int:
    """Rows per Arrow batch: about ARROW_BATCH_BYTES of data, at most ARROW_BATCH_ROWS."""
    if meta.num_rows == 0:
        return ARROW_BATCH_ROWS
    total = sum(int(meta.row_group(i).total_byte_size) for i in range(meta.num_row_groups))
    per_row = max(total // int(meta.num_rows), 1)
    return max(1, min(ARROW_BATCH_ROWS, ARROW_BATCH_BYTES // per_row))


def read_file(
    f: DataFile, schema: pa.Schema, row_groups: Sequence[int] | None = None
) -> Iterator[pa.RecordBatch]:
    """Rows of one data file (or of some of its row groups) in exactly ``schema``;
    columns the file lacks (added to the table later) are null."""
    try:
        pf = storage.parquet_file(f.path)
    except FileNotFoundError:
        raise MissingFileError(f"data file {f.path} of the batch is gone (vacuumed?)") from None
    in_file = set(pf.schema_arrow.names)
    columns = [n for n in schema.names if n in in_file]
    produced = 0
    groups = None if row_groups is None else list(row_groups)
    batches = pf.iter_batches(
        batch_size=_batch_rows(pf.metadata), columns=columns, row_groups=groups
    )
    for batch in batches:
        arrays = [
            batch.column(fld.name).cast(fld.type)
            if fld.name in in_file
            else pa.nulls(batch.num_rows, fld.type)
            for fld in schema
        ]
        produced += batch.num_rows
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)
    expected = (
        pf.metadata.num_rows
        if groups is None
        else sum(pf.metadata.row_group(i).num_rows for i in groups)
    )
    if produced != expected:
        raise MissingFileError(f"{f.path}: read {produced} rows, the footer says {expected}")


def read_files(files: Sequence[DataFile], schema: StructType, columns: Sequence[str]) -> pa.Table:
    """``files`` read with pyarrow in this process, projected on ``columns``."""
    full = arrow_schema(schema)
    wanted = pa.schema([full.field(c) for c in columns])
    batches = [b for f in files for b in read_file(f, wanted)]
    return pa.Table.from_batches(batches, schema=wanted)


def commit_adds(table: str, version: int) -> list[DataFile] | None:
    """The data files commit ``version`` of a local ``table`` added (with data change), in
    log order; None when the commit file does not exist (benchmarks and tests replay a
    table's commits as batches with it)."""
    import json

    log = os.path.join(table, "_delta_log", f"{version:020d}.json")
    try:
        with open(log, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        return None
    out = []
    for line in lines:
        add = json.loads(line).get("add") if line.strip() else None
        if add is not None and add.get("dataChange", True):
            path = urllib.parse.unquote(add["path"])
            out.append(DataFile(path if path.startswith("/") else os.path.join(table, path), int(add["size"])))
    return out
