"""The silver batch writer: one bronze micro-batch -> every silver table, exactly once.

One micro-batch (``SilverBatchWriter.__call__``), streaming or batch:

1. the registry as it was *before* this batch (``RegistryTable.load``: rows
   first written by this app at this batch id or later are left out), so a
   replayed batch decodes exactly as its first attempt;
2. the row work: on the driver (the batch's bronze files read there and
   decoded by ``pipeline.silver.decode.decode_arrow``), or in Spark tasks
   (``pipeline.silver.tasks``: each task decodes its part and writes its
   Parquet files straight into the tables' folders under the batch's stage
   prefixes (``pipeline.lake.delta.Stage``), returning only their
   descriptions and the few rows step 3 needs); ``decode_on`` chooses,
   ``auto`` by the size of the batch's bronze files;
3. schemas met in the batch decode the batch's messages that were parked for
   want of them (content before its schema, or in another task), and the
   messages parked by earlier batches whose schema is now known (the ``parked``
   table as of before this batch, read by tasks: ``tasks.resolve_task``; the
   driver keeps only what they wait for, ``pipeline.silver.parked``); v1 method
   calls are paired by bucket of (dialect, seq) (``pipeline.silver.methods``: in
   Spark tasks on the task path above ``calls_driver_max_rows``, else here);
4. each non-empty table gets one Delta commit of all its files carrying
   ``(app_id, batch_id)`` (``pipeline.lake.delta.commit_staged``,
   ``append_parquet``; ``method_calls`` replaces its candidate files in the same
   commit): a replay commits nothing twice. ``parked_resolved``
   is written last, so a crash before it leaves the parked messages pending
   and the replay decodes them again into tables that skip the committed batch;
5. the registry gets the new schemas (merge, same app transaction).

Parked messages of a key that has waited longer than ``parked_max_age_s`` are
reported (log warning, ``SilverBatchWriter.stale_parked``: the keys) on every
batch until their schema arrives.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.bronze.writer import checkpoint_query_id
from pipeline.codec.schema import SchemaRegistry
from pipeline.lake import delta, storage
from pipeline.silver import parked
from pipeline.silver.agents import agent_rows, merge_agent_rows
from pipeline.silver.batch import bronze_files, read_bronze
from pipeline.silver.decode import (
    CALL_PARTS_T,
    PARKED_T,
    SEEN_T,
    Decoded,
    decode_arrow,
    decode_parked_again,
    parse_key_text,
    with_batch_schemas,
)
from pipeline.silver.methods import MethodCallTable
from pipeline.silver.registry import SeenSchema, schema_from_row
from pipeline.silver.settings import SilverSettings, ensure_tables
from schemas.silver import SILVER_TABLES

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from pipeline.lake.files import DataFile
    from pipeline.silver.tasks import TaskResults

log = logging.getLogger(__name__)

# Write order: parked_resolved last (see the module docstring).
WRITE_ORDER = (
    "object_samples",
    "events",
    "heartbeats",
    "method_responses",
    "method_calls",
    "agents",
    "quarantine",
    "parked",
    "parked_resolved",
)


# ------------------------------------------------------------------ the writer


def call_buckets(spark: SparkSession | None) -> int:
    """Buckets of (dialect, seq) a batch's call halves are split into: one per core."""
    return 1 if spark is None else max(1, int(spark.sparkContext.defaultParallelism))


@dataclass
class BatchReport:
    """What one micro-batch did (for logs, tests and the benchmark)."""

    batch_id: int
    rows: dict[str, int] = field(default_factory=dict)
    committed: list[str] = field(default_factory=list)
    new_schemas: int = 0
    decode_on: str = "driver"
    tasks: int = 0  # Spark tasks of the task path (0: decoded on the driver)
    resolved: int = 0
    resolved_on: str = ""  # where parked messages were decoded again: "tasks", "driver"
    paired_on: str = ""  # where v1 method calls were paired: "tasks", "driver"
    stale_parked: int = 0
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class _Batch:
    """One batch's work in ``finish``, carried between its steps: the files of each table
    (the tasks', then the parked messages' and the calls' ones), the stages they are
    written under (``delta.Stages``, closed after the batch) and the table locks held
    until the commit."""

    batch_id: int
    report: BatchReport
    staged: TaskResults | None
    spark: SparkSession | None
    files: dict[str, list[delta.DataFileInfo]]
    stages: delta.Stages
    locks: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)


