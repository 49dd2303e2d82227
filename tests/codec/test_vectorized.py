"""Vectorized content decoding equals the per-record codec, table for table.

The oracle is the pure codec run message by message (``decode_message``,
one registry, input order) with its object samples converted by
``records_to_table``; ``decode_content`` must return exactly those tables,
on the real qpidd capture and on generated data, whichever path (kernel or
per-message fallback) each message took.
"""

from __future__ import annotations

import json
import os
import random
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pipeline.codec.capture import CapturedMessage, read_capture
from pipeline.codec.layout import COMPACT_SCHEMA, QUARANTINE_SCHEMA, sample_schema
from pipeline.codec.records import Heartbeat, ObjectSample, Record
from pipeline.codec.schema import ClassSchema, Element, SchemaKey, SchemaRegistry
from pipeline.codec.types import Am1ObjectId, Am2ObjectId, TypedList, TypedMap
from pipeline.codec.v1 import encode_records
from pipeline.codec.vectorized import (
    arrow_mapper,
    decode_content,
    per_record_decode,
    records_to_table,
    wide_to_compact,
)
from tests.codec.strategies import object_samples

# Decode with the kernels the warm-up compiles (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("compiled_decoder")

# ------------------------------------------------------------------ helpers


def batch_of(msgs: Sequence[CapturedMessage]) -> pa.Table:
    """A landing-like Arrow table of captured messages (msg_key m<row>)."""
    return pa.table(
        {
            "msg_key": [f"m{i}" for i in range(len(msgs))],
            "routing_key": [m.routing_key for m in msgs],
            "app_id": [m.app_id for m in msgs],
            "content_type": [m.content_type for m in msgs],
            "application_properties": pa.array(
                [[(str(k), str(v)) for k, v in m.application_properties.items()] for m in msgs],
                pa.map_(pa.string(), pa.string()),
            ),
            "body": pa.array([m.body for m in msgs], pa.binary()),
        }
    )


def bodies_batch(bodies: Sequence[bytes]) -> pa.Table:
    return batch_of([CapturedMessage(body=b) for b in bodies])


def oracle(
    table: pa.Table, registry: SchemaRegistry
) -> tuple[dict[SchemaKey, pa.Table], list[tuple[str, Record]], list[tuple[str, str]]]:
    """The per-record path over the batch: class tables, other records, (msg_key, error)."""
    reg = registry.copy()
    per_class: dict[SchemaKey, list[tuple[str, int, Any]]] = {}
    others: list[tuple[str, Record]] = []
    problems: list[tuple[str, str]] = []
    for row in table.to_pylist():
        meta = dict(row)
        if meta.get("application_properties") is not None:
            meta["application_properties"] = dict(meta["application_properties"])
        recs, probs = per_record_decode(row["body"], reg, meta)
        for i, r in enumerate(recs):
            key = (
                SchemaKey(r.package, r.class_name, r.schema_hash)
                if isinstance(r, ObjectSample)
                else None
            )
            if key is not None and key in reg:
                per_class.setdefault(key, []).append((row["msg_key"], i, r))
            else:
                others.append((row["msg_key"], r))
        problems += [(row["msg_key"], p.error) for p in probs]
    tables = {}
    for k, items in per_class.items():
        schema = reg.get(k)
        assert schema is not None
        tables[k] = records_to_table(items, schema)
    return tables, others, problems


def assert_same(table: pa.Table, registry: SchemaRegistry) -> Any:
    """decode_content(table) == oracle(table); returns the result for further checks."""
    want, want_others, want_problems = oracle(table, registry)
    got = decode_content(table, registry.copy())
    assert set(got.samples) == set(want)
    for k, t in want.items():
        g = got.samples[k]
        assert g.schema == t.schema, k
        if not g.equals(t):  # show the first differing row
            for i, (a, b) in enumerate(zip(g.to_pylist(), t.to_pylist(), strict=True)):
                assert a == b, (k, i)
        assert g.equals(t), k
    assert [(k, type(r).__name__, r) for k, r in got.others] == [
        (k, type(r).__name__, r) for k, r in want_others
    ]
    assert [
        (q["msg_key"], q["reason"].split(":")[0]) for q in got.quarantine.to_pylist()
    ] == want_problems
    # The compact layout (one schema for all classes, typed value lists) holds the
    # same values: the kernel's direct build equals packing the oracle's wide tables.
    creg = registry.copy()
    compact = decode_content(table, creg, compact=True)
    by_class = compact.class_tables()
    assert set(by_class) == set(want)
    for k, t in want.items():
        schema = creg.get(k)
        assert schema is not None
        c = by_class[k]
        assert c.schema == COMPACT_SCHEMA
        expected = wide_to_compact(t, schema)
        if not c.equals(expected):
            for i, (a, b) in enumerate(zip(c.to_pylist(), expected.to_pylist(), strict=True)):
                assert a == b, (k, i)
        assert c.equals(expected), k
    assert compact.quarantine.equals(got.quarantine)
    assert compact.other_index == got.other_index
    return got


