"""The progress line qmf run prints is what qmf soak reads; the summary's queue ranking,
its names (the gold lifecycles' ``name`` and ``broker``) and its tables for people."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from pipeline.commands.soak import PROGRESS
from pipeline.views.progress import (
    Named,
    ProgressDisplay,
    ProgressStats,
    Rates,
    lifecycle_names,
    print_summary,
    progress_line,
    progress_stats,
    top_queues,
)


def test_soak_reads_the_progress_line() -> None:
    rates = Rates()
    first = progress_line(0.0, 1_000, 900, {"object_samples": 10, "quarantine": 2}, rates)
    assert rates.per_s("landed", 3_000, now=rates.last["landed"][0] + 2.0) == 1_000.0
    line = progress_line(4.0, 12_345, 12_000, {"object_samples": 5_000, "quarantine": 2}, rates)
    m = PROGRESS.search(line)
    assert m is not None and m.groups() == ("12,345", "12,000", "345")
    assert "quarantine 2" in first and "rows object_samples=10" in first


def test_top_queues_by_mean_enqueue_rate() -> None:
    t = pa.table({
        "agent": ["a", "a", "a", "b", "a"],
        "class_name": ["queue", "queue", "queue", "queue", "exchange"],
        "index_key": ["q1", "q1", "q2", None, "x"],
        "object_id": ["1", "1", "2", "9", "3"],
        "statistic": ["msgTotalEnqueues"] * 4 + ["msgReceives"],
        "rate": [10.0, 20.0, 12.0, None, 99.0],
    })  # fmt: skip
    # No lifecycles: named by the index key's last value, the broker is the agent.
    assert top_queues(t) == [
        {"agent": "a", "queue": "q1", "name": "q1", "broker": "a", "enqueue_rate": 15.0,
         "intervals": 2},
        {"agent": "a", "queue": "q2", "name": "q2", "broker": "a", "enqueue_rate": 12.0,
         "intervals": 1},
    ]  # fmt: skip


def test_top_queues_take_their_names_from_the_latest_lifecycle() -> None:
    """Rates carry ids: the name and broker come from the lifecycle row of (agent,
    object_id), the latest of a series' objects (an agent restart renumbers a queue);
    a queue without a named lifecycle falls back to its key and its agent's broker."""
    key1, key2 = '["1-1-3","q00021"]', '["1-1-3","q00007"]'
    t = pa.table({
        "agent": ["a", "a", "a", "a"],
        "class_name": ["queue"] * 4,
        "index_key": [key1, key1, key2, key2],
        "object_id": ["1-1-21", "2-1-21", "1-1-7", "1-1-7"],  # q00021 before and after a restart
        "statistic": ["msgTotalEnqueues"] * 4,
        "rate": [30.0, 50.0, 10.0, 20.0],
    })  # fmt: skip
    names = {
        ("a", "1-1-21"): Named("old-name", "amqp-broker@h:5672", batch_id=1, last_seen_ns=5),
        ("a", "2-1-21"): Named("q00021", "amqp-broker@h:5672", batch_id=3, last_seen_ns=9),
        ("a", "1-1-7"): Named(None, None, batch_id=3, last_seen_ns=9),  # before gold named it
    }
    assert top_queues(t, names=names) == [
        {"agent": "a", "queue": key1, "name": "q00021", "broker": "amqp-broker@h:5672",
         "enqueue_rate": 40.0, "intervals": 2},
        {"agent": "a", "queue": key2, "name": "q00007", "broker": "amqp-broker@h:5672",
         "enqueue_rate": 15.0, "intervals": 2},
    ]  # fmt: skip


def test_lifecycle_names_keep_the_latest_row_per_object() -> None:
    """Max batch_id, then last_seen_ns; a table written before the name columns gives None."""
    life = pa.table({
        "agent": ["a", "a", "a", "b"],
        "object_id": ["1", "1", "1", "1"],
        "batch_id": [2, 5, 5, 1],
        "last_seen_ns": [100, 50, 60, 10],
        "name": ["x", "y", "z", "w"],
        "broker": ["B1", "B1", "B2", None],
    })  # fmt: skip
    assert lifecycle_names(life) == {
        ("a", "1"): Named("z", "B2", 5, 60),
        ("b", "1"): Named("w", None, 1, 10),
    }
    old = life.drop_columns(["name", "broker"])
    assert lifecycle_names(old)[("a", "1")] == Named(None, None, 5, 60)


