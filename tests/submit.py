"""What every test that runs the real ``spark-submit`` shares: the command and its environment."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pipeline.spark import QUICK_JIT

REPO = Path(__file__).resolve().parents[1]
SPARK_SUBMIT = str(Path(sys.executable).parent / "spark-submit")

# The test jobs' JVMs compile with C1 only, as the JVMs ``get_spark`` launches do
# (``pipeline.spark.QUICK_JIT``; docs/cluster.md advises it under spark-submit too): a
# short job's JVM spends much of its CPU in C2 otherwise, on CI's two cores.
# ``spark_submit_env`` passes it to the driver (``SPARK_SUBMIT_OPTS``); executor JVMs
# (``local-cluster``) get it from these arguments.
EXECUTOR_QUICK_JIT = ("--conf", f"spark.executor.extraJavaOptions={QUICK_JIT}")


def spark_submit_env() -> dict[str, str]:
    """This venv's Python on the driver and the workers, the repository importable, the
    driver JVM on C1, and no gateway of the test session's own JVM (spark-submit must
    start its own)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env["SPARK_SUBMIT_OPTS"] = QUICK_JIT
    env.pop("PYSPARK_GATEWAY_PORT", None)
    env.pop("PYSPARK_GATEWAY_SECRET", None)
    return env
