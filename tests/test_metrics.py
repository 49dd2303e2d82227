"""``qmf serve-metrics``: what each endpoint and query selects, names for labels, AM2/V2
duplicates collapsed, and the exposition negotiated by prometheus_client, on real qpidd
traffic (QMF v1 and v2 of one broker) derived into gold without Spark."""

from __future__ import annotations

import gzip
import json
import os
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families as parse_text

from pipeline.commands.metrics import MetricsState, Selection
from pipeline.lake import delta
from pipeline.views.live import collapse
from tests.live_lake import HEALTH, QPIDD_SAMPLE, build, metrics_server

BROKER = "amqp-broker@vm:25672"
PROMETHEUS_ACCEPT = (  # what Prometheus 3 sends
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;"
    "escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
)
Sample = tuple[str, tuple[tuple[str, str], ...], float]


@pytest.fixture(scope="module")
def lake(shared_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("qpidd-lake")
    build(os.path.join(shared_dir, QPIDD_SAMPLE), root, batches=6)
    return root


def get(url: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def samples(body: bytes, openmetrics: bool = True) -> set[Sample]:
    """Every sample, parsed by prometheus_client's own parser of the format (strict for
    OpenMetrics: families, ``# EOF``); label sets must be unique."""
    parse = parse_openmetrics if openmetrics else parse_text
    out: list[Sample] = [
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for family in parse(body.decode())
        for s in family.samples
    ]
    keys = [(n, labels) for n, labels, _ in out]
    assert len(keys) == len(set(keys)), "duplicate series"
    return set(out)


def scrape(root: Path, path: str = "/metrics", query: str = "") -> set[Sample]:
    body, _ = MetricsState(root).scrape(Selection.parse(path, query), "application/openmetrics-text; version=1.0.0")
    return samples(body)


def _stat(s: Sample) -> dict[str, str]:
    return dict(s[1])


def test_default_exposition_is_what_dashboards_use(lake: Path) -> None:
    everything = scrape(lake, "/metrics/all")
    default = scrape(lake)
    assert {s[0] for s in default} == {
        "qmf_statistic_rate_per_second", "qmf_statistic_value", "qmf_objects",
        "qmf_live_rates_version", "qmf_live_state_version", *HEALTH,
    } - {"qmf_events_total", "qmf_receiver_connected"}  # fmt: skip (no event is news on a first read)
    stats = [s for s in everything if "statistic" in _stat(s)]
    want = {
        s for s in stats
        if _stat(s)["class"] == "broker" or (_stat(s)["class"] == "queue" and _stat(s)["statistic"]
                                             in ("msgDepth", "msgTotalEnqueues", "msgTotalDequeues", "consumerCount"))
    }  # fmt: skip
    assert {s for s in default if "statistic" in _stat(s)} == want
    assert {s for s in default if "statistic" not in _stat(s)} == {
        s for s in everything if "statistic" not in _stat(s)
    }
    # Every label set names: broker and class, object name and statistic; no agent, no id.
    assert {tuple(k for k, _ in s[1]) for s in stats} == {("broker", "class", "name", "statistic")}
    assert {_stat(s)["broker"] for s in everything if "broker" in _stat(s)} == {BROKER}
    # The queues a person knows, once each though qpidd publishes them as AM2 and V2.
    depth = {_stat(s)["name"]: s[2] for s in default if _stat(s).get("statistic") == "msgDepth"
             and _stat(s)["class"] == "queue"}  # fmt: skip
    assert {"q-rate-5", "q-rate-20", "q-rate-50"} <= set(depth)
    # Live objects per class: one broker's, counted once (gold's lifecycles, per agent).
    life = pl.from_arrow(delta.read_arrow(str(lake / "gold" / "lifecycle_state")))
    assert isinstance(life, pl.DataFrame)
    live = life.sort("batch_id", "last_seen_ns").group_by("agent", "object_id").last()
    live = live.filter(pl.col("state") == "live")
    per_agent = live.group_by("agent", "class_name").len()
    assert per_agent.group_by("class_name").agg(pl.col("len").n_unique())["len"].max() == 1
    counts = {(BROKER, c): float(n) for c, n in per_agent.select("class_name", "len").unique().iter_rows()}
    assert {(_stat(s)["broker"], _stat(s)["class"]): s[2] for s in default if s[0] == "qmf_objects"} == counts
    assert counts[(BROKER, "connection")] == 1.0


@pytest.mark.parametrize(
    ("query", "keep"),
    [
        ("class=exchange", lambda lab: lab["class"] == "exchange"),
        ("class=exchange,binding", lambda lab: lab["class"] in ("exchange", "binding")),
        ("statistic=msgDepth,consumerCount&statistic=msgTotalEnqueues",
         lambda lab: lab.get("statistic") in ("msgDepth", "consumerCount", "msgTotalEnqueues")),
        ("name=q-rate-.*", lambda lab: lab.get("name", "").startswith("q-rate-")),
        ("name=rate", lambda lab: False),  # the whole name must match
        ("name=q-rate-5|q-rate-50&statistic=msgDepth",
         lambda lab: lab.get("name") in ("q-rate-5", "q-rate-50") and lab["statistic"] == "msgDepth"),
        (f"broker={BROKER}&class=queue", lambda lab: lab["class"] == "queue"),
        ("broker=other@host:1", lambda lab: False),
        ("family=all", lambda lab: True),
        ("family=queue&name=q-rate-20",
         lambda lab: lab.get("name") == "q-rate-20" and lab["statistic"] in
         ("msgDepth", "msgTotalEnqueues", "msgTotalDequeues", "consumerCount")),
        ("family=objects", lambda lab: "statistic" not in lab),
        ("family=broker,objects", lambda lab: lab["class"] == "broker" or "statistic" not in lab),
    ],
)  # fmt: skip
def test_a_selection_is_the_matching_part_of_everything(
    lake: Path, query: str, keep: Any
) -> None:
    everything = scrape(lake, "/metrics/all")
    got = scrape(lake, "/metrics", query)
    version = {s for s in everything if s[0].startswith("qmf_live_")}
    counts = query.startswith("family=") or not ("statistic=" in query or "name=" in query)
    want = {
        s for s in everything
        if s[1] and s[0] not in HEALTH and keep(_stat(s)) and (counts or s[0] != "qmf_objects")
    }  # fmt: skip
    # Health comes with the default and family=all; selecting classes, statistics or names
    # selects statistics; broker=other selects no agent, so none of its health either.
    health = {s for s in everything if s[0] in HEALTH} if query == "family=all" else set()
    assert got == want | version | health
    assert scrape(lake, "/metrics", "family=all") == everything


def test_bad_queries_are_answered_400_and_other_paths_404(lake: Path) -> None:
    with metrics_server(lake) as base:
        for query, says in (
            ("?families=queue", "unknown parameters ['families']"),
            ("?family=queues", "unknown families ['queues']"),
            ("?name=q-(", "is not a regular expression"),
            ("?name=a&name=b", "name= takes one regular expression"),
        ):
            code, _, body = get(base + "/metrics" + query)
            assert code == 400 and says in body.decode(), (query, body)
        code, _, body = get(base + "/metric")
        assert code == 404 and b"/metrics/all" in body
        code, _, body = get(base + "/healthz")
        assert code == 200 and body.startswith(b"ok gold_statistic_rates_version=")


def test_format_and_compression_are_negotiated(lake: Path) -> None:
    with metrics_server(lake) as base:
        _, om_headers, om = get(base + "/metrics", Accept=PROMETHEUS_ACCEPT)
        assert om_headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0;")
        assert om.endswith(b"# EOF\n")
        _, text_headers, text = get(base + "/metrics")
        assert text_headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert b"# EOF" not in text
        _, gz_headers, gz = get(base + "/metrics", Accept=PROMETHEUS_ACCEPT, **{"Accept-Encoding": "gzip"})
        assert gz_headers["Content-Encoding"] == "gzip" and "Content-Encoding" not in om_headers
        assert gzip.decompress(gz) == om and len(gz) < len(om) / 5
    assert samples(om) == samples(text, openmetrics=False) == scrape(lake)


def test_duplicates_of_a_broker_collapse_to_the_object_seen_last_v2_on_a_tie() -> None:
    """AM2 and V2 objects of one broker with one name are shown once: the object seen last
    (gold's ``last_seen_ns``); a tie goes to V2. Two objects of one agent with one name are
    both shown (``ambiguous``); ended objects are not shown and do not compete."""

    def obj(agent: str, dialect: str, oid: str, name: str, seen: int, ended: bool = False) -> dict[str, Any]:
        return {"agent": agent, "object_id": oid, "dialect": dialect, "package": "p",
                "class_name": "queue", "name": name, "broker": "b", "last_seen_ns": seen,
                "state": "deleted" if ended else "live", "_ended": ended}  # fmt: skip

    objects = pl.DataFrame([
        obj("1.0", "AM2", "a1", "newer-am2", 20), obj("v2", "V2", "v1", "newer-am2", 10),
        obj("1.0", "AM2", "a2", "tie", 10), obj("v2", "V2", "v2", "tie", 10),
        obj("1.0", "AM2", "a3", "twice", 10), obj("1.0", "AM2", "a4", "twice", 30),
        obj("v2", "V2", "v5", "alone", 5), obj("1.0", "AM2", "a5", "alone", 9, ended=True),
    ])  # fmt: skip
    out = collapse(objects).sort("_name", "object_id")
    assert out.select("_name", "object_id", "_keep", "_agents", "_ambiguous").rows() == [
        ("alone", "a5", False, ["1.0"], False),
        ("alone", "v5", True, ["v2"], False),
        ("newer-am2", "a1", True, ["1.0", "v2"], False),
        ("newer-am2", "v1", False, ["1.0", "v2"], False),
        ("tie", "a2", False, ["1.0", "v2"], False),
        ("tie", "v2", True, ["1.0", "v2"], False),
        ("twice", "a3", True, ["1.0"], True),
        ("twice", "a4", True, ["1.0"], True),
    ]


def test_served_scrapes_answer_from_what_the_background_refresh_rendered(
    shared_dir: str, tmp_path: Path
) -> None:
    """``qmf serve-metrics`` reads the tables in the background: a scrape answers from
    the exposition rendered ahead (the same bytes a synchronous scrape gives), and the
    next refresh after gold commits shows the new batch."""
    run = build(os.path.join(shared_dir, QPIDD_SAMPLE), tmp_path, batches=4, written=2)
    served = MetricsState(tmp_path)
    served.start(every_s=0.2)
    om = "application/openmetrics-text; version=1.0.0"
    before, ctype = served.scrape(None, om)
    assert ctype.startswith("application/openmetrics-text")
    assert before == MetricsState(tmp_path).scrape(None, om)[0]
    # Rendered ahead: the default exposition is in the cache for both formats.
    assert served.scrape(None, "")[0] == MetricsState(tmp_path).scrape(None, "")[0]
    run.write(2)
    run.write(3)
    want = MetricsState(tmp_path).scrape(None, om)[0]
    assert want != before
    for _ in range(200):  # the refresh runs every 0.2 s: well within 40 s
        if served.scrape(None, om)[0] == want:
            break
        threading.Event().wait(0.2)
    assert served.scrape(None, om)[0] == want
    assert served.refresh_errors == 0
    # A selection is rendered on demand from the refreshed view.
    sel = Selection.parse("/metrics", "class=queue&name=q-rate-.*")
    assert served.scrape(sel, om)[0] == MetricsState(tmp_path).scrape(sel, om)[0]


def test_health_families_say_which_agent_stopped_and_count_what_came_since_the_start(
    tmp_path: Path,
) -> None:
    """Two v2 agents publishing every second for 16 s; the second stops after 10 s. Gold
    is written in two batches, the endpoint reads after each. Its agents' last sightings,
    cycles, silences and up/down are exact; events and quarantine count only what the
    second batch brought (the first read's are history): the events per broker, name
    and severity are silver's, and the one undecodable message is counted."""
    import contextlib
    import io

    import pyarrow.compute as pc

    from pipeline.cli import main
    from pipeline.codec.capture import CapturedMessage, read_capture
    from pipeline.gold import GoldBatchWriter, GoldSettings, gold_input_arrow
    from pipeline.silver import SilverBatchWriter, SilverSettings, bronze_rows

    start = 1_800_000_000_000_000_000
    capture = tmp_path / "sim.jsonl"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["sim", "-o", str(capture), "--manifest", str(capture.with_suffix(".manifest")),
                     "--dialect", "v2", "--agents", "2",
                     "--queues", "4", "--events", "3", "--intervals", "16", "--interval", "1",
                     "--seed", "7", "--start-ns", str(start), "--stop", "1:10",
                     "--stall", "0:9"]) == 0  # fmt: skip
    msgs = list(read_capture(str(capture)))
    half = len(msgs) // 2
    bad = CapturedMessage(body=b"AM2\x00garbage", routing_key="console.obj.1.0.x")
    parts = [msgs[:half], [*msgs[half:], bad]]
    root = tmp_path / "lake"
    ss = SilverSettings(bronze=str(root / "bronze"), root=str(root / "silver"))
    gs = GoldSettings(silver=ss.root, root=str(root / "gold"))
    state = MetricsState(root)
    first = 0
    reads = []
    for batch, part in enumerate(parts):
        SilverBatchWriter(ss, app_id="silver").decode_local(
            bronze_rows(part, first_offset=first, batch_id=batch), batch
        )
        rows = [delta.read_arrow(os.path.join(ss.root, t)) for t in ("object_samples", "heartbeats")]
        mine = [t.filter(pc.greater_equal(t["offset"], first)) for t in rows]
        GoldBatchWriter(gs, app_id="gold").write(gold_input_arrow(*mine), batch)
        first += len(part)
        body, _ = state.scrape(Selection(), "application/openmetrics-text; version=1.0.0")
        reads.append(samples(body))

    def health(read: set[Sample], name: str) -> dict[tuple[tuple[str, str], ...], float]:
        return {labels: v for n, labels, v in read if n == name}

    # After the first batch (intervals 0-7 and part of 8): nothing counted yet.
    assert health(reads[0], "qmf_quarantined_messages_total") == {(("broker_name", "default"),): 0.0}
    assert health(reads[0], "qmf_events_total") == {}
    now = reads[1]
    seen = health(now, "qmf_agent_last_seen_timestamp_seconds")
    assert len(seen) == 2
    labels = {dict(k)["agent"]: k for k in seen}
    assert {dict(k)["broker_name"] for k in seen} == {"default"}
    last = {a: seen[k] for a, k in labels.items()}
    # The agent that stopped was last seen at the end of interval 9 (10 s), the other at 16 s.
    end = start / 1e9
    assert sorted(last.values()) == [end + 10, end + 16]
    stopped = min(last, key=lambda a: last[a])
    for agent, k in labels.items():
        quiet = 6.0 if agent == stopped else 0.0
        assert health(now, "qmf_agent_publish_interval_seconds")[k] == 1.0
        assert health(now, "qmf_agent_silence_seconds")[k] == quiet
        assert health(now, "qmf_agent_up")[k] == (0.0 if agent == stopped else 1.0)
    assert health(now, "qmf_pipeline_newest_timestamp_seconds") == {(("broker_name", "default"),): end + 16}
    assert health(now, "qmf_quarantined_messages_total") == {(("broker_name", "default"),): 1.0}
    # Events of the second batch, from silver, by the broker the agent metrics name.
    broker_of = {dict(k)["agent"]: dict(k)["broker"] for k in seen}
    events = delta.read_arrow(os.path.join(ss.root, "events"))
    events = events.filter(pc.greater_equal(events["offset"], half))
    want: dict[tuple[tuple[str, str], ...], float] = {}
    from pipeline.views.live import severity_name

    for agent, name, sev in zip(*(events[c].to_pylist() for c in ("agent", "event_name", "severity")), strict=True):
        key = (("broker", broker_of[agent]), ("event", name), ("event_severity", severity_name(sev)))
        want[key] = want.get(key, 0.0) + 1
    assert sum(want.values()) > 3
    assert health(now, "qmf_events_total") == want
    # The stalled queue's queueThresholdExceeded (warn) is the one alert-worthy event, as
    # the health notebook lists it (pipeline.views.notebook.alert_events).
    from pipeline.views.notebook import alert_events

    stall = next(json.loads(line) for line in capture.with_suffix(".manifest").read_text().splitlines()
                 if json.loads(line)["kind"] == "stall")  # fmt: skip
    worthy = alert_events(pl.from_arrow(delta.read_arrow(os.path.join(ss.root, "events"))),
                          pl.from_arrow(delta.read_arrow(os.path.join(gs.root, "lifecycle_state"))))  # fmt: skip
    assert worthy.select("broker", "event_name", "severity_name", "object").rows() == [
        (broker_of[stall["agent"]], "queueThresholdExceeded", "warn", stall["queue"])]
    key = (("broker", broker_of[stall["agent"]]), ("event", "queueThresholdExceeded"),
           ("event_severity", "warn"))  # fmt: skip
    assert want.get(key) == 1.0  # (the event came with the second batch)


def test_a_receiver_whose_process_died_connected_is_exposed_disconnected(tmp_path: Path) -> None:
    """A receiver SIGKILLed while connected wrote nothing more: its status still says
    connected, its process is gone, so ``qmf_receiver_connected`` is 0; a live one is 1."""
    import json
    import subprocess

    from receivers.landing import BROKER_FILE, RECEIVER_FILE, write_receiver_status

    proc = subprocess.Popen(["true"])
    proc.wait()
    landing = tmp_path / "landing"
    for part, broker in (("east-0", "east"), ("west-0", "west")):
        (landing / part).mkdir(parents=True)
        (landing / part / BROKER_FILE).write_text(broker)
    write_receiver_status(landing / "west-0", True, "h2:5672")
    (landing / "east-0" / RECEIVER_FILE).write_text(json.dumps(
        {"connected": True, "since_ns": 1, "pid": proc.pid, "address": "h1:5672", "reason": None}))
    body, _ = MetricsState(tmp_path / "data", landing=landing).scrape(
        Selection(), "application/openmetrics-text; version=1.0.0")
    got = {(dict(s[1])["broker_name"], dict(s[1])["partition"]): s[2]
           for s in samples(body) if s[0] == "qmf_receiver_connected"}  # fmt: skip
    assert got == {("east", "east-0"): 0.0, ("west", "west-0"): 1.0}
