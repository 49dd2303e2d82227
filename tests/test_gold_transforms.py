"""Gold's pure transforms (polars/numpy on the driver): no Spark, no Delta."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl
import pytest

from pipeline.gold import transforms as tg

T0 = 1_800_000_000 * 10**9
S = 10**9


def test_slot_values_gathers_by_row_and_slot_with_nulls_for_short_or_null_lists() -> None:
    lists = pl.Series("ints", [[1, 2, 3], None, [4], [None, 6]], dtype=pl.List(pl.Int64))
    rows = np.array([0, 0, 1, 2, 2, 3, 3, 0])
    slots = np.array([0, 2, 0, 0, 1, 0, 1, 3])
    got = tg.slot_values(lists, rows, slots).to_list()
    assert got == [1, 3, None, 4, None, None, 6, None]


def values(rows: Sequence[tuple[str, str, float, float]]) -> pl.DataFrame:
    """Statistic values of queue series: (series, statistic, t seconds, value)."""
    n = len(rows)
    return pl.DataFrame(
        {
            "agent": ["1.0"] * n, "dialect": ["AM2"] * n, "package": ["p"] * n,
            "class_name": ["queue"] * n, "object_id": [f"o-{r[0]}" for r in rows],
            "index_key": [r[0] for r in rows], "series": [r[0] for r in rows],
            "statistic": [r[1] for r in rows], "kind": ["counter"] * n,
            "update_ns": [T0 + int(r[2] * S) for r in rows], "create_ns": [T0 - 3600 * S] * n,
            "generation": [1] * n, "value": [r[3] for r in rows], "partition": ["p0"] * n,
            "offset": list(range(n)), "record_index": [0] * n, "deleted": [False] * n,
            "is_state": [False] * n,
        }
    ).with_columns(from_create_ns=pl.lit(None, pl.Int64)).select(*tg._VALUE_SCHEMA)


def rate_rows(p: tg.Pairs) -> list[tuple[str, str, int, int, float | None]]:
    r = tg.rates_from_pairs(p.rates, 0).sort("index_key", "statistic", "end_ns")
    return [
        (s, st, (a - T0) // S, (b - T0) // S, rate)
        for s, st, a, b, rate in r.select("index_key", "statistic", "start_ns", "end_ns", "rate").iter_rows()
    ]


INTERLEAVED = [
    ("q2", "enq", 10, 30.0), ("q1", "enq", 0, 0.0), ("q1", "deq", 0, 0.0), ("q2", "enq", 0, 0.0),
    ("q1", "enq", 10, 50.0), ("q1", "deq", 10, 20.0), ("q1", "enq", 25, 80.0), ("q2", "enq", 25, 60.0),
]  # fmt: skip


def test_a_hash_collision_falls_back_to_the_exact_string_order() -> None:
    v = values(INTERLEAVED)
    perm, groups = tg._series_order(v)
    cperm, cgroups = tg._series_order(v, hash_expr=pl.lit(7, pl.UInt64))  # every key collides
    # Boundaries are exact either way: 3 series, each contiguous and in time order.
    assert int(groups.sum()) == int(cgroups.sum()) == 3
    assert sorted(perm.tolist()) == sorted(cperm.tolist()) == list(range(v.height))
    for t in (v[perm], v[cperm]):
        keys = list(zip(t["series"], t["statistic"], strict=True))
        assert len({k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k}) == 3
        for k in set(keys):
            ts = [u for kk, u in zip(keys, t["update_ns"], strict=True) if kk == k]
            assert ts == sorted(ts)


def test_the_series_order_is_a_stable_sort_by_series_state_time_and_arrival() -> None:
    """Each series' values come state first, then by sample time, partition, offset,
    record index and, all equal, row number, for series of a few values (the insertion
    sort) and of more than ``_SMALL_GROUP`` (the fallback), whatever the input order."""
    rng = np.random.default_rng(7)
    rows = [("q1", "enq", float(rng.integers(0, 30)), 1.0) for _ in range(tg._SMALL_GROUP + 9)]
    rows += [("q2", "enq", float(t), 1.0) for t in (20, 0, 10)] + [("q2", "deq", 5.0, 1.0)]
    v = values(rows).with_columns(
        offset=pl.Series(rng.integers(0, 4, len(rows))),  # ties: the row number decides
        record_index=pl.Series(rng.integers(0, 2, len(rows))),
        is_state=pl.Series([i % 11 == 0 for i in range(len(rows))]),
    )
    shuffled = v[rng.permutation(v.height)]
    for t in (v, shuffled):
        perm, newgrp = tg._series_order(t)
        assert sorted(perm.tolist()) == list(range(t.height)) and int(newgrp.sum()) == 3
        want = sorted(
            range(t.height),
            key=lambda r: (t["series"][r], t["statistic"][r], not t["is_state"][r],
                           t["update_ns"][r], t["offset"][r], t["record_index"][r], r),
        )  # fmt: skip
        starts = [*np.flatnonzero(newgrp).tolist(), t.height]
        got = sorted(perm[a:b].tolist() for a, b in itertools.pairwise(starts))
        expect: list[list[int]] = []
        for r in want:
            key = (t["series"][r], t["statistic"][r])
            if expect and (t["series"][expect[-1][0]], t["statistic"][expect[-1][0]]) == key:
                expect[-1].append(r)
            else:
                expect.append([r])
        assert got == sorted(expect)


def test_pairs_per_series_and_exact_rates() -> None:
    got = rate_rows(tg.pair_values(values(INTERLEAVED), tg.RateRules()))
    assert got == [
        ("q1", "deq", 0, 10, 2.0),
        ("q1", "enq", 0, 10, 5.0),
        ("q1", "enq", 10, 25, 2.0),
        ("q2", "enq", 0, 10, 3.0),
        ("q2", "enq", 10, 25, 2.0),
    ]


@pytest.mark.parametrize(("dt", "delta"), [(15, 45.0), (3, 0.3), (7, 49.0)])
def test_rate_is_the_correctly_rounded_quotient(dt: int, delta: float) -> None:
    """delta / length as IEEE division (polars alone multiplied by 1e-9: 15e9 ns -> 15.000000000000002 s)."""
    p = tg.pair_values(values([("q", "enq", 50, 100.0), ("q", "enq", 50 + dt, 100.0 + delta)]), tg.RateRules())
    r = tg.rates_from_pairs(p.rates, 0)
    assert r["length_s"].to_list() == [float(dt)]
    assert r["rate"].to_list() == [((100.0 + delta) - 100.0) / float(dt)]


# ------------------------------------------------------------------ short intervals, jitter, deletes


def samples(
    rows: Sequence[tuple[str, float, float]], deleted_at: float | None = None, agent: str = "1.0"
) -> pl.DataFrame:
    """msgTotalDequeues of queue series: (series, t seconds, value); ``deleted_at``: the
    sample at that time reports its object deleted."""
    v = values([(s, "deq", t, x) for s, t, x in rows])
    return v.with_columns(
        agent=pl.lit(agent),
        deleted=pl.Series([deleted_at is not None and t == deleted_at for _, t, _ in rows]),
        # Distinct arrival positions, as silver gives them.
        offset=pl.Series(range(len(rows)), dtype=pl.Int64),
    )


def activity(times: Sequence[float], agent: str = "1.0", *, beats: Sequence[float] = ()) -> pl.DataFrame:
    """When the agent was seen: samples of other objects at ``times``, heartbeats at ``beats``."""
    ts = [*times, *beats]
    return pl.DataFrame({
        "agent": [agent] * len(ts), "t_ns": [T0 + round(t * S) for t in ts],
        "is_sample": [True] * len(times) + [False] * len(beats),
    })  # fmt: skip


def intervals(p: tg.Pairs) -> list[tuple[float, float, float | None, float | None]]:
    """(start s, end s, delta, rate) by end time."""
    r = tg.rates_from_pairs(p.rates, 0).sort("index_key", "end_ns")
    return [
        ((a - T0) / S, (b - T0) / S, d, rate)
        for a, b, d, rate in r.select("start_ns", "end_ns", "delta", "rate").iter_rows()
    ]


def test_the_state_loses_the_series_of_deleted_objects_of_that_agent_only() -> None:
    """``state_from_pairs``: every series of a gone (agent, object id) leaves, keyed by its
    index key or by the id; the same id under another agent stays; the order is kept."""
    state = pl.DataFrame({
        "agent": ["a", "b", "a", "a", "c"],
        "object_id": ["o1", "o1", "o2", "o1", "o9"],
        "series": ["k1", "k1", "k2", "o1", "k9"],
    })  # fmt: skip
    gone = pl.DataFrame({"agent": ["a", "a", "z"], "object_id": ["o1", "o1", "o2"]})
    got = tg.state_from_pairs(state, gone)
    assert got.rows() == [("b", "o1", "k1"), ("a", "o2", "k2"), ("c", "o9", "k9")]
    none = pl.DataFrame(schema={"agent": pl.Utf8, "object_id": pl.Utf8})
    assert tg.state_from_pairs(state, none).equals(state)
    assert tg.state_from_pairs(state, pl.DataFrame({"agent": ["b"], "object_id": ["o7"]})).equals(state)


def test_a_delete_closes_the_interval_however_short() -> None:
    """(a) A queue deleted 0.6 s after its first statistics sample: its 24 dequeues reach gold."""
    p = tg.pair_values(samples([("tq", 0.0, 0.0), ("tq", 0.6, 24.0)], deleted_at=0.6), tg.RateRules())
    assert intervals(p) == [(0.0, 0.6, 24.0, 24.0 / 0.6)]
    assert p.state.height == 0  # the series ended
    # A delete sample at the time of a kept-back sample (its twin) closes the series with it.
    p = tg.pair_values(
        samples([("tq", 0.0, 0.0), ("tq", 0.5, 10.0), ("tq", 0.5, 10.0)], deleted_at=0.5).with_columns(
            deleted=pl.Series([False, False, True])
        ),
        tg.RateRules(),
    )
    assert intervals(p) == [(0.0, 0.5, 10.0, 20.0)]


def test_b_a_kept_back_last_sample_is_emitted_once_its_agent_moved_on() -> None:
    """(b) The last sample came 0.5 s after the one before: kept back (pending) while nothing
    newer is known, emitted once the agent published a later cycle (first seen 0.9 s or more
    after it) without the series, and that cycle is over (a sample of the agent 0.1 s on)."""
    rows = [("q", 0.0, 0.0), ("q", 1.0, 10.0), ("q", 1.5, 15.0)]
    rules = tg.RateRules()

    def run(*act: pl.DataFrame, extra: Sequence[tuple[str, float, float]] = ()) -> list[Any]:
        return intervals(tg.pair_values(samples([*rows, *extra]), rules, pl.concat(act)))

    first = [(0.0, 1.0, 10.0, 10.0)]
    flushed = [*first, (1.0, 1.5, 5.0, 10.0)]
    # Nothing after: both samples stay in the state, no interval is made for 1.5 yet.
    p = tg.pair_values(samples(rows), rules, activity([0.0, 1.0, 1.5]))
    assert intervals(p) == first
    assert sorted((p.state["update_ns"] - T0) / S) == [1.0, 1.5]
    assert run(activity([2.3, 3.0])) == first  # 2.3 is 0.8 s after it: no cycle seen after 2.4
    assert run(activity([2.4])) == first  # that cycle may still hold the series
    assert run(activity([2.4, 2.5])) == flushed  # ... now it is over
    assert run(activity([], beats=[2.4, 3.0, 4.0])) == first  # heartbeats ahead of samples
    assert run(activity([2.6], beats=[2.4])) == flushed
    assert run(activity([5.0, 6.0], agent="other")) == first  # another agent's cycles
    # A later sample of the series takes the pending one's place: after the agent was
    # seen, but in the same cycle (within 0.1 s) ...
    assert run(activity([2.4, 2.5]), extra=[("q", 2.45, 24.5)]) == [*first, (1.0, 2.45, 14.5, 14.5 / 1.45)]
    # ... and not once a whole cycle went by without it.
    assert run(activity([2.4, 2.5]), extra=[("q", 2.55, 25.5)]) == [*flushed, (1.5, 2.55, 10.5, 10.5 / 1.05)]
    p = tg.pair_values(samples([*rows, ("q", 2.2, 22.0)]), rules, activity([2.2, 2.5]))
    assert intervals(p) == [*first, (1.0, 2.2, 12.0, 10.0)]
    # Across two micro-batches the pending sample rides in the state: the same rows.
    later = samples([("q", 4.0, 35.0)])
    one = tg.pair_values(samples(rows), rules, activity([1.5]))
    two = tg.pair_values(pl.concat([later, tg.state_values(one.state)]), rules, activity([2.4, 4.0]))
    assert intervals(one) + intervals(two) == [*flushed, (1.5, 4.0, 20.0, 8.0)]
    both = tg.pair_values(pl.concat([samples(rows), later]), rules, activity([2.4, 4.0]))
    assert intervals(both) == intervals(one) + intervals(two)


def test_b_a_reset_after_a_kept_back_sample_emits_its_counts_first() -> None:
    rows = [("q", 0.0, 0.0), ("q", 0.5, 5.0), ("q", 2.0, 1.0)]  # then the counter went down
    p = tg.pair_values(samples(rows), tg.RateRules())
    r = tg.rates_from_pairs(p.rates, 0).sort("end_ns")
    assert [((a - T0) / S, (b - T0) / S, d, why) for a, b, d, why in r.select(
        "start_ns", "end_ns", "delta", "reset").iter_rows()] == [
        (0.0, 0.5, 5.0, None), (0.5, 2.0, None, "counter_decreased")
    ]  # fmt: skip


def test_c_the_minimum_interval_tolerates_the_agents_jitter() -> None:
    """(c) qpidd's 1 s publishes 0.999-1.001 s apart: every one makes an interval."""
    ts = [0.0, 0.999, 2.0, 2.999, 4.001, 4.902]
    p = tg.pair_values(samples([("q", t, 10.0 * i) for i, t in enumerate(ts)]), tg.RateRules())
    assert [(a, b) for a, b, _, _ in intervals(p)] == [
        (0.0, 0.999), (0.999, 2.0), (2.0, 2.999), (2.999, 4.001), (4.001, 4.902)
    ]  # fmt: skip
    assert tg.RateRules().min_ns == 900_000_000
    # Without the tolerance every other interval merges (the old rule).
    strict = tg.pair_values(samples([("q", t, 10.0 * i) for i, t in enumerate(ts)]),
                            tg.RateRules(jitter_s=0.0))  # fmt: skip
    assert [(a, b) for a, b, _, _ in intervals(strict)] == [(0.0, 2.0), (2.0, 4.001)]


