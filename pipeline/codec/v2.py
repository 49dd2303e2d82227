"""QMF v2 map messages: 0-10 encoded map/list bodies, mapped onto the shared record kinds.

The opcode comes from the ``qmf.opcode`` application property and the body
kind from ``qmf.content``. The body is a 0-10 encoded map/list, unless the
application property ``x-qmf-body-encoding`` says ``amqp-1.0`` (an AMQP 1.0
``amqp-value`` as qpidd sends it over AMQP 1.0, landed by the receiver AMQP 1.0
encoded: decoded by ``pipeline.codec.amqp10`` to the same Python values, so the
same content makes the same records) or ``amqp-value:string`` (a string value,
landed as UTF-8: kept whole as a ``V2Message`` with a ``str`` body). Data indications and query responses of ``_data``
become ``ObjectSample`` (or ``Event`` when the schema id says ``_event``),
``_event`` becomes ``Event``, ``_schema_id`` ``ClassIndication``,
``_schema_class`` ``SchemaResponse`` (also added to the registry), heartbeats
``Heartbeat``, ``_method_response`` ``MethodResponse``, ``_exception``
``QmfException``; anything else is kept whole as ``V2Message``.

Every record keeps its decoded map in ``source``, so ``encode_v2`` of decoded
records reproduces the body byte for byte; records without ``source`` are
encoded from their fields with qpidd's layout (sorted keys, vbin16 strings,
uint64 times, uuid hashes).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.codec import amqp10
from pipeline.codec.amqp10 import (
    BODY_ENCODING_AMQP10,
    BODY_ENCODING_PROPERTY,
    BODY_ENCODING_STRING,
    Amqp10List,
    Amqp10Map,
)
from pipeline.codec.errors import CodecError, EncodeError, Malformed, Problem
from pipeline.codec.records import (
    ClassIndication,
    Event,
    Heartbeat,
    MethodResponse,
    ObjectSample,
    QmfException,
    Record,
    SchemaResponse,
    V2Message,
)
from pipeline.codec.schema import (
    KIND_EVENT,
    KIND_TABLE,
    ClassSchema,
    Element,
    Method,
    SchemaKey,
    SchemaRegistry,
)
from pipeline.codec.types import (
    TypedList,
    TypedMap,
    V2ObjectId,
    decode_list,
    decode_map,
    encode_list,
    encode_map,
)

# What the receiver adds to a reply whose qmf.agent is qpidd's alias "broker" (it answers
# requests addressed to that alias so): the agent's own name, from the heartbeats of the
# connection. The decoders take it over qmf.agent, so one object has one agent.
AGENT_NAME_PROPERTY = "x-qmf-agent"
BROKER_ALIAS = "broker"

LIST_OPCODES = frozenset({"_data_indication", "_query_response", "_agent_locate_request"})

# QMF_TYPE strings of the v2 proposal -> the closest v1 type code
V2_TYPE_CODES: dict[str, int] = {
    "TYPE_VOID": 0,
    "TYPE_BOOL": 11,
    "TYPE_INT": 19,
    "TYPE_FLOAT": 13,
    "TYPE_STRING": 7,
    "TYPE_MAP": 15,
    "TYPE_LIST": 21,
    "TYPE_UUID": 14,
}
_ACCESS = {"RC": 1, "RW": 2, "RO": 3}


def _s(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


def _i(v: Any, default: int = 0) -> int:
    if isinstance(v, bool):
        return int(v)
    return v if isinstance(v, int) else default


def _hash_bytes(v: Any) -> bytes:
    if isinstance(v, uuid.UUID):
        return v.bytes
    if isinstance(v, bytes) and len(v) == 16:
        return v
    if isinstance(v, str):  # a binary hash that happened to be valid UTF-8 decodes as text
        raw = v.encode("utf-8")
        return raw if len(raw) == 16 else b""
    return b""


def _schema_id(m: Any) -> tuple[str, str, bytes, str | None]:
    if not isinstance(m, Mapping):
        return "", "", b"", None
    return (
        _s(m.get("_package_name")) or "",
        _s(m.get("_class_name")) or "",
        _hash_bytes(m.get("_hash")),
        _s(m.get("_type")),
    )


def _object_id(m: Any) -> V2ObjectId | None:
    if not isinstance(m, Mapping):
        return None
    epoch = m.get("_agent_epoch")
    return V2ObjectId(
        object_name=_s(m.get("_object_name")) or "",
        agent_name=_s(m.get("_agent_name")),
        epoch=_i(epoch) if epoch is not None else None,
    )


def _values(m: Mapping[str, Any], key: str) -> dict[str, Any]:
    v = m.get(key)
    return v if isinstance(v, dict) else {}


def _data_record(item: Any, opcode: str, content: str | None, agent: str | None) -> Record:
    if not isinstance(item, Mapping):
        return V2Message(
            dialect="V2", opcode=opcode, content=content, body=item, agent=agent, source=item
        )
    package, name, h, typ = _schema_id(item.get("_schema_id"))
    if content == "_event" or typ == "_event":
        return Event(
            dialect="V2",
            opcode=opcode,
            package=package,
            event_name=name,
            schema_hash=h,
            timestamp_ns=_i(item.get("_timestamp")),
            severity=_i(item.get("_severity")),
            arguments=_values(item, "_values"),
            agent=agent,
            source=item,
        )
    oid = _object_id(item.get("_object_id"))
    return ObjectSample(
        dialect="V2",
        opcode=opcode,
        package=package,
        class_name=name,
        schema_hash=h,
        update_ns=_i(item.get("_update_ts")),
        create_ns=_i(item.get("_create_ts")),
        delete_ns=_i(item.get("_delete_ts")),
        object_id=oid,
        values=_values(item, "_values"),
        agent=agent or (oid.agent_name if oid else None),
        source=item,
    )


def _v2_element(m: Mapping[str, Any]) -> Element:
    t = m.get("_type")
    code = (
        t if isinstance(t, int) and not isinstance(t, bool) else V2_TYPE_CODES.get(_s(t) or "", 0)
    )
    access = m.get("_access")
    acc = _ACCESS.get(_s(access) or "") if not isinstance(access, int) else access
    extra = {
        k: v for k, v in m.items() if k not in ("_name", "_type", "_access", "_index", "_optional")
    }
    return Element(
        name=_s(m.get("_name")) or "",
        type_code=code,
        access=acc,
        index=bool(m.get("_index", False)),
        optional=bool(m.get("_optional", False)),
        extra=extra,
    )


def _schema_record(item: Any, opcode: str, registry: SchemaRegistry) -> Record:
    if not isinstance(item, Mapping):
        return V2Message(
            dialect="V2", opcode=opcode, content="_schema_class", body=item, source=item
        )
    package, name, h, typ = _schema_id(item.get("_schema_id"))
    kind = KIND_EVENT if typ == "_event" else KIND_TABLE
    props = [_v2_element(p) for p in _listed(item.get("_properties")) if isinstance(p, Mapping)]
    methods = tuple(
        Method(
            name=_s(m.get("_name")) or "",
            arguments=tuple(
                _v2_element(a) for a in _listed(m.get("_arguments")) if isinstance(a, Mapping)
            ),
            extra={k: v for k, v in m.items() if k not in ("_name", "_arguments")},
        )
        for m in _listed(item.get("_methods"))
        if isinstance(m, Mapping)
    )
    key = SchemaKey(package, name, h)
    if kind == KIND_EVENT:
        schema = ClassSchema(key=key, kind=KIND_EVENT, arguments=tuple(props))
    else:
        schema = ClassSchema(key=key, kind=KIND_TABLE, properties=tuple(props), methods=methods)
    registry.add(schema)
    return SchemaResponse(dialect="V2", opcode=opcode, class_kind=kind, schema=schema, source=item)


def _listed(v: Any) -> list[Any]:
    """A schema's element list; anything else (a damaged or foreign value) lists nothing."""
    return list(v) if isinstance(v, list | tuple) else []


