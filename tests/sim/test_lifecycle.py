"""The simulator as a real qpidd 1.40 behaves in three cases, and the manifest's ``final`` lines.

- Deleted objects (``--short-lived``): the last record carries the delete time and the
  final counters but the update time of the object's previous publication (qpidd encodes
  a deleted object without setting its update time).
- Restarts: start-up objects (system, broker, vhost, durable exchanges) keep epoch 0 in
  their ids, everything gets a new create time at the restart, counters start at zero.
- A console's query (v1 'G', v2 ``_query_request`` OBJECT) clears the changed flags of
  what it returns (qpid's generated ``writeStatistics``/``mapEncodeValues``): the next
  periodic publication skips those objects unless they change again after it.

Everything is decoded through the codec from the messages the simulator sent.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from pipeline.codec.records import (
    Event,
    GetQuery,
    MethodRequest,
    MethodResponse,
    ObjectSample,
    Record,
    V2Message,
)
from pipeline.codec.types import Am1ObjectId, Am2ObjectId, TypedMap, V2ObjectId
from pipeline.qmfxml import default_schema
from pipeline.sim.agent import V2Requests
from pipeline.sim.amqp import Request
from pipeline.sim.capture import captured
from pipeline.sim.manifest import jsonable
from pipeline.sim.model import NS, PKG, LoadConfig, SimObject, counters_of
from pipeline.sim.runner import MemorySink, SimConfig, Simulation
from pipeline.sim.wire import encode_arguments
from receivers.publisher import amqp_value

from .conftest import START_NS

DIALECTS = ["am1", "am2", "v2", "v2-amqp10"]
QUIET: dict[str, Any] = {
    "transient_per_interval": 0,
    "events_per_interval": 0,
    "watermark_prob": 0.0,
}


def run(requests: Any = None, **kw: Any) -> tuple[Simulation, MemorySink]:
    load = kw.pop("load", LoadConfig(queues=4))
    sink = MemorySink()
    sim = Simulation(SimConfig(start_ns=START_NS, load=load, **kw), sink, requests=requests)
    sim.run()
    return sim, sink


def decoded(sink: MemorySink, replies: bool = False) -> list[Record]:
    """The records of the published messages (or of the replies), through the codec."""
    reg = default_schema().registry()
    out: list[Record] = []
    for m in sink.messages:
        if (m.exchange == "amq.direct") != replies:
            continue
        res = captured(m, 0).decode(reg)
        assert res.ok, res.problems
        out.extend(res.records)
    return out


def samples(sink: MemorySink, replies: bool = False) -> list[ObjectSample]:
    return [r for r in decoded(sink, replies) if isinstance(r, ObjectSample)]


def ident(r: ObjectSample) -> tuple[str, int]:
    """An object's identity across records: its id and create time (ids can come back)."""
    return jsonable(r.object_id)["oid"], r.create_ns


def interval_of(update_ns: int) -> int:
    return (update_ns - START_NS) // NS - 1


def finals(sim: Simulation, reason: str) -> dict[tuple[str, int], dict[str, Any]]:
    rows = [r for r in sim.manifest.rows if r["kind"] == "final" and r["reason"] == reason]
    out = {(r["object_id"]["oid"], r["create_ns"]): r for r in rows}
    assert len(out) == len(rows)
    return out


def stats_of(r: ObjectSample, final: dict[str, Any]) -> dict[str, Any]:
    """The record's statistics (a v2 map holds the properties too), in manifest form."""
    return {k: jsonable(r.values[k]) for k in final["values"]}


# ---------------------------------------------------------------- deleted objects


