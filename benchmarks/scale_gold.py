"""Gold's part of ``bench_scale.py`` (``--gold``, ``--gold-only``): the gold streaming job on
its task path at 1 and 2 cores, next to the no-Spark ceiling, in the same run.

Gold partitions a batch by *agent* (``pipeline.gold.tasks``: buckets of agents), and its
rates, with the rate stage (``--gold-rate-buckets``; default auto: on after a batch whose
agents were uneven over their buckets), by bucket of series. The input is ``qmf sim`` in
AM2 with ``--gold-agents`` agents (8) of ``--gold-queues`` queues each (1,250: 10,000
queues in all; ``--gold-agents 1 --gold-queues 10000`` is one big broker), publishing
every second for ``--gold-intervals`` intervals, decoded into silver with one commit per
publish interval. Then:

* **the gold stream** (``start_gold``, ``compute_on="tasks"``, 2 buckets on every
  master so the work is cut the same way, ``--gold-per-batch`` silver commits per
  micro-batch, by default as many as the job's default ``maxBytesPerTrigger`` admits,
  ``trigger="availableNow"``) in a fresh process per master: ``local[1]`` (pinned to
  one CPU) and ``local[2]``. The figure is gold input rows (object samples and
  heartbeats) per second over the steady micro-batches (all but the first
  ``--warm``), by the query's ``triggerExecution``, after the same stream ran once
  unmeasured in the same session (as ``bench_scale``: the JVMs' first stream);
* **the ceiling**: what a compute task runs (each batch's silver files read, once per
  process, and split by bucket; ``gold_batch`` over each bucket's rows, the bucket's
  state, lifecycles and liveness carried from batch to batch in memory, its rates and
  state written as Parquet with ``DataFileWriter``), without Spark, the shuffle or
  Delta, in 1 process (both buckets in turn) and in 2 (one bucket each, each pinned to
  its own CPU), timed over the same batches as the stream's figure: the first
  ``--warm`` run before its clock starts (until 2026-12-02 the ceiling timed every
  batch, the first ones too, which pair fewer values: the first meets no state). Until
  2026-12-01 the ceiling read every batch before its clock started,
  so it did less than a task (which must read its input); the figure without the read
  is still printed, and in ``RESULT`` (``ceiling_compute_only_per_core``,
  ``vs_ceiling_compute_only``);
* ``efficiency`` = rows/s at 2 cores / (2 x rows/s at 1 core) and ``vs_ceiling`` =
  rows/s per core at 2 cores / the 1-process ceiling, as for silver. As there, the
  1-process ceiling runs again after the masters (the higher of its two runs counts),
  and ``--rounds N`` runs the masters N times in turn, each master's best run counting.

The agents' split over the two buckets is printed: buckets hold whole agents, so an
uneven split (a stable hash of 8 agent ids) caps the 2-core figures for gold and
ceiling alike. Every master must write the same number of rate rows as the ceiling.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

BUCKETS = 2
START_NS = 1_800_000_000_000_000_000


# ------------------------------------------------------------------ input


def build_silver(work: Path, agents: int, queues: int, intervals: int) -> dict[str, Any]:
    """Simulated AM2 agents -> silver, one commit per publish interval (kept in ``work``
    and reused when the same input is asked for again)."""
    import json

    from pipeline.cli import main as qmf
    from pipeline.codec.capture import read_capture
    from pipeline.silver import SilverBatchWriter, SilverSettings, bronze_rows

    key = {"agents": agents, "queues": queues, "intervals": intervals, "version": 1}
    manifest = work / "manifest.json"
    root = work / "silver"
    if manifest.exists() and json.loads(manifest.read_text()).get("key") == key:
        return dict(json.loads(manifest.read_text()))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    t0 = time.monotonic()
    cap = str(work / "sim.jsonl")
    qmf(["sim", "-o", cap, "--dialect", "am2", "--agents", str(agents), "--queues",
         str(queues), "--interval", "1", "--intervals", str(intervals),
         "--start-ns", str(START_NS)])  # fmt: skip
    msgs = list(read_capture(cap))
    os.remove(cap)
    # One silver batch per publish interval: the messages of an interval are those
    # published before the next interval's first (the sim writes them in time order).
    ss = SilverSettings(bronze=str(work / "bronze"), root=str(root))
    writer = SilverBatchWriter(ss, app_id="bench-scale-gold")
    size = -(-len(msgs) // intervals)
    samples = []
    for i in range(intervals):
        part = msgs[i * size : (i + 1) * size]
        report = writer.decode_local(bronze_rows(part, first_offset=i * size), i)
        samples.append(report.rows.get("object_samples", 0))
    out = {"key": key, "silver": str(root), "samples": samples, "messages": len(msgs),
           "build_s": time.monotonic() - t0}  # fmt: skip
    manifest.write_text(json.dumps(out))
    return out


def agent_buckets(silver: str) -> dict[int, list[str]]:
    """Which agents each of the ``BUCKETS`` buckets holds."""
    import polars as pl

    from pipeline.gold.tasks import bucket_of

    agents = pl.read_delta(os.path.join(silver, "object_samples"), columns=["agent"])
    out: dict[int, list[str]] = {b: [] for b in range(BUCKETS)}
    for a in sorted(agents["agent"].drop_nulls().unique().to_list()):
        out[bucket_of(a, BUCKETS)].append(a)
    return out


# ------------------------------------------------------------------ the stream (child)


def child_gold(cfg: dict[str, Any]) -> dict[str, Any]:
    """One master: the gold stream over the silver input, measured."""
    from bench_scale import child_session, measure_query, warm_stream

    from pipeline.gold import GoldBatchWriter, GoldSettings, start_gold

    spark, run, startup, _waited = child_session(cfg)
    logging.getLogger("pipeline.gold").setLevel(logging.WARNING)
    settings = GoldSettings(
        silver=cfg["silver"], root=str(run / "gold"), checkpoint=str(run / "checkpoint"),
        compute_on="tasks", buckets=BUCKETS, rate_buckets=cfg.get("rate_buckets"),
        max_files_per_trigger=cfg["per_batch"],
        max_bytes_per_trigger=None, trigger="availableNow",
    )  # fmt: skip
    if cfg.get("starting_version") is not None:
        v = cfg["starting_version"]
        settings = dataclasses.replace(
            settings, starting_versions={"object_samples": v, "heartbeats": v}
        )
    if cfg.get("keep_mib") is not None:
        settings = dataclasses.replace(settings, keep_mib=cfg["keep_mib"])
    warmed = 0.0
    if cfg.get("warm_stream", True):  # as bench_scale.child_scale: the JVMs' first stream
        warm = dataclasses.replace(
            settings, root=str(run / "warm-gold"), checkpoint=str(run / "warm-checkpoint")
        )
        warmed = warm_stream(lambda: start_gold(spark, warm, GoldBatchWriter(warm)),
                             cfg["timeout"])  # fmt: skip
        shutil.rmtree(run / "warm-gold", ignore_errors=True)
    writer = GoldBatchWriter(settings)
    wall, others, failure, progress = measure_query(
        lambda: start_gold(spark, settings, writer), cfg["timeout"]
    )
    parallelism = spark.sparkContext.defaultParallelism
    spark.stop()
    if failure is not None:
        raise RuntimeError(f"the gold query failed: {failure}")
    reports = {r.batch_id: r for r in writer.reports}
    batches = []
    for p in progress:
        r = reports[int(p["batchId"])]
        d = p["durationMs"]
        batches.append({
            "batch": int(p["batchId"]),
            "rows": r.rows.get("input", 0),
            "rates": r.rows.get("rates", 0),
            "tasks": r.tasks,
            "compute_on": r.compute_on,
            "trigger_s": d["triggerExecution"] / 1e3,
            "writer_s": r.seconds,
            "logs_s": (d.get("walCommit", 0) + d.get("commitOffsets", 0)) / 1e3,
            "durations_s": {k: v / 1e3 for k, v in d.items()},
            "steps": r.steps,
            "kept": r.rows.get("files_kept", 0), "read": r.rows.get("files_read", 0),
        })  # fmt: skip
    from bench_scale import footer_rows

    return {
        "master": cfg["master"], "parallelism": parallelism, "startup_s": startup,
        "warm_stream_s": warmed,
        "wall_s": wall, "others_cpu_s": others, "batches": batches,
        "rate_rows": footer_rows(settings.path("statistic_rates")), "cpus": cfg.get("cpus"),
    }  # fmt: skip


# ------------------------------------------------------------------ the ceiling


def commit_files(silver: str, name: str) -> list[list[str]]:
    """The data files each commit after the first (table creation) added to a silver table."""
    from pipeline.lake.files import commit_adds

    files: list[list[str]] = []
    v = 1
    while (adds := commit_adds(os.path.join(silver, name), v)) is not None:
        files.append([f.path for f in adds])
        v += 1
    return files


def _ceiling_worker(
    cpu: int | None, silver: str, per_batch: int, warm: int, buckets: list[int], out: str,
    ready: Any, results: Any,
) -> None:  # fmt: skip
    """One process: for each batch (silver commit), each of its buckets' rows through
    ``gold_batch`` with that bucket's tables carried in memory; rates and state written
    as Parquet, as a compute task writes them. The first ``warm`` batches run before the
    clock starts, as the stream's figure leaves them out: the timed batches are the
    stream's steady ones, with the same state behind them."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    import polars as pl

    from pipeline.gold.tasks import (
        LIVENESS_KEYS,
        bucket_column,
        input_agent,
        read_batch,
    )
    from pipeline.gold.transforms import (
        LIFECYCLE_KEYS,
        LivenessRules,
        RateRules,
        conform,
        frame,
        gold_batch,
        upsert_rows,
    )
    from pipeline.lake import delta
    from pipeline.lake.files import DataFile
    from schemas.gold import AGENT_LIVENESS, LIFECYCLE_STATE, RATE_STATE, STATISTIC_RATES

    rates_rules, live_rules = RateRules(), LivenessRules()
    registry = delta.read_arrow(os.path.join(silver, "schema_registry"))

    samples, beats = commit_files(silver, "object_samples"), commit_files(silver, "heartbeats")
    batches = []
    commits = list(itertools.zip_longest(samples, beats, fillvalue=[]))
    for first in range(0, len(commits), per_batch):
        s_files = [f for c in commits[first : first + per_batch] for f in c[0]]
        h_files = [f for c in commits[first : first + per_batch] for f in c[1]]
        batches.append([("sample", DataFile(p, os.path.getsize(p), None)) for p in s_files] + [
            ("heartbeat", DataFile(p, os.path.getsize(p), None)) for p in h_files
        ])  # fmt: skip

    def bucket_rows(units: list[tuple[str, DataFile]]) -> dict[int, pl.DataFrame]:
        """A batch's silver files read once, split into this process's buckets (a compute
        task reads the batch too: the ceiling times it)."""
        b = read_batch(units)
        keyed = b.with_columns(_bucket=bucket_column(input_agent(b, live_rules), BUCKETS))
        return {k: keyed.filter(pl.col("_bucket") == k).drop("_bucket") for k in buckets}
    tables = {
        k: {"state": frame(RATE_STATE.empty_table()),
            "lifecycles": frame(LIFECYCLE_STATE.empty_table()),
            "liveness": frame(AGENT_LIVENESS.empty_table())}
        for k in buckets
    }  # fmt: skip

    spent = {"read": 0.0, "gold": 0.0, "write": 0.0}

    def one(batch_id: int, k: int, rows: pl.DataFrame, where: str) -> tuple[int, int]:
        t = tables[k]
        g0 = time.monotonic()
        got = gold_batch(
            rows, registry=registry, state=t["state"], lifecycles=t["lifecycles"],
            liveness=t["liveness"], rate_rules=rates_rules, liveness_rules=live_rules,
            batch_id=batch_id,
        )  # fmt: skip
        g1 = time.monotonic()
        t["state"] = got.state
        t["lifecycles"] = upsert_rows(t["lifecycles"], got.lifecycles, LIFECYCLE_KEYS)
        t["liveness"] = upsert_rows(t["liveness"], got.liveness, LIVENESS_KEYS)
        for name, df, schema in (("rates", got.rates, STATISTIC_RATES), ("state", got.state, RATE_STATE),
                                 ("lifecycles", t["lifecycles"], LIFECYCLE_STATE)):  # fmt: skip
            w = delta.DataFileWriter(os.path.join(where, f"{name}-{batch_id}-{k}.parquet"), schema, unique=())
            w.write(conform(df, schema))
            w.close()
        spent["gold"] += g1 - g0
        spent["write"] += time.monotonic() - g1
        return rows.height, got.rates.height

    os.makedirs(out, exist_ok=True)
    # The warm batches, untimed, as the stream's are: numba loads its kernels from the
    # cache (or compiles them on a new machine), polars and Arrow warm up, and the state
    # grows to what the timed batches meet (the first batch starts with none, so it
    # pairs fewer values than a later one).
    warm_rates = 0
    for batch_id, units in enumerate(batches[:warm]):
        parts = bucket_rows(units)
        for k in buckets:
            warm_rates += one(batch_id, k, parts[k], out)[1]
    for k in spent:
        spent[k] = 0.0
    ready.wait()
    t0, c0, k0 = time.monotonic(), time.process_time(), os.times().system
    n = r = 0
    for batch_id, units in enumerate(batches[warm:], start=warm):
        r0 = time.monotonic()
        parts = bucket_rows(units)
        spent["read"] += time.monotonic() - r0
        for k in buckets:
            a, b = one(batch_id, k, parts[k], out)
            n, r = n + a, r + b
    spent["sys"] = os.times().system - k0
    results.put((n, r + warm_rates, t0, time.monotonic(), time.process_time() - c0, dict(spent)))


