"""Records -> AMQP messages, through the codec's encoders (the simulator never encodes by hand).

Consecutive records with the same routing key share one message, up to
``batch`` records (qpidd packs up to about 100): v1 records are concatenated
(``pipeline.codec.v1.encode_records``), v2 data/event indications are one
``amqp/list`` body of maps (``pipeline.codec.v2``). Messages carry what the
dialect's real sender puts on them: nothing for v1 (qpidd sets no
content-type or app-id), and for v2 ``app-id qmf2``, ``qmf.opcode``,
``qmf.agent``, ``qmf.content`` and ``method`` application properties.

The ``v2-amqp10`` dialect sends what qpidd's AMQP 1.0 module sends instead
(read off ``../shared/samples/qpidd-amqp10``): the v2 list or map as one
amqp-value section (``OutMessage.body`` holds its AMQP 1.0 encoding,
``body_encoding="amqp-1.0"``), map keys as AMQP strings, every other string as
binary, values typed by their schema element as qpidd's Variant carries them
(uint64 -> ulong, uint32 -> uint, uint16 -> ushort, int32 -> int, absTime ->
long, ...), the schema hash as a uuid, object ids and references as
``{_agent_epoch: ulong, _object_name: binary}`` (no ``_agent_epoch`` for the
persistent objects, whose epoch is 0), every map sorted by key, and no app-id
(qpidd sets none on 1.0).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proton import Data, byte, float32, int32, short, ubyte, uint, ulong, ushort

from pipeline.codec import v1
from pipeline.codec.records import Event, Heartbeat, ObjectSample, Record
from pipeline.codec.schema import Element, SchemaKey, SchemaRegistry, v2_name
from pipeline.codec.types import TypedArray, TypedList, TypedMap, V2ObjectId, qmf_types
from pipeline.sim.agent import Published
from receivers.publisher import OutMessage

V1_EXCHANGE = "qpid.management"
V2_EXCHANGE = "qmf.default.topic"
REPLY_EXCHANGE = "amq.direct"


@dataclass(frozen=True)
class Packed:
    """One message and the records (in order) it carries."""

    message: OutMessage
    records: tuple[Record, ...]


def encode_arguments(dialect: str, elems: Sequence[Element], values: Mapping[str, Any]) -> bytes:
    """Method arguments in schema order with the dialect's QMF type encoders."""
    table = qmf_types(dialect if dialect in ("AM1", "AM2") else "AM2")
    out = bytearray()
    for e in elems:
        table[e.type_code][1](out, values[e.name])
    return bytes(out)


def decode_arguments(dialect: str, elems: Sequence[Element], raw: bytes) -> dict[str, Any]:
    """Inverse of ``encode_arguments`` (AM1 method requests carry no class key to decode by)."""
    table = qmf_types(dialect if dialect in ("AM1", "AM2") else "AM2")
    out: dict[str, Any] = {}
    off = 0
    for e in elems:
        out[e.name], off = table[e.type_code][0](raw, off)
    return out


# --------------------------------------------------------------- AMQP 1.0 (qpidd's 1.0 module)

BODY_ENCODING = "amqp-1.0"  # OutMessage.body_encoding of the v2-amqp10 dialect
TEXT_CODES = frozenset({6, 7})  # sstr, lstr
MAP_CODES = frozenset({15})
LIST_CODES = frozenset({21, 22})
# QMF element type code -> how qpidd's Variant of that element travels over AMQP 1.0
_INT_TYPES: dict[int, Any] = {
    1: ubyte, 2: ushort, 3: uint, 4: ulong, 9: ulong,  # unsigned, deltaTime
    16: byte, 17: short, 18: int32, 19: int, 8: int,  # signed, absTime (int64 = long)
}  # fmt: skip
# AMQP 0-10 type code (a decoded v2 body's TypedMap codes) -> AMQP 1.0
_CODE_INT_TYPES: dict[int, Any] = {
    0x02: ubyte, 0x12: ushort, 0x22: uint, 0x32: ulong,
    0x01: byte, 0x11: short, 0x21: int32, 0x31: int, 0x38: int,
}  # fmt: skip
_BINARY_CODES = frozenset({0x80, 0x84, 0x90, 0x94, 0xA0})  # vbin and latin strings: binary
_UTF8_CODES = frozenset({0x85, 0x95})


