"""The real qpidd capture: every count of the independent decoder's summary, byte-exact re-encoding."""

from __future__ import annotations

import json
import os

import pytest

from pipeline.codec.capture import CapturedMessage, read_capture
from pipeline.codec.message import encode_message
from pipeline.codec.records import Event, Heartbeat, ObjectSample
from pipeline.codec.schema import SchemaRegistry
from pipeline.codec.summary import Summary
from pipeline.codec.types import Am2ObjectId, V2ObjectId
from pipeline.codec.v2 import V2Encoded
from tests.codec.summary_ref import with_final_samples


@pytest.fixture(scope="module")
def sample(shared_dir: str) -> list[CapturedMessage]:
    return list(read_capture(os.path.join(shared_dir, "samples", "qpidd-capture-20s.jsonl")))


@pytest.fixture(scope="module")
def expected(shared_dir: str) -> dict[str, object]:
    with open(os.path.join(shared_dir, "samples", "qpidd-capture-20s.summary.json")) as f:
        data: dict[str, object] = json.load(f)
    return data


def test_summary_matches_every_decoding_count(
    sample: list[CapturedMessage], expected: dict[str, object]
) -> None:
    reg = SchemaRegistry()
    summary = Summary()
    for msg in sample:
        summary.add(msg, msg.decode(reg))
    got = summary.as_dict()
    assert got["decode_problems"] == 0
    assert got["messages"] == 863
    # every key the summary file has, except the routing-key classification (not decoding)
    assert set(expected) - set(got) == {"by_routing_key_pattern"}
    # ours: every content/event record of the sample decoded with a schema from the wire
    origins = got.pop("v1_schema_origin_by_class")
    assert origins and all(set(o) == {"wire"} for o in origins.values())
    assert sum(o["wire"] for o in origins.values()) == 320 + 575 + 37 + 144
    want = with_final_samples(expected)
    for key in got:
        assert got[key] == want[key], key


def test_every_message_reencodes_byte_for_byte(sample: list[CapturedMessage]) -> None:
    reg = SchemaRegistry()
    checked = 0
    for msg in sample:
        result = msg.decode(reg)
        assert result.problems == []
        if not result.records:  # an empty _query_response list: nothing to re-encode
            assert msg.body == b"\x00\x00\x00\x04\x00\x00\x00\x00"
            continue
        out = encode_message(result.records, reg)
        if isinstance(out, V2Encoded):
            assert (out.body, out.content_type) == (msg.body, msg.content_type)
            assert (
                out.application_properties["qmf.opcode"] == msg.application_properties["qmf.opcode"]
            )
        else:
            assert out == msg.body
        checked += 1
    assert checked == 861


def test_known_values_of_the_capture(sample: list[CapturedMessage]) -> None:
    reg = SchemaRegistry()
    results = [m.decode(reg) for m in sample]
    i, heartbeat = next(
        (i, r)
        for i, res in enumerate(results)
        for r in res.records
        if isinstance(r, Heartbeat) and r.dialect == "V2"
    )
    assert heartbeat.agent == "apache.org:qpidd:96e8ff02-7df9-4aaa-b0bd-0ef186095f23"
    at = sample[i].body.index(b"\n_timestamp\x32") + 12  # key, then uint64 (0x32)
    assert (
        heartbeat.timestamp_ns
        == int.from_bytes(sample[i].body[at : at + 8], "big")
        == 1795338152583027101
    )
    bind = next(
        r for res in results for r in res.records if isinstance(r, Event) and r.dialect == "AM2"
    )
    assert (bind.event_name, bind.severity, bind.timestamp_ns) == ("bind", 6, 0x18EA5289_99DF8581)
    assert bind.arguments["exName"] == "qpid.management"
    assert bind.arguments["qName"] == "cap-qpid.management-0b4aa0e2"
    broker_v2 = next(
        r
        for res in results
        for r in res.records
        if isinstance(r, ObjectSample) and r.dialect == "V2" and r.class_name == "broker"
    )
    assert broker_v2.object_id == V2ObjectId("org.apache.qpid.broker:broker:amqp-broker")
    queue_v1 = [
        r
        for res in results
        for r in res.records
        if isinstance(r, ObjectSample)
        and r.dialect == "AM2"
        and r.values.get("name") == "act-steady"
    ]
    assert queue_v1 and all(isinstance(r.object_id, Am2ObjectId) for r in queue_v1)
    assert {r.agent for r in queue_v1} == {"1.0"}
