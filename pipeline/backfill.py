"""Backfill: re-derive silver and gold for a time range from bronze, replacing it exactly.

A range is half-open, ``[from, to)`` in UTC, so consecutive runs (yesterday,
today) tile time without overlap. What "in range" means per table (docs/backfill.md):

- silver ``object_samples``, ``events``, ``heartbeats``, ``method_responses``,
  ``quarantine``: the rows decoded from the bronze messages *received* in the
  range (bronze ``received_at``), matched by their bronze identity
  ``(partition, offset)``. They are decoded again with the whole current
  schema registry (a message parked by the stream and resolved later decodes
  at once), and carry their message's bronze ``batch_id``;
- gold ``statistic_rates``: the intervals whose *end* sample time
  (``end_ns``) is in the range. The pairing scan runs over every silver sample
  up to the range (and past it: later samples cannot change earlier pairs), so
  an edge interval pairs with the same baseline the stream used;
- gold ``lifecycle_state`` / ``agent_liveness``: all-time rows per object or
  agent up interval. The rows whose span overlaps the range, before or after
  the backfill, are replaced by rows recomputed from *all* silver (their
  current value as the stream would have it): an object's span is
  ``[first_seen, max(last_seen, ended_at)]``, an up interval's
  ``[up_start, max(last_heartbeat, down_at)]``;
- gold ``object_lifecycles``: the fold of ``lifecycle_state`` as the backfill left
  it (``pipeline.gold.fold``), replacing the whole table.

Each table gets ONE Delta commit that removes the files holding rows of the
range and adds the new rows plus the kept rows of those files
(``replace_rows``): readers see the old range or the new one, nothing else is
changed, and no row is doubled. Gold rows written by a backfill carry
``batch_id = -1`` (no stream batch wrote them). The gold computation runs the
gold job's own writer (``GoldBatchWriter``) as one batch into scratch tables,
so the rows are the stream's rows.

Idempotence: every commit carries the app transaction ``(app_id, run)`` with
``app_id = qmf-backfill-<from>-<to>``. A run that finds some of its tables
holding the latest run id and others not resumes that (crashed) run: tables
that hold it are skipped; otherwise it starts run ``latest + 1`` and replaces
every table again. Since a replace is the same whatever the table held, a
rerun after a crash at any point converges to the same tables.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession

    from pipeline.codec.schema import SchemaRegistry
    from pipeline.silver.registry import StatisticKinds

log = logging.getLogger(__name__)

SILVER_TABLES = ("object_samples", "events", "heartbeats", "method_responses", "quarantine")
# object_lifecycles last: the fold of lifecycle_state as the backfill left it.
GOLD_TABLES = ("statistic_rates", "lifecycle_state", "agent_liveness", "object_lifecycles")
LAYERS = ("silver", "gold")
BACKFILL_BATCH_ID = -1  # batch_id of gold rows a backfill wrote
IDENTITY = ("partition", "offset")
LIFECYCLE_KEYS = ("agent", "object_id", "create_ns")
LIVENESS_KEYS = ("agent", "up_start_ns")
_HIT = "__backfill_hit"
_KEY_HIT = "__backfill_key_hit"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# ------------------------------------------------------------------ settings


def parse_time(text: str) -> datetime:
    """ISO 8601 (``2027-01-15T08:00:00Z``, ``2027-01-15``); naive means UTC."""
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an ISO 8601 time") from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def parse_layers(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [n for n in names if n not in LAYERS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: layers are silver and/or gold")
    return tuple(n for n in LAYERS if n in names)


def micros(t: datetime) -> int:
    """Exact microseconds since the epoch (no float)."""
    return (t - _EPOCH) // timedelta(microseconds=1)


@dataclass(frozen=True)
class BackfillSettings:
    """What a backfill needs: the tables, the range, the gold job's rules."""

    bronze: str
    silver: str
    gold: str
    start: datetime
    end: datetime
    layers: tuple[str, ...] = LAYERS
    dry_run: bool = False
    run: int | None = None  # None: resume a crashed run or start the next one
    scratch: str | None = None
    kinds_file: str | None = None
    decode_on: str = "tasks"
    min_interval_s: float = 1.0
    max_gap_s: float = 300.0
    state_ttl_s: float = 86400.0
    missed_heartbeats: int = 3
    v1_agent: str = "1.0"
    v1_interval_s: float = 10.0

    def __post_init__(self) -> None:
        from pipeline.lake.storage import is_object_store, require_local

        require_local(scratch=self.scratch)
        on_store = [p for p in (self.bronze, self.silver, self.gold) if is_object_store(p)]
        if on_store and self.scratch is None:
            raise ValueError(
                f"{on_store[0]!r} is on an object store: the backfill needs --scratch, a folder"
                " every executor shares (the decoded range and gold's shuffle are written there)"
            )
        if self.start.tzinfo is None or self.end.tzinfo is None:
            raise ValueError("--from and --to must be time-zone aware (UTC)")
        if self.start >= self.end:
            raise ValueError(f"empty range: --from {self.start} is not before --to {self.end}")
        if self.decode_on == "spark":  # the old name of the task decode
            object.__setattr__(self, "decode_on", "tasks")
        if self.decode_on not in ("tasks", "driver"):
            raise ValueError(f"decode_on {self.decode_on!r}: expected tasks or driver")

    @property
    def from_ns(self) -> int:
        return micros(self.start) * 1000

    @property
    def to_ns(self) -> int:
        return micros(self.end) * 1000

    @property
    def app_id(self) -> str:
        """The idempotence key: one app per range; runs are its batch ids."""

        def fmt(t: datetime) -> str:
            us = f".{t.microsecond:06d}" if t.microsecond else ""
            return f"{t:%Y%m%dT%H%M%S}{us}Z"

        return f"qmf-backfill-{fmt(self.start)}-{fmt(self.end)}"

    def tables(self) -> dict[str, str]:
        """Table label (``layer/name``) -> path, in write order (silver before gold)."""
        out: dict[str, str] = {}
        if "silver" in self.layers:
            out |= {f"silver/{n}": os.path.join(self.silver, n) for n in SILVER_TABLES}
        if "gold" in self.layers:
            out |= {f"gold/{n}": os.path.join(self.gold, n) for n in GOLD_TABLES}
        return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The backfill's options, shared by ``jobs/backfill.py`` and ``qmf backfill``."""
    p.add_argument(
        "--data",
        default="data",
        help="qmf run's data folder: DATA/bronze, DATA/silver/<t>, DATA/gold/<t> (./data)",
    )
    p.add_argument("--bronze", default=None, help="bronze table (default DATA/bronze)")
    p.add_argument(
        "--silver", default=None, help="folder of the silver tables (default DATA/silver)"
    )
    p.add_argument("--gold", default=None, help="folder of the gold tables (default DATA/gold)")
    p.add_argument(
        "--from",
        dest="start",
        type=parse_time,
        required=True,
        help="range start, inclusive (ISO 8601, UTC if no zone)",
    )
    p.add_argument("--to", dest="end", type=parse_time, required=True, help="range end, exclusive")
    p.add_argument("--layers", type=parse_layers, default=LAYERS, help="silver,gold (default both)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="report rows in range and rows to write per table; write nothing",
    )
    p.add_argument(
        "--run",
        type=int,
        default=None,
        help="run id (app transaction batch id); default: resume a crashed run, else the next",
    )
    p.add_argument(
        "--scratch",
        default=None,
        help="folder every executor shares for the decoded range and the gold scratch tables "
        "(default beside the silver and gold folders; removed; needed for a lake on a bucket)",
    )
    p.add_argument(
        "--kinds", default=None, help="statistic kinds TOML (default schemas/statistic_kinds.toml)"
    )
    p.add_argument(
        "--decode-on",
        choices=("tasks", "driver", "spark"),
        default="tasks",
        help="decode the range's bronze in Spark tasks (they write files the replace reads "
        "with Spark: no row on the driver) or on the driver ('spark' = tasks)",
    )
    p.add_argument(
        "--min-interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="as the gold job: shorter intervals are skipped",
    )
    p.add_argument("--max-gap", type=float, default=300.0, metavar="SECONDS")
    p.add_argument("--state-ttl", type=float, default=86400.0, metavar="SECONDS")
    p.add_argument("--missed-heartbeats", type=int, default=3)
    p.add_argument("--v1-agent", default="1.0")
    p.add_argument("--v1-interval", type=float, default=10.0, metavar="SECONDS")


