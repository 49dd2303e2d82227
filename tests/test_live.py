"""``qmf top`` and ``qmf serve-metrics`` show what the gold table holds, on a lake and on a
running pipeline (``qmf run``)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, write_deltalake

from pipeline.cli import main
from pipeline.commands.metrics import Selection
from pipeline.commands.top import format_rate
from pipeline.gold import GoldBatchWriter
from pipeline.lake import delta
from pipeline.lake.retention import MARK as RETENTION_MARK
from pipeline.views.live import LiveView
from tests.lake import Lake, copy_lake
from tests.live_lake import HEALTH, QPIDD_SAMPLE, build, metrics_server

Queue = tuple[str, str]  # (broker, queue name)
SERIES = ("agent", "package", "class_name", "series", "statistic")
STATS = ("msgTotalEnqueues", "msgTotalDequeues", "msgDepth", "consumerCount")


# ------------------------------------------------------------------ expectations from gold


def object_names(root: Path) -> dict[tuple[str, str], tuple[str, str]]:
    """(agent, object_id) -> (broker, name) of its latest gold lifecycle row."""
    rows = delta.read_arrow(str(root / "gold" / "lifecycle_state")).to_pylist()
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        k = (r["agent"], r["object_id"])
        if k not in latest or (r["batch_id"], r["last_seen_ns"]) > (
            latest[k]["batch_id"], latest[k]["last_seen_ns"]
        ):
            latest[k] = r
    return {k: (r["broker"], r["name"]) for k, r in latest.items()}


Quiet = Callable[[str, int], bool]  # (agent, end_ns) -> is a counter ending then quiet


def view_quiet(root: Path) -> Quiet:
    """The quiet rule with the publish cycles and last sightings a view reads from the lake
    (the rule itself is tested on hand-made rows below)."""
    from pipeline.views.live import QUIET_CYCLES

    view = LiveView(root, max_events=0)
    view.refresh()
    agents = view.agents()
    return lambda a, end: a in agents and agents[a][1] > 0 and (
        agents[a][0] - end > int(QUIET_CYCLES * agents[a][1]))  # fmt: skip


def gold_queues(
    root: Path,
    version: int | None = None,
    ended: set[tuple[str, str]] | None = None,
    state_version: int | None = None,
    quiet: Quiet | None = None,
) -> dict[Queue, dict[str, Any]]:
    """Per queue series of gold's ``rate_state`` (at ``state_version``), from the gold
    tables (rates at ``version``) by gold's own series key: each statistic's last rates row
    (greatest end_ns) when it ends at or after the series' baseline (the state's earliest
    sample), else the baseline (a gauge's value; a counter's rate unknown: None). Counters
    ``quiet`` says are quiet read 0. The object id is the newest row's, the key the broker
    and name gold's lifecycles give that object; objects in ``ended`` are left out."""
    from pipeline.gold.transforms import series_key

    keys = ["agent", "package", "class_name", "series", "statistic"]
    queue = (pl.col("class_name") == "queue") & pl.col("statistic").is_in(list(STATS))
    rates = pl.from_arrow(delta.read_arrow(str(root / "gold" / "statistic_rates"), version))
    state = pl.from_arrow(delta.read_arrow(str(root / "gold" / "rate_state"), state_version))
    assert isinstance(rates, pl.DataFrame) and isinstance(state, pl.DataFrame)
    rates = rates.filter(queue & pl.col("index_key").is_not_null()).with_columns(series=series_key())
    last = rates.sort("end_ns").group_by(keys).last()
    base = state.filter(queue).sort("update_ns").group_by(keys).first()
    names = object_names(root)
    series: dict[tuple[str, str], dict[str, tuple[int, str, float | None]]] = {}
    for r in base.join(last, on=keys, how="left", suffix="_row").iter_rows(named=True):
        counter = r["kind"] == "counter"
        if r["end_ns"] is not None and r["end_ns"] >= r["update_ns"]:
            end, oid, value = r["end_ns"], r["object_id_row"], r["rate"] if counter else r["value_row"]
        else:
            end, oid, value = r["update_ns"], r["object_id"], None if counter else r["value"]
        if counter and quiet is not None and quiet(r["agent"], end):
            value = 0.0
        series.setdefault((r["agent"], r["series"]), {})[r["statistic"]] = (end, oid, value)
    out: dict[Queue, dict[str, Any]] = {}
    for (agent, _series), stats in series.items():
        _end, oid, _value = max(stats.values(), key=lambda e: e[0])
        if (agent, oid) in (ended or set()):
            continue
        key = names[(agent, oid)]
        assert key not in out, f"two live series named {key}"
        out[key] = {"object_id": oid, **{stat: value for stat, (_e, _o, value) in stats.items()}}
    return out


