"""What each of our Spark tasks does first to the Python worker it runs in.

PySpark's daemon reuses a Python worker for many tasks (``spark.python.worker.reuse``)
and runs a full ``gc.collect()`` in it after every task (``pyspark/daemon.py``). With
polars, pyarrow, numba's kernels and the codec imported, a worker tracks ~180,000
objects, and that collection took 0.15-0.25 s per task on the project's VM: on gold's
task path about 0.5 s of a 7 s micro-batch on one core, spent while the batch's next
task waits for the worker (docs/performance.md, "the daemon's collection").

``settle`` freezes (``gc.freeze``) what is alive when a task starts, right after the
daemon's collection of the previous task's garbage: imported modules, compiled
kernels, a worker's kept table frames (``pipeline.gold.tasks.Kept``). Later
collections, the daemon's and the automatic ones during the task, then go through only
what the task itself made. The frozen objects are long-lived by nature; any of them
freed later still goes by reference count (none of them forms a cycle).
"""

from __future__ import annotations

import gc


def in_spark_task() -> bool:
    """True inside a Spark task (the same functions run on the driver's own paths)."""
    from pyspark import TaskContext

    return TaskContext.get() is not None


def settle() -> None:
    """Freeze the worker's long-lived objects out of the cyclic collector's sight
    (nothing outside a Spark task: the driver's heap is not the task's to freeze)."""
    if in_spark_task():
        gc.freeze()
