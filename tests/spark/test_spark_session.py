"""The session factory sets what the Delta layer and the source rely on."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pipeline.spark import DRIVER_STACK, QUICK_JIT, driver_java_options, get_spark

pytestmark = pytest.mark.spark


def test_test_session_settings(spark: SparkSession) -> None:
    conf = spark.sparkContext.getConf()
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.parquet.outputTimestampType") == "TIMESTAMP_MICROS"
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
    assert conf.get("spark.ui.enabled") == "false"
    assert conf.get("spark.master") == "local[2]"
    # No chmod/readlink forks per offset-log file (tests/spark/test_checkpoint_lock.py).
    assert spark.conf.get("spark.sql.streaming.checkpointFileManagerClass").endswith(
        ".FileSystemBasedCheckpointFileManager"
    )
    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    # Delta rebuilds a table's state in one partition on a local master, not 50.
    assert spark.conf.get("spark.databricks.delta.snapshotPartitions") == "1"


def test_cores_of_a_master() -> None:
    from pipeline.spark import _master_cores

    masters = ("local[2]", "local", "local[3,4]", "local-cluster[2,1,1024]", "spark://h:7077")
    assert [_master_cores(m) for m in masters] == [2, 1, 3, 2, None]
    assert _master_cores("local[*]") == (os.cpu_count() or 1)


def test_a_master_given_to_spark_submit_sizes_delta_state_too(spark: SparkSession) -> None:
    """The session's own master counts, however it was given; a value set stays."""
    from pipeline.spark import DELTA_STATE_PARTITIONS, size_delta_state

    other = spark.newSession()
    other.conf.unset(DELTA_STATE_PARTITIONS)
    size_delta_state(other)
    assert other.conf.get(DELTA_STATE_PARTITIONS) == "1"  # the suite's local[2]
    other.conf.set(DELTA_STATE_PARTITIONS, "7")
    size_delta_state(other)
    assert other.conf.get(DELTA_STATE_PARTITIONS) == "7"


def test_a_launched_driver_jvm_compiles_with_c1_unless_asked_otherwise(
    spark: SparkSession,
) -> None:
    """The jobs' JVMs compile with C1 only; a notebook and the test suite's own session
    (tests/conftest.py: it lives for the whole run) ask for the full JIT."""
    import inspect

    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()  # type: ignore[union-attr]
    args = list(runtime.getInputArguments())
    assert QUICK_JIT == "-XX:TieredStopAtLevel=1"
    assert QUICK_JIT not in args and DRIVER_STACK in args
    assert inspect.signature(get_spark).parameters["quick_jit"].default is True
    assert driver_java_options("/x.properties", True) == (
        "-Xss16m -XX:TieredStopAtLevel=1 -Dlog4j2.configurationFile=file:/x.properties"
    )
    assert driver_java_options("/x.properties", False) == (
        "-Xss16m -Dlog4j2.configurationFile=file:/x.properties"
    )


def test_get_spark_returns_the_running_session(spark: SparkSession) -> None:
    again = get_spark("another-name", test=True)
    assert again is spark or again.sparkContext is spark.sparkContext


def test_workers_import_the_installed_compiled_pyspark_not_sparks_zip(spark: SparkSession) -> None:
    """Spark puts its pyspark.zip and py4j zip first on a worker's path; tools/setup.sh's
    .pth moves them after site-packages, whose pyspark has bytecode (a zip has none, so
    every worker compiled pyspark: about 0.65 CPU-s each). The zips stay on the path."""

    def where(_: object) -> tuple[str, str, tuple[str, ...]]:
        import sys as worker_sys

        import py4j
        import pyspark

        # The path's entries from site-packages on: site-packages, then the zips.
        after = [
            p for p in worker_sys.path
            if p.endswith("site-packages") or ("site-packages" in p and p.endswith(".zip"))
        ]  # fmt: skip
        return pyspark.__file__ or "", py4j.__file__ or "", tuple(os.path.basename(p) for p in after)

    site = os.path.dirname(os.path.dirname(__import__("pyspark").__file__))
    seen = set(spark.sparkContext.parallelize([1, 2], 2).map(where).collect())
    assert len(seen) == 1
    pyspark_file, py4j_file, order = seen.pop()
    assert pyspark_file == os.path.join(site, "pyspark", "__init__.py")
    assert py4j_file == os.path.join(site, "py4j", "__init__.py")
    assert order[0] == "site-packages", order
    assert sorted(n.split("-")[0] for n in order[1:]) == ["py4j", "pyspark.zip"], order


