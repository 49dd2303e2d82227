"""Method calls: v1 'M' requests paired with their 'm' responses across micro-batches.

The decode (``pipeline.silver.decode``) emits each half of a call as an untyped
``method_calls`` row. A call's halves meet by (dialect, seq), so the halves are
split into *buckets* of that key (``bucket_of``) where they are decoded: a Spark
task writes one Parquet file per bucket into the table's folder, under the batch's stage
(``PartWriter``). The pairing then runs per bucket (``pair_task``): in one Spark
task per bucket, or, for few rows, on the driver (``run_pairing``; the same
function over every bucket at once, so the results are identical).

The state across batches is the table's requests still waiting for an answer.
They are kept in their own files, named ``calls-open-*``; every other row the
pairing writes goes to ``calls-closed-*`` files. A batch with call halves reads the
*candidate* files as of before the batch (``stored_before``: the open files, and
any file of another writer, such as a compaction, whose log stats do not prove it
holds no request-only row), pairs, writes each bucket's rows of them again with
this batch's (completed, still open or closed), and the commit replaces the
candidate files with the new ones (a file-level upsert, with the app transaction).
docs/DESIGN.md, Method calls.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.codec.schema import ClassSchema, SchemaRegistry
from pipeline.lake import delta, storage
from pipeline.runtime import taskworker
from schemas.silver import METHOD_CALLS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

OPEN_PREFIX = "calls-open-"  # request-only rows that may still be answered
CLOSED_PREFIX = "calls-closed-"  # every other row: completed, response-only, superseded
PARTS_PREFIX = "calls-parts-"  # a batch's halves of one bucket (never committed)
# Columns of object samples that give an AM1 object's class (and which sample is latest).
CLASS_COLUMNS = (
    "dialect", "boot_seq", "bank", "object_num", "package", "class_name", "schema_hash",
    "batch_id", "partition", "offset", "record_index",
)  # fmt: skip
# What a pairing returns: its files and how many rows the batch changed.
Paired = tuple[list[delta.DataFileInfo], int]


# ------------------------------------------------------------------ buckets


def bucket_of(table: pa.Table, buckets: int) -> np.ndarray:
    """The bucket of each row's (dialect, seq): stable across processes and runs;
    consecutive sequence numbers of each dialect go round the buckets."""
    seq = table.column("seq").to_numpy(zero_copy_only=False).astype(np.int64)
    am1 = pc.equal(table.column("dialect"), "AM1").to_numpy(zero_copy_only=False)
    return np.asarray((seq + np.where(am1, 0, 1)) % buckets, dtype=np.int64)


def part_name(batch_id: int, bucket: int) -> str:
    return f"{PARTS_PREFIX}{batch_id:08d}-b{bucket:05d}-{uuid.uuid4().hex}.parquet"


def part_bucket(location: str) -> int:
    """The bucket a part file of ``part_name`` holds."""
    name = delta.staged_name(location)  # calls-parts-<batch>-b<bucket>-<token>.parquet
    return int(name[len(PARTS_PREFIX) :].split("-", 2)[1][1:])


class PartWriter:
    """A task's call halves, one Parquet file per bucket of (dialect, seq) that has any."""

    def __init__(self, folder: str, batch_id: int, buckets: int) -> None:
        self.folder = folder
        self.batch_id = batch_id
        self.buckets = max(1, buckets)
        self.writers: dict[int, delta.DataFileWriter] = {}

    def write(self, parts: pa.Table) -> None:
        if parts.num_rows == 0:
            return
        b = bucket_of(parts, self.buckets)
        for bucket in np.unique(b).tolist():
            w = self.writers.get(bucket)
            if w is None:
                path = delta.staged_file(self.folder, part_name(self.batch_id, bucket))
                w = self.writers[bucket] = delta.DataFileWriter(path, METHOD_CALLS)
            w.write(parts.filter(pa.array(b == bucket)))

    def close(self) -> list[delta.DataFileInfo]:
        out = [w.close() for _, w in sorted(self.writers.items())]
        self.writers = {}
        return [i for i in out if i is not None]

    def abort(self) -> None:
        for w in self.writers.values():
            w.abort()