def test_a_long_quiet_interval_of_one_object_keeps_its_counts() -> None:
    """An agent that publishes on change leaves a quiet object out: 10 minutes without a
    sample of the same instance is an interval with its exact average, not a ``gap``;
    without a create time the identity is unsure and it stays a gap."""
    rows = [("q", 0.0, 0.0), ("q", 600.0, 60.0)]
    p = tg.pair_values(samples(rows), tg.RateRules())
    assert intervals(p) == [(0.0, 600.0, 60.0, 0.1)]
    p = tg.pair_values(samples(rows).with_columns(create_ns=pl.lit(0, pl.Int64)), tg.RateRules())
    r = tg.rates_from_pairs(p.rates, 0)
    assert r.select("delta", "reset").rows() == [(None, "gap")]


def test_series_key_drops_the_agent_epoch_of_v2_references() -> None:
    """qpidd writes ``_agent_epoch`` into the references of objects made after its start;
    a restart changes it, so the series (a binding keyed by its exchange and queue) would
    break in two without this, as AM2's would without blanking the id's epoch."""
    import pyarrow as pa

    from pipeline.gold.transforms import series_key
    from pipeline.views.live import with_series

    ref = '{\\"_agent_epoch\\":%d,\\"_object_name\\":\\"org.apache.qpid.broker:queue:tq-5\\"}'
    keys = [f'["{ref % 1}","tq-5"]', f'["{ref % 2}","tq-5"]', '["0-1-1-0-3","q1"]', '["0-2-1-0-3","q1"]']
    df = pl.DataFrame({"index_key": keys, "dialect": ["V2", "V2", "AM2", "AM2"]})
    want = ['["{\\"_object_name\\":\\"org.apache.qpid.broker:queue:tq-5\\"}","tq-5"]'] * 2 + [
        '["0-*-1-0-3","q1"]'] * 2  # fmt: skip
    assert df.select(series_key()).to_series().to_list() == want
    rows = pa.table({"index_key": keys, "dialect": ["V2", "V2", "AM2", "AM2"], "agent": ["x"] * 4,
                     "object_id": ["a", "b", "c", "d"]})  # fmt: skip
    assert with_series(rows).column("series").to_pylist() == want