def ended_objects(root: Path) -> set[tuple[str, str]]:
    rows = delta.read_arrow(str(root / "gold" / "lifecycle_state")).to_pylist()
    live = {(r["agent"], r["object_id"]) for r in rows if r["state"] == "live"}
    return {(r["agent"], r["object_id"]) for r in rows if r["state"] != "live"} - live


def top_json(root: Path | str, *extra: str) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["top", "--once", "--json", "--data", str(root), *extra]) == 0
    data: dict[str, Any] = json.loads(out.getvalue())
    return data


def shown_queues(frame: dict[str, Any]) -> dict[Queue, dict[str, Any]]:
    """The queues of a ``qmf top --json`` frame, keyed and named as ``gold_queues``."""
    return {
        (q["broker"], q["name"]): {
            "object_id": q["object_id"],
            "msgTotalEnqueues": q["enqueue_rate"],
            "msgTotalDequeues": q["dequeue_rate"],
            "msgDepth": q["depth"],
            "consumerCount": q["consumers"],
        }
        for q in frame["queues"]
    }


def top_text(root: Path, *extra: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["top", "--once", "--data", str(root), *extra]) == 0
    return out.getvalue()


def text_rows(frame: str) -> dict[Queue, list[str]]:
    """The queue table of a ``qmf top`` frame: (broker, name) -> the shown columns."""
    lines = frame.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("BROKER"))
    assert lines[start].split() == [
        "BROKER", "QUEUE", "ENQ/S", "DEQ/S", "DEPTH", "CONSUMERS", "SAMPLE"
    ]  # fmt: skip
    out: dict[Queue, list[str]] = {}
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        broker, name, *cols = line.split()
        out[(broker, name)] = cols
    return out


# ------------------------------------------------------------------ exposition parser

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')


def _unescape(v: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), v)


def parse_exposition(text: str, openmetrics: bool) -> list[tuple[str, dict[str, str], float]]:
    """Samples of a text exposition, checking the format on the way: every sample belongs to
    the family last declared by # TYPE (declared once, with # HELP), families contiguous,
    no duplicate label sets, and ``# EOF`` last exactly when OpenMetrics."""
    assert text.endswith("\n")
    lines = text[:-1].split("\n")
    if openmetrics:
        assert lines[-1] == "# EOF" and lines.count("# EOF") == 1
        lines = lines[:-1]
    else:
        assert "# EOF" not in lines
    typed: dict[str, str] = {}
    helped: set[str] = set()
    current: str | None = None
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    out: list[tuple[str, dict[str, str], float]] = []
    for line in lines:
        if line.startswith("# HELP "):
            name = line.split(" ")[2]
            assert name not in helped
            helped.add(name)
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name not in typed and kind in ("gauge", "counter")
            typed[name] = kind
            current = name
        else:
            m = _SAMPLE.match(line)
            assert m, line
            name, _, body, value = m.groups()
            # A counter's samples end in _total (OpenMetrics declares the family without it).
            family = name.removesuffix("_total") if current not in (None, name) else name
            assert family == current and family in helped, line
            assert family == name or typed[family] == "counter", line
            labels: dict[str, str] = {}
            if body:
                pairs = _LABEL.findall(body)
                assert ",".join(f'{k}="{v}"' for k, v, _ in pairs) == body, line
                labels = {k: _unescape(v) for k, v, _ in pairs}
            key = (name, tuple(sorted(labels.items())))
            assert key not in seen, line
            seen.add(key)
            out.append((name, labels, float(value)))
    return out


