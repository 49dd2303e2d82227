"""Gold on hand-made silver rows: every reset, duplicates, short intervals, out-of-order samples
across micro-batches, lifecycles closed by agent restarts and missed heartbeats, replays.

Silver rows are built in the silver schema with the queue class's slots from
the seeded schema registry (a real registry Delta table); each micro-batch
goes through the real ``GoldBatchWriter`` into real Delta tables.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from chispa import assert_df_equality

from pipeline.gold import GoldBatchWriter, GoldSettings, gold_input
from pipeline.lake import delta
from pipeline.silver.registry import RegistryTable
from schemas.silver import HEARTBEATS, OBJECT_SAMPLES

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark


def micros(t: datetime) -> int:
    """A timestamp as exact integer microseconds since the epoch (no float rounding)."""
    return (t - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)

T0 = 1_800_000_000 * 10**9
S = 10**9
PKG = "org.apache.qpid.broker"


class Silver:
    """Silver rows of the queue class, slots from the registry."""

    def __init__(self, registry_path: str) -> None:
        reg = RegistryTable(registry_path)
        reg.ensure()
        row = next(r for r in reg.table().to_pylist() if r["class_name"] == "queue" and r["package"] == PKG)
        self.hash = bytes(row["schema_hash"])
        self.n = (row["n_ints"], row["n_floats"], row["n_texts"])
        self.slot = {e["name"]: int(e["slot"]) for e in [*row["properties"], *row["statistics"]]}
        self.offset = 0

    def sample(
        self, t: float, enq: int | None, *, obj: int = 1, epoch: int = 1, create: float | None = -1000.0,
        name: str = "q1", props: bool = False, delete: float | None = None, depth: int = 0,
        agent: str = "1.0",
    ) -> dict[str, Any]:  # fmt: skip
        ints: list[int | None] = [None] * self.n[0]
        texts: list[str | None] = [None] * self.n[2]
        if enq is not None:
            ints[self.slot["msgTotalEnqueues"]] = enq
            ints[self.slot["msgDepth"]] = depth
        if props:
            texts[self.slot["vhostRef"]] = "vh"
            texts[self.slot["name"]] = name
        self.offset += 1
        return {
            "partition": "p0", "offset": self.offset, "record_index": 0, "batch_id": 0,
            "msg_key": f"k{self.offset}", "dialect": "AM2", "opcode": "g" if props else "i",
            "seq": 0, "agent": agent, "package": PKG, "class_name": "queue",
            "schema_hash": self.hash, "update_ns": T0 + int(t * S),
            "create_ns": 0 if create is None else T0 + int(create * S), "delete_ns": 0 if delete is None else T0 + int(delete * S),
            "flags": 0, "epoch": epoch, "broker_bank": 1, "agent_bank": 0, "object_num": obj,
            "index_key": json.dumps(["vh", name]) if props else None,
            "ints": ints, "floats": [], "texts": texts,
        }  # fmt: skip


def beat(agent: str, t: float, *, epoch: int = 1, interval: int = 1) -> dict[str, Any]:
    attrs = json.dumps({"_epoch": epoch, "_heartbeat_interval": interval})
    return {
        "partition": "p0", "offset": 0, "record_index": 0, "batch_id": 0, "dialect": "V2",
        "seq": 0, "agent": agent, "timestamp_ns": T0 + int(t * S), "attributes": attrs,
    }  # fmt: skip


def batch(
    spark: SparkSession, samples: list[dict[str, Any]], beats: list[dict[str, Any]] | None = None
) -> DataFrame:
    """One gold input batch (silver-typed rows, checked against the silver schemas by Arrow)."""
    from schemas.tables import spark_schema

    st = pa.Table.from_pylist(samples, schema=OBJECT_SAMPLES)
    bt = pa.Table.from_pylist(beats or [], schema=HEARTBEATS)
    return gold_input(
        spark.createDataFrame(st.to_pylist(), spark_schema(OBJECT_SAMPLES)),
        spark.createDataFrame(bt.to_pylist(), spark_schema(HEARTBEATS)),
    )


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Silver, GoldSettings]:
    reg = str(tmp_path / "registry")
    silver = Silver(reg)
    s = GoldSettings(silver=str(tmp_path / "silver"), root=str(tmp_path / "gold"), registry=reg)
    return silver, s


RATE_COLS = "start_ns long, end_ns long, delta double, rate double, reset string"


def enqueue_rates(spark: SparkSession, s: GoldSettings) -> DataFrame:
    from pyspark.sql import functions as F

    return (
        delta.read_table(spark, s.path("statistic_rates"))
        .where(F.col("statistic") == "msgTotalEnqueues")
        .select("start_ns", "end_ns", "delta", "rate", "reset")
        .orderBy("end_ns")
    )


def expected(spark: SparkSession, rows: list[tuple[float, float, float | None, float | None, str | None]]) -> DataFrame:
    return spark.createDataFrame(
        [(T0 + int(a * S), T0 + int(b * S), d, r, why) for a, b, d, r, why in rows], RATE_COLS
    )


def test_resets_duplicates_and_short_intervals(spark: SparkSession, setup: tuple[Silver, GoldSettings]) -> None:
    sv, s = setup
    rows = [
        sv.sample(0, 0, props=True),
        sv.sample(10, 50),
        sv.sample(10, 50),  # twin: same sample delivered twice
        sv.sample(10.5, 55),  # 0.5 s after the baseline: skipped, baseline stays at 10
        sv.sample(20, 150, depth=7),
        sv.sample(30, 40),  # counter decreased
        sv.sample(40, 60, create=35),  # new create time
        sv.sample(50, 70, obj=2, create=35, props=True),  # new object id for the same index key
        sv.sample(60, 80, obj=2, epoch=2, create=35, props=True),  # agent restart
        sv.sample(1000, 90, obj=2, epoch=2, create=35),  # 940 s quiet: same instance, counts kept
        sv.sample(1010, 100, obj=2, epoch=2, create=35),
        sv.sample(1020, 0, obj=3, epoch=2, create=None, props=True),  # no create time given
        sv.sample(1400, 50, obj=3, epoch=2, create=None),  # gap (> 300 s): identity unsure
        sv.sample(1410, 60, obj=3, epoch=2, create=None),
    ]
    GoldBatchWriter(s, app_id="t")(batch(spark, rows[::-1]), 0)  # order of arrival is irrelevant
    want = expected(spark, [
        (0, 10, 50.0, 5.0, None),
        (10, 20, 100.0, 10.0, None),
        (20, 30, None, None, "counter_decreased"),
        (35, 40, 60.0, 12.0, None),  # re-created at 35 s, after the baseline: from 0 at 35 s
        (40, 50, None, None, "recreated"),
        (50, 60, None, None, "agent_restart"),
        (60, 1000, 10.0, 10.0 / 940, None),
        (1000, 1010, 10.0, 1.0, None),
        (1010, 1020, None, None, "recreated"),
        (1020, 1400, None, None, "gap"),
        (1400, 1410, 10.0, 1.0, None),
    ])  # fmt: skip
    assert_df_equality(enqueue_rates(spark, s), want, ignore_nullable=True)

    from pyspark.sql import functions as F

    depth = (
        delta.read_table(spark, s.path("statistic_rates"))
        .where((F.col("statistic") == "msgDepth") & (F.col("end_ns") == T0 + 20 * S))
        .select("kind", "prev_value", "value", "value_min", "value_max", "delta", "rate")
        .collect()
    )
    assert [tuple(r) for r in depth] == [("gauge", 0.0, 7.0, 0.0, 7.0, None, None)]
    # Every interval of the series carries the index key (stats-only samples included).
    keys = delta.read_table(spark, s.path("statistic_rates")).select("index_key").distinct().collect()
    assert [r[0] for r in keys] == [json.dumps(["vh", "q1"])]
    # State: one baseline per statistic of the series, at the last sample.
    state = delta.read_arrow(s.path("rate_state"))
    assert set(state.column("update_ns").to_pylist()) == {T0 + 1410 * S}
    assert state.num_rows == len(set(state.column("statistic").to_pylist()))


def test_out_of_order_across_micro_batches(spark: SparkSession, setup: tuple[Silver, GoldSettings]) -> None:
    """Samples of one object split over batches, out of order inside a batch and late across
    batches: each interval is between samples by sample time; a late sample (older than the
    baseline) makes no interval; index keys come from an earlier batch."""
    sv, s = setup
    w = GoldBatchWriter(s, app_id="t")
    w(batch(spark, [sv.sample(20, 60, props=True), sv.sample(0, 0, props=True)]), 0)
    w(batch(spark, [sv.sample(40, 120), sv.sample(30, 90)]), 1)
    w(batch(spark, [sv.sample(10, 30), sv.sample(50, 150)]), 2)  # 10 is late
    w(batch(spark, [sv.sample(50, 150), sv.sample(65, 195)]), 3)  # 50 again: a duplicate
    want = expected(spark, [
        (0, 20, 60.0, 3.0, None),
        (20, 30, 30.0, 3.0, None),
        (30, 40, 30.0, 3.0, None),
        (40, 50, 30.0, 3.0, None),
        (50, 65, 45.0, 3.0, None),
    ])  # fmt: skip
    assert_df_equality(enqueue_rates(spark, s), want, ignore_nullable=True)
    idx = delta.read_table(spark, s.path("statistic_rates")).select("index_key").distinct().collect()
    assert [r[0] for r in idx] == [json.dumps(["vh", "q1"])]
    lc = delta.read_arrow(s.path("lifecycle_state")).to_pylist()
    assert [(r["samples"], r["first_seen_ns"], r["last_seen_ns"], r["state"]) for r in lc] == [
        (8, T0, T0 + 65 * S, "live")
    ]


class CrashBeforeState(GoldBatchWriter):
    """A writer that dies after its other commits, before the state (the last write)."""

    def write_state(self, state: pa.Table, batch_id: int) -> bool:
        raise RuntimeError("killed before the state commit")

    def write_state_files(self, files: list[delta.DataFileInfo], batch_id: int) -> bool:
        raise RuntimeError("killed before the state commit")


@pytest.mark.parametrize("compute_on", ["driver", "tasks"])
def test_replay_after_crash_gives_the_same_tables(
    spark: SparkSession, tmp_path: Path, compute_on: str
) -> None:
    runs = {}
    for mode in ("clean", "crash"):
        sv = Silver(str(tmp_path / mode / "registry"))
        s = GoldSettings(silver=str(tmp_path / mode / "silver"), root=str(tmp_path / mode / "gold"),
                         registry=str(tmp_path / mode / "registry"), compute_on=compute_on)  # fmt: skip
        b0 = batch(spark, [sv.sample(0, 0, props=True), sv.sample(10, 20)], [beat("A", 0), beat("A", 1)])
        b1 = batch(spark, [sv.sample(20, 50), sv.sample(30, 60)], [beat("A", 2)])
        GoldBatchWriter(s, app_id="t")(b0, 0)
        if mode == "crash":
            with pytest.raises(RuntimeError):
                CrashBeforeState(s, app_id="t")(b1, 1)
        w = GoldBatchWriter(s, app_id="t")
        w(b1, 1)
        w(b1, 1)  # and a plain replay: skipped
        assert w.reports[-1].committed == []
        runs[mode] = s
    for name in ("statistic_rates", "lifecycle_state", "object_lifecycles", "agent_liveness",
                 "rate_state"):
        a = delta.read_table(spark, runs["clean"].path(name))
        b = delta.read_table(spark, runs["crash"].path(name))
        cols = sorted(c for c in a.columns if c not in ("batch_id", "properties"))
        assert_df_equality(a.select(cols).orderBy(cols), b.select(cols).orderBy(cols), ignore_nullable=True)


def test_lifecycles_and_liveness(spark: SparkSession, setup: tuple[Silver, GoldSettings]) -> None:
    sv, s = setup
    w = GoldBatchWriter(s, app_id="t")
    b0 = [
        sv.sample(0, 0, obj=1, name="a", props=True),
        sv.sample(0, 0, obj=2, name="b", props=True),
        # transient: created and deleted between two publishes, one sample with both times
        sv.sample(5, 3, obj=3, name="tmp", create=4, delete=4.5, props=True),
        sv.sample(0, 0, obj=7, name="v2q", props=True, agent="A"),
    ]
    beats0 = [beat("A", t) for t in (0, 1, 2)] + [beat("B", t) for t in range(11)]
    w(batch(spark, b0, beats0), 0)
    # Agent 1.0 restarts (epoch 2): its epoch-1 objects are lost. Agent A went silent at 2 s:
    # with B's heartbeat at 10 s it is 8 s late (> 3 x 1 s): down at 5 s, its objects lost.
    w(batch(spark, [sv.sample(30, 1, obj=1, epoch=2, name="a", props=True)], [beat("B", 11)]), 1)

    def lifecycles() -> dict[tuple[str, str], dict[str, Any]]:
        t = delta.read_arrow(s.path("lifecycle_state"))
        return {(r["agent"], r["object_id"]): r for r in t.to_pylist()}

    ts = lambda sec: int(T0 / 1000 + sec * 1e6)  # noqa: E731
    us = lambda v: None if v is None else micros(v)  # noqa: E731
    def summary() -> dict[tuple[str, str], tuple[Any, ...]]:
        return {
            key: (json.loads(r["index_key"])[1], r["state"], r["end_reason"], us(r["created_at"]),
                  us(r["deleted_at"]), us(r["ended_at"]))
            for key, r in lifecycles().items()
        }  # fmt: skip

    # Restart renumbers "a" (AM2 ids carry the epoch): a new row beside the lost one.
    assert summary() == {
        ("1.0", "0-1-1-0-1"): ("a", "lost", "agent_restart", ts(-1000), None, ts(30)),
        ("1.0", "0-2-1-0-1"): ("a", "live", None, ts(-1000), None, None),
        ("1.0", "0-1-1-0-2"): ("b", "lost", "agent_restart", ts(-1000), None, ts(30)),
        ("1.0", "0-1-1-0-3"): ("tmp", "deleted", "deleted", ts(4), ts(4.5), ts(4.5)),
        ("A", "0-1-1-0-7"): ("v2q", "lost", "agent_down", ts(-1000), None, ts(5)),
    }
    liv = {(r["agent"], r["up_start_ns"]): r for r in delta.read_arrow(s.path("agent_liveness")).to_pylist()}
    assert {k_: (r["state"], r["heartbeats"], r["started_by"], us(r["down_at"])) for k_, r in liv.items()} == {
        ("A", T0): ("down", 3, "first", ts(5)),
        ("B", T0): ("up", 12, "first", None),
    }
    # A comes back at 20 s, B restarts (epoch 2).
    w(batch(spark, [], [beat("A", 20), beat("A", 21), beat("B", 20, epoch=2)]), 2)
    liv = {(r["agent"], r["up_start_ns"]): r for r in delta.read_arrow(s.path("agent_liveness")).to_pylist()}
    assert {k_: (r["state"], r["heartbeats"], r["started_by"], us(r["down_at"]), us(r["next_up"])) for k_, r in liv.items()} == {
        ("A", T0): ("down", 3, "first", ts(5), ts(20)),
        ("A", T0 + 20 * S): ("up", 2, "recovered", None, None),
        ("B", T0): ("down", 12, "first", ts(14), ts(20)),  # 9 s without a heartbeat: an outage
        ("B", T0 + 20 * S): ("up", 1, "restart", None, None),
    }  # fmt: skip
    # Back with the same epoch: its objects were not renumbered, "lost" is withdrawn.
    assert summary()[("A", "0-1-1-0-7")][1:3] == ("live", None)


def test_statistics_before_properties_in_an_earlier_batch(
    spark: SparkSession, setup: tuple[Silver, GoldSettings]
) -> None:
    """An object's statistics arrive a micro-batch before its properties (index key): its
    baseline moves to the index-key series, so the interval is the one a single batch gives."""
    sv, s = setup
    w = GoldBatchWriter(s, app_id="t")
    w(batch(spark, [sv.sample(0, 0)]), 0)
    w(batch(spark, [sv.sample(10, 20, props=True)]), 1)
    assert_df_equality(
        enqueue_rates(spark, s), expected(spark, [(0, 10, 20.0, 2.0, None)]), ignore_nullable=True
    )
    state = delta.read_arrow(s.path("rate_state"))
    assert set(state.column("series").to_pylist()) == {json.dumps(["vh", "q1"])}


def arrow_batch(samples: list[dict[str, Any]], beats: list[dict[str, Any]] | None = None) -> Any:
    """One gold input batch as the stream's driver read gives it (no Spark)."""
    from pipeline.gold import gold_input_arrow

    return gold_input_arrow(
        pa.Table.from_pylist(samples, schema=OBJECT_SAMPLES),
        pa.Table.from_pylist(beats or [], schema=HEARTBEATS),
    )


