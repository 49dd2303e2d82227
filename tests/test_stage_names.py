"""The names our writers give data files in a table folder (``pipeline.lake.delta.Stage``).

A batch's files are found again by name alone (``sweep_batch`` after the commit, the
files an attempt leaves): a prefix must match its own batch's files and no other's.
Pure string and folder work, no Delta table.
"""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.lake import delta


def test_a_batch_prefix_matches_no_other_batch_or_app(tmp_path: Path) -> None:
    """Fixed widths: batch 1 against 10 or 100, an app whose id extends another's."""
    apps = ["qmf-silver", "qmf-silver-1", "qmf-silver-10", "a" * 200]
    prefixes = {
        (app, batch): os.path.basename(delta.batch_prefix(tmp_path, app, batch))
        for app in apps
        for batch in (0, 1, 10, 100, 99_999_999, 100_000_000, 1_000_000_000)
    }
    assert len(set(prefixes.values())) == len(prefixes)
    for key, p in prefixes.items():
        assert len(p) == len("part-") + max(8, len(str(key[1]))) + 1 + 16
        others = [k for k, q in prefixes.items() if k != key and (q + "-").startswith(p + "-")]
        assert others == [], key


def test_a_stage_names_its_files_after_the_batch_and_gives_the_writers_part_back(
    tmp_path: Path,
) -> None:
    first, second = delta.Stage(tmp_path, "app", 7), delta.Stage(tmp_path, "app", 7)
    assert first.prefix != second.prefix  # one token per attempt
    batch = os.path.basename(delta.batch_prefix(tmp_path, "app", 7))
    big = delta.Stage(tmp_path, "app", 123_456_789_012)  # a long-running stream's batch
    assert delta.staged_name(big.file("calls-open-x.parquet")) == "calls-open-x.parquet"
    for stage in (first, second):
        name = os.path.basename(stage.file("calls-open-00000007-abc.parquet"))
        assert name.startswith(batch + "-")
        assert delta.staged_name(name) == "calls-open-00000007-abc.parquet"
        assert delta.staged_table_root(stage.prefix) == os.path.abspath(tmp_path)
    # Names of older releases (no stage prefix) and of delta-spark's writer read as they are.
    for plain in ("calls-closed-00000003-f00.parquet", "part-00000-1c2d-c000.snappy.parquet"):
        assert delta.staged_name(os.path.join("/t", plain)) == plain


def test_the_sweep_removes_the_batchs_other_files_only(tmp_path: Path) -> None:
    """After a commit: the batch's files the commit does not list go, whatever attempt
    wrote them; another batch's, another app's and files of other writers stay."""
    kept = delta.Stage(tmp_path, "app", 3).file("kept.parquet")
    killed = delta.Stage(tmp_path, "app", 3).file("half.parquet")
    later = delta.Stage(tmp_path, "app", 30).file("x.parquet")
    stranger = delta.Stage(tmp_path, "other", 3).file("x.parquet")
    spark_file = str(tmp_path / "part-00000-1c2d-c000.snappy.parquet")
    for f in (kept, killed, later, stranger, spark_file):
        Path(f).write_bytes(b"PAR1")
    gone = delta.sweep_batch(tmp_path, "app", 3, [os.path.basename(kept)])
    assert gone == [killed]
    assert sorted(os.listdir(tmp_path)) == sorted(
        os.path.basename(f) for f in (kept, later, stranger, spark_file)
    )


def test_a_call_part_names_its_bucket_at_any_batch_id(tmp_path: Path) -> None:
    from pipeline.silver.methods import part_bucket, part_name

    for batch in (0, 7, 99_999_999, 123_456_789_012):
        stage = delta.Stage(tmp_path, "app", batch)
        assert part_bucket(stage.file(part_name(batch, 42))) == 42
        assert part_bucket(part_name(batch, 3)) == 3
