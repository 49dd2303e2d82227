"""Silver's row work in Spark tasks: decode, write Parquet, return file descriptions.

The task path of a micro-batch (``decode_on="tasks"``, and ``"auto"`` above the
driver threshold), as dlt's normalize workers do it: the driver plans (which
bronze files, or row groups, each task reads; one stage prefix per table),
every task decodes its part with the vectorized codec and writes one Parquet
file per silver table into that table's folder (``pipeline.lake.delta.Stage``), and returns only

* the description of each file (``pipeline.lake.delta.DataFileInfo``: name, size,
  rows, footer statistics), checked against the table schema in the task;
* the schema records it met (registry rows) and its agent observations, already
  aggregated (one row per agent and dialect);
* a summary of the messages it parked for want of a schema, by key
  (``pipeline.silver.parked``: the messages themselves are in its ``parked`` file);
* nothing of v1 method calls: their halves go to files by bucket of (dialect, seq)
  under the ``method_calls`` stage (``pipeline.silver.methods.PartWriter``),
  for the pairing's tasks.

When a batch brings a schema that parked messages wait for (this batch's, in
another task's file, or earlier batches', in the ``parked`` table), a second
job decodes them (``resolve_task``): each task reads its share of those files,
decodes what is now decodable, writes the rows as the first job does, rewrites
this batch's parked files without what it decoded, and marks the earlier
batches' messages it decoded in ``parked_resolved``.

The driver then finishes the batch as on the driver path
(``SilverBatchWriter.finish``) and commits each table's files, its own
included, in one Delta commit with the app transaction
(``pipeline.lake.delta.commit_staged``). Its work grows with files, schemas,
agents and the keys parked messages wait for, not with object samples, events,
heartbeats, parked messages or method calls.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.codec.schema import ClassSchema, SchemaRegistry
from pipeline.lake import delta, storage
from pipeline.lake.files import DataFile, arrow_schema, read_file
from pipeline.runtime import taskworker
from pipeline.runtime.ipc import from_ipc, to_ipc
from pipeline.silver import parked
from pipeline.silver.agents import agent_rows, merge_agent_rows
from pipeline.silver.decode import (
    CALL_PARTS_T,
    EVENTS_T,
    HEARTBEATS_T,
    METHODS_T,
    OUTPUT_SCHEMAS,
    PARKED_T,
    QUARANTINE_T,
    SAMPLES,
    SEEN_T,
    Decoded,
    decode_arrow,
    with_batch_schemas,
)
from pipeline.silver.methods import PartWriter
from pipeline.silver.registry import StatisticKinds
from schemas.silver import AGENTS, PARKED, RESOLVED
from schemas.tables import BRONZE

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# Written by the tasks, straight into the tables' folders.
TASK_TABLES = (SAMPLES, EVENTS_T, HEARTBEATS_T, METHODS_T, QUARANTINE_T, PARKED_T, CALL_PARTS_T)
# ... and by the tasks that decode parked messages again.
RESOLVED_T = "parked_resolved"
RESOLVE_TABLES = (*TASK_TABLES, RESOLVED_T)
RESOLVE_SCHEMAS = {**OUTPUT_SCHEMAS, RESOLVED_T: RESOLVED}
# Returned to the driver (small, and completed with the whole batch).
SIDE_TABLES = (SEEN_T,)
# The table whose folder holds each task table's files (the call halves are
# staged in ``method_calls``: the pairing's files go there too).
STAGED_IN = {CALL_PARTS_T: "method_calls"}
# Bronze columns the decode reads.
DECODE_COLUMNS = (
    "partition", "offset", "broker_name", "msg_key", "received_at", "body", "correlation_id",
    "routing_key", "app_id", "content_type", "application_properties",
)  # fmt: skip


@dataclass(frozen=True)
class TaskPlan:
    """What every task of one batch needs (plain values: it pickles to the executors)."""

    schemas: tuple[ClassSchema, ...]
    batch_id: int
    kinds: StatisticKinds
    staging: tuple[tuple[str, str], ...]  # (table, its file-name prefix: ``delta.Stage``)
    call_buckets: int = 1  # buckets of (dialect, seq) the call halves are split into


@dataclass
class TaskOutput:
    """What one task returns: file descriptions, side rows (Arrow IPC), agents, counts."""

    files: dict[str, list[delta.DataFileInfo]] = field(default_factory=dict)
    side: dict[str, bytes] = field(default_factory=dict)
    agents: bytes = b""
    pending: bytes = b""  # parked.PENDING: what the messages it parked wait for
    resolved: int = 0  # earlier batches' parked messages it decoded (resolve_task)
    fast_messages: int = 0
    fallback_messages: int = 0
    messages: int = 0


@dataclass
class TaskResults:
    """A batch's task outputs gathered on the driver (``SilverBatchWriter.finish``)."""

    files: dict[str, list[delta.DataFileInfo]]
    side: Decoded
    agents: pa.Table
    tasks: int
    messages: int
    pending: pa.Table = field(default_factory=parked.PENDING.empty_table)
    resolved: int = 0


