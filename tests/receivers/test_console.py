"""The receiver's console role: pure decisions, then against the simulator on the broker."""

from __future__ import annotations

import json
import random
import struct
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pipeline.codec import v1, v2
from pipeline.codec.message import decode_message
from pipeline.codec.records import (
    BrokerResponse,
    ClassIndication,
    ClassQuery,
    GetQuery,
    Heartbeat,
    PackageIndication,
    PackageQuery,
    SchemaRequest,
    SchemaResponse,
    V2Message,
)
from pipeline.codec.schema import ClassSchema, Element, SchemaKey, SchemaRegistry
from pipeline.codec.seed import seeded_registry
from pipeline.sim.manifest import jsonable, read_manifest, record_row
from pipeline.sim.runner import MemorySink, SimConfig, Simulation
from receivers.config import BrokerConfig
from receivers.console import (
    BROKER_PACKAGE,
    ConsoleConfig,
    ConsoleRequest,
    ConsoleRole,
    format_refresh_classes,
    parse_refresh_classes,
    peek_class_key,
)
from receivers.landing import LandedMessage
from receivers.receiver import LandingSink, ReceiverConfig
from receivers.schema_wants import SchemaWants
from tests.receivers.test_receiver_broker import REPO, landed_table, run_receiver_thread, wait_for

H1 = bytes(range(16))
KEY = SchemaKey("org.apache.qpid.broker", "queue", H1)


def msg(body: bytes) -> LandedMessage:
    return LandedMessage(body=body, routing_key="console.obj.1.0.org.apache.qpid.broker.queue")


def content_body(key: SchemaKey, opcode: bytes = b"c", magic: bytes = b"AM2") -> bytes:
    """A content record header and class key, then bytes the console never reads."""
    p, n = key.package.encode(), key.name.encode()
    return (
        magic + opcode + struct.pack(">I", 9)
        + bytes([len(p)]) + p + bytes([len(n)]) + n + key.hash + b"\x00" * 40
    )  # fmt: skip


def decode(body: bytes) -> list[Any]:
    return decode_message(body, registry=SchemaRegistry()).records


def test_connect_asks_the_broker_then_packages_then_classes_then_schemas() -> None:
    c = ConsoleRole(ConsoleConfig(dialect="AM2", command_key="agent.7"))
    [req] = c.on_connected()
    assert (req.target, req.key, req.body) == (
        "/exchange/qpid.management",
        "agent.7",
        b"AM2B\x00\x00\x00\x01",
    )
    b = v1.encode_record(
        BrokerResponse(dialect="AM2", opcode="b", seq=1, broker_id=uuid.UUID(int=5))
    )
    [req] = c.observe(msg(b))
    assert decode(req.body) == [PackageQuery(dialect="AM2", opcode="P", seq=2)]
    p = v1.encode_record(
        PackageIndication(dialect="AM2", opcode="p", seq=2, package="org.apache.qpid.broker")
    )
    [req] = c.observe(msg(p))
    assert decode(req.body) == [
        ClassQuery(dialect="AM2", opcode="Q", seq=3, package="org.apache.qpid.broker")
    ]
    assert c.observe(msg(p)) == []  # a package is queried once per connection
    q = v1.encode_record(
        ClassIndication(dialect="AM2", opcode="q", seq=3, class_kind=1, package=KEY.package,
                        class_name=KEY.name, schema_hash=KEY.hash)
    )  # fmt: skip
    [req] = c.observe(msg(q))
    assert decode(req.body) == [
        SchemaRequest(dialect="AM2", opcode="S", seq=4, package=KEY.package, class_name="queue",
                      schema_hash=H1)
    ]  # fmt: skip
    assert c.observe(msg(q)) == []  # asked already
    assert c.sent == {"B": 1, "P": 1, "Q": 1, "S": 1}


