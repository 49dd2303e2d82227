"""The codec's record model: one dataclass per record kind, shared by all dialects.

Every record carries ``dialect`` ("AM1" | "AM2" | "V2"), ``opcode`` (the v1
opcode letter, or the v2 ``qmf.opcode`` string) and ``seq`` (v1 header
sequence; 0 for V2). Records that mean the same thing in v1 and v2 share a
class: ``ObjectSample`` (v1 'c'/'i'/'g', v2 ``_data``), ``Event`` (v1 'e', v2
``_event``), ``Heartbeat`` (v1 'h', v2 ``_agent_heartbeat_indication``),
``SchemaResponse`` (v1 's', v2 ``_schema_class``) and ``ClassIndication``
(v1 'q', v2 ``_schema_id``).

Object samples flatten to one row (``ObjectSample.row()``) with exactly the
columns in ``OBJECT_SAMPLE_COLUMNS``; the vectorized decoder produces the same
column names, and the element values by element name (``values``). Times are
ns since the epoch. Object ids are decomposed: AM1 (``boot_seq``, ``bank``,
``object_num``), AM2 (``flags``, ``epoch``, ``broker_bank``, ``agent_bank``,
``object_num``), V2 (``agent_name``, ``epoch``, ``object_name``); columns a
dialect lacks are None.

``agent`` is the agent identity: AM1 the ``<agent>`` of ``mgmt.<agent>.*``;
AM2 ``"<broker_bank>.<agent_bank>"`` of the object id (the v1 console's agent
key); V2 the ``qmf.agent`` header (else the object id's agent name).

V2 records keep the decoded body map in ``source`` (not part of equality) so
re-encoding a decoded message is byte-exact; records built by hand have
``source=None`` and encode from their fields.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from pipeline.codec.schema import ClassSchema
from pipeline.codec.types import (
    Am1ObjectId,
    Am2ObjectId,
    EmbeddedObject,
    ObjectId,
    QmfValue,
    TypedArray,
    TypedList,
    TypedMap,
    V2ObjectId,
)

__all__ = [
    "OBJECT_SAMPLE_COLUMNS",
    "Am1ObjectId",
    "Am2ObjectId",
    "AttachRequest",
    "AttachResponse",
    "BrokerRequest",
    "BrokerResponse",
    "ClassIndication",
    "ClassQuery",
    "CommandComplete",
    "ConsoleAdded",
    "EmbeddedObject",
    "Event",
    "GetQuery",
    "Heartbeat",
    "MethodRequest",
    "MethodResponse",
    "ObjectId",
    "ObjectSample",
    "PackageIndication",
    "PackageQuery",
    "QmfException",
    "QmfValue",
    "Record",
    "SchemaRequest",
    "SchemaResponse",
    "TypedArray",
    "TypedList",
    "TypedMap",
    "V2Message",
    "V2ObjectId",
]

DIALECTS = ("AM1", "AM2", "V2")

# Columns of one decoded object sample, in order (the vectorized path must match).
OBJECT_SAMPLE_COLUMNS: tuple[str, ...] = (
    "dialect",
    "opcode",
    "seq",
    "agent",
    "package",
    "class_name",
    "schema_hash",
    "update_ns",
    "create_ns",
    "delete_ns",
    "boot_seq",
    "bank",
    "flags",
    "epoch",
    "broker_bank",
    "agent_bank",
    "object_num",
    "agent_name",
    "object_name",
    "values",
)

_ID_COLUMNS = (
    "boot_seq",
    "bank",
    "flags",
    "epoch",
    "broker_bank",
    "agent_bank",
    "object_num",
    "agent_name",
    "object_name",
)


def id_columns(oid: ObjectId | None) -> dict[str, Any]:
    """All decomposed-id columns, None where the dialect has no such part."""
    cols: dict[str, Any] = dict.fromkeys(_ID_COLUMNS)
    if oid is not None:
        cols.update(oid.columns())
    return cols


@dataclass(slots=True, kw_only=True)
class Record:
    """Fields every record has."""

    kind: ClassVar[str] = "record"
    dialect: str
    opcode: str
    seq: int = 0

    def row(self) -> dict[str, Any]:
        """Flat dict for JSON lines / Parquet output (kind first)."""
        out: dict[str, Any] = {"kind": self.kind}
        for f in fields(self):
            if f.name != "source":
                out[f.name] = getattr(self, f.name)
        return out


@dataclass(slots=True, kw_only=True)
class BrokerRequest(Record):
    """'B': a console says hello; no payload."""

    kind: ClassVar[str] = "broker_request"


@dataclass(slots=True, kw_only=True)
class BrokerResponse(Record):
    """'b': the broker's id (uuid)."""

    kind: ClassVar[str] = "broker_response"
    broker_id: uuid.UUID


