"""A Spark task freezes its Python worker's long-lived objects; the driver never."""

from __future__ import annotations

import gc

from pyspark.sql import SparkSession

from pipeline.runtime import taskworker


def _probe(_: int) -> tuple[bool, int, int, int]:
    """In a task: start from nothing frozen, settle, then count frozen and tracked."""
    import gc

    from pipeline.runtime import taskworker

    gc.unfreeze()
    before = gc.get_freeze_count()
    while True:  # past the periodic unfreeze, if this call would be it
        taskworker.settle()
        if gc.get_freeze_count():
            break
    return taskworker.in_spark_task(), before, gc.get_freeze_count(), len(gc.get_objects())


def _cycle(_: int) -> list[int]:
    """In a task: settle ``2 x UNFREEZE_EVERY`` times; the frozen count after each."""
    import gc

    from pipeline.runtime import taskworker

    counts = []
    for _ in range(2 * taskworker.UNFREEZE_EVERY):
        taskworker.settle()
        counts.append(gc.get_freeze_count())
    return counts


def test_a_task_freezes_its_workers_objects_and_the_driver_keeps_its_own(
    spark: SparkSession,
) -> None:
    frozen = gc.get_freeze_count()
    assert not taskworker.in_spark_task()
    taskworker.settle()
    assert gc.get_freeze_count() == frozen  # on the driver: nothing frozen

    for in_task, before, after, tracked in spark.sparkContext.parallelize([0, 1], 2).map(
        _probe
    ).collect():
        assert in_task
        assert before == 0
        # the worker's imports (pyspark, pyarrow, ...) are frozen; what the cyclic
        # collector still walks is what the task made after settling
        assert after > 20_000
        assert tracked < after // 20


def test_every_nth_task_unfreezes_so_the_daemons_collection_sees_everything(
    spark: SparkSession,
) -> None:
    for counts in spark.sparkContext.parallelize([0], 1).map(_cycle).collect():
        unfrozen = [i for i, c in enumerate(counts) if c == 0]
        assert len(unfrozen) == 2  # once per UNFREEZE_EVERY calls, wherever it started
        assert unfrozen[1] - unfrozen[0] == taskworker.UNFREEZE_EVERY
        assert all(c > 20_000 for i, c in enumerate(counts) if i not in unfrozen)
