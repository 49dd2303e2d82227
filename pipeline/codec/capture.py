"""Capture files: the project's interchange format, one JSON object per AMQP message.

Keys: ``routing_key``, ``subject``, ``properties`` (map), ``application_properties``
(map), ``content_type``, ``body_base64``, ``received_at`` (ISO-8601 UTC).
Read by ``qmf decode --input``; written by ``qmf capture`` / ``qmf sim --output``
and replayed by ``qmf replay``. Unknown keys are kept in ``extra`` so a
read/write cycle loses nothing.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from pipeline.codec.message import DecodeResult, decode_message
from pipeline.codec.schema import SchemaRegistry

if TYPE_CHECKING:
    from pipeline.codec.methods import MethodContext

KEYS = (
    "application_properties",
    "body_base64",
    "content_type",
    "properties",
    "received_at",
    "routing_key",
    "subject",
)


class CaptureError(ValueError):
    """A capture line that is not a valid capture record (with its line number)."""


@dataclass(slots=True)
class CapturedMessage:
    """One AMQP message as captured."""

    body: bytes
    routing_key: str | None = None
    subject: str | None = None
    content_type: str | None = None
    properties: dict[str, Any] = field(default_factory=dict)
    application_properties: dict[str, Any] = field(default_factory=dict)
    received_at: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def app_id(self) -> str | None:
        v = self.properties.get("app_id")
        return v if isinstance(v, str) else None

    @property
    def received_at_dt(self) -> datetime | None:
        if not self.received_at:
            return None
        return datetime.fromisoformat(self.received_at.replace("Z", "+00:00"))

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "application_properties": self.application_properties,
            "body_base64": base64.b64encode(self.body).decode("ascii"),
            "content_type": self.content_type,
            "properties": self.properties,
            "received_at": self.received_at,
            "routing_key": self.routing_key,
            "subject": self.subject,
        }
        obj.update(self.extra)
        return obj

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> CapturedMessage:
        if not isinstance(obj, dict) or "body_base64" not in obj:
            raise CaptureError("capture record needs body_base64")
        try:
            body = base64.b64decode(obj["body_base64"], validate=True)
        except (binascii.Error, TypeError) as exc:
            raise CaptureError(f"bad body_base64: {exc}") from exc
        return cls(
            body=body,
            routing_key=obj.get("routing_key"),
            subject=obj.get("subject"),
            content_type=obj.get("content_type"),
            properties=dict(obj.get("properties") or {}),
            application_properties=dict(obj.get("application_properties") or {}),
            received_at=obj.get("received_at"),
            extra={k: v for k, v in obj.items() if k not in KEYS},
        )

    def decode(
        self, registry: SchemaRegistry, methods: MethodContext | None = None
    ) -> DecodeResult:
        return decode_message(
            self.body,
            registry=registry,
            application_properties=self.application_properties,
            content_type=self.content_type,
            app_id=self.app_id,
            routing_key=self.routing_key or self.subject,
            methods=methods,
        )


def iso_utc(dt: datetime) -> str:
    """``2026-11-22T09:02:30.111153Z``: the capture's timestamp form."""
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def read_capture(path: str | Path) -> Iterator[CapturedMessage]:
    """Yield the messages of a capture file (blank lines skipped)."""
    with open(path, encoding="utf-8") as f:
        yield from parse_capture(f)


def parse_capture(lines: Iterable[str]) -> Iterator[CapturedMessage]:
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CaptureError(f"line {n}: not JSON: {exc}") from exc
        try:
            yield CapturedMessage.from_json(obj)
        except CaptureError as exc:
            raise CaptureError(f"line {n}: {exc}") from exc


def write_capture(dest: str | Path | IO[str], messages: Iterable[CapturedMessage]) -> int:
    """Write messages as capture JSON lines; returns how many were written."""
    if isinstance(dest, str | Path):
        with open(dest, "w", encoding="utf-8") as f:
            return write_capture(f, messages)
    n = 0
    for m in messages:
        dest.write(json.dumps(m.to_json(), sort_keys=True) + "\n")
        n += 1
    return n