@pytest.mark.parametrize("dialect", DIALECTS)
def test_short_lived_queue_last_record_has_stale_update_time_and_final_counters(
    dialect: str,
) -> None:
    load = LoadConfig(queues=3, short_lived_per_interval=2, short_lived_intervals=3, **QUIET)
    sim, sink = run(dialect=dialect, intervals=8, load=load)
    recs = samples(sink)
    by_obj: dict[tuple[str, int], list[ObjectSample]] = defaultdict(list)
    names: dict[tuple[str, int], str] = {}
    for r in recs:
        by_obj[ident(r)].append(r)
        if "name" in r.values:
            names[ident(r)] = str(r.values["name"])
    queues = sorted(
        (k for k, n in names.items() if n.startswith("sl.") and by_obj[k][0].class_name == "queue"),
        key=lambda k: names[k],
    )
    assert [names[k] for k in queues] == [f"sl.{n:06d}" for n in range(1, 17)]  # 2 x 8
    deleted_finals = finals(sim, "deleted")
    end_finals = finals(sim, "end")
    events = [r for r in decoded(sink) if isinstance(r, Event)]
    declares = {str(e.arguments["qName"]): e.timestamp_ns for e in events
                if e.event_name == "queueDeclare"}  # fmt: skip
    deletes = {str(e.arguments["qName"]): e.timestamp_ns for e in events
               if e.event_name == "queueDelete"}  # fmt: skip
    stat_opcodes = {"i", "_data_indication"}
    for n, key in enumerate(queues):
        created_in = n // 2
        rs = by_obj[key]
        create_ns = key[1]
        assert START_NS + created_in * NS < create_ns < START_NS + (created_in + 1) * NS
        assert declares[names[key]] == create_ns
        # published every interval it lived (it has traffic): one statistics record each
        stat_intervals = [interval_of(r.update_ns) for r in rs if r.opcode in stat_opcodes
                          and not r.delete_ns]  # fmt: skip
        if created_in + 3 > 7:  # still alive at the end of the run
            assert stat_intervals == list(range(created_in, 8))
            assert all(r.delete_ns == 0 for r in rs)
            final = end_finals[key]
            assert final["delete_ns"] == 0
            assert final["values"] == stats_of(rs[-1], final)
            continue
        assert stat_intervals == list(range(created_in, created_in + 3))
        last = [r for r in rs if r.delete_ns]
        before = [r for r in rs if not r.delete_ns]
        deleted_in = created_in + 3
        # the deleted record: properties always ('c'), statistics (they changed); one v2 map
        assert sorted(r.opcode for r in last) == (
            ["_data_indication"] if dialect.startswith("v2") else ["c", "i"]
        )
        for r in last:
            assert START_NS + deleted_in * NS < r.delete_ns < START_NS + (deleted_in + 1) * NS
            assert r.delete_ns > r.update_ns  # a stale update time ...
            assert r.update_ns == before[-1].update_ns  # ... the previous publication's
            assert r.update_ns == START_NS + deleted_in * NS
        # published in the deletion interval's message, whatever its update time says
        rows = [row for row in sim.manifest.rows if row["kind"] == "object"
                and (row["object_id"]["oid"], row["create_ns"]) == key and row["delete_ns"]]  # fmt: skip
        assert {row["interval"] for row in rows} == {deleted_in}
        (stat,) = [r for r in last if r.opcode in stat_opcodes]
        final = deleted_finals[key]
        assert (final["delete_ns"], final["create_ns"]) == (stat.delete_ns, create_ns)
        assert final["update_ns"] == stat.update_ns
        assert final["values"] == stats_of(stat, final)  # the final counters, exactly
        v = final["values"]
        assert v["msgDepth"] == 0 and v["msgTotalEnqueues"] == v["msgTotalDequeues"] > 0
        assert v["msgTotalEnqueues"] > before[-1].values["msgTotalEnqueues"]  # a last burst
        assert deletes[names[key]] == stat.delete_ns
    # the bindings go with their queue (same delete time, stale update time too)
    deleted_bindings = [k for k, f in deleted_finals.items() if f["class_name"] == "binding"]
    assert len(deleted_bindings) >= 10
    for k in deleted_bindings:
        last = [r for r in by_obj[k] if r.delete_ns]
        assert last and all(r.update_ns < r.delete_ns == deleted_finals[k]["delete_ns"]
                            for r in last)  # fmt: skip
    assert len([f for f in deleted_finals.values() if f["class_name"] == "queue"]) == 10


def test_transient_queues_keep_their_one_record_at_the_interval_end() -> None:
    """Transients were never published before their deletion: their one record carries
    the interval's end as update time (documented: qpidd's would carry the create time)."""
    sim, sink = run(dialect="am2", intervals=2, load=LoadConfig(queues=2, transient_per_interval=1))
    tmp = [r for r in samples(sink) if r.delete_ns]
    assert len(tmp) >= 4
    deleted = finals(sim, "deleted")
    for r in tmp:
        assert r.update_ns == START_NS + (interval_of(r.update_ns) + 1) * NS > r.delete_ns
        f = deleted[ident(r)]
        assert (f["update_ns"], f["delete_ns"]) == (r.update_ns, r.delete_ns)
        if r.opcode == "i":
            assert f["values"] == stats_of(r, f)


