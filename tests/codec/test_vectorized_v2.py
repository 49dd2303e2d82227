"""QMF v2 data indications on the compact fast path (``_v2kernels``) equal the per-record path.

The oracle is ``decode_content(..., v2_kernel=False)``: every v2 message decoded
whole by the per-record codec (``decode_v2``, AMQP 0-10 or AMQP 1.0) and
converted by ``records_to_table`` + ``wide_to_compact``, as before the kernel.
Every test also checks that the kernel really took the messages
(``v2_messages``), so a silent fallback cannot pass.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.codec import amqp10
from pipeline.codec.capture import CapturedMessage, read_capture
from pipeline.codec.schema import KIND_TABLE, ClassSchema, Element, SchemaKey, SchemaRegistry
from pipeline.codec.types import TypedList, TypedMap, encode_list
from pipeline.codec.vectorized import ContentResult, decode_content
from tests.codec.test_vectorized import batch_of

# Decode with the kernels the warm-up compiles (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("compiled_decoder")

AMQP10_SAMPLES = ("default-60s.jsonl", "qmf1-qmf2-60s.jsonl")
V2_REASONS = (
    "v2: malformed",
    "v2: unknown schema",
    "v2: unsupported value",
    "v2: not a data record",
)


def is_v2_data(m: CapturedMessage) -> bool:
    ap = m.application_properties
    return (
        ap.get("qmf.opcode") in ("_data_indication", "_query_response")
        and ap.get("qmf.content") == "_data"
    )


def registry_of(msgs: Sequence[CapturedMessage]) -> SchemaRegistry:
    """Every schema the capture announces (what the schema registry table would hold)."""
    reg = SchemaRegistry()
    for m in msgs:
        m.decode(reg)
    return reg


def same_output(
    table: pa.Table, registry: SchemaRegistry
) -> tuple[ContentResult, ContentResult]:
    """Fast and per-record decode of one batch; asserts every output is the same.

    Neither may raise: whatever the bytes, a message decodes or goes to
    quarantine (an agent epoch >= 2**63 from a damaged byte keeps its bit
    pattern, as the uint64 times do).
    """
    want = decode_content(table, registry.copy(), compact=True, v2_kernel=False)
    got = decode_content(table, registry.copy(), compact=True)
    assert got.table is not None and want.table is not None
    if not got.table.equals(want.table):  # show the first differing row and column
        assert got.table.num_rows == want.table.num_rows
        for i, (a, b) in enumerate(zip(got.table.to_pylist(), want.table.to_pylist(), strict=True)):
            assert a == b, (i, {k: (a[k], b[k]) for k in a if a[k] != b[k]})
    assert got.table.equals(want.table)
    assert got.table.schema == want.table.schema
    assert got.quarantine.equals(want.quarantine)
    assert [(k, type(r).__name__, r) for k, r in got.others] == [
        (k, type(r).__name__, r) for k, r in want.others
    ]
    assert got.other_index == want.other_index
    assert got.fast_messages + got.fallback_messages == table.num_rows
    assert got.fallback_messages == want.fallback_messages - got.v2_messages
    assert want.v2_messages == 0
    return got, want


def same(table: pa.Table, registry: SchemaRegistry) -> tuple[ContentResult, ContentResult]:
    """(fast, per-record) results of one batch, asserted equal."""
    return same_output(table, registry)


# ------------------------------------------------------------------ real qpidd traffic


@pytest.fixture(scope="module")
def samples(shared_dir: str) -> dict[str, list[CapturedMessage]]:
    out = {
        name: list(read_capture(os.path.join(shared_dir, "samples", "qpidd-amqp10", name)))
        for name in AMQP10_SAMPLES
    }
    out["qpidd-capture-20s.jsonl"] = list(
        read_capture(os.path.join(shared_dir, "samples", "qpidd-capture-20s.jsonl"))
    )
    return out


@pytest.mark.parametrize("name", [*AMQP10_SAMPLES, "qpidd-capture-20s.jsonl"])
@pytest.mark.parametrize("size", [1, 7, 200, 0])
def test_real_v2_data_indications_equal_the_per_record_path(
    samples: dict[str, list[CapturedMessage]], name: str, size: int
) -> None:
    msgs = samples[name]
    reg = registry_of(msgs)
    data = [m for m in msgs if is_v2_data(m)]
    size = size or len(data)
    taken = 0
    for i in range(0, len(data), size):
        got, _ = same(batch_of(data[i : i + size]), reg)
        assert got.fallback_messages == 0, got.fallback_reasons  # every one on the kernel
        assert got.v2_messages == len(data[i : i + size])
        taken += got.v2_messages
    # 392 data indications in each AMQP 1.0 sample; 188 + 21 query responses over 0-10
    assert taken == (209 if name == "qpidd-capture-20s.jsonl" else 392)


@pytest.mark.parametrize("name", [*AMQP10_SAMPLES, "qpidd-capture-20s.jsonl"])
def test_whole_capture_v2_mixed_with_am2_in_one_batch(
    samples: dict[str, list[CapturedMessage]], name: str
) -> None:
    msgs = samples[name]
    reg = registry_of(msgs)
    got, _ = same(batch_of(msgs), reg)
    n_data = sum(1 for m in msgs if is_v2_data(m))
    assert got.v2_messages == n_data
    assert not any(r in got.fallback_reasons for r in V2_REASONS), got.fallback_reasons
    assert got.quarantine.num_rows == 0
    dialects: dict[str, int] = {}
    for d in got.table.column("dialect").to_pylist():  # type: ignore[union-attr]
        dialects[d] = dialects.get(d, 0) + 1
    expected = {
        "default-60s.jsonl": {"V2": 701},
        "qmf1-qmf2-60s.jsonl": {"V2": 845, "AM2": 975},
        "qpidd-capture-20s.jsonl": {"V2": 700, "AM2": 932},
    }[name]
    assert dialects == expected


@pytest.mark.parametrize(
    ("name", "fast", "v2", "parked"),
    [
        ("default-60s.jsonl", 392, 392, 0),
        ("qmf1-qmf2-60s.jsonl", 784, 392, 5),
        ("qpidd-capture-20s.jsonl", 409, 209, 0),
    ],
)
def test_whole_capture_with_an_empty_registry_learns_its_schemas_on_the_way(
    samples: dict[str, list[CapturedMessage]], name: str, fast: int, v2: int, parked: int
) -> None:
    """A consumer that starts with nothing known: the capture's own schema responses serve
    the content after them, which takes the kernels as with every schema known (before
    2026-11-28 all of it went per record); content before its schema stays unknown."""
    from tests.codec.test_vectorized import assert_same

    msgs = samples[name]
    table = batch_of(msgs)
    assert_same(table, SchemaRegistry())  # equal to the per-record path, message by message
    got, _ = same(table, SchemaRegistry())
    known = decode_content(table, registry_of(msgs), compact=True)
    assert (got.fast_messages, got.v2_messages) == (known.fast_messages, known.v2_messages)
    assert (got.fast_messages, got.v2_messages) == (fast, v2)
    reasons = [r.split(":")[0] for r in got.quarantine.column("reason").to_pylist()]
    assert reasons == ["MissingSchema"] * parked
    assert got.table is not None and known.table is not None
    assert got.table.num_rows == known.table.num_rows


def test_v2_queue_row_holds_the_real_values(samples: dict[str, list[CapturedMessage]]) -> None:
    """One queue sample read by hand from the AMQP 1.0 body, against the kernel's row."""
    msgs = samples["qmf1-qmf2-60s.jsonl"]
    reg = registry_of(msgs)
    data = [m for m in msgs if is_v2_data(m)]
    got, _ = same(batch_of(data), reg)
    t = got.table
    assert t is not None
    rows = [
        r
        for r in t.to_pylist()
        if r["class_name"] == "queue"
        and r["object_name"] == "org.apache.qpid.broker:queue:q-rate-50"
    ]
    assert rows, "no q-rate-50 sample"
    row = rows[-1]
    schema = reg.get(SchemaKey(row["package"], row["class_name"], row["schema_hash"]))
    assert schema is not None
    # the body it came from, decoded by the codec's AMQP 1.0 decoder
    src = data[int(row["msg_key"][1:])]
    item = amqp10.decode(src.body)[0][row["record_index"]]
    values = item["_values"]
    ints = [
        e
        for e in (*schema.properties, *schema.statistics)
        if e.type_code in (1, 2, 3, 4, 8, 9, 11, 16, 17, 18, 19)
    ]
    enq = ints.index(next(e for e in ints if e.name == "msgTotalEnqueues"))
    assert row["ints"][enq] == values["msgTotalEnqueues"]
    assert row["dialect"] == "V2" and row["opcode"] == "_data_indication"
    assert row["update_ns"] == item["_update_ts"]
    assert row["agent_name"] == item["_object_id"].get("_agent_name")
    assert row["epoch"] == item["_object_id"].get("_agent_epoch")
    # samples with the properties (qpidd sends them on a change) have the index key
    keyed = [r["index_key"] for r in rows if r["index_key"] is not None]
    assert keyed and all("q-rate-50" in k and "_object_name" in k for k in keyed)