def _binary(v: Any) -> bytes:
    return v.encode("utf-8") if isinstance(v, str) else bytes(v)


def _ref(v: Any) -> dict[str, Any]:
    """An object id or reference as qpidd's 1.0 module sends it: epoch and name.

    A persistent object's id (epoch 0: system, broker, vhost, durable exchanges)
    has no ``_agent_epoch``, in qpidd's maps as here (an id or reference without
    one stays without).
    """
    agent_epoch: Any
    if isinstance(v, V2ObjectId):
        name: Any = v.object_name
        agent_epoch = v.epoch
    else:
        name = v.get("_object_name", "")
        agent_epoch = v.get("_agent_epoch")
    if agent_epoch is None or int(agent_epoch) == 0:
        return {"_object_name": _binary(name)}
    return {"_agent_epoch": ulong(int(agent_epoch)), "_object_name": _binary(name)}


def _plain(v: Any) -> Any:
    """A value without a schema type (map entries, list items): as qpidd's Variant."""
    if isinstance(v, TypedMap | TypedList | TypedArray):
        return _coded(v, None)
    if isinstance(v, V2ObjectId):
        return _ref(v)
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, Mapping):
        return {str(k): _plain(v[k]) for k in sorted(v, key=str)}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v  # bool, int (long), float (double), uuid, bytes, None


def _coded(v: Any, code: int | None) -> Any:
    """A value of a decoded AMQP 0-10 body (its wire type code known) in AMQP 1.0."""
    if isinstance(v, TypedMap):
        return {k: _coded(v[k], v.codes.get(k)) for k in sorted(v)}
    if isinstance(v, TypedList):
        codes: list[int | None] = list(v.codes) if v.codes else [None] * len(v)
        return [_coded(x, c) for x, c in zip(v, codes, strict=False)]
    if isinstance(v, TypedArray):
        return [_coded(x, v.code) for x in v]
    if code in _CODE_INT_TYPES and isinstance(v, int) and not isinstance(v, bool):
        return _in_range(_CODE_INT_TYPES[code], v)
    if code in _BINARY_CODES and isinstance(v, str | bytes):
        return _binary(v)
    if code in _UTF8_CODES and isinstance(v, str):
        return v
    if code == 0x23 and isinstance(v, float):
        return float32(v)
    return _plain(v)


def _in_range(kind: Any, v: int) -> Any:
    """``kind(v)``, or a plain long if ``v`` does not fit (a simulated value out of range)."""
    if kind is int:
        return v
    try:
        return kind(v)
    except (AssertionError, ValueError, OverflowError):
        return v


def _typed(v: Any, e: Element | None) -> Any:
    """One element value, typed by its schema element as qpidd's agent types it."""
    if e is None or v is None:
        return _plain(v)
    t = e.type_code
    if t in _INT_TYPES and isinstance(v, int) and not isinstance(v, bool):
        return _in_range(_INT_TYPES[t], v)
    if t in TEXT_CODES and isinstance(v, str | bytes):
        return _binary(v)
    if t == 10 and isinstance(v, V2ObjectId | Mapping):
        return _ref(v)
    if t == 11:
        return bool(v)
    if t == 12 and isinstance(v, float | int):
        return float32(v)
    if t == 13 and isinstance(v, float | int):
        return float(v)
    if t == 14 and isinstance(v, str):
        return uuid.UUID(v)
    return _plain(v)


def _typed_values(values: Mapping[str, Any], elems: Sequence[Element]) -> dict[str, Any]:
    names = {e.name for e in elems}
    by_name = {e.name: e for e in elems}
    by_name.update({v2_name(e.name, names): e for e in elems})  # the keys qpidd's v2 maps use
    return {k: _typed(values[k], by_name.get(k)) for k in sorted(values)}