# ------------------------------------------------------------------ the real sample


@pytest.fixture(scope="module")
def sample(shared_dir: str) -> list[CapturedMessage]:
    return list(read_capture(os.path.join(shared_dir, "samples", "qpidd-capture-20s.jsonl")))


@pytest.fixture(scope="module")
def sample_registry(sample: list[CapturedMessage]) -> SchemaRegistry:
    """Every schema the capture announces (what the schema registry table would hold)."""
    reg = SchemaRegistry()
    for m in sample:
        m.decode(reg)
    return reg


def test_real_sample_equals_per_record_path(
    sample: list[CapturedMessage], sample_registry: SchemaRegistry
) -> None:
    table = batch_of(sample)
    got = assert_same(table, sample_registry)
    # 200 AM2 messages hold only c/i/g records (summary: c 26, ci 75, g 12, i 87): all on
    # the kernel path; the other 663 (v2, events, heartbeats, schema traffic) fall back.
    assert got.fast_messages == 200
    assert got.fallback_messages == 663
    assert got.fallback_reasons == {"not AM1/AM2": 384, "non-content record": 279}
    assert got.quarantine.num_rows == 0
    am2 = {
        f"{k.package}:{k.name}": sum(1 for d in t.column("dialect").to_pylist() if d == "AM2")
        for k, t in got.samples.items()
    }
    assert {k: v for k, v in am2.items() if v} == {
        "org.apache.qpid.acl:acl": 6,
        "org.apache.qpid.broker:binding": 291,
        "org.apache.qpid.broker:broker": 23,
        "org.apache.qpid.broker:connection": 73,
        "org.apache.qpid.broker:exchange": 113,
        "org.apache.qpid.broker:memory": 19,
        "org.apache.qpid.broker:queue": 177,
        "org.apache.qpid.broker:session": 73,
        "org.apache.qpid.broker:subscription": 149,
        "org.apache.qpid.broker:system": 4,
        "org.apache.qpid.broker:vhost": 4,
    }
    opcodes: dict[str, int] = {}
    deleted = 0
    for t in got.samples.values():
        for d, op, dl in zip(
            t.column("dialect").to_pylist(),
            t.column("opcode").to_pylist(),
            t.column("delete_ns").to_pylist(),
            strict=True,
        ):
            if d == "AM2":
                opcodes[op] = opcodes.get(op, 0) + 1
                deleted += dl != 0
    assert opcodes == {"c": 320, "i": 575, "g": 37}
    assert deleted == 157


def test_record_counts_equal_the_per_record_decoder(
    sample: list[CapturedMessage], shared_dir: str
) -> None:
    """``qmf run``'s closing summary (``RecordCounts``, vectorized, batch by batch)
    counts what ``decode_message`` per message counts: every record by opcode, and
    one problem per undecodable message."""
    from pipeline.codec.message import decode_message
    from pipeline.codec.seed import seeded_registry
    from pipeline.codec.summary import RecordCounts

    garbage = CapturedMessage(body=b"AM2z\x00\x00\x00\x07garbage")
    msgs = [*sample, garbage]
    table = batch_of(msgs)
    counts = RecordCounts(seeded_registry())
    for a in range(0, len(msgs), 150):  # schemas of one batch serve the next
        counts.add(table.slice(a, 150))
    reg = seeded_registry()
    want: dict[str, int] = {}
    problems = 0
    for m in msgs:
        res = decode_message(
            m.body, registry=reg, application_properties=m.application_properties,
            content_type=m.content_type, app_id=m.app_id, routing_key=m.routing_key,
        )  # fmt: skip
        problems += len(res.problems)
        for r in res.records:
            want[r.opcode] = want.get(r.opcode, 0) + 1
    assert counts.messages == len(msgs) == 864
    assert counts.records_by_opcode() == dict(sorted(want.items()))
    assert problems == 1
    assert counts.problems == 1
    with open(os.path.join(shared_dir, "samples", "qpidd-capture-20s.summary.json")) as fh:
        v1 = json.load(fh)["v1_records_by_opcode"]
    assert {k: v for k, v in counts.records_by_opcode().items() if k in v1} == v1