def test_unseen_content_hash_triggers_one_schema_request_with_bounded_retries() -> None:
    # refresh off: its G queries, due after the 'i' publication, are tested on their own
    c = ConsoleRole(ConsoleConfig(dialect="AM1", retry_s=30.0, max_attempts=2, refresh_s=0))
    assert peek_class_key(content_body(KEY, b"i", b"AM1")) == KEY
    [req] = c.observe(msg(content_body(KEY, b"i", b"AM1")), now=100.0)
    assert req.key == "broker"
    [s] = decode(req.body)
    assert (s.opcode, s.dialect, s.package, s.class_name, s.schema_hash) == (
        "S", "AM1", KEY.package, KEY.name, H1,
    )  # fmt: skip
    assert c.observe(msg(content_body(KEY, b"g", b"AM1")), now=101.0) == []
    assert c.due(now=129.0) == []
    assert len(c.due(now=130.0)) == 1  # second attempt
    assert c.due(now=200.0) == []  # max_attempts reached
    # a schema response makes the key known: no more requests for it
    schema = ClassSchema(key=KEY, properties=(Element("name", 7, access=3, index=True),))
    s_body = v1.encode_record(v1.schema_response_for(schema, "AM1", seq=2))
    assert c.observe(msg(s_body)) == []
    assert c.known == {KEY} and c.asked == {}
    assert c.observe(msg(content_body(KEY, b"c", b"AM1"))) == []


def test_a_wanted_schema_is_asked_again_after_the_console_gave_up(tmp_path: Path) -> None:
    """Silver lists what parked messages wait for; the console re-arms given-up requests."""
    wants = SchemaWants(tmp_path / "wants")
    c = ConsoleRole(ConsoleConfig(dialect="AM1", retry_s=30.0, max_attempts=1, refresh_s=0,
                                  wants=str(wants.folder), wants_poll_s=5.0))  # fmt: skip
    assert len(c.observe(msg(content_body(KEY, b"i", b"AM1")), now=100.0)) == 1
    assert c.due(now=200.0) == []  # one attempt allowed: given up, nothing wanted yet
    other = SchemaKey("org.test", "widget", b"\x02" * 16)  # never seen by this console
    assert wants.want([KEY, other]) == 2 and wants.want([KEY]) == 0
    assert sorted(f.name for f in wants.folder.iterdir()) == [
        "org.apache.qpid.broker--queue--" + H1.hex() + ".want",
        "org.test--widget--" + "02" * 16 + ".want",
    ]
    asked = [decode(r.body)[0] for r in c.due(now=205.0)]
    assert sorted((s.package, s.class_name, s.schema_hash) for s in asked) == [
        (KEY.package, "queue", H1),
        ("org.test", "widget", b"\x02" * 16),
    ]
    assert c.due(now=207.0) == []  # the folder is read every wants_poll_s
    assert c.due(now=220.0) == []  # both asked 15 s ago: within retry_s
    assert len(c.due(now=236.0)) == 2  # given up again, still wanted: asked again
    schema = ClassSchema(key=KEY, properties=(Element("name", 7, access=3, index=True),))
    c.observe(msg(v1.encode_record(v1.schema_response_for(schema, "AM1", seq=9))), now=237.0)
    assert wants.pending() == [other]  # the answer withdraws its want
    assert [decode(r.body)[0].class_name for r in c.due(now=270.0)] == ["widget"]


def test_non_v1_and_broken_messages_cost_nothing() -> None:
    c = ConsoleRole(ConsoleConfig())
    assert c.observe(msg(b"")) == []
    assert c.observe(msg(b"\x00\x00\x01\x4e" * 10)) == []  # a v2 list body
    assert c.observe(msg(b"AM2c\x00\x00\x00\x01\x05ab")) == []  # truncated class key
    assert c.observe(msg(b"AM2z\x00\x00\x00\x01\x00")) == []  # truncated 'z': ignored
    assert c.sent == {}