def _schema_id(package: str, name: str, h: bytes, typ: str) -> dict[str, Any]:
    out: dict[str, Any] = {"_class_name": _binary(name)}
    if len(h) == 16:
        out["_hash"] = uuid.UUID(bytes=h)
    out["_package_name"] = _binary(package)
    out["_type"] = _binary(typ)
    return out


def amqp10_body_of(r: Record, registry: SchemaRegistry) -> Any:
    """The AMQP 1.0 value (proton types) qpidd's 1.0 module sends for one v2 record."""
    if isinstance(r, ObjectSample):
        schema = registry.get(SchemaKey(r.package, r.class_name, r.schema_hash))
        elems = () if schema is None else schema.properties + schema.statistics
        oid = r.object_id if isinstance(r.object_id, V2ObjectId) else None
        body: dict[str, Any] = {
            "_create_ts": ulong(r.create_ns),
            "_delete_ts": ulong(r.delete_ns),
        }
        if oid is not None:
            body["_object_id"] = _ref(oid)
        body["_schema_id"] = _schema_id(r.package, r.class_name, r.schema_hash, "_data")
        body["_update_ts"] = ulong(r.update_ns)
        body["_values"] = _typed_values(r.values, elems)
        return body
    if isinstance(r, Event):
        schema = registry.get(SchemaKey(r.package, r.event_name, r.schema_hash))
        return {
            "_schema_id": _schema_id(r.package, r.event_name, r.schema_hash, "_event"),
            "_severity": ubyte(r.severity),
            "_timestamp": ulong(r.timestamp_ns),
            "_values": _typed_values(r.arguments, () if schema is None else schema.arguments),
        }
    if isinstance(r, Heartbeat):
        attrs = dict(r.attributes or {})
        attrs.setdefault("_timestamp", r.timestamp_ns)
        if r.agent is not None:
            attrs.setdefault("_name", r.agent)
        kinds = {"_epoch": ushort, "_heartbeat_interval": ushort, "_timestamp": ulong}
        values = {
            k: _in_range(kinds[k], attrs[k]) if k in kinds else _plain(attrs[k])
            for k in sorted(attrs)
        }
        return {"_values": values}
    from pipeline.codec import v2  # replies: the 0-10 body's wire types, carried over

    return _coded(v2.v2_body_of(r), None)


def amqp10_encode(value: Any) -> bytes:
    """The AMQP 1.0 encoding of one value, as proton (and so the receiver) writes it."""
    d = Data()
    d.put_object(value)
    return bytes(d.encode())


def _v2_amqp10_message(
    records: Sequence[Record], registry: SchemaRegistry, agent_name: str
) -> tuple[bytes, str, dict[str, Any]]:
    """(AMQP 1.0 body, content type, application properties) of a v2 message."""
    from pipeline.codec import v2

    enc = v2.encode_v2(records, agent=agent_name)  # properties and content type as over 0-10
    first = records[0]
    value: Any
    if len(records) > 1 or isinstance(first, ObjectSample | Event):
        value = [amqp10_body_of(r, registry) for r in records]  # one list of maps
    else:  # a heartbeat or reply map, or a request/reply whose body is itself a list
        value = amqp10_body_of(first, registry)
    return amqp10_encode(value), enc.content_type, dict(enc.application_properties)


def _v2_message(
    agent_name: str,
    routing_key: str,
    records: Sequence[Record],
    exchange: str,
    registry: SchemaRegistry | None = None,
    encoding: str | None = None,
) -> OutMessage:
    from pipeline.codec import v2

    first = records[0]
    ttl: float | None = None
    if isinstance(first, Heartbeat):  # qpidd: ttl of about two heartbeat intervals
        ttl = 2.0 * max(1, int((first.attributes or {}).get("_heartbeat_interval", 1)))
    if encoding == BODY_ENCODING:
        assert registry is not None
        body, ctype, props = _v2_amqp10_message(records, registry, agent_name)
        return OutMessage(
            routing_key=routing_key,
            body=body,
            application_properties=props,
            content_type=ctype,
            exchange=exchange,
            ttl_s=ttl,
            body_encoding=BODY_ENCODING,
        )
    enc = v2.encode_v2(records, agent=agent_name)
    return OutMessage(
        routing_key=routing_key,
        body=enc.body,
        application_properties=enc.application_properties,
        content_type=enc.content_type,
        app_id="qmf2",
        exchange=exchange,
        ttl_s=ttl,
    )