def test_real_sample_queue_row(
    sample: list[CapturedMessage], sample_registry: SchemaRegistry
) -> None:
    """One decoded queue statistics row, value by value, from the kernel path."""
    content = [m for m in sample if m.body[:3] == b"AM2" and m.body[3:4] == b"i"]
    got = decode_content(batch_of(content), sample_registry.copy())
    assert got.fallback_messages == 0
    key = next(k for k in got.samples if k.name == "queue")
    t = got.samples[key]
    assert t.schema == sample_schema(sample_registry.get(key))  # type: ignore[arg-type]
    rows = [r for r in t.to_pylist() if r["opcode"] == "i"]
    assert len(rows) > 0
    r = rows[0]
    assert (r["dialect"], r["package"], r["class_name"]) == (
        "AM2",
        "org.apache.qpid.broker",
        "queue",
    )
    assert r["name"] is None and r["durable"] is None  # 'i' carries statistics only
    assert isinstance(r["msgDepth"], int) and r["msgDepth"] >= 0
    assert r["agent"] == f"{r['broker_bank']}.{r['agent_bank']}"
    assert r["boot_seq"] is None and r["bank"] is None  # AM1-only id parts


# ------------------------------------------------------------------ generated data

ALL_TYPES = [1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 21]
WIDE = ClassSchema(
    key=SchemaKey("org.example", "wide", bytes(range(16))),
    properties=(
        *(Element(f"p{t}", t, access=3) for t in ALL_TYPES),
        *(Element(f"o{t}", t, access=3, optional=True) for t in (3, 6, 10, 15)),
        Element("o_more", 4, access=3, optional=True),
    ),
    statistics=tuple(Element(f"s{t}", t) for t in ALL_TYPES),
)


def value_for(t: int, rnd: random.Random, dialect: str) -> Any:
    """A random value of QMF type t, extremes included."""
    bits = {1: 8, 2: 16, 3: 32, 4: 64, 9: 64}
    if t in bits:
        return rnd.choice([0, (1 << bits[t]) - 1, rnd.getrandbits(bits[t])])
    signed = {16: 8, 17: 16, 18: 32, 19: 64}
    if t in signed or (t == 8 and dialect == "AM2"):
        b = signed.get(t, 64)
        return rnd.choice(
            [-(1 << (b - 1)), (1 << (b - 1)) - 1, rnd.getrandbits(b) - (1 << (b - 1))]
        )
    if t == 8:
        return rnd.getrandbits(64)
    if t in (6, 7):
        return rnd.choice(["", "q-1", "ünïcode ✓", "x" * (300 if t == 7 else 255)])
    if t == 10:
        if dialect == "AM2":
            return Am2ObjectId(
                rnd.randrange(16),
                rnd.randrange(4096),
                rnd.randrange(1 << 20),
                rnd.randrange(1 << 28),
                rnd.getrandbits(64),
            )
        return Am1ObjectId(rnd.randrange(1 << 15), rnd.randrange(1 << 24), rnd.randrange(1 << 24))
    if t == 11:
        return rnd.random() < 0.5
    if t in (12, 13):
        return rnd.choice([0.0, -1.5, 3.25e10, rnd.uniform(-1e6, 1e6)])
    if t == 14:
        return uuid.UUID(int=rnd.getrandbits(128))
    if t == 15:
        return rnd.choice([TypedMap(), TypedMap([("k", "v"), ("n", 7)], {"k": 0x95, "n": 0x21})])
    if t == 21:
        return rnd.choice([TypedList(), TypedList([1, "a"], [0x21, 0x95])])
    raise AssertionError(t)


def wide_records(rnd: random.Random, n_msgs: int) -> Iterator[bytes]:
    for m in range(n_msgs):
        dialect = "AM2" if m % 3 else "AM1"
        recs = []
        for _ in range(rnd.randint(1, 6)):
            op = rnd.choice("cig")
            values: dict[str, Any] = {}
            if op in "cg":
                for e in WIDE.properties:
                    if not e.optional or rnd.random() < 0.5:
                        values[e.name] = value_for(e.type_code, rnd, dialect)
            if op in "ig":
                for e in WIDE.statistics:
                    values[e.name] = value_for(e.type_code, rnd, dialect)
            oid: Any = value_for(10, rnd, dialect)
            recs.append(
                ObjectSample(
                    dialect=dialect, opcode=op, seq=rnd.getrandbits(32),
                    package=WIDE.key.package, class_name=WIDE.key.name, schema_hash=WIDE.key.hash,
                    update_ns=rnd.getrandbits(64), create_ns=rnd.getrandbits(63), delete_ns=0,
                    object_id=oid, values=values,
                )
            )  # fmt: skip
        yield encode_records(recs, SchemaRegistry([WIDE]))