@dataclass(slots=True, kw_only=True)
class CommandComplete(Record):
    """'z': completion of a request: code (u32) and text (str8)."""

    kind: ClassVar[str] = "command_complete"
    code: int
    text: str | bytes = ""


@dataclass(slots=True, kw_only=True)
class ClassQuery(Record):
    """'Q': list the classes of a package."""

    kind: ClassVar[str] = "class_query"
    package: str


@dataclass(slots=True, kw_only=True)
class ClassIndication(Record):
    """'q' (v1) / ``_schema_id`` (v2): a class exists. ``class_kind`` 1 table, 2 event; None in AM1."""

    kind: ClassVar[str] = "class_indication"
    class_kind: int | None
    package: str
    class_name: str
    schema_hash: bytes
    source: Any = field(default=None, compare=False, repr=False)


@dataclass(slots=True, kw_only=True)
class SchemaRequest(Record):
    """'S': ask for the full schema of a class key."""

    kind: ClassVar[str] = "schema_request"
    package: str
    class_name: str
    schema_hash: bytes


@dataclass(slots=True, kw_only=True)
class SchemaResponse(Record):
    """'s' (v1) / ``_schema_class`` (v2): a full class schema.

    ``schema`` is the parsed ClassSchema (what decoding needs). For v1 the
    wire maps are kept as well, in order (``property_maps``, ``statistic_maps``,
    ``methods`` = (method map, argument maps) pairs, ``events`` = AM1 event
    records, ``argument_maps`` = AM2 event-class arguments), so re-encoding
    is byte-exact. ``class_kind`` is 1 table / 2 event (None in AM1).
    """

    kind: ClassVar[str] = "schema"
    class_kind: int | None
    schema: ClassSchema
    property_maps: tuple[TypedMap, ...] = ()
    statistic_maps: tuple[TypedMap, ...] = ()
    methods: tuple[tuple[TypedMap, tuple[TypedMap, ...]], ...] = ()
    events: tuple[tuple[TypedMap, tuple[TypedMap, ...]], ...] = ()
    argument_maps: tuple[TypedMap, ...] = ()
    source: Any = field(default=None, compare=False, repr=False)

    @property
    def package(self) -> str:
        return self.schema.key.package

    @property
    def class_name(self) -> str:
        return self.schema.key.name

    @property
    def schema_hash(self) -> bytes:
        return self.schema.key.hash


@dataclass(slots=True, kw_only=True)
class Heartbeat(Record):
    """'h' (v1) / ``_agent_heartbeat_indication`` (v2): an agent is alive at ``timestamp_ns``.

    For V2, ``attributes`` holds the agent's characteristics (``_values``).
    """

    kind: ClassVar[str] = "heartbeat"
    timestamp_ns: int
    agent: str | None = None
    attributes: dict[str, Any] | None = None
    source: Any = field(default=None, compare=False, repr=False)


