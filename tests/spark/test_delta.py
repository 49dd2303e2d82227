"""The Delta layer on real Spark and real Delta tables under tmp_path."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from pipeline.lake import snapshot
from pipeline.lake.delta import (
    FILE_COL,
    MAX_STAT_STRING_BYTES,
    DeltaLayerError,
    SchemaMismatchError,
    append_arrow,
    append_batch,
    batch_prefix,
    commit_files,
    commit_stamp,
    committed_batch,
    create_table,
    file_keys,
    is_latest,
    iter_batches,
    latest_stamp,
    live_files,
    merge_arrow,
    no_dictionary,
    prune_files,
    read_arrow,
    read_delta,
    read_table,
    sweep_committed_batch,
    table_schema,
)
from schemas.tables import BRONZE

pytestmark = pytest.mark.spark

TS = pa.timestamp("us", tz="UTC")
EVENTS = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("name", pa.string()),
        pa.field("ts", TS, nullable=False),
        pa.field("day", pa.date32(), nullable=False),
        pa.field("props", pa.map_(pa.string(), pa.string())),
        pa.field("body", pa.binary()),
    ]
)


def ts(second: int) -> datetime:
    return datetime(2024, 5, 1, 12, 0, second, 250001, tzinfo=UTC)


def event(i: int, name: str | None = None, day: int = 1) -> dict[str, Any]:
    return {
        "id": i,
        "name": name if name is not None else f"n{i}",
        "ts": ts(i % 60),
        "day": date(2024, 5, day),
        "props": {"k": str(i)},
        "body": bytes([i % 256]) * 3,
    }


def frame(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    table = pa.Table.from_pylist(rows, schema=EVENTS)
    return spark.createDataFrame(table)


def data_files(path: Path) -> set[str]:
    return {
        str(p.relative_to(path)) for p in path.rglob("*.parquet") if "_delta_log" not in p.parts
    }


def sorted_rows(table: pa.Table, key: str = "id") -> list[dict[str, Any]]:
    return sorted(table.to_pylist(), key=lambda r: r[key])


def spark_rows(df: DataFrame, key: str = "id") -> list[dict[str, Any]]:
    rows = [r.asDict(recursive=True) for r in df.collect()]
    for r in rows:
        if r.get("body") is not None:
            r["body"] = bytes(r["body"])
        if r.get("ts") is not None:
            r["ts"] = r["ts"].replace(tzinfo=UTC) if r["ts"].tzinfo is None else r["ts"]
    return sorted(rows, key=lambda r: r[key])


def arrow_as_spark_rows(table: pa.Table) -> list[dict[str, Any]]:
    rows = sorted_rows(table)
    for r in rows:
        if r.get("props") is not None:
            r["props"] = dict(r["props"])
    return rows


# ---------------------------------------------------------------------------


def test_append_two_batches_exact_rows(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "events"
    create_table(path, EVENTS)
    r0 = append_batch(frame(spark, [event(i) for i in range(5)]), path, app_id="job", batch_id=0)
    r1 = append_batch(frame(spark, [event(i) for i in range(5, 8)]), path, app_id="job", batch_id=1)
    assert (r0.skipped, r0.version, r0.rows) == (False, 1, 5)
    assert (r1.skipped, r1.version, r1.rows) == (False, 2, 3)
    assert committed_batch(path, "job") == 1
    got = read_arrow(path)
    assert got.schema == EVENTS
    expected = pa.Table.from_pylist([event(i) for i in range(8)], schema=EVENTS)
    assert sorted_rows(got) == sorted_rows(expected)
    # No staging leftovers, and the version 1 view holds the first batch only.
    assert not (path / "_staging").exists()
    assert sorted(r["id"] for r in read_arrow(path, version=1).to_pylist()) == [0, 1, 2, 3, 4]


def test_replayed_batch_commits_nothing(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "events"
    create_table(path, EVENTS)
    append_batch(frame(spark, [event(1), event(2)]), path, app_id="job", batch_id=7)
    version = DeltaTable(str(path)).version()
    files = data_files(path)
    log = sorted(os.listdir(path / "_delta_log"))
    replay = append_batch(
        frame(spark, [event(1), event(2), event(3)]), path, app_id="job", batch_id=7
    )
    older = append_batch(frame(spark, [event(9)]), path, app_id="job", batch_id=3)
    assert replay.skipped and older.skipped
    assert replay.version == version
    assert DeltaTable(str(path)).version() == version
    assert data_files(path) == files
    assert sorted(os.listdir(path / "_delta_log")) == log
    assert sorted(r["id"] for r in read_arrow(path).to_pylist()) == [1, 2]
    # Another app id is independent.
    other = append_batch(frame(spark, [event(3)]), path, app_id="other", batch_id=7)
    assert not other.skipped
    assert sorted(r["id"] for r in read_arrow(path).to_pylist()) == [1, 2, 3]


def test_a_replay_of_a_committed_batch_sweeps_what_other_attempts_left(tmp_path: Path) -> None:
    """The attempt that committed a batch may die before removing the files of the
    batch's killed attempts (CI-29: one was left). The replay that finds the batch
    committed removes them, and keeps the commit's own files and other batches'."""
    path = tmp_path / "events"
    create_table(path, EVENTS)
    rows = pa.Table.from_pylist([event(1), event(2)], schema=EVENTS)
    append_arrow(rows, str(path), app_id="job", batch_id=7)
    committed = data_files(path)
    killed = batch_prefix(path, "job", 7) + "-0123456789ab-a-11750.parquet"
    later = batch_prefix(path, "job", 8) + "-0123456789ab-a-12000.parquet"
    other_app = batch_prefix(path, "other", 7) + "-0123456789ab-a-11750.parquet"
    for stray in (killed, later, other_app):
        Path(stray).write_bytes(b"a killed attempt's file")
    replay = append_arrow(rows, str(path), app_id="job", batch_id=7)
    assert replay.skipped
    assert data_files(path) == committed | {os.path.basename(later), os.path.basename(other_app)}
    assert sorted(r["id"] for r in read_arrow(path).to_pylist()) == [1, 2]
    # Straight: nothing left to sweep; a batch not in the log sweeps nothing.
    assert sweep_committed_batch(path, "job", 7) == []
    assert sweep_committed_batch(path, "job", 8) == []
    assert os.path.exists(later)


def test_append_conforms_columns(spark: SparkSession, tmp_path: Path) -> None:
    """Column order, int widths and missing nullable columns are fixed before writing."""
    path = tmp_path / "events"
    create_table(path, EVENTS)
    df = spark.sql(
        "SELECT TIMESTAMP'2024-05-01 12:00:01' AS ts, CAST(4 AS INT) AS id, "
        "DATE'2024-05-02' AS day, 'x' AS name"
    )
    append_batch(df, path, app_id="job", batch_id=0)
    assert read_arrow(path).to_pylist() == [
        {
            "id": 4,
            "name": "x",
            "ts": datetime(2024, 5, 1, 12, 0, 1, tzinfo=UTC),
            "day": date(2024, 5, 2),
            "props": None,
            "body": None,
        }
    ]
    with pytest.raises(SchemaMismatchError, match="not in the table"):
        append_batch(df.withColumn("extra", df.id), path, app_id="job", batch_id=1)
    with pytest.raises(SchemaMismatchError, match="non-nullable column 'id'"):
        append_batch(df.drop("id"), path, app_id="job", batch_id=1)
    assert DeltaTable(str(path)).version() == 1


def test_schema_mismatching_file_refused_before_commit(tmp_path: Path) -> None:
    path = tmp_path / "events"
    create_table(path, EVENTS)
    bad = pa.table({"id": pa.array([1], pa.int32()), "name": ["a"]})
    pq.write_table(bad, path / "bad.parquet")
    with pytest.raises(SchemaMismatchError) as err:
        commit_files(path, [("bad.parquet", {})], app_id="job", batch_id=0)
    message = str(err.value)
    assert "missing columns ['ts', 'day', 'props', 'body']" in message
    assert "column 'id' is int32, table has int64" in message
    assert DeltaTable(str(path)).version() == 0
    assert committed_batch(path, "job") is None
    # Right columns but a null in a non-nullable one is refused too.
    nulls = pa.Table.from_pylist([event(1)], schema=EVENTS).set_column(
        3, pa.field("day", pa.date32()), pa.array([None], pa.date32())
    )
    pq.write_table(nulls, path / "nulls.parquet")
    with pytest.raises(SchemaMismatchError, match="non-nullable column 'day' has 1 nulls"):
        commit_files(path, [("nulls.parquet", {})], app_id="job", batch_id=0)
    assert DeltaTable(str(path)).version() == 0


def test_a_commit_stamp_holds_until_the_next_commit_or_a_new_table(tmp_path: Path) -> None:
    """What a writer keeps of its own commit holds while ``is_latest``: a later commit, or
    the table deleted and made again at the same path (same versions), ends it."""
    import shutil

    path = tmp_path / "events"
    create_table(path, EVENTS)
    assert latest_stamp(tmp_path / "none") is None and commit_stamp(path, 1) is None
    first = latest_stamp(path)
    assert first is not None and first.version == 0 and is_latest(path, first)
    append_arrow(pa.Table.from_pylist([event(1)], schema=EVENTS), str(path), app_id="job", batch_id=0)
    second = latest_stamp(path)
    assert second is not None and second.version == 1 and second == commit_stamp(path, 1)
    assert not is_latest(path, first) and is_latest(path, second) and not is_latest(path, None)
    shutil.rmtree(path)
    create_table(path, EVENTS)
    append_arrow(pa.Table.from_pylist([event(2)], schema=EVENTS), str(path), app_id="job", batch_id=0)
    again = latest_stamp(path)
    assert again is not None and again.version == 1 and again != second
    assert not is_latest(path, second) and is_latest(path, again)


def test_add_actions_carry_stats(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "events"
    create_table(path, EVENTS)
    append_batch(
        frame(spark, [event(3), event(1, name=None), event(2)]).coalesce(1),
        path,
        app_id="j",
        batch_id=0,
    )
    log = (path / "_delta_log" / "00000000000000000001.json").read_text().splitlines()
    adds = [json.loads(line)["add"] for line in log if '"add"' in line]
    assert len(adds) == 1
    stats = json.loads(adds[0]["stats"])
    assert stats["numRecords"] == 3
    assert stats["minValues"]["id"] == 1 and stats["maxValues"]["id"] == 3
    assert stats["minValues"]["ts"] == "2024-05-01T12:00:01.250Z"
    # delta-spark's writer truncates to the millisecond (readers give maxima 1 ms slack)
    assert stats["maxValues"]["ts"] == "2024-05-01T12:00:03.250Z"
    assert stats["minValues"]["day"] == "2024-05-01"
    assert stats["nullCount"] == {"id": 0, "name": 0, "ts": 0, "day": 0, "body": 0, "props": 0}
    assert adds[0]["size"] == os.path.getsize(path / adds[0]["path"])


def test_readers_agree(spark: SparkSession, tmp_path: Path) -> None:
    """deltalake + pyarrow (file_uris), polars and the Spark reader see the same rows."""
    path = tmp_path / "events"
    create_table(path, EVENTS)
    append_batch(frame(spark, [event(i) for i in range(6)]), path, app_id="j", batch_id=0)
    append_batch(frame(spark, [event(i) for i in range(6, 9)]), path, app_id="j", batch_id=1)
    expected = pa.Table.from_pylist([event(i) for i in range(9)], schema=EVENTS)

    plain = pq.read_table(DeltaTable(str(path)).file_uris())
    assert sorted_rows(plain.select(EVENTS.names).cast(EVENTS)) == sorted_rows(expected)

    polars_rows = pl.read_delta(str(path)).sort("id").to_arrow()
    assert polars_rows.column("id").to_pylist() == list(range(9))
    assert polars_rows.column("name").to_pylist() == [f"n{i}" for i in range(9)]
    assert polars_rows.column("body").to_pylist() == [bytes([i]) * 3 for i in range(9)]
    assert polars_rows.column("ts").cast(TS).to_pylist() == [ts(i) for i in range(9)]

    df = read_table(spark, path)
    assert df.columns == EVENTS.names
    assert spark_rows(df) == arrow_as_spark_rows(expected)
    assert spark_rows(read_table(spark, path, version=1)) == arrow_as_spark_rows(expected)[:6]


def test_tables_are_created_without_deletion_vectors_whatever_the_session_says(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A session whose defaults enable deletion vectors (a user's spark-defaults) still
    creates our tables without them, and with a checkpoint every 100 commits."""
    key = "spark.databricks.delta.properties.defaults.enableDeletionVectors"
    spark.conf.set(key, "true")
    try:
        create_table(tmp_path / "events", EVENTS)
        spark.sql(f"CREATE TABLE delta.`{tmp_path / 'theirs'}` (id BIGINT) USING delta")
    finally:
        spark.conf.unset(key)
    ours = DeltaTable(str(tmp_path / "events"))
    assert ours.metadata().configuration == {
        "delta.enableDeletionVectors": "false", "delta.checkpointInterval": "100",
    }  # fmt: skip
    assert "deletionVectors" not in (ours.protocol().writer_features or [])
    # The setting is real: a table created without ours gets deletion vectors.
    theirs = DeltaTable(str(tmp_path / "theirs"))
    assert "deletionVectors" in (theirs.protocol().writer_features or [])