# ------------------------------------------------------------------ generated indications

PKG = "org.example"
THING = ClassSchema(
    key=SchemaKey(PKG, "thing", bytes(range(16))),
    kind=KIND_TABLE,
    properties=(
        Element("name", 6, index=True),
        Element("vhostRef", 10, index=True),
        Element("count", 3),
        Element("flag", 11, optional=True),
        Element("args", 15),
        Element("id", 14),
        Element("label", 7, optional=True),
        Element("items", 21),
    ),
    statistics=(
        Element("total", 4),
        Element("depth", 3),
        Element("ratio", 13),
        Element("frac", 12),
        Element("small", 17),
        Element("tiny", 16),
        Element("mid", 18),
        Element("big", 19),
        Element("when", 8),
        Element("byte", 1),
        Element("word", 2),
    ),
)
OTHER = ClassSchema(
    key=SchemaKey(PKG, "other", bytes(range(16, 32))),
    kind=KIND_TABLE,
    properties=(Element("n", 18, index=True),),
    statistics=(Element("s", 6),),
)
UNKNOWN = SchemaKey(PKG, "unknown", bytes(range(32, 48)))

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
simple = st.one_of(
    st.tuples(st.integers(0, 1 << 32), st.just(0x32)),
    st.tuples(text, st.just(0x90)),
    st.tuples(st.booleans(), st.just(0x08)),
)


