"""Tables on a real S3 server (versitygw on loopback, ``tests/s3server.py``).

* the settings every engine takes from the standard variables (``pipeline.lake.storage``);
* a session made by ``get_spark`` in a process whose environment names the store writes,
  appends to and reads back a Delta table on ``s3a://`` through delta-spark (Delta's
  history, time travel), and delta-rs and polars read the same rows with the settings'
  storage options; wrong credentials are refused with S3's own reason;
* a store that went down and came back holds the table as it was.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pipeline.lake.storage import S3Settings, is_object_store, join
from tests.s3server import S3Server

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tests.lake import Lake

pytestmark = pytest.mark.spark
REPO = Path(__file__).resolve().parents[2]




def test_settings_from_the_standard_variables() -> None:
    s = S3Settings.from_env({"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_REGION": "eu-west-1",
                             "AWS_SECRET_ACCESS_KEY": "never-copied"})  # fmt: skip
    assert s.spark_conf() == {
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.attempts.maximum": "3",
        "spark.hadoop.fs.s3a.retry.limit": "3",
        "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
        "spark.hadoop.fs.s3a.endpoint.region": "eu-west-1",
    }
    assert s.storage_options() == {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "eu-west-1", "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
    }  # fmt: skip
    # AWS itself: TLS, virtual-hosted requests, no endpoint; an S3-only endpoint wins
    aws = S3Settings.from_env({"AWS_DEFAULT_REGION": "us-east-2"})
    assert (aws.endpoint, aws.region, aws.path_style, aws.tls) == (None, "us-east-2", False, True)
    only = S3Settings.from_env({"AWS_ENDPOINT_URL": "https://a:1", "AWS_ENDPOINT_URL_S3": "https://b:2",
                                "QMF_S3_PATH_STYLE": "0"})  # fmt: skip
    assert (only.endpoint, only.path_style, only.tls) == ("https://b:2", False, True)
    with pytest.raises(ValueError, match="QMF_S3_PATH_STYLE='maybe'"):
        S3Settings.from_env({"QMF_S3_PATH_STYLE": "maybe"})
    with pytest.raises(ValueError, match="expected http://host:port"):
        S3Settings(endpoint="127.0.0.1:9000")
    assert is_object_store("s3a://lake/bronze") and is_object_store("S3://lake/x")
    assert not is_object_store("/data/bronze") and not is_object_store("file:///data/bronze")
    assert join("s3a://lake/", "silver", "/events") == "s3a://lake/silver/events"
    assert join("/data", "silver") == "/data/silver"


SCRIPT = r"""
import json, sys
from pipeline.spark import get_spark
spark = get_spark("qmf-s3-test", master="local[2]")
path = sys.argv[1]
spark.range(0, 100).selectExpr("id", "id * 2 AS twice").write.format("delta").save(path)
spark.range(100, 150).selectExpr("id", "id * 2 AS twice").write.format("delta").mode("append").save(path)
rows = spark.read.format("delta").load(path).orderBy("id").collect()
v0 = spark.read.format("delta").option("versionAsOf", 0).load(path).count()
ops = [r[0] for r in spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").select("operation").collect()]
print("RESULT " + json.dumps({"rows": [[r.id, r.twice] for r in rows], "v0": v0, "ops": ops}))
"""


def _run(script: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-c", script, *args], env=full, cwd=REPO, capture_output=True,
        text=True, timeout=300, check=False,
    )  # fmt: skip


def test_delta_spark_writes_a_table_that_delta_rs_and_polars_read(s3: S3Server) -> None:
    import deltalake
    import polars as pl

    bucket = s3.make_bucket("lake")
    path = f"s3a://{bucket}/tables/t1"
    proc = _run(SCRIPT, s3.env(), path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    got = json.loads(line[len("RESULT "):])
    assert got["rows"] == [[i, 2 * i] for i in range(150)]
    assert got["v0"] == 100
    assert got["ops"] == ["WRITE", "WRITE"]
    # The objects are in the store's folder: the log and the data files of two commits.
    log = sorted(p.name for p in (s3.folder / "lake" / "tables" / "t1" / "_delta_log").glob("*.json"))
    assert log == ["00000000000000000000.json", "00000000000000000001.json"]

    # delta-rs and polars, with the same settings' options and the same variables'
    # credentials (read by them, never passed here).
    options = S3Settings.from_env(s3.env()).storage_options()
    env = s3.env()
    creds = {"AWS_ACCESS_KEY_ID": env["AWS_ACCESS_KEY_ID"], "AWS_SECRET_ACCESS_KEY": env["AWS_SECRET_ACCESS_KEY"]}
    saved = {k: os.environ.get(k) for k in creds}
    os.environ.update(creds)
    try:
        uri = path.replace("s3a://", "s3://")
        dt = deltalake.DeltaTable(uri, storage_options=options)
        assert dt.version() == 1
        files = dt.file_uris()
        assert files and all(f.startswith(f"{uri}/") for f in files)
        frame = pl.read_delta(uri, storage_options=options).sort("id")
        assert frame.rows() == [(i, 2 * i) for i in range(150)]
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_wrong_credentials_are_refused_with_the_stores_reason(
    spark: SparkSession, s3: S3Server
) -> None:
    s3.make_bucket("refused")
    s3.configure(spark, "refused", "not-the-secret")
    with pytest.raises(Exception) as caught:
        spark.range(3).write.format("delta").save("s3a://refused/t")
    text = str(caught.value)
    # S3A names the request and S3's own refusal; the secret appears nowhere.
    assert "403" in text and "SignatureDoesNotMatch" in text, text[-3000:]
    assert "not-the-secret" not in text
    assert not any((s3.folder / "refused").iterdir())


def test_a_store_that_comes_back_holds_the_table(spark: SparkSession, s3: S3Server) -> None:
    s3.make_bucket("restart")
    s3.configure(spark, "restart")
    path = "s3a://restart/t"
    spark.range(150).write.format("delta").save(path)
    s3.stop()
    t0 = time.monotonic()
    with pytest.raises(Exception) as caught:
        spark.read.format("delta").load(path).count()
    down_s = time.monotonic() - t0
    assert "Connection refused" in str(caught.value) or "Unable to execute HTTP request" in str(
        caught.value
    ), str(caught.value)[-3000:]
    s3.start()
    assert spark.read.format("delta").load(path).count() == 150
    assert down_s < 60, f"a store that is down took {down_s:.0f} s to say so"


def test_the_jobs_refuse_a_bucket_where_they_cannot_yet_use_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the jobs' own layer does not reach object storage yet, each job's settings
    and `qmf run` refuse an s3a:// location at once (not a local folder named `s3a:`);
    bronze's, silver's and gold's tables and checkpoints may be on a store (the kill
    tests), gold's and the backfill's scratch folders not; the backfill and `qmf
    maintain` say what to do instead."""
    from datetime import UTC, datetime

    from pipeline.backfill import BackfillSettings
    from pipeline.bronze import BronzeSettings
    from pipeline.cli import main as qmf
    from pipeline.gold import GoldSettings
    from pipeline.silver import SilverSettings

    why = "must be a local or NFS path for now; object storage"
    BronzeSettings(landing=str(tmp_path), table="s3a://lake/bronze", checkpoint=str(tmp_path))
    with pytest.raises(ValueError, match=f"^landing 's3a://lake/landing': {why}"):
        BronzeSettings(landing="s3a://lake/landing", table="s3a://lake/bronze", checkpoint=str(tmp_path))
    BronzeSettings(landing=str(tmp_path), table=str(tmp_path), checkpoint="s3a://lake/ck")
    SilverSettings(bronze="s3a://lake/bronze", root="s3a://lake/silver", checkpoint="s3a://lake/ck")
    GoldSettings(silver="s3a://lake/silver", root="s3://lake/gold", scratch=str(tmp_path))
    needs = "^root 's3://lake/gold' is on an object store: gold's tasks need a scratch folder"
    with pytest.raises(ValueError, match=needs):
        GoldSettings(silver=str(tmp_path), root="s3://lake/gold")
    with pytest.raises(ValueError, match=f"^scratch 's3a://lake/tmp': {why}"):
        GoldSettings(silver=str(tmp_path), root="s3://lake/gold", scratch="s3a://lake/tmp")
    t0, t1 = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC)
    # the backfill on a bucket: with a scratch folder the executors share, not without
    with pytest.raises(ValueError, match=r"^'s3a://lake/silver' is on an object store: the "
                       r"backfill needs --scratch"):  # fmt: skip
        BackfillSettings(bronze=str(tmp_path), silver="s3a://lake/silver", gold=str(tmp_path),
                         start=t0, end=t1)  # fmt: skip
    BackfillSettings(bronze="s3a://lake/bronze", silver="s3a://lake/silver",
                     gold="s3a://lake/gold", start=t0, end=t1, scratch=str(tmp_path))  # fmt: skip
    with pytest.raises(ValueError, match=f"^scratch 's3a://lake/tmp': {why}"):
        BackfillSettings(bronze="s3a://lake/bronze", silver="s3a://lake/silver",
                         gold="s3a://lake/gold", start=t0, end=t1, scratch="s3a://lake/tmp")  # fmt: skip
    from pipeline.lake.maintain import MaintainSettings, maintain

    # a pass beside the jobs: refused, the jobs' own maintenance named
    with pytest.raises(ValueError, match=r"^table 's3a://lake/silver/x' is on an object store, "
                       r"where no lock .* run the job with --maintain-every"):  # fmt: skip
        maintain([str(tmp_path), "s3a://lake/silver/x"], [], MaintainSettings())
    monkeypatch.chdir(tmp_path)
    assert qmf(["run", "--data", "s3a://lake/data"]) == 2
    assert not any(tmp_path.iterdir())