def test_transient_and_quiet_series_stream_equals_batch(tmp_path: Path) -> None:
    """Through the writer and Delta: (a) a queue deleted 0.6 s after its first statistics
    sample, (b) a queue whose last sample comes 0.5 s after the one before and then goes
    quiet while its agent goes on (another queue, heartbeats), (c) 1 s publishes with
    jitter. Three micro-batches give exactly the rows of one batch."""
    runs: dict[str, GoldSettings] = {}
    for mode in ("batch", "stream"):
        reg = str(tmp_path / mode / "registry")
        sv = Silver(reg)
        s = GoldSettings(silver=str(tmp_path / mode / "silver"), root=str(tmp_path / mode / "gold"),
                         registry=reg)  # fmt: skip
        busy = [sv.sample(t, 10 * i, obj=2, name="busy", props=i == 0)
                for i, t in enumerate([0.0, 0.999, 2.0, 2.999, 4.001, 5.0, 6.0])]  # fmt: skip
        tq = [sv.sample(1.2, 0, obj=3, name="tq", create=1.0, props=True),
              sv.sample(1.8, 24, obj=3, name="tq", create=1.0, delete=1.8)]  # fmt: skip
        quiet = [sv.sample(0.0, 0, props=True), sv.sample(1.0, 10), sv.sample(1.5, 15)]
        beats = [beat("1.0", t) for t in (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0)]
        parts = [
            ([busy[0], busy[1], quiet[0], quiet[1], tq[0]], beats[:2]),
            ([busy[2], quiet[2], tq[1]], beats[2:3]),  # 1.5 is pending here
            (busy[3:], beats[3:]),  # the agent's later cycles without it: emitted
        ]
        w = GoldBatchWriter(s, app_id="t")
        if mode == "batch":
            w.write(arrow_batch([r for p in parts for r in p[0]], [b for p in parts for b in p[1]]), 0)
        else:
            for i, (rows, bts) in enumerate(parts):
                w.write(arrow_batch(rows, bts), i)
                if i == 1:  # 1.5 waits in the state beside its baseline; tq left with its delete
                    state = delta.read_arrow(s.path("rate_state")).to_pylist()
                    assert sorted((r["index_key"], (r["update_ns"] - T0) / S) for r in state
                                  if r["statistic"] == "msgTotalEnqueues") == [
                        (json.dumps(["vh", "busy"]), 2.0),
                        (json.dumps(["vh", "q1"]), 1.0), (json.dumps(["vh", "q1"]), 1.5),
                    ]  # fmt: skip
        runs[mode] = s
    got = {}
    for mode, s in runs.items():
        t = delta.read_arrow(s.path("statistic_rates"))
        rows = [r for r in t.to_pylist() if r["statistic"] == "msgTotalEnqueues"]
        got[mode] = sorted(
            (json.loads(r["index_key"])[-1], (r["start_ns"] - T0) / S, (r["end_ns"] - T0) / S,
             r["delta"], r["reset"])
            for r in rows
        )  # fmt: skip
    assert got["stream"] == got["batch"] == sorted([
        ("busy", 0.0, 0.999, 10.0, None), ("busy", 0.999, 2.0, 10.0, None),
        ("busy", 2.0, 2.999, 10.0, None), ("busy", 2.999, 4.001, 10.0, None),
        ("busy", 4.001, 5.0, 10.0, None), ("busy", 5.0, 6.0, 10.0, None),
        ("q1", 0.0, 1.0, 10.0, None), ("q1", 1.0, 1.5, 5.0, None),
        ("tq", 1.0, 1.2, 0.0, None),  # created at 1.0 s: its counts from 0 there
        ("tq", 1.2, 1.8, 24.0, None),
    ])  # fmt: skip
    # Once emitted it is the baseline.
    for mode, s in runs.items():
        state = delta.read_arrow(s.path("rate_state"))
        q1 = {(r["update_ns"] - T0) / S for r in state.to_pylist() if r["series"] == json.dumps(["vh", "q1"])}
        assert q1 == {1.5}, mode
