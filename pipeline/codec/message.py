"""The codec's single entry point: ``decode_message`` (dialect detection + decode).

Dialect is detected per message: QMF v2 when the app-id is ``qmf2`` or a
``qmf.opcode`` application property is present; otherwise the first three
body bytes (``AM1`` / ``AM2``). A V2 body whose application property
``x-qmf-body-encoding`` (``BODY_ENCODING_PROPERTY``) is ``amqp-1.0`` is an
AMQP 1.0 value (qpidd over AMQP 1.0), decoded by ``pipeline.codec.amqp10``. Schema responses met while decoding are added
to the registry, so content later in the same message or in later messages
decodes. ``decode_message`` never raises for bad input: problems are
returned beside every record decoded before them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline.codec.amqp10 import (
    BODY_ENCODING_AMQP10,
    BODY_ENCODING_PROPERTY,
    BODY_ENCODING_STRING,
)
from pipeline.codec.errors import BadMagic, Malformed, Problem, Truncated
from pipeline.codec.records import Record
from pipeline.codec.schema import SchemaRegistry
from pipeline.codec.v1 import decode_v1, encode_records
from pipeline.codec.v2 import V2Encoded, decode_v2, encode_v2

if TYPE_CHECKING:
    from pipeline.codec.methods import MethodContext

__all__ = [
    "BODY_ENCODING_AMQP10",
    "BODY_ENCODING_PROPERTY",
    "BODY_ENCODING_STRING",
    "DecodeResult",
    "decode_message",
    "detect_dialect",
    "encode_message",
    "routing_agent",
]


@dataclass(slots=True)
class DecodeResult:
    """Records decoded from one message, then the problems that stopped decoding (if any)."""

    dialect: str | None
    records: list[Record] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def detect_dialect(
    body: bytes,
    *,
    application_properties: Mapping[str, Any] | None = None,
    app_id: str | None = None,
) -> str | None:
    """ "V2", "AM1", "AM2" or None (no QMF marker and no known magic)."""
    if app_id == "qmf2" or (application_properties and "qmf.opcode" in application_properties):
        return "V2"
    magic = bytes(body[:3])
    if magic == b"AM2":
        return "AM2"
    if magic == b"AM1":
        return "AM1"
    return None


def routing_agent(routing_key: str | None) -> str | None:
    """The ``<agent>`` of an AM1 routing key ``mgmt.<agent>.<type>.<package>.<class>``."""
    if routing_key and routing_key.startswith("mgmt."):
        parts = routing_key.split(".")
        if len(parts) >= 3:
            return parts[1]
    return None


def decode_message(
    body: bytes | bytearray | memoryview,
    *,
    registry: SchemaRegistry,
    application_properties: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None,
    content_type: str | None = None,
    app_id: str | None = None,
    routing_key: str | None = None,
    methods: MethodContext | None = None,
) -> DecodeResult:
    """Decode one AMQP message body of any QMF dialect into records + problems.

    ``application_properties`` may also be a list of (key, value) pairs, which is
    what an Arrow map column gives back. ``methods`` (a ``MethodContext``) types
    v1 method arguments from the objects and requests seen so far.
    """
    if application_properties is not None and not isinstance(application_properties, Mapping):
        application_properties = dict(application_properties)
    if not isinstance(body, bytes | bytearray | memoryview):
        problem = Problem(
            "Malformed", f"malformed data at offset 0: body is {type(body).__name__}, not bytes", 0
        )
        return DecodeResult(None, [], [problem])
    buf = bytes(body)
    dialect = detect_dialect(buf, application_properties=application_properties, app_id=app_id)
    if dialect == "V2":
        records, problems = decode_v2(
            buf,
            registry,
            application_properties=application_properties or {},
            content_type=content_type,
        )
        return DecodeResult("V2", records, problems)
    if dialect is None:
        encoding = (application_properties or {}).get(BODY_ENCODING_PROPERTY)
        if encoding is not None:
            # an amqp-value body (not a data section) without a QMF v2 marker
            err0 = Malformed(
                0, f"{BODY_ENCODING_PROPERTY} {encoding!r} body without qmf.opcode: not QMF"
            )
            return DecodeResult(None, [], [Problem.from_error(err0)])
        if len(buf) < 3 and buf in (b"AM1"[: len(buf)], b"AM2"[: len(buf)]):
            err: Truncated | BadMagic = Truncated(0, 8, len(buf), "record header")
        else:
            err = BadMagic(0, buf[:3])
        return DecodeResult(None, [], [Problem.from_error(err)])
    records, problems = decode_v1(buf, registry, agent=routing_agent(routing_key), methods=methods)
    return DecodeResult(dialect, records, problems)


def encode_message(
    records: Sequence[Record], registry: SchemaRegistry | None = None
) -> bytes | V2Encoded:
    """Encode records of one message: v1 records -> body bytes; V2 records -> V2Encoded."""
    if records and records[0].dialect == "V2":
        return encode_v2(records)
    return encode_records(records, registry)
