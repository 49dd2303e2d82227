"""Silver tables: decoded QMF content, declared once and registered into ``schemas.tables.TABLES``.

Every silver row that comes from a message carries the message's bronze
identity ``(partition, offset)`` (landing partition and offset: one AMQP
delivery) and, for records, ``record_index`` (position in the message). That
triple identifies a record across replays; ``msg_key`` is kept for joins but
is not unique (twin messages share it). ``batch_id`` is the silver micro-batch
that wrote the row. QMF times stay int64 ``*_ns`` (exact) beside a Spark
timestamp ``*_time`` (microseconds; null when the ns value is 0 = "not set").

Object samples use one table for every class (see docs/DESIGN.md, "Silver"):
identity columns, then the element values in three positional typed lists
(``ints``, ``floats``, ``texts``) whose slots the registry assigns per class
(``pipeline.silver.registry``); ``pipeline.silver.transforms.wide_view`` turns them
into one column per property/statistic for notebooks.
"""

from __future__ import annotations

import pyarrow as pa

from schemas.tables import TABLES, TS

_ID = [
    pa.field("partition", pa.string(), nullable=False),
    pa.field("offset", pa.int64(), nullable=False),
]
_REC = [*_ID, pa.field("record_index", pa.int32(), nullable=False)]
_BATCH = pa.field("batch_id", pa.int64(), nullable=False)
# The broker the message came from, as the fleet configuration names it (bronze's
# ``broker_name``; null in rows written before fleets).
_BROKER = pa.field("broker_name", pa.string())

# One property/statistic/argument definition, as the registry keeps it.
ELEMENT = pa.struct(
    [
        pa.field("name", pa.string(), nullable=False),
        pa.field("type_code", pa.int32(), nullable=False),
        pa.field("access", pa.int32()),  # properties: 1 RC, 2 RW, 3 RO
        pa.field("is_index", pa.bool_()),
        pa.field("optional", pa.bool_()),
        pa.field("unit", pa.string()),
        pa.field("min", pa.string()),  # as written in the schema (exact)
        pa.field("max", pa.string()),
        pa.field("maxlen", pa.int64()),
        pa.field("description", pa.string()),
        pa.field("direction", pa.string()),  # method arguments: I, O, IO
        pa.field("default", pa.string()),
        pa.field("statistic_kind", pa.string()),  # statistics only
        pa.field("slot_kind", pa.string()),  # properties/statistics: ints | floats | texts
        pa.field("slot", pa.int32()),  # position in that list of object_samples
    ]
)
METHOD = pa.struct(
    [
        pa.field("name", pa.string(), nullable=False),
        pa.field("description", pa.string()),
        pa.field("arguments", pa.list_(ELEMENT)),
    ]
)

