"""A query's checkpoint is locked while it runs (``streaming.CheckpointLocks``), a real stream.

The offset and commit logs go through Hadoop's FileSystem API (``pipeline.spark``),
whose rename overwrites: the lock is what stops a second process from running a
query on the same checkpoint.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from pipeline.runtime.streaming import CHECKPOINT_LOCK, CHECKPOINTS, start_gated, stop_query
from tests.submit import REPO

pytestmark = [pytest.mark.spark]

# A second process: take the checkpoint's lock as ``start_gated`` does (exit 3 when it
# is in use, with the error's first words).
OTHER = """
import sys
from pipeline.runtime.streaming import CHECKPOINTS, CheckpointInUse
try:
    CHECKPOINTS.acquire(sys.argv[1])
except CheckpointInUse as e:
    print(str(e)[:60])
    sys.exit(3)
print("locked")
"""


def _other_process(checkpoint: Path) -> tuple[int, str]:
    p = subprocess.run(
        [sys.executable, "-c", OTHER, str(checkpoint)], cwd=REPO, capture_output=True,
        text=True, timeout=120, check=False,
    )  # fmt: skip
    return p.returncode, p.stdout.strip()


def _wait(cond: object, timeout_s: float = 60) -> None:
    end = time.monotonic() + timeout_s
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def _rate_query(
    spark: SparkSession, ck: Path, name: str, batches: list[int]
) -> Callable[[], StreamingQuery]:
    """A start function: a rate stream on checkpoint ``ck`` whose batch ids go to ``batches``."""

    def fn(df: DataFrame, batch_id: int) -> None:
        batches.append(batch_id)

    def start() -> StreamingQuery:
        stream = spark.readStream.format("rate").option("rowsPerSecond", 5).load()
        return start_gated(stream, fn, name=name, checkpoint=str(ck),
                           trigger="processingTime=200 milliseconds")  # fmt: skip

    return start


def test_a_running_querys_checkpoint_is_locked_until_it_stops(
    spark: SparkSession, tmp_path: Path
) -> None:
    ck = tmp_path / "checkpoint"
    batches: list[int] = []
    start = _rate_query(spark, ck, "lock_test", batches)

    q = start()
    _wait(lambda: len(batches) >= 2)
    assert (ck / CHECKPOINT_LOCK).exists()
    assert str(ck) in CHECKPOINTS.held()
    code, out = _other_process(ck)
    assert (code, out) == (3, f"checkpoint {ck} is in use: another process runs a query"[:60])

    # Stopped: the lock goes with the query, and another process may take it.
    assert stop_query(q) is True
    _wait(lambda: str(ck) not in CHECKPOINTS.held())
    assert _other_process(ck) == (0, "locked")

    # Started again by this process: it locks again and goes on from its checkpoint.
    before = len(batches)
    q = start()
    _wait(lambda: len(batches) >= before + 2)
    assert _other_process(ck)[0] == 3
    # The checkpoint's next batch, or the last one again: the gate stops the query as
    # soon as the batch returned, and the stop can land before Spark wrote that batch's
    # commit log (seen on a loaded machine), so it is replayed (exactly once holds).
    assert batches[before] - batches[before - 1] in (0, 1), batches
    assert stop_query(q) is True
    _wait(lambda: str(ck) not in CHECKPOINTS.held())


def test_a_query_that_fails_to_start_leaves_no_lock(spark: SparkSession, tmp_path: Path) -> None:
    ck = tmp_path / "checkpoint"
    stream = spark.readStream.format("rate").load()
    with pytest.raises(ValueError, match="trigger"):
        start_gated(stream, lambda df, b: None, name="bad", checkpoint=str(ck), trigger="soon")
    assert str(ck) not in CHECKPOINTS.held()
    assert _other_process(ck) == (0, "locked")
    assert os.listdir(ck) == [CHECKPOINT_LOCK]


def test_remote_checkpoints_are_not_locked_here() -> None:
    assert CHECKPOINTS.folder("s3a://bucket/checkpoints/silver") is None
    assert CHECKPOINTS.folder("file:///tmp/ck") == "/tmp/ck"
    assert CHECKPOINTS.folder("file:/tmp/ck") == "/tmp/ck"


def test_a_refused_second_start_in_this_process_keeps_the_running_querys_lock(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A second start of a running query in this process (same name, same checkpoint)
    is refused by Spark; that failed start must not drop the lock the running query
    holds: another process stays refused until the running query stops."""
    from pyspark.errors import IllegalArgumentException

    ck = tmp_path / "checkpoint"
    batches: list[int] = []
    start = _rate_query(spark, ck, "lock_twice", batches)

    q = start()
    try:
        _wait(lambda: len(batches) >= 2)
        with pytest.raises(IllegalArgumentException, match="already active"):
            start()
        assert str(ck) in CHECKPOINTS.held()
        assert _other_process(ck)[0] == 3
        seen = len(batches)
        _wait(lambda: len(batches) >= seen + 2)  # the running query goes on
        assert q.isActive
    finally:
        assert stop_query(q) is True
    _wait(lambda: str(ck) not in CHECKPOINTS.held())
    assert _other_process(ck) == (0, "locked")