def _items(body: Any) -> list[Any]:
    return list(body) if isinstance(body, list) else [body]


def decode_v2(
    body: bytes,
    registry: SchemaRegistry,
    *,
    application_properties: Mapping[str, Any],
    content_type: str | None,
) -> tuple[list[Record], list[Problem]]:
    """Decode one QMF v2 message into records (or one problem if the body is malformed)."""
    opcode = _s(application_properties.get("qmf.opcode")) or ""
    content = _s(application_properties.get("qmf.content"))
    agent = _s(application_properties.get(AGENT_NAME_PROPERTY)) or _s(application_properties.get("qmf.agent"))
    buf = bytes(body)
    encoding = _s(application_properties.get(BODY_ENCODING_PROPERTY))
    try:
        parsed = _parse_body(buf, content_type, encoding)
    except CodecError as exc:
        return [], [Problem.from_error(exc, opcode)]
    except RecursionError:
        return [], [Problem("Malformed", "malformed data at offset 0: nesting too deep", 0, opcode)]
    try:
        return _records(parsed, opcode, content, agent, registry), []
    except (TypeError, ValueError, AttributeError) as exc:  # well-formed bytes, not QMF's shape
        text = f"malformed data at offset 0: not a QMF v2 {opcode or 'message'} ({exc})"
        return [], [Problem("Malformed", text, 0, opcode)]