@st.composite
def small_map(draw: Any) -> TypedMap:
    keys = draw(st.lists(st.sampled_from(["a", "b", "c", 'd"q']), unique=True, max_size=3))
    m = TypedMap()
    for k in keys:
        v, code = draw(simple)
        m[k] = v
        m.codes[k] = code
    return m


def ints_for(t: int) -> Any:
    """(value, 0-10 code) strategies of integers that fit QMF type t's column."""
    lo, hi = {
        1: (0, 255), 2: (0, 65535), 3: (0, (1 << 32) - 1), 16: (-128, 127),
        17: (-32768, 32767), 18: (-(1 << 31), (1 << 31) - 1),
    }.get(t, (-(1 << 63), (1 << 63) - 1))  # fmt: skip
    opts = [st.tuples(st.integers(max(lo, 0), min(hi, 255)), st.just(0x02))]
    if lo < 0:
        opts.append(st.tuples(st.integers(max(lo, -128), min(hi, 127)), st.just(0x01)))
        opts.append(
            st.tuples(st.integers(max(lo, -(1 << 31)), min(hi, (1 << 31) - 1)), st.just(0x21))
        )
        opts.append(st.tuples(st.integers(lo, hi), st.just(0x31)))
    if hi > 255:
        opts.append(st.tuples(st.integers(0, min(hi, 65535)), st.just(0x12)))
        opts.append(st.tuples(st.integers(0, min(hi, (1 << 32) - 1)), st.just(0x22)))
    if t in (4, 8, 9):
        opts.append(st.tuples(st.integers(0, (1 << 64) - 1), st.just(0x32)))
    if t == 19:
        opts.append(st.tuples(st.integers(0, (1 << 63) - 1), st.just(0x32)))
    opts.append(st.tuples(st.booleans(), st.just(0x08)))
    return st.one_of(*opts)