def test_every_type_both_dialects_on_the_kernel_path() -> None:
    reg = SchemaRegistry([WIDE])
    bodies = list(wide_records(random.Random(7), 60))
    got = assert_same(bodies_batch(bodies), reg)
    assert got.fallback_messages == 0 and got.fast_messages == 60
    t = got.samples[WIDE.key]
    # uint64 keeps its bit pattern in int64; optional properties absent -> null
    rows = t.to_pylist()
    assert any(r["p4"] == -1 for r in rows if r["p4"] is not None)
    assert any(r["o6"] is None for r in rows if r["opcode"] != "i")
    assert all(r["p1"] is None for r in rows if r["opcode"] == "i")
    assert {r["p15"] for r in rows if r["p15"] is not None} == {"{}", '{"k":"v","n":7}'}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.lists(object_samples("AM2") | object_samples("AM1"), min_size=1, max_size=4),
        min_size=1,
        max_size=4,
    )
)
def test_generated_classes_equal_per_record_path(
    msgs: list[list[tuple[ClassSchema, ObjectSample]]],
) -> None:
    """Random schemas (every type code, type 20 included) and records, packed into messages."""
    drawn = [schema for recs in msgs for schema, _ in recs]
    reg = SchemaRegistry(drawn)
    clash = any(s != reg.get(s.key) for s in drawn)
    names = [
        n for s in reg for n in (*(e.name for e in s.properties), *(e.name for e in s.statistics))
    ]
    # two different drawn classes with one key, or a name that could clash with a renamed column
    assume(not clash and not any(n.endswith("_value") for n in names))
    bodies = [encode_records([r for _, r in recs], reg) for recs in msgs]
    assert_same(bodies_batch(bodies), reg)


# ------------------------------------------------------------------ fallback per message


def queue_like() -> ClassSchema:
    return ClassSchema(
        key=SchemaKey("org.apache.qpid.broker", "queue", b"\x11" * 16),
        properties=(Element("name", 6, access=1), Element("durable", 11, access=1)),
        statistics=(Element("msgDepth", 4), Element("flowStopped", 11)),
    )


def sample_rec(op: str, i: int, schema: ClassSchema) -> ObjectSample:
    values: dict[str, Any] = {}
    if op in "cg":
        values |= {"name": f"q{i}", "durable": bool(i % 2)}
    if op in "ig":
        values |= {"msgDepth": i, "flowStopped": False}
    return ObjectSample(
        dialect="AM2", opcode=op, seq=i, package=schema.key.package, class_name=schema.key.name,
        schema_hash=schema.key.hash, update_ns=1000 + i, create_ns=10, delete_ns=0,
        object_id=Am2ObjectId(0, 1, 1, 0, i), values=values, agent="1.0",
    )  # fmt: skip


def test_fallback_is_per_message_and_keeps_good_records() -> None:
    q = queue_like()
    reg = SchemaRegistry([q])
    good = encode_records([sample_rec("c", 1, q), sample_rec("i", 1, q)], reg)
    with_heartbeat = encode_records(
        [sample_rec("i", 2, q), Heartbeat(dialect="AM2", opcode="h", timestamp_ns=5)], reg
    )
    truncated = encode_records([sample_rec("i", 3, q), sample_rec("i", 4, q)], reg)[:-3]
    unknown = SchemaKey("org.example", "nope", b"\x22" * 16)
    other = ClassSchema(key=unknown, statistics=(Element("x", 4),))
    missing = encode_records(
        [sample_rec("i", 5, q), ObjectSample(
            dialect="AM2", opcode="i", seq=0, package="org.example", class_name="nope",
            schema_hash=unknown.hash, update_ns=0, create_ns=0, delete_ns=0,
            object_id=Am2ObjectId(0, 1, 1, 0, 9), values={"x": 1},
        )], SchemaRegistry([q, other]),
    )  # fmt: skip
    bad_bool = bytearray(encode_records([sample_rec("i", 6, q)], reg))
    bad_bool[-1] = 2  # flowStopped octet 2: the codec rejects it
    table = bodies_batch([good, with_heartbeat, truncated, missing, bytes(bad_bool), b"garbage!"])
    got = assert_same(table, reg)
    assert got.fast_messages == 1
    assert got.fallback_reasons == {
        "non-content record": 1,
        "truncated": 1,
        "unknown schema": 1,
        "malformed value": 1,
        "not AM1/AM2": 1,
    }
    t = got.samples[q.key]
    # good records of the bad messages are kept: m0 (2), m1 (1), m2 (1 of 2), m3 (1 of 2)
    assert list(
        zip(t.column("msg_key").to_pylist(), t.column("msgDepth").to_pylist(), strict=True)
    ) == [("m0", None), ("m0", 1), ("m1", 2), ("m2", 3), ("m3", 5)]
    assert [(k, type(r).__name__) for k, r in got.others] == [("m1", "Heartbeat")]
    q_rows = got.quarantine.to_pylist()
    assert [(r["msg_key"], r["reason"].split(":")[0]) for r in q_rows] == [
        ("m2", "Truncated"),
        ("m3", "MissingSchema"),
        ("m4", "Malformed"),
        ("m5", "BadMagic"),
    ]
    assert q_rows[0]["body"] == truncated
    assert got.quarantine.schema == QUARANTINE_SCHEMA


