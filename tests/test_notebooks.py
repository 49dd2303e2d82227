"""Notebooks run top to bottom, headless, as a user would run them: bronze on a small
table written here, the others (queues, lifecycles, health) on the simulated lake of
``tests/lake.py``. Their results are checked against the tables and the simulator's
manifest, their figures for data; every notebook is stored without outputs."""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from pipeline import delta
from pipeline.codec.message import encode_message
from pipeline.progress import SEVERITIES
from pipeline.sim.manifest import read_manifest
from receivers.landing import LandedMessage, to_table
from schemas.tables import BRONZE
from tests.lake import START_NS, Lake

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def _code(path: Path) -> str:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return "\n\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")


def test_bronze_notebook_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.codec.records import Heartbeat

    msgs = []
    for i in range(3):
        hb = Heartbeat(dialect="AM1", opcode="h", seq=0, timestamp_ns=1_000_000_000 * (i + 1))
        body = encode_message([hb])
        assert isinstance(body, bytes)
        msgs.append(LandedMessage(body=body, routing_key=f"mgmt.agent{i}.heartbeat"))
    landed = to_table("p0", 0, msgs)
    landed = landed.drop_columns(["duplicate_of"])  # bronze keeps first copies only
    table = landed.append_column("batch_id", pa.array([0] * 3, pa.int64())).cast(BRONZE)
    write_deltalake(str(tmp_path / "bronze"), table)

    monkeypatch.setenv("QMF_DATA", str(tmp_path))
    scope: dict[str, Any] = {}
    exec(compile(_code(NOTEBOOKS / "bronze.ipynb"), "bronze.ipynb", "exec"), scope)
    assert scope["bronze"].shape[0] == 3
    assert dict(scope["by_opcode"]) == {"h": 3}
    assert scope["problems"] == 0
    assert os.environ["QMF_DATA"] == str(tmp_path)


# ---------------------------------------------------------------------------
# The lake notebooks (queues, lifecycles, health) on the simulated lake.

SECOND_NS = 1_000_000_000
LAKE_NOTEBOOKS = ("queues", "lifecycles", "health")