def value_for(t: int) -> Any:
    """(value, 0-10 code) for an element of QMF type t, with the wire types qpidd and others use."""
    null = st.just((None, 0xF0))
    if t == 11:
        return st.one_of(
            st.tuples(st.booleans(), st.just(0x08)),
            st.tuples(st.integers(0, 255), st.just(0x02)),
            null,
        )
    if t in (12, 13):
        return st.one_of(
            st.tuples(st.floats(allow_nan=False), st.just(0x33)),
            st.tuples(st.floats(width=32, allow_nan=False), st.just(0x23)),
            null,
        )
    if t in (6, 7):
        return st.one_of(
            st.tuples(text, st.sampled_from([0x90, 0x95, 0x85])),
            st.tuples(st.binary(max_size=10), st.sampled_from([0x90, 0x80])),
            st.tuples(st.text(st.characters(max_codepoint=255), max_size=8), st.just(0x84)),
            st.tuples(st.uuids(), st.just(0x48)),
            st.tuples(st.integers(0, 1000), st.just(0x22)),
            null,
        )
    if t == 10:
        ref = st.builds(
            lambda name, agent: TypedMap(
                {"_object_name": name, "_agent_name": agent},
                {"_object_name": 0x90, "_agent_name": 0x90},
            ),
            text,
            st.sampled_from(["apache.org:qpidd:1", 'a"b']),
        )
        return st.one_of(st.tuples(ref, st.just(0xA8)), st.tuples(text, st.just(0x90)), null)
    if t == 14:
        return st.one_of(st.tuples(st.uuids(), st.just(0x48)), null)
    if t == 15:
        return st.one_of(st.tuples(small_map(), st.just(0xA8)), null)
    if t == 21:
        return st.one_of(
            st.tuples(
                st.lists(st.integers(0, 9), max_size=3).map(
                    lambda xs: TypedList(xs, [0x02] * len(xs))
                ),
                st.just(0xA9),
            ),
            null,
        )
    return st.one_of(ints_for(t), null)


@st.composite
def v2_record(draw: Any) -> TypedMap:
    """One ``_data`` map: a known class (absent and extra values) or an unknown one."""
    schema = draw(st.sampled_from([THING, THING, OTHER, None]))
    key = schema.key if schema is not None else UNKNOWN
    values = TypedMap()
    if schema is not None:
        for e in (*schema.properties, *schema.statistics):
            if draw(st.integers(0, 4)) == 0:
                continue  # absent
            v, code = draw(value_for(e.type_code))
            values[e.name] = v
            values.codes[e.name] = code
    for extra in draw(st.lists(st.sampled_from(["extra", "zz", "name2"]), unique=True, max_size=2)):
        v, code = draw(simple)
        values[extra] = v
        values.codes[extra] = code
    sid = TypedMap(
        {"_package_name": key.package, "_class_name": key.name, "_hash": uuid.UUID(bytes=key.hash)},
        {"_package_name": 0x90, "_class_name": 0x90, "_hash": 0x48},
    )
    if draw(st.booleans()):
        sid["_type"] = draw(st.sampled_from(["_data", "_data", "_event"]))
        sid.codes["_type"] = 0x90
    oid = TypedMap({"_object_name": draw(text)}, {"_object_name": 0x90})
    if draw(st.booleans()):
        oid["_agent_name"] = "apache.org:qpidd:x"
        oid.codes["_agent_name"] = 0x90
    if draw(st.booleans()):
        oid["_agent_epoch"] = draw(st.one_of(st.integers(0, 1 << 40), st.integers(0, (1 << 64) - 1)))
        oid.codes["_agent_epoch"] = 0x32
    rec = TypedMap()
    parts: list[tuple[str, Any, int]] = [
        ("_schema_id", sid, 0xA8),
        ("_object_id", oid, 0xA8),
        ("_update_ts", draw(st.integers(0, (1 << 64) - 1)), 0x32),
        ("_create_ts", draw(st.integers(0, 1 << 62)), 0x32),
        ("_delete_ts", draw(st.sampled_from([0, 1, 1 << 63])), 0x32),
        ("_values", values, 0xA8),
    ]
    for k, v, code in sorted(parts):
        if k in ("_object_id", "_values", "_delete_ts") and draw(st.integers(0, 9)) == 0:
            continue  # sometimes left out
        rec[k] = v
        rec.codes[k] = code
    return rec