# ---------------------------------------------------------------- restarts

STARTUP = {
    ("system", None),
    ("broker", "amqp-broker"),
    ("vhost", "/"),
    *(("exchange", f"amq.{x}") for x in ("direct", "topic", "fanout", "match")),
}


def epoch_of(oid: Any) -> int | None:
    if isinstance(oid, Am1ObjectId):
        return oid.boot_seq
    if isinstance(oid, Am2ObjectId | V2ObjectId):
        return oid.epoch
    raise AssertionError(oid)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_restart_recreates_everything_startup_objects_keep_epoch_zero(dialect: str) -> None:
    load = LoadConfig(queues=6, active_fraction=1.0, **QUIET)
    sim, sink = run(dialect=dialect, intervals=5, restarts=[(0, 2)], load=load)
    (restart,) = [r for r in sim.manifest.rows if r["kind"] == "restart"]
    at = START_NS + 2 * NS + NS // 2
    assert (restart["timestamp_ns"], restart["old_boot_seq"], restart["boot_seq"]) == (at, 1, 2)
    recs = samples(sink)
    what: dict[tuple[str, int], tuple[str, Any]] = defaultdict(lambda: ("", None))
    for r in recs:
        if "name" in r.values or r.class_name == "system":
            what[ident(r)] = (r.class_name, r.values.get("name"))
    startup_epoch = None if dialect.startswith("v2") else 0  # v2: no _agent_epoch at all
    ids: dict[int, dict[tuple[str, Any], str]] = {1: {}, 2: {}}
    for r in recs:
        generation = 1 if r.update_ns < at else 2
        assert r.create_ns == (START_NS if generation == 1 else at)  # no transients here
        cls_name = what[ident(r)]
        if cls_name in STARTUP:
            assert epoch_of(r.object_id) == startup_epoch, (cls_name, r.object_id)
        else:
            assert epoch_of(r.object_id) == generation, (cls_name, r.object_id)
        ids[generation][cls_name] = jsonable(r.object_id)["oid"]
    # the start-up objects come back under the same ids, with the restart as create time
    assert {k: ids[2][k] for k in STARTUP} == {k: ids[1][k] for k in STARTUP}
    if not dialect.startswith("v2"):  # (a v2 name is the same: its epoch differs, above)
        assert ids[2][("queue", "q00000")] != ids[1][("queue", "q00000")]
    # first records after the restart: every counter at zero (no traffic yet), uptime since
    schema = default_schema()
    first = [r for r in recs if interval_of(r.update_ns) == 2]
    assert {what[ident(r)] for r in first} >= STARTUP | {("queue", "q00005")}
    for r in first:
        assert r.update_ns == START_NS + 3 * NS
        for c in counters_of(schema.get(PKG, r.class_name)):
            if c in r.values:
                assert r.values[c] == 0, (r.class_name, c)
        if r.class_name == "broker" and "uptime" in r.values:
            assert r.values["uptime"] == NS // 2
    # then the traffic goes on: every (active) queue enqueues again
    nxt = [r for r in recs if r.class_name == "queue" and interval_of(r.update_ns) == 3
           and "msgTotalEnqueues" in r.values]  # fmt: skip
    assert len(nxt) == 6 and all(r.values["msgTotalEnqueues"] > 0 for r in nxt)
    # the old generation's final values: what it last published before the restart
    old = finals(sim, "restart")
    assert len(old) == len(sim.agents[0].model.objects)  # the same topology, one line each
    latest = {ident(r): r for r in recs if r.update_ns < at and r.opcode != "c"}
    assert {f["timestamp_ns"] for f in old.values()} == {at}
    for key, f in old.items():
        if f["values"]:
            assert f["values"] == stats_of(latest[key], f), key
        assert f["boot_seq"] == 1 and f["delete_ns"] == 0
    # and the new generation's at the end: its last publication (nothing left over)
    end = finals(sim, "end")
    latest = {ident(r): r for r in recs if r.opcode != "c"}
    for key, f in end.items():
        assert key[1] == at
        if f["values"]:
            assert f["values"] == stats_of(latest[key], f), key


