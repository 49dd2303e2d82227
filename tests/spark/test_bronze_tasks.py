"""Bronze's task path: Spark tasks write the landing ranges, the driver commits once.

Same landing -> identical bronze tables through Spark tasks and driver threads
(the Spark-rows writer is checked against the landed messages in
test_bronze_job); a replayed batch commits nothing twice and leaves no
file behind; what a killed attempt left in staging is removed by its replay.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from pipeline.bronze import (
    BronzeSettings,
    checkpoint_query_id,
    choose_writer,
    start_bronze,
    write_ranges_arrow,
    write_ranges_tasks,
)
from pipeline.bronze.tasks import Unit, landing_bytes, plan_units
from pipeline.lake import delta
from pipeline.source import LandingRange, split_ranges
from receivers.landing import LandingLog, LandingWriter
from schemas.tables import BRONZE
from tests.lake import stray_files
from tests.spark.test_bronze_job import content, land_copies
from tests.spark.test_source import land

pytestmark = pytest.mark.spark


def R(partition: str, start: int, end: int) -> LandingRange:
    return LandingRange("/l", partition, start, end)


# ---------------------------------------------------------------- planning (no Spark)


def test_plan_units_cuts_large_ranges_and_groups_small_ones() -> None:
    ranges = [R("b", 0, 30), R("a", 10, 100), R("c", 5, 15)]
    got = plan_units(ranges, 3, min_records=1)
    # 130 records over 3 tasks: 44 each, in partition and offset order.
    assert got == [
        Unit((R("a", 10, 54),)),
        Unit((R("a", 54, 98),)),
        Unit((R("a", 98, 100), R("b", 0, 30), R("c", 5, 15))),
    ]
    assert [u.records for u in got] == [44, 44, 42]


def test_plan_units_bounds() -> None:
    ranges = [R("a", 0, 100), R("b", 0, 50)]
    # A task's fixed cost: no unit below min_records unless the batch is smaller.
    assert plan_units(ranges, 8, min_records=100) == [
        Unit((R("a", 0, 75),)),
        Unit((R("a", 75, 100), R("b", 0, 50))),
    ]
    assert plan_units(ranges, 8, min_records=1_000) == [Unit((R("a", 0, 100), R("b", 0, 50)))]
    # A task's memory: no unit above max_records, whatever the parallelism.
    assert plan_units(ranges, 1, max_records=60, min_records=1) == [
        Unit((R("a", 0, 60),)),
        Unit((R("a", 60, 100), R("b", 0, 20))),
        Unit((R("b", 20, 50),)),
    ]
    assert plan_units([R("a", 5, 5)], 4) == []
    assert plan_units([], 4) == []


def test_landing_bytes_and_the_choice_of_writer(tmp_path: Path) -> None:
    root = tmp_path / "landing"
    land(root, "a", [10, 30])
    land(root, "b", [20])
    segs = {p.name: p.stat().st_size for p in root.rglob("*.arrow")}
    a0, a1 = (segs[f"{0:020d}-{9:020d}.arrow"], segs[f"{10:020d}-{39:020d}.arrow"])
    b0 = segs[f"{0:020d}-{19:020d}.arrow"]
    whole = split_ranges(str(root), {}, {"a": 40, "b": 20}, 100_000)
    assert landing_bytes(whole) == a0 + a1 + b0
    # Segments partly inside count pro rata by records: a[5:25] is half of a0
    # and 15 of a1's 30 records.
    part = [LandingRange(str(root), "a", 5, 25)]
    assert landing_bytes(part) == int(a0 * 5 / 10 + a1 * 15 / 30)

    def settings(writer: str, driver_max_bytes: int) -> BronzeSettings:
        return BronzeSettings(
            landing=str(root), table="t", checkpoint="c", writer=writer,
            driver_max_bytes=driver_max_bytes,
        )  # fmt: skip

    n = a0 + a1 + b0
    assert choose_writer(settings("auto", n), whole) == "arrow"
    assert choose_writer(settings("auto", n - 1), whole) == "tasks"
    assert choose_writer(settings("tasks", n), whole) == "tasks"
    assert choose_writer(settings("arrow", 0), whole) == "arrow"
    assert choose_writer(settings("spark", n), whole) == "spark"
    assert choose_writer(settings("auto", n), None) == "spark"  # rows only in the DataFrame
    assert BronzeSettings(landing="l", table="t", checkpoint="c").writer == "auto"
    with pytest.raises(ValueError, match="expected one of auto, tasks, arrow, spark"):
        BronzeSettings(landing="l", table="t", checkpoint="c", writer="driver")


# ---------------------------------------------------------------- Spark tasks


def _landing(root: Path) -> tuple[list[Any], list[LandingRange]]:
    """24,000 records: partition a in segments of 5,000 (a task cuts one in the
    middle), b, and c's matched redeliveries (left out); twins kept."""
    a = land(root, "a", [5_000] * 4)
    b = land(root, "b", [3_998])
    LandingWriter(root, "b", fsync=False).append([b[7], b[7]])  # twins: two rows each
    b += [b[7], b[7]]
    land_copies(root, "c", a[100:300], "a", 100)
    ranges = split_ranges(str(root), {}, LandingLog(root).end_offsets(), 100_000)
    return a + b, ranges


def _rows(table: str) -> list[dict[str, Any]]:
    out = delta.read_arrow(table)
    assert out.schema.names == BRONZE.names
    return sorted(out.to_pylist(), key=lambda r: (r["partition"], r["offset"]))


