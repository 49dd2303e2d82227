"""The notebooks run as a person runs them: in a Jupyter kernel (nbclient + ipykernel, the
kernel being this .venv's interpreter), top to bottom, on the simulated lake of
``tests/lake.py``, on an empty copy of it and on real qpidd traffic (the qmf1-qmf2-60s
sample through silver and gold, ``tests/live_lake.py``). Any cell error fails the test.

One kernel serves the whole module (a kernel and its Spark JVM cost seconds to start):
before each notebook a setup cell clears the kernel's namespace (``%reset -f``), points
``QMF_DATA`` and ``QMF_NOTEBOOK_OUT`` at the lake and the figure folder and starts the
kernel's SparkSession with the test settings. After it, a probe cell sends back, as one
JSON display output, the values the notebook computed, what its figures draw and name
(``pipeline.views.notebook.figure_labels``) and the interpreter the kernel runs. The values are
checked against the tables and the simulator's manifest; every figure must come out as a
PNG image of the notebook, label queues by their names (``q00003``, not an index key or
an object id) and agents by their broker. Every notebook is stored without outputs."""

from __future__ import annotations

import base64
import importlib
import json
import os
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pipeline.lake import delta, snapshot
from pipeline.sim.manifest import read_manifest
from pipeline.views.live import key_name, last_index_value
from pipeline.views.progress import SEVERITIES
from tests.lake import START_NS, Lake

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
LAKE_NOTEBOOKS = ("queues", "lifecycles", "health", "spark_sql")
KERNEL = "qmf-tests-venv"  # a kernelspec of our own: never a python3 found elsewhere
PNG = b"\x89PNG\r\n\x1a\n"
CELL_TIMEOUT_S = 300

SETUP = """\
import matplotlib.pyplot
matplotlib.pyplot.close("all")
%reset -f
import os
os.environ["QMF_DATA"] = {data!r}
os.environ["QMF_NOTEBOOK_OUT"] = {out!r}
from pipeline.spark import get_spark
get_spark("qmf-notebook-tests", test=True)
del os, get_spark
"""

PROBE = """\
import sys as _sys
import polars as _pl
import polars.selectors as _cs
from IPython.display import display as _display
from pipeline.views import notebook as _nb


def _plain(v):
    if v is None or isinstance(v, (str, bool, int, float)):
        return None if isinstance(v, float) and v != v else v
    if hasattr(v, "item"):
        return _plain(v.item())
    return str(v)


def _frame(df):
    if isinstance(df, _pl.DataFrame):
        return df.with_columns(_cs.datetime().dt.epoch("us")).to_dicts()
    return [[_plain(v) for v in row] for row in df.itertuples(index=False)]


def _axes(ax):
    return {{
        "lines": [len(line.get_xdata()) for line in ax.lines],
        "points": [len(c.get_offsets()) for c in ax.collections],
        "patches": len(ax.patches),
        "red": sum(tuple(p.get_facecolor()[:3]) == (1.0, 0.0, 0.0) for p in ax.patches),
    }}


_display(
    {{
        "application/json": {{
            "executable": _sys.executable,
            "figures": {{
                k: {{"axes": [_axes(ax) for ax in f.axes], **_nb.figure_labels(f)}}
                for k, f in figures.items()
            }},
            "saved": {{k: None if p is None else str(p) for k, p in saved.items()}},
            "values": {values},
        }}
    }},
    raw=True,
)
"""


@dataclass(frozen=True)
class Run:
    """What one notebook run left: its values, its figures, its image outputs."""

    values: dict[str, Any]
    figures: dict[str, dict[str, Any]]
    saved: dict[str, str | None]
    images: list[bytes]  # image/png outputs of the notebook's own cells, in order
    executable: str


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One ipykernel of this interpreter for the module, from a kernelspec in a temp dir."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    specs = tmp_path_factory.mktemp("kernels")
    (specs / KERNEL).mkdir()
    (specs / KERNEL / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "qmf tests (.venv)",
                "language": "python",
            }
        )
    )
    ksm = KernelSpecManager(kernel_dirs=[str(specs)], ensure_native_kernel=False)
    km = KernelManager(kernel_spec_manager=ksm, kernel_name=KERNEL, transport="ipc")
    km.ip = str(specs / "ipc")  # unix sockets under the temp dir, no TCP port
    # MPLBACKEND would override the kernel's inline backend: no figure would be shown.
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    km.start_kernel(env=env, cwd=str(ROOT))
    try:
        yield km
    finally:
        km.shutdown_kernel(now=True)


def run_notebook(km: Any, name: str, data: Path, out: Path, values: dict[str, str]) -> Run:
    """Execute notebooks/<name>.ipynb in ``km`` on ``data``; ``values``: name -> an
    expression evaluated in the kernel after the last cell (``_frame(df)`` for a frame)."""
    from nbclient import NotebookClient

    nbformat: Any = importlib.import_module("nbformat")  # untyped: keep mypy --strict quiet
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    own = len(nb.cells)
    exprs = "{" + ", ".join(f"{k!r}: {v}" for k, v in values.items()) + "}"
    nb.cells.insert(0, nbformat.v4.new_code_cell(SETUP.format(data=str(data), out=str(out))))
    nb.cells.append(nbformat.v4.new_code_cell(PROBE.format(values=exprs)))
    NotebookClient(nb, km=km, timeout=CELL_TIMEOUT_S, allow_errors=False).execute()
    images = [
        base64.b64decode(o["data"]["image/png"])
        for cell in nb.cells[1 : own + 1]
        if cell.cell_type == "code"
        for o in cell.outputs
        if o.output_type in ("display_data", "execute_result") and "image/png" in o["data"]
    ]
    (probe,) = (o["data"]["application/json"] for o in nb.cells[-1].outputs)
    return Run(probe["values"], probe["figures"], probe["saved"], images, probe["executable"])


