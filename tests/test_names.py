"""Names through index references (``pipeline.gold.names``): pure, no I/O.

Shapes are qpidd's: a queue is indexed ``[vhostRef, name]``, a vhost ``[brokerRef, name]``,
a binding ``[exchangeRef, queueRef, bindingKey]``; AM2 references are object ids, V2
references maps naming the target's ``_object_name``.
"""

from __future__ import annotations

import json
import random

import polars as pl
import pyarrow as pa

from pipeline.gold.names import (
    JOINS_FROM_ROWS,
    Obj,
    Resolver,
    _names_by_level,
    parse_ref,
    ref_key,
    ref_positions,
    with_names,
)


def am2(oid: str, cls: str, key: list[object], seen: int = 1, **props: str) -> Obj:
    return Obj("1.0", "AM2", "org.apache.qpid.broker", cls, oid, json.dumps(key), seen, props or None)


def v2ref(name: str, epoch: int | None = None) -> str:
    m: dict[str, object] = {"_object_name": name}
    if epoch is not None:
        m = {"_agent_epoch": epoch, **m}
    return json.dumps(m, sort_keys=True)


def v2(oid: str, cls: str, key: list[object], seen: int = 1, **props: str) -> Obj:
    agent = "apache.org:qpidd:de71"
    return Obj(agent, "V2", "org.apache.qpid.broker", cls, oid, json.dumps(key), seen, props or None)


SYSTEM = am2("0-0-1-0-1", "system", ["4dd8"], nodeName="vm")
BROKER = am2("0-0-1-0-2", "broker", ["amqp-broker"], name="amqp-broker", port="25672",
             systemRef="0-0-1-0-1")  # fmt: skip
VHOST = am2("0-0-1-0-3", "vhost", ["0-0-1-0-2", "/"])
QUEUE = am2("0-1-1-0-27", "queue", ["0-0-1-0-3", "q-rate-20"])
EXCHANGE = am2("0-0-1-0-5", "exchange", ["0-0-1-0-3", "amq.direct"])
DEFAULT_EXCHANGE = am2("0-1-1-0-4", "exchange", ["0-0-1-0-3", ""])
BINDING = am2("0-1-1-0-40", "binding", ["0-0-1-0-5", "0-1-1-0-27", "k1"])
ACL = am2("0-1-1-0-12", "acl", ["0-0-1-0-2"])


def test_am2_names_resolve_references_and_drop_the_broker_and_default_vhost() -> None:
    objs = [SYSTEM, BROKER, VHOST, QUEUE, EXCHANGE, DEFAULT_EXCHANGE, BINDING, ACL]
    r = Resolver(objs)
    assert [r.name(o) for o in objs] == [
        "4dd8", "amqp-broker", "/", "q-rate-20", "amq.direct", '""', "amq.direct/q-rate-20/k1", "acl",
    ]  # fmt: skip
    assert r.broker("1.0") == "amqp-broker@vm:25672"


def test_a_reference_seen_before_its_target_completes_when_the_target_arrives() -> None:
    vh = am2("0-0-1-0-9", "vhost", ["0-0-1-0-2", "vh1"])
    q = am2("0-1-1-0-30", "queue", ["0-0-1-0-9", "orders"])
    b = am2("0-1-1-0-31", "binding", ["0-0-1-0-5", "0-1-1-0-30", "k"])
    before = Resolver([q, b, EXCHANGE])
    assert (before.name(q), before.name(b)) == ("orders", "amq.direct/orders/k")
    assert before.broker("1.0") == "1.0"  # no broker object yet: the agent id
    after = Resolver([q, b, EXCHANGE, vh, BROKER, SYSTEM])
    assert (after.name(q), after.name(b)) == ("vh1/orders", "amq.direct/vh1/orders/k")
    assert after.broker("1.0") == "amqp-broker@vm:25672"


def test_a_renamed_target_renames_its_dependents_and_a_deleted_one_keeps_its_name() -> None:
    q = am2("0-1-1-0-30", "queue", ["0-0-1-0-9", "orders"])
    old = am2("0-0-1-0-9", "vhost", ["0-0-1-0-2", "vh1"], seen=1)
    new = am2("0-0-1-0-9", "vhost", ["0-0-1-0-2", "vh2"], seen=2)
    assert Resolver([q, old]).name(q) == "vh1/orders"
    assert Resolver([q, old, new]).name(q) == "vh2/orders"  # the latest seen of one id wins
    # A deleted target is still a row of the lifecycle table: its last name stays.
    assert Resolver([q, new]).name(q) == "vh2/orders"