def _tasks_of(spark: SparkSession, group: str) -> list[int]:
    tracker = spark.sparkContext.statusTracker()
    out = []
    for job in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job)
        assert info is not None
        for stage in info.stageIds:
            st = tracker.getStageInfo(stage)
            assert st is not None
            out.append(st.numTasks)
    return out


def test_tasks_and_driver_write_identical_tables(spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "landing"
    msgs, ranges = _landing(root)
    tables = {name: str(tmp_path / name) for name in ("tasks", "arrow")}
    for t in tables.values():
        delta.create_table(t, BRONZE, name="bronze")
    sc = spark.sparkContext
    sc.setJobGroup("bronze-tasks-test", "bronze task path")
    try:
        got = write_ranges_tasks(spark, ranges, tables["tasks"], app_id="app", batch_id=4)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    # One Spark job of 2 tasks (defaultParallelism): a[0:12100], a[12100:20000] + b + c.
    assert sc.defaultParallelism == 2
    assert _tasks_of(spark, "bronze-tasks-test") == [2]
    assert (got.skipped, got.files_added, got.rows) == (False, 2, 24_000)
    got = write_ranges_arrow(ranges, tables["arrow"], app_id="app", batch_id=4)
    assert (got.skipped, got.files_added, got.rows) == (False, 2, 24_000)

    rows = _rows(tables["tasks"])
    assert rows == _rows(tables["arrow"])
    assert len(rows) == 24_000
    assert sorted(
        (r["msg_key"], r["routing_key"], r["subject"], r["message_id"], r["correlation_id"],
         r["app_id"], r["content_type"], sorted(r["application_properties"]), r["body"])
        for r in rows
    ) == sorted(content(m) for m in msgs)  # fmt: skip
    assert {r["batch_id"] for r in rows} == {4}
    assert [(r["partition"], r["offset"]) for r in rows] == [
        *(("a", i) for i in range(20_000)), *(("b", i) for i in range(4_000))
    ]
    for t in tables.values():
        assert stray_files(t) == []


def test_replay_commits_nothing_twice(spark: SparkSession, tmp_path: Path) -> None:
    root, table = tmp_path / "landing", str(tmp_path / "bronze")
    _msgs, ranges = _landing(root)
    delta.create_table(table, BRONZE, name="bronze")
    first = write_ranges_tasks(spark, ranges, table, app_id="app", batch_id=0)
    files = sorted(os.listdir(table))
    again = write_ranges_tasks(spark, ranges, table, app_id="app", batch_id=0)
    driver = write_ranges_arrow(ranges, table, app_id="app", batch_id=0)
    assert (first.skipped, again.skipped, driver.skipped) == (False, True, True)
    assert again.version == driver.version == first.version
    assert sorted(os.listdir(table)) == files  # the replays' files were removed
    assert len(files) == 4 and {"_delta_log", delta.LOCK_FILE} <= set(files)
    commits = [b for _app, b, _v in delta.app_transactions(table)]
    assert commits.count(0) == 1
    assert delta.read_arrow(table).num_rows == 24_000


def test_a_killed_attempts_files_are_removed_by_the_replays_commit(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A crash between the tasks' writes and the commit leaves files in the table folder
    that no commit lists: the batch's next attempt removes them once it has committed
    (only its batch's: another batch's, even batch 10 against 1, and another app's stay)."""
    root, table = tmp_path / "landing", str(tmp_path / "bronze")
    _msgs, ranges = _landing(root)
    delta.create_table(table, BRONZE, name="bronze")
    mine = Path(delta.batch_prefix(table, "app", 1) + "-deadbeef0001-a-0-leftover.parquet")
    other = Path(delta.batch_prefix(table, "app", 10) + "-deadbeef0010-a-0-leftover.parquet")
    stranger = Path(delta.batch_prefix(table, "app2", 1) + "-deadbeef0002-a-0-leftover.parquet")
    for f in (mine, other, stranger):
        f.write_bytes(b"PAR1 half a file")
    got = write_ranges_tasks(spark, ranges, table, app_id="app", batch_id=1)
    assert (got.skipped, got.rows) == (False, 24_000)
    assert not mine.exists() and other.exists() and stranger.exists()
    assert stray_files(table) == sorted([other.name, stranger.name])
    assert delta.read_arrow(table).num_rows == 24_000
    live = sorted(p.name for p in Path(table).iterdir() if p.suffix == ".parquet")
    assert len(live) == 4 and sum("leftover" in n for n in live) == 2


def test_stream_through_tasks_equals_stream_on_driver(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The bronze stream, writer ``tasks`` against ``arrow``: same batches, same rows."""
    root = tmp_path / "landing"
    land(root, "a", [700, 700])
    land(root, "b", [500])
    out: dict[str, pa.Table] = {}
    for writer in ("tasks", "arrow"):
        table, ck = str(tmp_path / f"bronze-{writer}"), str(tmp_path / f"ck-{writer}")
        settings = BronzeSettings(
            landing=str(root), table=table, checkpoint=ck, max_records_per_trigger=800,
            writer=writer,
        )  # fmt: skip
        q = start_bronze(spark, settings)
        try:
            assert q.awaitTermination(300)
        finally:
            q.stop()
        assert q.exception() is None
        app_id = f"qmf-bronze-{checkpoint_query_id(ck)}"
        assert delta.committed_batch(table, app_id) == 2  # 1,900 rows, 800 per batch
        out[writer] = delta.read_arrow(table)
    rows = {w: sorted(t.to_pylist(), key=lambda r: (r["partition"], r["offset"])) for w, t in out.items()}
    assert rows["tasks"] == rows["arrow"]
    assert len(rows["tasks"]) == 1_900
    assert sorted({r["batch_id"] for r in rows["tasks"]}) == [0, 1, 2]