def test_progress_prints_lines_off_a_terminal() -> None:
    """Piped (qmf soak, a log): one full line per update, as before."""
    out = io.StringIO()
    counts = {"object_samples": 9, "statistic_rates": 4, "quarantine": 1}
    with ProgressDisplay(out) as display:
        assert not display.live
        display.update(ProgressStats(1.0, 10, 5, {"object_samples": 3}, 10.0, 3.0))
        display.update(ProgressStats(2.0, 1_020, 1_000, counts, 1_010.0, 6.0))
    assert out.getvalue().splitlines() == [
        "qmf run:    1.0s | in 10 msg/s (10 landed) | bronze 5 (lag 5) | decoded 3 samples/s "
        "| rows object_samples=3 | quarantine 0",
        "qmf run:    2.0s | in 1,010 msg/s (1,020 landed) | bronze 1,000 (lag 20) | decoded 6 "
        "samples/s | rows object_samples=9 statistic_rates=4 | quarantine 1",
    ]
    assert PROGRESS.search(out.getvalue().splitlines()[1]).groups() == ("1,020", "1,000", "20")  # type: ignore[union-attr]


def test_progress_redraws_one_line_on_a_terminal() -> None:
    """On a terminal the line is redrawn in place (cursor up, erase line), not repeated:
    the first state is erased, the last one stays on the screen; printing during the
    display goes above the line."""
    out = io.StringIO()
    stats = [progress_stats(float(i), 100 * i, 90 * i, {"object_samples": i}, Rates())
             for i in (1, 2)]  # fmt: skip
    with ProgressDisplay(out, live=True, width=200) as display:
        display.update(stats[0])
        print("a warning of ours")
        display.update(stats[1])
    text = out.getvalue()
    # Back to the line's start and erase it: redrawn in place, the warning printed above.
    assert text.startswith("\x1b[?25l" + stats[0].compact() + "\r\x1b[2Ka warning of ours\n")
    assert text.endswith("\r\x1b[2K" + stats[1].compact() + "\n\x1b[?25h")
    assert "\n" not in text.replace("a warning of ours\n", "")[: -len("\n\x1b[?25h")]
    assert stats[1].compact() == (
        "qmf run 2s | in 0 msg/s, 200 landed | bronze 180 (lag 20) | 0 samples/s | rows: "
        "silver 2, gold 0 | quarantine 0"
    )


def _rates(rows: list[tuple[str, str, str, float]], batch_id: int) -> pa.Table:
    """statistic_rates rows (agent, queue, statistic, rate), other columns filled in."""
    from schemas.gold import STATISTIC_RATES

    n = len(rows)
    cols: dict[str, list[object]] = {
        "agent": [r[0] for r in rows], "dialect": ["AM2"] * n, "package": ["org.apache.qpid.broker"] * n,
        "class_name": ["queue"] * n, "object_id": [r[1] for r in rows], "index_key": [r[1] for r in rows],
        "statistic": [r[2] for r in rows], "kind": ["counter"] * n, "start_ns": [0] * n,
        "end_ns": [10**10] * n, "start_time": [0] * n, "end_time": [10**7] * n, "length_s": [10.0] * n,
        "prev_value": [None] * n, "value": [None] * n, "delta": [None] * n, "rate": [r[3] for r in rows],
        "value_min": [None] * n, "value_max": [None] * n, "reset": [None] * n, "batch_id": [batch_id] * n,
    }  # fmt: skip
    return pa.table(cols).cast(STATISTIC_RATES)


