"""A Spark task freezes its Python worker's long-lived objects; the driver never."""

from __future__ import annotations

import gc

from pyspark.sql import SparkSession

from pipeline import taskworker


def _probe(_: int) -> tuple[bool, int, int, int]:
    """In a task: start from nothing frozen, settle, then count frozen and tracked."""
    import gc

    from pipeline import taskworker

    gc.unfreeze()
    before = gc.get_freeze_count()
    taskworker.settle()
    return taskworker.in_spark_task(), before, gc.get_freeze_count(), len(gc.get_objects())


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
