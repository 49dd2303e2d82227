"""QMF telemetry pipeline: codec, Spark source, Delta layer and jobs."""

import os

__version__ = "0.1.0"

# Polars' allocator (jemalloc) gives freed pages back to the kernel after 0.5-1 s (the
# decay polars sets), so each batch's large frames fault their pages in again: gold's
# rate stage took ~690,000 minor page faults (2.7 GB zeroed by the kernel) per six
# batches of one bucket, a quarter of its time (docs/performance-log.md, 2026-12-02). Freed
# pages are kept for 30 s instead: a worker's next batch reuses them, and Spark ends a
# Python worker idle for a minute. Set here, before polars is first imported (polars
# appends it to its own decay settings, and jemalloc reads them once), so it holds for
# this process and the processes it starts; a value already in the environment wins (an
# empty one: polars' settings). ``get_spark`` sets it for executors
# (``spark.executorEnv._RJEM_MALLOC_CONF`` given to Spark wins there).
ALLOCATOR_ENV = {"_RJEM_MALLOC_CONF": "dirty_decay_ms:30000,muzzy_decay_ms:30000"}
for _var, _value in ALLOCATOR_ENV.items():
    os.environ.setdefault(_var, _value)


class SetupError(RuntimeError):
    """The machine lacks something a command needs (e.g. Java): ``qmf`` prints the
    message on one line and exits 2 instead of a traceback."""


def _child_logging() -> None:
    # In a Python process Spark started for ``qmf run`` (a data source reader with the
    # embedded receiver, a decode task), our warnings must reach the driver's terminal:
    # sparklog marks them so the driver copies them from the log file. No-op elsewhere.
    from pipeline.runtime.sparklog import child_logging

    child_logging()


_child_logging()