def test_summary_reads_the_newest_rate_rows_up_to_its_bound(tmp_path: Path) -> None:
    """Three commits of rates: the summary ranks queues over all of them, or only over
    the newest files within ``rate_rows``, and says so."""
    from pipeline.lake import delta
    from pipeline.views.progress import summary
    from schemas.gold import STATISTIC_RATES

    path = tmp_path / "gold" / "statistic_rates"
    delta.create_table(path, STATISTIC_RATES, name="statistic_rates")
    old = [("a", "q1", "msgTotalEnqueues", 100.0), ("a", "q2", "msgTotalEnqueues", 1.0),
           ("a", "q1", "msgTotalDequeues", 7.0)]  # fmt: skip
    for k, rows in enumerate([old, old, [("a", "q2", "msgTotalEnqueues", 3.0)] * 2]):
        delta.append_arrow(_rates(rows, k), path, app_id="t", batch_id=k)
        time.sleep(0.05)  # distinct modification times: the last commit is the newest
    full = summary(tmp_path)
    assert full["top_queues_by_enqueue_rate"] == [
        {"agent": "a", "queue": "q1", "name": "q1", "broker": "a", "enqueue_rate": 100.0,
         "intervals": 2},
        {"agent": "a", "queue": "q2", "name": "q2", "broker": "a", "enqueue_rate": 2.0,
         "intervals": 4},
    ]  # fmt: skip
    assert "top_queues_over" not in full
    assert full["silver_object_samples"] == 0  # no silver: counts are 0, nothing fails
    newest = summary(tmp_path, rate_rows=3)
    assert newest["top_queues_by_enqueue_rate"] == [
        {"agent": "a", "queue": "q2", "name": "q2", "broker": "a", "enqueue_rate": 3.0,
         "intervals": 2}
    ]  # fmt: skip
    assert newest["top_queues_over"] == "the newest 2 of 8 rate rows"
    one = summary(tmp_path, rate_rows=0)  # at least one file, whatever the bound
    assert one["top_queues_over"] == "the newest 2 of 8 rate rows"