def test_the_state_ttl_keeps_a_series_baseline_while_its_pending_sample_is_young() -> None:
    """The TTL is judged per series: dropping an old baseline alone would turn the pending
    sample beside it into the baseline, and the next interval would lose its counts."""
    rules = tg.RateRules(state_ttl_s=10.0)
    q = samples([("q", 0.0, 0.0), ("q", 1.0, 10.0), ("q", 1.5, 15.0)])
    other = samples([("r", 11.2, 1.0)], agent="other")  # the batch's newest: horizon 1.2 s
    p = tg.pair_values(pl.concat([q, other]), rules)
    assert sorted((p.state.filter(pl.col("series") == "q")["update_ns"] - T0) / S) == [1.0, 1.5]
    # a series whose newest state row is older than the horizon leaves whole
    old = samples([("q", 0.0, 0.0), ("q", 1.0, 10.0)])
    p = tg.pair_values(pl.concat([old, samples([("r", 20.0, 1.0)], agent="other")]), rules)
    assert p.state.filter(pl.col("series") == "q").height == 0


def test_rows_at_keeps_the_rows_order_and_places_each_rows_values() -> None:
    rows = pl.DataFrame({"s": ["a", "b", "c", "d"]})
    got = tg._rows_at(rows, np.array([3, 0, 2]), {"x": np.array([30, 0, 20])})
    assert got.rows() == [("a", 0), ("c", 20), ("d", 30)]  # a filter: the rows' own order
    again = tg._rows_at(rows, np.array([2, 0, 2]), {"x": np.array([1, 2, 3])})
    assert again.rows() == [("c", 1), ("a", 2), ("c", 3)]  # repeated: gathered as asked


