"""The silver batch writer: one bronze micro-batch -> every silver table, exactly once.

One micro-batch (``SilverBatchWriter.__call__``), streaming or batch:

1. the registry as it was *before* this batch (``RegistryTable.load``: rows
   first written by this app at this batch id or later are left out), so a
   replayed batch decodes exactly as its first attempt;
2. the row work: on the driver (the batch's bronze files read there and
   decoded by ``pipeline.silver.decode.decode_arrow``), or in Spark tasks
   (``pipeline.silver.tasks``: each task decodes its part and writes its
   Parquet files into the tables' staging folders, returning only their
   descriptions and the few rows step 3 needs); ``decode_on`` chooses,
   ``auto`` by the size of the batch's bronze files;
3. schemas met in the batch decode the batch's messages that were parked for
   want of them (content before its schema, or in another task), and the
   messages parked by earlier batches whose schema is now known (read as of
   before this batch); v1 method calls are paired (``pipeline.silver.methods``);
4. each non-empty table gets one Delta commit of all its files carrying
   ``(app_id, batch_id)`` (``pipeline.delta.commit_staged``,
   ``append_parquet``): a replay commits nothing twice. ``parked_resolved``
   is written last, so a crash before it leaves the parked messages pending
   and the replay decodes them again into tables that skip the committed batch;
5. the registry gets the new schemas (merge, same app transaction).

Parked messages older than ``parked_max_age_s`` are reported (log warning,
``SilverBatchWriter.stale_parked``) on every batch until their schema arrives.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline import delta
from pipeline.bronze.writer import checkpoint_query_id
from pipeline.codec.schema import SchemaRegistry
from pipeline.silver.agents import agent_rows, merge_agent_rows
from pipeline.silver.batch import bronze_files, read_bronze
from pipeline.silver.decode import (
    CALL_PARTS_T,
    PARKED_T,
    SEEN_T,
    Decoded,
    decode_arrow,
    parse_key_text,
)
from pipeline.silver.methods import MethodCallTable
from pipeline.silver.registry import SeenSchema, schema_from_row
from pipeline.silver.settings import SilverSettings, ensure_tables
from schemas.silver import METHOD_CALLS, PARKED, RESOLVED, SILVER_TABLES

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from pipeline.delta_source import DataFile
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


def without(table: pa.Table, other: pa.Table) -> pa.Table:
    """Rows of ``table`` whose (partition, offset) is not in ``other`` (small tables: parking)."""
    drop = set(
        zip(other.column("partition").to_pylist(), other.column("offset").to_pylist(), strict=True)
    )
    keep = [
        k not in drop
        for k in zip(
            table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True
        )
    ]
    return table.filter(pa.array(keep, pa.bool_()))


# ------------------------------------------------------------------ the writer


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
    stale_parked: int = 0
    seconds: dict[str, float] = field(default_factory=dict)


class SilverBatchWriter:
    """The ``foreachBatch`` function: one bronze micro-batch -> every silver table, exactly once."""

    def __init__(self, settings: SilverSettings, app_id: str | None = None) -> None:
        self.settings = settings
        self._app_id = app_id
        self.registry = ensure_tables(settings)
        self.kinds = self.registry.kinds
        self._reg_cache: tuple[tuple[int, int], SchemaRegistry] | None = None
        # State after the last batch this writer finished: (batch id, registry, pending
        # parked). The next batch id starts from it instead of re-reading the tables
        # (this writer is the only one writing them); any other batch id reloads.
        self._after: tuple[int, SchemaRegistry, pa.Table] | None = None
        self._agents_seen: dict[tuple[str, str], datetime] | None = None
        self.calls = MethodCallTable(settings.path("method_calls"), settings.path("object_samples"))
        self.reports: list[BatchReport] = []
        self.stale_parked: pa.Table = PARKED.empty_table()

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
        from deltalake import DeltaTable

        from pipeline.silver.registry import to_registry, visible_rows

        version = DeltaTable(self.registry.path).version()
        rows = visible_rows(self.registry.table(), self.app_id, batch_id)
        key = (version, rows.num_rows)
        if self._reg_cache is None or self._reg_cache[0] != key:
            self._reg_cache = (key, to_registry(rows))
        return self._reg_cache[1].copy()

    def pending_parked(self, batch_id: int) -> pa.Table:
        """Parked messages not resolved, as of before this batch."""
        if self._after is not None and self._after[0] == batch_id - 1:
            return self._after[2]
        parked = delta.read_before_batch(self.settings.path("parked"), self.app_id, batch_id)
        if parked.num_rows == 0:
            return parked
        resolved = delta.read_before_batch(self.settings.path("parked_resolved"), self.app_id, batch_id)
        if resolved.num_rows == 0:
            return parked
        return without(parked, resolved)

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """Decode on the driver or in Spark tasks (``decode_on``; ``auto`` by the size of
        the batch's bronze files), then finish and commit the batch."""
        t0 = time.perf_counter()
        registry = self.registry_before(batch_id)
        files = bronze_files(self.settings, batch_id)
        mode = self.settings.decode_on
        t_plan = time.perf_counter()
        if mode == "auto":
            small = files is not None and sum(f.size for f in files) <= self.settings.driver_max_bytes
            mode = "driver" if small else "tasks"
        staged: TaskResults | None = None
        if mode == "driver":
            bronze = read_bronze(files) if files is not None else df.toArrow()
            decoded = decode_arrow(bronze, registry.copy(), batch_id, self.kinds)
        else:
            staged = self.run_tasks(df, files, registry, batch_id)
            decoded = staged.side
        t1 = time.perf_counter()
        try:
            report = self.finish(decoded, registry, batch_id, staged)
        finally:
            for folder in [] if staged is None else staged.staging:
                delta.remove_stage_dir(folder)
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
    ) -> TaskResults:
        """The task path's Spark job: plan, run the tasks, gather their outputs."""
        from pipeline.silver import tasks

        staging = tuple(
            (name, delta.fresh_stage_dir(self.settings.path(name), self.app_id, batch_id))
            for name in tasks.TASK_TABLES
        )
        plan = tasks.TaskPlan(tuple(registry), batch_id, self.kinds, staging)
        spark = df.sparkSession
        if files is not None:
            units = spark.sparkContext.defaultParallelism * self.settings.tasks_per_core
            outputs = tasks.run_units(spark, tasks.plan_units(files, units), plan)
        else:
            outputs = tasks.run_dataframe(df, plan)
        results = tasks.gather(outputs, batch_id)
        results.staging = [folder for _name, folder in staging]
        return results

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
    ) -> BatchReport:
        """Steps 3-5 of the module docstring on a decoded batch. ``staged``: what the
        tasks wrote and returned (task path); ``decoded`` is then their side rows."""
        t0 = time.perf_counter()
        report = BatchReport(batch_id)
        seen_rows = [decoded.get(SEEN_T)]
        ext = registry.copy()
        for r in decoded.get(SEEN_T).to_pylist():
            s = schema_from_row(r)
            if s.key not in ext:
                report.new_schemas += 1
                ext.add(s)
        parts = [decoded]
        parked_now = decoded.get(PARKED_T)
        if parked_now.num_rows and report.new_schemas:
            known = np.array(
                [parse_key_text(m) in ext for m in parked_now.column("missing").to_pylist()]
            )
            if known.any():
                again = decode_arrow(
                    parked_now.filter(pa.array(known)), ext.copy(), batch_id, self.kinds
                )
                decoded.tables[PARKED_T] = parked_now.filter(pa.array(~known))
                parts.append(again)
                seen_rows.append(again.get(SEEN_T))
        resolved = RESOLVED.empty_table()
        pending = self.pending_parked(batch_id)
        if pending.num_rows:
            known = np.array(
                [parse_key_text(m) in ext for m in pending.column("missing").to_pylist()], bool
            )
            if known.any():
                todo = pending.filter(pa.array(known))
                again = decode_arrow(todo, ext.copy(), batch_id, self.kinds)
                still = again.get(PARKED_T)
                again.tables.pop(PARKED_T, None)  # still parked: stays pending, not parked twice
                done = without(todo, still)
                resolved = pa.table(
                    {
                        "partition": done.column("partition"),
                        "offset": done.column("offset"),
                        "batch_id": pa.array(np.full(done.num_rows, batch_id, np.int64)),
                        "parked_batch": done.column("batch_id"),
                    }
                ).cast(RESOLVED)
                parts.append(again)
                seen_rows.append(again.get(SEEN_T))
                report.resolved = resolved.num_rows
        merged = Decoded.concat(parts)
        agents = [agent_rows(merged, batch_id)]
        if staged is not None:
            agents.append(staged.agents)
        merged.tables["agents"] = self._agents_to_write(merge_agent_rows(agents, batch_id))
        merged.tables["parked_resolved"] = resolved
        calls = merged.tables.pop(CALL_PARTS_T, None)
        if calls is None:
            calls = METHOD_CALLS.empty_table()
        samples = merged.get("object_samples")
        if staged is not None:
            here, tasks_wrote = samples, staged.samples_reader

            def batch_samples() -> pa.Table:
                return pa.concat_tables([here, tasks_wrote().cast(here.schema)])

            merged.tables["method_calls"] = self.calls.build(
                calls, batch_samples, ext, self.app_id, batch_id
            )
        else:
            merged.tables["method_calls"] = self.calls.build(
                calls, samples, ext, self.app_id, batch_id
            )
        still = without(pending, resolved)
        self._report_stale(still, merged.get(PARKED_T), report)
        self._ask_for_schemas(still, merged.get(PARKED_T), ext)
        self._after = None
        t1 = time.perf_counter()
        files = {} if staged is None else staged.files
        for name in WRITE_ORDER:
            t = merged.tables.get(name)
            n = (0 if t is None else t.num_rows) + sum(f.rows for f in files.get(name, ()))
            if n == 0:
                continue
            report.rows[name] = n
            path = self.settings.path(name)
            if name == "method_calls":  # completes earlier rows: an upsert, not an append
                assert t is not None
                done = delta.merge_arrow(
                    t, path, keys=["call_id"], app_id=self.app_id, batch_id=batch_id
                )
            elif name in files:
                done = delta.commit_staged(
                    path, self._with_driver_rows(name, t, files[name], batch_id),
                    app_id=self.app_id, batch_id=batch_id,
                )  # fmt: skip
            else:
                assert t is not None
                done = delta.append_parquet(path, t, app_id=self.app_id, batch_id=batch_id)
            if not done.skipped:
                report.committed.append(name)
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
        self._after = (
            batch_id,
            ext,
            pa.concat_tables(
                [still.select(PARKED.names), merged.get(PARKED_T).select(PARKED.names).cast(PARKED)]
            ),
        )
        self.reports.append(report)
        return report

    def _with_driver_rows(
        self,
        name: str,
        rows: pa.Table | None,
        files: list[delta.DataFileInfo],
        batch_id: int,
    ) -> list[delta.DataFileInfo]:
        """The tasks' files of a table, plus one file of the rows the driver decoded
        (parked messages whose schema came with the batch) in the same staging folder."""
        if rows is None or rows.num_rows == 0:
            return files
        folder = os.path.dirname(files[0].location)
        w = delta.DataFileWriter(
            os.path.join(folder, delta.data_file_name(batch_id)), SILVER_TABLES[name]
        )
        w.write(rows)
        info = w.close()
        assert info is not None
        return [*files, info]

    def _ask_for_schemas(self, pending: pa.Table, new: pa.Table, known: SchemaRegistry) -> None:
        """List the schema keys parked messages wait for where the console reads them,
        and withdraw the keys decoded since (``receivers.schema_wants``)."""
        if self.settings.schema_wants is None:
            return
        from receivers.schema_wants import SchemaWants

        wants = SchemaWants(self.settings.schema_wants)
        missing = {
            parse_key_text(m) for t in (pending, new) for m in t.column("missing").to_pylist() if m
        }
        wants.done([k for k in wants.pending() if k in known and k not in missing])
        if wants.want(sorted(missing, key=lambda k: (k.package, k.name, k.hash))):
            log.info("asked the console for %d schema(s) parked messages wait for", len(missing))

    def _report_stale(self, pending: pa.Table, new: pa.Table, report: BatchReport) -> None:
        both = pa.concat_tables(
            [pending.select(PARKED.names), new.select(PARKED.names).cast(PARKED)]
        )
        if both.num_rows == 0:
            self.stale_parked = PARKED.empty_table()
            return
        limit = datetime.now(UTC) - timedelta(seconds=self.settings.parked_max_age_s)
        old = both.filter(
            pc.less(
                both.column("received_at"), pa.scalar(limit, both.schema.field("received_at").type)
            )
        )
        self.stale_parked = old
        report.stale_parked = old.num_rows
        if old.num_rows:
            missing = sorted(set(old.column("missing").to_pylist()))
            log.warning(
                "%d parked message(s) older than %.0f s still wait for schemas: %s",
                old.num_rows,
                self.settings.parked_max_age_s,
                ", ".join(missing[:10]),
            )


