"""Gold's row work in Spark tasks: an agent stage by bucket of agents, then a rate stage
by bucket of series.

Every gold result depends on the rows of one agent only: an object's lifecycle, its
names (references resolve within the agent), the rate series (keyed by agent first),
the agent's activity and its liveness. Two times are taken over everything:
``now_ns``, when liveness is judged (the latest heartbeat time seen), and
``latest_ns``, where the rate state's TTL counts back from (the latest sample time of
the batch and state). So a batch divides into *buckets* of agents (``bucket_of``: a
stable hash of the agent id), and the rates, per series, further into buckets of series
(``transforms.series_buckets``):

1. **split** (one task per unit of the batch's silver files): each task reads its
   samples or heartbeats, projects them on gold's input, and writes one Arrow IPC file
   per bucket of agents into the gold root's shuffle folder (a shuffle through shared
   storage); it returns the files' names, row counts and the part's latest heartbeat
   and sample times;
2. the driver takes the two times over every part and the tables' latest values
   (liveness, rate state: what the tasks that wrote them last reported, while that
   commit is the table's latest; else one column each read), and lists the gold tables'
   files as of now;
3. **agent stage** (``compute``, one task per bucket of agents): each task reads its
   bucket's input files and its agents' rows of the lifecycles and liveness (files named
   for its bucket; any other file is read and filtered), runs ``agent_stage``, writes its
   agents' whole new lifecycle and liveness rows as Parquet into the tables' staging
   folders, and its rate input into the shuffle folder (value rows by bucket of series;
   the per-agent facts);
4. **rate stage** (``rate_compute``, one task per bucket of series): each task reads its
   value files, every agent's facts and its rows of the rate state (``_series_state``),
   runs ``rate_stage`` and writes its rates and new state (``s`` and ``u`` files);
5. the driver commits, in order, rates (append), lifecycles, liveness, then the rate
   state last (each replacing the table's files in one commit), every commit with the
   app transaction.

With ``plan.rate_buckets`` 0 there is no rate stage: each agent task reads its agents'
rate state too and pairs their rates itself. With at most ``DIRECT_MAX_BUCKETS`` buckets
and the batch's files known, step 1 is skipped (the *direct* path): each agent task
reads every silver file of the batch, keeping its bucket's rows, and takes the batch's
two times over all of them as the split step does (so every task finds the same; the
driver gives the tables' values and, for a rate stage, takes the times from the agent
tasks' outputs). Reading a small batch a few times costs less than the split's Spark
job and its shuffle files.

A stage runs one task per bucket, and each task *claims* its bucket (``claim_bucket``):
the one whose tables its Python worker keeps from an earlier batch (``Kept``), else its
own number, else any left. Spark hands a task whichever idle worker comes first, so a
bucket given to a task by number found its tables in memory about half of the time on
two cores.

The driver's work grows with files, buckets and agents; the rows go through tasks only.
Bucket counts: ``GoldSettings.buckets`` (default Spark's default parallelism) and
``rate_buckets`` (default the same); changing them is safe (files of another bucketing
are read and filtered by every task until rewritten).
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.gold.transforms import (
    LIFECYCLE_KEYS,
    LivenessRules,
    RateInput,
    RateRules,
    agent_stage,
    conform,
    empty_rate_input,
    frame,
    heartbeat_rows,
    max_ns,
    rate_stage,
    rekey_state,
    series_buckets,
    statistic_defs,
    upsert_rows,
)
from pipeline.lake import delta, storage
from pipeline.lake.files import DataFile, arrow_schema, read_file
from pipeline.runtime import taskworker
from pipeline.runtime.ipc import from_ipc
from schemas.gold import AGENT_LIVENESS, LIFECYCLE_STATE, RATE_STATE, STATISTIC_RATES

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

LIVENESS_KEYS = ("agent", "up_start_ns")
# Up to this many buckets a batch skips the split step: each compute task reads the
# whole batch (``run_compute_direct``).
DIRECT_MAX_BUCKETS = 4
# The time column of a state table whose latest value a batch's plan takes
# (``GoldBatchWriter.timed_plan``): the tasks that write the table report its maximum
# over their files (``ComputeOutput.tops``), so the driver need not read it back.
TIME_COLUMNS = {"agent_liveness": "last_heartbeat_ns", "rate_state": "update_ns"}
# Tables a compute task rewrites for its agents (the rest of each table is other buckets').
STATE_TABLES = {
    "lifecycle_state": LIFECYCLE_STATE,
    "agent_liveness": AGENT_LIVENESS,
    "rate_state": RATE_STATE,
}
_BUCKET_FILE = re.compile(r"-k(?P<n>\d+)b(?P<b>\d+)-")
# A rate state file of the series bucketing: ``s`` holds its bucket's series keyed by an
# index key, ``u`` the rows it owns of series still keyed by an object id (every rate
# task reads all ``u`` files: a rekey can move such a row to another bucket).
_SERIES_FILE = re.compile(r"-k(?P<n>\d+)(?P<kind>[su])(?P<b>\d+)-")


def bucket_of(agent: str | None, buckets: int) -> int:
    """A stable bucket of an agent id: the same in every process and run (Python's
    ``hash`` is salted per process), and spread even for ids that differ in one
    character such as AM2's ``1.1``, ``1.2``, ``1.3`` (crc32 put those in one of three)."""
    digest = hashlib.blake2b((agent or "").encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % buckets


def bucket_column(agents: pl.Series, buckets: int) -> pl.Series:
    """``bucket_of`` for a column of agent ids (hashed once per distinct agent)."""
    uniq = agents.unique()
    table = pl.DataFrame(
        {"a": uniq, "b": [bucket_of(a, buckets) for a in uniq.to_list()]},
        schema={"a": agents.dtype, "b": pl.Int32},
    )
    joined = agents.to_frame("a").join(table, on="a", how="left", nulls_equal=True, maintain_order="left")
    return joined["b"]


def input_agent(batch: pl.DataFrame, rules: LivenessRules) -> pl.Series:
    """The agent each gold input row belongs to: its own, or for a v1 heartbeat (which
    carries none) ``rules.v1_agent``, as ``heartbeat_rows`` assigns it."""
    v1_beat = (pl.col("source") == "heartbeat") & (pl.col("dialect") != "V2")
    return batch.select(
        pl.coalesce(pl.col("agent"), pl.when(v1_beat).then(pl.lit(rules.v1_agent)))
    ).to_series()


def bucket_file_name(buckets: int, bucket: int) -> str:
    """A data file of a bucket of agents, after its stage's prefix (``delta.staged_file``)."""
    return f"k{buckets}b{bucket}-{uuid.uuid4().hex}.parquet"


def series_file_name(buckets: int, bucket: int, *, keyed: bool) -> str:
    """A data file of a bucket of series (``s``) or of unkeyed rows (``u``), after its
    stage's prefix."""
    kind = "s" if keyed else "u"
    return f"k{buckets}{kind}{bucket}-{uuid.uuid4().hex}.parquet"


def series_file(name: str, buckets: int) -> tuple[str, int] | None:
    """(``s`` or ``u``, bucket) of a rate state file of this series bucketing, else None."""
    m = _SERIES_FILE.search(os.path.basename(name))
    if m is None or int(m["n"]) != buckets:
        return None
    return m["kind"], int(m["b"])


def file_bucket(name: str, buckets: int) -> int | None:
    """The bucket a data file holds (its name says, for this bucket count), else None."""
    m = _BUCKET_FILE.search(os.path.basename(name))
    if m is None or int(m["n"]) != buckets:
        return None
    return int(m["b"])


def claim_bucket(folder: str, task: int, buckets: int, prefer: Iterable[int] = ()) -> int:
    """The bucket task ``task`` (its partition: one task per bucket) computes: the first
    of ``prefer`` (the buckets whose tables this worker keeps, ``Kept.buckets``), then its
    own, then any, that no other task of the job claimed. Why: Spark gives a task
    whichever idle Python worker comes first, so with fixed buckets a bucket's next task
    found its tables in that worker's memory half of the time on two cores; a task that
    picks its bucket finds them (each result depends only on its bucket and the plan).

    A claim is a file ``<folder>/b<bucket>`` holding the task, made whole by a hard link
    (taken or not, never half written); a retried or speculative attempt of a task takes
    the bucket its task claimed. One task per bucket, so none is left without one."""
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(folder):
        if name.startswith("b") and name[1:].isdigit():
            with open(os.path.join(folder, name)) as f:
                if f.read() == str(task):
                    return int(name[1:])
    tmp = os.path.join(folder, f".t{task}-{uuid.uuid4().hex}")
    with open(tmp, "w") as f:
        f.write(str(task))
    try:
        order: dict[int, None] = dict.fromkeys([*prefer, task, *range(buckets)])
        for b in order:
            if not 0 <= b < buckets:
                continue
            try:
                os.link(tmp, os.path.join(folder, f"b{b}"))
            except FileExistsError:
                continue
            return b
    finally:
        os.remove(tmp)
    raise RuntimeError(f"task {task}: all {buckets} buckets claimed (one task per bucket)")


# ---------------------------------------------------------------- the plan


@dataclass(frozen=True)
class GoldPlan:
    """What the tasks of one batch need (plain values: pickled to the executors)."""

    batch_id: int
    buckets: int
    shuffle: str  # folder of the split step's files ("": no split step)
    staging: tuple[tuple[str, str], ...]  # (table, its file-name prefix: ``delta.Stage``)
    rates: RateRules
    liveness: LivenessRules
    registry: bytes = b""  # Arrow IPC of the schema registry
    tables: tuple[tuple[str, bytes], ...] = ()  # (table, pickled (schema, live files))
    now_ns: int = 0
    latest_ns: int = 0
    keep_bytes: int = 0  # what a worker keeps of the tables its tasks wrote (``Kept``)
    # Buckets of series of the rate stage (``rate_compute``); 0: the agent tasks pair the
    # rates themselves (one task per bucket of agents does all).
    rate_buckets: int = 0
    scratch: str = ""  # the batch's scratch folder (bucket claims; the shuffle inside)


@dataclass
class SplitOutput:
    files: list[tuple[int, str, int]] = field(default_factory=list)  # (bucket, path, rows)
    beat_ns: int = 0
    sample_ns: int = 0


@dataclass
class ComputeOutput:
    bucket: int
    files: dict[str, list[delta.DataFileInfo]] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # read, gold (its steps), write
    kept: int = 0  # table files taken from the worker's memory (``KEPT``)
    read: int = 0  # table files read
    # With a rate stage: the identified samples' shuffle files (series bucket, path), and
    # the files of the per-agent facts every rate task reads (activity, keys, gone).
    samples: list[tuple[int, str]] = field(default_factory=list)
    facts: dict[str, str] = field(default_factory=dict)
    # The task's start and end (``time.time()``): the driver's report of its job's
    # launch, straggle and return times (``job_timeline``).
    span: tuple[float, float] = (0.0, 0.0)
    # The maximum of each ``TIME_COLUMNS`` column over the files of the table this task
    # wrote (0: none written, or no value), for tables it writes.
    tops: dict[str, int] = field(default_factory=dict)
    # The (now_ns, latest_ns) an agent task of the direct path took over the whole batch
    # and the plan's table values: the rate stage's plan takes them.
    times: tuple[int, int] = (0, 0)




# ---------------------------------------------------------------- step 1: split


def split(parts: Iterable[pl.DataFrame], plan: GoldPlan, tag: str) -> SplitOutput:
    """Gold input rows -> one Arrow IPC file per bucket in the shuffle folder."""
    taskworker.settle()
    out = SplitOutput()
    by: dict[int, list[pa.Table]] = {}
    for part in parts:
        if part.height == 0:
            continue
        beat, sample = part_times(part, plan.liveness)
        out.beat_ns, out.sample_ns = max(out.beat_ns, beat), max(out.sample_ns, sample)
        b = bucket_column(input_agent(part, plan.liveness), plan.buckets)
        keyed = part.with_columns(b.alias("_bucket"))
        for (bucket,), rows in keyed.group_by("_bucket"):
            by.setdefault(int(bucket), []).append(rows.drop("_bucket").to_arrow())
    for bucket, tables in sorted(by.items()):
        t = pa.concat_tables(tables, promote_options="permissive")
        path = os.path.join(plan.shuffle, f"{tag}-k{plan.buckets}b{bucket}-{uuid.uuid4().hex}.arrow")
        out.files.append((bucket, write_ipc(path, t), t.num_rows))
    return out


def _read_source(source: str, files: Sequence[DataFile]) -> pa.Table:
    """The gold columns of silver files of one source (``sample``, ``heartbeat``)."""
    from pipeline.gold.writer import SOURCE_SCHEMAS, source_columns

    schema = SOURCE_SCHEMAS[source]
    full = arrow_schema_of(schema)
    cols = pa.schema([full.field(c) for c in source_columns(schema)])
    return pa.Table.from_batches([b for f in files for b in read_file(f, cols)], schema=cols)


def read_units(units: Sequence[tuple[str, DataFile]]) -> Iterator[pl.DataFrame]:
    """Silver files of a gold micro-batch (source, file), each as a gold input frame."""
    for source, f in units:
        yield read_batch([(source, f)])


def read_batch(units: Sequence[tuple[str, DataFile]]) -> pl.DataFrame:
    """Silver files of a gold micro-batch (source, file) as one gold input frame: each
    source's files read into one Arrow table, then converted once (a frame per file
    cost a direct-path task ~15% more than its Parquet decode, 2026-12-03)."""
    from pipeline.gold.writer import gold_input_arrow

    by = {src: [f for s, f in units if s == src] for src in ("sample", "heartbeat")}
    return gold_input_arrow(_read_source("sample", by["sample"]), _read_source("heartbeat", by["heartbeat"]))


def arrow_schema_of(schema: pa.Schema) -> pa.Schema:
    from schemas.tables import spark_schema

    return arrow_schema(spark_schema(schema))


# ---------------------------------------------------------------- step 3: compute


class Kept:
    """The table files a Python worker's compute tasks wrote, as the Arrow tables they
    wrote, kept in that worker for the next batch: Spark reuses its Python workers, and a
    bucket's next task that lands on the same worker reads its lifecycles, liveness and
    rate state from memory instead of their files (on one core, every time; on more,
    when the bucket lands where it ran before).

    Kept as written (Arrow), not as polars frames: keeping then costs nothing at the
    write, and a task that takes a file converts it (``frame``), which is what a read of
    the file does after decoding its Parquet: a rate state of 224,000 rows read and cast
    in 0.096 s, converted in 0.015 s (docs/performance-log.md, 2026-12-01). Keeping polars
    frames converted every file written, kept or not taken, and cost the write about
    what the hits saved the read.

    Exact, not a guess: data files are immutable and uniquely named, so a file's path
    says its content. Only files the plan lists as live are read from here; a file that
    was never committed (a failed or replayed batch) is never listed. At each task, a
    table's entries of an earlier batch that are no longer live are dropped (those of
    its own batch are not live yet: the other buckets' tasks of the batch wrote them);
    a task drops the entries it used once it wrote their successors (a retried batch
    reads those files again), so a worker holds about one version of what it wrote.
    Bounded by the plan's ``keep_bytes`` (a table that does not fit is not kept)."""

    def __init__(self) -> None:
        self.tables: dict[str, pa.Table] = {}
        self.batch: dict[str, int] = {}
        self.bytes = 0

    @staticmethod
    def key(path: str) -> str:
        return storage.location(path)

    def get(self, path: str) -> pl.DataFrame | None:
        t = self.tables.get(self.key(path))
        return None if t is None else frame(t)

    def put(self, path: str, table: pa.Table, batch_id: int, limit: int) -> None:
        k = self.key(path)
        self.drop([k])
        if self.bytes + table.nbytes <= limit:
            self.tables[k] = table
            self.batch[k] = batch_id
            self.bytes += table.nbytes

    def retain(self, root: str, live: Iterable[str], batch_id: int) -> None:
        """Drop this table's entries (files under ``root``) of batches before
        ``batch_id`` that are not ``live``."""
        prefix = self.key(root) + "/"
        keep = {self.key(p) for p in live}
        self.drop(
            k for k in list(self.tables)
            if k.startswith(prefix) and k not in keep and self.batch[k] < batch_id
        )  # fmt: skip

    def buckets(self, plan: GoldPlan, series: bool = False) -> list[int]:
        """The buckets of agents (``series``: of series) whose live table files of the
        plan this worker keeps, most kept bytes first (``claim_bucket``'s preference)."""
        import pickle

        held: dict[int, int] = {}
        for name, listing in plan.tables:
            if series and name != "rate_state":
                continue
            for f in pickle.loads(listing)[1]:
                t = self.tables.get(self.key(f.local_path))
                if t is None:
                    continue
                if series:
                    kind = series_file(f.local_path, plan.rate_buckets)
                    b = kind[1] if kind is not None and kind[0] == "s" else None
                else:
                    b = file_bucket(f.local_path, plan.buckets)
                if b is not None:
                    held[b] = held.get(b, 0) + t.nbytes
        return sorted(held, key=lambda b: -held[b])

    def drop(self, paths: Iterable[str]) -> None:
        for k in [self.key(p) for p in paths]:
            t = self.tables.pop(k, None)
            self.batch.pop(k, None)
            if t is not None:
                self.bytes -= t.nbytes

    def clear(self) -> None:
        self.tables.clear()
        self.batch.clear()
        self.bytes = 0


KEPT = Kept()


def _table_rows(
    plan: GoldPlan, name: str, bucket: int, out: ComputeOutput, used: list[str]
) -> pl.DataFrame:
    """This bucket's agents' rows of a gold table as listed in the plan (from ``KEPT``
    where this worker wrote the file: those files are added to ``used``)."""

    def mine(path: str) -> str:
        b = file_bucket(path, plan.buckets)
        return "filter" if b is None else "whole" if b == bucket else "skip"

    def keep(rows: pl.DataFrame) -> pl.DataFrame:
        return rows.filter(bucket_column(rows["agent"], plan.buckets) == bucket)

    return _rows_of(plan, name, out, used, mine, keep)


def _series_state(
    plan: GoldPlan, bucket: int, keys: pl.DataFrame, out: ComputeOutput, used: list[str]
) -> pl.DataFrame:
    """The rate state rows of a bucket of series: its ``s`` files whole; every other file
    (``u`` files, a file of the agent bucketing, of another count or a compaction's) read,
    rekeyed with the batch's ``keys`` (``rekey_state``: a series keyed by an object id
    may now have its index key) and filtered by series bucket."""

    def mine(path: str) -> str:
        f = series_file(path, plan.rate_buckets)
        if f is not None and f[0] == "s":
            return "whole" if f[1] == bucket else "skip"
        return "filter"

    def keep(rows: pl.DataFrame) -> pl.DataFrame:
        rows = rekey_state(rows, keys)
        return rows.filter(series_buckets(rows, plan.rate_buckets) == bucket)

    return _rows_of(plan, "rate_state", out, used, mine, keep)


def _rows_of(
    plan: GoldPlan,
    name: str,
    out: ComputeOutput,
    used: list[str],
    mine: Callable[[str], str],
    keep: Callable[[pl.DataFrame], pl.DataFrame],
) -> pl.DataFrame:
    """Rows of a gold table as listed in the plan: each live file ``mine`` calls
    ``whole`` is taken as it is, from ``KEPT`` where this worker wrote it (then added to
    ``used``); a ``filter`` file (from ``KEPT`` or read) has its rows passed through
    ``keep``."""
    import pickle

    schema, files = pickle.loads(dict(plan.tables)[name])
    KEPT.retain(_table_root(plan, name), [f.local_path for f in files], plan.batch_id)
    pieces = []
    for f in files:
        how = mine(f.local_path)
        if how == "skip":
            continue
        df = KEPT.get(f.local_path)
        if df is not None and how == "whole":
            pieces.append(df)
            out.kept += 1
            used.append(f.local_path)
            continue
        if df is None:
            df = frame(delta.read_data_file(f, schema).cast(schema))
            out.read += 1
        if how == "filter" and df.height:
            df = keep(df)
        pieces.append(df)
    if not pieces:
        return frame(schema.empty_table())
    return pieces[0] if len(pieces) == 1 else pl.concat(pieces, how="vertical_relaxed")


def _table_root(plan: GoldPlan, name: str) -> str:
    return delta.staged_table_root(dict(plan.staging)[name])


def _batch_rows(files: Sequence[str]) -> pl.DataFrame:
    """A bucket's split parts as one gold input frame; none: the empty input."""
    rows = _read_ipc(files)
    return read_batch([]) if rows is None else rows


def part_times(part: pl.DataFrame, rules: LivenessRules) -> tuple[int, int]:
    """The latest heartbeat and sample times of a part of the batch's gold input (0: none)."""
    beats = part.filter(pl.col("source") == "heartbeat")
    samples = part.filter(pl.col("source") == "sample")
    return max_ns(heartbeat_rows(beats, rules)["ts_ns"]), max_ns(samples["update_ns"])


def _bucket_rows(
    units: Sequence[tuple[str, DataFile]], bucket: int, plan: GoldPlan
) -> tuple[pl.DataFrame, GoldPlan]:
    """This bucket's rows of the batch, read from every silver file of the batch (the
    direct path: no split step), and the plan with the batch's two times, taken over
    every file (``part_times``, as the split step takes them)."""
    batch = read_batch(units)
    beat_ns, sample_ns = part_times(batch, plan.liveness)
    timed = replace(plan, now_ns=max(plan.now_ns, beat_ns), latest_ns=max(plan.latest_ns, sample_ns))
    keep = bucket_column(input_agent(batch, plan.liveness), plan.buckets) == bucket
    return batch.filter(keep), timed


def compute(
    bucket: int, plan: GoldPlan, shuffled: Sequence[str] = (),
    direct: Sequence[tuple[str, DataFile]] | None = None,
) -> ComputeOutput:
    """One bucket of agents: its agents' batch rows and table rows -> its files of every
    gold table (with a rate stage, ``plan.rate_buckets``: of lifecycles and liveness, and
    the rate stage's input as shuffle files by bucket of series). The batch rows come
    from the split step's files for the bucket (``shuffled``), or, on the direct path,
    from every silver file of the batch (``direct``), filtered."""
    import time

    taskworker.settle()
    started, t0, c0, k0 = time.time(), time.perf_counter(), time.process_time(), os.times().system
    out = ComputeOutput(bucket)
    used: list[str] = []  # files taken from KEPT: dropped once their successors are written
    lifecycles = _table_rows(plan, "lifecycle_state", bucket, out, used)
    liveness = _table_rows(plan, "agent_liveness", bucket, out, used)
    if direct is None:
        batch = _batch_rows(shuffled)
    else:
        batch, plan = _bucket_rows(direct, bucket, plan)
    out.times = (plan.now_ns, plan.latest_ns)
    t1 = time.perf_counter()
    registry = from_ipc(plan.registry)
    agents = agent_stage(
        batch,
        registry=registry,
        lifecycles=lifecycles,
        liveness=liveness,
        liveness_rules=plan.liveness,
        batch_id=plan.batch_id,
        now_ns=plan.now_ns,
    )
    t_agent = time.perf_counter()
    results = {
        "lifecycle_state": conform(
            upsert_rows(lifecycles, agents.lifecycles, LIFECYCLE_KEYS), LIFECYCLE_STATE
        ),
        "agent_liveness": conform(
            upsert_rows(liveness, agents.liveness, LIVENESS_KEYS), AGENT_LIVENESS
        ),
    }
    out.rows = {
        "input": batch.height, "lifecycles": agents.lifecycles.height,
        "liveness": agents.liveness.height,
    }  # fmt: skip
    if plan.rate_buckets:
        t2 = time.perf_counter()
        _shuffle_rate_input(agents.rate_input, bucket, plan, out)
    else:
        t_state = time.perf_counter()
        state = _table_rows(plan, "rate_state", bucket, out, used)
        t_rate = time.perf_counter()
        rates, new_state = rate_stage(
            agents.rate_input, statistic_defs(registry), state, plan.rates, plan.batch_id,
            plan.latest_ns or None,
        )
        out.seconds.update(state_read=t_rate - t_state, rate_stage=time.perf_counter() - t_rate)
        results["statistic_rates"] = conform(rates, STATISTIC_RATES)
        results["rate_state"] = conform(new_state, RATE_STATE)
        out.rows.update(rates=rates.height, state=new_state.height)
        t2 = time.perf_counter()
    for name, table in results.items():
        _write_result(plan, name, table, bucket_file_name(plan.buckets, bucket), out)
    KEPT.drop(used)
    # "gold" holds "agent_stage", and without a rate stage "state_read" and "rate_stage".
    out.seconds.update(read=t1 - t0, gold=t2 - t1, agent_stage=t_agent - t1,
                       write=time.perf_counter() - t2)  # fmt: skip
    # "sys": the kernel's part of "cpu" (page faults of fresh memory, file I/O).
    out.seconds.update(cpu=time.process_time() - c0, sys=os.times().system - k0)
    out.span = (started, time.time())
    return out


def _write_result(plan: GoldPlan, name: str, table: pa.Table, file_name: str, out: ComputeOutput) -> None:
    """A task's rows of a gold table -> one Parquet file in the table's folder under the
    batch's stage (none when empty), described in ``out``; a state table's frame stays
    in ``KEPT``."""
    if name in TIME_COLUMNS:
        out.tops[name] = max(out.tops.get(name, 0), _column_top(table, TIME_COLUMNS[name]))
    if table.num_rows == 0:
        return
    w = delta.DataFileWriter(delta.staged_file(dict(plan.staging)[name], file_name), table.schema, unique=())
    try:
        w.write(table)
        info = w.close()
    except BaseException:
        w.abort()
        raise
    if info is not None:
        out.files.setdefault(name, []).append(info)
        if name in STATE_TABLES and plan.keep_bytes:
            where = storage.join(_table_root(plan, name), info.name)
            KEPT.put(where, table, plan.batch_id, plan.keep_bytes)


def write_ipc(path: str, t: pa.Table) -> str:
    """A shuffle file: ``t`` as an Arrow IPC file at ``path`` (returned)."""
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, t.schema) as w:
        w.write_table(t)
    return path


