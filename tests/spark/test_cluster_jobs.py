"""The silver and gold jobs on a real Spark standalone cluster (``tests/standalone.py``).

A master and two workers run as processes of their own, started from the installed
Spark's launch class; the decode (``mapInArrow``), the rate scan and the Parquet
writes run in the workers' executor processes, which share nothing with the driver
but the store and the files, as on a real cluster (docs/cluster.md). The jobs are
started as an operator would, with ``spark-submit``, their tables and checkpoints on
the real S3 server. Their tables must equal, row for row, the ``sim_lake``
fixture's silver and gold, which were made in one local process (silver decoded on
the driver), and random v1 method calls in the same bronze pair in executor tasks.

The code runs as a cluster node would have it: the project built as a wheel
and installed into a node environment of its own (``node_env``); the
checkout is on no path of the jobs, so a module or data file the wheel
lacks fails here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
import urllib.parse
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.lake import delta, snapshot, storage
from tests.lake import sorted_rows
from tests.standalone import StandaloneCluster
from tests.submit import EXECUTOR_QUICK_JIT, SPARK_SUBMIT, spark_submit_env

REPO = Path(__file__).resolve().parents[2]
SILVER_TABLES = ("object_samples", "events", "heartbeats")
GOLD_TABLES = ("statistic_rates", "object_lifecycles")

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def node_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A node's Python environment: the project's wheel installed (unpacked) into a
    fresh venv whose dependencies are the test venv's (a ``.pth`` naming its
    site-packages; ``.pth`` files inside that folder, the editable install's among
    them, are not processed, so the checkout stays out of reach)."""
    tmp = tmp_path_factory.mktemp("node")
    src = tmp / "src"
    for name in ("pipeline", "receivers", "schemas", "jobs"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         str(src), "-w", str(tmp / "dist")],
        check=True, cwd=tmp, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = (tmp / "dist").glob("qmf_pipeline-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (packages,) = venv.glob("lib/python*/site-packages")
    with zipfile.ZipFile(wheel) as whl:
        whl.extractall(packages)
    (packages / "qmf-node-deps.pth").write_text(f"{site.getsitepackages()[0]}\n")
    _ship_numba_cache(packages)
    yield venv


def _ship_numba_cache(packages: Path) -> None:
    """Give the node the checkout's compiled numba kernels, as a node image built with
    its kernels compiled ships them: numba loads a cached kernel when its source file's
    size and mtime match, so the wheel's copies get the checkout's mtimes. Without it
    each executor's first decode compiles the kernels (~22 s of each worker's core,
    measured), which is not what this test is about. A kernel the checkout has not
    compiled yet is compiled on the node, as before."""
    for cache in (REPO / "pipeline").rglob("__pycache__"):
        files = [f for f in cache.iterdir() if f.suffix in (".nbi", ".nbc")]
        if not files:
            continue
        target = packages / cache.relative_to(REPO)
        target.mkdir(parents=True, exist_ok=True)
        for f in files:
            shutil.copy2(f, target / f.name)
        for src in cache.parent.glob("*.py"):
            st = src.stat()
            os.utime(packages / src.relative_to(REPO), ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.fixture(scope="module")
def cluster(s3: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """The standalone cluster, its workers given the store's variables (credentials too,
    as a cluster's nodes have their own)."""
    c = StandaloneCluster(tmp_path_factory.mktemp("cluster"), env=s3.env()).start()
    try:
        yield c
    finally:
        c.stop()


def submit_env(node: Path) -> dict[str, str]:
    """``spark_submit_env`` with the node's Python on the driver and the executors and
    no PYTHONPATH (the wheel, not the checkout, must provide the jobs)."""
    env = spark_submit_env()
    env.pop("PYTHONPATH")
    env["PYSPARK_PYTHON"] = str(node / "bin" / "python")
    env["PYSPARK_DRIVER_PYTHON"] = str(node / "bin" / "python")
    return env


def spark_submit(
    cluster: StandaloneCluster, node: Path, events: Path, job: str | Path, *args: str,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """``spark-submit`` of the job file the wheel installed on the node (or a script
    of the test's, a ``Path``) to the cluster, with an event log (which executor ran
    which task) in ``events``."""
    if isinstance(job, Path):
        script = job
    else:
        (script,) = node.glob(f"lib/python*/site-packages/jobs/{job}")
    events.mkdir(exist_ok=True)
    cmd = [
        SPARK_SUBMIT,
        "--master", cluster.url,
        "--conf", "spark.driver.host=127.0.0.1",
        "--conf", "spark.executor.memory=768m",
        *EXECUTOR_QUICK_JIT,
        "--conf", "spark.ui.enabled=false",
        "--conf", "spark.sql.shuffle.partitions=2",
        "--conf", "spark.eventLog.enabled=true",
        "--conf", f"spark.eventLog.dir=file://{events}",
        "--conf", "spark.eventLog.compress=false",
        "--driver-memory", "512m",
        str(script), *args,
    ]  # fmt: skip
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=420, env={**submit_env(node), **(env or {})},
        cwd=events.parent, check=False,
    )  # fmt: skip


def sorted_table(
    path: Path | str, storage_options: dict[str, str] | None = None, drop: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """The table's rows in a total order (``tests.lake.sorted_rows``, ``drop``'s columns
    out); a table on the store read with delta-rs (``storage_options``)."""
    if storage_options is None:
        table = delta.read_arrow(str(path))
    else:
        from deltalake import DeltaTable

        table = DeltaTable(str(path), storage_options=storage_options).to_pyarrow_table()
    return sorted_rows(table, drop)


APP_ID = re.compile(r"app-\d{14}-\d{4}")


def executor_tasks(events: Path, *, ours: bool = False) -> dict[str, dict[str, int]]:
    """Tasks per executor of each application, from its event log: {app id: {executor: n}}.
    (A rolling log is a folder of ``events_<n>_<app>`` files, a plain one a file.)
    ``ours``: only tasks of the jobs the ``foreachBatch`` function starts (their call site
    is py4j's callback server, through which Spark calls it), not those of Delta's own
    jobs (the stream's starting snapshot at ``start``, its state in Delta's operations)."""
    out: dict[str, dict[str, int]] = {}
    for log in sorted(events.rglob("*")):
        app = APP_ID.search(log.name)
        if app is None or not log.is_file() or log.name.startswith((".", "appstatus")):
            continue
        per = out.setdefault(app.group(0), {})
        names: dict[int, str] = {}
        for line in log.read_text().splitlines():
            event = json.loads(line)
            if event.get("Event") == "SparkListenerStageSubmitted":
                info = event["Stage Info"]
                names[int(info["Stage ID"])] = str(info.get("Stage Name", ""))
            if event.get("Event") == "SparkListenerTaskEnd":
                if ours and "py4j/clientserver.py" not in names.get(int(event["Stage ID"]), ""):
                    continue
                executor = event["Task Info"]["Executor ID"]
                per[executor] = per.get(executor, 0) + 1
    return out


def test_silver_and_gold_jobs_on_a_standalone_cluster_and_a_store(
    spark: Any, sim_lake: Any, node_env: Path, cluster: StandaloneCluster, s3: Any,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Silver streams the bronze copy in 4 micro-batches (two bronze commits each: the
    fixture's 4, then 3 of random v1 method calls in a partition of their own, answers
    of the first two's calls in the third), pairing
    the calls in executor tasks too (``--calls-driver-max-rows 0``); gold runs as batch 0
    of app qmf-gold. Bronze, silver, gold and silver's checkpoint on the store, gold's
    scratch a folder both workers share. Silver maintains its tables on the store
    between its batches (``--maintain-every 0``: compaction and vacuum, as a job on a
    bucket keeps its tables). The sim lake's rows equal the fixture's silver
    and gold (made in one local process, silver decoded on the driver); the calls pair
    as pairing every message in arrival order gives, with arguments typed. (One silver
    application for both: each costs its executors' start.)"""
    from pyarrow import fs as pafs

    from pipeline.lake.storage import S3Settings
    from pipeline.silver import bronze_rows, write_bronze
    from tests.spark.test_silver_methods import call_traffic

    bucket = s3.make_bucket("cluster")
    store = s3.filesystem()
    pafs.copy_files(str(sim_lake.bronze), f"{bucket}/bronze", destination_filesystem=store)
    lake = f"s3a://{bucket}"
    s3.configure(spark, bucket)  # this process writes the calls' bronze commits
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)  # pyarrow and delta-rs here
    files, expected = call_traffic(5, 3)
    expected = {k.replace("p0:", "calls:", 1): v for k, v in expected.items()}
    first_batch = 1 + max(delta.read_arrow(str(sim_lake.bronze)).column("batch_id").to_pylist())
    parts, first = [], 0
    for k, fm in enumerate(files):
        parts.append(bronze_rows(fm, partition="calls", first_offset=first, batch_id=first_batch + k))
        first += len(fm)
    write_bronze(f"{lake}/bronze", parts)
    silver, gold, events = f"{lake}/silver", f"{lake}/gold", tmp_path / "events"
    proc = spark_submit(
        cluster, node_env, events, "silver.py", "--bronze", f"{lake}/bronze", "--root", silver,
        "--checkpoint", f"{lake}/ck-silver", "--trigger", "availableNow",
        "--max-files-per-trigger", "2", "--timeout", "300", "--decode-on", "tasks",
        "--calls-driver-max-rows", "0", "--maintain-every", "0", "--retention-hours", "0",
        "--min-files", "4", env=s3.env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    # the two batches of calls paired theirs in tasks
    assert (proc.stdout + proc.stderr).count("paired_on='tasks'") >= 2, proc.stdout[-3000:]
    ours = executor_tasks(events, ours=True)
    proc = spark_submit(
        cluster, node_env, events, "gold.py", "--silver", silver, "--root", gold,
        "--batch-id", "0", "--app-id", "qmf-gold", "--compute-on", "tasks",
        "--scratch", str(tmp_path / "scratch"), env=s3.env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    tasks = executor_tasks(events)
    # Two applications, each ran its tasks on the executors (silver's decode, pairing and
    # Parquet writes, gold's split and per-bucket computation and writes happened outside
    # the driver, which only committed the files), and both executors took work. A
    # small app may leave one executor idle: silver's one-task batches all went to
    # executor 1 in one CI run, so "both" is asserted over the two apps together.
    assert len(tasks) == 2, tasks
    for app, per in tasks.items():
        assert per and set(per) <= {"0", "1"} and min(per.values()) > 0, (app, per)
    assert {e for per in tasks.values() for e in per} == {"0", "1"}, tasks
    (silver_app,) = ours
    assert set(ours[silver_app]) <= {"0", "1"} and sum(ours[silver_app].values()) >= 2 * len(files)

    # The job maintained its tables on the store between its batches: compacted (a
    # compaction commit), and vacuumed: files removed before its last batch are gone
    # from the bucket (those live when it started are kept for a replay of it), and
    # every live file is there.
    samples = f"{silver}/object_samples"
    added, compactions = set(), 0
    for f in storage.list_files(storage.join(samples, "_delta_log"), "0"):
        if f.endswith(".json"):
            text = storage.read_text(f)
            compactions += "qmf.operation=compact" in text
            added |= {a["add"]["path"] for a in map(json.loads, text.splitlines()) if "add" in a}
    live = {urllib.parse.unquote(f.path) for f in snapshot.load(samples).files}
    on_bucket = storage.data_files(samples)
    assert compactions >= 1
    assert live <= on_bucket < {urllib.parse.unquote(p) for p in added}, (live, on_bucket)
    options = S3Settings.from_env(s3.env()).storage_options()
    creds = {k: v for k, v in s3.env().items() if k.startswith("AWS_") and "KEY" in k}
    sim_agents = set(delta.read_arrow(str(sim_lake.silver / "object_samples")).column("agent").to_pylist())
    for name in SILVER_TABLES:
        # but for batch_id: the fixture's silver took one bronze file a batch, this job
        # two (its four files in silver batches 0 and 1)
        want = sorted_table(sim_lake.silver / name, drop=("batch_id",))
        assert want, name
        got = sorted_table(f"{silver}/{name}", options | creds)
        assert {r["batch_id"] for r in got if r["partition"] != "calls"} == {0, 1}, name
        got = sorted_table(f"{silver}/{name}", options | creds, drop=("batch_id",))
        assert [r for r in got if r["partition"] != "calls"] == want, name
    for name in GOLD_TABLES:
        want = sorted_table(sim_lake.gold / name)
        assert want, name
        got = [r for r in sorted_table(f"{gold}/{name}", options | creds) if r["agent"] in sim_agents]
        assert got == want, name
    calls = sorted_table(f"{silver}/method_calls", options | creds)
    assert {r["call_id"]: r["response_offset"] for r in calls} == expected
    typed = {r["class_name"] for r in calls if r["arguments_out"] is not None}
    assert typed == {"broker", "queue"}


def test_the_qmf_source_reads_the_landing_log_in_executor_tasks(
    node_env: Path, cluster: StandaloneCluster, tmp_path: Path
) -> None:
    """The ``qmf`` source (the receiver's landing log) on the same cluster: its batch read
    and its stream (AvailableNow, admission per trigger and partition) run in the
    executors' Python workers, and every landed message comes out once."""
    import textwrap

    import pyarrow.parquet as pq

    from receivers.landing import message_key
    from tests.spark.test_source import CLUSTER_PROBE, land

    root = tmp_path / "landing"
    a = land(root, "a", [200, 200, 100])
    b = land(root, "b", [300])
    probe = tmp_path / "probe.py"
    probe.write_text(textwrap.dedent(CLUSTER_PROBE))
    out, ck, events = tmp_path / "out", tmp_path / "ck", tmp_path / "events"
    proc = spark_submit(cluster, node_env, events, probe, str(root), str(out), str(ck))
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT="))[7:])
    assert result == {
        "master": cluster.url, "executors": 2, "stopped": True,
        "batch_partitions": 8 + 5, "batch_rows": 800, "batches": 3,
    }  # fmt: skip
    (per,) = executor_tasks(events).values()
    assert set(per) == {"0", "1"}, per  # both executors read
    table = pq.read_table(sorted(out.glob("*.parquet")))
    got = sorted(zip(*(table[c].to_pylist() for c in ("partition", "offset", "msg_key", "body")),
                     strict=True))  # fmt: skip
    want = sorted(
        [("a", i, message_key(m), m.body) for i, m in enumerate(a)]
        + [("b", i, message_key(m), m.body) for i, m in enumerate(b)]
    )
    assert got == want
