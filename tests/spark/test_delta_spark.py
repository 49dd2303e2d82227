"""delta-spark in every session: the tables the jobs write read alike in delta-spark,
delta-rs and polars, with Delta's own history, time travel, streaming reads, merge,
OPTIMIZE and VACUUM, in the session the jobs use and under this venv's spark-submit."""

from __future__ import annotations

import math
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable as RsTable
from pyspark.sql import SparkSession

from pipeline.lake import delta
from pipeline.runtime.jars import DELTA_CATALOG, DELTA_EXTENSION, jar_paths
from schemas.tables import TABLES
from tests.lake import Lake
from tests.submit import SPARK_SUBMIT, spark_submit_env

pytestmark = pytest.mark.spark

# Every table a simulated run writes, by its folder under the lake.
LAKE_TABLES = {
    "bronze": "bronze",
    **{f"silver/{n}": n for n in ("object_samples", "events", "heartbeats", "agents",
                                  "schema_registry", "quarantine", "parked")},
    **{f"gold/{n}": n for n in ("statistic_rates", "rate_state", "object_lifecycles", "lifecycle_state",
                                "agent_liveness")},
}  # fmt: skip


def _rows(table: pa.Table) -> list[str]:
    """A table's rows as sorted text, maps as sorted pairs: equal for equal contents."""

    def norm(v: Any) -> Any:
        if isinstance(v, list) and v and isinstance(v[0], tuple):
            return sorted(v)
        if isinstance(v, dict):
            return {k: norm(x) for k, x in sorted(v.items())}
        return v

    return sorted(repr({k: norm(v) for k, v in sorted(r.items())}) for r in table.to_pylist())


def test_every_session_loads_delta(spark: SparkSession) -> None:
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.sql.extensions") == DELTA_EXTENSION
    assert conf.get("spark.sql.catalog.spark_catalog") == DELTA_CATALOG
    assert conf.get("spark.jars").split(",") == [str(p) for p in jar_paths()]


@pytest.mark.parametrize("rel", sorted(LAKE_TABLES))
def test_each_table_reads_alike_in_delta_spark_and_delta_rs(
    spark: SparkSession, sim_lake: Lake, rel: str
) -> None:
    path = str(sim_lake.root / rel)
    theirs = spark.read.format("delta").load(path)
    ours = delta.read_arrow(path)
    assert theirs.columns == TABLES[LAKE_TABLES[rel]].names == ours.column_names
    got = theirs.toArrow()
    assert got.num_rows == ours.num_rows > 0 or rel in ("silver/quarantine", "silver/parked")
    assert _rows(got) == _rows(ours)
    assert pl.read_delta(path).height == ours.num_rows


def test_history_and_time_travel_match_delta_rs(spark: SparkSession, sim_lake: Lake) -> None:
    path = str(sim_lake.silver / "object_samples")
    rs = RsTable(path)
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()
    assert [r.version for r in history] == list(range(rs.version() + 1))
    assert rs.version() >= 3  # one commit per bronze batch at least
    for v in (1, rs.version() - 1):
        old = spark.read.format("delta").option("versionAsOf", v).load(path)
        assert old.count() == delta.read_arrow(path, version=v).num_rows


def test_a_delta_stream_reads_every_row_once_with_admission_control(
    spark: SparkSession, sim_lake: Lake, tmp_path: Path
) -> None:
    path = str(sim_lake.silver / "object_samples")
    files = len(RsTable(path).file_uris())
    q = (
        spark.readStream.format("delta").option("maxFilesPerTrigger", 2).load(path)
        .writeStream.format("memory").queryName("delta_stream_rows")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True).start()
    )  # fmt: skip
    q.awaitTermination()
    batches = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert len(batches) == math.ceil(files / 2)
    got = spark.table("delta_stream_rows").toArrow()
    assert _rows(got) == _rows(delta.read_arrow(path))


