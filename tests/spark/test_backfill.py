"""The backfill on the simulated lake: reruns identical, equal to the original, range-exact.

One private copy of ``sim_lake`` goes through a sequence (module fixture
``history``): backfill A, a "bad deploy" that deletes and corrupts the range's
silver and gold rows with delta-rs directly, a dry run D, and backfill C (the
same range again) that must restore the original rows: identical to A's.
Expected counts and the range's rows are computed here from the original
tables (pyarrow), not with the backfill's own code.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pipeline.backfill import BackfillReport, BackfillSettings, choose_run, run_backfill
from pipeline.lake import delta
from tests.lake import Lake, copy_lake, sorted_rows

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tests.s3server import S3Server

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
START = datetime(2027, 1, 15, 8, 0, 4, tzinfo=UTC)  # the lake spans 08:00:00-08:00:12
END = datetime(2027, 1, 15, 8, 0, 8, tzinfo=UTC)  # cuts bronze batches 1 and 2 mid-way
SILVER = ("object_samples", "events", "heartbeats", "method_responses", "quarantine")
GOLD = ("statistic_rates", "lifecycle_state", "agent_liveness")
FOLD = "gold/object_lifecycles"  # replaced whole by the fold of lifecycle_state
TABLES = tuple(f"silver/{n}" for n in SILVER) + tuple(f"gold/{n}" for n in GOLD)


def ns(t: datetime) -> int:
    return (t - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1) * 1000


def versions(root: Path) -> dict[str, int]:
    return {t: DeltaTable(str(root / t)).version() for t in TABLES}


def in_range_ids(lake: Lake) -> set[tuple[str, int]]:
    """Bronze identities received in [START, END)."""
    b = delta.read_arrow(str(lake.bronze))
    at = b.column("received_at")
    sel = pc.and_(
        pc.greater_equal(at, pa.scalar(START, at.type)), pc.less(at, pa.scalar(END, at.type))
    )
    t = b.filter(sel)
    return set(zip(t.column("partition").to_pylist(), t.column("offset").to_pylist(), strict=True))


def in_range_mask(table: str, t: pa.Table, ids: set[tuple[str, int]]) -> list[bool]:
    """Which rows of a table belong to the range (as docs/backfill.md defines it)."""
    rows = t.to_pylist()
    lo, hi = ns(START), ns(END)
    if table.startswith("silver/"):
        return [(r["partition"], r["offset"]) in ids for r in rows]
    if table == "gold/statistic_rates":
        return [lo <= r["end_ns"] < hi for r in rows]
    if table == "gold/lifecycle_state":
        return [
            r["first_seen_ns"] < hi
            and (r["last_seen_ns"] >= lo or (r["ended_at"] is not None and r["ended_at"] >= START))
            for r in rows
        ]
    return [
        r["up_start_ns"] < hi
        and (r["last_heartbeat_ns"] >= lo or (r["down_at"] is not None and r["down_at"] >= START))
        for r in rows
    ]


def same(a: Path | str, b: Path | str, *, lineage: bool = True) -> None:
    """Tables ``a`` and ``b`` hold the same rows (``lineage=False``: but for ``batch_id``),
    as delta-rs reads them (``tests.lake.sorted_rows``: milliseconds a table, where a
    Spark read and a DataFrame comparison took seconds)."""
    drop = () if lineage else ("batch_id",)
    left = sorted_rows(delta.read_arrow(str(a)), drop)
    right = sorted_rows(delta.read_arrow(str(b)), drop)
    assert len(left) == len(right) and left == right, (str(a), str(b))


def bad_deploy(root: Path, ids: set[tuple[str, int]]) -> None:
    """Delete or corrupt the range's rows of every table, with delta-rs (not the backfill)."""
    offsets = sorted(o for _, o in ids)
    assert offsets == list(range(offsets[0], offsets[-1] + 1)), "one contiguous run in p0"
    by_offset = f'"offset" >= {offsets[0]} AND "offset" <= {offsets[-1]}'
    DeltaTable(str(root / "silver/object_samples")).delete(by_offset)
    DeltaTable(str(root / "silver/heartbeats")).delete(by_offset)
    DeltaTable(str(root / "silver/events")).update({"severity": "99"}, predicate=by_offset)
    DeltaTable(str(root / "gold/statistic_rates")).delete(
        f"end_ns >= {ns(START)} AND end_ns < {ns(END)}"
    )
    DeltaTable(str(root / "gold/lifecycle_state")).update(
        {"samples": "0"}, predicate=f"first_seen_ns < {ns(END)} AND last_seen_ns >= {ns(START)}"
    )
    DeltaTable(str(root / FOLD)).delete()
    # The range's up intervals (none of them is down): the AM1 agent's interval after its
    # restart, which starts at END, is outside the range and stays.
    DeltaTable(str(root / "gold/agent_liveness")).delete(
        f"up_start_ns < {ns(END)} AND last_heartbeat_ns >= {ns(START)}"
    )