def _read_ipc(paths: Sequence[str]) -> pl.DataFrame | None:
    tables = [pa.ipc.open_file(pa.memory_map(p)).read_all() for p in paths]
    if not tables:
        return None
    return frame(pa.concat_tables(tables, promote_options="permissive"))


def _shuffle_rate_input(inp: RateInput, bucket: int, plan: GoldPlan, out: ComputeOutput) -> None:
    """An agent task's rate input -> the shuffle folder: its identified samples, one IPC
    file per bucket of series (``series_buckets``), and its three per-agent facts, one
    file each (every rate task reads all agents' facts; activity is kept to its distinct
    times)."""
    tag = f"a{bucket}-{uuid.uuid4().hex}"
    if inp.samples.height:
        b = series_buckets(inp.samples, plan.rate_buckets)
        keyed = inp.samples.with_columns(b.alias("_sb"))
        for (sb,), rows in keyed.group_by("_sb"):
            path = os.path.join(plan.shuffle, f"samples-{tag}-s{sb}.arrow")
            out.samples.append((int(sb), write_ipc(path, rows.drop("_sb").to_arrow())))
    facts = {"activity": inp.activity.unique(), "keys": inp.keys, "gone": inp.gone}
    for name, df in facts.items():
        out.facts[name] = write_ipc(os.path.join(plan.shuffle, f"{name}-{tag}.arrow"), df.to_arrow())