def test_addressing_per_preset() -> None:
    r = ConsoleRole(ConsoleConfig(reply_key="k1"), "rabbitmq")
    assert (r.reply_source, r.reply_filter, r.reply_to, r.request_target) == (
        "/exchange/amq.direct/k1", None, "/exchange/amq.direct/k1", "/exchange/qpid.management",
    )  # fmt: skip
    q = ConsoleRole(ConsoleConfig(reply_key="k1"), "qpidd")
    assert (q.reply_source, q.reply_filter, q.reply_to, q.request_target) == (
        "amq.direct", "k1", "amq.direct/k1", "qpid.management",
    )  # fmt: skip
    with pytest.raises(ValueError, match="AM1 or AM2"):
        ConsoleConfig(dialect="V2")


AGENT = "apache.org:qpidd:4a9c5a3e-0b59-4f7e-9d55-1f0b7b2c6d01"
OTHER = "apache.org:qpidd:5d0c8a1b-77e2-4c1a-8c34-2b9e0f6a7c02"
WATCHED = [(BROKER_PACKAGE, "queue"), (BROKER_PACKAGE, "exchange"), (BROKER_PACKAGE, "broker")]


def v2_heartbeat(name: str, *, named: bool = True, encoding: str = "0-10") -> LandedMessage:
    """A v2 heartbeat as the receiver lands it; ``named=False``: no ``qmf.agent`` property,
    the name only in ``_values._name``."""
    hb = Heartbeat(dialect="V2", opcode="_agent_heartbeat_indication", timestamp_ns=1, agent=name,
                   attributes={"_heartbeat_interval": 10, "_epoch": 1})  # fmt: skip
    enc = v2.encode_v2([hb], encoding=encoding)
    props = {k: str(v) for k, v in enc.application_properties.items() if named or k != "qmf.agent"}
    return LandedMessage(enc.body, f"agent.ind.heartbeat.{name}", content_type=enc.content_type,
                         application_properties=props, app_id="qmf2")  # fmt: skip


def v1_heartbeat(dialect: str = "AM2") -> LandedMessage:
    hb = Heartbeat(dialect=dialect, opcode="h", seq=0, timestamp_ns=1)
    return LandedMessage(v1.encode_record(hb), "console.heartbeat.1.0")


def v2_query(req: ConsoleRequest) -> Any:
    """The body of a v2 request, decoded back by the codec (one ``_query_request`` map)."""
    res = decode_message(req.body, registry=SchemaRegistry(), content_type=req.content_type,
                         application_properties=req.properties)  # fmt: skip
    assert res.problems == [] and res.dialect == "V2"
    [rec] = res.records
    assert isinstance(rec, V2Message) and rec.opcode == "_query_request"
    return rec.body


def v1_get(req: ConsoleRequest) -> Any:
    [rec] = decode(req.body)
    assert isinstance(rec, GetQuery)
    return rec


def test_refresh_queries_each_v2_agent_by_its_own_name_from_the_timer() -> None:
    """A v2 heartbeat makes its agent known; ``due`` then sends one OBJECT query per watched
    class to that agent's own name every ``refresh_s``, and nothing from the delivery path."""
    c = ConsoleRole(ConsoleConfig(reply_key="k1", refresh_s=20.0), "rabbitmq")
    assert c.due(now=0.0) == []
    assert c.observe(v2_heartbeat(AGENT), now=100.0) == []
    reqs = c.due(now=100.0)
    assert [(r.target, r.key, r.reply_to, r.content_type) for r in reqs] == [
        ("/exchange/qmf.default.direct", AGENT, "/exchange/amq.direct/k1", "amqp/map")
    ] * 3
    assert [r.correlation_id for r in reqs] == ["k1-1", "k1-2", "k1-3"]
    assert all(r.properties == {"method": "request", "qmf.opcode": "_query_request",
                                "x-amqp-0-10.app-id": "qmf2"} for r in reqs)  # fmt: skip
    assert [v2_query(r) for r in reqs] == [
        {"_schema_id": {"_class_name": name, "_package_name": package}, "_what": "OBJECT"}
        for package, name in WATCHED
    ]
    assert c.observe(v2_heartbeat(AGENT), now=110.0) == []  # heard again: same schedule
    assert c.due(now=119.9) == []
    assert [r.key for r in c.due(now=120.0)] == [AGENT] * 3
    # qpidd over AMQP 1.0, its name in the body only: known by that name
    assert c.observe(v2_heartbeat(OTHER, named=False, encoding="amqp-1.0"), now=125.0) == []
    assert [(r.key, v2_query(r)["_schema_id"]["_class_name"]) for r in c.due(now=125.0)] == [
        (OTHER, "queue"), (OTHER, "exchange"), (OTHER, "broker"),
    ]  # fmt: skip
    assert sorted(c.v2_agents) == sorted([AGENT, OTHER]) and c.sent == {"_query_request": 9}
    # an agent silent for forget_s (300 s) is no longer asked; one still heard is
    c.observe(v2_heartbeat(OTHER), now=400.0)
    assert [r.key for r in c.due(now=410.5)] == [OTHER] * 3
    assert list(c.v2_agents) == [OTHER]
    # their answers are counted, not answered
    answer = LandedMessage(b"", "k1", application_properties={"qmf.opcode": "_query_response"})
    assert c.observe(answer) == [] and c.refreshed == {"_query_response": 1}