def settings_from_args(args: argparse.Namespace) -> BackfillSettings:
    data = args.data
    return BackfillSettings(
        bronze=args.bronze or os.path.join(data, "bronze"),
        silver=args.silver or os.path.join(data, "silver"),
        gold=args.gold or os.path.join(data, "gold"),
        start=args.start,
        end=args.end,
        layers=args.layers,
        dry_run=args.dry_run,
        run=args.run,
        scratch=args.scratch,
        kinds_file=args.kinds,
        decode_on=args.decode_on,
        min_interval_s=args.min_interval,
        max_gap_s=args.max_gap,
        state_ttl_s=args.state_ttl,
        missed_heartbeats=args.missed_heartbeats,
        v1_agent=args.v1_agent,
        v1_interval_s=args.v1_interval,
    )


# ------------------------------------------------------------------ reports


@dataclass(frozen=True)
class TableChange:
    """What a backfill did (or would do) to one table."""

    table: str
    in_range: int  # rows of the range before (removed, or would be)
    written: int  # rows of the range after (written, or would be)
    status: str  # committed | skipped (this run already committed it) | dry-run
    version: int | None = None

    def __str__(self) -> str:
        at = f" (version {self.version})" if self.version is not None else ""
        return (
            f"{self.table}: {self.in_range} rows in range -> {self.written} rows, {self.status}{at}"
        )


