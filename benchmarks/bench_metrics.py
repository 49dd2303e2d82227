"""``qmf serve-metrics`` at 10,000 queues: first scrape, later scrapes, sizes per selection.

The lake: ``qmf sim`` (AM2, ``--agents 2 --queues 5000``: 10,000 queues, with
their bindings, subscriptions, sessions, connections, and a few transient
queues created and deleted every interval; 10 s publish interval), decoded
into silver by the silver writer and derived into gold by the gold writer one
publish interval per gold batch (one commit per batch, as the stream writes
them): about 285,000 rate rows per interval, 11-12 million after the default 42
intervals, as the lake of issue 23 (11.8M rows). Built once under ``--cache``
(a folder per size) and reused; ``--rebuild`` builds again. The last interval
is kept out of gold: each run writes it into a hard-linked copy of the gold
tables, for the scrape that follows new data.

Measured (``MetricsState``, the endpoint's own code, without HTTP):

- baseline: the first scrape of a view that reads every rates file
  (``from_state=False``), default exposition;
- first scrape: a new endpoint (start from gold's ``rate_state``), default
  exposition; then the selection and the full set (``/metrics/all``) on it;
- later scrapes: the same request again (tables unchanged: the kept text),
  and after one more gold batch (the tail reads the new commit);
- per exposition: bytes (text format; gzip), series, generation time; the
  default exposition against the same without its health family (issue 50's
  budget: what the alerts need must not grow it noticeably).

Prints each figure and its ratio to the baseline, then ``RESULT {json}``.
Run it under the heavy lock (``flock /tmp/qmf-heavy.lock``). Usage (building:
about 10-15 minutes on 2 cores; a run on a built lake: about a minute):

    .venv/bin/python benchmarks/bench_metrics.py [--queues 5000] [--agents 2] [--intervals 26]
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from pipeline.cli import main as qmf
from pipeline.codec.capture import read_capture
from pipeline.commands.metrics import MetricsState, Selection
from pipeline.gold import GoldBatchWriter, GoldSettings, gold_input_arrow
from pipeline.lake import delta
from pipeline.silver import SilverBatchWriter, SilverSettings, bronze_rows

START_NS = 1_800_000_000_000_000_000
INTERVAL_S = 10
TEXT = "text/plain; version=0.0.4"
OPENMETRICS = "application/openmetrics-text; version=1.0.0"  # what Prometheus asks first
SELECTION = ("/metrics", "class=queue&statistic=msgDepth,msgTotalEnqueues&name=q0000.*")


def _batch(t: pa.Table, b: int) -> pa.Table:
    return t.filter(pc.equal(t["batch_id"], b))


def build(root: Path, agents: int, queues: int, intervals: int) -> None:
    """Simulate, decode into silver one interval per batch, derive gold for all but the last."""
    t0 = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    cap = root / "sim.jsonl"
    qmf(["sim", "-o", str(cap), "--dialect", "am2", "--agents", str(agents),
         "--queues", str(queues), "--transients", "5", "--interval", str(INTERVAL_S),
         "--intervals", str(intervals), "--start-ns", str(START_NS), "--seed", "23"])  # fmt: skip
    with open(cap, encoding="utf-8") as fh:
        n_msgs = sum(1 for line in fh if line.strip())
    ss = SilverSettings(bronze=str(root / "bronze"), root=str(root / "silver"))
    sw = SilverBatchWriter(ss, app_id="bench-silver")
    size = n_msgs // intervals + 1
    it = read_capture(str(cap))
    for i in range(intervals):
        sw.decode_local(bronze_rows(list(itertools.islice(it, size)), first_offset=i * size), i)
    cap.unlink()
    print(f"sim + silver: {n_msgs:,} messages, {time.perf_counter() - t0:.0f} s", flush=True)
    samples = delta.read_arrow(ss.path("object_samples"))
    beats = delta.read_arrow(ss.path("heartbeats"))
    w = GoldBatchWriter(GoldSettings(silver=ss.root, root=str(root / "gold")), app_id="bench-gold")
    for b in range(intervals - 1):
        tb = time.perf_counter()
        w.write(gold_input_arrow(_batch(samples, b), _batch(beats, b)), b)
        print(f"gold batch {b}: {time.perf_counter() - tb:.1f} s", flush=True)
    (root / "built.json").write_text(json.dumps({"intervals": intervals}))
    print(f"built in {time.perf_counter() - t0:.0f} s", flush=True)


def timed(
    state: MetricsState, path: str = "/metrics", query: str = "", accept: str = ""
) -> dict[str, Any]:
    t = time.perf_counter()
    body, _ = state.scrape(Selection.parse(path, query), accept or TEXT)
    seconds = time.perf_counter() - t
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    return {"seconds": round(seconds, 3), "bytes": len(body),
            "gzip_bytes": len(gzip.compress(body)), "series": series}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=2)
    ap.add_argument("--queues", type=int, default=5000, help="queues per agent")
    ap.add_argument("--intervals", type=int, default=42)
    ap.add_argument("--cache", default=os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "qmf-bench"))  # fmt: skip
    ap.add_argument("--rebuild", action="store_true")
    args = ap.parse_args()
    lake = Path(args.cache) / f"metrics-a{args.agents}-q{args.queues}-i{args.intervals}"
    if args.rebuild or not (lake / "built.json").is_file():
        shutil.rmtree(lake, ignore_errors=True)
        build(lake, args.agents, args.queues, args.intervals)
    gold = lake / "gold"
    rates_rows = sum(pa.table(DeltaTable(str(gold / "statistic_rates")).get_add_actions(
        flatten=True))["num_records"].to_pylist())  # fmt: skip
    files = len(DeltaTable(str(gold / "statistic_rates")).file_uris())
    state_rows = delta.read_arrow(str(gold / "rate_state")).num_rows
    print(f"lake {lake}: {rates_rows:,} rate rows in {files} files, rate_state {state_rows:,} rows",
          flush=True)  # fmt: skip

    result: dict[str, Any] = {"agents": args.agents, "queues": args.agents * args.queues,
                              "rate_rows": rates_rows, "rate_files": files,
                              "state_rows": state_rows}  # fmt: skip
    baseline = MetricsState(lake, from_state=False)
    result["baseline_first"] = timed(baseline)
    result["baseline_first"]["files_read"] = baseline.view.rates_tail.files_read
    del baseline
    state = MetricsState(lake)
    result["first"] = timed(state)
    result["first"]["files_read"] = state.view.rates_tail.files_read
    result["again"] = timed(state)
    # The health family (agents up/down, pipeline progress, events, quarantine) is part of
    # the default exposition since issue 50: the default of before it, and the family alone.
    result["default_before_health"] = timed(state, "/metrics", "family=queue,broker,objects")
    result["health"] = timed(state, "/metrics", "family=health")
    result["selection"] = {"query": "?".join(SELECTION), **timed(state, *SELECTION)}
    result["all"] = timed(state, "/metrics/all")
    result["all_again"] = timed(state, "/metrics/all")
    del state
    # As served (qmf serve-metrics): the lake is read and the default exposition rendered
    # before the first request, and again in the background after each gold commit.
    served = MetricsState(lake)
    t = time.perf_counter()
    served.start(every_s=3600.0)  # no background pass during the measurement
    result["served_start_seconds"] = round(time.perf_counter() - t, 3)
    result["served_first"] = timed(served)
    result["served_first_prometheus"] = timed(served, accept=OPENMETRICS)
    del served

    # One more gold batch (the last interval), in a hard-linked copy of gold.
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp:
        copy = Path(tmp)
        shutil.copytree(gold, copy / "gold", copy_function=os.link)
        later = MetricsState(copy)
        timed(later)
        served = MetricsState(copy)
        served.start(every_s=3600.0)  # passes run by hand below
        ss = SilverSettings(bronze=str(lake / "bronze"), root=str(lake / "silver"))
        b = args.intervals - 1
        samples = _batch(delta.read_arrow(ss.path("object_samples")), b)
        beats = _batch(delta.read_arrow(ss.path("heartbeats")), b)
        w = GoldBatchWriter(GoldSettings(silver=ss.root, root=str(copy / "gold")), app_id="bench-gold")
        w.write(gold_input_arrow(samples, beats), b)
        result["after_new_batch"] = timed(later)
        result["after_new_batch_all"] = timed(later, "/metrics/all")
        # Served: the background pass that follows the commit, then a scrape.
        t = time.perf_counter()
        served.prepare()
        result["served_refresh_after_new_batch_seconds"] = round(time.perf_counter() - t, 3)
        result["served_after_new_batch"] = timed(served)

    base = result["baseline_first"]["seconds"]
    print(f"\n{'scrape':<22} {'seconds':>8} {'x baseline':>10} {'bytes':>12} {'gzip':>11} {'series':>8}")
    for key in ("baseline_first", "first", "again", "default_before_health", "health",
                "selection", "all", "all_again",
                "served_first", "served_first_prometheus", "after_new_batch",
                "after_new_batch_all", "served_after_new_batch"):  # fmt: skip
        r = result[key]
        print(f"{key:<22} {r['seconds']:8.3f} {r['seconds'] / base:10.3f} {r['bytes']:12,} "
              f"{r['gzip_bytes']:11,} {r['series']:8,}")  # fmt: skip
    print(f"rates files read: first {result['first']['files_read']} of {files} "
          f"(baseline {result['baseline_first']['files_read']})")
    print(f"served: lake read and default rendered before the first request in "
          f"{result['served_start_seconds']:.3f} s; background pass after a gold commit "
          f"{result['served_refresh_after_new_batch_seconds']:.3f} s (what a scrape shows lags "
          "the tables by at most this plus --refresh)")
    before, now = result["default_before_health"], result["again"]
    result["health_growth"] = round(now["bytes"] / before["bytes"] - 1, 6)
    print(f"default exposition: {now['bytes']:,} bytes ({now['gzip_bytes']:,} gzipped), "
          f"{before['bytes']:,} ({before['gzip_bytes']:,}) without the health family: "
          f"x{now['bytes'] / before['bytes']:.5f} ({now['series'] - before['series']} series more)")
    result["first_vs_baseline"] = round(result["first"]["seconds"] / base, 4)
    result["served_first_vs_baseline"] = round(result["served_first"]["seconds"] / base, 6)
    print("RESULT " + json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
