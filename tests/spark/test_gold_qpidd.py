"""Quiet objects on real qpidd traffic: ``qmf top`` and ``qmf serve-metrics`` show 0 for
queues the load stopped on, and the nominal rates while it ran.

qpidd publishes an object in an interval only when something in it changed. The
samples of ``../shared/samples/qpidd-amqp10/`` were captured while known loads ran
(``*.truth.json``: 5, 20 and 50 messages/s for 60 s) and for about 10 s after. The
capture is decoded into silver by the silver writer, then gold is derived by the gold
writer in two batches split by event time, 30 s into the load: the live view after
the first batch shows the load running, after the second its end. No Spark: the
batches are read from silver with pyarrow, as the stream reads them.

And gold over the same captures in many micro-batches cut in landing order equals
one batch, table by table (series still pending at the end included).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.cli import main
from pipeline.codec.capture import read_capture
from pipeline.commands.metrics import MetricsState
from pipeline.gold import GoldBatchWriter, GoldSettings, gold_input_arrow
from pipeline.lake import delta
from pipeline.silver import SilverBatchWriter, SilverSettings, bronze_rows

SAMPLES = "samples/qpidd-amqp10"
LOADED = ("q-rate-5", "q-rate-20", "q-rate-50")
V2_AGENT = re.compile(r"^apache\.org:qpidd:")
BROKER = "amqp-broker@vm:25672"  # the broker's name @ its system's nodeName : port


def _between(t: pa.Table, column: str, lo: int | None, hi: int | None) -> pa.Table:
    keep = pc.is_valid(t[column])
    if lo is not None:
        keep = pc.and_(keep, pc.greater_equal(t[column], lo))
    if hi is not None:
        keep = pc.and_(keep, pc.less(t[column], hi))
    return t.filter(keep)


def top_queues(root: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """(broker, queue name) -> the queue as ``qmf top --once --json`` shows it."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["top", "--once", "--json", "--limit", "1000", "--data", str(root)]) == 0
    queues = json.loads(out.getvalue())["queues"]
    shown = {(q["broker"], q["name"]): q for q in queues}
    assert len(shown) == len(queues)  # one row per (broker, queue)
    return shown


def metric_rates(root: Path, statistic: str) -> dict[tuple[str, str], float]:
    """(broker, queue name) -> the exposed rate of ``statistic`` (``/metrics``, parsed by
    prometheus_client's parser)."""
    body, _ = MetricsState(root).scrape()
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            labels = s.labels
            if s.name == "qmf_statistic_rate_per_second" and labels["class"] == "queue" \
                    and labels["statistic"] == statistic:  # fmt: skip
                key = (labels["broker"], labels["name"])
                assert key not in out
                out[key] = s.value
    return out