def test_v2_references_name_their_target_by_object_name_and_unify_with_am2() -> None:
    pfx = "org.apache.qpid.broker:"
    broker = v2(f"{pfx}broker:amqp-broker", "broker", ["amqp-broker"], name="amqp-broker",
                port="25672", systemRef=v2ref(f"{pfx}system:4dd8"))  # fmt: skip
    system = v2(f"{pfx}system:4dd8", "system", ["4dd8"], nodeName="vm")
    vhost = v2(f"{pfx}vhost:{pfx}broker:amqp-broker,/", "vhost", [v2ref(f"{pfx}broker:amqp-broker"), "/"])
    queue = v2(f"1:{pfx}queue:q-rate-20", "queue", [v2ref(vhost.object_id), "q-rate-20"])
    binding = v2(
        f"1:{pfx}binding:x", "binding",
        [v2ref(f"{pfx}exchange:amq.direct", 1), v2ref(f"{pfx}queue:q-rate-20", 1), "k1"],
    )  # fmt: skip
    exchange = v2(f"{pfx}exchange:amq.direct", "exchange", [v2ref(vhost.object_id), "amq.direct"])
    r = Resolver([broker, system, vhost, queue, binding, exchange])
    assert [r.name(o) for o in (vhost, queue, binding)] == ["/", "q-rate-20", "amq.direct/q-rate-20/k1"]
    both = Resolver([SYSTEM, BROKER, VHOST, QUEUE, broker, system, vhost, queue])
    assert both.broker("1.0") == both.broker(queue.agent) == "amqp-broker@vm:25672"
    assert both.name(QUEUE) == both.name(queue)


def test_reference_parsing_and_keys() -> None:
    assert ref_key("V2", "7:org.apache.qpid.broker:queue:q") == "org.apache.qpid.broker:queue:q"
    assert ref_key("AM2", "0-1-1-0-27") == "0-1-1-0-27"
    assert parse_ref("AM1", "1-1-3") == "1-1-3"
    assert parse_ref("AM2", "q-rate-20") is None
    assert parse_ref("V2", v2ref("a:b", 3)) == "a:b"
    assert parse_ref("V2", "{not json") is None
    assert parse_ref("V2", 5) is None


def test_an_id_shaped_name_is_a_name_unless_the_schema_says_reference() -> None:
    q = am2("0-1-1-0-30", "queue", ["0-0-1-0-3", "1-2-3"])
    assert Resolver([q, VHOST]).name(q) == "1-2-3"  # last value, names no object
    # The registry declares position 1 a reference: then it is one (unresolved: dropped).
    refs = {("org.apache.qpid.broker", "queue"): frozenset({0, 1})}
    assert Resolver([q, VHOST], refs).name(q) == "0-1-1-0-30"


def test_ref_positions_come_from_the_registry_index_properties() -> None:
    def prop(name: str, code: int, index: bool) -> dict[str, object]:
        return {"name": name, "type_code": code, "is_index": index}

    registry = pa.Table.from_pylist([
        {"package": "p", "class_name": "binding", "properties": [
            prop("exchangeRef", 10, True), prop("durable", 11, False), prop("queueRef", 10, True),
            prop("bindingKey", 7, True), prop("origin", 7, False)]},
        {"package": "p", "class_name": "queue", "properties": [
            prop("vhostRef", 10, True), prop("name", 7, True), prop("altExchange", 10, False)]},
    ])  # fmt: skip
    assert ref_positions(registry) == {("p", "binding"): frozenset({0, 1}), ("p", "queue"): frozenset({0})}


def frame(rows: list[Obj]) -> pl.DataFrame:
    """Lifecycle rows as gold holds them (the columns ``with_names`` reads)."""
    return pl.DataFrame(
        {
            "agent": [o.agent for o in rows],
            "dialect": [o.dialect for o in rows],
            "package": [o.package for o in rows],
            "class_name": [o.class_name for o in rows],
            "object_id": [o.object_id for o in rows],
            "index_key": [o.index_key for o in rows],
            "last_seen_ns": [o.last_seen_ns for o in rows],
            "properties": [
                [{"key": k, "value": v} for k, v in sorted((o.properties or {}).items())] for o in rows
            ],
        },
        schema_overrides={"index_key": pl.Utf8},
    ).with_columns(pl.col("properties").cast(pl.Map(pl.Utf8, pl.Utf8)))


def test_with_names_adds_columns_to_lifecycle_rows() -> None:
    rows = [SYSTEM, BROKER, VHOST, QUEUE]
    df = frame(rows)
    out = with_names(df)
    assert out["name"].to_list() == ["4dd8", "amqp-broker", "/", "q-rate-20"]
    assert out["broker"].to_list() == ["amqp-broker@vm:25672"] * 4


PFX = "org.apache.qpid.broker:"


