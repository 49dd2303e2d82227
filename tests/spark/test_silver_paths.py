"""Silver through Spark tasks and on the driver: identical silver and gold tables.

The same bronze (the real qpidd captures over AMQP 0-10 and 1.0 and simulator runs
in AM1, AM2 and QMF v2, mixed in every file) is streamed twice: with ``decode_on="tasks"`` (every micro-batch's
bronze files split over Spark tasks that decode and write their own Parquet
files, the driver committing them) and ``decode_on="driver"``. Both give
the same rows in every silver table, and gold (batch) over each silver gives
the same gold tables (compared row for row as delta-rs reads them: that Spark
and delta-rs read our tables alike is tests/spark/test_delta_spark.py's). ``auto`` picks the driver for a batch up to its size threshold and
tasks above it.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

from pipeline.cli import main as qmf
from pipeline.codec.capture import CapturedMessage, read_capture
from pipeline.gold import GoldSettings, run_gold_batch
from pipeline.gold.tasks import bucket_of
from pipeline.lake import delta
from pipeline.lake.files import commit_adds
from pipeline.silver import SilverSettings, bronze_rows, run_silver, write_bronze
from pipeline.silver.writer import BatchReport, SilverBatchWriter
from tests.lake import sorted_rows, stray_files

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

SILVER = ("object_samples", "events", "heartbeats", "method_responses", "method_calls",
          "agents", "quarantine", "parked", "schema_registry")  # fmt: skip
GOLD = ("statistic_rates", "lifecycle_state", "object_lifecycles", "agent_liveness", "rate_state")
# Columns that say when a row was written, not what it holds.
WHEN = ("first_seen", "last_seen", "first_app", "first_batch")
# Real traffic: qpidd over AMQP 0-10 (AM2), and over AMQP 1.0 with QMF v1 and v2 agents.
REAL = {
    "qpidd": "samples/qpidd-capture-20s.jsonl",
    "qpidd-amqp10": "samples/qpidd-amqp10/qmf1-qmf2-60s.jsonl",
}


def assert_same_tables(a: str, b: str, names: Sequence[str]) -> None:
    """Each named table under ``a`` equals the one under ``b`` row for row (``WHEN`` out)."""
    for name in names:
        left = sorted_rows(delta.read_arrow(os.path.join(a, name)), WHEN)
        right = sorted_rows(delta.read_arrow(os.path.join(b, name)), WHEN)
        assert len(left) == len(right) and left == right, name


def _stream(
    spark: SparkSession, tmp: Path, parts: Sequence[pa.Table], mode: str, **kw: Any
) -> tuple[SilverSettings, list[BatchReport]]:
    s = SilverSettings(
        bronze=str(tmp / "bronze"), root=str(tmp / "silver"), checkpoint=str(tmp / "cp"),
        max_files_per_trigger=2, decode_on=mode, **kw,
    )  # fmt: skip
    write_bronze(s.bronze, parts)
    reports: list[BatchReport] = []
    real = SilverBatchWriter.finish

    def spy(self: SilverBatchWriter, *a: Any, **k: Any) -> BatchReport:
        r = real(self, *a, **k)
        reports.append(r)
        return r

    SilverBatchWriter.finish = spy  # type: ignore[method-assign]
    try:
        assert run_silver(spark, s, timeout_s=600) == 0
    finally:
        SilverBatchWriter.finish = real  # type: ignore[method-assign]
    return s, reports


def _split(msgs: Sequence[CapturedMessage], n: int) -> list[pa.Table]:
    step = -(-len(msgs) // n)
    return [
        bronze_rows(msgs[i : i + step], first_offset=i, batch_id=k)
        for k, i in enumerate(range(0, len(msgs), step))
    ]


SOURCES = ("qpidd", "qpidd-amqp10", "am1", "am2", "v2")


def _capture(tmp: Path, name: str, shared_dir: str, seed: int = 1) -> list[CapturedMessage]:
    if name in REAL:
        return list(read_capture(os.path.join(shared_dir, REAL[name])))
    cap, man = str(tmp / f"sim-{name}.jsonl"), str(tmp / f"truth-{name}.jsonl")
    # Three agents (the gold buckets split them), the second restarting.
    args = ["--dialect", name, "--agents", "3", "--queues", "4", "--intervals", "4",
            "--events", "2", "--restart", "1:2", "--start-ns", "1795300000000000000",
            "--seed", str(seed)]  # fmt: skip
    assert qmf(["sim", "-o", cap, "--manifest", man, *args]) == 0
    return list(read_capture(cap))


def _mixed(tmp: Path, shared_dir: str, n: int) -> list[pa.Table]:
    """``n`` bronze files, each holding its share of every source in ``SOURCES`` (the
    real captures and a simulator run per dialect, each with agents of its own), as a
    broker publishing v1 and v2 lands them together."""
    shares: list[list[CapturedMessage]] = [[] for _ in range(n)]
    for seed, name in enumerate(SOURCES, start=1):
        msgs = _capture(tmp, name, shared_dir, seed)
        step = -(-len(msgs) // n)
        for k in range(n):
            shares[k].extend(msgs[k * step : (k + 1) * step])
    parts, first = [], 0
    for k, share in enumerate(shares):
        parts.append(bronze_rows(share, first_offset=first, batch_id=k))
        first += len(share)
    return parts


def test_tasks_and_driver_give_identical_silver_and_gold(
    spark: SparkSession, shared_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every dialect in one bronze (one run of each path instead of one per dialect:
    the same comparison, in a fifth of the suite's time)."""
    parts = _mixed(tmp_path, shared_dir, 4)  # four bronze files, two per micro-batch
    capsys.readouterr()
    tasks, t_reports = _stream(spark, tmp_path / "tasks", parts, "tasks")
    driver, d_reports = _stream(spark, tmp_path / "driver", parts, "driver")

    # The task path ran Spark tasks (one per bronze file of the batch) and the driver
    # path none; both made two micro-batches.
    assert [(r.decode_on, r.tasks) for r in t_reports] == [("tasks", 2), ("tasks", 2)]
    assert [(r.decode_on, r.tasks) for r in d_reports] == [("driver", 0), ("driver", 0)]
    assert delta.read_arrow(tasks.path("object_samples")).num_rows > 0
    assert_same_tables(tasks.root, driver.root, SILVER)
    # Each task wrote its own file (a task whose messages held no sample writes none):
    # one or two per batch; nothing is left beside the live files.
    samples = tasks.path("object_samples")
    names = [f for f in os.listdir(samples) if f.endswith(".parquet")]
    for b in (0, 1):
        assert 1 <= len([f for f in names if f.startswith(f"part-{b:08d}-")]) <= 2
    assert stray_files(samples) == []

    # Gold: in tasks (buckets of agents) over one silver, on the driver over the other.
    for s, mode in ((tasks, "tasks"), (driver, "driver")):
        gs = GoldSettings(silver=s.root, root=s.root + "-gold", compute_on=mode, buckets=3)
        assert run_gold_batch(spark, gs, 0).compute_on == mode
    assert delta.read_arrow(tasks.root + "-gold/lifecycle_state").num_rows > 0
    # Each bucket holding an agent's objects wrote its own lifecycle file.
    agents = set(delta.read_arrow(tasks.root + "-gold/lifecycle_state").column("agent").to_pylist())
    lc = os.listdir(tasks.root + "-gold/lifecycle_state")
    assert {int(f.split("-k3b")[1][0]) for f in lc if "-k3b" in f} == {
        bucket_of(a, 3) for a in agents
    }
    assert len({bucket_of(a, 3) for a in agents}) == 3
    assert_same_tables(tasks.root + "-gold", driver.root + "-gold", GOLD)
    # What was not committed (parked halves, call parts, gold's shuffle) is gone after
    # the commits.
    for root in (tasks.root, tasks.root + "-gold"):
        for table in sorted(os.listdir(root)):
            assert stray_files(os.path.join(root, table)) == [], (root, table)


