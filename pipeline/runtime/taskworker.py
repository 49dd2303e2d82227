"""What each of our Spark tasks does first to the Python worker it runs in.

PySpark's daemon reuses a Python worker for many tasks (``spark.python.worker.reuse``)
and runs a full ``gc.collect()`` in it after every task (``pyspark/daemon.py``). With
polars, pyarrow, numba's kernels and the codec imported, a worker tracks ~190,000
objects, and that collection took 0.10-0.16 s per task on the project's VM, spent while
the worker's next task waits (docs/performance-log.md, "the daemon's collection").

``settle`` freezes (``gc.freeze``) what is alive when a task starts, right after the
daemon's collection of the previous task's garbage: imported modules, compiled kernels,
the tables a worker keeps (``pipeline.gold.tasks.Kept``), and the task's own command
and plan. Later collections, the daemon's and the automatic ones during the task, then
go through only what the task itself made. A frozen object that later becomes part of
a garbage cycle is not collected while frozen, so every ``UNFREEZE_EVERY``-th task
unfreezes instead: the daemon's collection after it walks everything once and takes
such cycles, which bounds what a long-running worker can hold on to.
"""

from __future__ import annotations

import gc

UNFREEZE_EVERY = 64  # tasks; one full collection per this many (~0.15 s each)

_tasks = 0  # tasks settled in this worker process


def in_spark_task() -> bool:
    """True inside a Spark task (the same functions run on the driver's own paths)."""
    from pyspark import TaskContext

    return TaskContext.get() is not None


def settle() -> None:
    """Freeze the worker's long-lived objects out of the cyclic collector's sight, or,
    every ``UNFREEZE_EVERY``-th task, let the daemon's next collection see them all.
    Nothing outside a Spark task: the driver's heap is not the task's to freeze."""
    global _tasks
    if not in_spark_task():
        return
    _tasks += 1
    if _tasks % UNFREEZE_EVERY == 0:
        gc.unfreeze()
    else:
        gc.freeze()