def run_task(batches: Iterable[pa.RecordBatch], plan: TaskPlan) -> TaskOutput:
    """One task: decode its bronze batches, write each task table's rows into one
    Parquet file under its stage prefix, describe the files, keep the side rows."""
    taskworker.settle()
    reg = SchemaRegistry(plan.schemas)  # plans do not pickle: rebuilt in the task
    rows = _Rows(plan.batch_id, plan.staging, OUTPUT_SCHEMAS, plan.call_buckets)
    out = TaskOutput()
    try:
        for b in batches:
            out.messages += b.num_rows
            d = decode_arrow(b, reg, plan.batch_id, plan.kinds)
            rows.add(d)
            rows.pending.append(parked.summarize(d.get(PARKED_T)))
        rows.close(out)
    except BaseException:
        rows.abort()
        raise
    return out


class _Rows:
    """What a task makes of its decodes: one Parquet file per table it writes (into
    ``staging``), and what it returns besides: side rows, agents, the summary of
    what it parked."""

    def __init__(
        self,
        batch_id: int,
        staging: Sequence[tuple[str, str]],
        schemas: dict[str, pa.Schema],
        call_buckets: int,
    ) -> None:
        self.batch_id = batch_id
        self.writers = {
            name: delta.DataFileWriter(
                delta.staged_file(folder, delta.data_file_name()), schemas[name]
            )
            for name, folder in staging
            if name != CALL_PARTS_T
        }
        self.calls = {
            name: PartWriter(folder, batch_id, call_buckets)
            for name, folder in staging
            if name == CALL_PARTS_T
        }
        self.side: dict[str, list[pa.Table]] = {n: [] for n in SIDE_TABLES}
        self.agents: list[pa.Table] = []
        self.pending: list[pa.Table] = []
        self.fast = self.fallback = 0

    def add(self, d: Decoded) -> None:
        self.fast += d.fast_messages
        self.fallback += d.fallback_messages
        for name, t in d.tables.items():
            if name in self.writers:
                self.writers[name].write(t)
            elif name in self.calls:
                self.calls[name].write(t)
            elif name in self.side and t.num_rows:
                self.side[name].append(t)
        self.agents.append(agent_rows(d, self.batch_id))

    def abort(self) -> None:
        for w in self.writers.values():
            w.abort()
        for c in self.calls.values():
            c.abort()

    def close(self, out: TaskOutput) -> None:
        for name, w in self.writers.items():
            info = w.close()
            if info is not None:
                out.files[name] = [info]
        for name, c in self.calls.items():
            infos = c.close()
            if infos:
                out.files[name] = infos
        out.fast_messages += self.fast
        out.fallback_messages += self.fallback
        out.side = {n: to_ipc(pa.concat_tables(ts)) for n, ts in self.side.items() if ts}
        out.agents = to_ipc(merge_agent_rows(self.agents, self.batch_id))
        out.pending = to_ipc(parked.merge(self.pending))


def gather(outputs: Sequence[TaskOutput], batch_id: int) -> TaskResults:
    """The driver's view of a batch's task outputs."""
    files: dict[str, list[delta.DataFileInfo]] = {}
    side: dict[str, list[pa.Table]] = {}
    for o in outputs:
        for name, fs in o.files.items():
            files.setdefault(name, []).extend(fs)
        for name, payload in o.side.items():
            side.setdefault(name, []).append(from_ipc(payload))
    decoded = Decoded(tables={k: pa.concat_tables(v) for k, v in side.items()})
    decoded.fast_messages = sum(o.fast_messages for o in outputs)
    decoded.fallback_messages = sum(o.fallback_messages for o in outputs)
    agents = merge_agent_rows(
        [from_ipc(o.agents) for o in outputs if o.agents] or [AGENTS.empty_table()], batch_id
    )
    return TaskResults(
        files=files,
        side=decoded,
        agents=agents,
        tasks=len(outputs),
        messages=sum(o.messages for o in outputs),
        pending=parked.merge(from_ipc(o.pending) for o in outputs if o.pending),
        resolved=sum(o.resolved for o in outputs),
    )


