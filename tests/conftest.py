"""Shared fixtures: one SparkSession per test process, the project-local broker."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared")
_WARM: Any = None


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the numba decode kernels in a background process on a cold cache.

    A fresh clone compiles them (about two minutes, one core) inside whichever test
    decodes first; the suite's first half is mostly single-threaded, so the other
    core compiles them meanwhile and later tests load them from the disk cache
    (``cache=True``; a test that gets there first just compiles its own copy).
    ``tools/test.sh`` starts the same warm-up earlier, beside ruff and mypy.
    """
    import subprocess

    global _WARM
    if os.environ.get("QMF_WARM_PID"):
        return  # tools/test.sh started it before ruff and mypy
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # under pytest-xdist the controlling process starts it, once
    code = (
        "from pipeline.commands.run import warm_decoder; "
        "warm_decoder(('am1', 'am2', 'v2', 'v2-amqp10'))"
    )
    _WARM = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=os.path.join(os.path.dirname(__file__), ".."),
    )


# The longest test files (CI-12's durations, 2026-12-06, and this session's cuts),
# longest first: tools/test.sh's two processes take whole files in this order (with
# xdist's own reordering off), so no long file is met last and run alone at the end
# while the other process idles. The rest keep their order after these.
LONGEST_FIRST = (
    # bronze, receivers and the broker only, no decode kernels: these run while the
    # warm-up tools/test.sh started compiles them
    "tests/integration/test_crash_recovery.py", "tests/test_broker.py",
    "tests/spark/test_cluster_jobs.py", "tests/spark/test_maintain.py",
    "tests/spark/test_backfill.py", "tests/spark/test_silver_paths.py", "tests/test_prometheus.py",
    "tests/spark/test_delta_spark.py", "tests/integration/test_qpidd_amqp10.py",
    "tests/spark/test_bronze_job.py", "tests/spark/test_silver_kill.py",
    "tests/spark/test_gold_kill.py", "tests/test_run_command.py",
    "tests/spark/test_gold_qpidd.py", "tests/integration/test_fleet.py",
    "tests/spark/test_silver_methods.py", "tests/test_gold_tasks.py",
    "tests/spark/test_object_store.py",
    "tests/spark/test_backfill_log.py", "tests/test_live.py",
)  # fmt: skip


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _WARM is not None and _WARM.poll() is None:
        _WARM.terminate()


def _running(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, finished but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.fixture(scope="session")
def compiled_decoder() -> None:
    """Wait (up to 10 minutes) for the numba warm-up ``tools/test.sh`` started.

    With two test processes, a codec test that decodes before the warm-up is
    done compiles the same kernels on the other core (a v2 test took 104 s
    instead of under 10): waiting leaves the core to the warm-up, and the
    test then loads the kernels from the disk cache.
    """
    import time

    pid = os.environ.get("QMF_WARM_PID")
    if not pid:
        return
    deadline = time.monotonic() + 600
    while _running(int(pid)) and time.monotonic() < deadline:
        time.sleep(0.5)


@pytest.fixture(scope="session")
def spark(compiled_decoder: None) -> Iterator[SparkSession]:
    """One local SparkSession per test process (starting one costs 6-9 s; tools/test.sh
    runs two processes). Started once the numba warm-up is done: the session's Python
    workers decode, and each would compile its own copy of the kernels beside it."""
    from pipeline.spark import get_spark

    # The full JIT (C1 then C2), not the jobs' C1 only: this JVM lives for the whole run
    # and does much of its work in the JVM (Delta's log and state, Spark's scans). On CI
    # its two copies used 28 of the 66 CPU-minutes; test_silver_paths' six longest tests
    # took 197.8 s with C1 only and 158.4 s with both, test_backfill's fixture 137.8 s
    # and 114.5 s (2026-12-06, quiet machine).
    session = get_spark(app_name="qmf-tests", test=True, quick_jit=False)
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _commits_use_the_test_session(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that commits to Delta without asking for ``spark`` (a lake built for a
    notebook, the fold) commits through the test session, not one with a job's settings
    that every later ``spark`` fixture of the process would then get. Lazy: no test
    starts Spark unless it commits."""
    from pipeline.lake import transaction

    monkeypatch.setattr(transaction, "new_session", lambda: request.getfixturevalue("spark"))


@pytest.fixture(scope="session")
def broker() -> Any:
    """The project-local RabbitMQ node, started once if it is not running."""
    from pipeline.broker import ensure_broker

    return ensure_broker()


@pytest.fixture(scope="session")
def shared_dir() -> str:
    """The team's shared folder (spec, samples) beside the repo."""
    path = os.path.abspath(os.environ.get("QMF_SHARED_DIR", SHARED))
    if not os.path.isdir(path):
        raise RuntimeError(f"shared folder not found at {path}; set QMF_SHARED_DIR")
    return path


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real S3 server on loopback (versitygw, ``tests/s3server.py``), one per test
    process; each test makes its own bucket."""
    from tests.s3server import S3Server

    server = S3Server(tmp_path_factory.mktemp("s3") / "store").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def isolated_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A throw-away RabbitMQ node (own state dir, free ports) for tests that stop/restart it.

    Yields its BrokerConfig (pass it as ``cfg=`` to pipeline.broker calls; the URL is
    ``local_info(cfg).url``); the shared ``broker`` node is left alone. Stopped at the end.
    """
    from pipeline import broker as qmf_broker

    cfg = qmf_broker.start_isolated(tmp_path_factory.mktemp("qmf-isolated"))
    try:
        yield cfg
    finally:
        qmf_broker.stop_broker(cfg=cfg)


@pytest.fixture(scope="session")
def sim_lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """bronze, silver and gold of a small simulated run (tests/lake.py); read-only.

    Built once per pytest run: under pytest-xdist the first worker that asks builds it
    into the run's shared temporary folder (~45 s of a core, more under load) while
    another that asks meanwhile waits on the lock, then both read it."""
    import fcntl
    import shutil

    from tests.lake import Lake, build_lake

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return build_lake(spark, tmp_path_factory.mktemp("sim-lake"))
    root = tmp_path_factory.getbasetemp().parent / "sim-lake"  # the run's, not a worker's
    with open(f"{root}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / ".built").is_file():
            shutil.rmtree(root, ignore_errors=True)  # a build a failed worker left half-way
            build_lake(spark, root)
            (root / ".built").touch()
    return Lake(root=root, manifest=root / "sim-manifest.jsonl")