@dataclass(slots=True, kw_only=True)
class ObjectSample(Record):
    """'c' properties / 'i' statistics / 'g' both (v1), ``_data`` (v2): one object's values.

    ``values`` maps element names to values; an optional property whose
    presence bit is clear is absent from ``values``.
    """

    kind: ClassVar[str] = "object"
    package: str
    class_name: str
    schema_hash: bytes
    update_ns: int
    create_ns: int
    delete_ns: int
    object_id: ObjectId | None
    values: dict[str, Any]
    agent: str | None = None
    source: Any = field(default=None, compare=False, repr=False)

    def row(self) -> dict[str, Any]:
        """The flat row with exactly OBJECT_SAMPLE_COLUMNS (plus ``kind``)."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "dialect": self.dialect,
            "opcode": self.opcode,
            "seq": self.seq,
            "agent": self.agent,
            "package": self.package,
            "class_name": self.class_name,
            "schema_hash": self.schema_hash,
            "update_ns": self.update_ns,
            "create_ns": self.create_ns,
            "delete_ns": self.delete_ns,
        }
        out.update(id_columns(self.object_id))
        out["values"] = self.values
        return out


@dataclass(slots=True, kw_only=True)
class Event(Record):
    """'e' (AM2; AM1 uses the same layout) / ``_event`` (v2): an event with its arguments."""

    kind: ClassVar[str] = "event"
    package: str
    event_name: str
    schema_hash: bytes
    timestamp_ns: int
    severity: int
    arguments: dict[str, Any]
    agent: str | None = None
    source: Any = field(default=None, compare=False, repr=False)

    @property
    def class_name(self) -> str:
        return self.event_name


@dataclass(slots=True, kw_only=True)
class GetQuery(Record):
    """'G': a get query (0-10 map: ``_class``, ``_package``, ``_objectid``, ``_agent``)."""

    kind: ClassVar[str] = "get_query"
    query: TypedMap


@dataclass(slots=True, kw_only=True)
class MethodRequest(Record):
    """'M': invoke a method on an object. AM2 carries the class key; AM1 does not.

    ``raw_arguments`` always holds the argument bytes as on the wire (the audit
    copy). ``arguments`` is the typed view (by name, input and bidirectional
    arguments in schema order) when the class is known, else None: from AM2's
    class key, or for AM1 from a ``MethodContext`` that saw the object's class,
    which then also fills ``package``/``class_name``/``schema_hash`` (they are not
    on the AM1 wire and are not encoded).
    """

    kind: ClassVar[str] = "method_request"
    object_id: ObjectId
    method_name: str
    package: str | None = None
    class_name: str | None = None
    schema_hash: bytes | None = None
    arguments: dict[str, Any] | None = None
    raw_arguments: bytes = b""


@dataclass(slots=True, kw_only=True)
class MethodResponse(Record):
    """'m' (v1) / ``_method_response`` (v2): status, text, output arguments.

    v1: the response names neither the object nor the method; its output and
    bidirectional arguments can be typed only with the request of the same
    sequence number (a ``MethodContext``). Then ``arguments`` is the typed view
    and ``object_id``, ``method_name``, ``package``, ``class_name`` and
    ``schema_hash`` say which call it answers (from the request, not the wire).
    ``raw_arguments`` always holds the argument bytes as on the wire.
    ``text_str8`` marks qpidd's AM2 quirk of writing the text as str8 (AM1's
    text is always str8, per the spec, and this stays False).
    V2 ``arguments`` is the ``_arguments`` map.
    """

    kind: ClassVar[str] = "method_response"
    status: int
    text: str | bytes = ""
    text_str8: bool = False
    arguments: dict[str, Any] | None = None
    raw_arguments: bytes = b""
    object_id: ObjectId | None = None
    method_name: str | None = None
    package: str | None = None
    class_name: str | None = None
    schema_hash: bytes | None = None
    source: Any = field(default=None, compare=False, repr=False)


@dataclass(slots=True, kw_only=True)
class PackageQuery(Record):
    """'P': list known packages; no payload."""

    kind: ClassVar[str] = "package_query"


@dataclass(slots=True, kw_only=True)
class PackageIndication(Record):
    """'p': a package exists."""

    kind: ClassVar[str] = "package_indication"
    package: str


@dataclass(slots=True, kw_only=True)
class AttachRequest(Record):
    """'A': a remote agent asks to attach. AM2 adds a requested agent bank."""

    kind: ClassVar[str] = "attach_request"
    label: str
    system_id: uuid.UUID
    requested_bank: int
    requested_agent_bank: int | None = None


@dataclass(slots=True, kw_only=True)
class AttachResponse(Record):
    """'a': banks assigned to an attached agent."""

    kind: ClassVar[str] = "attach_response"
    broker_bank: int
    agent_bank: int


@dataclass(slots=True, kw_only=True)
class ConsoleAdded(Record):
    """'x': a console bound to the management exchange; no payload."""

    kind: ClassVar[str] = "console_added"


@dataclass(slots=True, kw_only=True)
class QmfException(Record):
    """V2 ``_exception``: a request failed (``error_code``/``error_text`` from ``_values``)."""

    kind: ClassVar[str] = "exception"
    code: int | None
    text: str | None
    values: dict[str, Any]
    agent: str | None = None
    source: Any = field(default=None, compare=False, repr=False)


@dataclass(slots=True, kw_only=True)
class V2Message(Record):
    """Any other V2 message (locate request/response, queries, subscriptions, method requests).

    ``content`` is the ``qmf.content`` header, ``body`` the decoded map or list.
    """

    kind: ClassVar[str] = "v2_message"
    content: str | None
    body: Any
    agent: str | None = None
    source: Any = field(default=None, compare=False, repr=False)


CONTENT_OPCODES = frozenset("cig")


def jsonable(v: Any) -> Any:
    """A JSON-safe copy: bytes -> hex, UUID/object ids -> text, embedded objects -> dicts."""
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, bytes | bytearray | memoryview):
        return bytes(v).hex()
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [jsonable(x) for x in v]
    if isinstance(v, uuid.UUID | Am1ObjectId | Am2ObjectId | V2ObjectId):
        return str(v)
    if isinstance(v, QmfValue):
        return jsonable(v.value)
    if isinstance(v, EmbeddedObject):
        return {
            "package": v.package,
            "class_name": v.class_name,
            "schema_hash": v.schema_hash.hex(),
            "values": jsonable(v.values),
        }
    if isinstance(v, ClassSchema):
        return {
            "package": v.key.package,
            "class_name": v.key.name,
            "schema_hash": v.key.hash.hex(),
            "kind": v.kind,
            "properties": [e.name for e in v.properties],
            "statistics": [e.name for e in v.statistics],
            "methods": [m.name for m in v.methods],
            "arguments": [e.name for e in v.arguments],
        }
    return repr(v)