def test_v2_amqp10_startup_ids_and_references_carry_no_agent_epoch() -> None:
    """As qpidd's AMQP 1.0 module sends them (../shared/samples/qpidd-amqp10)."""
    _, sink = run(dialect="v2-amqp10", intervals=1, load=LoadConfig(queues=2))
    seen: dict[str, set[tuple[str, ...]]] = defaultdict(set)
    for m in sink.messages:
        value = amqp_value(bytes(m.body))
        for item in value if isinstance(value, list) else [value]:
            sid = item.get("_schema_id") if isinstance(item, dict) else None
            if sid is None or "_object_id" not in item:
                continue
            cls = bytes(sid["_class_name"]).decode()
            seen[cls].add(tuple(sorted(item["_object_id"])))
            for k in ("vhostRef", "brokerRef", "systemRef", "exchangeRef"):
                ref = item["_values"].get(k)
                if ref is not None:
                    seen[f"{cls}.{k}:{bytes(ref['_object_name']).decode()}"].add(tuple(sorted(ref)))
    for cls in ("system", "broker", "vhost"):
        assert seen[cls] == {("_object_name",)}
    assert seen["exchange"] == {("_object_name",), ("_agent_epoch", "_object_name")}
    for cls in ("queue", "binding", "memory", "connection"):
        assert seen[cls] == {("_agent_epoch", "_object_name")}
    assert seen[f"queue.vhostRef:{PKG}:vhost:{PKG}:broker:amqp-broker,/"] == {("_object_name",)}
    assert seen[f"binding.exchangeRef:{PKG}:exchange:{PKG}:vhost:{PKG}:broker:amqp-broker,/,"] == {
        ("_agent_epoch", "_object_name")
    }


# ---------------------------------------------------------------- queries clear the flags


class AtPoll:
    """A request source handing out requests (built from the simulation) at its n-th poll."""

    def __init__(self, at: int, make: Any) -> None:
        self.at, self.make, self.polls = at, make, 0

    def poll(self, timeout_s: float) -> list[Request]:
        self.polls += 1
        return list(self.make()) if self.polls == self.at + 1 else []

    def close(self) -> None:
        pass


def query_request(sim: Simulation, seq: int) -> Request:
    """A query for every queue: v1 'G' ``_class``, v2 ``_query_request`` by schema id."""
    agent = sim.agents[0]
    if agent.dialect == "v2":
        body = {"_what": "OBJECT", "_schema_id": {"_class_name": "queue", "_package_name": PKG}}
        rec: Record = V2Message(dialect="V2", opcode="_query_request", content=None, body=body)
        return Request(agent.v2_name, rec, "/exchange/amq.direct/r", correlation_id=seq)
    d = agent.codec_dialect
    rec = GetQuery(dialect=d, opcode="G", seq=seq, query=TypedMap({"_class": "queue"}))
    return Request(agent.command_keys[-1], rec, "/exchange/amq.direct/r")


def purge_request(sim: Simulation, q: SimObject, seq: int) -> Request:
    agent = sim.agents[0]
    if agent.dialect == "v2":
        body = {
            "_object_id": {"_object_name": agent.object_name(q)},
            "_method_name": "purge",
            "_arguments": {"request": 0},
        }
        rec: Record = V2Message(dialect="V2", opcode="_method_request", content=None, body=body)
        return Request(agent.v2_name, rec, "/exchange/amq.direct/r", correlation_id=seq)
    d = agent.codec_dialect
    purge = next(m for m in q.cls.schema.methods if m.name == "purge")
    rec = MethodRequest(
        dialect=d,
        opcode="M",
        seq=seq,
        object_id=agent.oid(q.object_num),
        method_name="purge",
        package=PKG,
        class_name="queue",
        schema_hash=q.cls.key.hash,
        raw_arguments=encode_arguments(d, purge.arguments, {"request": 0, "filter": {}}),
    )
    return Request(agent.command_keys[-1], rec, "/exchange/amq.direct/r")


def queue_records(sink: MemorySink) -> dict[int, list[ObjectSample]]:
    out: dict[int, list[ObjectSample]] = defaultdict(list)
    for r in samples(sink):
        if r.class_name == "queue":
            out[interval_of(r.update_ns)].append(r)
    return out


