"""Table maintenance (pipeline/lake/maintain.py): retention, compaction and vacuum, streams
running or not.

* every table of the simulated lake cut by a retention, compacted and vacuumed:
  exactly the rows before the cutoff gone from the tables with a retention, the
  others' rows unchanged, fewer files, app transactions kept, committed batches
  still skipped;
* bronze appended to, cut by a retention and compacted (bronze and silver) while
  a silver stream and a downstream reader of silver (Delta's streaming source,
  as gold reads) run: every row once, the deleted ones read all the same;
* vacuum spares the versions a checkpoint still reads; the stream restarts.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from pipeline.lake import delta
from pipeline.lake.maintain import (
    MaintainSettings,
    StreamCheckpoint,
    data_streams,
    data_tables,
    maintain,
    maintain_data,
    read_pin,
    stream_pins,
)
from pipeline.lake.retention import DEFAULTS as DEFAULT_KEEPS
from pipeline.lake.retention import RetentionPolicy
from pipeline.runtime.streaming import await_query
from pipeline.silver import SilverSettings, start_silver
from schemas.silver import OBJECT_SAMPLES
from schemas.tables import BRONZE
from tests.lake import copy_lake

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from tests.lake import Lake

pytestmark = pytest.mark.spark

RECORD_TABLES = ("object_samples", "events", "heartbeats", "method_responses")
# Vacuum keeps no removed file; rows are deleted only where a test sets a retention.
NOW = MaintainSettings(retention_hours=0, min_files=2, retention=RetentionPolicy(enabled=False))


def _rows(path: str | Path) -> list[str]:
    """Every row of the table, as sorted text: equal lists mean equal contents."""
    return sorted(repr(r) for r in delta.read_arrow(path).to_pylist())


def _txns(path: str | Path) -> dict[str, int | None]:
    """Every app transaction the log records, with its latest batch id."""
    apps: set[str] = set()
    log_dir = Path(path) / "_delta_log"
    for f in sorted(log_dir.glob("*.json")):
        for line in f.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action:
                apps.add(action["txn"]["appId"])
    return {a: delta.committed_batch(path, a) for a in sorted(apps)}


def _live(path: str | Path) -> int:
    return len(DeltaTable(str(path)).file_uris())


def _parquet_on_disk(path: str | Path) -> set[str]:
    return {p.name for p in Path(path).glob("*.parquet")}


def _operations(path: str | Path) -> list[str]:
    return [str(h.get("operation")) for h in reversed(DeltaTable(str(path)).history())]


def _keys(path: str | Path | pa.Table) -> list[tuple[Any, ...]]:
    """Record identities (bronze partition, offset, record index), duplicates kept."""
    t = path if isinstance(path, pa.Table) else delta.read_arrow(path)
    cols = [c for c in ("partition", "offset", "record_index") if c in t.column_names]
    return sorted(zip(*(t.column(c).to_pylist() for c in cols), strict=True))


def _caught_up(checkpoint: str, table: str) -> bool:
    """The query has committed a batch reading the table's last data commit."""
    writes = [
        int(h["version"]) for h in DeltaTable(table).history() if h.get("operation") == "WRITE"
    ]
    pin = read_pin(checkpoint)
    return bool(writes) and pin is not None and pin > max(writes)


