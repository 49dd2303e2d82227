"""The progress line qmf run prints is what qmf soak reads; the summary's queue ranking."""

from __future__ import annotations

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
