"""Gold's compute tasks run in this process (what a Spark task runs, without Spark):
the tables a task wrote are taken from its worker's memory in the next batch, with the
same gold tables as reading their files, and as the driver path."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pipeline import delta
from pipeline.cli import main as qmf
from pipeline.codec.capture import read_capture
from pipeline.delta_source import DataFile, DeltaLogReader
from pipeline.gold import GoldBatchWriter, GoldSettings
from pipeline.gold.tasks import KEPT, STATE_TABLES, batch_times, compute, read_units
from pipeline.silver import SilverBatchWriter, SilverSettings, bronze_rows
from schemas.gold import GOLD_TABLES

Units = list[tuple[str, DataFile]]


@pytest.fixture(scope="module")
def silver(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[Units]]:
    """Three AM2 agents (the second restarting) in silver, one commit per quarter of the
    capture; and each commit's files as gold's units."""
    tmp = tmp_path_factory.mktemp("gold-tasks")
    cap = str(tmp / "sim.jsonl")
    args = ["--dialect", "am2", "--agents", "3", "--queues", "4", "--intervals", "5",
            "--restart", "1:2", "--start-ns", "1795300000000000000"]  # fmt: skip
    assert qmf(["sim", "-o", cap, *args]) == 0
    msgs = list(read_capture(cap))
    ss = SilverSettings(bronze=str(tmp / "bronze"), root=str(tmp / "silver"))
    writer = SilverBatchWriter(ss, app_id="gold-tasks-test")
    step = -(-len(msgs) // 4)
    for k, i in enumerate(range(0, len(msgs), step)):
        writer.decode_local(bronze_rows(msgs[i : i + step], first_offset=i), k)

    def adds(name: str) -> list[list[DataFile]]:
        log = DeltaLogReader(os.path.join(ss.root, name))
        out = []
        v = 1
        while (c := log.commit(v)) is not None:
            out.append([DataFile(f.path, os.path.getsize(f.path), None) for f in c.adds])
            v += 1
        return out

    samples, beats = adds("object_samples"), adds("heartbeats")
    assert len(samples) == len(beats) == 4
    batches = [
        [("sample", f) for f in s] + [("heartbeat", f) for f in h]
        for s, h in zip(samples, beats, strict=True)
    ]
    return ss.root, batches


def _run_tasks(
    root: str, silver: str, batches: Sequence[Units], *, keep_mib: int = 512,
    forget: bool = False, fail_commit_of: int | None = None,
) -> list[dict[str, int]]:  # fmt: skip
    """Each batch as the task path runs it with 2 buckets (direct: each task reads the
    whole batch), its tasks in this process. ``forget``: the worker's memory is cleared
    before each task (as if another worker ran it). ``fail_commit_of``: that batch is
    computed once without being committed (a crash before its commit), then again."""
    gs = GoldSettings(silver=silver, root=root, buckets=2, keep_mib=keep_mib)
    w = GoldBatchWriter(gs, app_id="gold-tasks-test")
    rows = []
    for batch_id, units in enumerate(batches):
        files = [[f for s, f in units if s == "sample"], [f for s, f in units if s == "heartbeat"]]
        attempts = 2 if batch_id == fail_commit_of else 1
        for attempt in range(attempts):
            plan = w.plan_tasks(batch_id, 2, shuffle=False)
            plan = w.timed_plan(plan, *batch_times(files, gs.liveness))
            outs = []
            for b in range(2):
                if forget:
                    KEPT.clear()
                outs.append(compute(b, plan, direct=units))
            if attempt + 1 < attempts:
                w.drop_plan(plan)  # the crash: nothing committed
                continue
            report = w.commit_tasks(plan, outs)
            assert report.committed == ["statistic_rates", *STATE_TABLES], report
            rows.append(report.rows)
    return rows


def _run_driver(root: str, silver: str, batches: Sequence[Units]) -> None:
    w = GoldBatchWriter(GoldSettings(silver=silver, root=root), app_id="gold-driver-test")
    for batch_id, units in enumerate(batches):
        w.write(pl.concat(list(read_units(units)), how="vertical_relaxed"), batch_id)


def _rows(root: str, name: str) -> list[Any]:
    return sorted(map(repr, delta.read_arrow(os.path.join(root, name)).to_pylist()))


def test_a_task_reads_what_its_worker_wrote_from_memory(
    silver: tuple[str, list[Units]], tmp_path: Path
) -> None:
    root, batches = silver
    KEPT.clear()
    kept = _run_tasks(str(tmp_path / "kept"), root, batches)
    # Batch 0 finds empty tables; after it, every table file of a bucket (lifecycles,
    # liveness, state) was written by this worker: none is read.
    files = [r["files_kept"] for r in kept]
    assert files[0] == 0 and min(files[1:]) >= 4, files
    assert [r["files_read"] for r in kept] == [0, 0, 0, 0]
    # Only live files stay in memory: the last batch's, of the three tables.
    live = {
        KEPT.key(f.local_path)
        for name in STATE_TABLES
        for f in delta.snapshot_files(str(tmp_path / "kept" / name))[2]
    }
    assert set(KEPT.frames) == live and len(live) == files[-1]
    read = _run_tasks(str(tmp_path / "read"), root, batches, forget=True)
    assert [r["files_kept"] for r in read] == [0, 0, 0, 0]
    assert [r["files_read"] for r in read] == files
    off = _run_tasks(str(tmp_path / "off"), root, batches, keep_mib=0)
    assert [r["files_kept"] for r in off] == [0, 0, 0, 0]
    _run_driver(str(tmp_path / "driver"), root, batches)
    assert delta.read_arrow(str(tmp_path / "kept" / "statistic_rates")).num_rows > 100
    for name in GOLD_TABLES:
        want = _rows(str(tmp_path / "driver"), name)
        for label in ("kept", "read", "off"):
            assert _rows(str(tmp_path / label), name) == want, (label, name)


def test_a_batch_computed_but_not_committed_leaves_nothing_used(
    silver: tuple[str, list[Units]], tmp_path: Path
) -> None:
    """A crash between compute and commit: the frames its tasks kept name files that
    were never committed and are never listed, so no later task takes them: the tables
    equal the driver path's."""
    root, batches = silver
    KEPT.clear()
    rows = _run_tasks(str(tmp_path / "crash"), root, batches, fail_commit_of=2)
    # The first try of batch 2 used (and dropped) what batch 1 kept: its retry reads the
    # files; batch 3 takes from memory what the retry wrote.
    kept, read = [r["files_kept"] for r in rows], [r["files_read"] for r in rows]
    assert kept[2] == read[0] == read[1] == read[3] == 0, (kept, read)
    assert read[2] == kept[1] >= 4 and kept[3] >= 4, (kept, read)
    _run_driver(str(tmp_path / "driver"), root, batches)
    for name in GOLD_TABLES:
        assert _rows(str(tmp_path / "crash"), name) == _rows(str(tmp_path / "driver"), name)


