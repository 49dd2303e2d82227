"""The agent behind qpidd's alias ``broker``: named by the receiver, taken by the codec."""

from __future__ import annotations

import collections
import os

import pyarrow as pa
import pyarrow.compute

from pipeline.codec.capture import read_capture
from pipeline.codec.seed import seeded_registry
from pipeline.codec.v2 import AGENT_NAME_PROPERTY
from pipeline.codec.vectorized import decode_content
from receivers.aliases import AliasNamer
from receivers.landing import LandedMessage, message_key, to_table

QPIDD = "apache.org:qpidd:96e8ff02-7df9-4aaa-b0bd-0ef186095f23"


def landed(props: dict[str, str], body: bytes = b"x") -> LandedMessage:
    return LandedMessage(body=body, application_properties=props)


def test_an_alias_reply_is_named_only_while_one_agent_heartbeats() -> None:
    n = AliasNamer(forget_s=300.0)
    reply = landed({"qmf.agent": "broker", "qmf.opcode": "_query_response"})
    beat_a = landed({"qmf.agent": "a", "qmf.opcode": "_agent_heartbeat_indication"})
    assert n.name_all([reply], 0.0) == [reply]  # no agent heard yet: left as sent
    # A heartbeat later in the same flush group names it (another exchange, another order).
    got = n.name_all([reply, beat_a], 1.0)
    assert got[1] is beat_a
    assert dict(got[0].application_properties) == {**reply.application_properties, AGENT_NAME_PROPERTY: "a"}
    # Its key is the key of what the broker sent: a redelivery matches the first copy.
    assert message_key(got[0]) == message_key(reply)
    assert n.name_all([reply], 2.0)[0] == got[0]  # heard before: named
    beat_b = landed({"qmf.agent": "b", "qmf.opcode": "_agent_heartbeat_indication"})
    assert n.name_all([beat_b, reply], 3.0)[1] is reply  # two agents: ambiguous, as sent
    assert dict(n.name_all([reply], 302.0)[0].application_properties)[AGENT_NAME_PROPERTY] == "b"
    data = landed({"qmf.agent": "a", "qmf.opcode": "_data_indication"})
    assert n.name_all([data], 5.0)[0] is data
    assert n.named == 3


def test_the_20s_sample_replies_decode_under_qpidds_own_agent(shared_dir: str) -> None:
    """The 20 s sample's 96 query-response objects (21 replies; with 10 other replies, all ``qmf.agent: broker``)
    come after qpidd's heartbeats: named, both decoders give them qpidd's agent."""
    msgs = list(read_capture(os.path.join(shared_dir, "samples", "qpidd-capture-20s.jsonl")))
    n = AliasNamer()
    out = n.name_all([
        LandedMessage(body=m.body, routing_key=m.routing_key, content_type=m.content_type,
                      application_properties={k: str(v) for k, v in m.application_properties.items()})
        for m in msgs
    ], 0.0)  # fmt: skip
    assert n.named == 31  # 21 query responses, 9 method responses, 1 exception
    per_record: collections.Counter[tuple[str, str | None]] = collections.Counter()
    reg = seeded_registry()
    from pipeline.codec.message import decode_message

    for m in out:
        res = decode_message(m.body, registry=reg, application_properties=m.application_properties,
                             content_type=m.content_type, routing_key=m.routing_key)  # fmt: skip
        for r in res.records:
            if type(r).__name__ == "ObjectSample" and r.dialect == "V2":
                per_record[(r.opcode, r.agent)] += 1
    assert per_record == {("_data_indication", QPIDD): 604, ("_query_response", QPIDD): 96}
    # The vectorized decode (silver's) reads the same agent from the landed rows.
    res = decode_content(to_table("p0", 0, out), seeded_registry(), compact=True)
    t = res.table
    assert t is not None
    v2 = t.filter(pa.compute.equal(t["dialect"], "V2"))
    assert collections.Counter(v2["agent"].to_pylist()) == {QPIDD: 700}