@dataclass
class BackfillReport:
    app_id: str
    run: int
    start: datetime
    end: datetime
    dry_run: bool
    tables: dict[str, TableChange] = field(default_factory=dict)

    def __str__(self) -> str:
        head = (
            f"backfill [{self.start.isoformat()}, {self.end.isoformat()}) "
            f"app {self.app_id} run {self.run}"
            + (" (dry run: nothing written)" if self.dry_run else "")
        )
        return "\n".join([head, *(f"  {c}" for c in self.tables.values())])


# ------------------------------------------------------------------ the replace primitive


def _mark(
    df: DataFrame, predicate: str | None, keys: Sequence[str], key_rows: DataFrame | None
) -> DataFrame:
    """``df`` with a boolean column ``_HIT``: the row belongs to the range (predicate or key)."""
    from pyspark.sql import functions as F

    hit: Column = F.expr(f"coalesce(({predicate}), false)") if predicate else F.lit(False)
    if key_rows is not None:
        k = key_rows.select(*keys).distinct().withColumn(_KEY_HIT, F.lit(True))
        df = df.join(k, on=list(keys), how="left")
        hit = hit | F.col(_KEY_HIT).isNotNull()
    return df.withColumn(_HIT, hit)


def replace_rows(
    new: DataFrame,
    path: str,
    *,
    label: str,
    app_id: str,
    batch_id: int,
    predicate: str | None = None,
    keys: Sequence[str] = (),
    key_rows: DataFrame | None = None,
    dry_run: bool = False,
    rows: int | None = None,
    check: bool = True,
) -> TableChange:
    """Replace the table's rows of a range with ``new`` in ONE commit, exactly once.

    The range is the rows matching ``predicate`` (Spark SQL) or whose ``keys``
    appear in ``key_rows``. Files holding range rows are rewritten without
    them, together with ``new``; one commit removes the old files and adds
    the new ones (``pipeline.lake.delta``'s write path, app transaction
    ``(app_id, batch_id)``). Every row of ``new`` must belong to the range,
    so a rerun replaces exactly what this one wrote (``check=False`` when
    the caller built ``new`` so). ``rows``: the size of ``new`` if known
    (saves a Spark job). ``dry_run`` only counts. The table lock is held
    shared from the snapshot to the commit, so a compaction cannot rewrite the
    files in between (``pipeline.lake.delta.table_lock``).
    """
    from contextlib import nullcontext

    from pipeline.lake import delta

    with nullcontext() if dry_run else delta.table_lock(path):
        return _replace(
            new, path, label=label, app_id=app_id, batch_id=batch_id, predicate=predicate,
            keys=keys, key_rows=key_rows, dry_run=dry_run, rows=rows, check=check,
        )  # fmt: skip