def _run(name: str, lake: Lake, out: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Execute every code cell of notebooks/<name>.ipynb in order, headless, on ``lake``."""
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.setenv("QMF_DATA", str(lake.root))
    monkeypatch.setenv("QMF_NOTEBOOK_OUT", str(out))
    scope: dict[str, Any] = {}
    exec(compile(_code(NOTEBOOKS / f"{name}.ipynb"), f"{name}.ipynb", "exec"), scope)
    return scope


def _close(scope: dict[str, Any]) -> None:
    import matplotlib.pyplot as plt

    for fig in scope.get("figures", {}).values():
        plt.close(fig)


def _check_figures(scope: dict[str, Any], out: Path, names: set[str]) -> None:
    """Each expected figure exists, has axes with data, and was saved as a PNG."""
    figures = scope["figures"]
    assert set(figures) == names
    for name, fig in figures.items():
        drawn = [
            ax for ax in fig.axes
            if any(len(line.get_xdata()) >= 2 for line in ax.lines)
            or any(len(c.get_offsets()) for c in ax.collections)
            or ax.patches
        ]  # fmt: skip
        assert drawn, f"figure {name} has no data"
        png = out / f"{name}.png"
        assert scope["saved"][name] == png
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _manifest(lake: Lake) -> list[dict[str, Any]]:
    return list(read_manifest(str(lake.manifest)))


def _us(t: datetime) -> int:
    """Exact integer microseconds since the epoch."""
    return (t - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def _queue_names(entries: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    """(agent, oid) -> queue name, from the manifest's property records."""
    return {
        (e["agent"], e["object_id"]["oid"]): e["values"]["name"]
        for e in entries
        if e["kind"] == "object" and e["class_name"] == "queue" and "name" in e["values"]
    }


def test_notebooks_are_stored_without_outputs() -> None:
    """Every notebook is committed clean: no outputs, no execution counts."""
    paths = sorted(NOTEBOOKS.glob("*.ipynb"))
    assert {p.stem for p in paths} >= {"bronze", *LAKE_NOTEBOOKS}
    for path in paths:
        nb = json.loads(path.read_text(encoding="utf-8"))
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                assert cell["execution_count"] is None, path.name
                assert cell["outputs"] == [], path.name
            assert "attachments" not in cell or not cell["attachments"], path.name
        compile(_code(path), path.name, "exec")


@pytest.mark.spark
def test_queues_notebook(sim_lake: Lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scope = _run("queues", sim_lake, tmp_path / "figs", monkeypatch)
    try:
        _check_figures(scope, tmp_path / "figs", {"queue_throughput", "queue_depth"})
        # Expected from the gold table, read without polars or Spark.
        rows = [
            r for r in delta.read_arrow(sim_lake.gold / "statistic_rates").to_pylist()
            if r["class_name"] == "queue"
        ]  # fmt: skip
        series: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = defaultdict(
            lambda: defaultdict(list)
        )
        for r in rows:
            series[(r["agent"], json.loads(r["index_key"])[-1])][r["statistic"]].append(r)
        expected = []
        for (agent, queue), stats in series.items():
            enq = sorted(stats["msgTotalEnqueues"], key=lambda r: (r["end_ns"], r["object_id"]))
            deq = sorted(stats["msgTotalDequeues"], key=lambda r: (r["end_ns"], r["object_id"]))
            rated = [r["rate"] for r in enq if r["rate"] is not None]
            if rated:
                expected.append(
                    (agent, queue, sum(rated) / len(rated), len(rated), enq[-1]["end_ns"],
                     enq[-1]["rate"], deq[-1]["rate"])
                )  # fmt: skip
        expected.sort(key=lambda e: (-e[2], e[1], e[0]))
        top = scope["top_queues"].to_dicts()
        assert len(top) == 5
        assert [(t["agent"], t["queue"]) for t in top] == [(e[0], e[1]) for e in expected[:5]]
        for t, (_, _, mean, n, end_ns, last_enq, last_deq) in zip(top, expected, strict=False):
            assert t["mean_enqueue_rate"] == pytest.approx(mean, rel=1e-12)
            assert t["rated_intervals"] == n
            assert _us(t["last_end_time"]) == end_ns // 1000
            assert (t["last_enqueue_rate"], t["last_dequeue_rate"]) == (last_enq, last_deq)

        # The last interval's enqueue rate from the simulator's own counters.
        entries = _manifest(sim_lake)
        names = _queue_names(entries)
        samples: dict[tuple[str, str], dict[int, tuple[str, int]]] = defaultdict(dict)
        depths: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
        for e in entries:
            if e["kind"] == "object" and e["class_name"] == "queue" and e["opcode"] == "i":
                oid = e["object_id"]["oid"]
                key = (e["agent"], names[(e["agent"], oid)])
                samples[key][e["update_ns"]] = (oid, int(e["values"]["msgTotalEnqueues"]))
                depths[(e["agent"], oid)][e["update_ns"] // 1000] = float(e["values"]["msgDepth"])
        for t in top:
            (t0, (o0, v0)), (t1, (o1, v1)) = sorted(samples[(t["agent"], t["queue"])].items())[-2:]
            assert o0 == o1 and _us(t["last_end_time"]) == t1 // 1000
            assert t["last_enqueue_rate"] == pytest.approx((v1 - v0) / ((t1 - t0) / 1e9), rel=1e-12)

        # Spark's per-queue totals: the sums of the counter deltas; polars agrees.
        totals = {
            (k[0], k[1]): (
                sum(r["delta"] or 0.0 for r in s["msgTotalEnqueues"]),
                sum(r["delta"] or 0.0 for r in s["msgTotalDequeues"]),
            )
            for k, s in series.items()
        }
        spark_totals = scope["spark_totals"]
        got = {
            (a, q): (e, d)
            for a, q, e, d in spark_totals[["agent", "queue", "enqueued", "dequeued"]]
            .fillna(0.0)
            .values.tolist()
        }
        assert got == totals
        assert scope["spark_agrees"] is True

        # Depth: every sample of every queue object with at least one pair, as published.
        depth: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
        for r in scope["depth"].iter_rows(named=True):
            depth[(r["agent"], r["object_id"])][_us(r["time"])] = r["depth"]
        assert depth == {k: v for k, v in depths.items() if len(v) >= 2}
        lines = scope["fig_throughput"].axes[0].lines
        assert (
            len({line.get_label() for line in lines if not line.get_label().startswith("_")}) == 5
        )
    finally:
        _close(scope)


@pytest.mark.spark
def test_lifecycles_notebook(
    sim_lake: Lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scope = _run("lifecycles", sim_lake, tmp_path / "figs", monkeypatch)
    try:
        _check_figures(scope, tmp_path / "figs", {"object_churn", "object_lifecycles"})
        entries = _manifest(sim_lake)
        start = START_NS // 1000
        creates = [e for e in entries if e["kind"] == "create"]
        deletes = [e for e in entries if e["kind"] == "delete"]
        assert scope["bucket_ms"] == 1000  # the simulator's 1 s interval, inferred

        # Churn per simulator interval and class.
        def per_interval(es: list[dict[str, Any]]) -> Counter[tuple[int, str]]:
            return Counter((start + e["interval"] * 1_000_000, e["class_name"]) for e in es)

        churn = scope["churn"].to_dicts()
        got_created = Counter({(_us(r["interval"]), r["class_name"]): r["created"] for r in churn})
        got_deleted = Counter({(_us(r["interval"]), r["class_name"]): r["deleted"] for r in churn})
        assert +got_created == per_interval(creates)
        assert +got_deleted == per_interval(deletes)

        # Transients: created and deleted within one simulator interval.
        created_at = {(e["agent"], e["object_id"]["oid"]): e for e in creates}
        want = {
            (e["agent"], e["object_id"]["oid"]): (
                created_at[(e["agent"], e["object_id"]["oid"])]["timestamp_ns"] // 1000,
                e["timestamp_ns"] // 1000,
            )
            for e in deletes
            if created_at[(e["agent"], e["object_id"]["oid"])]["interval"] == e["interval"]
        }
        assert len(want) == 48  # a transient queue and its binding per agent and interval
        got = {
            (r["agent"], r["object_id"]): (_us(r["created_at"]), _us(r["deleted_at"]))
            for r in scope["transients"].iter_rows(named=True)
        }
        assert got == want

        # Spark's per-class counts; the restart loses what the restarted agent had.
        restart = next(e for e in entries if e["kind"] == "restart")
        gone = {(e["agent"], e["object_id"]["oid"]) for e in deletes}
        lost = Counter(
            e["class_name"] for e in creates
            if e["agent"] == restart["agent"] and e["timestamp_ns"] < restart["timestamp_ns"]
            and (e["agent"], e["object_id"]["oid"]) not in gone
        )  # fmt: skip
        by_class = Counter(e["class_name"] for e in creates)
        deleted = Counter(e["class_name"] for e in deletes)
        want_classes = [
            (c, by_class[c], by_class[c], deleted[c], lost[c]) for c in sorted(by_class)
        ]
        spark_rows = [tuple(r) for r in scope["spark_by_class"].values.tolist()]
        assert spark_rows == want_classes
        assert scope["spark_agrees"] is True

        # One bar per queue object; the transient ones red.
        ax = scope["fig_lifecycles"].axes[0]
        queues = [e for e in creates if e["class_name"] == "queue"]
        assert len(ax.patches) == len(queues)
        red = [p for p in ax.patches if p.get_facecolor()[:3] == (1.0, 0.0, 0.0)]
        assert len(red) == sum(1 for k in want if k in {
            (e["agent"], e["object_id"]["oid"]) for e in queues
        })  # fmt: skip
    finally:
        _close(scope)


@pytest.mark.spark
def test_health_notebook(sim_lake: Lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scope = _run("health", sim_lake, tmp_path / "figs", monkeypatch)
    try:
        _check_figures(scope, tmp_path / "figs", {"events_timeline", "agent_health"})
        entries = _manifest(sim_lake)
        events = [e for e in entries if e["kind"] == "event"]
        by_severity = Counter(SEVERITIES[e["severity"]] for e in events)
        assert scope["events_by_severity"] == dict(by_severity)
        assert scope["spark_events_by_severity"] == dict(by_severity)
        assert scope["spark_agrees"] is True
        by_name = {r["event_name"]: r["len"] for r in scope["events_by_name"].iter_rows(named=True)}
        assert by_name == dict(Counter(e["class_name"] for e in events))
        # Every event is a point of the timeline.
        points = sum(len(c.get_offsets()) for c in scope["fig_events"].axes[0].collections)
        assert points == len(events)

        # Heartbeats per agent, first and last.
        beats: dict[str, list[int]] = defaultdict(list)
        for e in entries:
            if e["kind"] == "heartbeat":
                beats[e["agent"]].append(e["timestamp_ns"])
        summary = {
            r["agent"]: (r["heartbeats"], _us(r["first"]), _us(r["last"]), r["max_gap_s"])
            for r in scope["heartbeat_summary"].iter_rows(named=True)
        }
        assert summary == {
            a: (len(ts), min(ts) // 1000, max(ts) // 1000, 1.0) for a, ts in beats.items()
        }

        # The restart: AM1 heartbeats carry no epoch, so it shows as a new boot sequence,
        # seen at the restarted agent's first sample after it.
        want = []
        for r in (e for e in entries if e["kind"] == "restart"):
            first = min(
                e["update_ns"] for e in entries
                if e["kind"] == "object" and e["agent"] == r["agent"]
                and e["update_ns"] > r["timestamp_ns"]
            )  # fmt: skip
            want.append((r["agent"], r["boot_seq"], first // 1000, "objects"))
        got = [
            (r["agent"], r["generation"], _us(r["seen_at"]), r["source"])
            for r in scope["restarts"].iter_rows(named=True)
        ]
        assert got == want and len(want) == 1
        status = {
            r["agent"]: (r["state_now"], r["heartbeats"], r["restarts"])
            for r in scope["agent_status"].iter_rows(named=True)
        }
        assert status == {
            a: ("up", len(ts), sum(1 for w in want if w[0] == a)) for a, ts in beats.items()
        }
    finally:
        _close(scope)


@pytest.mark.spark
def test_lake_notebooks_run_on_empty_tables(
    sim_lake: Lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Right after ``qmf run`` starts the tables exist but hold nothing: no cell fails,
    the results are empty."""
    from deltalake import DeltaTable

    empty = Lake(root=tmp_path / "empty", manifest=tmp_path / "empty" / "none.jsonl")
    tables = [sim_lake.bronze, *sorted(sim_lake.silver.iterdir()), *sorted(sim_lake.gold.iterdir())]
    for path in tables:
        dt = DeltaTable(str(path))
        dest = empty.root / path.relative_to(sim_lake.root)
        delta.create_table(dest, delta.table_schema(dt), delta.partition_columns(dt))
    results = {}
    for name in LAKE_NOTEBOOKS:
        scope = _run(name, empty, tmp_path / "figs", monkeypatch)
        try:
            assert scope["spark_agrees"] is True
            assert all(p is not None and p.exists() for p in scope["saved"].values())
            results[name] = scope
        finally:
            _close(scope)
    assert results["queues"]["top_queues"].height == 0
    assert results["lifecycles"]["transients"].height == 0
    assert results["health"]["events_by_severity"] == {}
    assert results["health"]["restarts"].height == 0


def test_object_names_from_index_keys() -> None:
    from pipeline.notebook import last_index_value

    assert last_index_value('["1-1-3","q00001"]') == "q00001"
    assert last_index_value('["host",5672]') == "5672"
    assert last_index_value('["x",{"k":1}]') == '{"k": 1}'
    assert last_index_value(None) is None
    assert last_index_value("not json") == "not json"
