"""Bronze: landed messages -> the bronze Delta table, exactly once (docs/DESIGN.md).

* ``writer``: ``BronzeBatchWriter`` (the ``foreachBatch`` function), the stream runs;
* ``transforms``: the DataFrame -> DataFrame shaping of a batch (Spark-written batches).
"""

from pipeline.bronze.writer import (
    NO_STATS_COLUMNS,
    RETENTION_SLACK,
    ROW_GROUP_ROWS,
    UNIQUE_COLUMNS,
    WRITERS,
    BronzeBatchWriter,
    BronzeSettings,
    batch_ranges,
    checkpoint_query_id,
    run_bronze,
    start_bronze,
    trigger_kwargs,
    tune_shuffles,
    write_ranges_arrow,
)

__all__ = [
    "NO_STATS_COLUMNS",
    "RETENTION_SLACK",
    "ROW_GROUP_ROWS",
    "UNIQUE_COLUMNS",
    "WRITERS",
    "BronzeBatchWriter",
    "BronzeSettings",
    "batch_ranges",
    "checkpoint_query_id",
    "run_bronze",
    "start_bronze",
    "trigger_kwargs",
    "tune_shuffles",
    "write_ranges_arrow",
]