def test_rekey_moves_only_unkeyed_state_rows_whose_object_the_batch_keyed_in_place() -> None:
    """``rekey_state``: a state row of a series keyed by its object id (statistics came
    before properties) takes the index key the batch teaches its (agent, object id) and
    that key's series (AM2 references blanked by ``series_key``); keyed rows, rows of
    other agents and rows of untaught objects stay as they are, and every row keeps its
    place. A second application changes nothing."""
    from schemas.gold import RATE_STATE

    def row(agent: str, oid: str, key: str | None, series: str, stat: str) -> dict[str, Any]:
        return {"agent": agent, "dialect": "AM2", "package": "org.apache.qpid.broker",
                "class_name": "queue", "object_id": oid, "index_key": key, "series": series,
                "statistic": stat, "kind": "counter", "update_ns": T0, "create_ns": 0,
                "generation": 7, "value": 1.0}  # fmt: skip

    schema = {f.name: tg.frame(RATE_STATE.empty_table())[f.name].dtype for f in RATE_STATE}
    state = pl.DataFrame([
        row("a", "o1", '["0-1-1-0-3","q1"]', '["0-*-1-0-3","q1"]', "msgDepth"),
        row("a", "o2", None, "o2", "msgTotalEnqueues"),
        row("b", "o2", None, "o2", "msgTotalEnqueues"),  # the same id under another agent
        row("a", "o3", None, "o3", "msgTotalEnqueues"),  # not taught by this batch
        row("a", "o2", None, "o2", "msgDepth"),
    ], schema=schema)  # fmt: skip
    keys = pl.DataFrame({"agent": ["a", "z"], "object_id": ["o2", "o3"],
                         "_k": ['["0-9-1-0-3","q2"]', '["x"]']})  # fmt: skip
    got = tg.rekey_state(state, keys)
    assert got.columns == RATE_STATE.names
    assert got.select("agent", "object_id", "index_key", "series", "statistic").rows() == [
        ("a", "o1", '["0-1-1-0-3","q1"]', '["0-*-1-0-3","q1"]', "msgDepth"),
        ("a", "o2", '["0-9-1-0-3","q2"]', '["0-*-1-0-3","q2"]', "msgTotalEnqueues"),
        ("b", "o2", None, "o2", "msgTotalEnqueues"),
        ("a", "o3", None, "o3", "msgTotalEnqueues"),
        ("a", "o2", '["0-9-1-0-3","q2"]', '["0-*-1-0-3","q2"]', "msgDepth"),
    ]
    assert got.drop("index_key", "series").equals(state.drop("index_key", "series"))
    assert tg.rekey_state(got, keys).equals(got)
    assert tg.rekey_state(state, keys.clear()).equals(state)


