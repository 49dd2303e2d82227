"""A micro-batch of Delta's streaming source, read from the files of its plan, is exactly the
rows Spark's read of that batch holds; an old ``qmf-delta`` checkpoint is refused clearly."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from pipeline.lake.files import DataFile, MissingFileError, batch_files, read_file, read_files
from pipeline.runtime.streaming import OldCheckpointError, refuse_old_checkpoint

pytestmark = pytest.mark.spark

SCHEMA = StructType([StructField("id", LongType(), False), StructField("name", StringType())])


def append(spark: SparkSession, path: str, ids: range, parts: int = 1) -> None:
    rows = [(i, None if i % 5 == 3 else f"n{i}") for i in ids]
    spark.createDataFrame(rows, SCHEMA).repartition(parts).write.format("delta").mode(
        "append"
    ).save(path)


class Seen:
    """A ``foreachBatch`` function keeping, per batch, Spark's rows and the plan's files' rows."""

    def __init__(self, tables: list[str]) -> None:
        self.tables = tables
        self.batches: list[tuple[int, list[tuple[Any, ...]], list[list[DataFile]] | None, list[tuple[Any, ...]]]] = []

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        via_spark = sorted(tuple(r) for r in df.collect())
        files = batch_files(df, self.tables)
        direct: list[tuple[Any, ...]] = []
        if files is not None:
            for fs in files:
                t = read_files(fs, SCHEMA, ["id", "name"])
                direct += [(r["id"], r["name"]) for r in t.to_pylist()]
        self.batches.append((batch_id, via_spark, files, sorted(direct)))


def run(stream: DataFrame, fn: Seen, checkpoint: Path) -> None:
    q = (
        stream.writeStream.foreachBatch(fn)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()


def test_each_batch_read_from_its_plan_equals_sparks_read(spark: SparkSession, tmp_path: Path) -> None:
    t = str(tmp_path / "t")
    append(spark, t, range(0, 10), parts=2)  # version 0: two files
    append(spark, t, range(10, 30), parts=3)  # version 1: three files
    seen = Seen([t])
    stream = spark.readStream.format("delta").option("maxFilesPerTrigger", 2).load(t)
    run(stream, seen, tmp_path / "ck")
    # Five files, two per trigger: three batches; each read from its files is Spark's.
    assert [b for b, *_ in seen.batches] == [0, 1, 2]
    assert [len(files[0]) for _, _, files, _ in seen.batches if files] == [2, 2, 1]
    for _, via_spark, files, direct in seen.batches:
        assert files is not None and direct == via_spark
    everything = sorted(r for _, rows, _, _ in seen.batches for r in rows)
    assert everything == [(i, None if i % 5 == 3 else f"n{i}") for i in range(30)]
    # Each file once over the stream, with its size on disk.
    listed = [f for _, _, files, _ in seen.batches for f in (files or [[]])[0]]
    assert len({f.path for f in listed}) == 5
    assert all(f.size == os.path.getsize(f.path) for f in listed)
    # A restart reads only what came after, and a compaction (no data change) not at all.
    spark.sql(f"OPTIMIZE delta.`{t}`")
    append(spark, t, range(30, 33))
    seen2 = Seen([t])
    run(spark.readStream.format("delta").option("maxFilesPerTrigger", 2).load(t), seen2, tmp_path / "ck")
    assert [(b, rows) for b, rows, _, _ in seen2.batches] == [
        (3, [(30, "n30"), (31, "n31"), (32, "n32")])
    ]
    assert seen2.batches[0][3] == seen2.batches[0][1]


def test_a_union_of_two_tables_splits_its_files_by_table(spark: SparkSession, tmp_path: Path) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    append(spark, a, range(0, 4))
    append(spark, b, range(100, 103), parts=2)
    seen = Seen([a, b])
    sa = spark.readStream.format("delta").load(a).select("id", "name")
    sb = spark.readStream.format("delta").load(b).select("id", "name")
    run(sa.unionByName(sb), seen, tmp_path / "ck")
    assert len(seen.batches) == 1
    _, via_spark, files, direct = seen.batches[0]
    assert files is not None and [len(fs) for fs in files] == [1, 2]
    assert all(f.path.startswith(a + "/") for f in files[0])
    assert all(f.path.startswith(b + "/") for f in files[1])
    assert direct == via_spark and len(direct) == 7


def test_a_dataframe_that_is_not_a_streams_batch_has_no_files(spark: SparkSession, tmp_path: Path) -> None:
    t = str(tmp_path / "t")
    append(spark, t, range(0, 4))
    # A batch read with a filter: its files would hold rows the DataFrame does not.
    assert batch_files(spark.read.format("delta").load(t).where(F.col("id") > 1), [t]) is None
    with pytest.raises(StreamingQueryException, match=r"ValueError: the batch reads .* outside"):
        seen = Seen([str(tmp_path / "other")])
        run(spark.readStream.format("delta").load(t), seen, tmp_path / "ck")


def test_read_file_fills_later_columns_and_reports_a_vacuumed_file(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    path = tmp_path / "f.parquet"
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64())}), path)
    wanted = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())])
    got = pa.Table.from_batches(list(read_file(DataFile(str(path), path.stat().st_size), wanted)))
    assert got.to_pylist() == [{"id": 1, "name": None}, {"id": 2, "name": None}]
    with pytest.raises(MissingFileError, match="gone"):
        list(read_file(DataFile(str(tmp_path / "gone.parquet"), 1), wanted))


def _old_entry(checkpoint: Path, batch_id: int, *ends: dict[str, Any]) -> None:
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    lines = ["v1", json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}})]
    lines += [json.dumps(e) for e in ends]
    (checkpoint / "offsets" / str(batch_id)).write_text("\n".join(lines))


def test_an_old_qmf_delta_checkpoint_is_refused_with_what_to_do(tmp_path: Path) -> None:
    done = tmp_path / "done"
    _old_entry(done, 6, {"version": 11, "index": 0, "from": {"version": 9, "index": 0}},
               {"version": 4, "index": 0})  # fmt: skip
    with pytest.raises(OldCheckpointError) as err:
        refuse_old_checkpoint(str(done), "gold", ["object_samples", "heartbeats"])
    assert str(err.value) == (
        f"gold: checkpoint {done} holds the offsets of the previous release's qmf-delta "
        "source (batch 6); Delta's streaming source cannot resume them: move it aside and "
        "start with a new checkpoint and --starting-version object_samples=11 "
        "--starting-version heartbeats=4 (the first version it has not read)"
    )
    inside = tmp_path / "inside"
    _old_entry(inside, 2, {"version": 5, "index": 3})
    with pytest.raises(OldCheckpointError, match=r"finish its stream first .* bronze \(inside version 5\)"):
        refuse_old_checkpoint(str(inside), "silver", ["bronze"])
    # Delta's own offsets, no checkpoint, an empty one: nothing to refuse.
    ok = tmp_path / "ok"
    _old_entry(ok, 0, {"sourceVersion": 1, "reservoirId": "x", "reservoirVersion": 3, "index": -1,
                       "isStartingVersion": False})  # fmt: skip
    refuse_old_checkpoint(str(ok), "silver", ["bronze"])
    refuse_old_checkpoint("", "silver", ["bronze"])
    refuse_old_checkpoint(str(tmp_path / "none"), "silver", ["bronze"])