def _replace(
    new: DataFrame,
    path: str,
    *,
    label: str,
    app_id: str,
    batch_id: int,
    predicate: str | None,
    keys: Sequence[str],
    key_rows: DataFrame | None,
    dry_run: bool,
    rows: int | None,
    check: bool,
) -> TableChange:
    from pipeline.lake import delta

    dt = delta.open_for_write(path)
    schema = delta.table_schema(dt)
    batch = delta.conform(new, schema)
    spark = batch.sparkSession
    files = delta.file_keys(spark, delta.live_files(dt))
    scan = delta.read_delta(spark, path, dt.version, with_file=True)
    per_file: dict[str, int] = {}  # Spark's key of each file holding rows of the range
    if files:
        hits = _mark(scan, predicate, keys, key_rows).where(_HIT).groupBy(delta.FILE_COL).count()
        per_file = {r[0]: int(r[1]) for r in hits.collect()}
        unknown = sorted(set(per_file) - set(files))
        if unknown:
            raise delta.DeltaLayerError(f"{label}: rows of files not in version {dt.version}: {unknown[:3]}")
    in_range = sum(per_file.values())
    written = batch.count() if rows is None else rows
    if dry_run:
        return TableChange(label, in_range, written, "dry-run", dt.version)
    if delta.already_committed(dt, app_id, batch_id):
        return TableChange(label, in_range, written, "skipped", dt.version)
    if not per_file and written == 0:  # nothing to remove or add: record the run only
        done = delta.commit_files(path, [], app_id=app_id, batch_id=batch_id, operation="backfill")
        return TableChange(label, 0, 0, "skipped" if done.skipped else "committed", done.version)
    if check and _mark(batch, predicate, keys, key_rows).where(~_hit()).limit(1).count() > 0:
        raise ValueError(
            f"{label}: backfill rows outside the range (predicate {predicate!r}, keys {keys})"
        )
    touched = [f for k, f in files.items() if k in per_file]
    out = batch
    if touched:
        from pyspark.sql import functions as F

        rest = scan.where(F.col(delta.FILE_COL).isin(list(per_file)))
        kept = _mark(rest, predicate, keys, key_rows)
        out = batch.unionByName(kept.where(~_hit()).select(*schema.names))
    result = delta.write_and_commit(
        out, dt, app_id=app_id, batch_id=batch_id, operation="backfill",
        remove=[f.delta_path for f in touched],
    )  # fmt: skip
    status = "skipped" if result.skipped else "committed"
    return TableChange(label, in_range, written, status, result.version)


def _hit() -> Column:
    """The marker column of ``_mark``."""
    from pyspark.sql import functions as F

    return F.col(_HIT)


# ------------------------------------------------------------------ silver


def bronze_in_range(spark: SparkSession, s: BackfillSettings) -> DataFrame:
    """Bronze rows received in ``[from, to)``."""
    from pyspark.sql import functions as F

    from pipeline.lake import delta

    df = delta.read_delta(spark, s.bronze)
    return df.where(
        (F.col("received_at") >= F.lit(s.start)) & (F.col("received_at") < F.lit(s.end))
    )


def _registry(s: BackfillSettings) -> tuple[SchemaRegistry, StatisticKinds]:
    from pipeline.silver.registry import DEFAULT_KINDS_FILE, RegistryTable, StatisticKinds

    kinds = StatisticKinds.load(s.kinds_file or DEFAULT_KINDS_FILE)
    return RegistryTable(os.path.join(s.silver, "schema_registry"), kinds).load(), kinds


