"""Landing rows -> bronze rows.

Bronze keeps every AMQP message exactly as landed, once: the receiver is
at-least-once, so a message can land twice (under two offsets, maybe two
partitions) with the same ``msg_key``. Within a micro-batch the copy with the
lowest (partition, offset) wins, so a replay picks the same row; across
batches the Delta layer inserts only keys the table does not hold yet.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from schemas.tables import BRONZE, LANDING

KEY = "msg_key"
ORDER: tuple[str, ...] = ("partition", "offset")


def dedup_by_key(df: DataFrame, key: str = KEY, order: Sequence[str] = ORDER) -> DataFrame:
    """One row per ``key``: the first by ``order`` (deterministic, unlike dropDuplicates)."""
    rank = "__qmf_rank"
    w = Window.partitionBy(key).orderBy(*[F.col(c).asc() for c in order])
    return df.withColumn(rank, F.row_number().over(w)).where(F.col(rank) == 1).drop(rank)


def to_bronze(df: DataFrame, batch_id: int) -> DataFrame:
    """Landing columns in table order plus the micro-batch that wrote them."""
    cols = [F.col(f"`{f.name}`") for f in LANDING]
    out = df.select(*cols, F.lit(batch_id).cast("bigint").alias("batch_id"))
    assert out.columns == BRONZE.names
    return out


def bronze_batch(df: DataFrame, batch_id: int) -> DataFrame:
    """What one micro-batch adds to bronze before the key check against the table."""
    return to_bronze(dedup_by_key(df), batch_id)