def test_workers_keep_polars_freed_pages_for_their_next_batch(spark: SparkSession) -> None:
    """Polars' jemalloc in every Python worker gets ``ALLOCATOR_ENV`` (set as an executor
    variable, which a cluster's workers need: they do not inherit the driver's
    environment): with jemalloc's defaults each batch's frames fault their pages in
    again (docs/performance-log.md, 2026-12-02)."""
    from pipeline import ALLOCATOR_ENV

    def conf(_: object) -> str | None:
        import os as worker_os

        import polars  # noqa: F401  (it adds its own settings in front of the variable's)

        return worker_os.environ.get("_RJEM_MALLOC_CONF")

    want = ALLOCATOR_ENV["_RJEM_MALLOC_CONF"]
    assert want == "dirty_decay_ms:30000,muzzy_decay_ms:30000"
    assert spark.conf.get("spark.executorEnv._RJEM_MALLOC_CONF") == want
    seen = set(spark.sparkContext.parallelize([1, 2], 2).map(conf).collect())
    # jemalloc takes the last of repeated options: ours, after polars' 500 ms and 1 s.
    assert seen == {"dirty_decay_ms:500,muzzy_decay_ms:1000," + want}


@pytest.mark.parametrize(
    ("given", "seen"),
    [
        (None, "dirty_decay_ms:500,muzzy_decay_ms:1000,dirty_decay_ms:30000,muzzy_decay_ms:30000"),
        ("", "dirty_decay_ms:500,muzzy_decay_ms:1000"),
        ("narenas:1", "dirty_decay_ms:500,muzzy_decay_ms:1000,narenas:1"),
    ],
)
def test_importing_pipeline_sets_the_allocator_unless_the_environment_has(
    given: str | None, seen: str
) -> None:
    """Set before polars loads, which puts its own settings first (jemalloc reads them
    once and takes the last of a repeated option); a value the user set, even an empty
    one (polars' settings alone), is left as it is."""
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    if given is not None:
        env["_RJEM_MALLOC_CONF"] = given
    code = "import pipeline, os, polars; print(repr(os.environ.get('_RJEM_MALLOC_CONF')))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == repr(seen)


def test_workers_run_this_interpreter(spark: SparkSession) -> None:
    def exe(_: object) -> str:
        import sys as worker_sys

        return worker_sys.executable

    seen = set(spark.sparkContext.parallelize([1, 2], 2).map(exe).collect())
    assert seen == {sys.executable}


def test_timestamps_are_utc_micros(spark: SparkSession, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    df = spark.sql("SELECT TIMESTAMP'2024-01-02 03:04:05.123456' AS ts")
    out = str(tmp_path / "ts")
    df.write.parquet(out)
    files = sorted(p for p in Path(out).glob("*.parquet"))
    table = pq.read_table(files[0])
    assert str(table.schema.field("ts").type) == "timestamp[us, tz=UTC]"
    assert table.column("ts")[0].value == 1704164645123456


def test_spark_submit_master_wins(tmp_path: Path) -> None:
    """Under spark-submit the --master and --conf given there are kept."""
    script = tmp_path / "probe.py"
    script.write_text(
        textwrap.dedent(
            """
            from pipeline.spark import get_spark
            s = get_spark("probe")
            c = s.sparkContext.getConf()
            print("MASTER=" + c.get("spark.master"))
            print("SHUFFLE=" + s.conf.get("spark.sql.shuffle.partitions"))
            print("TZ=" + s.conf.get("spark.sql.session.timeZone"))
            s.stop()
            """
        )
    )
    submit = Path(sys.executable).parent / "spark-submit"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    env.pop("PYSPARK_GATEWAY_PORT", None)
    env.pop("PYSPARK_GATEWAY_SECRET", None)
    proc = subprocess.run(
        [
            str(submit),
            "--master",
            "local[1]",
            "--conf",
            "spark.sql.shuffle.partitions=7",
            "--conf",
            "spark.ui.enabled=false",
            "--driver-memory",
            "512m",
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = set(proc.stdout.splitlines())
    assert "MASTER=local[1]" in lines
    assert "SHUFFLE=7" in lines
    assert "TZ=UTC" in lines