def test_refresh_gets_every_class_by_v1_while_v1_publications_come() -> None:
    """v1 publications ('c', 'i', 'e', 'h': not the 'g' answers) start a G per class to
    the command key, in the console's dialect, on the console's exchange (qpidd addressing)."""
    classes = parse_refresh_classes("queue,org.example:widget")
    cfg = ConsoleConfig(dialect="AM2", command_key="agent.7", reply_key="k1", refresh_s=20.0,
                        refresh_classes=classes, retry_s=1000.0)  # fmt: skip
    c = ConsoleRole(cfg, "qpidd")
    c.observe(msg(content_body(KEY, b"g")), now=10.0)  # an answer: asks S, starts no refresh
    assert c.v1_heard is None and c.refreshed == {"g": 1}
    assert [decode(r.body)[0].opcode for r in c.due(now=10.0)] == []
    assert c.observe(v1_heartbeat(), now=50.0) == []
    reqs = c.due(now=50.0)
    assert [(r.target, r.key, r.reply_to, r.properties, r.correlation_id) for r in reqs] == [
        ("qpid.management", "agent.7", "amq.direct/k1", {}, None)
    ] * 2
    gets = [v1_get(r) for r in reqs]
    assert [(g.dialect, g.opcode, g.query) for g in gets] == [
        ("AM2", "G", {"_class": "queue", "_package": BROKER_PACKAGE}),
        ("AM2", "G", {"_class": "widget", "_package": "org.example"}),
    ]
    assert [g.seq for g in gets] == [2, 3]  # after the S the 'g' asked for
    assert c.due(now=69.0) == []
    c.observe(msg(content_body(KEY, b"i")), now=300.0)  # content keeps it going
    assert [v1_get(r).query["_class"] for r in c.due(now=70.0)] == ["queue", "widget"]
    assert len(c.due(now=600.0)) == 2  # 300 s after the last publication: still heard
    assert c.due(now=620.5) == [] and c.v1_heard is None  # more than 300 s: stopped
    assert c.sent == {"S": 1, "G": 6}


def test_refresh_off_sends_nothing_and_a_qpidd_with_both_gets_both() -> None:
    off = ConsoleRole(ConsoleConfig(refresh_s=0), "qpidd")
    for m in (v1_heartbeat(), v2_heartbeat(AGENT)):
        assert off.observe(m, now=1.0) == []
    assert [off.due(now=t) for t in (1.0, 21.0, 1000.0)] == [[], [], []] and off.sent == {}
    both = ConsoleRole(ConsoleConfig(reply_key="k2"), "qpidd")
    assert both.config.refresh_s == 20.0  # the default
    both.observe(v1_heartbeat(), now=1.0)
    both.observe(v2_heartbeat(AGENT), now=1.0)
    reqs = both.due(now=1.0)
    assert [(r.target, r.key, r.reply_to) for r in reqs] == [
        ("qpid.management", "broker", "amq.direct/k2")
    ] * 3 + [("qmf.default.direct", AGENT, "amq.direct/k2")] * 3
    assert [v1_get(r).query["_class"] for r in reqs[:3]] == ["queue", "exchange", "broker"]
    assert [v2_query(r)["_schema_id"]["_class_name"] for r in reqs[3:]] == [
        "queue", "exchange", "broker",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="0 \\(off\\) or more"):
        ConsoleConfig(refresh_s=-1)