def _records(
    parsed: Any, opcode: str, content: str | None, agent: str | None, registry: SchemaRegistry
) -> list[Record]:
    """The records of one parsed v2 body, by opcode and content."""
    records: list[Record] = []
    if isinstance(parsed, list) and any(not isinstance(x, Mapping) for x in parsed):
        # a list of something other than maps: keep the body whole (and exact)
        records.append(
            V2Message(
                dialect="V2",
                opcode=opcode,
                content=content,
                body=parsed,
                agent=agent,
                source=parsed,
            )
        )
    elif opcode in ("_data_indication", "_query_response"):
        for item in _items(parsed):
            if content == "_schema_class":
                records.append(_schema_record(item, opcode, registry))
            elif content == "_schema_id" and isinstance(item, Mapping):
                package, name, h, typ = _schema_id(item)
                records.append(
                    ClassIndication(
                        dialect="V2",
                        opcode=opcode,
                        class_kind=KIND_EVENT if typ == "_event" else KIND_TABLE,
                        package=package,
                        class_name=name,
                        schema_hash=h,
                        source=item,
                    )
                )
            elif content in ("_data", "_event", None):
                records.append(_data_record(item, opcode, content, agent))
            else:
                records.append(
                    V2Message(
                        dialect="V2",
                        opcode=opcode,
                        content=content,
                        body=item,
                        agent=agent,
                        source=item,
                    )
                )
    elif opcode == "_agent_heartbeat_indication" and isinstance(parsed, Mapping):
        vals = _values(parsed, "_values")
        records.append(
            Heartbeat(
                dialect="V2",
                opcode=opcode,
                timestamp_ns=_i(vals.get("_timestamp")),
                agent=agent or _s(vals.get("_name")),
                attributes=vals,
                source=parsed,
            )
        )
    elif opcode == "_method_response" and isinstance(parsed, Mapping):
        records.append(
            MethodResponse(
                dialect="V2",
                opcode=opcode,
                status=0,
                arguments=_values(parsed, "_arguments"),
                source=parsed,
            )
        )
    elif opcode == "_exception" and isinstance(parsed, Mapping):
        vals = _values(parsed, "_values")
        code = vals.get("error_code")
        records.append(
            QmfException(
                dialect="V2",
                opcode=opcode,
                code=_i(code) if code is not None else None,
                text=_s(vals.get("error_text")),
                values=vals,
                agent=agent,
                source=parsed,
            )
        )
    else:
        records.append(
            V2Message(
                dialect="V2",
                opcode=opcode,
                content=content,
                body=parsed,
                agent=agent,
                source=parsed,
            )
        )
    return records


def _parse_body(buf: bytes, content_type: str | None, encoding: str | None = None) -> Any:
    """A whole body as one 0-10 map (amqp/map) or list (amqp/list), or as the one AMQP 1.0
    value the body encoding names; trailing bytes are an error."""
    if encoding == BODY_ENCODING_AMQP10:
        return amqp10.decode(buf)[0]
    if encoding == BODY_ENCODING_STRING:
        try:
            return buf.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Malformed(exc.start, "amqp-value string body is not UTF-8") from None
    if encoding is not None:
        raise Malformed(0, f"unknown {BODY_ENCODING_PROPERTY} {encoding!r}")
    if content_type == "amqp/list":
        value: Any
        value, end = decode_list(buf, 0)
    elif content_type == "amqp/map":
        value, end = decode_map(buf, 0)
    else:
        try:
            value, end = decode_map(buf, 0)
        except CodecError:
            value, end = decode_list(buf, 0)
    if end != len(buf):
        raise Malformed(end, f"{len(buf) - end} bytes after the body")
    return value