@st.composite
def v2_message(draw: Any) -> CapturedMessage:
    """A ``_data`` indication in either encoding, now and then truncated or with a byte changed."""
    items = draw(st.lists(v2_record(), min_size=0, max_size=3))
    body_0_10 = bytearray()
    encode_list(body_0_10, TypedList(items, [0xA8] * len(items)))
    props = {"method": "indication", "qmf.opcode": "_data_indication", "qmf.content": "_data"}
    if draw(st.booleans()):
        body = amqp10.encode(*amqp10.from_0_10(TypedList(items, [0xA8] * len(items)), 0xA9))
        props[amqp10.BODY_ENCODING_PROPERTY] = amqp10.BODY_ENCODING_AMQP10
    else:
        body = bytes(body_0_10)
    damage = draw(st.integers(0, 7))
    if damage == 0 and body:
        body = body[: draw(st.integers(0, len(body) - 1))]
    elif damage == 1 and body:
        at = draw(st.integers(0, len(body) - 1))
        body = body[:at] + bytes([draw(st.integers(0, 255))]) + body[at + 1 :]
    return CapturedMessage(
        body=bytes(body),
        content_type="amqp/list",
        application_properties=props,
        routing_key="agent.ind.data.org_example.thing",
    )


def generated_registry() -> SchemaRegistry:
    return SchemaRegistry([THING, OTHER])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(v2_message(), min_size=1, max_size=8))
def test_generated_v2_data_indications_equal_the_per_record_path(
    msgs: list[CapturedMessage],
) -> None:
    same_output(batch_of(msgs), generated_registry())


def test_generated_clean_indications_take_the_kernel() -> None:
    """Undamaged indications of known classes: every message on the kernel, both encodings."""
    msgs: list[CapturedMessage] = []
    for enc in ("0-10", "1.0"):
        for i in range(30):
            values = TypedMap(
                {"name": f"q{i}", "count": i, "total": (1 << 64) - 1 - i, "ratio": 0.5 * i,
                 "frac": 1.1, "label": b"\xff\xfe bad utf-8", "vhostRef": TypedMap(
                     {"_object_name": f"vh{i % 3}"}, {"_object_name": 0x90}), "small": -i},
                {"name": 0x90, "count": 0x22, "total": 0x32, "ratio": 0x33, "frac": 0x33,
                 "label": 0x90, "vhostRef": 0xA8, "small": 0x11},
            )  # fmt: skip
            if i % 4 == 0:
                del values["label"]
                del values.codes["label"]
            item = TypedMap(
                {
                    "_schema_id": TypedMap(
                        {"_package_name": PKG, "_class_name": "thing",
                         "_hash": uuid.UUID(bytes=THING.key.hash), "_type": "_data"},
                        {"_package_name": 0x90, "_class_name": 0x90, "_hash": 0x48, "_type": 0x90},
                    ),
                    "_object_id": TypedMap({"_object_name": f"thing-{i}"}, {"_object_name": 0x90}),
                    "_update_ts": 1000 + i,
                    "_values": values,
                },
                {"_schema_id": 0xA8, "_object_id": 0xA8, "_update_ts": 0x32, "_values": 0xA8},
            )  # fmt: skip
            items = TypedList([item], [0xA8])
            props = {"qmf.opcode": "_data_indication", "qmf.content": "_data", "qmf.agent": "ag"}
            if enc == "1.0":
                body = amqp10.encode(*amqp10.from_0_10(items, 0xA9))
                props[amqp10.BODY_ENCODING_PROPERTY] = amqp10.BODY_ENCODING_AMQP10
            else:
                out = bytearray()
                encode_list(out, items)
                body = bytes(out)
            msgs.append(
                CapturedMessage(body=body, content_type="amqp/list", application_properties=props)
            )
    got, _ = same(batch_of(msgs), generated_registry())
    assert got.v2_messages == 60 and got.fallback_messages == 0
    t = got.table
    assert t is not None
    assert t.column("agent").to_pylist() == ["ag"] * 60
    assert t.column("index_key").to_pylist()[1] == '["q1","{\\"_object_name\\":\\"vh1\\"}"]'
    assert t.column("texts").to_pylist()[1][THING_TEXT.index("label")] == "\ufffd\ufffd bad utf-8"