def test_auto_decodes_small_batches_on_the_driver_and_large_ones_in_tasks(
    spark: SparkSession, shared_dir: str, tmp_path: Path
) -> None:
    """``auto``: a batch whose bronze files hold at most ``driver_max_bytes`` stays on the
    driver, a larger one goes to tasks; the tables equal the driver path's."""
    msgs = list(read_capture(os.path.join(shared_dir, "samples/qpidd-capture-20s.jsonl")))
    parts = _split(msgs, 4)
    probe = str(tmp_path / "probe")
    write_bronze(probe, parts)
    per_file = []
    for v in range(1, 5):  # version 0 creates the table; one bronze file per commit after
        adds = commit_adds(probe, v) or []
        assert len(adds) == 1
        per_file.append(adds[0].size)
    batches = [per_file[0] + per_file[1], per_file[2] + per_file[3]]
    assert batches[0] != batches[1]
    limit = min(batches)
    want = ["driver" if b <= limit else "tasks" for b in batches]
    assert sorted(want) == ["driver", "tasks"]
    auto, reports = _stream(spark, tmp_path / "auto", parts, "auto", driver_max_bytes=limit)
    assert [r.decode_on for r in reports] == want
    driver, _ = _stream(spark, tmp_path / "driver", parts, "driver")
    assert_same_tables(auto.root, driver.root, SILVER)


