"""Silver: bronze messages decoded into typed Delta tables, exactly once (docs/DESIGN.md).

One package, one module per role:

* ``settings``: ``SilverSettings`` and the tables (``ensure_tables``);
* ``job``: the stream over bronze, batch mode over a bronze range;
* ``batch``: a micro-batch's bronze files, from the query's offset log;
* ``writer``: ``SilverBatchWriter``, the ``foreachBatch`` function (plans and commits);
* ``tasks``: the row work in Spark tasks (decode, write Parquet, describe the files);
* ``decode``: the pure Arrow decode of bronze rows into every table;
* ``agents``, ``methods``, ``registry``, ``parked``: the state that crosses rows or
  batches (agent observations, v1 method-call pairing, the schema registry, what
  parked messages wait for);
* ``transforms``: DataFrame -> DataFrame views for readers (wide views per class);
* ``testdata``: bronze rows from captured messages (tests, benchmarks).
"""

from pipeline.silver.batch import batch_on_driver
from pipeline.silver.job import bronze_range, run_silver, run_silver_batch, start_silver
from pipeline.silver.settings import SilverSettings, ensure_tables
from pipeline.silver.testdata import bronze_rows, counts, write_bronze
from pipeline.silver.writer import BatchReport, SilverBatchWriter

__all__ = [
    "BatchReport",
    "SilverBatchWriter",
    "SilverSettings",
    "batch_on_driver",
    "bronze_range",
    "bronze_rows",
    "counts",
    "ensure_tables",
    "run_silver",
    "run_silver_batch",
    "start_silver",
    "write_bronze",
]
