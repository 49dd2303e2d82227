"""The fold of gold's lifecycle state: one ``object_lifecycles`` row per object, whichever
agents and dialects reported it (``pipeline.gold.fold``). Pure: polars in, polars out."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import polars as pl
import pyarrow as pa

from pipeline.gold.fold import fold_lifecycles
from pipeline.gold.transforms import conform
from schemas.gold import LIFECYCLE_STATE, OBJECT_LIFECYCLES

V1, V2 = "1.0", "apache.org:qpidd:96e8ff02"
BROKER = "amqp-broker@vm:5672"
S = 10**9


def _t(ns: int | None) -> datetime | None:
    return None if ns is None else datetime.fromtimestamp(ns / S, UTC)


def row(agent: str, dialect: str, oid: str, name: str | None, **kw: Any) -> dict[str, Any]:
    """A lifecycle_state row of a queue (times in seconds in ``kw``)."""
    first, last = kw.pop("first", 10), kw.pop("last", 20)
    created, deleted, ended = kw.pop("created", 5), kw.pop("deleted", None), kw.pop("ended", None)
    out = {
        "agent": agent, "dialect": dialect, "package": "org.apache.qpid.broker",
        "class_name": "queue", "object_id": oid, "index_key": f'["{name}"]', "name": name,
        "broker": BROKER, "create_ns": created * S, "generation": 0,
        "created_at": _t(created * S), "deleted_at": _t(deleted and deleted * S),
        "first_seen": _t(first * S), "last_seen": _t(last * S), "first_seen_ns": first * S,
        "last_seen_ns": last * S, "samples": 3, "properties": None, "properties_ns": None,
        "state": "live", "end_reason": None, "ended_at": _t(ended and ended * S), "batch_id": 1,
    }  # fmt: skip
    out.update(kw)
    return out


def fold(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    state = pl.DataFrame(pa.Table.from_pylist(rows, schema=LIFECYCLE_STATE))
    return conform(fold_lifecycles(state), OBJECT_LIFECYCLES).to_pylist()


def test_a_queue_of_qpidds_v1_and_v2_agents_is_one_row() -> None:
    got = fold([
        row(V1, "AM2", "0-0-1-0-7", "q1", first=9, last=30, samples=4, batch_id=3,
            properties=[("durable", "True")], properties_ns=30 * S),
        row(V2, "V2", "org.apache.qpid.broker:queue:q1", "q1", first=10, last=29, samples=5,
            properties=[("durable", "False")], properties_ns=29 * S),
    ])  # fmt: skip
    assert len(got) == 1
    r = got[0]
    # Named by the V2 agent; times and samples over both; the latest properties (v1's).
    assert (r["agent"], r["dialect"], r["object_id"]) == (V2, "V2", "org.apache.qpid.broker:queue:q1")
    assert (r["first_seen_ns"], r["last_seen_ns"], r["samples"], r["batch_id"]) == (9 * S, 30 * S, 9, 3)
    assert r["properties"] == [("durable", "True")] and r["properties_ns"] == 30 * S
    assert r["reporters"] == [
        {"agent": V2, "dialect": "V2", "object_id": "org.apache.qpid.broker:queue:q1"},
        {"agent": V1, "dialect": "AM2", "object_id": "0-0-1-0-7"},
    ]


def test_a_delete_either_agent_saw_ends_the_object() -> None:
    got = fold([
        row(V1, "AM2", "a", "q1", deleted=21, state="deleted", end_reason="deleted", ended=21),
        row(V2, "V2", "b", "q1", last=19),
    ])  # fmt: skip
    assert [(r["state"], r["end_reason"], r["ended_at"], r["deleted_at"]) for r in got] == [
        ("deleted", "deleted", _t(21 * S), _t(21 * S))
    ]


def test_one_live_agent_keeps_the_object_live_and_a_restart_ends_it_at_the_latest() -> None:
    live = fold([
        row(V1, "AM2", "a", "q1", state="lost", end_reason="agent_down", ended=40),
        row(V2, "V2", "b", "q1"),
    ])  # fmt: skip
    assert [(r["state"], r["end_reason"], r["ended_at"]) for r in live] == [("live", None, None)]
    lost = fold([
        row(V1, "AM2", "a", "q1", state="lost", end_reason="agent_restart", ended=41),
        row(V2, "V2", "b", "q1", state="lost", end_reason="agent_restart", ended=40),
    ])  # fmt: skip
    assert [(r["state"], r["end_reason"], r["ended_at"]) for r in lost] == [
        ("lost", "agent_restart", _t(41 * S))
    ]


def test_what_is_not_one_identity_stays_apart() -> None:
    """A re-created queue (another create time), a queue of another broker, an object
    whose name or broker is not resolved yet, and one with no create time: each its own
    row, in (broker, class, name, create time) order."""
    got = fold([
        row(V2, "V2", "q1-first", "q1", created=5),
        row(V2, "V2", "q1-again", "q1", created=50),
        row("other", "V2", "q1-there", "q1", broker="other@host:5672"),
        row(V1, "AM2", "0-0-1-0-9", None),
        row(V2, "V2", "q9", None),
        row(V1, "AM2", "0-0-1-0-8", "q8", created=0),
        row(V2, "V2", "q8", "q8", created=0),
    ])  # fmt: skip
    assert [(r["object_id"], len(r["reporters"])) for r in got] == [
        ("q1-first", 1), ("q1-again", 1), ("0-0-1-0-8", 1), ("q8", 1),
        ("0-0-1-0-9", 1), ("q9", 1), ("q1-there", 1),
    ]  # fmt: skip


def test_one_agents_two_ids_of_one_object_fold_too() -> None:
    """qpidd's first answer to a query may give an object id without its epoch: the same
    queue under two V2 ids is one object."""
    got = fold([
        row(V2, "V2", "org.apache.qpid.broker:exchange:tool-ex1", "tool-ex1", samples=1),
        row(V2, "V2", "1:org.apache.qpid.broker:exchange:tool-ex1", "tool-ex1", samples=6),
    ])  # fmt: skip
    assert [(r["object_id"], r["samples"], len(r["reporters"])) for r in got] == [
        ("1:org.apache.qpid.broker:exchange:tool-ex1", 7, 2)
    ]


def test_the_same_state_in_any_order_folds_to_the_same_rows() -> None:
    rows = [
        row(V1, "AM2", "a", "q1"), row(V2, "V2", "b", "q1"),
        row(V1, "AM2", "c", "q2", created=6), row(V2, "V2", "d", "q2", created=6),
    ]  # fmt: skip
    assert fold(rows) == fold(rows[::-1]) and len(fold(rows)) == 2
    assert fold([]) == []


def test_gold_start_moves_an_old_lakes_lifecycles_to_the_state_and_folds_them(tmp_path: Any) -> None:
    """A lake from before the fold: its per-agent ``object_lifecycles`` becomes
    ``lifecycle_state`` (rows, history and all) and ``object_lifecycles`` its fold; a
    second start changes nothing."""
    from pipeline.gold import GoldSettings
    from pipeline.gold.writer import ensure_tables
    from pipeline.lake import delta

    gs = GoldSettings(silver=str(tmp_path / "silver"), root=str(tmp_path / "gold"))
    rows = [row(V1, "AM2", "a", "q1"), row(V2, "V2", "b", "q1"), row(V2, "V2", "c", "q2", created=6)]
    old = pa.Table.from_pylist(rows, schema=LIFECYCLE_STATE)
    delta.create_table(gs.path("object_lifecycles"), LIFECYCLE_STATE, name="object_lifecycles")
    delta.append_arrow(old, gs.path("object_lifecycles"), app_id="old-gold", batch_id=7)
    ensure_tables(gs)
    state = delta.read_arrow(gs.path("lifecycle_state"))
    assert state.sort_by("object_id").to_pylist() == old.sort_by("object_id").to_pylist()
    assert delta.committed_batch(gs.path("lifecycle_state"), "old-gold") == 7
    folded = delta.read_arrow(gs.path("object_lifecycles")).to_pylist()
    assert folded == fold(rows) and [len(r["reporters"]) for r in folded] == [2, 1]
    ensure_tables(gs)
    assert delta.read_arrow(gs.path("object_lifecycles")).to_pylist() == folded
    assert delta.read_arrow(gs.path("lifecycle_state")).num_rows == 3


def test_one_reporter_per_object_gives_the_same_rows_without_grouping() -> None:
    """The shortcut (no identity shared: each row its own object) against the grouped fold,
    row for row and type for type, over the kinds of rows a state holds."""
    rows = [
        row(V2, "V2", "org.apache.qpid.broker:queue:q1", "q1", properties=[("durable", "True")],
            properties_ns=30 * S, batch_id=4),
        row(V1, "AM2", "0-0-1-0-7", "q2", state="deleted", deleted=40, ended=40, end_reason="deleted"),
        row(V1, "AM2", "0-0-1-0-8", None, created=0),  # not named yet: its own object
        row(V1, "AM2", "0-0-1-0-9", "q3", broker=None, state="lost", ended=50, end_reason="agent lost"),
        row("east/1.0", "AM2", "0-0-1-0-7", "q1", broker=f"east/{BROKER}"),  # a fleet's broker
        row(V1, "AM1", "0-0-1-0-10", "q4", samples=0, properties=[("durable", "False")],
            properties_ns=None),
    ]  # fmt: skip
    state = pl.DataFrame(pa.Table.from_pylist(rows, schema=LIFECYCLE_STATE))
    short, grouped = fold_lifecycles(state), fold_lifecycles(state, shortcut=False)
    assert short.schema == grouped.schema and short.height == len(rows)
    assert short.to_dicts() == grouped.to_dicts()
    # A shared identity: both take the grouped path, and two rows become one.
    both = pl.concat([state, state.head(1).with_columns(agent=pl.lit(V1), dialect=pl.lit("AM2"))])
    assert fold_lifecycles(both).to_dicts() == fold_lifecycles(both, shortcut=False).to_dicts()
    assert fold_lifecycles(both).height == len(rows)
