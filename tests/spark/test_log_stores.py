"""Delta commits to one table from several JVMs, through our log stores (``jvm/``, built
by ``tools/setup.sh``), on a real S3 server (versitygw) and in a local folder.

Delta's own S3 log store makes a version file create-if-absent under a lock held in its
JVM only; ours for buckets (``io.qmf.delta.ConditionalPutLogStore``) has the store
refuse a second create with a conditional PUT (``If-None-Match: *``). Ours for local
folders (``io.qmf.delta.LinkingLogStore``) creates a version as a hard link, which the
file system refuses when the name exists (Delta's default there forks processes):

* each store object itself, through py4j: a version written once, refused the second
  time (``FileAlreadyExistsException``) with the first content kept; overwritten on
  purpose; listed in order; refused where it cannot keep its promise;
* delta-spark's appends to one table from two threads of this session and from a
  ``spark-submit`` process at once, on the bucket and in a folder: every row once, the
  versions without a gap, one commit per version file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pipeline.runtime.jars import LOCAL_LOGSTORE_CLASS, LOGSTORE_CLASS
from tests.s3server import S3Server
from tests.submit import SPARK_SUBMIT, spark_submit_env

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

FILE_EXISTS = "java.nio.file.FileAlreadyExistsException"
REFUSED_BY_THE_STORE = "org.apache.hadoop.fs.s3a.RemoteFileChangedException"


def _java_class(error: BaseException) -> str:
    from py4j.protocol import Py4JJavaError

    assert isinstance(error, Py4JJavaError), repr(error)
    return str(error.java_exception.getClass().getName())


class _Store:
    """A log store object driven through py4j: files named by ``path(name)``, written,
    read back and listed as Delta's commit protocol does."""

    def __init__(self, jvm: Any, store: Any, conf: Any, path: Callable[[Any], Any]) -> None:
        self.jvm, self.store, self.conf, self.path = jvm, store, conf, path

    def write(self, name: Any, lines: list[str], overwrite: bool) -> None:
        actions = self.jvm.java.util.ArrayList()
        for line in lines:
            actions.add(line)
        self.store.write(self.path(name), actions.iterator(), overwrite, self.conf)

    def read(self, name: Any) -> list[str]:
        it = self.store.read(self.path(name), self.conf)
        try:
            out = []
            while it.hasNext():
                out.append(str(it.next()))
            return out
        finally:
            it.close()

    def names_from(self, name: Any) -> list[str]:
        """``listFrom``: the folder's file names from ``name`` on, in name order."""
        listed = self.store.listFrom(self.path(name), self.conf)
        names = []
        while listed.hasNext():
            names.append(str(listed.next().getPath().getName()))
        return names


def test_the_log_store_creates_a_version_only_once(
    spark: SparkSession, s3: S3Server, tmp_path: Path
) -> None:
    from py4j.protocol import Py4JJavaError

    bucket = s3.make_bucket("commit-store")
    s3.configure(spark, bucket)
    jvm: Any = spark._jvm
    jsc: Any = spark.sparkContext._jsc
    conf = jsc.hadoopConfiguration()  # with the bucket's settings
    store = jvm.io.qmf.delta.ConditionalPutLogStore(conf)
    log = f"s3a://{bucket}/t/_delta_log"
    assert store.isPartialWriteVisible(jvm.org.apache.hadoop.fs.Path(log), conf) is False

    files = _Store(jvm, store, conf, lambda v: jvm.org.apache.hadoop.fs.Path(f"{log}/{v:020d}.json"))
    write, read = files.write, files.read

    first = ['{"commitInfo":{"writer":"a"}}', '{"add":{"path":"a.parquet"}}']
    write(0, first, False)
    assert read(0) == first
    # One line per action, each ended by a newline, as Delta's own stores write them.
    backing = s3.folder / bucket / "t" / "_delta_log" / f"{0:020d}.json"
    assert backing.read_text() == "".join(f"{line}\n" for line in first)

    # A second create of the same version (another writer's commit) is refused by the
    # store, and the first content stays.
    with pytest.raises(Py4JJavaError) as caught:
        write(0, ['{"commitInfo":{"writer":"b"}}'], False)
    assert _java_class(caught.value) == FILE_EXISTS
    assert str(caught.value.java_exception.getCause().getClass().getName()) == REFUSED_BY_THE_STORE
    assert "412" in str(caught.value.java_exception.getCause().getMessage())
    assert read(0) == first
    # The same bytes again: an earlier attempt of this very write landed (a PUT retried
    # after its answer was lost), which is no conflict.
    write(0, first, False)
    assert read(0) == first

    # Overwritten on purpose (Delta's _last_checkpoint): a plain PUT.
    write(0, ["replaced"], True)
    assert read(0) == ["replaced"]

    # listFrom: the folder's files from the given name on, in name order.
    write(2, ["two"], False)
    write(1, ["one"], False)
    assert files.names_from(1) == [f"{1:020d}.json", f"{2:020d}.json"]

    # A file system that cannot create only-if-absent (the local one) refuses the
    # commit, rather than write it without the condition.
    local = jvm.org.apache.hadoop.fs.Path(f"file://{tmp_path}/_delta_log/{0:020d}.json")
    with pytest.raises(Py4JJavaError) as caught:
        store.write(local, jvm.java.util.ArrayList().iterator(), False, conf)
    assert _java_class(caught.value) == "java.io.IOException"
    assert "cannot create a file only if it is absent" in str(caught.value)
    assert not (tmp_path / "_delta_log" / f"{0:020d}.json").exists()