@dataclass
class History:
    original: Lake
    lake: Lake  # the copy the sequence ran on
    ids: set[tuple[str, int]]
    a: BackfillReport
    c: BackfillReport
    d: BackfillReport  # the dry run, after the bad deploy
    after_a: Path
    v0: dict[str, int]
    va: dict[str, int]
    vbad: dict[str, int]
    vd: dict[str, int]
    vc: dict[str, int]
    bad_counts: dict[str, tuple[int, int]]  # (rows in range, all rows) after the bad deploy
    bad_fold: int  # object_lifecycles' rows after the bad deploy


def settings(lake: Lake, **kw: Any) -> BackfillSettings:
    return BackfillSettings(
        bronze=str(lake.bronze), silver=str(lake.silver), gold=str(lake.gold),
        start=START, end=END, decode_on="driver", **kw,
    )  # fmt: skip


@pytest.fixture(scope="module")
def history(
    spark: SparkSession, sim_lake: Lake, tmp_path_factory: pytest.TempPathFactory
) -> History:
    import shutil

    tmp = tmp_path_factory.mktemp("backfill")
    lake = copy_lake(sim_lake, tmp / "lake")
    ids = in_range_ids(lake)
    v0 = versions(lake.root)
    a = run_backfill(spark, settings(lake))
    va = versions(lake.root)
    shutil.copytree(lake.root, tmp / "after-a")
    bad_deploy(lake.root, ids)
    vbad = versions(lake.root)
    bad_counts = {}
    for t in TABLES:
        table = delta.read_arrow(str(lake.root / t))
        bad_counts[t] = (sum(in_range_mask(t, table, ids)), table.num_rows)
    bad_fold = delta.read_arrow(str(lake.root / FOLD)).num_rows
    d = run_backfill(spark, settings(lake, dry_run=True))
    vd = versions(lake.root)
    c = run_backfill(spark, settings(lake))
    return History(
        sim_lake, lake, ids, a, c, d, tmp / "after-a", v0, va, vbad, vd, versions(lake.root),
        bad_counts, bad_fold,
    )  # fmt: skip


def test_backfill_twice_gives_identical_tables_equal_to_the_original(
    spark: SparkSession, history: History
) -> None:
    h = history
    assert h.ids, "the range holds bronze messages"
    for t in TABLES:
        # Run C over the bad deploy of run A's result: identical, lineage (batch_id)
        # included.
        same(h.after_a / t, h.lake.root / t)
        # Equal to the batch/stream-derived original: silver rows wholly (their
        # batch_id is the bronze batch id, which is the silver batch of this lake),
        # gold rows but for batch_id (a backfill writes -1: no stream batch wrote them).
        same(h.original.root / t, h.after_a / t, lineage=t.startswith("silver/"))
    gold_ids = delta.read_arrow(str(h.after_a / "gold/statistic_rates")).column("batch_id")
    mask = in_range_mask(
        "gold/statistic_rates", delta.read_arrow(str(h.after_a / "gold/statistic_rates")), h.ids
    )
    assert set(pc.filter(gold_ids, pa.array(mask)).to_pylist()) == {-1}
    # One commit per table per run; the runs are 0 then 1 of the range's app id.
    assert h.va == {t: v + 1 for t, v in h.v0.items()}
    assert h.vc == {t: v + 1 for t, v in h.vbad.items()}
    assert (h.a.run, h.c.run) == (0, 1)
    assert h.a.app_id == "qmf-backfill-20270115T080004Z-20270115T080008Z"
    for t in TABLES:
        assert delta.committed_batch(str(h.lake.root / t), h.a.app_id) == 1
        assert h.a.tables[t].status == h.c.tables[t].status == "committed"