def scrape(url: str, openmetrics: bool) -> tuple[str, str]:
    accept = "application/openmetrics-text; version=1.0.0" if openmetrics else "text/plain"
    req = urllib.request.Request(url, headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.headers["Content-Type"], resp.read().decode("utf-8")


OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=underscores"
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"


def exposed_queues(
    parsed: list[tuple[str, dict[str, str], float]],
) -> dict[Queue, dict[str, Any]]:
    out: dict[Queue, dict[str, Any]] = {}
    for name, labels, value in parsed:
        if labels.get("class") != "queue" or labels.get("statistic") not in STATS:
            continue
        q = out.setdefault((labels["broker"], labels["name"]), {})
        counter = labels["statistic"] in ("msgTotalEnqueues", "msgTotalDequeues")
        assert name == ("qmf_statistic_rate_per_second" if counter else "qmf_statistic_value")
        q[labels["statistic"]] = value
    return out


# ------------------------------------------------------------------ on the simulated lake


def _expected_now(root: Path) -> dict[Queue, dict[str, Any]]:
    return gold_queues(root, ended=ended_objects(root), quiet=view_quiet(root))


@pytest.mark.spark
def test_top_shows_the_last_gold_rate_depth_and_consumers(sim_lake: Lake) -> None:
    expected = _expected_now(sim_lake.root)
    assert len(expected) >= 10  # 2 agents x 6 queues, less a queue re-made by the restart
    got = top_json(sim_lake.root, "--limit", "100")
    assert got["rates_version"] == DeltaTable(str(sim_lake.gold / "statistic_rates")).version()
    shown = shown_queues(got)
    assert shown == expected
    rates = [q["enqueue_rate"] for q in got["queues"]]
    assert rates == sorted(rates, reverse=True) and rates[0] > 0  # busiest first
    busiest = max(expected.values(), key=lambda q: q["msgTotalEnqueues"])
    assert got["queues"][0]["enqueue_rate"] == busiest["msgTotalEnqueues"]

    # The console frame shows the same numbers.
    frame = top_text(sim_lake.root, "--limit", "100", "--sort", "depth")
    table = text_rows(frame)
    assert len(table) == len(expected)
    for key, q in expected.items():
        cols = table[key]
        assert cols[0] == format_rate(q["msgTotalEnqueues"])
        assert cols[1] == format_rate(q["msgTotalDequeues"])
        assert cols[2] == f"{q['msgDepth']:,.0f}"
        assert cols[3] == f"{q['consumerCount']:,.0f}"
    depths = [float(c[2].replace(",", "")) for c in table.values()]
    assert depths == sorted(depths, reverse=True)
    # Latest events: the newest of silver events first.
    events = delta.read_arrow(str(sim_lake.silver / "events")).sort_by(
        [("timestamp_ns", "descending")]
    )
    newest = events.slice(0, 1).to_pylist()[0]
    assert got["events"][0]["timestamp_ns"] == newest["timestamp_ns"]
    assert newest["event_name"] in frame.split("LATEST EVENTS")[1].splitlines()[1]


def _without_ids(queues: dict[Queue, dict[str, Any]]) -> dict[Queue, dict[str, Any]]:
    """What the metrics expose of ``gold_queues``: not the object id (not a label), not a
    value that is not known (a counter's rate before its interval)."""
    return {
        k: {s: v for s, v in q.items() if s != "object_id" and v is not None}
        for k, q in queues.items()
    }


@pytest.mark.spark
def test_metrics_endpoint_exposes_the_last_gold_rate_and_depth(sim_lake: Lake) -> None:
    expected = _expected_now(sim_lake.root)
    version = DeltaTable(str(sim_lake.gold / "statistic_rates")).version()
    with metrics_server(sim_lake.root) as base:
        ctype, om = scrape(base + "/metrics", openmetrics=True)
        assert ctype == OPENMETRICS
        ptype, prom = scrape(base + "/metrics", openmetrics=False)
        assert ptype == PROMETHEUS
        _, everything = scrape(base + "/metrics/all", openmetrics=True)
        with urllib.request.urlopen(base + "/healthz", timeout=30) as resp:
            assert resp.read().decode() == f"ok gold_statistic_rates_version={version}\n"
    parsed = parse_exposition(om, openmetrics=True)
    assert parse_exposition(prom, openmetrics=False) == parsed
    assert exposed_queues(parsed) == _without_ids(expected)
    assert ("qmf_live_rates_version", {}, float(version)) in parsed
    # (qmf_events_total has no samples: events read on the first read are history)
    assert {n for n, _, _ in parsed} == {
        "qmf_statistic_rate_per_second", "qmf_statistic_value", "qmf_objects",
        "qmf_live_rates_version", "qmf_live_state_version", *HEALTH,
    } - {"qmf_events_total", "qmf_receiver_connected"}  # fmt: skip
    health = [x for x in parsed if x[0] in HEALTH]
    assert health == [x for x in parse_exposition(everything, openmetrics=True) if x[0] in HEALTH]
    parsed = [x for x in parsed if x[0] not in HEALTH]
    # The default: queues' four statistics, every broker statistic, object counts.
    view = LiveView(sim_lake.root)
    view.refresh()
    current = view.current().to_pylist()
    exposed = [c for c in current if (c["rate"] if c["kind"] == "counter" else c["value"]) is not None]
    default = [c for c in exposed if c["class_name"] == "broker" or (
        c["class_name"] == "queue" and c["statistic"] in STATS)]  # fmt: skip
    objects = [labels for n, labels, _ in parsed if n == "qmf_objects"]
    assert len(parsed) == len(default) + len(objects) + 2  # + the two versions
    # /metrics/all: every current counter with a rate, every other statistic with a value.
    full = [x for x in parse_exposition(everything, openmetrics=True) if x[0] not in HEALTH]
    assert len(full) == len(exposed) + len(objects) + 2
    assert {(lab["broker"], lab["name"], lab["statistic"]) for n, lab, _ in full if "statistic" in lab} \
        == {(c["broker"], c["name"], c["statistic"]) for c in exposed}  # fmt: skip


def test_label_values_are_escaped() -> None:
    """A name with a quote, a backslash and a newline survives both formats."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import choose_encoder

    from pipeline.commands.metrics import LABELS, metric_families

    odd = 'we"ird\\queue\nname'
    rows = pl.DataFrame({
        "broker": ["b@h:1"] * 2, "class_name": ["queue"] * 2, "name": [odd] * 2,
        "statistic": ["msgTotalEnqueues", "msgDepth"], "kind": ["counter", "gauge"],
        "agent": ["a1"] * 2, "object_id": ["1-1-1"] * 2, "ambiguous": [False] * 2,
        "value": [10.0, 3.0], "rate": [2.5, None],
    })  # fmt: skip

    class Fixed:
        def collect(self) -> Any:
            return metric_families(rows, None, None)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed())
    for accept, om in (("application/openmetrics-text; version=1.0.0", True), ("", False)):
        encoder, _ = choose_encoder(accept)
        text = encoder(registry).decode()
        assert 'name="we\\"ird\\\\queue\\nname"' in text
        parsed = parse_exposition(text, openmetrics=om)
        assert [(n, tuple(lab), lab["name"], v) for n, lab, v in parsed] == [
            ("qmf_statistic_rate_per_second", LABELS, odd, 2.5),
            ("qmf_statistic_value", LABELS, odd, 3.0),
        ]


@pytest.mark.spark
def test_view_reads_only_what_the_table_gained(sim_lake: Lake, tmp_path: Path) -> None:
    """An append is read as its new file alone; a rewrite of the table is read whole."""
    lake = copy_lake(sim_lake, tmp_path / "lake")
    path = str(lake.gold / "statistic_rates")
    view = LiveView(lake.root)
    view.refresh()
    first = view.rates_version
    assert not view.refresh()  # nothing new
    table = delta.read_arrow(path)
    busiest = max(
        (r for r in table.to_pylist() if r["class_name"] == "queue"
         and r["statistic"] == "msgTotalEnqueues" and r["rate"] is not None),
        key=lambda r: (r["end_ns"], r["rate"]),
    )  # fmt: skip
    newer = dict(busiest, start_ns=busiest["end_ns"], end_ns=busiest["end_ns"] + 10**9,
                 value=busiest["value"] + 1234, delta=1234.0, rate=1234.0, batch_id=99)  # fmt: skip
    write_deltalake(path, pa.Table.from_pylist([newer], table.schema), mode="append")
    change = view.rates_tail.read()
    assert change is not None and not change.reset and change.rows.num_rows == 1
    view = LiveView(lake.root)
    view.refresh()
    write_deltalake(path, pa.Table.from_pylist([dict(newer, end_ns=newer["end_ns"] + 10**9,
                    rate=777.0)], table.schema), mode="append")  # fmt: skip
    assert view.refresh()
    name = json.loads(busiest["index_key"])[-1]
    row = next(q for q in view.queues() if (q.agent, q.name) == (busiest["agent"], name))
    assert row.enqueue_rate == 777.0 and view.queues()[0] == row
    assert view.rates_version == first + 2  # type: ignore[operator]
    now = gold_queues(lake.root, ended=ended_objects(lake.root), quiet=view_quiet(lake.root))
    assert now[object_names(lake.root)[(busiest["agent"], busiest["object_id"])]]["msgTotalEnqueues"] == 777.0
    # A retention DELETE (rows past their keep gone, the rest rewritten): skipped, as the
    # jobs' streams skip it; the view keeps what it read, nothing is read again.
    gone = DeltaTable(path).delete(
        f"end_ns < {busiest['end_ns']}",
        commit_properties=CommitProperties(custom_metadata={"userMetadata": RETENTION_MARK}),
    )
    assert gone["num_deleted_rows"] > 0
    change = view.rates_tail.read()
    assert change is not None and change.version == first + 3  # type: ignore[operator]
    assert not change.reset and change.rows.num_rows == 0
    # A rewrite (data removed): the tail reads the table whole and the view is rebuilt.
    write_deltalake(path, table, mode="overwrite")
    assert view.refresh()
    row = next(q for q in view.queues() if (q.agent, q.name) == (busiest["agent"], name))
    assert row.enqueue_rate == busiest["rate"]
    assert view.rates_version == first + 4  # type: ignore[operator]


# ------------------------------------------------------------------ the first read


class _NoStateWriter(GoldBatchWriter):
    """A gold writer stopped between a batch's table writes and its state commit."""

    def write_state(self, state: pa.Table, batch_id: int) -> bool:
        return False


def _views(root: Path) -> tuple[LiveView, LiveView]:
    """A view started from gold's state and one that read every rates file, refreshed."""
    fast, full = LiveView(root, max_events=0), LiveView(root, max_events=0, from_state=False)
    assert fast.refresh() and full.refresh()
    return fast, full


def _shown(view: LiveView) -> tuple[pl.DataFrame, list[Any], list[Any]]:
    """Everything the view shows: current rows, queues (top), every metric (/metrics/all).

    Not the interval of a row made from the state (its start, its reset: a quiet counter's
    rate is 0 and any other statistic's value the state's, whatever its interval was)."""
    from pipeline.commands.metrics import LiveCollector

    current = view.current_frame().drop("start_ns", "reset", "from_state")
    # Not the health families: an agent's measured cycle may come from the rows a view
    # holds (pipeline.views.live.LiveView.agents), which differ by design.
    health = {name.removesuffix("_total") for name in HEALTH}
    everything = [m for m in LiveCollector(view, Selection.parse("/metrics/all", "")).collect()
                  if m.name not in health]  # fmt: skip
    return current.sort(current.columns, nulls_last=True), view.queues(), everything


def _assert_same(fast: LiveView, full: LiveView) -> None:
    (c1, q1, m1), (c2, q2, m2) = _shown(fast), _shown(full)
    assert c1.equals(c2, null_equal=True)
    # A counter that is not quiet has its interval's row whenever there is one.
    made = [
        set(v.current_frame().filter(
            pl.col("from_state") & (pl.col("kind") == "counter") & ~pl.col("quiet")
        ).select(*SERIES, "end_ns").iter_rows())
        for v in (fast, full)
    ]  # fmt: skip
    assert made[0] == made[1]
    assert q1 == q2 and m1 == m2
    assert c1.height > 500 and sum(len(m.samples) for m in m1) > 300  # not trivially equal
    assert {"q-rate-5", "q-rate-20", "q-rate-50"} <= {q.name for q in q1}


def test_the_first_read_starts_from_gold_state_and_shows_what_reading_everything_shows(
    shared_dir: str, tmp_path: Path
) -> None:
    """On real qpidd traffic (AM2 and V2, queues and connections deleted) derived in 16 gold
    batches: a view started from ``rate_state`` reads a few of the rates files, shows the
    same rows, queues and metrics as one that read them all, and stays the same as gold
    goes on, also when gold stopped between a batch's rates and its state."""
    run = build(os.path.join(shared_dir, QPIDD_SAMPLE), tmp_path, batches=16, written=12)
    rates = tmp_path / "gold" / "statistic_rates"
    fast, full = _views(tmp_path)
    files = len(DeltaTable(str(rates)).file_uris())
    assert full.rates_tail.files_read == files == 11  # a batch with no interval adds no file
    assert fast.rates_tail.files_read == 1
    _assert_same(fast, full)

    # Gold goes on: both tails read the new commits and still agree.
    run.write(12)
    run.write(13)
    run.write(14, _NoStateWriter(run.settings, app_id="gold"))  # rates ahead of the state
    assert fast.refresh() and full.refresh()
    _assert_same(fast, full)
    # A view started now: the rates commit after the state's batch is read as well.
    _assert_same(*_views(tmp_path))
    run.write(14)  # the replay commits the state (the rates were: skipped)
    run.write(15)
    assert fast.refresh() and full.refresh()
    _assert_same(fast, full)
    fresh, _ = _views(tmp_path)
    _assert_same(fresh, full)
    assert (fresh.rates_tail.files_read, len(DeltaTable(str(rates)).file_uris())) == (1, 15)
    # Deleted objects with rates: their old rows were not read, and no view shows them.
    life = pl.from_arrow(delta.read_arrow(str(tmp_path / "gold" / "lifecycle_state")))
    all_rates = pl.from_arrow(delta.read_arrow(str(rates)))
    assert isinstance(life, pl.DataFrame) and isinstance(all_rates, pl.DataFrame)
    deleted = life.filter(pl.col("state") == "deleted").select("agent", "object_id")
    assert all_rates.join(deleted, on=["agent", "object_id"]).height > 0
    assert fresh.current_frame().join(deleted, on=["agent", "object_id"]).height == 0
    assert fresh.latest.num_rows < full.latest.num_rows


def test_a_rewrite_reads_from_the_state_again(shared_dir: str, tmp_path: Path) -> None:
    """A commit removing rows (a backfill's overwrite) rebuilds the view; the rows
    rewritten are the table's whole content, as the commit is newer than the state."""
    build(os.path.join(shared_dir, QPIDD_SAMPLE), tmp_path, batches=6)
    path = str(tmp_path / "gold" / "statistic_rates")
    fast, full = _views(tmp_path)
    _assert_same(fast, full)
    table = delta.read_arrow(path)
    write_deltalake(path, table, mode="overwrite")
    assert fast.refresh() and full.refresh()
    assert fast.rates_tail.files_read == 1
    _assert_same(fast, full)


def test_top_on_a_terminal_cuts_names_to_its_width_never_figures(
    shared_dir: str, tmp_path: Path
) -> None:
    """The terminal frame (rich, 100 columns) fits the width: long queue names end in an
    ellipsis, the figures are those of the plain frame, which cuts nothing."""
    from rich.console import Console

    from pipeline.commands.top import frame, render

    build(os.path.join(shared_dir, QPIDD_SAMPLE), tmp_path, batches=6)
    view = LiveView(tmp_path)
    view.refresh()
    out = io.StringIO()
    Console(file=out, width=100, color_system=None, force_terminal=True).print(
        render(view, 20, "enqueue", 2, width=100)
    )
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 100

    def table(text: str) -> list[list[str]]:
        rows = text.splitlines()
        start = next(i for i, line in enumerate(rows) if line.startswith("BROKER"))
        return [line.split() for line in rows[start + 1 : rows.index("", start)]]

    shown, plain = table(out.getvalue()), table(frame(view, 20, "enqueue", 2))
    assert len(shown) == len(plain) == 6
    for cut, full in zip(shown, plain, strict=True):  # the same order, the same figures
        assert cut[0] == full[0] and cut[2:] == full[2:], (cut, full)
        assert cut[1] == full[1] or (cut[1].endswith("…") and full[1].startswith(cut[1][:-1]))
    assert sum(row[1].endswith("…") for row in shown) == 3  # the receiver's long queue names
    assert ["amqp-broker@vm:25672", "q-rate-50"] in [row[:2] for row in shown]


# ------------------------------------------------------------------ on a running pipeline
# (tests/test_prometheus.py: qmf top and qmf serve-metrics follow a running qmf run, which
# Prometheus scrapes for its alerts)


def compare_at_version(
    data: Path, version: int, state_version: int, shown: dict[Queue, dict[str, Any]]
) -> int:
    """Each shown queue's numbers equal gold's at the versions the view read (a counter
    whose interval is not known yet: unknown, or 0 if quiet). Returns how many queues had
    an enqueue rate to compare."""
    expected = gold_queues(data, version, state_version=state_version)
    assert shown, "nothing shown"
    compared = 0
    for key, q in shown.items():
        want = dict(expected[key] if "object_id" in q else _without_ids(expected)[key])
        for stat in ("msgTotalEnqueues", "msgTotalDequeues"):
            if want.get(stat) is None and q.get(stat) == 0.0:
                want[stat] = 0.0  # made from the state, and quiet
        assert q == want, (key, q, want)
        compared += q.get("msgTotalEnqueues") is not None
    return compared


# ------------------------------------------------------------------ quiet objects


def test_a_counter_ages_to_zero_one_and_a_half_cycles_after_its_end() -> None:
    """Counters of an object its agent did not republish: 0 once the agent was seen more than
    1.5 publish cycles after the rate's end; gauges keep their value; other agents' rows and
    agents never seen since are left alone."""
    from pipeline.views.live import with_quiet

    end, cycle = 1_000 * 10**9, 2 * 10**9
    rows = pa.table({
        "agent": ["A", "A", "A", "B", "C"],
        "kind": ["counter", "counter", "gauge", "counter", "counter"],
        "end_ns": [end, end + 1, end, end, end],
        "rate": [4.49, 1.5, None, 7.0, None],
        "value": [10.0, 20.0, 2982.0, 1.0, 5.0],
    })  # fmt: skip
    seen = end + 3 * 10**9  # exactly 1.5 cycles after the first row's end
    out = with_quiet(rows, {"A": (seen + 1, cycle), "B": (seen, cycle), "C": (end + 10**12, cycle)})
    assert out.column("quiet").to_pylist() == [True, False, False, False, True]
    assert out.column("rate").to_pylist() == [0.0, 1.5, None, 7.0, 0.0]  # C: a reset row, now 0
    assert out.column("value").to_pylist() == [10.0, 20.0, 2982.0, 1.0, 5.0]
    assert with_quiet(rows, {}).column("rate").to_pylist() == [4.49, 1.5, None, 7.0, None]


def test_the_publish_cycle_is_measured_from_the_agents_heartbeats(tmp_path: Path) -> None:
    """An AM2 agent declares no interval (gold assumes 10 s); its heartbeats 2 s apart say 2 s."""
    from schemas.gold import AGENT_LIVENESS

    t0 = 1_800_000_000 * 10**9
    rows: list[dict[str, Any]] = [{
        "agent": "1.0", "dialect": "AM2", "epoch": None, "up_start_ns": t0,
        "up_start": None, "last_heartbeat_ns": t0 + 36 * 10**9, "last_heartbeat": None,
        "heartbeats": 19, "interval_s": 10.0, "state": "up", "started_by": "first",
        "down_at": None, "next_up": None, "batch_id": 0,
    }]  # fmt: skip
    for r in rows:
        r["up_start"] = r["last_heartbeat"] = datetime.fromtimestamp(r["up_start_ns"] / 1e9, UTC)
    write_deltalake(str(tmp_path / "gold" / "agent_liveness"), pa.Table.from_pylist(rows, schema=AGENT_LIVENESS))
    view = LiveView(tmp_path)
    view.refresh()
    assert view.agents() == {"1.0": (t0 + 36 * 10**9, 2 * 10**9)}
    view.latest = pa.Table.from_pylist([{
        "agent": "1.0", "dialect": "AM2", "package": "org.apache.qpid.broker",
        "class_name": "queue", "object_id": "0-1-1-0-9", "index_key": '["0-0-1-0-3","q-rate-5"]',
        "statistic": "msgTotalEnqueues", "kind": "counter", "start_ns": t0,
        "end_ns": t0 + 30 * 10**9, "value": 150.0, "rate": 5.0, "series": '["0-*-1-0-3","q-rate-5"]',
    }], schema=view.latest.schema)  # fmt: skip
    now = view.current().to_pylist()
    assert [(r["rate"], r["quiet"]) for r in now] == [(0.0, True)]  # 36 - 30 > 1.5 x 2
    # No lifecycle row: named from its index key, its broker the agent id.
    assert (now[0]["broker"], now[0]["name"]) == ("1.0", "q-rate-5")


def test_a_heartbeat_of_a_batch_after_the_states_waits_for_the_state(tmp_path: Path) -> None:
    """Gold commits a batch's liveness beside its rates and its state last: the view counts
    a heartbeat as seen only once the state it read is of that batch or later, so a counter
    whose rates the view has not read yet does not show as quiet in between."""
    from deltalake import CommitProperties, Transaction

    from schemas.gold import AGENT_LIVENESS, RATE_STATE

    t0 = 1_800_000_000 * 10**9
    liveness, state = tmp_path / "gold" / "agent_liveness", tmp_path / "gold" / "rate_state"

    def gold_batch(batch: int, heartbeats: int, state_too: bool) -> None:
        last = t0 + 2 * (heartbeats - 1) * 10**9
        row = {
            "agent": "1.0", "dialect": "AM2", "epoch": None, "up_start_ns": t0,
            "up_start": datetime.fromtimestamp(t0 / 1e9, UTC), "last_heartbeat_ns": last,
            "last_heartbeat": datetime.fromtimestamp(last / 1e9, UTC), "heartbeats": heartbeats,
            "interval_s": 10.0, "state": "up", "started_by": "first", "down_at": None,
            "next_up": None, "batch_id": batch,
        }  # fmt: skip
        write_deltalake(str(liveness), pa.Table.from_pylist([row], schema=AGENT_LIVENESS), mode="overwrite")
        if state_too:
            write_deltalake(
                str(state), RATE_STATE.empty_table(), mode="overwrite",
                commit_properties=CommitProperties(app_transactions=[Transaction("qmf-gold-x", batch)]),
            )  # fmt: skip

    gold_batch(0, 19, state_too=True)
    view = LiveView(tmp_path, max_events=0)
    view.refresh()
    assert view.agents() == {"1.0": (t0 + 36 * 10**9, 2 * 10**9)}
    gold_batch(1, 31, state_too=False)  # batch 1's liveness is in, its state not yet
    view.refresh()
    assert view.agents() == {"1.0": (t0 + 36 * 10**9, 2 * 10**9)}  # batch 1's: not yet
    gold_batch(1, 31, state_too=True)
    view.refresh()
    assert view.agents() == {"1.0": (t0 + 60 * 10**9, 2 * 10**9)}
