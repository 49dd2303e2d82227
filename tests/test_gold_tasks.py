"""Gold's compute tasks run in this process (what a Spark task runs, without Spark):
the tables a task wrote are taken from its worker's memory in the next batch, with the
same gold tables as reading their files, and as the driver path."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pipeline.cli import main as qmf
from pipeline.codec.capture import read_capture
from pipeline.gold import GoldBatchWriter, GoldSettings
from pipeline.gold import tasks as gt
from pipeline.gold.fold import fold_lifecycles
from pipeline.gold.tasks import (
    KEPT,
    STATE_TABLES,
    Kept,
    claim_bucket,
    compute,
    rate_compute,
    read_units,
    series_file,
)
from pipeline.gold.transforms import conform, frame
from pipeline.gold.writer import ORDER
from pipeline.lake import delta
from pipeline.lake.files import DataFile
from pipeline.silver import SilverBatchWriter, SilverSettings, bronze_rows
from schemas.gold import GOLD_TABLES, OBJECT_LIFECYCLES

Units = list[tuple[str, DataFile]]


@pytest.fixture(scope="module")
def silver(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[Units]]:
    """Three AM2 agents (the second restarting) in silver, one commit per quarter of the
    capture; and each commit's files as gold's units."""
    return _silver(tmp_path_factory.mktemp("gold-tasks"), late_keys=False)


@pytest.fixture(scope="module")
def silver_late_keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[Units]]:
    """As ``silver``, but the first half's statistics-only messages (AM2 'i') come as
    a batch of their own (with the half's heartbeats) before the rest of it (then a
    batch per quarter): that batch's series are keyed by object
    id (no index key yet), and the next batch's properties rekey them."""
    return _silver(tmp_path_factory.mktemp("gold-tasks-late"), late_keys=True)


