"""Landing rows -> bronze rows.

Bronze keeps one row per AMQP delivery, exactly as landed: twins (identical
messages a broker really sent twice) are two rows. The one thing left out is a
redelivery the receiver matched to a first copy it had already landed
(``duplicate_of`` set, see ``receivers.indoubt``): a filter on a column of the
row itself, so no batch ever reads the table to decide.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from schemas.tables import BRONZE

IDENTITY = ("partition", "offset")


def first_copies(df: DataFrame) -> DataFrame:
    """Landing rows that are deliveries of their own (not a landed message again)."""
    return df.where(F.col("duplicate_of").isNull())


def to_bronze(df: DataFrame, batch_id: int) -> DataFrame:
    """Bronze columns in table order plus the micro-batch that wrote them."""
    cols = [F.col(f"`{f.name}`") for f in BRONZE if f.name != "batch_id"]
    out = df.select(*cols, F.lit(batch_id).cast("bigint").alias("batch_id"))
    assert out.columns == BRONZE.names
    return out


def bronze_batch(df: DataFrame, batch_id: int) -> DataFrame:
    """What one micro-batch adds to bronze: every delivery but matched redeliveries."""
    return to_bronze(first_copies(df), batch_id)