def test_the_fold_is_refolded_whole_after_each_run(spark: SparkSession, history: History) -> None:
    """object_lifecycles (emptied by the bad deploy) is the fold of lifecycle_state again
    after each run: equal to the stream's but for batch_id, one commit per run."""
    from pipeline.gold.fold import fold_lifecycles

    h = history
    for root in (h.after_a, h.lake.root):
        same(h.original.root / FOLD, root / FOLD, lineage=False)
        state = pl.from_arrow(delta.read_arrow(str(root / "gold/lifecycle_state")))
        assert isinstance(state, pl.DataFrame)
        assert delta.read_arrow(str(root / FOLD)).to_pylist() == (
            fold_lifecycles(state).to_arrow().to_pylist()
        )
    assert h.bad_fold == 0 and h.d.tables[FOLD].status == "dry-run"
    assert [delta.committed_batch(str(r / FOLD), h.a.app_id) for r in (h.after_a, h.lake.root)] == [0, 1]
    assert h.a.tables[FOLD].written == h.c.tables[FOLD].written > 0
    assert (h.c.tables[FOLD].in_range, h.c.tables[FOLD].status) == (0, "committed")


def test_rows_outside_the_range_are_untouched(spark: SparkSession, history: History) -> None:
    h = history
    for t in TABLES:
        before = delta.read_arrow(str(h.original.root / t))
        after = delta.read_arrow(str(h.after_a / t))
        keep_b = pc.invert(pa.array(in_range_mask(t, before, h.ids), pa.bool_()))
        keep_a = pc.invert(pa.array(in_range_mask(t, after, h.ids), pa.bool_()))
        out_b, out_a = before.filter(keep_b), after.filter(keep_a)
        key = [
            (c, "ascending")
            for c in before.column_names
            if not pa.types.is_nested(before.schema.field(c).type)
        ]
        assert out_a.sort_by(key).to_pylist() == out_b.sort_by(key).to_pylist(), t
        in_b = before.num_rows - out_b.num_rows
        assert h.a.tables[t].in_range == in_b, t
        assert h.a.tables[t].written == after.num_rows - out_a.num_rows == in_b, t
    counts = {t: h.a.tables[t].in_range for t in TABLES}
    assert counts["silver/object_samples"] > 0 and counts["gold/statistic_rates"] > 0
    assert counts["gold/lifecycle_state"] > 0 and counts["gold/agent_liveness"] > 0


def test_backfill_restores_the_range_after_a_bad_deploy(
    spark: SparkSession, history: History
) -> None:
    h = history
    assert h.bad_counts["silver/object_samples"][0] == 0  # the deploy really removed them
    assert h.bad_counts["gold/agent_liveness"] == (0, 1)  # only the interval after the range
    for t in TABLES:
        same(h.original.root / t, h.lake.root / t, lineage=t.startswith("silver/"))
        same(h.after_a / t, h.lake.root / t)
    assert h.c.run == 1


def test_dry_run_writes_nothing_and_reports_exact_counts(history: History) -> None:
    h = history
    assert h.vd == h.vbad  # no table got a version
    assert h.d.dry_run and h.d.run == 1  # the run it would be
    for t in TABLES:
        change = h.d.tables[t]
        assert change.status == "dry-run"
        assert change.in_range == h.bad_counts[t][0], t  # what the range holds now
        assert change.written == h.a.tables[t].written, t  # what the backfill then wrote
        assert h.c.tables[t].in_range == change.in_range, t
        assert h.c.tables[t].written == change.written, t
    assert h.d.tables["silver/object_samples"].written > 0
    assert (
        h.d.tables["gold/lifecycle_state"].in_range
        == h.a.tables["gold/lifecycle_state"].in_range
    )