THING_TEXT = [
    e.name for e in (*THING.properties, *THING.statistics) if e.type_code in (6, 7, 10, 14, 15, 21)
]


@pytest.mark.parametrize("damage", ["truncated", "unknown class", "event", "not a list"])
def test_refused_v2_messages_go_whole_per_record(damage: str) -> None:
    """Messages the kernel refuses: the per-record path decides (quarantine, others), counted."""
    good = TypedMap(
        {
            "_schema_id": TypedMap(
                {
                    "_package_name": PKG,
                    "_class_name": "other",
                    "_hash": uuid.UUID(bytes=OTHER.key.hash),
                },
                {"_package_name": 0x90, "_class_name": 0x90, "_hash": 0x48},
            ),
            "_values": TypedMap({"n": 5, "s": "x"}, {"n": 0x21, "s": 0x90}),
        },
        {"_schema_id": 0xA8, "_values": 0xA8},
    )
    bad = TypedMap(good, good.codes)
    if damage == "unknown class":
        bad["_schema_id"] = TypedMap(good["_schema_id"], good["_schema_id"].codes)
        bad["_schema_id"]["_class_name"] = "nope"
    elif damage == "event":
        bad["_schema_id"] = TypedMap(good["_schema_id"], good["_schema_id"].codes)
        bad["_schema_id"]["_type"] = "_event"
        bad["_schema_id"].codes["_type"] = 0x90
    props = {"qmf.opcode": "_data_indication", "qmf.content": "_data"}
    msgs = []
    for item in (good, bad):
        out = bytearray()
        encode_list(out, TypedList([item], [0xA8]))
        body = bytes(out)
        if item is bad and damage == "truncated":
            body = body[:-3]
        if item is bad and damage == "not a list":
            out = bytearray()
            encode_list(out, TypedList([item, 7], [0xA8, 0x02]))
            body = bytes(out)
        msgs.append(
            CapturedMessage(body=body, content_type="amqp/list", application_properties=props)
        )
    got, _ = same(batch_of(msgs), generated_registry())
    assert got.v2_messages == 1 and got.fallback_messages == 1
    reason = {
        "truncated": "v2: malformed",
        "unknown class": "v2: unknown schema",
        "event": "v2: not a data record",
        "not a list": "v2: not a data record",
    }[damage]
    assert got.fallback_reasons == {reason: 1}
    if damage == "truncated":
        assert got.quarantine.num_rows == 1
        assert got.quarantine.column("msg_key").to_pylist() == ["m1"]
        assert got.quarantine.column("body").to_pylist() == [msgs[1].body]


def test_an_agent_epoch_beyond_int64_keeps_its_bit_pattern() -> None:
    """Silver must not fail a batch on it (it raised in the table conversion before)."""
    oid = TypedMap({"_agent_epoch": (1 << 63) + 5, "_object_name": "q"},
                   {"_agent_epoch": 0x32, "_object_name": 0x90})  # fmt: skip
    sid = TypedMap(
        {"_class_name": THING.key.name, "_hash": uuid.UUID(bytes=THING.key.hash),
         "_package_name": THING.key.package},
        {"_class_name": 0x90, "_hash": 0x48, "_package_name": 0x90},
    )  # fmt: skip
    rec = TypedMap({"_object_id": oid, "_schema_id": sid, "_update_ts": 7},
                   {"_object_id": 0xA8, "_schema_id": 0xA8, "_update_ts": 0x32})  # fmt: skip
    body = bytearray()
    encode_list(body, TypedList([rec], [0xA8]))
    msg = CapturedMessage(
        body=bytes(body), content_type="amqp/list", routing_key="agent.ind.data.x",
        application_properties={"qmf.opcode": "_data_indication", "qmf.content": "_data"},
    )  # fmt: skip
    fast, _ = same(batch_of([msg]), generated_registry())
    assert fast.quarantine.num_rows == 0
    assert fast.table.column("epoch").to_pylist() == [(1 << 63) + 5 - (1 << 64)]


