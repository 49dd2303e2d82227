"""Gold against the simulator's manifest: every rate, every transient and deleted object,
across a forced agent restart and duplicated deliveries.

The simulator (``qmf sim``) writes a capture and a manifest of every record
and lifecycle event. The capture becomes bronze (with every 7th message
delivered twice: twins) and silver (the silver writer), then gold in batch.
Expected rows come from the manifest alone.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pipeline.cli import main
from pipeline.codec.capture import read_capture
from pipeline.gold import GoldSettings, run_gold_batch
from pipeline.gold.transforms import LivenessRules
from pipeline.lake import delta
from pipeline.silver import SilverBatchWriter, SilverSettings, bronze_rows
from pipeline.sim.manifest import read_manifest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


def micros(t: datetime) -> int:
    """A timestamp as exact integer microseconds since the epoch (no float rounding)."""
    return (t - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)

START_NS = 1_800_000_000_000_000_000
RESTART_AT = 4


def from_create(created: int, t: int, value: int) -> float | None:
    """The rate of an interval counted from a creation: none under the minimum (0.9 s)."""
    return None if t - created < 900_000_000 else value / ((t - created) / 1e9)


def _epoch(oid: str) -> str:
    return oid.split("-")[1]


def test_gold_equals_the_simulator_manifest(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, man = str(tmp_path / "sim.jsonl"), str(tmp_path / "truth.jsonl")
    args = ["--dialect", "am2", "--queues", "8", "--transients", "1", "--short-lived", "1", "--intervals", "8",
            "--restart", f"0:{RESTART_AT}", "--seed", "3", "--start-ns", str(START_NS)]  # fmt: skip
    assert main(["sim", "-o", out, "--manifest", man, *args]) == 0
    capsys.readouterr()
    msgs = list(read_capture(out))
    twins = msgs[::7]
    ss = SilverSettings(bronze=str(tmp_path / "bronze"), root=str(tmp_path / "silver"))
    SilverBatchWriter(ss, app_id="silver").decode_local(bronze_rows([*msgs, *twins]), 0)
    entries = list(read_manifest(man))
    agent = next(e["agent"] for e in entries if e["kind"] == "object")
    gs = GoldSettings(
        silver=ss.root, root=str(tmp_path / "gold"),
        liveness=LivenessRules(v1_agent=agent, v1_interval_s=1.0),
    )  # fmt: skip
    run_gold_batch(spark, gs, 0)

    # Expected enqueue intervals per (agent, queue name), from the manifest.
    objects = [e for e in entries if e["kind"] == "object" and e["class_name"] == "queue"]
    names = {(e["agent"], e["object_id"]["oid"]): e["values"]["name"] for e in objects if "name" in e["values"]}
    series: dict[tuple[str, str], dict[int, tuple[str, int, int]]] = defaultdict(dict)
    for e in objects:
        if "msgTotalEnqueues" in e["values"]:
            oid = e["object_id"]["oid"]
            # A delete record's sample time is its delete time (its update time is stale).
            t = max(e["update_ns"], e.get("delete_ns") or 0)
            series[(e["agent"], names[(e["agent"], oid)])].setdefault(
                t, (oid, e["create_ns"], int(e["values"]["msgTotalEnqueues"]))
            )
    want: dict[tuple[str, str], list[tuple[int, int, float | None, str | None]]] = {}
    resets: set[str] = set()
    for key, by_t in series.items():
        rows = []
        t1, (o1, c1, v1) = min(by_t.items())
        if 0 < c1 < t1 and t1 - c1 <= 300 * 10**9:  # a new queue counts from 0 at its creation
            rows.append((c1, t1, from_create(c1, t1, v1), None))
        for (t0, (o0, c0, v0)), (t1, (o1, c1, v1)) in itertools.pairwise(sorted(by_t.items())):
            if (o0, c0) != (o1, c1) and t0 < c1 < t1:  # re-created (restart): from 0 at c1
                resets.add("from_create")  # a restart's: no rate (recovered counts)
                rows.append((c1, t1, None if _epoch(o0) != _epoch(o1) else from_create(c1, t1, v1), None))
                continue
            why = (
                "agent_restart" if _epoch(o0) != _epoch(o1)
                else "recreated" if (o0, c0) != (o1, c1)
                else "counter_decreased" if v1 < v0
                else None
            )  # fmt: skip
            resets.add(str(why))
            rows.append((t0, t1, None if why else (v1 - v0) / ((t1 - t0) / 1e9), why))
        if rows:
            want[key] = rows
    assert "from_create" in resets and "None" in resets

    t = delta.read_arrow(gs.path("statistic_rates")).to_pylist()
    got: dict[tuple[str, str], list[tuple[int, int, float | None, str | None]]] = defaultdict(list)
    for r in t:
        if r["statistic"] == "msgTotalEnqueues" and r["class_name"] == "queue":
            got[(r["agent"], json.loads(r["index_key"])[-1])].append(
                (r["start_ns"], r["end_ns"], r["rate"], r["reset"])
            )
    assert set(got) == set(want)
    for key, rows in want.items():
        g = sorted(got[key])
        assert [(a, b, w) for a, b, _, w in g] == [(a, b, w) for a, b, _, w in rows], key
        for (_, _, gr, _), (_, _, wr, _) in zip(g, rows, strict=True):
            assert gr == pytest.approx(wr, rel=1e-12) if wr is not None else gr is None

    # Every queue's counts, deleted, re-created by the restart or live at the end: gold's
    # deltas from its creation sum to its last published value, and for deleted ones that
    # is the broker's final count (the manifest's ``final`` lines).
    sums: dict[tuple[str, str], float] = defaultdict(float)
    last: dict[tuple[str, str], tuple[int, float]] = {}
    for r in t:
        if r["statistic"] == "msgTotalEnqueues" and r["class_name"] == "queue" and r["delta"] is not None:
            k = (r["agent"], r["object_id"])
            sums[k] += r["delta"]
            last[k] = max(last.get(k, (0, 0.0)), (r["end_ns"], r["value"]))
    published: dict[tuple[str, str], int] = {}
    for e in sorted(objects, key=lambda e: max(e["update_ns"], e.get("delete_ns") or 0)):
        if "msgTotalEnqueues" in e["values"]:
            published[(e["agent"], e["object_id"]["oid"])] = int(e["values"]["msgTotalEnqueues"])
    finals = [e for e in entries if e["kind"] == "final" and e["class_name"] == "queue"]
    assert {e["reason"] for e in finals} == {"deleted", "restart", "end"}
    for e in finals:
        k = (e["agent"], e["object_id"]["oid"])
        if k not in published:
            continue
        assert sums[k] == published[k], k
        assert last[k][1] == published[k], k
        # What the broker counted: at its deletion, at the restart (the old boot's
        # counts), at the end of the run. Before and after the restart alike.
        assert published[k] == int(e["values"]["msgTotalEnqueues"]), (e["reason"], k)
    assert sum(e["reason"] == "deleted" for e in finals) >= 6
    # Short-lived queues: published for intervals, then a last record with qpidd's stale
    # update time and the delete time; gold ends each with that record's counts.
    short = [e for e in finals if e["reason"] == "deleted" and e["object_name"].rsplit(",", 1)[-1].startswith("sl.")]
    assert len(short) == 2 and all(e["delete_ns"] > e["update_ns"] for e in short)  # one per boot
    assert all(last[(e["agent"], e["object_id"]["oid"])][1] == e["values"]["msgTotalEnqueues"] for e in short)

    # Lifecycles: every created queue has a row; every deletion is there with both times.
    lc = {(r["agent"], r["object_id"]): r for r in delta.read_arrow(gs.path("lifecycle_state")).to_pylist()}
    creates = [e for e in entries if e["kind"] == "create" and e["class_name"] == "queue"]
    deletes = [e for e in entries if e["kind"] == "delete" and e["class_name"] == "queue"]
    assert len(deletes) >= 6
    for e in creates:
        r = lc[(e["agent"], e["object_id"]["oid"])]
        assert micros(r["created_at"]) == e["timestamp_ns"] // 1000
    # Names: every queue by its manifest name (vhost "/" resolved and dropped), one broker.
    for (a, oid), name in names.items():
        assert lc[(a, oid)]["name"] == name
    hosts = {r["broker"] for r in lc.values()}
    assert len(hosts) == 1 and re.fullmatch(r"amqp-broker@sim-[0-9a-f]{8}:5672", hosts.pop())
    for e in deletes:
        r = lc[(e["agent"], e["object_id"]["oid"])]
        assert (r["state"], r["end_reason"]) == ("deleted", "deleted")
        assert micros(r["deleted_at"]) == e["timestamp_ns"] // 1000
        assert r["created_at"] < r["deleted_at"]
    # The restart: objects of the first epoch that were not deleted are lost with their agent,
    # at the first sample of the next epoch.
    restart = next(e for e in entries if e["kind"] == "restart")
    first_new = min(e["update_ns"] for e in objects if e["update_ns"] > restart["timestamp_ns"])
    old = [r for r in lc.values() if r["class_name"] == "queue" and r["generation"] == 1]
    assert old
    for r in old:
        if r["deleted_at"] is None:
            assert (r["state"], r["end_reason"]) == ("lost", "agent_restart"), r["object_id"]
            assert micros(r["ended_at"]) == first_new // 1000
    assert all(r["state"] in ("live", "deleted") for r in lc.values() if r["generation"] == 2)
    # Liveness: the restart had no heartbeat gap, and an AM2 heartbeat carries no epoch;
    # the objects' new generation closes the up interval as restarted at the first
    # heartbeat after it, as a V2 agent's new epoch would: every heartbeat in one of two.
    beats = [e for e in entries if e["kind"] == "heartbeat"]
    before = sum(e["timestamp_ns"] < first_new for e in beats)
    assert 0 < before < len(beats)
    liv: list[dict[str, Any]] = delta.read_arrow(gs.path("agent_liveness")).to_pylist()
    assert [(r["agent"], r["state"], r["started_by"], r["heartbeats"])
            for r in sorted(liv, key=lambda r: r["up_start_ns"])] == [
        (agent, "restarted", "first", before), (agent, "up", "restart", len(beats) - before)
    ]  # fmt: skip
