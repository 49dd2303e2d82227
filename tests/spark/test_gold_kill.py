"""SIGKILL the gold job mid-stream, restart it from its checkpoint: no duplicate, no loss.

The job runs as its own process (``jobs/gold.py``, stream mode over silver's
logs, one silver commit per source per trigger) and is killed with SIGKILL
once some micro-batches are committed; the restarted job must end with
exactly the tables a batch-mode run over the same silver gives. The stream
computes in Spark tasks (``--compute-on tasks``, with the rate stage in every batch:
``--rate-buckets 2``), the reference on the driver. Silver, gold and the
checkpoint are on a real S3 server (``tests/s3server.py``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pytest
from chispa import assert_df_equality

from pipeline.codec.capture import read_capture
from pipeline.gold import GoldSettings, run_gold_batch
from pipeline.lake import delta
from pipeline.silver import SilverBatchWriter, SilverSettings, bronze_rows
from schemas.gold import GOLD_TABLES
from tests.integration.e2e import kill_after_batch, last_batch_id, run_job_to_end

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PARTS = 5  # silver commits: the stream has as many micro-batches (one file per trigger)


def _args(s: GoldSettings) -> list[str]:
    scratch = ["--scratch", s.scratch] if s.scratch is not None else []
    return ["--silver", s.silver, "--root", s.root, "--checkpoint", s.checkpoint,
            "--max-files-per-trigger", "1", "--timeout", "900", "--compute-on", "tasks",
            "--rate-buckets", "2", *scratch]  # fmt: skip


def _sorted(df: DataFrame) -> DataFrame:
    cols = [c for c in df.columns if c != "batch_id"]
    return df.select(*cols).orderBy(*[c for c in cols if c != "properties"])


def test_sigkill_and_restart_write_every_row_once(
    spark: SparkSession, s3: Any, shared_dir: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Silver, gold's tables and its checkpoint on the real S3 server (the cluster's side
    of the deployment touches only the store), the tasks' scratch folder local
    (``--scratch``). On a store, so that one kill test covers both: local tables run the
    same code but for ``pipeline.lake.storage``'s calls (tested alike on both in
    ``test_object_store``), and CI has 30 minutes."""
    bucket = s3.make_bucket("gold-kill")
    s3.configure(spark, bucket)  # the test's own session writes silver, reads gold
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)  # the job's process, and pyarrow here
    base, scratch = f"s3a://{bucket}/lake", str(tmp_path / "scratch")
    msgs = list(read_capture(os.path.join(shared_dir, "samples/qpidd-capture-20s.jsonl")))
    ss = SilverSettings(bronze=f"{base}/bronze", root=f"{base}/silver")
    w = SilverBatchWriter(ss, app_id="silver-for-gold")
    size = -(-len(msgs) // PARTS)
    for i in range(PARTS):
        w.decode_local(bronze_rows(msgs[i * size : (i + 1) * size], first_offset=i * size), i)
    ref = GoldSettings(silver=ss.root, root=str(tmp_path / "ref"), compute_on="driver")
    run_gold_batch(spark, ref, 0)

    s = GoldSettings(
        silver=ss.root, root=f"{base}/gold", checkpoint=f"{base}/ckpt", scratch=scratch
    )
    table = s.path("rate_state")  # the last write of a gold batch
    done = kill_after_batch("gold.py", _args(s), tmp_path / "job1.log", table, 1, 600)
    assert done is not None and done < PARTS - 1  # killed mid-stream
    run_job_to_end("gold.py", _args(s), tmp_path / "job2.log", 800)
    assert (last_batch_id(table) or 0) > done  # the rest streamed after the restart
    for name in GOLD_TABLES:
        a = delta.read_table(spark, ref.path(name))
        b = delta.read_table(spark, s.path(name))
        assert a.count() > 0, name
        assert_df_equality(_sorted(a), _sorted(b), ignore_nullable=True)