def test_a_non_utf8_key_in_the_object_id_goes_to_quarantine_as_per_record() -> None:
    """Found by the generated test: the kernel ignored an unknown key of ``_object_id``
    whose bytes are not UTF-8, where the codec refuses the message; both must refuse."""
    body = (
        b"\x00\x00\x00\xe9\x00\x00\x00\x01\xa8\x00\x00\x00\xe0\x00\x00\x00\x05"
        b"\n_create_ts2" + bytes(8) + b"\n_delete_ts2" + bytes(8)
        + b"\n_object_id\xa8\x00\x00\x005\x00\x00\x00\x02\x0c_object_name\x90\x00\x00"
        b"\x0b\x80agent_name\x90\x00\x12apache.org:qpidd:x"
        b"\n_schema_id\xa8\x00\x00\x00K\x00\x00\x00\x03\r_package_name\x90\x00\x0borg.example"
        b"\x0b_class_name\x90\x00\x05thing\x05_hashH" + bytes(range(16))
        + b"\n_update_ts2" + bytes(8)
    )  # fmt: skip
    msg = CapturedMessage(
        body=body, content_type="amqp/list", routing_key="agent.ind.data.org_example.thing",
        application_properties={"qmf.opcode": "_data_indication", "qmf.content": "_data"},
    )  # fmt: skip
    fast, _ = same(batch_of([msg]), generated_registry())
    assert (fast.v2_messages, fast.quarantine.num_rows, fast.table.num_rows) == (0, 1, 0)


@pytest.mark.parametrize("bad", ["abc", b"\xff\xfe", float("nan")])
def test_a_value_that_does_not_fit_its_element_quarantines_its_message_only(bad: Any) -> None:
    """Text in an integer element: the kernel refuses the message and the per-record
    conversion cannot type it either; it goes to quarantine whole (raw bytes, reason)
    instead of failing the batch, and the good message beside it is decoded."""
    def message(n: Any, code: int) -> CapturedMessage:
        sid = TypedMap(
            {"_class_name": "other", "_hash": uuid.UUID(bytes=OTHER.key.hash), "_package_name": PKG},
            {"_class_name": 0x90, "_hash": 0x48, "_package_name": 0x90},
        )  # fmt: skip
        oid = TypedMap({"_object_name": "o"}, {"_object_name": 0x90})
        vals = TypedMap({"n": n, "s": "x"}, {"n": code, "s": 0x90})
        rec = TypedMap({"_object_id": oid, "_schema_id": sid, "_update_ts": 5, "_values": vals},
                       {"_object_id": 0xA8, "_schema_id": 0xA8, "_update_ts": 0x32,
                        "_values": 0xA8})  # fmt: skip
        body = bytearray()
        encode_list(body, TypedList([rec], [0xA8]))
        return CapturedMessage(
            body=bytes(body), content_type="amqp/list", routing_key="agent.ind.data.x",
            application_properties={"qmf.opcode": "_data_indication", "qmf.content": "_data"},
        )  # fmt: skip

    code = {str: 0x90, bytes: 0x90, float: 0x33}[type(bad)]
    batch = batch_of([message(bad, code), message(7, 0x32)])
    fast, _ = same(batch, generated_registry())
    assert fast.quarantine.column("msg_key").to_pylist() == [batch.column("msg_key")[0].as_py()]
    assert fast.quarantine.column("reason")[0].as_py().startswith("ValueRejected: ")
    assert fast.quarantine.column("body")[0].as_py() == batch.column("body")[0].as_py()
    assert fast.table.num_rows == 1 and fast.table.column("ints").to_pylist() == [[7]]