def test_parked_messages_wait_and_resolve_alike_on_every_path(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Content waits for its schema across batches, and one message for two schemas: it
    parks for the first, and once that arrives, parks again for the second (stored under
    the first key, waiting for the second). The task path (parked messages decoded again
    in Spark tasks that read the ``parked`` table), the driver path (decoded again on the
    driver) and the driver path above ``driver_max_bytes`` (again in tasks) write the
    same tables, and exactly these rows."""
    from pipeline.codec.records import Am2ObjectId, ObjectSample
    from pipeline.codec.schema import ClassSchema, Element, SchemaKey, SchemaRegistry
    from pipeline.codec.v1 import encode_records
    from tests.spark import test_silver_late as late

    gadget = ClassSchema(
        key=SchemaKey(late.PKG, "gadget", b"\x03" * 16),
        properties=(Element("name", 6, access=1, index=True),),
        statistics=(Element("count", 4),),
    )
    g = ObjectSample(
        dialect="AM2", opcode="g", seq=9, package=late.PKG, class_name="gadget",
        schema_hash=gadget.key.hash, update_ns=late.T0, create_ns=late.T0, delete_ns=0,
        object_id=Am2ObjectId(0, 1, 1, 0, 99), values={"name": "g1", "count": 5}, agent="1.0",
    )  # fmt: skip
    both = late.msg(encode_records([late.rec(late.V1, "g", 3), g], SchemaRegistry([late.V1, gadget])))
    batches = [
        [late.content(late.V1, ("c", 1), ("i", 1)), both, late.heartbeat()],  # both park
        [late.announce(late.V1), late.content(late.V1, ("i", 2))],  # `both` parks again
        [late.heartbeat()],  # nothing to decode again
        [late.announce(gadget)],  # `both` decodes
    ]
    wkey, gkey = (f"{late.PKG}:{n}({h * 16})" for n, h in (("widget", "01"), ("gadget", "03")))
    runs = {  # where parked messages are decoded again
        "tasks": ({"decode_on": "tasks"}, "tasks"),
        "driver": ({"decode_on": "driver"}, "driver"),
        "driver-big": ({"decode_on": "driver", "driver_max_bytes": 0}, "tasks"),
    }
    for name, (kw, on) in runs.items():
        run = late.Run(spark, tmp_path / name, parked_max_age_s=0.0, **kw)
        got = []
        for k, msgs in enumerate(batches):
            r = run.batch(k, msgs)
            pending = run.writer.pending_parked(k + 1).select(["stored", "missing", "messages"])
            got.append((r.resolved, r.resolved_on, r.stale_parked, pending.to_pylist()))
        assert got == [
            (0, "", 2, [{"stored": wkey, "missing": wkey, "messages": 2}]),
            (1, on, 1, [{"stored": wkey, "missing": gkey, "messages": 1}]),
            (0, "", 1, [{"stored": wkey, "missing": gkey, "messages": 1}]),
            (1, on, 0, []),
        ], name
        # The summary read back from the tables (a restarted writer) is the same.
        fresh = SilverBatchWriter(run.s, app_id="test-silver")
        assert fresh.pending_parked(2).select(["stored", "missing", "messages"]).to_pylist() == [
            {"stored": wkey, "missing": wkey, "messages": 1}
        ], name  # as of before batch 2: the table says `both` waits for its stored key
        assert fresh.pending_parked(4).num_rows == 0
        parked = run.table("parked").sort_by("offset")
        assert parked.select(["offset", "batch_id", "missing"]).to_pylist() == [
            {"offset": 0, "batch_id": 0, "missing": wkey},
            {"offset": 1, "batch_id": 0, "missing": wkey},
        ], name
        assert run.table("parked_resolved").sort_by("offset").to_pylist() == [
            {"partition": "p0", "offset": 0, "batch_id": 1, "parked_batch": 0},
            {"partition": "p0", "offset": 1, "batch_id": 3, "parked_batch": 0},
        ], name
        samples = run.table("object_samples").sort_by([("offset", "ascending"), ("record_index", "ascending")])
        assert [
            (r["offset"], r["class_name"], r["opcode"], r["batch_id"]) for r in samples.to_pylist()
        ] == [
            (0, "widget", "c", 1), (0, "widget", "i", 1), (1, "widget", "g", 3),
            (1, "gadget", "g", 3), (4, "widget", "i", 1),
        ], name  # fmt: skip
    for other in ("driver", "driver-big"):
        assert_same_tables(
            str(tmp_path / "tasks" / "silver"), str(tmp_path / other / "silver"),
            (*SILVER, "parked_resolved"),
        )  # fmt: skip


def test_what_crosses_tasks_is_completed_on_the_driver(spark: SparkSession, tmp_path: Path) -> None:
    """One micro-batch, two bronze files, two tasks: content whose schema only the other
    task sees, and a v1 method call whose request (on an object sampled in this batch)
    and response land in different tasks. Nothing stays parked, and the call is paired
    and typed both ways (its class from the samples the other task wrote)."""
    from tests.spark import test_silver_late as late
    from tests.spark import test_silver_methods as calls

    a = [
        late.content(late.V1, ("c", 1), ("i", 1)),
        calls.msg(calls.broker_sample(), 0, "mgmt.amq1.stats.org.apache.qpid.broker.broker"),
        calls.msg(calls.request("AM1", 7, calls.BROKER_ID, "echo", calls.ECHO_IN), 1),
    ]
    b = [late.announce(late.V1), calls.msg(calls.response("AM1", 7, 0, "OK", calls.ECHO_OUT), 2)]
    n = len(a) + len(b)
    parts = [
        bronze_rows(a, batch_id=0),
        bronze_rows(b, first_offset=len(a), batch_id=1),
        bronze_rows([late.heartbeat()], first_offset=n, batch_id=2),  # a second micro-batch
    ]
    s, reports = _stream(spark, tmp_path, parts, "tasks")
    assert [(r.tasks, r.new_schemas, r.resolved) for r in reports] == [(2, 1, 0), (1, 0, 0)]
    assert delta.read_arrow(s.path("parked")).num_rows == 0
    samples = delta.read_arrow(s.path("object_samples"))
    widgets = samples.filter(pa.compute.equal(samples.column("class_name"), "widget"))
    assert sorted(widgets.column("opcode").to_pylist()) == ["c", "i"]
    (call,) = delta.read_arrow(s.path("method_calls")).to_pylist()
    assert (call["class_name"], call["method_name"], call["status"]) == ("broker", "echo", 0)
    assert call["arguments_in"] == '{"body":"ping","sequence":42}'
    assert call["arguments_out"] == '{"body":"pong","sequence":42}'


def test_one_bronze_file_of_one_row_group_feeds_every_task(
    spark: SparkSession, shared_dir: str, tmp_path: Path
) -> None:
    """A micro-batch of a single bronze file with a single row group (a bronze batch of
    up to 100,000 messages writes one) is cut by rows into one unit per core; the
    units read every row once, and the tables equal the driver path's."""
    from pipeline.silver.tasks import _read_unit, plan_units

    msgs = list(read_capture(os.path.join(shared_dir, REAL["qpidd"])))
    whole = [bronze_rows(msgs, first_offset=0, batch_id=0)]
    tasks, reports = _stream(spark, tmp_path / "tasks", whole, "tasks")
    assert [(r.decode_on, r.tasks) for r in reports] == [("tasks", 2)]
    driver, _ = _stream(spark, tmp_path / "driver", whole, "driver")
    assert_same_tables(tasks.root, driver.root, SILVER)

    adds = commit_adds(tasks.bronze, 1) or []
    assert len(adds) == 1
    units = plan_units(adds, 3)
    slices = sorted(p.rows for u in units for p in u.parts if p.rows is not None)
    assert len(units) == 3 and slices[0][0] == 0 and slices[-1][1] == len(msgs)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(slices))
    offsets = sorted(o for u in units for b in _read_unit(u) for o in b.column("offset").to_pylist())
    assert offsets == list(range(len(msgs)))
    # Files enough for every task: whole files, no slices.
    assert [[p.rows for p in u.parts] for u in plan_units(adds, 1)] == [[None]]