class RandomBroker:
    """A broker's objects in one qpidd dialect with what makes naming hard: targets
    missing or seen later, renamed (two rows of one id), a non-default vhost, id-shaped
    names, broker-indexed objects, self references, keys null, empty or not JSON."""

    def __init__(self, rng: random.Random, agent: str, dialect: str) -> None:
        self.rng, self.agent, self.dialect = rng, agent, dialect
        self.n = 0

    def oid(self, cls: str, name: str) -> str:
        if self.dialect == "V2":
            return f"{self.rng.choice(['', '1:'])}{PFX}{cls}:{name}"
        self.n += 1
        return f"0-1-1-0-{self.n}"

    def ref(self, oid: str) -> str:
        if self.dialect != "V2":
            return oid
        return v2ref(oid.split(":", 1)[1] if oid.startswith("1:") else oid, self.rng.choice([None, 1]))

    def obj(self, cls: str, oid: str, key: list[object] | str | None, **props: str) -> Obj:
        text = key if isinstance(key, str) or key is None else json.dumps(key)
        seen = self.rng.randrange(0, 4)
        return Obj(self.agent, self.dialect, PFX[:-1], cls, oid, text, seen, props or None)

    def objects(self) -> list[Obj]:
        rng, obj, oid, ref = self.rng, self.obj, self.oid, self.ref
        system, broker = oid("system", "4dd8"), oid("broker", "amqp-broker")
        out = [obj("system", system, ["4dd8"], nodeName=rng.choice(["vm", "host2"]))]
        out += [obj("broker", broker, ["amqp-broker"], name="amqp-broker", port="5672",
                    systemRef=ref(system))] * rng.randrange(0, 3)  # fmt: skip
        vhosts = [oid("vhost", "/"), oid("vhost", "vh1")]
        out += [obj("vhost", vhosts[0], [ref(broker), "/"]), obj("vhost", vhosts[1], [ref(broker), "vh1"])]
        queues, exchanges = [], []
        for i in range(rng.randrange(3, 12)):
            q = oid("queue", f"q{i}")
            name = rng.choice([f"q{i}", "1-2-3", "", f"q{i}"])
            out.append(obj("queue", q, [ref(rng.choice([*vhosts, oid("vhost", "gone")])), name]))
            if rng.random() < 0.2:  # renamed: a second row of the same id
                out.append(obj("queue", q, [ref(vhosts[0]), f"q{i}-renamed"]))
            queues.append(q)
        for i in range(rng.randrange(1, 4)):
            exchanges.append(oid("exchange", f"x{i}"))
            out.append(obj("exchange", exchanges[-1], [ref(rng.choice(vhosts)), f"x{i}"]))
        for i in range(rng.randrange(0, 10)):
            out.append(obj("binding", oid("binding", f"b{i}"),
                           [ref(rng.choice(exchanges)), ref(rng.choice(queues)), f"k{i}"]))  # fmt: skip
        out.append(obj("acl", oid("acl", "a"), [ref(broker)]))
        me = oid("link", "self")
        out.append(obj("link", me, [ref(me), "l"]))
        for i, key in enumerate((None, "", "not json")):
            out.append(obj("session", oid("session", f"s{i}"), key))
        return out


def test_with_names_gives_the_resolvers_names_on_random_object_sets() -> None:
    rng = random.Random(20261203)
    refs = {(PFX[:-1], "queue"): frozenset({0}), (PFX[:-1], "binding"): frozenset({0, 1})}
    for case in range(80):
        objs = [o for a, d in (("1.0", "AM2"), ("apache.org:qpidd:de71", "V2"))
                for o in RandomBroker(rng, a, d).objects()]  # fmt: skip
        rng.shuffle(objs)
        use = refs if case % 2 else None
        assert _names_by_level(frame(objs), use or {}) is not None  # the joins, not the fallback
        r = Resolver(objs, use)
        out = with_names(frame(objs), use, joins_from=0)
        assert out["name"].to_list() == [r.name(o) for o in objs], case
        assert out["broker"].to_list() == [r.broker(o.agent) for o in objs], case


def test_with_names_of_references_that_go_round_is_the_resolvers() -> None:
    a = am2("0-1-1-0-50", "queue", ["0-1-1-0-51", "a"])
    b = am2("0-1-1-0-51", "queue", ["0-1-1-0-50", "b"])
    chain = [am2(f"0-1-1-0-{60 + i}", "link", [f"0-1-1-0-{61 + i}", f"l{i}"]) for i in range(8)]
    for objs in ([a, b, QUEUE, VHOST], [*chain, QUEUE]):
        assert _names_by_level(frame(objs), {}) is None  # named one by one
        r = Resolver(objs)
        assert with_names(frame(objs), joins_from=0)["name"].to_list() == [r.name(o) for o in objs]
    # Cut where the resolver stops following references (6 levels down).
    assert with_names(frame([a, b]))["name"][0] == "a/b/a/b/a/b/a"


def test_a_large_set_is_named_by_joins_as_by_the_resolver() -> None:
    objs = [SYSTEM, BROKER, VHOST, EXCHANGE]
    objs += [am2(f"0-1-1-0-{100 + i}", "queue", ["0-0-1-0-3", f"q{i}"]) for i in range(6_000)]
    objs += [am2(f"0-1-2-0-{i}", "binding", ["0-0-1-0-5", f"0-1-1-0-{100 + i}", "k"]) for i in range(3_000)]
    assert len(objs) >= JOINS_FROM_ROWS
    out = with_names(frame(objs))
    r = Resolver(objs)
    assert out["name"].to_list() == [r.name(o) for o in objs]
    assert out["name"][4 + 6_000 + 7] == "amq.direct/q7/k"
    assert set(out["broker"]) == {"amqp-broker@vm:25672"}