def test_location_names_a_table_one_way() -> None:
    from pipeline.lake.storage import location

    assert location("s3://lake/a/../b/") == "s3a://lake/b"
    assert location("s3a://lake") == "s3a://lake"
    assert location("S3A://lake/x//y") == "s3a://lake/x/y"
    assert location("rel/t") == os.path.abspath("rel/t")
    with pytest.raises(ValueError, match="needs a bucket"):
        location("s3a:///t")


@pytest.mark.parametrize("where", ["disk", "store"])
def test_a_tables_files_alike_on_disk_and_on_a_store(
    where: str, s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lake's file calls (``pipeline.lake.storage``) behave the same on both."""
    import pyarrow as pa

    from pipeline.lake import storage

    if where == "store":
        for k, v in s3.env().items():
            monkeypatch.setenv(k, v)
        root = f"s3a://{s3.make_bucket('files')}/t"
    else:
        root = str(tmp_path / "t")
        os.makedirs(root)
    assert storage.list_files(root) == []
    assert storage.list_files(storage.join(root, "missing")) == []
    table = pa.table({"x": pa.array(range(1000), pa.int64())})
    for name in ("part-a-1.parquet", "part-a-2.parquet", "part-b-1.parquet"):
        w = storage.parquet_writer(storage.join(root, name), table.schema)
        w.write_table(table)
        w.close()
    got = sorted(storage.list_files(root, "part-a-"))
    assert got == [storage.join(root, "part-a-1.parquet"), storage.join(root, "part-a-2.parquet")]
    pf = storage.parquet_file(got[0])
    assert pf.metadata.num_rows == 1000 and pf.read().equals(table)
    backing = (s3.folder / "files" / "t" if where == "store" else Path(root)) / "part-a-1.parquet"
    assert storage.file_size(got[0]) == backing.stat().st_size > 0
    assert storage.exists(got[0]) and not storage.exists(storage.join(root, "nope"))
    storage.remove_files([*got, storage.join(root, "nope")])  # one already gone: no error
    assert [os.path.basename(p) for p in storage.list_files(root)] == ["part-b-1.parquet"]
    with pytest.raises(FileNotFoundError):
        storage.read_text(storage.join(root, "nope"))


def test_the_readers_without_spark_read_a_lake_on_the_store_as_on_disk(
    sim_lake: Any, spark: SparkSession, s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``qmf top``, ``qmf serve-metrics``' exposition and the run summary over the lake
    copied to the store show exactly what they show over it on disk (delta-rs and
    pyarrow with the store's settings from the standard variables; the summary reads
    table versions through this process's Spark session, as it would without one
    through delta-rs); the notebooks' polars reader reads the same rows."""
    from pyarrow import fs as pafs

    from pipeline.commands.metrics import MetricsState
    from pipeline.views.progress import summary
    from tests.test_live import top_json

    bucket = s3.make_bucket("readers")
    for layer in ("bronze", "silver", "gold"):
        pafs.copy_files(str(sim_lake.root / layer), f"{bucket}/qmf/{layer}",
                        destination_filesystem=s3.filesystem())  # fmt: skip
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    s3.configure(spark, bucket)
    lake = f"s3a://{bucket}/qmf"
    on_disk, on_store = top_json(sim_lake.root, "--limit", "100"), top_json(lake, "--limit", "100")
    assert on_disk["queues"] and on_store == on_disk
    assert MetricsState(lake).scrape()[0] == MetricsState(sim_lake.root).scrape()[0]
    want = summary(sim_lake.root)
    assert want["silver_object_samples"] > 0 and summary(lake) == want
    # The polars notebooks' reader (QMF_DATA names the lake).
    from pipeline.views.notebook import DATA_ENV, read_polars

    frames = {}
    for data in (str(sim_lake.root), lake):
        monkeypatch.setenv(DATA_ENV, data)
        frames[data] = read_polars("gold", "statistic_rates").sort(["agent", "object_id", "statistic", "end_ns"])
    assert frames[lake].height > 0 and frames[lake].equals(frames[str(sim_lake.root)])


def test_a_table_on_the_store_is_retained_compacted_and_vacuumed(
    spark: SparkSession, s3: S3Server, sim_lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a job's ``--maintain-every`` does to each of its tables, on a bucket: the rows
    before the cutoff deleted (exactly those), the files compacted into one, and every
    removed file deleted from the bucket (no stream pins it here)."""
    from datetime import timedelta

    from pyarrow import fs as pafs

    from pipeline.lake import delta, snapshot, storage
    from pipeline.lake.maintain import MaintainSettings, maintain_table
    from pipeline.lake.retention import RetentionPolicy

    bucket = s3.make_bucket("maintained")
    pafs.copy_files(str(sim_lake.bronze), f"{bucket}/bronze", destination_filesystem=s3.filesystem())
    s3.configure(spark, bucket)
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)  # pyarrow's listing of the bucket
    table = f"s3a://{bucket}/bronze"
    rows = delta.read_arrow(str(sim_lake.bronze))
    times = sorted(rows.column("received_at").to_pylist())
    cutoff = times[len(times) // 2]
    kept = sorted(r["offset"] for r in rows.to_pylist() if r["received_at"] >= cutoff)
    assert 0 < len(kept) < rows.num_rows
    policy = RetentionPolicy.of({"bronze": "1d"})
    settings = MaintainSettings(retention_hours=0, min_files=2, retention=policy,
                                now=cutoff + timedelta(days=1))  # fmt: skip

    report = maintain_table(table, settings)

    assert (report.rows_deleted, report.cutoff) == (rows.num_rows - len(kept), cutoff)
    assert sorted(delta.read_arrow(table).column("offset").to_pylist()) == kept
    assert (report.files_before, report.files_after) == (4, 1), report.line()
    live = {urllib.parse.unquote(f.path) for f in snapshot.load(table).files}
    assert storage.data_files(table) == live and len(report.vacuumed) >= 4
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}` LIMIT 2").collect()
    assert [h["operation"] for h in history] == ["OPTIMIZE", "DELETE"], history
