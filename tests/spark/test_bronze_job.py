"""Landing log -> bronze: exactly the landed messages, once, across restarts and replays."""

from __future__ import annotations

import dataclasses
import subprocess
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from pipeline.bronze import BronzeSettings, checkpoint_query_id, start_bronze
from pipeline.bronze.transforms import bronze_batch
from pipeline.lake import delta
from pipeline.runtime.streaming import trigger_kwargs
from pipeline.source import register
from receivers.landing import LandedMessage, LandingLog, LandingWriter, message_key
from schemas.tables import BRONZE, LANDING, spark_schema
from tests.lake import stray_files
from tests.spark.test_source import REPO, land
from tests.submit import SPARK_SUBMIT, spark_submit_env

pytestmark = pytest.mark.spark

CONTENT = ("msg_key", "routing_key", "subject", "message_id", "correlation_id", "app_id",
           "content_type", "application_properties", "body")  # fmt: skip


def land_copies(
    root: Path, partition: str, msgs: Sequence[LandedMessage], origin: str, first: int
) -> None:
    """Redeliveries as the receiver lands them: flagged, matched to their first
    copies at ``origin:first..`` (later receive time, other offsets)."""
    copies = [
        dataclasses.replace(
            m, received_at_us=m.received_at_us + 10_000_000, redelivered=True,
            duplicate_of=f"{origin}:{first + i}",
        )
        for i, m in enumerate(msgs)
    ]
    LandingWriter(root, partition, fsync=False).append(copies)


def content(m: LandedMessage) -> tuple[Any, ...]:
    return (
        message_key(m), m.routing_key, m.subject, m.message_id, m.correlation_id, m.app_id,
        m.content_type, sorted(m.application_properties.items()), m.body,
    )  # fmt: skip


def bronze_content(table: pa.Table) -> list[tuple[Any, ...]]:
    rows = table.select(list(CONTENT)).to_pylist()
    return sorted(
        tuple(sorted(r[c]) if c == "application_properties" else r[c] for c in CONTENT)
        for r in rows
    )


def test_trigger_parsing() -> None:
    assert trigger_kwargs("availableNow") == {"availableNow": True}
    assert trigger_kwargs("processingTime=5 seconds") == {"processingTime": "5 seconds"}
    with pytest.raises(ValueError, match="expected availableNow"):
        trigger_kwargs("once")


def test_bronze_batch_keeps_twins_and_drops_matched_redeliveries(
    spark: SparkSession, tmp_path: Path
) -> None:
    root = tmp_path / "landing"
    a = land(root, "a", [4])
    w = LandingWriter(root, "a", fsync=False)
    w.append([a[1], a[1]])  # offsets 4, 5: twins of offset 1 (really sent again): kept
    w.append([dataclasses.replace(a[2], redelivered=True)])  # 6: first copy never landed: kept
    land_copies(root, "b", a[0:2], "a", 0)  # matched redeliveries: dropped
    register(spark)
    df = spark.read.format("qmf").option("path", str(root)).load()
    out = bronze_batch(df, 7)
    assert out.columns == BRONZE.names
    got = sorted((r.partition, r.offset, r.msg_key, r.redelivered, r.batch_id) for r in out.collect())
    assert got == [
        ("a", 0, message_key(a[0]), False, 7), ("a", 1, message_key(a[1]), False, 7),
        ("a", 2, message_key(a[2]), False, 7), ("a", 3, message_key(a[3]), False, 7),
        ("a", 4, message_key(a[1]), False, 7), ("a", 5, message_key(a[1]), False, 7),
        ("a", 6, message_key(a[2]), True, 7),
    ]  # fmt: skip


