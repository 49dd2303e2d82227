"""Records -> AMQP messages, through the codec's encoders (the simulator never encodes by hand).

Consecutive records with the same routing key share one message, up to
``batch`` records (qpidd packs up to about 100): v1 records are concatenated
(``pipeline.codec.v1.encode_records``), v2 data/event indications are one
``amqp/list`` body of maps (``pipeline.codec.v2``). Messages carry what the
dialect's real sender puts on them: nothing for v1 (qpidd sets no
content-type or app-id), and for v2 ``app-id qmf2``, ``qmf.opcode``,
``qmf.agent``, ``qmf.content`` and ``method`` application properties.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.codec import v1
from pipeline.codec.records import Event, Heartbeat, ObjectSample, Record
from pipeline.codec.schema import Element, SchemaRegistry
from pipeline.codec.types import qmf_types
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


def _v2_message(
    agent_name: str, routing_key: str, records: Sequence[Record], exchange: str
) -> OutMessage:
    from pipeline.codec import v2

    enc = v2.encode_v2(records, agent=agent_name)
    first = records[0]
    ttl: float | None = None
    if isinstance(first, Heartbeat):  # qpidd: ttl of about two heartbeat intervals
        ttl = 2.0 * max(1, int((first.attributes or {}).get("_heartbeat_interval", 1)))
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
) -> list[Packed]:
    """Group consecutive same-key records into messages of at most ``batch`` records."""
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
            msg = _v2_message(agent_name, key, recs, ex)
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
    records: Sequence[Record], reply_to: str | None, correlation_id: Any, agent_name: str
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
        enc = v2.encode_v2(g, agent=agent_name)
        props = dict(enc.application_properties)
        props["method"] = "response" if g[0].opcode != "_exception" else "indication"
        msg = OutMessage(
            routing_key=key,
            body=enc.body,
            application_properties=props,
            content_type=enc.content_type,
            app_id="qmf2",
            correlation_id=correlation_id,
            exchange=ex,
        )
        out.append(Packed(msg, tuple(g)))
    return out
