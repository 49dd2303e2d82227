"""The ``qmf-delta`` source streams exactly the rows a Delta table's commits add."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import AddAction
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles, ReadMaxRows

from pipeline.lake.delta import append_batch, create_table, overwrite_range, read_arrow
from pipeline.lake.delta_source import (
    DataFile,
    DeltaSourceError,
    DeltaSourceOptions,
    DeltaStreamError,
    DeltaStreamReader,
    FileGroup,
    Position,
    batch_start,
    group_files,
    range_files,
    register,
)
from schemas.tables import spark_schema

pytestmark = pytest.mark.spark

TS = pa.timestamp("us", tz="UTC")
EVENTS = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("name", pa.string()),
        pa.field("ts", TS, nullable=False),
        pa.field("day", pa.date32()),
        pa.field("props", pa.map_(pa.string(), pa.string())),
        pa.field("body", pa.binary()),
    ]
)
SPARK_EVENTS = spark_schema(EVENTS)


# --------------------------------------------------------------------------- helpers


def event(i: int, day: int | None = None, body_size: int = 3) -> dict[str, Any]:
    """A row derived from ``i`` alone, so every test knows it exactly."""
    return {
        "id": i,
        "name": None if i % 7 == 3 else f"n{i} a/b",
        "ts": datetime(2024, 5, 1, 12, 0, i % 60, 250001, tzinfo=UTC),
        "day": None if day is None else date(2024, 5, day),
        "props": {"k": str(i)} if i % 2 else None,
        "body": bytes([i % 256]) * body_size,
    }


def events(ids: Sequence[int], day: int | None = 1, body_size: int = 3) -> pa.Table:
    return pa.Table.from_pylist([event(i, day, body_size) for i in ids], schema=EVENTS)


def new_table(path: Path, partition_by: Sequence[str] = ()) -> str:
    create_table(path, EVENTS, partition_by)
    return str(path)


def rs_append(path: str, ids: Sequence[int], day: int | None = 1) -> int:
    """Append one commit with delta-rs (fast; Spark-written files are tested too)."""
    write_deltalake(path, events(ids, day), mode="append")
    return DeltaTable(path).version()


def as_rows(table: pa.Table) -> list[dict[str, Any]]:
    """Rows sorted by id, maps as dicts, in the table's column order."""
    rows = table.select(EVENTS.names).to_pylist()
    for r in rows:
        if r["props"] is not None:
            r["props"] = dict(r["props"])
        r["ts"] = r["ts"].astimezone(UTC)
    return sorted(rows, key=lambda r: r["id"])


def expected(ids: Sequence[int], day: int | None = 1, body_size: int = 3) -> list[dict[str, Any]]:
    return as_rows(events(sorted(ids), day, body_size))


def ids_of(table: pa.Table) -> list[int]:
    return sorted(table.column("id").to_pylist())