def test_schema_response_earlier_in_the_batch_is_used() -> None:
    """Content of a class announced in the same batch decodes as the per-record path would."""
    from pipeline.codec.v1 import schema_response_for

    q = queue_like()
    announce = encode_records([schema_response_for(q, "AM2")], SchemaRegistry())
    content = encode_records([sample_rec("g", 1, q)], SchemaRegistry([q]))
    got = assert_same(bodies_batch([content, announce, content]), SchemaRegistry())
    t = got.samples[q.key]
    assert t.column("msg_key").to_pylist() == ["m2"]
    assert got.quarantine.column("reason").to_pylist()[0].startswith("MissingSchema")
    # the content after its schema was decoded by the kernel, not per record
    assert (got.fast_messages, got.fallback_messages) == (1, 2)


def test_schemas_met_in_the_batch_keep_later_content_on_the_kernel() -> None:
    """A batch that brings two classes' schemas amid their content (a console that starts
    with its agents) is cut after each schema that later content lacks: content after
    its schema takes the kernel, content before it stays unknown, as per record; each
    per-record message is decoded once."""
    from pipeline.codec.v1 import schema_response_for

    q = queue_like()
    other = ClassSchema(
        key=SchemaKey("org.example", "widget", b"\x33" * 16), statistics=(Element("x", 4),)
    )
    both = SchemaRegistry([q, other])

    def widget(i: int) -> bytes:
        rec = ObjectSample(
            dialect="AM2", opcode="i", seq=i, package="org.example", class_name="widget",
            schema_hash=other.key.hash, update_ns=2000 + i, create_ns=0, delete_ns=0,
            object_id=Am2ObjectId(0, 1, 1, 0, 100 + i), values={"x": i},
        )  # fmt: skip
        return encode_records([rec], both)

    def queue(i: int) -> bytes:
        return encode_records([sample_rec("g", i, q)], both)

    def announce(s: ClassSchema) -> bytes:
        return encode_records([schema_response_for(s, "AM2")], SchemaRegistry())

    beat = encode_records([Heartbeat(dialect="AM2", opcode="h", timestamp_ns=5)], both)
    bodies = [
        queue(0), widget(0), announce(q), beat, queue(1), widget(1),  # m0-m5
        announce(other), queue(2), widget(2), beat, announce(q), queue(3),  # m6-m11
    ]  # fmt: skip
    calls: list[bytes] = []

    def counted(body: bytes, registry: SchemaRegistry, meta: Any) -> Any:
        calls.append(body)
        return per_record_decode(body, registry, meta)

    table = bodies_batch(bodies)
    got = assert_same(table, SchemaRegistry())
    assert got.samples[q.key].column("msg_key").to_pylist() == ["m4", "m7", "m11"]
    assert got.samples[other.key].column("msg_key").to_pylist() == ["m8"]
    assert [(r["msg_key"], r["reason"].split(" at ")[0]) for r in got.quarantine.to_pylist()] == [
        ("m0", "MissingSchema: no schema for org.apache.qpid.broker:queue(" + "11" * 16 + ")"),
        ("m1", "MissingSchema: no schema for org.example:widget(" + "33" * 16 + ")"),
        ("m5", "MissingSchema: no schema for org.example:widget(" + "33" * 16 + ")"),
    ]
    # m4, m7, m8 and m11 on the kernel; the schemas, heartbeats and m0, m1, m5 per record
    for compact in (False, True):
        calls.clear()
        reg = SchemaRegistry()
        res = decode_content(table, reg, per_record=counted, compact=compact)
        assert (res.fast_messages, res.fallback_messages) == (4, 8)
        assert res.fallback_reasons == {"non-content record": 5, "unknown schema": 3}
        assert sorted(calls) == sorted(bodies[i] for i in (0, 1, 2, 3, 5, 6, 9, 10))
        assert sorted(s.key.name for s in reg) == ["queue", "widget"]


# ------------------------------------------------------------------ mapInArrow adapter


def test_arrow_mapper_in_plain_python() -> None:
    reg = SchemaRegistry([WIDE])
    table = bodies_batch(list(wide_records(random.Random(3), 30)))
    mapper = arrow_mapper(reg, WIDE.key)
    out = list(mapper(iter(table.to_batches(max_chunksize=7))))
    assert len(out) == 5  # 30 messages in batches of 7: every batch has wide samples
    assert all(b.schema == sample_schema(WIDE) for b in out)
    whole = decode_content(table, reg).samples[WIDE.key]
    assert pa.Table.from_batches(out).equals(whole)
    assert list(arrow_mapper(reg, WIDE.key)(iter([bodies_batch([b"AM2h"]).to_batches()[0]]))) == []


