"""Decoding simulator output offline: AM2 without schema responses, AM1 method replies.

Real qpidd sends schemas only when asked, and so does the AM2 simulator: its
capture holds 'p'/'q' indications but no 's'. `qmf decode` starts from a registry
seeded with qpid's management XML, so the capture decodes completely and equals
the manifest. AM1 method replies follow the spec's figure (status text str8) and
come out typed when the decoder has the request.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.cli import main
from pipeline.codec.methods import MethodContext
from pipeline.codec.records import MethodRequest, MethodResponse
from pipeline.codec.types import Am1ObjectId
from pipeline.codec.v1 import encode_record
from pipeline.qmfxml import default_schema
from pipeline.sim.amqp import Request
from pipeline.sim.capture import captured
from pipeline.sim.runner import MemorySink, SimConfig, Simulation
from tests.codec.vectors import s8, u32, v16

from .conftest import START_NS
from .test_runner import Scripted


def test_am2_capture_of_10000_queues_decodes_from_the_xml_seed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, manifest = str(tmp_path / "am2.jsonl"), str(tmp_path / "manifest.jsonl")
    args = ["--dialect", "am2", "--queues", "10000", "--intervals", "2"]
    assert main(["sim", "-o", out, "--manifest", manifest, *args, "--start-ns", str(START_NS)]) == 0
    sim = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(["decode", "--input", out, "--summary", "--check-manifest", manifest]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["decode_problems"] == 0 and got["messages"] == sim["messages"]
    assert got["manifest_check"] == {
        "decoded_records": sim["records"],
        "manifest_records": sim["records"],
        "mismatches": 0,
        "equal": True,
        "first_mismatch": None,
    }
    assert got["v1_schemas_captured"] == 0  # no schema response in the capture
    assert got["schemas"] == {
        "seed": "xml",
        "seeded_classes_used_as_is": 49,
        "classes_from_wire": 0,
        "wire_differs_from_seed": [],
    }
    queue = got["v1_schema_origin_by_class"]["org.apache.qpid.broker:queue"]
    assert queue == {"seed": got["v1_classes_in_content"]["org.apache.qpid.broker:queue"]}
    assert queue["seed"] >= 10000  # every queue's 'c' at least
    # without the seed: nothing but the indications and heartbeats decodes
    assert main(["decode", "--input", out, "--summary", "--schemas", "none"]) == 0
    bare = json.loads(capsys.readouterr().out)
    assert bare["decode_problems"] > 0
    assert {e.split(": ")[1] for e in bare["decode_problem_examples"]} == {"MissingSchema"}
    assert set(bare["v1_records_by_opcode"]) <= {"h", "p", "q"}


def test_am1_method_replies_follow_the_spec_and_type_with_context() -> None:
    """The simulator's AM1 'm': status, status text as str8 (spec figure "Method Response"),
    then broker.echo's bidirectional arguments (sequence uint32, body str16)."""
    sink = MemorySink()
    sim = Simulation(SimConfig(dialect="am1", intervals=2, start_ns=START_NS), sink)
    agent = sim.agents[0]
    args = u32(4242) + v16("hello")
    sent: list[MethodRequest] = []

    class AfterBoot(Scripted):
        """Hands out the requests at the second poll, once the broker object exists."""

        def poll(self, timeout_s: float) -> list[Any]:
            if sent or not agent.model.broker_num:
                return []
            # the broker is persistent: boot sequence 0 in its id (the spec, qpidd)
            oid = Am1ObjectId(0, agent.agent_bank, agent.model.broker_num)
            for seq, name, raw in ((21, "echo", args), (22, "nope", b"")):
                sent.append(
                    MethodRequest(
                        dialect="AM1",
                        opcode="M",
                        seq=seq,
                        object_id=oid,
                        method_name=name,
                        raw_arguments=raw,
                    )
                )
            self.pending = [Request("broker", r, "/exchange/amq.direct/r1") for r in sent]
            return super().poll(timeout_s)

    sim.requests = AfterBoot([])
    sim.run()
    echo = sent[0]
    oid = echo.object_id
    replies = [m for m in sink.messages if m.exchange == "amq.direct"]
    assert [bytes(m.body) for m in replies] == [
        b"AM1m" + u32(21) + u32(0) + s8("OK") + args,
        b"AM1m" + u32(22) + u32(2) + s8("UnknownMethod: nope"),  # no arguments after an error
    ]
    # decoded in order with a context: the objects' samples, the request, then the reply
    reg = default_schema().registry()
    ctx = MethodContext()
    for m in sink.messages:
        if m.exchange != "amq.direct":
            assert captured(m, 0).decode(reg, ctx).problems == []
    ctx.observe(echo)
    ok, err = (captured(m, 0).decode(reg, ctx).records[0] for m in replies)
    assert isinstance(ok, MethodResponse) and isinstance(err, MethodResponse)
    assert (ok.status, ok.text, ok.arguments, ok.raw_arguments) == (
        0,
        "OK",
        {"sequence": 4242, "body": "hello"},
        args,
    )
    assert (ok.method_name, ok.class_name, ok.object_id) == ("echo", "broker", oid)
    assert (err.status, err.text, err.arguments, err.raw_arguments) == (
        2,
        "UnknownMethod: nope",
        None,
        b"",
    )
    assert encode_record(ok, reg) == bytes(replies[0].body)