def _wait_for(pred: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


@pytest.mark.parametrize(
    ("writer", "retention"), [("tasks", "committed"), ("arrow", "committed"), ("spark", "none")]
)
def test_restart_from_checkpoint_no_duplicates_no_gaps(
    spark: SparkSession, tmp_path: Path, writer: str, retention: str
) -> None:
    """Every writer; the task and driver paths with retention (slack 0) deleting
    behind the query (the tasks read the landing log themselves)."""
    root, table, ck = tmp_path / "landing", str(tmp_path / "bronze"), str(tmp_path / "ck")
    a = land(root, "a", [100, 100, 100])
    b = land(root, "b", [120])

    def settings(trigger: str) -> BronzeSettings:
        return BronzeSettings(
            landing=str(root), table=table, checkpoint=ck, trigger=trigger,
            max_records_per_trigger=150, writer=writer, retention=retention,
        )  # fmt: skip

    # Run 1 drains what is there.
    q = start_bronze(spark, settings("availableNow"))
    try:
        assert q.awaitTermination(300)
    finally:
        q.stop()
    app_id = f"qmf-bronze-{checkpoint_query_id(ck)}"
    last = delta.committed_batch(table, app_id)
    assert last == 2  # 420 rows, 150 per batch

    # A crash between the Delta commit and the checkpoint's commit: Spark
    # replays the last batch on restart; the app transaction skips it.
    (Path(ck) / "commits" / str(last)).unlink()
    (Path(ck) / "commits" / f".{last}.crc").unlink(missing_ok=True)

    # More data: new messages and a redelivery of old ones into a new partition.
    a += land(root, "a", [100, 100], first_index=300)
    land_copies(root, "c", a[10:40], "a", 10)
    land_copies(root, "c", b[0:20], "b", 0)
    b += land(root, "b", [80], first_index=120)

    # Run 2: a processing-time query, stopped mid-way once it wrote a batch.
    q = start_bronze(spark, settings("processingTime=1 second"))
    try:
        _wait_for(lambda: (delta.committed_batch(table, app_id) or 0) > last, 300, "run 2 batch")
    finally:
        q.stop()
    # Run 3 drains the rest.
    q = start_bronze(spark, settings("availableNow"))
    try:
        assert q.awaitTermination(300)
    finally:
        q.stop()

    # Every batch committed exactly once: the replayed batch 2 added no commit.
    commits = sorted(b for _app, b, _v in delta.app_transactions(table))
    assert commits == list(range(len(commits))) and commits[-1] > last

    out = delta.read_arrow(table)
    assert sorted(set(out["batch_id"].to_pylist())) == commits
    keys = out.column("msg_key").to_pylist()
    assert len(keys) == len(set(keys)) == len(a) + len(b)
    assert bronze_content(out) == sorted(content(m) for m in a + b)
    # Each stored copy is one of the landed positions of that message.
    positions = {(p, o) for p, o in zip(out["partition"].to_pylist(), out["offset"].to_pylist(), strict=True)}
    assert {p for p, _ in positions} <= {"a", "b", "c"}
    assert len(positions) == len(keys)
    if retention == "committed":  # retention ran: the oldest segment of "a" is gone
        assert LandingLog(root).start_offsets()["a"] > 0


@pytest.mark.slow
def test_bronze_job_through_spark_submit(tmp_path: Path) -> None:
    root, table, ck = tmp_path / "landing", tmp_path / "bronze", tmp_path / "ck"
    a = land(root, "a", [150, 150])
    b = land(root, "b", [100, 100])
    land_copies(root, "c", b[0:20], "b", 0)
    proc = subprocess.run(
        [
            SPARK_SUBMIT,
            "--master", "local[2]",
            "--conf", "spark.ui.enabled=false",
            "--conf", "spark.sql.shuffle.partitions=2",
            "--driver-memory", "1g",
            str(REPO / "jobs" / "bronze.py"),
            "--landing", str(root), "--table", str(table), "--checkpoint", str(ck),
            "--trigger", "availableNow", "--max-records-per-trigger", "200",
            "--timeout", "400",
        ],
        capture_output=True, text=True, timeout=600, env=spark_submit_env(), check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    # Admission control (fair share, smallest backlog first) fixes the batches:
    # 0: c[0:20] b[0:90] a[0:90] (c's rows are matched redeliveries: skipped)
    # 1: b[90:190] a[90:190]     2: b[190:200] a[190:300]
    batch_of = {("a", i): 0 if i < 90 else 1 if i < 190 else 2 for i in range(300)}
    batch_of |= {("b", i): 0 if i < 90 else 1 if i < 190 else 2 for i in range(200)}
    expected = []
    for part, msgs in (("a", a), ("b", b)):
        for i, m in enumerate(msgs):
            expected.append((
                part, "default", i, message_key(m),
                datetime.fromtimestamp(m.received_at_us / 1e6, UTC),
                m.routing_key, m.subject, m.message_id, m.correlation_id, m.reply_to, m.app_id,
                m.content_type, sorted(m.application_properties.items()), m.body,
                m.redelivered, batch_of[(part, i)],
            ))  # fmt: skip
    out = delta.read_arrow(table)
    assert out.schema.names == BRONZE.names
    got = sorted(
        tuple(sorted(v) if k == "application_properties" else v for k, v in r.items())
        for r in out.to_pylist()
    )
    assert got == sorted(expected)
    assert spark_schema(LANDING).names == [*BRONZE.names[:-1], "duplicate_of"]


def am1_body(opcode: bytes, seq: int, payload: bytes) -> bytes:
    """An AM1 message: 'A' 'M' '1' opcode seq(u32), then the payload."""
    return b"AM1" + opcode + seq.to_bytes(4, "big") + payload


@pytest.mark.broker
@pytest.mark.slow
def test_broker_to_bronze_end_to_end(broker: Any, spark: SparkSession, tmp_path: Path) -> None:
    """Publish N AM1 messages; the source's embedded receiver lands them; bronze holds N."""
    import uuid

    from pipeline import broker as qmf_broker
    from receivers.publisher import Publisher

    n = 1_200
    tag = f"it{uuid.uuid4().hex[:10]}"
    queue = f"qmf-bronze-{tag}"
    qmf_broker.declare_queue(queue, [("qpid.management", f"mgmt.{tag}.#")])
    sent: list[tuple[str, bytes]] = []
    types = ("prop", "stat", "event", "schema")
    try:
        with Publisher(broker.url, window=500) as pub:
            for i in range(n):
                key = f"mgmt.{tag}.{types[i % 4]}.org.apache.qpid.broker.queue{i % 7}"
                body = am1_body(b"cige"[i % 4 : i % 4 + 1], i, f"payload-{i}".encode() * (i % 5))
                pub.publish(key, body, application_properties={"i": str(i)})
                sent.append((key, body))
            pub.flush()
        root, table, ck = tmp_path / "landing", str(tmp_path / "bronze"), str(tmp_path / "ck")
        settings = BronzeSettings(
            landing=str(root), table=table, checkpoint=ck, trigger="processingTime=1 second",
            max_records_per_trigger=500, embedded_receiver=True,
            receiver_options={"url": broker.url, "queue": queue, "partition": "r0"},
        )  # fmt: skip
        query = start_bronze(spark, settings)
        try:

            def landed_in_bronze() -> bool:
                if query.exception() is not None:
                    raise AssertionError(str(query.exception()))
                return delta.table_exists(table) and delta.read_arrow(table).num_rows >= n

            _wait_for(landed_in_bronze, 300, f"{n} rows in bronze")
        finally:
            query.stop()
        out = delta.read_arrow(table)
        assert out.num_rows == n
        got = sorted(zip(out["routing_key"].to_pylist(), out["body"].to_pylist(), strict=True))
        assert got == sorted(sent)
        assert out["subject"].to_pylist() == out["routing_key"].to_pylist()
        assert sorted(int(p["i"]) for p in map(dict, out["application_properties"].to_pylist())) == list(range(n))
        assert set(out["partition"].to_pylist()) == {"r0"}
        assert sorted(out["offset"].to_pylist()) == list(range(n))
    finally:
        qmf_broker.delete_queue(queue)


@pytest.mark.slow
def test_bronze_job_on_a_store_killed_twice_then_restarted(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL the spark-submit job (JVM and Python) twice mid-run, then take the store
away under a third run: bronze ends exact.

    The table and the checkpoint on a real S3 server (an ingest host writing bronze to
    the lake; the landing log on its disk), read back by delta-rs. On the task path
    (``--writer tasks``: ``auto`` would write these ~1 MB batches on the driver), so a
    kill can fall between the tasks' writes and the commit. Local tables: bronze killed
    twice mid-stream is tests/integration/test_crash_recovery.py (receivers killed
    beside it), the same code but for ``pipeline.lake.storage``'s calls.
    """
    import os
    import signal

    from pipeline.lake import storage

    root = tmp_path / "landing"
    bucket = s3.make_bucket("bronze-kill")
    table, ck = f"s3a://{bucket}/lake/bronze", f"s3a://{bucket}/checkpoints/bronze"
    folder = s3.folder / bucket / "lake" / "bronze"  # the server keeps the objects there
    env = {**spark_submit_env(), **s3.env()}
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)  # this process reads the table with delta-rs
    a = land(root, "a", [1_000] * 30)
    b = land(root, "b", [500] * 40)
    land_copies(root, "c", a[5_000:6_000], "a", 5_000)
    land_copies(root, "c", b[100:600], "b", 100)
    cmd = [
        SPARK_SUBMIT,
        "--master", "local[2]",
        "--conf", "spark.ui.enabled=false",
        "--conf", "spark.sql.shuffle.partitions=2",
        "--driver-memory", "1g",
        str(REPO / "jobs" / "bronze.py"),
        "--landing", str(root), "--table", table, "--checkpoint", ck,
        "--trigger", "availableNow", "--max-records-per-trigger", "5000", "--timeout", "900",
        "--writer", "tasks",
    ]  # fmt: skip

    def committed() -> int:
        if not storage.exists(storage.join(ck, "metadata")):
            return -1
        app = f"qmf-bronze-{checkpoint_query_id(ck)}"
        return max((bt for a_, bt, _v in delta.app_transactions(table) if a_ == app), default=-1)

    for _kill in range(2):
        before = committed()
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip

        def progressed(p: subprocess.Popen[bytes] = proc, b: int = before) -> bool:
            return committed() >= b + 2 or p.poll() is not None

        try:
            _wait_for(progressed, 600, "two more bronze commits")
            assert proc.poll() is None, "the job finished before it could be killed"
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(60)
    assert proc.returncode == -signal.SIGKILL
    killed_at = committed()
    assert killed_at >= 3

    # The store goes down under a running job: it stops with an error naming what it
    # could not reach (not a hang), and the run after the store is back resumes it.
    before = committed()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    try:
        _wait_for(lambda: committed() >= before + 1 or proc.poll() is not None, 600,
                  "a bronze commit")  # fmt: skip
        assert proc.poll() is None, "the job finished before the store went down"
        s3.stop()
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=300)
        down_s = time.monotonic() - t0
    finally:
        # The job's Python workers may outlive it, retrying an upload: they go before
        # the store is back, as a dead host's would (a file one lands later is in no
        # commit; VACUUM deletes it after --retention-hours).
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(60)
        s3.start()
    assert proc.returncode not in (0, -signal.SIGKILL), proc.returncode
    text = err.decode(errors="replace")
    assert "Connection refused" in text or "Unable to execute HTTP request" in text, text[-3000:]
    assert s3.secret_key not in text
    assert down_s < 240, f"the job took {down_s:.0f} s to stop without its store"

    final = subprocess.run(cmd, env=env, capture_output=True, text=True,
                           timeout=1200, check=False)  # fmt: skip
    assert final.returncode == 0, final.stderr[-4000:]

    commits = sorted(b for _app, b, _v in delta.app_transactions(table))
    # The last kill may land after the job's last commit (the restart then commits nothing).
    assert commits == list(range(len(commits))) and commits[-1] >= killed_at
    # What killed attempts wrote and did not commit went with their batches' replays.
    assert stray_files(folder) == []
    out = _read_with_delta_rs(table)
    keys = out.column("msg_key").to_pylist()
    assert len(keys) == len(set(keys)) == len(a) + len(b) == 50_000
    assert bronze_content(out) == sorted(content(m) for m in a + b)
    # Spark's offset and commit logs went to the store too.
    assert storage.exists(storage.join(ck, "commits", str(commits[-1])))


def _read_with_delta_rs(uri: str) -> pa.Table:
    """A table on the store as a reader without Spark sees it (the variables' settings)."""
    from deltalake import DeltaTable

    from pipeline.lake.storage import S3Settings

    return DeltaTable(uri, storage_options=S3Settings.from_env().storage_options()).to_pyarrow_table()