def _lifecycles(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """lifecycle_state rows: agent, class_name, object_id, name, broker, state, times."""
    n = len(rows)
    base: dict[str, list[Any]] = {
        "agent": [r["agent"] for r in rows], "dialect": [r.get("dialect", "AM2") for r in rows],
        "package": ["org.apache.qpid.broker"] * n, "class_name": [r["class_name"] for r in rows],
        "object_id": [r["object_id"] for r in rows],
        "index_key": [json.dumps(["0-0-1-0-3", r["object_id"]]) for r in rows],
        "name": [r.get("name") for r in rows], "broker": [r.get("broker") for r in rows],
        "create_ns": [r.get("create_ns", 0) for r in rows], "generation": [None] * n, "created_at": [r["created"] for r in rows],
        "deleted_at": [r["deleted"] for r in rows], "first_seen": [0] * n, "last_seen": [0] * n,
        "first_seen_ns": [r["first"] for r in rows], "last_seen_ns": [r["last"] for r in rows],
        "samples": [1] * n, "properties": [None] * n, "properties_ns": [None] * n,
        "state": [r["state"] for r in rows], "end_reason": [None] * n, "ended_at": [None] * n,
        "batch_id": [0] * n,
    }  # fmt: skip
    return pa.table({f.name: base[f.name] for f in schema}).cast(schema)


_LIFE = [
    {"agent": "1.0", "class_name": "queue", "object_id": "q-rate-50", "name": "q-rate-50",
     "broker": "amqp-broker@vm:5672", "created": 1, "deleted": None, "first": 1, "last": 9,
     "state": "live"},
    {"agent": "1.0", "class_name": "queue", "object_id": "tmp", "name": "tmp",
     "broker": "amqp-broker@vm:5672", "created": 2, "deleted": 2, "first": 5, "last": 5,
     "state": "deleted"},
    {"agent": "1.0", "class_name": "broker", "object_id": "b", "name": "amqp-broker",
     "broker": "amqp-broker@vm:5672", "created": 1, "deleted": None, "first": 1, "last": 9,
     "state": "live"},
]  # fmt: skip


def _liveness(path: Path) -> None:
    from pipeline.lake import delta
    from schemas.gold import AGENT_LIVENESS

    rows = {"agent": ["1.0", "1.0"], "dialect": ["AM2", "AM2"], "epoch": [1, 2],
            "up_start_ns": [0, 10**10], "up_start": [0, 10**7], "last_heartbeat_ns": [5, 2 * 10**10],
            "last_heartbeat": [0, 0], "heartbeats": [3, 4], "interval_s": [10.0, 10.0],
            "state": ["restarted", "up"], "started_by": ["first", "restart"],
            "down_at": [None, None], "next_up": [None, None], "batch_id": [0, 0]}  # fmt: skip
    delta.create_table(path, AGENT_LIVENESS, name="agent_liveness")
    delta.append_arrow(pa.table(rows).cast(AGENT_LIVENESS), path, app_id="t", batch_id=0)


def test_summary_for_people_names_queues_and_brokers(tmp_path: Path) -> None:
    """Lifecycles with names: the JSON gains them, the tables show them, objects per
    class, events by severity in severity order, agents by broker with their restarts."""
    from pipeline.gold.fold import fold_lifecycles
    from pipeline.gold.transforms import conform
    from pipeline.lake import delta
    from pipeline.views.progress import summary
    from schemas.gold import LIFECYCLE_STATE, OBJECT_LIFECYCLES, STATISTIC_RATES
    from schemas.silver import EVENTS

    gold = tmp_path / "gold"
    # qpidd with QMF v1 and v2: every object reported by both agents of its broker, so
    # the state has two rows per object and the fold (objects in the summary) one.
    rows = [{**r, "create_ns": r["created"]} for r in _LIFE]
    both = rows + [{**r, "agent": "apache.org:qpidd:u", "dialect": "V2"} for r in rows]
    state = _lifecycles(both, LIFECYCLE_STATE)
    folded = conform(fold_lifecycles(pl.DataFrame(state)), OBJECT_LIFECYCLES)
    assert (state.num_rows, folded.num_rows) == (6, 3)
    for name, table, schema in (("lifecycle_state", state, LIFECYCLE_STATE),
                                ("object_lifecycles", folded, OBJECT_LIFECYCLES)):
        delta.create_table(gold / name, schema, name=name)
        delta.append_arrow(table, gold / name, app_id="t", batch_id=0)  # fmt: skip
    rates = _rates([("1.0", "q-rate-50", "msgTotalEnqueues", 50.0)], 0)
    delta.create_table(gold / "statistic_rates", STATISTIC_RATES, name="statistic_rates")
    delta.append_arrow(rates, gold / "statistic_rates", app_id="t", batch_id=0)
    _liveness(gold / "agent_liveness")
    events = tmp_path / "silver" / "events"
    delta.create_table(events, EVENTS, name="events")
    ev: dict[str, list[Any]] = {f.name: [None] * 3 for f in EVENTS}
    ev.update(severity=[4, 6, 6])
    delta.append_arrow(_filled(ev, EVENTS), events, app_id="t", batch_id=0)

    s = summary(tmp_path)
    assert s["top_queues_by_enqueue_rate"] == [
        {"agent": "1.0", "queue": "q-rate-50", "name": "q-rate-50",
         "broker": "amqp-broker@vm:5672", "enqueue_rate": 50.0, "intervals": 1}
    ]  # fmt: skip
    assert s["objects"]["by_class"] == {
        "broker": {"seen": 1, "created": 1, "deleted": 0, "transient": 0, "live": 1},
        "queue": {"seen": 2, "created": 2, "deleted": 1, "transient": 1, "live": 1},
    }
    assert s["events_by_severity"] == {"info": 2, "warn": 1}
    assert s["agents"] == {
        "seen": 1, "intervals_by_state": {"restarted": 1, "up": 1}, "restarts": 1,
        "by_agent": [{"agent": "1.0", "broker": "amqp-broker@vm:5672", "dialect": "AM2",
                      "intervals": 2, "restarts": 1, "heartbeats": 7, "state": "up"}],
    }  # fmt: skip
    out = io.StringIO()
    print_summary(s, out)
    lines = [" ".join(line.replace("│", " ").split()) for line in out.getvalue().splitlines()]
    assert "q-rate-50 amqp-broker@vm:5672 50.0 1" in lines
    assert "queue 2 2 1 1 1" in lines and "all 3 3 1 1 2" in lines
    assert lines.index("warn 1") < lines.index("info 2")  # severity order, not alphabetical
    assert "amqp-broker@vm:5672 1.0 AM2 up 2 1" in lines
    assert "silver events 3" in lines
    assert "silver agent observations 0" in lines  # rows of silver.agents, not agents
    assert "[" not in out.getvalue().split("Objects")[0].split("\n", 1)[1]  # no ids as names


def _filled(cols: dict[str, list[Any]], schema: pa.Schema) -> pa.Table:
    """Rows of ``schema`` from ``cols``, the non-nullable columns given a value."""
    n = len(next(iter(cols.values())))
    for f in schema:
        if not f.nullable and cols[f.name][0] is None:
            cols[f.name] = [{} if pa.types.is_map(f.type) else "" if pa.types.is_string(f.type)
                            else 0] * n  # fmt: skip
    return pa.table({f.name: pa.array(cols[f.name], f.type) for f in schema}, schema=schema)


def test_summary_of_tables_written_before_the_name_columns(tmp_path: Path) -> None:
    """An older lake (lifecycles without ``name``/``broker``): the summary still runs, the
    queues named by their index key's last value and the broker by the agent."""
    from pipeline.lake import delta
    from pipeline.views.progress import summary
    from schemas.gold import LIFECYCLE_STATE, STATISTIC_RATES

    old = pa.schema([f for f in LIFECYCLE_STATE if f.name not in ("name", "broker")])
    gold = tmp_path / "gold"
    delta.create_table(gold / "object_lifecycles", old, name="object_lifecycles")
    delta.append_arrow(_lifecycles(_LIFE, old), gold / "object_lifecycles", app_id="t",
                       batch_id=0)  # fmt: skip
    delta.create_table(gold / "statistic_rates", STATISTIC_RATES, name="statistic_rates")
    rates = _rates([("1.0", '["0-0-1-0-3","q-rate-50"]', "msgTotalEnqueues", 5.0)], 0)
    delta.append_arrow(rates, gold / "statistic_rates", app_id="t", batch_id=0)
    s = summary(tmp_path)
    assert [(q["name"], q["broker"]) for q in s["top_queues_by_enqueue_rate"]] == [
        ("q-rate-50", "1.0")
    ]
    assert s["objects"]["seen"] == 3


def test_top_queues_list_a_queue_once_whatever_the_dialects_its_broker_published() -> None:
    """qpidd with QMF v1 and v2 on: one queue under the AM2 agent and the V2 agent of one
    broker (issue 47): listed once (both series give the same rates)."""
    t = pa.table({
        "agent": ["1.0", "1.0", "apache.org:qpidd:x", "1.0"],
        "class_name": ["queue"] * 4,
        "index_key": ['["0-0-1-0-3","q-rate-5"]'] * 2 + ['["{}","q-rate-5"]', '["0-0-1-0-3","q2"]'],
        "object_id": ["0-1-1-0-9", "0-1-1-0-9", "1:q-rate-5", "0-1-1-0-8"],
        "statistic": ["msgTotalEnqueues"] * 4,
        "rate": [5.0, 5.0, 5.0, 1.0],
    })  # fmt: skip
    names = {
        ("1.0", "0-1-1-0-9"): Named("q-rate-5", "amqp-broker@h:5672", batch_id=1, last_seen_ns=5),
        ("apache.org:qpidd:x", "1:q-rate-5"): Named("q-rate-5", "amqp-broker@h:5672", batch_id=1, last_seen_ns=5),
        ("1.0", "0-1-1-0-8"): Named("q2", "amqp-broker@h:5672", batch_id=1, last_seen_ns=5),
    }
    got = [(r["broker"], r["name"], r["enqueue_rate"]) for r in top_queues(t, names=names)]
    assert got == [("amqp-broker@h:5672", "q-rate-5", 5.0), ("amqp-broker@h:5672", "q2", 1.0)]


def test_top_queues_count_a_queue_whole_across_restarts_and_key_forms() -> None:
    """The live trial's q-rate-20 (issue 47): V2 rows whose first intervals came before the
    properties (keyed by the object id), AM2 rows under two object ids and epochs (a
    restart): one queue, every interval counted, from the V2 agent on a tie."""
    v2, key = "apache.org:qpidd:x", '["{\\\\"_agent_epoch\\\\":1,\\\\"_object_name\\\\":\\\\"vh\\\\"}","q-rate-20"]'
    t = pa.table({
        "agent": [v2] * 4 + ["1.0"] * 4,
        "dialect": ["V2"] * 4 + ["AM2"] * 4,
        "class_name": ["queue"] * 8,
        "index_key": [None, key, key, key.replace("1,", "2,"), '["0-1-1-0-3","q-rate-20"]',
                      '["0-1-1-0-3","q-rate-20"]', '["0-2-1-0-3","q-rate-20"]', '["0-2-1-0-3","q-rate-20"]'],
        "object_id": ["1:q", "1:q", "1:q", "2:q", "0-1-1-0-9", "0-1-1-0-9", "0-2-1-0-9", "0-2-1-0-9"],
        "statistic": ["msgTotalEnqueues"] * 8,
        "rate": [20.0, 20.0, 20.0, 20.0, 20.0, 20.0, 20.0, 20.0],
    })  # fmt: skip
    b = "amqp-broker@h:5672"
    names = {(a, o): Named("q-rate-20", b, batch_id=1, last_seen_ns=5)
             for a, o in zip(t["agent"].to_pylist(), t["object_id"].to_pylist(), strict=True)}  # fmt: skip
    got = [(r["agent"], r["name"], r["enqueue_rate"], r["intervals"]) for r in top_queues(t, names=names)]
    assert got == [(v2, "q-rate-20", 20.0, 4)]