def decode_silver(
    spark: SparkSession, s: BackfillSettings, bronze: DataFrame, scratch: str
) -> dict[str, tuple[DataFrame, int]]:
    """The silver rows of the bronze range, decoded with the whole current registry:
    ``{table: (rows, how many)}``.

    As the silver writer does, schemas met in the range decode content that
    came before them; messages whose schema is still unknown stay out (the
    stream keeps them in ``parked``). Rows carry their bronze ``batch_id``.
    On the task path (the default) the tasks write the rows as Parquet files
    into ``scratch`` (shared storage the executors see) and the frames read
    them, so the driver holds no row: ``scratch`` must outlive the frames.
    """
    from pyspark.sql import functions as F

    from pipeline.silver.decode import (
        PARKED_T,
        Decoded,
        decode_arrow,
        decode_parked_again,
        with_batch_schemas,
    )
    from pipeline.silver.tasks import decode_to_files
    from schemas.silver import SILVER_TABLES as SCHEMAS

    registry, kinds = _registry(s)
    batches = bronze.select(*IDENTITY, F.col("batch_id").alias(_BRONZE_BATCH)).dropDuplicates(
        list(IDENTITY)
    )
    out: dict[str, tuple[DataFrame, int]] = {}
    if s.decode_on == "driver":
        decoded = decode_arrow(bronze.toArrow(), registry.copy(), 0, kinds)
        if decoded.get(PARKED_T).num_rows:
            ext, _ = with_batch_schemas(registry, decoded)
            again = decode_parked_again(decoded, ext, 0, kinds)
            if again is not None:
                decoded = Decoded.concat([decoded, again])
        for name in SILVER_TABLES:
            t = decoded.get(name)
            rows = t.num_rows
            frame = _to_frame(spark, t.select(SCHEMAS[name].names).cast(SCHEMAS[name]))
            out[name] = (_with_bronze_batch(frame, batches, SCHEMAS[name]) if rows else frame, rows)
        return out
    got = decode_to_files(bronze, registry, 0, kinds, scratch)
    for name in SILVER_TABLES:
        schema = SCHEMAS[name]
        files = got.files.get(name, [])
        rows = sum(f.rows for f in files)
        if not rows:
            out[name] = (_to_frame(spark, schema.empty_table()), 0)
            continue
        frame = spark.read.parquet(*[f.location for f in files])
        out[name] = (_with_bronze_batch(frame, batches, schema), rows)
    return out


def _with_bronze_batch(frame: DataFrame, batches: DataFrame, schema: pa.Schema) -> DataFrame:
    """Silver rows with the ``batch_id`` of their bronze message (by ``(partition, offset)``).

    Every row comes from a bronze message of the range, so an inner join keeps them
    all; ``batches`` holds each identity once, so none is doubled."""
    from pyspark.sql import functions as F

    return (
        frame.drop("batch_id")
        .join(F.broadcast(batches), list(IDENTITY), "inner")
        .withColumnRenamed(_BRONZE_BATCH, "batch_id")
        .select(*schema.names)
    )


_BRONZE_BATCH = "__bronze_batch_id"


def _to_frame(spark: SparkSession, table: pa.Table) -> DataFrame:
    from schemas.tables import spark_schema

    if table.num_rows == 0:
        return spark.createDataFrame([], spark_schema(table.schema))
    return spark.createDataFrame(table)


# ------------------------------------------------------------------ gold


def _silver_view(
    spark: SparkSession,
    s: BackfillSettings,
    name: str,
    ids: DataFrame | None,
    new: DataFrame | None,
) -> DataFrame:
    """A silver table as it is after the silver step: the range's rows replaced by ``new``."""
    from pipeline.lake import delta

    df = delta.read_delta(spark, os.path.join(s.silver, name))
    if ids is None or new is None:
        return df
    return df.join(ids, on=list(IDENTITY), how="left_anti").select(*df.columns).unionByName(new)


def gold_scratch(
    spark: SparkSession, s: BackfillSettings, scratch: str, samples: DataFrame, beats: DataFrame
) -> str:
    """Run the gold job's writer as one batch over all of silver into scratch tables."""
    from pipeline.gold import GoldBatchWriter, GoldSettings, gold_input
    from pipeline.gold.transforms import LivenessRules, RateRules

    settings = GoldSettings(
        silver=s.silver,
        root=scratch,
        rates=RateRules(s.min_interval_s, s.max_gap_s, s.state_ttl_s),
        liveness=LivenessRules(s.missed_heartbeats, s.v1_agent, s.v1_interval_s),
    )
    GoldBatchWriter(settings, app_id="qmf-backfill-scratch")(gold_input(samples, beats), 0)
    return scratch