def test_the_local_log_store_creates_a_version_only_once(spark: SparkSession, tmp_path: Path) -> None:
    from py4j.protocol import Py4JJavaError

    jvm: Any = spark._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    store = jvm.io.qmf.delta.LinkingLogStore(conf)
    folder = tmp_path / "t" / "_delta_log"  # created by the store's first write
    # Its own writes appear whole, but Delta writes checkpoints itself: on a local file
    # system under a temporary name then renamed, as Delta's default store has it.
    assert store.isPartialWriteVisible(jvm.org.apache.hadoop.fs.Path(str(folder)), conf) is True

    files = _Store(jvm, store, conf, lambda name: jvm.org.apache.hadoop.fs.Path(f"file://{folder}/{name}"))
    write, read = files.write, files.read

    v0, v1, v2 = (f"{v:020d}.json" for v in range(3))
    first = ['{"commitInfo":{"writer":"a"}}', '{"add":{"path":"a.parquet"}}']
    write(v0, first, False)
    assert (folder / v0).read_text() == "".join(f"{line}\n" for line in first)
    assert read(v0) == first
    # Another writer's create of the same version is refused; the first content stays,
    # and no temporary file is left beside it.
    with pytest.raises(Py4JJavaError) as caught:
        write(v0, ['{"commitInfo":{"writer":"b"}}'], False)
    assert _java_class(caught.value) == FILE_EXISTS
    assert read(v0) == first
    assert sorted(p.name for p in folder.iterdir()) == [v0]

    # A checksum Hadoop's local file system wrote for an earlier content of a name (the
    # file deleted without it) goes, so Hadoop's reader does not check the new bytes
    # against it; the same for a file Delta overwrites on purpose.
    local = jvm.org.apache.hadoop.fs.FileSystem.getLocal(conf)
    for name in (v1, "_last_checkpoint"):
        out = local.create(files.path(name), True)
        out.write(bytearray(b"an earlier content\n"))
        out.close()
        assert (folder / f".{name}.crc").exists()
    (folder / v1).unlink()
    write(v1, ["one"], False)
    write("_last_checkpoint", ['{"version":10}'], True)
    assert read(v1) == ["one"] and read("_last_checkpoint") == ['{"version":10}']
    assert sorted(p.name for p in folder.iterdir()) == sorted([v0, v1, "_last_checkpoint"])

    # listFrom: the folder's files from the given name on, in name order.
    write(v2, ["two"], False)
    assert files.names_from(v1) == [v1, v2, "_last_checkpoint"]


# A writer in its own JVM: one append a round, when the test says go.
CHILD = r"""
import pathlib, sys, time
from pipeline.spark import get_spark

path, signals, m = sys.argv[1], pathlib.Path(sys.argv[2]), int(sys.argv[3])

def wait_for(name):
    while not (signals / name).exists():
        time.sleep(0.01)

spark = get_spark("qmf-s3-commit-writer", test=True)
wait_for("created")
jvm = spark._jvm
log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
store = log.store().getDelegate(log.logPath()).logStoreImpl()
print("STORE", store.getClass().getName(), flush=True)
(signals / "ready").touch()
for i in range(m):
    wait_for(f"go-{i}")
    (spark.range(0, 3, 1, 1).selectExpr("'child' AS writer", f"{i} AS batch", "id AS n")
     .write.format("delta").mode("append").option("userMetadata", f"child-{i}").save(path))
    (signals / f"done-{i}").touch()
print("DONE", flush=True)
"""