def stream(spark: SparkSession, options: Mapping[str, str], schema: Any = None) -> DataFrame:
    reader = spark.readStream.format("qmf-delta")
    if schema is not None:
        reader = reader.schema(schema)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def run_available_now(
    spark: SparkSession,
    options: Mapping[str, str],
    checkpoint: Path,
    *,
    schema: Any = None,
    fail_at: int | None = None,
) -> tuple[list[tuple[int, pa.Table]], BaseException | None]:
    """One AvailableNow run into foreachBatch: [(batch_id, rows as Arrow)], and the
    query's exception. ``fail_at`` makes the sink fail on that batch (a crash)."""
    seen: list[tuple[int, pa.Table]] = []

    def collect(df: DataFrame, batch_id: int) -> None:
        rows = df.toArrow()
        if fail_at is not None and batch_id == fail_at:
            seen.append((-batch_id - 1, rows))  # what the failed attempt saw
            raise RuntimeError(f"sink crashed at batch {batch_id}")
        seen.append((batch_id, rows))

    query = (
        stream(spark, options, schema)
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        try:
            query.awaitTermination(240)
        except Exception:
            pass
        error = query.exception()
        assert error is not None or not query.isActive, "AvailableNow query did not stop"
    finally:
        query.stop()
    return seen, error


def data_batches(seen: Sequence[tuple[int, pa.Table]]) -> list[tuple[int, list[int]]]:
    return [(b, ids_of(t)) for b, t in seen if t.num_rows]


def reader(path: str, **options: str) -> DeltaStreamReader:
    return DeltaStreamReader(SPARK_EVENTS, {"path": path, **options})


def read_range(r: DeltaStreamReader, start: dict[str, Any], end: dict[str, Any]) -> pa.Table:
    """What Spark would read for [start, end): every partition, in order."""
    batches = [b for part in r.partitions(start, end) for b in r.read(part)]
    return pa.Table.from_batches(batches, r.arrow_schema)


@pytest.fixture(scope="module")
def qmf(spark: SparkSession) -> SparkSession:
    register(spark)
    return spark


# --------------------------------------------------------------------------- pure parts


def test_options_are_validated() -> None:
    ok = DeltaSourceOptions.parse(
        {"path": "/t", "startingVersion": "7", "maxRowsPerTrigger": "10", "ignoreChanges": "true"}
    )
    assert ok == DeltaSourceOptions(
        path="/t", starting_version=7, max_rows_per_trigger=10, ignore_changes=True
    )
    assert ok.max_files_per_trigger == 1000
    assert DeltaSourceOptions.parse({"path": "file:///t/a%20b"}).path == "/t/a b"
    bad: list[tuple[dict[str, str], str]] = [
        ({}, "needs option path"),
        ({"path": "s3://b/t"}, "only local tables"),
        ({"path": "/t", "startingVersion": "oldest"}, "expected earliest, latest or a version"),
        ({"path": "/t", "startingVersion": "-1"}, "must be >= 0"),
        ({"path": "/t", "maxFilesPerTrigger": "0"}, "must be > 0"),
        ({"path": "/t", "maxRowsPerTrigger": "many"}, "expected an integer"),
        ({"path": "/t", "ignoreDeletes": "perhaps"}, "expected true or false"),
        ({"path": "/t", "maxFilePerTrigger": "5"}, "unknown option(s)"),
    ]
    for opts, message in bad:
        with pytest.raises(DeltaSourceError, match=message.replace("(", r"\(").replace(")", r"\)")):
            DeltaSourceOptions.parse(opts)


def test_positions_json_and_errors() -> None:
    assert Position(3, 2).to_json() == {"version": 3, "index": 2}
    assert Position(3, 2, True).to_json() == {"version": 3, "index": 2, "snapshot": True}
    assert Position.from_json({"version": 3, "index": 2, "snapshot": True}) == Position(3, 2, True)
    with pytest.raises(DeltaStreamError, match="not a qmf-delta offset"):
        Position.from_json({"a": 5})


def test_group_files_packs_consecutive_files() -> None:
    mib = 1024 * 1024
    sizes = [1, 2, 30, 5, 50]
    files = [DataFile(f"/f{i}", size * mib, 1) for i, size in enumerate(sizes)]
    # Each file weighs at least Spark's 4 MB open cost: 4 + 4 + 30 fit in 40 MB.
    got = group_files(files, 40 * mib)
    assert [[f.path for f in g.files] for g in got] == [["/f0", "/f1", "/f2"], ["/f3"], ["/f4"]]
    assert [len(g.files) for g in group_files(files, 1)] == [1] * 5  # one file per task
    assert len(group_files(files, 128 * mib)) == 1


# --------------------------------------------------------------------------- reader level


def test_reader_offsets_limits_and_available_now(tmp_path: Path) -> None:
    """The driver-side calls, straight: what Spark asks and what the source answers."""
    path = new_table(tmp_path / "t")
    v1 = rs_append(path, range(0, 4))
    v2 = rs_append(path, range(4, 6))
    assert (v1, v2) == (1, 2)
    r = reader(path)
    start = r.initialOffset()
    assert start == {"version": 2, "index": 0, "snapshot": True}  # the snapshot of version 2
    assert r.getDefaultReadLimit() == ReadMaxFiles(1000)
    # Every end names the batch's start ("from"): Spark logs no first batch's start.
    assert r.latestOffset(start, ReadMaxFiles(1)) == {
        "version": 2, "index": 1, "snapshot": True, "from": start,
    }  # fmt: skip
    end = r.latestOffset(start, ReadAllAvailable())
    assert end == {"version": 3, "index": 0, "from": start}
    assert batch_start(end) == Position(2, 0, True)
    assert as_rows(read_range(r, start, end)) == expected(range(6))
    assert r.latestOffset(end, ReadAllAvailable()) == end  # nothing new: same JSON
    rs_append(path, range(6, 9))
    write_deltalake(path, events(range(9, 10)), mode="append")
    r.prepareForTriggerAvailableNow()
    rs_append(path, range(10, 12))  # after the AvailableNow target: not read
    at_end = {"version": 3, "index": 0}
    assert r.latestOffset(end, ReadMaxRows(1)) == {"version": 4, "index": 0, "from": at_end}
    last = r.latestOffset(end, ReadAllAvailable())
    assert last == {"version": 5, "index": 0, "from": at_end}
    assert as_rows(read_range(r, end, last)) == expected(range(6, 10))
    assert r.latestOffset(last, ReadAllAvailable()) == last
    assert r.reportLatestOffset() == {"version": 6, "index": 0}


def test_range_files_lists_a_snapshot_once_and_again_for_a_new_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches inside a starting snapshot (``range_files``, one reader per call) list the
    snapshot once per process; a table deleted and made again at the same path, at the
    same version, is listed anew (its commit files differ)."""
    import shutil

    from pipeline.lake import delta_source as ds

    path = new_table(tmp_path / "t")
    rs_append(path, range(0, 4))
    rs_append(path, range(4, 6))
    loads: list[int | None] = []
    table = ds.DeltaLogReader.table

    def counted(self: ds.DeltaLogReader, version: int | None = None) -> DeltaTable:
        loads.append(version)
        return table(self, version)

    monkeypatch.setattr(ds.DeltaLogReader, "table", counted)
    start = {"version": 2, "index": 0, "snapshot": True}
    middle = {"version": 2, "index": 1, "snapshot": True}
    end = {"version": 3, "index": 0}
    first = range_files(path, SPARK_EVENTS, start, middle)
    second = range_files(path, SPARK_EVENTS, middle, end)
    assert loads == [2]  # the second batch's reader took the process's listing
    both = read_range_files(first) + read_range_files(second)
    assert sorted(both) == list(range(6))

    shutil.rmtree(path)
    new_table(tmp_path / "t")
    rs_append(path, range(10, 13))
    rs_append(path, range(13, 15))
    again = range_files(path, SPARK_EVENTS, start, end)
    assert loads == [2, 2]
    assert sorted(read_range_files(again)) == list(range(10, 15))


def read_range_files(files: Sequence[DataFile]) -> list[int]:
    return [i for f in files for i in pq.read_table(f.path, columns=["id"]).column("id").to_pylist()]


def test_initial_offset_does_not_move_when_the_table_does(tmp_path: Path) -> None:
    """Spark asks for the initial offset again when it runs the first batch; a commit
    (here a compaction, then an append) in between must not move the snapshot, or
    the first batch would also hold files that the next batch reads."""
    path = new_table(tmp_path / "t")
    rs_append(path, range(0, 4))
    rs_append(path, range(4, 6))
    r = reader(path)
    start = r.initialOffset()
    end = r.latestOffset(start, ReadAllAvailable())
    assert (start, end) == (
        {"version": 2, "index": 0, "snapshot": True},
        {"version": 3, "index": 0, "from": {"version": 2, "index": 0, "snapshot": True}},
    )
    DeltaTable(path).optimize.compact()  # version 3
    rs_append(path, range(6, 9))  # version 4
    assert r.initialOffset() == start
    first = read_range(r, r.initialOffset(), end)
    nxt = r.latestOffset(end, ReadAllAvailable())
    assert ids_of(first) == list(range(6)) and ids_of(read_range(r, end, nxt)) == [6, 7, 8]


def test_reader_row_limit_uses_stats_or_footer_never_requires_them(tmp_path: Path) -> None:
    path = new_table(tmp_path / "t")
    rs_append(path, range(0, 5))
    rs_append(path, range(5, 10))
    # A commit whose add carries no stats at all: rows come from the Parquet footer.
    name = "nostats-0.parquet"
    pq.write_table(events(range(10, 15)), os.path.join(path, name), write_statistics=False)
    dt = DeltaTable(path)
    dt.create_write_transaction(
        [AddAction(name, os.path.getsize(os.path.join(path, name)), {}, 0, True, "")],
        mode="append",
        schema=dt.schema(),
    )
    rs_append(path, range(15, 16))
    r = reader(path, startingVersion="1", maxRowsPerTrigger="9")
    start = r.initialOffset()
    assert start == {"version": 1, "index": 0}
    ends = [start]
    while (nxt := r.latestOffset(ends[-1], r.getDefaultReadLimit())) != ends[-1]:
        ends.append(nxt)
    # 5 | 5 | 5 (no stats: the footer's count) + 1: never more than 9 rows per batch.
    assert [Position.from_json(e) for e in ends[1:]] == [Position(2), Position(3), Position(5)]
    r2 = reader(path, startingVersion="1", maxRowsPerTrigger="11")
    assert r2.latestOffset(start, r2.getDefaultReadLimit()) == {"version": 3, "index": 0,
                                                                 "from": start}  # fmt: skip
    assert [ids_of(read_range(r, a, b)) for a, b in itertools.pairwise(ends)] == [
        list(range(0, 5)), list(range(5, 10)), list(range(10, 16)),
    ]  # fmt: skip
    # A single file larger than the limit still goes (progress is guaranteed).
    r3 = reader(path, startingVersion="1", maxRowsPerTrigger="2")
    assert r3.latestOffset(start, r3.getDefaultReadLimit()) == {"version": 2, "index": 0,
                                                                 "from": start}  # fmt: skip


def test_reader_partitions_spread_files_and_read_is_deterministic(tmp_path: Path) -> None:
    path = new_table(tmp_path / "t")
    for k in range(4):
        rs_append(path, range(10 * k, 10 * k + 10))
    r = reader(path, startingVersion="1", maxBytesPerPartition="1")
    start, end = {"version": 1, "index": 0}, {"version": 5, "index": 0}
    parts = r.partitions(start, end)
    assert len(parts) == 4 and all(isinstance(p, FileGroup) and len(p.files) == 1 for p in parts)
    first = read_range(r, start, end)
    assert as_rows(first) == expected(range(40))
    assert read_range(reader(path), start, end).equals(first)  # another process, same rows
    assert ids_of(read_range(r, {"version": 2, "index": 0}, {"version": 4, "index": 0})) == list(
        range(10, 30)
    )


def test_reader_waits_for_a_missing_table_and_skips_empty_commits(
    qmf: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "later")
    r = reader(path)
    start = r.initialOffset()
    assert start == {"version": 0, "index": 0}  # everything, as commits, once it exists
    assert r.latestOffset(start, ReadAllAvailable()) == start
    assert r.reportLatestOffset() is None
    new_table(Path(path))
    assert r.latestOffset(start, ReadAllAvailable()) == start  # created, still empty
    # An empty micro-batch commits only an app transaction: nothing to stream.
    empty = qmf.createDataFrame([], SPARK_EVENTS)
    assert append_batch(empty, path, app_id="up", batch_id=0).files_added == 0
    assert r.latestOffset(start, ReadAllAvailable()) == start
    rs_append(path, [1, 2])
    end = r.latestOffset(start, ReadAllAvailable())
    assert end == {"version": 3, "index": 0, "from": start}
    assert as_rows(read_range(r, start, end)) == expected([1, 2])


def test_reader_missing_commit_is_an_error(tmp_path: Path) -> None:
    path = new_table(tmp_path / "t")
    for k in range(3):
        rs_append(path, [k])
    r = reader(path, startingVersion="1")
    start = r.initialOffset()
    os.remove(os.path.join(path, "_delta_log", f"{2:020d}.json"))  # as log retention would
    end = r.latestOffset(start, ReadAllAvailable())
    assert end == {"version": 2, "index": 0, "from": start}  # commit 1 is still delivered
    with pytest.raises(DeltaStreamError, match=r"commit 2 .* is no longer in the log"):
        r.latestOffset(end, ReadAllAvailable())


def test_reader_stops_before_a_commit_it_must_not_read(qmf: SparkSession, tmp_path: Path) -> None:
    path = new_table(tmp_path / "t")
    rs_append(path, range(0, 3))
    rs_append(path, range(3, 6))
    DeltaTable(path).delete("id >= 3")  # version 3: removes the second file
    rs_append(path, [6])
    r = reader(path, startingVersion="1")
    start = r.initialOffset()
    end = r.latestOffset(start, ReadAllAvailable())
    assert end == {"version": 3, "index": 0, "from": start}  # 1 and 2, not past the delete
    assert ids_of(read_range(r, start, end)) == list(range(6))
    with pytest.raises(
        DeltaStreamError, match=r"version 3 of .* removes data: 1 file\(s\) removed, 0"
    ):
        r.latestOffset(end, ReadAllAvailable())
    skip = reader(path, startingVersion="1", ignoreDeletes="true")
    last = skip.latestOffset(end, ReadAllAvailable())
    assert last == {"version": 5, "index": 0, "from": {"version": 3, "index": 0}}
    assert ids_of(read_range(skip, end, last)) == [6]


def test_reader_schema_change_is_an_error(tmp_path: Path) -> None:
    path = new_table(tmp_path / "t")
    rs_append(path, [1])
    r = reader(path, startingVersion="latest")
    start = r.initialOffset()
    wider = pa.Table.from_pylist(
        [{**event(2, 1), "extra": 5}],
        schema=pa.schema([*EVENTS, pa.field("extra", pa.int32())]),
    )
    write_deltalake(path, wider, mode="append", schema_mode="merge")
    with pytest.raises(DeltaStreamError, match="changes the table schema"):
        r.latestOffset(start, ReadAllAvailable())


# --------------------------------------------------------------------------- with Spark


def test_available_now_reads_the_table_exactly(qmf: SparkSession, tmp_path: Path) -> None:
    path = new_table(tmp_path / "t")
    append_batch(qmf.createDataFrame(events(range(0, 20))), path, app_id="w", batch_id=0)
    rs_append(path, range(20, 25))
    append_batch(qmf.createDataFrame(events(range(25, 40))), path, app_id="w", batch_id=1)
    df = stream(qmf, {"path": path})
    assert df.schema == SPARK_EVENTS
    seen, error = run_available_now(qmf, {"path": path}, tmp_path / "ck")
    assert error is None
    assert [b for b, _ in seen] == [0]
    assert as_rows(seen[0][1]) == as_rows(read_arrow(path)) == expected(range(40))


def test_appends_between_triggers_arrive_once_and_in_order(
    qmf: SparkSession, tmp_path: Path
) -> None:
    path = new_table(tmp_path / "t")
    rs_append(path, range(0, 5))
    seen: list[tuple[int, list[int]]] = []

    def collect(df: DataFrame, batch_id: int) -> None:
        seen.append((batch_id, sorted(r.id for r in df.select("id").collect())))

    query = (
        stream(qmf, {"path": path})
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    arrived: list[list[int]] = []
    try:
        query.processAllAvailable()
        arrived.append(sorted(i for _, ids in seen for i in ids))
        for k in range(1, 4):
            before = len(seen)
            for c in range(k):  # k commits land between two waits
                rs_append(path, range(100 * k + 10 * c, 100 * k + 10 * c + 3))
            query.processAllAvailable()
            arrived.append(sorted(i for _, ids in seen[before:] for i in ids))
    finally:
        query.stop()
    # Each round's rows arrive once, before the next round is written.
    assert arrived == [
        list(range(5)),
        [100, 101, 102],
        [200, 201, 202, 210, 211, 212],
        [300, 301, 302, 310, 311, 312, 320, 321, 322],
    ]
    assert [b for b, _ in seen] == list(range(len(seen)))
    got = [ids for _, ids in seen if ids]
    # In order: every batch's rows were committed after the previous batch's.
    assert all(max(a) < min(b) for a, b in itertools.pairwise(got))


def test_admission_control_splits_batches(qmf: SparkSession, tmp_path: Path) -> None:
    path = new_table(tmp_path / "t")
    for k in range(5):
        rs_append(path, range(10 * k, 10 * k + 10))
    seen, error = run_available_now(
        qmf, {"path": path, "maxFilesPerTrigger": "2"}, tmp_path / "ck1"
    )
    assert error is None
    assert data_batches(seen) == [
        (0, list(range(0, 20))), (1, list(range(20, 40))), (2, list(range(40, 50))),
    ]  # fmt: skip
    seen, error = run_available_now(
        qmf, {"path": path, "startingVersion": "2", "maxRowsPerTrigger": "25"}, tmp_path / "ck2"
    )
    assert error is None
    assert data_batches(seen) == [(0, list(range(10, 30))), (1, list(range(30, 50)))]


def test_restart_from_checkpoint_reads_nothing_twice(qmf: SparkSession, tmp_path: Path) -> None:
    path = new_table(tmp_path / "t")
    for k in range(5):
        rs_append(path, range(10 * k, 10 * k + 10))
    opts = {"path": path, "maxFilesPerTrigger": "1"}
    ck = tmp_path / "ck"
    first, error = run_available_now(qmf, opts, ck, fail_at=2)
    assert error is not None and "sink crashed at batch 2" in str(error)
    assert data_batches(first) == [(0, list(range(10))), (1, list(range(10, 20))),
                                   (-3, list(range(20, 30)))]  # fmt: skip
    rs_append(path, range(50, 55))  # lands while the query is down
    second, error = run_available_now(qmf, opts, ck)
    assert error is None
    # Batch 2 is re-planned from the offset log: the same rows, then the rest once.
    assert data_batches(second) == [
        (2, list(range(20, 30))), (3, list(range(30, 40))), (4, list(range(40, 50))),
        (5, list(range(50, 55))),
    ]  # fmt: skip
    third, error = run_available_now(qmf, opts, ck)
    assert error is None and data_batches(third) == []


def test_starting_version_latest_and_number(qmf: SparkSession, tmp_path: Path) -> None:
    path = new_table(tmp_path / "t")
    rs_append(path, range(0, 3))
    rs_append(path, range(3, 6))
    ck = tmp_path / "ck"
    opts = {"path": path, "startingVersion": "latest"}
    seen, error = run_available_now(qmf, opts, ck)
    assert error is None and data_batches(seen) == []
    rs_append(path, range(6, 8))
    seen, error = run_available_now(qmf, opts, ck)
    assert error is None and data_batches(seen) == [(1, [6, 7])]  # batch 0 was empty
    seen, error = run_available_now(qmf, {"path": path, "startingVersion": "2"}, tmp_path / "ck2")
    assert error is None and data_batches(seen) == [(0, [3, 4, 5, 6, 7])]


def test_partitioned_table_partition_values_from_the_log(qmf: SparkSession, tmp_path: Path) -> None:
    path = new_table(tmp_path / "t", ["day", "name"])
    rows = [event(i, day=1 + i % 2) for i in range(12)]
    rows[5]["day"] = None  # a null partition value (Hive's default partition folder)
    table = pa.Table.from_pylist(rows, schema=EVENTS)
    append_batch(qmf.createDataFrame(table), path, app_id="w", batch_id=0)
    seen, error = run_available_now(qmf, {"path": path}, tmp_path / "ck")
    assert error is None
    got = pa.concat_tables([t for _, t in seen])
    assert as_rows(got) == as_rows(table) == as_rows(read_arrow(path))
    more = [event(i, day=3) for i in range(12, 15)]
    append_batch(
        qmf.createDataFrame(pa.Table.from_pylist(more, schema=EVENTS)),
        path,
        app_id="w",
        batch_id=1,
    )
    seen, error = run_available_now(qmf, {"path": path}, tmp_path / "ck")
    assert error is None
    assert as_rows(pa.concat_tables([t for _, t in seen])) == as_rows(
        pa.Table.from_pylist(more, schema=EVENTS)
    )


def test_compaction_commit_is_ignored(qmf: SparkSession, tmp_path: Path) -> None:
    path = new_table(tmp_path / "t")
    for k in range(4):
        rs_append(path, range(10 * k, 10 * k + 10))
    ck = tmp_path / "ck"
    seen, error = run_available_now(qmf, {"path": path, "startingVersion": "1"}, ck)
    assert error is None and ids_of(pa.concat_tables([t for _, t in seen])) == list(range(40))
    metrics = DeltaTable(path).optimize.compact()
    assert metrics["numFilesRemoved"] == 4 and metrics["numFilesAdded"] == 1
    log = Path(path, "_delta_log", f"{5:020d}.json").read_text().splitlines()
    actions = [json.loads(line) for line in log]
    assert {a[k]["dataChange"] for a in actions for k in ("add", "remove") if k in a} == {False}
    rs_append(path, range(40, 45))
    seen, error = run_available_now(qmf, {"path": path, "startingVersion": "1"}, ck)
    assert error is None and data_batches(seen) == [(1, list(range(40, 45)))]
    # A query started after the compaction reads the compacted snapshot once.
    seen, error = run_available_now(qmf, {"path": path}, tmp_path / "ck2")
    assert error is None and data_batches(seen) == [(0, list(range(45)))]


def test_removes_fail_clearly_unless_told(qmf: SparkSession, tmp_path: Path) -> None:
    path = new_table(tmp_path / "t")
    append_batch(qmf.createDataFrame(events(range(0, 10))), path, app_id="w", batch_id=0)
    # A backfill: rows 0..4 replaced (one commit removes a file and adds new ones).
    fix = events(range(0, 5)).set_column(1, "name", pa.array(["fixed"] * 5))
    result = overwrite_range(
        qmf.createDataFrame(fix), path, predicate="id < 5", app_id="w", batch_id=1
    )
    assert result.files_removed >= 1
    rs_append(path, range(10, 12))
    base = {"path": path, "startingVersion": "1"}
    seen, error = run_available_now(qmf, base, tmp_path / "ck0")
    assert error is not None
    assert "version 2 of" in str(error) and "removes data" in str(error)
    assert "skipChangeCommits" in str(error)
    # What comes before the change is delivered; the query stops at the change.
    assert data_batches(seen) == [(0, list(range(10)))]
    # skipChangeCommits: the changing commit is skipped entirely, later appends arrive.
    seen, error = run_available_now(qmf, {**base, "skipChangeCommits": "true"}, tmp_path / "ck1")
    assert error is None
    assert ids_of(pa.concat_tables([t for _, t in seen])) == [*range(10), 10, 11]
    # ignoreChanges: the rewritten files come again (Delta's semantics: duplicates possible).
    seen, error = run_available_now(qmf, {**base, "ignoreChanges": "true"}, tmp_path / "ck2")
    assert error is None
    got = pa.concat_tables([t for _, t in seen])
    assert ids_of(got) == sorted([*range(10), *added_ids(path, 2), 10, 11])
    names = [str(r["name"]) for r in as_rows(got) if r["id"] < 5]
    assert sorted(names) == sorted(["fixed"] * 5 + ["n0 a/b", "n1 a/b", "n2 a/b", "None", "n4 a/b"])
    # ignoreDeletes: a commit that only removes is skipped; one that also adds still fails.
    DeltaTable(path).delete("id >= 10")  # removes the last file, adds none
    rs_append(path, [20])
    seen, error = run_available_now(
        qmf, {"path": path, "startingVersion": "4", "ignoreDeletes": "true"}, tmp_path / "ck3"
    )
    assert error is None and data_batches(seen) == [(0, [20])]
    seen, error = run_available_now(
        qmf, {"path": path, "startingVersion": "1", "ignoreDeletes": "true"}, tmp_path / "ck4"
    )
    assert error is not None and "version 2 of" in str(error)


def added_ids(path: str, version: int) -> list[int]:
    """Ids in the files that commit ``version`` added (read straight from the log)."""
    log = Path(path, "_delta_log", f"{version:020d}.json").read_text().splitlines()
    adds = [json.loads(line)["add"] for line in log if line.startswith('{"add"')]
    out: list[int] = []
    for a in adds:
        out += pq.read_table(os.path.join(path, a["path"]), columns=["id"]).column("id").to_pylist()
    return out


def test_large_binary_without_parquet_statistics(qmf: SparkSession, tmp_path: Path) -> None:
    path = new_table(tmp_path / "t")
    big = 1024 * 1024
    for b in range(3):
        t = events(range(4 * b, 4 * b + 4), body_size=big)
        append_batch(qmf.createDataFrame(t).coalesce(1), path, app_id="w", batch_id=b)
    files = sorted(Path(path).glob("*.parquet"))
    assert len(files) == 3
    meta = pq.ParquetFile(files[0]).metadata
    body = next(i for i in range(meta.num_columns) if meta.schema.column(i).path == "body")
    stats = meta.row_group(0).column(body).statistics
    assert stats is None or not stats.has_null_count  # Spark wrote no stats for the bodies
    seen, error = run_available_now(qmf, {"path": path, "maxRowsPerTrigger": "5"}, tmp_path / "ck")
    assert error is None
    assert data_batches(seen) == [(0, [0, 1, 2, 3]), (1, [4, 5, 6, 7]), (2, [8, 9, 10, 11])]
    got = pa.concat_tables([t for _, t in seen])
    rows = as_rows(got)
    assert [len(r["body"]) for r in rows] == [big] * 12
    assert rows == expected(range(12), body_size=big)  # bytes compared, not printed on success


def test_table_created_after_the_query_started(qmf: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "later")
    with pytest.raises(Exception, match="does not exist"):
        stream(qmf, {"path": path})
    ck = tmp_path / "ck"
    seen, error = run_available_now(qmf, {"path": path}, ck, schema=SPARK_EVENTS)
    assert error is None and data_batches(seen) == []
    new_table(Path(path))
    rs_append(path, range(3))
    rs_append(path, range(3, 5))
    seen, error = run_available_now(qmf, {"path": path}, ck, schema=SPARK_EVENTS)
    assert error is None and as_rows(pa.concat_tables([t for _, t in seen])) == expected(range(5))
    other = spark_schema(pa.schema([pa.field("id", pa.int64())]))
    seen, error = run_available_now(qmf, {"path": path}, tmp_path / "ck2", schema=other)
    assert error is not None and "the query reads struct<id:bigint>" in str(error)


def test_many_commits_between_triggers(qmf: SparkSession, tmp_path: Path) -> None:
    path = new_table(tmp_path / "t")
    ck = tmp_path / "ck"
    seen, error = run_available_now(qmf, {"path": path, "maxFilesPerTrigger": "40"}, ck)
    assert error is None and data_batches(seen) == []
    for k in range(60):
        rs_append(path, [k])
    seen, error = run_available_now(qmf, {"path": path, "maxFilesPerTrigger": "40"}, ck)
    assert error is None
    assert [(b, len(ids)) for b, ids in data_batches(seen)] == [(1, 40), (2, 20)]  # 0: empty
    assert sorted(i for _, ids in data_batches(seen) for i in ids) == list(range(60))


def test_first_batch_start_is_known_only_inside_a_starting_snapshot() -> None:
    """A first batch that ends inside a starting snapshot began at that snapshot's start
    (only an initial offset makes snapshot positions); any other end leaves it unknown."""
    from pipeline.lake.delta_source import _snapshot_starts

    snap = json.dumps({"version": 8, "index": 1, "snapshot": True})
    other = json.dumps({"version": 3, "index": 2, "snapshot": True})
    commit = json.dumps({"version": 9, "index": 0})
    assert [json.loads(s) for s in _snapshot_starts([snap, other]) or []] == [
        {"version": 8, "index": 0, "snapshot": True},
        {"version": 3, "index": 0, "snapshot": True},
    ]
    assert _snapshot_starts([snap, commit]) is None
    assert _snapshot_starts(None) is None


def test_a_first_batch_replayed_after_a_restart_reads_what_it_planned(tmp_path: Path) -> None:
    """A restarted query asks ``initialOffset()`` again for its uncommitted first batch; a
    commit in between makes that a newer snapshot. The batch's end names the start it
    was planned from, so the replay reads the same rows, and the new commit comes next."""
    path = new_table(tmp_path / "t")
    rs_append(path, range(0, 4))
    rs_append(path, range(4, 6))
    first = reader(path)
    end = first.latestOffset(first.initialOffset(), ReadAllAvailable())
    rs_append(path, range(6, 9))  # lands while the first attempt dies
    again = reader(path)  # the restarted process
    assert again.initialOffset() == {"version": 3, "index": 0, "snapshot": True}
    assert ids_of(read_range(again, again.initialOffset(), end)) == list(range(6))
    nxt = again.latestOffset(end, ReadAllAvailable())
    assert ids_of(read_range(again, end, nxt)) == [6, 7, 8]


def test_batch_files_knows_every_batch_of_a_query_the_first_included(
    qmf: SparkSession, tmp_path: Path
) -> None:
    """What a driver reads from the offset log (``read_batch``) is each batch's rows, also
    for a first batch that took the whole starting snapshot and for one after a restart
    (these went through Spark's scan, a backlog collected through the JVM), and for a
    union whose second source has nothing new in a batch: Spark logs that source's
    start again as its end, whose "from" names an earlier batch's start."""
    from pipeline.lake.delta_source import read_batch

    a, b = new_table(tmp_path / "a"), new_table(tmp_path / "b")
    rs_append(a, range(0, 4))
    rs_append(a, range(4, 6))
    rs_append(b, range(100, 102))
    ck = tmp_path / "ck"
    both: list[tuple[int, list[int], list[int], list[int]]] = []

    def collect(df: DataFrame, batch_id: int) -> None:
        got = read_batch(str(ck), batch_id, [(a, SPARK_EVENTS, ["id"]), (b, SPARK_EVENTS, ["id"])])
        assert got is not None, f"batch {batch_id} not known from the offset log"
        both.append((batch_id, ids_of(df.toArrow()), ids_of(got[0]), ids_of(got[1])))

    for appended in (range(6, 9), range(9, 10)):
        query = (
            stream(qmf, {"path": a})
            .unionByName(stream(qmf, {"path": b}))
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(ck))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(240)
        assert query.exception() is None
        rs_append(a, appended)  # b gets nothing more
    assert both == [
        (0, [*range(6), 100, 101], list(range(6)), [100, 101]),
        (1, [6, 7, 8], [6, 7, 8], []),
    ]


def test_a_source_with_nothing_new_reads_nothing(tmp_path: Path) -> None:
    """Its end offset is its start, unchanged (and names an earlier batch's start)."""
    path = new_table(tmp_path / "t")
    rs_append(path, range(0, 3))
    r = reader(path)
    end = r.latestOffset(r.initialOffset(), ReadAllAvailable())
    again = r.latestOffset(end, ReadAllAvailable())
    assert again == end and "from" in again
    assert r.partitions(end, again) == []
