"""The simulator without a broker: dynamics, restarts, transients, bounds, determinism, load."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from pipeline.codec.records import ConsoleAdded, Event, Heartbeat, ObjectSample, Record
from pipeline.codec.types import Am1ObjectId, Am2ObjectId
from pipeline.qmfxml import default_schema
from pipeline.sim.capture import captured
from pipeline.sim.manifest import record_row
from pipeline.sim.model import NS, LoadConfig
from pipeline.sim.runner import MemorySink, SimConfig, Simulation

from .conftest import START_NS


def run(**kw: Any) -> tuple[Simulation, MemorySink]:
    load = kw.pop("load", LoadConfig(queues=10))
    sink = MemorySink()
    sim = Simulation(SimConfig(start_ns=START_NS, load=load, **kw), sink)
    sim.run()
    return sim, sink


def decoded(sink: MemorySink) -> list[tuple[int, Record]]:
    reg = default_schema().registry()
    out: list[tuple[int, Record]] = []
    for i, m in enumerate(sink.messages):
        res = captured(m, 0).decode(reg)
        assert res.ok, res.problems
        out.extend((i, r) for r in res.records)
    return out


@pytest.mark.parametrize("dialect", ["am1", "am2", "v2"])
def test_decoded_messages_are_exactly_the_manifest(dialect: str) -> None:
    sim, sink = run(dialect=dialect, intervals=4, batch=7, restarts=[(0, 2)])
    got = decoded(sink)
    rows = [r for r in sim.manifest.rows if r.get("source") == "publish"]
    assert len(got) == len(rows) == sim.summary.records
    for (i, rec), row in zip(got, rows, strict=True):
        assert i == row["message"]
        assert sink.messages[i].routing_key == row["routing_key"]
        assert record_row(rec) == {k: row[k] for k in record_row(rec)}


def queue_samples(sim: Simulation, sink: MemorySink, name: str, opcode: str) -> list[ObjectSample]:
    out = []
    for _, r in decoded(sink):
        if isinstance(r, ObjectSample) and r.class_name == "queue" and r.opcode == opcode:
            nums = {
                o.object_num
                for o in sim.agents[0].model.objects.values()
                if o.props.get("name") == name
            }
            assert r.object_id is not None
            if getattr(r.object_id, "object_num", None) in nums:
                out.append(r)
    return out


def test_queue_dynamics_counters_depth_and_watermarks() -> None:
    sim, sink = run(
        dialect="am2",
        intervals=6,
        load=LoadConfig(queues=12, active_fraction=1.0, watermark_prob=0.5),
    )
    model = sim.agents[0].model
    names = [
        model.objects[n].props["name"]
        for n in model.queue_nums
        if not model.objects[n].props["name"].startswith("tmp")
    ]
    blips = 0
    for name in names:
        samples = queue_samples(sim, sink, name, "i")
        assert len(samples) == 6  # active queues change every interval
        assert [s.update_ns for s in samples] == [START_NS + (k + 1) * NS for k in range(6)]
        prev = -1
        for s in samples:
            v = s.values
            assert v["msgTotalEnqueues"] >= prev
            prev = v["msgTotalEnqueues"]
            assert v["msgDepth"] == v["msgTotalEnqueues"] - v["msgTotalDequeues"] >= 0
            assert v["byteDepth"] == v["byteTotalEnqueues"] - v["byteTotalDequeues"]
            assert v["acquires"] == v["msgTotalDequeues"]
            assert v["consumerCountLow"] <= v["consumerCount"] <= v["consumerCountHigh"]
            assert v["consumerCountHigh"] - v["consumerCount"] in (0, 1)
            blips += v["consumerCountHigh"] - v["consumerCount"]
    assert blips > 0  # some consumer came and went inside an interval
    broker = model.objects[model.broker_num].stats
    # the broker's totals: its queues', the deleted (transient) ones' included
    assert model.retired["msgTotalEnqueues"] > 0
    assert broker["msgTotalEnqueues"] == model.retired["msgTotalEnqueues"] + sum(
        model.objects[n].stats["msgTotalEnqueues"] for n in model.queue_nums
    )


def test_idle_objects_are_published_once_and_again_after_console_added() -> None:
    sink = MemorySink()
    sim = Simulation(
        SimConfig(
            dialect="am1",
            intervals=3,
            start_ns=START_NS,
            load=LoadConfig(
                queues=6,
                active_fraction=0.0,
                watermark_prob=0.0,
                events_per_interval=0,
                transient_per_interval=0,
            ),
        ),
        sink,
    )
    sim.run()
    rows = sim.manifest.rows
    per_interval = [
        sum(
            1
            for r in rows
            if r["kind"] == "object" and r["class_name"] == "queue" and r["interval"] == k
        )
        for k in range(3)
    ]
    assert per_interval == [12, 0, 0]  # 'c' + 'i' of 6 queues, then nothing changed
    agent = sim.agents[0]
    assert agent.handle(ConsoleAdded(dialect="AM1", opcode="x"), 0) == []
    assert agent.force_all and agent.send_schema
    pubs = sim._publication(agent, START_NS + 4 * NS, [])
    queue = [
        p for p in pubs if isinstance(p.record, ObjectSample) and p.record.class_name == "queue"
    ]
    assert sorted(p.record.opcode for p in queue) == ["c"] * 6 + ["i"] * 6
    # the schema broadcast again: every class and event class (AM1 carries events too)
    assert sum(1 for p in pubs if p.record.opcode == "s") == len(default_schema()) == 49
    assert sim._publication(agent, START_NS + 5 * NS, [])[-1].record.opcode == "h"  # then quiet
    assert len(sim._publication(agent, START_NS + 6 * NS, [])) == 1


def test_restart_changes_boot_sequence_and_restarts_counters() -> None:
    sim, sink = run(
        dialect="am2",
        intervals=4,
        restarts=[(0, 2)],
        load=LoadConfig(queues=5, active_fraction=1.0, max_rate=20.0),
    )
    restarts = [r for r in sim.manifest.rows if r["kind"] == "restart"]
    assert restarts == [
        {
            "kind": "restart",
            "agent": "1.1",
            "agent_uuid": str(sim.agents[0].uuid),
            "interval": 2,
            "timestamp_ns": START_NS + 2 * NS + NS // 2,
            "old_boot_seq": 1,
            "boot_seq": 2,
        }
    ]
    stats = [
        r
        for _, r in decoded(sink)
        if isinstance(r, ObjectSample) and r.class_name == "queue" and r.opcode == "i"
    ]
    before = [
        s
        for s in stats
        if isinstance(s.object_id, Am2ObjectId) and s.object_id.epoch == 1 and s.delete_ns == 0
    ]
    after = [s for s in stats if isinstance(s.object_id, Am2ObjectId) and s.object_id.epoch == 2]
    assert before and after
    first_after = [s for s in after if s.update_ns == START_NS + 3 * NS and s.delete_ns == 0]
    for s in first_after:
        assert s.create_ns == START_NS + 2 * NS + NS // 2
    late = max(s.values["msgTotalEnqueues"] for s in before if s.update_ns == START_NS + 2 * NS)
    early = [
        s.values["msgTotalEnqueues"]
        for s in after
        if s.update_ns == START_NS + 3 * NS and s.delete_ns == 0
    ]
    assert late > 20 and max(early) <= 20  # counters start from zero again


def test_transient_objects_are_published_with_both_timestamps() -> None:
    for dialect in ("am1", "am2", "v2"):
        _sim, sink = run(
            dialect=dialect, intervals=3, load=LoadConfig(queues=4, transient_per_interval=2)
        )
        recs = [r for _, r in decoded(sink)]
        tmp = [
            r
            for r in recs
            if isinstance(r, ObjectSample) and r.class_name == "queue" and r.delete_ns
        ]
        per_obj: dict[Any, list[ObjectSample]] = {}
        for r in tmp:
            per_obj.setdefault(r.object_id, []).append(r)
        assert len(per_obj) == 6
        for samples in per_obj.values():
            opcodes = sorted(s.opcode for s in samples)
            assert opcodes == (["_data_indication"] if dialect == "v2" else ["c", "i"])
            for s in samples:
                k = (s.update_ns - START_NS) // NS - 1
                assert (
                    START_NS + k * NS
                    < s.create_ns
                    < s.delete_ns
                    < s.update_ns
                    == START_NS + (k + 1) * NS
                )
                assert str(s.values.get("name", "tmp")).startswith("tmp") or s.opcode == "i"
                assert s.values.get("msgTotalEnqueues", 1) > 0
        events = [
            r
            for r in recs
            if isinstance(r, Event) and r.event_name in ("queueDeclare", "queueDelete")
        ]
        assert len(events) == 12
        declared = sorted(e.timestamp_ns for e in events if e.event_name == "queueDeclare")
        assert declared == sorted({s.create_ns for s in tmp})


def test_same_seed_same_bytes_other_seed_other_bytes() -> None:
    a = run(dialect="am2", intervals=3, seed=7)[1].messages
    b = run(dialect="am2", intervals=3, seed=7)[1].messages
    c = run(dialect="am2", intervals=3, seed=8)[1].messages
    assert [m.body for m in a] == [m.body for m in b]
    assert [m.body for m in a] != [m.body for m in c]


def test_max_messages_bounds_the_run_and_the_manifest() -> None:
    sim, sink = run(dialect="am1", intervals=50, max_messages=17)
    assert len(sink.messages) == 17
    assert sim.summary.stopped_by == "max_messages"
    assert {r["message"] for r in sim.manifest.rows if "message" in r} == set(range(17))
    assert len(decoded(sink)) == sim.summary.records


def test_heartbeats_and_batching() -> None:
    _sim, sink = run(dialect="am2", intervals=2, batch=5, load=LoadConfig(queues=30))
    recs = decoded(sink)
    hbs = [r for _, r in recs if isinstance(r, Heartbeat)]
    assert [h.timestamp_ns for h in hbs] == [START_NS + NS, START_NS + 2 * NS]
    per_msg: dict[int, int] = {}
    for i, _ in recs:
        per_msg[i] = per_msg.get(i, 0) + 1
    assert max(per_msg.values()) == 5
    assert sink.messages[-1].routing_key == "console.heartbeat.1.0"


def test_am1_keys_and_ids() -> None:
    sim, sink = run(dialect="am1", intervals=1)
    agent = sim.agents[0]
    keys = {m.routing_key for m in sink.messages}
    u = agent.uuid
    assert f"mgmt.{u}.prop.org.apache.qpid.broker.queue" in keys
    assert f"mgmt.{u}.stat.org.apache.qpid.broker.queue" in keys
    assert f"mgmt.{u}.event.org.apache.qpid.broker.queueDeclare.info" in keys
    assert f"mgmt.{u}.heartbeat" in keys
    assert f"mgmt.{u}.schema.org.apache.qpid.broker.queue" in keys
    samples = [r for _, r in decoded(sink) if isinstance(r, ObjectSample)]
    # the spec: a persistent object's id has boot sequence 0 (qpidd's start-up objects)
    seqs: dict[int, set[tuple[str, Any]]] = {0: set(), 1: set()}
    for s in samples:
        assert isinstance(s.object_id, Am1ObjectId) and s.object_id.bank == 1
        if s.delete_ns:  # a transient queue or binding: gone from the model
            assert s.object_id.boot_seq == 1
            continue
        o = agent.model.objects[s.object_id.object_num]
        seqs[s.object_id.boot_seq].add((o.class_name, o.props.get("name")))
    assert seqs[0] == {
        ("system", None),
        ("broker", "amqp-broker"),
        ("vhost", "/"),
        *(("exchange", f"amq.{x}") for x in ("direct", "topic", "fanout", "match")),
    }
    assert {("memory", "amqp-broker"), ("exchange", ""), ("queue", "q00000")} <= seqs[1]
    assert all(s.agent == str(u) for s in samples)


def test_multiple_agents_have_their_own_identity() -> None:
    sim, sink = run(dialect="am2", agents=3, intervals=1)
    assert len({a.uuid for a in sim.agents}) == 3
    assert [a.command_keys for a in sim.agents] == [["broker", "agent.1"], ["agent.2"], ["agent.3"]]
    banks = {
        r.object_id.agent_bank
        for _, r in decoded(sink)
        if isinstance(r, ObjectSample) and isinstance(r.object_id, Am2ObjectId)
    }
    assert banks == {1, 2, 3}


def test_ten_thousand_queues() -> None:
    sim, sink = run(
        dialect="am2",
        intervals=1,
        load=LoadConfig(queues=10_000, connections=50, transient_per_interval=0),
    )
    queue_c = sum(
        1
        for r in sim.manifest.rows
        if r["kind"] == "object" and r["class_name"] == "queue" and r["opcode"] == "c"
    )
    assert queue_c == 10_000
    assert max(len(m.body) for m in sink.messages) < 400_000
    assert sim.summary.messages == len(sink.messages)


def test_manifest_lists_creates_and_deletes() -> None:
    load = LoadConfig(queues=5, transient_per_interval=1, connections=2)
    sim, _ = run(dialect="am2", intervals=3, restarts=[(0, 1)], load=load)
    rows = sim.manifest.rows
    creates = [r for r in rows if r["kind"] == "create"]
    deletes = [r for r in rows if r["kind"] == "delete"]
    model = sim.agents[0].model
    live = len(model.objects)
    # boot objects twice (boot, restart) + 3 transient queues with their bindings
    transient_objs = {(r["object_id"]["oid"]) for r in deletes}
    assert len(creates) == 2 * live + len(transient_objs)
    assert {r["class_name"] for r in deletes} == {"queue", "binding"}
    assert all(r["object_name"].startswith("org.apache.qpid.broker:") for r in creates)
    for d in deletes:
        (c,) = [r for r in creates if r["object_id"] == d["object_id"]]
        assert c["interval"] == d["interval"] and c["timestamp_ns"] < d["timestamp_ns"]
    objects = [r for r in rows if r["kind"] == "object"]
    # a start-up object keeps its id (epoch 0) across the restart, with a new create time
    first = {(r["object_id"]["oid"], r["create_ns"]): r for r in reversed(objects)}
    assert all((c["object_id"]["oid"], c["timestamp_ns"]) in first for c in creates)
    same_id = {c["object_id"]["oid"] for c in creates if c["interval"] == 0} & {
        c["object_id"]["oid"] for c in creates if c["interval"] == 1
    }
    assert {oid.split("-")[1] for oid in same_id} == {"0"}
    assert len(same_id) == 7  # system, broker, vhost, amq.direct/topic/fanout/match


def test_run_to_a_capture_file_closes_everything(tmp_path: Any) -> None:
    from pipeline.codec.capture import read_capture
    from pipeline.sim.manifest import read_manifest
    from pipeline.sim.runner import CaptureSink, run_to

    cap, man = str(tmp_path / "c.jsonl"), str(tmp_path / "m.jsonl")
    summary, manifest = run_to(
        SimConfig(dialect="v2", intervals=2, start_ns=START_NS), CaptureSink(cap), man
    )
    assert manifest.count == len(list(read_manifest(man))) and manifest.rows == []
    msgs = list(read_capture(cap))
    assert len(msgs) == summary.messages
    assert {m.subject for m in msgs} == {m.routing_key for m in msgs}
    assert all(m.properties["app_id"] == "qmf2" for m in msgs)


class Scripted:
    """A RequestSource that hands out a fixed list of requests once."""

    def __init__(self, requests: list[Any]) -> None:
        self.pending = requests

    def poll(self, timeout_s: float) -> list[Any]:
        out, self.pending = self.pending, []
        return out

    def close(self) -> None:
        pass


def test_bad_requests_get_error_replies_and_the_run_goes_on() -> None:
    from pipeline.codec.records import GetQuery, MethodRequest
    from pipeline.sim.amqp import Request

    sink = MemorySink()
    sim = Simulation(SimConfig(dialect="am1", intervals=2, start_ns=START_NS), sink)
    bank = sim.agents[0].agent_bank
    bad_args = MethodRequest(
        dialect="AM1",
        opcode="M",
        seq=5,
        object_id=Am1ObjectId(0, bank, 2),  # the broker: persistent, boot sequence 0
        method_name="echo",
        raw_arguments=b"\x00",
    )
    broken = GetQuery(dialect="AM1", opcode="G", seq=6, query=None)  # type: ignore[arg-type]
    sim.requests = Scripted(
        [Request("broker", bad_args, "/exchange/amq.direct/r1"), Request("agent.1", broken, "r2")]
    )
    sim.run()
    assert sim.summary.intervals == 2 and sim.summary.replies == 2
    replies = [m for m in sink.messages if m.exchange == "amq.direct"]
    assert [m.routing_key for m in replies] == ["r1", "r2"]
    reg = default_schema().registry()
    (m,) = captured(replies[0], 0).decode(reg).records
    assert (m.opcode, m.seq, m.status) == ("m", 5, 4)  # type: ignore[attr-defined]
    assert m.text.startswith("InvalidParameter: ")  # type: ignore[attr-defined]
    (z,) = captured(replies[1], 0).decode(reg).records
    assert (z.opcode, z.seq, z.code) == ("z", 6, 7)  # type: ignore[attr-defined]
    assert z.text.startswith("Exception: AttributeError")  # type: ignore[attr-defined]


def test_exchange_binding_watermark_remembers_a_transient_binding() -> None:
    sim, sink = run(dialect="am2", intervals=3, load=LoadConfig(queues=8, transient_per_interval=1))
    default_ex = [
        r
        for _, r in decoded(sink)
        if isinstance(r, ObjectSample)
        and r.class_name == "exchange"
        and r.opcode == "i"
        and r.object_id is not None
        and getattr(r.object_id, "object_num", None) == sim.agents[0].model.exchanges[""]
    ]
    assert len(default_ex) == 3
    for r in default_ex:  # 8 queues bound; a ninth binding came and went inside each interval
        v = r.values
        assert (v["bindingCount"], v["bindingCountLow"], v["bindingCountHigh"]) == (8, 8, 9)


def test_a_stopped_agent_goes_silent_and_a_stalled_queue_fills() -> None:
    """``stops``: from its interval the agent publishes nothing (no heartbeat either);
    the other agent goes on. ``stalls``: the first busy queue with a consumer keeps its
    enqueues, dequeues nothing more and shows no consumer, so its depth grows."""
    sim, _sink = run(
        dialect="am2", agents=2, intervals=6, stops=[(1, 3)], stalls=[(0, 2)],
        load=LoadConfig(queues=6, active_fraction=1.0, max_rate=20.0, events_per_interval=0),
    )  # fmt: skip
    faults = [r for r in sim.manifest.rows if r["kind"] in ("stop", "stall")]
    a0, a1 = sim.agents
    assert faults == [
        {"kind": "stall", "agent": a0.record_agent, "agent_uuid": str(a0.uuid), "interval": 2,
         "queue": "q00000"},
        {"kind": "stop", "agent": a1.record_agent, "agent_uuid": str(a1.uuid), "interval": 3},
    ]  # fmt: skip
    assert (sim.summary.stops, sim.summary.stalls) == (1, 1)
    # The heartbeats sent (the manifest is exactly what was sent: tested above), per agent.
    beats = [(r["agent_uuid"], r["timestamp_ns"]) for r in sim.manifest.rows
             if r.get("source") == "publish" and r["kind"] == "heartbeat"]  # fmt: skip
    ends = [START_NS + (i + 1) * NS for i in range(6)]
    assert [t for u, t in beats if u == str(a0.uuid)] == ends
    assert [t for u, t in beats if u == str(a1.uuid)] == ends[:3]  # intervals 0-2
    # The stalled queue (agent 0's q00000) by interval end: dequeues frozen from the
    # stall's interval on, enqueues going on, no consumer.
    rows = [r for r in sim.manifest.rows if r.get("source") == "publish"
            and r["kind"] == "object" and r["agent_uuid"] == str(a0.uuid)]  # fmt: skip
    (oid,) = {str(r["object_id"]) for r in rows if r["values"].get("name") == "q00000"}
    stats = {r["update_ns"]: r["values"] for r in rows
             if r["opcode"] == "i" and str(r["object_id"]) == oid}  # fmt: skip
    deq = [stats[t]["msgTotalDequeues"] for t in ends]
    enq = [stats[t]["msgTotalEnqueues"] for t in ends]
    assert deq[2:] == [deq[1]] * 4 and deq[1] > deq[0] > 0
    assert all(b > a for a, b in itertools.pairwise(enq))
    assert [stats[t]["consumerCount"] for t in ends] == [1, 1, 0, 0, 0, 0]
    depth = [stats[t]["msgDepth"] for t in ends]
    assert all(b > a for a, b in itertools.pairwise(depth[1:]))
    # Once three intervals' worth of enqueues more than at the stall, the queue raises
    # queueThresholdExceeded (warn), once, with its depth then.
    raised = [(r["interval"], r["severity"], r["values"]) for r in sim.manifest.rows
              if r.get("source") == "publish" and r["kind"] == "event"
              and r["class_name"] == "queueThresholdExceeded"]  # fmt: skip
    [(at, severity, values)] = raised
    assert severity == 4 and values["qName"] == "q00000" and at > 2
    assert values["msgDepth"] == depth[at] and depth[at - 1] < values["msgDepth"]


def test_signalled_faults_come_at_the_first_interval_after_the_signal() -> None:
    """``SIGNALLED``: the fault waits for ``signal_faults`` (qmf sim: SIGUSR1), then comes at
    the next interval; none comes without it."""
    from pipeline.sim.runner import SIGNALLED

    load = LoadConfig(queues=4, active_fraction=1.0, events_per_interval=0)
    sink = MemorySink()
    sim = Simulation(SimConfig(start_ns=START_NS, load=load, agents=2, intervals=5,
                               stops=[(0, SIGNALLED)]), sink)  # fmt: skip
    real = sim._dynamics

    def dynamics(agent: Any, interval: int, t0: int, loaded: bool) -> Any:
        if interval == 1:
            sim.signal_faults()  # during interval 1: the stop comes with interval 2
        return real(agent, interval, t0, loaded)

    sim._dynamics = dynamics  # type: ignore[method-assign]
    sim.run()
    assert [r["interval"] for r in sim.manifest.rows if r["kind"] == "stop"] == [2]
    quiet, _ = run(agents=2, intervals=5, stops=[(0, SIGNALLED)])
    assert not [r for r in quiet.manifest.rows if r["kind"] == "stop"]
    with pytest.raises(ValueError, match=r"--stop 2:1: the agent must be 0\.\.1"):
        SimConfig(agents=2, stops=[(2, 1)]).validate()