# ---------------------------------------------------------------- planning


@dataclass(frozen=True)
class Piece:
    """Part of one bronze file: all of it, some of its row groups, or rows ``rows`` =
    (start, stop) of one row group (read whole, then sliced)."""

    file: DataFile
    groups: tuple[int, ...] | None = None
    rows: tuple[int, int] | None = None


@dataclass(frozen=True)
class Unit:
    """What one task reads: pieces of bronze files."""

    parts: tuple[Piece, ...]


def plan_units(files: Sequence[DataFile], tasks: int) -> list[Unit]:
    """Bronze files spread over at most ``tasks`` tasks of similar size.

    When there are fewer files than tasks, the files are split by row group
    (their footers are read here: one per file), and when there are still
    fewer row groups than tasks, row groups by rows: a file of one row group
    (what a bronze batch of up to 100,000 messages writes) still feeds every
    core. Each extra slice of a row group costs its task a read of the whole
    group; the decode it saves is many times that.
    """
    pieces: list[tuple[Piece, int]] = []
    for f in files:
        if len(files) < tasks:
            meta = storage.parquet_file(f.path).metadata
            for i in range(meta.num_row_groups):
                rg = meta.row_group(i)
                size = f.size if meta.num_row_groups == 1 else int(rg.total_byte_size)
                pieces.append((Piece(f, (i,), (0, int(rg.num_rows))), size))
            if meta.num_row_groups:
                continue
        pieces.append((Piece(f), f.size))
    if not pieces:
        return []
    pieces = _sliced(pieces, tasks)
    n = max(1, min(tasks, len(pieces)))
    units: list[list[Piece]] = [[] for _ in range(n)]
    weight = [0] * n
    for piece, w in sorted(pieces, key=lambda p: -p[1]):  # largest first, to the lightest
        i = weight.index(min(weight))
        units[i].append(piece)
        weight[i] += max(w, 1)
    return [Unit(tuple(u)) for u in units if u]