def test_sample_schema_follows_the_record_model() -> None:
    from pipeline.codec.records import OBJECT_SAMPLE_COLUMNS
    from schemas.tables import OBJECT_SAMPLE_IDENTITY

    schema = sample_schema(WIDE)
    ident = [f.name for f in OBJECT_SAMPLE_IDENTITY]
    assert ident == ["msg_key", "record_index", *[c for c in OBJECT_SAMPLE_COLUMNS if c != "values"]]
    assert schema.names[: len(ident)] == ident
    assert schema.names[len(ident) :] == [e.name for e in (*WIDE.properties, *WIDE.statistics)]
    types = dict(zip(schema.names, schema.types, strict=True))
    assert (types["p1"], types["p4"], types["p12"], types["p14"], types["p15"]) == (
        pa.int16(), pa.int64(), pa.float32(), pa.string(), pa.string()
    )  # fmt: skip


def test_tune_malloc_on_glibc_and_decoding_unchanged() -> None:
    from pipeline.codec.vectorized import tune_malloc

    reg = SchemaRegistry([WIDE])
    table = bodies_batch(list(wide_records(random.Random(5), 10)))
    before = decode_content(table, reg).samples[WIDE.key]
    assert tune_malloc() is True  # Debian's glibc has mallopt
    assert decode_content(table, reg).samples[WIDE.key].equals(before)


def test_empty_registry_and_empty_batch() -> None:
    q = queue_like()
    body = encode_records([sample_rec("i", 1, q)], SchemaRegistry([q]))
    got = assert_same(bodies_batch([body, b"AM2h\x00\x00\x00\x00" + bytes(8)]), SchemaRegistry())
    assert got.fallback_reasons == {"unknown schema": 1, "non-content record": 1}
    assert got.samples == {}
    empty = decode_content(bodies_batch([]), SchemaRegistry([q]))
    assert (empty.samples, empty.quarantine.num_rows, empty.fast_messages) == ({}, 0, 0)


def test_large_binary_and_chunked_input_give_the_same_tables() -> None:
    reg = SchemaRegistry([WIDE])
    table = bodies_batch(list(wide_records(random.Random(11), 12)))
    want = decode_content(table, reg).samples[WIDE.key]
    large = table.set_column(
        table.schema.get_field_index("body"), "body", table.column("body").cast(pa.large_binary())
    )
    chunked = pa.concat_tables([table.slice(0, 5), table.slice(5)])
    assert chunked.column("body").num_chunks == 2
    assert decode_content(large, reg).samples[WIDE.key].equals(want)
    assert decode_content(chunked, reg).samples[WIDE.key].equals(want)
    sliced = table.slice(4, 6)  # an Arrow offset into the body buffers
    assert decode_content(sliced, reg).samples[WIDE.key].equals(
        want.filter(pa.compute.is_in(want.column("msg_key"), value_set=pa.array([f"m{i}" for i in range(4, 10)])))
    )


def test_am1_reserved_bit_63_goes_the_per_record_way() -> None:
    """An AM1 object id (or reference value) with bit 63 set is not masked by the kernel:
    the message takes the per-record path, which keeps the record and reports a non-fatal
    ReservedBitSet problem (the quarantine row keeps the raw body, so the raw id)."""
    key = SchemaKey("org.example", "widget", b"\x33" * 16)
    widget = ClassSchema(
        key=key,
        properties=(Element("name", 6, access=1), Element("peer", 10, access=1)),
        statistics=(Element("count", 4),),
    )
    reg = SchemaRegistry([widget])

    def am1(i: int, oid: int, peer: int) -> ObjectSample:
        return ObjectSample(
            dialect="AM1", opcode="g", seq=i, package=key.package, class_name=key.name,
            schema_hash=key.hash, update_ns=1000 + i, create_ns=10, delete_ns=0,
            object_id=Am1ObjectId.from_int(oid),
            values={"name": f"w{i}", "peer": Am1ObjectId.from_int(peer), "count": i},
        )  # fmt: skip

    bit = 1 << 63
    good = encode_records([am1(1, 1, 2)], reg)
    bad_id = encode_records([am1(2, bit | 5, 2), am1(3, 6, 2)], reg)
    bad_ref = encode_records([am1(4, 7, bit | 2)], reg)
    got = assert_same(bodies_batch([good, bad_id, bad_ref]), reg)
    assert got.fast_messages == 1
    assert got.fallback_reasons == {"reserved bit set": 2}
    t = got.samples[key]
    # every record is kept, in input order (offset 75 for the reference: where the values start)
    assert list(
        zip(
            t.column("msg_key").to_pylist(),
            t.column("object_num").to_pylist(),
            t.column("count").to_pylist(),
            t.column("peer").to_pylist(),
            strict=True,
        )
    ) == [
        ("m0", 1, 1, "0-0-2"),
        ("m1", 5, 2, "0-0-2"),
        ("m1", 6, 3, "0-0-2"),
        ("m2", 7, 4, "0x8000000000000002"),
    ]
    q_rows = got.quarantine.to_pylist()
    assert [(r["msg_key"], r["reason"]) for r in q_rows] == [
        (
            "m1",
            "ReservedBitSet: reserved bit set at offset 67: bit 63 of AM1 object id "
            "0x8000000000000005 (must be zero); raw id kept",
        ),
        (
            "m2",
            "ReservedBitSet: reserved bit set at offset 75: bit 63 of AM1 object reference "
            "'peer' among the values 0x8000000000000002 (must be zero); raw id kept",
        ),
    ]
    assert [r["body"] for r in q_rows] == [bad_id, bad_ref]
    # the kernel alone (no reserved bit anywhere) still takes the message
    assert decode_content(bodies_batch([good]), reg.copy()).fallback_messages == 0