def test_unsupported_table_features_refused(spark: SparkSession, tmp_path: Path) -> None:
    """Deletion vectors would make plain file reads return deleted rows: refused."""
    path = tmp_path / "dv"
    DeltaTable.create(str(path), EVENTS, configuration={"delta.enableDeletionVectors": "true"})
    with pytest.raises(DeltaLayerError, match="deletionVectors"):
        read_arrow(path)
    with pytest.raises(DeltaLayerError, match="deletionVectors"):
        append_batch(frame(spark, [event(1)]), path, app_id="j", batch_id=0)


def test_read_empty_table(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "bronze"
    create_table(path, BRONZE)
    df = read_table(spark, path)
    assert df.count() == 0
    assert df.columns == BRONZE.names
    assert read_arrow(path).num_rows == 0
    assert read_arrow(path).schema == BRONZE


def test_merge_arrow_rewrites_only_the_files_with_matched_keys(tmp_path: Path) -> None:
    path = tmp_path / "events"
    create_table(path, EVENTS)
    # Two files: ids 0-5 (in an order the rewrite must keep) and ids 6-7.
    first = [event(i) for i in (5, 0, 4, 1, 3, 2)]
    append_arrow(pa.Table.from_pylist(first, schema=EVENTS), path, app_id="load", batch_id=0)
    append_arrow(pa.Table.from_pylist([event(6), event(7)], schema=EVENTS), path, app_id="load", batch_id=1)
    before = {f.delta_path for f in live_files(snapshot.load(path))}
    rows = [event(4, name="four"), event(1, name="one"), event(20)]
    result = merge_arrow(
        pa.Table.from_pylist(rows, schema=EVENTS), path, keys=["id"], app_id="m", batch_id=7
    )
    assert (result.skipped, result.rows, result.updated) == (False, 1, 2)
    assert (result.files_added, result.files_removed) == (1, 1)
    after = {f.delta_path for f in live_files(snapshot.load(path))}
    assert len(before & after) == 1  # the ids 6-7 file is untouched
    got = read_arrow(path).to_pylist()
    assert sorted((r["id"], r["name"], r["props"]) for r in got) == sorted(
        [(i, f"n{i}", [("k", str(i))]) for i in (0, 2, 3, 5, 6, 7)]
        + [(4, "four", [("k", "4")]), (1, "one", [("k", "1")]), (20, "n20", [("k", "20")])]
    )
    rewritten = next(f for f in live_files(snapshot.load(path)) if f.delta_path not in before)
    # The kept rows keep their order, then the batch's rows follow.
    assert pq.read_table(rewritten.local_path).column("id").to_pylist() == [5, 0, 3, 2, 4, 1, 20]
    replay = merge_arrow(
        pa.Table.from_pylist([event(4, name="x")], schema=EVENTS), path, keys=["id"],
        app_id="m", batch_id=7,
    )  # fmt: skip
    assert replay.skipped and committed_batch(path, "m") == 7


def test_commits_of_different_tables_run_at_once_and_errors_surface(tmp_path: Path) -> None:
    """``transaction.concurrently``: each table gets its own commit with its app
    transaction, a replay of the group commits nothing, and an error in one call is
    raised after the others have committed."""
    from pipeline.lake import transaction

    paths = [tmp_path / f"t{i}" for i in range(3)]
    for p in paths:
        create_table(p, EVENTS)

    def append(p: Path, i: int) -> Any:
        return lambda: append_arrow(pa.Table.from_pylist([event(i)], schema=EVENTS), p, app_id="g", batch_id=4)

    got = transaction.concurrently({p.name: append(p, i) for i, p in enumerate(paths)})
    assert {k: (r.skipped, r.version, r.rows) for k, r in got.items()} == {
        "t0": (False, 1, 1), "t1": (False, 1, 1), "t2": (False, 1, 1)
    }
    assert [read_arrow(p).column("id").to_pylist() for p in paths] == [[0], [1], [2]]
    again = transaction.concurrently({p.name: append(p, 9) for p in paths})
    assert all(r.skipped for r in again.values())
    assert all(committed_batch(p, "g") == 4 for p in paths)

    def broken() -> Any:
        raise ValueError("no such table")

    more = tmp_path / "t3"
    create_table(more, EVENTS)
    with pytest.raises(ValueError, match="no such table"):
        transaction.concurrently({"bad": broken, "t3": append(more, 3)})
    assert read_arrow(more).column("id").to_pylist() == [3]


def test_a_table_the_previous_release_wrote_with_delta_rs_is_appended_and_merged(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The upgrade path: a table delta-rs created and committed to (app transaction
    included) takes the new release's delta-spark commits, and every reader agrees."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    path = tmp_path / "events"
    DeltaTable.create(str(path), EVENTS, name="events")
    old = pa.Table.from_pylist([event(i) for i in range(3)], schema=EVENTS)
    write_deltalake(
        str(path), old, mode="append",
        commit_properties=CommitProperties(app_transactions=[Transaction("load", 0)]),
    )  # fmt: skip
    create_table(path, EVENTS)  # the new release's start: the table is accepted as it is
    assert append_arrow(old, path, app_id="load", batch_id=0).skipped  # delta-rs's txn holds
    more = pa.Table.from_pylist([event(3), event(4)], schema=EVENTS)
    assert append_arrow(more, path, app_id="load", batch_id=1).version == 2
    upsert = pa.Table.from_pylist([event(1, name="one")], schema=EVENTS)
    assert merge_arrow(upsert, path, keys=["id"], app_id="m", batch_id=0).version == 3
    assert committed_batch(path, "load") == 1 and committed_batch(path, "m") == 0
    expected = {0: "n0", 1: "one", 2: "n2", 3: "n3", 4: "n4"}
    assert {r["id"]: r["name"] for r in read_arrow(path).to_pylist()} == expected
    assert {r["id"]: r["name"] for r in spark.read.format("delta").load(str(path)).collect()} == expected
    assert dict(pl.read_delta(str(path)).select("id", "name").iter_rows()) == expected
    # Delta's checksum is written from the first delta-spark commit on: later commits
    # read the app's last batch from it.
    assert (path / "_delta_log" / f"{3:020d}.crc").exists()
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()
    assert [(h["version"], h["operation"]) for h in history][2:] == [(2, "WRITE"), (3, "WRITE")]
    assert history[3]["userMetadata"] == "qmf.operation=upsert;qmf.app_id=m;qmf.batch_id=0"


def bronze_row(values: dict[str, Any]) -> dict[str, Any]:
    """A full bronze row: columns not given are null, or False for non-null flags."""
    row = {
        f.name: False if pa.types.is_boolean(f.type) and not f.nullable else None for f in BRONZE
    }
    return {**row, **values}


def msg(key: str, offset: int, batch: int) -> dict[str, Any]:
    return bronze_row(
        {
            "partition": "p0",
            "offset": offset,
            "msg_key": key,
            "received_at": ts(offset),
            "routing_key": "mgmt.a.b",
            "subject": None,
            "message_id": None,
            "correlation_id": None,
            "reply_to": None,
            "app_id": None,
            "content_type": "amqp/map",
            "application_properties": {"qmf.opcode": "_data"},
            "body": f"body-{key}".encode(),
            "batch_id": batch,
        }
    )


def bronze(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    return spark.createDataFrame(pa.Table.from_pylist(rows, schema=BRONZE))


def test_partitioned_append_and_readers(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "events"
    schema = pa.schema([*EVENTS, pa.field("site", pa.string())])
    create_table(path, schema, partition_by=["site", "day"])
    rows = [{**event(i, day=1 + i % 2), "site": ["a b", "c:d", None][i % 3]} for i in range(9)]
    append_batch(
        spark.createDataFrame(pa.Table.from_pylist(rows, schema=schema)),
        path,
        app_id="j",
        batch_id=0,
    )
    expected = {(r["id"], r["site"], r["day"]) for r in rows}
    assert {(r["id"], r["site"], r["day"]) for r in read_arrow(path).to_pylist()} == expected
    assert {(r["id"], r["site"], r["day"]) for r in spark_rows(read_table(spark, path))} == expected
    assert set(pl.read_delta(str(path)).select("id", "site", "day").rows()) == expected
    add_values = (
        pa.table(DeltaTable(str(path)).get_add_actions(flatten=True))
        .column("partition.site")
        .to_pylist()
    )
    assert set(add_values) == {"a b", "c:d", None}
    # Delta's own batch read (the backfill's), each row traced to its live file.
    dt = snapshot.load(path)
    keys = file_keys(spark, live_files(dt))
    traced = read_delta(spark, path, with_file=True).select("id", "site", "day", FILE_COL)
    by_file = {(r[0], r[1], r[2]): keys[r[3]] for r in traced.collect()}
    assert set(by_file) == expected
    for (_, site, day), f in by_file.items():
        assert f.partition_values == {"site": site, "day": str(day)}
    assert len(keys) == len(dt.files) == len({f.delta_path for f in by_file.values()})


def test_writer_options_reach_parquet(spark: SparkSession, tmp_path: Path) -> None:
    """no_dictionary() turns dictionary encoding off for the named columns only."""
    path = tmp_path / "events"
    create_table(path, EVENTS)
    rows = [event(i, name="same") for i in range(50)]
    append_batch(
        frame(spark, rows).coalesce(1),
        path,
        app_id="j",
        batch_id=0,
        writer_options=no_dictionary("name"),
    )
    (uri,) = DeltaTable(str(path)).file_uris()
    meta = pq.ParquetFile(uri).metadata.row_group(0)
    encodings = {
        meta.column(i).path_in_schema: set(meta.column(i).encodings)
        for i in range(meta.num_columns)
    }
    assert "PLAIN_DICTIONARY" not in encodings["name"] and "RLE_DICTIONARY" not in encodings["name"]
    assert "PLAIN_DICTIONARY" in encodings["day"] or "RLE_DICTIONARY" in encodings["day"]
    assert read_arrow(path).num_rows == 50


def test_create_table_is_idempotent_and_checks_schema(tmp_path: Path) -> None:
    path = tmp_path / "bronze"
    create_table(path, BRONZE)
    assert create_table(path, BRONZE).version == 0
    assert table_schema(path) == BRONZE
    other = pa.schema(
        [f if f.name != "offset" else pa.field("offset", pa.int32(), False) for f in BRONZE]
    )
    with pytest.raises(SchemaMismatchError, match="column 'offset' is int32, table has int64"):
        create_table(path, other)
    with pytest.raises(SchemaMismatchError, match="partitioned by"):
        create_table(path, BRONZE, partition_by=["partition"])
    with pytest.raises(ValueError, match="only string, integer, date and boolean"):
        create_table(tmp_path / "t2", BRONZE, partition_by=["received_at"])


SIZES = (100, 5_000, 100_000, 1_000_000)
BLOBS = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("body", pa.binary(), nullable=False),
        pa.field("note", pa.string()),
    ]
)


def blob(i: int, size: int) -> bytes:
    """``size`` bytes, different for every ``i``."""
    seed = hashlib.sha256(f"{i}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def blob_row(i: int, size: int, note: str | None = None) -> dict[str, Any]:
    return {"id": i, "body": blob(i, size), "note": note if note is not None else f"s{size}"}


def blob_frame(
    spark: SparkSession, rows: list[dict[str, Any]], schema: pa.Schema = BLOBS
) -> DataFrame:
    return spark.createDataFrame(pa.Table.from_pylist(rows, schema=schema))


def by_id(rows: Iterable[dict[str, Any]]) -> dict[int, tuple[bytes, str | None]]:
    out: dict[int, tuple[bytes, str | None]] = {}
    for r in rows:
        assert r["id"] not in out, f"id {r['id']} twice"
        out[r["id"]] = (bytes(r["body"]), r["note"])
    return out


def assert_blobs(spark: SparkSession, path: Path, expected: list[dict[str, Any]]) -> None:
    """Both readers give exactly ``expected`` (compared by id, then byte for byte)."""
    want = by_id(expected)
    for reader, got in (
        ("read_arrow", by_id(read_arrow(path).to_pylist())),
        ("read_table", by_id(read_table(spark, path).toArrow().to_pylist())),
    ):
        assert sorted(got) == sorted(want), reader
        for i, (body, note) in want.items():
            assert got[i][1] == note, (reader, i)
            assert len(got[i][0]) == len(body), (reader, i)
            assert got[i][0] == body, (reader, i)


def commit_adds(path: Path, version: int) -> list[dict[str, Any]]:
    """The add actions of one commit, with their stats parsed."""
    log = path / "_delta_log" / f"{version:020d}.json"
    adds = [json.loads(line)["add"] for line in log.read_text().splitlines() if '"add"' in line]
    for a in adds:
        a["stats"] = json.loads(a["stats"])
    return adds


def required(path: Path, rel: str, column: str) -> bool:
    """True when the data file stores ``column`` as a REQUIRED Parquet column."""
    meta = pq.ParquetFile(path / rel).metadata
    leaves = {meta.schema.column(i).path: i for i in range(meta.num_columns)}
    return bool(meta.schema.column(leaves[column]).max_definition_level == 0)


def body_stats(path: Path, rel: str) -> list[Any]:
    """The footer statistics of the body column, per row group."""
    meta = pq.ParquetFile(path / rel).metadata
    return [meta.row_group(rg).column(1).statistics for rg in range(meta.num_row_groups)]


def no_body_stats(path: Path, rel: str) -> bool:
    return all(st is None or not st.has_null_count for st in body_stats(path, rel))


def spark_parquet(df: DataFrame, out: Path, **options: str) -> Path:
    """Spark writes ``df`` as one Parquet file (no Delta layer involved)."""
    writer = df.coalesce(1).write
    for k, v in options.items():
        writer = writer.option(k, v)
    writer.parquet(str(out))
    (single,) = out.glob("*.parquet")
    return single


def test_large_binary_append_round_trip(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "blobs"
    create_table(path, BLOBS)
    batches = [[blob_row(10 * k + j, size) for j in range(3)] for k, size in enumerate(SIZES)]
    batches.append([blob_row(100 + j, size, note="mix") for j, size in enumerate(SIZES)])
    expected: list[dict[str, Any]] = []
    for b, rows in enumerate(batches):
        result = append_batch(blob_frame(spark, rows).coalesce(1), path, app_id="load", batch_id=b)
        assert (result.skipped, result.version, result.rows, result.files_added) == (
            False,
            b + 1,
            len(rows),
            1,
        )
        expected += rows
        (add,) = commit_adds(path, b + 1)
        ids = [r["id"] for r in rows]
        notes = sorted(r["note"] for r in rows)
        # delta-spark's writer: every column OPTIONAL, stats from the rows (binary:
        # a null count, no min/max), whatever the Parquet footer holds
        assert not required(path, add["path"], "body")
        nulls = {"id": 0, "body": 0, "note": 0}
        assert add["stats"] == {
            "numRecords": len(rows),
            "minValues": {"id": min(ids), "note": notes[0]},
            "maxValues": {"id": max(ids), "note": notes[-1]},
            "nullCount": nulls,
        }
    assert_blobs(spark, path, expected)
    assert committed_batch(path, "load") == len(batches) - 1


def test_spark_file_without_statistics_commits(spark: SparkSession, tmp_path: Path) -> None:
    """The defect of issue 8: such a file used to be refused for lack of a null count."""
    path = tmp_path / "blobs"
    create_table(path, BLOBS)
    nullable = pa.schema([f.with_nullable(True) for f in BLOBS])
    expected: list[dict[str, Any]] = []
    for b, schema in enumerate((BLOBS, nullable)):  # a REQUIRED, then an OPTIONAL body
        rows = [blob_row(10 * b + i, 5_000, note=f"n{10 * b + i}") for i in range(4)]
        file = spark_parquet(blob_frame(spark, rows, schema), tmp_path / f"spark{b}")
        name = f"file{b}.parquet"
        os.rename(file, path / name)
        assert no_body_stats(path, name)  # the premise: not even a null count
        assert required(path, name, "body") == (b == 0)
        result = commit_files(path, [(name, {})], app_id="ext", batch_id=b)
        assert (result.skipped, result.version, result.rows) == (False, b + 1, 4)
        (add,) = commit_adds(path, b + 1)
        assert add["stats"] == {
            "numRecords": 4,
            "minValues": {"id": 10 * b, "note": f"n{10 * b}"},
            "maxValues": {"id": 10 * b + 3, "note": f"n{10 * b + 3}"},
            "nullCount": {"id": 0, "note": 0},
        }
        expected += rows
    assert_blobs(spark, path, expected)
    flat = pa.table(DeltaTable(str(path)).get_add_actions(flatten=True))
    assert flat.column("null_count.body").to_pylist() == [None, None]
    assert flat.column("null_count.id").to_pylist() == [0, 0]


def test_real_null_refused_without_statistics(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "blobs"
    create_table(path, BLOBS)
    nullable = pa.schema([f.with_nullable(True) for f in BLOBS])
    rows = [blob_row(0, 5_000), {"id": 1, "body": None, "note": "null"}, blob_row(2, 5_000)]
    # A Spark-written OPTIONAL column without stats, holding a null.
    file = spark_parquet(blob_frame(spark, rows, nullable), tmp_path / "spark")
    os.rename(file, path / "nulls.parquet")
    assert no_body_stats(path, "nulls.parquet") and not required(path, "nulls.parquet", "body")
    with pytest.raises(SchemaMismatchError, match="non-nullable column 'body' has 1 nulls"):
        commit_files(path, [("nulls.parquet", {})], app_id="ext", batch_id=0)
    # The same from pyarrow with statistics switched off.
    pq.write_table(
        pa.Table.from_pylist(rows, schema=nullable),
        path / "nostats.parquet",
        write_statistics=False,
    )
    assert body_stats(path, "nostats.parquet") == [None]
    with pytest.raises(SchemaMismatchError, match="non-nullable column 'body' has 1 nulls"):
        commit_files(path, [("nostats.parquet", {})], app_id="ext", batch_id=0)
    # Several row groups, the null in one without stats, the others with.
    small = [blob_row(10 + i, 100) for i in range(5)]
    file = spark_parquet(
        blob_frame(spark, small + rows, nullable),
        tmp_path / "groups",
        **{"parquet.block.row.count.limit": "5"},
    )
    os.rename(file, path / "groups.parquet")
    stats = body_stats(path, "groups.parquet")
    assert [st is not None and st.has_null_count for st in stats] == [True, False]
    with pytest.raises(SchemaMismatchError, match="non-nullable column 'body' has 1 nulls"):
        commit_files(path, [("groups.parquet", {})], app_id="ext", batch_id=0)
    assert DeltaTable(str(path)).version() == 0
    assert committed_batch(path, "ext") is None
    # Through the write paths: conform()'s row check refuses before any commit.
    before = data_files(path)
    writes: list[Callable[[], object]] = [
        lambda: append_batch(blob_frame(spark, rows, nullable), path, app_id="a", batch_id=0),
    ]
    for write in writes:
        with pytest.raises(SchemaMismatchError, match="null in non-nullable column 'body'"):
            write()
    assert data_files(path) == before
    assert DeltaTable(str(path)).version() == 0


def test_row_groups_with_and_without_stats(spark: SparkSession, tmp_path: Path) -> None:
    """One file, several row groups, only some with body stats: the file has
    no body nullCount (it cannot be summed); the other columns keep theirs."""
    path = tmp_path / "blobs"
    create_table(path, BLOBS)
    rows = [blob_row(i, 100 if i < 5 or i >= 10 else 5_000, note=f"n{i:02d}") for i in range(12)]
    result = append_batch(
        blob_frame(spark, rows).coalesce(1),
        path,
        app_id="load",
        batch_id=0,
        writer_options={"parquet.block.row.count.limit": "5"},
    )
    assert (result.rows, result.files_added) == (12, 1)
    (add,) = commit_adds(path, 1)
    stats = body_stats(path, add["path"])
    assert [st is not None and st.has_null_count for st in stats] == [True, False, True]
    assert add["stats"] == {
        "numRecords": 12,
        "minValues": {"id": 0, "note": "n00"},
        "maxValues": {"id": 11, "note": "n11"},
        "nullCount": {"id": 0, "body": 0, "note": 0},  # delta-spark's, from the rows
    }
    assert_blobs(spark, path, rows)


NAMES = pa.schema(
    [pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string(), nullable=False)]
)


def test_long_strings_have_no_stats_and_are_never_skipped(
    spark: SparkSession, tmp_path: Path
) -> None:
    """MAX_STAT_STRING_BYTES counts bytes: 64 get stats, 65 none; files
    without stats are kept by prune_files."""
    assert MAX_STAT_STRING_BYTES == 64
    path = tmp_path / "names"
    create_table(path, NAMES)
    batches = [
        ["a" * 64, "b" * 64],  # 64 bytes: stats
        ["c" * 65],  # 65 bytes: none
        ["é" * 32],  # 32 characters, 64 bytes: stats
        ["é" * 33],  # 33 characters, 66 bytes: none
    ]
    files: list[str] = []
    rows: list[dict[str, Any]] = []
    for b, names in enumerate(batches):
        batch: list[dict[str, Any]] = [
            {"id": len(rows) + j, "name": n} for j, n in enumerate(names)
        ]
        # the Arrow writer's own stats (delta-spark's writer truncates strings instead)
        append_arrow(pa.Table.from_pylist(batch, schema=NAMES), path, app_id="load", batch_id=b)
        rows += batch
        (add,) = commit_adds(path, b + 1)
        files.append(add["path"])
        ids = [r["id"] for r in batch]
        with_stats = len(names[-1].encode()) <= 64
        assert add["stats"] == {
            "numRecords": len(names),
            "minValues": {"id": min(ids), **({"name": names[0]} if with_stats else {})},
            "maxValues": {"id": max(ids), **({"name": names[-1]} if with_stats else {})},
            "nullCount": {"id": 0, "name": 0},
        }
    dt = snapshot.load(path)
    kept = prune_files(dt, live_files(dt), "name", "c", "d")
    assert sorted(f.delta_path for f in kept) == sorted([files[1], files[3]])
    want = sorted((r["id"], r["name"]) for r in rows)
    assert sorted((r["id"], r["name"]) for r in read_arrow(path).to_pylist()) == want
    assert sorted((r["id"], r["name"]) for r in read_table(spark, path).collect()) == want


TIMES = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("ts", TS, nullable=False)])


def test_timestamp_stats_far_from_1970(spark: SparkSession, tmp_path: Path) -> None:
    """Delta stats are milliseconds: minima floored, maxima ceiled, with exact
    integer arithmetic and four-digit years; no bounds when the ceiled maximum
    would pass year 9999 (the file is then never skipped on ts)."""
    path = tmp_path / "times"
    create_table(path, TIMES)

    def at(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0, us: int = 0) -> datetime:
        return datetime(y, mo, d, h, mi, s, us, tzinfo=UTC)

    def pyarrow_file(name: str, rows: list[dict[str, Any]], batch: int) -> None:
        pq.write_table(pa.Table.from_pylist(rows, schema=TIMES), path / name)
        commit_files(path, [(name, {})], app_id="files", batch_id=batch)

    old = [
        {"id": 0, "ts": at(999, 1, 1, 0, 0, 0, 1)},
        {"id": 1, "ts": at(1969, 12, 31, 23, 59, 59, 999999)},
    ]
    late = [{"id": 2, "ts": at(9999, 12, 31, 23, 59, 59, 999999)}]
    pyarrow_file("old.parquet", old, 0)
    pyarrow_file("late.parquet", late, 1)
    recent = [
        {"id": 3, "ts": at(2024, 5, 1, 12, 0, 0, 1)},
        {"id": 4, "ts": at(2024, 5, 1, 12, 0, 0, 999001)},
    ]
    early = [{"id": 5, "ts": at(1900, 1, 1, 0, 0, 0, 500000)}]
    for b, rows in enumerate((recent, early)):
        append_batch(
            spark.createDataFrame(pa.Table.from_pylist(rows, schema=TIMES)).coalesce(1),
            path,
            app_id="spark",
            batch_id=b,
        )
    stats = [commit_adds(path, v)[0]["stats"] for v in (1, 2, 3, 4)]
    assert [(s["minValues"], s["maxValues"]) for s in stats] == [
        (
            {"id": 0, "ts": "0999-01-01T00:00:00.000Z"},
            {"id": 1, "ts": "1970-01-01T00:00:00.000Z"},
        ),
        ({"id": 2}, {"id": 2}),  # its maximum would be in year 10000: no ts bounds
        (
            {"id": 3, "ts": "2024-05-01T12:00:00.000Z"},
            {"id": 4, "ts": "2024-05-01T12:00:00.999Z"},  # delta-spark truncates
        ),
        (
            {"id": 5, "ts": "1900-01-01T00:00:00.500Z"},
            {"id": 5, "ts": "1900-01-01T00:00:00.500Z"},
        ),
    ]
    dt = snapshot.load(path)
    live = live_files(dt)

    def kept(low: datetime, high: datetime) -> set[int]:
        return {
            r["id"]
            for f in prune_files(dt, live, "ts", low, high)
            for r in pq.read_table(f.local_path).to_pylist()
        }

    assert len(live) == 4
    assert kept(at(9999, 12, 31), at(9999, 12, 31, 23, 59, 59, 999999)) == {2}
    # "late" has no ts stats: never skipped.
    moment = at(1969, 12, 31, 23, 59, 59, 999999)
    assert kept(moment, moment) == {0, 1, 2}
    moment = at(2024, 5, 1, 12, 0, 0, 999001)
    assert kept(moment, moment) == {2, 3, 4}
    assert kept(at(1900, 1, 1), at(1900, 1, 1, 0, 0, 1)) == {0, 1, 2, 5}
    want = sorted((r["id"], r["ts"]) for r in old + late + recent + early)
    assert sorted((r["id"], r["ts"]) for r in read_arrow(path).to_pylist()) == want
    spark_got = read_table(spark, path).toArrow().to_pylist()
    assert sorted((r["id"], r["ts"]) for r in spark_got) == want


MAPS = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("props", pa.map_(pa.string(), pa.string())),
        pa.field("tags", pa.map_(pa.string(), pa.string()), nullable=False),
    ]
)