def rate_compute(
    bucket: int, plan: GoldPlan, samples: Sequence[str], facts: Sequence[dict[str, str]]
) -> ComputeOutput:
    """One bucket of series: its samples (``samples``: the agent tasks' shuffle files for
    it), every agent's facts, and its rate state -> its rates and its new rate state
    (``s`` file: series keyed by an index key; ``u`` file: those still keyed by an
    object id, which every rate task of the next batch reads)."""
    import time

    taskworker.settle()
    started, t0, c0, k0 = time.time(), time.perf_counter(), time.process_time(), os.times().system
    out = ComputeOutput(bucket)
    used: list[str] = []
    empty = empty_rate_input()

    def read(paths: Sequence[str], default: pl.DataFrame) -> pl.DataFrame:
        df = _read_ipc(paths)
        return default if df is None else df

    inp = RateInput(
        samples=read(samples, empty.samples),
        activity=read([f["activity"] for f in facts], empty.activity),
        keys=read([f["keys"] for f in facts], empty.keys),
        gone=read([f["gone"] for f in facts], empty.gone),
    )
    state = _series_state(plan, bucket, inp.keys, out, used)
    t1 = time.perf_counter()
    defs = statistic_defs(from_ipc(plan.registry))
    rates, new_state = rate_stage(inp, defs, state, plan.rates, plan.batch_id, plan.latest_ns or None)
    t2 = time.perf_counter()
    out.rows = {"rates": rates.height, "state": new_state.height}
    _write_result(plan, "statistic_rates", conform(rates, STATISTIC_RATES),
                  series_file_name(plan.rate_buckets, bucket, keyed=True), out)  # fmt: skip
    keyed = new_state["index_key"].is_not_null()
    for is_keyed, rows in ((True, new_state.filter(keyed)), (False, new_state.filter(~keyed))):
        name = series_file_name(plan.rate_buckets, bucket, keyed=is_keyed)
        _write_result(plan, "rate_state", conform(rows, RATE_STATE), name, out)
    KEPT.drop(used)
    out.seconds = {"rate_read": t1 - t0, "rate": t2 - t1, "rate_write": time.perf_counter() - t2,
                   "cpu": time.process_time() - c0, "sys": os.times().system - k0}  # fmt: skip
    out.span = (started, time.time())
    return out


