"""The simulator over the real broker: console requests and raw subscribers, per dialect."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from pipeline.codec import v1
from pipeline.codec.records import (
    BrokerRequest,
    BrokerResponse,
    ClassIndication,
    ClassQuery,
    CommandComplete,
    Event,
    GetQuery,
    MethodRequest,
    MethodResponse,
    ObjectSample,
    PackageIndication,
    PackageQuery,
    Record,
    SchemaRequest,
    SchemaResponse,
)
from pipeline.codec.schema import ClassSchema, SchemaRegistry
from pipeline.codec.types import Am1ObjectId, Am2ObjectId, TypedMap, V2ObjectId
from pipeline.qmfxml import default_schema
from pipeline.sim.amqp import Console, Received, Subscriber
from pipeline.sim.manifest import jsonable, read_manifest, record_row
from pipeline.sim.model import NS
from pipeline.sim.wire import decode_arguments, encode_arguments

from .conftest import START_NS, finish, sim_process

pytestmark = pytest.mark.broker

PKG = "org.apache.qpid.broker"
SUBSCRIPTIONS = {
    "am1": ["/exchange/qpid.management/mgmt.#"],
    "am2": ["/exchange/qpid.management/console.#", "/exchange/qpid.management/schema.#"],
    "v2": ["/exchange/qmf.default.topic/agent.ind.#"],
    "v2-amqp10": ["/exchange/qmf.default.topic/agent.ind.#"],
}


def _ours(
    dialect: str, ready: dict[str, Any], registry: SchemaRegistry
) -> Callable[[Received], bool]:
    """Our agents' messages: AM1 and V2 keys name the agent; AM2 needs a look inside."""
    uuids = {a["uuid"] for a in ready["agents"]}
    banks = {a["agent_bank"] for a in ready["agents"]}

    def match(m: Received) -> bool:
        key = m.routing_key or ""
        if dialect == "am1":
            return key.split(".")[1] in uuids if key.count(".") > 1 else False
        if dialect.startswith("v2"):
            return key.rsplit(".", 1)[-1] in uuids
        try:
            recs = m.decode(registry)
        except ValueError:
            return False
        oids = [r.object_id for r in recs if isinstance(r, ObjectSample)]
        return all(isinstance(o, Am2ObjectId) and o.agent_bank in banks for o in oids)

    return match


def _as_sent(schema: ClassSchema, dialect: str) -> ClassSchema:
    """AM1 writes method argument directions as the spec's numbers (1 I, 2 O, 3 IO)."""
    if dialect != "AM1":
        return schema
    codes = {"I": 1, "O": 2, "IO": 3}
    methods = tuple(
        replace(
            m,
            arguments=tuple(
                replace(a, extra={**a.extra, "dir": codes[a.extra["dir"]]}) for a in m.arguments
            ),
        )
        for m in schema.methods
    )
    return replace(schema, methods=methods)