def test_maps_large_empty_and_null(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "maps"
    create_table(path, MAPS)
    rows = [
        {"id": 0, "props": None, "tags": []},
        {"id": 1, "props": [], "tags": [("k", "v" * 5_000)]},
        {"id": 2, "props": [(f"k{j:03d}", str(j)) for j in range(300)], "tags": [("a", None)]},
        {"id": 3, "props": [("big", "x" * 100_000), ("small", "y")], "tags": [("t", "1")]},
    ]
    append_batch(
        spark.createDataFrame(pa.Table.from_pylist(rows, schema=MAPS)),
        path,
        app_id="load",
        batch_id=0,
    )
    assert sorted(read_arrow(path).to_pylist(), key=lambda r: r["id"]) == rows
    assert sorted(read_table(spark, path).toArrow().to_pylist(), key=lambda r: r["id"]) == rows
    adds = commit_adds(path, 1)
    assert all(sorted(a["stats"]["nullCount"]) == ["id", "props", "tags"] for a in adds)
    assert sum(a["stats"]["nullCount"]["props"] for a in adds) == 1  # delta-spark counts map nulls
    nullable = pa.schema([f.with_nullable(True) for f in MAPS])
    bad = [{"id": 9, "props": None, "tags": None}]
    with pytest.raises(SchemaMismatchError, match="null in non-nullable column 'tags'"):
        append_batch(
            spark.createDataFrame(pa.Table.from_pylist(bad, schema=nullable)),
            path,
            app_id="load",
            batch_id=1,
        )
    # Files from elsewhere: an OPTIONAL map column is checked on its data.
    pq.write_table(pa.Table.from_pylist(bad, schema=nullable), path / "bad.parquet")
    with pytest.raises(SchemaMismatchError, match="non-nullable column 'tags' has 1 nulls"):
        commit_files(path, [("bad.parquet", {})], app_id="files", batch_id=0)
    good = [{"id": 10, "props": None, "tags": [("x", "y")]}]
    pq.write_table(pa.Table.from_pylist(good, schema=nullable), path / "good.parquet")
    assert commit_files(path, [("good.parquet", {})], app_id="files", batch_id=0).rows == 1
    assert DeltaTable(str(path)).version() == 2
    assert sorted(read_arrow(path).to_pylist(), key=lambda r: r["id"]) == rows + good


def test_iter_batches_reads_every_row_file_by_file(tmp_path: Path) -> None:
    """Only the asked columns, in bounded batches, every row of every live file exactly once
    (what ``qmf run``'s bronze summary reads a long run's bodies with)."""
    path = str(tmp_path / "t")
    create_table(path, EVENTS)
    for b in range(3):
        rows = [event(b * 100 + i) for i in range(25)]
        append_arrow(pa.Table.from_pylist(rows, schema=EVENTS), path, app_id="t", batch_id=b)
    batches = list(iter_batches(path, ["body", "id"], batch_size=10))
    assert all(bt.schema.names == ["body", "id"] and bt.num_rows <= 10 for bt in batches)
    got = sorted((r["id"], r["body"]) for bt in batches for r in bt.to_pylist())
    want = sorted((r["id"], r["body"]) for r in read_arrow(path).to_pylist())
    assert got == want and len(got) == 75


def test_existing_table_gains_new_nullable_columns(spark: SparkSession, tmp_path: Path) -> None:
    """A lake written before a release added nullable columns keeps working: the table
    gains them (old rows read null, in delta-rs and in Spark); a new non-nullable
    column is refused with the difference named."""
    path = str(tmp_path / "t")
    old = pa.schema([pa.field("k", pa.string(), nullable=False), pa.field("v", pa.int64())])
    create_table(path, old)
    append_arrow(pa.table({"k": ["a"], "v": [1]}, schema=old), path, app_id="app", batch_id=0)
    new = pa.schema([*old, pa.field("name", pa.string()), pa.field("broker", pa.string())])
    create_table(path, new)
    assert table_schema(path).names == ["k", "v", "name", "broker"]
    create_table(path, new)  # idempotent
    rows = pa.table({"k": ["b"], "v": [2], "name": ["q1"], "broker": ["b@h:1"]}, schema=new)
    append_arrow(rows, path, app_id="app", batch_id=1)
    got = sorted(read_arrow(path).to_pylist(), key=lambda r: r["k"])
    assert got == [
        {"k": "a", "v": 1, "name": None, "broker": None},
        {"k": "b", "v": 2, "name": "q1", "broker": "b@h:1"},
    ]
    assert sorted(tuple(r) for r in read_table(spark, path).collect()) == [
        ("a", 1, None, None), ("b", 2, "q1", "b@h:1"),
    ]  # fmt: skip
    strict = pa.schema([*new, pa.field("must", pa.int64(), nullable=False)])
    with pytest.raises(SchemaMismatchError, match="lacks the non-nullable columns \\['must'\\]"):
        create_table(path, strict)