def test_refresh_classes_text() -> None:
    assert parse_refresh_classes("queue, org.example:widget queue,exchange") == (
        (BROKER_PACKAGE, "queue"), ("org.example", "widget"), (BROKER_PACKAGE, "exchange"),
    )  # fmt: skip
    assert format_refresh_classes(parse_refresh_classes("queue,org.example:widget")) == (
        "queue,org.example:widget"
    )
    assert parse_refresh_classes("") == ()
    for bad in (":queue", "org.example:"):
        with pytest.raises(ValueError, match="PACKAGE:CLASS or CLASS"):
            parse_refresh_classes(bad)


@pytest.mark.broker
def test_receiver_fetches_schemas_an_agent_broadcast_before_it_started(
    broker: Any, tmp_path: Path
) -> None:
    bank = random.randrange(20_000, 60_000)
    out = tmp_path / "sim.out"
    with open(out, "wb") as f:
        sim = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "sim", "--url", broker.url, "--dialect", "am2",
             "--agents", "1", "--queues", "3", "--intervals", "1", "--serve", "90",
             "--first-bank", str(bank), "--no-broker-key", "--seed", str(bank)],
            cwd=REPO, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        wait_for(lambda: '"ready": true' in out.read_text(), 60, "the simulator")
        tag = uuid.uuid4().hex[:8]
        cfg = ReceiverConfig(
            broker=BrokerConfig(urls=(broker.url,)),
            # content of other tests' agents must not reach this receiver: bind nothing
            bindings=(("qpid.management", f"nothing.{tag}.#"),),
            console=ConsoleConfig(dialect="AM2", command_key=f"agent.{bank}"),
        )
        root = tmp_path / "landing"
        r = run_receiver_thread(cfg, LandingSink(root, "p0"))
        console = r.console
        assert console is not None
        try:

            def all_answered() -> bool:
                z = console.replies.get("z", 0)
                asked = console.packages_asked
                return bool(asked) and z == 1 + len(asked) and not console.asked

            wait_for(all_answered, 90, "answers to B, P, every Q and every S")
        finally:
            r.stop()
    finally:
        sim.kill()
        sim.wait(30)
    bodies = landed_table(root).column("body").to_pylist()
    registry = SchemaRegistry()
    records = []
    for b in bodies:
        res = decode_message(b, registry=registry)
        assert res.problems == []
        records.extend(res.records)
    ops = Counter(rec.opcode for rec in records)
    q_keys = {SchemaKey(x.package, x.class_name, x.schema_hash) for x in records
              if isinstance(x, ClassIndication)}  # fmt: skip
    s_keys = {x.schema.key for x in records if isinstance(x, SchemaResponse)}
    assert ops["b"] == 1 and ops["p"] == len(console.packages_asked) > 0
    assert q_keys and s_keys == q_keys == console.known
    assert ops["s"] == ops["q"] == len(q_keys)
    assert {k.package for k in q_keys} == console.packages_asked
    assert json.loads(out.read_text().splitlines()[0])["ready"] is True


