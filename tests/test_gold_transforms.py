"""Gold's pure transforms (polars/numpy on the driver): no Spark, no Delta."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl
import pytest

from pipeline.transforms import gold as tg

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
            "update_ns": [T0 + int(r[2] * S) for r in rows], "create_ns": [T0] * n,
            "generation": [1] * n, "value": [r[3] for r in rows], "partition": ["p0"] * n,
            "offset": list(range(n)), "record_index": [0] * n, "deleted": [False] * n,
            "is_state": [False] * n,
        }
    )


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
    exact, groups = tg._sorted_by_series(v)
    collided, cgroups = tg._sorted_by_series(v, hash_expr=pl.lit(7, pl.UInt64))  # every key collides
    # Boundaries are exact either way: 3 series, each contiguous and in time order.
    assert int(groups.sum()) == int(cgroups.sum()) == 3
    for t in (exact, collided):
        keys = list(zip(t["series"], t["statistic"], strict=True))
        assert len({k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k}) == 3
        for k in set(keys):
            ts = [u for kk, u in zip(keys, t["update_ns"], strict=True) if kk == k]
            assert ts == sorted(ts)


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
