"""Bronze: landed messages -> the bronze Delta table, exactly once (docs/DESIGN.md).

* ``writer``: ``BronzeBatchWriter`` (the ``foreachBatch`` function), the stream runs;
* ``tasks``: the row work of a batch (landing ranges -> staged Parquet files), in
  Spark tasks or on the driver;
* ``transforms``: the DataFrame -> DataFrame shaping of a batch (Spark-written batches).
"""

from pipeline.bronze.tasks import (
    DRIVER_MAX_BYTES,
    NO_STATS_COLUMNS,
    ROW_GROUP_ROWS,
    UNIQUE_COLUMNS,
)
from pipeline.bronze.writer import (
    RETENTION_SLACK,
    WRITERS,
    BronzeBatchWriter,
    BronzeSettings,
    batch_ranges,
    checkpoint_query_id,
    choose_writer,
    run_bronze,
    start_bronze,
    tune_shuffles,
    write_ranges_arrow,
    write_ranges_tasks,
)

__all__ = [
    "DRIVER_MAX_BYTES",
    "NO_STATS_COLUMNS",
    "RETENTION_SLACK",
    "ROW_GROUP_ROWS",
    "UNIQUE_COLUMNS",
    "WRITERS",
    "BronzeBatchWriter",
    "BronzeSettings",
    "batch_ranges",
    "checkpoint_query_id",
    "choose_writer",
    "run_bronze",
    "start_bronze",
    "tune_shuffles",
    "write_ranges_arrow",
    "write_ranges_tasks",
]