def _lifecycle(oid: str, **over: Any) -> dict[str, Any]:
    from datetime import UTC, datetime

    at = datetime(2027, 1, 15, tzinfo=UTC)
    row = {"agent": "a", "dialect": "AM2", "package": "org.apache.qpid.broker",
           "class_name": "queue", "object_id": oid, "index_key": f'["{oid}"]', "name": oid,
           "broker": "amqp-broker@h:5672", "create_ns": 5, "generation": 1, "created_at": at,
           "deleted_at": None, "first_seen": at, "last_seen": at, "first_seen_ns": 5,
           "last_seen_ns": 9, "samples": 3, "properties": [("name", oid), ("durable", "True")],
           "properties_ns": 9, "state": "live", "end_reason": None, "ended_at": None,
           "batch_id": 0}  # fmt: skip
    row.update(over)
    return row


def _lifecycles(rows: list[dict[str, Any]]) -> pl.DataFrame:
    import pyarrow as pa

    from schemas.gold import LIFECYCLE_STATE

    return tg.frame(pa.Table.from_pylist(rows, schema=LIFECYCLE_STATE))


def test_changed_rows_are_the_rows_a_merge_must_write_whatever_the_entry_order() -> None:
    """``changed_rows``: a new object, a changed column (state, a null that got a value),
    a changed property value, no map -> an empty one, an empty map -> one entry; not an
    equal row, nor one whose properties come in another entry order, nor a row differing
    in ``batch_id`` only; ``new``'s order. The same with a key repeated (the exact semi
    join)."""
    existing = _lifecycles([
        _lifecycle("q1"), _lifecycle("q2"), _lifecycle("q3"), _lifecycle("q4"),
        _lifecycle("q5"), _lifecycle("q6"), _lifecycle("gone"),
        _lifecycle("n1", properties=None), _lifecycle("n2", properties=None),
        _lifecycle("e1", properties=[]), _lifecycle("e2", properties=[]),
    ])  # fmt: skip
    new = _lifecycles([
        _lifecycle("q7"),  # new
        _lifecycle("q1", batch_id=4),  # equal but for batch_id
        _lifecycle("q2", state="deleted"),
        _lifecycle("q3", properties=[("durable", "True"), ("name", "q3")]),  # entry order
        _lifecycle("q4", properties=[("name", "q4"), ("durable", "False")]),
        _lifecycle("q5", end_reason="deleted"),  # null -> value
        _lifecycle("q6", properties=[("name", "q6"), ("durable", None)]),  # value -> null
        _lifecycle("q1", create_ns=6),  # the same object id re-created: a new key
        _lifecycle("n1", properties=None),  # no properties, as before
        _lifecycle("n2", properties=[]),  # none -> an empty map
        _lifecycle("e1", properties=[]),
        _lifecycle("e2", properties=[("name", "e2")]),
    ])  # fmt: skip
    want = [("q7", 5), ("q2", 5), ("q4", 5), ("q5", 5), ("q6", 5), ("q1", 6), ("n2", 5), ("e2", 5)]
    got = tg.changed_rows(new, existing)
    assert got.select("object_id", "create_ns").rows() == want
    assert got.schema == new.schema
    assert tg.changed_rows(new, new).height == 0
    twice = pl.concat([existing, existing.head(1)])  # a key repeated: the exact path
    assert tg.changed_rows(new, twice).select("object_id", "create_ns").rows() == want


# ------------------------------------------------------------------ issue 47: counts a real qpidd sends