def test_gold_stream_direct_split_and_driver_paths_agree(
    spark: SparkSession, shared_dir: str, tmp_path: Path
) -> None:
    """The gold *stream* over the same silver (three agents, one restarting; one silver
    commit per micro-batch), five ways: tasks with 3 buckets of agents (the direct path:
    each agent task reads the whole batch), tasks with 5 (the split step over the
    batch's known files), both with their rate stage (as many buckets of series), the
    split without it (each agent task pairs its own rates), the rate stage on auto, and
    the driver. Identical gold tables; the reports say which way each batch went."""
    from pipeline.gold import GoldBatchWriter, run_gold
    from pipeline.gold.tasks import DIRECT_MAX_BUCKETS

    msgs = _capture(tmp_path, "am2", shared_dir)
    silver, _ = _stream(spark, tmp_path / "s", _split(msgs, 4), "driver")
    roots = {}
    for label, mode, buckets, rate_buckets in (
        ("direct", "tasks", 3, 3), ("split", "tasks", 5, 5), ("split-agents", "tasks", 5, 0),
        ("auto", "tasks", 3, None), ("driver", "driver", None, None),
    ):  # fmt: skip
        gs = GoldSettings(
            silver=silver.root, root=str(tmp_path / label), checkpoint=str(tmp_path / f"{label}-ck"),
            compute_on=mode, buckets=buckets, rate_buckets=rate_buckets, max_files_per_trigger=1,
        )  # fmt: skip
        w = GoldBatchWriter(gs)
        assert run_gold(spark, gs, timeout_s=600, writer=w) == 0
        steps = [r.steps for r in w.reports]
        assert len(w.reports) >= 2 and all(r.compute_on == mode for r in w.reports), label
        if mode == "tasks":
            split = buckets is not None and buckets > DIRECT_MAX_BUCKETS
            assert all(("split" in st) == split for st in steps), (label, steps)
            # Auto: the agents 1.1 and 1.2 share one of the 3 buckets, 1.3 has one, the
            # third is empty: uneven, so every batch after the first runs the stage.
            staged = [rate_buckets != 0 and (rate_buckets is not None or i > 0)
                      for i in range(len(steps))]  # fmt: skip
            assert [("rates" in st) for st in steps] == staged, (label, steps)
            assert [r.tasks for r in w.reports] == [buckets * (1 + on) for on in staged], label  # type: ignore[operator]
        roots[label] = gs.root
    assert delta.read_arrow(roots["direct"] + "/statistic_rates").num_rows > 0
    assert_same_tables(roots["direct"], roots["driver"], GOLD)
    assert_same_tables(roots["split"], roots["driver"], GOLD)
    assert_same_tables(roots["split-agents"], roots["driver"], GOLD)
    assert_same_tables(roots["auto"], roots["driver"], GOLD)
    for root in roots.values():
        for table in sorted(os.listdir(root)):
            assert stray_files(os.path.join(root, table)) == [], (root, table)