# ------------------------------------------------------------------ the pairing


def _call_order(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """Arrival order of a call half: received_at, then bronze identity and record index."""
    side = "request" if _request_only(row) else "response"
    return tuple(row[f"{side}_{c}"] for c in ("at", "partition", "offset", "index"))


def _request_only(row: Mapping[str, Any]) -> bool:
    return row.get("request_partition") is not None and row.get("response_partition") is None


def _object_id(dialect: str, raw: bytes | None) -> Any:
    from pipeline.codec.types import Am1ObjectId, Am2ObjectId

    if raw is None:
        return None
    if dialect == "AM1":
        return Am1ObjectId.from_int(int.from_bytes(raw, "big"))
    return Am2ObjectId.from_ints(int.from_bytes(raw[:8], "big"), int.from_bytes(raw[8:], "big"))


def am1_classes(samples: pa.Table, wanted: set[Any]) -> dict[Any, tuple[str, str, bytes]]:
    """(package, class, hash) of the wanted AM1 object ids among object samples (latest wins)."""
    from pipeline.codec.types import Am1ObjectId

    if samples.num_rows == 0 or not wanted:
        return {}
    nums = pa.array(sorted({o.object_num for o in wanted}), pa.int64())
    am1 = pc.equal(samples.column("dialect"), "AM1")
    t = samples.filter(pc.and_(am1, pc.is_in(samples.column("object_num"), nums)))
    t = t.sort_by([("batch_id", "ascending"), ("partition", "ascending"),
                   ("offset", "ascending"), ("record_index", "ascending")])  # fmt: skip
    out: dict[Any, tuple[str, str, bytes]] = {}
    cols = ("boot_seq", "bank", "object_num", "package", "class_name", "schema_hash")
    for b, k, n, pkg, cls, h in zip(*(t.column(c).to_pylist() for c in cols), strict=True):
        oid = Am1ObjectId(b, k, n)
        if oid in wanted:
            out[oid] = (pkg, cls, h)
    return out


# Class keys of wanted AM1 object ids (``Classes``).
ClassLookup = Callable[[set[Any]], dict[Any, tuple[str, str, bytes]]]


def pair(
    parts: pa.Table,
    stored: pa.Table,
    registry: SchemaRegistry,
    classes: ClassLookup,
    batch_id: int,
) -> tuple[pa.Table, pa.Table, int]:
    """One bucket's pairing: (open rows, closed rows, rows the batch changed).

    ``stored``: the candidate files' rows of the bucket; their request-only rows are
    the pending state (the latest of each (dialect, seq); an older request with the
    same number can no longer be answered). Every stored row is written again, as
    it was unless the batch completed it. Arguments are typed with the codec's
    ``MethodContext``: an AM1 request names only an object, whose class ``classes``
    gives; a response is typed with its request's class and method. Bytes that do not
    fit a known method stay raw, with the reason in ``arguments_in_error`` or
    ``arguments_out_error``.
    """
    from pipeline.codec.layout import to_json
    from pipeline.codec.methods import MethodContext, PendingCall
    from pipeline.codec.records import MethodRequest, MethodResponse
    from pipeline.codec.schema import SchemaKey

    kept = stored.to_pylist()
    # A call is (broker, dialect, seq): two brokers' consoles number their requests alike.
    pending: dict[tuple[str | None, str, int], dict[str, Any]] = {}
    for r in sorted((r for r in kept if _request_only(r)), key=_call_order):
        pending[(r.get("broker_name"), r["dialect"], r["seq"])] = r
    out: dict[str, dict[str, Any]] = {r["call_id"]: r for r in kept}
    rows = sorted(parts.to_pylist(), key=_call_order)
    ctx = MethodContext()
    wanted = {
        _object_id("AM1", r["object_id_raw"])
        for r in rows
        if r["dialect"] == "AM1" and r["request_partition"] is not None
    }
    if wanted:
        ctx.objects.update(classes(wanted))
    changed: set[str] = set()
    for part in rows:
        d, seq = part["dialect"], part["seq"]
        if part["request_partition"] is not None:
            req = MethodRequest(
                dialect=d, opcode="M", seq=seq,
                object_id=_object_id(d, part["object_id_raw"]),
                method_name=part["method_name"], package=part["package"],
                class_name=part["class_name"], schema_hash=part["schema_hash"],
                raw_arguments=part["raw_in"] or b"",
            )  # fmt: skip
            typed, err = ctx.type_record(req, registry)
            assert isinstance(typed, MethodRequest)
            if typed.arguments is not None:
                part |= {
                    "package": typed.package, "class_name": typed.class_name,
                    "schema_hash": typed.schema_hash,
                    "arguments_in": to_json(typed.arguments),
                }  # fmt: skip
            else:
                known = ctx.class_of(req.object_id) if part["package"] is None else None
                if known is not None:  # an AM1 object's class, though its bytes did not fit
                    part |= {
                        "package": known.package, "class_name": known.name,
                        "schema_hash": known.hash,
                    }  # fmt: skip
                if err is not None:
                    part["arguments_in_error"] = str(err)
            pending[(part.get("broker_name"), d, seq)] = part
            out[part["call_id"]] = part
            changed.add(part["call_id"])
            continue
        call = pending.pop((part.get("broker_name"), d, seq), None)
        if call is None:
            out[part["call_id"]] = part  # no request seen: a response-only row
            changed.add(part["call_id"])
            continue
        call = dict(call)
        for c in ("response_partition", "response_offset", "response_index", "response_at",
                  "agent", "status", "text", "raw_out"):  # fmt: skip
            call[c] = part[c]
        call["batch_id"] = batch_id
        if call["package"] is not None and call["schema_hash"] is not None:
            key = SchemaKey(call["package"], call["class_name"], call["schema_hash"])
            ctx.pending[(d, seq)] = PendingCall(
                d, seq, _object_id(d, call["object_id_raw"]), key, call["method_name"]
            )
            resp = MethodResponse(
                dialect=d, opcode="m", seq=seq, status=part["status"],
                text=part["text"] or "", raw_arguments=part["raw_out"] or b"",
            )  # fmt: skip
            typed_r, err = ctx.type_record(resp, registry)
            assert isinstance(typed_r, MethodResponse)
            if typed_r.arguments is not None:
                call["arguments_out"] = to_json(typed_r.arguments)
            elif err is not None:
                call["arguments_out_error"] = str(err)
            del ctx.pending[(d, seq)]
        out[call["call_id"]] = call
        changed.add(call["call_id"])
    still = {r["call_id"] for r in pending.values()}
    open_rows = [r for cid, r in out.items() if cid in still]
    closed = [r for cid, r in out.items() if cid not in still]
    return (
        pa.Table.from_pylist(open_rows, schema=METHOD_CALLS),
        pa.Table.from_pylist(closed, schema=METHOD_CALLS),
        len(changed),
    )


# ------------------------------------------------------------------ the plan and its tasks


@dataclass(frozen=True)
class PairPlan:
    """What every pairing task of one batch needs (plain values: it pickles to executors)."""

    schemas: tuple[ClassSchema, ...]  # the registry with the batch's schemas
    app_id: str
    batch_id: int
    buckets: int
    parts: tuple[str, ...]  # the batch's part files (``part_name``)
    stored_schema: pa.Schema
    stored: tuple[delta.LiveFile, ...]  # candidate files as of before the batch
    samples: tuple[str, ...]  # this batch's object-sample files (AM1 objects' classes)
    samples_path: str  # the object_samples table: classes this batch does not give
    staging: str  # the method_calls stage prefix the paired files go under (``delta.Stage``)
    # In-process runs only (never pickled to a task): rows the driver holds.
    parts_rows: pa.Table | None = field(default=None, compare=False)
    samples_rows: pa.Table | None = field(default=None, compare=False)


class Classes:
    """``ClassLookup`` of a task: this batch's samples first, then the samples table as
    of before the batch (read only for ids the batch does not give, and only the files
    whose log stats allow their object numbers)."""

    def __init__(self, plan: PairPlan) -> None:
        self.plan = plan

    def __call__(self, wanted: set[Any]) -> dict[Any, tuple[str, str, bytes]]:
        plan = self.plan
        nums = pa.array(sorted({o.object_num for o in wanted}), pa.int64())
        read = [
            _rows_of(storage.parquet_file(p).read(columns=list(CLASS_COLUMNS)), nums)
            for p in plan.samples
        ]
        if plan.samples_rows is not None:
            read.append(_rows_of(plan.samples_rows.select(list(CLASS_COLUMNS)), nums))
        found = am1_classes(_concat(read), wanted) if read else {}
        missing = wanted - set(found)
        if missing:
            lo, hi = min(o.object_num for o in missing), max(o.object_num for o in missing)
            before = delta.read_before_batch(
                plan.samples_path, plan.app_id, plan.batch_id, CLASS_COLUMNS,
                within=("object_num", lo, hi),
            )  # fmt: skip
            found |= am1_classes(before, missing)
        return found


def _rows_of(samples: pa.Table, nums: pa.Array) -> pa.Table:
    return samples.filter(pc.is_in(samples.column("object_num"), nums))


def _concat(tables: Sequence[pa.Table]) -> pa.Table:
    first = tables[0].schema
    return pa.concat_tables([t.cast(first) for t in tables])


def _read_parts(plan: PairPlan, bucket: int | None) -> pa.Table:
    paths = [p for p in plan.parts if bucket is None or part_bucket(p) == bucket]
    tables = [storage.parquet_file(p).read().cast(METHOD_CALLS) for p in paths]
    if plan.parts_rows is not None and plan.parts_rows.num_rows:
        rows = plan.parts_rows
        if bucket is not None:
            rows = rows.filter(pa.array(bucket_of(rows, plan.buckets) == bucket))
        tables.append(rows.cast(METHOD_CALLS))
    return pa.concat_tables(tables) if tables else METHOD_CALLS.empty_table()


def _read_stored(plan: PairPlan, bucket: int | None) -> pa.Table:
    tables = []
    for f in plan.stored:
        t = delta.read_data_file(f, plan.stored_schema).cast(METHOD_CALLS)
        if bucket is not None:
            t = t.filter(pa.array(bucket_of(t, plan.buckets) == bucket))
        tables.append(t)
    return pa.concat_tables(tables) if tables else METHOD_CALLS.empty_table()


def _write(folder: str, prefix: str, batch_id: int, rows: pa.Table) -> list[delta.DataFileInfo]:
    if rows.num_rows == 0:
        return []
    name = f"{prefix}{batch_id:08d}-{uuid.uuid4().hex}.parquet"
    w = delta.DataFileWriter(delta.staged_file(folder, name), METHOD_CALLS, unique=("call_id",))
    w.write(rows)
    info = w.close()
    return [] if info is None else [info]


def pair_task(plan: PairPlan, bucket: int | None) -> Paired:
    """One bucket (None: all of them, on the driver): read its halves and stored rows,
    pair, write its open and closed files under the stage; return their
    descriptions and the rows the batch changed."""
    taskworker.settle()
    parts = _read_parts(plan, bucket)
    stored = _read_stored(plan, bucket)
    if parts.num_rows == 0 and stored.num_rows == 0:
        return [], 0
    open_rows, closed, changed = pair(
        parts, stored, SchemaRegistry(plan.schemas), Classes(plan), plan.batch_id
    )
    files = _write(plan.staging, OPEN_PREFIX, plan.batch_id, open_rows)
    files += _write(plan.staging, CLOSED_PREFIX, plan.batch_id, closed)
    return files, changed


def run_pairing(spark: SparkSession | None, plan: PairPlan) -> Paired:
    """Every bucket's ``pair_task``: one Spark task per bucket, or here when ``spark``
    is None (the same rows, as one bucket)."""
    if spark is None:
        return pair_task(plan, None)
    rdd = spark.sparkContext.parallelize(range(plan.buckets), plan.buckets)
    outs = rdd.map(lambda b: pair_task(plan, b)).collect()
    return [f for fs, _ in outs for f in fs], sum(n for _, n in outs)


# ------------------------------------------------------------------ the driver's side


def stored_before(path: str, app_id: str, batch_id: int) -> tuple[pa.Schema, list[delta.FileFacts]]:
    """The candidate files of ``method_calls`` as of before the batch: the open files, and
    the files of other writers whose log does not prove they hold no request-only row."""
    schema, files = delta.file_facts_before_batch(path, app_id, batch_id, "response_partition")
    out = []
    for f in files:
        name = delta.staged_name(f.live.local_path)
        if name.startswith(OPEN_PREFIX) or (
            not name.startswith(CLOSED_PREFIX) and (f.nulls is None or f.nulls > 0)
        ):
            out.append(f)
    return schema, out


@dataclass
class CallWork:
    """A batch's pairing as the writer plans it; ``remove``: the candidate files the
    paired files replace."""

    plan: PairPlan
    remove: list[str]
    rows: int  # halves plus stored rows (what chooses where the pairing runs)


class MethodCallTable:
    """Plans a batch's pairing (``plan``) and runs it (``run``). The state read is the
    candidate files as of before the batch, so a replay builds the same rows."""

    def __init__(self, path: str, samples_path: str) -> None:
        self.path = path
        self.samples_path = samples_path

    def plan(
        self,
        *,
        app_id: str,
        batch_id: int,
        registry: SchemaRegistry,
        buckets: int,
        part_files: Iterable[delta.DataFileInfo],
        parts_rows: pa.Table | None,
        sample_files: Iterable[delta.DataFileInfo],
        samples_rows: pa.Table | None,
        staging: str,
    ) -> CallWork:
        """The batch's pairing (the caller has call halves: a batch without any pairs and
        commits nothing)."""
        described = list(part_files)
        parts = tuple(f.location for f in described)
        held = 0 if parts_rows is None else parts_rows.num_rows
        schema, stored = stored_before(self.path, app_id, batch_id)
        part_rows = held + sum(f.rows for f in described)
        stored_rows = sum(
            f.rows if f.rows is not None else storage.parquet_file(f.live.local_path).metadata.num_rows
            for f in stored
        )
        plan = PairPlan(
            schemas=tuple(registry), app_id=app_id, batch_id=batch_id, buckets=max(1, buckets),
            parts=parts, stored_schema=schema, stored=tuple(f.live for f in stored),
            samples=tuple(f.location for f in sample_files), samples_path=self.samples_path,
            staging=staging, parts_rows=parts_rows if held else None,
            samples_rows=samples_rows if samples_rows is not None and samples_rows.num_rows else None,
        )  # fmt: skip
        return CallWork(plan, [f.live.delta_path for f in stored], part_rows + stored_rows)

    def run(self, work: CallWork, spark: SparkSession | None) -> Paired:
        """Pair in Spark tasks (``spark`` given), else here. Rows the driver holds are
        written under the stage first, for the tasks to read (swept after the commit)."""
        plan = work.plan
        if spark is None:
            return run_pairing(None, plan)
        extra_parts: list[str] = []
        if plan.parts_rows is not None:
            w = PartWriter(plan.staging, plan.batch_id, plan.buckets)
            w.write(plan.parts_rows)
            extra_parts = [f.location for f in w.close()]
        extra_samples: list[str] = []
        if plan.samples_rows is not None:
            p = delta.staged_file(plan.staging, f"samples-{uuid.uuid4().hex}.parquet")
            storage.write_parquet(p, plan.samples_rows.select(list(CLASS_COLUMNS)))
            extra_samples = [p]
        shipped = replace(
            plan, parts=(*plan.parts, *extra_parts), samples=(*plan.samples, *extra_samples),
            parts_rows=None, samples_rows=None,
        )  # fmt: skip
        return run_pairing(spark, shipped)
