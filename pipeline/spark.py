"""The one SparkSession factory.

Every job, test and notebook gets its session here so the settings that the
Delta layer and the streaming source rely on (UTC, microsecond Parquet
timestamps, Arrow, the driver's interpreter on the workers, delta-spark's JARs,
extension and catalog: ``pipeline.runtime.jars``) are set once.
Under ``spark-submit`` the master and any ``--conf`` given there win: this
module only fills in what is missing.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession

from pipeline import ALLOCATOR_ENV
from pipeline.runtime.jars import delta_conf

DEFAULT_MASTER = "local[2]"
# A file for Spark's and the JVM's output when the caller gives none (jobs run with
# python, notebooks): see get_spark's ``log_file``.
LOG_ENV = "QMF_SPARK_LOG"
_log_file: Path | None = None  # where this process's JVM writes, when we launched it so

# Settings every session needs; the Delta layer's timestamp handling depends on
# the first two (see docs/delta.md).
BASE_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.ui.showConsoleProgress": "false",
    # Gold and silver's driver decode collect micro-batches as Arrow: the JVM
    # holds a batch's task results before Python gets them (1g, Spark's
    # default, ran out in a 30-minute run at 10,000 queues).
    "spark.driver.memory": "2g",
    # Long-running streams: keep the checkpoint's offset/commit logs and the
    # driver's UI history bounded (Spark keeps 100 batches and 1000 jobs,
    # stages and SQL executions by default; each micro-batch adds some).
    "spark.sql.streaming.minBatchesToRetain": "20",
    # The offset and commit logs through Hadoop's FileSystem API, not FileContext's.
    # Without Hadoop's native library (pip's pyspark has none) the FileContext path
    # forks `chmod` and `readlink` processes from the driver JVM for every log file it
    # writes: 0.10-0.12 s of every micro-batch (measured 2026-11-29, a rate stream: 118
    # ms -> 23 ms per batch for both logs; docs/performance.md). Its one guarantee the
    # FileSystem path lacks, a rename that refuses to overwrite, is what catches a
    # second query on the same checkpoint; ``streaming.start_gated`` locks the
    # checkpoint for that instead (and earlier: at start, not at the next batch).
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing."
        "FileSystemBasedCheckpointFileManager"
    ),
    "spark.ui.retainedJobs": "100",
    "spark.ui.retainedStages": "100",
    "spark.ui.retainedTasks": "10000",
    "spark.sql.ui.retainedExecutions": "50",
    "spark.sql.streaming.ui.retainedProgressUpdates": "100",
    "spark.sql.streaming.ui.retainedQueries": "20",
}

# Thread pools of the libraries our Spark tasks run (polars in gold, Arrow's CPU pool
# in every Parquet read and write, the codec's decode threads in silver), sized in the
# Python workers' environment to the cores a task owns (``spark.task.cpus``). Sized to
# the machine instead, two tasks on two cores ran four busy threads each way: gold's
# tasks on local[2] ran 35% slower than with one thread each (docs/performance.md).
TASK_THREAD_ENV = ("POLARS_MAX_THREADS", "OMP_NUM_THREADS", "QMF_DECODE_THREADS")

# Small and quiet for the test suite: 2 cores shared by several processes.
TEST_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "1g",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.adaptive.enabled": "false",
    "spark.rdd.compress": "false",
    "spark.shuffle.compress": "false",
    "spark.python.worker.reuse": "true",
    "spark.sql.streaming.stopGracefullyOnShutdown": "true",
}


def _under_spark_submit() -> bool:
    """True when a JVM was started for us (spark-submit or the pyspark shell)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _master_configured(existing: Mapping[str, str]) -> bool:
    """Whether someone else already chose a master (spark-submit, env, defaults)."""
    if "spark.master" in existing or os.environ.get("MASTER"):
        return True
    return "--master" in os.environ.get("PYSPARK_SUBMIT_ARGS", "")


def _existing_conf() -> dict[str, str]:
    """The configuration already in force: the launching JVM's, if any.

    Outside spark-submit no JVM exists yet and starting one here would fix the
    driver memory before our settings apply, so only an already running JVM
    is asked.
    """
    active = SparkContext._active_spark_context
    if active is not None:
        return dict(active.getConf().getAll())
    if _under_spark_submit():
        SparkContext._ensure_initialized()
        return dict(SparkConf(loadDefaults=True).getAll())
    return {}


def _log4j_config(level: str) -> str:
    """A log4j2 file at the given root level (written once per level and user)."""
    from pipeline.runtime import sparklog

    return _write_config(f"qmf-log4j2-{level}", sparklog.log4j2_config(level))


def _write_config(stem: str, text: str) -> str:
    """``text`` in ``<tmp>/<stem>-<uid>.properties``, rewritten only when it differs."""
    path = os.path.join(tempfile.gettempdir(), f"{stem}-{os.getuid()}.properties")
    try:
        with open(path, encoding="utf-8") as fh:
            if fh.read() == text:
                return path
    except OSError:
        pass
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)
    return path