def pack(
    published: Sequence[Published],
    registry: SchemaRegistry,
    *,
    dialect: str,
    agent_name: str,
    batch: int,
    encoding: str | None = None,
) -> list[Packed]:
    """Group consecutive same-key records into messages of at most ``batch`` records.

    ``encoding="amqp-1.0"``: v2 bodies as qpidd's AMQP 1.0 module sends them.
    """
    if batch < 1:
        raise ValueError("batch must be >= 1")
    default_ex = V2_EXCHANGE if dialect == "v2" else V1_EXCHANGE
    out: list[Packed] = []
    i = 0
    n = len(published)
    while i < n:
        key = published[i].routing_key
        ex = published[i].exchange or default_ex
        j = i + 1
        limit = 1 if isinstance(published[i].record, Heartbeat) else batch
        while (
            j < n
            and j - i < limit
            and published[j].routing_key == key
            and (published[j].exchange or default_ex) == ex
        ):
            j += 1
        recs = tuple(p.record for p in published[i:j])
        if dialect == "v2" and isinstance(recs[0], ObjectSample | Event | Heartbeat):
            msg = _v2_message(agent_name, key, recs, ex, registry, encoding)
        else:
            msg = OutMessage(routing_key=key, body=v1.encode_records(recs, registry), exchange=ex)
        out.append(Packed(msg, recs))
        i = j
    return out


def reply_target(reply_to: str | None) -> tuple[str, str] | None:
    """(exchange, routing key) of a request's reply-to.

    RabbitMQ AMQP 1.0 addresses: ``/exchange/X/K``; anything else is taken as
    a routing key on ``amq.direct`` (the v1 console's reply queue binding).
    """
    if not reply_to:
        return None
    if reply_to.startswith("/exchange/"):
        rest = reply_to[len("/exchange/") :]
        ex, _, key = rest.partition("/")
        return ex, key
    if reply_to.startswith("/queue/"):
        return "", reply_to[len("/queue/") :]
    return REPLY_EXCHANGE, reply_to


def reply_messages(
    records: Sequence[Record], registry: SchemaRegistry, reply_to: str | None
) -> list[Packed]:
    """Replies as qpidd sends them: one message per record, to the requester's address."""
    target = reply_target(reply_to)
    if target is None:
        return []
    ex, key = target
    return [
        Packed(OutMessage(routing_key=key, body=v1.encode_record(r, registry), exchange=ex), (r,))
        for r in records
    ]


def v2_reply_messages(
    records: Sequence[Record],
    reply_to: str | None,
    correlation_id: Any,
    agent_name: str,
    registry: SchemaRegistry | None = None,
    encoding: str | None = None,
) -> list[Packed]:
    """A v2 reply: query results in one ``_query_response`` list, anything else one map each.

    The request's correlation id is copied (v2 consoles match replies by it).
    """
    target = reply_target(reply_to)
    if target is None or not records:
        return []
    ex, key = target
    from pipeline.codec import v2

    groups: list[list[Record]] = []
    for r in records:
        if groups and r.opcode == "_query_response" and groups[-1][0].opcode == r.opcode:
            groups[-1].append(r)
        else:
            groups.append([r])
    out: list[Packed] = []
    for g in groups:
        if encoding == BODY_ENCODING:
            assert registry is not None
            body, ctype, props = _v2_amqp10_message(g, registry, agent_name)
            app_id = None
        else:
            enc = v2.encode_v2(g, agent=agent_name)
            body, ctype, props = enc.body, enc.content_type, dict(enc.application_properties)
            app_id = "qmf2"
        props["method"] = "response" if g[0].opcode != "_exception" else "indication"
        msg = OutMessage(
            routing_key=key,
            body=body,
            application_properties=props,
            content_type=ctype,
            app_id=app_id,
            correlation_id=correlation_id,
            exchange=ex,
            body_encoding=encoding if encoding == BODY_ENCODING else None,
        )
        out.append(Packed(msg, tuple(g)))
    return out