def claims_folder(plan: GoldPlan, stage: str) -> str:
    """Where the tasks of a stage (``agents``, ``series``) of the plan's batch claim their
    buckets: inside the plan's scratch folder, which goes with the plan."""
    return os.path.join(plan.scratch, f"_claims-{stage}")


def compute_claimed(
    task: int, plan: GoldPlan, shuffled: dict[int, list[str]] | None = None,
    direct: Sequence[tuple[str, DataFile]] | None = None,
) -> ComputeOutput:
    """``compute`` of the bucket of agents this task claims (``claim_bucket``): its
    shuffle files from ``shuffled`` (by bucket), or on the direct path the batch's files."""
    bucket = claim_bucket(claims_folder(plan, "agents"), task, plan.buckets, KEPT.buckets(plan))
    return compute(bucket, plan, shuffled=(shuffled or {}).get(bucket, []), direct=direct)


def rate_compute_claimed(
    task: int, plan: GoldPlan, samples: dict[int, list[str]], facts: Sequence[dict[str, str]]
) -> ComputeOutput:
    """``rate_compute`` of the bucket of series this task claims (``claim_bucket``)."""
    prefer = KEPT.buckets(plan, series=True)
    bucket = claim_bucket(claims_folder(plan, "series"), task, plan.rate_buckets, prefer)
    return rate_compute(bucket, plan, samples.get(bucket, []), facts)