def test_compact_index_keys_of_every_kind_in_one_batch() -> None:
    """Index keys in the one-pass compact build: plain text in the kernel; numeric index
    values, text needing a JSON escape and absent values in Python; exact strings."""
    keyed = ClassSchema(
        key=SchemaKey("org.example", "keyed", b"\x22" * 16),
        properties=(
            Element("vhost", 6, access=1, index=True),
            Element("port", 3, access=1, index=True),
            Element("ratio", 12, access=1, index=True),
            Element("on", 11, access=1, index=True),
            Element("label", 7, access=1, index=True, optional=True),
        ),
        statistics=(Element("n", 4),),
    )
    queue = queue_like()
    reg = SchemaRegistry([keyed, queue])

    def rec(i: int, vhost: str, label: str | None) -> ObjectSample:
        values: dict[str, Any] = {"vhost": vhost, "port": 5672 + i, "ratio": 0.1, "on": True}
        if label is not None:
            values["label"] = label
        values["n"] = i
        return ObjectSample(
            dialect="AM2", opcode="g", seq=i, package="org.example", class_name="keyed",
            schema_hash=keyed.key.hash, update_ns=1000 + i, create_ns=10, delete_ns=0,
            object_id=Am2ObjectId(0, 1, 1, 0, i), values=values, agent="1.0",
        )  # fmt: skip

    bodies = [
        encode_records([rec(0, "/", "a"), sample_rec("g", 1, queue)], reg),
        encode_records([rec(1, 'say "hi"\\', "b\n"), rec(2, "/", None)], reg),
    ]
    got = decode_content(bodies_batch(bodies), reg.copy(), compact=True)
    assert got.table is not None and got.fallback_messages == 0
    assert got.table.column("class_name").to_pylist() == ["keyed", "queue", "keyed", "keyed"]
    assert got.table.column("index_key").to_pylist() == [
        '["/","5672","0.1","true","a"]',
        None,  # queue_like marks no index property
        '["say \\"hi\\"\\\\","5673","0.1","true","b\\n"]',
        None,  # an index property is absent
    ]
    assert_same(bodies_batch(bodies), reg)


def test_compact_text_that_is_not_utf8_is_replaced_in_texts_and_index_key() -> None:
    """A str8 index value with a byte that is not UTF-8: U+FFFD in the texts list and in
    the index key the kernel builds from them (the key is not built from the raw bytes)."""
    named = ClassSchema(
        key=SchemaKey("org.example", "named", b"\x23" * 16),
        properties=(Element("name", 6, access=1, index=True),),
        statistics=(Element("n", 4),),
    )
    reg = SchemaRegistry([named])
    rec = ObjectSample(
        dialect="AM2", opcode="g", seq=0, package="org.example", class_name="named",
        schema_hash=named.key.hash, update_ns=1000, create_ns=10, delete_ns=0,
        object_id=Am2ObjectId(0, 1, 1, 0, 7), values={"name": "vQx", "n": 3}, agent="1.0",
    )  # fmt: skip
    raw = encode_records([rec], reg)
    assert raw.count(b"vQx") == 1
    bad = [raw.replace(b"vQx", b"v\xffx")]
    got = decode_content(bodies_batch(bad), reg.copy(), compact=True)
    assert got.table is not None and got.fallback_messages == 0
    assert got.table.column("texts").to_pylist() == [["v\ufffdx"]]
    assert got.table.column("index_key").to_pylist() == ['["v\ufffdx"]']
    got.table.validate(full=True)
    assert_same(bodies_batch(bad), reg)