def _deleted_rows(rows: Sequence[tuple[float, float, float]], delete_last: float) -> pl.DataFrame:
    """Silver-shaped samples of one queue (t, update s, enqueues) whose last row reports
    the object deleted at ``delete_last`` with a stale update time, as qpidd sends it."""
    n = len(rows)
    return pl.DataFrame({
        "agent": ["a"] * n, "dialect": ["V2"] * n, "epoch": [1] * n, "object_name": ["q"] * n,
        "boot_seq": pl.Series([None] * n, dtype=pl.Int64), "bank": pl.Series([None] * n, dtype=pl.Int64),
        "flags": pl.Series([None] * n, dtype=pl.Int64), "broker_bank": pl.Series([None] * n, dtype=pl.Int64),
        "agent_bank": pl.Series([None] * n, dtype=pl.Int64), "object_num": pl.Series([None] * n, dtype=pl.Int64),
        "index_key": ['["q"]'] * n,
        "update_ns": [T0 + int(u * S) for _, u, _ in rows],
        "delete_ns": [0] * (n - 1) + [T0 + int(delete_last * S)],
    })  # fmt: skip


def test_a_delete_record_with_a_stale_update_time_is_sampled_at_its_delete_time() -> None:
    """qpidd's last record of a deleted object keeps its previous publish's update time:
    its sample time is the delete time, so it is no twin and its final counts stay."""
    s = _deleted_rows([(0, 0.0, 0.0), (1, 2.0, 10.0), (2, 2.0, 14.0)], delete_last=3.2)
    got = tg.identify(s)["update_ns"].to_list()
    assert got == [T0, T0 + 2 * S, T0 + int(3.2 * S)]
    # An update time later than the delete time (never from qpidd) stays.
    s = s.with_columns(delete_ns=pl.Series([0, 0, T0 + 1 * S]))
    assert tg.identify(s)["update_ns"].to_list() == [T0, T0 + 2 * S, T0 + 2 * S]


def test_a_new_object_counts_from_zero_at_its_create_time() -> None:
    """A queue created 1.5 s before its first sample: its first interval starts at the create
    time from 0, so the sum of its deltas is its final value; then the delete record (at
    its delete time) closes the series with the final counts; its twin adds nothing."""
    created = T0 - int(1.5 * S)
    rows = samples([("tq", 0.0, 4.0), ("tq", 1.0, 9.0), ("tq", 1.7, 12.0), ("tq", 1.7, 12.0)], deleted_at=1.7)
    rows = rows.with_columns(create_ns=pl.lit(created, pl.Int64))
    r = tg.rates_from_pairs(tg.pair_values(rows, tg.RateRules()).rates, 0).sort("end_ns")
    assert r.select("start_ns", "end_ns", "prev_value", "delta", "reset").rows() == [
        (created, T0, 0.0, 4.0, None),
        (T0, T0 + S, 4.0, 5.0, None),
        (T0 + S, T0 + int(1.7 * S), 9.0, 3.0, None),
    ]
    assert sum(r["delta"]) == 12.0
    # One created longer than max_gap_s before its first sample: that sample is the baseline.
    old = rows.with_columns(create_ns=pl.lit(T0 - 301 * S, pl.Int64))
    r = tg.rates_from_pairs(tg.pair_values(old, tg.RateRules()).rates, 0)
    assert sorted(r["start_ns"].to_list()) == [T0, T0 + S]
    # A transient published once, with both times: one interval from its creation.
    one = samples([("tq", 1.7, 12.0)], deleted_at=1.7).with_columns(create_ns=pl.lit(created, pl.Int64))
    r = tg.rates_from_pairs(tg.pair_values(one, tg.RateRules()).rates, 0)
    assert r.select("start_ns", "end_ns", "delta").rows() == [(created, T0 + int(1.7 * S), 12.0)]
    # Created 0.2 s before its first sample: the counts stay, a rate over 0.2 s is none
    # (shorter than the minimum interval, as a reply queue's one message 3 ms after it).
    soon = rows.with_columns(create_ns=pl.lit(T0 - int(0.2 * S), pl.Int64))
    r = tg.rates_from_pairs(tg.pair_values(soon, tg.RateRules()).rates, 0).sort("end_ns")
    assert r.select("start_ns", "end_ns", "delta", "rate", "reset").rows()[0] == (
        T0 - int(0.2 * S), T0, 4.0, None, None
    )
    # Gauges and other kinds never count from a create time.
    g = rows.with_columns(kind=pl.lit("gauge"))
    assert tg.rates_from_pairs(tg.pair_values(g, tg.RateRules()).rates, 0)["start_ns"].min() == T0