def _sliced(pieces: list[tuple[Piece, int]], tasks: int) -> list[tuple[Piece, int]]:
    """Fewer pieces than tasks: the single row groups among them cut into row slices, so
    there are about ``tasks`` pieces (each group into parts in proportion to its size)."""
    if len(pieces) >= tasks:
        return [(Piece(p.file, p.groups), w) if p.rows else (p, w) for p, w in pieces]
    total = sum(max(w, 1) for _, w in pieces)
    out: list[tuple[Piece, int]] = []
    for p, w in pieces:
        if p.rows is None:
            out.append((p, w))
            continue
        lo, hi = p.rows
        k = max(1, min(hi - lo, round(tasks * max(w, 1) / total)))
        for j in range(k):
            a, b = lo + (hi - lo) * j // k, lo + (hi - lo) * (j + 1) // k
            out.append((Piece(p.file, p.groups, (a, b)), w * (b - a) // (hi - lo)))
    return out


def _read_unit(unit: Unit) -> Iterator[pa.RecordBatch]:
    from schemas.tables import spark_schema

    full = arrow_schema(spark_schema(BRONZE))
    schema = pa.schema([full.field(c) for c in DECODE_COLUMNS])
    for piece in unit.parts:
        batches = read_file(piece.file, schema, piece.groups)
        if piece.rows is None:
            yield from batches
            continue
        lo, hi = piece.rows
        at = 0
        for b in batches:  # the group's batches in order: keep the rows in [lo, hi)
            a, z = max(lo - at, 0), min(hi - at, b.num_rows)
            if z > a:
                yield b.slice(a, z - a)
            at += b.num_rows


def run_units(spark: SparkSession, units: Sequence[Unit], plan: TaskPlan) -> list[TaskOutput]:
    """One Spark task per unit; the tasks read their bronze files themselves (no rows
    pass through the JVM) and return their ``TaskOutput``."""
    if not units:
        return []
    sc = spark.sparkContext
    rdd = sc.parallelize(list(units), len(units))
    return list(rdd.map(lambda u: run_task(_read_unit(u), plan)).collect())


def run_dataframe(df: DataFrame, plan: TaskPlan) -> list[TaskOutput]:
    """The same tasks over a DataFrame of bronze rows (a query's first batch, whose
    files are not known, and batch mode over a bronze range): one task per
    partition of ``df``."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    cols = [c for c in DECODE_COLUMNS if c in df.columns]

    def mapper(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        out = run_task(batches, plan)
        yield pa.RecordBatch.from_pydict(
            {"output": [pickle.dumps(out)]}, schema=pa.schema([("output", pa.binary())])
        )

    rows = (
        df.select(*cols)
        .mapInArrow(mapper, StructType([StructField("output", BinaryType())]))
        .collect()
    )
    return [pickle.loads(r["output"]) for r in rows]


# ------------------------------------------------------ parked messages, again


@dataclass(frozen=True)
class ResolvePlan:
    """What every task of a batch's second job needs: the registry with the batch's
    schemas, which keys are decodable now, and where earlier resolutions are."""

    schemas: tuple[ClassSchema, ...]
    batch_id: int
    kinds: StatisticKinds
    known: tuple[str, ...]  # missing keys decodable now (this batch's parked files)
    retry: tuple[str, ...]  # stored keys of earlier batches' messages to decode again
    staging: tuple[tuple[str, str], ...]  # (table, file-name prefix) of RESOLVE_TABLES
    parked_schema: pa.Schema
    resolved_schema: pa.Schema
    resolved_files: tuple[delta.LiveFile, ...]  # parked_resolved as of before the batch
    call_buckets: int = 1


@dataclass(frozen=True)
class ParkedPart:
    """A file of parked messages: this batch's (staged by a task of the first job), or
    one of the ``parked`` table as of before the batch (``live``)."""

    path: str
    size: int
    live: delta.LiveFile | None = None


def resolve_task(parts: Sequence[ParkedPart], plan: ResolvePlan) -> TaskOutput:
    """Decode the parked messages of ``parts`` whose schema is known now.

    This batch's files are rewritten: what is still waiting goes to a new parked
    file (with what a decoded message parked again for another of its classes).
    Earlier batches' messages decoded are written to ``parked_resolved``; those
    that park again stay pending where they are, under their stored key (the
    summary says what they wait for now).
    """
    taskworker.settle()
    rows = _Rows(plan.batch_id, plan.staging, RESOLVE_SCHEMAS, plan.call_buckets)
    out = TaskOutput()
    known = pa.array(plan.known, pa.string())
    retry = pa.array(plan.retry, pa.string())
    done: pa.Table | None = None
    try:
        for part in parts:
            if part.live is None:  # this batch's: split into waiting and decodable
                t = storage.parquet_file(part.path).read()
                now = pc.is_in(t.column("missing"), known)
                wait = t.filter(pc.invert(now))
                rows.writers[PARKED_T].write(wait)
                rows.pending.append(parked.summarize(wait))
                d = decode_arrow(
                    t.filter(now), SchemaRegistry(plan.schemas), plan.batch_id, plan.kinds
                )
                rows.pending.append(parked.summarize(d.get(PARKED_T)))
                rows.add(d)
                out.messages += t.num_rows
                continue
            t = delta.read_data_file(part.live, plan.parked_schema)
            t = t.filter(pc.is_in(t.column("missing"), retry))
            if done is None:
                done = _resolved_before(plan)
            t = parked.without(t, done)
            if t.num_rows == 0:
                continue
            out.messages += t.num_rows
            d = decode_arrow(t, SchemaRegistry(plan.schemas), plan.batch_id, plan.kinds)
            still = d.tables.pop(PARKED_T, None)
            if still is None:
                still = PARKED.empty_table()
            rows.pending.append(parked.summarize(still, _stored_keys(t, still)))
            decoded = parked.without(t, still)
            rows.writers[RESOLVED_T].write(
                pa.table(
                    {
                        "partition": decoded.column("partition"),
                        "offset": decoded.column("offset"),
                        "batch_id": pa.array([plan.batch_id] * decoded.num_rows, pa.int64()),
                        "parked_batch": decoded.column("batch_id"),
                    }
                )
            )
            out.resolved += decoded.num_rows
            rows.add(d)
        rows.close(out)
    except BaseException:
        rows.abort()
        raise
    return out


def _stored_keys(read: pa.Table, still: pa.Table) -> pa.Array:
    """The key each row of ``still`` was stored under in ``read`` (by partition, offset)."""

    def ids(t: pa.Table) -> list[tuple[str, int]]:
        return list(
            zip(t.column("partition").to_pylist(), t.column("offset").to_pylist(), strict=True)
        )

    stored = dict(zip(ids(read), read.column("missing").to_pylist(), strict=True))
    return pa.array([stored[k] for k in ids(still)], pa.string())


def _resolved_before(plan: ResolvePlan) -> pa.Table:
    cols = ["partition", "offset"]
    parts = [delta.read_data_file(f, plan.resolved_schema, cols) for f in plan.resolved_files]
    if not parts:
        return pa.table({"partition": pa.array([], pa.string()), "offset": pa.array([], pa.int64())})
    return pa.concat_tables(parts)


def run_resolve(
    spark: SparkSession | None, parts: Sequence[ParkedPart], plan: ResolvePlan, tasks: int
) -> list[TaskOutput]:
    """``resolve_task`` over ``parts`` spread by size over at most ``tasks`` tasks: Spark
    tasks, or here when ``spark`` is None (small work, or no Spark)."""
    n = max(1, min(tasks, len(parts)))
    units: list[list[ParkedPart]] = [[] for _ in range(n)]
    weight = [0] * n
    for p in sorted(parts, key=lambda p: -p.size):
        i = weight.index(min(weight))
        units[i].append(p)
        weight[i] += max(p.size, 1)
    units = [u for u in units if u]
    if spark is None:
        return [resolve_task(u, plan) for u in units]
    rdd = spark.sparkContext.parallelize(units, len(units))
    return list(rdd.map(lambda u: resolve_task(u, plan)).collect())


def decode_to_files(
    df: DataFrame,
    registry: SchemaRegistry,
    batch_id: int,
    kinds: StatisticKinds,
    scratch: str,
) -> TaskResults:
    """The task decode of a DataFrame of bronze rows into Parquet files under ``scratch``
    (a folder per table), for a caller that reads them with Spark (a backfill).

    Parked messages whose schema the rows brought (content before its schema) are
    decoded again by a second job over the parked files, as the streaming writer does
    in one batch (``resolve_task``): the returned ``parked`` files hold only what still
    waits. The driver gets file descriptions and the side rows, not the rows.
    """
    staging = [(name, os.path.join(scratch, name, "part")) for name in RESOLVE_TABLES]
    for name, prefix in staging:
        if name != RESOLVED_T:  # no earlier batch is decoded again: never written
            os.makedirs(os.path.dirname(prefix), exist_ok=True)
    first = [(n, f) for n, f in staging if n in TASK_TABLES]
    plan1 = TaskPlan(tuple(registry), batch_id, kinds, tuple(first))
    got = gather(run_dataframe(df, plan1), batch_id)
    ext, _ = with_batch_schemas(registry, got.side)
    known = parked.decodable(got.pending, ext)
    if not known:
        return got
    parts = [ParkedPart(f.location, f.size) for f in got.files.pop(PARKED_T, [])]
    plan = ResolvePlan(
        schemas=tuple(ext), batch_id=batch_id, kinds=kinds, known=tuple(known), retry=(),
        staging=tuple(staging), parked_schema=PARKED, resolved_schema=RESOLVED,
        resolved_files=(),
    )  # fmt: skip
    spark = df.sparkSession
    cores = spark.sparkContext.defaultParallelism
    again = gather(run_resolve(spark, parts, plan, cores), batch_id)
    for name, fs in again.files.items():
        got.files.setdefault(name, []).extend(fs)
    got.side = Decoded.concat([got.side, again.side])
    got.pending = again.pending
    return got


def decode_to_arrow(
    df: DataFrame,
    registry: SchemaRegistry,
    batch_id: int,
    kinds: StatisticKinds,
    scratch: str,
) -> Decoded:
    """``decode_to_files``, its files read back here: for tests that compare the rows
    of both decodes (the streaming writer and the backfill keep them in files)."""
    got = decode_to_files(df, registry, batch_id, kinds, scratch)
    out = Decoded(tables=dict(got.side.tables))
    out.fast_messages, out.fallback_messages = got.side.fast_messages, got.side.fallback_messages
    for name, files in got.files.items():
        if name in OUTPUT_SCHEMAS:
            out.tables[name] = pa.concat_tables(
                [pq.read_table(f.location).cast(OUTPUT_SCHEMAS[name]) for f in files]
            )
    return out