def test_split_across_decode_threads_gives_the_same_tables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A large batch is walked and built in chunks on threads: the same rows, in order."""
    import pipeline.codec.vectorized as vec

    reg = SchemaRegistry([WIDE])
    table = bodies_batch(list(wide_records(random.Random(11), 90)))
    one = decode_content(table, reg.copy(), compact=True)
    monkeypatch.setattr(vec, "PARALLEL_RECORDS", 20)
    monkeypatch.setattr(vec, "DECODE_THREADS", 3)
    assert len(vec._split_records(np.zeros((14, 100), np.int64))) == 3
    size = table.column("body").combine_chunks().buffers()[2].size
    assert size // (20 * 256) >= 3  # the walk is split too
    split = decode_content(table, reg.copy(), compact=True)
    assert one.table is not None and split.table is not None
    assert one.table.num_rows > 60
    assert split.table.equals(one.table)
    assert (split.fast_messages, split.fallback_messages) == (90, 0)


def test_decode_threads_setting_is_checked() -> None:
    """``QMF_DECODE_THREADS``: unset means the cores up to 4; a bad value is named."""
    from pipeline.codec.vectorized import decode_threads

    assert [decode_threads(None, c) for c in (None, 1, 2, 16)] == [1, 1, 2, 4]
    assert decode_threads("", 8) == 4
    assert decode_threads("6", 2) == 6
    for bad in ("two", "0", "-1", "1.5"):
        with pytest.raises(ValueError, match=f"QMF_DECODE_THREADS='{bad}': expected a whole"):
            decode_threads(bad, 2)


def test_a_container_value_the_codec_rejects_sends_only_its_message_per_record() -> None:
    """A map whose entry has an unknown type code: the kernel's grouped container
    decode marks it, that message takes the per-record path (and its problem), the
    other messages stay on the kernel path, in both layouts."""
    schema = ClassSchema(
        key=SchemaKey("org.example", "mapped", b"\x33" * 16),
        properties=(Element("name", 6, access=1, index=True), Element("args", 15, access=1)),
        statistics=(Element("n", 4),),
    )
    reg = SchemaRegistry([schema])

    def body(i: int, args: TypedMap) -> bytes:
        rec = ObjectSample(
            dialect="AM2", opcode="g", seq=i, package="org.example", class_name="mapped",
            schema_hash=schema.key.hash, update_ns=1000 + i, create_ns=10, delete_ns=0,
            object_id=Am2ObjectId(0, 1, 1, 0, i), values={"name": f"o{i}", "args": args, "n": i},
            agent="1.0",
        )  # fmt: skip
        return encode_records([rec], reg)

    good = TypedMap([("k", "v")], {"k": 0x95})
    bad = body(1, good)
    at = bad.index(b"\x01k\x95")
    bad = bad[: at + 2] + b"\xff" + bad[at + 3 :]  # no such 0-10 type code
    table = bodies_batch([body(0, good), bad, body(2, TypedMap()), body(3, good)])
    got = assert_same(table, reg)
    assert (got.fast_messages, got.fallback_messages) == (3, 1)
    compact = decode_content(table, reg.copy(), compact=True)
    assert compact.fallback_reasons == {"container value rejected": 1}
    assert compact.table is not None
    assert compact.table.column("msg_key").to_pylist() == ["m0", "m2", "m3"]
    assert [t[0] for t in compact.table.column("texts").to_pylist()] == ["o0", "o2", "o3"]
    assert [t[1] for t in compact.table.column("texts").to_pylist()] == [
        '{"k":"v"}', "{}", '{"k":"v"}'
    ]
    assert [q["msg_key"] for q in compact.quarantine.to_pylist()] == ["m1"]


def test_kernels_refuse_a_strided_array() -> None:
    """The kernels read their inputs through unowned views (no reference counts):
    a non-contiguous input would be read as if it were contiguous, so it is refused."""
    from pipeline.codec import _kernels as K

    data = np.zeros(16, np.uint8)
    strided = np.zeros(8, np.int64)[::2]
    ok = np.zeros(4, np.bool_)
    types = np.full(4, 15, np.int64)
    with pytest.raises(ValueError, match="contiguous"):
        K.container_groups(data, strided, ok, types)
    todo, sizes, rep, inv, cidx = K.container_groups(
        data, np.ascontiguousarray(strided), ok, types
    )
    assert (len(todo), len(sizes), len(rep), len(inv)) == (0, 0, 0, 0)
    assert cidx.tolist() == [-1, -1, -1, -1]


def test_compiled_registry_follows_schemas_added_later() -> None:
    """The compiled registry is kept on the registry per generation: an added or replaced
    schema is seen by the next batch, an unchanged registry reuses its compilation."""
    from pipeline.codec.vectorized import compile_registry

    queue = queue_like()
    other = ClassSchema(
        key=SchemaKey("org.example", "other", b"\x24" * 16),
        properties=(Element("name", 6, access=1, index=True),),
        statistics=(),
    )
    reg = SchemaRegistry([queue])
    first = compile_registry(reg)
    assert compile_registry(reg) is first
    assert [s.key for s in first.schemas] == [queue.key]
    reg.add(other)
    second = compile_registry(reg)
    assert [s.key for s in second.schemas] == [queue.key, other.key]
    reg.add(other)  # the same object again: nothing changed
    assert compile_registry(reg) is second
    changed = ClassSchema(key=other.key, properties=other.properties, statistics=(Element("n", 4),))
    reg.add(changed)
    assert compile_registry(reg).schemas[1] is changed
