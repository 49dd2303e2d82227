"""``streaming.stop_query``: a stop lands between batches, not in one (a real stream).

A plain ``StreamingQuery.stop()`` during a Python ``foreachBatch`` cancels the
batch's Spark job; with the gate the batch in flight ends first, and an idle
query stops at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from pipeline.runtime.streaming import StopGate, poll_s, start_gated, stop_queries, stop_query

pytestmark = [pytest.mark.spark]

JOB_S = 3.0  # each batch runs a Spark job this long
# A trigger that never fires again during a test. Spark aligns processing-time
# triggers to multiples of the interval since the epoch, so "1 hour" fires at the
# next full hour: a test run at 23:59:58 saw a second batch. The next multiple of
# 3650 days is years away.
NEVER = "3650 days"


def _slow(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    time.sleep(JOB_S)
    yield from batches


class Recorder:
    """A foreachBatch function that runs a slow Spark job and notes each batch's start
    and end (the end only when its job was not cancelled)."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.ended: list[int] = []

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        self.started.append(batch_id)
        df.coalesce(1).mapInArrow(_slow, df.schema).count()
        self.ended.append(batch_id)


def _start(spark: SparkSession, tmp: Path, fn: object, trigger: dict[str, str]) -> object:
    return (
        spark.readStream.format("rate").option("rowsPerSecond", 5).load()
        .writeStream.foreachBatch(fn)  # type: ignore[arg-type]
        .option("checkpointLocation", str(tmp))
        .trigger(**trigger)  # type: ignore[arg-type]
        .start()
    )  # fmt: skip


def _wait(cond: object, timeout_s: float = 120) -> None:
    end = time.monotonic() + timeout_s
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def test_a_stop_during_a_batch_lets_the_batch_end_first(spark: SparkSession, tmp_path: Path) -> None:
    # Without the gate (the control): stop() cancels the batch's job, its end never comes.
    plain = Recorder()
    q = _start(spark, tmp_path / "plain", plain, {"processingTime": "0 seconds"})
    _wait(lambda: plain.started)
    time.sleep(0.5)
    q.stop()  # type: ignore[attr-defined]
    assert q.exception() is None  # type: ignore[attr-defined]
    assert plain.ended == [] and plain.started == [0]

    # With the gate: the batch in flight ends, then the query stops; no batch after it.
    rec = Recorder()
    gate = StopGate(rec)
    q = gate.bind(_start(spark, tmp_path / "gated", gate, {"processingTime": "0 seconds"}))  # type: ignore[arg-type]
    _wait(lambda: rec.started)
    time.sleep(0.5)
    t0 = time.monotonic()
    assert stop_query(q) is True
    waited = time.monotonic() - t0
    assert not q.isActive and q.exception() is None
    assert rec.started == rec.ended == [0]
    assert gate.stopped_between
    assert 1.0 < waited < JOB_S + 30  # it waited for the job, not for the grace


def test_an_idle_query_stops_at_once(spark: SparkSession, tmp_path: Path) -> None:
    rec = Recorder()
    gate = StopGate(rec)
    q = gate.bind(_start(spark, tmp_path, gate, {"processingTime": NEVER}))  # type: ignore[arg-type]
    _wait(lambda: rec.ended)
    _wait(lambda: not q.status["isTriggerActive"])
    t0 = time.monotonic()
    assert stop_query(q) is True
    assert time.monotonic() - t0 < JOB_S
    assert not q.isActive and q.exception() is None
    assert rec.started == rec.ended == [0]
    assert not gate.stopped_between  # stopped directly: nothing was in flight


def test_the_grace_bounds_the_wait(spark: SparkSession, tmp_path: Path) -> None:
    rec = Recorder()
    gate = StopGate(rec)
    q = gate.bind(_start(spark, tmp_path, gate, {"processingTime": "0 seconds"}))  # type: ignore[arg-type]
    _wait(lambda: rec.started)
    assert stop_query(q, grace_s=0.5) is False  # the batch was cancelled
    assert not q.isActive and q.exception() is None
    assert rec.ended == []


def _gated(spark: SparkSession, rec: Recorder, tmp: Path, name: str, every: str) -> StreamingQuery:
    """A rate stream into ``rec``, started as the jobs start theirs (``start_gated``)."""
    stream = spark.readStream.format("rate").option("rowsPerSecond", 5).load()
    return start_gated(stream, rec, name=name, checkpoint=str(tmp / name),
                       trigger=f"processingTime={every}")  # fmt: skip


def test_several_queries_stop_together_within_one_grace(spark: SparkSession, tmp_path: Path) -> None:
    """``qmf run`` stops its three queries with ``stop_queries``: every gate is asked
    first, so the stop waits one grace period in all, not one per query."""
    busy, idle = Recorder(), Recorder()
    qb = _gated(spark, busy, tmp_path, "busy", "0 seconds")
    qi = _gated(spark, idle, tmp_path, "idle", NEVER)
    _wait(lambda: idle.ended and busy.started)
    _wait(lambda: not qi.status["isTriggerActive"])
    assert stop_queries([qb, qi]) == [True, True]
    assert not qb.isActive and not qi.isActive
    assert busy.started == busy.ended  # the batch in flight ended: nothing cancelled
    assert idle.started == idle.ended == [0]

    # Two batches in flight and a grace shorter than either: both are cancelled, and
    # the whole stop took one grace, not two.
    one, two = Recorder(), Recorder()
    q1 = _gated(spark, one, tmp_path, "one", "0 seconds")
    q2 = _gated(spark, two, tmp_path, "two", "0 seconds")
    _wait(lambda: one.started and two.started)
    t0 = time.monotonic()
    assert stop_queries([q1, q2], grace_s=JOB_S / 2) == [False, False]
    assert time.monotonic() - t0 < JOB_S * 0.9
    assert not q1.isActive and not q2.isActive
    assert one.ended == [] and two.ended == []


def test_the_driver_jvm_gets_deep_thread_stacks(spark: SparkSession) -> None:
    """The stops the gate cannot avoid (a cancel after the grace) must not overflow
    the stream thread's stack: the JVM we launch runs with ``DRIVER_STACK``."""
    from pipeline.spark import DRIVER_STACK

    bean = spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()  # type: ignore[union-attr]
    assert DRIVER_STACK in list(bean.getInputArguments())


@pytest.mark.parametrize(
    ("left", "want"), [(5.0, 0.1), (0.1, 0.1), (0.05, 0.05), (0.0004, 0.001), (1e-9, 0.001)]
)
def test_the_wait_between_looks_is_a_whole_millisecond_at_least(left: float, want: float) -> None:
    """A grace with under a millisecond left made ``awaitTermination(0)`` (pyspark passes
    whole ms), which Spark refuses: ``stop_queries`` failed instead of cancelling (seen
    once in CI, 2026-12-03)."""
    assert poll_s(left) == want
    assert int(poll_s(left) * 1000) >= 1
