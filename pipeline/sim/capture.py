"""Simulator messages as captured messages (``pipeline.codec.capture``'s interchange format).

A capture of ``qmf sim`` should look like a capture of a real broker: routing
key and subject, properties (app-id, content type, ttl), application
properties, content type, the body and a receive time.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pipeline.codec.amqp10 import BODY_ENCODING_PROPERTY
from pipeline.codec.capture import CapturedMessage, iso_utc
from receivers.publisher import OutMessage


def captured(msg: OutMessage, received_ns: int) -> CapturedMessage:
    props: dict[str, Any] = {"content_length": len(msg.body), "routing_key": msg.routing_key}
    if msg.exchange is not None:
        props["exchange"] = msg.exchange
    if msg.app_id is not None:
        props["app_id"] = msg.app_id
    if msg.content_type is not None:
        props["content_type"] = msg.content_type
    if msg.ttl_s is not None:
        props["ttl"] = int(msg.ttl_s * 1000)
    app_props = dict(msg.application_properties or {})
    if msg.body_encoding is not None:  # what the receiver lands for an amqp-value body
        app_props[BODY_ENCODING_PROPERTY] = msg.body_encoding
    return CapturedMessage(
        body=bytes(msg.body),
        routing_key=msg.routing_key,
        subject=msg.routing_key,
        content_type=msg.content_type,
        properties=props,
        application_properties=app_props,
        received_at=iso_utc(datetime.fromtimestamp(received_ns // 1000 / 1e6, tz=UTC)),
    )


def capture_line(msg: OutMessage, received_ns: int) -> dict[str, Any]:
    """One capture JSON object for ``msg``."""
    return captured(msg, received_ns).to_json()