@pytest.mark.parametrize("sample", ["default-60s", "qmf1-qmf2-60s"])
def test_console_on_real_qpidd_amqp10_traffic_knows_every_v2_schema(
    shared_dir: str, sample: str
) -> None:
    """The qpidd preset's console against what a real qpidd answered (captured with
    --console), QMF v1 off in the first sample: B, P, Q per package and S per class go
    out, the 45 schema responses come back, the v2 amqp-value messages ask for nothing,
    and every schema id in the v2 data and events is among the schemas fetched."""
    from pipeline.codec.capture import read_capture
    from receivers.publisher import amqp_value

    c = ConsoleRole(ConsoleConfig(), "qpidd")
    assert (c.reply_source, c.request_target) == ("amq.direct", "qpid.management")
    sent = [r.body for r in c.on_connected()]
    v2_keys: set[SchemaKey] = set()
    v2_requests = 0
    path = Path(shared_dir) / "samples" / "qpidd-amqp10" / f"{sample}.jsonl"
    for m in read_capture(path):
        props = {k: str(v) for k, v in m.application_properties.items()}
        asked = c.observe(LandedMessage(m.body, m.routing_key, application_properties=props), 0.0)
        sent += [r.body for r in asked]
        if props.get("x-qmf-body-encoding") == "amqp-1.0":
            v2_requests += len(asked)
            value = amqp_value(m.body)
            for item in value if isinstance(value, list) else [value]:
                sid = item.get("_schema_id")
                if sid is not None:
                    v2_keys.add(SchemaKey(sid["_package_name"].decode(),
                                          sid["_class_name"].decode(), sid["_hash"].bytes))  # fmt: skip
    assert v2_requests == 0
    assert c.sent == {"B": 1, "P": 1, "Q": 2, "S": 45}
    assert c.replies == {"b": 1, "p": 2, "q": 45, "s": 45, "z": 3}
    assert len(sent) == 49 and not c.asked
    assert len(c.known) == 45 and len(v2_keys) == 20
    assert v2_keys <= c.known


def _answers(root: Path, registry: SchemaRegistry) -> list[tuple[dict[str, Any], list[Any]]]:
    """The refresh answers landed (v2 ``_query_response``, v1 'g'), each with its records
    decoded by the codec from the landed row alone (nothing may be left undecoded)."""
    if not root.exists():
        return []
    out = []
    for row in landed_table(root).to_pylist():
        props = dict(row["application_properties"] or [])
        if props.get("qmf.opcode") != "_query_response" and row["body"][3:4] != b"g":
            continue
        res = decode_message(row["body"], registry=registry, application_properties=props,
                             content_type=row["content_type"], app_id=row["app_id"],
                             routing_key=row["routing_key"])  # fmt: skip
        assert res.problems == [], res.problems
        out.append((row, res.records))
    return out


def _requests_per_class(answers: list[tuple[dict[str, Any], list[Any]]]) -> Counter[str]:
    """How many distinct queries (v2 correlation id, v1 seq) were answered, per class."""
    queries = {
        (r.class_name, row["correlation_id"] or r.seq) for row, recs in answers for r in recs
    }
    return Counter(c for c, _ in queries)


