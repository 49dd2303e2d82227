"""The gold job on the real qpidd capture: rates, lifecycles, liveness; stream == batch.

Silver comes from the capture without a broker: bronze rows built with the
receiver's landing code (``pipeline.silver.bronze_rows``), decoded by the
silver writer in several commits. Expected values are computed here
independently, with the codec directly (``decode_message``), not from silver.
"""

from __future__ import annotations

import itertools
import json
import os
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc
import pytest
from chispa import assert_df_equality

from pipeline.codec.capture import read_capture
from pipeline.codec.message import decode_message
from pipeline.codec.records import ObjectSample, id_columns
from pipeline.gold import (
    GoldBatchWriter,
    GoldSettings,
    batch_files,
    batch_on_driver,
    run_gold,
    run_gold_batch,
)
from pipeline.gold.transforms import RateRules, frame
from pipeline.lake import delta
from pipeline.silver import SilverBatchWriter, SilverSettings, bronze_rows
from pipeline.silver.registry import StatisticKinds, seed_table, to_registry
from schemas.gold import GOLD_TABLES

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark


def micros(t: datetime) -> int:
    """A timestamp as exact integer microseconds since the epoch (no float rounding)."""
    return (t - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)

CAPTURE = "samples/qpidd-capture-20s.jsonl"
SUMMARY = "samples/qpidd-capture-20s.summary.json"
PARTS = 4  # silver commits (so the stream has several micro-batches)