def _silver(tmp: Path, *, late_keys: bool) -> tuple[str, list[Units]]:
    cap = str(tmp / "sim.jsonl")
    args = ["--dialect", "am2", "--agents", "3", "--queues", "4", "--intervals", "5",
            "--restart", "1:2", "--start-ns", "1795300000000000000"]  # fmt: skip
    assert qmf(["sim", "-o", cap, *args]) == 0
    msgs = list(read_capture(cap))
    ss = SilverSettings(bronze=str(tmp / "bronze"), root=str(tmp / "silver"))
    writer = SilverBatchWriter(ss, app_id="gold-tasks-test")
    step = -(-len(msgs) // 4)
    parts = [msgs[i : i + step] for i in range(0, len(msgs), step)]
    if late_keys:
        first = parts.pop(0) + parts.pop(0)
        early = [m for m in first if m.body[3:4] in (b"i", b"h")]  # with heartbeats
        assert {m.body[3:4] for m in early} == {b"i", b"h"}
        parts[:0] = [early, [m for m in first if m not in early]]
    batches: list[Units] = []
    seen: set[str] = set()
    offset = 0
    for k, part in enumerate(parts):
        writer.decode_local(bronze_rows(part, first_offset=offset), k)
        offset += len(part)
        units: Units = []
        for source, name in (("sample", "object_samples"), ("heartbeat", "heartbeats")):
            for f in delta.snapshot_files(os.path.join(ss.root, name))[2]:
                if f.local_path not in seen:  # the batch's new files
                    seen.add(f.local_path)
                    units.append((source, DataFile(f.local_path, os.path.getsize(f.local_path), None)))
        assert units
        batches.append(units)
    return ss.root, batches


def _run_tasks(
    root: str, silver: str, batches: Sequence[Units], *, keep_mib: int = 512,
    forget: bool = False, fail_commit_of: int | None = None,
    rate_buckets: Sequence[int] | None = None, workers: list[Kept] | None = None,
    claim: bool = True,
) -> list[dict[str, int]]:  # fmt: skip
    """Each batch as the task path runs it with 2 buckets (direct: each task reads the
    whole batch), its tasks in this process. ``forget``: the worker's memory is cleared
    before each task (as if another worker ran it). ``fail_commit_of``: that batch is
    computed once without being committed (a crash before its commit), then again.
    ``rate_buckets``: each batch's buckets of series of the rate stage (0: none).
    ``workers``: the memories of that many Python workers; task t of batch k runs in
    worker (t + k) % len(workers), as Spark may hand them out, and claims its bucket
    (``compute_claimed``) instead of being given one (``claim`` False: bucket t)."""
    gs = GoldSettings(silver=silver, root=root, buckets=2, keep_mib=keep_mib)
    w = GoldBatchWriter(gs, app_id="gold-tasks-test")
    rows = []

    @contextlib.contextmanager
    def worker(k: int, t: int) -> Iterator[None]:
        """Task t of batch k runs in its worker's memory (or a cleared one: ``forget``)."""
        if workers is None:
            if forget:
                KEPT.clear()
            yield
            return
        gt.KEPT = workers[(t + k) % len(workers)]
        try:
            yield
        finally:
            gt.KEPT = KEPT

    claimed = workers is not None and claim
    for batch_id, units in enumerate(batches):
        attempts = 2 if batch_id == fail_commit_of else 1
        rb = 0 if rate_buckets is None else rate_buckets[batch_id]
        for attempt in range(attempts):
            plan = w.plan_tasks(batch_id, 2, rb, shuffle=rb > 0)
            plan = w.timed_plan(plan, 0, 0)  # the direct path: each task takes the batch's own
            outs = []
            for b in range(2):
                with worker(batch_id, b):
                    if claimed:
                        outs.append(gt.compute_claimed(b, plan, direct=units))
                    else:
                        outs.append(compute(b, plan, direct=units))
            plan = gt.timed_by(plan, outs)  # as the writer does for the rate stage
            facts = [o.facts for o in outs]
            by = {b: [p for o in outs for sb, p in o.samples if sb == b] for b in range(rb)}
            for b in range(rb):
                with worker(batch_id, b):
                    if claimed:
                        outs.append(gt.rate_compute_claimed(b, plan, by, facts))
                    else:
                        outs.append(rate_compute(b, plan, by[b], facts))
            if attempt + 1 < attempts:
                w.drop_plan(plan)  # the crash: nothing committed
                continue
            report = w.commit_tasks(plan, outs)
            assert report.committed == list(ORDER), report
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
    assert set(KEPT.tables) == live and len(live) == files[-1]
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


def test_tasks_claim_the_buckets_their_workers_keep(
    silver_late_keys: tuple[str, list[Units]], tmp_path: Path
) -> None:
    """Two Python workers, and each batch's tasks handed to them the other way round
    from the batch before (what made half of the table files come from Parquet on two
    cores): each task claims the bucket its worker keeps, so after the first batch no
    table file is read, each worker keeps only its own buckets, and the tables equal
    the driver path's; with the rate stage too."""
    root, batches = silver_late_keys
    _run_driver(str(tmp_path / "driver"), root, batches)
    for label, rb in (("agents", None), ("series", [3, 3, 3, 3])):
        reads = {}
        for claim in (True, False):
            workers = [Kept(), Kept()]
            where = str(tmp_path / f"{label}-{claim}")
            rows = _run_tasks(where, root, batches, rate_buckets=rb, workers=workers, claim=claim)
            reads[claim] = [r["files_read"] for r in rows]
            for name in GOLD_TABLES:
                assert _rows(where, name) == _rows(str(tmp_path / "driver"), name), (label, claim, name)
            held = [{gt.file_bucket(p, 2) for p in k.tables} - {None} for k in workers]
            if rb is None and claim:  # each worker keeps one bucket of agents, its own
                assert sorted(map(len, held)) == [1, 1] and held[0] != held[1], held
        # Given fixed buckets, every task after the first batch ran where the other
        # bucket's tables are: all its table files read.
        assert reads[False][0] == 0 and min(reads[False][1:]) >= 4, reads
        if rb is None:
            assert reads[True] == [0, 0, 0, 0], reads
        else:  # only the 'u' files (series keyed by object id), which every rate task reads
            assert reads[True][0] == 0 and all(
                t <= 2 < f for t, f in zip(reads[True][2:], reads[False][2:], strict=True)
            ), reads


def test_claim_bucket_gives_each_task_its_own_bucket(tmp_path: Path) -> None:
    folder = str(tmp_path / "claims")
    # The worker keeps bucket 2: task 0 takes it; task 2 then takes the first free one.
    assert claim_bucket(folder, 0, 3, prefer=[2]) == 2
    assert claim_bucket(folder, 2, 3, prefer=[2, 7]) == 0  # 7: not a bucket of 3
    assert claim_bucket(folder, 1, 3) == 1
    # A retried or speculative attempt of a task takes the bucket its task claimed.
    assert claim_bucket(folder, 0, 3, prefer=[1]) == 2
    assert claim_bucket(folder, 2, 3) == 0
    assert sorted(os.listdir(folder)) == ["b0", "b1", "b2"]  # no temporary file left
    with pytest.raises(RuntimeError, match="task 3: all 3 buckets claimed"):
        claim_bucket(folder, 3, 3)
    # Eight tasks at once, all preferring the same bucket: each gets one of its own.
    got: dict[int, int] = {}
    many = str(tmp_path / "many")

    def take(t: int) -> None:
        got[t] = claim_bucket(many, t, 8, prefer=[5])

    threads = [threading.Thread(target=take, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sorted(got.values()) == list(range(8)) and len(got) == 8


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


def test_the_rate_stage_gives_the_driver_paths_tables(
    silver_late_keys: tuple[str, list[Units]], tmp_path: Path
) -> None:
    """Rates paired by bucket of series in a stage of their own (3 buckets of series
    over 2 of agents) give the driver path's tables: from the worker's memory, from
    files, and when the bucketing changes between batches (none, 3, 2, 3 buckets of
    series: each batch reads the rate state the previous one wrote, whatever its
    bucketing). The first batch's series are keyed by object id: its state goes to 'u'
    files, which every rate task of the next batch reads and rekeys."""
    root, batches = silver_late_keys
    assert len(batches) == 4
    _run_driver(str(tmp_path / "driver"), root, batches)
    runs = {
        "kept": {"rate_buckets": [3, 3, 3, 3]},
        "read": {"rate_buckets": [3, 3, 3, 3], "forget": True},
        "mixed": {"rate_buckets": [0, 3, 2, 3]},
        "unkeyed": {"rate_buckets": [3, 2, 0, 3]},
    }
    rows = {}
    for label, kw in runs.items():
        KEPT.clear()
        rows[label] = _run_tasks(str(tmp_path / label), root, batches, **kw)  # type: ignore[arg-type]
        for name in GOLD_TABLES:
            assert _rows(str(tmp_path / label), name) == _rows(str(tmp_path / "driver"), name), (label, name)
    # The rate state's files are the series bucketing's: 's' files by bucket of series.
    def kinds(label: str) -> set[tuple[str, int] | None]:
        live = delta.snapshot_files(str(tmp_path / label / "rate_state"))[2]
        return {series_file(f.local_path, 3) for f in live}

    assert kinds("kept") == {("s", 0), ("s", 1), ("s", 2)}
    # After the first batch alone, every series is keyed by object id: 'u' files only.
    _run_tasks(str(tmp_path / "first"), root, batches[:1], rate_buckets=[3])
    first = kinds("first")
    assert first and {k[0] for k in first if k} == {"u"} and None not in first, first
    # From memory: after batch 0 every table file is the worker's; the 'u' files of
    # batch 0 are read by every rate task of batch 1 (3 tasks), the rest once.
    kept = [r["files_kept"] for r in rows["kept"]]
    read = [r["files_read"] for r in rows["read"]]
    assert [r["files_read"] for r in rows["kept"]] == [0] * 4
    assert [r["files_kept"] for r in rows["read"]] == [0] * 4
    assert kept[0] == 0 and kept[2:] == read[2:] and min(kept[2:]) >= 5, (kept, read)
    assert read[1] == kept[1] + 3 * len(first), (kept, read, first)


def test_keep_mib_and_rate_buckets_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep_mib -1: must be >= 0"):
        GoldSettings(silver=str(tmp_path), root=str(tmp_path), keep_mib=-1)
    with pytest.raises(ValueError, match=r"rate_buckets -1: must be >= 0 \(0: no rate stage\)"):
        GoldSettings(silver=str(tmp_path), root=str(tmp_path), rate_buckets=-1)


def test_auto_runs_the_rate_stage_after_a_batch_of_uneven_agent_buckets() -> None:
    from pipeline.gold.writer import rate_stage_after

    assert not rate_stage_after({}, 2)  # the first batch: nothing known
    assert not rate_stage_after({0: 0, 1: 0}, 2)
    assert not rate_stage_after({0: 100}, 1)  # one bucket: nothing to spread over
    assert not rate_stage_after({0: 50, 1: 50}, 2)
    assert not rate_stage_after({0: 74, 1: 26}, 2)
    assert rate_stage_after({0: 75, 1: 25}, 2)  # 1.5 x the fair share
    assert rate_stage_after({0: 100, 1: 0}, 2)  # one big agent
    assert rate_stage_after({1: 100}, 2)  # an empty bucket reports no rows
    assert not rate_stage_after({0: 40, 1: 35, 2: 25}, 3)
    assert rate_stage_after({0: 50, 1: 50, 2: 0}, 3)


def test_the_rate_pairing_splits_by_bucket_of_series(silver: tuple[str, list[Units]]) -> None:
    """The rates and the state, computed per bucket of series (each bucket with its own
    value and state rows and the batch's per-agent facts whole), equal one pairing over
    everything, batch after batch: three agents, one restarting, each bucket carrying its
    own state. The ground for partitioning gold's rates by series, not by agent."""
    from pipeline.gold import transforms as tg
    from pipeline.gold.tasks import LIVENESS_KEYS
    from pipeline.gold.transforms import upsert_rows

    root, batches = silver
    registry = delta.read_arrow(os.path.join(root, "schema_registry"))
    rules, live_rules = tg.RateRules(), GoldSettings(silver=root, root="-").liveness
    defs = tg.statistic_defs(registry)
    buckets = 3
    empty = {name: pl.DataFrame(schema=pl.from_arrow(s.empty_table()).schema)  # type: ignore[union-attr]
             for name, s in GOLD_TABLES.items()}  # fmt: skip
    state, lifecycles, liveness = empty["rate_state"], empty["lifecycle_state"], empty["agent_liveness"]
    parts = [state] * buckets  # each bucket's own state
    seen = set()
    for batch_id, units in enumerate(batches):
        batch = pl.concat(list(read_units(units)), how="vertical_relaxed")
        whole = tg.gold_batch(
            batch, registry=registry, state=state, lifecycles=lifecycles, liveness=liveness,
            rate_rules=rules, liveness_rules=live_rules, batch_id=batch_id,
        )  # fmt: skip
        # The rate input as the agent stage makes it.
        inp = tg.agent_stage(
            batch, registry=registry, lifecycles=lifecycles, liveness=liveness,
            liveness_rules=live_rules, batch_id=batch_id,
        ).rate_input  # fmt: skip
        samples = batch.filter(pl.col("source") == "sample")
        latest = tg.max_ns(samples["update_ns"], *(p["update_ns"] for p in parts))
        vb = tg.series_buckets(inp.samples, buckets)
        # A state row's bucket is its series' after the rekey (a rekey can move it).
        moved = tg.rekey_state(pl.concat(parts), inp.keys)
        sb = tg.series_buckets(moved, buckets)
        rates, parts = [], []
        for b in range(buckets):
            mine = tg.RateInput(inp.samples.filter(vb == b), inp.activity, inp.keys, inp.gone)
            r, s = tg.rate_stage(mine, defs, moved.filter(sb == b), rules, batch_id, latest)
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


def test_the_plan_takes_the_tables_latest_times_from_what_the_tasks_wrote(
    silver: tuple[str, list[Units]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a task batch's commit, the next plan's two times come from the maxima the
    tasks reported of the tables they wrote (no table read back for them), equal to reading the
    tables; once another commit lands on a table, the writer reads it again. The schema
    registry is read once while it does not change."""
    root, batches = silver
    gs = GoldSettings(silver=root, root=str(tmp_path / "gold"), buckets=2)
    w = GoldBatchWriter(gs, app_id="gold-tops-test")
    reads: list[str] = []
    read_arrow = delta.read_arrow

    def counted(path: Any, version: int | None = None) -> Any:
        reads.append(os.path.basename(os.fspath(path)))
        return read_arrow(path, version)

    monkeypatch.setattr(delta, "read_arrow", counted)
    for batch_id, units in enumerate(batches[:2]):
        plan = w.timed_plan(w.plan_tasks(batch_id, 2, shuffle=False), 0, 0)
        outs = [compute(b, plan, direct=units) for b in range(2)]
        w.commit_tasks(plan, outs)
    # The registry did not change between the batches; the fold (object_lifecycles: across
    # buckets, on the driver) is made from the tasks' lifecycle files, no table read back.
    assert reads == ["schema_registry"]
    fold = read_arrow(gs.path("object_lifecycles")).to_pylist()  # not counted
    lifecycles = frame(read_arrow(gs.path("lifecycle_state")))
    want_fold = conform(fold_lifecycles(lifecycles), OBJECT_LIFECYCLES).to_pylist()
    assert fold and sorted(map(repr, fold)) == sorted(map(repr, want_fold))
    state, liveness = gs.path("rate_state"), gs.path("agent_liveness")
    want = {"rate_state": gt.column_max(state, "update_ns"),
            "agent_liveness": gt.column_max(liveness, "last_heartbeat_ns")}  # fmt: skip
    assert min(want.values()) > 1795300000000000000

    def no_read(path: str, column: str) -> int:
        raise AssertionError(f"{path} read")

    monkeypatch.setattr(gt, "column_max", no_read)
    assert {name: w.table_top(name) for name in want} == want
    # Another writer's commit (an empty one here): the state is read again, not the rest.
    assert not delta.commit_staged(state, [], app_id="other", batch_id=0).skipped
    assert w.table_top("agent_liveness") == want["agent_liveness"]
    with pytest.raises(AssertionError, match="rate_state read"):
        w.table_top("rate_state")
    monkeypatch.setattr(gt, "column_max", lambda p, c: -1)
    assert w.table_top("rate_state") == -1
    assert not delta.commit_staged(gs.silver_path("schema_registry"), [], app_id="other", batch_id=0).skipped
    w.registry_ipc()
    assert reads == ["schema_registry", "schema_registry"]


def test_a_batch_is_known_done_from_the_writers_own_commit_until_another_lands(
    silver: tuple[str, list[Units]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``_done`` after a task batch's commit: the writer's own rate-state commit says
    which batch is the last committed (no table opened) while it is the table's latest;
    after another commit, the table's transaction is read again, and says the same."""
    root, batches = silver
    gs = GoldSettings(silver=root, root=str(tmp_path / "gold"), buckets=2)
    w = GoldBatchWriter(gs, app_id="gold-done-test")
    plan = w.timed_plan(w.plan_tasks(0, 2, shuffle=False), 0, 0)
    w.commit_tasks(plan, [compute(b, plan, direct=batches[0]) for b in range(2)])
    opened: list[str] = []
    committed_batch = delta.committed_batch

    def counted(path: Any, app_id: str) -> int | None:
        opened.append(app_id)
        return committed_batch(path, app_id)

    monkeypatch.setattr(delta, "committed_batch", counted)
    assert w._done(0) and not w._done(1)
    assert opened == []
    assert not delta.commit_staged(gs.path("rate_state"), [], app_id="other", batch_id=0).skipped
    assert w._done(0) and not w._done(1)
    assert opened == ["gold-done-test", "gold-done-test"]


def test_a_jobs_timeline_is_taken_from_its_tasks_spans_and_cpu() -> None:
    """``job_timeline``: launch to the first start, skew between starts, straggle between
    ends, return after the last end, and the tasks' wall time beyond their CPU time;
    a task that never ran (no span) is left out."""
    outs = [
        gt.ComputeOutput(0, seconds={"cpu": 1.5}, span=(10.25, 12.0)),
        gt.ComputeOutput(1, seconds={"cpu": 1.0}, span=(10.5, 12.75)),
        gt.ComputeOutput(2),
    ]
    got = gt.job_timeline(outs, submitted=10.0, returned=13.0)
    assert got == {"launch": 0.25, "skew": 0.25, "straggle": 0.75, "return": 0.25, "off_cpu": 1.5}
    assert gt.job_timeline([gt.ComputeOutput(0)], 1.0, 2.0) == {}


def test_an_empty_input_has_the_columns_and_types_of_a_batch_read(
    silver: tuple[str, list[Units]],
) -> None:
    """The empty input (a batch of no files; what a bucket that the split step gave no
    part computes over) is typed as a batch's rows are."""
    _, units = silver
    read = gt.read_batch(units[0])
    empty = gt.read_batch([])
    assert read.height > 0 and empty.height == 0
    assert empty.schema == read.schema