def gold_ranges(s: BackfillSettings) -> dict[str, tuple[str, Sequence[str]]]:
    """Per gold table: the Spark SQL predicate of the range and the keys that tie
    an existing row to its recomputed one (empty for rates: rows are replaced by time)."""
    lo_ns, hi_ns, lo_us = s.from_ns, s.to_ns, micros(s.start)
    return {
        "statistic_rates": (f"end_ns >= {lo_ns} AND end_ns < {hi_ns}", ()),
        "lifecycle_state": (
            f"first_seen_ns < {hi_ns} AND (last_seen_ns >= {lo_ns} "
            f"OR ended_at >= timestamp_micros({lo_us}))",
            LIFECYCLE_KEYS,
        ),
        "agent_liveness": (
            f"up_start_ns < {hi_ns} AND (last_heartbeat_ns >= {lo_ns} "
            f"OR down_at >= timestamp_micros({lo_us}))",
            LIVENESS_KEYS,
        ),
    }


def gold_rows(
    spark: SparkSession, s: BackfillSettings, scratch: str, name: str
) -> tuple[DataFrame, str, Sequence[str], DataFrame | None]:
    """(new rows, predicate, keys, key rows) of one gold table's range.

    Lifecycles and liveness: the range is every key whose row overlaps it
    before (existing table) or after (recomputed) the backfill; those keys'
    recomputed rows are written.
    """
    from pyspark.sql import functions as F

    from pipeline.lake import delta

    predicate, keys = gold_ranges(s)[name]
    fresh = delta.read_delta(spark, os.path.join(scratch, name)).withColumn(
        "batch_id", F.lit(BACKFILL_BATCH_ID).cast("long")
    )
    if not keys:
        return fresh.where(F.expr(predicate)), predicate, keys, None
    old = delta.read_delta(spark, os.path.join(s.gold, name))
    old_keys = old.where(F.expr(f"coalesce(({predicate}), false)")).select(*keys)
    marked = _mark(fresh, predicate, keys, old_keys)
    new = marked.where(_hit()).select(*fresh.columns)
    return new, predicate, keys, new.select(*keys)


def refold(s: BackfillSettings, label: str, run: int) -> TableChange:
    """``object_lifecycles`` replaced whole by the fold of ``lifecycle_state`` as the
    backfill left it (the fold is a function of all of it), with the run's app
    transaction; a dry run only counts."""
    from pipeline.gold.writer import replace_fold
    from pipeline.lake import delta

    path = os.path.join(s.gold, "object_lifecycles")
    before = delta.read_arrow(path).num_rows
    if s.dry_run:
        return TableChange(label, before, before, "dry-run")
    r = replace_fold(s.gold, app_id=s.app_id, batch_id=run)
    written = delta.read_arrow(path).num_rows
    return TableChange(label, before, written, "skipped" if r.skipped else "committed", r.version)


# ------------------------------------------------------------------ the run


def choose_run(s: BackfillSettings) -> int:
    """The run id: ``--run``, else the crashed run to resume, else the next one."""
    from pipeline.lake import delta

    if s.run is not None:
        return s.run
    done = [delta.committed_batch(p, s.app_id) for p in s.tables().values()]
    top = max((d for d in done if d is not None), default=None)
    if top is None:
        return 0
    if all(d == top for d in done):
        return top + 1  # the last run is complete: a new run replaces everything again
    return top  # some tables lack the last run: it crashed, resume it


