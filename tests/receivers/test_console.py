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

from pipeline.codec import v1
from pipeline.codec.message import decode_message
from pipeline.codec.records import (
    BrokerResponse,
    ClassIndication,
    ClassQuery,
    PackageIndication,
    PackageQuery,
    SchemaRequest,
    SchemaResponse,
)
from pipeline.codec.schema import ClassSchema, Element, SchemaKey, SchemaRegistry
from receivers.config import BrokerConfig
from receivers.console import ConsoleConfig, ConsoleRole, peek_class_key
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
    [(key, body)] = c.on_connected()
    assert key == "agent.7" and body == b"AM2B\x00\x00\x00\x01"
    b = v1.encode_record(
        BrokerResponse(dialect="AM2", opcode="b", seq=1, broker_id=uuid.UUID(int=5))
    )
    [(key, body)] = c.observe(msg(b))
    assert decode(body) == [PackageQuery(dialect="AM2", opcode="P", seq=2)]
    p = v1.encode_record(
        PackageIndication(dialect="AM2", opcode="p", seq=2, package="org.apache.qpid.broker")
    )
    [(key, body)] = c.observe(msg(p))
    assert decode(body) == [
        ClassQuery(dialect="AM2", opcode="Q", seq=3, package="org.apache.qpid.broker")
    ]
    assert c.observe(msg(p)) == []  # a package is queried once per connection
    q = v1.encode_record(
        ClassIndication(dialect="AM2", opcode="q", seq=3, class_kind=1, package=KEY.package,
                        class_name=KEY.name, schema_hash=KEY.hash)
    )  # fmt: skip
    [(key, body)] = c.observe(msg(q))
    assert decode(body) == [
        SchemaRequest(dialect="AM2", opcode="S", seq=4, package=KEY.package, class_name="queue",
                      schema_hash=H1)
    ]  # fmt: skip
    assert c.observe(msg(q)) == []  # asked already
    assert c.sent == {"B": 1, "P": 1, "Q": 1, "S": 1}


def test_unseen_content_hash_triggers_one_schema_request_with_bounded_retries() -> None:
    c = ConsoleRole(ConsoleConfig(dialect="AM1", retry_s=30.0, max_attempts=2))
    assert peek_class_key(content_body(KEY, b"i", b"AM1")) == KEY
    [(key, body)] = c.observe(msg(content_body(KEY, b"i", b"AM1")), now=100.0)
    assert key == "broker"
    [s] = decode(body)
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
    c = ConsoleRole(ConsoleConfig(dialect="AM1", retry_s=30.0, max_attempts=1,
                                  wants=str(wants.folder), wants_poll_s=5.0))  # fmt: skip
    assert len(c.observe(msg(content_body(KEY, b"i", b"AM1")), now=100.0)) == 1
    assert c.due(now=200.0) == []  # one attempt allowed: given up, nothing wanted yet
    other = SchemaKey("org.test", "widget", b"\x02" * 16)  # never seen by this console
    assert wants.want([KEY, other]) == 2 and wants.want([KEY]) == 0
    assert sorted(f.name for f in wants.folder.iterdir()) == [
        "org.apache.qpid.broker--queue--" + H1.hex() + ".want",
        "org.test--widget--" + "02" * 16 + ".want",
    ]
    asked = [decode(body)[0] for _, body in c.due(now=205.0)]
    assert sorted((s.package, s.class_name, s.schema_hash) for s in asked) == [
        (KEY.package, "queue", H1), ("org.test", "widget", b"\x02" * 16)
    ]
    assert c.due(now=207.0) == []  # the folder is read every wants_poll_s
    assert c.due(now=220.0) == []  # both asked 15 s ago: within retry_s
    assert len(c.due(now=236.0)) == 2  # given up again, still wanted: asked again
    schema = ClassSchema(key=KEY, properties=(Element("name", 7, access=3, index=True),))
    c.observe(msg(v1.encode_record(v1.schema_response_for(schema, "AM1", seq=9))), now=237.0)
    assert wants.pending() == [other]  # the answer withdraws its want
    assert [decode(b)[0].class_name for _, b in c.due(now=270.0)] == ["widget"]


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
    sent = [b for _, b in c.on_connected()]
    v2_keys: set[SchemaKey] = set()
    v2_requests = 0
    path = Path(shared_dir) / "samples" / "qpidd-amqp10" / f"{sample}.jsonl"
    for m in read_capture(path):
        props = {k: str(v) for k, v in m.application_properties.items()}
        asked = c.observe(LandedMessage(m.body, m.routing_key, application_properties=props), 0.0)
        sent += [b for _, b in asked]
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