# ------------------------------------------------------------------ encode


@dataclass(frozen=True)
class V2Encoded:
    """A v2 message ready to send: body, content type and application properties."""

    body: bytes
    content_type: str
    application_properties: dict[str, Any]


def _sorted_map(items: Mapping[str, tuple[int | None, Any]]) -> TypedMap:
    m = TypedMap()
    for k in sorted(items):
        code, v = items[k]
        if v is None:
            continue
        m[k] = v
        if code is not None:
            m.codes[k] = code
    return m


def _schema_id_map(package: str, name: str, h: bytes, typ: str) -> TypedMap:
    return _sorted_map(
        {
            "_package_name": (0x90, package),
            "_class_name": (0x90, name),
            "_type": (0x90, typ),
            "_hash": (0x48, uuid.UUID(bytes=h) if len(h) == 16 else None),
        }
    )


def _object_id_map(oid: V2ObjectId | None) -> TypedMap | None:
    if oid is None:
        return None
    return _sorted_map(
        {
            "_agent_name": (0x90, oid.agent_name),
            "_agent_epoch": (0x32, oid.epoch),
            "_object_name": (0x90, oid.object_name),
        }
    )


def v2_body_of(r: Record) -> Any:
    """The map (or list item) a V2 record encodes to: its ``source`` if decoded, else built."""
    src = getattr(r, "source", None)
    if src is not None:
        return src
    if isinstance(r, ObjectSample):
        return _sorted_map(
            {
                "_schema_id": (
                    0xA8,
                    _schema_id_map(r.package, r.class_name, r.schema_hash, "_data"),
                ),
                "_object_id": (
                    0xA8,
                    _object_id_map(r.object_id if isinstance(r.object_id, V2ObjectId) else None),
                ),
                "_update_ts": (0x32, r.update_ns),
                "_create_ts": (0x32, r.create_ns),
                "_delete_ts": (0x32, r.delete_ns),
                "_values": (0xA8, r.values),
            }
        )
    if isinstance(r, Event):
        return _sorted_map(
            {
                "_schema_id": (
                    0xA8,
                    _schema_id_map(r.package, r.event_name, r.schema_hash, "_event"),
                ),
                "_timestamp": (0x32, r.timestamp_ns),
                "_severity": (0x02, r.severity),
                "_values": (0xA8, r.arguments),
            }
        )
    if isinstance(r, Heartbeat):
        attrs = dict(r.attributes or {})
        attrs.setdefault("_timestamp", r.timestamp_ns)
        if r.agent is not None:
            attrs.setdefault("_name", r.agent)
        return _sorted_map({"_values": (0xA8, attrs)})
    if isinstance(r, MethodResponse):
        return _sorted_map({"_arguments": (0xA8, r.arguments or {})})
    if isinstance(r, QmfException):
        vals = dict(r.values)
        if r.code is not None:
            vals.setdefault("error_code", r.code)
        if r.text is not None:
            vals.setdefault("error_text", r.text)
        return _sorted_map({"_values": (0xA8, vals)})
    if isinstance(r, ClassIndication):
        typ = "_event" if r.class_kind == KIND_EVENT else "_data"
        return _schema_id_map(r.package, r.class_name, r.schema_hash, typ)
    if isinstance(r, V2Message):
        return r.body
    if isinstance(r, SchemaResponse):
        s = r.schema
        typ = "_event" if s.kind == KIND_EVENT else "_data"
        elems = s.arguments if s.kind == KIND_EVENT else s.properties + s.statistics
        return _sorted_map(
            {
                "_schema_id": (0xA8, _schema_id_map(s.key.package, s.key.name, s.key.hash, typ)),
                "_properties": (
                    0xA9,
                    [
                        _sorted_map({"_name": (0x90, e.name), "_type": (0x02, e.type_code)})
                        for e in elems
                    ],
                ),
                "_methods": (0xA9, [_sorted_map({"_name": (0x90, m.name)}) for m in s.methods]),
            }
        )
    raise EncodeError(f"no V2 encoding for {type(r).__name__}")