@pytest.mark.broker
@pytest.mark.parametrize(
    ("dialect", "refresh"),
    [("v2", 1.0), ("v2-amqp10", 1.0), ("am2", 1.0), ("v2", 0.0), ("am2", 0.0)],
)
def test_refresh_lands_the_agents_current_objects(
    broker: Any, tmp_path: Path, dialect: str, refresh: float
) -> None:
    """``--console-refresh 1`` against a simulated agent the receiver hears (v2: its
    heartbeats, named by the seed; AM2: the v1 heartbeats): the landed answers name the
    agent (v2 ``qmf.agent``), decode, and equal what the simulator's manifest says it
    answered; those given after its last interval carry the queues' final counts as last
    published. With refresh 0 the agent, serving 3 s after its heartbeats, is asked nothing."""
    bank = random.randrange(20_000, 60_000)
    seed = random.randrange(1 << 30)
    intervals = 3
    agent = Simulation(SimConfig(dialect=dialect, seed=seed, first_bank=bank, broker_key=False),
                       MemorySink()).agents[0]  # the agent the sim will run: never started  # fmt: skip
    v2_agent = dialect.startswith("v2")
    heartbeats = (
        ("qmf.default.topic", agent.heartbeat_key) if v2_agent
        else ("qpid.management", "console.heartbeat.1.0")  # AM2's is everyone's key
    )  # fmt: skip
    cfg = ReceiverConfig(
        broker=BrokerConfig(urls=(broker.url,)),
        bindings=(heartbeats,),
        console=ConsoleConfig(dialect="AM2", command_key=f"agent.{bank}", refresh_s=refresh),
    )
    root = tmp_path / "landing"
    manifest = tmp_path / "manifest.jsonl"
    r = run_receiver_thread(cfg, LandingSink(root, "p0"))
    console = r.console
    assert console is not None
    registry = seeded_registry()  # the sim's schemas are qpid's: 'g' decodes without 's'
    out = tmp_path / "sim.out"
    with open(out, "wb") as f:
        sim = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "sim", "--url", broker.url, "--dialect", dialect,
             "--agents", "1", "--queues", "4", "--active-fraction", "1", "--transients", "0",
             "--events", "0", "--intervals", str(intervals), "--serve", "60" if refresh else "3",
             "--manifest", str(manifest), "--first-bank", str(bank), "--no-broker-key",
             "--seed", str(seed)],
            cwd=REPO, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    classes = {"queue", "exchange", "broker"}
    try:
        if refresh:
            seen: dict[str, Any] = {"landed": -1, "done": False}

            def three_rounds_answered() -> bool:  # decoded again only when more landed
                if r.stats.landed != seen["landed"]:
                    seen["landed"] = r.stats.landed
                    per_class = _requests_per_class(_answers(root, registry))
                    seen["done"] = all(per_class[c] >= 3 for c in classes)
                return bool(seen["done"])

            wait_for(three_rounds_answered, 90, "three refresh rounds answered for every class")
        else:
            assert sim.wait(120) == 0, out.read_text()[-2000:]
        heard = (lambda: agent.v2_name in console.v2_agents) if v2_agent else (
            lambda: console.v1_heard is not None)  # fmt: skip
        wait_for(heard, 30, "the agent's heartbeats")
    finally:
        r.stop()
        sim.terminate()  # SIGTERM: the simulator closes its manifest
        sim.wait(30)
    answers = _answers(root, registry)
    rows = list(read_manifest(str(manifest)))
    requests = Counter(x["opcode"] for x in rows if x["kind"] == "request")
    query = "_query_request" if v2_agent else "G"
    if not refresh:
        assert answers == [] and console.refreshed == {} and query not in console.sent
        assert requests.get(query, 0) == 0
        return
    assert console.sent[query] >= 3 * len(classes) and requests[query] >= 3 * len(classes)
    # every landed answer is, record for record, a reply the simulator's manifest lists
    replies: dict[int, list[dict[str, Any]]] = {}
    for x in rows:
        if x.get("source") == "reply" and x["kind"] == "object":
            replies.setdefault(x["message"], []).append(x)
    answered: list[list[dict[str, Any]]] = list(replies.values())
    last: dict[str, dict[str, Any]] = {}  # each object's values in the last answer landed
    for row, recs in answers:
        got = [record_row(rec) for rec in recs]
        assert any(
            len(m) == len(got)
            and all(g == {k: w[k] for k in g} for g, w in zip(got, m, strict=True))
            for m in answered
        ), (row["routing_key"], got[:1])
        if v2_agent:
            assert dict(row["application_properties"])["qmf.agent"] == agent.v2_name  # not "broker"
            assert row["correlation_id"].startswith(console.config.reply_key)
        for rec in recs:
            last[jsonable(rec.object_id)["oid"]] = jsonable(rec.values)
    # the last answers carry what the agent holds at the end (its manifest's "final" lines,
    # published or not): every object of the watched classes, every statistic exact
    final = {
        x["object_id"]["oid"]: x for x in rows if x["kind"] == "final" and x["reason"] == "end"
    }
    watched = {oid for oid, x in final.items() if x["class_name"] in classes}
    assert {final[oid]["class_name"] for oid in watched} == classes
    assert set(last) == watched
    for oid in watched:
        want = final[oid]["values"]
        assert {k: last[oid][k] for k in want} == want, oid
    queues = [oid for oid in watched if final[oid]["class_name"] == "queue"]
    assert len(queues) == 4 and all(last[oid]["msgTotalEnqueues"] > 0 for oid in queues)