@pytest.fixture(scope="module")
def silver_root(shared_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Silver tables from the capture, written as PARTS commits per table."""
    msgs = list(read_capture(os.path.join(shared_dir, CAPTURE)))
    root = tmp_path_factory.mktemp("gold-silver")
    s = SilverSettings(bronze=str(root / "bronze"), root=str(root / "silver"))
    w = SilverBatchWriter(s, app_id="silver-for-gold")
    size = len(msgs) // PARTS + 1
    for i in range(PARTS):
        part = msgs[i * size : (i + 1) * size]
        w.decode_local(bronze_rows(part, first_offset=i * size), i)
    return s.root


def expected_series(shared_dir: str) -> dict[tuple[str, str], list[tuple[int, int, float]]]:
    """(agent, queue name) -> [(update_ns, create_ns, msgTotalEnqueues)] by sample time, unique
    times: from the codec alone. Stats-only records get their name from the object's property
    records (object id -> name)."""
    reg = to_registry(seed_table(StatisticKinds.load()))
    names: dict[tuple[Any, ...], str] = {}
    raw: list[tuple[str, tuple[Any, ...], int, int, float]] = []
    for m in read_capture(os.path.join(shared_dir, CAPTURE)):
        res = decode_message(
            m.body, registry=reg, application_properties=m.application_properties,
            content_type=m.content_type, app_id=m.app_id, routing_key=m.routing_key,
        )  # fmt: skip
        for r in res.records:
            if not isinstance(r, ObjectSample) or r.class_name != "queue" or r.agent is None:
                continue
            oid = (r.agent, tuple(sorted(id_columns(r.object_id).items())))
            if "name" in r.values:
                names[oid] = str(r.values["name"])
            if "msgTotalEnqueues" in r.values:
                # A delete record keeps its previous publish's update time: its sample
                # time is the delete time (issue 47).
                t = max(r.update_ns, r.delete_ns or 0)
                raw.append((r.agent, oid, t, r.create_ns, float(r.values["msgTotalEnqueues"])))
    series: dict[tuple[str, str], dict[int, tuple[int, float]]] = defaultdict(dict)
    for agent, oid, t, c, v in raw:
        series[(agent, names[oid])].setdefault(t, (c, v))
    return {k: [(t, c, v) for t, (c, v) in sorted(d.items())] for k, d in series.items()}


def queue_name(index_key: str) -> str:
    return str(json.loads(index_key)[-1])


def rates_of(root: str, statistic: str) -> dict[tuple[str, str], list[tuple[int, int, float | None]]]:
    t = delta.read_arrow(os.path.join(root, "statistic_rates"))
    t = t.filter(pc.and_(pc.equal(t.column("statistic"), statistic), pc.equal(t.column("class_name"), "queue")))
    out: dict[tuple[str, str], list[tuple[int, int, float | None]]] = defaultdict(list)
    for r in t.to_pylist():
        out[(r["agent"], queue_name(r["index_key"]))].append((r["start_ns"], r["end_ns"], r["rate"]))
    return {k: sorted(v) for k, v in out.items()}


def test_enqueue_rates_equal_independent_computation(
    spark: SparkSession, shared_dir: str, silver_root: str, tmp_path: Path
) -> None:
    s = GoldSettings(silver=silver_root, root=str(tmp_path / "gold"), rates=RateRules(min_interval_s=0))
    run_gold_batch(spark, s, 0)
    got = rates_of(s.root, "msgTotalEnqueues")
    want: dict[tuple[str, str], list[tuple[int, int, float | None]]] = {}
    for key, samples in expected_series(shared_dir).items():
        rows = []
        t1, c1, v1 = samples[0]
        if 0 < c1 < t1 and t1 - c1 <= 300 * 10**9:  # a new object: from 0 at its creation
            rows.append((c1, t1, v1 / ((t1 - c1) / 1e9)))
        for (t0, c0, v0), (t1, c1, v1) in itertools.pairwise(samples):
            if c0 != c1 and t0 < c1 < t1:  # re-created after the baseline: from 0 at c1
                rows.append((c1, t1, v1 / ((t1 - c1) / 1e9)))
                continue
            rate = None if c0 != c1 or v1 < v0 else (v1 - v0) / ((t1 - t0) / 1e9)
            rows.append((t0, t1, rate))
        if rows:
            want[key] = rows
    assert len(want) > 20
    assert got.keys() == want.keys()
    for key in want:
        assert [(a, b) for a, b, _ in got[key]] == [(a, b) for a, b, _ in want[key]], key
        for (_, _, g), (_, _, w) in zip(got[key], want[key], strict=True):
            assert (g is None) == (w is None)
            if w is not None:
                assert g == pytest.approx(w, rel=1e-12, abs=1e-12), key


def test_default_rules_skip_short_intervals_and_keep_totals(
    spark: SparkSession, shared_dir: str, silver_root: str, tmp_path: Path
) -> None:
    """With the 1 s minimum (less 0.1 s of the agent's jitter) the baseline stays:
    intervals merge, no enqueue is lost; the v1 queues' average rates equal the capture
    summary's first-to-last rates. Shorter intervals only close a deleted object's series
    or a series that went quiet (its agent published a later cycle without it)."""
    s = GoldSettings(silver=silver_root, root=str(tmp_path / "gold"))
    run_gold_batch(spark, s, 0)
    t = delta.read_arrow(s.path("statistic_rates"))
    rows = t.to_pylist()
    created = {(r["agent"], r["object_id"], r["create_ns"]) for r in
               delta.read_arrow(s.path("lifecycle_state")).to_pylist()}  # fmt: skip
    # Resets, and intervals counted from an object's creation, are kept however short.
    plain = [r for r in rows if r["reset"] is None and (r["agent"], r["object_id"], r["start_ns"]) not in created]
    short = [r for r in plain if r["length_s"] < 0.9]
    deleted = {(r["agent"], r["object_id"]): r["last_seen_ns"] for r in
               delta.read_arrow(s.path("lifecycle_state")).to_pylist() if r["deleted_at"]}  # fmt: skip
    closing = [r for r in short if deleted.get((r["agent"], r["object_id"])) == r["end_ns"]]
    # A delete record ends its series at its delete time (its counts are the final ones).
    assert {(r["class_name"], r["dialect"]) for r in closing} >= {("queue", "AM2"), ("queue", "V2")}
    assert {(r["class_name"], r["dialect"], round(r["length_s"], 6)) for r in short if r not in closing} == {
        ("queue", "AM2", 0.586084),  # tool-q1, deleted 0.59 s after its first sample
        ("queue", "V2", 0.586084),
        ("broker", "V2", 0.295956),  # a series of two samples 0.3 s apart, then quiet for 6 s
    }
    # Each ends where the series' next interval starts (if any): nothing lost around it.
    for r in short:
        after = [x["start_ns"] for x in rows if x["end_ns"] > r["end_ns"] and all(
            x[c] == r[c] for c in ("agent", "class_name", "object_id", "statistic"))]  # fmt: skip
        assert not after or min(after) == r["end_ns"], r
    got = rates_of(s.root, "msgTotalEnqueues")
    with open(os.path.join(shared_dir, SUMMARY)) as fh:
        summary = json.load(fh)["queue_rates_first_to_last_v1_sample"]
    series = expected_series(shared_dir)
    checked = 0
    for (agent, name), rows in got.items():
        samples = {ts: v for ts, _c, v in series[(agent, name)]}
        if rows[0][0] not in samples:  # counted from the queue's creation (from 0)
            rows = rows[1:]
        if not rows:
            continue
        first, last = rows[0][0], rows[-1][1]
        # Contiguous intervals from the first to the last kept sample.
        assert all(a[1] == b[0] for a, b in itertools.pairwise(rows))
        if agent == "1.0" and name in summary and all(r[2] is not None for r in rows):
            avg = (samples[last] - samples[first]) / ((last - first) / 1e9)
            assert round(avg, 3) == pytest.approx(summary[name]["enq_rate"], abs=0.0015), name
            checked += 1
    assert checked >= 8


def test_short_lived_queues_have_both_timestamps(
    spark: SparkSession, shared_dir: str, silver_root: str, tmp_path: Path
) -> None:
    s = GoldSettings(silver=silver_root, root=str(tmp_path / "gold"))
    run_gold_batch(spark, s, 0)
    # Deleted queues per the codec: (agent, name) -> (create_ns, delete_ns).
    reg = to_registry(seed_table(StatisticKinds.load()))
    deleted: dict[tuple[str, str], tuple[int, int]] = {}
    for m in read_capture(os.path.join(shared_dir, CAPTURE)):
        for r in decode_message(
            m.body, registry=reg, application_properties=m.application_properties,
            content_type=m.content_type, app_id=m.app_id, routing_key=m.routing_key,
        ).records:  # fmt: skip
            if isinstance(r, ObjectSample) and r.class_name == "queue" and r.delete_ns and "name" in r.values:
                deleted[(str(r.agent), str(r.values["name"]))] = (r.create_ns, r.delete_ns)
    assert len(deleted) >= 5
    lc = delta.read_arrow(s.path("lifecycle_state")).to_pylist()
    rows = {(r["agent"], queue_name(r["index_key"])): r for r in lc if r["class_name"] == "queue"}
    for key, (c, d) in deleted.items():
        r = rows[key]
        assert r["state"] == "deleted" and r["end_reason"] == "deleted", key
        assert r["create_ns"] == c
        assert micros(r["created_at"]) == c // 1000
        assert micros(r["deleted_at"]) == d // 1000
        assert r["created_at"] <= r["deleted_at"]
        assert r["properties"] and dict(r["properties"])["name"] == key[1]
    # Transient ones: a single publish carried both create and delete time.
    assert any(r["samples"] <= 2 and r["first_seen"] >= r["created_at"] for k, r in rows.items() if k in deleted)
    live = [r for r in lc if r["class_name"] == "queue" and r["state"] == "live"]
    assert live and all(r["deleted_at"] is None and r["end_reason"] is None for r in live)
    # Both agents heart-beat all through the 20 s: one open up interval each.
    liv = delta.read_arrow(s.path("agent_liveness")).to_pylist()
    assert sorted((r["dialect"], r["state"], r["heartbeats"]) for r in liv) == [
        ("AM2", "up", 18), ("V2", "up", 18)
    ]


def _sorted(df: DataFrame) -> DataFrame:
    cols = [c for c in df.columns if c != "batch_id"]
    return df.select(*cols).orderBy(*[c for c in cols if c != "properties"])


def test_stream_equals_batch(
    spark: SparkSession, silver_root: str, tmp_path: Path
) -> None:
    batch = GoldSettings(silver=silver_root, root=str(tmp_path / "batch"))
    run_gold_batch(spark, batch, 0)
    stream = GoldSettings(
        silver=silver_root, root=str(tmp_path / "stream"), checkpoint=str(tmp_path / "ckpt"),
        max_files_per_trigger=1,
    )  # fmt: skip
    assert run_gold(spark, stream, timeout_s=1800) == 0
    # Several micro-batches ran (one silver file per source each).

    assert len(delta.app_transactions(stream.path("rate_state"))) >= PARTS
    for name in GOLD_TABLES:
        a = delta.read_table(spark, batch.path(name))
        b = delta.read_table(spark, stream.path(name))
        assert a.count() > 0, name
        assert_df_equality(_sorted(a), _sorted(b), ignore_nullable=True)
    # A rerun of the finished stream, and a replay of the batch, write nothing.
    before = {n: delta.read_arrow(stream.path(n)).num_rows for n in GOLD_TABLES}
    assert run_gold(spark, stream, timeout_s=1800) == 0
    assert {n: delta.read_arrow(stream.path(n)).num_rows for n in GOLD_TABLES} == before
    assert run_gold_batch(spark, batch, 0).committed == []


class CompareReads(GoldBatchWriter):
    """The stream's writer, also collecting each batch through Spark to compare the two reads."""

    def __init__(self, settings: GoldSettings) -> None:
        super().__init__(settings)
        self.seen: list[tuple[int, int, int | None, bool]] = []

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        via_spark = frame(df.toArrow())
        direct = batch_on_driver(self.settings, batch_files(self.settings, df))
        order = ["source", "partition", "offset", "record_index", "timestamp_ns"]
        same = direct is not None and via_spark.sort(order, nulls_last=True).equals(
            direct.sort(order, nulls_last=True), null_equal=True
        )
        self.seen.append((batch_id, via_spark.height, None if direct is None else direct.height, same))
        super().__call__(df, batch_id)


def test_driver_read_of_a_batch_equals_sparks(
    spark: SparkSession, silver_root: str, tmp_path: Path
) -> None:
    """Each streaming batch, read from the files of its plan with pyarrow, holds exactly
    the rows (values, types, nulls) Spark's read of that batch holds."""
    s = GoldSettings(
        silver=silver_root, root=str(tmp_path / "gold"), checkpoint=str(tmp_path / "ckpt"),
        max_files_per_trigger=1,
    )  # fmt: skip
    w = CompareReads(s)
    assert run_gold(spark, s, timeout_s=1800, writer=w) == 0
    assert len(w.seen) >= PARTS
    # The first batch too (inside both tables' starting snapshots: one file per trigger).
    assert w.seen[0][0] == 0
    assert all(direct == rows and same for _, rows, direct, same in w.seen), w.seen
    assert sum(rows for _, rows, _, _ in w.seen) == (
        delta.read_arrow(os.path.join(silver_root, "object_samples")).num_rows
        + delta.read_arrow(os.path.join(silver_root, "heartbeats")).num_rows
    )
    # Spark's read is off when asked: every batch then goes through Spark.
    off = GoldSettings(silver=silver_root, root=str(tmp_path / "g2"), checkpoint=s.checkpoint,
                       read_on_driver=False)  # fmt: skip
    assert batch_on_driver(off, [[], []]) is None