def check_figures(run: Run, out: Path, names: set[str]) -> None:
    """Each expected figure is shown as a PNG output, has data, and was saved as a PNG."""
    assert run.executable == sys.executable
    assert set(run.figures) == names
    assert len(run.images) == len(names)
    assert all(img.startswith(PNG) for img in run.images)
    for name, fig in run.figures.items():
        drawn = [
            ax for ax in fig["axes"]
            if any(n >= 2 for n in ax["lines"]) or any(ax["points"]) or ax["patches"]
        ]  # fmt: skip
        assert drawn, f"figure {name} has no data"
        png = out / f"{name}.png"
        assert run.saved[name] == str(png)
        assert png.read_bytes().startswith(PNG)


# ---------------------------------------------------------------------------
# Expected values, from the tables (read without polars' Delta reader or Spark)
# and the simulator's manifest.


def _manifest(lake: Lake) -> list[dict[str, Any]]:
    return list(read_manifest(str(lake.manifest)))


def _us(t: datetime) -> int:
    """Exact integer microseconds since the epoch."""
    return (t - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def _latest_lifecycles(lake: Lake) -> dict[tuple[str, str], dict[str, Any]]:
    """(agent, object_id) -> its latest gold lifecycle row (max batch_id, last_seen_ns)."""
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    rows = delta.read_arrow(lake.gold / "lifecycle_state").to_pylist()
    for r in sorted(rows, key=lambda r: (r["batch_id"], r["last_seen_ns"])):
        latest[(r["agent"], r["object_id"])] = r
    return latest


def _names(lake: Lake) -> dict[tuple[str, str], str]:
    """Gold's current name of every object; before gold carried names, its index key's."""
    return {
        k: r.get("name") or key_name(r["index_key"], r["object_id"])
        for k, r in _latest_lifecycles(lake).items()
    }


def _brokers(lake: Lake) -> dict[str, str]:
    """agent -> gold's broker for it (latest row that names one), else the agent id."""
    brokers: dict[str, str] = {}
    for (agent, _), r in sorted(
        _latest_lifecycles(lake).items(), key=lambda kv: (kv[1]["batch_id"], kv[1]["last_seen_ns"])
    ):
        brokers.setdefault(agent, agent)
        if r.get("broker") and r["broker"] != agent:
            brokers[agent] = r["broker"]
    return brokers


def check_agent_labels(agents: dict[str, str], lake: Lake) -> None:
    """Agents read as their brokers; two agents never read the same."""
    brokers = _brokers(lake)
    assert set(agents) == set(brokers)
    assert len(set(agents.values())) == len(agents)
    shared = Counter(brokers.values())
    for agent, text in agents.items():
        assert text.startswith(brokers[agent])
        if shared[brokers[agent]] == 1:
            assert text == brokers[agent]


def _created_queue_names(entries: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    """(agent, oid) -> the queue's name, as the simulator created it (the last part of its
    object name ``...:queue:<vhost ref>,<name>``)."""
    return {
        (e["agent"], e["object_id"]["oid"]): e["object_name"].rsplit(",", 1)[-1]
        for e in entries
        if e["kind"] == "create" and e["class_name"] == "queue"
    }


def _kind(routing_key: str) -> str:
    parts = routing_key.split(".")
    return f"mgmt.*.{parts[2]}" if parts[0] == "mgmt" else ".".join(parts[:2])


# ---------------------------------------------------------------------------
# The notebooks in the kernel.


def test_notebooks_are_stored_without_outputs() -> None:
    """Every notebook is committed clean: no outputs, no execution counts; it names the
    ``python3`` kernel, which ``bash tools/setup.sh --jupyter`` gives JupyterLab."""
    paths = sorted(NOTEBOOKS.glob("*.ipynb"))
    assert {p.stem for p in paths} == {"bronze", *LAKE_NOTEBOOKS}
    for path in paths:
        nb = json.loads(path.read_text(encoding="utf-8"))
        assert nb["metadata"]["kernelspec"]["name"] == "python3", path.name
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                assert cell["execution_count"] is None, path.name
                assert cell["outputs"] == [], path.name
            assert "attachments" not in cell or not cell["attachments"], path.name


@pytest.mark.spark
def test_bronze_notebook(sim_lake: Lake, kernel: Any, tmp_path: Path) -> None:
    run = run_notebook(
        kernel,
        "bronze",
        sim_lake.root,
        tmp_path / "figs",
        {
            "rows": "bronze.height",
            "by_opcode": "dict(by_opcode)",
            "problems": "problems",
            "kinds": "dict(kinds.group_by('kind').len().iter_rows())",
        },
    )
    check_figures(run, tmp_path / "figs", {"bronze_messages"})
    entries = _manifest(sim_lake)
    messages = {e["message"]: e["routing_key"] for e in entries if "message" in e}
    assert run.values["rows"] == len(messages) == 507
    assert run.values["problems"] == 0
    assert run.values["by_opcode"] == dict(Counter(e["opcode"] for e in entries if "opcode" in e))
    kinds = Counter(_kind(k) for k in messages.values())
    assert run.values["kinds"] == dict(kinds)
    fig = run.figures["bronze_messages"]
    assert fig["legend"] == sorted(kinds, key=lambda k: (-kinds[k], k))
    assert {"mgmt.*.heartbeat", "mgmt.*.stat", "mgmt.*.prop"} <= set(fig["legend"])
    assert fig["axes"][0]["patches"] > 0


@pytest.mark.spark
def test_queues_notebook(sim_lake: Lake, kernel: Any, tmp_path: Path) -> None:
    run = run_notebook(
        kernel,
        "queues",
        sim_lake.root,
        tmp_path / "figs",
        {
            "top_queues": "_frame(top_queues)",
            "spark_totals": "_frame(spark_totals[['agent', 'queue', 'enqueued', 'dequeued']])",
            "spark_agrees": "spark_agrees",
            "depth": "_frame(depth)",
            "agents": "agents",
        },
    )
    check_figures(run, tmp_path / "figs", {"queue_throughput", "queue_depth"})
    agents: dict[str, str] = run.values["agents"]
    check_agent_labels(agents, sim_lake)
    names = _names(sim_lake)
    entries = _manifest(sim_lake)
    created = _created_queue_names(entries)
    # Gold's queue names are the simulator's (default vhost: no prefix).
    assert {k: v for k, v in names.items() if k in created} == created

    # Expected from the gold table: rates keyed by (agent, the object's name).
    rows = [
        r for r in delta.read_arrow(sim_lake.gold / "statistic_rates").to_pylist()
        if r["class_name"] == "queue"
    ]  # fmt: skip
    series: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for r in rows:
        series[(r["agent"], names[(r["agent"], r["object_id"])])][r["statistic"]].append(r)
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
    top = run.values["top_queues"]
    assert len(top) == 5
    assert [(t["agent"], t["queue"]) for t in top] == [(e[0], e[1]) for e in expected[:5]]
    assert [t["broker"] for t in top] == [agents[t["agent"]] for t in top]
    for t, (_, _, mean, n, end_ns, last_enq, last_deq) in zip(top, expected, strict=False):
        assert t["mean_enqueue_rate"] == pytest.approx(mean, rel=1e-12)
        assert t["rated_intervals"] == n
        assert t["last_end_time"] == end_ns // 1000
        assert (t["last_enqueue_rate"], t["last_dequeue_rate"]) == (last_enq, last_deq)

    # The last interval's enqueue rate from the simulator's own counters.
    samples: dict[tuple[str, str], dict[int, tuple[str, int]]] = defaultdict(dict)
    depths: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    born: dict[tuple[str, str], int] = {}
    for e in entries:
        if e["kind"] == "object" and e["class_name"] == "queue" and e["opcode"] == "i":
            oid = e["object_id"]["oid"]
            key = (e["agent"], created[(e["agent"], oid)])
            t = max(e["update_ns"], e.get("delete_ns") or 0)  # a delete record: its delete time
            samples[key][t] = (oid, int(e["values"]["msgTotalEnqueues"]))
            depths[(e["agent"], oid)][t // 1000] = float(e["values"]["msgDepth"])
            born[key] = e["create_ns"]
    for t in top:
        pts = sorted(samples[(t["agent"], t["queue"])].items())
        if len(pts) == 1:  # one sample: its interval counts from the queue's creation, from 0
            pts = [(born[(t["agent"], t["queue"])], (pts[0][1][0], 0)), *pts]
        (t0, (o0, v0)), (t1, (o1, v1)) = pts[-2:]
        assert o0 == o1 and t["last_end_time"] == t1 // 1000
        assert t["last_enqueue_rate"] == pytest.approx((v1 - v0) / ((t1 - t0) / 1e9), rel=1e-12)

    # Spark's per-queue totals: the sums of the counter deltas; polars agrees.
    totals = {
        k: (
            sum(r["delta"] or 0.0 for r in s["msgTotalEnqueues"]),
            sum(r["delta"] or 0.0 for r in s["msgTotalDequeues"]),
        )
        for k, s in series.items()
    }
    got = {(a, q): (e or 0.0, d or 0.0) for a, q, e, d in run.values["spark_totals"]}
    assert got == totals
    assert run.values["spark_agrees"] is True

    # Depth: every sample of every queue object with at least one pair, as published.
    depth: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for r in run.values["depth"]:
        depth[(r["agent"], r["object_id"])][r["time"]] = r["depth"]
    # Every queue sampled twice or more has its line; a line is its own object's samples
    # (a re-created queue's first interval is a reset: it starts at the old object's).
    assert {k for k, v in depths.items() if len(v) >= 2} <= set(depth)
    assert depth == {k: depths[k] for k in depth}

    # Both plots name the five queues by name and broker, nothing else.
    want = [f"{t['queue']} ({agents[t['agent']]})" for t in top]
    assert all(t["queue"].startswith("q0000") for t in top)
    for fig in ("queue_throughput", "queue_depth"):
        assert run.figures[fig]["legend"] == want
    assert run.figures["queue_throughput"]["titles"] == ["Top 5 queues by mean enqueue rate"]


@pytest.mark.spark
def test_lifecycles_notebook(sim_lake: Lake, kernel: Any, tmp_path: Path) -> None:
    run = run_notebook(
        kernel,
        "lifecycles",
        sim_lake.root,
        tmp_path / "figs",
        {
            "bucket_ms": "bucket_ms",
            "churn": "_frame(churn)",
            "transients": "_frame(transients)",
            "spark_by_class": "_frame(spark_by_class)",
            "spark_agrees": "spark_agrees",
            "agents": "agents",
        },
    )
    check_figures(run, tmp_path / "figs", {"object_churn", "object_lifecycles"})
    agents: dict[str, str] = run.values["agents"]
    check_agent_labels(agents, sim_lake)
    entries = _manifest(sim_lake)
    start = START_NS // 1000
    creates = [e for e in entries if e["kind"] == "create"]
    deletes = [e for e in entries if e["kind"] == "delete"]
    assert run.values["bucket_ms"] == 1000  # the simulator's 1 s interval, inferred

    # Churn per simulator interval and class.
    def per_interval(es: list[dict[str, Any]]) -> Counter[tuple[int, str]]:
        return Counter((start + e["interval"] * 1_000_000, e["class_name"]) for e in es)

    churn = run.values["churn"]
    got_created = Counter({(r["interval"], r["class_name"]): r["created"] for r in churn})
    got_deleted = Counter({(r["interval"], r["class_name"]): r["deleted"] for r in churn})
    assert +got_created == per_interval(creates)
    assert +got_deleted == per_interval(deletes)

    # Transients: created and deleted within one simulator interval, named as gold names them.
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
    transients = run.values["transients"]
    got = {(r["agent"], r["object_id"]): (r["created_at"], r["deleted_at"]) for r in transients}
    assert got == want
    names = _names(sim_lake)
    assert {(r["agent"], r["object_id"]): r["name"] for r in transients} == {
        k: names[k] for k in want
    }
    queue_names = _created_queue_names(entries)
    assert {
        r["name"] for r in transients if r["class_name"] == "queue"
    } == {queue_names[k] for k in want if k in queue_names}  # fmt: skip
    assert all(r["broker"] == agents[r["agent"]] for r in transients)

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
    want_classes = [[c, by_class[c], by_class[c], deleted[c], lost[c]] for c in sorted(by_class)]
    assert run.values["spark_by_class"] == want_classes
    assert run.values["spark_agrees"] is True

    # One bar per queue object, labelled by its name and broker; the transient ones red.
    fig = run.figures["object_lifecycles"]
    assert fig["axes"][0]["patches"] == len(queue_names)
    assert fig["axes"][0]["red"] == sum(1 for k in want if k in queue_names)
    assert Counter(fig["ticks"]) == Counter(
        f"{name} ({agents[agent]})" for (agent, _), name in queue_names.items()
    )
    assert any(t.startswith("tmp.") for t in fig["ticks"])
    assert run.figures["object_churn"]["legend"] == sorted(by_class)


@pytest.mark.spark
def test_health_notebook(sim_lake: Lake, kernel: Any, tmp_path: Path) -> None:
    run = run_notebook(
        kernel,
        "health",
        sim_lake.root,
        tmp_path / "figs",
        {
            "events_by_severity": "events_by_severity",
            "spark_events_by_severity": "spark_events_by_severity",
            "spark_agrees": "spark_agrees",
            "events_by_name": "dict(events_by_name.select('event_name', 'len').iter_rows())",
            "heartbeat_summary": "_frame(heartbeat_summary)",
            "restarts": "_frame(restarts)",
            "agent_status": "_frame(agent_status)",
            "agents": "agents",
            "alerts": "_frame(alerts.select('broker', 'event_name', 'severity_name', 'object'))",
        },
    )
    check_figures(run, tmp_path / "figs", {"events_timeline", "agent_health"})
    agents: dict[str, str] = run.values["agents"]
    check_agent_labels(agents, sim_lake)
    entries = _manifest(sim_lake)
    events = [e for e in entries if e["kind"] == "event"]
    # Alert-worthy: severity warn (4) or worse, each with its agent's broker and its queue
    # (this lake's are info events only: none; tests/test_metrics.py has a stalled queue's).
    worthy = [e for e in events if e["severity"] <= SEVERITIES.index("warn")]
    assert sorted(tuple(r.values()) for r in run.values["alerts"]) == sorted(
        (agents[e["agent"]], e["class_name"], SEVERITIES[e["severity"]], e["values"]["qName"])
        for e in worthy
    )
    by_severity = Counter(SEVERITIES[e["severity"]] for e in events)
    assert run.values["events_by_severity"] == dict(by_severity)
    assert run.values["spark_events_by_severity"] == dict(by_severity)
    assert run.values["spark_agrees"] is True
    by_name = Counter(e["class_name"] for e in events)
    assert run.values["events_by_name"] == dict(by_name)
    # Every event is a point of the timeline, on the row of its name.
    timeline = run.figures["events_timeline"]
    assert sum(timeline["axes"][0]["points"]) == len(events)
    assert timeline["ticks"] == sorted(by_name)

    # Heartbeats per agent, first and last.
    beats: dict[str, list[int]] = defaultdict(list)
    for e in entries:
        if e["kind"] == "heartbeat":
            beats[e["agent"]].append(e["timestamp_ns"])
    summary = {
        r["agent"]: (r["heartbeats"], r["first"], r["last"], r["max_gap_s"], r["broker"])
        for r in run.values["heartbeat_summary"]
    }
    assert summary == {
        a: (len(ts), min(ts) // 1000, max(ts) // 1000, 1.0, agents[a]) for a, ts in beats.items()
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
        want.append((r["agent"], r["boot_seq"], first // 1000, "objects", agents[r["agent"]]))
    got = [
        (r["agent"], r["generation"], r["seen_at"], r["source"], r["broker"])
        for r in run.values["restarts"]
    ]
    assert got == want and len(want) == 1
    status = {
        r["agent"]: (r["state_now"], r["heartbeats"], r["restarts"], r["broker"])
        for r in run.values["agent_status"]
    }
    assert status == {
        a: ("up", len(ts), sum(1 for w in want if w[0] == a), agents[a]) for a, ts in beats.items()
    }
    # One row per agent in the health plot, named by its broker.
    assert run.figures["agent_health"]["ticks"] == [agents[a] for a in sorted(beats)]


@pytest.mark.spark
def test_spark_sql_notebook(sim_lake: Lake, kernel: Any, tmp_path: Path) -> None:
    """Spark SQL by path over gold (delta-spark), history and time travel, checked against
    the tables as delta-rs reads them."""
    from deltalake import DeltaTable

    run = run_notebook(
        kernel,
        "spark_sql",
        sim_lake.root,
        tmp_path / "figs",
        {
            "per_class": "_frame(per_class)",
            "top": "_frame(top_enqueued)",
            "states": "_frame(states)",
            "versions": "history['version'].tolist()",
            "operations": "history['operation'].tolist()",
            "metadata": "history['userMetadata'].tolist()",
            "previous": "previous",
            "rows_before": "rows_before",
            "rows_now": "rows_now",
        },
    )
    check_figures(run, tmp_path / "figs", {"spark_top_queues"})
    v = run.values
    rates = delta.read_arrow(sim_lake.gold / "statistic_rates").to_pylist()

    # Counters per class: intervals, the sum of deltas, the resets.
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rates:
        if r["kind"] == "counter":
            groups[(r["class_name"], r["statistic"])].append(r)
    assert [(row[0], row[1], row[2], row[4]) for row in v["per_class"]] == [
        (c, s, len(rs), sum(r["reset"] is not None for r in rs)) for (c, s), rs in sorted(groups.items())
    ]
    for row, (_key, rs) in zip(v["per_class"], sorted(groups.items()), strict=True):
        deltas = [r["delta"] for r in rs if r["delta"] is not None]
        assert row[3] == (pytest.approx(sum(deltas), rel=1e-12) if deltas else None)

    # The busiest queues: deltas by name, one agent per broker (V2 first).
    state = delta.read_arrow(sim_lake.gold / "lifecycle_state").to_pylist()
    named = {(r["agent"], r["object_id"]): (r["broker"], r["name"]) for r in state}
    per_agent: dict[tuple[str | None, str | None, str], list[Any]] = {}
    for r in rates:
        key = (r["agent"], r["object_id"])
        if r["class_name"] != "queue" or r["statistic"] != "msgTotalEnqueues" or key not in named:
            continue
        broker, name = named[key]
        acc = per_agent.setdefault((broker, name, r["agent"]), [0.0, False, False])
        if r["delta"] is not None:
            acc[0] += r["delta"]
            acc[2] = True
        acc[1] = acc[1] or r["dialect"] == "V2"
    picked: dict[tuple[str, str | None], tuple[str, float | None]] = {}
    for (broker, name, agent), (total, _v2, any_delta) in sorted(
        per_agent.items(), key=lambda kv: (not kv[1][1], kv[0][2])
    ):
        picked.setdefault((broker or agent, name), (agent, total if any_delta else None))
    expected = sorted(
        ((name, agent, total) for (_b, name), (agent, total) in picked.items()),
        key=lambda e: (-(e[2] or 0), e[0], e[1]),
    )[:10]
    assert [(q, a) for q, a, _ in v["top"]] == [(q, a) for q, a, _ in expected]
    assert [t for _, _, t in v["top"]] == [pytest.approx(t, rel=1e-12) for _, _, t in expected]
    assert len(v["top"]) == 10

    # Objects by class and state, from the folded table.
    objects = Counter(
        (r["class_name"], r["state"])
        for r in delta.read_arrow(sim_lake.gold / "object_lifecycles").to_pylist()
    )
    assert v["states"] == [[c, s, n] for (c, s), n in sorted(objects.items())]

    # History: every version delta-rs sees; time travel reads what delta-rs reads there.
    path = sim_lake.gold / "statistic_rates"
    versions = sorted(h["version"] for h in DeltaTable(str(path)).history())
    assert v["versions"] == versions
    assert v["operations"][0] == "CREATE TABLE" and set(v["operations"][1:]) == {"WRITE"}
    assert all(m.startswith("qmf.operation=") and ";qmf.batch_id=" in m for m in v["metadata"][1:])
    assert v["previous"] == versions[-2]
    assert v["rows_before"] == delta.read_arrow(path, version=versions[-2]).num_rows
    assert v["rows_now"] == len(rates) > v["rows_before"]


@pytest.mark.spark
def test_notebooks_run_on_empty_tables(sim_lake: Lake, kernel: Any, tmp_path: Path) -> None:
    """Right after ``qmf run`` starts the tables exist but hold nothing: no cell fails,
    the results are empty, every figure is still shown and saved."""

    empty = tmp_path / "empty"
    tables = [sim_lake.bronze, *sorted(sim_lake.silver.iterdir()), *sorted(sim_lake.gold.iterdir())]
    for path in tables:
        dt = snapshot.load(path)
        dest = empty / path.relative_to(sim_lake.root)
        delta.create_table(dest, delta.table_schema(dt), delta.partition_columns(dt))
    probes = {
        "bronze": {"rows": "bronze.height", "problems": "problems"},
        "queues": {"top": "top_queues.height", "agrees": "spark_agrees", "agents": "agents"},
        "lifecycles": {"transients": "transients.height", "agrees": "spark_agrees"},
        "health": {
            "events": "events_by_severity",
            "restarts": "restarts.height",
            "agrees": "spark_agrees",
        },
        "spark_sql": {
            "top": "len(top_enqueued)",
            "classes": "len(per_class)",
            "states": "len(states)",
            "versions": "len(history)",
            "rows": "[rows_before, rows_now]",
        },
    }
    figures = {
        "bronze": {"bronze_messages"},
        "queues": {"queue_throughput", "queue_depth"},
        "lifecycles": {"object_churn", "object_lifecycles"},
        "health": {"events_timeline", "agent_health"},
        "spark_sql": {"spark_top_queues"},
    }
    results = {}
    for name, values in probes.items():
        run = run_notebook(kernel, name, empty, tmp_path / name, values)
        assert set(run.figures) == figures[name]
        assert len(run.images) == len(figures[name])
        assert all(Path(str(p)).read_bytes().startswith(PNG) for p in run.saved.values())
        results[name] = run.values
    assert results["bronze"] == {"rows": 0, "problems": 0}
    assert results["queues"] == {"top": 0, "agrees": True, "agents": {}}
    assert results["lifecycles"] == {"transients": 0, "agrees": True}
    assert results["health"] == {"events": {}, "restarts": 0, "agrees": True}
    assert results["spark_sql"] == {"top": 0, "classes": 0, "states": 0, "versions": 1, "rows": [0, 0]}


@pytest.fixture(scope="module")
def qpidd_lake(shared_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Lake:
    """silver and gold of real qpidd 1.40 traffic (QMF v1 and v2 at once: two agents of one
    broker; queues q-rate-5/20/50, transient queues tq-1..5), built without Spark."""
    from tests.live_lake import QPIDD_SAMPLE, build

    root = tmp_path_factory.mktemp("qpidd-lake")
    build(Path(shared_dir) / QPIDD_SAMPLE, root, 4)
    return Lake(root=root, manifest=root / "none.jsonl")


@pytest.mark.spark
def test_notebooks_name_qpidd_queues_as_qpid_stat_does(
    qpidd_lake: Lake, kernel: Any, tmp_path: Path
) -> None:
    """On real qpidd traffic the plots say q-rate-50 and the broker's name, each queue once
    (from the V2 agent) although qpidd publishes it through both its agents."""
    brokers = _brokers(qpidd_lake)
    dialects = {r["agent"]: r["dialect"] for r in _latest_lifecycles(qpidd_lake).values()}
    assert sorted(dialects.values()) == ["AM2", "V2"]
    (broker,) = set(brokers.values())
    assert broker.startswith("amqp-broker@")  # the broker object's name, then host:port
    want_agents = {a: f"{broker} ({d})" for a, d in dialects.items()}
    (v2,) = (a for a, d in dialects.items() if d == "V2")

    queues = run_notebook(
        kernel, "queues", qpidd_lake.root, tmp_path / "queues",
        {"top": "_frame(top_queues)", "agents": "agents"},
    )  # fmt: skip
    check_figures(queues, tmp_path / "queues", {"queue_throughput", "queue_depth"})
    assert queues.values["agents"] == want_agents
    top = queues.values["top"]
    # First the capture's own console reply queue: 95 replies in the 1.3 s after its
    # creation (72 msg/s), counted from the creation since issue 47; then the load.
    assert top[0]["queue"].startswith("qmf-receiver-") and top[0]["rated_intervals"] == 1
    assert [t["queue"] for t in top][1:3] == ["q-rate-50", "q-rate-20"]
    # Then the console's two subscription queues (7.1 and 7.0 msg/s): q-rate-5 is sixth.
    assert [t["queue"].rsplit("-", 1)[-1] for t in top][3:] == ["qpid.management", "qmf.default.topic"]
    assert len({t["queue"] for t in top}) == len(top) == 5
    assert {t["agent"] for t in top} == {v2}
    names = _names(qpidd_lake)
    for t in top:
        rated = [
            r["rate"] for r in delta.read_arrow(qpidd_lake.gold / "statistic_rates").to_pylist()
            if r["agent"] == v2 and r["statistic"] == "msgTotalEnqueues"
            and names[(r["agent"], r["object_id"])] == t["queue"] and r["rate"] is not None
        ]  # fmt: skip
        assert t["mean_enqueue_rate"] == pytest.approx(sum(rated) / len(rated), rel=1e-12)
    legend = [f"{t['queue']} ({broker} (V2))" for t in top]
    assert queues.figures["queue_throughput"]["legend"] == legend
    # The reply queue was sampled once: its depth has no interval, no line.
    assert queues.figures["queue_depth"]["legend"] == legend[1:]

    life = run_notebook(
        kernel, "lifecycles", qpidd_lake.root, tmp_path / "life",
        {"bucket_ms": "bucket_ms", "agents": "agents"},
    )  # fmt: skip
    check_figures(life, tmp_path / "life", {"object_churn", "object_lifecycles"})
    assert life.values["bucket_ms"] == 2000  # qpidd ran with --mgmt-pub-interval 2
    ticks = life.figures["object_lifecycles"]["ticks"]
    # One bar per queue (object_lifecycles folds qpidd's v1 and v2 agents), named by
    # the broker alone: no other agent of it is left to tell apart.
    named = [f"{q} ({broker})" for q in ("q-rate-5", "q-rate-20", "q-rate-50")]
    named += [f"tq-{i} ({broker})" for i in range(1, 6)]
    assert Counter(t for t in ticks if t in named) == Counter(named)
    v2_queues = [k for k, r in _latest_lifecycles(qpidd_lake).items()
                 if k[0] == v2 and r["class_name"] == "queue"]  # fmt: skip
    assert len(ticks) == len(v2_queues) and all(t.endswith(f"({broker})") for t in ticks)

    health = run_notebook(
        kernel, "health", qpidd_lake.root, tmp_path / "health",
        {"beats": "dict(heartbeat_summary.select('agent', 'heartbeats').iter_rows())"},
    )  # fmt: skip
    check_figures(health, tmp_path / "health", {"events_timeline", "agent_health"})
    liveness: Counter[str] = Counter()
    for r in delta.read_arrow(qpidd_lake.gold / "agent_liveness").to_pylist():
        liveness[r["agent"]] += r["heartbeats"]
    assert health.values["beats"] == dict(liveness)  # QMF v1's heartbeats count for "1.0"
    assert health.figures["agent_health"]["ticks"] == [want_agents[a] for a in sorted(dialects)]


# ---------------------------------------------------------------------------
# pipeline.views.notebook's naming helpers, on small frames (no kernel, no Spark).


def _life(rows: list[dict[str, Any]], columns: tuple[str, ...] = ()) -> pl.DataFrame:
    """Lifecycle rows with the columns the helpers read; ``columns`` adds name/broker."""
    base = {"agent": pl.String, "object_id": pl.String, "index_key": pl.String,
            "dialect": pl.String, "batch_id": pl.Int64, "last_seen_ns": pl.Int64}  # fmt: skip
    schema = {**base, **{c: pl.String for c in columns}}
    return pl.DataFrame(rows, schema=schema)


def test_object_names_take_the_latest_row_and_fall_back_to_the_index_key() -> None:
    from pipeline.views.notebook import object_names

    rows: list[dict[str, Any]] = [
        # renamed: the later batch's name wins, whatever the row order
        {"agent": "a", "object_id": "1", "index_key": '["v","old"]', "dialect": "V2",
         "batch_id": 2, "last_seen_ns": 5, "name": "vh/new"},
        {"agent": "a", "object_id": "1", "index_key": '["v","old"]', "dialect": "V2",
         "batch_id": 1, "last_seen_ns": 9, "name": "vh/old"},
        # no name resolved yet: the index key's last value
        {"agent": "a", "object_id": "2", "index_key": '["1-1-3","q00021"]', "dialect": "AM1",
         "batch_id": 1, "last_seen_ns": 1, "name": None},
        # no name, no index key: the object id
        {"agent": "b", "object_id": "3", "index_key": None, "dialect": "AM1",
         "batch_id": 1, "last_seen_ns": 1, "name": None},
    ]  # fmt: skip
    got = object_names(_life(rows, ("name",))).sort("agent", "object_id").rows()
    assert got == [("a", "1", "vh/new"), ("a", "2", "q00021"), ("b", "3", "3")]
    # A table from before gold carried names: no name column at all.
    old = _life([{k: v for k, v in r.items() if k != "name"} for r in rows])
    got = object_names(old).sort("agent", "object_id").rows()
    assert got == [("a", "1", "old"), ("a", "2", "q00021"), ("b", "3", "3")]


def test_with_names_joins_rates_on_agent_and_object_id() -> None:
    from pipeline.views.notebook import with_names

    names = pl.DataFrame(
        {"agent": ["a", "b"], "object_id": ["1", "1"], "name": ["q-rate-50", "vh/q-b"]}
    )
    rates = pl.DataFrame(
        {
            "agent": ["a", "b", "a", "c"],
            "object_id": ["1", "1", "9", "7"],
            "index_key": ['["0-0-1-0-3","q-rate-50"]', None, '["x","q-new"]', None],
            "rate": [1.0, 2.0, 3.0, 4.0],
        }
    )
    got = with_names(rates, names, "queue").select("agent", "object_id", "queue", "rate").rows()
    assert got == [
        ("a", "1", "q-rate-50", 1.0),
        ("b", "1", "vh/q-b", 2.0),
        ("a", "9", "q-new", 3.0),  # no lifecycle yet: its own index key
        ("c", "7", "7", 4.0),
    ]


def test_agent_labels_name_agents_by_broker_and_tell_them_apart() -> None:
    from pipeline.views.notebook import agent_labels

    def row(agent: str, dialect: str, broker: str | None, batch: int) -> dict[str, Any]:
        return {"agent": agent, "object_id": f"{agent}-{batch}", "index_key": None,
                "dialect": dialect, "batch_id": batch, "last_seen_ns": 0, "broker": broker}  # fmt: skip

    life = _life(
        [
            # one broker, two agents (AM2 and V2); the V2 agent's first rows fell back to its id
            row("am2-agent", "AM2", "amqp-broker@vm:25672", 1),
            row("v2-agent-0001", "V2", "v2-agent-0001", 1),
            row("v2-agent-0001", "V2", "amqp-broker@vm:25672", 2),
            row("v2-agent-0001", "V2", None, 3),
            # two AM1 agents whose brokers read the same
            row("11111111-aaaa", "AM1", "twin@sim-host:5672", 1),
            row("22222222-bbbb", "AM1", "twin@sim-host:5672", 1),
            # a broker of its own; an agent that never showed its broker
            row("solo-agent", "AM1", "solo@host2:5672", 1),
            row("bare-agent", "AM1", None, 1),
        ],
        ("broker",),
    )
    assert agent_labels(life) == {
        "am2-agent": "amqp-broker@vm:25672 (AM2)",
        "v2-agent-0001": "amqp-broker@vm:25672 (V2)",
        "11111111-aaaa": "twin@sim-host:5672 [11111111]",
        "22222222-bbbb": "twin@sim-host:5672 [22222222]",
        "solo-agent": "solo@host2:5672",
        "bare-agent": "bare-agent",
    }
    # Before gold carried brokers: the agent ids.
    assert agent_labels(life.drop("broker")) == {a: a for a in life["agent"].unique()}


def test_one_agent_per_broker_keeps_the_v2_view_of_each_object() -> None:
    from pipeline.views.notebook import one_agent_per_broker

    def row(agent: str, dialect: str, broker: str | None) -> dict[str, Any]:
        return {"agent": agent, "object_id": "x", "index_key": None, "dialect": dialect,
                "batch_id": 1, "last_seen_ns": 0, "broker": broker}  # fmt: skip

    life = _life(
        [
            row("1.0", "AM2", "qpidd@vm:5672"),
            row("apache.org:qpidd:1", "V2", "qpidd@vm:5672"),
            row("b-am2", "AM2", "other@host:5672"),
            row("c-am1", "AM1", "third@host:5672"),
            row("d-am1", "AM1", "third@host:5672"),
        ],
        ("broker",),
    )
    rates = pl.DataFrame(
        {
            "agent": ["1.0", "apache.org:qpidd:1", "1.0", "b-am2", "d-am1", "c-am1", "c-am1",
                      "unknown"],
            "queue": ["q-rate-50", "q-rate-50", "only-v1", "q-rate-50", "q1", "q1", "q1", "q9"],
            "rate": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
        }
    )  # fmt: skip
    got = one_agent_per_broker(rates, life, ["queue"]).rows()
    assert got == [
        ("apache.org:qpidd:1", "q-rate-50", 2.0),  # V2 over AM2 of the same broker
        ("1.0", "only-v1", 3.0),  # only the v1 agent has it
        ("b-am2", "q-rate-50", 4.0),  # another broker: its own view
        ("c-am1", "q1", 6.0),  # same broker and dialect: the lowest agent id, every row
        ("c-am1", "q1", 7.0),
        ("unknown", "q9", 8.0),  # an agent without lifecycles stands alone
    ]


def test_heartbeat_agent_names_qmf_v1_heartbeats_as_gold_does() -> None:
    from pipeline.views.notebook import heartbeat_agent

    beats = pl.DataFrame(
        {"agent": [None, "apache.org:qpidd:1", None, "sim-agent"],
         "dialect": ["AM2", "V2", "V2", "AM1"]}
    )  # fmt: skip
    got = beats.select(heartbeat_agent())["agent"].to_list()
    assert got == ["1.0", "apache.org:qpidd:1", None, "sim-agent"]


def test_figure_labels_read_titles_legends_and_categorical_ticks() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipeline.views.notebook import figure_labels, label

    fig, (top, bottom) = plt.subplots(2, 1)
    try:
        top.plot([0, 1], [2, 3], label=label("q-rate-50", "agent-1", {"agent-1": "broker@vm"}))
        top.plot([0, 1], [1, 1], label="_hidden")
        top.legend()
        top.set_title("Top queues")
        bottom.barh([0, 1], [1, 2])
        bottom.set_yticks([0, 1])
        bottom.set_yticklabels(["q00001 (b1)", "tmp.000008 (b1)"])
        fig.canvas.draw()  # numeric tick labels get their texts: they must stay out
        assert figure_labels(fig) == {
            "titles": ["Top queues"],
            "legend": ["q-rate-50 (broker@vm)"],
            "ticks": ["q00001 (b1)", "tmp.000008 (b1)"],
        }
    finally:
        plt.close(fig)


def test_object_names_from_index_keys() -> None:
    assert last_index_value('["1-1-3","q00001"]') == "q00001"
    assert last_index_value('["host",5672]') == "5672"
    assert last_index_value('["x",{"k":1}]') == '{"k": 1}'
    assert last_index_value(None) is None
    assert last_index_value("not json") == "not json"
