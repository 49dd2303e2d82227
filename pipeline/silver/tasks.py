"""Silver's row work in Spark tasks: decode, write Parquet, return file descriptions.

The task path of a micro-batch (``decode_on="tasks"``, and ``"auto"`` above the
driver threshold), as dlt's normalize workers do it: the driver plans (which
bronze files, or row groups, each task reads; one staging folder per table),
every task decodes its part with the vectorized codec and writes one Parquet
file per silver table into that table's staging folder, and returns only

* the description of each file (``pipeline.delta.DataFileInfo``: name, size,
  rows, footer statistics), checked against the table schema in the task;
* the schema records it met (registry rows) and its agent observations, already
  aggregated (one row per agent and dialect);
* the rare rows whose completion needs the whole batch or earlier batches:
  messages parked for want of a schema (another task, or a later batch, may
  bring it) and the halves of v1 method calls (paired across batches).

The driver then finishes the batch as on the driver path
(``SilverBatchWriter.finish``) and commits each table's files, its own
included, in one Delta commit with the app transaction
(``pipeline.delta.commit_staged``). Its work grows with files, schemas,
agents, parked messages and method calls, not with object samples, events or
heartbeats.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import delta
from pipeline.codec.schema import ClassSchema, SchemaRegistry
from pipeline.delta_source import DataFile, arrow_schema, read_file
from pipeline.ipc import from_ipc, to_ipc
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
)
from pipeline.silver.registry import StatisticKinds
from schemas.silver import AGENTS
from schemas.tables import BRONZE

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# Written by the tasks, straight into the tables' staging folders.
TASK_TABLES = (SAMPLES, EVENTS_T, HEARTBEATS_T, METHODS_T, QUARANTINE_T)
# Returned to the driver (small, and completed with the whole batch).
SIDE_TABLES = (SEEN_T, PARKED_T, CALL_PARTS_T)
# Bronze columns the decode reads.
DECODE_COLUMNS = (
    "partition", "offset", "msg_key", "received_at", "body", "correlation_id",
    "routing_key", "app_id", "content_type", "application_properties",
)  # fmt: skip


@dataclass(frozen=True)
class TaskPlan:
    """What every task of one batch needs (plain values: it pickles to the executors)."""

    schemas: tuple[ClassSchema, ...]
    batch_id: int
    kinds: StatisticKinds
    staging: tuple[tuple[str, str], ...]  # (table, staging folder inside the table)


@dataclass
class TaskOutput:
    """What one task returns: file descriptions, side rows (Arrow IPC), agents, counts."""

    files: dict[str, list[delta.DataFileInfo]] = field(default_factory=dict)
    side: dict[str, bytes] = field(default_factory=dict)
    agents: bytes = b""
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
    staging: list[str] = field(default_factory=list)  # the batch's staging folders

    def samples_reader(self) -> pa.Table:
        """This batch's object samples as the tasks wrote them (read only when needed:
        the class of an AM1 method call's object)."""
        files = self.files.get(SAMPLES, [])
        if not files:
            return OUTPUT_SCHEMAS[SAMPLES].empty_table()
        return pa.concat_tables([pq.read_table(f.location) for f in files])




def run_task(batches: Iterable[pa.RecordBatch], plan: TaskPlan) -> TaskOutput:
    """One task: decode its bronze batches, write each task table's rows into one
    Parquet file in its staging folder, describe the files, keep the side rows."""
    reg = SchemaRegistry(plan.schemas)  # plans do not pickle: rebuilt in the task
    staging = dict(plan.staging)
    writers = {
        name: delta.DataFileWriter(
            os.path.join(staging[name], delta.data_file_name(plan.batch_id)),
            OUTPUT_SCHEMAS[name],
        )
        for name in TASK_TABLES
    }
    side: dict[str, list[pa.Table]] = {n: [] for n in SIDE_TABLES}
    agents: list[pa.Table] = []
    out = TaskOutput()
    try:
        for b in batches:
            out.messages += b.num_rows
            d = decode_arrow(b, reg, plan.batch_id, plan.kinds)
            out.fast_messages += d.fast_messages
            out.fallback_messages += d.fallback_messages
            for name, t in d.tables.items():
                if name in writers:
                    writers[name].write(t)
                elif name in side and t.num_rows:
                    side[name].append(t)
            agents.append(agent_rows(d, plan.batch_id))
        for name, w in writers.items():
            info = w.close()
            if info is not None:
                out.files[name] = [info]
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    out.side = {n: to_ipc(pa.concat_tables(ts)) for n, ts in side.items() if ts}
    out.agents = to_ipc(merge_agent_rows(agents, plan.batch_id))
    return out


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
            meta = pq.ParquetFile(f.path).metadata
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


def decode_to_arrow(
    df: DataFrame,
    registry: SchemaRegistry,
    batch_id: int,
    kinds: StatisticKinds,
    scratch: str,
) -> Decoded:
    """The task decode of a DataFrame, its files (under ``scratch``) read back here.

    For a caller that needs the decoded rows themselves on the driver (a
    backfill replaces ranges from there, and tests compare both decodes); the
    streaming writer commits the files instead.
    """
    staging = []
    for name in TASK_TABLES:
        folder = os.path.join(scratch, name)
        os.makedirs(folder, exist_ok=True)
        staging.append((name, folder))
    plan = TaskPlan(tuple(registry), batch_id, kinds, tuple(staging))
    got = gather(run_dataframe(df, plan), batch_id)
    out = Decoded(tables=dict(got.side.tables))
    out.fast_messages, out.fallback_messages = got.side.fast_messages, got.side.fallback_messages
    for name, files in got.files.items():
        out.tables[name] = pa.concat_tables(
            [pq.read_table(f.location).cast(OUTPUT_SCHEMAS[name]) for f in files]
        )
    return out
