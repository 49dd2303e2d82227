"""Gold: silver's samples and heartbeats -> rates, lifecycles, liveness (docs/DESIGN.md).

* ``writer``: ``GoldBatchWriter`` (the ``foreachBatch`` function), the stream and batch runs;
* ``transforms``: the polars DataFrame -> DataFrame functions a batch is made of;
* ``names``: names a person reads (index references resolved, the broker identity).
"""

from pipeline.gold.writer import (
    BEAT_COLS,
    DEFAULT_MAX_BYTES_PER_TRIGGER,
    LIVENESS_KEYS,
    SAMPLE_COLS,
    GoldBatchWriter,
    GoldReport,
    GoldSettings,
    batch_files,
    batch_on_driver,
    ensure_tables,
    gold_input,
    gold_input_arrow,
    run_gold,
    run_gold_batch,
    silver_range,
    start_gold,
)

__all__ = [
    "BEAT_COLS",
    "DEFAULT_MAX_BYTES_PER_TRIGGER",
    "LIVENESS_KEYS",
    "SAMPLE_COLS",
    "GoldBatchWriter",
    "GoldReport",
    "GoldSettings",
    "batch_files",
    "batch_on_driver",
    "ensure_tables",
    "gold_input",
    "gold_input_arrow",
    "run_gold",
    "run_gold_batch",
    "silver_range",
    "start_gold",
]
