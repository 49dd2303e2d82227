"""SIGKILL the gold job mid-stream, restart it from its checkpoint: no duplicate, no loss.

The job runs as its own process (``jobs/gold.py``, stream mode over silver's
logs, one silver commit per source per trigger) and is killed with SIGKILL
once some micro-batches are committed; the restarted job must end with
exactly the tables a batch-mode run over the same silver gives.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import pytest
from chispa import assert_df_equality

from pipeline import delta
from pipeline.codec.capture import read_capture
from pipeline.gold import GoldSettings, run_gold_batch
from pipeline.silver import SilverBatchWriter, SilverSettings, bronze_rows
from schemas.gold import GOLD_TABLES

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PARTS = 5  # silver commits: the stream has as many micro-batches (one file per trigger)


def _job(s: GoldSettings, log: Any) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, os.path.join(ROOT, "jobs", "gold.py"), "--silver", s.silver,
        "--root", s.root, "--checkpoint", s.checkpoint, "--max-files-per-trigger", "1",
        "--timeout", "900",
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def _committed(path: str) -> int | None:
    """The highest gold batch id committed to a table so far."""
    if not delta.table_exists(path):
        return None
    from deltalake import DeltaTable

    ids = [h.get("qmf.batch_id") for h in DeltaTable(path).history()]
    return max((int(b) for b in ids if b is not None), default=None)


def _sorted(df: DataFrame) -> DataFrame:
    cols = [c for c in df.columns if c != "batch_id"]
    return df.select(*cols).orderBy(*[c for c in cols if c != "properties"])


def test_sigkill_and_restart_write_every_row_once(
    spark: SparkSession, shared_dir: str, tmp_path: Any
) -> None:
    msgs = list(read_capture(os.path.join(shared_dir, "samples/qpidd-capture-20s.jsonl")))
    ss = SilverSettings(bronze=str(tmp_path / "bronze"), root=str(tmp_path / "silver"))
    w = SilverBatchWriter(ss, app_id="silver-for-gold")
    size = -(-len(msgs) // PARTS)
    for i in range(PARTS):
        w.decode_local(bronze_rows(msgs[i * size : (i + 1) * size], first_offset=i * size), i)
    ref = GoldSettings(silver=ss.root, root=str(tmp_path / "ref"))
    run_gold_batch(spark, ref, 0)

    s = GoldSettings(silver=ss.root, root=str(tmp_path / "gold"), checkpoint=str(tmp_path / "ckpt"))
    with open(tmp_path / "job1.log", "wb") as log:
        job = _job(s, log)
        deadline = time.monotonic() + 600
        done: int | None = None
        while time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.3)
            done = _committed(s.path("rate_state"))  # the last write of a gold batch
            if done is not None and done >= 1:
                break
        assert job.poll() is None, (tmp_path / "job1.log").read_text()[-3000:]
        os.kill(job.pid, signal.SIGKILL)
        job.wait()
    assert done is not None and done < PARTS - 1  # killed mid-stream
    with open(tmp_path / "job2.log", "wb") as log:
        job = _job(s, log)
        try:
            assert job.wait(timeout=800) == 0, (tmp_path / "job2.log").read_text()[-3000:]
        finally:
            if job.poll() is None:
                job.kill()  # a timed-out run must not outlive the test
    assert (_committed(s.path("rate_state")) or 0) > done  # the rest streamed after the restart
    for name in GOLD_TABLES:
        a = delta.read_table(spark, ref.path(name))
        b = delta.read_table(spark, s.path(name))
        assert a.count() > 0, name
        assert_df_equality(_sorted(a), _sorted(b), ignore_nullable=True)
