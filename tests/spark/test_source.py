"""The ``qmf`` source serves exactly what LandingWriter landed, replayably."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession

from pipeline.source import (
    LandingRange,
    QmfOptions,
    QmfSourceError,
    QmfStreamReader,
    admit,
    lag,
    register,
    split_ranges,
)
from receivers.landing import LandedMessage, LandingLog, LandingWriter, message_key
from schemas.tables import LANDING, spark_schema

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
T0_US = 1_700_000_000_000_000
COLUMNS = [f.name for f in LANDING]


# --------------------------------------------------------------------------- helpers


def make_message(partition: str, i: int) -> LandedMessage:
    """A message whose every field is derived from (partition, i), so tests know it exactly."""
    return LandedMessage(
        body=f"AM1c{partition}-{i:06d}".encode() + bytes([i % 256]),
        routing_key=f"mgmt.agent{i % 3}.obj.org.apache.qpid.broker.queue{i % 5}",
        subject=f"mgmt.agent{i % 3}.obj.org.apache.qpid.broker.queue{i % 5}",
        message_id=f"{partition}-{i}",
        correlation_id=None if i % 2 else f"c{i}",
        reply_to=None,
        app_id="qmf-test",
        content_type="application/octet-stream",
        application_properties={"qmf.opcode": "_data", "n": str(i)},
        received_at_us=T0_US + i,
    )


def land(
    root: Path, partition: str, segment_sizes: Sequence[int], first_index: int = 0
) -> list[LandedMessage]:
    """Write segments of the given sizes; returns the messages in offset order."""
    writer = LandingWriter(root, partition, fsync=False)
    out: list[LandedMessage] = []
    i = first_index
    for size in segment_sizes:
        msgs = [make_message(partition, j) for j in range(i, i + size)]
        writer.append(msgs)
        out.extend(msgs)
        i += size
    return out


def expected_row(partition: str, offset: int, m: LandedMessage) -> tuple[Any, ...]:
    return (
        partition,
        "default",  # broker_name: the writers here name no broker
        offset,
        message_key(m),
        datetime.fromtimestamp(m.received_at_us / 1e6, UTC).replace(tzinfo=None),
        m.routing_key,
        m.subject,
        m.message_id,
        m.correlation_id,
        m.reply_to,
        m.app_id,
        m.content_type,
        dict(m.application_properties),
        m.body,
        m.redelivered,
        m.duplicate_of,
    )


def rows_of(df: DataFrame) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in df.select(*COLUMNS).orderBy("partition", "offset").collect()]


def run_available_now(
    spark: SparkSession, options: Mapping[str, str], checkpoint: Path, timeout_s: int = 180
) -> tuple[list[tuple[int, list[tuple[str, int]]]], list[dict[str, Any]]]:
    """Run one AvailableNow query; returns [(batch_id, [(partition, offset)...])] and progress."""
    seen: list[tuple[int, list[tuple[str, int]]]] = []

    def collect(df: DataFrame, batch_id: int) -> None:
        got = sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())
        seen.append((batch_id, got))

    reader = spark.readStream.format("qmf")
    for k, v in options.items():
        reader = reader.option(k, v)
    query = (
        reader.load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(timeout_s), "AvailableNow query did not stop by itself"
        assert query.exception() is None
        progress = [dict(p) for p in query.recentProgress]
    finally:
        query.stop()
    return seen, progress


@pytest.fixture(scope="module")
def qmf(spark: SparkSession) -> SparkSession:
    register(spark)
    return spark


# --------------------------------------------------------------------------- pure parts


def test_options_are_validated() -> None:
    ok = QmfOptions.parse(
        {"path": "/x", "maxRecordsPerTrigger": "10", "startingOffsets": '{"a": 3}'}
    )
    assert ok.path == "/x"
    assert ok.max_records_per_trigger == 10
    assert ok.starting_offsets == {"a": 3}
    assert ok.retention == "none"
    bad: list[tuple[dict[str, str], str]] = [
        ({}, "needs option path"),
        ({"path": "/x", "maxRecordsPerTrigger": "0"}, "must be > 0"),
        ({"path": "/x", "maxRecordsPerTrigger": "ten"}, "expected an integer"),
        ({"path": "/x", "startingOffsets": "oldest"}, "expected earliest, latest or JSON"),
        ({"path": "/x", "startingOffsets": '{"a": -1}'}, "offsets >= 0"),
        ({"path": "/x", "retention": "forever"}, "expected none or committed"),
        ({"path": "/x", "retentionSlack": "-5"}, "must be >= 0"),
        ({"path": "/x", "embeddedReceiver": "maybe"}, "expected true or false"),
        ({"path": "/x", "maxRecordPerTrigger": "5"}, "unknown option(s)"),
    ]
    for opts, message in bad:
        with pytest.raises(QmfSourceError, match=message.replace("(", r"\(").replace(")", r"\)")):
            QmfOptions.parse(opts)


def test_admit_shares_the_limit_fairly() -> None:
    start = {"a": 0, "b": 0, "c": 10}
    available = {"a": 700, "b": 300, "c": 12}
    assert admit(start, available, None) == {"a": 700, "b": 300, "c": 12}
    assert admit(start, available, 250) == {"a": 124, "b": 124, "c": 12}
    assert admit(start, available, 2000) == {"a": 700, "b": 300, "c": 12}
    # A new partition (absent from start) counts from 0; nothing new -> start unchanged.
    assert admit({"a": 5}, {"a": 5, "d": 3}, 2) == {"a": 5, "d": 2}
    assert admit({"a": 5}, {"a": 5}, 2) == {"a": 5}


def test_split_ranges_bounds_task_size() -> None:
    got = split_ranges("/r", {"a": 3, "b": 0}, {"a": 20, "b": 7, "c": 2}, 7)
    assert got == [
        LandingRange("/r", "a", 3, 10),
        LandingRange("/r", "a", 10, 17),
        LandingRange("/r", "a", 17, 20),
        LandingRange("/r", "b", 0, 7),
        LandingRange("/r", "c", 0, 2),
    ]


def test_lag_from_progress() -> None:
    src = {"endOffset": '{"a": 5, "b": 2}', "latestOffset": '{"a": 9, "b": 2, "c": 4}'}
    assert lag(src) == {"a": 4, "b": 0, "c": 4}


def test_reader_ranges_are_deterministic(tmp_path: Path) -> None:
    """Same offsets -> same rows, whatever the split, straight from the reader."""
    root = tmp_path / "landing"
    land(root, "a", [5, 9, 1, 10])
    land(root, "b", [3])
    schema = spark_schema(LANDING)
    reader = QmfStreamReader(schema, {"path": str(root), "maxRecordsPerPartition": "4"})
    start, end = {"a": 2, "b": 0}, {"a": 23, "b": 3}
    parts = reader.partitions(start, end)
    assert [(p.partition, p.start, p.end) for p in parts] == [
        ("a", 2, 6), ("a", 6, 10), ("a", 10, 14), ("a", 14, 18), ("a", 18, 22), ("a", 22, 23),
        ("b", 0, 3),
    ]  # fmt: skip
    first = pa.Table.from_batches([b for p in parts for b in reader.read(p)], LANDING)
    again = pa.Table.from_batches(
        [b for p in reader.partitions(start, end) for b in reader.read(p)], LANDING
    )
    assert first.equals(again)
    log = LandingLog(root)
    assert first.equals(pa.concat_tables([log.read("a", 2, 23), log.read("b", 0, 3)]))
    assert first.column("offset").to_pylist() == [*range(2, 23), 0, 1, 2]


def test_reader_offsets_admission_and_regression(tmp_path: Path) -> None:
    """The driver-side calls, straight: what Spark asks and what the source answers."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    from receivers.landing import LandingError

    root = tmp_path / "landing"
    land(root, "a", [10, 10])
    reader = QmfStreamReader(spark_schema(LANDING), {"path": str(root)})
    assert reader.initialOffset() == {"a": 0}
    assert reader.latestOffset({"a": 0}, ReadMaxRows(5)) == {"a": 5}
    assert reader.latestOffset({"a": 5}, ReadAllAvailable()) == {"a": 20}
    assert reader.latestOffset({"a": 20}, ReadAllAvailable()) == {"a": 20}
    reader.prepareForTriggerAvailableNow()
    land(root, "a", [10], first_index=20)
    land(root, "b", [4])
    assert reader.latestOffset({"a": 20}, ReadAllAvailable()) == {"a": 20}  # target holds
    assert reader.reportLatestOffset() == {"a": 30, "b": 4}
    with pytest.raises(LandingError, match="behind the query's offsets"):
        reader.latestOffset({"a": 31}, ReadAllAvailable())


