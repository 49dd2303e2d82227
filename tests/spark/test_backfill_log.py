"""``qmf backfill`` as a person runs it: Spark's and the JVM's output in a log file beside
the gold folder, the report and our own lines on the terminal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lake import Lake, copy_lake
from tests.terminal import spark_noise

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_qmf_backfill_keeps_spark_in_its_log(sim_lake: Lake, tmp_path: Path) -> None:
    lake = copy_lake(sim_lake, tmp_path / "lake")
    cmd = [sys.executable, "-m", "pipeline.cli", "backfill", "--data", str(lake.root),
           "--from", "2027-01-15T08:00:04Z", "--to", "2027-01-15T08:00:08Z",
           "--layers", "silver", "--dry-run"]  # fmt: skip
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(dry run: nothing written)" in proc.stdout  # the report, on stdout as before
    (log,) = (lake.root / "logs").glob("spark-backfill-*.log")
    assert f"qmf backfill: Spark's and the JVM's own output: {log}\n" in proc.stderr
    assert spark_noise(proc.stdout + proc.stderr) == []
    assert "WARNING: Using incubator modules" in log.read_text()