_CONTENT = {
    ObjectSample: "_data",
    Event: "_event",
    SchemaResponse: "_schema_class",
    ClassIndication: "_schema_id",
}


def _as_0_10(v: Any) -> Any:
    """A body value for the 0-10 encoder: AMQP 1.0 typed containers translated (their
    codes are not 0-10 codes), anything else as is."""
    if isinstance(v, Amqp10Map | Amqp10List | amqp10.Amqp10Array):
        return amqp10.to_0_10(v)[0]
    return v


def _as_amqp10(v: Any) -> Any:
    """A body value for the AMQP 1.0 encoder: decoded AMQP 1.0 values as they are, 0-10
    typed or plain values as qpidd sends them (vbin strings as binary)."""
    if isinstance(v, Amqp10Map | Amqp10List | amqp10.Amqp10Array):
        return v
    return amqp10.from_0_10(v)[0]


ENCODINGS = ("0-10", BODY_ENCODING_AMQP10)


def encode_v2(
    records: Sequence[Record],
    *,
    opcode: str | None = None,
    agent: str | None = None,
    encoding: str = "0-10",
) -> V2Encoded:
    """Encode V2 records of one message (all with the same opcode) into body + headers.

    ``encoding="amqp-1.0"`` gives the body as the receiver lands a qpidd ``amqp-value``
    (AMQP 1.0 encoded, strings as binary) and adds ``x-qmf-body-encoding: amqp-1.0``;
    a ``V2Message`` with a ``str`` body is landed as UTF-8 with ``amqp-value:string``.
    """
    if encoding not in ENCODINGS:
        raise EncodeError(f"unknown V2 body encoding {encoding!r}, expected one of {ENCODINGS}")
    if not records:
        raise EncodeError("a V2 message needs at least one record")
    op = opcode or records[0].opcode
    if any(r.opcode != op for r in records):
        raise EncodeError("all records of a V2 message share one opcode")
    first = records[0]
    content = first.content if isinstance(first, V2Message) else _CONTENT.get(type(first))
    agent = agent or getattr(first, "agent", None)
    body: Any
    built = False  # body is the list of the records' maps (not one record's whole body)
    if op in LIST_OPCODES:
        if isinstance(first, V2Message) and len(records) == 1 and isinstance(first.body, list):
            body = first.body
        else:
            body, built = [v2_body_of(r) for r in records], True
    else:
        if len(records) != 1:
            raise EncodeError(f"{op} carries one map")
        body = v2_body_of(first)
    ctype = "amqp/list" if isinstance(body, list) else "amqp/map"
    marker: str | None = None
    if encoding == BODY_ENCODING_AMQP10:
        if isinstance(body, str):
            raw, marker = body.encode("utf-8"), BODY_ENCODING_STRING
        elif built:
            items = [_as_amqp10(x) for x in body]
            lst = Amqp10List(items, [amqp10.infer(x) for x in items])
            raw, marker = amqp10.encode(lst, lst.code if items else None), BODY_ENCODING_AMQP10
        else:
            value = _as_amqp10(body)
            raw, marker = amqp10.encode(value, amqp10.infer(value)), BODY_ENCODING_AMQP10
    else:
        out = bytearray()
        if built:
            encode_list(out, TypedList([_as_0_10(x) for x in body], [0xA8] * len(body)))
        elif isinstance(body, list):
            encode_list(out, _as_0_10(body))
        else:
            encode_map(out, _as_0_10(body))
        raw = bytes(out)
    method = (
        "response"
        if op in ("_query_response", "_method_response")
        else ("request" if op.endswith("_request") else "indication")
    )
    props: dict[str, Any] = {"method": method, "qmf.opcode": op}
    if content is not None and op in ("_data_indication", "_query_response"):
        props["qmf.content"] = content
    if agent is not None:
        props["qmf.agent"] = agent
    if marker is not None:
        props[BODY_ENCODING_PROPERTY] = marker
    return V2Encoded(raw, ctype, props)