def java_problem(env: Mapping[str, str] | None = None) -> str | None:
    """Why spark-class would find no Java (it runs ``$JAVA_HOME/bin/java``, else
    ``java`` on the PATH), or None. Checked before a JVM is launched: pyspark
    only says "Java gateway process exited before sending its port number"."""
    import shutil

    env = os.environ if env is None else env
    home = env.get("JAVA_HOME")
    if home:
        java = os.path.join(home, "bin", "java")
        if not os.access(java, os.X_OK):
            return (
                f"Java not found: JAVA_HOME={home} has no bin/java; point JAVA_HOME at a "
                "Java 17+ installation or unset it (tools/setup.sh installs openjdk-17-jre-headless)"
            )
        return None
    if shutil.which("java", path=env.get("PATH", "")) is None:
        return (
            "Java not found: no java on the PATH and JAVA_HOME is not set; Spark needs "
            "Java 17+ (tools/setup.sh installs openjdk-17-jre-headless)"
        )
    return None


def spark_log() -> Path | None:
    """The file this process's JVM writes its output to (None: the console's)."""
    return _log_file


def _file_log4j_config(log_file: Path) -> str:
    """The log4j2 configuration file that writes to ``log_file`` (one per log file)."""
    from pipeline.runtime import sparklog

    digest = hashlib.sha1(str(log_file).encode()).hexdigest()[:12]
    return _write_config(f"qmf-log4j2-file-{digest}", sparklog.log4j2_config("warn", log_file))


def _launch_logged(options: Mapping[str, str], log_file: Path, app_name: str) -> None:
    """Launch the JVM with ``options``, its stdout and stderr in ``log_file`` (its
    Python children's too: they inherit them), and make it the process's gateway
    (``getOrCreate`` then uses it as if it had launched it)."""
    from pyspark.java_gateway import launch_gateway

    from pipeline.runtime import sparklog

    global _log_file
    out = sparklog.open_log(log_file, app_name)
    launch_conf = SparkConf(loadDefaults=False)
    for key, value in options.items():
        launch_conf.set(key, value)
    # The JVM's Python children mark our records (launch_gateway copies the environment
    # when it starts the JVM); our own other children (qmf run's simulator) do not.
    previous = os.environ.get(sparklog.CHILD_ENV)
    os.environ[sparklog.CHILD_ENV] = "1"
    try:
        gateway = launch_gateway(  # type: ignore[no-untyped-call]
            launch_conf, popen_kwargs={"stdout": out, "stderr": out}
        )
    finally:
        out.close()  # the JVM holds its own descriptor
        if previous is None:
            del os.environ[sparklog.CHILD_ENV]
        else:
            os.environ[sparklog.CHILD_ENV] = previous
    SparkContext._ensure_initialized(gateway=gateway)
    _log_file = log_file
    sparklog.follow(log_file)


# The driver JVM's thread stacks. A query stopped during a Python foreachBatch makes
# Spark's stream thread match a regex over the long py4j traceback, which overflows
# the default 1 MB stack (StackOverflowError; reproduced 2026-11-28; 16 MB passed
# every try). Stacks are reserved, not committed: the cost is address space.
# ``streaming.stop_query`` avoids such stops; this covers the ones it cannot.
DRIVER_STACK = "-Xss16m"

# The JIT of a job's driver JVM: C1 only. On the task paths no row passes through the
# JVM, yet its C2 compiler kept compiling through the first minutes of a stream: 0.4-0.5
# CPU-s per 3.5 s micro-batch of silver on one core (docs/performance-log.md, "the
# JVM's JIT"), taken from the tasks' Python workers, and a slower start. C1 alone compiles
# that code at a fraction of the cost; what runs slower is JVM-side row work (Spark's
# own Parquet scan), which notebooks do, so they keep the full JIT (``quick_jit``).
QUICK_JIT = "-XX:TieredStopAtLevel=1"


def _master_cores(master: str) -> int | None:
    """The cores of a local master: ``local[N]`` (``local``: 1; ``local[*]``: the
    machine's), ``local-cluster[workers, cores, memory]``; None for a cluster's."""
    if not master.startswith("local"):
        return None
    inside = master[master.find("[") + 1 : master.find("]")] if "[" in master else "1"
    parts = [p.strip() for p in inside.split(",")]
    if master.startswith("local-cluster"):
        return max(1, int(parts[0]) * int(parts[1]))
    if parts[0] == "*":
        return os.cpu_count() or 1
    return max(1, int(parts[0]))


def driver_java_options(log4j_config: str, quick_jit: bool) -> str:
    """The options of a driver JVM that ``get_spark`` launches."""
    jit = f" {QUICK_JIT}" if quick_jit else ""
    return f"{DRIVER_STACK}{jit} -Dlog4j2.configurationFile=file:{log4j_config}"


