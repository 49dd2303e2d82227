"""QMF v1 binary messages (AM1, the M3 spec, and AM2, what qpidd sends): decode and encode.

A v1 message is one or more records, each ``'A' 'M' <version> <opcode> seq(u32)``
followed by an opcode-specific body. Records carry no length, so splitting a
message needs the schema of every content/event record; schema responses in
a message are added to the registry at once so later records can use them.

Opcode bodies are decoded through ``OPCODE_DECODERS`` / encoded through
``OPCODE_ENCODERS`` (dispatch tables). Content and event values use per-class
*plans* (element name + decoder lists) compiled once per schema and cached
in ``SchemaRegistry.plans``.

Encoding API (used by the simulator): ``encode_record(record, registry)``
returns the bytes of one record (header included); ``encode_records`` joins
several into one message body. ``schema_response_for(schema, dialect)``
builds a schema response record (with qpid's map layout) from a ClassSchema.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline.codec.errors import (
    ArgumentMismatch,
    BadMagic,
    CodecError,
    EncodeError,
    Malformed,
    MissingSchema,
    Problem,
    ReservedBitSet,
    Truncated,
    UnknownOpcode,
    UnknownType,
)
from pipeline.codec.records import (
    AttachRequest,
    AttachResponse,
    BrokerRequest,
    BrokerResponse,
    ClassIndication,
    ClassQuery,
    CommandComplete,
    ConsoleAdded,
    Event,
    GetQuery,
    Heartbeat,
    MethodRequest,
    MethodResponse,
    ObjectSample,
    PackageIndication,
    PackageQuery,
    Record,
    SchemaRequest,
    SchemaResponse,
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
    U16,
    U32,
    U32X2,
    U64,
    Am1ObjectId,
    Am2ObjectId,
    Decoder,
    EmbeddedObject,
    Encoder,
    QmfValue,
    TypedMap,
    _dec_uuid,
    _enc_uuid,
    decode_map,
    encode_map,
    infer_code,
    qmf_types,
    read_bin,
    read_str8,
    read_struct,
    read_text8,
    read_text16,
    read_u8,
    write_str8,
    write_str16,
)

HEADER = struct.Struct(">3scI")
MAGIC = {b"AM1": "AM1", b"AM2": "AM2"}
MAGIC_OF = {"AM1": b"AM1", "AM2": b"AM2"}
U16X3 = struct.Struct(">HHH")
U16X4 = struct.Struct(">HHHH")
TIMES_AM1 = struct.Struct(">QQQQ")  # update, create, delete, object id
TIMES_AM2 = struct.Struct(">QQQQQ")  # update, create, delete, object id (2 x u64)
EVENT_TS = struct.Struct(">QB")
MAX_RECORDS = 1_000_000  # bound on records per message (each takes >= 8 bytes anyway)


if TYPE_CHECKING:
    from pipeline.codec.methods import MethodContext


@dataclass(slots=True)
class Ctx:
    """What opcode decoders need beyond the bytes.

    ``notes`` collects problems that flag the record being decoded without
    stopping the message (a reserved bit set, arguments that do not fit).
    """

    dialect: str
    registry: SchemaRegistry
    agent: str | None
    notes: list[CodecError] = field(default_factory=list)


def _reserved_id(raw: int, off: int, what: str, ctx: Ctx) -> None:
    """AM1 object id bit 63 is "reserved, must be zero": flag it, keep the record and raw id."""
    if raw >> 63:
        ctx.notes.append(
            ReservedBitSet(off, f"bit 63 of AM1 {what} {raw:#018x} (must be zero); raw id kept")
        )


def _reserved_refs(values: Mapping[str, Any], off: int, ctx: Ctx) -> None:
    """Type-10 references (AM1 u64 ids) among decoded values, with bit 63 set."""
    for name, v in values.items():
        if type(v) is Am1ObjectId and v.reserved:
            # offset: where the values start (plans do not track each value's offset)
            _reserved_id(v.to_int(), off, f"object reference {name!r} among the values", ctx)


# ------------------------------------------------------------- schema maps


def _int_field(m: Mapping[str, Any], key: str, off: int, default: int | None = None) -> int:
    v = m.get(key, default)
    if v is None or isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, bool):
            return int(v)
        raise Malformed(off, f"schema map needs integer {key!r}, found {v!r}")
    return v


def _str_field(m: Mapping[str, Any], key: str, off: int) -> str:
    v = m.get(key)
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            raise Malformed(off, f"schema map {key!r} is not UTF-8") from None
    if not isinstance(v, str):
        raise Malformed(off, f"schema map needs string {key!r}, found {v!r}")
    return v


_ELEMENT_KEYS = ("name", "type", "access", "index", "optional")


def element_from_map(m: Mapping[str, Any], off: int = -1) -> Element:
    """Turn a v1 schema map (property, statistic or argument) into an Element."""
    name = _str_field(m, "name", off)
    type_code = _int_field(m, "type", off)
    access = m.get("access")
    if access is not None and (isinstance(access, bool) or not isinstance(access, int)):
        raise Malformed(off, f"schema map {name!r} access {access!r} is not an integer")
    extra = {k: v for k, v in m.items() if k not in _ELEMENT_KEYS}
    return Element(
        name=name,
        type_code=type_code,
        access=access,
        index=bool(m.get("index", 0)),
        optional=bool(m.get("optional", 0)),
        extra=extra,
    )


def arg_direction(arg: Element) -> str:
    """'I', 'O' or 'IO' for a method argument (AM1 codes 1/2/3, AM2 strings)."""
    d = arg.extra.get("dir", "I")
    if isinstance(d, int):
        return {1: "I", 2: "O", 3: "IO"}.get(d, "I")
    if isinstance(d, bytes):
        d = d.decode("utf-8", "replace")
    return str(d).upper()


def _read_maps(buf: bytes, off: int, n: int) -> tuple[list[TypedMap], int]:
    out = []
    for _ in range(n):
        m, off = decode_map(buf, off)
        out.append(m)
    return out, off


def _read_member_groups(
    buf: bytes, off: int, n: int
) -> tuple[list[tuple[TypedMap, tuple[TypedMap, ...]]], int]:
    """Methods (or AM1 events): a main map with ``argCount`` then that many argument maps."""
    groups = []
    for _ in range(n):
        at = off
        main, off = decode_map(buf, off)
        argc = _int_field(main, "argCount", at, 0)
        if argc < 0 or argc > len(buf) - off:
            raise Malformed(at, f"argCount {argc} does not fit in the message")
        args, off = _read_maps(buf, off, argc)
        groups.append((main, tuple(args)))
    return groups, off


def _method_from(main: TypedMap, args: Sequence[TypedMap], off: int) -> Method:
    name = _str_field(main, "name", off)
    extra = {k: v for k, v in main.items() if k not in ("name", "argCount")}
    return Method(name=name, arguments=tuple(element_from_map(a, off) for a in args), extra=extra)


def _check_count(n: int, buf: bytes, off: int, what: str) -> None:
    # every map takes at least 8 bytes
    if n * 8 > len(buf) - off:
        raise Malformed(off, f"{what} count {n} cannot fit in {len(buf) - off} bytes")


def is_am1_event_class(
    class_name: str, n_props: int, n_stats: int, n_methods: int, events: Sequence[Method]
) -> bool:
    """AM1's 's' has no class kind, so an event class is a schema response with no
    properties, statistics or methods and exactly one event record named like the class."""
    return (
        n_props == n_stats == n_methods == 0 and len(events) == 1 and events[0].name == class_name
    )


def _dec_schema(buf: bytes, off: int, seq: int, ctx: Ctx) -> tuple[Record, int]:
    start = off
    class_kind: int | None = None
    if ctx.dialect == "AM2":
        class_kind, off = read_u8(buf, off, "class kind")
        if class_kind not in (KIND_TABLE, KIND_EVENT):
            raise Malformed(start, f"class kind must be 1 or 2, found {class_kind}")
    package, off = read_str8(buf, off, "package name")
    name, off = read_str8(buf, off, "class name")
    h, off = read_bin(buf, off, 16, "schema hash")
    key = SchemaKey(package, name, h)
    if class_kind == KIND_EVENT:
        (argc,) = read_struct(U16, buf, off, "argument count")
        off += 2
        _check_count(argc, buf, off, "argument")
        arg_maps, off = _read_maps(buf, off, argc)
        schema = ClassSchema(
            key=key, kind=KIND_EVENT, arguments=tuple(element_from_map(m, start) for m in arg_maps)
        )
        rec = SchemaResponse(
            dialect=ctx.dialect,
            opcode="s",
            seq=seq,
            class_kind=class_kind,
            schema=schema,
            argument_maps=tuple(arg_maps),
        )
        ctx.registry.add(schema)
        return rec, off
    events: list[tuple[TypedMap, tuple[TypedMap, ...]]] = []
    if ctx.dialect == "AM2":
        pc, sc, mc = read_struct(U16X3, buf, off, "schema counts")
        off += 6
        ec = 0
    else:
        pc, sc, mc, ec = read_struct(U16X4, buf, off, "schema counts")
        off += 8
    _check_count(pc + sc + mc + ec, buf, off, "schema record")
    props, off = _read_maps(buf, off, pc)
    stats, off = _read_maps(buf, off, sc)
    methods, off = _read_member_groups(buf, off, mc)
    if ec:
        events, off = _read_member_groups(buf, off, ec)
    event_records = tuple(_method_from(m, a, start) for m, a in events)
    if is_am1_event_class(name, pc, sc, mc, event_records):
        # AM1's convention for an event class: its one event record, named like the class
        schema = ClassSchema(key=key, kind=KIND_EVENT, arguments=event_records[0].arguments)
    else:
        schema = ClassSchema(
            key=key,
            kind=KIND_TABLE,
            properties=tuple(element_from_map(m, start) for m in props),
            statistics=tuple(element_from_map(m, start) for m in stats),
            methods=tuple(_method_from(m, a, start) for m, a in methods),
            events=event_records,
        )
    ctx.registry.add(schema)
    rec = SchemaResponse(
        dialect=ctx.dialect,
        opcode="s",
        seq=seq,
        class_kind=class_kind,
        schema=schema,
        property_maps=tuple(props),
        statistic_maps=tuple(stats),
        methods=tuple(methods),
        events=tuple(events),
    )
    return rec, off


def _enc_schema(out: bytearray, r: Record, reg: SchemaRegistry | None) -> None:
    assert isinstance(r, SchemaResponse)
    key = r.schema.key
    if r.dialect == "AM2":
        if r.class_kind is None:
            raise EncodeError("AM2 schema response needs class_kind")
        if r.events:
            raise EncodeError("AM2 schema response has no event records")
        out.append(r.class_kind)
    else:
        # AM1: no class kind; an event class travels as one event record (schema_response_for)
        if r.class_kind is not None:
            raise EncodeError("AM1 schema response has no class kind (class_kind must be None)")
        if r.argument_maps:
            raise EncodeError("AM1 schema response carries event arguments in an event record")
    write_str8(out, key.package)
    write_str8(out, key.name)
    _put_hash(out, key.hash)
    if r.class_kind == KIND_EVENT:
        out += U16.pack(len(r.argument_maps))
        for m in r.argument_maps:
            encode_map(out, m)
        return
    if r.dialect == "AM2":
        out += U16X3.pack(len(r.property_maps), len(r.statistic_maps), len(r.methods))
    else:
        out += U16X4.pack(
            len(r.property_maps), len(r.statistic_maps), len(r.methods), len(r.events)
        )
    for m in r.property_maps:
        encode_map(out, m)
    for m in r.statistic_maps:
        encode_map(out, m)
    for group in (r.methods, r.events):
        for main, args in group:
            if main.get("argCount", 0) != len(args):
                raise EncodeError(f"argCount of {main.get('name')!r} is not {len(args)}")
            encode_map(out, main)
            for a in args:
                encode_map(out, a)


def _element_map(e: Element, dialect: str, kind: str) -> TypedMap:
    """qpid's schema map for an element: keys sorted (qpid uses std::map), qpid's codes."""
    items: dict[str, tuple[int, Any]] = {}
    items["name"] = (0x90, e.name)
    items["type"] = (0x02, e.type_code)
    if kind == "property":
        items["access"] = (0x02, e.access if e.access is not None else 3)
        items["index"] = (0x21, int(e.index))
        items["optional"] = (0x21, int(e.optional))
    for k, v in e.extra.items():
        if k == "dir":
            # AM1 direction codes are numbers 1/2/3, AM2 writes "I"/"O"/"IO"
            if dialect == "AM1":
                if isinstance(v, str):
                    v = {"I": 1, "O": 2, "IO": 3}.get(v.upper(), 1)
                items[k] = (0x02, v)
            else:
                if isinstance(v, int):
                    v = {1: "I", 2: "O", 3: "IO"}.get(v, "I")
                items[k] = (0x90, v)
            continue
        items[k] = (0x90 if isinstance(v, str) else infer_code(v), v)
    m = TypedMap()
    for k in sorted(items):
        code, v = items[k]
        m[k] = v
        m.codes[k] = code
    return m


def _method_maps(meth: Method, dialect: str) -> tuple[TypedMap, tuple[TypedMap, ...]]:
    main = TypedMap()
    items: dict[str, tuple[int, Any]] = {
        "name": (0x90, meth.name),
        "argCount": (0x21, len(meth.arguments)),
    }
    for k, v in meth.extra.items():
        items[k] = (0x90 if isinstance(v, str) else infer_code(v), v)
    for k in sorted(items):
        main[k] = items[k][1]
        main.codes[k] = items[k][0]
    return main, tuple(_element_map(a, dialect, "argument") for a in meth.arguments)


def schema_response_for(schema: ClassSchema, dialect: str = "AM2", seq: int = 0) -> SchemaResponse:
    """A schema response record for a ClassSchema, with maps laid out as qpidd does.

    An event class in AM1 (whose 's' has no class kind) becomes a response with no
    properties, statistics or methods and one event record named like the class,
    which carries the arguments; ``_dec_schema`` reads that back as an event class.
    """
    if schema.kind == KIND_EVENT:
        if dialect == "AM1":
            # AM1 has no class kind: counts 0/0/0/1 and one event record named like the class
            return SchemaResponse(
                dialect=dialect,
                opcode="s",
                seq=seq,
                class_kind=None,
                schema=schema,
                events=(_method_maps(Method(schema.key.name, schema.arguments), dialect),),
            )
        return SchemaResponse(
            dialect=dialect,
            opcode="s",
            seq=seq,
            class_kind=KIND_EVENT,
            schema=schema,
            argument_maps=tuple(_element_map(a, dialect, "argument") for a in schema.arguments),
        )
    return SchemaResponse(
        dialect=dialect,
        opcode="s",
        seq=seq,
        class_kind=KIND_TABLE if dialect == "AM2" else None,
        schema=schema,
        property_maps=tuple(_element_map(p, dialect, "property") for p in schema.properties),
        statistic_maps=tuple(_element_map(s, dialect, "statistic") for s in schema.statistics),
        methods=tuple(_method_maps(m, dialect) for m in schema.methods),
        # only AM1 lists event records beside a table class's members
        events=tuple(_method_maps(e, dialect) for e in schema.events) if dialect == "AM1" else (),
    )


# ------------------------------------------------------------ value plans

_MAX_OBJECT_DEPTH = 16


def _value_codec(
    code: int, dialect: str, registry: SchemaRegistry, depth: int = 0
) -> tuple[Decoder, Encoder]:
    """Decoder/encoder for one QMF type code; type 20 (object) closes over the registry."""
    if code == 20:
        return _object_codec(dialect, registry, depth)
    pair = qmf_types(dialect).get(code)
    if pair is None:

        def dec(buf: bytes, off: int) -> tuple[Any, int]:
            raise UnknownType(off, code, "QMF")

        def enc(out: bytearray, v: Any) -> None:
            raise EncodeError(f"unknown QMF type code {code}")

        return dec, enc
    return pair


def _object_codec(dialect: str, registry: SchemaRegistry, depth: int) -> tuple[Decoder, Encoder]:
    """QMF type 20: inner type u8; 20 = class key then an unmanaged object (presence bits,
    properties, statistics), any other code = a value of that type."""

    def dec(buf: bytes, off: int) -> tuple[Any, int]:
        if depth > _MAX_OBJECT_DEPTH:
            raise Malformed(off, "objects nested too deep")
        inner, p = read_u8(buf, off, "object inner type")
        if inner != 20:
            d, _ = _value_codec(inner, dialect, registry, depth + 1)
            v, p = d(buf, p)
            return QmfValue(inner, v), p
        package, p = read_str8(buf, p, "package name")
        name, p = read_str8(buf, p, "class name")
        h, p = read_bin(buf, p, 16, "schema hash")
        schema = registry.get(SchemaKey(package, name, h))
        if schema is None:
            raise MissingSchema(off, str(SchemaKey(package, name, h)))
        plan = _plan(dialect, "g", schema, registry, depth + 1)
        values, p = plan.decode(buf, p)
        return EmbeddedObject(package, name, h, values), p

    def enc(out: bytearray, v: Any) -> None:
        if isinstance(v, QmfValue):
            out.append(v.code)
            _value_codec(v.code, dialect, registry, depth + 1)[1](out, v.value)
            return
        if not isinstance(v, EmbeddedObject):
            raise EncodeError(f"object value needs EmbeddedObject or QmfValue, got {v!r}")
        out.append(20)
        write_str8(out, v.package)
        write_str8(out, v.class_name)
        _put_hash(out, v.schema_hash)
        schema = registry.get(SchemaKey(v.package, v.class_name, v.schema_hash))
        if schema is None:
            raise EncodeError(f"no schema for embedded object {v.package}:{v.class_name}")
        _plan(dialect, "g", schema, registry, depth + 1).encode(out, v.values)

    return dec, enc


# QMF type codes that are one fixed-size number on the wire: struct format per dialect
_FIXED_FMT = {
    1: "B",
    2: "H",
    3: "I",
    4: "Q",
    9: "Q",
    12: "f",
    13: "d",
    16: "b",
    17: "h",
    18: "i",
    19: "q",
}


def fixed_format(code: int, dialect: str) -> str | None:
    """struct format char of a fixed-size numeric QMF type (absTime is int64 in AM2)."""
    if code == 8:
        return "q" if dialect == "AM2" else "Q"
    return _FIXED_FMT.get(code)


class Plan:
    """Compiled element layout of one class for 'c' / 'i' / 'g' / 'e' / method arguments.

    ``props``: (name, decoder, encoder, optional bit or -1); ``stats``: (name,
    decoder, encoder); ``formats``: struct format char per element (props then
    stats) or None. Decoding walks ``segments``: runs of consecutive mandatory
    fixed-size numbers are read with one precompiled ``struct.Struct`` (most
    statistics), other elements with their own decoder.
    """

    __slots__ = ("n_opt", "n_presence", "props", "segments", "stats")

    def __init__(
        self,
        props: list[tuple[str, Decoder, Encoder, int]],
        stats: list[tuple[str, Decoder, Encoder]],
        n_presence: int,
        formats: Sequence[str | None] = (),
    ) -> None:
        self.props = props
        self.stats = stats
        self.n_presence = n_presence
        self.n_opt = sum(1 for p in props if p[3] >= 0)
        elems = [(n, d, b) for n, d, _, b in props] + [(n, d, -1) for n, d, _ in stats]
        fmts = list(formats) + [None] * (len(elems) - len(formats))
        segs: list[tuple[struct.Struct | None, Any, Any, int]] = []
        run_names: list[str] = []
        run_fmt: list[str] = []
        run_decs: list[tuple[str, Decoder]] = []

        def flush() -> None:
            if run_names:
                segs.append(
                    (struct.Struct(">" + "".join(run_fmt)), tuple(run_names), tuple(run_decs), -1)
                )
                run_names.clear()
                run_fmt.clear()
                run_decs.clear()

        for (name, dec, bit), fmt in zip(elems, fmts, strict=True):
            if fmt is not None and bit < 0:
                run_names.append(name)
                run_fmt.append(fmt)
                run_decs.append((name, dec))
            else:
                flush()
                segs.append((None, name, dec, bit))
        flush()
        self.segments = segs

    def decode(self, buf: bytes, off: int) -> tuple[dict[str, Any], int]:
        values: dict[str, Any] = {}
        bits = 0
        n = len(buf)
        if self.n_presence:
            np = self.n_presence
            end = off + np
            if end > n:
                raise Truncated(off, np, max(n - off, 0), "presence bitmask")
            bits = int.from_bytes(buf[off:end], "little")
            if bits >> self.n_opt:
                raise Malformed(
                    off, f"presence bits set beyond the {self.n_opt} optional properties"
                )
            off = end
        for st, names, dec, bit in self.segments:
            if st is not None:
                end = off + st.size
                if end > n:
                    # re-read element by element to report exactly which one is cut
                    for name, d in dec:
                        values[name], off = d(buf, off)
                values.update(zip(names, st.unpack_from(buf, off), strict=True))
                off = end
            else:
                if bit >= 0 and not (bits >> bit) & 1:
                    continue
                values[names], off = dec(buf, off)
        return values, off

    def encode(self, out: bytearray, values: Mapping[str, Any]) -> None:
        if self.n_presence:
            bits = 0
            for name, _, _, bit in self.props:
                if bit >= 0 and values.get(name) is not None:
                    bits |= 1 << bit
            out += bits.to_bytes(self.n_presence, "little")
        for name, _, enc, bit in self.props:
            v = values.get(name)
            if v is None:
                if bit >= 0:
                    continue
                raise EncodeError(f"missing value for property {name!r}")
            enc(out, v)
        for name, _, enc in self.stats:
            v = values.get(name)
            if v is None:
                raise EncodeError(f"missing value for statistic {name!r}")
            enc(out, v)


def _plan(
    dialect: str, opcode: str, schema: ClassSchema, registry: SchemaRegistry, depth: int = 0
) -> Plan:
    """The cached Plan for (dialect, opcode, class); opcode 'e' = event arguments."""
    key = ("plan", dialect, opcode, schema.key, depth)
    plan: Plan | None = registry.plans.get(key)
    if plan is not None:
        return plan
    props: list[tuple[str, Decoder, Encoder, int]] = []
    stats: list[tuple[str, Decoder, Encoder]] = []
    n_presence = 0
    pfmts: list[str | None] = []
    sfmts: list[str | None] = []
    if opcode == "e":
        for a in schema.arguments:
            d, e = _value_codec(a.type_code, dialect, registry, depth)
            stats.append((a.name, d, e))
            sfmts.append(fixed_format(a.type_code, dialect))
    else:
        if opcode in ("c", "g"):
            bit = 0
            for p in schema.properties:
                d, e = _value_codec(p.type_code, dialect, registry, depth)
                pfmts.append(fixed_format(p.type_code, dialect))
                if p.optional:
                    props.append((p.name, d, e, bit))
                    bit += 1
                else:
                    props.append((p.name, d, e, -1))
            n_presence = (bit + 7) // 8
        if opcode in ("i", "g"):
            for s in schema.statistics:
                d, e = _value_codec(s.type_code, dialect, registry, depth)
                stats.append((s.name, d, e))
                sfmts.append(fixed_format(s.type_code, dialect))
    plan = Plan(props, stats, n_presence, pfmts + sfmts)
    registry.plans[key] = plan
    return plan


def _args_plan(
    dialect: str, schema: ClassSchema, method: str, direction: str, registry: SchemaRegistry
) -> Plan | None:
    key = ("args", dialect, schema.key, method, direction)
    if key in registry.plans:
        cached: Plan | None = registry.plans[key]
        return cached
    plan = None
    for m in schema.methods:
        if m.name == method:
            stats = []
            fmts = []
            for a in m.arguments:
                if direction in arg_direction(a):
                    d, e = _value_codec(a.type_code, dialect, registry)
                    stats.append((a.name, d, e))
                    fmts.append(fixed_format(a.type_code, dialect))
            plan = Plan([], stats, 0, fmts)
            break
    registry.plans[key] = plan
    return plan


# --------------------------------------------------------------- opcodes


def _put_hash(out: bytearray, h: bytes) -> None:
    if len(h) != 16:
        raise EncodeError(f"schema hash needs 16 bytes, got {len(h)}")
    out += h


def _agent_of(dialect: str, oid: Any, ctx_agent: str | None) -> str | None:
    if dialect == "AM2" and isinstance(oid, Am2ObjectId):
        return f"{oid.broker_bank}.{oid.agent_bank}"
    return ctx_agent


def _class_key(buf: bytes, off: int) -> tuple[str, str, bytes, int]:
    package, off = read_str8(buf, off, "package name")
    name, off = read_str8(buf, off, "class name")
    h, off = read_bin(buf, off, 16, "schema hash")
    return package, name, h, off


_AM2_IDS: dict[tuple[int, int], tuple[Am2ObjectId, str]] = {}
_MAX_IDS = 1 << 16


def _dec_content(buf: bytes, off: int, seq: int, ctx: Ctx, opcode: str) -> tuple[Record, int]:
    start = off
    n = len(buf)
    plans = ctx.registry.plans
    # Fast path: the raw class-key bytes (package, class, hash) -> names and Plan.
    hit = None
    if off < n:
        p2 = off + 1 + buf[off]
        if p2 < n:
            kend = p2 + 17 + buf[p2]
            ckey = (ctx.dialect, opcode, buf[off:kend])
            hit = plans.get(ckey)
    if hit is not None:
        package, name, h, plan = hit
        off = kend
    else:
        package, name, h, off = _class_key(buf, off)
        schema = ctx.registry.get(SchemaKey(package, name, h))
        if schema is None:
            raise MissingSchema(start, f"{package}:{name}({h.hex()})")
        plan = _plan(ctx.dialect, opcode, schema, ctx.registry)
        plans[(ctx.dialect, opcode, buf[start:off])] = (package, name, h, plan)
    agent: str | None
    if ctx.dialect == "AM2":
        upd, cre, dele, first, second = read_struct(TIMES_AM2, buf, off, "timestamps and object id")
        off += 40
        # the same objects are sampled every interval: reuse their (immutable) ids
        cached = _AM2_IDS.get((first, second))
        if cached is None:
            oid2 = Am2ObjectId.from_ints(first, second)
            cached = (oid2, f"{oid2.broker_bank}.{oid2.agent_bank}")
            if len(_AM2_IDS) >= _MAX_IDS:
                _AM2_IDS.clear()
            _AM2_IDS[(first, second)] = cached
        oid: Any = cached[0]
        agent = cached[1]
    else:
        upd, cre, dele, raw = read_struct(TIMES_AM1, buf, off, "timestamps and object id")
        if raw >> 63:
            _reserved_id(raw, off + 24, "object id", ctx)
        off += 32
        oid = Am1ObjectId.from_int(raw)
        agent = ctx.agent
    values_at = off
    values, off = plan.decode(buf, off)
    if ctx.dialect == "AM1":
        _reserved_refs(values, values_at, ctx)
    rec = ObjectSample(
        dialect=ctx.dialect,
        opcode=opcode,
        seq=seq,
        package=package,
        class_name=name,
        schema_hash=h,
        update_ns=upd,
        create_ns=cre,
        delete_ns=dele,
        object_id=oid,
        values=values,
        agent=agent,
    )
    return rec, off


def _enc_content(out: bytearray, r: Record, reg: SchemaRegistry | None) -> None:
    assert isinstance(r, ObjectSample)
    write_str8(out, r.package)
    write_str8(out, r.class_name)
    _put_hash(out, r.schema_hash)
    try:
        if r.dialect == "AM2":
            oid = r.object_id
            if not isinstance(oid, Am2ObjectId):
                raise EncodeError(f"AM2 content needs an Am2ObjectId, got {oid!r}")
            out += TIMES_AM2.pack(
                r.update_ns, r.create_ns, r.delete_ns, oid.first(), oid.object_num
            )
        else:
            oid1 = r.object_id
            if not isinstance(oid1, Am1ObjectId):
                raise EncodeError(f"AM1 content needs an Am1ObjectId, got {oid1!r}")
            out += TIMES_AM1.pack(r.update_ns, r.create_ns, r.delete_ns, oid1.to_int())
    except struct.error as exc:
        raise EncodeError(f"timestamps or object id out of range: {exc}") from exc
    schema = _need_schema(reg, r.package, r.class_name, r.schema_hash)
    _plan(r.dialect, r.opcode, schema, reg).encode(out, r.values)  # type: ignore[arg-type]


def _need_schema(reg: SchemaRegistry | None, package: str, name: str, h: bytes) -> ClassSchema:
    schema = reg.get(SchemaKey(package, name, h)) if reg is not None else None
    if schema is None:
        raise EncodeError(f"no schema for {package}:{name}({h.hex()})")
    return schema


def _dec_event(buf: bytes, off: int, seq: int, ctx: Ctx) -> tuple[Record, int]:
    start = off
    package, name, h, off = _class_key(buf, off)
    ts, severity = read_struct(EVENT_TS, buf, off, "event timestamp and severity")
    off += 9
    schema = ctx.registry.get(SchemaKey(package, name, h))
    if schema is None:
        raise MissingSchema(start, f"{package}:{name}({h.hex()})")
    args_at = off
    args, off = _plan(ctx.dialect, "e", schema, ctx.registry).decode(buf, off)
    if ctx.dialect == "AM1":
        _reserved_refs(args, args_at, ctx)
    rec = Event(
        dialect=ctx.dialect,
        opcode="e",
        seq=seq,
        package=package,
        event_name=name,
        schema_hash=h,
        timestamp_ns=ts,
        severity=severity,
        arguments=args,
        agent=ctx.agent,
    )
    return rec, off


def _enc_event(out: bytearray, r: Record, reg: SchemaRegistry | None) -> None:
    assert isinstance(r, Event)
    write_str8(out, r.package)
    write_str8(out, r.event_name)
    _put_hash(out, r.schema_hash)
    try:
        out += EVENT_TS.pack(r.timestamp_ns, r.severity)
    except struct.error as exc:
        raise EncodeError(f"event timestamp/severity out of range: {exc}") from exc
    schema = _need_schema(reg, r.package, r.event_name, r.schema_hash)
    _plan(r.dialect, "e", schema, reg).encode(out, r.arguments)  # type: ignore[arg-type]


def _dec_B(buf: bytes, off: int, seq: int, ctx: Ctx) -> tuple[Record, int]:
    return BrokerRequest(dialect=ctx.dialect, opcode="B", seq=seq), off


def _dec_P(buf: bytes, off: int, seq: int, ctx: Ctx) -> tuple[Record, int]:
    return PackageQuery(dialect=ctx.dialect, opcode="P", seq=seq), off


def _dec_x(buf: bytes, off: int, seq: int, ctx: Ctx) -> tuple[Record, int]:
    return ConsoleAdded(dialect=ctx.dialect, opcode="x", seq=seq), off


def _enc_nothing(out: bytearray, r: Record, reg: SchemaRegistry | None) -> None:
    return None


def _dec_b(buf: bytes, off: int, seq: int, ctx: Ctx) -> tuple[Record, int]:
    bid, off = _dec_uuid(buf, off)
    return BrokerResponse(dialect=ctx.dialect, opcode="b", seq=seq, broker_id=bid), off


def _enc_b(out: bytearray, r: Record, reg: SchemaRegistry | None) -> None:
    assert isinstance(r, BrokerResponse)
    _enc_uuid(out, r.broker_id)


def _dec_z(buf: bytes, off: int, seq: int, ctx: Ctx) -> tuple[Record, int]:
    (code,) = read_struct(U32, buf, off, "completion code")
    text, off = read_text8(buf, off + 4, "completion text")
    return CommandComplete(dialect=ctx.dialect, opcode="z", seq=seq, code=code, text=text), off


def _enc_z(out: bytearray, r: Record, reg: SchemaRegistry | None) -> None:
    assert isinstance(r, CommandComplete)
    _pack(out, U32, r.code, "completion code")
    write_str8(out, r.text, "completion text")


def _pack(out: bytearray, st: struct.Struct, v: Any, what: str) -> None:
    try:
        out += st.pack(v)
    except struct.error as exc:
        raise EncodeError(f"{what} out of range: {v!r}") from exc


def _dec_Q(buf: bytes, off: int, seq: int, ctx: Ctx) -> tuple[Record, int]:
    package, off = read_str8(buf, off, "package name")
    return ClassQuery(dialect=ctx.dialect, opcode="Q", seq=seq, package=package), off


def _enc_Q(out: bytearray, r: Record, reg: SchemaRegistry | None) -> None:
    assert isinstance(r, ClassQuery | PackageIndication)
    write_str8(out, r.package)


def _dec_p(buf: bytes, off: int, seq: int, ctx: Ctx) -> tuple[Record, int]:
    package, off = read_str8(buf, off, "package name")
    return PackageIndication(dialect=ctx.dialect, opcode="p", seq=seq, package=package), off


def _dec_q(buf: bytes, off: int, seq: int, ctx: Ctx) -> tuple[Record, int]:
    kind: int | None = None
    if ctx.dialect == "AM2":
        at = off
        kind, off = read_u8(buf, off, "class kind")
        if kind not in (KIND_TABLE, KIND_EVENT):
            raise Malformed(at, f"class kind must be 1 or 2, found {kind}")
    package, name, h, off = _class_key(buf, off)
    rec = ClassIndication(
        dialect=ctx.dialect,
        opcode="q",
        seq=seq,
        class_kind=kind,
        package=package,
        class_name=name,
        schema_hash=h,
    )
    return rec, off


def _enc_q(out: bytearray, r: Record, reg: SchemaRegistry | None) -> None:
    assert isinstance(r, ClassIndication)
    if r.dialect == "AM2":
        if r.class_kind not in (KIND_TABLE, KIND_EVENT):
            raise EncodeError(f"AM2 class indication needs class_kind 1 or 2, got {r.class_kind}")
        out.append(r.class_kind)
    write_str8(out, r.package)
    write_str8(out, r.class_name)
    _put_hash(out, r.schema_hash)


def _dec_S(buf: bytes, off: int, seq: int, ctx: Ctx) -> tuple[Record, int]:
    package, name, h, off = _class_key(buf, off)
    return SchemaRequest(
        dialect=ctx.dialect, opcode="S", seq=seq, package=package, class_name=name, schema_hash=h
    ), off


def _enc_S(out: bytearray, r: Record, reg: SchemaRegistry | None) -> None:
    assert isinstance(r, SchemaRequest)
    write_str8(out, r.package)
    write_str8(out, r.class_name)
    _put_hash(out, r.schema_hash)


def _dec_h(buf: bytes, off: int, seq: int, ctx: Ctx) -> tuple[Record, int]:
    (ts,) = read_struct(U64, buf, off, "heartbeat timestamp")
    return Heartbeat(
        dialect=ctx.dialect, opcode="h", seq=seq, timestamp_ns=ts, agent=ctx.agent
    ), off + 8


def _enc_h(out: bytearray, r: Record, reg: SchemaRegistry | None) -> None:
    assert isinstance(r, Heartbeat)
    _pack(out, U64, r.timestamp_ns, "heartbeat timestamp")


def _dec_G(buf: bytes, off: int, seq: int, ctx: Ctx) -> tuple[Record, int]:
    query, off = decode_map(buf, off)
    return GetQuery(dialect=ctx.dialect, opcode="G", seq=seq, query=query), off


def _enc_G(out: bytearray, r: Record, reg: SchemaRegistry | None) -> None:
    assert isinstance(r, GetQuery)
    encode_map(out, r.query)


def _dec_M(buf: bytes, off: int, seq: int, ctx: Ctx) -> tuple[Record, int]:
    oid: Any
    if ctx.dialect == "AM2":
        a, b = read_struct(struct.Struct(">QQ"), buf, off, "object id")
        oid = Am2ObjectId.from_ints(a, b)
        off += 16
        package, cname, h, off = _class_key(buf, off)
        method, off = read_str8(buf, off, "method name")
        schema = ctx.registry.get(SchemaKey(package, cname, h))
        plan = _args_plan(ctx.dialect, schema, method, "I", ctx.registry) if schema else None
        if plan is not None:
            start = off
            args, off = plan.decode(buf, off)
            return MethodRequest(
                dialect="AM2",
                opcode="M",
                seq=seq,
                object_id=oid,
                method_name=method,
                package=package,
                class_name=cname,
                schema_hash=h,
                arguments=args,
                raw_arguments=buf[start:off],
            ), off
        return MethodRequest(
            dialect="AM2",
            opcode="M",
            seq=seq,
            object_id=oid,
            method_name=method,
            package=package,
            class_name=cname,
            schema_hash=h,
            raw_arguments=buf[off:],
        ), len(buf)
    # AM1 (spec figure "Method Request"): objectId u64, methodName str8, arguments
    (raw,) = read_struct(U64, buf, off, "object id")
    _reserved_id(raw, off, "object id", ctx)
    method, off = read_str8(buf, off + 8, "method name")
    return MethodRequest(
        dialect="AM1",
        opcode="M",
        seq=seq,
        object_id=Am1ObjectId.from_int(raw),
        method_name=method,
        raw_arguments=buf[off:],
    ), len(buf)


def _encode_typed_arguments(
    out: bytearray,
    r: MethodRequest | MethodResponse,
    reg: SchemaRegistry | None,
    direction: str,
) -> None:
    """Arguments from their typed view (no raw bytes given): needs the class key and method."""
    if r.package is None or r.class_name is None or r.schema_hash is None or not r.method_name:
        raise EncodeError("typed method arguments need package, class_name, schema_hash, method")
    schema = _need_schema(reg, r.package, r.class_name, r.schema_hash)
    plan = _args_plan(r.dialect, schema, r.method_name, direction, reg)  # type: ignore[arg-type]
    if plan is None:
        raise EncodeError(f"no method {r.method_name!r} in {schema.key}")
    plan.encode(out, r.arguments or {})


def _enc_M(out: bytearray, r: Record, reg: SchemaRegistry | None) -> None:
    assert isinstance(r, MethodRequest)
    oid = r.object_id
    if r.dialect == "AM2":
        if not isinstance(oid, Am2ObjectId):
            raise EncodeError("AM2 method request needs an Am2ObjectId")
        try:
            out += struct.pack(">QQ", oid.first(), oid.object_num)
        except struct.error as exc:
            raise EncodeError(f"object id out of range: {oid}") from exc
        if r.package is None or r.class_name is None or r.schema_hash is None:
            raise EncodeError("AM2 method request needs package, class_name and schema_hash")
        write_str8(out, r.package)
        write_str8(out, r.class_name)
        _put_hash(out, r.schema_hash)
    else:
        if not isinstance(oid, Am1ObjectId):
            raise EncodeError("AM1 method request needs an Am1ObjectId")
        _pack(out, U64, oid.to_int(), "object id")
    write_str8(out, r.method_name, "method name")
    # the raw bytes are the wire's; typed arguments are encoded only when there are none
    if r.raw_arguments or not r.arguments:
        out += r.raw_arguments
    else:
        _encode_typed_arguments(out, r, reg, "I")


def _dec_m(buf: bytes, off: int, seq: int, ctx: Ctx) -> tuple[Record, int]:
    (status,) = read_struct(U32, buf, off, "method status")
    off += 4
    if ctx.dialect == "AM1":
        # spec figure "Method Response": status code, status text (str8), then the output
        # and bidirectional arguments, "only included if the status code was 0"
        text, p = read_text8(buf, off, "status text")
        if status != 0:
            return MethodResponse(dialect="AM1", opcode="m", seq=seq, status=status, text=text), p
        return MethodResponse(
            dialect="AM1", opcode="m", seq=seq, status=status, text=text, raw_arguments=buf[p:]
        ), len(buf)
    # AM2 (qpidd): the text is str16, except qpidd's quirk of a str8 for an unknown method
    quirk = False
    try:
        text, p = read_text16(buf, off, "status text")
    except Truncated:
        if status == 0:
            raise
        text, p = read_text8(buf, off, "status text")
        quirk = True
    return MethodResponse(
        dialect=ctx.dialect,
        opcode="m",
        seq=seq,
        status=status,
        text=text,
        text_str8=quirk,
        raw_arguments=buf[p:],
    ), len(buf)


def _enc_m(out: bytearray, r: Record, reg: SchemaRegistry | None) -> None:
    assert isinstance(r, MethodResponse)
    _pack(out, U32, r.status, "method status")
    if r.dialect == "AM1":
        if r.text_str8:
            raise EncodeError("text_str8 is AM2's quirk: AM1's status text is always str8")
        write_str8(out, r.text, "status text")
        if r.status != 0:
            if r.raw_arguments or r.arguments:
                raise EncodeError("AM1 output arguments are only included with status 0")
            return
    elif r.text_str8:
        write_str8(out, r.text, "status text")
    else:
        write_str16(out, r.text, "status text")
    if r.raw_arguments or not r.arguments:
        out += r.raw_arguments
    else:
        _encode_typed_arguments(out, r, reg, "O")


def _dec_A(buf: bytes, off: int, seq: int, ctx: Ctx) -> tuple[Record, int]:
    label, off = read_str8(buf, off, "label")
    sysid, off = _dec_uuid(buf, off)
    agent_bank: int | None = None
    if ctx.dialect == "AM2":
        bank, agent_bank = read_struct(U32X2, buf, off, "requested banks")
        off += 8
    else:
        (bank,) = read_struct(U32, buf, off, "requested bank")
        off += 4
    return AttachRequest(
        dialect=ctx.dialect,
        opcode="A",
        seq=seq,
        label=label,
        system_id=sysid,
        requested_bank=bank,
        requested_agent_bank=agent_bank,
    ), off


def _enc_A(out: bytearray, r: Record, reg: SchemaRegistry | None) -> None:
    assert isinstance(r, AttachRequest)
    write_str8(out, r.label, "label")
    _enc_uuid(out, r.system_id)
    if r.dialect == "AM2":
        if r.requested_agent_bank is None:
            raise EncodeError("AM2 attach request needs requested_agent_bank")
        try:
            out += U32X2.pack(r.requested_bank, r.requested_agent_bank)
        except struct.error as exc:
            raise EncodeError(f"banks out of range: {exc}") from exc
    else:
        _pack(out, U32, r.requested_bank, "requested bank")


def _dec_a(buf: bytes, off: int, seq: int, ctx: Ctx) -> tuple[Record, int]:
    bb, ab = read_struct(U32X2, buf, off, "assigned banks")
    return AttachResponse(
        dialect=ctx.dialect, opcode="a", seq=seq, broker_bank=bb, agent_bank=ab
    ), off + 8


def _enc_a(out: bytearray, r: Record, reg: SchemaRegistry | None) -> None:
    assert isinstance(r, AttachResponse)
    try:
        out += U32X2.pack(r.broker_bank, r.agent_bank)
    except struct.error as exc:
        raise EncodeError(f"banks out of range: {exc}") from exc


OpDecoder = Callable[[bytes, int, int, Ctx], tuple[Record, int]]
OpEncoder = Callable[[bytearray, Record, SchemaRegistry | None], None]


def _content(op: str) -> OpDecoder:
    def dec(buf: bytes, off: int, seq: int, ctx: Ctx) -> tuple[Record, int]:
        return _dec_content(buf, off, seq, ctx, op)

    return dec


# Opcode byte -> body decoder / encoder (both dialects; bodies branch on ctx.dialect).
OPCODE_DECODERS: dict[int, OpDecoder] = {
    ord("B"): _dec_B,
    ord("b"): _dec_b,
    ord("z"): _dec_z,
    ord("Q"): _dec_Q,
    ord("q"): _dec_q,
    ord("S"): _dec_S,
    ord("s"): _dec_schema,
    ord("h"): _dec_h,
    ord("c"): _content("c"),
    ord("i"): _content("i"),
    ord("g"): _content("g"),
    ord("G"): _dec_G,
    ord("M"): _dec_M,
    ord("m"): _dec_m,
    ord("P"): _dec_P,
    ord("p"): _dec_p,
    ord("A"): _dec_A,
    ord("a"): _dec_a,
    ord("x"): _dec_x,
    ord("e"): _dec_event,
}
OPCODE_ENCODERS: dict[str, OpEncoder] = {
    "B": _enc_nothing,
    "b": _enc_b,
    "z": _enc_z,
    "Q": _enc_Q,
    "q": _enc_q,
    "S": _enc_S,
    "s": _enc_schema,
    "h": _enc_h,
    "c": _enc_content,
    "i": _enc_content,
    "g": _enc_content,
    "G": _enc_G,
    "M": _enc_M,
    "m": _enc_m,
    "P": _enc_nothing,
    "p": _enc_Q,
    "A": _enc_A,
    "a": _enc_a,
    "x": _enc_nothing,
    "e": _enc_event,
}
OPCODES = "".join(sorted(OPCODE_ENCODERS))


# ------------------------------------------------------------------ message


def decode_v1(
    body: bytes,
    registry: SchemaRegistry,
    *,
    agent: str | None = None,
    methods: MethodContext | None = None,
) -> tuple[list[Record], list[Problem]]:
    """Decode every record of a v1 message; stop at the first bad one, keeping those before it.

    With ``methods`` (a ``MethodContext``), 'M' and 'm' arguments are typed where the
    context knows the object's class / the pending request, and every record is
    shown to the context (objects seen, requests pending). Problems that only flag
    one record (``fatal=False``: reserved bit set, arguments that do not fit) are
    listed in order too; decoding goes on after them.
    """
    buf = bytes(body)
    n = len(buf)
    records: list[Record] = []
    problems: list[Problem] = []
    off = 0
    decoders = OPCODE_DECODERS
    ctx = Ctx("AM2", registry, agent)
    notes = ctx.notes
    header = HEADER.unpack_from
    while off < n and len(records) < MAX_RECORDS:
        opcode: str | None = None
        try:
            if off + 8 > n:
                if buf[off : off + 3] not in (b"AM1"[: n - off], b"AM2"[: n - off]):
                    raise BadMagic(off, buf[off : off + 3])
                raise Truncated(off, 8, n - off, "record header")
            magic, op, seq = header(buf, off)
            dialect = MAGIC.get(magic)
            if dialect is None:
                raise BadMagic(off, magic)
            opcode = op.decode("latin-1")
            dec = decoders.get(op[0])
            if dec is None:
                raise UnknownOpcode(off + 3, opcode)
            ctx.dialect = dialect
            rec, off = dec(buf, off + 8, seq, ctx)
            if methods is not None:
                if (
                    type(rec) is MethodRequest or type(rec) is MethodResponse
                ) and rec.arguments is None:
                    rec, off = _type_in_message(rec, buf, off, ctx, methods)
                methods.observe(rec)
            records.append(rec)
            if notes:
                at = len(records) - 1
                problems.extend(Problem.from_error(e, opcode, record=at) for e in notes)
                notes.clear()
        except CodecError as exc:
            notes.clear()
            problems.append(Problem.from_error(exc, opcode))
            break
        except RecursionError:
            notes.clear()
            problems.append(
                Problem(
                    "Malformed", f"malformed data at offset {off}: nesting too deep", off, opcode
                )
            )
            break
    return records, problems


def has_method(schema: ClassSchema, method: str) -> bool:
    """Whether the class schema defines ``method`` (a request may name one it lacks)."""
    return any(m.name == method for m in schema.methods)


def method_arguments(
    dialect: str,
    schema: ClassSchema,
    method: str,
    direction: str,
    registry: SchemaRegistry,
    buf: bytes,
    off: int,
) -> tuple[dict[str, Any], int]:
    """Typed arguments of ``method`` read at ``off``: direction "I" (a request's input and
    bidirectional arguments) or "O" (a response's output and bidirectional ones)."""
    plan = _args_plan(dialect, schema, method, direction, registry)
    if plan is None:
        raise ArgumentMismatch(off, f"{schema.key} has no method {method!r}")
    return plan.decode(buf, off)


def _type_in_message(
    rec: MethodRequest | MethodResponse, buf: bytes, end: int, ctx: Ctx, methods: MethodContext
) -> tuple[Record, int]:
    """Type a raw 'M'/'m' tail with what the context knows; the record then ends where its
    arguments do. Arguments that do not fit stay raw (a non-fatal ArgumentMismatch)."""
    target = methods.target_of(rec)
    if target is None:
        return rec, end
    key, method = target
    schema = ctx.registry.get(key)
    if schema is None or not has_method(schema, method):
        # a method its class lacks is data (the agent answers STATUS_UNKNOWN_METHOD):
        # kept with its raw arguments, untyped, no problem
        return rec, end
    at = end - len(rec.raw_arguments)
    direction = "I" if type(rec) is MethodRequest else "O"
    try:
        args, p = method_arguments(ctx.dialect, schema, method, direction, ctx.registry, buf, at)
    except CodecError as exc:
        ctx.notes.append(ArgumentMismatch(at, f"{method} of {key}: {exc.reason}"))
        return rec, end
    if p != len(buf) and buf[p : p + 3] not in (b"AM1", b"AM2"):
        ctx.notes.append(
            ArgumentMismatch(at, f"{method} of {key}: {len(buf) - p} bytes left after them")
        )
        return rec, end
    if ctx.dialect == "AM1":
        _reserved_refs(args, at, ctx)
    typed = methods.typed(rec, args, buf[at:p])
    return typed, p


def encode_record(record: Record, registry: SchemaRegistry | None = None) -> bytes:
    """One v1 record, header included. Content/events/typed method args need the registry."""
    out = bytearray()
    encode_record_into(out, record, registry)
    return bytes(out)


def encode_record_into(
    out: bytearray, record: Record, registry: SchemaRegistry | None = None
) -> None:
    magic = MAGIC_OF.get(record.dialect)
    if magic is None:
        raise EncodeError(f"not a v1 dialect: {record.dialect!r}")
    enc = OPCODE_ENCODERS.get(record.opcode)
    if enc is None:
        raise EncodeError(f"unknown v1 opcode {record.opcode!r}")
    try:
        out += HEADER.pack(magic, record.opcode.encode("latin-1"), record.seq)
    except struct.error as exc:
        raise EncodeError(f"seq out of range: {record.seq!r}") from exc
    enc(out, record, registry)


def encode_records(records: Iterable[Record], registry: SchemaRegistry | None = None) -> bytes:
    """Several v1 records concatenated into one message body (as qpidd batches them)."""
    out = bytearray()
    for r in records:
        encode_record_into(out, r, registry)
    return bytes(out)
