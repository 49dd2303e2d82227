"""Arrow schemas of the landing log and of every Delta table, defined once.

Spark schemas are derived from these (``spark_schema``) so a column is never
declared twice. Timestamps are UTC microseconds (Spark's ``timestamp``);
QMF's own nanosecond timestamps are kept as int64 ``*_ns`` columns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

TS = pa.timestamp("us", tz="UTC")
# ``broker_name`` of a receiver given a URL rather than a fleet file (receivers.fleet).
DEFAULT_BROKER = "default"

# One landed AMQP delivery. Written by receivers.landing, served by the "qmf"
# Spark source. A delivery's identity is (partition, offset). ``msg_key`` is a
# content hash (receivers.landing.message_key), equal for twins (identical
# messages a broker sends twice: each lands) and for redeliveries.
# ``redelivered``: the broker flagged the delivery as possibly seen before;
# ``duplicate_of``: "<partition>:<offset>" of the first copy when the receiver
# matched the redelivery to a message it had landed (receivers.indoubt).
# ``broker_name``: the broker it came from, as the fleet configuration names it
# (receivers.fleet; ``default`` for a receiver given a URL), kept by every layer;
# null in the rows of tables written before fleets.
LANDING = pa.schema(
    [
        pa.field("partition", pa.string(), nullable=False),
        pa.field("broker_name", pa.string()),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("msg_key", pa.string(), nullable=False),
        pa.field("received_at", TS, nullable=False),
        pa.field("routing_key", pa.string()),
        pa.field("subject", pa.string()),
        pa.field("message_id", pa.string()),
        pa.field("correlation_id", pa.string()),
        pa.field("reply_to", pa.string()),
        pa.field("app_id", pa.string()),
        pa.field("content_type", pa.string()),
        pa.field("application_properties", pa.map_(pa.string(), pa.string())),
        pa.field("body", pa.binary(), nullable=False),
        pa.field("redelivered", pa.bool_(), nullable=False),
        pa.field("duplicate_of", pa.string()),
    ]
)

# Bronze: one row per AMQP delivery (twins included, redeliveries of a landed
# message not), exactly as landed, plus the streaming batch that wrote it.
# (partition, offset) is its identity across replays.
BRONZE = pa.schema(
    [*(f for f in LANDING if f.name != "duplicate_of"), pa.field("batch_id", pa.int64(), False)]
)

TABLES: dict[str, pa.Schema] = {
    "landing": LANDING,
    "bronze": BRONZE,
}


def spark_schema(name_or_schema: str | pa.Schema) -> StructType:
    """The Spark StructType of a table (imports pyspark lazily)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = TABLES[name_or_schema] if isinstance(name_or_schema, str) else name_or_schema
    return from_arrow_schema(schema)


# Object samples (decoded 'c'/'i'/'g' content and QMF v2 _data): one table per
# class. Its schema is these identity columns, then one column per property and
# statistic in schema order (``pipeline.codec.vectorized.sample_schema`` derives
# it from the class schema). Names follow ``pipeline.codec.records``
# (OBJECT_SAMPLE_COLUMNS); ``record_index`` is the record's position in its
# message, so (msg_key, record_index) identifies a sample across replays.
OBJECT_SAMPLE_IDENTITY = pa.schema(
    [
        pa.field("msg_key", pa.string(), nullable=False),
        pa.field("record_index", pa.int32(), nullable=False),
        pa.field("dialect", pa.string(), nullable=False),
        pa.field("opcode", pa.string(), nullable=False),
        pa.field("seq", pa.int64()),
        pa.field("agent", pa.string()),
        pa.field("package", pa.string(), nullable=False),
        pa.field("class_name", pa.string(), nullable=False),
        pa.field("schema_hash", pa.binary(), nullable=False),
        pa.field("update_ns", pa.int64()),
        pa.field("create_ns", pa.int64()),
        pa.field("delete_ns", pa.int64()),
        pa.field("boot_seq", pa.int32()),  # AM1 object id
        pa.field("bank", pa.int32()),
        pa.field("flags", pa.int8()),  # AM2 object id
        pa.field("epoch", pa.int64()),  # AM2, and QMF v2 agent epoch
        pa.field("broker_bank", pa.int32()),
        pa.field("agent_bank", pa.int32()),
        pa.field("object_num", pa.int64()),  # AM1 / AM2
        pa.field("agent_name", pa.string()),  # QMF v2 object id
        pa.field("object_name", pa.string()),
    ]
)

# Messages whose decoding stopped at a codec error (the good records before it
# are still decoded): the raw body is kept for replay after a codec fix.
CONTENT_QUARANTINE = pa.schema(
    [
        pa.field("msg_key", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("offset", pa.int64()),
        pa.field("body", pa.binary(), nullable=False),
    ]
)
TABLES["content_quarantine"] = CONTENT_QUARANTINE