def get_spark(
    app_name: str,
    *,
    master: str | None = None,
    conf: Mapping[str, Any] | None = None,
    test: bool = False,
    log_file: str | os.PathLike[str] | None = None,
    quick_jit: bool = True,
) -> SparkSession:
    """Return the process's SparkSession, creating it with the project's settings.

    ``master`` and ``conf`` given here override everything; the project's
    defaults never override what spark-submit (or an existing session) set.
    ``log_file`` (else ``$QMF_SPARK_LOG``): when this call launches the JVM, Spark's
    log and the JVM's stdout and stderr go to that file instead of the terminal
    (``spark_log()`` says whether they did; see ``pipeline.runtime.sparklog``). Under
    spark-submit the JVM is spark-submit's and keeps its console.
    ``quick_jit``: a JVM launched here compiles with C1 only (``QUICK_JIT``); notebooks,
    whose queries do their row work in the JVM, pass False.
    """
    # Workers must run this very interpreter (the venv with pyarrow etc.);
    # this has to be in the environment before the JVM starts. Under
    # spark-submit an interpreter chosen there is kept.
    for var in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        if _under_spark_submit():
            os.environ.setdefault(var, sys.executable)
        else:
            os.environ[var] = sys.executable

    if SparkContext._active_spark_context is None and not _under_spark_submit():
        problem = java_problem()
        if problem is not None:
            from pipeline import SetupError

            raise SetupError(problem)

    if log_file is None and not test:
        log_file = os.environ.get(LOG_ENV) or None
    logged = None
    if log_file is not None and SparkContext._gateway is None and not _under_spark_submit():
        logged = Path(log_file).resolve()

    existing = _existing_conf()
    defaults = dict(BASE_CONF)
    if test:
        defaults.update(TEST_CONF)
    if not existing and SparkContext._active_spark_context is None:
        # A JVM is about to start: quiet from its first line, not only after
        # setLogLevel (and no "hostname resolves to a loopback address" warning
        # on the terminal), or everything in the log file.
        level = "error" if test else "warn"
        config = _log4j_config(level) if logged is None else _file_log4j_config(logged)
        defaults["spark.driver.extraJavaOptions"] = driver_java_options(config, quick_jit)
        if test:
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    options = {"spark.app.name": app_name}
    if master is not None:
        options["spark.master"] = master
    elif not _master_configured(existing):
        options["spark.master"] = DEFAULT_MASTER
    options.update({k: v for k, v in defaults.items() if k not in existing})
    options.update({k: str(v) for k, v in (conf or {}).items()})
    cpus = options.get("spark.task.cpus") or existing.get("spark.task.cpus") or "1"
    for var in TASK_THREAD_ENV:
        key = f"spark.executorEnv.{var}"
        if key not in options and key not in existing:
            options[key] = cpus
    for var, value in ALLOCATOR_ENV.items():  # the driver's environment is not theirs
        key = f"spark.executorEnv.{var}"
        if key not in options and key not in existing:
            options[key] = value
    # Object storage (s3a://): the store's endpoint, region and addressing from the
    # standard variables (pipeline.lake.storage); credentials stay with S3A's own chain.
    from pipeline.lake.storage import LOCATION_ENV, S3Settings

    for key, value in S3Settings.from_env().spark_conf().items():
        if key not in options and key not in existing:
            options[key] = value
    # ... and for the tasks that write a table's data files with pyarrow (a cluster's
    # executors do not inherit this environment); credentials: each worker's own chain.
    for var in LOCATION_ENV:
        key = f"spark.executorEnv.{var}"
        if os.environ.get(var) and key not in options and key not in existing:
            options[key] = os.environ[var]
    # delta-spark: its JARs (checked against jars.lock), SQL extension and catalog.
    options.update(delta_conf({**existing, **options}))
    if logged is not None:
        _launch_logged(options, logged, app_name)

    builder = SparkSession.builder
    for key, value in options.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR" if test else "WARN")
    size_delta_state(session)
    return session


DELTA_STATE_PARTITIONS = "spark.databricks.delta.snapshotPartitions"


def size_delta_state(session: SparkSession) -> None:
    """Delta's table state in one partition on a local master, unless set.

    Delta's default, 50, is sized for clusters. On ``local[2]`` every first read of a
    table version paid 50 tasks (the silver paths' tests: 80 s -> 5-10 min), and the
    initial snapshot of Delta's streaming source (a new checkpoint's stream over an
    existing table) is read back with one Spark job per partition on every
    ``latestOffset`` and ``getBatch``: 0.7-2.0 s more per micro-batch, growing, over a
    36-file bronze with 50 (2026-12-05, ``bench_scale``). One partition per core cut
    that to 0.6 s of gold's batch over two silver tables; one partition in all to 0.375 s,
    with commits no slower (2026-12-07, docs/performance.md). A local lake's state (its
    files' log entries) is small enough for one task; a cluster keeps Delta's default.
    Set on the session once it runs, so a master given to spark-submit or in
    ``PYSPARK_SUBMIT_ARGS`` counts as one given here.
    """
    if session.conf.get(DELTA_STATE_PARTITIONS, None) is not None:
        return
    if _master_cores(session.sparkContext.master or "") is not None:
        session.conf.set(DELTA_STATE_PARTITIONS, "1")