def run_backfill(spark: SparkSession, s: BackfillSettings) -> BackfillReport:
    """Re-derive the range's silver and/or gold rows; one commit per table (none on a dry run)."""
    from pipeline.lake import delta

    missing = [p for p in [s.bronze, *s.tables().values()] if not delta.table_exists(p)]
    if "gold" in s.layers:
        missing += [
            p
            for p in (
                os.path.join(s.silver, n)
                for n in ("object_samples", "heartbeats", "schema_registry")
            )
            if not delta.table_exists(p)
        ]
    if missing:
        raise FileNotFoundError(f"backfill needs existing tables; missing: {', '.join(missing)}")
    run = choose_run(s)
    report = BackfillReport(s.app_id, run, s.start, s.end, s.dry_run)
    # shared storage the executors see: the scratch folder, else beside silver's tables
    hidden = os.path.join(s.scratch or s.silver, "_staging")
    os.makedirs(hidden, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="qmf-backfill-", dir=hidden) as scratch:
        return _run(spark, s, report, scratch)


def _run(
    spark: SparkSession, s: BackfillSettings, report: BackfillReport, scratch: str
) -> BackfillReport:
    """``run_backfill`` with its scratch folder (the decoded silver files live there)."""
    paths = s.tables()
    common: dict[str, Any] = {"app_id": s.app_id, "batch_id": report.run, "dry_run": s.dry_run}
    run = report.run
    t0 = time.perf_counter()
    new_silver: dict[str, DataFrame] = {}
    ids: DataFrame | None = None
    if "silver" in s.layers:
        bronze = bronze_in_range(spark, s).persist()
        try:
            decoded = decode_silver(spark, s, bronze, scratch)
            ids = bronze.select(*IDENTITY).localCheckpoint()
            for name, (frame, _) in decoded.items():  # read once: two commits read them
                new_silver[name] = frame.localCheckpoint()
            log.info("silver range decoded (%.1f s)", time.perf_counter() - t0)
            t0 = time.perf_counter()
        finally:
            bronze.unpersist()
        for name, (_, rows) in decoded.items():
            label = f"silver/{name}"
            report.tables[label] = replace_rows(
                new_silver[name], paths[label], label=label, keys=IDENTITY, key_rows=ids,
                rows=rows, check=False, **common,
            )  # fmt: skip
            log.info("%s (%.1f s)", report.tables[label], time.perf_counter() - t0)
            t0 = time.perf_counter()

    if "gold" in s.layers:
        base = s.scratch or os.path.join(os.path.dirname(os.path.abspath(s.gold)), ".backfill")
        scratch = os.path.join(base, f"{s.app_id}-{run}-{uuid.uuid4().hex[:8]}")
        try:
            samples = _silver_view(
                spark, s, "object_samples", ids, new_silver.get("object_samples")
            )
            beats = _silver_view(spark, s, "heartbeats", ids, new_silver.get("heartbeats"))
            gold_scratch(spark, s, scratch, samples, beats)
            log.info("gold recomputed in scratch (%.1f s)", time.perf_counter() - t0)
            t0 = time.perf_counter()
            for name in GOLD_TABLES:
                label = f"gold/{name}"
                if name == "object_lifecycles":
                    report.tables[label] = refold(s, label, run)
                else:
                    new, predicate, keys, key_rows = gold_rows(spark, s, scratch, name)
                    new = new.localCheckpoint()
                    if key_rows is not None:
                        key_rows = new.select(*keys)
                    report.tables[label] = replace_rows(
                        new, paths[label], label=label, predicate=predicate, keys=keys,
                        key_rows=key_rows, check=False, **common,
                    )  # fmt: skip
                log.info("%s (%.1f s)", report.tables[label], time.perf_counter() - t0)
                t0 = time.perf_counter()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            if s.scratch is None:
                try:
                    os.rmdir(base)  # only when no other backfill uses it
                except OSError:
                    pass
    return report


def run_from_args(args: argparse.Namespace, prog: str, *, stop_spark: bool = True) -> int:
    """Parsed options -> one backfill, report on stdout; 2 on a bad range or missing tables.

    ``stop_spark``: a spark-submit job stops its session; ``qmf backfill``
    called inside a process that keeps using Spark (tests) does not.
    """
    import sys

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2

    from pipeline.bronze import tune_shuffles
    from pipeline.spark import get_spark

    spark = get_spark("qmf-backfill")
    tune_shuffles(spark)
    try:
        print(run_backfill(spark, settings), flush=True)
        return 0
    except FileNotFoundError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    finally:
        if stop_spark:
            spark.stop()