def test_an_object_recreated_by_a_restart_counts_from_zero_at_its_create_time() -> None:
    """The baseline is the old generation's last sample; the re-created object's counters
    started at 0 at its create time (after that baseline): its first interval counts from
    there. The state's baseline (a later micro-batch) gives the same rows."""
    old = samples([("q", 0.0, 100.0), ("q", 10.0, 150.0)])
    restart = T0 + 12 * S
    new = samples([("q", 14.0, 25.0), ("q", 16.0, 40.0)]).with_columns(
        create_ns=pl.lit(restart, pl.Int64), generation=pl.lit(2, pl.Int64),
        object_id=pl.lit("o-q2"), offset=pl.Series([10, 11], dtype=pl.Int64),
    )  # fmt: skip
    want = [
        (T0, T0 + 10 * S, 100.0, 50.0, None),
        (restart, T0 + 14 * S, 0.0, 25.0, None),
        (T0 + 14 * S, T0 + 16 * S, 25.0, 15.0, None),
    ]
    cols = ("start_ns", "end_ns", "prev_value", "delta", "reset")
    one = tg.pair_values(pl.concat([old, new]), tg.RateRules())
    assert tg.rates_from_pairs(one.rates, 0).sort("end_ns").select(cols).rows() == want
    # After a restart the first interval's counts are the broker's (a store counts the
    # messages it recovered as enqueues): no rate for it, the next ones have theirs.
    assert tg.rates_from_pairs(one.rates, 0).sort("end_ns")["rate"].to_list() == [5.0, None, 7.5]
    first = tg.pair_values(old, tg.RateRules())
    second = tg.pair_values(pl.concat([new, tg.state_values(first.state)]), tg.RateRules())
    both = pl.concat([tg.rates_from_pairs(first.rates, 0), tg.rates_from_pairs(second.rates, 1)])
    assert both.sort("end_ns").select(cols).rows() == want
    # Without a create time after the baseline the reset stays (no count is invented).
    unknown = new.with_columns(create_ns=pl.lit(0, pl.Int64))
    r = tg.rates_from_pairs(tg.pair_values(pl.concat([old, unknown]), tg.RateRules()).rates, 0)
    assert r.sort("end_ns").select("delta", "reset").rows()[1] == (None, "agent_restart")