def run_ceiling(silver: str, per_batch: int, warm: int, procs: int, out: Path) -> dict[str, float]:
    """The ceiling in ``procs`` processes (the buckets dealt out among them), timed over
    the batches after the first ``warm``."""
    from bench_scale import run_pinned

    args = [
        (silver, per_batch, warm, [b for b in range(BUCKETS) if b % procs == i], str(out / f"p{i}"))
        for i in range(procs)
    ]
    got, load = run_pinned(_ceiling_worker, args, 600)
    wall = max(g[3] for g in got) - min(g[2] for g in got)
    cpu_s = sum(g[4] for g in got)
    others = load.others_cpu_s(cpu_s)
    shutil.rmtree(out, ignore_errors=True)
    n = sum(g[0] for g in got)
    batches = -(-len(commit_files(silver, "object_samples")) // per_batch) - warm
    # What the rows' split over the processes allows: the busiest process sets the pace.
    split_cap = n / (procs * max(g[0] for g in got)) if n else 1.0
    # "rates": every rate row written, the warm batches' too (as the stream's table holds).
    return {"records": n, "rates": sum(g[1] for g in got), "seconds": wall, "split_cap": split_cap,
            "records_per_s": n / wall, "cpu_s": cpu_s, "others_core": others / wall,
            "read_s": sum(g[5]["read"] for g in got) / batches,
            "compute_only_per_s": n / (wall - max(g[5]["read"] for g in got)),
            "gold_s": sum(g[5]["gold"] for g in got) / batches,
            "sys_s": sum(g[5]["sys"] for g in got),
            "write_s": sum(g[5]["write"] for g in got) / batches}  # fmt: skip


# ------------------------------------------------------------------ the driver side


def steady(res: dict[str, Any], warm: int) -> dict[str, float]:
    bs = [b for b in res["batches"] if b["batch"] >= warm]
    if not bs:
        raise RuntimeError(f"gold on {res['master']}: no steady batch")
    rows = sum(b["rows"] for b in bs)
    trig = sum(b["trigger_s"] for b in bs)
    n = len(bs)
    return {
        "batches": n, "rows": rows, "records_per_s": rows / trig, "trigger_s": trig / n,
        "writer_s": sum(b["writer_s"] for b in bs) / n, "logs_s": sum(b["logs_s"] for b in bs) / n,
        "kept": sum(b["kept"] for b in bs), "read": sum(b["read"] for b in bs),
        "steps": {k: sum(b["steps"].get(k, 0.0) for b in bs) / n
                  for k in sorted({k for b in bs for k in b["steps"]})},
        # a phase missing from a batch's progress took no time in it
        "durations": {k: sum(b["durations_s"].get(k, 0.0) for b in bs) / n
                      for k in sorted({k for b in bs for k in b["durations_s"]})},
    }  # fmt: skip


def run(args: Any, work: Path) -> dict[str, Any]:
    """Silver input, the ceiling at 1 and 2 processes, each master; the figures."""
    from bench_scale import (
        DISTURBED_CORE,
        ONE_CORE,
        TARGET_EFFICIENCY,
        TARGET_VS_CEILING,
        TWO_CORES,
        ceiling_bound,
        met,
        parse_masters,
        run_child,
    )  # fmt: skip

    from pipeline.gold.writer import DEFAULT_MAX_BYTES_PER_TRIGGER

    m = build_silver(work / "gold-input", args.gold_agents, args.gold_queues, args.gold_intervals)
    # By default a micro-batch is what the gold job admits with its own defaults: whole
    # silver commits up to maxBytesPerTrigger bytes of samples (the ratios depend on the
    # batch size: a batch's fixed cost weighs less in a larger one, docs/performance.md).
    sizes = sorted(sum(os.path.getsize(p) for p in c) for c in commit_files(m["silver"], "object_samples"))
    median = sizes[len(sizes) // 2]
    # At least two measured batches after the warm ones (a small input: smaller batches).
    n = args.gold_per_batch or max(
        1,
        min(DEFAULT_MAX_BYTES_PER_TRIGGER // max(1, median), len(m["samples"]) // (args.warm + 2)),
    )
    print(f"\n== gold: {args.gold_agents} AM2 agents x {args.gold_queues:,} queues, "
          f"{args.gold_intervals} publish intervals of 1 s, one silver commit each; "
          f"{n} per micro-batch"
          + ("" if args.gold_per_batch else
             f" (at most what the job's default maxBytesPerTrigger, "
             f"{DEFAULT_MAX_BYTES_PER_TRIGGER:,} bytes, admits)"))  # fmt: skip
    per_batch = sum(m["samples"]) * n // len(m["samples"])
    print(f"  silver: {m['messages']:,} messages, {sum(m['samples']):,} object samples "
          f"(~{per_batch:,} per micro-batch), built in {m['build_s']:.0f} s")  # fmt: skip
    split = agent_buckets(m["silver"])
    print("  agents per bucket: " + "; ".join(f"{b}: {len(a)} ({', '.join(a)})" for b, a in split.items()))
    print("  no-Spark ceiling: each batch's silver files read once per process, gold_batch "
          "per bucket, tables carried in memory, rates/state/lifecycles written as Parquet; "
          "1 process (both buckets), 2 (one each):")
    ceiling: dict[int, dict[str, float]] = {}

    def measure_ceiling(procs: int) -> None:
        """The ceiling at ``procs`` processes; the higher of its runs counts."""
        c = run_ceiling(m["silver"], n, args.warm, procs, work / "runs" / f"gold-ceiling-{procs}")
        if procs not in ceiling or c["records_per_s"] > ceiling[procs]["records_per_s"]:
            ceiling[procs] = c
        print(f"    {procs} process(es): {c['records_per_s']:>9,.0f} rows/s ({c['records']:,} rows, "
              f"{c['rates']:,} rate rows, {c['seconds']:.2f} s, {c['cpu_s']:.2f} CPU-s of which "
              f"{c['sys_s']:.2f} in the kernel; other "
              f"processes {c['others_core']:.2f} of a core"
              + (": DISTURBED)" if c["others_core"] > DISTURBED_CORE else ")")
              + f"; per batch: reading the batch {c['read_s']:.3f} s, gold_batch "
              f"{c['gold_s']:.3f} s, writes {c['write_s']:.3f} s; without the read "
              f"{c['compute_only_per_s']:,.0f} rows/s)")  # fmt: skip

    for procs in (1, 2):
        measure_ceiling(procs)
    runs: dict[str, dict[str, Any]] = {}
    masters = parse_masters(args.masters)
    for need in (ONE_CORE, TWO_CORES):
        if need not in masters:
            masters.append(need)
    rb = "auto" if args.gold_rate_buckets is None else args.gold_rate_buckets
    print(f"\n  the gold stream, compute_on=tasks, {BUCKETS} buckets of agents, rate stage: "
          f"{rb} buckets of series, {n} silver commit(s) per micro-batch:")
    for rnd, master in itertools.product(range(args.rounds), masters):
        if args.rounds > 1 and master == masters[0]:
            print(f"\n    round {rnd + 1} of {args.rounds}:")
        label = f"gold-{master.replace('[', '-').replace(']', '').replace(',', '-')}"
        cfg = {
            "kind": "gold", "label": label, "master": master, "silver": m["silver"],
            "cpus": [min(os.sched_getaffinity(0))] if master == ONE_CORE else None,
            "run": str(work / "runs" / label), "result": str(work / "runs" / f"{label}.json"),
            "timeout": args.timeout, "per_batch": n, "rate_buckets": args.gold_rate_buckets,
            "warm_stream": not args.no_warm_stream, "keep_mib": args.gold_keep_mib,
            "starting_version": args.starting_version,
        }  # fmt: skip
        res = run_child(cfg)
        shutil.rmtree(cfg["run"], ignore_errors=True)
        s = res["steady"] = steady(res, args.warm)
        if master not in runs or s["records_per_s"] > runs[master]["steady"]["records_per_s"]:
            runs[master] = res  # each master's best run counts
        tag = "DISTURBED" if res["others_cpu_s"] / res["wall_s"] > DISTURBED_CORE else ""
        print(f"    {master}: {s['records_per_s']:,.0f} rows/s steady ({s['batches']} batches, "
              f"{s['trigger_s']:.2f} s per batch: writer {s['writer_s']:.2f} s, offset+commit "
              f"logs {s['logs_s']:.2f} s); {res['rate_rows']:,} rate rows; start-up "
              f"{res['startup_s']:.1f} s; tasks per batch "
              f"{sorted({b['tasks'] for b in res['batches']})}; table files from the workers' "
              f"memory {s['kept']} of {s['kept'] + s['read']} {tag}")  # fmt: skip
        print("      writer's steps per batch (s): "
              + ", ".join(f"{k} {v:.3f}" for k, v in s["steps"].items()))  # fmt: skip
        # The query's own phases (its progress' durationMs): addBatch holds the writer.
        print("      the query's phases per batch (s): "
              + ", ".join(f"{k} {v:.3f}" for k, v in s["durations"].items()))  # fmt: skip
        assert all(b["compute_on"] == "tasks" for b in res["batches"]), master
        if res["rate_rows"] != ceiling[1]["rates"]:
            print(f"    NOTE: {master} wrote {res['rate_rows']:,} rate rows, the ceiling "
                  f"{ceiling[1]['rates']:,}")  # fmt: skip
    print("\n  the ceiling again, 1 process (drift check; the higher counts):")
    measure_ceiling(1)
    ceil = ceiling[1]["records_per_s"]
    one = runs[ONE_CORE]["steady"]["records_per_s"]
    ceil2 = ceiling[2]["records_per_s"]
    ceil_eff = ceil2 / (2 * ceil)
    # The same work's CPU-seconds in 2 processes over 1: above 1, the two slow each other
    # down (shared caches, memory bandwidth), which no scheduling of tasks can win back.
    cpu_ratio = ceiling[2]["cpu_s"] / ceiling[1]["cpu_s"]
    print(f"  [gold] ceiling: 1 process {ceil:,.0f}/s, 2 processes {ceil2:,.0f}/s "
          f"(efficiency {ceil_eff:.2f}; the rows' split over the buckets allows "
          f"{ceiling[2]['split_cap']:.2f}; the same work took {cpu_ratio:.2f}x the CPU-seconds "
          f"in 2 processes as in 1)")  # fmt: skip
    bound = ceiling_bound("gold", ceil_eff)
    if bound:
        print(bound + " (with this input's split of rows over the buckets)")
    print(f"  [gold] {ONE_CORE}: {one:,.0f}/s ({one / ceil:.2f} of the ceiling)")
    ratios = {}
    for master in masters:
        if master == ONE_CORE:
            continue
        two = runs[master]["steady"]["records_per_s"]
        eff, vs = two / (2 * one), two / 2 / ceil
        # Judged on the ratios themselves, not their rounded figures.
        ratios[master] = {"records_per_s": round(two), "efficiency": round(eff, 3),
                          "vs_ceiling": round(vs, 3),
                          "met": eff >= TARGET_EFFICIENCY and vs >= TARGET_VS_CEILING}  # fmt: skip
        print(f"  [gold] {master}: {two:,.0f}/s; efficiency {eff:.3f} ({met(eff, TARGET_EFFICIENCY)}, "
              f"target {TARGET_EFFICIENCY}); vs_ceiling {vs:.3f} ({met(vs, TARGET_VS_CEILING)}, "
              f"target {TARGET_VS_CEILING}); against the ceiling without its read "
              f"{two / 2 / ceiling[1]['compute_only_per_s']:.2f}; against the 2-process "
              f"ceiling {two / ceil2:.2f}")  # fmt: skip
        ratios[master]["vs_ceiling_2proc"] = round(two / ceil2, 3)
    main = ratios[TWO_CORES]
    return {
        "agents": args.gold_agents, "queues_per_agent": args.gold_queues,
        "intervals_per_batch": n, "rows_per_batch": per_batch, "rate_buckets": rb,
        "agents_per_bucket": [len(a) for a in split.values()],
        "records_per_s_1core": round(one), "records_per_s": main["records_per_s"],
        "ceiling_per_core": round(ceil), "ceiling_2proc": round(ceil2),
        "ceiling_2proc_efficiency": round(ceil_eff, 3), "ceiling_2proc_cpu_ratio": round(cpu_ratio, 3),
        "target_above_machine": ceil_eff < TARGET_EFFICIENCY,
        "vs_ceiling_2proc": main["vs_ceiling_2proc"],
        "ceiling_compute_only_per_core": round(ceiling[1]["compute_only_per_s"]),
        "vs_ceiling_compute_only": round(main["records_per_s"] / 2 / ceiling[1]["compute_only_per_s"], 3),
        "efficiency": main["efficiency"], "vs_ceiling": main["vs_ceiling"],
        "met": main["met"],
        "masters": ratios,
    }  # fmt: skip