# --------------------------------------------------------------------------- with Spark


def test_batch_read_exact_contents(qmf: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "landing"
    a = land(root, "a", [4, 3])
    b = land(root, "b", [5])
    df = qmf.read.format("qmf").option("path", str(root)).load()
    assert df.schema == spark_schema(LANDING)
    expected = [expected_row("a", i, m) for i, m in enumerate(a)]
    expected += [expected_row("b", i, m) for i, m in enumerate(b)]
    assert rows_of(df) == expected


def test_batch_read_of_an_offset_range_is_repeatable(qmf: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "landing"
    a = land(root, "a", [10, 10, 10])
    b = land(root, "b", [2])

    def read() -> list[tuple[Any, ...]]:
        return rows_of(
            qmf.read.format("qmf")
            .option("path", str(root))
            .option("startingOffsets", json.dumps({"a": 7, "b": 1}))
            .option("endingOffsets", json.dumps({"a": 25, "b": 2}))
            .option("maxRecordsPerPartition", "4")
            .load()
        )

    first = read()
    land(root, "a", [5], first_index=30)  # more data must not change a fixed range
    assert read() == first
    assert first == [expected_row("a", i, a[i]) for i in range(7, 25)] + [
        expected_row("b", 1, b[1])
    ]


def test_empty_log_reads_nothing(qmf: SparkSession, tmp_path: Path) -> None:
    df = qmf.read.format("qmf").option("path", str(tmp_path / "nothing")).load()
    assert df.count() == 0


def test_missing_path_fails_at_load(qmf: SparkSession) -> None:
    with pytest.raises(Exception, match="needs option path"):
        qmf.readStream.format("qmf").load()


def test_max_records_per_trigger_available_now_and_lag(qmf: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "landing"
    land(root, "a", [100] * 7)
    land(root, "b", [150, 150])
    batches, progress = run_available_now(
        qmf,
        {"path": str(root), "maxRecordsPerTrigger": "250", "maxRecordsPerPartition": "100"},
        tmp_path / "ck",
    )
    assert [b for b, _ in batches] == [0, 1, 2, 3]
    assert [len(rows) for _, rows in batches] == [250, 250, 250, 250]
    # Fair share: b (smaller backlog) first, a gets the rest.
    ends = [
        {
            p: max(o for q, o in rows if q == p) + 1
            for p in ("a", "b")
            if any(q == p for q, _ in rows)
        }
        for _, rows in batches
    ]
    assert ends == [{"a": 125, "b": 125}, {"a": 250, "b": 250}, {"a": 450, "b": 300}, {"a": 700}]
    everything = sorted(r for _, rows in batches for r in rows)
    assert everything == [("a", i) for i in range(700)] + [("b", i) for i in range(300)]
    data = [p for p in progress if p["numInputRows"] > 0]
    assert [lag(p["sources"][0]) for p in data] == [
        {"a": 575, "b": 175},
        {"a": 450, "b": 50},
        {"a": 250, "b": 0},
        {"a": 0, "b": 0},
    ]


def test_available_now_without_limit_is_one_batch(qmf: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "landing"
    land(root, "a", [30, 30])
    batches, _ = run_available_now(qmf, {"path": str(root)}, tmp_path / "ck")
    assert [(b, len(rows)) for b, rows in batches] == [(0, 60)]


def test_starting_offsets_latest_then_new_data_and_partitions(
    qmf: SparkSession, tmp_path: Path
) -> None:
    root = tmp_path / "landing"
    land(root, "a", [100])
    ck = tmp_path / "ck"
    opts = {"path": str(root), "startingOffsets": "latest"}
    first, _ = run_available_now(qmf, opts, ck)
    assert sum(len(rows) for _, rows in first) == 0
    land(root, "a", [40], first_index=100)
    land(root, "b", [3])  # a partition new to the query is read from its start
    second, _ = run_available_now(qmf, opts, ck)
    got = sorted(r for _, rows in second for r in rows)
    assert got == [("a", i) for i in range(100, 140)] + [("b", 0), ("b", 1), ("b", 2)]


def test_starting_offsets_json(qmf: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "landing"
    land(root, "a", [10])
    land(root, "b", [10])
    batches, _ = run_available_now(
        qmf, {"path": str(root), "startingOffsets": '{"a": 8, "b": 10}'}, tmp_path / "ck"
    )
    assert sorted(r for _, rows in batches for r in rows) == [("a", 8), ("a", 9)]


def test_retention_deletes_only_committed_segments(qmf: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "landing"
    land(root, "a", [10] * 10)
    seg_dir = root / "a"
    seen: list[tuple[int, int, str]] = []
    offsets: list[int] = []

    def collect(df: DataFrame, batch_id: int) -> None:
        first = sorted(n for n in os.listdir(seg_dir) if n.endswith(".arrow"))[0]
        rows = [int(r["offset"]) for r in df.select("offset").collect()]
        offsets.extend(rows)
        seen.append((batch_id, len(rows), first.split("-")[0].lstrip("0") or "0"))

    def run() -> None:
        query = (
            qmf.readStream.format("qmf")
            .option("path", str(root))
            .option("maxRecordsPerTrigger", "30")
            .option("retention", "committed")
            .option("retentionSlack", "15")
            .load()
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        try:
            assert query.awaitTermination(180)
        finally:
            query.stop()

    def listing() -> list[str]:
        segments = sorted(n for n in os.listdir(seg_dir) if n.endswith(".arrow"))
        return [n.split("-")[0].lstrip("0") or "0" for n in segments]

    run()
    # While batch k runs, only segments below (end of batch k-1) - 15 are gone.
    assert seen == [(0, 30, "0"), (1, 30, "10"), (2, 30, "40"), (3, 10, "70")]
    # Spark tells the source about the last batch's commit only when it plans
    # the next one: after an AvailableNow run the last batch's segments stay.
    assert listing() == ["70", "80", "90"]
    land(root, "a", [10], first_index=100)
    run()
    # The restart commits 100 first (below 85 goes), then reads 100..110.
    assert seen[4:] == [(4, 10, "80")]
    assert listing() == ["80", "90", "100"]
    # Across retention and the restart from the checkpoint: every offset
    # exactly once, nothing read twice, nothing missed.
    assert offsets == list(range(110))
    # A range that retention removed is reported, never silently skipped.
    with pytest.raises(Exception, match="not on disk"):
        qmf.read.format("qmf").option("path", str(root)).option(
            "startingOffsets", '{"a": 0}'
        ).load().count()


# Run on the standalone cluster by tests/spark/test_cluster_jobs.py (its executors' Python
# workers read the landing log: read() runs there, not in the driver).
CLUSTER_PROBE = """
import json, sys
from pipeline.spark import get_spark
from pipeline.source import register

root, out, ck = sys.argv[1], sys.argv[2], sys.argv[3]
spark = get_spark("qmf-source-on-a-cluster")
register(spark)
sc = spark.sparkContext
executors = sc._jsc.sc().getExecutorMemoryStatus().size() - 1
batch = spark.read.format("qmf").option("path", root).option("maxRecordsPerPartition", "64").load()
q = (
    spark.readStream.format("qmf").option("path", root)
    .option("maxRecordsPerTrigger", "300").option("maxRecordsPerPartition", "64").load()
    .writeStream.format("parquet").option("path", out).option("checkpointLocation", ck)
    .trigger(availableNow=True).start()
)
ok = q.awaitTermination(240)
q.stop()
print("RESULT=" + json.dumps({
    "master": sc.master, "executors": executors, "stopped": ok,
    "batch_partitions": batch.rdd.getNumPartitions(), "batch_rows": batch.count(),
    "batches": len([p for p in q.recentProgress if p["numInputRows"] > 0]),
}))
spark.stop()
"""


def test_large_bodies_are_read_in_bounded_batches(tmp_path: Path) -> None:
    """Real bodies reach ~100 KB: batches are cut by bytes too, never one 2 GiB array."""
    from pipeline.source import bounded_batches

    sizes = [100, 5_000, 100_000, 1_000_000, 300, 70_000, 70_000, 70_000, 2_000_000, 10]
    msgs = [LandedMessage(body=bytes([i]) * n, routing_key=f"k{i}") for i, n in enumerate(sizes)]
    w = LandingWriter(tmp_path, "a", fsync=False)
    w.append(msgs[:4])
    w.append(msgs[4:])
    table = LandingLog(tmp_path).read("a", 0, len(msgs))
    batches = list(bounded_batches(table, max_rows=3, max_bytes=150_000))
    assert [b.num_rows for b in batches] == [3, 1, 3, 1, 1, 1]
    assert [len(b.column("body").to_pylist()[0]) for b in batches] == [
        100, 1_000_000, 300, 70_000, 2_000_000, 10,
    ]  # fmt: skip
    assert pa.Table.from_batches(batches).equals(table.combine_chunks())