def test_restarts_from_generations_and_an_outage_recorded_alike_in_both_dialects() -> None:
    """A v1 heartbeat carries no epoch: the agent's objects show the restart. A v2 agent
    whose epoch changed after an outage is down through the outage, as the v1 one is."""
    life = pl.DataFrame({"agent": ["v1", "v1", "v2"], "generation": [1, None, 4],
                         "first_seen_ns": [T0, T0, T0]})  # fmt: skip
    ident = pl.DataFrame({"agent": ["v1", "v2"], "generation": [2, 5],
                          "update_ns": [T0 + 30 * S, T0 + 31 * S]})  # fmt: skip
    assert tg.agent_restarts(life, ident) == {"v1": [T0 + 30 * S], "v2": [T0 + 31 * S]}
    rules = tg.LivenessRules(missed=3)
    rows = {}
    for agent, dialect, ep in (("v1", "AM2", None), ("v2", "V2", 4)):
        beats = [(T0 + t * S, ep, 1.0, dialect) for t in range(0, 11)]
        after = 5 if ep is not None else None
        beats += [(T0 + t * S, after, 1.0, dialect) for t in range(30, 41)]
        rows[agent] = tg.liveness_scan(
            beats, agent, None, T0 + 40 * S, rules, 0, tg.agent_restarts(life, ident).get(agent, ())
        )
    for agent in ("v1", "v2"):
        got = [(r["state"], r["started_by"], r["down_at"]) for r in rows[agent]]
        assert got == [("down", "first", tg._ts_py(T0 + 13 * S)), ("up", "restart", None)], agent
    # A new epoch without an outage: restarted, no down time.
    beats = [(T0 + t * S, 4 if t < 5 else 5, 1.0, "V2") for t in range(10)]
    got = [(r["state"], r["started_by"]) for r in tg.liveness_scan(beats, "v2", None, T0 + 9 * S, rules, 0)]
    assert got == [("restarted", "first"), ("up", "restart")]
    # The same for a v1 agent, whose heartbeats carry no epoch: its objects' new
    # generation, first seen between the heartbeats at 4 s and 5 s (a 1.2 s restart in a
    # live qpidd trial), closes the interval alike; a restart time seen before the
    # interval's last heartbeat (an older batch's) does not close it again.
    beats = [(T0 + t * S, None, 1.0, "AM2") for t in range(10)]
    restart = [T0 + 4 * S + S // 2]
    for restarts, want in (
        (restart, [("restarted", "first", 0, 5), ("up", "restart", 5, 5)]),
        ([], [("up", "first", 0, 10)]),
    ):
        got = [(r["state"], r["started_by"], (r["up_start_ns"] - T0) // S, r["heartbeats"])
               for r in tg.liveness_scan(beats, "1.0", None, T0 + 9 * S, rules, 0, restarts)]  # fmt: skip
        assert got == want
    after = tg.liveness_scan(beats, "1.0", None, T0 + 9 * S, rules, 0, restart)[1]
    more = [(T0 + t * S, None, 1.0, "AM2") for t in range(10, 13)]
    cont = tg.liveness_scan(more, "1.0", after, T0 + 12 * S, rules, 1, restart)
    assert [(r["state"], r["started_by"], r["heartbeats"]) for r in cont] == [("up", "restart", 8)]


def test_lifecycles_across_a_restart_old_generation_lost_new_objects_live() -> None:
    """qpidd's start-up objects (epoch 0: no generation) of the old boot end lost at the
    restart, as its queues do; an object seen after the restart is never lost at it,
    whatever its generation (a new memory object), and new objects are live."""
    from schemas.gold import AGENT_LIVENESS, LIFECYCLE_STATE

    def upd(oid: str, gen: int | None, create: int, first: float, last: float) -> dict[str, Any]:
        return {"agent": "a", "object_id": oid, "create_ns": create, "dialect": "V2", "package": "p",
                "class_name": oid.split(":")[0], "index_key": f'["{oid}"]', "generation": gen,
                "first_seen_ns": T0 + int(first * S), "last_seen_ns": T0 + int(last * S), "samples": 2,
                "delete_ns": None, "properties": None, "properties_ns": None}  # fmt: skip

    rows = [
        upd("broker:0", None, 1, 0, 10), upd("queue:1", 1, 2, 0, 10), upd("vhost:0", None, 3, 0, 0),
        upd("broker:0", None, 50, 20, 30), upd("queue:2", 2, 51, 20, 30), upd("memory:1", 1, 52, 21, 30),
    ]
    updates = pl.DataFrame(rows).with_columns(
        pl.col("properties").cast(pl.Map(pl.Utf8, pl.Utf8)), pl.col("delete_ns", "properties_ns").cast(pl.Int64)
    )
    empty = pl.DataFrame(schema=pl.Schema(pl.from_arrow(LIFECYCLE_STATE.empty_table()).schema))
    live = pl.DataFrame(schema=pl.Schema(pl.from_arrow(AGENT_LIVENESS.empty_table()).schema))
    got = tg.merge_lifecycles(empty, updates, live, 0).sort("create_ns")
    restart = tg._ts_py(T0 + 20 * S)
    assert got.select("object_id", "state", "end_reason", "ended_at").rows() == [
        ("broker:0", "lost", "agent_restart", restart),
        ("queue:1", "lost", "agent_restart", restart),
        ("vhost:0", "lost", "agent_restart", restart),
        ("broker:0", "live", None, None),
        ("queue:2", "live", None, None),
        ("memory:1", "live", None, None),
    ]
    # The first generation seen is no restart: start-up objects seen before it stay live.
    first = updates.filter(pl.col("create_ns") < 50).with_columns(
        first_seen_ns=pl.when(pl.col("generation").is_null()).then(T0).otherwise(T0 + 5 * S)
    )
    got = tg.merge_lifecycles(empty, first, live, 0)
    assert set(got["state"]) == {"live"}


def test_a_creation_interval_waits_for_its_index_key_so_a_stream_writes_what_one_batch_does() -> None:
    """Statistics of a new object before its properties (another micro-batch): its first
    sample owes its creation interval in the state (``from_create_ns``) until the key comes,
    then writes the row a single batch writes, key included; a deleted one too."""
    created = T0 - 2 * S
    key = '["vh","q1"]'

    def rows(keyed: bool, deleted: bool) -> pl.DataFrame:
        r = samples([("o-q1", 0.0, 7.0)], deleted_at=0.0 if deleted else None)
        return r.with_columns(create_ns=pl.lit(created, pl.Int64), object_id=pl.lit("o-q1"),
                              index_key=pl.lit(key if keyed else None, pl.Utf8),
                              series=pl.lit(key if keyed else "o-q1"))  # fmt: skip

    cols = ("index_key", "start_ns", "end_ns", "prev_value", "delta")
    gone = pl.DataFrame({"agent": ["1.0"], "object_id": ["o-q1"]})
    keys = pl.DataFrame({"agent": ["1.0"], "object_id": ["o-q1"], "_k": [key]})
    for deleted in (False, True):
        one = tg.pair_values(rows(True, deleted), tg.RateRules())
        want = tg.rates_from_pairs(one.rates, 0).select(cols).rows()
        assert want == [(key, created, T0, 0.0, 7.0)]
        first = tg.pair_values(rows(False, deleted), tg.RateRules())
        assert first.rates.height == 0
        state = tg.state_from_pairs(first.state, gone if deleted else None)
        assert state["from_create_ns"].to_list() == [created]  # kept, even deleted
        second = tg.pair_values(tg.state_values(tg.rekey_state(state, keys)), tg.RateRules())
        assert tg.rates_from_pairs(second.rates, 1).select(cols).rows() == want
        assert second.state["from_create_ns"].to_list() == [None]
        assert tg.state_from_pairs(second.state, gone).height == 0


def test_refreshed_samples_are_data_and_twins_of_a_publish_count_once() -> None:
    """The console's refresh answers (issue 47) are samples like the periodic publishes:
    an answer of an unchanged object carries its last publish's update time (a twin:
    no interval); an answer after another console's query cleared the changed flag,
    with nothing published after it, brings the final counts."""
    publishes = [("q", 0.0, 0.0), ("q", 2.0, 10.0), ("q", 4.0, 20.0)]
    answers = [("q", 4.0, 20.0), ("q", 7.3, 31.0)]  # a twin of 4.0, then the last counts
    rows = samples([*publishes, *answers])
    r = tg.rates_from_pairs(tg.pair_values(rows, tg.RateRules()).rates, 0).sort("end_ns")
    assert r.select("start_ns", "end_ns", "delta").rows() == [
        (T0, T0 + 2 * S, 10.0), (T0 + 2 * S, T0 + 4 * S, 10.0), (T0 + 4 * S, T0 + int(7.3 * S), 11.0),
    ]
    assert r["value"].to_list()[-1] == 31.0 and sum(r["delta"]) == 31.0