def _bronze_pieces(lake: Lake, pieces_per_batch: int) -> list[pa.Table]:
    """The lake's bronze rows in offset order, cut into small appends."""
    t = delta.read_arrow(lake.bronze).sort_by([("offset", "ascending")])
    out: list[pa.Table] = []
    for b in sorted(set(t.column("batch_id").to_pylist())):
        part = t.filter(pa.compute.equal(t.column("batch_id"), b))
        size = -(-part.num_rows // pieces_per_batch)
        out.extend(part.slice(i, size) for i in range(0, part.num_rows, size))
    return out


def _append_bronze(path: str, rows: pa.Table, batch_id: int) -> None:
    """One bronze commit the way the arrow writer makes it (pyarrow file + commit_files),
    holding the table lock shared from the file to the commit as it does: maintenance
    (exclusive) neither vacuums the file in flight nor deletes rows under the commit."""
    name = f"part-{batch_id:06d}-{uuid.uuid4().hex}.parquet"
    with delta.table_lock(path):
        pq.write_table(rows.cast(BRONZE), os.path.join(path, name))
        delta.commit_files(path, [(name, {})], app_id="test-bronze", batch_id=batch_id)


def _drain_silver(spark: SparkSession, settings: SilverSettings) -> None:
    query = start_silver(spark, replace(settings, trigger="availableNow"))
    assert await_query(query, "silver", available_now=True, timeout_s=600) == 0


# --------------------------------------------------------------------------- 1


def _split(lake: Lake) -> tuple[datetime, RetentionPolicy, datetime]:
    """A retention that cuts the lake in two: every table keeps one day, counted back
    from a day after bronze's median arrival time. (cutoff, policy, now)"""
    times = sorted(delta.read_arrow(lake.bronze).column("received_at").to_pylist())
    cutoff = times[len(times) // 2]
    return cutoff, RetentionPolicy.of(dict.fromkeys(DEFAULT_KEEPS, "1d")), cutoff + timedelta(days=1)


def _at_or_after(col: Any, cutoff: datetime) -> Any:
    """The rows retention keeps: time at or after the cutoff, or none."""
    pc = pa.compute
    return pc.or_kleene(pc.is_null(col), pc.greater_equal(col, pa.scalar(cutoff, col.type)))


def _kept_rows(t: pa.Table, column: str, cutoff: datetime) -> list[str]:
    return sorted(repr(r) for r in t.filter(_at_or_after(t.column(column), cutoff)).to_pylist())


def _kept(path: str | Path, column: str, cutoff: datetime) -> list[str]:
    """``_rows`` of the rows retention keeps."""
    return _kept_rows(delta.read_arrow(path), column, cutoff)


def test_maintain_every_table_retains_compacts_and_keeps_transactions(
    sim_lake: Lake, tmp_path: Path
) -> None:
    lake = copy_lake(sim_lake, tmp_path / "lake")
    tables = data_tables(lake.root)
    assert str(lake.bronze) in tables and len(tables) >= 12
    cutoff, policy, now = _split(lake)
    rules = {t: policy.rule(t) for t in tables}
    retained = {t for t, r in rules.items() if r is not None}
    assert {Path(t).name for t in retained} == set(DEFAULT_KEEPS)
    rows = {t: _rows(t) for t in tables}
    kept = {t: _kept(t, r.column, cutoff) for t, r in rules.items() if r is not None}
    txns = {t: _txns(t) for t in tables}
    files = {t: _live(t) for t in tables}
    disk = {t: _parquet_on_disk(t) for t in tables}
    samples, events = str(lake.silver / "object_samples"), str(lake.silver / "events")
    assert set(txns[samples]) == set(txns[events]) == {"qmf-silver"}
    # the cut goes through the tables (not before or after all their rows)
    for name in ("bronze", "object_samples", "heartbeats", "statistic_rates"):
        t = next(t for t in retained if Path(t).name == name)
        assert 0 < len(kept[t]) < len(rows[t]), name

    reports = maintain_data(lake.root, replace(NOW, retention=policy, now=now))

    by_path = {r.path: r for r in reports}
    for t in tables:
        r = by_path[t]
        assert not [n for n in r.notes if n.startswith("failed")], r.line()
        assert _txns(t) == txns[t], t
        if t in retained:  # exactly the rows before the cutoff went
            assert _rows(t) == kept[t], t
            assert r.rows_deleted == len(rows[t]) - len(kept[t]), r.line()
            assert r.cutoff == cutoff
            assert ("DELETE" in _operations(t)) == (r.rows_deleted > 0), t
        else:
            assert _rows(t) == rows[t], t
            assert r.rows_deleted == 0 and r.cutoff is None
        if files[t] >= 2 or t in retained:
            # compacted into one file (far below the 128 MiB target), if a row is left
            assert r.files_before == files[t] and r.files_after == min(len(_rows(t)), 1), r.line()
            # vacuum (retention 0, no checkpoints): only the live file is left on disk
            left = _parquet_on_disk(t)
            assert len(left) == r.files_after, t
            assert {os.path.basename(v) for v in r.vacuumed} >= disk[t] - left, t
        else:
            assert r.files_after == files[t]
    assert sum(r.files_after for r in reports) < sum(files.values())
    assert files[str(lake.bronze)] == 4 and files[samples] == 4  # one file per batch
    bronze_report = by_path[str(lake.bronze)].line()
    assert f"deleted {len(rows[str(lake.bronze)]) - len(kept[str(lake.bronze)])} rows before " \
        f"{cutoff:%Y-%m-%dT%H:%M:%SZ}, compacted " in bronze_report

    # Exactly once still holds: a committed batch is skipped, the table unchanged.
    for path in (samples, events):
        last = txns[path]["qmf-silver"]
        assert last is not None
        one = delta.read_arrow(path).slice(0, 1)
        assert delta.append_parquet(path, one, app_id="qmf-silver", batch_id=last).skipped
    assert _rows(samples) == kept[samples] and _rows(events) == kept[events]

    # A second pass finds nothing to do and commits nothing (no DELETE either: the
    # files' statistics show every row at or after the cutoff).
    versions = {t: DeltaTable(t).version() for t in tables}
    again = maintain_data(lake.root, replace(NOW, retention=policy, now=now))
    assert all(r.compacted_removed == 0 and not r.vacuumed and not r.rows_deleted for r in again)
    assert {t: DeltaTable(t).version() for t in tables} == versions


def test_command_dry_run_changes_nothing_then_the_job_compacts(
    sim_lake: Lake, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from jobs.maintain import main as job
    from pipeline.cli import main as qmf

    lake = copy_lake(sim_lake, tmp_path / "lake")
    tables = data_tables(lake.root)
    versions = {t: DeltaTable(t).version() for t in tables}
    disk = {t: _parquet_on_disk(t) for t in tables}
    cutoff, policy, now = _split(lake)
    # the tables with a retention (what the others do in a pass is the first test's)
    cut = [t for t in tables if policy.rule(t) is not None]
    reports = maintain(cut, [], replace(NOW, dry_run=True, retention=policy, now=now))
    for r in reports:  # exact counts of what retention would delete
        rule = policy.rule(r.path)
        assert rule is not None
        n = delta.read_arrow(r.path).num_rows - len(_kept(r.path, rule.column, cutoff))
        assert (r.rows_deleted, r.cutoff) == (n, cutoff), r.line()
    bronze = next(r for r in reports if r.path == str(lake.bronze))
    assert bronze.line().startswith(
        f"{lake.bronze}: files 4 -> 4, would delete {bronze.rows_deleted} rows before "
        f"{cutoff:%Y-%m-%dT%H:%M:%SZ}, would compact 4 files, would vacuum 0, "
    ) and bronze.rows_deleted > 0
    assert {t: DeltaTable(t).version() for t in tables} == versions
    assert {t: _parquet_on_disk(t) for t in tables} == disk

    # The command: a keep of the file's (36 h back from now: the lake's 2027 rows stay).
    keeps = tmp_path / "keeps.toml"
    keeps.write_text('[retention]\nbronze = "36h"\n')
    argv = ["--table", str(lake.bronze), "--retention-hours", "0", "--min-files", "2"]
    t0 = datetime.now(UTC)
    assert qmf(["maintain", *argv, "--dry-run", "--table-retention", str(keeps)]) == 0
    out = capsys.readouterr().out
    m = re.search(r": files 4 -> 4, would delete 0 rows before (\S+Z), would compact 4 files, "
                  r"would vacuum 0", out)  # fmt: skip
    assert m is not None, out
    cut = datetime.fromisoformat(m[1].replace("Z", "+00:00")) + timedelta(hours=36)
    assert t0 - timedelta(seconds=1) <= cut <= datetime.now(UTC)
    assert {t: DeltaTable(t).version() for t in tables} == versions

    keeps.write_text('[retention]\nbronze = "forever"\n')
    assert job([*argv, "--table-retention", str(keeps)]) == 0
    assert f"{lake.bronze}: files 4 -> 1, compacted 4 into 1, vacuumed 4" in capsys.readouterr().out
    assert _live(lake.bronze) == 1 and len(_parquet_on_disk(lake.bronze)) == 1


DRY_RUN_CHILD = """
import sys
from pyspark import SparkContext
from pipeline.lake.maintain import MaintainSettings, maintain
from pipeline.lake.retention import RetentionPolicy

settings = MaintainSettings(retention_hours=0, min_files=2, dry_run=True,
                            retention=RetentionPolicy(enabled=False))
for r in maintain(sys.argv[1:], [], settings):
    print(r.line())
print("spark started:", SparkContext._active_spark_context is not None)
"""


def test_a_dry_run_with_nothing_spark_must_answer_starts_no_spark(sim_lake: Lake, tmp_path: Path) -> None:
    """Counting small files and finding every file in the folder live are read from the
    log and the folder: a dry run of append-only tables (no retention) starts no Spark,
    in parallel (two tables) as well."""
    import subprocess
    import sys

    lake = copy_lake(sim_lake, tmp_path / "lake")
    tables = [str(lake.bronze), str(lake.silver / "events")]
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", DRY_RUN_CHILD, *tables], cwd=repo,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "spark started: False", done.stdout
    for table, line in zip(tables, lines[:2], strict=True):
        files = _live(table)
        assert line.startswith(f"{table}: files {files} -> {files}, would compact {files} files, "
                               "would vacuum 0"), line  # fmt: skip


def test_periodic_maintenance_runs_in_the_background(sim_lake: Lake, tmp_path: Path) -> None:
    # A data folder of bronze alone: what a pass does to every table is the first test's.
    import shutil

    from pipeline.lake.maintain import PeriodicMaintenance

    root = tmp_path / "lake"
    shutil.copytree(sim_lake.bronze, root / "bronze")
    rows = _rows(root / "bronze")
    periodic = PeriodicMaintenance(root, 0.2, NOW).start()
    deadline = time.monotonic() + 120
    while len(periodic.runs) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    periodic.stop()
    assert len(periodic.runs) >= 2
    assert [[r.path for r in run] for run in periodic.runs[:2]] == [[str(root / "bronze")]] * 2
    first, second = periodic.runs[0][0], periodic.runs[1][0]
    assert (first.files_before, first.files_after) == (4, 1), first.line()
    assert (second.files_before, second.files_after) == (1, 1), second.line()
    assert _live(root / "bronze") == 1 and _rows(root / "bronze") == rows
    assert not PeriodicMaintenance(root, 0).start()._thread.is_alive()  # 0: disabled


# --------------------------------------------------------------------------- 2


def _mirror(
    spark: SparkSession, source: str, target: str, checkpoint: str, *, drain: bool = False
) -> Any:
    """A downstream stream of silver's object_samples (as gold reads silver): its rows
    appended to ``target`` exactly once per micro-batch."""
    delta.create_table(target, OBJECT_SAMPLES)

    def write(df: DataFrame, batch_id: int) -> None:
        delta.append_batch(df, target, app_id="mirror", batch_id=batch_id)

    return (
        spark.readStream.format("delta").option("skipChangeCommits", "true").load(source)
        .writeStream.foreachBatch(write).option("checkpointLocation", checkpoint)
        .trigger(**({"availableNow": True} if drain else {"processingTime": "1 second"}))
        .start()
    )  # fmt: skip


def test_retention_and_compaction_while_streams_write_keep_every_row_once(
    spark: SparkSession, sim_lake: Lake, tmp_path: Path
) -> None:
    """Bronze appended to while silver streams it and a reader streams silver's samples
    (as gold does: Delta's source, skipping change commits); meanwhile maintenance deletes
    the rows older than a cutoff from bronze and silver and compacts every table."""
    cutoff, policy, now = _split(sim_lake)
    bronze = str(tmp_path / "bronze")
    delta.create_table(bronze, BRONZE, name="bronze")
    pieces = _bronze_pieces(sim_lake, 4)
    settings = SilverSettings(
        bronze=bronze, root=str(tmp_path / "silver"), checkpoint=str(tmp_path / "ckpt-silver"),
        trigger="processingTime=1 second", max_files_per_trigger=3,
    )  # fmt: skip
    silver_tables = [settings.path(n) for n in RECORD_TABLES]
    samples = settings.path("object_samples")
    query = start_silver(spark, settings)
    mirror_table = str(tmp_path / "mirror")
    mirror = None
    streams = [StreamCheckpoint(settings.checkpoint, (bronze,))]
    passes: list[int] = []
    deleted: list[int] = []
    samples_cut = threading.Event()
    done, appended = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def append() -> None:
        try:
            for i, piece in enumerate(pieces):
                if i == len(pieces) - 1:  # the last append after a compaction of bronze,
                    # which the stream then skips (commits take ~50 ms: without the wait
                    # every append can land before maintenance's first pass ends)
                    wait_until = time.monotonic() + 240
                    while "OPTIMIZE" not in _operations(bronze) and time.monotonic() < wait_until:
                        time.sleep(0.2)
                _append_bronze(bronze, piece, i)
                time.sleep(0.7)
        except BaseException as exc:  # reported by the test below
            errors.append(exc)
        finally:
            appended.set()

    def compact() -> None:
        # Compaction only while the streams run: vacuum with retention 0 could delete
        # files a batch listed a moment ago (readers of the current version are what
        # the retention protects); it runs below, between the stream's restarts.
        try:
            while not done.is_set():
                # every silver table: the merged ones (registry, method calls) too
                root = Path(settings.root)
                every = sorted(str(p) for p in root.iterdir()) if root.is_dir() else []
                paths = [bronze, *[t for t in every if delta.table_exists(t)]]
                keeps = MaintainSettings(min_files=2, vacuum=False, retention=policy, now=now)
                reports = maintain(paths, streams, keeps)
                passes.append(sum(r.compacted_removed for r in reports))
                deleted.append(sum(r.rows_deleted for r in reports))
                if any(r.path == samples and r.rows_deleted for r in reports):
                    samples_cut.set()
                time.sleep(0.5)
        except BaseException as exc:
            errors.append(exc)

    writer = threading.Thread(target=append)
    maintainer = threading.Thread(target=compact)
    try:
        writer.start()
        maintainer.start()
        deadline = time.monotonic() + 300
        while not delta.table_exists(samples) or _live(samples) == 0:
            assert query.isActive and time.monotonic() < deadline, query.exception()
            time.sleep(0.5)
        mirror = _mirror(spark, samples, mirror_table, str(tmp_path / "ckpt-mirror"))
        writer.join(300)
        # Maintenance goes on until both streams have read everything, and retention has
        # cut silver's samples under the reader, which then reads past that commit.
        while not (_caught_up(settings.checkpoint, bronze) and samples_cut.is_set()
                   and _caught_up(str(tmp_path / "ckpt-mirror"), samples)):  # fmt: skip
            assert query.isActive and mirror.isActive and time.monotonic() < deadline + 300
            time.sleep(1.0)
        cut_at = max(int(h["version"]) for h in DeltaTable(samples).history()
                     if h.get("operation") == "DELETE")  # fmt: skip
        while (read_pin(str(tmp_path / "ckpt-mirror")) or 0) <= cut_at:
            assert mirror.isActive and time.monotonic() < deadline + 360, mirror.exception()
            time.sleep(0.5)
        done.set()
        maintainer.join(300)
        assert not errors, errors
        assert query.isActive, query.exception()
        assert mirror.isActive, mirror.exception()
        assert query.lastProgress is not None
    finally:
        done.set()
        query.stop()
        if mirror is not None:
            mirror.stop()
    assert sum(passes) > 0 and "OPTIMIZE" in _operations(bronze)
    assert sum(deleted) > 0 and "DELETE" in _operations(bronze) and "DELETE" in _operations(samples)
    # Appends landed after compactions: the stream had to skip compaction commits.
    ops = _operations(bronze)
    assert ops.index("OPTIMIZE") < len(ops) - 1 - ops[::-1].index("WRITE")
    assert any("OPTIMIZE" in _operations(t) for t in silver_tables)

    # Vacuum (retention 0) with the checkpoints' pins, then both streams restart.
    mirror_stream = StreamCheckpoint(str(tmp_path / "ckpt-mirror"), (samples,))
    final = maintain([bronze, *silver_tables], [*streams, mirror_stream],
                     replace(NOW, retention=policy, now=now))  # fmt: skip
    assert sum(len(r.vacuumed) for r in final) > 0
    _drain_silver(spark, settings)
    drain = _mirror(spark, samples, mirror_table, str(tmp_path / "ckpt-mirror"), drain=True)
    assert await_query(drain, "mirror", available_now=True, timeout_s=600) == 0

    # Every row exactly once: bronze as appended, silver as the batch-built lake's, but
    # for the rows before the cutoff, which retention deleted; the reader of silver got
    # every sample once, those deleted too (it read them before or after the deletes).
    appended = pa.concat_tables(p.cast(BRONZE) for p in pieces)
    assert _rows(bronze) == _kept_rows(appended, "received_at", cutoff)
    for name in RECORD_TABLES:
        got = _keys(settings.path(name))
        assert len(got) == len(set(got)), name
        built = delta.read_arrow(sim_lake.silver / name)
        assert got == _keys(built.filter(_at_or_after(built[DEFAULT_KEEPS[name][0]], cutoff))), name
    assert _keys(mirror_table) == _keys(sim_lake.silver / "object_samples")
    assert len(_keys(samples)) < len(_keys(mirror_table))


# --------------------------------------------------------------------------- 3


def test_vacuum_spares_what_a_checkpoint_still_reads(
    spark: SparkSession, sim_lake: Lake, tmp_path: Path
) -> None:
    bronze = str(tmp_path / "bronze")
    delta.create_table(bronze, BRONZE, name="bronze")
    b0, b1, b2, b3 = _bronze_pieces(sim_lake, 1)
    settings = SilverSettings(
        bronze=bronze, root=str(tmp_path / "silver"), checkpoint=str(tmp_path / "ckpt")
    )
    streams = [StreamCheckpoint(settings.checkpoint, (bronze,))]
    compact_only = MaintainSettings(min_files=2, vacuum=False)

    _append_bronze(bronze, b0, 0)  # v1
    _append_bronze(bronze, b1, 1)  # v2
    first = _parquet_on_disk(bronze)
    maintain([bronze], streams, compact_only)  # v3: b0, b1 -> c1
    c1 = _parquet_on_disk(bronze) - first
    _drain_silver(spark, settings)  # reads the snapshot of v3 (c1): offset {4, 0}
    assert read_pin(settings.checkpoint) == 4
    _append_bronze(bronze, b2, 2)  # v4
    _append_bronze(bronze, b3, 3)  # v5
    later = _parquet_on_disk(bronze) - first - c1
    maintain([bronze], streams, compact_only)  # v6: c1, b2, b3 -> c2
    assert _operations(bronze)[-1] == "OPTIMIZE" and _live(bronze) == 1

    # Without the checkpoint every removed file would go...
    unpinned = maintain([bronze], [], MaintainSettings(retention_hours=0, dry_run=True))
    assert {Path(f).name for f in unpinned[0].vacuumed} == first | c1 | later
    # ...with it, only b0 and b1 (removed at v3, before the checkpoint's version 4):
    # c1, b2 and b3 are live at versions 4 and 5, which the next batch reads.
    assert stream_pins([bronze], streams) == {bronze: 4}
    report = maintain([bronze], streams, NOW)[0]
    assert report.keep_from == 4
    assert {Path(f).name for f in report.vacuumed} == first
    assert c1 | later <= _parquet_on_disk(bronze)
    assert not first & _parquet_on_disk(bronze)

    # The stream restarts from its checkpoint and reads b2, b3 (not the compaction).
    _drain_silver(spark, settings)
    for name in RECORD_TABLES:
        got = _keys(settings.path(name))
        assert len(got) == len(set(got)), name
        assert got == _keys(sim_lake.silver / name), name
    # Past it, the rest may go.
    assert (read_pin(settings.checkpoint) or 0) >= 6
    rest = maintain([bronze], streams, NOW)[0]
    assert {Path(f).name for f in rest.vacuumed} == c1 | later
    assert len(_parquet_on_disk(bronze)) == 1


def test_unknown_checkpoint_with_delta_offsets_pins_everything(
    sim_lake: Lake, tmp_path: Path
) -> None:
    lake = copy_lake(sim_lake, tmp_path / "lake")
    ckpt = lake.root / "checkpoints" / "notebook"
    (ckpt / "offsets").mkdir(parents=True)
    (ckpt / "offsets" / "0").write_text(f"v1\n{{}}\n{_delta_offset(2)}\n")
    (ckpt / "offsets" / "1").write_text(f"v1\n{{}}\n{_delta_offset(3)}\n")
    streams = data_streams(lake.root)
    assert [(Path(s.path).name, s.reads) for s in streams] == [("notebook", None)]
    pins = stream_pins(data_tables(lake.root), streams)
    assert set(pins.values()) == {0} and len(pins) == len(data_tables(lake.root))


def test_vacuum_spares_the_version_a_replayed_batch_reads(tmp_path: Path) -> None:
    """``pipeline.lake.delta.read_before_batch`` reads its own table as of before a batch the checkpoint
    has not committed (a replay): that version's files survive compaction and vacuum."""

    schema = pa.schema([pa.field("k", pa.int64(), nullable=False)])
    table = str(tmp_path / "parked")
    delta.create_table(table, schema)
    qid = "0f3c9f7e-query-id"
    app = f"qmf-silver-{qid}"
    for b in range(3):  # versions 1, 2, 3
        name = f"part-{b}.parquet"
        pq.write_table(pa.table({"k": [b]}, schema=schema), os.path.join(table, name))
        delta.commit_files(table, [(name, {})], app_id=app, batch_id=b)
    ckpt = tmp_path / "ckpt"
    (ckpt / "commits").mkdir(parents=True)
    (ckpt / "metadata").write_text(json.dumps({"id": qid}) + "\n")
    for b in (0, 1):  # batch 2 is in the table, not yet in the checkpoint: a replay comes
        (ckpt / "commits" / str(b)).write_text("v1\n{}\n")
    streams = [StreamCheckpoint(str(ckpt), ())]
    assert stream_pins([table], streams) == {table: 2}

    report = maintain([table], streams, NOW)[0]  # v4: compaction; vacuum keeps version 2
    assert report.compacted_removed == 3 and report.keep_from == 2
    assert {Path(f).name for f in report.vacuumed} == set()  # all three are live at 2 or 3
    assert delta.read_before_batch(table, app, 2).column("k").to_pylist() == [0, 1]

    (ckpt / "commits" / "2").write_text("v1\n{}\n")  # the batch is checkpointed: no pin
    assert stream_pins([table], streams) == {}
    assert len(maintain([table], streams, NOW)[0].vacuumed) == 3


def test_merges_and_replaces_racing_compaction_lose_and_double_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Writers that remove files (upserts, whole-table replaces) against compaction in
    a loop. Without ``pipeline.lake.delta.table_lock`` a merge fails when a compaction
    commits first, and a replace re-adds rows the compaction rewrote (docs/maintenance.md)."""
    from pipeline.lake.maintain import TableReport, compact_table

    batches = 15  # of each writer, all racing the compaction loop (25 until 2026-12-06: CI time)
    last = batches - 1
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.int64())])
    merged, replaced = str(tmp_path / "merged"), str(tmp_path / "replaced")
    for path in (merged, replaced):
        delta.create_table(path, schema)
    done, compacted = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    reports = {merged: TableReport(merged), replaced: TableReport(replaced)}

    def write() -> None:
        try:
            for b in range(batches):
                # upsert: a new key (delta-rs adds a file), every 5th batch key 0 updated too
                # (delta-rs then rewrites the table's files)
                keys = [0, b + 1] if b % 5 == 4 else [b + 1]
                rows = pa.table({"k": keys, "v": [b] * len(keys)}, schema=schema)
                assert not delta.merge_arrow(rows, merged, keys=["k"], app_id="m", batch_id=b).skipped
                rows = pa.table({"k": [0, b + 1], "v": [b, b]}, schema=schema)
                # append two files, then replace the whole table with one (rate_state's way)
                for i in range(2):
                    name = f"extra-{b}-{i}.parquet"
                    pq.write_table(pa.table({"k": [-1], "v": [b]}, schema=schema),
                                   os.path.join(replaced, name))  # fmt: skip
                    delta.commit_files(replaced, [(name, {})], app_id=f"a{i}", batch_id=b)
                if b == batches // 2:  # one compaction of these three files before the replace, surely
                    assert compacted.wait(120)
                name = f"state-{b}.parquet"
                pq.write_table(rows, os.path.join(replaced, name))
                with delta.table_lock(replaced):  # as pipeline.gold.replace_table
                    adds = pa.table(DeltaTable(replaced).get_add_actions(flatten=True))
                    live = adds.column("path").to_pylist()
                    delta.commit_files(replaced, [(name, {})], app_id="r", batch_id=b, remove=live)
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    def compact() -> None:
        try:
            while not done.is_set():
                for path in (merged, replaced):
                    compact_table(path, MaintainSettings(min_files=2), reports[path])
                if reports[replaced].compacted_removed:
                    compacted.set()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write), threading.Thread(target=compact)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert reports[merged].compacted_removed > 0 and reports[replaced].compacted_removed > 0
    for path, expected in (
        (merged, [(0, last)] + [(k, k - 1) for k in range(1, batches + 1)]),
        (replaced, [(0, last), (batches, last)]),  # the last batch's rows only
    ):
        t = delta.read_arrow(path)
        got = sorted(zip(t.column("k").to_pylist(), t.column("v").to_pylist(), strict=True))
        assert got == expected, path


def _delta_offset(version: int, index: int = -1, snapshot: bool = False) -> str:
    return json.dumps({"sourceVersion": 1, "reservoirId": "t", "reservoirVersion": version,
                       "index": index, "isStartingVersion": snapshot})  # fmt: skip


def test_pin_of_a_replay_is_where_delta_sources_batch_starts(tmp_path: Path) -> None:
    """Delta's source offsets pin the versions a replay or the next batch reads: an
    uncommitted first batch inside its starting snapshot pins that snapshot, one past
    it every version; an uncommitted later batch the previous end; a committed batch
    its own end; gold's two sources the older."""
    ck = tmp_path / "ck"
    (ck / "offsets").mkdir(parents=True)
    (ck / "commits").mkdir()
    (ck / "offsets" / "0").write_text(f"v1\n{{}}\n{_delta_offset(5, 2, True)}\n")
    assert read_pin(str(ck)) == 5
    (ck / "offsets" / "0").write_text(f"v1\n{{}}\n{_delta_offset(9)}\n")
    assert read_pin(str(ck)) == 0  # its start was a snapshot of a version not logged
    (ck / "commits" / "0").write_text("v1\n{}\n")
    assert read_pin(str(ck)) == 9
    (ck / "offsets" / "1").write_text(f"v1\n{{}}\n{_delta_offset(12)}\n{_delta_offset(4)}\n")
    assert read_pin(str(ck)) == 9  # the replay of batch 1 starts at batch 0's end
    (ck / "commits" / "1").write_text("v1\n{}\n")
    assert read_pin(str(ck)) == 4  # the next batch: from each source's end, the older
    (ck / "offsets" / "2").write_text('v1\n{}\n{"version": 14, "index": 0}\n')  # not Delta's
    assert read_pin(str(ck)) is None


def test_the_vacuum_inventory_lists_the_data_files_spark_sees(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A pinned VACUUM's inventory: every data file under the table folder (sub-folders
    too) with its size and time, listed by Spark's file index; never the log, our
    ``_scratch`` folder or hidden files, and never the spared (pinned) files."""
    from pipeline.lake.maintain import vacuum_inventory

    root = tmp_path / "t"
    (root / "_delta_log").mkdir(parents=True)
    (root / "_delta_log" / "00000000000000000000.json").write_text("{}")
    (root / delta.SCRATCH_DIR / "qmf-x").mkdir(parents=True)
    (root / delta.SCRATCH_DIR / "qmf-x" / "part-9.parquet").write_bytes(b"s" * 9)
    (root / "sub").mkdir()
    files = {"part-1.parquet": 11, "part-2.parquet": 22, "sub/part-3.parquet": 33}
    for rel, size in files.items():
        (root / rel).write_bytes(b"x" * size)
        os.utime(root / rel, ns=(1_790_000_000_000_000_000 + size * 1_000_000,) * 2)
    (root / ".part-1.parquet.crc").write_bytes(b"c")
    # The test session: a session made here with a job's settings would be every later
    # test's in this process (test_spark_session.py::test_test_session_settings).
    rows = vacuum_inventory(spark, str(root), {"part-2.parquet"}).collect()
    got = {r["path"]: (r["length"], r["isDir"], r["modificationTime"]) for r in rows}
    assert got == {
        f"file:{root}/{rel}": (size, False, 1_790_000_000_000 + size)
        for rel, size in files.items() if rel != "part-2.parquet"
    }  # fmt: skip
    assert vacuum_inventory(spark, str(root), set()).count() == 3


def test_vacuum_waits_for_a_batch_whose_files_are_in_flight(
    spark: SparkSession, sim_lake: Lake, tmp_path: Path
) -> None:
    """A batch writes its files into the table folder before its commit lists them. A
    VACUUM at retention 0 started meanwhile waits for the batch's stage (the table
    lock), so it cannot take them for garbage; after the commit it keeps them, and it
    still deletes a file no commit lists that is not in flight."""
    import threading

    from pipeline.lake.maintain import TableReport, vacuum_table

    path = str(tmp_path / "bronze")
    delta.create_table(path, BRONZE, name="bronze")
    rows = delta.read_arrow(sim_lake.bronze).slice(0, 50)
    _append_bronze(path, rows.slice(0, 25), 0)
    orphan = Path(delta.batch_prefix(path, "killed", 0) + "-000000000000-x.parquet")
    pq.write_table(rows.slice(0, 1).cast(BRONZE), orphan)
    report = TableReport(path)
    with delta.Stage(path, "app", 1) as stage:
        w = delta.DataFileWriter(stage.file(delta.data_file_name()), BRONZE)
        w.write(rows.slice(25, 25))
        info = w.close()
        assert info is not None
        vac = threading.Thread(target=vacuum_table, args=(path, NOW, None, report))
        vac.start()
        vac.join(5)
        assert vac.is_alive() and Path(info.location).exists()  # waiting for the stage
        delta.commit_staged(path, [info], app_id="app", batch_id=1)
        stage.done = True
    vac.join(300)
    assert not vac.is_alive()
    assert [os.path.basename(p) for p in report.vacuumed] == [orphan.name]
    assert Path(info.location).exists() and not orphan.exists()
    assert sorted(r["offset"] for r in delta.read_arrow(path).to_pylist()) == sorted(
        rows.column("offset").to_pylist()
    )


def test_a_job_maintains_its_tables_between_its_batches(spark: SparkSession, tmp_path: Path) -> None:
    """``--maintain-every`` (``JobMaintenance``): after a batch, once the interval has
    passed, each of the job's tables is maintained; VACUUM spares the files live when
    the batch began (its replay would read them); a table that fails is reported, the
    job's batch is not failed; with a long interval nothing runs."""
    from pipeline.lake import snapshot, storage
    from pipeline.lake.maintain import JobMaintenance

    table, missing = str(tmp_path / "t"), str(tmp_path / "missing")
    delta.create_table(table, pa.schema([("n", pa.int64())]))

    def batch(df: DataFrame, batch_id: int) -> None:
        delta.append_parquet(table, pa.table({"n": [batch_id]}), app_id="job", batch_id=batch_id)

    job = JobMaintenance(0, NOW).around(batch, lambda: [table, missing])
    job(spark.range(1), 0)
    job(spark.range(1), 1)
    pinned = snapshot.load(table)  # the table as batch 2 begins
    job(spark.range(1), 2)
    assert [[r.path for r in run] for run in job.runs] == [[table, missing]] * 3
    first, second, third = (run[0] for run in job.runs)
    assert (first.files_before, first.files_after, first.compacted_removed) == (1, 1, 0)
    assert (second.files_before, second.files_after, second.compacted_removed) == (2, 1, 2)
    assert (third.files_before, third.files_after, third.compacted_removed) == (2, 1, 2)
    assert all(run[1].notes and run[1].notes[0].startswith("failed") for run in job.runs)
    # on disk: the files live in a version from the one batch 2 began at on
    latest = snapshot.load(table).version
    spared = {f.path for v in range(pinned.version, latest + 1) for f in snapshot.load(table, v).files}
    assert storage.data_files(table) == spared and len(spared) == 3  # batch 2's, the two compactions'
    assert sum(len(run[0].vacuumed) for run in job.runs) == 2  # batch 0's and batch 1's
    assert sorted(delta.read_arrow(table).column("n").to_pylist()) == [0, 1, 2]
    assert delta.committed_batch(table, "job") == 2

    idle = JobMaintenance(3600, NOW).around(batch, lambda: [table])
    idle(spark.range(1), 3)
    assert idle.runs == [] and sorted(delta.read_arrow(table).column("n").to_pylist()) == [0, 1, 2, 3]
