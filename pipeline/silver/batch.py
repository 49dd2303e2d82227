"""What a silver micro-batch holds: its bronze files, from the batch's plan.

Both paths start here: the driver path reads the files in this process
(``batch_on_driver``), the task path hands them to Spark tasks
(``pipeline.silver.tasks``). The files are those of the scan Delta's streaming
source planned for the batch (``pipeline.lake.files.batch_files``): Spark logs the
batch's offsets before it runs it and re-runs the same offsets after a crash,
so these are exactly the rows the ``foreachBatch`` DataFrame holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from pipeline.lake.files import DataFile, batch_files, read_files
from pipeline.silver.settings import SilverSettings
from schemas.tables import BRONZE

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def bronze_files(settings: SilverSettings, df: DataFrame) -> list[DataFile] | None:
    """The bronze files of ``df``, a micro-batch of the silver stream; None when they
    cannot be known (``df`` is not a stream's batch: batch mode over a bronze range)."""
    files = batch_files(df, [settings.bronze])
    return None if files is None else files[0]


def read_bronze(files: list[DataFile]) -> pa.Table:
    """Bronze rows of ``files``, read in this process with pyarrow."""
    from schemas.tables import spark_schema

    return read_files(files, spark_schema(BRONZE), BRONZE.names)


def batch_on_driver(settings: SilverSettings, df: DataFrame) -> pa.Table | None:
    """Micro-batch ``df`` of the silver stream (bronze rows) read on the driver with
    pyarrow, as gold does (``pipeline.gold.batch_on_driver``); None as ``bronze_files``."""
    files = bronze_files(settings, df)
    return None if files is None else read_bronze(files)