@pytest.mark.parametrize("dialect", DIALECTS)
def test_query_between_intervals_makes_the_next_publication_skip_what_it_returned(
    dialect: str,
) -> None:
    load = LoadConfig(queues=4, active_fraction=1.0, **QUIET)
    cfg: dict[str, Any] = {"dialect": dialect, "intervals": 4, "load": load}
    control_sim, control = run(**cfg)
    purged: list[SimObject] = []

    def requests() -> list[Request]:
        # during interval 2: a query for every queue, then a purge of the deepest one
        model = sim.agents[0].model
        q = max((model.objects[n] for n in model.queue_nums), key=lambda o: o.stats["msgDepth"])
        assert q.stats["msgDepth"] > 0 and q.stat_dirty and not q.prop_dirty
        purged.append(q)
        return [query_request(sim, 31), purge_request(sim, q, 32)]

    sim = Simulation(
        SimConfig(start_ns=START_NS, **cfg), MemorySink(), requests=AtPoll(2, requests)
    )
    sim.run()
    sink = sim.sink
    assert isinstance(sink, MemorySink)
    # the same load either way: the query changes what is published, not what happens
    assert finals(sim, "end").keys() == finals(control_sim, "end").keys()
    ours, theirs = queue_records(sink), queue_records(control)
    (q,) = purged
    q_oid = jsonable(sim.agents[0].oid(q.object_num))["oid"]
    assert len({ident(r) for r in theirs[2]}) == 4  # without a query: all four
    for k in (0, 1, 3):
        assert [record_key(r) for r in ours[k]] == [record_key(r) for r in theirs[k]]
    # interval 2: the queried queues are skipped but the purged one, statistics only
    stat_opcode = "_data_indication" if dialect.startswith("v2") else "i"
    assert [(jsonable(r.object_id)["oid"], r.opcode) for r in ours[2]] == [(q_oid, stat_opcode)]
    (p,) = ours[2]
    assert p.values["msgDepth"] == 0 and p.values["discardsPurge"] > 0
    # the replies carry the values (update time: the interval's end, they had changed)
    replies = [r for r in samples(sink, replies=True)]
    assert len(replies) == 4
    assert {r.update_ns for r in replies} == {START_NS + 3 * NS}
    assert {jsonable(r.object_id)["oid"] for r in replies} == {
        jsonable(r.object_id)["oid"] for r in theirs[2]
    }
    by_oid = {jsonable(r.object_id)["oid"]: r for r in replies}
    for r in theirs[2]:  # the control run published what our query returned
        if r.opcode != "c":
            assert r.values == {k: by_oid[jsonable(r.object_id)["oid"]].values[k]
                                for k in r.values}  # fmt: skip
    # broker and memory are published anyway (qpidd refreshes uptime and memory first)
    classes = {r.class_name for r in samples(sink) if interval_of(r.update_ns) == 2}
    assert {"broker", "memory"} <= classes
    (m,) = [r for r in decoded(sink, replies=True) if isinstance(r, MethodResponse)]
    assert m.status == 0


@pytest.mark.parametrize("dialect", DIALECTS)
def test_query_before_the_end_leaves_the_last_values_unpublished_final_has_them(
    dialect: str,
) -> None:
    load = LoadConfig(queues=3, active_fraction=1.0, **QUIET)
    holder: list[Simulation] = []
    sim = Simulation(
        SimConfig(dialect=dialect, intervals=3, start_ns=START_NS, load=load),
        MemorySink(),
        requests=AtPoll(2, lambda: [query_request(holder[0], 7)]),
    )
    holder.append(sim)
    sim.run()
    sink = sim.sink
    assert isinstance(sink, MemorySink)
    published = samples(sink)
    assert not [r for r in published if r.class_name == "queue" and interval_of(r.update_ns) == 2]
    end = finals(sim, "end")
    replies = samples(sink, replies=True)
    assert len(replies) == 3
    last_published = {ident(r): r for r in published if r.opcode != "c"}
    for r in replies:
        f = end[ident(r)]
        assert f["values"] == stats_of(r, f)  # the final values: only the reply had them
        assert f["values"] != stats_of(last_published[ident(r)], f)
        assert f["update_ns"] == r.update_ns == START_NS + 3 * NS


