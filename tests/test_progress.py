"""The progress line qmf run prints is what qmf soak reads; the summary's queue ranking."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa

from pipeline.commands.soak import PROGRESS
from pipeline.progress import Rates, progress_line, top_queues


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
    assert top_queues(t) == [
        {"agent": "a", "queue": "q1", "enqueue_rate": 15.0, "intervals": 2},
        {"agent": "a", "queue": "q2", "enqueue_rate": 12.0, "intervals": 1},
    ]


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
    from pipeline import delta
    from pipeline.progress import summary
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
        {"agent": "a", "queue": "q1", "enqueue_rate": 100.0, "intervals": 2},
        {"agent": "a", "queue": "q2", "enqueue_rate": 2.0, "intervals": 4},
    ]
    assert "top_queues_over" not in full
    assert full["silver_object_samples"] == 0  # no silver: counts are 0, nothing fails
    newest = summary(tmp_path, rate_rows=3)
    assert newest["top_queues_by_enqueue_rate"] == [
        {"agent": "a", "queue": "q2", "enqueue_rate": 3.0, "intervals": 2}
    ]
    assert newest["top_queues_over"] == "the newest 2 of 8 rate rows"
    one = summary(tmp_path, rate_rows=0)  # at least one file, whatever the bound
    assert one["top_queues_over"] == "the newest 2 of 8 rate rows"