# One row per (package, class_name, schema_hash, kind): versions side by side.
# ``first_app``/``first_batch`` say which silver run and micro-batch first wrote
# it (seed rows: null/-1), so a replayed batch decodes against the registry as
# it was before that batch (deterministic replays).
SCHEMA_REGISTRY = pa.schema(
    [
        pa.field("package", pa.string(), nullable=False),
        pa.field("class_name", pa.string(), nullable=False),
        pa.field("schema_hash", pa.binary(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),  # table | event
        pa.field("properties", pa.list_(ELEMENT)),
        pa.field("statistics", pa.list_(ELEMENT)),
        pa.field("methods", pa.list_(METHOD)),
        pa.field("arguments", pa.list_(ELEMENT)),  # event classes
        pa.field("severity", pa.int32()),  # event classes, from the XML
        pa.field("n_ints", pa.int32(), nullable=False),
        pa.field("n_floats", pa.int32(), nullable=False),
        pa.field("n_texts", pa.int32(), nullable=False),
        pa.field("first_seen", TS, nullable=False),
        pa.field("last_seen", TS, nullable=False),
        pa.field("source_agent", pa.string()),
        pa.field("origin", pa.string(), nullable=False),  # seed | wire
        pa.field("first_app", pa.string()),
        pa.field("first_batch", pa.int64(), nullable=False),
    ]
)

OBJECT_SAMPLES = pa.schema(
    [
        *_REC,
        _BATCH,
        _BROKER,
        pa.field("msg_key", pa.string(), nullable=False),
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
        pa.field("update_time", TS),
        pa.field("create_time", TS),
        pa.field("delete_time", TS),
        pa.field("boot_seq", pa.int32()),
        pa.field("bank", pa.int32()),
        pa.field("flags", pa.int8()),
        pa.field("epoch", pa.int64()),
        pa.field("broker_bank", pa.int32()),
        pa.field("agent_bank", pa.int32()),
        pa.field("object_num", pa.int64()),
        pa.field("agent_name", pa.string()),
        pa.field("object_name", pa.string()),
        pa.field("index_key", pa.string()),  # JSON array of the index properties' values
        pa.field("ints", pa.list_(pa.int64())),
        pa.field("floats", pa.list_(pa.float64())),
        pa.field("texts", pa.list_(pa.string())),
    ]
)

EVENTS = pa.schema(
    [
        *_REC,
        _BATCH,
        _BROKER,
        pa.field("dialect", pa.string(), nullable=False),
        pa.field("seq", pa.int64()),
        pa.field("agent", pa.string()),
        pa.field("package", pa.string(), nullable=False),
        pa.field("event_name", pa.string(), nullable=False),
        pa.field("schema_hash", pa.binary()),
        pa.field("severity", pa.int32()),
        pa.field("timestamp_ns", pa.int64()),
        pa.field("event_time", TS),
        pa.field("arguments", pa.string()),  # JSON object, values typed as decoded
        # The same arguments by type (pipeline.silver.decode.typed_arguments):
        pa.field("arg_ints", pa.map_(pa.string(), pa.int64())),
        pa.field("arg_floats", pa.map_(pa.string(), pa.float64())),
        pa.field("arg_texts", pa.map_(pa.string(), pa.string())),
    ]
)

HEARTBEATS = pa.schema(
    [
        *_REC,
        _BATCH,
        _BROKER,
        pa.field("dialect", pa.string(), nullable=False),
        pa.field("seq", pa.int64()),
        pa.field("agent", pa.string()),
        pa.field("timestamp_ns", pa.int64()),
        pa.field("heartbeat_time", TS),
        pa.field("attributes", pa.string()),  # V2 agent attributes, JSON
    ]
)

# Agent observations: one row per agent per micro-batch (append-only, so
# exactly-once is the app transaction); ``agents_view`` aggregates first/last seen.
AGENTS = pa.schema(
    [
        pa.field("agent", pa.string(), nullable=False),
        pa.field("dialect", pa.string(), nullable=False),
        _BATCH,
        _BROKER,
        pa.field("broker_bank", pa.int32()),
        pa.field("agent_bank", pa.int32()),
        pa.field("epoch", pa.int64()),
        pa.field("first_seen", TS, nullable=False),
        pa.field("last_seen", TS, nullable=False),
        pa.field("records", pa.int64(), nullable=False),
    ]
)

METHOD_RESPONSES = pa.schema(
    [
        *_REC,
        _BATCH,
        _BROKER,
        pa.field("kind", pa.string(), nullable=False),  # method_response | exception
        pa.field("dialect", pa.string(), nullable=False),
        pa.field("seq", pa.int64()),
        pa.field("correlation_id", pa.string()),
        pa.field("routing_key", pa.string()),
        pa.field("agent", pa.string()),
        pa.field("status", pa.int64()),
        pa.field("text", pa.string()),
        pa.field("arguments", pa.string()),  # JSON
        pa.field("raw_arguments", pa.binary()),  # v1 output arguments (untyped on the wire)
        pa.field("received_at", TS, nullable=False),
    ]
)

# One row per v1 method call ('M' request and 'm' response paired by (dialect, seq)).
# ``call_id`` = "<partition>:<offset>:<record_index>" of the request (of the response
# when its request was never seen): the upsert key. A request waits as a request-only
# row (response columns null) until a later batch's response completes it (the waiting
# requests live in their own ``calls-open-*`` files; docs/DESIGN.md, Method calls); ``batch_id``
# is the batch that last wrote the row, ``request_batch`` the one that wrote the request.
# Arguments are JSON objects typed by the method's schema (``arguments_in``: input and
# bidirectional, from the request; ``arguments_out``: output and bidirectional, from the
# response), null when they could not be typed; the raw bytes stay for audit, and
# ``arguments_in_error``/``arguments_out_error`` say why bytes did not fit a known method
# (null for an unknown object, schema or method: nothing to type them with).
METHOD_CALLS = pa.schema(
    [
        pa.field("call_id", pa.string(), nullable=False),
        pa.field("dialect", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        _BATCH,
        _BROKER,
        pa.field("request_batch", pa.int64()),
        pa.field("request_partition", pa.string()),
        pa.field("request_offset", pa.int64()),
        pa.field("request_index", pa.int32()),
        pa.field("response_partition", pa.string()),
        pa.field("response_offset", pa.int64()),
        pa.field("response_index", pa.int32()),
        pa.field("request_at", TS),  # received_at of the messages
        pa.field("response_at", TS),
        pa.field("agent", pa.string()),  # the responding agent (AM1: from the routing key)
        pa.field("object_id", pa.string()),  # as the codec prints it
        pa.field("object_id_raw", pa.binary()),  # as on the wire (8 or 16 bytes)
        pa.field("package", pa.string()),
        pa.field("class_name", pa.string()),
        pa.field("schema_hash", pa.binary()),
        pa.field("method_name", pa.string()),
        pa.field("status", pa.int64()),
        pa.field("text", pa.string()),
        pa.field("arguments_in", pa.string()),
        pa.field("arguments_out", pa.string()),
        pa.field("raw_in", pa.binary()),
        pa.field("raw_out", pa.binary()),
        # Why arguments of a known method stayed untyped (the bytes do not fit it).
        pa.field("arguments_in_error", pa.string()),
        pa.field("arguments_out_error", pa.string()),
    ]
)

# A message (or the rest of it) the codec could not decode; the good records
# before the failure are in their tables. ``record_index``: where decoding stopped.
QUARANTINE = pa.schema(
    [
        *_ID,
        _BATCH,
        _BROKER,
        pa.field("msg_key", pa.string(), nullable=False),
        pa.field("record_index", pa.int32()),
        pa.field("error", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("error_offset", pa.int64()),
        pa.field("first_seen", TS, nullable=False),  # the message's received_at
        pa.field("body", pa.binary(), nullable=False),
    ]
)

# Messages waiting for a schema, whole (v1 records carry no lengths, so the
# rest of the message cannot be split without it), with what decoding needs.
PARKED = pa.schema(
    [
        *_ID,
        _BATCH,
        _BROKER,
        pa.field("msg_key", pa.string(), nullable=False),
        pa.field("received_at", TS, nullable=False),
        pa.field("missing", pa.string(), nullable=False),  # package:class(hash hex)
        pa.field("routing_key", pa.string()),
        pa.field("app_id", pa.string()),
        pa.field("content_type", pa.string()),
        pa.field("application_properties", pa.map_(pa.string(), pa.string())),
        pa.field("body", pa.binary(), nullable=False),
    ]
)

# Parked messages decoded later: (partition, offset) resolved by ``batch_id``.
RESOLVED = pa.schema([*_ID, _BATCH, pa.field("parked_batch", pa.int64(), nullable=False)])

SILVER_TABLES: dict[str, pa.Schema] = {
    "schema_registry": SCHEMA_REGISTRY,
    "object_samples": OBJECT_SAMPLES,
    "events": EVENTS,
    "heartbeats": HEARTBEATS,
    "agents": AGENTS,
    "method_responses": METHOD_RESPONSES,
    "method_calls": METHOD_CALLS,
    "quarantine": QUARANTINE,
    "parked": PARKED,
    "parked_resolved": RESOLVED,
}
TABLES.update(SILVER_TABLES)