def test_job_entry_point_on_a_bucket_through_spark_submit_and_a_crashed_run_resumes(
    spark: SparkSession, sim_lake: Lake, s3: S3Server, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The lake in a bucket of the real S3 server: ``jobs/backfill.py`` through
    spark-submit (its scratch a local folder) re-derives the range's silver, equal to
    the original; a run over both layers then resumes the same run here and commits
    gold only, every table equal to the original."""
    from pyarrow import fs as pafs

    from pipeline.lake import snapshot
    from tests.submit import SPARK_SUBMIT, spark_submit_env

    bucket = s3.make_bucket("backfill")
    pafs.copy_files(str(sim_lake.root), f"{bucket}/lake", destination_filesystem=s3.filesystem())
    s3.configure(spark, bucket)
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)  # pyarrow here, and the spark-submit below
    root = f"s3a://{bucket}/lake"

    def versions_of(root: str) -> dict[str, int]:
        return {t: snapshot.load(f"{root}/{t}").version for t in TABLES}

    v0 = versions_of(root)
    proc = subprocess.run(
        [SPARK_SUBMIT, "--master", "local[2]",
         "--conf", "spark.ui.enabled=false", "--driver-memory", "1g",
         str(REPO / "jobs/backfill.py"), "--data", root, "--scratch", str(tmp_path / "scratch"),
         "--from", "2027-01-15T08:00:04Z", "--to", "2027-01-15T08:00:08Z", "--layers", "silver"],
        cwd=REPO, env=spark_submit_env(), capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "app qmf-backfill-20270115T080004Z-20270115T080008Z run 0" in proc.stdout
    assert "silver/object_samples: " in proc.stdout and "committed" in proc.stdout
    v1 = versions_of(root)
    for t in TABLES:
        assert v1[t] == v0[t] + (1 if t.startswith("silver/") else 0), t
        if t.startswith("silver/"):
            same(sim_lake.root / t, f"{root}/{t}")
    # A run over both layers that finds only the silver tables holding run 0 resumes
    # run 0 (as after a crash between the silver and gold commits): silver is skipped.
    both = BackfillSettings(
        bronze=f"{root}/bronze", silver=f"{root}/silver", gold=f"{root}/gold", start=START,
        end=END, decode_on="driver", scratch=str(tmp_path / "scratch"),
    )  # fmt: skip
    assert choose_run(both) == 0
    assert choose_run(replace(both, layers=("silver",))) == 1
    resumed = run_backfill(spark, both)
    assert resumed.run == 0
    assert {t: c.status for t, c in resumed.tables.items()} == {
        t: "skipped" if t.startswith("silver/") else "committed" for t in (*TABLES, FOLD)
    }
    v2 = versions_of(root)
    for t in TABLES:
        assert v2[t] == v1[t] + (0 if t.startswith("silver/") else 1), t
        same(sim_lake.root / t, f"{root}/{t}", lineage=t.startswith("silver/"))
    assert not any((tmp_path / "scratch").rglob("*.parquet"))  # the scratch went with the run


def test_qmf_backfill_command_dry_run(
    sim_lake: Lake, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``qmf backfill`` runs the same code (in this process's session here)."""
    from pipeline.cli import main

    lake = copy_lake(sim_lake, tmp_path / "lake")
    v0 = versions(lake.root)
    args = ["backfill", "--data", str(lake.root), "--from", "2027-01-15T08:00:04Z",
            "--to", "2027-01-15T08:00:08Z", "--layers", "silver", "--dry-run", "--keep-spark"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    ids = in_range_ids(lake)
    for name in SILVER:
        table = delta.read_arrow(str(lake.silver / name))
        n = sum(in_range_mask(f"silver/{name}", table, ids))
        assert f"silver/{name}: {n} rows in range -> {n} rows, dry-run" in out
    assert "(dry run: nothing written)" in out
    assert versions(lake.root) == v0


def test_a_reversed_range_is_refused_before_spark_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from jobs.backfill import main

    argv = ["--data", "nowhere", "--from", "2027-01-15T09:00:00Z", "--to", "2027-01-15T08:00Z"]
    assert main(argv) == 2
    assert "empty range" in capsys.readouterr().err


def test_a_schema_met_in_the_range_decodes_the_content_before_it_on_both_paths(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Content before its class's schema in the range is decoded (the stream parks it and
    decodes it when the schema comes). On the task path a second job decodes the
    tasks' parked files, and the driver holds no decoded row; both paths write the same
    rows, with their bronze batch ids. Content of a class whose schema never came
    stays out."""
    from pipeline.codec.capture import CapturedMessage
    from pipeline.codec.records import Am2ObjectId, ObjectSample
    from pipeline.codec.schema import ClassSchema, Element, SchemaKey, SchemaRegistry
    from pipeline.codec.v1 import encode_records, schema_response_for
    from pipeline.silver import SilverSettings, bronze_rows, ensure_tables, write_bronze

    widget = ClassSchema(
        key=SchemaKey("org.test", "widget", b"\x05" * 16),
        properties=(Element("name", 6, access=1, index=True),),
        statistics=(Element("count", 4),),
    )
    never = ClassSchema(key=SchemaKey("org.test", "never", b"\x06" * 16), statistics=(Element("x", 4),))
    known = SchemaRegistry([widget, never])

    def sample(schema: ClassSchema, n: int, values: dict[str, Any]) -> CapturedMessage:
        rec = ObjectSample(
            dialect="AM2", opcode="g", seq=n, package="org.test", class_name=schema.key.name,
            schema_hash=schema.key.hash, update_ns=ns(START) + n, create_ns=ns(START), delete_ns=0,
            object_id=Am2ObjectId(0, 1, 1, 0, n), values=values, agent="1.0",
        )  # fmt: skip
        return CapturedMessage(
            body=encode_records([rec], known), routing_key="console.obj.1.0.org.test",
            received_at="2027-01-15T08:00:05Z",
        )  # fmt: skip

    announce = CapturedMessage(
        body=encode_records([schema_response_for(widget, "AM2")], SchemaRegistry()),
        routing_key="console.schema.1.0.org.test.widget", received_at="2027-01-15T08:00:05Z",
    )  # fmt: skip
    first = [sample(widget, 1, {"name": "w1", "count": 10}), sample(never, 2, {"x": 1})]
    second = [announce, sample(widget, 3, {"name": "w3", "count": 30})]
    roots = {}
    for path in ("tasks", "driver"):
        root = tmp_path / path
        write_bronze(
            str(root / "bronze"),
            [bronze_rows(first, batch_id=4), bronze_rows(second, first_offset=2, batch_id=5)],
        )
        ensure_tables(SilverSettings(bronze=str(root / "bronze"), root=str(root / "silver")))
        s = BackfillSettings(
            bronze=str(root / "bronze"), silver=str(root / "silver"), gold=str(root / "gold"),
            start=START, end=END, layers=("silver",), decode_on=path,
        )  # fmt: skip
        report = run_backfill(spark, s)
        assert {t: (c.in_range, c.written) for t, c in report.tables.items()} == {
            f"silver/{n}": (0, 2 if n == "object_samples" else 0) for n in SILVER
        }
        roots[path] = root
        samples = delta.read_arrow(str(root / "silver/object_samples")).sort_by("offset")
        assert samples.select(["offset", "batch_id", "class_name", "ints"]).to_pylist() == [
            {"offset": 0, "batch_id": 4, "class_name": "widget", "ints": [10]},
            {"offset": 3, "batch_id": 5, "class_name": "widget", "ints": [30]},
        ]
        assert not list((root / "silver" / "_staging").iterdir())  # the scratch is gone
    for n in SILVER:
        same(roots["tasks"] / "silver" / n, roots["driver"] / "silver" / n)