@pytest.mark.parametrize("dialect", ["am1", "am2", "v2"])
def test_request_handler_clears_the_changed_flags_per_object_and_kind(dialect: str) -> None:
    """In-process, through the agent's request handler: a get by object id clears that
    object's flags only; a property change after it publishes 'c' alone (AM), a
    statistics change 'i' alone; an unchanged queried object keeps its update time."""
    load = LoadConfig(queues=4, active_fraction=1.0, **QUIET)
    sim, _ = run(dialect=dialect, intervals=1, load=load)
    agent = sim.agents[0]
    model = agent.model
    t = START_NS + 2 * NS
    model.advance(t, 1.0)  # interval 1's traffic: every queue changed
    a, b, c, idle = (model.objects[n] for n in model.queue_nums)
    idle.stat_dirty = False  # as if it had no traffic
    assert a.stat_dirty and b.stat_dirty and c.stat_dirty

    def get(o: SimObject) -> ObjectSample:
        if dialect == "v2":
            body = {"_what": "OBJECT", "_object_id": {"_object_name": agent.object_name(o)}}
            req: Record = V2Message(dialect="V2", opcode="_query_request", content=None, body=body)
            (r,) = V2Requests(agent).handle(req, t)
        else:
            q = TypedMap({"_objectid": str(agent.oid(o.object_num))})
            r, z = agent.handle(
                GetQuery(dialect=agent.codec_dialect, opcode="G", seq=3, query=q), t
            )
            assert z.opcode == "z"
        assert isinstance(r, ObjectSample)
        return r

    ra, rb, ri = get(a), get(b), get(idle)
    assert (ra.update_ns, rb.update_ns) == (t, t)  # changed: the update time moves
    assert ri.update_ns == START_NS + NS  # unchanged: its previous publication's
    assert not (a.prop_dirty or a.stat_dirty or b.prop_dirty or b.stat_dirty)
    assert c.stat_dirty  # not asked for: untouched
    a.props["arguments"] = {"qpid.max_count": 5}
    a.prop_dirty = True  # a property change after the query
    model._traffic(b, 5, 0)  # a statistics change after the query
    pubs = sim._publication(agent, t, [])
    got = sorted(
        (p.record.opcode, agent.find_object(p.record.object_id).props["name"])
        for p in pubs
        if isinstance(p.record, ObjectSample) and p.record.class_name == "queue"
    )
    if dialect == "v2":  # one map per object, whatever changed
        assert got == [("_data_indication", n) for n in ("q00000", "q00001", "q00002")]
    else:
        assert got == [("c", "q00000"), ("i", "q00001"), ("i", "q00002")]


def record_key(r: ObjectSample) -> tuple[str, str, int]:
    return jsonable(r.object_id)["oid"], r.opcode, r.update_ns


# ---------------------------------------------------------------- final lines


def test_final_lines_are_what_the_agent_holds() -> None:
    load = LoadConfig(queues=5, short_lived_per_interval=1, short_lived_intervals=2)
    sim, sink = run(dialect="am2", agents=2, intervals=6, restarts=[(1, 3)], load=load)
    rows = [r for r in sim.manifest.rows if r["kind"] == "final"]
    assert {r["reason"] for r in rows} == {"deleted", "restart", "end"}
    for agent in sim.agents:
        end = [r for r in rows if r["reason"] == "end" and r["agent_uuid"] == str(agent.uuid)]
        assert len(end) == len(agent.model.objects)
        for r, o in zip(end, agent.model.objects.values(), strict=True):
            assert r["object_id"] == jsonable(agent.oid(o.object_num))
            assert (r["create_ns"], r["delete_ns"], r["update_ns"]) == (
                o.create_ns, o.delete_ns, o.update_ns,
            )  # fmt: skip
            assert r["values"] == jsonable(agent.values(o, "i"))
            assert r["boot_seq"] == agent.boot_seq and r["timestamp_ns"] == START_NS + 6 * NS
    restart = [r for r in rows if r["reason"] == "restart"]
    assert {(r["agent_uuid"], r["boot_seq"], r["timestamp_ns"]) for r in restart} == {
        (str(sim.agents[1].uuid), 1, START_NS + 3 * NS + NS // 2)
    }
    assert {r["class_name"] for r in restart} >= {"system", "broker", "queue", "binding"}
    # nothing was left unpublished: every final equals the object's last statistics record
    latest: dict[tuple[str, str, int], ObjectSample] = {}
    for rec in samples(sink):
        if rec.opcode == "i":
            latest[(str(rec.agent), *ident(rec))] = rec
    for f in rows:
        if f["values"]:
            last = latest[(f["agent"], f["object_id"]["oid"], f["create_ns"])]
            assert f["values"] == stats_of(last, f)


def test_same_seed_same_bytes_with_short_lived_queues() -> None:
    load = LoadConfig(queues=3, short_lived_per_interval=2)
    a = run(dialect="am2", intervals=5, seed=4, load=load)
    b = run(dialect="am2", intervals=5, seed=4, load=load)
    assert [m.body for m in a[1].messages] == [m.body for m in b[1].messages]
    assert a[0].manifest.rows == b[0].manifest.rows
