"""A table version as the jobs' drivers read it (``pipeline.lake.snapshot``): delta-spark's
snapshot where a Spark session runs, equal in every field to delta-rs's reading of the
same version; delta-rs where none runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession

from pipeline.lake import delta, snapshot

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), False),
        pa.field("name", pa.string()),
        pa.field("at", pa.timestamp("us", tz="UTC")),
        pa.field("score", pa.float64()),
        pa.field("tags", pa.map_(pa.string(), pa.string())),
        pa.field("day", pa.string(), False),
    ]
)


def rows(batch: int, n: int = 3) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {
                "id": 10 * batch + i,
                "name": None if i == 1 else f"n{batch}-{i}",
                "at": datetime(2026, 12, 5, 10, batch, i, 250_000 + i, tzinfo=UTC),
                "score": float(i) / 4,
                "tags": [("k", str(i))],
                "day": f"d{i % 2}",
            }
            for i in range(n)
        ],
        schema=SCHEMA,
    )


def partitioned(spark: SparkSession, path: Path, batches: int) -> None:
    """A table partitioned by ``day``: batches through delta-spark's writer, one file per
    batch and day."""
    delta.create_table(path, SCHEMA, ["day"])
    for b in range(batches):
        append(spark, path, rows(b), "a", b)


def append(spark: SparkSession, path: Path, t: pa.Table, app_id: str, batch_id: int) -> None:
    delta.append_batch(spark.createDataFrame(t).coalesce(1), path, app_id=app_id, batch_id=batch_id)


def stats_by_path(snap: snapshot.Snapshot) -> dict[str, dict[str, object]]:
    t = snap.stats()
    names = [c for c in t.column_names if c != "path"]
    return {
        p: {c: t.column(c)[i].as_py() for c in names}
        for i, p in enumerate(t.column("path").to_pylist())
    }


def assert_same(ours: snapshot.Snapshot, theirs: snapshot.Snapshot) -> None:
    assert (ours.engine, theirs.engine) == ("delta-spark", "delta-rs")
    assert ours.version == theirs.version
    assert ours.schema.equals(theirs.schema)
    assert ours.partition_columns == theirs.partition_columns
    assert ours.protocol == theirs.protocol
    assert sorted((f.path, f.size, f.modification_time, f.partition_values) for f in ours.files) == sorted(
        (f.path, f.size, f.modification_time, f.partition_values) for f in theirs.files
    )
    mine, rs = stats_by_path(ours), stats_by_path(theirs)
    assert mine.keys() == rs.keys()
    for p, stats in mine.items():
        # every statistic delta-rs gives, ours gives alike (delta-rs adds none we lack)
        shared = {k: v for k, v in rs[p].items() if k in stats}
        assert {k: stats[k] for k in shared} == shared
        assert {k for k, v in rs[p].items() if v is not None} <= set(stats)


def test_delta_spark_reads_a_version_as_delta_rs_does(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "t"
    partitioned(spark, path, 3)
    append(spark, path, rows(7), "b", 4)
    ours = snapshot.load(path)
    theirs = snapshot.load(path, engine="delta-rs")
    assert_same(ours, theirs)
    assert ours.version == 4 and len(ours.files) == 8  # 2 days x 4 batches
    assert (ours.app_version("a"), ours.app_version("b"), ours.app_version("c")) == (2, 4, None)
    assert (theirs.app_version("a"), theirs.app_version("b"), theirs.app_version("c")) == (2, 4, None)
    stats = stats_by_path(ours)
    first = next(s for p, s in stats.items() if s["min.id"] == 0)
    assert (first["num_records"], first["max.id"], first["null_count.name"]) == (2, 2, 0)
    # delta-spark truncates timestamps to the millisecond in its statistics
    assert first["min.at"] == datetime(2026, 12, 5, 10, 0, 0, 250_000, tzinfo=UTC)
    assert first["max.at"] == datetime(2026, 12, 5, 10, 0, 2, 250_000, tzinfo=UTC)
    older = snapshot.load(path, 1)
    assert_same(older, snapshot.load(path, 1, engine="delta-rs"))
    assert older.version == 1 and len(older.files) == 2 and older.app_version("a") == 0


def test_a_table_past_the_checksum_listing_reads_alike(spark: SparkSession, tmp_path: Path) -> None:
    """Past ``allFilesInCrc.thresholdNumFiles`` delta-spark's checksum lists no files: they
    come from its state reconstruction (a Spark job), with the same result."""
    key = "spark.databricks.delta.allFilesInCrc.thresholdNumFiles"
    spark.conf.set(key, "2")
    try:
        path = tmp_path / "t"
        partitioned(spark, path, 3)
    finally:
        spark.conf.unset(key)
    ours = snapshot.load(path)
    checksum = ours._jsnap.checksumOpt()
    assert checksum.isDefined() and not checksum.get().allFiles().isDefined()
    assert len(ours.files) == 6
    assert_same(ours, snapshot.load(path, engine="delta-rs"))


def test_a_version_is_read_once(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "t"
    partitioned(spark, path, 1)
    first = snapshot.load(path)
    files = first.files
    again = snapshot.load(path)
    assert again is first and again.files is files
    append(spark, path, rows(1), "a", 1)
    after = snapshot.load(path)
    assert after is not first and after.version == first.version + 1
    assert len(after.files) == len(files) + 2 and after.app_version("a") == 1


def test_a_driver_thread_reads_through_delta_spark(spark: SparkSession, tmp_path: Path) -> None:
    """A thread of the driver has no active session of its own: it still reads with
    delta-spark (the process's session), never silently with delta-rs."""
    path = tmp_path / "t"
    partitioned(spark, path, 1)
    got: list[snapshot.Snapshot] = []
    t = threading.Thread(target=lambda: got.append(snapshot.load(path)))
    t.start()
    t.join()
    assert got[0].engine == "delta-spark" and got[0].version == 1


def test_the_spark_less_readers_start_no_jvm(spark: SparkSession, tmp_path: Path) -> None:
    """Where no Spark session runs (``qmf top``, the summary) the same calls read with
    delta-rs, and pyspark is not even imported."""
    path = tmp_path / "t"
    partitioned(spark, path, 2)
    code = (
        "import json, sys\n"
        "from pipeline.lake import delta, snapshot\n"
        f"s = snapshot.load({str(path)!r})\n"
        f"t = delta.read_arrow({str(path)!r})\n"
        "print(json.dumps([s.engine, s.version, t.num_rows, sorted(t.column('id').to_pylist()),"
        " 'pyspark' in sys.modules]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert json.loads(out.stdout) == ["delta-rs", 2, 6, [0, 1, 2, 10, 11, 12], False]