def test_keep_mib_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep_mib -1: must be >= 0"):
        GoldSettings(silver=str(tmp_path), root=str(tmp_path), keep_mib=-1)


def test_the_rate_pairing_splits_by_bucket_of_series(silver: tuple[str, list[Units]]) -> None:
    """The rates and the state, computed per bucket of series (each bucket with its own
    value and state rows and the batch's per-agent facts whole), equal one pairing over
    everything, batch after batch: three agents, one restarting, each bucket carrying its
    own state. The ground for partitioning gold's rates by series, not by agent."""
    from pipeline.gold import transforms as tg
    from pipeline.gold.tasks import LIVENESS_KEYS, upsert_rows

    root, batches = silver
    registry = delta.read_arrow(os.path.join(root, "schema_registry"))
    rules, live_rules = tg.RateRules(), GoldSettings(silver=root, root="-").liveness
    buckets = 3
    empty = {name: pl.DataFrame(schema=pl.from_arrow(s.empty_table()).schema)  # type: ignore[union-attr]
             for name, s in GOLD_TABLES.items()}  # fmt: skip
    state, lifecycles, liveness = empty["rate_state"], empty["object_lifecycles"], empty["agent_liveness"]
    parts = [state] * buckets  # each bucket's own state
    seen = set()
    for batch_id, units in enumerate(batches):
        batch = pl.concat(list(read_units(units)), how="vertical_relaxed")
        whole = tg.gold_batch(
            batch, registry=registry, state=state, lifecycles=lifecycles, liveness=liveness,
            rate_rules=rules, liveness_rules=live_rules, batch_id=batch_id,
        )  # fmt: skip
        # The rate input as the agent stage makes it (gold_batch's own steps).
        samples = batch.filter(pl.col("source") == "sample")
        hb = tg.heartbeat_rows(batch.filter(pl.col("source") == "heartbeat"), live_rules)
        known = lifecycles.filter(pl.col("index_key").is_not_null())
        ident = tg.identify(samples, known.select("agent", "object_id", "index_key"))
        inp = tg.RateInput(
            values=tg.statistic_values(ident, tg.statistic_defs(registry)),
            activity=tg.agent_activity(ident, hb, lifecycles, liveness),
            keys=tg.taught_keys(ident), gone=tg.deleted_objects(ident),
        )  # fmt: skip
        latest = tg.max_ns(samples["update_ns"], *(p["update_ns"] for p in parts))
        vb = tg.series_buckets(inp.values, buckets)
        # A state row's bucket is its series' after the rekey (a rekey can move it).
        moved = tg.rekey_state(pl.concat(parts), inp.keys)
        sb = tg.series_buckets(moved, buckets)
        rates, parts = [], []
        for b in range(buckets):
            mine = tg.RateInput(inp.values.filter(vb == b), inp.activity, inp.keys, inp.gone)
            r, s = tg.rate_stage(mine, moved.filter(sb == b), rules, batch_id, latest)
            rates.append(r)
            parts.append(s)
            seen.add((b, r.height > 0))
        got, want = pl.concat(rates), whole.rates
        assert got.sort(got.columns).equals(want.sort(want.columns)), batch_id
        got, want = pl.concat(parts), whole.state
        assert got.sort(got.columns).equals(want.sort(want.columns)), batch_id
        state = whole.state
        lifecycles = upsert_rows(lifecycles, whole.lifecycles, tg.LIFECYCLE_KEYS)
        liveness = upsert_rows(liveness, whole.liveness, LIVENESS_KEYS)
    assert {b for b, some in seen if some} == set(range(buckets))  # every bucket had rates
    assert state.height > 0 and lifecycles.height > 0