@pytest.mark.parametrize("where", ["bucket", "folder"])
def test_appends_from_two_jvms_and_two_threads_all_land_once(
    spark: SparkSession, tmp_path: Path, request: pytest.FixtureRequest, where: str
) -> None:
    """Three writers of one table: two threads of this session and a spark-submit
    process, in rounds that start together (each writer one append a round), so each
    round's writers all read the same version and race to create the next."""
    m = 4
    s3: S3Server | None = request.getfixturevalue("s3") if where == "bucket" else None
    if s3 is not None:
        bucket = s3.make_bucket("commit-race")
        table, store_class = f"s3a://{bucket}/t", LOGSTORE_CLASS
        folder = s3.folder / bucket / "t" / "_delta_log"
    else:
        table, store_class = str(tmp_path / "t"), LOCAL_LOGSTORE_CLASS
        folder = tmp_path / "t" / "_delta_log"
    signals = tmp_path / "signals"
    signals.mkdir()
    script = tmp_path / "writer.py"
    script.write_text(CHILD)
    log = tmp_path / "writer.log"
    errors: list[BaseException] = []

    def wait_for(name: str) -> None:
        deadline = time.monotonic() + 120
        while not (signals / name).exists():
            assert child.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"the writer process: no {name}"
            time.sleep(0.01)

    def append(name: str, i: int) -> None:
        try:
            (spark.range(0, 3, 1, 1).selectExpr(f"'{name}' AS writer", f"{i} AS batch", "id AS n")
             .write.format("delta").mode("append").option("userMetadata", f"{name}-{i}")
             .save(table))  # fmt: skip
        except BaseException as e:  # failed below
            errors.append(e)

    with log.open("w") as err:  # its JVM starts while this session creates the table
        child = subprocess.Popen(
            [SPARK_SUBMIT, "--master", "local[1]", "--driver-memory", "512m",
             "--conf", "spark.ui.enabled=false", str(script), table, str(signals), str(m)],
            env={**spark_submit_env(), **(s3.env() if s3 else {})}, stdout=subprocess.PIPE,
            stderr=err, text=True,
            start_new_session=True,
        )  # fmt: skip
    try:
        if s3 is not None:
            s3.configure(spark, bucket)
        jvm: Any = spark._jvm
        scheme = "s3a" if s3 else "file"
        assert spark.sparkContext.getConf().get(f"spark.delta.logStore.{scheme}.impl") == store_class
        empty = spark.range(0).selectExpr("'init' AS writer", "0 AS batch", "id AS n")
        empty.write.format("delta").save(table)
        (signals / "created").touch()
        # Delta's store for the table (DeltaLog caches one per scheme) is ours.
        delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, table)
        used = delta_log.store().getDelegate(delta_log.logPath()).logStoreImpl()
        assert used.getClass().getName() == store_class

        wait_for("ready")
        for i in range(m):
            threads = [threading.Thread(target=append, args=(n, i)) for n in ("a", "b")]
            (signals / f"go-{i}").touch()
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
                assert not t.is_alive(), "a writer thread did not finish"
            wait_for(f"done-{i}")
        out = child.communicate(timeout=120)[0]
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(30)
    assert not errors, errors
    assert child.returncode == 0, log.read_text()[-3000:]
    assert f"STORE {store_class}" in out.splitlines() and "DONE" in out.splitlines()

    # Every row once.
    rows = [(r.writer, r.batch, r.n) for r in spark.read.format("delta").load(table).collect()]
    want = [(w, i, n) for w in ("a", "b", "child") for i in range(m) for n in range(3)]
    assert len(rows) == len(want) and sorted(rows) == sorted(want)

    # The versions 0..3m without a gap, one commit (one commitInfo) in each, each append
    # its own commit.
    versions = sorted(int(p.stem) for p in folder.glob("*.json"))
    assert not list(folder.glob(".*.tmp"))  # the local store's temporary files are gone
    assert versions == list(range(3 * m + 1))
    # Delta's checkpoint at version 10 and its _last_checkpoint, which Delta overwrites on
    # purpose, went through the store too.
    checkpoints = [p.name for p in folder.glob("*.checkpoint*.parquet")]
    assert checkpoints == [f"{10:020d}.checkpoint.parquet"]
    assert json.loads((folder / "_last_checkpoint").read_text())["version"] == 10
    infos = []
    for v in versions:
        text = (folder / f"{v:020d}.json").read_text()
        actions = [json.loads(line) for line in text.splitlines()]
        mine = [a["commitInfo"] for a in actions if "commitInfo" in a]
        assert len(mine) == 1, (v, mine)
        infos.append(mine[0])
    marks = [info.get("userMetadata") for info in infos]
    assert marks[0] is None  # the table's creation
    assert sorted(marks[1:]) == sorted(f"{w}-{i}" for w in ("a", "b", "child") for i in range(m))

    # The JVMs raced: a commit that read version r and landed later than r + 1 had its
    # create of r + 1 refused (Delta tries r + 1 first); some of those r + 1 were the
    # other JVM's.
    def jvm_of(v: int) -> str:
        return "child" if str(marks[v]).startswith("child-") else "session"

    lost = [(v, int(infos[v]["readVersion"])) for v in versions[1:]]
    lost = [(v, r) for v, r in lost if r + 1 < v]
    assert any(jvm_of(r + 1) != jvm_of(v) for v, r in lost), (marks, lost)