# ---------------------------------------------------------------- driver side


def split_units(
    files: Sequence[Sequence[DataFile]], parallelism: int
) -> list[list[tuple[str, DataFile]]]:
    """The batch's silver files (samples, heartbeats) spread over about ``2 x parallelism``
    split tasks of similar size (largest first, each to the lightest task)."""
    tagged = [
        (src, f) for src, fs in zip(("sample", "heartbeat"), files, strict=True) for f in fs
    ]
    if not tagged:
        return []
    n = max(1, min(len(tagged), 2 * parallelism))
    units: list[list[tuple[str, DataFile]]] = [[] for _ in range(n)]
    weight = [0] * n
    for src, f in sorted(tagged, key=lambda t: -t[1].size):
        i = weight.index(min(weight))
        units[i].append((src, f))
        weight[i] += max(f.size, 1)
    return [u for u in units if u]


def run_split_units(
    spark: SparkSession, units: Sequence[Sequence[tuple[str, DataFile]]], plan: GoldPlan
) -> list[SplitOutput]:
    if not units:
        return []
    rdd = spark.sparkContext.parallelize([list(u) for u in units], len(units))
    return list(rdd.map(lambda u: split(read_units(u), plan, uuid.uuid4().hex[:8])).collect())


def run_split_dataframe(df: DataFrame, plan: GoldPlan) -> list[SplitOutput]:
    """The split step over a DataFrame of gold input (a query's first batch, batch mode)."""
    import pickle

    from pyspark.sql.types import BinaryType, StructField, StructType

    def mapper(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        parts = (frame(pa.Table.from_batches([b])) for b in batches)
        out = split(parts, plan, uuid.uuid4().hex[:8])
        yield pa.RecordBatch.from_pydict(
            {"output": [pickle.dumps(out)]}, schema=pa.schema([("output", pa.binary())])
        )

    schema = StructType([StructField("output", BinaryType())])
    return [pickle.loads(r["output"]) for r in df.mapInArrow(mapper, schema).collect()]


def run_compute(
    spark: SparkSession, splits: Sequence[SplitOutput], plan: GoldPlan
) -> list[ComputeOutput]:
    """One task per bucket (every bucket, even one without rows in this batch: its
    agents' liveness is judged at ``now_ns`` and its state ages all the same)."""
    by: dict[int, list[str]] = {b: [] for b in range(plan.buckets)}
    for s in splits:
        for bucket, path, _rows in s.files:
            by[bucket].append(path)
    rdd = spark.sparkContext.parallelize(range(plan.buckets), plan.buckets)
    return list(rdd.map(lambda t: compute_claimed(t, plan, shuffled=by)).collect())


def run_rates(
    spark: SparkSession, outs: Sequence[ComputeOutput], plan: GoldPlan
) -> list[ComputeOutput]:
    """The rate stage: one task per bucket of series (every bucket: its state ages even
    without samples), reading the agent tasks' shuffle files."""
    by: dict[int, list[str]] = {b: [] for b in range(plan.rate_buckets)}
    for o in outs:
        for b, path in o.samples:
            by[b].append(path)
    facts = [o.facts for o in outs if o.facts]
    rdd = spark.sparkContext.parallelize(range(plan.rate_buckets), plan.rate_buckets)
    return list(rdd.map(lambda t: rate_compute_claimed(t, plan, by, facts)).collect())


def run_compute_direct(
    spark: SparkSession, files: Sequence[Sequence[DataFile]], plan: GoldPlan
) -> list[ComputeOutput]:
    """The direct path: one task per bucket, each reading every silver file of the batch
    and keeping its bucket's rows. With few buckets, reading the batch that many times
    costs less than the split step's Spark job, its shuffle files and their read."""
    units = [
        (src, f) for src, fs in zip(("sample", "heartbeat"), files, strict=True) for f in fs
    ]
    rdd = spark.sparkContext.parallelize(range(plan.buckets), plan.buckets)
    return list(rdd.map(lambda t: compute_claimed(t, plan, direct=units)).collect())


def timed_by(plan: GoldPlan, outs: Sequence[ComputeOutput]) -> GoldPlan:
    """The plan with the two times the direct path's agent tasks took over the batch
    (``ComputeOutput.times``, the same in every task): the rate stage's plan."""
    return replace(
        plan,
        now_ns=max([plan.now_ns, *(o.times[0] for o in outs)]),
        latest_ns=max([plan.latest_ns, *(o.times[1] for o in outs)]),
    )


def job_timeline(outs: Sequence[ComputeOutput], submitted: float, returned: float) -> dict[str, float]:
    """Where a compute job's wall time went besides its longest task (``time.time()``
    of the job's submission and return): ``launch``, until its first task started;
    ``skew``, from the first task's start to the last's; ``straggle``, from the first
    task's end to the last's; ``return``, from the last task's end until the driver had
    every result; ``off_cpu``, the tasks' wall time beyond their CPU time, summed (waiting
    for a core or for I/O)."""
    spans = [o.span for o in outs if o.span[1]]
    if not spans:
        return {}
    first_end, last_end = min(e for _s, e in spans), max(e for _s, e in spans)
    first_start = min(s for s, _e in spans)
    return {
        "launch": first_start - submitted,
        "skew": max(s for s, _e in spans) - first_start,
        "straggle": last_end - first_end,
        "return": returned - last_end,
        "off_cpu": sum(o.span[1] - o.span[0] - o.seconds.get("cpu", 0.0) for o in outs if o.span[1]),
    }


def table_listing(path: str) -> tuple[bytes, int]:
    """A gold table's schema and live files, pickled for the plan, and its version."""
    import pickle

    version, schema, files = delta.snapshot_files(path)
    return pickle.dumps((schema, files)), version


def _column_top(t: pa.Table, column: str) -> int:
    """The largest value of an ns column of ``t`` (0: no rows, or all null)."""
    v = pc.max(t.column(column)).as_py() if t.num_rows else None
    return 0 if v is None else int(v)


def column_max(path: str, column: str) -> int:
    """The latest value of an ns column of a table (one column read; 0 if empty)."""
    _v, schema, files = delta.snapshot_files(path)
    return max((_column_top(delta.read_data_file(f, schema, [column]), column) for f in files), default=0)


def output_tops(outs: Sequence[ComputeOutput]) -> dict[str, int]:
    """Each ``TIME_COLUMNS`` table's maximum over the files a batch's tasks wrote: the
    whole table once they are committed (the tasks rewrite it all), for the tables
    every task that wrote one reported (a table no task wrote is left out)."""
    out: dict[str, int] = {}
    for name in TIME_COLUMNS:
        tops = [o.tops[name] for o in outs if name in o.tops]
        if tops:
            out[name] = max(tops)
    return out