class SilverBatchWriter:
    """The ``foreachBatch`` function: one bronze micro-batch -> every silver table, exactly once."""

    def __init__(self, settings: SilverSettings, app_id: str | None = None) -> None:
        self.settings = settings
        self._app_id = app_id
        self.registry = ensure_tables(settings)
        self.kinds = self.registry.kinds
        self._reg_cache: tuple[tuple[int, int], SchemaRegistry] | None = None
        # State after the last batch this writer finished: (batch id, registry, what
        # parked messages wait for: parked.PENDING). The next batch id starts from it
        # instead of re-reading the tables (this writer is the only one writing them);
        # any other batch id reloads.
        self._after: tuple[int, SchemaRegistry, pa.Table] | None = None
        self._agents_seen: dict[tuple[str, str], datetime] | None = None
        self.calls = MethodCallTable(settings.path("method_calls"), settings.path("object_samples"))
        self.reports: list[BatchReport] = []
        self.stale_parked: pa.Table = parked.PENDING.empty_table()

    @property
    def app_id(self) -> str:
        if self._app_id is None:
            self._app_id = f"qmf-silver-{checkpoint_query_id(self.settings.checkpoint)}"
        return self._app_id

    def _agents_to_write(self, rows: pa.Table) -> pa.Table:
        """Observations of new agents, or of agents last written ``agents_touch_s`` ago or more.

        A commit per batch only to move ``last_seen`` by a second is pure
        fixed cost; ``agents_view`` gives first/last seen to that precision.
        """
        if self._agents_seen is None:
            t = delta.read_arrow(self.settings.path("agents"))
            self._agents_seen = {}
            for a, d, ls in zip(
                *(t.column(c).to_pylist() for c in ("agent", "dialect", "last_seen")), strict=True
            ):
                prev = self._agents_seen.get((a, d))
                self._agents_seen[(a, d)] = ls if prev is None else max(prev, ls)
        keep = []
        for i, (a, d, ls) in enumerate(
            zip(
                *(rows.column(c).to_pylist() for c in ("agent", "dialect", "last_seen")),
                strict=True,
            )
        ):
            prev = self._agents_seen.get((a, d))
            if prev is None or (ls - prev).total_seconds() >= self.settings.agents_touch_s:
                keep.append(i)
                self._agents_seen[(a, d)] = ls
        return rows.take(pa.array(keep, pa.int64()))

    def registry_before(self, batch_id: int) -> SchemaRegistry:
        if self._after is not None and self._after[0] == batch_id - 1:
            return self._after[1].copy()
        from pipeline.silver.registry import to_registry, visible_rows

        version = delta.table_version(self.registry.path)
        rows = visible_rows(self.registry.table(), self.app_id, batch_id)
        key = (version, rows.num_rows)
        if self._reg_cache is None or self._reg_cache[0] != key:
            self._reg_cache = (key, to_registry(rows))
        return self._reg_cache[1].copy()

    def pending_parked(self, batch_id: int) -> pa.Table:
        """What parked messages not resolved wait for, as of before this batch
        (``parked.PENDING``)."""
        if self._after is not None and self._after[0] == batch_id - 1:
            return self._after[2]
        return parked.from_tables(
            self.settings.path("parked"), self.settings.path("parked_resolved"), self.app_id,
            batch_id,
        )  # fmt: skip

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """Decode on the driver or in Spark tasks (``decode_on``; ``auto`` by the size of
        the batch's bronze files), then finish and commit the batch."""
        t0 = time.perf_counter()
        registry = self.registry_before(batch_id)
        files = bronze_files(self.settings, df)
        mode = self.settings.decode_on
        t_plan = time.perf_counter()
        if mode == "auto":
            small = files is not None and sum(f.size for f in files) <= self.settings.driver_max_bytes
            mode = "driver" if small else "tasks"
        staged: TaskResults | None = None
        with delta.Stages(self.app_id, batch_id) as stages:
            if mode == "driver":
                bronze = read_bronze(files) if files is not None else df.toArrow()
                decoded = decode_arrow(bronze, registry.copy(), batch_id, self.kinds)
            else:
                staged = self.run_tasks(df, files, registry, batch_id, stages)
                decoded = staged.side
            t1 = time.perf_counter()
            report = self.finish(decoded, registry, batch_id, staged, df.sparkSession, stages)
        report.decode_on = mode
        report.tasks = 0 if staged is None else staged.tasks
        report.seconds["plan"] = t_plan - t0  # the registry as of the batch, its files
        report.seconds["decode"] = t1 - t_plan  # the driver's decode, or the tasks' job
        log.info("silver batch %d: %s", batch_id, report)

    def run_tasks(
        self,
        df: DataFrame,
        files: list[DataFile] | None,
        registry: SchemaRegistry,
        batch_id: int,
        stages: delta.Stages,
    ) -> TaskResults:
        """The task path's Spark job: plan, run the tasks, gather their outputs."""
        from pipeline.silver import tasks

        staging = tuple(
            (name, stages.prefix(self._staged_in(name))) for name in tasks.TASK_TABLES
        )
        spark = df.sparkSession
        plan = tasks.TaskPlan(
            tuple(registry), batch_id, self.kinds, staging, call_buckets(spark)
        )
        if files is not None:
            units = spark.sparkContext.defaultParallelism * self.settings.tasks_per_core
            outputs = tasks.run_units(spark, tasks.plan_units(files, units), plan)
        else:
            outputs = tasks.run_dataframe(df, plan)
        return tasks.gather(outputs, batch_id)

    def decode_local(self, bronze: pa.Table, batch_id: int) -> BatchReport:
        """The same batch, decoded on the driver (no Spark): tests, tools, tiny batches."""
        registry = self.registry_before(batch_id)
        decoded = decode_arrow(bronze, registry.copy(), batch_id, self.kinds)
        return self.finish(decoded, registry, batch_id)

    def finish(
        self,
        decoded: Decoded,
        registry: SchemaRegistry,
        batch_id: int,
        staged: TaskResults | None = None,
        spark: SparkSession | None = None,
        stages: delta.Stages | None = None,
    ) -> BatchReport:
        """Steps 3-5 of the module docstring on a decoded batch. ``staged``: what the
        tasks wrote and returned (task path); ``decoded`` is then their side rows.
        ``spark``: where parked messages are decoded again when there are many.
        ``stages``: where the tasks wrote (the caller closes them); else made here."""
        if stages is None:
            with delta.Stages(self.app_id, batch_id) as own:
                return self.finish(decoded, registry, batch_id, staged, spark, own)
        t0 = time.perf_counter()
        report = BatchReport(batch_id)
        seen_rows = [decoded.get(SEEN_T)]
        ext, report.new_schemas = with_batch_schemas(registry, decoded)
        parts = [decoded]
        b = _Batch(
            batch_id, report, staged, spark,
            files={} if staged is None else {k: list(v) for k, v in staged.files.items()},
            stages=stages,
        )  # fmt: skip
        if staged is None:  # the driver path holds this batch's parked messages
            again = (
                decode_parked_again(decoded, ext, batch_id, self.kinds)
                if report.new_schemas
                else None
            )
            if again is not None:
                parts.append(again)
                seen_rows.append(again.get(SEEN_T))
            now = parked.merge(parked.summarize(p.get(PARKED_T)) for p in parts)
        else:
            now = staged.pending
        before = self.pending_parked(batch_id)
        retry = parked.retry_keys(before, ext)
        known_now = parked.decodable(now, ext) if staged is not None else []
        try:
            if retry or known_now:
                again_t, report.resolved_on = self._resolve(b, ext, retry, known_now)
                report.resolved = again_t.resolved
                parts.append(again_t.side)
                seen_rows.append(again_t.side.get(SEEN_T))
                if known_now:  # this batch's parked files were rewritten
                    now = parked.PENDING.empty_table()
                now = parked.merge([now, again_t.pending])
                extra_agents = [again_t.agents]
            else:
                extra_agents = []
            pending = parked.merge([parked.keep_others(before, retry), now])
            merged = Decoded.concat(parts)
            agents = [agent_rows(merged, batch_id), *extra_agents]
            if staged is not None:
                agents.append(staged.agents)
            merged.tables["agents"] = self._agents_to_write(merge_agent_rows(agents, batch_id))
            calls = self._pair_calls(b, merged, ext)
            self._report_stale(pending, report)
            self._ask_for_schemas(pending, ext)
            self._after = None
            t1 = time.perf_counter()
            self._commit(b, merged, calls)
        finally:
            b.locks.close()
        seen = [
            SeenSchema(schema_from_row(r), r["source_agent"], r["first_seen"])
            for t in seen_rows
            for r in t.to_pylist()
        ]
        if self.registry.update(
            seen,
            app_id=self.app_id,
            batch_id=batch_id,
            touch_after_s=self.settings.registry_touch_s,
        ):
            report.committed.append("schema_registry")
        t2 = time.perf_counter()
        report.seconds.update({"resolve": t1 - t0, "write": t2 - t1})
        for sc in seen:
            if sc.schema.key not in ext:
                ext.add(sc.schema)
        self._after = (batch_id, ext, pending)
        self.reports.append(report)
        return report

    def _resolve(
        self, b: _Batch, ext: SchemaRegistry, retry: list[str], known_now: list[str]
    ) -> tuple[TaskResults, str]:
        """Decode the parked messages whose schema is known now (``tasks.resolve_task``):
        this batch's parked files when ``known_now``, the ``parked`` table's messages
        stored under ``retry``. In Spark tasks on the task path or above
        ``driver_max_bytes`` of files; here otherwise (the second value says which).
        Their files join ``b.files``, written under ``b.stages``."""
        from pipeline.silver import tasks

        batch_id, staged, spark, files = b.batch_id, b.staged, b.spark, b.files
        path = self.settings.path
        parts: list[tasks.ParkedPart] = []
        if known_now and staged is not None:
            parts += [tasks.ParkedPart(f.location, f.size) for f in files.pop(PARKED_T, [])]
        schema, rschema = SILVER_TABLES["parked"], SILVER_TABLES["parked_resolved"]
        rfiles: list[delta.LiveFile] = []
        if retry:  # earlier batches' messages: those not resolved before this batch
            schema, live = delta.files_before_batch(path("parked"), self.app_id, batch_id)
            parts += [
                tasks.ParkedPart(f.local_path, storage.file_size(f.local_path), f) for f in live
            ]
            rschema, rfiles = delta.files_before_batch(
                path("parked_resolved"), self.app_id, batch_id
            )
        staging = [(n, self._stage_for(b, n)) for n in tasks.RESOLVE_TABLES]
        plan = tasks.ResolvePlan(
            schemas=tuple(ext),
            batch_id=batch_id,
            kinds=self.kinds,
            known=tuple(known_now),
            retry=tuple(retry),
            staging=tuple(staging),
            parked_schema=schema,
            resolved_schema=rschema,
            resolved_files=tuple(rfiles),
            call_buckets=call_buckets(spark),
        )
        small = sum(p.size for p in parts) <= self.settings.driver_max_bytes
        where = None if spark is None or (staged is None and small) else spark
        cores = 1 if where is None else where.sparkContext.defaultParallelism
        got = tasks.gather(
            tasks.run_resolve(where, parts, plan, cores * self.settings.tasks_per_core), batch_id
        )
        for name, fs in got.files.items():
            files.setdefault(name, []).extend(fs)
        on = "driver" if where is None else "tasks"
        log.info(
            "silver batch %d: %d parked message(s) decoded again, %d of earlier batches (%s)",
            batch_id, got.messages, got.resolved, on,
        )  # fmt: skip
        return got, on

    def _staged_in(self, name: str) -> str:
        """The table whose folder holds a task table's files."""
        from pipeline.silver.tasks import STAGED_IN

        return self.settings.path(STAGED_IN.get(name, name))

    def _stage_for(self, b: _Batch, name: str) -> str:
        """The batch's stage prefix for a task table (``b.stages``: one per table folder)."""
        return b.stages.prefix(self._staged_in(name))

    def _pair_calls(
        self, b: _Batch, merged: Decoded, registry: SchemaRegistry
    ) -> tuple[list[str], int] | None:
        """Pair the batch's call halves (``pipeline.silver.methods``): their files join
        ``b.files["method_calls"]``; returns the candidate files they replace and the rows
        the batch changed, or None without halves. In Spark tasks on the task path when
        halves and stored rows number more than ``calls_driver_max_rows``, else here.
        The table lock is taken (shared, into ``b.locks``) before the candidates are
        listed and held until the commit that removes them: no compaction in between."""
        files, batch_id = b.files, b.batch_id
        held = merged.tables.pop(CALL_PARTS_T, None)
        part_files = files.pop(CALL_PARTS_T, [])
        if not part_files and (held is None or held.num_rows == 0):
            return None
        path = self.settings.path("method_calls")
        done = delta.committed_batch(path, self.app_id)
        if done is not None and done >= batch_id:  # a replay: its commit would be skipped
            return None
        b.locks.enter_context(delta.table_lock(path))
        work = self.calls.plan(
            app_id=self.app_id, batch_id=batch_id, registry=registry,
            buckets=call_buckets(b.spark), part_files=part_files, parts_rows=held,
            sample_files=files.get("object_samples", ()),
            samples_rows=merged.tables.get("object_samples"),
            staging=self._stage_for(b, CALL_PARTS_T),
        )  # fmt: skip
        big = work.rows > self.settings.calls_driver_max_rows
        where = b.spark if b.staged is not None and big else None
        paired, changed = self.calls.run(work, where)
        b.report.paired_on = "driver" if where is None else "tasks"
        files["method_calls"] = paired
        return work.remove, changed

    def _commit(self, b: _Batch, merged: Decoded, calls: tuple[list[str], int] | None) -> None:
        """One commit per non-empty table, in ``WRITE_ORDER``: the driver's rows plus
        the files the tasks wrote. ``calls``: the candidate ``method_calls`` files its
        new files replace, and the rows the batch changed (``_pair_calls``)."""
        files, batch_id, report = b.files, b.batch_id, b.report
        for name in WRITE_ORDER:
            t = merged.tables.get(name)
            n = (0 if t is None else t.num_rows) + sum(f.rows for f in files.get(name, ()))
            if n == 0:
                continue
            report.rows[name] = n
            path = self.settings.path(name)
            if name == "method_calls":  # replaces the candidate files: a file-level upsert
                assert calls is not None and t is None
                report.rows[name] = calls[1]
                done = delta.commit_staged(
                    path, files[name], app_id=self.app_id, batch_id=batch_id,
                    operation="merge", remove=calls[0],
                )  # fmt: skip
                b.stages.done(path)
            elif files.get(name):
                done = delta.commit_staged(
                    path, self._with_driver_rows(name, t, files[name], b.stages.prefix(path)),
                    app_id=self.app_id, batch_id=batch_id,
                )  # fmt: skip
                b.stages.done(path)
            else:
                assert t is not None
                done = delta.append_parquet(path, t, app_id=self.app_id, batch_id=batch_id)
            if not done.skipped:
                report.committed.append(name)

    def _with_driver_rows(
        self,
        name: str,
        rows: pa.Table | None,
        files: list[delta.DataFileInfo],
        prefix: str,
    ) -> list[delta.DataFileInfo]:
        """The tasks' files of a table, plus one file of the rows the driver decoded
        (parked messages whose schema came with the batch) under the table's stage."""
        if rows is None or rows.num_rows == 0:
            return files
        w = delta.DataFileWriter(
            delta.staged_file(prefix, delta.data_file_name()), SILVER_TABLES[name]
        )
        w.write(rows)
        info = w.close()
        assert info is not None
        return [*files, info]

    def _ask_for_schemas(self, pending: pa.Table, known: SchemaRegistry) -> None:
        """List the schema keys parked messages wait for where the console reads them,
        and withdraw the keys decoded since (``receivers.schema_wants``)."""
        if self.settings.schema_wants is None:
            return
        from receivers.schema_wants import SchemaWants

        wants = SchemaWants(self.settings.schema_wants)
        missing = {parse_key_text(m) for m in pending.column("missing").to_pylist() if m}
        wants.done([k for k in wants.pending() if k in known and k not in missing])
        if wants.want(sorted(missing, key=lambda k: (k.package, k.name, k.hash))):
            log.info("asked the console for %d schema(s) parked messages wait for", len(missing))

    def _report_stale(self, pending: pa.Table, report: BatchReport) -> None:
        old = parked.stale(pending, self.settings.parked_max_age_s)
        self.stale_parked = old
        report.stale_parked = int(pc.sum(old.column("messages")).as_py() or 0)
        if old.num_rows:
            missing = sorted(set(old.column("missing").to_pylist()))
            log.warning(
                "%d parked message(s) wait for schemas not seen for over %.0f s: %s",
                report.stale_parked,
                self.settings.parked_max_age_s,
                ", ".join(missing[:10]),
            )
