"""What a silver micro-batch holds: its bronze files, from the query's offset log.

Both paths start here: the driver path reads the files in this process
(``batch_from_offset_log``), the task path hands them to Spark tasks
(``pipeline.silver.tasks``). Spark writes the offset-log entry before it runs
a batch and re-runs the same entry after a crash, so these are exactly the
rows the ``foreachBatch`` DataFrame holds.
"""

from __future__ import annotations

import pyarrow as pa

from pipeline.lake.delta_source import DataFile, batch_files, read_files
from pipeline.silver.settings import SilverSettings
from schemas.tables import BRONZE


def bronze_files(settings: SilverSettings, batch_id: int) -> list[DataFile] | None:
    """The bronze files of micro-batch ``batch_id`` of the silver stream; None when
    they cannot be known (no checkpoint, or a query's first batch whose start is not
    logged: ``pipeline.lake.delta_source.batch_files``)."""
    from schemas.tables import spark_schema

    reads = [(settings.bronze, spark_schema(BRONZE))]
    files = batch_files(settings.checkpoint, batch_id, reads, settings.source_options())
    return None if files is None else files[0]


def read_bronze(files: list[DataFile]) -> pa.Table:
    """Bronze rows of ``files``, read in this process with pyarrow."""
    from schemas.tables import spark_schema

    return read_files(files, spark_schema(BRONZE), BRONZE.names)


def batch_from_offset_log(settings: SilverSettings, batch_id: int) -> pa.Table | None:
    """Micro-batch ``batch_id`` of the silver stream (bronze rows) read on the driver,
    as gold does (``pipeline.gold.batch_from_offset_log``); None as ``bronze_files``."""
    files = bronze_files(settings, batch_id)
    return None if files is None else read_bronze(files)