def test_merge_optimize_and_vacuum_leave_a_table_delta_rs_and_polars_read(
    spark: SparkSession, sim_lake: Lake, tmp_path: Path
) -> None:
    from delta.tables import DeltaTable

    src = sim_lake.gold / "object_lifecycles"
    path = str(tmp_path / "object_lifecycles")
    shutil.copytree(src, path)
    before = delta.read_arrow(path)

    # A merge that marks every live row as lost (Delta's DeltaTable API), then an
    # append through Spark's Delta writer: two data files, and two removed ones.
    live = before.filter(pa.compute.equal(before["state"], "live")).num_rows
    assert live > 0
    (
        DeltaTable.forPath(spark, path).alias("t")
        .merge(spark.read.format("delta").load(path).alias("s"),
               "t.agent = s.agent AND t.object_id = s.object_id AND t.create_ns = s.create_ns")
        .whenMatchedUpdate(condition="t.state = 'live'", set={"state": "'lost'"})
        .execute()
    )  # fmt: skip
    deleted = spark.read.format("delta").load(path).where("state = 'deleted'")
    n_deleted = deleted.count()
    assert n_deleted > 0
    deleted.write.format("delta").mode("append").save(path)
    assert len(RsTable(path).file_uris()) == 2
    spark.sql(f"OPTIMIZE delta.`{path}`")
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    spark.sql(f"VACUUM delta.`{path}` RETAIN 0 HOURS")
    spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")

    rs = RsTable(path)
    assert len(rs.file_uris()) == 1
    assert [p.name for p in Path(path).glob("*.parquet")] == [Path(rs.file_uris()[0]).name]
    assert [h["operation"] for h in rs.history(4)] == ["VACUUM END", "VACUUM START", "OPTIMIZE", "WRITE"]
    assert delta.read_arrow(path).num_rows == before.num_rows + n_deleted
    states = dict(pl.read_delta(path)["state"].value_counts().rows())
    want = dict(pl.from_arrow(before)["state"].value_counts().rows())  # type: ignore[union-attr]
    assert states == {"lost": want.get("lost", 0) + live, "deleted": 2 * want["deleted"]}


def test_spark_submit_of_this_venv_loads_delta(sim_lake: Lake, tmp_path: Path) -> None:
    """tools/setup.sh writes the JARs into this venv's spark-defaults.conf: a job
    submitted with its spark-submit reads Delta with no --jars of its own."""
    script = tmp_path / "count.py"
    script.write_text(textwrap.dedent(f"""
        from pyspark.sql import SparkSession
        spark = SparkSession.builder.getOrCreate()
        print("ROWS", spark.read.format("delta").load({str(sim_lake.gold / "agent_liveness")!r}).count())
    """))  # fmt: skip
    out = subprocess.run(
        [SPARK_SUBMIT, "--master", "local[1]", "--conf", "spark.ui.enabled=false", str(script)],
        env=spark_submit_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("ROWS ")]
    assert rows == [f"ROWS {delta.read_arrow(sim_lake.gold / 'agent_liveness').num_rows}"]


def test_a_column_added_to_a_streamed_table_reaches_its_streams(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A release that adds a nullable column (``create_table`` evolves the table at its
    start-up, before its streams start): the restarted stream reads it, rows before it
    read null, no row twice. Added under a running stream, Delta stops the stream with
    its schema-change error and the restarted one goes on (docs/delta-source.md)."""
    import time

    from pyspark.sql import DataFrame

    path = tmp_path / "t"
    v1 = pa.schema([pa.field("id", pa.int64(), False)])
    v2 = pa.schema([*v1, pa.field("note", pa.string())])
    v3 = pa.schema([*v2, pa.field("more", pa.int32())])
    delta.create_table(path, v1)
    delta.append_arrow(pa.table({"id": [1, 2]}, schema=v1), path, app_id="w", batch_id=0)
    seen: list[dict[str, Any]] = []

    def batch(df: DataFrame, _batch_id: int) -> None:
        seen.extend(r.asDict() for r in df.collect())

    def start(**trigger: Any) -> Any:
        return (
            spark.readStream.format("delta").load(str(path)).writeStream.foreachBatch(batch)
            .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(**trigger).start()
        )  # fmt: skip

    start(availableNow=True).awaitTermination()
    delta.create_table(path, v2)  # the new release's start-up
    delta.append_arrow(pa.table({"id": [3], "note": ["n3"]}, schema=v2), path, app_id="w", batch_id=1)
    start(availableNow=True).awaitTermination()
    assert sorted((r["id"], r.get("note")) for r in seen) == [(1, None), (2, None), (3, "n3")]

    running = start(processingTime="200 milliseconds")
    time.sleep(2)
    delta.create_table(path, v3)
    delta.append_arrow(
        pa.table({"id": [4], "note": ["n4"], "more": [7]}, schema=v3), path, app_id="w", batch_id=2
    )
    with pytest.raises(Exception, match="DELTA_SCHEMA_CHANGED") as stopped:
        running.awaitTermination(120)
    assert len(seen) == 3, stopped.value
    start(availableNow=True).awaitTermination()
    assert sorted((r["id"], r.get("note"), r.get("more")) for r in seen) == [
        (1, None, None), (2, None, None), (3, "n3", None), (4, "n4", 7)
    ]
