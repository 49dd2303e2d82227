"""The gold job: silver samples and heartbeats -> rates, lifecycles, liveness, exactly once.

One query reads two silver tables (``object_samples`` and ``heartbeats``,
each with Delta's streaming source) as one stream (``gold_input``: both
projected onto one schema with a ``source`` column), so one checkpoint and one
batch id cover both. A streaming micro-batch is read on the driver with pyarrow
from the files of its plan (``batch_on_driver``, ``pipeline.lake.files``); batch
mode is collected from Spark as Arrow (one Spark job). Either way the batch is computed on the driver in polars
(``pipeline.gold.transforms.gold_batch``; why: docs/DESIGN.md, Gold):

1. agent liveness: heartbeats continue each agent's open up interval
   (``agent_liveness``), judged at the latest heartbeat time seen;
2. object lifecycles: the batch's samples merged into the existing rows,
   states recomputed (deleted, lost with a restarted or down agent);
3. rates: the batch's statistic values and the state baselines in one
   sequential scan per series (``pair_values``);
4. writes, each carrying the Delta app transaction ``(app_id, batch_id)``:
   rates (append), lifecycles (MERGE of changed rows), liveness (MERGE),
   then the rate state (replaced whole) *last*: a batch whose state commit
   exists is complete and is skipped; any other replay reads the state and
   tables as they were before it (a table already holding the batch skips
   its write), so it recomputes the same rows.

Batch mode (``run_gold_batch``) runs the same writer over a time range of the
silver tables as one batch: the same rows as the stream over the same data.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING

import polars as pl
import pyarrow as pa

from pipeline.bronze.writer import checkpoint_query_id
from pipeline.gold.fold import fold_lifecycles
from pipeline.gold.transforms import (
    LIFECYCLE_KEYS,
    V1_AGENT,
    LivenessRules,
    RateRules,
    conform,
    fleet_agent,
    frame,
    gold_batch,
    upsert_rows,
)
from pipeline.lake import delta, storage, transaction
from pipeline.lake.files import DataFile, read_files
from pipeline.lake.files import batch_files as plan_files
from pipeline.runtime.ipc import to_ipc
from pipeline.runtime.streaming import (
    await_query,
    refuse_old_checkpoint,
    start_gated,
    trigger_kwargs,
)
from schemas.gold import (
    AGENT_LIVENESS,
    GOLD_TABLES,
    LIFECYCLE_STATE,
    OBJECT_LIFECYCLES,
    RATE_STATE,
    STATISTIC_RATES,
)
from schemas.silver import HEARTBEATS, OBJECT_SAMPLES
from schemas.tables import DEFAULT_BROKER

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from pipeline.gold import tasks as gt
    from pipeline.lake.maintain import JobMaintenance

log = logging.getLogger(__name__)

# Columns of the gold input stream: what gold needs of samples and heartbeats.
SAMPLE_COLS = (
    "partition", "offset", "record_index", "broker_name", "dialect", "agent", "package", "class_name", "schema_hash", "update_ns", "create_ns",
    "delete_ns", "boot_seq", "bank", "flags", "epoch", "broker_bank", "agent_bank", "object_num",
    "object_name", "index_key", "ints", "floats", "texts",
)  # fmt: skip
BEAT_COLS = ("timestamp_ns", "attributes")
DEFAULT_MAX_BYTES_PER_TRIGGER = 3 << 20  # of silver files per source: ~115,000 samples (~26 bytes each)
LIVENESS_KEYS = ("agent", "up_start_ns")
# The task path's commits, in order: the rate state last (a batch's completion mark).
ORDER = ("statistic_rates", "lifecycle_state", "object_lifecycles", "agent_liveness", "rate_state")
# ... as groups whose tables are committed at once (``transaction.concurrently``): the
# fold (``object_lifecycles``) is made from the tasks' ``lifecycle_state`` files before
# they are committed (the whole new state: each bucket writes all of its rows), so it
# commits beside them; the rate state ends.
COMMIT_GROUPS = (
    ("statistic_rates", "lifecycle_state", "object_lifecycles", "agent_liveness"),
    ("rate_state",),
)
COMPUTE_MODES = ("auto", "tasks", "driver")
# The two silver tables of the gold input, in the offset log's order.
SOURCE_SCHEMAS = {"sample": OBJECT_SAMPLES, "heartbeat": HEARTBEATS}


@dataclass(frozen=True)
class GoldSettings:
    """What a gold run needs. Silver tables under ``silver``, gold tables under ``root``."""

    silver: str
    root: str
    checkpoint: str = ""
    registry: str | None = None
    trigger: str = "availableNow"
    max_files_per_trigger: int | None = None
    # Silver file bytes per micro-batch and source (Delta's ``maxBytesPerTrigger``): a
    # batch is read into the driver, so a backlog (gold restarted, or behind) must not
    # arrive as one batch.
    max_bytes_per_trigger: int | None = DEFAULT_MAX_BYTES_PER_TRIGGER
    # Delta's ``startingVersion`` per silver table (``object_samples``, ``heartbeats``) of
    # a new checkpoint's stream (absent: the table as of the start, then its commits).
    starting_versions: dict[str, int] = field(default_factory=dict)
    rates: RateRules = field(default_factory=RateRules)
    liveness: LivenessRules = field(default_factory=LivenessRules)
    query_name: str = "qmf_gold"
    # ``--maintain-every``: the job maintains its tables between its micro-batches.
    maintenance: JobMaintenance | None = None
    # Read a streaming batch's silver files on the driver (pyarrow) rather than
    # collecting it through Spark: same rows, no task, no Arrow-to-row round trip.
    read_on_driver: bool = True
    # Where a batch is computed: "tasks" (Spark tasks per bucket of agents, the driver
    # commits: pipeline.gold.tasks), "driver" (polars in the driver process), or "auto"
    # (the driver up to ``driver_max_bytes`` of silver files per batch, tasks above or
    # when the batch's files are not known).
    compute_on: str = "auto"
    driver_max_bytes: int = 4 << 20
    # Buckets of agents on the task path (default: Spark's default parallelism).
    buckets: int | None = None
    # Task path: buckets of series of the rate stage, which pairs the rates apart from
    # the agent tasks, so one big agent's rates spread over tasks too (0: no rate stage,
    # each agent task pairs its own agents'). None (auto): as many as buckets of agents
    # when the last batch's agents were uneven over their buckets (``rate_stage_after``),
    # else none: with agents even, the stage's shuffle costs more than it spreads.
    rate_buckets: int | None = None
    # Task path: what a compute task wrote (its bucket's lifecycles, liveness and rate
    # state) stays in its Python worker, up to this many MiB, so the next batch's task
    # there reads those tables from memory instead of their files (0: always read).
    keep_mib: int = 512
    # Task path: the folder of a batch's intermediate files (bucket claims, the shuffle
    # by bucket), which every executor reads and writes. None: inside the rates table
    # (``_scratch``), on local or NFS tables; gold tables on an object store need one:
    # a folder all executors share (NFS), or a local one with a local master.
    scratch: str | None = None

    def __post_init__(self) -> None:
        storage.require_local(scratch=self.scratch)
        if self.scratch is None and storage.is_object_store(self.root):
            raise ValueError(
                f"root {self.root!r} is on an object store: gold's tasks need a scratch folder"
                " (--scratch: one every executor shares, such as an NFS mount, or a local one"
                " with a local master)"
            )
        trigger_kwargs(self.trigger)
        if self.compute_on not in COMPUTE_MODES:
            raise ValueError(
                f"compute_on {self.compute_on!r}: expected one of {', '.join(COMPUTE_MODES)}"
            )
        if self.buckets is not None and self.buckets < 1:
            raise ValueError(f"buckets {self.buckets}: must be >= 1")
        if self.rate_buckets is not None and self.rate_buckets < 0:
            raise ValueError(f"rate_buckets {self.rate_buckets}: must be >= 0 (0: no rate stage)")
        if self.keep_mib < 0:
            raise ValueError(f"keep_mib {self.keep_mib}: must be >= 0")

    def source_options(self, name: str) -> dict[str, str]:
        """Options of Delta's streaming read of silver table ``name``: admission control,
        and ``skipChangeCommits`` (commits that delete or rewrite rows, i.e. retention
        and a backfill's replace, are not read again: gold counts each sample once)."""
        out: dict[str, str] = {"skipChangeCommits": "true"}
        if self.max_files_per_trigger is not None:
            out["maxFilesPerTrigger"] = str(self.max_files_per_trigger)
        if self.max_bytes_per_trigger is not None:
            out["maxBytesPerTrigger"] = str(self.max_bytes_per_trigger)
        if name in self.starting_versions:
            out["startingVersion"] = str(self.starting_versions[name])
        return out

    def path(self, name: str) -> str:
        return storage.join(self.root, name)

    def silver_path(self, name: str) -> str:
        if name == "schema_registry" and self.registry is not None:
            return self.registry
        return storage.join(self.silver, name)

    def scratch_root(self) -> str:
        """Where the task path's scratch folders go (``delta.scratch_dir``)."""
        return self.scratch if self.scratch is not None else self.path("statistic_rates")


def ensure_tables(settings: GoldSettings) -> None:
    """Create the gold tables that do not exist yet. A lake from before the fold has its
    per-agent lifecycle rows in ``object_lifecycles``: that table becomes
    ``lifecycle_state`` (a folder rename; Delta's log paths are relative) and the fold
    is made from it, so no lifecycle is lost."""
    old, state = settings.path("object_lifecycles"), settings.path("lifecycle_state")
    if (
        not storage.is_object_store(old)  # a lake before the fold was never on a store
        and not delta.table_exists(state)
        and delta.table_exists(old)
        and "reporters" not in delta.table_schema(old).names
    ):
        os.rename(old, state)
        log.info("gold: %s holds per-agent lifecycles: renamed to %s", old, state)
        delta.create_table(old, OBJECT_LIFECYCLES, name="object_lifecycles")
        replace_fold(settings.root, app_id="qmf-gold-fold", batch_id=0)
    for name, schema in GOLD_TABLES.items():
        delta.create_table(settings.path(name), schema, name=name)


def replace_fold(
    root: str, *, app_id: str, batch_id: int, state: pl.DataFrame | None = None
) -> delta.CommitResult:
    """``root``'s ``object_lifecycles`` replaced whole by the fold of its lifecycle state
    (``state``, or the ``lifecycle_state`` table as committed), exactly once: a replay
    that finds ``(app_id, batch_id)`` committed skips it before folding anything."""
    path = storage.join(root, "object_lifecycles")
    if delta.committed_batch(path, app_id) == batch_id:
        return delta.CommitResult(skipped=True, version=None)
    if state is None:
        state = frame(delta.read_arrow(storage.join(root, "lifecycle_state")))
    folded = conform(fold_lifecycles(state), OBJECT_LIFECYCLES)
    return delta.replace_arrow(folded, path, app_id=app_id, batch_id=batch_id)


def staged_state(files: Sequence[delta.DataFileInfo]) -> pl.DataFrame:
    """The lifecycle state the tasks wrote for a batch (its files, not committed yet)."""
    tables = [storage.parquet_file(f.location).read().cast(LIFECYCLE_STATE) for f in files]
    return frame(pa.concat_tables(tables) if tables else LIFECYCLE_STATE.empty_table())


def gold_input(samples: DataFrame, heartbeats: DataFrame) -> DataFrame:
    """Samples and heartbeats (silver rows, streaming or not) as one DataFrame with ``source``."""
    from pyspark.sql import functions as F

    from schemas.tables import spark_schema

    types = {f.name: f.dataType for f in spark_schema(OBJECT_SAMPLES).fields}
    types.update({f.name: f.dataType for f in spark_schema(HEARTBEATS).fields})
    cols = (*SAMPLE_COLS, *BEAT_COLS)

    def project(df: DataFrame, source: str) -> DataFrame:
        return df.select(
            F.lit(source).alias("source"),
            *[
                F.col(c) if c in df.columns else F.lit(None).cast(types[c]).alias(c)
                for c in cols
            ],
        )

    both = project(samples, "sample").unionByName(project(heartbeats, "heartbeat"))
    # transforms.fleet_agent, in Spark's terms: the same ids on either path.
    name = F.col("broker_name")
    named = name.isNotNull() & (name != DEFAULT_BROKER)
    v1_beat = (F.col("source") == "heartbeat") & (F.col("dialect") != "V2")
    own = F.coalesce(F.col("agent"), F.when(v1_beat, F.lit(V1_AGENT)))
    agent = F.when(named & own.isNotNull(), F.concat_ws("/", name, own)).otherwise(F.col("agent"))
    return both.withColumn("agent", agent)


def source_columns(schema: pa.Schema) -> list[str]:
    """The columns of a silver table that gold reads."""
    return [c for c in (*SAMPLE_COLS, *BEAT_COLS) if c in schema.names]


def gold_input_arrow(samples: pa.Table, heartbeats: pa.Table) -> pl.DataFrame:
    """``gold_input`` for Arrow tables read on the driver: the same columns and types."""
    types = {f.name: f.type for t in (heartbeats, samples) for f in t.schema}
    parts = []
    for table, source in ((samples, "sample"), (heartbeats, "heartbeat")):
        n = table.num_rows
        arrays = [pa.repeat(pa.scalar(source, pa.string()), n)] + [
            table.column(c) if c in table.column_names else pa.nulls(n, types[c])
            for c in (*SAMPLE_COLS, *BEAT_COLS)
        ]
        parts.append(pa.Table.from_arrays(arrays, names=["source", *SAMPLE_COLS, *BEAT_COLS]))
    return frame(pa.concat_tables(parts)).with_columns(fleet_agent().alias("agent"))


def batch_on_driver(settings: GoldSettings, files: list[list[DataFile]] | None) -> pl.DataFrame | None:
    """A micro-batch of the gold stream read on the driver with pyarrow from its silver
    files (``batch_files``: samples, then heartbeats); None when they are not known
    or ``read_on_driver`` is off (then Spark collects it)."""
    from schemas.tables import spark_schema

    if not settings.read_on_driver or files is None:
        return None
    tables = [
        read_files(fs, spark_schema(schema), source_columns(schema))
        for fs, schema in zip(files, (OBJECT_SAMPLES, HEARTBEATS), strict=True)
    ]
    return gold_input_arrow(*tables)


@dataclass
class GoldReport:
    batch_id: int
    rows: dict[str, int] = field(default_factory=dict)
    committed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    compute_on: str = "driver"
    tasks: int = 0  # compute tasks (buckets) of the task path
    # The task path's steps (plan, split, times, compute, commit; and the compute
    # tasks' own read / gold_batch / write, summed over tasks), seconds.
    steps: dict[str, float] = field(default_factory=dict)


def batch_files(settings: GoldSettings, df: DataFrame) -> list[list[DataFile]] | None:
    """The silver files (samples, heartbeats) of ``df``, a micro-batch of the gold stream,
    from its plan (``pipeline.lake.files.batch_files``); None in batch mode."""
    return plan_files(
        df, [settings.silver_path("object_samples"), settings.silver_path("heartbeats")]
    )


# Auto rate stage: on when the last batch's largest bucket of agents held this many times
# its fair share of the input rows (1.5: on 2 buckets, 75% of the rows in one).
UNEVEN_BUCKETS = 1.5


def rate_stage_after(bucket_rows: dict[int, int], buckets: int) -> bool:
    """Whether a batch runs the rate stage (``rate_buckets`` auto), judged by the input
    rows per bucket of agents of the batch before (``bucket_rows``; none known: no stage).
    Uneven buckets mean one agent task does most of the work, and the rate stage spreads
    its rates; with even buckets the agent tasks already use every core."""
    total = sum(bucket_rows.values())
    if buckets < 2 or total == 0:
        return False
    return max(bucket_rows.values()) >= UNEVEN_BUCKETS * total / buckets


class GoldBatchWriter:
    """The ``foreachBatch`` function: one batch of gold input -> every gold table, exactly once.

    The batch is read on the driver from the offset log's positions (else
    collected from Spark as Arrow), computed on the driver
    (``pipeline.gold.transforms.gold_batch``) and committed with delta-rs.
    The gold tables are read at the start of every
    batch, so a replay, a backfill or a compaction in between is seen.
    """

    def __init__(self, settings: GoldSettings, app_id: str | None = None) -> None:
        self.settings = settings
        self._app_id = app_id
        ensure_tables(settings)
        self.reports: list[GoldReport] = []
        # Input rows per bucket of agents of the last task-path batch (auto rate stage).
        self.bucket_rows: dict[int, int] = {}
        # What this writer knows of tables as of one commit, used while that commit is
        # the table's latest (``delta.is_latest``): the latest time of each
        # ``TIME_COLUMNS`` table its tasks wrote, and the registry's Arrow IPC.
        self._tops: dict[str, tuple[delta.CommitStamp, int]] = {}
        self._registry: tuple[delta.CommitStamp, bytes] | None = None
        # The rate state's commit of this writer's last batch, and that batch id: while it
        # is the table's latest, it is the last batch committed (``_done``).
        self._last: tuple[delta.CommitStamp, int] | None = None
        # The stages of the task path's batch in flight (``plan_tasks`` to ``drop_plan``).
        self._stages: delta.Stages | None = None

    @property
    def app_id(self) -> str:
        if self._app_id is None:
            self._app_id = f"qmf-gold-{checkpoint_query_id(self.settings.checkpoint)}"
        return self._app_id

    def write_state(self, state: pa.Table, batch_id: int) -> bool:
        """The batch's last write: once it is committed, the batch is complete."""
        path = self.settings.path("rate_state")
        return not delta.replace_arrow(state, path, app_id=self.app_id, batch_id=batch_id).skipped

    def write_fold(self, state: pl.DataFrame | None, batch_id: int) -> delta.CommitResult:
        """The batch's ``object_lifecycles`` (``replace_fold``)."""
        return replace_fold(self.settings.root, app_id=self.app_id, batch_id=batch_id, state=state)

    def write_state_files(self, files: list[delta.DataFileInfo], batch_id: int) -> delta.CommitResult:
        """The task path's last write: the buckets' state files replace the state."""
        path = self.settings.path("rate_state")
        return delta.commit_staged(path, files, app_id=self.app_id, batch_id=batch_id, replace=True)

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        if self._done(batch_id):
            return
        t0 = time.perf_counter()
        s = self.settings
        files = batch_files(s, df)
        mode = s.compute_on
        if mode == "auto":
            size = None if files is None else sum(f.size for fs in files for f in fs)
            mode = "driver" if size is not None and size <= s.driver_max_bytes else "tasks"
        if mode == "tasks":
            report = self.write_tasks(df, files, batch_id)
        else:
            batch = batch_on_driver(s, files)
            if batch is None:
                batch = frame(df.toArrow())
            report = self.write(batch, batch_id)
        report.seconds = time.perf_counter() - t0  # with the batch's read

    def write_tasks(
        self, df: DataFrame, files: list[list[DataFile]] | None, batch_id: int
    ) -> GoldReport:
        """The task path (``pipeline.gold.tasks``): split the batch by bucket of agents
        (with few buckets, each agent task reads the whole batch instead), run each
        bucket's agent stage in a task, then (``rate_buckets``) the rates per bucket of
        series in tasks of their own, and commit every table's files in order."""
        from pipeline.gold import tasks as gt

        t0 = time.perf_counter()
        steps: dict[str, float] = {}

        def step(name: str) -> None:
            steps[name] = time.perf_counter() - t0 - sum(steps.values())

        spark = df.sparkSession
        parallelism = spark.sparkContext.defaultParallelism
        buckets = self.settings.buckets or parallelism
        rate_buckets = self.settings.rate_buckets
        if rate_buckets is None:
            rate_buckets = buckets if rate_stage_after(self.bucket_rows, buckets) else 0
        direct = files is not None and buckets <= gt.DIRECT_MAX_BUCKETS
        plan = self.plan_tasks(batch_id, buckets, rate_buckets, shuffle=not direct or rate_buckets > 0)
        step("plan")
        try:
            splits: list[gt.SplitOutput] = []
            if direct:
                times = (0, 0)  # each agent task takes them over the whole batch it reads
            else:
                if files is not None:
                    splits = gt.run_split_units(spark, gt.split_units(files, parallelism), plan)
                else:
                    splits = gt.run_split_dataframe(df, plan)
                step("split")
                times = (
                    max([x.beat_ns for x in splits], default=0),
                    max([x.sample_ns for x in splits], default=0),
                )
            plan = self.timed_plan(plan, *times)
            step("times")
            submitted = time.time()
            if direct:
                assert files is not None
                outs = gt.run_compute_direct(spark, files, plan)
            else:
                outs = gt.run_compute(spark, splits, plan)
            step("compute")
            timeline = {f"compute_{k}": v for k, v in gt.job_timeline(outs, submitted, time.time()).items()}
            self.bucket_rows = {o.bucket: o.rows.get("input", 0) for o in outs}
            if direct:
                plan = gt.timed_by(plan, outs)
            if plan.rate_buckets:
                submitted = time.time()
                series = gt.run_rates(spark, outs, plan)
                step("rates")
                timeline.update(
                    {f"rates_{k}": v for k, v in gt.job_timeline(series, submitted, time.time()).items()}
                )
                outs += series
        except BaseException:
            self.drop_plan(plan)
            raise
        report = self.commit_tasks(plan, outs)
        step("commit")
        for o in outs:
            for name, secs in o.seconds.items():
                steps[f"task_{name}"] = steps.get(f"task_{name}", 0.0) + secs
        # The jobs' timelines are parts of "compute" and "rates", not steps of their own.
        report.steps = steps | {f"job_{k}": v for k, v in timeline.items()}
        self.reports.append(report)
        log.info("gold batch %d (tasks): %s", batch_id, report)
        return report

    def plan_tasks(
        self, batch_id: int, buckets: int, rate_buckets: int = 0, *, shuffle: bool
    ) -> gt.GoldPlan:
        """The task path's plan of a batch, before its two times are known: the tables'
        stages (``self._stages``, closed by ``drop_plan``), the scratch folder (bucket
        claims, the split step's shuffle), the registry, the gold tables' live files."""
        from pipeline.gold import tasks as gt

        s, aid = self.settings, self.app_id
        # Scratch: hidden inside the rates table (not among the gold root's tables).
        scratch = delta.scratch_dir(s.scratch_root(), f"{aid}-shuffle", batch_id)
        self._stages = stages = delta.Stages(aid, batch_id)
        try:
            return gt.GoldPlan(
                batch_id=batch_id, buckets=buckets, rate_buckets=rate_buckets,
                shuffle=scratch if shuffle else "", scratch=scratch,
                staging=tuple(
                    (name, stages.prefix(s.path(name)))
                    for name in ("statistic_rates", *gt.STATE_TABLES)
                ),
                rates=s.rates, liveness=s.liveness, keep_bytes=s.keep_mib << 20,
                registry=self.registry_ipc(),
                tables=tuple((n, gt.table_listing(s.path(n))[0]) for n in gt.STATE_TABLES),
            )  # fmt: skip
        except BaseException:  # no plan to drop: its stages and scratch go here
            self._stages = None
            try:
                stages.close()
            finally:
                delta.remove_scratch_dir(scratch)
            raise

    def registry_ipc(self) -> bytes:
        """The silver schema registry as Arrow IPC, read again only after it changed."""
        path = self.settings.silver_path("schema_registry")
        if self._registry is not None and delta.is_latest(path, self._registry[0]):
            return self._registry[1]
        stamp = delta.latest_stamp(path)
        if stamp is None:
            return to_ipc(delta.read_arrow(path))
        ipc = to_ipc(delta.read_arrow(path, stamp.version))
        self._registry = (stamp, ipc)
        return ipc

    def table_top(self, name: str) -> int:
        """The latest value of a ``TIME_COLUMNS`` table's time column: what this writer's
        tasks reported when they wrote it, while their commit is the table's latest
        (a replay, a compaction or the driver path since: read from the table)."""
        from pipeline.gold import tasks as gt

        path = self.settings.path(name)
        known = self._tops.get(name)
        if known is not None and delta.is_latest(path, known[0]):
            return known[1]
        return gt.column_max(path, gt.TIME_COLUMNS[name])

    def timed_plan(self, plan: gt.GoldPlan, beat_ns: int, sample_ns: int) -> gt.GoldPlan:
        """The plan with the batch's two times taken over the batch's latest heartbeat and
        sample times and the tables' (``pipeline.gold.tasks``)."""
        return replace(
            plan,
            now_ns=max(beat_ns, self.table_top("agent_liveness")),
            latest_ns=max(sample_ns, self.table_top("rate_state")),
        )

    def drop_plan(self, plan: gt.GoldPlan) -> None:
        """Close the plan's stages and remove its scratch folder (after a failure, or its
        commits)."""
        try:
            if self._stages is not None:
                self._stages.close()
        finally:
            self._stages = None
            if plan.scratch:
                delta.remove_scratch_dir(plan.scratch)

    def commit_tasks(self, plan: gt.GoldPlan, outs: Sequence[gt.ComputeOutput]) -> GoldReport:
        """Commit the compute tasks' files, in order: rates (append), lifecycle state, its
        fold (``object_lifecycles``), liveness, then the rate state last (each replacing
        the table's files), with the app transaction. The plan's folders are removed
        after, whatever happens."""
        from pipeline.gold import tasks as gt

        s, aid, batch_id = self.settings, self.app_id, plan.batch_id
        report = GoldReport(batch_id, compute_on="tasks", tasks=len(outs))
        tops = gt.output_tops(outs)
        # Read before any commit: a replayed lifecycle_state commit deletes its files.
        folding = delta.committed_batch(s.path("object_lifecycles"), aid) != batch_id
        lifecycles = [f for o in outs for f in o.files.get("lifecycle_state", ())]
        state = staged_state(lifecycles) if folding else None

        def commit(name: str) -> Callable[[], delta.CommitResult]:
            tfiles = [f for o in outs for f in o.files.get(name, ())]
            if name == "object_lifecycles":
                if state is None:
                    return lambda: delta.CommitResult(skipped=True, version=None)
                return lambda: self.write_fold(state, batch_id)
            if name == "rate_state":
                return lambda: self.write_state_files(tfiles, batch_id)
            return lambda: delta.commit_staged(
                s.path(name), tfiles, app_id=aid, batch_id=batch_id,
                replace=name != "statistic_rates",
            )  # fmt: skip

        try:
            for group in COMMIT_GROUPS:
                results = transaction.concurrently({name: commit(name) for name in group})
                for name in group:
                    result = results[name]
                    if self._stages is not None:
                        self._stages.done(s.path(name))
                    if not result.skipped:
                        report.committed.append(name)
                    self._tops.pop(name, None)
                    stamp = None if result.skipped or result.version is None else (
                        delta.commit_stamp(s.path(name), result.version)
                    )  # fmt: skip
                    if stamp is not None and name in tops:
                        self._tops[name] = (stamp, tops[name])
                    if name == "rate_state":
                        self._last = None if stamp is None else (stamp, batch_id)
        finally:
            self.drop_plan(plan)
        report.committed = [name for name in ORDER if name in report.committed]
        for o in outs:
            for k, v in o.rows.items():
                report.rows[k] = report.rows.get(k, 0) + v
            report.rows["files_kept"] = report.rows.get("files_kept", 0) + o.kept
            report.rows["files_read"] = report.rows.get("files_read", 0) + o.read
        return report

    def _done(self, batch_id: int) -> bool:
        path = self.settings.path("rate_state")
        if self._last is not None and delta.is_latest(path, self._last[0]):
            done: int | None = self._last[1]  # no commit since ours: saves a table open
        else:
            done = delta.committed_batch(path, self.app_id)
        if done is not None and batch_id <= done:
            log.info("gold batch %d already committed: skipped", batch_id)
            self.reports.append(GoldReport(batch_id))
            return True
        return False

    def write(self, batch: pl.DataFrame, batch_id: int) -> GoldReport:
        """One batch of gold input rows (``gold_input``'s columns) -> every gold table.

        Writes carry the app transaction ``(app_id, batch_id)``; the rate state
        is written last, so a batch whose state commit exists is complete.
        """
        if self._done(batch_id):
            return self.reports[-1]
        t0 = time.perf_counter()
        s = self.settings
        report = GoldReport(batch_id)
        lifecycles = frame(delta.read_arrow(s.path("lifecycle_state")))
        out = gold_batch(
            batch,
            registry=delta.read_arrow(s.silver_path("schema_registry")),
            state=frame(delta.read_arrow(s.path("rate_state"))),
            lifecycles=lifecycles,
            liveness=frame(delta.read_arrow(s.path("agent_liveness"))),
            rate_rules=s.rates,
            liveness_rules=s.liveness,
            batch_id=batch_id,
        )
        aid = self.app_id
        # Four tables, each written from this batch's rows alone (the fold from the state
        # in memory): committed at once; the rate state after them.
        calls: dict[str, Callable[[], delta.CommitResult]] = {
            "statistic_rates": lambda: delta.append_arrow(
                conform(out.rates, STATISTIC_RATES), s.path("statistic_rates"), app_id=aid,
                batch_id=batch_id,
            ),
            "lifecycle_state": lambda: delta.merge_arrow(
                conform(out.lifecycles, LIFECYCLE_STATE), s.path("lifecycle_state"),
                keys=LIFECYCLE_KEYS, app_id=aid, batch_id=batch_id,
            ),
            "agent_liveness": lambda: delta.merge_arrow(
                conform(out.liveness, AGENT_LIVENESS), s.path("agent_liveness"), keys=LIVENESS_KEYS,
                app_id=aid, batch_id=batch_id,
            ),
        }  # fmt: skip
        if out.lifecycles.height:  # no changed row, no change of the fold: it stays
            folded = upsert_rows(lifecycles, out.lifecycles, LIFECYCLE_KEYS)
            calls["object_lifecycles"] = lambda: self.write_fold(folded, batch_id)
        writes = transaction.concurrently(calls)
        report.committed = [k for k in ORDER if k in writes and not writes[k].skipped]
        if self.write_state(conform(out.state, RATE_STATE), batch_id):
            report.committed.append("rate_state")
        report.rows = {
            "input": batch.height, "rates": out.rates.height, "lifecycles": out.lifecycles.height,
            "liveness": out.liveness.height, "state": out.state.height,
        }  # fmt: skip
        report.seconds = time.perf_counter() - t0
        self.reports.append(report)
        log.info("gold batch %d: %s", batch_id, report)
        return report


# ------------------------------------------------------------------ runs


def silver_range(
    spark: SparkSession,
    settings: GoldSettings,
    *,
    sample_time: tuple[datetime, datetime] | None = None,
) -> DataFrame:
    """Gold input from the silver tables, optionally for a sample-time range (inclusive)."""
    from pyspark.sql import functions as F

    samples = delta.read_table(spark, settings.silver_path("object_samples"))
    beats = delta.read_table(spark, settings.silver_path("heartbeats"))
    if sample_time is not None:
        lo, hi = (F.lit(t) for t in sample_time)
        samples = samples.where(F.col("update_time").between(lo, hi))
        beats = beats.where(F.col("heartbeat_time").between(lo, hi))
    return gold_input(samples, beats)


def run_gold_batch(
    spark: SparkSession,
    settings: GoldSettings,
    batch_id: int,
    *,
    app_id: str = "qmf-gold-batch",
    sample_time: tuple[datetime, datetime] | None = None,
    writer: GoldBatchWriter | None = None,
) -> GoldReport:
    """Batch mode (backfill): the silver tables (or a sample-time range) as gold batch
    ``batch_id`` of ``app_id``; the stream's writer, so the same rows."""
    w = writer or GoldBatchWriter(settings, app_id=app_id)
    w(silver_range(spark, settings, sample_time=sample_time), batch_id)
    return w.reports[-1]


def start_gold(
    spark: SparkSession, settings: GoldSettings, writer: GoldBatchWriter | None = None
) -> StreamingQuery:
    """Start the streaming query over silver's samples and heartbeats (Delta's source)."""
    refuse_old_checkpoint(settings.checkpoint, "gold", ["object_samples", "heartbeats"])
    from pipeline.lake.maintain import layer_tables

    writer = writer or GoldBatchWriter(settings)

    def read(name: str) -> DataFrame:
        return (
            spark.readStream.format("delta")
            .options(**settings.source_options(name))
            .load(settings.silver_path(name))
        )

    stream = gold_input(read("object_samples"), read("heartbeats"))
    return start_gated(
        stream,
        writer,
        name=settings.query_name,
        checkpoint=settings.checkpoint,
        trigger=settings.trigger,
        maintenance=settings.maintenance,
        tables=lambda: layer_tables(settings.root),
    )


def run_gold(
    spark: SparkSession,
    settings: GoldSettings,
    timeout_s: float | None,
    stop: threading.Event | None = None,
    writer: GoldBatchWriter | None = None,
) -> int:
    """Run the stream until AvailableNow drained silver, ``timeout_s`` passed, or ``stop``.

    0: ended as intended; 2: AvailableNow did not finish in time; 1: failed.
    """
    query = start_gold(spark, settings, writer)
    return await_query(
        query, "gold", available_now=settings.trigger == "availableNow", timeout_s=timeout_s,
        stop=stop,
    )  # fmt: skip