def _latest(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Current values per object id: the last published 'c' and 'i' merged."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["kind"] == "object" and r["source"] == "publish" and r["delete_ns"] == 0:
            out.setdefault(r["object_id"]["oid"], {}).update(r["values"])
    return out


@pytest.mark.parametrize("dialect", ["am2", "am1"])
def test_console_requests_are_answered_per_schema_and_manifest(
    broker: Any, tmp_path: Any, dialect: str
) -> None:
    d = dialect.upper()
    bank = random.randrange(1000, 1 << 20)
    key = f"agent.{bank}"
    manifest = str(tmp_path / "manifest.jsonl")
    args = [
        "--url",
        broker.url,
        "--dialect",
        dialect,
        "--intervals",
        "3",
        "--queues",
        "6",
        "--active-fraction",
        "1",
        "--start-ns",
        str(START_NS),
        "--serve",
        "90",
        "--manifest",
        manifest,
        "--seed",
        "3",
        "--first-bank",
        str(bank),
        "--no-broker-key",  # other tests may run agents on this broker too
    ]
    ours = default_schema()
    with sim_process(args) as (proc, ready):
        agent = ready["agents"][0]
        assert agent["command_keys"] == [key] and agent["agent_bank"] == bank
        registry = SchemaRegistry()  # the console learns every schema from the agent
        with Console(broker.url, registry) as con:

            def ask(rec: Record, final: str = "z") -> list[Record]:
                return con.request(key, v1.encode_record(rec, registry), rec.seq, final=final)

            # B -> b
            (b,) = ask(BrokerRequest(dialect=d, opcode="B", seq=11), final="b")
            assert isinstance(b, BrokerResponse) and str(b.broker_id) == agent["uuid"]
            # P -> p... z
            replies = ask(PackageQuery(dialect=d, opcode="P", seq=12))
            assert [
                r.package for r in replies[:-1] if isinstance(r, PackageIndication)
            ] == ours.packages
            assert isinstance(replies[-1], CommandComplete) and replies[-1].code == 0
            # Q -> q... z
            replies = ask(ClassQuery(dialect=d, opcode="Q", seq=13, package=PKG))
            inds = [r for r in replies if isinstance(r, ClassIndication)]
            assert len(replies) == len(inds) + 1 and replies[-1].opcode == "z"
            assert [(i.class_name, i.schema_hash) for i in inds] == [
                (c.name, c.key.hash) for c in ours if c.package == PKG
            ]
            # S -> s for the classes we need, checked against the schema
            for name in ("queue", "broker", "clientConnect"):  # an event class too
                c = ours.get(PKG, name)
                (s,) = ask(
                    SchemaRequest(
                        dialect=d,
                        opcode="S",
                        seq=14,
                        package=PKG,
                        class_name=name,
                        schema_hash=c.key.hash,
                    ),
                    final="s",
                )
                assert isinstance(s, SchemaResponse) and s.schema == _as_sent(c.schema, d)
                assert s.schema.kind == c.schema.kind  # AM1: an event class, by the convention
                assert registry.get(c.key) == s.schema
            (z,) = ask(
                SchemaRequest(
                    dialect=d,
                    opcode="S",
                    seq=15,
                    package=PKG,
                    class_name="nope",
                    schema_hash=bytes(16),
                )
            )
            assert isinstance(z, CommandComplete) and (z.code, z.text) == (1, "Unknown class")
            # G -> g... z, values equal to what the manifest says was last published
            replies = ask(
                GetQuery(dialect=d, opcode="G", seq=16, query=TypedMap({"_class": "queue"}))
            )
            gs = [r for r in replies if isinstance(r, ObjectSample)]
            assert len(gs) == 6 and len(replies) == 7 and replies[-1].opcode == "z"
            # M: echo, purge, unknown method, unknown object
            replies = ask(
                GetQuery(dialect=d, opcode="G", seq=17, query=TypedMap({"_class": "broker"}))
            )
            (broker_obj,) = [r for r in replies if isinstance(r, ObjectSample)]
            bcls = ours.get(PKG, "broker")
            echo = next(m for m in bcls.schema.methods if m.name == "echo")
            raw = encode_arguments(d, echo.arguments, {"sequence": 42, "body": "hello-sim"})

            def method(seq: int, oid: Any, name: str, raw_args: bytes, cls: str) -> MethodResponse:
                c = ours.get(PKG, cls)
                key_fields: dict[str, Any] = (
                    {"package": PKG, "class_name": cls, "schema_hash": c.key.hash}
                    if d == "AM2"
                    else {}
                )
                req = MethodRequest(
                    dialect=d,
                    opcode="M",
                    seq=seq,
                    object_id=oid,
                    method_name=name,
                    raw_arguments=raw_args,
                    **key_fields,
                )
                (m,) = ask(req, final="m")
                assert isinstance(m, MethodResponse)
                return m

            m = method(18, broker_obj.object_id, "echo", raw, "broker")
            assert (m.status, m.text) == (0, "OK")
            assert decode_arguments(d, echo.arguments, m.raw_arguments) == {
                "sequence": 42,
                "body": "hello-sim",
            }
            deep = max(gs, key=lambda g: g.values["msgDepth"])
            assert deep.values["msgDepth"] > 0
            purge = next(x for x in ours.get(PKG, "queue").schema.methods if x.name == "purge")
            m = method(
                19,
                deep.object_id,
                "purge",
                encode_arguments(d, purge.arguments, {"request": 0, "filter": {}}),
                "queue",
            )
            assert (m.status, m.text, m.raw_arguments) == (0, "OK", b"")
            m = method(20, deep.object_id, "frobnicate", b"", "queue")
            assert (m.status, m.text) == (2, "UnknownMethod: frobnicate")
            oid = deep.object_id
            ghost: Any = (
                Am2ObjectId(oid.flags, oid.epoch, oid.broker_bank, oid.agent_bank, 999_999)
                if isinstance(oid, Am2ObjectId)
                else Am1ObjectId(oid.boot_seq, oid.bank, 999_999)  # type: ignore[union-attr]
            )
            m = method(
                21,
                ghost,
                "purge",
                encode_arguments(d, purge.arguments, {"request": 0, "filter": {}}),
                "queue",
            )
            assert (m.status, m.text) == (1, f"UnknownObject: {ghost}")
            # G by object id after the purge: depth 0, the purged messages counted
            query = {"_objectid": str(oid)} if d == "AM2" else {"_class": "queue"}
            replies = ask(GetQuery(dialect=d, opcode="G", seq=22, query=TypedMap(query)))
            (after,) = [r for r in replies if isinstance(r, ObjectSample) and r.object_id == oid]
            assert after.values["msgDepth"] == 0
            assert after.values["discardsPurge"] == deep.values["msgDepth"]
            assert (
                after.values["msgTotalDequeues"]
                == deep.values["msgTotalDequeues"] + deep.values["msgDepth"]
            )
    assert proc.returncode is not None
    rows = list(read_manifest(manifest))
    latest = _latest(rows)
    for g in gs:
        assert g.update_ns == START_NS + 3 * NS
        assert jsonable(g.values) == latest[str(g.object_id)]
    assert jsonable(broker_obj.values)["name"] == "amqp-broker"
    requests = [r for r in rows if r["kind"] == "request"]
    assert [(r["opcode"], r["seq"]) for r in requests] == [
        ("B", 11),
        ("P", 12),
        ("Q", 13),
        ("S", 14),
        ("S", 14),
        ("S", 14),
        ("S", 15),
        ("G", 16),
        ("G", 17),
        ("M", 18),
        ("M", 19),
        ("M", 20),
        ("M", 21),
        ("G", 22),
    ]
    replies_rows = [r for r in rows if r.get("source") == "reply"]
    assert sum(1 for r in replies_rows if r["seq"] == 16) == 7
    assert all(
        r["routing_key"] == con.reply_key and r["exchange"] == "amq.direct" for r in replies_rows
    )


@pytest.mark.parametrize("dialect", ["am1", "am2", "v2", "v2-amqp10"])
def test_raw_subscriber_decodes_exactly_the_manifest(
    broker: Any, tmp_path: Any, dialect: str
) -> None:
    manifest = str(tmp_path / "manifest.jsonl")
    args = [
        "--url",
        broker.url,
        "--dialect",
        dialect,
        "--intervals",
        "4",
        "--queues",
        "25",
        "--batch",
        "9",
        "--transients",
        "2",
        "--restart",
        "0:2",
        "--agents",
        "2",
        "--start-ns",
        str(START_NS),
        "--manifest",
        manifest,
        "--first-bank",
        str(random.randrange(1000, 1 << 20)),
        "--seed",  # a uuid of our own: other tests may run agents on this broker too
        str(random.randrange(1 << 30)),
    ]
    registry = default_schema().registry()
    with Subscriber(broker.url, SUBSCRIPTIONS[dialect]) as sub, sim_process(args) as (proc, ready):
        summary = finish(proc)
        match = _ours(dialect, ready, registry)
        msgs = sub.collect(until=summary["messages"], idle_s=2.0, max_s=60.0, match=match)
    rows = [r for r in read_manifest(manifest) if r.get("source") == "publish"]
    # v2-amqp10: every body an amqp-value (lists as amqp-sequence through RabbitMQ 3.x),
    # which a consumer sees AMQP 1.0 encoded and flagged; no app-id, as from qpidd
    flags = {m.application_properties.get("x-qmf-body-encoding") for m in msgs}
    assert flags == ({"amqp-1.0"} if dialect == "v2-amqp10" else {None})
    if dialect.startswith("v2"):
        assert {m.app_id for m in msgs} == ({None} if dialect == "v2-amqp10" else {"qmf2"})
    assert len({r["message"] for r in rows}) == summary["messages"]
    assert len(rows) == summary["records"]
    expected: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        expected.setdefault(r["message"], []).append(r)

    def stream(key: str) -> str:  # one queue per subscription: order is kept within each
        return "schema" if key.startswith("schema.") else "data"

    for name in ("schema", "data"):
        theirs = [m for m in sorted(expected) if stream(expected[m][0]["routing_key"]) == name]
        mine = [m for m in msgs if m.routing_key and stream(m.routing_key) == name]
        matched = 0
        for m in mine:
            if matched == len(theirs):
                break
            want = expected[theirs[matched]]
            try:
                recs = m.decode(registry)
            except ValueError:
                assert dialect == "am2", m.routing_key  # a stranger's AM2 message
                continue
            rows_got = [record_row(r) for r in recs]
            same = (
                m.routing_key == want[0]["routing_key"]
                and rows_got == [{k: w[k] for k in g} for g, w in zip(rows_got, want, strict=False)]
                and len(rows_got) == len(want)
            )
            if dialect != "am2":
                assert same, (m.routing_key, rows_got[:1], want[:1])
            matched += same
        assert matched == len(theirs)  # every published message arrived and decoded to its records
    kinds = {r["kind"] for r in rows}
    assert {"object", "event", "heartbeat"} <= kinds
    transients = [r for r in rows if r["kind"] == "object" and r["delete_ns"]]
    # queue + binding, 2 per interval, 4 intervals, 2 agents
    assert len({(r["agent"], r["object_id"]["oid"]) for r in transients}) == 2 * 2 * 4 * 2
    for r in transients:
        assert r["update_ns"] - NS < r["create_ns"] < r["delete_ns"] < r["update_ns"]


def test_transient_queue_over_the_broker_am2(broker: Any, tmp_path: Any) -> None:
    """Like qpidd: a short-lived queue shows as 'c' plus 'i', both with create and delete times."""
    manifest = str(tmp_path / "manifest.jsonl")
    args = [
        "--url",
        broker.url,
        "--dialect",
        "am2",
        "--intervals",
        "3",
        "--queues",
        "3",
        "--transients",
        "1",
        "--start-ns",
        str(START_NS),
        "--manifest",
        manifest,
        "--events",
        "0",
        "--first-bank",
        str(random.randrange(1000, 1 << 20)),
        "--seed",  # a uuid of our own: other tests may run agents on this broker too
        str(random.randrange(1 << 30)),
    ]
    registry = default_schema().registry()
    with (
        Subscriber(broker.url, ["/exchange/qpid.management/console.#"]) as sub,
        sim_process(args) as (proc, ready),
    ):
        summary = finish(proc)
        match = _ours("am2", ready, registry)
        msgs = sub.collect(until=summary["messages"], idle_s=2.0, max_s=60.0, match=match)
    recs = [r for m in msgs for r in m.decode(registry)]
    queues = [
        r for r in recs if isinstance(r, ObjectSample) and r.class_name == "queue" and r.delete_ns
    ]
    by_obj: dict[Any, list[ObjectSample]] = {}
    for r in queues:
        by_obj.setdefault(r.object_id, []).append(r)
    assert len(by_obj) == 3
    events = {
        (e.event_name, e.arguments["qName"]): e.timestamp_ns
        for e in recs
        if isinstance(e, Event) and e.event_name in ("queueDeclare", "queueDelete")
    }
    for k, (oid, samples) in enumerate(sorted(by_obj.items(), key=lambda kv: kv[1][0].create_ns)):
        assert [s.opcode for s in samples] == ["c", "i"]
        c, i = samples
        assert c.create_ns == i.create_ns and c.delete_ns == i.delete_ns
        assert (
            START_NS + k * NS < c.create_ns < c.delete_ns < START_NS + (k + 1) * NS == c.update_ns
        )
        name = c.values["name"]
        assert name == f"tmp.{k + 1:06d}"
        assert events[("queueDeclare", name)] == c.create_ns
        assert events[("queueDelete", name)] == c.delete_ns
        assert i.values["msgTotalEnqueues"] == i.values["msgTotalDequeues"] > 0
        assert isinstance(oid, Am2ObjectId) and oid.epoch == 1
    manifest_tmp = [
        r
        for r in read_manifest(manifest)
        if r.get("kind") == "object" and r["class_name"] == "queue" and r["delete_ns"]
    ]
    assert len(manifest_tmp) == 6


@pytest.mark.parametrize("dialect", ["v2", "v2-amqp10"])
def test_v2_console_locate_query_and_methods(broker: Any, tmp_path: Any, dialect: str) -> None:
    manifest = str(tmp_path / "manifest.jsonl")
    args = [
        "--url", broker.url, "--dialect", dialect, "--intervals", "2", "--queues", "4",
        "--start-ns", str(START_NS), "--serve", "90", "--manifest", manifest,
        "--seed", str(random.randrange(1 << 30)), "--no-broker-key",
    ]  # fmt: skip
    with sim_process(args) as (_proc, ready):
        name = ready["agents"][0]["v2_name"]
        registry = default_schema().registry()
        with Console(broker.url, registry) as con:
            (loc,) = con.request_v2(name, "_agent_locate_request", [])
            assert loc.opcode == "_agent_locate_response"
            assert jsonable(loc.body["_values"]["_name"]) == name  # type: ignore[attr-defined]
            sid = {"_class_name": "queue", "_package_name": PKG}
            replies = con.request_v2(name, "_query_request", {"_what": "OBJECT", "_schema_id": sid})
            assert len(replies) == 4
            assert all(
                isinstance(r, ObjectSample) and r.opcode == "_query_response" for r in replies
            )
            ids = con.request_v2(name, "_query_request", {"_what": "SCHEMA_ID"})
            assert [
                (r.class_name, r.schema_hash) for r in ids if isinstance(r, ClassIndication)
            ] == [(c.name, c.key.hash) for c in default_schema()]
            (broker_obj,) = con.request_v2(
                name,
                "_query_request",
                {"_what": "OBJECT", "_object_id": {"_object_name": f"{PKG}:broker:amqp-broker"}},
            )
            assert isinstance(broker_obj, ObjectSample)
            oid = {"_object_name": f"{PKG}:broker:amqp-broker"}
            (m,) = con.request_v2(
                name,
                "_method_request",
                {
                    "_object_id": oid,
                    "_method_name": "echo",
                    "_arguments": {"sequence": 7, "body": "hi"},
                },
            )
            assert isinstance(m, MethodResponse) and jsonable(m.arguments) == {
                "sequence": 7,
                "body": "hi",
            }
            (e,) = con.request_v2(
                name,
                "_method_request",
                {"_object_id": oid, "_method_name": "nope", "_arguments": {}},
            )
            assert e.kind == "exception" and (e.code, e.text) == (2, "UnknownMethod: nope")  # type: ignore[attr-defined]
            (e,) = con.request_v2(name, "_query_request", {"_what": "SCHEMA"})
            assert (e.code, e.text) == (1, "Query for _what => 'SCHEMA' not supported")  # type: ignore[attr-defined]
    rows = list(read_manifest(manifest))
    latest = _latest(rows)
    # qpidd: an object unchanged since its last publication keeps that update time
    updated = {r["object_id"]["oid"]: r["update_ns"] for r in rows
               if r["kind"] == "object" and r["source"] == "publish"}  # fmt: skip
    for r in replies:
        assert isinstance(r, ObjectSample) and isinstance(r.object_id, V2ObjectId)
        assert r.update_ns == updated[r.object_id.object_name] <= START_NS + 2 * NS
        assert jsonable(r.values) == latest[r.object_id.object_name]
    assert jsonable(broker_obj.values)["name"] == "amqp-broker"


def test_request_listener_reconnects_when_the_broker_closes_its_connection(
    isolated_broker: Any,
) -> None:
    """The soak's failure: RabbitMQ closed the busy simulator's request connection
    (missed heartbeats) and its next poll raised, ending the simulator. Here a broker
    restart closes it: polls report nothing while it is down, then reopen it, and
    requests sent after that are answered."""
    from pipeline import broker as qmf_broker
    from pipeline.sim.amqp import CommandListener

    url = qmf_broker.local_info(isolated_broker).url
    key = "agent.42"
    registry = SchemaRegistry()
    listener = CommandListener(
        url, [(f"/exchange/qpid.management/{key}", key)], registry, retry_s=0.2
    )

    def ask(seq: int) -> list[int]:
        with Console(url, registry) as con:
            con.send(key, v1.encode_record(BrokerRequest(dialect="AM2", opcode="B", seq=seq)))
            got: list[int] = []
            for _ in range(100):
                got += [r.record.seq for r in listener.poll(0.1)]
                if got:
                    break
            return got

    try:
        assert ask(1) == [1]
        qmf_broker.restart_broker(cfg=isolated_broker)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and listener.reconnects == 0:
            assert listener.poll(0.2) == []  # a lost connection is no error
        assert listener.reconnects == 1
        assert ask(2) == [2]
    finally:
        listener.close()