@pytest.mark.parametrize("sample", ["qmf1-qmf2-60s", "default-60s"])
def test_idle_queues_show_zero_after_the_load_and_their_rate_during_it(
    shared_dir: str, tmp_path: Path, sample: str
) -> None:
    if sample == "default-60s" and importlib.util.find_spec("pipeline.codec.amqp10") is None:
        pytest.skip("QMF v2 over AMQP 1.0 does not decode yet (pipeline/codec/amqp10.py)")
    base = os.path.join(shared_dir, SAMPLES, sample)
    with open(f"{base}.truth.json", encoding="utf-8") as f:
        truth = json.load(f)["queues"]
    ss = SilverSettings(bronze=str(tmp_path / "bronze"), root=str(tmp_path / "silver"))
    SilverBatchWriter(ss, app_id="silver").decode_local(bronze_rows(list(read_capture(f"{base}.jsonl"))), 0)
    samples = delta.read_arrow(os.path.join(ss.root, "object_samples"))
    beats = delta.read_arrow(os.path.join(ss.root, "heartbeats"))
    gold = GoldBatchWriter(GoldSettings(silver=ss.root, root=str(tmp_path / "gold")), app_id="gold")
    mid = round((truth["q-rate-50"]["first"] + 30) * 1e9)
    agents = set(samples.column("agent").drop_null().to_pylist())
    want_agents = {"1.0", "V2"} if sample == "qmf1-qmf2-60s" else {"V2"}
    assert {"V2" if V2_AGENT.match(a) else a for a in agents} == want_agents

    # While the load runs: every loaded queue at its nominal rate (within 1%), in both views,
    # named as qpid-stat names it, once per broker however many agents publish it.
    gold.write(gold_input_arrow(_between(samples, "update_ns", None, mid),
                                _between(beats, "timestamp_ns", None, mid)), 0)  # fmt: skip
    top, scraped = top_queues(tmp_path), metric_rates(tmp_path, "msgTotalEnqueues")
    assert {k for k in top if k[1] in LOADED} == {(BROKER, name) for name in LOADED}
    for name in LOADED:
        nominal = truth[name]["send_rate"]
        q = top[(BROKER, name)]
        assert q["agents"] == sorted(agents), q  # AM2 and V2: one row, both agents kept
        assert q["agent"] in agents and not q["quiet"], q
        assert q["enqueue_rate"] == pytest.approx(nominal, rel=0.01), q
        assert scraped[(BROKER, name)] == q["enqueue_rate"]
    q20 = top[(BROKER, "q-rate-20")]  # consumed as fast as it fills
    assert q20["dequeue_rate"] == pytest.approx(truth["q-rate-20"]["send_rate"], rel=0.01), q20

    # After it: the loaded queues are idle, their agent still publishes: 0, never a stale rate.
    gold.write(gold_input_arrow(_between(samples, "update_ns", mid, None),
                                _between(beats, "timestamp_ns", mid, None)), 1)  # fmt: skip
    last_sample = max(truth[n]["last"] for n in LOADED)
    top, scraped = top_queues(tmp_path), metric_rates(tmp_path, "msgTotalEnqueues")
    dequeued = metric_rates(tmp_path, "msgTotalDequeues")
    rates = delta.read_arrow(str(tmp_path / "gold" / "statistic_rates")).to_pylist()
    for name in LOADED:
        q = top[(BROKER, name)]
        agent = q["agent"]
        assert q["end_ns"] < last_sample * 1e9 + 2.1e9  # published last at the load's end
        assert (q["quiet"], q["enqueue_rate"], q["dequeue_rate"]) == (True, 0.0, 0.0), q
        assert scraped[(BROKER, name)] == 0.0 and dequeued[(BROKER, name)] == 0.0
        # ... while their gauges keep the last value: unchanged is the same value.
        depth = max(
            (r for r in rates if r["agent"] == agent and r["statistic"] == "msgDepth"
             and r["index_key"] and json.loads(r["index_key"])[-1] == name),
            key=lambda r: r["end_ns"],
        )  # fmt: skip
        assert q["depth"] == depth["value"]
        # ... and gold's last interval of it still holds the rate it measured.
        last = max(
            (r for r in rates if r["agent"] == agent and r["statistic"] == "msgTotalEnqueues"
             and r["index_key"] and json.loads(r["index_key"])[-1] == name),
            key=lambda r: r["end_ns"],
        )  # fmt: skip
        assert last["end_ns"] == q["end_ns"] and last["rate"] > 0


@pytest.mark.parametrize(("sample", "parts"), [("qmf1-qmf2-60s", 7), ("qmf1-qmf2-60s", 40), ("default-60s", 40)])
def test_micro_batches_in_landing_order_equal_one_batch(
    shared_dir: str, tmp_path: Path, sample: str, parts: int
) -> None:
    """Gold over the real captures in ``parts`` micro-batches cut in landing order (as the
    stream reads silver) writes exactly the tables of one batch, pending samples included."""
    from pipeline.gold.transforms import frame
    from schemas.gold import GOLD_TABLES

    msgs = list(read_capture(os.path.join(shared_dir, SAMPLES, f"{sample}.jsonl")))
    ss = SilverSettings(bronze=str(tmp_path / "bronze"), root=str(tmp_path / "silver"))
    SilverBatchWriter(ss, app_id="silver").decode_local(bronze_rows(msgs), 0)
    samples = delta.read_arrow(os.path.join(ss.root, "object_samples"))
    beats = delta.read_arrow(os.path.join(ss.root, "heartbeats"))
    size = -(-len(msgs) // parts)
    runs = {}
    for mode in ("batch", "stream"):
        g = GoldSettings(silver=ss.root, root=str(tmp_path / mode))
        w = GoldBatchWriter(g, app_id="gold")
        if mode == "batch":
            w.write(gold_input_arrow(samples, beats), 0)
        for b in range(parts if mode == "stream" else 0):
            w.write(gold_input_arrow(_between(samples, "offset", b * size, (b + 1) * size),
                                     _between(beats, "offset", b * size, (b + 1) * size)), b)  # fmt: skip
        runs[mode] = g
    for name in GOLD_TABLES:
        one, many = (frame(delta.read_arrow(runs[m].path(name))).drop("batch_id", "properties", strict=False)
                     for m in ("batch", "stream"))  # fmt: skip
        assert one.height > 0, name
        assert one.sort(one.columns, nulls_last=True).equals(
            many.sort(many.columns, nulls_last=True), null_equal=True
        ), name
    # Series still waiting (a last sample < 0.9 s after the one before, no later cycle yet).
    state = frame(delta.read_arrow(runs["stream"].path("rate_state")))
    assert state.group_by("agent", "series", "statistic").len().filter(pl.col("len") > 1).height > 0
