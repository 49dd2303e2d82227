"""Hypothesis strategies: AMQP 0-10 values, QMF values by type code, schemas and records of every kind."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import strategies as st

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
    QmfException,
    Record,
    SchemaRequest,
    V2Message,
)
from pipeline.codec.schema import (
    KIND_EVENT,
    ClassSchema,
    Element,
    Method,
    SchemaKey,
    SchemaRegistry,
)
from pipeline.codec.types import (
    Am1ObjectId,
    Am2ObjectId,
    QmfValue,
    TypedArray,
    TypedList,
    TypedMap,
    V2ObjectId,
)
from pipeline.codec.v1 import encode_record

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
texts = st.text(max_size=30)
hashes = st.binary(min_size=16, max_size=16)
uuids = st.uuids()
u8s = st.integers(0, 0xFF)
u16s = st.integers(0, 0xFFFF)
u32s = st.integers(0, 0xFFFFFFFF)
u64s = st.integers(0, (1 << 64) - 1)
i64s = st.integers(-(1 << 63), (1 << 63) - 1)
seqs = u32s

# (0-10 code, value strategy) for leaves whose decoded value equals what was encoded
AMQP_LEAVES: list[tuple[int, st.SearchStrategy[Any]]] = [
    (0x01, st.integers(-128, 127)),
    (0x02, u8s),
    (0x08, st.booleans()),
    (0x11, st.integers(-(1 << 15), (1 << 15) - 1)),
    (0x12, u16s),
    (0x21, st.integers(-(1 << 31), (1 << 31) - 1)),
    (0x22, u32s),
    (0x23, st.floats(width=32, allow_nan=False)),
    (0x31, i64s),
    (0x32, u64s),
    (0x33, st.floats(allow_nan=False)),
    (0x38, i64s),
    (0x40, hashes),
    (0x48, uuids),
    (0x85, texts),
    (0x90, texts),
    (0x95, texts),
    (0xA0, texts),
    (0xF0, st.none()),
]


def _leaf() -> st.SearchStrategy[tuple[int, Any]]:
    return st.one_of([st.tuples(st.just(c), s) for c, s in AMQP_LEAVES])


def _containers(children: st.SearchStrategy[tuple[int, Any]]) -> st.SearchStrategy[tuple[int, Any]]:
    maps = st.dictionaries(names, children, max_size=4).map(
        lambda d: (
            0xA8,
            TypedMap([(k, v) for k, (_, v) in d.items()], {k: c for k, (c, _) in d.items()}),
        )
    )
    lists = st.lists(children, max_size=4).map(
        lambda xs: (0xA9, TypedList([v for _, v in xs], [c for c, _ in xs]))
    )
    arrays = st.sampled_from([(0x02, u8s), (0x22, u32s), (0x90, texts)]).flatmap(
        lambda cs: st.lists(cs[1], max_size=4).map(lambda xs: (0xAA, TypedArray(xs, cs[0])))
    )
    return st.one_of(maps, lists, arrays)


amqp_values: st.SearchStrategy[tuple[int, Any]] = st.recursive(_leaf(), _containers, max_leaves=8)


def typed_maps() -> st.SearchStrategy[TypedMap]:
    return st.dictionaries(names, amqp_values, max_size=5).map(
        lambda d: TypedMap([(k, v) for k, (_, v) in d.items()], {k: c for k, (c, _) in d.items()})
    )


def am1_ids() -> st.SearchStrategy[Am1ObjectId]:
    """Valid AM1 ids: bit 63 is reserved, must be zero (a set bit is a decode problem,
    tested on its own in test_am1_vectors.py)."""
    return st.builds(
        Am1ObjectId,
        st.integers(0, 0x7FFF),
        st.integers(0, 0xFFFFFF),
        st.integers(0, 0xFFFFFF),
    )


def am2_ids() -> st.SearchStrategy[Am2ObjectId]:
    return st.builds(
        Am2ObjectId,
        st.integers(0, 15),
        st.integers(0, 0xFFF),
        st.integers(0, 0xFFFFF),
        st.integers(0, 0xFFFFFFF),
        u64s,
    )


def qmf_value(code: int, dialect: str) -> st.SearchStrategy[Any]:
    """Values of a QMF type code (1..22, no 5)."""
    table: dict[int, st.SearchStrategy[Any]] = {
        1: u8s,
        2: u16s,
        3: u32s,
        4: u64s,
        6: texts,
        7: texts,
        8: i64s if dialect == "AM2" else u64s,
        9: u64s,
        10: am2_ids() if dialect == "AM2" else am1_ids(),
        11: st.booleans(),
        12: st.floats(width=32, allow_nan=False),
        13: st.floats(allow_nan=False),
        14: uuids,
        15: typed_maps(),
        16: st.integers(-128, 127),
        17: st.integers(-(1 << 15), (1 << 15) - 1),
        18: st.integers(-(1 << 31), (1 << 31) - 1),
        19: i64s,
        20: st.tuples(st.sampled_from([1, 3, 6, 11]), st.integers(0, 1)).flatmap(
            lambda t: (st.booleans() if t[0] == 11 else texts if t[0] == 6 else u8s).map(
                lambda v, c=t[0]: QmfValue(c, v)
            )
        ),
        21: st.lists(amqp_values, max_size=3).map(
            lambda xs: TypedList([v for _, v in xs], [c for c, _ in xs])
        ),
        22: st.lists(u32s, max_size=3).map(lambda xs: TypedArray(xs, 0x22)),
    }
    return table[code]


QMF_CODES = [c for c in range(1, 23) if c != 5]


@st.composite
def class_schemas(draw: st.DrawFn, dialect: str, event: bool = False) -> ClassSchema:
    n = draw(st.integers(1 if event else 0, 8))
    elem_names = draw(st.lists(names, min_size=n, max_size=n, unique=True))
    codes = [draw(st.sampled_from(QMF_CODES)) for _ in elem_names]
    key = SchemaKey(draw(names), draw(names), draw(hashes))
    extra = st.sampled_from([{}, {"unit": "msg"}, {"desc": "why"}])
    if event:
        return ClassSchema(
            key=key,
            kind=KIND_EVENT,
            arguments=tuple(
                Element(nm, c, extra=draw(extra)) for nm, c in zip(elem_names, codes, strict=True)
            ),
        )
    k = draw(st.integers(0, n))
    props = tuple(
        Element(
            nm,
            c,
            access=draw(st.integers(1, 3)),
            index=draw(st.booleans()),
            optional=draw(st.booleans()),
            extra=draw(extra),
        )
        for nm, c in zip(elem_names[:k], codes[:k], strict=True)
    )
    stats = tuple(
        Element(nm, c, extra=draw(extra)) for nm, c in zip(elem_names[k:], codes[k:], strict=True)
    )
    dirs: list[Any] = ["I", "O", "IO"] if dialect == "AM2" else [1, 2, 3]
    methods = tuple(
        Method(
            mname,
            tuple(
                Element(
                    f"a{i}",
                    draw(st.sampled_from([3, 6, 7, 19])),
                    extra={"dir": draw(st.sampled_from(dirs))},
                )
                for i in range(draw(st.integers(0, 3)))
            ),
        )
        for mname in draw(st.lists(names, max_size=2, unique=True))
    )
    return ClassSchema(key=key, properties=props, statistics=stats, methods=methods)


@st.composite
def object_samples(draw: st.DrawFn, dialect: str) -> tuple[ClassSchema, ObjectSample]:
    schema = draw(class_schemas(dialect))
    opcode = draw(st.sampled_from("cig"))
    values: dict[str, Any] = {}
    if opcode in "cg":
        for p in schema.properties:
            if not p.optional or draw(st.booleans()):
                values[p.name] = draw(qmf_value(p.type_code, dialect))
    if opcode in "ig":
        for s in schema.statistics:
            values[s.name] = draw(qmf_value(s.type_code, dialect))
    oid = draw(am2_ids() if dialect == "AM2" else am1_ids())
    agent = f"{oid.broker_bank}.{oid.agent_bank}" if isinstance(oid, Am2ObjectId) else None
    rec = ObjectSample(
        dialect=dialect,
        opcode=opcode,
        seq=draw(seqs),
        package=schema.key.package,
        class_name=schema.key.name,
        schema_hash=schema.key.hash,
        update_ns=draw(u64s),
        create_ns=draw(u64s),
        delete_ns=draw(u64s),
        object_id=oid,
        values=values,
        agent=agent,
    )
    return schema, rec


@st.composite
def events(draw: st.DrawFn, dialect: str) -> tuple[ClassSchema, Event]:
    schema = draw(class_schemas(dialect, event=True))
    args = {a.name: draw(qmf_value(a.type_code, dialect)) for a in schema.arguments}
    rec = Event(
        dialect=dialect,
        opcode="e",
        seq=draw(seqs),
        package=schema.key.package,
        event_name=schema.key.name,
        schema_hash=schema.key.hash,
        timestamp_ns=draw(u64s),
        severity=draw(u8s),
        arguments=args,
    )
    return schema, rec


@st.composite
def method_requests(draw: st.DrawFn, dialect: str) -> tuple[ClassSchema | None, MethodRequest]:
    if dialect == "AM1":
        return None, MethodRequest(
            dialect="AM1",
            opcode="M",
            seq=draw(seqs),
            object_id=draw(am1_ids()),
            method_name=draw(names),
            raw_arguments=draw(st.binary(max_size=20)),
        )
    schema = draw(class_schemas("AM2"))
    oid = draw(am2_ids())
    if schema.methods and draw(st.booleans()):
        m = schema.methods[0]
        args = {
            a.name: draw(qmf_value(a.type_code, "AM2"))
            for a in m.arguments
            if "I" in a.extra["dir"]
        }
        typed = MethodRequest(
            dialect="AM2",
            opcode="M",
            seq=draw(seqs),
            object_id=oid,
            method_name=m.name,
            package=schema.key.package,
            class_name=schema.key.name,
            schema_hash=schema.key.hash,
            arguments=args,
        )
        # decoding keeps the argument bytes as on the wire beside the typed view
        reg = SchemaRegistry([schema])
        head = len(encode_record(replace(typed, arguments=None), reg))
        raw = encode_record(typed, reg)[head:]
        return schema, replace(typed, raw_arguments=raw)
    # class not in the registry: the arguments stay raw bytes
    return None, MethodRequest(
        dialect="AM2",
        opcode="M",
        seq=draw(seqs),
        object_id=oid,
        method_name=draw(names),
        package=schema.key.package,
        class_name=schema.key.name,
        schema_hash=schema.key.hash,
        raw_arguments=draw(st.binary(max_size=20)),
    )


def simple_v1_records(dialect: str) -> st.SearchStrategy[Record]:
    """v1 records that need no schema."""
    d = st.just(dialect)
    kind = st.just(None) if dialect == "AM1" else st.sampled_from([1, 2])
    if dialect == "AM1":
        # spec: text str8 always; output arguments only with status 0
        quirk = st.builds(
            MethodResponse,
            dialect=d,
            opcode=st.just("m"),
            seq=seqs,
            status=st.integers(1, 0xFFFFFFFF),
            text=texts,
        )
        m_ok = st.builds(
            MethodResponse,
            dialect=d,
            opcode=st.just("m"),
            seq=seqs,
            status=st.just(0),
            text=texts,
            raw_arguments=st.binary(max_size=20),
        )
    else:
        quirk = st.builds(
            MethodResponse,
            dialect=d,
            opcode=st.just("m"),
            seq=seqs,
            status=st.integers(1, 5),
            text=texts,
            text_str8=st.just(True),
        )
        m_ok = st.builds(
            MethodResponse,
            dialect=d,
            opcode=st.just("m"),
            seq=seqs,
            status=u32s,
            text=texts,
            raw_arguments=st.binary(max_size=20),
        )
    return st.one_of(
        st.builds(BrokerRequest, dialect=d, opcode=st.just("B"), seq=seqs),
        st.builds(BrokerResponse, dialect=d, opcode=st.just("b"), seq=seqs, broker_id=uuids),
        st.builds(CommandComplete, dialect=d, opcode=st.just("z"), seq=seqs, code=u32s, text=texts),
        st.builds(ClassQuery, dialect=d, opcode=st.just("Q"), seq=seqs, package=names),
        st.builds(
            ClassIndication,
            dialect=d,
            opcode=st.just("q"),
            seq=seqs,
            class_kind=kind,
            package=names,
            class_name=names,
            schema_hash=hashes,
        ),
        st.builds(
            SchemaRequest,
            dialect=d,
            opcode=st.just("S"),
            seq=seqs,
            package=names,
            class_name=names,
            schema_hash=hashes,
        ),
        st.builds(Heartbeat, dialect=d, opcode=st.just("h"), seq=seqs, timestamp_ns=u64s),
        st.builds(GetQuery, dialect=d, opcode=st.just("G"), seq=seqs, query=typed_maps()),
        m_ok,
        quirk,
        st.builds(PackageQuery, dialect=d, opcode=st.just("P"), seq=seqs),
        st.builds(PackageIndication, dialect=d, opcode=st.just("p"), seq=seqs, package=names),
        st.builds(
            AttachRequest,
            dialect=d,
            opcode=st.just("A"),
            seq=seqs,
            label=names,
            system_id=uuids,
            requested_bank=u32s,
            requested_agent_bank=st.just(None) if dialect == "AM1" else u32s,
        ),
        st.builds(
            AttachResponse,
            dialect=d,
            opcode=st.just("a"),
            seq=seqs,
            broker_bank=u32s,
            agent_bank=u32s,
        ),
        st.builds(ConsoleAdded, dialect=d, opcode=st.just("x"), seq=seqs),
    )


@st.composite
def v2_records(draw: st.DrawFn) -> list[Record]:
    """The records of one V2 message (same opcode), built from fields (no source)."""
    agent = draw(names)
    which = draw(
        st.sampled_from(
            ["data", "event", "heartbeat", "method", "exception", "schema_id", "locate"]
        )
    )
    n = draw(st.integers(1, 3))
    recs: list[Record] = []
    opcode = draw(st.sampled_from(["_data_indication", "_query_response"]))
    for _ in range(n):
        if which == "data":
            oid = draw(
                st.one_of(
                    st.none(),
                    st.builds(
                        V2ObjectId,
                        names,
                        st.one_of(st.none(), st.just(agent)),
                        st.one_of(st.none(), u16s),
                    ),
                )
            )
            recs.append(
                ObjectSample(
                    dialect="V2",
                    opcode=opcode,
                    package=draw(names),
                    class_name=draw(names),
                    schema_hash=draw(hashes),
                    update_ns=draw(u64s),
                    create_ns=draw(u64s),
                    delete_ns=draw(u64s),
                    object_id=oid,
                    values=draw(typed_maps()),
                    agent=agent,
                )
            )
        elif which == "event":
            recs.append(
                Event(
                    dialect="V2",
                    opcode=opcode,
                    package=draw(names),
                    event_name=draw(names),
                    schema_hash=draw(hashes),
                    timestamp_ns=draw(u64s),
                    severity=draw(u8s),
                    arguments=draw(typed_maps()),
                    agent=agent,
                )
            )
        elif which == "schema_id":
            recs.append(
                ClassIndication(
                    dialect="V2",
                    opcode=opcode,
                    class_kind=draw(st.sampled_from([1, 2])),
                    package=draw(names),
                    class_name=draw(names),
                    schema_hash=draw(hashes),
                )
            )
    if which == "heartbeat":
        ts = draw(u64s)
        attrs = TypedMap(
            [("_name", agent), ("_timestamp", ts)], {"_name": 0x90, "_timestamp": 0x32}
        )
        recs = [
            Heartbeat(
                dialect="V2",
                opcode="_agent_heartbeat_indication",
                timestamp_ns=ts,
                agent=agent,
                attributes=attrs,
            )
        ]
    elif which == "method":
        recs = [
            MethodResponse(
                dialect="V2", opcode="_method_response", status=0, arguments=draw(typed_maps())
            )
        ]
    elif which == "exception":
        code, text = draw(u32s), draw(texts)
        vals = TypedMap(
            [("error_code", code), ("error_text", text)], {"error_code": 0x22, "error_text": 0x90}
        )
        recs = [
            QmfException(
                dialect="V2", opcode="_exception", code=code, text=text, values=vals, agent=agent
            )
        ]
    elif which == "locate":
        recs = [
            V2Message(
                dialect="V2",
                opcode="_agent_locate_response",
                content=None,
                body=draw(typed_maps()),
                agent=agent,
            )
        ]
    return recs
