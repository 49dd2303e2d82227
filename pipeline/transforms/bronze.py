"""Landing rows -> bronze rows.

Bronze keeps every AMQP message exactly as landed, once: the receiver is
at-least-once, so a message can land twice (under two offsets, maybe two
partitions) with the same ``msg_key``. Within a micro-batch the copy with the
lowest (partition, offset) wins, so a replay picks the same row; across
batches a key the table already holds is not inserted again.

Only the narrow (msg_key, partition, offset) projection is shuffled to find
the rows to drop; the rows themselves (bodies: ~400 B each) never are. The
drop list (duplicates are rare) is broadcast and anti-joined locally.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from schemas.tables import BRONZE, LANDING

KEY = "msg_key"
ORDER: tuple[str, ...] = ("partition", "offset")
POSITION = ["partition", "offset"]
_RANK = "__qmf_rank"
_KNOWN = "__qmf_known"


def _ranked(df: DataFrame, key: str, order: Sequence[str]) -> DataFrame:
    w = Window.partitionBy(key).orderBy(*[F.col(c).asc() for c in order])
    return df.withColumn(_RANK, F.row_number().over(w))


def dedup_by_key(df: DataFrame, key: str = KEY, order: Sequence[str] = ORDER) -> DataFrame:
    """One row per ``key``: the first by ``order`` (deterministic, unlike dropDuplicates)."""
    return _ranked(df, key, order).where(F.col(_RANK) == 1).drop(_RANK)


def redundant_positions(batch: DataFrame, existing_keys: DataFrame | None) -> DataFrame:
    """(partition, offset) of the batch rows bronze must not get.

    Later copies of a key within the batch, and first copies whose key the
    table already holds (``existing_keys``: a ``msg_key`` column).
    """
    ranked = _ranked(batch.select(KEY, *POSITION), KEY, ORDER)
    if existing_keys is None:
        return ranked.where(F.col(_RANK) > 1).select(*POSITION)
    # One pass over the ranked keys (a union would read the source twice).
    known = existing_keys.select(KEY).withColumn(_KNOWN, F.lit(True))
    flagged = ranked.join(known, on=KEY, how="left")
    return flagged.where((F.col(_RANK) > 1) | F.col(_KNOWN).isNotNull()).select(*POSITION)


def to_bronze(df: DataFrame, batch_id: int) -> DataFrame:
    """Landing columns in table order plus the micro-batch that wrote them."""
    cols = [F.col(f"`{f.name}`") for f in LANDING]
    out = df.select(*cols, F.lit(batch_id).cast("bigint").alias("batch_id"))
    assert out.columns == BRONZE.names
    return out


def bronze_batch(df: DataFrame, batch_id: int, existing_keys: DataFrame | None = None) -> DataFrame:
    """What one micro-batch adds to bronze: new keys only, first copy of each."""
    drop = redundant_positions(df, existing_keys)
    fresh = df.join(F.broadcast(drop), on=POSITION, how="left_anti")
    return to_bronze(fresh, batch_id)
